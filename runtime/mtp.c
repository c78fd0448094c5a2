/* mtp — the multi-token-prediction drafter (see mtp.h). The block's layer is a one-layer model
 * (runtime/model.h) read from a view of the file in which block N's tensors are block 0's and the nextn
 * head's tensors stand for the globals, run by a CPU backend (runtime/forward_cpu.h) over a KV cache of its
 * own: the family's full-attention layer program computes it, as it computes the trunk's.
 */
#include "runtime/mtp.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/core/status.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/ops.h"
#include "runtime/backend.h"
#include "runtime/engine.h"
#include "runtime/forward_cpu.h"
#include "runtime/kv_cache.h"
#include "runtime/model.h"
#include "weights/arch/arch.h"

#define MTP_MAX_DRAFT 32

struct mtp {
    struct model_file view; /* the block as a one-layer model's file: tensors owned, data borrowed */
    struct model mm;        /* that model: its layer 0, embedding, head and head norm */
    int have_mm;
    struct wview eh_proj; /* (dim, 2 dim) */
    float *enorm, *hnorm; /* (dim) f32 */
    struct kv_cache kv;   /* one layer */
    struct backend *be;   /* the CPU backend over mm and kv */
    int n_seqs, ctx, dim, n_vocab, max_tokens;
    float *h;                /* (n_seqs, dim) each slot's hidden state at its length - 1 */
    int *h_at;               /* (n_seqs) the position h holds, -1: none (zeros serve at position 0) */
    float *cat;              /* (max_tokens, 2 dim) [normed embedding ; normed hidden] */
    float *tmp;              /* (max_tokens, dim) */
    float *hin;              /* (max_tokens, dim) a step's hidden inputs */
    float *o;                /* (dim) a draft's hidden state */
    float *row;              /* (n_vocab) a draft's logits */
    int32_t *tok, *pos, *sq; /* (max_tokens) a step's batch */
    uint8_t *want;           /* (max_tokens) */
};

struct mtp_params mtp_default_params(void)
{
    return (struct mtp_params){.n_seqs = 1, .ctx_size = 4096, .max_tokens = 64, .kv_type = KV_F16};
}

int mtp_available(const struct model_file *mf)
{
    const struct arch_family *f = arch_of(&mf->hp);
    return f && f->nextn && mf->hp.n_layer_nextn >= 1 && mf->format == MODEL_FORMAT_GGUF;
}

/* ---------------------------------------------------------------- the block's file */

static int starts(const char *s, const char *prefix)
{
    return strncmp(s, prefix, strlen(prefix)) == 0;
}

/* A tensor of ne {n0, n1} (n1 1: a vector) named `name` in the file, or NULL when absent and optional. */
static int nextn_tensor(const struct model_file *mf, const char *name, int64_t n0, int64_t n1, int optional,
                        const struct wtensor **out, char *err)
{
    *out = model_file_tensor(mf, name);
    if (!*out) return optional ? FERRY_OK : ferry_fail(err, FERRY_ERR_FORMAT, "missing tensor %s", name);
    const struct wtensor *t = *out;
    if (t->ne[0] != n0 || t->ne[1] != n1 || t->ne[2] * t->ne[3] != 1)
        return ferry_fail(err, FERRY_ERR_FORMAT, "tensor %s has shape [%lld, %lld], expected [%lld, %lld]",
                          name, (long long)t->ne[0], (long long)t->ne[1], (long long)n0, (long long)n1);
    return FERRY_OK;
}

