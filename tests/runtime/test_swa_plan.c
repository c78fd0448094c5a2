/* test_swa_plan — the byte accounting of the sliding-window layers' own KV pool, without a GPU: what
 * engine_kv_bytes reports (`ferry inspect`, and the pools both backends allocate) for a Gemma-3-12B-shaped
 * model at 32k positions and 16 sequences, worked out here from the shapes by hand; and what the device_map
 * planner does with the pool's bytes (runtime/device_map.h kv_swa_bytes): it counts them before anything
 * else, the main pool then holds only the global layers' planes, and the bytes the windows save become
 * positions or resident layers. In a CUDA build (skipped in a CPU-only one) the CUDA backend's own sizes of
 * both pools are checked byte for byte on the tiny Gemma 3 checkpoint, and the offline plan of `ferry inspect
 * --gpu-memory` names the window pool.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/core/status.h"
#include "runtime/device_map.h"
#include "runtime/engine.h"
#include "runtime/forward_cuda.h"
#include "runtime/kv_cache.h"

#define MIB (1024ull * 1024ull)
#define GIB (1024ull * MIB)

/* Gemma 3 12B (its config.json): 48 layers, 8 KV heads of 256, a 1024-position window on 5 of every 6. */
static struct llm_hparams gemma3_12b(void)
{
    struct llm_hparams hp = {.n_vocab = 262208,
                             .dim = 3840,
                             .n_layers = 48,
                             .n_heads = 16,
                             .n_kv_heads = 8,
                             .head_dim = 256,
                             .ffn_dim = 15360,
                             .ctx_train = 131072,
                             .rope_dim = 256,
                             .sliding_window = 1024,
                             .swa_pattern = 6};
    snprintf(hp.arch, sizeof hp.arch, "gemma3");
    return hp;
}

static struct engine_params params_32k_16(int swa_full)
{
    struct engine_params p = engine_default_params();
    p.ctx_size = 32768;
    p.n_seqs = 16;
    p.max_batch_tokens = 512;
    p.swa_full = swa_full;
    return p;
}

/* Bytes by hand: a position of one layer is K and V of 8 heads x 256 dims in f16 = 8 KiB. Every position of
 * every layer: 48 x 16 x 32768 x 8 KiB = 192 GiB. The 8 global layers keep every position: 32 GiB. A slot of
 * the 40 window layers holds its window, the slack and a step's rows: (1024 - 1 + 64 + 512) positions, which
 * may straddle a block more than they fill: 1599 / 16 rounded up = 100, + 1 = 101 blocks; 16 slots: 1616
 * blocks = 25856 positions, x 40 layers x 8 KiB. */
Test(swa_plan, gemma3_12b_at_32k_and_16_sequences)
{
    const struct llm_hparams hp = gemma3_12b();
    cr_assert_eq(kv_cache_swa_layers(&hp), 40);
    const uint64_t pos_bytes = 2ull * 8 * 256 * 2;
    uint64_t all, swa;
    struct engine_params p = params_32k_16(1);
    engine_kv_bytes(&hp, &p, &all, &swa);
    cr_assert_eq(all, 48ull * 16 * 32768 * pos_bytes);
    cr_assert_eq(all, 192ull * GIB);
    cr_assert_eq(swa, 0);
    p = params_32k_16(0);
    uint64_t all_w, swa_w;
    engine_kv_bytes(&hp, &p, &all_w, &swa_w);
    cr_assert_eq(all_w, 8ull * 16 * 32768 * pos_bytes);
    cr_assert_eq(swa_w, 40ull * 25856 * pos_bytes);
    const double ratio = (double)(all_w + swa_w) / (double)all;
    fprintf(stderr,
            "Gemma-3-12B shape, 32768 positions x 16 sequences, f16: %.2f GiB with --swa-full, %.2f GiB "
            "(%.2f + %.2f) with the window pool: %.3f of it\n",
            all / (double)GIB, (all_w + swa_w) / (double)GIB, all_w / (double)GIB, swa_w / (double)GIB,
            ratio);
    cr_assert_leq(ratio, 0.25);
    /* q8_0: 34 bytes per 32 elements, both pools alike. */
    p.kv_type = KV_Q8_0;
    engine_kv_bytes(&hp, &p, &all, &swa);
    cr_assert_eq(all, all_w / 64 * 34);
    cr_assert_eq(swa, swa_w / 64 * 34);
    /* A context no longer than the window's pool: no window pool (it would save nothing). */
    p = params_32k_16(0);
    p.ctx_size = 1024;
    engine_kv_bytes(&hp, &p, &all, &swa);
    cr_assert_eq(swa, 0);
    cr_assert_eq(all, 48ull * 16 * 1024 * pos_bytes);
}

/* The planner's input for a Gemma-3-12B-shaped Q4_K_M file (48 layers of about 130 MiB, the tied output in
 * Q6_K) with the pool sized to the budget for 16 sequences of 32768 positions: the window pool's bytes and
 * the main pool's position bytes as forward_cuda.c gives them, or (full) every layer's planes in the main
 * pool. */
