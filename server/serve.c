/* serve — `ferry serve`: HTTP (libmicrohttpd), routing, auth, CORS, access log, lifecycle (libuv).
 *
 * Threads: libmicrohttpd runs one thread per connection; a handler parses and validates its request,
 * hands it to the scheduler (sched.c, whose engine thread owns the engine) and blocks on the request's
 * condition variable, writing SSE chunks as tokens arrive or one JSON body at the end. The main thread
 * runs a libuv loop for signals (SIGTERM/SIGINT: stop accepting, drain within --shutdown-timeout, exit
 * 0), the drain timer and the background model load (the socket is bound first; /health says "loading").
 * A handler polls its socket while it waits, so a client that goes away cancels its sequences.
 */
#include "server/serve.h"

#include <errno.h>
#include <microhttpd.h>
#include <netdb.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>
#include <uv.h>

#include "kernels/core/log.h"
#include "kernels/core/status.h"
#include "runtime/chat_template.h"
#include "runtime/engine.h"
#include "runtime/tokenizer.h"
#include "runtime/tool_call.h"
#include "server/build_id.h"
#include "server/api.h"
#include "server/cli.h"
#include "server/dashboard.h"
#include "server/web_assets.h"
#include "server/metrics.h"
#include "server/options.h"
#include "server/scheduler.h"
#include "weights/model_file.h"

enum server_state { STATE_LOADING = 0, STATE_READY = 1, STATE_DRAINING = 2, STATE_FAILED = 3 };

struct server {
    struct serve_options opt;
    struct MHD_Daemon *mhd;
    uv_loop_t loop;
    uv_signal_t sig_term, sig_int;
    uv_async_t loaded;
    uv_timer_t drain_timer;
    uv_thread_t loader;
    int loader_started, loader_done, closing;
    pthread_mutex_t load_mu; /* orders the loader's final uv_async_send against abandoning it */
    int abandoned;           /* shutdown came during the load: the loader must not touch the loop */
    int state;               /* enum server_state, atomic */
    int was_ready;           /* the model finished loading (atomic) */
    struct model_file *mf;
    struct tokenizer *tok;
    struct engine *eng;
    struct sched *sched;
    struct api_ctx api;
    char *chat_template_text; /* --chat-template-file's contents, owned */
    double t_start;           /* sched_now() at start, for the dashboard's uptime */
    char model_name[256];
    struct metrics metrics;
    int active_gen;   /* completion requests between submit and completion (atomic) */
    uint64_t next_id; /* atomic */
    double drain_start;
    int drain_cut;
    int exit_code;
    char load_err[256];
    int load_rc;
};

struct hreq {
    struct server *S;
    struct MHD_Connection *conn;
    uint64_t id;
    char rid[72]; /* the client's X-Request-Id when it is sane, else our counter */
    double t0;
    char method[16];
    char path[128];
    struct strbuf body;
    int too_big;
    int status;        /* HTTP status sent, for the access log */
    struct sreq *req;  /* completion request, or NULL */
    int gen_counted;   /* counted in S->active_gen */
    struct strbuf sse; /* SSE bytes not yet handed to MHD */
    size_t sse_off;
    int sse_done;
    double t_last_out; /* when the stream last handed bytes to MHD */
    const char *note;  /* extra word for the access log */
};

static int load_state(struct server *S)
{
    return __atomic_load_n(&S->state, __ATOMIC_ACQUIRE);
}

/* ---- responses ------------------------------------------------------------------------------------ */

static const char *route_method(const char *path);

static void add_common_headers(struct hreq *h, struct MHD_Response *resp)
{
    MHD_add_response_header(resp, "X-Request-Id", h->rid);
    if (h->S->opt.cors_origin) {
        MHD_add_response_header(resp, "Access-Control-Allow-Origin", h->S->opt.cors_origin);
        if (strcmp(h->S->opt.cors_origin, "*")) MHD_add_response_header(resp, "Vary", "Origin");
    }
    if (load_state(h->S) == STATE_DRAINING)
        MHD_add_response_header(resp, MHD_HTTP_HEADER_CONNECTION, "close");
}

/* Queues a response whose body is taken over (freed by MHD). */
static enum MHD_Result respond(struct hreq *h, int http, const char *ctype, char *body, size_t len)
{
    struct MHD_Response *resp = MHD_create_response_from_buffer(
        len, body ? body : (char *)"", body ? MHD_RESPMEM_MUST_FREE : MHD_RESPMEM_PERSISTENT);
    if (!resp) {
        free(body);
        return MHD_NO;
    }
    if (ctype) MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, ctype);
    add_common_headers(h, resp);
    if (http == 503 || http == 429) MHD_add_response_header(resp, MHD_HTTP_HEADER_RETRY_AFTER, "1");
    if (http == 405) {
        const char *allow = !strcmp(route_method(h->path), "POST") ? "POST, OPTIONS" : "GET, OPTIONS";
        MHD_add_response_header(resp, MHD_HTTP_HEADER_ALLOW, allow);
    }
    h->status = http;
    enum MHD_Result r = MHD_queue_response(h->conn, (unsigned)http, resp);
    MHD_destroy_response(resp);
    return r;
}

