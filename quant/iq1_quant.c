/* iq1_quant — f32 rows to IQ1_S and IQ1_M with an importance matrix (from_f32_w entries of quant/dtype.c's
 * table), byte for byte ggml's quantize_iq1_s / quantize_iq1_m.
 *
 * Both store groups of 8 elements as points of a 2048-point lattice of values -1, 0, 1, shifted by a delta of
 * +-1/8 (so a group's values are v + delta, v - delta), times a sub-block scale. Per sub-block (IQ1_S 32
 * elements, IQ1_M 16): the elements are sorted by value and every split into three runs (levels -1, 0, 1) is
 * scored exactly through prefix sums of w x and w, for each delta sign (IQ1_M: a sign per half); the best
 * split gives the levels and the least-squares scale. A group whose levels are not a lattice point becomes
 * its nearest neighbour (iq_lattice's lists, distances weighted by w at that scale) and the scale is refit.
 * IQ1_S codes the scales in 3 bits against d = max / 15 (f16 of d * 1.125); IQ1_M in 3 bits too, and refits
 * d over the whole super-block with the coded scales (f16 of d * 1.1125, spread over the scales' top
 * nibbles). w = qw * sqrt(sigma2 + x^2), sigma2 = 2 mean(x^2) of the super-block. The sort is stable (glibc's
 * qsort merge-sorts arrays this small), so equal values keep their order.
 */
#include <float.h>
#include <math.h>
#include <stdbool.h>
#include <string.h>

#include "quant/blocks.h"
#include "quant/fp16.h"
#include "quant/iq_lattice.h"
#include "quant/iq_tables.h"
#include "quant/rounding.h"
#include "quant/rows.h"

/* The element order of x (n <= 32) by ascending value, equal values in index order. */
static void sort_index(const float *x, int n, int *idx)
{
    for (int j = 0; j < n; j++) {
        int k = j;
        while (k > 0 && x[idx[k - 1]] > x[j]) {
            idx[k] = idx[k - 1];
            k--;
        }
        idx[k] = j;
    }
}

/* Levels (0, 1, 2 for -1, 0, 1) of the elements from the split: the first i1 sorted elements 0, up to i2 1,
 * the rest 2. */
static void split_levels(const int *idx, int n, int i1, int i2, int8_t *L)
{
    for (int j = 0; j < n; j++) L[idx[j]] = (int8_t)(j < i1 ? 0 : j < i2 ? 1 : 2);
}

/* The neighbour of off-grid pattern u nearest x (8, signed) at scale with values xx[level]: its levels into
 * L, its index returned (ggml's iq1_find_best_neighbour2). */
static int nearest_shifted(const struct iq_lattice *lat, int u, const float *x, const float *w, float scale,
                           const float *xx, int8_t *L)
{
    float best = FLT_MAX;
    int bi = lat->count[u] ? lat->nb[lat->first[u]] : 0;
    for (int j = 0; j < lat->count[u]; j++) {
        const int p = lat->nb[lat->first[u] + j];
        float d2 = 0;
        for (int i = 0; i < 8; i++) {
            const float diff = scale * xx[lat->level[p][i]] - x[i];
            d2 += w[i] * diff * diff;
        }
        if (d2 < best) best = d2, bi = p;
    }
    for (int i = 0; i < 8; i++) L[i] = (int8_t)lat->level[bi][i];
    return bi;
}

/* Group k of L as a grid point: its index into index[k]; false when it had to move to a neighbour. */
static bool group_point(const struct iq_lattice *lat, int8_t *L, int k, const float *xb, const float *w,
                        float scale, const float *xx, uint16_t *index)
{
    int u = 0;
    for (int j = 0; j < 8; j++) u |= L[8 * k + j] << 2 * j;
    if (lat->map[u] >= 0) {
        index[k] = (uint16_t)lat->map[u];
        return true;
    }
    index[k] = (uint16_t)nearest_shifted(lat, u, xb + 8 * k, w + 8 * k, scale, xx, L + 8 * k);
    return false;
}

/* Adds group k's weighted fit with values xx to sumqx, sumq2. */
static void fit_group(const struct iq_lattice *lat, int g, const float *xb, const float *w, const float *xx,
                      float mul, float *sumqx, float *sumq2)
{
    for (int j = 0; j < 8; j++) {
        const float q = mul == 1.0f ? xx[lat->level[g][j]] : xx[lat->level[g][j]] * mul;
        *sumqx += w[j] * q * xb[j];
        *sumq2 += w[j] * q * q;
    }
}

