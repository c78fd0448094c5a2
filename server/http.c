/* http — connections on the libuv loop: accept (with limits), read and frame requests, write responses.
 *
 * A connection moves through these states:
 *   IDLE   nothing of the next request yet (a new connection, or between keep-alive requests)
 *   HEAD   the head is arriving: parsed each time a line completes; header_timeout from its first byte
 *   BODY   the body is arriving (Content-Length or chunked, decoded in place); body_timeout
 *   APP    the application has the request, or a response is being written; the input buffer is frozen
 *          (never reallocated: worker threads may read the body) and only takes pipelined bytes that fit
 *   LINGER the response is written and our side shut down: the client's remaining bytes are read and dropped
 *          until it closes (or 2 s), so that it sees our answer rather than a reset
 * A 250 ms sweep enforces every deadline. Connections past the limits are answered 503 straight from the
 * accept and go to LINGER without entering the count.
 */
#include "server/http.h"

#include <errno.h>
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>

#include "kernels/core/log.h"
#include "kernels/core/status.h"
#include "server/http_parse.h"

#define HEAD_MAX       (32 * 1024) /* bytes of one request head */
#define PIPELINE_MAX   (64 * 1024) /* bytes read ahead while a request is handled */
#define IN_MIN         2048        /* first input buffer */
#define LINGER_SECONDS 2.0
#define SWEEP_MS       250
#define SNDBUF_BYTES   (128 * 1024) /* per connection; Linux doubles it */
#define IP_BUCKETS     4096

enum conn_state { C_IDLE = 0, C_HEAD, C_BODY, C_APP, C_LINGER };

struct ip_entry {
    unsigned char key[16]; /* IPv6, or IPv4 mapped into it */
    int count;
    struct ip_entry *next;
};

struct http_req {
    uv_tcp_t tcp; /* tcp.data = this */
    struct http_server *srv;
    struct http_req *prev, *next; /* every connection */
    struct ip_entry *ip;          /* counted against max_per_ip; NULL for rejected connections */
    unsigned char ipkey[16];
    char peer[INET6_ADDRSTRLEN];
    int loopback;
    enum conn_state state;
    int fresh;      /* no request seen yet on this connection */
    int closing;    /* uv_close called */
    int reading;    /* uv_read_start active */
    double t_last;  /* last bytes read, or written */
    double t_start; /* start of the current head or body, or of the linger */
    /* input: [0, in_len) received; the current request occupies [0, req_end) once complete */
    char *in;
    size_t in_len, in_cap, scanned, req_end;
    struct http_head head;
    size_t head_len;
    struct http_framing fr;
    struct http_chunked ch;
    const char *body;
    size_t body_len;
    char path[512];
    /* the application's view */
    int app_active; /* on_head was called and on_end not yet */
    void *app;
    int responded; /* the application (or this layer) answered */
    int head_sent; /* bytes of the answer went to the socket: too late for another one */
    int resp_done; /* the whole response was queued */
    int chunked_out;
    int head_only; /* HEAD request: no body bytes */
    int close_after;
    int writes; /* uv_write requests in flight */
    int write_failed;
    uv_shutdown_t shut;
};

struct http_server {
    uv_loop_t *loop;
    struct http_params p;
    struct http_handlers h;
    uv_tcp_t listener;
    int listening;
    struct http_req spare; /* refuses a connection when there is no memory for one (503, then lingers) */
    int spare_busy, accept_pending;
    uv_timer_t sweep;
    struct http_req *conns; /* every connection, counted or lingering */
    int n_open, n_linger;
    int draining, closed;
    struct ip_entry *ips[IP_BUCKETS];
    struct http_stats st;
    char canned_busy[512], canned_oom[512]; /* answers that need no allocation */
    size_t canned_busy_len, canned_oom_len;
    char date[40];
    time_t date_t;
};

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* ---- error bodies ---- */

static const struct {
    int status;
    const char *reason, *type, *code;
} statuses[] = {
    {100, "Continue", NULL, NULL},
    {200, "OK", NULL, NULL},
    {204, "No Content", NULL, NULL},
    {400, "Bad Request", "invalid_request_error", "bad_request"},
    {401, "Unauthorized", "invalid_request_error", "invalid_api_key"},
    {403, "Forbidden", "invalid_request_error", "forbidden"},
    {404, "Not Found", "invalid_request_error", "not_found"},
    {405, "Method Not Allowed", "invalid_request_error", "method_not_allowed"},
    {408, "Request Timeout", "timeout_error", "request_timeout"},
    {411, "Length Required", "invalid_request_error", "length_required"},
    {413, "Content Too Large", "invalid_request_error", "request_too_large"},
    {414, "URI Too Long", "invalid_request_error", "uri_too_long"},
    {415, "Unsupported Media Type", "invalid_request_error", "unsupported_media_type"},
    {417, "Expectation Failed", "invalid_request_error", "expectation_failed"},
    {429, "Too Many Requests", "rate_limit_error", "rate_limited"},
    {431, "Request Header Fields Too Large", "invalid_request_error", "header_too_large"},
    {500, "Internal Server Error", "server_error", "internal_error"},
    {501, "Not Implemented", "invalid_request_error", "not_implemented"},
    {503, "Service Unavailable", "server_overloaded", "too_many_connections"},
    {504, "Gateway Timeout", "timeout_error", "request_timeout"},
    {505, "HTTP Version Not Supported", "invalid_request_error", "http_version_not_supported"},
};

