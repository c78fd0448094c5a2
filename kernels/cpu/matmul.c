/* matmul — y (m, n) = x (m, k) · Wᵀ (+ bias) with W (n, k) in its stored type, f32 accumulation.
 *
 * Work: the n output rows are cut into contiguous ranges, one per pool thread (a static partition), walked in
 * groups of NR rows. Two regimes:
 *  - m > 2 (prefill, batches): k is walked in chunks of KC columns (the (m, KC) slice of x stays in L2); each
 *    group's (NR, KC) slice of W is dequantized/converted once into a small padded f32 stack tile (L1) and
 *    multiplied against all m rows of x, MR at a time, by a register-blocked MR x NR micro-kernel.
 *  - m <= 2 (decode): rows stream from memory once, decoded in registers (F16/BF16 conversion, block
 *    decoding of Q8_0/Q4_0/Q4_1/Q5_0/Q5_1, and of Q4_K/Q5_K/Q6_K with scales unpacked once per sub-block),
 *    whole rows. With AVX2 (or AVX-512) the quantized types have hand-written kernels (avx_q, avx512_q4,
 *    avx_q4k, avx_q6k): per block t = Σ q·x in f32, the scale applied once per block, affine parts (Q4_1/Q5_1
 *    m, Q4_0's -8, Q5_0's -16, Q4_K/Q5_K mins) through per-block sums of x; the Q5 fifth bits are shifted
 *    into place with variable shifts; the 32-element types take this path up to DIRECT_M_MAX rows of x.
 *    The weight rows are prefetched PF_AHEAD rows ahead into L2. Timings in kernels/cpu/NOTES.md.
 * Which kernels a type has is one table, cpu_wkernels, indexed by dtype (quant/dtype.h describes the types);
 * a type without an entry goes through the tile (quant's to_f32) at every m.
 * Every output element is the same sequence of f32 operations whatever the pool size (vector lanes are
 * reduced in a fixed order, chunk partial sums are added in k order, and the path depends only on m and the
 * dtype), so results are deterministic and even independent of the thread count.
 */
#include "kernels/cpu/matmul.h"

#include <stddef.h>
#include <string.h>

#include "quant/fp16.h"

/* Vector-returning static helpers are never called across an ABI boundary. */
#pragma GCC diagnostic ignored "-Wpsabi"
#include "kernels/core/status.h"
#include "kernels/cpu/threadpool.h"
#include "quant/blocks.h"

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

#define MR         4            /* rows of x per micro-kernel call */
#define NR         4            /* rows of W per tile */
#define KC_MAX     1024         /* columns per chunk: an (NR, KC_MAX) f32 tile is 16 KiB and stays in L1 */
#define TILE_PAD   16           /* floats added to the tile's row stride */
#define X_L2_BYTES (512 * 1024) /* budget for the (m, KC) slice of x */
/* Software prefetch for m <= 2, PF_AHEAD weight rows ahead of the row being read (two groups of NR): decode
 * reads short rows (k = 576: 360 bytes of Q4_1) four at a time, which the hardware prefetchers follow
 * poorly. SmolLM2-135M Q4_1 decode step 8.1-8.8 -> 5.4-6.1 ms (see kernels/cpu/NOTES.md). */
#define PF_AHEAD 8
/* Into L2 only: a T0 prefetch holds one of the few L1 miss buffers for the whole DRAM latency, which
 * capped Q8_0 at ~14 GB/s from DRAM with 2 threads (22-25 GB/s with T1; decode step 5.5-5.8 -> 4.8-5.3 ms).
 */
#define PF_HINT _MM_HINT_T1

/* Pins a value in a vector register: stops GCC from re-reading it from memory (as an FMA operand, or byte by
 * byte). */
#if defined(__x86_64__) && defined(__AVX512F__)
#define IN_REG(v) __asm__("" : "+v"(v))
#elif defined(__x86_64__) && defined(__AVX__)
#define IN_REG(v) __asm__("" : "+x"(v))
#else
#define IN_REG(v) ((void)0)
#endif

/* How the micro-kernel reads W: plain types convert in registers; the quantized kinds decode VL elements of a
 * block row in registers (used for m <= 2, where a dequantized tile would never be reused; K-quants have
 * their own loops below). */
enum wkind { WK_F32, WK_F16, WK_BF16, WK_Q8_0, WK_Q4_0, WK_Q4_1, WK_Q5_0, WK_Q5_1 };

typedef uint8_t vu8 __attribute__((vector_size(VL), aligned(1)));
typedef int32_t vi32 __attribute__((vector_size(VL * 4)));

static inline vf vf_from_u8(vu8 q)
{
    return __builtin_convertvector(__builtin_convertvector(q, vi32), vf);
}

/* 16 * bit l of bits, in lane l (the fifth bits of VL consecutive Q5_0/Q5_1 elements). */
static inline vf fifth_bits(uint32_t bits)
{
    vu32 lane;
    for (int l = 0; l < VL; l++) lane[l] = (uint32_t)l;
    return __builtin_convertvector(((vu32){0} + bits) >> lane & 1, vf) * 16.0f;
}

/* VL elements of row w starting at element c (a multiple of VL). */
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
    case WK_Q8_0: {
        const struct block_q8_0 *b = (const struct block_q8_0 *)w + c / QK8_0;
        /* GCC 12 scalarizes a direct i8 -> i32 conversion of a loaded vector: load into a register first,
         * widen as unsigned and sign-extend with an xor/sub. */
        vu8 raw;
        memcpy(&raw, b->qs + c % QK8_0, sizeof raw);
        IN_REG(raw);
        const vi32 q = __builtin_convertvector(raw, vi32);
        return f16_to_f32(b->d) * __builtin_convertvector((q ^ 128) - 128, vf);
    }
    case WK_Q4_0: {
        const struct block_q4_0 *b = (const struct block_q4_0 *)w + c / QK4_0;
        const int o = (int)(c % QK4_0);
        const vu8 q = *(const vu8 *)(b->qs + o % 16);
        return f16_to_f32(b->d) * (vf_from_u8(o < 16 ? q & 15 : q >> 4) - 8.0f);
    }
    case WK_Q4_1: {
        const struct block_q4_1 *b = (const struct block_q4_1 *)w + c / QK4_1;
        const int o = (int)(c % QK4_1);
        const vu8 q = *(const vu8 *)(b->qs + o % 16);
        return f16_to_f32(b->d) * vf_from_u8(o < 16 ? q & 15 : q >> 4) + f16_to_f32(b->m);
    }
    case WK_Q5_0: {
        const struct block_q5_0 *b = (const struct block_q5_0 *)w + c / QK5_0;
        const int o = (int)(c % QK5_0);
        const vu8 q = *(const vu8 *)(b->qs + o % 16);
        uint32_t qh;
        memcpy(&qh, b->qh, 4);
        return f16_to_f32(b->d) * (vf_from_u8(o < 16 ? q & 15 : q >> 4) + fifth_bits(qh >> o) - 16.0f);
    }
    case WK_Q5_1: {
        const struct block_q5_1 *b = (const struct block_q5_1 *)w + c / QK5_1;
        const int o = (int)(c % QK5_1);
        const vu8 q = *(const vu8 *)(b->qs + o % 16);
        uint32_t qh;
        memcpy(&qh, b->qh, 4);
        return f16_to_f32(b->d) * (vf_from_u8(o < 16 ? q & 15 : q >> 4) + fifth_bits(qh >> o)) +
               f16_to_f32(b->m);
    }
    }
    return (vf){0};
}

