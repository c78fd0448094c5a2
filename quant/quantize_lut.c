/* quantize_lut — f32 rows to IQ4_NL, IQ4_XS and MXFP4 (the from_f32 entries of quant/dtype.c's table).
 *
 * Byte for byte what llama-quantize writes without an importance matrix (ggml-quants.c: quantize_iq4_nl and
 * quantize_iq4_xs with no weights, which search 7 scales each way; quantize_mxfp4 = quantize_row_mxfp4_ref);
 * tests/kernels/test_quant.c checks them against llama.cpp's own output (make_iquant_fixtures.py).
 *
 * IQ4_NL / IQ4_XS, per block of 32 (IQ4_XS: the 8 blocks of a super-block): weights w = x^2; the element of
 *   largest magnitude, max, maps to the first table value (d = -max / -127, then each x to the nearest table
 *   value, best_value()), d refit by weighted least squares; then 15 trial scales 1 / d = (t - 127) / max for
 *   t in -7..7, each refit, keeping the one with the largest sumqx^2 / sumq2. IQ4_NL stores that d as f16 and
 *   re-picks every value with it; IQ4_XS quantizes the 8 block scales to 6 bits against d = -max_scale / 32
 *   (f16) and re-picks every value with the rounded block scale.
 * MXFP4: the shared exponent e = floor(log2(max|x|)) - 2 + 127 (0 for an all-zero block), d = 2^(e - 128),
 *   and each x to the nearest fp4_values[i]·d (first of equals).
 * Every f32 expression keeps ggml's order of operations; the library builds with -ffp-contract=off.
 */
#include <math.h>
#include <string.h>

#include "quant/blocks.h"
#include "quant/fp16.h"
#include "quant/iq_tables.h"
#include "quant/rounding.h"
#include "quant/rows.h"

#define IQ4_NTRY 7

/* The index of the table value nearest x (the table ascending; ties to the upper one, as ggml). */
static int best_value(const int8_t *v, int n, float x)
{
    if (x <= v[0]) return 0;
    if (x >= v[n - 1]) return n - 1;
    int lo = 0, hi = n - 1;
    while (hi - lo > 1) {
        const int mid = (lo + hi) / 2;
        if (x < v[mid])
            hi = mid;
        else
            lo = mid;
    }
    return x - v[hi - 1] < v[hi] - x ? hi - 1 : hi;
}

/* The weighted fit of block x (32) for the inverse scale id: sumqx, sumq2 (and the codes into L when given).
 */
static void iq4_fit(const float *x, const float *w, float id, float *sumqx, float *sumq2, uint8_t *L)
{
    float sx = 0, s2 = 0;
    for (int j = 0; j < 32; j++) {
        const int l = best_value(iq4nl_values, 16, id * x[j]);
        if (L) L[j] = (uint8_t)l;
        const float q = iq4nl_values[l];
        sx += w[j] * q * x[j];
        s2 += w[j] * q * q;
    }
    *sumqx = sx, *sumq2 = s2;
}

/* The best scale of block x (32), or 0 for an all-zero block; the codes of the first fit into L. Weights:
 * x^2, or with an importance matrix qw (32) qw * sqrt(sigma2 + x^2). */
static float iq4_block_scale(const float *x, uint8_t *L, const float *qw, float sigma2)
{
    float w[32], amax = 0, max = 0;
    for (int j = 0; j < 32; j++) w[j] = qw ? qw[j] * sqrtf(sigma2 + x[j] * x[j]) : x[j] * x[j];
    for (int j = 0; j < 32; j++) {
        const float ax = fabsf(x[j]);
        if (ax > amax) amax = ax, max = x[j];
    }
    if (amax < GROUP_MAX_EPS) return 0.0f;
    float sumqx, sumq2;
    float d = -max / iq4nl_values[0];
    iq4_fit(x, w, 1 / d, &sumqx, &sumq2, L);
    d = sumq2 > 0 ? sumqx / sumq2 : 0.f;
    float best = d * sumqx;
    for (int itry = -IQ4_NTRY; itry <= IQ4_NTRY; ++itry) {
        iq4_fit(x, w, (itry + iq4nl_values[0]) / max, &sumqx, &sumq2, NULL);
        if (sumq2 > 0 && sumqx * sumqx > best * sumq2) {
            d = sumqx / sumq2;
            best = d * sumqx;
        }
    }
    return d;
}

/* Codes L (32, IQ4_NL layout order) into 16 bytes: element j low nibble, j + 16 high. */
static void iq4_pack(const uint8_t *L, uint8_t *qs)
{
    for (int j = 0; j < 16; j++) qs[j] = (uint8_t)(L[j] | L[16 + j] << 4);
}

