/* mix — llama.cpp's per-tensor type rules for the file types ferry writes (see mix.h). The branches below
 * follow llama_tensor_get_type_impl of lcp0336 in its order, restricted to the file types of ftype_table;
 * rules for architectures ferry does not read (Falcon, GLM5-next, BailingMoE3) are left out. */
#include "quant/mix.h"

#include <stdio.h>
#include <string.h>
#include <strings.h>

/* Every mix whose rules are here; rules_only: one of its tensor types has no quantizer in ferry yet, so the
 * mix is not written (its rules are still held to llama.cpp's snapshots). */
static const struct {
    enum quant_ftype ftype;
    const char *name;
    enum dtype base;
    bool rules_only;
} ftype_table[] = {
    {QUANT_FTYPE_Q4_K_M, "Q4_K_M", DTYPE_Q4_K, false},
    {QUANT_FTYPE_Q4_K_S, "Q4_K_S", DTYPE_Q4_K, false},
    {QUANT_FTYPE_Q5_K_M, "Q5_K_M", DTYPE_Q5_K, false},
    {QUANT_FTYPE_Q5_K_S, "Q5_K_S", DTYPE_Q5_K, false},
    {QUANT_FTYPE_Q6_K, "Q6_K", DTYPE_Q6_K, false},
    {QUANT_FTYPE_Q3_K_M, "Q3_K_M", DTYPE_Q3_K, false},
    {QUANT_FTYPE_Q3_K_S, "Q3_K_S", DTYPE_Q3_K, false},
    {QUANT_FTYPE_Q3_K_L, "Q3_K_L", DTYPE_Q3_K, false},
    {QUANT_FTYPE_Q2_K, "Q2_K", DTYPE_Q2_K, false},
    {QUANT_FTYPE_IQ4_XS, "IQ4_XS", DTYPE_IQ4_XS, false},
    {QUANT_FTYPE_IQ4_NL, "IQ4_NL", DTYPE_IQ4_NL, false},
    {QUANT_FTYPE_MXFP4_MOE, "MXFP4_MOE", DTYPE_MXFP4, false},
    {QUANT_FTYPE_Q8_0, "Q8_0", DTYPE_Q8_0, false},
    {QUANT_FTYPE_Q4_0, "Q4_0", DTYPE_Q4_0, false},
    {QUANT_FTYPE_Q4_1, "Q4_1", DTYPE_Q4_1, false},
    {QUANT_FTYPE_Q5_0, "Q5_0", DTYPE_Q5_0, false},
    {QUANT_FTYPE_Q5_1, "Q5_1", DTYPE_Q5_1, false},
    {QUANT_FTYPE_F16, "F16", DTYPE_F16, false},
    {QUANT_FTYPE_BF16, "BF16", DTYPE_BF16, false},
    {QUANT_FTYPE_F32, "F32", DTYPE_F32, false},
    {QUANT_FTYPE_IQ3_S, "IQ3_S", DTYPE_IQ3_S, false},
    {QUANT_FTYPE_IQ3_M, "IQ3_M", DTYPE_IQ3_S, false},
    {QUANT_FTYPE_IQ3_XS, "IQ3_XS", DTYPE_IQ3_S, false},
    {QUANT_FTYPE_IQ2_XS, "IQ2_XS", DTYPE_IQ2_XS, false},
    {QUANT_FTYPE_IQ2_XXS, "IQ2_XXS", DTYPE_IQ2_XXS, false},
    {QUANT_FTYPE_Q2_K_S, "Q2_K_S", DTYPE_Q2_K, false},
    {QUANT_FTYPE_IQ3_XXS, "IQ3_XXS", DTYPE_IQ3_XXS, false},
    {QUANT_FTYPE_IQ2_S, "IQ2_S", DTYPE_IQ2_XS, false},
    {QUANT_FTYPE_IQ2_M, "IQ2_M", DTYPE_IQ2_S, false},
    {QUANT_FTYPE_IQ1_S, "IQ1_S", DTYPE_IQ1_S, false},
    {QUANT_FTYPE_IQ1_M, "IQ1_M", DTYPE_IQ1_M, false},
};
#define N_FTYPES (int)(sizeof ftype_table / sizeof ftype_table[0])

