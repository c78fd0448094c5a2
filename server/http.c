/* http — libmicrohttpd driven from the libuv loop: ferry's accept (with limits), deadlines, framing checks,
 * and the http.h request API on top of MHD's connections.
 *
 * Ownership: ferry owns the listening socket and the accept; a connection within the limits is handed to MHD
 * (MHD_add_connection) and from then on MHD owns its fd (parses, writes, closes). MHD runs in external mode
 * with epoll: its epoll fd is watched by a uv_poll and MHD_run is called when it is readable, when the timer
 * set from MHD_get_timeout fires, and after a suspended connection is resumed (the "kick"). Nothing runs on
 * another thread.
 * A connection (struct http_req) lives from the accept (NOTIFY_CONNECTION STARTED) to MHD's close (CLOSED):
 *   IDLE  no byte of the next head yet (a new connection, or between keep-alive requests)
 *   HEAD  the head is arriving (seen from the socket's received-byte count): header_timeout
 *   BODY  the access handler has the head; the body is arriving: body_timeout
 *   APP   the application has the request, or a response is being written; the connection is suspended
 *         while there is nothing to write (a worker parses, the engine generates), resumed when there is
 * A 250 ms sweep enforces the head and body deadlines (408 JSON written raw on the fd, then shutdown: MHD sees
 * the end and closes) and the idle one; MHD's own timeout drops a reader that takes no bytes.
 * Connections past the limits are answered 503 straight from the accept and linger without entering MHD.
 */
#include "server/http.h"

#include <errno.h>
#include <fcntl.h>
#include <microhttpd.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "kernels/core/log.h"
#include "kernels/core/status.h"

#define LINGER_SECONDS 2.0
#define SWEEP_MS       250
#define SNDBUF_BYTES   (128 * 1024) /* per connection; Linux doubles it */
#define IP_BUCKETS     4096
#define ACCEPT_BATCH   64
#define STREAM_BLOCK   (16 * 1024) /* MHD's buffer for a streamed answer's pieces */

enum conn_state { C_IDLE = 0, C_HEAD, C_BODY, C_APP };

struct ip_entry {
    unsigned char key[16]; /* IPv6, or IPv4 mapped into it */
    int count;
    struct ip_entry *next;
};

/* A connection refused at the accept: the 503 is written, our side shut down, and the client's bytes are
 * dropped until it closes (or LINGER_SECONDS), so that it reads the answer rather than a reset. */
struct linger_conn {
    uv_tcp_t tcp;
    uv_shutdown_t shut;
    struct http_server *srv;
    struct linger_conn *prev, *next;
    double t_start;
    int closing;
};

struct http_req {
    struct http_server *srv;
    struct http_req *prev, *next; /* every MHD connection */
    struct MHD_Connection *mc;    /* NULL until MHD's STARTED notification */
    int fd;
    struct ip_entry *ip;
    unsigned char ipkey[16];
    char peer[INET6_ADDRSTRLEN];
    int loopback;
    enum conn_state state;
    int fresh;          /* no request seen yet on this connection */
    int cut;            /* shut down by us: MHD closes it next */
    double t_start;     /* start of the current head or body (of the accept for a fresh connection) */
    double t_last;      /* last bytes seen from the client, or the end of the last response */
    uint64_t rx_mark;   /* the socket's received-byte count when last looked at */
    int suspended;      /* MHD_suspend_connection in effect */
    uv_poll_t dpoll;    /* while suspended: notices the client leaving (MHD does not) */
    int dpoll_init, dpoll_active;
    /* the request */
    char method[32];
    char path[512];
    int http10;
    char *body; /* (body_len) bytes, NUL-terminated; malloc'd as it arrives */
    size_t body_len, body_cap;
    int refusal; /* 413 (the body passed body_limit) or 503 (no memory for it): answered once MHD lets us */
    int app_active; /* on_head was called and on_end not yet */
    void *app;
    int responded;  /* an answer was queued (or is pending) */
    int close_after;
    struct MHD_Response *pending; /* an answer waiting for the access handler (not yet queued) */
    unsigned pending_status;
    int in_handler;
    int hold; /* an answer from on_head waits for the body's end (keeps the connection; MHD closes it when
               * answered earlier) */
    /* a streamed answer: pieces queued, not yet taken by MHD */
    int streaming;
    char *out;
    size_t out_off, out_len, out_cap;
    int out_end;
    int out_err;      /* the stream ends cut, not with its last chunk */
    int drain_wanted; /* on_drain is due once MHD's callback has returned */
    struct http_req *dnext;
    int deferred;
};

struct http_server {
    uv_loop_t *loop;
    struct http_params p;
    struct http_handlers h;
    struct MHD_Daemon *d;
    int lfd; /* the listening socket; -1 once closed */
    uv_poll_t lpoll, epoll_poll;
    int lpoll_init, epoll_init;
    uv_timer_t mhd_timer, sweep;
    int in_run;
    struct http_req *adding; /* the connection MHD_add_connection is taking */
    struct http_req *conns;
    struct linger_conn *lingers;
    struct http_req *deferred; /* connections with work due after MHD_run returns */
    int n_open, n_linger;
    int draining, closed;
    struct ip_entry *ips[IP_BUCKETS];
    struct http_stats st;
    struct MHD_Response *resp_oom; /* answers that need no allocation of ours */
    char canned_busy[512], canned_oom[512], canned_408h[512], canned_408b[512];
    size_t canned_busy_len, canned_oom_len, canned_408h_len, canned_408b_len;
};

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void mhd_kick(struct http_server *s);

/* ---- error bodies ---- */

static const struct {
    int status;
    const char *reason, *type, *code;
} statuses[] = {
    {400, "Bad Request", "invalid_request_error", "bad_request"},
    {408, "Request Timeout", "timeout_error", "request_timeout"},
    {413, "Content Too Large", "invalid_request_error", "request_too_large"},
    {417, "Expectation Failed", "invalid_request_error", "expectation_failed"},
    {500, "Internal Server Error", "server_error", "internal_error"},
    {501, "Not Implemented", "invalid_request_error", "not_implemented"},
    {503, "Service Unavailable", "server_overloaded", "too_many_connections"},
};

