/* test_swa_pool — the sliding-window layers' own KV pool (runtime/engine.h engine_kv_cache): on the tiny
 * committed checkpoints with windows (gemma3 16 positions, 5 of 6 layers local; gpt-oss 16 with sinks, every
 * other layer; phi3 24, every layer; gemma4 16 and 12 with KV-sharing layers), a sequence fed far past its
 * window holds a bounded number of the window pool's blocks, and its logits are bitwise those of an engine
 * whose window layers keep every position (engine_params.swa_full, llama.cpp's --swa-full): the window pool
 * only gives back blocks the window no longer reads. Rollbacks (speculative decoding's rejected drafts),
 * prompt reuse and prefix sharing between slots after the window moved agree with the full cache too, or fall
 * back to starting again where the pool no longer holds the window. The kv_cache dropping itself is tested on
 * its own at the end. The golden tests (test_golden) hold these checkpoints to transformers.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/core/status.h"
#include "runtime/engine.h"
#include "runtime/kv_cache.h"

#define CTX    320
#define SWA(e) engine_kv_cache(e, 1)
#define KV(e)  engine_kv_cache(e, 0)
#define ROWS   32 /* max_batch_tokens */

struct pair {
    struct model_file *mf;
    struct engine *win, *full; /* the window pool, and every position kept */
    int V, window;
};

static int open_pair(struct pair *t, const char *name, int n_seqs)
{
    char path[1024], err[256] = "";
    snprintf(path, sizeof path, "%s/tests/golden/models/%s", getenv("FERRY_SRC"), name);
    memset(t, 0, sizeof *t);
    if (model_file_open(path, &t->mf, NULL, NULL, err)) {
        cr_log_warn("skipped: %s is missing (%s)", path, err);
        return 0;
    }
    struct engine_params p = engine_default_params(); /* the KV cache in f16 */
    p.backend = ENGINE_BACKEND_CPU;
    p.n_seqs = n_seqs;
    p.ctx_size = CTX;
    p.n_threads = 2;
    p.max_batch_tokens = ROWS;
    cr_assert_eq(engine_init(&t->win, t->mf, &p, err), FERRY_OK, "%s: %s", name, err);
    /* What ferry inspect reports (engine_kv_bytes) is what the engines allocate. */
    uint64_t all_b, swa_b;
    engine_kv_bytes(engine_hparams(t->win), &p, &all_b, &swa_b);
    cr_assert_eq(all_b, kv_cache_bytes(KV(t->win), KV_F16));
    cr_assert_eq(swa_b, kv_cache_bytes(SWA(t->win), KV_F16));
    p.swa_full = 1;
    cr_assert_eq(engine_init(&t->full, t->mf, &p, err), FERRY_OK, "%s: %s", name, err);
    engine_kv_bytes(engine_hparams(t->full), &p, &all_b, &swa_b);
    cr_assert_eq(all_b, kv_cache_bytes(KV(t->full), KV_F16));
    cr_assert_eq(swa_b, 0);
    t->V = engine_hparams(t->win)->n_vocab;
    t->window = engine_hparams(t->win)->sliding_window;
    cr_assert_gt(t->window, 0, "%s has no sliding window", name);
    const struct kv_cache *swa = engine_kv_cache(t->win, 1), *all = engine_kv_cache(t->full, 0);
    cr_assert(swa, "%s: no window pool", name);
    cr_assert_null(engine_kv_cache(t->full, 1), "%s: swa_full has a window pool", name);
    cr_assert_eq(engine_kv_cache(t->win, 0)->n_layers + swa->n_layers, all->n_layers);
    cr_assert_gt(swa->n_layers, 0);
    cr_assert_lt(swa->n_blocks, all->n_blocks);
    return 1;
}

static void close_pair(struct pair *t)
{
    engine_free(t->win);
    engine_free(t->full);
    model_file_close(t->mf);
}

static int32_t token_at(const struct pair *t, int seq, int pos)
{
    return (int32_t)((pos * 37 + seq * 101 + 11) % t->V);
}

/* Feeds positions [from, to) of slot seq to e in steps of `chunk` rows (the last row of each wants logits),
 * the last step's into logits. */
