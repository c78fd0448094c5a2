/* forward_cuda_moe — the expert layers of the CUDA backend (see forward_cuda_moe.h). */
#include "runtime/forward_cuda_moe.h"

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernels/core/log.h"
#include "kernels/core/status.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/moe.h"
#include "kernels/cpu/threadpool.h"
#include "kernels/cuda/matmul.h"
#include "kernels/cuda/moe.h"
#include "kernels/cuda/ops.h"
#include "runtime/cuda_check.h"
#include "runtime/pinned.h"
#include "runtime/forward_cuda_moe_impl.h"

/* Rows the scratch holds: a step of more runs in chunks of this many. */
static int chunk_rows(int T)
{
    return T < CUDA_MOE_CHUNK_ROWS ? T : CUDA_MOE_CHUNK_ROWS;
}

/* Floats of layer l's biases on the device (0: none). */
static size_t bias_floats(const struct model *m, int l)
{
    const struct model_layer *L = &m->layers[l];
    const size_t ne = (size_t)m->hp.n_expert;
    if (!L->router_b || !L->exp_gate_b || !L->exp_up_b || !L->exp_down_b) return 0;
    return ne * (1 + 2 * (size_t)m->hp.expert_ffn_dim + (size_t)m->hp.dim);
}

/* The int8 form of x (T rows of dim) or of h (their pairs' rows of ffn), one at a time. */
static size_t x8_bytes(const struct llm_hparams *hp, int T)
{
    T = T < CUDA_MOE_GROUPED_MAX_ROWS ? T : CUDA_MOE_GROUPED_MAX_ROWS;
    const size_t a = kern_cuda_moe_x8_bytes(T, hp->dim),
                 b = kern_cuda_moe_x8_bytes(T * hp->n_expert_used, hp->expert_ffn_dim);
    return a > b ? a : b;
}

size_t cuda_moe_fixed_bytes(const struct model *m, int T)
{
    T = chunk_rows(T);
    const struct llm_hparams *hp = &m->hp;
    if (hp->n_expert <= 0) return 0;
    size_t b = 0;
    for (int l = 0; l < hp->n_layers; l++)
        b += align_up(view_bytes(&m->layers[l].router)) + align_up(bias_floats(m, l) * sizeof(float));
    const size_t P = (size_t)T * hp->n_expert_used, ffn = (size_t)hp->expert_ffn_dim;
    b += align_up((size_t)T * hp->n_expert * sizeof(float)) + 2 * align_up(P * sizeof(float)) +
         align_up(P * 2 * ffn * sizeof(float)) + align_up(P * ffn * sizeof(float)) +
         align_up(P * (size_t)hp->dim * sizeof(float)) + align_up(2 * P * sizeof(int32_t)) +
         align_up(x8_bytes(hp, T)) + align_up(((size_t)hp->n_expert + 1) * sizeof(int32_t)) +
         align_up(P * sizeof(int32_t));
    return b;
}

/* FERRY_MOE_STREAM_ROWS: unset -1 (choose), 0 never, N from N rows. */
static int stream_rows_env(void)
{
    const char *s = getenv("FERRY_MOE_STREAM_ROWS");
    if (!s || !*s) return -1;
    const long v = strtol(s, NULL, 10);
    return v < 0 ? -1 : v > INT_MAX ? INT_MAX : (int)v;
}

uint64_t cuda_moe_stage_bytes(const struct model *m)
{
    uint64_t most = 0;
    for (int l = 0; l < m->hp.n_layers && m->hp.n_expert > 0 && stream_rows_env() != 0; l++)
        if (cuda_moe_expert_bytes(m, l) > most) most = cuda_moe_expert_bytes(m, l);
    return most;
}

uint64_t cuda_moe_expert_bytes(const struct model *m, int l)
{
    if (m->hp.n_expert <= 0 || l < 0 || l >= m->hp.n_layers) return 0;
    const struct model_layer *L = &m->layers[l];
    return align_up(view_bytes(&L->exp_gate)) + align_up(view_bytes(&L->exp_up)) +
           align_up(view_bytes(&L->exp_down));
}

void cuda_moe_ctx_needs(const struct model *m, int T, size_t *max_x, size_t *w16_elems)
{
    T = chunk_rows(T);
    const struct llm_hparams *hp = &m->hp;
    *max_x = *w16_elems = 0;
    if (hp->n_expert <= 0) return;
    const size_t ffn = (size_t)hp->expert_ffn_dim;
    *max_x = (size_t)T * (ffn > (size_t)hp->dim ? ffn : (size_t)hp->dim);
    for (int l = 0; l < hp->n_layers; l++) {
        const struct model_layer *L = &m->layers[l];
        if (dtype_block_size(L->exp_gate.type) > 1 || dtype_block_size(L->exp_up.type) > 1 ||
            dtype_block_size(L->exp_down.type) > 1)
            *w16_elems = ffn * (size_t)hp->dim; /* one expert's matrix: the products' unit */
    }
}

