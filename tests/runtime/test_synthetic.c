/* test_synthetic — the expert shapes of `ferry bench --synthetic` (runtime/synthetic.h) against the family's
 * loader and the published sizes:
 *  - the tiny test shapes load to the hyperparameters, rotary frequencies and per-layer views that model_init
 *    gives the tiny checkpoints of tests/golden/models they copy (qwen3moe_top2_f32, an HF directory;
 *    gptoss_yarn_mxfp4.gguf, a GGUF with MXFP4 experts), and their engine decodes finite logits on the CPU;
 *  - the real shapes' parameter counts and byte totals, computed without allocating, match the models'
 *    published counts (Qwen3-30B-A3B 30.5B; gpt-oss-20b 20.9B, gpt-oss-120b 116.8B, the model card) and the
 *    sizes of their GGUF files (a Q4_K_M file of Qwen3-30B-A3B's shape: 18.6 GB,
 *    tests/gpu/results/llamacpp-moe/meta.json; ggml-org's gpt-oss-20b and -120b MXFP4 files: 12.1 and 63.4
 * GB).
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/core/status.h"
#include "runtime/engine.h"
#include "runtime/synthetic.h"
#include "weights/arch/arch.h"

static int open_golden(const char *rel, struct model_file **mf)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/tests/golden/models/%s", getenv("FERRY_SRC") ? getenv("FERRY_SRC") : ".",
             rel);
    char err[256];
    const int rc = model_file_open(path, mf, NULL, NULL, err);
    if (rc) cr_skip_test("%s cannot be opened (%s)", path, err);
    return rc;
}

static void same_view(const struct wview *a, const struct wview *b, int l, const char *what, int types)
{
    cr_expect_eq(a->rows, b->rows, "layer %d %s rows %lld vs %lld", l, what, (long long)a->rows,
                 (long long)b->rows);
    cr_expect_eq(a->cols, b->cols, "layer %d %s cols", l, what);
    cr_expect_eq(!a->data, !b->data, "layer %d %s presence", l, what);
    if (types) cr_expect_eq(a->type, b->type, "layer %d %s type %d vs %d", l, what, a->type, b->type);
}

static void compare_with_file(const char *shape, const char *file, int types)
{
    struct model_file *mf = NULL;
    if (open_golden(file, &mf)) return;
    const struct synthetic_shape *sh = synthetic_shape_find(shape);
    cr_assert(sh, "no shape %s", shape);
    struct llm_hparams hp;
    int ftype;
    synthetic_hparams(sh, &hp, &ftype);
    const struct llm_hparams *f = &mf->hp;
    cr_expect(arch_of(&hp) == arch_of(f), "%s: family of %s vs the file's %s", shape, hp.arch, f->arch);
#define SAME(x) cr_expect(hp.x == f->x, "%s: " #x " %g vs file %g", shape, (double)hp.x, (double)f->x)
    SAME(n_vocab);
    SAME(dim);
    SAME(n_layers);
    SAME(n_heads);
    SAME(n_kv_heads);
    SAME(head_dim);
    SAME(ffn_dim);
    SAME(ctx_train);
    SAME(norm_eps);
    SAME(rope_theta);
    SAME(rope_dim);
    SAME(rope_style);
    SAME(tied_embeddings);
    SAME(qkv_bias);
    SAME(sliding_window);
    SAME(swa_pattern);
    SAME(rope_theta_swa);
    SAME(n_expert);
    SAME(n_expert_used);
    SAME(expert_ffn_dim);
    SAME(expert_norm_topk);
    SAME(swa_rope_scaled);
    SAME(swiglu_alpha);
    SAME(swiglu_limit);
    SAME(attn_scale);
    SAME(embed_scale);
    SAME(rope_scaling.type);
    SAME(rope_scaling.factor);
    SAME(rope_scaling.orig_ctx);
    SAME(rope_scaling.beta_fast);
    SAME(rope_scaling.beta_slow);
    SAME(rope_scaling.attn_factor);
    SAME(rope_scaling.truncate);
    SAME(rope_scaling.yarn_log_mul);
#undef SAME
    struct model a, b;
    char err[256];
    cr_assert_eq(model_init(&a, mf, err), FERRY_OK, "%s", err);
    cr_assert_eq(synthetic_model_init(&b, &hp, DTYPE_F32, ftype, 7, 1, err), FERRY_OK, "%s", err);
    for (int i = 0; i < hp.rope_dim / 2; i++) {
        cr_expect_float_eq(a.inv_freq[i], b.inv_freq[i], 1e-6f * a.inv_freq[i], "inv_freq[%d]", i);
        if (a.inv_freq_local)
            cr_expect_float_eq(a.inv_freq_local[i], b.inv_freq_local[i], 1e-6f, "local %d", i);
    }
    cr_expect_eq(!a.inv_freq_local, !b.inv_freq_local);
    same_view(&a.tok_embd, &b.tok_embd, -1, "token_embd", 0);
    same_view(&a.output, &b.output, -1, "output", 0);
    for (int l = 0; l < hp.n_layers; l++) {
        const struct model_layer *x = &a.layers[l], *y = &b.layers[l];
        same_view(&x->wq, &y->wq, l, "wq", 0);
        same_view(&x->wk, &y->wk, l, "wk", 0);
        same_view(&x->wv, &y->wv, l, "wv", 0);
        same_view(&x->wo, &y->wo, l, "wo", 0);
        same_view(&x->w_gate, &y->w_gate, l, "w_gate", 0);
        same_view(&x->router, &y->router, l, "router", 1);
        same_view(&x->exp_gate, &y->exp_gate, l, "exp_gate", types);
        same_view(&x->exp_up, &y->exp_up, l, "exp_up", types);
        same_view(&x->exp_down, &y->exp_down, l, "exp_down", types);
        const float *const va[] = {
            x->attn_norm,  x->ffn_norm, x->q_norm,     x->k_norm,         x->bq,
            x->bk,         x->bv,       x->bo,         x->attn_sinks,     x->router_b,
            x->exp_gate_b, x->exp_up_b, x->exp_down_b, x->post_attn_norm, x->post_ffn_norm};
        const float *const vb[] = {
            y->attn_norm,  y->ffn_norm, y->q_norm,     y->k_norm,         y->bq,
            y->bk,         y->bv,       y->bo,         y->attn_sinks,     y->router_b,
            y->exp_gate_b, y->exp_up_b, y->exp_down_b, y->post_attn_norm, y->post_ffn_norm};
        for (size_t i = 0; i < sizeof va / sizeof va[0]; i++)
            cr_expect_eq(!va[i], !vb[i], "layer %d vector %zu presence", l, i);
    }
    cr_expect_eq(b.weight_bytes > 0, 1);
    model_free(&a);
    model_free(&b);
    model_file_close(mf);
}

Test(synthetic, qwen3moe_shape_is_the_loaders)
{
    compare_with_file("test-qwen3moe", "qwen3moe_top2_f32", 0);
}

Test(synthetic, gptoss_shape_is_the_loaders)
{
    compare_with_file("test-gpt-oss", "gptoss_yarn_mxfp4.gguf", 1);
}

/* The tiny shapes through the CPU engine: a prompt, then decode steps of two sequences, finite logits that
 * differ between sequences. */
