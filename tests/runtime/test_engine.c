/* test_engine — the engine seam: batching many sequences equals running them one at a time, the KV pool
 * is all-or-nothing per step, and bad batches are refused without damage. Uses the tiny committed model. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/core/status.h"
#include "runtime/engine.h"
#include "runtime/forward_cuda.h"
#include "runtime/kv_cache.h"

static struct model_file *mf;

static struct engine *open_engine(int n_seqs, int kv_tokens, int threads)
{
    char path[1024], err[256] = "";
    snprintf(path, sizeof path, "%s/tests/golden/models/llama3_gqa_f16", getenv("FERRY_SRC"));
    if (!mf) cr_assert_eq(model_file_open(path, &mf, NULL, NULL, err), 0, "%s", err);
    struct engine_params p = engine_default_params();
    p.backend =
        ENGINE_BACKEND_CPU; /* the reference backend; tests/runtime/test_gpu_e2e.c compares CUDA to it */
    p.n_seqs = n_seqs;
    p.ctx_size = 256;
    p.kv_tokens = kv_tokens;
    p.n_threads = threads;
    p.max_batch_tokens = 128;
    struct engine *e = NULL;
    cr_assert_eq(engine_init(&e, mf, &p, err), 0, "%s", err);
    return e;
}

static void close_all(struct engine *e)
{
    engine_free(e);
    model_file_close(mf);
    mf = NULL;
}

static int step1(struct engine *e, int seq, int pos, int32_t tok, float *logits)
{
    uint8_t w = 1;
    struct batch b = {.n_tokens = 1, .tokens = &tok, .pos = &pos, .seq = &seq, .want_logits = &w};
    return engine_step(e, &b, logits);
}

/* Three sequences of different lengths, prefilled and decoded interleaved in shared batches, give the
 * same logits as each sequence alone. */
Test(engine, batched_equals_sequential)
{
    struct engine *e = open_engine(3, 0, 2);
    const int V = engine_hparams(e)->n_vocab;
    enum { L0 = 5, L1 = 17, L2 = 40 };
    const int lens[3] = {L0, L1, L2};
    int32_t prompts[3][64];
    for (int s = 0; s < 3; s++)
        for (int i = 0; i < lens[s]; i++) prompts[s][i] = (int32_t)((s * 37 + i * 11 + 3) % V);
    /* Alone: last-position logits for each prompt, then 4 more steps feeding fixed tokens. */
    float *alone = malloc((size_t)3 * 5 * V * sizeof(float));
    for (int s = 0; s < 3; s++) {
        engine_seq_free(e, 0);
        for (int i = 0; i < lens[s]; i++)
            cr_assert_eq(step1(e, 0, i, prompts[s][i], alone + ((size_t)s * 5) * V), 0);
        for (int k = 1; k < 5; k++)
            cr_assert_eq(step1(e, 0, lens[s] + k - 1, (int32_t)(k * 7 % V), alone + ((size_t)s * 5 + k) * V),
                         0);
    }
    engine_seq_free(e, 0);
    /* Together: one batch with all three prompts, then batches of one decode token per sequence. */
    int32_t tok[128], pos[128], seq[128];
    uint8_t want[128];
    int n = 0;
    for (int i = 0; i < L2; i++)
        for (int s = 0; s < 3; s++)
            if (i < lens[s]) {
                tok[n] = prompts[s][i], pos[n] = i, seq[n] = s, want[n] = i == lens[s] - 1;
                n++;
            }
    float *together = malloc((size_t)3 * V * sizeof(float));
    struct batch b = {.n_tokens = n, .tokens = tok, .pos = pos, .seq = seq, .want_logits = want};
    cr_assert_eq(engine_step(e, &b, together), 0);
    /* Rows come out in batch order: the order in which each prompt's last token appears. */
    int order[3], k = 0;
    for (int i = 0; i < n; i++)
        if (want[i]) order[k++] = seq[i];
    for (int r = 0; r < 3; r++)
        for (int v = 0; v < V; v++)
            cr_assert_float_eq(together[(size_t)r * V + v], alone[((size_t)order[r] * 5) * V + v], 1e-4,
                               "prefill seq %d logit %d", order[r], v);
    for (int kk = 1; kk < 5; kk++) {
        /* Row s carries sequence 2-s: the batch order differs from the slot order on purpose. */
        for (int s = 0; s < 3; s++)
            tok[s] = (int32_t)(kk * 7 % V), pos[s] = lens[2 - s] + kk - 1, seq[s] = 2 - s, want[s] = 1;
        b.n_tokens = 3;
        cr_assert_eq(engine_step(e, &b, together), 0);
        for (int s = 0; s < 3; s++)
            for (int v = 0; v < V; v++)
                cr_assert_float_eq(together[(size_t)s * V + v], alone[((size_t)(2 - s) * 5 + kk) * V + v],
                                   1e-4, "decode step %d seq %d logit %d", kk, 2 - s, v);
    }
    free(alone);
    free(together);
    close_all(e);
}

