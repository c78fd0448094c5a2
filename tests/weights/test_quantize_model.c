/* Quantized models end to end: `--quant int4/int8` at load gives bitwise the logits of the file `ferry
 * quantize` writes for the matching mix (Q4_K_M / Q8_0), on the random models of qgen.h (an output head with
 * Q4_K, Q6_K and Q5_0 fallbacks; a tied head over 80 layers); and quantized real models keep their logits
 * close to the unquantized ones: stories260K against llama.cpp's f32 logits (../shared/testdata), the tiny
 * Hugging Face models of tests/golden against transformers' logits. */
#include <criterion/criterion.h>
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kernels/cpu/threadpool.h"
#include "quant/mix.h"
#include "qgen.h"
#include "runtime/engine.h"
#include "weights/model_file.h"
#include "weights/quantize.h"
#include "wtest.h"

static void run_on_pool(void *pool, quant_task_fn task, void *ctx, int n_tasks)
{
    tpool_run(pool, task, ctx, n_tasks);
}

static void tmp_path(char *buf, size_t n, const char *name)
{
    const char *tmp = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
    snprintf(buf, n, "%s/ferry-qmodel-%ld-%s", tmp, (long)getpid(), name);
}

/* Quantizes the model at `in` to `out` with the mix `type` on two threads. */
static void quantize_file(const char *in, const char *out, const char *type)
{
    char err[256] = "";
    struct model_file *mf;
    cr_assert_eq(model_file_open(in, &mf, NULL, NULL, err), FERRY_OK, "%s: %s", in, err);
    struct tpool *tp;
    cr_assert_eq(tpool_init(&tp, 2), 0);
    const struct quantize_params qp = {.ftype = quant_ftype_from_name(type), .runner = {run_on_pool, tp}};
    cr_assert_eq(quantize_model_file(mf, out, &qp, err), FERRY_OK, "%s %s: %s", in, type, err);
    tpool_free(tp);
    model_file_close(mf);
}

static struct engine *open_engine(const char *path, struct model_file **mf, enum engine_quant q)
{
    char err[256] = "";
    cr_assert_eq(model_file_open(path, mf, NULL, NULL, err), FERRY_OK, "%s: %s", path, err);
    struct engine_params p = engine_default_params();
    p.backend = ENGINE_BACKEND_CPU;
    p.ctx_size = 64;
    p.n_threads = 2;
    p.quant = q;
    struct engine *e = NULL;
    cr_assert_eq(engine_init(&e, *mf, &p, err), FERRY_OK, "%s: %s", path, err);
    return e;
}

/* Logits (n_tokens, V) of a prompt fed one token at a time. */
static float *logits_of(struct engine *e, const int32_t *toks, int n)
{
    const int V = engine_hparams(e)->n_vocab;
    float *out = malloc(sizeof(float) * (size_t)V * (size_t)n);
    for (int i = 0; i < n; i++) {
        int32_t tok = toks[i], pos = i, seq = 0;
        uint8_t want = 1;
        const struct batch b = {
            .n_tokens = 1, .tokens = &tok, .pos = &pos, .seq = &seq, .want_logits = &want};
        cr_assert_eq(engine_step(e, &b, out + (size_t)V * i), FERRY_OK);
    }
    return out;
}

static void check_load_equals_file(int spec, enum engine_quant q, const char *type)
{
    const struct qgen_spec *s = &qgen_specs[spec];
    char in[4096], out[4096], hex[65], name[64];
    snprintf(name, sizeof name, "%s.gguf", s->name);
    tmp_path(in, sizeof in, name);
    snprintf(name, sizeof name, "%s-%s.gguf", s->name, type);
    tmp_path(out, sizeof out, name);
    qgen_write(s, in, hex);
    quantize_file(in, out, type);
    struct model_file *mf_in, *mf_out;
    struct engine *at_load = open_engine(in, &mf_in, q),
                  *from_file = open_engine(out, &mf_out, ENGINE_QUANT_NONE);
    cr_assert_eq(engine_weight_bytes(at_load), engine_weight_bytes(from_file), "%s %s: weight bytes", s->name,
                 type);
    const int V = engine_hparams(at_load)->n_vocab, n = 6;
    int32_t toks[6];
    for (int i = 0; i < n; i++) toks[i] = (int32_t)((i * 37 + 5) % V);
    float *a = logits_of(at_load, toks, n), *b = logits_of(from_file, toks, n);
    for (size_t i = 0; i < (size_t)V * n; i++)
        cr_assert(memcmp(&a[i], &b[i], 4) == 0,
                  "%s %s: logit %zu (token %zu, id %zu): %.9g at load, %.9g from the file", s->name, type, i,
                  i / (size_t)V, i % (size_t)V, a[i], b[i]);
    /* And quantization did something: the f32 model's logits differ. */
    struct model_file *mf_f32;
    struct engine *plain = open_engine(in, &mf_f32, ENGINE_QUANT_NONE);
    float *c = logits_of(plain, toks, n);
    cr_assert(memcmp(a, c, sizeof(float) * (size_t)V * n) != 0, "%s %s: quantization changed nothing",
              s->name, type);
    free(a);
    free(b);
    free(c);
    engine_free(at_load);
    engine_free(from_file);
    engine_free(plain);
    model_file_close(mf_in);
    model_file_close(mf_out);
    model_file_close(mf_f32);
    unlink(in);
    unlink(out);
}

Test(quantize_model, int4_at_load_equals_q4_k_m_file, .timeout = 120)
{
    check_load_equals_file(0, ENGINE_QUANT_INT4, "Q4_K_M");
}
Test(quantize_model, int4_at_load_equals_q4_k_m_file_tied_80_layers, .timeout = 120)
{
    check_load_equals_file(2, ENGINE_QUANT_INT4, "Q4_K_M");
}
Test(quantize_model, int8_at_load_equals_q8_0_file, .timeout = 120)
{
    check_load_equals_file(1, ENGINE_QUANT_INT8, "Q8_0");
}
