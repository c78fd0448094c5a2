/* iq_quant — f32 rows to the lattice i-quants IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS and IQ3_S (from_f32_w entries
 * of quant/dtype.c's table; IQ3_S also without weights), byte for byte ggml's quantize_iq* (lcp0336).
 *
 * Each stores groups of elements (8 for IQ2, 4 for IQ3) as points of a lattice (quant/iq_lattice.h: levels l,
 * coordinate 2 l + 1 times the sub-block scale) and their signs (IQ2_XXS, IQ2_XS, IQ3_XXS: 7 bits per 8, the
 * eighth making the count of negatives even, so an odd count flips the element of least w x^2; IQ2_S, IQ3_S:
 * 8 free bits). Per sub-block: trial inverse scales (base + step i) / max (search_scale: IQ2 5 + 0.1 i, IQ3
 * 15 + 0.2 i; IQ2_XXS against the best 4-level fit instead of max), each rounding the magnitudes to levels,
 * moving a pattern that is not a lattice point to its nearest neighbour (distances weighted by sqrt(w)) and
 * keeping the best weighted least-squares scale; groups are then re-picked with that scale (which ones
 * differs by type) and the scale refit. The sub-block scales become 4-bit codes l, scale ~ d (2 l + 1),
 * against d = max scale / 31 (stored with ggml's fudge factors: IQ2_S 0.9875, IQ3_XXS 1.0125, IQ3_S 1.033).
 * Weights: w = qw * sqrt(sigma2 + x^2), sigma2 the super-block's mean x^2 (times 2 for IQ2_S and the IQ3
 * types), or x^2 for IQ3_S without an importance matrix.
 */
#include <math.h>
#include <stdbool.h>
#include <string.h>

#include "quant/blocks.h"
#include "quant/fp16.h"
#include "quant/iq_lattice.h"
#include "quant/rounding.h"
#include "quant/rows.h"

/* The magnitudes of a group of 8 into xval and its 7 stored sign bits: with an odd count of negatives, the
 * element of least w x^2 (the first of equals) keeps a wrong sign (its xval negative) so the count is even.
 */
static uint8_t even_signs(const float *xb, const float *w, float *xval)
{
    int nflip = 0;
    uint8_t s = 0;
    for (int i = 0; i < 8; i++) {
        xval[i] = xb[i] >= 0 ? xb[i] : -xb[i];
        if (!(xb[i] >= 0)) nflip++, s |= (uint8_t)(1 << i);
    }
    if (nflip % 2) {
        int imin = 0;
        float min = w[0] * xb[0] * xb[0];
        for (int i = 1; i < 8; i++) {
            const float a = w[i] * xb[i] * xb[i];
            if (a < min) min = a, imin = i;
        }
        xval[imin] = -xval[imin];
        s ^= (uint8_t)(1 << imin);
    }
    return s & 127;
}

/* The magnitudes of a group of 8 into xval and its 8 sign bits (IQ2_S, IQ3_S). */
static uint8_t all_signs(const float *xb, float *xval)
{
    uint8_t s = 0;
    for (int i = 0; i < 8; i++) {
        xval[i] = xb[i] >= 0 ? xb[i] : -xb[i];
        if (!(xb[i] >= 0)) s |= (uint8_t)(1 << i);
    }
    return s;
}

/* Weighted fit of n elements xval to levels L: sumqx, sumq2. */
static void fit_levels(int n, const float *xval, const float *w, const int8_t *L, float *sumqx, float *sumq2)
{
    float sx = 0, s2 = 0;
    for (int i = 0; i < n; i++) {
        const float q = (float)(2 * L[i] + 1);
        sx += w[i] * xval[i] * q;
        s2 += w[i] * q * q;
    }
    *sumqx = sx, *sumq2 = s2;
}

/* How a type's scale search goes: trial inverse scales (base + step * is) / ref for is in [is_lo, is_hi];
 * which groups are re-picked with the chosen scale. */
enum repick {
    REPICK_OFF_GRID,   /* the groups whose trial levels were off the grid, if any (IQ2_XS, IQ3_XXS) */
    REPICK_ALL_IF_ANY, /* every group, if any was off the grid (IQ3_S) */
    REPICK_ALL,        /* every group (IQ2_XXS) */
};
struct search {
    int lmax, is_lo, is_hi;
    float base, step;
    bool init_on; /* a group counts as on the grid before any trial improves */
    enum repick repick;
};

