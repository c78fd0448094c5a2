/* mix — llama.cpp's quantization mixes: which type each tensor of a model gets for a file type such as
 * Q4_K_M.
 *
 * A file type (llama_ftype, written to general.file_type) names a base type and the rules of llama.cpp's
 * llama_tensor_get_type (src/llama-quant.cpp, b4748) for dense Llama-family models: 2-D tensors whose names
 * end in "weight" (not "_norm.weight") are quantized; the output head (or the token embedding when tied) gets
 * Q6_K in K mixes and legacy mixes alike (Q8_0 stays Q8_0); Q4_K_M/Q5_K_M give Q6_K to attn_v and ffn_down of
 * the layers use_more_bits picks (the first and last eighth, every third in between); Q4_K_S gives Q5_K to
 * the first four attn_v and the first eighth of ffn_down; a 70B-class model (80 layers with grouped-query
 * attention) bumps Q4_K attn_v to Q5_K. A tensor whose row length is not a multiple of the chosen type's
 * block falls back as llama.cpp does (Q4_K -> Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0, then F16); a legacy type that
 * cannot hold it is an error there and here. Decisions depend on counters (attn_v and ffn_down tensors seen
 * so far), so tensors must be presented in llama.cpp's order: by layer number (non-layer tensors first), then
 * by name (quant_mix_order). Usage: quant_mix_init → quant_mix_type for each tensor in that order.
 */
#ifndef FERRY_QUANT_MIX_H
#define FERRY_QUANT_MIX_H

#include <stdbool.h>
#include <stdint.h>

#include "quant/dtype.h"

/* llama_ftype values (llama.h); general.file_type. */
enum quant_ftype {
    QUANT_FTYPE_F32 = 0,
    QUANT_FTYPE_F16 = 1,
    QUANT_FTYPE_Q4_0 = 2,
    QUANT_FTYPE_Q4_1 = 3,
    QUANT_FTYPE_Q8_0 = 7,
    QUANT_FTYPE_Q5_0 = 8,
    QUANT_FTYPE_Q5_1 = 9,
    QUANT_FTYPE_Q4_K_S = 14,
    QUANT_FTYPE_Q4_K_M = 15,
    QUANT_FTYPE_Q5_K_S = 16,
    QUANT_FTYPE_Q5_K_M = 17,
    QUANT_FTYPE_Q6_K = 18,
    QUANT_FTYPE_BF16 = 32,
};

/* "Q4_K_M"; NULL for a value not listed above. */
const char *quant_ftype_name(int ftype);
/* The file type called name (case-insensitive, as llama-quantize spells it), or -1. */
int quant_ftype_from_name(const char *name);
/* The names of all file types, comma-separated, for help texts. */
const char *quant_ftype_names(void);

struct quant_mix {
    enum quant_ftype ftype;
    enum dtype base; /* the type most tensors get */
    int n_layers;    /* ffn_down layers (hparams) */
    int n_attn_v;    /* attn_v tensors in the model */
    int i_attn_v;    /* attn_v tensors decided so far */
    int i_ffn_down;  /* ffn_down tensors decided so far */
    bool has_output; /* the model has output.weight (else the token embedding is the head) */
    bool is_70b;     /* llama.cpp's LLM_TYPE_70B */
};

/* n_attn_v: tensors whose names contain "attn_v.weight"; is_70b: llama arch with 80 layers and fewer KV heads
 * than heads, or qwen2 with 80 layers (llama.cpp's model type). False for an unknown ftype. */
bool quant_mix_init(struct quant_mix *m, int ftype, int n_layers, int n_attn_v, bool has_output, bool is_70b);

/* The type of tensor `name` (n_dims dimensions, ne0 elements per row, stored now as `cur`): cur itself when
 * the tensor is kept as it is. Returns -1 when the chosen legacy type does not divide the row (llama.cpp's
 * "Unsupported tensor size"). Advances the counters: call once per tensor, in quant_mix_order. */
int quant_mix_type(struct quant_mix *m, const char *name, int n_dims, int64_t ne0, enum dtype cur);

/* llama.cpp's tensor order: negative when a comes first (layer number of "blk.N.", -1 for others; then
 * strcmp). */
int quant_mix_order(const char *a, const char *b);

#endif