/* One element (the k % VL tail of plain types; quantized rows have no tail). */
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
    return ((s[0] + s[4]) + (s[2] + s[6])) + ((s[1] + s[5]) + (s[3] + s[7]));
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

/* Quantized rows read in place, for m <= 2 only. */
#define MICRO_Q_FN(name, kind)                                                                               \
    static void name(float *out, const float *x, ptrdiff_t ldx, const void *w, ptrdiff_t ldw, int kc,        \
                     int mr, int nr)                                                                         \
    {                                                                                                        \
        switch (mr * 8 + nr) {                                                                               \
            MICRO_ROW(kind, 1) MICRO_ROW(kind, 2) MICRO_CASE(kind, 1, 4) MICRO_CASE(kind, 2, 4)              \
        }                                                                                                    \
    }
MICRO_Q_FN(micro_q8_0, WK_Q8_0)
MICRO_Q_FN(micro_q4_0, WK_Q4_0)
MICRO_Q_FN(micro_q4_1, WK_Q4_1)
MICRO_Q_FN(micro_q5_0, WK_Q5_0)
MICRO_Q_FN(micro_q5_1, WK_Q5_1)

/* K-quants for m <= 2: a dedicated walk over super-blocks, so that scales and minimums are unpacked once per
 * sub-block and row rather than once per vector. Q4_K and Q5_K share it (five: the fifth bit of Q5_K, bit
 * `sub` of qh[l] for element l of sub-block sub; the blocks differ only by qh before qs). */
static inline __attribute__((always_inline)) void kq_q45_k(float *out, const float *x, ptrdiff_t ldx,
                                                           const void *w, ptrdiff_t ldw, int k, int mr,
                                                           int nr, int five)
{
    const size_t bsz = five ? sizeof(struct block_q5_k) : sizeof(struct block_q4_k);
    const size_t qs_off = five ? offsetof(struct block_q5_k, qs) : offsetof(struct block_q4_k, qs);
    vf acc[2][NR];
    for (int i = 0; i < mr; i++)
        for (int j = 0; j < nr; j++) acc[i][j] = (vf){0};
    for (int b = 0; b < k / QK_K; b++) {
        const uint8_t *bl[NR];
        float d[NR], dm[NR];
        for (int j = 0; j < nr; j++) {
            bl[j] = (const uint8_t *)WROW(w, ldw, j) + (size_t)b * bsz;
            uint16_t h[2];
            memcpy(h, bl[j], 4); /* d, dmin: the first two fields of both blocks */
            d[j] = f16_to_f32(h[0]);
            dm[j] = f16_to_f32(h[1]);
        }
        for (int sub = 0; sub < 8; sub++) {
            const int p = sub / 2, hi = sub & 1;
            float d1[NR], m1[NR];
            for (int j = 0; j < nr; j++) {
                uint8_t scl, mn;
                block_q4_k_scale_min(sub, bl[j] + 4, &scl, &mn);
                d1[j] = d[j] * (float)scl;
                m1[j] = dm[j] * (float)mn;
            }
            for (int v = 0; v < 32; v += VL) {
                const int c = b * QK_K + sub * 32 + v;
                vf wv[NR];
                for (int j = 0; j < nr; j++) {
                    vu8 q;
                    memcpy(&q, bl[j] + qs_off + 32 * p + v, sizeof q);
                    vf val = vf_from_u8(hi ? q >> 4 : q & 15);
                    if (five) {
                        vu8 h;
                        memcpy(&h, bl[j] + offsetof(struct block_q5_k, qh) + v, sizeof h);
                        val += vf_from_u8(h >> sub & 1) * 16.0f;
                    }
                    wv[j] = d1[j] * val - m1[j];
                }
                for (int i = 0; i < mr; i++) {
                    const vf xv = *(const vfu *)(x + i * ldx + c);
                    for (int j = 0; j < nr; j++) acc[i][j] += xv * wv[j];
                }
            }
        }
    }
    for (int i = 0; i < mr; i++)
        for (int j = 0; j < nr; j++) out[i * NR + j] = hsum(acc[i][j]);
}

static inline __attribute__((always_inline)) void kq_q4_k(float *out, const float *x, ptrdiff_t ldx,
                                                          const void *w, ptrdiff_t ldw, int k, int mr, int nr)
{
    kq_q45_k(out, x, ldx, w, ldw, k, mr, nr, 0);
}

static inline __attribute__((always_inline)) void kq_q5_k(float *out, const float *x, ptrdiff_t ldx,
                                                          const void *w, ptrdiff_t ldw, int k, int mr, int nr)
{
    kq_q45_k(out, x, ldx, w, ldw, k, mr, nr, 1);
}

static inline __attribute__((always_inline)) void kq_q6_k(float *out, const float *x, ptrdiff_t ldx,
                                                          const void *w, ptrdiff_t ldw, int k, int mr, int nr)
{
    vf acc[2][NR];
    for (int i = 0; i < mr; i++)
        for (int j = 0; j < nr; j++) acc[i][j] = (vf){0};
    for (int b = 0; b < k / QK_K; b++) {
        const struct block_q6_k *bl[NR];
        float d[NR];
        for (int j = 0; j < nr; j++) {
            bl[j] = (const struct block_q6_k *)((const uint8_t *)WROW(w, ldw, j) +
                                                (size_t)b * sizeof(struct block_q6_k));
            d[j] = f16_to_f32(bl[j]->d);
        }
        /* Element 128h + 32g + l (l < 32) takes scale 8h + l/16 + 2g; the four g share the ql/qh bytes. */
        for (int h = 0; h < 2; h++)
            for (int l = 0; l < 32; l += VL) {
                vu8 q[NR][4];
                float s[NR][4];
                for (int j = 0; j < nr; j++) {
                    vu8 a0, a1, hb;
                    memcpy(&a0, bl[j]->ql + 64 * h + l, sizeof a0);
                    memcpy(&a1, bl[j]->ql + 64 * h + l + 32, sizeof a1);
                    memcpy(&hb, bl[j]->qh + 32 * h + l, sizeof hb);
                    q[j][0] = (a0 & 15) | ((hb & 3) << 4);
                    q[j][1] = (a1 & 15) | (((hb >> 2) & 3) << 4);
                    q[j][2] = (a0 >> 4) | (((hb >> 4) & 3) << 4);
                    q[j][3] = (a1 >> 4) | (((hb >> 6) & 3) << 4);
                    for (int g = 0; g < 4; g++) s[j][g] = d[j] * (float)bl[j]->scales[8 * h + l / 16 + 2 * g];
                }
                for (int g = 0; g < 4; g++) {
                    const int c = b * QK_K + 128 * h + 32 * g + l;
                    vf wv[NR];
                    for (int j = 0; j < nr; j++) wv[j] = s[j][g] * (vf_from_u8(q[j][g]) - 32.0f);
                    for (int i = 0; i < mr; i++) {
                        const vf xv = *(const vfu *)(x + i * ldx + c);
                        for (int j = 0; j < nr; j++) acc[i][j] += xv * wv[j];
                    }
                }
            }
    }
    for (int i = 0; i < mr; i++)
        for (int j = 0; j < nr; j++) out[i * NR + j] = hsum(acc[i][j]);
}

