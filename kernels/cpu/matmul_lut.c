/* matmul_lut — the tile decoders of the types whose values come from small integers through a table or a
 * grid: Q2_K, Q3_K, IQ4_NL, IQ4_XS, MXFP4, NVFP4, IQ3_XXS, IQ3_S, IQ2_XXS, IQ2_XS, IQ2_S, IQ1_S, IQ1_M.
 *
 * Each writes a chunk of one weight row into q8_tile form (matmul_impl.h): one unsigned code per element
 * with value = code - 2^sh, and a scale per 32 elements (Q8M_OFF) or per 16 (Q8M_OFF16); Q2_K is affine
 * per 16 (Q8M_AFFINE16: value = s·(code - 1) + mn). Every value these types hold is a small integer times a
 * per-block f32 scale, so the integer products of matmul.c take them unchanged:
 *   type     values (integers)                        scale                        sh  mode
 *   Q2_K     q in 0..3 (code q + 1)                   d·sc, minimum -dmin·m per 16  0  AFFINE16
 *   Q3_K     q - 4 in -4..3                           d·(s - 32) per 16             2  OFF16
 *   IQ4_NL   iq4nl_values: -127..113                  d per 32                      7  OFF
 *   IQ4_XS   iq4nl_values                             d·(s - 32) per 32             7  OFF
 *   MXFP4    fp4_values: -12..12                      2^(e - 128) per 32            4  OFF
 *   NVFP4    fp4_values                               UE4M3/2 per 16                4  OFF16
 *   IQ2_XXS  ±{8, 25, 43}                             d·(0.5 + s)/4 per 32          6  OFF
 *   IQ2_XS   ±{8, 25, 43}                             d·(0.5 + s)/4 per 16          6  OFF16
 *   IQ2_S    ±{8, 25, 43}                             d·(0.5 + s)/4 per 16          6  OFF16
 *   IQ3_XXS  ±{4 .. 62}                               d·(0.5 + s)/2 per 32          6  OFF
 *   IQ3_S    ±{1 .. 15}                               d·(1 + 2s) per 32             4  OFF
 *   IQ1_S    8·g ± 1, g in {-1, 0, 1}: -9..9          d·(2s + 1)/8 per 32           4  OFF
 *   IQ1_M    8·g ± 1                                  d·(2s + 1)/8 per 16           4  OFF16
 * (IQ1's delta ±1/8 becomes ±1 once the scale carries the 1/8, exactly: a power of two.) The codes stay
 * below 128 except for IQ4_NL/IQ4_XS (sh 7: the AVX2 kernel's signed path, as Q8_0's).
 */
#include <string.h>

#if defined(__SSSE3__)
#include <immintrin.h>
#endif

#include "kernels/cpu/matmul_impl.h"
#include "quant/blocks.h"
#include "quant/fp16.h"
#include "quant/iq_tables.h"

/* ---- K-quants of 2 and 3 bits ---- */

void q8_dec_q2_k(const uint8_t *w, int c0, int kc, uint8_t *u, float *s, float *mn)
{
    const struct block_q2_k *b = (const struct block_q2_k *)w + c0 / QK_K;
    for (int sb = 0; sb < kc / QK_K; sb++, b++, u += QK_K, s += 16, mn += 16) {
        const float d = f16_to_f32(b->d), dmin = f16_to_f32(b->dmin);
        for (int t = 0; t < 16; t++) {
            s[t] = d * (float)(b->scales[t] & 15);
            mn[t] = -(dmin * (float)(b->scales[t] >> 4));
        }
        for (int h = 0; h < 2; h++)
            for (int j = 0; j < 4; j++)
                for (int l = 0; l < 32; l++)
                    u[128 * h + 32 * j + l] = ((b->qs[32 * h + l] >> (2 * j)) & 3) + 1;
    }
}

void q8_dec_q3_k(const uint8_t *w, int c0, int kc, uint8_t *u, float *s, float *mn)
{
    (void)mn;
    const struct block_q3_k *b = (const struct block_q3_k *)w + c0 / QK_K;
    for (int sb = 0; sb < kc / QK_K; sb++, b++, u += QK_K, s += 16) {
        const float d = f16_to_f32(b->d);
        for (int t = 0; t < 16; t++) s[t] = d * (float)(block_q3_k_scale(t, b->scales) - 32);
        for (int h = 0; h < 2; h++)
            for (int j = 0; j < 4; j++)
                for (int l = 0; l < 32; l++)
                    u[128 * h + 32 * j + l] = (uint8_t)(((b->qs[32 * h + l] >> (2 * j)) & 3) |
                                                        (((b->hmask[l] >> (4 * h + j)) & 1) << 2));
    }
}

