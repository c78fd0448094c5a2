/* batch — what one engine step computes, as the scheduler hands it over and as the backends see it.
 *
 * `struct batch` is the scheduler's input to engine_step (runtime/engine.h): tokens of many sequences, each
 * with its position and sequence slot. `struct step` is the engine's view of the same step for the backends
 * (runtime/backend.h): the batch, where each layer runs this time, and the longest sequence it touches.
 * `struct draw_row` asks for an output row's next token to be drawn where its logits are (engine_step_draw):
 * on the GPU only the ids and the logprobs asked for come back. Both are borrowed for the duration of one
 * engine_step; nothing here owns memory.
 */
#ifndef FERRY_BATCH_H
#define FERRY_BATCH_H

#include <stdint.h>

#include "runtime/device_map.h"

struct batch {
    int n_tokens;         /* decode tokens + prefill chunk tokens */
    int32_t *tokens;      /* (n_tokens) token ids */
    int32_t *pos;         /* (n_tokens) position of each token in its sequence */
    int32_t *seq;         /* (n_tokens) sequence slot of each token */
    uint8_t *want_logits; /* (n_tokens) 1 where the caller needs this row's logits */
    uint8_t hidden;    /* 1: those rows get the final normed hidden state, (dim) f32 each, instead of logits
                        * (embeddings); 0 for generation */
    float *hidden_out; /* (n_tokens, dim) f32 or NULL: every row's final normed hidden state (what the output
                        * head reads), beside the logits, for a drafter that continues from it
                        * (runtime/mtp.h); engines whose head is on the CPU only */
};

struct sampler;

#define DRAW_MAX_TOP 20

/* One output row's draw: with its sequence's sampler (runtime/sampler.h), as sampler_sample would make it. */
struct draw_row {
    const struct sampler *smp; /* parameters, logit_bias, history and the next draw's index; not modified (the
                                * caller then sampler_advance()s and sampler_accept()s the token) */
    const uint8_t *allowed;    /* (n_vocab) 0 = may not come next (a grammar's mask), or NULL: any token */
    int n_logprobs;            /* -1: none; 0: the chosen token's; 1..DRAW_MAX_TOP: and the top n */
};
struct draw_out {
    int32_t token;
    float logprob; /* log-softmax of the raw logits at token (n_logprobs >= 0) */
    int n_top;     /* the top n of the raw row, by logit descending, lowest id first on ties */
    int32_t top_id[DRAW_MAX_TOP];
    float top_lp[DRAW_MAX_TOP];
};

struct step {
    const struct batch *b;
    const enum placement *where; /* (n_layers) this step's placement of each layer: GPU, STREAM or CPU */
    int max_len;                 /* 1 + the largest position in the batch */
    int n_out;                   /* rows with want_logits set */
    const struct draw_row *draw; /* (n_out) non-NULL: the head draws these rows' tokens (head_draw) */
    struct draw_out *drawn;      /* (n_out) where it writes them */
};

#endif
