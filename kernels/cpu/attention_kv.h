/* attention_kv — how the CPU attention reads K and V: a layer's elements by type (f32, f16, Q8_0 in blocks or
 * in planes) widened to f32, and the dot products and weighted sums over them, 8 lanes and (where the build
 * has AVX-512) 16 lanes (ATT_Z). Every helper takes the element type as a constant and is inlined into
 * attention.c's att_rows_t, the only includer; attention.c's header comment gives the arithmetic's contract.
 */
#ifndef FERRY_KERNELS_CPU_ATTENTION_KV_H
#define FERRY_KERNELS_CPU_ATTENTION_KV_H

#include <stddef.h>
#include <stdint.h>
#if defined(__SSE__)
#include <immintrin.h>
#endif

#include "kernels/cpu/attention.h"
#include "kernels/cpu/vexp.h"
#include "quant/blocks.h"
#include "quant/fp16.h"

/* Vector-passing static helpers are never called across an ABI boundary. */
#pragma GCC diagnostic ignored "-Wpsabi"

/* A layer's K or V as the kernels read it. Passed by value into helpers inlined with et a constant, so the
 * scale pointer costs nothing where it is unused. */
struct kv_data {
    const void *x;     /* (n_blocks - block_base, block_size, n_kv_heads, head_dim) elements or codes */
    const uint16_t *d; /* KV_Q8_0_PLANES: the f16 scales, one per 32 elements of x; unused otherwise */
};

/* The 32-element block holding element i in either Q8_0 layout, and (q8_next) the next block of its row.
 * For KV_Q8_0, d is dead once inlined: that path is the plain block pointer it always was. */
struct q8_blk {
    const void *b;     /* KV_Q8_0: the struct block_q8_0; KV_Q8_0_PLANES: its 32 int8 codes */
    const uint16_t *d; /* KV_Q8_0_PLANES: its f16 scale; KV_Q8_0: NULL (the scale is in b) */
};

static inline struct q8_blk q8_at(struct kv_data s, size_t i, const int et)
{
    if (et == KV_Q8_0) return (struct q8_blk){(const struct block_q8_0 *)s.x + i / QK8_0, NULL};
    return (struct q8_blk){(const int8_t *)s.x + i / QK8_0 * QK8_0, s.d + i / QK8_0};
}

static inline struct q8_blk q8_next(struct q8_blk k, const int et)
{
    if (et == KV_Q8_0) return (struct q8_blk){(const struct block_q8_0 *)k.b + 1, NULL};
    return (struct q8_blk){(const int8_t *)k.b + QK8_0, k.d + 1};
}

/* A block's codes, its scale, and its codes o..o+7 (o a multiple of 8) as f32 without the scale. */
static inline const int8_t *q8_codes(struct q8_blk k, const int et)
{
    return et == KV_Q8_0 ? ((const struct block_q8_0 *)k.b)->qs : (const int8_t *)k.b;
}

static inline float q8_scale(struct q8_blk k, const int et)
{
    const uint16_t d = et == KV_Q8_0 ? ((const struct block_q8_0 *)k.b)->d : *k.d;
#if defined(__F16C__)
    return _cvtsh_ss(d); /* exact, as f16_to_f32 */
#else
    return f16_to_f32(d);
#endif
}

static inline v8f q8_codes8(struct q8_blk k, int o, const int et)
{
    const int8_t *q = q8_codes(k, et) + o;
#if defined(__AVX2__)
    return (v8f)_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)q)));
#else
    v8f c;
    for (int l = 0; l < 8; l++) c[l] = (float)q[l];
    return c;
#endif
}

/* Elements i..i+7 (ld8, i a multiple of 8) or i (ld1) of a K/V array as f32; et (enum kv_elem) is a constant
 * wherever these are inlined. A Q8_0 element (either layout) is d·q, exact in f32 (an f16 times an int8). */
static inline v8f ld8(struct kv_data s, size_t i, const int et)
{
    if (et == KV_F32) return *(const v8fu *)((const float *)s.x + i);
    if (et == KV_Q8_0 || et == KV_Q8_0_PLANES) {
        const struct q8_blk k = q8_at(s, i, et);
        return q8_codes8(k, (int)(i % QK8_0), et) * q8_scale(k, et);
    }
    const uint16_t *h = (const uint16_t *)s.x + i;
#if defined(__F16C__)
    return (v8f)_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)h));
