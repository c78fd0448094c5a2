/* forward_cpu — the CPU backend: the layer program of runtime/layer.h on the host (see forward_cpu.h).
 *
 * Buffers: a group's product is written part after part, each part as its own (m, rows_j) row-major matrix
 * (q|k|v: all queries, then all keys, then all values), because the matmul writes whole rows. At m = 1 that
 * is also the stacked row (q | k | v) the KV owner's `attend` reads; larger batches are re-stacked row by row
 * into qkv_rows first. Queries are rotated in place, silu(gate)·up is written over the gate part.
 */
#include "runtime/forward_cpu.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernels/core/status.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/deltanet.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/moe.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/threadpool.h"
#include "runtime/seq_state.h"

/* Op kinds of the profile: the products by group (LAYER_N_MATS of them), then the rest. */
enum { PROF_NORM = LAYER_N_MATS, PROF_SILU, PROF_KV, PROF_EMBED, PROF_HEAD, PROF_N };

struct forward_cpu {
    struct backend be;
    const struct model *m;
    const struct layer_program *prog;
    struct layer_weights *w;  /* (n_layers) */
    struct kv_cache *kv;      /* host KV, or NULL */
    struct kv_cache *kv_swa;  /* the sliding-window layers' pool, or NULL: they are in kv */
    struct backend *kv_owner; /* or NULL */
    struct tpool *tp;
    int max_tokens;
    void *(*host_alloc)(void *ctx, size_t bytes);
    void (*host_free)(void *ctx, void *p);
    void *alloc_ctx;
    int act, plain;  /* the products' arithmetic (forward_cpu_params), -1: the thread's */
    int invariant;   /* the products' batch invariance (forward_cpu_params) */
    float *x;        /* (max_tokens, dim) residual stream */
    float *xn;       /* (max_tokens, dim) normed input of a block */
    float *d;        /* (max_tokens, dim) the last block's output, pending when `pending` */
    float *qkv;      /* (max_tokens * (q_dim + 2 kv_dim)) parts one after the other */
    float *att;      /* (max_tokens, q_dim) */
    float *gu;       /* (max_tokens * 2 ffn) gate part, then up part */
    float *qkv_rows; /* (max_tokens, q_dim + 2 kv_dim) stacked rows for kv_owner, or NULL */
    int32_t *win_lo; /* (max_tokens) first position a local layer's row attends to; NULL without windows */
    float *win_lse;  /* (max_tokens, n_heads) the ranged attention's log-sum-exps (read for sinks), or NULL */
    /* Expert layers only (NULL otherwise): router logits (max_tokens, n_expert), each token's chosen experts
     * and weights (max_tokens, n_expert_used), the experts' workspace (kern_cpu_moe_ws_floats). */
    float *moe_logits, *moe_wts, *moe_ws;
    int32_t *moe_ids;
    float *gate; /* (max_tokens, q_dim) the attention's output gates (LOP_Q_GATE), or NULL */
    /* Recurrent layers only (NULL otherwise): each slot's state; the in-products q|k|v, z, b, a as parts
     * (n, rows) one after the other; one sequence's rows gathered: conv rows (n, conv_dim), decays and
     * rates (n, n_v_heads) each, outputs (n, inner); every row's output (n, inner); the chunked rule's
     * workspace; row indices and marks. */
    struct seq_state *state;
    float *dn_proj, *dn_run, *dn_gb, *dn_orun, *dn_o;
    float *dn_pack; /* (n, conv_dim + inner + 2 n_v) packed products before dn_unpack, or NULL: none packed */
    int32_t *dn_rows;
    uint8_t *dn_done;
    float *ones; /* (head_dim) 1.0: the weight of LOP_V_NORM's weightless norm, or NULL */
    /* Per-layer inputs (hp.ple_dim > 0, else NULL): every layer's input per token (max_tokens, n_layers,
     * ple_dim), the input's projection to them (same shape), and two (max_tokens, ple_dim) work rows. */
    float *ple, *ple_p, *ple_t, *ple_u;
    int layer; /* the layer run_layer runs (the ops whose shapes differ by layer read it) */
    int pending;
    uint64_t layers_run;
    double layer_seconds;
    double kv_seconds; /* of layer_seconds, in the KV ops */
    /* FERRY_CPU_PROFILE=1: time and weight bytes per op kind, printed to stderr when the backend is freed. */
    int profile;
    double prof_s[PROF_N];
    double prof_bytes[PROF_N];
    uint64_t prof_calls[PROF_N];
};

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Activation buffers, sized for the largest step: touched now, so the process holds at start what its largest
 * step will use, rather than growing into it under load (a memory limit then fails at start, not hours in).
 */
static void *default_alloc(void *ctx, size_t bytes)
{
    (void)ctx;
    const size_t n = (bytes + 63) / 64 * 64;
    void *p = aligned_alloc(64, n);
    if (p) memset(p, 0, n);
    return p;
}

static void default_free(void *ctx, void *p)
{
    (void)ctx;
    free(p);
}

struct forward_cpu_params forward_cpu_default_params(void)
{
    return (struct forward_cpu_params){.max_tokens = 512, .act = -1, .plain = -1};
}

static void print_profile(const struct forward_cpu *f)
{
    static const char *other[] = {"norm+add", "silu*up", "kv+attention", "embed", "head"};
    double total = 0;
    for (int i = 0; i < PROF_N; i++) total += f->prof_s[i];
    if (total <= 0) return;
    fprintf(stderr, "cpu profile (%d threads, %llu layer runs): op, calls, ms, share, weight GB/s\n",
            tpool_size(f->tp), (unsigned long long)f->layers_run);
    for (int i = 0; i < PROF_N; i++) {
        if (!f->prof_calls[i]) continue;
        char name[32];
        if (i < LAYER_N_MATS)
            snprintf(name, sizeof name, "product %d", i);
        else
            snprintf(name, sizeof name, "%s", other[i - LAYER_N_MATS]);
        fprintf(stderr, "  %-14s %8llu %10.1f %6.1f%%", name, (unsigned long long)f->prof_calls[i],
                f->prof_s[i] * 1e3, 100 * f->prof_s[i] / total);
        if (f->prof_bytes[i] > 0) fprintf(stderr, " %8.1f", f->prof_bytes[i] / f->prof_s[i] / 1e9);
        fprintf(stderr, "\n");
    }
}

/* This backend's arithmetic on the calling thread, before it computes (kernels/cpu/matmul.h: per thread). */
static void arith_enter(const struct forward_cpu *f)
{
    if (f->act >= 0) kern_cpu_matmul_set_act((enum kern_cpu_act)f->act);
    if (f->plain >= 0) kern_cpu_matmul_set_plain((enum kern_cpu_plain)f->plain);
    kern_cpu_matmul_set_invariant(f->invariant);
}

