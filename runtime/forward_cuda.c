/* forward_cuda — see forward_cuda.h for the contract.
 *
 * Sections: layer images (how one layer's tensors are packed into one block), init (plan, arena, uploads),
 * streaming (the slot ring), the forward pass, stats.
 */
#include "runtime/forward_cuda.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "kernels/core/fp16.h"
#include "kernels/core/log.h"
#include "kernels/core/status.h"
#include "kernels/cpu/ops.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/convert.h"
#include "kernels/cuda/matmul.h"
#include "kernels/cuda/ops.h"
#include "quant/dequant.h"

/* One checking macro for the CUDA runtime calls of this file: names the call and returns FERRY_ERR_CUDA. */
#define CK(call)                                                                                             \
    do {                                                                                                     \
        cudaError_t ck_e_ = (call);                                                                          \
        if (ck_e_ != cudaSuccess) {                                                                          \
            FLOG_ERROR("%s:%d: %s failed: %s", __FILE__, __LINE__, #call, cudaGetErrorString(ck_e_));        \
            return FERRY_ERR_CUDA;                                                                           \
        }                                                                                                    \
    } while (0)
#define RC(call)                                                                                             \
    do {                                                                                                     \
        int rc_ = (call);                                                                                    \
        if (rc_) return rc_;                                                                                 \
    } while (0)

#define ALIGN 256
#define GRAPH_MAX_TOKENS 16 /* decode batches up to this size replay graphs */
#define GRAPH_LENS 8        /* max_len buckets 256 .. 32768 */
static size_t align_up(size_t x) { return (x + ALIGN - 1) & ~(size_t)(ALIGN - 1); }

/* ---------------------------------------------------------------------------------------------------------- */
/* Layer images */

/* A layer's matrices in the groups one product reads: q|k|v and gate|up are stacked by rows into one matrix each,
 * so a decode step runs 4 matrix products per layer instead of 7 (fewer launches, wider products). */
enum { M_QKV, M_O, M_GU, M_DOWN, N_MATS };
enum { V_ATTN_NORM, V_FFN_NORM, V_BQKV, N_VECS };
#define MAX_PARTS 3

/* Where each tensor of a layer sits inside its packed block, and the type it has there. */
struct layer_layout {
    size_t mat_off[N_MATS];
    enum dtype mat_type[N_MATS];
    int64_t mat_rows[N_MATS], mat_cols[N_MATS];
    size_t vec_off[N_VECS]; /* SIZE_MAX when absent */
    size_t bytes;
};

/* Device pointers of one layer for one step (resident block or a slot). */
struct dev_layer {
    const void *mat[N_MATS];
    enum dtype mat_type[N_MATS];
    const float *vec[N_VECS];
};

/* The type a matrix has on the device: F32/F16/BF16/Q8_0 as stored (the GEMV reads them all); other GGUF
 * quants are converted to F16 at load. */
static enum dtype device_type(enum dtype t)
{
    return t == DTYPE_F32 || t == DTYPE_BF16 || t == DTYPE_Q8_0 ? t : DTYPE_F16;
}

/* The parts of group i, in row order; returns their count. */
static int group_parts(const struct model_layer *L, int i, const struct wview *parts[MAX_PARTS])
{
    switch (i) {
    case M_QKV: parts[0] = &L->wq, parts[1] = &L->wk, parts[2] = &L->wv; return 3;
    case M_O: parts[0] = &L->wo; return 1;
    case M_GU: parts[0] = &L->w_gate, parts[1] = &L->w_up; return 2;
    default: parts[0] = &L->w_down; return 1;
    }
}

/* A group keeps its parts' device type when they share one, else all parts become F16. */
static enum dtype group_type(const struct wview *const parts[], int n)
{
    for (int j = 1; j < n; j++)
        if (device_type(parts[j]->type) != device_type(parts[0]->type)) return DTYPE_F16;
    return device_type(parts[0]->type);
}

static size_t vec_len(const struct llm_hparams *hp, int i)
{
    const size_t qd = (size_t)hp->n_heads * hp->head_dim, kvd = (size_t)hp->n_kv_heads * hp->head_dim;
    return i == V_BQKV ? qd + 2 * kvd : (size_t)hp->dim;
}

static int has_vec(const struct model_layer *L, int i)
{
    return i == V_BQKV ? L->bq || L->bk || L->bv : (i == V_ATTN_NORM ? L->attn_norm : L->ffn_norm) != NULL;
}

static void layer_layout_of(const struct model_layer *L, const struct llm_hparams *hp, struct layer_layout *lay)
{
    size_t off = 0;
    for (int i = 0; i < N_MATS; i++) {
        const struct wview *parts[MAX_PARTS];
        const int n = group_parts(L, i, parts);
        lay->mat_type[i] = group_type(parts, n);
        lay->mat_off[i] = off;
        lay->mat_rows[i] = 0;
        lay->mat_cols[i] = parts[0]->cols;
        for (int j = 0; j < n; j++) lay->mat_rows[i] += parts[j]->rows;
        off = align_up(off + dtype_row_size(lay->mat_type[i], lay->mat_cols[i]) * (size_t)lay->mat_rows[i]);
    }
    for (int i = 0; i < N_VECS; i++) {
        if (!has_vec(L, i)) {
            lay->vec_off[i] = SIZE_MAX;
            continue;
        }
        lay->vec_off[i] = off;
        off = align_up(off + vec_len(hp, i) * sizeof(float));
    }
    lay->bytes = off;
}

/* Copies w into dst as type `to`: its own type, or F16 (converted row by row). */
static int pack_matrix(const struct wview *w, enum dtype to, void *dst, float *row_tmp)
{
    size_t row_bytes = dtype_row_size(w->type, w->cols);
    if (to == w->type) {
        memcpy(dst, w->data, row_bytes * (size_t)w->rows);
        return FERRY_OK;
    }
    uint16_t *out = dst;
    for (int64_t r = 0; r < w->rows; r++) {
        RC(dequant_row(w->type, (const char *)w->data + row_bytes * r, row_tmp, w->cols));
        for (int64_t c = 0; c < w->cols; c++) out[r * w->cols + c] = f32_to_f16(row_tmp[c]);
    }
    return FERRY_OK;
}

static int pack_layer(const struct model_layer *L, const struct llm_hparams *hp, const struct layer_layout *lay,
                      void *dst, float *row_tmp)
{
    for (int i = 0; i < N_MATS; i++) {
        const struct wview *parts[MAX_PARTS];
        const int n = group_parts(L, i, parts);
        char *at = (char *)dst + lay->mat_off[i];
        for (int j = 0; j < n; j++) {
            RC(pack_matrix(parts[j], lay->mat_type[i], at, row_tmp));
            at += dtype_row_size(lay->mat_type[i], parts[j]->cols) * (size_t)parts[j]->rows;
        }
    }
    for (int i = 0; i < N_VECS; i++) {
        if (lay->vec_off[i] == SIZE_MAX) continue;
        float *v = (float *)((char *)dst + lay->vec_off[i]);
        if (i != V_BQKV) {
            memcpy(v, i == V_ATTN_NORM ? L->attn_norm : L->ffn_norm, vec_len(hp, i) * sizeof(float));
            continue;
        }
        /* q|k|v biases stacked like their matrices; an absent one is zeros. */
        const size_t qd = (size_t)hp->n_heads * hp->head_dim, kvd = (size_t)hp->n_kv_heads * hp->head_dim;
        const float *src[3] = {L->bq, L->bk, L->bv};
        const size_t len[3] = {qd, kvd, kvd};
        for (int j = 0; j < 3; j++) {
            if (src[j])
                memcpy(v, src[j], len[j] * sizeof(float));
            else
                memset(v, 0, len[j] * sizeof(float));
            v += len[j];
        }
    }
    return FERRY_OK;
}

static void dev_layer_at(struct dev_layer *d, const struct layer_layout *lay, const void *base)
{
    for (int i = 0; i < N_MATS; i++) {
        d->mat[i] = (const char *)base + lay->mat_off[i];
        d->mat_type[i] = lay->mat_type[i];
    }
    for (int i = 0; i < N_VECS; i++)
        d->vec[i] = lay->vec_off[i] == SIZE_MAX ? NULL : (const float *)((const char *)base + lay->vec_off[i]);
}

/* ---------------------------------------------------------------------------------------------------------- */
/* State */

struct forward_cuda {
    struct device_map map;
    int max_tokens;
    int n_layers;
    struct layer_layout *layouts; /* (n_layers) */
    void *arena;                  /* the one device allocation */
    size_t arena_bytes;
    struct kern_cuda_ctx *kctx;
    cudaStream_t compute, copy;

    /* Weights. */
    void **resident;           /* (n_layers) device block of a resident layer, else NULL */
    void **host_block;         /* (n_layers) pinned block of a streamed layer, else NULL */
    void *host_pinned;         /* one pinned allocation holding every streamed block */
    void **slot;               /* (n_slots) device slots */
    int *stream_order;         /* (n_streamed) layer index of the i-th streamed layer of a pass */
    uint64_t stream_n;         /* streamed uses so far (across steps) */
    cudaEvent_t *copy_done;    /* (n_slots) */
    cudaEvent_t *slot_free;    /* (n_slots) */
    cudaEvent_t *copy_t0, *copy_t1; /* (2*n_streamed) timing of the copy for use n, at n mod 2S */
    cudaEvent_t *wait_t0, *wait_t1; /* (n_streamed) compute-stream stall around the wait for the i-th use */
    void *head;                /* output head (n_vocab, dim) in head_type */
    enum dtype head_type;
    float *out_norm;           /* (dim) */
    float *inv_freq;           /* (rope_dim/2) device */

    /* KV pool (f16) and its block table mirror. */
    uint16_t *k_cache, *v_cache; /* (n_layers, n_blocks, block_size, kvd) f16 */
    int32_t *d_block_table;      /* (n_seqs, max_blocks) */

    /* Activations. */
    float *x, *xn, *tmp, *qkv, *q, *att, *gu, *h;
    float *logits; /* (logit_rows, n_vocab) */
    int logit_rows;
    int32_t *d_ints;             /* tokens | pos | seq, (3, max_tokens) */
    void *attn_ws;
    size_t attn_ws_bytes;
    uint16_t *conv;              /* f16 scratch for a Q8_0 matrix in a prefill GEMM, or NULL */

    /* Pinned staging. */
    float *h_x;                  /* (max_tokens, dim) embeddings gathered on the host */
    int32_t *h_ints;             /* (3*max_tokens + n_seqs*max_blocks) */
    float *h_logits;             /* (max_tokens, n_vocab) */

    /* Decode steps of a fully resident model replay captured graphs: (GRAPH_MAX_TOKENS, GRAPH_LENS), or NULL. */
    cudaGraphExec_t *graphs;

    struct forward_cuda_stats stats;
};

const struct device_map *forward_cuda_map(const struct forward_cuda *f) { return &f->map; }
void forward_cuda_get_stats(const struct forward_cuda *f, struct forward_cuda_stats *st) { *st = f->stats; }

static void destroy_events(cudaEvent_t *ev, int n)
{
    if (!ev) return;
    for (int i = 0; i < n; i++)
        if (ev[i]) cudaEventDestroy(ev[i]);
    free(ev);
}

void forward_cuda_free(struct forward_cuda *f)
{
    if (!f) return;
    if (f->compute) cudaStreamSynchronize(f->compute);
    if (f->copy) cudaStreamSynchronize(f->copy);
    int k = f->map.n_slots, S = f->map.n_streamed;
    destroy_events(f->copy_done, k);
    destroy_events(f->slot_free, k);
    destroy_events(f->copy_t0, 2 * S);
    destroy_events(f->copy_t1, 2 * S);
    destroy_events(f->wait_t0, S);
    destroy_events(f->wait_t1, S);
    if (f->graphs) {
        for (int i = 0; i < GRAPH_MAX_TOKENS * GRAPH_LENS; i++)
            if (f->graphs[i]) cudaGraphExecDestroy(f->graphs[i]);
        free(f->graphs);
    }
    kern_cuda_ctx_free(f->kctx);
    if (f->arena) cudaFree(f->arena);
    if (f->host_pinned) cudaFreeHost(f->host_pinned);
    if (f->h_x) cudaFreeHost(f->h_x);
    if (f->h_ints) cudaFreeHost(f->h_ints);
    if (f->h_logits) cudaFreeHost(f->h_logits);
    if (f->compute) cudaStreamDestroy(f->compute);
    if (f->copy) cudaStreamDestroy(f->copy);
    free(f->layouts);
    free(f->resident);
    free(f->host_block);
    free(f->slot);
    free(f->stream_order);
    device_map_free(&f->map);
    free(f);
}

static int create_events(cudaEvent_t **out, int n, unsigned flags)
{
    *out = calloc((size_t)(n > 0 ? n : 1), sizeof **out);
    if (!*out) return FERRY_ERR_NOMEM;
    for (int i = 0; i < n; i++) CK(cudaEventCreateWithFlags(&(*out)[i], flags));
    return FERRY_OK;
}

/* ---------------------------------------------------------------------------------------------------------- */
/* Bandwidth probes (for the planner's prediction and `ferry bench`'s ceilings) */

void forward_cuda_measure_bandwidth(double *h2d, double *d2d)
{
    *h2d = *d2d = 0;
    const size_t bytes = 256u << 20;
    void *host = NULL, *a = NULL, *b = NULL;
    cudaEvent_t e0 = NULL, e1 = NULL;
    if (cudaHostAlloc(&host, bytes, cudaHostAllocDefault) != cudaSuccess) goto out;
    if (cudaMalloc(&a, bytes) != cudaSuccess || cudaMalloc(&b, bytes) != cudaSuccess) goto out;
    memset(host, 1, bytes);
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    float ms = 0;
    cudaMemcpy(a, host, bytes, cudaMemcpyHostToDevice); /* warm-up */
    cudaEventRecord(e0, 0);
    for (int i = 0; i < 4; i++) cudaMemcpyAsync(a, host, bytes, cudaMemcpyHostToDevice, 0);
    cudaEventRecord(e1, 0);
    cudaEventSynchronize(e1);
    if (cudaEventElapsedTime(&ms, e0, e1) == cudaSuccess && ms > 0) *h2d = 4.0 * bytes / (ms * 1e-3);
    cudaMemcpy(b, a, bytes, cudaMemcpyDeviceToDevice);
    cudaEventRecord(e0, 0);
    for (int i = 0; i < 8; i++) cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, 0);
    cudaEventRecord(e1, 0);
    cudaEventSynchronize(e1);
    /* A device copy reads and writes every byte. */
    if (cudaEventElapsedTime(&ms, e0, e1) == cudaSuccess && ms > 0) *d2d = 2.0 * 8 * bytes / (ms * 1e-3);
out:
    if (e0) cudaEventDestroy(e0);
    if (e1) cudaEventDestroy(e1);
    cudaFree(a);
    cudaFree(b);
    if (host) cudaFreeHost(host);
    cudaGetLastError();
}