/* The levels L (n) of the magnitudes xval on lat's grid and their scale (ggml's quantize_row_iq*_impl inner
 * search): each trial rounds every group to levels, replaces a pattern off the grid by its nearest neighbour
 * (distances weighted by waux) and keeps the best weighted least-squares scale; then groups are re-picked
 * with that scale as sp->repick says and the scale refit. L and scale come in with the search's start. */
static float search_scale(const struct iq_lattice *lat, const struct search *sp, int n, const float *xval,
                          const float *w, const float *waux, float ref, float scale, int8_t *L)
{
    const int wd = lat->width, ng = n / wd;
    float best = 0;
    bool on[8], on_aux[8], any_off = false;
    int8_t Laux[32];
    for (int k = 0; k < ng; k++) on[k] = sp->init_on;
    for (int is = sp->is_lo; is <= sp->is_hi; is++) {
        const float id = (sp->base + (float)is * sp->step) / ref, this_scale = 1 / id;
        for (int k = 0; k < ng; k++) {
            const int u = iq_lattice_levels(lat, xval + wd * k, id, sp->lmax, Laux + wd * k);
            on_aux[k] = lat->map[u] >= 0;
            if (!on_aux[k])
                iq_lattice_nearest(lat, u, xval + wd * k, waux + wd * k, this_scale, Laux + wd * k);
        }
        float sumqx, sumq2;
        fit_levels(n, xval, w, Laux, &sumqx, &sumq2);
        if (sumq2 > 0 && sumqx * sumqx > best * sumq2) {
            scale = sumqx / sumq2;
            best = scale * sumqx;
            memcpy(L, Laux, (size_t)n);
            memcpy(on, on_aux, sizeof on);
        }
    }
    for (int k = 0; k < ng; k++) any_off |= !on[k];
    if (!(scale > 0) || (sp->repick != REPICK_ALL && !any_off)) return scale;
    const float id = 1 / scale;
    for (int k = 0; k < ng; k++) {
        if (sp->repick == REPICK_OFF_GRID && on[k]) continue;
        int8_t Lt[8];
        const int u = iq_lattice_levels(lat, xval + wd * k, id, sp->lmax, Lt);
        const int g = lat->map[u] >= 0 ? lat->map[u]
                                       : iq_lattice_nearest(lat, u, xval + wd * k, waux + wd * k, scale, Lt);
        for (int i = 0; i < wd; i++) L[wd * k + i] = (int8_t)lat->level[g][i];
    }
    float sumqx, sumq2;
    fit_levels(n, xval, w, L, &sumqx, &sumq2);
    return sumq2 > 0 ? sumqx / sumq2 : scale;
}

/* The grid point of group k of L (every pattern is on the grid by now: a neighbour is a grid point; 0 only
 * guards a bug). */
static int grid_index(const struct iq_lattice *lat, const int8_t *L, int k)
{
    int u = 0;
    for (int i = 0; i < lat->width; i++)
        u |= (L[lat->width * k + i] & ((1 << lat->bits) - 1)) << lat->bits * i;
    return lat->map[u] >= 0 ? lat->map[u] : 0;
}

/* max of xval[0..n) (ggml's MAX fold). */
static float max_of(const float *xval, int n)
{
    float max = xval[0];
    for (int i = 1; i < n; i++) max = max > xval[i] ? max : xval[i];
    return max;
}

/* The element weights of a sub-block: qw * sqrt(sigma2 + x^2), or x^2 without an importance matrix; waux
 * their square roots. */
static void sub_block_weights(const float *xb, const float *qw, float sigma2, int n, float *w, float *waux)
{
    for (int i = 0; i < n; i++) w[i] = qw ? qw[i] * sqrtf(sigma2 + xb[i] * xb[i]) : xb[i] * xb[i];
    for (int i = 0; i < n; i++) waux[i] = sqrtf(w[i]);
}

static float sum_sq(const float *x)
{
    float s = 0;
    for (int i = 0; i < QK_K; i++) s += x[i] * x[i];
    return s;
}

