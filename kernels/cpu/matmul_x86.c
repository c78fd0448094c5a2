/* matmul_x86 — the quantized products' x86 kernels: AVX2 decoding and x quantization, dot products with AVX2,
 * AVX-VNNI or AVX512-VNNI (each bitwise the portable definition in matmul.c), and the three instruction sets'
 * tables (q8_isa). Chosen at run time by matmul.c (cpuid); compiled for those targets function by function,
 * so the build itself needs none of them. The arithmetic and its error bound: matmul.c's first comment.
 */
#if defined(__x86_64__)
#include <float.h>
#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "kernels/cpu/matmul_impl.h"
#include "quant/blocks.h"
#include "quant/fp16.h"

/* Vector-returning static helpers are never called across an ABI boundary. */
#pragma GCC diagnostic ignored "-Wpsabi"

/* ---- x86: AVX2 decoding and x quantization; dot products with AVX2, AVX-VNNI or AVX512-VNNI -------------
 */
#define T_AVX2    "avx2,fma,f16c"
#define T_AVXVNNI "avx2,fma,f16c,avxvnni"
#define T_VNNI512 "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni"

__attribute__((target(T_AVX2))) static void q8x_row_avx2(const float *x, int k, int8_t *q, int32_t *n4,
                                                         float *dx, float *sxd, int nbp)
{
    const int nb = k / QB;
    const __m256 sign = _mm256_set1_ps(-0.0f), big = _mm256_set1_ps(FLT_MAX);
    const __m256i perm = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    const __m256i ones8 = _mm256_set1_epi8(1), ones16 = _mm256_set1_epi16(1);
    for (int b = 0; b < nb; b++) {
        const float *xb = x + QB * b;
        __m256 v[4], mx = _mm256_setzero_ps(), badv = _mm256_setzero_ps();
        for (int r = 0; r < 4; r++) {
            v[r] = _mm256_loadu_ps(xb + 8 * r);
            const __m256 a = _mm256_andnot_ps(sign, v[r]);
            badv = _mm256_or_ps(badv, _mm256_cmp_ps(a, big, _CMP_NLE_UQ));
            mx = _mm256_max_ps(mx, a);
        }
        __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
        m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        m4 = _mm_max_ss(m4, _mm_shuffle_ps(m4, m4, 1));
        const float amax = _mm_cvtss_f32(m4);
        const int bad = _mm256_movemask_ps(badv) != 0;
        int sum = 0;
        if (bad || amax < Q8_TINY) {
            _mm256_storeu_si256((__m256i *)(q + QB * b), _mm256_setzero_si256());
            _mm256_storeu_si256((__m256i *)(n4 + 8 * b), _mm256_setzero_si256());
        } else {
            const __m256 id = _mm256_set1_ps(127.0f / amax);
            __m256i iv[4];
            for (int r = 0; r < 4; r++) iv[r] = _mm256_cvtps_epi32(_mm256_mul_ps(v[r], id));
            const __m256i p = _mm256_permutevar8x32_epi32(
                _mm256_packs_epi16(_mm256_packs_epi32(iv[0], iv[1]), _mm256_packs_epi32(iv[2], iv[3])), perm);
            _mm256_storeu_si256((__m256i *)(q + QB * b), p);
            const __m256i s4 = _mm256_madd_epi16(_mm256_maddubs_epi16(ones8, p), ones16);
            _mm256_storeu_si256((__m256i *)(n4 + 8 * b), _mm256_sub_epi32(_mm256_setzero_si256(), s4));
            __m128i t = _mm_add_epi32(_mm256_castsi256_si128(s4), _mm256_extracti128_si256(s4, 1));
            t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0x4e));
            t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0xb1));
            sum = _mm_cvtsi128_si32(t);
        }
        dx[b] = bad ? NAN : amax < Q8_TINY ? 0.0f : amax / 127.0f;
        sxd[b] = dx[b] * (float)sum;
    }
    for (int b = nb; b < nbp; b++) dx[b] = sxd[b] = 0.0f;
}

static inline __attribute__((always_inline, target(T_AVX2))) void
dec32_avx2(const uint8_t *w, int c0, int kc, uint8_t *u, float *s, float *mn, size_t bsz, int qoff, int hoff,
           int with_min, int five, int eight)
{
    const __m256i m0f = _mm256_set1_epi8(15), x80 = _mm256_set1_epi8((char)0x80), b10 = _mm256_set1_epi8(16);
    /* Bit e of qh to byte e: byte e of the broadcast word is qh's byte e/8, tested against 1 << (e % 8). */
    const __m256i sel = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2,
                                         2, 3, 3, 3, 3, 3, 3, 3, 3);
    const __m256i bits = _mm256_set1_epi64x(0x8040201008040201LL);
    const uint8_t *bp = w + (size_t)(c0 / QB) * bsz;
    for (int b = 0; b < kc / QB; b++, bp += bsz) {
        uint16_t h[2];
        memcpy(h, bp, 4);
        s[b] = _cvtsh_ss(h[0]);
        if (with_min) mn[b] = _cvtsh_ss(h[1]);
        __m256i v;
        if (eight) {
            v = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(bp + qoff)), x80);
        } else {
            const __m128i q = _mm_loadu_si128((const __m128i *)(bp + qoff));
            v = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(q, 4), q), m0f);
            if (five) {
                uint32_t qh;
                memcpy(&qh, bp + hoff, 4);
                const __m256i hb = _mm256_shuffle_epi8(_mm256_set1_epi32((int)qh), sel);
                v = _mm256_or_si256(
                    v, _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(hb, bits), bits), b10));
            }
        }
        _mm256_store_si256((__m256i *)(u + QB * b), v);
    }
}

/* Bit i of every byte moved to bit 4 (16-bit shifts: the caller's mask keeps each byte's own bit). */
static inline __attribute__((always_inline, target(T_AVX2))) __m256i bit_to_4(__m256i v, int i)
{
    return i <= 4 ? _mm256_sll_epi16(v, _mm_cvtsi32_si128(4 - i))
                  : _mm256_srl_epi16(v, _mm_cvtsi32_si128(i - 4));
}

/* The scales d·sc_i and minimums -(dmin·m_i) of sub-blocks i = 0..7 of the Q4_K/Q5_K super-block at bp (the
 * values dec_q45k_c computes). */
static inline __attribute__((always_inline, target(T_AVX2))) void q45k_scales(const uint8_t *bp, __m256 *s,
                                                                              __m256 *mn)
{
    uint16_t h[2];
    uint32_t a[3];
    memcpy(h, bp, 4);
    memcpy(a, bp + 4, 12);
    /* The 8 scales and 8 minimums (6 bits each) as bytes: sub-blocks 0-3 in the low 6 bits of bytes 0-3
     * (scales) and 4-7 (minimums); 4-7 from the nibbles of bytes 8-11 and the top bits of bytes 0-7. */
    const uint32_t m6 = 0x3f3f3f3fu, m4 = 0x0f0f0f0fu, m2 = 0x03030303u;
    const uint64_t sc = (a[0] & m6) | (uint64_t)((a[2] & m4) | ((a[0] >> 6) & m2) << 4) << 32;
    const uint64_t mi = (a[1] & m6) | (uint64_t)(((a[2] >> 4) & m4) | ((a[1] >> 6) & m2) << 4) << 32;
    const __m256 scf = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128((long long)sc)));
    const __m256 mif = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128((long long)mi)));
    *s = _mm256_mul_ps(_mm256_set1_ps(_cvtsh_ss(h[0])), scf);
    *mn = _mm256_xor_ps(_mm256_mul_ps(_mm256_set1_ps(_cvtsh_ss(h[1])), mif), _mm256_set1_ps(-0.0f));
}

static inline __attribute__((always_inline, target(T_AVX2))) void
dec_q45k_avx2(const uint8_t *w, int c0, int kc, uint8_t *u, float *s, float *mn, int five)
{
    const size_t bsz = five ? sizeof(struct block_q5_k) : sizeof(struct block_q4_k);
    const size_t qs_off = five ? offsetof(struct block_q5_k, qs) : offsetof(struct block_q4_k, qs);
    const __m256i m0f = _mm256_set1_epi8(15), b10 = _mm256_set1_epi8(16);
    const uint8_t *bp = w + (size_t)(c0 / QK_K) * bsz;
    for (int sb = 0; sb < kc / QK_K; sb++, bp += bsz) {
        __m256 sv, mv;
        q45k_scales(bp, &sv, &mv);
        _mm256_storeu_ps(s + 8 * sb, sv);
        _mm256_storeu_ps(mn + 8 * sb, mv);
        __m256i qh = _mm256_setzero_si256();
        if (five) qh = _mm256_loadu_si256((const __m256i *)(bp + offsetof(struct block_q5_k, qh)));
        for (int p = 0; p < 4; p++) {
            const __m256i q = _mm256_loadu_si256((const __m256i *)(bp + qs_off + 32 * p));
            __m256i lo = _mm256_and_si256(q, m0f), hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m0f);
            if (five) { /* bit 2p (low nibbles' sub-block) and 2p + 1 of each qh byte, moved to bit 4 */
                lo = _mm256_or_si256(lo, _mm256_and_si256(bit_to_4(qh, 2 * p), b10));
                hi = _mm256_or_si256(hi, _mm256_and_si256(bit_to_4(qh, 2 * p + 1), b10));
            }
            _mm256_store_si256((__m256i *)(u + QK_K * sb + 64 * p), lo);
            _mm256_store_si256((__m256i *)(u + QK_K * sb + 64 * p + 32), hi);
        }
    }
}

__attribute__((target(T_AVX2))) static void dec_q6k_avx2(const uint8_t *w, int c0, int kc, uint8_t *u,
                                                         float *s, float *mn)
{
    (void)mn;
    const __m256i m0f = _mm256_set1_epi8(15), m30 = _mm256_set1_epi8(0x30);
    const struct block_q6_k *bl = (const struct block_q6_k *)w + c0 / QK_K;
    for (int sb = 0; sb < kc / QK_K; sb++, bl++) {
        const __m256 d = _mm256_set1_ps(_cvtsh_ss(bl->d));
        const __m128i sc = _mm_loadu_si128((const __m128i *)bl->scales);
        _mm256_storeu_ps(s + 16 * sb, _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(sc))));
        _mm256_storeu_ps(s + 16 * sb + 8,
                         _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(sc, 8)))));
        for (int h = 0; h < 2; h++) {
            const __m256i l0 = _mm256_loadu_si256((const __m256i *)(bl->ql + 64 * h));
            const __m256i l1 = _mm256_loadu_si256((const __m256i *)(bl->ql + 64 * h + 32));
            const __m256i qh = _mm256_loadu_si256((const __m256i *)(bl->qh + 32 * h));
            uint8_t *ub = u + QK_K * sb + 128 * h;
            _mm256_store_si256(
                (__m256i *)ub,
                _mm256_or_si256(_mm256_and_si256(l0, m0f), _mm256_and_si256(_mm256_slli_epi16(qh, 4), m30)));
            _mm256_store_si256(
                (__m256i *)(ub + 32),
                _mm256_or_si256(_mm256_and_si256(l1, m0f), _mm256_and_si256(_mm256_slli_epi16(qh, 2), m30)));
            _mm256_store_si256(
                (__m256i *)(ub + 64),
                _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m0f), _mm256_and_si256(qh, m30)));
            _mm256_store_si256((__m256i *)(ub + 96),
                               _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m0f),
                                               _mm256_and_si256(_mm256_srli_epi16(qh, 2), m30)));
        }
    }
}

#define DEC_AVX2(name, call)                                                                                 \
    __attribute__((target(T_AVX2))) static void name(const uint8_t *w, int c0, int kc, uint8_t *u, float *s, \
                                                     float *mn)                                              \
    {                                                                                                        \
        call;                                                                                                \
    }
