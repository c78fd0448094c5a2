/* dequant — GGUF/ggml block formats to f32 (the to_f32 entries of quant/dtype.c's table).
 *
 * The layouts (ggml-common.h; little-endian; f16 = IEEE half; structs in quant/blocks.h):
 *   F32, F16, BF16: one element per "block" (4, 2, 2 bytes). BF16 is the high half of an f32.
 *   Q8_0 (32 elements, 34 bytes): { f16 d; int8 qs[32]; }              x[j] = d * qs[j]
 *   Q4_0 (32 elements, 18 bytes): { f16 d; u8 qs[16]; }
 *        x[j] = d * ((qs[j] & 15) - 8),  x[j+16] = d * ((qs[j] >> 4) - 8),  j < 16
 *   Q4_1 (32 elements, 20 bytes): { f16 d; f16 m; u8 qs[16]; }
 *        x[j] = d * (qs[j] & 15) + m,    x[j+16] = d * (qs[j] >> 4) + m
 *   Q5_0 (32 elements, 22 bytes): { f16 d; u8 qh[4]; u8 qs[16]; }, h = qh as a little-endian u32
 *        x[j]    = d * (((qs[j] & 15) | (h >> j & 1) << 4) - 16)
 *        x[j+16] = d * (((qs[j] >> 4) | (h >> (j+16) & 1) << 4) - 16)
 *   Q5_1 (32 elements, 24 bytes): { f16 d; f16 m; u8 qh[4]; u8 qs[16]; }   as Q5_0 without the -16, then + m
 *   Q4_K (256 elements, 144 bytes): { f16 d; f16 dmin; u8 scales[12]; u8 qs[128]; }
 *        8 sub-blocks of 32 with a 6-bit scale sc[i] and a 6-bit min mn[i]:
 *          i < 4:  sc = scales[i] & 63,  mn = scales[i+4] & 63
 *          i >= 4: sc = (scales[i+4] & 15) | ((scales[i-4] >> 6) << 4),
 *                  mn = (scales[i+4] >> 4) | ((scales[i] >> 6) << 4)
 *        Sub-blocks 2p and 2p+1 (p < 4) share qs[32p .. 32p+31]: low nibbles are sub-block 2p, high 2p+1.
 *        x = (d * sc) * q - (dmin * mn).
 *   Q5_K (256 elements, 176 bytes): { f16 d; f16 dmin; u8 scales[12]; u8 qh[32]; u8 qs[128]; }
 *        as Q4_K, with a fifth bit: element 32i + l (i < 8, l < 32) adds 16 * (qh[l] >> i & 1) to its nibble.
 *   Q6_K (256 elements, 210 bytes): { u8 ql[128]; u8 qh[64]; int8 scales[16]; f16 d; }
 *        Two halves of 128; in half h (ql += 64h, qh += 32h, scales += 8h), for l < 32:
 *          q0 = (ql[l]    & 15) | ((qh[l] >> 0 & 3) << 4)   -> element l       (scale index l/16)
 *          q1 = (ql[l+32] & 15) | ((qh[l] >> 2 & 3) << 4)   -> element l + 32  (scale index l/16 + 2)
 *          q2 = (ql[l]    >> 4) | ((qh[l] >> 4 & 3) << 4)   -> element l + 64  (scale index l/16 + 4)
 *          q3 = (ql[l+32] >> 4) | ((qh[l] >> 6 & 3) << 4)   -> element l + 96  (scale index l/16 + 6)
 *        x = (d * scales[s]) * (q - 32).
 * The expressions are evaluated in f32 in exactly that order, and this library is compiled with
 * -ffp-contract=off, so the results are bitwise those of ggml's scalar code and of gguf-py (numpy).
 */
#include <string.h>

#include "quant/blocks.h"
#include "quant/fp16.h"
#include "quant/rows.h"

/* Vector-returning static helpers are never called across an ABI boundary. */
#pragma GCC diagnostic ignored "-Wpsabi"

/* 16-lane vectors (GCC/Clang extensions): one AVX-512 register, two AVX2 ones, or plain loops elsewhere.
 * The lane-wise arithmetic is exactly the scalar expression, so results do not depend on the vector width. */
typedef uint8_t v16u8 __attribute__((vector_size(16), aligned(1)));
typedef int32_t v16i32 __attribute__((vector_size(64)));
typedef float v16f __attribute__((vector_size(64)));
typedef float v16fu __attribute__((vector_size(64), aligned(4)));

static inline v16f v16_from_u8(v16u8 q)
{
    return __builtin_convertvector(__builtin_convertvector(q, v16i32), v16f);
}

void row_q8_0_to_f32(const void *src, float *restrict y, int64_t n)
{
    const struct block_q8_0 *restrict b = src;
    const int64_t nb = n / QK8_0;
    for (int64_t i = 0; i < nb; i++, y += QK8_0) {
        const float d = f16_to_f32(b[i].d);
        for (int j = 0; j < QK8_0; j++) y[j] = d * (float)b[i].qs[j];
    }
}

