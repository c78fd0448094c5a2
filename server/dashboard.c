/* dashboard — see dashboard.h. */
#include "server/dashboard.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "server/metrics.h"
#include "server/scheduler.h"

#define MAX_SEQS 256

static const char *kind_name(int k)
{
    static const char *names[] = {"completion", "chat", "response", "embedding", "message", "completion"};
    return k >= 0 && k < (int)(sizeof names / sizeof names[0]) ? names[k] : "?";
}

char *dashboard_json(const struct dashboard_ctx *d, size_t *len)
{
    struct metrics *m = d->m;
    pthread_mutex_lock(&m->mu);
    const int resident = m->layers_resident, streamed = m->layers_streamed;
    const uint64_t bytes = m->bytes_streamed, vb = m->vram_budget, vp = m->vram_planned, vu = m->vram_used;
    const double copy_s = m->copy_seconds, stall_s = m->stall_seconds, busy = m->engine_busy_seconds;
    const uint64_t prompt = m->prompt_tokens, gen = m->generated_tokens, cached = m->prompt_tokens_cached;
    const uint64_t steps = m->engine_steps;
    const int kv_used = m->kv_blocks_used, kv_total = m->kv_blocks_total, queued = m->queue_depth;
    const int running = m->running_seqs, batch = m->last_batch_tokens;
    const struct expert_cache_stats ec = m->expert_cache;
    pthread_mutex_unlock(&m->mu);
    const int cuda = d->backend && !strcmp(d->backend, "cuda");
    /* on the CUDA backend a layer that is neither resident nor streamed runs on the host's cores */
    const int cpu = cuda ? d->n_layers - resident - streamed : d->n_layers;

    static struct sched_seq seqs[MAX_SEQS];
    static pthread_mutex_t seqs_mu = PTHREAD_MUTEX_INITIALIZER;
    pthread_mutex_lock(&seqs_mu);
    int n = d->s ? sched_describe(d->s, seqs, MAX_SEQS) : 0;
    json_t *list = json_array();
    for (int i = 0; i < n && i < MAX_SEQS; i++)
        if (!d->client || !strcmp(seqs[i].client, d->client))
            json_array_append_new(list, json_pack("{s:s,s:s,s:s,s:i,s:i,s:i,s:i,s:i,s:f}", "id", seqs[i].id,
                                                  "kind", kind_name(seqs[i].kind), "state",
                                                  seqs[i].running ? "running" : "queued", "slot",
                                                  seqs[i].slot, "prompt_tokens", seqs[i].n_prompt,
                                                  "prefilled", seqs[i].n_fed, "generated", seqs[i].n_gen,
                                                  "max_tokens", seqs[i].max_tokens, "age_s", seqs[i].age));
    pthread_mutex_unlock(&seqs_mu);

    json_t *o = json_pack(
        "{s:s,s:s,s:s,s:f,s:f,s:s,s:{s:i,s:i,s:i,s:i},s:{s:I,s:I,s:I},s:{s:I,s:f,s:f,s:f},s:{s:i,s:i},"
        "s:{s:i,s:i,s:i,s:i},s:{s:I,s:I,s:I,s:I,s:f,s:i},s:o}",
        "model", d->model_name, "build", d->fingerprint ? d->fingerprint : "", "backend",
        d->backend ? d->backend : "", "time", sched_now(), "uptime_s", sched_now() - d->t_start, "placement",
        d->placement ? d->placement : "", "layers", "total", d->n_layers, "resident", resident, "streamed",
        streamed, "cpu", cpu < 0 ? 0 : cpu, "vram", "budget", (json_int_t)vb, "planned", (json_int_t)vp,
        "used", (json_int_t)vu, "link", "bytes", (json_int_t)bytes, "copy_s", copy_s, "gb_per_s",
        copy_s > 0 ? bytes / copy_s / 1e9 : 0.0, "stall_s", stall_s, "kv", "blocks_used", kv_used,
        "blocks_total", kv_total, "sequences", "running", running, "queued", queued, "slots", d->parallel,
        "ctx_size", d->ctx_size, "tokens", "prompt", (json_int_t)prompt, "generated", (json_int_t)gen,
        "cached", (json_int_t)cached, "steps", (json_int_t)steps, "busy_s", busy, "last_batch", batch, "seqs",
        list);
    if (!o) return NULL;
    if (ec.slots) /* the expert cache: its slots, and the decisions of every layer step so far */
        json_object_set_new(o, "expert_cache",
                            json_pack("{s:i,s:i,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:f}", "slots", ec.slots,
                                      "layers", ec.layers, "bytes", (json_int_t)ec.slot_bytes, "layer_steps",
                                      (json_int_t)ec.steps, "chosen", (json_int_t)ec.chosen, "hits",
                                      (json_int_t)ec.hits, "fetched", (json_int_t)ec.fetches, "host",
                                      (json_int_t)ec.host, "streamed", (json_int_t)ec.streamed,
                                      "fetched_bytes", (json_int_t)ec.fetch_bytes, "streamed_bytes",
                                      (json_int_t)ec.stream_bytes, "hit_rate",
                                      ec.chosen ? (double)ec.hits / (double)ec.chosen : 0.0));
    char *s = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    if (s && len) *len = strlen(s);
    return s;
}
