/* device_split_model — the plan for several GPUs of a model file (see device_split_model.h). */
#include "runtime/device_split_model.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/core/status.h"
#include "runtime/device_split.h"
#include "runtime/forward_cuda.h"
#include "runtime/kv_cache.h"
#include "runtime/layer.h"
#include "runtime/model.h"

#define REF_H2D 54.9e9  /* the reference H200's pinned host→device rate (engine_plan's) */
#define REF_HBM 4.18e12 /* and its device copy rate */

static enum dtype as_stored(enum dtype t)
{
    return t;
}

/* A phrase naming what this model has that is not derived here yet, or NULL. */
static const char *not_derived(const struct llm_hparams *hp)
{
    if (hp->full_attn_interval > 0) return "recurrent (linear-attention) layers";
    if (hp->sliding_window > 0) return "sliding-window layers";
    if (llm_kv_cache_layers(hp) != hp->n_layers) return "layers sharing K/V";
    if (hp->ple_dim > 0) return "per-layer inputs";
    return NULL;
}

/* The backend's parameters for p at budget bytes (engine.c's, for a pool the planner sizes). */
static struct forward_cuda_params cuda_params_at(const struct engine_params *p, int ctx, uint64_t budget)
{
    const int64_t short_ctx = ctx < 1024 ? ctx : 1024;
    return (struct forward_cuda_params){.max_tokens = p->max_batch_tokens,
                                        .gpu_memory = (int64_t)budget,
                                        .gpu_layers = -1,
                                        .cpu_moe = p->cpu_moe,
                                        .expert_cache = 0,
                                        .ring_layers = p->ring_layers,
                                        .no_ring = p->placement == ENGINE_PLACEMENT_CPU,
                                        .kv_auto = 1,
                                        .kv_tokens_max = (int64_t)p->n_seqs * ctx,
                                        .kv_tokens_floor = (int64_t)p->n_seqs * short_ctx,
                                        .kv_tokens_min = ctx,
                                        .kv_q8 = p->kv_type == KV_Q8_0};
}

/* The input's one-device plan at budget against the backend's: 0 when they agree. */
static int same_as_backend(const struct model *m, const struct kv_cache *kv, const struct engine_params *p,
                           int ctx, const struct device_split_input *split, uint64_t budget, char err[256])
{
    struct forward_cuda_params cp = cuda_params_at(p, ctx, budget);
    struct device_map want;
    struct device_split got;
    char e1[256] = "", e2[256] = "";
    struct device_split_input one = *split;
    one.n_devices = 1;
    one.ordinal[0] = 0;
    one.budget[0] = budget;
    const int rc1 = forward_cuda_plan_offline(m, kv, &cp, REF_H2D, REF_HBM, &want, e1);
    const int rc2 = device_split_plan(&one, &got, e2);
    const struct device_map *g = &got.part[0].map;
    int same = rc1 == rc2;
    if (same && rc1 == FERRY_OK)
        same = want.n_resident == g->n_resident && want.ring_bytes == g->ring_bytes &&
               want.kv_tokens == g->kv_tokens && want.bytes_total == g->bytes_total &&
               want.kv_ext_tokens == g->kv_ext_tokens && want.cpu_moe == g->cpu_moe;
    else if (same && rc1 == FERRY_ERR_DEVICE_MEM &&
             m->hp.n_expert <= 0) /* (an expert model's names another) */
        same = strcmp(e1, strstr(e2, "): ") ? strstr(e2, "): ") + 3 : e2) == 0;
    if (!same)
        snprintf(
            err, 256,
            "the per-device plan of this model could not be derived exactly from the CUDA backend's (one "
            "device at %.2f GiB: %d resident layers and %.3f GiB there, %d and %.3f GiB here)",
            budget / 1073741824.0, rc1 ? -1 : want.n_resident, rc1 ? 0 : want.bytes_total / 1073741824.0,
            rc2 ? -1 : g->n_resident, rc2 ? 0 : g->bytes_total / 1073741824.0);
    if (rc1 == FERRY_OK) device_map_free(&want);
    device_split_free(&got);
    return same ? FERRY_OK : FERRY_ERR_UNSUPPORTED;
}