static void cpu_free(struct backend *be)
{
    struct forward_cpu *f = (struct forward_cpu *)be;
    if (!f) return;
    if (f->profile) print_profile(f);
    tpool_free(f->tp);
    float *bufs[] = {f->x, f->xn, f->d, f->qkv, f->att, f->gu, f->qkv_rows};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        if (bufs[i]) f->host_free(f->alloc_ctx, bufs[i]);
    free(f->win_lo);
    free(f->win_lse);
    free(f->moe_logits);
    free(f->moe_wts);
    free(f->moe_ws);
    free(f->moe_ids);
    free(f->gate);
    float *dn[] = {f->dn_proj, f->dn_run, f->dn_gb, f->dn_orun, f->dn_o, f->dn_pack};
    for (size_t i = 0; i < sizeof dn / sizeof dn[0]; i++) free(dn[i]);
    free(f->dn_rows);
    free(f->dn_done);
    free(f->ones);
    free(f->ple);
    free(f->ple_p);
    free(f->ple_t);
    free(f->ple_u);
    free(f->w);
    free(f);
}

int forward_cpu_threads(const struct backend *be)
{
    return tpool_size(((const struct forward_cpu *)be)->tp);
}

/* ----------------------------------------------------------------------------------------------------------
 */
/* The program */

/* y = x · the group's parts (each part to y + m * row0, its own (m, rows) matrix), biases added. */
static int linear_group(struct forward_cpu *f, float *y, const float *x, const struct layer_group *g, int m)
{
    struct kern_cpu_mm jobs[LAYER_MAX_PARTS];
    for (int j = 0; j < g->n_parts; j++)
        jobs[j] = (struct kern_cpu_mm){.y = y + (size_t)m * g->part[j].row0,
                                       .w = g->part[j].data,
                                       .wt = g->part[j].type,
                                       .bias = g->part[j].bias,
                                       .n = (int)g->part[j].rows};
    return kern_cpu_matmul_multi(jobs, g->n_parts, x, m, (int)g->cols, f->tp);
}

static float *act(struct forward_cpu *f, enum layer_act a)
{
    switch (a) {
    case LACT_X:
        return f->x;
    case LACT_XN:
        return f->xn;
    case LACT_QKV:
    case LACT_Q:
        return f->qkv; /* queries are the first part, rotated in place */
    case LACT_ATT:
        return f->att;
    case LACT_D:
        return f->d;
    case LACT_GU:
    case LACT_H:
        return f->gu; /* silu(gate)·up overwrites the gate part */
    case LACT_GATE:
        return f->gate;
    }
    return NULL;
}

/* The attention sinks of layer l when its program attends with them (LOP_ATTENTION_SINKS), else NULL. */
static const float *layer_sinks(const struct forward_cpu *f, int l)
{
    const struct layer_program *p = f->prog;
    return p->ops[p->kv_last].kind == LOP_ATTENTION_SINKS ? f->w[l].norm[LAYER_ATTN_SINKS] : NULL;
}

/* The KV ops of layer l on the host's own cache. */
static int kv_ops_local(struct forward_cpu *f, int l, const struct step *st, int n)
{
    const struct llm_hparams *hp = &f->m->hp;
    int hd, n_kv, rd;
    llm_layer_shape(hp, l, &hd, &n_kv, &rd);
    const int qd = hp->n_heads * hd, kvd = n_kv * hd;
    const struct batch *b = st->b;
    float *q = f->qkv, *k = q + (size_t)n * qd, *v = k + (size_t)n * kvd;
    /* A KV-sharing layer attends over its source layer's rows, which that layer stored earlier this step;
     * recurrent layers have no cache rows and KV layers sit at their place among those that have. */
    const int src = llm_kv_source(hp, l);
    int swa;
    const int j = kv_cache_layer_index(hp, l, f->kv_swa != NULL, &swa);
    if (src < 0 || j < 0) return FERRY_ERR_INTERNAL;
    /* The window's pool holds only the blocks of the positions the window reaches (win_lo below). */
    struct kv_layer_view view = kv_cache_layer(swa ? f->kv_swa : f->kv, j);
    /* A layer of its own shape uses the front of its rows (the cache's rows hold the widest layer's). */
    view.n_kv_heads = n_kv, view.head_dim = hd;
    const int local = llm_layer_is_local(hp, l);
    const float *inv_freq = local ? f->m->inv_freq_local : f->m->inv_freq;
    kern_cpu_rope(q, b->pos, n, hp->n_heads, hd, rd, inv_freq, hp->rope_style);
    const float qs = llm_rope_q_scale(hp);
    for (int i = 0; (qs != 1.0f || hp->attn_temp_beta != 0) && i < n; i++)
        kern_cpu_q_scale(q + (size_t)i * qd, 1, hp->n_heads, hd, rd, qs, llm_attn_temp(hp, b->pos[i]));
    if (src == l) {
        kern_cpu_rope(k, b->pos, n, n_kv, hd, rd, inv_freq, hp->rope_style);
        kern_cpu_kv_store(&view, k, v, b->seq, b->pos, n);
    }
    const float *sinks = layer_sinks(f, l);
    if (!local && !sinks)
        return kern_cpu_attention(f->att, q, &view, b->seq, b->pos, n, hp->n_heads, llm_attn_scale(hp),
                                  f->tp);
    /* A local layer attends to the window's positions (pos - window, pos]; sinks need the log-sum-exps. */
    for (int i = 0; i < n; i++)
        f->win_lo[i] = local && b->pos[i] >= hp->sliding_window ? b->pos[i] - hp->sliding_window + 1 : 0;
    int rc = kern_cpu_attention_range(f->att, f->win_lse, q, &view, b->seq, f->win_lo, b->pos, n, hp->n_heads,
                                      llm_attn_scale(hp), f->tp);
    if (!rc && sinks) kern_cpu_attention_sinks(f->att, f->win_lse, sinks, n, hp->n_heads, hp->head_dim);
    return rc;
}

