/* dequant_iq — the lookup-table types to f32 (to_f32 entries of quant/dtype.c's table): IQ4_NL, IQ4_XS,
 * MXFP4, NVFP4 and the i-quants IQ3_XXS, IQ3_S, IQ2_XXS, IQ2_XS, IQ2_S, IQ1_S, IQ1_M.
 *
 * The layouts (ggml-common.h; structs in quant/blocks.h; tables in quant/iq_tables.h), elements in order:
 *   IQ4_NL (32, 18 bytes): { f16 d; u8 qs[16]; } x[j] = d·V[qs[j] & 15], x[j+16] = d·V[qs[j] >> 4]
 *          (V = iq4nl_values)
 *   IQ4_XS (256, 136 bytes): 8 sub-blocks of 32 laid out as IQ4_NL's, scale (d·(s_j - 32)), s_j 6 bits
 *   MXFP4 (32, 17 bytes): { u8 e; u8 qs[16]; } as IQ4_NL with V = fp4_values and d = 2^(e - 128)
 *   NVFP4 (64, 36 bytes): { u8 d[4]; u8 qs[32]; } 4 sub-blocks of 16, each as MXFP4's of 16 elements with
 *          its own UE4M3 scale (block_ue4m3_half)
 *   IQ2_XXS (256, 66 bytes): per 32 elements u32 a (4 grid indices, bytes), u32 b (4 x 7 sign bits, then a
 *          4-bit scale ls at bit 28): db = d·(0.5 + ls)·0.25; element 8l + j = db·grid[a_l][j]·(±1: bit j of
 *          iq_signs7(b >> 7l))
 *   IQ2_XS (256, 74 bytes): per 8 elements a u16 (9-bit grid index | 7 sign bits << 9); per 16 elements a
 *          4-bit scale (low nibble first): db = d·(0.5 + ls)·0.25
 *   IQ2_S (256, 82 bytes): per 8 elements a 10-bit index (qs byte | 2 bits of qh) and a byte of 8 sign bits
 *          (32 bytes after the indices); scales as IQ2_XS
 *   IQ3_XXS (256, 98 bytes): 64 bytes of grid indices (4 elements each), then per 32 elements a u32 as
 *          IQ2_XXS's b: db = d·(0.5 + ls)·0.5
 *   IQ3_S (256, 110 bytes): per 4 elements a 9-bit index (qs | bit of qh), one sign bit per element, per 32
 *          elements a 4-bit scale: db = d·(1 + 2·ls)
 *   IQ1_S (256, 50 bytes): per 8 elements an 11-bit index (qs | 3 bits of qh), per 32 a u16 qh with a 3-bit
 *          scale (bit 12) and the delta's sign (bit 15): x = (d·(2s + 1))·(grid[idx][j] ± 0.125)
 *   IQ1_M (256, 56 bytes): as IQ1_S with the high index bits and the delta sign per 8 elements in qh, 3-bit
 *          scales per 16 elements, and the f16 super-block scale spread over the scales' top nibbles
 * Each value is evaluated in f32 in exactly ggml's order (scale first, then times the grid value, then the
 * sign; this library builds with -ffp-contract=off), so the results are bitwise ggml's dequantize_row_*.
 */
#include <string.h>

#include "quant/blocks.h"
#include "quant/fp16.h"
#include "quant/iq_tables.h"
#include "quant/rows.h"

/* 16 values of a nibble table, 32 elements of IQ4_NL layout: low nibbles then high nibbles. */
static inline void nibbles_to_f32(const uint8_t *qs, const int8_t *v, float d, float *y, int half)
{
    for (int j = 0; j < half; j++) {
        y[j] = d * (float)v[qs[j] & 15];
        y[j + half] = d * (float)v[qs[j] >> 4];
    }
}

void row_iq4_nl_to_f32(const void *src, float *restrict y, int64_t n)
{
    const struct block_iq4_nl *b = src;
    for (int64_t i = 0; i < n / QK4_NL; i++, y += QK4_NL)
        nibbles_to_f32(b[i].qs, iq4nl_values, f16_to_f32(b[i].d), y, QK4_NL / 2);
}

