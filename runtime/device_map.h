/* device_map — where each transformer layer's weights live during a forward pass on the GPU, and why.
 *
 * A layer is resident (PLACEMENT_GPU) or lives in pinned host memory (PLACEMENT_STREAM in `where`). A host
 * layer is, on each step, either streamed (its pieces, the matrix groups, copied one after another into a
 * ring buffer on the device just before use: PLACEMENT_STREAM; runtime/ring.h) or computed by the host's
 * cores in place (PLACEMENT_CPU); that choice is the step plan's (runtime/step_plan.h), per step size. The
 * output head is always resident; the token embedding is gathered on the host (only the rows a batch needs
 * cross the link). The planner is pure arithmetic over byte counts (no device needed: `ferry inspect` runs it
 * anywhere): budget = fixed (activations, workspaces) + KV pool + head + resident layers + ring (if any
 * streams) + the page tables that map the host layers and the KV extension into the device (host_map_div).
 * Layers may differ in size (Q4_K_M stores some in Q6_K): a resident layer takes its own bytes. The ring
 * holds at least two of the largest pieces (the link copies one while the device computes with the other):
 * layers are made resident beside that, the ring then grows into what they leave up to two of the largest
 * streamed layers (the lookahead that lets the link work ahead while the host's cores compute layers), and
 * the pool takes the rest. A resident layer saves its whole copy (or host computation) on every step, where
 * depth past two pieces only lets copies start earlier, so layers come first. Streamed layers are spread
 * evenly between resident ones so every copy hides behind resident compute. KV pool: fixed by the caller, or
 * sized here (kv_token_bytes > 0): all of kv_tokens_max when every layer fits beside it; otherwise the pool
 * keeps kv_tokens_floor positions (concurrent sequences are what turn a streamed layer's bytes into many
 * tokens) and the layers take the rest, then the pool takes what the layers leave, up to kv_tokens_max. It
 * never goes below kv_tokens_min (one full-length sequence), except where the host's cores attend to an
 * extension that can hold the rest of it: there the device keeps KV_DEVICE_POSITIONS (or one sequence, if
 * shorter) before layers are made resident, and a longer sequence's later positions live in the extension
 * (kv_seq_split); a budget that cannot hold even that beside the smallest streaming plan keeps what fits.
 * Otherwise a budget too small for one sequence is refused, naming the minimum. Extension: when some layers
 * stream and the pool falls short of kv_tokens_max, the missing positions (up to kv_ext_max) become an
 * extension of the pool in pinned host memory (kv_cache.h: its blocks are handed out last). Those sequences
 * then run at once instead of queueing. When the host's cores attend to the extension's positions
 * (kv_ext_host; runtime/forward_cuda.c), a position there costs the step little beside the streamed weights,
 * so the pool keeps only kv_tokens_min (at most KV_DEVICE_POSITIONS) before layers are made resident (more
 * resident layers, shorter steps, the extension holding the rest), unless that would make every layer
 * resident (then the plan is the one above: a pool that small would queue sequences). When the device reads
 * them over the link instead, each position costs link time (runtime/NOTES.md, 2026-12-01f). Not when every
 * layer is resident: there a step is so short that the extension would cost more than the queue.
 * Sliding-window layers may keep a pool of their own holding only each sequence's window (runtime/engine.h
 * engine_params.swa_full): its size is fixed by the sequences and the window, not by the context, so it is
 * counted beside the fixed bytes (kv_swa_bytes) and kv_token_bytes covers only the other layers' planes; the
 * bytes the windows save go to more positions of the main pool or more resident layers.
 * Stream-only layers (stream_only: those the host's cores cannot compute, as a recurrent layer whose state
 * lives on the device) are placed like any other; in host memory they always stream (the step plan never
 * gives them to the CPU), so a map without a ring (no_ring) may not leave one there. CPU-only layers
 * (cpu_only: a recurrent layer whose state lives in host memory) are the opposite: in host memory they are
 * computed by the host's cores on every step and never stream, so they size no ring (a map whose host layers
 * are all CPU-only has none). A layer's device state (state_bytes: a recurrent layer's per-slot state on the
 * device) is counted with it when it is resident or streams, and not at all for a CPU-only host layer, whose
 * state is in host memory. Which recurrent layers are which is fixed for the life of a map: their state lives
 * on one side.
 * The minimum (bytes_minimum) is that of the smallest plan the request allows (every layer streamed through
 * the smallest ring, or exactly gpu_layers or the mask resident): a budget of that many bytes gets a plan,
 * and a refusal names it rounded up (device_map_too_small).
 */
#ifndef FERRY_DEVICE_MAP_H
#define FERRY_DEVICE_MAP_H

#include <stddef.h>
#include <stdint.h>

/* PLACEMENT_PARK (a step plan's, never the map's): a host layer kept in the end of the ring that steps of its
 * plan leave unused, copied there once and reused while such steps follow each other (runtime/step_plan.h).
 */
/* Device positions kept before layers are made resident when the host's cores attend to the extension: a
 * position there is read by the host only while a sequence is that long, where a resident layer saves its
 * bytes on every step; prompts' chunks attend to the device's positions at its speed (the extension's over
 * the link), so the first 1024 positions of a sequence (two chunks of 512) stay there. */
#define KV_DEVICE_POSITIONS 1024

enum placement { PLACEMENT_GPU = 0, PLACEMENT_STREAM = 1, PLACEMENT_CPU = 2, PLACEMENT_PARK = 3 };

struct device_map_input {
    int n_layers;
    uint64_t layer_bytes;        /* device bytes of the largest layer's weights */
    const uint64_t *layer_sizes; /* (n_layers) each layer's bytes, or NULL: all are layer_bytes */
    uint64_t head_bytes;         /* output head + final norm */
    uint64_t fixed_bytes;        /* activations + workspaces, and the KV pool when kv_token_bytes is 0 */
    uint64_t kv_swa_bytes; /* the sliding-window layers' own pool (0: none), placed before anything else */
    int64_t kv_swa_tokens; /* its positions over all sequences (reported only) */
    /* KV pool sized by the planner when kv_token_bytes > 0 (positions of all sequences together). */
    uint64_t kv_token_bytes; /* device bytes of one position's K and V over all layers */
    int64_t kv_tokens_max;   /* at most this many (--parallel x --ctx-size) */
    int64_t kv_tokens_floor; /* kept before layers are made resident, when not everything fits */
    int64_t kv_tokens_min;   /* never fewer (one full-length sequence) */
    int kv_block;            /* positions per KV block: the pool is a whole number of blocks */
    int64_t kv_ext_max;      /* positions the extension in host memory may hold (0: no extension) */
    int kv_ext_host;         /* the host's cores attend to the extension's positions (cheap): the pool's
                              * floor drops to kv_tokens_min when that leaves a layer streaming */
    uint64_t budget;         /* device bytes the plan may use */
    int gpu_layers;          /* -1: as many as fit; else exactly this many resident */
    uint64_t piece_bytes;    /* the largest piece (matrix group) of any layer */
    int ring_layers;         /* ring of this many of the largest streamed layers; 0: the planner's choice */
    int no_ring;             /* host layers are never streamed (--placement cpu): no ring */
    int fewer_resident;      /* this many layers fewer resident than fit beside the smallest ring: the ring
                              * grows into their bytes (the engine compares such maps) */
    const uint8_t
        *resident_mask; /* (n_layers) tests: 1 = resident, exactly these; NULL: the planner's spread */
    const uint8_t *stream_only; /* (n_layers) 1: the host's cores cannot compute it (see above); NULL: none */
    const uint8_t *cpu_only; /* (n_layers) 1: in host memory only the host's cores compute it; NULL: none */
    /* (n_layers) device bytes of the layer's state when the device computes it (resident or streamed; a
     * recurrent layer's slots), none for a CPU-only host layer; NULL: no layer has any (counted in fixed). */
    const uint64_t *state_bytes;
    double h2d_bytes_per_s; /* measured pinned host→device rate (for the prediction) */
    double hbm_bytes_per_s; /* measured device memory rate (for the prediction) */
    /* A byte of pinned host memory costs the device 1/host_map_div of a byte (rounded up per layer): the
     * page tables through which the device addresses it (CUDA maps every pinned byte into the device's
     * address space, 8 bytes of entry per 4 KiB page: 512). Counted for the host layers and the KV pool's
     * extension, so that what the device loses to them stays inside the budget. 0: not counted. */
    uint32_t host_map_div;
};