/* ---------------------------------------------------------------------------------------------------------- */
/* Init */

struct carve {
    char *base;
    size_t off, cap;
};

static void *carve(struct carve *c, size_t bytes)
{
    size_t at = align_up(c->off);
    if (at + bytes > c->cap) return NULL;
    c->off = at + bytes;
    return c->base + at;
}

/* Rows of the device logits buffer: a step rarely wants more than one row per sequence (the last prompt
 * position, or a decode token); more are projected in chunks of this many rows. At least a decode graph's
 * batch, so graph steps project in one go. */
static int logit_rows(int T, int n_seqs)
{
    const int r = n_seqs > GRAPH_MAX_TOKENS ? n_seqs : GRAPH_MAX_TOKENS;
    return r < T ? r : T;
}

/* Device bytes of the activations for max_tokens rows. */
static size_t activation_bytes(const struct llm_hparams *hp, int T, int n_seqs, int max_blocks)
{
    const size_t qd = (size_t)hp->n_heads * hp->head_dim, kvd = (size_t)hp->n_kv_heads * hp->head_dim;
    /* x, xn, tmp (dim); qkv; q, att (qd); gate|up (2 ffn); h (ffn); then the logits' rows. */
    size_t floats = (size_t)T * (3 * (size_t)hp->dim + 3 * qd + 2 * kvd + 3 * (size_t)hp->ffn_dim) +
                    (size_t)logit_rows(T, n_seqs) * hp->n_vocab;
    return floats * sizeof(float) + 12 * ALIGN + (size_t)3 * T * sizeof(int32_t) +
           (size_t)n_seqs * max_blocks * sizeof(int32_t) + (size_t)(hp->rope_dim / 2) * sizeof(float);
}