static float sum_sq(const float *x)
{
    float s = 0;
    for (int i = 0; i < QK_K; i++) s += x[i] * x[i];
    return s;
}

static float abs_max(const float *x, int n)
{
    float m = fabsf(x[0]);
    for (int i = 1; i < n; i++) m = m > fabsf(x[i]) ? m : fabsf(x[i]);
    return m;
}

static const float x_p[3] = {-1 + IQ1S_DELTA, IQ1S_DELTA, 1 + IQ1S_DELTA};
static const float x_m[3] = {-1 - IQ1S_DELTA, -IQ1S_DELTA, 1 - IQ1S_DELTA};

/* ---- IQ1_S: sub-blocks of 32, one delta sign each -------------------------------------------------------
 */

void row_iq1_s_from_f32_w(const float *x, void *dst, int64_t n, const float *qw)
{
    const struct iq_lattice *lat = iq_lattice_get(IQ_LATTICE_1S);
    struct block_iq1_s *b = dst;
    for (int64_t ibl = 0; ibl < n / QK_K; ibl++, x += QK_K, qw += QK_K) {
        memset(&b[ibl], 0, sizeof b[ibl]);
        if (!lat) continue;
        const float sigma2 = 2 * sum_sq(x) / QK_K;
        float scales[8], max_scale = 0;
        int shifts[8];
        for (int ib = 0; ib < 8; ib++) {
            const float *xb = x + 32 * ib;
            float w[32], sumx[33], sumw[33];
            int idx[32];
            int8_t L[32];
            for (int i = 0; i < 32; i++) w[i] = qw[32 * ib + i] * sqrtf(sigma2 + xb[i] * xb[i]);
            scales[ib] = 0, shifts[ib] = 1;
            const float max = abs_max(xb, 32);
            if (max < 1e-12f) continue;
            sort_index(xb, 32, idx);
            sumx[0] = sumw[0] = 0;
            for (int j = 0; j < 32; j++) {
                sumx[j + 1] = sumx[j] + w[idx[j]] * xb[idx[j]];
                sumw[j + 1] = sumw[j] + w[idx[j]];
            }
            float best = -FLT_MAX, scale = max;
            int bi1 = -1, bi2 = -1, shift = 0;
            for (int i1 = 0; i1 <= 32; i1++)
                for (int i2 = i1; i2 <= 32; i2++)
                    for (int sgn = 1; sgn >= -1; sgn -= 2) {
                        const float *v = sgn == 1 ? x_p : x_m;
                        const float sumqx = (sumx[i1] - sumx[0]) * v[0] + (sumx[i2] - sumx[i1]) * v[1] +
                                            (sumx[32] - sumx[i2]) * v[2];
                        const float sumq2 = (sumw[i1] - sumw[0]) * v[0] * v[0] +
                                            (sumw[i2] - sumw[i1]) * v[1] * v[1] +
                                            (sumw[32] - sumw[i2]) * v[2] * v[2];
                        if (sumq2 > 0 && sumqx * sumqx > best * sumq2) {
                            scale = sumqx / sumq2;
                            best = scale * sumqx;
                            bi1 = i1, bi2 = i2, shift = sgn;
                        }
                    }
            if (bi1 < 0 || bi2 < 0 || shift == 0) continue;
            split_levels(idx, 32, bi1, bi2, L);
            if (scale < 0) {
                for (int j = 0; j < 32; j++) L[j] = (int8_t)(2 - L[j]);
                scale = -scale, shift = -shift;
            }
            const float *xx = shift == 1 ? x_p : x_m;
            uint16_t index[4];
            bool all_on = true;
            for (int k = 0; k < 4; k++) all_on &= group_point(lat, L, k, xb, w, scale, xx, index);
            if (!all_on) {
                float sumqx = 0, sumq2 = 0;
                for (int k = 0; k < 4; k++)
                    fit_group(lat, index[k], xb + 8 * k, w + 8 * k, xx, 1.0f, &sumqx, &sumq2);
                if (sumqx > 0 && sumq2 > 0) scale = sumqx / sumq2;
            }
            uint16_t h = 0;
            for (int k = 0; k < 4; k++) {
                b[ibl].qs[4 * ib + k] = (uint8_t)(index[k] & 255);
                h |= (uint16_t)((index[k] >> 8) << 3 * k);
            }
            b[ibl].qh[ib] = h;
            scales[ib] = scale, shifts[ib] = shift;
            max_scale = max_scale > scale ? max_scale : scale;
        }
        if (max_scale == 0.0f) continue;
        const float d = max_scale / 15, id = 1 / d;
        b[ibl].d = f32_to_f16(d * 1.125f);
        for (int ib = 0; ib < 8; ib++) {
            int l = clamp_int(nearest_int(0.5f * (id * scales[ib] - 1)), 0, 7);
            if (shifts[ib] == -1) l |= 8;
            b[ibl].qh[ib] |= (uint16_t)(l << 12);
        }
    }
}