static void feed(const struct pair *t, struct engine *e, int seq, int from, int to, int chunk, float *logits)
{
    int32_t tok[ROWS], pos[ROWS], sq[ROWS];
    uint8_t want[ROWS];
    for (int p0 = from; p0 < to; p0 += chunk) {
        const int n = to - p0 < chunk ? to - p0 : chunk;
        for (int i = 0; i < n; i++)
            tok[i] = token_at(t, seq, p0 + i), pos[i] = p0 + i, sq[i] = seq, want[i] = i == n - 1;
        struct batch b = {.n_tokens = n, .tokens = tok, .pos = pos, .seq = sq, .want_logits = want};
        cr_assert_eq(engine_step(e, &b, logits), FERRY_OK, "step at %d", p0);
    }
}

/* Both engines fed the same, logits compared bitwise. */
static void feed_both(struct pair *t, int seq, int from, int to, int chunk, float *a, float *b)
{
    for (int p0 = from; p0 < to; p0 += chunk) {
        const int end = to - p0 < chunk ? to : p0 + chunk;
        feed(t, t->win, seq, p0, end, chunk, a);
        feed(t, t->full, seq, p0, end, chunk, b);
        cr_assert_eq(memcmp(a, b, (size_t)t->V * sizeof(float)), 0, "logits differ after position %d",
                     end - 1);
    }
}

/* Blocks the slot holds in the window pool. */
static int swa_held(const struct engine *e, int seq)
{
    return SWA(e)->n_held[seq] - SWA(e)->lo[seq];
}

/* 300 positions (a 100-position prompt in steps of 32, then one at a time) with a window of 16: identical
 * logits at every step, and the window pool's blocks stay within its per-slot bound. */
static void check_long(const char *name)
{
    struct pair t;
    if (!open_pair(&t, name, 1)) return;
    float *a = malloc((size_t)t.V * sizeof(float)), *b = malloc((size_t)t.V * sizeof(float));
    const int bound = (t.window - 1 + ENGINE_SWA_SLACK + ROWS + ENGINE_KV_BLOCK - 1) / ENGINE_KV_BLOCK + 1;
    cr_assert_eq(SWA(t.win)->n_blocks, bound, "%s: the pool is one slot's bound", name);
    feed_both(&t, 0, 0, 100, ROWS, a, b);
    for (int p = 100; p < 300; p++) {
        feed_both(&t, 0, p, p + 1, 1, a, b);
        cr_assert_leq(swa_held(t.win, 0), bound, "%s: %d blocks held at %d", name, swa_held(t.win, 0), p);
        cr_assert_eq(SWA(t.win)->n_blocks - SWA(t.win)->n_free, swa_held(t.win, 0));
    }
    /* What stays is the window and the slack, no more. */
    const int need = (t.window - 1 + ENGINE_SWA_SLACK + ENGINE_KV_BLOCK - 1) / ENGINE_KV_BLOCK + 1;
    cr_assert_leq(swa_held(t.win, 0), need, "%s: %d blocks held", name, swa_held(t.win, 0));
    cr_assert_gt(kv_cache_held_from(SWA(t.win), 0), 0, "%s: nothing was given back", name);
    cr_assert_eq(KV(t.full)->n_held[0], 300 / ENGINE_KV_BLOCK + 1);
    cr_assert_eq(KV(t.win)->n_held[0], 300 / ENGINE_KV_BLOCK + 1, "the global layers keep every position");
    engine_seq_free(t.win, 0);
    cr_assert_eq(SWA(t.win)->n_free, SWA(t.win)->n_blocks);
    cr_assert_eq(KV(t.win)->n_free, KV(t.win)->n_blocks);
    free(a);
    free(b);
    close_pair(&t);
}

Test(swa_pool, gemma3_long_sequence)
{
    check_long("gemma3_swa_f32");
}
Test(swa_pool, gptoss_long_sequence)
{
    check_long("gptoss_yarn_f16");
}
Test(swa_pool, phi3_every_layer_local)
{
    check_long("phi3_fused_bf16");
}
Test(swa_pool, gemma4_long_sequence)
{
    check_long("gemma4_kv_f32.gguf");
}
Test(swa_pool, gemma4_shared_kv_layers)
{
    check_long("gemma4_ple_f32.gguf");
}

