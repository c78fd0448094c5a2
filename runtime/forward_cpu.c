/* forward_cpu — one forward pass of a Llama-family model on the CPU (see forward_cpu.h).
 *
 * Per layer: x += Wo·attn(rope(Wq·n(x)), rope(Wk·n(x)), Wv·n(x)); x += Wd·(silu(Wg·n(x)) * Wu·n(x)),
 * with n = RMSNorm. Then the rows that want logits are gathered, normed and multiplied by the output head.
 */
#include "runtime/forward_cpu.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/core/status.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/threadpool.h"

struct forward_cpu {
    struct tpool *tp;
    int max_tokens;
    float *x;   /* (max_tokens, dim) residual stream */
    float *xn;  /* (max_tokens, dim) normed input of a block */
    float *q;   /* (max_tokens, n_heads*head_dim) */
    float *k;   /* (max_tokens, n_kv*head_dim) */
    float *v;   /* (max_tokens, n_kv*head_dim) */
    float *att; /* (max_tokens, n_heads*head_dim) */
    float *tmp; /* (max_tokens, dim) */
    float *g;   /* (max_tokens, ffn) */
    float *u;   /* (max_tokens, ffn) */
};

void forward_cpu_free(struct forward_cpu *f)
{
    if (!f) return;
    tpool_free(f->tp);
    free(f->x);
    free(f->xn);
    free(f->q);
    free(f->k);
    free(f->v);
    free(f->att);
    free(f->tmp);
    free(f->g);
    free(f->u);
    free(f);
}

int forward_cpu_init(struct forward_cpu **out, const struct model *m, int max_tokens, int n_threads)
{
    *out = NULL;
    if (max_tokens <= 0) return FERRY_ERR_INVALID;
    struct forward_cpu *f = calloc(1, sizeof *f);
    if (!f) return FERRY_ERR_NOMEM;
    const struct llm_hparams *hp = &m->hp;
    size_t n = (size_t)max_tokens, qd = (size_t)hp->n_heads * hp->head_dim,
           kvd = (size_t)hp->n_kv_heads * hp->head_dim;
    f->max_tokens = max_tokens;
    f->x = malloc(n * hp->dim * sizeof(float));
    f->xn = malloc(n * hp->dim * sizeof(float));
    f->tmp = malloc(n * hp->dim * sizeof(float));
    f->q = malloc(n * qd * sizeof(float));
    f->att = malloc(n * qd * sizeof(float));
    f->k = malloc(n * kvd * sizeof(float));
    f->v = malloc(n * kvd * sizeof(float));
    f->g = malloc(n * hp->ffn_dim * sizeof(float));
    f->u = malloc(n * hp->ffn_dim * sizeof(float));
    int rc = FERRY_ERR_NOMEM;
    if (!f->x || !f->xn || !f->tmp || !f->q || !f->att || !f->k || !f->v || !f->g || !f->u) goto fail;
    if ((rc = tpool_init(&f->tp, n_threads))) goto fail;
    *out = f;
    return FERRY_OK;
fail:
    forward_cpu_free(f);
    return rc;
}

int forward_cpu_threads(const struct forward_cpu *f) { return tpool_size(f->tp); }

static int linear(struct forward_cpu *f, float *y, const float *x, const struct wview *w, const float *bias,
                  int m)
{
    return kern_cpu_matmul(y, x, w->data, w->type, bias, m, (int)w->rows, (int)w->cols, f->tp);
}

int forward_cpu_run(struct forward_cpu *f, const struct model *m, struct kv_cache *kv, const struct batch *b,
                    float *logits)
{
    const struct llm_hparams *hp = &m->hp;
    const int n = b->n_tokens, dim = hp->dim, hd = hp->head_dim;
    const int ffn = hp->ffn_dim;
    const float scale = 1.0f / sqrtf((float)hd);
    if (n <= 0 || n > f->max_tokens) return FERRY_ERR_INVALID;
    int rc = kern_cpu_embed(f->x, m->tok_embd.data, m->tok_embd.type, (int)m->tok_embd.rows, dim, b->tokens, n);
    if (rc) return rc;

    for (int l = 0; l < hp->n_layers; l++) {
        const struct model_layer *L = &m->layers[l];
        struct kv_layer_view view = kv_cache_layer(kv, l);

        kern_cpu_rmsnorm(f->xn, f->x, L->attn_norm, n, dim, hp->norm_eps);
        const struct kern_cpu_mm qkv[3] = {
            {f->q, L->wq.data, L->wq.type, L->bq, (int)L->wq.rows},
            {f->k, L->wk.data, L->wk.type, L->bk, (int)L->wk.rows},
            {f->v, L->wv.data, L->wv.type, L->bv, (int)L->wv.rows},
        };
        if ((rc = kern_cpu_matmul_multi(qkv, 3, f->xn, n, dim, f->tp))) return rc;
        kern_cpu_rope(f->q, b->pos, n, hp->n_heads, hd, hp->rope_dim, m->inv_freq, hp->rope_style);
        kern_cpu_rope(f->k, b->pos, n, hp->n_kv_heads, hd, hp->rope_dim, m->inv_freq, hp->rope_style);
        kern_cpu_kv_store(&view, f->k, f->v, b->seq, b->pos, n);
        if ((rc = kern_cpu_attention(f->att, f->q, &view, b->seq, b->pos, n, hp->n_heads, scale, f->tp))) return rc;
        if ((rc = linear(f, f->tmp, f->att, &L->wo, NULL, n))) return rc;
        kern_cpu_add(f->x, f->tmp, (int64_t)n * dim);

        kern_cpu_rmsnorm(f->xn, f->x, L->ffn_norm, n, dim, hp->norm_eps);
        const struct kern_cpu_mm gate_up[2] = {
            {f->g, L->w_gate.data, L->w_gate.type, NULL, (int)L->w_gate.rows},
            {f->u, L->w_up.data, L->w_up.type, NULL, (int)L->w_up.rows},
        };
        if ((rc = kern_cpu_matmul_multi(gate_up, 2, f->xn, n, dim, f->tp))) return rc;
        kern_cpu_silu_mul(f->g, f->u, (int64_t)n * ffn);
        if ((rc = linear(f, f->tmp, f->g, &L->w_down, NULL, n))) return rc;
        kern_cpu_add(f->x, f->tmp, (int64_t)n * dim);
    }

    /* Gather the rows that want logits, then norm and project only those. */
    int n_out = 0;
    for (int i = 0; i < n; i++)
        if (b->want_logits[i]) memmove(f->xn + (size_t)n_out++ * dim, f->x + (size_t)i * dim, dim * sizeof(float));
    if (n_out == 0) return FERRY_OK;
    kern_cpu_rmsnorm(f->xn, f->xn, m->output_norm, n_out, dim, hp->norm_eps);
    return linear(f, logits, f->xn, &m->output, NULL, n_out);
}