Test(engine, pool_exhaustion_keeps_state)
{
    /* 3 blocks of 16 positions for two slots. */
    struct engine *e = open_engine(2, 48, 1);
    const int V = engine_hparams(e)->n_vocab;
    float *lg = malloc((size_t)V * sizeof(float) * 64);
    int32_t tok[64], pos[64], seq[64];
    uint8_t want[64] = {0};
    for (int i = 0; i < 40; i++) tok[i] = i % V, pos[i] = i, seq[i] = 0;
    struct batch b = {.n_tokens = 40, .tokens = tok, .pos = pos, .seq = seq, .want_logits = want};
    cr_assert_eq(engine_step(e, &b, lg), 0);
    struct engine_stats st;
    engine_get_stats(e, &st);
    cr_assert_eq(st.kv_blocks_used, 3);
    /* Slot 1 needs a block; none is left: refused, and slot 0 is untouched. */
    for (int i = 0; i < 2; i++) tok[i] = 5, pos[i] = i, seq[i] = 1;
    b.n_tokens = 2;
    cr_assert_eq(engine_step(e, &b, lg), FERRY_ERR_RANGE);
    cr_assert_eq(engine_seq_len(e, 0), 40);
    cr_assert_eq(engine_seq_len(e, 1), 0);
    engine_get_stats(e, &st);
    cr_assert_eq(st.kv_blocks_used, 3);
    /* Freeing slot 0 returns its blocks; slot 1 then fits. */
    cr_assert_eq(engine_seq_free(e, 0), 0);
    engine_get_stats(e, &st);
    cr_assert_eq(st.kv_blocks_used, 0);
    cr_assert_eq(engine_step(e, &b, lg), 0);
    cr_assert_eq(engine_seq_len(e, 1), 2);
    free(lg);
    close_all(e);
}

Test(engine, bad_batches_are_refused)
{
    struct engine *e = open_engine(2, 0, 1);
    const int V = engine_hparams(e)->n_vocab;
    float *lg = malloc((size_t)V * sizeof(float));
    cr_assert_eq(step1(e, 0, 0, V, lg), FERRY_ERR_INVALID);   /* token id out of range */
    cr_assert_eq(step1(e, 0, 0, -1, lg), FERRY_ERR_INVALID);  /* negative id */
    cr_assert_eq(step1(e, 2, 0, 1, lg), FERRY_ERR_INVALID);   /* no such slot */
    cr_assert_eq(step1(e, 0, 1, 1, lg), FERRY_ERR_INVALID);   /* gap: slot 0 is empty */
    cr_assert_eq(step1(e, 0, 256, 1, lg), FERRY_ERR_INVALID); /* gap past the context */
    cr_assert_eq(step1(e, 0, 0, 1, lg), 0);
    cr_assert_eq(step1(e, 0, 1, 2, lg), 0);
    /* Two tokens of one slot out of order in one batch. */
    int32_t tok[2] = {1, 2}, pos[2] = {3, 2}, seq[2] = {0, 0};
    uint8_t want[2] = {0, 1};
    struct batch b = {.n_tokens = 2, .tokens = tok, .pos = pos, .seq = seq, .want_logits = want};
    cr_assert_eq(engine_step(e, &b, lg), FERRY_ERR_INVALID);
    cr_assert_eq(engine_seq_len(e, 0), 2);
    struct batch empty = {.n_tokens = 0};
    cr_assert_eq(engine_step(e, &empty, lg), FERRY_ERR_INVALID);
    free(lg);
    close_all(e);
}

