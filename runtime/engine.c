/* engine — validates batches, manages the KV block tables, and walks each step's layers over the backends.
 *
 * A step is all-or-nothing for the KV cache: blocks reserved for the batch are given back if the pool runs
 * out, and sequence lengths change only after the forward pass succeeded. The walk (run_step) is the same for
 * every engine: the step plan names where each layer runs for this step's size; the residual stream follows
 * the layers from backend to backend (backend.h). Sections: init (backends, the cost model, the plan), the
 * step, sequences and stats.
 */
#include "runtime/engine.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernels/core/log.h"
#include "kernels/core/status.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/ops.h"
#include "runtime/backend.h"
#include "runtime/forward_cpu.h"
#include "runtime/forward_cuda.h"
#include "runtime/kv_cache.h"
#include "runtime/layer.h"
#include "quant/mix.h"
#include "runtime/model.h"
#include "runtime/sampler.h"
#include "runtime/seq_state.h"
#include "runtime/step_plan.h"
#include "runtime/synthetic.h"

/* AUTO puts host layers on the CPU only when the plan predicts a step this much faster than streaming them
 * all: the cost model is measured, not exact, and a wrong CPU choice costs more than a missed one. */
#define ENGINE_PLAN_MARGIN 0.03
/* The workload --placement auto predicts when it weighs a ring against more resident layers: per sequence, a
 * prompt and a reply of about a chat turn's length. */
#define ENGINE_MIX_PROMPT 512
#define ENGINE_MIX_GEN    256
/* Device rates the cost model takes as constants (not worth a start-up probe): matrix products of large
 * steps (run 6e: prefill 512 of a resident Llama-2-7B at 21,670 tok/s is ~280 TFLOP/s), a layer's launches
 * and small ops, a step's fixed work. */
#define ENGINE_GPU_FLOPS   250e12
#define ENGINE_GPU_LAYER_S 10e-6
#define ENGINE_STEP_S      100e-6
/* Host layers the start-up timing cycles through (7 calls at small steps: enough distinct layers to leave
 * the host's L3, as a step does). */
#define ENGINE_MAX_LAYERS_TIMED 8
#define CPU_TIMED_M_MAX         512 /* the largest step size the host's layer is timed at */

struct engine {
    struct engine_params p;
    struct model model;
    struct kv_cache kv;
    /* The sliding-window layers' own pool (engine_params.swa_full 0): tables of kv's shape, but each slot
     * holds only the blocks of its window's positions (and ENGINE_SWA_SLACK before them); n_layers 0 when
     * unused (the window layers are in kv). A slot's length is kv's. On the GPU engine its data is on the
     * device (forward_cuda_params.kv_swa) and this holds the tables only. */
    struct kv_cache kv_swa;
    struct backend *gpu;  /* CUDA: resident and streamed layers, the KV cache, the head; or NULL */
    struct backend *cpu;  /* the CPU engine, or a GPU engine's host layers computed on the CPU; or NULL */
    struct backend *head; /* the backend holding the output head */
    int act, plain;       /* the host's arithmetic (kernels/cpu/matmul.h), given to forward_cpu */
    struct step_plan plan;
    /* A GPU engine's host costs as measured at start-up (slow: how much slower a host layer ran while the
     * link copied), and the host's pace since: the plan is made again when the pace moves (step_plan.h). */
    struct step_cost cost;
    double slow;
    struct step_pace pace;
    int adapt;     /* the pace is followed: auto placement with a ring and host layers on the CPU */
    double host_s; /* the CPU backend's seconds in host-layer arithmetic so far */
    char placement[4096];
    int32_t *new_len; /* (n_seqs) scratch: the length each slot will have after the step, or -1 */
    int32_t *first;   /* (n_seqs) scratch: the first position the step writes in each slot */
    enum placement
        *streamed; /* (n_layers) scratch: a step's plan with its CPU layers streamed (step_where) */
    struct engine_stats stats;
    /* Each slot's state in the recurrent layers (empty without them): all of it on the CPU engine; on a GPU
     * engine the live state of the recurrent layers its host's cores compute, and the checkpoints of all. */
    struct seq_state state;
    /* The drawing step engine_step_draw_begin left on its way, until engine_step_draw_end. */
    struct step pend;
    int pend_active, pend_tokens;
    double pend_t0;
};

const char *engine_cuda_lacks(const struct llm_hparams *hp)
{
    return forward_cuda_device_lacks(hp);
}

struct engine_params engine_default_params(void)
{
    return (struct engine_params){
        .backend = ENGINE_BACKEND_AUTO,
        .n_threads = 0,
        .ctx_size = 0,
        .n_seqs = 1,
        .kv_tokens = 0,
        .max_batch_tokens = 512,
        .deterministic = 0,
        .gpu_memory = 0,
        .reserve_vram = (int64_t)1 << 30,
        .gpu_layers = -1,
        .ring_layers = 0,
        .cpu_moe = -1,
        .expert_cache = 0, /* none: measured slower with evenly spread routing (docs/design.md) */
        .placement = ENGINE_PLACEMENT_AUTO,
        .cpu_threads = 0,
        .plan_override = NULL,
        .quant = ENGINE_QUANT_NONE,
        .cpu_int8 = -1,    /* --cpu-arith auto */
        .kv_type = KV_F16, /* --kv-type f16 */
        .swa_full = 0,
        .ctx_checkpoints = seq_state_default_params().n_ckpt,
        .ckpt_step = seq_state_default_params().ckpt_step,
    };
}

/* --quant values and the llama.cpp mixes they apply (the int4 choice is measured in kernels/cpu/NOTES.md). */
static const struct {
    const char *name;
    int ftype;
} engine_quants[] = {
    [ENGINE_QUANT_NONE] = {"none", -1},
    [ENGINE_QUANT_INT8] = {"int8", QUANT_FTYPE_Q8_0},
    [ENGINE_QUANT_INT4] = {"int4", QUANT_FTYPE_Q4_K_M},
};

int engine_quant_parse(const char *s)
{
    for (int i = 0; i < (int)(sizeof engine_quants / sizeof engine_quants[0]); i++)
        if (s && !strcmp(s, engine_quants[i].name)) return i;
    return -1;
}

/* --kv-type's names, by enum kv_elem. */
static const char *const kv_type_names[] = {[KV_F32] = "f32", [KV_F16] = "f16", [KV_Q8_0] = "q8_0"};

int engine_kv_type_parse(const char *s)
{
    for (int i = 0; s && i < (int)(sizeof kv_type_names / sizeof kv_type_names[0]); i++)
        if (!strcmp(s, kv_type_names[i])) return i;
    return -1;
}

int engine_quant_ftype(enum engine_quant q)
{
    return (unsigned)q < sizeof engine_quants / sizeof engine_quants[0] ? engine_quants[q].ftype : -1;
}

static double now_seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

void engine_free(struct engine *e)
{
    if (!e) return;
    /* The CPU backend's buffers may come from the GPU backend's allocator: free it first. */
    if (e->cpu) e->cpu->ops->free(e->cpu);
    if (e->gpu) e->gpu->ops->free(e->gpu);
    step_plan_free(&e->plan);
    kv_cache_free(&e->kv);
    kv_cache_free(&e->kv_swa);
    seq_state_free(&e->state);
    model_free(&e->model);
    free(e->new_len);
    free(e->first);
    free(e->streamed);
    free(e);
}

/* --cpu-arith auto on the CPU engine: int8 x when most of the layers' bytes are K-quants (Q4_K_M, Q5_K_M,
 * Q6_K files) or Q8_0. The f32 K-quant products are bound by their arithmetic (int8 x is 1.3x at 16 threads,
 * ~3x at one: kernels/cpu/NOTES.md); Q8_0 with int8 x is llama.cpp's own arithmetic, 1.02x on the H200's
 * 16-core host and 1.07-1.35x on 2 cores (runtime/NOTES.md, 2026-12-02i), and rounds x to 1/127 of a block's
 * largest value against the weights' 1/127. f32 x for the 4- and 5-bit 32-element types: SmolLM2-135M Q4_1
 * loses its "Paris" to int8 x. */
static int int8_model(const struct model *m)
{
    uint64_t k = 0, all = 0;
    for (int l = 0; l < m->hp.n_layers; l++) {
        const struct wview *w[LAYER_N_VIEWS];
        layer_model_views(&m->layers[l], w);
        for (int i = 0; i < LAYER_N_VIEWS; i++) {
            all += wview_bytes(w[i]);
            if (dtype_block_size(w[i]->type) == 256 || w[i]->type == DTYPE_Q8_0) k += wview_bytes(w[i]);
        }
    }
    return all > 0 && 2 * k > all;
}

/* ----------------------------------------------------------------------------------------------------------
 */
/* Init: the host layers of a GPU engine */

