/* matmul_q (CUDA) — y = x · Wᵀ (+ bias) with W in a GGUF block type read as stored (Q4_0, Q4_1, Q5_0, Q5_1,
 * Q8_0, Q4_K, Q5_K, Q6_K): the weights are never converted as a whole, each block is decoded in registers.
 *
 * Two kernels per type (kernels/cuda/matmul.cu's type table picks between them; callers use
 * kern_cuda_matmul): GEMV (decode, small m): x is first quantized to int8 per block of 32
 * (kern_cuda_qmm_gemv's pre-pass: dx = max|x|/127, xq = rint(x/dx), plus the f32 sum of each block), then
 * each weight unit of 32 is multiplied with dp4a in int32 and scaled in f32: y = Σ_units dx·d·Σ(q+QOFF)·xq +
 * m·Σx. The error is that of x's int8 rounding (each x off by at most dx/2: |Δy| <= Σ |d·(q+QOFF)|·dx/2), as
 * in llama.cpp's MMVQ. GEMM (prefill, larger m): x is rounded to f16 once (a pre-pass), weight tiles are
 * decoded into shared memory as f16 (each weight the f16 rounding of dequant_row's value, bitwise) and
 * multiplied on tensor cores (mma.sync m16n8k16, f32 accumulation); each weight tile is read once per tile of
 * up to 128 rows of x. The error is that of one f16 rounding of x and of W (2^-11 relative each), as on the
 * f16 cuBLAS path. Both need the caller's device workspace for x (1.5 bytes per element of x for the GEMV, 2
 * for the GEMM; larger products run in row chunks that fit, FERRY_ERR_RANGE when not even one row fits),
 * allocate nothing, are deterministic (fixed reduction orders, no atomics) and graph-capturable, and launch
 * with programmatic dependent launch (kernels/cuda/pdl.h). y is (m, ldy): columns [0, n) are written, the
 * others untouched. Requirements (FERRY_ERR_INVALID otherwise): k a multiple of the block size (32, or 256
 * for the K-quants), W aligned to the type's block alignment (2 bytes for Q4_0/Q5_0/Q8_0/Q6_K, 4 for Q4_1, 8
 * for Q5_1, 16 for Q4_K/Q5_K), x 16-byte aligned, y and bias 4-byte aligned, n <= ldy, row bytes below 2^31.
 */
#ifndef FERRY_KERN_CUDA_MATMUL_Q_H
#define FERRY_KERN_CUDA_MATMUL_Q_H

#include <stddef.h>

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "kernels/core/dtype.h"

struct kern_cuda_qmm {
    float *y; /* (m, ldy) f32 */
    int ldy;
    const float *x;    /* (m, k) f32, 16-byte aligned */
    const void *w;     /* (n, k) in blocks of type t */
    const float *bias; /* (n) f32 or NULL */
    int m, n, k;
    void *ws; /* device workspace, 16-byte aligned */
    size_t ws_bytes;
    cudaStream_t stream;
};

/* The int8 GEMV takes row tiles of at most KERN_CUDA_QGEMV_MAX_M rows; kern_cuda_matmul sends batches of up
 * to kern_cuda_qmm_set_gemv_max_m's threshold (default KERN_CUDA_QGEMV_DEFAULT_M) to it, larger ones to the
 * GEMM. */
#define KERN_CUDA_QGEMV_MAX_M     8
#define KERN_CUDA_QGEMV_DEFAULT_M 4

/* Workspace bytes each kernel needs for m rows of x of k elements. */
size_t kern_cuda_qmm_gemv_ws(int m, int k);
size_t kern_cuda_qmm_gemm_ws(int m, int k);

/* Tuning hooks for tests and benches (not thread-safe; call before launching work). Each returns the previous
 * setting, or FERRY_ERR_INVALID for a value out of range.
 * gemv_max_m: the largest m kern_cuda_matmul sends to the GEMV (0..KERN_CUDA_QGEMV_MAX_M; -1 restores the
 * default). gemv/gemm config: force a kernel configuration (1..count), 0 for the automatic choice. */
int kern_cuda_qmm_set_gemv_max_m(int m);
#define KERN_CUDA_QGEMV_CONFIGS 3
int kern_cuda_qmm_set_gemv_config(int config);
const char *kern_cuda_qmm_gemv_config_name(int config);
#define KERN_CUDA_QGEMM_CONFIGS 9
int kern_cuda_qmm_set_gemm_config(int config);
const char *kern_cuda_qmm_gemm_config_name(int config);

#ifdef __cplusplus
}

/* The two kernels of a type Q of kernels/cuda/qblock.cuh (instantiated for every QB_TYPES entry), for
 * matmul.cu's type table. Arguments are checked by the caller; the GEMV's workspace holds
 * kern_cuda_qmm_gemv_ws(min(m, KERN_CUDA_QGEMV_MAX_M), k) bytes, the GEMM's at least kern_cuda_qmm_gemm_ws(1,
 * k) (it runs in row chunks that fit). */
template <class Q> int kern_cuda_qgemv(const struct kern_cuda_qmm *c);
template <class Q> int kern_cuda_qgemm(const struct kern_cuda_qmm *c);
#endif

#endif