int cuda_moe_check_types(const struct model *m, char err[256])
{
    const struct llm_hparams *hp = &m->hp;
    if (hp->n_expert > KERN_CUDA_MOE_MAX_EXPERTS ||
        (hp->n_expert > 0 && (hp->n_expert_used < 1 || hp->n_expert_used > hp->n_expert))) {
        snprintf(err, 256,
                 "%d experts, %d per token: the CUDA backend routes 1 to %d experts per token among "
                 "at most %d",
                 hp->n_expert, hp->n_expert_used, hp->n_expert, KERN_CUDA_MOE_MAX_EXPERTS);
        return FERRY_ERR_UNSUPPORTED;
    }
    for (int l = 0; l < m->hp.n_layers && m->hp.n_expert > 0; l++) {
        const struct model_layer *L = &m->layers[l];
        const struct wview *w[] = {&L->router, &L->exp_gate, &L->exp_up, &L->exp_down};
        static const char *const names[] = {"router", "experts' gate", "experts' up", "experts' down"};
        for (int i = 0; i < 4; i++)
            if (!kern_cuda_matmul_supports(w[i]->type) || (i && !kern_cuda_moe_supports(w[i]->type))) {
                snprintf(err, 256, "layer %d: the %s matrix is %s, a type the CUDA backend cannot read", l,
                         names[i], dtype_name(w[i]->type));
                return FERRY_ERR_UNSUPPORTED;
            }
    }
    return FERRY_OK;
}

void cuda_moe_free(struct cuda_moe *mo)
{
    if (!mo) return;
    moe_cache_free(mo->cache);
    tpool_free(mo->pool);
    pinned_block_free(&mo->pin);
    free(mo->hexp);
    if (mo->h_ids) cudaFreeHost(mo->h_ids);
    if (mo->h_wts) cudaFreeHost(mo->h_wts);
    if (mo->h_idx) cudaFreeHost(mo->h_idx);
    if (mo->h_x) cudaFreeHost(mo->h_x);
    pinned_mapped_free(mo->h_y);
    free(mo->ws);
    free(mo->count);
    free(mo->jobs);
    free(mo->router);
    free(mo->experts);
    free(mo->bias);
    free(mo);
}

/* The host experts of layer l: the pinned copy, else the model's tensors. */
struct kern_cpu_moe_experts moe_host_experts_of(const struct cuda_moe *mo, int l)
{
    const struct model_layer *L = &mo->m->layers[l];
    struct kern_cpu_moe_experts ex = {.gate = L->exp_gate.data,
                                      .up = L->exp_up.data,
                                      .down = L->exp_down.data,
                                      .gate_t = L->exp_gate.type,
                                      .up_t = L->exp_up.type,
                                      .down_t = L->exp_down.type,
                                      .n_expert = mo->n_expert,
                                      .dim = mo->dim,
                                      .ffn = mo->ffn};
    if (mo->clamped) {
        ex.gate_b = L->exp_gate_b, ex.up_b = L->exp_up_b, ex.down_b = L->exp_down_b;
        ex.act = KERN_CPU_MOE_SWIGLU_CLAMPED, ex.alpha = mo->alpha, ex.limit = mo->limit;
    }
    if (mo->hexp && mo->hexp[l]) {
        ex.gate = mo->hexp[l];
        ex.up = mo->hexp[l] + align_up(view_bytes(&L->exp_gate));
        ex.down = (const char *)ex.up + align_up(view_bytes(&L->exp_up));
    }
    return ex;
}

double moe_now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + t.tv_nsec * 1e-9;
}

/* The host's seconds for host layer l's experts at n rows (the best of 3 after a warm-up), on rows and
 * routings that spread over the experts as real ones do (token t's j-th pick: (37 t + j) mod n_expert). */