/* ---- IQ1_M: sub-blocks of 16, a delta sign per group of 8 ---------------------------------------------- */

/* The delta values of group k (0, 1) for shift code s: bit 1 of s for the first group, bit 0 the second. */
static const float *iq1m_values(int s, int k)
{
    return (k == 0 ? s < 2 : s % 2 == 0) ? x_p : x_m;
}

/* The best split of a sub-block of 16 (sorted by idx) over the four delta-sign pairs; returns the scale and
 * sets *i1, *i2, *code (-1 when none scores). */
static float iq1m_split(const float *xb, const float *w, const int *idx, int *i1_out, int *i2_out, int *code)
{
    float px[2][17], pw[2][17];
    px[0][0] = px[1][0] = pw[0][0] = pw[1][0] = 0;
    for (int j = 0; j < 16; j++) {
        const int i = idx[j], h = i < 8 ? 0 : 1;
        px[h][j + 1] = px[h][j] + w[i] * xb[i];
        px[1 - h][j + 1] = px[1 - h][j];
        pw[h][j + 1] = pw[h][j] + w[i];
        pw[1 - h][j + 1] = pw[1 - h][j];
    }
    const float txs[2] = {px[0][16], px[1][16]}, tws[2] = {pw[0][16], pw[1][16]};
    const float p2 = x_p[2], m2 = x_m[2];
    const float cp1 = x_p[0] * x_p[0] - x_p[1] * x_p[1], cp2 = x_p[1] * x_p[1] - x_p[2] * x_p[2];
    const float cm1 = x_m[0] * x_m[0] - x_m[1] * x_m[1], cm2 = x_m[1] * x_m[1] - x_m[2] * x_m[2];
    float best = -FLT_MAX, scale = 0;
    *code = *i1_out = *i2_out = -1;
    for (int i1 = 0; i1 <= 16; i1++)
        for (int i2 = i1; i2 <= 16; i2++) {
            float qx_p[2], qx_m[2], q2_p[2], q2_m[2], sumqx[4], sumq2[4];
            for (int h = 0; h < 2; h++) {
                const float sx = px[h][i1] + px[h][i2];
                qx_p[h] = txs[h] * p2 - sx;
                qx_m[h] = txs[h] * m2 - sx;
                q2_p[h] = tws[h] * p2 * p2 + pw[h][i1] * cp1 + pw[h][i2] * cp2;
                q2_m[h] = tws[h] * m2 * m2 + pw[h][i1] * cm1 + pw[h][i2] * cm2;
            }
            sumqx[0] = qx_p[0] + qx_p[1], sumqx[1] = qx_p[0] + qx_m[1];
            sumqx[2] = qx_m[0] + qx_p[1], sumqx[3] = qx_m[0] + qx_m[1];
            sumq2[0] = q2_p[0] + q2_p[1], sumq2[1] = q2_p[0] + q2_m[1];
            sumq2[2] = q2_m[0] + q2_p[1], sumq2[3] = q2_m[0] + q2_m[1];
            for (int k = 0; k < 4; k++)
                if (sumq2[k] > 0 && sumqx[k] * sumqx[k] > best * sumq2[k]) {
                    scale = sumqx[k] / sumq2[k];
                    best = scale * sumqx[k];
                    *i1_out = i1, *i2_out = i2, *code = k;
                }
        }
    return scale;
}

/* The IQ1_M element weights of sub-block xb (16). */
static void iq1m_weights(const float *xb, const float *qw, float sigma2, float *w)
{
    for (int i = 0; i < 16; i++) w[i] = qw ? qw[i] * sqrtf(sigma2 + xb[i] * xb[i]) : xb[i] * xb[i];
}

