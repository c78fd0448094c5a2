/* http_conn — a connection's request on top of libmicrohttpd: MHD's callbacks (the head, the body, the end,
 * the connection's start and close), the application's answers and streams, and the http.h request API.
 *
 * A struct http_req is the connection (states in server/http_impl.h). The application answers once; an answer
 * given outside MHD's access handler waits in `pending` (or is queued on the suspended connection, which is
 * resumed). What a callback cannot do inside MHD_run (a refusal of the body, on_drain) is deferred and run by
 * http_conn_run_deferred once MHD_run has returned. A connection with nothing to write is suspended, and a
 * uv_poll notices the client leaving meanwhile. Loop thread only.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "kernels/core/log.h"
#include "kernels/core/status.h"
#include "server/http.h"
#include "server/http_check.h"
#include "server/http_door.h"
#include "server/http_impl.h"

#define STREAM_BLOCK (16 * 1024) /* MHD's buffer for a streamed answer's pieces */

/* ---- the request's end, and work deferred until MHD_run has returned ---- */

/* Ends the application's request (once). */
void http_conn_end(struct http_req *c, int aborted)
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

void http_conn_resume(struct http_req *c)
{
    if (!c->suspended) return;
    c->suspended = 0;
    if (c->dpoll_active) {
        uv_poll_stop(&c->dpoll);
        c->dpoll_active = 0;
    }
    MHD_resume_connection(c->mc);
    http_server_kick(c->srv);
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
    http_conn_end(c, 1);
    http_conn_resume(c);
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
void http_conn_cut(struct http_req *c, const char *resp, size_t len)
{
    if (c->cut) return;
    if (len) send(c->fd, resp, len, MSG_NOSIGNAL | MSG_DONTWAIT);
    c->cut = 1;
    shutdown(c->fd, SHUT_RDWR);
    http_conn_end(c, 1);
    http_conn_resume(c);
    http_server_kick(c->srv);
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
        http_conn_resume(c);
        if (!ok) {
            c->cut = 1; /* the handler refuses to go on: MHD closes */
            http_conn_end(c, 1);
            return FERRY_ERR_IO;
        }
        return 0;
    }
    if (c->pending && c->pending != s->resp_oom) MHD_destroy_response(c->pending);
    c->pending = r;
    c->pending_status = status;
    http_server_kick(s);
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
        http_conn_end(c, 1);
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
        if (c->out_end)
            return c->out_err ? MHD_CONTENT_READER_END_WITH_ERROR : MHD_CONTENT_READER_END_OF_STREAM;
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
    struct MHD_Response *r =
        MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, STREAM_BLOCK, stream_read, c, NULL);
    if (!r) {
        conn_answer(c, 503, oom_response(c));
        http_conn_end(c, 1);
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
            http_conn_resume(c);
            return FERRY_ERR_NOMEM;
        }
        c->out = o;
        c->out_cap = cap;
    }
    memcpy(c->out + c->out_len, p, len);
    c->out_len += len;
    http_conn_resume(c);
    return 0;
}

int http_stream_end(struct http_req *c)
{
    if (!c->streaming || c->cut || c->out_end || !c->app_active) return FERRY_ERR_INVALID;
    c->out_end = 1;
    http_conn_resume(c);
    return 0;
}

size_t http_req_unsent(const struct http_req *c)
{
    return c->cut ? 0 : c->out_len - c->out_off;
}

/* An error answer of this layer: JSON, and the connection closes (the shared 503 when none can be made). */
static struct MHD_Response *error_response(struct http_req *c, unsigned status, const char *why)
{
    c->srv->st.protocol_errors++;
    FLOG_INFO("http: %u to %s: %s", status, c->peer, why);
    char body[400];
    int bl = http_door_error_json(body, sizeof body, (int)status, why);
    struct MHD_Response *r = MHD_create_response_from_buffer((size_t)bl, body, MHD_RESPMEM_MUST_COPY);
    if (!r) return oom_response(c);
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "application/json");
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONNECTION, "close");
    return r;
}

/* A refusal from this layer, before the application saw the request. */
static enum MHD_Result refuse(struct http_req *c, unsigned status, const char *why)
{
    struct MHD_Response *r = error_response(c, status, why);
    c->responded = 1;
    return queue_now(c, r == c->srv->resp_oom ? 503 : status, r) ? MHD_YES : MHD_NO;
}

/* ---- MHD's callbacks ---- */

/* The head has arrived: the framing and expectation checks MHD leaves to the application
 * (server/http_check.c), then on_head. */
