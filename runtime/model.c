/* model — builds per-layer views over a model_file's tensors and checks every shape (see model.h). */
#include "runtime/model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "quant/fp16.h"
#include "kernels/core/status.h"
#include "kernels/core/log.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/threadpool.h"
#include "quant/matrix.h"
#include "quant/mix.h"
#include "weights/arch/arch.h"

static int find_matrix(const struct model_file *mf, const char *name, int64_t rows, int64_t cols,
                       struct wview *out, char err[256])
{
    const struct wtensor *t = model_file_tensor(mf, name);
    if (!t) {
        snprintf(err, 256, "missing tensor %s", name);
        return FERRY_ERR_NOT_FOUND;
    }
    if (t->n_dims != 2 || t->ne[0] != cols || t->ne[1] != rows) {
        snprintf(err, 256, "tensor %s has shape [%lld, %lld], expected [%lld, %lld] (ne0 first)", name,
                 (long long)t->ne[0], (long long)t->ne[1], (long long)cols, (long long)rows);
        return FERRY_ERR_FORMAT;
    }
    *out = (struct wview){.data = t->data, .type = t->type, .rows = rows, .cols = cols};
    return FERRY_OK;
}

/* An f32 copy of a tensor of ne {n, n1} (a vector when n1 is 1, else a table of n1 rows: the experts'
 * biases); *out stays NULL when optional and absent. */
static int load_f32(const struct model_file *mf, const char *name, int64_t n, int64_t n1, int optional,
                    float **out, char err[256])
{
    *out = NULL;
    const struct wtensor *t = model_file_tensor(mf, name);
    if (!t) {
        if (optional) return FERRY_OK;
        snprintf(err, 256, "missing tensor %s", name);
        return FERRY_ERR_NOT_FOUND;
    }
    if (t->ne[0] != n || t->ne[1] != n1 || t->ne[2] * t->ne[3] != 1) {
        snprintf(err, 256, "tensor %s has shape [%lld, %lld], expected [%lld, %lld]", name,
                 (long long)t->ne[0], (long long)t->ne[1], (long long)n, (long long)n1);
        return FERRY_ERR_FORMAT;
    }
    n *= n1;
    float *v = malloc((size_t)n * sizeof *v);
    if (!v) return FERRY_ERR_NOMEM;
    if (!dtype_to_f32(t->type, t->data, v, n)) {
        free(v);
        snprintf(err, 256, "tensor %s: cannot convert type %s to f32", name, dtype_name(t->type));
        return FERRY_ERR_FORMAT;
    }
    *out = v;
    return FERRY_OK;
}

static int load_vector(const struct model_file *mf, const char *name, int64_t n, int optional, float **out,
                       char err[256])
{
    return load_f32(mf, name, n, 1, optional, out, err);
}

/* Where a layer keeps the tensor of a role: a matrix, or an f32 vector (NULL for a role no program reads). */
static struct wview *layer_matrix(struct model_layer *L, enum arch_role r)
{
    switch (r) {
    case ARCH_ROLE_WQ:
        return &L->wq;
    case ARCH_ROLE_WK:
        return &L->wk;
    case ARCH_ROLE_WV:
        return &L->wv;
    case ARCH_ROLE_WO:
        return &L->wo;
    case ARCH_ROLE_W_GATE:
        return &L->w_gate;
    case ARCH_ROLE_W_UP:
        return &L->w_up;
    case ARCH_ROLE_ROUTER:
        return &L->router;
    case ARCH_ROLE_SSM_QKV:
    case ARCH_ROLE_SSM_QKVZ: /* packed: ssm_z stays empty */
        return &L->ssm_qkv;
    case ARCH_ROLE_SSM_Z:
        return &L->ssm_z;
    case ARCH_ROLE_SSM_BETA:
    case ARCH_ROLE_SSM_BA: /* packed: ssm_alpha stays empty */
        return &L->ssm_beta;
    case ARCH_ROLE_SSM_ALPHA:
        return &L->ssm_alpha;
    case ARCH_ROLE_SSM_OUT:
        return &L->ssm_out;
    case ARCH_ROLE_PLE_GATE:
        return &L->ple_gate;
    case ARCH_ROLE_PLE_PROJ:
        return &L->ple_proj;
    default:
        return &L->w_down;
    }
}

