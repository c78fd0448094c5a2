/* model — the Llama-family network as the forward pass sees it: hyperparameters and per-layer weight views.
 *
 * Built from a model_file (borrowed: the file must outlive the model). Matrices stay in their stored type
 * and memory (mmap); only the small 1-D tensors (norm weights, biases) are converted to f32 copies that the
 * model owns. Rotary inverse frequencies (with llama3/linear scaling and GGUF rope_freqs factors) are
 * precomputed here. Usage: model_init → forward passes → model_free.
 */
#ifndef FERRY_MODEL_H
#define FERRY_MODEL_H

#include <stdint.h>

#include "quant/dtype.h"
#include "weights/model_file.h"

/* A row-major matrix (rows, cols) in its stored type: a linear layer is (n_out, n_in). */
struct wview {
    const void *data;
    enum dtype type;
    int64_t rows;
    int64_t cols;
};

struct model_layer {
    float *attn_norm;            /* (dim) f32 */
    struct wview wq, wk, wv, wo; /* (n_heads*hd, dim), (n_kv*hd, dim), (n_kv*hd, dim), (dim, n_heads*hd) */
    float *bq, *bk, *bv;         /* (n_heads*hd), (n_kv*hd), (n_kv*hd) f32 or NULL */
    float *ffn_norm;             /* (dim) f32 */
    struct wview w_gate, w_up;   /* (ffn, dim) */
    struct wview w_down;         /* (dim, ffn) */
};

struct model {
    struct llm_hparams hp;
    struct wview tok_embd;       /* (n_vocab, dim) */
    struct wview output;         /* (n_vocab, dim); token_embd when tied */
    float *output_norm;          /* (dim) f32 */
    struct model_layer *layers;  /* (n_layers) */
    float *inv_freq;             /* (rope_dim/2) f32 */
    uint64_t weight_bytes;       /* bytes of all matrices read per forward pass */
    void *owned;                 /* synthetic models: the one allocation holding every matrix */
    void *quant_owned;           /* matrices quantized at load, or NULL */
};

int model_init(struct model *m, const struct model_file *mf, char err[256]);
/* `--quant int8`: converts every F32/F16/BF16 matrix (rows a multiple of 32) to Q8_0 — groups of 32 along a
 * row, symmetric absmax, one f16 scale per group (ggml's reference quantizer) — in memory the model owns.
 * Matrices already quantized in the file, and the token embedding (gathered, not multiplied), are kept. */
int model_quantize_int8(struct model *m, char err[256]);
/* A model of the shape hp (arch, dims, rope fields) whose matrices are random, non-zero values of type wt
 * (F32, F16 or BF16) drawn from a seeded generator, with unit-scale norms: for benchmarks at real shapes
 * without a file. Filling many GB uses `n_threads` threads (0 = all cores). */
int model_init_synthetic(struct model *m, const struct llm_hparams *hp, enum dtype wt, uint64_t seed, int n_threads,
                         char err[256]);
void model_free(struct model *m);

#endif