static struct device_map_input gemma3_12b_plan(uint64_t budget, int full)
{
    const uint64_t pos_bytes = 2ull * 8 * 256 * 2;
    struct device_map_input in = {.n_layers = 48,
                                  .layer_bytes = 130 * MIB,
                                  .piece_bytes = 70 * MIB,
                                  .head_bytes = 800 * MIB,
                                  .fixed_bytes = 1536 * MIB,
                                  .kv_token_bytes = (full ? 48 : 8) * pos_bytes,
                                  .kv_tokens_max = 16 * 32768,
                                  .kv_tokens_floor = 16 * 1024,
                                  .kv_tokens_min = 32768,
                                  .kv_block = 16,
                                  .budget = budget,
                                  .gpu_layers = -1,
                                  .h2d_bytes_per_s = 54.9e9,
                                  .hbm_bytes_per_s = 4.18e12};
    if (!full) in.kv_swa_bytes = 40ull * 25856 * pos_bytes, in.kv_swa_tokens = 25856;
    return in;
}

/* A 24 GiB budget: every layer fits either way; the pool takes the rest. With every layer's planes in it,
 * (24 GiB - 1.5 - 0.78 - 48 x 130 MiB) / 384 KiB positions; with the window pool counted first, the rest over
 * 64 KiB a position: 2.97x the positions (126720 against 42656). */
Test(swa_plan, window_pool_bytes_become_positions)
{
    char err[256] = "", text[4096];
    struct device_map full, win;
    struct device_map_input in = gemma3_12b_plan(24 * GIB, 1);
    cr_assert_eq(device_map_plan(&in, &full, err), FERRY_OK, "%s", err);
    in = gemma3_12b_plan(24 * GIB, 0);
    cr_assert_eq(device_map_plan(&in, &win, err), FERRY_OK, "%s", err);
    cr_assert_eq(full.n_resident, 48);
    cr_assert_eq(win.n_resident, 48);
    const uint64_t rest = 24 * GIB - 1536 * MIB - 800 * MIB - 48 * 130 * MIB;
    cr_assert_eq(full.kv_tokens, (int64_t)(rest / (384 * 1024)) / 16 * 16);
    cr_assert_eq(win.kv_tokens, (int64_t)((rest - in.kv_swa_bytes) / (64 * 1024)) / 16 * 16);
    cr_assert_eq(full.kv_tokens, 42656);
    cr_assert_eq(win.kv_tokens, 126720);
    cr_assert_eq(win.kv_swa_bytes, in.kv_swa_bytes);
    cr_assert_eq(win.kv_swa_tokens, 25856);
    cr_assert_eq(win.kv_bytes, (uint64_t)win.kv_tokens * 64 * 1024);
    /* Everything the plan allocates, the window pool included, and within the budget. */
    cr_assert_eq(win.bytes_total, 1536 * MIB + 800 * MIB + 48 * 130 * MIB + in.kv_swa_bytes + win.kv_bytes);
    cr_assert_leq(win.bytes_total, 24 * GIB);
    cr_assert_leq(full.bytes_total, 24 * GIB);
    device_map_format(&win, text, sizeof text);
    cr_assert(strstr(text, "sliding-window layers' own KV pool: 25856 positions (7.89 GiB)"), "%s", text);
    device_map_format(&full, text, sizeof text);
    cr_assert_null(strstr(text, "sliding-window"), "%s", text);
    device_map_free(&full);
    device_map_free(&win);
}

/* A 14 GiB budget: one full-length sequence of every layer's planes is 12 GiB alone, which with the rest is
 * more than the budget, so that plan is refused with its minimum; the window pool (7.89 GiB) plus one
 * sequence of the global layers' planes (2 GiB) fits, with layers resident, and the minimum it names counts
 * the window pool. */
Test(swa_plan, window_pool_fits_where_the_full_cache_cannot)
{
    char err[256] = "";
    struct device_map full, win;
    struct device_map_input in = gemma3_12b_plan(14 * GIB, 1);
    cr_assert_eq(device_map_plan(&in, &full, err), FERRY_ERR_DEVICE_MEM);
    cr_assert(strstr(err, "too small"), "%s", err);
    in = gemma3_12b_plan(14 * GIB, 0);
    cr_assert_eq(device_map_plan(&in, &win, err), FERRY_OK, "%s", err);
    cr_assert_gt(win.n_resident, 0);
    cr_assert_geq(win.kv_tokens, 32768);
    cr_assert_leq(win.bytes_total, 14 * GIB);
    /* The minimum: every layer streamed through two of the largest pieces, one sequence, the window pool. */
    cr_assert_eq(win.bytes_minimum,
                 1536 * MIB + 800 * MIB + 2 * 70 * MIB + 32768ull * 64 * 1024 + in.kv_swa_bytes);
    in.budget = win.bytes_minimum - 1;
    device_map_free(&win);
    cr_assert_eq(device_map_plan(&in, &win, err), FERRY_ERR_DEVICE_MEM);
}