static float **layer_vector(struct model_layer *L, enum arch_role r)
{
    switch (r) {
    case ARCH_ROLE_ATTN_NORM:
        return &L->attn_norm;
    case ARCH_ROLE_FFN_NORM:
        return &L->ffn_norm;
    case ARCH_ROLE_BQ:
        return &L->bq;
    case ARCH_ROLE_BK:
        return &L->bk;
    case ARCH_ROLE_BV:
        return &L->bv;
    case ARCH_ROLE_Q_NORM:
        return &L->q_norm;
    case ARCH_ROLE_K_NORM:
        return &L->k_norm;
    case ARCH_ROLE_POST_ATTN_NORM:
        return &L->post_attn_norm;
    case ARCH_ROLE_POST_FFN_NORM:
        return &L->post_ffn_norm;
    case ARCH_ROLE_BO:
        return &L->bo;
    case ARCH_ROLE_ATTN_SINKS:
        return &L->attn_sinks;
    case ARCH_ROLE_ROUTER_BIAS:
        return &L->router_b;
    case ARCH_ROLE_EXP_GATE_BIAS:
        return &L->exp_gate_b;
    case ARCH_ROLE_EXP_UP_BIAS:
        return &L->exp_up_b;
    case ARCH_ROLE_EXP_DOWN_BIAS:
        return &L->exp_down_b;
    case ARCH_ROLE_SSM_DT:
        return &L->ssm_dt;
    case ARCH_ROLE_SSM_A:
        return &L->ssm_a;
    case ARCH_ROLE_SSM_NORM:
        return &L->ssm_norm;
    case ARCH_ROLE_OUT_SCALE:
        return &L->out_scale;
    case ARCH_ROLE_PLE_NORM:
        return &L->ple_norm;
    case ARCH_ROLE_SHEXP_GATE:
        return &L->shexp_gate;
    default:
        return NULL;
    }
}

/* A fused tensor as the row ranges its parts are: q|k|v or gate|up (views into it, no copy). */
static void split_rows(struct model_layer *L, enum arch_role r, const struct wview *whole,
                       const struct llm_hparams *hp)
{
    const int64_t qd = (int64_t)hp->n_heads * hp->head_dim, kvd = (int64_t)hp->n_kv_heads * hp->head_dim;
    struct wview *parts[3] = {&L->wq, &L->wk, &L->wv};
    int64_t rows[3] = {qd, kvd, kvd};
    int n = 3;
    if (r == ARCH_ROLE_W_GATE_UP) {
        parts[0] = &L->w_gate, parts[1] = &L->w_up, rows[0] = rows[1] = hp->ffn_dim, n = 2;
    }
    const size_t row_bytes = dtype_row_size(whole->type, whole->cols);
    int64_t row0 = 0;
    for (int i = 0; i < n; i++) {
        *parts[i] = (struct wview){.data = (const char *)whole->data + row_bytes * (size_t)row0,
                                   .type = whole->type,
                                   .rows = rows[i],
                                   .cols = whole->cols};
        row0 += rows[i];
    }
}

static int is_norm(enum arch_role r)
{
    return r == ARCH_ROLE_ATTN_NORM || r == ARCH_ROLE_FFN_NORM || r == ARCH_ROLE_Q_NORM ||
           r == ARCH_ROLE_K_NORM || r == ARCH_ROLE_POST_ATTN_NORM || r == ARCH_ROLE_POST_FFN_NORM;
}

