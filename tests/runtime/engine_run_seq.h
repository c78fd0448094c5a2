/* engine_run_seq.h — for the tests that hold one engine against another (test_gpu_e2e,
 * test_gpu_expert_cache): one sequence in slot 0, its prompt then greedy or forced decode steps, every step's
 * logits kept. Criterion test files only (the steps are asserted). */
#ifndef FERRY_TESTS_ENGINE_RUN_SEQ_H
#define FERRY_TESTS_ENGINE_RUN_SEQ_H

#include <criterion/criterion.h>
#include <stdint.h>

#include "runtime/batch.h"
#include "runtime/engine.h"

/* Prefill n (at most 256) prompt tokens into slot 0, then `steps` greedy steps; logits of every step go to
 * out
 * ((steps+1), V); tokens chosen go to toks (steps). Greedy choices follow the *given* forced tokens when
 * forced is not NULL, so that two engines can be compared on the same sequence. Frees the slot. */
static void run_seq(struct engine *e, const int32_t *prompt, int n, int steps, const int32_t *forced,
                    float *out, int32_t *toks)
{
    const int V = engine_hparams(e)->n_vocab;
    int32_t pos[256], seq[256];
    uint8_t want[256];
    cr_assert(n >= 1 && n <= 256, "run_seq: %d prompt tokens", n);
    for (int i = 0; i < n; i++) pos[i] = i, seq[i] = 0, want[i] = i == n - 1;
    struct batch b = {
        .n_tokens = n, .tokens = (int32_t *)prompt, .pos = pos, .seq = seq, .want_logits = want};
    cr_assert_eq(engine_step(e, &b, out), 0);
    for (int s = 0; s < steps; s++) {
        const float *lg = out + (size_t)s * V;
        int32_t best = 0;
        for (int v = 1; v < V; v++)
            if (lg[v] > lg[best]) best = v;
        toks[s] = best;
        int32_t t = forced ? forced[s] : best, p = n + s, q = 0;
        uint8_t w = 1;
        struct batch d = {.n_tokens = 1, .tokens = &t, .pos = &p, .seq = &q, .want_logits = &w};
        cr_assert_eq(engine_step(e, &d, out + (size_t)(s + 1) * V), 0);
    }
    engine_seq_free(e, 0);
}

#endif
