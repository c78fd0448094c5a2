/* The type table against gguf-py (tests/kernels/make_quant_fixtures.py wrote the data): dtype_to_f32 must
 * reproduce gguf.quants.dequantize bit for bit (both evaluate the same f32 expressions without fused
 * multiply-adds), dtype_from_f32 must produce gguf.quants.quantize's bytes exactly (Q8_0, Q4_0, Q4_1, Q5_0,
 * Q5_1; the K-quant quantizers are checked against llama-quantize in tests/weights/test_quantize_llama.c),
 * and the fp16.h conversions must round like numpy (f16) and gguf-py (bf16). Also: the table's sizes match
 * the block structs, quant_matrix equals row-by-row conversion whatever the thread count, and every
 * quantizer's round trip stays within its format's error bound on random data. */
#include "kt_common.h"

#include <pthread.h>

#include "quant/blocks.h"
#include "quant/dtype.h"
#include "quant/fp16.h"
#include "quant/matrix.h"

static void check_dequant(enum dtype t, const char *name)
{
    size_t nb, nd;
    uint8_t *blocks;
    float *want;
    KT_LOAD_BLOCKS(blocks, want, name, nb, nd);
    const int64_t n = (int64_t)(nd / 4);
    cr_assert_eq(dtype_row_size(t, n), nb, "%s: fixture sizes disagree", name);
    float *got = malloc(nd);
    cr_assert(dtype_to_f32(t, blocks, got, n));
    int mismatches = 0;
    int64_t first = -1;
    for (int64_t i = 0; i < n; i++)
        if (memcmp(&got[i], &want[i], 4) != 0 && !(isnan(got[i]) && isnan(want[i]))) {
            if (first < 0) first = i;
            mismatches++;
        }
    cr_assert_eq(mismatches, 0, "%s: %d of %ld values differ from gguf-py; first [%ld] got %.9g want %.9g",
                 name, mismatches, (long)n, (long)first, first >= 0 ? got[first] : 0.0,
                 first >= 0 ? want[first] : 0.0);
    /* A row in the middle of the data (not block 0) also decodes alone. */
    const int bs = dtype_block_size(t);
    const int64_t off = (n / bs / 2) * bs;
    cr_assert(dtype_to_f32(t, blocks + dtype_row_size(t, off), got, bs));
    cr_assert(memcmp(got, want + off, (size_t)bs * 4) == 0, "%s: single block at %ld", name, (long)off);
    free(got);
    free(blocks);
    free(want);
}

Test(quant, dequant_q8_0)
{
    check_dequant(DTYPE_Q8_0, "Q8_0");
}
Test(quant, dequant_q4_0)
{
    check_dequant(DTYPE_Q4_0, "Q4_0");
}
Test(quant, dequant_q4_1)
{
    check_dequant(DTYPE_Q4_1, "Q4_1");
}
Test(quant, dequant_q4_k)
{
    check_dequant(DTYPE_Q4_K, "Q4_K");
}
Test(quant, dequant_q6_k)
{
    check_dequant(DTYPE_Q6_K, "Q6_K");
}
Test(quant, dequant_q5_0)
{
    check_dequant(DTYPE_Q5_0, "Q5_0");
}
Test(quant, dequant_q5_1)
{
    check_dequant(DTYPE_Q5_1, "Q5_1");
}
Test(quant, dequant_q5_k)
{
    check_dequant(DTYPE_Q5_K, "Q5_K");
}
/* The types ferry reads but does not write, against llama.cpp's dequantize_row_* (equal to gguf-py's, which
 * make_iquant_fixtures.py checked): random bytes with sane scales, and llama.cpp's own quantizer's output. */