#else
    v8f r;
    for (int l = 0; l < 8; l++) r[l] = f16_to_f32(h[l]);
    return r;
#endif
}

static inline float ld1(struct kv_data s, size_t i, const int et)
{
    if (et == KV_Q8_0 || et == KV_Q8_0_PLANES) {
        const struct q8_blk k = q8_at(s, i, et);
        return (float)q8_codes(k, et)[i % QK8_0] * q8_scale(k, et);
    }
    return et == KV_F16 ? f16_to_f32(((const uint16_t *)s.x)[i]) : ((const float *)s.x)[i];
}

/* The address of element i (KV_Q8_0_PLANES: of its code). */
static inline const void *kv_at(struct kv_data s, size_t i, int et)
{
    if (et == KV_Q8_0) return q8_codes(q8_at(s, i, et), et) + i % QK8_0;
    return (const char *)s.x + i * (et == KV_F32 ? 4 : et == KV_F16 ? 2 : 1);
}

/* Asks for elements i..i+n-1 of a row, one prefetch per `line` elements, and for KV_Q8_0_PLANES also for
 * their scales: n/32 f16 in one cache line for head_dim 64 or 128 (4 or 8 bytes at a multiple of their size),
 * so one prefetch. */
static inline void kv_prefetch(struct kv_data s, size_t i, int n, int line, const int et)
{
    for (int d = 0; d < n; d += line) __builtin_prefetch(kv_at(s, i + d, et));
    if (et == KV_Q8_0_PLANES) __builtin_prefetch(s.d + i / QK8_0);
}

/* q·(K/V elements b..b+d-1). */
static inline __attribute__((always_inline)) float dot(const float *a, struct kv_data kb, size_t b, int d,
                                                       const int et)
{
    v8f acc = {0};
    int i = 0;
    for (; i + 8 <= d; i += 8) acc += *(const v8fu *)(a + i) * ld8(kb, b + i, et);
    float s = ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]));
    for (; i < d; i++) s += a[i] * ld1(kb, b + i, et);
    return s;
}

/* Q8_0 rows (either layout): a[r] += Σ_blocks d_r · (q · codes), for the four rows starting at kb[k + r
 * kstride], r < 4 (d a multiple of 32): the scale once per block and row, not once per element. */
static inline __attribute__((always_inline)) void dot4_q8(v8f *a, const float *q, struct kv_data kb, size_t k,
                                                          size_t kstride, int d, const int et)
{
    struct q8_blk b0 = q8_at(kb, k, et), b1 = q8_at(kb, k + kstride, et), b2 = q8_at(kb, k + 2 * kstride, et),
                  b3 = q8_at(kb, k + 3 * kstride, et);
    for (int b = 0; b < d; b += QK8_0) {
        v8f t0 = {0}, t1 = {0}, t2 = {0}, t3 = {0};
        for (int o = 0; o < QK8_0; o += 8) {
            const v8f qv = *(const v8fu *)(q + b + o);
            t0 += qv * q8_codes8(b0, o, et);
            t1 += qv * q8_codes8(b1, o, et);
            t2 += qv * q8_codes8(b2, o, et);
            t3 += qv * q8_codes8(b3, o, et);
        }
        a[0] += t0 * q8_scale(b0, et);
        a[1] += t1 * q8_scale(b1, et);
        a[2] += t2 * q8_scale(b2, et);
        a[3] += t3 * q8_scale(b3, et);
        b0 = q8_next(b0, et), b1 = q8_next(b1, et), b2 = q8_next(b2, et), b3 = q8_next(b3, et);
    }
}

/* Eight dot products q·k_r (r < 8; row r's elements start at kb[k + r kstride]) with eight independent
 * accumulators (one FMA chain each would leave the FMA units idle on latency); d a multiple of 8 (of 32 for
 * Q8_0). Fixed reduction order. */
