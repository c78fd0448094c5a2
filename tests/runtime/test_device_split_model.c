/* test_device_split_model — `ferry inspect --gpus`'s plan of a model: it plans with the CUDA backend's own
 * planner input (forward_cuda_plan_input) and checks it against the backend's one-device plan
 * (forward_cuda_plan_offline). Both are replaced here by a stand-in whose sizes are known (a CUDA build has
 * the real ones, and the cli tests plan with them): the plan must be device_split's plan of exactly those
 * sizes, and a backend whose plan is not that of the input it gives must be refused rather than planned from
 * sizes that are not its own. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/core/status.h"
#include "quant/mix.h"
#include "runtime/device_split.h"
#include "runtime/device_split_model.h"
#include "runtime/forward_cuda.h"
#include "runtime/layer.h"
#include "runtime/synthetic.h"

#define MIB (1024ull * 1024ull)
#define GIB (1024ull * MIB)

static const uint64_t HEAD = 250 * MIB + 4096, FIXED = 777 * MIB + 12288;
static uint64_t extra; /* bytes the stand-in's planner adds to each layer's block beyond its input's */
static uint64_t sizes[128];

static enum dtype as_stored(enum dtype t)
{
    return t;
}

/* The stand-in's input for m under p: layer.h's blocks (plus add), HEAD, FIXED, K and V in f16. */
static struct device_map_input stand_in(const struct model *m, const struct kv_cache *kv,
                                        const struct forward_cuda_params *p, double h2d, double hbm,
                                        uint64_t add)
{
    const struct llm_hparams *hp = &m->hp;
    uint64_t big = 0, piece = 0;
    for (int l = 0; l < hp->n_layers; l++) {
        struct layer_layout lay;
        layer_layout_of(&m->layers[l], hp, as_stored, &lay);
        sizes[l] = lay.bytes + add;
        if (sizes[l] > big) big = sizes[l];
        for (int i = 0; i < LAYER_N_MATS; i++) {
            size_t off, bytes;
            layer_piece(&lay, i, &off, &bytes);
            if (bytes > piece) piece = bytes;
        }
    }
    return (struct device_map_input){.n_layers = hp->n_layers,
                                     .layer_bytes = big,
                                     .layer_sizes = sizes,
                                     .piece_bytes = piece,
                                     .head_bytes = HEAD,
                                     .fixed_bytes = FIXED,
                                     .budget = (uint64_t)p->gpu_memory,
                                     .gpu_layers = p->gpu_layers,
                                     .ring_layers = p->ring_layers,
                                     .no_ring = p->no_ring,
                                     .kv_token_bytes =
                                         2ull * hp->n_layers * hp->n_kv_heads * hp->head_dim * 2,
                                     .kv_tokens_max = p->kv_tokens_max,
                                     .kv_tokens_floor = p->kv_tokens_floor,
                                     .kv_tokens_min = p->kv_tokens_min,
                                     .kv_block = kv->block_size,
                                     .kv_ext_max = (int64_t)1 << 30,
                                     .kv_ext_host = 1,
                                     .h2d_bytes_per_s = h2d,
                                     .hbm_bytes_per_s = hbm,
                                     .host_map_div = 512};
}

/* An expert layer's experts in the stand-in (varying by layer), and the staging area. */
static const uint64_t STAGE = 700 * MIB + 8192;
static uint64_t experts_of(int l)
{
    return 340000000ull + (uint64_t)l * 4096;
}

/* The stand-in's planner input: layer.h's blocks into layer_sizes, and for an expert model experts_of and
 * STAGE. */
int forward_cuda_plan_input(const struct model *m, const struct kv_cache *kv,
                            const struct forward_cuda_params *p, double h2d, double hbm,
                            uint64_t *layer_sizes, uint64_t *expert_bytes, uint64_t *stage_bytes,
                            struct device_map_input *out, char err[256])
{
    (void)err;
    *out = stand_in(m, kv, p, h2d, hbm, 0);
    for (int l = 0; l < m->hp.n_layers; l++) {
        layer_sizes[l] = sizes[l];
        if (m->hp.n_expert > 0) expert_bytes[l] = experts_of(l);
    }
    out->layer_sizes = layer_sizes;
    *stage_bytes = m->hp.n_expert > 0 ? STAGE : 0;
    return FERRY_OK;
}

/* The stand-in's planner (its input with extra bytes a block): dense models as device_map plans them; expert
 * models with every block resident and the experts of the first c layers in host memory, c as few as fit (or
 * p->cpu_moe), as forward_cuda.c's plan_map. */