#define IQ_DEQUANT_TEST(t, nm)                                                                               \
    Test(quant, dequant_##t)                                                                                 \
    {                                                                                                        \
        check_dequant(DTYPE_##nm, #nm);                                                                      \
        check_dequant(DTYPE_##nm, #nm ".pq");                                                                \
    }
IQ_DEQUANT_TEST(q2_k, Q2_K)
IQ_DEQUANT_TEST(q3_k, Q3_K)
IQ_DEQUANT_TEST(iq4_nl, IQ4_NL)
IQ_DEQUANT_TEST(iq4_xs, IQ4_XS)
IQ_DEQUANT_TEST(mxfp4, MXFP4)
IQ_DEQUANT_TEST(nvfp4, NVFP4)
IQ_DEQUANT_TEST(iq3_xxs, IQ3_XXS)
IQ_DEQUANT_TEST(iq3_s, IQ3_S)
IQ_DEQUANT_TEST(iq2_xxs, IQ2_XXS)
IQ_DEQUANT_TEST(iq2_xs, IQ2_XS)
IQ_DEQUANT_TEST(iq2_s, IQ2_S)
IQ_DEQUANT_TEST(iq1_s, IQ1_S)
IQ_DEQUANT_TEST(iq1_m, IQ1_M)

Test(quant, dequant_f16)
{
    check_dequant(DTYPE_F16, "F16");
}
Test(quant, dequant_bf16)
{
    check_dequant(DTYPE_BF16, "BF16");
}

static void check_quant(enum dtype t, const char *name)
{
    char fq[64];
    snprintf(fq, sizeof fq, "%s.quant", name);
    size_t nx, nq;
    float *x;
    uint8_t *want;
    KT_LOAD(x, "quant_in.f32", nx);
    KT_LOAD(want, fq, nq);
    const int64_t n = (int64_t)(nx / 4);
    cr_assert_eq(dtype_row_size(t, n), nq);
    uint8_t *got = malloc(nq);
    cr_assert(dtype_from_f32(t, x, got, n));
    const size_t bsz = dtype_type_size(t);
    int bad_blocks = 0;
    long first = -1;
    for (size_t b = 0; b < nq / bsz; b++)
        if (memcmp(got + b * bsz, want + b * bsz, bsz) != 0) {
            if (first < 0) first = (long)b;
            bad_blocks++;
        }
    cr_assert_eq(bad_blocks, 0, "%s: %d blocks differ from the reference quantizer, first block %ld", name,
                 bad_blocks, first);
    /* Round trip: within half a step plus the f16 rounding of d (127 steps of at most 2^-11 d), for Q8_0. */
    if (t == DTYPE_Q8_0) {
        float *back = malloc(nx);
        cr_assert(dtype_to_f32(t, got, back, n));
        const struct block_q8_0 *bl = (const void *)got;
        for (int64_t i = 0; i < n; i++) {
            const float d = f16_to_f32(bl[i / 32].d);
            cr_assert(fabsf(back[i] - x[i]) <= 0.5f * d + 127.0f * d * 0x1p-11f + 1e-7f,
                      "Q8_0 round trip [%ld]", (long)i);
        }
        free(back);
    }
    free(got);
    free(x);
    free(want);
}

Test(quant, quant_q8_0)
{
    check_quant(DTYPE_Q8_0, "Q8_0");
}
Test(quant, quant_q4_0)
{
    check_quant(DTYPE_Q4_0, "Q4_0");
}
Test(quant, quant_q4_1)
{
    check_quant(DTYPE_Q4_1, "Q4_1");
}
Test(quant, quant_q5_0)
{
    check_quant(DTYPE_Q5_0, "Q5_0");
}
Test(quant, quant_q5_1)
{
    check_quant(DTYPE_Q5_1, "Q5_1");
}

Test(quant, fp16_conversions_round_like_numpy)
{
    size_t nf, nh, nb;
    float *f;
    uint16_t *h, *b;
    KT_LOAD(f, "fp16_in.f32", nf);
    KT_LOAD(h, "fp16_out.u16", nh);
    KT_LOAD(b, "bf16_out.u16", nb);
    for (size_t i = 0; i < nf / 4; i++) {
        cr_assert_eq(f32_to_f16(f[i]), h[i], "f32_to_f16(%.9g) = 0x%04x, numpy 0x%04x", f[i],
                     f32_to_f16(f[i]), h[i]);
        cr_assert_eq(f32_to_bf16(f[i]), b[i], "f32_to_bf16(%.9g) = 0x%04x, gguf-py 0x%04x", f[i],
                     f32_to_bf16(f[i]), b[i]);
        /* Every finite f16 converts back to an f32 that converts to the same bits. */
        if ((h[i] & 0x7C00) != 0x7C00) cr_assert_eq(f32_to_f16(f16_to_f32(h[i])), h[i]);
    }
    free(f);
    free(h);
    free(b);
}

Test(quant, rejects_bad_lengths)
{
    float dst[64];
    uint8_t src[64 * 4] = {0};
    cr_assert(!dtype_to_f32(DTYPE_Q8_0, src, dst, 33));
    cr_assert(!dtype_to_f32(DTYPE_Q4_K, src, dst, 32));
    cr_assert(!dtype_to_f32((enum dtype)9, src, dst, 32));   /* Q8_1: not a storage type */
    cr_assert(!dtype_to_f32((enum dtype)34, src, dst, 256)); /* TQ1_0: known to ggml, not to ferry */
    cr_assert(!dtype_from_f32(DTYPE_IQ2_XS, dst, src, 256)); /* read-only: no quantizer */
    cr_assert(!dtype_from_f32(DTYPE_Q4_0, dst, src, 31));
    cr_assert(!dtype_from_f32(DTYPE_Q6_K, dst, src, -256));
    cr_assert(!dtype_from_f32(DTYPE_F32, NULL, src, 4));
    cr_assert(dtype_to_f32(DTYPE_F32, src, dst, 0));
    cr_assert_eq(dtype_row_size(DTYPE_Q5_K, 255), 0);
    cr_assert_eq(dtype_row_size(DTYPE_Q5_K, 512), 352);
    cr_assert_null(dtype_get_traits(DTYPE_COUNT));
    cr_assert_null(dtype_get_traits(4));
}

/* llama-quantize's Q2_K, Q3_K, IQ4_NL, IQ4_XS and MXFP4 (quantize_* without an importance matrix,
 * make_iquant_fixtures.py). */
Test(quant, quant_q2_k)
{
    check_quant(DTYPE_Q2_K, "Q2_K");
}
Test(quant, quant_q3_k)
{
    check_quant(DTYPE_Q3_K, "Q3_K");
}
Test(quant, quant_iq4_nl)
{
    check_quant(DTYPE_IQ4_NL, "IQ4_NL");
}
Test(quant, quant_iq4_xs)
{
    check_quant(DTYPE_IQ4_XS, "IQ4_XS");
}
Test(quant, quant_mxfp4)
{
    check_quant(DTYPE_MXFP4, "MXFP4");
}

Test(quant, table_matches_blocks_and_names)
{
    const struct {
        enum dtype t;
        int bs;
        size_t sz;
    } want[] = {{DTYPE_F32, 1, 4},
                {DTYPE_F16, 1, 2},
                {DTYPE_BF16, 1, 2},
                {DTYPE_Q8_0, QK8_0, sizeof(struct block_q8_0)},
                {DTYPE_Q4_0, QK4_0, sizeof(struct block_q4_0)},
                {DTYPE_Q4_1, QK4_1, sizeof(struct block_q4_1)},
                {DTYPE_Q5_0, QK5_0, sizeof(struct block_q5_0)},
                {DTYPE_Q5_1, QK5_1, sizeof(struct block_q5_1)},
                {DTYPE_Q4_K, QK_K, sizeof(struct block_q4_k)},
                {DTYPE_Q5_K, QK_K, sizeof(struct block_q5_k)},
                {DTYPE_Q6_K, QK_K, sizeof(struct block_q6_k)},
                {DTYPE_Q2_K, QK_K, sizeof(struct block_q2_k)},
                {DTYPE_Q3_K, QK_K, sizeof(struct block_q3_k)},
                {DTYPE_IQ4_NL, 32, sizeof(struct block_iq4_nl)},
                {DTYPE_IQ4_XS, QK_K, sizeof(struct block_iq4_xs)},
                {DTYPE_MXFP4, 32, sizeof(struct block_mxfp4)},
                {DTYPE_NVFP4, 64, sizeof(struct block_nvfp4)},
                {DTYPE_IQ2_XXS, QK_K, sizeof(struct block_iq2_xxs)},
                {DTYPE_IQ2_XS, QK_K, sizeof(struct block_iq2_xs)},
                {DTYPE_IQ2_S, QK_K, sizeof(struct block_iq2_s)},
                {DTYPE_IQ3_XXS, QK_K, sizeof(struct block_iq3_xxs)},
                {DTYPE_IQ3_S, QK_K, sizeof(struct block_iq3_s)},
                {DTYPE_IQ1_S, QK_K, sizeof(struct block_iq1_s)},
                {DTYPE_IQ1_M, QK_K, sizeof(struct block_iq1_m)}};
    int n_valid = 0;
    for (int t = 0; t < DTYPE_COUNT; t++) n_valid += dtype_valid((uint32_t)t);
    cr_assert_eq(n_valid, (int)(sizeof want / sizeof want[0]), "the table has %d types", n_valid);
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        const struct dtype_traits *tr = dtype_get_traits(want[i].t);
        cr_assert_not_null(tr);
        cr_assert_eq(tr->block_size, want[i].bs, "%s", tr->name);
        cr_assert_eq(tr->type_size, want[i].sz, "%s", tr->name);
        cr_assert_eq(tr->is_quantized, want[i].bs > 1, "%s", tr->name);
        cr_assert(tr->to_f32, "%s", tr->name);
        /* The types listed after Q3_K have no quantizer, but for IQ4_NL, IQ4_XS, IQ3_S and MXFP4. */
        cr_assert_eq(tr->from_f32 != NULL,
                     i < 13 || want[i].t == DTYPE_IQ4_NL || want[i].t == DTYPE_IQ4_XS ||
                         want[i].t == DTYPE_IQ3_S || want[i].t == DTYPE_MXFP4,
                     "%s", tr->name);
        cr_assert_eq(dtype_from_name(tr->name), (int)want[i].t, "%s", tr->name);
        /* The device form is a type every backend is expected to read: plain types stay, blocks go to Q8_0.
         */
        cr_assert_eq(tr->device_form, tr->is_quantized ? DTYPE_Q8_0 : want[i].t, "%s", tr->name);
    }
    cr_assert_eq(dtype_from_name("q4_k"), DTYPE_Q4_K);
    cr_assert_eq(dtype_from_name("iq2_xxs"), DTYPE_IQ2_XXS);
    cr_assert_eq(dtype_from_name("TQ1_0"), -1);
    cr_assert_eq(dtype_from_name(""), -1);
}

/* Quantize random rows (several scales, including rows far below and above 1) and dequantize: each element
 * must be within `steps` quantization steps of its block's range, where a step is (range / levels). The bound
 * is loose on purpose (the K-quant fits trade a little range for a better least-squares fit), but a wrong
 * scale, nibble order or sign fails it by orders of magnitude. */
static void check_round_trip(enum dtype t, int levels, float steps)
{
    const int bs = dtype_block_size(t), n = 256 * 24;
    float *x = malloc(sizeof(float) * n), *back = malloc(sizeof(float) * n);
    uint8_t *q = malloc(dtype_row_size(t, n));
    kt_seed(0x5eed + (uint64_t)t);
    for (int i = 0; i < n; i++) {
        const float scale = (i / 256) % 3 == 0 ? 1e-3f : (i / 256) % 3 == 1 ? 1.0f : 40.0f;
        x[i] = (kt_uniform(-1, 1) + kt_uniform(-1, 1) + kt_uniform(-1, 1)) * scale;
    }
    cr_assert(dtype_from_f32(t, x, q, n));
    cr_assert(dtype_to_f32(t, q, back, n));
    double err2 = 0, expect2 = 0;
    for (int b0 = 0; b0 < n; b0 += bs) {
        float lo = x[b0], hi = x[b0];
        for (int i = b0; i < b0 + bs; i++) lo = fminf(lo, x[i]), hi = fmaxf(hi, x[i]);
        const float range = fmaxf(hi - lo, fmaxf(fabsf(lo), fabsf(hi)));
        for (int i = b0; i < b0 + bs; i++) {
            cr_assert(fabsf(back[i] - x[i]) <= steps * range / (float)levels + 1e-6f * range,
                      "%s [%d]: %g -> %g (block range %g)", dtype_name(t), i, x[i], back[i], range);
            err2 += (double)(back[i] - x[i]) * (back[i] - x[i]);
        }
        /* Rounding to a uniform grid of step s leaves an error of variance s^2 / 12. */
        expect2 += bs * (double)(range / levels) * (range / levels) / 12;
    }
    /* And over the row, the squared error is about what rounding to the format's grid leaves (measured:
     * 0.93-1.19 of it for the 32-element types, about half for the K-quants, whose sub-block grids are finer
     * than the 256-element block's range this counts with). */
    cr_assert(err2 <= 1.5 * expect2, "%s: squared error %g, %g expected from the grid", dtype_name(t), err2,
              expect2);
    free(x);
    free(back);
    free(q);
}

Test(quant, round_trip_all_quantizers)
{
    check_round_trip(DTYPE_Q8_0, 255, 1.0f);
    check_round_trip(DTYPE_Q4_0, 15, 1.0f);
    check_round_trip(DTYPE_Q4_1, 15, 1.0f);
    check_round_trip(DTYPE_Q5_0, 31, 1.0f);
    check_round_trip(DTYPE_Q5_1, 31, 1.0f);
    check_round_trip(DTYPE_Q4_K, 15, 2.0f);
    check_round_trip(DTYPE_Q5_K, 31, 2.0f);
    check_round_trip(DTYPE_Q6_K, 63, 2.0f);
}

/* A parallel-for over real threads: tasks interleave in whatever order the threads take them. */
struct pt_job {
    quant_task_fn task;
    void *ctx;
    int n, next;
    pthread_mutex_t mu;
};
static void *pt_worker(void *arg)
{
    struct pt_job *j = arg;
    for (;;) {
        pthread_mutex_lock(&j->mu);
        const int i = j->n - 1 - j->next++; /* last task first */
        pthread_mutex_unlock(&j->mu);
        if (i < 0) return NULL;
        j->task(j->ctx, i);
    }
}
static void pt_run(void *pool, quant_task_fn task, void *ctx, int n_tasks)
{
    const int n_threads = (int)(intptr_t)pool;
    struct pt_job j = {.task = task, .ctx = ctx, .n = n_tasks};
    pthread_mutex_init(&j.mu, NULL);
    pthread_t th[8];
    for (int i = 0; i < n_threads; i++) pthread_create(&th[i], NULL, pt_worker, &j);
    for (int i = 0; i < n_threads; i++) pthread_join(th[i], NULL);
    pthread_mutex_destroy(&j.mu);
}

Test(quant, matrix_equals_rows_any_threads)
{
    /* 4608 columns: more than one 4096-element step of the stack buffer, and a partial one. */
    const int rows = 37, cols = 4608;
    const enum dtype from[] = {DTYPE_F32, DTYPE_F16, DTYPE_BF16};
    const enum dtype to[] = {DTYPE_Q4_K, DTYPE_Q6_K, DTYPE_Q5_0, DTYPE_Q8_0, DTYPE_F16};
    float *x = malloc(sizeof(float) * rows * cols), *row = malloc(sizeof(float) * cols);
    kt_seed(77);
    kt_fill(x, (size_t)rows * cols, -2.0f, 2.0f);
    uint8_t *src = malloc((size_t)rows * cols * 4);
    for (size_t f = 0; f < sizeof from / sizeof from[0]; f++) {
        const size_t srow = dtype_row_size(from[f], cols);
        for (int r = 0; r < rows; r++)
            cr_assert(dtype_from_f32(from[f], x + (size_t)r * cols, src + srow * r, cols));
        for (size_t t = 0; t < sizeof to / sizeof to[0]; t++) {
            const size_t drow = dtype_row_size(to[t], cols);
            uint8_t *want = malloc(drow * rows), *got = malloc(drow * rows);
            for (int r = 0; r < rows; r++) {
                dtype_to_f32(from[f], src + srow * r, row, cols);
                dtype_from_f32(to[t], row, want + drow * r, cols);
            }
            for (int threads = 0; threads <= 3; threads++) {
                const struct quant_runner rn = {pt_run, (void *)(intptr_t)threads};
                memset(got, 0xAB, drow * rows);
                int64_t bad = 7;
                cr_assert(quant_matrix(to[t], got, from[f], src, rows, cols, threads ? &rn : NULL, &bad));
                cr_assert_eq(bad, -1);
                cr_assert(memcmp(got, want, drow * rows) == 0, "%s -> %s, %d threads", dtype_name(from[f]),
                          dtype_name(to[t]), threads);
            }
            free(want);
            free(got);
        }
    }
    /* A NaN in row 5 and an infinity in row 30 are reported as row 5 (the first), and still converted. */
    float *bad_x = malloc(sizeof(float) * rows * cols);
    memcpy(bad_x, x, sizeof(float) * rows * cols);
    bad_x[30 * cols + 7] = INFINITY;
    bad_x[5 * cols + 4000] = NAN;
    uint8_t *q = malloc(dtype_row_size(DTYPE_Q8_0, cols) * rows);
    int64_t bad = -1;
    const struct quant_runner rn = {pt_run, (void *)(intptr_t)3};
    cr_assert(quant_matrix(DTYPE_Q8_0, q, DTYPE_F32, bad_x, rows, cols, &rn, &bad));
    cr_assert_eq(bad, 5);
    /* Refusals: block sizes that do not divide the row, unknown types. */
    cr_assert(!quant_matrix(DTYPE_Q4_K, q, DTYPE_F32, x, 2, 4000, NULL, NULL));
    cr_assert(!quant_matrix(DTYPE_Q8_0, q, DTYPE_F32, x, 2, 33, NULL, NULL));
    cr_assert(!quant_matrix((enum dtype)34, q, DTYPE_F32, x, 2, 256, NULL, NULL));
    cr_assert(!quant_matrix(DTYPE_IQ2_XS, q, DTYPE_F32, x, 2, 256, NULL, NULL)); /* needs weights */
    cr_assert(!quant_matrix(DTYPE_IQ1_S, q, DTYPE_F32, x, 2, 256, NULL, NULL));  /* read-only */
    free(q);
    free(bad_x);
    free(x);
    free(row);
    free(src);
}
