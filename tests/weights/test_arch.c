/* test_arch — the family registry (weights/arch/) through the loaders: each family's hyperparameters read the
 * same from its Hugging Face directory and from the GGUF ferry writes of it (tests/golden's tiny models), the
 * keys llama.cpp's files lack fall back to llama.cpp's rules, and bad files name what is wrong: an unknown
 * architecture with the supported list, a missing tensor with its family.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kernels/core/status.h"
#include "weights/arch/arch.h"
#include "weights/hf_config.h"
#include "weights/model_file.h"
#include "weights/quantize.h"

static struct model_file *open_golden(const char *name)
{
    char dir[4096], err[256] = "";
    snprintf(dir, sizeof dir, "%s/tests/golden/models/%s", getenv("FERRY_SRC"), name);
    struct model_file *mf;
    cr_assert_eq(model_file_open(dir, &mf, NULL, NULL, err), FERRY_OK, "%s: %s", dir, err);
    return mf;
}

/* The F32 GGUF ferry writes of a golden model, read back into memory (*n bytes; the caller frees). */
static uint8_t *gguf_of(const struct model_file *mf, const char *name, size_t *n)
{
    char path[512], err[256] = "";
    snprintf(path, sizeof path, "%s/ferry-arch-%ld-%s.gguf", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp",
             (long)getpid(), name);
    const struct quantize_params qp = {.ftype = QUANT_FTYPE_F32};
    cr_assert_eq(quantize_model_file(mf, path, &qp, err), FERRY_OK, "%s", err);
    FILE *f = fopen(path, "rb");
    cr_assert_not_null(f);
    fseek(f, 0, SEEK_END);
    *n = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *buf = malloc(*n);
    cr_assert_eq(fread(buf, 1, *n, f), *n);
    fclose(f);
    unlink(path);
    return buf;
}

/* Rewrites every `from` in buf to `to` (same length); returns how many. */
static int patch(uint8_t *buf, size_t n, const char *from, const char *to)
{
    const size_t l = strlen(from);
    int k = 0;
    cr_assert_eq(strlen(to), l);
    for (size_t i = 0; i + l <= n; i++)
        if (memcmp(buf + i, from, l) == 0) memcpy(buf + i, to, l), k++;
    return k;
}

static void expect_fail(const uint8_t *buf, size_t n, int rc_want, const char *msg)
{
    struct model_file *mf = NULL;
    char err[256] = "";
    const int rc = model_file_open_gguf_mem(buf, n, &mf, err);
    cr_assert_eq(rc, rc_want, "rc %d (%s), want %d", rc, err, rc_want);
    cr_assert(strstr(err, msg) != NULL, "'%s' lacks '%s'", err, msg);
    cr_assert_null(mf);
}

Test(arch, qwen3_hf_and_gguf)
{
    struct model_file *hf = open_golden("qwen3_qknorm_f32");
    cr_assert_str_eq(hf->hp.family->name, "qwen3");
    cr_assert_eq(hf->hp.head_dim, 24, "head_dim from config.json, not hidden / heads");
    cr_assert_eq(hf->hp.qkv_bias, 0);
    size_t n;
    uint8_t *buf = gguf_of(hf, "qwen3", &n);
    struct model_file *g;
    char err[256] = "";
    cr_assert_eq(model_file_open_gguf_mem(buf, n, &g, err), FERRY_OK, "%s", err);
    cr_assert_eq(g->hp.family, hf->hp.family);
    cr_assert_str_eq(g->hp.arch, "qwen3");
    cr_assert_eq(g->hp.rope_style, ROPE_STYLE_HALF, "qwen3 GGUF files keep rotate-half pairs");
    cr_assert_eq(g->hp.head_dim, 24);
    cr_assert_not_null(model_file_tensor(g, "blk.2.attn_k_norm.weight"));
    model_file_close(g);

    /* A missing QK-norm names the tensor and the family. */
    cr_assert_eq(patch(buf, n, "blk.1.attn_q_norm.weight", "blk.1.attn_q_xorm.weight"), 1);
    expect_fail(buf, n, FERRY_ERR_FORMAT, "missing tensor 'blk.1.attn_q_norm.weight' (qwen3 family)");
    /* An unknown architecture names itself and lists the supported ones (the table's first, in order). */
    cr_assert_gt(patch(buf, n, "qwen3", "qwen9"), 0);
    expect_fail(
        buf, n, FERRY_ERR_UNSUPPORTED,
        "architecture 'qwen9' is not supported (llama, mistral, qwen2, qwen3, gemma3, phi3, qwen3moe");
    free(buf);
    model_file_close(hf);
}