static int status_row(int status)
{
    for (size_t i = 0; i < sizeof statuses / sizeof statuses[0]; i++)
        if (statuses[i].status == status) return (int)i;
    return -1;
}

/* The OpenAI-style error object for a protocol-level error; msg is one of this layer's constant sentences
 * (no quotes or backslashes: written as is). */
static int error_json(char *out, size_t cap, int status, const char *msg)
{
    int i = status_row(status);
    const char *type = i >= 0 ? statuses[i].type : "server_error";
    const char *code = i >= 0 ? statuses[i].code : "internal_error";
    return snprintf(out, cap,
                    "{\"error\":{\"message\":\"%s\",\"type\":\"%s\",\"param\":null,\"code\":\"%s\"}}", msg,
                    type, code);
}

/* A whole answer as bytes, for writing raw on a socket that has sent nothing of the current request. */
static size_t canned(char *out, size_t cap, int status, const char *msg)
{
    char body[300];
    int bl = error_json(body, sizeof body, status, msg);
    int i = status_row(status);
    int n = snprintf(out, cap,
                     "HTTP/1.1 %d %s\r\nContent-Type: application/json\r\n%sConnection: close\r\n"
                     "Content-Length: %d\r\n\r\n%s",
                     status, i >= 0 ? statuses[i].reason : "Error", status == 503 ? "Retry-After: 1\r\n" : "",
                     bl, body);
    return n > 0 && (size_t)n < cap ? (size_t)n : 0;
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

/* The client's address as a 16-byte key and as text; whether it is a loopback address. */
static void peer_of(const struct sockaddr_storage *ss, unsigned char key[16], char *peer, size_t cap,
                    int *loopback)
{
    memset(key, 0, 16);
    snprintf(peer, cap, "?");
    *loopback = 0;
    if (ss->ss_family == AF_INET) {
        const struct sockaddr_in *a = (const struct sockaddr_in *)ss;
        key[10] = key[11] = 0xff;
        memcpy(key + 12, &a->sin_addr, 4);
        uv_ip4_name(a, peer, cap);
        *loopback = key[12] == 127;
    } else if (ss->ss_family == AF_INET6) {
        const struct sockaddr_in6 *a = (const struct sockaddr_in6 *)ss;
        memcpy(key, &a->sin6_addr, 16);
        static const unsigned char mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
        static const unsigned char lo6[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1};
        if (!memcmp(key, mapped, 12)) {
            struct sockaddr_in v4 = {.sin_family = AF_INET};
            memcpy(&v4.sin_addr, key + 12, 4);
            uv_ip4_name(&v4, peer, cap);
            *loopback = key[12] == 127;
        } else {
            uv_ip6_name(a, peer, cap);
            *loopback = !memcmp(key, lo6, 16);
        }
    }
}

/* Bytes the kernel has received on the socket since it was opened (0 when unknown): Linux's tcp_info field
 * tcpi_bytes_received (since 4.1), at byte 128 of the struct; glibc's struct tcp_info stops before it. */
#define TCPI_BYTES_RECEIVED_OFFSET 128
static uint64_t rx_bytes(int fd)
{
    unsigned char ti[256];
    socklen_t len = sizeof ti;
    if (getsockopt(fd, IPPROTO_TCP, TCP_INFO, ti, &len)) return 0;
    if (len < TCPI_BYTES_RECEIVED_OFFSET + 8) return 0;
    uint64_t v;
    memcpy(&v, ti + TCPI_BYTES_RECEIVED_OFFSET, 8);
    return v;
}

/* ---- refused connections: answer, shut down, drain, close ---- */

static void linger_closed(uv_handle_t *hd)
{
    struct linger_conn *l = hd->data;
    struct http_server *s = l->srv;
    if (l->prev)
        l->prev->next = l->next;
    else
        s->lingers = l->next;
    if (l->next) l->next->prev = l->prev;
    s->n_linger--;
    free(l);
}

static void linger_close(struct linger_conn *l)
{
    if (l->closing) return;
    l->closing = 1;
    uv_close((uv_handle_t *)&l->tcp, linger_closed);
}

static void linger_shut(uv_shutdown_t *sh, int status)
{
    if (status < 0) linger_close(sh->data);
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
    if (n < 0) linger_close(st->data);
}

/* Closes fd gracefully (taken over): our side is shut down after what was written, and the client's bytes are
 * read and dropped until it closes or LINGER_SECONDS pass. */
static void linger_fd(struct http_server *s, int fd)
{
    struct linger_conn *l = s->n_linger < HTTP_LINGER_MAX && !s->closed ? calloc(1, sizeof *l) : NULL;
    if (!l || uv_tcp_init(s->loop, &l->tcp)) {
        free(l);
        shutdown(fd, SHUT_WR);
        close(fd);
        return;
    }
    l->tcp.data = l;
    l->srv = s;
    l->t_start = now_s();
    l->next = s->lingers;
    if (s->lingers) s->lingers->prev = l;
    s->lingers = l;
    s->n_linger++;
    if (uv_tcp_open(&l->tcp, fd)) {
        close(fd);
        linger_close(l);
        return;
    }
    l->shut.data = l;
    if (uv_shutdown(&l->shut, (uv_stream_t *)&l->tcp, linger_shut) ||
        uv_read_start((uv_stream_t *)&l->tcp, linger_alloc, linger_read))
        linger_close(l);
}

/* Writes `resp` on a freshly accepted fd and closes it gracefully; the fd is taken over. */
static void refuse_fd(struct http_server *s, int fd, const char *resp, size_t len)
{
    if (len) send(fd, resp, len, MSG_NOSIGNAL | MSG_DONTWAIT);
    linger_fd(s, fd);
}

/* ---- the request's end, and work deferred until MHD_run has returned ---- */

/* Ends the application's request (once). */
static void end_request(struct http_req *c, int aborted)
{
    if (!c->app_active) return;
    c->app_active = 0;
    if (c->srv->h.on_end) c->srv->h.on_end(c, aborted, c->srv->h.user);
    c->app = NULL;
}

static void defer(struct http_req *c)
{
    if (c->deferred) return;
    c->deferred = 1;
    c->dnext = c->srv->deferred;
    c->srv->deferred = c;
}

static void undefer(struct http_req *c)
{
    if (!c->deferred) return;
    for (struct http_req **pp = &c->srv->deferred; *pp; pp = &(*pp)->dnext)
        if (*pp == c) {
            *pp = c->dnext;
            break;
        }
    c->deferred = 0;
}

static void dpoll_closed(uv_handle_t *hd)
{
    free(hd->data);
}

static void conn_resume(struct http_req *c)
{
    if (!c->suspended) return;
    c->suspended = 0;
    if (c->dpoll_active) {
        uv_poll_stop(&c->dpoll);
        c->dpoll_active = 0;
    }
    MHD_resume_connection(c->mc);
    mhd_kick(c->srv);
}

/* The client hung up while its connection was suspended: end the request now; MHD closes the connection
 * when it is resumed (the handler refuses to go on, the stream ends with an error). */
static void on_client_gone(uv_poll_t *p, int status, int events)
{
    struct http_req *c = p->data;
    (void)status, (void)events;
    if (c->dpoll_active) {
        uv_poll_stop(&c->dpoll);
        c->dpoll_active = 0;
    }
    c->cut = 1;
    shutdown(c->fd, SHUT_RDWR);
    end_request(c, 1);
    conn_resume(c);
}

static void conn_suspend(struct http_req *c)
{
    if (c->suspended || c->cut) return;
    MHD_suspend_connection(c->mc);
    c->suspended = 1;
    if (!c->dpoll_init) {
        if (uv_poll_init_socket(c->srv->loop, &c->dpoll, c->fd)) return;
        c->dpoll.data = c;
        c->dpoll_init = 1;
    }
    if (uv_poll_start(&c->dpoll, UV_DISCONNECT, on_client_gone) == 0) c->dpoll_active = 1;
}

/* Cuts a connection that MHD owns: an optional raw answer (only where nothing of the current request has been
 * sent), then shutdown, which MHD reads as the client's end and closes. */
static void conn_cut(struct http_req *c, const char *resp, size_t len)
{
    if (c->cut) return;
    if (len) send(c->fd, resp, len, MSG_NOSIGNAL | MSG_DONTWAIT);
    c->cut = 1;
    shutdown(c->fd, SHUT_RDWR);
    end_request(c, 1);
    conn_resume(c);
    mhd_kick(c->srv);
}

/* ---- responses ---- */

/* Queues r and lets go of our reference (the shared out-of-memory answer keeps the server's). */
static int queue_now(struct http_req *c, unsigned status, struct MHD_Response *r)
{
    int ok = MHD_queue_response(c->mc, status, r) == MHD_YES;
    if (r != c->srv->resp_oom) MHD_destroy_response(r);
    return ok;
}

/* Hands an answer to MHD: at once from the access handler or on a suspended connection (which is resumed),
 * else kept until the handler runs again. */
static int conn_answer(struct http_req *c, unsigned status, struct MHD_Response *r)
{
    struct http_server *s = c->srv;
    c->responded = 1;
    if (c->in_handler && !c->hold) return queue_now(c, status, r) ? 0 : FERRY_ERR_IO;
    if (c->suspended) {
        int ok = queue_now(c, status, r);
        conn_resume(c);
        if (!ok) {
            c->cut = 1; /* the handler refuses to go on: MHD closes */
            end_request(c, 1);
            return FERRY_ERR_IO;
        }
        return 0;
    }
    if (c->pending && c->pending != s->resp_oom) MHD_destroy_response(c->pending);
    c->pending = r;
    c->pending_status = status;
    mhd_kick(s);
    return 0;
}

static struct MHD_Response *oom_response(struct http_req *c)
{
    c->close_after = 1;
    return c->srv->resp_oom;
}

static void add_headers(struct http_req *c, struct MHD_Response *r, const struct http_hdr *h, int n)
{
    for (int i = 0; i < n; i++) MHD_add_response_header(r, h[i].name, h[i].value);
    if (c->srv->draining || c->close_after) MHD_add_response_header(r, MHD_HTTP_HEADER_CONNECTION, "close");
}

static int can_answer(const struct http_req *c)
{
    return c->mc && !c->cut && !c->responded && c->app_active;
}

int http_respond(struct http_req *c, int status, const struct http_hdr *h, int n, char *body, size_t len)
{
    if (!can_answer(c)) {
        free(body);
        return FERRY_ERR_INVALID;
    }
    struct MHD_Response *r = MHD_create_response_from_buffer(
        len, body ? body : (char *)"", body ? MHD_RESPMEM_MUST_FREE : MHD_RESPMEM_PERSISTENT);
    if (!r) {
        free(body);
        int rc = conn_answer(c, 503, oom_response(c));
        end_request(c, 1);
        return rc ? rc : FERRY_ERR_NOMEM;
    }
    add_headers(c, r, h, n);
    return conn_answer(c, (unsigned)status, r);
}

/* MHD wants more of a streamed answer: what is queued, the end, or (nothing queued yet) a suspension until
 * http_stream_write or http_stream_end. */
static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max)
{
    struct http_req *c = cls;
    (void)pos;
    if (c->cut) return MHD_CONTENT_READER_END_WITH_ERROR;
    size_t have = c->out_len - c->out_off;
    if (have == 0) {
        if (c->out_end) return c->out_err ? MHD_CONTENT_READER_END_WITH_ERROR : MHD_CONTENT_READER_END_OF_STREAM;
        conn_suspend(c); /* returning 0 alone would have MHD ask again at once: a busy loop */
        return 0;
    }
    size_t n = have < max ? have : max;
    memcpy(buf, c->out + c->out_off, n);
    c->out_off += n;
    if (c->out_off == c->out_len) {
        c->out_off = c->out_len = 0;
        if (!c->out_end && c->app_active) {
            c->drain_wanted = 1;
            defer(c);
        }
    }
    return (ssize_t)n;
}

