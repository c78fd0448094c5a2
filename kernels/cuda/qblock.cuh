/* qblock — GGUF block decoders shared by the quantized CUDA matrix products (kernels/cuda/matmul_q.cu) and
 * compiled for the host by their CPU test (tests/cuda/test_qblock.cc), which checks them bitwise against
 * quant/dequant.c's dequant_row.
 *
 * The common form. Every supported type is read as "units" of 32 consecutive elements along k (one x block of
 * the int8 path): qb_unit holds the 32 quants as int8 (element 4j+i in byte i of q[j]), and the element
 * values are w = fmaf(d, (float)(q + QOFF), m) with d = d0 for elements 0..15 and d1 for 16..31 (equal except
 * for Q6_K and other types whose scales cover 16 elements: TWO_D), m = -0.0f for types without a minimum
 * (Q2_K, TWO_M: m for elements 0..15, m1 for 16..31; qblock_lut.cuh holds it and the other lookup-table
 * types). Every product d * (q + QOFF) of these formats is exact in f32 (at most 24 significant bits), and
 * dequant_row adds m after it, so this fma is bitwise dequant_row's value (-0.0f keeps the sign of a zero
 * product). Blocks are read in "pieces" of UPP units that share bytes (Q4_K: the two sub-blocks of one
 * 32-byte qs group), PPB pieces per block. load() reads a piece's raw bytes with aligned 4/8/16-byte loads;
 * types whose blocks are only 2-byte aligned (Q8_0, Q4_0, Q5_0, Q6_K) load the enclosing aligned words and
 * funnel-shift, so a load may touch up to 3 bytes outside the block on either side (the kernels read from a
 * staged copy that holds them). Each type's minimum alignment of W (and so of every block) is ALIGN. Traits
 * per type (one struct each): QK, BYTES, ALIGN, UPP, PPB, QOFF, TWO_D (d0 != d1 possible), HAS_M, TWO_M,
 * EXACT_H (d * (q + QOFF) is exact in f16 math: f16 scale, no minimum), raw (registers of one piece),
 * load(raw, blk, piece), unit_elem(piece, v) (first element of unit v of a piece, within the block),
 * unit(raw, piece, v, qb_unit&). Device-side users: qb_dot (int8 x, dp4a) and qb_decode_h2 (f16 values for
 * the tensor-core GEMM).
 */
#ifndef FERRY_KERN_CUDA_QBLOCK_CUH
#define FERRY_KERN_CUDA_QBLOCK_CUH

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "kernels/core/fp16.h"
#ifdef __CUDACC__
#include <cuda_fp16.h>
#define QB_FN __host__ __device__ __forceinline__
#else
#define QB_FN inline
#endif
/* Loop unrolling in device code only (host compilers do not know the pragma). */
#ifdef __CUDA_ARCH__
#define QB_UNROLL _Pragma("unroll")
#else
#define QB_UNROLL
#endif

/* ---- primitives (device intrinsics, host emulations with the same results) ---------------------------- */

struct qb_v4 {
    uint32_t x, y, z, w;
};

QB_FN uint32_t qb_ld32(const uint8_t *p)
{
#ifdef __CUDA_ARCH__
    return *reinterpret_cast<const uint32_t *>(p);
#else
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
#endif
}

QB_FN qb_v4 qb_ld128(const uint8_t *p)
{
    qb_v4 r;
#ifdef __CUDA_ARCH__
    const uint4 v = *reinterpret_cast<const uint4 *>(p);
    r.x = v.x, r.y = v.y, r.z = v.z, r.w = v.w;
#else
    memcpy(&r, p, 16);
#endif
    return r;
}

QB_FN void qb_ld64(const uint8_t *p, uint32_t &a, uint32_t &b)
{
#ifdef __CUDA_ARCH__
    const uint2 v = *reinterpret_cast<const uint2 *>(p);
    a = v.x, b = v.y;
#else
    a = qb_ld32(p), b = qb_ld32(p + 4);
#endif
}

QB_FN uint32_t qb_ld16(const uint8_t *p)
{
#ifdef __CUDA_ARCH__
    return *reinterpret_cast<const uint16_t *>(p);
#else
    uint16_t v;
    memcpy(&v, p, 2);
    return v;
#endif
}

/* (hi:lo) >> sh, sh in 0..32 (32 gives hi): __funnelshift_rc. */
QB_FN uint32_t qb_fshr(uint32_t lo, uint32_t hi, uint32_t sh)
{
#ifdef __CUDA_ARCH__
    return __funnelshift_rc(lo, hi, sh);
#else
    if (sh >= 32) return hi;
    if (sh == 0) return lo;
    return (lo >> sh) | (hi << (32 - sh));
#endif
}

/* The 4 bytes at a 2-byte-aligned p, from the two aligned words around them (the second word may lie up to 2
 * bytes past p + 4: staged copies hold such bytes). */
QB_FN uint32_t qb_ld32_a2(const uint8_t *p)
{
    const uint32_t s = (uint32_t)((uintptr_t)p & 2u);
    const uint8_t *a = p - s;
    return qb_fshr(qb_ld32(a), qb_ld32(a + 4), 8u * s);
}

/* __byte_perm(a, b, s) for selectors whose nibbles are 0..7 (no sign replication). */
QB_FN uint32_t qb_prmt(uint32_t a, uint32_t b, uint32_t s)
{
#ifdef __CUDA_ARCH__
    return __byte_perm(a, b, s);
#else
    const uint64_t v = (uint64_t)a | (uint64_t)b << 32;
    uint32_t r = 0;
    for (int i = 0; i < 4; i++) r |= (uint32_t)((v >> (8 * ((s >> (4 * i)) & 7))) & 0xFF) << (8 * i);
    return r;
#endif
}

QB_FN int qb_dp4a(uint32_t a, uint32_t b, int c)
{
#ifdef __CUDA_ARCH__
    return __dp4a((int)a, (int)b, c);
#else
    for (int i = 0; i < 4; i++) c += (int)(int8_t)(a >> (8 * i)) * (int)(int8_t)(b >> (8 * i));
    return c;
#endif
}

QB_FN float qb_f16(uint32_t h16)
{
#ifdef __CUDA_ARCH__
    return __half2float(__ushort_as_half((unsigned short)h16));
#else
    return f16_to_f32((uint16_t)h16);
#endif
}

QB_FN float qb_fma(float a, float b, float c)
{
#ifdef __CUDA_ARCH__
    return __fmaf_rn(a, b, c);
#else
    return fmaf(a, b, c);
#endif
}

QB_FN float qb_mul(float a, float b)
{
#ifdef __CUDA_ARCH__
    return __fmul_rn(a, b);
#else
    return a * b;
#endif
}

/* A small non-negative integer (< 2^23) to float without a conversion instruction. */
QB_FN float qb_u2f(uint32_t v)
{
    uint32_t b = v | 0x4B000000u;
    float f;
    memcpy(&f, &b, 4);
    return f - 8388608.0f;
}

/* Spreads bits 0..3 of b to bit 0 of bytes 0..3 (the four shifted copies of b never overlap: no carries). */
QB_FN uint32_t qb_spread4(uint32_t b)
{
    return ((b & 15u) * 0x00204081u) & 0x01010101u;
}

/* ---- the decoded unit --------------------------------------------------------------------------------- */

struct qb_unit {
    uint32_t q[8]; /* 32 int8 quants, element 4j+i in byte i of q[j] */
    float d0, d1;  /* scale of elements 0..15 and 16..31 */
    float m;       /* minimum term; -0.0f for types without one */
    float m1;      /* TWO_M types (Q2_K): the minimum term of elements 16..31 (m then covers 0..15) */
};

/* What one thread of an int8 MMA needs of unit U of a block: quant words t and t+4 of the unit (elements
 * 4t..4t+3 and 16+4t..16+4t+3, as qb_unit's q[t] and q[t+4]) and the unit's scales and minimum (as
 * qb_unit's). Each type's frag(blk, U, t, f) reads only those bytes, with the same alignment rules as load().
 */
struct qb_frag {
    uint32_t w0, w1;
    float d0, d1, m, m1; /* m1: as qb_unit's */
};

/* A window of N aligned words read from the 4-byte boundary at or below p (p 2-byte aligned); word(o) is the
 * 4 bytes at p + o, o a compile-time even offset with o/4 + 1 < N (or o/4 < N when the shift is 0). */
template <int N> struct qb_win {
    uint32_t w[N];
    uint32_t s0; /* p & 3: 0 or 2 */
    QB_FN void load(const uint8_t *p)
    {
        s0 = (uint32_t)((uintptr_t)p & 3u);
        const uint8_t *a = p - s0;
        QB_UNROLL
        for (int i = 0; i < N; i++) w[i] = qb_ld32(a + 4 * i);
    }
    template <int O> QB_FN uint32_t word() const
    {
        static_assert(O % 2 == 0 && O / 4 < N, "window offset");
        const uint32_t sh = 8u * ((O & 3) + s0);
        if constexpr (O / 4 + 1 < N)
            return qb_fshr(w[O / 4], w[O / 4 + 1], sh);
        else
            return qb_fshr(w[O / 4], 0u, sh);
    }
};

/* ---- the types ---------------------------------------------------------------------------------------- */

/* Q4_0 (18 bytes): { f16 d; u8 qs[16]; }, x[j] = d * ((qs[j] & 15) - 8), x[j+16] = d * ((qs[j] >> 4) - 8). */
struct qb_q4_0 {
    static constexpr int QK = 32, BYTES = 18, ALIGN = 2, UPP = 1, PPB = 1, QOFF = -8;
    static constexpr bool TWO_D = false, HAS_M = false, EXACT_H = true, TWO_M = false;
    struct raw {
        qb_win<5> b;
    };
    static QB_FN void load(raw &r, const uint8_t *blk, int) { r.b.load(blk); }
    static QB_FN int unit_elem(int, int) { return 0; }
    static QB_FN void unit(const raw &r, int, int, qb_unit &u)
    {
        const uint32_t qs[4] = {r.b.template word<2>(), r.b.template word<6>(), r.b.template word<10>(),
                                r.b.template word<14>()};
        QB_UNROLL
        for (int i = 0; i < 4; i++) {
            u.q[i] = qs[i] & 0x0F0F0F0Fu;
            u.q[4 + i] = (qs[i] >> 4) & 0x0F0F0F0Fu;
        }
        u.d0 = u.d1 = qb_f16(r.b.template word<0>() & 0xFFFFu);
        u.m = -0.0f;
    }
    static QB_FN void frag(const uint8_t *blk, int, int t, qb_frag &f)
    {
        const uint32_t qs = qb_ld32_a2(blk + 2 + 4 * t);
        f.w0 = qs & 0x0F0F0F0Fu;
        f.w1 = (qs >> 4) & 0x0F0F0F0Fu;
        f.d0 = f.d1 = qb_f16(qb_ld16(blk));
        f.m = -0.0f;
    }
};

/* Q4_1 (20 bytes, 4-byte aligned): { f16 d; f16 m; u8 qs[16]; }, x = d * q + m with q as in Q4_0. */
struct qb_q4_1 {
    static constexpr int QK = 32, BYTES = 20, ALIGN = 4, UPP = 1, PPB = 1, QOFF = 0;
    static constexpr bool TWO_D = false, HAS_M = true, EXACT_H = false, TWO_M = false;
    struct raw {
        uint32_t w[5];
    };
    static QB_FN void load(raw &r, const uint8_t *blk, int)
    {
        QB_UNROLL
        for (int i = 0; i < 5; i++) r.w[i] = qb_ld32(blk + 4 * i);
    }
    static QB_FN int unit_elem(int, int) { return 0; }
    static QB_FN void unit(const raw &r, int, int, qb_unit &u)
    {
        QB_UNROLL
        for (int i = 0; i < 4; i++) {
            u.q[i] = r.w[1 + i] & 0x0F0F0F0Fu;
            u.q[4 + i] = (r.w[1 + i] >> 4) & 0x0F0F0F0Fu;
        }
        u.d0 = u.d1 = qb_f16(r.w[0] & 0xFFFFu);
        u.m = qb_f16(r.w[0] >> 16);
    }
    static QB_FN void frag(const uint8_t *blk, int, int t, qb_frag &f)
    {
        const uint32_t h = qb_ld32(blk), qs = qb_ld32(blk + 4 + 4 * t);
        f.w0 = qs & 0x0F0F0F0Fu;
        f.w1 = (qs >> 4) & 0x0F0F0F0Fu;
        f.d0 = f.d1 = qb_f16(h & 0xFFFFu);
        f.m = qb_f16(h >> 16);
    }
};

/* Q5_0 (22 bytes): { f16 d; u32 qh; u8 qs[16]; }, x[j] = d * ((qs[j] & 15 | (qh >> j & 1) << 4) - 16),
 * x[j+16] = d * ((qs[j] >> 4 | (qh >> (j+16) & 1) << 4) - 16). */
struct qb_q5_0 {
    static constexpr int QK = 32, BYTES = 22, ALIGN = 2, UPP = 1, PPB = 1, QOFF = -16;
    static constexpr bool TWO_D = false, HAS_M = false, EXACT_H = true, TWO_M = false;
    struct raw {
        qb_win<6> b;
    };
    static QB_FN void load(raw &r, const uint8_t *blk, int) { r.b.load(blk); }
    static QB_FN int unit_elem(int, int) { return 0; }
    static QB_FN void unit(const raw &r, int, int, qb_unit &u)
    {
        const uint32_t qh = r.b.template word<2>();
        const uint32_t qs[4] = {r.b.template word<6>(), r.b.template word<10>(), r.b.template word<14>(),
                                r.b.template word<18>()};
        QB_UNROLL
        for (int i = 0; i < 4; i++) {
            u.q[i] = (qs[i] & 0x0F0F0F0Fu) | qb_spread4(qh >> (4 * i)) << 4;
            u.q[4 + i] = ((qs[i] >> 4) & 0x0F0F0F0Fu) | qb_spread4(qh >> (16 + 4 * i)) << 4;
        }
        u.d0 = u.d1 = qb_f16(r.b.template word<0>() & 0xFFFFu);
        u.m = -0.0f;
    }
    static QB_FN void frag(const uint8_t *blk, int, int t, qb_frag &f)
    {
        const uint32_t qh = qb_ld32_a2(blk + 2), qs = qb_ld32_a2(blk + 6 + 4 * t);
        f.w0 = (qs & 0x0F0F0F0Fu) | qb_spread4(qh >> (4 * t)) << 4;
        f.w1 = ((qs >> 4) & 0x0F0F0F0Fu) | qb_spread4(qh >> (16 + 4 * t)) << 4;
        f.d0 = f.d1 = qb_f16(qb_ld16(blk));
        f.m = -0.0f;
    }
};

