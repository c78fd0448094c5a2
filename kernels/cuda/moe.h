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
 * xdiv = 1 and the routing weights, which is the weighted sum. One warp per output element, lane partial sums
 * added in a fixed butterfly order: deterministic. Float weights (F32, F16, BF16) multiply their exact values
 * with f32 x; block types multiply with x's int8 form (kern_cuda_moe_x8: per block of 32, as the dense int8
 * products of kernels/cuda/matmul_q.h round it), whose error is that of x's rounding (each x off by at most
 * dx/2). kern_cuda_moe_combine is the weighted sum for the grouped large-batch path (rows sorted by expert,
 * products by kern_cuda_matmul,
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

/* x's int8 form for the block-type GEMV: m rows of cols (a multiple of 32) at stride ldx (a multiple of 4, x
 * 16-byte aligned) into x8 (16-byte aligned, kern_cuda_moe_x8_bytes(m, cols) bytes; 0 for a bad shape). */
size_t kern_cuda_moe_x8_bytes(int m, int cols);
int kern_cuda_moe_x8(void *x8, const float *x, int ldx, int m, int cols, cudaStream_t stream);

/* The grouped GEMV (see above). w: n_expert stacked (rows, cols) matrices of type t (expert e's at
 * e * rows * row bytes); x rows of cols floats at stride ldx; for block types x8 holds the int8 form of
 * exactly the rows the pairs read, (n_out * J - 1) / xdiv + 1 of them (kern_cuda_moe_x8; x itself is then
 * not read), for float types x8 is ignored; bias (n_expert, rows) f32 or NULL: each pair's product plus
 * its expert's bias row (before the pair's weight); y (n_out, ldy), columns [0, rows) written. An id outside
 * 0..n_expert-1 contributes nothing. FERRY_ERR_INVALID on a bad shape (cols not a multiple of the type's
 * block, rows > ldy, J or xdiv < 1, no x8 for a block type), FERRY_ERR_UNSUPPORTED for another type. */
int kern_cuda_moe_gemv(float *y, int ldy, const float *x, int ldx, const void *x8, const void *w,
                       enum dtype t, const float *bias, int n_expert, int rows, int cols, const int32_t *ids,
                       const float *wts, int n_out, int J, int xdiv, cudaStream_t stream);

/* Many rows, block types: the pairs sorted by expert on the device (no host round trip), then one launch per
 * matrix on the tensor cores (int8 mma.sync) that reads each chosen expert's rows once per 32 of its pairs
 * (the tiled kernel: W and the pairs' x staged in shared memory per block; the warp kernel it replaced read
 * them once per 8 pairs, per warp, and stays selectable).
 * kern_cuda_moe_sort: off (n_expert + 1) the start of each expert's pairs in order (P) and the end; pairs
 * with an id out of range are left out. kern_cuda_moe_grouped: for every pair p in order, y row p, columns
 * [0, rows), = the dot products of expert ids[p]'s rows (w as in kern_cuda_moe_gemv, block types only) with
 * row p / xdiv of x, read as the int8 form in x8 of x_rows rows (kern_cuda_moe_x8), the GEMV's arithmetic per
 * pair, plus the expert's bias row (as in kern_cuda_moe_gemv); unweighted. Rows of y of pairs left out are
 * not written. FERRY_ERR_INVALID on a bad shape, FERRY_ERR_UNSUPPORTED for a float type. */
int kern_cuda_moe_sort(const int32_t *ids, int P, int n_expert, int32_t *off, int32_t *order,
                       cudaStream_t stream);
int kern_cuda_moe_grouped(float *y, int ldy, const void *x8, int x_rows, const void *w, enum dtype t,
                          const float *bias, int n_expert, int rows, int cols, const int32_t *off,
                          const int32_t *order, int xdiv, cudaStream_t stream);

/* Which kernel kern_cuda_moe_grouped runs (a tuning hook for tests and benches; not thread-safe, set it
 * before launching work): AUTO the tiled one where the device's shared memory holds its stages, else the warp
 * one; WARP (16 rows by 8 pairs per warp, no staging) or TILE forced (TILE: FERRY_ERR_UNSUPPORTED where it
 * cannot run). The same bits either way. The default is AUTO (measured on an H100, Qwen3-30B-A3B's expert
 * shape: the tiled kernel 2.3x the warp one at 64 rows, 4.2x at 256-512; NOTES.md); FERRY_MOE_GROUPED=warp or
 * =tile forces one at start. Returns the previous setting, or FERRY_ERR_INVALID for another value. */
enum { KERN_CUDA_MOE_GROUPED_AUTO = 0, KERN_CUDA_MOE_GROUPED_WARP = 1, KERN_CUDA_MOE_GROUPED_TILE = 2 };
int kern_cuda_moe_grouped_set_kind(int kind);

/* gpt-oss's clamped SwiGLU, kernels/cpu/ops.h's kern_cpu_swiglu_clamped: h (m, ffn) from gu (m, 2 ffn),
 * each row gate | up. */
int kern_cuda_moe_swiglu_clamped(float *h, const float *gu, int m, int ffn, float alpha, float limit,
                                 cudaStream_t stream);

/* y (n, d) = sum over j < k of wts[t*k + j] * yp row slot[t*k + j] (row t*k + j with slot NULL), in j
 * order. */
int kern_cuda_moe_combine(float *y, const float *yp, const int32_t *slot, const float *wts, int n, int k,
                          int d, cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif
