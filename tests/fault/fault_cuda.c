/* fault_cuda — the CUDA calls of the ferry_fault binary (see fault.c): device and pinned allocations fail as
 * an exhausted card does (cudaErrorMemoryAllocation), copies as a failed transfer does (cudaErrorUnknown,
 * returned at once, not sticky: the context stays usable, as after a recoverable error).
 * FERRY_FAULT_CLASS=cuda arms them. */
#include <cuda_runtime_api.h>

#include "tests/fault/fault.h"

#define RET __builtin_return_address(0)

cudaError_t __real_cudaMalloc(void **p, size_t n);
cudaError_t __real_cudaHostAlloc(void **p, size_t n, unsigned int flags);
cudaError_t __real_cudaMemcpy(void *dst, const void *src, size_t n, enum cudaMemcpyKind kind);
cudaError_t __real_cudaMemcpyAsync(void *dst, const void *src, size_t n, enum cudaMemcpyKind kind,
                                   cudaStream_t s);

cudaError_t __wrap_cudaMalloc(void **p, size_t n)
{
    if (fault_should_fail(FAULT_CUDA, RET)) return cudaErrorMemoryAllocation;
    return __real_cudaMalloc(p, n);
}

cudaError_t __wrap_cudaHostAlloc(void **p, size_t n, unsigned int flags)
{
    if (fault_should_fail(FAULT_CUDA, RET)) return cudaErrorMemoryAllocation;
    return __real_cudaHostAlloc(p, n, flags);
}

cudaError_t __wrap_cudaMemcpy(void *dst, const void *src, size_t n, enum cudaMemcpyKind kind)
{
    if (fault_should_fail(FAULT_CUDA, RET)) return cudaErrorUnknown;
    return __real_cudaMemcpy(dst, src, n, kind);
}

cudaError_t __wrap_cudaMemcpyAsync(void *dst, const void *src, size_t n, enum cudaMemcpyKind kind,
                                   cudaStream_t s)
{
    if (fault_should_fail(FAULT_CUDA, RET)) return cudaErrorUnknown;
    return __real_cudaMemcpyAsync(dst, src, n, kind, s);
}
