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
 * every mode, CPU included; host layers only the host's cores compute (cpu_only: a recurrent layer whose
 * state lives in host memory) are on the CPU in every mode and bucket, STREAM included, and never stream
 * (not even for the KV extension's shift, engine.c); only the others count among the h. The costs come from
 * start-up measurements (step_cost). Pure arithmetic: no device, tested in CI. Usage: step_plan_make →
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
    /* The exchanges around host layers: a wait for the device (sync_s) per host layer with KV ops (its
     * attention; step_plan_input.no_attend) and per run of consecutive host layers (x coming down), plus
     * bytes per token at h2d. */
    double sync_s;
    double layer_bytes_per_token; /* q|k|v up, attention output down */
    double run_bytes_per_token;   /* x down, x up */
};

struct step_pace;
struct step_plan;

struct step_plan_input {
    int n_layers;
    const enum placement *where; /* (n_layers) the device_map's: PLACEMENT_GPU or PLACEMENT_STREAM (host) */
    const uint8_t *stream_only;  /* (n_layers) the device_map's: 1 = never on the CPU; NULL: none */
    const uint8_t *cpu_only; /* (n_layers) the device_map's: 1 = a host layer always on the CPU; NULL: none */
    /* (n_layers) 1: a layer without KV ops (a recurrent one), which on the CPU exchanges nothing with the
     * device beyond the run's x; NULL: every layer has them. */
    const uint8_t *no_attend;
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
    /* The host's pace per count of CPU layers: a placement with c CPU layers has their times multiplied by
     * step_pace_expect(pace, c); NULL: the costs as given. */
    const struct step_pace *pace;
    /* AUTO: the plan in use (of the same device_map and max_tokens), or NULL: a step size keeps its layers
     * unless the new choice is faster by STEP_PACE_KEEP. */
    const struct step_plan *keep;
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

/* FERRY_ERR_INVALID (err says why) for a bad input (a stream-only host layer without a ring among them, a
 * layer both stream-only and CPU-only) or a forced plan that does not fit the device_map (a stream-only layer
 * forced onto the CPU, a CPU-only host layer forced anywhere else). */
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

/* The host's pace: how the CPU-computed host layers of recent steps ran against their start-up timing, for
 * each count of CPU layers a step had. The planner's cost of a host layer comes from a start-up timing of a
 * few seconds; a host that was busy then, or is busier later, would leave the plan wrong for as long as the
 * engine runs. Every step that computes host layers on the CPU reports how many it computed, the seconds
 * their arithmetic took and the seconds the cost model gives them (at pace 1); the median ratio of the last
 * STEP_PACE_WINDOW steps with that count is the pace seen for it. The pace depends on the plan itself: the
 * CPU's layers and the link's copies share host memory, so more CPU layers run slower (F16 7B at 12 GiB on
 * the H100 host: 14 CPU layers at 1.25x, 12-13 at 1.0x). One pace for every plan therefore oscillated (14
 * layers seen slow → 13 planned → seen fast → 14 planned, every second), so the pace is remembered per
 * count, and a candidate plan is costed at the pace seen for its count (step_pace_expect: interpolated
 * between the nearest counts seen; above them, the most layers seen; below them, the fewest seen or, before
 * anything is seen, the start-up timing: fewer layers never run slower, and trying them is how the planner
 * learns their pace). The planner then keeps each step size's current layers unless the new choice beats
 * them, both at their expected paces, by STEP_PACE_KEEP (step_plan_input.keep). A plan that was left is
 * costed at the pace seen for it, so it comes back only when the evidence changes: a count seen again outside
 * [seen / STEP_PACE_BAND, seen * STEP_PACE_BAND] means the host itself changed, and every remembered pace is
 * scaled by the same factor. Nothing moves when a plan changes: a host layer is streamed or computed from the
 * same host copy. A plan that puts no host layer on the CPU at any step size reports nothing, so a host timed
 * far too slow at start-up stays streamed. */
#define STEP_PACE_WINDOW 9
#define STEP_PACE_BAND   1.15
#define STEP_PACE_MIN    0.125
#define STEP_PACE_MAX    8.0
#define STEP_PACE_KEEP   0.04 /* a step size changes its layers for a predicted gain of 4% or more */
#define STEP_PACE_KEYS   128  /* counts of CPU layers remembered (a step with more counts as the last) */
#define STEP_PACE_SLOTS  4    /* counts observed at once (step sizes with different counts interleave) */

struct step_pace {
    double pace;                 /* the latest pace judged (of any count); 1 at first */
    double seen[STEP_PACE_KEYS]; /* the pace judged for steps of each count of CPU layers; 0: none yet */
    /* The pace expected below the fewest CPU layers seen: 1 (the start-up timing, one layer at a time);
     * once a count below all others seen is judged off it, that count's pace; scaled with the others. */
    double base;
    struct {
        int n_cpu;                      /* the count these steps had (-1: free) */
        int n;                          /* ratios held */
        double ratio[STEP_PACE_WINDOW]; /* the latest such steps' seconds / expected, oldest first */
        uint64_t used;                  /* when last observed (clock) */
    } slot[STEP_PACE_SLOTS];
    uint64_t clock;
    int revisions; /* plans adopted since start-up (the engine counts them) */
};

void step_pace_init(struct step_pace *p);
/* One step's host arithmetic: n_cpu layers computed on the CPU in `seconds`, where the cost model (at pace 1)
 * puts them between `lo` and `hi` (n_cpu >= 1, 0 < lo <= hi, else ignored): the model times a host layer
 * alone and beside the link's copies, and in a step that streams the link is busy only while the ring has
 * room, so the layers may run at either rate or between. A step inside [lo, hi] is at pace 1, one outside at
 * seconds / lo or seconds / hi. Returns 1 when the evidence changed and the caller should make the plan again
 * (with .pace and .keep): the window of n_cpu's steps is full and its median (within [STEP_PACE_MIN,
 * STEP_PACE_MAX]) is the first for n_cpu and outside the band around what step_pace_expect gave for it, or
 * leaves the band around the pace seen for it before (every remembered pace is then scaled by the move). The
 * window then starts again. */
int step_pace_observe(struct step_pace *p, int n_cpu, double seconds, double lo, double hi);
/* The pace expected for a step of n_cpu CPU layers: the one seen for n_cpu, else interpolated linearly
 * between the nearest counts seen below and above; above every count seen, the largest one's; below every
 * count seen, p->base. */
double step_pace_expect(const struct step_pace *p, int n_cpu);
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
