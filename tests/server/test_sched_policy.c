/* Unit tests of sched_policy, the scheduler's pure admission and batch-composition module: KV need, queue
 * admission when slots or KV blocks run out (with idle prompt caches dropped least recently used first),
 * the per-step token budget (decode rows first, prefill fills the rest, an explicit prefill budget), a long
 * prompt chunked across steps, prompt-logprob rows, first come first served under a stream of short
 * requests, and the refusal of a sequence that can never fit the pool. No engine, no threads, no HTTP: a
 * small simulation in this file plays the engine thread's loop over the module's decisions. */
#include <criterion/criterion.h>
#include <math.h>
#include <string.h>

#include "kernels/core/status.h"
#include "server/sched_policy.h"

static struct sched_policy_params params(void)
{
    struct sched_policy_params p = {
        .n_slots = 4,
        .max_queue = 8,
        .max_batch_tokens = 64,
        .prefill_budget = 0,
        .prompt_lp_rows = 64,
        .ctx = 1024,
        .kv_blocks = 64,
        .kv_block = 16,
    };
    return p;
}

Test(sched_policy, kv_need_rounds_up_and_caps_at_context)
{
    struct sched_policy_params p = params();
    cr_assert_eq(sched_policy_kv_need(&p, 10, 20), 2);      /* 30 positions → 2 blocks of 16 */
    cr_assert_eq(sched_policy_kv_need(&p, 16, 16), 2);      /* exactly 32 */
    cr_assert_eq(sched_policy_kv_need(&p, 16, 17), 3);      /* 33 */
    cr_assert_eq(sched_policy_kv_need(&p, 5, 0), 1);        /* embeddings, prompt logprobs: the prompt only */
    cr_assert_eq(sched_policy_kv_need(&p, 1000, 5000), 64); /* never more than the context: 1024 / 16 */
    cr_assert_eq(sched_policy_blocks(&p, 0), 0);
}

Test(sched_policy, accepts_refuses_too_many_sequences_and_a_full_queue)
{
    struct sched_policy_params p = params(); /* 4 slots + 8 queued */
    /* more than slots + queue: taken alone, when nothing else waits */
    cr_assert_eq(sched_policy_accepts(&p, 0, 0, 13), 0);
    cr_assert_eq(sched_policy_accepts(&p, 0, 4, 2048), 0);
    cr_assert_eq(sched_policy_accepts(&p, 1, 4, 13), FERRY_ERR_BUSY);
    cr_assert_eq(sched_policy_accepts(&p, 0, 0, 12), 0);
    /* all slots running, 8 queued: one more is busy, not out of range */
    cr_assert_eq(sched_policy_accepts(&p, 8, 4, 1), FERRY_ERR_BUSY);
    cr_assert_eq(sched_policy_accepts(&p, 7, 4, 1), 0);
    /* free slots add to the queue's room */
    cr_assert_eq(sched_policy_accepts(&p, 9, 2, 1), 0);
    cr_assert_eq(sched_policy_accepts(&p, 10, 2, 1), FERRY_ERR_BUSY);
}

Test(sched_policy, admission_waits_for_a_slot_and_for_kv_room)
{
    struct sched_policy_params p = params();
    p.kv_blocks = 10;
    int ev = -1;
    /* no slot: wait even when the KV pool is empty */
    cr_assert_eq(sched_policy_admit(&p, 4, 0, 1, NULL, 0, &ev), SCHED_ADMIT_WAIT);
    /* a slot, and the reservation fits exactly */
    cr_assert_eq(sched_policy_admit(&p, 3, 7, 3, NULL, 0, &ev), SCHED_ADMIT_NOW);
    cr_assert_eq(ev, 0);
    /* one block short */
    cr_assert_eq(sched_policy_admit(&p, 1, 8, 3, NULL, 0, &ev), SCHED_ADMIT_WAIT);
    cr_assert_eq(ev, 0);
}