/* The CPU backend for the host layers: reads their pinned blocks, sends its KV ops to the GPU. */
static int host_backend_init(struct engine *e, char err[256])
{
    const int L = e->model.hp.n_layers;
    struct layer_weights *w = calloc((size_t)L, sizeof *w);
    if (!w) return FERRY_ERR_NOMEM;
    for (int l = 0; l < L; l++) forward_cuda_host_weights(e->gpu, l, &w[l]);
    struct forward_cpu_params cp = forward_cpu_default_params();
    cp.max_tokens = e->p.max_batch_tokens;
    cp.n_threads = e->p.cpu_threads ? e->p.cpu_threads : e->p.n_threads;
    cp.pin_threads = !getenv("FERRY_NO_PIN");
    cp.weights = w;
    cp.kv_owner = e->gpu;
    cp.host_alloc = forward_cuda_host_alloc;
    cp.host_free = forward_cuda_host_free;
    cp.alloc_ctx = e->gpu;
    cp.act = e->act;
    cp.plain = e->plain;
    cp.state = &e->state; /* the recurrent host layers' own state (the device keeps the others') */
    int rc = forward_cpu_init(&e->cpu, &e->model, &cp);
    free(w);
    if (rc) snprintf(err, 256, "cannot set up the host's share of the layers (%s)", ferry_status_str(rc));
    return rc;
}

/* The host's side of the step planner's cost model (c holds the GPU's rates already): its time for one host
 * layer at a few step sizes (and again while the link copies, which is how it runs beside streaming:
 * *slow_out is the factor, and the times are given under that load), the exchange around a host layer. */
static int measure_costs(struct engine *e, const struct device_map *map, int ref, struct step_cost *c,
                         double *slow_out)
{
    const struct llm_hparams *hp = &e->model.hp;
    c->cpu_ref_bytes = forward_cuda_layer_bytes(e->gpu, ref);
    /* Timed over the host layers in turn (ref first), so their weights come from memory as in a step. */
    int host[ENGINE_MAX_LAYERS_TIMED], n_host = 0;
    host[n_host++] = ref;
    for (int l = 0; l < hp->n_layers && n_host < ENGINE_MAX_LAYERS_TIMED; l++)
        if (l != ref && map->where[l] != PLACEMENT_GPU) host[n_host++] = l;
    int rc;
    /* 1, 2, 4 ... 64 tokens, then the largest step (at most CPU_TIMED_M_MAX): interpolated between them,
     * extrapolated linearly past the last (compute bound). The largest is timed rather than extrapolated from
     * 64 because products on AMX tiles stay memory bound far past 64 tokens. */
    const int m_max = e->p.max_batch_tokens < CPU_TIMED_M_MAX ? e->p.max_batch_tokens : CPU_TIMED_M_MAX;
    char timed[256];
    int tl = 0;
    for (int m = 1; m <= m_max && c->n_cpu < STEP_COST_MAX_M; m = m < 64 && 2 * m <= m_max ? 2 * m : m_max) {
        double t;
        if ((rc = forward_cpu_time_layers(e->cpu, host, n_host, m, m <= 4 ? 7 : m <= 64 ? 3 : 1, &t)))
            return rc;
        c->cpu_m[c->n_cpu] = m;
        c->cpu_s[c->n_cpu++] = t;
        if (tl < (int)sizeof timed)
            tl += snprintf(timed + tl, sizeof timed - tl, "%s%d: %.2f", tl ? ", " : "", m, t * 1e3);
        if (t > 0.25 || m == m_max) break;
    }
    FLOG_INFO("cost model: host layer (ms) at tokens %s", timed);
    /* The same layer at m = 1 while the link is busy: host memory serves both. */
    if (map->ring_bytes > 0) {
        double t1;
        if ((rc = forward_cuda_link_load_begin(e->gpu, 8 * c->cpu_s[0]))) return rc;
        rc = forward_cpu_time_layers(e->cpu, host, n_host, 1, 7, &t1);
        c->h2d_loaded = forward_cuda_link_load_end(e->gpu);
        if (rc) return rc;
        const double slow = t1 > c->cpu_s[0] ? t1 / c->cpu_s[0] : 1.0;
        for (int i = 0; i < c->n_cpu; i++) c->cpu_s[i] *= slow;
        *slow_out = slow;
        FLOG_INFO(
            "cost model: host layer at 1 token %.2f ms alone, %.2f ms while the link copies (%.1f GB/s then, "
            "%.1f GB/s alone)",
            c->cpu_s[0] / slow * 1e3, c->cpu_s[0] * 1e3, c->h2d_loaded / 1e9, c->h2d / 1e9);
    }
    /* Experiments and tests: a host that was busy while it was timed (FERRY_HOST_COST_SCALE=2: twice as slow,
     * alone and beside the link alike). */
    const char *scale_env = getenv("FERRY_HOST_COST_SCALE");
    const double scale = scale_env ? atof(scale_env) : 1.0;
    if (scale > 0 && scale != 1.0) {
        FLOG_WARN("FERRY_HOST_COST_SCALE: the host layer's start-up timing is taken %.3gx", scale);
        for (int i = 0; i < c->n_cpu; i++) c->cpu_s[i] *= scale;
    }
    double ex;
    if ((rc = forward_cuda_time_exchange(e->gpu, 1, &ex))) return rc;
    c->sync_s = ex / 2;
    const double qd = (double)hp->n_heads * hp->head_dim, kvd = (double)hp->n_kv_heads * hp->head_dim;
    c->layer_bytes_per_token = (2 * qd + 2 * kvd) * sizeof(float);
    c->run_bytes_per_token = 2.0 * hp->dim * sizeof(float);
    return FERRY_OK;
}
/* A step plan for `map` from the costs `c` (mode: the engine's placement, or `mode_override` when >= 0). */
static int make_plan(struct engine *e, const struct device_map *map, const struct step_cost *c,
                     int mode_override, const struct step_pace *pace, const struct step_plan *keep,
                     struct step_plan *out, char err[256])
{
    const int L = e->model.hp.n_layers;
    uint64_t *bytes = calloc((size_t)L, sizeof *bytes), *params = calloc((size_t)L, sizeof *params),
             *pieces = calloc((size_t)L * LAYER_N_MATS, sizeof *pieces);
    uint8_t *no_attend = calloc((size_t)L, 1);
    int rc = FERRY_ERR_NOMEM;
    if (bytes && params && pieces && no_attend) {
        for (int l = 0; l < L; l++) {
            no_attend[l] = (uint8_t)llm_layer_is_recurrent(&e->model.hp, l);
            bytes[l] = forward_cuda_layer_bytes(e->gpu, l);
            params[l] = layer_params(&e->model.layers[l]);
            forward_cuda_layer_pieces(e->gpu, l, pieces + (size_t)l * LAYER_N_MATS);
        }
        const char *no_park = getenv("FERRY_NO_PARK"); /* "1": never park host layers (comparisons) */
        const enum step_mode mode = mode_override >= 0 ? (enum step_mode)mode_override
                                    : e->p.placement == ENGINE_PLACEMENT_STREAM ? STEP_MODE_STREAM
                                    : e->p.placement == ENGINE_PLACEMENT_CPU    ? STEP_MODE_CPU
                                                                                : STEP_MODE_AUTO;
        struct step_plan_input in = {
            .n_layers = L,
            .where = map->where,
            .stream_only = map->stream_only,
            .cpu_only = map->cpu_only,
            .no_attend = no_attend,
            .layer_bytes = bytes,
            .layer_params = params,
            .head_bytes = (uint64_t)dtype_row_size(e->model.output.type, e->model.output.cols) *
                          (uint64_t)e->model.output.rows,
            .ring_bytes = map->ring_bytes,
            .piece_bytes = pieces,
            .n_pieces = LAYER_N_MATS,
            .no_park = no_park != NULL && strcmp(no_park, "0") != 0,
            .max_tokens = e->p.max_batch_tokens,
            .mode = mode,
            .margin = ENGINE_PLAN_MARGIN,
            .force = e->p.plan_override,
            .cost = *c,
            .pace = pace,
            .keep = keep};
        rc = step_plan_make(&in, out, err);
    }
    free(bytes);
    free(params);
    free(pieces);
    free(no_attend);
    return rc;
}

/* The step plan of a GPU engine: the device_map's host layers per step size, from measured costs (none are
 * needed when they always stream or always run on the host, or when the plan is given). *slow: how much
 * slower the host computed a layer while the link copied (1 when not measured). */
