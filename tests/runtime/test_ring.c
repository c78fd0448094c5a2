/* test_ring — the streaming ring's bookkeeping over many steps whose lists of streamed layers change: every
 * use finds its layer in its slot, no copy overwrites a slot before that slot's use, at most k copies wait,
 * and a step with the same list as the last one drops nothing (the next step's first copies were issued
 * during this one). A model of the slots (what each holds, whether its last copy has been used) checks the
 * ring. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/core/status.h"
#include "runtime/ring.h"

struct slots {
    int layer[8];
    int used[8]; /* the slot's last copy has been used (so a new copy may land in it) */
};

/* Issues everything the ring wants, checking that each copy lands in a slot whose last copy was used (or a
 * dropped copy, which was never going to be used). */
static int issue_all(struct ring *r, struct slots *s, const int *dropped_slot)
{
    int layer, slot, n = 0;
    uint64_t c;
    while (ring_next_copy(r, &layer, &slot, &c)) {
        cr_assert_eq(slot, (int)(c % (uint64_t)r->k));
        cr_assert(s->used[slot] || (dropped_slot && dropped_slot[slot]),
                  "copy %llu overwrites an unused slot %d", (unsigned long long)c, slot);
        s->layer[slot] = layer;
        s->used[slot] = 0;
        cr_assert_leq(ring_waiting(r), r->k);
        n++;
    }
    return n;
}

/* One step: declare, issue, use each layer of the list in order (issuing after every use). */
static int step(struct ring *r, struct slots *s, const int *list, int n)
{
    int waiting_before = ring_waiting(r), dropped_slot[8] = {0};
    /* The slots of the copies a new list will drop are the last `dropped` issued ones. */
    const uint64_t nc = r->next_copy;
    const int dropped = ring_begin(r, list, n);
    cr_assert_geq(dropped, 0);
    cr_assert_leq(dropped, waiting_before);
    for (int i = 0; i < dropped; i++) dropped_slot[(nc - 1 - (uint64_t)i) % (uint64_t)r->k] = 1;
    issue_all(r, s, dropped_slot);
    for (int i = 0; i < n; i++) {
        int slot;
        uint64_t c;
        cr_assert_eq(ring_use(r, list[i], &slot, &c), FERRY_OK, "use %d of layer %d", i, list[i]);
        cr_assert_eq(s->layer[slot], list[i], "slot %d holds layer %d, the step uses %d", slot,
                     s->layer[slot], list[i]);
        cr_assert_eq(s->used[slot], 0, "slot %d used twice", slot);
        s->used[slot] = 1;
        issue_all(r, s, NULL);
    }
    return dropped;
}

static void fresh(struct slots *s)
{
    for (int i = 0; i < 8; i++) s->used[i] = 1, s->layer[i] = -1;
}

Test(ring, same_list_every_step_prefetches_across_steps)
{
    struct ring r;
    struct slots s;
    fresh(&s);
    cr_assert_eq(ring_init(&r, 2, 32), FERRY_OK);
    const int list[] = {1, 2, 4, 5, 7, 9, 10};
    cr_assert_eq(step(&r, &s, list, 7), 0);
    for (int k = 0; k < 50; k++) {
        /* At the end of a step the next step's first two copies are already issued. */
        cr_assert_eq(ring_waiting(&r), 2);
        cr_assert_eq(r.queue[r.next_use % 2], 1);
        cr_assert_eq(step(&r, &s, list, 7), 0, "step %d dropped copies", k);
    }
    cr_assert_eq(r.next_use, 51u * 7);
    ring_free(&r);
}

/* A list shorter than the ring: the prefetch wraps it several times and the next step keeps all of it. */
Test(ring, short_list_wraps_within_the_prefetch)
{
    struct ring r;
    struct slots s;
    fresh(&s);
    cr_assert_eq(ring_init(&r, 4, 8), FERRY_OK);
    const int list[] = {3, 7};
    step(&r, &s, list, 2);
    cr_assert_eq(ring_waiting(&r), 4);
    for (int k = 0; k < 10; k++) cr_assert_eq(step(&r, &s, list, 2), 0);
    ring_free(&r);
}

/* Steps of different sizes stream different lists (their buckets' plans), with empty ones between. */
Test(ring, changing_lists_drop_only_what_does_not_match)
{
    for (int k = 2; k <= 5; k++) {
        struct ring r;
        struct slots s;
        fresh(&s);
        cr_assert_eq(ring_init(&r, k, 27), FERRY_OK);
        unsigned seed = 12345u + (unsigned)k;
        int lists[3][27], lens[3] = {0, 0, 0};
        /* Plan A streams every host layer, plan B a spread subset, plan C nothing. */
        for (int l = 0; l < 27; l++) {
            lists[0][lens[0]++] = l + 1;
            if (l % 3 != 1) lists[1][lens[1]++] = l + 1;
        }
        int last = -1;
        for (int i = 0; i < 400; i++) {
            seed = seed * 1103515245u + 12345u;
            const int which = (int)((seed >> 16) % 3);
            const int dropped = step(&r, &s, lists[which], lens[which]);
            if (which == last && lens[which])
                cr_assert_eq(dropped, 0, "k %d step %d: same plan dropped %d", k, i, dropped);
            if (lens[which] == 0) cr_assert_eq(dropped, 0, "an empty list keeps the prefetch");
            if (lens[which]) last = which;
        }
        ring_free(&r);
    }
}

Test(ring, uses_out_of_order_are_refused)
{
    struct ring r;
    struct slots s;
    fresh(&s);
    cr_assert_eq(ring_init(&r, 2, 4), FERRY_OK);
    const int list[] = {1, 2, 3};
    cr_assert_eq(ring_begin(&r, list, 3), 0);
    issue_all(&r, &s, NULL);
    int slot;
    uint64_t c;
    cr_assert_eq(ring_use(&r, 2, &slot, &c), FERRY_ERR_INTERNAL);
    cr_assert_eq(ring_use(&r, 1, &slot, &c), FERRY_OK);
    cr_assert_eq(ring_use(&r, 2, &slot, &c), FERRY_OK);
    /* Layer 3's copy is not issued yet (both slots were busy). */
    cr_assert_eq(ring_use(&r, 3, &slot, &c), FERRY_ERR_INTERNAL);
    cr_assert_eq(ring_begin(&r, list, 5), FERRY_ERR_INVALID, "more layers than the ring was made for");
    ring_free(&r);
    cr_assert_eq(ring_init(&r, 0, 4), FERRY_ERR_INVALID);
}
