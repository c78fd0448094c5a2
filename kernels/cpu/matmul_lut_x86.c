/* matmul_lut_x86 — AVX2 tile decoders of the table and grid types (matmul_lut.c's portable decoders are the
 * definition): Q2_K, Q3_K, IQ4_NL, IQ4_XS, MXFP4, NVFP4, IQ3_XXS, IQ3_S, IQ2_XXS, IQ2_XS, IQ2_S, IQ1_S,
 * IQ1_M. Each writes
 * the same codes, scales and minimums as the portable decoder, byte for byte and bit for bit (the scales by
 * the same f32 expressions, NVFP4's as the same bits built directly), so the int8 and f32 products that read
 * the tile are unchanged on every instruction set; the AVX2, AVX-VNNI and AVX512-VNNI tables (matmul_x86.c)
 * list them. Codes come 32 per 256-bit register: bit fields by shifts and masks, tables by byte shuffles,
 * grid rows by one load per 4 or 8 elements and the signs as byte masks. Compiled for AVX2 function by
 * function (the build itself needs no -mavx2); chosen at run time.
 */
#if defined(__x86_64__)
#include <immintrin.h>
#include <string.h>

#include "kernels/cpu/matmul_impl.h"
#include "quant/blocks.h"
#include "quant/fp16.h"
#include "quant/iq_tables.h"

/* Vector-returning static helpers are never called across an ABI boundary. */
#pragma GCC diagnostic ignored "-Wpsabi"

#define T_AVX2 "avx2,fma,f16c"

/* 8 f32 scales d·v[0..7] from 8 signed bytes. */
__attribute__((target(T_AVX2))) static inline void scales8(float d, const int8_t *v, float *s)
{
    const __m128i b = _mm_loadl_epi64((const __m128i *)v);
    _mm256_storeu_ps(s, _mm256_mul_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b))));
}

/* ---- K-quants of 2 and 3 bits ---- */

__attribute__((target(T_AVX2))) void q8_dec_q2_k_avx2(const uint8_t *w, int c0, int kc, uint8_t *u, float *s,
                                                      float *mn)
{
    const struct block_q2_k *b = (const struct block_q2_k *)w + c0 / QK_K;
    const __m256i m3 = _mm256_set1_epi8(3), one = _mm256_set1_epi8(1);
    const __m128i m15 = _mm_set1_epi8(15);
    for (int sb = 0; sb < kc / QK_K; sb++, b++, u += QK_K, s += 16, mn += 16) {
        const __m256 d = _mm256_set1_ps(_cvtsh_ss(b->d));
        const __m256 nm = _mm256_set1_ps(-_cvtsh_ss(b->dmin)); /* -(dmin·m) = (-dmin)·m exactly */
        const __m128i sc = _mm_loadu_si128((const __m128i *)b->scales);
        const __m128i lo = _mm_and_si128(sc, m15), hi = _mm_and_si128(_mm_srli_epi16(sc, 4), m15);
        _mm256_storeu_ps(s, _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(lo))));
        _mm256_storeu_ps(s + 8,
                         _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(lo, 8)))));
        _mm256_storeu_ps(mn, _mm256_mul_ps(nm, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(hi))));
        _mm256_storeu_ps(mn + 8,
                         _mm256_mul_ps(nm, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(hi, 8)))));
        for (int h = 0; h < 2; h++) {
            const __m256i q = _mm256_loadu_si256((const __m256i *)(b->qs + 32 * h));
            uint8_t *ub = u + 128 * h;
            _mm256_storeu_si256((__m256i *)ub, _mm256_add_epi8(_mm256_and_si256(q, m3), one));
            _mm256_storeu_si256((__m256i *)(ub + 32),
                                _mm256_add_epi8(_mm256_and_si256(_mm256_srli_epi16(q, 2), m3), one));
            _mm256_storeu_si256((__m256i *)(ub + 64),
                                _mm256_add_epi8(_mm256_and_si256(_mm256_srli_epi16(q, 4), m3), one));
            _mm256_storeu_si256((__m256i *)(ub + 96),
                                _mm256_add_epi8(_mm256_and_si256(_mm256_srli_epi16(q, 6), m3), one));
        }
    }
}

