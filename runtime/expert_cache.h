/* expert_cache — which experts of a Mixture-of-Experts layer the device keeps, and, on each step, where each
 * expert the router chose runs: read from a device slot (a hit), copied over the link into a slot and run
 * there (a fetch), or computed by the host's cores in place (host); or the whole step's chosen experts
 * streamed through the staging area, as large steps of host experts do without a cache.
 *
 * Each layer with experts in host memory has a fixed number of device slots (a slice of the budget; the
 * caller owns the bytes and the copies). Every expert has a score, its count of steps that chose it, decayed
 * by `decay` on each step of its layer (frequency and recency together: with decay 0 only the last step
 * counts and the policy is plain LRU through its tie rule). A fetch evicts the slot of the lowest score that
 * this step does not use (ties: the least recently chosen, then the lowest slot), and only when the incoming
 * expert's score is at least the victim's, so a one-off expert of a large step never displaces a hot one.
 * The cost model (runtime/step_plan.h's struct step_cost, the rates the layer planner measured) prices a
 * step's two sides, which run side by side after the one host round trip that brings the routing down. The
 * host computes its experts in one call: a fixed part per call plus each expert's share (its bytes at its
 * rows), both derived from the start-up timings of one expert and of a set of host_set_n experts (without
 * the set, every expert costs a whole single-expert call); while copies cross the link the host's part is
 * host_busy times slower (measured with a step's host call and copies side by side). A fetch costs its bytes
 * at h2d plus its launches, and the device's products of the slots follow the copies; an expert whose decayed
 * score before this step is at least EXPERT_CACHE_REUSE (chosen in recent steps, so likely to be chosen
 * again) has its link time counted over 1 + the score it brings beyond its victim's, any other at full price.
 * Of the misses the slots admit (most rows first), the step fetches the leading count that ends it soonest
 * (ties fetch) and gives the rest to the host. A step whose misses do not fit the slots streams them all when
 * that is predicted faster. The start-up residency puts experts 0, 1, ... in the slots with score 0. Pure
 * arithmetic, no device. Usage: expert_cache_init → (expert_cache_decide per layer step, issue its copies)
 * → expert_cache_free; expert_cache_stats for bench and /status.
 */
#ifndef FERRY_EXPERT_CACHE_H
#define FERRY_EXPERT_CACHE_H

#include <stddef.h>
#include <stdint.h>

#include "runtime/step_plan.h"

#define EXPERT_CACHE_DECAY 0.9 /* the default score decay per step of a layer */
/* The decayed score before a step from which a fetched expert is taken to serve later steps too: with decay
 * 0.9, chosen in about two of the last few steps (one pick last step alone scores 0.9). */
#define EXPERT_CACHE_REUSE 1.0

/* Where a chosen expert runs this step. */
enum expert_where {
    EXPERT_NONE = 0,   /* not chosen */
    EXPERT_HIT = 1,    /* in its slot already */
    EXPERT_FETCH = 2,  /* copied into its slot before the products */
    EXPERT_HOST = 3,   /* the host's cores */
    EXPERT_STREAM = 4, /* through the staging area with the step's other chosen experts */
};

struct expert_cache_params {
    int n_layers;
    int n_expert;                 /* experts per layer */
    const int *slots;             /* (n_layers) device slots of each layer (0: none; capped at n_expert) */
    const uint64_t *expert_bytes; /* (n_layers) bytes one expert's matrices move over the link */
    double decay;                 /* score multiplier per step of the layer, in [0, 1) */
    int can_stream;               /* a staging area exists: a step may stream its chosen experts */
    struct step_cost cost;        /* h2d, hbm, the host's timing (cpu_m, cpu_s, cpu_ref_bytes), sync_s */
    double fetch_s;               /* fixed seconds per fetched expert (its copies' launches) */
    double host_set_s; /* the host's seconds for host_set_n distinct experts at 1 row each in one call */
    int host_set_n;    /* (0: not measured; cost.cpu_s then prices every expert as a call of its own) */
    double host_busy;  /* the host's slow-down while copies cross the link (below 1: 1) */
};