static void decode(const char *shape)
{
    struct llm_hparams hp;
    int ftype;
    synthetic_hparams(synthetic_shape_find(shape), &hp, &ftype);
    struct engine_params p = engine_default_params();
    p.backend = ENGINE_BACKEND_CPU;
    p.n_threads = 1, p.n_seqs = 2, p.ctx_size = 64, p.max_batch_tokens = 16;
    struct engine *e = NULL;
    char err[256];
    cr_assert_eq(engine_init_synthetic_mix(&e, &hp, DTYPE_F16, ftype, &p, err), FERRY_OK, "%s", err);
    const int V = hp.n_vocab;
    float *logits = malloc((size_t)16 * V * sizeof(float));
    int32_t tok[16], pos[16], seq[16];
    uint8_t want[16];
    for (int i = 0; i < 16; i++)
        tok[i] = (i * 31 + 5) % V, pos[i] = i % 8, seq[i] = i / 8, want[i] = i % 8 == 7;
    struct batch b = {.n_tokens = 16, .tokens = tok, .pos = pos, .seq = seq, .want_logits = want};
    cr_assert_eq(engine_step(e, &b, logits), FERRY_OK);
    for (int step = 0; step < 3; step++) {
        for (int s = 0; s < 2; s++)
            tok[s] = (step * 7 + s * 3) % V, pos[s] = 8 + step, seq[s] = s, want[s] = 1;
        b.n_tokens = 2;
        cr_assert_eq(engine_step(e, &b, logits), FERRY_OK);
        double diff = 0;
        for (int i = 0; i < V; i++) {
            cr_assert(isfinite(logits[i]) && isfinite(logits[V + i]), "%s: logit %d not finite", shape, i);
            diff += fabs(logits[i] - logits[V + i]);
        }
        cr_expect_gt(diff, 0.0, "%s: two sequences gave the same logits", shape);
    }
    free(logits);
    engine_free(e);
}

