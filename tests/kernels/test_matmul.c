/* kern_cpu_matmul against references, for every stored type, at odd shapes (n odd, k = 32·odd or 256·odd for
 * quantized types, longer than one 1024-column chunk and not a multiple of it; k odd for plain ones) and
 * m in 1..8 (speculative decoding verifies up to 8 rows of a sequence in a step), 13, 16, 17, 33, 64 (and 65,
 * 130: past a task's 64 rows), with and without bias; bitwise determinism; and the thread pool itself.
 *
 * Tolerances, from the arithmetic (eps = 2^-24, one f32 rounding):
 *  - f32 arithmetic: kernel and kern_cpu_matmul_ref multiply the same weights, f32 against double sums. Plain
 *    types (|x|, |w| <= 1, k <= 8192): |got - ref| <= 1e-4·max(1, sqrt(k/512)) + 1e-5·|ref| (the sums'
 *    rounding, ~sqrt(k)·eps·Σ|x·w| with random signs, reached 1.15e-4 at k = 2048 on an AVX2 host); quantized
 * types (random K-quant bytes: |w| up to ~60) and longer rows: the worst case (k/4 + 17)·eps·Σ|x·w|
 * (check_f32).
 *  - Quantized types (x quantized to int8 blocks of 32, matmul.c's first comment), two checks:
 *    (1) against q8_ref, this file's double evaluation of the documented arithmetic (x̂ = dx·q with dx, q
 *        computed by the documented f32 rule, times the exactly dequantized weights): only f32 rounding
 *        separates them: |got - q8_ref| <= 4·(k/32 + 16)·eps·L, L = Σ (|w| + max|w| of its block)·|x̂|
 *        (lanes of about k/32 fused steps each, the reduction, the product s·dx, and the split of affine
 *        weights into s·code + mn, whose parts may exceed |w|). One code off by one in one element moves y
 *        by about L/(8k), 30x more than this bound at k = 1184.
 *    (2) against the f64 oracle kern_cpu_matmul_ref (exact x): |got - ref| <= Σ_e |w_e|·(dx_b/2 +
 * 4·eps·|x_e|)
 *        + the bound of (1): x's rounding is at most half a step of its block.
 *    Bitwise, for quantized types: every pool size, every instruction set the CPU has against plain C, and
 *    (int8 arithmetic) each row of a batch against that row alone (m = 1).
 */
#include "kt_common.h"

#include <time.h>

#include "kernels/core/status.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/thread_buf.h"
#include "kernels/cpu/threadpool.h"
#include "quant/blocks.h"
#include "quant/dtype.h"
#include "quant/fp16.h"

#define EPS 0x1.0p-24

/* The types ferry reads but does not write: random bytes (every code, grid index and sign) with sane scales
 * (f16 d of 0.001-0.01, MXFP4 exponents 2^-10..2^-3, NVFP4 scales mostly below 1: every UE4M3 form). */
static void random_lut_row(enum dtype t, uint8_t *wr, int k)
{
    const size_t bsz = dtype_type_size(t), nb = (size_t)(k / dtype_block_size(t));
    for (size_t b = 0; b < bsz * nb; b++) wr[b] = (uint8_t)kt_next();
    for (size_t b = 0; b < nb; b++) {
        uint8_t *bp = wr + b * bsz;
        const uint16_t d = f32_to_f16(kt_uniform(0.001f, 0.01f));
        switch (t) {
        case DTYPE_Q2_K:
            memcpy(bp + offsetof(struct block_q2_k, d), &d, 2);
            memcpy(bp + offsetof(struct block_q2_k, dmin), &d, 2);
            break;
        case DTYPE_Q3_K:
            memcpy(bp + offsetof(struct block_q3_k, d), &d, 2);
            break;
        case DTYPE_MXFP4:
            bp[0] = (uint8_t)(118 + kt_next() % 8);
            break;
        case DTYPE_NVFP4: /* mostly below 1; one in 8 any byte (exponents to 15, the sign bit), some 0x7F */
            for (int s = 0; s < 4; s++) bp[s] = (uint8_t)(kt_next() % 8 ? kt_next() % 0x38 : kt_next());
            if (b % 13 == 5) bp[b % 4] = 0x7F;
            break;
        case DTYPE_IQ1_M: {
            uint16_t sc[4];
            memcpy(sc, bp + offsetof(struct block_iq1_m, scales), 8);
            for (int i = 0; i < 4; i++) sc[i] = (uint16_t)((sc[i] & 0x0fff) | ((d >> (4 * i)) & 15) << 12);
            memcpy(bp + offsetof(struct block_iq1_m, scales), sc, 8);
            break;
        }
        default: /* f16 d first */
            memcpy(bp, &d, 2);
            break;
        }
    }
}

/* A random (n, k) weight of type t: plain types from uniform floats, Q4_0/Q4_1/Q5_* through dtype_from_f32,
 * Q8_0 and the K-quants as random bytes (every code, Q8_0's -128 included) with sane f16 scales, the table
 * and grid types by random_lut_row. */
static void *random_weight(enum dtype t, int n, int k)
{
    const size_t rb = dtype_row_size(t, k);
    uint8_t *w = malloc(rb * n);
    float *row = malloc(sizeof(float) * k);
    for (int j = 0; j < n; j++) {
        uint8_t *wr = w + rb * j;
        kt_fill(row, k, -1.0f, 1.0f);
        switch (t) {
        case DTYPE_Q8_0:
            for (size_t b = 0; b < rb; b++) wr[b] = (uint8_t)kt_next();
            for (int b = 0; b < k / 32; b++) {
                struct block_q8_0 *bl = (struct block_q8_0 *)wr + b;
                bl->d = f32_to_f16(kt_uniform(0.001f, 0.01f));
            }
            break;
        case DTYPE_Q4_K:
        case DTYPE_Q5_K: /* the same d, dmin, scales at the front; random 5th bits and nibbles */
            for (size_t b = 0; b < rb; b++) wr[b] = (uint8_t)kt_next();
            for (int b = 0; b < k / 256; b++) {
                struct block_q4_k *bl = (struct block_q4_k *)(wr + (size_t)b * dtype_type_size(t));
                bl->d = f32_to_f16(kt_uniform(0.001f, 0.03f));
                bl->dmin = f32_to_f16(kt_uniform(0.001f, 0.03f));
            }
            break;
        case DTYPE_Q6_K:
            for (size_t b = 0; b < rb; b++) wr[b] = (uint8_t)kt_next();
            for (int b = 0; b < k / 256; b++) {
                struct block_q6_k *bl = (struct block_q6_k *)(wr + (size_t)b * sizeof(struct block_q6_k));
                bl->d = f32_to_f16(kt_uniform(-0.0005f, 0.0005f));
            }
            break;
        default:
            if (!dtype_get_traits(t)->is_quantized || t == DTYPE_Q4_0 || t == DTYPE_Q4_1 || t == DTYPE_Q5_0 ||
                t == DTYPE_Q5_1)
                cr_assert(dtype_from_f32(t, row, wr, k));
            else
                random_lut_row(t, wr, k);
            break;
        }
    }
    free(row);
    return w;
}

