/* layer — weight views and packed blocks of a layer, and its family's program (see layer.h). */
#include "runtime/layer.h"

#include <string.h>

#include "kernels/core/fp16.h"
#include "kernels/core/status.h"
#include "quant/dequant.h"
#include "weights/arch/arch.h"

#define LAYER_ALIGN 256
static size_t align_up(size_t x)
{
    return (x + LAYER_ALIGN - 1) & ~(size_t)(LAYER_ALIGN - 1);
}

const struct layer_program *layer_program_of(const struct llm_hparams *hp)
{
    const struct arch_family *f = arch_of(hp);
    return f ? f->program : NULL;
}

int layer_program_has(const struct layer_program *p, enum layer_op_kind kind)
{
    for (int i = 0; p && i < p->n_ops; i++)
        if (p->ops[i].kind == kind) return 1;
    return 0;
}

const struct layer_program *layer_program_of_layer(const struct llm_hparams *hp, int l)
{
    const struct arch_family *f = arch_of(hp);
    if (!f) return NULL;
    return f->program_recurrent && llm_layer_is_recurrent(hp, l) ? f->program_recurrent : f->program;
}

/* The norm vectors of a layer and their lengths (0: absent). */
static void layer_norms(const struct model_layer *L, const struct llm_hparams *hp,
                        const float *v[LAYER_N_NORMS], int len[LAYER_N_NORMS])
{
    v[LAYER_ATTN_NORM] = L->attn_norm, len[LAYER_ATTN_NORM] = hp->dim;
    v[LAYER_FFN_NORM] = L->ffn_norm, len[LAYER_FFN_NORM] = hp->dim;
    v[LAYER_Q_NORM] = L->q_norm, len[LAYER_Q_NORM] = L->q_norm ? hp->head_dim : 0;
    v[LAYER_K_NORM] = L->k_norm, len[LAYER_K_NORM] = L->k_norm ? hp->head_dim : 0;
    v[LAYER_POST_ATTN_NORM] = L->post_attn_norm, len[LAYER_POST_ATTN_NORM] = L->post_attn_norm ? hp->dim : 0;
    v[LAYER_POST_FFN_NORM] = L->post_ffn_norm, len[LAYER_POST_FFN_NORM] = L->post_ffn_norm ? hp->dim : 0;
    v[LAYER_ATTN_SINKS] = L->attn_sinks, len[LAYER_ATTN_SINKS] = L->attn_sinks ? hp->n_heads : 0;
    v[LAYER_OUT_SCALE] = L->out_scale, len[LAYER_OUT_SCALE] = L->out_scale ? 1 : 0;
}

/* The parts of group i in row order, with their biases; returns their count. */
static int group_parts(const struct model_layer *L, int i, const struct wview *parts[LAYER_MAX_PARTS],
                       const float *bias[LAYER_MAX_PARTS])
{
    bias[0] = bias[1] = bias[2] = NULL;
    switch (i) {
    case LAYER_QKV:
        parts[0] = &L->wq, parts[1] = &L->wk, parts[2] = &L->wv;
        bias[0] = L->bq, bias[1] = L->bk, bias[2] = L->bv;
        return 3;
    case LAYER_O:
        parts[0] = &L->wo;
        bias[0] = L->bo;
        return 1;
    case LAYER_GU:
        parts[0] = &L->w_gate, parts[1] = &L->w_up;
        return 2;
    default:
        parts[0] = &L->w_down;
        return 1;
    }
}

void layer_weights_of_model(struct layer_weights *w, const struct model_layer *L)
{
    memset(w, 0, sizeof *w);
    for (int i = 0; i < LAYER_N_MATS; i++) {
        const struct wview *parts[LAYER_MAX_PARTS];
        const float *bias[LAYER_MAX_PARTS];
        struct layer_group *g = &w->mat[i];
        const int n_parts = group_parts(L, i, parts, bias);
        g->uniform = 1;
        g->cols = parts[0]->cols;
        for (int j = 0; j < n_parts; j++) {
            if (j > 0 && !parts[j]->data) continue; /* absent: a KV-sharing layer's keys and values */
            g->part[g->n_parts++] = (struct layer_part){.data = parts[j]->data,
                                                        .type = parts[j]->type,
                                                        .row0 = g->rows,
                                                        .rows = parts[j]->rows,
                                                        .bias = bias[j]};
            g->uniform &= parts[j]->type == parts[0]->type;
            g->rows += parts[j]->rows;
        }
    }
    w->norm[LAYER_ATTN_NORM] = L->attn_norm;
    w->norm[LAYER_FFN_NORM] = L->ffn_norm;
    w->norm[LAYER_Q_NORM] = L->q_norm;
    w->norm[LAYER_K_NORM] = L->k_norm;
    w->norm[LAYER_POST_ATTN_NORM] = L->post_attn_norm;
    w->norm[LAYER_POST_FFN_NORM] = L->post_ffn_norm;
    w->norm[LAYER_ATTN_SINKS] = L->attn_sinks;
    w->dn = (struct layer_deltanet){.qkv = L->ssm_qkv,
                                    .z = L->ssm_z,
                                    .beta = L->ssm_beta,
                                    .alpha = L->ssm_alpha,
                                    .out = L->ssm_out,
                                    .conv = L->ssm_conv,
                                    .dt = L->ssm_dt,
                                    .a = L->ssm_a,
                                    .norm = L->ssm_norm};
    w->norm[LAYER_OUT_SCALE] = L->out_scale;
}