#define KQ_CASE(fn, mr, nr)                                                                                  \
    case (mr)*8 + (nr):                                                                                      \
        fn(out, x, ldx, w, ldw, kc, mr, nr);                                                                 \
        return;
#define KQ_FN(name, fn)                                                                                      \
    static void name(float *out, const float *x, ptrdiff_t ldx, const void *w, ptrdiff_t ldw, int kc,        \
                     int mr, int nr)                                                                         \
    {                                                                                                        \
        switch (mr * 8 + nr) {                                                                               \
            KQ_CASE(fn, 1, 1)                                                                                \
            KQ_CASE(fn, 1, 2)                                                                                \
            KQ_CASE(fn, 1, 3)                                                                                \
            KQ_CASE(fn, 1, 4) KQ_CASE(fn, 2, 1) KQ_CASE(fn, 2, 2) KQ_CASE(fn, 2, 3) KQ_CASE(fn, 2, 4)        \
        }                                                                                                    \
    }
KQ_FN(micro_q4_k, kq_q4_k)
KQ_FN(micro_q5_k, kq_q5_k)
KQ_FN(micro_q6_k, kq_q6_k)

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define HAVE_AVX_Q 1
/* Up to this many rows of x, Q8_0/Q4_0/Q4_1 are decoded in registers (no tile): measured (1536x576, 1 thread)
 * Q4_1 m=3 210 -> 104 us, m=4 147 -> 138 us with AVX-512; with 16 ymm registers m=4 spills (187 us). */
#if defined(__AVX512F__)
#define DIRECT_M_MAX 4
#else
#define DIRECT_M_MAX 3
#endif
#define SX_MAX_K 16384 /* longest k served by the AVX2 Q4_0/Q4_1 path (x block sums live on the stack) */
/* ---- m <= 2, Q8_0/Q4_0/Q4_1 with hand-written AVX2 -------------------------------------------------------
 *
 * Per 32-element block and weight row: the integer quants are widened to i32 (pmovzx/pmovsx straight from
 * memory), the nibbles split with and/shift, converted with cvtdq2ps and dotted with x in f32 (t = Σ q·x,
 * one mul and three FMAs), then the block scale is applied once: acc += d·t. The affine part goes through a
 * per-block sum of x computed once per call (sx): Q4_1 adds m·Σx, Q4_0 adds d·(-8·Σx). Both land in a small
 * 4-lane accumulator c += (d, m, 0, 0) * (s0, s1, 0, 0), where (s0, s1) = (-8Σx, 0) for Q4_0 and (0, Σx) for
 * Q4_1, so no scalar f16 conversion is needed. x vectors of a block are loaded once for the NR rows in
 * flight. Same value as Σ (d q + m) x up to f32 rounding order; fixed order, so deterministic. */
#include <immintrin.h>

static inline __attribute__((always_inline)) float hsum256(__m256 v)
{
    /* The fixed pairwise order of hsum() for 8 lanes. */
    const __m128 lo = _mm256_castps256_ps128(v), hi = _mm256_extractf128_ps(v, 1);
    const __m128 s = _mm_add_ps(lo, hi);                 /* (0+4, 1+5, 2+6, 3+7) */
    const __m128 t = _mm_add_ps(s, _mm_movehl_ps(s, s)); /* ((0+4)+(2+6), (1+5)+(3+7)) */
    return _mm_cvtss_f32(t) + _mm_cvtss_f32(_mm_shuffle_ps(t, t, 1));
}

static inline __attribute__((always_inline)) void avx_q(float *out, const float *x, ptrdiff_t ldx,
                                                        const uint8_t *w, ptrdiff_t ldw, int k, int mr,
                                                        int nr, const float *sx, enum wkind kind)
{
    const int nb = k / 32;
    const size_t bsz = kind == WK_Q8_0   ? sizeof(struct block_q8_0)
                       : kind == WK_Q4_0 ? sizeof(struct block_q4_0)
                       : kind == WK_Q4_1 ? sizeof(struct block_q4_1)
                       : kind == WK_Q5_0 ? sizeof(struct block_q5_0)
                                         : sizeof(struct block_q5_1);
    /* Offsets of the quants and (Q5) of the fifth bits; an f16 minimum follows d in Q4_1/Q5_1. */
    const int qoff = kind == WK_Q4_1 ? 4 : kind == WK_Q5_0 ? 6 : kind == WK_Q5_1 ? 8 : 2;
    const int hoff = kind == WK_Q5_0 ? 2 : 4;
    const int five = kind == WK_Q5_0 || kind == WK_Q5_1, with_min = kind == WK_Q4_1 || kind == WK_Q5_1;
    __m128 cacc[4][NR];
#if defined(__AVX512F__)
    /* One zmm per 16 elements: half the instructions of the AVX2 loop below. */
    __m512 acc[4][NR];
    for (int i = 0; i < mr; i++)
        for (int j = 0; j < nr; j++) acc[i][j] = _mm512_setzero_ps(), cacc[i][j] = _mm_setzero_ps();
    const __m512i m15 = _mm512_set1_epi32(15), one = _mm512_set1_epi32(1);
    const __m512i iota = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    for (int b = 0; b < nb; b++) {
        __m512 xv[4][2];
        __m128 sv[4];
        for (int i = 0; i < mr; i++) {
            const float *xp = x + i * ldx + 32 * b;
            xv[i][0] = _mm512_loadu_ps(xp);
            xv[i][1] = _mm512_loadu_ps(xp + 16);
            if (kind != WK_Q8_0)
                sv[i] = _mm_castpd_ps(_mm_load_sd((const double *)(sx + i * 2 * nb + 2 * b)));
        }
        for (int j = 0; j < nr; j++) {
            const uint8_t *bp = w + j * ldw + bsz * b;
            const uint8_t *qs = bp + qoff;
            _mm_prefetch((const char *)bp + PF_AHEAD * ldw, PF_HINT);
            __m512 f0, f1;
            __m128 dm;
            if (kind == WK_Q8_0) {
                f0 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)qs)));
                f1 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(qs + 16))));
                uint16_t d;
                memcpy(&d, bp, 2);
                dm = _mm_cvtph_ps(_mm_cvtsi32_si128(d));
            } else {
                const __m512i a = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)qs));
                __m512i lo = _mm512_and_si512(a, m15), hi = _mm512_srli_epi32(a, 4);
                if (five) { /* bit j of qh is element j's fifth bit: elements 0-15 low nibbles, 16-31 high */
                    uint32_t qh;
                    memcpy(&qh, bp + hoff, 4);
                    const __m512i h = _mm512_set1_epi32((int)qh);
                    lo = _mm512_or_si512(
                        lo, _mm512_slli_epi32(_mm512_and_si512(_mm512_srlv_epi32(h, iota), one), 4));
                    hi = _mm512_or_si512(
                        hi, _mm512_slli_epi32(
                                _mm512_and_si512(_mm512_srlv_epi32(_mm512_srli_epi32(h, 16), iota), one), 4));
                }
                f0 = _mm512_cvtepi32_ps(lo);
                f1 = _mm512_cvtepi32_ps(hi);
                uint32_t dmb;
                if (with_min) {
                    memcpy(&dmb, bp, 4);
                } else {
                    uint16_t d;
                    memcpy(&d, bp, 2);
                    dmb = d;
                }
                dm = _mm_cvtph_ps(_mm_cvtsi32_si128((int)dmb));
            }
            const __m512 dv = _mm512_broadcastss_ps(dm);
            for (int i = 0; i < mr; i++) {
                const __m512 t = _mm512_fmadd_ps(f1, xv[i][1], _mm512_mul_ps(f0, xv[i][0]));
                acc[i][j] = _mm512_fmadd_ps(dv, t, acc[i][j]);
                if (kind != WK_Q8_0) cacc[i][j] = _mm_fmadd_ps(dm, sv[i], cacc[i][j]);
            }
        }
    }
    for (int i = 0; i < mr; i++)
        for (int j = 0; j < nr; j++) {
            const __m128 c = cacc[i][j];
            const __m256 h =
                _mm256_add_ps(_mm512_castps512_ps256(acc[i][j]),
                              _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(acc[i][j]), 1)));
            out[i * NR + j] = hsum256(h) + (_mm_cvtss_f32(c) + _mm_cvtss_f32(_mm_shuffle_ps(c, c, 1)));
        }
