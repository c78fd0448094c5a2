/* mix — llama.cpp's quantization mixes: which type each tensor of a model gets for a file type such as
 * Q4_K_M.
 *
 * A file type (llama_ftype, written to general.file_type) names a default type and the rules of llama.cpp's
 * llama_tensor_get_type (src/llama-quant.cpp of lcp0336) for the families ferry reads. Tensors whose names
 * end in "weight" with two or more dimensions are quantized, but for norms, MoE routers (ffn_gate_inp) and a
 * few small tables. The output head (or the token embedding when tied) gets Q6_K (Q8_0 stays Q8_0; MXFP4_MOE
 * and a row that fits no block of the default type give Q8_0). The K mixes bump attn_v (and fused attn_qkv),
 * ffn_down and attn_output by layer position (use_more_bits: the first and last eighth of the layers, every
 * third one in between), by grouped-query attention (n_heads / n_kv_heads >= 4), by 8-expert models and by
 * the 70B class; MXFP4_MOE writes stacked experts (3-D tensors) in MXFP4 and everything else in Q8_0. A row
 * length that is not a multiple of the chosen type's block falls back as llama.cpp does (IQ4_XS -> IQ4_NL,
 * Q2_K/Q3_K -> Q4_0, Q4_K -> Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0, then F16 when even that does not fit).
 * Decisions of dense models depend on counters (attn_v and ffn_down tensors seen so far), so tensors must be
 * presented in llama.cpp's order: by layer number (non-layer tensors first), then by name (quant_mix_order).
 * Usage: quant_mix_init_model → quant_mix_type for each tensor in that order. tests/quant/test_mix.c holds
 * the rules to llama.cpp's own snapshots.
 */
#ifndef FERRY_QUANT_MIX_H
#define FERRY_QUANT_MIX_H

#include <stdbool.h>
#include <stdint.h>

#include "quant/dtype.h"

/* llama_ftype values (llama.h); general.file_type. The i-quant mixes' rules are all in mix.c; ferry writes
 * those whose types it has quantizers for (quant_ftype_from_name). */
enum quant_ftype {
    QUANT_FTYPE_F32 = 0,
    QUANT_FTYPE_F16 = 1,
    QUANT_FTYPE_Q4_0 = 2,
    QUANT_FTYPE_Q4_1 = 3,
    QUANT_FTYPE_Q8_0 = 7,
    QUANT_FTYPE_Q5_0 = 8,
    QUANT_FTYPE_Q5_1 = 9,
    QUANT_FTYPE_Q2_K = 10,
    QUANT_FTYPE_Q3_K_S = 11,
    QUANT_FTYPE_Q3_K_M = 12,
    QUANT_FTYPE_Q3_K_L = 13,
    QUANT_FTYPE_Q4_K_S = 14,
    QUANT_FTYPE_Q4_K_M = 15,
    QUANT_FTYPE_Q5_K_S = 16,
    QUANT_FTYPE_Q5_K_M = 17,
    QUANT_FTYPE_Q6_K = 18,
    QUANT_FTYPE_IQ2_XXS = 19,
    QUANT_FTYPE_IQ2_XS = 20,
    QUANT_FTYPE_Q2_K_S = 21,
    QUANT_FTYPE_IQ3_XS = 22,
    QUANT_FTYPE_IQ3_XXS = 23,
    QUANT_FTYPE_IQ1_S = 24,
    QUANT_FTYPE_IQ4_NL = 25,
    QUANT_FTYPE_IQ3_S = 26,
    QUANT_FTYPE_IQ3_M = 27,
    QUANT_FTYPE_IQ2_S = 28,
    QUANT_FTYPE_IQ2_M = 29,
    QUANT_FTYPE_IQ4_XS = 30,
    QUANT_FTYPE_IQ1_M = 31,
    QUANT_FTYPE_BF16 = 32,
    QUANT_FTYPE_MXFP4_MOE = 38,
};

/* "Q4_K_M"; NULL for a value not listed above. */
const char *quant_ftype_name(int ftype);
/* The file type called name (case-insensitive, as llama-quantize spells it, its aliases Q3_K, Q4_K and Q5_K
 * for the _M mixes included), or -1 for a name ferry does not write. */
int quant_ftype_from_name(const char *name);
/* The same, counting also the mixes ferry knows the rules of but does not write (IQ3_XXS, IQ2_S, IQ2_M,
 * IQ1_S, IQ1_M: a type they use has no quantizer in ferry yet); quant_mix_init_model accepts these. */
int quant_ftype_rules_from_name(const char *name);
/* For a name llama-quantize accepts and ferry does not write (IQ2_XXS, TQ1_0, ...): why, in one sentence.
 * NULL for any other name. */
const char *quant_ftype_refusal(const char *name);
/* The names of all file types ferry writes, comma-separated, for help texts. */
const char *quant_ftype_names(void);

/* What llama.cpp's rules read from the model beside tensor names. */
struct quant_mix_model {
    int n_layers;     /* hparams' layer count: ffn_down/gate/up positions are out of it */
    int n_attn_v;     /* tensors that quant_mix_attn_v_like names: attn_v positions are out of it */
    int n_gqa;        /* n_heads / n_kv_heads (0 when n_kv_heads is 0) */
    int n_expert;     /* experts per MoE layer; 0 in dense models */
    bool has_output;  /* the model has output.weight (else the token embedding is the head) */
    bool is_70b;      /* llama.cpp's LLM_TYPE_70B (the family's rule, weights/arch/) */
    bool has_imatrix; /* an importance matrix is given: IQ4 ffn_down stays IQ4, Q4_0/Q5_0 bump it instead */
};

struct quant_mix {
    enum quant_ftype ftype;
    enum dtype base; /* the type most tensors get */
    struct quant_mix_model model;
    int i_attn_v;   /* attn_v-like tensors decided so far */
    int i_ffn_down; /* ffn_down tensors decided so far (and ffn_gate, ffn_up: counted as llama.cpp does) */
    int i_ffn_gate;
    int i_ffn_up;
};

/* 1 for a tensor llama.cpp counts as attn_v (attn_v, attn_qkv, attn_kv_b): count them for n_attn_v. */
bool quant_mix_attn_v_like(const char *name);

/* False for a file type whose rules are not here. */
bool quant_mix_init_model(struct quant_mix *m, int ftype, const struct quant_mix_model *model);
/* A dense model without grouped-query facts (n_gqa 1, no experts): the at-load quantizer's view. */
bool quant_mix_init(struct quant_mix *m, int ftype, int n_layers, int n_attn_v, bool has_output, bool is_70b);

/* The type of tensor `name` (n_dims: ggml's count of dimensions, trailing ones dropped, so 3 or more means
 * stacked experts; ne0 elements per row; stored now as `cur`): cur itself when the tensor is kept as it is.
 * Returns -1 for an expert tensor of an MoE model whose name holds no layer below n_layers (llama.cpp refuses
 * the model). Advances the counters: call once per tensor, in quant_mix_order. */
int quant_mix_type(struct quant_mix *m, const char *name, int n_dims, int64_t ne0, enum dtype cur);

/* llama.cpp's tensor_requires_imatrix: tensor `name` of type t may not be written without importance weights
 * (the 1- and 2-bit i-quants and IQ3_XXS, and Q2_K in the Q2_K_S mix; never the output head or the token
 * embedding). */
bool quant_mix_needs_imatrix(const struct quant_mix *m, const char *name, enum dtype t);

/* llama.cpp's tensor order: negative when a comes first (layer number of "blk.N.", -1 for others; then
 * strcmp). */
int quant_mix_order(const char *a, const char *b);

#endif