Test(arch, gemma3_hf_and_gguf)
{
    struct model_file *hf = open_golden("gemma3_swa_f32");
    const struct llm_hparams *h = &hf->hp;
    cr_assert_str_eq(h->family->name, "gemma3");
    cr_assert_eq(h->sliding_window, 16);
    cr_assert_eq(h->swa_pattern, 3, "layer_types: local, local, global, local, local");
    for (int l = 0; l < 5; l++) cr_assert_eq(llm_layer_is_local(h, l), l != 2, "layer %d", l);
    cr_assert_float_eq(h->rope_theta, 1e6f, 0);
    cr_assert_float_eq(h->rope_theta_swa, 1e4f, 0);
    cr_assert_eq(h->rope_scaling.type, ROPE_SCALING_LINEAR, "the global layers' scaling");
    cr_assert_float_eq(h->attn_scale, (float)(1.0 / sqrt(40.0)), 0, "query_pre_attn_scalar 40");
    cr_assert_float_eq(h->embed_scale, (float)sqrt(72.0), 0);
    size_t n;
    uint8_t *buf = gguf_of(hf, "gemma3", &n);
    struct model_file *g;
    char err[256] = "";
    cr_assert_eq(model_file_open_gguf_mem(buf, n, &g, err), FERRY_OK, "%s", err);
    const struct llm_hparams *q = &g->hp;
    cr_assert_eq(q->sliding_window, 16);
    cr_assert_eq(q->swa_pattern, 3);
    cr_assert_eq(q->rope_theta_swa, h->rope_theta_swa);
    cr_assert_eq(q->attn_scale, h->attn_scale);
    cr_assert_eq(q->embed_scale, h->embed_scale);
    cr_assert_eq(q->rope_scaling.type, ROPE_SCALING_LINEAR);
    /* Norms are stored as 1 + w in GGUF (llama.cpp's converter), as w in HF. */
    const struct wtensor *a = model_file_tensor(hf, "blk.0.post_ffw_norm.weight"),
                         *b = model_file_tensor(g, "blk.0.post_ffw_norm.weight");
    cr_assert(a && b && a->type == DTYPE_F32 && b->type == DTYPE_F32);
    for (int i = 0; i < 72; i++)
        cr_assert_eq(((const float *)b->data)[i], ((const float *)a->data)[i] + 1.0f, "element %d", i);
    model_file_close(g);

    /* Without ferry's attention.scale key (llama.cpp's files): llama.cpp's rule, head_dim^-1/2 below 62
     * layers; without the window keys every layer is global. */
    cr_assert_eq(patch(buf, n, "gemma3.attention.scale", "gemma3.attention.scalx"), 1);
    cr_assert_eq(patch(buf, n, "gemma3.attention.sliding_window", "gemma3.attention.sliding_windox"), 2);
    cr_assert_eq(model_file_open_gguf_mem(buf, n, &g, err), FERRY_OK, "%s", err);
    cr_assert_float_eq(g->hp.attn_scale, 1.0f / sqrtf(32.0f), 0);
    cr_assert_eq(g->hp.sliding_window, 0);
    cr_assert_eq(llm_layer_is_local(&g->hp, 0), 0);
    model_file_close(g);

    cr_assert_eq(patch(buf, n, "blk.4.post_ffw_norm.weight", "blk.4.post_ffw_xorm.weight"), 1);
    expect_fail(buf, n, FERRY_ERR_FORMAT, "missing tensor 'blk.4.post_ffw_norm.weight' (gemma3 family)");
    free(buf);
    model_file_close(hf);
}