/* The backend's plan at an unbounded budget with the experts of the first cpu_moe layers in host memory:
 * every layer resident beside the whole pool, nothing streams; at 1 byte/s of device memory and no link its
 * prediction is the bytes one step reads (the layers' with their resident experts, and the head's). */
static int unbounded(const struct model *m, const struct kv_cache *kv, const struct engine_params *p, int ctx,
                     int cpu_moe, struct device_map *all, uint64_t *read, char err[256])
{
    struct forward_cuda_params cp = cuda_params_at(p, ctx, (uint64_t)1 << 50);
    cp.cpu_moe = cpu_moe;
    const int rc = forward_cuda_plan_offline(m, kv, &cp, 0, 1.0, all, err);
    if (rc) return rc;
    *read = (uint64_t)all->predicted_step_s;
    if (all->n_resident == m->hp.n_layers && !all->ring_bytes && all->kv_tokens > 0 &&
        all->kv_bytes % (uint64_t)all->kv_tokens == 0 && all->bytes_total >= *read + all->kv_bytes &&
        (m->hp.n_expert <= 0 || all->cpu_moe == cpu_moe))
        return FERRY_OK;
    device_map_free(all);
    snprintf(err, 256, "the CUDA backend's unbounded plan of this model is not the one expected");
    return FERRY_ERR_UNSUPPORTED;
}

/* The model as the backend's planner takes it: the blocks are layer.h's layouts (sizes, (n_layers)); the rest
 * from unbounded plans: the pool's bytes a position, the head (what a step reads beyond the blocks with every
 * expert in host memory), the fixed bytes (what the plan holds beyond that and the pool); for expert models
 * each layer's experts (what a step reads less when they move to host memory; experts, (n_layers)) and the
 * staging area (what the plan holds more when the first layer's do, beyond their page tables). */
static int model_input(const struct model *m, const struct kv_cache *kv, const struct engine_params *p,
                       int ctx, uint64_t *sizes, uint64_t *experts, struct device_split_input *in,
                       char err[256])
{
    const struct llm_hparams *hp = &m->hp;
    const int L = hp->n_layers, moe = hp->n_expert > 0;
    uint64_t sum = 0, big = 0, piece = 0;
    for (int l = 0; l < L; l++) {
        struct layer_layout lay;
        layer_layout_of(&m->layers[l], hp, as_stored, &lay);
        sizes[l] = lay.bytes;
        sum += sizes[l];
        if (sizes[l] > big) big = sizes[l];
        for (int i = 0; i < LAYER_N_MATS; i++) {
            size_t off, bytes;
            layer_piece(&lay, i, &off, &bytes);
            if (bytes > piece) piece = bytes;
        }
    }
    struct device_map all;
    uint64_t read0, read = 0, total1 = 0;
    int rc = unbounded(m, kv, p, ctx, 0, &all, &read0, err);
    if (rc) return rc;
    const uint64_t total0 = all.bytes_total, kv0 = all.kv_bytes;
    const int64_t kv_tokens0 = all.kv_tokens;
    device_map_free(&all);
    read = read0;
    for (int c = 1; moe && !rc && c <= L; c++) {
        struct device_map more;
        uint64_t r;
        if ((rc = unbounded(m, kv, p, ctx, c, &more, &r, err))) break;
        experts[c - 1] = read - r;
        if (c == 1) total1 = more.bytes_total;
        read = r;
        device_map_free(&more);
    }
    const uint64_t e0 = moe && !rc ? experts[0] : 0, e0_map = (e0 + 511) / 512;
    if (!rc && (read < sum || (moe && total1 + e0 < total0 + e0_map))) {
        snprintf(err, 256, "the CUDA backend's unbounded plans of this model are not the ones expected");
        rc = FERRY_ERR_UNSUPPORTED;
    }
    if (rc) return rc;
    in->model = (struct device_map_input){.n_layers = L,
                                          .layer_bytes = big,
                                          .layer_sizes = sizes,
                                          .piece_bytes = piece,
                                          .head_bytes = read - sum,
                                          .fixed_bytes = total0 - read0 - kv0,
                                          .kv_token_bytes = kv0 / (uint64_t)kv_tokens0,
                                          .kv_tokens_max = (int64_t)p->n_seqs * ctx,
                                          .kv_tokens_floor = (int64_t)p->n_seqs * (ctx < 1024 ? ctx : 1024),
                                          .kv_tokens_min = ctx,
                                          .kv_block = kv->block_size,
                                          .gpu_layers = -1,
                                          .ring_layers = p->ring_layers,
                                          .no_ring = p->placement == ENGINE_PLACEMENT_CPU,
                                          .h2d_bytes_per_s = REF_H2D,
                                          .hbm_bytes_per_s = REF_HBM,
                                          .host_map_div = 512};
    if (moe) {
        in->expert_bytes = experts;
        in->expert_stage_bytes = total1 + e0 - total0 - e0_map;
        in->cpu_moe = p->cpu_moe;
    }
    /* (the one-device checks plan with the extension as the backend does: held in host memory, the host's
     * cores attending to it unless FERRY_KV_EXT_ATTN=device) */
    const char *mode = getenv("FERRY_KV_EXT_ATTN");
    in->model.kv_ext_max = INT64_MAX / 4 / (int64_t)(in->model.kv_token_bytes ? in->model.kv_token_bytes : 1);
    in->model.kv_ext_host = !(mode && strcmp(mode, "device") == 0);
    for (int l = 0; l < L; l++)
        if (layer_program_has(layer_program_of_layer(hp, l), LOP_ATTENTION_SINKS)) in->model.kv_ext_max = 0;
    return FERRY_OK;
}

