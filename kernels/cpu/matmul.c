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
 *  - Quantized types (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K): every weight block is decoded once per
 *    chunk of KCQ columns into a small tile of codes (u8, value = code - offset), scales and minimums
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
 *    With AVX512-VNNI and up to Q8_DIRECT_M (2) rows of x, Q4_K's, Q5_K's and Q6_K's codes are read in place
 *    from the weights instead (no tile; two weight rows per 512-bit register; with AVX2 or AVX-VNNI Q4_K's
 *    and Q5_K's, one row per 256-bit register), with the same integer sums and the same f32 steps per lane,
 *    so bitwise the tile's results (decode's products at m = 1: NOTES.md).
 *    Error against exact x: |y - Σ w·x| <= Σ_blocks (dx/2)·Σ|w| (x's rounding, half a step of each block)
 *    plus f32 rounding of the sums (~(k/32 + 8)·2^-24·Σ|w·x|); the integer products themselves are exact.
 *    The instruction set is chosen at run time (cpuid; kern_cpu_isa_limit caps it).
 * Determinism: every output element is the same sequence of f32 operations whatever the pool size (lanes
 * reduce in a fixed order, chunks add in k order, a row's arithmetic does not depend on the partition).
 * For the quantized types it is moreover the same whatever the instruction set (integer sums are exact, the
 * f32 steps and their lanes are the same), and with the int8 arithmetic whatever m (row i of a batch is
 * bitwise the product of that row alone).
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

#define MR           4    /* rows of x per micro-kernel call */
#define STREAM_M_MAX 16   /* up to this many rows of x, plain rows stream whole (no tile), MR rows per pass */
#define NR           4    /* rows of W per group (tile rows; the partition's unit for every type) */
/* Products of up to TASK_M_MAX rows of x, on pools of TASK_MIN_THREADS threads or more, are cut into tasks of
 * TASK_ROWS rows of W (a multiple of NR), or of TASK_MIN_BYTES of W when that is more rows (small models);
 * other products into one slice per thread, which keeps each slice of x in a thread's L2 the longest. */
#define TASK_ROWS        64
#define TASK_MIN_BYTES   (128 << 10)
#define TASK_M_MAX       16
#define TASK_MIN_THREADS 8
#define KC_MAX       1024 /* columns per chunk: an (NR, KC_MAX) f32 tile is 16 KiB and stays in L1 */
#define TILE_PAD     16   /* floats added to the tile's row stride */
#define X_L2_BYTES   (512 * 1024) /* budget for the (m, KC) slice of x */

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
    case WK_BF16: {
        vu32 u = __builtin_convertvector(*(const vhu *)((const uint16_t *)w + c), vu32);
        return (vf)(u << 16);
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

/* ==== Quantized types: x in int8 blocks, integer dot products =============================================
 */

#define QB  32   /* elements per x block (and per weight scale, except Q6_K's 16) */
#define KCQ 1024 /* columns per decoded chunk: a multiple of 256 (whole K-quant super-blocks) */
#define MBQ 64   /* x rows whose sums a task keeps (on its stack) before it moves to the next rows */
#define MRQ 4    /* most x rows per dot call (the AVX2 kernel takes 2: 16 registers) */
#define Q8_DIRECT_M 2    /* int8: up to this many x rows, kernels that read codes in place (no tile) */

/* How a weight type's decoded codes become values (see q8_kind). */
enum q8_mode {
    Q8M_OFF,    /* value = code - 2^sh, one scale per 32 elements */
    Q8M_OFF16,  /* value = code - 2^sh, one scale per 16 elements (Q6_K) */
    Q8M_AFFINE, /* value = code, one scale and one minimum per 32 elements: w = s·code + mn */
    Q8M_SIGNED, /* the AVX2 kernel's Q8_0: code ^ 0x80 is the value, multiplied through the sign trick (a
                   u8·s8 pair of 255·127 would overflow pmaddubsw's int16) */
};

/* x prepared for the integer products: for row i and block b of 32 elements,
 *   q   (m, k) int8: x·127/amax rounded to nearest even (amax = max |x| over the block); 0 when amax < 1e-30
 *   n4  (m, nb, 8) int32: minus the sums of q over elements 4l..4l+3 (the offset correction: lanes of
 *       -2^sh·Σq start the dot products of offset codes)
 *   dx  (m, nbp) f32: amax/127 (NaN when the block holds a NaN or an infinity, so that y does), 0 past nb
 *   sxd (m, nbp) f32: dx·Σq, the block's sum of x̂ (the minimums' weight), 0 past nb
 * nb = k/32, nbp = nb rounded up to a multiple of 8. Lives in a per-thread scratch buffer (q8_scratch). */
struct q8x {
    int8_t *q;
    int32_t *n4;
    float *dx, *sxd;
    int k, nb, nbp;
};

/* One group of NRQ weight rows, columns [c0, c0 + kc) decoded: codes in natural element order, the scale of
 * each 32 elements (Q6_K: of each 16), the minimum of each 32 (affine types; zero up to a multiple of 8
 * blocks). Rows past the end of a range have zero scales and minimums. */
#define NRQ NR
struct q8_tile {
    uint8_t u[NRQ][KCQ] __attribute__((aligned(64)));
    float s[NRQ][KCQ / 16];
    float mn[NRQ][KCQ / QB];
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
};

typedef void (*q8_dot_fn)(const struct q8_dot *a, int mr, enum q8_mode mode, int sh);
typedef void (*q8_f32_fn)(const uint8_t *u, const float *s, const float *mn, int kc, enum q8_mode mode,
                          int sh, float *dst);
typedef void (*q8_xrow_fn)(const float *x, int k, int8_t *q, int32_t *n4, float *dx, float *sxd, int nbp);
/* A product's rows j_lo .. j_hi of W against x's one row, whole rows at a time, into y (n). */
typedef void (*q8_rows_fn)(const struct q8x *x, const uint8_t *w, size_t row_bytes, int j_lo, int j_hi, float *y);

/* ---- x quantization, portable ---------------------------------------------------------------------------
 */

/* Blocks with amax below this are zero (their share of y is below 1e-30·Σ|w|). */
#define Q8_TINY 1e-30f

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
            for (int b = 0; b < a->nb; b++) {
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
 * |error| ~ (k/32 + 16)·2^-24·Σ|w·x|. */
static inline float f32_conv_off(enum q8_mode mode, int sh)
{
    return mode == Q8M_OFF16 || sh == 7 ? (float)(1 << sh) : 0.0f;
}
static inline int f32_uses_macc(enum q8_mode mode, int sh)
{
    return mode == Q8M_AFFINE || (mode == Q8M_OFF && sh != 7);
}

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

/* f32 arithmetic, batches of more than MR rows: the decoded codes back to f32 weights (w = s·(code - 2^sh),
 * or fma(s, code, mn) for the affine types) in the plain types' tile. */
static void q8_to_f32_c(const uint8_t *u, const float *s, const float *mn, int kc, enum q8_mode mode, int sh,
                        float *dst)
{
    const float off = mode == Q8M_AFFINE ? 0.0f : (float)(1 << sh);
    for (int e = 0; e < kc; e++) {
        const float c = (float)u[e], sc = mode == Q8M_OFF16 ? s[e / 16] : s[e / QB];
        dst[e] = mode == Q8M_AFFINE ? fmaf(sc, c, mn[e / QB]) : sc * (c - off);
    }
}

#ifdef MM_X86
/* ---- x86: AVX2 decoding and x quantization; dot products with AVX2, AVX-VNNI or AVX512-VNNI -------------
 */
#define T_AVX2    "avx2,fma,f16c"
#define T_AVXVNNI "avx2,fma,f16c,avxvnni"
#define T_VNNI512 "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni"

__attribute__((target(T_AVX2))) static void q8x_row_avx2(const float *x, int k, int8_t *q, int32_t *n4,
                                                         float *dx, float *sxd, int nbp)
{
    const int nb = k / QB;
    const __m256 sign = _mm256_set1_ps(-0.0f), big = _mm256_set1_ps(FLT_MAX);
    const __m256i perm = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    const __m256i ones8 = _mm256_set1_epi8(1), ones16 = _mm256_set1_epi16(1);
    for (int b = 0; b < nb; b++) {
        const float *xb = x + QB * b;
        __m256 v[4], mx = _mm256_setzero_ps(), badv = _mm256_setzero_ps();
        for (int r = 0; r < 4; r++) {
            v[r] = _mm256_loadu_ps(xb + 8 * r);
            const __m256 a = _mm256_andnot_ps(sign, v[r]);
            badv = _mm256_or_ps(badv, _mm256_cmp_ps(a, big, _CMP_NLE_UQ));
            mx = _mm256_max_ps(mx, a);
        }
        __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
        m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        m4 = _mm_max_ss(m4, _mm_shuffle_ps(m4, m4, 1));
        const float amax = _mm_cvtss_f32(m4);
        const int bad = _mm256_movemask_ps(badv) != 0;
        int sum = 0;
        if (bad || amax < Q8_TINY) {
            _mm256_storeu_si256((__m256i *)(q + QB * b), _mm256_setzero_si256());
            _mm256_storeu_si256((__m256i *)(n4 + 8 * b), _mm256_setzero_si256());
        } else {
            const __m256 id = _mm256_set1_ps(127.0f / amax);
            __m256i iv[4];
            for (int r = 0; r < 4; r++) iv[r] = _mm256_cvtps_epi32(_mm256_mul_ps(v[r], id));
            const __m256i p = _mm256_permutevar8x32_epi32(
                _mm256_packs_epi16(_mm256_packs_epi32(iv[0], iv[1]), _mm256_packs_epi32(iv[2], iv[3])), perm);
            _mm256_storeu_si256((__m256i *)(q + QB * b), p);
            const __m256i s4 = _mm256_madd_epi16(_mm256_maddubs_epi16(ones8, p), ones16);
            _mm256_storeu_si256((__m256i *)(n4 + 8 * b), _mm256_sub_epi32(_mm256_setzero_si256(), s4));
            __m128i t = _mm_add_epi32(_mm256_castsi256_si128(s4), _mm256_extracti128_si256(s4, 1));
            t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0x4e));
            t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0xb1));
            sum = _mm_cvtsi128_si32(t);
        }
        dx[b] = bad ? NAN : amax < Q8_TINY ? 0.0f : amax / 127.0f;
        sxd[b] = dx[b] * (float)sum;
    }
    for (int b = nb; b < nbp; b++) dx[b] = sxd[b] = 0.0f;
}