static int status_row(int status)
{
    for (size_t i = 0; i < sizeof statuses / sizeof statuses[0]; i++)
        if (statuses[i].status == status) return (int)i;
    return -1;
}

static const char *reason_of(int status)
{
    int i = status_row(status);
    return i >= 0 ? statuses[i].reason : "Unknown";
}

/* The OpenAI-style error object for a protocol-level error; msg is one of this layer's constant sentences
 * (no quotes or backslashes: written as is). */
static int error_json(char *out, size_t cap, int status, const char *msg)
{
    int i = status_row(status);
    const char *type = i >= 0 && statuses[i].type ? statuses[i].type : "server_error";
    const char *code = i >= 0 && statuses[i].code ? statuses[i].code : "internal_error";
    return snprintf(out, cap,
                    "{\"error\":{\"message\":\"%s\",\"type\":\"%s\",\"param\":null,\"code\":\"%s\"}}", msg,
                    type, code);
}

static size_t canned(char *out, size_t cap, int status, const char *msg)
{
    char body[300];
    int bl = error_json(body, sizeof body, status, msg);
    int n = snprintf(out, cap,
                     "HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nRetry-After: 1\r\nConnection: "
                     "close\r\nContent-Length: %d\r\n\r\n%s",
                     status, reason_of(status), bl, body);
    return n > 0 && (size_t)n < cap ? (size_t)n : 0;
}

static const char *date_header(struct http_server *s)
{
    time_t t = time(NULL);
    if (t != s->date_t) {
        struct tm tm;
        gmtime_r(&t, &tm);
        strftime(s->date, sizeof s->date, "%a, %d %b %Y %H:%M:%S GMT", &tm);
        s->date_t = t;
    }
    return s->date;
}

/* ---- per-address counts ---- */

static unsigned ip_hash(const unsigned char k[16])
{
    unsigned h = 2166136261u;
    for (int i = 0; i < 16; i++) h = (h ^ k[i]) * 16777619u;
    return h % IP_BUCKETS;
}

static struct ip_entry *ip_find(struct http_server *s, const unsigned char k[16], int create)
{
    struct ip_entry **b = &s->ips[ip_hash(k)];
    for (struct ip_entry *e = *b; e; e = e->next)
        if (!memcmp(e->key, k, 16)) return e;
    if (!create) return NULL;
    struct ip_entry *e = calloc(1, sizeof *e);
    if (!e) return NULL;
    memcpy(e->key, k, 16);
    e->next = *b;
    *b = e;
    return e;
}

static void ip_release(struct http_server *s, struct ip_entry *e)
{
    if (!e || --e->count > 0) return;
    struct ip_entry **pp = &s->ips[ip_hash(e->key)];
    while (*pp != e) pp = &(*pp)->next;
    *pp = e->next;
    free(e);
}

/* ---- connection lifetime ---- */

static void on_connection(uv_stream_t *ls, int status);

static void on_closed(uv_handle_t *hd)
{
    struct http_req *c = hd->data;
    struct http_server *s = c->srv;
    if (c->prev)
        c->prev->next = c->next;
    else
        s->conns = c->next;
    if (c->next) c->next->prev = c->prev;
    free(c->in);
    if (c != &s->spare) {
        free(c);
        return;
    }
    s->spare_busy = 0; /* a connection left waiting in the backlog meanwhile is taken now */
    if (s->accept_pending && s->listening) {
        s->accept_pending = 0;
        on_connection((uv_stream_t *)&s->listener, 0);
    }
}

/* Ends the application's request (once). */
static void end_request(struct http_req *c, int aborted)
{
    if (!c->app_active) return;
    c->app_active = 0;
    if (c->srv->h.on_end) c->srv->h.on_end(c, aborted, c->srv->h.user);
    c->app = NULL;
}

static void conn_close(struct http_req *c)
{
    if (c->closing) return;
    end_request(c, 1);
    c->closing = 1;
    struct http_server *s = c->srv;
    if (c->ip) {
        s->n_open--;
        ip_release(s, c->ip);
        c->ip = NULL;
    } else if (c->state == C_LINGER) {
        s->n_linger--;
    }
    uv_close((uv_handle_t *)&c->tcp, on_closed);
}

static void linger_read(uv_stream_t *st, ssize_t n, const uv_buf_t *buf);
static void linger_alloc(uv_handle_t *hd, size_t suggested, uv_buf_t *buf);

static void on_shutdown(uv_shutdown_t *sh, int status)
{
    struct http_req *c = sh->data;
    if (status < 0) conn_close(c);
}

