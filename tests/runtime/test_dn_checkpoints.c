/* test_dn_checkpoints — checkpoints of the recurrent (gated DeltaNet) state for the prompt cache, on the CPU
 * engine with the tiny Qwen3.5 of tests/golden (qwen35_deltanet_f16.gguf, references from transformers 5 by
 * tests/golden/make_qwen35_golden.py):
 *  - a two-turn conversation: turn 1 (the 150-token golden prompt, within 1e-4 of transformers, fed in
 *    chunks of 32 as the scheduler cuts a long prompt) and 8 greedy tokens; turn 2 shares its first 70 tokens
 *    and goes on differently. engine_seq_keep sends the slot back to the checkpoint at 64 (the latest chunk
 *    boundary at or before the divergence), 36 tokens are prefilled, and the logits and 24 greedy tokens are
 *    bitwise those of a cold run in another slot (the same step boundaries), and within 1e-4 of one fresh
 *    prefill of the whole prompt; engine_seq_reusable tells the prompt cache the same 64 beforehand;
 *  - with --ctx-checkpoints 3 the oldest are evicted: a prefix ending before them reuses nothing, one after
 *    them goes back to the latest within it and continues to transformers' logits;
 *  - seq_state itself: the bound, the thinning to ckpt_step apart when full, each restore giving back the
 *    state saved at its position, a save behind later checkpoints forgetting them;
 *  - odd cases fall back to a full prefill: a slot fed token by token (no checkpoint), a prefix shorter than
 *    every checkpoint, --ctx-checkpoints 0, out-of-range slots and positions;
 *  - a GPU engine's recurrent host layers computed by the host's cores, on two CPU backends (the host's on
 *    packed blocks with the engine's seq_state, the other standing in for the device): bitwise the plain CPU
 *    forward over a run of two slots with checkpoints and a restore of both sides' state.
 * Skips (with a message) when the committed model is missing.
 */
#include <criterion/criterion.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/core/status.h"
#include "runtime/engine.h"
#include "runtime/forward_cpu.h"
#include "runtime/kv_cache.h"
#include "runtime/layer.h"
#include "runtime/model.h"
#include "runtime/seq_state.h"

#include "qwen35_fixture.h"

#define N1     150 /* turn 1: the golden prompt of 150 tokens */
#define SHARED 70  /* turn 2's first tokens, those of turn 1 */
#define N2     100
#define CHUNK  32

struct ck {
    json_t *golden;
    struct model_file *mf;
    struct engine *e;
    int n_vocab;
    int32_t p1[N1], p2[N2];
    float *ref1; /* (n_vocab) transformers' logits after p1 */
};

static void ck_open(struct ck *q, int n_seqs, int n_ckpt, int step)
{
    const char *src = getenv("FERRY_SRC");
    cr_assert(src, "FERRY_SRC is not set (run through meson test)");
    char model[1024], json[1024];
    snprintf(model, sizeof model, "%s/tests/golden/models/qwen35_deltanet_f16.gguf", src);
    snprintf(json, sizeof json, "%s/tests/golden/qwen35_deltanet_f16.json", src);
    struct engine_params p = engine_default_params();
    p.n_seqs = n_seqs;
    p.kv_type = KV_F32;
    p.ctx_checkpoints = n_ckpt;
    p.ckpt_step = step;
    qwen35_fixture_open(model, json, "qwen35", p, &q->golden, &q->mf, &q->e);
    q->n_vocab = engine_hparams(q->e)->n_vocab;
    json_t *c = json_array_get(json_object_get(q->golden, "cases"), 3);
    json_t *ids = json_object_get(c, "prompt_tokens"), *lg = json_object_get(c, "logits");
    cr_assert_eq((int)json_array_size(ids), N1);
    cr_assert_eq((int)json_array_size(lg), q->n_vocab);
    for (int i = 0; i < N1; i++) q->p1[i] = (int32_t)json_integer_value(json_array_get(ids, (size_t)i));
    q->ref1 = malloc(sizeof(float) * (size_t)q->n_vocab);
    for (int i = 0; i < q->n_vocab; i++) q->ref1[i] = (float)json_real_value(json_array_get(lg, (size_t)i));
    /* Turn 2: turn 1's first SHARED tokens, then others (turn 1's in another order, differing at SHARED). */
    memcpy(q->p2, q->p1, sizeof(int32_t) * SHARED);
    for (int i = SHARED; i < N2; i++) q->p2[i] = q->p1[N1 - 1 - (i - SHARED)];
    cr_assert_neq(q->p2[SHARED], q->p1[SHARED]);
}

