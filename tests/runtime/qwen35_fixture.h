/* qwen35_fixture — what the tests of the Qwen3.5 family's golden models share (test_qwen35.c,
 * test_dn_checkpoints.c): a golden model and its references opened on the CPU engine, prompts fed in steps,
 * logits held to a reference. Static functions: each test program includes it once.
 */
#ifndef FERRY_TESTS_QWEN35_FIXTURE_H
#define FERRY_TESTS_QWEN35_FIXTURE_H

#include <criterion/criterion.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/core/status.h"
#include "runtime/engine.h"

#define QWEN35_FIXTURE_MAX_TOK 512

/* $FERRY_SRC/rel, malloc'd. */
__attribute__((unused)) static char *qwen35_fixture_src(const char *rel)
{
    const char *src = getenv("FERRY_SRC");
    cr_assert(src, "FERRY_SRC is not set (run through meson test)");
    char *p = malloc(strlen(src) + strlen(rel) + 2);
    sprintf(p, "%s/%s", src, rel);
    return p;
}

/* The model file at `model` and its references at `json` (*golden) on a CPU engine of p (backend, context and
 * threads set here); skips the test when the model is missing (made by tests/golden/make_NAME_golden.py). */
static void qwen35_fixture_open(const char *model, const char *json, const char *name, struct engine_params p,
                                json_t **golden, struct model_file **mf, struct engine **e)
{
    FILE *f = fopen(model, "rb");
    if (!f) cr_skip_test("missing FILE: %s (run tests/golden/make_%s_golden.py)", model, name);
    fclose(f);
    json_error_t je;
    *golden = json_load_file(json, 0, &je);
    cr_assert(*golden, "%s: %s", json, je.text);
    char err[256] = "";
    cr_assert_eq(model_file_open(model, mf, NULL, NULL, err), FERRY_OK, "%s", err);
    p.backend = ENGINE_BACKEND_CPU;
    p.ctx_size = QWEN35_FIXTURE_MAX_TOK;
    p.n_threads = 2;
    cr_assert_eq(engine_init(e, *mf, &p, err), FERRY_OK, "engine_init: %s", err);
}

/* Feeds ids[from, to) of slot seq in steps of `step` tokens; the last row's logits into logits. */
static int qwen35_fixture_feed(struct engine *e, int seq, const int32_t *ids, int from, int to, int step,
                               float *logits)
{
    static int32_t pos[QWEN35_FIXTURE_MAX_TOK], sq[QWEN35_FIXTURE_MAX_TOK];
    static uint8_t want[QWEN35_FIXTURE_MAX_TOK];
    for (int a = from; a < to; a += step) {
        const int n = to - a < step ? to - a : step;
        for (int i = 0; i < n; i++) pos[i] = a + i, sq[i] = seq, want[i] = i == n - 1;
        const struct batch b = {
            .n_tokens = n, .tokens = (int32_t *)ids + a, .pos = pos, .seq = sq, .want_logits = want};
        int rc = engine_step(e, &b, logits);
        if (rc) return rc;
    }
    return FERRY_OK;
}

static int qwen35_fixture_argmax(const float *x, int n)
{
    int b = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return b;
}

/* Expects |got - ref| <= tol * max|ref| + tol over the vocabulary. */
static void qwen35_fixture_expect_close(const float *got, const float *ref, int n, double tol,
                                        const char *what)
{
    double m = 0, worst = 0;
    int wi = 0;
    for (int i = 0; i < n; i++) m = fmax(m, fabs(ref[i]));
    for (int i = 0; i < n; i++) {
        const double d = fabs((double)got[i] - ref[i]);
        if (!(d <= worst)) worst = d, wi = i;
    }
    cr_expect(worst <= tol * m + tol, "%s: logit %d off by %g (allowed %g, max|ref| %g)", what, wi, worst,
              tol * m + tol, m);
}

#endif
