/* metrics — the server's counters, gauges and histograms, rendered as Prometheus text.
 *
 * All updates take one mutex (they are a few per token, far below the cost of a step). Histograms have
 * fixed bucket bounds in seconds or tokens. The engine thread owns the gauges it reports (running
 * sequences, batch size, KV blocks); the loop thread counts requests by status when they complete.
 * Besides ferry's own names, /metrics carries the gauges the Kubernetes Gateway API Inference Extension's
 * endpoint picker reads to route between replicas, under the names its configuration documents (vLLM's).
 * Usage: metrics_init(&m) → metrics_* updates from any thread → metrics_render(&m, &buf) → metrics_free.
 */
#ifndef FERRY_SERVER_METRICS_H
#define FERRY_SERVER_METRICS_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "runtime/expert_cache.h"
#include "server/http.h"

#define METRICS_N_BUCKETS 14
#define METRICS_N_STATUS  16

struct histogram {
    const double *bounds;                   /* (METRICS_N_BUCKETS) upper bounds, ascending */
    uint64_t counts[METRICS_N_BUCKETS + 1]; /* last: +Inf */
    double sum;
    uint64_t n;
};

struct metrics {
    pthread_mutex_t mu;
    int status_code[METRICS_N_STATUS];
    uint64_t status_count[METRICS_N_STATUS];
    uint64_t prompt_tokens, generated_tokens, device_drawn_tokens, overlapped_steps, requests_cancelled,
        requests_rejected;
    uint64_t prompt_tokens_cached; /* prompt positions not prefilled: the prompt cache, or shared (n > 1) */
    uint64_t spec_steps, spec_drafted, spec_accepted; /* speculative decoding: verification steps, tokens */
    uint64_t seqs_yielded;   /* sequences that gave their slot up to a waiting one (sched_policy.h) */
    uint64_t queue_timeouts; /* requests refused 503 after --queue-timeout without a slot */
    struct histogram ttft, itl, batch_tokens, request_seconds;
    int queue_depth, running_seqs, last_batch_tokens;
    int kv_blocks_used, kv_blocks_total;
    int kv_blocks_idle; /* of kv_blocks_used, blocks held only by free slots' prompt caches (given up on
                           demand) */
    int kv_block_size;  /* positions per KV block */
    /* Offloading (CUDA backend; zero on the CPU): copied from engine_get_stats by the engine thread. */
    int layers_resident, layers_streamed;
    uint64_t bytes_streamed, vram_budget, vram_planned, vram_used, kv_host_bytes, kv_ext_host_rows,
        ext_streamed_steps;
    double copy_seconds, stall_seconds, kv_ext_host_seconds;
    double
        host_pace; /* --placement auto: host layers' pace against their start-up timing (0: not followed) */
    int plan_revisions;                     /* times the step plan was made again for it */
    struct expert_cache_stats expert_cache; /* the device expert cache of host experts (zero: none) */
    uint64_t engine_steps;
    double engine_busy_seconds;
    int loading;            /* 1 until the model is ready */
    struct http_stats http; /* connections: copied from http_server_stats before each render */
};

void metrics_init(struct metrics *m);
void metrics_free(struct metrics *m);
void metrics_count_status(struct metrics *m, int http_status);
void metrics_observe(struct metrics *m, struct histogram *h, double v);

/* The scheduler's updates (engine thread, or a sched_cancel caller; each takes m->mu). */
struct engine_stats;
void metrics_set_queue_depth(struct metrics *m, int queued);
/* Gauges of one iteration: the queue, the running sequences, the engine's own statistics and, of its KV
 * blocks in use, those held only by the prompt caches of free slots (kv_idle). */
void metrics_set_engine(struct metrics *m, int queued, int running, const struct engine_stats *st,
                        int kv_idle);
void metrics_count_cancelled(struct metrics *m);
void metrics_count_preempted(struct metrics *m);           /* a running sequence gave its slot up */
void metrics_count_queue_timeout(struct metrics *m);       /* a request waited past --queue-timeout */
void metrics_add_cached(struct metrics *m, int positions); /* prompt positions not prefilled */
/* Speculative decoding: one sequence's verification of `drafted` tokens, `accepted` of them kept. */
void metrics_spec(struct metrics *m, int drafted, int accepted);
void metrics_request_done(struct metrics *m, double seconds);
/* A generated token went out: the first of its sequence (time to first token) or a later one. */
void metrics_token_out(struct metrics *m, int first, double seconds);
/* One engine step: its prefill and generated tokens (n_drawn of them drawn by the engine's device sampler),
 * the engine's time, the batch's tokens; overlapped: it began before the last step's outputs went out. */
void metrics_step_done(struct metrics *m, int n_prefill, int n_gen, int n_drawn, double busy_seconds,
                       int batch_tokens, int running, int overlapped);
/* Renders into a malloc'd NUL-terminated buffer; returns NULL when out of memory. */
char *metrics_render(struct metrics *m, size_t *len);

#endif
