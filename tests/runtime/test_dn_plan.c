/* test_dn_plan — the CUDA backend's planner for models with gated DeltaNet (recurrent) layers, without a GPU
 * (forward_cuda_plan_offline: the arithmetic forward_cuda_init allocates by, and `ferry inspect
 * --gpu-memory`'s engine_plan). A recurrent layer's in- and out-projection matrices are part of its block;
 * in host memory it is, for the map's life, either stream-only (recurrent_stream: its state and small
 * tensors on the device, the step plan streams it in every mode, --placement cpu is refused unless every
 * layer fits) or CPU-only (its state in host memory, taking no device bytes: the step plan puts it on the
 * CPU in every mode and at every step size, and it sizes no ring), while the model's attention layers are
 * planned step by step like any model's. The minimum a refusal names is a budget that gets a plan. Models: a
 * Qwen3.5-27B shape built in code (the published config: 64 layers of dim 5120, three of every four gated
 * DeltaNet with 16 key and 48 value heads of 128, the fourth gated attention with 24 query and 4 KV heads of
 * 256, FFN 17408, vocabulary 248320) in llama-quantize's Q4_K_M mix as tests/gpu/make_family_gguf.py writes
 * it, whose matrix views point at a placeholder (the planner reads shapes and types, never data); and the
 * tiny Qwen3.5 golden model. Skips in a build without CUDA (no CUDA planner there).
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/core/status.h"
#include "runtime/device_map.h"
#include "runtime/engine.h"
#include "runtime/forward_cuda.h"
#include "runtime/kv_cache.h"
#include "runtime/step_plan.h"

#define MIB (1024ull * 1024ull)
#define GIB (1024ull * MIB)
#define H2D 54.9e9
#define HBM 4.18e12

static float placeholder[1]; /* every view's data and norm: a non-NULL address the planner never reads */

static struct wview mat(enum dtype t, int64_t rows, int64_t cols)
{
    return (struct wview){.data = placeholder, .type = t, .rows = rows, .cols = cols};
}

/* llama-quantize's Q4_K_M: Q6_K for attn_v (attn_qkv in a DeltaNet layer) and ffn_down on these layers. */
static int more_bits(int i, int n)
{
    return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2;
}

static struct model qwen35_27b(void)
{
    struct model m = {0};
    struct llm_hparams *hp = &m.hp;
    snprintf(hp->arch, sizeof hp->arch, "qwen35");
    hp->n_vocab = 248320, hp->dim = 5120, hp->n_layers = 64, hp->n_heads = 24, hp->n_kv_heads = 4;
    hp->head_dim = 256, hp->ffn_dim = 17408, hp->ctx_train = 262144, hp->norm_eps = 1e-6f;
    hp->rope_theta = 1e7f, hp->rope_dim = 64, hp->rope_style = ROPE_STYLE_HALF;
    hp->full_attn_interval = 4, hp->ssm_conv_kernel = 4, hp->ssm_head_k = 128, hp->ssm_n_k_heads = 16;
    hp->ssm_n_v_heads = 48, hp->ssm_inner = 48 * 128, hp->attn_out_gate = 1;
    const int L = hp->n_layers, dim = hp->dim, ffn = hp->ffn_dim, conv = llm_ssm_conv_dim(hp);
    m.layers = calloc((size_t)L, sizeof *m.layers);
    cr_assert(m.layers);
    m.output = mat(DTYPE_Q6_K, hp->n_vocab, dim);
    m.tok_embd = mat(DTYPE_Q4_K, hp->n_vocab, dim);
    m.output_norm = placeholder;
    for (int l = 0; l < L; l++) {
        struct model_layer *y = &m.layers[l];
        const enum dtype more = more_bits(l, L) ? DTYPE_Q6_K : DTYPE_Q4_K;
        y->attn_norm = y->ffn_norm = placeholder;
        y->w_gate = mat(DTYPE_Q4_K, ffn, dim);
        y->w_up = mat(DTYPE_Q4_K, ffn, dim);
        y->w_down = mat(more, dim, ffn);
        if (llm_layer_is_recurrent(hp, l)) {
            y->ssm_qkv = mat(more, conv, dim);
            y->ssm_z = mat(DTYPE_Q4_K, hp->ssm_inner, dim);
            y->ssm_beta = mat(DTYPE_Q4_K, hp->ssm_n_v_heads, dim);
            y->ssm_alpha = mat(DTYPE_Q4_K, hp->ssm_n_v_heads, dim);
            y->ssm_out = mat(DTYPE_Q4_K, dim, hp->ssm_inner);
            y->ssm_conv = y->ssm_dt = y->ssm_a = y->ssm_norm = placeholder;
        } else {
            y->wq = mat(DTYPE_Q4_K, 2 * hp->n_heads * hp->head_dim, dim); /* queries and their gates */
            y->wk = mat(DTYPE_Q4_K, hp->n_kv_heads * hp->head_dim, dim);
            y->wv = mat(more, hp->n_kv_heads * hp->head_dim, dim);
            y->wo = mat(DTYPE_Q4_K, dim, hp->n_heads * hp->head_dim);
            y->q_norm = y->k_norm = placeholder;
        }
    }
    return m;
}