/* v (n) += shift, as float adds (what transformers' `1.0 + weight.float()` computes). */
static void shift_norm(float *v, int64_t n, float shift)
{
    if (shift != 0.0f && v)
        for (int64_t i = 0; i < n; i++) v[i] = v[i] + shift;
}

uint64_t wview_bytes(const struct wview *w)
{
    return dtype_row_size(w->type, w->cols) * (uint64_t)w->rows;
}

int model_init(struct model *m, const struct model_file *mf, char err[256])
{
    memset(m, 0, sizeof *m);
    m->hp = mf->hp;
    const struct llm_hparams *hp = &m->hp;
    if (hp->n_layers <= 0 || hp->dim <= 0 || hp->n_heads <= 0 || hp->n_kv_heads <= 0 || hp->head_dim <= 0 ||
        hp->n_heads % hp->n_kv_heads || hp->ffn_dim <= 0 || hp->n_vocab <= 0 || hp->rope_dim <= 0 ||
        hp->rope_dim > hp->head_dim || hp->rope_dim % 2) {
        snprintf(err, 256,
                 "inconsistent hyperparameters (layers %d dim %d heads %d/%d head_dim %d rope_dim %d)",
                 hp->n_layers, hp->dim, hp->n_heads, hp->n_kv_heads, hp->head_dim, hp->rope_dim);
        return FERRY_ERR_FORMAT;
    }
    const int64_t dim = hp->dim;
    int rc;
    char name[96];
    if ((rc = find_matrix(mf, "token_embd.weight", hp->n_vocab, dim, &m->tok_embd, err))) goto fail;
    if (model_file_tensor(mf, "output.weight")) {
        if ((rc = find_matrix(mf, "output.weight", hp->n_vocab, dim, &m->output, err))) goto fail;
    } else {
        m->output = m->tok_embd;
    }
    if ((rc = load_vector(mf, "output_norm.weight", dim, 0, &m->output_norm, err))) goto fail;
    m->layers = calloc((size_t)hp->n_layers, sizeof *m->layers);
    if (!m->layers) {
        rc = FERRY_ERR_NOMEM;
        goto fail;
    }
    m->weight_bytes = wview_bytes(&m->output);
    const struct arch_family *fam = arch_of(hp);
    if (!fam) {
        snprintf(err, 256, "architecture '%.31s' is not supported", hp->arch);
        rc = FERRY_ERR_UNSUPPORTED;
        goto fail;
    }
    /* HF Gemma stores norm weights minus 1 (its RMSNorm multiplies by 1 + w); GGUF files have it added. */
    const float norm_shift = mf->format == MODEL_FORMAT_HF ? fam->hf_norm_shift : 0.0f;
    for (int l = 0; l < hp->n_layers; l++) {
        struct model_layer *L = &m->layers[l];
        const struct llm_hparams hl = llm_hparams_at(hp, l); /* this layer's attention shape */
        for (int i = 0; i < fam->n_tensors; i++) {
            const struct arch_tensor *at = &fam->tensors[i];
            long long ne[3];
            snprintf(name, sizeof name, "blk.%d.%s", l, at->gguf);
            if (!arch_need_in_layer(at->need, hp, l)) continue;
            if (at->role == ARCH_ROLE_SSM_CONV) { /* (conv_dim, width) as one f32 vector */
                arch_role_shape(at->role, hp, ne);
                const struct wtensor *t = model_file_tensor(mf, name);
                if (!t || t->ne[0] != ne[0] || t->ne[1] != ne[1]) {
                    snprintf(err, 256, "tensor %s is missing or misshapen", name);
                    rc = FERRY_ERR_FORMAT;
                    goto fail;
                }
                if ((L->ssm_conv = malloc((size_t)(ne[0] * ne[1]) * sizeof(float))) == NULL) {
                    rc = FERRY_ERR_NOMEM;
                    goto fail;
                }
                if (!dtype_to_f32(t->type, t->data, L->ssm_conv, ne[0] * ne[1])) {
                    snprintf(err, 256, "tensor %s: cannot convert type %s to f32", name, dtype_name(t->type));
                    rc = FERRY_ERR_FORMAT;
                    goto fail;
                }
                continue;
            }
            if (at->role == ARCH_ROLE_WQKV || at->role == ARCH_ROLE_W_GATE_UP) {
                arch_role_shape(at->role, &hl, ne);
                struct wview whole;
                if ((rc = find_matrix(mf, name, ne[1], ne[0], &whole, err))) goto fail;
                m->weight_bytes += wview_bytes(&whole);
                split_rows(L, at->role, &whole, &hl);
                continue;
            }
            /* An optional attn_v that is absent: the values are the keys (Gemma 4's global layers). Other
             * optional tensors absent: checked below against what the layer needs. */
            if (at->need == ARCH_NEED_NEVER && !model_file_tensor(mf, name)) {
                if (at->role == ARCH_ROLE_WV) L->wv = L->wk;
                m->weight_bytes += at->role == ARCH_ROLE_WV ? wview_bytes(&L->wv) : 0;
                continue;
            }
            const int nd = arch_role_shape(at->role, &hl, ne);
            if (nd == 3) { /* stacked experts: checked by model_file_validate, viewed as one matrix */
                const struct wtensor *t = model_file_tensor(mf, name);
                if (!t || t->ne[0] != ne[0] || t->ne[1] != ne[1] || t->ne[2] != ne[2]) {
                    snprintf(err, 256, "expert tensor %s is missing or misshapen", name);
                    rc = FERRY_ERR_FORMAT;
                    goto fail;
                }
                struct wview *v = at->role == ARCH_ROLE_EXP_GATE ? &L->exp_gate
                                  : at->role == ARCH_ROLE_EXP_UP ? &L->exp_up
                                                                 : &L->exp_down;
                *v = (struct wview){.data = t->data, .type = t->type, .rows = ne[1] * ne[2], .cols = ne[0]};
                m->weight_bytes += wview_bytes(v);
                continue;
            }
            float **vec = layer_vector(L, at->role);
            if (nd == 2 && vec) { /* the experts' biases: one row per expert */
                if ((rc = load_f32(mf, name, ne[0], ne[1], at->need != ARCH_NEED_ALWAYS, vec, err)))
                    goto fail;
                continue;
            }
            if (nd == 2) {
                struct wview *v = layer_matrix(L, at->role);
                if ((rc = find_matrix(mf, name, ne[1], ne[0], v, err))) goto fail;
                m->weight_bytes += wview_bytes(v);
                continue;
            }
            float **v = layer_vector(L, at->role);
            const int optional = at->need == ARCH_NEED_IF_BIAS || at->need == ARCH_NEED_NEVER;
            if (v && (rc = load_vector(mf, name, ne[0], optional, v, err))) goto fail;
            if (v && *v && is_norm(at->role)) shift_norm(*v, ne[0], norm_shift);
        }
        /* An attention layer with K/V of its own has its keys (and their norm with QK-norm); per-layer inputs
         * need their three tensors. */
        const char *lacks = NULL;
        if (!llm_layer_kv_shared(hp, l) && !llm_layer_is_recurrent(hp, l) &&
            (!L->wk.data || (L->q_norm && !L->k_norm)))
            lacks = !L->wk.data ? "attn_k.weight" : "attn_k_norm.weight";
        else if (llm_layer_is_recurrent(hp, l) &&
                 (!L->ssm_qkv.data || (!L->ssm_z.data && L->ssm_qkv.rows == llm_ssm_conv_dim(hp))))
            lacks =
                !L->ssm_qkv.data ? "attn_qkv.weight" : "attn_gate.weight"; /* q|k|v and z, or both packed */
        else if (hp->ple_dim > 0 && (!L->ple_gate.data || !L->ple_proj.data || !L->ple_norm))
            lacks = !L->ple_gate.data   ? "inp_gate.weight"
                    : !L->ple_proj.data ? "proj.weight"
                                        : "post_norm.weight";
        if (lacks) {
            snprintf(err, 256, "missing tensor 'blk.%d.%s' (%s family)", l, lacks, fam->name);
            rc = FERRY_ERR_FORMAT;
            goto fail;
        }
    }
    if (hp->ple_dim > 0) {
        const int64_t pl = (int64_t)hp->n_layers * hp->ple_dim;
        if ((rc = find_matrix(mf, "per_layer_token_embd.weight", hp->n_vocab, pl, &m->ple_embd, err)) ||
            (rc = find_matrix(mf, "per_layer_model_proj.weight", pl, dim, &m->ple_mproj, err)) ||
            (rc = load_vector(mf, "per_layer_proj_norm.weight", hp->ple_dim, 0, &m->ple_proj_norm, err)))
            goto fail;
        m->weight_bytes += wview_bytes(&m->ple_mproj);
    }
    shift_norm(m->output_norm, dim, norm_shift);
    m->inv_freq = malloc((size_t)(hp->rope_dim / 2) * sizeof(float));
    if (!m->inv_freq) {
        rc = FERRY_ERR_NOMEM;
        goto fail;
    }
    kern_cpu_rope_freqs(m->inv_freq, hp->rope_dim, hp->rope_theta, &hp->rope_scaling);
    if (hp->sliding_window > 0) { /* the local layers' own base (and rotary dims), unscaled */
        const int rd = hp->rope_dim_swa > 0 ? hp->rope_dim_swa : hp->rope_dim;
        if (!(m->inv_freq_local = malloc((size_t)(rd / 2) * sizeof(float)))) {
            rc = FERRY_ERR_NOMEM;
            goto fail;
        }
        kern_cpu_rope_freqs(m->inv_freq_local, rd, hp->rope_theta_swa,
                            hp->swa_rope_scaled ? &hp->rope_scaling : NULL);
    }
    /* GGUF llama3 files bake the scaling into per-frequency divisors. */
    float *factors = NULL;
    if ((rc = load_vector(mf, "rope_freqs.weight", hp->rope_dim / 2, 1, &factors, err))) goto fail;
    if (factors) {
        for (int i = 0; i < hp->rope_dim / 2; i++) m->inv_freq[i] /= factors[i];
        free(factors);
    }
    return FERRY_OK;
fail:
    model_free(m);
    return rc;
}

