/* pinned — host memory the GPU works with: the host layers' blocks, the buffers exchanged with the host's
 * cores, and the rates of the link (CUDA builds only; used by forward_cuda.c).
 *
 * Host layers' blocks are cacheable pinned memory, because the host's cores read them too: write-combined
 * memory (cudaHostAllocWriteCombined, what they were before) is uncached for CPU reads, tens of
 * times slower to read, and gains nothing for the GPU's copies (runtime/NOTES.md). They are mapped
 * anonymously and registered (cudaHostRegister), so that the pages can be spread over the NUMA nodes and be
 * transparent huge pages before the registration faults them in; FERRY_HOST_WC=1 restores the write-combined
 * allocation, for measuring that choice (tests/runtime/bench_host_memory measures both). Exchange buffers are
 * small, cudaHostAlloc'd and mapped, so kernels can read them in place.
 */
#ifndef FERRY_PINNED_H
#define FERRY_PINNED_H

#include <stddef.h>

struct pinned_block {
    void *p;
    size_t bytes;
    int registered; /* 1: mmap + cudaHostRegister; 0: cudaHostAlloc */
};

/* FERRY_OK or FERRY_ERR_NOMEM. Falls back to cudaHostAlloc when registration fails. */
int pinned_block_alloc(struct pinned_block *b, size_t bytes);
void pinned_block_free(struct pinned_block *b); /* accepts a block never allocated */

/* Pinned, device-mapped memory (NULL on failure), and its device address (the same pointer under unified
 * addressing). */
void *pinned_mapped_alloc(size_t bytes);
void pinned_mapped_free(void *p);
const void *pinned_device_ptr(const void *host);

/* Pinned host→device and device→device copy rates, bytes/s (0 on failure). */
void pinned_measure_link(double *h2d, double *d2d);

#endif