DEC_AVX2(dec_q8_0_avx2, dec32_avx2(w, c0, kc, u, s, mn, sizeof(struct block_q8_0), 2, 0, 0, 0, 1))
DEC_AVX2(dec_q4_0_avx2, dec32_avx2(w, c0, kc, u, s, mn, sizeof(struct block_q4_0), 2, 0, 0, 0, 0))
DEC_AVX2(dec_q4_1_avx2, dec32_avx2(w, c0, kc, u, s, mn, sizeof(struct block_q4_1), 4, 0, 1, 0, 0))
DEC_AVX2(dec_q5_0_avx2, dec32_avx2(w, c0, kc, u, s, mn, sizeof(struct block_q5_0), 6, 2, 0, 1, 0))
DEC_AVX2(dec_q5_1_avx2, dec32_avx2(w, c0, kc, u, s, mn, sizeof(struct block_q5_1), 8, 4, 1, 1, 0))
DEC_AVX2(dec_q4_k_avx2, dec_q45k_avx2(w, c0, kc, u, s, mn, 0))
DEC_AVX2(dec_q5_k_avx2, dec_q45k_avx2(w, c0, kc, u, s, mn, 1))

/* The lane dot products: lane l of the result = c_l + Σ_{e=4l..4l+3} u_e·x_e (u unsigned, x signed). */
typedef __m256i (*lane_dot_fn)(__m256i c, __m256i u, __m256i x);
static inline __attribute__((always_inline, target(T_AVX2))) __m256i lane_dot_avx2(__m256i c, __m256i u,
                                                                                   __m256i x)
{
    /* pmaddubsw pairs (saturating int16: exact while u·x pairs stay below 32767, true for codes < 128) */
    return _mm256_add_epi32(c, _mm256_madd_epi16(_mm256_maddubs_epi16(u, x), _mm256_set1_epi16(1)));
}
static inline __attribute__((always_inline, target(T_AVXVNNI))) __m256i lane_dot_avxvnni(__m256i c, __m256i u,
                                                                                         __m256i x)
{
    return _mm256_dpbusd_avx_epi32(c, u, x);
}
static inline __attribute__((always_inline, target(T_VNNI512))) __m256i lane_dot_vnni512(__m256i c, __m256i u,
                                                                                         __m256i x)
{
    return _mm256_dpbusd_epi32(c, u, x);
}

/* The affine types' per-block terms: each block's minimum times the sum of x over it, into macc. */
static inline __attribute__((always_inline, target(T_AVX2))) void q8_min_terms(const struct q8_dot *a, int mr)
{
    const struct q8x *x = a->x;
    const struct q8_tile *t = a->t;
    for (int i = 0; i < mr; i++) {
        const float *sxd = x->sxd + (size_t)(a->i0 + i) * x->nbp + a->b0;
        for (int j = 0; j < NRQ; j++) {
            float *mp = a->macc + (i * NRQ + j) * 8;
            __m256 m = a->first ? _mm256_setzero_ps() : _mm256_loadu_ps(mp);
            for (int g = 0; g < a->nb; g += 8)
                m = _mm256_fmadd_ps(_mm256_loadu_ps(&t->mn[j][g]), _mm256_loadu_ps(sxd + g), m);
            _mm256_storeu_ps(mp, m);
        }
    }
}

/* The rows of x a dot body reads (codes, per-4 sums, scales) and its accumulators (zero, or the chunk's
 * running sums). */
static inline __attribute__((always_inline, target(T_AVX2))) void
q8_dot_rows(const struct q8_dot *a, const int mr, const int8_t **xq, const int32_t **n4, const float **dx,
            __m256 (*acc)[NRQ])
{
    const struct q8x *x = a->x;
    for (int i = 0; i < mr; i++) {
        const int r = a->i0 + i;
        xq[i] = x->q + (size_t)r * x->k;
        n4[i] = x->n4 + (size_t)r * x->nb * 8;
        dx[i] = x->dx + (size_t)r * x->nbp;
        for (int j = 0; j < NRQ; j++)
            acc[i][j] = a->first ? _mm256_setzero_ps() : _mm256_loadu_ps(a->acc + (i * NRQ + j) * 16);
    }
}

/* q8_dot_c's arithmetic in 8-lane vectors: mr x NRQ accumulators in registers over the chunk. */
static inline __attribute__((always_inline, target(T_AVX2))) void
q8_dot_body(const struct q8_dot *a, const int mr, const enum q8_mode mode, int sh, lane_dot_fn dot)
{
    const struct q8_tile *t = a->t;
    const int8_t *xq[MRQ];
    const int32_t *n4[MRQ];
    const float *dx[MRQ];
    __m256 acc[MRQ][NRQ];
    q8_dot_rows(a, mr, xq, n4, dx, acc);
    const __m128i shv = _mm_cvtsi32_si128(sh);
    const __m256i x80 = _mm256_set1_epi8((char)0x80);
    for (int b = 0; b < a->nb; b++) {
        const int gb = a->b0 + b;
        __m256i xv[MRQ], cv[MRQ];
        for (int i = 0; i < mr; i++) {
            xv[i] = _mm256_loadu_si256((const __m256i *)(xq[i] + (size_t)QB * gb));
            cv[i] = mode == Q8M_OFF || mode == Q8M_OFF16
                        ? _mm256_sll_epi32(_mm256_loadu_si256((const __m256i *)(n4[i] + 8 * gb)), shv)
                        : _mm256_setzero_si256();
        }
        for (int j = 0; j < NRQ; j++) {
            const __m256i uv = _mm256_load_si256((const __m256i *)(t->u[j] + QB * b));
            const __m256 sv = mode == Q8M_OFF16 ? _mm256_set_m128(_mm_broadcast_ss(&t->s[j][2 * b + 1]),
                                                                  _mm_broadcast_ss(&t->s[j][2 * b]))
                                                : _mm256_broadcast_ss(&t->s[j][b]);
            const __m256i sgn = _mm256_xor_si256(uv, x80); /* Q8M_SIGNED: the int8 value */
            const __m256i au = _mm256_abs_epi8(sgn);
            for (int i = 0; i < mr; i++) {
                const __m256i l = mode == Q8M_SIGNED
                                      ? dot(_mm256_setzero_si256(), au, _mm256_sign_epi8(xv[i], sgn))
                                      : dot(cv[i], uv, xv[i]);
                const __m256 sd = _mm256_mul_ps(sv, _mm256_broadcast_ss(dx[i] + gb));
                acc[i][j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(l), sd, acc[i][j]);
            }
        }
    }
    for (int i = 0; i < mr; i++)
        for (int j = 0; j < NRQ; j++) _mm256_storeu_ps(a->acc + (i * NRQ + j) * 16, acc[i][j]);
    if (mode == Q8M_AFFINE) q8_min_terms(a, mr);
}

/* Q8_KB_LANES: lane b of *h0 (*h1) = the sum of d[b]'s lanes 0-3 (4-7), a block's first (second) 16 elements
 * (integer, exact in any order). */
static inline __attribute__((always_inline, target(T_AVX2))) void kb_halves8(const __m256i *d, __m256i *h0,
                                                                             __m256i *h1)
{
    const __m256i u0 = _mm256_hadd_epi32(_mm256_hadd_epi32(d[0], d[1]), _mm256_hadd_epi32(d[2], d[3]));
    const __m256i u1 = _mm256_hadd_epi32(_mm256_hadd_epi32(d[4], d[5]), _mm256_hadd_epi32(d[6], d[7]));
    *h0 = _mm256_permute2x128_si256(u0, u1, 0x20);
    *h1 = _mm256_permute2x128_si256(u0, u1, 0x31);
}

/* Q8_KB_LANES: lane b of the result = the sum of d[b]'s 8 lanes. */
static inline __attribute__((always_inline, target(T_AVX2))) __m256i kb_reduce8(const __m256i *d)
{
    __m256i h0, h1;
    kb_halves8(d, &h0, &h1);
    return _mm256_add_epi32(h0, h1);
}

/* The 16 scales s[0..15] of 8 blocks (two per block, Q6_K) as the first halves' (*e: s[2b]) and the second
 * halves' (*o: s[2b + 1]). */
static inline __attribute__((always_inline, target(T_AVX2))) void kb_scales16(const float *s, __m256 *e,
                                                                              __m256 *o)
{
    const __m256 a = _mm256_loadu_ps(s), b = _mm256_loadu_ps(s + 8);
    *e = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(a, b, 0x88)), 0xd8));
    *o = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(a, b, 0xdd)), 0xd8));
}

/* q8_xt_fn: per 256 elements an 8x8 transpose of 4-byte groups (the 8 blocks' group g side by side), and the
 * 8 blocks' halves' sums of n4 (kb_halves8). */
__attribute__((target(T_AVX2))) static void q8_xt_avx2(const int8_t *q, const int32_t *n4, int k, int8_t *qt,
                                                       int32_t *n4h)
{
    for (int s = 0; s < k / 256; s++, q += 256, qt += 256, n4 += 64, n4h += 16) {
        __m256i u[8], t[8], v[8];
        for (int b = 0; b < 8; b++) u[b] = _mm256_loadu_si256((const __m256i *)(q + 32 * b));
        for (int c = 0; c < 4; c++) {
            t[2 * c] = _mm256_unpacklo_epi32(u[2 * c], u[2 * c + 1]);
            t[2 * c + 1] = _mm256_unpackhi_epi32(u[2 * c], u[2 * c + 1]);
        }
        for (int c = 0; c < 2; c++) {
            v[4 * c] = _mm256_unpacklo_epi64(t[4 * c], t[4 * c + 2]);
            v[4 * c + 1] = _mm256_unpackhi_epi64(t[4 * c], t[4 * c + 2]);
            v[4 * c + 2] = _mm256_unpacklo_epi64(t[4 * c + 1], t[4 * c + 3]);
            v[4 * c + 3] = _mm256_unpackhi_epi64(t[4 * c + 1], t[4 * c + 3]);
        }
        for (int g = 0; g < 4; g++) {
            _mm256_storeu_si256((__m256i *)(qt + 32 * g), _mm256_permute2x128_si256(v[g], v[4 + g], 0x20));
            _mm256_storeu_si256((__m256i *)(qt + 32 * (4 + g)),
                                _mm256_permute2x128_si256(v[g], v[4 + g], 0x31));
        }
        __m256i d[8], h0, h1;
        for (int b = 0; b < 8; b++) d[b] = _mm256_loadu_si256((const __m256i *)(n4 + 8 * b));
        kb_halves8(d, &h0, &h1);
        _mm256_storeu_si256((__m256i *)n4h, h0);
        _mm256_storeu_si256((__m256i *)(n4h + 8), h1);
    }
}

/* q8_dot_c's Q8_KB_LANES arithmetic on the tile (Q4_K, Q5_K past Q8_DIRECT_M rows; Q6_K, sh 5, at every m):
 * per 8 blocks and (x row, weight row) the 8 blocks' lane sums, reduced to one sum per block (Q6_K: per
 * half), one conversion and one FMA (Q6_K: two) with the 8 blocks' s·dx. */
static inline __attribute__((always_inline, target(T_AVX2))) void
q8_dot_body_kb(const struct q8_dot *a, const int mr, const int off16, int sh, lane_dot_fn dot)
{
    const struct q8_tile *t = a->t;
    const int8_t *xq[MRQ];
    const int32_t *n4[MRQ];
    const float *dx[MRQ];
    __m256 acc[MRQ][NRQ];
    q8_dot_rows(a, mr, xq, n4, dx, acc);
    const __m128i shv = _mm_cvtsi32_si128(sh);
    for (int g = 0; g < a->nb; g += 8) {
        const int gb = a->b0 + g;
        for (int j = 0; j < NRQ; j++) {
            __m256 sv, so;
            if (off16)
                kb_scales16(&t->s[j][2 * g], &sv, &so);
            else
                sv = so = _mm256_loadu_ps(&t->s[j][g]);
            for (int i = 0; i < mr; i++) {
                __m256i d[8];
                for (int b = 0; b < 8; b++)
                    d[b] = dot(off16 ? _mm256_sll_epi32(
                                           _mm256_loadu_si256((const __m256i *)(n4[i] + 8 * (gb + b))), shv)
                                     : _mm256_setzero_si256(),
                               _mm256_load_si256((const __m256i *)(t->u[j] + QB * (g + b))),
                               _mm256_loadu_si256((const __m256i *)(xq[i] + (size_t)QB * (gb + b))));
                const __m256 dxv = _mm256_loadu_ps(dx[i] + gb);
                if (off16) {
                    __m256i h0, h1;
                    kb_halves8(d, &h0, &h1);
                    acc[i][j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(h0), _mm256_mul_ps(sv, dxv), acc[i][j]);
                    acc[i][j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(h1), _mm256_mul_ps(so, dxv), acc[i][j]);
                } else {
                    acc[i][j] =
                        _mm256_fmadd_ps(_mm256_cvtepi32_ps(kb_reduce8(d)), _mm256_mul_ps(sv, dxv), acc[i][j]);
                }
            }
        }
    }
    for (int i = 0; i < mr; i++)
        for (int j = 0; j < NRQ; j++) _mm256_storeu_ps(a->acc + (i * NRQ + j) * 16, acc[i][j]);
    if (!off16) q8_min_terms(a, mr);
}

