/* bench_attn — times prefill attention on tensor cores, mixed decode + prefill steps, and the GPU sampler at
 * Llama shapes on one GPU, and prints a table (the last block of lines is the compact summary).
 *
 * Prefill: a 512-token chunk at positions 0..511 and at 1536..2047 (a later chunk of a chunked prefill), for
 * Llama-2-7B (32 heads x 128, MHA) and Llama-3-8B (32 query heads, 8 KV heads), through the tensor-core
 * kernel and the SIMT tile kernel it replaces; TFLOP/s counts the causal products (4 * head_dim flops per
 * query head and visible position) against the H200's ~740 TFLOP/s dense f16 (measured cuBLAS GEMM,
 * DESIGN.md). Mixed: 32 decode rows at context 512 plus a 256-row chunk (positions 256..511 of a 33rd
 * sequence), against the two alone: kern_cuda_attention_mixed, AUTO (the split found on the device), and the
 * SIMT path every row took before (PREFILL through the tile kernel). Target: mixed <= 1.25 x (decode +
 * chunk). Sampler: vocabularies 32000 and 128256, batches 1, 16, 64, four kinds of rows, in microseconds per
 * call. Method: each figure is the median of 15 samples, a sample being 10 calls after 3 warm-up calls, timed
 * with CUDA events, launched back to back and (for attention) replayed from a CUDA graph ("graph"). KV caches
 * rotate among copies spanning >= 256 MiB, so L2 (60 MB) does not hold the whole working set between calls.
 * --ext: decode and one prefill chunk with the K/V pool in the device's memory and as the pool's extension in
 * pinned, mapped host memory (kern_cuda_kv_layer.k_ext: what `ferry serve` reads when its pool overflows,
 * runtime/NOTES.md), as GB/s of K/V read, beside the copy engine's host-to-device rate for the same bytes.
 * Usage: bench_attn [--quick] [--ext]
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "kernels/core/fp16.h"
#include "kernels/core/status.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/sample.h"

#include "tests/bench_cuda/bench_check.h"

#define PEAK_TFLOPS 740.0 /* H200 dense f16 GEMM, measured (DESIGN.md) */

static cudaStream_t st;
static int samples = 15;

typedef void (*bench_fn)(void *arg, int iter);

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Median milliseconds per call of fn over samples of `batch` calls, launched or replayed from a graph. */
static double time_ms(bench_fn fn, void *arg, int batch, int graph)
{
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    int it = 0;
    for (int i = 0; i < 3; i++) fn(arg, it++);
    CK(cudaStreamSynchronize(st));
    cudaGraphExec_t ge = NULL;
    if (graph) {
        cudaGraph_t gr;
        CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
        for (int i = 0; i < batch; i++) fn(arg, it++);
        CK(cudaStreamEndCapture(st, &gr));
        CK(cudaGraphInstantiate(&ge, gr, 0));
        CK(cudaGraphDestroy(gr));
        CK(cudaGraphLaunch(ge, st));
        CK(cudaStreamSynchronize(st));
    }
    double *t = malloc((size_t)samples * sizeof(double));
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
    qsort(t, (size_t)samples, sizeof(double), cmp_d);
    const double med = t[samples / 2];
    free(t);
    CK(cudaEventDestroy(a));
    CK(cudaEventDestroy(b));
    return med;
}

static void fill_f16(void *d, size_t bytes)
{
    const size_t pat = 16u << 20;
    uint16_t *h = malloc(pat);
    for (size_t i = 0; i < pat / 2; i++) h[i] = f32_to_f16((float)((double)rand() / RAND_MAX - 0.5));
    for (size_t off = 0; off < bytes; off += pat)
        CK(cudaMemcpy((char *)d + off, h, bytes - off < pat ? bytes - off : pat, cudaMemcpyHostToDevice));
    free(h);
}
static float *dev_rand_f32(size_t n, float scale)
{
    float *h = malloc(n * 4), *d;
    for (size_t i = 0; i < n; i++) h[i] = (float)((double)rand() / RAND_MAX * 2 - 1) * scale;
    CK(cudaMalloc((void **)&d, n * 4));
    CK(cudaMemcpy(d, h, n * 4, cudaMemcpyHostToDevice));
    free(h);
    return d;
}
static void *dev_copy(const void *h, size_t bytes)
{
    void *d;
    CK(cudaMalloc(&d, bytes ? bytes : 16));
    if (bytes) CK(cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice));
    return d;
}