/* x (m, k): uniform in [-1, 1]; row 1 (when m > 1) gets one large element per 100 (an outlier channel), and
 * row 2 (when m > 2) is zero in its first block. */
static float *random_x(int m, int k)
{
    float *x = malloc(sizeof(float) * m * k);
    kt_fill(x, (size_t)m * k, -1.0f, 1.0f);
    if (m > 1)
        for (int c = 0; c < k; c += 100) x[k + c] = 40.0f;
    if (m > 2)
        for (int c = 0; c < 32 && c < k; c++) x[2 * k + c] = 0.0f;
    return x;
}

/* x̂ = dx·q by the documented rule, in f32 exactly as the kernels compute it. */
static void q8_round(const float *x, int k, double *xh, double *half_step)
{
    for (int b = 0; b < k / 32; b++) {
        float amax = 0.0f;
        for (int e = 0; e < 32; e++) amax = fmaxf(amax, fabsf(x[32 * b + e]));
        const float dx = amax < 1e-30f ? 0.0f : amax / 127.0f;
        const float id = amax < 1e-30f ? 0.0f : 127.0f / amax;
        for (int e = 0; e < 32; e++) {
            const float q = nearbyintf(x[32 * b + e] * id);
            xh[32 * b + e] = (double)dx * q;
            half_step[32 * b + e] = dx / 2.0;
        }
    }
}

/* Checks a quantized type's product y (m, n) against q8_ref and the oracle ref (both computed here). */
static void check_quantized(const char *what, enum dtype t, const float *y, const float *ref, const float *x,
                            const void *w, const float *bias, int m, int n, int k)
{
    const size_t rb = dtype_row_size(t, k);
    const int bs = dtype_block_size(t);
    float *wr = malloc(sizeof(float) * k);
    double *xh = malloc(sizeof(double) * k), *hs = malloc(sizeof(double) * k);
    for (int i = 0; i < m; i++) {
        q8_round(x + (size_t)i * k, k, xh, hs);
        for (int j = 0; j < n; j++) {
            cr_assert(dtype_to_f32(t, (const uint8_t *)w + rb * j, wr, k));
            double q8 = bias ? bias[j] : 0.0, l1 = 0, xerr = 0;
            for (int b = 0; b < k / bs; b++) {
                double wmax = 0;
                for (int e = b * bs; e < (b + 1) * bs; e++) wmax = fmax(wmax, fabs(wr[e]));
                for (int e = b * bs; e < (b + 1) * bs; e++) {
                    q8 += wr[e] * xh[e];
                    l1 += (fabs(wr[e]) + wmax) * fabs(xh[e]);
                    xerr += fabs(wr[e]) * (hs[e] + 4 * EPS * fabs(x[(size_t)i * k + e]));
                }
            }
            const double got = y[(size_t)i * n + j], tol1 = 4 * (k / 32 + 16) * EPS * l1 + 1e-30;
            cr_assert(fabs(got - q8) <= tol1,
                      "%s [%d,%d]: got %.9g, int8 arithmetic gives %.9g (|diff| %.3g > %.3g)", what, i, j,
                      got, q8, fabs(got - q8), tol1);
            const double r = ref[(size_t)i * n + j];
            cr_assert(fabs(got - r) <= xerr + tol1 + 2 * EPS * fabs(r),
                      "%s [%d,%d]: got %.9g, exact x gives %.9g (|diff| %.3g > bound %.3g)", what, i, j, got,
                      r, fabs(got - r), xerr + tol1);
        }
    }
    free(wr);
    free(xh);
    free(hs);
}

/* f32 sums against double ones. Plain types (|x|, |w| <= 1): the fixed tolerance in the first comment.
 * Quantized types in the f32 arithmetic (random K-quant bytes give |w| up to ~60) and long rows: the derived
 * bound (k/4 + 17)·eps·Σ|x·w| (at most k/4 sequential f32 steps per lane with 4-lane vectors, the lane and
 * chunk reductions, and one rounding of each weight that ggml rounds twice, d·q then + m). */
static void check_f32(const char *what, enum dtype t, const float *y, const float *ref, const float *x,
                      const void *w, int m, int n, int k)
{
    if (k <= 8192 && !dtype_get_traits(t)->is_quantized) {
        /* random signs: the sums' rounding grows as sqrt(k) (BF16 m=5 k=2048 on an AVX2 host: 1.15e-4) */
        kt_check_close(what, y, ref, (size_t)m * n, k > 512 ? 1e-4 * sqrt(k / 512.0) : 1e-4, 1e-5);
        return;
    }
    const size_t rb = dtype_row_size(t, k);
    float *wr = malloc(sizeof(float) * k);
    for (int j = 0; j < n; j++) {
        cr_assert(dtype_to_f32(t, (const uint8_t *)w + rb * j, wr, k));
        for (int i = 0; i < m; i++) {
            double l1 = 0;
            for (int c = 0; c < k; c++) l1 += fabs((double)x[(size_t)i * k + c] * wr[c]);
            const double e = fabs((double)y[(size_t)i * n + j] - ref[(size_t)i * n + j]);
            const double tol = (k / 4 + 17) * EPS * l1 + 1e-6;
            cr_assert(e <= tol, "%s [%d,%d]: got %.9g ref %.9g (|diff| %.3g > %.3g; sum |x w| %.4g)", what, i,
                      j, y[(size_t)i * n + j], ref[(size_t)i * n + j], e, tol, l1);
        }
    }
    free(wr);
}

static int quantized(enum dtype t)
{
    return dtype_get_traits(t)->is_quantized;
}

