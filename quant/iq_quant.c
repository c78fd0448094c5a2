/* iq2_quant — f32 rows to IQ2_XS with an importance matrix (the from_f32_w entry of quant/dtype.c's table),
 * byte for byte what llama-quantize writes (ggml-quants.c's quantize_iq2_xs).
 *
 * IQ2_XS stores each group of 8 elements as a point of a 512-point lattice (every coordinate 1, 3 or 5
 * times the scale, quant/iq_tables.h's iq2xs_grid read as levels 0..2) and 7 sign bits, the eighth sign
 * making the count of negatives even. Per sub-block of 16: the signs are taken off (an odd count flips the
 * element of least weight w x^2 to a wrong sign, so the group stays even), then 19 trial scales (5 +
 * 0.1 i) / max, i in -9..9, each rounding the magnitudes to levels, replacing a level pattern that is not a
 * lattice point by its best neighbour (weighted by sqrt(w)), and keeping the best weighted least-squares
 * scale; groups left off the lattice are re-picked once with that scale. The 16 sub-block scales become
 * 4-bit codes l with scale = d (2 l + 1) / ... against d = max scale / 31. w = qw * sqrt(sigma2 + x^2),
 * sigma2 the super-block's mean x^2.
 *
 * The neighbours of a level pattern that is not a lattice point are the lattice points at the two smallest
 * squared distances, in order of distance then index (ggml's iq2xs_init_impl); they are built once per
 * process, on first use, for the 3^8 patterns of levels 0..2 (the only ones the quantizer forms).
 */
#include <math.h>
#include <stdbool.h>
#include <string.h>

#include "quant/blocks.h"
#include "quant/fp16.h"
#include "quant/iq_lattice.h"
#include "quant/rounding.h"
#include "quant/rows.h"

/* Weighted fit of sub-block xval (16) to levels L: sumqx, sumq2. */
static void fit16(const float *xval, const float *w, const int8_t *L, float *sumqx, float *sumq2)
{
    float sx = 0, s2 = 0;
    for (int i = 0; i < 16; i++) {
        const float q = (float)(2 * L[i] + 1);
        sx += w[i] * xval[i] * q;
        s2 += w[i] * q * q;
    }
    *sumqx = sx, *sumq2 = s2;
}

/* One sub-block of 16: grid indices with signs into q2 (2), returns its scale (>= 0). */
static float iq2xs_sub_block(const struct iq_lattice *lat, const float *xb, const float *w, uint16_t *q2)
{
    float waux[16], xval[16];
    uint8_t signs[2];
    for (int i = 0; i < 16; i++) waux[i] = sqrtf(w[i]);
    for (int k = 0; k < 2; k++) {
        int nflip = 0;
        uint8_t s = 0;
        for (int i = 0; i < 8; i++) {
            const float v = xb[8 * k + i];
            xval[8 * k + i] = v >= 0 ? v : -v;
            if (!(v >= 0)) nflip++, s |= (uint8_t)(1 << i);
        }
        if (nflip % 2) { /* an odd count: flip the least weighted element */
            int imin = 0;
            float min = w[8 * k] * xb[8 * k] * xb[8 * k];
            for (int i = 1; i < 8; i++) {
                const float a = w[8 * k + i] * xb[8 * k + i] * xb[8 * k + i];
                if (a < min) min = a, imin = i;
            }
            xval[8 * k + imin] = -xval[8 * k + imin];
            s ^= (uint8_t)(1 << imin);
        }
        signs[k] = s & 127;
    }
    float max = xval[0];
    for (int i = 1; i < 16; i++) max = max > xval[i] ? max : xval[i];
    int8_t L[16] = {0}, Laux[16];
    if (max < GROUP_MAX_EPS) {
        q2[0] = q2[1] = 0;
        return 0.0f;
    }
    float best = 0, scale = max / 5;
    bool on[2] = {true, true};
    for (int is = -9; is <= 9; is++) {
        const float id = (5 + (float)is * 0.1f) / max, this_scale = 1 / id;
        bool on_aux[2];
        for (int k = 0; k < 2; k++) {
            const int u = iq_lattice_levels(lat, xval + 8 * k, id, 2, Laux + 8 * k);
            on_aux[k] = lat->map[u] >= 0;
            if (!on_aux[k]) iq_lattice_nearest(lat, u, xval + 8 * k, waux + 8 * k, this_scale, Laux + 8 * k);
        }
        float sumqx, sumq2;
        fit16(xval, w, Laux, &sumqx, &sumq2);
        if (sumq2 > 0 && sumqx * sumqx > best * sumq2) {
            scale = sumqx / sumq2;
            best = scale * sumqx;
            memcpy(L, Laux, sizeof L);
            on[0] = on_aux[0], on[1] = on_aux[1];
        }
    }
    if ((!on[0] || !on[1]) && scale > 0) {
        const float id = 1 / scale;
        for (int k = 0; k < 2; k++) {
            if (on[k]) continue;
            const int u = iq_lattice_levels(lat, xval + 8 * k, id, 2, L + 8 * k);
            if (lat->map[u] < 0) iq_lattice_nearest(lat, u, xval + 8 * k, waux + 8 * k, scale, L + 8 * k);
        }
        float sumqx, sumq2;
        fit16(xval, w, L, &sumqx, &sumq2);
        if (sumq2 > 0) scale = sumqx / sumq2;
    }
    if (scale < 0) {
        scale = -scale;
        signs[0] = (uint8_t)~signs[0] & 127;
        signs[1] = (uint8_t)~signs[1] & 127;
    }
    for (int k = 0; k < 2; k++) {
        int u = 0;
        for (int i = 0; i < 8; i++) u |= L[8 * k + i] << 2 * i;
        /* Every pattern is a lattice point by now (a neighbour is one); 0 guards a bug, never a file. */
        const int g = lat->map[u] >= 0 ? lat->map[u] : 0;
        q2[k] = (uint16_t)(g | signs[k] << 9);
    }
    return scale;
}

