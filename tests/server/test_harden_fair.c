/* test_harden_fair — which connection gives way at the connection cap (server/http_fair.c), as numbers. */
#include <criterion/criterion.h>

#include "server/http_fair.h"

static struct http_fair_cand cand(int count, enum http_fair_activity a, double silent)
{
    return (struct http_fair_cand){.addr_count = count, .activity = a, .silent_s = silent};
}

Test(http_fair, only_idle_or_slow_connections_give_way)
{
    cr_assert(http_fair_eligible(&(struct http_fair_cand){256, HTTP_FAIR_IDLE, 0.0}, 0));
    struct http_fair_cand working = cand(256, HTTP_FAIR_WORKING, 100.0);
    cr_assert_not(http_fair_eligible(&working, 0)); /* a request being served is never cut */
    struct http_fair_cand sending = cand(256, HTTP_FAIR_READING, HTTP_FAIR_SLOW_S / 2);
    cr_assert_not(http_fair_eligible(&sending, 0)); /* a head still arriving gets to finish */
    struct http_fair_cand trickling = cand(256, HTTP_FAIR_READING, HTTP_FAIR_SLOW_S * 3);
    cr_assert(http_fair_eligible(&trickling, 0));
}

Test(http_fair, an_address_gives_way_only_to_one_holding_fewer)
{
    /* after the swap the holder keeps at least as many as the newcomer: no trading back and forth */
    struct http_fair_cand c = cand(3, HTTP_FAIR_IDLE, 5.0);
    cr_assert(http_fair_eligible(&c, 0));
    cr_assert(http_fair_eligible(&c, 1));     /* 3 -> 2 against 1 -> 2 */
    cr_assert_not(http_fair_eligible(&c, 2)); /* 3 -> 2 against 2 -> 3 */
    c.addr_count = 1;
    cr_assert_not(http_fair_eligible(&c, 0)); /* an address's only connection stays */
    c.addr_count = 2;
    cr_assert(http_fair_eligible(&c, 0));
}

Test(http_fair, the_biggest_holder_then_the_longest_silent_goes_first)
{
    struct http_fair_cand big = cand(256, HTTP_FAIR_IDLE, 1.0), small = cand(10, HTTP_FAIR_IDLE, 50.0);
    cr_assert(http_fair_prefer(&big, &small));
    cr_assert_not(http_fair_prefer(&small, &big));
    struct http_fair_cand old = cand(256, HTTP_FAIR_IDLE, 9.0), young = cand(256, HTTP_FAIR_READING, 2.0);
    cr_assert(http_fair_prefer(&old, &young));
    cr_assert_not(http_fair_prefer(&young, &old));
    cr_assert_not(http_fair_prefer(&old, &old));
}

/* A whole cap: 16 addresses holding 16 silent connections each, one of them also working; the pick over all
 * of them is a silent connection of an address with the most, whichever order they are seen in. */
Test(http_fair, a_pick_over_a_full_table)
{
    struct http_fair_cand t[256];
    for (int i = 0; i < 256; i++) t[i] = cand(i / 16 == 3 ? 17 : 16, HTTP_FAIR_IDLE, (double)(i % 16));
    t[3 * 16 + 15].activity = HTTP_FAIR_WORKING; /* the oldest of the biggest is busy: skipped */
    int best = -1;
    for (int i = 0; i < 256; i++)
        if (http_fair_eligible(&t[i], 0) && (best < 0 || http_fair_prefer(&t[i], &t[best]))) best = i;
    cr_assert_eq(best, 3 * 16 + 14);
    /* a newcomer that already holds 15 finds none: each would keep at most 15 */
    best = -1;
    for (int i = 0; i < 256; i++)
        if (i / 16 != 3 && http_fair_eligible(&t[i], 15)) best = i;
    cr_assert_eq(best, -1);
}