/* q8_dot_body_kb for any number of x rows, 2 at a time: Q4_K, Q5_K (affine) or Q6_K (OFF16, offset 2^5). */
static inline __attribute__((always_inline, target(T_AVX2))) void
q8_dot_kb(const struct q8_dot *a, int mr, enum q8_mode mode, lane_dot_fn dot)
{
    struct q8_dot b = *a;
    for (int i = 0; i < mr; i += 2) {
        b.i0 = a->i0 + i;
        b.acc = a->acc + (size_t)i * NRQ * 16;
        b.macc = a->macc + (size_t)i * NRQ * 8;
        if (mode == Q8M_OFF16)
            mr - i == 1 ? q8_dot_body_kb(&b, 1, 1, 5, dot) : q8_dot_body_kb(&b, 2, 1, 5, dot);
        else
            mr - i == 1 ? q8_dot_body_kb(&b, 1, 0, 0, dot) : q8_dot_body_kb(&b, 2, 0, 0, dot);
    }
}

#define Q8_CASE(mode, mr, dot)                                                                               \
    case (mode)*8 + (mr):                                                                                    \
        q8_dot_body(a, mr, mode, sh, dot);                                                                   \
        return;
#define Q8_CASES2(mode, dot) Q8_CASE(mode, 1, dot) Q8_CASE(mode, 2, dot)
#define Q8_CASES4(mode, dot) Q8_CASES2(mode, dot) Q8_CASE(mode, 3, dot) Q8_CASE(mode, 4, dot)

__attribute__((target(T_AVX2))) static void q8_dot_avx2(const struct q8_dot *a, int mr, enum q8_mode mode,
                                                        int sh)
{
    if (mode == Q8M_OFF && sh == 7) mode = Q8M_SIGNED; /* Q8_0 */
    if (a->kb) {
        q8_dot_kb(a, mr, mode, lane_dot_avx2);
        return;
    }
    switch (mode * 8 + mr) {
        Q8_CASES2(Q8M_OFF, lane_dot_avx2)
        Q8_CASES2(Q8M_OFF16, lane_dot_avx2)
        Q8_CASES2(Q8M_AFFINE, lane_dot_avx2)
        Q8_CASES2(Q8M_SIGNED, lane_dot_avx2)
    }
}
__attribute__((target(T_AVXVNNI))) static void q8_dot_avxvnni(const struct q8_dot *a, int mr,
                                                              enum q8_mode mode, int sh)
{
    if (a->kb) {
        q8_dot_kb(a, mr, mode, lane_dot_avxvnni);
        return;
    }
    switch (mode * 8 + mr) {
        Q8_CASES2(Q8M_OFF, lane_dot_avxvnni)
        Q8_CASES2(Q8M_OFF16, lane_dot_avxvnni)
        Q8_CASES2(Q8M_AFFINE, lane_dot_avxvnni)
    }
}

/* int8 arithmetic, Q4_K and Q5_K, m <= Q8_DIRECT_M on AVX2 and AVX-VNNI: the codes read in place as in
 * q45k_dot_body512, one weight row and block per 256-bit register, the lane sums by the instruction set's
 * lane_dot as q8_dot_body forms them. Every (x row, weight row) takes q8_dot_body's and q8_min_terms' f32
 * steps in their order (per block fma(lanes, s·dx, acc), s·dx the same product; per super-block fma(mn, sxd,
 * macc)), so the results are bitwise the tile's. A first pass over the chunk's scales puts s·dx on the stack
 * (a broadcast load per block, no shuffle) and finishes macc, so the block pass holds only the 8 accumulators
 * of 2 x rows in the 16 registers. */
static inline __attribute__((always_inline, target(T_AVX2))) void
q45k_dot_body(const struct q8_dot *a, const int mr, const int five, lane_dot_fn dot)
{
    const struct q8x *x = a->x;
    const int8_t *xq[Q8_DIRECT_M];
    float sd[Q8_DIRECT_M][NRQ][KCQ / QB] __attribute__((aligned(32))); /* s·dx per block of the chunk */
    __m256 acc[Q8_DIRECT_M][NRQ];
    const size_t bsz = five ? sizeof(struct block_q5_k) : sizeof(struct block_q4_k);
    const size_t qs_off = five ? offsetof(struct block_q5_k, qs) : offsetof(struct block_q4_k, qs);
    const size_t qh_off = offsetof(struct block_q5_k, qh);
    for (int i = 0; i < mr; i++) {
        const size_t r = (size_t)(a->i0 + i);
        const float *dx = x->dx + r * x->nbp + a->b0, *sxd = x->sxd + r * x->nbp + a->b0;
        xq[i] = x->q + r * x->k + (size_t)QB * a->b0;
        for (int j = 0; j < NRQ; j++) {
            float *mp = a->macc + (i * NRQ + j) * 8;
            __m256 m = a->first ? _mm256_setzero_ps() : _mm256_loadu_ps(mp);
            for (int sb = 0; sb < a->nb / 8; sb++) {
                __m256 s, mn;
                q45k_scales(a->row[j] + (size_t)(a->b0 / 8 + sb) * bsz, &s, &mn);
                _mm256_store_ps(sd[i][j] + 8 * sb, _mm256_mul_ps(s, _mm256_loadu_ps(dx + 8 * sb)));
                m = _mm256_fmadd_ps(mn, _mm256_loadu_ps(sxd + 8 * sb), m);
            }
            _mm256_storeu_ps(mp, m);
            acc[i][j] = a->first ? _mm256_setzero_ps() : _mm256_loadu_ps(a->acc + (i * NRQ + j) * 16);
        }
    }
    const __m256i m0f = _mm256_set1_epi8(15), b10 = _mm256_set1_epi8(16);
    for (int sb = 0; sb < a->nb / 8; sb++) {
        const size_t off = (size_t)(a->b0 / 8 + sb) * bsz;
        for (int j = 0; j < NRQ; j++) {
            __m256i u[8]; /* the super-block's 8 blocks: block 2h the low nibbles of qs[32h ..], 2h + 1 the
                             high */
            const __m256i qh = five ? _mm256_loadu_si256((const __m256i *)(a->row[j] + off + qh_off))
                                    : _mm256_setzero_si256();
#pragma GCC unroll 4
            for (int h = 0; h < 4; h++) {
                const __m256i q = _mm256_loadu_si256((const __m256i *)(a->row[j] + off + qs_off + 32 * h));
                u[2 * h] = _mm256_and_si256(q, m0f);
                u[2 * h + 1] = _mm256_and_si256(_mm256_srli_epi16(q, 4), m0f);
                if (five) { /* bits 2h and 2h + 1 of each qh byte to bit 4, as dec_q45k_avx2 */
                    u[2 * h] = _mm256_or_si256(u[2 * h], _mm256_and_si256(bit_to_4(qh, 2 * h), b10));
                    u[2 * h + 1] =
                        _mm256_or_si256(u[2 * h + 1], _mm256_and_si256(bit_to_4(qh, 2 * h + 1), b10));
                }
            }
            for (int i = 0; i < mr; i++) {
                __m256i d[8];
                for (int b = 0; b < 8; b++)
                    d[b] = dot(_mm256_setzero_si256(), u[b],
                               _mm256_loadu_si256((const __m256i *)(xq[i] + QK_K * sb + QB * b)));
                acc[i][j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(kb_reduce8(d)),
                                            _mm256_load_ps(sd[i][j] + 8 * sb), acc[i][j]);
            }
        }
    }
    for (int i = 0; i < mr; i++)
        for (int j = 0; j < NRQ; j++) _mm256_storeu_ps(a->acc + (i * NRQ + j) * 16, acc[i][j]);
}

#define DIR8_AVX2(name, target_, body, ...)                                                                  \
    __attribute__((target(target_))) static void name(const struct q8_dot *a, int mr, enum q8_mode m_,       \
                                                      int sh)                                                \
    {                                                                                                        \
        (void)m_, (void)sh;                                                                                  \
        if (mr == 1)                                                                                         \
            body(a, 1, __VA_ARGS__);                                                                         \
        else                                                                                                 \
            body(a, 2, __VA_ARGS__);                                                                         \
    }
DIR8_AVX2(dir8_avx2_q4_k, T_AVX2, q45k_dot_body, 0, lane_dot_avx2)
DIR8_AVX2(dir8_avx2_q5_k, T_AVX2, q45k_dot_body, 1, lane_dot_avx2)
DIR8_AVX2(dir8_avxvnni_q4_k, T_AVXVNNI, q45k_dot_body, 0, lane_dot_avxvnni)
DIR8_AVX2(dir8_avxvnni_q5_k, T_AVXVNNI, q45k_dot_body, 1, lane_dot_avxvnni)
/* Q6_K stays on the tile here: the same scheme in place (s·dx as 8 lanes per block from a first pass) was
 * slower (one thread, weights in L2, m = 1: 19.7-20.2 GB/s against 20.6-21.7 through the tile). */
static const q8_dot_fn dir8_avx2[DTYPE_COUNT] = {
    [DTYPE_Q4_K] = dir8_avx2_q4_k, [DTYPE_Q5_K] = dir8_avx2_q5_k};
static const q8_dot_fn dir8_avxvnni[DTYPE_COUNT] = {
    [DTYPE_Q4_K] = dir8_avxvnni_q4_k, [DTYPE_Q5_K] = dir8_avxvnni_q5_k};

/* int8 arithmetic, Q8_0, one row of x, on AVX2 and AVX-VNNI hosts: each weight row of the range read whole,
 * block after block, so a thread reads one sequential stream (llama.cpp's vec_dot order) where the tile reads
 * NRQ rows a chunk at a time. The f32 steps are q8_dot_body's Q8M_SIGNED ones (per block fma(lanes, s·dx,
 * acc) with the same lane sums and the same s·dx product) and q8_task's hsum8, so the results are bitwise the
 * tile's (matmul/q8_0_int8_small_m_equals_tile). */
__attribute__((target(T_AVX2))) static void q8_0_rows_avx2(const struct q8x *x, const uint8_t *w,
                                                           size_t row_bytes, int j_lo, int j_hi, float *y)
{
    for (int j = j_lo; j < j_hi; j++) {
        const uint8_t *bp = w + (size_t)j * row_bytes;
        __m256 acc = _mm256_setzero_ps();
        for (int b = 0; b < x->nb; b++, bp += sizeof(struct block_q8_0)) {
            uint16_t h;
            memcpy(&h, bp, 2);
            const __m256 sv = _mm256_set1_ps(_cvtsh_ss(h));
            const __m256i q = _mm256_loadu_si256((const __m256i *)(bp + 2));
            const __m256i xv = _mm256_loadu_si256((const __m256i *)(x->q + (size_t)QB * b));
            const __m256i l =
                lane_dot_avx2(_mm256_setzero_si256(), _mm256_abs_epi8(q), _mm256_sign_epi8(xv, q));
            const __m256 sd = _mm256_mul_ps(sv, _mm256_broadcast_ss(x->dx + b));
            acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(l), sd, acc);
        }
        float av[8];
        _mm256_storeu_ps(av, acc);
        y[j] = hsum8(av);
    }
}

/* The two 8-lane halves of a 512-bit register, and back (AVX512F only: the f32x8 forms need AVX512DQ). */
static inline __attribute__((always_inline, target(T_VNNI512))) __m512 pair_ps(__m256 lo, __m256 hi)
{
    return _mm512_castpd_ps(
        _mm512_insertf64x4(_mm512_castps_pd(_mm512_castps256_ps512(lo)), _mm256_castps_pd(hi), 1));
}
static inline __attribute__((always_inline, target(T_VNNI512))) __m256 high_ps(__m512 v)
{
    return _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1));
}