static void ck_close(struct ck *q)
{
    engine_free(q->e);
    model_file_close(q->mf);
    json_decref(q->golden);
    free(q->ref1);
}

static int ck_feed(struct ck *q, int seq, const int32_t *ids, int from, int to, int step, float *logits)
{
    return qwen35_fixture_feed(q->e, seq, ids, from, to, step, logits);
}

/* n greedy tokens of slot seq after its prompt (whose last logits are in lg, overwritten), into out; each
 * step's logits after the prompt's into lgs (n, n_vocab). */
static void ck_greedy(struct ck *q, int seq, float *lg, int n, int32_t *out, float *lgs)
{
    const size_t nv = (size_t)q->n_vocab;
    for (int i = 0; i < n; i++) {
        int32_t t = out[i] = qwen35_fixture_argmax(lg, q->n_vocab), p = engine_seq_len(q->e, seq), s = seq;
        uint8_t w = 1;
        const struct batch b = {.n_tokens = 1, .tokens = &t, .pos = &p, .seq = &s, .want_logits = &w};
        cr_assert_eq(engine_step(q->e, &b, lg), FERRY_OK);
        if (lgs) memcpy(lgs + (size_t)i * nv, lg, nv * sizeof(float));
    }
}

Test(dn_checkpoints, second_turn_resumes_at_the_checkpoint_before_the_divergence)
{
    struct ck q;
    ck_open(&q, 2, 32, 8192);
    const size_t nv = (size_t)q.n_vocab;
    float *lg = malloc(nv * sizeof(float)), *cold = malloc(nv * sizeof(float)),
          *fresh = malloc(nv * sizeof(float)), *warm_lgs = malloc(24 * nv * sizeof(float)),
          *cold_lgs = malloc(24 * nv * sizeof(float));
    /* Turn 1 in slot 0, as transformers has it; its checkpoints at 32, 64, 96, 128 and 150. */
    cr_assert_eq(ck_feed(&q, 0, q.p1, 0, N1, CHUNK, lg), FERRY_OK);
    qwen35_fixture_expect_close(lg, q.ref1, q.n_vocab, 1e-4, "turn 1 vs transformers");
    int32_t gen[24];
    ck_greedy(&q, 0, lg, 8, gen, NULL);
    cr_assert_eq(engine_seq_len(q.e, 0), N1 + 8);
    /* What the prompt cache is told a slot can give back, asking changes nothing. */
    cr_assert_eq(engine_seq_reusable(q.e, 0, SHARED), 2 * CHUNK);
    cr_assert_eq(engine_seq_reusable(q.e, 0, N1 + 8), N1 + 8, "the whole slot continues");
    cr_assert_eq(engine_seq_reusable(q.e, 0, 1000), N1 + 8);
    cr_assert_eq(engine_seq_reusable(q.e, 0, 31), 0);
    cr_assert_eq(engine_seq_reusable(q.e, 2, 10), 0);
    cr_assert_eq(engine_seq_len(q.e, 0), N1 + 8);
    /* Turn 2 shares 70 positions: back to the checkpoint at 64, then the other 36 prefilled. */
    const int kept = engine_seq_keep(q.e, 0, SHARED);
    cr_assert_eq(kept, 2 * CHUNK, "kept %d positions, wanted the checkpoint at %d", kept, 2 * CHUNK);
    cr_assert_eq(engine_seq_len(q.e, 0), kept);
    const int prefilled = N2 - kept;
    cr_assert_eq(prefilled, 36);
    cr_assert_eq(ck_feed(&q, 0, q.p2, kept, N2, prefilled, lg), FERRY_OK);
    /* Cold: slot 1 from position 0, with the same step boundaries (64 in chunks of 32, then 36). */
    cr_assert_eq(ck_feed(&q, 1, q.p2, 0, kept, CHUNK, cold), FERRY_OK);
    cr_assert_eq(ck_feed(&q, 1, q.p2, kept, N2, prefilled, cold), FERRY_OK);
    cr_assert(!memcmp(lg, cold, nv * sizeof(float)), "turn 2's logits differ from a cold run's");
    int32_t warm_tok[24], cold_tok[24];
    ck_greedy(&q, 0, lg, 24, warm_tok, warm_lgs);
    ck_greedy(&q, 1, cold, 24, cold_tok, cold_lgs);
    for (int i = 0; i < 24; i++) cr_expect_eq(warm_tok[i], cold_tok[i], "greedy token %d", i);
    cr_assert(!memcmp(warm_lgs, cold_lgs, 24 * nv * sizeof(float)), "greedy steps' logits differ");
    /* And both as one fresh prefill of the whole of turn 2 (the chunked rule, other boundaries). */
    cr_assert_eq(engine_seq_free(q.e, 1), FERRY_OK);
    cr_assert_eq(ck_feed(&q, 1, q.p2, 0, N2, N2, fresh), FERRY_OK);
    ck_greedy(&q, 1, fresh, 1, cold_tok, NULL);
    cr_assert_eq(cold_tok[0], warm_tok[0]);
    qwen35_fixture_expect_close(fresh, warm_lgs, q.n_vocab, 1e-4,
                                "after turn 2's first greedy token vs one fresh prefill");
    /* Turn 1's checkpoints past 64 went with its positions: the slot now has 32, 64 and turn 2's at 100. */
    cr_assert_eq(engine_seq_keep(q.e, 0, 120), N2);
    cr_assert_eq(engine_seq_keep(q.e, 0, 99), 2 * CHUNK);
    free(lg), free(cold), free(fresh), free(warm_lgs), free(cold_lgs);
    ck_close(&q);
}

