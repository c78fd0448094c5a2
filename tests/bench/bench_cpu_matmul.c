/* bench_cpu_matmul — weight-read bandwidth of kern_cpu_matmul per stored type (not a test).
 *
 * For shapes (m, n, k) = (1, 4096, 4096) (decode) and (64, 4096, 4096) (prefill) and 1 and 2 threads (or the
 * counts given as arguments), prints GB/s of weight bytes read (n * row_bytes per call) and GFLOP/s, best of
 * a few timed runs after a warm-up. Each call reads a different copy of the weight, from a rotation of at
 * least 512 MiB, so no call finds its weight in cache (this machine's L3 is 32 MiB; some keep part of 64
 * MiB). The ceiling printed first is a plain streaming read (vector sums) of a 256 MiB buffer with the same
 * pool. Usage: bench_cpu_matmul [threads...]
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernels/core/dtype.h"
#include "kernels/core/fp16.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/threadpool.h"
#include "quant/blocks.h"
#include "quant/dequant.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static uint64_t rng = 88172645463325252ull;
static float frand(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (float)((rng >> 40) * 0x1.0p-24) * 2.0f - 1.0f;
}

static void *make_weight(enum dtype t, int n, int k)
{
    const size_t rb = dtype_row_size(t, k);
    uint8_t *w = aligned_alloc(64, (rb * n + 63) / 64 * 64);
    float *row = malloc(sizeof(float) * k);
    for (int j = 0; j < n; j++) {
        for (int i = 0; i < k; i++) row[i] = frand();
        if (t == DTYPE_Q4_K || t == DTYPE_Q6_K) {
            for (size_t b = 0; b < rb; b++) w[rb * j + b] = (uint8_t)(rng >> 13), frand();
            for (int b = 0; b < k / 256; b++) {
                if (t == DTYPE_Q4_K) {
                    struct block_q4_k *bl = (struct block_q4_k *)(w + rb * j) + b;
                    bl->d = bl->dmin = f32_to_f16(0.01f);
                } else {
                    struct block_q6_k *bl = (struct block_q6_k *)(w + rb * j + (size_t)b * 210);
                    bl->d = f32_to_f16(0.001f);
                }
            }
        } else {
            quant_row(t, row, w + rb * j, k);
        }
    }
    free(row);
    return w;
}

struct bw_ctx {
    const float *a;
    int64_t n;
    int n_threads;
    float sink[64];
};

typedef float v8f __attribute__((vector_size(32)));

/* Each thread reads its slice in 64 KiB pieces, each as 4 concurrent 16 KiB streams — the access pattern of
 * the matmul reading 4 weight rows of 4096 f32 at a time, which the prefetchers serve best. */
static void bw_task(void *arg, int t)
{
    struct bw_ctx *c = arg;
    const int64_t piece = 16384, q = piece / 4;
    const int64_t lo = c->n * t / c->n_threads / piece * piece,
                  hi = c->n * (t + 1) / c->n_threads / piece * piece;
    v8f s0 = {0}, s1 = {0}, s2 = {0}, s3 = {0};
    for (int64_t b = lo; b < hi; b += piece) {
        const float *p0 = c->a + b, *p1 = p0 + q, *p2 = p1 + q, *p3 = p2 + q;
        for (int64_t i = 0; i < q; i += 8) {
            s0 += *(const v8f *)(p0 + i);
            s1 += *(const v8f *)(p1 + i);
            s2 += *(const v8f *)(p2 + i);
            s3 += *(const v8f *)(p3 + i);
        }
    }
    const v8f s = s0 + s1 + s2 + s3;
    c->sink[t] = s[0] + s[7];
}