/* Rewinding a slot (rewriting its tail) gives the logits of the rewritten sequence. */
Test(engine, rewind_rewrites_tail)
{
    struct engine *e = open_engine(1, 0, 1);
    const int V = engine_hparams(e)->n_vocab;
    float *a = malloc((size_t)V * sizeof(float)), *b = malloc((size_t)V * sizeof(float));
    for (int i = 0; i < 20; i++) cr_assert_eq(step1(e, 0, i, (int32_t)(i * 3 % V), a), 0);
    /* Rewind to position 10 and write a different token there. */
    cr_assert_eq(step1(e, 0, 10, 99, a), 0);
    cr_assert_eq(engine_seq_len(e, 0), 11);
    engine_seq_free(e, 0);
    for (int i = 0; i < 10; i++) cr_assert_eq(step1(e, 0, i, (int32_t)(i * 3 % V), b), 0);
    cr_assert_eq(step1(e, 0, 10, 99, b), 0);
    for (int v = 0; v < V; v++) cr_assert_eq(a[v], b[v], "logit %d", v);
    free(a);
    free(b);
    close_all(e);
}

/* engine_seq_keep: a sequence kept to its first 12 positions continues exactly as one rebuilt from scratch,
 * and the blocks past them return to the pool. */
Test(engine, keep_prefix_then_continue)
{
    struct engine *e = open_engine(1, 0, 1);
    const int V = engine_hparams(e)->n_vocab;
    float *a = malloc((size_t)V * sizeof(float)), *b = malloc((size_t)V * sizeof(float));
    struct engine_stats st;
    engine_get_stats(e, &st);
    const int free0 = st.kv_blocks_total - st.kv_blocks_used;
    for (int i = 0; i < 60; i++) cr_assert_eq(step1(e, 0, i, (int32_t)(i * 7 % V), a), 0);
    cr_assert_eq(engine_seq_keep(e, 0, 61), FERRY_ERR_INVALID);
    cr_assert_eq(engine_seq_keep(e, 0, 12), 12);
    cr_assert_eq(engine_seq_len(e, 0), 12);
    engine_get_stats(e, &st);
    const int held = st.kv_blocks_used - (st.kv_blocks_total - free0);
    cr_assert_eq(held, (12 + st.kv_block_size - 1) / st.kv_block_size, "blocks held after keep: %d", held);
    for (int i = 12; i < 20; i++) cr_assert_eq(step1(e, 0, i, (int32_t)(i * 5 % V), a), 0);
    engine_seq_free(e, 0);
    for (int i = 0; i < 20; i++)
        cr_assert_eq(step1(e, 0, i, (int32_t)(i < 12 ? i * 7 % V : i * 5 % V), b), 0);
    for (int v = 0; v < V; v++) cr_assert_eq(a[v], b[v], "logit %d", v);
    cr_assert_eq(engine_seq_keep(e, 1, 0), FERRY_ERR_INVALID);
    free(a);
    free(b);
    close_all(e);
}

/* engine_seq_share: a second sequence reads the first one's whole prompt blocks and continues on its own;
 * both give the logits of sequences computed alone; nobody may write into a shared block; the pool counts
 * each shared block once and gets every block back. */