/* Bytes of layer l's matrices as stored, and of its DeltaNet ones alone. */
static uint64_t layer_mats(const struct model *m, int l, uint64_t *dn)
{
    const struct model_layer *y = &m->layers[l];
    *dn = wview_bytes(&y->ssm_qkv) + wview_bytes(&y->ssm_z) + wview_bytes(&y->ssm_beta) +
          wview_bytes(&y->ssm_alpha) + wview_bytes(&y->ssm_out);
    return layer_model_bytes(y);
}

/* The engine's CUDA parameters (runtime/engine.c cuda_params) for n_seqs sequences of ctx positions, the KV
 * pool sized by the planner, steps of T rows. */
static struct forward_cuda_params params(int64_t budget, int n_seqs, int ctx, int T)
{
    const int64_t short_ctx = ctx < 1024 ? ctx : 1024;
    return (struct forward_cuda_params){.max_tokens = T,
                                        .gpu_memory = budget,
                                        .gpu_layers = -1,
                                        .cpu_moe = -1,
                                        .kv_auto = 1,
                                        .kv_tokens_max = (int64_t)n_seqs * ctx,
                                        .kv_tokens_floor = (int64_t)n_seqs * short_ctx,
                                        .kv_tokens_min = ctx};
}

static void kv_of(struct kv_cache *kv, const struct llm_hparams *hp, int n_seqs, int ctx, int tokens)
{
    cr_assert_eq(kv_cache_init(kv, llm_kv_cache_layers(hp), llm_kv_cache_heads(hp), hp->head_dim, n_seqs, ctx,
                               tokens, 16, KV_NO_HOST),
                 FERRY_OK);
}

/* forward_cuda_plan_offline, skipping the test in a build without CUDA. */
static int plan(const struct model *m, const struct kv_cache *kv, const struct forward_cuda_params *p,
                struct device_map *map, char err[256])
{
    const int rc = forward_cuda_plan_offline(m, kv, p, H2D, HBM, map, err);
    if (rc == FERRY_ERR_UNSUPPORTED && strstr(err, "no CUDA backend"))
        cr_skip_test("a build without CUDA has no CUDA planner (%s)", err);
    return rc;
}

/* A refusal's text: "GPU budget B is too small: the minimum is M (...)", with B below M. */
static void check_refusal(const char *err, uint64_t budget, uint64_t minimum)
{
    double b, mn;
    char ub[8], um[8];
    cr_assert_eq(sscanf(err, "GPU budget %lf %3s is too small: the minimum is %lf %3s", &b, ub, &mn, um), 4,
                 "%s", err);
    const double sb = b * (strcmp(ub, "GiB") ? MIB : GIB), sm = mn * (strcmp(um, "GiB") ? MIB : GIB);
    cr_assert_lt(sb, sm, "the message reads as a budget above its minimum: %s", err);
    cr_assert_leq(sb, (double)budget, "%s", err);
    cr_assert_geq(sm, (double)minimum, "the minimum is named rounded up: %s", err);
}

/* The step planner's input for `map`: layers of bytes (and as many multiply-adds), steps of up to
 * max_tokens, the device's costs of the H200 machine; the host's costs are the caller's. */
static struct step_plan_input plan_in(const struct device_map *map, const uint64_t *bytes, int max_tokens)
{
    struct step_plan_input in = {.n_layers = map->n_layers,
                                 .where = map->where,
                                 .stream_only = map->stream_only,
                                 .cpu_only = map->cpu_only,
                                 .layer_bytes = bytes,
                                 .layer_params = bytes,
                                 .head_bytes = 1,
                                 .ring_bytes = map->ring_bytes,
                                 .max_tokens = max_tokens,
                                 .margin = 0.03};
    struct step_cost *c = &in.cost;
    c->h2d = H2D, c->hbm = HBM, c->gpu_flops = 500e12, c->gpu_layer_s = 10e-6, c->step_s = 100e-6;
    return in;
}

/* The recurrent layers of the map stream-only (and only they), and the step plan of the map (its host
 * layers' bytes given as each layer's share of the streamed bytes) on a host fast enough to take layers: no
 * recurrent layer on the CPU in AUTO or CPU mode, at any step size. */
