/* scheduler — continuous batching: the queue, reference counts, locking, submission and cancellation; the
 * engine thread is sched_engine.c (the glue between the policy (sched_policy), the sequences' output
 * (seq_output) and the prompt cache (prompt_cache)); what both share is sched_impl.h.
 *
 * Invariants: only the engine thread calls the engine, samplers and detokenizers; everything HTTP threads
 * read (choice text, logprobs, finish, request error/cancel, the queue) changes under s->mu. A choice holds
 * a slot from admission to CHOICE_DONE and its KV blocks are freed in the same iteration it finishes or is
 * found cancelled. Sampling happens outside the lock; results are published under it.
 */
#include "server/scheduler.h"

#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernels/core/log.h"
#include "kernels/core/status.h"
#include "runtime/engine.h"
#include "server/metrics.h"
#include "server/prompt_cache.h"
#include "server/row_pool.h"
#include "server/sched_policy.h"
#include "server/seq_output.h"
#include "server/sched_impl.h"
#include "server/sreq.h"

int sched_describe(struct sched *s, struct sched_seq *out, int cap)
{
    const double now = sched_now();
    int n = 0;
    pthread_mutex_lock(&s->mu);
    for (int pass = 0; pass < 2; pass++) {
        struct choice *c = pass == 0 ? NULL : s->qhead;
        for (int i = 0; pass == 0 ? i < s->n_run : c != NULL; i++) {
            if (pass == 0) c = s->run[i];
            if (n < cap) {
                struct sched_seq *q = &out[n];
                snprintf(q->id, sizeof q->id, "%s", c->req->id);
                snprintf(q->client, sizeof q->client, "%s", c->req->client);
                q->kind = c->req->kind;
                q->running = pass == 0;
                q->slot = pass == 0 ? c->slot : -1;
                q->n_prompt = c->n_prompt;
                q->n_fed = pass == 0 ? c->n_fed : 0;
                q->n_gen = pass == 0 ? c->n_completion : 0;
                q->max_tokens = c->req->max_tokens;
                q->age = now - c->req->t_arrival;
            }
            n++;
            if (pass == 1) c = c->qnext;
        }
    }
    pthread_mutex_unlock(&s->mu);
    return n;
}

int sched_embd_dim(const struct sched *s)
{
    return s->dim;
}

int sched_kv_positions(const struct sched *s)
{
    const long long n = (long long)s->pp.kv_blocks * s->pp.kv_block;
    return n > INT32_MAX / 2 ? INT32_MAX / 2 : (int)n;
}

double sched_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* ---- lifecycle ---------------------------------------------------------------------------------- */

/* A buffer sized for the largest step (logits rows, pooled outputs), touched now: the server holds at start
 * what its largest step will use instead of growing into it under load. */
static void *touched_alloc(size_t bytes)
{
    void *p = malloc(bytes);
    if (p) memset(p, 0, bytes);
    return p;
}

