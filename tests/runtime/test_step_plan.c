/* test_step_plan — the per-step placement of host layers: buckets, the choice per step size against a brute
 * force over every count of host layers on the CPU, the simulation against closed forms, modes, forced plans.
 * Pure arithmetic (no device): the costs are Llama-2-7B's shapes with the H200 machine's rates. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "kernels/core/status.h"
#include "runtime/ring.h"
#include "runtime/step_plan.h"

#define L7        32
#define LAYER_F16 404750336ull /* one Llama-2-7B layer in f16 */
#define PARAMS    202375168ull

static enum placement where7[L7];
static uint64_t bytes7[L7], params7[L7];

/* The device_map of a 4 GiB budget: 5 resident layers spread among 27 in host memory, a ring of two whole
 * layers (each layer one piece: the ring of slots before pieces). cpu_gbs: the
 * host's read rate at 1 token; cpu_tflops: its matrix rate at larger steps. */
static struct step_plan_input llama7b(int resident, double cpu_gbs, double cpu_tflops)
{
    const int S = L7 - resident;
    for (int i = 0; i < L7; i++) {
        where7[i] = (int64_t)(i + 1) * S / L7 > (int64_t)i * S / L7 ? PLACEMENT_STREAM : PLACEMENT_GPU;
        bytes7[i] = LAYER_F16;
        params7[i] = PARAMS;
    }
    struct step_plan_input in = {.n_layers = L7,
                                 .where = where7,
                                 .layer_bytes = bytes7,
                                 .layer_params = params7,
                                 .head_bytes = 262144000,
                                 .ring_bytes = 2 * LAYER_F16,
                                 .max_tokens = 512,
                                 .mode = STEP_MODE_AUTO,
                                 .margin = 0.03};
    struct step_cost *c = &in.cost;
    c->h2d = 55e9;
    c->h2d_loaded = 50e9;
    c->hbm = 3.3e12;
    c->gpu_flops = 250e12;
    c->gpu_layer_s = 10e-6;
    c->step_s = 100e-6;
    c->cpu_ref_bytes = LAYER_F16;
    for (int m = 1; m <= 64; m *= 2) {
        const double mem = LAYER_F16 / (cpu_gbs * 1e9), math = 2.0 * PARAMS * m / (cpu_tflops * 1e12);
        c->cpu_m[c->n_cpu] = m;
        c->cpu_s[c->n_cpu++] = mem > math ? mem : math;
    }
    c->sync_s = 20e-6;
    c->layer_bytes_per_token = (2 * 4096 + 2 * 4096) * 4;
    c->run_bytes_per_token = 2 * 4096 * 4;
    return in;
}

static void make(const struct step_plan_input *in, struct step_plan *p)
{
    char err[256] = "";
    cr_assert_eq(step_plan_make(in, p, err), FERRY_OK, "%s", err);
}

Test(step_plan, buckets_are_powers_of_two_up_to_max)
{
    struct step_plan p;
    cr_assert_eq(step_plan_uniform(&p, 4, 48, PLACEMENT_CPU), FERRY_OK);
    const int want[] = {1, 2, 4, 8, 16, 32, 48};
    cr_assert_eq(p.n_buckets, 7);
    for (int b = 0; b < 7; b++) cr_assert_eq(p.tokens[b], want[b]);
    cr_assert_eq(step_plan_bucket(&p, 1), 0);
    cr_assert_eq(step_plan_bucket(&p, 2), 1);
    cr_assert_eq(step_plan_bucket(&p, 3), 2);
    cr_assert_eq(step_plan_bucket(&p, 33), 6);
    cr_assert_eq(step_plan_bucket(&p, 48), 6);
    for (int l = 0; l < 4; l++) cr_assert_eq(step_plan_where(&p, 17)[l], PLACEMENT_CPU);
    step_plan_free(&p);
    cr_assert_eq(step_plan_uniform(&p, 4, 1, PLACEMENT_GPU), FERRY_OK);
    cr_assert_eq(p.n_buckets, 1);
    cr_assert_eq(p.tokens[0], 1);
    step_plan_free(&p);
    cr_assert_eq(step_plan_uniform(&p, 0, 4, PLACEMENT_GPU), FERRY_ERR_INVALID);
}

/* Streaming alone is the link's time; everything resident is the device's. */
Test(step_plan, simulation_matches_closed_forms)
{
    struct step_plan_input in = llama7b(5, 84, 1.5);
    enum placement w[L7];
    memcpy(w, where7, sizeof w);
    const double link = 27.0 * LAYER_F16 / in.cost.h2d;
    const double t = step_plan_simulate(&in, w, 1);
    /* Link bound: 27 copies back to back (the next step's first copies overlap this one's tail). */
    cr_assert(fabs(t - link) < 0.01 * link, "streaming all: %g s, link alone %g s", t, link);
    for (int i = 0; i < L7; i++) w[i] = PLACEMENT_GPU;
    const double dev =
        in.cost.step_s + 32 * (in.cost.gpu_layer_s + LAYER_F16 / in.cost.hbm) + 262144000 / in.cost.hbm;
    cr_assert(fabs(step_plan_simulate(&in, w, 1) - dev) < 1e-9, "resident: %g vs %g",
              step_plan_simulate(&in, w, 1), dev);
    /* All host layers on the CPU: the chain of host layers plus exchanges. */
    for (int i = 0; i < L7; i++) w[i] = where7[i] == PLACEMENT_GPU ? PLACEMENT_GPU : PLACEMENT_CPU;
    const double cpu = step_plan_simulate(&in, w, 1);
    const double cpu_floor = 27 * step_cost_cpu_layer(&in.cost, LAYER_F16, 1);
    cr_assert(cpu > cpu_floor && cpu < cpu_floor + 0.01, "cpu all: %g vs floor %g", cpu, cpu_floor);
    /* A ring of one layer serialises copy and use; a deeper one never hurts. */
    for (int i = 0; i < L7; i++) w[i] = where7[i];
    in.ring_bytes = LAYER_F16;
    const double k1 = step_plan_simulate(&in, w, 1);
    in.ring_bytes = 3 * LAYER_F16;
    const double k3 = step_plan_simulate(&in, w, 1);
    cr_assert_gt(k1, t * 1.005, "one layer %g vs two %g", k1, t);
    cr_assert_leq(k3, t * 1.0001);
    /* Pieces (the matrix groups): a ring of two of the largest keeps the link as busy as two whole layers; a
     * ring of one serialises again. */
    static uint64_t pieces[L7 * 4];
    for (int i = 0; i < L7; i++) {
        pieces[4 * i] = 100663296, pieces[4 * i + 1] = 33554432;     /* q|k|v, o */
        pieces[4 * i + 2] = 180355072, pieces[4 * i + 3] = 90177536; /* gate|up, down */
    }
    in.piece_bytes = pieces;
    in.n_pieces = 4;
    in.ring_bytes = 2 * 180355072;
    const double p2 = step_plan_simulate(&in, w, 1);
    cr_assert(fabs(p2 - link) < 0.01 * link, "two pieces: %g s, link alone %g s", p2, link);
    in.ring_bytes = 180355072;
    cr_assert_gt(step_plan_simulate(&in, w, 1), p2 * 1.005, "a ring of one piece");
    in.ring_bytes = 180355072 - 1;
    cr_assert(isinf(step_plan_simulate(&in, w, 1)), "a piece larger than the ring");
    in.piece_bytes = NULL;
    in.ring_bytes = 0;
    cr_assert(isinf(step_plan_simulate(&in, w, 1)), "streaming without a ring is impossible");
}

/* The planner's choice at each size is the best count of CPU layers (brute force), its CPU layers are spread,
 * small steps use the host and large ones stream. */
Test(step_plan, auto_picks_the_fastest_count_per_size)
{
    struct step_plan_input in = llama7b(5, 84, 1.5);
    struct step_plan p;
    make(&in, &p);
    char buf[4096];
    step_plan_format(&p, buf, sizeof buf);
    fprintf(stderr, "%s", buf);
    enum placement trial[L7];
    for (int b = 0; b < p.n_buckets; b++) {
        const int m = p.tokens[b];
        const enum placement *w = p.where + (size_t)b * L7;
        double best = INFINITY;
        for (int c = 0; c <= 27; c++) {
            for (int l = 0, j = 0; l < L7; l++) {
                if (where7[l] == PLACEMENT_GPU) {
                    trial[l] = PLACEMENT_GPU;
                    continue;
                }
                trial[l] = (int64_t)(j + 1) * c / 27 > (int64_t)j * c / 27 ? PLACEMENT_CPU : PLACEMENT_STREAM;
                j++;
            }
            const double t = step_plan_simulate(&in, trial, m);
            if (t < best) best = t;
        }
        cr_assert_leq(p.predicted_s[b], best / (1 - in.margin) + 1e-12, "tokens %d: %g vs best %g", m,
                      p.predicted_s[b], best);
        cr_assert_leq(p.predicted_s[b], p.stream_s[b] + 1e-12, "tokens %d: never slower than streaming", m);
        cr_assert_eq(p.n_cpu[b] + p.n_stream[b], 27);
        for (int l = 0; l < L7; l++)
            cr_assert_eq(w[l] == PLACEMENT_GPU, where7[l] == PLACEMENT_GPU, "resident layers stay resident");
    }
    /* Batch 1: the host takes about half the host layers (the link moves a layer in 7.4 ms, the host reads
     * one in 4.8 ms), and the step is ~2.3x faster than streaming. */
    cr_assert(p.n_cpu[0] >= 12 && p.n_cpu[0] <= 20, "cpu layers at 1 token: %d", p.n_cpu[0]);
    cr_assert_lt(p.predicted_s[0], 0.5 * p.stream_s[0]);
    /* The CPU layers are spread: never three in a row. */
    for (int l = 2; l < L7; l++)
        cr_assert(!(p.where[l] == PLACEMENT_CPU && p.where[l - 1] == PLACEMENT_CPU &&
                    p.where[l - 2] == PLACEMENT_CPU),
                  "three CPU layers in a row at %d", l);
    /* Prefill-sized steps stream everything: the host would need ~0.14 s per layer. */
    const int last = p.n_buckets - 1;
    cr_assert_eq(p.tokens[last], 512);
    cr_assert_eq(p.n_cpu[last], 0);
    /* Fewer host layers as steps grow. */
    for (int b = 1; b < p.n_buckets; b++) cr_assert_leq(p.n_cpu[b], p.n_cpu[b - 1] + 1, "bucket %d", b);
    step_plan_free(&p);
}

/* A slow host never takes a layer, and a gain below the margin is not worth the risk. */
Test(step_plan, slow_host_and_margin_keep_streaming)
{
    struct step_plan_input in = llama7b(5, 4, 0.05);
    struct step_plan p;
    make(&in, &p);
    for (int b = 0; b < p.n_buckets; b++) cr_assert_eq(p.n_cpu[b], 0, "bucket %d", b);
    step_plan_free(&p);
    /* A host just fast enough that one CPU layer saves ~1%: with a 3% margin, still streaming. */
    in = llama7b(31, 84, 1.5); /* one host layer */
    const double link = LAYER_F16 / in.cost.h2d;
    enum placement w[L7];
    memcpy(w, where7, sizeof w);
    const double t_stream = step_plan_simulate(&in, w, 1);
    for (int l = 0; l < L7; l++)
        if (w[l] == PLACEMENT_STREAM) w[l] = PLACEMENT_CPU;
    /* Tune the host's time so the CPU plan is 1% faster than streaming. */
    const double target = 0.99 * t_stream, t_cpu = step_plan_simulate(&in, w, 1);
    const double scale = (target - (t_cpu - in.cost.cpu_s[0])) / in.cost.cpu_s[0];
    for (int i = 0; i < in.cost.n_cpu; i++) in.cost.cpu_s[i] *= scale;
    cr_assert(fabs(step_plan_simulate(&in, w, 1) - target) < 1e-6 * target + 1e-9);
    (void)link;
    make(&in, &p);
    cr_assert_eq(p.n_cpu[0], 0, "a 1%% gain stays below the margin");
    step_plan_free(&p);
    in.margin = 0;
    make(&in, &p);
    cr_assert_eq(p.n_cpu[0], 1, "without a margin the faster plan wins");
    step_plan_free(&p);
}

