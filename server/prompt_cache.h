/* prompt_cache — which tokens each engine slot's KV holds, so a later prompt can continue from them.
 *
 * A finished sequence's KV stays in its slot; the cache records the tokens behind it and when the slot was
 * last used. A new prompt takes the free slot sharing its longest start (at least PROMPT_CACHE_MIN_REUSE
 * tokens, or the whole usable prompt), else an empty slot, else the least recently used cache. Invariant:
 * a slot's record (len > 0) equals the tokens at positions [0, len) of its KV; len -1 (unknown, after a
 * failed allocation) is never matched; len 0 is empty. Pure bookkeeping: the caller frees, keeps or shares
 * the KV itself and tells the cache (prompt_cache_drop, prompt_cache_set_len, prompt_cache_copy).
 */
#ifndef FERRY_SERVER_PROMPT_CACHE_H
#define FERRY_SERVER_PROMPT_CACHE_H

#include <stdint.h>

/* A shared start this short (a BOS token, a common first word) is not worth dropping another cache for. */
#define PROMPT_CACHE_MIN_REUSE 8

struct prompt_cache;

int prompt_cache_init(struct prompt_cache **out, int n_slots);
void prompt_cache_free(struct prompt_cache *pc);

/* Tokens recorded for slot q: > 0 held, 0 empty, -1 unknown. */
int prompt_cache_len(const struct prompt_cache *pc, int q);
/* The slot now holds nothing (its KV was freed). */
void prompt_cache_drop(struct prompt_cache *pc, int q);
/* The slot keeps only its first n recorded positions (n <= its length). */
void prompt_cache_set_len(struct prompt_cache *pc, int q, int n);
/* A finished sequence left slot q: its cache is now the most recently used. */
void prompt_cache_touch(struct prompt_cache *pc, int q);
/* Slot `to` holds the same first n positions as slot `from` (shared KV blocks); unknown when that record is
 * not known or cannot be copied. */
void prompt_cache_copy(struct prompt_cache *pc, int from, int to, int n);
/* Token `tok` was written at position pos of slot q (positions arrive in order per slot). */
void prompt_cache_record(struct prompt_cache *pc, int q, int pos, int32_t tok);

/* How many of the first n positions slot q can give back (a model with recurrent state: only those up to a
 * checkpoint, runtime/seq_state.h). */
typedef int (*prompt_cache_usable_fn)(void *ctx, int q, int n);
/* The free slot (slot_free[q] != 0) for a prompt, and in *reuse how many of its positions that slot's cache
 * can give: the longest common start, short of the prompt's last token (whose logits must be computed), cut
 * by usable(ctx, q, that) when usable is not NULL. use_cache 0: rank empty slots first, then the least
 * recently used, ignoring content. -1 when none is free. */
int prompt_cache_pick(const struct prompt_cache *pc, const int *slot_free, const int32_t *prompt,
                      int n_prompt, int use_cache, prompt_cache_usable_fn usable, void *ctx, int *reuse);
/* Free slots other than `except` that hold a cache, least recently used first, into out (n_slots room);
 * returns how many. */
int prompt_cache_idle(const struct prompt_cache *pc, const int *slot_free, int except, int *out);

#endif
