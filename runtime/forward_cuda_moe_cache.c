/* forward_cuda_moe_cache — the device expert cache of the CUDA backend's host-expert layers (see
 * forward_cuda_moe.h and runtime/expert_cache.h for the policy).
 *
 * Each layer whose experts live in host memory gets the same number of slots, laid out as a layer of that
 * many experts (gate, up, down of each slot stacked at 256-byte boundaries, then gpt-oss's bias rows), so the
 * expert kernels read a slot exactly as they read a resident expert: the step's id table holds each pair's
 * slot instead of its expert (-1 for a pair the host computes, which the kernels leave out). A step the cache
 * takes (at most max_rows rows; float experts at most CUDA_MOE_GEMV_MAX_ROWS, which the GEMV runs) brings the
 * routing and the rows down and waits for them (the one host round trip), asks the policy, issues the
 * fetches on its copy stream (from the pinned host copy of the experts, biases device to device), starts the
 * host's pairs in a host function on its own stream (so the host's cores and the device's products run side
 * by side), runs the device's pairs once the copies are in, and adds the host's result (mapped memory) after
 * the host function's event. Slots are only ever rewritten after that round trip, which follows every
 * earlier use of them on the compute stream.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/core/log.h"
#include "kernels/core/status.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/threadpool.h"
#include "kernels/cuda/moe.h"
#include "kernels/cuda/ops.h"
#include "runtime/cuda_check.h"
#include "runtime/expert_cache.h"
#include "runtime/forward_cuda_moe_impl.h"

/* A fetch's fixed cost beside its bytes: the launches of its three copies (about 2 µs each). */
#define MOE_CACHE_FETCH_S 6e-6

struct moe_cache {
    struct expert_cache *policy;
    int max_rows;      /* steps of at most this many rows (one chunk) go through the cache */
    char **slot;       /* (n_layers) each host layer's slots on the device, or NULL */
    int *n_slots;      /* (n_layers) */
    cudaStream_t copy; /* the fetches */
    cudaStream_t host; /* the host's pairs (a host function), beside the device's */
    cudaEvent_t fetched, hosted;
    int32_t *h_sids; /* (max_rows k) pinned: each pair's slot, -1 for the host's */
    /* The host's pairs of a step: token, expert and routing weight of each; their rows and results. */
    int hn;
    int32_t *htok, *hid; /* (max_rows k) */
    float *hw;           /* (max_rows k) */
    float *hx, *hy;      /* (max_rows k, dim) */
    float *ws;           /* kern_cpu_moe_ws_floats(max_rows k) */
    struct moe_job job;
};

/* Bytes of one expert's (rows, cols) matrix of the stacked w. */
static size_t expert_size(const struct wview *w, int rows, int cols)
{
    return dtype_row_size(w->type, cols) * (size_t)rows;
}

static int layer_biased(const struct model *m, int l)
{
    const struct model_layer *L = &m->layers[l];
    return m->hp.swiglu_limit > 0 && L->exp_gate_b && L->exp_up_b && L->exp_down_b;
}

/* Device bytes of s slots of layer l. */
static uint64_t slot_bytes(const void *ctx, int l, int s)
{
    const struct model *m = ctx;
    const struct model_layer *L = &m->layers[l];
    const int dim = m->hp.dim, ffn = m->hp.expert_ffn_dim;
    if (s <= 0) return 0;
    uint64_t b = align_up((size_t)s * expert_size(&L->exp_gate, ffn, dim)) +
                 align_up((size_t)s * expert_size(&L->exp_up, ffn, dim)) +
                 align_up((size_t)s * expert_size(&L->exp_down, dim, ffn));
    if (layer_biased(m, l)) b += align_up((size_t)s * (2 * (size_t)ffn + (size_t)dim) * sizeof(float));
    return b;
}