static int gpu_plan(struct engine *e, struct step_cost *cost, double *slow, char err[256])
{
    const struct device_map *map = forward_cuda_map(e->gpu);
    const int L = e->model.hp.n_layers;
    int ref = -1;
    for (int l = 0; l < L && ref < 0; l++)
        if (map->where[l] != PLACEMENT_GPU) ref = l;
    struct backend_stats gs;
    e->gpu->ops->stats(e->gpu, &gs);
    memset(cost, 0, sizeof *cost);
    cost->h2d = gs.h2d_bytes_per_s;
    cost->hbm = gs.hbm_bytes_per_s;
    cost->gpu_flops = ENGINE_GPU_FLOPS;
    cost->gpu_layer_s = ENGINE_GPU_LAYER_S;
    cost->step_s = ENGINE_STEP_S;
    *slow = 1.0;
    int rc;
    /* The device's own rate for this model's layers: a resident layer timed at 1 token (block-type GEMVs read
     * their weights well below the copy rate hbm is measured at; F16 comes close to it). */
    int res = -1;
    for (int l = 0; l < L && res < 0 && ref >= 0; l++)
        if (map->where[l] == PLACEMENT_GPU) res = l;
    double t_res;
    if (res >= 0 && !forward_cuda_time_layer(e->gpu, res, 1, &t_res) && t_res > 2 * cost->gpu_layer_s) {
        const double rate = (double)forward_cuda_layer_bytes(e->gpu, res) / (t_res - cost->gpu_layer_s);
        FLOG_INFO(
            "cost model: a resident layer at 1 token %.3f ms: its weights read at %.0f GB/s (device copies "
            "at %.0f)",
            t_res * 1e3, rate / 1e9, cost->hbm / 1e9);
        if (rate < cost->hbm) cost->hbm = rate;
    }
    if (e->cpu && ref >= 0 && (rc = measure_costs(e, map, ref, cost, slow))) {
        snprintf(err, 256, "measuring the host's layer time failed (%s)", ferry_status_str(rc));
        return rc;
    }
    e->cost = *cost;
    e->slow = *slow;
    step_pace_init(&e->pace);
    e->host_s = 0;
    const char *adapt_env = getenv("FERRY_PLAN_ADAPT"); /* "0": keep the start-up plan (comparisons) */
    e->adapt = e->cpu && cost->n_cpu > 0 && map->ring_bytes > 0 && e->p.placement == ENGINE_PLACEMENT_AUTO &&
               !e->p.plan_override && !(adapt_env && !strcmp(adapt_env, "0"));
    return make_plan(e, map, cost, -1, NULL, NULL, &e->plan, err);
}

/* The CUDA backend and, when layers live in host memory and the CPU may compute them, the host's backend;
 * then the step plan. A map's recurrent host layers are either computed by the host's cores on every step
 * (their state in host memory) or streamed on every step (their state on the device), for the map's life
 * (cp->recurrent_stream: recurrent_stream_of). */
static int gpu_engine_init(struct engine *e, struct forward_cuda_params *cp, struct step_cost *cost,
                           double *slow, char err[256])
{
    int rc;
    if ((rc = forward_cuda_init(&e->gpu, &e->model, &e->kv, cp, err))) return rc;
    e->p.kv_tokens = e->kv.n_blocks * e->kv.block_size;
    e->head = e->gpu;
    const struct device_map *map = forward_cuda_map(e->gpu);
    const int host_cpu = e->p.plan_override ? strchr(e->p.plan_override, 'c') != NULL
                                            : e->p.placement != ENGINE_PLACEMENT_STREAM ||
                                                  map->ring_bytes == 0 || map->n_cpu_only > 0;
    if (map->n_streamed > 0 && host_cpu && (rc = host_backend_init(e, err))) {
        /* Layers the host's backend cannot compute beside the GPU's cache (Gemma 4's attention shapes):
         * where the plan was free to choose, the host layers stream to the GPU instead (a map with
         * CPU-only layers was asked for them: --placement cpu or a forced plan). */
        if (rc != FERRY_ERR_UNSUPPORTED || map->ring_bytes == 0 || map->n_cpu_only ||
            e->p.placement != ENGINE_PLACEMENT_AUTO || e->p.plan_override)
            return rc;
        FLOG_INFO("%s: the host layers stream to the GPU instead", err);
        err[0] = '\0';
        e->p.placement = ENGINE_PLACEMENT_STREAM;
    }
    return gpu_plan(e, cost, slow, err);
}

/* Frees what gpu_engine_init made (any part of it). */
static void gpu_engine_drop(struct engine *e)
{
    if (e->cpu) e->cpu->ops->free(e->cpu); /* first: its buffers may come from the GPU backend's allocator */
    e->cpu = NULL;
    if (e->gpu) e->gpu->ops->free(e->gpu);
    e->gpu = e->head = NULL;
    step_plan_free(&e->plan);
}

/* --placement auto with a ring: the map planned first holds as many resident layers as fit beside the
 * smallest ring (two of the largest pieces), the ring growing into what they leave. Its alternatives: one or
 * two resident layers fewer, for a deeper ring (the link works further ahead while the host's cores compute
 * layers), or no ring at all, with more resident layers and every host layer on the CPU. Each is predicted,
 * from the costs just measured, for a workload of the configured concurrency (--parallel sequences at once,
 * each with ENGINE_MIX_PROMPT prompt and ENGINE_MIX_GEN generated tokens); when the best beats the first map
 * by the margin, the GPU backend is built again with it. No ring can pay when one or two layers are left over
 * and prompts are short; in every configuration measured so far (Q4_K_M 7B at 3.9-4 GiB, one and sixteen
 * sequences) the ring won (runtime/NOTES.md, 2026-12-01c). */
#define SETTLE_FEWER 2 /* resident layers given up for depth, at most */

static int settle_ring(struct engine *e, struct forward_cuda_params *cp, const struct step_cost *cost,
                       double slow, char err[256])
{
    const struct device_map *map = forward_cuda_map(e->gpu);
    struct step_cost alone = *cost; /* with no ring, the host computes with the link idle */
    for (int i = 0; i < alone.n_cpu; i++) alone.cpu_s[i] /= slow;
    const double t_first = step_plan_workload_s(&e->plan, e->p.n_seqs, ENGINE_MIX_PROMPT, ENGINE_MIX_GEN);
    if (t_first <= 0) return FERRY_OK;
    /* Variant v: 1..SETTLE_FEWER resident layers fewer with a ring; SETTLE_FEWER + 1: no ring. */
    double best_t = t_first;
    int best_v = 0, best_resident = map->n_resident;
    char line[512];
    int at = snprintf(line, sizeof line, "%d resident layers and a ring of %.0f MiB %.2f s", map->n_resident,
                      map->ring_bytes / 1048576.0, t_first);
    for (int v = 1; v <= SETTLE_FEWER + 1; v++) {
        const int no_ring = v == SETTLE_FEWER + 1;
        struct device_map alt;
        char why[256];
        if (forward_cuda_map_variant(e->gpu, no_ring, no_ring ? 0 : v, &alt, why)) continue; /* none fits */
        struct step_plan alt_plan = {0};
        double t = 0;
        if ((no_ring || alt.n_resident == map->n_resident - v) &&
            (alt.n_streamed == 0 || e->cpu || !no_ring) &&
            !make_plan(e, &alt, no_ring ? &alone : cost, no_ring ? STEP_MODE_CPU : -1, NULL, NULL, &alt_plan,
                       why))
            t = step_plan_workload_s(&alt_plan, e->p.n_seqs, ENGINE_MIX_PROMPT, ENGINE_MIX_GEN);
        step_plan_free(&alt_plan);
        if (t > 0 && at < (int)sizeof line)
            at += snprintf(line + at, sizeof line - at,
                           no_ring ? "; %d without a ring %.2f s" : "; %d and %.0f MiB %.2f s",
                           alt.n_resident, no_ring ? t : alt.ring_bytes / 1048576.0, t);
        if (t > 0 && t < best_t) best_t = t, best_v = v, best_resident = alt.n_resident;
        device_map_free(&alt);
    }
    const int change = best_v && best_t < t_first * (1.0 - ENGINE_PLAN_MARGIN);
    FLOG_INFO("placement auto: %d sequences of %d prompt + %d generated tokens predicted with %s: %s",
              e->p.n_seqs, ENGINE_MIX_PROMPT, ENGINE_MIX_GEN, line,
              !change                      ? "first map kept"
              : best_v == SETTLE_FEWER + 1 ? "no ring"
                                           : "fewer resident layers");
    if (!change) return FERRY_OK;
    gpu_engine_drop(e);
    if (best_v == SETTLE_FEWER + 1)
        cp->no_ring = 1;
    else
        cp->fewer_resident = best_v;
    struct step_cost c2;
    double s2;
    int rc;
    if ((rc = gpu_engine_init(e, cp, &c2, &s2, err))) {
        /* (the device's memory may not give the new layout what it gave the old one) */
        FLOG_WARN("placement auto: building the other map failed (%s); keeping the first", err);
        gpu_engine_drop(e);
        cp->no_ring = 0;
        cp->fewer_resident = 0;
        err[0] = 0;
        return gpu_engine_init(e, cp, &c2, &s2, err);
    }
    if (forward_cuda_map(e->gpu)->n_resident != best_resident)
        FLOG_INFO("placement auto: the map has %d resident layers (predicted %d)",
                  forward_cuda_map(e->gpu)->n_resident, best_resident);
    return FERRY_OK;
}

