/* prompt_cache — the record of each slot's tokens and its last use, for continuing a prompt from a
 * finished sequence's KV (see prompt_cache.h). Only the engine thread touches it.
 */
#include "server/prompt_cache.h"

#include <stdlib.h>
#include <string.h>

#include "kernels/core/status.h"

struct prompt_cache {
    int n_slots;
    int32_t **toks; /* (n_slots) each (cap[q]) tokens; [0, len[q]) valid */
    int *len, *cap;
    uint64_t *used; /* (n_slots) clock value of the slot's last release; 0 never */
    uint64_t clock;
};

int prompt_cache_init(struct prompt_cache **out, int n_slots)
{
    *out = NULL;
    struct prompt_cache *pc = calloc(1, sizeof *pc);
    if (!pc) return FERRY_ERR_NOMEM;
    pc->n_slots = n_slots;
    pc->toks = calloc((size_t)n_slots, sizeof *pc->toks);
    pc->len = calloc((size_t)n_slots, sizeof *pc->len);
    pc->cap = calloc((size_t)n_slots, sizeof *pc->cap);
    pc->used = calloc((size_t)n_slots, sizeof *pc->used);
    if (!pc->toks || !pc->len || !pc->cap || !pc->used) {
        prompt_cache_free(pc);
        return FERRY_ERR_NOMEM;
    }
    *out = pc;
    return 0;
}

void prompt_cache_free(struct prompt_cache *pc)
{
    if (!pc) return;
    for (int i = 0; pc->toks && i < pc->n_slots; i++) free(pc->toks[i]);
    free(pc->toks);
    free(pc->len);
    free(pc->cap);
    free(pc->used);
    free(pc);
}

int prompt_cache_len(const struct prompt_cache *pc, int q)
{
    return pc->len[q];
}

void prompt_cache_drop(struct prompt_cache *pc, int q)
{
    pc->len[q] = 0;
}

void prompt_cache_set_len(struct prompt_cache *pc, int q, int n)
{
    pc->len[q] = n;
}

void prompt_cache_touch(struct prompt_cache *pc, int q)
{
    pc->used[q] = ++pc->clock;
}

/* Room for n tokens in slot q's record; 0 when the allocation failed. */
static int record_room(struct prompt_cache *pc, int q, int n)
{
    if (n <= pc->cap[q]) return 1;
    int cap = pc->cap[q] ? pc->cap[q] : 256;
    while (cap < n) cap *= 2;
    int32_t *t = realloc(pc->toks[q], (size_t)cap * sizeof *t);
    if (!t) return 0;
    pc->toks[q] = t;
    pc->cap[q] = cap;
    return 1;
}

void prompt_cache_copy(struct prompt_cache *pc, int from, int to, int n)
{
    if (n > 0 && pc->len[from] >= n && record_room(pc, to, n)) {
        memcpy(pc->toks[to], pc->toks[from], (size_t)n * sizeof(int32_t));
        pc->len[to] = n;
    } else {
        pc->len[to] = n > 0 ? -1 : 0; /* unknown: never matched */
    }
}

void prompt_cache_record(struct prompt_cache *pc, int q, int pos, int32_t tok)
{
    if (pc->len[q] < 0) return;
    if (!record_room(pc, q, pos + 1)) {
        pc->len[q] = -1;
        return;
    }
    pc->toks[q][pos] = tok;
    pc->len[q] = pos + 1;
}

/* Slots are ranked by the reusable length when it is at least PROMPT_CACHE_MIN_REUSE (or the whole usable
 * prompt); below that, an empty slot comes first (rather than dropping a cache), then the least recently
 * used cache. */
int prompt_cache_pick(const struct prompt_cache *pc, const int *slot_free, const int32_t *prompt,
                      int n_prompt, int use_cache, prompt_cache_usable_fn usable, void *ctx, int *reuse)
{
    int best = -1, best_score = -1, best_reuse = 0;
    for (int j = 0; j < pc->n_slots; j++) {
        if (!slot_free[j]) continue;
        int r = 0;
        if (use_cache && pc->len[j] > 0) {
            const int lim = pc->len[j] < n_prompt - 1 ? pc->len[j] : n_prompt - 1;
            while (r < lim && pc->toks[j][r] == prompt[r]) r++;
            if (usable && r > 0) r = usable(ctx, j, r);
        }
        const int score = r >= PROMPT_CACHE_MIN_REUSE || (r > 0 && r == n_prompt - 1) ? r : 0;
        int better;
        if (best < 0 || score != best_score)
            better = best < 0 || score > best_score;
        else if ((pc->len[j] <= 0) != (pc->len[best] <= 0))
            better = pc->len[j] <= 0;
        else
            better = pc->used[j] < pc->used[best];
        if (better) best = j, best_score = score, best_reuse = r;
    }
    *reuse = best_reuse;
    return best;
}

int prompt_cache_idle(const struct prompt_cache *pc, const int *slot_free, int except, int *out)
{
    int n = 0;
    for (int j = 0; j < pc->n_slots; j++) {
        if (!slot_free[j] || j == except || pc->len[j] == 0) continue;
        int k = n; /* insertion by last use, oldest first */
        while (k > 0 && pc->used[out[k - 1]] > pc->used[j]) {
            out[k] = out[k - 1];
            k--;
        }
        out[k] = j;
        n++;
    }
    return n;
}
