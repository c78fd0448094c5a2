/* test_gpu_swa — the CUDA engine's pool for sliding-window layers (runtime/engine.h engine_params.swa_full,
 * runtime/forward_cuda.h forward_cuda_params.kv_swa), on the tiny committed checkpoints with windows
 * (gemma3 16 positions on 2 of every 3 layers; gpt-oss 16 with sinks on every other layer, and experts;
 * phi3 24 on every layer, heads of 16; gemma4 16, and 12 with KV-sharing layers). Three slots are fed far
 * past their windows: prompts in chunks, then steps of every slot's decode row with another slot's prompt
 * chunk after them, and a rollback as a rejected draft makes. At every step:
 *   - the CUDA engine with the window pool gives logits bitwise equal to the CUDA engine that keeps every
 *     position (--swa-full, the pool of every layer as before): the window pool gives back only positions no
 *     kernel reads, and both read the same f16 values through their own block tables;
 *   - its logits are within the CUDA bound of the CPU engine's (which keeps its own window pool):
 *     |gpu - cpu| <= 1e-2 * max|cpu| + 1e-3 per row (3e-2 for a bf16 checkpoint; gpt-oss's routers: bitwise
 *     against --swa-full only, see there);
 *   - its window pool's tables are the CPU engine's, entry for entry (one bookkeeping for both backends), and
 *     a slot holds at most its bound of blocks.
 * Then the same with layers in host memory: streamed through the ring (bitwise equal to all resident) and
 * computed by the host's cores (their attention runs on the device's window pool; within the bound of the
 * CPU engine). Skips without a GPU (CI).
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/core/status.h"
#include "kernels/cuda/ops.h"
#include "runtime/engine.h"
#include "runtime/kv_cache.h"

#define CTX   320
#define ROWS  32 /* max_batch_tokens */
#define SEQS  3
#define MAX_E 4

static void require_gpu(void)
{
    if (kern_cuda_device_count() <= 0) cr_skip_test("no CUDA device: the GPU window-pool tests need one");
}

/* How an engine's rows are held to the others'. */
enum cmp { CMP_NONE, CMP_CPU_BOUND, CMP_BITWISE };

struct run {
    struct engine *e;
    const char *name;
    enum cmp cmp;
};

struct suite {
    struct model_file *mf;
    struct run r[MAX_E]; /* r[0] the CPU engine (the reference), r[1] the CUDA engine with the window pool */
    int n, V;
    double rel_tol;
    float *out[MAX_E]; /* (ROWS + SEQS, V) each engine's rows of the step */
};

static struct engine *make(struct model_file *mf, enum engine_backend be, int swa_full, int gpu_layers,
                           enum engine_placement placement)
{
    struct engine_params p = engine_default_params(); /* the CPU's KV cache in f16, as the GPU's */
    p.backend = be;
    p.n_seqs = SEQS;
    p.ctx_size = CTX;
    p.n_threads = 2;
    p.max_batch_tokens = ROWS;
    p.swa_full = swa_full;
    p.gpu_layers = gpu_layers;
    p.placement = placement;
    struct engine *e = NULL;
    char err[256] = "";
    cr_assert_eq(engine_init(&e, mf, &p, err), FERRY_OK, "engine_init: %s", err);
    return e;
}