static inline __attribute__((always_inline, target(T_AVX2))) void
dec32_avx2(const uint8_t *w, int c0, int kc, uint8_t *u, float *s, float *mn, size_t bsz, int qoff, int hoff,
           int with_min, int five, int eight)
{
    const __m256i m0f = _mm256_set1_epi8(15), x80 = _mm256_set1_epi8((char)0x80), b10 = _mm256_set1_epi8(16);
    /* Bit e of qh to byte e: byte e of the broadcast word is qh's byte e/8, tested against 1 << (e % 8). */
    const __m256i sel = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2,
                                         2, 3, 3, 3, 3, 3, 3, 3, 3);
    const __m256i bits = _mm256_set1_epi64x(0x8040201008040201LL);
    const uint8_t *bp = w + (size_t)(c0 / QB) * bsz;
    for (int b = 0; b < kc / QB; b++, bp += bsz) {
        uint16_t h[2];
        memcpy(h, bp, 4);
        s[b] = _cvtsh_ss(h[0]);
        if (with_min) mn[b] = _cvtsh_ss(h[1]);
        __m256i v;
        if (eight) {
            v = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(bp + qoff)), x80);
        } else {
            const __m128i q = _mm_loadu_si128((const __m128i *)(bp + qoff));
            v = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(q, 4), q), m0f);
            if (five) {
                uint32_t qh;
                memcpy(&qh, bp + hoff, 4);
                const __m256i hb = _mm256_shuffle_epi8(_mm256_set1_epi32((int)qh), sel);
                v = _mm256_or_si256(
                    v, _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(hb, bits), bits), b10));
            }
        }
        _mm256_store_si256((__m256i *)(u + QB * b), v);
    }
}

/* Bit i of every byte moved to bit 4 (16-bit shifts: the caller's mask keeps each byte's own bit). */
static inline __attribute__((always_inline, target(T_AVX2))) __m256i bit_to_4(__m256i v, int i)
{
    return i <= 4 ? _mm256_sll_epi16(v, _mm_cvtsi32_si128(4 - i))
                  : _mm256_srl_epi16(v, _mm_cvtsi32_si128(i - 4));
}

/* The scales d·sc_i and minimums -(dmin·m_i) of sub-blocks i = 0..7 of the Q4_K/Q5_K super-block at bp (the
 * values dec_q45k_c computes). */
static inline __attribute__((always_inline, target(T_AVX2))) void q45k_scales(const uint8_t *bp, __m256 *s,
                                                                              __m256 *mn)
{
    uint16_t h[2];
    uint32_t a[3];
    memcpy(h, bp, 4);
    memcpy(a, bp + 4, 12);
    /* The 8 scales and 8 minimums (6 bits each) as bytes: sub-blocks 0-3 in the low 6 bits of bytes 0-3
     * (scales) and 4-7 (minimums); 4-7 from the nibbles of bytes 8-11 and the top bits of bytes 0-7. */
    const uint32_t m6 = 0x3f3f3f3fu, m4 = 0x0f0f0f0fu, m2 = 0x03030303u;
    const uint64_t sc = (a[0] & m6) | (uint64_t)((a[2] & m4) | ((a[0] >> 6) & m2) << 4) << 32;
    const uint64_t mi = (a[1] & m6) | (uint64_t)(((a[2] >> 4) & m4) | ((a[1] >> 6) & m2) << 4) << 32;
    const __m256 scf = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128((long long)sc)));
    const __m256 mif = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128((long long)mi)));
    *s = _mm256_mul_ps(_mm256_set1_ps(_cvtsh_ss(h[0])), scf);
    *mn = _mm256_xor_ps(_mm256_mul_ps(_mm256_set1_ps(_cvtsh_ss(h[1])), mif), _mm256_set1_ps(-0.0f));
}

static inline __attribute__((always_inline, target(T_AVX2))) void
dec_q45k_avx2(const uint8_t *w, int c0, int kc, uint8_t *u, float *s, float *mn, int five)
{
    const size_t bsz = five ? sizeof(struct block_q5_k) : sizeof(struct block_q4_k);
    const size_t qs_off = five ? offsetof(struct block_q5_k, qs) : offsetof(struct block_q4_k, qs);
    const __m256i m0f = _mm256_set1_epi8(15), b10 = _mm256_set1_epi8(16);
    const uint8_t *bp = w + (size_t)(c0 / QK_K) * bsz;
    for (int sb = 0; sb < kc / QK_K; sb++, bp += bsz) {
        __m256 sv, mv;
        q45k_scales(bp, &sv, &mv);
        _mm256_storeu_ps(s + 8 * sb, sv);
        _mm256_storeu_ps(mn + 8 * sb, mv);
        __m256i qh = _mm256_setzero_si256();
        if (five) qh = _mm256_loadu_si256((const __m256i *)(bp + offsetof(struct block_q5_k, qh)));
        for (int p = 0; p < 4; p++) {
            const __m256i q = _mm256_loadu_si256((const __m256i *)(bp + qs_off + 32 * p));
            __m256i lo = _mm256_and_si256(q, m0f), hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m0f);
            if (five) { /* bit 2p (low nibbles' sub-block) and 2p + 1 of each qh byte, moved to bit 4 */
                lo = _mm256_or_si256(lo, _mm256_and_si256(bit_to_4(qh, 2 * p), b10));
                hi = _mm256_or_si256(hi, _mm256_and_si256(bit_to_4(qh, 2 * p + 1), b10));
            }
            _mm256_store_si256((__m256i *)(u + QK_K * sb + 64 * p), lo);
            _mm256_store_si256((__m256i *)(u + QK_K * sb + 64 * p + 32), hi);
        }
    }
}

__attribute__((target(T_AVX2))) static void dec_q6k_avx2(const uint8_t *w, int c0, int kc, uint8_t *u,
                                                         float *s, float *mn)
{
    (void)mn;
    const __m256i m0f = _mm256_set1_epi8(15), m30 = _mm256_set1_epi8(0x30);
    const struct block_q6_k *bl = (const struct block_q6_k *)w + c0 / QK_K;
    for (int sb = 0; sb < kc / QK_K; sb++, bl++) {
        const __m256 d = _mm256_set1_ps(_cvtsh_ss(bl->d));
        const __m128i sc = _mm_loadu_si128((const __m128i *)bl->scales);
        _mm256_storeu_ps(s + 16 * sb, _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(sc))));
        _mm256_storeu_ps(s + 16 * sb + 8,
                         _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(sc, 8)))));
        for (int h = 0; h < 2; h++) {
            const __m256i l0 = _mm256_loadu_si256((const __m256i *)(bl->ql + 64 * h));
            const __m256i l1 = _mm256_loadu_si256((const __m256i *)(bl->ql + 64 * h + 32));
            const __m256i qh = _mm256_loadu_si256((const __m256i *)(bl->qh + 32 * h));
            uint8_t *ub = u + QK_K * sb + 128 * h;
            _mm256_store_si256(
                (__m256i *)ub,
                _mm256_or_si256(_mm256_and_si256(l0, m0f), _mm256_and_si256(_mm256_slli_epi16(qh, 4), m30)));
            _mm256_store_si256(
                (__m256i *)(ub + 32),
                _mm256_or_si256(_mm256_and_si256(l1, m0f), _mm256_and_si256(_mm256_slli_epi16(qh, 2), m30)));
            _mm256_store_si256(
                (__m256i *)(ub + 64),
                _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m0f), _mm256_and_si256(qh, m30)));
            _mm256_store_si256((__m256i *)(ub + 96),
                               _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m0f),
                                               _mm256_and_si256(_mm256_srli_epi16(qh, 2), m30)));
        }
    }
}

#define DEC_AVX2(name, call)                                                                                 \
    __attribute__((target(T_AVX2))) static void name(const uint8_t *w, int c0, int kc, uint8_t *u, float *s, \
                                                     float *mn)                                              \
    {                                                                                                        \
        call;                                                                                                \
    }
DEC_AVX2(dec_q8_0_avx2, dec32_avx2(w, c0, kc, u, s, mn, sizeof(struct block_q8_0), 2, 0, 0, 0, 1))
DEC_AVX2(dec_q4_0_avx2, dec32_avx2(w, c0, kc, u, s, mn, sizeof(struct block_q4_0), 2, 0, 0, 0, 0))
DEC_AVX2(dec_q4_1_avx2, dec32_avx2(w, c0, kc, u, s, mn, sizeof(struct block_q4_1), 4, 0, 1, 0, 0))
DEC_AVX2(dec_q5_0_avx2, dec32_avx2(w, c0, kc, u, s, mn, sizeof(struct block_q5_0), 6, 2, 0, 1, 0))
DEC_AVX2(dec_q5_1_avx2, dec32_avx2(w, c0, kc, u, s, mn, sizeof(struct block_q5_1), 8, 4, 1, 1, 0))
DEC_AVX2(dec_q4_k_avx2, dec_q45k_avx2(w, c0, kc, u, s, mn, 0))
DEC_AVX2(dec_q5_k_avx2, dec_q45k_avx2(w, c0, kc, u, s, mn, 1))

/* The lane dot products: lane l of the result = c_l + Σ_{e=4l..4l+3} u_e·x_e (u unsigned, x signed). */
typedef __m256i (*lane_dot_fn)(__m256i c, __m256i u, __m256i x);
static inline __attribute__((always_inline, target(T_AVX2))) __m256i lane_dot_avx2(__m256i c, __m256i u,
                                                                                   __m256i x)
{
    /* pmaddubsw pairs (saturating int16: exact while u·x pairs stay below 32767, true for codes < 128) */
    return _mm256_add_epi32(c, _mm256_madd_epi16(_mm256_maddubs_epi16(u, x), _mm256_set1_epi16(1)));
}
static inline __attribute__((always_inline, target(T_AVXVNNI))) __m256i lane_dot_avxvnni(__m256i c, __m256i u,
                                                                                         __m256i x)
{
    return _mm256_dpbusd_avx_epi32(c, u, x);
}
static inline __attribute__((always_inline, target(T_VNNI512))) __m256i lane_dot_vnni512(__m256i c, __m256i u,
                                                                                         __m256i x)
{
    return _mm256_dpbusd_epi32(c, u, x);
}