/* llama-quantize's aliases (tools/quantize/quantize.cpp). */
static const struct {
    const char *name;
    enum quant_ftype ftype;
} alias_table[] = {
    {"Q3_K", QUANT_FTYPE_Q3_K_M},
    {"Q4_K", QUANT_FTYPE_Q4_K_M},
    {"Q5_K", QUANT_FTYPE_Q5_K_M},
};

/* The other names llama-quantize accepts, and why ferry does not write them. */
static const struct {
    const char *name;
    const char *why;
} refusal_table[] = {
    {"TQ1_0", "ternary types are for models trained ternary; ferry does not read them"},
    {"TQ2_0", "ternary types are for models trained ternary; ferry does not read them"},
    {"Q1_0", "ferry does not read Q1_0"},
    {"Q2_0", "ferry does not read Q2_0"},
    {"COPY", "ferry quantize always converts; copy the file instead"},
};

static int ftype_index(int ftype)
{
    for (int i = 0; i < N_FTYPES; i++)
        if ((int)ftype_table[i].ftype == ftype) return i;
    return -1;
}

const char *quant_ftype_name(int ftype)
{
    const int i = ftype_index(ftype);
    return i < 0 ? NULL : ftype_table[i].name;
}

int quant_ftype_rules_from_name(const char *name)
{
    if (!name) return -1;
    for (int i = 0; i < N_FTYPES; i++)
        if (!strcasecmp(name, ftype_table[i].name)) return (int)ftype_table[i].ftype;
    return -1;
}

int quant_ftype_from_name(const char *name)
{
    if (!name) return -1;
    for (int i = 0; i < N_FTYPES; i++)
        if (!strcasecmp(name, ftype_table[i].name))
            return ftype_table[i].rules_only ? -1 : (int)ftype_table[i].ftype;
    for (size_t i = 0; i < sizeof alias_table / sizeof alias_table[0]; i++)
        if (!strcasecmp(name, alias_table[i].name)) return (int)alias_table[i].ftype;
    return -1;
}

const char *quant_ftype_refusal(const char *name)
{
    for (size_t i = 0; name && i < sizeof refusal_table / sizeof refusal_table[0]; i++)
        if (!strcasecmp(name, refusal_table[i].name)) return refusal_table[i].why;
    return NULL;
}

const char *quant_ftype_names(void)
{
    return "Q4_K_M, Q4_K_S, Q5_K_M, Q5_K_S, Q6_K, Q3_K_M, Q3_K_S, Q3_K_L, Q2_K, IQ4_XS, IQ4_NL, MXFP4_MOE, "
           "Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, F16, BF16, F32, IQ3_S, IQ3_M, IQ3_XS, IQ3_XXS, IQ2_M, IQ2_S, "
           "IQ2_XS, IQ2_XXS, IQ1_M, IQ1_S, Q2_K_S";
}

bool quant_mix_init_model(struct quant_mix *m, int ftype, const struct quant_mix_model *model)
{
    const int i = ftype_index(ftype);
    if (i < 0) return false;
    *m = (struct quant_mix){.ftype = (enum quant_ftype)ftype, .base = ftype_table[i].base, .model = *model};
    return true;
}

bool quant_mix_init(struct quant_mix *m, int ftype, int n_layers, int n_attn_v, bool has_output, bool is_70b)
{
    const struct quant_mix_model model = {
        .n_layers = n_layers, .n_attn_v = n_attn_v, .n_gqa = 1, .has_output = has_output, .is_70b = is_70b};
    return quant_mix_init_model(m, ftype, &model);
}

static int layer_of(const char *name)
{
    int l = -1;
    if (sscanf(name, "blk.%d.", &l) != 1) return -1;
    return l;
}

int quant_mix_order(const char *a, const char *b)
{
    const int la = layer_of(a), lb = layer_of(b);
    if (la != lb) return la < lb ? -1 : 1;
    return strcmp(a, b);
}

static bool ends_with(const char *s, const char *suffix)
{
    const size_t n = strlen(s), k = strlen(suffix);
    return n >= k && !memcmp(s + n - k, suffix, k);
}

/* ---- categories (llama.cpp's tensor_get_category: the first substring that matches) -------------------- */

enum category {
    CAT_OTHER,
    CAT_OUTPUT,
    CAT_TOKEN_EMBD,
    CAT_ATTN_QKV,
    CAT_ATTN_KV_B,
    CAT_ATTN_V,
    CAT_ATTN_K,
    CAT_ATTN_Q,
    CAT_ATTN_OUTPUT,
    CAT_FFN_UP,
    CAT_FFN_GATE,
    CAT_FFN_DOWN,
};

