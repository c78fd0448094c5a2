/* kern_cpu_matmul against kern_cpu_matmul_ref (double accumulation) for every stored type, at odd shapes
 * (n odd, k = 32*odd or 256*odd for quantized types, k odd for plain ones, m in {1, 3, 17, 130}), with and
 * without bias; bitwise determinism across runs and pool sizes; and the thread pool itself.
 *
 * Tolerance: both sides use the same dequantized weights, so the only difference is f32 vs double
 * accumulation: for |x|,|w| <= 1 and k <= 5200 the f32 error is far below 1e-4 absolute; rtol 1e-5 covers
 * large sums. A wrong index or scale gives errors of order 1. */
#include "kt_common.h"

#include <time.h>

#include "quant/fp16.h"
#include "kernels/core/status.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/threadpool.h"
#include "quant/blocks.h"
#include "quant/dtype.h"

/* A random (n, k) weight of type t: plain types from uniform floats, Q8_0/Q4_0/Q4_1/Q5_* through
 * dtype_from_f32, K-quants as random bytes with sane f16 super-block scales. */
static void *random_weight(enum dtype t, int n, int k)
{
    const size_t rb = dtype_row_size(t, k);
    uint8_t *w = malloc(rb * n);
    float *row = malloc(sizeof(float) * k);
    for (int j = 0; j < n; j++) {
        uint8_t *wr = w + rb * j;
        kt_fill(row, k, -1.0f, 1.0f);
        switch (t) {
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
            cr_assert(dtype_from_f32(t, row, wr, k));
            break;
        }
    }
    free(row);
    return w;
}

struct shape {
    int m, n, k;
};

static void check_type(enum dtype t, const struct shape *shapes, int n_shapes)
{
    struct tpool *tp;
    cr_assert_eq(tpool_init(&tp, 2), FERRY_OK);
    kt_seed((uint64_t)t * 1000 + 7);
    for (int s = 0; s < n_shapes; s++) {
        const int m = shapes[s].m, n = shapes[s].n, k = shapes[s].k;
        void *w = random_weight(t, n, k);
        float *x = malloc(sizeof(float) * m * k), *bias = malloc(sizeof(float) * n);
        float *y = malloc(sizeof(float) * m * n), *y2 = malloc(sizeof(float) * m * n);
        float *ref = malloc(sizeof(float) * m * n);
        kt_fill(x, (size_t)m * k, -1.0f, 1.0f);
        kt_fill(bias, n, -2.0f, 2.0f);
        for (int with_bias = 0; with_bias < 2; with_bias++) {
            const float *b = with_bias ? bias : NULL;
            char what[128];
            snprintf(what, sizeof what, "matmul %s m=%d n=%d k=%d bias=%d", dtype_name(t), m, n, k,
                     with_bias);
            cr_assert_eq(kern_cpu_matmul_ref(ref, x, w, t, b, m, n, k), FERRY_OK);
            cr_assert_eq(kern_cpu_matmul(y, x, w, t, b, m, n, k, tp), FERRY_OK);
            if (k <= 8192) {
                kt_check_close(what, y, ref, (size_t)m * n, 1e-4, 1e-5);
            } else {
                /* Long rows: f32 accumulation drifts with the sum of |terms| (random K-quant bytes give large
                 * weights), so the bound is a few f32 ulps of that sum, element by element. */
                const size_t rb = dtype_row_size(t, k);
                float *wr = malloc(sizeof(float) * k);
                for (int j = 0; j < n; j++) {
                    cr_assert(dtype_to_f32(t, (const uint8_t *)w + rb * j, wr, k));
                    for (int i = 0; i < m; i++) {
                        double l1 = 0;
                        for (int c = 0; c < k; c++) l1 += fabs((double)x[(size_t)i * k + c] * wr[c]);
                        const double e = fabs((double)y[(size_t)i * n + j] - ref[(size_t)i * n + j]);
                        cr_assert(e <= 1e-6 * l1 + 1e-4, "%s [%d,%d]: got %.9g ref %.9g (sum |x w| %.4g)",
                                  what, i, j, y[(size_t)i * n + j], ref[(size_t)i * n + j], l1);
                    }
                }
                free(wr);
            }
            /* Same pool twice, and a single-threaded call: bitwise equal. */
            cr_assert_eq(kern_cpu_matmul(y2, x, w, t, b, m, n, k, tp), FERRY_OK);
            cr_assert(memcmp(y, y2, sizeof(float) * m * n) == 0, "%s: two runs differ", what);
            cr_assert_eq(kern_cpu_matmul(y2, x, w, t, b, m, n, k, NULL), FERRY_OK);
            cr_assert(memcmp(y, y2, sizeof(float) * m * n) == 0, "%s: 1 vs 2 threads differ", what);
        }
        free(w);
        free(x);
        free(bias);
        free(y);
        free(y2);
        free(ref);
    }
    tpool_free(tp);
}