Test(dn_checkpoints, limit_evicts_the_oldest)
{
    struct ck q;
    ck_open(&q, 1, 3, 0);
    float *lg = malloc((size_t)q.n_vocab * sizeof(float));
    /* Chunks end at 32, 64, 96, 128, 150: three kept, 96, 128 and 150. */
    cr_assert_eq(ck_feed(&q, 0, q.p1, 0, N1, CHUNK, lg), FERRY_OK);
    cr_assert_eq(engine_seq_keep(q.e, 0, SHARED), 0, "the checkpoints before 70 were evicted");
    cr_assert_eq(engine_seq_len(q.e, 0), 0);
    cr_assert_eq(ck_feed(&q, 0, q.p1, 0, N1, CHUNK, lg), FERRY_OK);
    cr_assert_eq(engine_seq_keep(q.e, 0, 140), 128);
    cr_assert_eq(ck_feed(&q, 0, q.p1, 128, N1, N1, lg), FERRY_OK);
    qwen35_fixture_expect_close(lg, q.ref1, q.n_vocab, 1e-4,
                                "continued from the checkpoint at 128 vs transformers");
    cr_assert_eq(engine_seq_keep(q.e, 0, 100), 96);
    free(lg);
    ck_close(&q);
}

Test(dn_checkpoints, seq_state_bound_thinning_and_restore)
{
    struct ck q;
    ck_open(&q, 1, 0, 0);
    struct seq_state s;
    cr_assert_eq(seq_state_init(&s, engine_hparams(q.e), 2, (struct seq_state_params){4, 20}), FERRY_OK);
    const size_t nf = seq_state_slot_bytes(&s) / sizeof(float);
    cr_assert(nf > 0);
    cr_assert_eq(seq_state_bytes(engine_hparams(q.e), 2, 4), 2 * 5 * seq_state_slot_bytes(&s));
    float *live = seq_state_slot(&s, 1);
    /* Slot 1's state "after pos positions" is pos everywhere; slot 0 stays zero. */
    for (int pos = 10; pos <= 70; pos += 10) {
        for (size_t i = 0; i < nf; i++) live[i] = (float)pos;
        cr_assert_not_null(seq_state_save(&s, 1, pos));
    }
    /* Full at 10..40; 50 thinned 20 (10 after 10), 60 thinned 40, and 70 found none closer than 20: the
     * oldest went. */
    const int want[4] = {30, 50, 60, 70};
    cr_assert_eq(seq_state_ckpt_count(&s, 1), 4);
    for (int i = 0; i < 4; i++) cr_expect_eq(seq_state_ckpt_at(&s, 1, i), want[i], "checkpoint %d", i);
    cr_assert_eq(seq_state_ckpt_count(&s, 0), 0);
    /* Each restore gives back the state saved at its position, and forgets the later ones. */
    cr_assert_eq(seq_state_restore(&s, 1, 65), 60);
    for (size_t i = 0; i < nf; i++) cr_assert_eq(live[i], 60.0f);
    cr_assert_eq(seq_state_ckpt_pos(&s, 1), 60);
    cr_assert_eq(seq_state_ckpt_count(&s, 1), 3);
    /* A checkpoint beyond what is asked is not used, and nothing changes: the caller prefills in full. */
    for (size_t i = 0; i < nf; i++) live[i] = -1.0f;
    cr_assert_eq(seq_state_restore(&s, 1, 29), 0);
    for (size_t i = 0; i < nf; i++) cr_assert_eq(live[i], -1.0f);
    cr_assert_eq(seq_state_ckpt_count(&s, 1), 3);
    /* A save behind later checkpoints (positions rewritten) forgets them; one at the same position
     * replaces it. */
    cr_assert_not_null(seq_state_save(&s, 1, 40));
    cr_assert_not_null(seq_state_save(&s, 1, 40));
    cr_assert_eq(seq_state_ckpt_count(&s, 1), 2);
    cr_assert_eq(seq_state_ckpt_at(&s, 1, 0), 30);
    cr_assert_eq(seq_state_ckpt_at(&s, 1, 1), 40);
    cr_assert_eq(seq_state_restore(&s, 1, 1000), 40);
    for (size_t i = 0; i < nf; i++) cr_assert_eq(live[i], -1.0f);
    cr_assert_eq(seq_state_restore(&s, 1, 39), 30);
    for (size_t i = 0; i < nf; i++) cr_assert_eq(live[i], 30.0f);
    /* Hostile arguments: nothing saved, nothing restored, nothing written. */
    cr_assert_null(seq_state_save(&s, 1, 0));
    cr_assert_null(seq_state_save(&s, -1, 5));
    cr_assert_null(seq_state_save(&s, 2, 5));
    cr_assert_null(seq_state_slot(&s, 2));
    cr_assert_eq(seq_state_restore(&s, 0, 1000), 0, "slot 0 has no checkpoint");
    cr_assert_eq(seq_state_restore(&s, 7, 1000), 0);
    cr_assert_eq(seq_state_restore(&s, 1, 0), 0);
    cr_assert_eq(seq_state_ckpt_at(&s, 1, 5), -1);
    cr_assert_eq(seq_state_ckpt_pos(&s, -3), -1);
    seq_state_drop(&s, 1);
    seq_state_drop(&s, 9);
    cr_assert_eq(seq_state_restore(&s, 1, 1000), 0);
    seq_state_free(&s);
    /* n_ckpt 0: no checkpoint is ever kept. */
    cr_assert_eq(seq_state_init(&s, engine_hparams(q.e), 1, (struct seq_state_params){0, 0}), FERRY_OK);
    cr_assert_null(seq_state_save(&s, 0, 5));
    cr_assert_eq(seq_state_restore(&s, 0, 5), 0);
    cr_assert_eq(seq_state_ckpt_pos(&s, 0), -1);
    seq_state_free(&s);
    cr_assert_eq(seq_state_init(&s, engine_hparams(q.e), 1, (struct seq_state_params){-1, 0}),
                 FERRY_ERR_INVALID);
    seq_state_free(&s);
    ck_close(&q);
}