static inline __attribute__((always_inline)) void dot8(float *out, const float *q, struct kv_data kb,
                                                       size_t k, size_t kstride, int d, const int et)
{
    v8f a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0}, a4 = {0}, a5 = {0}, a6 = {0}, a7 = {0};
    if (et == KV_Q8_0 || et == KV_Q8_0_PLANES) {
        v8f lo[4] = {0}, hi[4] = {0};
        dot4_q8(lo, q, kb, k, kstride, d, et);
        dot4_q8(hi, q, kb, k + 4 * kstride, kstride, d, et);
        a0 = lo[0], a1 = lo[1], a2 = lo[2], a3 = lo[3], a4 = hi[0], a5 = hi[1], a6 = hi[2], a7 = hi[3];
    } else
        for (int i = 0; i < d; i += 8) {
            const v8f qv = *(const v8fu *)(q + i);
            a0 += qv * ld8(kb, k + i, et);
            a1 += qv * ld8(kb, k + kstride + i, et);
            a2 += qv * ld8(kb, k + 2 * kstride + i, et);
            a3 += qv * ld8(kb, k + 3 * kstride + i, et);
            a4 += qv * ld8(kb, k + 4 * kstride + i, et);
            a5 += qv * ld8(kb, k + 5 * kstride + i, et);
            a6 += qv * ld8(kb, k + 6 * kstride + i, et);
            a7 += qv * ld8(kb, k + 7 * kstride + i, et);
        }
#if defined(__AVX__)
    const __m256 t0 = _mm256_hadd_ps((__m256)a0, (__m256)a1), t1 = _mm256_hadd_ps((__m256)a2, (__m256)a3);
    const __m256 t2 = _mm256_hadd_ps((__m256)a4, (__m256)a5), t3 = _mm256_hadd_ps((__m256)a6, (__m256)a7);
    const __m256 u0 = _mm256_hadd_ps(t0, t1), u1 = _mm256_hadd_ps(t2, t3);
    _mm256_storeu_ps(
        out, _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31)));
#else
    const v8f a[8] = {a0, a1, a2, a3, a4, a5, a6, a7};
    for (int r = 0; r < 8; r++) {
        const v8f v = a[r];
        out[r] = ((v[0] + v[1]) + (v[2] + v[3])) + ((v[4] + v[5]) + (v[6] + v[7]));
    }
#endif
}

/* acc (64) += Σ_j e[j] * v_j (64) for j < len, row j's elements from vb[v + j vstride]: the 64 accumulators
 * stay in registers over the whole chunk (8 independent FMA chains). */
static inline __attribute__((always_inline)) void pv64(float *acc, const float *e, struct kv_data vb,
                                                       size_t v, size_t vstride, int len, const int et)
{
    v8f a0 = *(v8fu *)acc, a1 = *(v8fu *)(acc + 8), a2 = *(v8fu *)(acc + 16), a3 = *(v8fu *)(acc + 24);
    v8f a4 = *(v8fu *)(acc + 32), a5 = *(v8fu *)(acc + 40), a6 = *(v8fu *)(acc + 48),
        a7 = *(v8fu *)(acc + 56);
    /* Q8_0: the weight times each block's scale once (v a multiple of 32: two whole blocks). */
    if (et == KV_Q8_0 || et == KV_Q8_0_PLANES)
        for (int j = 0; j < len; j++) {
            const struct q8_blk b0 = q8_at(vb, v + j * vstride, et), b1 = q8_next(b0, et);
            const float w0 = e[j] * q8_scale(b0, et), w1 = e[j] * q8_scale(b1, et);
            a0 += w0 * q8_codes8(b0, 0, et), a1 += w0 * q8_codes8(b0, 8, et);
            a2 += w0 * q8_codes8(b0, 16, et), a3 += w0 * q8_codes8(b0, 24, et);
            a4 += w1 * q8_codes8(b1, 0, et), a5 += w1 * q8_codes8(b1, 8, et);
            a6 += w1 * q8_codes8(b1, 16, et), a7 += w1 * q8_codes8(b1, 24, et);
        }
    else
        for (int j = 0; j < len; j++) {
            const size_t r = v + j * vstride;
            const float w = e[j];
            a0 += w * ld8(vb, r, et), a1 += w * ld8(vb, r + 8, et);
            a2 += w * ld8(vb, r + 16, et), a3 += w * ld8(vb, r + 24, et);
            a4 += w * ld8(vb, r + 32, et), a5 += w * ld8(vb, r + 40, et);
            a6 += w * ld8(vb, r + 48, et), a7 += w * ld8(vb, r + 56, et);
        }
    *(v8fu *)acc = a0, *(v8fu *)(acc + 8) = a1, *(v8fu *)(acc + 16) = a2, *(v8fu *)(acc + 24) = a3;
    *(v8fu *)(acc + 32) = a4, *(v8fu *)(acc + 40) = a5, *(v8fu *)(acc + 48) = a6, *(v8fu *)(acc + 56) = a7;
}