/* Q5_1 (24 bytes, 8-byte aligned): { f16 d; f16 m; u32 qh; u8 qs[16]; }, as Q5_0 without the -16, then + m.
 */
struct qb_q5_1 {
    static constexpr int QK = 32, BYTES = 24, ALIGN = 8, UPP = 1, PPB = 1, QOFF = 0;
    static constexpr bool TWO_D = false, HAS_M = true, EXACT_H = false, TWO_M = false;
    struct raw {
        uint32_t w[6];
    };
    static QB_FN void load(raw &r, const uint8_t *blk, int)
    {
        QB_UNROLL
        for (int i = 0; i < 3; i++) qb_ld64(blk + 8 * i, r.w[2 * i], r.w[2 * i + 1]);
    }
    static QB_FN int unit_elem(int, int) { return 0; }
    static QB_FN void unit(const raw &r, int, int, qb_unit &u)
    {
        const uint32_t qh = r.w[1];
        QB_UNROLL
        for (int i = 0; i < 4; i++) {
            u.q[i] = (r.w[2 + i] & 0x0F0F0F0Fu) | qb_spread4(qh >> (4 * i)) << 4;
            u.q[4 + i] = ((r.w[2 + i] >> 4) & 0x0F0F0F0Fu) | qb_spread4(qh >> (16 + 4 * i)) << 4;
        }
        u.d0 = u.d1 = qb_f16(r.w[0] & 0xFFFFu);
        u.m = qb_f16(r.w[0] >> 16);
    }
    static QB_FN void frag(const uint8_t *blk, int, int t, qb_frag &f)
    {
        const uint32_t h = qb_ld32(blk), qh = qb_ld32(blk + 4), qs = qb_ld32(blk + 8 + 4 * t);
        f.w0 = (qs & 0x0F0F0F0Fu) | qb_spread4(qh >> (4 * t)) << 4;
        f.w1 = ((qs >> 4) & 0x0F0F0F0Fu) | qb_spread4(qh >> (16 + 4 * t)) << 4;
        f.d0 = f.d1 = qb_f16(h & 0xFFFFu);
        f.m = qb_f16(h >> 16);
    }
};

/* Q8_0 (34 bytes): { f16 d; int8 qs[32]; }, x = d * q. */
struct qb_q8_0 {
    static constexpr int QK = 32, BYTES = 34, ALIGN = 2, UPP = 1, PPB = 1, QOFF = 0;
    static constexpr bool TWO_D = false, HAS_M = false, EXACT_H = true, TWO_M = false;
    struct raw {
        qb_win<9> b;
    };
    static QB_FN void load(raw &r, const uint8_t *blk, int) { r.b.load(blk); }
    static QB_FN int unit_elem(int, int) { return 0; }
    static QB_FN void unit(const raw &r, int, int, qb_unit &u)
    {
        u.q[0] = r.b.template word<2>(), u.q[1] = r.b.template word<6>(), u.q[2] = r.b.template word<10>();
        u.q[3] = r.b.template word<14>(), u.q[4] = r.b.template word<18>(), u.q[5] = r.b.template word<22>();
        u.q[6] = r.b.template word<26>(), u.q[7] = r.b.template word<30>();
        u.d0 = u.d1 = qb_f16(r.b.template word<0>() & 0xFFFFu);
        u.m = -0.0f;
    }
    static QB_FN void frag(const uint8_t *blk, int, int t, qb_frag &f)
    {
        f.w0 = qb_ld32_a2(blk + 2 + 4 * t);
        f.w1 = qb_ld32_a2(blk + 18 + 4 * t);
        f.d0 = f.d1 = qb_f16(qb_ld16(blk));
        f.m = -0.0f;
    }
};

/* The 6-bit scale and min of sub-block s (0..7) of a Q4_K/Q5_K block whose scale bytes are the little-endian
 * words s1, s2, s3 (bytes 0..3, 4..7, 8..11):
 *   s < 4: sc = b[s] & 63,  mn = b[s+4] & 63;
 *   s >= 4: sc = (b[s+4] & 15) | (b[s-4] >> 6) << 4,  mn = (b[s+4] >> 4) | (b[s] >> 6) << 4. */