/* ---- attention ---- */

/* A paged cache of n_seqs sequences of ctx positions each, in `copies` rotated copies. */
struct world {
    struct kern_cuda_kv_layer kv; /* block_table set per call */
    int32_t *tables;              /* (copies, n_seqs * max_blocks) */
    void *host_k, *host_v;        /* the extension's host memory (world_init_at with host), else NULL */
    int copies, n_seqs, ctx, n_heads;
};

static void world_init_at(struct world *w, int n_heads, int n_kv, int n_seqs, int ctx, int host);
static void world_init(struct world *w, int n_heads, int n_kv, int n_seqs, int ctx)
{
    world_init_at(w, n_heads, n_kv, n_seqs, ctx, 0);
}

/* host: the whole pool is the extension, in pinned mapped host memory. */
static void world_init_at(struct world *w, int n_heads, int n_kv, int n_seqs, int ctx, int host)
{
    const int D = 128, bs = 16, mb = (ctx + bs - 1) / bs;
    memset(w, 0, sizeof *w);
    const size_t one = (size_t)n_seqs * mb * bs * n_kv * D * 2 * 2;
    w->copies = (int)((256u << 20) / one) + 1;
    w->n_seqs = n_seqs;
    w->ctx = ctx;
    w->n_heads = n_heads;
    const int nb1 = n_seqs * mb;
    w->kv.n_blocks = nb1 * w->copies;
    w->kv.block_size = bs;
    w->kv.max_blocks = mb;
    w->kv.n_kv_heads = n_kv;
    w->kv.head_dim = D;
    const size_t kvb = (size_t)w->kv.n_blocks * bs * n_kv * D * 2;
    if (host) {
        void *k, *v;
        CK(cudaHostAlloc(&k, kvb, cudaHostAllocMapped));
        CK(cudaHostAlloc(&v, kvb, cudaHostAllocMapped));
        for (size_t i = 0; i < kvb / 2; i++)
            ((uint16_t *)k)[i] = ((uint16_t *)v)[i] =
                f32_to_f16((float)((i * 2654435761u) % 1000) / 1000 - 0.5f);
        CK(cudaHostGetDevicePointer((void **)&w->kv.k_ext, k, 0));
        CK(cudaHostGetDevicePointer((void **)&w->kv.v_ext, v, 0));
        w->kv.n_ext = w->kv.n_blocks;
        w->host_k = k, w->host_v = v;
        CK(cudaMalloc((void **)&w->kv.k, 16)); /* (no block lives there) */
        CK(cudaMalloc((void **)&w->kv.v, 16));
    } else {
        CK(cudaMalloc((void **)&w->kv.k, kvb));
        CK(cudaMalloc((void **)&w->kv.v, kvb));
        fill_f16(w->kv.k, kvb);
        fill_f16(w->kv.v, kvb);
    }
    int32_t *bt = malloc((size_t)w->kv.n_blocks * 4);
    for (int c = 0; c < w->copies; c++) /* scattered within the copy */
        for (int i = 0; i < nb1; i++) bt[(size_t)c * nb1 + i] = (int32_t)(c * nb1 + (i * 7919LL) % nb1);
    w->tables = dev_copy(bt, (size_t)w->kv.n_blocks * 4);
    w->kv.block_table = w->tables;
    free(bt);
}

static void world_free(struct world *w)
{
    cudaFree(w->kv.k);
    cudaFree(w->kv.v);
    cudaFree(w->tables);
    if (w->host_k) cudaFreeHost(w->host_k);
    if (w->host_v) cudaFreeHost(w->host_v);
}

enum call_kind { CALL_MODE, CALL_MIXED };

struct att_arg {
    struct world *w;
    float *out, *q;
    int32_t *seq, *pos;
    int m, n_dec, max_len;
    enum call_kind kind;
    enum kern_cuda_attn_mode mode;
    void *ws;
    size_t ws_bytes;
};