static enum category category_of(const char *name)
{
    if (!strcmp(name, "output.weight")) return CAT_OUTPUT;
    if (!strcmp(name, "token_embd.weight") || !strcmp(name, "per_layer_token_embd.weight"))
        return CAT_TOKEN_EMBD;
    static const struct {
        const char *sub;
        enum category cat;
    } subs[] = {{"attn_qkv.weight", CAT_ATTN_QKV},
                {"attn_kv_b.weight", CAT_ATTN_KV_B},
                {"attn_v.weight", CAT_ATTN_V},
                {"attn_k.weight", CAT_ATTN_K},
                {"attn_q.weight", CAT_ATTN_Q},
                {"attn_output.weight", CAT_ATTN_OUTPUT},
                {"ffn_up", CAT_FFN_UP},
                {"ffn_gate", CAT_FFN_GATE},
                {"ffn_down", CAT_FFN_DOWN}};
    for (size_t i = 0; i < sizeof subs / sizeof subs[0]; i++)
        if (strstr(name, subs[i].sub)) return subs[i].cat;
    return CAT_OTHER;
}

bool quant_mix_attn_v_like(const char *name)
{
    const enum category c = category_of(name);
    return c == CAT_ATTN_V || c == CAT_ATTN_QKV || c == CAT_ATTN_KV_B;
}

/* llama.cpp's tensor_allows_quantization, for the names that occur in the families ferry reads and their
 * close relatives: matrices whose names end in "weight", but norms, MoE routers and small tables. */
static bool allows_quantization(const char *name, int n_dims)
{
    static const char *const never[] = {"_norm.weight",
                                        "ffn_gate_inp.weight",
                                        "ffn_gate_tid2eid.weight",
                                        "altup",
                                        "laurel",
                                        "per_layer_model_proj",
                                        "ssm_conv1d",
                                        "shortconv.conv.weight",
                                        "attn_rel_b.weight",
                                        ".position_embd",
                                        ".rel_pos",
                                        ".patch_embd",
                                        "indexer.k_proj.weight",
                                        "indexer.q_proj.weight"};
    if (n_dims < 2 || !ends_with(name, "weight")) return false;
    for (size_t i = 0; i < sizeof never / sizeof never[0]; i++)
        if (strstr(name, never[i])) return false;
    return strcmp(name, "position_embd.weight") && strcmp(name, "token_types.weight");
}

/* llama.cpp's use_more_bits: the first and last eighth of the layers, and every third one in between. */
static bool use_more_bits(int i, int n)
{
    return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2;
}

/* The layer of an FFN tensor: its counter in a dense model; its name's "blk.N." in an MoE model, whose expert
 * tensors need not come one per layer. -1 when the name holds no layer below n. */
static int ffn_layer(const struct quant_mix *m, int counter, const char *name)
{
    if (m->model.n_expert <= 1) return counter;
    const int l = layer_of(name);
    return l >= 0 && l < m->model.n_layers ? l : -1;
}

/* The mixes of the 1- and 2-bit i-quants, which share their own rules. */
static bool low_iq(enum quant_ftype ft)
{
    return ft == QUANT_FTYPE_IQ2_XXS || ft == QUANT_FTYPE_IQ2_XS || ft == QUANT_FTYPE_IQ1_S ||
           ft == QUANT_FTYPE_IQ2_S || ft == QUANT_FTYPE_IQ2_M || ft == QUANT_FTYPE_IQ1_M;
}

/* IQ2_S and IQ2_M: IQ3_S where the other low mixes use Q2_K. */
static enum dtype low_iq_bump(enum quant_ftype ft)
{
    return ft == QUANT_FTYPE_IQ2_S || ft == QUANT_FTYPE_IQ2_M ? DTYPE_IQ3_S : DTYPE_Q2_K;
}

/* The output head (or the tied token embedding). */
static enum dtype output_type(const struct quant_mix *m, int64_t ne0)
{
    if (m->ftype == QUANT_FTYPE_MXFP4_MOE || ne0 % dtype_block_size(m->base) != 0) return DTYPE_Q8_0;
    if (low_iq(m->ftype) || m->ftype == QUANT_FTYPE_IQ3_XXS) return DTYPE_Q5_K;
    return m->base == DTYPE_Q8_0 ? DTYPE_Q8_0 : DTYPE_Q6_K;
}

