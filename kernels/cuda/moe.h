/* moe (CUDA) — the Mixture-of-Experts FFN on the device: the router's top-k choice and the chosen experts'
 * products, with the experts' weights read in their stored type (F32, F16, BF16 or any GGUF block type of
 * kernels/cuda/qblock.cuh), never inflated.
 *
 * Routing (kern_cuda_moe_route) is kernels/cpu/moe.h's kern_cpu_moe_route on the device, bit for bit in the
 * choice: per token, softmax over the router's logits in double precision, the k largest logits taken one
 * after another with ties to the lowest expert id, weights the chosen probabilities (divided by their sum
 * with norm). The experts' products (kern_cuda_moe_gemv) are a grouped GEMV that reads each (token, expert)
 * pair's expert from the device's id table, so a whole MoE layer runs without the host seeing the routing
 * (CUDA-graph friendly): output row o, column r is the sum over j < J of wts[o*J + j] (1 when wts is NULL)
 * times the dot product of row r of expert ids[o*J + j] with row (o*J + j) / xdiv of x. The gate and up
 * products take J = 1, xdiv = k (one output row per pair, x the token's row); the down product takes J = k,
 * xdiv = 1 and the routing weights, which is the weighted sum. One warp per output element, f32 products of
 * the weights' exact f32 values with x, lane partial sums added in a fixed butterfly order: deterministic,
 * and as accurate as a plain f32 dot product (no int8 rounding of x). kern_cuda_moe_combine is the weighted
 * sum for the grouped large-batch path (rows sorted by expert, products by kern_cuda_matmul,
 * runtime/forward_cuda_moe.c). All calls are asynchronous on `stream` and allocate nothing.
 */
#ifndef FERRY_KERN_CUDA_MOE_H
#define FERRY_KERN_CUDA_MOE_H

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "kernels/core/dtype.h"

/* ids, wts (n, k) from logits (n, n_expert), all device memory. FERRY_ERR_INVALID for k outside 1..n_expert,
 * n < 1 or n_expert > KERN_CUDA_MOE_MAX_EXPERTS. */
#define KERN_CUDA_MOE_MAX_EXPERTS 4096
int kern_cuda_moe_route(const float *logits, int n, int n_expert, int k, int norm, int32_t *ids, float *wts,
                        cudaStream_t stream);

/* 1 if kern_cuda_moe_gemv reads weights of type t. */
int kern_cuda_moe_supports(enum dtype t);

/* The grouped GEMV (see above). w: n_expert stacked (rows, cols) matrices of type t (expert e's at
 * e * rows * row bytes); x rows of cols floats at stride ldx; y (n_out, ldy), columns [0, rows) written. An
 * id outside 0..n_expert-1 contributes nothing. FERRY_ERR_INVALID on a bad shape (cols not a multiple of the
 * type's block, rows > ldy, J or xdiv < 1), FERRY_ERR_UNSUPPORTED for another type. */
int kern_cuda_moe_gemv(float *y, int ldy, const float *x, int ldx, const void *w, enum dtype t, int n_expert,
                       int rows, int cols, const int32_t *ids, const float *wts, int n_out, int J, int xdiv,
                       cudaStream_t stream);

/* y (n, d) = sum over j < k of wts[t*k + j] * yp row slot[t*k + j], in j order. */
int kern_cuda_moe_combine(float *y, const float *yp, const int32_t *slot, const float *wts, int n, int k,
                          int d, cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif
