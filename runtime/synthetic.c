/* synthetic — models of real shapes with random weights (see synthetic.h). */
#include "runtime/synthetic.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/core/status.h"
#include "kernels/cpu/threadpool.h"
#include "quant/mix.h"
#include "weights/arch/arch.h"

struct synthetic_shape {
    const char *name;
    int dim, ffn, layers, heads, kv_heads, vocab;
    float theta;
    const char *arch; /* the family (weights/arch/), by its GGUF name */
    int head_dim;     /* 0: dim / heads */
    int window;       /* dense: sliding window of the local layers (every layer but each 6th) (Gemma 3);
                       * gpt-oss: of every other layer, from the first */
    int n_expert, n_expert_used, expert_ffn;
    int ftype;  /* the mix of an expert shape; -1 for dense shapes */
    int test;   /* 1: a tiny shape for tests, not listed */
    float eps;  /* 0: 1e-5 */
    int ctx;    /* 0: 8192 */
    float yarn; /* gpt-oss: YaRN factor over yarn_orig positions */
    int yarn_orig;
};

/* Dense shapes (Gemma 3 12B: local layers with base 1e4, global ones 1e6 with linear scaling 8, embeddings x
 * sqrt(dim)), then the expert ones as their config.json files give them (Qwen/Qwen3-30B-A3B,
 * openai/gpt-oss-20b and -120b) and the tiny test shapes of tests/golden/models' qwen3moe_top2_f32 and
 * gptoss_yarn_mxfp4. */
#define DENSE(nm, d, f, l, h, kv, v, th, ar, hd, w)                                                          \
    {                                                                                                        \
        .name = nm, .dim = d, .ffn = f, .layers = l, .heads = h, .kv_heads = kv, .vocab = v, .theta = th,    \
        .arch = ar, .head_dim = hd, .window = w, .ftype = -1                                                 \
    }
#define QWEN3MOE(nm, d, f, l, h, kv, v, hd, ne, nu, ef, ft, tst, c)                                          \
    {                                                                                                        \
        .name = nm, .dim = d, .ffn = f, .layers = l, .heads = h, .kv_heads = kv, .vocab = v, .theta = 1e6f,  \
        .arch = "qwen3moe", .head_dim = hd, .n_expert = ne, .n_expert_used = nu, .expert_ffn = ef,           \
        .ftype = ft, .test = tst, .eps = 1e-6f, .ctx = c                                                     \
    }
#define GPTOSS(nm, d, f, l, h, kv, v, hd, w, ne, nu, tst, c, yf, yo)                                         \
    {                                                                                                        \
        .name = nm, .dim = d, .ffn = f, .layers = l, .heads = h, .kv_heads = kv, .vocab = v,                 \
        .theta = 150000.0f, .arch = "gpt-oss", .head_dim = hd, .window = w, .n_expert = ne,                  \
        .n_expert_used = nu, .expert_ffn = f, .ftype = QUANT_FTYPE_MXFP4_MOE, .test = tst, .eps = 1e-5f,     \
        .ctx = c, .yarn = yf, .yarn_orig = yo                                                                \
    }
static const struct synthetic_shape shapes[] = {
    DENSE("llama-2-7b", 4096, 11008, 32, 32, 32, 32000, 10000.0f, "llama", 0, 0),
    DENSE("llama-3-8b", 4096, 14336, 32, 32, 8, 128256, 500000.0f, "llama", 0, 0),
    DENSE("llama-2-13b", 5120, 13824, 40, 40, 40, 32000, 10000.0f, "llama", 0, 0),
    DENSE("llama-2-70b", 8192, 28672, 80, 64, 8, 32000, 10000.0f, "llama", 0, 0),
    DENSE("qwen3-8b", 4096, 12288, 36, 32, 8, 151936, 1000000.0f, "qwen3", 128, 0),
    DENSE("gemma-3-12b", 3840, 15360, 48, 16, 8, 262208, 1000000.0f, "gemma3", 256, 1024),
    DENSE("phi-4", 5120, 17920, 40, 40, 10, 100352, 250000.0f, "phi3", 128, 0),
    QWEN3MOE("qwen3-30b-a3b", 2048, 6144, 48, 32, 4, 151936, 128, 128, 8, 768, QUANT_FTYPE_Q4_K_M, 0, 40960),
    GPTOSS("gpt-oss-20b", 2880, 2880, 24, 64, 8, 201088, 64, 128, 32, 4, 0, 131072, 32.0f, 4096),
    GPTOSS("gpt-oss-120b", 2880, 2880, 36, 64, 8, 201088, 64, 128, 128, 4, 0, 131072, 32.0f, 4096),
    QWEN3MOE("test-qwen3moe", 44, 70, 3, 4, 2, 251, 16, 8, 2, 30, QUANT_FTYPE_Q8_0, 1, 1024),
    GPTOSS("test-gpt-oss", 64, 32, 2, 4, 2, 211, 16, 16, 5, 2, 1, 1024, 4.0f, 256),
};
#undef DENSE
#undef QWEN3MOE
#undef GPTOSS
#define N_SHAPES (int)(sizeof shapes / sizeof shapes[0])

