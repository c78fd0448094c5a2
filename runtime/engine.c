/* engine — validates batches, manages the KV block tables, and runs the backend's forward pass.
 *
 * A step is all-or-nothing for the KV cache: blocks reserved for the batch are given back if the pool runs
 * out, and sequence lengths change only after the forward pass succeeded.
 */
#include "runtime/engine.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernels/core/log.h"
#include "kernels/core/status.h"
#include "runtime/forward_cpu.h"
#ifdef FERRY_CUDA
#include "kernels/cuda/ops.h"
#include "runtime/forward_cuda.h"
#endif
#include "runtime/kv_cache.h"
#include "quant/mix.h"
#include "runtime/model.h"

#define ENGINE_KV_BLOCK 16

struct engine {
    struct engine_params p;
    struct model model;
    struct kv_cache kv;
    struct forward_cpu *fwd;   /* CPU backend, or NULL */
#ifdef FERRY_CUDA
    struct forward_cuda *cuda; /* CUDA backend, or NULL */
#endif
    char placement[2048];
    int32_t *new_len; /* (n_seqs) scratch: the length each slot will have after the step, or -1 */
    int32_t *first;   /* (n_seqs) scratch: the first position the step writes in each slot */
    struct engine_stats stats;
};

struct engine_params engine_default_params(void)
{
    return (struct engine_params){
        .backend = ENGINE_BACKEND_AUTO,
        .n_threads = 0,
        .ctx_size = 0,
        .n_seqs = 1,
        .kv_tokens = 0,
        .max_batch_tokens = 512,
        .deterministic = 0,
        .gpu_memory = 0,
        .reserve_vram = (int64_t)1 << 30,
        .gpu_layers = -1,
        .n_slots = 0,
        .quant = ENGINE_QUANT_NONE,
    };
}

/* --quant values and the llama.cpp mixes they apply (the int4 choice is measured in kernels/cpu/NOTES.md). */
static const struct {
    const char *name;
    int ftype;
} engine_quants[] = {
    [ENGINE_QUANT_NONE] = {"none", -1},
    [ENGINE_QUANT_INT8] = {"int8", QUANT_FTYPE_Q8_0},
    [ENGINE_QUANT_INT4] = {"int4", QUANT_FTYPE_Q4_K_M},
};

int engine_quant_parse(const char *s)
{
    for (int i = 0; i < (int)(sizeof engine_quants / sizeof engine_quants[0]); i++)
        if (s && !strcmp(s, engine_quants[i].name)) return i;
    return -1;
}

int engine_quant_ftype(enum engine_quant q)
{
    return (unsigned)q < sizeof engine_quants / sizeof engine_quants[0] ? engine_quants[q].ftype : -1;
}

static double now_seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

void engine_free(struct engine *e)
{
    if (!e) return;
    forward_cpu_free(e->fwd);
#ifdef FERRY_CUDA
    forward_cuda_free(e->cuda);
#endif
    kv_cache_free(&e->kv);
    model_free(&e->model);
    free(e->new_len);
    free(e->first);
    free(e);
}