Test(dn_checkpoints, no_checkpoint_means_a_full_prefill)
{
    struct ck q;
    ck_open(&q, 1, 32, 8192);
    float *lg = malloc((size_t)q.n_vocab * sizeof(float));
    /* Token by token: every step is one row, which saves no checkpoint. */
    cr_assert_eq(ck_feed(&q, 0, q.p1, 0, 40, 1, lg), FERRY_OK);
    cr_assert_eq(engine_seq_keep(q.e, 0, 39), 0);
    cr_assert_eq(engine_seq_len(q.e, 0), 0);
    /* A prefix shorter than the first checkpoint (32), and one past the slot's length. */
    cr_assert_eq(ck_feed(&q, 0, q.p1, 0, N1, CHUNK, lg), FERRY_OK);
    cr_assert_eq(engine_seq_keep(q.e, 0, N1 + 1), FERRY_ERR_INVALID);
    cr_assert_eq(engine_seq_len(q.e, 0), N1);
    cr_assert_eq(engine_seq_keep(q.e, 0, 31), 0);
    cr_assert_eq(engine_seq_len(q.e, 0), 0);
    /* The full prefill after it is transformers'. */
    cr_assert_eq(ck_feed(&q, 0, q.p1, 0, N1, N1, lg), FERRY_OK);
    qwen35_fixture_expect_close(lg, q.ref1, q.n_vocab, 1e-4, "full prefill after a fallback vs transformers");
    free(lg);
    ck_close(&q);
    /* --ctx-checkpoints 0: a slot continues or starts again. */
    ck_open(&q, 1, 0, 0);
    lg = malloc((size_t)q.n_vocab * sizeof(float));
    cr_assert_eq(ck_feed(&q, 0, q.p1, 0, N1, CHUNK, lg), FERRY_OK);
    cr_assert_eq(engine_seq_keep(q.e, 0, N1), N1, "kept whole, it continues");
    cr_assert_eq(engine_seq_keep(q.e, 0, 140), 0);
    free(lg);
    ck_close(&q);
}