int http_stream_begin(struct http_req *c, int status, const struct http_hdr *h, int n)
{
    if (!can_answer(c)) return FERRY_ERR_INVALID;
    struct MHD_Response *r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, STREAM_BLOCK, stream_read, c,
                                                               NULL);
    if (!r) {
        conn_answer(c, 503, oom_response(c));
        end_request(c, 1);
        return FERRY_ERR_NOMEM;
    }
    if (c->http10) c->close_after = 1; /* HTTP/1.0: the body ends when the connection does */
    add_headers(c, r, h, n);
    c->streaming = 1;
    return conn_answer(c, (unsigned)status, r);
}

int http_stream_write(struct http_req *c, const char *p, size_t len)
{
    if (!c->streaming || c->cut || c->out_end || !c->app_active) return FERRY_ERR_INVALID;
    if (len == 0) return 0;
    if (c->out_off && c->out_len + len > c->out_cap) { /* reclaim what MHD has taken */
        memmove(c->out, c->out + c->out_off, c->out_len - c->out_off);
        c->out_len -= c->out_off;
        c->out_off = 0;
    }
    if (c->out_len + len > c->out_cap) {
        size_t cap = c->out_cap ? c->out_cap : 4096;
        while (cap < c->out_len + len) cap *= 2;
        char *o = realloc(c->out, cap);
        if (!o) { /* what is queued goes out, then the stream is cut (its head is sent: never a bare close) */
            c->out_end = c->out_err = 1;
            conn_resume(c);
            return FERRY_ERR_NOMEM;
        }
        c->out = o;
        c->out_cap = cap;
    }
    memcpy(c->out + c->out_len, p, len);
    c->out_len += len;
    conn_resume(c);
    return 0;
}

