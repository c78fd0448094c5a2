/* weighted — f32 rows to the K-quants and the 32-element block types with an importance matrix (the
 * from_f32_w entries of quant/dtype.c's table).
 *
 * Byte for byte what llama-quantize writes when it is given an importance matrix (ggml-quants.c's
 * quantize_q*_K / quantize_q4_0 ... with quant_weights: their _impl paths). qw holds one weight per column of
 * the row (the matrix's mean squared activation of that input); each element's fit weight is
 * qw * sqrt(sigma2 + x^2), sigma2 being the mean x^2 of the super-block (times 2 for Q3_K..Q5_K) or, for the
 * 32-element types, of the whole row. Q6_K weighs by qw alone.
 *
 * Q2_K, Q4_K, Q5_K, Q4_1, Q5_1: each sub-block gets an affine fit x ~ scale * l - min (fit_affine_w: the
 *   min/max grid, then 37 grid scales (nmax - 0.9 + 0.05 i) / (max - min), keeping the weighted least-squares
 *   fit of smallest weighted squared error). The K types then quantize their sub-block scales and mins to
 *   4 or 6 bits by quant_fit_positive_w (nearest levels against the largest, 8 nearby scales tried, then
 * single levels moved while the weighted fit improves; weights: each sub-block's summed element weights), and
 *   re-quantize every element with the rounded values.
 * Q3_K, Q6_K, Q4_0, Q5_0: symmetric fits by fit_symmetric_w (the largest magnitude maps to -nmax, then 18
 *   nearby scales, keeping the best weighted least-squares one); Q3_K fits its 16 scales the same way
 *   (6 bits, weighted by the sub-blocks' summed weights).
 * Rounding is nearest_int(); every f32 expression keeps ggml's order of operations (the library is built
 * with -ffp-contract=off).
 */
#include <math.h>
#include <string.h>

#include "quant/blocks.h"
#include "quant/fp16.h"
#include "quant/rounding.h"
#include "quant/rows.h"

/* ---- fits --------------------------------------------------------------------------------------------- */

/* Codes L[i] = l + nmax, l in [-nmax, nmax - 1], of x (n) with weights w; returns the scale (x ~ scale * l),
 * 0 for an all-zero group (ggml's make_qx_quants, rmse_type 1, with weights). */