static void open_suite(struct suite *t, const char *name, double rel_tol)
{
    char path[1024], err[256] = "";
    snprintf(path, sizeof path, "%s/tests/golden/models/%s", getenv("FERRY_SRC"), name);
    memset(t, 0, sizeof *t);
    if (model_file_open(path, &t->mf, NULL, NULL, err)) cr_skip_test("%s is missing (%s)", path, err);
    const char *lacks = engine_cuda_lacks(&t->mf->hp);
    if (lacks) {
        model_file_close(t->mf);
        cr_skip_test("%s: the CUDA backend has no kernels for %s", name, lacks);
    }
    t->rel_tol = rel_tol;
    t->r[t->n++] =
        (struct run){make(t->mf, ENGINE_BACKEND_CPU, 0, -1, ENGINE_PLACEMENT_AUTO), "cpu", CMP_NONE};
    t->r[t->n++] = (struct run){make(t->mf, ENGINE_BACKEND_CUDA, 0, -1, ENGINE_PLACEMENT_STREAM),
                                "cuda window", CMP_CPU_BOUND};
    t->V = engine_hparams(t->r[0].e)->n_vocab;
    const struct kv_cache *cw = engine_kv_cache(t->r[0].e, 1), *gw = engine_kv_cache(t->r[1].e, 1);
    cr_assert_not_null(cw, "%s: the CPU engine has no window pool", name);
    cr_assert_not_null(gw, "%s: the CUDA engine has no window pool", name);
    cr_assert_eq(gw->n_layers, cw->n_layers);
    cr_assert_eq(gw->n_blocks, cw->n_blocks, "%s: the pools are sized alike", name);
    cr_assert_eq(engine_kv_cache(t->r[1].e, 0)->n_layers + gw->n_layers,
                 engine_kv_cache(t->r[0].e, 0)->n_layers + cw->n_layers);
    for (int i = 0; i < MAX_E; i++) t->out[i] = malloc((size_t)(ROWS + SEQS) * t->V * sizeof(float));
}

static void add_run(struct suite *t, struct engine *e, const char *name, enum cmp cmp)
{
    cr_assert_lt(t->n, MAX_E);
    t->r[t->n++] = (struct run){e, name, cmp};
}

static void close_suite(struct suite *t)
{
    for (int i = 0; i < t->n; i++) engine_free(t->r[i].e);
    for (int i = 0; i < MAX_E; i++) free(t->out[i]);
    model_file_close(t->mf);
}

static int32_t token_at(const struct suite *t, int seq, int pos)
{
    return (int32_t)((pos * 37 + seq * 101 + 11) % t->V);
}

/* The window pool's tables of engine e equal the CPU engine's, entry for entry. */
static void check_tables(const struct suite *t, const struct engine *e, const char *name, int step)
{
    const struct kv_cache *a = engine_kv_cache(t->r[0].e, 1), *b = engine_kv_cache(e, 1);
    cr_assert_eq(b->n_free, a->n_free, "%s: step %d: %d free window blocks, the CPU engine %d", name, step,
                 b->n_free, a->n_free);
    for (int s = 0; s < SEQS; s++) {
        cr_assert_eq(b->n_held[s], a->n_held[s], "%s: step %d slot %d", name, step, s);
        cr_assert_eq(b->lo[s], a->lo[s], "%s: step %d slot %d", name, step, s);
    }
    cr_assert_eq(memcmp(a->block_table, b->block_table, (size_t)SEQS * a->max_blocks * sizeof(int32_t)), 0,
                 "%s: step %d: the window pool's block tables differ from the CPU engine's", name, step);
}

