/* ferry's quantizer against llama.cpp's llama-quantize, byte for byte.
 *
 * fixtures/quantize_llama.json was written by make_quantize_fixtures.py with llama.cpp lcp0336 (a CPU build
 * of llama-quantize, default options, no importance matrix). For four small random Llama models (a: 10
 * layers, an output head, 4 heads per KV head, ffn_down rows of 352 columns that K mixes must re-type; a in
 * F16; b: 80 layers with grouped-query attention, the "70B" class, and tied embeddings) and seventeen types
 * (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K_S, Q4_K_M, Q5_K_S, Q5_K_M, Q6_K, Q2_K, Q3_K_S, Q3_K_M, Q3_K_L, IQ4_NL,
 * IQ4_XS, MXFP4_MOE) it holds the SHA-256 of llama-quantize's output file, and per tensor its type and a
 * short hash. This test rebuilds each input with the script's generator and ferry's GGUF writer (its SHA-256
 * must equal the script's gguf-py file first: both sides start from the same bytes), runs quantize_model_file
 * on two threads, and requires the same output file: every row quantizer, every per-tensor type choice of the
 * mixes, the fallbacks, the metadata and the layout. On a mismatch it names the first tensor whose type or
 * bytes differ, and the first differing byte of a recorded row.
 */
#include <criterion/criterion.h>
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kernels/core/status.h"
#include "kernels/cpu/threadpool.h"
#include "quant/fp16.h"
#include "qcheck.h"
#include "qgen.h"
#include "sha256.h"
#include "weights/gguf.h"
#include "weights/gguf_write.h"
#include "weights/model_file.h"
#include "weights/quantize.h"
#include "wtest.h"

static void run_on_pool(void *pool, quant_task_fn task, void *ctx, int n_tasks)
{
    tpool_run(pool, task, ctx, n_tasks);
}

static void check_model(int mi)
{
    const struct qgen_spec *s = &qgen_specs[mi];
    char p[4096];
    json_error_t je;
    json_t *fx = json_load_file(wt_fixture(p, sizeof p, "quantize_llama.json"), 0, &je);
    cr_assert_not_null(fx, "cannot read %s: %s", p, je.text);
    json_t *model = json_object_get(json_object_get(fx, "models"), s->name);
    cr_assert_not_null(model, "fixture has no model %s", s->name);

    const char *tmp = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
    char in_path[4096], out_path[4096], hex[65];
    snprintf(in_path, sizeof in_path, "%s/ferry-qfix-%ld-%s.gguf", tmp, (long)getpid(), s->name);
    snprintf(out_path, sizeof out_path, "%s/ferry-qfix-%ld-%s-out.gguf", tmp, (long)getpid(), s->name);
    qgen_write(s, in_path, hex);
    cr_assert_str_eq(
        hex, json_string_value(json_object_get(model, "input_sha256")),
        "%s: the rebuilt input differs from the script's gguf-py file (generator or GGUF writer)", s->name);

    char err[256] = "";
    struct model_file *mf;
    CHECK(model_file_open(in_path, &mf, NULL, NULL, err));
    struct tpool *tp;
    cr_assert_eq(tpool_init(&tp, 2), 0);
    json_t *types = json_object_get(fx, "types");
    for (size_t ti = 0; ti < json_array_size(types); ti++) {
        const char *type = json_string_value(json_array_get(types, ti));
        json_t *want = json_object_get(json_object_get(model, "outputs"), type);
        const struct quantize_params qp = {.ftype = quant_ftype_from_name(type), .runner = {run_on_pool, tp}};
        CHECK(quantize_model_file(mf, out_path, &qp, err));
        file_sha(out_path, hex);
        if (strcmp(hex, json_string_value(json_object_get(want, "sha256"))) != 0)
            explain_mismatch(out_path, model, want, type);
        unlink(out_path);
    }
    tpool_free(tp);
    model_file_close(mf);
    unlink(in_path);
    json_decref(fx);
}

Test(quantize_llama, model_a_f32, .timeout = 120)
{
    check_model(0);
}
Test(quantize_llama, model_a_f16, .timeout = 120)
{
    check_model(1);
}
Test(quantize_llama, model_b_f32_80_layers_tied, .timeout = 120)
{
    check_model(2);
}
Test(quantize_llama, model_c_8_experts, .timeout = 120)
{
    check_model(3);
}
