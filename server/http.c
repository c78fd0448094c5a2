/* http — libmicrohttpd driven from the libuv loop: ferry's listening socket and accept (with limits), MHD run
 * from the loop, the deadlines, and the server's life (init, drain, close, free, stats).
 *
 * Ownership: ferry owns the listening socket and the accept; a connection within the limits is handed to MHD
 * (MHD_add_connection) and from then on MHD owns its fd (parses, writes, closes). MHD runs in external mode
 * with epoll: its epoll fd is watched by a uv_poll and MHD_run is called when it is readable, when the timer
 * set from MHD_get_timeout fires, and after a suspended connection is resumed (the "kick"). Nothing runs on
 * another thread.
 * A 250 ms sweep enforces the head and body deadlines (408 JSON written raw on the fd, then shutdown: MHD
 * sees the end and closes) and the idle one; MHD's own timeout drops a reader that takes no bytes.
 * Connections past the limits are answered 503 straight from the accept and linger without entering MHD
 * (server/http_door.c). A connection's request, MHD's callbacks and the answers: server/http_conn.c; the
 * framing checks: server/http_check.c; the shared layouts and the connection states: server/http_impl.h.
 */
#include "server/http.h"

#include <errno.h>
#include <stdarg.h>
#include <fcntl.h>
#include <microhttpd.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include "kernels/core/log.h"
#include "kernels/core/status.h"
#include "server/http_door.h"
#include "server/http_fair.h"
#include "server/http_impl.h"

#define SWEEP_MS     250
#define SNDBUF_BYTES (128 * 1024) /* per connection; Linux doubles it */
#define ACCEPT_BATCH 64

/* ---- running MHD from the loop ---- */

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
        http_conn_run_deferred(s);
    }
    if (s->closed) return;
    MHD_UNSIGNED_LONG_LONG ms = 0;
    /* at least 1 ms: MHD says 0 for as long as a connection has work it cannot do (a chunk line that fills
     * its buffer), and a 0 ms timer re-armed from its own callback keeps libuv's timer run from ever
     * returning to the poll: the whole loop would stall until MHD times the connection out */
    if (MHD_get_timeout(s->d, &ms) == MHD_YES)
        uv_timer_start(&s->mhd_timer, on_mhd_timer, ms > 3600000 ? 3600000 : ms < 1 ? 1 : ms, 0);
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
void http_server_kick(struct http_server *s)
{
    if (!s->closed) uv_timer_start(&s->mhd_timer, on_mhd_timer, 0, 0);
}

/* ---- accepting ---- */

/* c leaves the open connections (accept_one linked it in) and its address's count. */
void http_server_unlink(struct http_server *s, struct http_req *c)
{
    if (c->prev)
        c->prev->next = c->next;
    else
        s->conns = c->next;
    if (c->next) c->next->prev = c->prev;
    s->n_open--;
    if (c->evicted) s->n_evicted--;
    http_door_ip_release(s, c->ip);
}

/* At the cap: the connection that gives way to a newcomer from `key` (server/http_fair.h), closed now (a
 * slow head or body gets the 503 the newcomer would have had). Returns 0 when none may. */