/* ----------------------------------------------------------------------------------------------------------
 */
/* Recurrent host layers: the host's backend on packed blocks, its state in the engine's seq_state */

#define HL_SEQS 2
#define HL_ROWS 16

/* Layer l of m packed as a GPU engine's host layer: its groups and tail in one block (runtime/layer.h), the
 * mixer's five matrices and small tensors in another (forward_cuda.c keeps them between the groups and the
 * tail; here they only have to be elsewhere than the model's tensors). *blk and *dnb are malloc'd. */
static enum dtype hl_same(enum dtype t)
{
    return t;
}

static void *hl_copy(void **at, const void *src, size_t bytes)
{
    if (!src) return NULL;
    void *p = *at;
    memcpy(p, src, bytes);
    *at = (char *)p + (bytes + 255) / 256 * 256;
    return p;
}

static void hl_pack(const struct model *m, int l, struct layer_weights *w, void **blk, void **dnb)
{
    const struct model_layer *L = &m->layers[l];
    const struct llm_hparams *hp = &m->hp;
    struct layer_layout lay;
    layer_layout_of(L, hp, hl_same, &lay);
    *blk = aligned_alloc(256, (lay.bytes + 255) / 256 * 256);
    float *tmp = malloc(sizeof(float) * 65536);
    cr_assert(*blk && tmp);
    cr_assert_eq(layer_pack(L, hp, &lay, *blk, tmp), FERRY_OK, "layer %d", l);
    free(tmp);
    layer_weights_at(w, &lay, *blk);
    *dnb = NULL;
    if (!llm_layer_is_recurrent(hp, l)) return;
    const struct wview *v[5] = {&L->ssm_qkv, &L->ssm_z, &L->ssm_beta, &L->ssm_alpha, &L->ssm_out};
    struct wview *d[5] = {&w->dn.qkv, &w->dn.z, &w->dn.beta, &w->dn.alpha, &w->dn.out};
    const size_t C = (size_t)llm_ssm_conv_dim(hp), nv = (size_t)hp->ssm_n_v_heads,
                 hv = (size_t)llm_ssm_head_v(hp);
    size_t bytes = 4 * 256 + (C * hp->ssm_conv_kernel + 2 * nv + hv) * sizeof(float);
    for (int i = 0; i < 5; i++) bytes += wview_bytes(v[i]) + 256;
    *dnb = aligned_alloc(256, (bytes + 255) / 256 * 256);
    cr_assert(*dnb);
    void *at = *dnb;
    for (int i = 0; i < 5; i++) {
        *d[i] = *v[i];
        d[i]->data = hl_copy(&at, v[i]->data, wview_bytes(v[i]));
    }
    w->dn.conv = hl_copy(&at, L->ssm_conv, C * hp->ssm_conv_kernel * sizeof(float));
    w->dn.dt = hl_copy(&at, L->ssm_dt, nv * sizeof(float));
    w->dn.a = hl_copy(&at, L->ssm_a, nv * sizeof(float));
    w->dn.norm = hl_copy(&at, L->ssm_norm, hv * sizeof(float));
}