Test(step_plan, modes_force_one_choice)
{
    struct step_plan_input in = llama7b(5, 84, 1.5);
    struct step_plan p;
    in.mode = STEP_MODE_STREAM;
    make(&in, &p);
    for (int b = 0; b < p.n_buckets; b++) {
        cr_assert_eq(p.n_cpu[b], 0);
        cr_assert_eq(p.n_stream[b], 27);
        cr_assert(fabs(p.predicted_s[b] - p.stream_s[b]) < 1e-12);
    }
    step_plan_free(&p);
    in.mode = STEP_MODE_CPU;
    make(&in, &p);
    for (int b = 0; b < p.n_buckets; b++) cr_assert_eq(p.n_cpu[b], 27);
    step_plan_free(&p);
    /* No ring (--placement cpu plans without one): AUTO can only compute host layers on the CPU. */
    in.mode = STEP_MODE_AUTO;
    in.ring_bytes = 0;
    make(&in, &p);
    for (int b = 0; b < p.n_buckets; b++) {
        cr_assert_eq(p.n_cpu[b], 27);
        cr_assert_eq(p.stream_s[b], 0);
        cr_assert_gt(p.predicted_s[b], 0);
    }
    step_plan_free(&p);
    /* Nothing in host memory: every layer on the GPU, at every size. */
    for (int i = 0; i < L7; i++) where7[i] = PLACEMENT_GPU;
    in.ring_bytes = 0;
    make(&in, &p);
    for (int b = 0; b < p.n_buckets; b++) {
        cr_assert_eq(p.n_cpu[b] + p.n_stream[b], 0);
        for (int l = 0; l < L7; l++) cr_assert_eq(p.where[(size_t)b * L7 + l], PLACEMENT_GPU);
    }
    step_plan_free(&p);
}

Test(step_plan, forced_plans_are_checked)
{
    enum placement where[4] = {PLACEMENT_GPU, PLACEMENT_STREAM, PLACEMENT_STREAM, PLACEMENT_STREAM};
    uint64_t bytes[4] = {100, 100, 100, 100}, params[4] = {50, 50, 50, 50};
    struct step_plan_input in = {.n_layers = 4,
                                 .where = where,
                                 .layer_bytes = bytes,
                                 .layer_params = params,
                                 .ring_bytes = 200,
                                 .max_tokens = 16,
                                 .force = "gscc/gcsc/gsss"};
    in.cost.h2d = 1e9;
    in.cost.hbm = 1e12;
    struct step_plan p;
    char err[256] = "";
    cr_assert_eq(step_plan_make(&in, &p, err), FERRY_OK, "%s", err);
    const char *want[] = {"gscc", "gcsc", "gsss", "gsss", "gsss"};
    cr_assert_eq(p.n_buckets, 5);
    for (int b = 0; b < 5; b++)
        for (int l = 0; l < 4; l++) {
            const enum placement w = p.where[b * 4 + l];
            cr_assert_eq(w == PLACEMENT_GPU      ? 'g'
                         : w == PLACEMENT_STREAM ? 's'
                                                 : 'c',
                         want[b][l], "bucket %d layer %d", b, l);
        }
    cr_assert_eq(p.n_cpu[0], 2);
    cr_assert_eq(p.n_stream[2], 3);
    step_plan_free(&p);
    const char *bad[] = {"gsc", "gscx", "sscc", "gscg", "gscc/gs"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        in.force = bad[i];
        err[0] = 0;
        cr_assert_eq(step_plan_make(&in, &p, err), FERRY_ERR_INVALID, "'%s' accepted", bad[i]);
        cr_assert(strstr(err, "forced plan"), "%s", err);
    }
    in.force = "gscc";
    in.ring_bytes = 0;
    cr_assert_eq(step_plan_make(&in, &p, err), FERRY_ERR_INVALID, "streaming without a ring");
}

/* Layers of two sizes (Q4_K_M stores some layers in Q6_K): the host's time scales with each layer's bytes. */
Test(step_plan, host_time_scales_with_layer_bytes)
{
    struct step_plan_input in = llama7b(5, 84, 1.5);
    const double t = step_cost_cpu_layer(&in.cost, LAYER_F16, 1);
    cr_assert(fabs(step_cost_cpu_layer(&in.cost, LAYER_F16 / 2, 1) - t / 2) < 1e-12);
    /* Between measured sizes: linear; past the largest: proportional to m. */
    const double t48 = step_cost_cpu_layer(&in.cost, LAYER_F16, 48);
    const double t32 = in.cost.cpu_s[5], t64 = in.cost.cpu_s[6];
    cr_assert(fabs(t48 - (t32 + t64) / 2) < 1e-12, "%g vs %g", t48, (t32 + t64) / 2);
    cr_assert(fabs(step_cost_cpu_layer(&in.cost, LAYER_F16, 512) - t64 * 8) < 1e-12);
    struct step_cost none = {0};
    cr_assert(isinf(step_cost_cpu_layer(&none, LAYER_F16, 1)), "no measurement: the host is never chosen");
}

Test(step_plan, workload_adds_prefill_chunks_and_decode_steps)
{
    struct step_plan p = {
        .n_layers = 1, .n_buckets = 3, .tokens = {1, 2, 4}, .predicted_s = {0.01, 0.015, 0.02}};
    /* 2 sequences x 5 prompt tokens = 2 steps of 4 + one of 2; then 3 decode steps of 2 */
    cr_assert_float_eq(step_plan_workload_s(&p, 2, 5, 3), 2 * 0.02 + 0.015 + 3 * 0.015, 1e-12);
    /* 6 sequences: 30 prompt tokens = 7 x 4 + 2; each decode step of 6 takes two of the largest */
    cr_assert_float_eq(step_plan_workload_s(&p, 6, 5, 3), 7 * 0.02 + 0.015 + 6 * 0.02, 1e-12);
    cr_assert_float_eq(step_plan_workload_s(&p, 1, 0, 4), 4 * 0.01, 1e-12);
    p.predicted_s[1] = 0; /* a step the workload needs has no prediction */
    cr_assert_eq(step_plan_workload_s(&p, 2, 5, 3), 0);
    cr_assert_eq(step_plan_workload_s(&p, 0, 5, 3), 0);
}

/* The choice --placement auto makes at load (runtime/engine.c settle_ring): a Q4_K_M Llama-2-7B under 4 GiB
 * holds 26 layers and a ring of 2 slots, or 30 layers and no ring. One sequence decodes faster without the
 * ring (two host layers on the CPU instead of six shared with the link), sixteen faster with it (streamed
 * bytes serve every token; the host's time grows with them), which is what the H200 machine measured
 * (tests/gpu/results/2026-12-01c: b=1 127 vs 91.5 tok/s, b=16 493 vs 1,120). */
Test(step_plan, ring_or_more_resident_layers_depends_on_concurrency)
{
    const uint64_t q4 = 122000000ull;
    struct step_plan ring, none;
    enum placement w_ring[L7], w_none[L7];
    struct step_plan_input in = llama7b(26, 84, 1.5);
    for (int i = 0; i < L7; i++) {
        bytes7[i] = q4;
        w_ring[i] = where7[i];
        w_none[i] = (int64_t)(i + 1) * 2 / L7 > (int64_t)i * 2 / L7 ? PLACEMENT_STREAM : PLACEMENT_GPU;
    }
    in.cost.cpu_ref_bytes = q4;
    in.ring_bytes = 2 * q4;
    for (int i = 0; i < in.cost.n_cpu; i++) { /* 2.4 ms a layer at 1 token (measured), compute bound above */
        const double math = 2.0 * PARAMS * in.cost.cpu_m[i] / 1.5e12;
        in.cost.cpu_s[i] = math > 2.4e-3 ? math : 2.4e-3;
    }
    in.where = w_ring;
    make(&in, &ring);
    in.where = w_none;
    in.ring_bytes = 0;
    make(&in, &none);
    const double r1 = step_plan_workload_s(&ring, 1, 512, 256), n1 = step_plan_workload_s(&none, 1, 512, 256);
    const double r16 = step_plan_workload_s(&ring, 16, 512, 256),
                 n16 = step_plan_workload_s(&none, 16, 512, 256);
    cr_assert(r1 > 0 && n1 > 0 && r16 > 0 && n16 > 0);
    cr_expect_lt(n1, r1 * 0.97, "one sequence: no ring %.3f s, ring %.3f s", n1, r1);
    cr_expect_gt(n16, r16, "16 sequences: no ring %.3f s, ring %.3f s", n16, r16);
    step_plan_free(&ring);
    step_plan_free(&none);
}

/* The host's pace: the median of the last STEP_PACE_WINDOW steps' ratios, followed only when it leaves the
 * band around the current pace; outliers and bad observations do not move it. */
Test(step_plan, pace_follows_the_median_outside_the_band)
{
    struct step_pace p;
    step_pace_init(&p);
    cr_assert_eq(p.pace, 1.0);
    /* Noise inside the band: never a revision. */
    for (int i = 0; i < 5 * STEP_PACE_WINDOW; i++)
        cr_assert_eq(step_pace_observe(&p, 5, i % 2 ? 1.12 : 0.9, 1.0, 1.0), 0, "step %d", i);
    cr_assert_eq(p.pace, 1.0);
    /* Outliers (a step that met a page fault, one that found the layer in cache): the median holds. */
    step_pace_init(&p);
    for (int i = 0; i < 3 * STEP_PACE_WINDOW; i++)
        cr_assert_eq(step_pace_observe(&p, 5,
                                       i % 3 == 0   ? 40.0
                                       : i % 3 == 1 ? 0.01
                                                    : 1.0,
                                       1.0, 1.0),
                     0, "step %d", i);
    /* Bad observations are ignored. */
    cr_assert_eq(step_pace_observe(&p, 5, 0.0, 1.0, 1.0), 0);
    cr_assert_eq(step_pace_observe(&p, 5, 1.0, 0.0, 1.0), 0);
    cr_assert_eq(step_pace_observe(&p, 5, NAN, 1.0, 1.0), 0);
    cr_assert_eq(step_pace_observe(&p, 5, 1.0, 1.0, INFINITY), 0);
    cr_assert_eq(step_pace_observe(&p, 5, 1.0, 2.0, 1.0), 0); /* lo > hi */
    cr_assert_eq(step_pace_observe(&p, 0, 1.0, 1.0, 1.0), 0); /* no CPU layer */
    /* A host at half speed: the revision comes when the window holds a majority of slow steps. */
    step_pace_init(&p);
    int revised_at = -1;
    for (int i = 0; i < 2 * STEP_PACE_WINDOW && revised_at < 0; i++)
        if (step_pace_observe(&p, 5, 2.0e-3, 1.0e-3, 1.0e-3)) revised_at = i;
    cr_assert_eq(revised_at, STEP_PACE_WINDOW - 1);
    cr_assert_float_eq(p.pace, 2.0, 1e-12);
    /* The same pace again: no revision; back to the start-up speed: a second one, after a full window. */
    for (int i = 0; i < 2 * STEP_PACE_WINDOW; i++) cr_assert_eq(step_pace_observe(&p, 5, 2.1, 1.0, 1.0), 0);
    revised_at = -1;
    for (int i = 0; i < 2 * STEP_PACE_WINDOW && revised_at < 0; i++)
        if (step_pace_observe(&p, 5, 1.0, 1.0, 1.0)) revised_at = i;
    cr_assert_eq(revised_at, STEP_PACE_WINDOW / 2, "the median turns once half the window is fast");
    cr_assert_float_eq(p.pace, 1.0, 1e-12);
    /* Clamped at the extremes. */
    step_pace_init(&p);
    for (int i = 0; i < STEP_PACE_WINDOW; i++) step_pace_observe(&p, 5, 1000.0, 1.0, 1.0);
    cr_assert_eq(p.pace, STEP_PACE_MAX);
    for (int i = 0; i < STEP_PACE_WINDOW; i++) step_pace_observe(&p, 5, 1e-6, 1.0, 1.0);
    cr_assert_eq(p.pace, STEP_PACE_MIN);
}

/* A step that streams: the model times the host's layers alone (lo) and beside the link's copies (hi), and
 * the link is busy only part of such a step. On 2026-12-06d (F16 7B under 4 GiB, H100 host): the layers ran
 * at 0.855 of the busy-link timing, within the 1.14x between the two, and the old single expectation
 * re-planned for a faster host (20 CPU layers, predicted 55.8 ms a token, measured 69.6). Inside [lo, hi] is
 * pace 1; outside, the distance to the nearer end. */
Test(step_plan, pace_between_alone_and_beside_the_link)
{
    struct step_pace p;
    step_pace_init(&p);
    for (int i = 0; i < 3 * STEP_PACE_WINDOW; i++)
        cr_assert_eq(step_pace_observe(&p, 5, 0.855 * 3.09e-3, 3.09e-3 / 1.136, 3.09e-3), 0, "step %d", i);
    cr_assert_eq(p.pace, 1.0);
    /* Faster than even alone: the pace is measured from lo. */
    int revised_at = -1;
    for (int i = 0; i < 2 * STEP_PACE_WINDOW && revised_at < 0; i++)
        if (step_pace_observe(&p, 5, 0.5e-3, 1.0e-3, 1.5e-3)) revised_at = i;
    cr_assert_eq(revised_at, STEP_PACE_WINDOW / 2, "the median turns once half the window is fast");
    cr_assert_float_eq(p.pace, 0.5, 1e-12);
    /* Slower than beside the link: measured from hi. */
    step_pace_init(&p);
    for (int i = 0; i < STEP_PACE_WINDOW; i++) step_pace_observe(&p, 5, 3.0e-3, 1.0e-3, 1.5e-3);
    cr_assert_float_eq(p.pace, 2.0, 1e-12);
}

/* A plan made from paced costs: a slower host takes fewer host layers at one token (never more), a faster one
 * more; the device's rates are untouched. */
Test(step_plan, paced_costs_move_host_layers)
{
    struct step_plan_input in = llama7b(5, 84, 1.5);
    const struct step_cost base = in.cost;
    int prev = L7 + 1, first = 0;
    double prev_pred = 0;
    for (double pace = 0.5; pace <= 4.0; pace *= 2) {
        in.cost = step_cost_paced(&base, pace);
        cr_assert_eq(in.cost.h2d, base.h2d);
        cr_assert_eq(in.cost.sync_s, base.sync_s);
        for (int i = 0; i < base.n_cpu; i++)
            cr_assert_float_eq(in.cost.cpu_s[i], base.cpu_s[i] * pace, 1e-15);
        struct step_plan p;
        make(&in, &p);
        cr_assert_leq(p.n_cpu[0], prev, "pace %g: %d host layers on the CPU, %d at half the pace", pace,
                      p.n_cpu[0], prev);
        cr_assert_geq(p.predicted_s[0], prev_pred, "pace %g", pace);
        if (pace == 0.5) cr_assert_gt(p.n_cpu[0], 0, "a fast host takes host layers at one token");
        if (pace == 0.5) first = p.n_cpu[0];
        if (pace == 4.0) cr_assert_lt(p.n_cpu[0], first, "8x slower: fewer host layers on the CPU");
        prev = p.n_cpu[0];
        prev_pred = p.predicted_s[0];
        step_plan_free(&p);
    }
}

/* The host's attention over the KV extension against the plan's CPU layers (Q8_0 7B at 4 GiB: a host layer of
 * 215 MB in 2.6 ms; f16 K/V of 512 KiB a position over all layers): one sequence of 600 extension positions
 * keeps its CPU layers, 16 rows of 500 stream most of them, 4 rows some; nothing changes without attention,
 * CPU layers or a ring; and the count found is the best one of the model (each j's step checked by hand). */
Test(step_plan, ext_attention_streams_cpu_layers_when_it_costs_more)
{
    const double rate = 215e6 / 2.6e-3, pos_bytes = 512.0 * 1024;
    cr_assert_eq(step_plan_ext_shift(35.6e-3, 69.9e-3, 600 * pos_bytes, rate, 7), 0);
    const int all16 = step_plan_ext_shift(62.6e-3, 65.9e-3, 16 * 500 * pos_bytes, rate, 5);
    cr_assert(all16 >= 4, "16 rows of 500: %d of 5 streamed", all16);
    const int j8 = step_plan_ext_shift(53.4e-3, 69.9e-3, 8 * 500 * pos_bytes, rate, 6);
    const int j4 = step_plan_ext_shift(44.5e-3, 69.9e-3, 4 * 500 * pos_bytes, rate, 6);
    cr_assert(j4 > 0 && j4 < 6 && j8 > j4, "4 rows %d, 8 rows %d of 6", j4, j8);
    cr_assert_eq(step_plan_ext_shift(35.6e-3, 69.9e-3, 0, rate, 7), 0);
    cr_assert_eq(step_plan_ext_shift(35.6e-3, 0, 16 * 500 * pos_bytes, rate, 7), 0); /* no ring */
    cr_assert_eq(step_plan_ext_shift(35.6e-3, 69.9e-3, 16 * 500 * pos_bytes, rate, 0), 0);
    /* F16 7B at 16 tokens (2026-12-02i): plan 110 ms with 11 CPU layers, 186 ms streaming all, 36 ms of
     * attention: max(110 + 76 j/11, 110 (1 - j/11) + 36) is smallest at j = 2 (123.9 / 126.0 ms). */
    const double t_a = 36e-3, bytes = t_a * rate;
    cr_assert_eq(step_plan_ext_shift(110e-3, 186e-3, bytes, rate, 11), 2);
    for (int j = 0; j <= 11; j++) {
        const double f = j / 11.0, link = 110e-3 + 76e-3 * f, host = 110e-3 * (1 - f) + t_a;
        const double s = link > host ? link : host;
        cr_assert_geq(s, 126.0e-3 - 1e-6, "j = %d: %g ms beats the chosen 126 ms", j, s * 1e3);
    }
}

/* The link loses host memory to the CPU's layers in proportion to how fast they read it: beside a prompt's
 * layers (compute bound, here 12 TFLOP/s as on AMX tiles: 17 ms a layer at 512 tokens against 4.8 at one)
 * it keeps most of its rate, so the CPU takes some of a prompt's host layers even where the link, measured
 * beside one-token layers, drops to 20 GB/s. */
Test(step_plan, prompt_layers_on_the_cpu_leave_the_link_its_rate)
{
    struct step_plan_input in = llama7b(5, 84, 12);
    struct step_cost *c = &in.cost;
    c->cpu_m[c->n_cpu] = 512;
    c->cpu_s[c->n_cpu++] = 2.0 * PARAMS * 512 / 12e12;
    c->h2d_loaded = 20e9;
    struct step_plan p;
    make(&in, &p);
    const int b = step_plan_bucket(&p, 512);
    cr_assert_gt(p.n_cpu[b], 0, "512 tokens: no host layer on the CPU");
    cr_assert_lt(p.predicted_s[b], 0.95 * p.stream_s[b], "512 tokens: %g s against streaming %g s",
                 p.predicted_s[b], p.stream_s[b]);
    /* The same placement with the link at its loaded rate throughout would lose to streaming everything. */
    const enum placement *w = step_plan_where(&p, 512);
    struct step_plan_input flat = in;
    flat.cost.cpu_s[flat.cost.n_cpu - 1] = flat.cost.cpu_s[0]; /* as fast as at one token: full share */
    cr_assert_gt(step_plan_simulate(&flat, w, 512), p.stream_s[b], "a host reading at its full rate");
    step_plan_free(&p);
}

/* Under 4 GiB with the bench's pool (369 MiB left beside 5 resident layers and two whole-layer slots): the
 * pieces' ring gives that memory and one layer's to a sixth resident layer and still holds 755 MiB. At one
 * token and for a prompt the sixth layer wins; at 64 tokens the slightly shallower ring loses (each host
 * layer the CPU takes then lasts ~17 ms, and the link's lookahead is the ring), which is why the engine
 * predicts the maps it could choose and keeps the best for its workload (engine.c settle_ring). Seven
 * resident layers beside a ring of two pieces (369 MiB) decode one token slowest; they stream a prompt
 * fastest unless the deeper ring parks a host layer in what the prompt's pieces leave of it (then the six
 * resident layers and the parked one stream as much as seven).
 */
