/* bench_deltanet — times one gated DeltaNet layer between its products on the device
 * (runtime/forward_cuda_deltanet.h: plan, convolution with its state, L2 norms, the gated delta rule, gated
 * RMSNorm) at a Qwen3-Next-shaped layer (16 key heads, 32 value heads, heads of 128, width 4; other shapes
 * from the command line), the rule token by token and by chunks. Decode steps (one row for each of b
 * sequences) print the time per layer and the rate at which it reads and writes the sequences' rule state
 * (the bytes a decode step must move), next to the device's copy ceiling; prefill steps (n rows of one
 * sequence from position 0) print the time per layer and tokens per second. Each figure is the median of 21
 * CUDA-event-timed runs after 3 warm-up runs; inputs and weights random. Usage: bench_deltanet [nk nv hk hv]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "kernels/core/status.h"
#include "runtime/forward_cuda_deltanet.h"

#include "tests/bench_cuda/bench_check.h"

#define TMAX  2048
#define NSEQ  16
#define RUNS  21
#define WARM  3
#define WIDTH 4

static float frand(void)
{
    static uint64_t s = 0x9E3779B97F4A7C15ull;
    s ^= s << 13, s ^= s >> 7, s ^= s << 17;
    return (float)((double)(s >> 11) * 0x1.0p-53 * 2.0 - 1.0);
}

static float *dev_rand(size_t n, float lo, float hi)
{
    float *h = malloc(n * sizeof(float)), *d = NULL;
    if (!h) exit(1);
    for (size_t i = 0; i < n; i++) h[i] = lo + (frand() + 1.0f) * 0.5f * (hi - lo);
    CK(cudaMalloc((void **)&d, n * sizeof(float)));
    CK(cudaMemcpy(d, h, n * sizeof(float), cudaMemcpyHostToDevice));
    free(h);
    return d;
}

static int cmp_float(const void *a, const void *b)
{
    const float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

struct bench {
    struct cuda_deltanet *dn;
    struct cuda_deltanet_in in;
    float *out;
    int32_t *d_seq, *d_pos;
    cudaEvent_t t0, t1;
};

/* Median milliseconds of one layer on n rows with the given seq and pos. */
static float time_step(struct bench *b, int n, const int32_t *seq, const int32_t *pos)
{
    CK(cudaMemcpy(b->d_seq, seq, (size_t)n * sizeof(int32_t), cudaMemcpyHostToDevice));
    CK(cudaMemcpy(b->d_pos, pos, (size_t)n * sizeof(int32_t), cudaMemcpyHostToDevice));
    float ms[RUNS];
    for (int r = 0; r < WARM + RUNS; r++) {
        CK(cudaEventRecord(b->t0, 0));
        FK(cuda_deltanet_run(b->dn, 0, b->out, &b->in, n, b->d_seq, b->d_pos, seq, 0));
        CK(cudaEventRecord(b->t1, 0));
        CK(cudaEventSynchronize(b->t1));
        if (r >= WARM) CK(cudaEventElapsedTime(&ms[r - WARM], b->t0, b->t1));
    }
    qsort(ms, RUNS, sizeof ms[0], cmp_float);
    return ms[RUNS / 2];
}