/* The token embedding when it is not the head. */
static enum dtype token_embd_type(const struct quant_mix *m)
{
    const enum quant_ftype ft = m->ftype;
    if (ft == QUANT_FTYPE_IQ2_XXS || ft == QUANT_FTYPE_IQ2_XS || ft == QUANT_FTYPE_IQ1_S ||
        ft == QUANT_FTYPE_IQ1_M)
        return DTYPE_Q2_K;
    if (ft == QUANT_FTYPE_IQ2_S || ft == QUANT_FTYPE_IQ2_M || ft == QUANT_FTYPE_IQ3_XXS) return DTYPE_IQ3_S;
    return m->base;
}

/* llama.cpp's branch for the low i-quant mixes (it replaces every rule below for them). */
static enum dtype low_iq_type(struct quant_mix *m, int cat)
{
    const enum quant_ftype ft = m->ftype;
    const struct quant_mix_model *md = &m->model;
    enum dtype t = m->base;
    if (cat == 1) { /* attn_v-like */
        t = md->n_gqa >= 4 || md->n_expert >= 4 ? DTYPE_Q4_K : low_iq_bump(ft);
        m->i_attn_v++;
    } else if (cat == 2 && md->n_expert == 8) { /* attn_k */
        t = DTYPE_Q4_K;
    } else if (cat == 3) { /* ffn_down: by its counter, not its layer */
        if (m->i_ffn_down < md->n_layers / 8) t = low_iq_bump(ft);
        m->i_ffn_down++;
    } else if (cat == 4) { /* attn_output */
        if (md->n_expert == 8)
            t = DTYPE_Q5_K;
        else if (ft == QUANT_FTYPE_IQ1_S || ft == QUANT_FTYPE_IQ1_M)
            t = DTYPE_IQ2_XXS;
        else if (ft == QUANT_FTYPE_IQ2_S || ft == QUANT_FTYPE_IQ2_M)
            t = DTYPE_IQ3_S;
    }
    return t;
}

static enum dtype attn_v_type(struct quant_mix *m)
{
    const enum quant_ftype ft = m->ftype;
    const struct quant_mix_model *md = &m->model;
    enum dtype t = m->base;
    if (ft == QUANT_FTYPE_Q2_K)
        t = md->n_gqa >= 4 ? DTYPE_Q4_K : DTYPE_Q3_K;
    else if (ft == QUANT_FTYPE_Q2_K_S && md->n_gqa >= 4)
        t = DTYPE_Q4_K;
    else if (ft == QUANT_FTYPE_IQ3_XXS)
        t = md->n_gqa >= 4 ? DTYPE_Q4_K : !md->has_imatrix ? DTYPE_IQ3_S : DTYPE_IQ3_XXS;
    else if ((ft == QUANT_FTYPE_IQ3_XS || ft == QUANT_FTYPE_IQ3_S) && md->n_gqa >= 4)
        t = DTYPE_Q4_K;
    else if (ft == QUANT_FTYPE_IQ3_M)
        t = DTYPE_Q4_K;
    else if (ft == QUANT_FTYPE_Q3_K_M)
        t = m->i_attn_v < 2 ? DTYPE_Q5_K : DTYPE_Q4_K;
    else if (ft == QUANT_FTYPE_Q3_K_L)
        t = DTYPE_Q5_K;
    else if ((ft == QUANT_FTYPE_IQ4_NL || ft == QUANT_FTYPE_IQ4_XS) && md->n_gqa >= 4)
        t = DTYPE_Q5_K;
    else if ((ft == QUANT_FTYPE_Q4_K_M || ft == QUANT_FTYPE_Q5_K_M) &&
             use_more_bits(m->i_attn_v, md->n_attn_v))
        t = DTYPE_Q6_K;
    else if (ft == QUANT_FTYPE_Q4_K_S && m->i_attn_v < 4)
        t = DTYPE_Q5_K;
    /* 70B: eight heads share each attn_v row, so a few more bits there cost little. */
    if (md->is_70b && (t == DTYPE_Q3_K || t == DTYPE_Q4_K)) t = DTYPE_Q5_K;
    if (md->n_expert == 8) t = DTYPE_Q8_0;
    m->i_attn_v++;
    return t;
}