/* The view: the globals, block N's tensors as block 0's, and the nextn head's in place of the globals. */
static int view_build(struct mtp *m, const struct model_file *mf, const struct arch_nextn *nx, char *err)
{
    const struct llm_hparams *hp = &mf->hp;
    const int64_t dim = hp->dim, nv = hp->n_vocab;
    char blk[32], name[96];
    snprintf(blk, sizeof blk, "blk.%d.", hp->n_layers);
    const struct wtensor *embed, *head, *head_norm, *t;
    int rc;
#define NX(field) (snprintf(name, sizeof name, "%s%s", blk, nx->field), name)
    if ((rc = nextn_tensor(mf, NX(embed), dim, nv, 1, &embed, err)) ||
        (rc = nextn_tensor(mf, NX(head), dim, nv, 1, &head, err)) ||
        (rc = nextn_tensor(mf, NX(head_norm), dim, 1, 1, &head_norm, err)))
        return rc;
#undef NX
    m->view = *mf;
    m->view.gguf = NULL;
    m->view.priv = NULL;
    m->view.arch_owned = NULL;
    m->view.dir = NULL;
    m->view.chat_template = NULL;
    m->view.tensors = calloc((size_t)mf->n_tensors + 3, sizeof *m->view.tensors);
    if (!m->view.tensors) return FERRY_ERR_NOMEM;
    int n = 0;
    for (int i = 0; i < mf->n_tensors; i++) {
        t = &mf->tensors[i];
        if (starts(t->name, blk)) {
            if (starts(t->name + strlen(blk), "nextn.")) continue;
            m->view.tensors[n] = *t;
            snprintf(m->view.tensors[n++].name, sizeof t->name, "blk.0.%s", t->name + strlen(blk));
        } else if (!starts(t->name, "blk.")) {
            m->view.tensors[n++] = *t;
        }
    }
    /* The head's own tensors replace the globals (or add output.weight to a file whose head is tied). */
    const struct wtensor *over[3] = {embed, head, head_norm};
    static const char *const global[3] = {"token_embd.weight", "output.weight", "output_norm.weight"};
    for (int j = 0; j < 3; j++) {
        if (!over[j]) continue;
        int at = n;
        for (int i = 0; i < n; i++)
            if (!strcmp(m->view.tensors[i].name, global[j])) at = i;
        m->view.tensors[at] = *over[j];
        snprintf(m->view.tensors[at].name, sizeof m->view.tensors[at].name, "%s", global[j]);
        n += at == n;
    }
    m->view.n_tensors = n;
    /* One layer, full attention. */
    m->view.hp.n_layers = 1;
    m->view.hp.full_attn_interval = 0;
    m->view.hp.n_layer_nextn = 0;
    return FERRY_OK;
}

/* An error about the view's block 0 names block N as the file does. */
static void err_rename(char *err, int block)
{
    char *at = strstr(err, "blk.0.");
    if (!at) return;
    char tail[256];
    snprintf(tail, sizeof tail, "%s", at + 6);
    snprintf(at, (size_t)(256 - (at - err)), "blk.%d.%s", block, tail);
}

/* ---------------------------------------------------------------- init */