/* The KV ops of layer l on the KV owner: q|k|v rows go over, the attention output comes back into att. */
static int kv_ops_remote(struct forward_cpu *f, int l, const struct step *st, int n)
{
    const struct llm_hparams *hp = &f->m->hp;
    const size_t qd = (size_t)hp->n_heads * hp->head_dim, kvd = (size_t)hp->n_kv_heads * hp->head_dim,
                 row = qd + 2 * kvd;
    const float *rows = f->qkv;
    if (layer_sinks(f, l)) return FERRY_ERR_UNSUPPORTED; /* the owners' `attend` has no sinks */
    if (n > 1) {
        for (int i = 0; i < n; i++) {
            float *r = f->qkv_rows + (size_t)i * row;
            memcpy(r, f->qkv + (size_t)i * qd, qd * sizeof(float));
            memcpy(r + qd, f->qkv + (size_t)n * qd + (size_t)i * kvd, kvd * sizeof(float));
            memcpy(r + qd + kvd, f->qkv + (size_t)n * (qd + kvd) + (size_t)i * kvd, kvd * sizeof(float));
        }
        rows = f->qkv_rows;
    }
    return f->kv_owner->ops->attend(f->kv_owner, l, st, rows, f->att);
}

static double group_bytes(const struct layer_group *g)
{
    double b = 0;
    for (int j = 0; j < g->n_parts; j++)
        b += (double)dtype_row_size(g->part[j].type, g->cols) * g->part[j].rows;
    return b;
}

/* LOP_Q_GATE: the query part (n, n_heads, 2, head_dim) of qkv becomes (n, n_heads, head_dim), the gates go to
 * f->gate (n, q_dim), and the key and value parts move down behind the queries (the layout kv_ops_* read). */
static int q_gate_split(struct forward_cpu *f, int n)
{
    const struct llm_hparams *hp = &f->m->hp;
    const size_t hd = (size_t)hp->head_dim, qd = (size_t)hp->n_heads * hd, kvd = (size_t)hp->n_kv_heads * hd;
    if (!f->gate) return FERRY_ERR_INTERNAL;
    float *qkv = f->qkv;
    for (size_t i = 0; i < (size_t)n * hp->n_heads; i++) {
        memcpy(f->gate + i * hd, qkv + (2 * i + 1) * hd, hd * sizeof(float));
        memmove(qkv + i * hd, qkv + 2 * i * hd, hd * sizeof(float)); /* i*hd <= 2i*hd: front to back */
    }
    memmove(qkv + (size_t)n * qd, qkv + (size_t)n * 2 * qd, (size_t)n * 2 * kvd * sizeof(float));
    return FERRY_OK;
}

/* One destination of dn_unpack: per key head h, `width` floats at base + t * stride + h * width. */
struct dn_part {
    float *base;
    int stride, width;
};

/* Qwen3-Next's packed products: row t of x (n rows) holds, per key head h (nk of them), the parts' pieces one
 * after the other; each piece goes to its part's place. */
static void dn_unpack(const float *x, int n, int nk, const struct dn_part *parts, int n_parts)
{
    for (int t = 0; t < n; t++)
        for (int h = 0; h < nk; h++)
            for (int p = 0; p < n_parts; p++) {
                const int w = parts[p].width;
                memcpy(parts[p].base + (size_t)t * parts[p].stride + (size_t)h * w, x, (size_t)w * sizeof *x);
                x += w;
            }
}

/* LOP_DELTANET of layer l on the rows in xn (see program.h), its output in d. With st NULL (timing) the
 * products run and the per-sequence part (convolution and rule over the slots' state) is skipped: the
 * out-product then reads the gates' rows, values of the same scale. The per-sequence part's seconds go to
 * kv_seconds (like the KV ops, it is not among the planner's timed arithmetic). */