static const struct shape plain_shapes[] = {{1, 37, 1001},   {3, 13, 333}, {17, 37, 1001},
                                            {130, 37, 1001}, {1, 5, 7},    {2, 3, 4099}};
static const struct shape q32_shapes[] = {{1, 37, 32 * 37},   {3, 13, 32 * 5},  {17, 37, 32 * 37},
                                          {130, 37, 32 * 37}, {1, 9, 32 * 161}, {5, 1, 32},
                                          {2, 11, 32 * 9},    {4, 13, 32 * 7}};
static const struct shape qk_shapes[] = {{1, 37, 256 * 5},   {3, 13, 256},     {17, 37, 256 * 5},
                                         {130, 21, 256 * 5}, {1, 7, 256 * 17}, {2, 11, 256 * 3}};
/* Q5: the 32-element shapes, and rows longer than the AVX2 kernels' x block sums (k > 16384): the generic
 * register-decode path. */
static const struct shape q5_shapes[] = {
    {1, 37, 32 * 37}, {3, 13, 32 * 5}, {17, 37, 32 * 37}, {130, 37, 32 * 37}, {1, 9, 32 * 161},
    {5, 1, 32},       {2, 11, 32 * 9}, {4, 13, 32 * 7},   {1, 5, 32 * 521},   {2, 3, 32 * 521}};
static const struct shape q5k_shapes[] = {{1, 37, 256 * 5},   {3, 13, 256},     {17, 37, 256 * 5},
                                          {130, 21, 256 * 5}, {1, 7, 256 * 17}, {2, 11, 256 * 3},
                                          {1, 5, 256 * 65},   {2, 3, 256 * 65}};
#define N_OF(a) (int)(sizeof(a) / sizeof((a)[0]))