static int upload_layers(struct forward_cuda *f, const struct model *m)
{
    const struct llm_hparams *hp = &m->hp;
    size_t max_bytes = f->map.layer_bytes;
    int64_t max_cols = hp->dim > hp->ffn_dim ? hp->dim : hp->ffn_dim;
    if ((int64_t)hp->n_heads * hp->head_dim > max_cols) max_cols = (int64_t)hp->n_heads * hp->head_dim;
    float *row_tmp = malloc((size_t)max_cols * sizeof(float));
    void *staging[2] = {NULL, NULL};
    cudaEvent_t staged[2] = {NULL, NULL};
    int rc = FERRY_ERR_NOMEM;
    if (!row_tmp) goto out;
    rc = FERRY_ERR_CUDA;
    for (int i = 0; i < 2; i++)
        if (cudaHostAlloc(&staging[i], max_bytes, cudaHostAllocDefault) != cudaSuccess ||
            cudaEventCreateWithFlags(&staged[i], cudaEventDisableTiming) != cudaSuccess)
            goto out;
    int n_up = 0;
    for (int l = 0; l < f->n_layers; l++) {
        void *dst;
        if (f->resident[l]) {
            /* Double-buffered: pack layer l while the copy of layer l-1 runs. */
            int s = n_up++ & 1;
            if (cudaEventSynchronize(staged[s]) != cudaSuccess) goto out;
            dst = staging[s];
            if ((rc = pack_layer(&m->layers[l], hp, &f->layouts[l], dst, row_tmp))) goto out;
            rc = FERRY_ERR_CUDA;
            if (cudaMemcpyAsync(f->resident[l], dst, f->layouts[l].bytes, cudaMemcpyHostToDevice, f->copy) !=
                    cudaSuccess ||
                cudaEventRecord(staged[s], f->copy) != cudaSuccess)
                goto out;
        } else {
            if ((rc = pack_layer(&m->layers[l], hp, &f->layouts[l], f->host_block[l], row_tmp))) goto out;
        }
        if ((l + 1) % 8 == 0 || l + 1 == f->n_layers)
            FLOG_INFO("uploading weights: %d/%d layers (%d resident so far)", l + 1, f->n_layers, n_up);
    }
    rc = cudaStreamSynchronize(f->copy) == cudaSuccess ? FERRY_OK : FERRY_ERR_CUDA;
out:
    for (int i = 0; i < 2; i++) {
        if (staged[i]) cudaEventDestroy(staged[i]);
        if (staging[i]) cudaFreeHost(staging[i]);
    }
    free(row_tmp);
    return rc;
}

