/* bench_cuda — times the CUDA kernels at Llama-2-7B shapes on one GPU and prints a table.
 *
 * Ceiling: a device-to-device copy of 1 GiB, counting bytes read plus written. Each figure is the median of
 * 31 samples; a sample is one CUDA-event-timed batch of launches after 5 warm-up launches, divided by the
 * batch size (so launch gaps are included, as they are in a forward pass without graphs). Weights rotate
 * among copies spanning >= 512 MiB, so L2 (60 MB on an H200) never holds them. Data are random (never zeros).
 * Usage: bench_cuda [--quick] [--q8] [--quant] [--stream] [--types [-T Q4_0,Q8_0]]
 *   --q8:    only the copy ceiling and kern_cuda_gemv_q8 (the f16-tensor-core Q8_0 GEMV), every
 * configuration;
 *   --quant: only the copy ceiling and the GGUF block types through kern_cuda_matmul
 * (kernels/cuda/matmul_q.h) at the Llama-2-7B layer shapes: every variant (kern_cuda_qmm_set_variant) at
 * m = 1..512, the best per type and m with the table lines for matmul.cu's automatic choice, then the layer
 * table of this build's automatic choice at m = 1, 16, 64, 512 (f16 at the same shapes for comparison) and
 * the whole-model products at m = 64; the last lines are the compact summary;
 *   --stream: only the copy ceiling and the decode products (m = 1, 2, 4, 8) of Q4_K, Q6_K, Q8_0, Q5_K and
 * Q4_0 at the Llama-2-7B layer shapes: the stream GEMV (KERN_QV_STREAM, its rows per task automatic and
 * forced to 1, 2, 4) beside the dp4a GEMV, the int8 MMA and (Q8_0) gemv_q8, per product and per layer as a
 * percentage of the measured copy rate (under a minute);
 *   --types: only the copy ceiling and one product per weight type beside llama.cpp's test-backend-ops perf
 * shape (bench_types; tests/bench/compare_types.sh --cuda).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "kernels/core/fp16.h"
#include "kernels/core/log.h"
#include "kernels/core/status.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/gemv_q8.h"
#include "kernels/cuda/matmul.h"
#include "kernels/cuda/matmul_q.h"
#include "kernels/cuda/ops.h"

#include "tests/bench_cuda/bench_check.h"

static cudaStream_t st;
static int samples = 31;
static int use_graph = 0; /* time_ms replays a captured batch instead of launching it (no launch gaps) */

typedef void (*bench_fn)(void *arg, int iter);

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Median milliseconds per call of fn over samples of `batch` calls each. */
static double time_ms(bench_fn fn, void *arg, int batch)
{
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    int it = 0;
    for (int i = 0; i < 5; i++) fn(arg, it++);
    CK(cudaStreamSynchronize(st));
    cudaGraphExec_t ge = NULL;
    if (use_graph) { /* the batch captured once (weights still rotate inside it), replayed per sample */
        cudaGraph_t gr;
        CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
        for (int i = 0; i < batch; i++) fn(arg, it++);
        CK(cudaStreamEndCapture(st, &gr));
        CK(cudaGraphInstantiate(&ge, gr, 0));
        CK(cudaGraphDestroy(gr));
        CK(cudaGraphLaunch(ge, st));
        CK(cudaStreamSynchronize(st));
    }
    double *t = malloc(samples * sizeof(double));
    for (int s = 0; s < samples; s++) {
        CK(cudaEventRecord(a, st));
        if (ge)
            CK(cudaGraphLaunch(ge, st));
        else
            for (int i = 0; i < batch; i++) fn(arg, it++);
        CK(cudaEventRecord(b, st));
        CK(cudaEventSynchronize(b));
        float ms;
        CK(cudaEventElapsedTime(&ms, a, b));
        t[s] = ms / batch;
    }
    if (ge) CK(cudaGraphExecDestroy(ge));
    qsort(t, samples, sizeof(double), cmp_d);
    double med = t[samples / 2];
    free(t);
    CK(cudaEventDestroy(a));
    CK(cudaEventDestroy(b));
    return med;
}

/* Fills a device buffer with random f16 values in [-0.5, 0.5] (a 16 MiB random pattern, repeated). */
static void fill_f16(void *d, size_t bytes)
{
    const size_t pat = 16u << 20;
    uint16_t *h = malloc(pat);
    for (size_t i = 0; i < pat / 2; i++) h[i] = f32_to_f16((float)((double)rand() / RAND_MAX - 0.5));
    for (size_t off = 0; off < bytes; off += pat)
        CK(cudaMemcpy((char *)d + off, h, bytes - off < pat ? bytes - off : pat, cudaMemcpyHostToDevice));
    free(h);
}
static void fill_f32(float *d, size_t n)
{
    float *h = malloc(n * 4);
    for (size_t i = 0; i < n; i++) h[i] = (float)((double)rand() / RAND_MAX * 2 - 1);
    CK(cudaMemcpy(d, h, n * 4, cudaMemcpyHostToDevice));
    free(h);
}

/* ---- copy ceiling ---- */
struct copy_arg {
    void *a, *b;
    size_t bytes;
};
static void copy_fn(void *p, int i)
{
    struct copy_arg *c = p;
    CK(cudaMemcpyAsync(i % 2 ? c->a : c->b, i % 2 ? c->b : c->a, c->bytes, cudaMemcpyDeviceToDevice, st));
}