static double host_seconds(struct cuda_moe *mo, int l, int n)
{
    const int k = mo->k;
    for (size_t i = 0; i < (size_t)n * mo->dim; i++)
        mo->h_x[i] = (float)((i * 2654435761u) % 2001) / 1000.0f - 1;
    for (int t = 0; t < n; t++)
        for (int j = 0; j < k; j++)
            mo->h_ids[t * k + j] = (37 * t + j) % mo->n_expert, mo->h_wts[t * k + j] = 1.0f / k;
    const struct kern_cpu_moe_experts ex = moe_host_experts_of(mo, l);
    double best = INFINITY;
    for (int r = 0; r < 4; r++) {
        const double t0 = moe_now_s();
        if (kern_cpu_moe_ffn(mo->h_y, mo->h_x, mo->h_ids, mo->h_wts, n, k, &ex, mo->ws, mo->pool))
            return INFINITY;
        const double t = moe_now_s() - t0;
        if (r && t < best) best = t;
    }
    return best;
}

/* stream_min_rows: the fewest rows at which copying the chosen experts over the link is predicted faster
 * than the host's cores computing them. Host: measured at 1 and at min(T, 64) rows, linear between and past.
 * Link: the expected number of distinct experts n tokens choose (n_expert (1 - (1 - k/n_expert)^n)) times an
 * expert's bytes at the measured rate, plus the host round trip and the device's products (a small fixed
 * allowance: they are short beside either side). */
static void choose_streaming(struct cuda_moe *mo, double h2d)
{
    mo->stream_min_rows = INT_MAX;
    const int forced = stream_rows_env();
    if (!mo->stage || !mo->pin.p) return;
    if (forced >= 0) {
        mo->stream_min_rows = forced ? forced : INT_MAX;
        return;
    }
    int l = 0;
    while (l < mo->n_layers && mo->experts[l]) l++;
    if (l == mo->n_layers || h2d <= 0) return;
    const int N = mo->T < 64 ? mo->T : 64;
    const double t1 = host_seconds(mo, l, 1), tN = N > 1 ? host_seconds(mo, l, N) : t1;
    if (!isfinite(t1) || !isfinite(tN)) return;
    const double per_row = N > 1 ? (tN - t1) / (N - 1) : 0,
                 expert = (double)cuda_moe_expert_bytes(mo->m, l) / mo->n_expert;
    for (int n = 1; n <= mo->T; n++) {
        const double host = t1 + per_row * (n - 1);
        const double chosen = mo->n_expert * (1.0 - pow(1.0 - (double)mo->k / mo->n_expert, n));
        const double link = chosen * expert / h2d + 100e-6;
        if (link < host) {
            mo->stream_min_rows = n;
            break;
        }
    }
    char how[96] = "the host computes them at every step size";
    if (mo->stream_min_rows != INT_MAX)
        snprintf(how, sizeof how, "steps of %d rows or more copy the experts they chose to the device",
                 mo->stream_min_rows);
    FLOG_INFO("host experts: %.2f ms a layer at 1 row, %.2f ms at %d rows; the link %.1f GB/s: %s", t1 * 1e3,
              tN * 1e3, N, h2d / 1e9, how);
}

/* Pins a copy of the host layers' experts (the device layout: gate, up, down at 256-byte boundaries): the
 * host's cores read it, and streaming copies from it at the link's full rate. On failure the host reads the
 * model's tensors and nothing streams. */
static void pin_host_experts(struct cuda_moe *mo)
{
    size_t bytes = 0;
    for (int l = 0; l < mo->n_layers; l++)
        if (!mo->experts[l]) bytes += cuda_moe_expert_bytes(mo->m, l);
    if (!(mo->hexp = calloc((size_t)mo->n_layers, sizeof *mo->hexp)) ||
        pinned_block_alloc(&mo->pin, bytes) != FERRY_OK) {
        cudaGetLastError();
        FLOG_WARN(
            "cannot pin %.2f GiB for the host experts: they are read where the model keeps them, and never "
            "streamed",
            bytes / 1073741824.0);
        return;
    }
    char *at = mo->pin.p;
    for (int l = 0; l < mo->n_layers; l++) {
        if (mo->experts[l]) continue;
        const struct model_layer *L = &mo->m->layers[l];
        const struct wview *v[3] = {&L->exp_gate, &L->exp_up, &L->exp_down};
        mo->hexp[l] = at;
        for (int i = 0; i < 3; i++) {
            memcpy(at, v[i]->data, view_bytes(v[i]));
            at += align_up(view_bytes(v[i]));
        }
    }
}