static int upload_head(struct forward_cuda *f, const struct model *m)
{
    const struct wview *w = &m->output;
    size_t bytes = dtype_row_size(f->head_type, w->cols) * (size_t)w->rows;
    void *h = malloc(bytes);
    float *row = malloc((size_t)w->cols * sizeof(float));
    int rc = FERRY_ERR_NOMEM;
    if (h && row && !(rc = pack_matrix(w, f->head_type, h, row))) {
        rc = cudaMemcpy(f->head, h, bytes, cudaMemcpyHostToDevice) == cudaSuccess ? FERRY_OK : FERRY_ERR_CUDA;
        if (!rc)
            rc = cudaMemcpy(f->out_norm, m->output_norm, (size_t)m->hp.dim * sizeof(float),
                            cudaMemcpyHostToDevice) == cudaSuccess
                     ? FERRY_OK
                     : FERRY_ERR_CUDA;
    }
    free(h);
    free(row);
    return rc;
}

/* What a plan has to fit, from the model's shapes and the KV pool's geometry (no device needed). */
struct plan_sizes {
    size_t layer_bytes;   /* the largest layer image */
    size_t head_bytes;    /* output head + final norm */
    size_t fixed_bytes;   /* KV pool (f16), activations, attention workspace; cuBLAS's context not included */
    size_t attn_ws_bytes;
    size_t max_x;         /* largest x of a GEMM, in elements (sizes the cuBLAS context) */
    size_t conv_bytes;    /* f16 scratch for the largest Q8_0 matrix (prefill GEMMs), 0 when none */
};

static void plan_sizes_of(const struct model *m, const struct kv_cache *kv, int T, struct layer_layout *layouts,
                          struct plan_sizes *ps)
{
    const struct llm_hparams *hp = &m->hp;
    memset(ps, 0, sizeof *ps);
    for (int l = 0; l < hp->n_layers; l++) {
        struct layer_layout tmp, *lay = layouts ? &layouts[l] : &tmp;
        layer_layout_of(&m->layers[l], hp, lay);
        if (lay->bytes > ps->layer_bytes) ps->layer_bytes = lay->bytes;
        for (int i = 0; i < N_MATS; i++)
            if (lay->mat_type[i] == DTYPE_Q8_0 && (size_t)(lay->mat_rows[i] * lay->mat_cols[i]) * 2 > ps->conv_bytes)
                ps->conv_bytes = (size_t)(lay->mat_rows[i] * lay->mat_cols[i]) * 2;
    }
    if (device_type(m->output.type) == DTYPE_Q8_0 && (size_t)(m->output.rows * m->output.cols) * 2 > ps->conv_bytes)
        ps->conv_bytes = (size_t)(m->output.rows * m->output.cols) * 2;
    ps->head_bytes = align_up(dtype_row_size(device_type(m->output.type), m->output.cols) * (size_t)m->output.rows) +
                     align_up((size_t)hp->dim * sizeof(float));
    const size_t kv_elems = (size_t)hp->n_layers * kv->n_blocks * kv->block_size * hp->n_kv_heads * hp->head_dim;
    ps->attn_ws_bytes = kern_cuda_attention_ws_size(T, hp->n_heads, hp->head_dim, kv->ctx_size);
    ps->fixed_bytes = 2 * align_up(kv_elems * sizeof(uint16_t)) + activation_bytes(hp, T, kv->n_seqs, kv->max_blocks) +
                      align_up(ps->attn_ws_bytes) + align_up(ps->conv_bytes);
    ps->max_x = (size_t)T * (size_t)(hp->ffn_dim > hp->dim ? hp->ffn_dim : hp->dim);
    if ((size_t)T * hp->n_heads * hp->head_dim > ps->max_x) ps->max_x = (size_t)T * hp->n_heads * hp->head_dim;
}

int forward_cuda_plan_offline(const struct model *m, const struct kv_cache *kv, const struct forward_cuda_params *p,
                              double h2d, double hbm, struct device_map *out, char err[256])
{
    struct plan_sizes ps;
    plan_sizes_of(m, kv, p->max_tokens, NULL, &ps);
    /* The cuBLAS context: x rounded to f16 plus its 32 MiB workspace (as kern_cuda_ctx_init sizes it). */
    const size_t ctx_bytes = ps.max_x * 2 + (32u << 20);
    if (p->gpu_memory <= 0) {
        snprintf(err, 256, "give --gpu-memory SIZE to plan without a device");
        return FERRY_ERR_INVALID;
    }
    struct device_map_input in = {.n_layers = m->hp.n_layers, .layer_bytes = ps.layer_bytes,
                                  .head_bytes = ps.head_bytes, .fixed_bytes = ps.fixed_bytes + ctx_bytes,
                                  .budget = (uint64_t)p->gpu_memory, .gpu_layers = p->gpu_layers,
                                  .n_slots = p->n_slots, .h2d_bytes_per_s = h2d, .hbm_bytes_per_s = hbm};
    return device_map_plan(&in, out, err);
}

static int issue_copy(struct forward_cuda *f, uint64_t n);