__attribute__((target(T_AVX2))) void q8_dec_q3_k_avx2(const uint8_t *w, int c0, int kc, uint8_t *u, float *s,
                                                      float *mn)
{
    (void)mn;
    const struct block_q3_k *b = (const struct block_q3_k *)w + c0 / QK_K;
    const __m256i m3 = _mm256_set1_epi8(3), c4 = _mm256_set1_epi8(4);
    for (int sb = 0; sb < kc / QK_K; sb++, b++, u += QK_K, s += 16) {
        /* block_q3_k_scale of t = 0..15 as bytes, four at a time: the low nibbles of bytes 0-7, then their
         * high nibbles, each with its two bits of bytes 8-11 on top; minus 32 */
        uint32_t a[3], v[4];
        memcpy(a, b->scales, 12);
        const uint32_t m2 = 0x03030303u, m4 = 0x0f0f0f0fu;
        v[0] = (a[0] & m4) | ((a[2] & m2) << 4);
        v[1] = (a[1] & m4) | (((a[2] >> 2) & m2) << 4);
        v[2] = ((a[0] >> 4) & m4) | (((a[2] >> 4) & m2) << 4);
        v[3] = ((a[1] >> 4) & m4) | (((a[2] >> 6) & m2) << 4);
        int8_t sc[16];
        _mm_storeu_si128((__m128i *)sc, _mm_sub_epi8(_mm_loadu_si128((const __m128i *)v), _mm_set1_epi8(32)));
        const float d = _cvtsh_ss(b->d);
        scales8(d, sc, s);
        scales8(d, sc + 8, s + 8);
        const __m256i hm = _mm256_loadu_si256((const __m256i *)b->hmask);
        for (int h = 0; h < 2; h++) {
            const __m256i q = _mm256_loadu_si256((const __m256i *)(b->qs + 32 * h));
            for (int j = 0; j < 4; j++) {
                const __m256i bit = _mm256_set1_epi8((char)(1 << (4 * h + j)));
                const __m256i hi = _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(hm, bit), bit), c4);
                const __m256i lo = _mm256_and_si256(_mm256_srl_epi16(q, _mm_cvtsi32_si128(2 * j)), m3);
                _mm256_storeu_si256((__m256i *)(u + 128 * h + 32 * j), _mm256_or_si256(lo, hi));
            }
        }
    }
}

/* ---- nibble tables ---- */

/* Two 16-byte runs of IQ4_NL layout (each: 16 low nibbles, then 16 high) through the 16-entry table t (in
 * both lanes): 64 codes, run a's 32 then run b's. */
__attribute__((target(T_AVX2))) static inline void nibbles2(__m256i t, __m128i a, __m128i b, uint8_t *u)
{
    const __m256i m15 = _mm256_set1_epi8(15);
    const __m256i q = _mm256_set_m128i(b, a);
    const __m256i lo = _mm256_shuffle_epi8(t, _mm256_and_si256(q, m15));
    const __m256i hi = _mm256_shuffle_epi8(t, _mm256_and_si256(_mm256_srli_epi16(q, 4), m15));
    _mm256_storeu_si256((__m256i *)u, _mm256_permute2x128_si256(lo, hi, 0x20));
    _mm256_storeu_si256((__m256i *)(u + 32), _mm256_permute2x128_si256(lo, hi, 0x31));
}

/* The 16 values of v plus off, in both lanes. */
__attribute__((target(T_AVX2))) static inline __m256i table_codes2(const int8_t *v, int off)
{
    const __m128i t = _mm_add_epi8(_mm_loadu_si128((const __m128i *)v), _mm_set1_epi8((char)off));
    return _mm256_set_m128i(t, t);
}