/* Two backends as a GPU engine has them: `dev` (the device's stand-in: the KV cache, the head, the recurrent
 * layers it computes with its own state) and `host` (packed blocks, KV ops sent to dev, the engine's
 * seq_state); and the reference: the plain CPU forward alone. */
struct hl {
    struct model_file *mf;
    struct model m;
    struct kv_cache kv_ref, kv_dev;
    struct seq_state st_ref, st_dev, st_eng; /* the reference's; the device's; the engine's (host layers) */
    struct backend *ref, *dev, *host;
    struct layer_weights *w;
    void **blocks;
};

static struct backend *hl_backend(struct hl *h, struct kv_cache *kv, struct backend *owner,
                                  const struct layer_weights *w, struct seq_state *st)
{
    struct forward_cpu_params p = forward_cpu_default_params();
    p.max_tokens = HL_ROWS;
    p.n_threads = owner ? 3 : 2;
    p.kv = kv;
    p.kv_owner = owner;
    p.weights = w;
    p.state = st;
    struct backend *be = NULL;
    cr_assert_eq(forward_cpu_init(&be, &h->m, &p), FERRY_OK);
    return be;
}

static int hl_open(struct hl *h)
{
    memset(h, 0, sizeof *h);
    char path[1024], err[256] = "";
    snprintf(path, sizeof path, "%s/tests/golden/models/qwen35_deltanet_f16.gguf", getenv("FERRY_SRC"));
    if (model_file_open(path, &h->mf, NULL, NULL, err)) return 0;
    cr_assert_eq(model_init(&h->m, h->mf, err), FERRY_OK, "%s", err);
    const struct llm_hparams *hp = &h->m.hp;
    const int L = hp->n_layers;
    for (int i = 0; i < 2; i++)
        cr_assert_eq(kv_cache_init(i ? &h->kv_dev : &h->kv_ref, llm_kv_cache_layers(hp),
                                   llm_kv_cache_heads(hp), hp->head_dim, HL_SEQS, 64, 128, 16, KV_F32),
                     FERRY_OK);
    const struct seq_state_params sp = {.n_ckpt = 4};
    cr_assert_eq(seq_state_init(&h->st_ref, hp, HL_SEQS, sp), FERRY_OK);
    cr_assert_eq(seq_state_init(&h->st_dev, hp, HL_SEQS, sp), FERRY_OK);
    cr_assert_eq(seq_state_init(&h->st_eng, hp, HL_SEQS, sp), FERRY_OK);
    cr_assert_gt(h->st_eng.n_layers, 1);
    h->w = calloc((size_t)L, sizeof *h->w);
    h->blocks = calloc(2 * (size_t)L, sizeof *h->blocks);
    for (int l = 0; l < L; l++) hl_pack(&h->m, l, &h->w[l], &h->blocks[2 * l], &h->blocks[2 * l + 1]);
    h->ref = hl_backend(h, &h->kv_ref, NULL, NULL, &h->st_ref);
    h->dev = hl_backend(h, &h->kv_dev, NULL, NULL, &h->st_dev);
    h->host = hl_backend(h, NULL, h->dev, h->w, &h->st_eng);
    return 1;
}

static void hl_close(struct hl *h)
{
    h->host->ops->free(h->host);
    h->dev->ops->free(h->dev);
    h->ref->ops->free(h->ref);
    for (int l = 0; l < h->m.hp.n_layers; l++) free(h->blocks[2 * l]), free(h->blocks[2 * l + 1]);
    free(h->blocks);
    free(h->w);
    seq_state_free(&h->st_ref), seq_state_free(&h->st_dev), seq_state_free(&h->st_eng);
    kv_cache_free(&h->kv_ref), kv_cache_free(&h->kv_dev);
    model_free(&h->m);
    model_file_close(h->mf);
}

/* One step through be[owner[l]] per layer (x moving between backends as runtime/engine.c moves it), the
 * head on be[0]. */