/* `ferry inspect --gpu-memory` on the tiny Gemma 3 checkpoint (a CUDA build: the plan needs the CUDA
 * backend's sizes, no device): the window pool is named in the plan, and not with --swa-full. */
Test(swa_plan, offline_plan_names_the_window_pool)
{
    char path[1024], err[256] = "", text[8192];
    snprintf(path, sizeof path, "%s/tests/golden/models/gemma3_swa_f32", getenv("FERRY_SRC"));
    struct model_file *mf = NULL;
    if (model_file_open(path, &mf, NULL, NULL, err)) cr_skip_test("%s is missing (%s)", path, err);
    struct engine_params p = engine_default_params();
    p.ctx_size = 320;
    p.n_seqs = 4;
    p.max_batch_tokens = 32;
    p.gpu_memory = (int64_t)1 << 30;
    int rc = engine_plan(mf, &p, text, sizeof text, err);
    if (rc == FERRY_ERR_UNSUPPORTED) {
        model_file_close(mf);
        cr_skip_test("a build without CUDA has no offline plan (%s)", err);
    }
    cr_assert_eq(rc, FERRY_OK, "%s", err);
    cr_assert(strstr(text, "sliding-window layers' own KV pool"), "%s", text);
    p.swa_full = 1;
    cr_assert_eq(engine_plan(mf, &p, text, sizeof text, err), FERRY_OK, "%s", err);
    cr_assert_null(strstr(text, "sliding-window layers' own KV pool"), "%s", text);
    model_file_close(mf);
}

/* The CUDA backend's own sizes (forward_cuda_plan_offline, the arithmetic forward_cuda_init allocates by; no
 * device needed, a CUDA build): the tiny Gemma 3 (5 layers, layers 0, 1, 3, 4 with a window, K/V rows of 2
 * heads x 32) with a fixed pool of 4 slots x 320 positions. Every layer's planes in one pool: 5 planes x 1280
 * positions x 64 elements, K and V in f16 = 1638400 bytes. With the window pool: the global layer's plane
 * (327680) and the window pool of 4 planes x 32 blocks x 16 positions (8 blocks a slot: (16 - 1 + 64 + 32) /
 * 16 rounded up, + 1) x 64 x 2 x 2 = 524288, and its block table (4 x 20 entries, 320 bytes, in a 256-byte
 * aligned region: 512) with three more alignments of the arena's carve (768): 853248, 785152 fewer. */
Test(swa_plan, cuda_backend_sizes_the_two_pools)
{
    char path[1024], err[256] = "";
    snprintf(path, sizeof path, "%s/tests/golden/models/gemma3_swa_f32", getenv("FERRY_SRC"));
    struct model_file *mf = NULL;
    if (model_file_open(path, &mf, NULL, NULL, err)) cr_skip_test("%s is missing (%s)", path, err);
    struct model m;
    cr_assert_eq(model_init(&m, mf, err), FERRY_OK, "%s", err);
    const struct llm_hparams *hp = &m.hp;
    cr_assert_eq(kv_cache_swa_layers(hp), 4);
    cr_assert_eq(llm_kv_cache_layers(hp), 5);
    struct kv_cache all, glob, win;
    cr_assert_eq(kv_cache_init(&all, 5, 2, 32, 4, 320, 1280, 16, KV_NO_HOST), FERRY_OK);
    cr_assert_eq(kv_cache_init(&glob, 1, 2, 32, 4, 320, 1280, 16, KV_NO_HOST), FERRY_OK);
    cr_assert_eq(kv_cache_init(&win, 4, 2, 32, 4, 320, 32 * 16, 16, KV_NO_HOST), FERRY_OK);
    struct forward_cuda_params cp = {.max_tokens = 32, .gpu_memory = (int64_t)1 << 40, .gpu_layers = -1};
    struct device_map full_map, win_map;
    int rc = forward_cuda_plan_offline(&m, &all, &cp, 50e9, 3e12, &full_map, err);
    if (rc == FERRY_ERR_UNSUPPORTED) {
        kv_cache_free(&all), kv_cache_free(&glob), kv_cache_free(&win);
        model_free(&m);
        model_file_close(mf);
        cr_skip_test("a build without CUDA has no CUDA planner (%s)", err);
    }
    cr_assert_eq(rc, FERRY_OK, "%s", err);
    cp.kv_swa = &win;
    cr_assert_eq(forward_cuda_plan_offline(&m, &glob, &cp, 50e9, 3e12, &win_map, err), FERRY_OK, "%s", err);
    cr_assert_eq(win_map.kv_swa_bytes, 524288);
    cr_assert_eq(win_map.kv_swa_tokens, 512);
    cr_assert_eq(full_map.kv_swa_bytes, 0);
    cr_assert_eq(full_map.bytes_total - win_map.bytes_total, 785152, "%llu",
                 (unsigned long long)(full_map.bytes_total - win_map.bytes_total));
    device_map_free(&full_map);
    device_map_free(&win_map);
    kv_cache_free(&all), kv_cache_free(&glob), kv_cache_free(&win);
    model_free(&m);
    model_file_close(mf);
}