/* The affine types' per-block terms: each block's minimum times the sum of x over it, into macc. */
static inline __attribute__((always_inline, target(T_AVX2))) void q8_min_terms(const struct q8_dot *a, int mr)
{
    const struct q8x *x = a->x;
    const struct q8_tile *t = a->t;
    for (int i = 0; i < mr; i++) {
        const float *sxd = x->sxd + (size_t)(a->i0 + i) * x->nbp + a->b0;
        for (int j = 0; j < NRQ; j++) {
            float *mp = a->macc + (i * NRQ + j) * 8;
            __m256 m = a->first ? _mm256_setzero_ps() : _mm256_loadu_ps(mp);
            for (int g = 0; g < a->nb; g += 8)
                m = _mm256_fmadd_ps(_mm256_loadu_ps(&t->mn[j][g]), _mm256_loadu_ps(sxd + g), m);
            _mm256_storeu_ps(mp, m);
        }
    }
}

/* The rows of x a dot body reads (codes, per-4 sums, scales) and its accumulators (zero, or the chunk's
 * running sums). */
static inline __attribute__((always_inline, target(T_AVX2))) void
q8_dot_rows(const struct q8_dot *a, const int mr, const int8_t **xq, const int32_t **n4, const float **dx,
            __m256 (*acc)[NRQ])
{
    const struct q8x *x = a->x;
    for (int i = 0; i < mr; i++) {
        const int r = a->i0 + i;
        xq[i] = x->q + (size_t)r * x->k;
        n4[i] = x->n4 + (size_t)r * x->nb * 8;
        dx[i] = x->dx + (size_t)r * x->nbp;
        for (int j = 0; j < NRQ; j++)
            acc[i][j] = a->first ? _mm256_setzero_ps() : _mm256_loadu_ps(a->acc + (i * NRQ + j) * 16);
    }
}

/* q8_dot_c's arithmetic in 8-lane vectors: mr x NRQ accumulators in registers over the chunk. */
static inline __attribute__((always_inline, target(T_AVX2))) void
q8_dot_body(const struct q8_dot *a, const int mr, const enum q8_mode mode, int sh, lane_dot_fn dot)
{
    const struct q8_tile *t = a->t;
    const int8_t *xq[MRQ];
    const int32_t *n4[MRQ];
    const float *dx[MRQ];
    __m256 acc[MRQ][NRQ];
    q8_dot_rows(a, mr, xq, n4, dx, acc);
    const __m128i shv = _mm_cvtsi32_si128(sh);
    const __m256i x80 = _mm256_set1_epi8((char)0x80);
    for (int b = 0; b < a->nb; b++) {
        const int gb = a->b0 + b;
        __m256i xv[MRQ], cv[MRQ];
        for (int i = 0; i < mr; i++) {
            xv[i] = _mm256_loadu_si256((const __m256i *)(xq[i] + (size_t)QB * gb));
            cv[i] = mode == Q8M_OFF || mode == Q8M_OFF16
                        ? _mm256_sll_epi32(_mm256_loadu_si256((const __m256i *)(n4[i] + 8 * gb)), shv)
                        : _mm256_setzero_si256();
        }
        for (int j = 0; j < NRQ; j++) {
            const __m256i uv = _mm256_load_si256((const __m256i *)(t->u[j] + QB * b));
            const __m256 sv = mode == Q8M_OFF16 ? _mm256_set_m128(_mm_broadcast_ss(&t->s[j][2 * b + 1]),
                                                                  _mm_broadcast_ss(&t->s[j][2 * b]))
                                                : _mm256_broadcast_ss(&t->s[j][b]);
            const __m256i sgn = _mm256_xor_si256(uv, x80); /* Q8M_SIGNED: the int8 value */
            const __m256i au = _mm256_abs_epi8(sgn);
            for (int i = 0; i < mr; i++) {
                const __m256i l = mode == Q8M_SIGNED
                                      ? dot(_mm256_setzero_si256(), au, _mm256_sign_epi8(xv[i], sgn))
                                      : dot(cv[i], uv, xv[i]);
                const __m256 sd = _mm256_mul_ps(sv, _mm256_broadcast_ss(dx[i] + gb));
                acc[i][j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(l), sd, acc[i][j]);
            }
        }
    }
    for (int i = 0; i < mr; i++)
        for (int j = 0; j < NRQ; j++) _mm256_storeu_ps(a->acc + (i * NRQ + j) * 16, acc[i][j]);
    if (mode == Q8M_AFFINE) q8_min_terms(a, mr);
}

#define Q8_CASE(mode, mr, dot)                                                                               \
    case (mode)*8 + (mr):                                                                                    \
        q8_dot_body(a, mr, mode, sh, dot);                                                                   \
        return;
#define Q8_CASES2(mode, dot) Q8_CASE(mode, 1, dot) Q8_CASE(mode, 2, dot)
#define Q8_CASES4(mode, dot) Q8_CASES2(mode, dot) Q8_CASE(mode, 3, dot) Q8_CASE(mode, 4, dot)

__attribute__((target(T_AVX2))) static void q8_dot_avx2(const struct q8_dot *a, int mr, enum q8_mode mode,
                                                        int sh)
{
    if (mode == Q8M_OFF && sh == 7) mode = Q8M_SIGNED; /* Q8_0 */
    switch (mode * 8 + mr) {
        Q8_CASES2(Q8M_OFF, lane_dot_avx2)
        Q8_CASES2(Q8M_OFF16, lane_dot_avx2)
        Q8_CASES2(Q8M_AFFINE, lane_dot_avx2)
        Q8_CASES2(Q8M_SIGNED, lane_dot_avx2)
    }
}
__attribute__((target(T_AVXVNNI))) static void q8_dot_avxvnni(const struct q8_dot *a, int mr,
                                                              enum q8_mode mode, int sh)
{
    switch (mode * 8 + mr) {
        Q8_CASES2(Q8M_OFF, lane_dot_avxvnni)
        Q8_CASES2(Q8M_OFF16, lane_dot_avxvnni)
        Q8_CASES2(Q8M_AFFINE, lane_dot_avxvnni)
    }
}

/* int8 arithmetic, Q4_K and Q5_K, m <= Q8_DIRECT_M on AVX2 and AVX-VNNI: the codes read in place as in
 * q45k_dot_body512, one weight row and block per 256-bit register, the lane sums by the instruction set's
 * lane_dot as q8_dot_body forms them. Every (x row, weight row) takes q8_dot_body's and q8_min_terms' f32
 * steps in their order (per block fma(lanes, s·dx, acc), s·dx the same product; per super-block fma(mn, sxd,
 * macc)), so the results are bitwise the tile's. A first pass over the chunk's scales puts s·dx on the stack
 * (a broadcast load per block, no shuffle) and finishes macc, so the block pass holds only the 8 accumulators
 * of 2 x rows in the 16 registers. */
static inline __attribute__((always_inline, target(T_AVX2))) void
q45k_dot_body(const struct q8_dot *a, const int mr, const int five, lane_dot_fn dot)
{
    const struct q8x *x = a->x;
    const int8_t *xq[Q8_DIRECT_M];
    float sd[Q8_DIRECT_M][NRQ][KCQ / QB] __attribute__((aligned(32))); /* s·dx per block of the chunk */
    __m256 acc[Q8_DIRECT_M][NRQ];
    const size_t bsz = five ? sizeof(struct block_q5_k) : sizeof(struct block_q4_k);
    const size_t qs_off = five ? offsetof(struct block_q5_k, qs) : offsetof(struct block_q4_k, qs);
    const size_t qh_off = offsetof(struct block_q5_k, qh);
    for (int i = 0; i < mr; i++) {
        const size_t r = (size_t)(a->i0 + i);
        const float *dx = x->dx + r * x->nbp + a->b0, *sxd = x->sxd + r * x->nbp + a->b0;
        xq[i] = x->q + r * x->k + (size_t)QB * a->b0;
        for (int j = 0; j < NRQ; j++) {
            float *mp = a->macc + (i * NRQ + j) * 8;
            __m256 m = a->first ? _mm256_setzero_ps() : _mm256_loadu_ps(mp);
            for (int sb = 0; sb < a->nb / 8; sb++) {
                __m256 s, mn;
                q45k_scales(a->row[j] + (size_t)(a->b0 / 8 + sb) * bsz, &s, &mn);
                _mm256_store_ps(sd[i][j] + 8 * sb, _mm256_mul_ps(s, _mm256_loadu_ps(dx + 8 * sb)));
                m = _mm256_fmadd_ps(mn, _mm256_loadu_ps(sxd + 8 * sb), m);
            }
            _mm256_storeu_ps(mp, m);
            acc[i][j] = a->first ? _mm256_setzero_ps() : _mm256_loadu_ps(a->acc + (i * NRQ + j) * 16);
        }
    }
    const __m256i m0f = _mm256_set1_epi8(15), b10 = _mm256_set1_epi8(16);
    for (int sb = 0; sb < a->nb / 8; sb++) {
        const size_t off = (size_t)(a->b0 / 8 + sb) * bsz;
#pragma GCC unroll 4
        for (int h = 0; h < 4; h++) { /* 32 bytes of each row: blocks 2h (low nibbles) and 2h + 1 */
            __m256i xv[Q8_DIRECT_M][2];
            for (int i = 0; i < mr; i++)
                for (int e = 0; e < 2; e++)
                    xv[i][e] = _mm256_loadu_si256((const __m256i *)(xq[i] + QK_K * sb + QB * (2 * h + e)));
#pragma GCC unroll 4
            for (int j = 0; j < NRQ; j++) {
                const __m256i q = _mm256_loadu_si256((const __m256i *)(a->row[j] + off + qs_off + 32 * h));
                __m256i u[2] = {_mm256_and_si256(q, m0f), _mm256_and_si256(_mm256_srli_epi16(q, 4), m0f)};
                if (five) { /* bits 2h and 2h + 1 of each qh byte to bit 4, as dec_q45k_avx2 */
                    const __m256i qh = _mm256_loadu_si256((const __m256i *)(a->row[j] + off + qh_off));
                    u[0] = _mm256_or_si256(u[0], _mm256_and_si256(bit_to_4(qh, 2 * h), b10));
                    u[1] = _mm256_or_si256(u[1], _mm256_and_si256(bit_to_4(qh, 2 * h + 1), b10));
                }
                for (int e = 0; e < 2; e++)
                    for (int i = 0; i < mr; i++) {
                        const __m256i l = dot(_mm256_setzero_si256(), u[e], xv[i][e]);
                        const __m256 s = _mm256_broadcast_ss(&sd[i][j][8 * sb + 2 * h + e]);
                        acc[i][j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(l), s, acc[i][j]);
                    }
            }
        }
    }
    for (int i = 0; i < mr; i++)
        for (int j = 0; j < NRQ; j++) _mm256_storeu_ps(a->acc + (i * NRQ + j) * 16, acc[i][j]);
}