/* q8_dot_body's arithmetic with two blocks per 512-bit dot product, conversion and scale product (lanes 0-7
 * block b, 8-15 block b + 1; Q8M_OFF16: a scale per 4 lanes), then the two 8-lane multiply-adds in block
 * order: every lane's operations are q8_dot_body's, so the sums are bitwise equal. */
static inline __attribute__((always_inline, target(T_VNNI512))) void
q8_dot_body512(const struct q8_dot *a, const int mr, const enum q8_mode mode, int sh)
{
    const struct q8_tile *t = a->t;
    const int8_t *xq[MRQ];
    const int32_t *n4[MRQ];
    const float *dx[MRQ];
    __m256 acc[MRQ][NRQ];
    q8_dot_rows(a, mr, xq, n4, dx, acc);
    const __m128i shv = _mm_cvtsi32_si128(sh);
    const __m512i s16_idx = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
    int b = 0;
    for (; b + 1 < a->nb; b += 2) {
        const int gb = a->b0 + b;
        __m512i xv[MRQ], cv[MRQ];
        __m512 dxv[MRQ];
        for (int i = 0; i < mr; i++) {
            xv[i] = _mm512_loadu_si512((const void *)(xq[i] + (size_t)QB * gb));
            cv[i] = mode == Q8M_OFF || mode == Q8M_OFF16
                        ? _mm512_sll_epi32(_mm512_loadu_si512((const void *)(n4[i] + 8 * gb)), shv)
                        : _mm512_setzero_si512();
            dxv[i] = pair_ps(_mm256_set1_ps(dx[i][gb]), _mm256_set1_ps(dx[i][gb + 1]));
        }
        for (int j = 0; j < NRQ; j++) {
            const __m512i uv = _mm512_load_si512((const void *)(t->u[j] + QB * b));
            const __m512 sv =
                mode == Q8M_OFF16 /* s[2b] .. s[2b + 3], four lanes each */
                    ? _mm512_permutexvar_ps(s16_idx, _mm512_castps128_ps512(_mm_loadu_ps(&t->s[j][2 * b])))
                    : pair_ps(_mm256_set1_ps(t->s[j][b]), _mm256_set1_ps(t->s[j][b + 1]));
            for (int i = 0; i < mr; i++) {
                const __m512 l = _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(cv[i], uv, xv[i]));
                const __m512 sd = _mm512_mul_ps(sv, dxv[i]);
                acc[i][j] = _mm256_fmadd_ps(_mm512_castps512_ps256(l), _mm512_castps512_ps256(sd), acc[i][j]);
                acc[i][j] = _mm256_fmadd_ps(high_ps(l), high_ps(sd), acc[i][j]);
            }
        }
    }
    for (; b < a->nb; b++) { /* an odd last block: q8_dot_body's step */
        const int gb = a->b0 + b;
        for (int j = 0; j < NRQ; j++) {
            const __m256i uv = _mm256_load_si256((const __m256i *)(t->u[j] + QB * b));
            const __m256 sv = mode == Q8M_OFF16 ? _mm256_set_m128(_mm_broadcast_ss(&t->s[j][2 * b + 1]),
                                                                  _mm_broadcast_ss(&t->s[j][2 * b]))
                                                : _mm256_broadcast_ss(&t->s[j][b]);
            for (int i = 0; i < mr; i++) {
                const __m256i xv = _mm256_loadu_si256((const __m256i *)(xq[i] + (size_t)QB * gb));
                const __m256i cv =
                    mode == Q8M_OFF || mode == Q8M_OFF16
                        ? _mm256_sll_epi32(_mm256_loadu_si256((const __m256i *)(n4[i] + 8 * gb)), shv)
                        : _mm256_setzero_si256();
                const __m256i l = _mm256_dpbusd_epi32(cv, uv, xv);
                const __m256 sd = _mm256_mul_ps(sv, _mm256_broadcast_ss(dx[i] + gb));
                acc[i][j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(l), sd, acc[i][j]);
            }
        }
    }
    for (int i = 0; i < mr; i++)
        for (int j = 0; j < NRQ; j++) _mm256_storeu_ps(a->acc + (i * NRQ + j) * 16, acc[i][j]);
    if (mode == Q8M_AFFINE) q8_min_terms(a, mr);
}

#define Q8_CASE512(mode, mr)                                                                                 \
    case (mode)*8 + (mr):                                                                                    \
        q8_dot_body512(a, mr, mode, sh);                                                                     \
        return;
#define Q8_CASES512(mode) Q8_CASE512(mode, 1) Q8_CASE512(mode, 2) Q8_CASE512(mode, 3) Q8_CASE512(mode, 4)
__attribute__((target(T_VNNI512))) static void q8_dot_vnni512(const struct q8_dot *a, int mr,
                                                              enum q8_mode mode, int sh)
{
    if (a->kb) { /* (the per-block types take the direct kernels here: not reached) */
        q8_dot_kb(a, mr, mode, lane_dot_vnni512);
        return;
    }
    switch (mode * 8 + mr) {
        Q8_CASES512(Q8M_OFF)
        Q8_CASES512(Q8M_OFF16)
        Q8_CASES512(Q8M_AFFINE)
    }
}
__attribute__((target(T_AVX2))) static void q8_to_f32_avx2(const uint8_t *u, const float *s, const float *mn,
                                                           int kc, enum q8_mode mode, int sh, float *dst)
{
    const __m256 off = _mm256_set1_ps(mode == Q8M_AFFINE     ? 0.0f
                                      : mode == Q8M_AFFINE16 ? 1.0f
                                                             : (float)(1 << sh));
    const int per16 = mode == Q8M_OFF16 || mode == Q8M_AFFINE16;
    for (int e = 0; e < kc; e += 8) {
        const __m256 c = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(u + e))));
        const __m256 sc = _mm256_broadcast_ss(per16 ? &s[e / 16] : &s[e / QB]);
        _mm256_storeu_ps(dst + e,
                         mode == Q8M_AFFINE ? _mm256_fmadd_ps(sc, c, _mm256_broadcast_ss(&mn[e / QB]))
                         : mode == Q8M_AFFINE16
                             ? _mm256_fmadd_ps(sc, _mm256_sub_ps(c, off), _mm256_broadcast_ss(&mn[e / 16]))
                             : _mm256_mul_ps(sc, _mm256_sub_ps(c, off)));
    }
}

/* The f32 arithmetic's per-block terms m'·Σx (8 blocks per vector), after a chunk's blocks. */
static inline __attribute__((always_inline, target(T_AVX2))) void
f32_macc_avx2(const struct q8_dot *a, const int mr, const enum q8_mode mode, int sh)
{
    const __m256 moff = _mm256_set1_ps(-(float)(1 << sh));
    for (int i = 0; i < mr; i++) {
        const float *sx = a->x->sxd + (size_t)(a->i0 + i) * a->x->nbp + a->b0;
        for (int j = 0; j < NRQ; j++) {
            float *mp = a->macc + (i * NRQ + j) * 8;
            __m256 m = a->first ? _mm256_setzero_ps() : _mm256_loadu_ps(mp);
            for (int g = 0; g < a->nb; g += 8) {
                const __m256 mv = mode == Q8M_AFFINE ? _mm256_loadu_ps(&a->t->mn[j][g])
                                                     : _mm256_mul_ps(moff, _mm256_loadu_ps(&a->t->s[j][g]));
                m = _mm256_fmadd_ps(mv, _mm256_loadu_ps(sx + g), m);
            }
            _mm256_storeu_ps(mp, m);
        }
    }
}

/* f32_dot_c's arithmetic in 8-lane vectors: lanes 0-7 (A: elements 0-7 and 16-23) and 8-15 (B: 8-15, 24-31).
 */
static inline __attribute__((always_inline, target(T_AVX2))) void
f32_dot_body(const struct q8_dot *a, const int mr, const enum q8_mode mode, int sh)
{
    const struct q8_tile *t = a->t;
    const float *xr[MRQ];
    __m256 acc[MRQ][NRQ][2];
    for (int i = 0; i < mr; i++) {
        xr[i] = a->xf + (size_t)(a->i0 + i) * a->k;
        for (int j = 0; j < NRQ; j++)
            for (int h = 0; h < 2; h++)
                acc[i][j][h] =
                    a->first ? _mm256_setzero_ps() : _mm256_loadu_ps(a->acc + (i * NRQ + j) * 16 + 8 * h);
    }
    const __m256 coff = _mm256_set1_ps(f32_conv_off(mode, sh));
    for (int b = 0; b < a->nb; b++) {
        const int gb = a->b0 + b;
        for (int j = 0; j < NRQ; j++) {
            __m256 c[4];
            for (int v = 0; v < 4; v++) {
                c[v] = _mm256_cvtepi32_ps(
                    _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(t->u[j] + QB * b + 8 * v))));
                if (mode == Q8M_OFF16 || sh == 7) c[v] = _mm256_sub_ps(c[v], coff);
            }
            for (int i = 0; i < mr; i++) {
                const float *xb = xr[i] + (size_t)QB * gb;
                if (mode == Q8M_OFF16) {
                    const __m256 sa = _mm256_broadcast_ss(&t->s[j][2 * b]),
                                 sb = _mm256_broadcast_ss(&t->s[j][2 * b + 1]);
                    acc[i][j][0] =
                        _mm256_fmadd_ps(sa, _mm256_mul_ps(c[0], _mm256_loadu_ps(xb)), acc[i][j][0]);
                    acc[i][j][1] =
                        _mm256_fmadd_ps(sa, _mm256_mul_ps(c[1], _mm256_loadu_ps(xb + 8)), acc[i][j][1]);
                    acc[i][j][0] =
                        _mm256_fmadd_ps(sb, _mm256_mul_ps(c[2], _mm256_loadu_ps(xb + 16)), acc[i][j][0]);
                    acc[i][j][1] =
                        _mm256_fmadd_ps(sb, _mm256_mul_ps(c[3], _mm256_loadu_ps(xb + 24)), acc[i][j][1]);
                } else {
                    const __m256 sv = _mm256_broadcast_ss(&t->s[j][b]);
                    const __m256 ta = _mm256_fmadd_ps(c[2], _mm256_loadu_ps(xb + 16),
                                                      _mm256_mul_ps(c[0], _mm256_loadu_ps(xb)));
                    const __m256 tb = _mm256_fmadd_ps(c[3], _mm256_loadu_ps(xb + 24),
                                                      _mm256_mul_ps(c[1], _mm256_loadu_ps(xb + 8)));
                    acc[i][j][0] = _mm256_fmadd_ps(sv, ta, acc[i][j][0]);
                    acc[i][j][1] = _mm256_fmadd_ps(sv, tb, acc[i][j][1]);
                }
            }
        }
    }
    for (int i = 0; i < mr; i++)
        for (int j = 0; j < NRQ; j++)
            for (int h = 0; h < 2; h++) _mm256_storeu_ps(a->acc + (i * NRQ + j) * 16 + 8 * h, acc[i][j][h]);
    if (f32_uses_macc(mode, sh)) f32_macc_avx2(a, mr, mode, sh);
}

#define F32_CASE(mode, mr)                                                                                   \
    case (mode)*8 + (mr):                                                                                    \
        f32_dot_body(a, mr, mode, sh);                                                                       \
        return;
__attribute__((target(T_AVX2))) static void f32_dot_avx2(const struct q8_dot *a, int mr, enum q8_mode mode,
                                                         int sh)
{
    switch (mode * 8 + mr) {
        F32_CASE(Q8M_OFF, 1)
        F32_CASE(Q8M_OFF16, 1)
        F32_CASE(Q8M_AFFINE, 1)
    }
}

/* The 32-element types' codes as f32, straight from the weights (AVX-512): the values the tile path converts
 * (Q8_0's code - 128 is its int8 quant), the block's scale and, with a minimum, the minimum. */
