/* matmul_q (CUDA) — y = x · Wᵀ (+ bias) with W in a GGUF block type read as stored (Q4_0, Q4_1, Q5_0, Q5_1,
 * Q8_0, Q4_K, Q5_K, Q6_K): the weights stay as stored; each product decodes the blocks it reads on the fly.
 *
 * Three kernel families per type (kernels/cuda/matmul.cu's table picks one by type and m; callers use
 * kern_cuda_matmul): int8 paths, x first quantized to int8 per block of 32 (a pre-pass: dx = max|x|/127,
 * xq = rint(x/dx), plus the f32 sum of each block), then y = Σ_units dx·d·Σ(q+QOFF)·xq + m·Σx in int32 and
 * f32, whose error is that of x's int8 rounding (each x off by at most dx/2: |Δy| <= Σ |d·(q+QOFF)|·dx/2), as
 * in llama.cpp's MMVQ/MMQ: the dp4a GEMV (gemv_q.cu, up to KERN_CUDA_QDP4A_MAX_M rows of x per launch) and
 * the int8 tensor-core skinny GEMM (mmv_q.cu, mma.sync m16n8k32, up to KERN_CUDA_QMMA_MAX_M rows per launch);
 * and the f16 GEMM (gemm_q.cu): x rounded to f16 once, weight tiles decoded into shared memory as f16 (each
 * weight the f16 rounding of dequant_row's value, bitwise), mma.sync m16n8k16 with f32 accumulation; error
 * that of one f16 rounding of x and of W (2^-11 relative each), as on the f16 cuBLAS path. Each weight byte
 * is read from memory once per launch (once per tile of up to 128 rows of x in the GEMM). For large m
 * matmul.cu also has W decoded to f16 in pieces of rows (kern_cuda_qdequant, gemm_q.cu: the GEMM's decode,
 * bitwise) that cuBLAS multiplies, with the GEMM's arithmetic (KERN_QV_F16_PIECES). All use the
 * caller's device workspace for x (kern_cuda_qmm_x8_ws for the int8 paths, 2 bytes per element for the GEMM,
 * which runs in row chunks that fit; FERRY_ERR_RANGE when not even one row fits), allocate nothing, are
 * deterministic (fixed reduction orders, no atomics) and graph-capturable, and launch with programmatic
 * dependent launch (kernels/cuda/pdl.h). y is (m, ldy): columns [0, n) are written, the others untouched.
 * Requirements (FERRY_ERR_INVALID otherwise): k a multiple of the block size (32, or 256 for the K-quants), W
 * aligned to the type's block alignment (2 bytes for Q4_0/Q5_0/Q8_0/Q6_K, 4 for Q4_1, 8 for Q5_1, 16 for
 * Q4_K/Q5_K), x 16-byte aligned, y and bias 4-byte aligned, n <= ldy, row bytes below 2^31, W below 4 GiB.
 */
#ifndef FERRY_KERN_CUDA_MATMUL_Q_H
#define FERRY_KERN_CUDA_MATMUL_Q_H

#include <stddef.h>

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "kernels/core/dtype.h"
#include "kernels/cuda/matmul_pick.h"

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
    int x_ready; /* ws already holds x's int8 form in the natural layout (kern_cuda_qmm_x8_at), m <= 4 (8 for
                    KERN_QV_STREAM): the dp4a and stream GEMVs skip their pre-pass (the others ignore it) */
};

/* Rows of x per launch of the int8 kernels (larger m runs in row tiles of this size). */
#define KERN_CUDA_QDP4A_MAX_M   4
#define KERN_CUDA_QSTREAM_MAX_M 8
#define KERN_CUDA_QMMA_MAX_M    64

/* Workspace bytes: the int8 paths for m rows of x (the MMA kernel needs m rounded up to 8, 16, 32 or 64), the
 * GEMM for m rows (it runs in row chunks: one row is the least it needs). */
size_t kern_cuda_qmm_x8_ws(int m, int k);
/* Where the int8 form of m rows of x (k each) lies in a workspace, in the natural layout the dp4a GEMV reads
 * (kernels/cuda/x8.cuh says what each value is). */
void kern_cuda_qmm_x8_at(void *ws, int m, int k, uint8_t **xq, float **xd);
size_t kern_cuda_qmm_gemm_ws(int m, int k);

/* The variants (enum kern_cuda_qvariant) and the automatic choice among them: kernels/cuda/matmul_pick.h. */

/* Tuning hooks for tests and benches (not thread-safe; call before launching work). set_variant forces a
 * variant for every block-type product (KERN_QV_AUTO: the table), returning the previous setting or
 * FERRY_ERR_INVALID for a value out of range; a forced variant that does not apply to a type (KERN_QV_Q8OLD
 * with another type) or whose configuration the device cannot hold makes the product return
 * FERRY_ERR_UNSUPPORTED. variant_name: a short description for bench output. */
int kern_cuda_qmm_set_variant(int variant);
const char *kern_cuda_qmm_variant_name(int variant);
/* Rows of W per warp task of KERN_QV_STREAM (1, 2 or 4; 0: chosen by n), returning the previous setting or
 * FERRY_ERR_INVALID for another value. */
int kern_cuda_qstream_set_rows(int rows);

#ifdef __cplusplus
}

#include <cuda_fp16.h>

/* The kernels of a type Q of kernels/cuda/qblock.cuh (instantiated for every QB_TYPES entry), for matmul.cu.
 * Arguments are checked by the caller; each returns FERRY_ERR_RANGE when the workspace is too small for it
 * and FERRY_ERR_UNSUPPORTED when the device cannot run the configuration. */
template <class Q> int kern_cuda_qgemv(const struct kern_cuda_qmm *c, int rows_per_warp); /* 1, 2, 4 */
template <class Q> int kern_cuda_qstream(const struct kern_cuda_qmm *c);                  /* gemv_stream.cu */
template <class Q> int kern_cuda_qmmv(const struct kern_cuda_qmm *c, int row_tiles);      /* 1, 2 */
template <class Q> int kern_cuda_qgemm(const struct kern_cuda_qmm *c, int config);        /* 0: auto */
/* Rows [0, n) of W (n, k) in blocks of Q into out (n, k) f16, each value the f16 rounding of dequant_row's
 * (bitwise the GEMM's tile decode). out 16-byte aligned; W at the type's alignment. */
template <class Q> int kern_cuda_qdequant(__half *out, const void *w, int n, int k, cudaStream_t stream);
const char *kern_cuda_qgemm_config_name(int config);
#endif

#endif
