/* spec — speculative decoding for one sequence: a drafter proposes the next k tokens, one engine step runs
 * the pending token and the k drafts as k+1 rows, and the rows are drawn in order until a draw differs from
 * its draft. Under offloading the step reads the host's weights once for all k+1 rows, so each accepted draft
 * is a token that cost almost nothing.
 *
 * Exactness. Row i's logits were computed with drafts 0..i-1 as context, which equal the tokens drawn so far
 * exactly while the walk reaches row i; the caller draws each row with the sequence's own sampler (its draws
 * depend only on logits, history, seed and draw index: runtime/sampler.h), so the tokens emitted are the very
 * tokens plain decoding emits, greedy or sampled. For a drafter whose proposal is one token with probability
 * 1 this is the accept/reject rule of speculative sampling: the draft x is kept with probability p(x), and on
 * a rejection the draw already comes from p without x.
 * KV. The step writes k+1 positions; after the walk the caller keeps the sequence's positions up to the last
 * accepted draft (engine_seq_keep), and the token drawn last is the next step's pending token.
 * Usage: spec_ngram_draft (or any drafter) → spec_step (engine step) → spec_walk (draws) → engine_seq_keep.
 */
#ifndef FERRY_SPEC_H
#define FERRY_SPEC_H

#include <stdint.h>

#include "runtime/engine.h"

#define SPEC_MAX_DRAFT 32
/* The n-gram lengths prompt lookup tries (longest first) in ferry run and ferry serve. */
#define SPEC_NGRAM_MIN 1
#define SPEC_NGRAM_MAX 3

/* Prompt lookup: the longest suffix of hist, of n_max down to n_min tokens, that also occurs earlier in hist;
 * proposes up to k of the tokens that followed its latest earlier occurrence followed by k tokens (else the
 * occurrence followed by the most: near the end, in a run of one token, the latest is followed by few).
 * Returns the number proposed
 * (0: no match). hist: (n_hist) the sequence so far, prompt and output, its last token the pending one. */
int spec_ngram_draft(const int32_t *hist, int n_hist, int n_min, int n_max, int k, int32_t *out);

/* One verification step of sequence seq: pending (its next token, not yet run) at position pos, then
 * draft[0..k) at pos+1..pos+k, every row's logits into logits ((k+1), n_vocab). 0 <= k <= SPEC_MAX_DRAFT.
 * Returns engine_step's status. */
int spec_step(struct engine *e, int seq, int32_t pending, int pos, const int32_t *draft, int k,
              float *logits);

/* spec_step with every row's final normed hidden state into hidden ((k+1), dim; batch.hidden_out), for the
 * multi-token-prediction drafter (runtime/mtp.h); NULL: none. On a model with recurrent layers, a step with
 * drafts first saves the slot's state as a checkpoint (engine_seq_checkpoint), which spec_keep comes back to.
 */
int spec_step_hidden(struct engine *e, int seq, int32_t pending, int pos, const int32_t *draft, int k,
                     float *logits, float *hidden);
/* After the walk of a step at pos with k drafts of which n_acc were accepted: the slot keeps pos + n_acc + 1
 * positions (the pending token and the accepted drafts). Attention layers drop the rejected positions; a
 * model with recurrent layers goes back to the checkpoint spec_step saved at pos and runs the kept rows
 * again (their hidden states into hidden ((n_acc+1), dim) when not NULL; they equal the step's). Returns
 * engine_seq_keep's or engine_step's status. */
int spec_keep(struct engine *e, int seq, int32_t pending, int pos, const int32_t *draft, int k, int n_acc,
              float *hidden);

/* Draws one row (modifying it as scratch); returns the token, or -1 when the sequence ends with this row
 * (its token, if any, is the caller's to keep). */
typedef int32_t (*spec_draw_fn)(void *ctx, float *row);

/* Walks rows 0..k of logits ((k+1), n_vocab): draws row i into out[i] and goes on while out[i] == draft[i]
 * and the draw did not end the sequence. Returns the rows drawn (1..k+1); *ended is set when a draw returned
 * -1 (out[last] is then -1). The accepted drafts are the first (return - 1). */
int spec_walk(float *logits, int n_vocab, const int32_t *draft, int k, spec_draw_fn draw, void *ctx,
              int32_t *out, int *ended);

#endif
