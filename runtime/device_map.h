/* device_map — where each transformer layer's weights live during a forward pass on the GPU, and why.
 *
 * A layer is resident (PLACEMENT_GPU) or lives in pinned host memory (PLACEMENT_STREAM in `where`). A host
 * layer is, on each step, either streamed (copied into one of a ring of n_slots device slots just before
 * use: PLACEMENT_STREAM) or computed by the host's cores in place (PLACEMENT_CPU); that choice is the step
 * plan's (runtime/step_plan.h), per step size. The output head is always resident; the token embedding is
 * gathered on the host (only the rows a batch needs cross the link).
 * The planner is pure arithmetic over byte counts (no device needed: `ferry inspect` runs it anywhere):
 *   budget = fixed (activations, workspaces) + head + resident layers and their KV + slot ring (if any streams).
 * Layers may differ in size (Q4_K_M stores some in Q6_K): a resident layer takes its own bytes, a slot the
 * largest streamed layer's. Streamed layers are spread evenly between resident ones so every copy hides
 * behind resident compute.
 * KV: each layer's K and V live where its weights do. A resident layer's are in device memory; a host
 * layer's are in pinned, mapped host memory, which the device's attention reads and writes over the link
 * (the bytes are small beside the layer's weights at the contexts serving meets, and the device memory they
 * would take holds resident layers instead). So the device part of the pool costs kv_layer_bytes per position
 * per resident layer, and a plan where every layer streams keeps no KV on the device at all.
 * The pool's positions (shared by all layers): all of kv_tokens_max when every layer fits beside it; otherwise
 * the pool keeps kv_tokens_floor positions (concurrent sequences are what turn a streamed layer's bytes into
 * many tokens), the layers take the rest, and the pool then grows into what they leave, up to kv_tokens_max.
 * It never goes below kv_tokens_min (one full-length sequence). A fixed pool passes max = floor = min.
 */
#ifndef FERRY_DEVICE_MAP_H
#define FERRY_DEVICE_MAP_H

#include <stddef.h>
#include <stdint.h>

enum placement { PLACEMENT_GPU = 0, PLACEMENT_STREAM = 1, PLACEMENT_CPU = 2 };

struct device_map_input {
    int n_layers;
    uint64_t layer_bytes;        /* device bytes of the largest layer's weights */
    const uint64_t *layer_sizes; /* (n_layers) each layer's bytes, or NULL: all are layer_bytes */
    uint64_t head_bytes;         /* output head + final norm */
    uint64_t fixed_bytes;        /* activations + workspaces */
    /* The KV pool (positions of all sequences together); none when kv_layer_bytes is 0. */
    uint64_t kv_layer_bytes; /* bytes of one position's K and V in one layer */
    int64_t kv_tokens_max;   /* at most this many (--parallel x --ctx-size) */
    int64_t kv_tokens_floor; /* kept before layers are made resident, when not everything fits */
    int64_t kv_tokens_min;   /* never fewer (one full-length sequence) */
    int kv_block;            /* positions per KV block: the pool is a whole number of blocks */
    uint64_t budget;         /* device bytes the plan may use */
    int gpu_layers;          /* -1: as many as fit; else exactly this many resident */
    int n_slots;             /* ring size when some layers stream; 0: the planner's choice (2) */
    int no_ring;             /* host layers are never streamed (--placement cpu): no slots */
    const uint8_t
        *resident_mask;     /* (n_layers) tests: 1 = resident, exactly these; NULL: the planner's spread */
    double h2d_bytes_per_s; /* measured pinned host→device rate (for the prediction) */
    double hbm_bytes_per_s; /* measured device memory rate (for the prediction) */
};

struct device_map {
    int n_layers;
    enum placement *where; /* (n_layers) */
    int n_resident;
    int n_streamed;          /* layers in host memory (streamed or computed on the host, step by step) */
    int n_slots;             /* 0 when nothing streams */
    uint64_t layer_bytes;    /* slot size: the largest streamed layer (the largest layer when none streams) */
    int64_t kv_tokens;       /* the KV pool's positions (0 without a pool) */
    uint64_t kv_bytes;       /* its device bytes: the resident layers' K and V */
    uint64_t kv_host_bytes;  /* its host bytes: the host layers' K and V (pinned, mapped) */
    uint64_t bytes_total;    /* fixed + head + resident layers and their KV + slots: what the plan allocates */
    uint64_t bytes_minimum;  /* the smallest budget any plan for this model can work with */
    double predicted_step_s; /* batch-1 decode step when every host layer streams: max(streamed bytes / h2d,
                              * all weight bytes / hbm) (the step plan refines it) */
};

/* Fills out (free with device_map_free). FERRY_ERR_DEVICE_MEM with a message naming the minimum budget when
 * the budget is too small; FERRY_ERR_INVALID for gpu_layers outside [-1, n_layers]. */
int device_map_plan(const struct device_map_input *in, struct device_map *out, char err[256]);
void device_map_free(struct device_map *m);

/* One line per run of equal placements plus a summary; returns the length written (snprintf semantics). */
int device_map_format(const struct device_map *m, char *buf, size_t cap);

#endif
