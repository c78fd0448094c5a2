/* test_device_map — the placement planner's arithmetic: budgets, the minimum, the even spread, the ring. */
#include <criterion/criterion.h>
#include <string.h>

#include "kernels/core/status.h"
#include "runtime/device_map.h"

#define MIB (1024ull * 1024ull)

static struct device_map_input llama7b_like(uint64_t budget)
{
    return (struct device_map_input){.n_layers = 32,
                                     .layer_bytes = 386 * MIB,
                                     .piece_bytes = 172 * MIB, /* gate|up */
                                     .head_bytes = 250 * MIB,
                                     .fixed_bytes = 600 * MIB,
                                     .budget = budget,
                                     .gpu_layers = -1,
                                     .h2d_bytes_per_s = 54.9e9,
                                     .hbm_bytes_per_s = 4.2e12};
}

Test(device_map, everything_fits)
{
    struct device_map m;
    char err[256] = "";
    struct device_map_input in = llama7b_like(80000 * MIB);
    cr_assert_eq(device_map_plan(&in, &m, err), 0, "%s", err);
    cr_assert_eq(m.n_resident, 32);
    cr_assert_eq(m.n_streamed, 0);
    cr_assert_eq(m.ring_bytes, 0);
    cr_assert_eq(m.bytes_total, 600 * MIB + 250 * MIB + 32 * 386 * MIB);
    for (int i = 0; i < 32; i++) cr_assert_eq(m.where[i], PLACEMENT_GPU);
    device_map_free(&m);
}

Test(device_map, budget_limits_resident_layers_and_spreads_streamed_ones)
{
    struct device_map m;
    char err[256] = "";
    uint64_t budget = 4096 * MIB;
    struct device_map_input in = llama7b_like(budget);
    cr_assert_eq(device_map_plan(&in, &m, err), 0, "%s", err);
    /* 4096 - 850 = 3246 MiB: a ring of two pieces (344) leaves 2902 MiB = 7 layers of 386 (2702); the ring
     * grows into the 200 MiB they leave. */
    cr_assert_eq(m.n_resident, 7);
    cr_assert_eq(m.n_streamed, 25);
    cr_assert_eq(m.ring_bytes, 544 * MIB);
    cr_assert_eq(m.piece_bytes, 172 * MIB);
    cr_assert_eq(m.bytes_total, budget);
    int resident = 0, streamed = 0, run = 0, max_run = 0;
    for (int i = 0; i < 32; i++) {
        if (m.where[i] == PLACEMENT_GPU) {
            resident++;
            run = 0;
        } else {
            streamed++;
            if (++run > max_run) max_run = run;
        }
    }
    cr_assert_eq(resident, 7);
    cr_assert_eq(streamed, 25);
    /* 25 streamed among 32: resident layers break the streamed runs evenly (runs of at most 4). */
    cr_assert_leq(max_run, 4);
    cr_assert_gt(m.predicted_step_s, 25 * 386.0 * MIB / 54.9e9 * 0.99);
    device_map_free(&m);
}

Test(device_map, minimum_budget_is_exact_and_named)
{
    struct device_map m;
    char err[256] = "";
    struct device_map_input in = llama7b_like(600 * MIB + 250 * MIB + 2 * 172 * MIB);
    cr_assert_eq(device_map_plan(&in, &m, err), 0, "%s", err);
    cr_assert_eq(m.n_resident, 0);
    cr_assert_eq(m.n_streamed, 32);
    cr_assert_eq(m.ring_bytes, 2 * 172 * MIB, "the smallest ring: two of the largest pieces");
    device_map_free(&m);
    in.budget -= 1;
    cr_assert_eq(device_map_plan(&in, &m, err), FERRY_ERR_DEVICE_MEM);
    cr_assert(strstr(err, "minimum is 1.17 GiB"), "message: %s", err);
    cr_assert_null(m.where);
}

Test(device_map, explicit_gpu_layers)
{
    struct device_map m;
    char err[256] = "";
    struct device_map_input in = llama7b_like(80000 * MIB);
    in.gpu_layers = 0;
    cr_assert_eq(device_map_plan(&in, &m, err), 0, "%s", err);
    cr_assert_eq(m.n_streamed, 32);
    device_map_free(&m);
    in.gpu_layers = 16;
    in.ring_layers = 3;
    cr_assert_eq(device_map_plan(&in, &m, err), 0, "%s", err);
    cr_assert_eq(m.n_resident, 16);
    cr_assert_eq(m.ring_bytes, 3 * 386 * MIB, "the caller's ring, not grown");
    /* Half streamed: they alternate. */
    for (int i = 0; i + 1 < 32; i++) cr_assert_neq(m.where[i], m.where[i + 1], "layers %d and %d", i, i + 1);
    device_map_free(&m);
    in.gpu_layers = 33;
    cr_assert_eq(device_map_plan(&in, &m, err), FERRY_ERR_INVALID);
    in.gpu_layers = 32;
    in.budget = 4096 * MIB; /* asking for more layers than the budget holds is refused, not silently cut */
    cr_assert_eq(device_map_plan(&in, &m, err), FERRY_ERR_DEVICE_MEM);
}

Test(device_map, format_lists_runs)
{
    struct device_map m;
    char err[256] = "", buf[2048];
    struct device_map_input in = llama7b_like(80000 * MIB);
    in.gpu_layers = 30;
    cr_assert_eq(device_map_plan(&in, &m, err), 0, "%s", err);
    int n = device_map_format(&m, buf, sizeof buf);
    cr_assert_gt(n, 0);
    /* Room to spare: the ring grows to two layers, no further. */
    cr_assert(
        strstr(buf, "30 layers resident, 2 in host memory, a ring of 772.0 MiB (pieces up to 172.0 MiB)"),
        "%s", buf);
    cr_assert(strstr(buf, "layers  15-15  host"), "%s", buf);
    device_map_free(&m);
}

/* Q4_K_M-like: layers of two sizes. Resident layers take their own bytes, the ring two of the largest
 * streamed one (here its largest piece is given as larger than a layer: the layer bounds it). */
Test(device_map, layers_of_different_sizes)
{
    uint64_t sizes[32];
    for (int i = 0; i < 32; i++) sizes[i] = (i % 3 == 2 ? 126 : 104) * MIB;
    struct device_map m;
    char err[256] = "";
    struct device_map_input in = llama7b_like(80000 * MIB);
    in.layer_bytes = 126 * MIB;
    in.layer_sizes = sizes;
    cr_assert_eq(device_map_plan(&in, &m, err), 0, "%s", err);
    uint64_t sum = 0;
    for (int i = 0; i < 32; i++) sum += sizes[i];
    cr_assert_eq(m.n_resident, 32);
    cr_assert_eq(m.bytes_total, 600 * MIB + 250 * MIB + sum, "resident layers are carved at their own size");
    device_map_free(&m);
    in.budget = 850 * MIB + 2500 * MIB;
    cr_assert_eq(device_map_plan(&in, &m, err), 0, "%s", err);
    uint64_t res = 0, big = 0;
    for (int i = 0; i < 32; i++)
        if (m.where[i] == PLACEMENT_GPU)
            res += sizes[i];
        else if (sizes[i] > big)
            big = sizes[i];
    cr_assert_gt(m.n_streamed, 0);
    cr_assert_eq(m.piece_bytes, big);
    cr_assert_eq(m.ring_bytes, 2 * big);
    cr_assert_eq(m.bytes_total, 850 * MIB + res + 2 * big);
    cr_assert_leq(m.bytes_total, in.budget);
    /* One more resident layer would not have fitted. */
    struct device_map more;
    in.gpu_layers = m.n_resident + 1;
    cr_assert_eq(device_map_plan(&in, &more, err), FERRY_ERR_DEVICE_MEM);
    device_map_free(&m);
}

/* Llama-2-7B f16 under 4 GiB with --parallel 16 --ctx-size 512: the KV pool (512 KiB a position)
 * is sized to the budget instead of the plan failing. */
static struct device_map_input auto_kv(uint64_t budget, int64_t max, int64_t floor, int64_t min)
{
    struct device_map_input in = llama7b_like(budget);
    in.fixed_bytes = 300 * MIB;
    in.kv_token_bytes = 512 * 1024;
    in.kv_tokens_max = max;
    in.kv_tokens_floor = floor;
    in.kv_tokens_min = min;
    in.kv_block = 16;
    return in;
}

Test(device_map, kv_pool_sized_to_the_budget)
{
    struct device_map m;
    char err[256] = "";
    struct device_map_input in = auto_kv(4096 * MIB, 16 * 512, 16 * 512, 512);
    cr_assert_eq(device_map_plan(&in, &m, err), 0, "%s", err);
    cr_assert_leq(m.bytes_total, in.budget);
    cr_assert_geq(m.kv_tokens, 512);
    cr_assert_lt(m.kv_tokens, 16 * 512);
    cr_assert_eq(m.kv_tokens % 16, 0);
    cr_assert_eq(m.kv_bytes, (uint64_t)m.kv_tokens * 512 * 1024);
    /* Whatever is left after the plan is less than one more block of positions. */
    cr_assert_lt(in.budget - m.bytes_total, 16 * 512 * 1024ull);
    char buf[2048];
    device_map_format(&m, buf, sizeof buf);
    cr_assert(strstr(buf, "KV pool sized to the budget"), "%s", buf);
    device_map_free(&m);

    /* Everything fits: the whole pool and every layer. */
    in = auto_kv(80000 * MIB, 4 * 4096, 4 * 1024, 4096);
    cr_assert_eq(device_map_plan(&in, &m, err), 0, "%s", err);
    cr_assert_eq(m.n_resident, 32);
    cr_assert_eq(m.kv_tokens, 4 * 4096);
    device_map_free(&m);

    /* Not everything fits: the pool keeps its floor and the layers take the rest. */
    in = auto_kv(8192 * MIB, 4 * 4096, 4 * 1024, 4096);
    cr_assert_eq(device_map_plan(&in, &m, err), 0, "%s", err);
    cr_assert_geq(m.kv_tokens, 4 * 1024);
    cr_assert_gt(m.n_resident, 0);
    cr_assert_lt(in.budget - m.bytes_total, 386 * MIB + 16 * 512 * 1024ull);
    device_map_free(&m);
}

/* Every layer fits beside the pool's floor, though not beside its maximum: all stay resident and the pool
 * takes the rest (no layer streams through a ring that would take more memory than the layer itself). */
Test(device_map, all_layers_resident_beside_the_floor)
{
    struct device_map m;
    char err[256] = "";
    /* 550 + 32 x 386 = 12902 MiB of weights; the floor (4096 positions) 2 GiB, the maximum 8 GiB. */
    struct device_map_input in = auto_kv(16000 * MIB, 4 * 4096, 4 * 1024, 4096);
    cr_assert_eq(device_map_plan(&in, &m, err), 0, "%s", err);
    cr_assert_eq(m.n_resident, 32);
    cr_assert_eq(m.ring_bytes, 0);
    cr_assert_eq(m.kv_tokens, (16000 - 12902) * 2 / 16 * 16);
    device_map_free(&m);
}

/* The offloaded load (16 sequences of 640 at 4 GiB): the positions the device cannot hold become the
 * pool's extension in host memory, up to kv_ext_max; never when every layer is resident. */
Test(device_map, kv_extension_in_host_memory)
{
    struct device_map m;
    char err[256] = "";
    struct device_map_input in = auto_kv(4096 * MIB, 16 * 640, 16 * 640, 640);
    cr_assert_eq(device_map_plan(&in, &m, err), 0, "%s", err);
    cr_assert_eq(m.kv_ext_tokens, 0, "no extension unless asked");
    const int64_t dev = m.kv_tokens;
    cr_assert_lt(dev, 16 * 640);
    device_map_free(&m);
    in.kv_ext_max = 1 << 30;
    cr_assert_eq(device_map_plan(&in, &m, err), 0, "%s", err);
    cr_assert_eq(m.kv_tokens, dev, "the device's part is the plan without an extension");
    cr_assert_eq(m.kv_ext_tokens, 16 * 640 - dev);
    cr_assert_eq(m.kv_ext_bytes, (uint64_t)m.kv_ext_tokens * 512 * 1024);
    cr_assert_leq(m.bytes_total, in.budget);
    char buf[2048];
    device_map_format(&m, buf, sizeof buf);
    cr_assert(strstr(buf, "KV pool extension in host memory"), "%s", buf);
    device_map_free(&m);
    in.kv_ext_max = 1000; /* capped (host memory), in whole blocks */
    cr_assert_eq(device_map_plan(&in, &m, err), 0, "%s", err);
    cr_assert_eq(m.kv_ext_tokens, 992);
    device_map_free(&m);
    in = auto_kv(16000 * MIB, 4 * 4096, 4 * 1024, 4096); /* every layer resident, the pool short of its max */
    in.kv_ext_max = 1 << 30;
    cr_assert_eq(device_map_plan(&in, &m, err), 0, "%s", err);
    cr_assert_eq(m.n_resident, 32);
    cr_assert_eq(m.kv_ext_tokens, 0);
    device_map_free(&m);
}

