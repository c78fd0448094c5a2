/* forward_cpu — the CPU backend (runtime/backend.h): Llama layers computed by the host's cores.
 *
 * Two uses. The CPU engine: every layer, the head and the KV cache (f32, host) are here. A GPU engine's host
 * layers: the layers a step plan puts on the CPU are computed here from the same pinned blocks the stream
 * copies (params.weights), while the KV cache stays on the device: the ops that touch it (rope, K/V store,
 * attention) run on the KV cache's backend through its `attend`, and x, q|k|v and the attention output cross
 * in host buffers the caller allocates (pinned and mapped, params.host_alloc).
 * A GPU engine's recurrent host layers (CPU-only, runtime/device_map.h) are computed here too: their mixer's
 * matrices come in the packed blocks (params.weights' dn views), and each slot's state lives in params.state,
 * the engine's own seq_state (runtime/seq_state.h says how the device's layers share its slot blocks).
 * Scratch activations are sized once for max_tokens rows; nothing is allocated per step. The KV rows of the
 * batch must already be reserved in the cache (engine.c does it). Results depend on the data and m only,
 * never on the thread count or the placement of the threads (kernels/cpu/matmul.h).
 */
#ifndef FERRY_FORWARD_CPU_H
#define FERRY_FORWARD_CPU_H

#include <stddef.h>

#include "runtime/backend.h"
#include "runtime/kv_cache.h"
#include "runtime/layer.h"
#include "runtime/model.h"

struct seq_state;

struct forward_cpu_params {
    int max_tokens;  /* rows of one step */
    int n_threads;   /* 0 = the cores this process may use */
    int pin_threads; /* pin the workers, one per core (kernels/cpu/threadpool.h) */
    /* (n_layers) where each layer's weights are read, copied at init; NULL: the model's tensors. An entry
     * with no parts (n_parts 0) is a layer this backend never computes. */
    const struct layer_weights *weights;
    struct kv_cache *kv; /* the KV cache with host data (f32), or NULL when kv_owner holds it */
    /* The sliding-window layers' own pool (kv_cache_layer_index's split), or NULL: they are in kv. */
    struct kv_cache *kv_swa;
    struct backend *kv_owner; /* runs the KV ops of this backend's layers (its `attend`), or NULL */
    /* Activation buffers; NULL: aligned host memory. */
    void *(*host_alloc)(void *ctx, size_t bytes);
    void (*host_free)(void *ctx, void *p);
    void *alloc_ctx;
    /* The products' arithmetic (kernels/cpu/matmul.h), set on the calling thread whenever this backend
     * computes: an enum kern_cpu_act and an enum kern_cpu_plain; -1 leaves the thread's as they are. */
    int act, plain;
    /* Batch invariance of the products (kern_cpu_matmul_set_invariant), set as act is: a row's results do not
     * depend on the rows beside it in its step, at a cost in prefill (--deterministic). */
    int invariant;
    /* Each slot's state in the recurrent layers (runtime/seq_state.h); required by a model that has them,
     * whether or not this backend computes any of them (the CPU engine all; a GPU engine's host backend its
     * CPU-only ones: their state lives here, the device's layers' places are never touched). */
    struct seq_state *state;
};

struct forward_cpu_params forward_cpu_default_params(void);

int forward_cpu_init(struct backend **out, const struct model *m, const struct forward_cpu_params *p);
int forward_cpu_threads(const struct backend *be);

/* Seconds one call of layers[0] takes at m tokens (everything but the KV ops, on random activations): one
 * untimed call on layers[0], then `reps` timed calls, the i-th (from 0) on layers[i % n] and scaled to
 * layers[0]'s weight bytes; their median. For the step planner's cost model: over several host layers the
 * weights come from memory as in a real step, where one layer timed again and again would sit in a large L3
 * (300 MiB on the H200 machine's host). */
int forward_cpu_time_layers(struct backend *be, const int *layers, int n, int m, int reps, double *seconds);

#endif