static void att_fn(void *p, int i)
{
    struct att_arg *a = p;
    struct kern_cuda_kv_layer kv = a->w->kv;
    kv.block_table = a->w->tables + (size_t)(i % a->w->copies) * (a->w->kv.n_blocks / a->w->copies);
    const float scale = 0.0883883f;
    if (a->kind == CALL_MIXED)
        FK(kern_cuda_attention_mixed(a->out, NULL, a->q, &kv, a->seq, a->pos, a->m, a->n_dec, a->w->n_heads,
                                     scale, a->max_len, a->ws, a->ws_bytes, st));
    else
        FK(kern_cuda_attention(a->out, a->q, &kv, a->seq, a->pos, a->m, a->w->n_heads, scale, a->max_len,
                               a->mode, a->ws, a->ws_bytes, st));
}

/* A batch over world w: rows (seq[i], pos[i]). */
static void arg_init(struct att_arg *a, struct world *w, const int32_t *seq, const int32_t *pos, int m)
{
    memset(a, 0, sizeof *a);
    a->w = w;
    a->m = m;
    a->seq = dev_copy(seq, (size_t)m * 4);
    a->pos = dev_copy(pos, (size_t)m * 4);
    a->q = dev_rand_f32((size_t)m * w->n_heads * 128, 1.0f);
    CK(cudaMalloc((void **)&a->out, (size_t)m * w->n_heads * 128 * 4));
    for (int i = 0; i < m; i++) a->max_len = pos[i] + 1 > a->max_len ? pos[i] + 1 : a->max_len;
    a->ws_bytes = kern_cuda_attention_ws_size(m, w->n_heads, 128, a->max_len);
    CK(cudaMalloc(&a->ws, a->ws_bytes ? a->ws_bytes : 16));
    CK(cudaMemset(a->ws, 0, a->ws_bytes ? a->ws_bytes : 16));
}

static void arg_free(struct att_arg *a)
{
    cudaFree(a->seq);
    cudaFree(a->pos);
    cudaFree(a->q);
    cudaFree(a->out);
    cudaFree(a->ws);
}

/* flops of a chunk of n rows at positions start..start+n-1: 4 * D * heads per visible position. */
static double chunk_flops(int heads, int start, int n)
{
    return 4.0 * heads * 128 * ((double)n * start + (double)n * (n + 1) / 2);
}

static char summary[64][160];
static int n_summary;

static void bench_prefill(const char *name, int n_heads, int n_kv, int start)
{
    struct world w;
    world_init(&w, n_heads, n_kv, 1, start + 512);
    int32_t seq[512], pos[512];
    for (int i = 0; i < 512; i++) seq[i] = 0, pos[i] = start + i;
    struct att_arg a;
    arg_init(&a, &w, seq, pos, 512);
    a.mode = KERN_ATTN_PREFILL;
    const double fl = chunk_flops(n_heads, start, 512);
    double t[2][2];
    for (int mma = 1; mma >= 0; mma--) {
        kern_cuda_attention_set_prefill_mma(mma);
        t[mma][0] = time_ms(att_fn, &a, 10, 0);
        t[mma][1] = time_ms(att_fn, &a, 10, 1);
    }
    kern_cuda_attention_set_prefill_mma(1);
    for (int mma = 1; mma >= 0; mma--)
        printf("prefill %-6s 512 @%-5d %-5s %9.4f ms %7.1f TFLOP/s %5.1f%% | graph %9.4f ms %7.1f TFLOP/s "
               "%5.1f%%\n",
               name, start, mma ? "mma" : "simt", t[mma][0], fl / t[mma][0] / 1e9,
               100 * fl / t[mma][0] / 1e9 / PEAK_TFLOPS, t[mma][1], fl / t[mma][1] / 1e9,
               100 * fl / t[mma][1] / 1e9 / PEAK_TFLOPS);
    snprintf(summary[n_summary++], 160,
             "prefill %-6s 512@%-4d  mma %6.1f us %6.1f TF/s (%4.1f%% of peak) | simt %6.1f us", name, start,
             t[1][1] * 1e3, fl / t[1][1] / 1e9, 100 * fl / t[1][1] / 1e9 / PEAK_TFLOPS, t[0][1] * 1e3);
    arg_free(&a);
    world_free(&w);
}