/* With the host's cores attending to the extension (kv_ext_host), the layers go first: the pool keeps one
 * sequence (kv_tokens_min) before layers are made resident, and the extension holds the rest; but not when
 * every layer would then fit (the plan is then the one without kv_ext_host). */
Test(device_map, host_attended_extension_lets_layers_go_first)
{
    struct device_map kvfirst, m;
    char err[256] = "";
    struct device_map_input in = auto_kv(4096 * MIB, 16 * 640, 16 * 640, 640);
    in.kv_ext_max = 1 << 30;
    cr_assert_eq(device_map_plan(&in, &kvfirst, err), 0, "%s", err);
    in.kv_ext_host = 1;
    cr_assert_eq(device_map_plan(&in, &m, err), 0, "%s", err);
    cr_assert_gt(m.n_resident, kvfirst.n_resident, "resident %d, KV first %d", m.n_resident,
                 kvfirst.n_resident);
    cr_assert_geq(m.kv_tokens, 640);
    cr_assert_lt(m.kv_tokens, kvfirst.kv_tokens);
    cr_assert_eq(m.kv_tokens + m.kv_ext_tokens, 16 * 640,
                 "the device's part and the extension hold every slot");
    cr_assert_leq(m.bytes_total, in.budget);
    /* Whatever the layers leave goes to the pool: less than one more layer's bytes are left over. */
    cr_assert_lt(in.budget - m.bytes_total, 386 * MIB + 16 * 512 * 1024ull);
    char buf[2048];
    device_map_format(&m, buf, sizeof buf);
    cr_assert(strstr(buf, "runs on the host's cores"), "%s", buf);
    device_map_format(&kvfirst, buf, sizeof buf);
    cr_assert(strstr(buf, "the device reads them over the link"), "%s", buf);
    device_map_free(&m);
    device_map_free(&kvfirst);
    /* Every layer fits beside one sequence but not beside the floor: the plan without kv_ext_host. */
    in = auto_kv(16000 * MIB, 4 * 4096, 4 * 4096, 4096);
    in.kv_ext_max = 1 << 30;
    cr_assert_eq(device_map_plan(&in, &kvfirst, err), 0, "%s", err);
    in.kv_ext_host = 1;
    cr_assert_eq(device_map_plan(&in, &m, err), 0, "%s", err);
    cr_assert_lt(kvfirst.n_resident, 32);
    cr_assert_eq(m.n_resident, kvfirst.n_resident);
    cr_assert_eq(m.kv_tokens, kvfirst.kv_tokens);
    device_map_free(&m);
    device_map_free(&kvfirst);
}

Test(device_map, too_small_for_one_sequence_names_the_minimum_in_full)
{
    struct device_map m;
    char err[256] = "";
    /* 300 + 250 + 2 x 172 MiB of head, fixed and ring, plus 4096 positions (2 GiB): 2942 MiB = 2.873 GiB,
     * named rounded up (a budget of the printed minimum fits); the budget rounded down. */
    struct device_map_input in = auto_kv(2900 * MIB, 4 * 4096, 4 * 1024, 4096);
    cr_assert_eq(device_map_plan(&in, &m, err), FERRY_ERR_DEVICE_MEM);
    cr_assert(strstr(err, "GPU budget 2.83 GiB is too small: the minimum is 2.88 GiB"), "message: %s", err);
    cr_assert_eq(m.bytes_minimum, 2942 * MIB);
    cr_assert_eq(err[strlen(err) - 1], ')', "the message is whole: %s", err);
    cr_assert_lt(strlen(err), 200);
}