int forward_cuda_init(struct forward_cuda **out, const struct model *m, const struct kv_cache *kv,
                      const struct forward_cuda_params *p, char err[256])
{
    *out = NULL;
    const struct llm_hparams *hp = &m->hp;
    if (kern_cuda_device_count() <= 0) {
        snprintf(err, 256, "no CUDA device");
        return FERRY_ERR_UNSUPPORTED;
    }
    if (hp->head_dim % 8 || hp->head_dim > 256) {
        snprintf(err, 256, "head_dim %d is not supported by the CUDA attention (multiple of 8, <= 256)", hp->head_dim);
        return FERRY_ERR_UNSUPPORTED;
    }
    struct forward_cuda *f = calloc(1, sizeof *f);
    if (!f) return FERRY_ERR_NOMEM;
    int rc = FERRY_ERR_NOMEM;
    const int L = hp->n_layers, T = p->max_tokens;
    /* Device memory free before this backend takes any (the CUDA context itself is created here). */
    size_t free_start = 0, total_start = 0;
    cudaFree(0);
    cudaMemGetInfo(&free_start, &total_start);
    f->n_layers = L;
    f->max_tokens = T;
    f->layouts = calloc((size_t)L, sizeof *f->layouts);
    f->resident = calloc((size_t)L, sizeof *f->resident);
    f->host_block = calloc((size_t)L, sizeof *f->host_block);
    if (!f->layouts || !f->resident || !f->host_block) goto fail;
    struct plan_sizes ps;
    plan_sizes_of(m, kv, T, f->layouts, &ps);
    const size_t layer_bytes = ps.layer_bytes, head_bytes = ps.head_bytes;
    const size_t kvd = (size_t)hp->n_kv_heads * hp->head_dim;
    const size_t kv_elems = (size_t)L * kv->n_blocks * kv->block_size * kvd;
    f->head_type = device_type(m->output.type);
    f->attn_ws_bytes = ps.attn_ws_bytes;

    rc = FERRY_ERR_CUDA;
    if (cudaStreamCreateWithFlags(&f->compute, cudaStreamNonBlocking) != cudaSuccess ||
        cudaStreamCreateWithFlags(&f->copy, cudaStreamNonBlocking) != cudaSuccess) {
        snprintf(err, 256, "cannot create CUDA streams");
        goto fail;
    }
    if ((rc = kern_cuda_ctx_init(&f->kctx, ps.max_x))) {
        snprintf(err, 256, "cannot create the cuBLAS context");
        goto fail;
    }
    size_t fixed = ps.fixed_bytes + kern_cuda_ctx_bytes(f->kctx);

    /* Budget: explicit, or what the card has free minus the reserve. Device memory the CUDA runtime and cuBLAS
     * took for themselves since init began (handles, module images) counts against an explicit budget too:
     * it is measured here, not guessed (bounded, in case other processes change the free figure meanwhile). */
    size_t free_b = 0, total_b = 0;
    cudaMemGetInfo(&free_b, &total_b);
    const size_t ctx_bytes = kern_cuda_ctx_bytes(f->kctx);
    size_t overhead = free_start > free_b + ctx_bytes ? free_start - free_b - ctx_bytes : 0;
    if (overhead > ((size_t)512 << 20)) overhead = (size_t)512 << 20;
    uint64_t budget = p->gpu_memory > 0 ? (uint64_t)p->gpu_memory
                                        : (free_b + ctx_bytes > (size_t)p->reserve_vram
                                               ? free_b + ctx_bytes - (uint64_t)p->reserve_vram
                                               : 0);
    const uint64_t plan_budget = p->gpu_memory > 0 ? (budget > overhead ? budget - overhead : 0) : budget;
    double h2d = 0, d2d = 0;
    forward_cuda_measure_bandwidth(&h2d, &d2d);
    struct device_map_input in = {.n_layers = L, .layer_bytes = layer_bytes, .head_bytes = head_bytes,
                                  .fixed_bytes = fixed, .budget = plan_budget, .gpu_layers = p->gpu_layers,
                                  .n_slots = p->n_slots, .h2d_bytes_per_s = h2d, .hbm_bytes_per_s = d2d};
    if ((rc = device_map_plan(&in, &f->map, err))) {
        if (rc == FERRY_ERR_DEVICE_MEM && overhead) {
            char plan_err[256];
            snprintf(plan_err, sizeof plan_err, "%s", err);
            snprintf(err, 256, "%.180s (after %.0f MiB the CUDA runtime and cuBLAS take themselves)", plan_err,
                     overhead / 1048576.0);
        }
        goto fail;
    }
    f->stats.vram_budget = budget;
    f->stats.vram_planned = f->map.bytes_total;
    char desc[2048];
    device_map_format(&f->map, desc, sizeof desc);
    FLOG_INFO("measured host->device %.1f GB/s, device memory %.0f GB/s; budget %.2f GiB (%.0f MiB of it taken by the "
              "CUDA runtime and cuBLAS themselves)",
              h2d / 1e9, d2d / 1e9, budget / 1073741824.0, overhead / 1048576.0);
    FLOG_INFO("%s", desc);

    /* The arena: everything except cuBLAS's own workspace (already allocated by kern_cuda_ctx_init). */
    f->arena_bytes = f->map.bytes_total - kern_cuda_ctx_bytes(f->kctx);
    if (cudaMalloc(&f->arena, f->arena_bytes) != cudaSuccess) {
        cudaGetLastError();
        snprintf(err, 256, "cudaMalloc of %.2f GiB failed (the card has %.2f GiB free)", f->arena_bytes / 1073741824.0,
                 free_b / 1073741824.0);
        rc = FERRY_ERR_DEVICE_MEM;
        goto fail;
    }
    struct carve c = {.base = f->arena, .off = 0, .cap = f->arena_bytes};
    f->k_cache = carve(&c, kv_elems * sizeof(uint16_t));
    f->v_cache = carve(&c, kv_elems * sizeof(uint16_t));
    f->x = carve(&c, (size_t)T * hp->dim * sizeof(float));
    f->xn = carve(&c, (size_t)T * hp->dim * sizeof(float));
    f->tmp = carve(&c, (size_t)T * hp->dim * sizeof(float));
    f->q = carve(&c, (size_t)T * hp->n_heads * hp->head_dim * sizeof(float));
    f->att = carve(&c, (size_t)T * hp->n_heads * hp->head_dim * sizeof(float));
    f->qkv = carve(&c, (size_t)T * (hp->n_heads * hp->head_dim + 2 * kvd) * sizeof(float));
    f->gu = carve(&c, (size_t)T * 2 * hp->ffn_dim * sizeof(float));
    f->h = carve(&c, (size_t)T * hp->ffn_dim * sizeof(float));
    f->logit_rows = logit_rows(T, kv->n_seqs);
    f->logits = carve(&c, (size_t)f->logit_rows * hp->n_vocab * sizeof(float));
    f->d_ints = carve(&c, (size_t)3 * T * sizeof(int32_t));
    f->d_block_table = carve(&c, (size_t)kv->n_seqs * kv->max_blocks * sizeof(int32_t));
    f->attn_ws = carve(&c, f->attn_ws_bytes ? f->attn_ws_bytes : 1);
    f->conv = ps.conv_bytes ? carve(&c, ps.conv_bytes) : NULL;
    f->inv_freq = carve(&c, (size_t)(hp->rope_dim / 2) * sizeof(float));
    f->head = carve(&c, dtype_row_size(f->head_type, m->output.cols) * (size_t)m->output.rows);
    f->out_norm = carve(&c, (size_t)hp->dim * sizeof(float));
    int S = f->map.n_streamed, k = f->map.n_slots;
    f->slot = calloc((size_t)(k > 0 ? k : 1), sizeof *f->slot);
    f->stream_order = calloc((size_t)(S > 0 ? S : 1), sizeof *f->stream_order);
    if (!f->slot || !f->stream_order) {
        rc = FERRY_ERR_NOMEM;
        goto fail;
    }
    for (int l = 0, si = 0; l < L; l++) {
        if (f->map.where[l] == PLACEMENT_GPU)
            f->resident[l] = carve(&c, layer_bytes);
        else
            f->stream_order[si++] = l;
    }
    for (int i = 0; i < k; i++) f->slot[i] = carve(&c, layer_bytes);
    if (!f->k_cache || !f->v_cache || !f->x || !f->xn || !f->tmp || !f->q || !f->att || !f->qkv || !f->gu ||
        !f->h || !f->logits || !f->d_ints || !f->d_block_table || !f->attn_ws || !f->inv_freq || !f->head ||
        !f->out_norm || (k && !f->slot[k - 1]) || (ps.conv_bytes && !f->conv)) {
        snprintf(err, 256, "internal: the device arena of %zu bytes is too small for its plan", f->arena_bytes);
        rc = FERRY_ERR_INTERNAL;
        goto fail;
    }
    rc = FERRY_ERR_CUDA;
    if (cudaMemcpy(f->inv_freq, m->inv_freq, (size_t)(hp->rope_dim / 2) * sizeof(float), cudaMemcpyHostToDevice) !=
        cudaSuccess)
        goto fail;

    /* Pinned host memory: staging, and one block for every streamed layer. */
    if (cudaHostAlloc((void **)&f->h_x, (size_t)T * hp->dim * sizeof(float), cudaHostAllocDefault) != cudaSuccess ||
        cudaHostAlloc((void **)&f->h_ints, ((size_t)3 * T + (size_t)kv->n_seqs * kv->max_blocks) * sizeof(int32_t),
                      cudaHostAllocDefault) != cudaSuccess ||
        cudaHostAlloc((void **)&f->h_logits, (size_t)T * hp->n_vocab * sizeof(float), cudaHostAllocDefault) !=
            cudaSuccess) {
        snprintf(err, 256, "cannot pin host staging memory");
        goto fail;
    }
    if (S) {
        FLOG_INFO("pinning %.2f GiB of host memory for %d streamed layers", (double)S * layer_bytes / 1073741824.0, S);
        if (cudaHostAlloc(&f->host_pinned, (size_t)S * layer_bytes, cudaHostAllocWriteCombined) != cudaSuccess) {
            cudaGetLastError();
            snprintf(err, 256, "cannot pin %.2f GiB of host memory for the streamed layers",
                     (double)S * layer_bytes / 1073741824.0);
            rc = FERRY_ERR_NOMEM;
            goto fail;
        }
        for (int i = 0; i < S; i++) f->host_block[f->stream_order[i]] = (char *)f->host_pinned + (size_t)i * layer_bytes;
    }
    if ((rc = create_events(&f->copy_done, k, cudaEventDisableTiming)) ||
        (rc = create_events(&f->slot_free, k, cudaEventDisableTiming)) ||
        (rc = create_events(&f->copy_t0, 2 * S, cudaEventDefault)) ||
        (rc = create_events(&f->copy_t1, 2 * S, cudaEventDefault)) ||
        (rc = create_events(&f->wait_t0, S, cudaEventDefault)) || (rc = create_events(&f->wait_t1, S, cudaEventDefault))) {
        snprintf(err, 256, "cannot create CUDA events");
        goto fail;
    }
    if ((rc = upload_layers(f, m)) || (rc = upload_head(f, m))) {
        snprintf(err, 256, "uploading the weights failed (%s)", ferry_status_str(rc));
        goto fail;
    }
    /* Zero the KV pool once so that no step can ever read uninitialised halves as NaN, and the attention
     * workspace, whose split-arrival counters must start at zero (kernels/cuda/attention.h). */
    if (cudaMemset(f->k_cache, 0, kv_elems * sizeof(uint16_t)) != cudaSuccess ||
        cudaMemset(f->v_cache, 0, kv_elems * sizeof(uint16_t)) != cudaSuccess ||
        cudaMemset(f->attn_ws, 0, f->attn_ws_bytes ? f->attn_ws_bytes : 1) != cudaSuccess)
        goto fail;
    for (int i = 0; i < k; i++)
        if ((rc = issue_copy(f, (uint64_t)i))) goto fail;
    /* Graphs need a fixed set of kernels and no cross-stream waits: only when nothing streams. */
    if (S == 0 && !getenv("FERRY_NO_CUDA_GRAPHS"))
        f->graphs = calloc((size_t)GRAPH_MAX_TOKENS * GRAPH_LENS, sizeof *f->graphs);
    cudaMemGetInfo(&free_b, &total_b);
    f->stats.vram_used = free_start > free_b ? free_start - free_b : 0;
    *out = f;
    return FERRY_OK;
fail:
    if (!err[0]) snprintf(err, 256, "CUDA backend initialisation failed (%s)", ferry_status_str(rc));
    forward_cuda_free(f);
    return rc;
}