/* --ctx-size 0: the model's training context, at most 4096. */
static int default_ctx(const struct llm_hparams *hp)
{
    return hp->ctx_train > 0 && hp->ctx_train < 4096 ? hp->ctx_train : 4096;
}

/* Blocks of the sliding-window layers' own pool (engine_params.swa_full), or 0 when they keep every position
 * in the engine's pool: a slot holds its window, ENGINE_SWA_SLACK positions before it and a step's rows
 * after it (a range of window - 1 + slack + rows positions, which may straddle one block more than its
 * length fills), and never more of this pool's blocks than of the other's (both hold the same positions'
 * blocks from the same step on; this one drops those before the window). */
static int swa_pool_blocks(const struct llm_hparams *hp, const struct engine_params *p)
{
    if (hp->sliding_window <= 0 || kv_cache_swa_layers(hp) == 0) return 0;
    const int bs = ENGINE_KV_BLOCK,
              rows = p->max_batch_tokens < p->ctx_size ? p->max_batch_tokens : p->ctx_size;
    const int64_t slot = ((int64_t)hp->sliding_window - 1 + ENGINE_SWA_SLACK + rows + bs - 1) / bs + 1;
    const int64_t all = ((int64_t)p->kv_tokens + bs - 1) / bs, blocks = slot * p->n_seqs;
    return blocks < all ? (int)blocks : 0;
}

void engine_kv_bytes(const struct llm_hparams *hp, const struct engine_params *params, uint64_t *all,
                     uint64_t *swa)
{
    struct engine_params p = *params;
    *all = *swa = 0;
    if (p.n_seqs <= 0 || p.n_seqs > 1024 || p.ctx_size < 0 || p.kv_tokens < 0 || p.max_batch_tokens <= 0)
        return;
    if (p.ctx_size == 0) p.ctx_size = default_ctx(hp);
    if (p.kv_tokens == 0)
        p.kv_tokens = (int)((int64_t)p.n_seqs * p.ctx_size > INT32_MAX ? INT32_MAX : p.n_seqs * p.ctx_size);
    const int swa_blocks = p.swa_full ? 0 : swa_pool_blocks(hp, &p);
    const int n_swa = swa_blocks ? kv_cache_swa_layers(hp) : 0;
    /* kv_cache_bytes reads the shape only */
    struct kv_cache kv = {.n_layers = llm_kv_cache_layers(hp) - n_swa,
                          .n_kv_heads = llm_kv_cache_heads(hp),
                          .head_dim = hp->head_dim,
                          .block_size = ENGINE_KV_BLOCK,
                          .n_blocks = (p.kv_tokens + ENGINE_KV_BLOCK - 1) / ENGINE_KV_BLOCK};
    *all = kv_cache_bytes(&kv, (enum kv_elem)p.kv_type);
    kv.n_layers = n_swa, kv.n_blocks = swa_blocks;
    *swa = kv_cache_bytes(&kv, (enum kv_elem)p.kv_type);
}

/* Whether slot seq, cut to n positions, still holds the K/V its next row's window reads (positions
 * (n - window, n)): always without a window pool, or from the start. */
static int swa_holds(const struct engine *e, int seq, int n)
{
    const int from = kv_cache_held_from(&e->kv_swa, seq);
    return !e->kv_swa.n_layers || n == 0 || from == 0 || n - e->model.hp.sliding_window + 1 >= from;
}

/* --kv-type q8_0: blocks of 32 per head; on the GPU each lane's pair of scales must stay 4-byte aligned: 64.
 */
static int check_kv_type(int kv_type, const struct llm_hparams *hp, int gpu, char err[256])
{
    if (kv_type != KV_Q8_0 ||
        (hp->head_dim % (gpu ? 64 : 32) == 0 && hp->head_dim_swa % (gpu ? 64 : 32) == 0))
        return FERRY_OK;
    snprintf(err, 256, "--kv-type q8_0 needs a head size that is a multiple of %d%s (this model's is %d)",
             gpu ? 64 : 32, gpu ? " on the GPU" : "", hp->head_dim);
    return FERRY_ERR_INVALID;
}

