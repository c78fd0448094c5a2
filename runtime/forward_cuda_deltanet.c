/* forward_cuda_deltanet — the gated DeltaNet layers of the CUDA backend (see forward_cuda_deltanet.h). */
#include "runtime/forward_cuda_deltanet.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/core/status.h"
#include "kernels/cuda/deltanet.h"
#include "kernels/cuda/matmul.h"
#include "kernels/cuda/ops.h"
#include "runtime/cuda_check.h"

#define RC(call)                                                                                             \
    do {                                                                                                     \
        int rc_ = (call);                                                                                    \
        if (rc_) return rc_;                                                                                 \
    } while (0)

#define DN_ALIGN 256
/* Steps of at most this many rows (decode batches, the ones graphs capture) run the rule token by token,
 * larger ones by chunks (FERRY_DN_RULE=token or chunk forces one). */
#define CUDA_DN_TOKEN_ROWS 16
static size_t align_up(size_t x)
{
    return (x + DN_ALIGN - 1) & ~(size_t)(DN_ALIGN - 1);
}

/* One recurrent layer's small tensors on the device. */
struct dn_layer {
    float *conv; /* (conv_dim, conv_kernel) */
    float *dt;   /* (n_v_heads) */
    float *A;    /* (n_v_heads) -exp(A_log) */
    float *norm; /* (head_v) */
};

struct cuda_deltanet {
    const struct model *m;
    int n_seqs, T;
    int n_rec;                      /* recurrent layers whose state is here (the device's) */
    int n_all;                      /* recurrent layers (seq_state's slot block holds them all) */
    int *slot;                      /* (n_layers) index among the device's recurrent layers, or -1 */
    int *all_index;                 /* (n_rec) each one's index among all the recurrent layers */
    int conv_dim, inner, width;     /* hp's */
    int nk, nv, hk, hv;             /* hp's */
    size_t conv_floats, rec_floats; /* per layer and slot (as seq_state) */
    float *state;                   /* (n_seqs, n_rec, conv_floats + rec_floats) device */
    struct dn_layer *layers;        /* (n_rec) */
    float *y;                       /* (T, conv_dim) device: the convolution's output, normed in place */
    int32_t *plan;                  /* (KERN_CUDA_DN_PLAN_WORDS(T)) device */
    int rule;                       /* FERRY_DN_RULE: 0 token by token, 1 by chunks, -1 by the step's rows */
    /* Qwen3-Next (hp.ssm_grouped): column-block tables (kern_cuda_copy_blocks) on the device, b|a's (2 nk
     * blocks) then q|k|v|z's (4 nk) for cuda_deltanet_unpack, then the grouped heads' repetition (2 nv + 1)
     * into y2 (T, y2_row), which the rule reads with one query and key head per value head. */
    int32_t *tables;
    float *y2;
    int y2_row;
};

/* The bytes of each region, in the order they are carved. */
struct dn_sizes {
    size_t state, layer, y, plan, tables, y2;
    int n_rec;
};

/* Blocks of the tables of a grouped model: b|a's, q|k|v|z's, the repetition's. */
static int n_table_blocks(const struct llm_hparams *hp)
{
    return hp->ssm_grouped ? 6 * hp->ssm_n_k_heads + 2 * hp->ssm_n_v_heads + 1 : 0;
}
static int y2_row_of(const struct llm_hparams *hp)
{
    return 2 * hp->ssm_n_v_heads * hp->ssm_head_k + hp->ssm_inner;
}

static int recurrent_layers(const struct llm_hparams *hp)
{
    int n = 0;
    for (int l = 0; l < hp->n_layers; l++) n += llm_layer_is_recurrent(hp, l);
    return n;
}

/* Layer l is recurrent and its state lives in host memory (host: NULL for none). */
static int on_host(const struct llm_hparams *hp, const uint8_t *host, int l)
{
    return host && llm_layer_is_recurrent(hp, l) && host[l];
}

