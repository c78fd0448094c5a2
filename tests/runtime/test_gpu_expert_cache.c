/* test_gpu_expert_cache — the CUDA engine with every layer's experts in host memory and a device expert cache
 * smaller than the experts (runtime/forward_cuda_moe_cache.c) against the CPU engine, and the planner's share
 * of the budget for the cache.
 *
 * The engines run the tiny expert models of tests/golden/models: a prompt, then greedy decode steps of the
 * CPU's tokens, every step's logits compared within test_gpu_e2e's bound for these models (1e-2 of the
 * largest logit + 1e-3; 2e-2 for bf16 checkpoints, 3e-2 with Q8_0 experts). FERRY_EXPERT_CACHE_FORCE puts
 * every miss on the link (fetch) or on the host's cores (host; the start-up residents still hit, so steps mix
 * device and host experts), or leaves it to the cost model. The cache's counters must show the decisions the
 * run had to make. A failure names the model, the mode, the step, the token and both logits. Skips without
 * a CUDA device; the planner test is arithmetic and runs anywhere CUDA is built.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/core/status.h"
#include "kernels/cuda/ops.h"
#include "runtime/engine.h"
#include "engine_run_seq.h"
#include "runtime/forward_cuda.h"
#include "runtime/forward_cuda_moe.h"
#include "runtime/kv_cache.h"

static void require_gpu(void)
{
    if (kern_cuda_device_count() <= 0) cr_skip_test("no CUDA device: the expert cache tests need one");
}

static char *src_path(const char *rel)
{
    static char buf[1024];
    snprintf(buf, sizeof buf, "%s/%s", getenv("FERRY_SRC"), rel);
    return buf;
}

static struct model_file *open_model(const char *path)
{
    struct model_file *mf = NULL;
    char err[256] = "";
    cr_assert_eq(model_file_open(path, &mf, NULL, NULL, err), 0, "%s: %s", path, err);
    return mf;
}

/* The bytes of `num` / `den` of every layer's experts (the cache's request). */
static int64_t experts_share(struct model_file *mf, int num, int den)
{
    struct model m;
    char err[256] = "";
    cr_assert_eq(model_init(&m, mf, err), 0, "%s", err);
    uint64_t all = 0;
    for (int l = 0; l < m.hp.n_layers; l++) all += cuda_moe_expert_bytes(&m, l);
    model_free(&m);
    return (int64_t)(all * num / den);
}

static struct engine *make_engine(struct model_file *mf, enum engine_backend be, int int8, int64_t cache)
{
    struct engine_params p = engine_default_params();
    p.quant = int8 ? ENGINE_QUANT_INT8 : ENGINE_QUANT_NONE;
    p.cpu_int8 = int8;
    p.backend = be;
    p.n_seqs = 1;
    p.ctx_size = 256;
    p.max_batch_tokens = 64;
    p.cpu_moe = 1 << 10; /* every layer's experts in host memory */
    p.expert_cache = cache;
    p.n_threads = 2;
    struct engine *e = NULL;
    char err[256] = "";
    cr_assert_eq(engine_init(&e, mf, &p, err), 0, "engine_init: %s", err);
    return e;
}

#define STEPS 16

/* The CPU engine and the CUDA engine with the cache (share num/den of the experts' bytes, under mode) on one
 * model: every step's logits within rel_tol of the largest; the GPU's cache counters into *st. */
static void compare(const char *model, int n_prompt, int int8, int num, int den, const char *mode,
                    double rel_tol, struct expert_cache_stats *st)
{
    if (mode)
        setenv("FERRY_EXPERT_CACHE_FORCE", mode, 1);
    else
        unsetenv("FERRY_EXPERT_CACHE_FORCE");
    struct model_file *mf = open_model(model);
    struct engine *cpu = make_engine(mf, ENGINE_BACKEND_CPU, int8, 0);
    struct engine *gpu = make_engine(mf, ENGINE_BACKEND_CUDA, int8, experts_share(mf, num, den));
    const int V = engine_hparams(cpu)->n_vocab;
    int32_t prompt[64], tc[STEPS], tg[STEPS];
    for (int i = 0; i < n_prompt; i++) prompt[i] = (int32_t)((i * 37 + 5) % V);
    prompt[0] = 1;
    float *lc = malloc((size_t)(STEPS + 1) * V * sizeof(float)),
          *lg = malloc((size_t)(STEPS + 1) * V * sizeof(float));
    cr_assert(lc && lg);
    run_seq(cpu, prompt, n_prompt, STEPS, NULL, lc, tc);
    run_seq(gpu, prompt, n_prompt, STEPS, tc, lg, tg);
    for (int s = 0; s <= STEPS; s++) {
        const float *a = lc + (size_t)s * V, *b = lg + (size_t)s * V;
        double maxref = 0, worst = 0;
        int at = 0;
        for (int v = 0; v < V; v++) {
            maxref = fmax(maxref, fabs(a[v]));
            if (fabs((double)a[v] - b[v]) > worst) worst = fabs((double)a[v] - b[v]), at = v;
        }
        const double bound = rel_tol * maxref + 1e-3;
        cr_expect_leq(
            worst, bound,
            "%s (%s, cache %d/%d of the experts): step %d (%s): |gpu-cpu| = %g > %g at token %d: gpu %g, "
            "cpu %g",
            model, mode ? mode : "auto", num, den, s, s ? "decode" : "prompt", worst, bound, at, b[at],
            a[at]);
    }
    struct engine_stats es;
    engine_get_stats(gpu, &es);
    *st = es.expert_cache;
    char line[512];
    expert_cache_format(st, line, sizeof line);
    fprintf(stderr, "%s (%s): %s\n", model, mode ? mode : "auto", line);
    cr_assert_gt(
        st->slots, 0,
        "%s: the engine has no expert cache (is runtime/forward_cuda.c's planner hook for the cache in "
        "place?)",
        model);
    cr_expect_lt(st->slots, engine_hparams(gpu)->n_expert * engine_hparams(gpu)->n_layers,
                 "the cache holds every expert: nothing was tested");
    cr_expect_gt(st->steps, 0, "no layer step went through the cache");
    cr_expect_eq(st->hits + st->fetches + st->host + st->streamed, st->chosen);
    free(lc);
    free(lg);
    engine_free(cpu);
    engine_free(gpu);
    model_file_close(mf);
    unsetenv("FERRY_EXPERT_CACHE_FORCE");
}

/* Misses fetched: hits and fetches (a miss whose victims all score higher still goes to the host). Misses
 * on the host: the start-up residents hit, the rest is the host's, in the same steps. The cost model's own
 * choice: any mix, the same logits. The caches below hold at least k slots a layer and fewer than all the
 * experts (the slots' alignment and gpt-oss's bias rows included). */
static void modes(const char *model, int n_prompt, int int8, int num, int den, double tol)
{
    struct expert_cache_stats st;
    compare(model, n_prompt, int8, num, den, "fetch", tol, &st);
    cr_expect_gt(st.fetches, 0, "%s: nothing fetched", model);
    cr_expect_gt(st.hits, 0, "%s: no hit", model);
    cr_expect_gt(st.fetch_bytes, 0);
    compare(model, n_prompt, int8, num, den, "host", tol, &st);
    cr_expect_gt(st.host, 0, "%s: no host expert with the link ruled out", model);
    cr_expect_gt(st.hits, 0, "%s: the start-up residents never hit", model);
    cr_expect_eq(st.fetches, 0);
    cr_expect_eq(st.fetch_bytes, 0);
    compare(model, n_prompt, int8, num, den, NULL, tol, &st);
}

Test(gpu_expert_cache, qwen3moe_f32_matches_cpu)
{
    require_gpu();
    setenv("FERRY_MOE_STREAM_ROWS", "0", 1); /* no staging area: every miss fetched or on the host */
    modes(src_path("tests/golden/models/qwen3moe_top2_f32"), 7, 0, 5, 8, 1e-2);
    unsetenv("FERRY_MOE_STREAM_ROWS");
    modes(src_path("tests/golden/models/qwen3moe_top2_f32"), 16, 0, 5, 8, 1e-2);
}

Test(gpu_expert_cache, qwen3moe_bf16_and_mixtral_f16_match_cpu)
{
    require_gpu();
    modes(src_path("tests/golden/models/qwen3moe_top3_bf16"), 7, 0, 5, 8, 2e-2);
    modes(src_path("tests/golden/models/mixtral_top2_f16"), 7, 0, 5, 8, 1e-2);
}

/* gpt-oss (skipped where the CUDA backend lacks its kernels), streaming off. */
static void gptoss_modes(const char *file, int n_prompt, int int8, int num, int den, double tol)
{
    require_gpu();
    char rel[256];
    snprintf(rel, sizeof rel, "tests/golden/models/%s", file);
    const char *path = src_path(rel);
    struct model_file *mf = open_model(path);
    const char *lacks = engine_cuda_lacks(&mf->hp);
    model_file_close(mf);
    if (lacks) cr_skip_test("the CUDA backend has no kernels for %s yet", lacks);
    setenv("FERRY_MOE_STREAM_ROWS", "0", 1);
    modes(path, n_prompt, int8, num, den, tol);
    unsetenv("FERRY_MOE_STREAM_ROWS");
}