Test(engine, share_prefix_blocks)
{
    struct engine *e = open_engine(3, 0, 1), *ref = open_engine(1, 0, 1);
    const int V = engine_hparams(e)->n_vocab;
    struct engine_stats st;
    engine_get_stats(e, &st);
    const int bs = st.kv_block_size, used0 = st.kv_blocks_used;
    float *a = malloc((size_t)V * sizeof(float)), *b = malloc((size_t)V * sizeof(float));
    const int n = 2 * bs + 5;
    for (int i = 0; i < n; i++) cr_assert_eq(step1(e, 0, i, (int32_t)(i * 7 % V), a), 0);
    cr_assert_eq(engine_seq_share(e, 0, 1, n), 2 * bs, "whole blocks only");
    cr_assert_eq(engine_seq_share(e, 0, 0, n), FERRY_ERR_INVALID);
    engine_get_stats(e, &st);
    cr_assert_eq(st.kv_blocks_used - used0, 3, "sequence 0's 3 blocks, the 2 shared ones counted once");
    /* A write into a shared block is refused, for either sequence. */
    cr_assert_eq(step1(e, 1, bs + 1, 5, a), FERRY_ERR_INVALID);
    cr_assert_eq(step1(e, 0, bs, 5, a), FERRY_ERR_INVALID);
    /* Sequence 1 continues past the shared blocks with tokens of its own; sequence 0 goes on too. */
    for (int i = 2 * bs; i < n + 6; i++) cr_assert_eq(step1(e, 1, i, (int32_t)(i * 11 % V), a), 0);
    for (int i = 0; i < n + 6; i++)
        cr_assert_eq(step1(ref, 0, i, (int32_t)(i < 2 * bs ? i * 7 % V : i * 11 % V), b), 0);
    for (int v = 0; v < V; v++) cr_assert_eq(a[v], b[v], "sequence 1, logit %d", v);
    cr_assert_eq(step1(e, 0, n, 9, a), 0);
    engine_seq_free(ref, 0);
    for (int i = 0; i < n; i++) cr_assert_eq(step1(ref, 0, i, (int32_t)(i * 7 % V), b), 0);
    cr_assert_eq(step1(ref, 0, n, 9, b), 0);
    for (int v = 0; v < V; v++) cr_assert_eq(a[v], b[v], "sequence 0, logit %d", v);
    /* Keeping a position inside a shared block keeps only the whole blocks before it. */
    cr_assert_eq(engine_seq_share(e, 1, 2, 2 * bs), 2 * bs);
    cr_assert_eq(engine_seq_keep(e, 2, bs + 3), bs);
    engine_seq_free(e, 0);
    engine_seq_free(e, 1);
    engine_seq_free(e, 2);
    engine_get_stats(e, &st);
    cr_assert_eq(st.kv_blocks_used, used0, "every block back in the pool");
    free(a);
    free(b);
    engine_free(ref);
    close_all(e);
}

/* --quant int8: the f16 model's matrices whose rows are a multiple of 32 become Q8_0 (2 bytes → 34/32 bytes per
 * weight; here all but ffn_down, whose rows are 136 long), the tied embedding too (llama.cpp's Q8_0 mix), and the
 * logits stay close: Q8_0 rounds each weight to 1/254 of its group's absmax, about 0.5% relative error per
 * product, so the logits of a 2-layer model stay within a few percent of the logit range (measured 5.2%; 4.0%
 * when the embedding was left in f16). */
Test(engine, quant_int8_stays_close)
{
    char path[1024], err[256] = "";
    snprintf(path, sizeof path, "%s/tests/golden/models/llama3_gqa_f16", getenv("FERRY_SRC"));
    struct model_file *f = NULL;
    cr_assert_eq(model_file_open(path, &f, NULL, NULL, err), 0, "%s", err);
    struct engine *e[2];
    for (int q = 0; q < 2; q++) {
        struct engine_params p = engine_default_params();
        p.backend = ENGINE_BACKEND_CPU;
        p.ctx_size = 64;
        p.quant = q ? ENGINE_QUANT_INT8 : ENGINE_QUANT_NONE;
        cr_assert_eq(engine_init(&e[q], f, &p, err), 0, "%s", err);
    }
    double ratio = (double)engine_weight_bytes(e[0]) / (double)engine_weight_bytes(e[1]);
    /* Per layer: q,k,v,o,gate,up shrink by 2*32/34, ffn_down (136x64 f16) stays; the tied head (311x64)
     * shrinks. */
    const double hd = 64, qd = 64, kvd = 16, ffn = 136, V0 = 311;
    const double layer16 = 2 * (qd * hd + 2 * kvd * hd + hd * qd + 2 * ffn * hd), down = 2 * hd * ffn;
    const double want =
        (2 * (layer16 + down) + 2 * V0 * hd) / (2 * (layer16 * 34 / 64 + down) + V0 * hd * 34 / 32);
    cr_expect_float_eq(ratio, want, 1e-6, "f16/int8 weight bytes ratio %g, expected %g", ratio, want);
    const int V = engine_hparams(e[0])->n_vocab;
    float *a = malloc((size_t)V * sizeof(float)), *b = malloc((size_t)V * sizeof(float));
    for (int i = 0; i < 12; i++) {
        cr_assert_eq(step1(e[0], 0, i, (int32_t)(i * 5 % V), a), 0);
        cr_assert_eq(step1(e[1], 0, i, (int32_t)(i * 5 % V), b), 0);
    }
    double maxref = 0, worst = 0, diff_sum = 0;
    for (int v = 0; v < V; v++) {
        maxref = fmax(maxref, fabs(a[v]));
        worst = fmax(worst, fabs(a[v] - b[v]));
        diff_sum += fabs(a[v] - b[v]);
    }
    cr_expect_leq(worst, 0.08 * maxref, "int8 logits differ by %g (max|ref| %g)", worst, maxref);
    cr_expect_gt(diff_sum, 0.0, "quantization changed nothing: the int8 path was not taken");
    free(a);
    free(b);
    engine_free(e[0]);
    engine_free(e[1]);
    model_file_close(f);
}

