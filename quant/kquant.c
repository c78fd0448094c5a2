/* kquant — f32 rows to ggml's K-quants Q4_K, Q5_K and Q6_K (the from_f32 entries of quant/dtype.c's table).
 *
 * Byte for byte ggml's reference quantizers (quantize_row_q{4,5,6}_K_ref in ggml-quants.c, which
 * llama-quantize runs when it has no importance matrix); tests/weights/test_quantize_llama.c checks them
 * against llama-quantize's output. The algorithms, per 256-element super-block (layouts in quant/dequant.c):
 *
 * Q4_K / Q5_K (nmax = 15 / 31): each sub-block of 32 gets an affine fit x ~ scale * l - min, l in [0, nmax],
 *   by fit_affine(): weights w = sqrt(mean(x^2)) + |x|; start from the plain min/max grid, then try nstep + 1
 *   grid scales (nmax + rmin + rdelta * i) / (max - min) and keep the weighted least-squares (scale, min) of
 *   the grid with the smallest weighted squared error (Q4_K: rmin -1, rdelta 0.1, 20 steps; Q5_K: -0.5, 0.1,
 *   15). The eight scales and eight mins are then quantized to 6 bits against their largest values (d =
 *   max_scale / 63, dmin = max_min / 63, both f16), and every element is re-quantized with the rounded
 *   sub-block scale: l = nearest((x + dmin * m) / (d * sc)).
 * Q6_K: each sub-block of 16 gets a symmetric fit by fit_symmetric() (codes in [-32, 31]: the largest
 *   magnitude maps to -32, then 18 nearby scales are tried, keeping the best x^2-weighted least-squares one);
 *   the 16 scales become int8 against the one of largest magnitude (d = that scale / -128, f16), and the
 *   elements are re-quantized with the rounded scales.
 *
 * Rounding is nearest_int(): ggml's trick of adding 1.5 * 2^23 and reading the mantissa, i.e. round half to
 * even for |v| < 2^22, and the same wrapped value beyond (which ggml then clamps), so even degenerate inputs
 * give ggml's bytes. Every f32 expression keeps ggml's order of operations; the library is compiled with
 * -ffp-contract=off (ggml-base is built for x86-64 without FMA), so each operation rounds as it does there.
 */
#include <math.h>
#include <string.h>

#include "quant/blocks.h"
#include "quant/fp16.h"
#include "quant/rows.h"

/* Below this largest magnitude a group counts as all zero (ggml's GROUP_MAX_EPS). */
#define GROUP_MAX_EPS 1e-15f

static inline int nearest_int(float v)
{
    const float t = v + 12582912.0f; /* 1.5 * 2^23: the integer lands in the low mantissa bits */
    int32_t i;
    memcpy(&i, &t, sizeof i);
    return (i & 0x007fffff) - 0x00400000;
}

static inline int clamp_int(int v, int lo, int hi)
{
    return v < lo ? lo : v > hi ? hi : v;
}

/* Weighted affine fit of x[0..n) to scale * L - min with L in [0, nmax] (ggml's make_qkx2_quants with a
 * squared error). Writes the codes to L (aux: n bytes of scratch), the offset to *min_out (>= 0, subtracted)
 * and returns the scale. */
static float fit_affine(int n, int nmax, const float *x, const float *w, uint8_t *L, float *min_out,
                        uint8_t *aux, float rmin, float rdelta, int nstep)
{
    float min = x[0], max = x[0];
    float sum_w = w[0];
    float sum_x = sum_w * x[0];
    for (int i = 1; i < n; i++) {
        if (x[i] < min) min = x[i];
        if (x[i] > max) max = x[i];
        sum_w += w[i];
        sum_x += w[i] * x[i];
    }
    if (min > 0) min = 0;
    if (max == min) {
        memset(L, 0, (size_t)n);
        *min_out = -min;
        return 0.0f;
    }
    float iscale = (float)nmax / (max - min);
    float scale = 1 / iscale;
    float best_err = 0;
    for (int i = 0; i < n; i++) {
        L[i] = (uint8_t)clamp_int(nearest_int(iscale * (x[i] - min)), 0, nmax);
        const float diff = scale * (float)L[i] + min - x[i];
        best_err += w[i] * (diff * diff);
    }
    for (int is = 0; is <= nstep; is++) {
        iscale = (rmin + rdelta * (float)is + (float)nmax) / (max - min);
        float sum_l = 0, sum_l2 = 0, sum_xl = 0;
        for (int i = 0; i < n; i++) {
            const int l = clamp_int(nearest_int(iscale * (x[i] - min)), 0, nmax);
            aux[i] = (uint8_t)l;
            sum_l += w[i] * (float)l;
            sum_l2 += w[i] * (float)l * (float)l;
            sum_xl += w[i] * (float)l * x[i];
        }
        const float D = sum_w * sum_l2 - sum_l * sum_l;
        if (!(D > 0)) continue;
        float this_scale = (sum_w * sum_xl - sum_x * sum_l) / D;
        float this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D;
        if (this_min > 0) {
            this_min = 0;
            this_scale = sum_xl / sum_l2;
        }
        float err = 0;
        for (int i = 0; i < n; i++) {
            const float diff = this_scale * (float)aux[i] + this_min - x[i];
            err += w[i] * (diff * diff);
        }
        if (err < best_err) {
            memcpy(L, aux, (size_t)n);
            best_err = err;
            scale = this_scale;
            min = this_min;
        }
    }
    *min_out = -min;
    return scale;
}