void row_iq4_xs_to_f32(const void *src, float *restrict y, int64_t n)
{
    const struct block_iq4_xs *b = src;
    for (int64_t i = 0; i < n / QK_K; i++) {
        const float d = f16_to_f32(b[i].d);
        for (int j = 0; j < 8; j++, y += 32)
            nibbles_to_f32(b[i].qs + 16 * j, iq4nl_values, d * (float)(block_iq4_xs_scale(j, &b[i]) - 32), y,
                           16);
    }
}

void row_mxfp4_to_f32(const void *src, float *restrict y, int64_t n)
{
    const struct block_mxfp4 *b = src;
    for (int64_t i = 0; i < n / QK_MXFP4; i++, y += QK_MXFP4)
        nibbles_to_f32(b[i].qs, fp4_values, block_e8m0_half(b[i].e), y, QK_MXFP4 / 2);
}

void row_nvfp4_to_f32(const void *src, float *restrict y, int64_t n)
{
    const struct block_nvfp4 *b = src;
    for (int64_t i = 0; i < n / QK_NVFP4; i++)
        for (int s = 0; s < 4; s++, y += 16)
            nibbles_to_f32(b[i].qs + 8 * s, fp4_values, block_ue4m3_half(b[i].d[s]), y, 8);
}

/* 8 elements: db·grid byte, negated where the sign byte has bit j. */
static inline void grid8_to_f32(uint64_t g, uint8_t signs, float db, float *y)
{
    for (int j = 0; j < 8; j++) {
        const float v = db * (float)iq_grid8(g, j);
        y[j] = signs >> j & 1 ? -v : v;
    }
}

void row_iq2_xxs_to_f32(const void *src, float *restrict y, int64_t n)
{
    const struct block_iq2_xxs *b = src;
    for (int64_t i = 0; i < n / QK_K; i++) {
        const float d = f16_to_f32(b[i].d);
        for (int ib = 0; ib < 8; ib++) {
            uint32_t a[2];
            memcpy(a, b[i].qs + 4 * ib, 8);
            const float db = d * (0.5f + (float)(a[1] >> 28)) * 0.25f;
            for (int l = 0; l < 4; l++, y += 8)
                grid8_to_f32(iq2xxs_grid[(a[0] >> (8 * l)) & 255], iq_signs7(a[1] >> (7 * l)), db, y);
        }
    }
}

void row_iq2_xs_to_f32(const void *src, float *restrict y, int64_t n)
{
    const struct block_iq2_xs *b = src;
    for (int64_t i = 0; i < n / QK_K; i++) {
        const float d = f16_to_f32(b[i].d);
        for (int ib = 0; ib < 8; ib++) {
            const float db[2] = {d * (0.5f + (float)(b[i].scales[ib] & 15)) * 0.25f,
                                 d * (0.5f + (float)(b[i].scales[ib] >> 4)) * 0.25f};
            for (int l = 0; l < 4; l++, y += 8) {
                const uint16_t q = b[i].qs[4 * ib + l];
                grid8_to_f32(iq2xs_grid[q & 511], iq_signs7(q >> 9), db[l / 2], y);
            }
        }
    }
}

void row_iq2_s_to_f32(const void *src, float *restrict y, int64_t n)
{
    const struct block_iq2_s *b = src;
    for (int64_t i = 0; i < n / QK_K; i++) {
        const float d = f16_to_f32(b[i].d);
        const uint8_t *qs = b[i].qs, *signs = b[i].qs + QK_K / 8;
        for (int ib = 0; ib < 8; ib++, qs += 4, signs += 4) {
            const float db[2] = {d * (0.5f + (float)(b[i].scales[ib] & 15)) * 0.25f,
                                 d * (0.5f + (float)(b[i].scales[ib] >> 4)) * 0.25f};
            for (int l = 0; l < 4; l++, y += 8)
                grid8_to_f32(iq2s_grid[qs[l] | ((b[i].qh[ib] << (8 - 2 * l)) & 0x300)], signs[l], db[l / 2],
                             y);
        }
    }
}