/* Blocks of 32 elements (struct blk: 16 bytes of nibbles qs, a scale that scale_expr reads), two per step and
 * an odd last one alone: IQ4_NL and MXFP4. */
#define DEC_NIBBLE_BLOCKS(name, blk, table, off, scale_expr)                                                 \
    __attribute__((target(T_AVX2))) void name(const uint8_t *w, int c0, int kc, uint8_t *u, float *s,        \
                                              float *mn)                                                     \
    {                                                                                                        \
        (void)mn;                                                                                            \
        const __m256i t = table_codes2(table, off);                                                          \
        const struct blk *b = (const struct blk *)w + c0 / 32;                                               \
        const int nb = kc / 32;                                                                              \
        int i = 0;                                                                                           \
        for (; i + 2 <= nb; i += 2, b += 2, u += 64) {                                                       \
            s[i] = scale_expr(b[0]);                                                                         \
            s[i + 1] = scale_expr(b[1]);                                                                     \
            nibbles2(t, _mm_loadu_si128((const __m128i *)b[0].qs),                                           \
                     _mm_loadu_si128((const __m128i *)b[1].qs), u);                                          \
        }                                                                                                    \
        if (i < nb) {                                                                                        \
            uint8_t tmp[64];                                                                                 \
            s[i] = scale_expr(b[0]);                                                                         \
            nibbles2(t, _mm_loadu_si128((const __m128i *)b[0].qs), _mm_setzero_si128(), tmp);                \
            memcpy(u, tmp, 32);                                                                              \
        }                                                                                                    \
    }
#define IQ4_NL_SCALE(bl) _cvtsh_ss((bl).d)
#define MXFP4_SCALE(bl)  block_e8m0_half((bl).e)
DEC_NIBBLE_BLOCKS(q8_dec_iq4_nl_avx2, block_iq4_nl, iq4nl_values, 128, IQ4_NL_SCALE)
DEC_NIBBLE_BLOCKS(q8_dec_mxfp4_avx2, block_mxfp4, fp4_values, 16, MXFP4_SCALE)

__attribute__((target(T_AVX2))) void q8_dec_iq4_xs_avx2(const uint8_t *w, int c0, int kc, uint8_t *u,
                                                        float *s, float *mn)
{
    (void)mn;
    const __m256i t = table_codes2(iq4nl_values, 128);
    const __m256i sh2 = _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14), three = _mm256_set1_epi32(3);
    const struct block_iq4_xs *b = (const struct block_iq4_xs *)w + c0 / QK_K;
    for (int sb = 0; sb < kc / QK_K; sb++, b++, s += 8, u += QK_K) {
        /* block_iq4_xs_scale of j = 0..7 in 8 lanes: nibble j of scales_l, bits 2j, 2j + 1 of scales_h above
         */
        uint32_t l;
        memcpy(&l, b->scales_l, 4);
        const __m128i nib = _mm_unpacklo_epi8(_mm_cvtsi32_si128((int)(l & 0x0f0f0f0fu)),
                                              _mm_cvtsi32_si128((int)((l >> 4) & 0x0f0f0f0fu)));
        const __m256i hi = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(b->scales_h), sh2), three);
        const __m256i sc = _mm256_sub_epi32(
            _mm256_or_si256(_mm256_cvtepu8_epi32(nib), _mm256_slli_epi32(hi, 4)), _mm256_set1_epi32(32));
        _mm256_storeu_ps(s, _mm256_mul_ps(_mm256_set1_ps(_cvtsh_ss(b->d)), _mm256_cvtepi32_ps(sc)));
        for (int p = 0; p < 4; p++)
            nibbles2(t, _mm_loadu_si128((const __m128i *)(b->qs + 32 * p)),
                     _mm_loadu_si128((const __m128i *)(b->qs + 32 * p + 16)), u + 64 * p);
    }
}