Test(sched_policy, admission_drops_the_fewest_idle_caches_least_recently_used_first)
{
    struct sched_policy_params p = params();
    p.kv_blocks = 10;
    const int idle[3] = {3, 2, 5}; /* least recently used first */
    int ev = -1;
    /* 2 reserved + 3 needed + 10 idle = 15: dropping 3 then 2 leaves exactly 10 */
    cr_assert_eq(sched_policy_admit(&p, 1, 2, 3, idle, 3, &ev), SCHED_ADMIT_NOW);
    cr_assert_eq(ev, 2);
    /* 4 + 3 + 10: all three must go */
    cr_assert_eq(sched_policy_admit(&p, 1, 4, 3, idle, 3, &ev), SCHED_ADMIT_NOW);
    cr_assert_eq(ev, 3);
    /* fits beside every cache: none dropped */
    cr_assert_eq(sched_policy_admit(&p, 0, 0, 0, idle, 3, &ev), SCHED_ADMIT_NOW);
    cr_assert_eq(ev, 0);
    /* cannot fit even with every cache gone: the head waits, and the caches go (the room is its) */
    cr_assert_eq(sched_policy_admit(&p, 1, 8, 3, idle, 3, &ev), SCHED_ADMIT_WAIT);
    cr_assert_eq(ev, 3);
}

/* With the pool's extension in host memory (kv_fast_blocks < kv_blocks), idle caches are dropped, least
 * recently used first, while they would leave the head's positions to the extension: Q4_K_M 7B under 4 GiB
 * with serve's defaults (1,024 device positions, 4 slots of 4,096) served one client at 84.5 tok/s with ITL
 * p50 11.4 ms where the bench decoded at 7.3 ms, the third request on finding two caches on the device. */
Test(sched_policy, idle_caches_do_not_push_the_head_into_the_extension)
{
    struct sched_policy_params p = params();
    p.kv_blocks = 20;
    p.kv_fast_blocks = 10;
    const int idle[3] = {3, 2, 5}; /* least recently used first */
    int ev = -1;
    /* 0 reserved + 4 needed + 10 idle = 14 fits the pool, not the device: 3 and 2 go (4 + 5 <= 10) */
    cr_assert_eq(sched_policy_admit(&p, 0, 0, 4, idle, 3, &ev), SCHED_ADMIT_NOW);
    cr_assert_eq(ev, 2);
    /* 2 + 4 + 10: every cache goes */
    cr_assert_eq(sched_policy_admit(&p, 1, 2, 4, idle, 3, &ev), SCHED_ADMIT_NOW);
    cr_assert_eq(ev, 3);
    /* the running sequences already fill the device: every cache goes too (what they hold there is the
     * head's) */
    cr_assert_eq(sched_policy_admit(&p, 1, 12, 4, idle, 3, &ev), SCHED_ADMIT_NOW);
    cr_assert_eq(ev, 3);
    /* beside every cache on the device: none dropped */
    cr_assert_eq(sched_policy_admit(&p, 0, 0, 0, idle, 3, &ev), SCHED_ADMIT_NOW);
    cr_assert_eq(ev, 0);
    /* no extension (kv_fast_blocks 0: all of the pool is the device's): only what the pool needs goes */
    p.kv_fast_blocks = 0;
    cr_assert_eq(sched_policy_admit(&p, 0, 0, 4, idle, 3, &ev), SCHED_ADMIT_NOW);
    cr_assert_eq(ev, 0);
}

Test(sched_policy, never_fits_is_refused_and_would_never_be_admitted)
{
    struct sched_policy_params p = params();
    p.kv_blocks = 4; /* 64 positions */
    int need = 0;
    cr_assert_eq(sched_policy_fits_pool(&p, 60, 4, &need), 0);
    cr_assert_eq(need, 4);
    cr_assert_eq(sched_policy_fits_pool(&p, 60, 5, &need), FERRY_ERR_DEVICE_MEM);
    cr_assert_eq(need, 5);
    /* which is why submit refuses it: with nothing running and nothing cached it still waits */
    int ev = -1;
    cr_assert_eq(sched_policy_admit(&p, 0, 0, need, NULL, 0, &ev), SCHED_ADMIT_WAIT);
}