struct device_map {
    int n_layers;
    enum placement *where; /* (n_layers) */
    int n_resident;
    int n_streamed;        /* layers in host memory (streamed or computed on the host, step by step) */
    uint64_t ring_bytes;   /* the streaming ring; 0 when nothing streams */
    uint64_t piece_bytes;  /* the largest piece it carries */
    int64_t kv_tokens;     /* the KV pool's positions when the planner sized it, else 0 */
    uint64_t kv_bytes;     /* its device bytes (0 when fixed by the caller) */
    int64_t kv_ext_tokens; /* positions of its extension in host memory (0: none) */
    uint64_t kv_ext_bytes; /* the extension's bytes */
    uint64_t kv_swa_bytes; /* the sliding-window layers' own pool (the input's; part of bytes_total) */
    int64_t kv_swa_tokens; /* its positions */
    int kv_ext_host;       /* the host's cores attend to its positions (the input's kv_ext_host) */
    int kv_seq_split;      /* kv_tokens is less than one full-length sequence: the extension holds the rest */
    uint64_t bytes_total;  /* fixed, window pool, head, KV pool, resident, ring, expert cache, host map: what
                              the plan allocates or costs the device */
    uint64_t host_map_bytes; /* of bytes_total: the page tables of the host layers and the extension
                              * (device_map_input.host_map_div), which the backend does not allocate */
    uint64_t bytes_minimum;  /* the smallest budget any plan for this model can work with */
    /* Expert models (set by the backend's planner, runtime/forward_cuda.c): the experts of layers [0,
     * cpu_moe) stay in host memory, computed by the host's cores; the others' are resident with their layers.
     */
    int moe_layers, cpu_moe;
    uint64_t expert_cache_bytes; /* of bytes_total: the device expert cache of the host layers' experts */
    double predicted_step_s; /* batch-1 decode step when every host layer streams: max(streamed bytes / h2d,
                              * all weight bytes / hbm) (the step plan refines it) */
    uint8_t *stream_only;    /* (n_layers) the input's, or NULL when it gave none */
    int n_stream_only;       /* of them, layers in host memory */
    uint8_t *cpu_only;       /* (n_layers) the input's, or NULL when it gave none */
    int n_cpu_only;          /* of them, layers in host memory (computed by the host's cores every step) */
    uint64_t state_bytes;    /* of bytes_total: the layers' state on the device (input state_bytes) */
};

/* Fills out (free with device_map_free). FERRY_ERR_DEVICE_MEM with a message naming the minimum budget when
 * the budget is too small (out->bytes_minimum holds it then too); FERRY_ERR_INVALID for gpu_layers outside
 * [-1, n_layers] or a layer both stream-only and CPU-only; FERRY_ERR_UNSUPPORTED when no_ring would leave a
 * stream-only layer in host memory. */
int device_map_plan(const struct device_map_input *in, struct device_map *out, char err[256]);
/* "GPU budget B is too small: the minimum is M (detail)" into err, B rounded down and M up (GiB with two
 * decimals from 1 GiB, else MiB with one), so that a budget of the printed minimum fits and, the minimum
 * being larger, the two never print alike. Returns FERRY_ERR_DEVICE_MEM. */
int device_map_too_small(char err[256], uint64_t budget, uint64_t minimum, const char *detail);
void device_map_free(struct device_map *m);

/* One line per run of equal placements plus a summary; returns the length written (snprintf semantics). */
int device_map_format(const struct device_map *m, char *buf, size_t cap);

#endif
