/* routes_gen — a completion's life in `ferry serve` (see routes.c for the whole picture): the body parsed on
 * libuv's worker pool, the request submitted to the scheduler, its progress (the engine thread's wake hook)
 * written as SSE chunks as fast as the client reads them or rendered whole on the worker pool, and the
 * request's end (access log, cancellation of a client that went away). Loop thread, except the worker
 * functions. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <uv.h>

#include "kernels/core/log.h"
#include "kernels/core/status.h"
#include "server/api.h"
#include "server/http.h"
#include "server/metrics.h"
#include "server/routes_impl.h"
#include "server/scheduler.h"

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

void routes_on_end(struct http_req *q, int aborted, void *user)
{
    struct server *S = user;
    struct hreq *h = http_req_app(q);
    if (!h) return;
    if (aborted && !h->note) h->note = h->submitted ? "client-gone" : "connection-error";
    int status = h->status ? h->status : 499; /* never answered: the client went away */
    char path[256];
    FLOG_INFO("access req=%s %s %s %d %.1fms%s%s", h->rid, http_req_method(q),
              ferry_log_safe(http_req_path(q), path, sizeof path), status, (sched_now() - h->t0) * 1e3,
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
                hreq_respond_error(h, FERRY_ERR_INTERNAL, NULL, "cannot queue the response");
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
    if (h->sse_done)
        http_stream_end(h->q);
    else /* a client that stops reading pauses its sequences (they give their slots to waiting ones) */
        sched_set_paused(S->sched, h->req, http_req_unsent(h->q) >= STREAM_UNSENT_MAX);
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

/* After the loop and the engine thread have stopped: frees the requests whose connection ended while they
 * waited on the wake list (their free_on_pop was set, and no wake-up will ever pop them now). */
void routes_wake_drain(struct server *S)
{
    pthread_mutex_lock(&S->wake_mu);
    struct hreq *list = S->wake_head;
    S->wake_head = NULL;
    pthread_mutex_unlock(&S->wake_mu);
    for (struct hreq *h = list, *next; h; h = next) {
        next = h->wnext;
        if (h->free_on_pop) hreq_free(h);
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
    snprintf(r->client, sizeof r->client, "%s", h->client);
    int rc = sched_submit(S->sched, r);
    if (rc) {
        h->req = NULL;
        sched_release(S->sched, r);
        if (rc == FERRY_ERR_BUSY) {
            pthread_mutex_lock(&S->metrics.mu);
            S->metrics.requests_rejected++;
            pthread_mutex_unlock(&S->metrics.mu);
            hreq_respond_error(h, rc, NULL, "the server is busy: the queue is full; retry later");
        } else if (rc == FERRY_ERR_RANGE) {
            hreq_respond_error(h, rc, "n",
                               "the request has more sequences (prompts × n) than --parallel + --max-queue");
        } else if (rc == FERRY_ERR_DEVICE_MEM) {
            hreq_respond_error(
                h, FERRY_ERR_RANGE, "max_tokens",
                "prompt + max_tokens needs more KV cache than the server's whole pool (--kv-tokens)");
        } else {
            hreq_respond_error(h, SERVE_ERR_SHUTDOWN, NULL, "the server is shutting down");
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
void routes_parse_work(uv_work_t *w)
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

void routes_parse_done(uv_work_t *w, int status)
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
        hreq_respond_error(h, st, h->err.param, "%s", h->err.msg[0] ? h->err.msg : ferry_status_str(st));
        return;
    }
    if (!h->req) { /* a body route that answers at once (tokenize, ...) */
        char *out = h->out;
        h->out = NULL;
        hreq_respond_json(h, 200, out, h->out_len);
        return;
    }
    if (serve_load_state(S) != STATE_READY) {
        hreq_respond_error(h, SERVE_ERR_SHUTDOWN, NULL, "the server is shutting down");
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
        hreq_respond_error(h, st, NULL, "%s", status ? "cannot render the response" : h->err.msg);
        return;
    }
    char *out = h->out;
    h->out = NULL;
    hreq_respond_json(h, 200, out, h->out_len);
}