Test(sched_policy, step_budget_decode_rows_first_prefill_fills_the_rest)
{
    struct sched_policy_params p = params(); /* 64 tokens a step */
    const struct sched_step_seq seqs[5] = {
        {100, 10, 0, 0}, /* prefilling, admitted first */
        {20, 20, 0, 0},  /* decoding */
        {100, 0, 0, 0},  /* prefilling, admitted later */
        {30, 30, 0, 0},  /* decoding */
        {40, 40, 0, 0},  /* decoding */
    };
    int chunk[5];
    struct sched_step_plan plan;
    cr_assert_eq(sched_policy_plan_step(&p, seqs, 5, chunk, &plan), 64);
    cr_assert_eq(plan.n_decode, 3);
    cr_assert_eq(plan.n_prefill, 61);
    cr_assert_eq(chunk[0], 61); /* 90 left, 61 room */
    cr_assert_eq(chunk[2], 0);  /* nothing left for the later one */
    cr_assert_eq(chunk[1] + chunk[3] + chunk[4], 0);

    /* the first prompt nearly done: the second takes the rest */
    struct sched_step_seq s2[5];
    memcpy(s2, seqs, sizeof s2);
    s2[0].n_fed = 95;
    sched_policy_plan_step(&p, s2, 5, chunk, &plan);
    cr_assert_eq(chunk[0], 5);
    cr_assert_eq(chunk[2], 56);

    /* an explicit prefill budget caps the prefill below what the step could hold */
    p.prefill_budget = 20;
    cr_assert_eq(sched_policy_plan_step(&p, s2, 5, chunk, &plan), 23);
    cr_assert_eq(chunk[0], 5);
    cr_assert_eq(chunk[2], 15);
    /* ... and never lifts it above max_batch_tokens minus the decode rows */
    p.prefill_budget = 1000;
    cr_assert_eq(sched_policy_plan_step(&p, s2, 5, chunk, &plan), 64);
    cr_assert_eq(chunk[2], 56);

    /* a sequence whose prompt runs elsewhere (an embedding) is skipped */
    p.prefill_budget = 0;
    s2[0].no_prefill = 1;
    sched_policy_plan_step(&p, s2, 5, chunk, &plan);
    cr_assert_eq(chunk[0], 0);
    cr_assert_eq(chunk[2], 61);
}

Test(sched_policy, prefill_stops_before_the_prompt_tail_for_a_checkpoint)
{
    struct sched_policy_params p = params(); /* 64 tokens a step */
    p.ckpt_tail = 4;
    struct sched_step_seq seqs[2] = {{50, 10, 0, 0}, {30, 0, 0, 0}};
    int chunk[2];
    struct sched_step_plan plan;
    /* The first stops at 46, 4 before its end; the second takes what is left, up to its own 26. */
    cr_assert_eq(sched_policy_plan_step(&p, seqs, 2, chunk, &plan), 36 + 26);
    cr_assert_eq(chunk[0], 36);
    cr_assert_eq(chunk[1], 26);
    /* From there each feeds its last 4. */
    seqs[0].n_fed = 46, seqs[1].n_fed = 26;
    sched_policy_plan_step(&p, seqs, 2, chunk, &plan);
    cr_assert_eq(chunk[0], 4);
    cr_assert_eq(chunk[1], 4);
    /* A prompt of 4 or fewer left, or already past its tail, goes on in one chunk; the budget still cuts
     * first when it ends sooner. */
    seqs[0].n_fed = 47, seqs[1] = (struct sched_step_seq){200, 0, 0, 0};
    sched_policy_plan_step(&p, seqs, 2, chunk, &plan);
    cr_assert_eq(chunk[0], 3);
    cr_assert_eq(chunk[1], 61);
    /* 0: no stop. */
    p.ckpt_tail = 0;
    seqs[0].n_fed = 10;
    sched_policy_plan_step(&p, seqs, 2, chunk, &plan);
    cr_assert_eq(chunk[0], 40);
}

Test(sched_policy, every_decode_row_fits_even_beyond_the_budget)
{
    struct sched_policy_params p = params();
    p.max_batch_tokens = 4; /* the scheduler keeps it >= n_slots; decode rows are never cut */
    const struct sched_step_seq seqs[3] = {{5, 5, 0, 0}, {7, 7, 0, 0}, {50, 0, 0, 0}};
    int chunk[3];
    struct sched_step_plan plan;
    cr_assert_eq(sched_policy_plan_step(&p, seqs, 3, chunk, &plan), 4);
    cr_assert_eq(plan.n_decode, 2);
    cr_assert_eq(chunk[2], 2);
}

