/* test_embeddings — the engine's hidden-state rows (batch.hidden) against transformers' final hidden states
 * (tests/runtime/data/embeddings.json, written by make_embd_golden.py): the tiny HF models of tests/golden
 * and stories260K, pooled by mean and by last position, computed in one step and in chunks of 7 positions
 * (the KV cache carries the earlier chunks). Tolerance: relative error of the vector <= 1e-4 (f32 compute on
 * both sides, --kv-type f32; weights stored f16/bf16 are upcast exactly); 2e-3 with the default f16 cache. */
#include <criterion/criterion.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/core/status.h"
#include "runtime/engine.h"
#include "weights/model_file.h"

static json_t *load_ref(void)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/tests/runtime/data/embeddings.json", getenv("FERRY_SRC"));
    json_error_t jerr;
    json_t *j = json_load_file(path, 0, &jerr);
    cr_assert(j, "missing %s (make_embd_golden.py writes it): %s", path, jerr.text);
    return j;
}

/* Pooled hidden states of ids through the engine, fed in chunks of `chunk` positions. */
static void run(struct engine *e, const int32_t *ids, int n, int chunk, double *mean, double *last)
{
    const int dim = engine_hparams(e)->dim;
    engine_seq_free(e, 0);
    int32_t *tok = malloc((size_t)chunk * sizeof *tok), *pos = malloc((size_t)chunk * sizeof *pos);
    int32_t *seq = calloc((size_t)chunk, sizeof *seq);
    uint8_t *want = malloc((size_t)chunk);
    float *out = malloc((size_t)chunk * dim * sizeof *out);
    for (int d = 0; d < dim; d++) mean[d] = 0;
    for (int at = 0; at < n; at += chunk) {
        int k = n - at < chunk ? n - at : chunk;
        for (int i = 0; i < k; i++) tok[i] = ids[at + i], pos[i] = at + i, want[i] = 1;
        struct batch b = {k, tok, pos, seq, want, 1, NULL};
        cr_assert_eq(engine_step(e, &b, out), 0);
        for (int i = 0; i < k; i++)
            for (int d = 0; d < dim; d++) {
                mean[d] += out[(size_t)i * dim + d] / n;
                if (at + i == n - 1) last[d] = out[(size_t)i * dim + d];
            }
    }
    free(tok);
    free(pos);
    free(seq);
    free(want);
    free(out);
}

static double rel_err(const double *got, json_t *want, int dim)
{
    cr_assert_eq((int)json_array_size(want), dim);
    double num = 0, den = 0;
    for (int d = 0; d < dim; d++) {
        double w = json_real_value(json_array_get(want, (size_t)d));
        num += (got[d] - w) * (got[d] - w);
        den += w * w;
    }
    return sqrt(num / (den + 1e-30));
}

/* tol holds for f32/f16 weights, tol_bf16 for bf16 ones: their products round x to bf16 (8 bits of mantissa).
 * kv_f16: the CPU engine's KV cache in f16 (its default) or f32. */
static void check_backend(enum engine_backend backend, double tol, double tol_bf16, int kv_f16)
{
    json_t *ref = load_ref(), *models = json_object_get(ref, "models");
    const char *name;
    json_t *m;
    int checked = 0;
    json_object_foreach(models, name, m)
    {
        const char *p = json_string_value(json_object_get(m, "path"));
        char path[1024];
        if (!strncmp(p, "testdata:", 9))
            snprintf(path, sizeof path, "%s/%s", getenv("FERRY_TESTDATA"), p + 9);
        else
            snprintf(path, sizeof path, "%s/%s", getenv("FERRY_SRC"), p);
        struct model_file *mf = NULL;
        char err[256];
        if (model_file_open(path, &mf, NULL, NULL, err)) {
            cr_log_warn("skipping %s: %s", path, err);
            continue;
        }
        struct engine_params ep = engine_default_params();
        ep.backend = backend;
        ep.n_seqs = 1;
        ep.ctx_size = 256;
        ep.max_batch_tokens = 128;
        ep.n_threads = 2;
        ep.kv_type = kv_f16 ? KV_F16 : KV_F32;
        struct engine *e = NULL;
        int rc = engine_init(&e, mf, &ep, err);
        if (rc && backend == ENGINE_BACKEND_CUDA) { /* no device here (CI): the GPU run checks it */
            model_file_close(mf);
            json_decref(ref);
            cr_skip_test("no CUDA device: %s", err);
        }
        cr_assert_eq(rc, 0, "%s: %s", name, err);
        const int dim = engine_hparams(e)->dim;
        double *mean = malloc((size_t)dim * sizeof *mean), *last = malloc((size_t)dim * sizeof *last);
        size_t i;
        json_t *cs;
        json_array_foreach(json_object_get(m, "cases"), i, cs)
        {
            json_t *jids = json_object_get(cs, "ids");
            int n = (int)json_array_size(jids);
            int32_t *ids = malloc((size_t)n * sizeof *ids);
            for (int k = 0; k < n; k++) ids[k] = (int32_t)json_integer_value(json_array_get(jids, (size_t)k));
            const int chunks[2] = {128, 7};
            for (int c = 0; c < 2; c++) {
                run(e, ids, n, chunks[c], mean, last);
                double em = rel_err(mean, json_object_get(cs, "mean"), dim),
                       el = rel_err(last, json_object_get(cs, "last"), dim);
                const double t = strstr(name, "bf16") ? tol_bf16 : tol;
                cr_expect(em <= t && el <= t,
                          "%s, %d positions, chunks of %d: relative error mean %.2e, last %.2e", name, n,
                          chunks[c], em, el);
                checked++;
            }
            free(ids);
        }
        free(mean);
        free(last);
        engine_free(e);
        model_file_close(mf);
    }
    json_decref(ref);
    cr_assert_geq(checked, 24, "only %d cases ran", checked);
}

Test(embeddings, hidden_rows_equal_transformers_cpu, .timeout = 120)
{
    check_backend(ENGINE_BACKEND_CPU, 1e-4, 1e-4, 0);
}

/* The default f16 KV cache: K and V rounded to 11 bits (measured 3.5e-4..4.7e-4 on these models). */
Test(embeddings, hidden_rows_equal_transformers_cpu_f16_kv, .timeout = 120)
{
    check_backend(ENGINE_BACKEND_CPU, 2e-3, 2e-3, 1);
}

Test(embeddings, hidden_rows_equal_transformers_cuda, .timeout = 300)
{
    /* x rounded to f16 or bf16 in the products. Measured on the H200 (2026-12-01): qwen2_bias_bf16 4.3e-3..6.9e-3
     * since bf16 weights stay bf16 on the device (run 7c converted them to f16: 5e-4..1.2e-3); f16/f32 models
     * pass 5e-3. */
    check_backend(ENGINE_BACKEND_CUDA, 5e-3, 1.5e-2, 1);
}