#define DIR8_AVX2(name, target_, body, ...)                                                                  \
    __attribute__((target(target_))) static void name(const struct q8_dot *a, int mr, enum q8_mode m_,       \
                                                      int sh)                                                \
    {                                                                                                        \
        (void)m_, (void)sh;                                                                                  \
        if (mr == 1)                                                                                         \
            body(a, 1, __VA_ARGS__);                                                                         \
        else                                                                                                 \
            body(a, 2, __VA_ARGS__);                                                                         \
    }
DIR8_AVX2(dir8_avx2_q4_k, T_AVX2, q45k_dot_body, 0, lane_dot_avx2)
DIR8_AVX2(dir8_avx2_q5_k, T_AVX2, q45k_dot_body, 1, lane_dot_avx2)
DIR8_AVX2(dir8_avxvnni_q4_k, T_AVXVNNI, q45k_dot_body, 0, lane_dot_avxvnni)
DIR8_AVX2(dir8_avxvnni_q5_k, T_AVXVNNI, q45k_dot_body, 1, lane_dot_avxvnni)
/* Q6_K stays on the tile here: the same scheme in place (s·dx as 8 lanes per block from a first pass) was
 * slower (one thread, weights in L2, m = 1: 19.7-20.2 GB/s against 20.6-21.7 through the tile). */
static const q8_dot_fn dir8_avx2[DTYPE_COUNT] = {
    [DTYPE_Q4_K] = dir8_avx2_q4_k, [DTYPE_Q5_K] = dir8_avx2_q5_k};
static const q8_dot_fn dir8_avxvnni[DTYPE_COUNT] = {
    [DTYPE_Q4_K] = dir8_avxvnni_q4_k, [DTYPE_Q5_K] = dir8_avxvnni_q5_k};

/* int8 arithmetic, Q8_0, one row of x, on AVX2 and AVX-VNNI hosts: each weight row of the range read whole,
 * block after block, so a thread reads one sequential stream (llama.cpp's vec_dot order) where the tile reads
 * NRQ rows a chunk at a time. The f32 steps are q8_dot_body's Q8M_SIGNED ones (per block fma(lanes, s·dx,
 * acc) with the same lane sums and the same s·dx product) and q8_task's hsum8, so the results are bitwise the
 * tile's (matmul/q8_0_int8_small_m_equals_tile). */
__attribute__((target(T_AVX2))) static void q8_0_rows_avx2(const struct q8x *x, const uint8_t *w,
                                                           size_t row_bytes, int j_lo, int j_hi, float *y)
{
    for (int j = j_lo; j < j_hi; j++) {
        const uint8_t *bp = w + (size_t)j * row_bytes;
        __m256 acc = _mm256_setzero_ps();
        for (int b = 0; b < x->nb; b++, bp += sizeof(struct block_q8_0)) {
            uint16_t h;
            memcpy(&h, bp, 2);
            const __m256 sv = _mm256_set1_ps(_cvtsh_ss(h));
            const __m256i q = _mm256_loadu_si256((const __m256i *)(bp + 2));
            const __m256i xv = _mm256_loadu_si256((const __m256i *)(x->q + (size_t)QB * b));
            const __m256i l =
                lane_dot_avx2(_mm256_setzero_si256(), _mm256_abs_epi8(q), _mm256_sign_epi8(xv, q));
            const __m256 sd = _mm256_mul_ps(sv, _mm256_broadcast_ss(x->dx + b));
            acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(l), sd, acc);
        }
        float av[8];
        _mm256_storeu_ps(av, acc);
        y[j] = hsum8(av);
    }
}

/* The two 8-lane halves of a 512-bit register, and back (AVX512F only: the f32x8 forms need AVX512DQ). */
static inline __attribute__((always_inline, target(T_VNNI512))) __m512 pair_ps(__m256 lo, __m256 hi)
{
    return _mm512_castpd_ps(
        _mm512_insertf64x4(_mm512_castps_pd(_mm512_castps256_ps512(lo)), _mm256_castps_pd(hi), 1));
}
static inline __attribute__((always_inline, target(T_VNNI512))) __m256 high_ps(__m512 v)
{
    return _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1));
}

/* q8_dot_body's arithmetic with two blocks per 512-bit dot product, conversion and scale product (lanes 0-7
 * block b, 8-15 block b + 1), then the two 8-lane multiply-adds in block order: every lane's operations are
 * q8_dot_body's, so the sums are bitwise equal (modes with one scale per 32 elements). */
static inline __attribute__((always_inline, target(T_VNNI512))) void
q8_dot_body512(const struct q8_dot *a, const int mr, const enum q8_mode mode, int sh)
{
    const struct q8_tile *t = a->t;
    const int8_t *xq[MRQ];
    const int32_t *n4[MRQ];
    const float *dx[MRQ];
    __m256 acc[MRQ][NRQ];
    q8_dot_rows(a, mr, xq, n4, dx, acc);
    const __m128i shv = _mm_cvtsi32_si128(sh);
    int b = 0;
    for (; b + 1 < a->nb; b += 2) {
        const int gb = a->b0 + b;
        __m512i xv[MRQ], cv[MRQ];
        __m512 dxv[MRQ];
        for (int i = 0; i < mr; i++) {
            xv[i] = _mm512_loadu_si512((const void *)(xq[i] + (size_t)QB * gb));
            cv[i] = mode == Q8M_OFF
                        ? _mm512_sll_epi32(_mm512_loadu_si512((const void *)(n4[i] + 8 * gb)), shv)
                        : _mm512_setzero_si512();
            dxv[i] = pair_ps(_mm256_set1_ps(dx[i][gb]), _mm256_set1_ps(dx[i][gb + 1]));
        }
        for (int j = 0; j < NRQ; j++) {
            const __m512i uv = _mm512_load_si512((const void *)(t->u[j] + QB * b));
            const __m512 sv = pair_ps(_mm256_set1_ps(t->s[j][b]), _mm256_set1_ps(t->s[j][b + 1]));
            for (int i = 0; i < mr; i++) {
                const __m512 l = _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(cv[i], uv, xv[i]));
                const __m512 sd = _mm512_mul_ps(sv, dxv[i]);
                acc[i][j] = _mm256_fmadd_ps(_mm512_castps512_ps256(l), _mm512_castps512_ps256(sd), acc[i][j]);
                acc[i][j] = _mm256_fmadd_ps(high_ps(l), high_ps(sd), acc[i][j]);
            }
        }
    }
    for (; b < a->nb; b++) { /* an odd last block: q8_dot_body's step */
        const int gb = a->b0 + b;
        for (int j = 0; j < NRQ; j++) {
            const __m256i uv = _mm256_load_si256((const __m256i *)(t->u[j] + QB * b));
            const __m256 sv = _mm256_broadcast_ss(&t->s[j][b]);
            for (int i = 0; i < mr; i++) {
                const __m256i xv = _mm256_loadu_si256((const __m256i *)(xq[i] + (size_t)QB * gb));
                const __m256i cv =
                    mode == Q8M_OFF
                        ? _mm256_sll_epi32(_mm256_loadu_si256((const __m256i *)(n4[i] + 8 * gb)), shv)
                        : _mm256_setzero_si256();
                const __m256i l = _mm256_dpbusd_epi32(cv, uv, xv);
                const __m256 sd = _mm256_mul_ps(sv, _mm256_broadcast_ss(dx[i] + gb));
                acc[i][j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(l), sd, acc[i][j]);
            }
        }
    }
    for (int i = 0; i < mr; i++)
        for (int j = 0; j < NRQ; j++) _mm256_storeu_ps(a->acc + (i * NRQ + j) * 16, acc[i][j]);
    if (mode == Q8M_AFFINE) q8_min_terms(a, mr);
}

#define Q8_CASE512(mode, mr)                                                                                 \
    case (mode)*8 + (mr):                                                                                    \
        q8_dot_body512(a, mr, mode, sh);                                                                     \
        return;
#define Q8_CASES512(mode) Q8_CASE512(mode, 1) Q8_CASE512(mode, 2) Q8_CASE512(mode, 3) Q8_CASE512(mode, 4)
__attribute__((target(T_VNNI512))) static void q8_dot_vnni512(const struct q8_dot *a, int mr,
                                                              enum q8_mode mode, int sh)
{
    switch (mode * 8 + mr) {
        Q8_CASES512(Q8M_OFF)
        Q8_CASES4(Q8M_OFF16, lane_dot_vnni512)
        Q8_CASES512(Q8M_AFFINE)
    }
}
__attribute__((target(T_AVX2))) static void q8_to_f32_avx2(const uint8_t *u, const float *s, const float *mn,
                                                           int kc, enum q8_mode mode, int sh, float *dst)
{
    const __m256 off = _mm256_set1_ps(mode == Q8M_AFFINE ? 0.0f : (float)(1 << sh));
    for (int e = 0; e < kc; e += 8) {
        const __m256 c = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(u + e))));
        const __m256 sc = _mm256_broadcast_ss(mode == Q8M_OFF16 ? &s[e / 16] : &s[e / QB]);
        _mm256_storeu_ps(dst + e, mode == Q8M_AFFINE
                                      ? _mm256_fmadd_ps(sc, c, _mm256_broadcast_ss(&mn[e / QB]))
                                      : _mm256_mul_ps(sc, _mm256_sub_ps(c, off)));
    }
}

/* The f32 arithmetic's per-block terms m'·Σx (8 blocks per vector), after a chunk's blocks. */
static inline __attribute__((always_inline, target(T_AVX2))) void
f32_macc_avx2(const struct q8_dot *a, const int mr, const enum q8_mode mode, int sh)
{
    const __m256 moff = _mm256_set1_ps(-(float)(1 << sh));
    for (int i = 0; i < mr; i++) {
        const float *sx = a->x->sxd + (size_t)(a->i0 + i) * a->x->nbp + a->b0;
        for (int j = 0; j < NRQ; j++) {
            float *mp = a->macc + (i * NRQ + j) * 8;
            __m256 m = a->first ? _mm256_setzero_ps() : _mm256_loadu_ps(mp);
            for (int g = 0; g < a->nb; g += 8) {
                const __m256 mv = mode == Q8M_AFFINE ? _mm256_loadu_ps(&a->t->mn[j][g])
                                                     : _mm256_mul_ps(moff, _mm256_loadu_ps(&a->t->s[j][g]));
                m = _mm256_fmadd_ps(mv, _mm256_loadu_ps(sx + g), m);
            }
            _mm256_storeu_ps(mp, m);
        }
    }
}