static struct dn_sizes sizes_of(const struct llm_hparams *hp, int T, int n_seqs, const uint8_t *host)
{
    struct dn_sizes s = {.n_rec = recurrent_layers(hp)};
    if (s.n_rec == 0 || T < 1 || n_seqs < 1 || hp->ssm_conv_kernel < 1) return (struct dn_sizes){0};
    for (int l = 0; l < hp->n_layers; l++) s.n_rec -= on_host(hp, host, l);
    const size_t C = (size_t)llm_ssm_conv_dim(hp), nv = (size_t)hp->ssm_n_v_heads,
                 hv = (size_t)llm_ssm_head_v(hp), w = (size_t)hp->ssm_conv_kernel;
    const size_t per = (w - 1) * C + nv * (size_t)hp->ssm_head_k * hv;
    s.state = align_up((size_t)n_seqs * s.n_rec * per * sizeof(float));
    s.layer =
        align_up(C * w * sizeof(float)) + 2 * align_up(nv * sizeof(float)) + align_up(hv * sizeof(float));
    s.y = align_up((size_t)T * C * sizeof(float));
    s.plan = align_up(KERN_CUDA_DN_PLAN_WORDS(T) * sizeof(int32_t));
    if (hp->ssm_grouped) {
        s.tables = align_up((size_t)n_table_blocks(hp) * 3 * sizeof(int32_t));
        s.y2 = align_up((size_t)T * y2_row_of(hp) * sizeof(float));
    }
    return s;
}

/* Layer L's five matrices in CUDA_DN_* order. */
static void layer_mats(const struct model_layer *L, const struct wview *w[CUDA_DN_MATS])
{
    w[CUDA_DN_QKV] = &L->ssm_qkv, w[CUDA_DN_Z] = &L->ssm_z, w[CUDA_DN_B] = &L->ssm_beta;
    w[CUDA_DN_A] = &L->ssm_alpha, w[CUDA_DN_OUT] = &L->ssm_out;
}

static size_t mat_bytes(const struct wview *w)
{
    return dtype_row_size(w->type, w->cols) * (size_t)w->rows;
}

void cuda_deltanet_block_of(const struct model *m, int l, size_t at, struct cuda_dn_block *b)
{
    memset(b, 0, sizeof *b);
    if (l < 0 || l >= m->hp.n_layers || !llm_layer_is_recurrent(&m->hp, l)) return;
    const struct wview *w[CUDA_DN_MATS];
    layer_mats(&m->layers[l], w);
    size_t off = at, end = at;
    for (int k = CUDA_DN_QKV; k <= CUDA_DN_A; k++) { /* (an absent matrix: 0 bytes) */
        b->off[k] = off;
        end = off + (w[k]->data ? mat_bytes(w[k]) : 0);
        off = align_up(end);
    }
    b->in_off = at;
    b->in_bytes = end - at;
    b->out_off = b->off[CUDA_DN_OUT] = off;
    b->out_bytes = mat_bytes(w[CUDA_DN_OUT]);
    b->bytes = align_up(off + b->out_bytes) - at;
}

void cuda_deltanet_block_pack(const struct model *m, int l, const struct cuda_dn_block *b, void *block)
{
    if (!b->bytes) return;
    const struct wview *w[CUDA_DN_MATS];
    layer_mats(&m->layers[l], w);
    for (int k = 0; k < CUDA_DN_MATS; k++)
        if (w[k]->data) memcpy((char *)block + b->off[k], w[k]->data, mat_bytes(w[k]));
}

void cuda_deltanet_block_place(const struct model *m, int l, const struct cuda_dn_block *b, const void *in,
                               const void *out, struct layer_deltanet *dst)
{
    if (!b->bytes) return;
    const struct wview *w[CUDA_DN_MATS];
    layer_mats(&m->layers[l], w);
    struct wview *v[CUDA_DN_MATS] = {&dst->qkv, &dst->z, &dst->beta, &dst->alpha, &dst->out};
    for (int k = 0; k < CUDA_DN_MATS; k++) {
        const char *piece = k == CUDA_DN_OUT ? out : in;
        if (!piece) continue;
        *v[k] = *w[k];
        v[k]->data = w[k]->data ? piece + (b->off[k] - (k == CUDA_DN_OUT ? b->out_off : b->in_off)) : NULL;
    }
}

