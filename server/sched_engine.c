/* sched_engine — the scheduler's engine thread: admits queued choices into slots (sched_policy), builds each
 * step, runs the engine, samples or takes the drawn tokens, and publishes text, logprobs and finishes under
 * s->mu (see scheduler.c for the invariants). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernels/core/log.h"
#include "kernels/core/status.h"
#include "runtime/draft_model.h"
#include "runtime/engine.h"
#include "runtime/mtp.h"
#include "server/metrics.h"
#include "server/prompt_cache.h"
#include "server/row_pool.h"
#include "server/sched_impl.h"
#include "server/seq_output.h"

/* ---- the engine thread ---------------------------------------------------------------------------- */

static int buf_append(char **p, size_t *len, size_t *cap, const char *src, size_t n)
{
    if (*len + n + 1 > *cap) {
        size_t nc = (*cap ? *cap * 2 : 256);
        while (nc < *len + n + 1) nc *= 2;
        char *q = realloc(*p, nc);
        if (!q) return FERRY_ERR_NOMEM;
        *p = q;
        *cap = nc;
    }
    memcpy(*p + *len, src, n);
    *len += n;
    (*p)[*len] = 0;
    return 0;
}

/* A speculating choice's history gets the token it just generated. */
static void hist_push(struct choice *c)
{
    const int at = c->n_prompt + c->out.n_gen - 1;
    if (c->hist && at < c->hist_cap) c->hist[at] = c->out.last;
}

struct walk_ctx {
    struct sched *s;
    struct choice *c;
};

/* spec_draw_fn: one row of a verification step through c's output pipeline; -1 once the output ends. */
static int32_t walk_draw(void *arg, float *row)
{
    struct walk_ctx *w = arg;
    struct choice *c = w->c;
    float *raw = w->s->scratch + (size_t)(row - w->s->logits); /* the unconstrained row, for logprobs */
    const int32_t t = seq_output_step(&c->out, row, raw);
    hist_push(c);
    if (c->spec_lps && c->out.has_lp) c->spec_lps[c->spec_drawn] = c->out.lp;
    c->spec_drawn++;
    return c->out.fin ? -1 : t;
}

/* Outside the lock: samples the next token of c from its logits row and decides what text is released; with
 * drafts, the rows after it too, in order, while each draw equals its draft (runtime/spec.h). */
static void process_row(struct sched *s, struct choice *c, float *row)
{
    if (c->n_draft > 0) {
        struct walk_ctx w = {s, c};
        int32_t drawn[SPEC_MAX_DRAFT + 1];
        int ended;
        c->spec_drawn = 0;
        spec_walk(row, s->n_vocab, c->draft, c->n_draft, walk_draw, &w, drawn, &ended);
    } else {
        float *raw = s->scratch + (size_t)(row - s->logits); /* the unconstrained row, for logprobs */
        seq_output_step(&c->out, row, raw);
        hist_push(c);
    }
    c->fin = c->out.fin;
    c->stop_hit = c->out.stop_hit;
}

/* With mu held: the running choice at run[i] leaves its slot (KV blocks freed now). */
static void retire_locked(struct sched *s, int i, const char *finish)
{
    struct choice *c = s->run[i];
    if (finish && s->p.prompt_cache && !c->req->no_prompt_cache && prompt_cache_len(s->pc, c->slot) > 0) {
        prompt_cache_touch(s->pc, c->slot); /* kept for a later prompt with the same start */
    } else {
        engine_seq_free(s->e, c->slot);
        prompt_cache_drop(s->pc, c->slot);
    }
    s->kv_reserved -= sched_kv_need(s, c);
    s->slot_free[c->slot] = 1;
    seq_output_free(&c->out);
    memmove(&s->run[i], &s->run[i + 1], (size_t)(s->n_run - i - 1) * sizeof *s->run);
    s->n_run--;
    sched_choice_done_locked(s, c, finish);
}

/* With mu held: the running first choice of c's prompt when c is a later one (n > 1), else NULL. The later
 * choices share its prompt's KV blocks instead of prefilling the prompt again. */
static struct choice *running_leader_locked(const struct sched *s, const struct choice *c)
{
    const struct sreq *r = c->req;
    if (r->n < 2 || c->index % r->n == 0 || sched_wants_prompt_lps(r))
        return NULL; /* echo's logprobs: each computes */
    struct choice *lead = &r->choices[c->index - c->index % r->n];
    for (int i = 0; i < s->n_run; i++)
        if (s->run[i] == lead) return lead;
    return NULL;
}

/* With mu held: whether c fits the KV pool in `slot` (the policy decides), dropping other free slots' caches
 * (least recently used first) as it says. Running choices hold their reservation (prompt + max_tokens), free
 * slots their cache. */
static int fits_locked(struct sched *s, const struct choice *c, int slot)
{
    const int n = prompt_cache_idle(s->pc, s->slot_free, slot, s->idle);
    for (int i = 0; i < n; i++)
        s->idle_blocks[i] = sched_policy_blocks(&s->pp, engine_seq_len(s->e, s->idle[i]));
    int n_evict = 0;
    const enum sched_admit a = sched_policy_admit(&s->pp, s->n_run, s->kv_reserved, sched_kv_need(s, c),
                                                  s->idle_blocks, n, &n_evict);
    for (int i = 0; i < n_evict; i++) {
        engine_seq_free(s->e, s->idle[i]);
        prompt_cache_drop(s->pc, s->idle[i]);
    }
    return a == SCHED_ADMIT_NOW;
}

/* With mu held: admits c into `slot`, continuing after `reuse` cached prompt positions, or after the whole
 * blocks of the prompt that `lead` (its prompt's first choice, prefilled) shares with it. */