Test(arch, phi3_fused_partial_rotary_window)
{
    struct model_file *hf = open_golden("phi3_fused_bf16");
    const struct llm_hparams *h = &hf->hp;
    cr_assert_str_eq(h->family->name, "phi3");
    cr_assert_eq(h->head_dim, 16);
    cr_assert_eq(h->rope_dim, 12, "partial_rotary_factor 0.75");
    cr_assert_eq(h->sliding_window, 24);
    for (int l = 0; l < 3; l++) cr_assert(llm_layer_is_local(h, l), "every layer has the window");
    cr_assert_eq(h->rope_theta_swa, h->rope_theta);
    cr_assert_not_null(model_file_tensor(hf, "blk.0.attn_qkv.weight"));
    size_t n;
    uint8_t *buf = gguf_of(hf, "phi3", &n);
    struct model_file *g;
    char err[256] = "";
    cr_assert_eq(model_file_open_gguf_mem(buf, n, &g, err), FERRY_OK, "%s", err);
    cr_assert_eq(g->hp.rope_dim, 12);
    cr_assert_eq(g->hp.sliding_window, 24);
    cr_assert_eq(g->hp.swa_pattern, 0);
    cr_assert_eq(g->hp.rope_style, ROPE_STYLE_HALF);
    const struct wtensor *up = model_file_tensor(g, "blk.2.ffn_up.weight");
    cr_assert(up && up->ne[0] == 64 && up->ne[1] == 2 * 88, "ffn_up holds gate and up");
    model_file_close(g);
    cr_assert_eq(patch(buf, n, "blk.2.attn_qkv.weight", "blk.2.attn_qkx.weight"), 1);
    expect_fail(buf, n, FERRY_ERR_FORMAT, "missing tensor 'blk.2.attn_qkv.weight' (phi3 family)");
    free(buf);
    model_file_close(hf);
}

/* A config.json whose layer_types do not repeat with one period is refused, naming the layer. */
Test(arch, gemma3_irregular_layer_types)
{
    const char *c = "{\"architectures\":[\"Gemma3ForCausalLM\"],\"hidden_size\":64,\"intermediate_size\":96,"
                    "\"num_hidden_layers\":4,\"num_attention_heads\":4,\"vocab_size\":100,\"head_dim\":16,"
                    "\"sliding_window\":8,\"layer_types\":[\"sliding_attention\",\"full_attention\","
                    "\"full_attention\",\"full_attention\"]}";
    struct llm_hparams hp;
    char err[256] = "";
    cr_assert_eq(hf_config_parse(c, strlen(c), &hp, err), FERRY_ERR_UNSUPPORTED);
    cr_assert(strstr(err, "layer_types[2]") != NULL, "%s", err);
}

/* gpt-oss from the GGUF tests/golden/make_gptoss_golden.py writes as llama.cpp's converter does: the window
 * on every other layer with the global rotary, YaRN untruncated (GGUF has no key for it; the released config
 * says false), the clamped SwiGLU's constants; a missing sink tensor or window key is named. */