static enum MHD_Result respond_json(struct hreq *h, int http, char *body, size_t len)
{
    if (!body) {
        static const char oom[] = "{\"error\":{\"message\":\"out of "
                                  "memory\",\"type\":\"server_error\",\"param\":null,\"code\":null}}";
        struct MHD_Response *resp =
            MHD_create_response_from_buffer(sizeof oom - 1, (void *)oom, MHD_RESPMEM_PERSISTENT);
        if (!resp) return MHD_NO;
        MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, "application/json");
        h->status = 500;
        enum MHD_Result r = MHD_queue_response(h->conn, 500, resp);
        MHD_destroy_response(resp);
        return r;
    }
    return respond(h, http, "application/json", body, len);
}

/* The one way errors leave the server: status → HTTP code through api_http_status(). */
static enum MHD_Result respond_error(struct hreq *h, int status, const char *param, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static enum MHD_Result respond_error(struct hreq *h, int status, const char *param, const char *fmt, ...)
{
    char msg[320];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    size_t len = 0;
    char *body = api_error_body(status, msg, param, &len);
    int http = api_http_status(status, NULL, NULL);
    if (http >= 500) FLOG_WARN("req %s: %d %s", h->rid, http, msg);
    return respond_json(h, http, body, len);
}

/* ---- connection helpers ------------------------------------------------------------------------------ */

/* 1 when the peer closed its side (or the socket broke) while we were generating. */
static int client_gone(struct hreq *h)
{
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(h->conn, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (!ci) return 0;
    struct pollfd p = {ci->connect_fd, POLLIN | POLLRDHUP, 0};
    if (poll(&p, 1, 0) <= 0) return 0;
    if (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) return 1;
    if (p.revents & POLLIN) {
        char c;
        ssize_t n = recv(ci->connect_fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
        if (n == 0) return 1;
    }
    return 0;
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

static int authorized(struct hreq *h)
{
    struct server *S = h->S;
    if (S->opt.n_api_keys == 0) return 1;
    if (S->opt.public_health && (!strcmp(h->path, "/health") || !strcmp(h->path, "/metrics"))) return 1;
    if (web_asset_find(h->path)) return 1; /* the page holds no data; what it fetches needs the key */
    const char *a = MHD_lookup_connection_value(h->conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
    if (!a) return 0;
    if (strncasecmp(a, "Bearer ", 7)) return 0;
    a += 7;
    while (*a == ' ') a++;
    return key_ok(S, a);
}

/* ---- completions ------------------------------------------------------------------------------------- */

static ssize_t stream_reader(void *cls, uint64_t pos, char *buf, size_t max)
{
    struct hreq *h = cls;
    struct server *S = h->S;
    for (;;) {
        if (h->sse_off < h->sse.len) {
            size_t n = h->sse.len - h->sse_off;
            if (n > max) n = max;
            memcpy(buf, h->sse.p + h->sse_off, n);
            h->sse_off += n;
            if (h->sse_off == h->sse.len) h->sse_off = h->sse.len = 0;
            h->t_last_out = sched_now();
            return (ssize_t)n;
        }
        if (h->sse_done) return MHD_CONTENT_READER_END_OF_STREAM;
        sched_lock(S->sched);
        api_render_stream(&S->api, h->req, &h->sse, &h->sse_done);
        if (h->sse.len == 0 && !h->sse_done) {
            sched_wait(S->sched, h->req, 200);
            api_render_stream(&S->api, h->req, &h->sse, &h->sse_done);
        }
        sched_unlock(S->sched);
        if (h->sse.oom) return MHD_CONTENT_READER_END_WITH_ERROR;
        if (h->sse.len == 0 && !h->sse_done) {
            if (client_gone(h)) {
                h->note = "client-gone";
                sched_cancel(S->sched, h->req, FERRY_ERR_CANCELLED);
                return MHD_CONTENT_READER_END_WITH_ERROR;
            }
            /* an SSE comment while nothing comes (queued, long prefill): the connection's idle timeout
             * measures the client, and a stream that says nothing for that long would be cut */
            double ping = S->opt.conn_timeout / 2.0 < 10 ? S->opt.conn_timeout / 2.0 : 10;
            if (sched_now() - h->t_last_out >= ping) strbuf_add(&h->sse, ": ping\n\n", 8);
        }
    }
}

static enum MHD_Result handle_completion(struct hreq *h, enum sreq_kind kind)
{
    struct server *S = h->S;
    struct api_err e;
    struct sreq *r = NULL;
    if (api_parse_request(&S->api, kind, h->body.p ? h->body.p : "", h->body.len, &r, &e))
        return respond_error(h, e.status, e.param, "%s", e.msg);
    int rc = sched_submit(S->sched, r);
    if (rc) {
        sched_release(S->sched, r);
        if (rc == FERRY_ERR_BUSY) {
            pthread_mutex_lock(&S->metrics.mu);
            S->metrics.requests_rejected++;
            pthread_mutex_unlock(&S->metrics.mu);
            return respond_error(h, rc, NULL, "the server is busy: the queue is full; retry later");
        }
        if (rc == FERRY_ERR_RANGE)
            return respond_error(
                h, rc, "n", "the request has more sequences (prompts × n) than --parallel + --max-queue");
        if (rc == FERRY_ERR_DEVICE_MEM)
            return respond_error(
                h, FERRY_ERR_RANGE, "max_tokens",
                "prompt + max_tokens needs more KV cache than the server's whole pool (--kv-tokens)");
        return respond_error(h, SERVE_ERR_SHUTDOWN, NULL, "the server is shutting down");
    }
    h->req = r;
    h->gen_counted = 1;
    h->t_last_out = sched_now();
    __atomic_add_fetch(&S->active_gen, 1, __ATOMIC_ACQ_REL);
    if (r->stream) {
        struct MHD_Response *resp =
            MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384, stream_reader, h, NULL);
        if (!resp) return MHD_NO;
        MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, "text/event-stream");
        MHD_add_response_header(resp, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
        MHD_add_response_header(resp, "X-Accel-Buffering", "no");
        add_common_headers(h, resp);
        h->status = 200;
        enum MHD_Result ret = MHD_queue_response(h->conn, MHD_HTTP_OK, resp);
        MHD_destroy_response(resp);
        return ret;
    }
    /* a non-streamed answer may take longer than the idle timeout: suspend it until the body is queued */
    MHD_set_connection_option(h->conn, MHD_CONNECTION_OPTION_TIMEOUT, 0u);
    sched_lock(S->sched);
    while (r->n_done < r->n_choices) {
        sched_wait(S->sched, r, 200);
        if (r->n_done < r->n_choices) {
            sched_unlock(S->sched);
            if (client_gone(h)) {
                h->note = "client-gone";
                sched_cancel(S->sched, r, FERRY_ERR_CANCELLED);
            }
            sched_lock(S->sched);
        }
    }
    int st = r->error ? r->error : r->cancelled;
    char msg[200];
    snprintf(msg, sizeof msg, "%s",
             r->error                  ? r->errmsg
             : st == FERRY_ERR_TIMEOUT ? "the request timed out"
                                       : "the request was cancelled");
    size_t len = 0;
    char *body = st ? NULL : api_render_full(&S->api, r, &len);
    sched_unlock(S->sched);
    MHD_set_connection_option(h->conn, MHD_CONNECTION_OPTION_TIMEOUT, (unsigned)S->opt.conn_timeout);
    if (st) return respond_error(h, st, NULL, "%s", msg);
    return respond_json(h, 200, body, len);
}

/* ---- routing ------------------------------------------------------------------------------------------ */

enum route {
    R_NONE,
    R_HEALTH,
    R_METRICS,
    R_MODELS,
    R_MODEL,
    R_COMPLETIONS,
    R_CHAT,
    R_RESPONSES,
    R_EMBEDDINGS,
    R_WEB,
    R_STATUS,
    R_TOKENIZE,
    R_DETOKENIZE
};

static enum route match(const char *path, const char **method_needed)
{
    static const struct {
        const char *path;
        enum route r;
        const char *method;
    } table[] = {
        {"/health", R_HEALTH, "GET"},
        {"/metrics", R_METRICS, "GET"},
        {"/v1/models", R_MODELS, "GET"},
        {"/v1/completions", R_COMPLETIONS, "POST"},
        {"/v1/chat/completions", R_CHAT, "POST"},
        /* the paths without /v1 that llama-server also answers */
        {"/models", R_MODELS, "GET"},
        {"/completions", R_COMPLETIONS, "POST"},
        {"/chat/completions", R_CHAT, "POST"},
        {"/v1/responses", R_RESPONSES, "POST"},
        {"/v1/embeddings", R_EMBEDDINGS, "POST"},
        {"/", R_WEB, "GET"},
        {"/index.html", R_WEB, "GET"},
        {"/status", R_STATUS, "GET"},
        {"/embeddings", R_EMBEDDINGS, "POST"},
        {"/tokenize", R_TOKENIZE, "POST"},
        {"/detokenize", R_DETOKENIZE, "POST"},
    };
    for (size_t i = 0; i < sizeof table / sizeof table[0]; i++)
        if (!strcmp(path, table[i].path)) {
            *method_needed = table[i].method;
            return table[i].r;
        }
    if (!strncmp(path, "/v1/models/", 11) && path[11]) {
        *method_needed = "GET";
        return R_MODEL;
    }
    return R_NONE;
}

/* The method a path takes (GET when it is no route). */
static const char *route_method(const char *path)
{
    const char *need = "GET";
    match(path, &need);
    return need;
}

static enum MHD_Result route(struct hreq *h)
{
    struct server *S = h->S;
    if (!strcmp(h->method, "OPTIONS")) {
        struct MHD_Response *resp = MHD_create_response_from_buffer(0, (char *)"", MHD_RESPMEM_PERSISTENT);
        add_common_headers(h, resp);
        MHD_add_response_header(resp, MHD_HTTP_HEADER_ALLOW, "GET, POST, OPTIONS");
        if (S->opt.cors_origin) {
            MHD_add_response_header(resp, "Access-Control-Allow-Methods", "GET, POST, OPTIONS");
            MHD_add_response_header(resp, "Access-Control-Allow-Headers", "Authorization, Content-Type");
            MHD_add_response_header(resp, "Access-Control-Max-Age", "600");
        }
        h->status = 204;
        enum MHD_Result r = MHD_queue_response(h->conn, 204, resp);
        MHD_destroy_response(resp);
        return r;
    }
    if (!authorized(h))
        return respond_error(h, SERVE_ERR_UNAUTHORIZED, NULL,
                             "a valid API key is required (Authorization: Bearer KEY)");
    const char *need = NULL;
    enum route rt = match(h->path, &need);
    if (rt == R_NONE)
        return respond_error(h, SERVE_ERR_NO_ROUTE, NULL, "no route %s %.100s", h->method, h->path);
    int head = !strcmp(h->method, "HEAD") && !strcmp(need, "GET");
    if (strcmp(h->method, need) && !head)
        return respond_error(h, SERVE_ERR_METHOD, NULL, "%s is not allowed on %s (use %s)", h->method,
                             h->path, need);
    if (h->too_big)
        return respond_error(h, SERVE_ERR_TOO_LARGE, NULL,
                             "the request body is larger than the limit of %lld bytes",
                             (long long)S->opt.body_limit);
    int state = load_state(S);
    if (rt == R_HEALTH) {
        const char *st = state == STATE_READY      ? "ok"
                         : state == STATE_LOADING  ? "loading"
                         : state == STATE_DRAINING ? "shutting_down"
                                                   : "error";
        char *b = NULL;
        if (asprintf(&b, "{\"status\":\"%s\"}", st) < 0) b = NULL;
        return respond_json(h, state == STATE_READY ? 200 : 503, b, b ? strlen(b) : 0);
    }
    if (rt == R_METRICS) {
        size_t len = 0;
        char *b = metrics_render(&S->metrics, &len);
        if (!b) return respond_error(h, FERRY_ERR_NOMEM, NULL, "out of memory");
        return respond(h, 200, "text/plain; version=0.0.4; charset=utf-8", b, len);
    }
    if (rt == R_WEB) {
        const struct web_asset *w = web_asset_find(h->path);
        struct MHD_Response *resp =
            MHD_create_response_from_buffer(w->len, (void *)w->data, MHD_RESPMEM_PERSISTENT);
        if (!resp) return MHD_NO;
        MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, w->content_type);
        MHD_add_response_header(resp, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
        add_common_headers(h, resp);
        h->status = 200;
        enum MHD_Result r = MHD_queue_response(h->conn, MHD_HTTP_OK, resp);
        MHD_destroy_response(resp);
        return r;
    }
    if (!__atomic_load_n(&S->was_ready, __ATOMIC_ACQUIRE))
        return respond_error(h, SERVE_ERR_LOADING, NULL, "the model is still loading; retry shortly");
    if (rt == R_STATUS) {
        struct engine_stats st;
        engine_get_stats(S->eng, &st);
        struct dashboard_ctx d = {S->model_name, S->api.fingerprint, st.backend, engine_placement(S->eng),
                                  engine_hparams(S->eng)->n_layers, S->opt.parallel, S->api.ctx_size, S->t_start,
                                  &S->metrics, S->sched};
        size_t len = 0;
        char *b = dashboard_json(&d, &len);
        return respond_json(h, 200, b, len);
    }
    if (rt == R_MODELS || rt == R_MODEL) {
        if (rt == R_MODEL && strcmp(h->path + 11, S->api.model_name))
            return respond_error(h, FERRY_ERR_NOT_FOUND, "model", "The model '%.100s' does not exist",
                                 h->path + 11);
        size_t len = 0;
        char *b = api_models_body(&S->api, rt == R_MODEL ? h->path + 11 : NULL, &len);
        return respond_json(h, 200, b, len);
    }
    if (rt == R_TOKENIZE || rt == R_DETOKENIZE) {
        struct api_err e;
        char *out = NULL;
        size_t len = 0;
        int rc = rt == R_TOKENIZE
                     ? api_tokenize(&S->api, h->body.p ? h->body.p : "", h->body.len, &out, &len, &e)
                     : api_detokenize(&S->api, h->body.p ? h->body.p : "", h->body.len, &out, &len, &e);
        if (rc)
            return respond_error(h, e.status ? e.status : rc, e.param, "%s",
                                 e.msg[0] ? e.msg : ferry_status_str(rc));
        return respond_json(h, 200, out, len);
    }
    if (state != STATE_READY)
        return respond_error(h, SERVE_ERR_SHUTDOWN, NULL, "the server is shutting down");
    return handle_completion(h, rt == R_CHAT        ? SREQ_CHAT
                                : rt == R_RESPONSES ? SREQ_RESPONSES
                                : rt == R_EMBEDDINGS ? SREQ_EMBED
                                                     : SREQ_COMPLETION);
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url, const char *method,
                                  const char *version, const char *upload_data, size_t *upload_data_size,
                                  void **con_cls)
{
    struct server *S = cls;
    struct hreq *h = *con_cls;
    if (!h) {
        h = calloc(1, sizeof *h);
        if (!h) return MHD_NO;
        h->S = S;
        h->conn = conn;
        h->id = __atomic_add_fetch(&S->next_id, 1, __ATOMIC_RELAXED);
        h->t0 = sched_now();
        snprintf(h->method, sizeof h->method, "%s", method);
        snprintf(h->path, sizeof h->path, "%s", url);
        const char *rid = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "X-Request-Id");
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
        *con_cls = h;
        const char *cl = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
        if (cl) {
            unsigned long long n = strtoull(cl, NULL, 10);
            if (n > (unsigned long long)S->opt.body_limit) h->too_big = 1;
            /* far too large to drain politely: answer now, MHD closes the connection after */
            if (n > (unsigned long long)S->opt.body_limit * 16)
                return respond_error(h, SERVE_ERR_TOO_LARGE, NULL,
                                     "the request body is larger than the limit of %lld bytes",
                                     (long long)S->opt.body_limit);
        }
        return MHD_YES;
    }
    if (*upload_data_size) {
        if (!h->too_big) {
            if (h->body.len + *upload_data_size > (size_t)S->opt.body_limit) {
                h->too_big = 1;
                strbuf_free(&h->body);
            } else {
                strbuf_add(&h->body, upload_data, *upload_data_size);
                if (h->body.oom) return MHD_NO;
            }
        }
        *upload_data_size = 0;
        return MHD_YES;
    }
    if (h->status) return MHD_YES; /* already answered (early 413) */
    return route(h);
}

static void on_completed(void *cls, struct MHD_Connection *conn, void **con_cls,
                         enum MHD_RequestTerminationCode toe)
{
    struct server *S = cls;
    struct hreq *h = *con_cls;
    if (!h) return;
    *con_cls = NULL;
    if (h->req) {
        sched_cancel(S->sched, h->req, FERRY_ERR_CANCELLED); /* no-op when it finished */
        sched_release(S->sched, h->req);
    }
    if (h->gen_counted) __atomic_sub_fetch(&S->active_gen, 1, __ATOMIC_ACQ_REL);
    if (toe != MHD_REQUEST_TERMINATED_COMPLETED_OK && !h->note) h->note = "connection-error";
    int status = h->status ? h->status : 499; /* never answered: the client went away */
    FLOG_INFO("access req=%s %s %s %d %.1fms%s%s", h->rid, h->method, h->path, status,
              (sched_now() - h->t0) * 1e3, h->note ? " " : "", h->note ? h->note : "");
    metrics_count_status(&S->metrics, status);
    strbuf_free(&h->body);
    strbuf_free(&h->sse);
    free(h);
}

static void mhd_log(void *cls, const char *fmt, va_list ap)
{
    char msg[512];
    vsnprintf(msg, sizeof msg, fmt, ap);
    size_t n = strlen(msg);
    while (n && (msg[n - 1] == '\n' || msg[n - 1] == '\r')) msg[--n] = 0;
    FLOG_DEBUG("http: %s", msg);
}

/* ---- lifecycle ---------------------------------------------------------------------------------------- */

static void loader_main(void *arg)
{
    struct server *S = arg;
    char err[256] = "";
    int rc = model_file_open(S->opt.model, &S->mf, NULL, NULL, err);
    if (rc) {
        snprintf(S->load_err, sizeof S->load_err, "cannot open model %s: %.180s (%s)", S->opt.model, err,
                 ferry_status_str(rc));
        goto done;
    }
    rc = tokenizer_init(&S->tok, S->mf, err);
    if (rc) {
        snprintf(S->load_err, sizeof S->load_err, "cannot load the tokenizer: %.200s (%s)", err,
                 ferry_status_str(rc));
        goto done;
    }
    struct engine_params ep = engine_default_params();
    ep.n_threads = S->opt.threads;
    ep.ctx_size = S->opt.ctx_size;
    ep.n_seqs = S->opt.parallel;
    ep.max_batch_tokens =
        S->opt.max_batch_tokens < S->opt.parallel ? S->opt.parallel : S->opt.max_batch_tokens;
    ep.deterministic = S->opt.deterministic;
    ep.quant = (enum engine_quant)engine_quant_parse(S->opt.quant); /* options.c allows only known names */
    ep.kv_tokens = S->opt.kv_tokens;
    ep.backend = !strcmp(S->opt.backend, "cpu")    ? ENGINE_BACKEND_CPU
                 : !strcmp(S->opt.backend, "cuda") ? ENGINE_BACKEND_CUDA
                                                   : ENGINE_BACKEND_AUTO;
    ep.gpu_memory = S->opt.gpu_memory;
    ep.reserve_vram = S->opt.reserve_vram;
    ep.gpu_layers = S->opt.gpu_layers;
    ep.placement = !strcmp(S->opt.placement, "stream") ? ENGINE_PLACEMENT_STREAM
                   : !strcmp(S->opt.placement, "cpu")  ? ENGINE_PLACEMENT_CPU
                                                       : ENGINE_PLACEMENT_AUTO;
    ep.cpu_threads = S->opt.cpu_threads;
    rc = engine_init(&S->eng, S->mf, &ep, err);
    if (rc) {
        snprintf(S->load_err, sizeof S->load_err, "cannot start the engine: %.200s (%s)", err,
                 ferry_status_str(rc));
        goto done;
    }
    const char *tmpl = NULL;
    if (S->chat_template_text)
        tmpl = S->chat_template_text;
    else if (S->opt.chat_template)
        tmpl = chat_template_builtin(S->opt.chat_template);
    else if (S->mf->chat_template)
        tmpl = S->mf->chat_template;
    else {
        tmpl = chat_template_builtin("chatml");
        FLOG_WARN("the model has no chat template: /v1/chat/completions uses the builtin 'chatml'");
    }
    if (!tmpl) {
        rc = FERRY_ERR_NOT_FOUND;
        snprintf(S->load_err, sizeof S->load_err, "no chat template available (--chat-template %s)",
                 S->opt.chat_template ? S->opt.chat_template : "chatml");
        goto done;
    }
    struct api_ctx *a = &S->api;
    a->tok = S->tok;
    a->model_name = S->model_name;
    a->any_model = S->opt.any_model;
    a->chat_tmpl = tmpl;
    int32_t bos = tokenizer_bos(S->tok), eos = tokenizer_eos(S->tok);
    a->bos_str = bos >= 0 ? tokenizer_token_str(S->tok, bos) : "";
    a->eos_str = eos >= 0 ? tokenizer_token_str(S->tok, eos) : "";
    a->ctx_size = engine_ctx_size(S->eng);
    int nv = engine_hparams(S->eng)->n_vocab, tv = tokenizer_n_vocab(S->tok);
    a->n_vocab = nv < tv ? nv : tv;
    a->default_seed = S->opt.seed;
    a->timeout = S->opt.timeout;
    a->tool_format = tool_format_of(tmpl);
    a->reasoning = strcmp(S->opt.reasoning_format, "none") != 0;
    a->fingerprint = "fp_" FERRY_BUILD_ID;
    a->embd_dim = engine_hparams(S->eng)->dim;
    a->pooling = !strcmp(S->opt.pooling, "last");
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    int st = S->opt.threads > 0 ? S->opt.threads : cores > 0 ? (int)cores : 1;
    struct sched_params sp = {S->opt.max_queue, ep.max_batch_tokens, st > 8 ? 8 : st, S->opt.prompt_cache};
    rc = sched_init(&S->sched, S->eng, S->tok, &S->metrics, &sp);
    if (!rc) rc = sched_start(S->sched);
    if (rc) snprintf(S->load_err, sizeof S->load_err, "cannot start the scheduler: %s", ferry_status_str(rc));
done:
    S->load_rc = rc;
    pthread_mutex_lock(&S->load_mu);
    if (!S->abandoned) uv_async_send(&S->loaded);
    pthread_mutex_unlock(&S->load_mu);
}

/* Closes the loop's handles so uv_run returns; the async handle stays open until the loader has sent. */
static void close_all(struct server *S)
{
    S->closing = 1;
    uv_handle_t *hs[] = {(uv_handle_t *)&S->sig_term, (uv_handle_t *)&S->sig_int,
                         (uv_handle_t *)&S->drain_timer};
    for (int i = 0; i < 3; i++)
        if (!uv_is_closing(hs[i])) uv_close(hs[i], NULL);
    if (S->loader_started && !S->loader_done) {
        /* a load cannot be interrupted (a slow disk, a huge file): leave it behind, the process exits */
        pthread_mutex_lock(&S->load_mu);
        S->abandoned = 1;
        pthread_mutex_unlock(&S->load_mu);
    }
    if (!uv_is_closing((uv_handle_t *)&S->loaded)) uv_close((uv_handle_t *)&S->loaded, NULL);
}

static void on_loaded(uv_async_t *a)
{
    struct server *S = a->data;
    S->loader_done = 1;
    if (S->load_rc) {
        FLOG_ERROR("%s", S->load_err);
        __atomic_store_n(&S->state, STATE_FAILED, __ATOMIC_RELEASE);
        S->exit_code = 1;
        close_all(S);
        return;
    }
    pthread_mutex_lock(&S->metrics.mu);
    S->metrics.loading = 0;
    pthread_mutex_unlock(&S->metrics.mu);
    __atomic_store_n(&S->was_ready, 1, __ATOMIC_RELEASE);
    int expected = STATE_LOADING;
    __atomic_compare_exchange_n(&S->state, &expected, STATE_READY, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE);
    if (S->closing) {
        close_all(S);
        return;
    }
    FLOG_INFO("model ready: %s (ctx %d, %d slots, max batch %d tokens, vocab %d)", S->model_name,
              S->api.ctx_size, S->opt.parallel, S->opt.max_batch_tokens, S->api.n_vocab);
}

static void on_drain_tick(uv_timer_t *t)
{
    struct server *S = t->data;
    int active = __atomic_load_n(&S->active_gen, __ATOMIC_ACQUIRE);
    double waited = sched_now() - S->drain_start;
    if (active == 0) {
        FLOG_INFO("drained in %.2fs", waited);
        close_all(S);
        return;
    }
    if (!S->drain_cut && waited >= S->opt.shutdown_timeout) {
        FLOG_WARN("shutdown timeout (%ds): cutting %d in-flight request(s)", S->opt.shutdown_timeout, active);
        if (S->loader_done && S->sched) sched_cancel_all(S->sched, FERRY_ERR_CANCELLED);
        S->drain_cut = 1;
    }
    if (waited >= S->opt.shutdown_timeout + 5.0) {
        FLOG_WARN("giving up on %d request(s) after the shutdown timeout", active);
        close_all(S);
    }
}

static void on_signal(uv_signal_t *sig, int signum)
{
    struct server *S = sig->data;
    int st = load_state(S);
    if (st == STATE_DRAINING) {
        FLOG_WARN("second signal: cutting in-flight requests now");
        S->drain_start = sched_now() - S->opt.shutdown_timeout;
        return;
    }
    FLOG_INFO("%s: draining (up to %ds), no new connections", signum == SIGTERM ? "SIGTERM" : "SIGINT",
              S->opt.shutdown_timeout);
    __atomic_store_n(&S->state, STATE_DRAINING, __ATOMIC_RELEASE);
    S->drain_start = sched_now();
    MHD_socket lfd = MHD_quiesce_daemon(S->mhd);
    if (lfd != MHD_INVALID_SOCKET) close(lfd);
    uv_timer_start(&S->drain_timer, on_drain_tick, 0, 50);
}

static struct MHD_Daemon *start_http(struct server *S, char err[256])
{
    struct addrinfo hints = {0}, *ai = NULL;
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
    char port[16];
    snprintf(port, sizeof port, "%d", S->opt.port);
    int g = getaddrinfo(S->opt.host, port, &hints, &ai);
    if (g) {
        snprintf(err, 256, "--host %s: %s", S->opt.host, gai_strerror(g));
        return NULL;
    }
    unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_THREAD_PER_CONNECTION | MHD_USE_POLL |
                     MHD_USE_ERROR_LOG | MHD_USE_ITC; /* poll: no FD_SETSIZE limit */
    if (ai->ai_family == AF_INET6) flags |= MHD_USE_IPv6;
    struct MHD_Daemon *d = MHD_start_daemon(
        flags, (uint16_t)S->opt.port, NULL, NULL, on_request, S, MHD_OPTION_NOTIFY_COMPLETED, on_completed, S,
        MHD_OPTION_SOCK_ADDR, ai->ai_addr, MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)S->opt.conn_timeout,
        MHD_OPTION_CONNECTION_LIMIT, (unsigned)S->opt.max_connections, MHD_OPTION_EXTERNAL_LOGGER, mhd_log, S,
        MHD_OPTION_END);
    freeaddrinfo(ai);
    if (!d)
        snprintf(err, 256, "cannot listen on %s:%d (address in use or not available)", S->opt.host,
                 S->opt.port);
    return d;
}

/* --chat-template-file: the whole file, NUL-terminated (at most 1 MiB), or NULL. */
static char *read_template_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    char *buf = malloc((1 << 20) + 1);
    size_t n = buf ? fread(buf, 1, (size_t)1 << 20, f) : 0;
    int more = buf && fgetc(f) != EOF;
    fclose(f);
    if (!buf || more || n == 0) {
        free(buf);
        return NULL;
    }
    buf[n] = 0;
    return buf;
}

int serve_main(int argc, char **argv)
{
    struct server *S = calloc(1, sizeof *S);
    if (!S) return 1;
    char err[256] = "";
    int ret = 1;
    S->opt = serve_options_default();
    if (serve_options_parse(&S->opt, argc, argv, err)) {
        fprintf(stderr, "ferry serve: %s\n", err);
        goto out_free;
    }
    if (S->opt.help) {
        serve_options_help(stdout);
        ret = 0;
        goto out_free;
    }
    cli_log_init((enum log_level)cli_log_level_parse(S->opt.log_level));
    if (!S->opt.model) {
        fprintf(stderr, "ferry serve: --model PATH (or FERRY_MODEL) is required; see --help\n");
        goto out_free;
    }
    if (serve_options_load_key_file(&S->opt, err)) {
        fprintf(stderr, "ferry serve: %s\n", err);
        goto out_free;
    }
    if (S->opt.chat_template_file && !(S->chat_template_text = read_template_file(S->opt.chat_template_file))) {
        fprintf(stderr, "ferry serve: cannot read --chat-template-file %s (missing, unreadable or over 1 MiB)\n",
                S->opt.chat_template_file);
        goto out_free;
    }
    if (S->opt.chat_template && !chat_template_builtin(S->opt.chat_template)) {
        fprintf(stderr, "ferry serve: --chat-template %s is not a builtin template\n", S->opt.chat_template);
        goto out_free;
    }
    if (S->opt.served_model_name) {
        snprintf(S->model_name, sizeof S->model_name, "%s", S->opt.served_model_name);
    } else {
        const char *p = S->opt.model;
        size_t n = strlen(p);
        while (n > 1 && p[n - 1] == '/') n--;
        size_t b = n;
        while (b > 0 && p[b - 1] != '/') b--;
        snprintf(S->model_name, sizeof S->model_name, "%.*s", (int)(n - b), p + b);
    }
    signal(SIGPIPE, SIG_IGN);
    S->t_start = sched_now();
    pthread_mutex_init(&S->load_mu, NULL);
    metrics_init(&S->metrics);
    S->state = STATE_LOADING;

    S->mhd = start_http(S, err);
    if (!S->mhd) {
        FLOG_ERROR("%s", err);
        metrics_free(&S->metrics);
        goto out_free;
    }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(S->mhd, MHD_DAEMON_INFO_BIND_PORT);
    FLOG_INFO("listening on http://%s:%u (model %s loading in the background)", S->opt.host,
              di ? (unsigned)di->port : (unsigned)S->opt.port, S->model_name);

    uv_loop_init(&S->loop);
    uv_async_init(&S->loop, &S->loaded, on_loaded);
    S->loaded.data = S;
    uv_signal_init(&S->loop, &S->sig_term);
    uv_signal_init(&S->loop, &S->sig_int);
    S->sig_term.data = S->sig_int.data = S;
    uv_signal_start(&S->sig_term, on_signal, SIGTERM);
    uv_signal_start(&S->sig_int, on_signal, SIGINT);
    uv_timer_init(&S->loop, &S->drain_timer);
    S->drain_timer.data = S;
    if (uv_thread_create(&S->loader, loader_main, S)) {
        FLOG_ERROR("cannot start the loader thread");
        S->exit_code = 1;
        close_all(S);
    } else {
        S->loader_started = 1;
    }
    uv_run(&S->loop, UV_RUN_DEFAULT);
    uv_loop_close(&S->loop);

    /* in dependency order, reversed: no new requests, then the engine thread, then what it used */
    if (S->abandoned) {
        MHD_stop_daemon(S->mhd);
        FLOG_WARN("shut down while the model was loading; not waiting for the load");
        ret = S->exit_code;
        FLOG_INFO("ferry serve: exit %d", ret);
        return ret; /* S stays allocated: the loader thread still uses it until the process exits */
    }
    if (S->drain_cut == 0 && S->sched) sched_cancel_all(S->sched, FERRY_ERR_CANCELLED);
    MHD_stop_daemon(S->mhd);
    if (S->loader_started) uv_thread_join(&S->loader);
    sched_free(S->sched);
    engine_free(S->eng);
    tokenizer_free(S->tok);
    model_file_close(S->mf);
    metrics_free(&S->metrics);
    ret = S->exit_code;
    FLOG_INFO("ferry serve: exit %d", ret);
out_free:
    free(S->chat_template_text);
    serve_options_free(&S->opt);
    free(S);
    return ret;
}