typedef void (*src512_fn)(const uint8_t *row, int b, __m512 *c0, __m512 *c1, float *s, float *mn);
#define AI_512 __attribute__((always_inline, target(T_VNNI512)))
static inline AI_512 void src512_q8_0(const uint8_t *row, int b, __m512 *c0, __m512 *c1, float *s, float *mn)
{
    (void)mn;
    const uint8_t *bl = row + 34 * (size_t)b;
    uint16_t d;
    memcpy(&d, bl, 2);
    *s = _cvtsh_ss(d);
    *c0 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(bl + 2))));
    *c1 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(bl + 18))));
}
static inline AI_512 void src512_q4(const uint8_t *row, int b, __m512 *c0, __m512 *c1, float *s, float *mn,
                                    size_t bsz, int qoff, int with_min)
{
    const uint8_t *bl = row + bsz * (size_t)b;
    uint16_t h[2];
    memcpy(h, bl, 4);
    *s = _cvtsh_ss(h[0]);
    if (with_min) *mn = _cvtsh_ss(h[1]);
    const __m512i q = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(bl + qoff)));
    const __m512i lo = _mm512_and_si512(q, _mm512_set1_epi32(15)), hi = _mm512_srli_epi32(q, 4);
    *c0 = _mm512_cvtepi32_ps(lo);
    *c1 = _mm512_cvtepi32_ps(hi);
}
static inline AI_512 void src512_q4_0(const uint8_t *row, int b, __m512 *c0, __m512 *c1, float *s, float *mn)
{
    src512_q4(row, b, c0, c1, s, mn, sizeof(struct block_q4_0), 2, 0);
}
static inline AI_512 void src512_q4_1(const uint8_t *row, int b, __m512 *c0, __m512 *c1, float *s, float *mn)
{
    src512_q4(row, b, c0, c1, s, mn, sizeof(struct block_q4_1), 4, 1);
}
/* f32_dot_c's arithmetic with AVX-512: one 16-lane register per (x row, weight row) holds lanes A and B in
 * the same order, so the sums are bitwise those of the 8-lane kernels, with half the instructions. */
static inline __attribute__((always_inline, target(T_VNNI512))) void
f32_dot_body512(const struct q8_dot *a, const int mr, const enum q8_mode mode, int sh, src512_fn src)
{
    struct q8_tile *t = a->t;
    const float *xr[MRQ];
    __m512 acc[MRQ][NRQ];
    for (int i = 0; i < mr; i++) {
        xr[i] = a->xf + (size_t)(a->i0 + i) * a->k;
        for (int j = 0; j < NRQ; j++)
            acc[i][j] = a->first ? _mm512_setzero_ps() : _mm512_loadu_ps(a->acc + (i * NRQ + j) * 16);
    }
    const __m512 coff = _mm512_set1_ps(f32_conv_off(mode, sh));
    for (int b = 0; b < a->nb; b++) {
        const int gb = a->b0 + b;
        __m512 x0[MRQ], x1[MRQ];
        for (int i = 0; i < mr; i++) {
            x0[i] = _mm512_loadu_ps(xr[i] + QB * gb);
            x1[i] = _mm512_loadu_ps(xr[i] + QB * gb + 16);
        }
        for (int j = 0; j < NRQ; j++) {
            __m512 c0, c1;
            if (src) { /* the same values straight from the weight row; its scale (and minimum) to the tile */
                src(a->row[j], gb, &c0, &c1, &t->s[j][b], &t->mn[j][b]);
            } else {
                c0 = _mm512_cvtepi32_ps(
                    _mm512_cvtepu8_epi32(_mm_load_si128((const __m128i *)(t->u[j] + QB * b))));
                c1 = _mm512_cvtepi32_ps(
                    _mm512_cvtepu8_epi32(_mm_load_si128((const __m128i *)(t->u[j] + QB * b + 16))));
                if (mode == Q8M_OFF16 || sh == 7) c0 = _mm512_sub_ps(c0, coff), c1 = _mm512_sub_ps(c1, coff);
            }
            for (int i = 0; i < mr; i++) {
                if (mode == Q8M_OFF16) {
                    acc[i][j] =
                        _mm512_fmadd_ps(_mm512_set1_ps(t->s[j][2 * b]), _mm512_mul_ps(c0, x0[i]), acc[i][j]);
                    acc[i][j] = _mm512_fmadd_ps(_mm512_set1_ps(t->s[j][2 * b + 1]), _mm512_mul_ps(c1, x1[i]),
                                                acc[i][j]);
                } else {
                    const __m512 tt = _mm512_fmadd_ps(c1, x1[i], _mm512_mul_ps(c0, x0[i]));
                    acc[i][j] = _mm512_fmadd_ps(_mm512_set1_ps(t->s[j][b]), tt, acc[i][j]);
                }
            }
        }
    }
    for (int i = 0; i < mr; i++)
        for (int j = 0; j < NRQ; j++) _mm512_storeu_ps(a->acc + (i * NRQ + j) * 16, acc[i][j]);
    if (f32_uses_macc(mode, sh)) f32_macc_avx2(a, mr, mode, sh);
}

#define F32_CASE512(mode, mr)                                                                                \
    case (mode)*8 + (mr):                                                                                    \
        f32_dot_body512(a, mr, mode, sh, NULL);                                                              \
        return;
#define F32_CASES512(mode) F32_CASE512(mode, 1) F32_CASE512(mode, 2) F32_CASE512(mode, 3) F32_CASE512(mode, 4)
__attribute__((target(T_VNNI512))) static void f32_dot_avx512(const struct q8_dot *a, int mr,
                                                              enum q8_mode mode, int sh)
{
    switch (mode * 8 + mr) {
        F32_CASES512(Q8M_OFF)
        F32_CASES512(Q8M_OFF16)
        F32_CASES512(Q8M_AFFINE)
    }
}

/* f32 arithmetic, 32-element types, m <= MR on AVX-512: codes read in place (no decode pass, no tile). */
#define DIR_CASE(n, mode, type)                                                                              \
    case n:                                                                                                  \
        f32_dot_body512(a, n, mode, sh, src512_##type);                                                      \
        return;
#define DIR_FN(type, mode)                                                                                   \
    __attribute__((target(T_VNNI512))) static void dir512_##type(const struct q8_dot *a, int mr,             \
                                                                 enum q8_mode m_, int sh)                    \
    {                                                                                                        \
        (void)m_;                                                                                            \
        switch (mr) {                                                                                        \
            DIR_CASE(1, mode, type) DIR_CASE(2, mode, type) DIR_CASE(3, mode, type) DIR_CASE(4, mode, type)  \
        }                                                                                                    \
    }
DIR_FN(q8_0, Q8M_OFF)
DIR_FN(q4_0, Q8M_OFF)
DIR_FN(q4_1, Q8M_AFFINE)
/* Q5_0/Q5_1 stay on the tile: their fifth bits by variable shifts made them slower in place (hot L2, m=1:
 * 6.0-6.8 GB/s against 8.6-9.2 through the tile). */
static const q8_dot_fn dir512[DTYPE_COUNT] = {
    [DTYPE_Q8_0] = dir512_q8_0, [DTYPE_Q4_0] = dir512_q4_0, [DTYPE_Q4_1] = dir512_q4_1};

/* int8 arithmetic, Q4_K and Q5_K, m <= Q8_DIRECT_M on AVX512-VNNI: the nibbles (and Q5_K's fifth bits) are
 * read in place (no decode pass, no tile) with two weight rows per 512-bit register (lanes 0-7 row j, 8-15
 * row j + 1; each half holds one block's 8 lanes), the scales and minimums unpacked once per super-block and
 * multiplied by dx 8 blocks at a time. Every lane takes the integer sum and the f32 steps of q8_dot_body512
 * and q8_min_terms in their order (per block fma(lanes, s·dx, acc); per super-block fma(mn, sxd, macc)), so
 * the results are bitwise equal.
 * Saved: the decode pass, the tile's stores and loads, the per-block scale broadcasts (one thread, weights in
 * L2: 1.7x the tile path's rate; kernels/cpu/NOTES.md, 2026-12-02g). */
static inline AI_512 __m512 dup_ps(__m256 v)
{
    return pair_ps(v, v);
}

/* q45k_scales for the super-blocks at pa and pb at once: s and mn hold pa's 8 values in lanes 0-7 and pb's in
 * 8-15 (the same products, so the same bits), the 6-bit fields unpacked by byte shuffles. */
static inline AI_512 void q45k_scales2(const uint8_t *pa, const uint8_t *pb, __m512 *s, __m512 *mn)
{
    /* Per 128-bit lane (one super-block): bytes 0-1 d, 2-3 dmin, 4 + t the packed byte t. Sub-block i's scale
     * is t_i & 63 (i < 4) or (t_{i+4} & 15) | (t_{i-4} >> 6) << 4, its minimum t_{i+4} & 63 or
     * (t_{i+4} >> 4) | (t_i >> 6) << 4: bytes 0-7 of r the scales, 8-15 the minimums. */
    const __m256i v = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)pa)),
                                              _mm_loadu_si128((const __m128i *)pb), 1);
    const __m256i i1 =
        _mm256_broadcastsi128_si256(_mm_setr_epi8(4, 5, 6, 7, 12, 13, 14, 15, 8, 9, 10, 11, 12, 13, 14, 15));
    const __m256i i2 =
        _mm256_broadcastsi128_si256(_mm_setr_epi8(-1, -1, -1, -1, 4, 5, 6, 7, -1, -1, -1, -1, 8, 9, 10, 11));
    const __m256i ma = _mm256_broadcastsi128_si256(_mm_setr_epi32(0x3f3f3f3f, 0x0f0f0f0f, 0x3f3f3f3f, 0));
    const __m256i mb = _mm256_broadcastsi128_si256(_mm_setr_epi32(0, 0, 0, 0x0f0f0f0f));
    const __m256i t1 = _mm256_shuffle_epi8(v, i1), t2 = _mm256_shuffle_epi8(v, i2);
    const __m256i r = _mm256_or_si256(
        _mm256_or_si256(_mm256_and_si256(t1, ma), _mm256_and_si256(_mm256_srli_epi16(t1, 4), mb)),
        _mm256_and_si256(_mm256_srli_epi16(t2, 2), _mm256_set1_epi8(0x30)));
    const __m256i q = _mm256_permute4x64_epi64(r, 0xd8); /* scales a, scales b, minimums a, minimums b */
    const __m512 scf = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm256_castsi256_si128(q)));
    const __m512 mif = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm256_extracti128_si256(q, 1)));
    const __m256i id = _mm256_setr_epi16(0, 0, 0, 0, 0, 0, 0, 0, 8, 8, 8, 8, 8, 8, 8, 8);
    const __m512 d = _mm512_cvtph_ps(_mm256_permutexvar_epi16(id, v));
    const __m512 dmin =
        _mm512_cvtph_ps(_mm256_permutexvar_epi16(_mm256_add_epi16(id, _mm256_set1_epi16(1)), v));
    *s = _mm512_mul_ps(d, scf);
    *mn = _mm512_castsi512_ps(
        _mm512_xor_si512(_mm512_castps_si512(_mm512_mul_ps(dmin, mif)), _mm512_set1_epi32((int)0x80000000u)));
}

/* 32 bytes at p0 and at p1 in one register (lanes 0-7's bytes from p0). */
static inline AI_512 __m512i pair_si(const uint8_t *p0, const uint8_t *p1)
{
    return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)p0)),
                              _mm256_loadu_si256((const __m256i *)p1), 1);
}

/* The codes of blocks 2h (low nibbles) and 2h + 1 of the Q4_K/Q5_K super-blocks at w0 and w1 (a row pair),
 * with Q5_K's fifth bits from qh (pair_si of their qh): bits 2h and 2h + 1 of each qh byte to bit 4, as
 * dec_q45k_avx2 builds the code. */
static inline AI_512 void q45k_codes2(const uint8_t *w0, const uint8_t *w1, int h, __m512i qh, int five,
                                      __m512i *lo, __m512i *hi)
{
    const __m512i m0f = _mm512_set1_epi8(15), b10 = _mm512_set1_epi8(16);
    const size_t qs_off = five ? offsetof(struct block_q5_k, qs) : offsetof(struct block_q4_k, qs);
    const __m512i q = pair_si(w0 + qs_off + 32 * h, w1 + qs_off + 32 * h);
    *lo = _mm512_and_si512(q, m0f);
    *hi = _mm512_and_si512(_mm512_srli_epi16(q, 4), m0f);
    if (five) { /* b10 keeps each byte's own bit */
        const __m512i hb = _mm512_srli_epi16(qh, 2 * h);
        *lo = _mm512_or_si512(*lo, _mm512_and_si512(_mm512_slli_epi16(hb, 4), b10));
        *hi = _mm512_or_si512(*hi, _mm512_and_si512(_mm512_slli_epi16(hb, 3), b10));
    }
}