int mtp_init(struct mtp **out, const struct model_file *mf, const struct mtp_params *p, char err[256])
{
    *out = NULL;
    const struct arch_family *fam = arch_of(&mf->hp);
    if (!mtp_available(mf))
        return ferry_fail(err, FERRY_ERR_UNSUPPORTED,
                          "the model has no multi-token-prediction block ferry can run (%s)",
                          fam && fam->nextn ? "no nextn_predict_layers" : "its family has none");
    if (mf->hp.n_layer_nextn != 1)
        return ferry_fail(err, FERRY_ERR_UNSUPPORTED,
                          "the model has %d multi-token-prediction blocks; only one is supported",
                          mf->hp.n_layer_nextn);
    if (p->n_seqs < 1 || p->ctx_size < 1 || p->max_tokens < 1)
        return ferry_fail(err, FERRY_ERR_INVALID, "multi-token prediction: bad slots, context or batch");
    struct mtp *m = calloc(1, sizeof *m);
    if (!m) return FERRY_ERR_NOMEM;
    const struct llm_hparams *hp = &mf->hp;
    const int block = hp->n_layers;
    m->n_seqs = p->n_seqs, m->ctx = p->ctx_size, m->dim = hp->dim, m->n_vocab = hp->n_vocab;
    m->max_tokens = p->max_tokens;
    int rc = view_build(m, mf, fam->nextn, err);
    if (rc) goto fail;
    const struct wtensor *eh, *en, *hn;
    char name[96];
    snprintf(name, sizeof name, "blk.%d.%s", block, fam->nextn->eh_proj);
    if ((rc = nextn_tensor(mf, name, 2 * (int64_t)hp->dim, hp->dim, 0, &eh, err))) goto fail;
    snprintf(name, sizeof name, "blk.%d.%s", block, fam->nextn->enorm);
    if ((rc = nextn_tensor(mf, name, hp->dim, 1, 0, &en, err))) goto fail;
    snprintf(name, sizeof name, "blk.%d.%s", block, fam->nextn->hnorm);
    if ((rc = nextn_tensor(mf, name, hp->dim, 1, 0, &hn, err))) goto fail;
    m->eh_proj = (struct wview){.data = eh->data, .type = eh->type, .rows = hp->dim, .cols = 2 * hp->dim};
    m->enorm = malloc((size_t)hp->dim * sizeof(float));
    m->hnorm = malloc((size_t)hp->dim * sizeof(float));
    if (!m->enorm || !m->hnorm) {
        rc = FERRY_ERR_NOMEM;
        goto fail;
    }
    if (!dtype_to_f32(en->type, en->data, m->enorm, hp->dim) ||
        !dtype_to_f32(hn->type, hn->data, m->hnorm, hp->dim)) {
        rc = ferry_fail(err, FERRY_ERR_FORMAT, "tensor blk.%d.%s or %s: cannot convert its type to f32",
                        block, fam->nextn->enorm, fam->nextn->hnorm);
        goto fail;
    }
    if ((rc = model_init(&m->mm, &m->view, err))) {
        err_rename(err, block);
        goto fail;
    }
    m->have_mm = 1;
    model_fit_ctx(&m->mm, p->ctx_size);
    const struct llm_hparams *mh = &m->mm.hp;
    if ((rc = kv_cache_init(&m->kv, 1, mh->n_kv_heads, mh->head_dim, p->n_seqs, p->ctx_size,
                            p->n_seqs * p->ctx_size, ENGINE_KV_BLOCK, p->kv_type))) {
        snprintf(err, 256, "multi-token prediction: cannot make its KV cache");
        goto fail;
    }
    struct forward_cpu_params fp = forward_cpu_default_params();
    fp.max_tokens = p->max_tokens;
    fp.n_threads = p->n_threads;
    fp.kv = &m->kv;
    if ((rc = forward_cpu_init(&m->be, &m->mm, &fp))) {
        snprintf(err, 256, "multi-token prediction: the CPU backend refused the block (%s)",
                 ferry_status_str(rc));
        goto fail;
    }
    const size_t mt = (size_t)p->max_tokens, d = (size_t)hp->dim;
    m->h = calloc((size_t)p->n_seqs * d, sizeof *m->h);
    m->h_at = malloc((size_t)p->n_seqs * sizeof *m->h_at);
    m->cat = malloc(mt * 2 * d * sizeof *m->cat);
    m->tmp = malloc(mt * d * sizeof *m->tmp);
    m->hin = malloc(mt * d * sizeof *m->hin);
    m->o = malloc(d * sizeof *m->o);
    m->row = malloc((size_t)hp->n_vocab * sizeof *m->row);
    m->tok = malloc(mt * 3 * sizeof *m->tok);
    m->want = calloc(mt, 1);
    if (!m->h || !m->h_at || !m->cat || !m->tmp || !m->hin || !m->o || !m->row || !m->tok || !m->want) {
        rc = FERRY_ERR_NOMEM;
        goto fail;
    }
    m->pos = m->tok + mt, m->sq = m->tok + 2 * mt;
    for (int s = 0; s < p->n_seqs; s++) m->h_at[s] = -1;
    *out = m;
    return FERRY_OK;
fail:
    mtp_free(m);
    return rc;
}