/* block_ue4m3_half of the 4 bytes at p, without ldexpf: (1 + m/8)·2^(e - 8) built as f32 bits for e >= 1,
 * m·2^-10 for e = 0 (both exact), 0 for 0x7F; the same bits. */
__attribute__((target(T_AVX2))) static inline __m128 ue4m3_half4(const uint8_t *p)
{
    uint32_t v;
    memcpy(&v, p, 4);
    const __m128i x = _mm_cvtepu8_epi32(_mm_cvtsi32_si128((int)v));
    const __m128i e = _mm_and_si128(_mm_srli_epi32(x, 3), _mm_set1_epi32(15)),
                  m = _mm_and_si128(x, _mm_set1_epi32(7));
    const __m128i normal =
        _mm_or_si128(_mm_slli_epi32(_mm_add_epi32(e, _mm_set1_epi32(119)), 23), _mm_slli_epi32(m, 20));
    const __m128 sub = _mm_mul_ps(_mm_cvtepi32_ps(m), _mm_set1_ps(0x1.0p-10f));
    const __m128 r = _mm_blendv_ps(_mm_castsi128_ps(normal), sub,
                                   _mm_castsi128_ps(_mm_cmpeq_epi32(e, _mm_setzero_si128())));
    return _mm_andnot_ps(_mm_castsi128_ps(_mm_cmpeq_epi32(x, _mm_set1_epi32(0x7F))), r);
}

__attribute__((target(T_AVX2))) void q8_dec_nvfp4_avx2(const uint8_t *w, int c0, int kc, uint8_t *u, float *s,
                                                       float *mn)
{
    (void)mn;
    const __m256i t = table_codes2(fp4_values, 16), m15 = _mm256_set1_epi8(15);
    const struct block_nvfp4 *b = (const struct block_nvfp4 *)w + c0 / QK_NVFP4;
    for (int i = 0; i < kc / QK_NVFP4; i++, b++, u += QK_NVFP4, s += 4) {
        _mm_storeu_ps(s, ue4m3_half4(b->d));
        /* runs r = 0..3 of 8 bytes: 8 low-nibble codes, then 8 high */
        const __m256i q = _mm256_loadu_si256((const __m256i *)b->qs);
        const __m256i lo = _mm256_shuffle_epi8(t, _mm256_and_si256(q, m15));
        const __m256i hi = _mm256_shuffle_epi8(t, _mm256_and_si256(_mm256_srli_epi16(q, 4), m15));
        const __m256i r02 = _mm256_unpacklo_epi64(lo, hi), r13 = _mm256_unpackhi_epi64(lo, hi);
        _mm256_storeu_si256((__m256i *)u, _mm256_permute2x128_si256(r02, r13, 0x20));
        _mm256_storeu_si256((__m256i *)(u + 32), _mm256_permute2x128_si256(r02, r13, 0x31));
    }
}

/* ---- lattice grids ---- */

/* 32 codes off ± g (g: 32 grid bytes) with the sign bits of the 4 bytes of signs (byte l for elements
 * 8l..8l+7, bit e for element 8l + e): matmul_lut.c's grid8 on 4 rows at once. */
__attribute__((target(T_AVX2))) static inline __m256i grid_signed(__m256i g, uint32_t signs, __m256i off)
{
    const __m256i spread = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2,
                                            2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
    const __m256i bits = _mm256_set1_epi64x((long long)0x8040201008040201ull);
    const __m256i sv = _mm256_shuffle_epi8(_mm256_set1_epi32((int)signs), spread);
    const __m256i neg = _mm256_cmpeq_epi8(_mm256_and_si256(sv, bits), bits);
    return _mm256_blendv_epi8(_mm256_add_epi8(off, g), _mm256_sub_epi8(off, g), neg);
}