/* gpt-oss: biased experts and the clamped SwiGLU; a fetch copies the expert's bias rows into its slot. */
Test(gpu_expert_cache, gptoss_biased_experts_match_cpu)
{
    gptoss_modes("gptoss_yarn_f16.gguf", 7, 0, 5, 8, 1e-2);
}

/* Block-type experts (the MXFP4 file, as gpt-oss ships them; expert layers are not quantized at load): a
 * prompt of 33 rows goes through the grouped launches on the slots (pairs left to the host add nothing
 * there), decode steps through the GEMV; the cache holds 5/16 of the experts' bytes. */
Test(gpu_expert_cache, mxfp4_experts_grouped_match_cpu)
{
    gptoss_modes("gptoss_yarn_mxfp4.gguf", 33, 0, 5, 16, 3e-2);
}

/* The planner: an explicit cache is charged before the experts of more layers stay resident (and only when
 * some do not); the default takes what the plan leaves, but not beside an explicit --cpu-moe; 0 is none. */
Test(gpu_expert_cache, planner_charges_the_cache)
{
    struct model_file *mf = open_model(src_path("tests/golden/models/qwen3moe_top2_f32"));
    struct model m;
    char err[256] = "";
    cr_assert_eq(model_init(&m, mf, err), 0, "%s", err);
    const int L = m.hp.n_layers;
    struct kv_cache kv;
    cr_assert_eq(kv_cache_init(&kv, L, m.hp.n_kv_heads, m.hp.head_dim, 1, 256, 256, 16, KV_NO_HOST), 0);
    struct forward_cuda_params cp = {.max_tokens = 64, .gpu_memory = (int64_t)1 << 40, .gpu_layers = -1};
    uint64_t all = 0;
    for (int l = 0; l < L; l++) all += cuda_moe_expert_bytes(&m, l);
    struct device_map none, with;
    cp.cpu_moe = L;
    cr_assert_eq(forward_cuda_plan_offline(&m, &kv, &cp, 50e9, 3e12, &none, err), 0, "%s", err);
    cr_expect_eq(none.expert_cache_bytes, 0, "expert_cache 0 is no cache");
    cp.expert_cache = (int64_t)(all / 2);
    cr_assert_eq(forward_cuda_plan_offline(&m, &kv, &cp, 50e9, 3e12, &with, err), 0, "%s", err);
    const uint64_t want = cuda_moe_cache_plan(&m, L, all / 2);
    cr_expect_gt(want, 0);
    cr_expect_leq(want, all / 2);
    cr_expect_eq(with.expert_cache_bytes, want);
    cr_expect_eq(with.bytes_total, none.bytes_total + want, "the cache's bytes are part of the plan");
    char desc[4096];
    device_map_format(&with, desc, sizeof desc);
    cr_expect(strstr(desc, "expert cache:") != NULL, "%s", desc);
    cr_expect_eq(cuda_moe_cache_plan(&m, L, all), all, "every expert's bytes hold every expert");
    cr_expect_eq(cuda_moe_cache_plan(&m, L, 1), 0, "one byte holds no slot");
    cr_expect_eq(cuda_moe_cache_plan(&m, 0, all), 0, "no host layer, no cache");
    device_map_free(&none);
    device_map_free(&with);
    /* The default (-1) beside an explicit --cpu-moe: none; beside the planner's choice under a budget that
     * leaves room: what is left, at most every host expert. */
    cp.expert_cache = -1;
    cr_assert_eq(forward_cuda_plan_offline(&m, &kv, &cp, 50e9, 3e12, &with, err), 0, "%s", err);
    cr_expect_eq(with.expert_cache_bytes, 0);
    device_map_free(&with);
    cp.cpu_moe = -1;
    cr_assert_eq(forward_cuda_plan_offline(&m, &kv, &cp, 50e9, 3e12, &with, err), 0, "%s", err);
    cr_expect_eq(with.cpu_moe, 0, "a budget of 1 TiB keeps every expert resident");
    cr_expect_eq(with.expert_cache_bytes, 0);
    const uint64_t resident = with.bytes_total;
    device_map_free(&with);
    /* a budget a little short of every expert: the planner moves the first layer's experts to the host and
     * the cache takes what is left of the budget */
    cp.gpu_memory = (int64_t)(resident - cuda_moe_expert_bytes(&m, 0) / 4);
    cr_assert_eq(forward_cuda_plan_offline(&m, &kv, &cp, 50e9, 3e12, &with, err), 0, "%s", err);
    cr_expect_geq(with.cpu_moe, 1);
    cr_expect_gt(with.expert_cache_bytes, 0, "the budget's rest holds slots");
    cr_expect_leq(with.bytes_total, (uint64_t)cp.gpu_memory);
    device_map_free(&with);
    kv_cache_free(&kv);
    model_free(&m);
    model_file_close(mf);
}