static void check_never_on_cpu(const struct device_map *map, const struct llm_hparams *hp,
                               uint64_t streamed_bytes)
{
    const int L = map->n_layers;
    cr_assert(map->stream_only, "a model with recurrent layers marks them stream-only");
    cr_assert_null(map->cpu_only);
    int rec_host = 0;
    for (int l = 0; l < L; l++) {
        cr_assert_eq(map->stream_only[l], llm_layer_is_recurrent(hp, l), "layer %d", l);
        rec_host += map->where[l] != PLACEMENT_GPU && llm_layer_is_recurrent(hp, l);
    }
    cr_assert_eq(map->n_stream_only, rec_host);
    uint64_t *bytes = calloc((size_t)L, sizeof *bytes);
    const uint64_t each = map->n_streamed ? streamed_bytes / (uint64_t)map->n_streamed : 1;
    for (int l = 0; l < L; l++) bytes[l] = each;
    struct step_plan_input in = plan_in(map, bytes, 64);
    struct step_cost *c = &in.cost;
    c->cpu_ref_bytes = each, c->n_cpu = 1, c->cpu_m[0] = 1,
    c->cpu_s[0] = 1e-9; /* a host that is never slow */
    const enum step_mode modes[] = {STEP_MODE_AUTO, STEP_MODE_CPU};
    for (int k = 0; k < 2; k++) {
        struct step_plan p;
        char err[256] = "";
        in.mode = modes[k];
        cr_assert_eq(step_plan_make(&in, &p, err), FERRY_OK, "%s", err);
        for (int b = 0; b < p.n_buckets; b++) {
            const enum placement *w = p.where + (size_t)b * L;
            for (int l = 0; l < L; l++)
                if (map->where[l] != PLACEMENT_GPU && llm_layer_is_recurrent(hp, l))
                    cr_assert_eq(w[l], PLACEMENT_STREAM, "mode %d, %d tokens: layer %d", k, p.tokens[b], l);
            cr_assert_geq(p.n_stream[b], rec_host);
        }
        step_plan_free(&p);
    }
    free(bytes);
}

/* `ferry bench --gpu-memory 8GiB` on the Qwen3.5-27B Q4_K_M shape was refused ("GPU budget 7.93 GiB is too
 * small: the minimum is 7.28 GiB (this plan: 17.63 GiB, 64 resident layers, ...)"): every layer had to be
 * resident. Now, for one sequence of 4096 positions (ferry inspect's defaults) and for the bench's 16 slots:
 * the plan fits 8 GiB with layers streamed, each streamed recurrent layer's DeltaNet matrices among the
 * streamed bytes; the minimum gets a plan with every layer streamed and a byte less is refused with a message
 * that names it; --gpu-layers and --placement cpu behave as their contracts say. */
Test(dn_plan, qwen35_27b_streams_under_8gib)
{
    struct model m = qwen35_27b();
    const struct llm_hparams *hp = &m.hp;
    const int L = hp->n_layers;
    uint64_t all = 0, dn_all = 0;
    for (int l = 0; l < L; l++) {
        uint64_t dn;
        all += layer_mats(&m, l, &dn);
        dn_all += dn;
    }
    fprintf(stderr, "Qwen3.5-27B shape, Q4_K_M: layers %.2f GiB, of them DeltaNet matrices %.2f GiB\n",
            all / (double)GIB, dn_all / (double)GIB);
    /* The 15.4 GiB file: these, the Q4_K embedding (0.67 GiB) and the Q6_K output matrix (0.97 GiB). */
    cr_assert(all > 13 * GIB && all < 14 * GIB, "%.2f GiB", all / (double)GIB);
    struct kv_cache kv;
    kv_of(&kv, hp, 1, 4096, 4096);
    struct forward_cuda_params p = params(8 * GIB, 1, 4096, 512);
    p.recurrent_stream = 1;
    struct device_map map;
    char err[256] = "", text[4096];
    cr_assert_eq(plan(&m, &kv, &p, &map, err), FERRY_OK, "%s", err);
    device_map_format(&map, text, sizeof text);
    fprintf(stderr, "--gpu-memory 8GiB, 1 x 4096 positions:\n%s", text);
    cr_assert_gt(map.n_streamed, 0);
    cr_assert_gt(map.n_resident, 0, "8 GiB holds some layers beside the smallest ring");
    cr_assert_gt(map.ring_bytes, 0);
    cr_assert_leq(map.bytes_total, 8 * GIB);
    cr_assert_lt(map.bytes_minimum, 8 * GIB);
    cr_assert(strstr(text, "always stream"), "%s", text);
    /* The streamed bytes (the prediction is their link time) hold every streamed layer's matrices, the
     * DeltaNet ones included. */
    uint64_t want = 0;
    int rec = 0;
    for (int l = 0; l < L; l++)
        if (map.where[l] != PLACEMENT_GPU) {
            uint64_t dn;
            want += layer_mats(&m, l, &dn);
            rec += dn > 0;
        }
    const double streamed = map.predicted_step_s * H2D;
    cr_assert_gt(rec, 0, "recurrent layers among the streamed ones");
    cr_assert(streamed >= (double)want && streamed < (double)want * 1.01, "streamed %.0f, matrices %llu",
              streamed, (unsigned long long)want);
    check_never_on_cpu(&map, hp, (uint64_t)streamed);
    const uint64_t least = map.bytes_minimum;
    device_map_free(&map);

    /* The minimum works; a byte less is refused, naming it. */
    p.gpu_memory = (int64_t)least;
    cr_assert_eq(plan(&m, &kv, &p, &map, err), FERRY_OK, "at the minimum: %s", err);
    cr_assert_eq(map.n_resident, 0);
    cr_assert_leq(map.bytes_total, least);
    device_map_free(&map);
    p.gpu_memory = (int64_t)least - 1;
    cr_assert_eq(plan(&m, &kv, &p, &map, err), FERRY_ERR_DEVICE_MEM);
    check_refusal(err, least - 1, least);

    /* --gpu-layers 1: one layer resident, the rest streamed (refused before); its minimum works too. */
    p.gpu_memory = (int64_t)(8 * GIB);
    p.gpu_layers = 1;
    cr_assert_eq(plan(&m, &kv, &p, &map, err), FERRY_OK, "%s", err);
    cr_assert_eq(map.n_resident, 1);
    const uint64_t least1 = map.bytes_minimum;
    cr_assert_gt(least1, least);
    device_map_free(&map);
    p.gpu_memory = (int64_t)least1;
    cr_assert_eq(plan(&m, &kv, &p, &map, err), FERRY_OK, "--gpu-layers 1 at its minimum: %s", err);
    device_map_free(&map);
    p.gpu_layers = -1;

    /* --placement cpu: the host's cores compute none of its layers, so every layer must fit. */
    p.gpu_memory = (int64_t)(8 * GIB);
    p.no_ring = 1;
    cr_assert_eq(plan(&m, &kv, &p, &map, err), FERRY_ERR_UNSUPPORTED);
    cr_assert(strstr(err, "--placement cpu") && strstr(err, "linear-attention"), "%s", err);
    p.gpu_memory = (int64_t)(40 * GIB);
    cr_assert_eq(plan(&m, &kv, &p, &map, err), FERRY_OK, "%s", err);
    cr_assert_eq(map.n_resident, L);
    device_map_free(&map);
    kv_cache_free(&kv);

    /* The bench's engine: 16 slots (16 slots' recurrent state, 150 MiB each, on the device), a fixed pool of
     * 2064 positions, steps of 2048 rows. */
    kv_of(&kv, hp, 16, 2056, 2064);
    p = params(8 * GIB, 16, 2056, 2048);
    p.kv_auto = 0;
    p.recurrent_stream = 1;
    cr_assert_eq(plan(&m, &kv, &p, &map, err), FERRY_OK, "%s", err);
    device_map_format(&map, text, sizeof text);
    fprintf(stderr, "--gpu-memory 8GiB, 16 slots, 2064 positions, steps of 2048:\n%s", text);
    cr_assert_gt(map.n_streamed, 0);
    cr_assert_leq(map.bytes_total, 8 * GIB);
    check_never_on_cpu(&map, hp, (uint64_t)(map.predicted_step_s * H2D));
    device_map_free(&map);
    kv_cache_free(&kv);
    free(m.layers);
}