/* Nibble j (0..7) of the 4 bytes at p in lane j: low nibble of byte j/2 for even j, high for odd. */
__attribute__((target(T_AVX2))) static inline __m256i nibbles8(const uint8_t *p)
{
    uint32_t l;
    memcpy(&l, p, 4);
    return _mm256_cvtepu8_epi32(_mm_unpacklo_epi8(_mm_cvtsi32_si128((int)(l & 0x0f0f0f0fu)),
                                                  _mm_cvtsi32_si128((int)((l >> 4) & 0x0f0f0f0fu))));
}

/* Grid rows by scalar loads: 4 rows of 8 bytes, or 8 of 4. With vpgather instead the i-quants' products took
 * 10-40% longer on Zen 4 (kernels/cpu/NOTES.md); llama.cpp's AVX2 kernels load the rows one at a time too. */
__attribute__((target(T_AVX2))) static inline __m256i grid64x4(const uint64_t *grid, unsigned i0, unsigned i1,
                                                               unsigned i2, unsigned i3)
{
    return _mm256_setr_epi64x((long long)grid[i0], (long long)grid[i1], (long long)grid[i2],
                              (long long)grid[i3]);
}

__attribute__((target(T_AVX2))) static inline __m256i grid32x8(const uint32_t *grid, const unsigned *ix)
{
    return _mm256_setr_epi32((int)grid[ix[0]], (int)grid[ix[1]], (int)grid[ix[2]], (int)grid[ix[3]],
                             (int)grid[ix[4]], (int)grid[ix[5]], (int)grid[ix[6]], (int)grid[ix[7]]);
}

__attribute__((target(T_AVX2))) void q8_dec_iq3_s_avx2(const uint8_t *w, int c0, int kc, uint8_t *u, float *s,
                                                       float *mn)
{
    (void)mn;
    const __m256i off = _mm256_set1_epi8(16), one = _mm256_set1_epi32(1);
    const struct block_iq3_s *b = (const struct block_iq3_s *)w + c0 / QK_K;
    for (int sb = 0; sb < kc / QK_K; sb++, b++, s += 8) {
        /* s[ib] = d·(1 + 2·nibble ib of scales) */
        const __m256i sc = _mm256_add_epi32(_mm256_slli_epi32(nibbles8(b->scales), 1), one);
        _mm256_storeu_ps(s, _mm256_mul_ps(_mm256_set1_ps(_cvtsh_ss(b->d)), _mm256_cvtepi32_ps(sc)));
        for (int ib = 0; ib < 8; ib++, u += 32) {
            /* grid index e: qs[8ib + e] with bit e of qh[ib] as its ninth */
            unsigned ix[8];
            for (int e = 0; e < 8; e++) ix[e] = b->qs[8 * ib + e] | ((unsigned)b->qh[ib] >> e & 1) << 8;
            const __m256i g = grid32x8(iq3s_grid, ix);
            uint32_t sg;
            memcpy(&sg, b->signs + 4 * ib, 4);
            _mm256_storeu_si256((__m256i *)u, grid_signed(g, sg, off));
        }
    }
}

/* IQ2_XS's and IQ2_S's 16 scales: s[2ib + h] = d·(0.5 + nibble h of sc[ib])·0.25, as the portable decoders
 * round them. */
__attribute__((target(T_AVX2))) static inline void scales_iq2(float d, const uint8_t *sc, float *s)
{
    const __m128i scb = _mm_loadl_epi64((const __m128i *)sc);
    const __m128i nib = _mm_unpacklo_epi8(_mm_and_si128(scb, _mm_set1_epi8(15)),
                                          _mm_and_si128(_mm_srli_epi16(scb, 4), _mm_set1_epi8(15)));
    const __m256 dv = _mm256_set1_ps(d), half = _mm256_set1_ps(0.5f), quarter = _mm256_set1_ps(0.25f);
    for (int p = 0; p < 2; p++) {
        const __m256 v = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(p ? _mm_srli_si128(nib, 8) : nib));
        _mm256_storeu_ps(s + 8 * p, _mm256_mul_ps(_mm256_mul_ps(dv, _mm256_add_ps(half, v)), quarter));
    }
}

