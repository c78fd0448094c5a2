/* http — ferry's HTTP server: libmicrohttpd driven from a libuv loop, with ferry's own accept, limits and
 * deadlines.
 *
 * Every socket lives on the one loop thread (libmicrohttpd in external epoll mode, connections suspended
 * while the application works): thousands of idle or trickling connections cost memory, never threads.
 * Limits: at most max_connections open (at the cap, an idle or slow connection of the address holding the
 * most gives way to a newcomer from an address holding fewer (server/http_fair.h); a connection that finds
 * none to replace, or past max_per_ip from one address, is answered 503 + Retry-After and closed gracefully,
 * never reset), the whole head within header_timeout of its
 * first byte (of the accept for a new connection), the body within body_timeout, no silence longer than
 * idle_timeout (between requests too), and a reader that takes no bytes for about idle_timeout is dropped.
 * libmicrohttpd parses; ambiguous framing it lets through (two Content-Lengths, Content-Length with
 * Transfer-Encoding, ...) is refused here. Every error from this layer is an OpenAI-style JSON error and
 * closes the connection; heads libmicrohttpd cannot parse get its own (HTML) answers. One request at a time
 * per connection: pipelined bytes wait until the response has been written.
 *
 * The application sees requests through struct http_handlers, always on the loop thread. A request (struct
 * http_req, the connection itself) is valid from on_head until on_end returns; the application answers it
 * once, with http_respond() or a stream, at any later point on the loop thread. The request's strings and
 * body stay valid and unchanged until on_end (a worker thread that may outlive the request must copy what it
 * reads). Usage: http_server_init(&s, loop, &params, &handlers, err); uv_run; ... http_server_drain(s)
 * (SIGTERM); http_server_close(s) and let the loop finish; http_server_free(s).
 */
#ifndef FERRY_SERVER_HTTP_H
#define FERRY_SERVER_HTTP_H

#include <stddef.h>
#include <stdint.h>
#include <uv.h>

struct http_server;
struct http_req;

#define HTTP_LINGER_MAX                                                                                      \
    1024 /* connections closing gracefully at once (rejected ones included); more are closed */

struct http_params {
    const char *host; /* address to bind (a name is resolved, first address wins) */
    int port;         /* 0 = any free port: see http_server_port() */
    int max_connections;
    int max_per_ip;        /* open connections from one address; 0 = no limit */
    double idle_timeout;   /* seconds of silence from the client (and of a stalled reader) */
    double header_timeout; /* seconds for a whole head, from its first byte */
    double body_timeout;   /* seconds for a whole body, from the end of the head */
    int64_t body_limit;    /* bytes; larger bodies get 413 */
};

struct http_handlers {
    /* The head has arrived, the body not yet read. Answering now (with http_respond) refuses the request
     * before its body is read (the connection then closes, unless the body had arrived whole already).
     * Otherwise the body is read and on_request follows. */
    void (*on_head)(struct http_req *q, void *user);
    /* The whole request has arrived: answer it now or later. */
    void (*on_request)(struct http_req *q, void *user);
    /* The request ends: its response was written (aborted = 0), or the connection failed or the client left
     * first (aborted = 1). q is gone when this returns. */
    void (*on_end)(struct http_req *q, int aborted, void *user);
    /* A stream's queued bytes have been written: the application may write more. */
    void (*on_drain)(struct http_req *q, void *user);
    void *user;
};

/* Binds and listens. Returns 0, or a ferry status with err naming the address. */
int http_server_init(struct http_server **out, uv_loop_t *loop, const struct http_params *p,
                     const struct http_handlers *h, char err[256]);
int http_server_port(const struct http_server *s); /* the bound port */
/* Stops accepting (the listening socket closes: new connections are refused), closes idle connections; every
 * later response carries Connection: close. */
void http_server_drain(struct http_server *s);
/* Closes every connection (on_end with aborted = 1 for requests in flight) and the listener; the loop
 * finishes closing them, then http_server_free() releases the rest. */
void http_server_close(struct http_server *s);
void http_server_free(struct http_server *s);

struct http_stats {
    int open;                 /* connections open now (rejected ones excluded) */
    int peak;                 /* most open at once */
    uint64_t accepted;        /* connections taken */
    uint64_t rejected_full;   /* answered 503: max_connections reached */
    uint64_t rejected_per_ip; /* answered 503: max_per_ip reached */
    uint64_t evicted;         /* idle or slow connections closed at the cap to let another address in */
    uint64_t head_timeouts;   /* 408: head or body not complete in time, or silent too long mid-request */
    uint64_t idle_closed;     /* idle connections closed after idle_timeout */
    uint64_t stalled_readers; /* dropped: the client took no response bytes for idle_timeout */
    uint64_t protocol_errors; /* malformed or refused heads and bodies (4xx/5xx from this layer) */
};
void http_server_stats(const struct http_server *s, struct http_stats *st);

/* ---- a request ---- */

const char *http_req_method(const struct http_req *q); /* as sent: a token */
const char *http_req_path(const struct http_req *q); /* percent-decoded path, no query; "" when undecodable */
const char *http_req_header(const struct http_req *q, const char *name); /* first value, or NULL */
const char *http_req_body(const struct http_req *q, size_t *len);        /* valid in and after on_request */
const char *http_req_peer(const struct http_req *q);                     /* client address, numeric */
int http_req_is_loopback(const struct http_req *q);
void http_req_set_app(struct http_req *q, void *app);
void *http_req_app(const struct http_req *q);
int http_req_draining(const struct http_req *q); /* the server is draining: the response closes */

struct http_hdr {
    const char *name, *value;
};

/* Answers the request: status, n extra headers, and a body taken over (freed here; NULL with len 0 for none).
 * Date, Content-Length and Connection are added. Returns 0, or a ferry status when the answer could not be
 * queued (the connection is then closing and on_end follows). */
int http_respond(struct http_req *q, int status, const struct http_hdr *h, int n, char *body, size_t len);
/* A streamed answer: the head now, then pieces (copied), then the end (chunked encoding on HTTP/1.1). */
int http_stream_begin(struct http_req *q, int status, const struct http_hdr *h, int n);
int http_stream_write(struct http_req *q, const char *p, size_t len);
int http_stream_end(struct http_req *q);
size_t http_req_unsent(const struct http_req *q); /* stream bytes queued, not yet taken by the connection */
/* Closes the request's connection now; on_end (aborted = 1) runs inside this call. */
void http_req_close(struct http_req *q);
/* Answers 503 "out of memory" without allocating anything, then closes (on_end runs inside this call). */
void http_req_refuse_nomem(struct http_req *q);

#endif
