/* forward_cuda — the CUDA backend (runtime/backend.h): Llama layers on one device, resident or streamed from
 * pinned host memory according to a device_map (device_map.h), plus the KV cache and the output head.
 *
 * All device memory is one cudaMalloc sized by the plan and carved with a cursor (KV pool in f16,
 * activations, attention workspace, output head, resident layers, the ring); cuBLAS's handle and its
 * workspace are the only other device allocations (counted in the plan's fixed bytes). Nothing is allocated
 * per step. Host layers: one packed block per layer (runtime/layer.h) in pinned, cacheable host memory (pages
 * spread over the NUMA nodes when there are several). On each step a host layer is either streamed (its
 * pieces, the matrix groups, copied one after another into the ring buffer; runtime/ring.h; its norms and
 * biases stay on the device) or computed by the host's cores from the same block (runtime/forward_cpu.h,
 * which sends its q|k|v here through `attend`: the KV cache of every layer lives on the device). A copy is
 * queued as soon as the bytes it overwrites are released, so the link works while the CPU computes and the
 * next step's first copies overlap this step's last layers; each product waits only for its own piece. Small
 * host→device transfers in the middle of a step (x after host layers, a host layer's q|k|v) are read by
 * kernels straight from mapped pinned memory rather than copied, so they never queue behind a layer copy on
 * the copy engine. When the budget is short, the KV pool's extension lives in pinned host memory: the decode
 * tokens' attention over its positions runs on the host's cores (a CUDA host function per layer) and merges
 * with the device's over the rest by log-sum-exp (FERRY_KV_EXT_ATTN=device: the device reads them over the
 * link instead). Sliding-window layers may keep a second, smaller pool holding only each
 * sequence's window (forward_cuda_params.kv_swa), read through its own block table. An LRU layer cache and
 * zero-copy weights were measured against the ring and lost or tied (runtime/NOTES.md, run 3). Weights in
 * F16/BF16/F32/Q8_0 are used as stored; other types are converted to F16 at load. Recurrent (gated DeltaNet)
 * layers' matrices are part of the layer blocks; each slot's state and their small tensors are on the device
 * (runtime/forward_cuda_deltanet.h; forward_cuda_state_get/put move a slot's state to and from the host for
 * the prompt cache's checkpoints) for the resident ones and, in host memory, either for all of them (they
 * stream on every step: stream-only, params.recurrent_stream) or for none (the host's cores compute them on
 * every step, CPU-only, from their blocks with their state in the host's seq_state: device_map.h); the
 * choice is fixed for the backend's life. Without CUDA the same header is served by forward_cuda_none.c (no
 * device).
 */
#ifndef FERRY_FORWARD_CUDA_H
#define FERRY_FORWARD_CUDA_H

#include <stddef.h>
#include <stdint.h>

#include "runtime/backend.h"
#include "runtime/device_map.h"
#include "runtime/kv_cache.h"
#include "runtime/layer.h"
#include "runtime/model.h"

struct forward_cuda_params {
    int max_tokens;       /* rows of one step */
    int64_t gpu_memory;   /* budget in bytes; 0: free VRAM minus reserve_vram */
    int64_t reserve_vram; /* bytes left free when gpu_memory is 0 */
    int gpu_layers;       /* -1: as many as fit */
    int ring_layers;      /* the ring in the largest streamed layers; 0: the planner's choice */
    int no_ring;        /* host layers are never streamed (--placement cpu): no ring, more layers resident */
    int fewer_resident; /* resident layers fewer than fit, for a deeper ring (device_map.h) */
    /* Tests: one character per layer, 'g' resident, anything else in host memory; NULL: the planner's. */
    const char *force_where;
    /* KV pool: kv_auto 0 keeps the pool the caller sized; 1 lets the planner size it to the budget (see
     * device_map.h), between kv_tokens_min and kv_tokens_max positions, and forward_cuda_init re-sizes the
     * caller's kv_cache tables to match. */
    int kv_auto;
    int64_t kv_tokens_max, kv_tokens_floor, kv_tokens_min;
    int kv_q8; /* the KV pool in Q8_0 blocks (kernels/cuda/attention.h; head_dim a multiple of 64), no
                  extension */
    /* The sliding-window layers' own pool (runtime/engine.h engine_params.swa_full): the engine's tables of
     * kv's shape, whose slots hold only their windows' blocks (kv_cache_drop), KV_NO_HOST; the device keeps
     * its planes (kv_cache_swa_layers of them, in the pool's element type and row, no extension) beside the
     * main pool, whose planes are then the other layers'. NULL: every layer's K/V is in the main pool. */
    struct kv_cache *kv_swa;
    /* Expert models: the experts of the first cpu_moe layers stay in host memory and the host's cores
     * compute them (runtime/forward_cuda_moe.h); -1: the fewest that let the plan fit the budget. */
    int cpu_moe;
    /* Expert models with host experts: device bytes of the expert cache (runtime/expert_cache.h), taken from
     * the budget before the experts of more layers are made resident; -1: what the budget leaves after the
     * resident layers and the KV pool, when the planner chose the host layers (cpu_moe -1); 0: none. */
    int64_t expert_cache;
    /* The arithmetic of the host's products for host experts: 1 x in int8 (kern_cpu_matmul.h
     * KERN_CPU_ACT_INT8, llama.cpp's), 0 x in f32 (the engine's --cpu-arith). */
    int cpu_int8;
    /* Recurrent layers in host memory: 0 computed by the host's cores on every step, their state in host
     * memory (runtime/seq_state.h, the host backend's), taking no device bytes; 1 streamed on every step,
     * their state on the device (counted in the plan). */
    int recurrent_stream;
};