/* ---- nibble tables ---- */

/* 2·half elements of IQ4_NL layout (half = 16 or 8 bytes: low nibbles, then high nibbles) through the
 * 16-entry table v (a byte shuffle where the CPU has one). */
static inline void nibbles(const uint8_t *qs, const uint8_t *v, uint8_t *u, int half)
{
#if defined(__SSSE3__)
    const __m128i t = _mm_loadu_si128((const __m128i *)v), m4 = _mm_set1_epi8(15);
    const __m128i q =
        half == 16 ? _mm_loadu_si128((const __m128i *)qs) : _mm_loadl_epi64((const __m128i *)qs);
    const __m128i lo = _mm_shuffle_epi8(t, _mm_and_si128(q, m4));
    const __m128i hi = _mm_shuffle_epi8(t, _mm_and_si128(_mm_srli_epi16(q, 4), m4));
    if (half == 16) {
        _mm_storeu_si128((__m128i *)u, lo);
        _mm_storeu_si128((__m128i *)(u + 16), hi);
    } else {
        _mm_storel_epi64((__m128i *)u, lo);
        _mm_storel_epi64((__m128i *)(u + 8), hi);
    }
#else
    for (int j = 0; j < half; j++) {
        u[j] = v[qs[j] & 15];
        u[j + half] = v[qs[j] >> 4];
    }
#endif
}

/* The tables with the offset added: iq4nl_values + 128, fp4_values + 16. */
static void table_codes(const int8_t *v, int off, uint8_t *out)
{
    for (int i = 0; i < 16; i++) out[i] = (uint8_t)(v[i] + off);
}

void q8_dec_iq4_nl(const uint8_t *w, int c0, int kc, uint8_t *u, float *s, float *mn)
{
    (void)mn;
    uint8_t v[16];
    table_codes(iq4nl_values, 128, v);
    const struct block_iq4_nl *b = (const struct block_iq4_nl *)w + c0 / QK4_NL;
    for (int i = 0; i < kc / QK4_NL; i++, b++, u += QK4_NL) {
        s[i] = f16_to_f32(b->d);
        nibbles(b->qs, v, u, QK4_NL / 2);
    }
}

void q8_dec_iq4_xs(const uint8_t *w, int c0, int kc, uint8_t *u, float *s, float *mn)
{
    (void)mn;
    uint8_t v[16];
    table_codes(iq4nl_values, 128, v);
    const struct block_iq4_xs *b = (const struct block_iq4_xs *)w + c0 / QK_K;
    for (int sb = 0; sb < kc / QK_K; sb++, b++, s += 8) {
        const float d = f16_to_f32(b->d);
        for (int j = 0; j < 8; j++, u += 32) {
            s[j] = d * (float)(block_iq4_xs_scale(j, b) - 32);
            nibbles(b->qs + 16 * j, v, u, 16);
        }
    }
}

void q8_dec_mxfp4(const uint8_t *w, int c0, int kc, uint8_t *u, float *s, float *mn)
{
    (void)mn;
    uint8_t v[16];
    table_codes(fp4_values, 16, v);
    const struct block_mxfp4 *b = (const struct block_mxfp4 *)w + c0 / QK_MXFP4;
    for (int i = 0; i < kc / QK_MXFP4; i++, b++, u += QK_MXFP4) {
        s[i] = block_e8m0_half(b->e);
        nibbles(b->qs, v, u, QK_MXFP4 / 2);
    }
}

void q8_dec_nvfp4(const uint8_t *w, int c0, int kc, uint8_t *u, float *s, float *mn)
{
    (void)mn;
    uint8_t v[16];
    table_codes(fp4_values, 16, v);
    const struct block_nvfp4 *b = (const struct block_nvfp4 *)w + c0 / QK_NVFP4;
    for (int i = 0; i < kc / QK_NVFP4; i++, b++)
        for (int t = 0; t < 4; t++, u += 16) {
            s[4 * i + t] = block_ue4m3_half(b->d[t]);
            nibbles(b->qs + 8 * t, v, u, 8);
        }
}