static void hl_walk(struct backend **be, const int *owner, const struct step *st, float *logits, int L)
{
    struct backend *cur = be[owner[0]];
    for (int i = 0; i < 2; i++)
        if (be[i]) cr_assert_eq(be[i]->ops->begin(be[i], st), 0);
    cr_assert_eq(cur->ops->embed(cur, st), 0);
    const int n = st->b->n_tokens;
    for (int l = 0; l < L; l++) {
        struct backend *b = be[owner[l]];
        if (b != cur) {
            float *x = b->ops->x_host(b);
            cr_assert_eq(cur->ops->x_out(cur, x, n), 0);
            cr_assert_eq(b->ops->x_in(b, x, n), 0);
            cur = b;
        }
        cr_assert_eq(b->ops->layer(b, l, st), 0, "layer %d", l);
    }
    if (cur != be[0]) {
        float *x = be[0]->ops->x_host(be[0]);
        cr_assert_eq(cur->ops->x_out(cur, x, n), 0);
        cr_assert_eq(be[0]->ops->x_in(be[0], x, n), 0);
    }
    cr_assert_eq(be[0]->ops->head(be[0], st, logits), 0);
}

/* The device's part of a slot's state into the engine's slot block (before a checkpoint: dir 1) or out of it
 * (after a restore: dir 0), as forward_cuda_state_get/put move it: the layers the device computes only. */
static void hl_state_move(struct hl *h, const int *owner, int seq, int dir)
{
    const struct seq_state *s = &h->st_eng;
    const size_t per = (s->conv_floats + s->rec_floats) * sizeof(float);
    for (int l = 0; l < h->m.hp.n_layers; l++) {
        if (s->slot[l] < 0 || owner[l] != 0) continue;
        float *eng = seq_state_conv(&h->st_eng, seq, l), *dev = seq_state_conv(&h->st_dev, seq, l);
        memcpy(dir ? eng : dev, dir ? dev : eng, per);
    }
}

/* A run of both slots: a prefill of 7 and 5 tokens together, checkpoints, three decode steps of both, slot 0
 * sent back to its checkpoint and two steps more (slot 0 on other tokens, slot 1 going on). The pair's
 * recurrent layers run where rec_owner says for the whole run (1: the host), the attention layer on either
 * side by turns; every logit is bitwise the reference's. */
static void hl_run(struct hl *h, const int *rec_owner)
{
    const struct llm_hparams *hp = &h->m.hp;
    const int L = hp->n_layers, V = hp->n_vocab;
    float *want = malloc(sizeof(float) * HL_ROWS * (size_t)V),
          *got = malloc(sizeof(float) * HL_ROWS * (size_t)V);
    int32_t tok[HL_ROWS], pos[HL_ROWS], seq[HL_ROWS];
    uint8_t wl[HL_ROWS];
    int len[HL_SEQS] = {0, 0};
    struct backend *ref[2] = {h->ref, NULL}, *pair[2] = {h->dev, h->host};
    int own_ref[64] = {0}, owner[64];
    cr_assert_leq(L, 64);
    for (int s = 0; s < HL_SEQS; s++) {
        kv_cache_seq_free(&h->kv_ref, s), kv_cache_seq_free(&h->kv_dev, s);
        seq_state_drop(&h->st_ref, s), seq_state_drop(&h->st_eng, s);
    }
    for (int step = 0; step < 7; step++) {
        int n = 0;
        const int rewind = step == 5;
        for (int s = 0; s < HL_SEQS; s++) {
            if (rewind && s == 0) { /* back to the checkpoint saved after the prefill */
                const int at = seq_state_restore(&h->st_ref, 0, 7);
                cr_assert_eq(at, 7);
                cr_assert_eq(seq_state_restore(&h->st_eng, 0, 7), 7);
                hl_state_move(h, owner, 0, 0);
                kv_cache_trim(&h->kv_ref, 0, 7), kv_cache_trim(&h->kv_dev, 0, 7);
                len[0] = 7;
            }
            const int rows = step == 0 ? 7 - 2 * s : 1;
            for (int i = 0; i < rows; i++, n++) {
                pos[n] = len[s] + i, seq[n] = s, wl[n] = 1;
                tok[n] = (int32_t)((pos[n] * 37 + s * 11 + (step >= 5 && s == 0 ? 5 : 0) + 3) % V);
            }
            len[s] += rows;
            cr_assert_eq(kv_cache_reserve(&h->kv_ref, s, len[s]), 0);
            cr_assert_eq(kv_cache_reserve(&h->kv_dev, s, len[s]), 0);
        }
        for (int l = 0; l < L; l++)
            owner[l] =
                llm_layer_is_recurrent(hp, l) ? rec_owner[l] : (step + l) % 2; /* attention: by turns */
        const struct batch b = {.n_tokens = n, .tokens = tok, .pos = pos, .seq = seq, .want_logits = wl};
        const struct step st = {.b = &b, .max_len = len[0] > len[1] ? len[0] : len[1], .n_out = n};
        memset(got, 0xff, sizeof(float) * (size_t)n * V); /* NaN: a row never written fails */
        hl_walk(ref, own_ref, &st, want, L);
        hl_walk(pair, owner, &st, got, L);
        for (int r = 0; r < n; r++)
            cr_assert_eq(memcmp(want + (size_t)r * V, got + (size_t)r * V, sizeof(float) * V), 0,
                         "step %d, row %d (slot %d, position %d) differs", step, r, seq[r], pos[r]);
        if (step == 0) /* checkpoints where the prefill ends, as the engine saves them */
            for (int s = 0; s < HL_SEQS; s++) {
                cr_assert(seq_state_save(&h->st_ref, s, len[s]));
                hl_state_move(h, owner, s, 1);
                cr_assert(seq_state_save(&h->st_eng, s, len[s]));
            }
    }
    /* The host's layers' live state is the engine's, the device's layers' the device's: each bitwise the
     * reference's. */
    for (int s = 0; s < HL_SEQS; s++)
        for (int l = 0; l < L; l++) {
            if (!llm_layer_is_recurrent(hp, l)) continue;
            const struct seq_state *live = rec_owner[l] ? &h->st_eng : &h->st_dev;
            const size_t bytes = (live->conv_floats + live->rec_floats) * sizeof(float);
            cr_assert_eq(memcmp(seq_state_conv(live, s, l), seq_state_conv(&h->st_ref, s, l), bytes), 0,
                         "slot %d, layer %d: the live state differs from the reference's", s, l);
        }
    free(want), free(got);
}