static int deltanet(struct forward_cpu *f, int l, const struct step *st, int n, const struct layer_weights *w,
                    float *out, const float *in)
{
    const struct llm_hparams *hp = &f->m->hp;
    const struct layer_deltanet *dn = &w->dn;
    const struct batch *b = st ? st->b : NULL;
    if (n < 1 || !dn->qkv.data || !dn->out.data || !dn->conv || !dn->dt || !dn->a || !dn->norm ||
        (b && !f->state) || !f->dn_proj)
        return FERRY_ERR_INTERNAL;
    const int C = llm_ssm_conv_dim(hp), I = hp->ssm_inner, nv = hp->ssm_n_v_heads, nk = hp->ssm_n_k_heads,
              hk = hp->ssm_head_k, hv = llm_ssm_head_v(hp);
    const struct kern_dn_dims d = {
        .n_k_heads = nk, .n_v_heads = nv, .head_k = hk, .head_v = hv, .grouped = hp->ssm_grouped};
    float *pq = f->dn_proj, *pz = pq + (size_t)n * C, *pb = pz + (size_t)n * I, *pa = pb + (size_t)n * nv;
    /* q|k|v, z, b, a: four products, or Qwen3-Next's two packed ones into dn_pack (split below); a packed
     * tensor (known by its rows) wins over a separate z or a. */
    const int qkvz = dn->qkv.rows != C, ba = dn->beta.rows != nv;
    if ((qkvz || ba) && !f->dn_pack) return FERRY_ERR_INTERNAL;
    float *xqkvz = f->dn_pack, *xba = f->dn_pack + (size_t)n * (C + I);
    const struct wview none = {0};
    const struct wview *mats[4] = {&dn->qkv, qkvz ? &none : &dn->z, &dn->beta, ba ? &none : &dn->alpha};
    float *ys[4] = {qkvz ? xqkvz : pq, pz, ba ? xba : pb, pa};
    struct kern_cpu_mm jobs[4];
    int n_jobs = 0;
    for (int j = 0; j < 4; j++)
        if (mats[j]->data)
            jobs[n_jobs++] = (struct kern_cpu_mm){
                .y = ys[j], .w = mats[j]->data, .wt = mats[j]->type, .n = (int)mats[j]->rows};
    int rc = kern_cpu_matmul_multi(jobs, n_jobs, in, n, hp->dim, f->tp);
    if (rc) return rc;
    const int per = nv / nk; /* value heads per key head */
    if (qkvz) {
        const struct dn_part parts[4] = {{pq, C, hk},
                                         {pq + (size_t)nk * hk, C, hk},
                                         {pq + (size_t)2 * nk * hk, C, per * hv},
                                         {pz, I, per * hv}};
        dn_unpack(xqkvz, n, nk, parts, 4);
    }
    if (ba) {
        const struct dn_part parts[2] = {{pb, nv, per}, {pa, nv, per}};
        dn_unpack(xba, n, nk, parts, 2);
    }
    /* Rates sigmoid(b); decays (log) -exp(A_log) * softplus(a + dt_bias), softplus as torch's (x past 20). */
    for (size_t i = 0; i < (size_t)n * nv; i++) {
        const int j = (int)(i % (size_t)nv);
        const float t = pa[i] + dn->dt[j];
        pb[i] = 1.0f / (1.0f + expf(-pb[i]));
        pa[i] = dn->a[j] * (t > 20.0f ? t : log1pf(expf(t)));
    }
    if (!b) { /* timing: no state touched */
        memcpy(f->dn_o, pz, (size_t)n * I * sizeof(float));
        rc = kern_cpu_matmul(out, f->dn_o, dn->out.data, dn->out.type, NULL, n, hp->dim, I, f->tp);
        f->pending = 1;
        return rc;
    }
    /* Each sequence's rows in order, through its own state. */
    const double k0 = now_s();
    memset(f->dn_done, 0, (size_t)n);
    for (int i0 = 0; i0 < n; i0++) {
        if (f->dn_done[i0]) continue;
        const int s = b->seq[i0];
        int m = 0;
        for (int i = i0; i < n; i++)
            if (!f->dn_done[i] && b->seq[i] == s) f->dn_rows[m++] = i, f->dn_done[i] = 1;
        float *cs = seq_state_conv(f->state, s, l), *S = seq_state_rec(f->state, s, l);
        if (!cs || !S) return FERRY_ERR_INTERNAL;
        if (b->pos[i0] == 0) seq_state_reset(f->state, s, l);
        float *g = f->dn_gb, *beta = g + (size_t)m * nv;
        for (int t = 0; t < m; t++) {
            const size_t r = (size_t)f->dn_rows[t];
            memcpy(f->dn_run + (size_t)t * C, pq + r * C, (size_t)C * sizeof(float));
            memcpy(g + (size_t)t * nv, pa + r * nv, (size_t)nv * sizeof(float));
            memcpy(beta + (size_t)t * nv, pb + r * nv, (size_t)nv * sizeof(float));
        }
        kern_cpu_dn_conv(f->dn_run, f->dn_run, m, C, dn->conv, hp->ssm_conv_kernel, cs);
        /* transformers' Qwen3.5: q and k L2-normed with eps 1e-6, q then scaled by 1/sqrt(head_k). */
        for (int t = 0; t < m; t++) {
            float *row = f->dn_run + (size_t)t * C;
            kern_cpu_dn_l2norm(row, nk, hk, hk, 1e-6f, 1.0f / sqrtf((float)hk));
            kern_cpu_dn_l2norm(row + (size_t)nk * hk, nk, hk, hk, 1e-6f, 1.0f);
        }
        const struct kern_dn_seq sq = {.q = f->dn_run,
                                       .k = f->dn_run + (size_t)nk * hk,
                                       .v = f->dn_run + (size_t)2 * nk * hk,
                                       .stride = C,
                                       .g = g,
                                       .beta = beta,
                                       .o = f->dn_orun,
                                       .n = m};
        /* Token by token at every length: on the host the recurrence's vector path does fewer operations
         * than the chunked form and ran 7x faster over 128 tokens (kernels/cpu/NOTES.md, gated DeltaNet). */
        kern_cpu_dn_recurrent(&sq, &d, S, f->tp);
        for (int t = 0; t < m; t++)
            memcpy(f->dn_o + (size_t)f->dn_rows[t] * I, f->dn_orun + (size_t)t * I,
                   (size_t)I * sizeof(float));
    }
    f->kv_seconds += now_s() - k0;
    kern_cpu_dn_gated_norm(f->dn_o, pz, dn->norm, n * nv, hv, hp->norm_eps);
    rc = kern_cpu_matmul(out, f->dn_o, dn->out.data, dn->out.type, NULL, n, hp->dim, I, f->tp);
    f->pending = 1;
    return rc;
}

/* Per-layer inputs (Gemma 4 E2B/E4B). At embedding: each token's inputs of every layer, (proj(x) / sqrt(dim)
 * normed per layer + embedding * sqrt(ple_dim)) / sqrt(2), x the scaled embedding row. */
static int ple_inputs(struct forward_cpu *f, const int32_t *tokens, int n)
{
    const struct model *m = f->m;
    const struct llm_hparams *hp = &m->hp;
    const int pl = hp->n_layers * hp->ple_dim;
    int rc = kern_cpu_embed(f->ple, m->ple_embd.data, m->ple_embd.type, (int)m->ple_embd.rows, pl, tokens, n);
    if (!rc)
        rc = kern_cpu_matmul(f->ple_p, f->x, m->ple_mproj.data, m->ple_mproj.type, NULL, n, pl, hp->dim,
                             f->tp);
    if (rc) return rc;
    const int64_t all = (int64_t)n * pl;
    kern_cpu_scale(f->ple, sqrtf((float)hp->ple_dim), all);
    kern_cpu_scale(f->ple_p, 1.0f / sqrtf((float)hp->dim), all);
    kern_cpu_rmsnorm(f->ple_p, f->ple_p, m->ple_proj_norm, n * hp->n_layers, hp->ple_dim, hp->norm_eps);
    kern_cpu_add(f->ple, f->ple_p, all);
    kern_cpu_scale(f->ple, 1.0f / sqrtf(2.0f), all);
    return FERRY_OK;
}

/* Layer f->layer's: x += D; x += norm(proj(gelu_tanh(gate(x)) * its input)). */
static int ple_add(struct forward_cpu *f, int n)
{
    const struct llm_hparams *hp = &f->m->hp;
    const struct model_layer *L = &f->m->layers[f->layer];
    const int pd = hp->ple_dim, l = f->layer;
    if (!f->ple || !L->ple_gate.data || !L->ple_proj.data || !L->ple_norm) return FERRY_ERR_INTERNAL;
    if (f->pending) kern_cpu_add(f->x, f->d, (int64_t)n * hp->dim);
    f->pending = 0;
    for (int i = 0; i < n; i++)
        memcpy(f->ple_u + (size_t)i * pd, f->ple + ((size_t)i * hp->n_layers + l) * pd, pd * sizeof(float));
    int rc = kern_cpu_matmul(f->ple_t, f->x, L->ple_gate.data, L->ple_gate.type, NULL, n, pd, hp->dim, f->tp);
    if (rc) return rc;
    kern_cpu_gelu_mul(f->ple_t, f->ple_u, (int64_t)n * pd);
    rc = kern_cpu_matmul(f->d, f->ple_t, L->ple_proj.data, L->ple_proj.type, NULL, n, hp->dim, pd, f->tp);
    if (rc) return rc;
    kern_cpu_rmsnorm(f->d, f->d, L->ple_norm, n, hp->dim, hp->norm_eps);
    kern_cpu_add(f->x, f->d, (int64_t)n * hp->dim);
    return FERRY_OK;
}