Test(matmul, f32)
{
    check_type(DTYPE_F32, plain_shapes, N_OF(plain_shapes));
}
Test(matmul, f16)
{
    check_type(DTYPE_F16, plain_shapes, N_OF(plain_shapes));
}
Test(matmul, bf16)
{
    check_type(DTYPE_BF16, plain_shapes, N_OF(plain_shapes));
}
Test(matmul, q8_0)
{
    check_type(DTYPE_Q8_0, q32_shapes, N_OF(q32_shapes));
}
Test(matmul, q4_0)
{
    check_type(DTYPE_Q4_0, q32_shapes, N_OF(q32_shapes));
}
Test(matmul, q4_1)
{
    check_type(DTYPE_Q4_1, q32_shapes, N_OF(q32_shapes));
}
Test(matmul, q4_k)
{
    check_type(DTYPE_Q4_K, qk_shapes, N_OF(qk_shapes));
}
Test(matmul, q6_k)
{
    check_type(DTYPE_Q6_K, qk_shapes, N_OF(qk_shapes));
}
Test(matmul, q5_0)
{
    check_type(DTYPE_Q5_0, q5_shapes, N_OF(q5_shapes));
}
Test(matmul, q5_1)
{
    check_type(DTYPE_Q5_1, q5_shapes, N_OF(q5_shapes));
}
Test(matmul, q5_k)
{
    check_type(DTYPE_Q5_K, q5k_shapes, N_OF(q5k_shapes));
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

Test(matmul, rejects_bad_shapes)
{
    float x[64] = {1}, y[64];
    uint8_t w[256] = {0};
    cr_assert_eq(kern_cpu_matmul(y, x, w, DTYPE_Q8_0, NULL, 1, 1, 33, NULL), FERRY_ERR_INVALID);
    cr_assert_eq(kern_cpu_matmul(y, x, w, DTYPE_F32, NULL, 0, 1, 3, NULL), FERRY_ERR_INVALID);
    cr_assert_eq(kern_cpu_matmul(y, x, w, DTYPE_F32, NULL, 1, 1, -3, NULL), FERRY_ERR_INVALID);
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
 * job), across types, batch sizes and a tiny job that runs unsplit. */
Test(matmul, multi_equals_separate_calls)
{
    struct tpool *tp = NULL;
    cr_assert_eq(tpool_init(&tp, 2), 0);
    const enum dtype types[] = {DTYPE_F32, DTYPE_F16, DTYPE_Q8_0, DTYPE_Q4_1, DTYPE_Q4_K};
    const int ms[] = {1, 3, 17};
    const int k = 256, ns[3] = {97, 33, 5};
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++)
        for (size_t mi = 0; mi < sizeof ms / sizeof ms[0]; mi++) {
            const int m = ms[mi];
            float *x = malloc(sizeof(float) * m * k);
            for (int i = 0; i < m * k; i++) x[i] = sinf(0.37f * i + 1.0f);
            void *w[3];
            float *y_sep[3], *y_multi[3], *bias = malloc(sizeof(float) * 97);
            for (int i = 0; i < 97; i++) bias[i] = 0.01f * i - 0.3f;
            struct kern_cpu_mm jobs[3];
            for (int j = 0; j < 3; j++) {
                size_t rb = dtype_row_size(types[ti], k);
                w[j] = malloc(rb * ns[j]);
                float *row = malloc(sizeof(float) * k);
                for (int r = 0; r < ns[j]; r++) {
                    for (int c = 0; c < k; c++) row[c] = cosf(0.11f * (r * k + c) + j);
                    if (types[ti] == DTYPE_F32)
                        memcpy((char *)w[j] + rb * r, row, rb);
                    else if (types[ti] == DTYPE_F16)
                        for (int c = 0; c < k; c++)
                            ((uint16_t *)((char *)w[j] + rb * r))[c] = f32_to_f16(row[c]);
                    else if (types[ti] == DTYPE_Q4_K) /* no quantizer: random bytes with sane f16 scales */
                        for (size_t b = 0; b < rb; b++)
                            ((uint8_t *)w[j])[rb * r + b] = (uint8_t)(r * 31 + b * 7 + j);
                    else
                        cr_assert(dtype_from_f32(types[ti], row, (char *)w[j] + rb * r, k));
                }
                if (types[ti] == DTYPE_Q4_K) /* d and dmin of every 144-byte block: small positive halves */
                    for (int r = 0; r < ns[j]; r++)
                        for (int blk = 0; blk < k / 256; blk++) {
                            uint16_t *h = (uint16_t *)((char *)w[j] + rb * r + 144 * blk);
                            h[0] = f32_to_f16(0.01f), h[1] = f32_to_f16(0.002f);
                        }
                free(row);
                y_sep[j] = malloc(sizeof(float) * m * ns[j]);
                y_multi[j] = malloc(sizeof(float) * m * ns[j]);
                const float *bj = j == 0 ? bias : NULL;
                cr_assert_eq(kern_cpu_matmul(y_sep[j], x, w[j], types[ti], bj, m, ns[j], k, tp), 0);
                jobs[j] = (struct kern_cpu_mm){y_multi[j], w[j], types[ti], bj, ns[j]};
            }
            cr_assert_eq(kern_cpu_matmul_multi(jobs, 3, x, m, k, tp), 0);
            for (int j = 0; j < 3; j++) {
                cr_assert_eq(memcmp(y_sep[j], y_multi[j], sizeof(float) * m * ns[j]), 0, "%s m=%d job %d",
                             dtype_name(types[ti]), m, j);
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
