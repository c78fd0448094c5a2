/* matmul (CUDA) — y = x · Wᵀ (+ bias) on the GPU with the weight in its stored type.
 *
 * Same contract as kernels/cpu/matmul.h except for y's row stride: W (n, k) row-major in F16, BF16, F32 or a
 * GGUF block type (every quantized type of quant/dtype.h: kernels/cuda/qblock.cuh), x (m, k) f32, y (m, ldy)
 * f32 of which columns [0, n) are written (n <= ldy; the others are untouched, so products of different types
 * can fill column slices of one buffer), bias (n) f32 or NULL, all device memory. One table in matmul.cu
 * gives each type two entries. F32/F16/BF16 pick by m: m <= KERN_CUDA_GEMV_MAX_M (decode) a GEMV that streams
 * W once with 16-byte loads (m = 1 and F32: f32 math, products exact; m = 2..16 with F16/BF16: tensor cores,
 * x rounded to the weight's type once); m > KERN_CUDA_GEMV_MAX_M (prefill) cuBLAS on tensor cores
 * (cublasGemmEx, f32 accumulation, x first rounded to the weight's type). Block types take, at any m, the
 * kernel the automatic choice (kernels/cuda/matmul_pick.h) gives for the type and m among those of
 * kernels/cuda/matmul_q.h: the dp4a GEMV and the int8 tensor-core skinny GEMM (x quantized to int8 per block
 * of 32) for decode batches; for large ones (prefill, from KERN_CUDA_W16_MIN_M rows where measured faster) W
 * decoded to f16 in pieces of rows that fit the context's piece buffer, each piece multiplied by cuBLAS, or
 * without that buffer the f16 tensor-core GEMM that decodes W's tiles in shared memory (either way x and W
 * rounded to f16 once, f32 accumulation); W is never converted in place or kept in f16. The error of each
 * path is stated where it is implemented (matmul.cu, matmul_q.h). A context owns the cuBLAS handle and the
 * workspaces (allocated once at init, never per call); it belongs to one thread (the engine thread). Every
 * call is asynchronous on `stream`, graph-capturable, and bitwise reproducible for a given shape and device
 * (no atomics in reductions).
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
#include "kernels/cuda/matmul_pick.h" /* KERN_CUDA_W16_MIN_M */

#define KERN_CUDA_GEMV_MAX_M 16

struct kern_cuda_ctx;

/* Creates the cuBLAS handle, a workspace for x of max_x_elems elements (2 bytes each: x rounded to
 * f16/bf16 for cuBLAS and the block-type GEMM, or x as int8 plus its scales for the block-type GEMV) and a
 * piece buffer of w16_bytes (0: none) for block-type W decoded to f16 (kern_cuda_w16_bytes sizes it).
 * Products whose x is larger run in row chunks that fit; a block type needs at least one row of x
 * (FERRY_ERR_RANGE otherwise). Returns FERRY_ERR_CUDA / FERRY_ERR_DEVICE_MEM. */
int kern_cuda_ctx_init(struct kern_cuda_ctx **out, size_t max_x_elems, size_t w16_bytes);
/* Accepts NULL and a half-built context. */
void kern_cuda_ctx_free(struct kern_cuda_ctx *ctx);
/* Device bytes the context holds (for the memory report). */
size_t kern_cuda_ctx_bytes(const struct kern_cuda_ctx *ctx);
/* Device bytes a context made with these sizes will hold; needs no device (the planner counts it). */
size_t kern_cuda_ctx_size(size_t max_x_elems, size_t w16_bytes);
/* The piece buffer an engine needs: 0 when its products never reach KERN_CUDA_W16_MIN_M rows (the automatic
 * choice decodes W to f16 only from there), else the largest block-type matrix in f16 (max_w16_elems
 * elements), capped at KERN_CUDA_W16_MAX_BYTES (larger matrices run in pieces). */
size_t kern_cuda_w16_bytes(int max_m, size_t max_w16_elems);
#define KERN_CUDA_W16_MAX_BYTES ((size_t)64 << 20)

/* 1 if the device can multiply weights of type t (an entry of the type table), else 0. */
int kern_cuda_matmul_supports(enum dtype t);

/* Picks the entry by m. FERRY_ERR_INVALID on a bad shape (k not a multiple of the type's block, n > ldy),
 * misaligned pointers (y, bias 4 bytes; x 16 bytes for block types; W the type's block alignment, see
 * matmul_q.h) or a missing context where one is needed; FERRY_ERR_UNSUPPORTED for other weight types;
 * FERRY_ERR_RANGE when the context's workspace cannot hold one row of x. ctx may be NULL for F32/F16/BF16
 * (the GEMV then takes every m, in tiles of 16). */
int kern_cuda_matmul(struct kern_cuda_ctx *ctx, float *y, int ldy, const float *x, const void *w,
                     enum dtype wt, const float *bias, int m, int n, int k, cudaStream_t stream);
/* The two entries, for tests and benches, at any m: the decode one (tiles of 16 rows; block types: the
 * automatic choice, ctx needed) and the large-batch one (ctx needed; block types: the f16 GEMM). */
int kern_cuda_matmul_gemv(struct kern_cuda_ctx *ctx, float *y, int ldy, const float *x, const void *w,
                          enum dtype wt, const float *bias, int m, int n, int k, cudaStream_t stream);
int kern_cuda_matmul_gemm(struct kern_cuda_ctx *ctx, float *y, int ldy, const float *x, const void *w,
                          enum dtype wt, const float *bias, int m, int n, int k, cudaStream_t stream);

/* The int8 form of x that block-type products of type wt read at m rows (x quantized per block of 32, their
 * pre-pass; kernels/cuda/x8.cuh), for a kernel that writes it beside x (kern_cuda_norm_x8): where to write it
 * (xq, xd in the context's workspace). The products that follow on the same x, m and k then skip their
 * pre-pass, until a product on another x or one that rewrites the workspace. FERRY_ERR_UNSUPPORTED when
 * type wt at m does not read that form (the caller then writes x alone), FERRY_ERR_RANGE when the workspace
 * cannot hold it. The caller must write it before the next product on this stream, or call this again with x
 * NULL (nothing else needed) to forget it. */
int kern_cuda_matmul_x8_target(struct kern_cuda_ctx *ctx, const float *x, enum dtype wt, int m, int k,
                               uint8_t **xq, float **xd);

/* Tuning hook for tests and benches: output rows per warp of the m = 1 GEMV, 1 or 2 (the default: each x load
 * from L1 then serves two weight rows; any other value selects it). Not thread-safe: call it before launching
 * work. */
void kern_cuda_matmul_set_m1_rows(int rows);

#ifdef __cplusplus
}
#endif

#endif