/* Takes ownership of *model (freed on failure too). */
static int engine_create(struct engine **out, struct model *model, const struct engine_params *params,
                         char err[256])
{
    *out = NULL;
    struct engine_params p = *params;
    const struct llm_hparams *mhp = &model->hp;
    if (p.ctx_size == 0) p.ctx_size = default_ctx(mhp);
    if (p.ctx_size > 0) model_fit_ctx(model, p.ctx_size);
    /* auto: the GPU when there is one, unless the CUDA backend does not take the model (engine_cuda_lacks:
     * heads wider than this GPU's shared memory allows): then the CPU. */
    const char *cuda_lacks = engine_cuda_lacks(&model->hp);
    const int use_cuda = p.backend == ENGINE_BACKEND_CUDA ||
                         (p.backend == ENGINE_BACKEND_AUTO && !cuda_lacks && forward_cuda_devices() > 0);
    if (p.backend == ENGINE_BACKEND_CUDA && cuda_lacks) {
        snprintf(err, 256, "the CUDA backend has no kernels for %s: run this model with --backend cpu",
                 cuda_lacks);
        model_free(model);
        return FERRY_ERR_UNSUPPORTED;
    }
    if (p.backend == ENGINE_BACKEND_AUTO && cuda_lacks && forward_cuda_devices() > 0)
        FLOG_WARN("the CUDA backend has no kernels for %s: the GPU is not used for this model", cuda_lacks);
    if (p.n_seqs <= 0 || p.n_seqs > 1024 || p.max_batch_tokens <= 0 || p.max_batch_tokens > 65536 ||
        p.ctx_size < 0 || p.kv_tokens < 0 || p.cpu_threads < 0 || p.cpu_threads > 1024 ||
        (unsigned)p.placement > ENGINE_PLACEMENT_CPU) {
        snprintf(err, 256, "invalid engine parameters (n_seqs %d, max_batch_tokens %d, ctx_size %d)",
                 p.n_seqs, p.max_batch_tokens, p.ctx_size);
        model_free(model);
        return FERRY_ERR_INVALID;
    }
    struct engine *e = calloc(1, sizeof *e);
    if (!e) {
        model_free(model);
        return FERRY_ERR_NOMEM;
    }
    e->model = *model;
    memset(model, 0, sizeof *model);
    int rc;
    const struct llm_hparams *hp = &e->model.hp;
    if (p.quant != ENGINE_QUANT_NONE) {
        const int ftype = engine_quant_ftype(p.quant);
        if (ftype < 0) {
            snprintf(err, 256, "unknown quantization %d", (int)p.quant);
            rc = FERRY_ERR_INVALID;
            goto fail;
        }
        if ((rc = model_quantize(&e->model, ftype, p.n_threads, err))) goto fail;
    }
    /* F16/BF16 weights: bf16 AMX tiles (where the CPU has them) for the products of many rows of a GPU
     * engine's host layers, whose GPU products round x to f16 anyway, and wherever int8 is asked; the CPU
     * engine keeps f32 by default (the reference the tests hold it to). */
    const int plain_bf16 = p.cpu_int8 < 0 ? use_cuda : p.cpu_int8 == 1;
    if (p.cpu_int8 < 0) p.cpu_int8 = use_cuda || int8_model(&e->model);
    e->act = p.cpu_int8 ? KERN_CPU_ACT_INT8 : KERN_CPU_ACT_F32; /* (forward_cpu sets them as it computes) */
    e->plain = plain_bf16 ? KERN_CPU_PLAIN_BF16 : KERN_CPU_PLAIN_F32;
    /* On the GPU an unset pool is sized to the budget (forward_cuda_init re-sizes the tables). */
    const int kv_auto = use_cuda && p.kv_tokens == 0;
    if (p.kv_tokens == 0) p.kv_tokens = p.n_seqs * p.ctx_size;
    e->p = p;
    if (use_cuda && p.kv_type == KV_F32)
        FLOG_WARN("--kv-type f32 applies to the CPU backend; the CUDA backend's KV cache is f16");
    if ((rc = check_kv_type(p.kv_type, hp, use_cuda, err))) goto fail;
    const int swa_blocks = p.swa_full ? 0 : swa_pool_blocks(hp, &p);
    const int n_swa = swa_blocks ? kv_cache_swa_layers(hp) : 0;
    rc = kv_cache_init(&e->kv, llm_kv_cache_layers(hp) - n_swa, llm_kv_cache_heads(hp), hp->head_dim,
                       p.n_seqs, p.ctx_size, p.kv_tokens, ENGINE_KV_BLOCK, use_cuda ? KV_NO_HOST : p.kv_type);
    if (!rc && swa_blocks)
        rc = kv_cache_init(&e->kv_swa, n_swa, llm_kv_cache_heads(hp), hp->head_dim, p.n_seqs, p.ctx_size,
                           swa_blocks * ENGINE_KV_BLOCK, ENGINE_KV_BLOCK, use_cuda ? KV_NO_HOST : p.kv_type);
    if (rc) {
        snprintf(err, 256, "cannot allocate the KV cache (%d positions)", p.kv_tokens);
        goto fail;
    }
    const struct seq_state_params sp = {.n_ckpt = p.ctx_checkpoints, .ckpt_step = p.ckpt_step};
    if ((rc = seq_state_init(&e->state, hp, p.n_seqs, sp))) {
        snprintf(err, 256, "cannot allocate the recurrent layers' state (%.1f MiB)",
                 seq_state_bytes(hp, p.n_seqs, 0) / 1048576.0);
        goto fail;
    }
    /* auto's plan comes from start-up timings, which vary between runs: --deterministic keeps one that does
     * not. */
    if (use_cuda && p.deterministic && p.placement == ENGINE_PLACEMENT_AUTO && !p.plan_override) {
        FLOG_INFO("--deterministic: host layers stream (--placement auto would plan from start-up timings)");
        e->p.placement = p.placement = ENGINE_PLACEMENT_STREAM;
    }
    size_t at = 0;
    if (use_cuda) {
        struct forward_cuda_params cp = engine_cuda_params(&p, kv_auto);
        cp.kv_swa = e->kv_swa.n_layers ? &e->kv_swa : NULL;
        struct step_cost cost;
        double slow;
        if ((rc = gpu_engine_init(e, &cp, &cost, &slow, err))) goto fail;
        if (p.placement == ENGINE_PLACEMENT_AUTO && !p.plan_override && p.gpu_layers < 0 &&
            p.ring_layers == 0 && forward_cuda_map(e->gpu)->ring_bytes > 0 &&
            (rc = settle_ring(e, &cp, &cost, slow, err)))
            goto fail;
        const struct device_map *map = forward_cuda_map(e->gpu);
        at = (size_t)device_map_format(map, e->placement, sizeof e->placement);
        if (e->cpu && at < sizeof e->placement)
            at +=
                (size_t)snprintf(e->placement + at, sizeof e->placement - at,
                                 "host layers computed by %d pinned CPU threads when the plan says cpu (x in "
                                 "%s for block-type weights)\n",
                                 forward_cpu_threads(e->cpu), e->p.cpu_int8 ? "int8" : "f32");
        if (map->n_streamed > 0 && at < sizeof e->placement)
            step_plan_format(&e->plan, e->placement + at, sizeof e->placement - at);
    } else {
        struct forward_cpu_params cp = forward_cpu_default_params();
        cp.max_tokens = p.max_batch_tokens;
        cp.n_threads = p.n_threads;
        cp.kv = &e->kv;
        cp.kv_swa = e->kv_swa.n_layers ? &e->kv_swa : NULL;
        cp.state = &e->state;
        cp.act = e->act;
        cp.plain = e->plain;
        cp.invariant = p.deterministic; /* (not a GPU engine's host layers: its device products are not) */
        if ((rc = forward_cpu_init(&e->cpu, &e->model, &cp))) {
            snprintf(err, 256, "cannot allocate CPU activations for %d tokens", p.max_batch_tokens);
            goto fail;
        }
        e->head = e->cpu;
        if ((rc = step_plan_uniform(&e->plan, hp->n_layers, p.max_batch_tokens, PLACEMENT_CPU))) goto fail;
        snprintf(e->placement, sizeof e->placement,
                 "cpu: all layers (%d threads, x in %s for block-type weights)", forward_cpu_threads(e->cpu),
                 e->p.cpu_int8 ? "int8" : "f32");
    }
    e->new_len = malloc((size_t)p.n_seqs * sizeof(int32_t));
    e->first = malloc((size_t)p.n_seqs * sizeof(int32_t));
    e->streamed = malloc((size_t)hp->n_layers * sizeof *e->streamed);
    if (!e->new_len || !e->first || !e->streamed) {
        rc = FERRY_ERR_NOMEM;
        goto fail;
    }
    e->stats.backend = use_cuda ? "cuda" : "cpu";
    e->stats.kv_blocks_total = e->kv.n_blocks;
    e->stats.kv_blocks_ext = e->kv.n_ext;
    e->stats.kv_block_size = e->kv.block_size;
    e->stats.cpu_threads = e->cpu ? forward_cpu_threads(e->cpu) : 0;
    const int kv_pos = e->kv.n_blocks * e->kv.block_size, full = kv_pos / (p.ctx_size > 0 ? p.ctx_size : 1);
    char room[160] = "";
    if (full < p.n_seqs) /* say so: requests then wait in the queue with no other sign of why */
        snprintf(
            room, sizeof room,
            "; room for %d of the %d slots at full context (requests are admitted by prompt + max_tokens, "
            "the rest wait)",
            full, p.n_seqs);
    const enum kv_elem kv_el = !use_cuda              ? (enum kv_elem)e->kv.elem
                               : p.kv_type == KV_Q8_0 ? KV_Q8_0
                                                      : KV_F16; /* the device's cache: f16 or Q8_0 */
    char ext[96] = "", swa[192] = "";
    if (e->kv.n_ext) /* the pool's extension in host memory (device_map.h) */
        snprintf(ext, sizeof ext, "; %d of them in host memory", e->kv.n_ext * e->kv.block_size);
    if (e->kv_swa.n_layers)
        snprintf(swa, sizeof swa,
                 "; its %d sliding-window layers (window %d) in a pool of their own: %d positions (%.1f MiB)",
                 e->kv_swa.n_layers, hp->sliding_window, e->kv_swa.n_blocks * e->kv_swa.block_size,
                 kv_cache_bytes(&e->kv_swa, kv_el) / 1048576.0);
    else if (hp->sliding_window > 0 && kv_cache_swa_layers(hp) > 0)
        snprintf(swa, sizeof swa, "; sliding-window layers keep every position (%s)",
                 p.swa_full ? "--swa-full" : "their window is no smaller");
    FLOG_INFO("engine: %s backend, ctx %d, %d slots, KV pool %d positions (%.1f MiB, %s%s)%s%s",
              e->stats.backend, p.ctx_size, p.n_seqs, kv_pos, kv_cache_bytes(&e->kv, kv_el) / 1048576.0,
              kv_type_names[kv_el], ext, swa, room);
    if (e->state.n_layers > 0) {
        const struct device_map *map = e->gpu ? forward_cuda_map(e->gpu) : NULL;
        char where[160] = "";
        if (map)
            snprintf(where, sizeof where,
                     "; %d of them computed by the host's cores on every step with their state here, the "
                     "others' live on the device",
                     map->n_cpu_only);
        FLOG_INFO(
            "engine: recurrent state of %d layers, %.1f MiB for %d slots, and up to %d checkpoints a slot "
            "in host memory (%.1f MiB in all; a slot continues, goes back to a checkpoint, or starts "
            "again)%s",
            e->state.n_layers, seq_state_bytes(hp, p.n_seqs, 0) / 1048576.0, p.n_seqs, sp.n_ckpt,
            seq_state_bytes(hp, p.n_seqs, sp.n_ckpt) / 1048576.0, where);
    }
    if (e->gpu && forward_cuda_map(e->gpu)->n_streamed > 0) {
        char plan[2048];
        step_plan_format(&e->plan, plan, sizeof plan);
        FLOG_INFO("%s", plan);
    }
    *out = e;
    return FERRY_OK;
fail:
    engine_free(e);
    return rc;
}

int engine_init(struct engine **out, const struct model_file *mf, const struct engine_params *p,
                char err[256])
{
    struct model m;
    int rc = model_init(&m, mf, err);
    return rc ? rc : engine_create(out, &m, p, err);
}

int engine_init_synthetic(struct engine **out, const struct llm_hparams *hp, enum dtype wt,
                          const struct engine_params *p, char err[256])
{
    return engine_init_synthetic_mix(out, hp, wt, -1, p, err);
}

int engine_init_synthetic_mix(struct engine **out, const struct llm_hparams *hp, enum dtype wt, int ftype,
                              const struct engine_params *p, char err[256])
{
    struct model m;
    int rc = synthetic_model_init(&m, hp, wt, ftype, 0x5eed, p->n_threads, err);
    return rc ? rc : engine_create(out, &m, p, err);
}

uint64_t engine_weight_bytes(const struct engine *e)
{
    return e->model.weight_bytes;
}

int engine_plan(const struct model_file *mf, const struct engine_params *params, char *buf, size_t cap,
                char err[256])
{
    struct engine_params p = *params;
    struct model m;
    struct kv_cache kv;
    struct device_map map;
    int rc = model_init(&m, mf, err);
    if (rc) return rc;
    if ((rc = check_kv_type(p.kv_type, &m.hp, 1, err))) {
        model_free(&m);
        return rc;
    }
    if (p.ctx_size == 0) p.ctx_size = default_ctx(&m.hp);
    if (p.kv_tokens == 0) p.kv_tokens = p.n_seqs * p.ctx_size;
    /* The pools engine_create would make (tables only). */
    struct kv_cache kv_swa = {0};
    const int swa_blocks = p.swa_full ? 0 : swa_pool_blocks(&m.hp, &p);
    const int n_swa = swa_blocks ? kv_cache_swa_layers(&m.hp) : 0;
    rc = kv_cache_init(&kv, llm_kv_cache_layers(&m.hp) - n_swa, llm_kv_cache_heads(&m.hp), m.hp.head_dim,
                       p.n_seqs, p.ctx_size, p.kv_tokens, ENGINE_KV_BLOCK, KV_NO_HOST);
    if (!rc && swa_blocks)
        rc = kv_cache_init(&kv_swa, n_swa, llm_kv_cache_heads(&m.hp), m.hp.head_dim, p.n_seqs, p.ctx_size,
                           swa_blocks * ENGINE_KV_BLOCK, ENGINE_KV_BLOCK, KV_NO_HOST);
    if (!rc) {
        struct forward_cuda_params cp = engine_cuda_params(&p, params->kv_tokens == 0);
        cp.kv_swa = swa_blocks ? &kv_swa : NULL;
        rc = forward_cuda_plan_offline(&m, &kv, &cp, 54.9e9, 4.18e12, &map, err);
        if (!rc) {
            device_map_format(&map, buf, cap);
            device_map_free(&map);
        }
    }
    kv_cache_free(&kv);
    kv_cache_free(&kv_swa);
    model_free(&m);
    return rc;
}

const struct llm_hparams *engine_hparams(const struct engine *e)
{
    return &e->model.hp;
}
int engine_ctx_size(const struct engine *e)
{
    return e->p.ctx_size;
}
int engine_n_seqs(const struct engine *e)
{
    return e->p.n_seqs;
}

const struct kv_cache *engine_kv_cache(const struct engine *e, int swa)
{
    return !swa ? &e->kv : e->kv_swa.n_layers ? &e->kv_swa : NULL;
}

int engine_seq_len(const struct engine *e, int seq)
{
    return seq >= 0 && seq < e->p.n_seqs ? e->kv.seq_len[seq] : 0;
}

int engine_seq_reusable(const struct engine *e, int seq, int n)
{
    if (seq < 0 || seq >= e->p.n_seqs || n < 0) return 0;
    if (n > e->kv.seq_len[seq]) n = e->kv.seq_len[seq];
    if (e->state.n_layers > 0 && n < e->kv.seq_len[seq]) n = seq_state_ckpt_within(&e->state, seq, n);
    return swa_holds(e, seq, n) ? n : 0;
}

int engine_seq_free(struct engine *e, int seq)
{
    if (seq < 0 || seq >= e->p.n_seqs) return FERRY_ERR_INVALID;
    kv_cache_seq_free(&e->kv, seq);
    kv_cache_seq_free(&e->kv_swa, seq);
    seq_state_drop(&e->state, seq);
    return FERRY_OK;
}

/* The slot's pools cut to n positions. */
static void seq_trim(struct engine *e, int seq, int n)
{
    kv_cache_trim(&e->kv, seq, n);
    kv_cache_trim(&e->kv_swa, seq, n);
    e->kv.seq_len[seq] = n;
}

/* A GPU engine's device state of a recurrent slot is copied into seq_state's slot block before a checkpoint
 * and out of it after a restore. A window pool that no longer holds the window of n (swa_holds) keeps the
 * slot from going back there: it starts again (0), as does a recurrent slot without a checkpoint. */
int engine_seq_keep(struct engine *e, int seq, int n)
{
    if (seq < 0 || seq >= e->p.n_seqs || n < 0 || n > e->kv.seq_len[seq]) return FERRY_ERR_INVALID;
    if (e->state.n_layers > 0 && n < e->kv.seq_len[seq]) { /* recurrent state: where it stands, or saved */
        const int at = seq_state_restore(&e->state, seq, n);
        if (at > 0 && swa_holds(e, seq, at) &&
            (!e->gpu || forward_cuda_state_put(e->gpu, seq, seq_state_slot(&e->state, seq)) == FERRY_OK)) {
            seq_trim(e, seq, at);
            return at;
        }
        seq_trim(e, seq, 0);
        seq_state_drop(&e->state, seq);
        return 0;
    }
    if (n % e->kv.block_size && kv_cache_shared(&e->kv, seq, n)) n -= n % e->kv.block_size;
    if (!swa_holds(e, seq, n)) n = 0;
    seq_trim(e, seq, n);
    return n;
}

int engine_seq_checkpoint(struct engine *e, int seq)
{
    if (seq < 0 || seq >= e->p.n_seqs) return FERRY_ERR_INVALID;
    const int n = e->kv.seq_len[seq];
    if (e->state.n_layers == 0 || n < 1 || seq_state_ckpt_pos(&e->state, seq) == n) return FERRY_OK;
    if (e->gpu && forward_cuda_state_get(e->gpu, seq, seq_state_slot(&e->state, seq)) != FERRY_OK)
        return FERRY_ERR_CUDA;
    return seq_state_save(&e->state, seq, n) ? FERRY_OK : FERRY_ERR_NOMEM;
}

int engine_seq_share(struct engine *e, int src, int dst, int n)
{
    if (src < 0 || src >= e->p.n_seqs || dst < 0 || dst >= e->p.n_seqs || src == dst || n < 0)
        return FERRY_ERR_INVALID;
    kv_cache_seq_free(&e->kv, dst);
    kv_cache_seq_free(&e->kv_swa, dst);
    if (e->state.n_layers > 0) { /* no recurrent state is shared */
        seq_state_drop(&e->state, dst);
        return 0;
    }
    if (n > e->kv.seq_len[src]) n = e->kv.seq_len[src];
    int blocks = n / e->kv.block_size;
    if (!swa_holds(e, src, blocks * e->kv.block_size)) blocks = 0; /* src's window has moved past it */
    int rc = kv_cache_share(&e->kv, src, dst, blocks);
    if (!rc && e->kv_swa.n_layers) rc = kv_cache_share(&e->kv_swa, src, dst, blocks);
    if (rc) {
        kv_cache_seq_free(&e->kv, dst);
        return rc;
    }
    e->kv.seq_len[dst] = blocks * e->kv.block_size;
    return e->kv.seq_len[dst];
}

/* Checks ids, slots and the order of positions: within a slot, positions continue each other and the first
 * one is at most the slot's current length (a slot may rewind to rewrite its tail). */
static int check_batch(struct engine *e, const struct batch *b)
{
    const int n_vocab = e->model.hp.n_vocab;
    if (b->n_tokens <= 0 || b->n_tokens > e->p.max_batch_tokens) return FERRY_ERR_INVALID;
    for (int s = 0; s < e->p.n_seqs; s++) e->new_len[s] = -1;
    for (int i = 0; i < b->n_tokens; i++) {
        int s = b->seq[i], p = b->pos[i];
        if (b->tokens[i] < 0 || b->tokens[i] >= n_vocab || s < 0 || s >= e->p.n_seqs || p < 0)
            return FERRY_ERR_INVALID;
        if (e->new_len[s] < 0 ? p > e->kv.seq_len[s] : p != e->new_len[s]) return FERRY_ERR_INVALID;
        /* The recurrent state continues the slot or starts again: no rewind into it. */
        if (e->new_len[s] < 0 && e->state.n_layers > 0 && p != 0 && p != e->kv.seq_len[s])
            return FERRY_ERR_INVALID;
        if (p >= e->p.ctx_size) return FERRY_ERR_RANGE;
        /* A rewind finds the window's K/V still held (engine_seq_keep). */
        if (e->new_len[s] < 0 && p < e->kv.seq_len[s] && !swa_holds(e, s, p)) return FERRY_ERR_INVALID;
        if (e->new_len[s] < 0) e->first[s] = p;
        e->new_len[s] = p + 1;
    }
    /* No step writes into a block another sequence shares. */
    const int bs = e->kv.block_size;
    for (int s = 0; s < e->p.n_seqs; s++)
        if (e->new_len[s] >= 0)
            for (int p = e->first[s] - e->first[s] % bs; p < e->new_len[s]; p += bs)
                if (kv_cache_shared(&e->kv, s, p)) return FERRY_ERR_INVALID;
    return FERRY_OK;
}

/* ----------------------------------------------------------------------------------------------------------
 */
/* The step */

static struct backend *backend_of(const struct engine *e, enum placement w)
{
    return w == PLACEMENT_CPU ? e->cpu : e->gpu;
}

/* The residual stream from one backend to the next, through the host buffer of whichever lives in host
 * memory (there is one device backend). */
static int move_x(struct backend *from, struct backend *to, int n)
{
    float *h = to->ops->x_host(to);
    if (!h) h = from->ops->x_host(from);
    if (!h) return FERRY_ERR_INTERNAL;
    int rc = from->ops->x_out(from, h, n);
    return rc ? rc : to->ops->x_in(to, h, n);
}

