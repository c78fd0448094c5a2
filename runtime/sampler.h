/* sampler — turns one row of logits into a token, with OpenAI/llama.cpp-style controls, seeded.
 *
 * Order of operations: logit_bias (entries in list order) → repetition penalty (HF style: divide positive /
 * multiply negative logits of seen tokens) → presence/frequency penalties (OpenAI: subtract presence once and
 * frequency per occurrence) → NaN as -inf → if temperature <= 0: argmax (ties: lowest id) → v = logit *
 * (1/temperature) → candidates: v >= v_max - 30 (the rest carry < e^-30 of the best's probability each) →
 * top-k, top-p, min-p over the candidates ranked by (v descending, id ascending) → draw.
 * Probabilities are the integer masses of kernels/core/sample_math.h (q = round(e^(v - v_max) * 2^44)):
 *   top-k keeps the first k; top-p keeps the first of those up to the first whose cumulative mass reaches
 *   ceil(top_p * their total); min-p then drops the tokens with e^(v - v_max) < min_p. The draw takes
 *   u = uniform(seed, step) (a counter-based generator: `step` counts this sampler's draws, greedy ones
 *   included) and returns the first kept token, by id, whose cumulative mass exceeds u * (total kept mass).
 * The GPU sampler (kernels/cuda/sample.h) implements the same definition with the same arithmetic, so both
 * choose the same token for the same (logits, history, seed, step). One sampler per sequence;
 * sampler_accept() records the tokens that count for penalties.
 */
#ifndef FERRY_SAMPLER_H
#define FERRY_SAMPLER_H

#include <stdint.h>

struct logit_bias {
    int32_t token;
    float bias;
};

struct sampler_params {
    float temperature;        /* 0 = greedy */
    int top_k;                /* 0 = off */
    float top_p;              /* 1 = off */
    float min_p;              /* 0 = off */
    float repetition_penalty; /* 1 = off */
    float presence_penalty;   /* 0 = off */
    float frequency_penalty;  /* 0 = off */
    uint64_t seed;
    const struct logit_bias *logit_bias; /* borrowed for the sampler's lifetime; may be NULL */
    int n_logit_bias;
};

struct sampler_params sampler_default_params(void);

struct sampler;

int sampler_init(struct sampler **out, const struct sampler_params *p, int n_vocab);
void sampler_free(struct sampler *s);
/* Records a token for the penalties (prompt tokens too when the caller wants them counted). */
void sampler_accept(struct sampler *s, int32_t token);
/* Samples from logits (n_vocab) f32; the row is used as scratch and modified. Advances the draw counter. */
int32_t sampler_sample(struct sampler *s, float *logits);
/* Records a draw made elsewhere with this sampler's (seed, sampler_step()) — by the GPU sampler — so that the
 * next draw here uses the next step. The caller also sampler_accept()s the token it chose. */
void sampler_advance(struct sampler *s);
/* log-softmax of the raw logits at `token` and the top n (ids, logprobs) by logit descending, lowest id
 * first on ties; n <= 20. NaN logits count as -inf. */
float sampler_logprob(const float *logits, int n_vocab, int32_t token, int n_top, int32_t *top_ids,
                      float *top_lp);

/* What a GPU sampler needs to reproduce this one (kernels/cuda/sample.h): the parameters, the index of the
 * next draw, and the history as distinct tokens (in first-seen order) with their counts. */
const struct sampler_params *sampler_get_params(const struct sampler *s);
uint64_t sampler_step(const struct sampler *s);
/* 1 when a penalty is on (the history then matters to a draw). */
int sampler_penalizes(const struct sampler *s);
/* Number of distinct accepted tokens; copies min(that, cap) of them and their counts. */
int sampler_history(const struct sampler *s, int32_t *tokens, uint32_t *counts, int cap);

#endif