int forward_cuda_plan_offline(const struct model *m, const struct kv_cache *kv,
                              const struct forward_cuda_params *p, double h2d, double hbm,
                              struct device_map *out, char err[256])
{
    struct device_map_input in = stand_in(m, kv, p, h2d, hbm, extra);
    if (m->hp.n_expert <= 0) return device_map_plan(&in, out, err);
    const int L = m->hp.n_layers;
    static uint64_t with[128];
    const uint64_t fixed = in.fixed_bytes;
    in.gpu_layers = L;
    for (int c = p->cpu_moe < 0 ? 0 : p->cpu_moe > L ? L : p->cpu_moe;; c++) {
        uint64_t big = 0, experts_map = 0;
        for (int l = 0; l < L; l++) {
            with[l] = sizes[l] + (l >= c ? experts_of(l) : 0);
            if (with[l] > big) big = with[l];
            if (l < c) experts_map += (experts_of(l) + 511) / 512;
        }
        in.layer_sizes = with;
        in.layer_bytes = big;
        in.fixed_bytes = fixed + (c ? STAGE : 0) + experts_map;
        const int rc = device_map_plan(&in, out, err);
        if (rc != FERRY_ERR_DEVICE_MEM || p->cpu_moe >= 0 || c >= L) {
            if (!rc) out->host_map_bytes += experts_map, out->moe_layers = L, out->cpu_moe = c;
            return rc;
        }
        device_map_free(out);
    }
}

/* engine_default_params's values that the plan reads (engine.c stays out of this test's link: it would bring
 * the library's own forward_cuda_plan_offline). */
static struct engine_params params(void)
{
    return (struct engine_params){.n_seqs = 1, .max_batch_tokens = 512, .gpu_layers = -1, .kv_type = KV_F16};
}

static struct model_file *synthetic(const char *name)
{
    const struct synthetic_shape *sh = synthetic_shape_find(name);
    cr_assert_not_null(sh);
    struct llm_hparams hp;
    int ftype;
    synthetic_hparams(sh, &hp, &ftype);
    struct model_file *mf = NULL;
    char err[256] = "";
    cr_assert_eq(synthetic_model_file(&hp, DTYPE_F16, ftype < 0 ? QUANT_FTYPE_F16 : ftype, 1, 0, 0, &mf, err),
                 0, "%s", err);
    return mf;
}

/* device_split's plan of the stand-in's own sizes for mf under p on n devices of these budgets (ordinals 0,
 * 1,
 * ...): what the plan derived from the stand-in must be, as text in want; *host: the layers whose experts it
 * keeps in host memory. */
static void expected_plan(const struct model_file *mf, const struct engine_params *p, int n,
                          const uint64_t *budget, char *want, size_t cap, int *host)
{
    struct model m;
    char err[256] = "";
    cr_assert_eq(model_init(&m, mf, err), FERRY_OK, "%s", err);
    struct kv_cache kv = {.block_size = ENGINE_KV_BLOCK};
    const int ctx = m.hp.ctx_train > 0 && m.hp.ctx_train < 4096 ? m.hp.ctx_train : 4096;
    const struct forward_cuda_params cp = {.max_tokens = p->max_batch_tokens,
                                           .gpu_memory = 1,
                                           .gpu_layers = -1,
                                           .kv_tokens_max = (int64_t)p->n_seqs * ctx,
                                           .kv_tokens_floor = (int64_t)p->n_seqs * (ctx < 1024 ? ctx : 1024),
                                           .kv_tokens_min = ctx};
    static uint64_t experts[128];
    for (int l = 0; l < m.hp.n_layers; l++) experts[l] = experts_of(l);
    struct device_split_input in = {.model = stand_in(&m, &kv, &cp, 54.9e9, 4.18e12, 0),
                                    .expert_bytes = m.hp.n_expert > 0 ? experts : NULL,
                                    .expert_stage_bytes = m.hp.n_expert > 0 ? STAGE : 0,
                                    .cpu_moe = p->cpu_moe,
                                    .n_devices = n,
                                    .hidden_bytes = (uint64_t)m.hp.dim * 4};
    for (int d = 0; d < n; d++) in.ordinal[d] = d, in.budget[d] = budget[d];
    struct device_split s;
    cr_assert_eq(device_split_plan(&in, &s, err), FERRY_OK, "%s", err);
    device_split_format(&s, want, cap);
    *host = 0;
    for (int d = 0; d < n; d++) *host += s.part[d].cpu_moe;
    device_split_free(&s);
    model_free(&m);
}