QB_FN void qb_k_scale_min(uint32_t s1, uint32_t s2, uint32_t s3, uint32_t s, uint32_t &sc, uint32_t &mn)
{
    const uint32_t bs = qb_prmt(s1, s2, s) & 0xFF;  /* b[s] */
    const uint32_t bs4 = qb_prmt(s2, s3, s) & 0xFF; /* b[s+4] */
    if (s < 4) {
        sc = bs & 63;
        mn = bs4 & 63;
    } else {
        const uint32_t bm4 = qb_prmt(s1, s2, s - 4) & 0xFF; /* b[s-4] */
        sc = (bs4 & 15) | (bm4 >> 6) << 4;
        mn = (bs4 >> 4) | (bs >> 6) << 4;
    }
}

/* Q4_K (144 bytes, 16-byte aligned): { f16 d; f16 dmin; u8 scales[12]; u8 qs[128]; }. Sub-block s (32
 * elements) is the low (s even) or high (s odd) nibbles of qs[32*(s/2) ..]; x = (d*sc) * q - (dmin*mn). Piece
 * p = the two sub-blocks of qs group p (elements 64p .. 64p+63). */
struct qb_q4_k {
    static constexpr int QK = 256, BYTES = 144, ALIGN = 16, UPP = 2, PPB = 4, QOFF = 0;
    static constexpr bool TWO_D = false, HAS_M = true, EXACT_H = false, TWO_M = false;
    struct raw {
        qb_v4 h;    /* d | dmin << 16, scales[0..3], [4..7], [8..11] */
        qb_v4 q[2]; /* qs[32p .. 32p+31] */
    };
    static QB_FN void load(raw &r, const uint8_t *blk, int p)
    {
        r.h = qb_ld128(blk);
        r.q[0] = qb_ld128(blk + 16 + 32 * p);
        r.q[1] = qb_ld128(blk + 32 + 32 * p);
    }
    static QB_FN int unit_elem(int p, int v) { return 64 * p + 32 * v; }
    static QB_FN void unit(const raw &r, int p, int v, qb_unit &u)
    {
        const uint32_t qs[8] = {r.q[0].x, r.q[0].y, r.q[0].z, r.q[0].w,
                                r.q[1].x, r.q[1].y, r.q[1].z, r.q[1].w};
        const uint32_t sh = 4u * (uint32_t)v;
        QB_UNROLL
        for (int j = 0; j < 8; j++) u.q[j] = (qs[j] >> sh) & 0x0F0F0F0Fu;
        uint32_t sc, mn;
        qb_k_scale_min(r.h.y, r.h.z, r.h.w, (uint32_t)(2 * p + v), sc, mn);
        u.d0 = u.d1 = qb_mul(qb_f16(r.h.x & 0xFFFFu), qb_u2f(sc));
        u.m = -qb_mul(qb_f16(r.h.x >> 16), qb_u2f(mn));
    }
    static QB_FN void frag(const uint8_t *blk, int U, int t, qb_frag &f)
    {
        const uint8_t *g = blk + 16 + 32 * (U >> 1);
        const uint32_t sh = 4u * (uint32_t)(U & 1);
        f.w0 = (qb_ld32(g + 4 * t) >> sh) & 0x0F0F0F0Fu;
        f.w1 = (qb_ld32(g + 16 + 4 * t) >> sh) & 0x0F0F0F0Fu;
        uint32_t sc, mn;
        const uint32_t h = qb_ld32(blk);
        qb_k_scale_min(qb_ld32(blk + 4), qb_ld32(blk + 8), qb_ld32(blk + 12), (uint32_t)U, sc, mn);
        f.d0 = f.d1 = qb_mul(qb_f16(h & 0xFFFFu), qb_u2f(sc));
        f.m = -qb_mul(qb_f16(h >> 16), qb_u2f(mn));
    }
};

/* Q5_K (176 bytes, 16-byte aligned): { f16 d; f16 dmin; u8 scales[12]; u8 qh[32]; u8 qs[128]; }, as Q4_K with
 * a fifth bit: element 32s + l adds 16 * (qh[l] >> s & 1). */