/* ----------------------------------------------------------------------------------------------------------
 */
/* Quantization at load */

/* One tensor of the model under its GGUF name, for the mix (which decides by name, in llama.cpp's order). */
struct qtensor {
    char name[48];
    struct wview *view;
    enum dtype to;
};

static int cmp_qtensor(const void *a, const void *b)
{
    return quant_mix_order(((const struct qtensor *)a)->name, ((const struct qtensor *)b)->name);
}

static void run_on_pool(void *pool, quant_task_fn task, void *ctx, int n_tasks)
{
    tpool_run(pool, task, ctx, n_tasks);
}

int model_quantize(struct model *m, int ftype, int n_threads, char err[256])
{
    const struct llm_hparams *hp = &m->hp;
    if (hp->n_expert > 0 || hp->full_attn_interval > 0) {
        snprintf(err, 256, "quantization at load of %s layers is not supported; quantize the file instead",
                 hp->n_expert > 0 ? "expert" : "linear-attention");
        return FERRY_ERR_UNSUPPORTED;
    }
    const int tied = m->output.data == m->tok_embd.data;
    const int n_max = 2 + 7 * hp->n_layers;
    struct qtensor *qt = calloc((size_t)n_max, sizeof *qt);
    if (!qt) return FERRY_ERR_NOMEM;
    int n = 0;
    /* Tied: the one tensor is the head, and llama.cpp quantizes token_embd with the head's rule. */
    qt[n++] = (struct qtensor){.name = "token_embd.weight", .view = &m->tok_embd};
    if (!tied) qt[n++] = (struct qtensor){.name = "output.weight", .view = &m->output};
    static const char *const suffix[7] = {"attn_q",   "attn_k", "attn_v",  "attn_output",
                                          "ffn_gate", "ffn_up", "ffn_down"};
    for (int l = 0; l < hp->n_layers; l++) {
        struct model_layer *L = &m->layers[l];
        struct wview *v[7] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->w_gate, &L->w_up, &L->w_down};
        for (int i = 0; i < 7; i++) {
            snprintf(qt[n].name, sizeof qt[n].name, "blk.%d.%s.weight", l, suffix[i]);
            qt[n++].view = v[i];
        }
    }
    qsort(qt, (size_t)n, sizeof *qt, cmp_qtensor);
    /* llama.cpp's 70B class (llama-model.cpp), by the family's rule. */
    const struct arch_family *fam = arch_of(hp);
    const bool is_70b = fam && fam->is_70b && fam->is_70b(hp);
    struct quant_mix mix;
    if (!quant_mix_init(&mix, ftype, hp->n_layers, hp->n_layers, !tied, is_70b)) {
        free(qt);
        snprintf(err, 256, "unknown quantization file type %d", ftype);
        return FERRY_ERR_INVALID;
    }
    size_t total = 0;
    for (int i = 0; i < n; i++) {
        struct wview *w = qt[i].view;
        const int to = quant_mix_type(&mix, qt[i].name, 2, w->cols, w->type);
        qt[i].to = to < 0 || dtype_get_traits(w->type)->is_quantized ? w->type : (enum dtype)to;
        if (qt[i].to != w->type) total += dtype_row_size(qt[i].to, w->cols) * (size_t)w->rows;
    }
    char *buf = total ? malloc(total) : NULL;
    struct tpool *tp = NULL;
    if ((total && !buf) || (total && tpool_init(&tp, n_threads))) {
        free(buf);
        free(qt);
        snprintf(err, 256, "cannot allocate %.1f MiB for the quantized weights", total / 1048576.0);
        return FERRY_ERR_NOMEM;
    }
    const struct quant_runner runner = {run_on_pool, tp};
    size_t off = 0;
    for (int i = 0; i < n; i++) {
        struct wview *w = qt[i].view;
        if (qt[i].to == w->type) continue;
        const uint64_t src_bytes = dtype_row_size(w->type, w->cols) * (uint64_t)w->rows;
        const size_t dst_bytes = dtype_row_size(qt[i].to, w->cols) * (size_t)w->rows;
        quant_matrix(qt[i].to, buf + off, w->type, w->data, w->rows, w->cols, &runner, NULL);
        /* The embedding is gathered, not read whole per forward pass: only the head counts (when tied, it is
         * the head). */
        if (w != &m->tok_embd || tied) m->weight_bytes = m->weight_bytes - src_bytes + dst_bytes;
        *w = (struct wview){.data = buf + off, .type = qt[i].to, .rows = w->rows, .cols = w->cols};
        if (tied && w == &m->tok_embd) m->output = *w;
        off += dst_bytes;
    }
    tpool_free(tp);
    m->quant_owned = buf;
    free(qt);
    return FERRY_OK;
}