Test(sched_policy, long_prompt_is_chunked_across_steps)
{
    struct sched_policy_params p = params();
    p.max_batch_tokens = 256;
    struct sched_step_seq seqs[3] = {{10, 10, 0, 0}, {1000, 0, 0, 0}, {12, 12, 0, 0}};
    const int want[4] = {254, 254, 254, 238};
    int chunk[3], steps = 0;
    struct sched_step_plan plan;
    while (seqs[1].n_fed < seqs[1].n_prompt) {
        cr_assert_lt(steps, 4, "more steps than 1000 / 254 needs");
        const int n = sched_policy_plan_step(&p, seqs, 3, chunk, &plan);
        cr_assert_eq(plan.n_decode, 2);
        cr_assert_eq(chunk[1], want[steps], "step %d: chunk %d, want %d", steps, chunk[1], want[steps]);
        cr_assert_leq(n, p.max_batch_tokens);
        seqs[1].n_fed += chunk[1];
        steps++;
    }
    cr_assert_eq(steps, 4);
    /* now it decodes too */
    cr_assert_eq(sched_policy_plan_step(&p, seqs, 3, chunk, &plan), 3);
    cr_assert_eq(plan.n_decode, 3);

    /* with an explicit prefill budget of 100: ten chunks of 100 */
    p.prefill_budget = 100;
    seqs[1].n_fed = 0;
    for (steps = 0; seqs[1].n_fed < seqs[1].n_prompt; steps++) {
        sched_policy_plan_step(&p, seqs, 3, chunk, &plan);
        cr_assert_eq(chunk[1], 100);
        seqs[1].n_fed += chunk[1];
    }
    cr_assert_eq(steps, 10);
}

Test(sched_policy, prompt_logprob_rows_are_capped_per_step)
{
    struct sched_policy_params p = params();
    p.max_batch_tokens = 512;
    p.prompt_lp_rows = 64;
    struct sched_step_seq seqs[2] = {{200, 0, 0, 1}, {30, 0, 0, 1}};
    int chunk[2];
    struct sched_step_plan plan;
    sched_policy_plan_step(&p, seqs, 2, chunk, &plan);
    cr_assert_eq(chunk[0], 64);
    cr_assert_eq(chunk[1], 0); /* no logit rows left this step */
    cr_assert_eq(plan.n_lp_rows, 64);
    /* the last chunk of a prompt: its last row is not a prompt-logprob row, so 200-192 = 8 take 7 */
    seqs[0].n_fed = 192;
    sched_policy_plan_step(&p, seqs, 2, chunk, &plan);
    cr_assert_eq(chunk[0], 8);
    cr_assert_eq(chunk[1], 30); /* 57 rows left; its whole prompt: 29 rows */
    cr_assert_eq(plan.n_lp_rows, 7 + 29);
}

Test(sched_policy, embedding_batch_prefills_in_order_up_to_its_budget)
{
    const struct sched_step_seq seqs[4] = {{50, 0, 0, 0}, {10, 10, 0, 0}, {30, 5, 1, 0}, {40, 0, 0, 0}};
    int chunk[4];
    cr_assert_eq(sched_policy_plan_prefill(64, seqs, 4, chunk), 64);
    cr_assert_eq(chunk[0], 50);
    cr_assert_eq(chunk[1], 0); /* done */
    cr_assert_eq(chunk[2], 0); /* not in this batch */
    cr_assert_eq(chunk[3], 14);
}

/* ---- a simulation of the engine thread's loop over the policy's decisions ----------------------------- */

struct sim_req {
    int n_prompt, max_tokens, arrival;
    int need, n_fed, n_gen;
    int admitted_at, done_at; /* steps; -1 not yet */
};

/* One iteration: admit from the queue's head (FCFS) while the policy says so, then one step; sequences that
 * generated max_tokens leave and give their reservation back. Returns how many were admitted. */
static int sim_iteration(const struct sched_policy_params *p, struct sim_req *q, int n_req, int *qhead,
                         int n_arrived, int *run, int *n_run, int *reserved, int step)
{
    int admitted = 0;
    while (*qhead < n_arrived) {
        struct sim_req *r = &q[*qhead];
        int ev;
        if (sched_policy_admit(p, *n_run, *reserved, r->need, NULL, 0, &ev) != SCHED_ADMIT_NOW) break;
        *reserved += r->need;
        r->admitted_at = step;
        run[(*n_run)++] = *qhead;
        (*qhead)++;
        admitted++;
    }
    struct sched_step_seq seqs[16];
    int chunk[16];
    for (int i = 0; i < *n_run; i++) {
        const struct sim_req *r = &q[run[i]];
        seqs[i] = (struct sched_step_seq){r->n_prompt, r->n_fed, 0, 0};
    }
    struct sched_step_plan plan;
    const int n = sched_policy_plan_step(p, seqs, *n_run, chunk, &plan);
    cr_assert_leq(n, p->max_batch_tokens);
    for (int i = 0; i < *n_run;) {
        struct sim_req *r = &q[run[i]];
        if (r->n_fed >= r->n_prompt)
            r->n_gen++;
        else if ((r->n_fed += chunk[i]) == r->n_prompt)
            r->n_gen++; /* the prompt's last row samples the first token */
        if (r->n_gen >= r->max_tokens) {
            r->done_at = step;
            *reserved -= r->need;
            memmove(&run[i], &run[i + 1], (size_t)(*n_run - i - 1) * sizeof *run);
            (*n_run)--;
        } else {
            i++;
        }
    }
    (void)n_req;
    return admitted;
}

