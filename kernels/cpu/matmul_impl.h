/* matmul_impl — the parts of the CPU products that kernels/cpu/matmul.c (partition, tasks, portable kernels,
 * the tables of types and instruction sets) and kernels/cpu/matmul_x86.c (the AVX2, AVX-VNNI and AVX512-VNNI
 * kernels) share: the block constants, x prepared for the integer products, the decoded tile, the dot call's
 * arguments and the kernels' signatures. Internal to kern_cpu_matmul; the arithmetic is matmul.c's first
 * comment.
 */
#ifndef FERRY_KERN_CPU_MATMUL_IMPL_H
#define FERRY_KERN_CPU_MATMUL_IMPL_H

#include <stddef.h>
#include <stdint.h>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "kernels/cpu/matmul.h"
#include "quant/dtype.h"

#define NR 4 /* rows of W per group (tile rows; the partition's unit for every type) */

/* Software prefetch of the weight rows PF_AHEAD rows (two groups) ahead, into L2: decode reads short rows
 * (k = 576: 360 bytes of Q4_1) four at a time, which the hardware prefetchers follow poorly; an L1 prefetch
 * would hold one of the few L1 miss buffers for the whole DRAM latency (kernels/cpu/NOTES.md, changes 4, 7).
 */
#define PF_AHEAD 8
static inline void prefetch_l2(const void *p)
{
    __builtin_prefetch(p, 0, 2);
}

/* Lanes of 8 f32 summed in one fixed pairwise order. */
static inline float hsum8(const float *s)
{
    return ((s[0] + s[4]) + (s[2] + s[6])) + ((s[1] + s[5]) + (s[3] + s[7]));
}

#if defined(__x86_64__)
/* hsum8 of four sets of 8 lanes at once (SSE, every x86-64): lane l + lane l + 4 in each set, a 4x4
 * transpose, then ((l0 + l2) + (l1 + l3)): hsum8's adds in its order, so each result is hsum8's bit for bit.
 */
static inline __m128 hsum8x4(const float *s0, const float *s1, const float *s2, const float *s3)
{
    __m128 t0 = _mm_add_ps(_mm_loadu_ps(s0), _mm_loadu_ps(s0 + 4));
    __m128 t1 = _mm_add_ps(_mm_loadu_ps(s1), _mm_loadu_ps(s1 + 4));
    __m128 t2 = _mm_add_ps(_mm_loadu_ps(s2), _mm_loadu_ps(s2 + 4));
    __m128 t3 = _mm_add_ps(_mm_loadu_ps(s3), _mm_loadu_ps(s3 + 4));
    _MM_TRANSPOSE4_PS(t0, t1, t2, t3);
    return _mm_add_ps(_mm_add_ps(t0, t2), _mm_add_ps(t1, t3));
}
#endif

#define QB          32   /* elements per x block (and per weight scale, except Q6_K's 16) */
#define KCQ         1024 /* columns per decoded chunk: a multiple of 256 (whole K-quant super-blocks) */
#define MBQ         64   /* x rows whose sums a task keeps (on its stack) before it moves to the next rows */
#define MRQ         4    /* most x rows per dot call (the AVX2 kernel takes 2: 16 registers) */
#define Q8_DIRECT_M 2    /* int8: up to this many x rows, kernels that read codes in place (no tile) */

/* How a weight type's decoded codes become values (see q8_kind). */
enum q8_mode {
    Q8M_OFF,      /* value = code - 2^sh, one scale per 32 elements */
    Q8M_OFF16,    /* value = code - 2^sh, one scale per 16 elements (Q6_K) */
    Q8M_AFFINE,   /* value = code, one scale and one minimum per 32 elements: w = s·code + mn */
    Q8M_SIGNED,   /* the AVX2 kernel's Q8_0: code ^ 0x80 is the value, multiplied through the sign trick (a
                     u8·s8 pair of 255·127 would overflow pmaddubsw's int16) */
    Q8M_AFFINE16, /* value = code - 1, one scale and one minimum per 16 elements (Q2_K): the OFF16 kernels
                   * (sh 0) take the scaled codes, q8_min16_terms (matmul.c) the minimums */
};