int cuda_moe_init(struct cuda_moe **out, const struct model *m, const struct cuda_moe_params *p,
                  char err[256])
{
    const struct llm_hparams *hp = &m->hp;
    *out = NULL;
    if (p->T < 1 || hp->n_expert < 1) return FERRY_ERR_INVALID;
    struct cuda_moe *mo = calloc(1, sizeof *mo);
    if (!mo) return FERRY_ERR_NOMEM;
    const int T = chunk_rows(p->T), chunks = (p->T + T - 1) / T;
    mo->T_step = p->T;
    mo->m = m;
    mo->n_layers = hp->n_layers, mo->n_expert = hp->n_expert, mo->k = hp->n_expert_used;
    mo->dim = hp->dim, mo->ffn = hp->expert_ffn_dim, mo->norm = hp->expert_norm_topk, mo->T = T;
    mo->stream_min_rows = INT_MAX;
    const size_t P = (size_t)T * mo->k;
    int rc = FERRY_ERR_NOMEM;
    mo->clamped = hp->swiglu_limit > 0; /* gpt-oss's LOP_MOE_CLAMPED */
    mo->alpha = hp->swiglu_alpha, mo->limit = hp->swiglu_limit;
    mo->router = calloc((size_t)hp->n_layers, sizeof *mo->router);
    mo->experts = calloc((size_t)hp->n_layers, sizeof *mo->experts);
    mo->bias = calloc((size_t)hp->n_layers, sizeof *mo->bias);
    mo->jobs = calloc((size_t)hp->n_layers * chunks, sizeof *mo->jobs);
    mo->count = calloc((size_t)mo->n_expert + 1, sizeof *mo->count);
    if (!mo->router || !mo->experts || !mo->bias || !mo->jobs || !mo->count) goto fail;
    char *c = p->fixed;
    rc = FERRY_ERR_CUDA;
    for (int l = 0; l < hp->n_layers; l++) {
        const struct model_layer *L = &m->layers[l];
        mo->router[l] = c;
        if (cudaMemcpy(c, L->router.data, view_bytes(&L->router), cudaMemcpyHostToDevice) != cudaSuccess)
            goto fail;
        c += align_up(view_bytes(&L->router));
        if (mo->clamped) {
            if (!bias_floats(m, l)) {
                rc = FERRY_ERR_INVALID;
                goto fail;
            }
            const size_t ne = (size_t)mo->n_expert, ffn = (size_t)mo->ffn;
            const float *src[4] = {L->router_b, L->exp_gate_b, L->exp_up_b, L->exp_down_b};
            const size_t len[4] = {ne, ne * ffn, ne * ffn, ne * (size_t)mo->dim};
            mo->bias[l] = (float *)c;
            for (int i = 0; i < 4; i++) {
                if (cudaMemcpy(c, src[i], len[i] * sizeof(float), cudaMemcpyHostToDevice) != cudaSuccess)
                    goto fail;
                c += len[i] * sizeof(float);
            }
            c = (char *)mo->bias[l] + align_up(bias_floats(m, l) * sizeof(float));
        }
        mo->experts[l] = p->experts[l];
        if (!p->experts[l]) {
            mo->n_host++;
            continue;
        }
        char *e = p->experts[l];
        const struct wview *v[3] = {&L->exp_gate, &L->exp_up, &L->exp_down};
        for (int i = 0; i < 3; i++) {
            if (cudaMemcpy(e, v[i]->data, view_bytes(v[i]), cudaMemcpyHostToDevice) != cudaSuccess) goto fail;
            e += align_up(view_bytes(v[i]));
        }
    }
    mo->logits = (float *)c, c += align_up((size_t)T * mo->n_expert * sizeof(float));
    mo->ids = (int32_t *)c, c += align_up(P * sizeof(int32_t));
    mo->wts = (float *)c, c += align_up(P * sizeof(float));
    mo->gu = (float *)c, c += align_up(P * 2 * (size_t)mo->ffn * sizeof(float));
    mo->h = (float *)c, c += align_up(P * (size_t)mo->ffn * sizeof(float));
    mo->xs = (float *)c, c += align_up(P * (size_t)mo->dim * sizeof(float));
    mo->idx = (int32_t *)c, c += align_up(2 * P * sizeof(int32_t));
    mo->x8 = c, c += align_up(x8_bytes(hp, T));
    mo->off = (int32_t *)c, c += align_up(((size_t)mo->n_expert + 1) * sizeof(int32_t));
    mo->sids = (int32_t *)c;
    if (cudaHostAlloc((void **)&mo->h_ids, P * sizeof(int32_t), cudaHostAllocDefault) != cudaSuccess ||
        cudaHostAlloc((void **)&mo->h_wts, P * sizeof(float), cudaHostAllocDefault) != cudaSuccess ||
        cudaHostAlloc((void **)&mo->h_idx, 2 * P * sizeof(int32_t), cudaHostAllocDefault) != cudaSuccess)
        goto fail;
    if (mo->n_host) {
        const struct kern_cpu_moe_experts ex = {.n_expert = mo->n_expert, .dim = mo->dim, .ffn = mo->ffn};
        rc = FERRY_ERR_NOMEM;
        if (cudaHostAlloc((void **)&mo->h_x, (size_t)T * mo->dim * sizeof(float), cudaHostAllocDefault) !=
                cudaSuccess ||
            !(mo->h_y = pinned_mapped_alloc((size_t)T * mo->dim * sizeof(float))) ||
            !(mo->ws = malloc(kern_cpu_moe_ws_floats(&ex, T) * sizeof(float))) ||
            tpool_init(&mo->pool, p->n_threads) != FERRY_OK)
            goto fail;
        FLOG_INFO("experts of %d of %d layers in host memory, computed by %d host threads", mo->n_host,
                  hp->n_layers, tpool_size(mo->pool));
        pin_host_experts(mo);
        mo->cpu_int8 = p->cpu_int8;
        mo->stage = p->stage;
        choose_streaming(mo, p->h2d_bytes_per_s);
        if ((rc = moe_cache_init(mo, p->cache, p->cache_bytes, p->h2d_bytes_per_s, p->hbm_bytes_per_s)))
            goto fail;
    }
    *out = mo;
    return FERRY_OK;
fail:
    cudaGetLastError();
    snprintf(err, 256, "cannot set up the expert layers on the device (%s)", ferry_status_str(rc));
    cuda_moe_free(mo);
    return rc;
}

