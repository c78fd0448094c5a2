/* draft_model — a second, smaller model with the target's vocabulary that drafts tokens for speculative
 * decoding (runtime/spec.h): its own engine, with as many sequence slots as the target's, greedy.
 *
 * Each slot remembers the tokens its KV holds. A proposal hands the sequence's tokens so far (prompt and
 * output, the last one the target's pending token): the slot keeps the longest start it shares with them,
 * runs the rest in one step (a new prompt, the target's accepted tokens), then decodes k tokens one step at a
 * time, all slots of one call together. A rejected draft is forgotten at the next proposal, where the
 * sequence's tokens differ from it. Greedy drafts are what a proposal needs: the target decides.
 * Usage: draft_model_init (after the target's engine, so a GPU budget can be split) → (draft_model_propose
 * ...; draft_model_seq_free ...)* → draft_model_free. One thread, the target engine's, calls it.
 */
#ifndef FERRY_DRAFT_MODEL_H
#define FERRY_DRAFT_MODEL_H

#include <stdint.h>

#include "runtime/engine.h"

struct draft_model;

/* An engine over mf with p's slots and context (p->n_seqs, p->ctx_size as the target's); refused with
 * FERRY_ERR_INVALID, err naming both sizes, when its vocabulary differs from n_vocab_target. */
int draft_model_init(struct draft_model **out, const struct model_file *mf, const struct engine_params *p,
                     int n_vocab_target, char err[256]);
void draft_model_free(struct draft_model *d);
const struct engine *draft_model_engine(const struct draft_model *d);

/* One proposal per request i in [0, n): slot seq[i], the sequence's tokens hist[i] (n_hist[i] of them), up
 * to k[i] greedy drafts into out[i]; n_out[i] gets how many (fewer when the slot's context ends, or before
 * the first token whose probability is below p_min[i] when p_min is not NULL). Returns
 * engine_step's status (a failure leaves the slots to be rebuilt at their next proposal). */
int draft_model_propose(struct draft_model *d, int n, const int *seq, const int32_t *const *hist,
                        const int *n_hist, const int *k, const float *p_min, int32_t *const *out, int *n_out);
/* The slot's sequence ended: its KV is returned. */
void draft_model_seq_free(struct draft_model *d, int seq);

#endif
