/* blocks — the byte layouts of ggml's quantized blocks, shared by quant/ and kernels/.
 *
 * Each struct is exactly one block as it sits in a GGUF file (little-endian, packed, no padding; the
 * static_asserts pin the sizes to the table in quant/dtype.c). f16 fields are IEEE half bits (quant/fp16.h).
 * The meaning of every field is restated in quant/dequant.c's first comment.
 */
#ifndef FERRY_QUANT_BLOCKS_H
#define FERRY_QUANT_BLOCKS_H

#include <assert.h>
#include <stdint.h>

#define QK8_0        32
#define QK4_0        32
#define QK4_1        32
#define QK5_0        32
#define QK5_1        32
#define QK_K         256
#define K_SCALE_SIZE 12

struct block_q8_0 {
    uint16_t d;       /* f16 scale */
    int8_t qs[QK8_0]; /* x = d * qs */
};

struct block_q4_0 {
    uint16_t d;            /* f16 scale */
    uint8_t qs[QK4_0 / 2]; /* low nibbles: elements 0..15, high nibbles: 16..31; x = d * (q - 8) */
};

struct block_q4_1 {
    uint16_t d;            /* f16 scale */
    uint16_t m;            /* f16 minimum */
    uint8_t qs[QK4_1 / 2]; /* as q4_0; x = d * q + m */
};

struct block_q5_0 {
    uint16_t d;            /* f16 scale */
    uint8_t qh[4];         /* bit j of the little-endian u32: the 5th bit of element j */
    uint8_t qs[QK5_0 / 2]; /* low nibbles as q4_0; x = d * (q - 16) */
};

struct block_q5_1 {
    uint16_t d;            /* f16 scale */
    uint16_t m;            /* f16 minimum */
    uint8_t qh[4];         /* as q5_0 */
    uint8_t qs[QK5_1 / 2]; /* as q5_0; x = d * q + m */
};

struct block_q4_k {
    uint16_t d;                   /* f16 super-block scale of the 6-bit scales */
    uint16_t dmin;                /* f16 super-block scale of the 6-bit mins */
    uint8_t scales[K_SCALE_SIZE]; /* 8 scales + 8 mins, 6 bits each, packed (see dequant.c) */
    uint8_t qs[QK_K / 2];         /* 4-bit quants, 64 elements per 32 bytes (low then high nibbles) */
};

struct block_q5_k {
    uint16_t d;                   /* f16 super-block scale of the 6-bit scales */
    uint16_t dmin;                /* f16 super-block scale of the 6-bit mins */
    uint8_t scales[K_SCALE_SIZE]; /* as q4_k */
    uint8_t qh[QK_K / 8];         /* 5th bits: bit i of qh[j] belongs to element 32*i + j */
    uint8_t qs[QK_K / 2];         /* low 4 bits, as q4_k */
};

struct block_q6_k {
    uint8_t ql[QK_K / 2];     /* low 4 bits of the quants */
    uint8_t qh[QK_K / 4];     /* high 2 bits of the quants */
    int8_t scales[QK_K / 16]; /* 8-bit scales of the 16 sub-blocks of 16 */
    uint16_t d;               /* f16 super-block scale */
};

/* The 6-bit scale and minimum of sub-block i (< 8) of a Q4_K or Q5_K block, from its 12 packed bytes s. */
static inline void block_q4_k_scale_min(int i, const uint8_t *s, uint8_t *sc, uint8_t *mn)
{
    if (i < 4) {
        *sc = s[i] & 63;
        *mn = s[i + 4] & 63;
    } else {
        *sc = (uint8_t)((s[i + 4] & 15) | ((s[i - 4] >> 6) << 4));
        *mn = (uint8_t)((s[i + 4] >> 4) | ((s[i] >> 6) << 4));
    }
}

static_assert(sizeof(struct block_q8_0) == 34, "block_q8_0 size");
static_assert(sizeof(struct block_q4_0) == 18, "block_q4_0 size");
static_assert(sizeof(struct block_q4_1) == 20, "block_q4_1 size");
static_assert(sizeof(struct block_q5_0) == 22, "block_q5_0 size");
static_assert(sizeof(struct block_q5_1) == 24, "block_q5_1 size");
static_assert(sizeof(struct block_q4_k) == 144, "block_q4_k size");
static_assert(sizeof(struct block_q5_k) == 176, "block_q5_k size");
static_assert(sizeof(struct block_q6_k) == 210, "block_q6_k size");

#endif