/* Device bytes of one recurrent layer's state (n_seqs slots) and small tensors, as the CUDA backend lays
 * them out (f32, the small tensors each 256-byte aligned). */
static uint64_t dn_layer_state(const struct llm_hparams *hp, int n_seqs)
{
    const uint64_t C = (uint64_t)llm_ssm_conv_dim(hp), nv = (uint64_t)hp->ssm_n_v_heads,
                   hv = (uint64_t)llm_ssm_head_v(hp), w = (uint64_t)hp->ssm_conv_kernel;
    const uint64_t per = ((w - 1) * C + nv * (uint64_t)hp->ssm_head_k * hv) * sizeof(float);
#define A256(x) (((x) + 255) / 256 * 256)
    return (uint64_t)n_seqs * per + A256(C * w * 4) + 2 * A256(nv * 4) + A256(hv * 4);
#undef A256
}

/* The step plan of `map` on a host that computes a layer at one token in 0.2x its copy's time and at 512
 * tokens in 40x (per byte of the reference layer): per mode, at every step size, each recurrent host layer
 * on the CPU; the attention host layers free (in AUTO on the CPU at one token, streamed at 512). */
static void check_cpu_fixed(const struct device_map *map, const struct model *m)
{
    const struct llm_hparams *hp = &m->hp;
    const int L = map->n_layers;
    uint64_t *bytes = calloc((size_t)L, sizeof *bytes), ref = 0;
    int rec_host = 0, att_host = 0;
    for (int l = 0; l < L; l++) {
        uint64_t dn;
        bytes[l] = layer_mats(m, l, &dn);
        if (map->where[l] == PLACEMENT_GPU) continue;
        if (llm_layer_is_recurrent(hp, l))
            rec_host++;
        else
            att_host++, ref = bytes[l];
    }
    cr_assert_gt(rec_host, 0);
    struct step_plan_input in = plan_in(map, bytes, 512);
    struct step_cost *c = &in.cost;
    c->cpu_ref_bytes = ref ? ref : bytes[0], c->n_cpu = 2, c->cpu_m[0] = 1, c->cpu_m[1] = 512;
    c->cpu_s[0] = 0.2 * (double)c->cpu_ref_bytes / H2D, c->cpu_s[1] = 40 * (double)c->cpu_ref_bytes / H2D;
    const enum step_mode modes[] = {STEP_MODE_AUTO, STEP_MODE_STREAM, STEP_MODE_CPU};
    for (int k = 0; k < 3; k++) {
        struct step_plan p;
        char err[256] = "";
        in.mode = modes[k];
        cr_assert_eq(step_plan_make(&in, &p, err), FERRY_OK, "%s", err);
        for (int b = 0; b < p.n_buckets; b++) {
            const enum placement *w = p.where + (size_t)b * L;
            int att_cpu = 0;
            for (int l = 0; l < L; l++) {
                if (map->where[l] == PLACEMENT_GPU) continue;
                if (llm_layer_is_recurrent(hp, l))
                    cr_assert_eq(w[l], PLACEMENT_CPU, "mode %d, %d tokens: recurrent layer %d not on the CPU",
                                 k, p.tokens[b], l);
                else
                    att_cpu += w[l] == PLACEMENT_CPU;
            }
            cr_assert_eq(p.n_cpu[b], rec_host + att_cpu);
            if (modes[k] == STEP_MODE_STREAM && map->ring_bytes) cr_assert_eq(att_cpu, 0);
            if (modes[k] == STEP_MODE_CPU) cr_assert_eq(att_cpu, att_host);
            if (modes[k] == STEP_MODE_AUTO && att_host && map->ring_bytes && p.tokens[b] == 1)
                cr_assert_gt(att_cpu, 0, "at one token the fast host takes attention layers");
            if (modes[k] == STEP_MODE_AUTO && att_host && map->ring_bytes && p.tokens[b] == 512)
                cr_assert_eq(att_cpu, 0, "at 512 tokens the attention layers stream");
        }
        step_plan_free(&p);
    }
    /* The engine's re-plan from the host's pace (a host seen 8x slower than timed, the plan in use kept
     * unless beaten): the recurrent host layers stay on the CPU, the attention ones go to the link. */
    {
        struct step_plan first, again;
        char err[256] = "";
        in.mode = STEP_MODE_AUTO;
        cr_assert_eq(step_plan_make(&in, &first, err), FERRY_OK, "%s", err);
        struct step_pace pace;
        step_pace_init(&pace);
        for (int n = 0; n <= rec_host + att_host && n < STEP_PACE_KEYS; n++) pace.seen[n] = 8.0;
        pace.base = 8.0;
        in.pace = &pace;
        in.keep = &first;
        cr_assert_eq(step_plan_make(&in, &again, err), FERRY_OK, "%s", err);
        for (int b = 0; b < again.n_buckets; b++)
            for (int l = 0; l < L; l++)
                if (map->where[l] != PLACEMENT_GPU)
                    cr_assert_eq(again.where[(size_t)b * L + l],
                                 llm_layer_is_recurrent(hp, l) || !map->ring_bytes ? PLACEMENT_CPU
                                                                                   : PLACEMENT_STREAM,
                                 "re-planned at %d tokens: layer %d", again.tokens[b], l);
        in.pace = NULL;
        in.keep = NULL;
        step_plan_free(&first);
        step_plan_free(&again);
    }
    /* A recurrent layer on the CPU exchanges no q|k|v with the device: the simulation charges the exchange
     * of its attention only to the layers that have one. */
    {
        struct step_plan p;
        char err[256] = "";
        in.mode = STEP_MODE_CPU;
        cr_assert_eq(step_plan_make(&in, &p, err), FERRY_OK, "%s", err);
        uint8_t *rec = calloc((size_t)L, 1);
        for (int l = 0; l < L; l++) rec[l] = (uint8_t)llm_layer_is_recurrent(hp, l);
        c->sync_s = 50e-6, c->layer_bytes_per_token = 64e3;
        const double all = step_plan_simulate(&in, p.where, 1);
        in.no_attend = rec;
        const double some = step_plan_simulate(&in, p.where, 1);
        const double want = rec_host * (c->sync_s + c->layer_bytes_per_token / c->h2d);
        cr_assert(fabs((all - some) - want) < 1e-9, "saved %g s, expected %g", all - some, want);
        in.no_attend = NULL;
        c->sync_s = 0, c->layer_bytes_per_token = 0;
        free(rec);
        step_plan_free(&p);
    }
    /* A forced plan that streams a recurrent host layer does not fit the map. */
    char *force = malloc((size_t)L + 1), err[256] = "";
    for (int l = 0; l < L; l++)
        force[l] = map->where[l] == PLACEMENT_GPU ? 'g' : map->ring_bytes && !map->cpu_only[l] ? 's' : 'c';
    force[L] = 0;
    struct step_plan p;
    in.force = force;
    cr_assert_eq(step_plan_make(&in, &p, err), FERRY_OK, "%s", err);
    step_plan_free(&p);
    for (int l = 0; l < L; l++)
        if (map->where[l] != PLACEMENT_GPU && map->cpu_only[l]) {
            force[l] = 's';
            break;
        }
    cr_assert_eq(step_plan_make(&in, &p, err), FERRY_ERR_INVALID);
    cr_assert(strstr(err, "must be 'c'"), "%s", err);
    free(force);
    free(bytes);
}

