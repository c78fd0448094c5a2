/* matmul — y (m, n) = x (m, k) · Wᵀ (+ bias) with W (n, k) in its stored type.
 *
 * Work: the n output rows are cut into contiguous ranges of whole groups of 4 rows, one range per pool task.
 * The arithmetic depends on W's type only:
 *  - Plain types (F32, F16, BF16): f32 products and sums. For m <= STREAM_M_MAX (16) rows stream whole,
 *    converted in registers, MR rows of x per pass (the later passes find the 4 rows in L1/L2); for larger m,
 *    k is walked in chunks of KC columns and each group's (NR, KC) slice is converted once into an f32 tile
 *    (L1) that an MR x NR register-blocked micro-kernel multiplies by all m rows of x.
 *    With KERN_CPU_PLAIN_BF16 on a CPU with AMX, F16/BF16 products of KERN_CPU_AMX_M_MIN rows or more go to
 *    the tiles in bf16 instead (matmul_amx.c).
 *  - Quantized types (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K, and through matmul_lut.c's decoders
 *    Q2_K, Q3_K, IQ4_NL, IQ4_XS, MXFP4, NVFP4 and the IQ3/IQ2/IQ1 i-quants, whose values are small integers
 *    times a block scale too; Q2_K, affine per 16 elements, runs the OFF16 kernels and adds its minimums
 *    in q8_min16_terms): every weight block is decoded once per chunk of KCQ columns into a small tile of
 *    codes (u8, value = code - offset), scales and minimums
 *    (q8_tile), reused for all m rows of x (register blocks of 1-4 rows). Two arithmetics
 *    (kern_cpu_matmul_set_act):
 *    f32 (the default): for m <= MR, per block t = Σ code·x in f32 and acc += s·t (the scale once per block;
 *    offsets and minimums through the blocks' sums of x, f32_dot_c; with AVX-512, Q8_0/Q4_0/Q4_1 codes are
 *    read in place from the weights, no tile); past MR rows, the codes go back to f32 weights
 *    (w = s·(code - offset), or fma(s, code, minimum)) in the plain types' tile and its micro-kernel.
 *    int8: x is quantized once per product to int8 blocks of 32 (q8x: x̂ = dx·q, dx = max|x|/127,
 *    q = x·127/max|x| rounded to nearest even). Per block and (x row, weight row): the integer dot product
 *    Σ code·q in 8 int32 lanes (lane l: elements 4l..4l+3; vpdpbusd with AVX512-VNNI or AVX-VNNI, pmaddubsw +
 *    pmaddwd with AVX2, plain C elsewhere; the offset enters exactly through the lanes' sums of q), converted
 *    to f32 and accumulated as acc += (scale·dx)·lanes by one FMA per lane; the minimums of the affine types
 *    through the blocks' sums of x̂ (8 lanes). y = Σ lanes(acc) + Σ lanes(minimum sums).
 *    Q4_K, Q5_K and Q6_K (Q8_KB_LANES, matmul_impl.h) sum each block's dot product whole (Q6_K: each half's,
 *    under its scale) and take one FMA per block (half) in lane b mod 8 instead, so their f32 work is one
 *    conversion and one FMA per 8 blocks, x row and weight row.
 *    With AVX512-VNNI and one row of x (Q8_0: up to Q8_DIRECT_M, 2), Q4_K's, Q5_K's and Q6_K's codes (and
 *    Q4_1's up to Q8_DIRECT_M rows) are read in place from the weights instead (no tile; two weight rows per
 *    512-bit register; with AVX2 or AVX-VNNI
 *    Q4_K's and Q5_K's up to 2 rows, one row per 256-bit register), with the same integer sums and the same
 * f32 steps, so bitwise the tile's results (decode's products at m = 1: NOTES.md); with AVX512-VNNI past
 * that, Q8_0, Q4_K, Q5_K and Q6_K (a super-block's codes decoded into registers once for all of a task's x
 *    rows, up to MBQ per call, the per-block types' codes transposed so that vpdpbusd sums a block in one
 *    lane; a speculative step's verify rows, prefill's and batches' products: NOTES.md, 2026-12-07c).
 *    Error against exact x: |y - Σ w·x| <= Σ_blocks (dx/2)·Σ|w| (x's rounding, half a step of each block)
 *    plus f32 rounding of the sums (~(k/32 + 8)·2^-24·Σ|w·x|); the integer products themselves are exact.
 *    The instruction set is chosen at run time (cpuid; kern_cpu_isa_limit caps it).
 * Determinism: every output element is the same sequence of f32 operations whatever the pool size (lanes
 * reduce in a fixed order, chunks add in k order, a row's arithmetic does not depend on the partition).
 * For the quantized types it is moreover the same whatever the instruction set (integer sums are exact, the
 * f32 steps and their lanes are the same), and with the int8 arithmetic whatever m (row i of a batch is
 * bitwise the product of that row alone).
 * Files: this one holds the partition and tasks, the plain types' kernels, the portable quantized kernels
 * (the definition) and the tables of types and instruction sets; matmul_x86.c the AVX2 / AVX-VNNI /
 * AVX512-VNNI kernels; matmul_lut.c and matmul_lut_x86.c the table and grid types' decoders (portable and
 * AVX2); matmul_impl.h what they share; matmul_amx.c the bf16 tiles.
 * Timings and history: kernels/cpu/NOTES.md.
 */
#include "kernels/cpu/matmul.h"

#include <float.h>
#include <math.h>
#include <pthread.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/core/status.h"
#include "kernels/cpu/matmul_amx.h"
#include "kernels/cpu/matmul_impl.h"
#include "kernels/cpu/thread_buf.h"
#include "kernels/cpu/threadpool.h"
#include "quant/blocks.h"
#include "quant/fp16.h"

/* Vector-returning static helpers are never called across an ABI boundary. */
#pragma GCC diagnostic ignored "-Wpsabi"

#if defined(__x86_64__)
#include <immintrin.h>
#include <cpuid.h>
#define MM_X86 1
#endif

/* ==== Plain types: f32 arithmetic ========================================================================
 */

/* Vector length in floats: one register of the widest ISA the build targets. */
#if defined(__AVX512F__)
#define VL 16
#elif defined(__AVX__)
#define VL 8
#else
#define VL 4
#endif

typedef float vf __attribute__((vector_size(VL * 4)));
typedef float vfu __attribute__((vector_size(VL * 4), aligned(4)));    /* unaligned f32 load */
typedef uint16_t vhu __attribute__((vector_size(VL * 2), aligned(2))); /* unaligned 16-bit load */
typedef uint32_t vu32 __attribute__((vector_size(VL * 4)));

#define MR           4  /* rows of x per micro-kernel call */
#define STREAM_M_MAX 16 /* up to this many rows of x, plain rows stream whole (no tile), MR rows per pass */
/* Products of up to TASK_M_MAX rows of x, on pools of TASK_MIN_THREADS threads or more, are cut into tasks of
 * TASK_ROWS rows of W (a multiple of NR), or of TASK_MIN_BYTES of W when that is more rows (small models);
 * other products into one slice per thread, which keeps each slice of x in a thread's L2 the longest. */
#define TASK_ROWS        64
#define TASK_MIN_BYTES   (128 << 10)
#define TASK_M_MAX       16
#define TASK_MIN_THREADS 8
#define KC_MAX           1024 /* columns per chunk: an (NR, KC_MAX) f32 tile is 16 KiB and stays in L1 */
#define TILE_PAD         16   /* floats added to the tile's row stride */
#define X_L2_BYTES       (512 * 1024) /* budget for the (m, KC) slice of x */

/* Pins a value in a vector register: stops GCC from re-reading it from memory (as an FMA operand). */
#if defined(__x86_64__) && defined(__AVX512F__)
#define IN_REG(v) __asm__("" : "+v"(v))
#elif defined(__x86_64__) && defined(__AVX__)
#define IN_REG(v) __asm__("" : "+x"(v))
#else
#define IN_REG(v) ((void)0)
#endif

enum wkind { WK_F32, WK_F16, WK_BF16 };