void layer_weights_of_model_moe(struct layer_weights *w, const struct model_layer *L,
                                const struct llm_hparams *hp)
{
    layer_weights_of_model(w, L);
    if (hp->n_expert <= 0) return;
    w->moe = (struct layer_moe){.router = L->router,
                                .gate = L->exp_gate,
                                .up = L->exp_up,
                                .down = L->exp_down,
                                .n_expert = hp->n_expert,
                                .n_used = hp->n_expert_used,
                                .ffn = hp->expert_ffn_dim,
                                .norm_topk = hp->expert_norm_topk,
                                .router_b = L->router_b,
                                .gate_b = L->exp_gate_b,
                                .up_b = L->exp_up_b,
                                .down_b = L->exp_down_b,
                                .alpha = hp->swiglu_alpha,
                                .limit = hp->swiglu_limit,
                                .shexp_gate = L->shexp_gate};
}

void layer_layout_of(const struct model_layer *L, const struct llm_hparams *hp,
                     enum dtype (*packed_type)(enum dtype), struct layer_layout *lay)
{
    memset(lay, 0, sizeof *lay);
    size_t off = 0;
    for (int i = 0; i < LAYER_N_MATS; i++) {
        const struct wview *parts[LAYER_MAX_PARTS];
        const float *bias[LAYER_MAX_PARTS];
        const int n = group_parts(L, i, parts, bias);
        lay->n_parts[i] = n;
        lay->uniform[i] = 1;
        lay->cols[i] = parts[0]->cols;
        for (int j = 0; j < n; j++) {
            lay->part[i][j].type = packed_type(parts[j]->type);
            lay->uniform[i] &= lay->part[i][j].type == lay->part[i][0].type;
        }
        /* A uniform group is one matrix (its parts back to back); parts of different types are separate
         * products, each starting aligned (the block types' kernels need up to 16-byte aligned rows). */
        for (int j = 0; j < n; j++) {
            if (!lay->uniform[i]) off = align_up(off);
            lay->part[i][j].row0 = lay->rows[i];
            lay->part[i][j].rows = parts[j]->rows;
            lay->part[i][j].off = off;
            lay->rows[i] += parts[j]->rows;
            off += dtype_row_size(lay->part[i][j].type, parts[j]->cols) * (size_t)parts[j]->rows;
        }
        off = align_up(off);
    }
    const float *nv[LAYER_N_NORMS];
    layer_norms(L, hp, nv, lay->norm_len);
    for (int i = 0; i < LAYER_N_NORMS; i++) {
        lay->norm_off[i] = off;
        if (lay->norm_len[i]) off = align_up(off + (size_t)lay->norm_len[i] * sizeof(float));
    }
    lay->bias_off = SIZE_MAX;
    if (L->bq || L->bk || L->bv) {
        lay->bias_off = off;
        off = align_up(off + (size_t)lay->rows[LAYER_QKV] * sizeof(float));
    }
    lay->bias_o_off = SIZE_MAX;
    if (L->bo) {
        lay->bias_o_off = off;
        off = align_up(off + (size_t)lay->rows[LAYER_O] * sizeof(float));
    }
    lay->bytes = off;
}

int layer_pack_matrix(const struct wview *w, enum dtype to, void *dst, float *row_tmp)
{
    const size_t row_bytes = dtype_row_size(w->type, w->cols);
    if (w->rows == 0) return FERRY_OK; /* an expert layer's empty dense FFN */
    if (to == w->type) {
        memcpy(dst, w->data, row_bytes * (size_t)w->rows);
        return FERRY_OK;
    }
    if (to != DTYPE_F16) return FERRY_ERR_UNSUPPORTED;
    uint16_t *out = dst;
    for (int64_t r = 0; r < w->rows; r++) {
        int rc = dequant_row(w->type, (const char *)w->data + row_bytes * r, row_tmp, w->cols);
        if (rc) return rc;
        for (int64_t c = 0; c < w->cols; c++) out[r * w->cols + c] = f32_to_f16(row_tmp[c]);
    }
    return FERRY_OK;
}