/* y (n, dim) += the layer's shared expert on x: its FFN is the gate|up and down groups. */
static int moe_shared(struct forward_cpu *f, const struct layer_weights *w, int n, float *y, const float *x)
{
    const struct layer_group *gu = &w->mat[LAYER_GU], *dn = &w->mat[LAYER_DOWN];
    if (gu->n_parts != 2 || dn->n_parts != 1 || !w->moe.shexp_gate) return FERRY_ERR_INTERNAL;
    const struct kern_cpu_moe_shared sh = {.gate = gu->part[0].data,
                                           .up = gu->part[1].data,
                                           .down = dn->part[0].data,
                                           .gate_t = gu->part[0].type,
                                           .up_t = gu->part[1].type,
                                           .down_t = dn->part[0].type,
                                           .dim = f->m->hp.dim,
                                           .ffn = (int)gu->part[0].rows,
                                           .gate_inp = w->moe.shexp_gate};
    return kern_cpu_moe_shared(y, x, n, &sh, f->moe_ws, f->tp);
}

static int run_op(struct forward_cpu *f, const struct layer_op *op, const struct layer_weights *w, int n)
{
    const struct llm_hparams *hp = &f->m->hp;
    switch (op->kind) {
    case LOP_ADD_NORM:
        if (f->pending) kern_cpu_add(f->x, f->d, (int64_t)n * hp->dim);
        f->pending = 0;
        kern_cpu_rmsnorm(act(f, op->out), f->x, w->norm[op->arg], n, hp->dim, hp->norm_eps);
        return FERRY_OK;
    case LOP_LINEAR: {
        int rc = linear_group(f, act(f, op->out), act(f, op->in), &w->mat[op->arg], n);
        if (op->out == LACT_D) f->pending = 1;
        return rc;
    }
    case LOP_SILU_MUL: {
        const int ffn = llm_layer_ffn(hp, f->layer);
        kern_cpu_silu_mul(f->gu, f->gu + (size_t)n * ffn, (int64_t)n * ffn);
        return FERRY_OK;
    }
    case LOP_NORM:
        kern_cpu_rmsnorm(act(f, op->out), act(f, op->in), w->norm[op->arg], n, hp->dim, hp->norm_eps);
        return FERRY_OK;
    case LOP_GELU_MUL: {
        const int ffn = llm_layer_ffn(hp, f->layer);
        kern_cpu_gelu_mul(f->gu, f->gu + (size_t)n * ffn, (int64_t)n * ffn);
        return FERRY_OK;
    }
    case LOP_QK_NORM: {
        /* The query part is (n * n_heads, head_dim) rows, the key part after it (n * n_kv_heads, head_dim).
         */
        int hd, n_kv, rd;
        llm_layer_shape(hp, f->layer, &hd, &n_kv, &rd);
        float *q = f->qkv, *k = q + (size_t)n * hp->n_heads * hd;
        const int own_kv = !llm_layer_kv_shared(hp, f->layer); /* a KV-sharing layer has queries only */
        if (!w->norm[LAYER_Q_NORM] || (own_kv && !w->norm[LAYER_K_NORM])) return FERRY_ERR_INTERNAL;
        kern_cpu_rmsnorm(q, q, w->norm[LAYER_Q_NORM], n * hp->n_heads, hd, hp->norm_eps);
        if (own_kv) kern_cpu_rmsnorm(k, k, w->norm[LAYER_K_NORM], n * n_kv, hd, hp->norm_eps);
        return FERRY_OK;
    }
    case LOP_MOE:
    case LOP_MOE_CLAMPED:
    case LOP_MOE_SHARED: {
        const struct layer_moe *e = &w->moe;
        if (e->n_expert <= 0 || !f->moe_ws) return FERRY_ERR_INTERNAL; /* weights without their experts */
        const int clamped = op->kind == LOP_MOE_CLAMPED;
        const struct kern_cpu_moe_experts ex = {.gate = e->gate.data,
                                                .up = e->up.data,
                                                .down = e->down.data,
                                                .gate_t = e->gate.type,
                                                .up_t = e->up.type,
                                                .down_t = e->down.type,
                                                .n_expert = e->n_expert,
                                                .dim = hp->dim,
                                                .ffn = e->ffn,
                                                .gate_b = clamped ? e->gate_b : NULL,
                                                .up_b = clamped ? e->up_b : NULL,
                                                .down_b = clamped ? e->down_b : NULL,
                                                .act =
                                                    clamped ? KERN_CPU_MOE_SWIGLU_CLAMPED : KERN_CPU_MOE_SILU,
                                                .alpha = e->alpha,
                                                .limit = e->limit};
        int rc = kern_cpu_matmul(f->moe_logits, act(f, op->in), e->router.data, e->router.type,
                                 clamped ? e->router_b : NULL, n, e->n_expert, hp->dim, f->tp);
        /* gpt-oss's weights, the softmax of the top-k logits, are the normalised top-k probabilities. */
        if (!rc)
            rc = kern_cpu_moe_route(f->moe_logits, n, e->n_expert, e->n_used, clamped || e->norm_topk,
                                    f->moe_ids, f->moe_wts);
        if (!rc)
            rc = kern_cpu_moe_ffn(act(f, op->out), act(f, op->in), f->moe_ids, f->moe_wts, n, e->n_used, &ex,
                                  f->moe_ws, f->tp);
        if (!rc && op->kind == LOP_MOE_SHARED) rc = moe_shared(f, w, n, act(f, op->out), act(f, op->in));
        if (op->out == LACT_D) f->pending = 1;
        return rc;
    }
    case LOP_Q_GATE:
        return q_gate_split(f, n);
    case LOP_ATT_GATE: {
        float *y = act(f, op->out);
        const float *x = act(f, op->in);
        if (!f->gate) return FERRY_ERR_INTERNAL;
        for (int64_t i = 0; i < (int64_t)n * hp->n_heads * hp->head_dim; i++)
            y[i] = x[i] / (1.0f + expf(-f->gate[i]));
        return FERRY_OK;
    }
    case LOP_V_NORM: {
        /* The value part follows the queries and the keys: (n * n_kv_heads, head_dim) rows. */
        int hd, n_kv, rd;
        llm_layer_shape(hp, f->layer, &hd, &n_kv, &rd);
        float *v = f->qkv + (size_t)n * (hp->n_heads + n_kv) * hd;
        if (!f->ones) return FERRY_ERR_INTERNAL;
        if (!llm_layer_kv_shared(hp, f->layer)) kern_cpu_rmsnorm(v, v, f->ones, n * n_kv, hd, hp->norm_eps);
        return FERRY_OK;
    }
    case LOP_PLE:
        return hp->ple_dim > 0 ? ple_add(f, n) : FERRY_OK;
    case LOP_SCALE_X:
        if (!w->norm[op->arg]) return FERRY_ERR_INTERNAL;
        if (f->pending) kern_cpu_add(f->x, f->d, (int64_t)n * hp->dim);
        f->pending = 0;
        kern_cpu_scale(f->x, w->norm[op->arg][0], (int64_t)n * hp->dim);
        return FERRY_OK;
    case LOP_ROPE_KV:
    case LOP_ATTENTION:
    case LOP_ATTENTION_SINKS:
        return FERRY_ERR_INTERNAL; /* run as a unit by kv_ops_* */
    case LOP_DELTANET:
        return FERRY_ERR_INTERNAL; /* run by run_layer: kv_ops_*, deltanet */
    }
    return FERRY_ERR_INTERNAL;
}