/* iq_signs7 of the four 7-bit fields a >> 0, 7, 14, 21 as the bytes of a u32 (IQ2_XXS, IQ3_XXS). */
__attribute__((target(T_AVX2))) static inline uint32_t signs7x4(uint32_t a)
{
    const __m128i par4 = _mm_setr_epi8(0, 1, 1, 0, 1, 0, 0, 1, 1, 0, 0, 1, 0, 1, 1, 0);
    const __m128i s7 = _mm_and_si128(_mm_srlv_epi32(_mm_set1_epi32((int)a), _mm_setr_epi32(0, 7, 14, 21)),
                                     _mm_set1_epi32(127));
    const __m128i par = _mm_xor_si128(_mm_shuffle_epi8(par4, _mm_and_si128(s7, _mm_set1_epi32(15))),
                                      _mm_shuffle_epi8(par4, _mm_srli_epi32(s7, 4)));
    const __m128i v = _mm_or_si128(s7, _mm_slli_epi32(par, 7));
    return (uint32_t)_mm_cvtsi128_si32(
        _mm_shuffle_epi8(v, _mm_setr_epi8(0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1)));
}

__attribute__((target(T_AVX2))) void q8_dec_iq2_xs_avx2(const uint8_t *w, int c0, int kc, uint8_t *u,
                                                        float *s, float *mn)
{
    (void)mn;
    const __m256i off = _mm256_set1_epi8(64), m511 = _mm256_set1_epi16(511), m15 = _mm256_set1_epi8(15);
    /* parity of 4 bits */
    const __m256i par4 = _mm256_setr_epi8(0, 1, 1, 0, 1, 0, 0, 1, 1, 0, 0, 1, 0, 1, 1, 0, 0, 1, 1, 0, 1, 0, 0,
                                          1, 1, 0, 0, 1, 0, 1, 1, 0);
    const struct block_iq2_xs *b = (const struct block_iq2_xs *)w + c0 / QK_K;
    for (int sb = 0; sb < kc / QK_K; sb++, b++, s += 16) {
        scales_iq2(_cvtsh_ss(b->d), b->scales, s);
        /* 32 grid indices (q & 511) and sign bytes (iq_signs7(q >> 9): 7 bits and their parity as bit 7) */
        uint16_t idx[32];
        uint8_t sgn[32];
        __m256i sv[2];
        for (int p = 0; p < 2; p++) {
            const __m256i q = _mm256_loadu_si256((const __m256i *)(b->qs + 16 * p));
            _mm256_storeu_si256((__m256i *)(idx + 16 * p), _mm256_and_si256(q, m511));
            const __m256i s7 = _mm256_srli_epi16(q, 9);
            const __m256i par = _mm256_xor_si256(_mm256_shuffle_epi8(par4, _mm256_and_si256(s7, m15)),
                                                 _mm256_shuffle_epi8(par4, _mm256_srli_epi16(s7, 4)));
            sv[p] = _mm256_or_si256(s7, _mm256_slli_epi16(par, 7));
        }
        _mm256_storeu_si256((__m256i *)sgn,
                            _mm256_permute4x64_epi64(_mm256_packus_epi16(sv[0], sv[1]), 0xD8));
        for (int ib = 0; ib < 8; ib++, u += 32) {
            const uint16_t *ix = idx + 4 * ib;
            const __m256i g = grid64x4(iq2xs_grid, ix[0], ix[1], ix[2], ix[3]);
            uint32_t sg;
            memcpy(&sg, sgn + 4 * ib, 4);
            _mm256_storeu_si256((__m256i *)u, grid_signed(g, sg, off));
        }
    }
}