/* Our side is done: shut down writing and drop what the client still sends until it closes. */
static void conn_linger(struct http_req *c)
{
    struct http_server *s = c->srv;
    if (c->closing) return;
    end_request(c, 0);
    if (c->ip) {
        s->n_open--;
        ip_release(s, c->ip);
        c->ip = NULL;
    }
    if (s->n_linger >= HTTP_LINGER_MAX || s->closed) {
        c->state = C_LINGER; /* counted as lingering so conn_close balances */
        s->n_linger++;
        conn_close(c);
        return;
    }
    c->state = C_LINGER;
    s->n_linger++;
    c->t_start = now_s();
    free(c->in);
    c->in = NULL;
    c->in_len = c->in_cap = 0;
    c->shut.data = c;
    if (uv_shutdown(&c->shut, (uv_stream_t *)&c->tcp, on_shutdown)) {
        conn_close(c);
        return;
    }
    uv_read_stop((uv_stream_t *)&c->tcp);
    if (uv_read_start((uv_stream_t *)&c->tcp, linger_alloc, linger_read)) conn_close(c);
}

static void linger_alloc(uv_handle_t *hd, size_t suggested, uv_buf_t *buf)
{
    static char sink[16384]; /* loop thread only; what lands here is dropped */
    (void)hd, (void)suggested;
    *buf = uv_buf_init(sink, sizeof sink);
}

static void linger_read(uv_stream_t *st, ssize_t n, const uv_buf_t *buf)
{
    (void)buf;
    if (n < 0) conn_close(st->data);
}

/* ---- writing ---- */

struct wreq {
    uv_write_t w;
    struct http_req *c;
    char *own[2];
};

static void response_written(struct http_req *c);

static void on_written(uv_write_t *w, int status)
{
    struct wreq *wr = (struct wreq *)w;
    struct http_req *c = wr->c;
    free(wr->own[0]);
    free(wr->own[1]);
    free(wr);
    c->writes--;
    if (status < 0) c->write_failed = 1;
    c->t_last = now_s();
    if (c->closing) return;
    if (c->write_failed) {
        conn_close(c);
        return;
    }
    if (c->writes > 0) return;
    if (c->resp_done)
        response_written(c);
    else if (c->app_active && c->srv->h.on_drain)
        c->srv->h.on_drain(c, c->srv->h.user);
}

/* Queues up to two buffers, taking over `own0`/`own1` (freed once written). Returns 0 or FERRY_ERR_NOMEM /
 * FERRY_ERR_IO, having freed them. */
static int conn_write(struct http_req *c, char *p0, size_t n0, char *own0, char *p1, size_t n1, char *own1)
{
    struct wreq *wr = malloc(sizeof *wr);
    if (!wr) {
        free(own0);
        free(own1);
        return FERRY_ERR_NOMEM;
    }
    wr->c = c;
    wr->own[0] = own0;
    wr->own[1] = own1;
    uv_buf_t b[2] = {uv_buf_init(p0, (unsigned)n0), uv_buf_init(p1, (unsigned)n1)};
    if (uv_write(&wr->w, (uv_stream_t *)&c->tcp, b, n1 ? 2 : 1, on_written)) {
        free(own0);
        free(own1);
        free(wr);
        return FERRY_ERR_IO;
    }
    c->writes++;
    return 0;
}

/* A static answer written without allocating (a fresh socket takes a few hundred bytes at once), then close.
 */
static void conn_fail_canned(struct http_req *c, const char *resp, size_t len)
{
    if (!c->head_sent && len) {
        uv_buf_t b = uv_buf_init((char *)resp, (unsigned)len);
        uv_try_write((uv_stream_t *)&c->tcp, &b, 1);
        c->responded = c->head_sent = 1;
    }
    conn_close(c);
}

static void conn_reset_for_next(struct http_req *c);

/* The answer for "no memory for this connection", then a graceful close: the client reads a 503, not a reset.
 */
static void conn_fail_canned_linger(struct http_req *c)
{
    struct http_server *s = c->srv;
    uv_buf_t b = uv_buf_init(s->canned_oom, (unsigned)s->canned_oom_len);
    uv_try_write((uv_stream_t *)&c->tcp, &b, 1);
    c->responded = c->head_sent = 1;
    conn_linger(c);
}

static void response_written(struct http_req *c)
{
    end_request(c, 0);
    if (c->close_after || c->srv->draining) {
        conn_linger(c);
        return;
    }
    conn_reset_for_next(c);
}

/* The response head: status line, Date, the caller's headers, framing and Connection. */
static char *response_head(struct http_req *c, int status, const struct http_hdr *h, int n,
                           const char *framing, size_t *len)
{
    size_t cap = 256 + strlen(framing);
    for (int i = 0; i < n; i++) cap += strlen(h[i].name) + strlen(h[i].value) + 4;
    char *p = malloc(cap);
    if (!p) return NULL;
    size_t o = (size_t)snprintf(p, cap, "HTTP/1.1 %d %s\r\nDate: %s\r\n", status, reason_of(status),
                                date_header(c->srv));
    for (int i = 0; i < n; i++) o += (size_t)snprintf(p + o, cap - o, "%s: %s\r\n", h[i].name, h[i].value);
    if (c->srv->draining) c->close_after = 1;
    const char *conn = c->close_after       ? "Connection: close\r\n"
                       : c->head.minor == 0 ? "Connection: keep-alive\r\n"
                                            : "";
    o += (size_t)snprintf(p + o, cap - o, "%s%s\r\n", framing, conn);
    *len = o;
    return p;
}

