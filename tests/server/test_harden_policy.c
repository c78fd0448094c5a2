/* test_harden_policy — sharing the engine between clients (server/sched_policy.c): fair shares, which queued
 * sequence goes next, which running one gives its slot up, the embedding budget. Numbers only. */
#include <criterion/criterion.h>

#include "kernels/core/status.h"
#include "server/sched_policy.h"

Test(sched_fair, share_is_slots_over_clients_at_least_one)
{
    cr_assert_eq(sched_policy_fair_share(4, 1), 4);
    cr_assert_eq(sched_policy_fair_share(4, 2), 2);
    cr_assert_eq(sched_policy_fair_share(4, 3), 1);
    cr_assert_eq(sched_policy_fair_share(4, 65), 1);
    cr_assert_eq(sched_policy_fair_share(4, 0), 4);
}

Test(sched_fair, pick_serves_a_client_below_its_share_first)
{
    /* clients 0 (holding 4 slots, 60 more queued) and 1 (holding none) */
    int q_client[6] = {0, 0, 0, 0, 1, 0};
    unsigned char ready[6] = {1, 1, 1, 1, 1, 1};
    int running_of[2] = {4, 0};
    cr_assert_eq(sched_policy_fair_pick(q_client, ready, 6, running_of, 2), 4);
    /* at its share, client 1 waits its turn like everyone: first come first served */
    running_of[1] = 2;
    cr_assert_eq(sched_policy_fair_pick(q_client, ready, 6, running_of, 2), 0);
    /* a stream paused off its slot is skipped until its client reads */
    ready[0] = 0;
    cr_assert_eq(sched_policy_fair_pick(q_client, ready, 6, running_of, 2), 1);
    for (int i = 0; i < 6; i++) ready[i] = 0;
    cr_assert_eq(sched_policy_fair_pick(q_client, ready, 6, running_of, 2), -1);
    cr_assert_eq(sched_policy_fair_pick(q_client, ready, 0, running_of, 2), -1);
}

Test(sched_fair, a_paused_stream_gives_way_to_anyone_the_cheapest_first)
{
    struct sched_fair_seq run[4] = {{0, SCHED_YIELD_NO, 10},
                                    {0, SCHED_YIELD_PAUSED, 900},
                                    {0, SCHED_YIELD_PAUSED, 300},
                                    {0, SCHED_YIELD_SHARE, 5}};
    int running_of[2] = {4, 0};
    cr_assert_eq(sched_policy_fair_victim(run, 4, running_of, 2, 1), 2);
    /* even for the same client, and with no share to claim */
    cr_assert_eq(sched_policy_fair_victim(run, 4, running_of, 4, 0), 2);
}

Test(sched_fair, beyond_the_share_the_biggest_holder_gives_way)
{
    /* client 0 holds 3 (an embedding that starts over), client 2 holds 1; client 1 waits with none */
    struct sched_fair_seq run[4] = {{0, SCHED_YIELD_SHARE, 4000},
                                    {0, SCHED_YIELD_SHARE, 0},
                                    {0, SCHED_YIELD_SHARE, 512},
                                    {2, SCHED_YIELD_SHARE, 1}};
    int running_of[3] = {3, 0, 1};
    const int share = sched_policy_fair_share(4, 3);                         /* 1 */
    cr_assert_eq(sched_policy_fair_victim(run, 4, running_of, share, 1), 1); /* least progress lost */
    /* a waiter already at its share takes nothing */
    running_of[1] = 1;
    cr_assert_eq(sched_policy_fair_victim(run, 4, running_of, share, 1), -1);
    /* nor does anyone take from a client within its share */
    struct sched_fair_seq fair[2] = {{0, SCHED_YIELD_SHARE, 1}, {2, SCHED_YIELD_SHARE, 1}};
    int r2[3] = {1, 0, 1};
    cr_assert_eq(sched_policy_fair_victim(fair, 2, r2, 1, 1), -1);
    /* nor from a sequence that may not give its slot up */
    struct sched_fair_seq busy[2] = {{0, SCHED_YIELD_NO, 1}, {0, SCHED_YIELD_NO, 1}};
    int r3[2] = {2, 0};
    cr_assert_eq(sched_policy_fair_victim(busy, 2, r3, 1, 1), -1);
    /* nor does a client take its own */
    int r4[3] = {3, 0, 1};
    cr_assert_eq(sched_policy_fair_victim(run, 4, r4, 1, 0), -1);
}

Test(sched_fair, embedding_budget_shrinks_beside_other_work)
{
    struct sched_policy_params p = {.n_slots = 4, .max_batch_tokens = 512};
    cr_assert_eq(sched_policy_embed_budget(&p, 0, 0, 0), 128);
    cr_assert_eq(sched_policy_embed_budget(&p, 1, 0, 0), 64);
    cr_assert_eq(sched_policy_embed_budget(&p, 0, 1, 0), 64);
    p.max_batch_tokens = 3;
    cr_assert_eq(sched_policy_embed_budget(&p, 1, 1, 0), 1);
    cr_assert_eq(sched_policy_embed_budget(&p, 0, 0, 0), 1);
    /* a sequence awaiting its first token: no embedding rows in its step */
    p.max_batch_tokens = 512;
    cr_assert_eq(sched_policy_embed_budget(&p, 1, 0, 1), 0);
}
