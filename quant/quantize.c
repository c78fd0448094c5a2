/* quantize — f32 rows to the plain types and to ggml's 32-element block types (the from_f32 entries of
 * quant/dtype.c's table; the K-quants are in kquant.c).
 *
 * Each block type follows ggml's reference quantizer (quantize_row_*_ref of ggml-quants.c, which
 * llama-quantize uses when it has no importance matrix) step for step, so the bytes are the same
 * (tests/weights/ test_quantize_llama.c checks them against llama-quantize's output): Q8_0: d = amax / 127, q
 * = roundf(x / d) (round half away from zero). Q4_0: the element of largest magnitude, with its sign, maps to
 * -8: d = max / -8, q = min(15, (int8)(x/d + 8.5)) (truncation after adding 8.5). Q5_0: the same with 16
 * levels each side: d = max / -16, q = min(31, (int8)(x/d + 16.5)). Q4_1: d = (max - min) / 15, m = min, q =
 * min(15, (int8)((x - min)/d + 0.5)). Q5_1: d = (max - min) / 31, m = min, q = (uint8)((x - min)/d + 0.5). "x
 * / d" is x * (1/d), with 1/d taken as 0 when d is 0. ggml's MIN/MAX are plain comparisons (a NaN loses or
 * wins exactly as there), and the whole library is compiled with -ffp-contract=off, as ggml-base is built for
 * x86-64 without FMA, so every f32 operation rounds where ggml's does. F16 and BF16 round to nearest even
 * (quant/fp16.h); F32 is a copy.
 */
#include <float.h>
#include <math.h>
#include <string.h>

#include "quant/blocks.h"
#include "quant/fp16.h"
#include "quant/rows.h"

void row_f32_from_f32(const float *src, void *dst, int64_t n)
{
    memmove(dst, src, (size_t)n * sizeof(float));
}

void row_f16_from_f32(const float *src, void *dst, int64_t n)
{
    uint16_t *h = dst;
    for (int64_t i = 0; i < n; i++) h[i] = f32_to_f16(src[i]);
}

void row_bf16_from_f32(const float *src, void *dst, int64_t n)
{
    uint16_t *h = dst;
    for (int64_t i = 0; i < n; i++) h[i] = f32_to_bf16(src[i]);
}

void row_q8_0_from_f32(const float *x, void *dst, int64_t n)
{
    struct block_q8_0 *b = dst;
    for (int64_t i = 0; i < n / QK8_0; i++, x += QK8_0) {
        float amax = 0.0f;
        for (int j = 0; j < QK8_0; j++) {
            const float a = fabsf(x[j]);
            amax = amax > a ? amax : a;
        }
        const float d = amax / 127.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        b[i].d = f32_to_f16(d);
        for (int j = 0; j < QK8_0; j++) b[i].qs[j] = (int8_t)roundf(x[j] * id);
    }
}

/* The value of largest magnitude, with its sign (the first one on ties). */
static float signed_absmax(const float *x, int n)
{
    float amax = 0.0f, max = 0.0f;
    for (int j = 0; j < n; j++)
        if (amax < fabsf(x[j])) {
            amax = fabsf(x[j]);
            max = x[j];
        }
    return max;
}

static inline int min_int(int a, int b)
{
    return a < b ? a : b;
}

void row_q4_0_from_f32(const float *x, void *dst, int64_t n)
{
    struct block_q4_0 *b = dst;
    for (int64_t i = 0; i < n / QK4_0; i++, x += QK4_0) {
        const float d = signed_absmax(x, QK4_0) / -8.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        b[i].d = f32_to_f16(d);
        for (int j = 0; j < QK4_0 / 2; j++) {
            const int q0 = min_int(15, (int8_t)(x[j] * id + 8.5f));
            const int q1 = min_int(15, (int8_t)(x[j + QK4_0 / 2] * id + 8.5f));
            b[i].qs[j] = (uint8_t)((uint8_t)q0 | (uint8_t)q1 << 4);
        }
    }
}

/* min and max of x[0..n), starting from ±FLT_MAX as ggml does. */
static void min_max(const float *x, int n, float *min, float *max)
{
    float lo = FLT_MAX, hi = -FLT_MAX;
    for (int j = 0; j < n; j++) {
        if (x[j] < lo) lo = x[j];
        if (x[j] > hi) hi = x[j];
    }
    *min = lo;
    *max = hi;
}

void row_q4_1_from_f32(const float *x, void *dst, int64_t n)
{
    struct block_q4_1 *b = dst;
    for (int64_t i = 0; i < n / QK4_1; i++, x += QK4_1) {
        float min, max;
        min_max(x, QK4_1, &min, &max);
        const float d = (max - min) / 15.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        b[i].d = f32_to_f16(d);
        b[i].m = f32_to_f16(min);
        for (int j = 0; j < QK4_1 / 2; j++) {
            const int q0 = min_int(15, (int8_t)((x[j] - min) * id + 0.5f));
            const int q1 = min_int(15, (int8_t)((x[j + QK4_1 / 2] - min) * id + 0.5f));
            b[i].qs[j] = (uint8_t)((uint8_t)q0 | (uint8_t)q1 << 4);
        }
    }
}

/* Splits 32 5-bit codes into the low nibbles (qs: element j low, j + 16 high) and the fifth bits (qh). */
void quant_pack_q5(const uint8_t q[32], uint8_t qs[16], uint8_t qh_out[4])
{
    uint32_t qh = 0;
    for (int j = 0; j < 16; j++) {
        qs[j] = (uint8_t)((q[j] & 15) | (q[j + 16] & 15) << 4);
        qh |= (uint32_t)(q[j] >> 4 & 1) << j;
        qh |= (uint32_t)(q[j + 16] >> 4 & 1) << (j + 16);
    }
    memcpy(qh_out, &qh, 4);
}

void row_q5_0_from_f32(const float *x, void *dst, int64_t n)
{
    struct block_q5_0 *b = dst;
    for (int64_t i = 0; i < n / QK5_0; i++, x += QK5_0) {
        const float d = signed_absmax(x, QK5_0) / -16.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        b[i].d = f32_to_f16(d);
        uint8_t q[QK5_0];
        for (int j = 0; j < QK5_0; j++) q[j] = (uint8_t)min_int(31, (int8_t)(x[j] * id + 16.5f));
        quant_pack_q5(q, b[i].qs, b[i].qh);
    }
}

void row_q5_1_from_f32(const float *x, void *dst, int64_t n)
{
    struct block_q5_1 *b = dst;
    for (int64_t i = 0; i < n / QK5_1; i++, x += QK5_1) {
        float min, max;
        min_max(x, QK5_1, &min, &max);
        const float d = (max - min) / 31.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        b[i].d = f32_to_f16(d);
        b[i].m = f32_to_f16(min);
        uint8_t q[QK5_1];
        for (int j = 0; j < QK5_1; j++) q[j] = (uint8_t)((x[j] - min) * id + 0.5f);
        quant_pack_q5(q, b[i].qs, b[i].qh);
    }
}
