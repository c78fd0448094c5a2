/* qrun — helpers of the tests that quantize a model file and run it: a temporary path, `ferry quantize`'s
 * work on two threads, and the logits of tokens fed one at a time. Header-only (each test file is its own
 * executable); the caller links runtime_dep. */
#ifndef FERRY_TESTS_QRUN_H
#define FERRY_TESTS_QRUN_H

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "kernels/core/status.h"
#include "kernels/cpu/threadpool.h"
#include "runtime/engine.h"
#include "weights/model_file.h"
#include "weights/quantize.h"

static inline void qrun_on_pool(void *pool, quant_task_fn task, void *ctx, int n_tasks)
{
    tpool_run(pool, task, ctx, n_tasks);
}

/* $TMPDIR/<prefix>-<pid>-<name>. */
static inline void qrun_tmp_path(char *buf, size_t n, const char *prefix, const char *name)
{
    const char *tmp = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
    snprintf(buf, n, "%s/%s-%ld-%s", tmp, prefix, (long)getpid(), name);
}

/* Quantizes the model at `in` to `out` with the file type `type` on two threads. */
static inline void qrun_quantize(const char *in, const char *out, const char *type)
{
    char err[256] = "";
    struct model_file *mf;
    cr_assert_eq(model_file_open(in, &mf, NULL, NULL, err), FERRY_OK, "%s: %s", in, err);
    struct tpool *tp;
    cr_assert_eq(tpool_init(&tp, 2), 0);
    const struct quantize_params qp = {.ftype = quant_ftype_from_name(type), .runner = {qrun_on_pool, tp}};
    cr_assert_geq(qp.ftype, 0, "%s", type);
    cr_assert_eq(quantize_model_file(mf, out, &qp, err), FERRY_OK, "%s %s: %s", in, type, err);
    tpool_free(tp);
    model_file_close(mf);
}

/* out (n, V): the logits of toks fed one at a time to sequence 0 from position 0. */
static inline void qrun_steps(struct engine *e, const int32_t *toks, int n, float *out)
{
    const int V = engine_hparams(e)->n_vocab;
    for (int i = 0; i < n; i++) {
        int32_t tok = toks[i], pos = i, seq = 0;
        uint8_t want = 1;
        const struct batch b = {
            .n_tokens = 1, .tokens = &tok, .pos = &pos, .seq = &seq, .want_logits = &want};
        cr_assert_eq(engine_step(e, &b, out + (size_t)V * i), FERRY_OK);
    }
}

#endif