static int make_room(struct http_server *s, const unsigned char key[16])
{
    const struct ip_entry *ne = http_door_ip_find(s, key, 0);
    const int newcomer = ne ? ne->count : 0;
    const double now = http_now_s();
    struct http_req *victim = NULL;
    struct http_fair_cand best = {0};
    for (struct http_req *c = s->conns; c; c = c->next) {
        if (c->cut || !c->mc || !c->ip) continue;
        const struct http_fair_cand k = {
            .addr_count = c->ip->count,
            .activity = c->state == C_IDLE  ? HTTP_FAIR_IDLE
                        : c->state == C_APP ? HTTP_FAIR_WORKING
                                            : HTTP_FAIR_READING,
            .silent_s = now - (c->state == C_IDLE && c->fresh ? c->t_start : c->t_last),
        };
        if (http_fair_eligible(&k, newcomer) && (!victim || http_fair_prefer(&k, &best))) {
            victim = c;
            best = k;
        }
    }
    if (!victim) return 0;
    s->st.evicted++;
    victim->evicted = 1;
    s->n_evicted++;
    FLOG_DEBUG("http: closing a %s connection of %s (%d open from it) to let a new address in",
               victim->state == C_IDLE ? "idle" : "slow", victim->peer, best.addr_count);
    if (victim->state == C_IDLE)
        http_conn_cut(victim, NULL, 0);
    else
        http_conn_cut(victim, s->canned_busy, s->canned_busy_len);
    return 1;
}

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
    unsigned char key[16];
    char peer[INET6_ADDRSTRLEN];
    int lo;
    http_door_peer_of(ss, key, peer, sizeof peer, &lo);
    if (s->n_open - s->n_evicted >= s->p.max_connections && !make_room(s, key)) {
        s->st.rejected_full++;
        http_door_refuse_fd(s, fd, s->canned_busy, s->canned_busy_len);
        return;
    }
    struct ip_entry *e = http_door_ip_find(s, key, 1);
    if (!e) {
        http_door_refuse_fd(s, fd, s->canned_oom, s->canned_oom_len);
        return;
    }
    if (s->p.max_per_ip > 0 && e->count >= s->p.max_per_ip) {
        s->st.rejected_per_ip++;
        http_door_refuse_fd(s, fd, s->canned_busy, s->canned_busy_len);
        return;
    }
    struct http_req *c = calloc(1, sizeof *c);
    if (!c) {
        if (e->count == 0) {
            e->count = 1;
            http_door_ip_release(s, e);
        }
        http_door_refuse_fd(s, fd, s->canned_oom, s->canned_oom_len);
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
    c->t_start = c->t_last = http_now_s();
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
        if (c->mc) return;         /* (its CLOSED notification released c) */
        s->adding = NULL;
        http_server_unlink(s, c);
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

/* Reading a body, MHD stops taking bytes from the socket only when a line it must see whole (a chunk's size
 * and extensions) has filled its buffer: it would wait for the idle timeout and close without an answer.
 * Bytes that wait unread in the socket for STUCK_SWEEPS sweeps, with no piece of the body delivered
 * meanwhile, say so. */
#define STUCK_SWEEPS 4
static int parser_stuck(struct http_req *c, double now)
{
    int q = 0;
    if (c->responded || c->refusal || c->suspended || ioctl(c->fd, FIONREAD, &q) || q <= 0) {
        c->rxq_still = 0;
        c->rxq_mark = 0;
        return 0;
    }
    if ((uint64_t)q == c->rxq_mark && now - c->t_last >= STUCK_SWEEPS * SWEEP_MS / 1000.0)
        c->rxq_still++;
    else
        c->rxq_still = 0;
    c->rxq_mark = (uint64_t)q;
    return c->rxq_still >= STUCK_SWEEPS;
}

static void on_sweep(uv_timer_t *t)
{
    struct http_server *s = t->data;
    const struct http_params *p = &s->p;
    double now = http_now_s();
    for (struct http_req *c = s->conns, *next; c; c = next) {
        next = c->next;
        if (c->cut || !c->mc) continue;
        if (c->state == C_IDLE || c->state == C_HEAD) {
            uint64_t rx = http_door_rx_bytes(c->fd);
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
            if (now - (c->fresh ? c->t_start : c->t_last) >
                (c->fresh ? p->header_timeout : p->idle_timeout)) {
                s->st.idle_closed++;
                http_conn_cut(c, NULL, 0);
            }
            break;
        case C_HEAD:
            if (now - c->t_start > p->header_timeout || now - c->t_last > p->idle_timeout) {
                s->st.head_timeouts++;
                FLOG_INFO("http: 408 to %s: the head did not arrive in time", c->peer);
                http_conn_cut(c, s->canned_408h, s->canned_408h_len);
            }
            break;
        case C_BODY:
            if (parser_stuck(c, now)) {
                s->st.protocol_errors++;
                FLOG_INFO("http: 400 to %s: a chunk line longer than the parser's buffer", c->peer);
                http_conn_cut(c, s->canned_400line, s->canned_400line_len);
                break;
            }
            if (now - c->t_start > p->body_timeout || now - c->t_last > p->idle_timeout) {
                s->st.head_timeouts++;
                FLOG_INFO("http: 408 to %s: the body did not arrive in time", c->peer);
                http_conn_cut(c, c->responded ? NULL : s->canned_408b, c->responded ? 0 : s->canned_408b_len);
            }
            break;
        case C_APP:
            break;
        }
    }
    http_door_linger_expire(s, now);
    mhd_pump(s);
}

/* ---- the server ---- */

static void mhd_panic(void *cls, const char *file, unsigned int line, const char *reason)
{
    (void)cls;
    FLOG_ERROR("libmicrohttpd: fatal error at %s:%u: %s", file ? file : "?", line, reason ? reason : "");
    abort(); /* a bug in MHD or in our use of it: nothing sane to go on with */
}

/* libmicrohttpd's messages, in the server's log format with control bytes escaped (some quote what a client
 * sent). Before the daemon is up they say why it could not start (error). After, each is about one
 * connection, such as "Closing connection (application error generating response)" when a client leaves a
 * stream, and the access log already reports it: debug. */
static void mhd_log(void *cls, const char *fmt, va_list ap)
{
    const struct http_server *s = cls;
    const enum log_level level = s->mhd_up ? LOG_LEVEL_DEBUG : LOG_LEVEL_ERROR;
    if (!ferry_log_enabled(level)) return;
    char msg[512], safe[1024];
    vsnprintf(msg, sizeof msg, fmt, ap);
    size_t n = strlen(msg);
    while (n > 0 && (msg[n - 1] == '\n' || msg[n - 1] == '\r')) msg[--n] = 0;
    FLOG(level, "libmicrohttpd: %s", ferry_log_safe(msg, safe, sizeof safe));
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
    s->canned_busy_len = http_door_canned(s->canned_busy, sizeof s->canned_busy, 503,
                                          "the server has too many connections (--max-connections, "
                                          "--max-connections-per-ip); retry later");
    s->canned_oom_len =
        http_door_canned(s->canned_oom, sizeof s->canned_oom, 503, "the server is out of memory");
    s->canned_408h_len = http_door_canned(s->canned_408h, sizeof s->canned_408h, 408,
                                          "the request head did not arrive in time (--header-timeout)");
    s->canned_408b_len = http_door_canned(s->canned_408b, sizeof s->canned_408b, 408,
                                          "the request body did not arrive in time (--body-timeout)");
    s->canned_400line_len = http_door_canned(
        s->canned_400line, sizeof s->canned_400line, 400,
        "a chunk line of the body (its size and extensions) is longer than the server reads");
    s->canned_413chunk_len =
        http_door_canned(s->canned_413chunk, sizeof s->canned_413chunk, 413,
                         "a chunk of the body is declared larger than the limit (--body-limit)");
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
    s->d = MHD_start_daemon(
        MHD_USE_EPOLL | MHD_USE_NO_LISTEN_SOCKET | MHD_ALLOW_SUSPEND_RESUME | MHD_USE_ERROR_LOG, 0, NULL,
        NULL, http_conn_on_access, s, MHD_OPTION_EXTERNAL_LOGGER, mhd_log, s, /* first, as MHD asks */
        MHD_OPTION_NOTIFY_COMPLETED, http_conn_on_completed, s, MHD_OPTION_NOTIFY_CONNECTION,
        http_conn_on_connection, s, MHD_OPTION_CONNECTION_TIMEOUT, idle, MHD_OPTION_CONNECTION_LIMIT,
        (unsigned)(p->max_connections + 16), MHD_OPTION_SIGPIPE_HANDLED_BY_APP, 1, MHD_OPTION_END);
    s->mhd_up = 1;
    const union MHD_DaemonInfo *di = s->d ? MHD_get_daemon_info(s->d, MHD_DAEMON_INFO_EPOLL_FD) : NULL;
    if (!di) {
        snprintf(err, 256, "cannot start libmicrohttpd");
        if (s->d) MHD_stop_daemon(s->d);
        close(s->lfd);
        MHD_destroy_response(s->resp_oom);
        free(s);
        return FERRY_ERR_IO;
    }
    uv_tcp_init(loop, &s->reserve);
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
        if (c->state == C_IDLE && c->mc) http_conn_cut(c, NULL, 0);
    }
}