size_t cuda_deltanet_bytes(const struct model *m, int T, int n_seqs)
{
    return cuda_deltanet_bytes_host(m, T, n_seqs, NULL);
}

size_t cuda_deltanet_bytes_host(const struct model *m, int T, int n_seqs, const uint8_t *host)
{
    if (recurrent_layers(&m->hp) == 0) return 0;
    const struct dn_sizes s = sizes_of(&m->hp, T, n_seqs, host);
    return s.state + (size_t)s.n_rec * s.layer + s.y + s.plan + s.tables + s.y2;
}

size_t cuda_deltanet_scratch_bytes(const struct model *m, int T)
{
    if (recurrent_layers(&m->hp) == 0) return 0;
    const struct dn_sizes s = sizes_of(&m->hp, T, 1, NULL);
    return s.y + s.plan + s.tables + s.y2;
}

size_t cuda_deltanet_layer_bytes(const struct model *m, int n_seqs)
{
    const struct llm_hparams *hp = &m->hp;
    if (recurrent_layers(hp) == 0 || n_seqs < 1 || hp->ssm_conv_kernel < 1) return 0;
    const size_t C = (size_t)llm_ssm_conv_dim(hp), nv = (size_t)hp->ssm_n_v_heads,
                 hv = (size_t)llm_ssm_head_v(hp), w = (size_t)hp->ssm_conv_kernel;
    const size_t per = (w - 1) * C + nv * (size_t)hp->ssm_head_k * hv;
    return (size_t)n_seqs * per * sizeof(float) + align_up(C * w * sizeof(float)) +
           2 * align_up(nv * sizeof(float)) + align_up(hv * sizeof(float));
}

/* cuda_deltanet_check, the matrices only with mats (init needs the shape and the small tensors). */
static int check_model(const struct model *m, int mats, char err[256])
{
    const struct llm_hparams *hp = &m->hp;
    if (recurrent_layers(hp) == 0) return FERRY_OK;
    if (hp->ssm_n_k_heads < 1 || hp->ssm_n_v_heads < 1 || hp->ssm_head_k < 1 || hp->ssm_inner < 1 ||
        hp->ssm_n_v_heads % hp->ssm_n_k_heads != 0 || hp->ssm_inner % hp->ssm_n_v_heads != 0 ||
        hp->ssm_conv_kernel < 1) {
        snprintf(err, 256, "linear attention: bad shape (%d key heads, %d value heads, head_k %d, inner %d)",
                 hp->ssm_n_k_heads, hp->ssm_n_v_heads, hp->ssm_head_k, hp->ssm_inner);
        return FERRY_ERR_INVALID;
    }
    if (hp->ssm_head_k > KERN_CUDA_DN_MAX_HEAD_K || hp->ssm_conv_kernel > KERN_CUDA_DN_MAX_WIDTH) {
        snprintf(err, 256,
                 "linear attention: head_k %d or convolution width %d above the CUDA kernels' %d and %d (use "
                 "--backend cpu)",
                 hp->ssm_head_k, hp->ssm_conv_kernel, KERN_CUDA_DN_MAX_HEAD_K, KERN_CUDA_DN_MAX_WIDTH);
        return FERRY_ERR_UNSUPPORTED;
    }
    for (int l = 0; l < hp->n_layers; l++) {
        const struct model_layer *L = &m->layers[l];
        if (llm_layer_is_recurrent(hp, l) && (!L->ssm_conv || !L->ssm_dt || !L->ssm_a || !L->ssm_norm)) {
            snprintf(err, 256, "layer %d: linear attention without its conv, dt, a or norm tensor", l);
            return FERRY_ERR_INVALID;
        }
        if (!mats || !llm_layer_is_recurrent(hp, l)) continue;
        static const char *const names[CUDA_DN_MATS] = {"q|k|v", "z", "beta", "alpha", "out"};
        /* Qwen3-Next's packed forms (grouped models only): q|k|v|z in the q|k|v matrix without a z, b|a in
         * the beta matrix without an alpha. */
        const int qkvz = hp->ssm_grouped && !L->ssm_z.data, ba = hp->ssm_grouped && !L->ssm_alpha.data;
        const int64_t rows[CUDA_DN_MATS] = {llm_ssm_conv_dim(hp) + (qkvz ? hp->ssm_inner : 0), hp->ssm_inner,
                                            (ba ? 2 : 1) * (int64_t)hp->ssm_n_v_heads, hp->ssm_n_v_heads,
                                            hp->dim};
        const int64_t cols[CUDA_DN_MATS] = {hp->dim, hp->dim, hp->dim, hp->dim, hp->ssm_inner};
        const struct wview *w[CUDA_DN_MATS];
        layer_mats(L, w);
        for (int i = 0; i < CUDA_DN_MATS; i++) {
            if ((i == CUDA_DN_Z && qkvz) || (i == CUDA_DN_A && ba)) continue;
            if (!w[i]->data || w[i]->rows != rows[i] || w[i]->cols != cols[i]) {
                snprintf(err, 256,
                         "layer %d: the linear attention's %s matrix is missing or not (%lld, %lld)", l,
                         names[i], (long long)rows[i], (long long)cols[i]);
                return FERRY_ERR_INVALID;
            }
            if (!kern_cuda_matmul_supports(w[i]->type)) {
                snprintf(err, 256,
                         "layer %d: the linear attention's %s matrix is %s, a type the CUDA backend cannot "
                         "read (use --backend cpu)",
                         l, names[i], dtype_name(w[i]->type));
                return FERRY_ERR_UNSUPPORTED;
            }
        }
    }
    return FERRY_OK;
}

