/* kquant — f32 rows to ggml's K-quants Q2_K, Q3_K, Q4_K, Q5_K and Q6_K (the from_f32 entries of
 * quant/dtype.c's table).
 *
 * Byte for byte ggml's reference quantizers (quantize_row_q{2,3,4,5,6}_K_ref in ggml-quants.c, which
 * llama-quantize runs when it has no importance matrix); tests/weights/test_quantize_llama.c checks them
 * against llama-quantize's output and tests/kernels/test_quant.c against the peer's quantize_row_*_ref. The
 * algorithms, per 256-element super-block (layouts in quant/dequant.c):
 *
 * Q4_K / Q5_K (nmax = 15 / 31): each sub-block of 32 gets an affine fit x ~ scale * l - min, l in [0, nmax],
 *   by fit_affine(): weights w = sqrt(mean(x^2)) + |x|; start from the plain min/max grid, then try nstep + 1
 *   grid scales (nmax + rmin + rdelta * i) / (max - min) and keep the weighted least-squares (scale, min) of
 *   the grid with the smallest weighted squared error (Q4_K: rmin -1, rdelta 0.1, 20 steps; Q5_K: -0.5, 0.1,
 *   15). The eight scales and eight mins are then quantized to 6 bits against their largest values (d =
 *   max_scale / 63, dmin = max_min / 63, both f16), and every element is re-quantized with the rounded
 *   sub-block scale: l = nearest((x + dmin * m) / (d * sc)).
 * Q2_K: the same fit on sub-blocks of 16 with l in [0, 3], weights |x| and the absolute error (rmin -0.5,
 *   rdelta 0.1, 15 steps); scales and mins to 4 bits against their largest values (d, dmin = max / 15).
 * Q3_K: each sub-block of 16 gets symmetric codes in [-4, 3] by fit_q3() (the largest magnitude maps to -4,
 *   then single codes move while the x^2-weighted fit improves); the 16 scales become 6 bits against the one
 *   of largest magnitude (d = that scale / -32), and the elements are re-quantized with the rounded scales.
 * Q6_K: each sub-block of 16 gets a symmetric fit by fit_symmetric() (codes in [-32, 31]: the largest
 *   magnitude maps to -32, then 18 nearby scales are tried, keeping the best x^2-weighted least-squares one);
 *   the 16 scales become int8 against the one of largest magnitude (d = that scale / -128, f16), and the
 *   elements are re-quantized with the rounded scales.
 *
 * Rounding is nearest_int() (quant/rounding.h). Every f32 expression keeps ggml's order of operations; the
 * library is compiled with -ffp-contract=off (ggml-base is built for x86-64 without FMA), so each operation
 * rounds as it does there.
 */
#include <math.h>
#include <stdbool.h>
#include <string.h>

#include "quant/blocks.h"
#include "quant/fp16.h"
#include "quant/rounding.h"
#include "quant/rows.h"

/* Vector-returning static helpers are never called across an ABI boundary. */
#pragma GCC diagnostic ignored "-Wpsabi"

/* ---- lanes: the fits run on all sub-blocks of a super-block at once ------------------------------------
 *
 * Lane j of a vector holds sub-block j, and element i of every sub-block sits in vector i (the block is
 * transposed), so each lane performs exactly the scalar sequence of operations of its sub-block, sums in the
 * same order included: the results are bitwise the scalar ones, 8 sub-blocks at a time (one AVX2 register).
 * Branches become masks (comparisons give -1/0 lanes) and selects. */