static int admit_locked(struct sched *s, struct choice *c, int slot, int reuse, const struct choice *lead)
{
    struct sreq *r = c->req;
    r->started = 1;
    if (c->resume) { /* its output state is kept: its slot recomputes the prompt and the tokens so far */
        engine_seq_free(s->e, slot);
        prompt_cache_drop(s->pc, slot);
        s->kv_reserved += sched_kv_need(s, c);
        s->slot_free[slot] = 0;
        c->slot = slot;
        c->n_fed = c->n_cached = 0;
        c->mtp_on = s->p.mtp && c->hist;
        if (s->p.mtp) mtp_seq_free(s->p.mtp, slot);
        c->state = CHOICE_RUNNING;
        s->run[s->n_run++] = c;
        return 0;
    }
    c->feed = c->prompt;
    c->n_feed = c->n_prompt;
    struct sampler_params sp = r->sp;
    sp.seed = r->sp.seed + (uint64_t)c->index;
    sp.logit_bias = r->bias;
    sp.n_logit_bias = r->n_bias;
    const struct seq_output_params op = {
        .grammar = r->grammar,
        .stops = r->stops,
        .n_stops = r->n_stops,
        .logprobs = r->logprobs,
        .keep_special = r->keep_special,
        .ignore_eos = r->ignore_eos,
        .max_tokens = r->max_tokens,
        .n_prompt = c->n_prompt,
        .ctx = s->ctx,
    };
    int rc = seq_output_init(&c->out, s->vocab, &op, &sp);
    if (rc) return rc;
    /* Speculative decoding keeps the sequence's tokens for prompt lookup; without memory for them it does
     * not speculate. */
    c->n_draft = 0;
    c->spec_acc.miss = c->spec_acc.wait = 0;
    c->spec_drawn = 1;
    if (s->p.spec_n_max > 0 && r->kind != SREQ_EMBED && r->max_tokens > 1 && !c->hist) {
        const int cap = (c->n_prompt + r->max_tokens < s->ctx ? c->n_prompt + r->max_tokens : s->ctx) + 1;
        c->hist = malloc((size_t)cap * sizeof *c->hist);
        if (c->hist && r->logprobs >= 0 &&
            !(c->spec_lps = malloc((SPEC_MAX_DRAFT + 1) * sizeof *c->spec_lps))) {
            free(c->hist);
            c->hist = NULL;
        }
        if (c->hist) {
            c->hist_cap = cap;
            c->spec_acc = sched_spec_accept_new(s->p.draft ? SCHED_SPEC_MODEL
                                                : s->p.mtp ? SCHED_SPEC_MTP
                                                           : SCHED_SPEC_NGRAM);
            memcpy(c->hist, c->prompt, (size_t)c->n_prompt * sizeof *c->hist);
        }
    }
    if (r->kind == SREQ_EMBED && !(c->embd = calloc((size_t)s->dim, sizeof(float)))) {
        seq_output_free(&c->out);
        return FERRY_ERR_NOMEM;
    }
    int shared = lead ? engine_seq_share(s->e, lead->slot, slot, c->n_prompt - 1) : 0;
    if (shared > 0) {
        reuse = shared;
        prompt_cache_copy(s->pc, lead->slot, slot, shared);
    } else if (reuse > 0 && (reuse = engine_seq_keep(s->e, slot, reuse)) > 0) {
        prompt_cache_set_len(s->pc, slot, reuse);
    } else {
        reuse = 0;
        engine_seq_free(s->e, slot); /* a slot without a usable cache starts empty */
        prompt_cache_drop(s->pc, slot);
    }
    if (s->p.mtp) {
        /* The block's slot holds what the engine's holds: a cached prefix keeps its K/V too (the prompt
         * cache's record is of both); a shared one the block does not have. */
        const int held = shared > 0 ? -1 : mtp_seq_resume(s->p.mtp, slot, reuse);
        c->mtp_on = c->hist && held == reuse;
        if (!c->mtp_on) mtp_seq_free(s->p.mtp, slot);
    }
    s->kv_reserved += sched_kv_need(s, c);
    s->slot_free[slot] = 0;
    c->slot = slot;
    c->n_fed = c->n_cached = reuse;
    c->state = CHOICE_RUNNING;
    s->run[s->n_run++] = c;
    metrics_add_cached(s->m, reuse);
    return 0;
}

/* After a step: the tokens each slot now holds (for the prompt cache). A slot whose record cannot grow is
 * marked unknown and never matched. */
static void record_tokens(struct sched *s, const struct batch *b)
{
    for (int i = 0; i < b->n_tokens; i++) prompt_cache_record(s->pc, b->seq[i], b->pos[i], b->tokens[i]);
}

static void cut_expired_locked(struct sched *s, double now)
{
    for (struct choice *c = s->qhead; c; c = c->qnext) {
        struct sreq *r = c->req;
        if (!r->cancelled && r->deadline > 0 && now > r->deadline) {
            r->cancelled = FERRY_ERR_TIMEOUT;
            sched_req_signal_locked(r);
        }
        /* waited too long for its first slot: refused as busy (503 + Retry-After), never half served */
        if (!r->cancelled && !r->started && s->p.queue_timeout > 0 &&
            now - r->t_arrival > s->p.queue_timeout) {
            r->error = r->cancelled = FERRY_ERR_BUSY;
            snprintf(r->errmsg, sizeof r->errmsg,
                     "the server is busy: no slot came free within %.0fs (--queue-timeout); retry later",
                     s->p.queue_timeout);
            metrics_count_queue_timeout(s->m);
            sched_req_signal_locked(r);
        }
    }
    for (int i = 0; i < s->n_run; i++) {
        struct sreq *r = s->run[i]->req;
        if (!r->cancelled && r->deadline > 0 && now > r->deadline) {
            r->cancelled = FERRY_ERR_TIMEOUT;
            sched_req_signal_locked(r);
        }
    }
    /* queued choices of cancelled requests leave the queue */
    for (struct choice *c = s->qhead; c;) {
        struct sreq *r = c->req;
        if (r->cancelled) {
            r->refs++;
            sched_unqueue_locked(s, r);
            sched_req_unref_locked(r);
            c = s->qhead;
        } else {
            c = c->qnext;
        }
    }
}

/* A sampling thread (or the engine thread): row i of the step. Before a draw on the GPU: its mask (the
 * grammar's, the costly part) and its draw; after it: the drawn token through the output pipeline; otherwise
 * the whole sampling from the logits. */
void sched_sample_row(void *arg, int i)
{
    struct sched *s = arg;
    struct choice *c = s->row_owner[i];
    const int at = s->row_at[i];
    if (s->rows_do == ROWS_MASK) {
        s->draw[at] = (struct draw_row){c->out.smp, seq_output_mask(&c->out), c->out.p.logprobs};
    } else if (s->rows_do == ROWS_DRAWN) {
        const struct draw_out *d = &s->drawn[at];
        struct lp_entry lp = {.id = d->token, .lp = d->logprob, .n_top = d->n_top};
        memcpy(lp.top_id, d->top_id, (size_t)d->n_top * sizeof *lp.top_id);
        memcpy(lp.top_lp, d->top_lp, (size_t)d->n_top * sizeof *lp.top_lp);
        seq_output_drawn(&c->out, d->token, c->out.p.logprobs >= 0 ? &lp : NULL);
        hist_push(c);
        c->fin = c->out.fin;
        c->stop_hit = c->out.stop_hit;
    } else {
        process_row(s, c, s->logits + (size_t)at * s->n_vocab);
    }
}

/* Outside the lock, after a step: the logprob of each asked prompt token given the tokens before it. */
static void prompt_logprobs(struct sched *s)
{
    for (int i = 0; i < s->n_plp; i++) {
        struct choice *c = s->plp_owner[i];
        const int p = s->plp_pos[i];
        struct lp_entry *e = &c->prompt_lps[p];
        e->id = c->prompt[p + 1];
        e->n_top = c->req->logprobs > SCHED_MAX_TOP_LOGPROBS ? SCHED_MAX_TOP_LOGPROBS : c->req->logprobs;
        e->lp = sampler_logprob(s->logits + (size_t)s->plp_at[i] * s->n_vocab, s->n_vocab, e->id, e->n_top,
                                e->top_id, e->top_lp);
    }
}

/* With mu held: the prompt chunks of running embedding choices, in a batch of their own (the policy cuts
 * them to max_batch_tokens); each choice's c->chunk and c->e_at say where its rows are. Returns the batch's
 * tokens. */
static int embed_batch_locked(struct sched *s)
{
    for (int i = 0; i < s->n_run; i++) {
        const struct choice *c = s->run[i];
        s->steps[i] = (struct sched_step_seq){c->n_prompt, c->n_fed, c->req->kind != SREQ_EMBED, 0};
    }
    int others = 0, starting = 0;
    for (int i = 0; i < s->n_run; i++) {
        const struct choice *c = s->run[i];
        if (c->req->kind == SREQ_EMBED) continue;
        others++;
        starting += c->n_fed < c->n_feed || (c->out.n_gen == 0 && c->req->max_tokens > 0);
    }
    sched_policy_plan_prefill(sched_policy_embed_budget(&s->pp, others, s->n_queued > 0, starting), s->steps,
                              s->n_run, s->chunk);
    int ne = 0, at = 0;
    for (int i = 0; i < s->n_run; i++) {
        struct choice *c = s->run[i];
        const int k = s->chunk[i];
        if (!k) continue;
        c->e_at = at;
        for (int j = 0; j < k; j++) {
            const int p = c->n_fed + j;
            s->e_tokens[ne] = c->prompt[p];
            s->e_pos[ne] = p;
            s->e_seq[ne] = c->slot;
            s->e_want[ne] = c->req->pooling == 0 || p == c->n_prompt - 1;
            at += s->e_want[ne];
            ne++;
        }
        c->chunk = k;
    }
    return ne;
}

/* A request's drafts a step at most: the step's k_max, or less where the request asked (speculative.n_max).
 */
static int spec_cap(const struct sreq *r, int k_max)
{
    return r->spec_n_max >= 0 && r->spec_n_max < k_max ? r->spec_n_max : k_max;
}

/* With mu held: the draft length of a step whose other rows number `base`, at most k_max, from what the
 * speculating sequences' drafts have been accepted at and what steps of each size cost
 * (sched_policy_spec_pick). */
static int spec_pick_locked(struct sched *s, int base, int k_max)
{
    if (k_max <= 0 || !s->p.spec_adapt) return k_max;
    double alpha[SCHED_SPEC_MAX_SEQS];
    int n = 0;
    for (int i = 0; i < s->n_run && n < SCHED_SPEC_MAX_SEQS; i++) {
        const struct choice *c = s->run[i];
        if (c->hist && c->n_fed == c->n_feed && !c->req->paused && sched_spec_accept_may_draft(&c->spec_acc))
            alpha[n++] = sched_spec_accept_rate(&c->spec_acc);
    }
    return sched_policy_spec_pick(&s->spec_cost, base, alpha, n, k_max);
}

/* The shortest draft worth its rows for r (speculative.n_min, else the server's). */
static int spec_min(const struct sched *s, const struct sreq *r)
{
    return r->spec_n_min >= 0 ? r->spec_n_min : s->p.spec_n_min;
}

/* With mu held: one step's batch: every decoding sequence gets its token, then prefill chunks in admission
 * order as the policy cuts them. Fills the batch arrays, row_owner/row_at (rows sampled) and the prompt
 * rows whose logprobs are asked; returns the batch's tokens, *rows and *n_prefill. */
static int step_batch_locked(struct sched *s, int *rows_out, int *n_prefill)
{
    int rerun = 0;
    for (int i = 0; i < s->n_run; i++) {
        struct choice *c = s->run[i];
        c->chunk = 0;
        const int plp = sched_wants_prompt_lps(c->req);
        int skip = c->req->kind == SREQ_EMBED;
        if (plp && c->n_fed < c->n_prompt && !c->prompt_lps && c->n_prompt > 1 &&
            !(c->prompt_lps = calloc((size_t)c->n_prompt - 1, sizeof *c->prompt_lps))) {
            c->req->error = FERRY_ERR_NOMEM; /* reaped at the next iteration */
            snprintf(c->req->errmsg, sizeof c->req->errmsg, "out of memory");
            skip = 1;
        }
        s->steps[i] = (struct sched_step_seq){c->n_feed, c->n_fed, skip, plp};
        c->b_n = 0;
        if (c->n_fed == c->n_feed && !c->req->paused && c->hist)
            rerun += c->n_prompt + c->out.n_gen - 1 - engine_seq_len(s->e, c->slot);
    }
    /* The rows re-run after rejected drafts (spec_settle) come out of the step's budget first: they and the
     * decode rows fit it, being fewer than the rows of the step that drafted. */
    struct sched_policy_params pp = s->pp;
    pp.max_batch_tokens -= rerun;
    struct sched_step_plan plan;
    const int planned = sched_policy_plan_step(&pp, s->steps, s->n_run, s->chunk, &plan) + rerun;
    const int k_max = spec_pick_locked(
        s, planned, sched_policy_spec_len(s->p.spec_n_max, plan.n_decode, s->p.max_batch_tokens - planned));
    /* `at` counts the rows that want logits: the engine returns them in batch order. */
    int n = 0, rows = 0, at = 0;
    s->n_plp = 0;
    s->n_draft_step = 0;
    s->want_hid = 0;
    for (int i = 0; i < s->n_run; i++) {
        struct choice *c = s->run[i];
        if (c->n_fed < c->n_feed || c->req->paused) continue; /* prefilling, or nobody reads it */
        const int pos = c->n_prompt + c->out.n_gen - 1;
        /* A recurrent state that went back to the checkpoint of a step with rejected drafts runs the kept
         * tokens again, ahead of its pending one (no logits); such a step does not draft, its checkpoint
         * being where those rows begin, not where the drafts would */
        const int again = c->hist && engine_seq_len(s->e, c->slot) < pos;
        for (int p = engine_seq_len(s->e, c->slot); c->hist && p < pos; p++) {
            s->b_tokens[n] = c->hist[p];
            s->b_pos[n] = p;
            s->b_seq[n] = c->slot;
            s->b_want[n++] = 0;
        }
        c->b_at = n;
        c->b_n = 1;
        s->want_hid |= c->mtp_on;
        s->b_tokens[n] = c->out.last;
        s->b_pos[n] = pos;
        s->b_seq[n] = c->slot;
        s->b_want[n] = 1;
        s->row_owner[rows] = c;
        s->row_at[rows++] = at++;
        n++;
        /* Drafts follow their sequence's pending token, each a row of its own. */
        c->n_draft = 0;
        c->spec_drawn = 1;
        c->spec_pos = pos;
        if (!c->hist) continue;
        if (k_max <= 0 || again || !sched_spec_accept_may_draft(&c->spec_acc)) {
            sched_spec_accept_note(&c->spec_acc, 0, 0); /* a step without drafts: the back-off counts it */
            continue;
        }
        int k = spec_cap(c->req, k_max);
        if (k > c->out.p.max_tokens - c->out.n_gen - 1) k = c->out.p.max_tokens - c->out.n_gen - 1;
        if (k > s->ctx - (pos + 1) - 1) k = s->ctx - (pos + 1) - 1;
        if (k <= 0) {
            sched_spec_accept_note(&c->spec_acc, 0, 0);
            continue;
        }
        if (s->p.draft || s->p.mtp) /* made before the lock was taken (draft_with_model), cut to the step */
            c->n_draft = c->n_model_draft < k ? c->n_model_draft : k;
        else
            c->n_draft = spec_ngram_draft(c->hist, pos + 1, SPEC_NGRAM_MIN, SPEC_NGRAM_MAX, k, c->draft);
        if (c->n_draft < spec_min(s, c->req)) c->n_draft = 0; /* too short to be worth its rows */
        /* a recurrent state is saved where the step begins, for spec_settle to come back to; without a
         * checkpoint the step goes without drafts */
        if (c->n_draft > 0 && engine_seq_checkpoint(s->e, c->slot) != FERRY_OK) c->n_draft = 0;
        if (c->n_draft == 0) sched_spec_accept_note(&c->spec_acc, 0, 0); /* (spec_settle notes drafts) */
        c->b_n += c->n_draft;
        for (int j = 0; j < c->n_draft; j++) {
            s->b_tokens[n] = c->draft[j];
            s->b_pos[n] = pos + 1 + j;
            s->b_seq[n] = c->slot;
            s->b_want[n] = 1;
            n++;
        }
        at += c->n_draft;
        s->n_draft_step += c->n_draft;
    }
    for (int i = 0; i < s->n_run; i++) {
        struct choice *c = s->run[i];
        const int k = s->chunk[i];
        if (!k) continue;
        const int plp = sched_wants_prompt_lps(c->req);
        c->b_at = n;
        c->b_n = k;
        s->want_hid |= c->mtp_on;
        c->n_draft = 0; /* its last row (a prompt's, or a sequence's fed again) is drawn alone */
        c->spec_drawn = 1;
        for (int j = 0; j < k; j++) {
            const int p = c->n_fed + j;
            s->b_tokens[n] = c->feed[p];
            s->b_pos[n] = p;
            s->b_seq[n] = c->slot;
            s->b_want[n] = plp && p + 1 < c->n_prompt;
            if (s->b_want[n]) {
                s->plp_owner[s->n_plp] = c;
                s->plp_pos[s->n_plp] = p;
                s->plp_at[s->n_plp++] = at++;
            }
            n++;
        }
        c->chunk = k;
        *n_prefill += k;
        if (c->n_fed + k == c->n_feed) {
            if (c->req->max_tokens > 0) {
                s->b_want[n - 1] = 1;
                s->row_owner[rows] = c;
                s->row_at[rows++] = at++;
            } else {
                c->fin = "length"; /* only the prompt's logprobs were asked */
            }
        }
    }
    *rows_out = rows;
    return n;
}

/* Outside the lock, after an embedding step: each choice's rows into its pooled vector (a sum for mean
 * pooling, divided once the prompt is complete). */
static void pool_rows(struct sched *s)
{
    for (int i = 0; i < s->n_run; i++) {
        struct choice *c = s->run[i];
        if (c->req->kind != SREQ_EMBED || !c->chunk) continue;
        const int mean = c->req->pooling == 0;
        const int rows = mean ? c->chunk : c->n_fed + c->chunk == c->n_prompt;
        for (int r = 0; r < rows; r++) {
            const float *h = s->e_out + (size_t)(c->e_at + r) * s->dim;
            for (int d = 0; d < s->dim; d++) c->embd[d] = mean ? c->embd[d] + h[d] : h[d];
        }
        if (mean && c->n_fed + c->chunk == c->n_prompt)
            for (int d = 0; d < s->dim; d++) c->embd[d] /= (float)c->n_prompt;
    }
}

/* With mu held, after a step that drew every output row: whether the next step may begin before this one's
 * outputs are published (overlap). It may when it is this step again one token further: every running choice
 * decodes and goes on (none finished, cancelled, failed, past its deadline), nobody waits for a free slot,
 * and the engine's begin returns as soon as the step is queued (no host layers in its plan). */
static int overlap_ok_locked(struct sched *s, int rows, int ne)
{
    if (!s->p.overlap || ne > 0 || s->n_plp > 0 || s->stop || rows != s->n_run || rows == 0) return 0;
    /* the next step may draft (speculative decoding): its tokens are drawn on the host */
    if (s->p.spec_n_max > 0 && rows <= SCHED_SPEC_MAX_SEQS) return 0;
    if (s->qhead && s->n_run < s->n_slots) return 0;
    cut_expired_locked(s, sched_now());
    for (int i = 0; i < s->n_run; i++) {
        const struct choice *c = s->run[i];
        const struct sreq *r = c->req;
        if (c->fin || c->n_fed < c->n_feed || r->cancelled || r->error || r->kind == SREQ_EMBED ||
            r->paused || c->out.oom)
            return 0;
    }
    return engine_step_overlaps(s->e, rows);
}

/* With mu held, before a step is built: the draft model (or the MTP block) drafts for every decoding
 * sequence that may speculate, with the lock released meanwhile (running choices change only on this
 * thread, and the fields used are this thread's). A failure leaves the step without drafts. The step may use
 * fewer drafts than made: its prefill chunks come first (step_batch_locked). */
