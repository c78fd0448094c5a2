/* test_ring — the streaming ring's bookkeeping over many steps whose lists of streamed pieces change: every
 * use finds its piece's bytes where its copy put them, no copy overwrites bytes whose copy still waits for
 * its use, each copy waits for the newest used copy whose bytes it overwrites, and a step with the same list
 * as the last one drops nothing (the next step's first copies were issued during this one). A model of the
 * ring's bytes (which copy last wrote each RING_ALIGN unit, and whether that copy has been used) checks the
 * ring. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/core/status.h"
#include "runtime/ring.h"

#define UNITS  64
#define COPIES 100000

/* Issues are counted apart from copy numbers: a dropped copy's number is issued again. */
struct model {
    int64_t writer[UNITS]; /* issue that last wrote the unit (-1: never) */
    uint8_t used[COPIES];  /* issue i has been used (or dropped: never going to be) */
    int64_t copy[COPIES];  /* copy number of issue i */
    int64_t issue[COPIES]; /* the latest issue of copy number c */
    int item[COPIES];      /* item of issue i */
    int64_t n_issues;
};

static void fresh(struct model *m)
{
    memset(m, 0, sizeof *m);
    for (int u = 0; u < UNITS; u++) m->writer[u] = -1;
}

/* Issues everything the ring wants, checking each copy against the model. */
static int issue_all(struct ring *r, struct model *m)
{
    struct ring_issue is;
    int n = 0;
    while (ring_next_copy(r, &is)) {
        const int64_t me = m->n_issues++;
        cr_assert_eq(is.off % RING_ALIGN, 0);
        cr_assert_leq(is.off + is.bytes, r->cap, "copy %llu runs past the step's part of the ring",
                      (unsigned long long)is.copy);
        int64_t newest = -1;
        for (uint64_t u = is.off / RING_ALIGN; u < (is.off + is.bytes + RING_ALIGN - 1) / RING_ALIGN; u++) {
            const int64_t w = m->writer[u];
            m->writer[u] = me;
            if (w < 0) continue;
            cr_assert(m->used[w], "copy %llu overwrites copy %lld before its use",
                      (unsigned long long)is.copy, (long long)m->copy[w]);
            if (m->copy[w] > newest && m->copy[w] < (int64_t)r->next_use && m->issue[m->copy[w]] == w)
                newest = m->copy[w]; /* (a dropped copy's bytes need no wait) */
        }
        cr_assert_geq(is.after, newest, "copy %llu waits for %lld, not for %lld", (unsigned long long)is.copy,
                      (long long)is.after, (long long)newest);
        cr_assert_lt(is.after, (int64_t)r->next_use, "it waits for a use not yet made");
        m->item[me] = is.item;
        m->copy[me] = (int64_t)is.copy;
        m->issue[is.copy] = me;
        cr_assert_leq(ring_waiting(r), RING_MAX_WAIT);
        n++;
    }
    return n;
}

static uint64_t size_of(int item)
{
    return (uint64_t)(1 + item % 5) * 700; /* 700 .. 3,500 bytes: 3 to 14 units, not multiples */
}

/* One step through [0, cap): declare, issue, use each piece of the list in order (issuing after every use).
 */
