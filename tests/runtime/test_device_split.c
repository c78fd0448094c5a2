/* test_device_split — the plan for several GPUs: one device is device_map's plan byte for byte; several split
 * the layers into contiguous ranges that cover each layer once, hold the same KV positions, stay inside each
 * budget, balance uneven budgets, split experts, and refuse a device too small for its minimum by name. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/core/status.h"
#include "runtime/device_split.h"

#define MIB (1024ull * 1024ull)
#define GIB (1024ull * MIB)

static struct device_map_input llama7b_like(uint64_t budget)
{
    return (struct device_map_input){.n_layers = 32,
                                     .layer_bytes = 386 * MIB,
                                     .piece_bytes = 172 * MIB,
                                     .head_bytes = 250 * MIB,
                                     .fixed_bytes = 600 * MIB,
                                     .budget = budget,
                                     .gpu_layers = -1,
                                     .h2d_bytes_per_s = 54.9e9,
                                     .hbm_bytes_per_s = 4.2e12,
                                     .host_map_div = 512};
}

/* in with a pool the planner sizes: kvt bytes a position, between min and max positions (floor kept before
 * layers), in blocks of 16. */
static struct device_map_input with_auto_kv(struct device_map_input in, uint64_t kvt, int64_t max,
                                            int64_t floor, int64_t min)
{
    in.kv_token_bytes = kvt;
    in.kv_tokens_max = max;
    in.kv_tokens_floor = floor;
    in.kv_tokens_min = min;
    in.kv_block = 16;
    return in;
}

static struct device_map_input with_auto_kv512(struct device_map_input in, int64_t max, int64_t floor,
                                               int64_t min)
{
    return with_auto_kv(in, 512 * 1024, max, floor, min);
}

/* Llama-2-70B in Q4_K_M: 80 layers of 481 MB, every other one 60 MB more (its ffn_down in Q6_K), a Q6_K head,
 * f16 K/V of 8 heads of 128 (320 KiB a position over all layers), 4 sequences of 4096. */
static uint64_t q4km_70b[80];
static struct device_map_input llama70b_q4km(void)
{
    for (int l = 0; l < 80; l++) q4km_70b[l] = 481000000ull + (l % 2 ? 60000000ull : 0);
    struct device_map_input in = {.n_layers = 80,
                                  .layer_bytes = 541000000ull,
                                  .layer_sizes = q4km_70b,
                                  .piece_bytes = 264000000ull,
                                  .head_bytes = 215000000ull,
                                  .fixed_bytes = 900 * MIB,
                                  .gpu_layers = -1,
                                  .h2d_bytes_per_s = 25e9,
                                  .hbm_bytes_per_s = 0.9e12,
                                  .host_map_div = 512};
    return with_auto_kv(in, 320 * 1024, 4 * 4096, 4 * 1024, 4096);
}

static struct device_split_input split_of(struct device_map_input model, int n, const uint64_t *budgets)
{
    struct device_split_input in = {.model = model, .cpu_moe = -1, .n_devices = n, .hidden_bytes = 8192 * 4};
    for (int d = 0; d < n; d++) in.ordinal[d] = d, in.budget[d] = budgets[d];
    return in;
}

static void assert_maps_equal(const struct device_map *a, const struct device_map *b, const char *what)
{
    cr_assert_eq(a->n_layers, b->n_layers, "%s", what);
    cr_assert_eq(a->n_resident, b->n_resident, "%s", what);
    cr_assert_eq(a->n_streamed, b->n_streamed, "%s", what);
    cr_assert_eq(a->ring_bytes, b->ring_bytes, "%s", what);
    cr_assert_eq(a->piece_bytes, b->piece_bytes, "%s", what);
    cr_assert_eq(a->kv_tokens, b->kv_tokens, "%s", what);
    cr_assert_eq(a->kv_bytes, b->kv_bytes, "%s", what);
    cr_assert_eq(a->kv_ext_tokens, b->kv_ext_tokens, "%s", what);
    cr_assert_eq(a->kv_ext_bytes, b->kv_ext_bytes, "%s", what);
    cr_assert_eq(a->kv_swa_bytes, b->kv_swa_bytes, "%s", what);
    cr_assert_eq(a->kv_ext_host, b->kv_ext_host, "%s", what);
    cr_assert_eq(a->kv_seq_split, b->kv_seq_split, "%s", what);
    cr_assert_eq(a->bytes_total, b->bytes_total, "%s", what);
    cr_assert_eq(a->host_map_bytes, b->host_map_bytes, "%s", what);
    cr_assert_eq(a->bytes_minimum, b->bytes_minimum, "%s", what);
    cr_assert_eq(a->n_stream_only, b->n_stream_only, "%s", what);
    cr_assert(memcmp(&a->predicted_step_s, &b->predicted_step_s, sizeof(double)) == 0, "%s", what);
    cr_assert(memcmp(a->where, b->where, (size_t)a->n_layers * sizeof *a->where) == 0, "%s", what);
}