Test(sched_policy, fcfs_a_long_request_is_not_starved_by_short_ones_behind_it)
{
    struct sched_policy_params p = params();
    p.n_slots = 4;
    p.kv_blocks = 12; /* 192 positions */
    p.max_batch_tokens = 32;
    enum { N = 14 };
    struct sim_req q[N];
    /* two running requests hold 4 + 4 blocks; then a long one (8 blocks) arrives, then a short one (1 block)
     * every step */
    for (int i = 0; i < N; i++) {
        q[i] = (struct sim_req){0};
        q[i].admitted_at = q[i].done_at = -1;
        if (i < 2)
            q[i].n_prompt = 40, q[i].max_tokens = 20, q[i].arrival = 0;
        else if (i == 2)
            q[i].n_prompt = 100, q[i].max_tokens = 28, q[i].arrival = 1;
        else
            q[i].n_prompt = 6, q[i].max_tokens = 4, q[i].arrival = i - 1;
        q[i].need = sched_policy_kv_need(&p, q[i].n_prompt, q[i].max_tokens);
    }
    cr_assert_eq(q[0].need, 4);
    cr_assert_eq(q[2].need, 8);
    cr_assert_eq(q[3].need, 1);
    int run[16], n_run = 0, qhead = 0, reserved = 0, arrived = 0, step;
    for (step = 0; step < 400; step++) {
        while (arrived < N && q[arrived].arrival <= step) arrived++;
        sim_iteration(&p, q, N, &qhead, arrived, run, &n_run, &reserved, step);
        cr_assert_leq(reserved, p.kv_blocks, "step %d: %d blocks reserved of %d", step, reserved,
                      p.kv_blocks);
        cr_assert_leq(n_run, p.n_slots);
        if (arrived == N && qhead == N && n_run == 0) break;
    }
    cr_assert_lt(step, 400, "the queue never drained");
    /* the short ones had the room (4 free blocks, 2 free slots) but waited behind the long one */
    cr_assert_gt(q[2].admitted_at, q[3].arrival,
                 "the long request was admitted before the first short one came");
    for (int i = 3; i < N; i++)
        cr_assert_geq(q[i].admitted_at, q[2].admitted_at,
                      "short request %d (admitted at step %d) overtook the long "
                      "one (admitted at step %d)",
                      i, q[i].admitted_at, q[2].admitted_at);
    /* admitted in arrival order, and every one finished */
    for (int i = 1; i < N; i++) cr_assert_geq(q[i].admitted_at, q[i - 1].admitted_at);
    for (int i = 0; i < N; i++) cr_assert_geq(q[i].done_at, 0, "request %d never finished", i);
    /* the long one ran as soon as one of the first two gave its 4 blocks back (4 + 8 = the pool's 12) */
    const int freed = q[0].done_at < q[1].done_at ? q[0].done_at : q[1].done_at;
    cr_assert_eq(q[2].admitted_at, freed + 1);
}

Test(sched_policy, admission_stops_when_slots_run_out)
{
    struct sched_policy_params p = params();
    p.n_slots = 2;
    enum { N = 3 };
    struct sim_req q[N];
    for (int i = 0; i < N; i++) {
        q[i] = (struct sim_req){.n_prompt = 8, .max_tokens = 3, .admitted_at = -1, .done_at = -1};
        q[i].need = sched_policy_kv_need(&p, 8, 3);
    }
    int run[4], n_run = 0, qhead = 0, reserved = 0;
    cr_assert_eq(sim_iteration(&p, q, N, &qhead, N, run, &n_run, &reserved, 0), 2);
    cr_assert_eq(q[2].admitted_at, -1);
    int step = 1;
    while (q[2].admitted_at < 0 && step < 10)
        sim_iteration(&p, q, N, &qhead, N, run, &n_run, &reserved, step++);
    /* prompt in step 0 (first token), two decode steps: done at step 2, the third admitted at step 3 */
    cr_assert_eq(q[0].done_at, 2);
    cr_assert_eq(q[2].admitted_at, 3);
}