/* VL elements of row w starting at element c. */
static inline vf load_w(const void *w, ptrdiff_t c, enum wkind kind)
{
    switch (kind) {
    case WK_F32:
        return *(const vfu *)((const float *)w + c);
    case WK_BF16: { /* f32 = bf16 << 16: one widening load and one shift (GCC's generic form splits it) */
#if defined(__AVX512F__)
        return (vf)_mm512_slli_epi32(
            _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)((const uint16_t *)w + c))), 16);
#elif defined(__AVX2__)
        return (vf)_mm256_slli_epi32(
            _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)((const uint16_t *)w + c))), 16);
#else
        vu32 u = __builtin_convertvector(*(const vhu *)((const uint16_t *)w + c), vu32);
        return (vf)(u << 16);
#endif
    }
    case WK_F16: {
#if defined(__AVX512F__)
        return (vf)_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)((const uint16_t *)w + c)));
#elif defined(__F16C__)
        return (vf)_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)w + c)));
#else
        vf r;
        for (int l = 0; l < VL; l++) r[l] = f16_to_f32(((const uint16_t *)w + c)[l]);
        return r;
#endif
    }
    }
    return (vf){0};
}

/* One element (the k % VL tail). */
static inline float load_w1(const void *w, ptrdiff_t c, enum wkind kind)
{
    if (kind == WK_F32) return ((const float *)w)[c];
    if (kind == WK_BF16) return bf16_to_f32(((const uint16_t *)w)[c]);
    return f16_to_f32(((const uint16_t *)w)[c]);
}

static inline float hsum(vf v)
{
    /* Fixed pairwise order. */
#if VL == 4
    return (v[0] + v[2]) + (v[1] + v[3]);
#else
    float s[8];
#if VL == 16
    for (int l = 0; l < 8; l++) s[l] = v[l] + v[l + 8];
#else
    for (int l = 0; l < 8; l++) s[l] = v[l];
#endif
    return hsum8(s);
#endif
}

#define WROW(w, ldw, j) ((const void *)((const uint8_t *)(w) + (j) * (ldw)))

/* out[i*NR + j] = Σ_c x[i*ldx + c] * W_j[c] for c < kc, i < mr, j < nr; row W_j starts ldw*j bytes after w.
 */
static inline __attribute__((always_inline)) void micro(float *out, const float *x, ptrdiff_t ldx,
                                                        const void *w, ptrdiff_t ldw, int kc, int mr, int nr,
                                                        enum wkind kind)
{
    vf acc[MR][NR];
    for (int i = 0; i < mr; i++)
        for (int j = 0; j < nr; j++) acc[i][j] = (vf){0};
    const int kv = kc - kc % VL;
    for (int c = 0; c < kv; c += VL) {
        vf wv[NR];
        for (int j = 0; j < nr; j++) wv[j] = load_w(WROW(w, ldw, j), c, kind);
        for (int i = 0; i < mr; i++) {
            const vf xv = *(const vfu *)(x + i * ldx + c);
            for (int j = 0; j < nr; j++) acc[i][j] += xv * wv[j];
        }
    }
    for (int i = 0; i < mr; i++)
        for (int j = 0; j < nr; j++) {
            float s = hsum(acc[i][j]);
            for (int c = kv; c < kc; c++) s += x[i * ldx + c] * load_w1(WROW(w, ldw, j), c, kind);
            out[i * NR + j] = s;
        }
}

/* The hot 4x4 case written out with named registers: GCC keeps them in registers this way, where the array
 * form above makes it reload x rows and fold repeated W loads into the FMAs. Same arithmetic per element. */
static inline __attribute__((always_inline)) void
micro44(float *out, const float *x, ptrdiff_t ldx, const void *w, ptrdiff_t ldw, int kc, enum wkind kind)
{
    vf a00 = {0}, a01 = {0}, a02 = {0}, a03 = {0}, a10 = {0}, a11 = {0}, a12 = {0}, a13 = {0};
    vf a20 = {0}, a21 = {0}, a22 = {0}, a23 = {0}, a30 = {0}, a31 = {0}, a32 = {0}, a33 = {0};
    const float *x0 = x, *x1 = x + ldx, *x2 = x + 2 * ldx, *x3 = x + 3 * ldx;
    const int kv = kc - kc % VL;
    for (int c = 0; c < kv; c += VL) {
        vf w0 = load_w(WROW(w, ldw, 0), c, kind), w1 = load_w(WROW(w, ldw, 1), c, kind);
        vf w2 = load_w(WROW(w, ldw, 2), c, kind), w3 = load_w(WROW(w, ldw, 3), c, kind);
        IN_REG(w0);
        IN_REG(w1);
        IN_REG(w2);
        IN_REG(w3);
        vf xv = *(const vfu *)(x0 + c);
        IN_REG(xv);
        a00 += xv * w0, a01 += xv * w1, a02 += xv * w2, a03 += xv * w3;
        xv = *(const vfu *)(x1 + c);
        IN_REG(xv);
        a10 += xv * w0, a11 += xv * w1, a12 += xv * w2, a13 += xv * w3;
        xv = *(const vfu *)(x2 + c);
        IN_REG(xv);
        a20 += xv * w0, a21 += xv * w1, a22 += xv * w2, a23 += xv * w3;
        xv = *(const vfu *)(x3 + c);
        IN_REG(xv);
        a30 += xv * w0, a31 += xv * w1, a32 += xv * w2, a33 += xv * w3;
    }
    const vf acc[MR][NR] = {
        {a00, a01, a02, a03}, {a10, a11, a12, a13}, {a20, a21, a22, a23}, {a30, a31, a32, a33}};
    for (int i = 0; i < MR; i++)
        for (int j = 0; j < NR; j++) {
            float s = hsum(acc[i][j]);
            for (int c = kv; c < kc; c++) s += x[i * ldx + c] * load_w1(WROW(w, ldw, j), c, kind);
            out[i * NR + j] = s;
        }
}

#define MICRO_CASE(kind, mr, nr)                                                                             \
    case (mr)*8 + (nr):                                                                                      \
        micro(out, x, ldx, w, ldw, kc, mr, nr, kind);                                                        \
        return;
#define MICRO_ROW(kind, mr) MICRO_CASE(kind, mr, 1) MICRO_CASE(kind, mr, 2) MICRO_CASE(kind, mr, 3)
#define MICRO_FN(name, kind)                                                                                 \
    static void name(float *out, const float *x, ptrdiff_t ldx, const void *w, ptrdiff_t ldw, int kc,        \
                     int mr, int nr)                                                                         \
    {                                                                                                        \
        switch (mr * 8 + nr) {                                                                               \
            MICRO_ROW(kind, 1)                                                                               \
            MICRO_ROW(kind, 2)                                                                               \
            MICRO_ROW(kind, 3)                                                                               \
            MICRO_ROW(kind, 4)                                                                               \
            MICRO_CASE(kind, 1, 4)                                                                           \
            MICRO_CASE(kind, 2, 4)                                                                           \
            MICRO_CASE(kind, 3, 4) case 4 * 8 + 4 : micro44(out, x, ldx, w, ldw, kc, kind);                  \
            return;                                                                                          \
        }                                                                                                    \
    }
MICRO_FN(micro_f32, WK_F32)
MICRO_FN(micro_f16, WK_F16)
MICRO_FN(micro_bf16, WK_BF16)

typedef void (*micro_fn)(float *out, const float *x, ptrdiff_t ldx, const void *w, ptrdiff_t ldw, int kc,
                         int mr, int nr);

/* dst (kc) f32 = elements c .. c + kc of a plain-type row, converted in vectors. */
static void plain_to_f32(const void *w, ptrdiff_t c, int kc, float *dst, enum wkind kind)
{
    int e = 0;
    for (; e + VL <= kc; e += VL) *(vfu *)(dst + e) = load_w(w, c + e, kind);
    for (; e < kc; e++) dst[e] = load_w1(w, c + e, kind);
}

/* ---- x quantization, portable ---------------------------------------------------------------------------
 */

