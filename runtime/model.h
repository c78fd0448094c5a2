/* model — the network as the forward pass sees it: hyperparameters and per-layer weight views, placed by
 * the roles of its family's tensor list (weights/arch/arch.h).
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

/* Extension point for formats whose scales and zero points live in tensors of their own (AWQ, GPTQ: per-group
 * f16 scales (rows, cols / group) and packed integer zero points beside packed 4-bit codes). Nothing fills it
 * yet: every type in quant/dtype.h keeps its scales inside its blocks, so n_aux is 0 everywhere. A format
 * that uses it adds its code type to quant/dtype.h (codes only, is_quantized), fills aux[] at load, and each
 * backend adds a kernel for it beside its others; a backend must refuse (FERRY_ERR_UNSUPPORTED) a view whose
 * n_aux it does not understand rather than ignore the side tensors. */
enum wview_aux_role { WVIEW_AUX_SCALES = 0, WVIEW_AUX_ZEROS = 1 };
#define WVIEW_MAX_AUX 2
struct wview_aux {
    enum wview_aux_role role;
    const void *data; /* (rows, cols) in type */
    enum dtype type;
    int64_t rows, cols;
};

/* A row-major matrix (rows, cols) in its stored type: a linear layer is (n_out, n_in). */
struct wview {
    const void *data; /* (rows, cols) in type */
    enum dtype type;
    int64_t rows;
    int64_t cols;
    int group_size; /* columns per scale group of the aux tensors; 0 without them */
    int n_aux;      /* 0 for every type ferry reads today (see struct wview_aux) */
    struct wview_aux aux[WVIEW_MAX_AUX];
};

struct model_layer {
    float *attn_norm;            /* (dim) f32 */
    struct wview wq, wk, wv, wo; /* (n_heads*hd, dim), (n_kv*hd, dim), (n_kv*hd, dim), (dim, n_heads*hd) */
    float *bq, *bk, *bv;         /* (n_heads*hd), (n_kv*hd), (n_kv*hd) f32 or NULL */
    float *q_norm, *k_norm;      /* (hd) f32 per-head norms, or NULL (families without QK-norm) */
    float *post_attn_norm;       /* (dim) f32 sandwich norms of the block outputs, or NULL */
    float *post_ffn_norm;        /* (dim) f32 or NULL */
    float *ffn_norm;             /* (dim) f32 */
    struct wview w_gate, w_up;   /* (ffn, dim) */
    struct wview w_down;         /* (dim, ffn) */
    /* Mixture-of-experts layers (hp.n_expert > 0; then w_gate/w_up/w_down are empty): the router and the
     * experts stacked by rows, expert e's gate/up rows [e*ffn, (e+1)*ffn) and down rows [e*dim, (e+1)*dim),
     * ffn = hp.expert_ffn_dim. */
    struct wview router;           /* (n_expert, dim) */
    struct wview exp_gate, exp_up; /* (n_expert*ffn, dim) */
    struct wview exp_down;         /* (n_expert*dim, ffn) */
    /* gpt-oss's extras, NULL elsewhere: the o bias, the attention sinks, the router's bias and the experts'.
     */
    float *bo;                    /* (dim) f32 */
    float *attn_sinks;            /* (n_heads) f32 */
    float *router_b;              /* (n_expert) f32 */
    float *exp_gate_b, *exp_up_b; /* (n_expert, ffn) f32 */
    float *exp_down_b;            /* (n_expert, dim) f32 */
    /* Gated DeltaNet layers (llm_layer_is_recurrent; empty otherwise, and wq..wo empty in them): conv_dim =
     * llm_ssm_conv_dim, inner = hp.ssm_inner, n_v = hp.ssm_n_v_heads. */
    struct wview ssm_qkv;             /* (conv_dim, dim); packed with z (ARCH_ROLE_SSM_QKVZ): (conv_dim +
                                       * inner, dim) and ssm_z empty */
    struct wview ssm_z;               /* (inner, dim) */
    struct wview ssm_beta, ssm_alpha; /* (n_v, dim); packed (ARCH_ROLE_SSM_BA): ssm_beta (2 n_v, dim) and
                                       * ssm_alpha empty */
    struct wview ssm_out;             /* (dim, inner) */
    float *ssm_conv;                  /* (conv_dim, conv_kernel) f32 */
    float *ssm_dt, *ssm_a;            /* (n_v) f32: the decay's bias and -exp(A_log) */
    float *ssm_norm;                  /* (head_v) f32 */
    float *out_scale;                 /* (1) f32 the layer's output scalar (Gemma 4), or NULL */
    /* Per-layer inputs (hp.ple_dim > 0; empty/NULL otherwise): */
    struct wview ple_gate; /* (ple_dim, dim) */
    struct wview ple_proj; /* (dim, ple_dim) */
    float *ple_norm;       /* (dim) f32 */
    /* A shared expert (LOP_MOE_SHARED): its FFN is w_gate/w_up/w_down (ffn_dim), gated by this (dim) f32,
     * or NULL. */
    float *shexp_gate;
};