struct qb_q5_k {
    static constexpr int QK = 256, BYTES = 176, ALIGN = 16, UPP = 2, PPB = 4, QOFF = 0;
    static constexpr bool TWO_D = false, HAS_M = true, EXACT_H = false, TWO_M = false;
    struct raw {
        qb_v4 h;
        qb_v4 qh[2]; /* qh[0..31] */
        qb_v4 q[2];  /* qs[32p .. 32p+31] */
    };
    static QB_FN void load(raw &r, const uint8_t *blk, int p)
    {
        r.h = qb_ld128(blk);
        r.qh[0] = qb_ld128(blk + 16);
        r.qh[1] = qb_ld128(blk + 32);
        r.q[0] = qb_ld128(blk + 48 + 32 * p);
        r.q[1] = qb_ld128(blk + 64 + 32 * p);
    }
    static QB_FN int unit_elem(int p, int v) { return 64 * p + 32 * v; }
    static QB_FN void unit(const raw &r, int p, int v, qb_unit &u)
    {
        const uint32_t qs[8] = {r.q[0].x, r.q[0].y, r.q[0].z, r.q[0].w,
                                r.q[1].x, r.q[1].y, r.q[1].z, r.q[1].w};
        const uint32_t qh[8] = {r.qh[0].x, r.qh[0].y, r.qh[0].z, r.qh[0].w,
                                r.qh[1].x, r.qh[1].y, r.qh[1].z, r.qh[1].w};
        const uint32_t s = (uint32_t)(2 * p + v), sh = 4u * (uint32_t)v;
        QB_UNROLL
        for (int j = 0; j < 8; j++)
            u.q[j] = ((qs[j] >> sh) & 0x0F0F0F0Fu) | ((qh[j] >> s) & 0x01010101u) << 4;
        uint32_t sc, mn;
        qb_k_scale_min(r.h.y, r.h.z, r.h.w, s, sc, mn);
        u.d0 = u.d1 = qb_mul(qb_f16(r.h.x & 0xFFFFu), qb_u2f(sc));
        u.m = -qb_mul(qb_f16(r.h.x >> 16), qb_u2f(mn));
    }
    static QB_FN void frag(const uint8_t *blk, int U, int t, qb_frag &f)
    {
        const uint8_t *g = blk + 48 + 32 * (U >> 1);
        const uint32_t sh = 4u * (uint32_t)(U & 1);
        const uint32_t h0 = qb_ld32(blk + 16 + 4 * t), h1 = qb_ld32(blk + 32 + 4 * t);
        f.w0 = ((qb_ld32(g + 4 * t) >> sh) & 0x0F0F0F0Fu) | ((h0 >> U) & 0x01010101u) << 4;
        f.w1 = ((qb_ld32(g + 16 + 4 * t) >> sh) & 0x0F0F0F0Fu) | ((h1 >> U) & 0x01010101u) << 4;
        uint32_t sc, mn;
        const uint32_t h = qb_ld32(blk);
        qb_k_scale_min(qb_ld32(blk + 4), qb_ld32(blk + 8), qb_ld32(blk + 12), (uint32_t)U, sc, mn);
        f.d0 = f.d1 = qb_mul(qb_f16(h & 0xFFFFu), qb_u2f(sc));
        f.m = -qb_mul(qb_f16(h >> 16), qb_u2f(mn));
    }
};

/* Q6_K (210 bytes): { u8 ql[128]; u8 qh[64]; int8 scales[16]; f16 d; }. Half h (elements 128h ..), quarter i
 * (32 elements 128h + 32i + l): q = ((ql[64h + 32(i&1) + l] >> 4(i>>1)) & 15) | ((qh[32h + l] >> 2i) & 3) <<
 * 4, x = (d * scales[8h + 2i + l/16]) * (q - 32). Piece p (h = p/2, i0 = p%2) = quarters i0 and i0 + 2, which
 * share their ql and qh bytes: v = 0 -> quarter i0, v = 1 -> quarter i0 + 2. */