static void q8x_row_c(const float *x, int k, int8_t *q, int32_t *n4, float *dx, float *sxd, int nbp)
{
    const int nb = k / QB;
    for (int b = 0; b < nb; b++) {
        const float *xb = x + QB * b;
        float amax = 0.0f;
        int bad = 0;
        for (int e = 0; e < QB; e++) {
            const float a = fabsf(xb[e]);
            bad |= !(a <= FLT_MAX);
            amax = a > amax ? a : amax;
        }
        int sum = 0;
        if (bad || amax < Q8_TINY) {
            memset(q + QB * b, 0, QB);
            for (int l = 0; l < 8; l++) n4[8 * b + l] = 0;
        } else {
            const float id = 127.0f / amax;
            for (int l = 0; l < 8; l++) {
                int s4 = 0;
                for (int e = 4 * l; e < 4 * l + 4; e++) {
                    const int v = (int)nearbyintf(xb[e] * id);
                    q[QB * b + e] = (int8_t)v;
                    s4 += v;
                }
                n4[8 * b + l] = -s4;
                sum += s4;
            }
        }
        dx[b] = bad ? NAN : amax < Q8_TINY ? 0.0f : amax / 127.0f;
        sxd[b] = dx[b] * (float)sum;
    }
    for (int b = nb; b < nbp; b++) dx[b] = sxd[b] = 0.0f;
}

/* ---- weight decoding, portable --------------------------------------------------------------------------
 */

/* Q8_0, Q4_0, Q4_1, Q5_0, Q5_1: blocks of 32 of bsz bytes, f16 d at 0, f16 m at 2 (with_min), the u32 of
 * fifth bits at hoff (five), quants at qoff (eight: int8 quants, code = q + 128). */
static inline __attribute__((always_inline)) void dec32_c(const uint8_t *w, int c0, int kc, uint8_t *u,
                                                          float *s, float *mn, size_t bsz, int qoff, int hoff,
                                                          int with_min, int five, int eight)
{
    const uint8_t *bp = w + (size_t)(c0 / QB) * bsz;
    for (int b = 0; b < kc / QB; b++, bp += bsz) {
        uint16_t h[2];
        memcpy(h, bp, 4);
        s[b] = f16_to_f32(h[0]);
        if (with_min) mn[b] = f16_to_f32(h[1]);
        uint8_t *ub = u + QB * b;
        if (eight) {
            for (int e = 0; e < QB; e++) ub[e] = (uint8_t)(bp[qoff + e] ^ 0x80);
            continue;
        }
        uint32_t qh = 0;
        if (five) memcpy(&qh, bp + hoff, 4);
        for (int e = 0; e < 16; e++) {
            ub[e] = (uint8_t)((bp[qoff + e] & 15) | ((qh >> e) & 1) << 4);
            ub[e + 16] = (uint8_t)((bp[qoff + e] >> 4) | ((qh >> (e + 16)) & 1) << 4);
        }
    }
}

/* Q4_K, Q5_K: sub-block i (32 elements) of a super-block takes scale d·sc_i and minimum -dmin·m_i (ggml's
 * d1, m1); its codes are the low (even i) or high (odd i) nibbles of qs[32(i/2) ..], and bit i of qh[l] the
 * fifth bit of its element l. */
static inline __attribute__((always_inline)) void dec_q45k_c(const uint8_t *w, int c0, int kc, uint8_t *u,
                                                             float *s, float *mn, int five)
{
    const size_t bsz = five ? sizeof(struct block_q5_k) : sizeof(struct block_q4_k);
    const size_t qs_off = five ? offsetof(struct block_q5_k, qs) : offsetof(struct block_q4_k, qs);
    const uint8_t *bp = w + (size_t)(c0 / QK_K) * bsz;
    for (int sb = 0; sb < kc / QK_K; sb++, bp += bsz) {
        uint16_t h[2];
        memcpy(h, bp, 4);
        const float d = f16_to_f32(h[0]), dmin = f16_to_f32(h[1]);
        for (int i = 0; i < 8; i++) {
            uint8_t sc, m;
            block_q4_k_scale_min(i, bp + 4, &sc, &m);
            s[8 * sb + i] = d * (float)sc;
            mn[8 * sb + i] = -(dmin * (float)m);
            const uint8_t *qs = bp + qs_off + 32 * (i / 2);
            uint8_t *ub = u + QK_K * sb + QB * i;
            for (int l = 0; l < 32; l++) {
                int c = i & 1 ? qs[l] >> 4 : qs[l] & 15;
                if (five) c |= ((bp[offsetof(struct block_q5_k, qh) + l] >> i) & 1) << 4;
                ub[l] = (uint8_t)c;
            }
        }
    }
}

/* Q6_K: element 128h + 32g + l has the low bits of ql[64h + 32(g&1) + l] (low nibble for g < 2), the high
 * bits (qh[32h + l] >> 2g) & 3, and the scale of its 16 elements, d·scales[(128h + 32g + l) / 16]. */
static void dec_q6k_c(const uint8_t *w, int c0, int kc, uint8_t *u, float *s, float *mn)
{
    (void)mn;
    const struct block_q6_k *bl = (const struct block_q6_k *)w + c0 / QK_K;
    for (int sb = 0; sb < kc / QK_K; sb++, bl++) {
        const float d = f16_to_f32(bl->d);
        for (int t = 0; t < 16; t++) s[16 * sb + t] = d * (float)bl->scales[t];
        for (int h = 0; h < 2; h++)
            for (int g = 0; g < 4; g++)
                for (int l = 0; l < 32; l++) {
                    const int lo = (bl->ql[64 * h + 32 * (g & 1) + l] >> (4 * (g >> 1))) & 15;
                    const int hi = (bl->qh[32 * h + l] >> (2 * g)) & 3;
                    u[QK_K * sb + 128 * h + 32 * g + l] = (uint8_t)(lo | hi << 4);
                }
    }
}

static void dec_q8_0_c(const uint8_t *w, int c0, int kc, uint8_t *u, float *s, float *mn)
{
    dec32_c(w, c0, kc, u, s, mn, sizeof(struct block_q8_0), 2, 0, 0, 0, 1);
}
static void dec_q4_0_c(const uint8_t *w, int c0, int kc, uint8_t *u, float *s, float *mn)
{
    dec32_c(w, c0, kc, u, s, mn, sizeof(struct block_q4_0), 2, 0, 0, 0, 0);
}
static void dec_q4_1_c(const uint8_t *w, int c0, int kc, uint8_t *u, float *s, float *mn)
{
    dec32_c(w, c0, kc, u, s, mn, sizeof(struct block_q4_1), 4, 0, 1, 0, 0);
}
static void dec_q5_0_c(const uint8_t *w, int c0, int kc, uint8_t *u, float *s, float *mn)
{
    dec32_c(w, c0, kc, u, s, mn, sizeof(struct block_q5_0), 6, 2, 0, 1, 0);
}
static void dec_q5_1_c(const uint8_t *w, int c0, int kc, uint8_t *u, float *s, float *mn)
{
    dec32_c(w, c0, kc, u, s, mn, sizeof(struct block_q5_1), 8, 4, 1, 1, 0);
}
static void dec_q4_k_c(const uint8_t *w, int c0, int kc, uint8_t *u, float *s, float *mn)
{
    dec_q45k_c(w, c0, kc, u, s, mn, 0);
}
static void dec_q5_k_c(const uint8_t *w, int c0, int kc, uint8_t *u, float *s, float *mn)
{
    dec_q45k_c(w, c0, kc, u, s, mn, 1);
}

/* ---- dot products, portable: the definition the vector kernels reproduce bit for bit ------------------- */