#if defined(__AVX512F__)
/* ---- AVX-512: 16 lanes (head_dim a multiple of 16) ----
 * The same steps as the 8-lane helpers above, on 16 lanes: half the instructions for the widening of f16
 * (vcvtph2ps) and int8 (vpmovsxbd + vcvtdq2ps) that bound these loops, not memory. For Q8_0 the scales of a
 * chunk's K and V rows are widened once per chunk into a table (q8_scales; the same f32 values from either
 * layout, so the arithmetic of the two stays the same), which the products read as a broadcast operand.
 * An f32 cache keeps the 8-lane code and its results (bound by memory, not by widening). */
#define ATT_Z 1

/* Codes o..o+15 (o 0 or 16) of a block as f32 without the scale. */
static inline __m512 q8_codes16(struct q8_blk k, int o, const int et)
{
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(q8_codes(k, et) + o))));
}

/* Elements i..i+15 of an f16 K/V array as f32 (et is KV_F16: an f32 cache keeps the 8-lane code). */
static inline __m512 ld16(struct kv_data s, size_t i, const int et)
{
    (void)et;
    return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)((const uint16_t *)s.x + i)));
}

/* sc[j nb + b] = the scale of block b < nb of the row at s[k + j kstride], j < n (Q8_0, either layout). */
static inline void q8_scales(float *sc, struct kv_data s, size_t k, size_t kstride, int n, int nb,
                             const int et)
{
    for (int j = 0; j < n; j++) {
        struct q8_blk b = q8_at(s, k + j * kstride, et);
        int i = 0;
        if (et == KV_Q8_0_PLANES) /* contiguous f16: four at a time, exact as one at a time */
            for (; i + 4 <= nb; i += 4)
                _mm_storeu_ps(sc + j * nb + i, _mm_cvtph_ps(_mm_loadl_epi64((const __m128i *)(b.d + i))));
        for (; i < nb; i++) sc[j * nb + i] = q8_scale(q8_at(s, k + j * kstride + (size_t)i * QK8_0, et), et);
    }
}

/* The sum of a's lanes in a fixed order: halves, then eight lanes as dot's 8-lane tree. */
static inline float hsum16(__m512 a)
{
    const __m256 y = _mm256_add_ps(_mm512_castps512_ps256(a),
                                   _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a), 1)));
    const __m128 x =
        _mm_add_ps(_mm256_castps256_ps128(y), _mm256_extractf128_ps(y, 1)); /* (0+4)(1+5)(2+6)(3+7) */
    const __m128 p = _mm_add_ps(x, _mm_movehl_ps(x, x));                    /* (0+2) (1+3) */
    return _mm_cvtss_f32(_mm_add_ss(p, _mm_movehdup_ps(p)));
}

/* q·(K elements b..b+d-1), d a multiple of 16 (32 for Q8_0; ks: the row's nb = d/32 scales). */
static inline __attribute__((always_inline)) float dotz(const float *q, struct kv_data kb, size_t b, int d,
                                                        const float *ks, const int et)
{
    __m512 a = _mm512_setzero_ps();
    if (et == KV_Q8_0 || et == KV_Q8_0_PLANES) {
        struct q8_blk k = q8_at(kb, b, et);
        for (int i = 0; i < d; i += QK8_0, k = q8_next(k, et)) {
            const __m512 t = _mm512_mul_ps(_mm512_loadu_ps(q + i), q8_codes16(k, 0, et));
            a = _mm512_fmadd_ps(_mm512_fmadd_ps(_mm512_loadu_ps(q + i + 16), q8_codes16(k, 16, et), t),
                                _mm512_set1_ps(ks[i / QK8_0]), a);
        }
    } else
        for (int i = 0; i < d; i += 16) a = _mm512_fmadd_ps(_mm512_loadu_ps(q + i), ld16(kb, b + i, et), a);
    return hsum16(a);
}