int http_stream_end(struct http_req *c)
{
    if (!c->streaming || c->cut || c->out_end || !c->app_active) return FERRY_ERR_INVALID;
    c->out_end = 1;
    conn_resume(c);
    return 0;
}

size_t http_req_unsent(const struct http_req *c)
{
    return c->cut ? 0 : c->out_len - c->out_off;
}

/* A refusal from this layer, before the application saw the request: JSON, and the connection closes. */
static enum MHD_Result refuse(struct http_req *c, unsigned status, const char *why)
{
    struct http_server *s = c->srv;
    s->st.protocol_errors++;
    FLOG_INFO("http: %u to %s: %s", status, c->peer, why);
    char body[400];
    int bl = error_json(body, sizeof body, (int)status, why);
    struct MHD_Response *r = MHD_create_response_from_buffer((size_t)bl, body, MHD_RESPMEM_MUST_COPY);
    if (!r) {
        r = oom_response(c);
    } else {
        MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "application/json");
        MHD_add_response_header(r, MHD_HTTP_HEADER_CONNECTION, "close");
    }
    c->responded = 1;
    return queue_now(c, status, r) ? MHD_YES : MHD_NO;
}

/* ---- MHD's callbacks ---- */

struct field_counts {
    int content_length, transfer_encoding, host;
    int bad_name, bad_value;
};

