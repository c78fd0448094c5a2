/* dtype — the table of element types (see dtype.h); the conversions it points to are in dequant.c,
 * quantize.c and kquant.c. */
#include "quant/dtype.h"

#include <strings.h>

#include "quant/blocks.h"
#include "quant/rows.h"

#define PLAIN(t, nm, bytes, self)                                                                            \
    {                                                                                                        \
        .name = nm, .block_size = 1, .type_size = bytes, .is_quantized = false, .to_f32 = row_##t##_to_f32,  \
        .from_f32 = row_##t##_from_f32, .device_form = self                                                  \
    }
#define BLOCKS(t, nm, bs, blk, dev)                                                                          \
    {                                                                                                        \
        .name = nm, .block_size = bs, .type_size = sizeof(struct blk), .is_quantized = true,                 \
        .to_f32 = row_##t##_to_f32, .from_f32 = row_##t##_from_f32, .device_form = dev                       \
    }
/* A block type whose quantizer takes an importance matrix. */
#define WEIGHTED(t, nm, bs, blk, dev)                                                                        \
    {                                                                                                        \
        .name = nm, .block_size = bs, .type_size = sizeof(struct blk), .is_quantized = true,                 \
        .to_f32 = row_##t##_to_f32, .from_f32 = row_##t##_from_f32, .from_f32_w = row_##t##_from_f32_w,      \
        .device_form = dev                                                                                   \
    }

/* A type ferry writes only with an importance matrix (llama-quantize requires one for it). */
#define WEIGHTED_ONLY(t, nm, bs, blk)                                                                        \
    {                                                                                                        \
        .name = nm, .block_size = bs, .type_size = sizeof(struct blk), .is_quantized = true,                 \
        .to_f32 = row_##t##_to_f32, .from_f32_w = row_##t##_from_f32_w, .device_form = DTYPE_Q8_0            \
    }
/* A type ferry reads but does not write. */
#define READ_ONLY(t, nm, bs, blk)                                                                            \
    {                                                                                                        \
        .name = nm, .block_size = bs, .type_size = sizeof(struct blk), .is_quantized = true,                 \
        .to_f32 = row_##t##_to_f32, .from_f32 = NULL, .device_form = DTYPE_Q8_0                              \
    }

static const struct dtype_traits dtype_table[DTYPE_COUNT] = {
    [DTYPE_F32] = PLAIN(f32, "F32", 4, DTYPE_F32),
    [DTYPE_F16] = PLAIN(f16, "F16", 2, DTYPE_F16),
    [DTYPE_BF16] = PLAIN(bf16, "BF16", 2, DTYPE_BF16),
    [DTYPE_Q8_0] = BLOCKS(q8_0, "Q8_0", QK8_0, block_q8_0, DTYPE_Q8_0),
    [DTYPE_Q4_0] = WEIGHTED(q4_0, "Q4_0", QK4_0, block_q4_0, DTYPE_Q8_0),
    [DTYPE_Q4_1] = WEIGHTED(q4_1, "Q4_1", QK4_1, block_q4_1, DTYPE_Q8_0),
    [DTYPE_Q5_0] = WEIGHTED(q5_0, "Q5_0", QK5_0, block_q5_0, DTYPE_Q8_0),
    [DTYPE_Q5_1] = WEIGHTED(q5_1, "Q5_1", QK5_1, block_q5_1, DTYPE_Q8_0),
    [DTYPE_Q4_K] = WEIGHTED(q4_k, "Q4_K", QK_K, block_q4_k, DTYPE_Q8_0),
    [DTYPE_Q5_K] = WEIGHTED(q5_k, "Q5_K", QK_K, block_q5_k, DTYPE_Q8_0),
    [DTYPE_Q6_K] = WEIGHTED(q6_k, "Q6_K", QK_K, block_q6_k, DTYPE_Q8_0),
    [DTYPE_Q2_K] = WEIGHTED(q2_k, "Q2_K", QK_K, block_q2_k, DTYPE_Q8_0),
    [DTYPE_Q3_K] = WEIGHTED(q3_k, "Q3_K", QK_K, block_q3_k, DTYPE_Q8_0),
    [DTYPE_IQ4_NL] = WEIGHTED(iq4_nl, "IQ4_NL", QK4_NL, block_iq4_nl, DTYPE_Q8_0),
    [DTYPE_IQ4_XS] = WEIGHTED(iq4_xs, "IQ4_XS", QK_K, block_iq4_xs, DTYPE_Q8_0),
    [DTYPE_MXFP4] = BLOCKS(mxfp4, "MXFP4", QK_MXFP4, block_mxfp4, DTYPE_Q8_0),
    [DTYPE_NVFP4] = READ_ONLY(nvfp4, "NVFP4", QK_NVFP4, block_nvfp4),
    [DTYPE_IQ2_XXS] = WEIGHTED_ONLY(iq2_xxs, "IQ2_XXS", QK_K, block_iq2_xxs),
    [DTYPE_IQ2_XS] = WEIGHTED_ONLY(iq2_xs, "IQ2_XS", QK_K, block_iq2_xs),
    [DTYPE_IQ2_S] = WEIGHTED_ONLY(iq2_s, "IQ2_S", QK_K, block_iq2_s),
    [DTYPE_IQ3_XXS] = WEIGHTED_ONLY(iq3_xxs, "IQ3_XXS", QK_K, block_iq3_xxs),
    [DTYPE_IQ3_S] = WEIGHTED(iq3_s, "IQ3_S", QK_K, block_iq3_s, DTYPE_Q8_0),
    [DTYPE_IQ1_S] = WEIGHTED_ONLY(iq1_s, "IQ1_S", QK_K, block_iq1_s),
    [DTYPE_IQ1_M] = WEIGHTED_ONLY(iq1_m, "IQ1_M", QK_K, block_iq1_m),
};

