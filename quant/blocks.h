/* blocks — the byte layouts of ggml's quantized blocks, shared by quant/ and kernels/.
 *
 * Each struct is exactly one block as it sits in a GGUF file (little-endian, packed, no padding; the
 * static_asserts pin the sizes to the table in quant/dtype.c). f16 fields are IEEE half bits (quant/fp16.h).
 * The meaning of every field is restated in quant/dequant.c's first comment.
 */
#ifndef FERRY_QUANT_BLOCKS_H
#define FERRY_QUANT_BLOCKS_H

#include <assert.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#define QK8_0        32
#define QK4_0        32
#define QK4_1        32
#define QK5_0        32
#define QK5_1        32
#define QK_K         256
#define K_SCALE_SIZE 12
#define QK4_NL       32
#define QK_MXFP4     32
#define QK_NVFP4     64

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

/* ---- the 2- and 3-bit K-quants ---- */

struct block_q2_k {
    uint8_t scales[QK_K / 16]; /* sub-block t of 16: scale scales[t] & 15, minimum scales[t] >> 4 */
    uint8_t qs[QK_K / 4];      /* 2-bit quants, four elements per byte (see dequant.c) */
    uint16_t d;                /* f16 super-block scale of the scales */
    uint16_t dmin;             /* f16 super-block scale of the minimums */
};

struct block_q3_k {
    uint8_t hmask[QK_K / 8]; /* third bits: bit j of hmask[l] for element 32j + l; set = no -4 */
    uint8_t qs[QK_K / 4];    /* low 2 bits, as q2_k */
    uint8_t scales[12];      /* 16 scales of 6 bits, packed (see dequant.c), stored with +32 */
    uint16_t d;              /* f16 super-block scale */
};

/* ---- lookup-table types: non-linear 4-bit values, fp4, and the i-quants' lattice grids ---- */

struct block_iq4_nl {
    uint16_t d;             /* f16 scale */
    uint8_t qs[QK4_NL / 2]; /* nibbles as q4_0, indices into iq4nl_values */
};

struct block_iq4_xs {
    uint16_t d;                  /* f16 super-block scale */
    uint16_t scales_h;           /* high 2 bits of the 8 scales of 6 bits */
    uint8_t scales_l[QK_K / 64]; /* low 4 bits of the 8 scales */
    uint8_t qs[QK_K / 2];        /* 8 sub-blocks of 32 laid out as iq4_nl's */
};

struct block_mxfp4 {
    uint8_t e;                /* E8M0 scale exponent */
    uint8_t qs[QK_MXFP4 / 2]; /* nibbles as q4_0, E2M1 codes (fp4_values: doubled) */
};

struct block_nvfp4 {
    uint8_t d[QK_NVFP4 / 16]; /* UE4M3 scale of each 16 elements */
    uint8_t qs[QK_NVFP4 / 2]; /* per 16 elements 8 bytes of E2M1 nibbles, low nibbles first */
};

struct block_iq2_xxs {
    uint16_t d; /* f16 super-block scale */
    uint16_t
        qs[QK_K / 8]; /* per 32 elements two u32: 4 grid indices (bytes), then 4x7 sign bits + 4-bit scale */
};

struct block_iq2_xs {
    uint16_t d;                /* f16 super-block scale */
    uint16_t qs[QK_K / 8];     /* per 8 elements: 9-bit grid index | 7 sign bits << 9 */
    uint8_t scales[QK_K / 32]; /* two 4-bit scales per 32 elements (one per 16) */
};

struct block_iq2_s {
    uint16_t d;                /* f16 super-block scale */
    uint8_t qs[QK_K / 4];      /* 32 low bytes of the 10-bit grid indices, then 32 bytes of signs */
    uint8_t qh[QK_K / 32];     /* the indices' high 2 bits, four per byte */
    uint8_t scales[QK_K / 32]; /* as iq2_xs */
};

struct block_iq3_xxs {
    uint16_t d;               /* f16 super-block scale */
    uint8_t qs[3 * QK_K / 8]; /* 64 grid indices (4 elements each), then per 32 elements a u32 as iq2_xxs's */
};

struct block_iq3_s {
    uint16_t d;                /* f16 super-block scale */
    uint8_t qs[QK_K / 4];      /* low bytes of the 9-bit grid indices (4 elements each) */
    uint8_t qh[QK_K / 32];     /* their ninth bits */
    uint8_t signs[QK_K / 8];   /* one sign bit per element */
    uint8_t scales[QK_K / 64]; /* two 4-bit scales per 64 elements */
};

