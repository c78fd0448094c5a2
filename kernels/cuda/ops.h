/* ops (CUDA) — the element-wise and row-wise ops of a Llama forward pass on the GPU, f32 activations.
 *
 * Same shapes and semantics as kernels/cpu/ops.h; every pointer is device memory unless stated, every call is
 * asynchronous on `stream` and returns a ferry status (FERRY_ERR_INVALID for bad shapes or misaligned
 * pointers, FERRY_ERR_UNSUPPORTED for a dtype this backend does not run, FERRY_ERR_CUDA when a launch fails).
 * Reductions use a fixed order (no atomics), so results are bitwise reproducible run to run.
 * f32 pointers must be 4-byte aligned; nothing else is required of them.
 */
#ifndef FERRY_KERN_CUDA_OPS_H
#define FERRY_KERN_CUDA_OPS_H

#include <stdint.h>

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "kernels/core/dtype.h"

/* Number of CUDA devices, 0 when there is none or the driver is absent (never an error). */
int kern_cuda_device_count(void);

/* x (m, d) f32 = rows tokens[i] (device, m) of table (n_rows, d) in dtype tt (F32, F16, BF16, Q8_0).
 * The caller checks token ids (the CPU entry returns FERRY_ERR_RANGE); an id outside [0, n_rows) on the
 * device gives a row of zeros instead of an out-of-bounds read. */
int kern_cuda_embed(float *x, const void *table, enum dtype tt, int n_rows, int d, const int32_t *tokens,
                    int m, cudaStream_t stream);

/* y (m, d) = x / sqrt(mean(x^2) + eps) * w, w (d) f32; y may alias x. */
int kern_cuda_rmsnorm(float *y, const float *x, const float *w, int m, int d, float eps, cudaStream_t stream);

/* Fused residual add + norm (one pass instead of two): resid (m, d) += delta (m, d), then
 * y (m, d) = rmsnorm(resid) * w. y must not alias resid or delta. */
int kern_cuda_add_rmsnorm(float *resid, const float *delta, float *y, const float *w, int m, int d, float eps,
                          cudaStream_t stream);

/* QK-norm in place on q|k|v rows qkv (m, ld): the n_heads query heads (head_dim floats each, from column 0)
 * are RMS-normed and scaled by qw (head_dim), the n_kv_heads key heads after them by kw; values untouched
 * (kernels/cuda/qk_norm.cu; reference kern_cpu_qk_norm_ref). head_dim <= 1024, ld >= (n_heads + n_kv_heads)
 * * head_dim. One warp per head, fixed-order reduction. */
int kern_cuda_qk_norm(float *qkv, int ld, const float *qw, const float *kw, int m, int n_heads,
                      int n_kv_heads, int head_dim, float eps, cudaStream_t stream);

/* The norm (kern_cuda_add_rmsnorm with delta, kern_cuda_rmsnorm of resid without: resid is then only read)
 * that also writes y's int8 form for the block-type products at xq, xd (kern_cuda_matmul_x8_target gives
 * them), bitwise what their pre-pass would write. FERRY_ERR_UNSUPPORTED unless d % 32 == 0, d <= 8192 and
 * every pointer is 16-byte aligned (the caller then runs the plain norm). */
int kern_cuda_norm_x8(float *resid, const float *delta, float *y, const float *w, int m, int d, float eps,
                      uint8_t *xq, float *xd, cudaStream_t stream);

/* h (m, ffn) = silu(gate) * up, where gu (m, 2*ffn) holds each row's gate then up (the fused gate|up
 * product). h must not alias gu. */
int kern_cuda_silu_mul(float *h, const float *gu, int m, int ffn, cudaStream_t stream);
/* The same with GELU (tanh approximation, transformers' gelu_pytorch_tanh): h (m, ffn) = gelu_tanh(gate) * up
 * (Gemma's GeGLU; reference kern_cpu_gelu_mul_ref). */