static int begin_response(struct http_req *c)
{
    if (c->closing || c->responded || c->state == C_LINGER) return FERRY_ERR_INVALID;
    c->responded = 1;
    if (c->state != C_APP) { /* answered from on_head: the body stays unread */
        size_t have = c->in_len - c->head_len;
        size_t cl = c->fr.content_length > 0 ? (size_t)c->fr.content_length : 0;
        if (!c->fr.chunked && have >= cl)
            c->req_end =
                c->head_len + cl; /* it came whole (or there is none): skip it, keep the connection */
        else
            c->close_after = 1;
        c->state = C_APP;
    }
    return 0;
}

int http_respond(struct http_req *c, int status, const struct http_hdr *h, int n, char *body, size_t len)
{
    if (begin_response(c)) {
        free(body);
        return FERRY_ERR_INVALID;
    }
    char framing[64];
    snprintf(framing, sizeof framing, "Content-Length: %zu\r\n", len);
    size_t hl = 0;
    char *head = response_head(c, status, h, n, framing, &hl);
    if (!head) {
        free(body);
        conn_fail_canned(c, c->srv->canned_oom, c->srv->canned_oom_len);
        return FERRY_ERR_NOMEM;
    }
    c->resp_done = 1;
    if (c->head_only) {
        free(body);
        body = NULL;
        len = 0;
    }
    int rc = conn_write(c, head, hl, head, body, body ? len : 0, body);
    if (rc) /* nothing went out: with no memory for the write, the canned answer still can */
        conn_fail_canned(c, c->srv->canned_oom, rc == FERRY_ERR_NOMEM ? c->srv->canned_oom_len : 0);
    else
        c->head_sent = 1;
    return rc;
}

int http_stream_begin(struct http_req *c, int status, const struct http_hdr *h, int n)
{
    if (begin_response(c)) return FERRY_ERR_INVALID;
    c->chunked_out = c->head.minor == 1;
    if (!c->chunked_out) c->close_after = 1; /* HTTP/1.0: the body ends when the connection does */
    size_t hl = 0;
    char *head = response_head(c, status, h, n, c->chunked_out ? "Transfer-Encoding: chunked\r\n" : "", &hl);
    if (!head) {
        conn_fail_canned(c, c->srv->canned_oom, c->srv->canned_oom_len);
        return FERRY_ERR_NOMEM;
    }
    int rc = conn_write(c, head, hl, head, NULL, 0, NULL);
    if (rc)
        conn_fail_canned(c, c->srv->canned_oom, rc == FERRY_ERR_NOMEM ? c->srv->canned_oom_len : 0);
    else
        c->head_sent = 1;
    return rc;
}

int http_stream_write(struct http_req *c, const char *p, size_t len)
{
    if (c->closing || !c->responded || c->resp_done) return FERRY_ERR_INVALID;
    if (len == 0) return 0;
    char *b = malloc(len + 24);
    if (!b) {
        conn_close(c);
        return FERRY_ERR_NOMEM;
    }
    size_t o = c->chunked_out ? (size_t)snprintf(b, 24, "%zx\r\n", len) : 0;
    memcpy(b + o, p, len);
    o += len;
    if (c->chunked_out) b[o++] = '\r', b[o++] = '\n';
    int rc = conn_write(c, b, o, b, NULL, 0, NULL);
    if (rc) conn_close(c);
    return rc;
}

int http_stream_end(struct http_req *c)
{
    static char last[] = "0\r\n\r\n";
    if (c->closing || !c->responded || c->resp_done) return FERRY_ERR_INVALID;
    c->resp_done = 1;
    if (!c->chunked_out) {
        if (c->writes == 0) response_written(c);
        return 0;
    }
    int rc = conn_write(c, last, 5, NULL, NULL, 0, NULL);
    if (rc) conn_close(c);
    return rc;
}

size_t http_req_unsent(const struct http_req *c)
{
    return c->closing ? 0 : uv_stream_get_write_queue_size((const uv_stream_t *)&c->tcp);
}

/* A protocol error: a JSON answer that closes the connection; the application never saw the request. */
static void conn_error(struct http_req *c, int status, const char *why)
{
    struct http_server *s = c->srv;
    s->st.protocol_errors += status != 408;
    end_request(c, 1);
    FLOG_INFO("http: %d to %s: %s", status, c->peer, why);
    if (c->head_sent) { /* too late for an answer */
        conn_close(c);
        return;
    }
    char body[400];
    int bl = error_json(body, sizeof body, status, why);
    char *b = malloc((size_t)bl + 1);
    if (!b) {
        conn_fail_canned(c, s->canned_oom, s->canned_oom_len);
        return;
    }
    memcpy(b, body, (size_t)bl + 1);
    c->app_active = 0;
    c->close_after = 1;
    c->state = C_APP;
    struct http_hdr h[] = {{"Content-Type", "application/json"}};
    http_respond(c, status, h, 1, b, (size_t)bl);
}