#else
    __m256 acc[4][NR];
    for (int i = 0; i < mr; i++)
        for (int j = 0; j < nr; j++) acc[i][j] = _mm256_setzero_ps(), cacc[i][j] = _mm_setzero_ps();
    const __m256i m15 = _mm256_set1_epi32(15), one = _mm256_set1_epi32(1);
    const __m256i iota = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    for (int b = 0; b < nb; b++) {
        __m256 xv[4][4];
        __m128 sv[4];
        for (int i = 0; i < mr; i++) {
            const float *xp = x + i * ldx + 32 * b;
            for (int v = 0; v < 4; v++) xv[i][v] = _mm256_loadu_ps(xp + 8 * v);
            if (kind != WK_Q8_0)
                sv[i] = _mm_castpd_ps(_mm_load_sd((const double *)(sx + i * 2 * nb + 2 * b)));
        }
        for (int j = 0; j < nr; j++) {
            const uint8_t *bp = w + j * ldw + bsz * b;
            const uint8_t *qs = bp + qoff;
            _mm_prefetch((const char *)bp + PF_AHEAD * ldw, PF_HINT);
            __m256 f[4];
            __m128 dm;
            if (kind == WK_Q8_0) {
                for (int v = 0; v < 4; v++)
                    f[v] = _mm256_cvtepi32_ps(
                        _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(qs + 8 * v))));
                uint16_t d;
                memcpy(&d, bp, 2);
                dm = _mm_cvtph_ps(_mm_cvtsi32_si128(d));
            } else {
                const __m256i a = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)qs));
                const __m256i c = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(qs + 8)));
                __m256i q[4] = {_mm256_and_si256(a, m15), _mm256_and_si256(c, m15), _mm256_srli_epi32(a, 4),
                                _mm256_srli_epi32(c, 4)};
                if (five) { /* elements 8v..8v+7 take bits 8v..8v+7 of qh */
                    uint32_t qh;
                    memcpy(&qh, bp + hoff, 4);
                    for (int v = 0; v < 4; v++) {
                        const __m256i h = _mm256_srlv_epi32(_mm256_set1_epi32((int)(qh >> (8 * v))), iota);
                        q[v] = _mm256_or_si256(q[v], _mm256_slli_epi32(_mm256_and_si256(h, one), 4));
                    }
                }
                for (int v = 0; v < 4; v++) f[v] = _mm256_cvtepi32_ps(q[v]);
                uint32_t dmb;
                if (with_min) {
                    memcpy(&dmb, bp, 4);
                } else {
                    uint16_t d;
                    memcpy(&d, bp, 2);
                    dmb = d;
                }
                dm = _mm_cvtph_ps(_mm_cvtsi32_si128((int)dmb));
            }
            const __m256 dv = _mm256_broadcastss_ps(dm);
            for (int i = 0; i < mr; i++) {
                __m256 t = _mm256_mul_ps(f[0], xv[i][0]);
                t = _mm256_fmadd_ps(f[1], xv[i][1], t);
                t = _mm256_fmadd_ps(f[2], xv[i][2], t);
                t = _mm256_fmadd_ps(f[3], xv[i][3], t);
                acc[i][j] = _mm256_fmadd_ps(dv, t, acc[i][j]);
                if (kind != WK_Q8_0) cacc[i][j] = _mm_fmadd_ps(dm, sv[i], cacc[i][j]);
            }
        }
    }
    for (int i = 0; i < mr; i++)
        for (int j = 0; j < nr; j++) {
            const __m128 c = cacc[i][j];
            out[i * NR + j] =
                hsum256(acc[i][j]) + (_mm_cvtss_f32(c) + _mm_cvtss_f32(_mm_shuffle_ps(c, c, 1)));
        }
#endif
}

#if defined(__AVX512F__)
/* Q4_0 with AVX-512 (measured 5 % faster than avx_q for Q4_0, 10 % slower for Q4_1, which stays on avx_q;
 * the Q4_1 code below is kept for completeness): the 16 possible weights of a block row, d*q+m (Q4_0:
 * d*(q-8)), are built once per block in one register (one FMA on 0..15) and looked up with vpermps, which
 * reads only the low 4 bits of each index: no int->float conversion, no and-mask, and the weights are the
 * exactly dequantized values. Two accumulators per (x row, weight row) (low / high nibble halves), summed at
 * the end. */