/* RFC 9110 token characters (a field name) */
static int is_tchar(unsigned char ch)
{
    return (ch >= '0' && ch <= '9') || (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') ||
           (ch && strchr("!#$%&'*+-.^_`|~", ch));
}

static enum MHD_Result count_field(void *cls, enum MHD_ValueKind kind, const char *key, const char *value)
{
    struct field_counts *n = cls;
    (void)kind;
    /* MHD keeps "Name : v" as a field "Name " and lets a lone CR through in a value: a proxy in front may
     * read those differently (request smuggling) */
    if (!*key) n->bad_name++;
    for (const unsigned char *p = (const unsigned char *)key; *p; p++)
        if (!is_tchar(*p)) n->bad_name++;
    for (const unsigned char *p = (const unsigned char *)(value ? value : ""); *p; p++)
        if (*p == '\r' || *p == '\n') n->bad_value++;
    if (!strcasecmp(key, MHD_HTTP_HEADER_CONTENT_LENGTH)) n->content_length++;
    if (!strcasecmp(key, MHD_HTTP_HEADER_TRANSFER_ENCODING)) n->transfer_encoding++;
    if (!strcasecmp(key, MHD_HTTP_HEADER_HOST)) n->host++;
    return MHD_YES;
}

/* The head has arrived: the framing and expectation checks MHD leaves to the application, then on_head. */
static enum MHD_Result head_arrived(struct http_req *c, const char *url, const char *method,
                                    const char *version)
{
    struct http_server *s = c->srv;
    c->state = C_BODY;
    c->fresh = 0;
    c->t_start = c->t_last = now_s();
    snprintf(c->method, sizeof c->method, "%s", method);
    if ((size_t)snprintf(c->path, sizeof c->path, "%s", url) >= sizeof c->path) c->path[0] = 0;
    c->http10 = !strcmp(version, MHD_HTTP_VERSION_1_0);
    struct field_counts n = {0};
    MHD_get_connection_values(c->mc, MHD_HEADER_KIND, count_field, &n);
    const char *te = MHD_lookup_connection_value(c->mc, MHD_HEADER_KIND, MHD_HTTP_HEADER_TRANSFER_ENCODING);
    const char *cl = MHD_lookup_connection_value(c->mc, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
    const char *ex = MHD_lookup_connection_value(c->mc, MHD_HEADER_KIND, MHD_HTTP_HEADER_EXPECT);
    /* request smuggling: a proxy in front may frame such a request differently */
    if (n.bad_name) return refuse(c, 400, "a malformed header field name");
    if (n.bad_value) return refuse(c, 400, "a CR or LF in a header field value");
    if (n.content_length > 1) return refuse(c, 400, "more than one Content-Length");
    if (n.content_length && n.transfer_encoding)
        return refuse(c, 400, "Content-Length together with Transfer-Encoding");
    if (n.transfer_encoding > 1 || (te && strcasecmp(te, "chunked")))
        return refuse(c, 501, "the only transfer coding accepted is one chunked");
    if (n.host > 1) return refuse(c, 400, "more than one Host");
    if (!n.host && !c->http10) return refuse(c, 400, "an HTTP/1.1 request needs a Host");
    if (te && c->http10) return refuse(c, 400, "Transfer-Encoding in an HTTP/1.0 request");
    if (ex && strcasecmp(ex, "100-continue")) return refuse(c, 417, "the only expectation met is 100-continue");
    if (cl) {
        char *end;
        errno = 0;
        unsigned long long v = strtoull(cl, &end, 10);
        if (cl[0] < '0' || cl[0] > '9' || *end || errno) return refuse(c, 400, "a malformed Content-Length");
        if (v > (unsigned long long)s->p.body_limit)
            return refuse(c, 413, "the request body is larger than the limit (--body-limit)");
    }
    const char *conn = MHD_lookup_connection_value(c->mc, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONNECTION);
    c->close_after = conn && strcasestr(conn, "close") != NULL;
    /* MHD closes a connection answered before its request has been read whole; a body that is absent or
     * small (and not waiting for a 100 Continue) is read and dropped instead, so that the connection stays */
    c->hold = !te && !ex && (!cl || strtoull(cl, NULL, 10) <= 65536);
    c->app_active = 1;
    c->app = NULL;
    if (s->h.on_head) s->h.on_head(c, s->h.user);
    return c->cut ? MHD_NO : MHD_YES;
}

static enum MHD_Result on_access(void *cls, struct MHD_Connection *mc, const char *url, const char *method,
                                 const char *version, const char *upload_data, size_t *upload_data_size,
                                 void **con_cls)
{
    struct http_server *s = cls;
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(mc, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    struct http_req *c = ci ? ci->socket_context : NULL;
    if (!c || c->cut || s->closed) return MHD_NO;
    enum MHD_Result ret = MHD_YES;
    c->in_handler = 1;
    if (!*con_cls) { /* the head */
        *con_cls = c;
        ret = head_arrived(c, url, method, version);
        goto out;
    }
    if (*upload_data_size) { /* a piece of the body */
        size_t n = *upload_data_size;
        *upload_data_size = 0;
        c->t_last = now_s();
        if (c->responded || c->refusal) goto out;
        char *b = NULL;
        size_t cap = c->body_cap ? c->body_cap : 1024;
        if (c->body_len + n <= (size_t)s->p.body_limit && c->body_len + n + 1 > c->body_cap) {
            while (cap < c->body_len + n + 1) cap *= 2;
            b = realloc(c->body, cap);
        }
        if (c->body_len + n > (size_t)s->p.body_limit || (c->body_len + n + 1 > c->body_cap && !b)) {
            /* an answer cannot be queued from here: suspend, and queue it once MHD_run returns */
            c->refusal = c->body_len + n > (size_t)s->p.body_limit ? 413 : 503;
            free(c->body);
            c->body = NULL;
            c->body_len = c->body_cap = 0;
            conn_suspend(c);
            defer(c);
            goto out;
        }
        if (b) {
            c->body = b;
            c->body_cap = cap;
        }
        memcpy(c->body + c->body_len, upload_data, n);
        c->body_len += n;
        c->body[c->body_len] = 0;
        goto out;
    }
    /* the whole request is here, or the connection was resumed */
    c->hold = 0;
    int whole = c->state == C_BODY; /* the request has just been read whole */
    c->state = C_APP;
    if (c->pending) {
        struct MHD_Response *r = c->pending;
        c->pending = NULL;
        ret = queue_now(c, c->pending_status, r) ? MHD_YES : MHD_NO;
        goto out;
    }
    if (c->refusal && !c->responded) {
        ret = c->refusal == 413 ? refuse(c, 413, "the request body is larger than the limit (--body-limit)")
                                : (queue_now(c, 503, oom_response(c)) ? MHD_YES : MHD_NO);
        c->responded = 1;
        goto out;
    }
    if (c->responded) goto out; /* (a stream's connection resumed: MHD goes on with the answer) */
    if (whole) {
        if (s->h.on_request) s->h.on_request(c, s->h.user);
        if (c->cut) {
            ret = MHD_NO;
            goto out;
        }
        if (c->responded) goto out;
    }
    if (!c->app_active) { /* ended without an answer (the application closed it) */
        ret = MHD_NO;
        goto out;
    }
    conn_suspend(c); /* the answer comes later: nothing to do until then */
out:
    c->in_handler = 0;
    return ret;
}

static void on_completed(void *cls, struct MHD_Connection *mc, void **con_cls,
                         enum MHD_RequestTerminationCode toe)
{
    struct http_server *s = cls;
    struct http_req *c = *con_cls;
    (void)mc;
    if (!c) return;
    *con_cls = NULL;
    if (toe == MHD_REQUEST_TERMINATED_TIMEOUT_REACHED && c->app_active && c->responded) {
        s->st.stalled_readers++;
        FLOG_INFO("http: %s took no response bytes for %.0fs: closing", c->peer, s->p.idle_timeout);
    }
    end_request(c, toe != MHD_REQUEST_TERMINATED_COMPLETED_OK);
    undefer(c);
    if (c->state == C_BODY && toe == MHD_REQUEST_TERMINATED_COMPLETED_OK && !c->cut) {
        /* answered before the body was read: MHD closes the socket now, which would reset a client that is
         * still sending (it would lose the answer). A second descriptor keeps the socket; it lingers. */
        int fd = dup(c->fd);
        if (fd >= 0) {
            shutdown(fd, SHUT_WR);
            linger_fd(s, fd);
        }
    }
    if (c->pending && c->pending != s->resp_oom) MHD_destroy_response(c->pending);
    c->pending = NULL;
    free(c->body);
    free(c->out);
    c->body = c->out = NULL;
    c->body_len = c->body_cap = c->out_off = c->out_len = c->out_cap = 0;
    c->refusal = c->responded = c->streaming = c->out_end = c->out_err = c->drain_wanted = c->close_after = 0;
    c->state = C_IDLE;
    c->t_last = now_s();
    c->rx_mark = rx_bytes(c->fd);
    if (s->draining && !c->cut) { /* the answer carried Connection: close; make sure of it */
        c->cut = 1;
        shutdown(c->fd, SHUT_RDWR);
    }
}

static void on_connection(void *cls, struct MHD_Connection *mc, void **socket_context,
                          enum MHD_ConnectionNotificationCode code)
{
    struct http_server *s = cls;
    if (code == MHD_CONNECTION_NOTIFY_STARTED) {
        struct http_req *c = s->adding;
        const union MHD_ConnectionInfo *ci = MHD_get_connection_info(mc, MHD_CONNECTION_INFO_CONNECTION_FD);
        if (!c || !ci || ci->connect_fd != c->fd) {
            for (c = s->conns; c && !(c->fd == (ci ? ci->connect_fd : -2) && !c->mc); c = c->next) {}
        }
        if (!c) return;
        s->adding = NULL;
        c->mc = mc;
        *socket_context = c;
        return;
    }
    struct http_req *c = *socket_context;
    if (!c) return;
    *socket_context = NULL;
    end_request(c, 1);
    undefer(c);
    if (c->prev)
        c->prev->next = c->next;
    else
        s->conns = c->next;
    if (c->next) c->next->prev = c->prev;
    s->n_open--;
    ip_release(s, c->ip);
    if (c->pending && c->pending != s->resp_oom) MHD_destroy_response(c->pending);
    free(c->body);
    free(c->out);
    if (c->dpoll_init) {
        if (c->dpoll_active) uv_poll_stop(&c->dpoll);
        uv_close((uv_handle_t *)&c->dpoll, dpoll_closed);
        return;
    }
    free(c);
}

/* ---- running MHD from the loop ---- */

static void run_deferred(struct http_server *s)
{
    while (s->deferred) {
        struct http_req *c = s->deferred;
        s->deferred = c->dnext;
        c->deferred = 0;
        if (c->cut) continue;
        if (c->refusal && !c->responded) {
            struct MHD_Response *r = NULL;
            if (c->refusal == 413) {
                s->st.protocol_errors++;
                FLOG_INFO("http: 413 to %s: the body passed --body-limit", c->peer);
                char body[300];
                int bl = error_json(body, sizeof body, 413,
                                    "the request body is larger than the limit (--body-limit)");
                r = MHD_create_response_from_buffer((size_t)bl, body, MHD_RESPMEM_MUST_COPY);
            }
            if (!r) {
                r = oom_response(c);
            } else {
                MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "application/json");
                MHD_add_response_header(r, MHD_HTTP_HEADER_CONNECTION, "close");
            }
            c->responded = 1;
            if (!queue_now(c, (unsigned)(r == s->resp_oom ? 503 : 413), r))
                c->responded = 0; /* the body is read to its end and the answer queued then */
            conn_resume(c);
            continue;
        }
        if (c->drain_wanted) {
            c->drain_wanted = 0;
            if (c->app_active && s->h.on_drain) s->h.on_drain(c, s->h.user);
        }
    }
}

static void on_mhd_timer(uv_timer_t *t);

/* MHD_run until no deferred work is left, then the timer from MHD_get_timeout. */
static void mhd_pump(struct http_server *s)
{
    if (!s->d || s->in_run) return;
    for (int i = 0; i < 8; i++) {
        s->in_run = 1;
        MHD_run(s->d);
        s->in_run = 0;
        if (!s->deferred) break;
        run_deferred(s);
    }
    if (s->closed) return;
    MHD_UNSIGNED_LONG_LONG ms = 0;
    if (MHD_get_timeout(s->d, &ms) == MHD_YES)
        uv_timer_start(&s->mhd_timer, on_mhd_timer, ms > 3600000 ? 3600000 : ms, 0);
    else
        uv_timer_stop(&s->mhd_timer);
}

static void on_mhd_timer(uv_timer_t *t)
{
    mhd_pump(t->data);
}

static void on_mhd_events(uv_poll_t *p, int status, int events)
{
    (void)status, (void)events;
    mhd_pump(p->data);
}

/* MHD has work outside its sockets' readiness (a resumed connection): run it on the next loop turn. */
static void mhd_kick(struct http_server *s)
{
    if (!s->closed) uv_timer_start(&s->mhd_timer, on_mhd_timer, 0, 0);
}

/* ---- accepting ---- */

static void accept_one(struct http_server *s, int fd, const struct sockaddr_storage *ss, socklen_t sl)
{
    int one = 1, sndbuf = SNDBUF_BYTES;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    /* a fixed send buffer: the kernel's autotuning would let each client that stops reading pin ~4 MiB of
     * kernel memory (and hide the stall from MHD's timeout for as long) */
    setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &sndbuf, sizeof sndbuf);
    if (s->draining || s->closed) {
        close(fd);
        return;
    }
    if (s->n_open >= s->p.max_connections) {
        s->st.rejected_full++;
        refuse_fd(s, fd, s->canned_busy, s->canned_busy_len);
        return;
    }
    unsigned char key[16];
    char peer[INET6_ADDRSTRLEN];
    int lo;
    peer_of(ss, key, peer, sizeof peer, &lo);
    struct ip_entry *e = ip_find(s, key, 1);
    if (!e) {
        refuse_fd(s, fd, s->canned_oom, s->canned_oom_len);
        return;
    }
    if (s->p.max_per_ip > 0 && e->count >= s->p.max_per_ip) {
        s->st.rejected_per_ip++;
        refuse_fd(s, fd, s->canned_busy, s->canned_busy_len);
        return;
    }
    struct http_req *c = calloc(1, sizeof *c);
    if (!c) {
        if (e->count == 0) {
            e->count = 1;
            ip_release(s, e);
        }
        refuse_fd(s, fd, s->canned_oom, s->canned_oom_len);
        return;
    }
    e->count++;
    c->srv = s;
    c->fd = fd;
    c->ip = e;
    memcpy(c->ipkey, key, 16);
    memcpy(c->peer, peer, sizeof peer);
    c->loopback = lo;
    c->fresh = 1;
    c->t_start = c->t_last = now_s();
    c->next = s->conns;
    if (s->conns) s->conns->prev = c;
    s->conns = c;
    s->n_open++;
    s->st.accepted++;
    if (s->n_open > s->st.peak) s->st.peak = s->n_open;
    s->adding = c;
    s->in_run = 1;
    enum MHD_Result ok = MHD_add_connection(s->d, fd, (const struct sockaddr *)ss, sl);
    s->in_run = 0;
    if (ok != MHD_YES || !c->mc) { /* MHD closed the socket */
        if (c->mc) return; /* (its CLOSED notification released c) */
        s->adding = NULL;
        if (c->prev)
            c->prev->next = c->next;
        else
            s->conns = c->next;
        if (c->next) c->next->prev = c->prev;
        s->n_open--;
        ip_release(s, e);
        free(c);
        FLOG_WARN("http: MHD refused a connection from %s", peer);
    }
}

static void on_listen(uv_poll_t *p, int status, int events)
{
    struct http_server *s = p->data;
    (void)events;
    if (status < 0) return;
    for (int i = 0; i < ACCEPT_BATCH && s->lfd >= 0; i++) {
        struct sockaddr_storage ss;
        socklen_t sl = sizeof ss;
        int fd = accept4(s->lfd, (struct sockaddr *)&ss, &sl, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR && errno != ECONNABORTED)
                FLOG_WARN("http: accept: %s", strerror(errno));
            break;
        }
        accept_one(s, fd, &ss, sl);
    }
    mhd_pump(s);
}

