/* test_spec — speculative decoding (runtime/spec.h): prompt lookup finds the continuations it should, and a
 * generation verified k+1 rows at a time emits exactly the tokens of plain decoding, greedy and sampled,
 * whatever the drafter proposes (its own next tokens, wrong tokens, prompt lookup), with the KV cache cut
 * back after each step. Uses stories260K (../shared/testdata), a real trained model, on the CPU engine. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/core/status.h"
#include "runtime/engine.h"
#include "runtime/sampler.h"
#include "runtime/spec.h"

/* ---- prompt lookup ------------------------------------------------------------------------------------ */

Test(spec_ngram, finds_latest_longest_match)
{
    int32_t out[8];
    /* "5 6 7" occurs at 1 and 7; the suffix "6 7" (n=2) matches both; the latest (7) wins: proposes 9 1. */
    const int32_t h[] = {4, 5, 6, 7, 8, 0, 3, 5, 6, 7, 9, 1, 2, 5, 6, 7};
    int n = spec_ngram_draft(h, 16, 1, 3, 4, out);
    cr_assert_eq(n, 4);
    cr_assert_eq(out[0], 9);
    cr_assert_eq(out[1], 1);
    cr_assert_eq(out[2], 2);
    cr_assert_eq(out[3], 5);
    /* k bounds the proposal; the continuation may run into the suffix itself. */
    cr_assert_eq(spec_ngram_draft(h, 16, 1, 3, 2, out), 2);
    /* A longer match beats a later shorter one: suffix "1 2" occurs once, "2" twice. */
    const int32_t g[] = {1, 2, 3, 9, 2, 4, 1, 2};
    cr_assert_eq(spec_ngram_draft(g, 8, 1, 2, 3, out), 3);
    cr_assert_eq(out[0], 3);
    cr_assert_eq(out[1], 9);
    cr_assert_eq(out[2], 2);
    /* With n_min 2 the single-token match of "2" alone does not count. */
    const int32_t q[] = {7, 2, 5, 3, 2};
    cr_assert_eq(spec_ngram_draft(q, 5, 2, 3, 3, out), 0);
    cr_assert_eq(spec_ngram_draft(q, 5, 1, 3, 3, out), 3);
    cr_assert_eq(out[0], 5);
    /* Nothing to match. */
    const int32_t u[] = {1, 2, 3, 4};
    cr_assert_eq(spec_ngram_draft(u, 4, 1, 3, 3, out), 0);
    cr_assert_eq(spec_ngram_draft(u, 1, 1, 3, 3, out), 0);
    /* A run of one token proposes more of it. */
    const int32_t r[] = {8, 8, 8, 8};
    cr_assert_eq(spec_ngram_draft(r, 4, 1, 2, 5, out), 2);
    cr_assert_eq(out[0], 8);
    cr_assert_eq(out[1], 8);
}

/* ---- generation ---------------------------------------------------------------------------------------- */

enum { N_GEN = 80, CTX = 256 };

static struct model_file *mf;
static struct engine *eng;
static int n_vocab;

static void open_model(void)
{
    const char *td = getenv("FERRY_TESTDATA");
    char path[1024], err[256] = "";
    snprintf(path, sizeof path, "%s/models/stories260K.gguf", td ? td : "../shared/testdata");
    FILE *f = fopen(path, "rb");
    if (!f) cr_skip_test("missing %s (the stories260K model of ../shared/testdata)", path);
    fclose(f);
    cr_assert_eq(model_file_open(path, &mf, NULL, NULL, err), 0, "%s", err);
    struct engine_params p = engine_default_params();
    p.backend = ENGINE_BACKEND_CPU;
    p.n_seqs = 1;
    p.ctx_size = CTX;
    p.n_threads = 2;
    p.max_batch_tokens = 64;
    cr_assert_eq(engine_init(&eng, mf, &p, err), 0, "%s", err);
    n_vocab = engine_hparams(eng)->n_vocab;
}

static void close_model(void)
{
    engine_free(eng);
    model_file_close(mf);
}

static const int32_t prompt[] = {1, 403, 407, 261, 378, 397, 261, 378, 356, 412};
enum { N_PROMPT = sizeof prompt / sizeof prompt[0] };

static int32_t draw_row(void *ctx, float *row)
{
    return sampler_sample(ctx, row);
}

static struct sampler *new_sampler(float temperature)
{
    struct sampler_params sp = sampler_default_params();
    sp.temperature = temperature;
    sp.top_k = 0;
    sp.top_p = 1.0f;
    sp.min_p = 0.0f;
    sp.seed = 1234;
    struct sampler *s = NULL;
    cr_assert_eq(sampler_init(&s, &sp, n_vocab), 0);
    return s;
}

/* The prompt in one step; returns the first generated token. */
static int32_t prefill(struct sampler *s, float *logits)
{
    engine_seq_free(eng, 0);
    int32_t tok[N_PROMPT], pos[N_PROMPT], seq[N_PROMPT];
    uint8_t want[N_PROMPT];
    for (int i = 0; i < N_PROMPT; i++)
        tok[i] = prompt[i], pos[i] = i, seq[i] = 0, want[i] = i == N_PROMPT - 1;
    struct batch b = {.n_tokens = N_PROMPT, .tokens = tok, .pos = pos, .seq = seq, .want_logits = want};
    cr_assert_eq(engine_step(eng, &b, logits), 0);
    return sampler_sample(s, logits);
}