static inline __attribute__((always_inline)) void avx512_q4(float *out, const float *x, ptrdiff_t ldx,
                                                            const uint8_t *w, ptrdiff_t ldw, int k, int mr,
                                                            int nr, enum wkind kind)
{
    const int nb = k / 32;
    const size_t bsz = kind == WK_Q4_0 ? sizeof(struct block_q4_0) : sizeof(struct block_q4_1);
    const int qoff = kind == WK_Q4_1 ? 4 : 2;
    const __m512 iota = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    const __m512 iota8 = _mm512_sub_ps(iota, _mm512_set1_ps(8.0f));
    __m512 acc0[4][NR], acc1[4][NR];
    for (int i = 0; i < mr; i++)
        for (int j = 0; j < nr; j++) acc0[i][j] = acc1[i][j] = _mm512_setzero_ps();
    for (int b = 0; b < nb; b++) {
        __m512 xv[4][2];
        for (int i = 0; i < mr; i++) {
            const float *xp = x + i * ldx + 32 * b;
            xv[i][0] = _mm512_loadu_ps(xp);
            xv[i][1] = _mm512_loadu_ps(xp + 16);
        }
        for (int j = 0; j < nr; j++) {
            const uint8_t *bp = w + j * ldw + bsz * b;
            _mm_prefetch((const char *)bp + PF_AHEAD * ldw, PF_HINT);
            const __m512i a = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(bp + qoff)));
            __m512 lut;
            if (kind == WK_Q4_1) {
                uint32_t dmb;
                memcpy(&dmb, bp, 4);
                const __m128 dm = _mm_cvtph_ps(_mm_cvtsi32_si128((int)dmb));
                lut = _mm512_fmadd_ps(iota, _mm512_broadcastss_ps(dm),
                                      _mm512_broadcastss_ps(_mm_movehdup_ps(dm)));
            } else {
                uint16_t d;
                memcpy(&d, bp, 2);
                lut = _mm512_mul_ps(iota8, _mm512_broadcastss_ps(_mm_cvtph_ps(_mm_cvtsi32_si128(d))));
            }
            const __m512 w0 = _mm512_permutexvar_ps(a, lut);
            const __m512 w1 = _mm512_permutexvar_ps(_mm512_srli_epi32(a, 4), lut);
            for (int i = 0; i < mr; i++) {
                acc0[i][j] = _mm512_fmadd_ps(w0, xv[i][0], acc0[i][j]);
                acc1[i][j] = _mm512_fmadd_ps(w1, xv[i][1], acc1[i][j]);
            }
        }
    }
    for (int i = 0; i < mr; i++)
        for (int j = 0; j < nr; j++) {
            const __m512 s = _mm512_add_ps(acc0[i][j], acc1[i][j]);
            const __m256 h = _mm256_add_ps(_mm512_castps512_ps256(s),
                                           _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(s), 1)));
            out[i * NR + j] = hsum256(h);
        }
}
#define AVXQ4(kind, mr, nr) avx512_q4(out, x, ldx, w, ldw, k, mr, nr, kind)
#else
#define AVXQ4(kind, mr, nr) avx_q(out, x, ldx, w, ldw, k, mr, nr, sx, kind)
#endif

#define AVXQ_CASE(kind, mr, nr)                                                                              \
    case (mr)*8 + (nr):                                                                                      \
        if (kind != WK_Q4_0)                                                                                 \
            avx_q(out, x, ldx, w, ldw, k, mr, nr, sx, kind);                                                 \
        else                                                                                                 \
            AVXQ4(kind, mr, nr);                                                                             \
        return;
#define AVXQ_FN(name, kind)                                                                                  \
    static void name(float *out, const float *x, ptrdiff_t ldx, const uint8_t *w, ptrdiff_t ldw, int k,      \
                     int mr, int nr, const float *sx)                                                        \
    {                                                                                                        \
        switch (mr * 8 + nr) {                                                                               \
            AVXQ_CASE(kind, 1, 1)                                                                            \
            AVXQ_CASE(kind, 1, 2)                                                                            \
            AVXQ_CASE(kind, 1, 3)                                                                            \
            AVXQ_CASE(kind, 1, 4)                                                                            \
            AVXQ_CASE(kind, 2, 1)                                                                            \
            AVXQ_CASE(kind, 2, 2)                                                                            \
            AVXQ_CASE(kind, 2, 3)                                                                            \
            AVXQ_CASE(kind, 2, 4)                                                                            \
            AVXQ_CASE(kind, 3, 1)                                                                            \
            AVXQ_CASE(kind, 3, 2)                                                                            \
            AVXQ_CASE(kind, 4, 1)                                                                            \
            AVXQ_CASE(kind, 4, 2)                                                                            \
        }                                                                                                    \
    }
AVXQ_FN(avx_q8_0, WK_Q8_0)
AVXQ_FN(avx_q4_0, WK_Q4_0)
AVXQ_FN(avx_q4_1, WK_Q4_1)
AVXQ_FN(avx_q5_0, WK_Q5_0)
AVXQ_FN(avx_q5_1, WK_Q5_1)

/* Q4_K for m <= 2 with AVX2, the avx_q scheme per 32-element sub-block: t = Σ q·x over the sub-block,
 * acc += (d·scale)·t, and the minimums through the per-32 sums of x (sx, the Q4_1 layout): the row's
 * Σ (dmin·min)·Σx is accumulated in f32 and subtracted at the end. Sub-blocks 2p and 2p+1 share the 32
 * bytes qs[32p..]: low nibbles, then high nibbles. */
static inline __attribute__((always_inline)) void avx_q4k(float *out, const float *x, ptrdiff_t ldx,
                                                          const uint8_t *w, ptrdiff_t ldw, int k, int mr,
                                                          int nr, const float *sx, int five)
{
    const int nsb = k / QK_K, nb = k / 32;
    const size_t bsz = five ? sizeof(struct block_q5_k) : sizeof(struct block_q4_k);
    const size_t qs_off = five ? offsetof(struct block_q5_k, qs) : offsetof(struct block_q4_k, qs);
    const __m256i one = _mm256_set1_epi32(1);
    __m256 acc[2][NR];
    float cm[2][NR];
    for (int i = 0; i < mr; i++)
        for (int j = 0; j < nr; j++) acc[i][j] = _mm256_setzero_ps(), cm[i][j] = 0.0f;
    const __m256i m15 = _mm256_set1_epi32(15);
    for (int b = 0; b < nsb; b++) {
        float d1[NR][8], m1[NR][8];
        for (int j = 0; j < nr; j++) {
            const uint8_t *bl = w + j * ldw + (size_t)b * bsz;
            for (size_t o = 0; o < bsz; o += 64) _mm_prefetch((const char *)bl + PF_AHEAD * ldw + o, PF_HINT);
            uint16_t dd[2];
            memcpy(dd, bl, 4); /* d, dmin: the first fields of both blocks; the 12 scale bytes follow */
            const float d = f16_to_f32(dd[0]), dm = f16_to_f32(dd[1]);
            const uint8_t *sc = bl + 4;
            for (int s = 0; s < 8; s++) {
                const int scl = s < 4 ? sc[s] & 63 : (sc[s + 4] & 15) | ((sc[s - 4] >> 6) << 4);
                const int mn = s < 4 ? sc[s + 4] & 63 : (sc[s + 4] >> 4) | ((sc[s] >> 6) << 4);
                d1[j][s] = d * (float)scl;
                m1[j][s] = dm * (float)mn;
            }
            for (int i = 0; i < mr; i++)
                for (int s = 0; s < 8; s++) cm[i][j] += m1[j][s] * sx[i * 2 * nb + 2 * (b * 8 + s) + 1];
        }
        for (int p = 0; p < 4; p++) {
            __m256 xl[2][4], xh[2][4];
            for (int i = 0; i < mr; i++) {
                const float *xp = x + i * ldx + b * QK_K + 64 * p;
                for (int v = 0; v < 4; v++)
                    xl[i][v] = _mm256_loadu_ps(xp + 8 * v), xh[i][v] = _mm256_loadu_ps(xp + 32 + 8 * v);
            }
            for (int j = 0; j < nr; j++) {
                const uint8_t *bl = w + j * ldw + (size_t)b * bsz;
                const uint8_t *qs = bl + qs_off + 32 * p;
                __m256i a[4];
                for (int v = 0; v < 4; v++)
                    a[v] = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(qs + 8 * v)));
                __m256 fl[4], fh[4];
                for (int v = 0; v < 4; v++) {
                    __m256i lo = _mm256_and_si256(a[v], m15), hi = _mm256_srli_epi32(a[v], 4);
                    if (five) { /* bit s of qh[l]: the fifth bit of element l of sub-block s (here 2p, 2p+1)
                                 */
                        const __m256i h = _mm256_cvtepu8_epi32(
                            _mm_loadl_epi64((const __m128i *)(bl + offsetof(struct block_q5_k, qh) + 8 * v)));
                        lo = _mm256_or_si256(
                            lo, _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(h, 2 * p), one), 4));
                        hi = _mm256_or_si256(
                            hi, _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(h, 2 * p + 1), one), 4));
                    }
                    fl[v] = _mm256_cvtepi32_ps(lo);
                    fh[v] = _mm256_cvtepi32_ps(hi);
                }
                const __m256 dl = _mm256_set1_ps(d1[j][2 * p]), dh = _mm256_set1_ps(d1[j][2 * p + 1]);
                for (int i = 0; i < mr; i++) {
                    __m256 tl = _mm256_mul_ps(fl[0], xl[i][0]), th = _mm256_mul_ps(fh[0], xh[i][0]);
                    for (int v = 1; v < 4; v++) {
                        tl = _mm256_fmadd_ps(fl[v], xl[i][v], tl);
                        th = _mm256_fmadd_ps(fh[v], xh[i][v], th);
                    }
                    acc[i][j] = _mm256_fmadd_ps(dl, tl, acc[i][j]);
                    acc[i][j] = _mm256_fmadd_ps(dh, th, acc[i][j]);
                }
            }
        }
    }
    for (int i = 0; i < mr; i++)
        for (int j = 0; j < nr; j++) out[i * NR + j] = hsum256(acc[i][j]) - cm[i][j];
}