void http_server_close(struct http_server *s)
{
    if (!s || s->closed) return;
    stop_listening(s);
    for (struct http_req *c = s->conns; c; c = c->next) {
        c->cut = 1;
        if (c->fd >= 0) shutdown(c->fd, SHUT_RDWR);
        http_conn_end(c, 1);
        http_conn_resume(c);
    }
    mhd_pump(s); /* resumed connections are taken back and closed by MHD */
    s->closed = 1;
    uv_timer_stop(&s->sweep);
    uv_close((uv_handle_t *)&s->sweep, NULL);
    uv_close((uv_handle_t *)&s->reserve, NULL);
    uv_timer_stop(&s->mhd_timer);
    uv_close((uv_handle_t *)&s->mhd_timer, NULL);
    if (s->epoll_init) {
        uv_poll_stop(&s->epoll_poll);
        uv_close((uv_handle_t *)&s->epoll_poll, NULL);
        s->epoll_init = 0;
    }
    for (struct http_req *c = s->conns; c; c = c->next)
        if (c->dpoll_init) { /* the handle goes with the loop; c is freed by MHD_stop_daemon's notifications
                              */
            if (c->dpoll_active) uv_poll_stop(&c->dpoll);
            uv_close((uv_handle_t *)&c->dpoll, NULL);
            c->dpoll_active = c->dpoll_init = 0;
        }
    http_door_linger_close_all(s);
}

void http_server_free(struct http_server *s)
{
    if (!s) return;
    if (s->d) MHD_stop_daemon(s->d); /* closes what is left; its notifications release the connections */
    while (s->conns) {               /* any MHD never told us about */
        struct http_req *c = s->conns;
        s->conns = c->next;
        free(c->body);
        free(c->out);
        free(c);
    }
    http_door_ips_free(s);
    if (s->resp_oom) MHD_destroy_response(s->resp_oom);
    free(s);
}

void http_server_stats(const struct http_server *s, struct http_stats *st)
{
    *st = s->st;
    st->open = s->n_open;
}