/* ---- matmul ---- */
enum { MM_GEMV, MM_GEMM, MM_AUTO, MM_Q8OLD };
struct mm_arg {
    struct kern_cuda_ctx *ctx;
    float *y, *x;
    char *w;
    size_t wbytes;
    int copies, m, n, k, mode; /* mode: which entry (MM_*) */
    enum dtype wt;
};
static void mm_fn(void *p, int i)
{
    struct mm_arg *a = p;
    const void *w = a->w + (size_t)(i % a->copies) * a->wbytes;
    if (a->mode == MM_GEMM)
        FK(kern_cuda_matmul_gemm(a->ctx, a->y, a->n, a->x, w, a->wt, NULL, a->m, a->n, a->k, st));
    else if (a->mode == MM_AUTO)
        FK(kern_cuda_matmul(a->ctx, a->y, a->n, a->x, w, a->wt, NULL, a->m, a->n, a->k, st));
    else if (a->mode == MM_Q8OLD)
        FK(kern_cuda_gemv_q8(a->y, a->n, a->x, w, NULL, a->m, a->n, a->k, st));
    else
        FK(kern_cuda_matmul_gemv(a->ctx, a->y, a->n, a->x, w, a->wt, NULL, a->m, a->n, a->k, st));
}

/* ---- attention ---- */
struct att_arg {
    struct kern_cuda_kv_layer kv;
    float *out, *q;
    int32_t *seq, *pos;
    int32_t *tables; /* (copies, n_blocks / copies) block tables, copy c naming only the blocks of copy c */
    int copies, m, n_heads, max_len;
    void *ws;
    size_t ws_bytes;
    enum kern_cuda_attn_mode mode;
};
static void att_fn(void *p, int i)
{
    struct att_arg *a = p;
    struct kern_cuda_kv_layer kv = a->kv;
    kv.block_table = a->tables + (size_t)(i % a->copies) * (a->kv.n_blocks / a->copies);
    FK(kern_cuda_attention(a->out, a->q, &kv, a->seq, a->pos, a->m, a->n_heads, 0.0883883f, a->max_len,
                           a->mode, a->ws, a->ws_bytes, st));
}

/* ---- rmsnorm ---- */
struct norm_arg {
    float *y, *x, *w, *r;
    int m, d, fused;
};
static void norm_fn(void *p, int i)
{
    struct norm_arg *a = p;
    if (a->fused)
        FK(kern_cuda_add_rmsnorm(a->r, a->x, a->y, a->w, a->m, a->d, 1e-5f, st));
    else
        FK(kern_cuda_rmsnorm(a->y, a->x, a->w, a->m, a->d, 1e-5f, st));
}

/* Llama-2-7B's four matrix shapes and the decode batch sizes the GEMV benches sweep. */
static const int shapes[4][2] = {{4096, 4096}, {11008, 4096}, {4096, 11008}, {32000, 4096}};
enum { NMS = 5 };
static const int ms_[NMS] = {1, 2, 4, 8, 16};

/* Times proto (its weight type and path) at every shape and m, launched and graph-timed, one row each, then
 * one of each shape per m. Weights rotate through the pool. Returns the bytes of one of each shape. */
static double sweep_shapes(const char *label, struct mm_arg proto, size_t pool_bytes, double ceil_gbs)
{
    double tot[NMS] = {0}, gtot[NMS] = {0}, bytes_total = 0;
    for (int si = 0; si < 4; si++) {
        struct mm_arg a = proto;
        a.n = shapes[si][0];
        a.k = shapes[si][1];
        a.wbytes = dtype_row_size(a.wt, a.k) * a.n;
        a.copies = (int)(pool_bytes / a.wbytes);
        if (a.copies < 1) a.copies = 1;
        bytes_total += a.wbytes;
        for (int mi = 0; mi < NMS; mi++) {
            a.m = ms_[mi];
            const double ms = time_ms(mm_fn, &a, 20);
            use_graph = 1;
            const double gms = time_ms(mm_fn, &a, 20);
            use_graph = 0;
            tot[mi] += ms;
            gtot[mi] += gms;
            char name[64];
            snprintf(name, sizeof name, "%s %5dx%-5d m=%d", label, a.n, a.k, a.m);
            printf("%-34s %10.4f ms %9.1f GB/s  %5.1f%% of copy | graph %7.4f ms %5.1f%%\n", name, ms,
                   a.wbytes / ms / 1e6, 100.0 * a.wbytes / ms / 1e6 / ceil_gbs, gms,
                   100.0 * a.wbytes / gms / 1e6 / ceil_gbs);
        }
    }
    for (int mi = 0; mi < NMS; mi++) {
        char name[64];
        snprintf(name, sizeof name, "%s all shapes m=%d", label, ms_[mi]);
        printf("%-34s %10.4f ms %9.1f GB/s  %5.1f%% of copy | graph %7.4f ms %5.1f%% (one of each shape)\n",
               name, tot[mi], bytes_total / tot[mi] / 1e6, 100.0 * bytes_total / tot[mi] / 1e6 / ceil_gbs,
               gtot[mi], 100.0 * bytes_total / gtot[mi] / 1e6 / ceil_gbs);
    }
    return bytes_total;
}

/* Q8_0 GEMV (kern_cuda_gemv_q8) at the four Llama-2-7B shapes, launched and graph-timed, m = 1..16; bytes are
 * the Q8_0 weight bytes n*k*34/32. With sweep: every forced configuration (graph-timed, m = 1, 4 and 16). */