Test(arch, gptoss_gguf)
{
    char path[4096], err[256] = "";
    snprintf(path, sizeof path, "%s/tests/golden/models/gptoss_yarn_f16.gguf", getenv("FERRY_SRC"));
    struct model_file *g;
    cr_assert_eq(model_file_open(path, &g, NULL, NULL, err), FERRY_OK, "%s", err);
    const struct llm_hparams *h = &g->hp;
    cr_assert_str_eq(h->family->name, "gpt-oss");
    cr_assert_eq(h->sliding_window, 16);
    cr_assert(llm_layer_is_local(h, 0) && !llm_layer_is_local(h, 1), "sliding, then full attention");
    cr_assert(h->swa_rope_scaled && h->rope_theta_swa == h->rope_theta);
    cr_assert_eq(h->rope_style, ROPE_STYLE_HALF);
    cr_assert_eq(h->rope_scaling.type, ROPE_SCALING_YARN);
    cr_assert_eq(h->rope_scaling.orig_ctx, 256);
    cr_assert_eq(h->rope_scaling.truncate, 0);
    cr_assert_float_eq(h->rope_scaling.factor, 4.0f, 0);
    /* (0.1 ln 4 + 1)^2 on 16^-1/2 */
    const double m = 0.1 * log(4.0) + 1;
    cr_assert_float_eq(llm_attn_scale(h), m * m / 4.0, 1e-6);
    cr_assert_eq(h->n_expert, 5);
    cr_assert_eq(h->n_expert_used, 2);
    cr_assert_eq(h->expert_ffn_dim, 32);
    cr_assert_eq(h->qkv_bias, 1);
    cr_assert_float_eq(h->swiglu_alpha, 1.702f, 0);
    cr_assert_float_eq(h->swiglu_limit, 7.0f, 0);
    /* The HF checkpoint of the same model: the same hyperparameters (truncate from its rope_parameters), and
     * its experts rearranged into exactly the GGUF file's tensors. */
    struct model_file *hf = open_golden("gptoss_yarn_f16");
    const struct llm_hparams *q = &hf->hp;
    cr_assert_eq(q->family, h->family);
    cr_assert(q->sliding_window == 16 && q->swa_pattern == 2 && q->swa_rope_scaled && q->qkv_bias);
    cr_assert(q->rope_scaling.type == ROPE_SCALING_YARN && q->rope_scaling.truncate == 0);
    cr_assert_eq(llm_attn_scale(q), llm_attn_scale(h));
    cr_assert(q->n_expert == 5 && q->n_expert_used == 2 && q->expert_ffn_dim == 32);
    cr_assert(q->swiglu_alpha == h->swiglu_alpha && q->swiglu_limit == h->swiglu_limit);
    static const char *const exps[] = {"blk.1.ffn_gate_exps.weight", "blk.1.ffn_up_exps.weight",
                                       "blk.1.ffn_down_exps.weight", "blk.0.ffn_gate_exps.bias",
                                       "blk.0.ffn_up_exps.bias",     "blk.0.ffn_down_exps.bias"};
    for (int i = 0; i < 6; i++) {
        const struct wtensor *a = model_file_tensor(hf, exps[i]), *b = model_file_tensor(g, exps[i]);
        cr_assert(a && b && a->type == DTYPE_F16, "%s", exps[i]);
        cr_assert(a->ne[0] == b->ne[0] && a->ne[1] == b->ne[1] && a->ne[2] == b->ne[2], "%s", exps[i]);
        const int64_t n = a->ne[0] * a->ne[1] * a->ne[2];
        float *x = malloc(sizeof(float) * (size_t)n), *y = malloc(sizeof(float) * (size_t)n);
        cr_assert(dtype_to_f32(a->type, a->data, x, n) && dtype_to_f32(b->type, b->data, y, n));
        cr_assert(memcmp(x, y, sizeof(float) * (size_t)n) == 0, "%s differs from the GGUF's", exps[i]);
        free(x);
        free(y);
    }
    /* Quantized as llama.cpp's converter and then llama-quantize do: the router and the biases in F32 (as the
     * converter writes them, and the golden GGUF holds them), the experts quantized. */
    char qpath[512];
    snprintf(qpath, sizeof qpath, "%s/ferry-arch-%ld-gptoss-q8.gguf",
             getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp", (long)getpid());
    const struct quantize_params qp = {.ftype = QUANT_FTYPE_Q8_0};
    cr_assert_eq(quantize_model_file(hf, qpath, &qp, err), FERRY_OK, "%s", err);
    struct model_file *q8;
    cr_assert_eq(model_file_open(qpath, &q8, NULL, NULL, err), FERRY_OK, "%s", err);
    cr_assert_eq(model_file_tensor(q8, "blk.0.ffn_gate_inp.weight")->type, DTYPE_F32);
    cr_assert_eq(model_file_tensor(g, "blk.0.ffn_gate_inp.weight")->type, DTYPE_F32);
    cr_assert_eq(model_file_tensor(g, "blk.0.ffn_up_exps.bias")->type, DTYPE_F32);
    cr_assert_eq(model_file_tensor(q8, "blk.0.ffn_up_exps.weight")->type, DTYPE_Q8_0);
    cr_assert_eq(model_file_tensor(q8, "blk.0.attn_q.weight")->type, DTYPE_Q8_0);
    cr_assert_eq(model_file_tensor(q8, "blk.0.ffn_up_exps.bias")->type, DTYPE_F32);
    model_file_close(q8);
    unlink(qpath);
    model_file_close(hf);
    model_file_close(g);

    FILE *f = fopen(path, "rb");
    cr_assert_not_null(f);
    fseek(f, 0, SEEK_END);
    const size_t n = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *buf = malloc(n);
    cr_assert_eq(fread(buf, 1, n, f), n);
    fclose(f);
    uint8_t *copy = malloc(n);
    memcpy(copy, buf, n);
    cr_assert_eq(patch(copy, n, "blk.1.attn_sinks.weight", "blk.1.attn_sinkx.weight"), 1);
    expect_fail(copy, n, FERRY_ERR_FORMAT, "missing tensor 'blk.1.attn_sinks.weight' (gpt-oss family)");
    memcpy(copy, buf, n);
    cr_assert_eq(patch(copy, n, "gpt-oss.attention.sliding_window", "gpt-oss.attention.sliding_windox"), 1);
    expect_fail(copy, n, FERRY_ERR_FORMAT, "key 'gpt-oss.attention.sliding_window' is missing");
    free(copy);
    free(buf);
}
