/* http_impl — the layouts and internal calls that server/http.c (the server: listener, accept, MHD on the
 * loop, deadlines), server/http_conn.c (a connection's request: MHD's callbacks, answers, streams) and
 * server/http_door.c (the sockets ferry handles itself) share. Private to server/http*.c: the application
 * sees only server/http.h.
 * A connection (struct http_req) lives from the accept (NOTIFY_CONNECTION STARTED) to MHD's close (CLOSED):
 *   IDLE  no byte of the next head yet (a new connection, or between keep-alive requests)
 *   HEAD  the head is arriving (seen from the socket's received-byte count): header_timeout
 *   BODY  the access handler has the head; the body is arriving: body_timeout
 *   APP   the application has the request, or a response is being written; the connection is suspended
 *         while there is nothing to write (a worker parses, the engine generates), resumed when there is
 * Everything here runs on the loop thread.
 */
#ifndef FERRY_SERVER_HTTP_IMPL_H
#define FERRY_SERVER_HTTP_IMPL_H

#include <microhttpd.h>
#include <netinet/in.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <time.h>
#include <uv.h>

#include "server/http.h"

#define IP_BUCKETS 4096

enum conn_state { C_IDLE = 0, C_HEAD, C_BODY, C_APP };

struct ip_entry;
struct linger_conn;

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
    int fresh;        /* no request seen yet on this connection */
    int cut;          /* shut down by us: MHD closes it next */
    int evicted;      /* cut to make room for another address at the cap (counted in n_evicted) */
    double t_start;   /* start of the current head or body (of the accept for a fresh connection) */
    double t_last;    /* last bytes seen from the client, or the end of the last response */
    uint64_t rx_mark; /* the socket's received-byte count when last looked at */
    int suspended;    /* MHD_suspend_connection in effect */
    uv_poll_t dpoll;  /* while suspended: notices the client leaving (MHD does not) */
    int dpoll_init, dpoll_active;
    /* the request */
    char method[32];
    char path[512];
    int http10;
    char *body; /* (body_len) bytes, NUL-terminated; malloc'd as it arrives */
    size_t body_len, body_cap;
    int refusal; /* 413 (the body passed body_limit) or 503 (no memory for it): answered once MHD lets us */
    /* a chunked body, shadowed (http_check_chunk_line): the declared size of each chunk, read where MHD
     * leaves its line in its buffer, so that one larger than the body limit is refused at once */
    int chunked, chunk_lost;
    const char *head_end; /* the end of the head in MHD's buffer (the first chunk line follows) */
    uint64_t chunk_left;  /* bytes of the current chunk still to come */
    uint64_t rxq_mark;    /* bytes waiting in the socket at the last sweep (a parser that stopped reading) */
    int rxq_still;        /* sweeps those bytes have waited unread */
    int app_active;       /* on_head was called and on_end not yet */
    void *app;
    int responded; /* an answer was queued (or is pending) */
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
    int mhd_up; /* MHD_start_daemon returned: its messages from then on are per connection (debug) */
    int lfd;    /* the listening socket; -1 once closed */
    uv_poll_t lpoll, epoll_poll;
    int lpoll_init, epoll_init;
    uv_timer_t mhd_timer, sweep;
    uv_tcp_t
        reserve; /* never opened: its init makes libuv take the descriptor it keeps for EMFILE now,
                  * not at the first refused connection (a descriptor count that stays flat from start) */
    int in_run;
    struct http_req *adding; /* the connection MHD_add_connection is taking */
    struct http_req *conns;
    struct linger_conn *lingers;
    struct http_req *deferred; /* connections with work due after MHD_run returns */
    int n_open, n_linger;
    int n_evicted; /* of n_open, connections cut to make room that MHD has not closed yet */
    int draining, closed;
    struct ip_entry *ips[IP_BUCKETS];
    struct http_stats st;
    struct MHD_Response *resp_oom; /* answers that need no allocation of ours */
    char canned_busy[512], canned_oom[512], canned_408h[512], canned_408b[512], canned_400line[512],
        canned_413chunk[512];
    size_t canned_busy_len, canned_oom_len, canned_408h_len, canned_408b_len, canned_400line_len,
        canned_413chunk_len;
};

static inline double http_now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* ---- server/http.c ---- */

/* MHD has work outside its sockets' readiness (a resumed connection): run it on the next loop turn. */
void http_server_kick(struct http_server *s);
/* c leaves the open connections and its address's count (it is not freed). */
void http_server_unlink(struct http_server *s, struct http_req *c);

/* ---- server/http_conn.c ---- */

/* MHD's callbacks (the cls is the server). */
enum MHD_Result http_conn_on_access(void *cls, struct MHD_Connection *mc, const char *url, const char *method,
                                    const char *version, const char *upload_data, size_t *upload_data_size,
                                    void **con_cls);
void http_conn_on_completed(void *cls, struct MHD_Connection *mc, void **con_cls,
                            enum MHD_RequestTerminationCode toe);
void http_conn_on_connection(void *cls, struct MHD_Connection *mc, void **socket_context,
                             enum MHD_ConnectionNotificationCode code);
/* Ends the application's request (once): on_end runs inside this call. */
void http_conn_end(struct http_req *c, int aborted);
/* Resumes a suspended connection and kicks MHD. */
void http_conn_resume(struct http_req *c);
/* Cuts a connection that MHD owns: an optional raw answer (only where nothing of the current request has been
 * sent), then shutdown, which MHD reads as the client's end and closes. */
void http_conn_cut(struct http_req *c, const char *resp, size_t len);
/* The work MHD's callbacks left for after MHD_run has returned: refusals of a body, on_drain. */
void http_conn_run_deferred(struct http_server *s);

#endif