/* f32_dot_c's arithmetic in 8-lane vectors: lanes 0-7 (A: elements 0-7 and 16-23) and 8-15 (B: 8-15, 24-31).
 */
static inline __attribute__((always_inline, target(T_AVX2))) void
f32_dot_body(const struct q8_dot *a, const int mr, const enum q8_mode mode, int sh)
{
    const struct q8_tile *t = a->t;
    const float *xr[MRQ];
    __m256 acc[MRQ][NRQ][2];
    for (int i = 0; i < mr; i++) {
        xr[i] = a->xf + (size_t)(a->i0 + i) * a->k;
        for (int j = 0; j < NRQ; j++)
            for (int h = 0; h < 2; h++)
                acc[i][j][h] =
                    a->first ? _mm256_setzero_ps() : _mm256_loadu_ps(a->acc + (i * NRQ + j) * 16 + 8 * h);
    }
    const __m256 coff = _mm256_set1_ps(f32_conv_off(mode, sh));
    for (int b = 0; b < a->nb; b++) {
        const int gb = a->b0 + b;
        for (int j = 0; j < NRQ; j++) {
            __m256 c[4];
            for (int v = 0; v < 4; v++) {
                c[v] = _mm256_cvtepi32_ps(
                    _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(t->u[j] + QB * b + 8 * v))));
                if (mode == Q8M_OFF16 || sh == 7) c[v] = _mm256_sub_ps(c[v], coff);
            }
            for (int i = 0; i < mr; i++) {
                const float *xb = xr[i] + (size_t)QB * gb;
                if (mode == Q8M_OFF16) {
                    const __m256 sa = _mm256_broadcast_ss(&t->s[j][2 * b]),
                                 sb = _mm256_broadcast_ss(&t->s[j][2 * b + 1]);
                    acc[i][j][0] =
                        _mm256_fmadd_ps(sa, _mm256_mul_ps(c[0], _mm256_loadu_ps(xb)), acc[i][j][0]);
                    acc[i][j][1] =
                        _mm256_fmadd_ps(sa, _mm256_mul_ps(c[1], _mm256_loadu_ps(xb + 8)), acc[i][j][1]);
                    acc[i][j][0] =
                        _mm256_fmadd_ps(sb, _mm256_mul_ps(c[2], _mm256_loadu_ps(xb + 16)), acc[i][j][0]);
                    acc[i][j][1] =
                        _mm256_fmadd_ps(sb, _mm256_mul_ps(c[3], _mm256_loadu_ps(xb + 24)), acc[i][j][1]);
                } else {
                    const __m256 sv = _mm256_broadcast_ss(&t->s[j][b]);
                    const __m256 ta = _mm256_fmadd_ps(c[2], _mm256_loadu_ps(xb + 16),
                                                      _mm256_mul_ps(c[0], _mm256_loadu_ps(xb)));
                    const __m256 tb = _mm256_fmadd_ps(c[3], _mm256_loadu_ps(xb + 24),
                                                      _mm256_mul_ps(c[1], _mm256_loadu_ps(xb + 8)));
                    acc[i][j][0] = _mm256_fmadd_ps(sv, ta, acc[i][j][0]);
                    acc[i][j][1] = _mm256_fmadd_ps(sv, tb, acc[i][j][1]);
                }
            }
        }
    }
    for (int i = 0; i < mr; i++)
        for (int j = 0; j < NRQ; j++)
            for (int h = 0; h < 2; h++) _mm256_storeu_ps(a->acc + (i * NRQ + j) * 16 + 8 * h, acc[i][j][h]);
    if (f32_uses_macc(mode, sh)) f32_macc_avx2(a, mr, mode, sh);
}

#define F32_CASE(mode, mr)                                                                                   \
    case (mode)*8 + (mr):                                                                                    \
        f32_dot_body(a, mr, mode, sh);                                                                       \
        return;
__attribute__((target(T_AVX2))) static void f32_dot_avx2(const struct q8_dot *a, int mr, enum q8_mode mode,
                                                         int sh)
{
    switch (mode * 8 + mr) {
        F32_CASE(Q8M_OFF, 1)
        F32_CASE(Q8M_OFF16, 1)
        F32_CASE(Q8M_AFFINE, 1)
    }
}

/* The 32-element types' codes as f32, straight from the weights (AVX-512): the values the tile path converts
 * (Q8_0's code - 128 is its int8 quant), the block's scale and, with a minimum, the minimum. */
typedef void (*src512_fn)(const uint8_t *row, int b, __m512 *c0, __m512 *c1, float *s, float *mn);
#define AI_512 __attribute__((always_inline, target(T_VNNI512)))
static inline AI_512 void src512_q8_0(const uint8_t *row, int b, __m512 *c0, __m512 *c1, float *s, float *mn)
{
    (void)mn;
    const uint8_t *bl = row + 34 * (size_t)b;
    uint16_t d;
    memcpy(&d, bl, 2);
    *s = _cvtsh_ss(d);
    *c0 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(bl + 2))));
    *c1 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(bl + 18))));
}
static inline AI_512 void src512_q4(const uint8_t *row, int b, __m512 *c0, __m512 *c1, float *s, float *mn,
                                    size_t bsz, int qoff, int with_min)
{
    const uint8_t *bl = row + bsz * (size_t)b;
    uint16_t h[2];
    memcpy(h, bl, 4);
    *s = _cvtsh_ss(h[0]);
    if (with_min) *mn = _cvtsh_ss(h[1]);
    const __m512i q = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(bl + qoff)));
    const __m512i lo = _mm512_and_si512(q, _mm512_set1_epi32(15)), hi = _mm512_srli_epi32(q, 4);
    *c0 = _mm512_cvtepi32_ps(lo);
    *c1 = _mm512_cvtepi32_ps(hi);
}
static inline AI_512 void src512_q4_0(const uint8_t *row, int b, __m512 *c0, __m512 *c1, float *s, float *mn)
{
    src512_q4(row, b, c0, c1, s, mn, sizeof(struct block_q4_0), 2, 0);
}
static inline AI_512 void src512_q4_1(const uint8_t *row, int b, __m512 *c0, __m512 *c1, float *s, float *mn)
{
    src512_q4(row, b, c0, c1, s, mn, sizeof(struct block_q4_1), 4, 1);
}
/* f32_dot_c's arithmetic with AVX-512: one 16-lane register per (x row, weight row) holds lanes A and B in
 * the same order, so the sums are bitwise those of the 8-lane kernels, with half the instructions. */
static inline __attribute__((always_inline, target(T_VNNI512))) void
f32_dot_body512(const struct q8_dot *a, const int mr, const enum q8_mode mode, int sh, src512_fn src)
{
    struct q8_tile *t = a->t;
    const float *xr[MRQ];
    __m512 acc[MRQ][NRQ];
    for (int i = 0; i < mr; i++) {
        xr[i] = a->xf + (size_t)(a->i0 + i) * a->k;
        for (int j = 0; j < NRQ; j++)
            acc[i][j] = a->first ? _mm512_setzero_ps() : _mm512_loadu_ps(a->acc + (i * NRQ + j) * 16);
    }
    const __m512 coff = _mm512_set1_ps(f32_conv_off(mode, sh));
    for (int b = 0; b < a->nb; b++) {
        const int gb = a->b0 + b;
        __m512 x0[MRQ], x1[MRQ];
        for (int i = 0; i < mr; i++) {
            x0[i] = _mm512_loadu_ps(xr[i] + QB * gb);
            x1[i] = _mm512_loadu_ps(xr[i] + QB * gb + 16);
        }
        for (int j = 0; j < NRQ; j++) {
            __m512 c0, c1;
            if (src) { /* the same values straight from the weight row; its scale (and minimum) to the tile */
                src(a->row[j], gb, &c0, &c1, &t->s[j][b], &t->mn[j][b]);
            } else {
                c0 = _mm512_cvtepi32_ps(
                    _mm512_cvtepu8_epi32(_mm_load_si128((const __m128i *)(t->u[j] + QB * b))));
                c1 = _mm512_cvtepi32_ps(
                    _mm512_cvtepu8_epi32(_mm_load_si128((const __m128i *)(t->u[j] + QB * b + 16))));
                if (mode == Q8M_OFF16 || sh == 7) c0 = _mm512_sub_ps(c0, coff), c1 = _mm512_sub_ps(c1, coff);
            }
            for (int i = 0; i < mr; i++) {
                if (mode == Q8M_OFF16) {
                    acc[i][j] =
                        _mm512_fmadd_ps(_mm512_set1_ps(t->s[j][2 * b]), _mm512_mul_ps(c0, x0[i]), acc[i][j]);
                    acc[i][j] = _mm512_fmadd_ps(_mm512_set1_ps(t->s[j][2 * b + 1]), _mm512_mul_ps(c1, x1[i]),
                                                acc[i][j]);
                } else {
                    const __m512 tt = _mm512_fmadd_ps(c1, x1[i], _mm512_mul_ps(c0, x0[i]));
                    acc[i][j] = _mm512_fmadd_ps(_mm512_set1_ps(t->s[j][b]), tt, acc[i][j]);
                }
            }
        }
    }
    for (int i = 0; i < mr; i++)
        for (int j = 0; j < NRQ; j++) _mm512_storeu_ps(a->acc + (i * NRQ + j) * 16, acc[i][j]);
    if (f32_uses_macc(mode, sh)) f32_macc_avx2(a, mr, mode, sh);
}

#define F32_CASE512(mode, mr)                                                                                \
    case (mode)*8 + (mr):                                                                                    \
        f32_dot_body512(a, mr, mode, sh, NULL);                                                              \
        return;
