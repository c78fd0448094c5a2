/* bench_moe — times one expert layer on the device (runtime/forward_cuda_moe.h: router, top-k, experts,
 * weighted sum) at Qwen3-30B-A3B's shape (dim 2048, 128 experts of ffn 768, top 8) and prints, per step size,
 * the time per layer and the rate at which it reads the experts the step chose (each chosen expert's gate, up
 * and down once), next to the device's copy ceiling; with --host, the same layer with its experts in host
 * memory (the host's cores compute them, or steps of enough rows stream the chosen experts: the choice is
 * printed at start; FERRY_MOE_STREAM_ROWS=0 or =1 forces either). Weights: one expert quantized from random
 * values (Q4_K gate/up and Q6_K down, as Q4_K_M stores them; --q8: all Q8_0), copied to every expert; routing
 * from a random router, so the experts a step reads are those of random tokens. Each figure is the median of
 * 21 CUDA-event-timed runs after 3 warm-up runs; for resident experts also "graph us": the layer captured in
 * a CUDA graph (as the engine's decode steps run it) and replayed 20 times back to back, the time per replay,
 * which leaves out the host's launch cost ("grouped*": the grouped launches, CUDA_MOE_GROUPED_MAX_ROWS rows
 * at a time). Then, for resident experts, the layer at 64-512 rows with each of the grouped launches' kernels
 * (kern_cuda_moe_grouped_set_kind: the warp kernel and the tiled one). Usage: bench_moe [--q8] [--host]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "kernels/core/status.h"
#include "kernels/cpu/moe.h"
#include "kernels/cuda/matmul.h"
#include "kernels/cuda/moe.h"
#include "kernels/cuda/ops.h"
#include "quant/dtype.h"
#include "runtime/forward_cuda_moe.h"

#include "tests/bench_cuda/bench_check.h"

#define DIM  2048
#define FFN  768
#define NE   128
#define TOPK 8
#define TMAX 512

static float frand(void)
{
    static uint64_t s = 0x9E3779B97F4A7C15ull;
    s ^= s << 13, s ^= s >> 7, s ^= s << 17;
    return (float)((double)(s >> 11) * 0x1.0p-53 * 2.0 - 1.0);
}

/* n_expert copies of one random (rows, cols) matrix in type t. */
static void *stacked(enum dtype t, int rows, int cols)
{
    const size_t rb = dtype_row_size(t, cols), one = rb * (size_t)rows;
    char *w = malloc(one * NE);
    float *v = malloc((size_t)cols * sizeof(float));
    if (!w || !v) exit(1);
    for (int r = 0; r < rows; r++) {
        for (int c = 0; c < cols; c++) v[c] = 0.05f * frand();
        if (!dtype_from_f32(t, v, w + rb * r, cols)) exit(1);
    }
    for (int e = 1; e < NE; e++) memcpy(w + one * e, w, one);
    free(v);
    return w;
}

