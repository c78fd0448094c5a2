/* mix — llama.cpp's per-tensor type rules for the file types ferry writes (see mix.h). */
#include "quant/mix.h"

#include <stdio.h>
#include <string.h>
#include <strings.h>

static const struct {
    enum quant_ftype ftype;
    const char *name;
    enum dtype base;
} ftype_table[] = {
    {QUANT_FTYPE_Q4_0, "Q4_0", DTYPE_Q4_0},     {QUANT_FTYPE_Q4_1, "Q4_1", DTYPE_Q4_1},
    {QUANT_FTYPE_Q5_0, "Q5_0", DTYPE_Q5_0},     {QUANT_FTYPE_Q5_1, "Q5_1", DTYPE_Q5_1},
    {QUANT_FTYPE_Q8_0, "Q8_0", DTYPE_Q8_0},     {QUANT_FTYPE_Q4_K_S, "Q4_K_S", DTYPE_Q4_K},
    {QUANT_FTYPE_Q4_K_M, "Q4_K_M", DTYPE_Q4_K}, {QUANT_FTYPE_Q5_K_S, "Q5_K_S", DTYPE_Q5_K},
    {QUANT_FTYPE_Q5_K_M, "Q5_K_M", DTYPE_Q5_K}, {QUANT_FTYPE_Q6_K, "Q6_K", DTYPE_Q6_K},
    {QUANT_FTYPE_F16, "F16", DTYPE_F16},        {QUANT_FTYPE_BF16, "BF16", DTYPE_BF16},
    {QUANT_FTYPE_F32, "F32", DTYPE_F32},
};
#define N_FTYPES (int)(sizeof ftype_table / sizeof ftype_table[0])

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

int quant_ftype_from_name(const char *name)
{
    for (int i = 0; i < N_FTYPES; i++)
        if (name && !strcasecmp(name, ftype_table[i].name)) return (int)ftype_table[i].ftype;
    return -1;
}

const char *quant_ftype_names(void)
{
    return "Q4_K_M, Q4_K_S, Q5_K_M, Q5_K_S, Q6_K, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, F16, BF16, F32";
}

bool quant_mix_init(struct quant_mix *m, int ftype, int n_layers, int n_attn_v, bool has_output, bool is_70b)
{
    const int i = ftype_index(ftype);
    if (i < 0) return false;
    *m = (struct quant_mix){.ftype = (enum quant_ftype)ftype,
                            .base = ftype_table[i].base,
                            .n_layers = n_layers,
                            .n_attn_v = n_attn_v,
                            .has_output = has_output,
                            .is_70b = is_70b};
    return true;
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

/* llama.cpp's use_more_bits: the first and last eighth of the layers, and every third one in between. */
static bool use_more_bits(int i, int n)
{
    return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2;
}

/* llama_tensor_get_type for a dense model and a quantized base type (before the row-length fallback). */
static enum dtype mixed_type(struct quant_mix *m, const char *name, int64_t ne0)
{
    const enum quant_ftype ft = m->ftype;
    enum dtype t = m->base;
    if (!strcmp(name, "output.weight") || (!m->has_output && !strcmp(name, "token_embd.weight"))) {
        if (ne0 % dtype_block_size(t) != 0)
            t = DTYPE_Q8_0;
        else if (t != DTYPE_Q8_0)
            t = DTYPE_Q6_K;
    } else if (!strcmp(name, "token_embd.weight")) {
        /* the base type */
    } else if (strstr(name, "attn_v.weight")) {
        if ((ft == QUANT_FTYPE_Q4_K_M || ft == QUANT_FTYPE_Q5_K_M) && use_more_bits(m->i_attn_v, m->n_attn_v))
            t = DTYPE_Q6_K;
        else if (ft == QUANT_FTYPE_Q4_K_S && m->i_attn_v < 4)
            t = DTYPE_Q5_K;
        /* 70B: eight heads share each attn_v row, so a few more bits there cost little. */
        if (m->is_70b && t == DTYPE_Q4_K) t = DTYPE_Q5_K;
        m->i_attn_v++;
    } else if (strstr(name, "ffn_down")) {
        const int i = m->i_ffn_down, n = m->n_layers;
        if ((ft == QUANT_FTYPE_Q4_K_M || ft == QUANT_FTYPE_Q5_K_M) && use_more_bits(i, n))
            t = DTYPE_Q6_K;
        else if (ft == QUANT_FTYPE_Q4_K_S && i < n / 8)
            t = DTYPE_Q5_K;
        m->i_ffn_down++;
    }
    return t;
}

int quant_mix_type(struct quant_mix *m, const char *name, int n_dims, int64_t ne0, enum dtype cur)
{
    /* llama.cpp keeps norms and the experts' router (ffn_gate_inp) as they are. */
    if (!ends_with(name, "weight") || n_dims < 2 || strstr(name, "_norm.weight") ||
        strstr(name, "ffn_gate_inp.weight"))
        return (int)cur;
    enum dtype t = m->base;
    if (!dtype_get_traits(t)->is_quantized) return (int)t;
    t = mixed_type(m, name, ne0);
    if (ne0 % dtype_block_size(t) != 0) {
        switch (t) {
        case DTYPE_Q4_K:
            t = DTYPE_Q5_0;
            break;
        case DTYPE_Q5_K:
            t = DTYPE_Q5_1;
            break;
        case DTYPE_Q6_K:
            t = DTYPE_Q8_0;
            break;
        default:
            return -1;
        }
        if (ne0 % dtype_block_size(t) != 0) t = DTYPE_F16;
    }
    return (int)t;
}