Test(synthetic, qwen3moe_decodes)
{
    decode("test-qwen3moe");
}

Test(synthetic, gptoss_decodes)
{
    decode("test-gpt-oss");
}

static struct synthetic_bytes sizes(const char *shape)
{
    struct llm_hparams hp;
    int ftype;
    synthetic_hparams(synthetic_shape_find(shape), &hp, &ftype);
    struct synthetic_bytes s;
    char err[256];
    cr_assert_eq(synthetic_bytes(&hp, DTYPE_BF16, ftype, &s, err), FERRY_OK, "%s", err);
    cr_log_info("%s: %.3fB parameters (%.3fB in experts), %.3f GB (%.3f GB of experts)", shape,
                s.n_params / 1e9, s.n_expert_params / 1e9, s.total / 1e9, s.experts / 1e9);
    return s;
}

static void near(double got, double want, double tol, const char *what)
{
    cr_expect(fabs(got - want) <= tol * want, "%s: %.4g, expected %.4g within %.0f%%", what, got, want,
              tol * 100);
}

Test(synthetic, real_shapes_sizes)
{
    const struct synthetic_bytes q = sizes("qwen3-30b-a3b");
    near((double)q.n_params, 30.53e9, 0.01, "qwen3-30b-a3b parameters");
    near((double)q.n_expert_params, 48.0 * 128 * 3 * 2048 * 768, 1e-9, "qwen3-30b-a3b expert parameters");
    near((double)q.total, 18.6e9, 0.02, "qwen3-30b-a3b Q4_K_M bytes");
    near((double)q.experts, 17.0e9, 0.05, "qwen3-30b-a3b expert bytes");
    const struct synthetic_bytes g = sizes("gpt-oss-20b");
    near((double)g.n_params, 20.91e9, 0.01, "gpt-oss-20b parameters");
    /* MXFP4: 17 bytes per 32 weights */
    cr_expect_eq(g.experts, (uint64_t)24 * 32 * 3 * 2880 * 2880 / 32 * 17, "gpt-oss-20b expert bytes");
    near((double)g.total, 12.1e9, 0.03, "gpt-oss-20b bytes");
    const struct synthetic_bytes h = sizes("gpt-oss-120b");
    near((double)h.n_params, 116.83e9, 0.01, "gpt-oss-120b parameters");
    cr_expect_eq(h.experts, (uint64_t)36 * 128 * 3 * 2880 * 2880 / 32 * 17, "gpt-oss-120b expert bytes");
    near((double)h.total, 63.4e9, 0.03, "gpt-oss-120b bytes");
}
