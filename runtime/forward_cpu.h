/* forward_cpu — the Llama forward pass on the CPU backend, over a batch of tokens from many sequences.
 *
 * Scratch activations are sized once for max_tokens rows; nothing is allocated per step. The KV rows of the
 * batch must already be reserved in the cache (engine.c does it). Deterministic for a given thread count.
 */
#ifndef FERRY_FORWARD_CPU_H
#define FERRY_FORWARD_CPU_H

#include "runtime/engine.h"
#include "runtime/kv_cache.h"
#include "runtime/model.h"

struct forward_cpu;

int forward_cpu_init(struct forward_cpu **out, const struct model *m, int max_tokens, int n_threads);
void forward_cpu_free(struct forward_cpu *f);
int forward_cpu_threads(const struct forward_cpu *f);

/* logits: (number of want_logits rows, n_vocab) f32 in batch order. */
int forward_cpu_run(struct forward_cpu *f, const struct model *m, struct kv_cache *kv, const struct batch *b,
                    float *logits);

#endif