Test(step_plan, pieces_trade_resident_layers_against_depth)
{
    static uint64_t pieces[L7 * 4];
    for (int i = 0; i < L7; i++) {
        pieces[4 * i] = 100663296, pieces[4 * i + 1] = 33554432;
        pieces[4 * i + 2] = 180355072, pieces[4 * i + 3] = 90177536;
    }
    struct step_plan p[4];
    static enum placement w[4][L7];
    const int resident[4] = {5, 6, 7, 6};
    const uint64_t ring[4] = {2 * LAYER_F16, 755ull << 20, 369ull << 20, 755ull << 20};
    for (int i = 0; i < 4; i++) {
        struct step_plan_input in = llama7b(resident[i], 84, 1.5);
        memcpy(w[i], where7, sizeof w[i]);
        in.where = w[i];
        in.ring_bytes = ring[i];
        in.no_park = i != 1;
        if (i) in.piece_bytes = pieces, in.n_pieces = 4;
        make(&in, &p[i]);
    }
    const int last = p[0].n_buckets - 1, b64 = last - 3;
    cr_assert_eq(p[0].tokens[b64], 64);
    cr_assert_lt(p[1].predicted_s[0], p[0].predicted_s[0] * 0.98, "1 token: 6 resident %.2f ms, 5 %.2f",
                 p[1].predicted_s[0] * 1e3, p[0].predicted_s[0] * 1e3);
    cr_assert_lt(p[1].predicted_s[last], p[0].predicted_s[last] * 0.97, "512 tokens");
    cr_assert_gt(p[1].predicted_s[b64], p[0].predicted_s[b64], "64 tokens: the shallower ring loses");
    cr_assert_lt(p[2].predicted_s[last], p[3].predicted_s[last] * 0.97,
                 "7 resident: the fastest prompt (%.2f "
                 "ms) against 6 that park none (%.2f)",
                 p[2].predicted_s[last] * 1e3, p[3].predicted_s[last] * 1e3);
    cr_assert_eq(p[1].n_park[last], 1, "a prompt parks one host layer in the 755 MiB ring");
    cr_assert_eq(p[1].n_stream[last], 26);
    cr_assert_eq(p[1].n_park[0], 0, "one token puts host layers on the CPU: nothing parked");
    cr_assert_lt(p[1].predicted_s[last], p[2].predicted_s[last] * 1.01,
                 "6 resident and one parked: %.2f ms, 7 "
                 "resident: %.2f",
                 p[1].predicted_s[last] * 1e3, p[2].predicted_s[last] * 1e3);
    cr_assert_gt(p[2].predicted_s[0], p[0].predicted_s[0] * 1.1, "and the slowest token");
    for (int i = 0; i < 4; i++) step_plan_free(&p[i]);
}

/* Parking: the layout from the ring's end, a parked layer priced as a resident one beside a ring of what it
 * leaves, forced plans with 'p' checked against the ring, and FERRY_NO_PARK's input. */
Test(step_plan, parked_layers_lie_at_the_ring_end_and_cost_as_resident_ones)
{
    struct step_plan_input in = llama7b(6, 84, 1.5);
    in.ring_bytes = (755ull << 20) + 100; /* not a multiple of RING_ALIGN */
    enum placement w[L7];
    uint64_t off[L7];
    memcpy(w, where7, sizeof w);
    cr_assert_eq(step_plan_park_layout(in.ring_bytes, bytes7, w, L7, off), in.ring_bytes, "none parked");
    int first = -1, second = -1;
    for (int l = 0; l < L7; l++)
        if (w[l] == PLACEMENT_STREAM) {
            if (first < 0)
                first = l;
            else if (second < 0)
                second = l;
        }
    bytes7[second] = LAYER_F16 - 1000; /* (a smaller layer) */
    w[first] = w[second] = PLACEMENT_PARK;
    const uint64_t a1 = (LAYER_F16 + RING_ALIGN - 1) / RING_ALIGN * RING_ALIGN,
                   a2 = (LAYER_F16 - 1000 + RING_ALIGN - 1) / RING_ALIGN * RING_ALIGN;
    cr_assert_eq(step_plan_park_layout(in.ring_bytes, bytes7, w, L7, off), UINT64_MAX, "two do not fit");
    in.ring_bytes = 3 * LAYER_F16 + 77;
    const uint64_t top3 = in.ring_bytes / RING_ALIGN * RING_ALIGN;
    const uint64_t cap = step_plan_park_layout(in.ring_bytes, bytes7, w, L7, off);
    cr_assert_eq(off[first], top3 - a1, "the first parked layer ends the ring");
    cr_assert_eq(off[second], top3 - a1 - a2);
    cr_assert_eq(cap, top3 - a1 - a2);
    cr_assert_eq(off[second] % RING_ALIGN, 0);
    /* Priced as resident layers beside a ring of cap bytes. */
    enum placement as_resident[L7];
    memcpy(as_resident, w, sizeof w);
    as_resident[first] = as_resident[second] = PLACEMENT_GPU;
    struct step_plan_input small = in;
    small.ring_bytes = cap;
    for (int m = 1; m <= 512; m *= 8) {
        const double a = step_plan_simulate(&in, w, m), b = step_plan_simulate(&small, as_resident, m);
        cr_assert(isfinite(a) && fabs(a - b) <= 1e-12 * b, "%d tokens: parked %.6f ms, resident %.6f", m,
                  a * 1e3, b * 1e3);
    }
    /* Forced plans: 'p' on a host layer, never on a resident one, never more than fit. */
    char force[L7 + 1], err[256];
    struct step_plan p;
    for (int l = 0; l < L7; l++) force[l] = w[l] == PLACEMENT_GPU ? 'g' : w[l] == PLACEMENT_PARK ? 'p' : 's';
    force[L7] = 0;
    in.force = force;
    make(&in, &p);
    cr_assert_eq(p.n_park[0], 2);
    cr_assert_eq(step_plan_where(&p, 1)[first], PLACEMENT_PARK);
    step_plan_free(&p);
    for (int l = 0; l < L7; l++)
        if (w[l] != PLACEMENT_GPU) force[l] = 'p';
    cr_assert_eq(step_plan_make(&in, &p, err), FERRY_ERR_INVALID,
                 "every host layer parked in 3 layers' ring");
    force[first] = 's';
    for (int l = 0; l < L7; l++)
        if (w[l] == PLACEMENT_GPU) {
            force[l] = 'p';
            break;
        }
    cr_assert_eq(step_plan_make(&in, &p, err), FERRY_ERR_INVALID, "a resident layer parked");
    /* Planned: a prompt parks, FERRY_NO_PARK's input does not. One token parks beside its CPU layers too here
     * (three layers of ring are more lookahead than its CPU layers need), and is predicted faster for it. */
    in.force = NULL;
    make(&in, &p);
    const int last = p.n_buckets - 1;
    cr_assert_gt(p.n_park[last], 0, "a prompt with two layers' room to spare parks");
    cr_assert_gt(p.n_cpu[0], 0);
    cr_assert_gt(p.n_park[0], 0, "one token, %d CPU layers: none parked", p.n_cpu[0]);
    struct step_plan q;
    in.no_park = 1;
    make(&in, &q);
    for (int b = 0; b < q.n_buckets; b++) cr_assert_eq(q.n_park[b], 0);
    cr_assert_lt(p.predicted_s[last], q.predicted_s[last], "parking makes the prompt faster");
    cr_assert_lt(p.predicted_s[0], q.predicted_s[0], "and one token");
    for (int b = 0; b < p.n_buckets; b++)
        cr_assert_leq(p.predicted_s[b], q.predicted_s[b] * (1 + 1e-12),
                      "bucket %d: parking chosen and slower", b);
    step_plan_free(&p);
    step_plan_free(&q);
}