/* The 4-bit sub-block scale code of scale against d: scale ~ d (2 l + 1). */
static int scale_code(float id, float scale)
{
    return clamp_int(nearest_int(0.5f * (id * scale - 1)), 0, 15);
}

/* A sub-block's weights (and their roots), magnitudes and sign bytes (7 bits with even parity, or all 8);
 * returns the largest magnitude. */
static float sub_block_prep(const float *xb, const float *qw, float sigma2, int n, bool even, float *w,
                            float *waux, float *xval, uint8_t *signs)
{
    sub_block_weights(xb, qw, sigma2, n, w, waux);
    for (int k = 0; k < n / 8; k++)
        signs[k] =
            even ? even_signs(xb + 8 * k, w + 8 * k, xval + 8 * k) : all_signs(xb + 8 * k, xval + 8 * k);
    return max_of(xval, n);
}

/* A negative fit flips to positive with every sign (within mask) inverted. */
static float positive_scale(float scale, uint8_t *signs, int n_signs, uint8_t mask)
{
    if (scale >= 0) return scale;
    for (int k = 0; k < n_signs; k++) signs[k] = (uint8_t)~signs[k] & mask;
    return -scale;
}

/* ---- IQ2_XS: sub-blocks of 16, two groups of 8 -----------------------------------------------------------
 */

static const struct search iq2xs_search = {2, -9, 9, 5, 0.1f, true, REPICK_OFF_GRID};

void row_iq2_xs_from_f32_w(const float *x, void *dst, int64_t n, const float *qw)
{
    const struct iq_lattice *lat = iq_lattice_get(IQ_LATTICE_2XS);
    struct block_iq2_xs *b = dst;
    for (int64_t ibl = 0; ibl < n / QK_K; ibl++, x += QK_K, qw += QK_K) {
        memset(&b[ibl], 0, sizeof b[ibl]);
        if (!lat) continue; /* out of memory building the lattice: an all-zero block */
        const float sigma2 = sum_sq(x) / QK_K;
        float scales[16], max_scale = 0;
        uint16_t q2[32] = {0};
        for (int ib = 0; ib < 16; ib++) {
            const float *xb = x + 16 * ib;
            float w[16], waux[16], xval[16];
            uint8_t signs[2];
            int8_t L[16] = {0};
            const float max = sub_block_prep(xb, qw + 16 * ib, sigma2, 16, true, w, waux, xval, signs);
            scales[ib] = 0;
            if (max < GROUP_MAX_EPS) continue;
            float scale = search_scale(lat, &iq2xs_search, 16, xval, w, waux, max, max / 5, L);
            scale = positive_scale(scale, signs, 2, 127);
            for (int k = 0; k < 2; k++) q2[2 * ib + k] = (uint16_t)(grid_index(lat, L, k) | signs[k] << 9);
            scales[ib] = scale;
            max_scale = max_scale > scale ? max_scale : scale;
        }
        if (max_scale == 0.0f) continue;
        const float d = max_scale / 31, id = 1 / d;
        b[ibl].d = f32_to_f16(d);
        for (int ib = 0; ib < 16; ib++)
            b[ibl].scales[ib / 2] |= (uint8_t)(scale_code(id, scales[ib]) << 4 * (ib % 2));
        memcpy(b[ibl].qs, q2, sizeof q2);
    }
}

/* ---- IQ2_S: as IQ2_XS on a 1024-point grid, with 8 free sign bits per group ------------------------------
 */