int device_split_model_plan(const struct model_file *mf, const struct engine_params *p, int n,
                            const int *ordinal, const uint64_t *budget, char *buf, size_t cap, char err[256])
{
    if (n < 1 || n > DEVICE_SPLIT_MAX) {
        snprintf(err, 256, "a plan takes 1 to %d devices", DEVICE_SPLIT_MAX);
        return FERRY_ERR_INVALID;
    }
    struct model m;
    int rc = model_init(&m, mf, err);
    if (rc) return rc;
    const char *lacks = not_derived(&m.hp);
    if (lacks) {
        snprintf(err, 256, "the plan for several GPUs is not derived yet for a model with %s", lacks);
        model_free(&m);
        return FERRY_ERR_UNSUPPORTED;
    }
    if (p->gpu_layers >= 0) {
        snprintf(err, 256,
                 "--gpu-layers is planned for one device only (several split the layers themselves)");
        model_free(&m);
        return FERRY_ERR_INVALID;
    }
    const int ctx = p->ctx_size                                   ? p->ctx_size
                    : m.hp.ctx_train > 0 && m.hp.ctx_train < 4096 ? m.hp.ctx_train
                                                                  : 4096;
    struct kv_cache kv;
    uint64_t *sizes = malloc(2 * (size_t)m.hp.n_layers * sizeof *sizes);
    rc = sizes ? kv_cache_init(&kv, llm_kv_cache_layers(&m.hp), llm_kv_cache_heads(&m.hp), m.hp.head_dim,
                               p->n_seqs, ctx, p->n_seqs * ctx, ENGINE_KV_BLOCK, KV_NO_HOST)
               : FERRY_ERR_NOMEM;
    if (rc) {
        if (sizes) snprintf(err, 256, "cannot make the KV tables (%d x %d positions)", p->n_seqs, ctx);
        free(sizes);
        model_free(&m);
        return rc;
    }
    struct device_split_input in = {.cpu_moe = -1, .n_devices = n, .hidden_bytes = (uint64_t)m.hp.dim * 4};
    rc = model_input(&m, &kv, p, ctx, sizes, sizes + m.hp.n_layers, &in, err);
    for (int d = 0; !rc && d < n; d++) rc = same_as_backend(&m, &kv, p, ctx, &in, budget[d], err);
    if (!rc) {
        for (int d = 0; d < n; d++) in.ordinal[d] = ordinal[d], in.budget[d] = budget[d];
        struct device_split s;
        rc = device_split_plan(&in, &s, err);
        if (!rc) device_split_format(&s, buf, cap);
        device_split_free(&s);
    }
    kv_cache_free(&kv);
    free(sizes);
    model_free(&m);
    return rc;
}