/* x prepared for the integer products: for row i and block b of 32 elements,
 *   q   (m, k) int8: x·127/amax rounded to nearest even (amax = max |x| over the block); 0 when amax < 1e-30
 *   n4  (m, nb, 8) int32: minus the sums of q over elements 4l..4l+3 (the offset correction: lanes of
 *       -2^sh·Σq start the dot products of offset codes)
 *   dx  (m, nbp) f32: amax/127 (NaN when the block holds a NaN or an infinity, so that y does), 0 past nb
 *   sxd (m, nbp) f32: dx·Σq, the block's sum of x̂ (the minimums' weight), 0 past nb
 * nb = k/32, nbp = nb rounded up to a multiple of 8. Lives in the calling thread's buffer (thread_buf).
 * Where the instruction set's many-row kernels of the Q8_KB_LANES types run (q8_isa.xt: more than
 * Q8_DIRECT_M rows, k a multiple of 256), also
 *   qt  (m, k) int8: q transposed per 256 elements: bytes 256s + 32g + 4l .. + 3 of a row are q's elements
 *       256s + 32l + 4g .. + 3 (block 8s + l, group g), so that a vpdpbusd lane sums one block
 *   n4h (m, nb, 2) int32: per 256 elements s of a row, lane 16s + 8h + l is the sum of n4's lanes 4h .. 4h +
 * 3 of block 8s + l (minus Σq over the block's half h) (NULL otherwise). */
struct q8x {
    int8_t *q;
    int32_t *n4;
    float *dx, *sxd;
    int8_t *qt;
    int32_t *n4h;
    int k, nb, nbp;
};

/* One group of NRQ weight rows, columns [c0, c0 + kc) decoded: codes in natural element order, the scale of
 * each 32 elements (Q6_K: of each 16), the minimum of each 32 (affine types; zero up to a multiple of 8
 * blocks). Rows past the end of a range have zero scales and minimums. */
#define NRQ NR
struct q8_tile {
    uint8_t u[NRQ][KCQ] __attribute__((aligned(64)));
    float s[NRQ][KCQ / 16];
    float mn[NRQ][KCQ / 16]; /* per 32 elements (Q8M_AFFINE) or per 16 (Q8M_AFFINE16) */
};

/* Decodes elements c0 .. c0 + kc (multiples of the type's block size) of row w into u (kc), s and mn. */
typedef void (*q8_dec_fn)(const uint8_t *w, int c0, int kc, uint8_t *u, float *s, float *mn);

/* One dot call: x rows i0 .. i0 + mr against the tile's NRQ rows over the chunk's blocks; acc ((mr, NRQ, 16)
 * f32) and macc ((mr, NRQ, 8)) are loaded (zero when first) and stored. int8 arithmetic: acc's first 8 lanes
 * hold Σ (s·dx)·dot, macc Σ mn·sxd; f32 arithmetic: acc the 16 lanes of Σ s·t, macc Σ m'·Σx (f32_dot_c). */
struct q8_dot {
    const struct q8x *x; /* x prepared: quantized (int8 arithmetic) or its block sums only (f32) */
    const float *xf;     /* x (m, k) itself (f32 arithmetic) */
    int i0;
    struct q8_tile *t;      /* the f32 direct kernels write the blocks' scales into it */
    const uint8_t *row[NR]; /* direct kernels: the weight rows, read in place */
    int k;                  /* columns of x */
    int b0, nb;             /* the chunk's first block within the row, and its block count */
    float *acc, *macc;
    int first;
    int kb; /* int8 arithmetic in the per-block lanes of Q8_KB_LANES (q8_kind.kb) */
};

/* The int8 arithmetic of Q4_K, Q5_K and Q6_K (q8_kind.kb): each 32-element block's dot product Σ code·q
 * (Q6_K: each half's, 16 elements under one scale, with its offset) is summed whole in int32 (exact), and the
 * block's f32 step fma(dot, s·dx, acc) goes to lane b mod 8 of the 8 lanes (b: the block's index in the row;
 * chunks start at multiples of 8 blocks, a super-block is 8 blocks; Q6_K: the first half's step, then the
 * second's), so one conversion and one FMA per 8 blocks (Q6_K: two) and (x row, weight row) in 8-lane
 * vectors, where the other types take them per 4-element lane of each block. Fewer roundings than those (one
 * per block, not 8), and what lets rows of x be added for about the cost of their integer products
 * (kernels/cpu/NOTES.md, 2026-12-07c). */
#define Q8_KB_LANES 8

typedef void (*q8_dot_fn)(const struct q8_dot *a, int mr, enum q8_mode mode, int sh);
typedef void (*q8_f32_fn)(const uint8_t *u, const float *s, const float *mn, int kc, enum q8_mode mode,
                          int sh, float *dst);
typedef void (*q8_xrow_fn)(const float *x, int k, int8_t *q, int32_t *n4, float *dx, float *sxd, int nbp);
/* One row's qt (k) and n4h (k/16) from its q (k) and n4 (k/4), k a multiple of 256 (q8x's comment). */
typedef void (*q8_xt_fn)(const int8_t *q, const int32_t *n4, int k, int8_t *qt, int32_t *n4h);
/* A product's rows j_lo .. j_hi of W against x's one row, whole rows at a time, into y (n). */
typedef void (*q8_rows_fn)(const struct q8x *x, const uint8_t *w, size_t row_bytes, int j_lo, int j_hi,
                           float *y);