/* Each layer in exactly one range, in order; every device inside its budget; the same KV positions on every
 * device that has a pool. */
static void assert_sound(const struct device_split_input *in, const struct device_split *s)
{
    cr_assert_eq(s->n_devices, in->n_devices);
    int next = 0;
    for (int d = 0; d < s->n_devices; d++) {
        const struct device_split_part *p = &s->part[d];
        cr_assert_eq(p->first, next, "device %d starts where the one before ends", d);
        cr_assert_gt(p->end, p->first, "device %d holds a layer", d);
        cr_assert_eq(p->map.n_layers, p->end - p->first);
        cr_assert_eq(p->map.n_resident + p->map.n_streamed, p->map.n_layers);
        cr_assert_leq(p->map.bytes_total, in->budget[d], "device %d: %llu over %llu", d,
                      (unsigned long long)p->map.bytes_total, (unsigned long long)in->budget[d]);
        cr_assert_eq(p->ordinal, in->ordinal[d]);
        if (in->model.kv_token_bytes) cr_assert_eq(p->map.kv_tokens, s->kv_tokens, "device %d's pool", d);
        next = p->end;
    }
    cr_assert_eq(next, in->model.n_layers, "the ranges cover every layer");
}

Test(device_split, one_device_is_device_map_byte_for_byte)
{
    uint64_t sizes[32];
    for (int l = 0; l < 32; l++) sizes[l] = 386 * MIB + (l % 3 == 0 ? 40 * MIB : 0);
    uint8_t stream_only[32];
    memset(stream_only, 1, sizeof stream_only);
    struct device_map_input cases[14];
    int n = 0;
    const uint64_t budgets[] = {80000 * MIB, 4096 * MIB, 2000 * MIB, 1600 * MIB};
    for (int b = 0; b < 4; b++) cases[n++] = llama7b_like(budgets[b]);
    cases[n++] = with_auto_kv512(llama7b_like(4096 * MIB), 16 * 512, 16 * 512, 512);
    cases[n++] = with_auto_kv512(llama7b_like(8192 * MIB), 4 * 4096, 4 * 1024, 4096);
    cases[n++] = with_auto_kv512(llama7b_like(16000 * MIB), 4 * 4096, 4 * 1024, 4096);
    cases[n] = with_auto_kv512(llama7b_like(4096 * MIB), 16 * 640, 16 * 640, 640);
    cases[n++].kv_ext_max = 1 << 30;
    cases[n] = with_auto_kv512(llama7b_like(3000 * MIB), 4 * 8192, 4 * 1024, 8192);
    cases[n].kv_ext_max = 1 << 30, cases[n++].kv_ext_host = 1;
    cases[n] = llama7b_like(6000 * MIB);
    cases[n++].layer_sizes = sizes;
    cases[n] = llama7b_like(6000 * MIB);
    cases[n++].stream_only = stream_only;
    cases[n] = llama7b_like(6000 * MIB);
    cases[n++].ring_layers = 3;
    cases[n] = llama7b_like(6000 * MIB);
    cases[n++].gpu_layers = 5;
    cases[n] = llama70b_q4km();
    cases[n++].budget = 24 * GIB;
    for (int i = 0; i < n; i++) {
        struct device_map want;
        struct device_split got;
        char e1[256] = "", e2[256] = "", what[32];
        snprintf(what, sizeof what, "case %d", i);
        const int rc1 = device_map_plan(&cases[i], &want, e1);
        struct device_split_input in = split_of(cases[i], 1, &cases[i].budget);
        in.ordinal[0] = 3;
        const int rc2 = device_split_plan(&in, &got, e2);
        cr_assert_eq(rc1, FERRY_OK, "%s: %s", what, e1);
        cr_assert_eq(rc2, FERRY_OK, "%s: %s", what, e2);
        assert_maps_equal(&got.part[0].map, &want, what);
        cr_assert_eq(got.part[0].ordinal, 3);
        cr_assert_eq(got.kv_tokens, want.kv_tokens, "%s", what);
        cr_assert(memcmp(&got.predicted_step_s, &want.predicted_step_s, sizeof(double)) == 0, "%s", what);
        device_map_free(&want);
        device_split_free(&got);
    }
    /* A budget too small: the same refusal and the same minimum, the device named. */
    struct device_map_input small = llama7b_like(900 * MIB);
    struct device_map want;
    struct device_split got;
    char e1[256] = "", e2[256] = "";
    cr_assert_eq(device_map_plan(&small, &want, e1), FERRY_ERR_DEVICE_MEM);
    struct device_split_input in = split_of(small, 1, &small.budget);
    cr_assert_eq(device_split_plan(&in, &got, e2), FERRY_ERR_DEVICE_MEM);
    cr_assert(strstr(e2, e1) && strstr(e2, "GPU 0"), "'%s' against '%s'", e2, e1);
}