static void draft_with_model_locked(struct sched *s)
{
    int n_dec = 0, n = 0;
    for (int i = 0; i < s->n_run; i++) {
        struct choice *c = s->run[i];
        c->n_model_draft = 0;
        n_dec += c->n_fed == c->n_feed && !c->req->paused && c->req->kind != SREQ_EMBED;
    }
    const int k_max = spec_pick_locked(
        s, n_dec, sched_policy_spec_len(s->p.spec_n_max, n_dec, s->p.max_batch_tokens - n_dec));
    if (k_max <= 0) return;
    int seq[SCHED_SPEC_MAX_SEQS], n_hist[SCHED_SPEC_MAX_SEQS], k[SCHED_SPEC_MAX_SEQS],
        n_out[SCHED_SPEC_MAX_SEQS];
    const int32_t *hist[SCHED_SPEC_MAX_SEQS];
    int32_t *out[SCHED_SPEC_MAX_SEQS];
    float p_min[SCHED_SPEC_MAX_SEQS];
    struct choice *who[SCHED_SPEC_MAX_SEQS];
    for (int i = 0; i < s->n_run && n < SCHED_SPEC_MAX_SEQS; i++) {
        struct choice *c = s->run[i];
        if (c->n_fed < c->n_feed || c->req->paused || !c->hist || c->fin ||
            !sched_spec_accept_may_draft(&c->spec_acc))
            continue;
        if (s->p.mtp && !c->mtp_on) continue;
        const int len = c->n_prompt + c->out.n_gen;            /* its tokens, the last one pending */
        if (engine_seq_len(s->e, c->slot) < len - 1) continue; /* rows to run again: no drafts (step_batch) */
        int kk = spec_cap(c->req, k_max);
        if (kk > c->out.p.max_tokens - c->out.n_gen - 1) kk = c->out.p.max_tokens - c->out.n_gen - 1;
        if (kk > s->ctx - len - 1) kk = s->ctx - len - 1;
        if (kk <= 0 || kk < spec_min(s, c->req)) continue;
        p_min[n] = c->req->spec_p_min >= 0 ? c->req->spec_p_min : s->p.spec_p_min;
        seq[n] = c->slot, hist[n] = c->hist, n_hist[n] = len, k[n] = kk, out[n] = c->draft, who[n++] = c;
    }
    if (!n) return;
    pthread_mutex_unlock(&s->mu);
    /* the drafter's time a draft position, measured where no sequence drafts for the first time (a draft
     * model's first proposal reads the whole prompt) */
    int rc = FERRY_OK, k_most = 0, fresh = 0;
    for (int i = 0; i < n; i++) {
        k_most = k_most > k[i] ? k_most : k[i];
        fresh |= who[i]->spec_acc.seen == 0;
    }
    const double t0 = sched_now();
    if (s->p.draft) {
        rc = draft_model_propose(s->p.draft, n, seq, hist, n_hist, k, p_min, out, n_out);
    } else {
        /* The block's slot drops the last step's drafts and goes on from the pending token; a slot that
         * lost its place no longer drafts. */
        for (int i = 0; i < n && !rc; i++) {
            const int pos = n_hist[i] - 1;
            n_out[i] = 0;
            mtp_seq_keep(s->p.mtp, seq[i], pos);
            if (mtp_seq_len(s->p.mtp, seq[i]) != pos) {
                mtp_seq_free(s->p.mtp, seq[i]);
                who[i]->mtp_on = 0;
                continue;
            }
            rc = mtp_draft(s->p.mtp, seq[i], hist[i][pos], k[i], p_min[i], out[i], &n_out[i], NULL);
        }
    }
    if (rc == FERRY_OK && !fresh) sched_spec_cost_draft_note(&s->spec_cost, k_most, sched_now() - t0);
    pthread_mutex_lock(&s->mu);
    if (rc) {
        FLOG_WARN("the draft model failed (%s): this step goes without drafts", ferry_status_str(rc));
        return;
    }
    for (int i = 0; i < n; i++) who[i]->n_model_draft = n_out[i];
}

/* The engine thread, after a verification step's rows were drawn: each speculating sequence keeps its
 * positions up to the last accepted draft (the rejected ones leave the KV cache and the prompt cache's
 * record), and its acceptance estimate takes the step (sched_spec_accept_note: after several steps whose
 * drafts were all rejected, a back-off). A recurrent state goes back to the checkpoint saved where the step
 * began: the next step runs the kept tokens again ahead of the pending one (step_batch_locked); one that went
 * back further (no checkpoint there) computes them as a prompt is. Returns the drafts accepted. */
static int spec_settle(struct sched *s, int rows)
{
    int accepted = 0;
    for (int i = 0; i < rows; i++) {
        struct choice *c = s->row_owner[i];
        if (c->n_draft <= 0) continue;
        const int acc = c->spec_drawn - 1, keep = c->spec_pos + c->spec_drawn;
        if (acc < c->n_draft) {
            const int kept = engine_seq_keep(s->e, c->slot, keep);
            if (s->p.prompt_cache && prompt_cache_len(s->pc, c->slot) > kept)
                prompt_cache_set_len(s->pc, c->slot, kept > 0 ? kept : 0);
            if (kept < c->spec_pos && c->hist && !c->out.fin) {
                c->spec_refeed = 1 + (kept > 0 ? kept : 0); /* (set up under mu, after the step) */
                if (c->mtp_on) mtp_seq_free(s->p.mtp, c->slot);
                c->mtp_on = 0;
            }
        }
        metrics_spec(s->m, c->n_draft, acc);
        sched_spec_accept_note(&c->spec_acc, c->n_draft, acc);
        accepted += acc;
    }
    return accepted;
}

/* The engine thread, after a step with hidden states (s->want_hid) was drawn and settled: the MTP block
 * takes each drafting sequence's rows that stay (a prompt chunk; a pending token and its accepted drafts)
 * with the model's hidden states of them, so that its slot holds what the engine's does. A slot that cannot
 * follow stops drafting. */
static void mtp_feed_step(struct sched *s)
{
    for (int i = 0; i < s->n_run; i++) {
        struct choice *c = s->run[i];
        if (!c->mtp_on || c->b_n <= 0) continue;
        const int pos = c->chunk ? c->n_fed : c->spec_pos, n = c->chunk ? c->b_n : c->spec_drawn;
        if (!c->chunk) mtp_seq_keep(s->p.mtp, c->slot, pos);
        const int rc =
            mtp_seq_feed(s->p.mtp, c->slot, pos, s->b_tokens + c->b_at, n, s->hid + (size_t)c->b_at * s->dim);
        if (rc) {
            FLOG_WARN("the multi-token-prediction block failed (%s): slot %d drafts no more",
                      ferry_status_str(rc), c->slot);
            mtp_seq_free(s->p.mtp, c->slot);
            c->mtp_on = 0;
        }
    }
}

/* With mu held, after a row of c was sampled: its token joins the record a resumed sequence recomputes from
 * (kept where it may give its slot up mid-generation: not with prompt logprobs, not for embeddings). */
static void record_gen(struct choice *c)
{
    if (c->no_yield || c->req->kind == SREQ_EMBED || sched_wants_prompt_lps(c->req)) return;
    /* one token a step, or (speculative decoding) the step's tokens from the sequence's history */
    if (c->n_rec != c->out.n_gen - 1 && !(c->hist && c->n_rec < c->out.n_gen)) { /* a token missed */
        c->no_yield = 1;
        return;
    }
    while (c->n_rec < c->out.n_gen) {
        if (c->n_rec == c->gen_cap) {
            const int cap = c->gen_cap ? c->gen_cap * 2 : 64;
            int32_t *g = realloc(c->gen, (size_t)cap * sizeof *g);
            if (!g) {
                c->no_yield = 1;
                return;
            }
            c->gen = g;
            c->gen_cap = cap;
        }
        c->gen[c->n_rec] = c->hist ? c->hist[c->n_prompt + c->n_rec] : c->out.last;
        c->n_rec++;
    }
}

/* With mu held: the rows of a step that ended are published (text, logprobs, token timings). */
static void publish_rows_locked(struct sched *s, struct choice *const *owner, int rows, double t)
{
    for (int i = 0; i < rows; i++) {
        struct choice *c = owner[i];
        struct sreq *r = c->req;
        /* a verification step generates its accepted drafts and one token more, all at once */
        for (int j = 0; j < c->spec_drawn; j++) {
            const int first = c->out.n_gen - c->spec_drawn + j == 0;
            metrics_token_out(s->m, first, first ? t - r->t_arrival : j ? 0.0 : t - c->t_last);
            if (first) c->t_first = t;
        }
        c->t_last = t;
        if (c->out.release) {
            if (buf_append(&c->text, &c->text_len, &c->text_cap, c->out.hold, c->out.release)) {
                r->error = FERRY_ERR_NOMEM;
                snprintf(r->errmsg, sizeof r->errmsg, "out of memory");
            }
            seq_output_take(&c->out, c->out.release);
        }
        const int n_lp = c->n_draft > 0 && c->spec_lps ? c->spec_drawn : c->out.has_lp;
        for (int j = 0; j < n_lp; j++) {
            const struct lp_entry *e = c->n_draft > 0 && c->spec_lps ? &c->spec_lps[j] : &c->out.lp;
            if (c->n_lps == c->lps_cap) {
                int nc = c->lps_cap ? c->lps_cap * 2 : 16;
                struct lp_entry *q = realloc(c->lps, (size_t)nc * sizeof *q);
                if (q) {
                    c->lps = q;
                    c->lps_cap = nc;
                }
            }
            if (c->n_lps < c->lps_cap) {
                c->lps[c->n_lps++] = *e;
            } else { /* an answer without this token's logprobs would be wrong, not short */
                r->error = FERRY_ERR_NOMEM;
                snprintf(r->errmsg, sizeof r->errmsg, "out of memory");
            }
        }
        c->n_completion = c->out.n_gen;
        record_gen(c);
        if (c->out.oom) {
            r->error = FERRY_ERR_NOMEM;
            snprintf(r->errmsg, sizeof r->errmsg, "out of memory");
        }
        sched_req_signal_locked(r);
    }
}

/* With mu held: every running request fails with rc (reaped at the top of the loop). */
static void fail_running_locked(struct sched *s, int rc, int n)
{
    FLOG_ERROR("engine_step over %d tokens failed: %s", n, ferry_status_str(rc));
    for (int i = 0; i < s->n_run; i++) {
        struct sreq *r = s->run[i]->req;
        r->error = rc;
        snprintf(r->errmsg, sizeof r->errmsg, "the engine failed: %s", ferry_status_str(rc));
        sched_req_signal_locked(r);
    }
}

/* ---- sharing the slots between clients (sched_policy.h) ---- */

/* With mu held: running and queued sequences by client; returns the clients with either. */
static int count_clients_locked(struct sched *s)
{
    for (int i = 0; i < s->clients_cap; i++) s->running_of[i] = s->waiting_of[i] = 0;
    for (int i = 0; i < s->n_run; i++) s->running_of[s->run[i]->req->client_id]++;
    for (const struct choice *c = s->qhead; c; c = c->qnext) s->waiting_of[c->req->client_id]++;
    int n = 0;
    for (int i = 0; i < s->clients_cap; i++) n += s->running_of[i] + s->waiting_of[i] > 0;
    return n;
}

/* With mu held: the queued choice to admit next (and the one before it in the queue), or NULL. With fair
 * sharing, the first of a client below its share goes first; a stream paused off its slot waits for its
 * client to read. */
static struct choice *pick_locked(struct sched *s, struct choice **prev_out)
{
    *prev_out = NULL;
    if (s->n_queued > s->q_cap) {
        const int cap = s->n_queued * 2;
        int *qc = realloc(s->q_client, (size_t)cap * sizeof *qc);
        if (qc) s->q_client = qc;
        unsigned char *qr = qc ? realloc(s->q_ready, (size_t)cap) : NULL;
        if (qr) s->q_ready = qr;
        if (qc && qr) s->q_cap = cap;
    }
    int nq = 0;
    for (const struct choice *c = s->qhead; c && nq < s->q_cap; c = c->qnext, nq++) {
        s->q_client[nq] = c->req->client_id;
        s->q_ready[nq] = !(c->resume && c->req->paused);
    }
    if (nq == 0) return s->qhead; /* (no memory for the arrays: the head) */
    const int n_clients = count_clients_locked(s);
    const int share = s->p.fair_share ? sched_policy_fair_share(s->n_slots, n_clients) : s->n_slots;
    const int k = sched_policy_fair_pick(s->q_client, s->q_ready, nq, s->running_of,
                                         s->p.fair_share ? share : s->n_slots + 1);
    if (k < 0) return NULL;
    struct choice *c = s->qhead;
    for (int i = 0; i < k; i++) *prev_out = c, c = c->qnext;
    return c;
}

/* With mu held: the running choice at run[i] gives its slot up and goes back to the head of the queue. A
 * stream is resumed later from its record (prompt and tokens so far, recomputed); an embedding input starts
 * over. */