/* ---- lattice grids ---- */

#define BYTES8(b) (0x0101010101010101ull * (uint64_t)(b))

/* 0xFF in each byte of x that is not zero, else 0 (no carries between bytes). */
static inline uint64_t bytes_nonzero(uint64_t x)
{
    const uint64_t t = (x | ((x & BYTES8(0x7F)) + BYTES8(0x7F))) & BYTES8(0x80);
    return (t >> 7) * 0xFF;
}

/* 8 elements of grid row g (bytes below off) with sign bits signs, plus off: off ± g per byte, in one word
 * (neither the sum nor the difference leaves its byte). */
static inline void grid8(uint64_t g, uint8_t signs, int off, uint8_t *u)
{
    const uint64_t neg = bytes_nonzero(BYTES8(signs) & 0x8040201008040201ull);
    const uint64_t r = ((BYTES8(off) + g) & ~neg) | ((BYTES8(off) - g) & neg);
    memcpy(u, &r, 8);
}

void q8_dec_iq2_xxs(const uint8_t *w, int c0, int kc, uint8_t *u, float *s, float *mn)
{
    (void)mn;
    const struct block_iq2_xxs *b = (const struct block_iq2_xxs *)w + c0 / QK_K;
    for (int sb = 0; sb < kc / QK_K; sb++, b++, s += 8) {
        const float d = f16_to_f32(b->d);
        for (int ib = 0; ib < 8; ib++) {
            uint32_t a[2];
            memcpy(a, b->qs + 4 * ib, 8);
            s[ib] = d * (0.5f + (float)(a[1] >> 28)) * 0.25f;
            for (int l = 0; l < 4; l++, u += 8)
                grid8(iq2xxs_grid[(a[0] >> (8 * l)) & 255], iq_signs7(a[1] >> (7 * l)), 64, u);
        }
    }
}

void q8_dec_iq2_xs(const uint8_t *w, int c0, int kc, uint8_t *u, float *s, float *mn)
{
    (void)mn;
    const struct block_iq2_xs *b = (const struct block_iq2_xs *)w + c0 / QK_K;
    for (int sb = 0; sb < kc / QK_K; sb++, b++, s += 16) {
        const float d = f16_to_f32(b->d);
        for (int ib = 0; ib < 8; ib++) {
            s[2 * ib] = d * (0.5f + (float)(b->scales[ib] & 15)) * 0.25f;
            s[2 * ib + 1] = d * (0.5f + (float)(b->scales[ib] >> 4)) * 0.25f;
            for (int l = 0; l < 4; l++, u += 8) {
                const uint16_t q = b->qs[4 * ib + l];
                grid8(iq2xs_grid[q & 511], iq_signs7(q >> 9), 64, u);
            }
        }
    }
}

void q8_dec_iq2_s(const uint8_t *w, int c0, int kc, uint8_t *u, float *s, float *mn)
{
    (void)mn;
    const struct block_iq2_s *b = (const struct block_iq2_s *)w + c0 / QK_K;
    for (int sb = 0; sb < kc / QK_K; sb++, b++, s += 16) {
        const float d = f16_to_f32(b->d);
        const uint8_t *qs = b->qs, *signs = b->qs + QK_K / 8;
        for (int ib = 0; ib < 8; ib++, qs += 4, signs += 4) {
            s[2 * ib] = d * (0.5f + (float)(b->scales[ib] & 15)) * 0.25f;
            s[2 * ib + 1] = d * (0.5f + (float)(b->scales[ib] >> 4)) * 0.25f;
            for (int l = 0; l < 4; l++, u += 8)
                grid8(iq2s_grid[qs[l] | ((b->qh[ib] << (8 - 2 * l)) & 0x300)], signs[l], 64, u);
        }
    }
}