static int ffn_down_type(struct quant_mix *m, const char *name)
{
    const enum quant_ftype ft = m->ftype;
    const int i = ffn_layer(m, m->i_ffn_down, name), n = m->model.n_layers;
    if (i < 0) return -1;
    enum dtype t = m->base;
    if (ft == QUANT_FTYPE_Q2_K)
        t = DTYPE_Q3_K;
    else if (ft == QUANT_FTYPE_Q2_K_S) {
        if (i < n / 8) t = DTYPE_Q4_K;
    } else if (ft == QUANT_FTYPE_IQ3_XXS && !m->model.has_imatrix)
        t = i < n / 8 ? DTYPE_Q4_K : DTYPE_Q3_K;
    else if (ft == QUANT_FTYPE_Q3_K_M)
        t = i < n / 16 ? DTYPE_Q5_K : DTYPE_Q4_K; /* (Q3_K for the middle layers of Falcon only) */
    else if (ft == QUANT_FTYPE_IQ3_M && (i < n / 8 || (m->model.n_expert == 8 && use_more_bits(i, n))))
        t = DTYPE_Q4_K;
    else if (ft == QUANT_FTYPE_Q3_K_L)
        t = DTYPE_Q5_K;
    else if (ft == QUANT_FTYPE_Q4_K_M) {
        if (use_more_bits(i, n)) t = DTYPE_Q6_K;
    } else if (i < n / 8 && (ft == QUANT_FTYPE_IQ4_NL || ft == QUANT_FTYPE_IQ4_XS) && !m->model.has_imatrix)
        t = DTYPE_Q5_K;
    else if (ft == QUANT_FTYPE_Q5_K_M && use_more_bits(i, n))
        t = DTYPE_Q6_K;
    else if (ft == QUANT_FTYPE_Q4_K_S && i < n / 8)
        t = DTYPE_Q5_K;
    else if ((ft == QUANT_FTYPE_Q4_0 || ft == QUANT_FTYPE_Q5_0) && m->model.has_imatrix && i < n / 8)
        t = ft == QUANT_FTYPE_Q4_0 ? DTYPE_Q4_1 : DTYPE_Q5_1; /* (only with an importance matrix) */
    m->i_ffn_down++;
    return (int)t;
}

static enum dtype attn_output_type(const struct quant_mix *m)
{
    const enum quant_ftype ft = m->ftype;
    if (m->model.n_expert == 8) {
        const bool bump = ft == QUANT_FTYPE_Q2_K || ft == QUANT_FTYPE_Q3_K_S || ft == QUANT_FTYPE_Q3_K_M ||
                          ft == QUANT_FTYPE_IQ4_NL || ft == QUANT_FTYPE_Q4_K_S || ft == QUANT_FTYPE_Q4_K_M ||
                          ft == QUANT_FTYPE_IQ4_XS || ft == QUANT_FTYPE_IQ3_XS || ft == QUANT_FTYPE_IQ3_XXS ||
                          ft == QUANT_FTYPE_IQ3_S || ft == QUANT_FTYPE_IQ3_M;
        return bump ? DTYPE_Q5_K : m->base;
    }
    if (ft == QUANT_FTYPE_Q2_K) return DTYPE_Q3_K;
    if (ft == QUANT_FTYPE_IQ3_XXS) return DTYPE_IQ3_S;
    if (ft == QUANT_FTYPE_IQ3_M) return DTYPE_Q4_K;
    if (ft == QUANT_FTYPE_Q3_K_M) return DTYPE_Q4_K;
    if (ft == QUANT_FTYPE_Q3_K_L) return DTYPE_Q5_K;
    return m->base;
}

static enum dtype attn_q_type(const struct quant_mix *m)
{
    return m->ftype == QUANT_FTYPE_IQ3_XS    ? DTYPE_IQ3_XXS
           : m->ftype == QUANT_FTYPE_IQ3_XXS ? DTYPE_IQ2_S
                                             : m->base;
}