/* The sigma2 of a super-block of n: 2 * mean(x^2). */
static float iq4_sigma2(const float *x, int n)
{
    float s = 0;
    for (int j = 0; j < n; j++) s += x[j] * x[j];
    return s * (2.f / (float)n);
}

static void iq4_nl_rows(const float *x, void *dst, int64_t n, const float *qw)
{
    struct block_iq4_nl *b = dst;
    for (int64_t i = 0; i < n / QK4_NL; i++, x += QK4_NL) {
        uint8_t L[32];
        memset(L, 0, sizeof L);
        const float d = iq4_block_scale(x, L, qw ? qw + QK4_NL * i : NULL, qw ? iq4_sigma2(x, QK4_NL) : 0);
        b[i].d = f32_to_f16(d);
        const float id = d != 0.0f ? 1 / d : 0.0f; /* the codes again with the chosen scale */
        for (int j = 0; j < 32; j++) L[j] = (uint8_t)best_value(iq4nl_values, 16, id * x[j]);
        iq4_pack(L, b[i].qs);
    }
}

static void iq4_xs_rows(const float *x, void *dst, int64_t n, const float *qw)
{
    struct block_iq4_xs *b = dst;
    for (int64_t i = 0; i < n / QK_K; i++, x += QK_K) {
        uint8_t L[QK_K];
        float scales[8], max_scale = 0, amax_scale = 0;
        memset(L, 0, sizeof L);
        const float sigma2 = qw ? iq4_sigma2(x, QK_K) : 0;
        for (int ib = 0; ib < 8; ib++) {
            scales[ib] =
                iq4_block_scale(x + 32 * ib, L + 32 * ib, qw ? qw + QK_K * i + 32 * ib : NULL, sigma2);
            if (fabsf(scales[ib]) > amax_scale) amax_scale = fabsf(scales[ib]), max_scale = scales[ib];
        }
        const float d = -max_scale / 32;
        b[i].d = f32_to_f16(d);
        b[i].scales_h = 0;
        const float id = d ? 1 / d : 0.f;
        for (int ib = 0; ib < 8; ib++) {
            int l = nearest_int(id * scales[ib]);
            l = l < -32 ? -32 : l > 31 ? 31 : l;
            const float dl = d * l, idl = dl ? 1 / dl : 0.f;
            for (int j = 0; j < 32; j++)
                L[32 * ib + j] = (uint8_t)best_value(iq4nl_values, 16, idl * x[32 * ib + j]);
            l += 32;
            if (ib % 2 == 0)
                b[i].scales_l[ib / 2] = (uint8_t)(l & 15);
            else
                b[i].scales_l[ib / 2] |= (uint8_t)((l & 15) << 4);
            b[i].scales_h |= (uint16_t)((l >> 4) << (2 * ib));
        }
        for (int ib = 0; ib < 8; ib++) iq4_pack(L + 32 * ib, b[i].qs + 16 * ib);
    }
}

void row_iq4_nl_from_f32(const float *x, void *dst, int64_t n)
{
    iq4_nl_rows(x, dst, n, NULL);
}

void row_iq4_nl_from_f32_w(const float *x, void *dst, int64_t n, const float *qw)
{
    iq4_nl_rows(x, dst, n, qw);
}

void row_iq4_xs_from_f32(const float *x, void *dst, int64_t n)
{
    iq4_xs_rows(x, dst, n, NULL);
}

void row_iq4_xs_from_f32_w(const float *x, void *dst, int64_t n, const float *qw)
{
    iq4_xs_rows(x, dst, n, qw);
}

/* The index of the fp4 value nearest x / d (first of equals). */
static int best_fp4(float x, float d)
{
    int best = 0;
    float best_err = fabsf(fp4_values[0] * d - x);
    for (int i = 1; i < 16; i++) {
        const float err = fabsf(fp4_values[i] * d - x);
        if (err < best_err) best = i, best_err = err;
    }
    return best;
}

void row_mxfp4_from_f32(const float *x, void *dst, int64_t n)
{
    struct block_mxfp4 *b = dst;
    for (int64_t i = 0; i < n / QK_MXFP4; i++, x += QK_MXFP4) {
        float amax = 0.0f;
        for (int j = 0; j < QK_MXFP4; j++)
            if (amax < fabsf(x[j])) amax = fabsf(x[j]);
        /* (through int: ggml's float-to-u8 cast of a negative exponent wraps the same way on x86) */
        b[i].e = amax > 0.0f ? (uint8_t)(int)(floorf(log2f(amax)) - 2 + 127) : 0;
        const float d = block_e8m0_half(b[i].e);
        for (int j = 0; j < QK_MXFP4 / 2; j++)
            b[i].qs[j] = (uint8_t)(best_fp4(x[j], d) | best_fp4(x[j + QK_MXFP4 / 2], d) << 4);
    }
}