struct model {
    struct llm_hparams hp;
    struct wview tok_embd;      /* (n_vocab, dim) */
    struct wview output;        /* (n_vocab, dim); token_embd when tied */
    float *output_norm;         /* (dim) f32 */
    struct model_layer *layers; /* (n_layers) */
    float *inv_freq;            /* (rope_dim/2) f32 */
    float *inv_freq_local;      /* (rope_dim/2) f32 of the sliding-window layers (rope_theta_swa; rope_dim_swa
                                 * when set), or NULL */
    uint64_t weight_bytes;      /* bytes of all matrices read per forward pass */
    void *owned;                /* synthetic models: the one allocation holding every matrix */
    void *quant_owned;          /* matrices quantized at load, or NULL */
    /* Per-layer inputs (hp.ple_dim > 0; empty/NULL otherwise): the embeddings of every layer per token, the
     * projection of the input to them, the norm of that projection. */
    struct wview ple_embd;  /* (n_vocab, n_layers * ple_dim) */
    struct wview ple_mproj; /* (n_layers * ple_dim, dim) */
    float *ple_proj_norm;   /* (ple_dim) f32 */
};

/* Bytes of a matrix in its type. */
uint64_t wview_bytes(const struct wview *w);

int model_init(struct model *m, const struct model_file *mf, char err[256]);
/* Quantization at load (`--quant`): every F32/F16/BF16 matrix, the token embedding included, gets the type
 * llama.cpp's mix `ftype` (quant/mix.h, e.g. QUANT_FTYPE_Q8_0, QUANT_FTYPE_Q4_K_M) gives it, through quant/'s
 * reference quantizers, in memory the model owns: the same types and bytes `ferry quantize --type <ftype>`
 * writes, so both give bitwise the same logits. Tensors already quantized in the file stay; a matrix no type
 * of the mix can hold (rows not a multiple of 32 in a legacy mix) stays as loaded. Uses n_threads threads
 * (0 = all cores). */
int model_quantize(struct model *m, int ftype, int n_threads, char err[256]);
/* A model of the shape hp (arch, dims, rope fields) whose matrices are random, non-zero values of type wt
 * (F32, F16 or BF16) drawn from a seeded generator, with unit-scale norms: for benchmarks at real shapes
 * without a file. Filling many GB uses `n_threads` threads (0 = all cores). */
int model_init_synthetic(struct model *m, const struct llm_hparams *hp, enum dtype wt, uint64_t seed,
                         int n_threads, char err[256]);
void model_free(struct model *m);
/* Fits the model to a context of ctx positions per sequence, before a backend copies its tables: LongRoPE
 * rotates with its long factors when ctx exceeds the original context and with its short ones otherwise,
 * for every position, as llama.cpp chooses by its context size (transformers chooses by the length of the
 * sequence in each call, and recomputes the whole cache when a sequence grows past the original context:
 * equal to this while a sequence stays on one side). The attention temperature (llm_attn_temp) is 1 at every
 * position below its length: a context that ends there drops it. */
void model_fit_ctx(struct model *m, int ctx);

#endif