/* One full-length sequence need not be on the device when the host's cores attend to an extension that can
 * hold the rest of it (Q4_K_M 7B under 2 GiB with the default 4,096-position context refused to start before
 * 2026-12-06d, and under 4 GiB kept 2 GiB of KV before any layer): the device keeps KV_DEVICE_POSITIONS and
 * the layers take the rest; a budget that cannot hold those beside the smallest plan keeps what fits; without
 * a host-attended extension, or one too small, the refusal stays. */
Test(device_map, one_sequence_split_with_the_extension)
{
    struct device_map m;
    char err[256] = "";
    struct device_map_input in = auto_kv(2900 * MIB, 4 * 4096, 4 * 1024, 4096);
    in.kv_ext_max = 1 << 30;
    cr_assert_eq(device_map_plan(&in, &m, err), FERRY_ERR_DEVICE_MEM,
                 "the device reads the extension: refused");
    in.kv_ext_host = 1;
    cr_assert_eq(device_map_plan(&in, &m, err), 0, "%s", err);
    cr_assert_eq(m.kv_seq_split, 1);
    /* 2900 - (300 + 250) MiB - 1024 positions (512 MiB) = 1838 MiB: 3 layers of 386 MiB beside a ring of two
     * (344 MiB); the ring grows into what is left, up to two layers, the pool takes the rest. */
    cr_assert_eq(m.n_resident, 3, "resident %d", m.n_resident);
    cr_assert_geq(m.kv_tokens, KV_DEVICE_POSITIONS, "device positions %lld", (long long)m.kv_tokens);
    cr_assert_lt(m.kv_tokens, 4096);
    cr_assert_eq(m.kv_tokens + m.kv_ext_tokens, 4 * 4096, "the extension holds the rest of every slot");
    cr_assert_leq(m.bytes_total, in.budget);
    cr_assert_lt(m.bytes_minimum, in.budget);
    char buf[2048];
    device_map_format(&m, buf, sizeof buf);
    cr_assert(strstr(buf, "fewer positions than one --ctx-size sequence"), "%s", buf);
    device_map_free(&m);
    /* Room for fewer than KV_DEVICE_POSITIONS beside the smallest plan: every layer streams, the device keeps
     * what fits. 300 + 250 + 2 x 172 MiB and 500 positions: 496 in whole blocks of 16. */
    in.budget = (300 + 250 + 2 * 172) * MIB + 500 * 512 * 1024;
    cr_assert_eq(device_map_plan(&in, &m, err), 0, "%s", err);
    cr_assert_eq(m.n_resident, 0);
    cr_assert_eq(m.kv_tokens, 496, "device positions %lld", (long long)m.kv_tokens);
    cr_assert_eq(m.kv_seq_split, 1);
    device_map_free(&m);
    /* A budget with room for one block beside the smallest plan still plans; less than that is refused. */
    in.budget = (300 + 250 + 2 * 172) * MIB + 16 * 512 * 1024;
    cr_assert_eq(device_map_plan(&in, &m, err), 0, "%s", err);
    cr_assert_eq(m.kv_tokens, 16);
    device_map_free(&m);
    in.budget -= 1;
    cr_assert_eq(device_map_plan(&in, &m, err), FERRY_ERR_DEVICE_MEM);
    cr_assert(strstr(err, "one block of the KV pool on the device and the rest in host memory)"), "%s", err);
    cr_assert_lt(strlen(err), 200);
    /* An extension that cannot hold one sequence: refused as before. */
    in = auto_kv(2900 * MIB, 4 * 4096, 4 * 1024, 4096);
    in.kv_ext_host = 1;
    in.kv_ext_max = 4000;
    cr_assert_eq(device_map_plan(&in, &m, err), FERRY_ERR_DEVICE_MEM);
    /* A budget that holds the sequence beside some layers (ferry serve's default 4 x 4096 under 4 GiB): the
     * layers still go first, beside KV_DEVICE_POSITIONS: 4096 - 550 - 512 MiB, less a ring of 344, holds 6
     * layers of 386 MiB, where keeping the 4096 positions (2 GiB) left room for 2. With the extension read by
     * the device the pool comes first and holds the sequence whole. */
    in = auto_kv(4096 * MIB, 4 * 4096, 4 * 4096, 4096);
    in.kv_ext_max = 1 << 30;
    struct device_map whole;
    cr_assert_eq(device_map_plan(&in, &whole, err), 0, "%s", err);
    cr_assert_eq(whole.kv_seq_split, 0);
    cr_assert_geq(whole.kv_tokens, 4096);
    in.kv_ext_host = 1;
    cr_assert_eq(device_map_plan(&in, &m, err), 0, "%s", err);
    cr_assert_eq(m.kv_seq_split, 1);
    cr_assert_geq(m.kv_tokens, KV_DEVICE_POSITIONS);
    cr_assert_eq(m.n_resident, 6, "resident %d", m.n_resident);
    device_map_free(&m);
    device_map_free(&whole);
}

