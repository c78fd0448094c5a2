/* device_split_model — the plan for several GPUs of a model file (see device_split_model.h). */
#include "runtime/device_split_model.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/core/status.h"
#include "runtime/device_split.h"
#include "runtime/forward_cuda.h"
#include "runtime/kv_cache.h"
#include "runtime/model.h"

#define REF_H2D 54.9e9  /* the reference H200's pinned host→device rate (engine_plan's) */
#define REF_HBM 4.18e12 /* and its device copy rate */

/* A phrase naming what this model has that is not planned here yet, or NULL. */
static const char *not_derived(const struct llm_hparams *hp)
{
    if (hp->full_attn_interval > 0) return "recurrent (linear-attention) layers";
    if (hp->sliding_window > 0) return "sliding-window layers";
    if (llm_kv_cache_layers(hp) != hp->n_layers) return "layers sharing K/V";
    if (hp->ple_dim > 0) return "per-layer inputs";
    return NULL;
}

/* The backend's parameters for p at budget bytes, with a context of ctx positions, the planner choosing the
 * resident layers and no expert cache. */
static struct forward_cuda_params cuda_params_at(const struct engine_params *p, int ctx, uint64_t budget)
{
    struct engine_params q = *p;
    q.ctx_size = ctx;
    q.gpu_memory = (int64_t)budget;
    q.gpu_layers = -1;
    q.expert_cache = 0;
    q.plan_override = NULL;
    return engine_cuda_params(&q, 1);
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
        snprintf(err, 256,
                 "the per-device plan of this model is not the CUDA backend's (one device at %.2f GiB: %d "
                 "resident layers, a ring of %.1f MiB and %.3f GiB there; %d, %.1f MiB and %.3f GiB here)",
                 budget / 1073741824.0, rc1 ? -1 : want.n_resident, rc1 ? 0 : want.ring_bytes / 1048576.0,
                 rc1 ? 0 : want.bytes_total / 1073741824.0, rc2 ? -1 : g->n_resident,
                 rc2 ? 0 : g->ring_bytes / 1048576.0, rc2 ? 0 : g->bytes_total / 1073741824.0);
    if (rc1 == FERRY_OK) device_map_free(&want);
    device_split_free(&got);
    return same ? FERRY_OK : FERRY_ERR_UNSUPPORTED;
}

/* The model as the backend's planner takes it at budget (forward_cuda_plan_input): the layers' blocks into
 * sizes and, for an expert model, their experts into experts (n_layers each). */
static int model_input(const struct model *m, const struct kv_cache *kv, const struct engine_params *p,
                       int ctx, uint64_t budget, uint64_t *sizes, uint64_t *experts,
                       struct device_split_input *in, char err[256])
{
    const struct forward_cuda_params cp = cuda_params_at(p, ctx, budget);
    uint64_t stage = 0;
    const int rc =
        forward_cuda_plan_input(m, kv, &cp, REF_H2D, REF_HBM, sizes, experts, &stage, &in->model, err);
    if (rc) return rc;
    if (m->hp.n_expert > 0) {
        in->expert_bytes = experts;
        in->expert_stage_bytes = stage;
        in->cpu_moe = p->cpu_moe;
    }
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
    rc = model_input(&m, &kv, p, ctx, budget[0], sizes, sizes + m.hp.n_layers, &in, err);
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
