/* cuda_check — the checking macro of the runtime's C files that call the CUDA runtime (forward_cuda.c,
 * draw_cuda.c): CK(call) evaluates a cudaError_t expression; on failure it logs the call, file, line and
 * CUDA's message and returns FERRY_ERR_CUDA from the enclosing function (which must return int). The kernels'
 * C++ files have kernels/cuda/check.h (cuBLAS statuses too). */
#ifndef FERRY_RUNTIME_CUDA_CHECK_H
#define FERRY_RUNTIME_CUDA_CHECK_H

#include <cuda_runtime_api.h>

#include "kernels/core/log.h"
#include "kernels/core/status.h"

#define CK(call)                                                                                             \
    do {                                                                                                     \
        cudaError_t ck_e_ = (call);                                                                          \
        if (ck_e_ != cudaSuccess) {                                                                          \
            FLOG_ERROR("%s:%d: %s failed: %s", __FILE__, __LINE__, #call, cudaGetErrorString(ck_e_));        \
            return FERRY_ERR_CUDA;                                                                           \
        }                                                                                                    \
    } while (0)

#endif