/* ---- reading ---- */

/* Grows the input buffer; views into it (head, body) move with it. Not in APP: the body may be in use. */
static int in_grow(struct http_req *c, size_t want)
{
    struct http_server *s = c->srv;
    size_t max = HEAD_MAX + (size_t)s->p.body_limit + PIPELINE_MAX;
    if (c->in_cap >= want) return 0;
    size_t nc = c->in_cap ? c->in_cap : IN_MIN;
    while (nc < want) nc *= 2;
    if (nc > max) nc = max;
    if (nc < want) return FERRY_ERR_RANGE;
    /* the head's views move with the buffer: keep them as offsets across the realloc */
    size_t off[2 + 2 * HTTP_MAX_FIELDS];
    int nv = 0;
    if (c->head_len) {
        off[nv++] = (size_t)(c->head.method - c->in);
        off[nv++] = (size_t)(c->head.target - c->in);
        for (int i = 0; i < c->head.n_fields; i++) {
            off[nv++] = (size_t)(c->head.fields[i].name - c->in);
            off[nv++] = (size_t)(c->head.fields[i].value - c->in);
        }
    }
    char *p = realloc(c->in, nc);
    if (!p) return FERRY_ERR_NOMEM;
    if (nv) {
        c->head.method = p + off[0];
        c->head.target = p + off[1];
        for (int i = 0; i < c->head.n_fields; i++) {
            c->head.fields[i].name = p + off[2 + 2 * i];
            c->head.fields[i].value = p + off[3 + 2 * i];
        }
    }
    c->in = p;
    c->in_cap = nc;
    return 0;
}

static void conn_alloc(uv_handle_t *hd, size_t suggested, uv_buf_t *buf)
{
    struct http_req *c = hd->data;
    (void)suggested;
    *buf = uv_buf_init(NULL, 0);
    if (c->state == C_APP) { /* frozen: only the room already there, for read-ahead and for seeing EOF */
        if (c->in_cap > c->in_len) *buf = uv_buf_init(c->in + c->in_len, (unsigned)(c->in_cap - c->in_len));
        return;
    }
    /* grow by doubling as bytes arrive: memory follows what the client has really sent */
    if (c->in_cap - c->in_len < 512 && in_grow(c, c->in_cap ? c->in_cap * 2 : IN_MIN))
        in_grow(c, c->in_len + 512);
    if (c->in_cap > c->in_len) *buf = uv_buf_init(c->in + c->in_len, (unsigned)(c->in_cap - c->in_len));
}

static void process(struct http_req *c);

static void conn_read(uv_stream_t *st, ssize_t n, const uv_buf_t *buf)
{
    struct http_req *c = st->data;
    (void)buf;
    if (n == 0) return;
    if (n == UV_ENOBUFS) {
        if (c->state == C_APP) { /* read-ahead full: wait for the response to be written */
            uv_read_stop(st);
            c->reading = 0;
            return;
        }
        conn_fail_canned(c, c->srv->canned_oom, c->srv->canned_oom_len);
        return;
    }
    if (n < 0) { /* EOF or error: the client is gone, whatever we were doing */
        conn_close(c);
        return;
    }
    c->in_len += (size_t)n;
    c->t_last = now_s();
    process(c);
}

static void start_reading(struct http_req *c)
{
    if (c->reading || c->closing) return;
    if (uv_read_start((uv_stream_t *)&c->tcp, conn_alloc, conn_read) == 0) c->reading = 1;
}

static void conn_reset_for_next(struct http_req *c)
{
    size_t rest = c->in_len - c->req_end;
    if (rest) memmove(c->in, c->in + c->req_end, rest);
    c->in_len = rest;
    c->req_end = c->head_len = c->scanned = 0;
    c->body = NULL;
    c->body_len = 0;
    c->responded = c->head_sent = c->resp_done = c->chunked_out = c->head_only = c->close_after = 0;
    memset(&c->ch, 0, sizeof c->ch);
    c->head.n_fields = 0;
    c->state = C_IDLE;
    c->t_last = now_s();
    if (rest == 0) { /* an idle connection keeps no buffer */
        free(c->in);
        c->in = NULL;
        c->in_cap = 0;
    }
    start_reading(c);
    if (rest) process(c);
}

/* NUL-terminates the head's views in place: each is followed by a space, OWS or CR that is no longer needed.
 */
static void terminate_views(struct http_req *c)
{
    struct http_head *h = &c->head;
    ((char *)h->method)[h->method_len] = 0;
    ((char *)h->target)[h->target_len] = 0;
    for (int i = 0; i < h->n_fields; i++) {
        ((char *)h->fields[i].name)[h->fields[i].name_len] = 0;
        ((char *)h->fields[i].value)[h->fields[i].value_len] = 0;
    }
}