int kern_cuda_gelu_mul(float *h, const float *gu, int m, int ffn, cudaStream_t stream);

/* kern_cuda_silu_mul (gelu 0) or kern_cuda_gelu_mul (gelu 1), bitwise the same h, that also writes h's int8
 * form for the block-type down product at xq, xd (kern_cuda_matmul_x8_target gives them), bitwise what its
 * pre-pass would write. FERRY_ERR_UNSUPPORTED unless ffn % 32 == 0 and every pointer is 16-byte aligned (the
 * caller then runs the plain activation). */
int kern_cuda_glu_x8(float *h, const float *gu, int m, int ffn, int gelu, uint8_t *xq, float *xd,
                     cudaStream_t stream);

/* Gemma 4's extra ops (a model without them never launches these). */

/* Per-head RMSNorm in place: heads h < n_heads of each row i of x (m rows, ld floats apart), each head_dim
 * floats from column 0, become x / sqrt(mean(x^2) + eps) * w (w (head_dim) f32, or NULL: no weight, the value
 * norm). head_dim <= 1024, ld >= n_heads * head_dim. The QK-norm kernel (kernels/cuda/qk_norm.cu). */
int kern_cuda_head_rmsnorm(float *x, int ld, const float *w, int m, int n_heads, int head_dim, float eps,
                           cudaStream_t stream);
/* x (n) = (x + delta) * s[0]: delta (n) or NULL (nothing added), s one f32 on the device or NULL (1). */
int kern_cuda_add_scale(float *x, const float *delta, const float *s, int64_t n, cudaStream_t stream);
/* y (n) = (a * y + x) * b; x (n) or NULL (nothing added). */
int kern_cuda_axpby(float *y, float a, const float *x, float b, int64_t n, cudaStream_t stream);
/* Logit soft-capping in place: x (n) = c * tanh(x / c), c > 0 (kern_cpu_softcap). */
int kern_cuda_softcap(float *x, float c, int64_t n, cudaStream_t stream);
/* h (m, n) = gelu_tanh(a) * b: a (m, n) rows, b's rows ldb floats apart (a slice of a wider row). */
int kern_cuda_gelu_mul_rows(float *h, const float *a, const float *b, int ldb, int m, int n,
                            cudaStream_t stream);

/* Qwen3.5's gated attention and shared expert (a model without them never launches these). */

/* src (m, 2 n_heads head_dim + 2 kv_dim) rows whose query part holds per head its queries then its gate ->
 * qkv (m, n_heads head_dim + 2 kv_dim) rows of queries, keys, values, and gate (m, n_heads head_dim). src
 * must not overlap qkv or gate. */
int kern_cuda_q_gate_split(float *qkv, float *gate, const float *src, int m, int n_heads, int head_dim,
                           int kv_dim, cudaStream_t stream);
/* y (n) = x / (1 + exp(-gate)) (x times sigmoid(gate)); y may be x. */
int kern_cuda_sigmoid_mul(float *y, const float *x, const float *gate, int64_t n, cudaStream_t stream);
/* y (m, d) += sigmoid(x_i · g) * s_i per row i: s, x (m, d), g (d). The dot product in f32, fixed order.
 * y must not overlap s or x. */
int kern_cuda_gated_add(float *y, const float *s, const float *x, const float *g, int m, int d,
                        cudaStream_t stream);

/* Column blocks from x (m rows, ldx floats apart) to y (m rows, ldy apart): for each block b of table
 * (n_blocks, 3) int32 on the device, (dst column, src column, width), y[i][dst + c] = x[i][src + c] for c <
 * width (Qwen3-Next's packed in-products split per key head, grouped heads repeated). The blocks'
 * destinations must not overlap each other or x. n_blocks <= 65535. */
int kern_cuda_copy_blocks(float *y, int ldy, const float *x, int ldx, int m, const int32_t *table,
                          int n_blocks, cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif
