/* sampler — turns one row of logits into a token, with OpenAI/llama.cpp-style controls, seeded.
 *
 * Order of operations: logit_bias → repetition penalty (HF style: divide positive / multiply negative
 * logits of seen tokens) → presence/frequency penalties (OpenAI: subtract presence once and frequency per
 * occurrence) → if temperature <= 0: argmax (ties: lowest id) → temperature → top-k → softmax → top-p →
 * min-p → draw with a xoshiro256** generator seeded from `seed`. Tokens whose probability is below e^-30 of the
 * best one's are dropped before top-k/top-p/min-p (they could change a draw with probability < 1e-7). The same seed and inputs give the same
 * tokens. One sampler per sequence; sampler_accept() records the tokens that count for penalties.
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
/* Samples from logits (n_vocab) f32; the row is used as scratch and modified. */
int32_t sampler_sample(struct sampler *s, float *logits);
/* log-softmax of the raw logits at `token` and the top n (ids, logprobs) sorted descending; n <= 20. */
float sampler_logprob(const float *logits, int n_vocab, int32_t token, int n_top, int32_t *top_ids,
                      float *top_lp);

#endif