static void q8_dot_c(const struct q8_dot *a, int mr, enum q8_mode mode, int sh)
{
    const struct q8x *x = a->x;
    const struct q8_tile *t = a->t;
    for (int i = 0; i < mr; i++) {
        const int r = a->i0 + i;
        const int8_t *xq = x->q + (size_t)r * x->k;
        const int32_t *n4 = x->n4 + (size_t)r * x->nb * 8;
        const float *dx = x->dx + (size_t)r * x->nbp, *sxd = x->sxd + (size_t)r * x->nbp;
        for (int j = 0; j < NRQ; j++) {
            float *acc = a->acc + (i * NRQ + j) * 16, *macc = a->macc + (i * NRQ + j) * 8;
            float av[8], mv[8];
            for (int l = 0; l < 8; l++) av[l] = a->first ? 0.0f : acc[l], mv[l] = a->first ? 0.0f : macc[l];
            for (int b = 0; b < a->nb && a->kb; b++) { /* Q8_KB_LANES: per block, or per half (Q6_K) */
                const int gb = a->b0 + b, nh = mode == Q8M_OFF16 ? 2 : 1, len = QB / nh;
                for (int h = 0; h < nh; h++) {
                    int32_t dot = 0;
                    for (int e = len * h; e < len * (h + 1); e++)
                        dot += (int32_t)t->u[j][QB * b + e] * (int32_t)xq[(size_t)QB * gb + e];
                    for (int l = 8 * h / nh; l < 8 * (h + 1) / nh && mode != Q8M_AFFINE; l++)
                        dot += n4[8 * gb + l] * (1 << sh);
                    const float sc = mode == Q8M_OFF16 ? t->s[j][2 * b + h] : t->s[j][b];
                    av[gb % 8] = fmaf((float)dot, sc * dx[gb], av[gb % 8]);
                }
            }
            for (int b = 0; b < a->nb && !a->kb; b++) {
                const int gb = a->b0 + b;
                const uint8_t *ub = t->u[j] + QB * b;
                const int8_t *qb = xq + (size_t)QB * gb;
                for (int l = 0; l < 8; l++) {
                    int32_t dot = mode == Q8M_AFFINE ? 0 : n4[8 * gb + l] * (1 << sh);
                    for (int e = 4 * l; e < 4 * l + 4; e++) dot += (int32_t)ub[e] * (int32_t)qb[e];
                    const float sc = mode == Q8M_OFF16 ? t->s[j][2 * b + l / 4] : t->s[j][b];
                    av[l] = fmaf((float)dot, sc * dx[gb], av[l]);
                }
            }
            if (mode == Q8M_AFFINE)
                for (int g = 0; g < a->nb; g += 8)
                    for (int l = 0; l < 8; l++) mv[l] = fmaf(t->mn[j][g + l], sxd[a->b0 + g + l], mv[l]);
            memcpy(acc, av, sizeof av);
            memcpy(macc, mv, sizeof mv);
        }
    }
}

/* The f32 arithmetic, per block and (x row, weight row): t = Σ code·x in 16 lanes (lane l: elements l and
 * 16 + l), acc += s·t (Q6_K: each half with its own scale); the codes of Q8_0 and Q6_K are made signed first
 * (code - 2^sh, exact), the offset of Q4_0/Q5_0 (-2^sh·s) and the minimums of the affine types enter once per
 * block as m'·Σx in 8 lanes (macc). The scale is applied once per block, as the old hand-written kernels did;
 * |error| ~ (k/32 + 16)·2^-24·Σ|w·x|. Which offsets and terms each mode takes: f32_conv_off, f32_uses_macc
 * (matmul_impl.h). */

/* x's per-block sums for the f32 arithmetic: sx[b] = hsum8((x[l] + x[8+l]) + (x[16+l] + x[24+l])), 0 past nb.
 */
static void sx_row_c(const float *x, int k, int8_t *q, int32_t *n4, float *dx, float *sx, int nbp)
{
    (void)q, (void)n4, (void)dx;
    const int nb = k / QB;
    for (int b = 0; b < nb; b++) {
        const float *xb = x + QB * b;
        float p[8];
        for (int l = 0; l < 8; l++) p[l] = (xb[l] + xb[8 + l]) + (xb[16 + l] + xb[24 + l]);
        sx[b] = hsum8(p);
    }
    for (int b = nb; b < nbp; b++) sx[b] = 0.0f;
}

static void f32_dot_c(const struct q8_dot *a, int mr, enum q8_mode mode, int sh)
{
    const struct q8_tile *t = a->t;
    const float coff = f32_conv_off(mode, sh), moff = -(float)(1 << sh);
    const int use_m = f32_uses_macc(mode, sh);
    for (int i = 0; i < mr; i++) {
        const float *xr = a->xf + (size_t)(a->i0 + i) * a->k;
        const float *sx = a->x->sxd + (size_t)(a->i0 + i) * a->x->nbp + a->b0;
        for (int j = 0; j < NRQ; j++) {
            float *acc = a->acc + (i * NRQ + j) * 16, *macc = a->macc + (i * NRQ + j) * 8;
            float av[16], mv[8];
            for (int l = 0; l < 16; l++) av[l] = a->first ? 0.0f : acc[l];
            for (int l = 0; l < 8; l++) mv[l] = a->first ? 0.0f : macc[l];
            for (int b = 0; b < a->nb; b++) {
                const float *xb = xr + (size_t)QB * (a->b0 + b);
                float c[QB];
                for (int e = 0; e < QB; e++) c[e] = (float)t->u[j][QB * b + e] - coff;
                if (mode == Q8M_OFF16) {
                    for (int l = 0; l < 16; l++) av[l] = fmaf(t->s[j][2 * b], c[l] * xb[l], av[l]);
                    for (int l = 0; l < 16; l++)
                        av[l] = fmaf(t->s[j][2 * b + 1], c[16 + l] * xb[16 + l], av[l]);
                } else {
                    for (int l = 0; l < 16; l++) {
                        const float tl = fmaf(c[16 + l], xb[16 + l], c[l] * xb[l]);
                        av[l] = fmaf(t->s[j][b], tl, av[l]);
                    }
                }
            }
            if (use_m)
                for (int g = 0; g < a->nb; g += 8)
                    for (int l = 0; l < 8; l++) {
                        const float mp = mode == Q8M_AFFINE ? t->mn[j][g + l] : moff * t->s[j][g + l];
                        mv[l] = fmaf(mp, sx[g + l], mv[l]);
                    }
            memcpy(acc, av, sizeof av);
            memcpy(macc, mv, sizeof mv);
        }
    }
}

/* Q8M_AFFINE16 (Q2_K): after the OFF16 kernel's scaled codes, the minimums of each 16 elements times the sum
 * of x over them into macc (lane 2b + h mod 8 for half h of chunk block b): int8, mn·dx·Σq (Σq from the
 * per-4 sums n4); f32, mn·Σx (x summed in element order). Every instruction set runs this same code. */
static void q8_min16_terms(const struct q8_dot *a, int mr, int int8)
{
    const struct q8x *x = a->x;
    const struct q8_tile *t = a->t;
    const int nh = 2 * a->nb; /* halves of 16 in the chunk: whole super-blocks, a multiple of 16 */
    float dxh[KCQ / 16], sxh[KCQ / 16];
    for (int i = 0; i < mr; i++) {
        const int r = a->i0 + i;
        const int32_t *n4 = x->n4 + (size_t)r * x->nb * 8;
        const float *dx = x->dx + (size_t)r * x->nbp, *xr = a->xf + (size_t)r * a->k;
        /* Per half q of 16 (block b0 + q/2, half q%2): int8, dx and Σq (n4's lanes 4q..4q+3 from the chunk's
         * first block); f32, 1 and Σx. The same values and roundings as per (row, half). */
        if (int8) {
            /* per block, both halves (a loop over halves becomes strided gathers in GCC's vectorizer) */
            for (int b = 0; b < a->nb; b++) {
                const int32_t *p = n4 + 8 * (a->b0 + b);
                dxh[2 * b] = dxh[2 * b + 1] = dx[a->b0 + b];
                sxh[2 * b] = (float)-((p[0] + p[1]) + (p[2] + p[3]));
                sxh[2 * b + 1] = (float)-((p[4] + p[5]) + (p[6] + p[7]));
            }
        } else {
            for (int q = 0; q < nh; q++) {
                float sx = 0.0f;
                for (int e = 0; e < 16; e++) sx += xr[QB * a->b0 + 16 * q + e];
                dxh[q] = 1.0f;
                sxh[q] = sx;
            }
        }
        for (int j = 0; j < NRQ; j++) {
            float *macc = a->macc + (i * NRQ + j) * 8, mv[8];
            const float *mn = t->mn[j];
            for (int l = 0; l < 8; l++) mv[l] = a->first ? 0.0f : macc[l];
            for (int q = 0; q < nh; q += 8)
                for (int l = 0; l < 8; l++) mv[l] = fmaf(mn[q + l] * dxh[q + l], sxh[q + l], mv[l]);
            memcpy(macc, mv, sizeof mv);
        }
    }
}

/* f32 arithmetic, batches of more than MR rows: the decoded codes back to f32 weights (w = s·(code - 2^sh),
 * or fma(s, code, mn) for the affine types) in the plain types' tile. */
