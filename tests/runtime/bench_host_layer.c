/* bench_host_layer — how fast the host's cores compute one transformer layer, as host layers run (not a
 * test).
 *
 * One layer of Llama-2-7B's shape (4096 / 11008, 32 heads) in F16, BF16, Q8_0 and the Q4_K_M mix (the block
 * types with x in f32 and in int8, `kern_cpu_matmul_set_act`), computed by the CPU backend
 * (runtime/forward_cpu.c: the layer program without its KV ops, what the step planner times at start-up) with
 * pinned threads, at 1, 2, 4, 16 and 64 tokens. Prints ms per layer, the weight read rate (GB/s) and GFLOP/s,
 * next to the rate at which the same pool streams a buffer of the same size (the host's memory ceiling). The
 * layer is 405 MB in f16, far beyond any cache, so every call reads it from memory.
 * Usage: bench_host_layer [threads] [dim ffn heads]   (defaults: all cores; 4096 11008 32)
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernels/core/status.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/threadpool.h"
#include "runtime/forward_cpu.h"
#include "runtime/kv_cache.h"
#include "runtime/layer.h"
#include "quant/mix.h"
#include "runtime/model.h"

typedef float v8 __attribute__((vector_size(32)));

struct read_job {
    const float *p;
    size_t per; /* floats per task */
    float sink[1024];
};

static void read_task(void *ctx, int t)
{
    struct read_job *j = ctx;
    const v8 *a = (const v8 *)(j->p + j->per * (size_t)t);
    v8 s0 = {0}, s1 = {0}, s2 = {0}, s3 = {0};
    for (size_t i = 0; i + 4 <= j->per / 8; i += 4)
        s0 += a[i], s1 += a[i + 1], s2 += a[i + 2], s3 += a[i + 3];
    const v8 s = s0 + s1 + s2 + s3;
    j->sink[t] = s[0] + s[3] + s[7];
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

int main(int argc, char **argv)
{
    const int threads = argc > 1 ? atoi(argv[1]) : 0;
    struct llm_hparams hp = {.n_vocab = 256,
                             .dim = 4096,
                             .n_layers = 1,
                             .n_heads = 32,
                             .n_kv_heads = 32,
                             .head_dim = 128,
                             .ffn_dim = 11008,
                             .ctx_train = 256,
                             .norm_eps = 1e-5f,
                             .rope_theta = 10000.0f,
                             .rope_dim = 128,
                             .rope_style = ROPE_STYLE_HALF};
    if (argc > 4) {
        hp.dim = atoi(argv[2]), hp.ffn_dim = atoi(argv[3]), hp.n_heads = hp.n_kv_heads = atoi(argv[4]);
        hp.head_dim = hp.rope_dim = hp.dim / hp.n_heads;
    }
    snprintf(hp.arch, sizeof hp.arch, "llama");
    static const struct {
        const char *name;
        enum dtype t;          /* stored type before quantizing */
        int ftype;             /* llama.cpp mix applied at load, or -1 */
        enum kern_cpu_act act; /* x in f32 or in int8 (block types only) */
    } cases[] = {{"F16", DTYPE_F16, -1, KERN_CPU_ACT_F32},
                 {"BF16", DTYPE_BF16, -1, KERN_CPU_ACT_F32},
                 {"Q8_0/f32", DTYPE_F16, QUANT_FTYPE_Q8_0, KERN_CPU_ACT_F32},
                 {"Q8_0/i8", DTYPE_F16, QUANT_FTYPE_Q8_0, KERN_CPU_ACT_INT8},
                 {"Q4KM/f32", DTYPE_F16, QUANT_FTYPE_Q4_K_M, KERN_CPU_ACT_F32},
                 {"Q4KM/i8", DTYPE_F16, QUANT_FTYPE_Q4_K_M, KERN_CPU_ACT_INT8}};
    const int n_cases = (int)(sizeof cases / sizeof cases[0]);
    for (int ti = 0; ti < n_cases; ti++) {
        struct model m;
        char err[256] = "";
        if (model_init_synthetic(&m, &hp, cases[ti].t, 3, 0, err) ||
            (cases[ti].ftype >= 0 && model_quantize(&m, cases[ti].ftype, 0, err))) {
            fprintf(stderr, "bench_host_layer: %s\n", err);
            return 1;
        }
        struct kv_cache kv;
        if (kv_cache_init(&kv, 1, hp.n_kv_heads, hp.head_dim, 1, 256, 256, 16, KV_F32)) return 1;
        struct forward_cpu_params p = forward_cpu_default_params();
        p.max_tokens = 64;
        p.n_threads = threads;
        p.pin_threads = 1;
        p.kv = &kv;
        struct backend *be = NULL;
        if (forward_cpu_init(&be, &m, &p)) return 1;
        kern_cpu_matmul_set_act(cases[ti].act);
        const double bytes = (double)layer_model_bytes(&m.layers[0]),
                     flop = 2.0 * (double)layer_params(&m.layers[0]);
        if (ti == 0) {
            /* The memory ceiling: the same pool streaming a buffer the size of the layer. */
            struct tpool *tp;
            tpool_init_pinned(&tp, threads);
            const int parts = tpool_size(tp);
            const size_t per = ((size_t)(bytes / 4) / (size_t)parts) & ~(size_t)63;
            float *buf = aligned_alloc(64, per * (size_t)parts * 4);
            memset(buf, 1, per * (size_t)parts * 4);
            struct read_job j = {.p = buf, .per = per};
            double best = 1e30;
            for (int r = 0; r < 5; r++) {
                const double t0 = now_s();
                tpool_run(tp, read_task, &j, parts);
                const double t = now_s() - t0;
                if (t < best) best = t;
            }
            printf("host: %d pinned threads, %d NUMA node(s); streaming read of %.0f MB: %.1f GB/s\n", parts,
                   tpool_numa_nodes(), bytes / 1e6, per * (double)parts * 4 / best / 1e9);
            printf("%-9s %6s %10s %9s %9s\n", "type/x", "tokens", "ms/layer", "GB/s", "GFLOP/s");
            free(buf);
            tpool_free(tp);
        }
        const int ms[] = {1, 2, 4, 16, 64};
        for (int i = 0; i < 5; i++) {
            double t;
            const int l0 = 0;
            if (forward_cpu_time_layers(be, &l0, 1, ms[i], ms[i] <= 4 ? 7 : 3, &t)) return 1;
            printf("%-9s %6d %10.2f %9.1f %9.1f\n", cases[ti].name, ms[i], t * 1e3, bytes / t / 1e9,
                   flop * ms[i] / t / 1e9);
            fflush(stdout);
        }
        be->ops->free(be);
        kv_cache_free(&kv);
        model_free(&m);
    }
    return 0;
}