#define LANES_FNS(N)                                                                                         \
    typedef float vf##N __attribute__((vector_size(4 * N)));                                                 \
    typedef int32_t vi##N __attribute__((vector_size(4 * N)));                                               \
    static inline vf##N sel##N(vi##N m, vf##N a, vf##N b)                                                    \
    {                                                                                                        \
        return (vf##N)(((vi##N)a & m) | ((vi##N)b & ~m));                                                    \
    }                                                                                                        \
    static inline vi##N seli##N(vi##N m, vi##N a, vi##N b)                                                   \
    {                                                                                                        \
        return (a & m) | (b & ~m);                                                                           \
    }                                                                                                        \
    static inline vi##N nearest##N(vf##N v)                                                                  \
    {                                                                                                        \
        const vf##N t = v + 12582912.0f;                                                                     \
        return ((vi##N)t & 0x007fffff) - 0x00400000;                                                         \
    }                                                                                                        \
    static inline vi##N clampi##N(vi##N v, int lo, int hi)                                                   \
    {                                                                                                        \
        v = seli##N(v < lo, (vi##N){} + lo, v);                                                              \
        return seli##N(v > hi, (vi##N){} + hi, v);                                                           \
    }                                                                                                        \
    static inline vf##N fabs##N(vf##N v)                                                                     \
    {                                                                                                        \
        return (vf##N)((vi##N)v & 0x7fffffff);                                                               \
    }
LANES_FNS(8)

/* Weighted affine fits of 8 sub-blocks of n elements (x[i], w[i]: element i of each; n <= 32) to scale * L -
 * min with L in [0, nmax] (ggml's make_qkx2_quants per lane; the error is squared, or absolute when mad).
 * Writes the codes to L, the scales to *scale_out and the offsets to *min_out (>= 0, subtracted). (Vectors go
 * out through pointers: a vector return value would change the ABI of builds without AVX, and GCC warns
 * about it.) */
static void fit_affine(int n, int nmax, const vf8 *x, const vf8 *w, vi8 *L, vf8 *scale_out, vf8 *min_out,
                       float rmin, float rdelta, int nstep, bool mad)
{
    vf8 min = x[0], max = x[0];
    vf8 sum_w = w[0];
    vf8 sum_x = sum_w * x[0];
    for (int i = 1; i < n; i++) {
        min = sel8(x[i] < min, x[i], min);
        max = sel8(x[i] > max, x[i], max);
        sum_w += w[i];
        sum_x += w[i] * x[i];
    }
    min = sel8(min > 0, (vf8){}, min);
    const vi8 flat = max == min; /* these lanes return L = 0, scale 0 */
    vf8 iscale = (float)nmax / (max - min);
    vf8 scale = 1 / iscale;
    vf8 best_err = {};
    for (int i = 0; i < n; i++) {
        L[i] = clampi8(nearest8(iscale * (x[i] - min)), 0, nmax);
        const vf8 diff = scale * __builtin_convertvector(L[i], vf8) + min - x[i];
        best_err += w[i] * (mad ? fabs8(diff) : diff * diff);
    }
    for (int is = 0; is <= nstep; is++) {
        iscale = (rmin + rdelta * (float)is + (float)nmax) / (max - min);
        vf8 sum_l = {}, sum_l2 = {}, sum_xl = {};
        vi8 aux[32];
        for (int i = 0; i < n; i++) {
            aux[i] = clampi8(nearest8(iscale * (x[i] - min)), 0, nmax);
            const vf8 l = __builtin_convertvector(aux[i], vf8);
            sum_l += w[i] * l;
            sum_l2 += w[i] * l * l;
            sum_xl += w[i] * l * x[i];
        }
        const vf8 D = sum_w * sum_l2 - sum_l * sum_l;
        vf8 this_scale = (sum_w * sum_xl - sum_x * sum_l) / D;
        vf8 this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D;
        const vi8 pos = this_min > 0;
        this_min = sel8(pos, (vf8){}, this_min);
        this_scale = sel8(pos, sum_xl / sum_l2, this_scale);
        vf8 err = {};
        for (int i = 0; i < n; i++) {
            const vf8 diff = this_scale * __builtin_convertvector(aux[i], vf8) + this_min - x[i];
            err += w[i] * (mad ? fabs8(diff) : diff * diff);
        }
        const vi8 better = (D > 0) & (err < best_err);
        for (int i = 0; i < n; i++) L[i] = seli8(better, aux[i], L[i]);
        best_err = sel8(better, err, best_err);
        scale = sel8(better, this_scale, scale);
        min = sel8(better, this_min, min);
    }
    for (int i = 0; i < n; i++) L[i] = seli8(flat, (vi8){}, L[i]);
    *min_out = -min;
    *scale_out = sel8(flat, (vf8){}, scale);
}

/* The packed 6-bit scales and mins of a Q4_K/Q5_K block (the inverse of block_q4_k_scale_min). */
void kquant_pack_scales_mins(const uint8_t sc[8], const uint8_t mn[8], uint8_t s[K_SCALE_SIZE])
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
    vf8 xt[32], w[32], sum_x2 = {};
    for (int i = 0; i < 32; i++) {
        for (int j = 0; j < 8; j++) xt[i][j] = x[32 * j + i];
        sum_x2 += xt[i] * xt[i];
    }
    vf8 av_x;
    for (int j = 0; j < 8; j++) av_x[j] = sqrtf(sum_x2[j] / 32);
    for (int i = 0; i < 32; i++) w[i] = av_x + fabs8(xt[i]);
    vi8 Lt[32];
    vf8 sub_scale, sub_min;
    fit_affine(32, nmax, xt, w, Lt, &sub_scale, &sub_min, rmin, 0.1f, nstep, false);
    for (int i = 0; i < 32; i++)
        for (int j = 0; j < 8; j++) L[32 * j + i] = (uint8_t)Lt[i][j];
    float max_scale = 0, max_min = 0;
    for (int j = 0; j < 8; j++) {
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
    kquant_pack_scales_mins(sc, mn, scales);
    *d_out = f32_to_f16(max_scale / 63.0f);
    *dmin_out = f32_to_f16(max_min / 63.0f);
    kquant_affine_requantize(x, nmax, *d_out, *dmin_out, scales, L);
}

void kquant_affine_requantize(const float *x, int nmax, uint16_t d16, uint16_t dmin16,
                              const uint8_t scales[K_SCALE_SIZE], uint8_t L[QK_K])
{
    const float d = f16_to_f32(d16), dmin = f16_to_f32(dmin16);
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
        kquant_pack_q4_k(L, b[i].qs);
    }
}

void kquant_pack_q4_k(const uint8_t L[QK_K], uint8_t qs[QK_K / 2])
{
    /* Sub-blocks 2p and 2p+1 share 32 bytes: low nibbles, then high nibbles. */
    for (int p = 0; p < 4; p++)
        for (int l = 0; l < 32; l++) qs[32 * p + l] = (uint8_t)(L[64 * p + l] | L[64 * p + 32 + l] << 4);
}

void row_q5_k_from_f32(const float *x, void *dst, int64_t n)
{
    struct block_q5_k *b = dst;
    for (int64_t i = 0; i < n / QK_K; i++, x += QK_K) {
        uint8_t L[QK_K];
        quantize_affine_block(x, 31, -0.5f, 15, L, &b[i].d, &b[i].dmin, b[i].scales);
        kquant_pack_q5_k(L, b[i].qs, b[i].qh);
    }
}

void kquant_pack_q5_k(const uint8_t L[QK_K], uint8_t qs[QK_K / 2], uint8_t qh[QK_K / 8])
{
    /* As Q4_K, and the fifth bit of element 32s + l (sub-block s) is bit s of qh[l]. */
    memset(qh, 0, QK_K / 8);
    for (int p = 0; p < 4; p++)
        for (int l = 0; l < 32; l++) {
            const uint8_t lo = L[64 * p + l], hi = L[64 * p + 32 + l];
            qs[32 * p + l] = (uint8_t)((lo & 15) | (hi & 15) << 4);
            qh[l] |= (uint8_t)((lo >> 4) << (2 * p) | (hi >> 4) << (2 * p + 1));
        }
}

/* Codes of 8 sub-blocks of 16 (x[i]: element i of each; ggml's make_qx_quants with x^2 weights, rmse_type
 * 1, per lane): L[i] = l + nmax for l in [-nmax, nmax - 1]; *scale_out gets the scales (x ~ scale * l), 0 for
 * an all-zero sub-block. */
static void fit_symmetric(int nmax, const vf8 x[16], vi8 L[16], vf8 *scale_out)
{
    vf8 max = {}, amax = {};
    for (int i = 0; i < 16; i++) {
        const vf8 ax = fabs8(x[i]);
        const vi8 up = ax > amax;
        amax = sel8(up, ax, amax);
        max = sel8(up, x[i], max);
    }
    const vi8 zero = amax < GROUP_MAX_EPS;
    vf8 iscale = (float)-nmax / max;
    vf8 sumlx = {}, suml2 = {};
    for (int i = 0; i < 16; i++) {
        const vi8 l = clampi8(nearest8(iscale * x[i]), -nmax, nmax - 1);
        L[i] = l + nmax;
        const vf8 lf = __builtin_convertvector(l, vf8), w = x[i] * x[i];
        sumlx += w * x[i] * lf;
        suml2 += w * lf * lf;
    }
    vf8 scale = sel8(suml2 != 0, sumlx / suml2, (vf8){});
    vf8 best = scale * sumlx;
    for (int is = -9; is <= 9; is++) {
        if (is == 0) continue;
        iscale = -((float)nmax + 0.1f * (float)is) / max;
        sumlx = suml2 = (vf8){};
        vi8 aux[16];
        for (int i = 0; i < 16; i++) {
            const vi8 l = clampi8(nearest8(iscale * x[i]), -nmax, nmax - 1);
            aux[i] = l + nmax;
            const vf8 lf = __builtin_convertvector(l, vf8), w = x[i] * x[i];
            sumlx += w * x[i] * lf;
            suml2 += w * lf * lf;
        }
        const vi8 better = (suml2 > 0) & (sumlx * sumlx > best * suml2);
        for (int i = 0; i < 16; i++) L[i] = seli8(better, aux[i], L[i]);
        scale = sel8(better, sumlx / suml2, scale);
        best = sel8(better, scale * sumlx, best);
    }
    for (int i = 0; i < 16; i++) L[i] = seli8(zero, (vi8){}, L[i]);
    *scale_out = sel8(zero, (vf8){}, scale);
}

void row_q6_k_from_f32(const float *x, void *dst, int64_t n)
{
    struct block_q6_k *b = dst;
    for (int64_t i = 0; i < n / QK_K; i++, x += QK_K) {
        int8_t L[QK_K];
        float scales[QK_K / 16];
        for (int half = 0; half < 2; half++) { /* sub-blocks 8 * half .. 8 * half + 7 */
            vf8 xt[16];
            vi8 Lt[16];
            for (int e = 0; e < 16; e++)
                for (int j = 0; j < 8; j++) xt[e][j] = x[16 * (8 * half + j) + e];
            vf8 sc;
            fit_symmetric(32, xt, Lt, &sc);
            for (int j = 0; j < 8; j++) scales[8 * half + j] = sc[j];
            for (int e = 0; e < 16; e++)
                for (int j = 0; j < 8; j++) L[16 * (8 * half + j) + e] = (int8_t)Lt[e][j];
        }
        kquant_q6_k_finish(x, scales, L, &b[i]);
    }
}

/* Q6_K from the sub-block fits: the 16 scales as int8 against the largest (d = that scale / -128, f16), the
 * codes L (l + 32) re-quantized with the rounded scales, then packed. */
void kquant_q6_k_finish(const float *x, const float scales[QK_K / 16], int8_t L[QK_K], struct block_q6_k *b)
{
    float max_scale = 0, max_abs_scale = 0;
    for (int ib = 0; ib < QK_K / 16; ib++) {
        if (fabsf(scales[ib]) > max_abs_scale) {
            max_abs_scale = fabsf(scales[ib]);
            max_scale = scales[ib];
        }
    }
    if (max_abs_scale < GROUP_MAX_EPS) {
        memset(b, 0, sizeof *b);
        return;
    }
    const float iscale = -128.0f / max_scale;
    b->d = f32_to_f16(1 / iscale);
    for (int ib = 0; ib < QK_K / 16; ib++) {
        const int s = nearest_int(iscale * scales[ib]);
        b->scales[ib] = (int8_t)(s < 127 ? s : 127);
    }
    const float d = f16_to_f32(b->d);
    for (int j = 0; j < QK_K / 16; j++) {
        const float ds = d * (float)b->scales[j];
        if (ds == 0.0f) continue;
        for (int l = 0; l < 16; l++)
            L[16 * j + l] = (int8_t)(clamp_int(nearest_int(x[16 * j + l] / ds), -32, 31) + 32);
    }
    /* Element 128h + 32g + l (g < 4, l < 32): low nibble in ql[64h + l + 32(g & 1)], nibble g >> 1; high
     * two bits at bit 2g of qh[32h + l]. */
    for (int h = 0; h < 2; h++)
        for (int l = 0; l < 32; l++) {
            const uint8_t *q = (const uint8_t *)L + 128 * h + l;
            b->ql[64 * h + l] = (uint8_t)((q[0] & 15) | (q[64] & 15) << 4);
            b->ql[64 * h + l + 32] = (uint8_t)((q[32] & 15) | (q[96] & 15) << 4);
            b->qh[32 * h + l] =
                (uint8_t)(q[0] >> 4 | (q[32] >> 4) << 2 | (q[64] >> 4) << 4 | (q[96] >> 4) << 6);
        }
}

/* Four 2-bit codes per byte: element 128h + 32g + l (g < 4, l < 32) at bits 2g of qs[32h + l]. */
void kquant_pack_2bit(const uint8_t L[QK_K], uint8_t qs[QK_K / 4])
{
    for (int h = 0; h < 2; h++)
        for (int l = 0; l < 32; l++) {
            const uint8_t *q = L + 128 * h + l;
            qs[32 * h + l] = (uint8_t)(q[0] | q[32] << 2 | q[64] << 4 | q[96] << 6);
        }
}

void row_q2_k_from_f32(const float *x, void *dst, int64_t n)
{
    struct block_q2_k *b = dst;
    for (int64_t i = 0; i < n / QK_K; i++, x += QK_K) {
        uint8_t L[QK_K];
        float scales[QK_K / 16], mins[QK_K / 16];
        for (int half = 0; half < 2; half++) { /* sub-blocks 8 * half .. 8 * half + 7, weights |x| */
            vf8 xt[16], w[16], sc, mn;
            vi8 Lt[16];
            for (int e = 0; e < 16; e++) {
                for (int j = 0; j < 8; j++) xt[e][j] = x[16 * (8 * half + j) + e];
                w[e] = fabs8(xt[e]);
            }
            fit_affine(16, 3, xt, w, Lt, &sc, &mn, -0.5f, 0.1f, 15, true);
            for (int j = 0; j < 8; j++) {
                scales[8 * half + j] = sc[j];
                mins[8 * half + j] = mn[j];
                for (int e = 0; e < 16; e++) L[16 * (8 * half + j) + e] = (uint8_t)Lt[e][j];
            }
        }
        float max_scale = 0, max_min = 0;
        for (int j = 0; j < QK_K / 16; j++) {
            if (scales[j] > max_scale) max_scale = scales[j];
            if (mins[j] > max_min) max_min = mins[j];
        }
        /* 4-bit scales (low nibble) and mins (high nibble); a negative fit wraps through uint8_t as in ggml.
         */
        memset(b[i].scales, 0, sizeof b[i].scales);
        b[i].d = b[i].dmin = 0;
        if (max_scale > 0) {
            const float iscale = 15.0f / max_scale;
            for (int j = 0; j < QK_K / 16; j++) b[i].scales[j] = (uint8_t)nearest_int(iscale * scales[j]);
            b[i].d = f32_to_f16(max_scale / 15.0f);
        }
        if (max_min > 0) {
            const float iscale = 15.0f / max_min;
            for (int j = 0; j < QK_K / 16; j++)
                b[i].scales[j] = (uint8_t)(b[i].scales[j] | nearest_int(iscale * mins[j]) << 4);
            b[i].dmin = f32_to_f16(max_min / 15.0f);
        }
        const float d = f16_to_f32(b[i].d), dmin = f16_to_f32(b[i].dmin);
        for (int j = 0; j < QK_K / 16; j++) {
            const float ds = d * (float)(b[i].scales[j] & 15);
            if (ds == 0.0f) continue; /* the fit's codes stay */
            const float dm = dmin * (float)(b[i].scales[j] >> 4);
            for (int l = 0; l < 16; l++)
                L[16 * j + l] = (uint8_t)clamp_int(nearest_int((x[16 * j + l] + dm) / ds), 0, 3);
        }
        kquant_pack_2bit(L, b[i].qs);
    }
}

/* Symmetric codes of one sub-block of 16 (ggml's make_q3_quants with do_rmse): l in [-4, 3] from the largest
 * magnitude, then up to five passes that move single codes while that raises sumlx^2 / suml2 (the
 * x^2-weighted fit). L gets l + 4; returns the least-squares scale (0 for an all-zero sub-block). */
static float fit_q3(const float *x, uint8_t *L)
{
    float max = 0, amax = 0;
    for (int i = 0; i < 16; i++) {
        const float ax = fabsf(x[i]);
        if (ax > amax) amax = ax, max = x[i];
    }
    if (amax < GROUP_MAX_EPS) {
        memset(L, 0, 16);
        return 0.0f;
    }
    const float iscale = -4.0f / max;
    int q[16];
    float sumlx = 0, suml2 = 0;
    for (int i = 0; i < 16; i++) {
        q[i] = clamp_int(nearest_int(iscale * x[i]), -4, 3);
        const float w = x[i] * x[i];
        sumlx += w * x[i] * (float)q[i];
        suml2 += w * (float)q[i] * (float)q[i];
    }
    for (int itry = 0; itry < 5; itry++) {
        int n_changed = 0;
        for (int i = 0; i < 16; i++) {
            const float w = x[i] * x[i];
            float slx = sumlx - w * x[i] * (float)q[i];
            if (slx > 0) {
                float sl2 = suml2 - w * (float)q[i] * (float)q[i];
                const int nl = clamp_int(nearest_int(x[i] * sl2 / slx), -4, 3);
                if (nl != q[i]) {
                    slx += w * x[i] * (float)nl;
                    sl2 += w * (float)nl * (float)nl;
                    if (sl2 > 0 && slx * slx * suml2 > sumlx * sumlx * sl2) {
                        q[i] = nl, sumlx = slx, suml2 = sl2;
                        n_changed++;
                    }
                }
            }
        }
        if (!n_changed) break;
    }
    for (int i = 0; i < 16; i++) L[i] = (uint8_t)(q[i] + 4);
    return suml2 > 0.0f ? sumlx / suml2 : 0.0f;
}

void row_q3_k_from_f32(const float *x, void *dst, int64_t n)
{
    struct block_q3_k *b = dst;
    for (int64_t i = 0; i < n / QK_K; i++, x += QK_K) {
        uint8_t L[QK_K];
        float scales[QK_K / 16], max_scale = 0, amax = 0;
        for (int j = 0; j < QK_K / 16; j++) {
            scales[j] = fit_q3(x + 16 * j, L + 16 * j);
            if (fabsf(scales[j]) > amax) amax = fabsf(scales[j]), max_scale = scales[j];
        }
        /* 6-bit scales stored with +32: the low nibbles of sub-blocks j and j + 8 share scales[j], the high
         * two bits of sub-block j sit at bit 2(j / 4) of scales[8 + j % 4]. */
        memset(b[i].scales, 0, sizeof b[i].scales);
        b[i].d = 0;
        if (max_scale != 0.0f) {
            const float iscale = -32.0f / max_scale;
            for (int j = 0; j < QK_K / 16; j++) {
                /* Through int8_t first, as ggml does. */
                const int l = clamp_int((int8_t)nearest_int(iscale * scales[j]), -32, 31) + 32;
                b[i].scales[j % 8] |= (uint8_t)((l & 15) << (4 * (j / 8)));
                b[i].scales[8 + j % 4] |= (uint8_t)((l >> 4) << (2 * (j / 4)));
            }
            b[i].d = f32_to_f16(1 / iscale);
        }
        kquant_q3_k_finish(x, L, &b[i]);
    }
}

void kquant_q3_k_finish(const float *x, uint8_t L[QK_K], struct block_q3_k *b)
{
    const float d = f16_to_f32(b->d);
    for (int j = 0; j < QK_K / 16; j++) {
        const float ds = d * (float)(block_q3_k_scale(j, b->scales) - 32);
        if (ds == 0.0f) continue; /* the fit's codes stay */
        for (int l = 0; l < 16; l++)
            L[16 * j + l] = (uint8_t)(clamp_int(nearest_int(x[16 * j + l] / ds), -4, 3) + 4);
    }
    /* The third bit of element j goes to bit j / 32 of hmask[j % 32]; the low two bits as Q2_K. */
    memset(b->hmask, 0, sizeof b->hmask);
    for (int j = 0; j < QK_K; j++)
        if (L[j] > 3) {
            b->hmask[j % 32] |= (uint8_t)(1u << (j / 32));
            L[j] -= 4;
        }
    kquant_pack_2bit(L, b->qs);
}