/* One shape: the reference checks, then the bitwise ones; quantized types in both arithmetics. */
static void check_shape(enum dtype t, int m, int n, int k, struct tpool *tp2, struct tpool *tp3)
{
    void *w = random_weight(t, n, k);
    float *x = random_x(m, k), *bias = malloc(sizeof(float) * n);
    float *y = malloc(sizeof(float) * m * n), *y2 = malloc(sizeof(float) * m * n);
    float *ref = malloc(sizeof(float) * m * n), *row = malloc(sizeof(float) * n);
    kt_fill(bias, n, -2.0f, 2.0f);
    const enum kern_cpu_isa best = kern_cpu_isa_best();
    const enum kern_cpu_act act0 = kern_cpu_matmul_act();
    for (int act = 0; act < (quantized(t) ? KERN_CPU_ACT_COUNT : 1); act++)
        for (int with_bias = 0; with_bias < 2; with_bias++) {
            kern_cpu_matmul_set_act((enum kern_cpu_act)act);
            const int int8 = quantized(t) && act == KERN_CPU_ACT_INT8;
            const float *b = with_bias ? bias : NULL;
            char what[160];
            snprintf(what, sizeof what, "matmul %s m=%d n=%d k=%d bias=%d (%s, %s)", dtype_name(t), m, n, k,
                     with_bias, int8 ? "int8" : "f32", kern_cpu_isa_name(kern_cpu_isa_current()));
            for (size_t e = 0; e < (size_t)m * n; e++) y[e] = NAN; /* an element never written fails */
            cr_assert_eq(kern_cpu_matmul_ref(ref, x, w, t, b, m, n, k), FERRY_OK);
            cr_assert_eq(kern_cpu_matmul(y, x, w, t, b, m, n, k, tp2), FERRY_OK);
            if (int8)
                check_quantized(what, t, y, ref, x, w, b, m, n, k);
            else
                check_f32(what, t, y, ref, x, w, m, n, k);
            /* Same pool twice, one thread, three threads: bitwise equal. */
            cr_assert_eq(kern_cpu_matmul(y2, x, w, t, b, m, n, k, tp2), FERRY_OK);
            cr_assert(memcmp(y, y2, sizeof(float) * m * n) == 0, "%s: two runs differ", what);
            cr_assert_eq(kern_cpu_matmul(y2, x, w, t, b, m, n, k, NULL), FERRY_OK);
            cr_assert(memcmp(y, y2, sizeof(float) * m * n) == 0, "%s: 1 vs 2 threads differ", what);
            cr_assert_eq(kern_cpu_matmul(y2, x, w, t, b, m, n, k, tp3), FERRY_OK);
            cr_assert(memcmp(y, y2, sizeof(float) * m * n) == 0, "%s: 3 vs 2 threads differ", what);
            if (!quantized(t)) continue;
            /* Every instruction set below the best gives the same bits (plain C is the definition). */
            for (int isa = KERN_CPU_ISA_PORTABLE; isa < (int)best; isa++) {
                if (kern_cpu_isa_limit((enum kern_cpu_isa)isa) != (enum kern_cpu_isa)isa) continue;
                cr_assert_eq(kern_cpu_matmul(y2, x, w, t, b, m, n, k, tp2), FERRY_OK);
                kern_cpu_isa_limit(best);
                cr_assert(memcmp(y, y2, sizeof(float) * m * n) == 0, "%s: %s differs from %s", what,
                          kern_cpu_isa_name((enum kern_cpu_isa)isa), kern_cpu_isa_name(best));
            }
            kern_cpu_isa_limit(best);
            /* Batch invariance (int8 arithmetic): each row alone gives the bits it has in the batch. */
            for (int i = 0; i < m && int8; i++) {
                cr_assert_eq(kern_cpu_matmul(row, x + (size_t)i * k, w, t, b, 1, n, k, tp2), FERRY_OK);
                cr_assert(memcmp(row, y + (size_t)i * n, sizeof(float) * n) == 0, "%s: row %d alone differs",
                          what, i);
            }
        }
    kern_cpu_matmul_set_act(act0);
    free(w);
    free(x);
    free(bias);
    free(y);
    free(y2);
    free(ref);
    free(row);
}

static const int ms[] = {1, 2, 3, 4, 5, 6, 7, 8, 13, 16, 17, 33, 64};
#define N_OF(a) (int)(sizeof(a) / sizeof((a)[0]))

/* Every m at one odd shape of more than one chunk, then shapes that stress other paths. */
static void check_type(enum dtype t)
{
    struct tpool *tp2, *tp3;
    cr_assert_eq(tpool_init(&tp2, 2), FERRY_OK);
    cr_assert_eq(tpool_init(&tp3, 3), FERRY_OK);
    kt_seed((uint64_t)t * 1000 + 7);
    const int bs = dtype_block_size(t);
    const int k_main = bs == 1 ? 1001 : bs == 32 ? 32 * 37 : 256 * 5;
    for (int i = 0; i < N_OF(ms); i++) check_shape(t, ms[i], 37, k_main, tp2, tp3);
    /* Past a task's 64 rows; a single row of W; n smaller than a group; long rows (16 chunks and a tail). */
    check_shape(t, 130, 13, k_main, tp2, tp3);
    check_shape(t, 65, 1, bs == 1 ? 333 : bs == 32 ? 32 * 5 : 256, tp2, tp3);
    check_shape(t, 3, 2, bs == 1 ? 7 : bs, tp2, tp3);
    check_shape(t, 2, 5, bs == 1 ? 4099 * 4 + 1 : bs == 32 ? 32 * 521 : 256 * 65, tp2, tp3);
    /* Up to 16 rows of x on a pool of 8: tasks of 64 rows or more (128 KiB of W), the last short of a group.
     */
    struct tpool *tp8;
    cr_assert_eq(tpool_init(&tp8, 8), FERRY_OK);
    check_shape(t, 1, 1003, 2048, tp8, tp3);
    check_shape(t, 5, 1003, 2048, tp8, tp3);
    tpool_free(tp8);
    tpool_free(tp2);
    tpool_free(tp3);
}

Test(matmul, f32)
{
    check_type(DTYPE_F32);
}
Test(matmul, f16)
{
    check_type(DTYPE_F16);
}
Test(matmul, bf16)
{
    check_type(DTYPE_BF16);
}
Test(matmul, q8_0)
{
    check_type(DTYPE_Q8_0);
}
Test(matmul, q4_0)
{
    check_type(DTYPE_Q4_0);
}
Test(matmul, q4_1)
{
    check_type(DTYPE_Q4_1);
}
Test(matmul, q5_0)
{
    check_type(DTYPE_Q5_0);
}
Test(matmul, q5_1)
{
    check_type(DTYPE_Q5_1);
}
Test(matmul, q4_k)
{
    check_type(DTYPE_Q4_K);
}
Test(matmul, q5_k)
{
    check_type(DTYPE_Q5_K);
}
Test(matmul, q6_k)
{
    check_type(DTYPE_Q6_K);
}

