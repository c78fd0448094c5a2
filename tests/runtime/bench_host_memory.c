/* bench_host_memory — the host memory a GPU engine's host layers live in, measured (not a test).
 *
 * For each kind of buffer (malloc'd; cudaHostAlloc default; cudaHostAlloc write-combined, what host layers
 * used before; mmap + cudaHostRegister, what they use now): the rate at which N pinned threads read
 * it (vector sums, each thread its own contiguous range, the partition a layer's matmul uses), and the pinned
 * host→device copy rate from it. Then both at once: threads reading one registered buffer while the copy
 * stream copies another, which is how host layers run beside streamed ones. Prints GB/s.
 * Usage: bench_host_memory [threads] [MiB per buffer]   (defaults: all cores, 1024)
 */
#include <cuda_runtime_api.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include "kernels/cpu/threadpool.h"

typedef float v8 __attribute__((vector_size(32)));

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

struct read_job {
    const float *p;
    size_t n; /* floats */
    int parts;
    float sink[1024];
};

static void read_task(void *ctx, int t)
{
    struct read_job *j = ctx;
    const size_t per = (j->n / (size_t)j->parts) & ~(size_t)63;
    const v8 *a = (const v8 *)(j->p + per * (size_t)t);
    v8 s0 = {0}, s1 = {0}, s2 = {0}, s3 = {0};
    for (size_t i = 0; i + 4 <= per / 8; i += 4) s0 += a[i], s1 += a[i + 1], s2 += a[i + 2], s3 += a[i + 3];
    v8 s = s0 + s1 + s2 + s3;
    j->sink[t] = s[0] + s[1] + s[2] + s[3] + s[4] + s[5] + s[6] + s[7];
}

/* GB/s of the best of `reps` parallel reads of the whole buffer. */
static double read_rate(struct tpool *tp, const void *p, size_t bytes, int reps)
{
    struct read_job j = {.p = p, .n = bytes / 4, .parts = tpool_size(tp)};
    double best = 1e30;
    for (int r = 0; r < reps; r++) {
        const double t0 = now_s();
        tpool_run(tp, read_task, &j, j.parts);
        const double t = now_s() - t0;
        if (t < best) best = t;
    }
    return (double)(j.n / (size_t)j.parts & ~(size_t)63) * j.parts * 4 / best / 1e9;
}

static double copy_rate(const void *host, void *dev, size_t bytes, cudaStream_t s)
{
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    cudaMemcpyAsync(dev, host, bytes, cudaMemcpyHostToDevice, s);
    cudaEventRecord(e0, s);
    for (int i = 0; i < 3; i++) cudaMemcpyAsync(dev, host, bytes, cudaMemcpyHostToDevice, s);
    cudaEventRecord(e1, s);
    cudaEventSynchronize(e1);
    float ms = 0;
    cudaEventElapsedTime(&ms, e0, e1);
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    return ms > 0 ? 3.0 * bytes / (ms * 1e-3) / 1e9 : 0;
}

int main(int argc, char **argv)
{
    const int threads = argc > 1 ? atoi(argv[1]) : 0;
    const size_t bytes = (size_t)(argc > 2 ? atoi(argv[2]) : 1024) << 20;
    struct tpool *tp;
    if (tpool_init_pinned(&tp, threads)) return 1;
    int n_dev = 0;
    if (cudaGetDeviceCount(&n_dev) != cudaSuccess || n_dev == 0) {
        fprintf(stderr, "bench_host_memory: no CUDA device\n");
        return 1;
    }
    printf("host memory, %d pinned threads, %zu MiB buffers, %d NUMA node(s)\n", tpool_size(tp), bytes >> 20,
           tpool_numa_nodes());
    void *dev = NULL;
    cudaStream_t s;
    cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    if (cudaMalloc(&dev, bytes) != cudaSuccess) return 1;
    struct {
        const char *name;
        void *p;
    } kinds[4] = {{"malloc (pageable)", NULL},
                  {"cudaHostAlloc default", NULL},
                  {"cudaHostAlloc write-combined", NULL},
                  {"mmap + cudaHostRegister", NULL}};
    kinds[0].p = aligned_alloc(4096, bytes);
    cudaHostAlloc(&kinds[1].p, bytes, cudaHostAllocDefault);
    cudaHostAlloc(&kinds[2].p, bytes, cudaHostAllocWriteCombined);
    void *m = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m != MAP_FAILED) {
        tpool_numa_interleave(m, bytes);
        madvise(m, bytes, MADV_HUGEPAGE);
        if (cudaHostRegister(m, bytes, cudaHostRegisterDefault) == cudaSuccess) kinds[3].p = m;
    }
    printf("%-30s %14s %16s\n", "buffer", "CPU read GB/s", "host->dev GB/s");
    for (int k = 0; k < 4; k++) {
        if (!kinds[k].p) {
            printf("%-30s %14s %16s\n", kinds[k].name, "(failed)", "");
            continue;
        }
        for (size_t i = 0; i < bytes / 4; i++) ((float *)kinds[k].p)[i] = (float)(i & 1023) * 1e-3f;
        /* Write-combined memory reads slowly: fewer passes. */
        const double r = read_rate(tp, kinds[k].p, k == 2 ? bytes / 16 : bytes, k == 2 ? 1 : 5);
        const double c = copy_rate(kinds[k].p, dev, bytes, s);
        printf("%-30s %14.1f %16.1f\n", kinds[k].name, r, c);
    }
    /* Both at once: the copy stream copies buffer 1 in a loop while the threads read buffer 3. */
    if (kinds[1].p && kinds[3].p) {
        cudaEvent_t e0, e1;
        cudaEventCreate(&e0);
        cudaEventCreate(&e1);
        cudaEventRecord(e0, s);
        const int copies = 12;
        for (int i = 0; i < copies; i++) cudaMemcpyAsync(dev, kinds[1].p, bytes, cudaMemcpyHostToDevice, s);
        cudaEventRecord(e1, s);
        const double r = read_rate(tp, kinds[3].p, bytes, 5);
        cudaEventSynchronize(e1);
        float ms = 0;
        cudaEventElapsedTime(&ms, e0, e1);
        printf(
            "concurrent: CPU read %.1f GB/s while copying at %.1f GB/s (the copies' average over %.0f ms)\n",
            r, ms > 0 ? copies * (double)bytes / (ms * 1e-3) / 1e9 : 0, ms);
        cudaEventDestroy(e0);
        cudaEventDestroy(e1);
    }
    free(kinds[0].p);
    if (kinds[1].p) cudaFreeHost(kinds[1].p);
    if (kinds[2].p) cudaFreeHost(kinds[2].p);
    if (kinds[3].p) cudaHostUnregister(kinds[3].p);
    if (m != MAP_FAILED) munmap(m, bytes);
    cudaFree(dev);
    tpool_free(tp);
    return 0;
}
