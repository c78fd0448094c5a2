/* qref — host references for the quantized CUDA products (C++, test-only): random GGUF blocks with sane
 * scales, the int8 quantization of x exactly as kernels/cuda/matmul_q.cu does it, and the unit view of a
 * weight matrix through kernels/cuda/qblock.cuh (whose decoders tests/cuda/test_qblock.cc checks bitwise
 * against quant/dequant.c).
 *
 * x quantization (per row, per block of 32 elements): amax = max |x|, dx = amax / 127, id = amax > 0 ? 127 /
 * amax : 0, xq = rint(x * id) (round half to even), sx = the sum of the 32 f32 x, sq_lo / sq_hi = the sums of
 * xq over elements 0..15 / 16..31. Every step is one IEEE operation, so the device and this code agree
 * bitwise on dx and xq (sx is summed in another order: it differs in its last bits, which the tolerances
 * cover).
 */
#ifndef FERRY_TEST_QREF_H
#define FERRY_TEST_QREF_H

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda/qblock.cuh"

extern "C" {
#include "kernels/core/dtype.h"
#include "kernels/core/status.h"
#include "quant/dequant.h"
}

static uint64_t qref_rng = 0x243F6A8885A308D3ull;
static inline void qref_seed(uint64_t s)
{
    qref_rng = s * 0x9E3779B97F4A7C15ull + 0x632BE59BD9B4E019ull;
}
static inline uint64_t qref_u64(void)
{
    qref_rng ^= qref_rng << 13;
    qref_rng ^= qref_rng >> 7;
    qref_rng ^= qref_rng << 17;
    return qref_rng;
}
/* Uniform in [-1, 1). */
static inline float qref_frand(void)
{
    return (float)((double)(qref_u64() >> 11) * 0x1.0p-53 * 2.0 - 1.0);
}

/* A sane non-zero f16 scale: random sign, magnitude 2^-12 .. 2^-2 (so products of realistic size). */
static inline uint16_t qref_scale(void)
{
    const float mag = ldexpf(1.0f + 0.999f * (qref_frand() + 1.0f) * 0.5f, -12 + (int)(qref_u64() % 11));
    return f32_to_f16(qref_u64() & 1 ? mag : -mag);
}

static inline void qref_put16(uint8_t *p, uint16_t v)
{
    memcpy(p, &v, 2);
}

/* nb random blocks of type t at w: random quant bytes, sane f16 scales and minima (never zero). */
static inline void qref_random_blocks(enum dtype t, uint8_t *w, int64_t nb)
{
    const size_t bs = dtype_type_size(t);
    for (int64_t b = 0; b < nb; b++) {
        uint8_t *p = w + (size_t)b * bs;
        for (size_t i = 0; i < bs; i++) p[i] = (uint8_t)qref_u64();
        switch (t) {
        case DTYPE_Q6_K:
            qref_put16(p + 208, qref_scale());
            break;
        case DTYPE_Q3_K:
            qref_put16(p + 108, qref_scale());
            break;
        case DTYPE_Q2_K:
            qref_put16(p + 80, qref_scale());
            qref_put16(p + 82, qref_scale());
            break;
        case DTYPE_MXFP4: /* exponents 2^-20 .. 2^-1 */
            p[0] = (uint8_t)(108 + qref_u64() % 20);
            break;
        case DTYPE_NVFP4: /* UE4M3 scales below 2^3 (random bytes otherwise: subnormal, 0 and 0x7F included)
                           */
            for (int s = 0; s < 4; s++) p[s] = (uint8_t)(qref_u64() % 0x50);
            break;
        case DTYPE_IQ1_M: { /* the f16 d in the top nibbles of the four scale words */
            const uint16_t d = qref_scale();
            for (int s = 0; s < 4; s++)
                p[49 + 2 * s] = (uint8_t)((p[49 + 2 * s] & 0x0F) | ((d >> (4 * s)) & 15) << 4);
            break;
        }
        case DTYPE_Q4_1:
        case DTYPE_Q5_1:
        case DTYPE_Q4_K:
        case DTYPE_Q5_K:
            qref_put16(p, qref_scale());
            qref_put16(p + 2, qref_scale());
            break;
        default:
            qref_put16(p, qref_scale());
            break;
        }
    }
}

/* x (m, k) quantized as the kernels do; arrays sized m*k and m*k/32. */
struct qref_xq {
    int8_t *q;
    float *dx, *sx;    /* sx: the f32 sum in element order (the kernel adds pairwise: last bits differ) */
    double *sxd, *sxa; /* the exact sum of x and the sum of |x| (the scale of any f32 summation error) */
    int *sq_lo, *sq_hi;
};