/* The step plan of the CPU engine: every layer on the CPU at every size, no prediction; sizes outside the
 * engine's range and bad placement parameters are refused. */
Test(engine, step_info_and_placement_parameters)
{
    struct engine *e = open_engine(1, 0, 1);
    struct engine_step_info info;
    const int L = engine_hparams(e)->n_layers;
    for (int n = 1; n <= 128; n++) {
        cr_assert_eq(engine_step_info(e, n, &info), 0);
        cr_assert_geq(info.bucket_tokens, n);
        cr_assert_lt(info.bucket_tokens, 2 * n + (n == 1), "%d tokens in the bucket of %d", n,
                     info.bucket_tokens);
        cr_assert_eq(info.n_cpu, L);
        cr_assert_eq(info.n_gpu + info.n_stream, 0);
        cr_assert_eq(info.predicted_s, 0);
    }
    cr_assert_eq(engine_step_info(e, 0, &info), FERRY_ERR_INVALID);
    cr_assert_eq(engine_step_info(e, 129, &info), FERRY_ERR_INVALID);
    struct engine_stats st;
    engine_get_stats(e, &st);
    cr_assert_eq(st.cpu_threads, 1);
    cr_assert(strstr(engine_placement(e), "cpu: all layers"), "%s", engine_placement(e));
    close_all(e);

    char path[1024], err[256] = "";
    snprintf(path, sizeof path, "%s/tests/golden/models/llama3_gqa_f16", getenv("FERRY_SRC"));
    struct model_file *f = NULL;
    cr_assert_eq(model_file_open(path, &f, NULL, NULL, err), 0, "%s", err);
    struct engine_params p = engine_default_params();
    p.backend = ENGINE_BACKEND_CPU;
    p.placement = (enum engine_placement)7;
    cr_assert_eq(engine_init(&e, f, &p, err), FERRY_ERR_INVALID);
    p.placement = ENGINE_PLACEMENT_CPU;
    p.cpu_threads = -1;
    cr_assert_eq(engine_init(&e, f, &p, err), FERRY_ERR_INVALID);
    /* Placement options mean nothing to the CPU engine: accepted, every layer still on the CPU. */
    p.cpu_threads = 2;
    cr_assert_eq(engine_init(&e, f, &p, err), 0, "%s", err);
    cr_assert_eq(engine_step_info(e, 1, &info), 0);
    cr_assert_eq(info.n_cpu, L);
    engine_free(e);
    /* Asking for the CUDA backend without a device (or without CUDA in the build) fails with a reason. */
    if (forward_cuda_devices() == 0) {
        p.backend = ENGINE_BACKEND_CUDA;
        err[0] = 0;
        cr_assert_eq(engine_init(&e, f, &p, err), FERRY_ERR_UNSUPPORTED);
        cr_assert(strstr(err, "CUDA"), "%s", err);
    }
    model_file_close(f);
}

/* The pool's extension (the GPU backend's host-memory blocks): its blocks are handed out only when no main
 * block is free, and a main block given back is taken again before them. */