void row_q4_0_to_f32(const void *src, float *restrict y, int64_t n)
{
    const struct block_q4_0 *restrict b = src;
    const int64_t nb = n / QK4_0;
    for (int64_t i = 0; i < nb; i++, y += QK4_0) {
        const float d = f16_to_f32(b[i].d);
        const v16u8 q = *(const v16u8 *)b[i].qs;
        *(v16fu *)y = d * (v16_from_u8(q & 15) - 8.0f);
        *(v16fu *)(y + 16) = d * (v16_from_u8(q >> 4) - 8.0f);
    }
}

void row_q4_1_to_f32(const void *src, float *restrict y, int64_t n)
{
    const struct block_q4_1 *restrict b = src;
    const int64_t nb = n / QK4_1;
    for (int64_t i = 0; i < nb; i++, y += QK4_1) {
        const float d = f16_to_f32(b[i].d), m = f16_to_f32(b[i].m);
        const v16u8 q = *(const v16u8 *)b[i].qs;
        *(v16fu *)y = d * v16_from_u8(q & 15) + m;
        *(v16fu *)(y + 16) = d * v16_from_u8(q >> 4) + m;
    }
}

void row_q5_0_to_f32(const void *src, float *restrict y, int64_t n)
{
    const struct block_q5_0 *restrict b = src;
    const int64_t nb = n / QK5_0;
    for (int64_t i = 0; i < nb; i++, y += QK5_0) {
        const float d = f16_to_f32(b[i].d);
        uint32_t qh;
        memcpy(&qh, b[i].qh, sizeof qh);
        for (int j = 0; j < QK5_0 / 2; j++) {
            const int x0 = ((b[i].qs[j] & 15) | (int)((qh >> j) << 4 & 16)) - 16;
            const int x1 = ((b[i].qs[j] >> 4) | (int)((qh >> (j + 12)) & 16)) - 16;
            y[j] = (float)x0 * d;
            y[j + QK5_0 / 2] = (float)x1 * d;
        }
    }
}

void row_q5_1_to_f32(const void *src, float *restrict y, int64_t n)
{
    const struct block_q5_1 *restrict b = src;
    const int64_t nb = n / QK5_1;
    for (int64_t i = 0; i < nb; i++, y += QK5_1) {
        const float d = f16_to_f32(b[i].d), m = f16_to_f32(b[i].m);
        uint32_t qh;
        memcpy(&qh, b[i].qh, sizeof qh);
        for (int j = 0; j < QK5_1 / 2; j++) {
            const int x0 = (b[i].qs[j] & 15) | (int)((qh >> j) << 4 & 16);
            const int x1 = (b[i].qs[j] >> 4) | (int)((qh >> (j + 12)) & 16);
            y[j] = (float)x0 * d + m;
            y[j + QK5_1 / 2] = (float)x1 * d + m;
        }
    }
}

void row_q4_k_to_f32(const void *src, float *restrict y, int64_t n)
{
    const struct block_q4_k *restrict b = src;
    const int64_t nb = n / QK_K;
    for (int64_t i = 0; i < nb; i++) {
        const float d = f16_to_f32(b[i].d), dmin = f16_to_f32(b[i].dmin);
        const uint8_t *q = b[i].qs;
        for (int p = 0; p < 4; p++, q += 32) {
            uint8_t sc, mn;
            block_q4_k_scale_min(2 * p, b[i].scales, &sc, &mn);
            const float d1 = d * (float)sc, m1 = dmin * (float)mn;
            block_q4_k_scale_min(2 * p + 1, b[i].scales, &sc, &mn);
            const float d2 = d * (float)sc, m2 = dmin * (float)mn;
            for (int l = 0; l < 32; l++) *y++ = d1 * (float)(q[l] & 15) - m1;
            for (int l = 0; l < 32; l++) *y++ = d2 * (float)(q[l] >> 4) - m2;
        }
    }
}

void row_q5_k_to_f32(const void *src, float *restrict y, int64_t n)
{
    const struct block_q5_k *restrict b = src;
    const int64_t nb = n / QK_K;
    for (int64_t i = 0; i < nb; i++) {
        const float d = f16_to_f32(b[i].d), dmin = f16_to_f32(b[i].dmin);
        const uint8_t *q = b[i].qs, *qh = b[i].qh;
        for (int p = 0; p < 4; p++, q += 32) {
            uint8_t sc, mn;
            block_q4_k_scale_min(2 * p, b[i].scales, &sc, &mn);
            const float d1 = d * (float)sc, m1 = dmin * (float)mn;
            block_q4_k_scale_min(2 * p + 1, b[i].scales, &sc, &mn);
            const float d2 = d * (float)sc, m2 = dmin * (float)mn;
            for (int l = 0; l < 32; l++) *y++ = d1 * (float)((q[l] & 15) + (qh[l] >> (2 * p) & 1) * 16) - m1;
            for (int l = 0; l < 32; l++)
                *y++ = d2 * (float)((q[l] >> 4) + (qh[l] >> (2 * p + 1) & 1) * 16) - m2;
        }
    }
}