void q8_dec_iq3_xxs(const uint8_t *w, int c0, int kc, uint8_t *u, float *s, float *mn)
{
    (void)mn;
    const struct block_iq3_xxs *b = (const struct block_iq3_xxs *)w + c0 / QK_K;
    for (int sb = 0; sb < kc / QK_K; sb++, b++, s += 8) {
        const float d = f16_to_f32(b->d);
        const uint8_t *qs = b->qs;
        for (int ib = 0; ib < 8; ib++, qs += 8) {
            uint32_t a;
            memcpy(&a, b->qs + QK_K / 4 + 4 * ib, 4);
            s[ib] = d * (0.5f + (float)(a >> 28)) * 0.5f;
            for (int l = 0; l < 4; l++, u += 8)
                grid8((uint64_t)iq3xxs_grid[qs[2 * l]] | (uint64_t)iq3xxs_grid[qs[2 * l + 1]] << 32,
                      iq_signs7(a >> (7 * l)), 64, u);
        }
    }
}

void q8_dec_iq3_s(const uint8_t *w, int c0, int kc, uint8_t *u, float *s, float *mn)
{
    (void)mn;
    const struct block_iq3_s *b = (const struct block_iq3_s *)w + c0 / QK_K;
    for (int sb = 0; sb < kc / QK_K; sb++, b++, s += 8) {
        const float d = f16_to_f32(b->d);
        const uint8_t *qs = b->qs, *signs = b->signs;
        for (int ib = 0; ib < 8; ib++, qs += 8, signs += 4) {
            s[ib] = d * (float)(1 + 2 * ((b->scales[ib / 2] >> (4 * (ib % 2))) & 15));
            const int qh = b->qh[ib];
            for (int l = 0; l < 4; l++, u += 8)
                grid8((uint64_t)iq3s_grid[qs[2 * l] | ((qh << (8 - 2 * l)) & 256)] |
                          (uint64_t)iq3s_grid[qs[2 * l + 1] | ((qh << (7 - 2 * l)) & 256)] << 32,
                      signs[l], 16, u);
        }
    }
}

/* 8 elements of IQ1_S/IQ1_M: 8·g + delta (delta ±1) + 16, g in {-1, 0, 1} per byte: (g + 1)·8 + 8 + delta,
 * in one word (g + 1 per byte without carries, then small enough that the shift stays in its byte). */
static inline void grid1(uint64_t g, int delta, uint8_t *u)
{
    const uint64_t g1 = ((g & BYTES8(0x7F)) + BYTES8(1)) ^ (g & BYTES8(0x80));
    const uint64_t r = (g1 << 3) + BYTES8(8 + delta);
    memcpy(u, &r, 8);
}

void q8_dec_iq1_s(const uint8_t *w, int c0, int kc, uint8_t *u, float *s, float *mn)
{
    (void)mn;
    const struct block_iq1_s *b = (const struct block_iq1_s *)w + c0 / QK_K;
    for (int sb = 0; sb < kc / QK_K; sb++, b++, s += 8) {
        const float d = f16_to_f32(b->d);
        for (int ib = 0; ib < 8; ib++) {
            const uint16_t qh = b->qh[ib];
            s[ib] = d * (float)(2 * ((qh >> 12) & 7) + 1) * 0.125f;
            const int delta = qh & 0x8000 ? -1 : 1;
            for (int l = 0; l < 4; l++, u += 8)
                grid1(iq1s_grid[b->qs[4 * ib + l] | (((qh >> (3 * l)) & 7) << 8)], delta, u);
        }
    }
}

void q8_dec_iq1_m(const uint8_t *w, int c0, int kc, uint8_t *u, float *s, float *mn)
{
    (void)mn;
    const struct block_iq1_m *b = (const struct block_iq1_m *)w + c0 / QK_K;
    for (int sb = 0; sb < kc / QK_K; sb++, b++, s += 16) {
        const float d = f16_to_f32(block_iq1_m_d(b));
        uint16_t sc[4];
        memcpy(sc, b->scales, sizeof sc);
        for (int ib = 0; ib < 8; ib++) {
            s[2 * ib] = d * (float)(2 * ((sc[ib / 2] >> (6 * (ib % 2))) & 7) + 1) * 0.125f;
            s[2 * ib + 1] = d * (float)(2 * ((sc[ib / 2] >> (6 * (ib % 2) + 3)) & 7) + 1) * 0.125f;
            for (int l = 0; l < 4; l++, u += 8) {
                const uint8_t qh = b->qh[2 * ib + l / 2];
                const int hi = l % 2 ? qh >> 4 : qh & 15;
                grid1(iq1s_grid[b->qs[4 * ib + l] | ((hi & 7) << 8)], hi & 8 ? -1 : 1, u);
            }
        }
    }
}