/* Llama-2-70B Q4_K_M (40.9 GB) under two 24 GiB budgets: every layer resident, half on each device, and the
 * whole KV pool on both; under two 16 GiB budgets the host layers are balanced between them. */
Test(device_split, llama70b_q4km_on_two_24gib_devices)
{
    const uint64_t b24[] = {24 * GIB, 24 * GIB};
    struct device_split_input in = split_of(llama70b_q4km(), 2, b24);
    in.peer_bytes_per_s = 20e9;
    struct device_split s;
    char err[256] = "";
    cr_assert_eq(device_split_plan(&in, &s, err), FERRY_OK, "%s", err);
    assert_sound(&in, &s);
    cr_assert_eq(s.part[0].map.n_resident + s.part[1].map.n_resident, 80);
    cr_assert_eq(s.kv_tokens, 4 * 4096, "the whole pool fits beside every layer");
    cr_assert_eq(s.part[0].end, 40, "balanced: %d layers on the first", s.part[0].end);
    /* the head on the last device only, the embedding on none */
    uint64_t last = 0;
    for (int l = s.part[1].first; l < 80; l++) last += q4km_70b[l];
    cr_assert_eq(s.part[1].map.bytes_total, 900 * MIB + 215000000ull + s.part[1].map.kv_bytes + last);
    uint64_t first = 0;
    for (int l = 0; l < s.part[0].end; l++) first += q4km_70b[l];
    cr_assert_eq(s.part[0].map.bytes_total, 900 * MIB + s.part[0].map.kv_bytes + first);
    const double peer = 8192 * 4 / 20e9;
    cr_assert_float_eq(s.peer_s, peer, 1e-15);
    cr_assert_float_eq(s.predicted_step_s,
                       s.part[0].map.predicted_step_s + s.part[1].map.predicted_step_s + peer, 1e-12);
    char buf[4096];
    device_split_format(&s, buf, sizeof buf);
    cr_assert(strstr(buf, "GPU 0: layers 0-") && strstr(buf, "GPU 1: layers ") &&
                  strstr(buf, "output head") && strstr(buf, "KV pool of 16384 positions on every device"),
              "%s", buf);
    device_split_free(&s);

    const uint64_t b16[] = {16 * GIB, 16 * GIB};
    in = split_of(llama70b_q4km(), 2, b16);
    cr_assert_eq(device_split_plan(&in, &s, err), FERRY_OK, "%s", err);
    assert_sound(&in, &s);
    /* 59 resident of 80: one device streams through a ring (560 MiB), the other keeps all its layers; a ring
     * on both would cost a layer's bytes more. Neither has room for another layer. */
    cr_assert_eq(s.part[0].map.n_resident + s.part[1].map.n_resident, 59);
    cr_assert_eq((s.part[0].map.n_streamed > 0) + (s.part[1].map.n_streamed > 0), 1);
    for (int d = 0; d < 2; d++)
        cr_assert_lt(s.part[d].budget - s.part[d].map.bytes_total, 541000000ull, "device %d", d);
    device_split_free(&s);
}

/* Uneven budgets (20 + 12 GiB): the larger device takes more layers; no device keeps every layer resident
 * with room for another while the other leaves some in host memory (moving the boundary would place it). */
Test(device_split, uneven_budgets_are_balanced)
{
    const uint64_t b[] = {20 * GIB, 12 * GIB};
    struct device_split_input in = split_of(llama70b_q4km(), 2, b);
    struct device_split s;
    char err[256] = "";
    cr_assert_eq(device_split_plan(&in, &s, err), FERRY_OK, "%s", err);
    assert_sound(&in, &s);
    const struct device_map *m0 = &s.part[0].map, *m1 = &s.part[1].map;
    cr_assert_gt(s.part[0].end, 80 - s.part[0].end, "20 GiB holds more layers than 12");
    cr_assert_gt(m0->n_resident, m1->n_resident);
    cr_assert_gt(m0->n_streamed + m1->n_streamed, 0, "40.9 GB do not fit 32 GiB");
    for (int d = 0; d < 2; d++) {
        const struct device_map *m = &s.part[d].map, *o = &s.part[1 - d].map;
        if (m->n_streamed == 0 && o->n_streamed > 0)
            cr_assert_lt(s.part[d].budget - m->bytes_total, 541000000ull + 16 * 320 * 1024 * 40,
                         "device %d has room for another layer", d);
    }
    /* The split holds at least as many resident layers as the two budgets planned apart at the same boundary
     * would, and not fewer KV positions than the tighter of them. */
    cr_assert_geq(s.kv_tokens, 4 * 1024);
    device_split_free(&s);
}

