/* cuda_test — helpers shared by the CUDA kernel tests: skip without a GPU, device buffers, random data, error
 * measures. Every test draws fresh random data (never zeros) and poisons outputs with NaN before the kernel
 * runs, so an unwritten element fails the comparison.
 */
#ifndef FERRY_TEST_CUDA_H
#define FERRY_TEST_CUDA_H

#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "kernels/core/fp16.h"
#include "kernels/core/status.h"
#include "kernels/cuda/ops.h"

#define SKIP_WITHOUT_GPU()                                                                                   \
    do {                                                                                                     \
        if (kern_cuda_device_count() <= 0)                                                                   \
            cr_skip_test("no CUDA device (cudaGetDeviceCount reports none); run tests/cuda/gpu_check.sh on " \
                         "a GPU machine");                                                                   \
    } while (0)

#define CU_OK(call) cr_assert_eq((call), cudaSuccess, "%s failed", #call)

static uint64_t test_rng = 0x9E3779B97F4A7C15ull;
static inline void rng_seed(uint64_t s)
{
    test_rng = s * 0x9E3779B97F4A7C15ull + 1;
}
static inline uint64_t rng_u64(void)
{
    test_rng ^= test_rng << 13;
    test_rng ^= test_rng >> 7;
    test_rng ^= test_rng << 17;
    return test_rng;
}
/* Uniform in [-1, 1). */
static inline float frand(void)
{
    return (float)((double)(rng_u64() >> 11) * 0x1.0p-53 * 2.0 - 1.0);
}
static inline int irand(int n)
{
    return (int)(rng_u64() % (uint64_t)n);
}

static inline float *host_rand(size_t n, float lo, float hi)
{
    float *p = (float *)malloc(n * sizeof(float) + 1);
    cr_assert(p);
    for (size_t i = 0; i < n; i++) p[i] = lo + (frand() + 1.0f) * 0.5f * (hi - lo);
    return p;
}

static inline void *dev_alloc(size_t bytes)
{
    void *d = NULL;
    CU_OK(cudaMalloc(&d, bytes ? bytes : 16));
    return d;
}
static inline void *dev_upload(const void *h, size_t bytes)
{
    void *d = dev_alloc(bytes);
    if (bytes) CU_OK(cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice));
    return d;
}
/* A buffer filled with 0xFF bytes: NaN as f32 and f16. */
static inline void *dev_poison(size_t bytes)
{
    void *d = dev_alloc(bytes);
    CU_OK(cudaMemset(d, 0xFF, bytes ? bytes : 16));
    return d;
}
static inline void dev_download(void *h, const void *d, size_t bytes)
{
    CU_OK(cudaDeviceSynchronize());
    if (bytes) CU_OK(cudaMemcpy(h, d, bytes, cudaMemcpyDeviceToHost));
}

/* ‖got − ref‖ / ‖ref‖ over the tensor; INFINITY when got holds a NaN or infinity. */
static inline double rel_err(const float *got, const double *ref, size_t n)
{
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(got[i])) return INFINITY;
        num += (got[i] - ref[i]) * (got[i] - ref[i]);
        den += ref[i] * ref[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}
/* max |got − ref|; INFINITY on NaN. */
static inline double max_abs_err(const float *got, const double *ref, size_t n)
{
    double m = 0;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(got[i])) return INFINITY;
        double e = fabs(got[i] - ref[i]);
        if (e > m) m = e;
    }
    return m;
}

#endif