/* ---- deadlines ---- */

static void on_sweep(uv_timer_t *t)
{
    struct http_server *s = t->data;
    const struct http_params *p = &s->p;
    double now = now_s();
    for (struct http_req *c = s->conns, *next; c; c = next) {
        next = c->next;
        if (c->cut || !c->mc) continue;
        if (c->state == C_IDLE || c->state == C_HEAD) {
            uint64_t rx = rx_bytes(c->fd);
            if (rx != c->rx_mark) {
                c->rx_mark = rx;
                if (c->state == C_IDLE) {
                    c->state = C_HEAD;
                    if (!c->fresh) c->t_start = now; /* a new connection's clock runs from the accept */
                }
                c->t_last = now;
            }
        }
        switch (c->state) {
        case C_IDLE:
            if (now - (c->fresh ? c->t_start : c->t_last) > (c->fresh ? p->header_timeout : p->idle_timeout)) {
                s->st.idle_closed++;
                conn_cut(c, NULL, 0);
            }
            break;
        case C_HEAD:
            if (now - c->t_start > p->header_timeout || now - c->t_last > p->idle_timeout) {
                s->st.head_timeouts++;
                FLOG_INFO("http: 408 to %s: the head did not arrive in time", c->peer);
                conn_cut(c, s->canned_408h, s->canned_408h_len);
            }
            break;
        case C_BODY:
            if (now - c->t_start > p->body_timeout || now - c->t_last > p->idle_timeout) {
                s->st.head_timeouts++;
                FLOG_INFO("http: 408 to %s: the body did not arrive in time", c->peer);
                conn_cut(c, c->responded ? NULL : s->canned_408b, c->responded ? 0 : s->canned_408b_len);
            }
            break;
        case C_APP:
            break;
        }
    }
    for (struct linger_conn *l = s->lingers, *next; l; l = next) {
        next = l->next;
        if (now - l->t_start > LINGER_SECONDS) linger_close(l);
    }
    mhd_pump(s);
}

