/* test_gpu_draw — engine_step_draw (tokens drawn on the GPU where the logits are), whole and in its two
 * halves (engine_step_draw_begin/end), against the host sampler.
 *
 * Two CUDA engines over the same model take the same tokens step by step: one returns logits, sampled on the
 * host by runtime/sampler.c; the other draws on the device (runtime/draw_cuda.c → kernels/cuda/sample.cu).
 * Both engines are deterministic and run the same kernels on the same batch, so the logits are bitwise the
 * same, and the GPU sampler implements the host sampler's definition with its arithmetic: the tokens must be
 * identical, for greedy rows, temperature with top-k / top-p / min-p, penalties over a history, logit_bias
 * and a token mask, in prefill steps and in decode steps (graph-captured). Logprobs agree to 1e-4.
 * On the CPU backend engine_step_draw is refused (engine_draws 0), which CI checks without a GPU.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/core/status.h"
#include "kernels/cuda/ops.h"
#include "runtime/engine.h"
#include "runtime/sampler.h"

#define SEQS  4
#define STEPS 12

static char *src_path(const char *rel)
{
    static char buf[1024];
    const char *src = getenv("FERRY_SRC");
    snprintf(buf, sizeof buf, "%s/%s", src ? src : "..", rel);
    return buf;
}

static struct engine *make_engine(struct model_file *mf, enum engine_backend be)
{
    struct engine_params p = engine_default_params();
    p.backend = be;
    p.n_seqs = SEQS;
    p.ctx_size = 256;
    p.max_batch_tokens = 128;
    p.n_threads = 2;
    p.deterministic = 1;
    struct engine *e = NULL;
    char err[256] = "";
    cr_assert_eq(engine_init(&e, mf, &p, err), 0, "engine_init: %s", err);
    return e;
}

static struct model_file *open_model(void)
{
    struct model_file *mf = NULL;
    char err[256] = "";
    const char *path = src_path("tests/golden/models/llama3_gqa_f16");
    cr_assert_eq(model_file_open(path, &mf, NULL, NULL, err), 0, "%s: %s", path, err);
    return mf;
}

Test(gpu_draw, refused_on_the_cpu_backend)
{
    struct model_file *mf = open_model();
    struct engine *e = make_engine(mf, ENGINE_BACKEND_CPU);
    cr_assert_eq(engine_draws(e), 0);
    struct sampler *smp;
    struct sampler_params sp = sampler_default_params();
    cr_assert_eq(sampler_init(&smp, &sp, engine_hparams(e)->n_vocab), 0);
    int32_t tok = 1, pos = 0, seq = 0;
    uint8_t want = 1;
    struct batch b = {.n_tokens = 1, .tokens = &tok, .pos = &pos, .seq = &seq, .want_logits = &want};
    struct draw_row row = {smp, NULL, -1};
    struct draw_out out;
    cr_assert_eq(engine_step_draw(e, &b, &row, &out), FERRY_ERR_UNSUPPORTED);
    cr_assert_eq(engine_seq_len(e, 0), 0, "a refused draw must not run the step");
    sampler_free(smp);
    engine_free(e);
    model_file_close(mf);
}

Test(gpu_draw, tokens_equal_the_host_samplers, .timeout = 120)
{
    if (kern_cuda_device_count() <= 0) cr_skip_test("no CUDA device: engine_step_draw needs one");
    struct model_file *mf = open_model();
    struct engine *ref = make_engine(mf, ENGINE_BACKEND_CUDA), *gpu = make_engine(mf, ENGINE_BACKEND_CUDA);
    cr_assert_eq(engine_draws(gpu), 1);
    const int V = engine_hparams(ref)->n_vocab;
    /* One sampler pair per sequence (host reference, device draw), with the same parameters and history. */
    static struct logit_bias bias[3] = {{5, 4.0f}, {7, -100.0f}, {11, 2.5f}};
    struct sampler_params sp[SEQS];
    for (int i = 0; i < SEQS; i++) sp[i] = sampler_default_params();
    sp[0].temperature = 0.0f; /* greedy */
    sp[1].temperature = 0.8f, sp[1].top_k = 40, sp[1].top_p = 0.9f, sp[1].seed = 1234;
    sp[2].temperature = 1.3f, sp[2].min_p = 0.05f, sp[2].repetition_penalty = 1.3f,
    sp[2].presence_penalty = 0.4f, sp[2].frequency_penalty = 0.2f, sp[2].seed = 99;
    sp[3].temperature = 1.0f, sp[3].logit_bias = bias, sp[3].n_logit_bias = 3, sp[3].seed = 7;
    struct sampler *hs[SEQS], *ds[SEQS];
    for (int i = 0; i < SEQS; i++) {
        cr_assert_eq(sampler_init(&hs[i], &sp[i], V), 0);
        cr_assert_eq(sampler_init(&ds[i], &sp[i], V), 0);
        for (int t = 0; t < 6; t++) { /* a history for the penalties */
            sampler_accept(hs[i], (t * 13 + i) % V);
            sampler_accept(ds[i], (t * 13 + i) % V);
        }
    }
    /* Sequence 3 may only take even tokens (a mask, as a grammar gives). */
    uint8_t *mask = malloc((size_t)V);
    for (int t = 0; t < V; t++) mask[t] = t % 2 == 0;
    float *logits = malloc((size_t)SEQS * V * sizeof(float)), *row = malloc((size_t)V * sizeof(float));
    int32_t tok[64], pos[64], seq[64], last[SEQS];
    uint8_t want[64];
    int len[SEQS] = {0};
    int agree = 0;
    for (int step = 0; step < STEPS; step++) {
        int n = 0;
        for (int i = 0; i < SEQS; i++) {
            const int k = step == 0 ? 3 + 2 * i : 1; /* a prefill of odd lengths, then decode steps */
            for (int j = 0; j < k; j++, n++) {
                tok[n] = step == 0 ? (int32_t)((j * 31 + i * 7 + 1) % V) : last[i];
                pos[n] = len[i]++;
                seq[n] = i;
                want[n] = j == k - 1;
            }
        }
        struct batch b = {.n_tokens = n, .tokens = tok, .pos = pos, .seq = seq, .want_logits = want};
        cr_assert_eq(engine_step(ref, &b, logits), 0);
        struct draw_row rows[SEQS];
        struct draw_out out[SEQS];
        for (int i = 0; i < SEQS; i++)
            rows[i] = (struct draw_row){ds[i], i == 3 ? mask : NULL, i == 1 ? 5 : -1};
        if (step % 2 == 0) {
            cr_assert_eq(engine_step_draw(gpu, &b, rows, out), 0);
        } else { /* in two halves, as the server overlaps them: b and rows are read by begin only */
            cr_assert_eq(engine_step_draw_begin(gpu, &b, rows), 0);
            cr_assert_eq(engine_step_draw_begin(gpu, &b, rows), FERRY_ERR_INVALID, "one step at a time");
            cr_assert_eq(engine_step(gpu, &b, logits), FERRY_ERR_INVALID, "one step at a time");
            memset(tok, 0xff, sizeof tok);
            memset(rows, 0, sizeof rows);
            cr_assert_eq(engine_step_draw_end(gpu, out), 0);
            cr_assert_eq(engine_step_draw_end(gpu, out), FERRY_ERR_INVALID, "nothing left on its way");
        }
        for (int i = 0; i < SEQS; i++) {
            memcpy(row, logits + (size_t)i * V, (size_t)V * sizeof(float));
            if (i == 3)
                for (int t = 0; t < V; t++)
                    if (!mask[t]) row[t] = -INFINITY;
            const int32_t want_tok = sampler_sample(hs[i], row);
            cr_expect_eq(out[i].token, want_tok, "step %d, sequence %d: the GPU drew %d, the host sampler %d",
                         step, i, out[i].token, want_tok);
            agree += out[i].token == want_tok;
            if (i == 3)
                cr_expect_eq(out[i].token % 2, 0, "step %d: the mask let %d through", step, out[i].token);
            if (i == 1) {
                int32_t top_id[5];
                float top_lp[5];
                const float lp = sampler_logprob(logits + (size_t)i * V, V, out[i].token, 5, top_id, top_lp);
                cr_expect(fabsf(out[i].logprob - lp) <= 1e-4f, "step %d: logprob %g, host %g", step,
                          out[i].logprob, lp);
                cr_expect_eq(out[i].n_top, 5);
                for (int k = 0; k < 5; k++) {
                    cr_expect_eq(out[i].top_id[k], top_id[k], "step %d: top %d", step, k);
                    cr_expect(fabsf(out[i].top_lp[k] - top_lp[k]) <= 1e-4f);
                }
            }
            sampler_advance(ds[i]);
            sampler_accept(ds[i], out[i].token);
            sampler_accept(hs[i], want_tok);
            last[i] = want_tok;
        }
    }
    cr_expect_eq(agree, STEPS * SEQS);
    for (int i = 0; i < SEQS; i++) {
        sampler_free(hs[i]);
        sampler_free(ds[i]);
    }
    free(mask);
    free(logits);
    free(row);
    engine_free(ref);
    engine_free(gpu);
    model_file_close(mf);
}
