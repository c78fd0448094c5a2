/* test_sampler — the sampler's controls on hand-made logits with known answers. */
#include <criterion/criterion.h>
#include <math.h>
#include <string.h>

#include "kernels/core/sample_math.h"
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

/* top-k on a large vocabulary with many ties: every draw is one of the k best (value descending, id
 * ascending), and all k are drawn. Exercises the quickselect that replaces a full sort. */
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

/* The draw is counter-based: the k-th draw of a sampler depends on (seed, k) and that row only, not on
 * what earlier draws saw; sampler_step() counts the draws, greedy ones included. */
Test(sampler, draw_depends_only_on_seed_and_step)
{
    struct sampler_params p = sampler_default_params();
    for (uint64_t seed = 1; seed <= 50; seed++) {
        p.seed = seed;
        struct sampler *a = make(p, 64), *b = make(p, 64);
        float la[64], lb[64], lc[64], ld[64];
        for (int v = 0; v < 64; v++) {
            la[v] = (float)((v * 37) % 11) * 0.3f;
            lb[v] = (float)((v * 13) % 7) * 0.5f;
            lc[v] = lb[v];
            ld[v] = (float)(v % 5) * 0.2f;
        }
        (void)sampler_sample(a, la);
        (void)sampler_sample(b, ld);
        cr_assert_eq(sampler_step(a), 1);
        cr_assert_eq(sampler_sample(a, lb), sampler_sample(b, lc), "seed %llu", (unsigned long long)seed);
        cr_assert_eq(sampler_step(b), 2);
        sampler_free(a);
        sampler_free(b);
    }
}

/* The definition of a draw, checked from outside: u = smath_uniform(seed, step), and the chosen token is the
 * first by id whose cumulative probability exceeds u (seeds whose u lies within 1e-6 of a boundary are
 * skipped: the sampler's integer masses round probabilities at 2^-44). */
Test(sampler, plain_draw_walks_ids_in_order)
{
    struct sampler_params p = sampler_default_params();
    const double prob[4] = {0.1, 0.4, 0.2, 0.3};
    int checked = 0;
    for (uint64_t seed = 0; seed < 200; seed++) {
        p.seed = seed;
        struct sampler *s = make(p, 4);
        for (uint64_t step = 0; step < 5; step++) {
            float l[4];
            for (int v = 0; v < 4; v++) l[v] = logf((float)prob[v]);
            const double u = smath_uniform(seed, step);
            double cum = 0, margin = 1;
            int want = 3;
            for (int v = 0; v < 4; v++) {
                cum += prob[v];
                if (fabs(u - cum) < margin) margin = fabs(u - cum);
                if (u < cum) {
                    want = v;
                    break;
                }
            }
            const int32_t got = sampler_sample(s, l);
            if (margin < 1e-6) continue;
            cr_assert_eq(got, want, "seed %llu step %llu u %.9f", (unsigned long long)seed,
                         (unsigned long long)step, u);
            checked++;
        }
        sampler_free(s);
    }
    cr_assert_gt(checked, 900);
}

/* top-p keeps the prefix (best first, lower id first among equal logits) up to the first token whose
 * cumulative mass reaches top_p of the total: here 1 + 0.5 + 0.5 >= 0.7 * 2.5, so of the three tied tokens
 * 3, 5, 7 only 3 and 5 are kept. */
Test(sampler, top_p_splits_ties_by_id)
{
    struct sampler_params p = sampler_default_params();
    p.top_p = 0.7f;
    p.seed = 11;
    struct sampler *s = make(p, 9);
    int seen[9] = {0};
    for (int r = 0; r < 6000; r++) {
        float l[9];
        for (int v = 0; v < 9; v++) l[v] = -40.0f;
        l[0] = 0.0f;
        l[3] = l[5] = l[7] = logf(0.5f);
        seen[sampler_sample(s, l)]++;
    }
    cr_assert_eq(seen[7], 0);
    cr_assert(seen[0] > 0 && seen[3] > 0 && seen[5] > 0);
    cr_assert_eq(seen[0] + seen[3] + seen[5], 6000);
    sampler_free(s);
}

Test(sampler, history_lists_distinct_tokens_with_counts)
{
    struct sampler_params p = sampler_default_params();
    struct sampler *s = make(p, 10);
    const int32_t acc[] = {4, 2, 4, 9, 4, 2, -1, 10};
    for (int i = 0; i < 8; i++) sampler_accept(s, acc[i]);
    int32_t tok[8];
    uint32_t cnt[8];
    cr_assert_eq(sampler_history(s, tok, cnt, 8), 3);
    cr_assert(tok[0] == 4 && cnt[0] == 3 && tok[1] == 2 && cnt[1] == 2 && tok[2] == 9 && cnt[2] == 1);
    cr_assert_eq(sampler_history(s, tok, cnt, 1), 3);
    cr_assert_eq(sampler_get_params(s)->top_p, 1.0f);
    sampler_free(s);
}

/* The shared arithmetic: the exponential is within 3e-7 of exp() on [-30, 0], every candidate has a mass of
 * at least 1, the order key sorts like the floats (-0 and +0 alike) and converts back to an equal float. */
Test(sampler, sample_math_exp_mass_and_key)
{
    double worst = 0;
    for (int i = 0; i <= 300000; i++) {
        const float d = -30.0f * (float)i / 300000.0f;
        const double e = exp((double)d), g = smath_exp(d);
        if (fabs(g - e) / e > worst) worst = fabs(g - e) / e;
    }
    cr_assert_lt(worst, 3e-7, "worst relative error %g", worst);
    cr_assert_eq(smath_exp(0.0f), 1.0f);
    cr_assert_geq(smath_mass(-SMATH_TAIL), 1);
    cr_assert_eq(smath_mass(0.0f), 1ull << 44);
    const float vals[] = {-INFINITY, -3e38f, -1.5f, -1e-30f, -0.0f, 0.0f, 1e-30f, 2.0f, 3e38f, INFINITY};
    cr_assert_eq(smath_key(-0.0f), smath_key(0.0f)); /* equal floats, equal keys: ties break by id alike */
    for (int i = 0; i < 10; i++) {
        cr_assert(smath_key_value(smath_key(vals[i])) == vals[i]);
        for (int j = i + 1; j < 10; j++)
            if (vals[i] < vals[j])
                cr_assert_lt(smath_key(vals[i]), smath_key(vals[j]), "%g vs %g", vals[i], vals[j]);
    }
}

/* A draw made elsewhere (the GPU sampler) is recorded with sampler_advance: the next draw is the one a sampler
 * that drew itself would make. */
Test(sampler, advance_skips_a_draw)
{
    struct sampler_params p = sampler_default_params();
    p.seed = 5;
    struct sampler *a = make(p, 16), *b = make(p, 16);
    for (int r = 0; r < 100; r++) {
        float la[16], lb[16];
        for (int v = 0; v < 16; v++) la[v] = lb[v] = (float)((v * 7 + r) % 9) * 0.4f;
        if (r % 2) {
            float scratch[16];
            memcpy(scratch, la, sizeof scratch);
            (void)sampler_sample(a, scratch);
            sampler_advance(b);
            continue;
        }
        cr_assert_eq(sampler_sample(a, la), sampler_sample(b, lb), "draw %d", r);
    }
    cr_assert_eq(sampler_step(a), 100);
    cr_assert_eq(sampler_step(b), 100);
    sampler_free(a);
    sampler_free(b);
}