static void bench_q8(char *pool, size_t pool_bytes, float *x, float *y, double ceil_gbs, int sweep)
{
    struct mm_arg a;
    memset(&a, 0, sizeof a);
    a.y = y;
    a.x = x;
    a.w = pool;
    a.wt = DTYPE_Q8_0;
    a.mode = MM_Q8OLD;
    sweep_shapes("gemv_q8", a, pool_bytes, ceil_gbs);
    if (!sweep) return;
    printf("gemv_q8 configurations, graph-timed, %% of copy (m=1 / m=4 / m=16):\n");
    for (int cfg = 1; cfg <= KERN_CUDA_GEMV_Q8_CONFIGS; cfg++) {
        kern_cuda_gemv_q8_set_config(cfg);
        printf("  cfg %d (%s):", cfg, kern_cuda_gemv_q8_config_name(cfg));
        for (int si = 0; si < 4; si++) {
            a.n = shapes[si][0];
            a.k = shapes[si][1];
            a.wbytes = dtype_row_size(DTYPE_Q8_0, a.k) * a.n;
            a.copies = (int)(pool_bytes / a.wbytes);
            printf("  %dx%d", a.n, a.k);
            for (int mi = 0; mi < NMS; mi += 2) {
                a.m = ms_[mi];
                use_graph = 1;
                const double gms = time_ms(mm_fn, &a, 20);
                use_graph = 0;
                printf(" %5.1f", 100.0 * a.wbytes / gms / 1e6 / ceil_gbs);
            }
        }
        printf("\n");
    }
    kern_cuda_gemv_q8_set_config(0);
}

/* ---- GGUF block types (kernels/cuda/matmul_q.h) ---- */

/* Llama-2-7B's layer products as ferry runs them (q|k|v and gate|up stacked) and the output head. */
static const int lshapes[4][2] = {{12288, 4096}, {4096, 4096}, {22016, 4096}, {4096, 11008}};
static const char *const lnames[4] = {"qkv", "o", "gu", "down"};
enum { NQM = 4 };
static const int qms[NQM] = {1, 16, 64, 512};
enum { NQT = 21 };
static const enum dtype qtypes[NQT] = {
    DTYPE_Q4_0,  DTYPE_Q4_1,    DTYPE_Q5_0,  DTYPE_Q5_1,   DTYPE_Q8_0,    DTYPE_Q4_K,  DTYPE_Q5_K,
    DTYPE_Q6_K,  DTYPE_Q2_K,    DTYPE_Q3_K,  DTYPE_IQ4_NL, DTYPE_IQ4_XS,  DTYPE_MXFP4, DTYPE_NVFP4,
    DTYPE_IQ3_S, DTYPE_IQ3_XXS, DTYPE_IQ2_S, DTYPE_IQ2_XS, DTYPE_IQ2_XXS, DTYPE_IQ1_M, DTYPE_IQ1_S};
/* Batch sizes of the variant sweep. */
enum { NSM = 11 };
static const int sms[NSM] = {1, 2, 3, 4, 8, 16, 32, 64, 128, 256, 512};
/* Short names of the variants (kern_cuda_qmm_variant_name has the long ones) and their enum spelling, for the
 * table lines this bench prints for kernels/cuda/matmul.cu. */
static const char *vshort(int v)
{
    static char buf[KERN_QV_COUNT][16];
    static const char *const fixed[KERN_QV_GEMM_C1] = {"auto", "d1", "d2", "d4", "M16", "M32", "G"};
    if (v < KERN_QV_GEMM_C1) return fixed[v];
    if (v == KERN_QV_Q8OLD) return "q8";
    if (v == KERN_QV_F16_PIECES) return "P";
    if (v == KERN_QV_STREAM) return "S";
    snprintf(buf[v], sizeof buf[v], "G%d", v - KERN_QV_GEMM_C1 + 1);
    return buf[v];
}
static const char *venum(int v)
{
    static char buf[KERN_QV_COUNT][32];
    static const char *const fixed[KERN_QV_GEMM_C1] = {
        "KERN_QV_AUTO",   "KERN_QV_DP4A_R1", "KERN_QV_DP4A_R2", "KERN_QV_DP4A_R4",
        "KERN_QV_MMA_16", "KERN_QV_MMA_32",  "KERN_QV_GEMM"};
    if (v < KERN_QV_GEMM_C1) return fixed[v];
    if (v == KERN_QV_Q8OLD) return "KERN_QV_Q8OLD";
    if (v == KERN_QV_F16_PIECES) return "KERN_QV_F16_PIECES";
    if (v == KERN_QV_STREAM) return "KERN_QV_STREAM";
    snprintf(buf[v], sizeof buf[v], "KERN_QV_GEMM_C1 + %d", v - KERN_QV_GEMM_C1);
    return buf[v];
}
/* Whether the sweep times variant v at m: the dp4a GEMV up to two launches, the int8 MMA at every m (tiles of
 * 64 rows from m = 128), the stream GEMV (S) up to m = 8, gemv_q8 up to its 16 rows, the f16 pieces (P) from
 * m = 16, the GEMM's configurations
 * where their row tile fits (16 and 32 rows: cfg 1, 2, 3, 8, 9 up to m = 64; 64 rows: 4, 5 from m = 16; 128
 * rows: the others from m = 64).
 */
static int sweep_has(enum dtype t, int v, int m)
{
    if (!kern_cuda_qmm_variant_applies(t, v)) return 0;
    if ((v >= KERN_QV_DP4A_R1 && v <= KERN_QV_DP4A_R4) || v == KERN_QV_STREAM) return m <= 8;
    if (v == KERN_QV_MMA_16 || v == KERN_QV_MMA_32) return 1;
    if (v == KERN_QV_GEMM) return m >= 2;
    if (v == KERN_QV_Q8OLD) return m <= 16;
    if (v == KERN_QV_F16_PIECES) return m >= 16;
    const int c = v - KERN_QV_GEMM_C1 + 1; /* GEMM configuration */
    if (c == 4 || c == 5) return m >= 16;
    if (c <= 3 || c == 8 || c == 9) return m >= 16 && m <= 64;
    return m >= 64;
}

/* Graph-timed milliseconds of one product (weights rotating through the pool). */
static double time_product(struct mm_arg a, size_t pool_bytes)
{
    a.wbytes = dtype_row_size(a.wt, a.k) * a.n;
    a.copies = (int)(pool_bytes / a.wbytes);
    if (a.copies < 1) a.copies = 1;
    use_graph = 1;
    const double ms = time_ms(mm_fn, &a, a.m >= 256 ? 4 : a.m >= 32 ? 10 : 20);
    use_graph = 0;
    return ms;
}