static inline void qref_quantize_x(const float *x, int m, int k, struct qref_xq *o)
{
    const size_t nu = (size_t)m * k / 32;
    o->q = (int8_t *)malloc((size_t)m * k);
    o->dx = (float *)malloc(nu * 4);
    o->sx = (float *)malloc(nu * 4);
    o->sxd = (double *)malloc(nu * sizeof(double));
    o->sxa = (double *)malloc(nu * sizeof(double));
    o->sq_lo = (int *)malloc(nu * sizeof(int));
    o->sq_hi = (int *)malloc(nu * sizeof(int));
    for (size_t u = 0; u < nu; u++) {
        const float *xs = x + 32 * u;
        float amax = 0.0f, s = 0.0f;
        double sd = 0, sa = 0;
        for (int i = 0; i < 32; i++) {
            amax = fmaxf(amax, fabsf(xs[i]));
            s += xs[i];
            sd += xs[i];
            sa += fabs(xs[i]);
        }
        const float dx = amax / 127.0f, id = amax > 0.0f ? 127.0f / amax : 0.0f;
        int lo = 0, hi = 0;
        for (int i = 0; i < 32; i++) {
            const int q = (int)rintf(xs[i] * id);
            o->q[32 * u + i] = (int8_t)q;
            (i < 16 ? lo : hi) += q;
        }
        o->dx[u] = dx;
        o->sx[u] = s;
        o->sxd[u] = sd;
        o->sxa[u] = sa;
        o->sq_lo[u] = lo;
        o->sq_hi[u] = hi;
    }
}

static inline void qref_free_xq(struct qref_xq *o)
{
    free(o->q);
    free(o->dx);
    free(o->sx);
    free(o->sxd);
    free(o->sxa);
    free(o->sq_lo);
    free(o->sq_hi);
}

/* Unit U (elements 32U .. 32U+31) of a row of Q blocks, through the piece loader. */
template <class Q> static inline void qref_unit(const uint8_t *row, int U, qb_unit &u)
{
    const uint8_t *blk = row + (size_t)(32 * U / Q::QK) * Q::BYTES;
    const int e = 32 * U % Q::QK;
    for (int p = 0; p < Q::PPB; p++)
        for (int v = 0; v < Q::UPP; v++)
            if (Q::unit_elem(p, v) == e) {
                typename Q::raw r;
                Q::load(r, blk, p);
                Q::unit(r, p, v, u);
                return;
            }
    abort(); /* a unit no piece covers: a bug in the traits */
}

/* The dp4a path's result in double: per unit d(i) * (q_i + QOFF) * dx * xq_i summed exactly, plus m * sx;
 * absum gets the sum of the magnitudes of those terms (the scale of the f32 rounding). */
template <class Q>
static inline void qref_q8_row(const uint8_t *wrow, const struct qref_xq *xq, int xrow, int k, double *y,
                               double *absum)
{
    double s = 0, a = 0;
    for (int U = 0; U < k / 32; U++) {
        qb_unit u;
        qref_unit<Q>(wrow, U, u);
        const size_t xu = (size_t)xrow * (k / 32) + U;
        double t = 0, ta = 0;
        for (int i = 0; i < 32; i++) {
            const int q = (int)(int8_t)(u.q[i >> 2] >> (8 * (i & 3))) + Q::QOFF;
            const double v = (double)(i < 16 ? u.d0 : u.d1) * q * xq->q[(size_t)xrow * k + 32 * U + i];
            t += v;
            ta += fabs(v);
        }
        s += t * xq->dx[xu];
        a += ta * xq->dx[xu];
        if (Q::TWO_M) {
            const double mt = ((double)u.m * xq->sq_lo[xu] + (double)u.m1 * xq->sq_hi[xu]) * xq->dx[xu];
            s += mt;
            a += fabs((double)u.m * xq->sq_lo[xu] * xq->dx[xu]) +
                 fabs((double)u.m1 * xq->sq_hi[xu] * xq->dx[xu]);
        } else if (Q::HAS_M) {
            s += (double)u.m * xq->sx[xu];
            a += fabs((double)u.m * xq->sx[xu]);
        }
    }
    *y = s;
    *absum = a;
}

/* Bound on |result of the int8 path - exact product| from x's quantization: every element is off by at most
 * dx/2, and its weight without the minimum, d(i) * (q_i + QOFF), multiplies that; with the minimum for TWO_M
 * types (Q2_K), whose minimums multiply Σxq·dx rather than the f32 Σx. */
template <class Q>
static inline double qref_q8_bound_row(const uint8_t *wrow, const struct qref_xq *xq, int xrow, int k)
{
    double b = 0;
    for (int U = 0; U < k / 32; U++) {
        qb_unit u;
        qref_unit<Q>(wrow, U, u);
        double t = 0;
        for (int i = 0; i < 32; i++) {
            const int q = (int)(int8_t)(u.q[i >> 2] >> (8 * (i & 3))) + Q::QOFF;
            t += Q::TWO_M ? fabs((double)qb_value<Q>(u, i)) : fabs((double)(i < 16 ? u.d0 : u.d1) * q);
        }
        b += t * 0.5 * xq->dx[(size_t)xrow * (k / 32) + U];
    }
    return b;
}