/* Stream-only host layers (a recurrent layer, whose state lives on the device): never on the CPU, in any
 * mode, however fast the host; the other host layers are still the planner's to give to it. A host fast
 * enough that AUTO puts layers on the CPU (checked without the mask first), and every third layer
 * stream-only: AUTO and CPU put none of those there, CPU puts every other host layer there, STREAM streams
 * all. Forcing one onto the CPU is refused, and so is a map without a ring that leaves one in host memory. */
Test(step_plan, stream_only_layers_never_run_on_the_cpu)
{
    struct step_plan_input in = llama7b(5, 400, 20);
    struct step_plan p;
    make(&in, &p);
    cr_assert_gt(p.n_cpu[0], 0, "without the mask a fast host takes layers at one token");
    step_plan_free(&p);
    uint8_t only[L7] = {0};
    int host = 0, n_only = 0;
    for (int l = 0; l < L7; l++)
        if (where7[l] != PLACEMENT_GPU) only[l] = host++ % 3 == 0, n_only += only[l];
    in.stream_only = only;
    const enum step_mode modes[] = {STEP_MODE_AUTO, STEP_MODE_CPU, STEP_MODE_STREAM};
    for (int k = 0; k < 3; k++) {
        in.mode = modes[k];
        make(&in, &p);
        for (int b = 0; b < p.n_buckets; b++) {
            const enum placement *w = p.where + (size_t)b * L7;
            for (int l = 0; l < L7; l++) {
                if (only[l])
                    cr_assert(w[l] == PLACEMENT_STREAM || w[l] == PLACEMENT_PARK,
                              "mode %d bucket %d: stream-only layer %d is %d", k, b, l, w[l]);
                if (where7[l] == PLACEMENT_GPU) cr_assert_eq(w[l], PLACEMENT_GPU);
            }
            if (modes[k] == STEP_MODE_CPU) cr_assert_eq(p.n_cpu[b], host - n_only, "bucket %d", b);
            if (modes[k] == STEP_MODE_STREAM) cr_assert_eq(p.n_cpu[b], 0);
        }
        if (modes[k] == STEP_MODE_AUTO) cr_assert_gt(p.n_cpu[0], 0, "the others still go to the CPU");
        step_plan_free(&p);
    }
    /* Every host layer stream-only: AUTO and CPU stream them all. */
    for (int l = 0; l < L7; l++) only[l] = where7[l] != PLACEMENT_GPU;
    in.mode = STEP_MODE_CPU;
    make(&in, &p);
    for (int b = 0; b < p.n_buckets; b++) cr_assert_eq(p.n_cpu[b], 0);
    cr_assert_eq(p.n_stream[0], host);
    step_plan_free(&p);
    char force[L7 + 1], err[256] = "";
    for (int l = 0; l < L7; l++) force[l] = where7[l] == PLACEMENT_GPU ? 'g' : 's';
    force[L7] = '\0';
    int first = 0;
    while (where7[first] == PLACEMENT_GPU) first++;
    force[first] = 'c';
    in.force = force;
    cr_assert_eq(step_plan_make(&in, &p, err), FERRY_ERR_INVALID, "a stream-only layer forced to the CPU");
    cr_assert(strstr(err, "cannot be 'c'"), "%s", err);
    in.force = NULL;
    in.ring_bytes = 0;
    cr_assert_eq(step_plan_make(&in, &p, err), FERRY_ERR_INVALID, "stream-only host layers and no ring");
}

/* Paces per count of CPU layers: the count's own once judged; between counts seen, interpolated; above them,
 * the most layers seen; below them, the base (the start-up timing, until a count below all those seen is
 * tried and found off it). Counts that interleave (two step sizes) fill their own windows, and a count seen
 * again outside the band scales every pace (the host changed). */