/* Speculative decoding: one sequence drafts up to its maximum; many share the rows a step has left; a large
 * batch or a full step drafts nothing. */
Test(sched_policy, spec_drafts_shrink_with_the_batch_and_the_rows_left)
{
    cr_assert_eq(sched_policy_spec_len(8, 1, 500), 8);
    cr_assert_eq(sched_policy_spec_len(0, 1, 500), 0); /* off */
    cr_assert_eq(sched_policy_spec_len(8, 4, 500), SCHED_SPEC_ROWS / 4 < 8 ? SCHED_SPEC_ROWS / 4 : 8);
    cr_assert_eq(sched_policy_spec_len(8, 8, 500), SCHED_SPEC_ROWS / 8);
    cr_assert_eq(sched_policy_spec_len(8, SCHED_SPEC_MAX_SEQS + 1, 500), 0);
    cr_assert_eq(sched_policy_spec_len(8, 2, 6), 3); /* the prefill took the rest of the step */
    cr_assert_eq(sched_policy_spec_len(8, 3, 2), 0);
    cr_assert_eq(sched_policy_spec_len(8, 1, 0), 0);
    for (int n = 1; n <= SCHED_SPEC_MAX_SEQS; n++)
        for (int left = 0; left < 80; left++) {
            const int k = sched_policy_spec_len(8, n, left);
            cr_assert(k >= 0 && k <= 8 && n * k <= left && n * k <= SCHED_SPEC_ROWS, "n %d left %d: %d", n,
                      left, k);
        }
}

/* The draft length follows what rows cost and how often drafts are accepted: free rows take every draft;
 * rows as dear as the first take none unless drafts are nearly always right; a cost curve between picks the
 * length that maximises expected tokens per second, checked against every length by brute force. */
Test(sched_policy, spec_pick_weighs_acceptance_against_the_cost_of_rows)
{
    struct sched_spec_cost c = {0};
    double a1[1] = {0.6};
    cr_assert_eq(sched_policy_spec_pick(&c, 1, a1, 1, 8), 8); /* nothing measured: try the most */
    sched_spec_cost_note(&c, 1, 1.0);
    cr_assert_eq(sched_policy_spec_pick(&c, 1, a1, 1, 8), 8); /* longer steps not measured: tried */
    for (int r = 1; r <= 9; r++) c.t[r] = 1.0;                /* rows free: every draft */
    cr_assert_eq(sched_policy_spec_pick(&c, 1, a1, 1, 8), 8);
    for (int r = 1; r <= 9; r++) c.t[r] = r; /* each row as dear as the first */
    cr_assert_eq(sched_policy_spec_pick(&c, 1, a1, 1, 8), 0);
    double sure[1] = {1.0};
    cr_assert_eq(sched_policy_spec_pick(&c, 1, sure, 1, 8), 0); /* a tie: the shorter */
    /* 1 + 0.4 per extra row (the CPU backend measured about so): brute force over k */
    for (int r = 1; r <= SCHED_SPEC_COST_ROWS; r++) c.t[r] = 1 + 0.4 * (r - 1);
    for (int n = 1; n <= 4; n++)
        for (double a = 0.0; a <= 1.0; a += 0.05) {
            double al[4] = {a, a * 0.9, a, a * 0.5};
            const int k = sched_policy_spec_pick(&c, n, al, n, 8);
            double best = -1;
            int want = -1;
            for (int kk = 0; kk <= 8; kk++) {
                double tok = 0;
                for (int i = 0; i < n; i++)
                    for (int j = 0; j <= kk; j++) tok += pow(al[i], j);
                const double rate = tok / c.t[n + n * kk];
                if (rate > best * (1 + 1e-9)) best = rate, want = kk;
            }
            cr_assert_eq(k, want, "n %d alpha %.2f: %d, want %d", n, a, k, want);
        }
    c.t[3] = 0.5; /* a noisy fast measurement is believed */
    cr_assert_eq(sched_policy_spec_pick(&c, 1, a1, 1, 8), 2);
    /* past the table: k_max */
    cr_assert_eq(sched_policy_spec_pick(&c, SCHED_SPEC_COST_ROWS - 2, a1, 1, 8), 8);
    /* a drafter's time counts: rows free, drafts each as dear as a step of the model never pay (a tie at
     * best); at a quarter of a step 3 pay most at 0.8 (by hand: 2.95 / 1.75 tokens a step's time); nearly
     * free drafts (a small draft model on a GPU) take every draft */
    for (int r = 1; r <= SCHED_SPEC_COST_ROWS; r++) c.t[r] = 1.0;
    double hi[1] = {0.8}, best[1] = {1.0};
    sched_spec_cost_draft_note(&c, 8, 8.0);
    cr_assert_float_eq(c.draft, 1.0, 1e-12);
    cr_assert_eq(sched_policy_spec_pick(&c, 1, hi, 1, 8), 0);
    cr_assert_eq(sched_policy_spec_pick(&c, 1, best, 1, 8), 0);
    c.draft = 0.25;
    cr_assert_eq(sched_policy_spec_pick(&c, 1, hi, 1, 8), 3);
    c.draft = 0.02;
    cr_assert_eq(sched_policy_spec_pick(&c, 1, hi, 1, 8), 8);
    sched_spec_cost_draft_note(&c, 0, 1.0); /* nothing drafted: no change */
    cr_assert_float_eq(c.draft, 0.02, 1e-12);
}