/* --placement cpu: host layers never stream, so no ring; its memory holds one more resident layer. */
Test(device_map, no_ring_gives_the_ring_to_resident_layers)
{
    struct device_map m;
    char err[256] = "";
    struct device_map_input in = llama7b_like(4096 * MIB);
    in.no_ring = 1;
    cr_assert_eq(device_map_plan(&in, &m, err), 0, "%s", err);
    /* 4096 - 850 = 3246 MiB = 8 layers of 386, no ring. */
    cr_assert_eq(m.ring_bytes, 0);
    cr_assert_eq(m.n_resident, 8);
    cr_assert_eq(m.n_streamed, 24);
    cr_assert_leq(m.bytes_total, 4096 * MIB);
    device_map_free(&m);
    /* The smallest plan then holds no layer at all. */
    in.budget = 900 * MIB;
    cr_assert_eq(device_map_plan(&in, &m, err), 0, "%s", err);
    cr_assert_eq(m.n_resident, 0);
    cr_assert_eq(m.ring_bytes, 0);
    cr_assert_eq(m.bytes_total, 850 * MIB);
    device_map_free(&m);
}

/* Tests force the resident set (a step plan's 'g' layers): exactly those, or a clean refusal. */
Test(device_map, resident_mask_is_obeyed)
{
    struct device_map m;
    char err[256] = "";
    struct device_map_input in = llama7b_like(80000 * MIB);
    uint8_t mask[32] = {0};
    mask[0] = mask[5] = mask[31] = 1;
    in.resident_mask = mask;
    cr_assert_eq(device_map_plan(&in, &m, err), 0, "%s", err);
    cr_assert_eq(m.n_resident, 3);
    cr_assert_eq(m.n_streamed, 29);
    cr_assert_eq(m.ring_bytes, 2 * 386 * MIB);
    for (int i = 0; i < 32; i++)
        cr_assert_eq(m.where[i], mask[i] ? PLACEMENT_GPU : PLACEMENT_STREAM, "layer %d", i);
    device_map_free(&m);
    in.budget = 2000 * MIB; /* 850 + 3 x 386 + a ring of 2 x 172 = 2352 MiB: too small */
    cr_assert_eq(device_map_plan(&in, &m, err), FERRY_ERR_DEVICE_MEM);
    cr_assert(strstr(err, "too small"), "%s", err);
}

/* The minimum is that of the smallest plan the request allows, so a budget of exactly that many bytes gets a
 * plan: every layer streamed through the smallest ring, or with --gpu-layers N those N resident (before, the
 * minimum named every layer streamed while the plan kept N resident: a refusal under a minimum below the
 * budget). */
