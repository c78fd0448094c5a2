/* serve_impl — the server's state, shared by server/serve.c (its life: options, the background load, signals,
 * drain, shutdown) and server/routes.c (what it does with each request). Private to those two files.
 *
 * The loop thread owns everything here except: `state` and `was_ready` (atomics: the loader reads them),
 * `abandoned` (under load_mu), `wake_head` and each request's wake links (under wake_mu), and what the loader
 * thread fills before it sends `loaded` (mf, tok, eng, sched, api, load_rc, load_err).
 */
#ifndef FERRY_SERVER_SERVE_IMPL_H
#define FERRY_SERVER_SERVE_IMPL_H

#include <pthread.h>
#include <stdint.h>
#include <uv.h>

#include "server/api.h"
#include "server/http.h"
#include "server/metrics.h"
#include "server/model_names.h"
#include "server/options.h"

enum server_state { STATE_LOADING = 0, STATE_READY = 1, STATE_DRAINING = 2, STATE_FAILED = 3 };

struct hreq;

struct hreq;

struct server {
    struct serve_options opt;
    uv_loop_t loop;
    struct http_server *http;
    uv_signal_t sig_term, sig_int;
    uv_async_t loaded; /* the loader finished */
    uv_async_t wake;   /* the engine thread queued requests on wake_head */
    uv_timer_t drain_timer, ping_timer, trim_timer;
    uv_thread_t loader;
    int loader_started, loader_done, closing;
    pthread_mutex_t load_mu; /* orders the loader's final uv_async_send against abandoning it */
    int abandoned;           /* shutdown came during the load: the loader must not touch the loop */
    int state;               /* enum server_state, atomic (the loader thread reads it) */
    int was_ready;           /* the model finished loading (atomic) */
    struct model_file *mf;
    struct model_file *mf_draft; /* --model-draft, or NULL */
    struct draft_model *dm;      /* its engine (runtime/draft_model.h), or NULL */
    struct mtp *mtp; /* --spec-type mtp: the model's own drafting block (runtime/mtp.h), or NULL */
    struct tokenizer *tok;
    struct engine *eng;
    struct sched *sched;
    struct api_ctx api;
    char model_name[256];
    struct model_names names; /* every name the model answers to; names.list feeds api.model_aliases */
    char page_url[300];       /* http://HOST:PORT/ as a browser on this machine opens it */
    char pulled_model[4096];  /* --hf-repo's local path */
    char *chat_template_text; /* --chat-template-file's contents, owned */
    double t_start;           /* sched_now() at start, for the dashboard's uptime */
    struct metrics metrics;
    pthread_mutex_t wake_mu; /* guards wake_head and every hreq's queued/wnext */
    struct hreq *wake_head;
    struct hreq *streams; /* streaming requests (loop thread), for keep-alive pings */
    int active_gen;       /* completion requests between submit and their end (loop thread) */
    uint64_t next_id;
    double drain_start; /* the first signal */
    double drain_force; /* a second signal: cut now (0 = none) */
    int drain_cut;
    int exit_code;
    char load_err[256];
    int load_rc;
};

static inline int serve_load_state(struct server *S)
{
    return __atomic_load_n(&S->state, __ATOMIC_ACQUIRE);
}

/* ---- server/routes.c: the http.h handlers (user = the server) and the loop's wake-ups ---- */

void routes_on_head(struct http_req *q, void *user);
void routes_on_request(struct http_req *q, void *user);
void routes_on_end(struct http_req *q, int aborted, void *user);
void routes_on_drain(struct http_req *q, void *user);
/* S->wake: the engine thread queued requests on wake_head; write what they have. */
void routes_on_wake(uv_async_t *a);
void routes_wake_drain(struct server *S);
/* Every second (S->ping_timer): keep-alive comments on streams that have been silent. */
void routes_on_ping(uv_timer_t *t);

#endif
