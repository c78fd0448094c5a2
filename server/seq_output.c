/* seq_output — sampling and text of one sequence (see seq_output.h). No locks: the owner publishes. */
#include "server/seq_output.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/core/status.h"

/* ---- the vocabulary tables ---------------------------------------------------------------------------- */

int seq_vocab_init(struct seq_vocab **out, const struct tokenizer *t, int n_vocab, int with_grammar)
{
    *out = NULL;
    struct seq_vocab *v = calloc(1, sizeof *v);
    if (!v) return FERRY_ERR_NOMEM;
    v->tok = t;
    v->n_vocab = n_vocab;
    v->piece = calloc((size_t)n_vocab, sizeof *v->piece);
    v->piece_len = calloc((size_t)n_vocab, sizeof *v->piece_len);
    v->kind = calloc((size_t)n_vocab, 1);
    if (!v->piece || !v->piece_len || !v->kind) goto fail;
    if (!t) {
        *out = v;
        return 0;
    }
    for (int32_t id = 0; id < n_vocab; id++) {
        v->piece[id] = tokenizer_piece(t, id, &v->piece_len[id]);
        if (tokenizer_is_eog(t, id))
            v->kind[id] = SEQ_TOK_EOG;
        else if (!v->piece[id] || tokenizer_is_control(t, id))
            v->kind[id] = SEQ_TOK_CONTROL;
    }
    if (!with_grammar) {
        *out = v;
        return 0;
    }
    uint8_t *is_text = malloc((size_t)n_vocab);
    if (!is_text) goto fail;
    for (int32_t id = 0; id < n_vocab; id++) is_text[id] = v->kind[id] == SEQ_TOK_TEXT;
    if (gvocab_init(&v->gvocab, n_vocab, v->piece, v->piece_len, is_text)) v->gvocab = NULL;
    free(is_text);
    if (!v->gvocab) goto fail;
    *out = v;
    return 0;
fail:
    seq_vocab_free(v);
    return FERRY_ERR_NOMEM;
}

void seq_vocab_free(struct seq_vocab *v)
{
    if (!v) return;
    free(v->piece);
    free(v->piece_len);
    free(v->kind);
    gvocab_free(v->gvocab);
    free(v);
}

/* ---- one sequence ----------------------------------------------------------------------------------- */

int seq_output_init(struct seq_output *o, const struct seq_vocab *v, const struct seq_output_params *p,
                    const struct sampler_params *sp)
{
    seq_output_free(o);
    o->v = v;
    o->p = *p;
    int rc = sampler_init(&o->smp, sp, v->n_vocab);
    if (rc) {
        o->smp = NULL;
        return rc;
    }
    if (p->grammar) {
        o->gst = grammar_state_new(p->grammar);
        o->gscr = gscratch_new();
        o->allowed = malloc((size_t)v->n_vocab);
        if (!o->gst || !o->gscr || !o->allowed || !v->gvocab) {
            seq_output_free(o);
            return FERRY_ERR_NOMEM;
        }
    }
    if (v->tok) detok_init(&o->dt, v->tok);
    return 0;
}

void seq_output_free(struct seq_output *o)
{
    sampler_free(o->smp);
    grammar_state_free(o->gst);
    gscratch_free(o->gscr);
    free(o->allowed);
    free(o->hold);
    memset(o, 0, sizeof *o);
}

void seq_output_accept(struct seq_output *o, const int32_t *toks, int n)
{
    for (int i = 0; i < n; i++) sampler_accept(o->smp, toks[i]);
}

void seq_output_take(struct seq_output *o, size_t n)
{
    if (n > o->hold_len) n = o->hold_len;
    memmove(o->hold, o->hold + n, o->hold_len - n);
    o->hold_len -= n;
    if (o->hold) o->hold[o->hold_len] = 0;
    o->release = o->release > n ? o->release - n : 0;
}

static void hold_append(struct seq_output *o, const char *src, size_t n)
{
    if (o->hold_len + n + 1 > o->hold_cap) {
        size_t nc = o->hold_cap ? o->hold_cap * 2 : 256;
        while (nc < o->hold_len + n + 1) nc *= 2;
        char *q = realloc(o->hold, nc);
        if (!q) {
            o->oom = 1;
            return;
        }
        o->hold = q;
        o->hold_cap = nc;
    }
    memcpy(o->hold + o->hold_len, src, n);
    o->hold_len += n;
    o->hold[o->hold_len] = 0;
}

/* Earliest offset of any stop string in t[0..len), or -1. */
static long stop_find(const struct seq_output_params *p, const char *t, size_t len, int *which)
{
    long best = -1;
    for (int i = 0; i < p->n_stops; i++) {
        const char *hit = memmem(t, len, p->stops[i], strlen(p->stops[i]));
        if (hit && (best < 0 || hit - t < best)) best = hit - t, *which = i;
    }
    return best;
}

/* Length of the longest suffix of t[0..len) that is a proper prefix of some stop string: those bytes may
 * still become a stop and must be held back. */
static size_t stop_holdback(const struct seq_output_params *p, const char *t, size_t len)
{
    size_t best = 0;
    for (int i = 0; i < p->n_stops; i++) {
        size_t sl = strlen(p->stops[i]);
        size_t k = sl - 1 < len ? sl - 1 : len;
        for (; k > best; k--)
            if (!memcmp(t + len - k, p->stops[i], k)) {
                best = k;
                break;
            }
    }
    return best;
}

/* Constrained decoding: the tokens that may continue the output within the grammar, and the end-of-generation
 * tokens exactly when the output may end. The budget (tokens left) lets the grammar steer towards an end that
 * fits. If nothing would be left, the first end token stays allowed, so the step still samples something. */
const uint8_t *seq_output_mask(struct seq_output *o)
{
    const struct seq_vocab *v = o->v;
    if (!o->p.grammar) return NULL;
    int budget = o->p.max_tokens - o->n_gen;
    const int ctx_left = o->p.ctx - (o->p.n_prompt + o->n_gen);
    if (ctx_left < budget) budget = ctx_left;
    int acc = grammar_mask(o->p.grammar, o->gst, v->gvocab, budget, o->allowed, o->gscr);
    if (acc < 0) { /* out of memory for the mask: only ending is safe */
        memset(o->allowed, 0, (size_t)v->n_vocab);
        acc = 1;
    }
    int any = 0, first_eog = -1;
    for (int32_t t = 0; t < v->n_vocab; t++) {
        if (v->kind[t] == SEQ_TOK_EOG) {
            o->allowed[t] = (uint8_t)acc;
            if (first_eog < 0) first_eog = t;
        } else if (v->kind[t] != SEQ_TOK_TEXT) {
            o->allowed[t] = 0;
        }
        any |= o->allowed[t];
    }
    if (!any && first_eog >= 0) o->allowed[first_eog] = 1;
    o->first_eog = first_eog;
    o->mask_ready = 1;
    return o->allowed;
}

/* The mask on a logits row: what it refuses gets -inf. When every allowed token has -inf already, the first
 * end token gets 0, so that the draw still ends the output. */
static void mask_apply(const struct seq_output *o, float *row)
{
    int finite = 0;
    for (int32_t t = 0; t < o->v->n_vocab; t++)
        if (!o->allowed[t])
            row[t] = -INFINITY;
        else if (row[t] > -INFINITY)
            finite++;
    if (!finite && o->first_eog >= 0) row[o->first_eog] = 0.0f;
}

/* Everything after the draw of tok: the grammar, logprobs (lp, when asked: computed by the caller), the
 * penalties' history, text, stop strings and the finish. */
static void token_chosen(struct seq_output *o, int32_t tok, const struct lp_entry *lp)
{
    const struct seq_vocab *v = o->v;
    const struct seq_output_params *p = &o->p;
    o->has_lp = 0;
    o->fin = NULL;
    o->release = 0;
    o->mask_ready = 0;                         /* the grammar moves on */
    if (tok < 0 || tok >= v->n_vocab) tok = 0; /* a sampler bug must not index out of range */
    int grammar_done = 0;
    if (p->grammar && v->kind[tok] == SEQ_TOK_TEXT) {
        grammar_state_feed(p->grammar, o->gst, v->piece[tok], v->piece_len[tok]);
        grammar_done = grammar_state_finished(p->grammar, o->gst); /* nothing may follow: this is the end */
    }
    if (p->logprobs >= 0 && lp) {
        o->lp = *lp;
        o->has_lp = 1;
    }
    sampler_accept(o->smp, tok);
    o->n_gen++;
    o->last = tok;
    const struct tokenizer *t = v->tok;
    const int eog = t && !p->ignore_eos && tokenizer_is_eog(t, tok);
    o->eog = eog;
    const int length = o->n_gen >= p->max_tokens || p->n_prompt + o->n_gen >= p->ctx;
    if (t) {
        char buf[4096];
        if (p->keep_special && !eog && v->kind[tok] == SEQ_TOK_CONTROL) {
            const char *sp = tokenizer_token_str(t, tok);
            if (sp) hold_append(o, sp, strlen(sp));
        }
        if (!eog) {
            int k = detok_push(&o->dt, tok, buf, sizeof buf);
            if (k > 0) hold_append(o, buf, (size_t)k);
        }
        if (eog || length || grammar_done) {
            int k = detok_flush(&o->dt, buf, sizeof buf);
            if (k > 0) hold_append(o, buf, (size_t)k);
        }
    }
    int which = -1;
    long at = stop_find(p, o->hold ? o->hold : "", o->hold_len, &which);
    if (at >= 0) {
        o->stop_hit = which + 1;
        o->hold_len = (size_t)at;
        o->release = (size_t)at;
        o->fin = "stop";
    } else if (eog || grammar_done) {
        o->release = o->hold_len;
        o->fin = "stop";
    } else if (length) {
        o->release = o->hold_len;
        o->fin = "length";
    } else {
        o->release = o->hold_len - stop_holdback(p, o->hold, o->hold_len);
    }
}

int32_t seq_output_step(struct seq_output *o, float *row, float *raw)
{
    const struct seq_vocab *v = o->v;
    const struct seq_output_params *p = &o->p;
    if (p->logprobs >= 0)
        memcpy(raw, row, (size_t)v->n_vocab * sizeof(float)); /* the model's, unconstrained */
    if (o->mask_ready || seq_output_mask(o)) mask_apply(o, row);
    int32_t tok = sampler_sample(o->smp, row);
    if (tok < 0 || tok >= v->n_vocab) tok = 0;
    struct lp_entry lp, *lpp = NULL;
    if (p->logprobs >= 0) {
        lp.id = tok;
        lp.n_top = p->logprobs > SEQ_MAX_TOP_LOGPROBS ? SEQ_MAX_TOP_LOGPROBS : p->logprobs;
        lp.lp = sampler_logprob(raw, v->n_vocab, tok, lp.n_top, lp.top_id, lp.top_lp);
        lpp = &lp;
    }
    token_chosen(o, tok, lpp);
    return tok;
}

void seq_output_drawn(struct seq_output *o, int32_t tok, const struct lp_entry *lp)
{
    sampler_advance(o->smp); /* the draw used this sampler's (seed, step) */
    token_chosen(o, tok, lp);
}