/* Layer l; with kv_ops 0 the KV ops are skipped (timing). */
static int run_layer(struct forward_cpu *f, int l, const struct step *st, int n, int kv_ops)
{
    const struct layer_program *p = layer_program_of_layer(&f->m->hp, l);
    const struct layer_weights *w = &f->w[l];
    if (w->mat[0].n_parts == 0)
        return FERRY_ERR_INTERNAL; /* a layer whose weights this backend was not given */
    f->layer = l;
    for (int i = 0; i < p->n_ops; i++) {
        int rc, kind;
        const double t0 = f->profile ? now_s() : 0;
        if (i == p->kv_first) {
            const double k0 = kv_ops ? now_s() : 0;
            rc = !kv_ops ? FERRY_OK : f->kv_owner ? kv_ops_remote(f, l, st, n) : kv_ops_local(f, l, st, n);
            if (kv_ops) f->kv_seconds += now_s() - k0;
            i = p->kv_last;
            kind = PROF_KV;
        } else if (p->ops[i].kind == LOP_DELTANET) { /* its state's part timed like the KV ops */
            rc = deltanet(f, l, kv_ops ? st : NULL, n, w, act(f, p->ops[i].out), act(f, p->ops[i].in));
            kind = PROF_KV;
        } else {
            const struct layer_op *op = &p->ops[i];
            rc = run_op(f, op, w, n);
            const int moe = op->kind == LOP_MOE || op->kind == LOP_MOE_CLAMPED || op->kind == LOP_MOE_SHARED;
            kind = op->kind == LOP_LINEAR                                 ? op->arg
                   : moe                                                  ? LAYER_GU
                   : op->kind == LOP_SILU_MUL || op->kind == LOP_GELU_MUL ? PROF_SILU
                                                                          : PROF_NORM;
            if (f->profile && op->kind == LOP_LINEAR) f->prof_bytes[kind] += group_bytes(&w->mat[op->arg]);
        }
        if (rc) return rc;
        if (f->profile) f->prof_s[kind] += now_s() - t0, f->prof_calls[kind]++;
    }
    return FERRY_OK;
}

/* ----------------------------------------------------------------------------------------------------------
 */
/* The backend table */

static int cpu_begin(struct backend *be, const struct step *st)
{
    (void)be;
    (void)st;
    return FERRY_OK;
}

static int cpu_embed(struct backend *be, const struct step *st)
{
    struct forward_cpu *f = (struct forward_cpu *)be;
    const struct model *m = f->m;
    const int n = st->b->n_tokens;
    if (n <= 0 || n > f->max_tokens) return FERRY_ERR_INVALID;
    f->pending = 0;
    const double t0 = f->profile ? now_s() : 0;
    const int rc = kern_cpu_embed(f->x, m->tok_embd.data, m->tok_embd.type, (int)m->tok_embd.rows, m->hp.dim,
                                  st->b->tokens, n);
    if (m->hp.embed_scale != 0.0f) kern_cpu_scale(f->x, m->hp.embed_scale, (int64_t)n * m->hp.dim);
    if (!rc && m->hp.ple_dim > 0) {
        const int rc2 = ple_inputs(f, st->b->tokens, n);
        if (rc2) return rc2;
    }
    if (f->profile) f->prof_s[PROF_EMBED] += now_s() - t0, f->prof_calls[PROF_EMBED]++;
    return rc;
}

static int cpu_layer(struct backend *be, int l, const struct step *st)
{
    struct forward_cpu *f = (struct forward_cpu *)be;
    const int n = st->b->n_tokens;
    if (n <= 0 || n > f->max_tokens || l < 0 || l >= f->m->hp.n_layers) return FERRY_ERR_INVALID;
    arith_enter(f);
    const double t0 = now_s();
    int rc = run_layer(f, l, st, n, 1);
    f->layer_seconds += now_s() - t0;
    f->layers_run++;
    return rc;
}

static int cpu_head(struct backend *be, const struct step *st, float *logits)
{
    struct forward_cpu *f = (struct forward_cpu *)be;
    const struct model *m = f->m;
    const struct llm_hparams *hp = &m->hp;
    const struct batch *b = st->b;
    const int n = b->n_tokens, dim = hp->dim;
    arith_enter(f);
    if (f->pending) kern_cpu_add(f->x, f->d, (int64_t)n * dim);
    f->pending = 0;
    /* Gather the rows that want logits, then norm and project only those. */
    int n_out = 0;
    for (int i = 0; i < n; i++)
        if (b->want_logits[i])
            memmove(f->xn + (size_t)n_out++ * dim, f->x + (size_t)i * dim, dim * sizeof(float));
    if (n_out == 0) return FERRY_OK;
    if (b->hidden) { /* embeddings: the normed rows themselves */
        kern_cpu_rmsnorm(logits, f->xn, m->output_norm, n_out, dim, hp->norm_eps);
        return FERRY_OK;
    }
    const double t0 = f->profile ? now_s() : 0;
    kern_cpu_rmsnorm(f->xn, f->xn, m->output_norm, n_out, dim, hp->norm_eps);
    const int rc = kern_cpu_matmul(logits, f->xn, m->output.data, m->output.type, NULL, n_out,
                                   (int)m->output.rows, (int)m->output.cols, f->tp);
    if (hp->final_softcap > 0) kern_cpu_softcap(logits, hp->final_softcap, (int64_t)n_out * m->output.rows);
    if (f->profile) {
        f->prof_s[PROF_HEAD] += now_s() - t0, f->prof_calls[PROF_HEAD]++;
        f->prof_bytes[PROF_HEAD] += (double)dtype_row_size(m->output.type, m->output.cols) * m->output.rows;
    }
    return rc;
}

