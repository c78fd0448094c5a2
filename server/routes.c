/* routes — what `ferry serve` does with each request: the route table, the checks before the body (Host,
 * auth, method, Content-Type, the model's state), the GET answers and the answers themselves; a completion's
 * life (parse on the worker pool, the scheduler, the stream or the whole answer, the access log) is
 * routes_gen.c, and what both share is routes_impl.h.
 *
 * Parsing a request (JSON, chat template, tokenizer) and rendering a whole answer run on libuv's worker pool,
 * so a large body never stalls the loop. The scheduler's engine thread reports progress through the request's
 * wake hook: it queues the request on a list and wakes the loop, which writes the new SSE chunks (as fast as
 * the client reads them) or, once every choice is done, the whole answer. A client that goes away ends its
 * request at once (http.c sees the close) and cancels its sequences. Every error leaves through
 * hreq_respond_error. Loop thread, except the worker functions; server/serve.c installs the handlers
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
#include "server/routes_impl.h"
#include "server/scheduler.h"
#include "server/serve_impl.h"
#include "server/web_assets.h"
#include "server/model_names.h"

/* A GET route answers on the loop; a POST route's `parse` runs on the worker pool with the body (copied in
 * h->body): it fills h->out (answered as JSON) or h->req (a completion, then submitted), or returns an error
 * status with h->err. Adding a route is a row of the table below and its handler. */
enum { DIALECT_OPENAI, DIALECT_ANTHROPIC }; /* the shape of a route's errors */

struct route {
    const char *path;
    const char *method; /* GET routes also answer HEAD */
    int prefix;         /* the path is a prefix: "/v1/models/" + an id */
    int needs_model;    /* 503 while the model loads */
    void (*get)(struct hreq *h, const char *path);
    int (*parse)(struct hreq *h);
    int dialect;
};

/* ---- responses ---- */

/* Queues a response whose body is taken over. */
void hreq_respond(struct hreq *h, int http, const char *ctype, char *body, size_t len)
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

void hreq_respond_json(struct hreq *h, int http, char *body, size_t len)
{
    if (!body) {
        h->status = 503;
        http_req_refuse_nomem(h->q);
        return;
    }
    hreq_respond(h, http, "application/json", body, len);
}

/* The one way errors leave the server: status → HTTP code through api_http_status(). */
void hreq_respond_error(struct hreq *h, int status, const char *param, const char *fmt, ...)
{
    char msg[320];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    size_t len = 0;
    api_oom_reset();
    char *body = h->rt && h->rt->dialect == DIALECT_ANTHROPIC ? api_anthropic_error_body(status, msg, &len)
                                                              : api_error_body(status, msg, param, &len);
    if (api_oom_seen()) { /* a partial error object is no error object */
        free(body);
        body = NULL;
    }
    int http = api_http_status(status, NULL, NULL);
    if (http >= 500) FLOG_WARN("req %s: %d %s", h->rid, http, msg);
    hreq_respond_json(h, http, body, len);
}

/* ---- the routes ---- */

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
    hreq_respond_json(h, state == STATE_READY ? 200 : 503, b, b ? strlen(b) : 0);
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
        hreq_respond_error(h, FERRY_ERR_NOMEM, NULL, "out of memory");
        return;
    }
    hreq_respond(h, 200, "text/plain; version=0.0.4; charset=utf-8", b, len);
}

static void get_models(struct hreq *h, const char *path)
{
    struct server *S = h->S;
    const char *id = !strncmp(path, "/v1/models/", 11) ? path + 11 : NULL;
    if (id && !model_names_match(S->api.model_name, S->api.model_aliases, id)) {
        char safe[128];
        hreq_respond_error(h, FERRY_ERR_NOT_FOUND, "model", "The model '%s' does not exist",
                           ferry_log_safe(id, safe, sizeof safe));
        return;
    }
    size_t len = 0;
    api_oom_reset();
    char *b = api_models_body(&S->api, id, &len);
    if (api_oom_seen()) {
        free(b);
        b = NULL;
    }
    hreq_respond_json(h, 200, b, len);
}

/* The web page (server/web): public, it holds no data; what it fetches needs the key like every client. */
static void get_web(struct hreq *h, const char *path)
{
    const struct web_asset *w = web_asset_find(path);
    char *b = malloc(w->len + 1);
    if (!b) {
        hreq_respond_error(h, FERRY_ERR_NOMEM, NULL, "out of memory");
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
                              S->sched,
                              h->client};
    size_t len = 0;
    api_oom_reset();
    char *b = dashboard_json(&d, &len);
    if (api_oom_seen()) {
        free(b);
        b = NULL;
    }
    hreq_respond_json(h, 200, b, len);
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

static int parse_messages(struct hreq *h)
{
    return api_parse_request(&h->S->api, SREQ_ANTHROPIC, h->body, h->body_len, &h->req, &h->err);
}

static int parse_count_tokens(struct hreq *h)
{
    return api_anthropic_count_tokens(&h->S->api, h->body, h->body_len, &h->out, &h->out_len, &h->err);
}

static int parse_llama_completion(struct hreq *h)
{
    return api_parse_llama(&h->S->api, 0, h->body, h->body_len, &h->req, &h->err);
}

static int parse_infill(struct hreq *h)
{
    return api_parse_llama(&h->S->api, 1, h->body, h->body_len, &h->req, &h->err);
}

static int parse_input_tokens(struct hreq *h)
{
    return api_chat_input_tokens(&h->S->api, h->body, h->body_len, &h->out, &h->out_len, &h->err);
}

/* GET /props and GET /slots: llama-server's views of the server and of its slots. */
static void get_llama(struct hreq *h, const char *path)
{
    struct server *S = h->S;
    struct api_llama_info info = {S->opt.parallel, S->opt.model};
    size_t len = 0;
    char *b = NULL;
    api_oom_reset();
    if (!strcmp(path, "/props")) {
        b = api_llama_props(&S->api, &info, &len);
    } else {
        struct sched_seq seqs[256];
        int n = sched_describe(S->sched, seqs, 256);
        b = api_llama_slots(&S->api, &info, seqs, n < 256 ? n : 256, &len);
    }
    if (api_oom_seen()) {
        free(b);
        b = NULL;
    }
    hreq_respond_json(h, 200, b, len);
}

static int parse_apply_template(struct hreq *h)
{
    return api_apply_template(&h->S->api, h->body, h->body_len, &h->out, &h->out_len, &h->err);
}

static const struct route routes[] = {
    {"/health", "GET", 0, 0, get_health, NULL, DIALECT_OPENAI},
    {"/metrics", "GET", 0, 0, get_metrics, NULL, DIALECT_OPENAI},
    {"/v1/models", "GET", 0, 1, get_models, NULL, DIALECT_OPENAI},
    {"/v1/models/", "GET", 1, 1, get_models, NULL, DIALECT_OPENAI},
    {"/v1/completions", "POST", 0, 1, NULL, parse_completion, DIALECT_OPENAI},
    {"/v1/chat/completions", "POST", 0, 1, NULL, parse_chat, DIALECT_OPENAI},
    {"/v1/responses", "POST", 0, 1, NULL, parse_responses, DIALECT_OPENAI},
    {"/v1/embeddings", "POST", 0, 1, NULL, parse_embeddings, DIALECT_OPENAI},
    /* Anthropic's Messages API */
    {"/v1/messages", "POST", 0, 1, NULL, parse_messages, DIALECT_ANTHROPIC},
    {"/v1/messages/count_tokens", "POST", 0, 1, NULL, parse_count_tokens, DIALECT_ANTHROPIC},
    /* the paths without /v1 that llama-server also answers */
    {"/models", "GET", 0, 1, get_models, NULL, DIALECT_OPENAI},
    {"/completions", "POST", 0, 1, NULL, parse_completion, DIALECT_OPENAI},
    {"/chat/completions", "POST", 0, 1, NULL, parse_chat, DIALECT_OPENAI},
    {"/responses", "POST", 0, 1, NULL, parse_responses, DIALECT_OPENAI},
    {"/embeddings", "POST", 0, 1, NULL, parse_embeddings, DIALECT_OPENAI},
    {"/tokenize", "POST", 0, 1, NULL, parse_tokenize, DIALECT_OPENAI},
    {"/detokenize", "POST", 0, 1, NULL, parse_detokenize, DIALECT_OPENAI},
    {"/completion", "POST", 0, 1, NULL, parse_llama_completion, DIALECT_OPENAI},
    {"/infill", "POST", 0, 1, NULL, parse_infill, DIALECT_OPENAI},
    {"/props", "GET", 0, 1, get_llama, NULL, DIALECT_OPENAI},
    {"/chat/completions/input_tokens", "POST", 0, 1, NULL, parse_input_tokens, DIALECT_OPENAI},
    {"/v1/chat/completions/input_tokens", "POST", 0, 1, NULL, parse_input_tokens, DIALECT_OPENAI},
    {"/slots", "GET", 0, 1, get_llama, NULL, DIALECT_OPENAI},
    {"/apply-template", "POST", 0, 1, NULL, parse_apply_template, DIALECT_OPENAI},
    /* the web page and its live view */
    {"/", "GET", 0, 0, get_web, NULL, DIALECT_OPENAI},
    {"/index.html", "GET", 0, 0, get_web, NULL, DIALECT_OPENAI},
    {"/status", "GET", 0, 1, get_status, NULL, DIALECT_OPENAI},
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

const char *route_allow(const struct route *r)
{
    return r->get ? "GET, HEAD, OPTIONS" : "POST, OPTIONS";
}

int route_parse(struct hreq *h)
{
    return h->rt->parse(h);
}

/* Constant-time in the key contents: every key is compared over its whole length, no early exit. Returns
 * 1 + the index of the matching key, or 0. */
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
        ok |= (diff == 0) * (i + 1);
    }
    return ok;
}