/* Takes ownership of *model (freed on failure too). */
static int engine_create(struct engine **out, struct model *model, const struct engine_params *params,
                         char err[256])
{
    *out = NULL;
    struct engine_params p = *params;
    int use_cuda = 0;
#ifdef FERRY_CUDA
    use_cuda = p.backend == ENGINE_BACKEND_CUDA || (p.backend == ENGINE_BACKEND_AUTO && kern_cuda_device_count() > 0);
#else
    if (p.backend == ENGINE_BACKEND_CUDA) {
        snprintf(err, 256, "this build of ferry has no CUDA backend (nvcc was not found at build time)");
        model_free(model);
        return FERRY_ERR_UNSUPPORTED;
    }
#endif
    if (p.n_seqs <= 0 || p.n_seqs > 1024 || p.max_batch_tokens <= 0 || p.max_batch_tokens > 65536 ||
        p.ctx_size < 0 || p.kv_tokens < 0) {
        snprintf(err, 256, "invalid engine parameters (n_seqs %d, max_batch_tokens %d, ctx_size %d)", p.n_seqs,
                 p.max_batch_tokens, p.ctx_size);
        model_free(model);
        return FERRY_ERR_INVALID;
    }
    struct engine *e = calloc(1, sizeof *e);
    if (!e) {
        model_free(model);
        return FERRY_ERR_NOMEM;
    }
    e->model = *model;
    memset(model, 0, sizeof *model);
    int rc;
    const struct llm_hparams *hp = &e->model.hp;
    if (p.quant != ENGINE_QUANT_NONE) {
        const int ftype = engine_quant_ftype(p.quant);
        if (ftype < 0) {
            snprintf(err, 256, "unknown quantization %d", (int)p.quant);
            rc = FERRY_ERR_INVALID;
            goto fail;
        }
        if ((rc = model_quantize(&e->model, ftype, p.n_threads, err))) goto fail;
    }
    if (p.ctx_size == 0) p.ctx_size = hp->ctx_train > 0 && hp->ctx_train < 4096 ? hp->ctx_train : 4096;
    if (p.kv_tokens == 0) p.kv_tokens = p.n_seqs * p.ctx_size;
    e->p = p;
    rc = kv_cache_init(&e->kv, hp->n_layers, hp->n_kv_heads, hp->head_dim, p.n_seqs, p.ctx_size, p.kv_tokens,
                       ENGINE_KV_BLOCK, !use_cuda);
    if (rc) {
        snprintf(err, 256, "cannot allocate the KV cache (%d positions)", p.kv_tokens);
        goto fail;
    }
#ifdef FERRY_CUDA
    if (use_cuda) {
        struct forward_cuda_params cp = {.max_tokens = p.max_batch_tokens, .gpu_memory = p.gpu_memory,
                                         .reserve_vram = p.reserve_vram, .gpu_layers = p.gpu_layers,
                                         .n_slots = p.n_slots};
        if ((rc = forward_cuda_init(&e->cuda, &e->model, &e->kv, &cp, err))) goto fail;
        device_map_format(forward_cuda_map(e->cuda), e->placement, sizeof e->placement);
    }
#endif
    if (!use_cuda) {
        if ((rc = forward_cpu_init(&e->fwd, &e->model, p.max_batch_tokens, p.n_threads))) {
            snprintf(err, 256, "cannot allocate CPU activations for %d tokens", p.max_batch_tokens);
            goto fail;
        }
        snprintf(e->placement, sizeof e->placement, "cpu: all layers (%d threads)", forward_cpu_threads(e->fwd));
    }
    e->new_len = malloc((size_t)p.n_seqs * sizeof(int32_t));
    e->first = malloc((size_t)p.n_seqs * sizeof(int32_t));
    if (!e->new_len || !e->first) {
        rc = FERRY_ERR_NOMEM;
        goto fail;
    }
    e->stats.backend = use_cuda ? "cuda" : "cpu";
    e->stats.kv_blocks_total = e->kv.n_blocks;
    e->stats.kv_block_size = e->kv.block_size;
    FLOG_INFO("engine: %s backend, ctx %d, %d slots, KV pool %d positions (%.1f MiB)", e->stats.backend, p.ctx_size,
              p.n_seqs, e->kv.n_blocks * e->kv.block_size, kv_cache_bytes(&e->kv, use_cuda ? 2 : 4) / 1048576.0);
    *out = e;
    return FERRY_OK;
fail:
    engine_free(e);
    return rc;
}

int engine_init(struct engine **out, const struct model_file *mf, const struct engine_params *p, char err[256])
{
    struct model m;
    int rc = model_init(&m, mf, err);
    return rc ? rc : engine_create(out, &m, p, err);
}