/* One step of n rows to every engine, its n_out rows of logits compared. */
static void step_all(struct suite *t, const int32_t *tok, const int32_t *pos, const int32_t *seq,
                     const uint8_t *want, int n, int step)
{
    struct batch b = {.n_tokens = n,
                      .tokens = (int32_t *)tok,
                      .pos = (int32_t *)pos,
                      .seq = (int32_t *)seq,
                      .want_logits = (uint8_t *)want};
    int n_out = 0;
    for (int i = 0; i < n; i++) n_out += want[i] != 0;
    for (int k = 0; k < t->n; k++)
        cr_assert_eq(engine_step(t->r[k].e, &b, t->out[k]), FERRY_OK, "%s: step %d", t->r[k].name, step);
    const int V = t->V;
    for (int k = 1; k < t->n; k++) {
        if (t->r[k].cmp == CMP_BITWISE) {
            cr_assert_eq(memcmp(t->out[k], t->out[1], (size_t)n_out * V * sizeof(float)), 0,
                         "%s: step %d: logits differ from %s", t->r[k].name, step, t->r[1].name);
            continue;
        }
        if (t->r[k].cmp != CMP_CPU_BOUND) continue;
        for (int r = 0; r < n_out; r++) {
            const float *a = t->out[0] + (size_t)r * V, *g = t->out[k] + (size_t)r * V;
            double maxref = 0, worst = 0;
            for (int v = 0; v < V; v++) {
                maxref = fmax(maxref, fabs(a[v]));
                worst = fmax(worst, fabs((double)a[v] - g[v]));
            }
            const double bound = t->rel_tol * maxref + 1e-3;
            cr_expect_leq(worst, bound, "%s: step %d row %d: |gpu-cpu| = %g > %g", t->r[k].name, step, r,
                          worst, bound);
        }
    }
    for (int k = 1; k < t->n; k++)
        if (engine_kv_cache(t->r[k].e, 1)) check_tables(t, t->r[k].e, t->r[k].name, step);
}

/* The schedule: slot 0's prompt of 100 and slot 1's of 70 in chunks of ROWS; then 200 steps of both slots'
 * decode rows, with slot 2's prompt of 90 going in chunks of 9 after them from step 20 and its decode row
 * joining once that is done; at step 120 slot 0 drafts 6 rows, keeps 2 of them, and goes on. */
static void run_schedule(struct suite *t)
{
    int32_t tok[ROWS + SEQS], pos[ROWS + SEQS], seq[ROWS + SEQS];
    uint8_t want[ROWS + SEQS];
    int len[SEQS] = {0, 0, 0}, step = 0;
    const int prompt[SEQS] = {100, 70, 90};
    for (int s = 0; s < 2; s++)
        while (len[s] < prompt[s]) {
            int n = 0;
            for (; n < ROWS && len[s] < prompt[s]; n++, len[s]++)
                tok[n] = token_at(t, s, len[s]), pos[n] = len[s], seq[n] = s, want[n] = 0;
            want[n - 1] = 1;
            step_all(t, tok, pos, seq, want, n, step++);
        }
    for (int k = 0; k < 200; k++) {
        int n = 0;
        for (int s = 0; s < SEQS; s++) /* the decode rows: one per slot whose prompt is in */
            if (len[s] >= prompt[s])
                tok[n] = token_at(t, s, len[s]), pos[n] = len[s]++, seq[n] = s, want[n++] = 1;
        if (k >= 20 && len[2] < prompt[2]) { /* slot 2's prompt chunk after them */
            for (int i = 0; i < 9 && len[2] < prompt[2]; i++)
                tok[n] = token_at(t, 2, len[2]), pos[n] = len[2]++, seq[n] = 2, want[n++] = 0;
            want[n - 1] = 1;
        }
        step_all(t, tok, pos, seq, want, n, step++);
        if (k == 120) { /* a draft of 6 rows of slot 0, 2 of them kept (speculative decoding's rollback) */
            int m = 0;
            for (; m < 6; m++)
                tok[m] = (token_at(t, 0, len[0] + m) + 1) % t->V, pos[m] = len[0] + m, seq[m] = 0,
                want[m] = 1;
            step_all(t, tok, pos, seq, want, m, step++);
            len[0] += 2;
            for (int e = 0; e < t->n; e++) {
                cr_assert_eq(engine_seq_reusable(t->r[e].e, 0, len[0]), len[0], "%s", t->r[e].name);
                cr_assert_eq(engine_seq_keep(t->r[e].e, 0, len[0]), len[0], "%s", t->r[e].name);
            }
        }
    }
    /* Every slot went past several windows, and the window pool gave blocks back. */
    const struct kv_cache *gw = engine_kv_cache(t->r[1].e, 1);
    const int window = engine_hparams(t->r[1].e)->sliding_window;
    const int bound = (window - 1 + ENGINE_SWA_SLACK + ROWS + ENGINE_KV_BLOCK - 1) / ENGINE_KV_BLOCK + 1;
    for (int s = 0; s < SEQS; s++) {
        cr_assert_gt(len[s], 4 * window + ENGINE_SWA_SLACK, "slot %d at %d", s, len[s]);
        cr_assert_gt(kv_cache_held_from(gw, s), 0, "slot %d: nothing was given back", s);
        cr_assert_leq(gw->n_held[s] - gw->lo[s], bound, "slot %d holds %d window blocks", s,
                      gw->n_held[s] - gw->lo[s]);
    }
    for (int e = 0; e < t->n; e++)
        for (int s = 0; s < SEQS; s++) engine_seq_free(t->r[e].e, s);
    cr_assert_eq(gw->n_free, gw->n_blocks);
}