#define F32_CASES512(mode) F32_CASE512(mode, 1) F32_CASE512(mode, 2) F32_CASE512(mode, 3) F32_CASE512(mode, 4)
__attribute__((target(T_VNNI512))) static void f32_dot_avx512(const struct q8_dot *a, int mr,
                                                              enum q8_mode mode, int sh)
{
    switch (mode * 8 + mr) {
        F32_CASES512(Q8M_OFF)
        F32_CASES512(Q8M_OFF16)
        F32_CASES512(Q8M_AFFINE)
    }
}

/* f32 arithmetic, 32-element types, m <= MR on AVX-512: codes read in place (no decode pass, no tile). */
#define DIR_CASE(n, mode, type)                                                                              \
    case n:                                                                                                  \
        f32_dot_body512(a, n, mode, sh, src512_##type);                                                      \
        return;
#define DIR_FN(type, mode)                                                                                   \
    __attribute__((target(T_VNNI512))) static void dir512_##type(const struct q8_dot *a, int mr,             \
                                                                 enum q8_mode m_, int sh)                    \
    {                                                                                                        \
        (void)m_;                                                                                            \
        switch (mr) {                                                                                        \
            DIR_CASE(1, mode, type) DIR_CASE(2, mode, type) DIR_CASE(3, mode, type) DIR_CASE(4, mode, type)  \
        }                                                                                                    \
    }
DIR_FN(q8_0, Q8M_OFF)
DIR_FN(q4_0, Q8M_OFF)
DIR_FN(q4_1, Q8M_AFFINE)
/* Q5_0/Q5_1 stay on the tile: their fifth bits by variable shifts made them slower in place (hot L2, m=1:
 * 6.0-6.8 GB/s against 8.6-9.2 through the tile). */
static const q8_dot_fn dir512[DTYPE_COUNT] = {
    [DTYPE_Q8_0] = dir512_q8_0, [DTYPE_Q4_0] = dir512_q4_0, [DTYPE_Q4_1] = dir512_q4_1};

/* int8 arithmetic, Q4_K and Q5_K, m <= Q8_DIRECT_M on AVX512-VNNI: the nibbles (and Q5_K's fifth bits) are
 * read in place (no decode pass, no tile) with two weight rows per 512-bit register (lanes 0-7 row j, 8-15
 * row j + 1; each half holds one block's 8 lanes), the scales and minimums unpacked once per super-block and
 * multiplied by dx 8 blocks at a time. Every lane takes the integer sum and the f32 steps of q8_dot_body512
 * and q8_min_terms in their order (per block fma(lanes, s·dx, acc); per super-block fma(mn, sxd, macc)), so
 * the results are bitwise equal.
 * Saved: the decode pass, the tile's stores and loads, the per-block scale broadcasts (one thread, weights in
 * L2: 1.7x the tile path's rate; kernels/cpu/NOTES.md, session 14). */
static inline AI_512 __m512 dup_ps(__m256 v)
{
    return pair_ps(v, v);
}

/* q45k_scales for the super-blocks at pa and pb at once: s and mn hold pa's 8 values in lanes 0-7 and pb's in
 * 8-15 (the same products, so the same bits), the 6-bit fields unpacked by byte shuffles. */
static inline AI_512 void q45k_scales2(const uint8_t *pa, const uint8_t *pb, __m512 *s, __m512 *mn)
{
    /* Per 128-bit lane (one super-block): bytes 0-1 d, 2-3 dmin, 4 + t the packed byte t. Sub-block i's scale
     * is t_i & 63 (i < 4) or (t_{i+4} & 15) | (t_{i-4} >> 6) << 4, its minimum t_{i+4} & 63 or
     * (t_{i+4} >> 4) | (t_i >> 6) << 4: bytes 0-7 of r the scales, 8-15 the minimums. */
    const __m256i v = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)pa)),
                                              _mm_loadu_si128((const __m128i *)pb), 1);
    const __m256i i1 =
        _mm256_broadcastsi128_si256(_mm_setr_epi8(4, 5, 6, 7, 12, 13, 14, 15, 8, 9, 10, 11, 12, 13, 14, 15));
    const __m256i i2 =
        _mm256_broadcastsi128_si256(_mm_setr_epi8(-1, -1, -1, -1, 4, 5, 6, 7, -1, -1, -1, -1, 8, 9, 10, 11));
    const __m256i ma = _mm256_broadcastsi128_si256(_mm_setr_epi32(0x3f3f3f3f, 0x0f0f0f0f, 0x3f3f3f3f, 0));
    const __m256i mb = _mm256_broadcastsi128_si256(_mm_setr_epi32(0, 0, 0, 0x0f0f0f0f));
    const __m256i t1 = _mm256_shuffle_epi8(v, i1), t2 = _mm256_shuffle_epi8(v, i2);
    const __m256i r = _mm256_or_si256(
        _mm256_or_si256(_mm256_and_si256(t1, ma), _mm256_and_si256(_mm256_srli_epi16(t1, 4), mb)),
        _mm256_and_si256(_mm256_srli_epi16(t2, 2), _mm256_set1_epi8(0x30)));
    const __m256i q = _mm256_permute4x64_epi64(r, 0xd8); /* scales a, scales b, minimums a, minimums b */
    const __m512 scf = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm256_castsi256_si128(q)));
    const __m512 mif = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm256_extracti128_si256(q, 1)));
    const __m256i id = _mm256_setr_epi16(0, 0, 0, 0, 0, 0, 0, 0, 8, 8, 8, 8, 8, 8, 8, 8);
    const __m512 d = _mm512_cvtph_ps(_mm256_permutexvar_epi16(id, v));
    const __m512 dmin =
        _mm512_cvtph_ps(_mm256_permutexvar_epi16(_mm256_add_epi16(id, _mm256_set1_epi16(1)), v));
    *s = _mm512_mul_ps(d, scf);
    *mn = _mm512_castsi512_ps(
        _mm512_xor_si512(_mm512_castps_si512(_mm512_mul_ps(dmin, mif)), _mm512_set1_epi32((int)0x80000000u)));
}

/* five: Q5_K, whose fifth bits (qh) are put on the nibbles as dec_q45k_avx2 does (bit i of qh[l] to bit 4
 * of block i's element l), so the codes and every sum that follows are the tile's. */
static inline AI_512 void q45k_dot_body512(const struct q8_dot *a, const int mr, const int five)
{
    const struct q8x *x = a->x;
    const int8_t *xq[MRQ];
    const float *dx[MRQ], *sxd[MRQ];
    __m512 acc[MRQ][NRQ / 2], macc[MRQ][NRQ / 2]; /* [i][p]: weight rows 2p (lanes 0-7) and 2p + 1 */
    for (int i = 0; i < mr; i++) {
        const size_t r = (size_t)(a->i0 + i);
        xq[i] = x->q + r * x->k + (size_t)QB * a->b0;
        dx[i] = x->dx + r * x->nbp + a->b0;
        sxd[i] = x->sxd + r * x->nbp + a->b0;
        for (int p = 0; p < NRQ / 2; p++) {
            const float *ap = a->acc + (i * NRQ + 2 * p) * 16, *mp = a->macc + (i * NRQ + 2 * p) * 8;
            acc[i][p] =
                a->first ? _mm512_setzero_ps() : pair_ps(_mm256_loadu_ps(ap), _mm256_loadu_ps(ap + 16));
            macc[i][p] =
                a->first ? _mm512_setzero_ps() : pair_ps(_mm256_loadu_ps(mp), _mm256_loadu_ps(mp + 8));
        }
    }
    const __m512i m0f = _mm512_set1_epi8(15), b10 = _mm512_set1_epi8(16);
    const size_t bsz = five ? sizeof(struct block_q5_k) : sizeof(struct block_q4_k);
    const size_t qs_off = five ? offsetof(struct block_q5_k, qs) : offsetof(struct block_q4_k, qs);
    const size_t qh_off = offsetof(struct block_q5_k, qh);
    for (int sb = 0; sb < a->nb / 8; sb++) {
        const size_t off = (size_t)(a->b0 / 8 + sb) * bsz;
        __m512i qh[NRQ / 2]; /* Q5_K: qh of rows 2p (bytes 0-31) and 2p + 1 */
        for (int p = 0; p < NRQ / 2 && five; p++)
            qh[p] = _mm512_inserti64x4(
                _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(a->row[2 * p] + off + qh_off))),
                _mm256_loadu_si256((const __m256i *)(a->row[2 * p + 1] + off + qh_off)), 1);
        __m512 sd[MRQ][NRQ / 2]; /* s·dx of the super-block's 8 blocks, rows 2p and 2p + 1 */
#pragma GCC unroll 2
        for (int p = 0; p < NRQ / 2; p++) {
            __m512 sp, mp;
            q45k_scales2(a->row[2 * p] + off, a->row[2 * p + 1] + off, &sp, &mp);
            for (int i = 0; i < mr; i++) {
                sd[i][p] = _mm512_mul_ps(sp, dup_ps(_mm256_loadu_ps(dx[i] + 8 * sb)));
                macc[i][p] = _mm512_fmadd_ps(mp, dup_ps(_mm256_loadu_ps(sxd[i] + 8 * sb)), macc[i][p]);
            }
        }
#pragma GCC unroll 4
        for (int h = 0; h < 4; h++) { /* 32 bytes of each row: blocks 2h (low nibbles) and 2h + 1 */
            __m512i u[NRQ / 2][2];
#pragma GCC unroll 2
            for (int p = 0; p < NRQ / 2; p++) {
                const uint8_t *w0 = a->row[2 * p] + off + qs_off, *w1 = a->row[2 * p + 1] + off + qs_off;
                const __m512i q = _mm512_inserti64x4(
                    _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(w0 + 32 * h))),
                    _mm256_loadu_si256((const __m256i *)(w1 + 32 * h)), 1);
                u[p][0] = _mm512_and_si512(q, m0f);
                u[p][1] = _mm512_and_si512(_mm512_srli_epi16(q, 4), m0f);
                if (five) { /* bits 2h and 2h + 1 of each qh byte to bit 4 (b10 keeps each byte's own bit) */
                    const __m512i hb = _mm512_srli_epi16(qh[p], 2 * h);
                    u[p][0] = _mm512_or_si512(u[p][0], _mm512_and_si512(_mm512_slli_epi16(hb, 4), b10));
                    u[p][1] = _mm512_or_si512(u[p][1], _mm512_and_si512(_mm512_slli_epi16(hb, 3), b10));
                }
            }
