/* forward_cuda — the Llama forward pass on one CUDA device, with layers resident or streamed from pinned
 * host memory according to a device_map (see device_map.h and DESIGN.md "Streaming").
 *
 * All device memory is one cudaMalloc sized by the plan and carved with a cursor (KV pool in f16, activations,
 * attention workspace, output head, resident layers, slot ring); cuBLAS's handle and its workspace are the only
 * other device allocations (counted in the plan's fixed bytes). Nothing is allocated per step.
 * Streaming: one contiguous pinned block per streamed layer; the n-th streamed use (counting across steps)
 * takes slot n mod k and, once the compute stream has released it, the copy for use n+k is queued there on the
 * copy stream, so the next step's first copies overlap this step's last layers. An LRU layer cache and zero-copy
 * reads of mapped host memory were measured against this ring and lost or tied (runtime/NOTES.md, run 3).
 * Weights in F16/BF16/F32 are used as stored; other types (GGUF quants) are converted to F16 at load.
 * Compiled only when the build has CUDA (FERRY_CUDA).
 */
#ifndef FERRY_FORWARD_CUDA_H
#define FERRY_FORWARD_CUDA_H

#include <stdint.h>

#include "runtime/device_map.h"
#include "runtime/engine.h"
#include "runtime/kv_cache.h"
#include "runtime/model.h"

struct forward_cuda_params {
    int max_tokens;       /* rows of one step */
    int64_t gpu_memory;   /* budget in bytes; 0: free VRAM minus reserve_vram */
    int64_t reserve_vram; /* bytes left free when gpu_memory is 0 */
    int gpu_layers;       /* -1: as many as fit */
    int n_slots;          /* 0: the planner's choice */
    /* KV pool: kv_auto 0 keeps the pool the caller sized; 1 lets the planner size it to the budget (see
     * device_map.h), between kv_tokens_min and kv_tokens_max positions, and forward_cuda_init re-sizes the
     * caller's kv_cache tables to match. */
    int kv_auto;
    int64_t kv_tokens_max, kv_tokens_floor, kv_tokens_min;
};

struct forward_cuda_stats {
    uint64_t bytes_streamed; /* host→device weight bytes */
    double copy_seconds;     /* copy-stream time spent on those bytes */
    double stall_seconds;    /* compute-stream time spent waiting for copies */
    uint64_t vram_budget;
    uint64_t vram_planned;   /* bytes the plan allocates */
    uint64_t vram_used;      /* device bytes this backend took (cudaMemGetInfo before and after init) */
};

struct forward_cuda;

int forward_cuda_init(struct forward_cuda **out, const struct model *m, struct kv_cache *kv,
                      const struct forward_cuda_params *p, char err[256]);
void forward_cuda_free(struct forward_cuda *f);
const struct device_map *forward_cuda_map(const struct forward_cuda *f);
void forward_cuda_get_stats(const struct forward_cuda *f, struct forward_cuda_stats *st);

/* Same contract as forward_cpu_run; the KV tables come from kv (host), the data lives on the device. */
int forward_cuda_run(struct forward_cuda *f, const struct model *m, const struct kv_cache *kv, const struct batch *b,
                     float *logits);

/* The device_map forward_cuda_init would choose for budget p->gpu_memory, computed without a device, with the
 * given ceilings (bytes/s) for the prediction. For `ferry inspect`. */
int forward_cuda_plan_offline(const struct model *m, const struct kv_cache *kv, const struct forward_cuda_params *p,
                              double h2d, double hbm, struct device_map *out, char err[256]);

/* Measured rates for the planner: pinned host→device and device→device bandwidth, bytes/s (0 on failure). */
void forward_cuda_measure_bandwidth(double *h2d, double *d2d);

#endif