#define AVXQ4K_CASE(mr, nr, five)                                                                            \
    case (mr)*8 + (nr):                                                                                      \
        avx_q4k(out, x, ldx, w, ldw, k, mr, nr, sx, five);                                                   \
        return;
#define AVXQ4K_FN(name, five)                                                                                \
    static void name(float *out, const float *x, ptrdiff_t ldx, const uint8_t *w, ptrdiff_t ldw, int k,      \
                     int mr, int nr, const float *sx)                                                        \
    {                                                                                                        \
        switch (mr * 8 + nr) {                                                                               \
            AVXQ4K_CASE(1, 1, five)                                                                          \
            AVXQ4K_CASE(1, 2, five)                                                                          \
            AVXQ4K_CASE(1, 3, five)                                                                          \
            AVXQ4K_CASE(1, 4, five)                                                                          \
            AVXQ4K_CASE(2, 1, five)                                                                          \
            AVXQ4K_CASE(2, 2, five)                                                                          \
            AVXQ4K_CASE(2, 3, five)                                                                          \
            AVXQ4K_CASE(2, 4, five)                                                                          \
        }                                                                                                    \
    }
AVXQ4K_FN(avx_q4_k, 0)
AVXQ4K_FN(avx_q5_k, 1)

/* Q6_K for m <= 2 with AVX2: per super-block, half h (128 elements) and 16-lane half of l, the four 6-bit
 * quant vectors (g = 0..3) are rebuilt from ql/qh with 128-bit byte ops, recentred (q - 32) as int8, widened
 * to i32 and converted; t = Σ q·x over the 16 elements of one scale, acc += (d·scale)·t. */
static inline __attribute__((always_inline)) void
avx_q6k(float *out, const float *x, ptrdiff_t ldx, const uint8_t *w, ptrdiff_t ldw, int k, int mr, int nr)
{
    const int nsb = k / QK_K;
    __m256 acc[2][NR];
    for (int i = 0; i < mr; i++)
        for (int j = 0; j < nr; j++) acc[i][j] = _mm256_setzero_ps();
    const __m128i m0f = _mm_set1_epi8(15), m30 = _mm_set1_epi8(0x30), c32 = _mm_set1_epi8(32);
    for (int b = 0; b < nsb; b++) {
        for (int j = 0; j < nr; j++) {
            const uint8_t *bp = w + j * ldw + (size_t)b * sizeof(struct block_q6_k);
            for (int o = 0; o < (int)sizeof(struct block_q6_k); o += 64)
                _mm_prefetch((const char *)bp + PF_AHEAD * ldw + o, PF_HINT);
        }
        for (int h = 0; h < 2; h++)
            for (int lh = 0; lh < 32; lh += 16) {
                __m256 xv[2][4][2];
                for (int i = 0; i < mr; i++)
                    for (int g = 0; g < 4; g++) {
                        const float *xp = x + i * ldx + b * QK_K + 128 * h + 32 * g + lh;
                        xv[i][g][0] = _mm256_loadu_ps(xp);
                        xv[i][g][1] = _mm256_loadu_ps(xp + 8);
                    }
                for (int j = 0; j < nr; j++) {
                    const struct block_q6_k *bl =
                        (const struct block_q6_k *)(w + j * ldw + (size_t)b * sizeof(struct block_q6_k));
                    const __m128i a0 = _mm_loadu_si128((const __m128i *)(bl->ql + 64 * h + lh));
                    const __m128i a1 = _mm_loadu_si128((const __m128i *)(bl->ql + 64 * h + 32 + lh));
                    const __m128i hb = _mm_loadu_si128((const __m128i *)(bl->qh + 32 * h + lh));
                    __m128i q[4];
                    q[0] = _mm_or_si128(_mm_and_si128(a0, m0f), _mm_and_si128(_mm_slli_epi16(hb, 4), m30));
                    q[1] = _mm_or_si128(_mm_and_si128(a1, m0f), _mm_and_si128(_mm_slli_epi16(hb, 2), m30));
                    q[2] = _mm_or_si128(_mm_and_si128(_mm_srli_epi16(a0, 4), m0f), _mm_and_si128(hb, m30));
                    q[3] = _mm_or_si128(_mm_and_si128(_mm_srli_epi16(a1, 4), m0f),
                                        _mm_and_si128(_mm_srli_epi16(hb, 2), m30));
                    const float d = f16_to_f32(bl->d);
                    for (int g = 0; g < 4; g++) {
                        const __m128i qc = _mm_sub_epi8(q[g], c32);
                        const __m256 f0 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(qc));
                        const __m256 f1 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(qc, 8)));
                        const __m256 dv = _mm256_set1_ps(d * (float)bl->scales[8 * h + lh / 16 + 2 * g]);
                        for (int i = 0; i < mr; i++) {
                            const __m256 t = _mm256_fmadd_ps(f1, xv[i][g][1], _mm256_mul_ps(f0, xv[i][g][0]));
                            acc[i][j] = _mm256_fmadd_ps(dv, t, acc[i][j]);
                        }
                    }
                }
            }
    }
    for (int i = 0; i < mr; i++)
        for (int j = 0; j < nr; j++) out[i * NR + j] = hsum256(acc[i][j]);
}