/* 8 elements from two 4-element grid rows. */
static inline void grid44_to_f32(uint32_t g1, uint32_t g2, uint8_t signs, float db, float *y)
{
    grid8_to_f32((uint64_t)g1 | (uint64_t)g2 << 32, signs, db, y);
}

void row_iq3_xxs_to_f32(const void *src, float *restrict y, int64_t n)
{
    const struct block_iq3_xxs *b = src;
    for (int64_t i = 0; i < n / QK_K; i++) {
        const float d = f16_to_f32(b[i].d);
        const uint8_t *qs = b[i].qs;
        for (int ib = 0; ib < 8; ib++, qs += 8) {
            uint32_t a;
            memcpy(&a, b[i].qs + QK_K / 4 + 4 * ib, 4);
            const float db = d * (0.5f + (float)(a >> 28)) * 0.5f;
            for (int l = 0; l < 4; l++, y += 8)
                grid44_to_f32(iq3xxs_grid[qs[2 * l]], iq3xxs_grid[qs[2 * l + 1]], iq_signs7(a >> (7 * l)), db,
                              y);
        }
    }
}

void row_iq3_s_to_f32(const void *src, float *restrict y, int64_t n)
{
    const struct block_iq3_s *b = src;
    for (int64_t i = 0; i < n / QK_K; i++) {
        const float d = f16_to_f32(b[i].d);
        const uint8_t *qs = b[i].qs, *signs = b[i].signs;
        for (int ib = 0; ib < 8; ib++, qs += 8, signs += 4) {
            const int ls = (b[i].scales[ib / 2] >> (4 * (ib % 2))) & 15;
            const float db = d * (float)(1 + 2 * ls);
            const int qh = b[i].qh[ib];
            for (int l = 0; l < 4; l++, y += 8)
                grid44_to_f32(iq3s_grid[qs[2 * l] | ((qh << (8 - 2 * l)) & 256)],
                              iq3s_grid[qs[2 * l + 1] | ((qh << (7 - 2 * l)) & 256)], signs[l], db, y);
        }
    }
}

/* 8 elements of IQ1_S/IQ1_M: dl·(grid value + delta). */
static inline void grid1_to_f32(uint64_t g, float dl, float delta, float *y)
{
    for (int j = 0; j < 8; j++) y[j] = dl * ((float)(int8_t)iq_grid8(g, j) + delta);
}

void row_iq1_s_to_f32(const void *src, float *restrict y, int64_t n)
{
    const struct block_iq1_s *b = src;
    for (int64_t i = 0; i < n / QK_K; i++) {
        const float d = f16_to_f32(b[i].d);
        for (int ib = 0; ib < 8; ib++) {
            const uint16_t qh = b[i].qh[ib];
            const float dl = d * (float)(2 * ((qh >> 12) & 7) + 1);
            const float delta = qh & 0x8000 ? -IQ1S_DELTA : IQ1S_DELTA;
            for (int l = 0; l < 4; l++, y += 8)
                grid1_to_f32(iq1s_grid[b[i].qs[4 * ib + l] | (((qh >> (3 * l)) & 7) << 8)], dl, delta, y);
        }
    }
}

void row_iq1_m_to_f32(const void *src, float *restrict y, int64_t n)
{
    const struct block_iq1_m *b = src;
    for (int64_t i = 0; i < n / QK_K; i++) {
        const float d = f16_to_f32(block_iq1_m_d(&b[i]));
        uint16_t sc[4];
        memcpy(sc, b[i].scales, sizeof sc);
        for (int ib = 0; ib < 8; ib++) {
            const float dl[2] = {d * (float)(2 * ((sc[ib / 2] >> (6 * (ib % 2))) & 7) + 1),
                                 d * (float)(2 * ((sc[ib / 2] >> (6 * (ib % 2) + 3)) & 7) + 1)};
            for (int l = 0; l < 4; l++, y += 8) {
                const uint8_t qh = b[i].qh[2 * ib + l / 2];
                const int hi = l % 2 ? qh >> 4 : qh & 15;
                grid1_to_f32(iq1s_grid[b[i].qs[4 * ib + l] | ((hi & 7) << 8)], dl[l / 2],
                             hi & 8 ? -IQ1S_DELTA : IQ1S_DELTA, y);
            }
        }
    }
}