/* Embedding, every layer where the plan puts it, the head. */
static int run_step(struct engine *e, const struct step *st, float *logits)
{
    const int L = e->model.hp.n_layers, n = st->b->n_tokens;
    int uses_cpu = 0, rc;
    for (int l = 0; l < L; l++) uses_cpu |= st->where[l] == PLACEMENT_CPU;
    if (uses_cpu && !e->cpu) return FERRY_ERR_INTERNAL;
    if (e->gpu && (rc = e->gpu->ops->begin(e->gpu, st))) return rc;
    if (e->cpu && (rc = e->cpu->ops->begin(e->cpu, st))) return rc;
    struct backend *cur = backend_of(e, st->where[0]);
    if ((rc = cur->ops->embed(cur, st))) return rc;
    for (int l = 0; l < L; l++) {
        struct backend *be = backend_of(e, st->where[l]);
        if (be != cur && (rc = move_x(cur, be, n))) return rc;
        cur = be;
        if ((rc = be->ops->layer(be, l, st))) return rc;
    }
    if (e->head != cur && (rc = move_x(cur, e->head, n))) return rc;
    float *xh = st->b->hidden_out ? e->head->ops->x_host(e->head) : NULL;
    if (xh) { /* the rows a drafter continues from, normed as the head norms them */
        if ((rc = e->head->ops->x_out(e->head, xh, n))) return rc;
        kern_cpu_rmsnorm(st->b->hidden_out, xh, e->model.output_norm, n, e->model.hp.dim,
                         e->model.hp.norm_eps);
    }
    return st->draw ? e->head->ops->head_draw(e->head, st) : e->head->ops->head(e->head, st, logits);
}

static int step_begin(struct engine *e, const struct batch *b, float *logits, const struct draw_row *draw);
static int step_end(struct engine *e);

int engine_step(struct engine *e, const struct batch *b, float *logits)
{
    if (e->pend_active) return FERRY_ERR_INVALID;
    return step_begin(e, b, logits, NULL);
}

int engine_draws(const struct engine *e)
{
    return e->head->ops->head_draw != NULL && e->head->ops->draw_caps != NULL;
}

int engine_step_draw_begin(struct engine *e, const struct batch *b, const struct draw_row *rows)
{
    const struct backend_ops *h = e->head->ops;
    if (e->pend_active) return FERRY_ERR_INVALID;
    if (!engine_draws(e) || b->hidden) return FERRY_ERR_UNSUPPORTED;
    int cap_rows = 0, cap_bias = 0, cap_hist = 0, n_out = 0;
    h->draw_caps(e->head, &cap_rows, &cap_bias, &cap_hist);
    for (int i = 0; i < b->n_tokens; i++) n_out += b->want_logits[i] != 0;
    if (n_out > cap_rows) return FERRY_ERR_UNSUPPORTED;
    int64_t bias = 0, hist = 0;
    for (int i = 0; i < n_out; i++) {
        if (!rows[i].smp) return FERRY_ERR_INVALID;
        bias += sampler_get_params(rows[i].smp)->n_logit_bias;
        if (sampler_penalizes(rows[i].smp)) hist += sampler_history(rows[i].smp, NULL, NULL, 0);
    }
    if (bias > cap_bias || hist > cap_hist) return FERRY_ERR_UNSUPPORTED;
    return step_begin(e, b, NULL, rows);
}

int engine_step_draw_end(struct engine *e, struct draw_out *out)
{
    if (!e->pend_active) return FERRY_ERR_INVALID;
    e->pend.drawn = out;
    return step_end(e);
}

int engine_step_draw(struct engine *e, const struct batch *b, const struct draw_row *rows,
                     struct draw_out *out)
{
    int rc = engine_step_draw_begin(e, b, rows);
    return rc ? rc : engine_step_draw_end(e, out);
}

int engine_step_overlaps(const struct engine *e, int n_tokens)
{
    if (!engine_draws(e) || n_tokens <= 0 || n_tokens > e->p.max_batch_tokens) return 0;
    const enum placement *w = step_plan_where(&e->plan, n_tokens);
    for (int l = 0; l < e->model.hp.n_layers; l++)
        if (w[l] == PLACEMENT_CPU) return 0;
    return 1;
}

/* After a step of a GPU engine that follows the host's pace: the seconds its CPU-computed host layers spent
 * in their arithmetic against the cost model's, remembered for the step's count of CPU layers; when that
 * evidence moved, the plan is made again with every candidate costed at the pace expected for its count,
 * keeping each step size's layers unless the new choice is clearly faster (step_plan.h). */
static void follow_pace(struct engine *e, const enum placement *where, int n)
{
    struct backend_stats cs;
    e->cpu->ops->stats(e->cpu, &cs);
    const double host_s = cs.layer_seconds - cs.kv_seconds, took = host_s - e->host_s;
    e->host_s = host_s;
    double expected = 0;
    int streams = 0, n_cpu = 0;
    for (int l = 0; l < e->model.hp.n_layers; l++) {
        if (where[l] == PLACEMENT_CPU)
            expected += step_cost_cpu_layer(&e->cost, forward_cuda_layer_bytes(e->gpu, l), n), n_cpu++;
        streams |= where[l] == PLACEMENT_STREAM;
    }
    if (!(expected > 0)) return;
    /* The costs are given with the link busy (e->slow: how much slower than alone); a step that streams keeps
     * the link busy only while the ring has room, so its host layers may run as fast as alone. */
    const double alone = e->slow > 1 ? expected / e->slow : expected;
    if (!step_pace_observe(&e->pace, n_cpu, took, alone, streams ? expected : alone)) return;
    struct step_plan plan;
    char err[256];
    if (make_plan(e, forward_cuda_map(e->gpu), &e->cost, -1, &e->pace, &e->plan, &plan, err)) {
        FLOG_WARN("the host's pace moved to %.2fx, but the step plan could not be made again (%s)",
                  e->pace.pace, err);
        return;
    }
    const int last = plan.n_buckets - 1;
    const size_t cells = (size_t)plan.n_buckets * (size_t)plan.n_layers;
    if (plan.n_buckets == e->plan.n_buckets &&
        !memcmp(plan.where, e->plan.where, sizeof *plan.where * cells)) {
        FLOG_DEBUG("host layers ran at %.2fx their start-up timing with %d on the CPU (median of %d steps): "
                   "the step plan stays (%d tokens %d cpu / %d stream, expected pace %.2fx)",
                   e->pace.pace, n_cpu, STEP_PACE_WINDOW, plan.tokens[0], plan.n_cpu[0], plan.n_stream[0],
                   step_pace_expect(&e->pace, plan.n_cpu[0]));
        step_plan_free(&plan);
        return;
    }
    FLOG_INFO("host layers ran at %.2fx their start-up timing with %d on the CPU (median of %d steps): step "
              "plan made again: %d tokens %d cpu / %d stream (was %d / %d) at %.2fx, predicted %.2f ms; %d "
              "tokens %d / %d (was %d / %d)",
              e->pace.pace, n_cpu, STEP_PACE_WINDOW, plan.tokens[0], plan.n_cpu[0], plan.n_stream[0],
              e->plan.n_cpu[0], e->plan.n_stream[0], step_pace_expect(&e->pace, plan.n_cpu[0]),
              plan.predicted_s[0] * 1e3, plan.tokens[last], plan.n_cpu[last], plan.n_stream[last],
              e->plan.n_cpu[last], e->plan.n_stream[last]);
    step_plan_free(&e->plan);
    e->plan = plan;
    e->pace.revisions++;
}

/* Where each layer runs in this step: the plan's choice for its size, unless the host's cores are needed for
 * the KV pool's extension. The host attends to the extension's positions that the step's decode rows reach
 * (forward_cuda.c, ext_plan) with the cores that compute the plan's CPU layers, and the plan does not count
 * that time: step_plan_ext_shift weighs it, from the extension's K/V bytes those rows read over all
 * layers at the host's rate on the reference layer's weights, and says how many of the CPU layers to stream
 * instead. Measured on the H200 (runtime/NOTES.md, 2026-12-02g): 16 clients at 4 GiB served 123 tok/s with
 * the plan as made, 182 with every host layer streamed; since 2026-12-02i it moves only as many as the time
 * calls for (F16 7B: 11 CPU layers at 16 tokens and 36 ms of the host's attention a step, all of them kept
 * before). */
