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
#include "runtime/kv_cache.h"
#include "runtime/model.h"

#define ENGINE_KV_BLOCK 16

struct engine {
    struct engine_params p;
    struct model model;
    struct kv_cache kv;
    struct forward_cpu *fwd;
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
    };
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
    kv_cache_free(&e->kv);
    model_free(&e->model);
    free(e->new_len);
    free(e->first);
    free(e);
}

int engine_init(struct engine **out, const struct model_file *mf, const struct engine_params *params, char err[256])
{
    *out = NULL;
    struct engine_params p = *params;
    if (p.backend == ENGINE_BACKEND_CUDA) {
        snprintf(err, 256, "the CUDA backend is not available in this build of the engine yet");
        return FERRY_ERR_UNSUPPORTED;
    }
    if (p.n_seqs <= 0 || p.n_seqs > 1024 || p.max_batch_tokens <= 0 || p.max_batch_tokens > 65536 ||
        p.ctx_size < 0 || p.kv_tokens < 0) {
        snprintf(err, 256, "invalid engine parameters (n_seqs %d, max_batch_tokens %d, ctx_size %d)", p.n_seqs,
                 p.max_batch_tokens, p.ctx_size);
        return FERRY_ERR_INVALID;
    }
    struct engine *e = calloc(1, sizeof *e);
    if (!e) return FERRY_ERR_NOMEM;
    int rc = model_init(&e->model, mf, err);
    if (rc) goto fail;
    const struct llm_hparams *hp = &e->model.hp;
    if (p.ctx_size == 0) p.ctx_size = hp->ctx_train > 0 && hp->ctx_train < 4096 ? hp->ctx_train : 4096;
    if (p.kv_tokens == 0) p.kv_tokens = p.n_seqs * p.ctx_size;
    e->p = p;
    rc = kv_cache_init(&e->kv, hp->n_layers, hp->n_kv_heads, hp->head_dim, p.n_seqs, p.ctx_size, p.kv_tokens,
                       ENGINE_KV_BLOCK);
    if (rc) {
        snprintf(err, 256, "cannot allocate the KV cache (%d positions)", p.kv_tokens);
        goto fail;
    }
    if ((rc = forward_cpu_init(&e->fwd, &e->model, p.max_batch_tokens, p.n_threads))) {
        snprintf(err, 256, "cannot allocate CPU activations for %d tokens", p.max_batch_tokens);
        goto fail;
    }
    e->new_len = malloc((size_t)p.n_seqs * sizeof(int32_t));
    e->first = malloc((size_t)p.n_seqs * sizeof(int32_t));
    if (!e->new_len || !e->first) {
        rc = FERRY_ERR_NOMEM;
        goto fail;
    }
    e->stats.backend = "cpu";
    e->stats.kv_blocks_total = e->kv.n_blocks;
    e->stats.kv_block_size = e->kv.block_size;
    FLOG_INFO("engine: cpu backend, %d threads, ctx %d, %d slots, KV pool %d positions (%.1f MiB)",
              forward_cpu_threads(e->fwd), p.ctx_size, p.n_seqs, e->kv.n_blocks * e->kv.block_size,
              kv_cache_bytes(&e->kv) / 1048576.0);
    *out = e;
    return FERRY_OK;
fail:
    engine_free(e);
    return rc;
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
}