/* A GPU engine's recurrent host layers computed by the host's cores (CPU-only): the CPU backend reads their
 * mixer from packed blocks and keeps their state in the engine's seq_state, while the "device" (here a
 * second CPU backend lending its KV cache, as in test_host_layers) keeps the state of the recurrent layers
 * it computes. Over a multi-step run of two slots with checkpoints and a restore that puts both sides back,
 * the logits are bitwise those of the plain CPU forward: every recurrent layer on the host; the first on the
 * device and the others on the host. The host backend's timing of a recurrent layer (the step planner's
 * cost) runs its products and leaves every slot's state as it was. */
Test(dn_checkpoints, recurrent_host_layers_on_packed_blocks_match_the_cpu_forward)
{
    struct hl h;
    if (!hl_open(&h)) cr_skip_test("tests/golden/models/qwen35_deltanet_f16.gguf is missing");
    const struct llm_hparams *hp = &h.m.hp;
    int all_host[64], first_dev[64];
    int first = -1;
    for (int l = 0; l < hp->n_layers; l++) {
        all_host[l] = 1;
        if (llm_layer_is_recurrent(hp, l) && first < 0) first = l;
        first_dev[l] = l != first;
    }
    hl_run(&h, all_host);
    hl_run(&h, first_dev);
    /* The timing reads the block's products and no state. */
    const size_t all = (size_t)HL_SEQS * h.st_eng.n_layers * (h.st_eng.conv_floats + h.st_eng.rec_floats);
    float *before = malloc(all * sizeof(float));
    memcpy(before, h.st_eng.data, all * sizeof(float));
    int rec[64], n_rec = 0;
    for (int l = 0; l < hp->n_layers; l++)
        if (llm_layer_is_recurrent(hp, l)) rec[n_rec++] = l;
    double t = 0;
    cr_assert_eq(forward_cpu_time_layers(h.host, rec, n_rec, 3, 3, &t), FERRY_OK);
    cr_assert_gt(t, 0);
    cr_assert_eq(memcmp(before, h.st_eng.data, all * sizeof(float)), 0, "timing touched the state");
    free(before);
    /* Without a seq_state the host's backend refuses a model with recurrent layers. */
    struct forward_cpu_params p = forward_cpu_default_params();
    p.kv_owner = h.dev;
    p.weights = h.w;
    struct backend *x = NULL;
    cr_assert_eq(forward_cpu_init(&x, &h.m, &p), FERRY_ERR_UNSUPPORTED);
    hl_close(&h);
}