/* The packed 6-bit scales and mins of a Q4_K/Q5_K block (the inverse of block_q4_k_scale_min). */
static void pack_scales_mins(const uint8_t sc[8], const uint8_t mn[8], uint8_t s[K_SCALE_SIZE])
{
    for (int j = 0; j < 8; j++) {
        if (j < 4) {
            s[j] = sc[j];
            s[j + 4] = mn[j];
        } else {
            s[j + 4] = (uint8_t)((sc[j] & 15) | (mn[j] & 15) << 4);
            s[j - 4] |= (uint8_t)(sc[j] >> 4 << 6);
            s[j] |= (uint8_t)(mn[j] >> 4 << 6);
        }
    }
}

/* The shared part of Q4_K and Q5_K: codes L (256, in [0, nmax]) and the block's d, dmin and scales. */
static void quantize_affine_block(const float *x, int nmax, float rmin, int nstep, uint8_t L[QK_K],
                                  uint16_t *d_out, uint16_t *dmin_out, uint8_t scales[K_SCALE_SIZE])
{
    float sub_scale[8], sub_min[8], w[32];
    uint8_t aux[32];
    float max_scale = 0, max_min = 0;
    for (int j = 0; j < 8; j++) {
        const float *xs = x + 32 * j;
        float sum_x2 = 0;
        for (int l = 0; l < 32; l++) sum_x2 += xs[l] * xs[l];
        const float av_x = sqrtf(sum_x2 / 32);
        for (int l = 0; l < 32; l++) w[l] = av_x + fabsf(xs[l]);
        sub_scale[j] = fit_affine(32, nmax, xs, w, L + 32 * j, &sub_min[j], aux, rmin, 0.1f, nstep);
        if (sub_scale[j] > max_scale) max_scale = sub_scale[j];
        if (sub_min[j] > max_min) max_min = sub_min[j];
    }
    const float inv_scale = max_scale > 0 ? 63.0f / max_scale : 0.0f;
    const float inv_min = max_min > 0 ? 63.0f / max_min : 0.0f;
    uint8_t sc[8], mn[8];
    for (int j = 0; j < 8; j++) {
        /* Through uint8_t first, as ggml does: a negative fit wraps and then clamps to 63. */
        const uint8_t ls = (uint8_t)nearest_int(inv_scale * sub_scale[j]);
        const uint8_t lm = (uint8_t)nearest_int(inv_min * sub_min[j]);
        sc[j] = ls < 63 ? ls : 63;
        mn[j] = lm < 63 ? lm : 63;
    }
    pack_scales_mins(sc, mn, scales);
    *d_out = f32_to_f16(max_scale / 63.0f);
    *dmin_out = f32_to_f16(max_min / 63.0f);
    const float d = f16_to_f32(*d_out), dmin = f16_to_f32(*dmin_out);
    for (int j = 0; j < 8; j++) {
        uint8_t s, m;
        block_q4_k_scale_min(j, scales, &s, &m);
        const float ds = d * (float)s;
        if (ds == 0.0f) continue; /* the fit's codes stay */
        const float dm = dmin * (float)m;
        for (int l = 0; l < 32; l++)
            L[32 * j + l] = (uint8_t)clamp_int(nearest_int((x[32 * j + l] + dm) / ds), 0, nmax);
    }
}

void row_q4_k_from_f32(const float *x, void *dst, int64_t n)
{
    struct block_q4_k *b = dst;
    for (int64_t i = 0; i < n / QK_K; i++, x += QK_K) {
        uint8_t L[QK_K];
        quantize_affine_block(x, 15, -1.0f, 20, L, &b[i].d, &b[i].dmin, b[i].scales);
        /* Sub-blocks 2p and 2p+1 share 32 bytes: low nibbles, then high nibbles. */
        for (int p = 0; p < 4; p++)
            for (int l = 0; l < 32; l++)
                b[i].qs[32 * p + l] = (uint8_t)(L[64 * p + l] | L[64 * p + 32 + l] << 4);
    }
}