Test(device_split, three_devices_and_a_tiny_one_refused_by_name)
{
    const uint64_t b[] = {16 * GIB, 8 * GIB, 4 * GIB};
    struct device_split_input in = split_of(llama70b_q4km(), 3, b);
    in.ordinal[0] = 0, in.ordinal[1] = 2, in.ordinal[2] = 5;
    struct device_split s;
    char err[256] = "";
    cr_assert_eq(device_split_plan(&in, &s, err), FERRY_OK, "%s", err);
    assert_sound(&in, &s);
    cr_assert_geq(s.part[0].end - s.part[0].first, s.part[1].end - s.part[1].first);
    cr_assert_geq(s.part[1].end - s.part[1].first, s.part[2].end - s.part[2].first);
    device_split_free(&s);

    /* 600 MiB cannot hold its fixed 900 MiB: refused, naming ordinal 5 and the minimum of one layer there. */
    in.budget[2] = 600 * MIB;
    cr_assert_eq(device_split_plan(&in, &s, err), FERRY_ERR_DEVICE_MEM);
    cr_assert(strstr(err, "GPU 5 (layers 79-79 of 80)") && strstr(err, "the minimum is"), "%s", err);
    cr_assert_eq(s.n_devices, 0, "nothing left to free");
}

/* Llama-7B with a planner-sized pool on devices of 6 and 3 GiB: the pool's positions are those the tighter
 * device allows, and the roomier one, planned again at them, puts its spare bytes into layers. */
Test(device_split, kv_positions_are_the_tightest_devices)
{
    const uint64_t b[] = {6 * GIB, 3 * GIB};
    struct device_split_input in =
        split_of(with_auto_kv512(llama7b_like(0), 16 * 1024, 4 * 1024, 1024), 2, b);
    struct device_split s;
    char err[256] = "";
    cr_assert_eq(device_split_plan(&in, &s, err), FERRY_OK, "%s", err);
    assert_sound(&in, &s);
    cr_assert_geq(s.kv_tokens, 1024);
    cr_assert_eq(s.kv_tokens % 16, 0);
    for (int d = 0; d < 2; d++) {
        const struct device_split_part *p = &s.part[d];
        cr_assert_eq(p->map.kv_bytes,
                     (uint64_t)s.kv_tokens * (512 * 1024 / 32) * (uint64_t)(p->end - p->first));
        cr_assert_eq(p->map.kv_ext_tokens, 0, "several devices keep no extension");
    }
    device_split_free(&s);
}

/* An expert model (Qwen3-30B-A3B-shaped: 48 layers, 20 MiB blocks, 340 MB of experts each) on two 6 GiB
 * devices: every block resident on its device, each device's host experts its first layers', the cache
 * filling what is left; with one 12 GiB device, the fewest host layers whose plan fits. */
static uint64_t moe_blocks[48], moe_experts[48];
static struct device_split_input moe_input(int n, const uint64_t *budgets)
{
    for (int l = 0; l < 48; l++) moe_blocks[l] = 20 * MIB, moe_experts[l] = 340000000ull;
    struct device_map_input m = {.n_layers = 48,
                                 .layer_bytes = 20 * MIB,
                                 .layer_sizes = moe_blocks,
                                 .piece_bytes = 8 * MIB,
                                 .head_bytes = 300 * MIB,
                                 .fixed_bytes = 700 * MIB,
                                 .gpu_layers = -1,
                                 .host_map_div = 512};
    struct device_split_input in = split_of(with_auto_kv(m, 96 * 1024, 4 * 4096, 4 * 1024, 4096), n, budgets);
    in.expert_bytes = moe_experts;
    in.expert_stage_bytes = 2 * 340000000ull;
    in.expert_cache = -1;
    in.expert_slot_bytes = 2654208;
    return in;
}

