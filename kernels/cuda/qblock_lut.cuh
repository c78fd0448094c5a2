/* qblock_lut — the qblock.cuh traits of the lookup-table types: IQ4_NL, IQ4_XS, MXFP4, NVFP4, Q3_K and the
 * i-quants IQ3_XXS, IQ3_S, IQ2_XXS, IQ2_XS, IQ2_S, IQ1_S, IQ1_M (layouts: quant/dequant_iq.c,
 * quant/dequant.c).
 *
 * Every value of these types is a small signed integer times a scale per 32 (or per 16: TWO_D) elements, so a
 * unit of 32 is 8 words of int8 values (QOFF 0, no minimum) and the shared kernels run them unchanged;
 * Q2_K adds a minimum per 16 elements (TWO_M: m for elements 0..15, m1 for 16..31, taken through the halves'
 * sums of the int8 x):
 *   Q2_K: q in 0..3, d·sc per 16 and -dmin·mn per 16.
 *   IQ4_NL, IQ4_XS, MXFP4, NVFP4: the 4-bit codes through their 16-value table (two byte permutes, no
 *     memory); IQ4_XS's scale d·(s - 32), MXFP4's 2^(e - 128), NVFP4's UE4M3/2 per 16.
 *   Q3_K: q - 4 from the 2 low bits and the high-mask bit; d·(s - 32) per 16.
 *   IQ3/IQ2: grid rows (a read-only device table, row r byte j = element j) with their sign bits: ±grid.
 *   IQ1_S/IQ1_M: 8·grid ± 1 (the ±1/8 delta times 8) with the scale divided by 8 (exact: a power of two).
 * Each value d·q is exact in f32 (at most 24 significant bits), so fma(d, q, -0.0f) is bitwise dequant_row's
 * (tests/cuda/test_qblock.cc). Bytes are read one at a time (any alignment; the staged copies' slack is
 * never touched); one unit is one piece (UPP 1), and frag decodes only the two words a thread of the MMA
 * needs. MXFP4's 17-byte blocks make its W only byte-aligned (ALIGN 1).
 */
#ifndef FERRY_KERN_CUDA_QBLOCK_LUT_CUH
#define FERRY_KERN_CUDA_QBLOCK_LUT_CUH

#include "quant/iq_grids.h"
#include "quant/iq_tables.h"

/* ---- tables: the grids in device memory (one copy per translation unit), the host's from quant/ ---- */

#ifdef __CUDACC__
static __device__ const uint64_t qb_dev_iq2xxs[256] = IQ2XXS_GRID_INIT;
static __device__ const uint64_t qb_dev_iq2xs[512] = IQ2XS_GRID_INIT;
static __device__ const uint64_t qb_dev_iq2s[1024] = IQ2S_GRID_INIT;
static __device__ const uint32_t qb_dev_iq3xxs[256] = IQ3XXS_GRID_INIT;
static __device__ const uint32_t qb_dev_iq3s[512] = IQ3S_GRID_INIT;
static __device__ const uint64_t qb_dev_iq1s[2048] = IQ1S_GRID_INIT;
#endif

#ifdef __CUDA_ARCH__
#define QB_GRID(dev, host, i) __ldg(&(dev)[i])
#else
#define QB_GRID(dev, host, i) (host)[i]
#endif

QB_FN uint64_t qb_grid_iq2xxs(uint32_t i)
{
    return QB_GRID(qb_dev_iq2xxs, iq2xxs_grid, i);
}
QB_FN uint64_t qb_grid_iq2xs(uint32_t i)
{
    return QB_GRID(qb_dev_iq2xs, iq2xs_grid, i);
}
QB_FN uint64_t qb_grid_iq2s(uint32_t i)
{
    return QB_GRID(qb_dev_iq2s, iq2s_grid, i);
}
QB_FN uint32_t qb_grid_iq3xxs(uint32_t i)
{
    return QB_GRID(qb_dev_iq3xxs, iq3xxs_grid, i);
}
QB_FN uint32_t qb_grid_iq3s(uint32_t i)
{
    return QB_GRID(qb_dev_iq3s, iq3s_grid, i);
}
QB_FN uint64_t qb_grid_iq1s(uint32_t i)
{
    return QB_GRID(qb_dev_iq1s, iq1s_grid, i);
}

/* ---- byte access ---- */

