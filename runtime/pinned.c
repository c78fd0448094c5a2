/* pinned — host memory the GPU works with (see pinned.h). */
#include "runtime/pinned.h"

#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include <cuda_runtime_api.h>

#include "kernels/core/log.h"
#include "kernels/core/status.h"
#include "kernels/cpu/threadpool.h"

int pinned_block_alloc(struct pinned_block *h, size_t bytes)
{
    h->p = NULL;
    h->bytes = bytes;
    h->registered = 0;
    const char *wc = getenv("FERRY_HOST_WC");
    if (wc && *wc == '1') {
        FLOG_INFO("host layers in write-combined pinned memory (FERRY_HOST_WC=1)");
        if (cudaHostAlloc(&h->p, bytes, cudaHostAllocWriteCombined) == cudaSuccess) return FERRY_OK;
        h->p = NULL;
        return FERRY_ERR_NOMEM;
    }
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p != MAP_FAILED) {
        const int nodes = tpool_numa_nodes();
        if (nodes > 1 && tpool_numa_interleave(p, bytes) == FERRY_OK)
            FLOG_INFO("host layers: pages interleaved over %d NUMA nodes", nodes);
        madvise(p, bytes, MADV_HUGEPAGE);
        if (cudaHostRegister(p, bytes, cudaHostRegisterDefault) == cudaSuccess) {
            h->p = p;
            h->registered = 1;
            return FERRY_OK;
        }
        cudaGetLastError();
        munmap(p, bytes);
    }
    if (cudaHostAlloc(&h->p, bytes, cudaHostAllocDefault) == cudaSuccess) return FERRY_OK;
    h->p = NULL;
    return FERRY_ERR_NOMEM;
}

void pinned_block_free(struct pinned_block *h)
{
    if (!h->p) return;
    if (h->registered) {
        cudaHostUnregister(h->p);
        munmap(h->p, h->bytes);
    } else {
        cudaFreeHost(h->p);
    }
    h->p = NULL;
}

void *pinned_mapped_alloc(size_t bytes)
{
    void *p = NULL;
    if (cudaHostAlloc(&p, bytes ? bytes : 1, cudaHostAllocMapped | cudaHostAllocPortable) != cudaSuccess) {
        cudaGetLastError();
        return NULL;
    }
    return p;
}

void pinned_mapped_free(void *p)
{
    if (p) cudaFreeHost(p);
}

const void *pinned_device_ptr(const void *host)
{
    void *d = NULL;
    if (cudaHostGetDevicePointer(&d, (void *)host, 0) != cudaSuccess) {
        cudaGetLastError();
        return host;
    }
    return d;
}

void pinned_measure_link(double *h2d, double *d2d)
{
    *h2d = *d2d = 0;
    const size_t bytes = 256u << 20;
    void *host = NULL, *a = NULL, *b = NULL;
    cudaEvent_t e0 = NULL, e1 = NULL;
    if (cudaHostAlloc(&host, bytes, cudaHostAllocDefault) != cudaSuccess) goto out;
    if (cudaMalloc(&a, bytes) != cudaSuccess || cudaMalloc(&b, bytes) != cudaSuccess) goto out;
    memset(host, 1, bytes);
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    float ms = 0;
    cudaMemcpy(a, host, bytes, cudaMemcpyHostToDevice); /* warm-up */
    cudaEventRecord(e0, 0);
    for (int i = 0; i < 4; i++) cudaMemcpyAsync(a, host, bytes, cudaMemcpyHostToDevice, 0);
    cudaEventRecord(e1, 0);
    cudaEventSynchronize(e1);
    if (cudaEventElapsedTime(&ms, e0, e1) == cudaSuccess && ms > 0) *h2d = 4.0 * bytes / (ms * 1e-3);
    cudaMemcpy(b, a, bytes, cudaMemcpyDeviceToDevice);
    cudaEventRecord(e0, 0);
    for (int i = 0; i < 8; i++) cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, 0);
    cudaEventRecord(e1, 0);
    cudaEventSynchronize(e1);
    /* A device copy reads and writes every byte. */
    if (cudaEventElapsedTime(&ms, e0, e1) == cudaSuccess && ms > 0) *d2d = 2.0 * 8 * bytes / (ms * 1e-3);
out:
    if (e0) cudaEventDestroy(e0);
    if (e1) cudaEventDestroy(e1);
    cudaFree(a);
    cudaFree(b);
    if (host) cudaFreeHost(host);
    cudaGetLastError();
}