static float *cpu_x_host(struct backend *be)
{
    return ((struct forward_cpu *)be)->x;
}

static int cpu_x_out(struct backend *be, float *x, int n)
{
    struct forward_cpu *f = (struct forward_cpu *)be;
    if (n <= 0 || n > f->max_tokens) return FERRY_ERR_INVALID;
    if (f->pending) kern_cpu_add(f->x, f->d, (int64_t)n * f->m->hp.dim);
    f->pending = 0;
    if (x != f->x) memcpy(x, f->x, (size_t)n * f->m->hp.dim * sizeof(float));
    return FERRY_OK;
}

static int cpu_x_in(struct backend *be, const float *x, int n)
{
    struct forward_cpu *f = (struct forward_cpu *)be;
    if (n <= 0 || n > f->max_tokens) return FERRY_ERR_INVALID;
    if (x != f->x) memcpy(f->x, x, (size_t)n * f->m->hp.dim * sizeof(float));
    f->pending = 0;
    return FERRY_OK;
}

/* The KV ops for rows computed by another backend (the host's own cache lent out: tests of the exchange, and
 * any host that holds the cache). */
static int cpu_attend(struct backend *be, int l, const struct step *st, const float *qkv, float *att)
{
    struct forward_cpu *f = (struct forward_cpu *)be;
    const struct llm_hparams *hp = &f->m->hp;
    const int n = st->b->n_tokens;
    if (!f->kv || n <= 0 || n > f->max_tokens || l < 0 || l >= hp->n_layers) return FERRY_ERR_INVALID;
    const size_t qd = (size_t)hp->n_heads * hp->head_dim, kvd = (size_t)hp->n_kv_heads * hp->head_dim,
                 row = qd + 2 * kvd;
    for (int i = 0; i < n; i++) {
        const float *r = qkv + (size_t)i * row;
        memcpy(f->qkv + (size_t)i * qd, r, qd * sizeof(float));
        memcpy(f->qkv + (size_t)n * qd + (size_t)i * kvd, r + qd, kvd * sizeof(float));
        memcpy(f->qkv + (size_t)n * (qd + kvd) + (size_t)i * kvd, r + qd + kvd, kvd * sizeof(float));
    }
    int rc = kv_ops_local(f, l, st, n);
    if (!rc) memcpy(att, f->att, (size_t)n * qd * sizeof(float));
    return rc;
}

static void cpu_stats(const struct backend *be, struct backend_stats *st)
{
    const struct forward_cpu *f = (const struct forward_cpu *)be;
    memset(st, 0, sizeof *st);
    st->layers_run = f->layers_run;
    st->layer_seconds = f->layer_seconds;
    st->kv_seconds = f->kv_seconds;
}

static const struct backend_ops cpu_ops = {
    .name = "cpu",
    .free = cpu_free,
    .begin = cpu_begin,
    .embed = cpu_embed,
    .layer = cpu_layer,
    .head = cpu_head,
    .x_host = cpu_x_host,
    .x_out = cpu_x_out,
    .x_in = cpu_x_in,
    .attend = cpu_attend,
    .stats = cpu_stats,
};

/* ----------------------------------------------------------------------------------------------------------
 */
/* Init and timing */