#pragma GCC unroll 2
            for (int e = 0; e < 2; e++) {
                const int b = 2 * h + e;
                const __m512i sel = _mm512_set_epi32(8 + b, 8 + b, 8 + b, 8 + b, 8 + b, 8 + b, 8 + b, 8 + b,
                                                     b, b, b, b, b, b, b, b);
                for (int i = 0; i < mr; i++) {
                    const __m512i xv = _mm512_broadcast_i64x4(
                        _mm256_loadu_si256((const __m256i *)(xq[i] + QK_K * sb + QB * b)));
#pragma GCC unroll 2
                    for (int p = 0; p < NRQ / 2; p++) {
                        const __m512 l =
                            _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(_mm512_setzero_si512(), u[p][e], xv));
                        acc[i][p] = _mm512_fmadd_ps(l, _mm512_permutexvar_ps(sel, sd[i][p]), acc[i][p]);
                    }
                }
            }
        }
    }
    for (int i = 0; i < mr; i++)
        for (int p = 0; p < NRQ / 2; p++) {
            float *ap = a->acc + (i * NRQ + 2 * p) * 16, *mp = a->macc + (i * NRQ + 2 * p) * 8;
            _mm256_storeu_ps(ap, _mm512_castps512_ps256(acc[i][p]));
            _mm256_storeu_ps(ap + 16, high_ps(acc[i][p]));
            _mm256_storeu_ps(mp, _mm512_castps512_ps256(macc[i][p]));
            _mm256_storeu_ps(mp + 8, high_ps(macc[i][p]));
        }
}

/* int8 arithmetic, Q6_K, m <= Q8_DIRECT_M on AVX512-VNNI: q45k_dot_body512's scheme for Q6_K's codes (the low
 * bits of ql and the two of qh put together as dec_q6k_avx2 does), the offset -32 through the lanes' sums of
 * x (n4·32 starts each dot product) and a scale per 16 elements (lanes 0-3 and 4-7 of a block): the integer
 * sums and the f32 steps of q8_dot_body's Q8M_OFF16 (s·dx, then fma(lanes, s·dx, acc) block by block), so
 * the results are bitwise equal. */
static inline AI_512 void q6k_dot_body512(const struct q8_dot *a, const int mr)
{
    const struct q8x *x = a->x;
    const int8_t *xq[MRQ];
    const int32_t *n4[MRQ];
    const float *dx[MRQ];
    __m512 acc[MRQ][NRQ / 2]; /* [i][p]: weight rows 2p (lanes 0-7) and 2p + 1 */
    for (int i = 0; i < mr; i++) {
        const size_t r = (size_t)(a->i0 + i);
        xq[i] = x->q + r * x->k + (size_t)QB * a->b0;
        n4[i] = x->n4 + (r * x->nb + a->b0) * 8;
        dx[i] = x->dx + r * x->nbp + a->b0;
        for (int p = 0; p < NRQ / 2; p++) {
            const float *ap = a->acc + (i * NRQ + 2 * p) * 16;
            acc[i][p] =
                a->first ? _mm512_setzero_ps() : pair_ps(_mm256_loadu_ps(ap), _mm256_loadu_ps(ap + 16));
        }
    }
    const __m512i m0f = _mm512_set1_epi8(15), m30 = _mm512_set1_epi8(0x30);
    const __m512i dup2 = _mm512_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);
    for (int sb = 0; sb < a->nb / 8; sb++) {
        const struct block_q6_k *bl[NRQ];
        __m512 sdx[MRQ][NRQ]; /* s·dx for the 16 scales of each row (scale t: block t/2's dx) */
        for (int j = 0; j < NRQ; j++) {
            bl[j] = (const struct block_q6_k *)a->row[j] + a->b0 / 8 + sb;
            const __m512 s16 = _mm512_mul_ps(
                _mm512_set1_ps(_cvtsh_ss(bl[j]->d)),
                _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)bl[j]->scales))));
            for (int i = 0; i < mr; i++)
                sdx[i][j] = _mm512_mul_ps(
                    s16,
                    _mm512_permutexvar_ps(dup2, _mm512_castps256_ps512(_mm256_loadu_ps(dx[i] + 8 * sb))));
        }
#pragma GCC unroll 2
        for (int h = 0; h < 2; h++) { /* elements 128h .. 128h + 127: blocks 4h + g */
            __m512i xv[MRQ][4], cv[MRQ][4];
            for (int i = 0; i < mr; i++)
                for (int g = 0; g < 4; g++) {
                    const int b = 8 * sb + 4 * h + g;
                    xv[i][g] = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(xq[i] + QB * b)));
                    cv[i][g] = _mm512_slli_epi32(
                        _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(n4[i] + 8 * b))), 5);
                }
#pragma GCC unroll 2
            for (int p = 0; p < NRQ / 2; p++) {
                const struct block_q6_k *b0 = bl[2 * p], *b1 = bl[2 * p + 1];
#define PAIR256(f, o)                                                                                        \
    _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(b0->f + (o)))),           \
                       _mm256_loadu_si256((const __m256i *)(b1->f + (o))), 1)
                const __m512i l0 = PAIR256(ql, 64 * h), l1 = PAIR256(ql, 64 * h + 32),
                              qh = PAIR256(qh, 32 * h);
#undef PAIR256
                const __m512i u[4] = {_mm512_or_si512(_mm512_and_si512(l0, m0f),
                                                      _mm512_and_si512(_mm512_slli_epi16(qh, 4), m30)),
                                      _mm512_or_si512(_mm512_and_si512(l1, m0f),
                                                      _mm512_and_si512(_mm512_slli_epi16(qh, 2), m30)),
                                      _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(l0, 4), m0f),
                                                      _mm512_and_si512(qh, m30)),
                                      _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(l1, 4), m0f),
                                                      _mm512_and_si512(_mm512_srli_epi16(qh, 2), m30))};
#pragma GCC unroll 4
                for (int g = 0; g < 4; g++) {
                    const int t = 2 * (4 * h + g); /* the block's first scale */
                    const __m512i sel =
                        _mm512_setr_epi32(t, t, t, t, t + 1, t + 1, t + 1, t + 1, 16 + t, 16 + t, 16 + t,
                                          16 + t, 17 + t, 17 + t, 17 + t, 17 + t);
                    for (int i = 0; i < mr; i++) {
                        const __m512 l = _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(cv[i][g], u[g], xv[i][g]));
                        const __m512 sd = _mm512_permutex2var_ps(sdx[i][2 * p], sel, sdx[i][2 * p + 1]);
                        acc[i][p] = _mm512_fmadd_ps(l, sd, acc[i][p]);
                    }
                }
            }
        }
    }
    for (int i = 0; i < mr; i++)
        for (int p = 0; p < NRQ / 2; p++) {
            float *ap = a->acc + (i * NRQ + 2 * p) * 16;
            _mm256_storeu_ps(ap, _mm512_castps512_ps256(acc[i][p]));
            _mm256_storeu_ps(ap + 16, high_ps(acc[i][p]));
        }
}

__attribute__((target(T_VNNI512))) static void dir8_512_q6_k(const struct q8_dot *a, int mr, enum q8_mode m_,
                                                             int sh)
{
    (void)m_, (void)sh;
    if (mr == 1)
        q6k_dot_body512(a, 1);
    else
        q6k_dot_body512(a, 2);
}
__attribute__((target(T_VNNI512))) static void dir8_512_q4_k(const struct q8_dot *a, int mr, enum q8_mode m_,
                                                             int sh)
{
    (void)m_, (void)sh;
    if (mr == 1)
        q45k_dot_body512(a, 1, 0);
    else
        q45k_dot_body512(a, 2, 0);
}
__attribute__((target(T_VNNI512))) static void dir8_512_q5_k(const struct q8_dot *a, int mr, enum q8_mode m_,
                                                             int sh)
{
    (void)m_, (void)sh;
    if (mr == 1)
        q45k_dot_body512(a, 1, 1);
    else
        q45k_dot_body512(a, 2, 1);
}
static const q8_dot_fn dir8_512[DTYPE_COUNT] = {
    [DTYPE_Q4_K] = dir8_512_q4_k, [DTYPE_Q5_K] = dir8_512_q5_k, [DTYPE_Q6_K] = dir8_512_q6_k};
#endif /* MM_X86 */

/* ---- the types and the instruction sets ------------------------------------------------------------------
 */

/* A quantized type's decoding: codes carry the offset 2^sh (0: none), the mode, and its decoders. */
struct q8_kind {
    int sh;
    enum q8_mode mode;
    q8_dec_fn dec[2]; /* portable, AVX2 */
};

#ifdef MM_X86
#define DECS(name)                                                                                           \
    {                                                                                                        \
        dec_##name##_c, dec_##name##_avx2                                                                    \
    }
#else
#define DECS(name)                                                                                           \
    {                                                                                                        \
        dec_##name##_c, NULL                                                                                 \
    }
#endif
static const struct q8_kind q8_kinds[DTYPE_COUNT] = {
    [DTYPE_Q8_0] = {7, Q8M_OFF, DECS(q8_0)},    [DTYPE_Q4_0] = {3, Q8M_OFF, DECS(q4_0)},
    [DTYPE_Q4_1] = {0, Q8M_AFFINE, DECS(q4_1)}, [DTYPE_Q5_0] = {4, Q8M_OFF, DECS(q5_0)},
    [DTYPE_Q5_1] = {0, Q8M_AFFINE, DECS(q5_1)}, [DTYPE_Q4_K] = {0, Q8M_AFFINE, DECS(q4_k)},
    [DTYPE_Q5_K] = {0, Q8M_AFFINE, DECS(q5_k)}, [DTYPE_Q6_K] = {5, Q8M_OFF16, DECS(q6k)},
};

/* An instruction set's kernels: decoders (AVX2 or portable), x quantizer, and the dot kernels of both
 * arithmetics with the x rows each takes per call. */
struct q8_isa {
    const char *name;
    int avx2;
    q8_xrow_fn xrow;
    q8_dot_fn dot[KERN_CPU_ACT_COUNT];
    int mr[KERN_CPU_ACT_COUNT];
    q8_f32_fn to_f32;        /* f32 arithmetic past MR rows: codes to the f32 tile */
    const q8_dot_fn *direct; /* f32 arithmetic, m <= the f32 rows per call: kernels reading codes in place */
    const q8_dot_fn *direct8; /* int8 arithmetic, m <= Q8_DIRECT_M: the same, where a type has one */
    q8_rows_fn rows8_q8_0;    /* int8 arithmetic, Q8_0, m = 1: whole rows (NULL: the tile) */
};