int cuda_deltanet_check(const struct model *m, char err[256])
{
    return check_model(m, 1, err);
}

/* The grouped model's tables (see struct cuda_deltanet), dn_in's columns as forward_cuda.c lays them out:
 * q|k|v (conv_dim), z (inner), b, a (n_v_heads each); the packed products in the same columns. */
static int upload_tables(struct cuda_deltanet *dn)
{
    const int nk = dn->nk, nv = dn->nv, hk = dn->hk, hv = dn->hv, per = nv / nk, C = dn->conv_dim,
              I = dn->inner;
    const int n = 6 * nk + 2 * nv + 1;
    int32_t *t = malloc((size_t)n * 3 * sizeof *t), *e = t;
    if (!t) return FERRY_ERR_NOMEM;
#define BLOCK(dst, src, w) (e[0] = (dst), e[1] = (src), e[2] = (w), e += 3)
    for (int h = 0; h < nk; h++) { /* b|a: per key head its value heads' b, then their a */
        BLOCK(C + I + h * per, C + I + h * 2 * per, per);
        BLOCK(C + I + nv + h * per, C + I + h * 2 * per + per, per);
    }
    const int pk = 2 * hk + 2 * per * hv; /* q|k|v|z: per key head its q, k, its value heads' v, then z */
    for (int h = 0; h < nk; h++) {
        BLOCK(h * hk, h * pk, hk);
        BLOCK(nk * hk + h * hk, h * pk + hk, hk);
        BLOCK(2 * nk * hk + h * per * hv, h * pk + 2 * hk, per * hv);
        BLOCK(C + h * per * hv, h * pk + 2 * hk + per * hv, per * hv);
    }
    for (int j = 0; j < nv; j++) { /* value head j reads query and key head j / per */
        BLOCK(j * hk, (j / per) * hk, hk);
        BLOCK(nv * hk + j * hk, nk * hk + (j / per) * hk, hk);
    }
    BLOCK(2 * nv * hk, 2 * nk * hk, nv * hv);
#undef BLOCK
    const cudaError_t ce = cudaMemcpy(dn->tables, t, (size_t)n * 3 * sizeof *t, cudaMemcpyHostToDevice);
    free(t);
    return ce == cudaSuccess ? FERRY_OK : FERRY_ERR_CUDA;
}