int cuda_moe_resident(const struct cuda_moe *mo, int l)
{
    return mo && l >= 0 && l < mo->n_layers && mo->experts[l] != NULL;
}

int cuda_moe_n_host(const struct cuda_moe *mo)
{
    return mo ? mo->n_host : 0;
}

int cuda_moe_status(struct cuda_moe *mo)
{
    if (!mo) return FERRY_OK;
    const int rc = mo->rc;
    mo->rc = FERRY_OK;
    return rc;
}

int cuda_moe_stream_min_rows(const struct cuda_moe *mo)
{
    return mo ? mo->stream_min_rows : INT_MAX;
}

void cuda_moe_counts(const struct cuda_moe *mo, uint64_t *host_runs, uint64_t *stream_runs,
                     uint64_t *stream_bytes)
{
    *host_runs = mo ? mo->host_runs : 0;
    *stream_runs = mo ? mo->stream_runs : 0;
    *stream_bytes = mo ? mo->stream_bytes : 0;
}

struct dev_experts moe_dev_experts_at(const struct cuda_moe *mo, int l, const char *base)
{
    const struct model_layer *L = &mo->m->layers[l];
    struct dev_experts d = {
        .gate = base, .gate_t = L->exp_gate.type, .up_t = L->exp_up.type, .down_t = L->exp_down.type};
    d.up = d.gate + align_up(view_bytes(&L->exp_gate));
    d.down = d.up + align_up(view_bytes(&L->exp_up));
    d.gate_e = dtype_row_size(d.gate_t, mo->dim) * (size_t)mo->ffn;
    d.up_e = dtype_row_size(d.up_t, mo->dim) * (size_t)mo->ffn;
    d.down_e = dtype_row_size(d.down_t, mo->ffn) * (size_t)mo->dim;
    d.ids = mo->ids, d.ne = mo->n_expert;
    if (mo->bias[l]) {
        d.gate_b = mo->bias[l] + mo->n_expert;
        d.up_b = d.gate_b + (size_t)mo->n_expert * mo->ffn;
        d.down_b = d.up_b + (size_t)mo->n_expert * mo->ffn;
    }
    return d;
}

/* h (P, ffn) from gu (P, 2 ffn): silu(gate)·up, or gpt-oss's clamped SwiGLU. */
int moe_activate(const struct cuda_moe *mo, int P, cudaStream_t cs)
{
    if (mo->clamped) return kern_cuda_moe_swiglu_clamped(mo->h, mo->gu, P, mo->ffn, mo->alpha, mo->limit, cs);
    return kern_cuda_silu_mul(mo->h, mo->gu, P, mo->ffn, cs);
}