const struct synthetic_shape *synthetic_shape_find(const char *name)
{
    for (int i = 0; name && i < N_SHAPES; i++)
        if (!strcmp(shapes[i].name, name)) return &shapes[i];
    return NULL;
}

const char *synthetic_shape_names(void)
{
    static char names[512]; /* rebuilt on each call: for the command line's main thread */
    size_t at = 0;
    for (int i = 0; i < N_SHAPES; i++)
        if (!shapes[i].test && at < sizeof names)
            at += (size_t)snprintf(names + at, sizeof names - at, "%s%s", at ? ", " : "", shapes[i].name);
    return names;
}

void synthetic_hparams(const struct synthetic_shape *s, struct llm_hparams *hp, int *ftype)
{
    const int hd = s->head_dim ? s->head_dim : s->dim / s->heads;
    *hp = (struct llm_hparams){.n_vocab = s->vocab,
                               .dim = s->dim,
                               .n_layers = s->layers,
                               .n_heads = s->heads,
                               .n_kv_heads = s->kv_heads,
                               .head_dim = hd,
                               .ffn_dim = s->ffn,
                               .ctx_train = s->ctx ? s->ctx : 8192,
                               .norm_eps = s->eps > 0 ? s->eps : 1e-5f,
                               .rope_theta = s->theta,
                               .rope_dim = hd,
                               .rope_style = ROPE_STYLE_HALF,
                               .n_expert = s->n_expert,
                               .n_expert_used = s->n_expert_used,
                               .expert_ffn_dim = s->expert_ffn,
                               .expert_norm_topk = s->n_expert > 0};
    snprintf(hp->arch, sizeof hp->arch, "%s", s->arch);
    *ftype = s->ftype;
    if (!strcmp(s->arch, "gemma3")) {
        hp->sliding_window = s->window;
        hp->swa_pattern = 6;
        hp->rope_theta_swa = 10000.0f;
        hp->embed_scale = sqrtf((float)s->dim);
        hp->rope_scaling = (struct rope_scaling){.type = ROPE_SCALING_LINEAR, .factor = 8.0f};
        hp->tied_embeddings = 1; /* as Gemma 3 checkpoints are */
    }
    if (!strcmp(s->arch, "gpt-oss")) { /* as weights/arch/gptoss.c reads a GGUF of it */
        hp->swiglu_alpha = 1.702f;
        hp->swiglu_limit = 7.0f;
        hp->qkv_bias = 1;
        hp->sliding_window = s->window;
        hp->swa_pattern = 2;
        hp->swa_rope_scaled = 1;
        hp->rope_theta_swa = s->theta;
        hp->rope_scaling = (struct rope_scaling){.type = ROPE_SCALING_YARN,
                                                 .factor = s->yarn,
                                                 .orig_ctx = s->yarn_orig,
                                                 .beta_fast = 32.0f,
                                                 .beta_slow = 1.0f};
    }
}

/* ----------------------------------------------------------------------------------------------------------
 */
/* The tensor table of a model, named, shaped and typed as a GGUF of the mix has them */