uint64_t cuda_moe_cache_plan(const struct model *m, int cpu_moe, uint64_t bytes)
{
    const int L = m->hp.n_layers;
    if (m->hp.n_expert <= 0 || cpu_moe <= 0 || bytes == 0) return 0;
    uint8_t *host = calloc((size_t)L, 1);
    int *slots = calloc((size_t)L, sizeof *slots);
    uint64_t used = 0;
    if (host && slots) {
        for (int l = 0; l < L && l < cpu_moe; l++) host[l] = 1;
        const int s = expert_cache_split(bytes, L, m->hp.n_expert, host, slot_bytes, m, slots);
        for (int l = 0; l < L; l++) used += host[l] ? slot_bytes(m, l, s) : 0;
    }
    free(host);
    free(slots);
    return used;
}

/* Layer l's slots as the expert kernels read them (ids: the step's slot table). */
static struct dev_experts slot_experts(const struct cuda_moe *mo, const struct moe_cache *mc, int l)
{
    const int S = mc->n_slots[l];
    struct dev_experts d = moe_dev_experts_at(mo, l, mc->slot[l]);
    d.up = d.gate + align_up((size_t)S * d.gate_e);
    d.down = d.up + align_up((size_t)S * d.up_e);
    d.gate_b = d.up_b = d.down_b = NULL;
    if (layer_biased(mo->m, l)) {
        d.gate_b = (const float *)(d.down + align_up((size_t)S * d.down_e));
        d.up_b = d.gate_b + (size_t)S * mo->ffn;
        d.down_b = d.up_b + (size_t)S * mo->ffn;
    }
    d.ids = mo->sids;
    d.ne = S;
    return d;
}

/* Expert e of layer l into slot s, on stream st: its matrices from the pinned host copy, its biases from the
 * device's. */
static int fetch_expert(struct cuda_moe *mo, struct moe_cache *mc, int l, int e, int s, cudaStream_t st)
{
    const struct dev_experts h = moe_dev_experts_at(mo, l, mo->hexp[l]), d = slot_experts(mo, mc, l);
    const char *src[3] = {h.gate, h.up, h.down};
    const char *dst[3] = {d.gate, d.up, d.down};
    const size_t each[3] = {d.gate_e, d.up_e, d.down_e};
    for (int i = 0; i < 3; i++)
        CK(cudaMemcpyAsync((char *)dst[i] + each[i] * s, src[i] + each[i] * e, each[i],
                           cudaMemcpyHostToDevice, st));
    if (d.gate_b && h.gate_b) {
        const float *bs[3] = {h.gate_b, h.up_b, h.down_b};
        const float *bd[3] = {d.gate_b, d.up_b, d.down_b};
        const size_t len[3] = {(size_t)mo->ffn, (size_t)mo->ffn, (size_t)mo->dim};
        for (int i = 0; i < 3; i++)
            CK(cudaMemcpyAsync((float *)bd[i] + len[i] * s, bs[i] + len[i] * e, len[i] * sizeof(float),
                               cudaMemcpyDeviceToDevice, st));
    }
    return FERRY_OK;
}

/* CUDA host function: the host's pairs of layer l, each its own row (k = 1), summed per token in pair order
 * into h_y (rows of tokens without host pairs zero). */
static void CUDART_CB cache_host_experts(void *arg)
{
    const struct moe_job *j = arg;
    struct cuda_moe *mo = j->mo;
    struct moe_cache *mc = mo->cache;
    const size_t dim = (size_t)mo->dim;
    kern_cpu_matmul_set_act(mo->cpu_int8 ? KERN_CPU_ACT_INT8 : KERN_CPU_ACT_F32);
    for (int q = 0; q < mc->hn; q++)
        memcpy(mc->hx + q * dim, mo->h_x + mc->htok[q] * dim, dim * sizeof(float));
    const struct kern_cpu_moe_experts ex = moe_host_experts_of(mo, j->l);
    const int rc = kern_cpu_moe_ffn(mc->hy, mc->hx, mc->hid, mc->hw, mc->hn, 1, &ex, mc->ws, mo->pool);
    memset(mo->h_y, 0, (size_t)j->n * dim * sizeof(float));
    for (int q = 0; q < mc->hn; q++) {
        float *yr = mo->h_y + mc->htok[q] * dim;
        const float *r = mc->hy + q * dim;
        for (size_t i = 0; i < dim; i++) yr[i] += r[i];
    }
    if (rc && !mo->rc) mo->rc = rc;
}