void row_q6_k_to_f32(const void *src, float *restrict y, int64_t n)
{
    const struct block_q6_k *restrict b = src;
    const int64_t nb = n / QK_K;
    for (int64_t i = 0; i < nb; i++) {
        const float d = f16_to_f32(b[i].d);
        const uint8_t *ql = b[i].ql, *qh = b[i].qh;
        const int8_t *sc = b[i].scales;
        for (int h = 0; h < 2; h++, y += 128, ql += 64, qh += 32, sc += 8) {
            for (int is = 0; is < 2; is++) {
                /* l in [16*is, 16*is + 16): the four scales are fixed, so the loop vectorizes. */
                const float s0 = d * (float)sc[is], s1 = d * (float)sc[is + 2];
                const float s2 = d * (float)sc[is + 4], s3 = d * (float)sc[is + 6];
                const int l = 16 * is;
                const v16u8 a = *(const v16u8 *)(ql + l), c = *(const v16u8 *)(ql + l + 32);
                const v16u8 h2 = *(const v16u8 *)(qh + l);
                *(v16fu *)(y + l) = s0 * (v16_from_u8((a & 15) | ((h2 & 3) << 4)) - 32.0f);
                *(v16fu *)(y + l + 32) = s1 * (v16_from_u8((c & 15) | ((h2 >> 2 & 3) << 4)) - 32.0f);
                *(v16fu *)(y + l + 64) = s2 * (v16_from_u8((a >> 4) | ((h2 >> 4 & 3) << 4)) - 32.0f);
                *(v16fu *)(y + l + 96) = s3 * (v16_from_u8((c >> 4) | ((h2 >> 6 & 3) << 4)) - 32.0f);
            }
        }
    }
}

void row_f32_to_f32(const void *src, float *dst, int64_t n)
{
    memmove(dst, src, (size_t)n * sizeof(float));
}

void row_f16_to_f32(const void *src, float *dst, int64_t n)
{
    const uint16_t *h = src;
    int64_t i = 0;
#if defined(__F16C__)
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const void *)(h + i))));
#endif
    for (; i < n; i++) dst[i] = f16_to_f32(h[i]);
}

void row_bf16_to_f32(const void *src, float *dst, int64_t n)
{
    const uint16_t *h = src;
    for (int64_t i = 0; i < n; i++) dst[i] = bf16_to_f32(h[i]);
}

/* Q2_K (256 elements, 84 bytes): { u8 scales[16]; u8 qs[64]; f16 d; f16 dmin; }. Element e = 128h + 32j + l
 * (h < 2, j < 4, l < 32): q = (qs[32h + l] >> 2j) & 3; its sub-block t = e / 16 has scale d·(scales[t] & 15)
 * and minimum dmin·(scales[t] >> 4); x = (d·sc)·q - (dmin·mn). */
void row_q2_k_to_f32(const void *src, float *restrict y, int64_t n)
{
    const struct block_q2_k *restrict b = src;
    for (int64_t i = 0; i < n / QK_K; i++) {
        const float d = f16_to_f32(b[i].d), dmin = f16_to_f32(b[i].dmin);
        for (int t = 0; t < 16; t++, y += 16) {
            const float dl = d * (float)(b[i].scales[t] & 15), ml = dmin * (float)(b[i].scales[t] >> 4);
            const int h = t / 8, j = (t % 8) / 2, l0 = 16 * (t % 2);
            for (int l = 0; l < 16; l++) y[l] = dl * (float)((b[i].qs[32 * h + l0 + l] >> (2 * j)) & 3) - ml;
        }
    }
}

/* Q3_K (256 elements, 110 bytes): { u8 hmask[32]; u8 qs[64]; u8 scales[12]; f16 d; }. Element e = 128h + 32j
 * + l: low bits (qs[32h + l] >> 2j) & 3, minus 4 unless bit 4h + j of hmask[l] is set; sub-block t = e / 16
 * has the 6-bit scale s_t (block_q3_k_scale); x = (d·(s_t - 32))·q. */
void row_q3_k_to_f32(const void *src, float *restrict y, int64_t n)
{
    const struct block_q3_k *restrict b = src;
    for (int64_t i = 0; i < n / QK_K; i++) {
        const float d = f16_to_f32(b[i].d);
        for (int t = 0; t < 16; t++, y += 16) {
            const float dl = d * (float)(block_q3_k_scale(t, b[i].scales) - 32);
            const int h = t / 8, j = (t % 8) / 2, l0 = 16 * (t % 2);
            for (int l = 0; l < 16; l++) {
                const int q = ((b[i].qs[32 * h + l0 + l] >> (2 * j)) & 3) -
                              ((b[i].hmask[l0 + l] >> (4 * h + j)) & 1 ? 0 : 4);
                y[l] = dl * (float)q;
            }
        }
    }
}
