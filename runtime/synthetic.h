/* synthetic — models of real shapes with random weights, for benchmarks and planning without a file.
 *
 * A shape is a name (synthetic_shape_find) and the hyperparameters a GGUF of that model loads to. Dense
 * shapes are built by model_init_synthetic (runtime/model.h) in one float type. Expert shapes are built as an
 * in-memory model file of the family's tensors (weights/arch/), named, shaped and typed as llama.cpp's
 * quantization mix of the shape (Q4_K_M for Qwen3-30B-A3B, MXFP4_MOE for gpt-oss) gives them, then loaded by
 * model_init like a file: the same views, vectors and checks. Matrices of a block type are written directly
 * in that type (a small pool of rows quantized from random values, repeated), so the host holds only the
 * final bytes: synthetic_bytes is the peak. Norm weights are near 1, every other value uniform in about
 * [-0.05, 0.05). Usage: synthetic_shape_find → synthetic_hparams → synthetic_model_init → model_free.
 */
#ifndef FERRY_SYNTHETIC_H
#define FERRY_SYNTHETIC_H

#include <stdint.h>

#include "quant/dtype.h"
#include "runtime/model.h"
#include "weights/model_file.h"

struct synthetic_shape;

/* The shape called name, or NULL. */
const struct synthetic_shape *synthetic_shape_find(const char *name);
/* The names of the shapes, comma-separated (those for tests excluded), in a static buffer: not thread-safe.
 */
const char *synthetic_shape_names(void);
/* The hyperparameters of the shape; *ftype: the llama.cpp mix its matrices are stored in (enum quant_ftype),
 * or -1 for a dense shape of one float type. */
void synthetic_hparams(const struct synthetic_shape *s, struct llm_hparams *hp, int *ftype);

/* Byte totals of the model hp in mix ftype (-1: every matrix in wt), computed without allocating: all
 * tensors, and the stacked experts alone. */
struct synthetic_bytes {
    uint64_t total, experts;
    uint64_t n_params, n_expert_params;
};
int synthetic_bytes(const struct llm_hparams *hp, enum dtype wt, int ftype, struct synthetic_bytes *out,
                    char err[256]);

/* The model file of hp in mix ftype (>= 0) as the module comment says, its tensor bytes owned by it
 * (mf->arch_owned; model_file_close frees all). matrices 0: for planning (ferry inspect --synthetic), only
 * the F32 tensors (vectors, bias tables, routers) hold values; every other tensor has its shape, type and
 * nbytes, and data that must not be read. */
int synthetic_model_file(const struct llm_hparams *hp, enum dtype wt, int ftype, uint64_t seed, int n_threads,
                         int matrices, struct model_file **out, char err[256]);

/* The model hp with random weights: through model_init_synthetic when ftype < 0, else as the module comment
 * says, the matrices the mix keeps unquantized (routers aside, which GGUF files keep in F32) in wt. Uses
 * n_threads threads (0: all cores). */
int synthetic_model_init(struct model *m, const struct llm_hparams *hp, enum dtype wt, int ftype,
                         uint64_t seed, int n_threads, char err[256]);

#endif