Test(device_map, the_minimum_is_a_budget_that_works)
{
    struct device_map m;
    char err[256] = "";
    const int resident[] = {-1, 0, 16, 32};
    for (size_t i = 0; i < sizeof resident / sizeof resident[0]; i++) {
        struct device_map_input in = llama7b_like(1 * MIB);
        in.gpu_layers = resident[i];
        cr_assert_eq(device_map_plan(&in, &m, err), FERRY_ERR_DEVICE_MEM);
        const uint64_t least = m.bytes_minimum;
        const int r = resident[i] < 0 ? 0 : resident[i];
        cr_assert_eq(least, 850 * MIB + (uint64_t)r * 386 * MIB + (r < 32 ? 2 * 172 * MIB : 0),
                     "--gpu-layers %d: minimum %llu", resident[i], (unsigned long long)least);
        in.budget = least;
        cr_assert_eq(device_map_plan(&in, &m, err), FERRY_OK, "--gpu-layers %d at the minimum: %s",
                     resident[i], err);
        cr_assert_eq(m.n_resident, r);
        cr_assert_eq(m.bytes_total, least);
        device_map_free(&m);
        in.budget = least - 1;
        cr_assert_eq(device_map_plan(&in, &m, err), FERRY_ERR_DEVICE_MEM);
        cr_assert_eq(m.bytes_minimum, least);
        cr_assert(strstr(err, "is too small: the minimum is"), "%s", err);
    }
}

/* Refusals round the budget down and the minimum up: one byte apart, they still print apart. */
Test(device_map, too_small_messages_never_read_as_equal)
{
    char err[256];
    cr_assert_eq(device_map_too_small(err, 8ull << 30, (8ull << 30) + 1, "x"), FERRY_ERR_DEVICE_MEM);
    cr_assert_str_eq(err, "GPU budget 8.00 GiB is too small: the minimum is 8.01 GiB (x)");
    device_map_too_small(err, (8ull << 30) - 1, 8ull << 30, "y");
    cr_assert_str_eq(err, "GPU budget 7.99 GiB is too small: the minimum is 8.00 GiB (y)");
    device_map_too_small(err, 300 * MIB + 1, 301 * MIB + MIB / 20, "z");
    cr_assert_str_eq(err, "GPU budget 300.0 MiB is too small: the minimum is 301.1 MiB (z)");
    device_map_too_small(err, 1000 * MIB, 1024 * MIB, "w");
    cr_assert_str_eq(err, "GPU budget 1000.0 MiB is too small: the minimum is 1.00 GiB (w)");
}

/* Stream-only layers (a model with recurrent layers on the CUDA backend): placed like any other and named in
 * the map's text when in host memory; a map without a ring may not leave one there. */
Test(device_map, stream_only_layers)
{
    struct device_map m;
    char err[256] = "", buf[2048];
    uint8_t only[32];
    memset(only, 1, sizeof only);
    struct device_map_input in = llama7b_like(4096 * MIB);
    in.stream_only = only;
    cr_assert_eq(device_map_plan(&in, &m, err), FERRY_OK, "%s", err);
    cr_assert_eq(m.n_resident, 7);
    cr_assert_eq(m.n_stream_only, 25);
    cr_assert(m.stream_only && m.stream_only != only && m.stream_only[31] == 1);
    device_map_format(&m, buf, sizeof buf);
    cr_assert(strstr(buf, "25 of the host layers always stream"), "%s", buf);
    device_map_free(&m);
    in.no_ring = 1;
    cr_assert_eq(device_map_plan(&in, &m, err), FERRY_ERR_UNSUPPORTED, "no ring, stream-only host layers");
    cr_assert_null(m.where);
    in.budget = 80000 * MIB;
    cr_assert_eq(device_map_plan(&in, &m, err), FERRY_OK, "no ring, every layer resident: %s", err);
    cr_assert_eq(m.n_stream_only, 0);
    device_map_format(&m, buf, sizeof buf);
    cr_assert_null(strstr(buf, "always stream"), "%s", buf);
    device_map_free(&m);
}

/* The experts' line of an expert model's plan: host experts without a cache are not "all resident". */
Test(device_map, format_names_where_experts_are)
{
    struct device_map m;
    char err[256], buf[4096];
    struct device_map_input in = llama7b_like(80000 * MIB);
    cr_assert_eq(device_map_plan(&in, &m, err), FERRY_OK, "%s", err);
    m.moe_layers = 32, m.cpu_moe = 0, m.expert_cache_bytes = 0;
    device_map_format(&m, buf, sizeof buf);
    cr_assert(strstr(buf, "experts: all resident"), "%s", buf);
    m.cpu_moe = 12;
    device_map_format(&m, buf, sizeof buf);
    cr_assert(
        strstr(buf, "experts: those of layers 0-11 in host memory, computed by the host's cores; of 20"),
        "%s", buf);
    cr_assert_null(strstr(buf, "all resident"), "%s", buf);
    m.expert_cache_bytes = 64 << 20;
    device_map_format(&m, buf, sizeof buf);
    cr_assert(strstr(buf, "or cached on the device") && strstr(buf, "expert cache: 64.0 MiB"), "%s", buf);
    cr_assert_null(strstr(buf, "all resident"), "%s", buf);
    device_map_free(&m);
}