static void CUDART_CB noop(void *arg)
{
    (void)arg;
}

/* The host's seconds for n_ex distinct experts of layer l in one call as the host function makes it (k = 1):
 * m rows all on expert 0 when n_ex is 1, else one row on each of n_ex experts (m = n_ex). The best of 3
 * after a warm-up. */
static double host_set_seconds(struct cuda_moe *mo, struct moe_cache *mc, int l, int m, int n_ex)
{
    for (size_t i = 0; i < (size_t)m * mo->dim; i++)
        mc->hx[i] = (float)((i * 2654435761u) % 2001) / 1000.0f - 1;
    for (int i = 0; i < m; i++) mc->hid[i] = n_ex > 1 ? i * (mo->n_expert / n_ex) : 0, mc->hw[i] = 1.0f;
    const struct kern_cpu_moe_experts ex = moe_host_experts_of(mo, l);
    double best = INFINITY;
    for (int r = 0; r < 4; r++) {
        const double t0 = moe_now_s();
        if (kern_cpu_moe_ffn(mc->hy, mc->hx, mc->hid, mc->hw, m, 1, &ex, mc->ws, mo->pool)) return INFINITY;
        const double t = moe_now_s() - t0;
        if (r && t < best) best = t;
    }
    return best;
}

/* The seconds from launching a step's host function for n distinct experts of layer l at 1 row each (one
 * token) to its end, as a step runs it: with `copies` experts fetched into slots 0.. on the copy stream at
 * the same time when copies > 0 (before the start-up residency, which overwrites them). The best of 3 after
 * a warm-up. */
static double host_step_seconds(struct cuda_moe *mo, struct moe_cache *mc, int l, int n, int copies)
{
    for (size_t i = 0; i < (size_t)mo->dim; i++) mo->h_x[i] = (float)((i * 2654435761u) % 2001) / 1000.0f - 1;
    for (int q = 0; q < n; q++) mc->htok[q] = 0, mc->hid[q] = q * (mo->n_expert / n), mc->hw[q] = 1.0f;
    mc->hn = n;
    mc->job = (struct moe_job){.mo = mo, .l = l, .n = 1};
    const int rc0 = mo->rc; /* a failure here is the timing's, not a step's */
    double best = INFINITY;
    for (int r = 0; r < 4; r++) {
        const double t0 = moe_now_s();
        for (int i = 0; i < copies; i++)
            if (fetch_expert(mo, mc, l, i, i, mc->copy)) return INFINITY;
        if (cudaLaunchHostFunc(mc->host, cache_host_experts, &mc->job) != cudaSuccess ||
            cudaStreamSynchronize(mc->host) != cudaSuccess)
            return INFINITY;
        const double t = moe_now_s() - t0;
        if (cudaStreamSynchronize(mc->copy) != cudaSuccess || mo->rc != rc0) {
            mo->rc = rc0;
            return INFINITY;
        }
        if (r && t < best) best = t;
    }
    return best;
}

/* The policy's costs into p: the link and the device as measured by the caller; the host's cores on one
 * expert at 1, 4, 16 and 64 rows (the step planner's form of a host timing) and on a layer step's k experts
 * at 1 row each in one call (the policy splits the two into a call's fixed part and an expert's share); the
 * host's slow-down on a set while copies into the slots run (the copies read the host's memory too); a host
 * function's round trip. FERRY_EXPERT_CACHE_FORCE=host takes the link as unusable (every miss on the host's
 * cores), =fetch the host's cores (every miss a slot admits is fetched): tests reach both paths with them. */