int main(int argc, char **argv)
{
    int nk = 16, nv = 32, hk = 128, hv = 128;
    if (argc == 5) nk = atoi(argv[1]), nv = atoi(argv[2]), hk = atoi(argv[3]), hv = atoi(argv[4]);
    int dev_count = 0;
    if (cudaGetDeviceCount(&dev_count) != cudaSuccess || dev_count <= 0) {
        fprintf(stderr, "no CUDA device\n");
        return 1;
    }
    const int C = 2 * nk * hk + nv * hv, I = nv * hv, P = C + I + 2 * nv;
    /* The copy ceiling: a 256 MiB device-to-device copy reads and writes each byte once. */
    const size_t cb = (size_t)256 << 20;
    void *ca, *cbuf;
    CK(cudaMalloc(&ca, cb));
    CK(cudaMalloc(&cbuf, cb));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    float cms = 0;
    for (int r = 0; r < 4; r++) {
        CK(cudaEventRecord(e0, 0));
        CK(cudaMemcpyAsync(cbuf, ca, cb, cudaMemcpyDeviceToDevice, 0));
        CK(cudaEventRecord(e1, 0));
        CK(cudaEventSynchronize(e1));
        CK(cudaEventElapsedTime(&cms, e0, e1));
    }
    const double ceiling = 2.0 * cb / (cms * 1e-3) / 1e9;
    cudaFree(ca);
    cudaFree(cbuf);

    struct model_layer L[2];
    memset(L, 0, sizeof L);
    float *conv = malloc((size_t)C * WIDTH * sizeof(float)), *dt = malloc((size_t)nv * sizeof(float)),
          *a = malloc((size_t)nv * sizeof(float)), *norm = malloc((size_t)hv * sizeof(float));
    if (!conv || !dt || !a || !norm) return 1;
    for (int i = 0; i < C * WIDTH; i++) conv[i] = 0.5f * frand();
    for (int i = 0; i < nv; i++) dt[i] = frand(), a[i] = -0.5f - 0.5f * (frand() + 1.0f);
    for (int i = 0; i < hv; i++) norm[i] = 1.0f + 0.2f * frand();
    L[0] = (struct model_layer){.ssm_conv = conv, .ssm_dt = dt, .ssm_a = a, .ssm_norm = norm};
    struct model m = {.layers = L};
    m.hp.n_layers = 2, m.hp.full_attn_interval = 2, m.hp.norm_eps = 1e-6f, m.hp.ssm_conv_kernel = WIDTH;
    m.hp.ssm_head_k = hk, m.hp.ssm_n_k_heads = nk, m.hp.ssm_n_v_heads = nv, m.hp.ssm_inner = I;

    float *proj = dev_rand((size_t)TMAX * P, -2.0f, 2.0f);
    struct bench b = {.in = {.qkv = proj,
                             .z = proj + C,
                             .b = proj + C + I,
                             .a = proj + C + I + nv,
                             .ld_qkv = P,
                             .ld_z = P,
                             .ld_b = P,
                             .ld_a = P}};
    CK(cudaMalloc((void **)&b.out, (size_t)TMAX * I * sizeof(float)));
    CK(cudaMalloc((void **)&b.d_seq, TMAX * sizeof(int32_t)));
    CK(cudaMalloc((void **)&b.d_pos, TMAX * sizeof(int32_t)));
    CK(cudaEventCreate(&b.t0));
    CK(cudaEventCreate(&b.t1));
    const size_t bytes = cuda_deltanet_bytes(&m, TMAX, NSEQ);
    void *mem;
    CK(cudaMalloc(&mem, bytes));
    static int32_t seq[TMAX], pos[TMAX];
    printf("gated DeltaNet layer between its products: %d key heads, %d value heads, head_k %d, head_v %d, "
           "width %d; copy ceiling %.0f GB/s\n",
           nk, nv, hk, hv, WIDTH, ceiling);
    static const char *const rules[] = {"token", "chunk"};
    for (int k = 0; k < 2; k++) {
        char err[256];
        setenv("FERRY_DN_RULE", rules[k], 1);
        FK(cuda_deltanet_init(&b.dn, &m, TMAX, NSEQ, mem, err));
        static const int decode[] = {1, 4, 16};
        for (int d = 0; d < 3; d++) {
            const int n = decode[d];
            for (int i = 0; i < n; i++) seq[i] = i, pos[i] = 100;
            const float ms = time_step(&b, n, seq, pos);
            const double state = 2.0 * n * (double)nv * hk * hv * sizeof(float);
            printf("rule %-5s decode b=%-4d %8.3f ms/layer  state %6.0f GB/s\n", rules[k], n, ms,
                   state / (ms * 1e-3) / 1e9);
        }
        static const int prefill[] = {64, 512, 2048};
        for (int d = 0; d < 3; d++) {
            const int n = prefill[d];
            for (int i = 0; i < n; i++) seq[i] = 0, pos[i] = i;
            const float ms = time_step(&b, n, seq, pos);
            printf("rule %-5s prefill n=%-4d %8.3f ms/layer  %8.0f tokens/s\n", rules[k], n, ms,
                   n / (ms * 1e-3));
        }
        cuda_deltanet_free(b.dn);
    }
    cudaFree(mem);
    cudaFree(proj);
    cudaFree(b.out);
    cudaFree(b.d_seq);
    cudaFree(b.d_pos);
    free(conv);
    free(dt);
    free(a);
    free(norm);
    return 0;
}