/* The plan device_split_model derives for mf under p on n devices (into got) is expected_plan's; returns the
 * layers whose experts it keeps in host memory. */
static int derived_is_expected(const struct model_file *mf, const struct engine_params *p, int n,
                               const uint64_t *budget, char *got, size_t cap)
{
    const int ordinal[] = {0, 1};
    char want[16384] = "", err[256] = "";
    int host;
    cr_assert_eq(device_split_model_plan(mf, p, n, ordinal, budget, got, cap, err), FERRY_OK, "%s", err);
    expected_plan(mf, p, n, budget, want, sizeof want, &host);
    cr_assert_str_eq(got, want);
    return host;
}

/* Llama-2-7B's shape in f16 (13.5 GB) on two devices and on one: the plan from the backend's input is the
 * plan of the stand-in's own, text for text. */
Test(device_split_model, the_plan_is_of_the_backends_input)
{
    setenv("FERRY_KV_EXT_ATTN", "host", 1);
    struct model_file *mf = synthetic("llama-2-7b");
    struct engine_params p = params();
    p.n_seqs = 4;
    const uint64_t budgets[][2] = {{6 * GIB, 3 * GIB}, {12 * GIB, 12 * GIB}, {4 * GIB, 0}};
    for (int c = 0; c < 3; c++) {
        const int n = budgets[c][1] ? 2 : 1;
        char got[16384];
        extra = 0;
        const int host = derived_is_expected(mf, &p, n, budgets[c], got, sizeof got);
        cr_assert(strstr(got, n == 2 ? "device_split: 2 devices, layers 0-"
                                     : "device_split: 1 device, layers 0-31"),
                  "%s", got);
        cr_assert_eq(host, 0);
    }
    model_file_close(mf);
}

/* A backend whose planner makes its blocks 1 MiB larger than the input it gives: the plan from that input
 * would be wrong where layers stream, and the model is refused with the budget at which the plans part.
 * Sliding-window models are not planned there yet. */
Test(device_split_model, sizes_that_are_not_the_backends_are_refused)
{
    struct model_file *mf = synthetic("llama-2-7b");
    struct engine_params p = params();
    const int ordinal[] = {0, 1};
    const uint64_t budgets[] = {6 * GIB, 3 * GIB};
    char buf[16384] = "", err[256] = "";
    extra = MIB;
    cr_assert_eq(device_split_model_plan(mf, &p, 2, ordinal, budgets, buf, sizeof buf, err),
                 FERRY_ERR_UNSUPPORTED);
    cr_assert(
        strstr(err,
               "is not the CUDA backend's (one device at 6.00 GiB: 10 resident layers, a ring of 714.0 MiB"),
        "%s", err);
    extra = 0;
    p.gpu_layers = 10;
    cr_assert_eq(device_split_model_plan(mf, &p, 2, ordinal, budgets, buf, sizeof buf, err),
                 FERRY_ERR_INVALID);
    cr_assert(strstr(err, "--gpu-layers"), "%s", err);
    model_file_close(mf);

    mf = synthetic("gemma-3-12b");
    p = params();
    cr_assert_eq(device_split_model_plan(mf, &p, 2, ordinal, budgets, buf, sizeof buf, err),
                 FERRY_ERR_UNSUPPORTED);
    cr_assert(strstr(err, "not derived yet for a model with sliding-window layers"), "%s", err);
    model_file_close(mf);
}

/* Qwen3-30B-A3B's shape with the stand-in's experts (340 MB a layer, a 700 MiB staging area) on two 6 GiB
 * devices and on one of 12: each layer's experts and the staging area are the backend's (the plan is
 * device_split's of the stand-in's own sizes), with host experts where the budgets need them; --cpu-moe 30
 * too. */
Test(device_split_model, expert_sizes_are_the_backends)
{
    setenv("FERRY_KV_EXT_ATTN", "host", 1);
    struct model_file *mf = synthetic("qwen3-30b-a3b");
    const uint64_t budgets[][2] = {{6 * GIB, 6 * GIB}, {12 * GIB, 0}, {6 * GIB, 6 * GIB}};
    for (int c = 0; c < 3; c++) {
        struct engine_params p = params();
        p.cpu_moe = c == 2 ? 30 : -1;
        const int n = budgets[c][1] ? 2 : 1;
        char got[16384];
        const int host = derived_is_expected(mf, &p, n, budgets[c], got, sizeof got);
        cr_assert(c == 2 ? host == 30 : host > 0, "case %d: %d layers' experts in host memory", c, host);
    }
    model_file_close(mf);
}