/* Few rows: the grouped GEMV over every (token, expert) pair, the routing read on the device. */
int moe_run_gemv(struct cuda_moe *mo, const struct dev_experts *d, float *y, const float *x, int n,
                 cudaStream_t cs)
{
    const int k = mo->k, ffn = mo->ffn, dim = mo->dim, P = n * k;
    if (dtype_block_size(d->gate_t) > 1 || dtype_block_size(d->up_t) > 1)
        RC(kern_cuda_moe_x8(mo->x8, x, dim, n, dim, cs));
    RC(kern_cuda_moe_gemv(mo->gu, 2 * ffn, x, dim, mo->x8, d->gate, d->gate_t, d->gate_b, d->ne, ffn, dim,
                          d->ids, NULL, P, 1, k, cs));
    RC(kern_cuda_moe_gemv(mo->gu + ffn, 2 * ffn, x, dim, mo->x8, d->up, d->up_t, d->up_b, d->ne, ffn, dim,
                          d->ids, NULL, P, 1, k, cs));
    RC(moe_activate(mo, P, cs));
    if (dtype_block_size(d->down_t) > 1) RC(kern_cuda_moe_x8(mo->x8, mo->h, ffn, P, ffn, cs));
    return kern_cuda_moe_gemv(y, dim, mo->h, ffn, mo->x8, d->down, d->down_t, d->down_b, d->ne, dim, ffn,
                              d->ids, mo->wts, n, k, 1, cs);
}

/* More rows, every matrix in a block type: the pairs sorted by expert on the device, each chosen expert's
 * rows read once per 8 of its pairs, the down products per pair into xs, then the weighted sum. */
int moe_run_grouped(struct cuda_moe *mo, const struct dev_experts *d, float *y, const float *x, int n,
                    cudaStream_t cs)
{
    const int k = mo->k, ffn = mo->ffn, dim = mo->dim, P = n * k, ne = d->ne;
    RC(kern_cuda_moe_sort(d->ids, P, ne, mo->off, mo->idx, cs));
    RC(kern_cuda_moe_x8(mo->x8, x, dim, n, dim, cs));
    RC(kern_cuda_moe_grouped(mo->gu, 2 * ffn, mo->x8, n, d->gate, d->gate_t, d->gate_b, ne, ffn, dim, mo->off,
                             mo->idx, k, cs));
    RC(kern_cuda_moe_grouped(mo->gu + ffn, 2 * ffn, mo->x8, n, d->up, d->up_t, d->up_b, ne, ffn, dim, mo->off,
                             mo->idx, k, cs));
    RC(moe_activate(mo, P, cs));
    RC(kern_cuda_moe_x8(mo->x8, mo->h, ffn, P, ffn, cs));
    if (d->partial) /* the rows of pairs left out (host experts) add nothing to the sum */
        CK(cudaMemsetAsync(mo->xs, 0, (size_t)P * dim * sizeof(float), cs));
    RC(kern_cuda_moe_grouped(mo->xs, dim, mo->x8, P, d->down, d->down_t, d->down_b, ne, dim, ffn, mo->off,
                             mo->idx, 1, cs));
    return kern_cuda_moe_combine(y, mo->xs, NULL, mo->wts, n, k, dim, cs);
}

/* Rows grouped by expert on the host: the ids come down (cs waits), each expert's rows are counted (count[e]
 * ends as the end of expert e's sorted rows, count[e - 1] its start), and the sorted rows' tokens and each
 * pair's sorted row go up. */
static int group_rows(struct cuda_moe *mo, int n, cudaStream_t cs)
{
    const int k = mo->k, P = n * k, ne = mo->n_expert;
    CK(cudaMemcpyAsync(mo->h_ids, mo->ids, (size_t)P * sizeof(int32_t), cudaMemcpyDeviceToHost, cs));
    CK(cudaStreamSynchronize(cs));
    int *cnt = mo->count;
    memset(cnt, 0, ((size_t)ne + 1) * sizeof *cnt);
    for (int p = 0; p < P; p++) {
        if (mo->h_ids[p] < 0 || mo->h_ids[p] >= ne) return FERRY_ERR_RANGE;
        cnt[mo->h_ids[p] + 1]++;
    }
    for (int e = 0; e < ne; e++) cnt[e + 1] += cnt[e]; /* cnt[e]: expert e's first sorted row */
    int32_t *rows = mo->h_idx, *slot = mo->h_idx + P;
    for (int p = 0; p < P; p++) { /* in token order within each expert */
        const int r = cnt[mo->h_ids[p]]++;
        rows[r] = p / k;
        slot[p] = r;
    }
    CK(cudaMemcpyAsync(mo->idx, mo->h_idx, 2 * (size_t)P * sizeof(int32_t), cudaMemcpyHostToDevice, cs));
    return FERRY_OK;
}

