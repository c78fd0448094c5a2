/* test_sampler — the sampler's controls on hand-made logits with known answers. */
#include <criterion/criterion.h>
#include <math.h>
#include <string.h>

#include "runtime/sampler.h"

static struct sampler *make(struct sampler_params p, int n)
{
    struct sampler *s = NULL;
    cr_assert_eq(sampler_init(&s, &p, n), 0);
    return s;
}

Test(sampler, greedy_is_argmax_lowest_id_on_ties)
{
    struct sampler_params p = sampler_default_params();
    p.temperature = 0;
    struct sampler *s = make(p, 5);
    float l[5] = {0.1f, 2.0f, -1.0f, 2.0f, 1.9f};
    cr_assert_eq(sampler_sample(s, l), 1);
    sampler_free(s);
}

Test(sampler, frequencies_follow_softmax)
{
    struct sampler_params p = sampler_default_params();
    p.seed = 42;
    struct sampler *s = make(p, 3);
    int counts[3] = {0};
    const int N = 200000;
    for (int i = 0; i < N; i++) {
        float l[3] = {logf(0.5f), logf(0.3f), logf(0.2f)};
        counts[sampler_sample(s, l)]++;
    }
    cr_expect_float_eq(counts[0] / (double)N, 0.5, 0.01);
    cr_expect_float_eq(counts[1] / (double)N, 0.3, 0.01);
    cr_expect_float_eq(counts[2] / (double)N, 0.2, 0.01);
    sampler_free(s);
}

Test(sampler, top_p_top_k_min_p_cut_the_tail)
{
    struct sampler_params p = sampler_default_params();
    p.seed = 1;
    p.top_p = 0.75f; /* 0.5 + 0.3 reaches 0.75: token 2 is never drawn */
    struct sampler *s = make(p, 3);
    for (int i = 0; i < 20000; i++) {
        float l[3] = {logf(0.5f), logf(0.3f), logf(0.2f)};
        cr_assert_neq(sampler_sample(s, l), 2);
    }
    sampler_free(s);
    p = sampler_default_params();
    p.top_k = 1;
    s = make(p, 3);
    for (int i = 0; i < 1000; i++) {
        float l[3] = {0.0f, 0.5f, 0.4f};
        cr_assert_eq(sampler_sample(s, l), 1);
    }
    sampler_free(s);
    p = sampler_default_params();
    p.min_p = 0.5f; /* keeps tokens with p >= 0.25 */
    s = make(p, 3);
    for (int i = 0; i < 20000; i++) {
        float l[3] = {logf(0.5f), logf(0.3f), logf(0.2f)};
        cr_assert_neq(sampler_sample(s, l), 2);
    }
    sampler_free(s);
}

Test(sampler, same_seed_same_tokens_other_seed_differs)
{
    struct sampler_params p = sampler_default_params();
    int seq[2][64];
    for (int run = 0; run < 2; run++) {
        p.seed = 1234;
        struct sampler *s = make(p, 100);
        for (int i = 0; i < 64; i++) {
            float l[100];
            for (int v = 0; v < 100; v++) l[v] = (float)((v * 7919) % 13) * 0.1f;
            seq[run][i] = sampler_sample(s, l);
        }
        sampler_free(s);
    }
    cr_assert_arr_eq(seq[0], seq[1], sizeof seq[0]);
    p.seed = 99;
    struct sampler *s = make(p, 100);
    int differs = 0;
    for (int i = 0; i < 64; i++) {
        float l[100];
        for (int v = 0; v < 100; v++) l[v] = (float)((v * 7919) % 13) * 0.1f;
        differs |= sampler_sample(s, l) != seq[0][i];
    }
    cr_assert(differs);
    sampler_free(s);
}