static void q8_to_f32_c(const uint8_t *u, const float *s, const float *mn, int kc, enum q8_mode mode, int sh,
                        float *dst)
{
    const float off = mode == Q8M_AFFINE ? 0.0f : (float)(1 << sh);
    for (int e = 0; e < kc; e++) {
        const float c = (float)u[e], sc = mode == Q8M_OFF16 || mode == Q8M_AFFINE16 ? s[e / 16] : s[e / QB];
        /* Q8M_AFFINE16's codes carry the offset 1 (the OFF16 kernels with sh 0 take its scaled part) */
        dst[e] = mode == Q8M_AFFINE     ? fmaf(sc, c, mn[e / QB])
                 : mode == Q8M_AFFINE16 ? fmaf(sc, c - 1.0f, mn[e / 16])
                                        : sc * (c - off);
    }
}

/* ---- the types and the instruction sets ------------------------------------------------------------------
 */

static const struct q8_kind q8_kinds[DTYPE_COUNT] = {
    [DTYPE_Q8_0] = {7, Q8M_OFF, dec_q8_0_c},
    [DTYPE_Q4_0] = {3, Q8M_OFF, dec_q4_0_c},
    [DTYPE_Q4_1] = {0, Q8M_AFFINE, dec_q4_1_c},
    [DTYPE_Q5_0] = {4, Q8M_OFF, dec_q5_0_c},
    [DTYPE_Q5_1] = {0, Q8M_AFFINE, dec_q5_1_c},
    [DTYPE_Q4_K] = {0, Q8M_AFFINE, dec_q4_k_c, 1},
    [DTYPE_Q5_K] = {0, Q8M_AFFINE, dec_q5_k_c, 1},
    [DTYPE_Q6_K] = {5, Q8M_OFF16, dec_q6k_c, 1},
    /* matmul_lut.c */
    [DTYPE_Q2_K] = {0, Q8M_AFFINE16, q8_dec_q2_k},
    [DTYPE_Q3_K] = {2, Q8M_OFF16, q8_dec_q3_k},
    [DTYPE_IQ4_NL] = {7, Q8M_OFF, q8_dec_iq4_nl},
    [DTYPE_IQ4_XS] = {7, Q8M_OFF, q8_dec_iq4_xs},
    [DTYPE_MXFP4] = {4, Q8M_OFF, q8_dec_mxfp4},
    [DTYPE_NVFP4] = {4, Q8M_OFF16, q8_dec_nvfp4},
    [DTYPE_IQ2_XXS] = {6, Q8M_OFF, q8_dec_iq2_xxs},
    [DTYPE_IQ2_XS] = {6, Q8M_OFF16, q8_dec_iq2_xs},
    [DTYPE_IQ2_S] = {6, Q8M_OFF16, q8_dec_iq2_s},
    [DTYPE_IQ3_XXS] = {6, Q8M_OFF, q8_dec_iq3_xxs},
    [DTYPE_IQ3_S] = {4, Q8M_OFF, q8_dec_iq3_s},
    [DTYPE_IQ1_S] = {4, Q8M_OFF, q8_dec_iq1_s},
    [DTYPE_IQ1_M] = {4, Q8M_OFF16, q8_dec_iq1_m},
};

static const struct q8_isa q8_isa_portable = {"portable", NULL,        q8x_row_c, {f32_dot_c, q8_dot_c},
                                              {MRQ, MRQ}, q8_to_f32_c, NULL,      NULL,
                                              NULL,       NULL,        NULL};

/* Indexed by enum kern_cpu_isa (NULL: not in this build). */
static const struct q8_isa *const q8_isas[KERN_CPU_ISA_COUNT] = {
    [KERN_CPU_ISA_PORTABLE] = &q8_isa_portable,
#ifdef MM_X86
    [KERN_CPU_ISA_AVX2] = &q8_isa_avx2,
    [KERN_CPU_ISA_AVXVNNI] = &q8_isa_avxvnni,
    [KERN_CPU_ISA_AVX512VNNI] = &q8_isa_avx512vnni,
#endif
};

#ifndef KERN_CPU_ACT_DEFAULT
#define KERN_CPU_ACT_DEFAULT KERN_CPU_ACT_F32
#endif
/* Per thread (read by the thread that calls the product, before its pool runs): two engines in one process,
 * a test's CPU reference beside a GPU engine's host layers, each keep their own (forward_cpu sets them). */
static _Thread_local int act_mode = KERN_CPU_ACT_DEFAULT;

void kern_cpu_matmul_set_act(enum kern_cpu_act act)
{
    if (act >= 0 && act < KERN_CPU_ACT_COUNT) act_mode = (int)act;
}

enum kern_cpu_act kern_cpu_matmul_act(void)
{
    return (enum kern_cpu_act)act_mode;
}

static int isa_best = -1; /* cpuid's answer, at first use */

#ifdef MM_X86
/* F16C (CPUID leaf 1, ECX bit 29) and AVX-VNNI (leaf 7, subleaf 1, EAX bit 4) asked of cpuid directly: clang
 * 14's __builtin_cpu_supports knows neither name. Callers check AVX2 first, so the OS saves the YMM state. */
static int cpu_has_f16c(void)
{
    unsigned a, b, c, d;
    return __get_cpuid(1, &a, &b, &c, &d) && (c >> 29 & 1);
}

static int cpu_has_avxvnni(void)
{
    unsigned a, b, c, d;
    return __get_cpuid_count(7, 1, &a, &b, &c, &d) && (a >> 4 & 1);
}
#endif
static int isa_cap = KERN_CPU_ISA_COUNT - 1; /* kern_cpu_isa_limit */

enum kern_cpu_isa kern_cpu_isa_best(void)
{
    int best = __atomic_load_n(&isa_best, __ATOMIC_RELAXED);
    if (best >= 0) return (enum kern_cpu_isa)best;
    best = KERN_CPU_ISA_PORTABLE;
#ifdef MM_X86
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && cpu_has_f16c()) {
        best = KERN_CPU_ISA_AVX2;
        if (cpu_has_avxvnni()) best = KERN_CPU_ISA_AVXVNNI;
        if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
            __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni"))
            best = KERN_CPU_ISA_AVX512VNNI;
    }
#endif
    __atomic_store_n(&isa_best, best, __ATOMIC_RELAXED);
    return (enum kern_cpu_isa)best;
}

enum kern_cpu_isa kern_cpu_isa_limit(enum kern_cpu_isa max)
{
    __atomic_store_n(&isa_cap, (int)max, __ATOMIC_RELAXED);
    return kern_cpu_isa_current();
}

enum kern_cpu_isa kern_cpu_isa_current(void)
{
    const int best = kern_cpu_isa_best(), cap = __atomic_load_n(&isa_cap, __ATOMIC_RELAXED);
    int isa = best < cap ? best : cap;
    if (isa < 0) isa = KERN_CPU_ISA_PORTABLE;
    /* AVX-VNNI is not implied by AVX512-VNNI (Zen 4 has only the latter): step down to AVX2. */
    if (isa == KERN_CPU_ISA_AVXVNNI && best == KERN_CPU_ISA_AVX512VNNI) {
#ifdef MM_X86
        if (!cpu_has_avxvnni()) isa = KERN_CPU_ISA_AVX2;
#endif
    }
    return (enum kern_cpu_isa)isa;
}

const char *kern_cpu_isa_name(enum kern_cpu_isa isa)
{
    return isa >= 0 && isa < KERN_CPU_ISA_COUNT && q8_isas[isa] ? q8_isas[isa]->name : "?";
}

int kern_cpu_isa_parse(const char *name)
{
    for (int isa = 0; isa < KERN_CPU_ISA_COUNT; isa++)
        if (!strcmp(kern_cpu_isa_name((enum kern_cpu_isa)isa), name)) return isa;
    return -1;
}

/* ---- x's scratch buffer: one per calling thread, grown to the largest product it has seen ---------------
 */

/* x prepared for the quantized products: in the calling thread's buffer (matmul_amx.c has its own two). */
static struct thread_buf x_buf = THREAD_BUF_INIT;

struct q8x_job {
    const float *x;
    struct q8x *xq;
    q8_xrow_fn xrow;
    q8_xt_fn xt;
    int m, n_tasks;
};

