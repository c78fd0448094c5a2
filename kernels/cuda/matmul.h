/* matmul (CUDA) — y = x · Wᵀ (+ bias) on the GPU with the weight in its stored type.
 *
 * Same contract as kernels/cpu/matmul.h: W (n, k) row-major in F16, BF16, F32 or Q8_0, x (m, k) f32, y (m, n)
 * f32, bias (n) f32 or NULL, all device memory. Two paths, picked by shape:
 *   m <= KERN_CUDA_GEMV_MAX_M: a custom GEMV / skinny GEMM that streams W once with 16-byte loads. m = 1, f32
 *     weights and rows that are not 16-byte aligned: f32 math (products exact, f32 accumulation). m = 2..16
 * with f16/bf16 weights: tensor cores (mma.sync), x rounded to the weight's type, f32 accumulation, so the
 * error is that of one rounding of x as on the cuBLAS path; m >  KERN_CUDA_GEMV_MAX_M: cuBLAS on tensor cores
 * (cublasGemmEx, f32 accumulation); x is first rounded to the weight's type (f16/bf16) in the context's
 * workspace, so the error is that of one rounding of x. Q8_0 weights always take the GEMV path
 * (kernels/cuda/gemv_q8.h: tensor cores, x rounded to f16 once, x 16-byte aligned; m > 16 in tiles of 16). A
 * context owns the cuBLAS handle and the workspaces (allocated once at init, never per call); it belongs to one
 * thread (the engine thread). Results are bitwise reproducible for a given shape and device.
 */
#ifndef FERRY_KERN_CUDA_MATMUL_H
#define FERRY_KERN_CUDA_MATMUL_H

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "kernels/core/dtype.h"

#define KERN_CUDA_GEMV_MAX_M 16

struct kern_cuda_ctx;

/* Creates the cuBLAS handle and a workspace for x rounded to f16/bf16 of max_x_elems elements (max m*k of the
 * cuBLAS path; larger products are done in row chunks that fit). Returns FERRY_ERR_CUDA /
 * FERRY_ERR_DEVICE_MEM. */
int kern_cuda_ctx_init(struct kern_cuda_ctx **out, size_t max_x_elems);
/* Accepts NULL and a half-built context. */
void kern_cuda_ctx_free(struct kern_cuda_ctx *ctx);
/* Device bytes the context holds (for the memory report). */
size_t kern_cuda_ctx_bytes(const struct kern_cuda_ctx *ctx);

/* Picks the path by m. FERRY_ERR_INVALID on bad shape or misaligned f32 pointers, FERRY_ERR_UNSUPPORTED for
 * other weight types. */
int kern_cuda_matmul(struct kern_cuda_ctx *ctx, float *y, const float *x, const void *w, enum dtype wt,
                     const float *bias, int m, int n, int k, cudaStream_t stream);
/* The two paths, for tests and benches: the GEMV one takes any m (in tiles of 16), the cuBLAS one any m. */
int kern_cuda_matmul_gemv(float *y, const float *x, const void *w, enum dtype wt, const float *bias, int m,
                          int n, int k, cudaStream_t stream);
int kern_cuda_matmul_cublas(struct kern_cuda_ctx *ctx, float *y, const float *x, const void *w, enum dtype wt,
                            const float *bias, int m, int n, int k, cudaStream_t stream);

/* Tuning hook for tests and benches: output rows per warp of the m = 1 GEMV, 1 or 2 (the default: each x load
 * from L1 then serves two weight rows; any other value selects it). Not thread-safe: call it before launching
 * work. */
void kern_cuda_matmul_set_m1_rows(int rows);

#ifdef __cplusplus
}
#endif

#endif