static int cmp_tensor(const void *a, const void *b)
{
    return quant_mix_order(((const struct wtensor *)a)->name, ((const struct wtensor *)b)->name);
}

static void put(struct wtensor *t, int *n, const char *name, int nd, const long long ne[3], enum dtype type)
{
    struct wtensor *w = &t[(*n)++];
    memset(w, 0, sizeof *w);
    snprintf(w->name, sizeof w->name, "%s", name);
    w->type = type;
    w->n_dims = nd;
    for (int i = 0; i < 4; i++) w->ne[i] = i < nd && i < 3 ? ne[i] : 1;
}

static int synthetic_table(const struct llm_hparams *hp, enum dtype wt, int ftype, struct wtensor **out,
                           int *n_out, char err[256])
{
    const struct arch_family *fam = arch_of(hp);
    if (!fam) {
        snprintf(err, 256, "architecture '%.31s' is not supported", hp->arch);
        return FERRY_ERR_UNSUPPORTED;
    }
    const int cap = 3 + hp->n_layers * fam->n_tensors;
    struct wtensor *t = calloc((size_t)cap, sizeof *t);
    if (!t) return FERRY_ERR_NOMEM;
    int n = 0;
    const long long emb[3] = {hp->dim, hp->n_vocab, 1}, nrm[3] = {hp->dim, 1, 1};
    put(t, &n, "token_embd.weight", 2, emb, wt);
    put(t, &n, "output_norm.weight", 1, nrm, DTYPE_F32);
    if (!hp->tied_embeddings) put(t, &n, "output.weight", 2, emb, wt);
    char name[96];
    for (int l = 0; l < hp->n_layers; l++) {
        const struct llm_hparams hl = llm_hparams_at(hp, l);
        for (int i = 0; i < fam->n_tensors; i++) {
            const struct arch_tensor *at = &fam->tensors[i];
            if (!arch_need_in_layer(at->need, hp, l) || at->need == ARCH_NEED_NEVER ||
                (at->need == ARCH_NEED_IF_BIAS && !hp->qkv_bias))
                continue;
            long long ne[3];
            const int nd = arch_role_shape(at->role, &hl, ne);
            snprintf(name, sizeof name, "blk.%d.%s", l, at->gguf);
            /* Vectors, bias tables and routers in F32, as GGUF converters write them. */
            const int is_weight = strstr(at->gguf, ".weight") != NULL;
            const enum dtype ty = nd == 1 || !is_weight || at->role == ARCH_ROLE_ROUTER ? DTYPE_F32 : wt;
            put(t, &n, name, nd, ne, ty);
        }
    }
    if (ftype >= 0) {
        qsort(t, (size_t)n, sizeof *t, cmp_tensor);
        struct quant_mix_model mm = {.n_layers = hp->n_layers,
                                     .n_gqa = hp->n_kv_heads ? hp->n_heads / hp->n_kv_heads : 0,
                                     .n_expert = hp->n_expert,
                                     .has_output = !hp->tied_embeddings};
        for (int i = 0; i < n; i++) mm.n_attn_v += quant_mix_attn_v_like(t[i].name);
        struct quant_mix mix;
        if (!quant_mix_init_model(&mix, ftype, &mm)) {
            snprintf(err, 256, "no quantization mix %d", ftype);
            free(t);
            return FERRY_ERR_INVALID;
        }
        for (int i = 0; i < n; i++) {
            const int nd = t[i].ne[2] > 1 ? 3 : t[i].ne[1] > 1 ? 2 : 1;
            const int ty = quant_mix_type(&mix, t[i].name, nd, t[i].ne[0], t[i].type);
            if (ty < 0) {
                snprintf(err, 256, "the mix refuses tensor %s", t[i].name);
                free(t);
                return FERRY_ERR_INVALID;
            }
            t[i].type = (enum dtype)ty;
        }
    }
    for (int i = 0; i < n; i++)
        t[i].nbytes = dtype_row_size(t[i].type, t[i].ne[0]) * (size_t)(t[i].ne[1] * t[i].ne[2] * t[i].ne[3]);
    *out = t;
    *n_out = n;
    return FERRY_OK;
}

