/* A model whose matrices use every type ferry reads but does not write, mixed per tensor
 * (fixtures/lut_mixed.gguf, quantized by llama.cpp's own quantizers: make_lut_model_fixture.py), runs on the
 * CPU engine: the same model with every tensor stored dequantized as F32 (written here with ferry's GGUF
 * writer from the type table's dequantization, which test_quant holds bitwise to llama.cpp's) gives the same
 * logits. With the f32 arithmetic both multiply the same weight values in f32: they differ only by the order
 * of the sums, |got - ref| <= 1e-4·(1 + max|ref|) (measured ~1e-6). With the int8 arithmetic (x rounded to
 * int8 blocks, llama.cpp's) the error is x's rounding (test_matmul bounds it per product): relative RMS at
 * most 5% and the same top token (measured 1.1-2.6% over the 8 rows). The engine plans by each tensor's real
 * bytes: its weight bytes are the file's. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kernels/core/status.h"
#include "quant/dtype.h"
#include "runtime/engine.h"
#include "weights/gguf.h"
#include "weights/gguf_write.h"
#include "weights/model_file.h"
#include "qrun.h"
#include "wtest.h"

/* Writes `out`: the GGUF at `in` with every tensor replaced by its f32 values. Returns the bytes of the
 * input's matrices that a forward pass reads (every 2-D tensor but the token embedding, a row lookup). */
static uint64_t write_f32_copy(const char *in, const char *out)
{
    char err[256] = "";
    struct gguf *g;
    cr_assert_eq(gguf_open(in, &g, err), FERRY_OK, "%s", err);
    struct gguf_writer *w;
    cr_assert_eq(gguf_writer_init(&w, err), FERRY_OK, "%s", err);
    for (int i = 0; i < gguf_n_kv(g); i++) {
        const struct gguf_str kv = gguf_kv_raw(g, i);
        cr_assert_eq(gguf_writer_kv_raw(w, kv.ptr, kv.len, err), FERRY_OK, "%s", err);
    }
    uint64_t bytes = 0;
    int types_seen[DTYPE_COUNT] = {0};
    for (int i = 0; i < gguf_n_tensors(g); i++) {
        const struct gguf_tensor_info *t = gguf_tensor(g, i);
        char name[128];
        snprintf(name, sizeof name, "%.*s", (int)t->name.len, t->name.ptr);
        cr_assert_eq(gguf_writer_tensor(w, name, DTYPE_F32, t->n_dims, t->ne, err), FERRY_OK, "%s", err);
        if (t->n_dims == 2 && strcmp(name, "token_embd.weight")) bytes += t->nbytes;
        types_seen[t->type] = 1;
    }
    /* Every type without a quantizer is in the file. */
    for (int t = 0; t < DTYPE_COUNT; t++)
        if (dtype_valid((uint32_t)t) && !dtype_get_traits((uint32_t)t)->from_f32)
            cr_assert(types_seen[t], "the fixture has no %s tensor", dtype_name((enum dtype)t));
    cr_assert_eq(gguf_writer_open(w, out, err), FERRY_OK, "%s", err);
    for (int i = 0; i < gguf_n_tensors(g); i++) {
        const struct gguf_tensor_info *t = gguf_tensor(g, i);
        const int64_t n = t->ne[0] * t->ne[1] * t->ne[2] * t->ne[3];
        float *f = malloc(sizeof(float) * (size_t)n);
        cr_assert(dtype_to_f32(t->type, t->data, f, n));
        cr_assert_eq(gguf_writer_data(w, f, sizeof(float) * (size_t)n, err), FERRY_OK, "%s", err);
        free(f);
    }
    cr_assert_eq(gguf_writer_finish(w, err), FERRY_OK, "%s", err);
    gguf_writer_free(w);
    gguf_close(g);
    return bytes;
}

static struct engine *open_engine(const char *path, struct model_file **mf, int int8)
{
    char err[256] = "";
    cr_assert_eq(model_file_open(path, mf, NULL, NULL, err), FERRY_OK, "%s: %s", path, err);
    struct engine_params p = engine_default_params();
    p.backend = ENGINE_BACKEND_CPU;
    p.ctx_size = 64;
    p.n_threads = 2;
    p.cpu_int8 = int8;
    p.kv_type = KV_F32;
    struct engine *e = NULL;
    cr_assert_eq(engine_init(&e, *mf, &p, err), FERRY_OK, "%s: %s", path, err);
    return e;
}

/* Logits (n, V) of tokens fed one at a time, then of the same prompt prefilled as one batch (last row). */
static float *logits_of(struct engine *e, const int32_t *toks, int n)
{
    const int V = engine_hparams(e)->n_vocab;
    float *out = malloc(sizeof(float) * (size_t)V * (size_t)(n + 1));
    qrun_steps(e, toks, n, out);
    cr_assert_eq(engine_seq_free(e, 0), FERRY_OK);
    int32_t pos[16], seq[16] = {0};
    uint8_t want[16] = {0};
    for (int i = 0; i < n; i++) pos[i] = i;
    want[n - 1] = 1;
    const struct batch b = {
        .n_tokens = n, .tokens = (int32_t *)toks, .pos = pos, .seq = seq, .want_logits = want};
    cr_assert_eq(engine_step(e, &b, out + (size_t)V * n), FERRY_OK);
    return out;
}

static void check_mixed(int int8)
{
    char in[4096], out[4096];
    wt_fixture(in, sizeof in, "lut_mixed.gguf");
    const char *tmp = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
    snprintf(out, sizeof out, "%s/ferry-lut-f32-%ld.gguf", tmp, (long)getpid());
    const uint64_t file_bytes = write_f32_copy(in, out);
    struct model_file *mq, *mf;
    struct engine *q = open_engine(in, &mq, int8), *f = open_engine(out, &mf, 0);
    /* The engine holds each matrix in its stored type: the file's bytes, about 1/8 of the F32 copy's. */
    cr_assert_eq(engine_weight_bytes(q), file_bytes, "weight bytes %llu, the file's tensors %llu",
                 (unsigned long long)engine_weight_bytes(q), (unsigned long long)file_bytes);
    cr_assert_lt(engine_weight_bytes(q) * 6, engine_weight_bytes(f));
    const int V = engine_hparams(q)->n_vocab, n = 7;
    const int32_t toks[7] = {1, 17, 4, 33, 9, 47, 20};
    float *a = logits_of(q, toks, n), *b = logits_of(f, toks, n);
    for (int r = 0; r <= n; r++) {
        char what[32];
        snprintf(what, sizeof what, "row %d", r);
        wt_check_logits(what, int8 ? "int8" : "f32", a + (size_t)V * r, b + (size_t)V * r, V, int8 ? 0.05 : 0,
                        1e-4);
    }
    free(a);
    free(b);
    engine_free(q);
    engine_free(f);
    model_file_close(mq);
    model_file_close(mf);
    unlink(out);
}

Test(lut_model, mixed_types_equal_their_f32_copy_f32_arithmetic, .timeout = 60)
{
    check_mixed(0);
}

Test(lut_model, mixed_types_close_to_their_f32_copy_int8_arithmetic, .timeout = 60)
{
    check_mixed(1);
}