static enum MHD_Result head_arrived(struct http_req *c, const char *url, const char *method,
                                    const char *version)
{
    struct http_server *s = c->srv;
    c->state = C_BODY;
    c->fresh = 0;
    c->t_start = c->t_last = http_now_s();
    snprintf(c->method, sizeof c->method, "%s", method);
    if ((size_t)snprintf(c->path, sizeof c->path, "%s", url) >= sizeof c->path) c->path[0] = 0;
    c->http10 = !strcmp(version, MHD_HTTP_VERSION_1_0);
    const char *why = NULL;
    int refused = http_check_head(c->mc, method, c->http10, s->p.body_limit, &why);
    if (refused) return refuse(c, (unsigned)refused, why);
    const char *te = MHD_lookup_connection_value(c->mc, MHD_HEADER_KIND, MHD_HTTP_HEADER_TRANSFER_ENCODING);
    const char *cl = MHD_lookup_connection_value(c->mc, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
    const char *ex = MHD_lookup_connection_value(c->mc, MHD_HEADER_KIND, MHD_HTTP_HEADER_EXPECT);
    const char *conn = MHD_lookup_connection_value(c->mc, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONNECTION);
    c->close_after = conn && strcasestr(conn, "close") != NULL;
    /* MHD closes a connection answered before its request has been read whole; a body that is absent or
     * small (and not waiting for a 100 Continue) is read and dropped instead, so that the connection stays */
    c->hold = !te && !ex && (!cl || strtoull(cl, NULL, 10) <= 65536);
    const union MHD_ConnectionInfo *hi =
        MHD_get_connection_info(c->mc, MHD_CONNECTION_INFO_REQUEST_HEADER_SIZE);
    c->chunked = te != NULL;
    c->chunk_lost = !hi;
    c->chunk_left = 0;
    c->head_end = hi ? method + hi->header_size : NULL;
    c->app_active = 1;
    c->app = NULL;
    if (s->h.on_head) s->h.on_head(c, s->h.user);
    return c->cut ? MHD_NO : MHD_YES;
}

/* A piece of a chunked body (n bytes at data, MHD's buffer): whether its chunk was declared larger than what
 * is left of the body limit. The first piece of each chunk follows the chunk's line in MHD's buffer, where
 * http_check_chunk_line reads the size; where it is not found the shadow stops and the limit is checked as
 * the bytes come (a client could otherwise hold the connection on a chunk it never sends). */
static int chunk_over_limit(struct http_req *c, const char *data, size_t n)
{
    if (!c->chunked || c->chunk_lost) return 0;
    if (c->chunk_left == 0 && !http_check_chunk_line(data, c->head_end, &c->chunk_left)) {
        c->chunk_lost = 1;
        return 0;
    }
    if (c->chunk_left > (uint64_t)c->srv->p.body_limit - c->body_len) return 1;
    if (n > c->chunk_left) { /* a piece past its chunk: not the layout looked for */
        c->chunk_lost = 1;
        return 0;
    }
    c->chunk_left -= n;
    return 0;
}

enum MHD_Result http_conn_on_access(void *cls, struct MHD_Connection *mc, const char *url, const char *method,
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
        c->t_last = http_now_s();
        if (c->responded || c->refusal) goto out;
        if (chunk_over_limit(c, upload_data, n)) {
            /* MHD takes no answer mid-body, and this body may never end: the answer goes out raw (nothing
             * of it was sent yet) and the connection closes */
            s->st.protocol_errors++;
            FLOG_INFO("http: 413 to %s: a chunk declared larger than the body limit", c->peer);
            http_conn_cut(c, s->canned_413chunk, s->canned_413chunk_len);
            ret = MHD_NO;
            goto out;
        }
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

void http_conn_on_completed(void *cls, struct MHD_Connection *mc, void **con_cls,
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
    http_conn_end(c, toe != MHD_REQUEST_TERMINATED_COMPLETED_OK);
    undefer(c);
    if (c->state == C_BODY && toe == MHD_REQUEST_TERMINATED_COMPLETED_OK && !c->cut) {
        /* answered before the body was read: MHD closes the socket now, which would reset a client that is
         * still sending (it would lose the answer). A second descriptor keeps the socket; it lingers. */
        int fd = dup(c->fd);
        if (fd >= 0) {
            shutdown(fd, SHUT_WR);
            http_door_linger_fd(s, fd);
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
    c->t_last = http_now_s();
    c->rx_mark = http_door_rx_bytes(c->fd);
    if (s->draining && !c->cut) { /* the answer carried Connection: close; make sure of it */
        c->cut = 1;
        shutdown(c->fd, SHUT_RDWR);
    }
}

void http_conn_on_connection(void *cls, struct MHD_Connection *mc, void **socket_context,
                             enum MHD_ConnectionNotificationCode code)
{
    struct http_server *s = cls;
    if (code == MHD_CONNECTION_NOTIFY_STARTED) {
        struct http_req *c = s->adding;
        const union MHD_ConnectionInfo *ci = MHD_get_connection_info(mc, MHD_CONNECTION_INFO_CONNECTION_FD);
        if (!c || !ci || ci->connect_fd != c->fd) {
            for (c = s->conns; c && !(c->fd == (ci ? ci->connect_fd : -2) && !c->mc); c = c->next) {
            }
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
    http_conn_end(c, 1);
    undefer(c);
    http_server_unlink(s, c);
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

/* ---- work deferred until MHD_run has returned ---- */

void http_conn_run_deferred(struct http_server *s)
{
    while (s->deferred) {
        struct http_req *c = s->deferred;
        s->deferred = c->dnext;
        c->deferred = 0;
        if (c->cut) continue;
        if (c->refusal && !c->responded) {
            struct MHD_Response *r =
                c->refusal == 413
                    ? error_response(c, 413, "the request body is larger than the limit (--body-limit)")
                    : oom_response(c);
            c->responded = 1;
            if (!queue_now(c, (unsigned)(r == s->resp_oom ? 503 : 413), r))
                c->responded = 0; /* the body is read to its end and the answer queued then */
            http_conn_resume(c);
            continue;
        }
        if (c->drain_wanted) {
            c->drain_wanted = 0;
            if (c->app_active && s->h.on_drain) s->h.on_drain(c, s->h.user);
        }
    }
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
    http_conn_cut(q, NULL, 0);
}
void http_req_refuse_nomem(struct http_req *q)
{
    if (q->mc && !q->cut && !q->responded)
        conn_answer(q, 503, oom_response(q));
    else
        http_conn_cut(q, NULL, 0);
    http_conn_end(q, 1);
}