Test(sched_policy, spec_accept_rate_tracks_recent_steps)
{
    struct sched_spec_accept a = sched_spec_accept_new(SCHED_SPEC_NGRAM);
    cr_assert_float_eq(sched_spec_accept_rate(&a), a.alpha0, 1e-12);
    for (int i = 0; i < 40; i++) sched_spec_accept_note(&a, 4, 1); /* one accepted, then a rejection */
    cr_assert_float_eq(sched_spec_accept_rate(&a), 0.5, 0.03);
    for (int i = 0; i < 40; i++) sched_spec_accept_note(&a, 4, 4); /* all accepted: no rejection seen */
    cr_assert(sched_spec_accept_rate(&a) > 0.95);
    for (int i = 0; i < 40; i++) sched_spec_accept_note(&a, 6, 0);
    cr_assert(sched_spec_accept_rate(&a) < 0.2, "%f", sched_spec_accept_rate(&a)); /* the prior stays */
    /* a draft model and an MTP block start more trusted than prompt lookup */
    const struct sched_spec_accept m = sched_spec_accept_new(SCHED_SPEC_MODEL),
                                   t = sched_spec_accept_new(SCHED_SPEC_MTP),
                                   g = sched_spec_accept_new(SCHED_SPEC_NGRAM);
    cr_assert(sched_spec_accept_rate(&m) > sched_spec_accept_rate(&g));
    cr_assert(sched_spec_accept_rate(&t) > sched_spec_accept_rate(&g));
}

/* One speculating sequence over `n` steps as the server runs it: a step drafts when the back-off allows, as
 * many as sched_policy_spec_pick says for its estimate on rows costing 1 + 0.4 per extra row (the CPU
 * backend measured about so), and accept(step, k) of them are accepted. k_out[step]: the drafts (0: none). */
static void spec_simulate(enum sched_spec_kind kind, int (*accept)(int step, int k), int n, int *k_out)
{
    struct sched_spec_cost c = {0};
    for (int r = 1; r <= SCHED_SPEC_COST_ROWS; r++) c.t[r] = 1 + 0.4 * (r - 1);
    struct sched_spec_accept a = sched_spec_accept_new(kind);
    for (int i = 0; i < n; i++) {
        const double alpha = sched_spec_accept_rate(&a);
        const int k = sched_spec_accept_may_draft(&a) ? sched_policy_spec_pick(&c, 1, &alpha, 1, 8) : 0;
        const int acc = k > 0 ? accept(i, k) : 0;
        cr_assert(acc >= 0 && acc <= k);
        sched_spec_accept_note(&a, k, acc);
        k_out[i] = k;
    }
}

static int accept_after_two_misses(int step, int k)
{
    return step < 2 ? 0 : k; /* the first two verifications rejected, then every draft right */
}

static int accept_none(int step, int k)
{
    (void)step, (void)k;
    return 0;
}

static int accept_phases(int step, int k) /* 100 steps of nothing, 100 of everything, again and again */
{
    return step / 100 % 2 ? k : 0;
}