/* The f32 arithmetic (f32_dot_c in matmul.c): the offset subtracted from each code before the products (Q8_0,
 * Q6_K: signed codes), and whether per-block terms m'·Σx follow (the other offset types and the affine ones).
 */
static inline float f32_conv_off(enum q8_mode mode, int sh)
{
    return mode == Q8M_OFF16 || sh == 7 ? (float)(1 << sh) : 0.0f;
}
static inline int f32_uses_macc(enum q8_mode mode, int sh)
{
    return mode == Q8M_AFFINE || mode == Q8M_AFFINE16 || (mode == Q8M_OFF && sh != 7);
}

/* Blocks with amax below this are zero (their share of y is below 1e-30·Σ|w|). */
#define Q8_TINY 1e-30f

/* A quantized type's decoding: codes carry the offset 2^sh (0: none), the mode, and its portable decoder (an
 * instruction set may have its own: q8_isa.decs). */
struct q8_kind {
    int sh;
    enum q8_mode mode;
    q8_dec_fn dec;
    int kb; /* int8 arithmetic: a block's dot product summed whole (Q8_KB_LANES) */
};

/* An instruction set's kernels: decoders (AVX2 or portable), x quantizer, and the dot kernels of both
 * arithmetics with the x rows each takes per call. */
struct q8_isa {
    const char *name;
    const q8_dec_fn *decs; /* (DTYPE_COUNT) this set's decoders, NULL where the portable one serves */
    q8_xrow_fn xrow;
    q8_dot_fn dot[KERN_CPU_ACT_COUNT];
    int mr[KERN_CPU_ACT_COUNT];
    q8_f32_fn to_f32;         /* f32 arithmetic past MR rows: codes to the f32 tile */
    const q8_dot_fn *direct;  /* f32 arithmetic, m <= the f32 rows per call: kernels reading codes in place */
    const q8_dot_fn *direct8; /* int8 arithmetic, m <= Q8_DIRECT_M: the same, where a type has one */
    q8_rows_fn rows8_q8_0;    /* int8 arithmetic, Q8_0, m = 1: whole rows (NULL: the tile) */
    const q8_dot_fn *direct8_any; /* int8 arithmetic, past Q8_DIRECT_M rows: direct kernels that beat the
                                   * tile there, taking up to MBQ x rows per call and leaving acc packed
                                   * (weight row j's 8 lanes at acc + i·NRQ·16 + 8j) */
    q8_xt_fn xt;                  /* direct8_any's Q8_KB_LANES kernels read q8x.qt and n4h: this fills them
                                   * (NULL: those kernels are not in this set) */
};

/* matmul_lut.c's portable decoders of the table and grid types (its first comment lists their modes). */
#define Q8_DEC_LUT(t) void q8_dec_##t(const uint8_t *w, int c0, int kc, uint8_t *u, float *s, float *mn);
Q8_DEC_LUT(q2_k)
Q8_DEC_LUT(q3_k)
Q8_DEC_LUT(iq4_nl)
Q8_DEC_LUT(iq4_xs)
Q8_DEC_LUT(mxfp4)
Q8_DEC_LUT(nvfp4)
Q8_DEC_LUT(iq2_xxs)
Q8_DEC_LUT(iq2_xs)
Q8_DEC_LUT(iq2_s)
Q8_DEC_LUT(iq3_xxs)
Q8_DEC_LUT(iq3_s)
Q8_DEC_LUT(iq1_s)
Q8_DEC_LUT(iq1_m)
#undef Q8_DEC_LUT

#if defined(__x86_64__)
/* matmul_x86.c's instruction sets. */
extern const struct q8_isa q8_isa_avx2, q8_isa_avxvnni, q8_isa_avx512vnni;
/* matmul_lut_x86.c's AVX2 decoders of table and grid types (bitwise matmul_lut.c's). */
#define Q8_DEC_LUT_AVX2(t)                                                                                   \
    void q8_dec_##t##_avx2(const uint8_t *w, int c0, int kc, uint8_t *u, float *s, float *mn);
Q8_DEC_LUT_AVX2(q2_k)
Q8_DEC_LUT_AVX2(q3_k)
Q8_DEC_LUT_AVX2(iq4_nl)
Q8_DEC_LUT_AVX2(iq4_xs)
Q8_DEC_LUT_AVX2(mxfp4)
Q8_DEC_LUT_AVX2(nvfp4)
Q8_DEC_LUT_AVX2(iq3_s)
Q8_DEC_LUT_AVX2(iq2_xs)
Q8_DEC_LUT_AVX2(iq2_xxs)
Q8_DEC_LUT_AVX2(iq3_xxs)
Q8_DEC_LUT_AVX2(iq2_s)
Q8_DEC_LUT_AVX2(iq1_s)
Q8_DEC_LUT_AVX2(iq1_m)
#undef Q8_DEC_LUT_AVX2
#endif

#endif