/* Eight dot products q·k_r as dot8, on 16 lanes; ks: the rows' scales (row r's at ks[r nb], Q8_0 only). */
static inline __attribute__((always_inline)) void dot8z(float *out, const float *q, struct kv_data kb,
                                                        size_t k, size_t kstride, int d, const float *ks,
                                                        int nb, const int et)
{
    __m512 a[8];
#pragma GCC unroll 8
    for (int r = 0; r < 8; r++) a[r] = _mm512_setzero_ps();
    if (et == KV_Q8_0 || et == KV_Q8_0_PLANES) {
        struct q8_blk b[8];
#pragma GCC unroll 8
        for (int r = 0; r < 8; r++) b[r] = q8_at(kb, k + r * kstride, et);
        for (int i = 0; i < d; i += QK8_0) {
            const __m512 q0 = _mm512_loadu_ps(q + i), q1 = _mm512_loadu_ps(q + i + 16);
#pragma GCC unroll 8
            for (int r = 0; r < 8; r++) {
                const __m512 t =
                    _mm512_fmadd_ps(q1, q8_codes16(b[r], 16, et), _mm512_mul_ps(q0, q8_codes16(b[r], 0, et)));
                a[r] = _mm512_fmadd_ps(t, _mm512_set1_ps(ks[r * nb + i / QK8_0]), a[r]);
                b[r] = q8_next(b[r], et);
            }
        }
    } else
        for (int i = 0; i < d; i += 16) {
            const __m512 qv = _mm512_loadu_ps(q + i);
#pragma GCC unroll 8
            for (int r = 0; r < 8; r++) a[r] = _mm512_fmadd_ps(qv, ld16(kb, k + r * kstride + i, et), a[r]);
        }
    /* Halves first, then dot8's 8-lane transpose-and-add. */
    __m256 y[8];
#pragma GCC unroll 8
    for (int r = 0; r < 8; r++)
        y[r] = _mm256_add_ps(_mm512_castps512_ps256(a[r]),
                             _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a[r]), 1)));
    const __m256 t0 = _mm256_hadd_ps(y[0], y[1]), t1 = _mm256_hadd_ps(y[2], y[3]);
    const __m256 t2 = _mm256_hadd_ps(y[4], y[5]), t3 = _mm256_hadd_ps(y[6], y[7]);
    const __m256 u0 = _mm256_hadd_ps(t0, t1), u1 = _mm256_hadd_ps(t2, t3);
    _mm256_storeu_ps(
        out, _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31)));
}

/* acc (16 nz) += Σ_j e[j] * v_j for j < len, row j's elements from vb[v + j vstride], nz (4 or 8) registers
 * of accumulators over the whole chunk. Q8_0: w[j nb + b] = e[j] times the scale of the row's block b (v at a
 * block's start). With 4 registers, even and odd rows go to two sets summed at the end: 8 FMA chains. */
static inline __attribute__((always_inline)) void pvz(float *acc, const float *e, const float *w, int nb,
                                                      struct kv_data vb, size_t v, size_t vstride, int len,
                                                      const int nz, const int et)
{
    __m512 a[8], b[8];
#pragma GCC unroll 8
    for (int z = 0; z < nz; z++) a[z] = _mm512_loadu_ps(acc + 16 * z), b[z] = _mm512_setzero_ps();
    int j = 0;
#define PVZ_ROW(A, J)                                                                                        \
    do {                                                                                                     \
        const size_t r_ = v + (size_t)(J)*vstride;                                                           \
        if (et == KV_Q8_0 || et == KV_Q8_0_PLANES) {                                                         \
            struct q8_blk k_ = q8_at(vb, r_, et);                                                            \
            _Pragma("GCC unroll 4") for (int z = 0; z < nz; z += 2, k_ = q8_next(k_, et))                    \
            {                                                                                                \
                const __m512 w_ = _mm512_set1_ps(w[(J)*nb + z / 2]);                                         \
                A[z] = _mm512_fmadd_ps(w_, q8_codes16(k_, 0, et), A[z]);                                     \
                A[z + 1] = _mm512_fmadd_ps(w_, q8_codes16(k_, 16, et), A[z + 1]);                            \
            }                                                                                                \
        } else {                                                                                             \
            const __m512 e_ = _mm512_set1_ps(e[J]);                                                          \
            _Pragma("GCC unroll 8") for (int z = 0; z < nz; z++) A[z] =                                      \
                _mm512_fmadd_ps(e_, ld16(vb, r_ + 16 * z, et), A[z]);                                        \
        }                                                                                                    \
    } while (0)
    if (nz < 8)
        for (; j + 2 <= len; j += 2) {
            PVZ_ROW(a, j);
            PVZ_ROW(b, j + 1);
        }
    for (; j < len; j++) PVZ_ROW(a, j);
#undef PVZ_ROW
#pragma GCC unroll 8
    for (int z = 0; z < nz; z++) _mm512_storeu_ps(acc + 16 * z, nz < 8 ? _mm512_add_ps(a[z], b[z]) : a[z]);
}
#else
#define ATT_Z 0
#endif

#endif