/* The CUDA engine with the window pool against the CPU engine and against itself with --swa-full. */
static void check_model(const char *name, double rel_tol)
{
    struct suite t;
    open_suite(&t, name, rel_tol);
    struct engine *full = make(t.mf, ENGINE_BACKEND_CUDA, 1, -1, ENGINE_PLACEMENT_STREAM);
    cr_assert_null(engine_kv_cache(full, 1), "%s: --swa-full has a window pool", name);
    add_run(&t, full, "cuda --swa-full", CMP_BITWISE);
    if (rel_tol <= 0) t.r[1].cmp = CMP_NONE; /* bitwise against --swa-full only */
    run_schedule(&t);
    close_suite(&t);
}

Test(gpu_swa, gemma3_window_pool)
{
    require_gpu();
    check_model("gemma3_swa_f32", 1e-2);
}
Test(gpu_swa, gptoss_window_pool_with_sinks)
{
    require_gpu();
    /* Bitwise against --swa-full only: over this schedule the tiny random router meets near-ties that the
     * GPU's f16 products break the other way (on an H100: rows 1.77 and 1.61 from the CPU's, bound 0.046,
     * while bitwise equal to --swa-full), a different expert rather than a wrong one; test_gpu_e2e holds
     * gpt-oss against the CPU on tokens clear of ties. */
    check_model("gptoss_yarn_f16.gguf", 0);
}
Test(gpu_swa, phi3_every_layer_local)
{
    require_gpu();
    /* bf16: prompt chunks beside decode rows round x to bf16 on the tensor cores; measured up to 2.3e-2 of
     * max|logit| over this schedule on an H100 (bitwise equal to --swa-full) */
    check_model("phi3_fused_bf16", 3e-2);
}
Test(gpu_swa, gemma4_window_pool)
{
    require_gpu();
    check_model("gemma4_kv_f32.gguf", 1e-2);
}
Test(gpu_swa, gemma4_shared_kv_layers)
{
    require_gpu();
    check_model("gemma4_ple_f32.gguf", 1e-2);
}

/* Layers in host memory: streamed through the ring (the device's kernels: bitwise equal to all resident),
 * and computed by the host's cores, which send their q|k|v to the device's pools (within the CPU bound). */
Test(gpu_swa, gemma3_host_layers)
{
    require_gpu();
    struct suite t;
    open_suite(&t, "gemma3_swa_f32", 1e-2);
    add_run(&t, make(t.mf, ENGINE_BACKEND_CUDA, 0, 1, ENGINE_PLACEMENT_STREAM), "cuda 1 resident, streamed",
            CMP_BITWISE);
    add_run(&t, make(t.mf, ENGINE_BACKEND_CUDA, 0, 1, ENGINE_PLACEMENT_CPU), "cuda 1 resident, host cores",
            CMP_CPU_BOUND);
    struct engine_stats st;
    engine_get_stats(t.r[2].e, &st);
    cr_assert_eq(st.n_streamed, engine_hparams(t.r[2].e)->n_layers - 1);
    run_schedule(&t);
    close_suite(&t);
}