/* Best-of-5 streaming read rate in GB/s. */
static double read_bandwidth(struct tpool *tp)
{
    const int64_t n = 64ll << 20; /* 256 MiB of f32 */
    float *a = aligned_alloc(64, (size_t)n * 4);
    if (!a) return 0;
    for (int64_t i = 0; i < n; i++) a[i] = (float)(i & 7);
    struct bw_ctx c = {.a = a, .n = n, .n_threads = tpool_size(tp)};
    double best = 1e9;
    for (int r = 0; r < 5; r++) {
        const double t0 = now_s();
        tpool_run(tp, bw_task, &c, c.n_threads);
        const double dt = now_s() - t0;
        if (dt < best) best = dt;
    }
    free(a);
    return (double)n * 4 / best * 1e-9;
}

int main(int argc, char **argv)
{
    int threads[8] = {1, 2}, n_thr = 2;
    if (argc > 1) {
        n_thr = 0;
        for (int i = 1; i < argc && n_thr < 8; i++) threads[n_thr++] = atoi(argv[i]);
    }
    const enum dtype types[] = {DTYPE_F32,  DTYPE_F16,  DTYPE_BF16, DTYPE_Q8_0,
                                DTYPE_Q4_0, DTYPE_Q4_1, DTYPE_Q4_K, DTYPE_Q6_K};
    const int shapes[2][3] = {{1, 4096, 4096}, {64, 4096, 4096}};
    for (int ci = 0; ci < n_thr; ci++) {
        struct tpool *tp = NULL;
        if (tpool_init(&tp, threads[ci]) != 0) return 1;
        printf("ceiling: streaming read with %d thread(s): %.2f GB/s\n", tpool_size(tp), read_bandwidth(tp));
        tpool_free(tp);
    }
    printf("%-5s %4s %5s %5s %3s %10s %9s %9s\n", "type", "m", "n", "k", "thr", "ms/call", "GB/s(W)",
           "GFLOP/s");
    for (int s = 0; s < 2; s++) {
        const int m = shapes[s][0], n = shapes[s][1], k = shapes[s][2];
        float *x = malloc(sizeof(float) * m * k), *y = malloc(sizeof(float) * m * n);
        for (int i = 0; i < m * k; i++) x[i] = frand();
        for (unsigned ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
            const enum dtype t = types[ti];
            const size_t wsize = dtype_row_size(t, k) * (size_t)n;
            const int n_copies = (int)((512u << 20) / wsize) + 1;
            uint8_t *w0 = make_weight(t, n, k);
            uint8_t **w = malloc(sizeof(*w) * n_copies);
            w[0] = w0;
            for (int cp = 1; cp < n_copies; cp++) {
                w[cp] = aligned_alloc(64, (wsize + 63) / 64 * 64);
                memcpy(w[cp], w0, wsize);
                /* One changed byte per page: copies that are not identical pages (a hypervisor may merge
                 * those). For quantized types this changes a quant or a scale, which does not matter here. */
                for (size_t b = 0; b < wsize; b += 4096) w[cp][b] ^= (uint8_t)cp;
            }
            const double wbytes = (double)wsize;
            int rot = 0;
            for (int ci = 0; ci < n_thr; ci++) {
                struct tpool *tp = NULL;
                if (tpool_init(&tp, threads[ci]) != 0) return 1;
                kern_cpu_matmul(y, x, w[rot++ % n_copies], t, NULL, m, n, k, tp); /* warm-up */
                double best = 1e9;
                const int reps = m == 1 ? 20 : 3;
                for (int r = 0; r < reps; r++) {
                    const double t0 = now_s();
                    kern_cpu_matmul(y, x, w[rot++ % n_copies], t, NULL, m, n, k, tp);
                    const double dt = now_s() - t0;
                    if (dt < best) best = dt;
                }
                printf("%-5s %4d %5d %5d %3d %10.3f %9.2f %9.1f\n", dtype_name(t), m, n, k, tpool_size(tp),
                       best * 1e3, wbytes / best * 1e-9, 2.0 * m * n * k / best * 1e-9);
                fflush(stdout);
                tpool_free(tp);
            }
            for (int cp = 0; cp < n_copies; cp++) free(w[cp]);
            free(w);
        }
        free(x);
        free(y);
    }
    return 0;
}