/* Q8_KB_LANES for a row pair: d[b] holds block b's 8 lane sums of rows 2p (lanes 0-7) and 2p + 1 (8-15); lane
 * b (8 + b) of *h0 (*h1) is the sum of block b's first (second) 16 elements for row 2p (2p + 1). Integer
 * adds, exact in any order. */
static inline AI_512 void kb_halves8_512(const __m512i *d, __m512i *h0, __m512i *h1)
{
    __m512i a[4];
#pragma GCC unroll 4
    for (int q = 0; q < 4; q++) /* per 128 bits: d[2q]'s and d[2q + 1]'s lanes 0 + 2 and 1 + 3 */
        a[q] = _mm512_add_epi32(_mm512_unpacklo_epi32(d[2 * q], d[2 * q + 1]),
                                _mm512_unpackhi_epi32(d[2 * q], d[2 * q + 1]));
    /* per 128 bits k: the sums of lanes 4k .. 4k + 3 of d[0..3] (c0) and d[4..7] (c1) */
    const __m512i c0 = _mm512_add_epi32(_mm512_unpacklo_epi64(a[0], a[1]), _mm512_unpackhi_epi64(a[0], a[1]));
    const __m512i c1 = _mm512_add_epi32(_mm512_unpacklo_epi64(a[2], a[3]), _mm512_unpackhi_epi64(a[2], a[3]));
    *h0 = _mm512_permutex2var_epi64(c0, _mm512_setr_epi64(0, 1, 8, 9, 4, 5, 12, 13), c1);
    *h1 = _mm512_permutex2var_epi64(c0, _mm512_setr_epi64(2, 3, 10, 11, 6, 7, 14, 15), c1);
}

/* Q8_KB_LANES for a row pair: lane b (8 + b) is block b's whole sum for row 2p (2p + 1). */
static inline AI_512 __m512i kb_reduce8_512(const __m512i *d)
{
    __m512i h0, h1;
    kb_halves8_512(d, &h0, &h1);
    return _mm512_add_epi32(h0, h1);
}

/* Codes as q8_dot's Q8_KB_LANES kernels read them, u[b] block b of a row pair (pair_si's order), transposed
 * once so that lane b (8 + b) of tr[g] is group g (elements 4g .. 4g + 3) of block b of the first (second)
 * row: an 8x8 transpose of 4-byte groups in each 256 bits. */
static inline AI_512 void kb_transpose8_512(const __m512i *u, __m512i *tr)
{
    __m512i t[8], v[8];
#pragma GCC unroll 4
    for (int q = 0; q < 4; q++) {
        t[2 * q] = _mm512_unpacklo_epi32(u[2 * q], u[2 * q + 1]);
        t[2 * q + 1] = _mm512_unpackhi_epi32(u[2 * q], u[2 * q + 1]);
    }
#pragma GCC unroll 2
    for (int q = 0; q < 2; q++) {
        v[4 * q] = _mm512_unpacklo_epi64(t[4 * q], t[4 * q + 2]);
        v[4 * q + 1] = _mm512_unpackhi_epi64(t[4 * q], t[4 * q + 2]);
        v[4 * q + 2] = _mm512_unpacklo_epi64(t[4 * q + 1], t[4 * q + 3]);
        v[4 * q + 3] = _mm512_unpackhi_epi64(t[4 * q + 1], t[4 * q + 3]);
    }
    const __m512i lo = _mm512_setr_epi64(0, 1, 8, 9, 4, 5, 12, 13),
                  hi = _mm512_setr_epi64(2, 3, 10, 11, 6, 7, 14, 15);
#pragma GCC unroll 4
    for (int g = 0; g < 4; g++) {
        tr[g] = _mm512_permutex2var_epi64(v[g], lo, v[4 + g]);
        tr[4 + g] = _mm512_permutex2var_epi64(v[g], hi, v[4 + g]);
    }
}

/* five: Q5_K, whose fifth bits (qh) are put on the nibbles as dec_q45k_avx2 does (bit i of qh[l] to bit 4
 * of block i's element l), so the codes and every sum that follows are the tile's. */
static inline AI_512 void q45k_dot_body512(const struct q8_dot *a, const int mr, const int five)
{
    const struct q8x *x = a->x;
    const int8_t *xq[MRQ];
    const float *dx[MRQ], *sxd[MRQ];
    __m512 acc[MRQ][NRQ / 2], macc[MRQ][NRQ / 2]; /* [i][p]: weight rows 2p (lanes 0-7) and 2p + 1 */
    for (int i = 0; i < mr; i++) {
        const size_t r = (size_t)(a->i0 + i);
        xq[i] = x->q + r * x->k + (size_t)QB * a->b0;
        dx[i] = x->dx + r * x->nbp + a->b0;
        sxd[i] = x->sxd + r * x->nbp + a->b0;
        for (int p = 0; p < NRQ / 2; p++) {
            const float *ap = a->acc + (i * NRQ + 2 * p) * 16, *mp = a->macc + (i * NRQ + 2 * p) * 8;
            acc[i][p] =
                a->first ? _mm512_setzero_ps() : pair_ps(_mm256_loadu_ps(ap), _mm256_loadu_ps(ap + 16));
            macc[i][p] =
                a->first ? _mm512_setzero_ps() : pair_ps(_mm256_loadu_ps(mp), _mm256_loadu_ps(mp + 8));
        }
    }
    const size_t bsz = five ? sizeof(struct block_q5_k) : sizeof(struct block_q4_k);
    const size_t qh_off = offsetof(struct block_q5_k, qh);
    for (int sb = 0; sb < a->nb / 8; sb++) {
        const size_t off = (size_t)(a->b0 / 8 + sb) * bsz;
        __m512i qh[NRQ / 2]; /* Q5_K: qh of rows 2p (bytes 0-31) and 2p + 1 */
        for (int p = 0; p < NRQ / 2; p++)
            qh[p] = five ? pair_si(a->row[2 * p] + off + qh_off, a->row[2 * p + 1] + off + qh_off)
                         : _mm512_setzero_si512();
        __m512 sd[MRQ][NRQ / 2]; /* s·dx of the super-block's 8 blocks, rows 2p and 2p + 1 */
#pragma GCC unroll 2
        for (int p = 0; p < NRQ / 2; p++) {
            __m512 sp, mp;
            q45k_scales2(a->row[2 * p] + off, a->row[2 * p + 1] + off, &sp, &mp);
            for (int i = 0; i < mr; i++) {
                sd[i][p] = _mm512_mul_ps(sp, dup_ps(_mm256_loadu_ps(dx[i] + 8 * sb)));
                macc[i][p] = _mm512_fmadd_ps(mp, dup_ps(_mm256_loadu_ps(sxd[i] + 8 * sb)), macc[i][p]);
            }
        }
#pragma GCC unroll 2
        for (int p = 0; p < NRQ / 2; p++) {
            __m512i u[8]; /* the super-block's 8 blocks of rows 2p and 2p + 1 */
#pragma GCC unroll 4
            for (int h = 0; h < 4; h++)
                q45k_codes2(a->row[2 * p] + off, a->row[2 * p + 1] + off, h, qh[p], five, &u[2 * h],
                            &u[2 * h + 1]);
            for (int i = 0; i < mr; i++) {
                __m512i d[8];
#pragma GCC unroll 8
                for (int b = 0; b < 8; b++)
                    d[b] = _mm512_dpbusd_epi32(_mm512_setzero_si512(), u[b],
                                               _mm512_broadcast_i64x4(_mm256_loadu_si256(
                                                   (const __m256i *)(xq[i] + QK_K * sb + QB * b))));
                acc[i][p] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(kb_reduce8_512(d)), sd[i][p], acc[i][p]);
            }
        }
    }
    for (int i = 0; i < mr; i++)
        for (int p = 0; p < NRQ / 2; p++) {
            float *ap = a->acc + (i * NRQ + 2 * p) * 16, *mp = a->macc + (i * NRQ + 2 * p) * 8;
            _mm256_storeu_ps(ap, _mm512_castps512_ps256(acc[i][p]));
            _mm256_storeu_ps(ap + 16, high_ps(acc[i][p]));
            _mm256_storeu_ps(mp, _mm512_castps512_ps256(macc[i][p]));
            _mm256_storeu_ps(mp + 8, high_ps(macc[i][p]));
        }
}

/* int8 arithmetic, Q4_K and Q5_K, any number of x rows per call (prefill and batches), Q8_KB_LANES. Per
 * super-block the 4 weight rows' codes are decoded into 16 registers, transposed so that lane b (8 + b) of
 * register g holds group g (elements 4g .. 4g + 3) of block b of row 2p (2p + 1), and their scales unpacked
 * once; then every x row of the call runs over them, its transposed codes (q8x.qt) against the 8 registers
 * of a row pair: 8 vpdpbusd leave each block's whole sum in its lane, then one conversion and one FMA with
 * s·dx per row pair. The block sums are the direct kernels' (exact integers), the f32 steps theirs in their
 * order, so the results are bitwise q45k_dot_body512's and the tile's. Per x row and super-block of 4 weight
 * rows: 16 vpdpbusd and 10 other vector operations (the per-block steps took 64: kernels/cpu/NOTES.md,
 * 2026-12-07c). acc is packed: row j's 8 lanes at acc + i·NRQ·16 + 8j; macc as everywhere. */
static inline AI_512 void q45k_many512(const struct q8_dot *a, const int mr, const int five)
{
    const struct q8x *x = a->x;
    const size_t bsz = five ? sizeof(struct block_q5_k) : sizeof(struct block_q4_k);
    const size_t qh_off = offsetof(struct block_q5_k, qh);
    for (int sb = 0; sb < a->nb / 8; sb++) {
        const size_t off = (size_t)(a->b0 / 8 + sb) * bsz;
        const int first = a->first && sb == 0;
        __m512i tr[NRQ / 2][8]; /* [p][g]: group g of blocks 0-7, rows 2p and 2p + 1 */
        __m512 sp[NRQ / 2], mp[NRQ / 2];
#pragma GCC unroll 2
        for (int p = 0; p < NRQ / 2; p++) {
            const uint8_t *w0 = a->row[2 * p] + off, *w1 = a->row[2 * p + 1] + off;
            q45k_scales2(w0, w1, &sp[p], &mp[p]);
            const __m512i qh = five ? pair_si(w0 + qh_off, w1 + qh_off) : _mm512_setzero_si512();
            __m512i u[8]; /* block b of the pair */
#pragma GCC unroll 4
            for (int h = 0; h < 4; h++) q45k_codes2(w0, w1, h, qh, five, &u[2 * h], &u[2 * h + 1]);
            kb_transpose8_512(u, tr[p]);
        }
        for (int i = 0; i < mr; i++) {
            const size_t r = (size_t)(a->i0 + i);
            const int gb = a->b0 + 8 * sb;
            const int8_t *xt = x->qt + r * x->k + (size_t)QB * gb;
            const float *dx = x->dx + r * x->nbp + gb, *sxd = x->sxd + r * x->nbp + gb;
            float *ap = a->acc + (size_t)i * NRQ * 16, *mq = a->macc + (size_t)i * NRQ * 8;
            const __m512 dxv = dup_ps(_mm256_loadu_ps(dx)), sxv = dup_ps(_mm256_loadu_ps(sxd));
            /* two chains per row pair (groups 0-3, 4-7), added at the end: integers, so the same sums */
            __m512i c[NRQ / 2][2];
#pragma GCC unroll 2
            for (int p = 0; p < NRQ / 2; p++) c[p][0] = c[p][1] = _mm512_setzero_si512();
#pragma GCC unroll 8
            for (int g = 0; g < 8; g++) {
                const __m512i xv = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(xt + 32 * g)));
#pragma GCC unroll 2
                for (int p = 0; p < NRQ / 2; p++)
                    c[p][g / 4] = _mm512_dpbusd_epi32(c[p][g / 4], tr[p][g], xv);
            }
#pragma GCC unroll 2
            for (int p = 0; p < NRQ / 2; p++) {
                const __m512i cs = _mm512_add_epi32(c[p][0], c[p][1]);
                const __m512 acc = first ? _mm512_setzero_ps() : _mm512_loadu_ps(ap + 16 * p);
                const __m512 mv = first ? _mm512_setzero_ps() : _mm512_loadu_ps(mq + 16 * p);
                _mm512_storeu_ps(mq + 16 * p, _mm512_fmadd_ps(mp[p], sxv, mv));
                _mm512_storeu_ps(ap + 16 * p,
                                 _mm512_fmadd_ps(_mm512_cvtepi32_ps(cs), _mm512_mul_ps(sp[p], dxv), acc));
            }
        }
    }
}