/* The device's page tables for pinned host memory (8 bytes of entry per 4 KiB page: host_map_div 512) are
 * part of the plan: those of the host layers and of the KV pool's extension stay inside the budget, the
 * minimum counts them, and host_map_bytes reports them apart from what the backend allocates. (On the H100,
 * 2026-12-07: ferry_vram_used_bytes ran 2 MiB per GiB of pinned host layers over --gpu-memory while they
 * were not counted.) */
Test(device_map, host_memory_page_tables_count_against_the_budget)
{
    struct device_map plain, m;
    char err[256] = "";
    const uint64_t entries = (386 * MIB + 511) / 512; /* a host layer's page tables */
    struct device_map_input in = llama7b_like(4096 * MIB);
    cr_assert_eq(device_map_plan(&in, &plain, err), 0, "%s", err);
    cr_assert_eq(plain.host_map_bytes, 0);
    in.host_map_div = 512;
    cr_assert_eq(device_map_plan(&in, &m, err), 0, "%s", err);
    cr_assert_gt(m.n_streamed, 0);
    cr_assert_eq(m.host_map_bytes, (uint64_t)m.n_streamed * entries);
    cr_assert_leq(m.bytes_total, in.budget);
    /* The budget the uncounted plan filled exactly: the counted one must give something up. */
    in.budget = plain.bytes_total;
    device_map_free(&m);
    cr_assert_eq(device_map_plan(&in, &m, err), 0, "%s", err);
    cr_assert_leq(m.bytes_total, in.budget);
    cr_assert(m.n_resident < plain.n_resident || m.ring_bytes < plain.ring_bytes,
              "resident %d (was %d), ring %llu (was %llu)", m.n_resident, plain.n_resident,
              (unsigned long long)m.ring_bytes, (unsigned long long)plain.ring_bytes);
    device_map_free(&m);
    device_map_free(&plain);
    /* The minimum (every layer streamed) holds all 32 layers' page tables, and is a budget that works. */
    in.budget = 1 * MIB;
    cr_assert_eq(device_map_plan(&in, &m, err), FERRY_ERR_DEVICE_MEM);
    const uint64_t least = m.bytes_minimum;
    cr_assert_eq(least, 850 * MIB + 2 * 172 * MIB + 32 * entries);
    in.budget = least;
    cr_assert_eq(device_map_plan(&in, &m, err), FERRY_OK, "%s", err);
    cr_assert_eq(m.bytes_total, least);
    device_map_free(&m);
    /* The extension's page tables come out of the device's pool (16 sequences of 640 at 4 GiB). */
    in = auto_kv(4096 * MIB, 16 * 640, 16 * 640, 640);
    in.kv_ext_max = 1 << 30;
    cr_assert_eq(device_map_plan(&in, &plain, err), 0, "%s", err);
    in.host_map_div = 512;
    cr_assert_eq(device_map_plan(&in, &m, err), 0, "%s", err);
    cr_assert_gt(m.kv_ext_tokens, 0);
    cr_assert_eq(m.host_map_bytes, (uint64_t)m.n_streamed * entries + (m.kv_ext_bytes + 511) / 512);
    cr_assert_leq(m.bytes_total, in.budget, "%llu over", (unsigned long long)(m.bytes_total - in.budget));
    cr_assert_eq(m.kv_tokens % 16, 0);
    cr_assert_eq(m.kv_tokens + m.kv_ext_tokens, 16 * 640, "every slot still held");
    cr_assert_leq(m.kv_tokens, plain.kv_tokens);
    device_map_free(&m);
    device_map_free(&plain);
}