void model_fit_ctx(struct model *m, int ctx)
{
    struct llm_hparams *hp = &m->hp;
    const struct rope_scaling *sc = &hp->rope_scaling;
    if (sc->type == ROPE_SCALING_LONGROPE && sc->n_factors == hp->rope_dim / 2 && m->inv_freq) {
        const int lng = ctx > sc->orig_ctx;
        kern_cpu_rope_freqs_ext(m->inv_freq, hp->rope_dim, hp->rope_theta,
                                lng ? sc->long_factor : sc->short_factor);
        FLOG_INFO("longrope: %s factors for a context of %d (original %d)", lng ? "long" : "short", ctx,
                  sc->orig_ctx);
    }
    if (hp->attn_temp_beta != 0 && ctx <= hp->attn_temp_len) hp->attn_temp_beta = 0;
}

void model_free(struct model *m)
{
    if (!m) return;
    if (m->layers) {
        for (int l = 0; l < m->hp.n_layers; l++) {
            struct model_layer *L = &m->layers[l];
            free(L->attn_norm);
            free(L->ffn_norm);
            free(L->bq);
            free(L->bk);
            free(L->bv);
            free(L->q_norm);
            free(L->k_norm);
            free(L->post_attn_norm);
            free(L->ssm_conv);
            free(L->ssm_dt);
            free(L->ssm_a);
            free(L->ssm_norm);
            free(L->post_ffn_norm);
            free(L->bo);
            free(L->attn_sinks);
            free(L->router_b);
            free(L->exp_gate_b);
            free(L->exp_up_b);
            free(L->exp_down_b);
            free(L->out_scale);
            free(L->ple_norm);
            free(L->shexp_gate);
        }
    }
    free(m->layers);
    free(m->ple_proj_norm);
    free(m->output_norm);
    free(m->inv_freq);
    free(m->inv_freq_local);
    free(m->owned);
    free(m->quant_owned);
    memset(m, 0, sizeof *m);
}