static void yield_locked(struct sched *s, int i)
{
    struct choice *c = s->run[i];
    struct sreq *r = c->req;
    if (r->kind == SREQ_EMBED) {
        seq_output_free(&c->out);
        free(c->embd);
        c->embd = NULL;
        c->resume = 0;
    } else {
        const int n = c->n_prompt + c->n_rec;
        int32_t *f =
            c->feed_buf; /* (yield_for_locked made it hold n, and checked that the record is whole) */
        memcpy(f, c->prompt, (size_t)c->n_prompt * sizeof *f);
        memcpy(f + c->n_prompt, c->gen, (size_t)c->n_rec * sizeof *f);
        c->feed = f;
        c->n_feed = n;
        c->resume = 1;
    }
    engine_seq_free(s->e, c->slot);
    prompt_cache_drop(s->pc, c->slot);
    s->kv_reserved -= sched_kv_need(s, c);
    s->slot_free[c->slot] = 1;
    c->slot = -1;
    c->n_fed = 0;
    c->chunk = 0;
    memmove(&s->run[i], &s->run[i + 1], (size_t)(s->n_run - i - 1) * sizeof *s->run);
    s->n_run--;
    c->state = CHOICE_QUEUED;
    c->qnext = s->qhead;
    s->qhead = c;
    if (!s->qtail) s->qtail = c;
    s->n_queued++;
    metrics_count_preempted(s->m);
}

/* With mu held, no slot free: a running sequence gives its slot to the waiting choice w if the policy names
 * one. Returns 1 when a slot was freed. */
static int yield_for_locked(struct sched *s, const struct choice *w)
{
    const int n_clients = count_clients_locked(s);
    const int share = s->p.fair_share ? sched_policy_fair_share(s->n_slots, n_clients) : s->n_slots;
    for (int i = 0; i < s->n_run; i++) {
        struct choice *c = s->run[i];
        const struct sreq *r = c->req;
        struct sched_fair_seq *q = &s->fair_run[i];
        q->client = r->client_id;
        q->how = SCHED_YIELD_NO;
        q->cost = c->n_fed;
        if (c->fin || r->cancelled || r->error || c == w) continue;
        if (r->kind == SREQ_EMBED) {
            q->how = s->p.fair_share ? SCHED_YIELD_SHARE : SCHED_YIELD_NO;
        } else if (!sched_wants_prompt_lps(r) && !c->no_yield && c->n_fed == c->n_feed &&
                   c->n_rec == c->out.n_gen && c->out.n_gen > 0 && r->n < 2) {
            /* a decoding sequence of its own (not one whose prompt's blocks others share) */
            const int n = c->n_prompt + c->n_rec;
            if (c->feed_cap < n) {
                const int cap = n + 256;
                int32_t *f = realloc(c->feed_buf, (size_t)cap * sizeof *f);
                if (!f) continue;
                if (c->feed == c->feed_buf) c->feed = f; /* (a resumed one reads it) */
                c->feed_buf = f;
                c->feed_cap = cap;
            }
            q->how = r->paused ? SCHED_YIELD_PAUSED : s->p.fair_share ? SCHED_YIELD_SHARE : SCHED_YIELD_NO;
            q->cost = n;
        }
    }
    const int v = sched_policy_fair_victim(s->fair_run, s->n_run, s->running_of, share, w->req->client_id);
    if (v < 0) return 0;
    yield_locked(s, v);
    return 1;
}

/* The prompt cache's view of what a free slot can give back (its recurrent state only to a checkpoint). */
static int slot_reusable(void *ctx, int q, int n)
{
    return engine_seq_reusable(((struct sched *)ctx)->e, q, n);
}

/* With mu held, at the top of the loop when no step is on its way: cancelled, failed and expired choices
 * leave their slots, then queued ones are admitted first come first served while slots and KV room last. */
static void reap_and_admit_locked(struct sched *s)
{
    double now = sched_now();
    cut_expired_locked(s, now);
    for (int i = 0; i < s->n_run;) {
        struct sreq *r = s->run[i]->req;
        if (r->cancelled || r->error) {
            retire_locked(s, i, NULL);
        } else {
            i++;
        }
    }
    int yields = 0;
    while (s->qhead) {
        struct choice *prev = NULL, *c = pick_locked(s, &prev);
        if (!c) break;
        if (s->n_run >= s->n_slots) {
            /* no free slot: one that may be given up goes to the picked sequence (the sharing policy); the
             * one given up joins the queue's head, so the pick is made again */
            if (yields++ < s->n_slots && yield_for_locked(s, c)) continue;
            break;
        }
        const int feeds =
            c->req->max_tokens > 0 || sched_wants_prompt_lps(c->req) || c->req->kind == SREQ_EMBED;
        /* A later choice of a prompt waits for the first one's prefill, then shares its KV blocks. */
        struct choice *lead = feeds && !c->resume ? running_leader_locked(s, c) : NULL;
        if (lead && lead->n_fed < lead->n_prompt) break;
        const int use_cache = !lead && !c->resume && s->p.prompt_cache && !c->req->no_prompt_cache &&
                              !sched_wants_prompt_lps(c->req) && c->req->kind != SREQ_EMBED;
        int reuse = 0, slot = feeds ? prompt_cache_pick(s->pc, s->slot_free, c->prompt, c->n_prompt,
                                                        use_cache, slot_reusable, s, &reuse)
                                    : -1;
        /* the picked sequence waits for KV room rather than being overtaken */
        if (feeds && !fits_locked(s, c, slot)) break;
        if (prev)
            prev->qnext = c->qnext;
        else
            s->qhead = c->qnext;
        if (s->qtail == c) s->qtail = prev;
        s->n_queued--;
        if (!feeds) { /* max_tokens 0 and nothing to compute */
            sched_choice_done_locked(s, c, "length");
            continue;
        }
        int arc = admit_locked(s, c, slot, reuse, lead);
        if (arc) {
            c->req->error = arc;
            snprintf(c->req->errmsg, sizeof c->req->errmsg, "cannot start a sequence: %s",
                     ferry_status_str(arc));
            sched_choice_done_locked(s, c, NULL);
        }
    }
}

/* With mu held (engine thread): the KV blocks that free slots still hold for their prompt caches. A new
 * sequence takes them back when it needs them (fits_locked), so /metrics counts them as free. */
static int kv_blocks_idle_locked(const struct sched *s)
{
    int n = 0;
    for (int q = 0; q < s->n_slots; q++)
        if (s->slot_free[q]) n += sched_policy_blocks(&s->pp, engine_seq_len(s->e, q));
    return n;
}

/* The loop: admit, build a step, run it, sample or take its draws, publish. A decode step that drew every
 * row may have its successor begun before its own outputs are published (overlap_ok_locked): the device
 * then runs step N+1 while this thread publishes step N and wakes its readers. `ahead` says the step of
 * this iteration was begun so, at the end of the last one. */