void mtp_free(struct mtp *m)
{
    if (!m) return;
    if (m->be) m->be->ops->free(m->be);
    kv_cache_free(&m->kv);
    if (m->have_mm) model_free(&m->mm);
    free(m->view.tensors);
    free(m->enorm);
    free(m->hnorm);
    free(m->h);
    free(m->h_at);
    free(m->cat);
    free(m->tmp);
    free(m->hin);
    free(m->o);
    free(m->row);
    free(m->tok);
    free(m->want);
    free(m);
}

/* ---------------------------------------------------------------- slots */

int mtp_seq_len(const struct mtp *m, int seq)
{
    return seq >= 0 && seq < m->n_seqs ? m->kv.seq_len[seq] : 0;
}

void mtp_seq_free(struct mtp *m, int seq)
{
    if (seq < 0 || seq >= m->n_seqs) return;
    kv_cache_seq_free(&m->kv, seq);
    m->h_at[seq] = -1;
}

void mtp_seq_keep(struct mtp *m, int seq, int n)
{
    if (seq < 0 || seq >= m->n_seqs) return;
    /* Only the length the hidden state continues from can be continued; anything else starts again. */
    if (n <= 0 || n > m->kv.seq_len[seq] || m->h_at[seq] != n - 1) {
        mtp_seq_free(m, seq);
        return;
    }
    m->kv.seq_len[seq] = n;
    kv_cache_trim(&m->kv, seq, n);
}

int mtp_seq_resume(struct mtp *m, int seq, int n)
{
    if (seq < 0 || seq >= m->n_seqs) return 0;
    if (n <= 0 || n > m->kv.seq_len[seq]) {
        mtp_seq_free(m, seq);
        return 0;
    }
    if (m->h_at[seq] != n - 1) memset(m->h + (size_t)seq * m->dim, 0, (size_t)m->dim * sizeof(float));
    m->h_at[seq] = n - 1;
    m->kv.seq_len[seq] = n;
    kv_cache_trim(&m->kv, seq, n);
    return n;
}

/* ---------------------------------------------------------------- the block */

/* Rows tokens (n) of slot seq at pos.. with hidden inputs h (n, dim): the block's layer, its K/V stored; with
 * `last`, the last row's head state into m->o and its logits into m->row. */
static int block_run(struct mtp *m, int seq, int pos, const int32_t *tokens, int n, const float *h, int last)
{
    const int dim = m->dim;
    const float eps = m->mm.hp.norm_eps;
    for (int i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= m->n_vocab) return FERRY_ERR_INVALID;
    if (pos + n > m->ctx) return FERRY_ERR_RANGE;
    int rc = kv_cache_reserve(&m->kv, seq, pos + n);
    if (rc) return rc;
    /* y = eh_proj · [rmsnorm(embed) · enorm ; rmsnorm(h) · hnorm] */
    const struct wview *te = &m->mm.tok_embd;
    if ((rc = kern_cpu_embed(m->tmp, te->data, te->type, (int)te->rows, dim, tokens, n))) return rc;
    kern_cpu_rmsnorm(m->tmp, m->tmp, m->enorm, n, dim, eps);
    for (int i = 0; i < n; i++)
        memcpy(m->cat + (size_t)i * 2 * dim, m->tmp + (size_t)i * dim, dim * sizeof(float));
    kern_cpu_rmsnorm(m->tmp, h, m->hnorm, n, dim, eps);
    for (int i = 0; i < n; i++)
        memcpy(m->cat + (size_t)i * 2 * dim + dim, m->tmp + (size_t)i * dim, dim * sizeof(float));
    float *x = m->be->ops->x_host(m->be);
    if ((rc = kern_cpu_matmul(x, m->cat, m->eh_proj.data, m->eh_proj.type, NULL, n, dim, 2 * dim, NULL)) ||
        (rc = m->be->ops->x_in(m->be, x, n)))
        return rc;
    for (int i = 0; i < n; i++) {
        m->tok[i] = tokens[i], m->pos[i] = pos + i, m->sq[i] = seq;
        m->want[i] = last && i == n - 1;
    }
    struct batch b = {.n_tokens = n, .tokens = m->tok, .pos = m->pos, .seq = m->sq, .want_logits = m->want};
    static const enum placement where[1] = {PLACEMENT_CPU};
    const struct step st = {.b = &b, .where = where, .max_len = pos + n, .n_out = last ? 1 : 0};
    if ((rc = m->be->ops->begin(m->be, &st)) || (rc = m->be->ops->layer(m->be, 0, &st))) goto out;
    if (last) {
        b.hidden = 1; /* the head's normed state, the next draft's h */
        if ((rc = m->be->ops->head(m->be, &st, m->o))) goto out;
        b.hidden = 0;
        rc = m->be->ops->head(m->be, &st, m->row);
    }
out:
    m->kv.seq_len[seq] = rc ? pos : pos + n;
    return rc;
}

