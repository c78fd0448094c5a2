/* sampler — logits → token (see sampler.h for the definition and the contract).
 *
 * The arithmetic comes from kernels/core/sample_math.h and must not be contracted into FMAs: the GPU sampler
 * rounds every operation once, and so must this file (GCC fuses a*b-c by default in GNU C modes).
 */
#pragma GCC optimize("fp-contract=off")
#ifdef __clang__
#pragma STDC FP_CONTRACT OFF
#endif

#include "runtime/sampler.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/core/sample_math.h"
#include "kernels/core/status.h"

struct cand {
    int32_t id;
    float v;    /* logit * (1/temperature) */
    uint64_t q; /* integer mass, sample_math.h */
};

struct sampler {
    struct sampler_params p;
    int n_vocab;
    uint64_t step;    /* draws taken */
    uint32_t *counts; /* (n_vocab) occurrences of accepted tokens */
    int32_t *seen;    /* (n_vocab) distinct accepted tokens, first-seen order */
    int n_seen;
    struct cand *cands; /* (n_vocab) scratch */
};

struct sampler_params sampler_default_params(void)
{
    return (struct sampler_params){
        .temperature = 1.0f, .top_k = 0, .top_p = 1.0f, .min_p = 0.0f, .repetition_penalty = 1.0f, .seed = 0};
}

int sampler_init(struct sampler **out, const struct sampler_params *p, int n_vocab)
{
    *out = NULL;
    if (n_vocab <= 0 || n_vocab > SMATH_MAX_VOCAB || !(p->temperature >= 0) || p->top_k < 0 ||
        !(p->top_p > 0 && p->top_p <= 1) || !(p->min_p >= 0 && p->min_p <= 1) ||
        !(p->repetition_penalty > 0) || !isfinite(p->presence_penalty) || !isfinite(p->frequency_penalty) ||
        p->n_logit_bias < 0)
        return FERRY_ERR_INVALID;
    struct sampler *s = calloc(1, sizeof *s);
    if (!s) return FERRY_ERR_NOMEM;
    s->p = *p;
    s->n_vocab = n_vocab;
    s->counts = calloc((size_t)n_vocab, sizeof *s->counts);
    s->seen = malloc((size_t)n_vocab * sizeof *s->seen);
    s->cands = malloc((size_t)n_vocab * sizeof *s->cands);
    if (!s->counts || !s->seen || !s->cands) {
        sampler_free(s);
        return FERRY_ERR_NOMEM;
    }
    *out = s;
    return FERRY_OK;
}

void sampler_free(struct sampler *s)
{
    if (!s) return;
    free(s->counts);
    free(s->seen);
    free(s->cands);
    free(s);
}

void sampler_accept(struct sampler *s, int32_t token)
{
    if (token < 0 || token >= s->n_vocab || s->counts[token] == UINT32_MAX) return;
    if (s->counts[token]++ == 0) s->seen[s->n_seen++] = token;
}

const struct sampler_params *sampler_get_params(const struct sampler *s)
{
    return &s->p;
}

uint64_t sampler_step(const struct sampler *s)
{
    return s->step;
}

void sampler_advance(struct sampler *s)
{
    s->step++;
}

int sampler_penalizes(const struct sampler *s)
{
    return s->p.repetition_penalty != 1.0f || s->p.presence_penalty != 0.0f || s->p.frequency_penalty != 0.0f;
}

int sampler_history(const struct sampler *s, int32_t *tokens, uint32_t *counts, int cap)
{
    for (int i = 0; i < s->n_seen && i < cap; i++) {
        tokens[i] = s->seen[i];
        counts[i] = s->counts[s->seen[i]];
    }
    return s->n_seen;
}

/* Best first: v descending, then id ascending. */
static int cand_desc(const void *a, const void *b)
{
    const struct cand *x = a, *y = b;
    if (x->v != y->v) return x->v < y->v ? 1 : -1;
    return (x->id > y->id) - (x->id < y->id);
}

static int cand_by_id(const void *a, const void *b)
{
    const struct cand *x = a, *y = b;
    return (x->id > y->id) - (x->id < y->id);
}

static void apply_penalties(struct sampler *s, float *logits)
{
    const struct sampler_params *p = &s->p;
    for (int i = 0; i < p->n_logit_bias; i++) {
        int32_t t = p->logit_bias[i].token;
        if (t >= 0 && t < s->n_vocab) logits[t] = smath_add(logits[t], p->logit_bias[i].bias);
    }
    if (p->repetition_penalty == 1.0f && p->presence_penalty == 0.0f && p->frequency_penalty == 0.0f) return;
    for (int i = 0; i < s->n_seen; i++) {
        const int32_t t = s->seen[i];
        logits[t] = smath_penalize(logits[t], s->counts[t], p->repetition_penalty, p->presence_penalty,
                                   p->frequency_penalty);
    }
}

/* Rearranges c[0..n) so that its k best (cand_desc order) come first, in any order: quickselect, O(n). */
static void select_top(struct cand *c, int n, int k)
{
    int lo = 0, hi = n - 1;
    while (lo < hi) {
        struct cand pivot = c[lo + (hi - lo) / 2];
        int i = lo, j = hi;
        while (i <= j) {
            while (cand_desc(&c[i], &pivot) < 0) i++;
            while (cand_desc(&c[j], &pivot) > 0) j--;
            if (i <= j) {
                struct cand t = c[i];
                c[i++] = c[j];
                c[j--] = t;
            }
        }
        if (k - 1 <= j)
            hi = j;
        else if (k - 1 >= i)
            lo = i;
        else
            return;
    }
}

int32_t sampler_sample(struct sampler *s, float *logits)
{
    const struct sampler_params *p = &s->p;
    const int n = s->n_vocab;
    const uint64_t step = s->step++;
    apply_penalties(s, logits);
    int32_t best = 0;
    for (int i = 0; i < n; i++) {
        if (isnan(logits[i])) logits[i] = -INFINITY;
        if (logits[i] > logits[best]) best = i;
    }
    if (!(p->temperature > 0.0f) || logits[best] == -INFINITY) return best; /* ties: the lowest id */
    const float inv_t = smath_div(1.0f, p->temperature), maxv = smath_mul(logits[best], inv_t);
    if (!isfinite(maxv)) return best;

    /* Candidates, in id order. */
    struct cand *c = s->cands;
    int m = 0;
    for (int i = 0; i < n; i++) {
        const float v = smath_mul(logits[i], inv_t);
        if (smath_sub(v, maxv) >= -SMATH_TAIL) c[m++] = (struct cand){i, v, 0};
    }
    for (int i = 0; i < m; i++) c[i].q = smath_mass(smath_sub(c[i].v, maxv));

    if (p->top_k > 0 || p->top_p < 1.0f || p->min_p > 0.0f) {
        if (p->top_k > 0 && p->top_k < m) {
            select_top(c, m, p->top_k);
            m = p->top_k;
        }
        qsort(c, (size_t)m, sizeof *c, cand_desc);
        if (p->top_p < 1.0f) {
            uint64_t total = 0, cum = 0;
            for (int i = 0; i < m; i++) total += c[i].q;
            const uint64_t thr = smath_top_p_threshold(p->top_p, total);
            int keep = m;
            for (int i = 0; i < m; i++) {
                cum += c[i].q;
                if (cum >= thr) {
                    keep = i + 1;
                    break;
                }
            }
            m = keep;
        }
        if (p->min_p > 0.0f) {
            int k = 0;
            for (int i = 0; i < m; i++)
                if (smath_exp(smath_sub(c[i].v, maxv)) >= p->min_p) c[k++] = c[i];
            m = k; /* the best token has e^0 = 1 >= min_p: m >= 1 */
        }
        qsort(c, (size_t)m, sizeof *c, cand_by_id);
    }

    uint64_t total = 0;
    for (int i = 0; i < m; i++) total += c[i].q;
    const uint64_t r = smath_draw_target(smath_uniform(p->seed, step), total);
    uint64_t cum = 0;
    for (int i = 0; i < m; i++) {
        cum += c[i].q;
        if (cum > r) return c[i].id;
    }
    return c[m - 1].id; /* not reached: cum ends at total > r */
}

float sampler_logprob(const float *logits, int n_vocab, int32_t token, int n_top, int32_t *top_ids,
                      float *top_lp)
{
    double maxv = -INFINITY;
    for (int i = 0; i < n_vocab; i++)
        if (logits[i] > maxv) maxv = logits[i];
    double sum = 0;
    if (maxv > -INFINITY)
        for (int i = 0; i < n_vocab; i++)
            if (logits[i] > -INFINITY) sum += exp((double)logits[i] - maxv);
    const double lse = maxv + log(sum);
    if (n_top > 20) n_top = 20;
    if (n_top > n_vocab) n_top = n_vocab;
    /* Insertion into a small sorted list by logit (NaN as -inf), earlier ids first on ties: O(n_vocab *
     * n_top). */
    float top_v[20];
    for (int k = 0; k < n_top; k++) {
        top_ids[k] = -1;
        top_v[k] = -INFINITY;
    }
    for (int i = 0; i < n_vocab && n_top > 0; i++) {
        const float v = isnan(logits[i]) ? -INFINITY : logits[i];
        if (top_ids[n_top - 1] >= 0 && v <= top_v[n_top - 1]) continue;
        int k = n_top - 1;
        while (k > 0 && (top_ids[k - 1] < 0 || v > top_v[k - 1])) {
            top_ids[k] = top_ids[k - 1];
            top_v[k] = top_v[k - 1];
            k--;
        }
        top_ids[k] = i;
        top_v[k] = v;
    }
    for (int k = 0; k < n_top; k++) top_lp[k] = (float)(top_v[k] - lse);
    if (token < 0 || token >= n_vocab || isnan(logits[token])) return -INFINITY;
    return (float)(logits[token] - lse);
}