static void cache_costs(struct cuda_moe *mo, struct moe_cache *mc, int l, double h2d, double hbm,
                        struct expert_cache_params *p)
{
    const char *force = getenv("FERRY_EXPERT_CACHE_FORCE");
    struct step_cost c = {.h2d = force && !strcmp(force, "host") ? 0 : h2d, .hbm = hbm};
    const int ms[4] = {1, 4, 16, 64};
    for (int i = 0; i < 4 && ms[i] <= mc->max_rows * mo->k; i++) {
        const double t = host_set_seconds(mo, mc, l, ms[i], 1);
        if (!isfinite(t)) break;
        c.cpu_m[c.n_cpu] = ms[i], c.cpu_s[c.n_cpu] = t, c.n_cpu++;
    }
    const struct dev_experts d = moe_dev_experts_at(mo, l, mo->hexp[l]);
    c.cpu_ref_bytes = d.gate_e + d.up_e + d.down_e;
    double best = INFINITY;
    for (int r = 0; r < 5; r++) {
        const double t0 = moe_now_s();
        if (cudaLaunchHostFunc(mc->host, noop, NULL) != cudaSuccess || cudaStreamSynchronize(mc->host)) break;
        best = fmin(best, moe_now_s() - t0);
    }
    c.sync_s = isfinite(best) ? best : 50e-6;
    const int k = mo->k < mo->n_expert ? mo->k : mo->n_expert;
    if (k >= 2 && c.n_cpu) {
        const double set = host_set_seconds(mo, mc, l, k, k);
        if (isfinite(set)) p->host_set_s = set, p->host_set_n = k;
        /* the host function of a one-token step whose slots took j of its k experts, without and with the
         * j copies beside it; the round trip is the same in both */
        const int j = mc->n_slots[l] < k - 1 ? mc->n_slots[l] : k - 1;
        const double alone = host_step_seconds(mo, mc, l, k - j, 0) - c.sync_s,
                     busy = host_step_seconds(mo, mc, l, k - j, j) - c.sync_s;
        if (isfinite(alone) && isfinite(busy) && alone > 0) p->host_busy = busy / alone;
    }
    if (force && !strcmp(force, "fetch")) c.n_cpu = 0;
    p->cost = c;
}

void moe_cache_free(struct moe_cache *mc)
{
    if (!mc) return;
    expert_cache_free(mc->policy);
    if (mc->copy) cudaStreamDestroy(mc->copy);
    if (mc->host) cudaStreamDestroy(mc->host);
    if (mc->fetched) cudaEventDestroy(mc->fetched);
    if (mc->hosted) cudaEventDestroy(mc->hosted);
    if (mc->h_sids) cudaFreeHost(mc->h_sids);
    free(mc->slot);
    free(mc->n_slots);
    free(mc->htok);
    free(mc->hid);
    free(mc->hw);
    free(mc->hx);
    free(mc->hy);
    free(mc->ws);
    free(mc);
}

