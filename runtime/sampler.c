/* sampler — logits → token (see sampler.h for the order of operations and the contract). */
#include "runtime/sampler.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/core/status.h"

struct cand {
    int32_t id;
    float v;
};

struct sampler {
    struct sampler_params p;
    int n_vocab;
    uint64_t rng[4];      /* xoshiro256** state */
    uint32_t *counts;     /* (n_vocab) occurrences of accepted tokens */
    struct cand *cands;   /* (n_vocab) scratch */
};

struct sampler_params sampler_default_params(void)
{
    return (struct sampler_params){.temperature = 1.0f, .top_k = 0, .top_p = 1.0f, .min_p = 0.0f,
                                   .repetition_penalty = 1.0f, .seed = 0};
}

static uint64_t splitmix64(uint64_t *x)
{
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static inline uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

static uint64_t rng_next(uint64_t s[4])
{
    uint64_t result = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return result;
}

/* Uniform in [0, 1) with 53 random bits. */
static double rng_uniform(uint64_t s[4]) { return (rng_next(s) >> 11) * 0x1.0p-53; }

int sampler_init(struct sampler **out, const struct sampler_params *p, int n_vocab)
{
    *out = NULL;
    if (n_vocab <= 0 || !(p->temperature >= 0) || p->top_k < 0 || !(p->top_p > 0 && p->top_p <= 1) ||
        !(p->min_p >= 0 && p->min_p <= 1) || !(p->repetition_penalty > 0) || p->n_logit_bias < 0)
        return FERRY_ERR_INVALID;
    struct sampler *s = calloc(1, sizeof *s);
    if (!s) return FERRY_ERR_NOMEM;
    s->p = *p;
    s->n_vocab = n_vocab;
    s->counts = calloc((size_t)n_vocab, sizeof *s->counts);
    s->cands = malloc((size_t)n_vocab * sizeof *s->cands);
    if (!s->counts || !s->cands) {
        sampler_free(s);
        return FERRY_ERR_NOMEM;
    }
    uint64_t x = p->seed;
    for (int i = 0; i < 4; i++) s->rng[i] = splitmix64(&x);
    *out = s;
    return FERRY_OK;
}

void sampler_free(struct sampler *s)
{
    if (!s) return;
    free(s->counts);
    free(s->cands);
    free(s);
}

void sampler_accept(struct sampler *s, int32_t token)
{
    if (token >= 0 && token < s->n_vocab && s->counts[token] < UINT32_MAX) s->counts[token]++;
}

static int cand_desc(const void *a, const void *b)
{
    const struct cand *x = a, *y = b;
    if (x->v != y->v) return x->v < y->v ? 1 : -1;
    return x->id - y->id;
}

static void apply_penalties(struct sampler *s, float *logits)
{
    const struct sampler_params *p = &s->p;
    for (int i = 0; i < p->n_logit_bias; i++) {
        int32_t t = p->logit_bias[i].token;
        if (t >= 0 && t < s->n_vocab) logits[t] += p->logit_bias[i].bias;
    }
    if (p->repetition_penalty == 1.0f && p->presence_penalty == 0.0f && p->frequency_penalty == 0.0f) return;
    for (int t = 0; t < s->n_vocab; t++) {
        uint32_t c = s->counts[t];
        if (!c) continue;
        if (p->repetition_penalty != 1.0f)
            logits[t] = logits[t] > 0 ? logits[t] / p->repetition_penalty : logits[t] * p->repetition_penalty;
        logits[t] -= p->presence_penalty + p->frequency_penalty * (float)c;
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

/* Tokens more than this far below the best (in temperature-scaled logits) carry less than e^-30 of its
 * probability each; over 10^6 of them under 1e-7 of the mass together. They are left out of the sort, which then
 * covers a few hundred candidates instead of the whole vocabulary (a 49k sort costs ~10 ms on one core). */
#define SAMPLER_TAIL 30.0f

int32_t sampler_sample(struct sampler *s, float *logits)
{
    const struct sampler_params *p = &s->p;
    const int n = s->n_vocab;
    apply_penalties(s, logits);
    int32_t best = 0;
    for (int i = 1; i < n; i++)
        if (logits[i] > logits[best]) best = i;
    if (p->temperature <= 0.0f) return best; /* ties: the lowest id */
    const double inv_t = 1.0 / p->temperature, maxv = logits[best] * inv_t;
    if (p->top_k == 0 && p->top_p >= 1.0f && p->min_p <= 0.0f) {
        /* Plain softmax sampling: one pass to sum, one to draw; no ordering needed. */
        double sum = 0;
        for (int i = 0; i < n; i++) sum += exp(logits[i] * inv_t - maxv);
        double r = rng_uniform(s->rng) * sum, acc = 0;
        for (int i = 0; i < n; i++) {
            acc += exp(logits[i] * inv_t - maxv);
            if (r < acc) return i;
        }
        return best;
    }
    struct cand *c = s->cands;
    int m = 0;
    for (int i = 0; i < n; i++) {
        float v = (float)(logits[i] * inv_t);
        if (v >= maxv - SAMPLER_TAIL) c[m++] = (struct cand){i, v};
    }
    if (p->top_k > 0 && p->top_k < m) {
        select_top(c, m, p->top_k);
        m = p->top_k;
    }
    qsort(c, (size_t)m, sizeof *c, cand_desc);
    double sum = 0;
    for (int i = 0; i < m; i++) sum += exp((double)c[i].v - maxv);
    if (p->top_p < 1.0f) {
        double cum = 0;
        int keep = m;
        for (int i = 0; i < m; i++) {
            cum += exp((double)c[i].v - maxv) / sum;
            if (cum >= p->top_p) {
                keep = i + 1;
                break;
            }
        }
        m = keep;
    }
    if (p->min_p > 0.0f) {
        /* Relative to the most likely token: keep p_i >= min_p * p_max. */
        double thr = log((double)p->min_p);
        int keep = 1;
        while (keep < m && (double)c[keep].v - maxv >= thr) keep++;
        m = keep;
    }
    sum = 0;
    for (int i = 0; i < m; i++) sum += exp((double)c[i].v - maxv);
    double r = rng_uniform(s->rng) * sum, acc = 0;
    for (int i = 0; i < m; i++) {
        acc += exp((double)c[i].v - maxv);
        if (r < acc) return c[i].id;
    }
    return c[m - 1].id;
}

float sampler_logprob(const float *logits, int n_vocab, int32_t token, int n_top, int32_t *top_ids,
                      float *top_lp)
{
    double maxv = logits[0];
    for (int i = 1; i < n_vocab; i++)
        if (logits[i] > maxv) maxv = logits[i];
    double sum = 0;
    for (int i = 0; i < n_vocab; i++) sum += exp((double)logits[i] - maxv);
    double lse = maxv + log(sum);
    if (n_top > 20) n_top = 20;
    if (n_top > n_vocab) n_top = n_vocab;
    /* Insertion into a small sorted list: O(n_vocab * n_top). */
    for (int k = 0; k < n_top; k++) {
        top_ids[k] = -1;
        top_lp[k] = -INFINITY;
    }
    for (int i = 0; i < n_vocab && n_top > 0; i++) {
        float lp = (float)(logits[i] - lse);
        if (top_ids[n_top - 1] >= 0 && lp <= top_lp[n_top - 1]) continue;
        int k = n_top - 1;
        while (k > 0 && (top_ids[k - 1] < 0 || lp > top_lp[k - 1])) {
            top_ids[k] = top_ids[k - 1];
            top_lp[k] = top_lp[k - 1];
            k--;
        }
        top_ids[k] = i;
        top_lp[k] = lp;
    }
    return token >= 0 && token < n_vocab ? (float)(logits[token] - lse) : -INFINITY;
}