int cuda_deltanet_unpack(struct cuda_deltanet *dn, float *in, int ld, const float *packed, int qkvz, int ba,
                         int n, cudaStream_t cs)
{
    if (!dn || !in || !packed || n < 0 || n > dn->T || ld < dn->conv_dim + dn->inner + 2 * dn->nv ||
        (!dn->tables && (qkvz || ba)))
        return FERRY_ERR_INVALID;
    const int32_t *t = dn->tables + (ba ? 0 : 3 * 2 * dn->nk);
    const int blocks = (ba ? 2 * dn->nk : 0) + (qkvz ? 4 * dn->nk : 0);
    return kern_cuda_copy_blocks(in, ld, packed, ld, n, t, blocks, cs);
}

int cuda_deltanet_init(struct cuda_deltanet **out, const struct model *m, int T, int n_seqs, void *mem,
                       char err[256])
{
    return cuda_deltanet_init_host(out, m, T, n_seqs, NULL, mem, err);
}

int cuda_deltanet_init_host(struct cuda_deltanet **out, const struct model *m, int T, int n_seqs,
                            const uint8_t *host, void *mem, char err[256])
{
    *out = NULL;
    err[0] = '\0';
    const struct llm_hparams *hp = &m->hp;
    if (recurrent_layers(hp) == 0) return FERRY_OK;
    if (T < 1 || n_seqs < 1 || !mem || ((uintptr_t)mem % DN_ALIGN) != 0) {
        snprintf(err, 256, "linear attention: bad arguments (T %d, %d slots, memory %p)", T, n_seqs, mem);
        return FERRY_ERR_INVALID;
    }
    RC(check_model(m, 0, err));
    struct cuda_deltanet *dn = calloc(1, sizeof *dn);
    if (!dn) return FERRY_ERR_NOMEM;
    const struct dn_sizes s = sizes_of(hp, T, n_seqs, host);
    *dn = (struct cuda_deltanet){.m = m,
                                 .n_seqs = n_seqs,
                                 .T = T,
                                 .n_rec = s.n_rec,
                                 .n_all = recurrent_layers(hp),
                                 .conv_dim = llm_ssm_conv_dim(hp),
                                 .inner = hp->ssm_inner,
                                 .width = hp->ssm_conv_kernel,
                                 .nk = hp->ssm_n_k_heads,
                                 .nv = hp->ssm_n_v_heads,
                                 .hk = hp->ssm_head_k,
                                 .hv = llm_ssm_head_v(hp)};
    const char *rule = getenv("FERRY_DN_RULE");
    dn->rule = rule && !strcmp(rule, "token") ? 0 : rule && !strcmp(rule, "chunk") ? 1 : -1;
    dn->conv_floats = (size_t)(dn->width - 1) * dn->conv_dim;
    dn->rec_floats = (size_t)dn->nv * dn->hk * dn->hv;
    dn->slot = malloc((size_t)hp->n_layers * sizeof *dn->slot);
    dn->layers = calloc((size_t)s.n_rec + 1, sizeof *dn->layers);
    dn->all_index = calloc((size_t)s.n_rec + 1, sizeof *dn->all_index);
    if (!dn->slot || !dn->layers || !dn->all_index) {
        cuda_deltanet_free(dn);
        return FERRY_ERR_NOMEM;
    }
    char *p = mem;
    dn->state = (float *)p;
    p += s.state;
    const size_t C = (size_t)dn->conv_dim, w = (size_t)dn->width, nv = (size_t)dn->nv, hv = (size_t)dn->hv;
    int rc = FERRY_OK;
    for (int l = 0, i = 0, j = 0; l < hp->n_layers; l++) {
        dn->slot[l] = -1;
        if (!llm_layer_is_recurrent(hp, l)) continue;
        if (on_host(hp, host, l)) { /* (its state and small tensors are the host's) */
            j++;
            continue;
        }
        const struct model_layer *L = &m->layers[l];
        struct dn_layer *d = &dn->layers[i];
        dn->all_index[i] = j++;
        dn->slot[l] = i++;
        d->conv = (float *)p;
        d->dt = (float *)(p + align_up(C * w * sizeof(float)));
        d->A = (float *)((char *)d->dt + align_up(nv * sizeof(float)));
        d->norm = (float *)((char *)d->A + align_up(nv * sizeof(float)));
        p += s.layer;
        if (!rc && (cudaMemcpy(d->conv, L->ssm_conv, C * w * sizeof(float), cudaMemcpyHostToDevice) ||
                    cudaMemcpy(d->dt, L->ssm_dt, nv * sizeof(float), cudaMemcpyHostToDevice) ||
                    cudaMemcpy(d->A, L->ssm_a, nv * sizeof(float), cudaMemcpyHostToDevice) ||
                    cudaMemcpy(d->norm, L->ssm_norm, hv * sizeof(float), cudaMemcpyHostToDevice))) {
            snprintf(err, 256, "layer %d: upload of the linear attention's tensors failed", l);
            rc = FERRY_ERR_CUDA;
        }
    }
    dn->y = (float *)p;
    p += s.y;
    dn->plan = (int32_t *)p;
    p += s.plan;
    if (hp->ssm_grouped) {
        dn->tables = (int32_t *)p;
        dn->y2 = (float *)(p + s.tables);
        dn->y2_row = y2_row_of(hp);
        if (!rc && (rc = upload_tables(dn)))
            snprintf(err, 256, "linear attention: the upload of the head tables failed");
    }
    if (!rc && s.state && cudaMemset(dn->state, 0, s.state) != cudaSuccess) {
        snprintf(err, 256, "linear attention: zeroing the state failed");
        rc = FERRY_ERR_CUDA;
    }
    if (rc) {
        cuda_deltanet_free(dn);
        return rc;
    }
    *out = dn;
    return FERRY_OK;
}