/* llama_tensor_get_type_impl for the file types of ftype_table (before the row-length fallback). */
static int mixed_type(struct quant_mix *m, const char *name, int n_dims, int64_t ne0)
{
    const enum category cat = category_of(name);
    if (cat == CAT_OUTPUT || (!m->model.has_output && cat == CAT_TOKEN_EMBD)) return (int)output_type(m, ne0);
    /* MoE experts (stacked: three dimensions) in MXFP4, the rest in Q8_0. */
    if (m->ftype == QUANT_FTYPE_MXFP4_MOE) return n_dims >= 3 ? DTYPE_MXFP4 : DTYPE_Q8_0;
    if (cat == CAT_TOKEN_EMBD) return (int)token_embd_type(m);
    if (low_iq(m->ftype)) {
        const int c = cat == CAT_ATTN_V || cat == CAT_ATTN_QKV || cat == CAT_ATTN_KV_B ? 1
                      : cat == CAT_ATTN_K                                              ? 2
                      : cat == CAT_FFN_DOWN                                            ? 3
                      : cat == CAT_ATTN_OUTPUT                                         ? 4
                                                                                       : 0;
        return (int)low_iq_type(m, c);
    }
    switch (cat) {
    case CAT_ATTN_V:
    case CAT_ATTN_QKV:
    case CAT_ATTN_KV_B:
        return (int)attn_v_type(m);
    case CAT_ATTN_K: /* as attn_q but in 8-expert models */
        return m->model.n_expert == 8 ? DTYPE_Q8_0 : (int)attn_q_type(m);
    case CAT_ATTN_Q:
        return (int)attn_q_type(m);
    case CAT_FFN_DOWN:
        return ffn_down_type(m, name);
    case CAT_ATTN_OUTPUT:
        return (int)attn_output_type(m);
    case CAT_FFN_GATE:
    case CAT_FFN_UP: {
        const int i = ffn_layer(m, cat == CAT_FFN_GATE ? m->i_ffn_gate++ : m->i_ffn_up++, name),
                  n = m->model.n_layers;
        if (i < 0) return -1;
        /* IQ3_XS: the middle three quarters of the layers in IQ3_XXS */
        return m->ftype == QUANT_FTYPE_IQ3_XS && i >= n / 8 && i < 7 * n / 8 ? DTYPE_IQ3_XXS : (int)m->base;
    }
    default:
        return (int)m->base;
    }
}

/* llama.cpp's tensor_type_fallback: a type whose block does not divide the row. */
static enum dtype fallback(enum dtype t, int64_t ne0)
{
    if (ne0 % dtype_block_size(t) == 0) return t;
    switch (t) {
    case DTYPE_IQ1_S:
    case DTYPE_IQ1_M:
    case DTYPE_IQ2_XXS:
    case DTYPE_IQ2_XS:
    case DTYPE_IQ2_S:
    case DTYPE_IQ3_XXS:
    case DTYPE_IQ3_S:
    case DTYPE_IQ4_XS:
        t = DTYPE_IQ4_NL;
        break;
    case DTYPE_Q2_K:
    case DTYPE_Q3_K:
        t = DTYPE_Q4_0;
        break;
    case DTYPE_Q4_K:
        t = DTYPE_Q5_0;
        break;
    case DTYPE_Q5_K:
        t = DTYPE_Q5_1;
        break;
    case DTYPE_Q6_K:
        t = DTYPE_Q8_0;
        break;
    default: /* a 32-block type: nothing smaller to demote to */
        break;
    }
    return ne0 % dtype_block_size(t) == 0 ? t : DTYPE_F16;
}

int quant_mix_type(struct quant_mix *m, const char *name, int n_dims, int64_t ne0, enum dtype cur)
{
    if (!allows_quantization(name, n_dims)) return (int)cur;
    if (!dtype_get_traits(m->base)->is_quantized) return (int)m->base;
    const int t = mixed_type(m, name, n_dims, ne0);
    return t < 0 ? -1 : (int)fallback((enum dtype)t, ne0);
}

bool quant_mix_needs_imatrix(const struct quant_mix *m, const char *name, enum dtype t)
{
    const enum category cat = category_of(name);
    if (cat == CAT_OUTPUT || cat == CAT_TOKEN_EMBD) return false;
    switch (t) {
    case DTYPE_IQ3_XXS:
    case DTYPE_IQ2_XXS:
    case DTYPE_IQ2_XS:
    case DTYPE_IQ2_S:
    case DTYPE_IQ1_M:
    case DTYPE_IQ1_S:
        return true;
    case DTYPE_Q2_K:
        return m->ftype == QUANT_FTYPE_Q2_K_S;
    default:
        return false;
    }
}