/* ---------------------------------------------------------------------------------------------------------- */
/* Streaming */

/* Queues the copy for streamed use n into slot n mod k, after the compute stream has released that slot. */
static int issue_copy(struct forward_cuda *f, uint64_t n)
{
    const int k = f->map.n_slots, S = f->map.n_streamed;
    const int s = (int)(n % (uint64_t)k), l = f->stream_order[n % (uint64_t)S];
    const int e = (int)(n % (uint64_t)(2 * S));
    CK(cudaStreamWaitEvent(f->copy, f->slot_free[s], 0));
    CK(cudaEventRecord(f->copy_t0[e], f->copy));
    CK(cudaMemcpyAsync(f->slot[s], f->host_block[l], f->layouts[l].bytes, cudaMemcpyHostToDevice, f->copy));
    CK(cudaEventRecord(f->copy_t1[e], f->copy));
    CK(cudaEventRecord(f->copy_done[s], f->copy));
    f->stats.bytes_streamed += f->layouts[l].bytes;
    return FERRY_OK;
}

/* The weights of layer l for this step; for a streamed layer, waits (on the device) for its copy. */
static int layer_acquire(struct forward_cuda *f, int l, int step_use, struct dev_layer *d)
{
    if (f->resident[l]) {
        dev_layer_at(d, &f->layouts[l], f->resident[l]);
        return FERRY_OK;
    }
    const int s = (int)(f->stream_n % (uint64_t)f->map.n_slots);
    CK(cudaEventRecord(f->wait_t0[step_use], f->compute));
    CK(cudaStreamWaitEvent(f->compute, f->copy_done[s], 0));
    CK(cudaEventRecord(f->wait_t1[step_use], f->compute));
    dev_layer_at(d, &f->layouts[l], f->slot[s]);
    return FERRY_OK;
}