struct qb_q6_k {
    static constexpr int QK = 256, BYTES = 210, ALIGN = 2, UPP = 2, PPB = 4, QOFF = -32;
    static constexpr bool TWO_D = true, HAS_M = false, EXACT_H = false, TWO_M = false;
    struct raw {
        qb_win<9> ql; /* ql[64h + 32 i0 .. +32] */
        qb_win<9> qh; /* qh[32h .. +32] */
        qb_win<3> sc; /* scales[8h .. 8h+8] */
        qb_win<1> d;
        uint32_t i0;
    };
    static QB_FN void load(raw &r, const uint8_t *blk, int p)
    {
        const int h = p >> 1, i0 = p & 1;
        r.ql.load(blk + 64 * h + 32 * i0);
        r.qh.load(blk + 128 + 32 * h);
        r.sc.load(blk + 192 + 8 * h);
        r.d.load(blk + 208);
        r.i0 = (uint32_t)i0;
    }
    static QB_FN int unit_elem(int p, int v) { return 128 * (p >> 1) + 32 * ((p & 1) + 2 * v); }
    static QB_FN void unit(const raw &r, int, int v, qb_unit &u)
    {
        const uint32_t ql[8] = {r.ql.template word<0>(),  r.ql.template word<4>(),  r.ql.template word<8>(),
                                r.ql.template word<12>(), r.ql.template word<16>(), r.ql.template word<20>(),
                                r.ql.template word<24>(), r.ql.template word<28>()};
        const uint32_t qh[8] = {r.qh.template word<0>(),  r.qh.template word<4>(),  r.qh.template word<8>(),
                                r.qh.template word<12>(), r.qh.template word<16>(), r.qh.template word<20>(),
                                r.qh.template word<24>(), r.qh.template word<28>()};
        const uint32_t i = r.i0 + 2u * (uint32_t)v, shl = 4u * (uint32_t)v, shh = 2u * i;
        QB_UNROLL
        for (int j = 0; j < 8; j++)
            u.q[j] = ((ql[j] >> shl) & 0x0F0F0F0Fu) | ((qh[j] >> shh) & 0x03030303u) << 4;
        /* scales[8h + 2i], [8h + 2i + 1], sign-extended */
        const uint32_t sw =
            qb_prmt(r.sc.template word<0>(), r.sc.template word<4>(), 0x10u * (2 * i + 1) + 2 * i);
        const float d = qb_f16(r.d.template word<0>() & 0xFFFFu);
        u.d0 = qb_mul(d, (float)(int8_t)(sw & 0xFF));
        u.d1 = qb_mul(d, (float)(int8_t)((sw >> 8) & 0xFF));
        u.m = -0.0f;
    }
    static QB_FN void frag(const uint8_t *blk, int U, int t, qb_frag &f)
    {
        const int h = U >> 2, i = U & 3;
        const uint8_t *ql = blk + 64 * h + 32 * (i & 1) + 4 * t, *qh = blk + 128 + 32 * h + 4 * t;
        const uint32_t sl = 4u * (uint32_t)(i >> 1), sh = 2u * (uint32_t)i;
        f.w0 = ((qb_ld32_a2(ql) >> sl) & 0x0F0F0F0Fu) | ((qb_ld32_a2(qh) >> sh) & 0x03030303u) << 4;
        f.w1 = ((qb_ld32_a2(ql + 16) >> sl) & 0x0F0F0F0Fu) | ((qb_ld32_a2(qh + 16) >> sh) & 0x03030303u) << 4;
        const uint32_t sc = qb_ld16(blk + 192 + 8 * h + 2 * i); /* scales[8h + 2i], [8h + 2i + 1] */
        const float d = qb_f16(qb_ld16(blk + 208));
        f.d0 = qb_mul(d, (float)(int8_t)(sc & 0xFF));
        f.d1 = qb_mul(d, (float)(int8_t)(sc >> 8));
        f.m = -0.0f;
    }
};

/* The lookup-table types (IQ4_NL, IQ4_XS, MXFP4, NVFP4, Q3_K, the i-quants). */
#include "kernels/cuda/qblock_lut.cuh"

/* Every type the quantized products support, as X(DTYPE suffix, lower-case name, trait). */
#define QB_TYPES(X)                                                                                          \
    X(Q4_0, q4_0, qb_q4_0)                                                                                   \
    X(Q4_1, q4_1, qb_q4_1)                                                                                   \
    X(Q5_0, q5_0, qb_q5_0)                                                                                   \
    X(Q5_1, q5_1, qb_q5_1)                                                                                   \
    X(Q8_0, q8_0, qb_q8_0)                                                                                   \
    X(Q4_K, q4_k, qb_q4_k)                                                                                   \
    X(Q5_K, q5_k, qb_q5_k)                                                                                   \
    X(Q6_K, q6_k, qb_q6_k)                                                                                   \
    X(Q2_K, q2_k, qb_q2_k)                                                                                   \
    X(Q3_K, q3_k, qb_q3_k)                                                                                   \
    X(IQ4_NL, iq4_nl, qb_iq4_nl)                                                                             \
    X(IQ4_XS, iq4_xs, qb_iq4_xs)                                                                             \
    X(MXFP4, mxfp4, qb_mxfp4)                                                                                \
    X(NVFP4, nvfp4, qb_nvfp4)                                                                                \
    X(IQ2_XXS, iq2_xxs, qb_iq2_xxs)                                                                          \
    X(IQ2_XS, iq2_xs, qb_iq2_xs)                                                                             \
    X(IQ2_S, iq2_s, qb_iq2_s)                                                                                \
    X(IQ3_XXS, iq3_xxs, qb_iq3_xxs)                                                                          \
    X(IQ3_S, iq3_s, qb_iq3_s)                                                                                \
    X(IQ1_S, iq1_s, qb_iq1_s)                                                                                \
    X(IQ1_M, iq1_m, qb_iq1_m)

/* ---- users of the unit -------------------------------------------------------------------------------- */

/* Element e (0..31) of a unit as dequant_row gives it. */
template <class Q> QB_FN float qb_value(const qb_unit &u, int e)
{
    const int q = (int)(int8_t)(u.q[e >> 2] >> (8 * (e & 3))) + Q::QOFF;
    return qb_fma(e < 16 ? u.d0 : u.d1, (float)q, Q::TWO_M && e >= 16 ? u.m1 : u.m);
}