int moe_cache_init(struct cuda_moe *mo, void *mem, uint64_t bytes, double h2d, double hbm)
{
    const int L = mo->n_layers;
    if (!mem || !bytes || !mo->n_host) return FERRY_OK;
    if (!mo->pin.p) {
        FLOG_WARN("the expert cache needs the host experts in pinned memory: no cache");
        return FERRY_OK;
    }
    struct moe_cache *mc = calloc(1, sizeof *mc);
    uint8_t *host = calloc((size_t)L, 1);
    uint64_t *ebytes = calloc((size_t)L, sizeof *ebytes);
    int rc = FERRY_ERR_NOMEM;
    if (!mc || !host || !ebytes || !(mc->slot = calloc((size_t)L, sizeof *mc->slot)) ||
        !(mc->n_slots = calloc((size_t)L, sizeof *mc->n_slots)))
        goto fail;
    for (int l = 0; l < L; l++) host[l] = mo->experts[l] == NULL;
    const int S = expert_cache_split(bytes, L, mo->n_expert, host, slot_bytes, mo->m, mc->n_slots);
    if (!S) {
        FLOG_WARN("the expert cache's %.1f MiB hold no slot in each of the %d host layers: no cache",
                  bytes / 1048576.0, mo->n_host);
        rc = FERRY_OK;
        goto fail;
    }
    char *at = mem;
    uint64_t used = 0;
    int first = -1;
    for (int l = 0; l < L; l++) {
        if (!host[l]) continue;
        if (first < 0) first = l;
        mc->slot[l] = at;
        at += slot_bytes(mo->m, l, S);
        used += slot_bytes(mo->m, l, S);
        const struct dev_experts h = moe_dev_experts_at(mo, l, mo->hexp[l]);
        ebytes[l] = h.gate_e + h.up_e + h.down_e;
    }
    mc->max_rows = mo->T < CUDA_MOE_GROUPED_MAX_ROWS ? mo->T : CUDA_MOE_GROUPED_MAX_ROWS;
    const size_t Pm = (size_t)mc->max_rows * mo->k;
    const struct kern_cpu_moe_experts ex = {.n_expert = mo->n_expert, .dim = mo->dim, .ffn = mo->ffn};
    if (!(mc->htok = malloc(Pm * sizeof *mc->htok)) || !(mc->hid = malloc(Pm * sizeof *mc->hid)) ||
        !(mc->hw = malloc(Pm * sizeof *mc->hw)) || !(mc->hx = malloc(Pm * mo->dim * sizeof *mc->hx)) ||
        !(mc->hy = malloc(Pm * mo->dim * sizeof *mc->hy)) ||
        !(mc->ws = malloc(kern_cpu_moe_ws_floats(&ex, (int)Pm) * sizeof *mc->ws)))
        goto fail;
    rc = FERRY_ERR_CUDA;
    if (cudaHostAlloc((void **)&mc->h_sids, Pm * sizeof *mc->h_sids, cudaHostAllocDefault) != cudaSuccess ||
        cudaStreamCreateWithFlags(&mc->copy, cudaStreamNonBlocking) != cudaSuccess ||
        cudaStreamCreateWithFlags(&mc->host, cudaStreamNonBlocking) != cudaSuccess ||
        cudaEventCreateWithFlags(&mc->fetched, cudaEventDisableTiming) != cudaSuccess ||
        cudaEventCreateWithFlags(&mc->hosted, cudaEventDisableTiming) != cudaSuccess)
        goto fail;
    struct expert_cache_params pp = {.n_layers = L,
                                     .n_expert = mo->n_expert,
                                     .slots = mc->n_slots,
                                     .expert_bytes = ebytes,
                                     .decay = EXPERT_CACHE_DECAY,
                                     .can_stream = mo->stage != NULL,
                                     .fetch_s = MOE_CACHE_FETCH_S};
    cache_costs(mo, mc, first, h2d, hbm, &pp);
    if ((rc = expert_cache_init(&mc->policy, &pp))) goto fail;
    expert_cache_set_slot_bytes(mc->policy, used);
    /* The start-up residency, copied once. */
    for (int l = 0; l < L; l++)
        for (int s = 0; s < mc->n_slots[l]; s++)
            if ((rc = fetch_expert(mo, mc, l, expert_cache_slot_expert(mc->policy, l, s), s, mc->copy)))
                goto fail;
    rc = FERRY_ERR_CUDA;
    if (cudaStreamSynchronize(mc->copy) != cudaSuccess) goto fail;
    FLOG_INFO(
        "expert cache: %d slots in each of %d host layers (%.1f MiB); on the host one expert %.1f µs at 1 "
        "row, %d in one call %.1f µs (%.1f µs fixed), %.2fx while copies run; the link %.1f GB/s, a host "
        "round trip %.1f µs",
        S, mo->n_host, used / 1048576.0, pp.cost.n_cpu ? pp.cost.cpu_s[0] * 1e6 : 0.0, pp.host_set_n,
        pp.host_set_s * 1e6,
        pp.cost.n_cpu ? expert_cache_call_s(pp.cost.cpu_s[0], pp.host_set_s, pp.host_set_n) * 1e6 : 0.0,
        pp.host_busy > 1 ? pp.host_busy : 1.0, h2d / 1e9, pp.cost.sync_s * 1e6);
    free(host);
    free(ebytes);
    mo->cache = mc;
    return FERRY_OK;
fail:
    cudaGetLastError();
    free(host);
    free(ebytes);
    moe_cache_free(mc);
    return rc;
}