void row_iq2_s_from_f32_w(const float *x, void *dst, int64_t n, const float *qw)
{
    const struct iq_lattice *lat = iq_lattice_get(IQ_LATTICE_2S);
    struct block_iq2_s *b = dst;
    for (int64_t ibl = 0; ibl < n / QK_K; ibl++, x += QK_K, qw += QK_K) {
        memset(&b[ibl], 0, sizeof b[ibl]);
        if (!lat) continue;
        const float sigma2 = 2 * sum_sq(x) / QK_K;
        float scales[16], max_scale = 0;
        for (int ib = 0; ib < 16; ib++) {
            const float *xb = x + 16 * ib;
            float w[16], waux[16], xval[16];
            uint8_t signs[2];
            int8_t L[16] = {0};
            const float max = sub_block_prep(xb, qw + 16 * ib, sigma2, 16, false, w, waux, xval, signs);
            scales[ib] = 0;
            if (max < 1e-8f) continue;
            float scale = search_scale(lat, &iq2xs_search, 16, xval, w, waux, max, max / 5, L);
            scale = positive_scale(scale, signs, 2, 255);
            for (int k = 0; k < 2; k++) {
                const int g = grid_index(lat, L, k), i8 = 2 * ib + k;
                b[ibl].qs[i8] = (uint8_t)(g & 255);
                b[ibl].qh[i8 / 4] |= (uint8_t)((g >> 8) << 2 * (i8 % 4));
                b[ibl].qs[QK_K / 8 + i8] = signs[k];
            }
            scales[ib] = scale;
            max_scale = max_scale > scale ? max_scale : scale;
        }
        if (max_scale == 0.0f) continue;
        const float d = max_scale / 31, id = 1 / d;
        b[ibl].d = f32_to_f16(d * 0.9875f);
        for (int ib = 0; ib < 16; ib++)
            b[ibl].scales[ib / 2] |= (uint8_t)(scale_code(id, scales[ib]) << 4 * (ib % 2));
    }
}

/* ---- IQ2_XXS: sub-blocks of 32, four groups of 8 ---------------------------------------------------------
 */

static const struct search iq2xxs_search = {2, -6, 6, 5, 0.1f, true, REPICK_ALL};

void row_iq2_xxs_from_f32_w(const float *x, void *dst, int64_t n, const float *qw)
{
    const struct iq_lattice *lat = iq_lattice_get(IQ_LATTICE_2XXS);
    struct block_iq2_xxs *b = dst;
    for (int64_t ibl = 0; ibl < n / QK_K; ibl++, x += QK_K, qw += QK_K) {
        memset(&b[ibl], 0, sizeof b[ibl]);
        if (!lat) continue;
        const float sigma2 = sum_sq(x) / QK_K;
        float scales[8], max_scale = 0;
        uint32_t q2[16] = {0}; /* per sub-block: four grid bytes, then 4 x 7 sign bits and the scale code */
        for (int ib = 0; ib < 8; ib++) {
            const float *xb = x + 32 * ib;
            float w[32], waux[32], xval[32];
            uint8_t signs[4];
            int8_t L[32] = {0};
            const float max = sub_block_prep(xb, qw + 32 * ib, sigma2, 32, true, w, waux, xval, signs);
            scales[ib] = 0;
            if (max < GROUP_MAX_EPS) continue;
            /* The search starts from the best 4-level fit of the magnitudes. */
            float scale = quant_fit_positive_w(32, 4, xval, (uint8_t *)L, w);
            const float eff_max = scale * 3;
            if (eff_max <= 0) continue;
            scale = search_scale(lat, &iq2xxs_search, 32, xval, w, waux, eff_max, scale, L);
            scale = positive_scale(scale, signs, 4, 127);
            for (int k = 0; k < 4; k++) {
                q2[2 * ib] |= (uint32_t)grid_index(lat, L, k) << 8 * k;
                q2[2 * ib + 1] |= (uint32_t)signs[k] << 7 * k;
            }
            scales[ib] = scale;
            max_scale = max_scale > scale ? max_scale : scale;
        }
        if (max_scale == 0.0f) continue;
        const float d = max_scale / 31, id = 1 / d;
        b[ibl].d = f32_to_f16(d);
        for (int ib = 0; ib < 8; ib++) q2[2 * ib + 1] |= (uint32_t)scale_code(id, scales[ib]) << 28;
        memcpy(b[ibl].qs, q2, sizeof q2);
    }
}

/* ---- IQ3_XXS: sub-blocks of 32, eight groups of 4, signs as IQ2_XXS -------------------------------------
 */

static const struct search iq3xxs_search = {7, -15, 15, 15, 0.2f, true, REPICK_OFF_GRID};

