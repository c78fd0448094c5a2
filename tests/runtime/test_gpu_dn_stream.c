/* test_gpu_dn_stream — a model with gated DeltaNet layers streamed under a budget on the CUDA engine: the
 * tiny Qwen3.5 golden model (layers 0-2 DeltaNet, 3 gated attention) with its layers in host memory, each
 * recurrent layer's in- and out-projections crossing the link as two pieces of its block while its state
 * stays on the device.
 *
 * References: the CPU engine (the same bound as the other CUDA end-to-end tests: |gpu - cpu| <= 1e-2
 * max|cpu| + 1e-3 per row of logits), and the all-resident CUDA engine, which runs the same kernels on the
 * same rows: every streamed plan's logits are bitwise its own. Workloads: one sequence whose prompt is
 * shorter (7) and longer (40) than the 16 rows the DeltaNet rule takes token by token, then decode steps;
 * three sequences whose prompts go in one step, then decode steps of all three (each row over its own slot's
 * state). Plans: every layer streamed through the planner's ring and through rings of one and two layers,
 * one and two layers resident, and the planner's own plan at the minimum budget an over-small one names.
 * Host layers stream (--placement stream, and auto falls back to streaming: no layer of such a model is
 * computed by the host's cores). Expert models keep every layer's block resident (their experts are what
 * moves), so Qwen3.5-MoE and Qwen3-Next are not streamed here. Skips without a CUDA device.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/core/status.h"
#include "kernels/cuda/ops.h"
#include "runtime/engine.h"

#define MODEL "tests/golden/models/qwen35_deltanet_f16.gguf"
#define STEPS 10
#define MAX_B 3

static struct model_file *open_golden(void)
{
    if (kern_cuda_device_count() <= 0) cr_skip_test("no CUDA device: the streamed DeltaNet tests need one");
    char path[1024], err[256] = "";
    snprintf(path, sizeof path, "%s/%s", getenv("FERRY_SRC"), MODEL);
    struct model_file *mf = NULL;
    if (model_file_open(path, &mf, NULL, NULL, err))
        cr_skip_test("missing %s (tests/golden/make_qwen35_golden.py writes it): %s", path, err);
    return mf;
}

/* An engine's parameters: n_seqs slots of 256 positions and a pool of as many, host layers streamed. */
static struct engine_params params(enum engine_backend be, int n_seqs)
{
    struct engine_params p = engine_default_params();
    p.backend = be;
    p.n_seqs = n_seqs;
    p.ctx_size = 256;
    p.kv_tokens = 256 * n_seqs;
    p.max_batch_tokens = 128;
    p.placement = ENGINE_PLACEMENT_STREAM;
    p.n_threads = 2;
    return p;
}

static struct engine *engine_of(struct model_file *mf, const struct engine_params *p)
{
    struct engine *e = NULL;
    char err[256] = "";
    cr_assert_eq(engine_init(&e, mf, p, err), FERRY_OK, "engine_init: %s", err);
    return e;
}

/* The workload: B sequences, sequence s with a prompt of prompt[s] tokens, all prompts in one step, then
 * STEPS decode steps of all B; each step's logits of each sequence (its last prompt row, then its token) to
 * out ((STEPS + 1) * B rows of V). Tokens from a formula, the same on every engine. */
static void run(struct engine *e, int B, const int *prompt, float *out)
{
    const int V = engine_hparams(e)->n_vocab;
    int32_t tok[256], pos[256], seq[256];
    uint8_t want[256];
    int n = 0;
    for (int s = 0; s < B; s++)
        for (int i = 0; i < prompt[s]; i++, n++)
            tok[n] = (int32_t)((i * 31 + 7 * s + 3) % V), pos[n] = i, seq[n] = s,
            want[n] = i == prompt[s] - 1;
    struct batch b = {.n_tokens = n, .tokens = tok, .pos = pos, .seq = seq, .want_logits = want};
    cr_assert_eq(engine_step(e, &b, out), FERRY_OK);
    for (int k = 1; k <= STEPS; k++) {
        for (int s = 0; s < B; s++)
            tok[s] = (int32_t)((k * 11 + 5 * s + 1) % V), pos[s] = prompt[s] + k - 1, seq[s] = s, want[s] = 1;
        b.n_tokens = B;
        cr_assert_eq(engine_step(e, &b, out + (size_t)k * B * V), FERRY_OK);
    }
    for (int s = 0; s < B; s++) engine_seq_free(e, s);
}

/* Every row of got within the bound of ref's. */
static void expect_close(const char *what, const float *ref, const float *got, int rows, int V)
{
    double worst_rel = 0;
    for (int r = 0; r < rows; r++) {
        double maxref = 0, worst = 0;
        for (int v = 0; v < V; v++) {
            const double a = ref[(size_t)r * V + v], g = got[(size_t)r * V + v];
            maxref = fmax(maxref, fabs(a));
            worst = isfinite(g) ? fmax(worst, fabs(a - g)) : INFINITY;
        }
        cr_expect_leq(worst, 1e-2 * maxref + 1e-3, "%s: row %d: |gpu - cpu| = %g of max %g", what, r, worst,
                      maxref);
        worst_rel = fmax(worst_rel, worst / (maxref + 1e-30));
    }
    fprintf(stderr, "%s: worst |gpu - cpu| %.3g of the row's largest logit\n", what, worst_rel);
}

struct plan {
    const char *what;
    int gpu_layers, ring_layers;
};
static const struct plan plans[] = {
    {"all streamed", 0, 0},
    {"all streamed, a ring of one layer", 0, 1},
    {"all streamed, a ring of two layers", 0, 2},
    {"layer 0 resident", 1, 0},
    {"layers 0 and 2 resident, a ring of three", 2, 3},
};

/* The workload on the CPU, all resident on the GPU, and under each streamed plan: within the bound of the
 * CPU's, bitwise the all-resident GPU's; the streamed plans stream every host layer's pieces (the DeltaNet
 * ones among them: more bytes per step than the FFNs and attention matrices alone). */
static void streamed_plans(int B, const int *prompt)
{
    struct model_file *mf = open_golden();
    struct engine_params p = params(ENGINE_BACKEND_CPU, B);
    struct engine *cpu = engine_of(mf, &p);
    const int V = engine_hparams(cpu)->n_vocab, L = engine_hparams(cpu)->n_layers, rows = (STEPS + 1) * B;
    const size_t bytes = (size_t)rows * V * sizeof(float);
    float *ref = malloc(bytes), *res = malloc(bytes), *got = malloc(bytes);
    run(cpu, B, prompt, ref);
    engine_free(cpu);
    p.backend = ENGINE_BACKEND_CUDA;
    p.gpu_layers = -1;
    struct engine *gpu = engine_of(mf, &p);
    struct engine_stats st;
    engine_get_stats(gpu, &st);
    cr_assert_eq(st.n_streamed, 0, "the golden model fits the device");
    run(gpu, B, prompt, res);
    engine_free(gpu);
    char what[160];
    snprintf(what, sizeof what, "%d sequence(s), all resident", B);
    expect_close(what, ref, res, rows, V);
    for (size_t i = 0; i < sizeof plans / sizeof plans[0]; i++) {
        p.gpu_layers = plans[i].gpu_layers;
        p.ring_layers = plans[i].ring_layers;
        gpu = engine_of(mf, &p);
        engine_get_stats(gpu, &st);
        cr_assert_eq(st.n_streamed, L - plans[i].gpu_layers, "%s: %d layers streamed", plans[i].what,
                     st.n_streamed);
        for (int k = 0; k < rows * V; k++) got[k] = NAN;
        run(gpu, B, prompt, got);
        engine_get_stats(gpu, &st);
        cr_assert_gt(st.bytes_streamed, 0, "%s: nothing streamed", plans[i].what);
        snprintf(what, sizeof what, "%d sequence(s), %s", B, plans[i].what);
        expect_close(what, ref, got, rows, V);
        cr_assert_eq(memcmp(res, got, bytes), 0, "%s: logits differ from the all-resident engine's", what);
        engine_free(gpu);
    }
    free(ref);
    free(res);
    free(got);
    model_file_close(mf);
}

Test(gpu_dn_stream, one_sequence_short_prompt)
{
    streamed_plans(1, (const int[]){7});
}

Test(gpu_dn_stream, one_sequence_prompt_past_the_token_rule)
{
    streamed_plans(1, (const int[]){40});
}

Test(gpu_dn_stream, three_sequences_batched)
{
    streamed_plans(3, (const int[]){10, 23, 5});
}

/* The minimum a refused budget names is a budget that works: under 1 MiB the engine refuses, naming it (the
 * first refusal loads the CUDA runtime's modules and cuBLAS, the second names the minimum as a later start
 * measures them); at that budget (--placement auto) it starts with layers streamed, and runs the three
 * sequences within the CPU's bound and bitwise as all resident. */
Test(gpu_dn_stream, the_minimum_budget_works)
{
    struct model_file *mf = open_golden();
    const int B = 3, prompt[] = {12, 30, 4};
    struct engine_params p = params(ENGINE_BACKEND_CPU, B);
    struct engine *e = engine_of(mf, &p);
    const int V = engine_hparams(e)->n_vocab, rows = (STEPS + 1) * B;
    const size_t bytes = (size_t)rows * V * sizeof(float);
    float *ref = malloc(bytes), *res = malloc(bytes), *got = malloc(bytes);
    run(e, B, prompt, ref);
    engine_free(e);
    p.backend = ENGINE_BACKEND_CUDA;
    e = engine_of(mf, &p);
    run(e, B, prompt, res);
    engine_free(e);
    p.placement = ENGINE_PLACEMENT_AUTO;
    p.gpu_memory = 1 << 20;
    char err[256] = "";
    double least = 0;
    char unit[8] = "";
    for (int k = 0; k < 2; k++) {
        e = NULL;
        cr_assert_eq(engine_init(&e, mf, &p, err), FERRY_ERR_DEVICE_MEM, "1 MiB: %s", err);
        double b;
        char ub[8];
        cr_assert_eq(
            sscanf(err, "GPU budget %lf %3s is too small: the minimum is %lf %3s", &b, ub, &least, unit), 4,
            "%s", err);
        cr_assert_lt(b * (strcmp(ub, "GiB") ? 1 : 1024), least * (strcmp(unit, "GiB") ? 1 : 1024), "%s", err);
    }
    fprintf(stderr, "refused: %s\n", err);
    p.gpu_memory = (int64_t)(least * (strcmp(unit, "GiB") ? 1048576.0 : 1073741824.0));
    e = engine_of(mf, &p);
    struct engine_stats st;
    engine_get_stats(e, &st);
    fprintf(stderr, "at %lld bytes: %d layers resident, %d streamed\n%s", (long long)p.gpu_memory,
            st.n_resident, st.n_streamed, engine_placement(e));
    cr_assert_gt(st.n_streamed, 0, "the minimum budget streams layers");
    cr_assert_leq(st.vram_planned, (uint64_t)p.gpu_memory);
    cr_assert(strstr(engine_placement(e), "always stream"), "%s", engine_placement(e));
    for (int k = 0; k < rows * V; k++) got[k] = NAN;
    run(e, B, prompt, got);
    engine_free(e);
    expect_close("three sequences at the minimum budget", ref, got, rows, V);
    cr_assert_eq(memcmp(res, got, bytes), 0, "at the minimum budget: logits differ from all resident");
    free(ref);
    free(res);
    free(got);
    model_file_close(mf);
}