/* 32 decode rows (sequences 0..31, context 512) + a 256-row chunk (sequence 32, positions 256..511). */
static void bench_mixed(const char *name, int n_heads, int n_kv)
{
    enum { ND = 32, NC = 256 };
    struct world w;
    world_init(&w, n_heads, n_kv, ND + 1, 512);
    int32_t seq[ND + NC], pos[ND + NC];
    for (int i = 0; i < ND; i++) seq[i] = i, pos[i] = 511;
    for (int i = 0; i < NC; i++) seq[ND + i] = ND, pos[ND + i] = 256 + i;
    struct att_arg dec, chunk, mix;
    arg_init(&dec, &w, seq, pos, ND);
    dec.mode = KERN_ATTN_DECODE;
    arg_init(&chunk, &w, seq + ND, pos + ND, NC);
    chunk.mode = KERN_ATTN_PREFILL;
    arg_init(&mix, &w, seq, pos, ND + NC);
    double t[5][2]; /* decode, chunk, mixed, auto, old */
    for (int g = 0; g < 2; g++) {
        t[0][g] = time_ms(att_fn, &dec, 10, g);
        t[1][g] = time_ms(att_fn, &chunk, 10, g);
        mix.kind = CALL_MIXED;
        mix.n_dec = ND;
        t[2][g] = time_ms(att_fn, &mix, 10, g);
        mix.kind = CALL_MODE;
        mix.mode = KERN_ATTN_AUTO;
        t[3][g] = time_ms(att_fn, &mix, 10, g);
        kern_cuda_attention_set_prefill_mma(0);
        mix.mode = KERN_ATTN_PREFILL;
        t[4][g] = time_ms(att_fn, &mix, 10, g);
        kern_cuda_attention_set_prefill_mma(1);
    }
    static const char *rn[] = {"decode 32 @512 alone", "chunk 256 @256 alone", "mixed (n_decode = 32)",
                               "mixed, AUTO", "mixed, old path (SIMT)"};
    for (int r = 0; r < 5; r++)
        printf("mixed %-6s %-24s %9.4f ms | graph %9.4f ms\n", name, rn[r], t[r][0], t[r][1]);
    for (int g = 0; g < 2; g++)
        printf(
            "mixed %-6s %-6s ratio mixed / (decode + chunk) = %.3f, AUTO %.3f, old %.3f (target <= 1.25)\n",
            name, g ? "graph" : "launch", t[2][g] / (t[0][g] + t[1][g]), t[3][g] / (t[0][g] + t[1][g]),
            t[4][g] / (t[0][g] + t[1][g]));
    snprintf(summary[n_summary++], 160,
             "mixed   %-6s dec %5.1f + chunk %5.1f us; mixed %5.1f (x%.2f) auto %5.1f (x%.2f) old %6.1f us",
             name, t[0][1] * 1e3, t[1][1] * 1e3, t[2][1] * 1e3, t[2][1] / (t[0][1] + t[1][1]), t[3][1] * 1e3,
             t[3][1] / (t[0][1] + t[1][1]), t[4][1] * 1e3);
    arg_free(&dec);
    arg_free(&chunk);
    arg_free(&mix);
    world_free(&w);
}

/* Decode (one row per sequence at position ctx - 1) and a 512-row chunk (one sequence, positions ctx - 512..)
 * with the pool in device memory, then in host memory; GB/s of K/V read (each visible position's K and V
 * once). Beside: the copy engine moving the same bytes host to device. */
