/* forward_cuda_moe_impl — the state of the CUDA backend's expert layers, shared by the two files that run
 * them: forward_cuda_moe.c (routers, resident experts, host experts, streaming) and forward_cuda_moe_cache.c
 * (the device expert cache). Nothing else includes it: the rest of the backend sees forward_cuda_moe.h.
 * Device buffers are carved by cuda_moe_init from the caller's memory; pinned buffers are its own.
 */
#ifndef FERRY_FORWARD_CUDA_MOE_IMPL_H
#define FERRY_FORWARD_CUDA_MOE_IMPL_H

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#include "kernels/cpu/moe.h"
#include "runtime/forward_cuda_moe.h"
#include "runtime/model.h"
#include "runtime/pinned.h"

#define RC(call)                                                                                             \
    do {                                                                                                     \
        int rc_ = (call);                                                                                    \
        if (rc_) return rc_;                                                                                 \
    } while (0)

#define MOE_ALIGN 256
static inline size_t align_up(size_t x)
{
    return (x + MOE_ALIGN - 1) & ~(size_t)(MOE_ALIGN - 1);
}

static inline size_t view_bytes(const struct wview *w)
{
    return dtype_row_size(w->type, w->cols) * (size_t)w->rows;
}

struct moe_job {
    struct cuda_moe *mo;
    int l, n;
};

struct moe_cache; /* forward_cuda_moe_cache.c */

struct cuda_moe {
    const struct model *m;
    int n_layers, n_expert, k, dim, ffn, norm;
    int T;      /* rows of a chunk (the scratch's) */
    int T_step; /* rows of a step at most */
    /* Device. */
    void **router;  /* (n_layers) each layer's router (n_expert, dim) in its stored type */
    void **experts; /* (n_layers) gate, up, down at 256-byte boundaries, or NULL: in host memory */
    float *logits;  /* (T, n_expert) */
    int32_t *ids;   /* (T, k) */
    float *wts;     /* (T, k) */
    float *gu;      /* (T k, 2 ffn) each pair's gate | up rows */
    float *h;       /* (T k, ffn) */
    float *xs;      /* (T k, dim) the grouped path's gathered rows, then its products' rows */
    int32_t *idx;   /* (2, T k) the grouped path's row of each sorted pair | sorted row of each pair */
    void *x8;       /* x8_bytes: the int8 form of x or of h for the GEMV and the grouped products */
    int32_t *off;   /* (n_expert + 1) the device-sorted pairs' start per expert */
    int32_t *sids;  /* (T, k) the expert cache's slot of each pair, -1 for the host's */
    /* gpt-oss (LOP_MOE_CLAMPED): the clamped SwiGLU's gain and clamp, and each layer's biases on the device:
     * router (n_expert), then gate and up (n_expert, ffn) each, then down (n_expert, dim); NULL elsewhere. */
    int clamped;
    float alpha, limit;
    float **bias;
    /* Host: the grouped path's exchange and the host experts' rows. */
    int32_t *h_ids; /* (T, k) pinned */
    float *h_wts;   /* (T, k) pinned */
    int32_t *h_idx; /* (2, T k) pinned */
    int *count;     /* (n_expert + 1) */
    float *h_x;     /* (T, dim) pinned: the rows of a host-experts layer */
    float *h_y;     /* (T, dim) pinned, mapped: their result */
    float *ws;      /* kern_cpu_moe_ws_floats(T) */
    struct tpool *pool;
    struct moe_job *jobs; /* (n_layers, chunks of a step): each host function's argument */
    int n_host;
    int rc; /* the first failure of a host function */
    int cpu_int8; /* the host functions' arithmetic (kern_cpu_matmul_set_act: per thread, and a host function
                   * runs on a thread of the CUDA runtime that the engine never set) */
    /* Host experts: each host layer's gate, up, down in pinned memory at the device layout's offsets (NULL:
     * the model's own tensors, when pinning failed), and the device's staging area for streaming them. */
    struct pinned_block pin;
    char **hexp; /* (n_layers) */
    char *stage; /* cuda_moe_stage_bytes, or NULL */
    int stream_min_rows;
    uint64_t host_runs, stream_runs, stream_bytes;
    struct moe_cache *cache; /* the device expert cache, or NULL (none: host layers as above) */
};

/* Experts in the device layout at a base: gate, up, down of ne stacked experts at 256-byte boundaries, and
 * the id table the kernels read (each pair's expert, or its slot in the cache; out of range: left out). */
struct dev_experts {
    const char *gate, *up, *down;
    enum dtype gate_t, up_t, down_t;
    const float *gate_b, *up_b, *down_b; /* (ne, ffn | dim) on the device, or NULL */
    size_t gate_e, up_e, down_e;         /* bytes of one expert's matrix */
    const int32_t *ids;                  /* (T, k) on the device */
    int ne;                              /* experts at the base */
    int partial;                         /* some pairs are left out (computed by the host) */
};

/* Layer l's experts in the device layout at base (n_expert of them, mo->ids). */
struct dev_experts moe_dev_experts_at(const struct cuda_moe *mo, int l, const char *base);
/* The host experts of layer l: the pinned copy, else the model's tensors. */
struct kern_cpu_moe_experts moe_host_experts_of(const struct cuda_moe *mo, int l);
double moe_now_s(void);
/* h (P, ffn) from gu (P, 2 ffn): silu(gate)·up, or gpt-oss's clamped SwiGLU. */
int moe_activate(const struct cuda_moe *mo, int P, cudaStream_t cs);
/* y (n, dim) = the experts of d on x (n, dim): few rows by the grouped GEMV, more (block types) by the
 * device-sorted grouped launches. */
int moe_run_gemv(struct cuda_moe *mo, const struct dev_experts *d, float *y, const float *x, int n,
                 cudaStream_t cs);
int moe_run_grouped(struct cuda_moe *mo, const struct dev_experts *d, float *y, const float *x, int n,
                    cudaStream_t cs);
/* Host layer l's chosen experts copied into the staging area and run there. */
int moe_run_stream(struct cuda_moe *mo, int l, struct kern_cuda_ctx *kctx, float *y, const float *x, int n,
                   cudaStream_t cs);

/* The cache (forward_cuda_moe_cache.c). moe_cache_init: slots for the host layers in `bytes` of device memory
 * at `mem`, filled with the start-up residency, the policy timed on this host (FERRY_OK with no cache when no
 * slot fits). moe_cache_takes: 1 when the cache runs layer l's step of n rows. moe_cache_run: the step (the
 * router has run: mo->ids, mo->wts). */
int moe_cache_init(struct cuda_moe *mo, void *mem, uint64_t bytes, double h2d, double hbm);
void moe_cache_free(struct moe_cache *mc);
int moe_cache_takes(const struct cuda_moe *mo, int l, int n);
int moe_cache_run(struct cuda_moe *mo, int l, struct kern_cuda_ctx *kctx, float *y, const float *x, int n,
                  cudaStream_t cs);

#endif