/* Hands the slot back and queues the copy that will next use it (k streamed uses ahead). */
static int layer_release(struct forward_cuda *f, int l)
{
    if (f->resident[l]) return FERRY_OK;
    const int s = (int)(f->stream_n % (uint64_t)f->map.n_slots);
    CK(cudaEventRecord(f->slot_free[s], f->compute));
    RC(issue_copy(f, f->stream_n + (uint64_t)f->map.n_slots));
    f->stream_n++;
    return FERRY_OK;
}

/* ---------------------------------------------------------------------------------------------------------- */
/* Forward */

static int linear(struct forward_cuda *f, float *y, const float *x, const void *w, enum dtype t, const float *bias,
                  int m, int64_t rows, int64_t cols)
{
    /* Prefill-sized products with Q8_0 weights: convert to f16 once, then the tensor-core GEMM. */
    if (t == DTYPE_Q8_0 && m > KERN_CUDA_GEMV_MAX_M) {
        RC(kern_cuda_q8_0_to_f16(f->conv, w, rows, cols, f->compute));
        w = f->conv;
        t = DTYPE_F16;
    }
    return kern_cuda_matmul(f->kctx, y, x, w, t, bias, m, (int)rows, (int)cols, f->compute);
}

/* max_len only sizes the attention's KV split; rounding it up to a power of two (>= 256) keeps the set of
 * launch shapes small enough to capture each once as a graph, and gives every placement the same splits
 * (so their results stay bitwise equal). */
static int bucket_len(int max_len, int cap)
{
    int b = 256;
    while (b < max_len) b *= 2;
    return b < cap ? b : cap;
}

/* Everything a step does on the device, from the uploads of the staged inputs to the download of the logits.
 * Enqueued on the compute stream; capturable as a graph when no layer streams. */
static int enqueue_step(struct forward_cuda *f, const struct model *m, const struct kv_cache *kv, int n,
                        const uint8_t *want, int hidden, int max_len, int *n_out_p, int *step_use_p)
{
    const struct llm_hparams *hp = &m->hp;
    const int dim = hp->dim, hd = hp->head_dim, ffn = hp->ffn_dim;
    const int qd = hp->n_heads * hd, kvd = hp->n_kv_heads * hd;
    const float scale = 1.0f / sqrtf((float)hd);
    cudaStream_t cs = f->compute;
    size_t bt = (size_t)kv->n_seqs * kv->max_blocks;
    CK(cudaMemcpyAsync(f->x, f->h_x, (size_t)n * dim * sizeof(float), cudaMemcpyHostToDevice, cs));
    CK(cudaMemcpyAsync(f->d_ints, f->h_ints, (3 * (size_t)f->max_tokens) * sizeof(int32_t), cudaMemcpyHostToDevice, cs));
    CK(cudaMemcpyAsync(f->d_block_table, f->h_ints + 3 * f->max_tokens, bt * sizeof(int32_t), cudaMemcpyHostToDevice,
                       cs));
    const int32_t *d_pos = f->d_ints + f->max_tokens, *d_seq = f->d_ints + 2 * f->max_tokens;
    const size_t per_layer = (size_t)kv->n_blocks * kv->block_size * kvd;

    int step_use = 0;
    for (int l = 0; l < hp->n_layers; l++) {
        struct dev_layer d;
        RC(layer_acquire(f, l, step_use, &d));
        struct kern_cuda_kv_layer view = {.k = f->k_cache + per_layer * l, .v = f->v_cache + per_layer * l,
                                          .n_blocks = kv->n_blocks, .block_size = kv->block_size,
                                          .block_table = f->d_block_table, .max_blocks = kv->max_blocks,
                                          .n_kv_heads = hp->n_kv_heads, .head_dim = hd};
        /* The residual add of the previous layer's MLP is fused with this layer's norm. */
        if (l == 0)
            RC(kern_cuda_rmsnorm(f->xn, f->x, d.vec[V_ATTN_NORM], n, dim, hp->norm_eps, cs));
        else
            RC(kern_cuda_add_rmsnorm(f->x, f->tmp, f->xn, d.vec[V_ATTN_NORM], n, dim, hp->norm_eps, cs));
        RC(linear(f, f->qkv, f->xn, d.mat[M_QKV], d.mat_type[M_QKV], d.vec[V_BQKV], n, qd + 2 * kvd, dim));
        RC(kern_cuda_rope_kv_store(f->q, f->qkv, &view, d_seq, d_pos, n, hp->n_heads, hp->rope_dim, f->inv_freq,
                                   hp->rope_style, cs));
        RC(kern_cuda_attention(f->att, f->q, &view, d_seq, d_pos, n, hp->n_heads, scale, max_len, KERN_ATTN_AUTO,
                               f->attn_ws, f->attn_ws_bytes, cs));
        RC(linear(f, f->tmp, f->att, d.mat[M_O], d.mat_type[M_O], NULL, n, dim, qd));
        RC(kern_cuda_add_rmsnorm(f->x, f->tmp, f->xn, d.vec[V_FFN_NORM], n, dim, hp->norm_eps, cs));
        RC(linear(f, f->gu, f->xn, d.mat[M_GU], d.mat_type[M_GU], NULL, n, 2 * ffn, dim));
        RC(kern_cuda_silu_mul(f->h, f->gu, n, ffn, cs));
        RC(linear(f, f->tmp, f->h, d.mat[M_DOWN], d.mat_type[M_DOWN], NULL, n, dim, ffn));
        if (!f->resident[l]) step_use++;
        RC(layer_release(f, l));
    }

    /* The last residual add with the final norm, for every row; rows that want logits are then gathered
     * (device-to-device) and projected. */
    RC(kern_cuda_add_rmsnorm(f->x, f->tmp, f->xn, f->out_norm, n, dim, hp->norm_eps, cs));
    int n_out = 0;
    for (int i = 0; i < n; i++)
        if (want[i]) {
            if (n_out != i)
                CK(cudaMemcpyAsync(f->xn + (size_t)n_out * dim, f->xn + (size_t)i * dim, dim * sizeof(float),
                                   cudaMemcpyDeviceToDevice, cs));
            n_out++;
        }
    if (hidden) { /* embeddings: the normed rows themselves (h_logits holds T rows of n_vocab >= dim floats) */
        if (n_out)
            CK(cudaMemcpyAsync(f->h_logits, f->xn, (size_t)n_out * dim * sizeof(float), cudaMemcpyDeviceToHost, cs));
        *n_out_p = n_out;
        *step_use_p = step_use;
        return FERRY_OK;
    }
    /* In chunks of the device buffer's rows; each chunk's download is ordered before the next chunk's product. */
    for (int c = 0; c < n_out; c += f->logit_rows) {
        const int r = n_out - c < f->logit_rows ? n_out - c : f->logit_rows;
        RC(linear(f, f->logits, f->xn + (size_t)c * dim, f->head, f->head_type, NULL, r, hp->n_vocab, dim));
        CK(cudaMemcpyAsync(f->h_logits + (size_t)c * hp->n_vocab, f->logits,
                           (size_t)r * hp->n_vocab * sizeof(float), cudaMemcpyDeviceToHost, cs));
    }
    *n_out_p = n_out;
    *step_use_p = step_use;
    return FERRY_OK;
}

