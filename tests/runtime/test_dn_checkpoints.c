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
 *    every checkpoint, --ctx-checkpoints 0, out-of-range slots and positions.
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