/* Graph-timed milliseconds of one Llama-2-7B layer's products (the four shapes) of type t at m rows through
 * kern_cuda_matmul with variant v forced (KERN_QV_AUTO: the table); per-shape times into us[4] when given. */
static double time_layer(struct kern_cuda_ctx *ctx, char *pool, size_t pool_bytes, float *x, float *y,
                         enum dtype t, int m, int v, double *us)
{
    kern_cuda_qmm_set_variant(v);
    double tt = 0;
    for (int si = 0; si < 4; si++) {
        struct mm_arg a = {ctx, y, x, pool, 0, 1, m, lshapes[si][0], lshapes[si][1], MM_AUTO, t};
        /* A forced configuration the device cannot hold: not timed (-1). */
        const int rc = kern_cuda_matmul(ctx, y, a.n, x, pool, t, NULL, m, a.n, a.k, st);
        if (rc == FERRY_ERR_UNSUPPORTED) {
            kern_cuda_qmm_set_variant(KERN_QV_AUTO);
            return -1.0;
        }
        FK(rc);
        const double ms = time_product(a, pool_bytes);
        if (us) us[si] = ms * 1e3;
        tt += ms;
    }
    kern_cuda_qmm_set_variant(KERN_QV_AUTO);
    return tt;
}

static double layer_bytes(enum dtype t)
{
    double b = 0;
    for (int si = 0; si < 4; si++) b += (double)dtype_row_size(t, lshapes[si][1]) * lshapes[si][0];
    return b;
}
static double layer_flops(int m)
{
    double f = 0;
    for (int si = 0; si < 4; si++) f += 2.0 * m * lshapes[si][0] * lshapes[si][1];
    return f;
}

/* The variant sweep, the best per type and m, the table lines, then the layer table of the automatic choice
 * (the table compiled into this build) and the whole-model products at m = 64. stdout gets every line as it
 * is measured; the compact summary comes last. */
static void bench_quant(char *pool, size_t pool_bytes, float *x, float *y, struct kern_cuda_ctx *ctx,
                        double ceil_gbs)
{
    static char table[8 * NQM + 8][170];
    static char best_line[NQT][1200], picks[NQT][600];
    int rows = 0;
    double f16_tflops[NQM] = {0};
    samples = 9;
    printf("quantized products through kern_cuda_matmul, graph-timed, Llama-2-7B layer shapes\n");
    /* The f16 reference: the GEMV path at m <= 16 and cuBLAS above, the same shapes (x2 the Q8_0 bytes). */
    for (int mi = 0; mi < NQM; mi++) {
        double us[4];
        const double t = time_layer(ctx, pool, pool_bytes, x, y, DTYPE_F16, qms[mi], KERN_QV_AUTO, us);
        const double bytes = layer_bytes(DTYPE_F16), flops = layer_flops(qms[mi]);
        f16_tflops[mi] = flops / t / 1e9;
        snprintf(table[rows++], sizeof table[0],
                 "%-5s m=%-3d %8.1f %8.1f %8.1f %8.1f | %8.1f us %7.0f GB/s %5.1f%% %6.1f TF", "F16", qms[mi],
                 us[0], us[1], us[2], us[3], t * 1e3, bytes / t / 1e6, 100.0 * bytes / t / 1e6 / ceil_gbs,
                 flops / t / 1e9);
        printf("%s\n", table[rows - 1]);
    }

    /* Variant sweep: layer us per variant, best per m. */
    printf("variant sweep (layer us; %% of copy for m <= 16, TFLOP/s above; * best):\n");
    for (int ti = 0; ti < NQT; ti++) {
        const enum dtype t = qtypes[ti];
        const double bytes = layer_bytes(t);
        int bo = snprintf(best_line[ti], sizeof best_line[0], "%-5s", dtype_name(t));
        int po = 0, prev_v = -1, prev_m = 0;
        picks[ti][0] = 0;
        for (int mi = 0; mi < NSM; mi++) {
            const int m = sms[mi];
            double best = 1e30;
            int bv = KERN_QV_GEMM;
            char line[900];
            int o = snprintf(line, sizeof line, "  %-5s m=%-3d", dtype_name(t), m);
            for (int v = 1; v < KERN_QV_COUNT; v++) {
                if (!sweep_has(t, v, m)) continue;
                const double tt = time_layer(ctx, pool, pool_bytes, x, y, t, m, v, NULL);
                if (tt < 0) continue;
                if (tt < best) best = tt, bv = v;
                o += snprintf(line + o, sizeof line - o, " %s %.1f", vshort(v), tt * 1e3);
            }
            printf("%s | best %s\n", line, vshort(bv));
            const double pct = 100.0 * bytes / best / 1e6 / ceil_gbs, tf = layer_flops(m) / best / 1e9;
            if (m <= 16)
                bo += snprintf(best_line[ti] + bo, sizeof best_line[0] - bo, " %d:%s %.0f%%", m, vshort(bv),
                               pct);
            else
                bo += snprintf(best_line[ti] + bo, sizeof best_line[0] - bo, " %d:%s %.0fTF", m, vshort(bv),
                               tf);
            /* Table entries: runs of equal best variants merged, each entry up to the run's last m. */
            if (prev_v >= 0 && bv != prev_v)
                po += snprintf(picks[ti] + po, sizeof picks[0] - po, " {DTYPE_%s, %d, %s},", dtype_name(t),
                               prev_m, venum(prev_v));
            prev_v = bv, prev_m = m;
        }
        po += snprintf(picks[ti] + po, sizeof picks[0] - po, " {DTYPE_%s, %d, %s},", dtype_name(t), prev_m,
                       venum(prev_v));
    }

    /* The automatic choice (this build's table) at the layer shapes. */
    for (int ti = 0; ti < NQT; ti++)
        for (int mi = 0; mi < NQM; mi++) {
            double us[4];
            const enum dtype t = qtypes[ti];
            const double tt = time_layer(ctx, pool, pool_bytes, x, y, t, qms[mi], KERN_QV_AUTO, us);
            const double bytes = layer_bytes(t), flops = layer_flops(qms[mi]);
            snprintf(
                table[rows++], sizeof table[0],
                "%-5s m=%-3d %8.1f %8.1f %8.1f %8.1f | %8.1f us %7.0f GB/s %5.1f%% %6.1f TF %4.0f%%f16 (%s)",
                dtype_name(t), qms[mi], us[0], us[1], us[2], us[3], tt * 1e3, bytes / tt / 1e6,
                100.0 * bytes / tt / 1e6 / ceil_gbs, flops / tt / 1e9,
                100.0 * flops / tt / 1e9 / f16_tflops[mi], vshort(kern_cuda_qmm_pick(t, qms[mi])));
            printf("%s\n", table[rows - 1]);
        }
    /* Products only, a whole Llama-2-7B step at m = 64 (32 layers + the 32000x4096 head in the same type). */
    char model[NQT][64];
    for (int ti = 0; ti < NQT; ti++) {
        double t = 32 * time_layer(ctx, pool, pool_bytes, x, y, qtypes[ti], 64, KERN_QV_AUTO, NULL);
        struct mm_arg h = {ctx, y, x, pool, 0, 1, 64, 32000, 4096, MM_AUTO, qtypes[ti]};
        t += time_product(h, pool_bytes);
        snprintf(model[ti], sizeof model[0], "%s %.2f ms %.0f tok/s", dtype_name(qtypes[ti]), t,
                 64.0 / t * 1e3);
    }
    printf("\n== best variant per type and m (%% of copy at m <= 16, TFLOP/s above; d1/d2/d4 dp4a GEMV "
           "rows/warp, "
           "M16/M32 int8 MMA rows/warp, G f16 GEMM auto, Gn its config n, q8 gemv_q8, P W in f16 pieces + "
           "cuBLAS, S stream GEMV) ==\n");
    for (int ti = 0; ti < NQT; ti++) printf("%s\n", best_line[ti]);
    printf("== table lines for kernels/cuda/matmul.cu qmm_picks (this run's best) ==\n");
    for (int ti = 0; ti < NQT; ti++) printf("   %s\n", picks[ti]);
    printf("== summary, automatic choice of this build: us per product (%s %s %s %s), one layer: us, weight "
           "GB/s, "
           "%% of copy (%.0f GB/s), TFLOP/s, TFLOP/s vs F16 (variant) ==\n",
           lnames[0], lnames[1], lnames[2], lnames[3], ceil_gbs);
    for (int i = 0; i < rows; i++) printf("%s\n", table[i]);
    printf("== Llama-2-7B products only at m = 64 (32 layers + head):");
    for (int ti = 0; ti < NQT; ti++) printf("%s %s", ti % 3 ? ";" : "\n  ", model[ti]);
    printf("\n");
}

