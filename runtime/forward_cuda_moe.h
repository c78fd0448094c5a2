/* forward_cuda_moe — the expert layers (LOP_MOE) of the CUDA backend: each layer's router on the device, its
 * experts on the device (resident) or in host memory (computed by the host's cores, or streamed), per layer.
 *
 * Every expert layer runs its router on the device (logits by kern_cuda_matmul, the top-k by
 * kern_cuda_moe_route). A layer with resident experts then runs them on the device: up to
 * CUDA_MOE_GEMV_MAX_ROWS rows (decode steps, the ones graphs capture) by the grouped GEMV that reads the
 * routing from the device (no host round trip); up to CUDA_MOE_GROUPED_MAX_ROWS rows, when every expert
 * matrix is in a block type, are sorted by expert on the device and run by one grouped launch per matrix that
 * reads each chosen expert once per 8 of its rows (kern_cuda_moe_sort, kern_cuda_moe_grouped: still no host
 * round trip), and summed back per token in a fixed order (larger steps on such experts run in chunks of
 * that many rows); float experts are grouped by expert on the host (the ids come down, the host counts the
 * rows of each expert, their indices go up), gathered and multiplied expert by expert by kern_cuda_matmul.
 * A layer whose experts live in host memory (the first cpu_moe layers, llama.cpp's --n-cpu-moe) sends its normed rows
 * and routing down, the host's cores run kernels/cpu/moe.h's kern_cpu_moe_ffn on a pinned copy of the
 * layer's experts inside a CUDA host function on the compute stream, and the result comes up through mapped
 * memory: the stream never waits on the engine thread. A step of at least stream_min_rows rows instead copies
 * the experts it chose into a staging area on the device (the whole layer's place, each expert at its own
 * offset, so that consecutive chosen experts are one copy) and runs them there by the grouped path: chosen
 * at init from the host's measured time for a layer of experts and the link's rate (FERRY_MOE_STREAM_ROWS=N
 * forces N, 0 never). With an expert cache (cuda_moe_cache_plan's bytes; forward_cuda_moe_cache.c) the host
 * layers' steps of up to 256 rows instead read their routing on the host and run each chosen expert from its
 * device slot, fetched into one, or on the host's cores, as runtime/expert_cache.h decides. Device memory:
 * the routers and the scratch (cuda_moe_fixed_bytes), the resident experts (cuda_moe_expert_bytes each), the
 * staging area (cuda_moe_stage_bytes, when some experts live in host memory) and the cache, carved by the
 * caller from its arena; pinned memory and host workspace are allocated here, once.
 */
#ifndef FERRY_FORWARD_CUDA_MOE_H
#define FERRY_FORWARD_CUDA_MOE_H

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#include "runtime/expert_cache.h"
#include "runtime/model.h"

struct cuda_moe;
struct kern_cuda_ctx;

/* Steps of at most this many rows run the grouped GEMV; larger ones sort rows by expert (on the host, a
 * round trip, for float experts: so never inside a captured graph: at least the engine's graph batch). */
#define CUDA_MOE_GEMV_MAX_ROWS 16
/* Steps on resident block-type experts sort their pairs on the device and run the grouped launches this many
 * rows at a time (the int8 form of x is sized for it). Measured on an H100 at Qwen3-30B-A3B's shape (Q4_K/Q6_K,
 * bench_moe), grouped launches on the tensor cores: 1.76 ms for 256 rows, where 512 rows expert by expert
 * (kern_cuda_matmul's GEMMs) took 5.66 ms. */
#define CUDA_MOE_GROUPED_MAX_ROWS 256
/* Rows the scratch holds (T k pairs of gate|up, h and gathered rows): larger steps run in chunks. */
#define CUDA_MOE_CHUNK_ROWS 1024