int engine_init_synthetic(struct engine **out, const struct llm_hparams *hp, enum dtype wt,
                          const struct engine_params *p, char err[256])
{
    struct model m;
    int rc = model_init_synthetic(&m, hp, wt, 0x5eed, p->n_threads, err);
    return rc ? rc : engine_create(out, &m, p, err);
}

uint64_t engine_weight_bytes(const struct engine *e) { return e->model.weight_bytes; }

int engine_plan(const struct model_file *mf, const struct engine_params *params, char *buf, size_t cap, char err[256])
{
#ifdef FERRY_CUDA
    struct engine_params p = *params;
    struct model m;
    struct kv_cache kv;
    struct device_map map;
    int rc = model_init(&m, mf, err);
    if (rc) return rc;
    if (p.ctx_size == 0) p.ctx_size = m.hp.ctx_train > 0 && m.hp.ctx_train < 4096 ? m.hp.ctx_train : 4096;
    if (p.kv_tokens == 0) p.kv_tokens = p.n_seqs * p.ctx_size;
    rc = kv_cache_init(&kv, m.hp.n_layers, m.hp.n_kv_heads, m.hp.head_dim, p.n_seqs, p.ctx_size, p.kv_tokens,
                       ENGINE_KV_BLOCK, 0);
    if (!rc) {
        struct forward_cuda_params cp = {.max_tokens = p.max_batch_tokens, .gpu_memory = p.gpu_memory,
                                         .reserve_vram = p.reserve_vram, .gpu_layers = p.gpu_layers,
                                         .n_slots = p.n_slots};
        rc = forward_cuda_plan_offline(&m, &kv, &cp, 54.9e9, 4.18e12, &map, err);
        if (!rc) {
            device_map_format(&map, buf, cap);
            device_map_free(&map);
        }
        kv_cache_free(&kv);
    }
    model_free(&m);
    return rc;
#else
    (void)mf;
    (void)params;
    (void)buf;
    (void)cap;
    snprintf(err, 256, "this build has no CUDA backend");
    return FERRY_ERR_UNSUPPORTED;
#endif
}

const struct llm_hparams *engine_hparams(const struct engine *e) { return &e->model.hp; }
int engine_ctx_size(const struct engine *e) { return e->p.ctx_size; }
int engine_n_seqs(const struct engine *e) { return e->p.n_seqs; }

int engine_seq_len(const struct engine *e, int seq)
{
    return seq >= 0 && seq < e->p.n_seqs ? e->kv.seq_len[seq] : 0;
}

int engine_seq_free(struct engine *e, int seq)
{
    if (seq < 0 || seq >= e->p.n_seqs) return FERRY_ERR_INVALID;
    kv_cache_seq_free(&e->kv, seq);
    return FERRY_OK;
}

int engine_seq_keep(struct engine *e, int seq, int n)
{
    if (seq < 0 || seq >= e->p.n_seqs || n < 0 || n > e->kv.seq_len[seq]) return FERRY_ERR_INVALID;
    if (n % e->kv.block_size && kv_cache_shared(&e->kv, seq, n)) n -= n % e->kv.block_size;
    kv_cache_trim(&e->kv, seq, n);
    e->kv.seq_len[seq] = n;
    return n;
}

int engine_seq_share(struct engine *e, int src, int dst, int n)
{
    if (src < 0 || src >= e->p.n_seqs || dst < 0 || dst >= e->p.n_seqs || src == dst || n < 0)
        return FERRY_ERR_INVALID;
    kv_cache_seq_free(&e->kv, dst);
    if (n > e->kv.seq_len[src]) n = e->kv.seq_len[src];
    const int blocks = n / e->kv.block_size;
    int rc = kv_cache_share(&e->kv, src, dst, blocks);
    if (rc) return rc;
    e->kv.seq_len[dst] = blocks * e->kv.block_size;
    return e->kv.seq_len[dst];
}