/* Number of CUDA devices (0 in a build without CUDA, or without a driver). */
int forward_cuda_devices(void);
/* What this machine's GPU cannot run of a model of hp although the backend has kernels for its layer kinds (a
 * phrase for messages: attention heads wider than its shared memory allows, linear-attention shapes past the
 * DeltaNet kernels' limits), or NULL; NULL without a GPU. */
const char *forward_cuda_device_lacks(const struct llm_hparams *hp);

int forward_cuda_init(struct backend **out, const struct model *m, struct kv_cache *kv,
                      const struct forward_cuda_params *p, char err[256]);
const struct device_map *forward_cuda_map(const struct backend *be);
/* Bytes of layer l's packed block (what a stream copies). */
uint64_t forward_cuda_layer_bytes(const struct backend *be, int l);
/* The bytes of layer l's pieces in the order a streamed layer copies them (LAYER_N_MATS of them). */
void forward_cuda_layer_pieces(const struct backend *be, int l, uint64_t out[LAYER_N_MATS]);

/* Layer l's weights as the host's cores read them: its pinned block when l lives in host memory and the
 * block holds every matrix in its stored type; the model's own tensors when the block holds converted ones
 * (the host reads stored types natively); a recurrent layer's mixer with its matrices in the block and its
 * small tensors the model's. Returns 1 for a host layer, 0 for a resident one (w untouched). */
int forward_cuda_host_weights(const struct backend *be, int l, struct layer_weights *w);
/* Pinned, device-mapped host memory for the buffers another backend exchanges with this one
 * (forward_cpu_params.host_alloc); ctx is the backend. */
void *forward_cuda_host_alloc(void *ctx, size_t bytes);
void forward_cuda_host_free(void *ctx, void *p);

/* Cost-model probes for the step planner (runtime/step_plan.h), run once at start-up. */
/* Seconds of the exchange around a host layer: x out (device→host, then a wait), q|k|v in and attention out
 * (attend on an empty sequence: nothing is stored), x in. */
int forward_cuda_time_exchange(struct backend *be, int n_tokens, double *seconds);
/* The device's time for resident layer l at n tokens, everything but its K/V rows (which it skips): the
 * median of 8 runs, in *seconds. FERRY_ERR_INVALID when l is not resident. */
int forward_cuda_time_layer(struct backend *be, int l, int n_tokens, double *seconds);
/* Starts copying host layers into the slots on the copy stream, back to back, for about `seconds` (nothing
 * when no layer streams); forward_cuda_link_load_end waits for them and gives the rate they ran at
 * (bytes/s, 0 when none ran). Between the two, the host can measure itself under the link's load. */
int forward_cuda_link_load_begin(struct backend *be, double seconds);
double forward_cuda_link_load_end(struct backend *be);

/* The device_map this backend would have planned with no_ring and fewer_resident set as given, from the same
 * budget, sizes and KV bounds (the engine compares its alternatives before it settles). */
int forward_cuda_map_variant(const struct backend *be, int no_ring, int fewer_resident,
                             struct device_map *out, char err[256]);

/* The device_map forward_cuda_init would choose for budget p->gpu_memory, computed without a device, with the
 * given ceilings (bytes/s) for the prediction. For `ferry inspect`. FERRY_ERR_UNSUPPORTED without CUDA. */
int forward_cuda_plan_offline(const struct model *m, const struct kv_cache *kv,
                              const struct forward_cuda_params *p, double h2d, double hbm,
                              struct device_map *out, char err[256]);

/* The planner's input forward_cuda_plan_offline plans p with (budget p->gpu_memory; rates h2d and hbm), for
 * planning the model's layers elsewhere (runtime/device_split_model.h): layer_sizes (n_layers, the caller's)
 * receive the layers' blocks and out->layer_sizes points to them; for an expert model expert_bytes (n_layers,
 * the caller's) receive each layer's experts' device bytes and *stage_bytes the staging area host experts
 * stream through, which the backend adds as it chooses which layers' experts stay in host memory (with their
 * page tables at out->host_map_div). FERRY_ERR_UNSUPPORTED for recurrent layers or p->force_where (their
 * masks are the backend's own), no budget, or a build without CUDA. */
int forward_cuda_plan_input(const struct model *m, const struct kv_cache *kv,
                            const struct forward_cuda_params *p, double h2d, double hbm,
                            uint64_t *layer_sizes, uint64_t *expert_bytes, uint64_t *stage_bytes,
                            struct device_map_input *out, char err[256]);

/* Slot seq's recurrent state on the device (the convolution and rule state of the recurrent layers whose
 * state is here, each at its place in runtime/seq_state.h's slot block: n_layers * (conv_floats + rec_floats)
 * floats; the places of the host's CPU-only layers are left as they are) copied to the host or from it, after
 * the work queued so far and before returning (the engine checkpoints a slot with get and resumes one with
 * put). FERRY_OK and nothing copied for a model without recurrent layers;
 * FERRY_ERR_INVALID for a seq outside the slots. */
int forward_cuda_state_get(struct backend *be, int seq, float *host);
int forward_cuda_state_put(struct backend *be, int seq, const float *host);

/* Measured rates: pinned host→device and device→device bandwidth, bytes/s (0 on failure or without CUDA). */
void forward_cuda_measure_bandwidth(double *h2d, double *d2d);

#endif
