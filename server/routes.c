/* routes — what `ferry serve` does with each request: the route table, the checks before the body (Host,
 * auth, method, Content-Type, the model's state), the GET answers, and a completion's life (parse on the
 * worker pool, the scheduler, the stream or the whole answer, the access log).
 *
 * Parsing a request (JSON, chat template, tokenizer) and rendering a whole answer run on libuv's worker pool,
 * so a large body never stalls the loop. The scheduler's engine thread reports progress through the request's
 * wake hook: it queues the request on a list and wakes the loop, which writes the new SSE chunks (as fast as
 * the client reads them) or, once every choice is done, the whole answer. A client that goes away ends its
 * request at once (http.c sees the close) and cancels its sequences. Every error leaves through
 * respond_error. Loop thread, except the worker functions; server/serve.c installs the handlers
 * (serve_impl.h).
 */
#include <arpa/inet.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <uv.h>

#include "kernels/core/log.h"
#include "kernels/core/status.h"
#include "runtime/engine.h"
#include "server/api.h"
#include "server/dashboard.h"
#include "server/http.h"
#include "server/metrics.h"
#include "server/scheduler.h"
#include "server/serve_impl.h"
#include "server/web_assets.h"

#define STREAM_UNSENT_MAX (64 * 1024) /* bytes waiting on a stream's socket before rendering pauses */

struct route;
static const char *route_allow(const struct route *r);
static int route_parse(struct hreq *h);

/* One HTTP request as the application sees it. Loop thread only, except `req` and `out` while `working` (a
 * worker fills them) and `queued`/`wnext` (under wake_mu). Freed by whichever of its owners lets go last: the
 * HTTP request (until on_end), a worker job (`working`), the wake list (`queued`). */
struct hreq {
    struct server *S;
    struct http_req *q; /* NULL once the HTTP request ended */
    uint64_t id;
    char rid[72]; /* the client's X-Request-Id when it is sane, else our counter */
    double t0;
    const struct route *rt; /* NULL: no route */
    int status;             /* HTTP status sent, for the access log */
    const char *note;       /* extra word for the access log */
    char *body;             /* a copy of the request body for the worker (the HTTP buffer may go first) */
    size_t body_len;
    uv_work_t work;
    int working;
    int rc; /* the worker's status */
    struct api_err err;
    char *out; /* the worker's answer body */
    size_t out_len;
    struct sreq *req; /* completion request, or NULL */
    int submitted;    /* req went to the scheduler */
    int gen_counted;  /* counted in S->active_gen */
    int stream;
    struct strbuf sse; /* SSE bytes rendered, not yet written */
    int sse_done;
    double t_last_out; /* when the stream last wrote bytes */
    int rendering;     /* the whole answer is being rendered */
    struct hreq *snext, *sprev;
    int in_streams;
    int queued, free_on_pop; /* under wake_mu */
    struct hreq *wnext;      /* the wake list's link (under wake_mu) */
    struct hreq *lnext;      /* on_wake's own copy of it (loop thread) */
};

/* ---- responses ---- */

/* Queues a response whose body is taken over. */
static void respond(struct hreq *h, int http, const char *ctype, char *body, size_t len)
{
    struct server *S = h->S;
    struct http_hdr hd[8];
    int n = 0;
    if (ctype) hd[n++] = (struct http_hdr){"Content-Type", ctype};
    hd[n++] = (struct http_hdr){"X-Request-Id", h->rid};
    if (S->opt.cors_origin) {
        hd[n++] = (struct http_hdr){"Access-Control-Allow-Origin", S->opt.cors_origin};
        if (strcmp(S->opt.cors_origin, "*")) hd[n++] = (struct http_hdr){"Vary", "Origin"};
    }
    if (http == 503 || http == 429) hd[n++] = (struct http_hdr){"Retry-After", "1"};
    if (http == 405 && h->rt) hd[n++] = (struct http_hdr){"Allow", route_allow(h->rt)};
    h->status = http;
    http_respond(h->q, http, hd, n, body, len);
}

static void respond_json(struct hreq *h, int http, char *body, size_t len)
{
    if (!body) {
        h->status = 503;
        http_req_refuse_nomem(h->q);
        return;
    }
    respond(h, http, "application/json", body, len);
}

