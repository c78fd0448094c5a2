/* backend — a place where layers run, as a small table of calls the engine makes for each step.
 *
 * A step (runtime/engine.c): begin on every backend in use; embed on the backend of layer 0; then, layer by
 * layer in order, `layer` on the backend that the step's placement names (runtime/step_plan.h), moving the
 * residual stream x between backends with x_out/x_in when two consecutive layers run in different places;
 * last, x moves to the head's backend and `head` writes the logits (and waits for everything of the step),
 * or `head_draw` queues the draw of the next tokens, which `draw_end` waits for.
 * Every backend computes a layer from the same description (runtime/layer.h). The residual stream is x plus
 * a pending delta (layer.h); x_out folds the delta in, so what crosses is always the plain x.
 * Backends today: the CPU (runtime/forward_cpu.h: the whole model, or the host layers of a GPU engine, whose
 * attention then runs where the KV cache is, through `attend` of the KV cache's backend) and CUDA
 * (runtime/forward_cuda.h: resident and streamed layers, the KV cache, the head).
 * Calls return FERRY_OK or a negative status (kernels/core/status.h); a failed step leaves the backends ready
 * for the next one. One thread (the engine's) calls a backend at a time.
 */
#ifndef FERRY_BACKEND_H
#define FERRY_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "runtime/batch.h"
#include "runtime/expert_cache.h"

struct backend;

/* What a backend did so far (zeros where it does not apply). */
struct backend_stats {
    int n_resident, n_host;  /* device_map: resident layers, layers in pinned host memory */
    uint64_t ring_bytes;     /* and its streaming ring */
    uint64_t bytes_streamed; /* weight bytes copied host→device for layers the steps used */
    uint64_t bytes_parked;   /* and for layers parked at the ring's end (runtime/step_plan.h; not timed) */
    double copy_seconds;     /* copy-stream time for those bytes */
    double stall_seconds;    /* compute time spent waiting for copies */
    uint64_t vram_budget, vram_planned, vram_used;
    uint64_t kv_host_bytes;     /* the KV pool's extension in pinned host memory */
    uint64_t kv_ext_host_rows;  /* rows x layers whose extension positions the host's cores attended to */
    double kv_ext_host_seconds; /* wall time of that attention (the compute stream waits on all of it) */
    double h2d_bytes_per_s;     /* measured ceilings: pinned host→device, device copy (read+write) */
    double hbm_bytes_per_s;
    uint64_t layers_run;  /* layer calls made on this backend */
    double layer_seconds; /* wall time inside them (a CPU backend's share of the steps) */
    double kv_seconds;    /* the part of it spent in the KV ops (a host layer's: the device's attention) */
    struct expert_cache_stats expert_cache; /* the device expert cache of host experts (zero: none) */
};

struct backend_ops {
    const char *name;
    void (*free)(struct backend *be);
    /* Stages the step's ids, positions and tables (called on every backend in use, before anything else). */
    int (*begin)(struct backend *be, const struct step *st);
    /* x (n_tokens, dim) = the embeddings of the batch's tokens; no delta pending. */
    int (*embed)(struct backend *be, const struct step *st);
    /* x = layer l (x): the program of runtime/layer.h with this backend's kernels. */
    int (*layer)(struct backend *be, int l, const struct step *st);
    /* The rows that want logits: final norm, output head, into logits (n_out, n_vocab) f32 in batch order.
     * Returns once the whole step is complete on this backend. */
    int (*head)(struct backend *be, const struct step *st, float *logits);
    /* As head, but each output row's next token is drawn on this backend from st->draw and the logits stay
     * here; returns with the step on its way (st->draw read), and draw_end completes it. NULL on a backend
     * that cannot (the engine then refuses the draw before the step). */
    int (*head_draw)(struct backend *be, const struct step *st);
    /* After a head_draw that succeeded: waits for the whole step on this backend and writes st->drawn. */
    int (*draw_end)(struct backend *be, const struct step *st);
    /* The most rows, bias entries and history entries one head_draw takes (0: no head_draw). */
    void (*draw_caps)(const struct backend *be, int *rows, int *bias, int *hist);
    /* The host buffer holding x (max_tokens, dim) f32 when x lives in host memory, else NULL. */
    float *(*x_host)(struct backend *be);
    /* Folds the pending delta into x and makes x (n, dim) available in host memory at `x` (complete on
     * return); a host backend whose x_host is `x` only folds. */
    int (*x_out)(struct backend *be, float *x, int n);
    /* x (n, dim) = the host rows at `x` (another backend's x_host), no delta pending. */
    int (*x_in)(struct backend *be, const float *x, int n);
    /* The KV part of layer l for rows computed elsewhere: qkv (n, (n_heads + 2 n_kv_heads) head_dim) f32 in
     * host memory (each row: queries, keys, values; biases added) → rope, store K/V, attention → att (n,
     * n_heads head_dim) f32 in host memory, complete on return. FERRY_ERR_INVALID on a backend without a KV
     * cache of its own. */
    int (*attend)(struct backend *be, int l, const struct step *st, const float *qkv, float *att);
    void (*stats)(const struct backend *be, struct backend_stats *st);
};

/* Every backend's state starts with this. */
struct backend {
    const struct backend_ops *ops;
};

#endif
