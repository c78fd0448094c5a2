/* batch — what one engine step computes, as the scheduler hands it over and as the backends see it.
 *
 * `struct batch` is the scheduler's input to engine_step (runtime/engine.h): tokens of many sequences, each
 * with its position and sequence slot. `struct step` is the engine's view of the same step for the backends
 * (runtime/backend.h): the batch, where each layer runs this time, and the longest sequence it touches.
 * Both are borrowed for the duration of one engine_step; nothing here owns memory.
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
    uint8_t hidden;       /* 1: those rows get the final normed hidden state, (dim) f32 each, instead of logits
                           * (embeddings); 0 for generation */
};

struct step {
    const struct batch *b;
    const enum placement *where; /* (n_layers) this step's placement of each layer: GPU, STREAM or CPU */
    int max_len;                 /* 1 + the largest position in the batch */
    int n_out;                   /* rows with want_logits set */
};

#endif