static void bench_ext(void)
{
    const struct {
        int n_seqs, ctx, chunk;
    } cases[] = {{1, 4096, 0}, {16, 512, 0}, {64, 512, 0}, {1, 2048, 1}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        const int n = cases[c].n_seqs, ctx = cases[c].ctx, chunk = cases[c].chunk, m = chunk ? 512 : n;
        int32_t *seq = malloc((size_t)m * 4), *pos = malloc((size_t)m * 4);
        for (int i = 0; i < m; i++) seq[i] = chunk ? 0 : i, pos[i] = chunk ? ctx - 512 + i : ctx - 1;
        const double bytes = (double)n * ctx * 32 * 128 * 2 * 2;
        double t[2];
        for (int host = 0; host < 2; host++) {
            struct world w;
            world_init_at(&w, 32, 32, n, ctx, host);
            struct att_arg a;
            arg_init(&a, &w, seq, pos, m);
            a.mode = chunk ? KERN_ATTN_PREFILL : KERN_ATTN_DECODE;
            t[host] = time_ms(att_fn, &a, 10, 1);
            arg_free(&a);
            world_free(&w);
        }
        void *h, *d;
        CK(cudaHostAlloc(&h, (size_t)bytes, cudaHostAllocDefault));
        CK(cudaMalloc(&d, (size_t)bytes));
        memset(h, 1, (size_t)bytes);
        cudaEvent_t e0, e1;
        CK(cudaEventCreate(&e0));
        CK(cudaEventCreate(&e1));
        CK(cudaMemcpyAsync(d, h, (size_t)bytes, cudaMemcpyHostToDevice, st));
        CK(cudaEventRecord(e0, st));
        for (int i = 0; i < 5; i++) CK(cudaMemcpyAsync(d, h, (size_t)bytes, cudaMemcpyHostToDevice, st));
        CK(cudaEventRecord(e1, st));
        CK(cudaEventSynchronize(e1));
        float ms = 0;
        CK(cudaEventElapsedTime(&ms, e0, e1));
        const double copy_ms = ms / 5;
        printf("ext %-7s %2d seq x %4d: device %8.4f ms (%6.1f GB/s) | host memory %8.4f ms (%6.1f GB/s) | "
               "copy engine %8.4f ms (%5.1f GB/s)\n",
               chunk ? "chunk" : "decode", n, ctx, t[0], bytes / t[0] / 1e6, t[1], bytes / t[1] / 1e6,
               copy_ms, bytes / copy_ms / 1e6);
        snprintf(summary[n_summary++], 160,
                 "ext %-6s %2dx%-4d host memory %6.1f GB/s (x%.1f of device time), copy %5.1f GB/s",
                 chunk ? "chunk" : "decode", n, ctx, bytes / t[1] / 1e6, t[1] / t[0], bytes / copy_ms / 1e6);
        CK(cudaEventDestroy(e0));
        CK(cudaEventDestroy(e1));
        cudaFreeHost(h);
        cudaFree(d);
        free(seq);
        free(pos);
    }
}

/* ---- sampler ---- */

struct smp_arg {
    struct kern_cuda_sample_batch B;
    int32_t *tokens;
    struct kern_cuda_sample_lp *lp;
    void *ws;
    size_t ws_bytes;
};

static void smp_fn(void *p, int i)
{
    (void)i;
    struct smp_arg *a = p;
    FK(kern_cuda_sample(&a->B, a->tokens, a->lp, a->ws, a->ws_bytes, st));
}

/* kind 0 greedy; 1 temperature 0.8; 2 temperature 0.8 + top_p 0.95; 3 top_k 40 + top_p 0.95 + min_p 0.05 +
 * penalties over 64 tokens + 5 logprobs. */