static int step_cap(struct ring *r, struct model *m, const int *list, int n, uint64_t cap)
{
    uint64_t sizes[256];
    for (int i = 0; i < n; i++) sizes[i] = size_of(list[i]);
    const int waiting_before = ring_waiting(r);
    const uint64_t nc = r->next_copy;
    const int dropped = ring_begin(r, list, sizes, n, cap);
    cr_assert_geq(dropped, 0);
    cr_assert_leq(dropped, waiting_before);
    for (int i = 0; i < dropped; i++) m->used[m->issue[nc - 1 - (uint64_t)i]] = 1;
    issue_all(r, m);
    for (int i = 0; i < n; i++) {
        uint64_t off, c;
        cr_assert_eq(ring_use(r, list[i], &off, &c), FERRY_OK, "use %d of item %d", i, list[i]);
        const int64_t me = m->issue[c];
        cr_assert_eq(m->item[me], list[i]);
        cr_assert_eq(m->used[me], 0, "copy %llu used twice", (unsigned long long)c);
        for (uint64_t u = off / RING_ALIGN; u < (off + sizes[i] + RING_ALIGN - 1) / RING_ALIGN; u++)
            cr_assert_eq(m->writer[u], me, "item %d's bytes were overwritten before its use", list[i]);
        m->used[me] = 1;
        issue_all(r, m);
    }
    return dropped;
}

static int step(struct ring *r, struct model *m, const int *list, int n)
{
    return step_cap(r, m, list, n, r->size);
}

Test(ring, same_list_every_step_prefetches_across_steps)
{
    struct ring r;
    static struct model m;
    fresh(&m);
    cr_assert_eq(ring_init(&r, 2 * 3500 + 2 * RING_ALIGN, 32), FERRY_OK);
    const int list[] = {1, 2, 4, 5, 7, 9, 10};
    cr_assert_eq(step(&r, &m, list, 7), 0);
    for (int k = 0; k < 50; k++) {
        /* At the end of a step the next step's first copy is already issued. */
        cr_assert_geq(ring_waiting(&r), 1);
        cr_assert_eq(r.hist[r.next_use % RING_HISTORY].item, 1);
        cr_assert_eq(step(&r, &m, list, 7), 0, "step %d dropped copies", k);
    }
    cr_assert_eq(r.next_use, 51u * 7);
    ring_free(&r);
}

/* A list much smaller than the ring: the prefetch wraps it many times, as many copies as fit, and the
 * next step keeps all of them. */
Test(ring, short_list_wraps_within_the_prefetch)
{
    struct ring r;
    static struct model m;
    fresh(&m);
    cr_assert_eq(ring_init(&r, UNITS * RING_ALIGN, 8), FERRY_OK);
    const int list[] = {5, 10}; /* 700 bytes each: 3 units */
    step(&r, &m, list, 2);
    cr_assert_eq(ring_waiting(&r), 21, "the ring's 64 units hold 21 copies of 3, all waiting: %d",
                 ring_waiting(&r));
    for (int k = 0; k < 10; k++) cr_assert_eq(step(&r, &m, list, 2), 0);
    ring_free(&r);
}

/* Steps of different sizes stream different lists (their buckets' plans), with empty ones between, through
 * rings from just the largest piece up to the model's whole ring. */
Test(ring, changing_lists_drop_only_what_does_not_match)
{
    const uint64_t caps[] = {3500, 2 * 3500, 2 * 3500 + 700, 5000, UNITS * RING_ALIGN};
    for (size_t k = 0; k < sizeof caps / sizeof caps[0]; k++) {
        struct ring r;
        static struct model m;
        fresh(&m);
        cr_assert_eq(ring_init(&r, caps[k], 4 * 27), FERRY_OK);
        unsigned seed = 12345u + (unsigned)k;
        int lists[3][4 * 27], lens[3] = {0, 0, 0};
        /* Plan A streams every host layer's four pieces, plan B a spread subset, plan C nothing. */
        for (int l = 0; l < 27; l++)
            for (int p = 0; p < 4; p++) {
                lists[0][lens[0]++] = 4 * l + p;
                if (l % 3 != 1) lists[1][lens[1]++] = 4 * l + p;
            }
        int last = -1;
        for (int i = 0; i < 300; i++) {
            seed = seed * 1103515245u + 12345u;
            const int which = (int)((seed >> 16) % 3);
            const int dropped = step(&r, &m, lists[which], lens[which]);
            if (which == last && lens[which])
                cr_assert_eq(dropped, 0, "cap %llu step %d: same plan dropped %d",
                             (unsigned long long)caps[k], i, dropped);
            if (lens[which] == 0) cr_assert_eq(dropped, 0, "an empty list keeps the prefetch");
            if (lens[which]) last = which;
        }
        ring_free(&r);
    }
}