void *sched_engine_main(void *arg)
{
    struct sched *s = arg;
    struct engine_stats st;
    int ahead = 0, ahead_n = 0, ahead_rows = 0;
    double ahead_t0 = 0;
    pthread_mutex_lock(&s->mu);
    for (;;) {
        int rows = 0, n_prefill = 0, n = 0, ne = 0, rc = 0, drew = 0, n_spec_accepted = 0;
        const int overlapped = ahead;
        double t0, t1;
        if (ahead) {
            ahead = 0;
            n = ahead_n;
            rows = ahead_rows;
            t0 = ahead_t0;
            pthread_mutex_unlock(&s->mu);
            rc = engine_step_draw_end(s->e, s->drawn);
            drew = rc == 0;
            t1 = sched_now();
        } else {
            reap_and_admit_locked(s);
            engine_get_stats(s->e, &st);
            metrics_set_engine(s->m, s->n_queued, s->n_run, &st, kv_blocks_idle_locked(s));
            if (s->n_run == 0) {
                if (s->stop) break;
                pthread_cond_wait(&s->cv_work, &s->mu);
                continue;
            }

            /* one step: every decoding sequence gets its token (and its drafts), then prefill chunks in
             * admission order */
            if (s->p.draft || s->p.mtp) draft_with_model_locked(s);
            n = step_batch_locked(s, &rows, &n_prefill);
            ne = embed_batch_locked(s);
            if (n == 0 &&
                ne == 0) { /* every running stream is paused: wait for a reader, a request, a deadline */
                struct timespec ts;
                clock_gettime(CLOCK_MONOTONIC, &ts);
                ts.tv_nsec += 100 * 1000000L;
                if (ts.tv_nsec >= 1000000000L) ts.tv_sec++, ts.tv_nsec -= 1000000000L;
                pthread_cond_timedwait(&s->cv_work, &s->mu, &ts);
                continue;
            }
            pthread_mutex_unlock(&s->mu);

            const struct batch b = {
                n, s->b_tokens, s->b_pos, s->b_seq, s->b_want, 0, s->want_hid ? s->hid : NULL};
            t0 = sched_now();
            rc = FERRY_ERR_UNSUPPORTED;
            if (n > 0 && rows > 0 && s->draws && s->n_plp == 0 && s->n_draft_step == 0) {
                /* every output row is a draw */
                s->rows_do = ROWS_MASK;
                row_pool_run(s->samplers, rows);
                rc = engine_step_draw(s->e, &b, s->draw, s->drawn);
                drew = rc == 0;
            }
            if (rc == FERRY_ERR_UNSUPPORTED) rc = n > 0 ? engine_step(s->e, &b, s->logits) : 0;
            t1 = sched_now();
            if (rc == 0 && n > 0 && s->p.spec_n_max > 0) sched_spec_cost_note(&s->spec_cost, n, t1 - t0);
        }
        const struct batch b = {n, s->b_tokens, s->b_pos, s->b_seq, s->b_want, 0, NULL};
        if (rc == 0 && n > 0) {
            if (s->p.prompt_cache) record_tokens(s, &b);
            s->rows_do = drew ? ROWS_DRAWN : ROWS_SAMPLE;
            row_pool_run(s->samplers, rows);
            prompt_logprobs(s);
            if (s->n_draft_step) n_spec_accepted = spec_settle(s, rows);
            if (s->want_hid) mtp_feed_step(s);
        }
        if (rc == 0 && ne > 0) {
            struct batch eb = {ne, s->e_tokens, s->e_pos, s->e_seq, s->e_want, 1, NULL};
            rc = engine_step(s->e, &eb, s->e_out);
            if (rc == 0) pool_rows(s);
            n_prefill += ne;
        }
        double t2 = sched_now();

        pthread_mutex_lock(&s->mu);
        if (rc) {
            fail_running_locked(s, rc, n);
            continue; /* reaped at the top of the loop */
        }
        for (int i = 0; i < s->n_run; i++) {
            struct choice *c = s->run[i];
            c->n_fed += c->chunk;
            if (c->spec_refeed) { /* the sequence so far, its pending token last, is fed again */
                c->feed = c->hist;
                c->n_feed = c->n_prompt + c->out.n_gen;
                c->n_fed = c->spec_refeed - 1;
                c->spec_refeed = 0;
            }
            if (c->req->kind == SREQ_EMBED && c->n_fed == c->n_feed) c->fin = "stop"; /* pooled: done */
            if (c->chunk && c->n_fed == c->n_prompt && sched_wants_prompt_lps(c->req)) {
                c->prompt_lps_ready = 1;
                sched_req_signal_locked(c->req);
            }
        }
        struct choice **owner = s->row_owner;
        if (drew && overlap_ok_locked(s, rows, ne)) {
            /* the next step (the same rows, one token on) begins before this one's outputs go out */
            memcpy(s->pub_owner, s->row_owner, (size_t)rows * sizeof *owner);
            owner = s->pub_owner;
            int rows2 = 0, prefill2 = 0;
            const int n2 = step_batch_locked(s, &rows2, &prefill2);
            pthread_mutex_unlock(&s->mu);
            const struct batch b2 = {n2, s->b_tokens, s->b_pos, s->b_seq, s->b_want, 0, NULL};
            s->rows_do = ROWS_MASK;
            row_pool_run(s->samplers, rows2);
            const double t3 = sched_now();
            const int rc2 = engine_step_draw_begin(s->e, &b2, s->draw);
            pthread_mutex_lock(&s->mu);
            if (rc2 == 0) {
                ahead = 1;
                ahead_n = n2;
                ahead_rows = rows2;
                ahead_t0 = t3;
            } else if (rc2 != FERRY_ERR_UNSUPPORTED) {
                fail_running_locked(s, rc2, n2); /* after this step's outputs, below */
            }
        }
        publish_rows_locked(s, owner, rows, t2);
        if (!ahead)
            for (int i = 0; i < s->n_run;) {
                struct choice *c = s->run[i];
                if (c->fin && c->n_fed == c->n_feed) {
                    const char *f = c->fin;
                    c->fin = NULL;
                    retire_locked(s, i, f);
                } else {
                    i++;
                }
            }
        metrics_step_done(s->m, n_prefill, rows + n_spec_accepted, drew ? rows : 0, t1 - t0, n + ne, s->n_run,
                          overlapped);
        if (ahead) {
            engine_get_stats(s->e, &st);
            metrics_set_engine(s->m, s->n_queued, s->n_run, &st, kv_blocks_idle_locked(s));
        }
    }
    pthread_mutex_unlock(&s->mu);
    return NULL;
}
