/* metrics — counters and histograms behind /metrics, in the Prometheus text exposition format 0.0.4. */
#include "server/metrics.h"

#include "runtime/engine.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const double seconds_bounds[METRICS_N_BUCKETS] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                                                         0.25,  0.5,    1,     2.5,  5,     10,   30};
static const double tokens_bounds[METRICS_N_BUCKETS] = {1,   2,   4,   8,    16,   32,   64,
                                                        128, 256, 512, 1024, 2048, 4096, 8192};
static const double request_bounds[METRICS_N_BUCKETS] = {0.01, 0.05, 0.1, 0.25, 0.5, 1,   2.5,
                                                         5,    10,   20,  30,   60,  120, 300};

void metrics_init(struct metrics *m)
{
    memset(m, 0, sizeof *m);
    pthread_mutex_init(&m->mu, NULL);
    m->ttft.bounds = seconds_bounds;
    m->itl.bounds = seconds_bounds;
    m->batch_tokens.bounds = tokens_bounds;
    m->request_seconds.bounds = request_bounds;
    m->loading = 1;
}

void metrics_free(struct metrics *m)
{
    if (m) pthread_mutex_destroy(&m->mu);
}

void metrics_count_status(struct metrics *m, int code)
{
    pthread_mutex_lock(&m->mu);
    int i;
    for (i = 0; i < METRICS_N_STATUS && m->status_code[i] && m->status_code[i] != code; i++) {
    }
    if (i < METRICS_N_STATUS) {
        m->status_code[i] = code;
        m->status_count[i]++;
    }
    pthread_mutex_unlock(&m->mu);
}

/* Caller may or may not hold m->mu: histograms are only touched here, under it. */
void metrics_observe(struct metrics *m, struct histogram *h, double v)
{
    pthread_mutex_lock(&m->mu);
    int i = 0;
    while (i < METRICS_N_BUCKETS && v > h->bounds[i]) i++;
    h->counts[i]++;
    h->sum += v;
    h->n++;
    pthread_mutex_unlock(&m->mu);
}

void metrics_set_queue_depth(struct metrics *m, int queued)
{
    pthread_mutex_lock(&m->mu);
    m->queue_depth = queued;
    pthread_mutex_unlock(&m->mu);
}

void metrics_set_engine(struct metrics *m, int queued, int running, const struct engine_stats *st,
                        int kv_idle)
{
    pthread_mutex_lock(&m->mu);
    m->kv_blocks_idle = kv_idle;
    m->kv_block_size = st->kv_block_size;
    m->queue_depth = queued;
    m->running_seqs = running;
    m->kv_blocks_used = st->kv_blocks_used;
    m->kv_blocks_total = st->kv_blocks_total;
    m->layers_resident = st->n_resident;
    m->layers_streamed = st->n_streamed;
    m->bytes_streamed = st->bytes_streamed;
    m->copy_seconds = st->copy_seconds;
    m->stall_seconds = st->stall_seconds;
    m->vram_budget = st->vram_budget;
    m->vram_planned = st->vram_planned;
    m->vram_used = st->vram_used;
    m->kv_host_bytes = st->kv_host_bytes;
    m->kv_ext_host_rows = st->kv_ext_host_rows;
    m->kv_ext_host_seconds = st->kv_ext_host_seconds;
    m->ext_streamed_steps = st->ext_streamed_steps;
    m->host_pace = st->host_pace;
    m->plan_revisions = st->plan_revisions;
    m->expert_cache = st->expert_cache;
    pthread_mutex_unlock(&m->mu);
}

void metrics_count_cancelled(struct metrics *m)
{
    pthread_mutex_lock(&m->mu);
    m->requests_cancelled++;
    pthread_mutex_unlock(&m->mu);
}

void metrics_count_preempted(struct metrics *m)
{
    pthread_mutex_lock(&m->mu);
    m->seqs_yielded++;
    pthread_mutex_unlock(&m->mu);
}

void metrics_count_queue_timeout(struct metrics *m)
{
    pthread_mutex_lock(&m->mu);
    m->queue_timeouts++;
    pthread_mutex_unlock(&m->mu);
}

void metrics_add_cached(struct metrics *m, int positions)
{
    pthread_mutex_lock(&m->mu);
    m->prompt_tokens_cached += (uint64_t)positions;
    pthread_mutex_unlock(&m->mu);
}

void metrics_spec(struct metrics *m, int drafted, int accepted)
{
    pthread_mutex_lock(&m->mu);
    m->spec_steps++;
    m->spec_drafted += (uint64_t)drafted;
    m->spec_accepted += (uint64_t)accepted;
    pthread_mutex_unlock(&m->mu);
}

