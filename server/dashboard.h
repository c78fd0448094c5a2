/* dashboard — GET /status: what the web page's live view shows, as one JSON object: where the layers are
 * (resident on the GPU, streamed, computed on the CPU), VRAM budget and use, the link's achieved GB/s and the
 * stall time, KV blocks, the counts of running and queued sequences and the caller's own (another client's
 * requests are never shown: with API keys each key is a tenant), and the token counters the page turns into
 * tokens/s. Read from the metrics (which the engine thread fills from engine_get_stats every iteration) and
 * the scheduler; never touches the engine.
 */
#ifndef FERRY_SERVER_DASHBOARD_H
#define FERRY_SERVER_DASHBOARD_H

#include <stddef.h>

struct metrics;
struct sched;

struct dashboard_ctx {
    const char *model_name, *fingerprint, *backend; /* backend: "cpu" or "cuda" */
    const char *placement;                          /* engine_placement() text */
    int n_layers, parallel, ctx_size;
    double t_start; /* sched_now() when the server started */
    struct metrics *m;
    struct sched *s;
    const char *client; /* the caller (struct sreq's client): only its own sequences are listed; the counts
                         * cover everyone's. NULL: every sequence is listed */
};

/* The JSON body (malloc'd), or NULL when out of memory. */
char *dashboard_json(const struct dashboard_ctx *d, size_t *len);

#endif