void cuda_deltanet_free(struct cuda_deltanet *dn)
{
    if (!dn) return;
    free(dn->slot);
    free(dn->layers);
    free(dn->all_index);
    free(dn);
}

size_t cuda_deltanet_slot_bytes(const struct cuda_deltanet *dn)
{
    return dn ? (size_t)dn->n_all * (dn->conv_floats + dn->rec_floats) * sizeof(float) : 0;
}

static float *slot_state(const struct cuda_deltanet *dn, int seq)
{
    return dn->state + (size_t)seq * dn->n_rec * (dn->conv_floats + dn->rec_floats);
}

/* Bytes of one slot's state on the device (its recurrent layers only). */
static size_t device_slot_bytes(const struct cuda_deltanet *dn)
{
    return (size_t)dn->n_rec * (dn->conv_floats + dn->rec_floats) * sizeof(float);
}

/* Slot seq's device state to the host's slot block (down) or from it: one copy when every recurrent layer's
 * state is here, else one per device layer into its place in the block (the host's layers left as they
 * are). */
static int slot_copy(const struct cuda_deltanet *dn, int seq, float *host, int down, cudaStream_t cs)
{
    if (!dn || !host || seq < 0 || seq >= dn->n_seqs) return FERRY_ERR_INVALID;
    const size_t per = dn->conv_floats + dn->rec_floats;
    float *dev = slot_state(dn, seq);
    if (dn->n_rec == dn->n_all) {
        CK(cudaMemcpyAsync(down ? host : dev, down ? dev : host, device_slot_bytes(dn),
                           down ? cudaMemcpyDeviceToHost : cudaMemcpyHostToDevice, cs));
        return FERRY_OK;
    }
    for (int i = 0; i < dn->n_rec; i++) {
        float *d = dev + (size_t)i * per, *h = host + (size_t)dn->all_index[i] * per;
        CK(cudaMemcpyAsync(down ? h : d, down ? d : h, per * sizeof(float),
                           down ? cudaMemcpyDeviceToHost : cudaMemcpyHostToDevice, cs));
    }
    return FERRY_OK;
}