/* --stream: the decode products of the Q4_K_M mix and the common 32-blocks at m = 1, 2, 4, 8, every kernel
 * that can run them, the stream GEMV's rows per task automatic (S) and forced (S1, S2, S4). One line per
 * type, m and kernel: % of the copy rate per product (qkv o gu down) and for the layer, the layer's us; then
 * per type and m the best existing kernel against the stream GEMV. */
static void bench_stream(char *pool, size_t pool_bytes, float *x, float *y, struct kern_cuda_ctx *ctx,
                         double ceil_gbs)
{
    static const enum dtype types[] = {DTYPE_Q4_K, DTYPE_Q6_K, DTYPE_Q8_0, DTYPE_Q5_K, DTYPE_Q4_0};
    static const int ms[] = {1, 2, 4, 8};
    /* Kernels: the variant, and for KERN_QV_STREAM its rows per task (0: automatic). */
    static const struct {
        int v, rows;
        const char *name;
    } ks[] = {{KERN_QV_DP4A_R1, 0, "d1"}, {KERN_QV_DP4A_R2, 0, "d2"}, {KERN_QV_DP4A_R4, 0, "d4"},
              {KERN_QV_MMA_16, 0, "M16"}, {KERN_QV_Q8OLD, 0, "q8"},   {KERN_QV_STREAM, 0, "S"},
              {KERN_QV_STREAM, 1, "S1"},  {KERN_QV_STREAM, 2, "S2"},  {KERN_QV_STREAM, 4, "S4"}};
    enum { NK = sizeof ks / sizeof ks[0] };
    char summary[5 * 4][160];
    int ns = 0;
    samples = 9;
    printf("decode products, graph-timed, %% of the measured copy rate (%.0f GB/s): qkv %dx%d, o %dx%d, gu "
           "%dx%d, "
           "down %dx%d | layer\n",
           ceil_gbs, lshapes[0][0], lshapes[0][1], lshapes[1][0], lshapes[1][1], lshapes[2][0], lshapes[2][1],
           lshapes[3][0], lshapes[3][1]);
    for (int ti = 0; ti < 5; ti++)
        for (int mi = 0; mi < 4; mi++) {
            const enum dtype t = types[ti];
            const int m = ms[mi];
            double best_old = 1e30, best_s = 1e30;
            const char *best_old_name = "-", *best_s_name = "-";
            for (int ki = 0; ki < NK; ki++) {
                if (!kern_cuda_qmm_variant_applies(t, ks[ki].v)) continue;
                if (ks[ki].v == KERN_QV_MMA_16 && m < 2) continue;
                kern_cuda_qstream_set_rows(ks[ki].rows);
                double us[4];
                const double tt = time_layer(ctx, pool, pool_bytes, x, y, t, m, ks[ki].v, us);
                kern_cuda_qstream_set_rows(0);
                if (tt < 0) continue;
                printf("%-5s m=%d %-4s", dtype_name(t), m, ks[ki].name);
                for (int si = 0; si < 4; si++) {
                    const double b = (double)dtype_row_size(t, lshapes[si][1]) * lshapes[si][0];
                    printf(" %5.1f%%", 100.0 * b / (us[si] * 1e-3) / 1e6 / ceil_gbs);
                }
                const double pct = 100.0 * layer_bytes(t) / tt / 1e6 / ceil_gbs;
                printf(" | %5.1f%% %8.1f us\n", pct, tt * 1e3);
                if (ks[ki].v == KERN_QV_STREAM && tt < best_s) best_s = tt, best_s_name = ks[ki].name;
                if (ks[ki].v != KERN_QV_STREAM && tt < best_old) best_old = tt, best_old_name = ks[ki].name;
            }
            snprintf(summary[ns++], sizeof summary[0],
                     "%-5s m=%d  best existing %-4s %5.1f%% %7.1f us | stream %-3s %5.1f%% %7.1f us | %.2fx",
                     dtype_name(t), m, best_old_name, 100.0 * layer_bytes(t) / best_old / 1e6 / ceil_gbs,
                     best_old * 1e3, best_s_name, 100.0 * layer_bytes(t) / best_s / 1e6 / ceil_gbs,
                     best_s * 1e3, best_old / best_s);
        }
    printf("== decode layer, %% of the copy rate (%.0f GB/s): best existing kernel vs the stream GEMV ==\n",
           ceil_gbs);
    for (int i = 0; i < ns; i++) printf("%s\n", summary[i]);
}

