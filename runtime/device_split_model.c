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
    if (hp->n_expert > 0) return "expert layers";
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
                                        .cpu_moe = -1,
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
                           int ctx, struct device_map_input in, uint64_t budget, char err[256])
{
    struct forward_cuda_params cp = cuda_params_at(p, ctx, budget);
    struct device_map want, got;
    char e1[256] = "", e2[256] = "";
    in.budget = budget;
    const int rc1 = forward_cuda_plan_offline(m, kv, &cp, REF_H2D, REF_HBM, &want, e1);
    const int rc2 = device_map_plan(&in, &got, e2);
    int same = rc1 == rc2;
    if (same && rc1 == FERRY_OK)
        same = want.n_resident == got.n_resident && want.ring_bytes == got.ring_bytes &&
               want.kv_tokens == got.kv_tokens && want.bytes_total == got.bytes_total &&
               want.kv_ext_tokens == got.kv_ext_tokens;
    else if (same && rc1 == FERRY_ERR_DEVICE_MEM)
        same = want.bytes_minimum == got.bytes_minimum;
    if (!same)
        snprintf(
            err, 256,
            "the per-device plan of this model could not be derived exactly from the CUDA backend's (one "
            "device at %.2f GiB: %d resident layers and %.3f GiB there, %d and %.3f GiB here)",
            budget / 1073741824.0, want.n_resident, want.bytes_total / 1073741824.0, got.n_resident,
            got.bytes_total / 1073741824.0);
    if (rc1 == FERRY_OK) device_map_free(&want);
    if (rc2 == FERRY_OK) device_map_free(&got);
    return same ? FERRY_OK : FERRY_ERR_UNSUPPORTED;
}

/* The model as the backend's planner takes it (sizes, calibrated by its unbounded plan); sizes: (n_layers).
 */
static int model_input(const struct model *m, const struct kv_cache *kv, const struct engine_params *p,
                       int ctx, uint64_t *sizes, struct device_map_input *in, char err[256])
{
    const struct llm_hparams *hp = &m->hp;
    const int L = hp->n_layers;
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
    /* Unbounded: every layer resident beside the whole pool, nothing streams; at 1 byte/s of device memory
     * the prediction is the bytes one step reads, the layers' and the head's. */
    struct forward_cuda_params cp = cuda_params_at(p, ctx, (uint64_t)1 << 50);
    struct device_map all;
    int rc = forward_cuda_plan_offline(m, kv, &cp, 0, 1.0, &all, err);
    if (rc) return rc;
    const uint64_t read = (uint64_t)all.predicted_step_s;
    const int ok = all.n_resident == L && !all.ring_bytes && all.kv_tokens > 0 &&
                   all.kv_bytes % all.kv_tokens == 0 && read >= sum && all.bytes_total >= read + all.kv_bytes;
    *in = (struct device_map_input){.n_layers = L,
                                    .layer_bytes = big,
                                    .layer_sizes = sizes,
                                    .piece_bytes = piece,
                                    .head_bytes = ok ? read - sum : 0,
                                    .fixed_bytes = ok ? all.bytes_total - read - all.kv_bytes : 0,
                                    .kv_token_bytes = ok ? all.kv_bytes / (uint64_t)all.kv_tokens : 0,
                                    .kv_tokens_max = cp.kv_tokens_max,
                                    .kv_tokens_floor = cp.kv_tokens_floor,
                                    .kv_tokens_min = cp.kv_tokens_min,
                                    .kv_block = kv->block_size,
                                    .gpu_layers = -1,
                                    .ring_layers = cp.ring_layers,
                                    .no_ring = cp.no_ring,
                                    .h2d_bytes_per_s = REF_H2D,
                                    .hbm_bytes_per_s = REF_HBM,
                                    .host_map_div = 512};
    device_map_free(&all);
    if (!ok) {
        snprintf(err, 256, "the CUDA backend's unbounded plan of this model is not the one expected");
        return FERRY_ERR_UNSUPPORTED;
    }
    /* (the one-device checks below plan with the extension as the backend does: held in host memory, the
     * host's cores attending to it unless FERRY_KV_EXT_ATTN=device) */
    const char *mode = getenv("FERRY_KV_EXT_ATTN");
    in->kv_ext_max = INT64_MAX / 4 / (int64_t)(in->kv_token_bytes ? in->kv_token_bytes : 1);
    in->kv_ext_host = !(mode && strcmp(mode, "device") == 0);
    for (int l = 0; l < L; l++)
        if (layer_program_has(layer_program_of_layer(hp, l), LOP_ATTENTION_SINKS)) in->kv_ext_max = 0;
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
    uint64_t *sizes = malloc((size_t)m.hp.n_layers * sizeof *sizes);
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
    rc = model_input(&m, &kv, p, ctx, sizes, &in.model, err);
    for (int d = 0; !rc && d < n; d++) rc = same_as_backend(&m, &kv, p, ctx, in.model, budget[d], err);
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