int cuda_deltanet_reset(struct cuda_deltanet *dn, int seq, cudaStream_t cs)
{
    if (!dn || seq < 0 || seq >= dn->n_seqs) return FERRY_ERR_INVALID;
    if (dn->n_rec) CK(cudaMemsetAsync(slot_state(dn, seq), 0, device_slot_bytes(dn), cs));
    return FERRY_OK;
}

int cuda_deltanet_download(const struct cuda_deltanet *dn, int seq, float *host, cudaStream_t cs)
{
    return slot_copy(dn, seq, host, 1, cs);
}

int cuda_deltanet_upload(struct cuda_deltanet *dn, int seq, const float *host, cudaStream_t cs)
{
    return slot_copy(dn, seq, (float *)host, 0, cs); /* (only read: the upload's source) */
}

int cuda_deltanet_run(struct cuda_deltanet *dn, int l, float *out, const struct cuda_deltanet_in *in, int n,
                      const int32_t *d_seq, const int32_t *d_pos, const int32_t *h_seq, cudaStream_t cs)
{
    if (!dn || !out || !in || !in->qkv || !in->z || !in->b || !in->a || !d_seq || !d_pos || n < 0 ||
        n > dn->T || l < 0 || l >= dn->m->hp.n_layers || dn->slot[l] < 0)
        return FERRY_ERR_INVALID;
    if (n == 0) return FERRY_OK;
    for (int i = 0; h_seq && i < n; i++)
        if (h_seq[i] < 0 || h_seq[i] >= dn->n_seqs) return FERRY_ERR_INVALID;
    const struct dn_layer *L = &dn->layers[dn->slot[l]];
    float *base = dn->state + (size_t)dn->slot[l] * (dn->conv_floats + dn->rec_floats);
    const struct kern_cuda_dn_state st = {.conv = base,
                                          .rec = base + dn->conv_floats,
                                          .stride = (size_t)dn->n_rec * (dn->conv_floats + dn->rec_floats),
                                          .n_slots = dn->n_seqs};
    RC(kern_cuda_dn_plan(dn->plan, d_seq, d_pos, n, dn->n_seqs, cs));
    RC(kern_cuda_dn_conv(dn->y, in->qkv, in->ld_qkv, n, dn->conv_dim, L->conv, dn->width, &st, d_seq,
                         dn->plan, cs));
    /* transformers' Qwen3.5: q and k L2-normed with eps 1e-6, q then scaled by 1/sqrt(head_k). */
    RC(kern_cuda_dn_qk_l2norm(dn->y, dn->conv_dim, n, dn->nk, dn->hk, 1e-6f, 1.0f / sqrtf((float)dn->hk),
                              cs));
    const float *x = dn->y;
    int nk = dn->nk, ldx = dn->conv_dim;
    if (dn->y2 && dn->nv != dn->nk) { /* grouped heads: each value head's own copy of its query and key */
        RC(kern_cuda_copy_blocks(dn->y2, dn->y2_row, dn->y, dn->conv_dim, n, dn->tables + 3 * 6 * dn->nk,
                                 2 * dn->nv + 1, cs));
        x = dn->y2, nk = dn->nv, ldx = dn->y2_row;
    }
    const struct kern_cuda_dn_rule r = {.n_k_heads = nk,
                                        .n_v_heads = dn->nv,
                                        .head_k = dn->hk,
                                        .head_v = dn->hv,
                                        .x = x,
                                        .braw = in->b,
                                        .araw = in->a,
                                        .A = L->A,
                                        .dt = L->dt,
                                        .ldx = ldx,
                                        .ldb = in->ld_b,
                                        .lda = in->ld_a,
                                        .ldo = dn->inner,
                                        .o = out,
                                        .chunked = dn->rule >= 0 ? dn->rule : n > CUDA_DN_TOKEN_ROWS};
    RC(kern_cuda_dn_rule(&r, n, &st, d_seq, dn->plan, cs));
    return kern_cuda_dn_gated_norm(out, out, in->z, in->ld_z, L->norm, n, dn->nv, dn->hv, dn->m->hp.norm_eps,
                                   cs);
}