/* Checks ids, slots and the order of positions: within a slot, positions continue each other and the first
 * one is at most the slot's current length (a slot may rewind to rewrite its tail). */
static int check_batch(struct engine *e, const struct batch *b)
{
    const int n_vocab = e->model.hp.n_vocab;
    if (b->n_tokens <= 0 || b->n_tokens > e->p.max_batch_tokens) return FERRY_ERR_INVALID;
    for (int s = 0; s < e->p.n_seqs; s++) e->new_len[s] = -1;
    for (int i = 0; i < b->n_tokens; i++) {
        int s = b->seq[i], p = b->pos[i];
        if (b->tokens[i] < 0 || b->tokens[i] >= n_vocab || s < 0 || s >= e->p.n_seqs || p < 0)
            return FERRY_ERR_INVALID;
        if (e->new_len[s] < 0 ? p > e->kv.seq_len[s] : p != e->new_len[s]) return FERRY_ERR_INVALID;
        if (p >= e->p.ctx_size) return FERRY_ERR_RANGE;
        if (e->new_len[s] < 0) e->first[s] = p;
        e->new_len[s] = p + 1;
    }
    /* No step writes into a block another sequence shares. */
    const int bs = e->kv.block_size;
    for (int s = 0; s < e->p.n_seqs; s++)
        if (e->new_len[s] >= 0)
            for (int p = e->first[s] - e->first[s] % bs; p < e->new_len[s]; p += bs)
                if (kv_cache_shared(&e->kv, s, p)) return FERRY_ERR_INVALID;
    return FERRY_OK;
}

int engine_step(struct engine *e, const struct batch *b, float *logits)
{
    double t0 = now_seconds();
    int rc = check_batch(e, b);
    if (rc) return rc;
    int n_seqs = e->p.n_seqs;
    for (int s = 0; s < n_seqs && !rc; s++)
        if (e->new_len[s] >= 0) rc = kv_cache_reserve(&e->kv, s, e->new_len[s]);
    if (!rc) {
#ifdef FERRY_CUDA
        if (e->cuda)
            rc = forward_cuda_run(e->cuda, &e->model, &e->kv, b, logits);
        else
#endif
            rc = forward_cpu_run(e->fwd, &e->model, &e->kv, b, logits);
        /* A failed pass may have overwritten the slots from their first written position on. */
        for (int s = 0; s < n_seqs; s++)
            if (e->new_len[s] >= 0) e->kv.seq_len[s] = rc ? e->first[s] : e->new_len[s];
    }
    for (int s = 0; s < n_seqs; s++)
        if (e->new_len[s] >= 0) kv_cache_trim(&e->kv, s, e->kv.seq_len[s]);
    if (rc) return rc;
    e->stats.steps++;
    e->stats.tokens += (uint64_t)b->n_tokens;
    e->stats.busy_seconds += now_seconds() - t0;
    return FERRY_OK;
}

void engine_get_stats(const struct engine *e, struct engine_stats *st)
{
    *st = e->stats;
    st->kv_blocks_used = e->kv.n_blocks - e->kv.n_free;
#ifdef FERRY_CUDA
    if (e->cuda) {
        const struct device_map *m = forward_cuda_map(e->cuda);
        struct forward_cuda_stats cs;
        forward_cuda_get_stats(e->cuda, &cs);
        st->n_resident = m->n_resident;
        st->n_streamed = m->n_streamed;
        st->n_slots = m->n_slots;
        st->bytes_streamed = cs.bytes_streamed;
        st->copy_seconds = cs.copy_seconds;
        st->stall_seconds = cs.stall_seconds;
        st->vram_budget = cs.vram_budget;
        st->vram_planned = cs.vram_planned;
        st->vram_used = cs.vram_used;
    }
#endif
}

const char *engine_placement(const struct engine *e) { return e->placement; }