static void q8x_task(void *arg, int t)
{
    const struct q8x_job *j = arg;
    const struct q8x *q = j->xq;
    for (int i = j->m * t / j->n_tasks; i < j->m * (t + 1) / j->n_tasks; i++) {
        const size_t r = (size_t)i * q->k;
        j->xrow(j->x + r, q->k, q->q + r, q->n4 + (size_t)i * q->nb * 8, q->dx + (size_t)i * q->nbp,
                q->sxd + (size_t)i * q->nbp, q->nbp);
        if (q->qt) /* q8x's comment */
            j->xt(q->q + r, q->n4 + (size_t)i * q->nb * 8, q->k, q->qt + r, q->n4h + (size_t)i * q->nb * 2);
    }
}

/* Prepares x (m, k) in the calling thread's scratch: quantized (int8) or only its block sums (f32, in sxd);
 * k is a multiple of 32. kb: also q transposed (q8x.qt), where k allows. */
static int q8x_prepare(struct q8x *xq, const float *x, int m, int k, const struct q8_isa *isa, int int8,
                       int kb, struct tpool *tp)
{
    const int nb = k / QB, nbp = (nb + 7) / 8 * 8;
    const size_t qb = int8 ? ((size_t)m * k + 63) / 64 * 64 : 0, n4b = int8 ? (size_t)m * nb * 32 : 0,
                 fb = (size_t)m * nbp * 4, tb = int8 && kb && k % 256 == 0 ? qb : 0, hb = tb ? n4b / 4 : 0;
    uint8_t *p = thread_buf_get(&x_buf, qb + n4b + 2 * fb + tb + hb);
    if (!p) return FERRY_ERR_NOMEM;
    *xq = (struct q8x){.q = (int8_t *)p,
                       .n4 = (int32_t *)(p + qb),
                       .dx = (float *)(p + qb + n4b),
                       .sxd = (float *)(p + qb + n4b + fb),
                       .qt = tb ? (int8_t *)(p + qb + n4b + 2 * fb) : NULL,
                       .n4h = tb ? (int32_t *)(p + qb + n4b + 2 * fb + tb) : NULL,
                       .k = k,
                       .nb = nb,
                       .nbp = nbp};
    /* Spread over the pool when there is enough to spread (prefill); decode's one row stays on the caller. */
    const int n_tasks = (int64_t)m * k >= (1 << 16) ? (m < tpool_size(tp) ? m : tpool_size(tp)) : 1;
    struct q8x_job job = {
        .x = x, .xq = xq, .xrow = int8 ? isa->xrow : sx_row_c, .xt = isa->xt, .m = m, .n_tasks = n_tasks};
    if (n_tasks > 1)
        tpool_run(tp, q8x_task, &job, n_tasks);
    else
        q8x_task(&job, 0);
    return FERRY_OK;
}

/* ---- plain types on AMX tiles -------------------------------------------------------------------------- */

static _Thread_local enum kern_cpu_plain plain_arith = KERN_CPU_PLAIN_F32; /* (per thread: as act_mode) */

/* kern_cpu_matmul_set_invariant (per thread: as act_mode). */
static _Thread_local int invariant = 0;

void kern_cpu_matmul_set_invariant(int on)
{
    invariant = on != 0;
}

void kern_cpu_matmul_set_plain(enum kern_cpu_plain p)
{
    plain_arith = p;
}

enum kern_cpu_plain kern_cpu_matmul_plain(void)
{
    return plain_arith;
}

int kern_cpu_amx_available(void)
{
    return amx_available();
}

/* The types the tiles take. */
static int amx_type(enum dtype wt)
{
    return wt == DTYPE_F16 || wt == DTYPE_BF16;
}

/* Whether a product of m rows goes to the tiles: bf16 chosen, m large enough, AMX here, some F16/BF16 job. */
static int amx_wanted(const struct kern_cpu_mm *jobs, int n_jobs, int m)
{
    if (plain_arith != KERN_CPU_PLAIN_BF16 || m < KERN_CPU_AMX_M_MIN || invariant || !amx_available())
        return 0;
    for (int j = 0; j < n_jobs; j++)
        if (amx_type(jobs[j].wt)) return 1;
    return 0;
}

struct amx_pack_job {
    const float *x;
    uint16_t *xp;
    int m, k, ng, n_tasks;
};
static void amx_pack_task(void *arg, int t)
{
    const struct amx_pack_job *j = arg;
    amx_pack_x(j->x, j->m, j->k, j->xp, j->ng * t / j->n_tasks, j->ng * (t + 1) / j->n_tasks);
}

/* x packed into bf16 tiles in the calling thread's buffer (the pool packs groups of 16 rows). */
static int amx_prepare(uint16_t **xp, const float *x, int m, int k, struct tpool *tp)
{
    *xp = amx_x_buffer(m, k);
    if (!*xp) return FERRY_ERR_NOMEM;
    const int ng = (m + 31) / 32 * 2, n_tasks = ng < tpool_size(tp) ? ng : tpool_size(tp);
    struct amx_pack_job job = {.x = x, .xp = *xp, .m = m, .k = k, .ng = ng, .n_tasks = n_tasks};
    tpool_run(tp, amx_pack_task, &job, n_tasks);
    return FERRY_OK;
}

/* ==== The product: partition, tasks, entry points =========================================================
 */

struct mm_ctx {
    float *y;         /* (m, n) */
    const float *x;   /* (m, k) */
    const uint8_t *w; /* (n, row_bytes) */
    enum dtype wt;
    const float *bias; /* (n) or NULL */
    int m, n, k;
    size_t row_bytes;
    int n_tasks; /* contiguous slices of the rows, handed out one at a time */
    /* plain types */
    enum wkind kind;
    int kc;          /* columns per chunk of the tile */
    micro_fn stream; /* m <= MR: rows stream whole (kc = k), converted in registers; else NULL (tile) */
    micro_fn micro;  /* the tile's kernel (f32) */
    /* quantized types */
    const struct q8_kind *qk; /* NULL for plain types */
    const struct q8x *xq;     /* x prepared for the arithmetic */
    int int8;                 /* the int8 arithmetic (else f32) */
    q8_f32_fn to_f32;         /* f32 arithmetic past MR rows: the plain tile, filled from decoded codes */
    q8_dec_fn dec;
    q8_dot_fn dot;
    q8_dot_fn direct; /* reads codes in place (no tile), or NULL */
    q8_rows_fn rows;  /* whole rows (Q8_0, int8, m = 1 on AVX2 hosts), or NULL */
    int mrq;
    int acc_lda; /* int8: floats from one weight row's 8 lanes to the next in the dot calls' acc (16; 8
                    packed) */
    /* plain types on AMX tiles (kern_cpu_matmul_set_plain): x packed as bf16 tiles, or NULL */
    const uint16_t *xp;
};

static void plain_task(const struct mm_ctx *c, int j_lo, int j_hi)
{
    const int m = c->m, k = c->k;
    float out[MR * NR];
    float tile[NR * (KC_MAX + TILE_PAD)] __attribute__((aligned(64)));
    struct q8_tile qt; /* quantized types: one decoded row */
    const micro_fn mk = c->stream ? c->stream : c->micro;
    for (int k0 = 0; k0 < k; k0 += c->kc) {
        const int kc = k - k0 < c->kc ? k - k0 : c->kc;
        for (int j0 = j_lo; j0 < j_hi; j0 += NR) {
            const int nr = j_hi - j0 < NR ? j_hi - j0 : NR;
            const void *wp;
            ptrdiff_t ldw;
            if (!c->stream) {
                const int stride = kc + TILE_PAD;
                for (int j = 0; j < nr; j++) {
                    const uint8_t *wr = c->w + (size_t)(j0 + j) * c->row_bytes;
                    if (c->to_f32) { /* a quantized type: decode, then codes to f32 */
                        c->dec(wr, k0, kc, qt.u[0], qt.s[0], qt.mn[0]);
                        c->to_f32(qt.u[0], qt.s[0], qt.mn[0], kc, c->qk->mode, c->qk->sh,
                                  tile + (size_t)j * stride);
                    } else {
                        plain_to_f32(wr, k0, kc, tile + (size_t)j * stride, c->kind);
                    }
                }
                wp = tile;
                ldw = (ptrdiff_t)stride * 4;
            } else {
                wp = c->w + (size_t)j0 * c->row_bytes;
                ldw = (ptrdiff_t)c->row_bytes;
                /* Rows stream from memory: ask for the group PF_AHEAD rows below now (see PF_AHEAD). */
                if (j0 + PF_AHEAD < j_hi && c->row_bytes <= 4096) { /* long rows: hardware prefetch */
                    const int pr = j_hi - (j0 + PF_AHEAD) < NR ? j_hi - (j0 + PF_AHEAD) : NR;
                    const uint8_t *p0 = c->w + (size_t)(j0 + PF_AHEAD) * c->row_bytes;
                    for (size_t off = 0; off < (size_t)pr * c->row_bytes; off += 64) prefetch_l2(p0 + off);
                }
            }
            for (int i0 = 0; i0 < m; i0 += MR) {
                const int mr = m - i0 < MR ? m - i0 : MR;
                mk(out, c->x + (size_t)i0 * k + k0, k, wp, ldw, kc, mr, nr);
                for (int i = 0; i < mr; i++) {
                    float *yr = c->y + (size_t)(i0 + i) * c->n + j0;
                    if (k0 == 0)
                        for (int j = 0; j < nr; j++) yr[j] = out[i * NR + j];
                    else
                        for (int j = 0; j < nr; j++) yr[j] += out[i * NR + j];
                }
            }
        }
    }
}

