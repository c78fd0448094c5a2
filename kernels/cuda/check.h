/* check — the one checking macro for CUDA runtime and cuBLAS calls, and the launch check (C++/CUDA only).
 *
 * FCUDA_CHECK(call) evaluates a cudaError_t or cublasStatus_t expression; on failure it logs the call, file,
 * line and the library's message through kernels/core/log.h and returns FERRY_ERR_CUDA from the enclosing
 * function (which must return int). FCUDA_LAUNCH_CHECK(name) follows every kernel launch: it reports a bad
 * launch configuration at once (execution errors surface at the next synchronising call).
 */
#ifndef FERRY_KERN_CUDA_CHECK_H
#define FERRY_KERN_CUDA_CHECK_H

#include <cublas_v2.h>
#include <cuda_runtime.h>

extern "C" {
#include "kernels/core/log.h"
#include "kernels/core/status.h"
}

/* NULL when the status is a success, else the library's message. */
static inline const char *fcuda_error_str(cudaError_t e)
{
    return e == cudaSuccess ? nullptr : cudaGetErrorString(e);
}
static inline const char *fcuda_error_str(cublasStatus_t e)
{
    return e == CUBLAS_STATUS_SUCCESS ? nullptr : cublasGetStatusString(e);
}

#define FCUDA_CHECK(call)                                                                                    \
    do {                                                                                                     \
        const char *fcuda_msg_ = fcuda_error_str(call);                                                      \
        if (fcuda_msg_) {                                                                                    \
            FLOG_ERROR("%s:%d: %s failed: %s", __FILE__, __LINE__, #call, fcuda_msg_);                       \
            return FERRY_ERR_CUDA;                                                                           \
        }                                                                                                    \
    } while (0)

#define FCUDA_LAUNCH_CHECK(name)                                                                             \
    do {                                                                                                     \
        cudaError_t fcuda_e_ = cudaGetLastError();                                                           \
        if (fcuda_e_ != cudaSuccess) {                                                                       \
            FLOG_ERROR("%s:%d: launch of %s failed: %s", __FILE__, __LINE__, name,                           \
                       cudaGetErrorString(fcuda_e_));                                                        \
            return FERRY_ERR_CUDA;                                                                           \
        }                                                                                                    \
    } while (0)

/* Argument checks shared by the entry points. */
#define FCUDA_ALIGNED(p, n) ((((uintptr_t)(const void *)(p)) % (n)) == 0)

static inline unsigned fcuda_blocks(int64_t n, int threads, int64_t cap = 65535LL * 16)
{
    int64_t b = (n + threads - 1) / threads;
    if (b < 1) b = 1;
    return (unsigned)(b > cap ? cap : b);
}

/* Device properties the launch heuristics use, read once per translation unit for the current device (a
 * process drives one device); on failure a conservative value (132 SMs, 48 KiB). */
static inline int fcuda_sm_count(void)
{
    static int cached = 0;
    if (!cached) {
        int dev = 0, c = 0;
        if (cudaGetDevice(&dev) != cudaSuccess ||
            cudaDeviceGetAttribute(&c, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess || c <= 0) {
            (void)cudaGetLastError();
            return 132;
        }
        cached = c;
    }
    return cached;
}
/* Shared memory one block may opt in to (cudaFuncAttributeMaxDynamicSharedMemorySize), bytes. */
static inline int fcuda_smem_optin(void)
{
    static int cached = 0;
    if (!cached) {
        int dev = 0, c = 0;
        if (cudaGetDevice(&dev) != cudaSuccess ||
            cudaDeviceGetAttribute(&c, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) != cudaSuccess ||
            c <= 0) {
            (void)cudaGetLastError();
            return 48 << 10;
        }
        cached = c;
    }
    return cached;
}

#endif
