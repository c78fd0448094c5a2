/* draft_model — greedy drafts from a second model, its slots kept in step with the target's (draft_model.h).
 */
#include "runtime/draft_model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/core/status.h"

struct draft_model {
    struct engine *e;
    int n_seqs, ctx, n_vocab, max_batch;
    int32_t *rec;            /* (n_seqs, ctx) the tokens each slot's KV holds */
    int *n_rec;              /* (n_seqs) */
    int32_t *tok, *pos, *sq; /* (max_batch) a step's batch */
    uint8_t *want;           /* (max_batch) */
    int *row_of;             /* (max_batch) the proposal whose logits row this is */
    float *logits;           /* (max_batch, n_vocab) */
    int *at;                 /* (max_batch >= n_seqs) per proposal: the next position to feed; -1: done */
    const float *p_min;      /* the proposal being made: its lowest draft probabilities, or NULL */
};

int draft_model_init(struct draft_model **out, const struct model_file *mf, const struct engine_params *p,
                     int n_vocab_target, char err[256])
{
    *out = NULL;
    if (mf->hp.n_vocab != n_vocab_target) {
        snprintf(err, 256,
                 "the draft model's vocabulary has %d tokens, the model's %d: they must be the same",
                 mf->hp.n_vocab, n_vocab_target);
        return FERRY_ERR_INVALID;
    }
    struct draft_model *d = calloc(1, sizeof *d);
    if (!d) return FERRY_ERR_NOMEM;
    int rc = engine_init(&d->e, mf, p, err);
    if (rc) {
        free(d);
        return rc;
    }
    d->n_seqs = engine_n_seqs(d->e);
    d->ctx = engine_ctx_size(d->e);
    d->n_vocab = n_vocab_target;
    d->max_batch = p->max_batch_tokens > d->n_seqs ? p->max_batch_tokens : d->n_seqs;
    const size_t mb = (size_t)d->max_batch;
    d->rec = malloc((size_t)d->n_seqs * d->ctx * sizeof *d->rec);
    d->n_rec = calloc((size_t)d->n_seqs, sizeof *d->n_rec);
    d->tok = malloc(mb * 3 * sizeof *d->tok);
    d->want = malloc(mb);
    d->row_of = malloc(mb * sizeof *d->row_of);
    d->at = malloc(mb * sizeof *d->at);
    d->logits = malloc((size_t)d->n_seqs * d->n_vocab * sizeof *d->logits);
    if (!d->rec || !d->n_rec || !d->tok || !d->want || !d->row_of || !d->at || !d->logits) {
        draft_model_free(d);
        return FERRY_ERR_NOMEM;
    }
    d->pos = d->tok + mb;
    d->sq = d->tok + 2 * mb;
    *out = d;
    return 0;
}

void draft_model_free(struct draft_model *d)
{
    if (!d) return;
    engine_free(d->e);
    free(d->rec);
    free(d->n_rec);
    free(d->tok);
    free(d->want);
    free(d->row_of);
    free(d->at);
    free(d->logits);
    free(d);
}

const struct engine *draft_model_engine(const struct draft_model *d)
{
    return d->e;
}

void draft_model_seq_free(struct draft_model *d, int seq)
{
    if (seq < 0 || seq >= d->n_seqs) return;
    engine_seq_free(d->e, seq);
    d->n_rec[seq] = 0;
}

static int32_t argmax(const float *row, int n)
{
    int32_t best = 0;
    for (int i = 1; i < n; i++)
        if (row[i] > row[best]) best = i; /* ties: the lowest id; NaN never wins */
    return best;
}

/* Runs the batch built so far; each row with logits gives its proposal's next draft. */
/* The probability softmax gives the row's largest logit, top. */
static float top_prob(const float *row, int n, float top)
{
    double sum = 0;
    for (int i = 0; i < n; i++) sum += exp((double)row[i] - top);
    return (float)(1.0 / sum);
}

static int run_step(struct draft_model *d, int n_tok, int n_rows, int32_t *const *out, int *n_out)
{
    struct batch b = {
        .n_tokens = n_tok, .tokens = d->tok, .pos = d->pos, .seq = d->sq, .want_logits = d->want};
    int rc = engine_step(d->e, &b, d->logits);
    if (rc) return rc;
    for (int r = 0; r < n_rows; r++) {
        const int i = d->row_of[r];
        const float *row = d->logits + (size_t)r * d->n_vocab;
        const int32_t t = argmax(row, d->n_vocab);
        if (d->p_min && d->p_min[i] > 0 && top_prob(row, d->n_vocab, row[t]) < d->p_min[i]) {
            d->at[i] = -1; /* unsure: the draft ends before this token */
            continue;
        }
        out[i][n_out[i]++] = t;
    }
    return 0;
}

int draft_model_propose(struct draft_model *d, int n, const int *seq, const int32_t *const *hist,
                        const int *n_hist, const int *k, const float *p_min, int32_t *const *out, int *n_out)
{
    if (n > d->n_seqs) return FERRY_ERR_INVALID;
    d->p_min = p_min;
    int rc = 0;
    for (int i = 0; i < n; i++) {
        n_out[i] = 0;
        d->at[i] = -1;
        const int s = seq[i];
        if (s < 0 || s >= d->n_seqs || n_hist[i] < 1 || n_hist[i] > d->ctx) return FERRY_ERR_INVALID;
        if (k[i] <= 0) continue;
        /* Keep the longest start the slot shares with the sequence; its pending token runs again. */
        const int32_t *r = d->rec + (size_t)s * d->ctx;
        int common = 0, lim = d->n_rec[s] < n_hist[i] - 1 ? d->n_rec[s] : n_hist[i] - 1;
        while (common < lim && r[common] == hist[i][common]) common++;
        int kept = engine_seq_keep(d->e, s, common);
        d->at[i] = kept < 0 ? 0 : kept;
        if (kept < 0) engine_seq_free(d->e, s);
        d->n_rec[s] = d->at[i];
    }
    /* Catch up: every proposal's missing tokens, in steps of at most max_batch tokens. */
    for (;;) {
        int nt = 0, rows = 0;
        for (int i = 0; i < n && nt < d->max_batch; i++) {
            if (d->at[i] < 0 || d->at[i] >= n_hist[i]) continue;
            const int s = seq[i];
            int take = n_hist[i] - d->at[i];
            if (take > d->max_batch - nt) take = d->max_batch - nt;
            for (int j = 0; j < take; j++, nt++) {
                const int p = d->at[i] + j;
                d->tok[nt] = hist[i][p];
                d->pos[nt] = p;
                d->sq[nt] = s;
                d->want[nt] = p == n_hist[i] - 1;
                d->rec[(size_t)s * d->ctx + p] = hist[i][p];
                if (d->want[nt]) d->row_of[rows++] = i;
            }
            d->at[i] += take;
            d->n_rec[s] = d->at[i];
        }
        if (!nt) break;
        if ((rc = run_step(d, nt, rows, out, n_out))) goto failed;
    }
    /* Decode: each proposal's last draft runs to give the next, while it wants more and its context lasts. */
    for (;;) {
        int nt = 0;
        for (int i = 0; i < n; i++) {
            if (d->at[i] < 0 || n_out[i] == 0 || n_out[i] >= k[i]) continue;
            const int s = seq[i], p = n_hist[i] - 1 + n_out[i];
            if (p >= d->ctx) continue;
            d->tok[nt] = out[i][n_out[i] - 1];
            d->pos[nt] = p;
            d->sq[nt] = s;
            d->want[nt] = 1;
            d->row_of[nt] = i;
            d->rec[(size_t)s * d->ctx + p] = d->tok[nt];
            d->n_rec[s] = p + 1;
            nt++;
        }
        if (!nt) break;
        if ((rc = run_step(d, nt, nt, out, n_out))) goto failed;
    }
    return 0;
failed:
    for (int i = 0; i < n; i++) draft_model_seq_free(d, seq[i]);
    return rc;
}