/* ---- the server ---- */

static void mhd_panic(void *cls, const char *file, unsigned int line, const char *reason)
{
    (void)cls;
    FLOG_ERROR("libmicrohttpd: fatal error at %s:%u: %s", file ? file : "?", line, reason ? reason : "");
    abort(); /* a bug in MHD or in our use of it: nothing sane to go on with */
}

static int listen_on(struct http_server *s, const struct http_params *p, char err[256])
{
    struct addrinfo hints = {0}, *ai = NULL;
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
    char port[16];
    snprintf(port, sizeof port, "%d", p->port);
    int g = getaddrinfo(p->host, port, &hints, &ai);
    if (g) {
        snprintf(err, 256, "--host %s: %s", p->host, gai_strerror(g));
        return FERRY_ERR_INVALID;
    }
    int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0), one = 1;
    int rc = fd < 0 ? -1 : 0;
    if (rc == 0) setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (rc == 0) rc = bind(fd, ai->ai_addr, ai->ai_addrlen);
    if (rc == 0) rc = listen(fd, 1024);
    freeaddrinfo(ai);
    if (rc) {
        snprintf(err, 256, "cannot listen on %s:%d: %s", p->host, p->port, strerror(errno));
        if (fd >= 0) close(fd);
        return FERRY_ERR_IO;
    }
    s->lfd = fd;
    return 0;
}

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
    s->lfd = -1;
    s->canned_busy_len = canned(s->canned_busy, sizeof s->canned_busy, 503,
                                "the server has too many connections (--max-connections, "
                                "--max-connections-per-ip); retry later");
    s->canned_oom_len = canned(s->canned_oom, sizeof s->canned_oom, 503, "the server is out of memory");
    s->canned_408h_len = canned(s->canned_408h, sizeof s->canned_408h, 408,
                                "the request head did not arrive in time (--header-timeout)");
    s->canned_408b_len = canned(s->canned_408b, sizeof s->canned_408b, 408,
                                "the request body did not arrive in time (--body-timeout)");
    static const char oom[] = "{\"error\":{\"message\":\"the server is out of memory\",\"type\":"
                              "\"server_overloaded\",\"param\":null,\"code\":\"too_many_connections\"}}";
    s->resp_oom = MHD_create_response_from_buffer(sizeof oom - 1, (void *)oom, MHD_RESPMEM_PERSISTENT);
    if (!s->resp_oom) {
        snprintf(err, 256, "out of memory");
        free(s);
        return FERRY_ERR_NOMEM;
    }
    MHD_add_response_header(s->resp_oom, MHD_HTTP_HEADER_CONTENT_TYPE, "application/json");
    MHD_add_response_header(s->resp_oom, MHD_HTTP_HEADER_RETRY_AFTER, "1");
    MHD_add_response_header(s->resp_oom, MHD_HTTP_HEADER_CONNECTION, "close");
    int rc = listen_on(s, p, err);
    if (rc) {
        MHD_destroy_response(s->resp_oom);
        free(s);
        return rc;
    }
    MHD_set_panic_func(mhd_panic, NULL);
    /* MHD's own timeout is the idle one (a reader that takes nothing, a silent keep-alive connection); the
     * sweep's head, body and idle deadlines come first, this one a second later */
    unsigned idle = (unsigned)(p->idle_timeout + 0.999) + 1;
    s->d = MHD_start_daemon(MHD_USE_EPOLL | MHD_USE_NO_LISTEN_SOCKET | MHD_ALLOW_SUSPEND_RESUME |
                                MHD_USE_ERROR_LOG,
                            0, NULL, NULL, on_access, s, MHD_OPTION_NOTIFY_COMPLETED, on_completed, s,
                            MHD_OPTION_NOTIFY_CONNECTION, on_connection, s, MHD_OPTION_CONNECTION_TIMEOUT, idle,
                            MHD_OPTION_CONNECTION_LIMIT, (unsigned)(p->max_connections + 16),
                            MHD_OPTION_SIGPIPE_HANDLED_BY_APP, 1, MHD_OPTION_END);
    const union MHD_DaemonInfo *di = s->d ? MHD_get_daemon_info(s->d, MHD_DAEMON_INFO_EPOLL_FD) : NULL;
    if (!di) {
        snprintf(err, 256, "cannot start libmicrohttpd");
        if (s->d) MHD_stop_daemon(s->d);
        close(s->lfd);
        MHD_destroy_response(s->resp_oom);
        free(s);
        return FERRY_ERR_IO;
    }
    uv_timer_init(loop, &s->mhd_timer);
    s->mhd_timer.data = s;
    uv_timer_init(loop, &s->sweep);
    s->sweep.data = s;
    uv_timer_start(&s->sweep, on_sweep, SWEEP_MS, SWEEP_MS);
    if (uv_poll_init(loop, &s->epoll_poll, di->epoll_fd) == 0) {
        s->epoll_init = 1;
        s->epoll_poll.data = s;
        uv_poll_start(&s->epoll_poll, UV_READABLE, on_mhd_events);
    }
    if (uv_poll_init_socket(loop, &s->lpoll, s->lfd) == 0) {
        s->lpoll_init = 1;
        s->lpoll.data = s;
        uv_poll_start(&s->lpoll, UV_READABLE, on_listen);
    }
    *out = s;
    return 0;
}

