/* step_plan — for each step size, where every layer runs: resident on the GPU, streamed to it, or computed by
 * the host's cores in pinned host memory.
 *
 * The device_map fixes which layers are resident and which live in host memory. Which host layers the CPU
 * takes depends on the step's token count, so the planner decides it per bucket of step sizes (1, 2, 4, ...
 * max_tokens; a step of n tokens uses the first bucket >= n): it tries c = 0..h of the h host layers on the
 * CPU, spread evenly among them, simulates the step in steady state (a FIFO copy stream feeding the ring
 * buffer with each streamed layer's pieces, laid as runtime/ring.c lays them, each copy waiting for the uses
 * of the copies whose bytes it overwrites; the layers in order on the GPU or the CPU; the exchanges around
 * each host layer) and keeps the fastest (AUTO: only when it beats streaming everything by `margin`).
 * STREAM and CPU force c = 0 and c = h. A step may stream through less of the ring, down to two of the
 * largest pieces (the device computes faster than the link brings them): host layers are parked in the rest
 * (PLACEMENT_PARK), copied once and reused while steps of the same plan follow each other, as long prompts'
 * chunks, back-to-back prompts and runs of decode steps do (the prediction assumes they do). For each c the
 * planner parks as many of the streamed layers (of those that fit) as make the simulated step fastest: with
 * no CPU layer a prompt gains a layer's copy; beside CPU layers the ring's depth usually matters more (the
 * link can fill only what is free while the CPU computes), and the simulation then parks none. Host layers
 * the host's cores cannot compute (stream_only: a recurrent layer, whose state lives on the device) stream in
 * every mode, CPU included; only the others count among the h. The costs come from start-up measurements
 * (step_cost). Pure arithmetic: no device, tested in CI. Usage: step_plan_make →
 * step_plan_where(n) per step → step_plan_free.
 */
#ifndef FERRY_STEP_PLAN_H
#define FERRY_STEP_PLAN_H

#include <stddef.h>
#include <stdint.h>

#include "runtime/device_map.h"

enum step_mode { STEP_MODE_AUTO = 0, STEP_MODE_STREAM = 1, STEP_MODE_CPU = 2 };

#define STEP_PLAN_MAX_BUCKETS 18 /* 1 .. 131072 tokens */
#define STEP_COST_MAX_M       12

/* Rates and times the simulation uses (measured at start-up; runtime/engine.c). */
struct step_cost {
    double h2d;         /* link, bytes/s, the host's cores idle */
    double h2d_loaded;  /* link while the host's cores compute layers (0: h2d) */
    double hbm;         /* device memory, bytes/s */
    double gpu_flops;   /* device matrix products at large m, FLOP/s */
    double gpu_layer_s; /* per device layer: launches and the small ops */
    double step_s;      /* per step: inputs, embedding, head launches, the final wait */
    /* The host's time for one reference layer (everything but the KV ops) at cpu_m[i] tokens, increasing m.
     */
    int n_cpu;
    int cpu_m[STEP_COST_MAX_M];
    double cpu_s[STEP_COST_MAX_M];
    uint64_t cpu_ref_bytes; /* that layer's bytes */
    /* The exchanges around host layers: a wait for the device (sync_s) per host layer (its attention) and per
     * run of consecutive host layers (x coming down), plus bytes per token at h2d. */
    double sync_s;
    double layer_bytes_per_token; /* q|k|v up, attention output down */
    double run_bytes_per_token;   /* x down, x up */
};

struct step_plan_input {
    int n_layers;
    const enum placement *where; /* (n_layers) the device_map's: PLACEMENT_GPU or PLACEMENT_STREAM (host) */
    const uint8_t *stream_only;  /* (n_layers) the device_map's: 1 = never on the CPU; NULL: none */
    const uint64_t
        *layer_bytes; /* (n_layers) bytes of each layer's block (what a copy moves, the host reads) */
    const uint64_t *layer_params; /* (n_layers) multiply-adds per token */
    uint64_t head_bytes;
    uint64_t ring_bytes;         /* the ring's bytes; 0: host layers cannot stream */
    const uint64_t *piece_bytes; /* (n_layers, n_pieces) each layer's pieces in use order; NULL: one piece,
                                  * the whole layer */
    int n_pieces;
    int no_park;    /* never park host layers (comparisons) */
    int max_tokens; /* the largest step */
    enum step_mode mode;
    double
        margin; /* AUTO: host layers go to the CPU only when that beats streaming them all by this fraction */
    /* Tests: the plan itself, one character per layer ('g' resident, 's' streamed, 'c' on the CPU), one
     * string per bucket separated by '/', the last one repeated for the larger buckets; NULL: planned. */
    const char *force; /* ('p': parked at the ring's end) */
    struct step_cost cost;
};

struct step_plan {
    int n_layers, n_buckets;
    int tokens[STEP_PLAN_MAX_BUCKETS];         /* the largest step of each bucket: 1, 2, 4, ..., max_tokens */
    enum placement *where;                     /* (n_buckets, n_layers) */
    int n_cpu[STEP_PLAN_MAX_BUCKETS];          /* host layers on the CPU */
    int n_stream[STEP_PLAN_MAX_BUCKETS];       /* host layers streamed (parked ones included) */
    int n_park[STEP_PLAN_MAX_BUCKETS];         /* of them, parked in the ring's end */
    double predicted_s[STEP_PLAN_MAX_BUCKETS]; /* steady-state step time at tokens[b] (0: not predicted) */
    double stream_s[STEP_PLAN_MAX_BUCKETS]; /* the same with every host layer streamed (0 without a ring) */
};