int mtp_seq_feed(struct mtp *m, int seq, int pos, const int32_t *tokens, int n, const float *hidden)
{
    if (seq < 0 || seq >= m->n_seqs || n < 1 || pos != m->kv.seq_len[seq] ||
        (pos > 0 && m->h_at[seq] != pos - 1))
        return FERRY_ERR_INVALID;
    const int dim = m->dim;
    for (int a = 0; a < n; a += m->max_tokens) {
        const int c = n - a < m->max_tokens ? n - a : m->max_tokens;
        /* Row i pairs token i with the hidden state of the row before it: the slot's for the first. */
        float *rows = m->hin;
        if (pos + a == 0)
            memset(rows, 0, dim * sizeof(float));
        else
            memcpy(rows, a == 0 ? m->h + (size_t)seq * dim : hidden + (size_t)(a - 1) * dim,
                   dim * sizeof(float));
        memcpy(rows + dim, hidden + (size_t)a * dim, (size_t)(c - 1) * dim * sizeof(float));
        const int rc = block_run(m, seq, pos + a, tokens + a, c, rows, 0);
        if (rc) {
            mtp_seq_free(m, seq);
            return rc;
        }
    }
    memcpy(m->h + (size_t)seq * dim, hidden + (size_t)(n - 1) * dim, dim * sizeof(float));
    m->h_at[seq] = pos + n - 1;
    return FERRY_OK;
}

/* The probability softmax gives the row's largest logit. */
static float top_prob(const float *row, int n, int top)
{
    double sum = 0;
    for (int i = 0; i < n; i++) sum += exp((double)row[i] - row[top]);
    return (float)(1.0 / sum);
}

int mtp_draft(struct mtp *m, int seq, int32_t token, int k, float p_min, int32_t *out, int *n_out,
              float *logits)
{
    *n_out = 0;
    if (seq < 0 || seq >= m->n_seqs || k < 0 || k > MTP_MAX_DRAFT) return FERRY_ERR_INVALID;
    const int pos = m->kv.seq_len[seq], dim = m->dim;
    if (pos > 0 && m->h_at[seq] != pos - 1) return FERRY_ERR_INVALID;
    if (pos == 0) memset(m->h + (size_t)seq * dim, 0, dim * sizeof(float));
    memcpy(m->o, m->h + (size_t)seq * dim, dim * sizeof(float));
    int32_t t = token;
    for (int i = 0; i < k && pos + i < m->ctx; i++) {
        memcpy(m->hin, m->o, dim * sizeof(float));
        const int rc = block_run(m, seq, pos + i, &t, 1, m->hin, 1);
        if (rc) return rc;
        int best = 0;
        for (int v = 1; v < m->n_vocab; v++)
            if (m->row[v] > m->row[best]) best = v; /* ties: the lowest id; NaN never wins */
        if (logits) memcpy(logits + (size_t)i * m->n_vocab, m->row, (size_t)m->n_vocab * sizeof(float));
        if (p_min > 0 && top_prob(m->row, m->n_vocab, best) < p_min) break;
        out[(*n_out)++] = t = best;
    }
    return FERRY_OK;
}