static int is_expert_tensor(const struct wtensor *t)
{
    return t->ne[2] > 1 && t->n_dims == 3;
}

int synthetic_bytes(const struct llm_hparams *hp, enum dtype wt, int ftype, struct synthetic_bytes *out,
                    char err[256])
{
    struct wtensor *t;
    int n, rc = synthetic_table(hp, wt, ftype, &t, &n, err);
    if (rc) return rc;
    memset(out, 0, sizeof *out);
    for (int i = 0; i < n; i++) {
        const uint64_t np = (uint64_t)(t[i].ne[0] * t[i].ne[1] * t[i].ne[2] * t[i].ne[3]);
        out->total += t[i].nbytes;
        out->n_params += np;
        if (is_expert_tensor(&t[i])) {
            out->experts += t[i].nbytes;
            out->n_expert_params += np;
        }
    }
    free(t);
    return FERRY_OK;
}

/* ----------------------------------------------------------------------------------------------------------
 */
/* Filling */

#define POOL_ROWS 61 /* a prime, so that stacked experts of a multiple of it in rows are rare */

struct fill_job {
    struct wtensor *t;
    int n;
    uint64_t seed;
    int n_tasks;
    int failed;
};

static uint64_t xorshift(uint64_t *x)
{
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    return *x;
}

static void random_floats(float *v, size_t n, uint64_t *x, int norm)
{
    for (size_t k = 0; k < n; k++) {
        const float u = (float)(xorshift(x) >> 40) * 0x1.0p-24f - 0.5f;
        v[k] = norm ? 1.0f + 0.02f * u : 0.1f * u;
    }
}

/* The first rows of a block-type tensor, its pool: quantized from random values (phase 1, one task a
 * tensor). */
static void pool_task(void *ctx, int task)
{
    struct fill_job *j = ctx;
    for (int i = task; i < j->n; i += j->n_tasks) {
        struct wtensor *t = &j->t[i];
        if (!dtype_get_traits(t->type)->is_quantized) continue;
        const int64_t rows = t->ne[1] * t->ne[2] * t->ne[3], cols = t->ne[0];
        const int64_t pool = rows < POOL_ROWS ? rows : POOL_ROWS;
        const size_t rb = dtype_row_size(t->type, cols);
        float *f = malloc((size_t)cols * sizeof *f);
        if (!f) {
            j->failed = 1;
            return;
        }
        uint64_t x = j->seed ^ (0xd1b54a32d192ed03ull * (uint64_t)(i + 1));
        for (int64_t r = 0; r < pool; r++) {
            random_floats(f, (size_t)cols, &x, 0);
            if (!dtype_from_f32(t->type, f, (char *)t->data + rb * (size_t)r, cols)) j->failed = 1;
        }
        free(f);
    }
}

/* Task `task` fills its share of every tensor's rows (phase 2): float types value by value, block types by
 * rows copied from the tensor's pool, starting at a row that depends on the tensor so that tensors differ. */
static void fill_task(void *ctx, int task)
{
    struct fill_job *j = ctx;
    uint64_t x = j->seed ^ (0x9e3779b97f4a7c15ull * (uint64_t)(task + 1));
    float v[1024];
    for (int i = 0; i < j->n; i++) {
        struct wtensor *t = &j->t[i];
        const struct dtype_traits *tr = dtype_get_traits(t->type);
        const int64_t rows = t->ne[1] * t->ne[2] * t->ne[3], cols = t->ne[0];
        const int64_t per = (rows + j->n_tasks - 1) / j->n_tasks;
        int64_t lo = per * task;
        const int64_t hi = lo + per < rows ? lo + per : rows;
        const size_t rb = dtype_row_size(t->type, cols);
        char *base = (char *)t->data;
        if (!tr->is_quantized) {
            const int norm = strstr(t->name, "norm") != NULL;
            const size_t n = lo < hi ? (size_t)(hi - lo) * (size_t)cols : 0;
            for (size_t k = 0; k < n; k += 1024) {
                const size_t m = n - k < 1024 ? n - k : 1024;
                random_floats(v, m, &x, norm);
                tr->from_f32(v, base + (size_t)lo * rb + k * tr->type_size, (int64_t)m);
            }
            continue;
        }
        const int64_t pool = rows < POOL_ROWS ? rows : POOL_ROWS;
        if (lo < pool) lo = pool;
        for (int64_t r = lo; r < hi; r++)
            memcpy(base + rb * (size_t)r, base + rb * (size_t)((r + i) % pool), rb);
    }
}