/* y[j] = hsum8(a + j·lda) (+ hsum8(mv + 8j) when mv) for j < nr: the tasks' last step, four outputs at a
 * time where SSE is (each lane's adds in hsum8's order, so the values are hsum8's bit for bit). */
static void q8_reduce(const float *a, int lda, const float *mv, int nr, float *y)
{
#ifdef MM_X86
    if (nr == 4) {
        __m128 s = hsum8x4(a, a + lda, a + 2 * lda, a + 3 * lda);
        if (mv) s = _mm_add_ps(s, hsum8x4(mv, mv + 8, mv + 16, mv + 24));
        _mm_storeu_ps(y, s);
        return;
    }
#endif
    for (int j = 0; j < nr; j++) y[j] = mv ? hsum8(a + j * lda) + hsum8(mv + 8 * j) : hsum8(a + j * lda);
}

static void q8_task(const struct mm_ctx *c, int j_lo, int j_hi)
{
    const int m = c->m, k = c->k, affine = c->qk->mode == Q8M_AFFINE || c->qk->mode == Q8M_AFFINE16;
    struct q8_tile tile;
    float accb[MBQ * NRQ * 16], maccb[MBQ * NRQ * 8];
    memset(&tile, 0, sizeof tile);
    const int bs = dtype_block_size(c->wt);
    const size_t bsz = dtype_type_size(c->wt);
    for (int i0m = 0; i0m < m; i0m += MBQ) {
        const int mb = m - i0m < MBQ ? m - i0m : MBQ;
        for (int j0 = j_lo; j0 < j_hi; j0 += NRQ) {
            const int nr = j_hi - j0 < NRQ ? j_hi - j0 : NRQ;
            for (int c0 = 0; c0 < k; c0 += KCQ) {
                const int kc = k - c0 < KCQ ? k - c0 : KCQ, nbc = kc / QB;
                const size_t off = (size_t)(c0 / bs) * bsz, len = (size_t)(kc / bs) * bsz;
                const uint8_t *rows[NRQ];
                for (int j = 0; j < NRQ; j++) {
                    rows[j] =
                        c->w + (size_t)(j0 + (j < nr ? j : 0)) * c->row_bytes; /* past the range: again */
                    if (j >= nr && !c->direct) { /* past the range: contributes zeros */
                        memset(tile.s[j], 0, sizeof tile.s[j]);
                        memset(tile.mn[j], 0, sizeof tile.mn[j]);
                        continue;
                    }
                    const uint8_t *wr = c->w + (size_t)(j0 + j) * c->row_bytes;
                    if (j0 + j + PF_AHEAD < j_hi)
                        for (size_t o = 0; o < len; o += 64)
                            prefetch_l2(wr + PF_AHEAD * c->row_bytes + off + o);
                    if (!c->direct) c->dec(wr, c0, kc, tile.u[j], tile.s[j], tile.mn[j]);
                    /* whole groups of 8 blocks are read by the per-block terms: zeros past the chunk */
                    for (int b = nbc; b % 8; b++) tile.mn[j][b] = 0.0f;
                    if (c->qk->mode == Q8M_OFF)
                        for (int b = nbc; b % 8; b++) tile.s[j][b] = 0.0f;
                }
                for (int i0 = 0; i0 < mb; i0 += c->mrq) {
                    const int mr = mb - i0 < c->mrq ? mb - i0 : c->mrq;
                    struct q8_dot d = {.x = c->xq,
                                       .xf = c->x,
                                       .k = k,
                                       .i0 = i0m + i0,
                                       .t = &tile,
                                       .b0 = c0 / QB,
                                       .nb = nbc,
                                       .acc = accb + (size_t)i0 * NRQ * 16,
                                       .macc = maccb + (size_t)i0 * NRQ * 8,
                                       .first = c0 == 0,
                                       .kb = c->int8 && c->qk->kb};
                    memcpy(d.row, rows, sizeof rows);
                    if (c->qk->mode == Q8M_AFFINE16) { /* the scaled codes, then the minimums */
                        c->dot(&d, mr, Q8M_OFF16, 0);
                        q8_min16_terms(&d, mr, c->int8);
                    } else {
                        (c->direct ? c->direct : c->dot)(&d, mr, c->qk->mode, c->qk->sh);
                    }
                }
            }
            const int with_m = c->int8 ? affine : f32_uses_macc(c->qk->mode, c->qk->sh);
            for (int i = 0; i < mb; i++) {
                const float *av = accb + (size_t)i * NRQ * 16, *mv = maccb + (size_t)i * NRQ * 8;
                float s8[NRQ][8]; /* f32 arithmetic: the two sets of 8 lanes added first */
                if (!c->int8)
                    for (int j = 0; j < nr; j++)
                        for (int l = 0; l < 8; l++) s8[j][l] = av[16 * j + l] + av[16 * j + 8 + l];
                q8_reduce(c->int8 ? av : s8[0], c->int8 ? c->acc_lda : 8, with_m ? mv : NULL, nr,
                          c->y + (size_t)(i0m + i) * c->n + j0);
            }
        }
    }
}

static void mm_task(void *arg, int t)
{
    const struct mm_ctx *c = arg;
    const int n_groups = (c->n + NR - 1) / NR;
    const int g0 = (int)((int64_t)n_groups * t / c->n_tasks),
              g1 = (int)((int64_t)n_groups * (t + 1) / c->n_tasks);
    if (g0 >= g1) return;
    const int j_lo = g0 * NR, j_hi = g1 * NR < c->n ? g1 * NR : c->n;
    if (c->xp) {
        /* A thread that cannot grow its weight buffer computes its rows in f32 instead: slower and not
         * bitwise the tiles' results, but not lost. */
        if (amx_matmul_rows(c->xp, c->m, c->k, c->w, c->wt, c->row_bytes, j_lo, j_hi, c->y, c->n))
            plain_task(c, j_lo, j_hi);
    } else if (c->rows)
        c->rows(c->xq, c->w, c->row_bytes, j_lo, j_hi, c->y);
    else if (c->qk && !c->to_f32)
        q8_task(c, j_lo, j_hi);
    else
        plain_task(c, j_lo, j_hi);
    if (c->bias)
        for (int i = 0; i < c->m; i++)
            for (int j = j_lo; j < j_hi; j++) c->y[(size_t)i * c->n + j] += c->bias[j];
}

static int mm_check(const float *y, const float *x, const void *w, enum dtype wt, int m, int n, int k)
{
    if (!y || !x || !w || !dtype_valid(wt) || m <= 0 || n <= 0 || k <= 0) return FERRY_ERR_INVALID;
    if (k % dtype_block_size(wt)) return FERRY_ERR_INVALID;
    if (dtype_get_traits(wt)->is_quantized && !q8_kinds[wt].dec) return FERRY_ERR_UNSUPPORTED;
    return FERRY_OK;
}

static int is_quantized(enum dtype wt)
{
    return q8_kinds[wt].dec != NULL;
}

/* Fills c for one product (xq: x prepared when the type is quantized) and returns how many pool tasks it
 * wants (1 for tiny products). */