static int accept_eighty(int step, int k) /* each draft right with chance 0.8 (a fixed pseudo-random walk) */
{
    int m = 0;
    while (m < k && (unsigned)(step * 2654435761u + (unsigned)m * 40503u) % 1000u < 800u) m++;
    return m;
}

/* Two rejected verifications at the start prove nothing: the sequence keeps drafting, and with every draft
 * right from then on it reaches the longest draft within a few steps. */
Test(sched_policy, spec_adapt_survives_early_rejections)
{
    const enum sched_spec_kind kinds[] = {SCHED_SPEC_NGRAM, SCHED_SPEC_MODEL, SCHED_SPEC_MTP};
    for (int t = 0; t < 3; t++) {
        int k[64];
        spec_simulate(kinds[t], accept_after_two_misses, 64, k);
        for (int i = 0; i < 64; i++) cr_assert(k[i] > 0, "kind %d step %d: no drafts", t, i);
        int first8 = -1;
        for (int i = 0; i < 64 && first8 < 0; i++) first8 = k[i] == 8 ? i : -1;
        cr_assert(first8 >= 0 && first8 <= 20, "kind %d: the longest draft first at step %d", t, first8);
        for (int i = first8; i < 64; i++) cr_assert_eq(k[i], 8, "kind %d step %d: %d", t, i, k[i]);
    }
    /* at about 0.8 a draft, near the length that pays most on these rows (brute force: 2) */
    int k[200], good = 0, none = 0;
    spec_simulate(SCHED_SPEC_MODEL, accept_eighty, 200, k);
    for (int i = 20; i < 200; i++) good += k[i] >= 2 && k[i] <= 4, none += k[i] == 0;
    cr_assert(good >= 150 && none == 0, "long drafts on %d of 180 steps, none on %d", good, none);
}

/* Drafts that are never accepted: after SCHED_SPEC_GRACE rejected steps the sequence backs off, so that it
 * drafts on few steps (probing at least once every SCHED_SPEC_WAIT_MAX + 12 steps). */
Test(sched_policy, spec_adapt_backs_off_when_nothing_is_accepted)
{
    const enum sched_spec_kind kinds[] = {SCHED_SPEC_NGRAM, SCHED_SPEC_MODEL, SCHED_SPEC_MTP};
    for (int t = 0; t < 3; t++) {
        int k[400], drafting = 0, last = -1, longest_gap = 0;
        spec_simulate(kinds[t], accept_none, 400, k);
        for (int g = 0; g < SCHED_SPEC_GRACE; g++) cr_assert(k[g] > 0);
        cr_assert_eq(k[SCHED_SPEC_GRACE], 0, "kind %d: no back-off after %d rejected steps", t,
                     SCHED_SPEC_GRACE);
        for (int i = 0; i < 400; i++)
            if (k[i] > 0) {
                drafting++;
                if (i - last > longest_gap) longest_gap = i - last;
                last = i;
            }
        cr_assert(drafting <= 400 / 8, "kind %d: drafted on %d of 400 steps", t, drafting);
        cr_assert(longest_gap <= SCHED_SPEC_WAIT_MAX + 12, "kind %d: %d steps without a probe", t,
                  longest_gap);
    }
}

/* Phases of no acceptance and of full acceptance: each full phase is found within a bounded number of steps
 * (the back-off's longest wait and the estimate's fade) and reaches the longest draft; each empty phase backs
 * off again. */
Test(sched_policy, spec_adapt_recovers_when_acceptance_returns)
{
    int k[800];
    spec_simulate(SCHED_SPEC_NGRAM, accept_phases, 800, k);
    for (int p = 100; p < 800; p += 200) {
        int found = -1, at8 = -1;
        for (int i = p; i < p + 100 && at8 < 0; i++) {
            if (found < 0 && k[i] > 0) found = i - p;
            if (k[i] == 8) at8 = i - p;
        }
        cr_assert(found >= 0 && found <= SCHED_SPEC_WAIT_MAX + 12, "phase at %d: drafts after %d steps", p,
                  found);
        cr_assert(at8 >= 0 && at8 <= found + 12, "phase at %d: the longest draft after %d steps", p, at8);
        int drafting = 0; /* the empty phase after it */
        for (int i = p + 100; i < p + 200 && i < 800; i++) drafting += k[i] > 0;
        cr_assert(drafting <= 100 / 5, "empty phase at %d: drafted on %d steps", p + 100, drafting);
    }
}