int sched_init(struct sched **out, struct engine *e, const struct tokenizer *t, struct metrics *m,
               const struct sched_params *p)
{
    *out = NULL;
    struct sched *s = calloc(1, sizeof *s);
    if (!s) return FERRY_ERR_NOMEM;
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv_work, NULL);
    s->e = e;
    s->tok = t;
    s->m = m;
    s->p = *p;
    s->n_slots = engine_n_seqs(e);
    s->n_vocab = engine_hparams(e)->n_vocab;
    s->ctx = engine_ctx_size(e);
    s->dim = engine_hparams(e)->dim;
    struct engine_stats st;
    engine_get_stats(e, &st);
    if (s->p.max_batch_tokens < s->n_slots) s->p.max_batch_tokens = s->n_slots;
    s->pp = (struct sched_policy_params){
        .n_slots = s->n_slots,
        .max_queue = s->p.max_queue,
        .max_batch_tokens = s->p.max_batch_tokens,
        .prefill_budget = s->p.prefill_budget > 0 ? s->p.prefill_budget : 0,
        .prompt_lp_rows = PROMPT_LP_ROWS,
        .ctx = s->ctx,
        .kv_blocks = st.kv_blocks_total > 0 ? st.kv_blocks_total : INT32_MAX / 2,
        .kv_fast_blocks = st.kv_blocks_total > 0 ? st.kv_blocks_total - st.kv_blocks_ext : 0,
        .kv_block = st.kv_block_size > 0 ? st.kv_block_size : 1,
        .ckpt_tail = s->p.ckpt_tail > 0 ? s->p.ckpt_tail : 0,
    };
    size_t nb = (size_t)s->p.max_batch_tokens;
    const size_t ns = (size_t)s->n_slots;
    s->run = calloc(ns, sizeof *s->run);
    s->slot_free = malloc(ns * sizeof *s->slot_free);
    s->idle = calloc(ns, sizeof *s->idle);
    s->idle_blocks = calloc(ns, sizeof *s->idle_blocks);
    s->steps = calloc(ns, sizeof *s->steps);
    s->chunk = calloc(ns, sizeof *s->chunk);
    s->b_tokens = malloc(nb * sizeof(int32_t));
    s->b_pos = malloc(nb * sizeof(int32_t));
    s->b_seq = malloc(nb * sizeof(int32_t));
    s->b_want = malloc(nb);
    s->e_tokens = malloc(nb * sizeof(int32_t));
    s->e_pos = malloc(nb * sizeof(int32_t));
    s->e_seq = malloc(nb * sizeof(int32_t));
    s->e_want = malloc(nb);
    s->e_out = touched_alloc(nb * (size_t)s->dim * sizeof(float));
    if (p->mtp && !(s->hid = malloc(nb * (size_t)s->dim * sizeof(float)))) {
        sched_free(s);
        return FERRY_ERR_NOMEM;
    }
    s->row_owner = calloc(ns, sizeof *s->row_owner);
    s->row_at = calloc(ns, sizeof *s->row_at);
    s->pub_owner = calloc(ns, sizeof *s->pub_owner);
    s->draws = p->gpu_sampling && engine_draws(e);
    s->fair_run = calloc(ns, sizeof *s->fair_run);
    s->draw = calloc(ns, sizeof *s->draw);
    s->drawn = calloc(ns, sizeof *s->drawn);
    if (seq_vocab_init(&s->vocab, t, s->n_vocab, 1)) s->vocab = NULL;
    if (prompt_cache_init(&s->pc, s->n_slots)) s->pc = NULL;
    const size_t rows = ns + PROMPT_LP_ROWS + (s->p.spec_n_max > 0 ? SCHED_SPEC_ROWS : 0);
    s->logits = touched_alloc(rows * (size_t)s->n_vocab * sizeof(float));
    s->scratch = touched_alloc(rows * (size_t)s->n_vocab * sizeof(float));
    if (!s->run || !s->slot_free || !s->idle || !s->idle_blocks || !s->steps || !s->chunk || !s->b_tokens ||
        !s->b_pos || !s->b_seq || !s->b_want || !s->e_tokens || !s->e_pos || !s->e_seq || !s->e_want ||
        !s->e_out || !s->row_owner || !s->row_at || !s->pub_owner || !s->draw || !s->drawn || !s->vocab ||
        !s->fair_run || !s->pc || !s->logits || !s->scratch) {
        sched_free(s);
        return FERRY_ERR_NOMEM;
    }
    for (int i = 0; i < s->n_slots; i++) s->slot_free[i] = 1;
    *out = s;
    return 0;
}

int sched_start(struct sched *s)
{
    int want = s->p.sample_threads - 1; /* the engine thread samples too */
    if (want > s->n_slots - 1) want = s->n_slots - 1;
    int rc = row_pool_init(&s->samplers, want > 0 ? want : 0, sched_sample_row, s);
    if (rc) return rc;
    struct engine_stats st; /* the KV pool's shape is on /metrics before the server is ready */
    engine_get_stats(s->e, &st);
    metrics_set_engine(s->m, 0, 0, &st, 0);
    if (pthread_create(&s->thread, NULL, sched_engine_main, s)) return FERRY_ERR_NOMEM;
    s->started = 1;
    return 0;
}

void sched_stop(struct sched *s)
{
    if (!s || !s->started) return;
    sched_cancel_all(s, FERRY_ERR_CANCELLED);
    pthread_mutex_lock(&s->mu);
    s->stop = 1;
    pthread_cond_broadcast(&s->cv_work);
    pthread_mutex_unlock(&s->mu);
    pthread_join(s->thread, NULL);
    s->started = 0;
    row_pool_free(s->samplers);
    s->samplers = NULL;
}

void sched_free(struct sched *s)
{
    if (!s) return;
    sched_stop(s);
    free(s->run);
    free(s->slot_free);
    free(s->idle);
    free(s->idle_blocks);
    free(s->steps);
    free(s->chunk);
    free(s->b_tokens);
    free(s->b_pos);
    free(s->b_seq);
    free(s->b_want);
    free(s->e_tokens);
    free(s->e_pos);
    free(s->e_seq);
    free(s->e_want);
    free(s->e_out);
    free(s->hid);
    free(s->row_owner);
    free(s->row_at);
    free(s->pub_owner);
    free(s->draw);
    free(s->drawn);
    free(s->fair_run);
    free(s->clients);
    free(s->running_of);
    free(s->waiting_of);
    free(s->q_client);
    free(s->q_ready);
    seq_vocab_free(s->vocab);
    prompt_cache_free(s->pc);
    free(s->logits);
    free(s->scratch);
    row_pool_free(s->samplers); /* when the engine thread never started */
    pthread_cond_destroy(&s->cv_work);
    pthread_mutex_destroy(&s->mu);
    free(s);
}

void sched_lock(struct sched *s)
{
    pthread_mutex_lock(&s->mu);
}
void sched_unlock(struct sched *s)
{
    pthread_mutex_unlock(&s->mu);
}

void sched_wait(struct sched *s, struct sreq *req, int ms)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    ts.tv_sec += ms / 1000;
    ts.tv_nsec += (long)(ms % 1000) * 1000000L;
    if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
    }
    pthread_cond_timedwait(&req->cv, &s->mu, &ts);
}

int sched_in_flight(struct sched *s)
{
    pthread_mutex_lock(&s->mu);
    int n = s->in_flight;
    pthread_mutex_unlock(&s->mu);
    return n;
}

/* With mu held: new output, a finish or an error on r. */
void sched_req_signal_locked(struct sreq *r)
{
    pthread_cond_broadcast(&r->cv);
    if (r->wake) r->wake(r->wake_user);
}

/* With mu held: drops one reference. */
void sched_req_unref_locked(struct sreq *r)
{
    if (--r->refs == 0) sreq_free(r);
}

void sched_release(struct sched *s, struct sreq *req)
{
    if (!req) return;
    if (!s) {
        sched_req_unref_locked(req);
        return;
    }
    pthread_mutex_lock(&s->mu);
    sched_req_unref_locked(req);
    pthread_mutex_unlock(&s->mu);
}

/* With mu held: a choice reaches CHOICE_DONE; the request finishes with its last choice. */
void sched_choice_done_locked(struct sched *s, struct choice *c, const char *finish)
{
    struct sreq *r = c->req;
    if (c->state == CHOICE_DONE) return;
    c->state = CHOICE_DONE;
    if (finish && !c->finish) c->finish = finish;
    r->n_done++;
    sched_req_signal_locked(r);
    if (r->n_done == r->n_choices) {
        s->in_flight--;
        if (r->client_id >= 0 && r->client_id < s->clients_cap) s->clients[r->client_id].refs--;
        r->client_id = -1;
        metrics_request_done(s->m, sched_now() - r->t_arrival);
        sched_req_unref_locked(r);
    }
}

/* Whether a request asks for its prompt tokens' logprobs (OpenAI completions: echo with logprobs, which is
 * how evaluation harnesses score a text: often with max_tokens 0). */
int sched_wants_prompt_lps(const struct sreq *r)
{
    return r->kind == SREQ_COMPLETION && r->echo && r->logprobs >= 0;
}

/* KV blocks a choice may use at most: admission reserves them, so a running sequence never finds the pool
 * exhausted mid-generation. */
int sched_kv_need(const struct sched *s, const struct choice *c)
{
    return sched_policy_kv_need(&s->pp, c->n_prompt, c->req->max_tokens);
}

/* With mu held: req's client in the table (a new entry, or the one of a request in flight from it). Returns
 * 0, or FERRY_ERR_NOMEM. */
static int client_intern_locked(struct sched *s, struct sreq *req)
{
    int free_at = -1;
    for (int i = 0; i < s->clients_cap; i++) {
        if (s->clients[i].refs > 0 && !strcmp(s->clients[i].name, req->client)) {
            s->clients[i].refs++;
            req->client_id = i;
            return 0;
        }
        if (s->clients[i].refs == 0 && free_at < 0) free_at = i;
    }
    if (free_at < 0) { /* the table, and the engine thread's counts by client, grow together */
        const int cap = s->clients_cap ? s->clients_cap * 2 : 16;
        struct sched_client *c = realloc(s->clients, (size_t)cap * sizeof *c);
        if (!c) return FERRY_ERR_NOMEM;
        s->clients = c;
        int *ro = realloc(s->running_of, (size_t)cap * sizeof *ro);
        if (!ro) return FERRY_ERR_NOMEM;
        s->running_of = ro;
        int *wo = realloc(s->waiting_of, (size_t)cap * sizeof *wo);
        if (!wo) return FERRY_ERR_NOMEM;
        s->waiting_of = wo;
        for (int i = s->clients_cap; i < cap; i++) s->clients[i].refs = 0;
        free_at = s->clients_cap;
        s->clients_cap = cap;
    }
    snprintf(s->clients[free_at].name, sizeof s->clients[free_at].name, "%s", req->client);
    s->clients[free_at].refs = 1;
    req->client_id = free_at;
    return 0;
}

void sched_set_paused(struct sched *s, struct sreq *req, int paused)
{
    pthread_mutex_lock(&s->mu);
    if (req->paused != paused) {
        req->paused = paused;
        pthread_cond_signal(&s->cv_work);
    }
    pthread_mutex_unlock(&s->mu);
}

int sched_submit(struct sched *s, struct sreq *req)
{
    for (int i = 0; i < req->n_choices; i++) {
        const struct choice *c = &req->choices[i];
        if (sched_policy_fits_pool(&s->pp, c->n_prompt, req->max_tokens, NULL)) { /* nor this */
            long long pos = (long long)c->n_prompt + req->max_tokens;
            if (pos > s->ctx) pos = s->ctx;
            snprintf(req->errmsg, sizeof req->errmsg,
                     "this request needs %lld KV positions (prompt %d + max_tokens %d); the pool holds %d "
                     "(--kv-tokens)",
                     pos, c->n_prompt, req->max_tokens, sched_kv_positions(s));
            return FERRY_ERR_DEVICE_MEM;
        }
    }
    pthread_mutex_lock(&s->mu);
    /* A request with more sequences than slots + queue waits apart (one at a time), so that it never fills
     * the queue against the others: each kind is counted among its own. */
    req->oversize = req->n_choices > s->n_slots + s->p.max_queue;
    int n_over = 0;
    for (const struct choice *c = s->qhead; c; c = c->qnext) n_over += c->req->oversize;
    if (s->stop || sched_policy_accepts(&s->pp, req->oversize ? n_over : s->n_queued - n_over, s->n_run,
                                        req->n_choices)) {
        pthread_mutex_unlock(&s->mu);
        return s->stop ? FERRY_ERR_CANCELLED : FERRY_ERR_BUSY;
    }
    if (client_intern_locked(s, req)) {
        pthread_mutex_unlock(&s->mu);
        return FERRY_ERR_BUSY; /* (no memory for one more client: busy for now) */
    }
    req->refs++;
    s->in_flight++;
    for (int i = 0; i < req->n_choices; i++) {
        struct choice *c = &req->choices[i];
        c->state = CHOICE_QUEUED;
        c->qnext = NULL;
        if (s->qtail)
            s->qtail->qnext = c;
        else
            s->qhead = c;
        s->qtail = c;
        s->n_queued++;
    }
    metrics_set_queue_depth(s->m, s->n_queued);
    pthread_cond_signal(&s->cv_work);
    pthread_mutex_unlock(&s->mu);
    return 0;
}

/* With mu held: removes the request's queued choices from the queue. */
void sched_unqueue_locked(struct sched *s, struct sreq *req)
{
    struct choice **pp = &s->qhead, *prev = NULL;
    while (*pp) {
        struct choice *c = *pp;
        if (c->req == req) {
            *pp = c->qnext;
            if (s->qtail == c) s->qtail = prev;
            s->n_queued--;
            sched_choice_done_locked(s, c, NULL);
        } else {
            prev = c;
            pp = &c->qnext;
        }
    }
}

void sched_cancel(struct sched *s, struct sreq *req, int status)
{
    pthread_mutex_lock(&s->mu);
    if (req->n_done < req->n_choices && !req->cancelled) {
        req->cancelled = status;
        if (req->n_done < req->n_choices) metrics_count_cancelled(s->m);
        /* the request may be freed inside: keep it alive until we are done with it */
        req->refs++;
        sched_unqueue_locked(s, req);
        sched_req_signal_locked(req);
        sched_req_unref_locked(req);
        pthread_cond_signal(&s->cv_work);
    }
    pthread_mutex_unlock(&s->mu);
}

void sched_cancel_all(struct sched *s, int status)
{
    pthread_mutex_lock(&s->mu);
    /* queued choices: cut now; running ones: flag their requests, the engine thread reaps them */
    while (s->qhead) {
        struct sreq *r = s->qhead->req;
        if (!r->cancelled) r->cancelled = status;
        r->refs++;
        sched_unqueue_locked(s, r);
        sched_req_signal_locked(r);
        sched_req_unref_locked(r);
    }
    for (int i = 0; i < s->n_run; i++)
        if (!s->run[i]->req->cancelled) s->run[i]->req->cancelled = status;
    pthread_cond_signal(&s->cv_work);
    pthread_mutex_unlock(&s->mu);
}