#define AVXQ6K_CASE(mr, nr)                                                                                  \
    case (mr)*8 + (nr):                                                                                      \
        avx_q6k(out, x, ldx, w, ldw, k, mr, nr);                                                             \
        return;
static void avx_q6_k(float *out, const float *x, ptrdiff_t ldx, const uint8_t *w, ptrdiff_t ldw, int k,
                     int mr, int nr, const float *sx)
{
    (void)sx;
    switch (mr * 8 + nr) {
        AVXQ6K_CASE(1, 1)
        AVXQ6K_CASE(1, 2)
        AVXQ6K_CASE(1, 3)
        AVXQ6K_CASE(1, 4)
        AVXQ6K_CASE(2, 1)
        AVXQ6K_CASE(2, 2)
        AVXQ6K_CASE(2, 3)
        AVXQ6K_CASE(2, 4)
    }
}

typedef void (*avxq_fn)(float *out, const float *x, ptrdiff_t ldx, const uint8_t *w, ptrdiff_t ldw, int k,
                        int mr, int nr, const float *sx);
#endif

typedef void (*micro_fn)(float *out, const float *x, ptrdiff_t ldx, const void *w, ptrdiff_t ldw, int kc,
                         int mr, int nr);

/* What the affine part of a direct kernel needs per 32-element block of x (see avx_q): nothing, Q4_0's
 * -8·Σx, Q5_0's -16·Σx, or Σx (Q4_1/Q5_1 m, Q4_K/Q5_K minimums). */
enum sx_kind { SX_NONE, SX_NEG8, SX_NEG16, SX_SUM };

/* The CPU's kernels for one weight type (indexed by enum dtype; quant/dtype.h describes the types).
 *   stream: decodes rows in registers for m <= 2, whole rows streamed from memory (no tile); NULL sends the
 *           type through the f32 tile (quant's to_f32) at every m.
 *   direct: the hand-written AVX2 kernel for m <= direct_m (tried before stream), with the x block sums sx
 *           it needs (only for k <= SX_MAX_K: they live on the stack). */
struct cpu_wkernels {
    micro_fn stream;
#ifdef HAVE_AVX_Q
    avxq_fn direct;
    int direct_m;
    enum sx_kind sx;
#endif
};

#ifdef HAVE_AVX_Q
#define CPU_K(stream, direct, direct_m, sx)                                                                  \
    {                                                                                                        \
        stream, direct, direct_m, sx                                                                         \
    }
#else
#define CPU_K(stream, direct, direct_m, sx)                                                                  \
    {                                                                                                        \
        stream                                                                                               \
    }
#endif
static const struct cpu_wkernels cpu_wkernels[DTYPE_COUNT] = {
    [DTYPE_F32] = CPU_K(micro_f32, NULL, 0, SX_NONE),
    [DTYPE_F16] = CPU_K(micro_f16, NULL, 0, SX_NONE),
    [DTYPE_BF16] = CPU_K(micro_bf16, NULL, 0, SX_NONE),
    [DTYPE_Q8_0] = CPU_K(micro_q8_0, avx_q8_0, DIRECT_M_MAX, SX_NONE),
    [DTYPE_Q4_0] = CPU_K(micro_q4_0, avx_q4_0, DIRECT_M_MAX, SX_NEG8),
    [DTYPE_Q4_1] = CPU_K(micro_q4_1, avx_q4_1, DIRECT_M_MAX, SX_SUM),
    [DTYPE_Q5_0] = CPU_K(micro_q5_0, avx_q5_0, DIRECT_M_MAX, SX_NEG16),
    [DTYPE_Q5_1] = CPU_K(micro_q5_1, avx_q5_1, DIRECT_M_MAX, SX_SUM),
    [DTYPE_Q4_K] = CPU_K(micro_q4_k, avx_q4_k, 2, SX_SUM),
    [DTYPE_Q5_K] = CPU_K(micro_q5_k, avx_q5_k, 2, SX_SUM),
    [DTYPE_Q6_K] = CPU_K(micro_q6_k, avx_q6_k, 2, SX_NONE),
};

struct mm_ctx {
    float *y;         /* (m, n) */
    const float *x;   /* (m, k) */
    const uint8_t *w; /* (n, row_bytes) */
    enum dtype wt;
    const float *bias; /* (n) or NULL */
    int m, n, k;
    size_t row_bytes;
    int kc; /* columns per chunk */
    int n_threads;
    micro_fn stream; /* m <= 2 with a register decoder: rows stream whole (kc = k), no tile; else NULL */
#ifdef HAVE_AVX_Q
    avxq_fn direct; /* the hand-written kernel this product takes (no tile), or NULL */
#endif
    const float *sx; /* direct path: (m, k/32, 2) per-block sums of x (see avx_q), or NULL */
};