__attribute__((target(T_AVX2))) void q8_dec_iq2_xxs_avx2(const uint8_t *w, int c0, int kc, uint8_t *u,
                                                         float *s, float *mn)
{
    (void)mn;
    const __m256i off = _mm256_set1_epi8(64);
    const struct block_iq2_xxs *b = (const struct block_iq2_xxs *)w + c0 / QK_K;
    for (int sb = 0; sb < kc / QK_K; sb++, b++, s += 8) {
        const float d = f16_to_f32(b->d);
        for (int ib = 0; ib < 8; ib++, u += 32) {
            uint32_t a[2];
            memcpy(a, b->qs + 4 * ib, 8);
            s[ib] = d * (0.5f + (float)(a[1] >> 28)) * 0.25f;
            const __m256i g =
                grid64x4(iq2xxs_grid, a[0] & 255, a[0] >> 8 & 255, a[0] >> 16 & 255, a[0] >> 24);
            _mm256_storeu_si256((__m256i *)u, grid_signed(g, signs7x4(a[1]), off));
        }
    }
}

__attribute__((target(T_AVX2))) void q8_dec_iq3_xxs_avx2(const uint8_t *w, int c0, int kc, uint8_t *u,
                                                         float *s, float *mn)
{
    (void)mn;
    const __m256i off = _mm256_set1_epi8(64);
    const struct block_iq3_xxs *b = (const struct block_iq3_xxs *)w + c0 / QK_K;
    for (int sb = 0; sb < kc / QK_K; sb++, b++, s += 8) {
        const float d = f16_to_f32(b->d);
        for (int ib = 0; ib < 8; ib++, u += 32) {
            uint32_t a;
            memcpy(&a, b->qs + QK_K / 4 + 4 * ib, 4);
            s[ib] = d * (0.5f + (float)(a >> 28)) * 0.5f;
            unsigned ix[8];
            for (int e = 0; e < 8; e++) ix[e] = b->qs[8 * ib + e];
            const __m256i g = grid32x8(iq3xxs_grid, ix);
            _mm256_storeu_si256((__m256i *)u, grid_signed(g, signs7x4(a), off));
        }
    }
}

__attribute__((target(T_AVX2))) void q8_dec_iq2_s_avx2(const uint8_t *w, int c0, int kc, uint8_t *u, float *s,
                                                       float *mn)
{
    (void)mn;
    const __m256i off = _mm256_set1_epi8(64);
    const struct block_iq2_s *b = (const struct block_iq2_s *)w + c0 / QK_K;
    for (int sb = 0; sb < kc / QK_K; sb++, b++, s += 16) {
        scales_iq2(_cvtsh_ss(b->d), b->scales, s);
        const uint8_t *qs = b->qs, *signs = b->qs + QK_K / 8;
        for (int ib = 0; ib < 8; ib++, qs += 4, signs += 4, u += 32) {
            /* grid index l: qs[l] with bits 2l, 2l + 1 of qh[ib] as its ninth and tenth */
            uint32_t q4, sg;
            memcpy(&q4, qs, 4);
            memcpy(&sg, signs, 4);
            const unsigned h = b->qh[ib];
            const __m256i g =
                grid64x4(iq2s_grid, (q4 & 255) | (h & 3) << 8, (q4 >> 8 & 255) | (h >> 2 & 3) << 8,
                         (q4 >> 16 & 255) | (h >> 4 & 3) << 8, (q4 >> 24) | (h >> 6 & 3) << 8);
            _mm256_storeu_si256((__m256i *)u, grid_signed(g, sg, off));
        }
    }
}

/* 32 IQ1 codes 8·g + 16 + delta from 4 grid rows g (bytes -1, 0, 1) and the bytes base = 16 + delta
 * (matmul_lut.c's grid1: the same value modulo 256). */
__attribute__((target(T_AVX2))) static inline __m256i grid1x4(__m256i g, __m256i base)
{
    const __m256i g2 = _mm256_add_epi8(g, g), g4 = _mm256_add_epi8(g2, g2);
    return _mm256_add_epi8(_mm256_add_epi8(g4, g4), base);
}