Test(kv_cache, extension_blocks_are_taken_last)
{
    struct kv_cache kv;
    cr_assert_eq(kv_cache_init(&kv, 1, 1, 8, 3, 64, 8 * 4, 4, KV_NO_HOST),
                 0);                                                   /* 8 blocks of 4, slots of 16 blocks */
    cr_assert_eq(kv_cache_set_ext(&kv, 3), 0);                         /* blocks 5, 6, 7 */
    cr_assert_eq(kv_cache_reserve(&kv, 0, 4 * 4), 0);
    const int32_t *row0 = kv.block_table, *row1 = kv.block_table + kv.max_blocks;
    for (int i = 0; i < 4; i++) cr_assert_eq(row0[i], i);
    cr_assert_eq(kv_cache_reserve(&kv, 1, 3 * 4), 0); /* the last main block, then the extension's */
    cr_assert_eq(row1[0], 4);
    cr_assert_eq(row1[1], 5);
    cr_assert_eq(row1[2], 6);
    cr_assert_eq(kv.n_free, 1);
    kv_cache_trim(&kv, 0, 4 * 2); /* main blocks 2 and 3 come back */
    kv_cache_trim(&kv, 1, 4 * 2); /* extension block 6 comes back */
    cr_assert_eq(kv.n_free, 4);
    cr_assert_eq(kv_cache_reserve(&kv, 2, 4 * 4), 0);
    const int32_t *row2 = kv.block_table + 2 * kv.max_blocks;
    cr_assert((row2[0] == 2 && row2[1] == 3) || (row2[0] == 3 && row2[1] == 2), "main first: %d %d", row2[0],
              row2[1]);
    cr_assert(row2[2] >= 5 && row2[3] >= 5 && row2[2] != row2[3], "then the extension: %d %d", row2[2],
              row2[3]);
    cr_assert_eq(kv_cache_reserve(&kv, 0, 4 * 3), FERRY_ERR_RANGE); /* empty */
    cr_assert_eq(kv_cache_set_ext(&kv, 1), FERRY_ERR_INVALID);       /* blocks are held */
    for (int s = 0; s < 3; s++) kv_cache_seq_free(&kv, s);
    cr_assert_eq(kv.n_free, 8);
    cr_assert_eq(kv.n_free_ext, 3);
    kv_cache_free(&kv);

    /* A slot that has reached the extension takes its next blocks there while it has any, even when main
     * blocks come free: its extension blocks stay one trailing run. */
    cr_assert_eq(kv_cache_init(&kv, 1, 1, 8, 3, 64, 8 * 4, 4, KV_NO_HOST), 0);
    cr_assert_eq(kv_cache_set_ext(&kv, 3), 0);        /* main 0-4, extension 5-7 */
    cr_assert_eq(kv_cache_reserve(&kv, 0, 5 * 4), 0); /* 0-4 */
    cr_assert_eq(kv_cache_reserve(&kv, 1, 1 * 4), 0); /* 5 */
    kv_cache_trim(&kv, 0, 4 * 3);                     /* main 3 and 4 come back */
    cr_assert_eq(kv_cache_reserve(&kv, 1, 3 * 4), 0);
    const int32_t *r1 = kv.block_table + kv.max_blocks, *r2 = kv.block_table + 2 * kv.max_blocks;
    cr_assert(r1[1] >= 5 && r1[2] >= 5, "the slot left the extension: %d %d %d", r1[0], r1[1], r1[2]);
    cr_assert_eq(kv_cache_ext_first(&kv, 1), 0); /* all three in the extension */
    cr_assert_eq(kv_cache_ext_first(&kv, 0), 3); /* main blocks only */
    cr_assert_eq(kv_cache_reserve(&kv, 2, 1 * 4), 0); /* a new slot starts on the device */
    cr_assert(r2[0] == 3 || r2[0] == 4, "a new slot: %d", r2[0]);
    cr_assert_eq(kv_cache_reserve(&kv, 1, 4 * 4), 0); /* the extension is full: a main block after all */
    cr_assert(r1[3] == 3 || r1[3] == 4, "%d", r1[3]);
    cr_assert_eq(kv_cache_ext_first(&kv, 1), 4); /* its last block is a main one: no trailing run */
    kv_cache_free(&kv);
}