static void mm_task(void *arg, int t)
{
    const struct mm_ctx *c = arg;
    const int n_groups = (c->n + NR - 1) / NR;
    const int g0 = (int)((int64_t)n_groups * t / c->n_threads),
              g1 = (int)((int64_t)n_groups * (t + 1) / c->n_threads);
    if (g0 >= g1) return;
    const int j_lo = g0 * NR, j_hi = g1 * NR < c->n ? g1 * NR : c->n;
    const int m = c->m, k = c->k;
    /* When rows are reused (m > 2) they are dequantized/converted into the tile, so the micro-kernel reads a
     * contiguous, L1-resident f32 tile whose padded row stride avoids cache-set conflicts. For m <= 2 rows
     * stream straight from memory and are decoded in registers (whole rows, kc = k). */
    const int use_tile = !c->stream;
    const micro_fn mk = use_tile ? micro_f32 : c->stream;
    float out[MR * NR];
#ifdef HAVE_AVX_Q
    if (c->direct) {
        const avxq_fn aq = c->direct;
        /* The kernels prefetch PF_AHEAD rows ahead; the first rows of the range are asked for here. */
        {
            const uint8_t *p0 = c->w + (size_t)j_lo * c->row_bytes;
            const int rows = j_hi - j_lo < PF_AHEAD ? j_hi - j_lo : PF_AHEAD;
            for (size_t off = 0; off < (size_t)rows * c->row_bytes; off += 64)
                _mm_prefetch((const char *)p0 + off, PF_HINT);
        }
        for (int j0 = j_lo; j0 < j_hi; j0 += NR) {
            const int nr = j_hi - j0 < NR ? j_hi - j0 : NR;
            const uint8_t *wg = c->w + (size_t)j0 * c->row_bytes;
            if (m <= 2) {
                aq(out, c->x, k, wg, (ptrdiff_t)c->row_bytes, k, m, nr, c->sx);
            } else { /* 3-4 rows of x: two weight rows at a time keeps the accumulators in registers */
                aq(out, c->x, k, wg, (ptrdiff_t)c->row_bytes, k, m, nr < 2 ? nr : 2, c->sx);
                if (nr > 2)
                    aq(out + 2, c->x, k, wg + 2 * c->row_bytes, (ptrdiff_t)c->row_bytes, k, m, nr - 2, c->sx);
            }
            for (int i = 0; i < m; i++) {
                float *yr = c->y + (size_t)i * c->n + j0;
                for (int j = 0; j < nr; j++) yr[j] = out[i * NR + j];
            }
        }
        if (c->bias)
            for (int i = 0; i < m; i++)
                for (int j = j_lo; j < j_hi; j++) c->y[(size_t)i * c->n + j] += c->bias[j];
        return;
    }
#endif
    float tile[NR * (KC_MAX + TILE_PAD)] __attribute__((aligned(64)));
    const dtype_to_f32_fn to_f32 = dtype_get_traits(c->wt)->to_f32;

    for (int k0 = 0; k0 < k; k0 += c->kc) {
        const int kc = k - k0 < c->kc ? k - k0 : c->kc;
        for (int j0 = j_lo; j0 < j_hi; j0 += NR) {
            const int nr = j_hi - j0 < NR ? j_hi - j0 : NR;
            const void *wp;
            ptrdiff_t ldw;
            if (use_tile) {
                const size_t off = dtype_row_size(c->wt, k0);
                const int stride = kc + TILE_PAD;
                for (int j = 0; j < nr; j++)
                    to_f32(c->w + (size_t)(j0 + j) * c->row_bytes + off, tile + (size_t)j * stride, kc);
                wp = tile;
                ldw = (ptrdiff_t)stride * 4;
            } else {
                wp = c->w + (size_t)j0 * c->row_bytes + dtype_row_size(c->wt, k0);
                ldw = (ptrdiff_t)c->row_bytes;
                /* Rows stream from memory: ask for the group PF_AHEAD rows below now (see PF_AHEAD). */
                if (j0 + PF_AHEAD < j_hi && c->row_bytes <= 4096) { /* long rows: hardware prefetch */
                    const int pr = j_hi - (j0 + PF_AHEAD) < NR ? j_hi - (j0 + PF_AHEAD) : NR;
                    const uint8_t *p0 = c->w + (size_t)(j0 + PF_AHEAD) * c->row_bytes;
                    for (size_t off = 0; off < (size_t)pr * c->row_bytes; off += 64)
                        __builtin_prefetch(p0 + off, 0, 2);
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
    if (c->bias)
        for (int i = 0; i < m; i++)
            for (int j = j_lo; j < j_hi; j++) c->y[(size_t)i * c->n + j] += c->bias[j];
}

static int mm_check(const float *y, const float *x, const void *w, enum dtype wt, int m, int n, int k)
{
    if (!y || !x || !w || !dtype_valid(wt) || m <= 0 || n <= 0 || k <= 0) return FERRY_ERR_INVALID;
    if (k % dtype_block_size(wt)) return FERRY_ERR_INVALID;
    return FERRY_OK;
}

/* Fills c for one product and returns how many pool tasks it wants (1 for tiny products). sx_buf holds
 * DIRECT_M_MAX * 2 * (SX_MAX_K / 32) floats and must live until the product is done. */
static int mm_prepare(struct mm_ctx *c, float *y, const float *x, const void *w, enum dtype wt,
                      const float *bias, int m, int n, int k, struct tpool *tp, float *sx_buf)
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
                         .n_threads = tpool_size(tp)};
    /* KC: a multiple of 256 (whole K-quant blocks) that keeps the W tile in L1 and the (m, KC) slice of x in
     * L2. With m <= 2 there is no tile and nothing to reuse: whole rows (no partial sums). */
    int64_t kc = X_L2_BYTES / ((int64_t)m * 4);
    kc = kc / 256 * 256;
    if (kc < 256) kc = 256;
    if (kc > KC_MAX) kc = KC_MAX;
    const struct cpu_wkernels *kern = &cpu_wkernels[wt];
    if (m <= 2 && kern->stream) {
        c->stream = kern->stream;
        kc = k; /* rows stream whole: no tile in mm_task */
    }
    if (kc >= k) kc = k;
    c->kc = (int)kc;
#ifdef HAVE_AVX_Q
    if (kern->direct && m <= kern->direct_m && (kern->sx == SX_NONE || k <= SX_MAX_K)) {
        c->direct = kern->direct;
        /* Per-block sums of x for the affine part (see avx_q): (m, k/32) pairs. */
        if (kern->sx != SX_NONE) {
            const int nb = k / 32;
            for (int i = 0; i < m; i++)
                for (int b = 0; b < nb; b++) {
                    const float *xp = x + (size_t)i * k + 32 * b;
                    __m256 s =
                        _mm256_add_ps(_mm256_add_ps(_mm256_loadu_ps(xp), _mm256_loadu_ps(xp + 8)),
                                      _mm256_add_ps(_mm256_loadu_ps(xp + 16), _mm256_loadu_ps(xp + 24)));
                    const float t = hsum256(s);
                    /* (scaled by d, scaled by m): the offset of Q4_0/Q5_0 codes, or Σx for the minimum. */
                    sx_buf[i * 2 * nb + 2 * b] = kern->sx == SX_NEG8    ? -8.0f * t
                                                 : kern->sx == SX_NEG16 ? -16.0f * t
                                                                        : 0.0f;
                    sx_buf[i * 2 * nb + 2 * b + 1] = kern->sx == SX_SUM ? t : 0.0f;
                }
            c->sx = sx_buf;
        }
    }
#else
    (void)sx_buf;
#endif
    /* Tiny products are not worth waking the pool for. */
    if ((int64_t)m * n * k < 32 * 1024) c->n_threads = 1;
    return c->n_threads;
}

#ifdef HAVE_AVX_Q
#define SX_FLOATS (DIRECT_M_MAX * 2 * (SX_MAX_K / 32))
#else
#define SX_FLOATS 1 /* no direct kernels, no x block sums */
#endif

int kern_cpu_matmul(float *y, const float *x, const void *w, enum dtype wt, const float *bias, int m, int n,
                    int k, struct tpool *tp)
{
    int st = mm_check(y, x, w, wt, m, n, k);
    if (st) return st;
    struct mm_ctx c;
    float sx[SX_FLOATS];
    int n_tasks = mm_prepare(&c, y, x, w, wt, bias, m, n, k, tp, sx);
    tpool_run(tp, mm_task, &c, n_tasks);
    return FERRY_OK;
}

struct mm_multi {
    struct mm_ctx c[KERN_CPU_MM_MAX_JOBS];
    int first[KERN_CPU_MM_MAX_JOBS + 1]; /* task index where each job's tasks start */
    int n_jobs;
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
    if (n_jobs <= 0 || n_jobs > KERN_CPU_MM_MAX_JOBS) return FERRY_ERR_INVALID;
    for (int j = 0; j < n_jobs; j++) {
        int st = mm_check(jobs[j].y, x, jobs[j].w, jobs[j].wt, m, jobs[j].n, k);
        if (st) return st;
    }
    struct mm_multi mm = {.n_jobs = n_jobs};
    float sx[KERN_CPU_MM_MAX_JOBS][SX_FLOATS];
    for (int j = 0; j < n_jobs; j++)
        mm.first[j + 1] = mm.first[j] + mm_prepare(&mm.c[j], jobs[j].y, x, jobs[j].w, jobs[j].wt,
                                                   jobs[j].bias, m, jobs[j].n, k, tp, sx[j]);
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