/* One layer step's decision; the arrays belong to the cache and stay valid until its next decide. */
struct expert_plan {
    int stream;   /* 1: every chosen expert goes through the staging area (where[] says STREAM) */
    int n_chosen; /* distinct experts chosen */
    int n_hit, n_fetch, n_host, n_stream;
    const uint8_t *where;  /* (n_expert) enum expert_where of each expert */
    const int32_t *slot;   /* (n_expert) the slot of each HIT or FETCH expert, else -1 */
    const int32_t *fetch;  /* (n_fetch) the experts to copy, in order */
    const int32_t *rows;   /* (n_expert) rows (token, expert pairs) that chose each expert */
    uint64_t fetch_bytes;  /* over the link for the fetches (or, streaming, for the misses) */
    double link_s, host_s; /* the predicted seconds of each side */
    double predicted_s;    /* the layer step's experts: max(link + device, host) */
};

struct expert_cache_stats {
    int layers;          /* layers with slots */
    int slots;           /* slots over all of them */
    uint64_t slot_bytes; /* device bytes of the slots (the caller's figure; 0 if not told) */
    uint64_t steps;      /* layer steps decided */
    uint64_t chosen;     /* experts chosen over them (distinct per layer step) */
    uint64_t hits, fetches, host, streamed; /* of them: read from a slot, fetched, host-computed, streamed */
    uint64_t fetch_bytes;                   /* bytes fetched into slots */
    uint64_t stream_bytes;                  /* bytes streamed through the staging area */
};

struct expert_cache;

/* FERRY_ERR_INVALID for a bad shape or decay outside [0, 1), FERRY_ERR_NOMEM. */
int expert_cache_init(struct expert_cache **out, const struct expert_cache_params *p);
void expert_cache_free(struct expert_cache *c); /* accepts NULL */

/* Slots of layer l (0 for a layer outside 0..n_layers-1). */
int expert_cache_slots(const struct expert_cache *c, int l);
/* The expert in slot s of layer l, or -1 (empty, or out of range). */
int expert_cache_slot_expert(const struct expert_cache *c, int l, int s);
/* Layer l's step chose ids (n_ids = tokens x k, each 0..n_expert-1): the decision, and the cache updated as
 * if its copies were made. FERRY_ERR_RANGE for an id out of range, FERRY_ERR_INVALID for a bad layer or
 * n_ids < 1; on error nothing changes. */
int expert_cache_decide(struct expert_cache *c, int l, const int32_t *ids, int n_ids,
                        struct expert_plan *out);
/* The step's pairs (ids, wts: n_ids = tokens x k, as given to decide) split by pl (not a streaming one): slot
 * (n_ids) gets each pair's slot, -1 for a pair the host computes; the host's pairs, in pair order, get their
 * token (pair / k), expert and weight in htok, hid, hw (n_ids each at most). Returns how many pairs the host
 * computes. */
int expert_plan_pairs(const struct expert_plan *pl, const int32_t *ids, const float *wts, int n_ids, int k,
                      int32_t *slot, int32_t *htok, int32_t *hid, float *hw);
/* Adds the device bytes of the slots to what stats reports. */
void expert_cache_set_slot_bytes(struct expert_cache *c, uint64_t bytes);
void expert_cache_stats(const struct expert_cache *c, struct expert_cache_stats *st);

/* The fixed seconds of one host call, from one expert's time at 1 row (one_s) and n distinct experts' at 1
 * row each in one call (set_s): one_s less the per-expert share (set_s - one_s) / (n - 1), within
 * [0, one_s]; 0 when n < 2 or a time is not a positive number. */
double expert_cache_call_s(double one_s, double set_s, int n);

/* Slots per layer for `bytes` of device memory spread evenly over the layers with host experts (host[l] 1):
 * each of them gets the same count, the most for which sum over them of slot_bytes(l, count) fits, capped at
 * n_expert; slot_bytes(l, s) is the caller's device bytes of s slots of layer l (alignment included). Others
 * get 0. Returns the count. */
int expert_cache_split(uint64_t bytes, int n_layers, int n_expert, const uint8_t *host,
                       uint64_t (*slot_bytes)(const void *ctx, int l, int s), const void *ctx, int *slots);

/* One line: slots, hit rate, fetched and streamed bytes per layer step; snprintf semantics. */
int expert_cache_format(const struct expert_cache_stats *st, char *buf, size_t cap);

#endif