static void dispatch(struct http_req *c)
{
    struct http_server *s = c->srv;
    /* room to notice the client leaving (and to read ahead) without ever moving the frozen buffer */
    if (c->in_cap - c->in_len < 1024 && in_grow(c, c->in_len + 4096)) {
        conn_fail_canned(c, s->canned_oom, s->canned_oom_len);
        return;
    }
    c->body = c->in + c->head_len;
    c->state = C_APP;
    if (s->h.on_request) s->h.on_request(c, s->h.user);
}

static void head_done(struct http_req *c, int head_len)
{
    struct http_server *s = c->srv;
    const char *why;
    c->head_len = (size_t)head_len;
    int rc = http_head_framing(&c->head, &c->fr, &why);
    if (rc) {
        conn_error(c, -rc, why);
        return;
    }
    terminate_views(c);
    if (http_target_path(c->head.target, c->head.target_len, c->path, sizeof c->path) < 0) c->path[0] = 0;
    c->head_only = !strcmp(c->head.method, "HEAD");
    if (c->fr.content_length > s->p.body_limit) {
        conn_error(c, 413, "the request body is larger than the limit (--body-limit)");
        return;
    }
    c->fresh = 0;
    if (!c->fr.keep_alive) c->close_after = 1;
    c->state = C_BODY;
    c->t_start = now_s();
    c->app_active = 1;
    c->app = NULL;
    if (s->h.on_head) s->h.on_head(c, s->h.user);
    if (c->responded || c->closing) return;
    if (c->fr.expect_continue && (c->fr.content_length > 0 || c->fr.chunked)) {
        static char cont[] = "HTTP/1.1 100 Continue\r\n\r\n";
        if (conn_write(c, cont, sizeof cont - 1, NULL, NULL, 0, NULL)) conn_close(c);
    }
}

static void process(struct http_req *c)
{
    struct http_server *s = c->srv;
    const char *why;
    if (c->closing) return;
    if (c->state == C_IDLE) {
        if (c->in_len == 0) return;
        c->state = C_HEAD;
        if (!c->fresh) c->t_start = now_s(); /* a new connection's clock runs from the accept */
    }
    if (c->state == C_HEAD) {
        /* parse when a line has completed (or the head cannot grow): linear in the head, whatever the trickle
         */
        int line = memchr(c->in + c->scanned, '\n', c->in_len - c->scanned) != NULL;
        c->scanned = c->in_len;
        if (!line && c->in_len < HEAD_MAX && c->in_len < HTTP_MAX_REQUEST_LINE) return;
        int rc = http_parse_head(c->in, c->in_len, HEAD_MAX, &c->head, &why);
        if (rc == 0) return;
        if (rc < 0) {
            conn_error(c, -rc, why);
            return;
        }
        head_done(c, rc);
        if (c->closing || c->state != C_BODY) return;
    }
    if (c->state == C_BODY) {
        if (c->fr.chunked) {
            size_t raw = c->in_len - c->head_len;
            int rc = http_chunked_decode(&c->ch, c->in + c->head_len, raw, (uint64_t)s->p.body_limit, &why);
            if (rc < 0) {
                conn_error(c, -rc,
                           rc == -413 ? "the request body is larger than the limit (--body-limit)" : why);
                return;
            }
            /* reclaim the framing bytes already decoded */
            size_t gap = c->ch.in - c->ch.out;
            if (gap) {
                memmove(c->in + c->head_len + c->ch.out, c->in + c->head_len + c->ch.in, raw - c->ch.in);
                c->in_len -= gap;
                c->ch.in = c->ch.out;
            }
            if (rc == 0) return;
            c->body_len = c->ch.out;
            c->req_end = c->head_len + c->ch.out;
            goto have_body;
        }
        size_t cl = c->fr.content_length > 0 ? (size_t)c->fr.content_length : 0;
        if (c->in_len - c->head_len < cl) return;
        c->body_len = cl;
        c->req_end = c->head_len + cl;
    have_body:
        dispatch(c);
        return;
    }
    if (c->state == C_APP && c->in_len - c->req_end > PIPELINE_MAX && c->reading) {
        uv_read_stop((uv_stream_t *)&c->tcp);
        c->reading = 0;
    }
}

/* ---- accepting ---- */

static void peer_of(struct http_req *c)
{
    struct sockaddr_storage ss;
    int len = sizeof ss;
    memset(c->ipkey, 0, 16);
    strcpy(c->peer, "?");
    if (uv_tcp_getpeername(&c->tcp, (struct sockaddr *)&ss, &len)) return;
    if (ss.ss_family == AF_INET) {
        const struct sockaddr_in *a = (const struct sockaddr_in *)&ss;
        c->ipkey[10] = c->ipkey[11] = 0xff;
        memcpy(c->ipkey + 12, &a->sin_addr, 4);
        uv_ip4_name(a, c->peer, sizeof c->peer);
        c->loopback = c->ipkey[12] == 127;
    } else if (ss.ss_family == AF_INET6) {
        const struct sockaddr_in6 *a = (const struct sockaddr_in6 *)&ss;
        memcpy(c->ipkey, &a->sin6_addr, 16);
        static const unsigned char mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
        static const unsigned char lo6[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1};
        if (!memcmp(c->ipkey, mapped, 12)) {
            struct sockaddr_in v4 = {.sin_family = AF_INET};
            memcpy(&v4.sin_addr, c->ipkey + 12, 4);
            uv_ip4_name(&v4, c->peer, sizeof c->peer);
            c->loopback = c->ipkey[12] == 127;
        } else {
            uv_ip6_name(a, c->peer, sizeof c->peer);
            c->loopback = !memcmp(c->ipkey, lo6, 16);
        }
    }
}

/* Answered 503 at once and left to linger; not counted against the limits. */
static void conn_reject(struct http_req *c, int per_ip)
{
    struct http_server *s = c->srv;
    if (per_ip)
        s->st.rejected_per_ip++;
    else
        s->st.rejected_full++;
    uv_buf_t b = uv_buf_init(s->canned_busy, (unsigned)s->canned_busy_len);
    uv_try_write((uv_stream_t *)&c->tcp, &b, 1);
    c->responded = c->head_sent = 1;
    conn_linger(c);
}

static void on_connection(uv_stream_t *ls, int status)
{
    struct http_server *s = ls->data;
    if (status < 0) {
        FLOG_WARN("http: accept: %s", uv_strerror(status));
        return;
    }
    struct http_req *c = calloc(1, sizeof *c);
    int spare = !c;
    if (spare) {
        /* no memory for a connection: refuse it on the spare one; while that one lingers, a further
         * connection waits in the backlog (libuv stops accepting until uv_accept is called) */
        if (s->spare_busy) {
            s->accept_pending = 1;
            return;
        }
        s->spare_busy = 1;
        c = &s->spare;
        memset(c, 0, sizeof *c);
    }
    c->srv = s;
    c->fresh = 1;
    if (uv_tcp_init(s->loop, &c->tcp)) {
        free(c);
        return;
    }
    c->tcp.data = c;
    c->next = s->conns;
    if (s->conns) s->conns->prev = c;
    s->conns = c;
    if (uv_accept(ls, (uv_stream_t *)&c->tcp)) {
        c->state = C_LINGER;
        s->n_linger++;
        conn_close(c);
        return;
    }
    if (spare) {
        conn_fail_canned_linger(c);
        return;
    }
    uv_tcp_nodelay(&c->tcp, 1);
    /* a fixed send buffer: the kernel's autotuning would let each client that stops reading pin ~4 MiB of
     * kernel memory (and hide the stall from the write-progress check for as long) */
    int sndbuf = SNDBUF_BYTES;
    uv_send_buffer_size((uv_handle_t *)&c->tcp, &sndbuf);
    peer_of(c);
    c->t_last = c->t_start = now_s();
    if (s->draining || s->closed) {
        c->state = C_LINGER;
        s->n_linger++;
        conn_close(c);
        return;
    }
    if (s->n_open >= s->p.max_connections) {
        conn_reject(c, 0);
        return;
    }
    struct ip_entry *e = ip_find(s, c->ipkey, 1);
    if (!e) {
        conn_fail_canned(c, s->canned_oom, s->canned_oom_len);
        return;
    }
    if (s->p.max_per_ip > 0 && e->count >= s->p.max_per_ip) {
        conn_reject(c, 1);
        return;
    }
    e->count++;
    c->ip = e;
    s->n_open++;
    s->st.accepted++;
    if (s->n_open > s->st.peak) s->st.peak = s->n_open;
    start_reading(c);
    if (!c->reading) conn_close(c);
}

/* ---- deadlines ---- */

static void on_sweep(uv_timer_t *t)
{
    struct http_server *s = t->data;
    double now = now_s();
    const struct http_params *p = &s->p;
    for (struct http_req *c = s->conns, *next; c; c = next) {
        next = c->next;
        if (c->closing) continue;
        switch (c->state) {
        case C_IDLE:
            if (now - (c->fresh ? c->t_start : c->t_last) >
                (c->fresh ? p->header_timeout : p->idle_timeout)) {
                s->st.idle_closed++;
                conn_close(c);
            }
            break;
        case C_HEAD:
            if (now - c->t_start > p->header_timeout || now - c->t_last > p->idle_timeout) {
                s->st.head_timeouts++;
                conn_error(c, 408, "the request head did not arrive in time (--header-timeout)");
            }
            break;
        case C_BODY:
            if (now - c->t_start > p->body_timeout || now - c->t_last > p->idle_timeout) {
                s->st.head_timeouts++;
                conn_error(c, 408, "the request body did not arrive in time (--body-timeout)");
            }
            break;
        case C_APP:
            if (c->writes > 0 && http_req_unsent(c) > 0 && now - c->t_last > p->idle_timeout) {
                s->st.stalled_readers++;
                FLOG_INFO("http: %s took no response bytes for %.0fs: closing", c->peer, p->idle_timeout);
                conn_close(c);
            }
            break;
        case C_LINGER:
            if (now - c->t_start > LINGER_SECONDS) conn_close(c);
            break;
        }
    }
}

/* ---- the server ---- */

int http_server_init(struct http_server **out, uv_loop_t *loop, const struct http_params *p,
                     const struct http_handlers *h, char err[256])
{
    *out = NULL;
    struct http_server *s = calloc(1, sizeof *s);
    if (!s) {
        snprintf(err, 256, "out of memory");
        return FERRY_ERR_NOMEM;
    }
    s->loop = loop;
    s->p = *p;
    s->h = *h;
    s->canned_busy_len = canned(s->canned_busy, sizeof s->canned_busy, 503,
                                "the server has too many connections (--max-connections, "
                                "--max-connections-per-ip); retry later");
    s->canned_oom_len = canned(s->canned_oom, sizeof s->canned_oom, 503, "the server is out of memory");
    struct addrinfo hints = {0}, *ai = NULL;
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
    char port[16];
    snprintf(port, sizeof port, "%d", p->port);
    int g = getaddrinfo(p->host, port, &hints, &ai);
    if (g) {
        snprintf(err, 256, "--host %s: %s", p->host, gai_strerror(g));
        free(s);
        return FERRY_ERR_INVALID;
    }
    int rc = uv_tcp_init(loop, &s->listener);
    if (rc == 0) {
        s->listener.data = s;
        s->listening = 1;
        rc = uv_tcp_bind(&s->listener, ai->ai_addr, 0);
        if (rc == 0) rc = uv_listen((uv_stream_t *)&s->listener, 1024, on_connection);
    }
    freeaddrinfo(ai);
    if (rc) {
        snprintf(err, 256, "cannot listen on %s:%d: %s", p->host, p->port, uv_strerror(rc));
        if (s->listening) {
            uv_close((uv_handle_t *)&s->listener, NULL);
            uv_run(loop, UV_RUN_NOWAIT); /* let the close finish before s goes */
        }
        free(s);
        return FERRY_ERR_IO;
    }
    uv_timer_init(loop, &s->sweep);
    s->sweep.data = s;
    uv_timer_start(&s->sweep, on_sweep, SWEEP_MS, SWEEP_MS);
    *out = s;
    return 0;
}

int http_server_port(const struct http_server *s)
{
    struct sockaddr_storage ss;
    int len = sizeof ss;
    if (uv_tcp_getsockname(&s->listener, (struct sockaddr *)&ss, &len)) return -1;
    return ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
                                          : ((struct sockaddr_in *)&ss)->sin_port);
}

static void stop_listening(struct http_server *s)
{
    if (!s->listening) return;
    s->listening = 0;
    uv_close((uv_handle_t *)&s->listener, NULL);
}

void http_server_drain(struct http_server *s)
{
    s->draining = 1;
    stop_listening(s);
    for (struct http_req *c = s->conns, *next; c; c = next) {
        next = c->next;
        if (c->state == C_IDLE && !c->closing) conn_close(c);
    }
}

void http_server_close(struct http_server *s)
{
    if (!s || s->closed) return;
    s->closed = 1;
    stop_listening(s);
    uv_timer_stop(&s->sweep);
    uv_close((uv_handle_t *)&s->sweep, NULL);
    for (struct http_req *c = s->conns, *next; c; c = next) {
        next = c->next;
        conn_close(c);
    }
}

void http_server_free(struct http_server *s)
{
    if (!s) return;
    for (int i = 0; i < IP_BUCKETS; i++)
        for (struct ip_entry *e = s->ips[i], *n; e; e = n) {
            n = e->next;
            free(e);
        }
    free(s);
}

void http_server_stats(const struct http_server *s, struct http_stats *st)
{
    *st = s->st;
    st->open = s->n_open;
}

/* ---- request accessors ---- */

const char *http_req_method(const struct http_req *q)
{
    return q->head.method;
}
const char *http_req_path(const struct http_req *q)
{
    return q->path;
}
const char *http_req_header(const struct http_req *q, const char *name)
{
    return http_head_field(&q->head, name, NULL, NULL);
}
const char *http_req_body(const struct http_req *q, size_t *len)
{
    *len = q->body ? q->body_len : 0;
    return q->body ? q->body : "";
}
const char *http_req_peer(const struct http_req *q)
{
    return q->peer;
}
int http_req_is_loopback(const struct http_req *q)
{
    return q->loopback;
}
void http_req_set_app(struct http_req *q, void *app)
{
    q->app = app;
}
void *http_req_app(const struct http_req *q)
{
    return q->app;
}
int http_req_draining(const struct http_req *q)
{
    return q->srv->draining;
}
void http_req_close(struct http_req *q)
{
    conn_close(q);
}
void http_req_refuse_nomem(struct http_req *q)
{
    conn_fail_canned(q, q->srv->canned_oom, q->srv->canned_oom_len);
}