/* ----------------------------------------------------------------------------------------------------------
 */
/* Synthetic models */

struct fill_job {
    void *base;
    size_t n_elems;
    enum dtype type;
    uint64_t seed;
    int n_tasks;
};

/* Values uniform in about [-0.05, 0.05): large enough to be far from zero, small enough that activations stay
 * finite through 80 layers of random weights. */
static void fill_task(void *ctx, int task)
{
    const struct fill_job *j = ctx;
    const struct dtype_traits *tr = dtype_get_traits(j->type);
    size_t per = (j->n_elems + (size_t)j->n_tasks - 1) / (size_t)j->n_tasks;
    size_t lo = per * (size_t)task, hi = lo + per < j->n_elems ? lo + per : j->n_elems;
    uint64_t x = j->seed ^ (0x9e3779b97f4a7c15ull * (uint64_t)(task + 1));
    float v[1024];
    for (size_t i = lo; i < hi; i += 1024) {
        const size_t n = hi - i < 1024 ? hi - i : 1024;
        for (size_t k = 0; k < n; k++) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            v[k] = ((float)(x >> 40) * 0x1.0p-24f - 0.5f) * 0.1f;
        }
        tr->from_f32(v, (char *)j->base + i * tr->type_size, (int64_t)n);
    }
}