Test(device_split, experts_split_by_device)
{
    const uint64_t b[] = {6 * GIB, 6 * GIB};
    struct device_split_input in = moe_input(2, b);
    struct device_split s;
    char err[256] = "";
    cr_assert_eq(device_split_plan(&in, &s, err), FERRY_OK, "%s", err);
    assert_sound(&in, &s);
    /* Host experts need a staging area (680 MB) on their device: they gather on one device, the other keeping
     * all of its layers' experts and no cache; the cache takes what the host experts' device leaves, in whole
     * slots. */
    int host = 0;
    for (int d = 0; d < 2; d++) {
        const struct device_split_part *p = &s.part[d];
        cr_assert_eq(p->map.n_resident, p->end - p->first, "every block of device %d resident", d);
        cr_assert_eq(p->map.cpu_moe, p->cpu_moe);
        cr_assert_eq(p->host_bytes, (uint64_t)p->cpu_moe * 340000000ull);
        if (p->cpu_moe) {
            cr_assert_eq(p->map.expert_cache_bytes % 2654208, 0);
            cr_assert_lt(p->budget - p->map.bytes_total, 2654208, "the cache takes what is left");
        } else {
            cr_assert_eq(p->map.expert_cache_bytes, 0);
            cr_assert_lt(p->budget - p->map.bytes_total, 340000000ull, "no room for another layer's experts");
        }
        host += p->cpu_moe;
    }
    cr_assert_eq((s.part[0].cpu_moe > 0) + (s.part[1].cpu_moe > 0), 1);
    device_split_free(&s);

    /* --cpu-moe 30 over two devices: the model's first 30 layers, wherever their device. */
    in.cpu_moe = 30;
    in.expert_cache = 0;
    cr_assert_eq(device_split_plan(&in, &s, err), FERRY_OK, "%s", err);
    const int b0 = s.part[0].end;
    cr_assert_eq(s.part[0].cpu_moe, b0 < 30 ? b0 : 30);
    cr_assert_eq(s.part[1].cpu_moe, b0 < 30 ? 30 - b0 : 0);
    device_split_free(&s);

    /* One device: the fewest host layers with which device_map's plan fits, as forward_cuda plans one. */
    const uint64_t one[] = {12 * GIB};
    in = moe_input(1, one);
    in.expert_cache = 0;
    cr_assert_eq(device_split_plan(&in, &s, err), FERRY_OK, "%s", err);
    int c = 0;
    for (;; c++) {
        uint64_t sizes[48], emap = 0;
        for (int l = 0; l < 48; l++) sizes[l] = 20 * MIB + (l >= c ? 340000000ull : 0);
        for (int l = 0; l < c; l++) emap += (340000000ull + 511) / 512;
        struct device_map_input m = in.model;
        m.budget = 12 * GIB, m.gpu_layers = 48, m.layer_sizes = sizes;
        m.fixed_bytes += (c ? 2 * 340000000ull : 0) + emap;
        struct device_map want;
        char e[256];
        if (device_map_plan(&m, &want, e) == FERRY_OK) {
            cr_assert_eq(s.part[0].cpu_moe, c);
            /* two devices of half the budget: a second copy of the fixed bytes (700 MiB) and no more */
            cr_assert_geq(host, c);
            cr_assert_leq(host, c + 3, "%d host layers on two 6 GiB devices, %d on one of 12", host, c);
            cr_assert_eq(s.part[0].map.bytes_total, want.bytes_total);
            cr_assert_eq(s.part[0].map.kv_tokens, want.kv_tokens);
            device_map_free(&want);
            break;
        }
    }
    device_split_free(&s);
}

Test(device_split, bad_requests)
{
    const uint64_t b[17] = {4 * GIB, 4 * GIB, 0};
    struct device_split s;
    char err[256] = "";
    struct device_split_input in = split_of(llama7b_like(0), 0, b);
    cr_assert_eq(device_split_plan(&in, &s, err), FERRY_ERR_INVALID);
    in.n_devices = 17;
    cr_assert_eq(device_split_plan(&in, &s, err), FERRY_ERR_INVALID);
    in = split_of(llama7b_like(0), 3, b);
    cr_assert_eq(device_split_plan(&in, &s, err), FERRY_ERR_INVALID);
    cr_assert(strstr(err, "GPU 2"), "%s", err);
    in = split_of(llama7b_like(0), 2, b);
    in.model.gpu_layers = 10;
    cr_assert_eq(device_split_plan(&in, &s, err), FERRY_ERR_INVALID);
    cr_assert(strstr(err, "--gpu-layers"), "%s", err);
    in = split_of(llama7b_like(0), 2, b);
    in.model.n_layers = 1;
    cr_assert_eq(device_split_plan(&in, &s, err), FERRY_ERR_INVALID);
}