int synthetic_model_file(const struct llm_hparams *hp, enum dtype wt, int ftype, uint64_t seed, int n_threads,
                         int matrices, struct model_file **out, char err[256])
{
    *out = NULL;
    if (ftype < 0) {
        snprintf(err, 256, "dense synthetic shapes are built by model_init_synthetic");
        return FERRY_ERR_INVALID;
    }
    if (!dtype_valid(wt) || dtype_get_traits(wt)->is_quantized) {
        snprintf(err, 256, "synthetic weights must be F32, F16 or BF16");
        return FERRY_ERR_INVALID;
    }
    struct model_file *mf = calloc(1, sizeof *mf);
    if (!mf) return FERRY_ERR_NOMEM;
    mf->format = MODEL_FORMAT_GGUF;
    mf->hp = *hp;
    mf->hp.family = arch_of(hp);
    int rc = synthetic_table(hp, wt, ftype, &mf->tensors, &mf->n_tensors, err);
    if (rc) {
        free(mf);
        return rc;
    }
    /* Without matrices only the F32 tensors (vectors, bias tables, routers) get memory; the others point at
     * the buffer's start, a placeholder never read. */
    size_t total = 64;
    for (int i = 0; i < mf->n_tensors; i++)
        if (matrices || mf->tensors[i].type == DTYPE_F32) total += (mf->tensors[i].nbytes + 63) & ~(size_t)63;
    char *buf = malloc(total);
    if (!buf) {
        snprintf(err, 256, "cannot allocate %.1f GiB for synthetic weights", total / 1073741824.0);
        model_file_close(mf);
        return FERRY_ERR_NOMEM;
    }
    mf->arch_owned = buf;
    struct wtensor *filled = calloc((size_t)mf->n_tensors, sizeof *filled);
    if (!filled) {
        model_file_close(mf);
        return FERRY_ERR_NOMEM;
    }
    int n_filled = 0;
    size_t off = 64;
    for (int i = 0; i < mf->n_tensors; i++) {
        struct wtensor *t = &mf->tensors[i];
        t->data = buf;
        if (!matrices && t->type != DTYPE_F32) continue;
        t->data = buf + off;
        off += (t->nbytes + 63) & ~(size_t)63;
        filled[n_filled++] = *t;
    }
    memset(buf, 0, 64);
    struct tpool *tp = NULL;
    tpool_init(&tp, n_threads);
    struct fill_job job = {
        .t = filled, .n = n_filled, .seed = seed ? seed : 1, .n_tasks = 4 * tpool_size(tp)};
    tpool_run(tp, pool_task, &job, job.n_tasks);
    tpool_run(tp, fill_task, &job, job.n_tasks);
    tpool_free(tp);
    free(filled);
    if (job.failed) {
        snprintf(err, 256, "cannot fill the synthetic weights (out of memory or a type without a quantizer)");
        model_file_close(mf);
        return FERRY_ERR_NOMEM;
    }
    if ((rc = model_file_validate(mf, err))) {
        model_file_close(mf);
        return rc;
    }
    *out = mf;
    return FERRY_OK;
}

int synthetic_model_init(struct model *m, const struct llm_hparams *hp, enum dtype wt, int ftype,
                         uint64_t seed, int n_threads, char err[256])
{
    if (ftype < 0) return model_init_synthetic(m, hp, wt, seed, n_threads, err);
    memset(m, 0, sizeof *m);
    struct model_file *mf;
    int rc = synthetic_model_file(hp, wt, ftype, seed, n_threads, 1, &mf, err);
    if (rc) return rc;
    if ((rc = model_init(m, mf, err)) == FERRY_OK) { /* views into the buffer, copies of the vectors */
        m->owned = mf->arch_owned;
        mf->arch_owned = NULL;
    }
    model_file_close(mf);
    return rc;
}