void row_iq1_m_from_f32_w(const float *x, void *dst, int64_t n, const float *qw)
{
    static const uint8_t masks[4] = {0x00, 0x80, 0x08, 0x88};
    const struct iq_lattice *lat = iq_lattice_get(IQ_LATTICE_1S);
    struct block_iq1_m *b = dst;
    for (int64_t ibl = 0; ibl < n / QK_K; ibl++, x += QK_K) {
        memset(&b[ibl], 0, sizeof b[ibl]);
        if (!lat) continue;
        const float *qwb = qw ? qw + QK_K * ibl : NULL;
        const float sigma2 = 2 * sum_sq(x) / QK_K;
        float scales[16], max_scale = 0;
        int shifts[16];
        for (int ib = 0; ib < 16; ib++) {
            const float *xb = x + 16 * ib;
            float w[16];
            int idx[16], i1, i2, code;
            int8_t L[16];
            iq1m_weights(xb, qwb ? qwb + 16 * ib : NULL, sigma2, w);
            scales[ib] = 0, shifts[ib] = 0;
            if (abs_max(xb, 16) < 1e-7f) continue;
            sort_index(xb, 16, idx);
            float scale = iq1m_split(xb, w, idx, &i1, &i2, &code);
            if (i1 < 0 || i2 < 0 || code < 0) continue;
            split_levels(idx, 16, i1, i2, L);
            if (scale < 0) {
                for (int j = 0; j < 16; j++) L[j] = (int8_t)(2 - L[j]);
                scale = -scale, code = 3 - code;
            }
            uint16_t index[2];
            bool all_on = true;
            for (int k = 0; k < 2; k++)
                all_on &= group_point(lat, L, k, xb, w, scale, iq1m_values(code, k), index);
            if (!all_on) {
                float sumqx = 0, sumq2 = 0;
                for (int k = 0; k < 2; k++)
                    fit_group(lat, index[k], xb + 8 * k, w + 8 * k, iq1m_values(code, k), 1.0f, &sumqx,
                              &sumq2);
                if (sumqx > 0 && sumq2 > 0) scale = sumqx / sumq2;
            }
            b[ibl].qs[2 * ib] = (uint8_t)(index[0] & 255);
            b[ibl].qs[2 * ib + 1] = (uint8_t)(index[1] & 255);
            b[ibl].qh[ib] = (uint8_t)((index[0] >> 8) | (index[1] >> 8) << 4);
            scales[ib] = scale, shifts[ib] = code;
            max_scale = max_scale > scale ? max_scale : scale;
        }
        if (max_scale == 0.0f) continue;
        /* The coded scales, then d refit over the whole super-block with them. */
        uint16_t sc[4] = {0};
        float d = max_scale / 15;
        const float id = 1 / d;
        float sumqx = 0, sumq2 = 0;
        for (int ib = 0; ib < 16; ib++) {
            const int l = clamp_int(nearest_int(0.5f * (id * scales[ib] - 1)), 0, 7);
            sc[ib / 4] |= (uint16_t)(l << 3 * (ib % 4));
            b[ibl].qh[ib] |= masks[shifts[ib]];
            const float *xb = x + 16 * ib;
            float w[16];
            iq1m_weights(xb, qwb ? qwb + 16 * ib : NULL, sigma2, w);
            for (int k = 0; k < 2; k++) {
                const int g = b[ibl].qs[2 * ib + k] | ((b[ibl].qh[ib] << (8 - 4 * k)) & 0x700);
                fit_group(lat, g, xb + 8 * k, w + 8 * k, iq1m_values(shifts[ib], k), (float)(2 * l + 1),
                          &sumqx, &sumq2);
            }
        }
        if (sumq2 > 0) d = sumqx / sumq2;
        const uint16_t s = f32_to_f16(d * 1.1125f);
        sc[0] |= (uint16_t)((s & 0x000f) << 12);
        sc[1] |= (uint16_t)((s & 0x00f0) << 8);
        sc[2] |= (uint16_t)((s & 0x0f00) << 4);
        sc[3] |= (uint16_t)(s & 0xf000);
        for (int i = 0; i < 4; i++) {
            b[ibl].scales[2 * i] = (uint8_t)(sc[i] & 255);
            b[ibl].scales[2 * i + 1] = (uint8_t)(sc[i] >> 8);
        }
    }
}