QB_FN uint32_t qb_b8(const uint8_t *p)
{
    return p[0];
}
QB_FN uint32_t qb_b16(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8;
}
QB_FN uint32_t qb_b32(const uint8_t *p)
{
    return qb_b16(p) | qb_b16(p + 2) << 16;
}

/* ---- 16-value tables by byte permutes ---- */

/* Bytes a..d as a word. */
QB_FN constexpr uint32_t qb_pack4(int a, int b, int c, int d)
{
    return (uint32_t)(a & 255) | (uint32_t)(b & 255) << 8 | (uint32_t)(c & 255) << 16 |
           (uint32_t)(d & 255) << 24;
}

/* The table entries (as bytes) of the 4-bit codes in the low nibbles of x's four bytes. */
QB_FN uint32_t qb_lut16(uint32_t x, uint32_t t0, uint32_t t1, uint32_t t2, uint32_t t3)
{
    const uint32_t sel = (x & 7) | ((x >> 4) & 0x70) | ((x >> 8) & 0x700) | ((x >> 12) & 0x7000);
    const uint32_t lo = qb_prmt(t0, t1, sel), hi = qb_prmt(t2, t3, sel);
    const uint32_t m = ((x >> 3) & 0x01010101u) * 0xFFu;
    return (lo & ~m) | (hi & m);
}

/* iq4nl_values: -127 -104 -83 -65 -49 -35 -22 -10 1 13 25 38 53 69 89 113 */
QB_FN uint32_t qb_iq4nl(uint32_t x)
{
    return qb_lut16(x, qb_pack4(-127, -104, -83, -65), qb_pack4(-49, -35, -22, -10), qb_pack4(1, 13, 25, 38),
                    qb_pack4(53, 69, 89, 113));
}
/* fp4_values (E2M1 doubled): 0 1 2 3 4 6 8 12 0 -1 -2 -3 -4 -6 -8 -12 */
QB_FN uint32_t qb_fp4(uint32_t x)
{
    return qb_lut16(x, qb_pack4(0, 1, 2, 3), qb_pack4(4, 6, 8, 12), qb_pack4(0, -1, -2, -3),
                    qb_pack4(-4, -6, -8, -12));
}

/* Word j (elements 4j..4j+3) of 32 nibble-coded elements whose 16 bytes start at qs (low nibbles: elements
 * 0..15, high: 16..31), as codes. */
QB_FN uint32_t qb_nib_word(const uint8_t *qs, int j)
{
    return (qb_b32(qs + 4 * (j & 3)) >> (4 * (j >> 2))) & 0x0F0F0F0Fu;
}

/* 4 bytes of grid row g from element e0, negated where sign bits s (bit i for element i) are set. */
QB_FN uint32_t qb_signed4(uint64_t g, int e0, uint32_t s)
{
    uint32_t r = 0;
    QB_UNROLL
    for (int i = 0; i < 4; i++) {
        const int v = (int)((g >> (8 * (e0 + i))) & 0xFF);
        r |= (uint32_t)((s >> i & 1 ? -v : v) & 0xFF) << (8 * i);
    }
    return r;
}

/* IQ1: 4 bytes of 8·g + delta, g the int8 grid values from element e0. */
QB_FN uint32_t qb_iq1_4(uint64_t g, int e0, int delta)
{
    uint32_t r = 0;
    QB_UNROLL
    for (int i = 0; i < 4; i++)
        r |= (uint32_t)((8 * (int)(int8_t)(g >> (8 * (e0 + i))) + delta) & 0xFF) << (8 * i);
    return r;
}

QB_FN uint32_t qb_signs7(uint32_t i)
{
    i &= 127;
#ifdef __CUDA_ARCH__
    return i | (uint32_t)(__popc(i) & 1) << 7;
#else
    return i | (uint32_t)(__builtin_parity(i)) << 7;
#endif
}