static const struct q8_isa q8_isas[KERN_CPU_ISA_COUNT] = {
    [KERN_CPU_ISA_PORTABLE] =
        {"portable", 0, q8x_row_c, {f32_dot_c, q8_dot_c}, {MRQ, MRQ}, q8_to_f32_c, NULL, NULL, NULL},
#ifdef MM_X86
    [KERN_CPU_ISA_AVX2] = {"avx2",
                           1,
                           q8x_row_avx2,
                           {f32_dot_avx2, q8_dot_avx2},
                           {1, 2},
                           q8_to_f32_avx2,
                           NULL,
                           dir8_avx2,
                           q8_0_rows_avx2},
    [KERN_CPU_ISA_AVXVNNI] = {"avx-vnni",
                              1,
                              q8x_row_avx2,
                              {f32_dot_avx2, q8_dot_avxvnni},
                              {1, 2},
                              q8_to_f32_avx2,
                              NULL,
                              dir8_avxvnni,
                              q8_0_rows_avx2},
    [KERN_CPU_ISA_AVX512VNNI] = {"avx512-vnni",
                                 1,
                                 q8x_row_avx2,
                                 {f32_dot_avx512, q8_dot_vnni512},
                                 {MRQ, MRQ},
                                 q8_to_f32_avx2,
                                 dir512,
                                 dir8_512,
                                 NULL},
#endif
};

#ifndef KERN_CPU_ACT_DEFAULT
#define KERN_CPU_ACT_DEFAULT KERN_CPU_ACT_F32
#endif
static int act_mode = KERN_CPU_ACT_DEFAULT;

void kern_cpu_matmul_set_act(enum kern_cpu_act act)
{
    if (act >= 0 && act < KERN_CPU_ACT_COUNT) __atomic_store_n(&act_mode, (int)act, __ATOMIC_RELAXED);
}

enum kern_cpu_act kern_cpu_matmul_act(void)
{
    return (enum kern_cpu_act)__atomic_load_n(&act_mode, __ATOMIC_RELAXED);
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
    return isa >= 0 && isa < KERN_CPU_ISA_COUNT && q8_isas[isa].name ? q8_isas[isa].name : "?";
}

int kern_cpu_isa_parse(const char *name)
{
    for (int isa = 0; isa < KERN_CPU_ISA_COUNT; isa++)
        if (!strcmp(kern_cpu_isa_name((enum kern_cpu_isa)isa), name)) return isa;
    return -1;
}

/* ---- x's scratch buffer: one per calling thread, grown to the largest product it has seen ---------------
 */

struct q8_scratch {
    void *p;
    size_t cap;
};
static pthread_key_t scratch_key;
static pthread_once_t scratch_once = PTHREAD_ONCE_INIT;
static int scratch_key_ok;

static void scratch_release(void *p)
{
    struct q8_scratch *s = p;
    free(s->p);
    free(s);
}
static void scratch_key_init(void)
{
    scratch_key_ok = pthread_key_create(&scratch_key, scratch_release) == 0;
}

/* At least bytes of 64-byte aligned memory owned by this thread, or NULL. */
static void *scratch_get(size_t bytes)
{
    pthread_once(&scratch_once, scratch_key_init);
    if (!scratch_key_ok) return NULL;
    struct q8_scratch *s = pthread_getspecific(scratch_key);
    if (!s) {
        s = calloc(1, sizeof *s);
        if (!s || pthread_setspecific(scratch_key, s) != 0) {
            free(s);
            return NULL;
        }
    }
    if (s->cap < bytes) {
        free(s->p);
        s->cap = 0;
        s->p = aligned_alloc(64, (bytes + 63) / 64 * 64);
        if (!s->p) return NULL;
        s->cap = bytes;
    }
    return s->p;
}

struct q8x_job {
    const float *x;
    struct q8x *xq;
    q8_xrow_fn xrow;
    int m, n_tasks;
};

static void q8x_task(void *arg, int t)
{
    const struct q8x_job *j = arg;
    const struct q8x *q = j->xq;
    for (int i = j->m * t / j->n_tasks; i < j->m * (t + 1) / j->n_tasks; i++)
        j->xrow(j->x + (size_t)i * q->k, q->k, q->q + (size_t)i * q->k, q->n4 + (size_t)i * q->nb * 8,
                q->dx + (size_t)i * q->nbp, q->sxd + (size_t)i * q->nbp, q->nbp);
}

/* Prepares x (m, k) in the calling thread's scratch: quantized (int8) or only its block sums (f32, in sxd);
 * k is a multiple of 32. */
static int q8x_prepare(struct q8x *xq, const float *x, int m, int k, const struct q8_isa *isa, int int8,
                       struct tpool *tp)
{
    const int nb = k / QB, nbp = (nb + 7) / 8 * 8;
    const size_t qb = int8 ? ((size_t)m * k + 63) / 64 * 64 : 0, n4b = int8 ? (size_t)m * nb * 32 : 0,
                 fb = (size_t)m * nbp * 4;
    uint8_t *p = scratch_get(qb + n4b + 2 * fb);
    if (!p) return FERRY_ERR_NOMEM;
    *xq = (struct q8x){.q = (int8_t *)p,
                       .n4 = (int32_t *)(p + qb),
                       .dx = (float *)(p + qb + n4b),
                       .sxd = (float *)(p + qb + n4b + fb),
                       .k = k,
                       .nb = nb,
                       .nbp = nbp};
    /* Spread over the pool when there is enough to spread (prefill); decode's one row stays on the caller. */
    const int n_tasks = (int64_t)m * k >= (1 << 16) ? (m < tpool_size(tp) ? m : tpool_size(tp)) : 1;
    struct q8x_job job = {.x = x, .xq = xq, .xrow = int8 ? isa->xrow : sx_row_c, .m = m, .n_tasks = n_tasks};
    if (n_tasks > 1)
        tpool_run(tp, q8x_task, &job, n_tasks);
    else
        q8x_task(&job, 0);
    return FERRY_OK;
}

/* ---- plain types on AMX tiles -------------------------------------------------------------------------- */

static enum kern_cpu_plain plain_arith = KERN_CPU_PLAIN_F32;

void kern_cpu_matmul_set_plain(enum kern_cpu_plain p)
{
    plain_arith = p;
}
enum kern_cpu_plain kern_cpu_matmul_plain(void)
{
    return plain_arith;
}

/* Whether a product of m rows goes to the tiles: bf16 chosen, m large enough, AMX here, some F16/BF16 job. */
int kern_cpu_amx_available(void)
{
    return amx_available();
}

static int amx_wanted(const struct kern_cpu_mm *jobs, int n_jobs, int m)
{
    if (plain_arith != KERN_CPU_PLAIN_BF16 || m < KERN_CPU_AMX_M_MIN || !amx_available()) return 0;
    for (int j = 0; j < n_jobs; j++)
        if (jobs[j].wt == DTYPE_F16 || jobs[j].wt == DTYPE_BF16) return 1;
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

static void q8_task(const struct mm_ctx *c, int j_lo, int j_hi)
{
    const int m = c->m, k = c->k, affine = c->qk->mode == Q8M_AFFINE;
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
                                       .first = c0 == 0};
                    memcpy(d.row, rows, sizeof rows);
                    (c->direct ? c->direct : c->dot)(&d, mr, c->qk->mode, c->qk->sh);
                }
            }
            for (int i = 0; i < mb; i++)
                for (int j = 0; j < nr; j++) {
                    const float *av = accb + ((size_t)i * NRQ + j) * 16,
                                *mv = maccb + ((size_t)i * NRQ + j) * 8;
                    float v;
                    if (c->int8) {
                        v = affine ? hsum8(av) + hsum8(mv) : hsum8(av);
                    } else { /* the two sets of 8 lanes, then the per-block terms */
                        float s8[8];
                        for (int l = 0; l < 8; l++) s8[l] = av[l] + av[8 + l];
                        v = f32_uses_macc(c->qk->mode, c->qk->sh) ? hsum8(s8) + hsum8(mv) : hsum8(s8);
                    }
                    c->y[(size_t)(i0m + i) * c->n + j0 + j] = v;
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
    return FERRY_OK;
}

static int is_quantized(enum dtype wt)
{
    return q8_kinds[wt].dec[0] != NULL;
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
                         .xp = wt == DTYPE_F16 || wt == DTYPE_BF16 ? xp : NULL};
    const int quant = is_quantized(wt), act = kern_cpu_matmul_act();
    if (quant) {
        c->qk = &q8_kinds[wt];
        c->xq = xq;
        c->dec = c->qk->dec[isa->avx2 && c->qk->dec[1] ? 1 : 0];
        c->int8 = act == KERN_CPU_ACT_INT8;
        c->dot = isa->dot[act];
        c->mrq = isa->mr[act];
        if (!c->int8 && m <= c->mrq && isa->direct) c->direct = isa->direct[wt];
        if (c->int8 && m <= Q8_DIRECT_M && isa->direct8) c->direct = isa->direct8[wt];
        /* (one row only: at m = 2 ferry bench decoded ~10% slower end to end than through the tile) */
        if (c->int8 && m == 1 && wt == DTYPE_Q8_0) c->rows = isa->rows8_q8_0;
        /* f32 arithmetic past MR rows: the plain f32 tile (two FMAs per 32 elements and pair, where the
         * factored kernel takes three) */
        if (!c->int8 && m > MR) c->to_f32 = isa->to_f32;
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
        if (m <= STREAM_M_MAX && !quant) {
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
     * outweigh that (kernels/cpu/NOTES.md, session 12). */
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
    int quantized = 0;
    for (int j = 0; j < n_jobs; j++) {
        int st = mm_check(jobs[j].y, x, jobs[j].w, jobs[j].wt, m, jobs[j].n, k);
        if (st) return st;
        quantized |= is_quantized(jobs[j].wt);
    }
    const struct q8_isa *isa = &q8_isas[kern_cpu_isa_current()];
    uint16_t *xp = NULL;
    if (amx_wanted(jobs, n_jobs, m)) {
        int st = amx_prepare(&xp, x, m, k, tp);
        if (st) return st;
    }
    struct q8x xq = {0};
    if (quantized) { /* every quantized type's k is a multiple of 32: one prepared x for all jobs */
        int st = q8x_prepare(&xq, x, m, k, isa, kern_cpu_matmul_act() == KERN_CPU_ACT_INT8, tp);
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