/* Speculative decoding's rollback after the window moved: 8 drafted rows, 5 rejected, then decoding goes on
 * as with the full cache; a rollback further back than the pool holds starts the slot again (0), as
 * engine_seq_reusable says beforehand. */
Test(swa_pool, rollback_after_the_window_moved)
{
    struct pair t;
    if (!open_pair(&t, "gemma3_swa_f32", 1)) return;
    float *a = malloc((size_t)t.V * sizeof(float)), *b = malloc((size_t)t.V * sizeof(float));
    feed_both(&t, 0, 0, 200, ROWS, a, b);
    for (int r = 0; r < 4; r++) {
        const int len = engine_seq_len(t.win, 0);
        feed_both(&t, 0, len, len + 8, 8, a, b); /* the drafts */
        cr_assert_eq(engine_seq_reusable(t.win, 0, len + 3), len + 3);
        cr_assert_eq(engine_seq_keep(t.win, 0, len + 3), len + 3);
        cr_assert_eq(engine_seq_keep(t.full, 0, len + 3), len + 3);
        feed_both(&t, 0, len + 3, len + 6, 1, a, b);
    }
    /* As far back as the slack allows, and one further. */
    const int len = engine_seq_len(t.win, 0), from = kv_cache_held_from(SWA(t.win), 0);
    const int ok = from + t.window - 1;
    cr_assert_geq(ok, len - ENGINE_SWA_SLACK - ENGINE_KV_BLOCK);
    cr_assert_leq(ok, len - ENGINE_SWA_SLACK);
    cr_assert_eq(engine_seq_reusable(t.win, 0, ok), ok);
    cr_assert_eq(engine_seq_reusable(t.win, 0, ok - 1), 0);
    cr_assert_eq(engine_seq_reusable(t.full, 0, ok - 1), ok - 1);
    cr_assert_eq(engine_seq_keep(t.win, 0, ok), ok);
    cr_assert_eq(engine_seq_keep(t.full, 0, ok), ok);
    feed_both(&t, 0, ok, ok + 20, 1, a, b);
    const int back = engine_seq_len(t.win, 0) - ENGINE_SWA_SLACK - t.window - ENGINE_KV_BLOCK;
    cr_assert_eq(engine_seq_keep(t.win, 0, back), 0, "the window before %d is gone", back);
    cr_assert_eq(engine_seq_len(t.win, 0), 0);
    cr_assert_eq(SWA(t.win)->n_free, SWA(t.win)->n_blocks);
    cr_assert_eq(KV(t.win)->n_free, KV(t.win)->n_blocks);
    /* A rewind into the dropped part is refused; to 0 starts again. */
    engine_seq_free(t.full, 0);
    feed_both(&t, 0, 0, 150, ROWS, a, b);
    int32_t tok = 1, pos = 20, seq = 0;
    uint8_t w = 1;
    struct batch bad = {.n_tokens = 1, .tokens = &tok, .pos = &pos, .seq = &seq, .want_logits = &w};
    cr_assert_eq(engine_step(t.win, &bad, a), FERRY_ERR_INVALID);
    cr_assert_eq(engine_seq_len(t.win, 0), 150);
    feed_both(&t, 0, 0, 40, ROWS, a, b); /* a rewind to 0 */
    feed_both(&t, 0, 40, 60, 1, a, b);
    free(a);
    free(b);
    close_pair(&t);
}

/* Prompt-prefix sharing between slots after the window moved: the shared blocks the window still reads are
 * held by both slots, and the second slot goes on as with the full cache; a prefix whose window is gone is
 * not shared (0), and the first slot's pool rows are untouched. */