/* 2^(e - 128) (MXFP4's scale, halved). */
QB_FN float qb_e8m0_half(uint32_t e)
{
    const uint32_t bits = e < 2 ? 0x00200000u << e : (e - 1) << 23;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

/* NVFP4's UE4M3 scale, halved: (8 + m)·2^(e - 11), or m·2^-10 (e = 0); 0 for 0 and 0x7F. Exact. */
QB_FN float qb_ue4m3_half(uint32_t x)
{
    if (x == 0 || x == 0x7F) return 0.0f;
    const uint32_t e = (x >> 3) & 15, m = x & 7;
    const uint32_t pbits = e == 0 ? (uint32_t)(127 - 10) << 23 : (e - 11 + 127) << 23;
    float p;
    memcpy(&p, &pbits, 4);
    return qb_mul((float)(e == 0 ? m : 8 + m), p);
}

/* ---- the common trait: D::word(blk, U, j) (word j of unit U) and D::scales(blk, U, d0, d1) ---- */

template <class D> struct qb_lut {
    static constexpr int QK = D::QK, BYTES = D::BYTES, ALIGN = D::ALIGN, UPP = 1, PPB = D::QK / 32, QOFF = 0;
    static constexpr bool TWO_D = D::TWO_D, HAS_M = D::TWO_M, TWO_M = D::TWO_M, EXACT_H = D::EXACT_H;
    struct raw {
        const uint8_t *b; /* the block (staged copies stay in place while a unit is decoded) */
    };
    static QB_FN void load(raw &r, const uint8_t *blk, int) { r.b = blk; }
    static QB_FN int unit_elem(int p, int) { return 32 * p; }
    static QB_FN void unit(const raw &r, int p, int, qb_unit &u)
    {
        QB_UNROLL
        for (int j = 0; j < 8; j++) u.q[j] = D::word(r.b, p, j);
        D::scales(r.b, p, u.d0, u.d1);
        u.m = u.m1 = -0.0f;
        if constexpr (D::TWO_M) D::mins(r.b, p, u.m, u.m1);
    }
    static QB_FN void frag(const uint8_t *blk, int U, int t, qb_frag &f)
    {
        f.w0 = D::word(blk, U, t);
        f.w1 = D::word(blk, U, t + 4);
        D::scales(blk, U, f.d0, f.d1);
        f.m = f.m1 = -0.0f;
        if constexpr (D::TWO_M) D::mins(blk, U, f.m, f.m1);
    }
};

/* IQ4_NL (18 bytes): { f16 d; u8 qs[16]; } */
struct qbd_iq4_nl {
    static constexpr int QK = 32, BYTES = 18, ALIGN = 2;
    static constexpr bool TWO_D = false, TWO_M = false, EXACT_H = true;
    static QB_FN uint32_t word(const uint8_t *b, int, int j) { return qb_iq4nl(qb_nib_word(b + 2, j)); }
    static QB_FN void scales(const uint8_t *b, int, float &d0, float &d1) { d0 = d1 = qb_f16(qb_b16(b)); }
};

/* IQ4_XS (136 bytes): { f16 d; u16 scales_h; u8 scales_l[4]; u8 qs[128]; } sub-block U at qs + 16U. */
struct qbd_iq4_xs {
    static constexpr int QK = 256, BYTES = 136, ALIGN = 8;
    static constexpr bool TWO_D = false, TWO_M = false, EXACT_H = false;
    static QB_FN uint32_t word(const uint8_t *b, int U, int j)
    {
        return qb_iq4nl(qb_nib_word(b + 8 + 16 * U, j));
    }
    static QB_FN void scales(const uint8_t *b, int U, float &d0, float &d1)
    {
        const uint32_t ls = ((qb_b8(b + 4 + U / 2) >> (4 * (U % 2))) & 15) | ((qb_b16(b + 2) >> (2 * U)) & 3)
                                                                                 << 4;
        d0 = d1 = qb_mul(qb_f16(qb_b16(b)), (float)((int)ls - 32));
    }
};

/* MXFP4 (17 bytes): { u8 e; u8 qs[16]; } */
struct qbd_mxfp4 {
    static constexpr int QK = 32, BYTES = 17, ALIGN = 1;
    static constexpr bool TWO_D = false, TWO_M = false, EXACT_H = false;
    static QB_FN uint32_t word(const uint8_t *b, int, int j) { return qb_fp4(qb_nib_word(b + 1, j)); }
    static QB_FN void scales(const uint8_t *b, int, float &d0, float &d1)
    {
        d0 = d1 = qb_e8m0_half(qb_b8(b));
    }
};

/* NVFP4 (36 bytes): { u8 d[4]; u8 qs[32]; } unit U = sub-blocks 2U and 2U + 1 of 16 (8 bytes each: low
 * nibbles elements 0..7, high 8..15). */
struct qbd_nvfp4 {
    static constexpr int QK = 64, BYTES = 36, ALIGN = 4;
    static constexpr bool TWO_D = true, TWO_M = false, EXACT_H = false;
    static QB_FN uint32_t word(const uint8_t *b, int U, int j)
    {
        const int s = 2 * U + j / 4, e0 = 4 * (j % 4);
        return qb_fp4((qb_b32(b + 4 + 8 * s + (e0 & 7)) >> (e0 & 8 ? 4 : 0)) & 0x0F0F0F0Fu);
    }
    static QB_FN void scales(const uint8_t *b, int U, float &d0, float &d1)
    {
        d0 = qb_ue4m3_half(qb_b8(b + 2 * U));
        d1 = qb_ue4m3_half(qb_b8(b + 2 * U + 1));
    }
};

/* Q3_K (110 bytes): { u8 hmask[32]; u8 qs[64]; u8 scales[12]; f16 d; } unit U = 4h + jj: elements l of qs[32h
 * + l] >> 2jj, minus 4 unless bit 4h + jj of hmask[l]. */
struct qbd_q3_k {
    static constexpr int QK = 256, BYTES = 110, ALIGN = 2;
    static constexpr bool TWO_D = true, TWO_M = false, EXACT_H = false;
    static QB_FN uint32_t word(const uint8_t *b, int U, int j)
    {
        const int h = U / 4, jj = U % 4;
        const uint32_t lo = (qb_b32(b + 32 + 32 * h + 4 * j) >> (2 * jj)) & 0x03030303u;
        const uint32_t hb = (qb_b32(b + 4 * j) >> (4 * h + jj)) & 0x01010101u;
        /* q - 4 + 4·hbit per byte: (lo | hb << 2) - 4, as int8 (no borrow between bytes: the 4 is taken
         * from 0x80-biased bytes) */
        return (((lo | hb << 2) | 0x80808080u) - 0x04040404u) ^ 0x80808080u;
    }
    static QB_FN int scale6(const uint8_t *b, int j)
    {
        return (int)(((qb_b8(b + 96 + j % 8) >> (4 * (j / 8))) & 15) |
                     ((qb_b8(b + 104 + j % 4) >> (2 * (j / 4))) & 3) << 4);
    }
    static QB_FN void scales(const uint8_t *b, int U, float &d0, float &d1)
    {
        const float d = qb_f16(qb_b16(b + 108));
        d0 = qb_mul(d, (float)(scale6(b, 2 * U) - 32));
        d1 = qb_mul(d, (float)(scale6(b, 2 * U + 1) - 32));
    }
};

/* Q2_K (84 bytes): { u8 scales[16]; u8 qs[64]; f16 d; f16 dmin; } unit U = 4h + jj: q = (qs[32h + l] >> 2jj)
 * & 3; sub-block t of 16: scale d·(scales[t] & 15), minimum -(dmin·(scales[t] >> 4)) (TWO_M: per 16). */
struct qbd_q2_k {
    static constexpr int QK = 256, BYTES = 84, ALIGN = 4;
    static constexpr bool TWO_D = true, TWO_M = true, EXACT_H = false;
    static QB_FN uint32_t word(const uint8_t *b, int U, int j)
    {
        return (qb_b32(b + 16 + 32 * (U / 4) + 4 * j) >> (2 * (U % 4))) & 0x03030303u;
    }
    static QB_FN void scales(const uint8_t *b, int U, float &d0, float &d1)
    {
        const float d = qb_f16(qb_b16(b + 80));
        d0 = qb_mul(d, (float)(qb_b8(b + 2 * U) & 15));
        d1 = qb_mul(d, (float)(qb_b8(b + 2 * U + 1) & 15));
    }
    static QB_FN void mins(const uint8_t *b, int U, float &m0, float &m1)
    {
        const float dmin = qb_f16(qb_b16(b + 82));
        m0 = -qb_mul(dmin, (float)(qb_b8(b + 2 * U) >> 4));
        m1 = -qb_mul(dmin, (float)(qb_b8(b + 2 * U + 1) >> 4));
    }
};

/* IQ2_XXS (66 bytes): per unit two u32 at 2 + 8U: 4 grid indices; 4 x 7 sign bits and the scale. */
struct qbd_iq2_xxs {
    static constexpr int QK = 256, BYTES = 66, ALIGN = 2;
    static constexpr bool TWO_D = false, TWO_M = false, EXACT_H = false;
    static QB_FN uint32_t word(const uint8_t *b, int U, int j)
    {
        const int l = j / 2;
        const uint32_t a1 = qb_b32(b + 6 + 8 * U);
        return qb_signed4(qb_grid_iq2xxs(qb_b8(b + 2 + 8 * U + l)), 4 * (j % 2),
                          qb_signs7(a1 >> (7 * l)) >> (4 * (j % 2)));
    }
    static QB_FN void scales(const uint8_t *b, int U, float &d0, float &d1)
    {
        const uint32_t ls = qb_b8(b + 9 + 8 * U) >> 4;
        d0 = d1 = qb_mul(qb_mul(qb_f16(qb_b16(b)), 0.5f + (float)ls), 0.25f);
    }
};

/* The scale of 16 elements of IQ2_XS/IQ2_S: d·(0.5 + s)·0.25, s the nibble. */
QB_FN float qb_iq2_scale(float d, uint32_t s)
{
    return qb_mul(qb_mul(d, 0.5f + (float)s), 0.25f);
}

/* IQ2_XS's and IQ2_S's two scales of unit U: the nibbles of byte U of the scales at b + off, f16 d at b. */
QB_FN void qb_iq2_scales(const uint8_t *b, int off, int U, float &d0, float &d1)
{
    const float d = qb_f16(qb_b16(b));
    const uint32_t s = qb_b8(b + off + U);
    d0 = qb_iq2_scale(d, s & 15);
    d1 = qb_iq2_scale(d, s >> 4);
}

/* IQ2_XS (74 bytes): { f16 d; u16 qs[32]; u8 scales[8]; } */
struct qbd_iq2_xs {
    static constexpr int QK = 256, BYTES = 74, ALIGN = 2;
    static constexpr bool TWO_D = true, TWO_M = false, EXACT_H = false;
    static QB_FN uint32_t word(const uint8_t *b, int U, int j)
    {
        const uint32_t q = qb_b16(b + 2 + 2 * (4 * U + j / 2));
        return qb_signed4(qb_grid_iq2xs(q & 511), 4 * (j % 2), qb_signs7(q >> 9) >> (4 * (j % 2)));
    }
    static QB_FN void scales(const uint8_t *b, int U, float &d0, float &d1)
    {
        qb_iq2_scales(b, 66, U, d0, d1);
    }
};

/* IQ2_S (82 bytes): { f16 d; u8 qs[32]; u8 signs[32]; u8 qh[8]; u8 scales[8]; } */
struct qbd_iq2_s {
    static constexpr int QK = 256, BYTES = 82, ALIGN = 2;
    static constexpr bool TWO_D = true, TWO_M = false, EXACT_H = false;
    static QB_FN uint32_t word(const uint8_t *b, int U, int j)
    {
        const int l = j / 2;
        const uint32_t idx = qb_b8(b + 2 + 4 * U + l) | ((qb_b8(b + 66 + U) << (8 - 2 * l)) & 0x300);
        return qb_signed4(qb_grid_iq2s(idx), 4 * (j % 2), qb_b8(b + 34 + 4 * U + l) >> (4 * (j % 2)));
    }
    static QB_FN void scales(const uint8_t *b, int U, float &d0, float &d1)
    {
        qb_iq2_scales(b, 74, U, d0, d1);
    }
};

/* IQ3_XXS (98 bytes): { f16 d; u8 qs[64] (grid rows of 4); u32 scales_and_signs[8]; } */
struct qbd_iq3_xxs {
    static constexpr int QK = 256, BYTES = 98, ALIGN = 2;
    static constexpr bool TWO_D = false, TWO_M = false, EXACT_H = false;
    static QB_FN uint32_t word(const uint8_t *b, int U, int j)
    {
        const uint32_t a = qb_b32(b + 66 + 4 * U);
        return qb_signed4(qb_grid_iq3xxs(qb_b8(b + 2 + 8 * U + j)), 0,
                          qb_signs7(a >> (7 * (j / 2))) >> (4 * (j % 2)));
    }
    static QB_FN void scales(const uint8_t *b, int U, float &d0, float &d1)
    {
        const uint32_t ls = qb_b8(b + 69 + 4 * U) >> 4;
        d0 = d1 = qb_mul(qb_mul(qb_f16(qb_b16(b)), 0.5f + (float)ls), 0.5f);
    }
};

/* IQ3_S (110 bytes): { f16 d; u8 qs[64]; u8 qh[8]; u8 signs[32]; u8 scales[4]; } */
struct qbd_iq3_s {
    static constexpr int QK = 256, BYTES = 110, ALIGN = 2;
    static constexpr bool TWO_D = false, TWO_M = false, EXACT_H = false;
    static QB_FN uint32_t word(const uint8_t *b, int U, int j)
    {
        const uint32_t idx = qb_b8(b + 2 + 8 * U + j) | ((qb_b8(b + 66 + U) << (8 - j)) & 256);
        return qb_signed4(qb_grid_iq3s(idx), 0, qb_b8(b + 74 + 4 * U + j / 2) >> (4 * (j % 2)));
    }
    static QB_FN void scales(const uint8_t *b, int U, float &d0, float &d1)
    {
        const uint32_t s = (qb_b8(b + 106 + U / 2) >> (4 * (U % 2))) & 15;
        d0 = d1 = qb_mul(qb_f16(qb_b16(b)), (float)(1 + 2 * s));
    }
};

/* IQ1_S (50 bytes): { f16 d; u8 qs[32]; u16 qh[8]; } */
struct qbd_iq1_s {
    static constexpr int QK = 256, BYTES = 50, ALIGN = 2;
    static constexpr bool TWO_D = false, TWO_M = false, EXACT_H = false;
    static QB_FN uint32_t word(const uint8_t *b, int U, int j)
    {
        const int l = j / 2;
        const uint32_t qh = qb_b16(b + 34 + 2 * U);
        return qb_iq1_4(qb_grid_iq1s(qb_b8(b + 2 + 4 * U + l) | ((qh >> (3 * l)) & 7) << 8), 4 * (j % 2),
                        qh & 0x8000 ? -1 : 1);
    }
    static QB_FN void scales(const uint8_t *b, int U, float &d0, float &d1)
    {
        const uint32_t qh = qb_b16(b + 34 + 2 * U);
        d0 = d1 = qb_mul(qb_mul(qb_f16(qb_b16(b)), (float)(2 * ((qh >> 12) & 7) + 1)), 0.125f);
    }
};

/* IQ1_M (56 bytes): { u8 qs[32]; u8 qh[16]; u8 scales[8]; } (the f16 d in the scales' top nibbles) */
struct qbd_iq1_m {
    static constexpr int QK = 256, BYTES = 56, ALIGN = 8;
    static constexpr bool TWO_D = true, TWO_M = false, EXACT_H = false;
    static QB_FN uint32_t word(const uint8_t *b, int U, int j)
    {
        const int l = j / 2;
        const uint32_t qh = qb_b8(b + 32 + 2 * U + l / 2), hi = l % 2 ? qh >> 4 : qh & 15;
        return qb_iq1_4(qb_grid_iq1s(qb_b8(b + 4 * U + l) | (hi & 7) << 8), 4 * (j % 2), hi & 8 ? -1 : 1);
    }
    static QB_FN void scales(const uint8_t *b, int U, float &d0, float &d1)
    {
        const uint32_t s0 = qb_b16(b + 48), s1 = qb_b16(b + 50), s2 = qb_b16(b + 52), s3 = qb_b16(b + 54);
        const float d = qb_f16((s0 >> 12) | ((s1 >> 8) & 0x00f0) | ((s2 >> 4) & 0x0f00) | (s3 & 0xf000));
        const uint32_t sc = qb_b16(b + 48 + 2 * (U / 2)) >> (6 * (U % 2));
        d0 = qb_mul(qb_mul(d, (float)(2 * (sc & 7) + 1)), 0.125f);
        d1 = qb_mul(qb_mul(d, (float)(2 * ((sc >> 3) & 7) + 1)), 0.125f);
    }
};

using qb_iq4_nl = qb_lut<qbd_iq4_nl>;
using qb_iq4_xs = qb_lut<qbd_iq4_xs>;
using qb_mxfp4 = qb_lut<qbd_mxfp4>;
using qb_nvfp4 = qb_lut<qbd_nvfp4>;
using qb_q2_k = qb_lut<qbd_q2_k>;
using qb_q3_k = qb_lut<qbd_q3_k>;
using qb_iq2_xxs = qb_lut<qbd_iq2_xxs>;
using qb_iq2_xs = qb_lut<qbd_iq2_xs>;
using qb_iq2_s = qb_lut<qbd_iq2_s>;
using qb_iq3_xxs = qb_lut<qbd_iq3_xxs>;
using qb_iq3_s = qb_lut<qbd_iq3_s>;
using qb_iq1_s = qb_lut<qbd_iq1_s>;
using qb_iq1_m = qb_lut<qbd_iq1_m>;

#endif