/* After group_rows: the rows gathered, one product per expert and matrix, the weighted sum per token. */
static int grouped_products(struct cuda_moe *mo, const struct dev_experts *d, struct kern_cuda_ctx *kctx,
                            float *y, const float *x, int n, cudaStream_t cs)
{
    const int k = mo->k, ffn = mo->ffn, dim = mo->dim, P = n * k, ne = mo->n_expert;
    const int *cnt = mo->count;
    RC(kern_cuda_embed(mo->xs, x, DTYPE_F32, n, dim, mo->idx, P, cs));
    for (int e = 0; e < ne; e++) {
        const int r0 = e ? cnt[e - 1] : 0, c = cnt[e] - r0;
        if (!c) continue;
        float *gu = mo->gu + (size_t)r0 * 2 * ffn;
        const float *xs = mo->xs + (size_t)r0 * dim;
        RC(kern_cuda_matmul(kctx, gu, 2 * ffn, xs, d->gate + d->gate_e * e, d->gate_t,
                            d->gate_b ? d->gate_b + (size_t)e * ffn : NULL, c, ffn, dim, cs));
        RC(kern_cuda_matmul(kctx, gu + ffn, 2 * ffn, xs, d->up + d->up_e * e, d->up_t,
                            d->up_b ? d->up_b + (size_t)e * ffn : NULL, c, ffn, dim, cs));
    }
    RC(moe_activate(mo, P, cs));
    for (int e = 0; e < ne; e++) { /* each expert's rows of xs are free once its gate|up products ran */
        const int r0 = e ? cnt[e - 1] : 0, c = cnt[e] - r0;
        if (c)
            RC(kern_cuda_matmul(kctx, mo->xs + (size_t)r0 * dim, dim, mo->h + (size_t)r0 * ffn,
                                d->down + d->down_e * e, d->down_t,
                                d->down_b ? d->down_b + (size_t)e * dim : NULL, c, dim, ffn, cs));
    }
    return kern_cuda_moe_combine(y, mo->xs, mo->idx + P, mo->wts, n, k, dim, cs);
}

/* Host layer l's chosen experts copied into the staging area at their own offsets (a run of consecutive
 * chosen experts is one copy per matrix), then run there like resident ones. */
int moe_run_stream(struct cuda_moe *mo, int l, struct kern_cuda_ctx *kctx, float *y, const float *x, int n,
                   cudaStream_t cs)
{
    RC(group_rows(mo, n, cs));
    const struct dev_experts d = moe_dev_experts_at(mo, l, mo->stage),
                             h = moe_dev_experts_at(mo, l, mo->hexp[l]);
    const char *dst[3] = {d.gate, d.up, d.down}, *src[3] = {h.gate, h.up, h.down};
    const size_t each[3] = {d.gate_e, d.up_e, d.down_e};
    const int *cnt = mo->count;
    for (int e = 0; e < mo->n_expert;) {
        if (cnt[e] == (e ? cnt[e - 1] : 0)) { /* no rows */
            e++;
            continue;
        }
        int e1 = e + 1;
        while (e1 < mo->n_expert && cnt[e1] > cnt[e1 - 1]) e1++;
        for (int i = 0; i < 3; i++) {
            const size_t off = each[i] * e, bytes = each[i] * (e1 - e);
            CK(cudaMemcpyAsync((char *)dst[i] + off, src[i] + off, bytes, cudaMemcpyHostToDevice, cs));
            mo->stream_bytes += bytes;
        }
        e = e1;
    }
    mo->stream_runs++;
    return grouped_products(mo, &d, kctx, y, x, n, cs);
}

/* CUDA host function: layer l's experts on the host's cores, from h_x and the routing to h_y. */
static void CUDART_CB host_experts(void *arg)
{
    const struct moe_job *j = arg;
    struct cuda_moe *mo = j->mo;
    kern_cpu_matmul_set_act(mo->cpu_int8 ? KERN_CPU_ACT_INT8 : KERN_CPU_ACT_F32);
    const struct kern_cpu_moe_experts ex = moe_host_experts_of(mo, j->l);
    const int rc =
        kern_cpu_moe_ffn(mo->h_y, mo->h_x, mo->h_ids, mo->h_wts, j->n, mo->k, &ex, mo->ws, mo->pool);
    if (rc && !mo->rc) mo->rc = rc;
}

/* Experts in host memory: the rows and the routing down, the host function, the result up (mapped). */
static int run_host(struct cuda_moe *mo, struct moe_job *job, int l, float *y, const float *x, int n,
                    const int32_t *d_iota, cudaStream_t cs)
{
    const size_t P = (size_t)n * mo->k;
    CK(cudaMemcpyAsync(mo->h_x, x, (size_t)n * mo->dim * sizeof(float), cudaMemcpyDeviceToHost, cs));
    CK(cudaMemcpyAsync(mo->h_ids, mo->ids, P * sizeof(int32_t), cudaMemcpyDeviceToHost, cs));
    CK(cudaMemcpyAsync(mo->h_wts, mo->wts, P * sizeof(float), cudaMemcpyDeviceToHost, cs));
    *job = (struct moe_job){.mo = mo, .l = l, .n = n};
    CK(cudaLaunchHostFunc(cs, host_experts, job));
    mo->host_runs++;
    return kern_cuda_embed(y, pinned_device_ptr(mo->h_y), DTYPE_F32, n, mo->dim, d_iota, n, cs);
}