struct block_iq1_s {
    uint16_t d;             /* f16 super-block scale */
    uint8_t qs[QK_K / 8];   /* low bytes of the 11-bit grid indices (8 elements each) */
    uint16_t qh[QK_K / 32]; /* per 32 elements: 4x3 high index bits, 3-bit scale, delta sign (bit 15) */
};

struct block_iq1_m {
    uint8_t qs[QK_K / 8];      /* low bytes of the 11-bit grid indices */
    uint8_t qh[QK_K / 16];     /* per 16 elements: 2x (3 high index bits, delta sign bit) */
    uint8_t scales[QK_K / 32]; /* 16 scales of 3 bits, and the f16 super-block scale in the top nibbles */
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

/* The 6-bit scale (stored with +32) of sub-block j (< 16) of a Q3_K block, from its 12 packed bytes s: the
 * low nibbles of s[0..7], then their high nibbles, with two more bits from s[8 + j % 4]. */
static inline int block_q3_k_scale(int j, const uint8_t *s)
{
    return ((s[j % 8] >> (4 * (j / 8))) & 15) | (((s[8 + j % 4] >> (2 * (j / 4))) & 3) << 4);
}

/* The 6-bit scale (stored with +32) of sub-block j (< 8) of an IQ4_XS block. */
static inline int block_iq4_xs_scale(int j, const struct block_iq4_xs *b)
{
    return ((b->scales_l[j / 2] >> (4 * (j % 2))) & 15) | (((b->scales_h >> (2 * j)) & 3) << 4);
}

/* The f16 bits of an IQ1_M block's super-block scale: the top nibbles of its four u16 scale words. */
static inline uint16_t block_iq1_m_d(const struct block_iq1_m *b)
{
    uint16_t sc[4];
    memcpy(sc, b->scales, sizeof sc);
    return (uint16_t)((sc[0] >> 12) | ((sc[1] >> 8) & 0x00f0) | ((sc[2] >> 4) & 0x0f00) | (sc[3] & 0xf000));
}

/* MXFP4's E8M0 exponent as an f32 scale, halved (the E2M1 values are stored doubled): 2^(e - 128). */
static inline float block_e8m0_half(uint8_t e)
{
    const uint32_t bits = e < 2 ? 0x00200000u << e : (uint32_t)(e - 1) << 23;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

/* NVFP4's unsigned E4M3 scale (bias 7; the top bit is ignored; 0 and 0x7F read as 0) as an f32, halved. */
static inline float block_ue4m3_half(uint8_t x)
{
    if (x == 0 || x == 0x7F) return 0.0f;
    const int e = (x >> 3) & 15, m = x & 7;
    const float raw = e == 0 ? ldexpf((float)m, -9) : ldexpf(1.0f + (float)m / 8.0f, e - 7);
    return raw * 0.5f;
}

static_assert(sizeof(struct block_q8_0) == 34, "block_q8_0 size");
static_assert(sizeof(struct block_q4_0) == 18, "block_q4_0 size");
static_assert(sizeof(struct block_q4_1) == 20, "block_q4_1 size");
static_assert(sizeof(struct block_q5_0) == 22, "block_q5_0 size");
static_assert(sizeof(struct block_q5_1) == 24, "block_q5_1 size");
static_assert(sizeof(struct block_q4_k) == 144, "block_q4_k size");
static_assert(sizeof(struct block_q5_k) == 176, "block_q5_k size");
static_assert(sizeof(struct block_q6_k) == 210, "block_q6_k size");
static_assert(sizeof(struct block_q2_k) == 84, "block_q2_k size");
static_assert(sizeof(struct block_q3_k) == 110, "block_q3_k size");
static_assert(sizeof(struct block_iq4_nl) == 18, "block_iq4_nl size");
static_assert(sizeof(struct block_iq4_xs) == 136, "block_iq4_xs size");
static_assert(sizeof(struct block_mxfp4) == 17, "block_mxfp4 size");
static_assert(sizeof(struct block_nvfp4) == 36, "block_nvfp4 size");
static_assert(sizeof(struct block_iq2_xxs) == 66, "block_iq2_xxs size");
static_assert(sizeof(struct block_iq2_xs) == 74, "block_iq2_xs size");
static_assert(sizeof(struct block_iq2_s) == 82, "block_iq2_s size");
static_assert(sizeof(struct block_iq3_xxs) == 98, "block_iq3_xxs size");
static_assert(sizeof(struct block_iq3_s) == 110, "block_iq3_s size");
static_assert(sizeof(struct block_iq1_s) == 50, "block_iq1_s size");
static_assert(sizeof(struct block_iq1_m) == 56, "block_iq1_m size");

#endif