static float fit_symmetric_w(int n, int nmax, const float *x, int8_t *L, const float *w)
{
    float max = 0, amax = 0;
    for (int i = 0; i < n; i++) {
        const float ax = fabsf(x[i]);
        if (ax > amax) amax = ax, max = x[i];
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
        sumlx += w[i] * x[i] * (float)l;
        suml2 += w[i] * (float)l * (float)l;
    }
    float scale = suml2 != 0.0f ? sumlx / suml2 : 0.0f;
    float best = scale * sumlx;
    for (int is = -9; is <= 9; is++) {
        if (is == 0) continue;
        iscale = -((float)nmax + 0.1f * (float)is) / max;
        sumlx = suml2 = 0;
        for (int i = 0; i < n; i++) {
            const int l = clamp_int(nearest_int(iscale * x[i]), -nmax, nmax - 1);
            sumlx += w[i] * x[i] * (float)l;
            suml2 += w[i] * (float)l * (float)l;
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

/* Codes L in [0, nmax] of x (n <= 32) with weights w for x ~ scale * L - *min_out (ggml's make_qkx3_quants:
 * rmin -0.9, rdelta 0.05, 36 steps, squared error); returns the scale. */
static float fit_affine_w(int n, int nmax, const float *x, const float *w, uint8_t *L, float *min_out)
{
    float min = x[0], max = x[0], sum_w = w[0], sum_x = sum_w * x[0];
    for (int i = 1; i < n; i++) {
        if (x[i] < min) min = x[i];
        if (x[i] > max) max = x[i];
        sum_w += w[i];
        sum_x += w[i] * x[i];
    }
    if (min > 0) min = 0;
    if (max <= min) {
        memset(L, 0, (size_t)n);
        *min_out = -min;
        return 0.0f;
    }
    float iscale = (float)nmax / (max - min), scale = 1 / iscale, best = 0;
    for (int i = 0; i < n; i++) {
        L[i] = (uint8_t)clamp_int(nearest_int(iscale * (x[i] - min)), 0, nmax);
        const float diff = scale * (float)L[i] + min - x[i];
        best += w[i] * (diff * diff);
    }
    for (int is = 0; is <= 36; is++) {
        iscale = (-0.9f + 0.05f * (float)is + (float)nmax) / (max - min);
        float sum_l = 0, sum_l2 = 0, sum_xl = 0;
        uint8_t aux[32];
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
        if (err < best) {
            memcpy(L, aux, (size_t)n);
            best = err;
            scale = this_scale;
            min = this_min;
        }
    }
    *min_out = -min;
    return scale;
}

/* Levels L in [0, nmax] of non-negative x (n <= 16) with weights w; returns the scale (ggml's
 * make_qp_quants). Levels are stored through uint8_t as there. */
float quant_fit_positive_w(int n, int nmax, const float *x, uint8_t *L, const float *w)
{
    float max = 0;
    for (int i = 0; i < n; i++) max = max > x[i] ? max : x[i];
    if (max < GROUP_MAX_EPS) {
        memset(L, 0, (size_t)n);
        return 0.0f;
    }
    float iscale = (float)nmax / max;
    for (int i = 0; i < n; i++) L[i] = (uint8_t)nearest_int(iscale * x[i]);
    const float scale0 = 1 / iscale;
    float best = 0;
    for (int i = 0; i < n; i++) {
        const float diff = x[i] - scale0 * (float)L[i];
        best += w[i] * diff * diff;
    }
    for (int is = -4; is <= 4; is++) {
        if (is == 0) continue;
        const float iscale_is = (0.1f * (float)is + (float)nmax) / max, scale_is = 1 / iscale_is;
        float mse = 0;
        for (int i = 0; i < n; i++) {
            int l = nearest_int(iscale_is * x[i]);
            l = l < nmax ? l : nmax;
            const float diff = x[i] - scale_is * (float)l;
            mse += w[i] * diff * diff;
        }
        if (mse < best) best = mse, iscale = iscale_is;
    }
    float sumlx = 0, suml2 = 0;
    for (int i = 0; i < n; i++) {
        int l = nearest_int(iscale * x[i]);
        l = l < nmax ? l : nmax;
        L[i] = (uint8_t)l;
        sumlx += w[i] * x[i] * (float)l;
        suml2 += w[i] * (float)l * (float)l;
    }
    for (int itry = 0; itry < 5; itry++) {
        int n_changed = 0;
        for (int i = 0; i < n; i++) {
            float slx = sumlx - w[i] * x[i] * (float)L[i];
            float sl2 = suml2 - w[i] * (float)L[i] * (float)L[i];
            if (!(slx > 0 && sl2 > 0)) continue;
            int nl = nearest_int(x[i] * sl2 / slx);
            nl = nl < nmax ? nl : nmax;
            if (nl == L[i]) continue;
            slx += w[i] * x[i] * (float)nl;
            sl2 += w[i] * (float)nl * (float)nl;
            if (slx * slx * suml2 > sumlx * sumlx * sl2) {
                L[i] = (uint8_t)nl, sumlx = slx, suml2 = sl2;
                n_changed++;
            }
        }
        if (!n_changed) break;
    }
    return suml2 > 0.0f ? sumlx / suml2 : 0.0f;
}

/* Sum of x^2 over n elements, in order. */
static float sum_sq(const float *x, int64_t n)
{
    float s = 0;
    for (int64_t j = 0; j < n; j++) s += x[j] * x[j];
    return s;
}

/* w[i] = qw[i] * sqrt(sigma2 + x[i]^2) for n elements; returns their sum. */
static float element_weights(const float *x, const float *qw, float sigma2, int n, float *w)
{
    float sw = 0;
    for (int i = 0; i < n; i++) w[i] = qw[i] * sqrtf(sigma2 + x[i] * x[i]);
    for (int i = 0; i < n; i++) sw += w[i];
    return sw;
}

/* ---- K-quants ----------------------------------------------------------------------------------------- */

void row_q2_k_from_f32_w(const float *x, void *dst, int64_t n, const float *qw)
{
    struct block_q2_k *b = dst;
    for (int64_t i = 0; i < n / QK_K; i++, x += QK_K, qw += QK_K) {
        uint8_t L[QK_K], Ls[16], Lm[16];
        float scales[16], mins[16], sw[16], w[16];
        const float sigma2 = sum_sq(x, QK_K) / QK_K;
        for (int j = 0; j < 16; j++) {
            sw[j] = element_weights(x + 16 * j, qw + 16 * j, sigma2, 16, w);
            scales[j] = fit_affine_w(16, 3, x + 16 * j, w, L + 16 * j, &mins[j]);
        }
        b[i].d = f32_to_f16(quant_fit_positive_w(16, 15, scales, Ls, sw));
        b[i].dmin = f32_to_f16(quant_fit_positive_w(16, 15, mins, Lm, sw));
        for (int j = 0; j < 16; j++) b[i].scales[j] = (uint8_t)(Ls[j] | Lm[j] << 4);
        const float d = f16_to_f32(b[i].d), dmin = f16_to_f32(b[i].dmin);
        for (int j = 0; j < 16; j++) {
            const float ds = d * (float)(b[i].scales[j] & 15);
            if (ds == 0.0f) continue;
            const float dm = dmin * (float)(b[i].scales[j] >> 4);
            for (int l = 0; l < 16; l++)
                L[16 * j + l] = (uint8_t)clamp_int(nearest_int((x[16 * j + l] + dm) / ds), 0, 3);
        }
        kquant_pack_2bit(L, b[i].qs);
    }
}

void row_q3_k_from_f32_w(const float *x, void *dst, int64_t n, const float *qw)
{
    struct block_q3_k *b = dst;
    for (int64_t i = 0; i < n / QK_K; i++, x += QK_K, qw += QK_K) {
        int8_t L[QK_K], Ls[16];
        float scales[16], sw[16], w[16];
        const float sigma2 = 2 * sum_sq(x, QK_K) / QK_K;
        for (int j = 0; j < 16; j++) {
            sw[j] = element_weights(x + 16 * j, qw + 16 * j, sigma2, 16, w);
            scales[j] = fit_symmetric_w(16, 4, x + 16 * j, L + 16 * j, w);
        }
        const float d_block = fit_symmetric_w(16, 32, scales, Ls, sw);
        memset(b[i].scales, 0, sizeof b[i].scales);
        for (int j = 0; j < 16; j++) {
            const int l = Ls[j];
            b[i].scales[j % 8] |= (uint8_t)((l & 15) << (4 * (j / 8)));
            b[i].scales[8 + j % 4] |= (uint8_t)((l >> 4) << (2 * (j / 4)));
        }
        b[i].d = f32_to_f16(d_block);
        kquant_q3_k_finish(x, (uint8_t *)L, &b[i]);
    }
}

/* Q4_K and Q5_K: codes L (256, in [0, nmax]) and the block's d, dmin and 6-bit scales and mins. */
static void affine_block_w(const float *x, const float *qw, int nmax, uint8_t L[QK_K], uint16_t *d_out,
                           uint16_t *dmin_out, uint8_t scales[K_SCALE_SIZE])
{
    uint8_t Ls[8], Lm[8];
    float sw[8], mins[8], sc[8], w[32];
    const float sigma2 = 2 * sum_sq(x, QK_K) / QK_K;
    for (int j = 0; j < 8; j++) {
        sw[j] = element_weights(x + 32 * j, qw + 32 * j, sigma2, 32, w);
        sc[j] = fit_affine_w(32, nmax, x + 32 * j, w, L + 32 * j, &mins[j]);
    }
    const float d_block = quant_fit_positive_w(8, 63, sc, Ls, sw);
    const float m_block = quant_fit_positive_w(8, 63, mins, Lm, sw);
    if (nmax == 31) /* Q5_K clamps the levels; Q4_K's cannot exceed 63 */
        for (int j = 0; j < 8; j++) {
            Ls[j] = Ls[j] < 63 ? Ls[j] : 63;
            Lm[j] = Lm[j] < 63 ? Lm[j] : 63;
        }
    kquant_pack_scales_mins(Ls, Lm, scales);
    *d_out = f32_to_f16(d_block);
    *dmin_out = f32_to_f16(m_block);
    kquant_affine_requantize(x, nmax, *d_out, *dmin_out, scales, L);
}

void row_q4_k_from_f32_w(const float *x, void *dst, int64_t n, const float *qw)
{
    struct block_q4_k *b = dst;
    for (int64_t i = 0; i < n / QK_K; i++, x += QK_K, qw += QK_K) {
        uint8_t L[QK_K];
        affine_block_w(x, qw, 15, L, &b[i].d, &b[i].dmin, b[i].scales);
        kquant_pack_q4_k(L, b[i].qs);
    }
}

void row_q5_k_from_f32_w(const float *x, void *dst, int64_t n, const float *qw)
{
    struct block_q5_k *b = dst;
    for (int64_t i = 0; i < n / QK_K; i++, x += QK_K, qw += QK_K) {
        uint8_t L[QK_K];
        affine_block_w(x, qw, 31, L, &b[i].d, &b[i].dmin, b[i].scales);
        kquant_pack_q5_k(L, b[i].qs, b[i].qh);
    }
}

void row_q6_k_from_f32_w(const float *x, void *dst, int64_t n, const float *qw)
{
    struct block_q6_k *b = dst;
    for (int64_t i = 0; i < n / QK_K; i++, x += QK_K, qw += QK_K) {
        int8_t L[QK_K];
        float scales[16];
        for (int j = 0; j < 16; j++) scales[j] = fit_symmetric_w(16, 32, x + 16 * j, L + 16 * j, qw + 16 * j);
        kquant_q6_k_finish(x, scales, L, &b[i]);
    }
}

/* ---- 32-element types --------------------------------------------------------------------------------- */

void row_q4_0_from_f32_w(const float *x, void *dst, int64_t n, const float *qw)
{
    struct block_q4_0 *b = dst;
    const float sigma2 = sum_sq(x, n) / (float)n;
    for (int64_t i = 0; i < n / QK4_0; i++, x += QK4_0, qw += QK4_0) {
        float w[QK4_0];
        int8_t L[QK4_0];
        element_weights(x, qw, sigma2, QK4_0, w);
        b[i].d = f32_to_f16(fit_symmetric_w(QK4_0, 8, x, L, w));
        for (int j = 0; j < 16; j++) b[i].qs[j] = (uint8_t)(L[j] | L[j + 16] << 4);
    }
}

void row_q5_0_from_f32_w(const float *x, void *dst, int64_t n, const float *qw)
{
    struct block_q5_0 *b = dst;
    const float sigma2 = sum_sq(x, n) / (float)n;
    for (int64_t i = 0; i < n / QK5_0; i++, x += QK5_0, qw += QK5_0) {
        float w[QK5_0];
        int8_t L[QK5_0];
        element_weights(x, qw, sigma2, QK5_0, w);
        b[i].d = f32_to_f16(fit_symmetric_w(QK5_0, 16, x, L, w));
        quant_pack_q5((const uint8_t *)L, b[i].qs, b[i].qh);
    }
}

void row_q4_1_from_f32_w(const float *x, void *dst, int64_t n, const float *qw)
{
    struct block_q4_1 *b = dst;
    const float sigma2 = sum_sq(x, n) / (float)n;
    for (int64_t i = 0; i < n / QK4_1; i++, x += QK4_1, qw += QK4_1) {
        float w[QK4_1], min;
        uint8_t L[QK4_1];
        element_weights(x, qw, sigma2, QK4_1, w);
        b[i].d = f32_to_f16(fit_affine_w(QK4_1, 15, x, w, L, &min));
        b[i].m = f32_to_f16(-min);
        for (int j = 0; j < 16; j++) b[i].qs[j] = (uint8_t)(L[j] | L[j + 16] << 4);
    }
}

void row_q5_1_from_f32_w(const float *x, void *dst, int64_t n, const float *qw)
{
    struct block_q5_1 *b = dst;
    const float sigma2 = sum_sq(x, n) / (float)n;
    for (int64_t i = 0; i < n / QK5_1; i++, x += QK5_1, qw += QK5_1) {
        float w[QK5_1], min;
        uint8_t L[QK5_1];
        element_weights(x, qw, sigma2, QK5_1, w);
        b[i].d = f32_to_f16(fit_affine_w(QK5_1, 31, x, w, L, &min));
        b[i].m = f32_to_f16(-min);
        quant_pack_q5(L, b[i].qs, b[i].qh);
    }
}