Test(sampler, penalties_and_bias)
{
    struct sampler_params p = sampler_default_params();
    p.temperature = 0;
    p.presence_penalty = 1.0f;
    p.frequency_penalty = 0.5f;
    struct sampler *s = make(p, 3);
    sampler_accept(s, 0);
    sampler_accept(s, 0);
    float l[3] = {2.5f, 1.0f, 0.0f}; /* 2.5 - 1 - 2*0.5 = 0.5 < 1.0 */
    cr_assert_eq(sampler_sample(s, l), 1);
    cr_assert_float_eq(l[0], 0.5f, 1e-6);
    sampler_free(s);
    p = sampler_default_params();
    p.temperature = 0;
    p.repetition_penalty = 2.0f;
    s = make(p, 3);
    sampler_accept(s, 0);
    sampler_accept(s, 2);
    float l2[3] = {3.0f, 1.6f, -1.0f}; /* 3/2 = 1.5 < 1.6; -1*2 = -2 */
    cr_assert_eq(sampler_sample(s, l2), 1);
    cr_assert_float_eq(l2[2], -2.0f, 1e-6);
    sampler_free(s);
    struct logit_bias lb[1] = {{2, 100.0f}};
    p = sampler_default_params();
    p.temperature = 0;
    p.logit_bias = lb;
    p.n_logit_bias = 1;
    s = make(p, 3);
    float l3[3] = {3.0f, 1.0f, 0.0f};
    cr_assert_eq(sampler_sample(s, l3), 2);
    sampler_free(s);
}

Test(sampler, logprobs_are_log_softmax)
{
    float l[4] = {1.0f, 2.0f, 3.0f, 0.5f};
    int32_t ids[3];
    float lp[3];
    float z = logf(expf(1) + expf(2) + expf(3) + expf(0.5f));
    float got = sampler_logprob(l, 4, 1, 3, ids, lp);
    cr_assert_float_eq(got, 2.0f - z, 1e-5);
    cr_assert_eq(ids[0], 2);
    cr_assert_eq(ids[1], 1);
    cr_assert_eq(ids[2], 0);
    cr_assert_float_eq(lp[0], 3.0f - z, 1e-5);
}

Test(sampler, invalid_params_refused)
{
    struct sampler *s = NULL;
    struct sampler_params p = sampler_default_params();
    p.top_p = 0;
    cr_assert_neq(sampler_init(&s, &p, 10), 0);
    p = sampler_default_params();
    p.temperature = NAN;
    cr_assert_neq(sampler_init(&s, &p, 10), 0);
    p = sampler_default_params();
    cr_assert_neq(sampler_init(&s, &p, 0), 0);
}

/* top-k on a large vocabulary with many ties: every draw is one of the k best (value descending, id ascending),
 * and all k are drawn. Exercises the quickselect that replaces a full sort. */
Test(sampler, top_k_selects_exactly_the_k_best)
{
    enum { V = 5000, K = 7 };
    struct sampler_params p = sampler_default_params();
    p.top_k = K;
    p.seed = 3;
    struct sampler *s = make(p, V);
    float base[V];
    unsigned x = 12345;
    for (int v = 0; v < V; v++) {
        x = x * 1103515245u + 12345u;
        base[v] = (float)((x >> 16) % 50) * 0.1f; /* 50 distinct values: ties everywhere */
    }
    /* The reference top-K: stable by id among equal values. */
    int top[K], n_top = 0;
    for (float val = 4.9f; n_top < K; val -= 0.1f)
        for (int v = 0; v < V && n_top < K; v++)
            if (fabsf(base[v] - val) < 1e-4f) top[n_top++] = v;
    int seen[K] = {0};
    for (int r = 0; r < 4000; r++) {
        float l[V];
        memcpy(l, base, sizeof l);
        int32_t t = sampler_sample(s, l);
        int found = -1;
        for (int k = 0; k < K; k++)
            if (top[k] == t) found = k;
        cr_assert_geq(found, 0, "draw %d picked %d, not among the top %d", r, t, K);
        seen[found]++;
    }
    for (int k = 0; k < K; k++) cr_expect_gt(seen[k], 0, "top token %d never drawn", top[k]);
    sampler_free(s);
}