Test(step_plan, pace_is_remembered_per_count_of_cpu_layers)
{
    struct step_pace p;
    step_pace_init(&p);
    cr_assert_float_eq(step_pace_expect(&p, 7), 1.0, 1e-12);
    int r = 0;
    for (int i = 0; i < STEP_PACE_WINDOW; i++) r |= step_pace_observe(&p, 14, 1.25, 1.0, 1.0);
    cr_assert_eq(r, 1, "14 layers at 1.25x: outside the band around the start-up timing");
    cr_assert_float_eq(step_pace_expect(&p, 14), 1.25, 1e-12);
    cr_assert_float_eq(step_pace_expect(&p, 20), 1.25, 1e-12);
    cr_assert_float_eq(step_pace_expect(&p, 13), 1.0, 1e-12, "fewer layers: the start-up timing");
    r = 0;
    for (int i = 0; i < STEP_PACE_WINDOW; i++) r |= step_pace_observe(&p, 10, 1.02, 1.0, 1.0);
    cr_assert_eq(r, 0, "10 layers as expected: nothing to re-plan");
    cr_assert_float_eq(step_pace_expect(&p, 10), 1.0, 1e-12);
    cr_assert_float_eq(step_pace_expect(&p, 12), 1.125, 1e-12, "halfway between 10 and 14");
    r = 0;
    for (int i = 0; i < 4 * STEP_PACE_WINDOW; i++)
        r |= step_pace_observe(&p, i % 2 ? 10 : 14, i % 2 ? 1.0 : 1.25, 1.0, 1.0);
    cr_assert_eq(r, 0, "interleaved counts, each at its own pace");
    /* The host gets twice as slow: 10's window turns once half of it is slow; every pace doubles. */
    int revised_at = -1;
    for (int i = 0; i < 2 * STEP_PACE_WINDOW && revised_at < 0; i++)
        if (step_pace_observe(&p, 10, 2.0, 1.0, 1.0)) revised_at = i;
    cr_assert_eq(revised_at, STEP_PACE_WINDOW / 2);
    cr_assert_float_eq(step_pace_expect(&p, 10), 2.0, 1e-12);
    cr_assert_float_eq(step_pace_expect(&p, 14), 2.5, 1e-12);
    cr_assert_float_eq(step_pace_expect(&p, 3), 2.0, 1e-12, "the base doubles too");
    /* 5 layers, tried on the base's word, run at 3x: fewer than 5 are expected at 3x now. */
    r = 0;
    for (int i = 0; i < STEP_PACE_WINDOW; i++) r |= step_pace_observe(&p, 5, 3.0, 1.0, 1.0);
    cr_assert_eq(r, 1);
    cr_assert_float_eq(step_pace_expect(&p, 3), 3.0, 1e-12);
    cr_assert_float_eq(step_pace_expect(&p, 10), 2.0, 1e-12);
    /* Counts past the table share its last entry. */
    for (int i = 0; i < STEP_PACE_WINDOW; i++) step_pace_observe(&p, 100000, 4.0, 1.0, 1.0);
    cr_assert_float_eq(step_pace_expect(&p, STEP_PACE_KEYS - 1), 4.0, 1e-12);
}

/* A host whose pace depends on the plan: the CPU's layers and the link's copies share host memory, so with as
 * many CPU layers as the start-up plan chose (c0) they run 1.25x slower than timed, with fewer at the timed
 * pace (F16 7B under 12 GiB on the H100 machine: 14 layers at 1.25x, 12-13 at 1.0x), all of it `slow` times
 * more when the host is busier. */
static double host_pace(int n_cpu, int c0, double slow)
{
    return slow * (n_cpu >= c0 ? 1.25 : 1.0);
}

/* `windows` windows of one-token steps on that host, re-planned as runtime/engine.c's follow_pace does; the
 * times the one-token plan changed. one_pace: the rule before (one pace for every count, the plan made
 * afresh each time it moved). */
static int run_host(struct step_plan_input *in, struct step_plan *plan, struct step_pace *pace, int c0,
                    double slow, int windows, int one_pace)
{
    int changes = 0;
    for (int w = 0; w < windows; w++) {
        const int c = plan->n_cpu[0];
        int replan = 0;
        for (int i = 0; i < STEP_PACE_WINDOW; i++)
            replan |= step_pace_observe(pace, one_pace ? 1 : c, host_pace(c, c0, slow) * 1e-3, 1e-3, 1e-3);
        if (!replan) continue;
        struct step_pace single;
        step_pace_init(&single);
        single.base = pace->pace;
        in->pace = one_pace ? &single : pace;
        in->keep = one_pace ? NULL : plan;
        struct step_plan next;
        make(in, &next);
        changes += next.n_cpu[0] != plan->n_cpu[0];
        step_plan_free(plan);
        *plan = next;
    }
    in->pace = NULL;
    in->keep = NULL;
    return changes;
}

/* The one-token plan's step on that host, and the best one-token step any count of CPU layers gives there. */
static double true_step(struct step_plan_input *in, const struct step_plan *plan, int c0, double slow,
                        double *best)
{
    struct step_pace truth;
    step_pace_init(&truth);
    for (int c = 1; c < STEP_PACE_KEYS; c++) truth.seen[c] = host_pace(c, c0, slow);
    in->pace = &truth;
    struct step_plan opt;
    make(in, &opt);
    *best = opt.predicted_s[0];
    const double t = step_plan_simulate(in, plan->where, 1);
    step_plan_free(&opt);
    in->pace = NULL;
    return t;
}

Test(step_plan, pace_that_depends_on_the_plan_settles)
{
    struct step_plan_input in = llama7b(5, 84, 1.5);
    struct step_plan plan;
    make(&in, &plan);
    const int c0 = plan.n_cpu[0];
    cr_assert_gt(c0, 1, "the start-up plan computes host layers on the CPU at one token");
    struct step_pace pace;
    /* The rule before: 1.25x at c0 plans fewer, those run at 1.0x and plan c0 again, and so on. */
    step_pace_init(&pace);
    const int flips = run_host(&in, &plan, &pace, c0, 1.0, 200, 1);
    cr_assert_gt(flips, 50, "one pace for every count: %d changes in 200 windows", flips);
    step_plan_free(&plan);
    /* Paces per count and the margin: at most two changes, to a plan within the margin of the best. */
    make(&in, &plan);
    step_pace_init(&pace);
    const int changes = run_host(&in, &plan, &pace, c0, 1.0, 200, 0);
    cr_assert_leq(changes, 2, "%d changes in 200 windows (start-up plan: %d CPU layers)", changes, c0);
    double best, t = true_step(&in, &plan, c0, 1.0, &best);
    cr_assert_leq(t, best * (1.0 + STEP_PACE_KEEP), "settled on %d CPU layers: %.2f ms, the best %.2f ms",
                  plan.n_cpu[0], t * 1e3, best * 1e3);
    const int settled = plan.n_cpu[0];
    /* A lasting change: the host gets twice as slow for every plan. The plan follows, once or twice. */
    const int later = run_host(&in, &plan, &pace, c0, 2.0, 200, 0);
    cr_assert(later >= 1 && later <= 2, "%d changes after the host slowed down", later);
    cr_assert_lt(plan.n_cpu[0], settled, "a slower host computes fewer layers (%d, was %d)", plan.n_cpu[0],
                 settled);
    t = true_step(&in, &plan, c0, 2.0, &best);
    cr_assert_leq(t, best * (1.0 + STEP_PACE_KEEP), "settled on %d CPU layers: %.2f ms, the best %.2f ms",
                  plan.n_cpu[0], t * 1e3, best * 1e3);
    step_plan_free(&plan);
}