const struct dtype_traits *dtype_get_traits(uint32_t t)
{
    if (t >= DTYPE_COUNT || !dtype_table[t].name) return NULL;
    return &dtype_table[t];
}

int dtype_valid(uint32_t t)
{
    return dtype_get_traits(t) != NULL;
}

const char *dtype_name(enum dtype t)
{
    return dtype_valid(t) ? dtype_table[t].name : "?";
}

int dtype_from_name(const char *name)
{
    for (int t = 0; t < DTYPE_COUNT; t++)
        if (dtype_table[t].name && name && !strcasecmp(name, dtype_table[t].name)) return t;
    return -1;
}

int dtype_block_size(enum dtype t)
{
    return dtype_valid(t) ? dtype_table[t].block_size : 0;
}

size_t dtype_type_size(enum dtype t)
{
    return dtype_valid(t) ? dtype_table[t].type_size : 0;
}

size_t dtype_row_size(enum dtype t, int64_t n)
{
    if (!dtype_valid(t) || n < 0 || n % dtype_table[t].block_size) return 0;
    return (size_t)(n / dtype_table[t].block_size) * dtype_table[t].type_size;
}

static bool row_ok(enum dtype t, const void *src, const void *dst, int64_t n)
{
    return dtype_valid(t) && src && dst && n >= 0 && n % dtype_table[t].block_size == 0;
}

bool dtype_to_f32(enum dtype t, const void *src, float *dst, int64_t n)
{
    if (!row_ok(t, src, dst, n)) return false;
    dtype_table[t].to_f32(src, dst, n);
    return true;
}

bool dtype_from_f32(enum dtype t, const float *src, void *dst, int64_t n)
{
    if (!row_ok(t, src, dst, n) || !dtype_table[t].from_f32) return false;
    dtype_table[t].from_f32(src, dst, n);
    return true;
}

bool dtype_from_f32_w(enum dtype t, const float *src, void *dst, int64_t n, const float *qw)
{
    if (!row_ok(t, src, dst, n)) return false;
    const struct dtype_traits *tt = &dtype_table[t];
    if (qw && tt->from_f32_w) {
        tt->from_f32_w(src, dst, n, qw);
        return true;
    }
    if (!tt->from_f32) return false;
    tt->from_f32(src, dst, n);
    return true;
}