int forward_cpu_init(struct backend **out, const struct model *m, const struct forward_cpu_params *p)
{
    *out = NULL;
    const struct llm_hparams *hp = &m->hp;
    if (p->max_tokens <= 0 || (!p->kv == !p->kv_owner) || (p->kv_owner && !p->kv_owner->ops->attend))
        return FERRY_ERR_INVALID;
    struct forward_cpu *f = calloc(1, sizeof *f);
    if (!f) return FERRY_ERR_NOMEM;
    f->be.ops = &cpu_ops;
    f->m = m;
    f->prog = layer_program_of(hp);
    /* Layers of their own attention shape run on the host's own cache only (the exchange's rows are one
     * shape). */
    if (!f->prog || ((hp->head_dim_swa > 0 || hp->n_layer_kv > 0 || hp->ple_dim > 0) && p->kv_owner) ||
        (hp->ple_dim > 0 && p->weights)) {
        free(f);
        return FERRY_ERR_UNSUPPORTED;
    }
    f->kv = p->kv;
    f->kv_swa = p->kv_swa;
    f->kv_owner = p->kv_owner;
    f->max_tokens = p->max_tokens;
    f->host_alloc = p->host_alloc ? p->host_alloc : default_alloc;
    f->host_free = p->host_alloc ? p->host_free : default_free;
    f->alloc_ctx = p->alloc_ctx;
    f->act = p->act;
    f->plain = p->plain;
    f->invariant = p->invariant;
    int rc = FERRY_ERR_NOMEM;
    f->w = calloc((size_t)hp->n_layers, sizeof *f->w);
    if (!f->w) goto fail;
    if (hp->full_attn_interval > 0 && !p->state) {
        rc = FERRY_ERR_UNSUPPORTED; /* the recurrent mixer needs the slots' state */
        goto fail;
    }
    f->state = p->state;
    if (p->weights && hp->n_expert > 0) { /* packed blocks carry no experts */
        rc = FERRY_ERR_UNSUPPORTED;
        goto fail;
    }
    for (int l = 0; l < hp->n_layers; l++) {
        if (p->weights)
            f->w[l] = p->weights[l];
        else
            layer_weights_of_model_moe(&f->w[l], &m->layers[l], hp);
    }
    if (hp->n_expert > 0) {
        const struct kern_cpu_moe_experts ex = {
            .n_expert = hp->n_expert, .dim = hp->dim, .ffn = hp->expert_ffn_dim};
        const struct kern_cpu_moe_shared sh = {.dim = hp->dim, .ffn = hp->ffn_dim}; /* a shared expert */
        const size_t nt = (size_t)p->max_tokens, ws_e = kern_cpu_moe_ws_floats(&ex, p->max_tokens),
                     ws_s = kern_cpu_moe_shared_ws_floats(&sh, p->max_tokens);
        if (!(f->moe_logits = malloc(nt * (size_t)hp->n_expert * sizeof(float))) ||
            !(f->moe_wts = malloc(nt * (size_t)hp->n_expert_used * sizeof(float))) ||
            !(f->moe_ids = malloc(nt * (size_t)hp->n_expert_used * sizeof(int32_t))) ||
            !(f->moe_ws = malloc((ws_e > ws_s ? ws_e : ws_s) * sizeof(float))))
            goto fail;
    }
    int qd_max, kvd_max;
    llm_max_dims(hp, &qd_max, &kvd_max);
    const size_t n = (size_t)p->max_tokens, qd = (size_t)qd_max, kvd = (size_t)kvd_max;
    const int hd_max = hp->head_dim_swa > hp->head_dim ? hp->head_dim_swa : hp->head_dim;
    if (!(f->ones = malloc((size_t)hd_max * sizeof(float)))) goto fail;
    for (int i = 0; i < hd_max; i++) f->ones[i] = 1.0f;
    f->x = f->host_alloc(f->alloc_ctx, n * hp->dim * sizeof(float));
    f->xn = f->host_alloc(f->alloc_ctx, n * hp->dim * sizeof(float));
    f->d = f->host_alloc(f->alloc_ctx, n * hp->dim * sizeof(float));
    const size_t q_rows = hp->attn_out_gate ? 2 * qd : qd; /* queries and their gates */
    f->qkv = f->host_alloc(f->alloc_ctx, n * (q_rows + 2 * kvd) * sizeof(float));
    if (hp->attn_out_gate && !(f->gate = malloc(n * qd * sizeof(float)))) goto fail;
    if (hp->full_attn_interval > 0) {
        const size_t C = (size_t)llm_ssm_conv_dim(hp), I = (size_t)hp->ssm_inner,
                     nv = (size_t)hp->ssm_n_v_heads;
        if (!(f->dn_proj = malloc(n * (C + I + 2 * nv) * sizeof(float))) ||
            !(f->dn_run = malloc(n * C * sizeof(float))) ||
            !(f->dn_gb = malloc(n * 2 * nv * sizeof(float))) ||
            !(f->dn_orun = malloc(n * I * sizeof(float))) || !(f->dn_o = malloc(n * I * sizeof(float))) ||
            !(f->dn_rows = malloc(n * sizeof(int32_t))) || !(f->dn_done = malloc(n))) {
            rc = FERRY_ERR_NOMEM;
            goto fail;
        }
        int packed = 0;
        for (int l = 0; l < hp->n_layers; l++)
            packed |= llm_layer_is_recurrent(hp, l) && (f->m->layers[l].ssm_qkv.rows != (int64_t)C ||
                                                        f->m->layers[l].ssm_beta.rows != (int64_t)nv);
        if (packed && !(f->dn_pack = malloc(n * (C + I + 2 * nv) * sizeof(float)))) {
            rc = FERRY_ERR_NOMEM;
            goto fail;
        }
    }
    f->att = f->host_alloc(f->alloc_ctx, n * qd * sizeof(float));
    const size_t ffn_max = (size_t)(hp->ffn_dim_shared > hp->ffn_dim ? hp->ffn_dim_shared : hp->ffn_dim);
    f->gu = f->host_alloc(f->alloc_ctx, n * 2 * ffn_max * sizeof(float));
    if (hp->ple_dim > 0) {
        const size_t pl = (size_t)hp->n_layers * hp->ple_dim;
        if (!(f->ple = calloc(n * pl, sizeof(float))) || !(f->ple_p = malloc(n * pl * sizeof(float))) ||
            !(f->ple_t = malloc(n * hp->ple_dim * sizeof(float))) ||
            !(f->ple_u = malloc(n * hp->ple_dim * sizeof(float))))
            goto fail;
    }
    if (f->kv_owner) f->qkv_rows = f->host_alloc(f->alloc_ctx, n * (qd + 2 * kvd) * sizeof(float));
    if ((hp->sliding_window > 0 || layer_program_has(f->prog, LOP_ATTENTION_SINKS)) &&
        (!(f->win_lo = malloc(n * sizeof *f->win_lo)) ||
         !(f->win_lse = malloc(n * hp->n_heads * sizeof(float)))))
        goto fail;
    if (!f->x || !f->xn || !f->d || !f->qkv || !f->att || !f->gu || (f->kv_owner && !f->qkv_rows)) goto fail;
    rc = p->pin_threads ? tpool_init_pinned(&f->tp, p->n_threads) : tpool_init(&f->tp, p->n_threads);
    if (rc) goto fail;
    const char *prof = getenv("FERRY_CPU_PROFILE");
    f->profile = prof && *prof == '1';
    *out = &f->be;
    return FERRY_OK;
fail:
    cpu_free(&f->be);
    return rc;
}

static int cmp_double(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double view_bytes(const struct wview *v)
{
    return v->data ? (double)dtype_row_size(v->type, v->cols) * (double)v->rows : 0;
}

/* The bytes of the layer's matrices: its groups and, in a recurrent layer, the mixer's five. */
static double layer_bytes(const struct layer_weights *w)
{
    double b = 0;
    for (int i = 0; i < LAYER_N_MATS; i++) b += group_bytes(&w->mat[i]);
    const struct layer_deltanet *d = &w->dn;
    return b + view_bytes(&d->qkv) + view_bytes(&d->z) + view_bytes(&d->beta) + view_bytes(&d->alpha) +
           view_bytes(&d->out);
}

int forward_cpu_time_layers(struct backend *be, const int *layers, int n, int m, int reps, double *seconds)
{
    struct forward_cpu *f = (struct forward_cpu *)be;
    const struct llm_hparams *hp = &f->m->hp;
    *seconds = 0;
    if (!layers || n <= 0 || m <= 0 || m > f->max_tokens || reps <= 0 || reps > 64) return FERRY_ERR_INVALID;
    for (int i = 0; i < n; i++)
        if (layers[i] < 0 || layers[i] >= hp->n_layers || layer_bytes(&f->w[layers[i]]) <= 0)
            return FERRY_ERR_INVALID;
    arith_enter(f);
    /* Random activations of a realistic scale (zeros or denormals would time a different machine). */
    uint64_t s = 0x9e3779b97f4a7c15ull;
    const size_t qd = (size_t)hp->n_heads * hp->head_dim;
    for (size_t i = 0; i < (size_t)m * hp->dim; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        f->x[i] = (float)((s >> 40) * 0x1.0p-24) - 0.5f;
    }
    for (size_t i = 0; i < (size_t)m * qd; i++) f->att[i] = f->x[i % ((size_t)m * hp->dim)];
    double t[65];
    const double ref = layer_bytes(&f->w[layers[0]]);
    for (int r = 0; r <= reps; r++) {
        const int l = layers[r ? (r - 1) % n : 0];
        f->pending = 0;
        const double t0 = now_s();
        int rc = run_layer(f, l, NULL, m, 0);
        t[r] = (now_s() - t0) * ref / layer_bytes(&f->w[l]);
        if (rc) return rc;
    }
    f->pending = 0;
    qsort(t + 1, (size_t)reps, sizeof *t, cmp_double);
    *seconds = t[1 + reps / 2];
    return FERRY_OK;
}