static void plain(float temperature, int32_t *out)
{
    float *logits = malloc((size_t)n_vocab * sizeof *logits);
    struct sampler *s = new_sampler(temperature);
    out[0] = prefill(s, logits);
    for (int i = 1; i < N_GEN; i++) {
        cr_assert_eq(spec_step(eng, 0, out[i - 1], N_PROMPT + i - 1, NULL, 0, logits), 0);
        out[i] = sampler_sample(s, logits);
    }
    sampler_free(s);
    free(logits);
}

enum drafter { DRAFT_ORACLE, DRAFT_WRONG, DRAFT_NGRAM, DRAFT_MIXED };

/* Generates N_GEN tokens verifying k drafts a step; returns the verification steps taken. */
static int speculative(float temperature, enum drafter d, int k, const int32_t *truth, int32_t *out,
                       int *accepted)
{
    float *logits = malloc((size_t)(SPEC_MAX_DRAFT + 1) * n_vocab * sizeof *logits);
    int32_t hist[N_PROMPT + N_GEN + SPEC_MAX_DRAFT + 1];
    memcpy(hist, prompt, sizeof prompt);
    struct sampler *s = new_sampler(temperature);
    int n = 0, steps = 0;
    out[n++] = prefill(s, logits);
    *accepted = 0;
    unsigned rng = 12345;
    while (n < N_GEN) {
        int32_t draft[SPEC_MAX_DRAFT];
        int kk = k < N_GEN - n - 1 ? k : N_GEN - n - 1, nd = 0;
        memcpy(hist + N_PROMPT, out, (size_t)n * sizeof *out);
        switch (d) {
        case DRAFT_ORACLE:
            nd = kk;
            memcpy(draft, truth + n, (size_t)nd * sizeof *draft);
            break;
        case DRAFT_WRONG:
            nd = kk;
            for (int i = 0; i < nd; i++) draft[i] = (truth[n + i] + 1) % n_vocab;
            break;
        case DRAFT_NGRAM:
            nd = spec_ngram_draft(hist, N_PROMPT + n, 1, 3, kk, draft);
            break;
        case DRAFT_MIXED: /* right for a random number of tokens, then wrong */
            nd = kk;
            rng = rng * 1103515245u + 12345u;
            int good = (int)((rng >> 16) % (unsigned)(kk + 1));
            for (int i = 0; i < nd; i++) draft[i] = i < good ? truth[n + i] : (truth[n + i] + 7) % n_vocab;
            break;
        }
        int pos = N_PROMPT + n - 1; /* the pending token's position */
        cr_assert_eq(engine_seq_len(eng, 0), pos);
        cr_assert_eq(spec_step(eng, 0, out[n - 1], pos, draft, nd, logits), 0);
        steps++;
        int32_t drawn[SPEC_MAX_DRAFT + 1];
        int ended = 0;
        int m = spec_walk(logits, n_vocab, draft, nd, draw_row, s, drawn, &ended);
        cr_assert(!ended);
        cr_assert(m >= 1 && m <= nd + 1);
        *accepted += m - 1;
        for (int i = 0; i < m; i++) out[n++] = drawn[i];
        /* Keep the pending token and the accepted drafts; the rejected rows' positions go. */
        cr_assert_eq(engine_seq_keep(eng, 0, pos + m), pos + m);
    }
    sampler_free(s);
    free(logits);
    return steps;
}

static void check_same(const int32_t *a, const int32_t *b, const char *what)
{
    for (int i = 0; i < N_GEN; i++)
        cr_assert_eq(a[i], b[i], "%s: token %d differs (%d vs %d)", what, i, a[i], b[i]);
}

static void identity(float temperature)
{
    open_model();
    int32_t truth[N_GEN], got[N_GEN];
    plain(temperature, truth);
    int acc;
    /* The target's own tokens: everything is accepted, so a step emits k + 1 tokens. */
    int steps = speculative(temperature, DRAFT_ORACLE, 4, truth, got, &acc);
    check_same(truth, got, "oracle");
    cr_assert_eq(steps, (N_GEN - 1 + 4) / 5, "oracle drafts: %d steps", steps);
    cr_assert_eq(acc, N_GEN - 1 - steps);
    /* Every draft wrong: one token a step, the rejected rows dropped each time. */
    steps = speculative(temperature, DRAFT_WRONG, 5, truth, got, &acc);
    check_same(truth, got, "wrong drafts");
    cr_assert_eq(acc, 0);
    cr_assert_eq(steps, N_GEN - 1);
    /* Right for a while, then wrong: the KV cache is cut back at every length. */
    speculative(temperature, DRAFT_MIXED, 7, truth, got, &acc);
    check_same(truth, got, "mixed drafts");
    speculative(temperature, DRAFT_NGRAM, 6, truth, got, &acc);
    check_same(truth, got, "prompt lookup");
    close_model();
}

Test(spec, greedy_identity)
{
    identity(0.0f);
}
Test(spec, sampled_identity)
{
    identity(0.9f);
}