/* The types of matmul_lut.c: every m and shape of check_type. */
#define LUT_TEST(t, nm)                                                                                      \
    Test(matmul, t, .timeout = 120)                                                                          \
    {                                                                                                        \
        check_type(DTYPE_##nm);                                                                              \
    }
LUT_TEST(q2_k, Q2_K)
LUT_TEST(q3_k, Q3_K)
LUT_TEST(iq4_nl, IQ4_NL)
LUT_TEST(iq4_xs, IQ4_XS)
LUT_TEST(mxfp4, MXFP4)
LUT_TEST(nvfp4, NVFP4)
LUT_TEST(iq2_xxs, IQ2_XXS)
LUT_TEST(iq2_xs, IQ2_XS)
LUT_TEST(iq2_s, IQ2_S)
LUT_TEST(iq3_xxs, IQ3_XXS)
LUT_TEST(iq3_s, IQ3_S)
LUT_TEST(iq1_s, IQ1_S)
LUT_TEST(iq1_m, IQ1_M)

/* The int8 products of 1 and 2 rows of x with Q4_1, Q4_K, Q5_K or Q6_K weights on AVX512-VNNI (Q4_K and
 * Q5_K also on AVX-VNNI and AVX2) read the codes in place (matmul.c's direct kernels); batches of 3 or
 * more decode them into a tile (Q4_K and Q5_K on AVX512-VNNI: read in place at every m, 4 rows of x per
 * call), and the portable C always does. All must agree bitwise: each row of a 3-row batch equals that row
 * alone and the first two rows as a batch of 2, the first 3 rows of a 7-row batch the 3-row batch, and every
 * instruction set gives the same bits (its 1 and 2 rows, its 3-row and 7-row batches); and each against the
 * references (check_quantized). Shapes: n below, at and past a group of 4 and not a multiple of a task's
 * rows, k of one super-block up to 43 (11008: ten 1024-column chunks and a short one), pools of 1, 2 and 3
 * threads. Q8_0 takes the tile at every m (its in-place kernels were slower from memory:
 * kernels/cpu/NOTES.md, 2026-12-02h) and is held, as Q4_0 and Q4_1 are, to the same checks at odd block
 * counts, 1 to 343 (ten chunks and 23 blocks). */
static void check_small_m_equals_tile(enum dtype t)
{
    struct tpool *tp2, *tp3;
    cr_assert_eq(tpool_init(&tp2, 2), FERRY_OK);
    cr_assert_eq(tpool_init(&tp3, 3), FERRY_OK);
    const enum kern_cpu_act act0 = kern_cpu_matmul_act();
    const enum kern_cpu_isa best = kern_cpu_isa_best();
    kern_cpu_matmul_set_act(KERN_CPU_ACT_INT8);
    kt_seed(4242 + (uint64_t)t);
    const int ns[] = {1, 3, 4, 6, 67, 133}, ks[] = {256, 256 * 3, 256 * 4, 256 * 9, 256 * 43};
    const int ks32[] = {32, 32 * 3, 32 * 37, 32 * 33, 32 * 343};
    const int bs = dtype_block_size(t);
    for (int ni = 0; ni < N_OF(ns); ni++)
        for (int ki = 0; ki < N_OF(ks); ki++) {
            const int n = ns[ni], k = bs == 32 ? ks32[ki] : ks[ki];
            void *w = random_weight(t, n, k);
            float *x = random_x(7, k), *bias = malloc(sizeof(float) * n);
            float *y3 = malloc(sizeof(float) * 3 * n), *y = malloc(sizeof(float) * 2 * n);
            float *y2 = malloc(sizeof(float) * 2 * n), *ref = malloc(sizeof(float) * 3 * n);
            kt_fill(bias, n, -2.0f, 2.0f);
            char what[128];
            snprintf(what, sizeof what, "%s int8 n=%d k=%d (%s)", dtype_name(t), n, k,
                     kern_cpu_isa_name(best));
            cr_assert_eq(kern_cpu_matmul(y3, x, w, t, bias, 3, n, k, tp2), FERRY_OK);
            for (int m = 1; m <= 2; m++) {
                for (size_t e = 0; e < (size_t)m * n; e++) y[e] = NAN;
                cr_assert_eq(kern_cpu_matmul(y, x, w, t, bias, m, n, k, tp3), FERRY_OK);
                cr_assert_eq(kern_cpu_matmul_ref(ref, x, w, t, bias, m, n, k), FERRY_OK);
                check_quantized(what, t, y, ref, x, w, bias, m, n, k);
                cr_assert(memcmp(y, y3, sizeof(float) * m * n) == 0, "%s: %d rows differ from a batch of 3",
                          what, m);
                cr_assert_eq(kern_cpu_matmul(y2, x, w, t, bias, m, n, k, NULL), FERRY_OK);
                cr_assert(memcmp(y, y2, sizeof(float) * m * n) == 0, "%s: m=%d, 1 vs 3 threads", what, m);
                for (int isa = KERN_CPU_ISA_PORTABLE; isa < (int)best; isa++) {
                    if (kern_cpu_isa_limit((enum kern_cpu_isa)isa) != (enum kern_cpu_isa)isa) continue;
                    cr_assert_eq(kern_cpu_matmul(y2, x, w, t, bias, m, n, k, tp2), FERRY_OK);
                    kern_cpu_isa_limit(best);
                    cr_assert(memcmp(y, y2, sizeof(float) * m * n) == 0, "%s: m=%d, %s differs", what, m,
                              kern_cpu_isa_name((enum kern_cpu_isa)isa));
                }
                kern_cpu_isa_limit(best);
            }
            cr_assert_eq(kern_cpu_matmul(y, x + k, w, t, bias, 1, n, k, tp2), FERRY_OK);
            cr_assert(memcmp(y, y3 + n, sizeof(float) * n) == 0, "%s: row 1 alone differs", what);
            for (int isa = KERN_CPU_ISA_PORTABLE; isa < (int)best; isa++) { /* the tile on every ISA */
                if (kern_cpu_isa_limit((enum kern_cpu_isa)isa) != (enum kern_cpu_isa)isa) continue;
                cr_assert_eq(kern_cpu_matmul(ref, x, w, t, bias, 3, n, k, tp2), FERRY_OK);
                kern_cpu_isa_limit(best);
                cr_assert(memcmp(ref, y3, sizeof(float) * 3 * n) == 0, "%s: 3 rows on %s differ", what,
                          kern_cpu_isa_name((enum kern_cpu_isa)isa));
            }
            kern_cpu_isa_limit(best);
            /* 7 rows (a call of 4 x rows and one of 3 where the direct kernels serve every m): the first 3
             * rows are the 3-row batch's, and every instruction set's tile gives the same bits */
            float *y7 = malloc(sizeof(float) * 7 * n), *t7 = malloc(sizeof(float) * 7 * n);
            cr_assert_eq(kern_cpu_matmul(y7, x, w, t, bias, 7, n, k, tp3), FERRY_OK);
            cr_assert(memcmp(y7, y3, sizeof(float) * 3 * n) == 0, "%s: 7-row batch differs from 3", what);
            for (int isa = KERN_CPU_ISA_PORTABLE; isa < (int)best; isa++) {
                if (kern_cpu_isa_limit((enum kern_cpu_isa)isa) != (enum kern_cpu_isa)isa) continue;
                cr_assert_eq(kern_cpu_matmul(t7, x, w, t, bias, 7, n, k, tp2), FERRY_OK);
                kern_cpu_isa_limit(best);
                cr_assert(memcmp(t7, y7, sizeof(float) * 7 * n) == 0, "%s: 7 rows on %s differ", what,
                          kern_cpu_isa_name((enum kern_cpu_isa)isa));
            }
            kern_cpu_isa_limit(best);
            free(y7);
            free(t7);
            free(w);
            free(x);
            free(bias);
            free(y3);
            free(y);
            free(y2);
            free(ref);
        }
    kern_cpu_matmul_set_act(act0);
    tpool_free(tp2);
    tpool_free(tp3);
}

Test(matmul, q8_0_int8_small_m_equals_tile)
{
    check_small_m_equals_tile(DTYPE_Q8_0);
}
/* Q4_1's nibbles are read in place on AVX512-VNNI (minimums through sxd); Q4_0 (offset 8 through n4) takes
 * the tile at every m and is held to the same checks. */
Test(matmul, q4_0_int8_small_m_equals_tile)
{
    check_small_m_equals_tile(DTYPE_Q4_0);
}
Test(matmul, q4_1_int8_small_m_equals_tile)
{
    check_small_m_equals_tile(DTYPE_Q4_1);
}
Test(matmul, q4_k_int8_small_m_equals_tile)
{
    check_small_m_equals_tile(DTYPE_Q4_K);
}
/* Q5_K: the fifth bits of qh (random in random_weight) put on the nibbles in place as the decoder does. */
Test(matmul, q5_k_int8_small_m_equals_tile)
{
    check_small_m_equals_tile(DTYPE_Q5_K);
}
Test(matmul, q6_k_int8_small_m_equals_tile)
{
    check_small_m_equals_tile(DTYPE_Q6_K);
}

/* A weight row's output does not depend on whether its group of 4 rows is full (q8_task's last step takes
 * four outputs at once, and the many-row kernels leave a packed accumulator) or the short last group of a
 * product (one output at a time): W's first 33 rows against its 37, so row 32 is alone in the first product
 * and in a full group in the second, and rows 28-31 fill the last full group of both. Both arithmetics, the
 * in-place and tile kernels (m 1, 2, 7, 70: past MBQ), one pool, bitwise. */
static void check_tail_group(enum dtype t)
{
    struct tpool *tp2;
    cr_assert_eq(tpool_init(&tp2, 2), FERRY_OK);
    kt_seed((uint64_t)t * 1000 + 13);
    const int k = dtype_block_size(t) == 256 ? 256 * 5 : 32 * 37, nf = 37, nt = 33;
    void *w = random_weight(t, nf, k);
    const enum kern_cpu_act act0 = kern_cpu_matmul_act();
    const int mm[] = {1, 2, 7, 70};
    for (int act = 0; act < KERN_CPU_ACT_COUNT; act++)
        for (int mi = 0; mi < N_OF(mm); mi++) {
            const int m = mm[mi];
            kern_cpu_matmul_set_act((enum kern_cpu_act)act);
            float *x = random_x(m, k), *yf = malloc(sizeof(float) * m * nf),
                  *yt = malloc(sizeof(float) * m * nt);
            cr_assert_eq(kern_cpu_matmul(yf, x, w, t, NULL, m, nf, k, tp2), FERRY_OK);
            cr_assert_eq(kern_cpu_matmul(yt, x, w, t, NULL, m, nt, k, tp2), FERRY_OK);
            for (int i = 0; i < m; i++)
                cr_assert(memcmp(yf + (size_t)i * nf, yt + (size_t)i * nt, sizeof(float) * nt) == 0,
                          "%s m=%d row %d (%s): 33 rows differ from the first 33 of 37", dtype_name(t), m, i,
                          act == KERN_CPU_ACT_INT8 ? "int8" : "f32");
            free(x);
            free(yf);
            free(yt);
        }
    kern_cpu_matmul_set_act(act0);
    free(w);
    tpool_free(tp2);
}

Test(matmul, tail_group_equals_full_group)
{
    const enum dtype ts[] = {DTYPE_Q8_0, DTYPE_Q4_0, DTYPE_Q4_1, DTYPE_Q4_K,
                             DTYPE_Q5_K, DTYPE_Q6_K, DTYPE_Q2_K};
    for (int i = 0; i < N_OF(ts); i++) check_tail_group(ts[i]);
}

/* Blocks from llama.cpp's own quantizers (tests/kernels/data/<T>.pq.blocks, and llama.cpp's dequantized
 * values of them, <T>.pq.deq: make_iquant_fixtures.py), whose codes, scales and signs are distributed as real
 * files' are rather than as random bytes. An (n, k) weight at odd shapes is tiled from the fixture's blocks
 * (block b of row j is fixture block 7j + b mod their count, so rows differ) and checked, int8 arithmetic,
 * against the documented arithmetic on llama.cpp's values: |y - Σ w·x̂| <= check_quantized's bound (1), with w
 * from llama.cpp's dequantization (not ferry's); f32 arithmetic against Σ w·x within check_f32's bound; and
 * every instruction set bitwise equal to plain C in both. Shapes: k of one chunk and a tail (1,280) and of
 * ten chunks and a tail (10,496), n below and past a group of 4, m 1 to 17. */
static void check_peer_blocks(enum dtype t, const char *name)
{
    char pq[64];
    snprintf(pq, sizeof pq, "%s.pq", name);
    size_t lb, ld;
    uint8_t *blocks;
    float *deq;
    KT_LOAD_BLOCKS(blocks, deq, pq, lb, ld);
    const size_t bsz = dtype_type_size(t);
    const int bs = dtype_block_size(t), nblk = (int)(lb / bsz);
    cr_assert(nblk > 0 && lb == (size_t)nblk * bsz && ld == (size_t)nblk * bs * sizeof(float), "%s: sizes",
              name);
    struct tpool *tp2;
    cr_assert_eq(tpool_init(&tp2, 2), FERRY_OK);
    const enum kern_cpu_act act0 = kern_cpu_matmul_act();
    const enum kern_cpu_isa best = kern_cpu_isa_best();
    kt_seed(777 + (uint64_t)t);
    const int shapes[][3] = {{1, 37, 1280}, {2, 5, 1280}, {3, 37, 1280}, {5, 13, 10496}, {17, 7, 1280}};
    for (int si = 0; si < N_OF(shapes); si++) {
        const int m = shapes[si][0], n = shapes[si][1], k = shapes[si][2], nbr = k / bs;
        const size_t rb = dtype_row_size(t, k);
        uint8_t *w = malloc(rb * n);
        float *wf = malloc(sizeof(float) * n * k), *x = random_x(m, k);
        float *y = malloc(sizeof(float) * m * n), *y2 = malloc(sizeof(float) * m * n);
        double *xh = malloc(sizeof(double) * k), *hs = malloc(sizeof(double) * k);
        for (int j = 0; j < n; j++)
            for (int b = 0; b < nbr; b++) {
                const int src = (7 * j + b) % nblk;
                memcpy(w + rb * j + bsz * b, blocks + bsz * src, bsz);
                memcpy(wf + (size_t)k * j + bs * b, deq + (size_t)bs * src, sizeof(float) * bs);
            }
        for (int act = 0; act < KERN_CPU_ACT_COUNT; act++) {
            kern_cpu_matmul_set_act((enum kern_cpu_act)act);
            for (size_t e = 0; e < (size_t)m * n; e++) y[e] = NAN;
            cr_assert_eq(kern_cpu_matmul(y, x, w, t, NULL, m, n, k, tp2), FERRY_OK);
            for (int i = 0; i < m; i++) {
                const float *xr = x + (size_t)i * k;
                q8_round(xr, k, xh, hs);
                for (int j = 0; j < n; j++) {
                    const float *wr = wf + (size_t)k * j;
                    double want = 0, l1 = 0, tol;
                    if (act == KERN_CPU_ACT_INT8) {
                        for (int b = 0; b < k / 32; b++) {
                            double wmax = 0;
                            for (int e = 32 * b; e < 32 * b + 32; e++) wmax = fmax(wmax, fabs(wr[e]));
                            for (int e = 32 * b; e < 32 * b + 32; e++) {
                                want += wr[e] * xh[e];
                                l1 += (fabs(wr[e]) + wmax) * fabs(xh[e]);
                            }
                        }
                        tol = 4 * (k / 32 + 16) * EPS * l1 + 1e-30;
                    } else {
                        for (int e = 0; e < k; e++) {
                            want += (double)wr[e] * xr[e];
                            l1 += fabs((double)wr[e] * xr[e]);
                        }
                        tol = (k / 4 + 17) * EPS * l1 + 1e-6;
                    }
                    const double got = y[(size_t)i * n + j];
                    cr_assert(
                        fabs(got - want) <= tol,
                        "%s llama.cpp blocks, %s, m=%d n=%d k=%d [%d,%d]: got %.9g, want %.9g (|diff| %.3g > "
                        "%.3g)",
                        name, act == KERN_CPU_ACT_INT8 ? "int8" : "f32", m, n, k, i, j, got, want,
                        fabs(got - want), tol);
                }
            }
            for (int isa = KERN_CPU_ISA_PORTABLE; isa < (int)best; isa++) {
                if (kern_cpu_isa_limit((enum kern_cpu_isa)isa) != (enum kern_cpu_isa)isa) continue;
                cr_assert_eq(kern_cpu_matmul(y2, x, w, t, NULL, m, n, k, tp2), FERRY_OK);
                kern_cpu_isa_limit(best);
                cr_assert(memcmp(y, y2, sizeof(float) * m * n) == 0,
                          "%s llama.cpp blocks m=%d k=%d: %s differs", name, m, k,
                          kern_cpu_isa_name((enum kern_cpu_isa)isa));
            }
            kern_cpu_isa_limit(best);
        }
        free(w);
        free(wf);
        free(x);
        free(y);
        free(y2);
        free(xh);
        free(hs);
    }
    kern_cpu_matmul_set_act(act0);
    tpool_free(tp2);
    free(blocks);
    free(deq);
}

#define PEER_BLOCKS_TEST(t, nm)                                                                              \
    Test(matmul, t##_llama_cpp_blocks)                                                                       \
    {                                                                                                        \
        check_peer_blocks(DTYPE_##nm, #nm);                                                                  \
    }
PEER_BLOCKS_TEST(q2_k, Q2_K)
PEER_BLOCKS_TEST(q3_k, Q3_K)
PEER_BLOCKS_TEST(iq4_nl, IQ4_NL)
PEER_BLOCKS_TEST(iq4_xs, IQ4_XS)
PEER_BLOCKS_TEST(mxfp4, MXFP4)
PEER_BLOCKS_TEST(nvfp4, NVFP4)
PEER_BLOCKS_TEST(iq3_s, IQ3_S)
PEER_BLOCKS_TEST(iq2_xs, IQ2_XS)
PEER_BLOCKS_TEST(iq2_xxs, IQ2_XXS)
PEER_BLOCKS_TEST(iq2_s, IQ2_S)
PEER_BLOCKS_TEST(iq3_xxs, IQ3_XXS)
PEER_BLOCKS_TEST(iq1_s, IQ1_S)
PEER_BLOCKS_TEST(iq1_m, IQ1_M)

/* x with a NaN or an infinity in one block: that row's outputs are not finite (int8: NaN; never a silently
 * finite number), the other rows are unaffected. */
Test(matmul, nonfinite_x_gives_nan)
{
    const int n = 5, k = 256 * 2;
    const enum dtype types[] = {DTYPE_Q8_0, DTYPE_Q4_K, DTYPE_Q6_K, DTYPE_Q5_1, DTYPE_Q2_K, DTYPE_IQ4_XS};
    for (int ti = 0; ti < N_OF(types); ti++) {
        void *w = random_weight(types[ti], n, k);
        float x[3 * 256 * 2], y[3 * 5], ref[5];
        kt_fill(x, 3 * k, -1.0f, 1.0f);
        x[40] = NAN;
        x[k + 300] = INFINITY;
        for (int act = 0; act < KERN_CPU_ACT_COUNT; act++) {
            kern_cpu_matmul_set_act((enum kern_cpu_act)act);
            cr_assert_eq(kern_cpu_matmul(y, x, w, types[ti], NULL, 3, n, k, NULL), FERRY_OK);
            cr_assert_eq(kern_cpu_matmul(ref, x + 2 * k, w, types[ti], NULL, 1, n, k, NULL), FERRY_OK);
            for (int j = 0; j < n; j++) {
                cr_assert(!isfinite(y[j]) && !isfinite(y[n + j]), "%s act %d: row with NaN/inf gave %g, %g",
                          dtype_name(types[ti]), act, y[j], y[n + j]);
                cr_assert(y[2 * n + j] == ref[j]);
            }
        }
        free(w);
    }
}

/* The instruction-set controls: the best is what cpuid says, limits take effect and are undone. */
Test(matmul, isa_limit)
{
    const enum kern_cpu_isa best = kern_cpu_isa_best();
    cr_assert(best >= KERN_CPU_ISA_PORTABLE && best < KERN_CPU_ISA_COUNT);
    cr_assert_eq(kern_cpu_isa_current(), best);
    cr_assert_eq(kern_cpu_isa_limit(KERN_CPU_ISA_PORTABLE), KERN_CPU_ISA_PORTABLE);
    cr_assert_eq(kern_cpu_isa_limit(KERN_CPU_ISA_COUNT - 1), best);
    cr_assert_str_eq(kern_cpu_isa_name(KERN_CPU_ISA_PORTABLE), "portable");
    cr_assert_str_eq(kern_cpu_isa_name(KERN_CPU_ISA_COUNT), "?");
}

Test(matmul, ref_matches_hand_computed)
{
    /* y = x Wᵀ on a 2x3 by 2x3 example, so the reference itself is checked. */
    const float x[6] = {1, 2, 3, -1, 0.5f, 4}, w[6] = {0.5f, -1, 2, 3, 0, -0.25f}, bias[2] = {10, -10};
    float y[4];
    cr_assert_eq(kern_cpu_matmul_ref(y, x, w, DTYPE_F32, bias, 2, 2, 3), FERRY_OK);
    const float want[4] = {10 + 0.5f - 2 + 6, -10 + 3 - 0.75f, 10 - 0.5f - 0.5f + 8, -10 - 3 - 1};
    for (int i = 0; i < 4; i++) cr_assert_float_eq(y[i], want[i], 1e-6f, "[%d] %g vs %g", i, y[i], want[i]);
    cr_assert_eq(kern_cpu_matmul(y, x, w, DTYPE_F32, bias, 2, 2, 3, NULL), FERRY_OK);
    for (int i = 0; i < 4; i++) cr_assert_float_eq(y[i], want[i], 1e-6f);
}

/* A hand-made Q8_0 row: x quantizes exactly (multiples of max|x|/127, with max|x| = 127/8 in both blocks),
 * so the int8 arithmetic is exact (all products and sums are small multiples of 2^-4). */
Test(matmul, q8_0_hand_computed)
{
    struct block_q8_0 w[2];
    float x[64];
    for (int b = 0; b < 2; b++) {
        w[b].d = f32_to_f16(b ? 0.25f : 0.5f);
        for (int e = 0; e < 32; e++) {
            w[b].qs[e] = (int8_t)(e % 2 ? -128 + e : 127 - 3 * e); /* -128 included */
            x[32 * b + e] = (float)((e * 7 + b) % 255 - 127) * 0.125f;
        }
    }
    x[0] = 127 * 0.125f, x[32] = -127 * 0.125f;
    double want = 0;
    for (int b = 0; b < 2; b++)
        for (int e = 0; e < 32; e++) want += (b ? 0.25 : 0.5) * w[b].qs[e] * (double)x[32 * b + e];
    for (int act = 0; act < KERN_CPU_ACT_COUNT; act++) {
        float y;
        kern_cpu_matmul_set_act((enum kern_cpu_act)act);
        cr_assert_eq(kern_cpu_matmul(&y, x, w, DTYPE_Q8_0, NULL, 1, 1, 64, NULL), FERRY_OK);
        cr_assert_eq((double)y, want, "act %d: got %.9g want %.9g", act, y, want);
    }
}

Test(matmul, rejects_bad_shapes)
{
    float x[64] = {1}, y[64];
    uint8_t w[256] = {0};
    cr_assert_eq(kern_cpu_matmul(y, x, w, DTYPE_Q8_0, NULL, 1, 1, 33, NULL), FERRY_ERR_INVALID);
    cr_assert_eq(kern_cpu_matmul(y, x, w, DTYPE_F32, NULL, 0, 1, 3, NULL), FERRY_ERR_INVALID);
    cr_assert_eq(kern_cpu_matmul(y, x, w, DTYPE_F32, NULL, 1, 1, -3, NULL), FERRY_ERR_INVALID);
    cr_assert_eq(kern_cpu_matmul(y, x, w, (enum dtype)5, NULL, 1, 1, 32, NULL), FERRY_ERR_INVALID);
    cr_assert_eq(kern_cpu_matmul_ref(y, x, w, DTYPE_Q4_K, NULL, 1, 1, 32), FERRY_ERR_INVALID);
}

/* ---- thread pool ----------------------------------------------------------------------------------------
 */

struct tp_probe {
    int *count; /* (n) times each task ran */
};

static void tp_count(void *ctx, int i)
{
    struct tp_probe *p = ctx;
    __atomic_fetch_add(&p->count[i], 1, __ATOMIC_RELAXED);
}

Test(threadpool, every_task_exactly_once)
{
    for (int nt = 1; nt <= 4; nt++) {
        struct tpool *tp;
        cr_assert_eq(tpool_init(&tp, nt), FERRY_OK);
        cr_assert_eq(tpool_size(tp), nt);
        int count[1000];
        for (int rep = 0; rep < 2000; rep++) {
            const int n = (rep * 37) % 1000 + (rep % 3 == 0 ? 0 : 1);
            memset(count, 0, sizeof count);
            struct tp_probe p = {count};
            tpool_run(tp, tp_count, &p, n);
            for (int i = 0; i < n; i++)
                cr_assert_eq(count[i], 1, "nt=%d n=%d task %d ran %d times", nt, n, i, count[i]);
            for (int i = n; i < 1000; i++) cr_assert_eq(count[i], 0);
        }
        tpool_free(tp);
    }
    cr_assert_eq(tpool_size(NULL), 1);
}

/* More threads than cores (the CI machine has 2): workers are often not running when a job is published and
 * the caller takes their share; every job must still complete with each task run once. */
Test(threadpool, oversubscribed_pool)
{
    struct tpool *tp;
    cr_assert_eq(tpool_init(&tp, 8), FERRY_OK);
    int count[64];
    struct tp_probe p = {count};
    for (int rep = 0; rep < 3000; rep++) {
        memset(count, 0, sizeof count);
        tpool_run(tp, tp_count, &p, 1 + rep % 64);
        for (int i = 0; i < 1 + rep % 64; i++) cr_assert_eq(count[i], 1, "rep %d task %d", rep, i);
    }
    tpool_free(tp);
}

static void tp_sleepy(void *ctx, int i)
{
    (void)ctx;
    (void)i;
}

Test(threadpool, survives_idle_sleep_and_wakeup)
{
    /* Long enough between runs that the workers fall asleep on the futex, then get woken. */
    struct tpool *tp;
    cr_assert_eq(tpool_init(&tp, 3), FERRY_OK);
    int count[64];
    struct tp_probe p = {count};
    for (int rep = 0; rep < 5; rep++) {
        memset(count, 0, sizeof count);
        tpool_run(tp, tp_count, &p, 64);
        for (int i = 0; i < 64; i++) cr_assert_eq(count[i], 1);
        struct timespec ts = {0, 20 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    tpool_run(tp, tp_sleepy, NULL, 5);
    tpool_free(tp);
    tpool_free(NULL);
}

/* kern_cpu_matmul_multi: every job's output is bitwise what kern_cpu_matmul gives alone (same partition per
 * job), across types mixed in one call (plain and quantized, sharing one quantized x), batch sizes and a tiny
 * job that runs unsplit. */
/* The AMX tiles (KERN_CPU_PLAIN_BF16, F16 and BF16 weights, KERN_CPU_AMX_M_MIN rows or more) against the f64
 * oracle: x and W rounded to bf16 (relative 2^-9 each; BF16 weights exactly), products exact, f32 sums in an
 * order of the hardware's: |got - ref| <= (2^-8 + 2^-17 + k·eps)·Σ|x·w| + 1e-6. Bitwise the same on 1, 2 and
 * 3 threads, and each row the same in batches of other sizes (m >= the minimum); not bitwise the f32 path
 * (the tiles ran). Without AMX it skips: the VM and CI have none, the GPU machine's host (Sapphire Rapids)
 * has. */
static void check_amx(enum dtype t, int m, int n, int k, struct tpool *tp2, struct tpool *tp3)
{
    void *w = random_weight(t, n, k);
    float *x = random_x(m, k), *bias = malloc(sizeof(float) * n);
    float *y = malloc(sizeof(float) * m * n), *y2 = malloc(sizeof(float) * m * n);
    float *ref = malloc(sizeof(float) * m * n);
    kt_fill(bias, n, -2.0f, 2.0f);
    const size_t rb = dtype_row_size(t, k);
    float *wf = malloc(sizeof(float) * k);
    double worst = 0;
    kern_cpu_matmul_set_plain(KERN_CPU_PLAIN_BF16);
    for (size_t e = 0; e < (size_t)m * n; e++) y[e] = NAN;
    cr_assert_eq(kern_cpu_matmul(y, x, w, t, bias, m, n, k, tp2), FERRY_OK);
    cr_assert_eq(kern_cpu_matmul_ref(ref, x, w, t, bias, m, n, k), FERRY_OK);
    for (int j = 0; j < n; j++) {
        dtype_get_traits(t)->to_f32((const uint8_t *)w + rb * j, wf, k);
        for (int i = 0; i < m; i++) {
            double l1 = 0;
            for (int c = 0; c < k; c++) l1 += fabs((double)x[(size_t)i * k + c] * wf[c]);
            const double tol = (0x1.0p-8 + 0x1.0p-17 + k * EPS) * l1 + 1e-6;
            const double d = fabs((double)y[(size_t)i * n + j] - ref[(size_t)i * n + j]);
            cr_assert(d <= tol, "amx %s m=%d n=%d k=%d: y[%d][%d] = %.9g, ref %.9g (|d| %.3g > %.3g)",
                      dtype_name(t), m, n, k, i, j, y[(size_t)i * n + j], ref[(size_t)i * n + j], d, tol);
            if (d / (l1 + 1e-30) > worst) worst = d / (l1 + 1e-30);
        }
    }
    cr_log_info("amx %s m=%d n=%d k=%d: worst |d| / Σ|x·w| = %.3g (bound 2^-8 = %.3g)", dtype_name(t), m, n,
                k, worst, 0x1.0p-8);
    struct tpool *pools[3] = {NULL, tp2, tp3};
    for (int p = 0; p < 3; p++) {
        cr_assert_eq(kern_cpu_matmul(y2, x, w, t, bias, m, n, k, pools[p]), FERRY_OK);
        cr_assert(memcmp(y, y2, sizeof(float) * m * n) == 0, "amx %s m=%d: pool %d differs", dtype_name(t), m,
                  p);
    }
    /* The last KERN_CPU_AMX_M_MIN rows as a batch of their own: the same bits. */
    const int m2 = KERN_CPU_AMX_M_MIN, i0 = m - m2;
    cr_assert_eq(kern_cpu_matmul(y2, x + (size_t)i0 * k, w, t, bias, m2, n, k, tp3), FERRY_OK);
    cr_assert(memcmp(y + (size_t)i0 * n, y2, sizeof(float) * m2 * n) == 0,
              "amx %s m=%d: rows %d.. alone differ", dtype_name(t), m, i0);
    kern_cpu_matmul_set_plain(KERN_CPU_PLAIN_F32);
    cr_assert_eq(kern_cpu_matmul(y2, x, w, t, bias, m, n, k, tp2), FERRY_OK);
    cr_assert(memcmp(y, y2, sizeof(float) * m * n) != 0,
              "amx %s m=%d: bitwise the f32 path (tiles not used?)", dtype_name(t), m);
    free(w);
    free(x);
    free(bias);
    free(y);
    free(y2);
    free(ref);
    free(wf);
}

Test(matmul, amx_bf16_tiles)
{
    if (!kern_cpu_amx_available())
        cr_skip_test(
            "no AMX tiles on this CPU (or the OS did not grant them): the bf16 tile path is tested on "
            "the GPU machine's host (tests/gpu/all.sh)");
    struct tpool *tp2, *tp3;
    cr_assert_eq(tpool_init(&tp2, 2), FERRY_OK);
    cr_assert_eq(tpool_init(&tp3, 3), FERRY_OK);
    kt_seed(4242);
    /* m from KERN_CPU_AMX_M_MIN (32): one pair of x groups, an odd count, more than a panel of 512 */
    const int shapes[][3] = {{32, 37, 1001}, {37, 70, 96},     {33, 37, 1001}, {64, 129, 4096},
                             {130, 13, 333}, {47, 1003, 2048}, {531, 45, 160}};
    for (int t = 0; t < 2; t++)
        for (int s = 0; s < N_OF(shapes); s++)
            check_amx(t ? DTYPE_BF16 : DTYPE_F16, shapes[s][0], shapes[s][1], shapes[s][2], tp2, tp3);
    tpool_free(tp2);
    tpool_free(tp3);
}

/* thread_buf: each thread its own buffer, kept (contents too) while it is large enough, 64-byte aligned; two
 * buffers are two. */
static struct thread_buf tb_a = THREAD_BUF_INIT, tb_b = THREAD_BUF_INIT;
static void *tb_other(void *arg)
{
    (void)arg;
    return thread_buf_get(&tb_a, 100);
}

Test(thread_buf, per_thread_kept_and_grown)
{
    unsigned char *p = thread_buf_get(&tb_a, 100);
    cr_assert(p && (uintptr_t)p % 64 == 0);
    memset(p, 0x5a, 100);
    unsigned char *q = thread_buf_get(&tb_a, 60);
    cr_assert_eq(q, p, "a smaller request moved the buffer");
    for (int i = 0; i < 100; i++) cr_assert_eq(q[i], 0x5a);
    unsigned char *big = thread_buf_get(&tb_a, 1 << 20);
    cr_assert(big && (uintptr_t)big % 64 == 0);
    memset(big, 1, 1 << 20); /* all of it is the thread's (ASan checks the size) */
    void *other = thread_buf_get(&tb_b, 100);
    cr_assert(other && other != (void *)big);
    pthread_t t;
    void *theirs = NULL;
    cr_assert_eq(pthread_create(&t, NULL, tb_other, NULL), 0);
    cr_assert_eq(pthread_join(t, &theirs), 0);
    cr_assert(theirs && theirs != (void *)big, "another thread got this thread's buffer");
}

Test(matmul, multi_equals_separate_calls)
{
    struct tpool *tp = NULL;
    cr_assert_eq(tpool_init(&tp, 2), 0);
    const enum dtype mixes[][3] = {{DTYPE_F32, DTYPE_F32, DTYPE_F32},    {DTYPE_F16, DTYPE_F16, DTYPE_F16},
                                   {DTYPE_Q8_0, DTYPE_Q8_0, DTYPE_Q8_0}, {DTYPE_Q4_1, DTYPE_Q4_1, DTYPE_Q4_1},
                                   {DTYPE_Q4_K, DTYPE_Q6_K, DTYPE_Q4_K}, {DTYPE_F16, DTYPE_Q5_0, DTYPE_Q6_K}};
    const int ms3[] = {1, 3, 17};
    const int k = 256, ns[3] = {97, 33, 5};
    kt_seed(99);
    for (int mi = 0; mi < N_OF(mixes); mi++)
        for (int si = 0; si < N_OF(ms3); si++) {
            const int m = ms3[si];
            float *x = random_x(m, k);
            void *w[3];
            float *y_sep[3], *y_multi[3], *bias = malloc(sizeof(float) * 97);
            for (int i = 0; i < 97; i++) bias[i] = 0.01f * i - 0.3f;
            struct kern_cpu_mm jobs[3];
            for (int j = 0; j < 3; j++) {
                w[j] = random_weight(mixes[mi][j], ns[j], k);
                y_sep[j] = malloc(sizeof(float) * m * ns[j]);
                y_multi[j] = malloc(sizeof(float) * m * ns[j]);
                const float *bj = j == 0 ? bias : NULL;
                cr_assert_eq(kern_cpu_matmul(y_sep[j], x, w[j], mixes[mi][j], bj, m, ns[j], k, tp), 0);
                jobs[j] = (struct kern_cpu_mm){y_multi[j], w[j], mixes[mi][j], bj, ns[j]};
            }
            cr_assert_eq(kern_cpu_matmul_multi(jobs, 3, x, m, k, tp), 0);
            for (int j = 0; j < 3; j++) {
                cr_assert_eq(memcmp(y_sep[j], y_multi[j], sizeof(float) * m * ns[j]), 0, "%s m=%d job %d",
                             dtype_name(mixes[mi][j]), m, j);
                free(w[j]);
                free(y_sep[j]);
                free(y_multi[j]);
            }
            free(x);
            free(bias);
        }
    struct kern_cpu_mm none;
    cr_assert_eq(kern_cpu_matmul_multi(&none, 0, NULL, 1, 32, tp), FERRY_ERR_INVALID);
    tpool_free(tp);
}
