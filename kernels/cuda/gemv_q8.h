/* gemv_q8 (CUDA) — y = x · Wᵀ (+ bias) for decode batches (m = 1..16) with W in GGUF Q8_0, on tensor cores.
 *
 * W (n, k) row-major Q8_0: blocks of 32 along k, each { f16 d; int8 q[32]; } (34 bytes, w = d * q), so a row
 * is k/32*34 bytes and rows are only 2-byte aligned in general. x (m, k) f32, y (m, n) f32, bias (n) f32 or
 * NULL, all device memory; y is (m, ldy) with n <= ldy, columns past n untouched. x is rounded to f16 once
 * (round-to-nearest-even); q is exact in f16; each block's 32 products are summed by the tensor cores in f32
 * and scaled by d in f32, so the error is that of one f16 rounding of x (2^-11 relative per element), as on
 * the f16 GEMV path. Allocates nothing, uses no workspace (graph-capturable); launched with programmatic
 * dependent launch (kernels/cuda/pdl.h). Results are bitwise reproducible for a given shape, configuration
 * and device (no atomics).
 */
#ifndef FERRY_KERN_CUDA_GEMV_Q8_H
#define FERRY_KERN_CUDA_GEMV_Q8_H

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

#define KERN_CUDA_GEMV_Q8_MAX_M 16

/* m = 1..16, k % 32 == 0, 1 <= n <= ldy; x 16-byte aligned, y and bias 4-byte aligned, w 2-byte aligned.
 * Returns FERRY_ERR_INVALID on bad arguments, FERRY_ERR_CUDA if the launch fails. */
int kern_cuda_gemv_q8(float *y, int ldy, const float *x, const void *w, const float *bias, int m, int n,
                      int k, cudaStream_t stream);

/* For tests and benches: force a kernel configuration (1..KERN_CUDA_GEMV_Q8_CONFIGS, see gemv_q8.cu), or 0
 * for the automatic choice. Returns the previous setting; FERRY_ERR_INVALID for an unknown one. */
#define KERN_CUDA_GEMV_Q8_CONFIGS 7
int kern_cuda_gemv_q8_set_config(int config);
/* A short description of a configuration ("16 rows/warp, 3 blocks/chunk, register staging"), for bench
 * output. */
const char *kern_cuda_gemv_q8_config_name(int config);

#ifdef __cplusplus
}
#endif

#endif