int layer_pack(const struct model_layer *L, const struct llm_hparams *hp, const struct layer_layout *lay,
               void *dst, float *row_tmp)
{
    char *base = dst;
    for (int i = 0; i < LAYER_N_MATS; i++) {
        const struct wview *parts[LAYER_MAX_PARTS];
        const float *bias[LAYER_MAX_PARTS];
        const int n = group_parts(L, i, parts, bias);
        for (int j = 0; j < n; j++) {
            int rc = layer_pack_matrix(parts[j], lay->part[i][j].type, base + lay->part[i][j].off, row_tmp);
            if (rc) return rc;
        }
    }
    const float *nv[LAYER_N_NORMS];
    int nl[LAYER_N_NORMS];
    layer_norms(L, hp, nv, nl);
    for (int i = 0; i < LAYER_N_NORMS; i++)
        if (lay->norm_len[i])
            memcpy(base + lay->norm_off[i], nv[i], (size_t)lay->norm_len[i] * sizeof(float));
    if (lay->bias_off != SIZE_MAX) {
        const struct wview *parts[LAYER_MAX_PARTS];
        const float *bias[LAYER_MAX_PARTS];
        const int n = group_parts(L, LAYER_QKV, parts, bias);
        float *v = (float *)(base + lay->bias_off);
        for (int j = 0; j < n; j++) {
            if (bias[j])
                memcpy(v, bias[j], (size_t)parts[j]->rows * sizeof(float));
            else
                memset(v, 0, (size_t)parts[j]->rows * sizeof(float));
            v += parts[j]->rows;
        }
    }
    if (lay->bias_o_off != SIZE_MAX)
        memcpy(base + lay->bias_o_off, L->bo, (size_t)lay->rows[LAYER_O] * sizeof(float));
    return FERRY_OK;
}

void layer_piece(const struct layer_layout *lay, int i, size_t *off, size_t *bytes)
{
    const int last = lay->n_parts[i] - 1;
    *off = lay->part[i][0].off;
    *bytes = lay->part[i][last].off +
             dtype_row_size(lay->part[i][last].type, lay->cols[i]) * (size_t)lay->part[i][last].rows - *off;
}

void layer_weights_tail(struct layer_weights *w, const struct layer_layout *lay, const void *tail)
{
    const char *t = tail;
    const size_t t0 = lay->norm_off[0]; /* the tail's offset in the block */
    memset(w, 0, sizeof *w);
    for (int i = 0; i < LAYER_N_MATS; i++) {
        struct layer_group *g = &w->mat[i];
        g->n_parts = lay->n_parts[i];
        g->uniform = lay->uniform[i];
        g->rows = lay->rows[i];
        g->cols = lay->cols[i];
        for (int j = 0; j < g->n_parts; j++) {
            g->part[j].type = lay->part[i][j].type;
            g->part[j].row0 = lay->part[i][j].row0;
            g->part[j].rows = lay->part[i][j].rows;
            g->part[j].bias = i == LAYER_QKV && lay->bias_off != SIZE_MAX
                                  ? (const float *)(t + (lay->bias_off - t0)) + lay->part[i][j].row0
                              : i == LAYER_O && lay->bias_o_off != SIZE_MAX
                                  ? (const float *)(t + (lay->bias_o_off - t0))
                                  : NULL;
        }
    }
    for (int i = 0; i < LAYER_N_NORMS; i++)
        w->norm[i] = lay->norm_len[i] ? (const float *)(t + (lay->norm_off[i] - t0)) : NULL;
}

void layer_group_at(struct layer_weights *w, const struct layer_layout *lay, int i, const void *piece)
{
    const size_t first = lay->part[i][0].off;
    for (int j = 0; j < lay->n_parts[i]; j++)
        w->mat[i].part[j].data = (const char *)piece + (lay->part[i][j].off - first);
}

void layer_weights_at(struct layer_weights *w, const struct layer_layout *lay, const void *base)
{
    const char *b = base;
    layer_weights_tail(w, lay, b + lay->norm_off[0]);
    for (int i = 0; i < LAYER_N_MATS; i++) layer_group_at(w, lay, i, b + lay->part[i][0].off);
}

void layer_model_views(const struct model_layer *L, const struct wview *v[LAYER_N_VIEWS])
{
    const struct wview *all[LAYER_N_VIEWS] = {
        &L->wq,     &L->wk,       &L->wv,        &L->wo,      &L->w_gate,   &L->w_up,
        &L->w_down, &L->router,   &L->exp_gate,  &L->exp_up,  &L->exp_down, &L->ssm_qkv,
        &L->ssm_z,  &L->ssm_beta, &L->ssm_alpha, &L->ssm_out, &L->ple_gate, &L->ple_proj};
    memcpy(v, all, sizeof all);
}

uint64_t layer_model_bytes(const struct model_layer *L)
{
    const struct wview *v[LAYER_N_VIEWS];
    layer_model_views(L, v);
    uint64_t n = 0;
    for (int i = 0; i < LAYER_N_VIEWS; i++) n += wview_bytes(v[i]);
    return n;
}

uint64_t layer_params(const struct model_layer *L)
{
    const struct wview *w[7] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->w_gate, &L->w_up, &L->w_down};
    uint64_t n = 0;
    for (int i = 0; i < 7; i++) n += (uint64_t)w[i]->rows * (uint64_t)w[i]->cols;
    return n;
}
