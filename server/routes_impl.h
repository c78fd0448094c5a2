/* routes_impl — what the two halves of `ferry serve`'s request handling share: routes.c (the route table, the
 * checks before the body, the GET answers, the answers themselves) and routes_gen.c (a completion's life: the
 * worker-pool parse, the scheduler, the stream or the whole answer, the request's end). Not for other
 * modules. */
#ifndef FERRY_ROUTES_IMPL_H
#define FERRY_ROUTES_IMPL_H

#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "server/api.h"
#include "server/http.h"
#include "server/serve_impl.h"

#define STREAM_UNSENT_MAX (64 * 1024) /* bytes waiting on a stream's socket before rendering pauses */

struct route;

/* One HTTP request as the application sees it. Loop thread only, except `req` and `out` while `working` (a
 * worker fills them) and `queued`/`wnext` (under wake_mu). Freed by whichever of its owners lets go last: the
 * HTTP request (until on_end), a worker job (`working`), the wake list (`queued`). */
struct hreq {
    struct server *S;
    struct http_req *q; /* NULL once the HTTP request ended */
    uint64_t id;
    char rid[72];    /* the client's X-Request-Id when it is sane, else our counter */
    char client[48]; /* who asks: "key N" (the API key it gave) or its address (struct sreq's client) */
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

/* Answers (loop thread): a body the caller malloc'd (taken), JSON (NULL body: out of memory, a 503), and the
 * one way errors leave the server: status → HTTP code through api_http_status(). */
void hreq_respond(struct hreq *h, int http, const char *ctype, char *body, size_t len);
void hreq_respond_json(struct hreq *h, int http, char *body, size_t len);
void hreq_respond_error(struct hreq *h, int status, const char *param, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* The route's allowed method (for 405's Allow) and its worker-pool parse. */
const char *route_allow(const struct route *r);
int route_parse(struct hreq *h);
/* The worker-pool parse of a POST body and its completion on the loop. */
void routes_parse_work(uv_work_t *w);
void routes_parse_done(uv_work_t *w, int status);

#endif