/* The recurrent host layers of the Qwen3.5-27B shape computed by the host's cores (CPU-only), against the
 * same budget with them streamed: the map marks exactly the recurrent layers, counts the device state of the
 * device's recurrent layers only (none of the host's), and so holds at least as many resident layers; the
 * step plan keeps the recurrent host layers on the CPU in every mode and at every step size while the
 * attention host layers move between the CPU and the link with the step size. --placement cpu (no ring)
 * gets a plan under 8 GiB; with only recurrent layers in host memory there is no ring at all. */
Test(dn_plan, qwen35_27b_recurrent_host_layers_on_the_cpu)
{
    struct model m = qwen35_27b();
    const struct llm_hparams *hp = &m.hp;
    const int L = hp->n_layers, S = 4;
    struct kv_cache kv;
    kv_of(&kv, hp, S, 4096, S * 4096);
    struct forward_cuda_params p = params(8 * GIB, S, 4096, 512);
    struct device_map so, cpu;
    char err[256] = "", text[8192];
    p.recurrent_stream = 1;
    cr_assert_eq(plan(&m, &kv, &p, &so, err), FERRY_OK, "%s", err);
    p.recurrent_stream = 0;
    cr_assert_eq(plan(&m, &kv, &p, &cpu, err), FERRY_OK, "%s", err);
    device_map_format(&cpu, text, sizeof text);
    fprintf(stderr, "--gpu-memory 8GiB, %d x 4096 positions, recurrent host layers on the CPU:\n%s", S, text);
    cr_assert_null(cpu.stream_only);
    cr_assert(cpu.cpu_only);
    int rec_host = 0, rec_dev = 0, rec_dev_so = 0;
    for (int l = 0; l < L; l++) {
        const int rec = llm_layer_is_recurrent(hp, l);
        cr_assert_eq(cpu.cpu_only[l], rec, "layer %d", l);
        rec_host += rec && cpu.where[l] != PLACEMENT_GPU;
        rec_dev += rec && cpu.where[l] == PLACEMENT_GPU;
        rec_dev_so += rec;
    }
    cr_assert_gt(rec_host, 0);
    cr_assert_eq(cpu.n_cpu_only, rec_host);
    cr_assert_leq(cpu.bytes_total, 8 * GIB);
    const uint64_t per_layer = dn_layer_state(hp, S);
    cr_assert_eq(cpu.state_bytes, (uint64_t)rec_dev * per_layer, "device state %llu, %d device layers",
                 (unsigned long long)cpu.state_bytes, rec_dev);
    cr_assert_eq(so.state_bytes, (uint64_t)rec_dev_so * per_layer, "streamed: every recurrent layer's state");
    fprintf(stderr, "resident layers: %d with the recurrent host layers on the CPU, %d with them streamed\n",
            cpu.n_resident, so.n_resident);
    cr_assert_geq(cpu.n_resident, so.n_resident);
    cr_assert(strstr(text, "are computed by the host's cores on every step"), "%s", text);
    /* The link's predicted bytes: the attention host layers only. */
    uint64_t att = 0;
    for (int l = 0; l < L; l++) {
        uint64_t dn;
        if (cpu.where[l] != PLACEMENT_GPU && !llm_layer_is_recurrent(hp, l)) att += layer_mats(&m, l, &dn);
    }
    const double streamed = cpu.predicted_step_s * H2D;
    if (streamed > (double)att) /* (hbm's bound may exceed the link's) */
        cr_assert_lt(streamed, (double)att * 1.01 + 1, "streamed %.0f, attention layers %llu", streamed,
                     (unsigned long long)att);
    check_cpu_fixed(&cpu, &m);
    device_map_free(&so);
    device_map_free(&cpu);

    /* Only recurrent layers in host memory: no ring. */
    char *force = malloc((size_t)L + 1);
    for (int l = 0; l < L; l++) force[l] = llm_layer_is_recurrent(hp, l) && l % 2 ? 'h' : 'g';
    force[L] = 0;
    p.force_where = force;
    p.gpu_memory = (int64_t)(20 * GIB);
    cr_assert_eq(plan(&m, &kv, &p, &cpu, err), FERRY_OK, "%s", err);
    cr_assert_eq(cpu.ring_bytes, 0, "CPU-only host layers never stream");
    cr_assert_gt(cpu.n_cpu_only, 0);
    cr_assert_eq(cpu.n_cpu_only, cpu.n_streamed);
    check_cpu_fixed(&cpu, &m);
    device_map_free(&cpu);
    free(force);
    p.force_where = NULL;

    /* --placement cpu: a plan under 8 GiB, without a ring. */
    p.gpu_memory = (int64_t)(8 * GIB);
    p.no_ring = 1;
    cr_assert_eq(plan(&m, &kv, &p, &cpu, err), FERRY_OK, "%s", err);
    cr_assert_eq(cpu.ring_bytes, 0);
    cr_assert_gt(cpu.n_streamed, 0);
    cr_assert_leq(cpu.bytes_total, 8 * GIB);
    device_map_free(&cpu);
    kv_cache_free(&kv);
    free(m.layers);
}

/* The same without the CUDA planner (device_map and step_plan are pure arithmetic; this runs in every
 * build): the 27B shape's layers (their matrices' bytes) under 8 GiB with 1 GiB of fixed bytes, 4 slots'
 * recurrent state counted with each recurrent layer. CPU-only: the recurrent host layers on the CPU in every
 * mode and at every step size, the attention host layers moving with the step size, the device state of the
 * resident recurrent layers only, and more resident layers than stream-only gets (whose recurrent host layers
 * stream in every mode, state and ring on the device). */
Test(dn_plan, recurrent_host_layers_fixed_by_the_map_alone)
{
    struct model m = qwen35_27b();
    const struct llm_hparams *hp = &m.hp;
    const int L = hp->n_layers, S = 4;
    uint64_t *sizes = calloc((size_t)L, sizeof *sizes), *state = calloc((size_t)L, sizeof *state), big = 0;
    uint8_t *rec = calloc((size_t)L, 1);
    for (int l = 0; l < L; l++) {
        uint64_t dn;
        sizes[l] = layer_mats(&m, l, &dn);
        if (sizes[l] > big) big = sizes[l];
        rec[l] = (uint8_t)llm_layer_is_recurrent(hp, l);
        state[l] = rec[l] ? dn_layer_state(hp, S) : 0;
    }
    struct device_map_input in = {.n_layers = L,
                                  .layer_bytes = big,
                                  .layer_sizes = sizes,
                                  .head_bytes = GIB,
                                  .fixed_bytes = GIB,
                                  .budget = 8 * GIB,
                                  .gpu_layers = -1,
                                  .state_bytes = state,
                                  .h2d_bytes_per_s = H2D,
                                  .hbm_bytes_per_s = HBM};
    struct device_map cpu, so;
    char err[256] = "";
    in.cpu_only = rec;
    cr_assert_eq(device_map_plan(&in, &cpu, err), FERRY_OK, "%s", err);
    in.cpu_only = NULL;
    in.stream_only = rec;
    cr_assert_eq(device_map_plan(&in, &so, err), FERRY_OK, "%s", err);
    cr_assert_gt(cpu.n_cpu_only, 0);
    cr_assert_eq(so.n_cpu_only, 0);
    cr_assert_gt(so.n_stream_only, 0);
    cr_assert_gt(cpu.n_resident, so.n_resident, "%d resident with CPU-only layers, %d stream-only",
                 cpu.n_resident, so.n_resident);
    int rec_dev = 0, rec_all = 0;
    for (int l = 0; l < L; l++) rec_dev += rec[l] && cpu.where[l] == PLACEMENT_GPU, rec_all += rec[l];
    cr_assert_eq(cpu.state_bytes, (uint64_t)rec_dev * dn_layer_state(hp, S));
    cr_assert_eq(so.state_bytes, (uint64_t)rec_all * dn_layer_state(hp, S));
    cr_assert_leq(cpu.bytes_total, 8 * GIB);
    check_cpu_fixed(&cpu, &m);
    /* stream-only: the recurrent host layers stream in every mode */
    struct step_plan_input si = plan_in(&so, sizes, 512);
    si.cost.n_cpu = 1, si.cost.cpu_m[0] = 1, si.cost.cpu_s[0] = 1e-9, si.cost.cpu_ref_bytes = big;
    for (int k = 0; k < 3; k++) {
        struct step_plan p;
        si.mode = (enum step_mode)k;
        cr_assert_eq(step_plan_make(&si, &p, err), FERRY_OK, "%s", err);
        for (int b = 0; b < p.n_buckets; b++)
            for (int l = 0; l < L; l++)
                if (rec[l] && so.where[l] != PLACEMENT_GPU)
                    cr_assert_eq(p.where[(size_t)b * L + l], PLACEMENT_STREAM, "mode %d, %d tokens, layer %d",
                                 k, p.tokens[b], l);
        step_plan_free(&p);
    }
    device_map_free(&cpu);
    device_map_free(&so);
    free(sizes), free(state), free(rec);
    free(m.layers);
}