static int authorized(struct hreq *h, const char *path)
{
    struct server *S = h->S;
    if (S->opt.n_api_keys == 0) return 1;
    if (S->opt.public_health && (!strcmp(path, "/health") || !strcmp(path, "/metrics"))) return 1;
    if (web_asset_find(path)) return 1; /* the page holds no data; what it fetches needs the key */
    const char *x = http_req_header(h->q, "x-api-key"); /* Anthropic's clients send the key so */
    if (x && key_ok(S, x)) return 1;
    const char *a = http_req_header(h->q, "Authorization");
    if (!a || strncasecmp(a, "Bearer ", 7)) return 0;
    a += 7;
    while (*a == ' ') a++;
    const int k = key_ok(S, a);
    if (k) snprintf(h->client, sizeof h->client, "key %d", k); /* the tenant: fair shares, /status */
    return k != 0;
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
        hd[n++] =
            (struct http_hdr){"Access-Control-Allow-Headers",
                              "Authorization, Content-Type, x-api-key, anthropic-version, anthropic-beta"};
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
        hreq_respond_error(
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
    snprintf(h->client, sizeof h->client, "%s", http_req_peer(q)); /* (authorized: the key instead) */
    if (!authorized(h, path)) {
        hreq_respond_error(h, SERVE_ERR_UNAUTHORIZED, NULL,
                           "a valid API key is required (Authorization: Bearer KEY, or x-api-key: KEY)");
        return;
    }
    char safe[128];
    if (!rr) {
        hreq_respond_error(h, SERVE_ERR_NO_ROUTE, NULL, "no route %s %s", method,
                           ferry_log_safe(path, safe, sizeof safe));
        return;
    }
    int head = !strcmp(method, "HEAD") && rr->get;
    if (strcmp(method, rr->method) && !head) {
        hreq_respond_error(h, SERVE_ERR_METHOD, NULL, "%s is not allowed on %s (use %s)", method,
                           ferry_log_safe(path, safe, sizeof safe), rr->method);
        return;
    }
    if (rr->parse && !is_json(http_req_header(q, "Content-Type"))) {
        hreq_respond_error(h, SERVE_ERR_MEDIA_TYPE, NULL,
                           "the request body must be JSON (Content-Type: application/json)");
        return;
    }
    if (rr->needs_model && !__atomic_load_n(&S->was_ready, __ATOMIC_ACQUIRE)) {
        hreq_respond_error(h, SERVE_ERR_LOADING, NULL, "the model is still loading; retry shortly");
        return;
    }
    if (rr->get) {
        rr->get(h, path);
        return;
    }
    if (serve_load_state(S) != STATE_READY) {
        hreq_respond_error(h, SERVE_ERR_SHUTDOWN, NULL, "the server is shutting down");
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
        hreq_respond_error(h, FERRY_ERR_NOMEM, NULL, "out of memory");
        return;
    }
    memcpy(h->body, b, len);
    h->body[len] = 0;
    h->body_len = len;
    h->work.data = h;
    h->working = 1;
    if (uv_queue_work(&S->loop, &h->work, routes_parse_work, routes_parse_done)) {
        h->working = 0;
        hreq_respond_error(h, FERRY_ERR_INTERNAL, NULL, "cannot queue the request");
    }
}