void metrics_request_done(struct metrics *m, double seconds)
{
    metrics_observe(m, &m->request_seconds, seconds);
}

void metrics_token_out(struct metrics *m, int first, double seconds)
{
    metrics_observe(m, first ? &m->ttft : &m->itl, seconds);
}

void metrics_step_done(struct metrics *m, int n_prefill, int n_gen, int n_drawn, double busy_seconds,
                       int batch_tokens, int running, int overlapped)
{
    pthread_mutex_lock(&m->mu);
    m->prompt_tokens += (uint64_t)n_prefill;
    m->generated_tokens += (uint64_t)n_gen;
    m->device_drawn_tokens += (uint64_t)n_drawn;
    m->overlapped_steps += overlapped != 0;
    m->engine_steps++;
    m->engine_busy_seconds += busy_seconds;
    m->last_batch_tokens = batch_tokens;
    m->running_seqs = running;
    pthread_mutex_unlock(&m->mu);
    metrics_observe(m, &m->batch_tokens, batch_tokens);
}

struct sbuf {
    char *p;
    size_t len, cap;
    int oom;
};

static void sb_printf(struct sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_printf(struct sbuf *b, const char *fmt, ...)
{
    if (b->oom) return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(b->p + b->len, b->cap - b->len, fmt, ap);
        va_end(ap);
        if (n < 0) {
            b->oom = 1;
            return;
        }
        if ((size_t)n < b->cap - b->len) {
            b->len += (size_t)n;
            return;
        }
        size_t cap = b->cap * 2 + (size_t)n + 64;
        char *p = realloc(b->p, cap);
        if (!p) {
            b->oom = 1;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
}

static void render_hist(struct sbuf *b, const char *name, const char *help, const struct histogram *h)
{
    sb_printf(b, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
    uint64_t cum = 0;
    for (int i = 0; i < METRICS_N_BUCKETS; i++) {
        cum += h->counts[i];
        sb_printf(b, "%s_bucket{le=\"%g\"} %llu\n", name, h->bounds[i], (unsigned long long)cum);
    }
    cum += h->counts[METRICS_N_BUCKETS];
    sb_printf(b, "%s_bucket{le=\"+Inf\"} %llu\n%s_sum %.6f\n%s_count %llu\n", name, (unsigned long long)cum,
              name, h->sum, name, (unsigned long long)h->n);
}

/* The Gateway API Inference Extension's model server protocol: queued requests, running requests and the KV
 * cache's utilisation as gauges, named as its endpoint picker's default configuration names them (vLLM's; the
 * KV utilisation under vLLM's current name and the one older pickers default to). Waiting and running count
 * sequences (a request with n choices is n), as vLLM's scheduler does. The utilisation is a fraction (0..1)
 * of the KV pool held by running sequences: a free slot's prompt cache is given up when a new sequence needs
 * its blocks, so it counts as free, as vLLM counts its cached free blocks. cache_config_info gives the block
 * size (positions) and the pool's blocks (the whole pool, which on a GPU includes any extension in host
 * memory) to the picker's prefix-cache scorer. No LoRA gauge: ferry serves no adapters. */
static void render_gateway(struct sbuf *b, const struct metrics *m)
{
    int active = m->kv_blocks_used - m->kv_blocks_idle;
    if (active < 0) active = 0; /* a free slot's cache may share blocks with a running sequence */
    const double usage = m->kv_blocks_total > 0 ? (double)active / m->kv_blocks_total : 0.0;
    sb_printf(b,
              "# HELP vllm:num_requests_waiting Sequences waiting for a slot (as ferry_queue_depth).\n"
              "# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting %d\n"
              "# HELP vllm:num_requests_running Sequences holding a slot (as ferry_running_sequences).\n"
              "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running %d\n",
              m->queue_depth, m->running_seqs);
    static const char *const usage_names[] = {"vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"};
    for (int i = 0; i < 2; i++)
        sb_printf(b,
                  "# HELP %s Fraction of the KV cache's blocks held by running sequences (1 = full; a free "
                  "slot's prompt cache counts as free).\n# TYPE %s gauge\n%s %.6f\n",
                  usage_names[i], usage_names[i], usage_names[i], usage);
    if (m->kv_blocks_total > 0)
        sb_printf(
            b,
            "# HELP vllm:cache_config_info The KV cache's shape: positions per block, blocks in the pool.\n"
            "# TYPE vllm:cache_config_info gauge\n"
            "vllm:cache_config_info{block_size=\"%d\",num_gpu_blocks=\"%d\"} 1\n",
            m->kv_block_size, m->kv_blocks_total);
}

char *metrics_render(struct metrics *m, size_t *len)
{
    struct sbuf b = {malloc(4096), 0, 4096, 0};
    if (!b.p) return NULL;
    b.p[0] = 0;
    pthread_mutex_lock(&m->mu);
    sb_printf(&b, "# HELP ferry_requests_total HTTP requests completed, by status code.\n"
                  "# TYPE ferry_requests_total counter\n");
    for (int i = 0; i < METRICS_N_STATUS && m->status_code[i]; i++)
        sb_printf(&b, "ferry_requests_total{status=\"%d\"} %llu\n", m->status_code[i],
                  (unsigned long long)m->status_count[i]);
#define COUNTER(n, h, v)                                                                                     \
    sb_printf(&b, "# HELP " n " " h "\n# TYPE " n " counter\n" n " %llu\n", (unsigned long long)(v))
#define GAUGE(n, h, fmt, v) sb_printf(&b, "# HELP " n " " h "\n# TYPE " n " gauge\n" n " " fmt "\n", v)
    COUNTER("ferry_prompt_tokens_total", "Prompt tokens prefilled.", m->prompt_tokens);
    COUNTER("ferry_prompt_tokens_cached_total",
            "Prompt tokens not prefilled: continued from the prompt cache or shared by the choices of one "
            "prompt.",
            m->prompt_tokens_cached);
    COUNTER("ferry_generated_tokens_total", "Tokens generated.", m->generated_tokens);
    COUNTER("ferry_spec_verifications_total",
            "Speculative decoding (--spec-type): a sequence's drafted tokens verified in one step.",
            m->spec_steps);
    COUNTER("ferry_spec_drafted_tokens_total", "Speculative decoding: tokens drafted.", m->spec_drafted);
    COUNTER("ferry_spec_accepted_tokens_total",
            "Speculative decoding: drafted tokens accepted (generated without a step of their own).",
            m->spec_accepted);
    COUNTER("ferry_device_sampled_tokens_total",
            "Generated tokens drawn by the GPU sampler (--gpu-sampling) rather than on the host.",
            m->device_drawn_tokens);
    COUNTER("ferry_overlapped_steps_total",
            "Engine steps begun before the previous step's tokens were published (--overlap).",
            m->overlapped_steps);
    COUNTER("ferry_requests_cancelled_total", "Sequences cancelled (client gone, timeout, shutdown).",
            m->requests_cancelled);
    COUNTER(
        "ferry_sequences_yielded_total",
        "Running sequences that gave their slot to a waiting one (a paused stream, a client over its share).",
        m->seqs_yielded);
    COUNTER("ferry_queue_timeouts_total", "Requests answered 503 after --queue-timeout without a slot.",
            m->queue_timeouts);
    COUNTER("ferry_requests_rejected_total", "Requests refused because the queue was full.",
            m->requests_rejected);
    COUNTER("ferry_engine_steps_total", "engine_step calls.", m->engine_steps);
    sb_printf(&b,
              "# HELP ferry_engine_busy_seconds_total Wall time spent inside engine_step.\n"
              "# TYPE ferry_engine_busy_seconds_total counter\nferry_engine_busy_seconds_total %.6f\n",
              m->engine_busy_seconds);
    GAUGE("ferry_queue_depth", "Sequences waiting for a slot.", "%d", m->queue_depth);
    GAUGE("ferry_running_sequences", "Sequences holding a slot.", "%d", m->running_seqs);
    GAUGE("ferry_batch_tokens", "Tokens in the last engine step.", "%d", m->last_batch_tokens);
    GAUGE("ferry_kv_blocks_used", "KV cache blocks in use.", "%d", m->kv_blocks_used);
    GAUGE("ferry_kv_blocks_total", "KV cache blocks in the pool.", "%d", m->kv_blocks_total);
    GAUGE("ferry_model_loading", "1 while the model loads.", "%d", m->loading);
    GAUGE("ferry_layers_resident", "Layers resident in GPU memory (CUDA backend).", "%d", m->layers_resident);
    GAUGE("ferry_layers_streamed", "Layers streamed from pinned host memory each step (CUDA backend).", "%d",
          m->layers_streamed);
    COUNTER("ferry_weight_bytes_streamed_total", "Weight bytes copied host to device.", m->bytes_streamed);
    sb_printf(&b,
              "# HELP ferry_stream_copy_seconds_total Copy-stream time spent on streamed weights.\n"
              "# TYPE ferry_stream_copy_seconds_total counter\nferry_stream_copy_seconds_total %.6f\n"
              "# HELP ferry_stream_stall_seconds_total Compute time spent waiting for streamed weights.\n"
              "# TYPE ferry_stream_stall_seconds_total counter\nferry_stream_stall_seconds_total %.6f\n",
              m->copy_seconds, m->stall_seconds);
    GAUGE("ferry_vram_budget_bytes", "GPU memory budget of the plan.", "%llu",
          (unsigned long long)m->vram_budget);
    GAUGE("ferry_vram_planned_bytes", "GPU memory the plan allocates.", "%llu",
          (unsigned long long)m->vram_planned);
    GAUGE("ferry_vram_used_bytes", "GPU memory the engine took at load (cudaMemGetInfo).", "%llu",
          (unsigned long long)m->vram_used);
    GAUGE("ferry_kv_host_bytes", "The KV pool's extension in pinned host memory.", "%llu",
          (unsigned long long)m->kv_host_bytes);
    COUNTER("ferry_kv_ext_host_rows_total",
            "Token rows x layers whose attention over the extension's positions the host's cores computed.",
            m->kv_ext_host_rows);
    if (m->expert_cache.slots) {
        GAUGE("ferry_expert_cache_slots", "Device slots of the expert cache over the host-expert layers.",
              "%d", m->expert_cache.slots);
        COUNTER("ferry_expert_cache_chosen_total", "Experts chosen in the host-expert layers' steps.",
                m->expert_cache.chosen);
        COUNTER("ferry_expert_cache_hits_total", "Of them, read from a device slot.", m->expert_cache.hits);
        COUNTER("ferry_expert_cache_fetches_total", "Of them, copied into a slot before use.",
                m->expert_cache.fetches);
        COUNTER("ferry_expert_cache_host_total", "Of them, computed by the host's cores.",
                m->expert_cache.host);
        COUNTER("ferry_expert_cache_fetched_bytes_total", "Bytes copied into the expert cache's slots.",
                m->expert_cache.fetch_bytes);
    }
    sb_printf(
        &b,
        "# HELP ferry_kv_ext_host_seconds_total Wall time of the host's attention over the extension (the "
        "compute stream waits for it).\n"
        "# TYPE ferry_kv_ext_host_seconds_total counter\nferry_kv_ext_host_seconds_total %.6f\n",
        m->kv_ext_host_seconds);
    COUNTER("ferry_ext_streamed_steps_total",
            "Steps that streamed some or all of their CPU-planned host layers instead, the host's cores "
            "attending "
            "to the extension.",
            m->ext_streamed_steps);
    GAUGE("ferry_host_pace",
          "Host layers' arithmetic time against their start-up timing (--placement auto; 0: not followed).",
          "%.3f", m->host_pace);
    COUNTER("ferry_step_plan_revisions_total", "Times the step plan was made again for the host's pace.",
            (uint64_t)m->plan_revisions);
    const struct http_stats *hs = &m->http;
    GAUGE("ferry_http_connections_open", "HTTP connections open (past --max-connections they are refused).",
          "%d", hs->open);
    GAUGE("ferry_http_connections_peak", "Most HTTP connections open at once.", "%d", hs->peak);
    COUNTER("ferry_http_connections_total", "HTTP connections accepted.", hs->accepted);
    sb_printf(
        &b,
        "# HELP ferry_http_connections_rejected_total Connections answered 503 at the accept, by limit.\n"
        "# TYPE ferry_http_connections_rejected_total counter\n"
        "ferry_http_connections_rejected_total{limit=\"max_connections\"} %llu\n"
        "ferry_http_connections_rejected_total{limit=\"per_ip\"} %llu\n",
        (unsigned long long)hs->rejected_full, (unsigned long long)hs->rejected_per_ip);
    COUNTER("ferry_http_connections_evicted_total",
            "Idle or slow connections closed at --max-connections to let a client from another address in.",
            hs->evicted);
    COUNTER("ferry_http_request_timeouts_total",
            "Requests answered 408: head or body not complete in time, or silent mid-request.",
            hs->head_timeouts);
    COUNTER("ferry_http_idle_closed_total",
            "Idle connections closed after --conn-timeout (or --header-timeout).", hs->idle_closed);
    COUNTER("ferry_http_stalled_readers_total", "Connections dropped: the client left the answer unread.",
            hs->stalled_readers);
    COUNTER("ferry_http_protocol_errors_total", "Malformed or refused requests answered by the HTTP layer.",
            hs->protocol_errors);
    render_hist(&b, "ferry_time_to_first_token_seconds", "Time from request arrival to first token.",
                &m->ttft);
    render_hist(&b, "ferry_inter_token_latency_seconds", "Time between tokens of one sequence.", &m->itl);
    render_hist(&b, "ferry_batch_size_tokens", "Tokens per engine step.", &m->batch_tokens);
    render_hist(&b, "ferry_request_duration_seconds", "Time from arrival to completion of a request.",
                &m->request_seconds);
    render_gateway(&b, m);
    pthread_mutex_unlock(&m->mu);
    if (b.oom) {
        free(b.p);
        return NULL;
    }
    *len = b.len;
    return b.p;
}