int moe_cache_takes(const struct cuda_moe *mo, int l, int n)
{
    const struct moe_cache *mc = mo->cache;
    if (!mc || l < 0 || l >= mo->n_layers || !mc->n_slots[l] || n > mc->max_rows) return 0;
    if (n <= CUDA_MOE_GEMV_MAX_ROWS) return 1;
    const struct model_layer *L = &mo->m->layers[l];
    return dtype_block_size(L->exp_gate.type) > 1 && dtype_block_size(L->exp_up.type) > 1 &&
           dtype_block_size(L->exp_down.type) > 1 && kern_cuda_moe_x8_bytes(n, mo->dim) &&
           kern_cuda_moe_x8_bytes(n, mo->ffn);
}

int moe_cache_run(struct cuda_moe *mo, int l, struct kern_cuda_ctx *kctx, float *y, const float *x, int n,
                  cudaStream_t cs)
{
    struct moe_cache *mc = mo->cache;
    const int k = mo->k, P = n * k;
    const size_t dim = (size_t)mo->dim;
    CK(cudaMemcpyAsync(mo->h_ids, mo->ids, (size_t)P * sizeof(int32_t), cudaMemcpyDeviceToHost, cs));
    CK(cudaMemcpyAsync(mo->h_wts, mo->wts, (size_t)P * sizeof(float), cudaMemcpyDeviceToHost, cs));
    CK(cudaMemcpyAsync(mo->h_x, x, (size_t)n * dim * sizeof(float), cudaMemcpyDeviceToHost, cs));
    CK(cudaStreamSynchronize(cs));
    struct expert_plan pl;
    RC(expert_cache_decide(mc->policy, l, mo->h_ids, P, &pl));
    if (pl.stream) return moe_run_stream(mo, l, kctx, y, x, n, cs);
    for (int i = 0; i < pl.n_fetch; i++)
        RC(fetch_expert(mo, mc, l, pl.fetch[i], pl.slot[pl.fetch[i]], mc->copy));
    if (pl.n_fetch) {
        CK(cudaEventRecord(mc->fetched, mc->copy));
        CK(cudaStreamWaitEvent(cs, mc->fetched, 0));
    }
    mc->hn = expert_plan_pairs(&pl, mo->h_ids, mo->h_wts, P, k, mc->h_sids, mc->htok, mc->hid, mc->hw);
    if (mc->hn) {
        mc->job = (struct moe_job){.mo = mo, .l = l, .n = n};
        CK(cudaLaunchHostFunc(mc->host, cache_host_experts, &mc->job));
        CK(cudaEventRecord(mc->hosted, mc->host));
    }
    if (mc->hn < P) {
        CK(cudaMemcpyAsync(mo->sids, mc->h_sids, (size_t)P * sizeof(int32_t), cudaMemcpyHostToDevice, cs));
        struct dev_experts d = slot_experts(mo, mc, l);
        d.partial = mc->hn > 0;
        RC(n <= CUDA_MOE_GEMV_MAX_ROWS ? moe_run_gemv(mo, &d, y, x, n, cs)
                                       : moe_run_grouped(mo, &d, y, x, n, cs));
    } else {
        CK(cudaMemsetAsync(y, 0, (size_t)n * dim * sizeof(float), cs));
    }
    if (mc->hn) {
        CK(cudaStreamWaitEvent(cs, mc->hosted, 0));
        RC(kern_cuda_add_scale(y, (const float *)pinned_device_ptr(mo->h_y), NULL, (int64_t)n * mo->dim, cs));
    }
    return FERRY_OK;
}

void cuda_moe_cache_stats(const struct cuda_moe *mo, struct expert_cache_stats *st)
{
    expert_cache_stats(mo && mo->cache ? mo->cache->policy : NULL, st);
}