/* Whether layer l's experts are all in block types, which the grouped launches read (on x's int8 form, whose
 * workspace holds CUDA_MOE_GROUPED_MAX_ROWS rows). */
static int grouped_layer(const struct cuda_moe *mo, int l)
{
    const struct model_layer *L = &mo->m->layers[l];
    const int rows = mo->T < CUDA_MOE_GROUPED_MAX_ROWS ? mo->T : CUDA_MOE_GROUPED_MAX_ROWS;
    return dtype_block_size(L->exp_gate.type) > 1 && dtype_block_size(L->exp_up.type) > 1 &&
           dtype_block_size(L->exp_down.type) > 1 && kern_cuda_moe_x8_bytes(rows, mo->dim) &&
           kern_cuda_moe_x8_bytes(rows, mo->ffn);
}

/* Rows [r0, r0 + n) of a step (n <= T), chunk c of it. */
static int run_chunk(struct cuda_moe *mo, int l, int c, float *y, const float *x, int n,
                     struct kern_cuda_ctx *kctx, const int32_t *d_iota, cudaStream_t cs)
{
    const struct model_layer *L = &mo->m->layers[l];
    RC(kern_cuda_matmul(kctx, mo->logits, mo->n_expert, x, mo->router[l], L->router.type, mo->bias[l], n,
                        mo->n_expert, mo->dim, cs));
    /* gpt-oss's weights, the softmax of the top-k logits, are the normalised top-k probabilities. */
    RC(kern_cuda_moe_route(mo->logits, n, mo->n_expert, mo->k, mo->norm || mo->clamped, mo->ids, mo->wts,
                           cs));
    if (!mo->experts[l]) {
        if (moe_cache_takes(mo, l, n)) return moe_cache_run(mo, l, kctx, y, x, n, cs);
        if (n >= mo->stream_min_rows && mo->stage && mo->hexp && mo->hexp[l])
            return moe_run_stream(mo, l, kctx, y, x, n, cs);
        return run_host(mo, &mo->jobs[(size_t)l * ((mo->T_step + mo->T - 1) / mo->T) + c], l, y, x, n, d_iota,
                        cs);
    }
    const struct dev_experts d = moe_dev_experts_at(mo, l, mo->experts[l]);
    if (n <= CUDA_MOE_GEMV_MAX_ROWS) return moe_run_gemv(mo, &d, y, x, n, cs);
    if (n <= CUDA_MOE_GROUPED_MAX_ROWS && grouped_layer(mo, l)) return moe_run_grouped(mo, &d, y, x, n, cs);
    RC(group_rows(mo, n, cs));
    return grouped_products(mo, &d, kctx, y, x, n, cs);
}

/* Rows a chunk of layer l takes: a layer whose resident experts the grouped launches run takes them
 * CUDA_MOE_GROUPED_MAX_ROWS at a time (a 512-row prefill as two grouped chunks: measured on an H100 at
 * Qwen3-30B-A3B's shape, 1,755 µs a chunk of 256 rows against 5,661 µs for 512 rows expert by expert), every
 * other layer mo->T. */
static int chunk_of(const struct cuda_moe *mo, int l)
{
    return mo->experts[l] && grouped_layer(mo, l) && mo->T > CUDA_MOE_GROUPED_MAX_ROWS
               ? CUDA_MOE_GROUPED_MAX_ROWS
               : mo->T;
}

int cuda_moe_run(struct cuda_moe *mo, int l, float *y, const float *x, int n, struct kern_cuda_ctx *kctx,
                 const int32_t *d_iota, cudaStream_t cs)
{
    if (!mo || l < 0 || l >= mo->n_layers || n < 1 || n > mo->T_step) return FERRY_ERR_INVALID;
    const int T = chunk_of(mo, l);
    for (int r0 = 0, c = 0; r0 < n; r0 += T, c++) {
        const size_t at = (size_t)r0 * mo->dim;
        RC(run_chunk(mo, l, c, y + at, x + at, n - r0 < T ? n - r0 : T, kctx, d_iota, cs));
    }
    return FERRY_OK;
}