/* --types: one product per weight type at test-backend-ops' perf shape (W 4096 x 14336, m = 1 and 8) through
 * kern_cuda_matmul's automatic choice, graph-timed, one weight copy re-read as test-backend-ops does (types
 * under the L2 size are read partly from it). One line per type and m, "type T m M n N k K us U bytes B", for
 * tests/bench/compare_types.sh --cuda; only (a comma-separated list of type names) or NULL: every type. */
static void bench_types(char *pool, float *x, float *y, struct kern_cuda_ctx *ctx, const char *only)
{
    char want[512];
    snprintf(want, sizeof want, ",%s,", only ? only : "");
    for (int ti = -2; ti < NQT; ti++) {
        const enum dtype t = ti == -2 ? DTYPE_F16 : ti == -1 ? DTYPE_BF16 : qtypes[ti];
        char key[32];
        snprintf(key, sizeof key, ",%s,", dtype_name(t));
        if (only && !strstr(want, key)) continue;
        for (int m = 1; m <= 8; m += 7) {
            struct mm_arg a = {ctx, y, x, pool, 0, 1, m, 4096, 14336, MM_AUTO, t};
            a.wbytes = dtype_row_size(t, a.k) * a.n;
            use_graph = 1;
            const double ms = time_ms(mm_fn, &a, 20);
            use_graph = 0;
            printf("type %s m %d n %d k %d us %.2f bytes %zu\n", dtype_name(t), m, a.n, a.k, ms * 1e3,
                   a.wbytes);
            fflush(stdout);
        }
    }
}