static float *unit_vector(size_t n, float jitter_seed)
{
    float *v = malloc(n * sizeof *v);
    if (v)
        for (size_t i = 0; i < n; i++) v[i] = 1.0f + 0.01f * sinf((float)i + jitter_seed);
    return v;
}

int model_init_synthetic(struct model *m, const struct llm_hparams *hp, enum dtype wt, uint64_t seed,
                         int n_threads, char err[256])
{
    memset(m, 0, sizeof *m);
    if (!dtype_valid(wt) || dtype_get_traits(wt)->is_quantized) {
        snprintf(err, 256, "synthetic weights must be F32, F16 or BF16");
        return FERRY_ERR_INVALID;
    }
    m->hp = *hp;
    const struct arch_family *fam = arch_of(hp);
    if (!fam) {
        snprintf(err, 256, "architecture '%.31s' is not supported", hp->arch);
        return FERRY_ERR_UNSUPPORTED;
    }
    if (hp->n_expert > 0 || arch_tensor_of(fam, ARCH_ROLE_EXP_GATE)) {
        snprintf(err, 256, "synthetic models of expert layers (%s) are not supported", fam->name);
        return FERRY_ERR_UNSUPPORTED;
    }
    const int64_t dim = hp->dim, qd = (int64_t)hp->n_heads * hp->head_dim,
                  kvd = (int64_t)hp->n_kv_heads * hp->head_dim, ffn = hp->ffn_dim, V = hp->n_vocab;
    const size_t es = dtype_type_size(wt);
    const size_t per_layer = (size_t)(qd * dim + 2 * kvd * dim + dim * qd + 3 * ffn * dim);
    const size_t total = (size_t)V * dim * (hp->tied_embeddings ? 1 : 2) + per_layer * (size_t)hp->n_layers;
    m->owned = malloc(total * es);
    m->layers = calloc((size_t)hp->n_layers, sizeof *m->layers);
    m->output_norm = unit_vector((size_t)dim, 0.5f);
    m->inv_freq = malloc((size_t)(hp->rope_dim / 2) * sizeof(float));
    if (!m->owned || !m->layers || !m->output_norm || !m->inv_freq) {
        snprintf(err, 256, "cannot allocate %.1f GiB for synthetic weights", total * es / 1073741824.0);
        model_free(m);
        return FERRY_ERR_NOMEM;
    }
    struct tpool *tp = NULL;
    tpool_init(&tp, n_threads);
    struct fill_job job = {.base = m->owned,
                           .n_elems = total,
                           .type = wt,
                           .seed = seed ? seed : 1,
                           .n_tasks = 4 * tpool_size(tp)};
    tpool_run(tp, fill_task, &job, job.n_tasks);
    tpool_free(tp);
    char *cur = m->owned;
#define NEXT(view, r, c)                                                                                     \
    do {                                                                                                     \
        (view) = (struct wview){.data = cur, .type = wt, .rows = (r), .cols = (c)};                          \
        cur += (size_t)(r) * (size_t)(c)*es;                                                                 \
    } while (0)
    NEXT(m->tok_embd, V, dim);
    if (hp->tied_embeddings)
        m->output = m->tok_embd;
    else
        NEXT(m->output, V, dim);
    for (int l = 0; l < hp->n_layers; l++) {
        struct model_layer *L = &m->layers[l];
        NEXT(L->wq, qd, dim);
        NEXT(L->wk, kvd, dim);
        NEXT(L->wv, kvd, dim);
        NEXT(L->wo, dim, qd);
        NEXT(L->w_gate, ffn, dim);
        NEXT(L->w_up, ffn, dim);
        NEXT(L->w_down, dim, ffn);
        L->attn_norm = unit_vector((size_t)dim, (float)l);
        L->ffn_norm = unit_vector((size_t)dim, (float)l + 0.25f);
        if (!L->attn_norm || !L->ffn_norm) {
            model_free(m);
            return FERRY_ERR_NOMEM;
        }
        /* The other norms the family's layers have (QK-norm, sandwich norms), also near 1. */
        for (int i = 0; fam && i < fam->n_tensors; i++) {
            const enum arch_role r = fam->tensors[i].role;
            float **v = layer_vector(L, r);
            if (!v || *v || !is_norm(r)) continue;
            long long ne[3];
            arch_role_shape(r, hp, ne);
            if (!(*v = unit_vector((size_t)ne[0], (float)l + 0.5f + 0.125f * (float)i))) {
                model_free(m);
                return FERRY_ERR_NOMEM;
            }
        }
    }
#undef NEXT
    m->weight_bytes = (uint64_t)(per_layer * (size_t)hp->n_layers + (size_t)V * dim) * es;
    kern_cpu_rope_freqs(m->inv_freq, hp->rope_dim, hp->rope_theta, &hp->rope_scaling);
    if (hp->sliding_window > 0) {
        if (!(m->inv_freq_local = malloc((size_t)(hp->rope_dim / 2) * sizeof(float)))) {
            model_free(m);
            return FERRY_ERR_NOMEM;
        }
        kern_cpu_rope_freqs(m->inv_freq_local, hp->rope_dim, hp->rope_theta_swa,
                            hp->swa_rope_scaled ? &hp->rope_scaling : NULL);
    }
    return FERRY_OK;
}