/* The planner refuses a layer marked both stream-only and CPU-only. */
Test(dn_plan, a_layer_cannot_be_stream_only_and_cpu_only)
{
    const uint8_t both[2] = {0, 1};
    struct device_map_input in = {.n_layers = 2,
                                  .layer_bytes = 100 * MIB,
                                  .head_bytes = MIB,
                                  .fixed_bytes = MIB,
                                  .budget = GIB,
                                  .gpu_layers = -1,
                                  .stream_only = both,
                                  .cpu_only = both};
    struct device_map map;
    char err[256] = "";
    cr_assert_eq(device_map_plan(&in, &map, err), FERRY_ERR_INVALID);
    cr_assert(strstr(err, "layer 1"), "%s", err);
    in.stream_only = NULL;
    cr_assert_eq(device_map_plan(&in, &map, err), FERRY_OK, "%s", err);
    device_map_free(&map);
}

/* The tiny Qwen3.5 golden model (4 layers: 3 DeltaNet, 1 gated attention): all resident under a large budget,
 * every layer streamed at the minimum, a byte less refused; three more slots cost three slots' state and
 * their block-table rows, nothing else; `ferry inspect`'s text names the stream-only layers. */
Test(dn_plan, qwen35_golden_minimum_and_state)
{
    char path[1024], err[256] = "";
    snprintf(path, sizeof path, "%s/tests/golden/models/qwen35_deltanet_f16.gguf", getenv("FERRY_SRC"));
    struct model_file *mf = NULL;
    if (model_file_open(path, &mf, NULL, NULL, err)) cr_skip_test("%s is missing (%s)", path, err);
    struct model m;
    cr_assert_eq(model_init(&m, mf, err), FERRY_OK, "%s", err);
    const struct llm_hparams *hp = &m.hp;
    const int L = hp->n_layers, T = 64;
    uint64_t total[2];
    for (int i = 0; i < 2; i++) {
        const int S = i ? 4 : 1;
        struct kv_cache kv;
        kv_of(&kv, hp, S, 256, 256);
        struct forward_cuda_params p = params((int64_t)1 << 40, S, 256, T);
        p.kv_auto = 0;
        p.recurrent_stream = 1;
        struct device_map map;
        cr_assert_eq(plan(&m, &kv, &p, &map, err), FERRY_OK, "%s", err);
        cr_assert_eq(map.n_resident, L);
        total[i] = map.bytes_total;
        device_map_free(&map);
        p.gpu_memory = 1;
        cr_assert_eq(plan(&m, &kv, &p, &map, err), FERRY_ERR_DEVICE_MEM);
        const uint64_t least = map.bytes_minimum;
        check_refusal(err, 1, least);
        p.gpu_memory = (int64_t)least;
        cr_assert_eq(plan(&m, &kv, &p, &map, err), FERRY_OK, "at the minimum: %s", err);
        cr_assert_eq(map.n_streamed, L);
        uint64_t want = 0;
        for (int l = 0; l < L; l++) {
            uint64_t dn;
            want += layer_mats(&m, l, &dn);
            cr_assert_eq(dn > 0, llm_layer_is_recurrent(hp, l), "layer %d", l);
        }
        const double streamed = map.predicted_step_s * H2D;
        cr_assert(streamed >= (double)want && streamed < (double)want * 1.2, "streamed %.0f, matrices %llu",
                  streamed, (unsigned long long)want);
        check_never_on_cpu(&map, hp, (uint64_t)streamed);
        device_map_free(&map);
        p.gpu_memory = (int64_t)least - 1;
        cr_assert_eq(plan(&m, &kv, &p, &map, err), FERRY_ERR_DEVICE_MEM);
        check_refusal(err, least - 1, least);
        if (i) { /* each slot's state of the 3 recurrent layers, f32, counted with each layer */
            const uint64_t per = 3 *
                                 ((hp->ssm_conv_kernel - 1) * (uint64_t)llm_ssm_conv_dim(hp) +
                                  (uint64_t)hp->ssm_n_v_heads * hp->ssm_head_k * llm_ssm_head_v(hp)) *
                                 sizeof(float);
            cr_assert_eq(total[1] - total[0], 3 * per + (uint64_t)3 * kv.max_blocks * sizeof(int32_t),
                         "3 more slots cost %llu bytes", (unsigned long long)(total[1] - total[0]));
        }
        kv_cache_free(&kv);
    }
    /* ferry inspect --gpu-memory: a budget that streams every layer. */
    struct engine_params ep = engine_default_params();
    ep.n_seqs = 1;
    ep.ctx_size = 256;
    ep.max_batch_tokens = T;
    ep.gpu_layers = 0;
    ep.gpu_memory = (int64_t)1 << 30;
    char text[4096];
    ep.placement = ENGINE_PLACEMENT_STREAM;
    cr_assert_eq(engine_plan(mf, &ep, text, sizeof text, err), FERRY_OK, "%s", err);
    cr_assert(strstr(text, "0 layers resident, 4 in host memory"), "%s", text);
    cr_assert(strstr(text, "3 of the host layers always stream"), "%s", text);
    cr_assert_null(strstr(text, "computed by the host's cores on every step"), "%s", text);
    /* --placement auto streams them too until the host's cores computing them has passed on a GPU
     * (engine.c recurrent_stream_of). */
    ep.placement = ENGINE_PLACEMENT_AUTO;
    cr_assert_eq(engine_plan(mf, &ep, text, sizeof text, err), FERRY_OK, "%s", err);
    cr_assert(strstr(text, "3 of the host layers always stream"), "%s", text);
    /* --placement cpu: the recurrent host layers on the host's cores, named so. */
    ep.placement = ENGINE_PLACEMENT_CPU;
    cr_assert_eq(engine_plan(mf, &ep, text, sizeof text, err), FERRY_OK, "%s", err);
    cr_assert(strstr(text, "0 layers resident, 4 in host memory"), "%s", text);
    cr_assert(strstr(text, "3 of the host layers are computed by the host's cores on every step"), "%s",
              text);
    cr_assert(strstr(text, "host, cpu"), "%s", text);
    cr_assert_null(strstr(text, "always stream"), "%s", text);
    model_free(&m);
    model_file_close(mf);
}