/* FERRY_ERR_INVALID (err says why) for a bad input (a stream-only host layer without a ring among them) or a
 * forced plan that does not fit the device_map (a stream-only layer forced onto the CPU). */
int step_plan_make(const struct step_plan_input *in, struct step_plan *out, char err[256]);
/* Every layer at `where` for every size (the CPU engine: PLACEMENT_CPU). */
int step_plan_uniform(struct step_plan *out, int n_layers, int max_tokens, enum placement where);
void step_plan_free(struct step_plan *p);

/* The bucket of a step of n tokens (1 <= n <= max_tokens), and its placement of every layer. */
int step_plan_bucket(const struct step_plan *p, int n_tokens);
/* The predicted seconds of a workload: n_seqs sequences, each with `prompt` prompt tokens (prefilled together
 * in steps of the largest size) and then `gen` decode steps of all n_seqs at once. 0 when a step it needs has
 * no prediction. */
double step_plan_workload_s(const struct step_plan *p, int n_seqs, int prompt, int gen);
const enum placement *step_plan_where(const struct step_plan *p, int n_tokens);

/* Steady-state seconds of a step of m tokens under the placement `where` (n_layers), per the input's costs.
 */
double step_plan_simulate(const struct step_plan_input *in, const enum placement *where, int m);
/* Where the layers that `where` parks lie: from the end of the ring (its bytes rounded down to RING_ALIGN),
 * each in its bytes rounded up to RING_ALIGN, in layer order (park_off[l] for each parked l; park_off may be
 * NULL). Returns the bytes the step's streamed pieces rotate through (ring_bytes when none is parked), or
 * UINT64_MAX when the parked layers do not fit. forward_cuda lays them out by this. */
uint64_t step_plan_park_layout(uint64_t ring_bytes, const uint64_t *layer_bytes, const enum placement *where,
                               int n_layers, uint64_t *park_off);
/* The host's seconds for a layer of `bytes` at m tokens, from the measured reference layer. */
double step_cost_cpu_layer(const struct step_cost *c, uint64_t bytes, int m);

/* The host's pace: how the CPU-computed host layers of recent steps ran against their start-up timing.
 * The planner's cost of a host layer comes from a start-up timing of a few seconds; a host that was busy
 * then, or is busier later, would leave the plan wrong for as long as the engine runs. Every step that
 * computes host layers on the CPU reports the seconds their arithmetic took and the seconds the cost model
 * gives them (at pace 1); the median ratio of the last STEP_PACE_WINDOW such steps is the host's pace. When
 * it moves outside [pace / STEP_PACE_BAND, pace * STEP_PACE_BAND] of the pace the plan was made with, the
 * plan is made again from the costs scaled by it (step_cost_paced). Nothing moves when a plan changes: a host
 * layer is streamed or computed from the same host copy. A plan that puts no host layer on the CPU at any
 * step size reports nothing, so a host timed far too slow at start-up stays streamed. */
#define STEP_PACE_WINDOW 9
#define STEP_PACE_BAND   1.15
#define STEP_PACE_MIN    0.125
#define STEP_PACE_MAX    8.0

struct step_pace {
    double pace;                    /* what the current plan assumes (1: the start-up timing) */
    double ratio[STEP_PACE_WINDOW]; /* the latest steps' seconds / expected, oldest first */
    int n;                          /* of them */
    int revisions;                  /* times the pace moved */
};

void step_pace_init(struct step_pace *p);
/* One step's host arithmetic: `seconds` taken, where the cost model (at pace 1) puts it between `lo` and `hi`
 * (0 < lo <= hi, else ignored): the model times a host layer alone and beside the link's copies, and in a
 * step that streams the link is busy only while the ring has room, so the layers may run at either rate or
 * between. A step inside [lo, hi] is at pace 1, one outside at seconds / lo or seconds / hi. Returns 1 when
 * the window's median left the band around the current pace: p->pace is then the median (within
 * [STEP_PACE_MIN, STEP_PACE_MAX]), the window starts again and the caller re-plans. */
int step_pace_observe(struct step_pace *p, double seconds, double lo, double hi);
/* c with its host times multiplied by pace. */
struct step_cost step_cost_paced(const struct step_cost *c, double pace);

/* A step whose plan computes n_cpu host layers on the CPU in cpu_s (stream_s with every host layer
 * streamed), while the host's cores also attend to attn_bytes of the KV pool's extension at rate bytes/s on
 * every layer's path (runtime/forward_cuda.c), a time T_a the plan does not count: how many of the CPU
 * layers to stream instead. With j of n streamed, the link's side of the step grows from cpu_s towards
 * stream_s and the host's shrinks from cpu_s + T_a towards T_a, both in proportion to j/n (the plan balances
 * the two sides at cpu_s); the step takes the larger side, and the j with the smallest step wins (the
 * smallest j on a tie). 0 without attention, CPU layers or a ring. */
int step_plan_ext_shift(double cpu_s, double stream_s, double attn_bytes, double rate, int n_cpu);

/* A summary line per bucket and the layer maps of the smallest and largest buckets; snprintf semantics. */
int step_plan_format(const struct step_plan *p, char *buf, size_t cap);

#endif