void row_q5_k_from_f32(const float *x, void *dst, int64_t n)
{
    struct block_q5_k *b = dst;
    for (int64_t i = 0; i < n / QK_K; i++, x += QK_K) {
        uint8_t L[QK_K];
        quantize_affine_block(x, 31, -0.5f, 15, L, &b[i].d, &b[i].dmin, b[i].scales);
        /* As Q4_K, and the fifth bit of element 32s + l (sub-block s) is bit s of qh[l]. */
        memset(b[i].qh, 0, sizeof b[i].qh);
        for (int p = 0; p < 4; p++)
            for (int l = 0; l < 32; l++) {
                const uint8_t lo = L[64 * p + l], hi = L[64 * p + 32 + l];
                b[i].qs[32 * p + l] = (uint8_t)((lo & 15) | (hi & 15) << 4);
                b[i].qh[l] |= (uint8_t)((lo >> 4) << (2 * p) | (hi >> 4) << (2 * p + 1));
            }
    }
}

/* Codes of n elements (ggml's make_qx_quants with x^2 weights, rmse_type 1): L[i] = l + nmax for
 * l in [-nmax, nmax - 1]; returns the scale (x ~ scale * l), or 0 for an all-zero group. */
static float fit_symmetric(int n, int nmax, const float *x, int8_t *L)
{
    float max = 0, amax = 0;
    for (int i = 0; i < n; i++) {
        const float ax = fabsf(x[i]);
        if (ax > amax) {
            amax = ax;
            max = x[i];
        }
    }
    if (amax < GROUP_MAX_EPS) {
        memset(L, 0, (size_t)n);
        return 0.0f;
    }
    float iscale = (float)-nmax / max;
    float sumlx = 0, suml2 = 0;
    for (int i = 0; i < n; i++) {
        const int l = clamp_int(nearest_int(iscale * x[i]), -nmax, nmax - 1);
        L[i] = (int8_t)(l + nmax);
        const float w = x[i] * x[i];
        sumlx += w * x[i] * (float)l;
        suml2 += w * (float)l * (float)l;
    }
    float scale = suml2 != 0 ? sumlx / suml2 : 0.0f;
    float best = scale * sumlx;
    for (int is = -9; is <= 9; is++) {
        if (is == 0) continue;
        iscale = -((float)nmax + 0.1f * (float)is) / max;
        sumlx = suml2 = 0;
        for (int i = 0; i < n; i++) {
            const int l = clamp_int(nearest_int(iscale * x[i]), -nmax, nmax - 1);
            const float w = x[i] * x[i];
            sumlx += w * x[i] * (float)l;
            suml2 += w * (float)l * (float)l;
        }
        if (suml2 > 0 && sumlx * sumlx > best * suml2) {
            for (int i = 0; i < n; i++)
                L[i] = (int8_t)(nmax + clamp_int(nearest_int(iscale * x[i]), -nmax, nmax - 1));
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    return scale;
}

void row_q6_k_from_f32(const float *x, void *dst, int64_t n)
{
    struct block_q6_k *b = dst;
    for (int64_t i = 0; i < n / QK_K; i++, x += QK_K) {
        int8_t L[QK_K];
        float scales[QK_K / 16];
        float max_scale = 0, max_abs_scale = 0;
        for (int ib = 0; ib < QK_K / 16; ib++) {
            scales[ib] = fit_symmetric(16, 32, x + 16 * ib, L + 16 * ib);
            if (fabsf(scales[ib]) > max_abs_scale) {
                max_abs_scale = fabsf(scales[ib]);
                max_scale = scales[ib];
            }
        }
        if (max_abs_scale < GROUP_MAX_EPS) {
            memset(&b[i], 0, sizeof b[i]);
            continue;
        }
        const float iscale = -128.0f / max_scale;
        b[i].d = f32_to_f16(1 / iscale);
        for (int ib = 0; ib < QK_K / 16; ib++) {
            const int s = nearest_int(iscale * scales[ib]);
            b[i].scales[ib] = (int8_t)(s < 127 ? s : 127);
        }
        const float d = f16_to_f32(b[i].d);
        for (int j = 0; j < QK_K / 16; j++) {
            const float ds = d * (float)b[i].scales[j];
            if (ds == 0.0f) continue;
            for (int l = 0; l < 16; l++)
                L[16 * j + l] = (int8_t)(clamp_int(nearest_int(x[16 * j + l] / ds), -32, 31) + 32);
        }
        /* Element 128h + 32g + l (g < 4, l < 32): low nibble in ql[64h + l + 32(g & 1)], nibble g >> 1; high
         * two bits at bit 2g of qh[32h + l]. */
        for (int h = 0; h < 2; h++)
            for (int l = 0; l < 32; l++) {
                const uint8_t *q = (const uint8_t *)L + 128 * h + l;
                b[i].ql[64 * h + l] = (uint8_t)((q[0] & 15) | (q[64] & 15) << 4);
                b[i].ql[64 * h + l + 32] = (uint8_t)((q[32] & 15) | (q[96] & 15) << 4);
                b[i].qh[32 * h + l] =
                    (uint8_t)(q[0] >> 4 | (q[32] >> 4) << 2 | (q[64] >> 4) << 4 | (q[96] >> 4) << 6);
            }
    }
}