void row_iq2_xs_from_f32_w(const float *x, void *dst, int64_t n, const float *qw)
{
    const struct iq_lattice *lat = iq_lattice_get(IQ_LATTICE_2XS);
    struct block_iq2_xs *b = dst;
    for (int64_t ibl = 0; ibl < n / QK_K; ibl++, x += QK_K, qw += QK_K) {
        memset(&b[ibl], 0, sizeof b[ibl]);
        if (!lat) continue; /* out of memory building the lattice: an all-zero block */
        float sumx2 = 0, scales[16], max_scale = 0, w[16];
        for (int i = 0; i < QK_K; i++) sumx2 += x[i] * x[i];
        const float sigma2 = sumx2 / QK_K;
        uint16_t q2[32];
        for (int ib = 0; ib < 16; ib++) {
            for (int i = 0; i < 16; i++)
                w[i] = qw[16 * ib + i] * sqrtf(sigma2 + x[16 * ib + i] * x[16 * ib + i]);
            scales[ib] = iq2xs_sub_block(lat, x + 16 * ib, w, q2 + 2 * ib);
            max_scale = max_scale > scales[ib] ? max_scale : scales[ib];
        }
        if (max_scale == 0.0f) continue;
        const float d = max_scale / 31, id = 1 / d;
        b[ibl].d = f32_to_f16(d);
        for (int ib = 0; ib < 16; ib++) {
            const int l = clamp_int(nearest_int(0.5f * (id * scales[ib] - 1)), 0, 15);
            b[ibl].scales[ib / 2] |= (uint8_t)(l << 4 * (ib % 2));
        }
        memcpy(b[ibl].qs, q2, sizeof q2);
    }
}

/* ---- IQ3_S ----------------------------------------------------------------------------------------------
 */

/* Weighted fit of a sub-block xval (32) to levels L: sumqx, sumq2. */
static void fit32(const float *xval, const float *w, const int8_t *L, float *sumqx, float *sumq2)
{
    float sx = 0, s2 = 0;
    for (int i = 0; i < 32; i++) {
        const float q = (float)(2 * L[i] + 1);
        sx += w[i] * xval[i] * q;
        s2 += w[i] * q * q;
    }
    *sumqx = sx, *sumq2 = s2;
}

/* One IQ3_S sub-block of 32: levels into L and sign bytes into signs (4); returns its scale, or -1 for an
 * all-zero sub-block (which writes nothing). */