Test(ring, place_aligns_and_wraps)
{
    cr_assert_eq(ring_place(4096, 0, 1000), 0u);
    cr_assert_eq(ring_place(4096, 1000, 1000), 1024u);
    cr_assert_eq(ring_place(4096, 3072, 1024), 3072u, "exactly to the end");
    cr_assert_eq(ring_place(4096, 3073, 800), 0u, "past the end: from the start");
}

Test(ring, uses_out_of_order_and_pieces_past_the_ring_are_refused)
{
    struct ring r;
    static struct model m;
    fresh(&m);
    cr_assert_eq(ring_init(&r, 2 * 3500, 4), FERRY_OK);
    const int list[] = {4, 9, 14}; /* 3,500 bytes each: two fit */
    const uint64_t sizes[] = {3500, 3500, 3500};
    cr_assert_eq(ring_begin(&r, list, sizes, 3, r.size), 0);
    cr_assert_eq(issue_all(&r, &m), 1, "the second piece would run past the end onto the first");
    uint64_t off, c;
    cr_assert_eq(ring_use(&r, 9, &off, &c), FERRY_ERR_INTERNAL);
    cr_assert_eq(ring_use(&r, 4, &off, &c), FERRY_OK);
    cr_assert_eq(ring_use(&r, 9, &off, &c), FERRY_ERR_INTERNAL, "not issued yet");
    cr_assert_eq(ring_begin(&r, list, sizes, 5, r.size), FERRY_ERR_INVALID,
                 "more items than the ring was made for");
    const uint64_t big[] = {3500, 7001};
    cr_assert_eq(ring_begin(&r, list, big, 2, r.size), FERRY_ERR_INVALID, "a piece larger than the ring");
    cr_assert_eq(ring_begin(&r, list, sizes, 3, 3499), FERRY_ERR_INVALID,
                 "a piece larger than the step's cap");
    cr_assert_eq(ring_begin(&r, list, sizes, 3, r.size + 1), FERRY_ERR_INVALID, "a cap past the ring");
    ring_free(&r);
    cr_assert_eq(ring_init(&r, 0, 4), FERRY_ERR_INVALID);
}

/* Steps that park layers rotate through less of the ring: the waiting copies past their cap are dropped, no
 * copy lands there, and a full step afterwards writes there again. */
Test(ring, steps_of_a_smaller_cap_leave_the_end_alone)
{
    struct ring r;
    static struct model m;
    fresh(&m);
    cr_assert_eq(ring_init(&r, UNITS * RING_ALIGN, 4 * 27), FERRY_OK);
    int list[4 * 27], n = 0;
    for (int l = 0; l < 27; l++)
        for (int p = 0; p < 4; p++) list[n++] = 4 * l + p;
    const uint64_t small = 2 * 3584; /* two of the largest pieces (3,500 bytes, 14 units) */
    unsigned seed = 777u;
    for (int i = 0; i < 200; i++) {
        seed = seed * 1103515245u + 12345u;
        const int parked = (seed >> 16) % 2;
        const uint64_t cap = parked ? small : r.size;
        const uint64_t before = r.next_copy;
        const int waiting = ring_waiting(&r);
        int beyond = 0;
        for (uint64_t c = r.next_use; c < before; c++)
            beyond |= r.hist[c % RING_HISTORY].off + r.hist[c % RING_HISTORY].bytes > cap;
        const int dropped = step_cap(&r, &m, list, n, cap);
        if (beyond) cr_assert_gt(dropped, 0, "step %d: a waiting copy past the cap was kept", i);
        cr_assert_leq(dropped, waiting);
    }
    ring_free(&r);
}