static double bench_sampler_one(int V, int b, int kind)
{
    struct kern_cuda_sample_row *rows = calloc((size_t)b, sizeof *rows);
    int32_t *htok = malloc((size_t)b * 64 * 4);
    uint32_t *hcnt = malloc((size_t)b * 64 * 4);
    for (int r = 0; r < b; r++) {
        struct kern_cuda_sample_row *k = &rows[r];
        k->temperature = kind == 0 ? 0.0f : 0.8f;
        k->top_p = kind >= 2 ? 0.95f : 1.0f;
        k->repetition_penalty = kind == 3 ? 1.1f : 1.0f;
        k->presence_penalty = kind == 3 ? 0.2f : 0.0f;
        k->top_k = kind == 3 ? 40 : 0;
        k->min_p = kind == 3 ? 0.05f : 0.0f;
        k->n_logprobs = kind == 3 ? 5 : -1;
        k->seed = (uint64_t)r * 77;
        k->step = 3;
        k->hist_begin = r * 64;
        k->hist_end = kind == 3 ? r * 64 + 64 : r * 64;
        k->mask_row = -1;
        for (int j = 0; j < 64; j++) htok[r * 64 + j] = (r * 131 + j * 997) % V, hcnt[r * 64 + j] = 1 + j % 3;
    }
    struct smp_arg a;
    memset(&a, 0, sizeof a);
    a.B.logits = dev_rand_f32((size_t)b * V, 6.0f);
    a.B.rows = dev_copy(rows, (size_t)b * sizeof *rows);
    a.B.hist_tok = dev_copy(htok, (size_t)b * 64 * 4);
    a.B.hist_cnt = dev_copy(hcnt, (size_t)b * 64 * 4);
    a.B.b = b;
    a.B.n_vocab = V;
    CK(cudaMalloc((void **)&a.tokens, (size_t)b * 4));
    CK(cudaMalloc((void **)&a.lp, (size_t)b * sizeof *a.lp));
    a.ws_bytes = kern_cuda_sample_ws_size(b, V);
    CK(cudaMalloc(&a.ws, a.ws_bytes));
    const double ms = time_ms(smp_fn, &a, 10, 0);
    cudaFree((void *)a.B.logits);
    cudaFree((void *)a.B.rows);
    cudaFree((void *)a.B.hist_tok);
    cudaFree((void *)a.B.hist_cnt);
    cudaFree(a.tokens);
    cudaFree(a.lp);
    cudaFree(a.ws);
    free(rows);
    free(htok);
    free(hcnt);
    return ms * 1e3;
}

static void bench_sampler(int quick)
{
    static const int vs[] = {32000, 128256}, bs[] = {1, 16, 64};
    static const char *kn[] = {"greedy", "T 0.8", "T+top_p", "all+lp5"};
    printf("sampler, us per call (launched):    ");
    for (int k = 0; k < 4; k++) printf("%10s", kn[k]);
    printf("\n");
    for (int vi = 0; vi < 2; vi++)
        for (int bi = 0; bi < 3; bi++) {
            if (quick && bi == 1) continue;
            double us[4];
            for (int k = 0; k < 4; k++) us[k] = bench_sampler_one(vs[vi], bs[bi], k);
            printf("sampler V %6d b %2d                ", vs[vi], bs[bi]);
            for (int k = 0; k < 4; k++) printf("%10.1f", us[k]);
            printf("\n");
            snprintf(summary[n_summary++], 160,
                     "sample  V %6d b %2d   greedy %6.1f  T %6.1f  top_p %6.1f  all+lp %6.1f us", vs[vi],
                     bs[bi], us[0], us[1], us[2], us[3]);
        }
}

int main(int argc, char **argv)
{
    int quick = 0, ext = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--quick"))
            quick = 1;
        else if (!strcmp(argv[i], "--ext"))
            ext = 1;
        else {
            fprintf(stderr, "usage: bench_attn [--quick] [--ext]\n");
            return 2;
        }
    }
    if (quick) samples = 5;
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
        fprintf(stderr, "bench_attn: no CUDA device\n");
        return 1;
    }
    struct cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    printf("device: %s, %d SMs, L2 %d MB\n", prop.name, prop.multiProcessorCount, prop.l2CacheSize >> 20);
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    srand(1);
    if (ext) {
        bench_ext();
        printf("\n== summary ==\n");
        for (int i = 0; i < n_summary; i++) printf("%s\n", summary[i]);
        CK(cudaStreamDestroy(st));
        return 0;
    }
    bench_prefill("l2-7b", 32, 32, 0);
    bench_prefill("l3-8b", 32, 8, 0);
    bench_prefill("l2-7b", 32, 32, 1536);
    bench_prefill("l3-8b", 32, 8, 1536);
    bench_mixed("l2-7b", 32, 32);
    bench_mixed("l3-8b", 32, 8);
    bench_sampler(quick);
    printf("\n== summary (attention graph-timed; sampler launched) ==\n");
    for (int i = 0; i < n_summary; i++) printf("%s\n", summary[i]);
    CK(cudaStreamDestroy(st));
    return 0;
}