static const enum placement *step_where(struct engine *e, const struct batch *b)
{
    const enum placement *w = step_plan_where(&e->plan, b->n_tokens);
    const int bk = step_plan_bucket(&e->plan, b->n_tokens);
    const struct kv_cache *kv = &e->kv;
    if (!e->gpu || !e->plan.n_cpu[bk] || !(e->plan.stream_s[bk] > 0) || kv->n_free_ext == kv->n_ext ||
        !forward_cuda_map(e->gpu)->kv_ext_host || !(e->cost.cpu_s[0] > 0))
        return w;
    const int n = b->n_tokens;
    int64_t ext_pos = 0; /* the decode rows' trailing runs of extension blocks, in positions */
    for (int i = 0; i < n; i++) {
        const int s = b->seq[i];
        if ((i > 0 && b->seq[i - 1] == s) || (i + 1 < n && b->seq[i + 1] == s)) continue; /* a chunk's row */
        ext_pos += (int64_t)(kv->n_held[s] - kv_cache_ext_first(kv, s)) * kv->block_size;
    }
    if (!ext_pos) return w;
    const struct llm_hparams *hp = &e->model.hp;
    const enum kv_elem el = e->p.kv_type == KV_Q8_0 ? KV_Q8_0 : KV_F16; /* the GPU's K/V */
    const double bytes =
        2.0 * (double)kv_elem_bytes(el, (size_t)ext_pos * hp->n_layers * hp->n_kv_heads * hp->head_dim);
    const int n_cpu = e->plan.n_cpu[bk];
    const double pace = e->adapt ? step_pace_expect(&e->pace, n_cpu) : 1.0;
    const double rate = (double)e->cost.cpu_ref_bytes / (e->cost.cpu_s[0] * pace);
    /* j of the n_cpu CPU layers stream, spread evenly over them (the k-th CPU layer when k*j/n_cpu steps up),
     * so that the link's copies stay spread between the layers computed meanwhile; a CPU-only layer (its
     * state in host memory) never streams, so only the others count */
    const uint8_t *fixed = forward_cuda_map(e->gpu)->cpu_only;
    int n_free = 0;
    for (int l = 0; l < hp->n_layers; l++) n_free += w[l] == PLACEMENT_CPU && !(fixed && fixed[l]);
    const int j = step_plan_ext_shift(e->plan.predicted_s[bk], e->plan.stream_s[bk], bytes, rate, n_cpu);
    if (!j || !n_free) return w;
    const int js = j < n_free ? j : n_free;
    for (int l = 0, k = 0; l < hp->n_layers; l++) {
        e->streamed[l] = w[l];
        if (w[l] != PLACEMENT_CPU || (fixed && fixed[l])) continue;
        if ((k + 1) * js / n_free != k * js / n_free) e->streamed[l] = PLACEMENT_STREAM;
        k++;
    }
    e->stats.ext_streamed_steps++;
    return e->streamed;
}

/* Once a step's work is complete, or it failed (rc; ran: its pass was started, so the slots may have been
 * written from their first position on): the slots' lengths, the host's pace, the stats. */
/* Recurrent layers after a step that ran: a failed one leaves its slots' state part-way, so they start again;
 * one that rewrote positions before a slot's checkpoint forgets it; a prefill (2 or more rows of a slot)
 * saves a new one where it ends. */
static void state_after_step(struct engine *e, int rc)
{
    for (int s = 0; s < e->p.n_seqs; s++) {
        if (e->new_len[s] < 0) continue;
        if (rc || e->first[s] < seq_state_ckpt_pos(&e->state, s)) seq_state_drop(&e->state, s);
        if (rc)
            e->kv.seq_len[s] = 0;
        else if (e->new_len[s] - e->first[s] >= 2 &&
                 (!e->gpu || forward_cuda_state_get(e->gpu, s, seq_state_slot(&e->state, s)) == FERRY_OK))
            seq_state_save(&e->state, s, e->new_len[s]);
    }
}

static int step_finish(struct engine *e, const struct step *st, int n_tokens, double t0, int ran, int rc)
{
    const int n_seqs = e->p.n_seqs;
    if (ran) {
        if (!rc && e->adapt) follow_pace(e, st->where, n_tokens);
        for (int s = 0; s < n_seqs; s++)
            if (e->new_len[s] >= 0) e->kv.seq_len[s] = rc ? e->first[s] : e->new_len[s];
        if (e->state.n_layers > 0) state_after_step(e, rc);
    }
    /* The window pool's blocks before the window (and the slack) go back. */
    const int drop = e->model.hp.sliding_window - 1 + ENGINE_SWA_SLACK;
    for (int s = 0; s < n_seqs; s++)
        if (e->new_len[s] >= 0) {
            seq_trim(e, s, e->kv.seq_len[s]);
            kv_cache_drop(&e->kv_swa, s, e->kv.seq_len[s] - drop);
        }
    if (rc) return rc;
    e->stats.steps++;
    e->stats.tokens += (uint64_t)n_tokens;
    e->stats.busy_seconds += now_seconds() - t0;
    return FERRY_OK;
}

/* Runs the step; one that draws (draw non-NULL) is left on its way for step_end. */
static int step_begin(struct engine *e, const struct batch *b, float *logits, const struct draw_row *draw)
{
    const double t0 = now_seconds();
    int rc = check_batch(e, b);
    if (rc) return rc;
    if (b->hidden_out && (draw || !e->head->ops->x_host(e->head))) return FERRY_ERR_UNSUPPORTED;
    for (int s = 0; s < e->p.n_seqs && !rc; s++) {
        if (e->new_len[s] < 0) continue;
        /* A rewind to 0 where the window pool dropped blocks starts the slot again (its dropped entries are
         * taken anew), so that it is empty if the step fails. */
        if (e->first[s] == 0 && kv_cache_held_from(&e->kv_swa, s) > 0) seq_trim(e, s, 0);
        rc = kv_cache_reserve(&e->kv, s, e->new_len[s]);
        if (!rc && e->kv_swa.n_layers) rc = kv_cache_reserve(&e->kv_swa, s, e->new_len[s]);
    }
    struct step st = {.b = b, .draw = draw};
    if (rc) return step_finish(e, &st, b->n_tokens, t0, 0, rc);
    st.where = step_where(e, b);
    for (int i = 0; i < b->n_tokens; i++) {
        if (b->pos[i] + 1 > st.max_len) st.max_len = b->pos[i] + 1;
        st.n_out += b->want_logits[i] != 0;
    }
    rc = run_step(e, &st, logits);
    if (rc || !draw) return step_finish(e, &st, b->n_tokens, t0, 1, rc);
    st.b = NULL; /* the caller's; draw_end does not read it */
    st.draw = NULL;
    e->pend = st;
    e->pend_tokens = b->n_tokens;
    e->pend_t0 = t0;
    e->pend_active = 1;
    return FERRY_OK;
}

static int step_end(struct engine *e)
{
    e->pend_active = 0;
    const int rc = e->head->ops->draw_end(e->head, &e->pend);
    return step_finish(e, &e->pend, e->pend_tokens, e->pend_t0, 1, rc);
}

/* ----------------------------------------------------------------------------------------------------------
 */
/* Stats */

void engine_get_stats(const struct engine *e, struct engine_stats *st)
{
    *st = e->stats;
    st->host_pace = e->adapt ? e->pace.pace : 0.0;
    st->plan_revisions = e->pace.revisions;
    st->kv_blocks_used = e->kv.n_blocks - e->kv.n_free;
    if (e->gpu) {
        struct backend_stats gs;
        e->gpu->ops->stats(e->gpu, &gs);
        st->n_resident = gs.n_resident;
        st->n_streamed = gs.n_host;
        st->ring_bytes = gs.ring_bytes;
        st->bytes_streamed = gs.bytes_streamed;
        st->bytes_parked = gs.bytes_parked;
        st->copy_seconds = gs.copy_seconds;
        st->stall_seconds = gs.stall_seconds;
        st->vram_budget = gs.vram_budget;
        st->vram_planned = gs.vram_planned;
        st->vram_used = gs.vram_used;
        st->kv_host_bytes = gs.kv_host_bytes;
        st->kv_ext_host_rows = gs.kv_ext_host_rows;
        st->kv_ext_host_seconds = gs.kv_ext_host_seconds;
        st->h2d_bytes_per_s = gs.h2d_bytes_per_s;
        st->hbm_bytes_per_s = gs.hbm_bytes_per_s;
        st->expert_cache = gs.expert_cache;
        if (e->cpu) {
            struct backend_stats cs;
            e->cpu->ops->stats(e->cpu, &cs);
            st->cpu_layers_run = cs.layers_run;
            st->cpu_layer_seconds = cs.layer_seconds;
        }
    }
}

int engine_step_info(const struct engine *e, int n_tokens, struct engine_step_info *info)
{
    memset(info, 0, sizeof *info);
    if (n_tokens <= 0 || n_tokens > e->p.max_batch_tokens) return FERRY_ERR_INVALID;
    const int b = step_plan_bucket(&e->plan, n_tokens);
    const enum placement *w = step_plan_where(&e->plan, n_tokens);
    info->bucket_tokens = e->plan.tokens[b];
    for (int l = 0; l < e->model.hp.n_layers; l++) {
        info->n_gpu += w[l] == PLACEMENT_GPU;
        info->n_stream += w[l] == PLACEMENT_STREAM || w[l] == PLACEMENT_PARK;
        info->n_park += w[l] == PLACEMENT_PARK;
        info->n_cpu += w[l] == PLACEMENT_CPU;
    }
    info->predicted_s = e->plan.predicted_s[b];
    info->stream_s = e->plan.stream_s[b];
    return FERRY_OK;
}

const char *engine_placement(const struct engine *e)
{
    return e->placement;
}