/* Device bytes of the routers of every layer and the scratch for T rows; 0 for a model without experts. */
size_t cuda_moe_fixed_bytes(const struct model *m, int T);
/* Device bytes of layer l's experts (gate, up, down), 0 for a dense layer. */
uint64_t cuda_moe_expert_bytes(const struct model *m, int l);
/* Device bytes of the staging area for host experts streamed to the device (the largest layer's experts);
 * 0 when streaming is off (FERRY_MOE_STREAM_ROWS=0) or the model has no experts. */
uint64_t cuda_moe_stage_bytes(const struct model *m);
/* Device bytes of the expert cache (forward_cuda_moe_cache.c) in at most `bytes` when the experts of layers
 * [0, cpu_moe) live in host memory: the same number of slots in each of those layers, as many as fit (0: not
 * one slot each, or no host layer). */
uint64_t cuda_moe_cache_plan(const struct model *m, int cpu_moe, uint64_t bytes);
/* The largest x (elements) and block-type expert matrix (elements) of the expert products at T rows, for the
 * matmul context; 0, 0 for a dense model. */
void cuda_moe_ctx_needs(const struct model *m, int T, size_t *max_x, size_t *w16_elems);
/* FERRY_ERR_UNSUPPORTED, naming the tensor, when the device cannot read an expert or router matrix. */
int cuda_moe_check_types(const struct model *m, char err[256]);

struct cuda_moe_params {
    int T;                  /* rows of a step at most */
    void *fixed;            /* cuda_moe_fixed_bytes of device memory */
    void *const *experts;   /* (n_layers) each layer's cuda_moe_expert_bytes of device memory, or NULL for a
                             * layer whose experts stay in host memory */
    void *stage;            /* cuda_moe_stage_bytes of device memory, or NULL: host experts never stream */
    int n_threads;          /* the host's threads for host experts (0: all cores) */
    double h2d_bytes_per_s; /* the link's measured rate (the streaming choice) */
    double hbm_bytes_per_s; /* the device memory's (the expert cache's cost model; 0: not counted) */
    void *cache;            /* cuda_moe_cache_plan's bytes of device memory for the expert cache, or NULL */
    uint64_t cache_bytes;
    int cpu_int8; /* host experts' arithmetic: x in int8 (1) or f32 (0), forward_cuda_params.cpu_int8 */
};

/* Uploads the routers and the resident experts (synchronously); for host experts pins a copy of them and the
 * exchange buffers, and times them to choose stream_min_rows. */
int cuda_moe_init(struct cuda_moe **out, const struct model *m, const struct cuda_moe_params *p,
                  char err[256]);
void cuda_moe_free(struct cuda_moe *mo); /* accepts NULL and a half-built one */

/* 1 when layer l's experts are on the device. */
int cuda_moe_resident(const struct cuda_moe *mo, int l);
/* Layers whose experts live in host memory. */
int cuda_moe_n_host(const struct cuda_moe *mo);
/* Steps of at least this many rows stream a host layer's chosen experts to the device (INT_MAX: never). */
int cuda_moe_stream_min_rows(const struct cuda_moe *mo);

/* y (n, dim) = layer l's experts on x (n, dim), both device memory, enqueued on cs. d_iota: (n) 0, 1, 2, ...
 * on the device. A step of more than CUDA_MOE_GEMV_MAX_ROWS rows on resident float experts, and one that
 * streams host experts, synchronise cs once. */
int cuda_moe_run(struct cuda_moe *mo, int l, float *y, const float *x, int n, struct kern_cuda_ctx *kctx,
                 const int32_t *d_iota, cudaStream_t cs);
/* The first failure of a host function since the last call (FERRY_OK if none); call once the step's work is
 * complete. */
int cuda_moe_status(struct cuda_moe *mo);
/* Host-expert layer runs since init: computed by the host, streamed to the device; and the bytes streamed. */
void cuda_moe_counts(const struct cuda_moe *mo, uint64_t *host_runs, uint64_t *stream_runs,
                     uint64_t *stream_bytes);
/* The expert cache's slots and decisions since init (all zero without a cache). */
void cuda_moe_cache_stats(const struct cuda_moe *mo, struct expert_cache_stats *st);

#endif
