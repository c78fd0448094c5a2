/* convert (CUDA) — weight conversions on the device: Q8_0 rows to f16, so that a quantized matrix can go
 * through the tensor-core GEMM for prefill-sized batches (the GEMV reads Q8_0 directly for decode).
 * Exact: every Q8_0 value d*q has |q| <= 127 and d an f16, so d*q rounds to f16 with one rounding, the same
 * value dequant_row gives after f32_to_f16. All pointers device memory; asynchronous on `stream`. */
#ifndef FERRY_KERN_CUDA_CONVERT_H
#define FERRY_KERN_CUDA_CONVERT_H

#include <stdint.h>

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

/* dst (rows, cols) f16 from src (rows, cols) Q8_0; cols a multiple of 32. */
int kern_cuda_q8_0_to_f16(uint16_t *dst, const void *src, int64_t rows, int64_t cols, cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif
