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
 * Host layers stream (--placement stream: the recurrent ones stream-only, their state on the device).
 * Recurrent host layers computed by the host's cores instead (--placement cpu and auto: CPU-only, their
 * state in the engine's host memory, the device keeping the resident ones' state): logits within the CUDA
 * bound of the all-resident engine's and the CPU's, its greedy tokens wherever its top two logits are apart
 * by more than the bound, with the attention layer on the CPU or streamed step by step, and a slot sent back
 * to a checkpoint (state restored on both sides) continuing as the all-resident engine's does. Expert models
 * keep every layer's block resident (their experts are what moves), so Qwen3.5-MoE and Qwen3-Next are not
 * streamed here. Skips without a CUDA device.
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
 * measures them); at that budget (--placement stream) it starts with layers streamed, and runs the three
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

/* ----------------------------------------------------------------------------------------------------------
 */
/* Recurrent host layers on the host's cores */

/* got within the CUDA bound of ref row by row, and its greedy token ref's wherever ref's top two logits are
 * further apart than the bound (nearer ones may swap within it). */
static void expect_same_greedy(const char *what, const float *ref, const float *got, int rows, int V)
{
    expect_close(what, ref, got, rows, V);
    for (int r = 0; r < rows; r++) {
        const float *a = ref + (size_t)r * V, *g = got + (size_t)r * V;
        int ia = 0, ig = 0;
        double maxref = 0;
        for (int v = 0; v < V; v++) {
            if (a[v] > a[ia]) ia = v;
            if (g[v] > g[ig]) ig = v;
            maxref = fmax(maxref, fabs(a[v]));
        }
        double second = -INFINITY;
        for (int v = 0; v < V; v++)
            if (v != ia && a[v] > second) second = a[v];
        if (a[ia] - second > 2 * (1e-2 * maxref + 1e-3))
            cr_expect_eq(ig, ia, "%s: row %d: greedy token %d, all resident %d", what, r, ig, ia);
    }
}

struct host_plan {
    const char *what;
    enum engine_placement placement;
    int gpu_layers;
    const char *override; /* engine_params.plan_override, or NULL */
};
/* The golden model: layers 0-2 recurrent, 3 gated attention. */
static const struct host_plan host_plans[] = {
    {"--placement cpu, every layer on the host's cores", ENGINE_PLACEMENT_CPU, 0, NULL},
    {"--placement cpu, layer 0 resident", ENGINE_PLACEMENT_CPU, 1, NULL},
    /* the attention layer streams at one token and is computed by the host at more, the recurrent ones are
     * the host's at every size; then the first recurrent layer resident beside them */
    {"forced: recurrent on the host's cores, attention by step size", ENGINE_PLACEMENT_AUTO, -1, "cccs/cccc"},
    {"forced: layer 0 resident, 1-2 on the host's cores, attention by step size", ENGINE_PLACEMENT_AUTO, -1,
     "gccc/gccs"},
};

/* The workload of run() under each plan whose recurrent host layers the host's cores compute: within the
 * CUDA bound of the all-resident engine (and of the CPU engine), its greedy tokens, the map naming them. */
static void host_plans_run(int B, const int *prompt)
{
    struct model_file *mf = open_golden();
    struct engine_params p = params(ENGINE_BACKEND_CPU, B);
    struct engine *e = engine_of(mf, &p);
    const int V = engine_hparams(e)->n_vocab, rows = (STEPS + 1) * B;
    const size_t bytes = (size_t)rows * V * sizeof(float);
    float *ref = malloc(bytes), *res = malloc(bytes), *got = malloc(bytes);
    run(e, B, prompt, ref);
    engine_free(e);
    p.backend = ENGINE_BACKEND_CUDA;
    p.cpu_int8 = 0; /* the host's products in f32, as the other hybrid tests take them (test_gpu_e2e.c) */
    e = engine_of(mf, &p);
    run(e, B, prompt, res);
    engine_free(e);
    for (size_t i = 0; i < sizeof host_plans / sizeof host_plans[0]; i++) {
        const struct host_plan *hp = &host_plans[i];
        p.placement = hp->placement;
        p.gpu_layers = hp->gpu_layers;
        p.plan_override = hp->override;
        e = engine_of(mf, &p);
        struct engine_stats st;
        engine_get_stats(e, &st);
        cr_assert_gt(st.n_streamed, 0, "%s: no layer in host memory", hp->what);
        cr_assert(strstr(engine_placement(e), "are computed by the host's cores on every step"), "%s:\n%s",
                  hp->what, engine_placement(e));
        cr_assert_null(strstr(engine_placement(e), "always stream"), "%s:\n%s", hp->what,
                       engine_placement(e));
        for (int k = 0; k < rows * V; k++) got[k] = NAN;
        run(e, B, prompt, got);
        engine_get_stats(e, &st);
        cr_assert_geq(st.cpu_layers_run, (uint64_t)(STEPS + 1) * 2, "%s: the host's cores ran %llu layers",
                      hp->what, (unsigned long long)st.cpu_layers_run);
        char what[200];
        snprintf(what, sizeof what, "%d sequence(s), %s, against the CPU", B, hp->what);
        expect_close(what, ref, got, rows, V);
        snprintf(what, sizeof what, "%d sequence(s), %s, against all resident", B, hp->what);
        expect_same_greedy(what, res, got, rows, V);
        engine_free(e);
    }
    free(ref);
    free(res);
    free(got);
    model_file_close(mf);
}

Test(gpu_dn_stream, recurrent_host_layers_one_sequence)
{
    host_plans_run(1, (const int[]){40});
}

Test(gpu_dn_stream, recurrent_host_layers_three_sequences)
{
    host_plans_run(3, (const int[]){10, 23, 5});
}

/* Checkpoints across both sides: layer 0 resident (its state on the device), layers 1-2 on the host's cores
 * (theirs in host memory). Slot 0's prompt of 48 goes in chunks of 16 (a checkpoint where each ends), four
 * decode steps follow, then the slot goes back to 32 (engine_seq_keep: the device's state uploaded, the
 * host's restored in place) and takes other tokens from there; slot 1 runs beside it throughout. Every
 * step's logits within the CUDA bound of the all-resident engine doing the same. */
Test(gpu_dn_stream, recurrent_host_layers_checkpoint_restore)
{
    struct model_file *mf = open_golden();
    struct engine_params p = params(ENGINE_BACKEND_CUDA, 2);
    p.cpu_int8 = 0; /* (as host_plans_run) */
    struct engine *e[2];
    e[0] = engine_of(mf, &p);
    p.placement = ENGINE_PLACEMENT_AUTO;
    p.plan_override = "gccc/gccs";
    e[1] = engine_of(mf, &p);
    cr_assert(strstr(engine_placement(e[1]), "are computed by the host's cores on every step"), "%s",
              engine_placement(e[1]));
    const int V = engine_hparams(e[0])->n_vocab;
    enum { ROWS = 24 };
    float *out[2] = {malloc(sizeof(float) * ROWS * (size_t)V), malloc(sizeof(float) * ROWS * (size_t)V)};
    int32_t tok[32], pos[32], seq[32];
    uint8_t want[32];
    int len[2] = {0, 0}, row = 0;
    /* steps: 3 prompt chunks of slot 0 beside slot 1's decode, 4 decode steps, the rewind, 3 more */
    for (int step = 0; step < 10; step++) {
        if (step == 7)
            for (int k = 0; k < 2; k++) {
                cr_assert_eq(engine_seq_keep(e[k], 0, 32), 32, "engine %d: back to the checkpoint at 32", k);
            }
        if (step == 7) len[0] = 32;
        int n = 0;
        for (int k = 0; k < 2; k++) { /* slot 1's decode row first, as the scheduler orders them */
            const int s = 1 - k, rows = s == 0 && step < 3 ? 16 : 1;
            for (int i = 0; i < rows; i++, n++) {
                pos[n] = len[s] + i, seq[n] = s, want[n] = i == rows - 1;
                tok[n] = (int32_t)((pos[n] * 29 + 13 * s + (step >= 7 ? 17 : 0) + 1) % V);
            }
            len[s] += rows;
        }
        const struct batch b = {.n_tokens = n, .tokens = tok, .pos = pos, .seq = seq, .want_logits = want};
        for (int k = 0; k < 2; k++) cr_assert_eq(engine_step(e[k], &b, out[k] + (size_t)row * V), FERRY_OK);
        row += 2;
    }
    expect_same_greedy("checkpoints: layer 0 resident, 1-2 on the host's cores", out[0], out[1], row, V);
    for (int k = 0; k < 2; k++) engine_free(e[k]);
    free(out[0]);
    free(out[1]);
    model_file_close(mf);
}