static void bench_attention(const char *name, int n_heads, int n_kv, int ctx, int m, int prefill,
                            double ceil_gbs)
{
    const int D = 128, bs = 16;
    struct att_arg a;
    memset(&a, 0, sizeof a);
    const int blocks_per_seq = (ctx + bs - 1) / bs;
    const int n_seqs = prefill ? 1 : m;
    /* Calls rotate among copies of the cache spanning >= 256 MiB, so that L2 does not hold a small one (each
     * layer of a model reads its own cache). */
    const size_t one = (size_t)blocks_per_seq * n_seqs * bs * n_kv * D * 2 * 2;
    a.copies = prefill ? 1 : (int)((256u << 20) / one) + 1;
    const int nb1 = blocks_per_seq * n_seqs;
    a.kv.n_blocks = nb1 * a.copies;
    a.kv.block_size = bs;
    a.kv.max_blocks = blocks_per_seq;
    a.kv.n_kv_heads = n_kv;
    a.kv.head_dim = D;
    const size_t kvb = (size_t)a.kv.n_blocks * bs * n_kv * D * 2;
    CK(cudaMalloc((void **)&a.kv.k, kvb));
    CK(cudaMalloc((void **)&a.kv.v, kvb));
    fill_f16(a.kv.k, kvb);
    fill_f16(a.kv.v, kvb);
    int32_t *bt = malloc((size_t)a.kv.n_blocks * 4), *seq = malloc(m * 4), *pos = malloc(m * 4);
    for (int c = 0; c < a.copies; c++) /* scattered within the copy */
        for (int i = 0; i < nb1; i++) bt[(size_t)c * nb1 + i] = (int32_t)(c * nb1 + (i * 7919LL) % nb1);
    for (int i = 0; i < m; i++) {
        seq[i] = prefill ? 0 : i;
        pos[i] = prefill ? i : ctx - 1;
    }
    int32_t *dbt;
    CK(cudaMalloc((void **)&dbt, (size_t)a.kv.n_blocks * 4));
    CK(cudaMemcpy(dbt, bt, (size_t)a.kv.n_blocks * 4, cudaMemcpyHostToDevice));
    a.kv.block_table = dbt;
    a.tables = dbt;
    CK(cudaMalloc((void **)&a.seq, m * 4));
    CK(cudaMalloc((void **)&a.pos, m * 4));
    CK(cudaMemcpy(a.seq, seq, m * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(a.pos, pos, m * 4, cudaMemcpyHostToDevice));
    CK(cudaMalloc((void **)&a.q, (size_t)m * n_heads * D * 4));
    CK(cudaMalloc((void **)&a.out, (size_t)m * n_heads * D * 4));
    fill_f32(a.q, (size_t)m * n_heads * D);
    a.m = m;
    a.n_heads = n_heads;
    a.max_len = ctx;
    a.mode = prefill ? KERN_ATTN_PREFILL : KERN_ATTN_DECODE;
    a.ws_bytes = kern_cuda_attention_ws_size(m, n_heads, D, ctx);
    if (a.ws_bytes) {
        CK(cudaMalloc(&a.ws, a.ws_bytes));
        CK(cudaMemset(a.ws, 0, a.ws_bytes)); /* once, as attention.h asks */
    }
    const double ms = time_ms(att_fn, &a, 10);
    use_graph = 1;
    const double gms = time_ms(att_fn, &a, 10);
    use_graph = 0;
    if (prefill) {
        const double flops = 4.0 * n_heads * D * ((double)m * (m + 1) / 2);
        printf("%-34s %10.4f ms %9.1f TFLOP/s   (causal, %d tokens)\n", name, ms, flops / ms / 1e9, m);
    } else {
        const double bytes = (double)m * ctx * n_kv * D * 2 * 2;
        printf("%-34s %10.4f ms %9.1f GB/s  %5.1f%% of copy | graph %7.4f ms %5.1f%% (KV bytes)\n", name, ms,
               bytes / ms / 1e6, 100.0 * bytes / ms / 1e6 / ceil_gbs, gms,
               100.0 * bytes / gms / 1e6 / ceil_gbs);
    }
    cudaFree(a.kv.k);
    cudaFree(a.kv.v);
    cudaFree(dbt);
    cudaFree(a.seq);
    cudaFree(a.pos);
    cudaFree(a.q);
    cudaFree(a.out);
    cudaFree(a.ws);
    free(bt);
    free(seq);
    free(pos);
}

int main(int argc, char **argv)
{
    int only_q8 = 0, only_quant = 0, only_types = 0, only_stream = 0;
    const char *type_list = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--quick")) samples = 7;
        if (!strcmp(argv[i], "--q8")) only_q8 = 1;
        if (!strcmp(argv[i], "--quant")) only_quant = 1;
        if (!strcmp(argv[i], "--types")) only_types = 1;
        if (!strcmp(argv[i], "--stream")) only_stream = 1;
        if (!strcmp(argv[i], "-T") && i + 1 < argc) type_list = argv[++i];
    }
    if (kern_cuda_device_count() <= 0) {
        fprintf(stderr, "bench_cuda: no CUDA device\n");
        return 77;
    }
    srand(1);
    struct cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    printf("device: %s, %d SMs, L2 %d MB, %.1f GiB\n", prop.name, prop.multiProcessorCount,
           prop.l2CacheSize >> 20, prop.totalGlobalMem / 1073741824.0);
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));

    /* Ceiling. */
    struct copy_arg c = {NULL, NULL, 1u << 30};
    CK(cudaMalloc(&c.a, c.bytes));
    CK(cudaMalloc(&c.b, c.bytes));
    fill_f16(c.a, c.bytes);
    const double copy_ms = time_ms(copy_fn, &c, 3);
    const double ceil_gbs = 2.0 * c.bytes / copy_ms / 1e6;
    printf("%-34s %10.4f ms %9.1f GB/s  (read + write, 1 GiB)\n", "d2d copy ceiling", copy_ms, ceil_gbs);
    cudaFree(c.a);
    cudaFree(c.b);

    /* GEMV and cuBLAS at Llama-2-7B shapes, f16 weights. */
    const size_t pool_bytes = 512u << 20;
    char *pool;
    CK(cudaMalloc((void **)&pool, pool_bytes + ((size_t)32000 * 4096 * 2)));
    fill_f16(pool, pool_bytes + ((size_t)32000 * 4096 * 2));
    struct kern_cuda_ctx *ctx;
    FK(kern_cuda_ctx_init(&ctx, (size_t)512 * 11008, KERN_CUDA_W16_MAX_BYTES));
    float *x, *y;
    CK(cudaMalloc((void **)&x, (size_t)512 * 11008 * 4));
    CK(cudaMalloc((void **)&y, (size_t)512 * 32000 * 4));
    fill_f32(x, (size_t)512 * 11008);
    if (only_quant || only_types || only_stream) {
        if (only_stream)
            bench_stream(pool, pool_bytes, x, y, ctx, ceil_gbs);
        else if (only_types)
            bench_types(pool, x, y, ctx, type_list);
        else
            bench_quant(pool, pool_bytes, x, y, ctx, ceil_gbs);
        kern_cuda_ctx_free(ctx);
        cudaFree(pool);
        cudaFree(x);
        cudaFree(y);
        CK(cudaStreamDestroy(st));
        return 0;
    }
    bench_q8(pool, pool_bytes, x, y, ceil_gbs, only_q8);
    if (only_q8) {
        kern_cuda_ctx_free(ctx);
        cudaFree(pool);
        cudaFree(x);
        cudaFree(y);
        CK(cudaStreamDestroy(st));
        return 0;
    }
    const struct mm_arg f16 = {ctx, y, x, pool, 0, 1, 1, 0, 0, 0, DTYPE_F16};
    const double bytes_total = sweep_shapes("gemv f16", f16, pool_bytes, ceil_gbs);
    { /* m = 1 with one output row per warp instead of the default two */
        double t1 = 0;
        kern_cuda_matmul_set_m1_rows(1);
        use_graph = 1;
        for (int si = 0; si < 4; si++) {
            struct mm_arg a = {ctx, y, x, pool, 0, 1, 1, shapes[si][0], shapes[si][1], 0, DTYPE_F16};
            a.wbytes = (size_t)a.n * a.k * 2;
            a.copies = (int)(pool_bytes / a.wbytes);
            t1 += time_ms(mm_fn, &a, 20);
        }
        use_graph = 0;
        kern_cuda_matmul_set_m1_rows(0);
        printf("%-34s %10.4f ms %9.1f GB/s  %5.1f%% of copy (graph; one row per warp)\n",
               "gemv f16 all shapes m=1 R=1", t1, bytes_total / t1 / 1e6,
               100.0 * bytes_total / t1 / 1e6 / ceil_gbs);
    }
    /* Other weight types at one shape (the pool's f16 pattern read as bf16 / Q8_0: finite values). */
    const enum dtype other[2] = {DTYPE_BF16, DTYPE_Q8_0};
    for (int oi = 0; oi < 2; oi++)
        for (int mi = 0; mi < NMS; mi += 2) {
            struct mm_arg a = {ctx, y, x, pool, 0, 1, ms_[mi], 11008, 4096, 0, other[oi]};
            a.wbytes = dtype_row_size(a.wt, a.k) * a.n;
            a.copies = (int)(pool_bytes / a.wbytes);
            const double ms = time_ms(mm_fn, &a, 20);
            char name[64];
            snprintf(name, sizeof name, "gemv %s 11008x4096  m=%d", dtype_name(a.wt), a.m);
            printf("%-34s %10.4f ms %9.1f GB/s  %5.1f%% of copy\n", name, ms, a.wbytes / ms / 1e6,
                   100.0 * a.wbytes / ms / 1e6 / ceil_gbs);
        }
    { /* cuBLAS at m = 16, for comparison with the skinny path */
        struct mm_arg a = {ctx, y, x, pool, 0, 1, 16, 11008, 4096, 1, DTYPE_F16};
        a.wbytes = (size_t)a.n * a.k * 2;
        a.copies = (int)(pool_bytes / a.wbytes);
        use_graph = 1;
        const double gms = time_ms(mm_fn, &a, 20);
        use_graph = 0;
        printf("%-34s %10.4f ms %9.1f GB/s  %5.1f%% of copy (graph)\n", "cublas f16 11008x4096 m=16", gms,
               a.wbytes / gms / 1e6, 100.0 * a.wbytes / gms / 1e6 / ceil_gbs);
    }
    for (int si = 0; si < 4; si++) {
        struct mm_arg a = {ctx, y, x, pool, 0, 1, 512, shapes[si][0], shapes[si][1], 1, DTYPE_F16};
        a.wbytes = (size_t)a.n * a.k * 2;
        a.copies = (int)(pool_bytes / a.wbytes);
        if (a.copies < 1) a.copies = 1;
        const double ms = time_ms(mm_fn, &a, 10);
        char name[64];
        snprintf(name, sizeof name, "cublas f16 %5dx%-5d m=512", a.n, a.k);
        printf("%-34s %10.4f ms %9.1f TFLOP/s\n", name, ms, 2.0 * a.m * a.n * a.k / ms / 1e9);
    }
    kern_cuda_ctx_free(ctx);
    cudaFree(pool);

    /* Attention, Llama-2-7B (32 heads, 32 KV heads) and Llama-3-8B (32/8), head_dim 128: the decode kernel
     * with 1 KV head per block (the default), 2 and 4 (the cache's access pattern: 256, 512, 1024 contiguous
     * bytes per position), and decode through the tile kernel (as before the decode kernel). */
    const int hbs[4] = {0, 2, 4, -1};
    for (int hi = 0; hi < 4; hi++) {
        kern_cuda_attention_set_decode_heads(hbs[hi]);
        if (hbs[hi] < 0)
            printf("attention, decode through the tile kernel:\n");
        else
            printf("attention, decode kernel, %d KV head(s) per block:\n", hbs[hi] ? hbs[hi] : 1);
        bench_attention("attn decode l2-7b ctx=512 b=1", 32, 32, 512, 1, 0, ceil_gbs);
        bench_attention("attn decode l2-7b ctx=8192 b=1", 32, 32, 8192, 1, 0, ceil_gbs);
        bench_attention("attn decode l2-7b ctx=512 b=16", 32, 32, 512, 16, 0, ceil_gbs);
        bench_attention("attn decode l3-8b ctx=8192 b=1", 32, 8, 8192, 1, 0, ceil_gbs);
        bench_attention("attn decode l3-8b ctx=8192 b=16", 32, 8, 8192, 16, 0, ceil_gbs);
        if (hbs[hi] == 0) {
            bench_attention("attn prefill l2-7b 512", 32, 32, 512, 512, 1, ceil_gbs);
            bench_attention("attn prefill l3-8b 512", 32, 8, 512, 512, 1, ceil_gbs);
        }
    }
    kern_cuda_attention_set_decode_heads(0);

    /* rmsnorm at d=4096. */
    const int nm[3] = {1, 16, 512};
    for (int f = 0; f < 2; f++)
        for (int i = 0; i < 3; i++) {
            struct norm_arg a = {y, x, x + 4096 * 512, y + 4096 * 512, nm[i], 4096, f};
            fill_f32(a.r, (size_t)4096 * 512);
            const double ms = time_ms(norm_fn, &a, 20);
            const double bytes = (f ? 4.0 : 2.0) * nm[i] * 4096 * 4 + 4096 * 4;
            char name[64];
            snprintf(name, sizeof name, "%s d=4096 m=%d", f ? "add_rmsnorm" : "rmsnorm", nm[i]);
            printf("%-34s %10.4f ms %9.1f GB/s  %5.1f%% of copy\n", name, ms, bytes / ms / 1e6,
                   100.0 * bytes / ms / 1e6 / ceil_gbs);
        }
    cudaFree(x);
    cudaFree(y);
    CK(cudaStreamDestroy(st));
    return 0;
}