/* The one way errors leave the server: status → HTTP code through api_http_status(). */
static void respond_error(struct hreq *h, int status, const char *param, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void respond_error(struct hreq *h, int status, const char *param, const char *fmt, ...)
{
    char msg[320];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    size_t len = 0;
    api_oom_reset();
    char *body = api_error_body(status, msg, param, &len);
    if (api_oom_seen()) { /* a partial error object is no error object */
        free(body);
        body = NULL;
    }
    int http = api_http_status(status, NULL, NULL);
    if (http >= 500) FLOG_WARN("req %s: %d %s", h->rid, http, msg);
    respond_json(h, http, body, len);
}

/* ---- the request's lifetime ---- */

/* Engine thread (or a sched_cancel caller), scheduler mutex held: queue h for the loop and wake it. */
static void on_engine_wake(void *user)
{
    struct hreq *h = user;
    struct server *S = h->S;
    pthread_mutex_lock(&S->wake_mu);
    if (!h->queued) {
        h->queued = 1;
        h->wnext = S->wake_head;
        S->wake_head = h;
    }
    pthread_mutex_unlock(&S->wake_mu);
    uv_async_send(&S->wake);
}

/* Drops the completion request: cancels what still runs, and makes sure the engine no longer wakes h. */
static void drop_sreq(struct hreq *h)
{
    struct server *S = h->S;
    struct sreq *r = h->req;
    if (!r) return;
    h->req = NULL;
    if (!h->submitted) { /* parsed, never queued: only this reference */
        sched_release(NULL, r);
        return;
    }
    sched_cancel(S->sched, r, FERRY_ERR_CANCELLED); /* a no-op when it finished */
    sched_lock(S->sched);
    r->wake = NULL;
    sched_unlock(S->sched);
    sched_release(S->sched, r);
}

static void hreq_free(struct hreq *h)
{
    strbuf_free(&h->sse);
    free(h->body);
    free(h->out);
    free(h);
}

/* Frees h unless a worker or the wake list still holds it (they free it when they let go). */
static void hreq_release(struct hreq *h)
{
    struct server *S = h->S;
    if (h->q || h->working) return;
    drop_sreq(h);
    pthread_mutex_lock(&S->wake_mu);
    int q = h->queued;
    if (q) h->free_on_pop = 1;
    pthread_mutex_unlock(&S->wake_mu);
    if (!q) hreq_free(h);
}

static void streams_remove(struct hreq *h)
{
    if (!h->in_streams) return;
    if (h->sprev)
        h->sprev->snext = h->snext;
    else
        h->S->streams = h->snext;
    if (h->snext) h->snext->sprev = h->sprev;
    h->in_streams = 0;
}

/* Access-log text: bytes outside printable ASCII (a %0a in a path decodes to a newline) are written \xHH. */
static const char *log_safe(const char *s, char *out, size_t cap)
{
    size_t o = 0;
    for (; *s && o + 5 < cap; s++) {
        unsigned char c = (unsigned char)*s;
        if (c < 0x20 || c >= 0x7f || c == '\\' || c == '"')
            o += (size_t)snprintf(out + o, cap - o, "\\x%02x", c);
        else
            out[o++] = (char)c;
    }
    if (*s && o + 4 <= cap) o += (size_t)snprintf(out + o, cap - o, "...");
    out[o] = 0;
    return out;
}

void routes_on_end(struct http_req *q, int aborted, void *user)
{
    struct server *S = user;
    struct hreq *h = http_req_app(q);
    if (!h) return;
    if (aborted && !h->note) h->note = h->submitted ? "client-gone" : "connection-error";
    int status = h->status ? h->status : 499; /* never answered: the client went away */
    char path[256];
    FLOG_INFO("access req=%s %s %s %d %.1fms%s%s", h->rid, http_req_method(q),
              log_safe(http_req_path(q), path, sizeof path), status, (sched_now() - h->t0) * 1e3,
              h->note ? " " : "", h->note ? h->note : "");
    metrics_count_status(&S->metrics, status);
    if (h->gen_counted) S->active_gen--;
    h->gen_counted = 0;
    streams_remove(h);
    h->q = NULL;
    hreq_release(h);
}

/* ---- completions ---- */

static void render_done(uv_work_t *w, int status);
static void render_work(uv_work_t *w);

/* New output (or the end) for h: write what the client can take. */
static void pump(struct hreq *h)
{
    struct server *S = h->S;
    if (!h->q || !h->req) return;
    if (!h->stream) {
        sched_lock(S->sched);
        int done = h->req->n_done == h->req->n_choices;
        sched_unlock(S->sched);
        if (done && !h->rendering && !h->working) {
            h->rendering = h->working = 1;
            if (uv_queue_work(&S->loop, &h->work, render_work, render_done)) {
                h->working = 0;
                respond_error(h, FERRY_ERR_INTERNAL, NULL, "cannot queue the response");
            }
        }
        return;
    }
    while (!h->sse_done && http_req_unsent(h->q) < STREAM_UNSENT_MAX) {
        sched_lock(S->sched);
        api_oom_reset();
        api_render_stream(&S->api, h->req, &h->sse, &h->sse_done);
        int oom = api_oom_seen() || h->sse.oom;
        sched_unlock(S->sched);
        if (oom) {
            /* the rendered chunks may have lost fields: end the stream with an error event that needs no
             * allocation to build (the request is cancelled when the stream ends) */
            static const char ev[] =
                "data: {\"error\":{\"message\":\"out of memory\",\"type\":\"server_error\","
                "\"param\":null,\"code\":\"out_of_memory\"}}\n\ndata: [DONE]\n\n";
            FLOG_WARN("req %s: out of memory while streaming", h->rid);
            h->note = "out-of-memory";
            h->sse_done = 1;
            if (http_stream_write(h->q, ev, sizeof ev - 1) == 0) http_stream_end(h->q);
            return; /* h may be gone */
        }
        if (h->sse.len == 0) break;
        h->t_last_out = sched_now();
        size_t n = h->sse.len;
        h->sse.len = 0;
        if (http_stream_write(h->q, h->sse.p, n)) return; /* the connection closed: h may be gone */
    }
    if (h->sse_done) http_stream_end(h->q);
}

void routes_on_wake(uv_async_t *a)
{
    struct server *S = a->data;
    /* take the list; the engine may queue the same requests again at once (through wnext), so walk a copy of
     * the links (lnext) */
    pthread_mutex_lock(&S->wake_mu);
    struct hreq *list = S->wake_head;
    S->wake_head = NULL;
    for (struct hreq *h = list; h; h = h->wnext) {
        h->queued = 0;
        h->lnext = h->wnext;
    }
    pthread_mutex_unlock(&S->wake_mu);
    for (struct hreq *h = list, *next; h; h = next) {
        next = h->lnext;
        pthread_mutex_lock(&S->wake_mu);
        int dead = h->free_on_pop, again = h->queued;
        pthread_mutex_unlock(&S->wake_mu);
        if (dead) {
            if (!again) hreq_free(h); /* else the list now holding it frees it */
            continue;
        }
        pump(h);
    }
}

void routes_on_drain(struct http_req *q, void *user)
{
    (void)user;
    struct hreq *h = http_req_app(q);
    if (h && h->stream) pump(h);
}

/* Every second: a stream that has said nothing for a while (queued, a long prefill) gets an SSE comment, so
 * that neither the client nor a proxy takes it for dead. */
void routes_on_ping(uv_timer_t *t)
{
    struct server *S = t->data;
    double ping = S->opt.conn_timeout / 2.0 < 10 ? S->opt.conn_timeout / 2.0 : 10, now = sched_now();
    for (struct hreq *h = S->streams, *next; h; h = next) {
        next = h->snext;
        if (now - h->t_last_out >= ping && !h->sse_done && http_req_unsent(h->q) == 0) {
            h->t_last_out = now;
            http_stream_write(h->q, ": ping\n\n", 8); /* h may be gone when this fails */
        }
    }
}

static void submit(struct hreq *h)
{
    struct server *S = h->S;
    struct sreq *r = h->req;
    r->wake = on_engine_wake;
    r->wake_user = h;
    int rc = sched_submit(S->sched, r);
    if (rc) {
        h->req = NULL;
        sched_release(S->sched, r);
        if (rc == FERRY_ERR_BUSY) {
            pthread_mutex_lock(&S->metrics.mu);
            S->metrics.requests_rejected++;
            pthread_mutex_unlock(&S->metrics.mu);
            respond_error(h, rc, NULL, "the server is busy: the queue is full; retry later");
        } else if (rc == FERRY_ERR_RANGE) {
            respond_error(h, rc, "n",
                          "the request has more sequences (prompts × n) than --parallel + --max-queue");
        } else if (rc == FERRY_ERR_DEVICE_MEM) {
            respond_error(
                h, FERRY_ERR_RANGE, "max_tokens",
                "prompt + max_tokens needs more KV cache than the server's whole pool (--kv-tokens)");
        } else {
            respond_error(h, SERVE_ERR_SHUTDOWN, NULL, "the server is shutting down");
        }
        return;
    }
    h->submitted = h->gen_counted = 1;
    S->active_gen++;
    h->t_last_out = sched_now();
    h->stream = r->stream;
    if (!h->stream) return; /* the wake at the end queues the whole answer */
    struct http_hdr hd[6];
    int n = 0;
    hd[n++] = (struct http_hdr){"Content-Type", "text/event-stream"};
    hd[n++] = (struct http_hdr){"Cache-Control", "no-cache"};
    hd[n++] = (struct http_hdr){"X-Accel-Buffering", "no"};
    hd[n++] = (struct http_hdr){"X-Request-Id", h->rid};
    if (S->opt.cors_origin) hd[n++] = (struct http_hdr){"Access-Control-Allow-Origin", S->opt.cors_origin};
    h->status = 200;
    if (http_stream_begin(h->q, 200, hd, n)) return; /* closed: h may be gone */
    h->snext = S->streams;
    h->sprev = NULL;
    if (S->streams) S->streams->sprev = h;
    S->streams = h;
    h->in_streams = 1;
    pump(h);
}

/* Worker thread: the route's body handler on the copied body. */
static void parse_work(uv_work_t *w)
{
    struct hreq *h = w->data;
    api_oom_reset();
    h->rc = route_parse(h);
    if (api_oom_seen()) { /* a refusal ("invalid JSON") or an answer with holes: either way, out of memory */
        if (h->req) sched_release(NULL, h->req);
        h->req = NULL;
        free(h->out);
        h->out = NULL;
        h->rc = FERRY_ERR_NOMEM;
        h->err.status = FERRY_ERR_NOMEM;
        h->err.param = NULL;
        snprintf(h->err.msg, sizeof h->err.msg, "out of memory");
    }
}

static void parse_done(uv_work_t *w, int status)
{
    struct hreq *h = w->data;
    struct server *S = h->S;
    h->working = 0;
    free(h->body);
    h->body = NULL;
    if (!h->q) { /* the client left meanwhile */
        hreq_release(h);
        return;
    }
    if (status || h->rc) {
        int st = status ? FERRY_ERR_INTERNAL : h->err.status ? h->err.status : h->rc;
        respond_error(h, st, h->err.param, "%s", h->err.msg[0] ? h->err.msg : ferry_status_str(st));
        return;
    }
    if (!h->req) { /* a body route that answers at once (tokenize, ...) */
        char *out = h->out;
        h->out = NULL;
        respond_json(h, 200, out, h->out_len);
        return;
    }
    if (serve_load_state(S) != STATE_READY) {
        respond_error(h, SERVE_ERR_SHUTDOWN, NULL, "the server is shutting down");
        return;
    }
    submit(h);
}

/* Worker thread: the whole answer of a finished request. */
static void render_work(uv_work_t *w)
{
    struct hreq *h = w->data;
    struct server *S = h->S;
    struct sreq *r = h->req;
    sched_lock(S->sched);
    int st = r->error ? r->error : r->cancelled;
    h->rc = st;
    if (st)
        snprintf(h->err.msg, sizeof h->err.msg, "%s",
                 r->error                  ? r->errmsg
                 : st == FERRY_ERR_TIMEOUT ? "the request timed out"
                                           : "the request was cancelled");
    else {
        api_oom_reset();
        h->out = api_render_full(&S->api, r, &h->out_len);
        if (api_oom_seen() || !h->out) {
            free(h->out);
            h->out = NULL;
            h->rc = FERRY_ERR_NOMEM;
            snprintf(h->err.msg, sizeof h->err.msg, "out of memory");
        }
    }
    sched_unlock(S->sched);
}

static void render_done(uv_work_t *w, int status)
{
    struct hreq *h = w->data;
    h->working = 0;
    if (!h->q) {
        hreq_release(h);
        return;
    }
    if (status || h->rc) {
        int st = status ? FERRY_ERR_INTERNAL : h->rc;
        respond_error(h, st, NULL, "%s", status ? "cannot render the response" : h->err.msg);
        return;
    }
    char *out = h->out;
    h->out = NULL;
    respond_json(h, 200, out, h->out_len);
}

/* ---- routing and the checks before the body ---- */

/* ---- the routes ---- */

/* A GET route answers on the loop; a POST route's `parse` runs on the worker pool with the body (copied in
 * h->body): it fills h->out (answered as JSON) or h->req (a completion, then submitted), or returns an error
 * status with h->err. Adding a route is a row here and its handler. */
struct route {
    const char *path;
    const char *method; /* GET routes also answer HEAD */
    int prefix;         /* the path is a prefix: "/v1/models/" + an id */
    int needs_model;    /* 503 while the model loads */
    void (*get)(struct hreq *h, const char *path);
    int (*parse)(struct hreq *h);
};

static void get_health(struct hreq *h, const char *path)
{
    (void)path;
    int state = serve_load_state(h->S);
    const char *st = state == STATE_READY      ? "ok"
                     : state == STATE_LOADING  ? "loading"
                     : state == STATE_DRAINING ? "shutting_down"
                                               : "error";
    char *b = NULL;
    if (asprintf(&b, "{\"status\":\"%s\"}", st) < 0) b = NULL;
    respond_json(h, state == STATE_READY ? 200 : 503, b, b ? strlen(b) : 0);
}

static void get_metrics(struct hreq *h, const char *path)
{
    (void)path;
    struct server *S = h->S;
    struct http_stats hs;
    http_server_stats(S->http, &hs);
    pthread_mutex_lock(&S->metrics.mu);
    S->metrics.http = hs;
    pthread_mutex_unlock(&S->metrics.mu);
    size_t len = 0;
    char *b = metrics_render(&S->metrics, &len);
    if (!b) {
        respond_error(h, FERRY_ERR_NOMEM, NULL, "out of memory");
        return;
    }
    respond(h, 200, "text/plain; version=0.0.4; charset=utf-8", b, len);
}

static void get_models(struct hreq *h, const char *path)
{
    struct server *S = h->S;
    const char *id = !strncmp(path, "/v1/models/", 11) ? path + 11 : NULL;
    if (id && strcmp(id, S->api.model_name)) {
        char safe[128];
        respond_error(h, FERRY_ERR_NOT_FOUND, "model", "The model '%s' does not exist",
                      log_safe(id, safe, sizeof safe));
        return;
    }
    size_t len = 0;
    api_oom_reset();
    char *b = api_models_body(&S->api, id, &len);
    if (api_oom_seen()) {
        free(b);
        b = NULL;
    }
    respond_json(h, 200, b, len);
}

/* The web page (server/web): public, it holds no data; what it fetches needs the key like every client. */
static void get_web(struct hreq *h, const char *path)
{
    const struct web_asset *w = web_asset_find(path);
    char *b = malloc(w->len + 1);
    if (!b) {
        respond_error(h, FERRY_ERR_NOMEM, NULL, "out of memory");
        return;
    }
    memcpy(b, w->data, w->len);
    struct server *S = h->S;
    struct http_hdr hd[6];
    int n = 0;
    hd[n++] = (struct http_hdr){"Content-Type", w->content_type};
    hd[n++] = (struct http_hdr){"Cache-Control", "no-cache"};
    hd[n++] = (struct http_hdr){"X-Request-Id", h->rid};
    if (S->opt.cors_origin) {
        hd[n++] = (struct http_hdr){"Access-Control-Allow-Origin", S->opt.cors_origin};
        if (strcmp(S->opt.cors_origin, "*")) hd[n++] = (struct http_hdr){"Vary", "Origin"};
    }
    h->status = 200;
    http_respond(h->q, 200, hd, n, b, w->len);
}

/* GET /status: the web page's live view (dashboard.h). */
static void get_status(struct hreq *h, const char *path)
{
    (void)path;
    struct server *S = h->S;
    struct engine_stats st;
    engine_get_stats(S->eng, &st);
    struct dashboard_ctx d = {S->model_name,
                              S->api.fingerprint,
                              st.backend,
                              engine_placement(S->eng),
                              engine_hparams(S->eng)->n_layers,
                              S->opt.parallel,
                              S->api.ctx_size,
                              S->t_start,
                              &S->metrics,
                              S->sched};
    size_t len = 0;
    api_oom_reset();
    char *b = dashboard_json(&d, &len);
    if (api_oom_seen()) {
        free(b);
        b = NULL;
    }
    respond_json(h, 200, b, len);
}

static int parse_completion(struct hreq *h)
{
    return api_parse_request(&h->S->api, SREQ_COMPLETION, h->body, h->body_len, &h->req, &h->err);
}

static int parse_chat(struct hreq *h)
{
    return api_parse_request(&h->S->api, SREQ_CHAT, h->body, h->body_len, &h->req, &h->err);
}

static int parse_responses(struct hreq *h)
{
    return api_parse_request(&h->S->api, SREQ_RESPONSES, h->body, h->body_len, &h->req, &h->err);
}

static int parse_embeddings(struct hreq *h)
{
    return api_parse_request(&h->S->api, SREQ_EMBED, h->body, h->body_len, &h->req, &h->err);
}

static int parse_tokenize(struct hreq *h)
{
    return api_tokenize(&h->S->api, h->body, h->body_len, &h->out, &h->out_len, &h->err);
}

static int parse_detokenize(struct hreq *h)
{
    return api_detokenize(&h->S->api, h->body, h->body_len, &h->out, &h->out_len, &h->err);
}

static const struct route routes[] = {
    {"/health", "GET", 0, 0, get_health, NULL},
    {"/metrics", "GET", 0, 0, get_metrics, NULL},
    {"/v1/models", "GET", 0, 1, get_models, NULL},
    {"/v1/models/", "GET", 1, 1, get_models, NULL},
    {"/v1/completions", "POST", 0, 1, NULL, parse_completion},
    {"/v1/chat/completions", "POST", 0, 1, NULL, parse_chat},
    {"/v1/responses", "POST", 0, 1, NULL, parse_responses},
    {"/v1/embeddings", "POST", 0, 1, NULL, parse_embeddings},
    /* the paths without /v1 that llama-server also answers */
    {"/models", "GET", 0, 1, get_models, NULL},
    {"/completions", "POST", 0, 1, NULL, parse_completion},
    {"/chat/completions", "POST", 0, 1, NULL, parse_chat},
    {"/embeddings", "POST", 0, 1, NULL, parse_embeddings},
    {"/tokenize", "POST", 0, 1, NULL, parse_tokenize},
    {"/detokenize", "POST", 0, 1, NULL, parse_detokenize},
    /* the web page and its live view */
    {"/", "GET", 0, 0, get_web, NULL},
    {"/index.html", "GET", 0, 0, get_web, NULL},
    {"/status", "GET", 0, 1, get_status, NULL},
};

static const struct route *route_match(const char *path)
{
    for (size_t i = 0; i < sizeof routes / sizeof routes[0]; i++) {
        const struct route *r = &routes[i];
        size_t n = strlen(r->path);
        if (r->prefix ? !strncmp(path, r->path, n) && path[n] : !strcmp(path, r->path)) return r;
    }
    return NULL;
}

static const char *route_allow(const struct route *r)
{
    return r->get ? "GET, HEAD, OPTIONS" : "POST, OPTIONS";
}

static int route_parse(struct hreq *h)
{
    return h->rt->parse(h);
}

/* Constant-time in the key contents: every key is compared over its whole length, no early exit. */
static int key_ok(const struct server *S, const char *got)
{
    size_t gl = strlen(got);
    int ok = 0;
    for (int i = 0; i < S->opt.n_api_keys; i++) {
        const char *k = S->opt.api_keys[i];
        size_t kl = strlen(k);
        volatile unsigned char diff = (unsigned char)(gl != kl);
        for (size_t j = 0; j < kl; j++)
            diff |= (unsigned char)((j < gl ? (unsigned char)got[j] : 0) ^ (unsigned char)k[j]);
        ok |= diff == 0;
    }
    return ok;
}

static int authorized(struct hreq *h, const char *path)
{
    struct server *S = h->S;
    if (S->opt.n_api_keys == 0) return 1;
    if (S->opt.public_health && (!strcmp(path, "/health") || !strcmp(path, "/metrics"))) return 1;
    if (web_asset_find(path)) return 1; /* the page holds no data; what it fetches needs the key */
    const char *a = http_req_header(h->q, "Authorization");
    if (!a || strncasecmp(a, "Bearer ", 7)) return 0;
    a += 7;
    while (*a == ' ') a++;
    return key_ok(S, a);
}

/* Without an API key, a web page the user visits must not reach the server through DNS rebinding (a name of
 * the attacker's that resolves to 127.0.0.1): the Host must be a loopback name, an IP literal (a rebinding
 * page always sends its own name), or a name listed in --allowed-hosts. */
static int host_allowed(const struct server *S, const char *host)
{
    if (S->opt.n_api_keys > 0 || !host) return 1; /* HTTP/1.0 without Host: not a browser */
    char name[256];
    size_t n = strlen(host);
    if (host[0] == '[') return strchr(host, ']') != NULL; /* IPv6 literal */
    const char *colon = strrchr(host, ':');
    if (colon) n = (size_t)(colon - host);
    if (n == 0 || n >= sizeof name) return 0;
    for (size_t i = 0; i < n; i++)
        name[i] = (char)(host[i] >= 'A' && host[i] <= 'Z' ? host[i] + 32 : host[i]);
    name[n] = 0;
    if (n && name[n - 1] == '.') name[--n] = 0; /* "localhost." */
    struct in_addr a4;
    if (!strcmp(name, "localhost") || (n > 10 && !strcmp(name + n - 10, ".localhost")) ||
        inet_pton(AF_INET, name, &a4) == 1)
        return 1;
    const char *p = S->opt.allowed_hosts;
    while (p && *p) {
        const char *comma = strchr(p, ',');
        size_t l = comma ? (size_t)(comma - p) : strlen(p);
        while (l && *p == ' ') p++, l--;
        while (l && p[l - 1] == ' ') l--;
        if (l == 1 && *p == '*') return 1;
        if (l == n && !strncasecmp(p, name, n)) return 1;
        if (l > 1 && *p == '.' &&
            ((n > l && !strncasecmp(name + n - l, p, l)) || (n == l - 1 && !strncasecmp(name, p + 1, n))))
            return 1;
        p = comma ? comma + 1 : NULL;
    }
    return 0;
}

/* A POST body must be JSON: a browser sends text/plain, a form encoding or no type at all cross-site without
 * a preflight, and application/json only after one (that CORS then decides). */
static int is_json(const char *ctype)
{
    if (!ctype) return 0;
    while (*ctype == ' ') ctype++;
    size_t n = strcspn(ctype, ";");
    while (n && (ctype[n - 1] == ' ' || ctype[n - 1] == '\t')) n--;
    return n == 16 && !strncasecmp(ctype, "application/json", 16);
}

static void options_reply(struct hreq *h)
{
    struct server *S = h->S;
    struct http_hdr hd[8];
    int n = 0;
    hd[n++] = (struct http_hdr){"X-Request-Id", h->rid};
    hd[n++] = (struct http_hdr){"Allow", "GET, HEAD, POST, OPTIONS"};
    if (S->opt.cors_origin) {
        hd[n++] = (struct http_hdr){"Access-Control-Allow-Origin", S->opt.cors_origin};
        if (strcmp(S->opt.cors_origin, "*")) hd[n++] = (struct http_hdr){"Vary", "Origin"};
        hd[n++] = (struct http_hdr){"Access-Control-Allow-Methods", "GET, POST, OPTIONS"};
        hd[n++] = (struct http_hdr){"Access-Control-Allow-Headers", "Authorization, Content-Type"};
        hd[n++] = (struct http_hdr){"Access-Control-Max-Age", "600"};
    }
    h->status = 204;
    http_respond(h->q, 204, hd, n, NULL, 0);
}

void routes_on_head(struct http_req *q, void *user)
{
    struct server *S = user;
    struct hreq *h = calloc(1, sizeof *h);
    if (!h) {
        http_req_refuse_nomem(q);
        return;
    }
    h->S = S;
    h->q = q;
    h->id = ++S->next_id;
    h->t0 = sched_now();
    http_req_set_app(q, h);
    const char *rid = http_req_header(q, "X-Request-Id");
    size_t rl = rid ? strlen(rid) : 0;
    int sane = rl > 0 && rl < sizeof h->rid;
    for (size_t i = 0; sane && i < rl; i++)
        sane = (rid[i] >= '0' && rid[i] <= '9') || (rid[i] >= 'a' && rid[i] <= 'z') ||
               (rid[i] >= 'A' && rid[i] <= 'Z') || rid[i] == '-' || rid[i] == '_' || rid[i] == '.' ||
               rid[i] == ':';
    if (sane)
        memcpy(h->rid, rid, rl + 1);
    else
        snprintf(h->rid, sizeof h->rid, "%llu", (unsigned long long)h->id);

    const char *method = http_req_method(q), *path = http_req_path(q);
    const struct route *rr = route_match(path);
    h->rt = rr;
    if (!host_allowed(S, http_req_header(q, "Host"))) {
        respond_error(
            h, SERVE_ERR_FORBIDDEN, NULL,
            "Host '%.100s' is not allowed without an API key: use localhost or an IP address, or start "
            "the server with --allowed-hosts or --api-key",
            http_req_header(q, "Host"));
        return;
    }
    if (!strcmp(method, "OPTIONS")) {
        options_reply(h);
        return;
    }
    if (!authorized(h, path)) {
        respond_error(h, SERVE_ERR_UNAUTHORIZED, NULL,
                      "a valid API key is required (Authorization: Bearer KEY)");
        return;
    }
    char safe[128];
    if (!rr) {
        respond_error(h, SERVE_ERR_NO_ROUTE, NULL, "no route %s %s", method,
                      log_safe(path, safe, sizeof safe));
        return;
    }
    int head = !strcmp(method, "HEAD") && rr->get;
    if (strcmp(method, rr->method) && !head) {
        respond_error(h, SERVE_ERR_METHOD, NULL, "%s is not allowed on %s (use %s)", method,
                      log_safe(path, safe, sizeof safe), rr->method);
        return;
    }
    if (rr->parse && !is_json(http_req_header(q, "Content-Type"))) {
        respond_error(h, SERVE_ERR_MEDIA_TYPE, NULL,
                      "the request body must be JSON (Content-Type: application/json)");
        return;
    }
    if (rr->needs_model && !__atomic_load_n(&S->was_ready, __ATOMIC_ACQUIRE)) {
        respond_error(h, SERVE_ERR_LOADING, NULL, "the model is still loading; retry shortly");
        return;
    }
    if (rr->get) {
        rr->get(h, path);
        return;
    }
    if (serve_load_state(S) != STATE_READY) {
        respond_error(h, SERVE_ERR_SHUTDOWN, NULL, "the server is shutting down");
        return;
    }
    /* a body route: the body is read next, then routes_on_request */
}

void routes_on_request(struct http_req *q, void *user)
{
    struct server *S = user;
    struct hreq *h = http_req_app(q);
    if (!h) return;
    size_t len;
    const char *b = http_req_body(q, &len);
    h->body = malloc(len + 1);
    if (!h->body) {
        respond_error(h, FERRY_ERR_NOMEM, NULL, "out of memory");
        return;
    }
    memcpy(h->body, b, len);
    h->body[len] = 0;
    h->body_len = len;
    h->work.data = h;
    h->working = 1;
    if (uv_queue_work(&S->loop, &h->work, parse_work, parse_done)) {
        h->working = 0;
        respond_error(h, FERRY_ERR_INTERNAL, NULL, "cannot queue the request");
    }
}