/* The codes of the 4 blocks of elements 128h .. 128h + 127 of the Q6_K super-blocks b0 and b1 (a row pair):
 * the low 4 bits from ql and the high 2 from qh put together as dec_q6k_avx2 does. */
static inline AI_512 void q6k_codes2(const struct block_q6_k *b0, const struct block_q6_k *b1, int h,
                                     __m512i *u)
{
    const __m512i m0f = _mm512_set1_epi8(15), m30 = _mm512_set1_epi8(0x30);
    const __m512i l0 = pair_si(b0->ql + 64 * h, b1->ql + 64 * h),
                  l1 = pair_si(b0->ql + 64 * h + 32, b1->ql + 64 * h + 32),
                  qh = pair_si(b0->qh + 32 * h, b1->qh + 32 * h);
    u[0] = _mm512_or_si512(_mm512_and_si512(l0, m0f), _mm512_and_si512(_mm512_slli_epi16(qh, 4), m30));
    u[1] = _mm512_or_si512(_mm512_and_si512(l1, m0f), _mm512_and_si512(_mm512_slli_epi16(qh, 2), m30));
    u[2] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(l0, 4), m0f), _mm512_and_si512(qh, m30));
    u[3] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(l1, 4), m0f),
                           _mm512_and_si512(_mm512_srli_epi16(qh, 2), m30));
}

/* Q6_K's 16 scales of rows 2p and 2p + 1 (times d) as Q8_KB_LANES takes them: *e the first halves' (lane b:
 * row 2p's block b, 8 + b: row 2p + 1's), *o the second halves'. */
static inline AI_512 void q6k_scales2(const struct block_q6_k *b0, const struct block_q6_k *b1, __m512 *e,
                                      __m512 *o)
{
    const __m512 s0 =
        _mm512_mul_ps(_mm512_set1_ps(_cvtsh_ss(b0->d)),
                      _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)b0->scales))));
    const __m512 s1 =
        _mm512_mul_ps(_mm512_set1_ps(_cvtsh_ss(b1->d)),
                      _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)b1->scales))));
    *e = _mm512_permutex2var_ps(
        s0, _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30), s1);
    *o = _mm512_permutex2var_ps(
        s0, _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31), s1);
}

/* int8 arithmetic, Q6_K, m <= Q8_DIRECT_M on AVX512-VNNI, Q8_KB_LANES: q45k_dot_body512's scheme for Q6_K's
 * codes (the low bits of ql and the two of qh put together as dec_q6k_avx2 does), the offset -32 through the
 * lanes' sums of x (n4·32 starts each dot product); per super-block, row pair and x row the 8 blocks' lane
 * sums reduced to their halves' sums (kb_halves8_512), then two conversions and two FMAs with s·dx (first
 * halves, then second halves), as q8_dot_c and the tile kernels: bitwise equal. */
static inline AI_512 void q6k_dot_body512(const struct q8_dot *a, const int mr)
{
    const struct q8x *x = a->x;
    const int8_t *xq[MRQ];
    const int32_t *n4[MRQ];
    const float *dx[MRQ];
    __m512 acc[MRQ][NRQ / 2]; /* [i][p]: weight rows 2p (lanes 0-7) and 2p + 1 */
    for (int i = 0; i < mr; i++) {
        const size_t r = (size_t)(a->i0 + i);
        xq[i] = x->q + r * x->k + (size_t)QB * a->b0;
        n4[i] = x->n4 + (r * x->nb + a->b0) * 8;
        dx[i] = x->dx + r * x->nbp + a->b0;
        for (int p = 0; p < NRQ / 2; p++) {
            const float *ap = a->acc + (i * NRQ + 2 * p) * 16;
            acc[i][p] =
                a->first ? _mm512_setzero_ps() : pair_ps(_mm256_loadu_ps(ap), _mm256_loadu_ps(ap + 16));
        }
    }
    for (int sb = 0; sb < a->nb / 8; sb++) {
#pragma GCC unroll 2
        for (int p = 0; p < NRQ / 2; p++) {
            const struct block_q6_k *b0 = (const struct block_q6_k *)a->row[2 * p] + a->b0 / 8 + sb,
                                    *b1 = (const struct block_q6_k *)a->row[2 * p + 1] + a->b0 / 8 + sb;
            __m512 se, so;
            q6k_scales2(b0, b1, &se, &so);
            __m512i u[8];
            q6k_codes2(b0, b1, 0, u);
            q6k_codes2(b0, b1, 1, u + 4);
            for (int i = 0; i < mr; i++) {
                __m512i d[8], h0, h1;
#pragma GCC unroll 8
                for (int b = 0; b < 8; b++)
                    d[b] = _mm512_dpbusd_epi32(
                        _mm512_slli_epi32(_mm512_broadcast_i64x4(_mm256_loadu_si256(
                                              (const __m256i *)(n4[i] + 8 * (8 * sb + b)))),
                                          5),
                        u[b],
                        _mm512_broadcast_i64x4(
                            _mm256_loadu_si256((const __m256i *)(xq[i] + QK_K * sb + QB * b))));
                kb_halves8_512(d, &h0, &h1);
                const __m512 dxv = dup_ps(_mm256_loadu_ps(dx[i] + 8 * sb));
                acc[i][p] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(h0), _mm512_mul_ps(se, dxv), acc[i][p]);
                acc[i][p] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(h1), _mm512_mul_ps(so, dxv), acc[i][p]);
            }
        }
    }
    for (int i = 0; i < mr; i++)
        for (int p = 0; p < NRQ / 2; p++) {
            float *ap = a->acc + (i * NRQ + 2 * p) * 16;
            _mm256_storeu_ps(ap, _mm512_castps512_ps256(acc[i][p]));
            _mm256_storeu_ps(ap + 16, high_ps(acc[i][p]));
        }
}

/* int8 arithmetic, Q6_K, any number of x rows per call, Q8_KB_LANES: q45k_many512's scheme (codes of the 4
 * weight rows decoded and transposed once per super-block, then every x row over them: 8 vpdpbusd per row
 * pair, groups 0-3 into one sum and 4-7 into another, which are the blocks' halves) with q6k_dot_body512's
 * scales and f32 steps; each half's sum starts from its offset, -32·Σq over the half (q8x.n4h). Bitwise
 * q6k_dot_body512's and the tile's. acc packed. */
static inline AI_512 void q6k_many512(const struct q8_dot *a, const int mr)
{
    const struct q8x *x = a->x;
    for (int sb = 0; sb < a->nb / 8; sb++) {
        const int first = a->first && sb == 0;
        __m512i tr[NRQ / 2][8]; /* [p][g]: group g of blocks 0-7, rows 2p and 2p + 1 */
        __m512 se[NRQ / 2], so[NRQ / 2];
#pragma GCC unroll 2
        for (int p = 0; p < NRQ / 2; p++) {
            const struct block_q6_k *b0 = (const struct block_q6_k *)a->row[2 * p] + a->b0 / 8 + sb,
                                    *b1 = (const struct block_q6_k *)a->row[2 * p + 1] + a->b0 / 8 + sb;
            q6k_scales2(b0, b1, &se[p], &so[p]);
            __m512i u[8];
            q6k_codes2(b0, b1, 0, u);
            q6k_codes2(b0, b1, 1, u + 4);
            kb_transpose8_512(u, tr[p]);
        }
        for (int i = 0; i < mr; i++) {
            const size_t r = (size_t)(a->i0 + i);
            const int gb = a->b0 + 8 * sb;
            const int8_t *xt = x->qt + r * x->k + (size_t)QB * gb;
            const int32_t *nh = x->n4h + (r * x->nb + gb) * 2;
            float *ap = a->acc + (size_t)i * NRQ * 16;
            const __m512 dxv = dup_ps(_mm256_loadu_ps(x->dx + r * x->nbp + gb));
            const __m512i o0 = _mm512_slli_epi32(
                              _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)nh)), 5),
                          o1 = _mm512_slli_epi32(
                              _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(nh + 8))), 5);
            __m512i c[NRQ / 2][2];
#pragma GCC unroll 2
            for (int p = 0; p < NRQ / 2; p++) c[p][0] = o0, c[p][1] = o1;
#pragma GCC unroll 8
            for (int g = 0; g < 8; g++) {
                const __m512i xv = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(xt + 32 * g)));
#pragma GCC unroll 2
                for (int p = 0; p < NRQ / 2; p++)
                    c[p][g / 4] = _mm512_dpbusd_epi32(c[p][g / 4], tr[p][g], xv);
            }
#pragma GCC unroll 2
            for (int p = 0; p < NRQ / 2; p++) {
                __m512 acc = first ? _mm512_setzero_ps() : _mm512_loadu_ps(ap + 16 * p);
                acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(c[p][0]), _mm512_mul_ps(se[p], dxv), acc);
                acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(c[p][1]), _mm512_mul_ps(so[p], dxv), acc);
                _mm512_storeu_ps(ap + 16 * p, acc);
            }
        }
    }
}

/* int8 arithmetic, Q8_0, any number of x rows per call: the tile's codes (q ^ 0x80, the offset 128 through
 * n4·128 starting each dot product) and f32 steps (per block fma(lanes, s·dx, acc), s·dx the same product) in
 * q45k_many512's loop order over groups of up to 8 blocks: the 4 weight rows' codes in 16 registers (a row
 * pair per register), their scales converted once, then every x row of the call over them; acc packed. So the
 * results are bitwise the tile's. */
static inline AI_512 void q8_0_many512(const struct q8_dot *a, const int mr)
{
    const struct q8x *x = a->x;
    const __m512i x80 = _mm512_set1_epi8((char)0x80);
    const size_t bsz = sizeof(struct block_q8_0);
    for (int g = 0; g < a->nb; g += 8) {
        const int ng = a->nb - g < 8 ? a->nb - g : 8, first = a->first && g == 0;
        __m512i u[NRQ / 2][8]; /* [p][b]: block b of rows 2p (bytes 0-31) and 2p + 1 */
        __m512 sp[NRQ / 2];    /* [p]: the 8 blocks' scales of row 2p (lanes 0-7) and 2p + 1 */
#pragma GCC unroll 2
        for (int p = 0; p < NRQ / 2; p++) {
            const uint8_t *w0 = a->row[2 * p] + (size_t)(a->b0 + g) * bsz,
                          *w1 = a->row[2 * p + 1] + (size_t)(a->b0 + g) * bsz;
            uint16_t h[16] = {0};
#pragma GCC unroll 8
            for (int b = 0; b < 8; b++) {
                if (b >= ng) {
                    u[p][b] = _mm512_setzero_si512();
                    continue;
                }
                memcpy(&h[b], w0 + bsz * b, 2);
                memcpy(&h[8 + b], w1 + bsz * b, 2);
                u[p][b] = _mm512_xor_si512(
                    _mm512_inserti64x4(
                        _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(w0 + bsz * b + 2))),
                        _mm256_loadu_si256((const __m256i *)(w1 + bsz * b + 2)), 1),
                    x80);
            }
            sp[p] = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)h));
        }
        for (int i = 0; i < mr; i++) {
            const size_t r = (size_t)(a->i0 + i);
            const int bg = a->b0 + g;
            const int8_t *xq = x->q + r * x->k + (size_t)QB * bg;
            const int32_t *n4 = x->n4 + (r * x->nb + bg) * 8;
            float *ap = a->acc + (size_t)i * NRQ * 16;
            const __m512 dxv = dup_ps(_mm256_loadu_ps(x->dx + r * x->nbp + bg)); /* zero past nb */
            __m512 acc[NRQ / 2], sd[NRQ / 2];
#pragma GCC unroll 2
            for (int p = 0; p < NRQ / 2; p++) {
                acc[p] = first ? _mm512_setzero_ps() : _mm512_loadu_ps(ap + 16 * p);
                sd[p] = _mm512_mul_ps(sp[p], dxv);
            }
#pragma GCC unroll 8
            for (int b = 0; b < 8; b++) {
                if (b >= ng) break;
                const __m512i sel = _mm512_set_epi32(8 + b, 8 + b, 8 + b, 8 + b, 8 + b, 8 + b, 8 + b, 8 + b,
                                                     b, b, b, b, b, b, b, b);
                const __m512i xv = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(xq + QB * b)));
                const __m512i cv = _mm512_slli_epi32(
                    _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(n4 + 8 * b))), 7);