static float iq3s_sub_block(const struct iq_lattice *lat, const float *xb, const float *w, int8_t *L,
                            uint8_t *signs)
{
    float waux[32], xval[32];
    for (int i = 0; i < 32; i++) waux[i] = sqrtf(w[i]);
    for (int k = 0; k < 4; k++) {
        uint8_t s = 0;
        for (int i = 0; i < 8; i++) {
            const float v = xb[8 * k + i];
            xval[8 * k + i] = v >= 0 ? v : -v;
            if (!(v >= 0)) s |= (uint8_t)(1 << i);
        }
        signs[k] = s;
    }
    float max = xval[0];
    for (int i = 1; i < 32; i++) max = max > xval[i] ? max : xval[i];
    memset(L, 0, 32);
    if (max == 0.0f) return -1.0f;
    float best = 0, scale = max / 15;
    bool on[8] = {false};
    int8_t Laux[32];
    for (int is = -9; is <= 9; is++) {
        const float id = (15 + (float)is * 0.2f) / max, this_scale = 1 / id;
        bool on_aux[8];
        for (int k = 0; k < 8; k++) {
            const int u = iq_lattice_levels(lat, xval + 4 * k, id, 7, Laux + 4 * k);
            on_aux[k] = lat->map[u] >= 0;
            if (!on_aux[k]) iq_lattice_nearest(lat, u, xval + 4 * k, waux + 4 * k, this_scale, Laux + 4 * k);
        }
        float sumqx, sumq2;
        fit32(xval, w, Laux, &sumqx, &sumq2);
        if (sumq2 > 0 && sumqx * sumqx > best * sumq2) {
            scale = sumqx / sumq2;
            best = scale * sumqx;
            memcpy(L, Laux, 32);
            memcpy(on, on_aux, sizeof on);
        }
    }
    bool all_on = true;
    for (int k = 0; k < 8; k++) all_on &= on[k];
    if (!all_on && scale > 0) { /* every group again at the chosen scale */
        const float id = 1 / scale;
        for (int k = 0; k < 8; k++) {
            int8_t Lt[4];
            const int u = iq_lattice_levels(lat, xval + 4 * k, id, 7, Lt);
            const int g = lat->map[u] >= 0
                              ? lat->map[u]
                              : iq_lattice_nearest(lat, u, xval + 4 * k, waux + 4 * k, scale, Lt);
            for (int i = 0; i < 4; i++) L[4 * k + i] = (int8_t)lat->level[g][i];
        }
        float sumqx, sumq2;
        fit32(xval, w, L, &sumqx, &sumq2);
        if (sumq2 > 0) scale = sumqx / sumq2;
    }
    if (scale < 0) {
        scale = -scale;
        for (int k = 0; k < 4; k++) signs[k] = (uint8_t)~signs[k];
    }
    return scale;
}

/* qw NULL: weights x^2 (llama-quantize without an importance matrix). */
static void iq3s_rows(const float *x, void *dst, int64_t n, const float *qw)
{
    const struct iq_lattice *lat = iq_lattice_get(IQ_LATTICE_3S);
    struct block_iq3_s *b = dst;
    for (int64_t ibl = 0; ibl < n / QK_K; ibl++, x += QK_K) {
        memset(&b[ibl], 0, sizeof b[ibl]);
        if (!lat) continue; /* out of memory building the lattice: an all-zero block */
        float sumx2 = 0, scales[8], max_scale = 0, w[32];
        for (int i = 0; i < QK_K; i++) sumx2 += x[i] * x[i];
        const float sigma2 = 2 * sumx2 / QK_K;
        /* ggml advances its qs and signs cursors only past sub-blocks that are not all zero (the next one's
         * codes move up), while qh and the scales stay at their positions: kept for the same bytes. */
        int qs_at = 0, signs_at = 0;
        for (int ib = 0; ib < 8; ib++) {
            const float *xb = x + 32 * ib;
            for (int i = 0; i < 32; i++)
                w[i] = qw ? qw[QK_K * ibl + 32 * ib + i] * sqrtf(sigma2 + xb[i] * xb[i]) : xb[i] * xb[i];
            int8_t L[32];
            uint8_t signs[4];
            const float scale = iq3s_sub_block(lat, xb, w, L, signs);
            if (scale < 0) {
                scales[ib] = 0;
                continue;
            }
            for (int k = 0; k < 8; k++) {
                int u = 0;
                for (int i = 0; i < 4; i++) u |= L[4 * k + i] << 3 * i;
                const int g = lat->map[u] >= 0 ? lat->map[u] : 0; /* always on the grid by now */
                b[ibl].qs[qs_at + k] = (uint8_t)(g & 255);
                b[ibl].qh[(8 * ib + k) / 8] |= (uint8_t)((g >> 8) << ((8 * ib + k) % 8));
            }
            qs_at += 8;
            memcpy(b[ibl].signs + signs_at, signs, 4);
            signs_at += 4;
            scales[ib] = scale;
            max_scale = max_scale > scale ? max_scale : scale;
        }
        if (max_scale == 0.0f) continue;
        const float d = max_scale / 31, id = 1 / d;
        b[ibl].d = f32_to_f16(d * 1.033f);
        for (int ib = 0; ib < 8; ib += 2) {
            const int l1 = clamp_int(nearest_int(0.5f * (id * scales[ib] - 1)), 0, 15);
            const int l2 = clamp_int(nearest_int(0.5f * (id * scales[ib + 1] - 1)), 0, 15);
            b[ibl].scales[ib / 2] = (uint8_t)(l1 | l2 << 4);
        }
    }
}

void row_iq3_s_from_f32(const float *x, void *dst, int64_t n)
{
    iq3s_rows(x, dst, n, NULL);
}

void row_iq3_s_from_f32_w(const float *x, void *dst, int64_t n, const float *qw)
{
    iq3s_rows(x, dst, n, qw);
}