__attribute__((target(T_AVX2))) void q8_dec_iq1_s_avx2(const uint8_t *w, int c0, int kc, uint8_t *u, float *s,
                                                       float *mn)
{
    (void)mn;
    const struct block_iq1_s *b = (const struct block_iq1_s *)w + c0 / QK_K;
    for (int sb = 0; sb < kc / QK_K; sb++, b++, s += 8) {
        const float d = f16_to_f32(b->d);
        for (int ib = 0; ib < 8; ib++, u += 32) {
            const uint16_t qh = b->qh[ib];
            s[ib] = d * (float)(2 * ((qh >> 12) & 7) + 1) * 0.125f;
            /* grid index l: qs[4ib + l] with bits 3l..3l + 2 of qh above */
            uint32_t q4;
            memcpy(&q4, b->qs + 4 * ib, 4);
            const unsigned h = qh;
            const __m256i g =
                grid64x4(iq1s_grid, (q4 & 255) | (h & 7) << 8, (q4 >> 8 & 255) | (h >> 3 & 7) << 8,
                         (q4 >> 16 & 255) | (h >> 6 & 7) << 8, (q4 >> 24) | (h >> 9 & 7) << 8);
            _mm256_storeu_si256(
                (__m256i *)u,
                grid1x4(g,
                        _mm256_set1_epi8((char)(17 - 2 * (qh >> 15)))) /* 15 with the sign bit, no branch */);
        }
    }
}

__attribute__((target(T_AVX2))) void q8_dec_iq1_m_avx2(const uint8_t *w, int c0, int kc, uint8_t *u, float *s,
                                                       float *mn)
{
    (void)mn;
    const __m128i sh = _mm_setr_epi32(0, 4, 8, 12), eight = _mm_set1_epi32(8);
    const __m256i bcast = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 8, 8, 8, 8, 8, 8, 8, 8, 0, 0, 0, 0, 0, 0,
                                           0, 0, 8, 8, 8, 8, 8, 8, 8, 8);
    const struct block_iq1_m *b = (const struct block_iq1_m *)w + c0 / QK_K;
    for (int sb = 0; sb < kc / QK_K; sb++, b++, s += 16) {
        const float d = f16_to_f32(block_iq1_m_d(b));
        uint16_t sc[4];
        memcpy(sc, b->scales, sizeof sc);
        for (int ib = 0; ib < 8; ib++, u += 32) {
            s[2 * ib] = d * (float)(2 * ((sc[ib / 2] >> (6 * (ib % 2))) & 7) + 1) * 0.125f;
            s[2 * ib + 1] = d * (float)(2 * ((sc[ib / 2] >> (6 * (ib % 2) + 3)) & 7) + 1) * 0.125f;
            /* nibble l of qh[2ib], qh[2ib + 1]: three high index bits, and the delta's sign (bit 3) */
            uint32_t q4;
            memcpy(&q4, b->qs + 4 * ib, 4);
            const int h16 = b->qh[2 * ib] | b->qh[2 * ib + 1] << 8;
            const __m128i nib = _mm_srlv_epi32(_mm_set1_epi32(h16), sh);
            const unsigned h = (unsigned)h16;
            const __m256i g =
                grid64x4(iq1s_grid, (q4 & 255) | (h & 7) << 8, (q4 >> 8 & 255) | (h >> 4 & 7) << 8,
                         (q4 >> 16 & 255) | (h >> 8 & 7) << 8, (q4 >> 24) | (h >> 12 & 7) << 8);
            /* 16 + delta: 17, or 15 where the sign bit is set, in every byte of row l */
            const __m128i base4 =
                _mm_sub_epi32(_mm_set1_epi32(17), _mm_srli_epi32(_mm_and_si128(nib, eight), 2));
            const __m256i base = _mm256_shuffle_epi8(_mm256_cvtepu32_epi64(base4), bcast);
            _mm256_storeu_si256((__m256i *)u, grid1x4(g, base));
        }
    }
}

#endif /* __x86_64__ */