/* The graph for a decode step of n tokens that all want logits, at a max_len bucket; captured on first use. */
static int step_graph(struct forward_cuda *f, const struct model *m, const struct kv_cache *kv, int n,
                      const uint8_t *want, int max_len, cudaGraphExec_t *out)
{
    int li = 0;
    while ((256 << li) < max_len) li++;
    cudaGraphExec_t *slot = &f->graphs[(size_t)(n - 1) * GRAPH_LENS + (size_t)li];
    if (!*slot) {
        int n_out, uses;
        cudaGraph_t g = NULL;
        CK(cudaStreamBeginCapture(f->compute, cudaStreamCaptureModeThreadLocal));
        int rc = enqueue_step(f, m, kv, n, want, 0, max_len, &n_out, &uses);
        cudaError_t ce = cudaStreamEndCapture(f->compute, &g);
        if (rc || ce != cudaSuccess) {
            if (g) cudaGraphDestroy(g);
            cudaGetLastError();
            return rc ? rc : FERRY_ERR_CUDA;
        }
        ce = cudaGraphInstantiate(slot, g, 0);
        cudaGraphDestroy(g);
        if (ce != cudaSuccess) {
            *slot = NULL;
            cudaGetLastError();
            return FERRY_ERR_CUDA;
        }
    }
    *out = *slot;
    return FERRY_OK;
}

int forward_cuda_run(struct forward_cuda *f, const struct model *m, const struct kv_cache *kv, const struct batch *b,
                     float *logits)
{
    const struct llm_hparams *hp = &m->hp;
    const int n = b->n_tokens, dim = hp->dim;
    if (n <= 0 || n > f->max_tokens) return FERRY_ERR_INVALID;

    /* Host side: embeddings, ids and the block table are staged in pinned memory. */
    RC(kern_cpu_embed(f->h_x, m->tok_embd.data, m->tok_embd.type, (int)m->tok_embd.rows, dim, b->tokens, n));
    int max_len = 0, all_want = 1;
    for (int i = 0; i < n; i++) {
        f->h_ints[i] = b->tokens[i];
        f->h_ints[f->max_tokens + i] = b->pos[i];
        f->h_ints[2 * f->max_tokens + i] = b->seq[i];
        if (b->pos[i] + 1 > max_len) max_len = b->pos[i] + 1;
        all_want &= b->want_logits[i] != 0;
    }
    max_len = bucket_len(max_len, kv->max_blocks * kv->block_size);
    memcpy(f->h_ints + 3 * f->max_tokens, kv->block_table, (size_t)kv->n_seqs * kv->max_blocks * sizeof(int32_t));

    const uint64_t first_use = f->stream_n;
    int n_out = 0, step_use = 0;
    if (b->hidden && hp->dim > hp->n_vocab) return FERRY_ERR_UNSUPPORTED; /* the host buffer holds n_vocab per row */
    if (f->graphs && n <= GRAPH_MAX_TOKENS && all_want && !b->hidden && max_len <= (256 << (GRAPH_LENS - 1))) {
        cudaGraphExec_t g;
        RC(step_graph(f, m, kv, n, b->want_logits, max_len, &g));
        CK(cudaGraphLaunch(g, f->compute));
        n_out = n;
    } else {
        RC(enqueue_step(f, m, kv, n, b->want_logits, b->hidden, max_len, &n_out, &step_use));
    }
    CK(cudaStreamSynchronize(f->compute));
    if (n_out) memcpy(logits, f->h_logits, (size_t)n_out * (b->hidden ? dim : hp->n_vocab) * sizeof(float));

    /* Streaming figures of this step: every copy it used has completed. */
    const int S = f->map.n_streamed;
    for (int i = 0; i < step_use; i++) {
        float ms = 0;
        if (cudaEventElapsedTime(&ms, f->wait_t0[i], f->wait_t1[i]) == cudaSuccess) f->stats.stall_seconds += ms * 1e-3;
        int e = (int)((first_use + (uint64_t)i) % (uint64_t)(2 * S));
        if (cudaEventElapsedTime(&ms, f->copy_t0[e], f->copy_t1[e]) == cudaSuccess) f->stats.copy_seconds += ms * 1e-3;
    }
    cudaGetLastError();
    return FERRY_OK;
}