int http_server_port(const struct http_server *s)
{
    struct sockaddr_storage ss;
    socklen_t len = sizeof ss;
    if (s->lfd < 0 || getsockname(s->lfd, (struct sockaddr *)&ss, &len)) return -1;
    return ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
                                          : ((struct sockaddr_in *)&ss)->sin_port);
}

static void stop_listening(struct http_server *s)
{
    if (s->lpoll_init) {
        uv_poll_stop(&s->lpoll);
        uv_close((uv_handle_t *)&s->lpoll, NULL);
        s->lpoll_init = 0;
    }
    if (s->lfd >= 0) close(s->lfd); /* (after the poll stopped watching it) */
    s->lfd = -1;
}

void http_server_drain(struct http_server *s)
{
    s->draining = 1;
    stop_listening(s);
    for (struct http_req *c = s->conns, *next; c; c = next) {
        next = c->next;
        if (c->state == C_IDLE && c->mc) conn_cut(c, NULL, 0);
    }
}

void http_server_close(struct http_server *s)
{
    if (!s || s->closed) return;
    stop_listening(s);
    for (struct http_req *c = s->conns; c; c = c->next) {
        c->cut = 1;
        if (c->fd >= 0) shutdown(c->fd, SHUT_RDWR);
        end_request(c, 1);
        conn_resume(c);
    }
    mhd_pump(s); /* resumed connections are taken back and closed by MHD */
    s->closed = 1;
    uv_timer_stop(&s->sweep);
    uv_close((uv_handle_t *)&s->sweep, NULL);
    uv_timer_stop(&s->mhd_timer);
    uv_close((uv_handle_t *)&s->mhd_timer, NULL);
    if (s->epoll_init) {
        uv_poll_stop(&s->epoll_poll);
        uv_close((uv_handle_t *)&s->epoll_poll, NULL);
        s->epoll_init = 0;
    }
    for (struct http_req *c = s->conns; c; c = c->next)
        if (c->dpoll_init) { /* the handle goes with the loop; c is freed by MHD_stop_daemon's notifications */
            if (c->dpoll_active) uv_poll_stop(&c->dpoll);
            uv_close((uv_handle_t *)&c->dpoll, NULL);
            c->dpoll_active = c->dpoll_init = 0;
        }
    for (struct linger_conn *l = s->lingers; l; l = l->next) linger_close(l);
}

void http_server_free(struct http_server *s)
{
    if (!s) return;
    if (s->d) MHD_stop_daemon(s->d); /* closes what is left; its notifications release the connections */
    while (s->conns) { /* any MHD never told us about */
        struct http_req *c = s->conns;
        s->conns = c->next;
        free(c->body);
        free(c->out);
        free(c);
    }
    for (int i = 0; i < IP_BUCKETS; i++)
        for (struct ip_entry *e = s->ips[i], *n; e; e = n) {
            n = e->next;
            free(e);
        }
    if (s->resp_oom) MHD_destroy_response(s->resp_oom);
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
    return q->method;
}
const char *http_req_path(const struct http_req *q)
{
    return q->path;
}
const char *http_req_header(const struct http_req *q, const char *name)
{
    return q->mc && q->app_active ? MHD_lookup_connection_value(q->mc, MHD_HEADER_KIND, name) : NULL;
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
    conn_cut(q, NULL, 0);
}
void http_req_refuse_nomem(struct http_req *q)
{
    if (q->mc && !q->cut && !q->responded)
        conn_answer(q, 503, oom_response(q));
    else
        conn_cut(q, NULL, 0);
    end_request(q, 1);
}