/* Runs F<Q>(args...) for the trait of t; returns 0 when t is not a quantized type of QB_TYPES. */
#define QREF_DISPATCH(t, F, ...)                                                                             \
    [&]() -> int {                                                                                           \
        switch (t) {                                                                                         \
        case DTYPE_Q4_0:                                                                                     \
            F<qb_q4_0>(__VA_ARGS__);                                                                         \
            return 1;                                                                                        \
        case DTYPE_Q4_1:                                                                                     \
            F<qb_q4_1>(__VA_ARGS__);                                                                         \
            return 1;                                                                                        \
        case DTYPE_Q5_0:                                                                                     \
            F<qb_q5_0>(__VA_ARGS__);                                                                         \
            return 1;                                                                                        \
        case DTYPE_Q5_1:                                                                                     \
            F<qb_q5_1>(__VA_ARGS__);                                                                         \
            return 1;                                                                                        \
        case DTYPE_Q8_0:                                                                                     \
            F<qb_q8_0>(__VA_ARGS__);                                                                         \
            return 1;                                                                                        \
        case DTYPE_Q4_K:                                                                                     \
            F<qb_q4_k>(__VA_ARGS__);                                                                         \
            return 1;                                                                                        \
        case DTYPE_Q5_K:                                                                                     \
            F<qb_q5_k>(__VA_ARGS__);                                                                         \
            return 1;                                                                                        \
        case DTYPE_Q6_K:                                                                                     \
            F<qb_q6_k>(__VA_ARGS__);                                                                         \
            return 1;                                                                                        \
        case DTYPE_Q2_K:                                                                                     \
            F<qb_q2_k>(__VA_ARGS__);                                                                         \
            return 1;                                                                                        \
        case DTYPE_Q3_K:                                                                                     \
            F<qb_q3_k>(__VA_ARGS__);                                                                         \
            return 1;                                                                                        \
        case DTYPE_IQ4_NL:                                                                                   \
            F<qb_iq4_nl>(__VA_ARGS__);                                                                       \
            return 1;                                                                                        \
        case DTYPE_IQ4_XS:                                                                                   \
            F<qb_iq4_xs>(__VA_ARGS__);                                                                       \
            return 1;                                                                                        \
        case DTYPE_MXFP4:                                                                                    \
            F<qb_mxfp4>(__VA_ARGS__);                                                                        \
            return 1;                                                                                        \
        case DTYPE_NVFP4:                                                                                    \
            F<qb_nvfp4>(__VA_ARGS__);                                                                        \
            return 1;                                                                                        \
        case DTYPE_IQ2_XXS:                                                                                  \
            F<qb_iq2_xxs>(__VA_ARGS__);                                                                      \
            return 1;                                                                                        \
        case DTYPE_IQ2_XS:                                                                                   \
            F<qb_iq2_xs>(__VA_ARGS__);                                                                       \
            return 1;                                                                                        \
        case DTYPE_IQ2_S:                                                                                    \
            F<qb_iq2_s>(__VA_ARGS__);                                                                        \
            return 1;                                                                                        \
        case DTYPE_IQ3_XXS:                                                                                  \
            F<qb_iq3_xxs>(__VA_ARGS__);                                                                      \
            return 1;                                                                                        \
        case DTYPE_IQ3_S:                                                                                    \
            F<qb_iq3_s>(__VA_ARGS__);                                                                        \
            return 1;                                                                                        \
        case DTYPE_IQ1_S:                                                                                    \
            F<qb_iq1_s>(__VA_ARGS__);                                                                        \
            return 1;                                                                                        \
        case DTYPE_IQ1_M:                                                                                    \
            F<qb_iq1_m>(__VA_ARGS__);                                                                        \
            return 1;                                                                                        \
        default:                                                                                             \
            return 0;                                                                                        \
        }                                                                                                    \
    }()

static const enum dtype qref_types[] = {
    DTYPE_Q4_0,    DTYPE_Q4_1,   DTYPE_Q5_0,  DTYPE_Q5_1,    DTYPE_Q8_0,   DTYPE_Q4_K,  DTYPE_Q5_K,
    DTYPE_Q6_K,    DTYPE_Q2_K,   DTYPE_Q3_K,  DTYPE_IQ4_NL,  DTYPE_IQ4_XS, DTYPE_MXFP4, DTYPE_NVFP4,
    DTYPE_IQ2_XXS, DTYPE_IQ2_XS, DTYPE_IQ2_S, DTYPE_IQ3_XXS, DTYPE_IQ3_S,  DTYPE_IQ1_S, DTYPE_IQ1_M};
#define QREF_NTYPES (int)(sizeof qref_types / sizeof qref_types[0])

#endif
