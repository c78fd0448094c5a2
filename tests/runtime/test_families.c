/* test_families — every family's layer program through the CPU engine on synthetic weights (model.h
 * model_init_synthetic, as `ferry bench --synthetic` builds them), against itself computed another way: the
 * last position's logits of a 23-token prompt prefilled in one step, in chunks of 7, and token by token must
 * agree (|a-b| <= 1e-4 max|a| + 1e-5, f32 KV cache). The chunks and single tokens read earlier positions
 * back from the KV cache, so rotary positions, the sliding windows (5 positions here, shorter than the
 * prompt) and the per-kind rotary bases must be consistent across steps. The tiny checkpoints of
 * tests/golden compare each family with transformers; this covers the synthetic path and the step splits.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/core/status.h"
#include "runtime/engine.h"

#define N_PROMPT 23

static struct llm_hparams shape(const char *arch)
{
    struct llm_hparams hp = {.n_vocab = 97,
                             .dim = 64,
                             .n_layers = 4,
                             .n_heads = 4,
                             .n_kv_heads = 2,
                             .head_dim = 32,
                             .ffn_dim = 96,
                             .ctx_train = 256,
                             .norm_eps = 1e-6f,
                             .rope_theta = 10000.0f,
                             .rope_dim = 32,
                             .rope_style = ROPE_STYLE_HALF};
    snprintf(hp.arch, sizeof hp.arch, "%s", arch);
    if (!strcmp(arch, "gemma3")) {
        hp.sliding_window = 5, hp.swa_pattern = 2, hp.rope_theta_swa = 500.0f;
        hp.embed_scale = 8.0f, hp.attn_scale = 0.2f;
    }
    if (!strcmp(arch, "phi3")) hp.sliding_window = 5, hp.rope_theta_swa = hp.rope_theta, hp.rope_dim = 24;
    return hp;
}

/* The last position's logits after feeding the prompt in steps of `chunk` tokens. */
static void run(struct engine *e, int chunk, float *logits)
{
    cr_assert_eq(engine_seq_free(e, 0), FERRY_OK);
    int32_t tok[N_PROMPT], pos[N_PROMPT], seq[N_PROMPT];
    uint8_t want[N_PROMPT];
    for (int i = 0; i < N_PROMPT; i++) tok[i] = (i * 37 + 11) % 97, pos[i] = i, seq[i] = 0;
    for (int i0 = 0; i0 < N_PROMPT; i0 += chunk) {
        const int n = N_PROMPT - i0 < chunk ? N_PROMPT - i0 : chunk;
        for (int i = 0; i < n; i++) want[i] = i0 + i == N_PROMPT - 1;
        struct batch b = {
            .n_tokens = n, .tokens = tok + i0, .pos = pos + i0, .seq = seq, .want_logits = want};
        cr_assert_eq(engine_step(e, &b, logits), FERRY_OK);
    }
}

static void check_family(const char *arch)
{
    struct llm_hparams hp = shape(arch);
    struct engine_params p = engine_default_params();
    p.backend = ENGINE_BACKEND_CPU;
    p.n_seqs = 1;
    p.ctx_size = 64;
    p.n_threads = 2;
    p.kv_type = KV_F32;
    struct engine *e = NULL;
    char err[256] = "";
    cr_assert_eq(engine_init_synthetic(&e, &hp, DTYPE_F32, &p, err), FERRY_OK, "%s: %s", arch, err);
    const int V = hp.n_vocab;
    float *a = malloc(sizeof(float) * V), *b = malloc(sizeof(float) * V);
    run(e, N_PROMPT, a);
    double maxa = 0;
    for (int v = 0; v < V; v++) {
        cr_assert(isfinite(a[v]), "%s: logit %d is %g", arch, v, a[v]);
        maxa = fmax(maxa, fabs(a[v]));
    }
    cr_assert_gt(maxa, 0.0, "%s: all logits zero", arch);
    static const int chunks[] = {7, 1};
    for (int c = 0; c < 2; c++) {
        run(e, chunks[c], b);
        for (int v = 0; v < V; v++)
            cr_assert(fabs((double)a[v] - b[v]) <= 1e-4 * maxa + 1e-5,
                      "%s, chunks of %d: logit %d is %g, one step %g", arch, chunks[c], v, b[v], a[v]);
    }
    free(a);
    free(b);
    engine_free(e);
}

Test(families, llama)
{
    check_family("llama");
}
Test(families, qwen3)
{
    check_family("qwen3");
}
Test(families, gemma3)
{
    check_family("gemma3");
}
Test(families, phi3)
{
    check_family("phi3");
}

/* The window matters: gemma3's logits with a window shorter than the prompt differ from the same weights with
 * every layer global (so the comparisons above are not blind to it). */
Test(families, gemma3_window_changes_the_result)
{
    struct llm_hparams hp = shape("gemma3"), full = hp;
    full.sliding_window = 0;
    struct engine_params p = engine_default_params();
    p.backend = ENGINE_BACKEND_CPU;
    p.n_seqs = 1;
    p.ctx_size = 64;
    p.n_threads = 2;
    p.kv_type = KV_F32;
    struct engine *e1 = NULL, *e2 = NULL;
    char err[256] = "";
    cr_assert_eq(engine_init_synthetic(&e1, &hp, DTYPE_F32, &p, err), FERRY_OK, "%s", err);
    cr_assert_eq(engine_init_synthetic(&e2, &full, DTYPE_F32, &p, err), FERRY_OK, "%s", err);
    float a[97], b[97];
    run(e1, N_PROMPT, a);
    run(e2, N_PROMPT, b);
    double d = 0;
    for (int v = 0; v < 97; v++) d = fmax(d, fabs((double)a[v] - b[v]));
    cr_assert_gt(d, 1e-3, "the window made no difference");
    engine_free(e1);
    engine_free(e2);
}