static int cmp_f(const void *a, const void *b)
{
    const float x = *(const float *)a, y = *(const float *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv)
{
    int q8 = 0, host = 0;
    for (int i = 1; i < argc; i++) q8 |= !strcmp(argv[i], "--q8"), host |= !strcmp(argv[i], "--host");
    if (kern_cuda_device_count() <= 0) {
        fprintf(stderr, "bench_moe: no CUDA device\n");
        return 0;
    }
    const enum dtype gt = q8 ? DTYPE_Q8_0 : DTYPE_Q4_K, dt = q8 ? DTYPE_Q8_0 : DTYPE_Q6_K;
    float *router = malloc((size_t)NE * DIM * sizeof(float));
    for (size_t i = 0; i < (size_t)NE * DIM; i++) router[i] = frand();
    void *gate = stacked(gt, FFN, DIM), *up = stacked(gt, FFN, DIM), *down = stacked(dt, DIM, FFN);
    struct model_layer L = {
        .router = {.data = router, .type = DTYPE_F32, .rows = NE, .cols = DIM},
        .exp_gate = {.data = gate, .type = gt, .rows = (int64_t)NE * FFN, .cols = DIM},
        .exp_up = {.data = up, .type = gt, .rows = (int64_t)NE * FFN, .cols = DIM},
        .exp_down = {.data = down, .type = dt, .rows = (int64_t)NE * DIM, .cols = FFN},
    };
    struct model m = {.layers = &L};
    m.hp.n_layers = 1, m.hp.dim = DIM, m.hp.n_expert = NE, m.hp.n_expert_used = TOPK;
    m.hp.expert_ffn_dim = FFN, m.hp.expert_norm_topk = 1;
    size_t max_x, w16;
    cuda_moe_ctx_needs(&m, TMAX, &max_x, &w16);
    struct kern_cuda_ctx *ctx;
    FK(kern_cuda_ctx_init(&ctx, max_x, kern_cuda_w16_bytes(TMAX, w16)));
    void *fixed, *ex = NULL, *stage = NULL;
    CK(cudaMalloc(&fixed, cuda_moe_fixed_bytes(&m, TMAX)));
    if (!host) CK(cudaMalloc(&ex, cuda_moe_expert_bytes(&m, 0)));
    if (host && cuda_moe_stage_bytes(&m)) CK(cudaMalloc(&stage, cuda_moe_stage_bytes(&m)));
    double h2d = 0;
    { /* the link's rate, pinned host to device, 256 MiB */
        void *hp, *dp;
        cudaEvent_t t0, t1;
        float lms;
        const size_t lb = (size_t)256 << 20;
        CK(cudaHostAlloc(&hp, lb, cudaHostAllocDefault));
        CK(cudaMalloc(&dp, lb));
        CK(cudaEventCreate(&t0));
        CK(cudaEventCreate(&t1));
        CK(cudaMemcpy(dp, hp, lb, cudaMemcpyHostToDevice));
        CK(cudaEventRecord(t0, 0));
        CK(cudaMemcpyAsync(dp, hp, lb, cudaMemcpyHostToDevice, 0));
        CK(cudaEventRecord(t1, 0));
        CK(cudaEventSynchronize(t1));
        CK(cudaEventElapsedTime(&lms, t0, t1));
        h2d = lb / (lms * 1e-3);
        cudaFreeHost(hp), cudaFree(dp);
    }
    struct cuda_moe *mo;
    char err[256] = "";
    const struct cuda_moe_params mp = {
        .T = TMAX, .fixed = fixed, .experts = &ex, .stage = stage, .h2d_bytes_per_s = h2d};
    if (cuda_moe_init(&mo, &m, &mp, err)) {
        fprintf(stderr, "bench_moe: %s\n", err);
        return 1;
    }
    float *hx = malloc((size_t)TMAX * DIM * sizeof(float));
    for (size_t i = 0; i < (size_t)TMAX * DIM; i++) hx[i] = frand();
    int32_t iota[TMAX];
    for (int i = 0; i < TMAX; i++) iota[i] = i;
    float *x, *y, *dr;
    int32_t *di;
    CK(cudaMalloc((void **)&dr, (size_t)NE * DIM * sizeof(float)));
    CK(cudaMemcpy(dr, router, (size_t)NE * DIM * sizeof(float), cudaMemcpyHostToDevice));
    CK(cudaMalloc((void **)&x, (size_t)TMAX * DIM * sizeof(float)));
    CK(cudaMalloc((void **)&y, (size_t)TMAX * DIM * sizeof(float)));
    CK(cudaMalloc((void **)&di, sizeof iota));
    CK(cudaMemcpy(x, hx, (size_t)TMAX * DIM * sizeof(float), cudaMemcpyHostToDevice));
    CK(cudaMemcpy(di, iota, sizeof iota, cudaMemcpyHostToDevice));
    /* The copy ceiling: 1 GiB device to device, bytes read plus written. */
    void *a, *b;
    const size_t cb = (size_t)1 << 30;
    CK(cudaMalloc(&a, cb));
    CK(cudaMalloc(&b, cb));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    float ms;
    CK(cudaMemcpy(b, a, cb, cudaMemcpyDeviceToDevice));
    CK(cudaEventRecord(e0, 0));
    CK(cudaMemcpy(b, a, cb, cudaMemcpyDeviceToDevice));
    CK(cudaEventRecord(e1, 0));
    CK(cudaEventSynchronize(e1));
    CK(cudaEventElapsedTime(&ms, e0, e1));
    const double ceil = 2.0 * cb / (ms * 1e-3) / 1e9;
    cudaFree(a), cudaFree(b);
    const double expert_bytes = (double)cuda_moe_expert_bytes(&m, 0) / NE;
    printf("expert layer, dim %d, %d experts of ffn %d, top %d, %s/%s experts %s; copy ceiling %.0f GB/s\n",
           DIM, NE, FFN, TOPK, dtype_name(gt), dtype_name(dt), host ? "in host memory" : "resident", ceil);
    printf("%6s %10s %10s %12s %8s %10s %12s\n", "rows", "us/layer", "experts", "GB/s chosen", "where",
           "graph us", "graph GB/s");
    const int ns[] = {1, 2, 4, 8, 16, 64, 128, 256, 512};
    float *logits = malloc((size_t)TMAX * NE * sizeof(float)),
          *w = malloc((size_t)TMAX * TOPK * sizeof(float));
    int32_t *ids = malloc((size_t)TMAX * TOPK * sizeof(int32_t));
    for (size_t i = 0; i < sizeof ns / sizeof ns[0]; i++) {
        const int n = ns[i];
        /* The experts this step reads: the router's choice, on the host from the same product. */
        FK(kern_cuda_matmul(ctx, y, NE, x, dr, DTYPE_F32, NULL, n, NE, DIM, 0));
        CK(cudaMemcpy(logits, y, (size_t)n * NE * sizeof(float), cudaMemcpyDeviceToHost));
        FK(kern_cpu_moe_route(logits, n, NE, TOPK, 1, ids, w));
        int used[NE] = {0}, distinct = 0;
        for (int p = 0; p < n * TOPK; p++) distinct += !used[ids[p]]++;
        for (int r = 0; r < 3; r++) FK(cuda_moe_run(mo, 0, y, x, n, ctx, di, 0));
        float t[21];
        for (int r = 0; r < 21; r++) {
            CK(cudaEventRecord(e0, 0));
            FK(cuda_moe_run(mo, 0, y, x, n, ctx, di, 0));
            CK(cudaEventRecord(e1, 0));
            CK(cudaEventSynchronize(e1));
            CK(cudaEventElapsedTime(&t[r], e0, e1));
        }
        FK(cuda_moe_status(mo));
        qsort(t, 21, sizeof t[0], cmp_f);
        const double s = t[10] * 1e-3;
        double gs = 0;
        if (!host && n <= CUDA_MOE_GROUPED_MAX_ROWS) { /* a captured layer (no host round trip), replayed */
            cudaStream_t cs;
            cudaGraph_t g;
            cudaGraphExec_t ge;
            CK(cudaStreamCreateWithFlags(&cs, cudaStreamNonBlocking));
            CK(cudaStreamBeginCapture(cs, cudaStreamCaptureModeThreadLocal));
            FK(cuda_moe_run(mo, 0, y, x, n, ctx, di, cs));
            CK(cudaStreamEndCapture(cs, &g));
            CK(cudaGraphInstantiate(&ge, g, 0));
            CK(cudaGraphLaunch(ge, cs));
            CK(cudaEventRecord(e0, cs));
            for (int r = 0; r < 20; r++) CK(cudaGraphLaunch(ge, cs));
            CK(cudaEventRecord(e1, cs));
            CK(cudaEventSynchronize(e1));
            CK(cudaEventElapsedTime(&ms, e0, e1));
            gs = ms * 1e-3 / 20;
            cudaGraphExecDestroy(ge), cudaGraphDestroy(g), cudaStreamDestroy(cs);
        }
        printf("%6d %10.1f %10d %12.0f %8s %10.1f %12.0f\n", n, s * 1e6, distinct,
               distinct * expert_bytes / s / 1e9,
               !host && n > CUDA_MOE_GROUPED_MAX_ROWS ? "grouped*"
               : !host && n > CUDA_MOE_GEMV_MAX_ROWS  ? "grouped"
               : !host                                ? "device"
               : n >= cuda_moe_stream_min_rows(mo)    ? "stream"
                                                      : "host",
               gs * 1e6, gs > 0 ? distinct * expert_bytes / gs / 1e9 : 0.0);
    }
    if (!host) { /* the grouped launches' two kernels (kern_cuda_moe_grouped_set_kind), same layer */
        printf(
            "\ngrouped kernels, us/layer (median of 21): warp = 16 rows x 8 pairs per warp, tile = %d rows x "
            "passes of %d pairs per block, staged\n",
            16 * 8, 32);
        printf("%6s %10s %10s %8s\n", "rows", "warp", "tile", "speedup");
        const int gs[] = {64, 128, 256, 512};
        for (size_t i = 0; i < sizeof gs / sizeof gs[0]; i++) {
            double us[2];
            const int kinds[2] = {KERN_CUDA_MOE_GROUPED_WARP, KERN_CUDA_MOE_GROUPED_TILE};
            for (int v = 0; v < 2; v++) {
                const int prev = kern_cuda_moe_grouped_set_kind(kinds[v]);
                for (int r = 0; r < 3; r++) FK(cuda_moe_run(mo, 0, y, x, gs[i], ctx, di, 0));
                float t[21];
                for (int r = 0; r < 21; r++) {
                    CK(cudaEventRecord(e0, 0));
                    FK(cuda_moe_run(mo, 0, y, x, gs[i], ctx, di, 0));
                    CK(cudaEventRecord(e1, 0));
                    CK(cudaEventSynchronize(e1));
                    CK(cudaEventElapsedTime(&t[r], e0, e1));
                }
                FK(cuda_moe_status(mo));
                kern_cuda_moe_grouped_set_kind(prev);
                qsort(t, 21, sizeof t[0], cmp_f);
                us[v] = t[10] * 1e3;
            }
            printf("%6d %10.1f %10.1f %7.2fx\n", gs[i], us[0], us[1], us[0] / us[1]);
        }
    }
    cuda_moe_free(mo);
    kern_cuda_ctx_free(ctx);
    return 0;
}