Test(swa_pool, shared_prefix_with_the_window)
{
    struct pair t;
    if (!open_pair(&t, "gemma3_swa_f32", 2)) return;
    float *a = malloc((size_t)t.V * sizeof(float)), *b = malloc((size_t)t.V * sizeof(float));
    feed_both(&t, 0, 0, 200, ROWS, a, b);
    const int n = engine_seq_share(t.win, 0, 1, 198);
    cr_assert_eq(n, 192);
    cr_assert_eq(engine_seq_share(t.full, 0, 1, 198), 192);
    cr_assert_eq(kv_cache_held_from(SWA(t.win), 1), kv_cache_held_from(SWA(t.win), 0));
    cr_assert(kv_cache_shared(SWA(t.win), 1, 191));
    /* Slot 1 continues its own way (its tokens differ from slot 0's from 192 on); slot 0 goes on too. */
    feed_both(&t, 1, 192, 260, ROWS, a, b);
    feed_both(&t, 0, 200, 230, 1, a, b);
    feed_both(&t, 1, 260, 270, 1, a, b);
    /* Slot 0 is at 230: a prefix of 100 is before its window's pool. */
    cr_assert_eq(engine_seq_share(t.win, 0, 1, 100), 0);
    cr_assert_eq(engine_seq_len(t.win, 1), 0);
    cr_assert_eq(engine_seq_share(t.full, 0, 1, 100), 96);
    feed_both(&t, 0, 230, 240, 1, a, b);
    free(a);
    free(b);
    close_pair(&t);
}

/* kv_cache_drop: blocks wholly before a position go back to the free list, their entries -1; the last block
 * stays; trim and share respect the dropped entries. */
Test(swa_pool, kv_cache_drop)
{
    struct kv_cache kv;
    cr_assert_eq(kv_cache_init(&kv, 1, 1, 8, 2, 64, 4 * 12, 4, KV_F32), 0);
    cr_assert_eq(kv_cache_reserve(&kv, 0, 40), 0); /* blocks 0-9 */
    cr_assert_eq(kv.n_free, 2);
    kv_cache_drop(&kv, 0, 17); /* blocks 0-3 end at or before 17 */
    cr_assert_eq(kv_cache_held_from(&kv, 0), 16);
    cr_assert_eq(kv.n_free, 6);
    for (int i = 0; i < 4; i++) cr_assert_eq(kv.block_table[i], -1);
    cr_assert_eq(kv.block_table[4], 4);
    cr_assert_not(kv_cache_shared(&kv, 0, 3));
    kv_cache_drop(&kv, 0, 15); /* behind what was dropped: nothing */
    cr_assert_eq(kv.n_free, 6);
    /* Share 8 blocks: slot 1's row has the same dropped entries, and holds blocks 4-7. */
    cr_assert_eq(kv_cache_share(&kv, 0, 1, 4), FERRY_ERR_INVALID); /* all of them dropped */
    cr_assert_eq(kv_cache_share(&kv, 0, 1, 8), 0);
    cr_assert_eq(kv_cache_held_from(&kv, 1), 16);
    cr_assert(kv_cache_shared(&kv, 0, 16));
    cr_assert_eq(kv.ref[4], 2);
    cr_assert_eq(kv.n_free, 6);
    /* Trimming slot 1 to within the dropped part empties it; the shared blocks stay with slot 0. */
    kv_cache_trim(&kv, 1, 12);
    cr_assert_eq(kv.n_held[1], 0);
    cr_assert_eq(kv_cache_held_from(&kv, 1), 0);
    cr_assert_eq(kv.ref[4], 1);
    cr_assert_eq(kv.n_free, 6);
    /* Dropping past the end keeps the last block. */
    kv_cache_drop(&kv, 0, 1000);
    cr_assert_eq(kv.n_held[0], 10);
    cr_assert_eq(kv_cache_held_from(&kv, 0), 36);
    cr_assert_eq(kv.n_free, 11);
    cr_assert_eq(kv_cache_reserve(&kv, 0, 44), 0); /* grows after the dropped entries */
    cr_assert_eq(kv.n_held[0], 11);
    kv_cache_trim(&kv, 0, 38); /* keeps block 9 */
    cr_assert_eq(kv.n_held[0], 10);
    cr_assert_eq(kv.n_free, 11);
    kv_cache_seq_free(&kv, 0);
    cr_assert_eq(kv.n_free, 12);
    cr_assert_eq(kv.lo[0], 0);
    for (int i = 0; i < 10; i++) cr_assert_eq(kv.block_table[i], -1);
    kv_cache_free(&kv);
}