void row_iq3_xxs_from_f32_w(const float *x, void *dst, int64_t n, const float *qw)
{
    const struct iq_lattice *lat = iq_lattice_get(IQ_LATTICE_3XXS);
    struct block_iq3_xxs *b = dst;
    for (int64_t ibl = 0; ibl < n / QK_K; ibl++, x += QK_K, qw += QK_K) {
        memset(&b[ibl], 0, sizeof b[ibl]);
        if (!lat) continue;
        const float sigma2 = 2 * sum_sq(x) / QK_K;
        float scales[8], max_scale = 0;
        uint8_t q3[QK_K / 4] = {0}; /* grid indices */
        uint32_t ss[8] = {0};       /* per sub-block: 4 x 7 sign bits, the scale code at bit 28 */
        for (int ib = 0; ib < 8; ib++) {
            const float *xb = x + 32 * ib;
            float w[32], waux[32], xval[32];
            uint8_t signs[4];
            int8_t L[32] = {0};
            const float max = sub_block_prep(xb, qw + 32 * ib, sigma2, 32, true, w, waux, xval, signs);
            scales[ib] = 0;
            if (max < 1e-8f) continue;
            float scale = search_scale(lat, &iq3xxs_search, 32, xval, w, waux, max, max / 15, L);
            scale = positive_scale(scale, signs, 4, 127);
            for (int k = 0; k < 8; k++) q3[8 * ib + k] = (uint8_t)grid_index(lat, L, k);
            ss[ib] = (uint32_t)signs[0] | (uint32_t)signs[1] << 7 | (uint32_t)signs[2] << 14 |
                     (uint32_t)signs[3] << 21;
            scales[ib] = scale;
            max_scale = max_scale > scale ? max_scale : scale;
        }
        if (max_scale == 0.0f) continue;
        const float d = max_scale / 31, id = 1 / d;
        b[ibl].d = f32_to_f16(d * 1.0125f);
        for (int ib = 0; ib < 8; ib++) ss[ib] |= (uint32_t)scale_code(id, scales[ib]) << 28;
        memcpy(b[ibl].qs, q3, sizeof q3);
        memcpy(b[ibl].qs + sizeof q3, ss, sizeof ss);
    }
}

/* ---- IQ3_S: sub-blocks of 32, eight groups of 4, one sign bit per element --------------------------------
 */

static const struct search iq3s_search = {7, -9, 9, 15, 0.2f, false, REPICK_ALL_IF_ANY};

/* qw NULL: weights x^2 (llama-quantize without an importance matrix). */
static void iq3s_rows(const float *x, void *dst, int64_t n, const float *qw)
{
    const struct iq_lattice *lat = iq_lattice_get(IQ_LATTICE_3S);
    struct block_iq3_s *b = dst;
    for (int64_t ibl = 0; ibl < n / QK_K; ibl++, x += QK_K) {
        memset(&b[ibl], 0, sizeof b[ibl]);
        if (!lat) continue;
        const float sigma2 = 2 * sum_sq(x) / QK_K;
        float scales[8], max_scale = 0;
        /* ggml advances its qs and signs cursors only past sub-blocks that are not all zero (the next one's
         * codes move up), while qh and the scales stay at their positions: kept for the same bytes. */
        int qs_at = 0, signs_at = 0;
        for (int ib = 0; ib < 8; ib++) {
            const float *xb = x + 32 * ib;
            float w[32], waux[32], xval[32];
            uint8_t signs[4];
            int8_t L[32] = {0};
            const float max = sub_block_prep(xb, qw ? qw + QK_K * ibl + 32 * ib : NULL, sigma2, 32, false, w,
                                             waux, xval, signs);
            scales[ib] = 0;
            if (max == 0.0f) continue;
            float scale = search_scale(lat, &iq3s_search, 32, xval, w, waux, max, max / 15, L);
            scale = positive_scale(scale, signs, 4, 255);
            for (int k = 0; k < 8; k++) {
                const int g = grid_index(lat, L, k);
                b[ibl].qs[qs_at + k] = (uint8_t)(g & 255);
                b[ibl].qh[ib] |= (uint8_t)((g >> 8) << k);
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
        for (int ib = 0; ib < 8; ib += 2)
            b[ibl].scales[ib / 2] =
                (uint8_t)(scale_code(id, scales[ib]) | scale_code(id, scales[ib + 1]) << 4);
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