static int mm_prepare(struct mm_ctx *c, float *y, const float *x, const void *w, enum dtype wt,
                      const float *bias, int m, int n, int k, struct tpool *tp, const struct q8x *xq,
                      const struct q8_isa *isa, const uint16_t *xp)
{
    *c = (struct mm_ctx){.y = y,
                         .x = x,
                         .w = w,
                         .wt = wt,
                         .bias = bias,
                         .m = m,
                         .n = n,
                         .k = k,
                         .row_bytes = dtype_row_size(wt, k),
                         .n_tasks = tpool_size(tp),
                         .acc_lda = 16,
                         .xp = amx_type(wt) ? xp : NULL};
    const int quant = is_quantized(wt), act = kern_cpu_matmul_act();
    if (quant) {
        c->qk = &q8_kinds[wt];
        c->xq = xq;
        c->dec = isa->decs && isa->decs[wt] ? isa->decs[wt] : c->qk->dec;
        c->int8 = act == KERN_CPU_ACT_INT8;
        c->dot = isa->dot[act];
        c->mrq = isa->mr[act];
        if (!c->int8 && m <= c->mrq && isa->direct) c->direct = isa->direct[wt];
        /* the per-block types' many-row kernels from 2 rows where x is transposed for them (q8x.qt) */
        const int any_m = c->qk->kb && xq->qt ? 1 : Q8_DIRECT_M;
        if (c->int8 && m <= any_m && isa->direct8) c->direct = isa->direct8[wt];
        if (c->int8 && m > any_m && isa->direct8_any && isa->direct8_any[wt]) {
            c->direct = isa->direct8_any[wt];
            c->mrq = MBQ;
            c->acc_lda = 8;
        }
        /* (one row only: at m = 2 ferry bench decoded ~10% slower end to end than through the tile) */
        if (c->int8 && m == 1 && wt == DTYPE_Q8_0) c->rows = isa->rows8_q8_0;
        /* f32 arithmetic past MR rows: the plain f32 tile (two FMAs per 32 elements and pair, where the
         * factored kernel takes three) */
        if (!c->int8 && m > MR && !invariant) c->to_f32 = isa->to_f32;
    }
    if (!quant || c->to_f32) {
        static const micro_fn micros[3] = {micro_f32, micro_f16, micro_bf16};
        c->kind = wt == DTYPE_F32 ? WK_F32 : wt == DTYPE_F16 ? WK_F16 : WK_BF16;
        c->micro = micro_f32;
        /* KC: a multiple of 256 that keeps the W tile in L1 and the (m, KC) slice of x in L2. Up to MR rows
         * of x there is nothing to reuse a tile for: whole rows stream (no partial sums). */
        int64_t kc = X_L2_BYTES / ((int64_t)m * 4);
        kc = kc / 256 * 256;
        if (kc < 256) kc = 256;
        if (kc > KC_MAX) kc = KC_MAX;
        if ((m <= STREAM_M_MAX || invariant) && !quant) {
            c->stream = micros[c->kind];
            kc = k;
        }
        c->kc = kc >= k ? k : (int)kc;
    }
    /* On the AMX tiles, ranges of at most AMX_TASK_ROWS rows (their sums stay in L2), handed out in turn. */
    if (c->xp) {
        const int want = (n + AMX_TASK_ROWS - 1) / AMX_TASK_ROWS;
        if (want > c->n_tasks) c->n_tasks = want;
        return c->n_tasks;
    }
    /* Tiny products are not worth waking the pool for. */
    if ((int64_t)m * n * k < 32 * 1024) return c->n_tasks = 1;
    /* Up to TASK_M_MAX rows of x the product streams W. With TASK_MIN_THREADS threads or more it is cut into
     * slices of TASK_ROWS rows (more when those would hold less than TASK_MIN_BYTES), handed out one at a
     * time, so that a core that is slow this time (another thread on it, a page walk) holds up one slice,
     * not 1/threads of the product; llama.cpp cuts the same way. With fewer threads the slices' own costs
     * outweigh that (kernels/cpu/NOTES.md, 2026-12-02e). */
    if (m <= TASK_M_MAX && c->n_tasks >= TASK_MIN_THREADS) {
        int64_t rows = ((int64_t)TASK_MIN_BYTES + (int64_t)c->row_bytes - 1) / (int64_t)c->row_bytes;
        rows = rows < TASK_ROWS ? TASK_ROWS : (rows + NR - 1) / NR * NR;
        const int64_t want = (n + rows - 1) / rows;
        if (want > c->n_tasks) c->n_tasks = (int)want;
    }
    return c->n_tasks;
}

int kern_cpu_matmul(float *y, const float *x, const void *w, enum dtype wt, const float *bias, int m, int n,
                    int k, struct tpool *tp)
{
    const struct kern_cpu_mm job = {.y = y, .w = w, .wt = wt, .bias = bias, .n = n};
    return kern_cpu_matmul_multi(&job, 1, x, m, k, tp);
}

struct mm_multi {
    struct mm_ctx c[KERN_CPU_MM_MAX_JOBS];
    int first[KERN_CPU_MM_MAX_JOBS + 1]; /* task index where each job's tasks start */
};

static void mm_multi_task(void *arg, int t)
{
    const struct mm_multi *mm = arg;
    int j = 0;
    while (t >= mm->first[j + 1]) j++;
    mm_task((void *)&mm->c[j], t - mm->first[j]);
}

int kern_cpu_matmul_multi(const struct kern_cpu_mm *jobs, int n_jobs, const float *x, int m, int k,
                          struct tpool *tp)
{
    if (!jobs || n_jobs <= 0 || n_jobs > KERN_CPU_MM_MAX_JOBS) return FERRY_ERR_INVALID;
    int quantized = 0, kb = 0;
    for (int j = 0; j < n_jobs; j++) {
        int st = mm_check(jobs[j].y, x, jobs[j].w, jobs[j].wt, m, jobs[j].n, k);
        if (st) return st;
        quantized |= is_quantized(jobs[j].wt);
        kb |= q8_kinds[jobs[j].wt].kb;
    }
    const struct q8_isa *isa = q8_isas[kern_cpu_isa_current()];
    uint16_t *xp = NULL;
    if (amx_wanted(jobs, n_jobs, m)) {
        int st = amx_prepare(&xp, x, m, k, tp);
        if (st) return st;
    }
    struct q8x xq = {0};
    if (quantized) { /* every quantized type's k is a multiple of 32: one prepared x for all jobs */
        const int int8 = kern_cpu_matmul_act() == KERN_CPU_ACT_INT8;
        int st = q8x_prepare(&xq, x, m, k, isa, int8, kb && m > 1 && isa->xt, tp);
        if (st) return st;
    }
    struct mm_multi mm;
    mm.first[0] = 0;
    for (int j = 0; j < n_jobs; j++)
        mm.first[j + 1] = mm.first[j] + mm_prepare(&mm.c[j], jobs[j].y, x, jobs[j].w, jobs[j].wt,
                                                   jobs[j].bias, m, jobs[j].n, k, tp, &xq, isa, xp);
    if (n_jobs == 1)
        tpool_run(tp, mm_task, &mm.c[0], mm.first[1]);
    else
        tpool_run(tp, mm_multi_task, &mm, mm.first[n_jobs]);
    return FERRY_OK;
}

int kern_cpu_matmul_ref(float *y, const float *x, const void *w, enum dtype wt, const float *bias, int m,
                        int n, int k)
{
    int st = mm_check(y, x, w, wt, m, n, k);
    if (st) return st;
    const size_t row_bytes = dtype_row_size(wt, k);
    const int bs = dtype_block_size(wt);
    const size_t bsz = dtype_type_size(wt);
    for (int j = 0; j < n; j++) {
        const uint8_t *wr = (const uint8_t *)w + (size_t)j * row_bytes;
        for (int i = 0; i < m; i++) {
            double acc = bias ? bias[j] : 0.0;
            for (int b = 0; b < k / bs; b++) {
                float blk[256];
                dtype_get_traits(wt)->to_f32(wr + (size_t)b * bsz, blk, bs);
                for (int e = 0; e < bs; e++) acc += (double)x[(size_t)i * k + b * bs + e] * blk[e];
            }
            y[(size_t)i * n + j] = (float)acc;
        }
    }
    return FERRY_OK;
}