#pragma GCC unroll 2
                for (int p = 0; p < NRQ / 2; p++) {
                    const __m512 l = _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(cv, u[p][b], xv));
                    acc[p] = _mm512_fmadd_ps(l, _mm512_permutexvar_ps(sel, sd[p]), acc[p]);
                }
            }
#pragma GCC unroll 2
            for (int p = 0; p < NRQ / 2; p++) _mm512_storeu_ps(ap + 16 * p, acc[p]);
        }
    }
}

/* q45k_dot_body512 instantiated for 1 to 4 rows of x. */
static inline AI_512 void q45k_dot_mr512(const struct q8_dot *a, int mr, const int five)
{
    switch (mr) {
    case 1:
        q45k_dot_body512(a, 1, five);
        return;
    case 2:
        q45k_dot_body512(a, 2, five);
        return;
    case 3:
        q45k_dot_body512(a, 3, five);
        return;
    default:
        q45k_dot_body512(a, 4, five);
        return;
    }
}

/* int8 arithmetic, Q4_1, m <= Q8_DIRECT_M on AVX512-VNNI: the nibbles read in place (no decode pass, no tile)
 * with two weight rows per 512-bit register (lanes 0-7 row 2p, 8-15 row 2p + 1: one block's 8 lanes each, the
 * low nibbles in lanes 0-3, the high in 4-7 as the tile holds them). A first pass over the chunk gathers the
 * blocks' scales and minimums (8 blocks per masked gather) into the tile and puts s·dx on the stack; then per
 * block one vpdpbusd per row pair and x row and one 16-lane FMA: every lane takes q8_dot_body512's integer
 * sum and f32 steps in its order (per block fma(lanes, s·dx, acc), the same s·dx product), the minimums
 * q8_min_terms' steps, so the results are bitwise the tile's. Q4_0 stays on the tile: the same scheme with
 * its offset lanes was no faster there (kernels/cpu/NOTES.md, 2026-12-07d). */
static inline AI_512 void q4_1_dot_body512(const struct q8_dot *a, const int mr)
{
    const struct q8x *x = a->x;
    struct q8_tile *t = a->t;
    const size_t bsz = sizeof(struct block_q4_1), qoff = offsetof(struct block_q4_1, qs);
    float sd[Q8_DIRECT_M][NRQ][KCQ / QB]; /* s·dx per block of the chunk */
    const int8_t *xq[Q8_DIRECT_M];
    const __m256i boff =
        _mm256_mullo_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), _mm256_set1_epi32((int)bsz));
    for (int j = 0; j < NRQ; j++) { /* each block's first 4 bytes: d and m (f16) */
        const uint8_t *bp = a->row[j] + bsz * (size_t)a->b0;
        for (int b = 0; b < a->nb; b += 8, bp += 8 * bsz) {
            const __mmask8 km = a->nb - b >= 8 ? 0xff : (__mmask8)((1u << (a->nb - b)) - 1);
            const __m256i g = _mm256_mmask_i32gather_epi32(_mm256_setzero_si256(), km, boff, bp, 1);
            _mm256_storeu_ps(&t->s[j][b], _mm256_cvtph_ps(_mm256_cvtepi32_epi16(g)));
            _mm256_storeu_ps(&t->mn[j][b], _mm256_cvtph_ps(_mm256_cvtepi32_epi16(_mm256_srli_epi32(g, 16))));
        }
    }
    __m512 acc[Q8_DIRECT_M][NRQ / 2];
    for (int i = 0; i < mr; i++) {
        const size_t r = (size_t)(a->i0 + i);
        const float *dx = x->dx + r * x->nbp + a->b0;
        xq[i] = x->q + r * x->k + (size_t)QB * a->b0;
        for (int j = 0; j < NRQ; j++) {
            int b = 0;
            for (; b + 16 <= a->nb; b += 16)
                _mm512_storeu_ps(sd[i][j] + b,
                                 _mm512_mul_ps(_mm512_loadu_ps(&t->s[j][b]), _mm512_loadu_ps(dx + b)));
            for (; b < a->nb; b++) sd[i][j][b] = t->s[j][b] * dx[b];
        }
        for (int p = 0; p < NRQ / 2; p++)
            acc[i][p] = a->first ? _mm512_setzero_ps()
                                 : pair_ps(_mm256_loadu_ps(a->acc + (i * NRQ + 2 * p) * 16),
                                           _mm256_loadu_ps(a->acc + (i * NRQ + 2 * p + 1) * 16));
    }
    const __m512i sh4 = _mm512_setr_epi64(0, 0, 4, 4, 0, 0, 4, 4), m0f = _mm512_set1_epi8(15);
    for (int b = 0; b < a->nb; b++) {
        __m512i xv[Q8_DIRECT_M];
        for (int i = 0; i < mr; i++)
            xv[i] = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(xq[i] + QB * b)));
        const size_t off = bsz * (size_t)(a->b0 + b) + qoff;
        for (int p = 0; p < NRQ / 2; p++) {
            /* 128-bit lanes: row 2p's 16 bytes twice, row 2p + 1's twice; the second copy of each shifted
             * down a nibble, then the low nibbles kept: codes 0-15 then 16-31 of each row */
            const __m512i q = _mm512_inserti64x4(
                _mm512_castsi256_si512(
                    _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(a->row[2 * p] + off)))),
                _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(a->row[2 * p + 1] + off))), 1);
            const __m512i u = _mm512_and_si512(_mm512_srlv_epi64(q, sh4), m0f);
            for (int i = 0; i < mr; i++) {
                const __m512 s = _mm512_mask_broadcastss_ps(_mm512_set1_ps(sd[i][2 * p][b]), 0xff00,
                                                            _mm_load_ss(&sd[i][2 * p + 1][b]));
                const __m512i l = _mm512_dpbusd_epi32(_mm512_setzero_si512(), u, xv[i]);
                acc[i][p] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(l), s, acc[i][p]);
            }
        }
    }
    for (int i = 0; i < mr; i++)
        for (int p = 0; p < NRQ / 2; p++) {
            _mm256_storeu_ps(a->acc + (i * NRQ + 2 * p) * 16, _mm512_castps512_ps256(acc[i][p]));
            _mm256_storeu_ps(a->acc + (i * NRQ + 2 * p + 1) * 16, high_ps(acc[i][p]));
        }
    q8_min_terms(a, mr);
}

__attribute__((target(T_VNNI512))) static void dir8_512_q6_k(const struct q8_dot *a, int mr, enum q8_mode m_,
                                                             int sh)
{
    (void)m_, (void)sh;
    if (mr == 1)
        q6k_dot_body512(a, 1);
    else
        q6k_dot_body512(a, 2);
}
/* A dot kernel (q8_dot_fn) that calls body with the call's arguments. */
#define DOT512(name, body)                                                                                   \
    __attribute__((target(T_VNNI512))) static void name(const struct q8_dot *a, int mr, enum q8_mode m_,     \
                                                        int sh)                                              \
    {                                                                                                        \
        (void)m_, (void)sh;                                                                                  \
        body;                                                                                                \
    }
DOT512(dir8_512_q4_1, mr == 1 ? q4_1_dot_body512(a, 1) : q4_1_dot_body512(a, 2))
DOT512(dir8_512_q4_k, q45k_dot_mr512(a, mr, 0))
DOT512(dir8_512_q5_k, q45k_dot_mr512(a, mr, 1))
static const q8_dot_fn dir8_512[DTYPE_COUNT] = {[DTYPE_Q4_1] = dir8_512_q4_1,
                                                [DTYPE_Q4_K] = dir8_512_q4_k,
                                                [DTYPE_Q5_K] = dir8_512_q5_k,
                                                [DTYPE_Q6_K] = dir8_512_q6_k};
/* Past Q8_DIRECT_M rows, all of a task's x rows per call over each super-block's codes decoded once into
 * registers: faster than the tile and than 4 x rows per call for Q8_0, Q4_K, Q5_K and Q6_K at m = 3 to 128
 * (kernels/cpu/NOTES.md, 2026-12-07). */
DOT512(many8_512_q4_k, q45k_many512(a, mr, 0))
DOT512(many8_512_q5_k, q45k_many512(a, mr, 1))
DOT512(many8_512_q6_k, q6k_many512(a, mr))
DOT512(many8_512_q8_0, q8_0_many512(a, mr))
static const q8_dot_fn dir8_any_512[DTYPE_COUNT] = {[DTYPE_Q8_0] = many8_512_q8_0,
                                                    [DTYPE_Q4_K] = many8_512_q4_k,
                                                    [DTYPE_Q5_K] = many8_512_q5_k,
                                                    [DTYPE_Q6_K] = many8_512_q6_k};

/* ---- the instruction sets --------------------------------------------------------------------------------
 */

static const q8_dec_fn decs_avx2[DTYPE_COUNT] = {
    [DTYPE_Q8_0] = dec_q8_0_avx2,          [DTYPE_Q4_0] = dec_q4_0_avx2,
    [DTYPE_Q4_1] = dec_q4_1_avx2,          [DTYPE_Q5_0] = dec_q5_0_avx2,
    [DTYPE_Q5_1] = dec_q5_1_avx2,          [DTYPE_Q4_K] = dec_q4_k_avx2,
    [DTYPE_Q5_K] = dec_q5_k_avx2,          [DTYPE_Q6_K] = dec_q6k_avx2,
    [DTYPE_Q2_K] = q8_dec_q2_k_avx2,       [DTYPE_Q3_K] = q8_dec_q3_k_avx2,
    [DTYPE_IQ4_NL] = q8_dec_iq4_nl_avx2,   [DTYPE_IQ4_XS] = q8_dec_iq4_xs_avx2,
    [DTYPE_MXFP4] = q8_dec_mxfp4_avx2,     [DTYPE_NVFP4] = q8_dec_nvfp4_avx2,
    [DTYPE_IQ3_S] = q8_dec_iq3_s_avx2,     [DTYPE_IQ2_XS] = q8_dec_iq2_xs_avx2,
    [DTYPE_IQ2_XXS] = q8_dec_iq2_xxs_avx2, [DTYPE_IQ3_XXS] = q8_dec_iq3_xxs_avx2,
    [DTYPE_IQ2_S] = q8_dec_iq2_s_avx2,     [DTYPE_IQ1_S] = q8_dec_iq1_s_avx2,
    [DTYPE_IQ1_M] = q8_dec_iq1_m_avx2};

const struct q8_isa q8_isa_avx2 = {"avx2",         decs_avx2,      q8x_row_avx2, {f32_dot_avx2, q8_dot_avx2},
                                   {1, 2},         q8_to_f32_avx2, NULL,         dir8_avx2,
                                   q8_0_rows_avx2, NULL,           NULL};
const struct q8_isa q8_isa_avxvnni = {
    "avx-vnni",     decs_avx2,      q8x_row_avx2, {f32_dot_avx2, q8_dot_avxvnni},
    {1, 2},         q8_to_f32_avx2, NULL,         dir8_avxvnni,
    q8_0_rows_avx2, NULL,           NULL};
const struct q8_isa q8_isa_avx512vnni = {
    "avx512-vnni", decs_avx2,      q8x_row_avx2, {f32_dot_avx512, q8_dot_vnni512},
    {MRQ, MRQ},    q8_to_f32_avx2, dir512,       dir8_512,
    NULL,          dir8_any_512,   q8_xt_avx2};

#endif /* __x86_64__ */
