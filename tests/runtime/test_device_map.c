/* test_device_map — the placement planner's arithmetic: budgets, the minimum, the even spread. */
#include <criterion/criterion.h>
#include <string.h>

#include "kernels/core/status.h"
#include "runtime/device_map.h"

#define MIB (1024ull * 1024ull)

static struct device_map_input llama7b_like(uint64_t budget)
{
    return (struct device_map_input){.n_layers = 32, .layer_bytes = 386 * MIB, .head_bytes = 250 * MIB,
                                     .fixed_bytes = 600 * MIB, .budget = budget, .gpu_layers = -1,
                                     .h2d_bytes_per_s = 54.9e9, .hbm_bytes_per_s = 4.2e12};
}

Test(device_map, everything_fits)
{
    struct device_map m;
    char err[256] = "";
    struct device_map_input in = llama7b_like(80000 * MIB);
    cr_assert_eq(device_map_plan(&in, &m, err), 0, "%s", err);
    cr_assert_eq(m.n_resident, 32);
    cr_assert_eq(m.n_streamed, 0);
    cr_assert_eq(m.n_slots, 0);
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
    /* 4096 - 850 = 3246 MiB: 2 slots (772) leave 2474 MiB = 6 layers of 386. */
    cr_assert_eq(m.n_slots, 2);
    cr_assert_eq(m.n_resident, 6);
    cr_assert_eq(m.n_streamed, 26);
    cr_assert_leq(m.bytes_total, budget);
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
    cr_assert_eq(resident, 6);
    cr_assert_eq(streamed, 26);
    /* 26 streamed among 32: resident layers break the streamed runs evenly (runs of at most 5). */
    cr_assert_leq(max_run, 5);
    cr_assert_gt(m.predicted_step_s, 26 * 386.0 * MIB / 54.9e9 * 0.99);
    device_map_free(&m);
}

Test(device_map, minimum_budget_is_exact_and_named)
{
    struct device_map m;
    char err[256] = "";
    struct device_map_input in = llama7b_like(600 * MIB + 250 * MIB + 2 * 386 * MIB);
    cr_assert_eq(device_map_plan(&in, &m, err), 0, "%s", err);
    cr_assert_eq(m.n_resident, 0);
    cr_assert_eq(m.n_streamed, 32);
    cr_assert_eq(m.n_slots, 2);
    device_map_free(&m);
    in.budget -= 1;
    cr_assert_eq(device_map_plan(&in, &m, err), FERRY_ERR_DEVICE_MEM);
    cr_assert(strstr(err, "minimum is 1.58 GiB"), "message: %s", err);
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
    in.n_slots = 3;
    cr_assert_eq(device_map_plan(&in, &m, err), 0, "%s", err);
    cr_assert_eq(m.n_resident, 16);
    cr_assert_eq(m.n_slots, 3);
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
    cr_assert(strstr(buf, "30 layers resident, 2 streamed through 2 slots"), "%s", buf);
    cr_assert(strstr(buf, "stream"), "%s", buf);
    device_map_free(&m);
}