/* x is one unit of a row of x quantized to int8 (xq: 32 values, xd = {dx, sum of the f32 x, sum of xq over
 * elements 0..15, over 16..31 (int bits)}): acc += dx * sum_i d(i) * (q_i + QOFF) * xq_i + m * sum(x)
 * (TWO_M: + dx * (m * sum of xq over 0..15 + m1 * over 16..31)). */
QB_FN void qb_dot_parts(const qb_unit &u, const uint32_t (&xw)[8], int &lo, int &hi)
{
    lo = 0, hi = 0;
    QB_UNROLL
    for (int j = 0; j < 4; j++) lo = qb_dp4a(u.q[j], xw[j], lo);
    QB_UNROLL
    for (int j = 4; j < 8; j++) hi = qb_dp4a(u.q[j], xw[j], hi);
}

template <class Q>
QB_FN float qb_dot(const qb_unit &u, const uint32_t (&xw)[8], float dx, float sx, int sq_lo, int sq_hi,
                   float acc)
{
    int lo, hi;
    qb_dot_parts(u, xw, lo, hi);
    float t;
    if (Q::TWO_D) {
        lo += Q::QOFF * sq_lo;
        hi += Q::QOFF * sq_hi;
        t = qb_fma(u.d0, (float)lo, qb_mul(u.d1, (float)hi));
    } else {
        t = qb_mul(u.d0, (float)(lo + hi + Q::QOFF * (sq_lo + sq_hi)));
    }
    acc = qb_fma(dx, t, acc);
    if (Q::TWO_M) /* a minimum per 16 elements: through the halves' sums of xq */
        acc = qb_fma(dx, qb_fma(u.m, (float)sq_lo, qb_mul(u.m1, (float)sq_hi)), acc);
    else if (Q::HAS_M)
        acc = qb_fma(u.m, sx, acc);
    return acc;
}

/* The 32 elements of a unit as f16 pairs (element 2i in the low half of out[i]). EXACT_H types compute
 * d * (q + QOFF) in f16 (an exact product rounded once: bitwise the f16 rounding of dequant_row's value); the
 * others compute the f32 value exactly as dequant_row does and round it to f16 once. */
QB_FN uint32_t qb_pack_h2(float a, float b)
{
#ifdef __CUDA_ARCH__
    const __half2 h = __floats2half2_rn(a, b);
    return *reinterpret_cast<const uint32_t *>(&h);
#else
    return (uint32_t)f32_to_f16(a) | (uint32_t)f32_to_f16(b) << 16;
#endif
}

template <class Q> QB_FN void qb_decode_h2(const qb_unit &u, uint32_t (&out)[16])
{
#ifdef __CUDA_ARCH__
    if constexpr (Q::EXACT_H) {
        /* (q ^ 0x80) = q + 128 as the low byte of the half 0x6400 + that = 1024 + q + 128: exact. */
        const __half2 dh = __float2half2_rn(u.d0); /* d is an f16 value: exact */
        const __half2 off = __float2half2_rn(1152.0f - (float)Q::QOFF);
        QB_UNROLL
        for (int j = 0; j < 8; j++) {
            const uint32_t x = u.q[j] ^ 0x80808080u;
            uint32_t a = __byte_perm(x, 0x64646464u, 0x5140), b = __byte_perm(x, 0x64646464u, 0x5342);
            const __half2 ha = __hmul2(__hsub2(*reinterpret_cast<__half2 *>(&a), off), dh);
            const __half2 hb = __hmul2(__hsub2(*reinterpret_cast<__half2 *>(&b), off), dh);
            out[2 * j] = *reinterpret_cast<const uint32_t *>(&ha);
            out[2 * j + 1] = *reinterpret_cast<const uint32_t *>(&hb);
        }
    } else
#endif
    { /* (q ^ 0x80) = q + 128 as a float 2^23 + that, minus (2^23 + 128 - QOFF): exactly q + QOFF. */
        QB_UNROLL
        for (int j = 0; j < 8; j++) {
            const uint32_t x = u.q[j] ^ 0x80808080u;
            float f[4];
            QB_UNROLL
            for (int i = 0; i < 4; i++) {
                const uint32_t bits = qb_prmt(x, 0x4B000000u, 0x7440u + (uint32_t)i);
                float t;
                memcpy(&t, &bits, 4);
                f[i] = qb_fma(j < 4 ? u.d0 : u.d1, t - (8388736.0f - (float)Q::QOFF),
                              Q::TWO_M && j >= 4 ? u.m1 : u.m);
            }
            out[2 * j] = qb_pack_h2(f[0], f[1]);
            out[2 * j + 1] = qb_pack_h2(f[2], f[3]);
        }
    }
}

#endif
