/* test_prompt_cache — the prompt cache's slot choice (server/prompt_cache.c), pure: the longest shared start
 * wins, short ones (below PROMPT_CACHE_MIN_REUSE) lose to an empty slot, and where a slot can give back only
 * part of its shared start (a model with recurrent state, up to a checkpoint: the usable callback) the slots
 * are ranked by what they can give, so a cache that gives nothing is kept rather than dropped for a prompt
 * that only shares a system prompt with it.
 */
#include <criterion/criterion.h>

#include "server/prompt_cache.h"

/* Slot q gives back only up to its checkpoint ckpt[q] (0 = none). */
static int up_to_checkpoint(void *ctx, int q, int n)
{
    const int *ckpt = ctx;
    return ckpt[q] <= n ? ckpt[q] : 0;
}

static void hold(struct prompt_cache *pc, int q, const int32_t *toks, int n)
{
    for (int i = 0; i < n; i++) prompt_cache_record(pc, q, i, toks[i]);
    prompt_cache_touch(pc, q);
}

Test(prompt_cache, recurrent_slots_ranked_by_what_they_can_give_back)
{
    struct prompt_cache *pc;
    cr_assert_eq(prompt_cache_init(&pc, 3), 0);
    int32_t a[64], b[64], prompt[64];
    for (int i = 0; i < 64; i++) a[i] = i, b[i] = i < 30 ? i : 1000 + i, prompt[i] = i < 50 ? i : 2000 + i;
    hold(pc, 0, a, 60); /* shares 50 with the prompt */
    hold(pc, 1, b, 60); /* shares 30 */
    const int free_[3] = {1, 1, 1};
    int reuse = -1;
    /* Plain KV: the longest shared start. */
    cr_assert_eq(prompt_cache_pick(pc, free_, prompt, 64, 1, NULL, NULL, &reuse), 0);
    cr_assert_eq(reuse, 50);
    /* Slot 0's latest checkpoint within 50 is at 16, slot 1's at 24: slot 1 gives more. */
    int ckpt[3] = {16, 24, 0};
    cr_assert_eq(prompt_cache_pick(pc, free_, prompt, 64, 1, up_to_checkpoint, ckpt, &reuse), 1);
    cr_assert_eq(reuse, 24);
    /* Neither has a checkpoint within its shared start: the empty slot 2, both caches kept. */
    ckpt[0] = 55, ckpt[1] = 40;
    cr_assert_eq(prompt_cache_pick(pc, free_, prompt, 64, 1, up_to_checkpoint, ckpt, &reuse), 2);
    cr_assert_eq(reuse, 0);
    /* Without the callback the same prompt would take slot 0 (and find nothing to reuse there). */
    cr_assert_eq(prompt_cache_pick(pc, free_, prompt, 64, 1, NULL, NULL, &reuse), 0);
    prompt_cache_free(pc);
}
