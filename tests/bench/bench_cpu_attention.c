/* bench_cpu_attention — decode attention over a long context with the KV cache in f32, f16 and Q8_0, the last
 * both in blocks and split into code and scale planes as the GPU's cache holds it (not a test). One sequence
 * of `ctx` positions, `tokens` decode rows of other sequences of the same length (a batch of decodes),
 * heads/kv heads/head_dim of a model; best and median of `reps` calls after a warm-up, the types taking turns
 * call by call; each type's K/V rotate over copies of at least 512 MiB (all four types' held at once: ~2.7
 * GiB) so no call finds them in cache. Prints ms per call and the K/V read rate.
 * With -p rows, a prefill chunk instead: `rows` rows of one sequence at positions ctx - rows .. ctx - 1
 * (GFLOP/s counts 4·head_dim per head and attended position).
 * Usage: bench_cpu_attention [-t threads] [-c ctx] [-b tokens | -p rows] [-H heads] [-K kv_heads] [-d
 * head_dim] [-r reps] (defaults: Llama-2-7B's 32/32/128, context 4096, 1 token, 2 threads, 8 reps).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "kernels/core/status.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/threadpool.h"
#include "quant/dtype.h"
#include "quant/fp16.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* A value in [-1, 1) that looks random, from a hash of x (splitmix64's finalizer). The fill this replaced,
 * ((i + c) * 40503) % 2001, repeats every 29 elements: a context of 450 positions held 29 distinct K rows
 * ~15 times each, so at -s 20 a row had ~15 tied maxima, some in every part, and no merge of parts ever
 * weighed one below 1. */
static float uniform_of(uint64_t x)
{
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    x ^= x >> 31;
    return (float)(x >> 40) * 0x1.0p-23f - 1.0f;
}

/* Copy c of K and V (cells elements each) of type el: the same values in every type (a hash of the index and
 * c), Q8_0 quantized by ggml's quantizer; planes hold the codes, then the scales (cells / 32 f16). */
static void fill_copy(enum kv_elem el, void *k, void *v, size_t cells, int c)
{
    float vals[32];
    for (size_t i = 0; i < cells; i += 32) {
        const size_t n = cells - i < 32 ? cells - i : 32;
        for (size_t e = 0; e < n; e++) vals[e] = uniform_of((uint64_t)c << 40 | (i + e));
        if (el == KV_Q8_0) {
            dtype_from_f32(DTYPE_Q8_0, vals, (uint8_t *)k + i / 32 * 34, 32);
            dtype_from_f32(DTYPE_Q8_0, vals, (uint8_t *)v + i / 32 * 34, 32);
        } else if (el == KV_Q8_0_PLANES) {
            struct block_q8_0 b;
            dtype_from_f32(DTYPE_Q8_0, vals, &b, 32);
            memcpy((int8_t *)k + i, b.qs, 32), memcpy((int8_t *)v + i, b.qs, 32);
            memcpy((uint8_t *)k + cells + i / 32 * 2, &b.d, 2);
            memcpy((uint8_t *)v + cells + i / 32 * 2, &b.d, 2);
        } else
            for (size_t e = 0; e < n; e++)
                if (el == KV_F16)
                    ((uint16_t *)k)[i + e] = ((uint16_t *)v)[i + e] = f32_to_f16(vals[e]);
                else
                    ((float *)k)[i + e] = ((float *)v)[i + e] = vals[e];
    }
}

int main(int argc, char **argv)
{
    int threads = 2, ctx = 4096, tokens = 1, heads = 32, kvh = 32, hd = 128, reps = 8, chunk = 0, opt;
    float scale = 0.088f;
    while ((opt = getopt(argc, argv, "t:c:b:p:H:K:d:r:s:")) != -1) {
        const int v = atoi(optarg);
        switch (opt) {
        case 't':
            threads = v;
            break;
        case 'c':
            ctx = v;
            break;
        case 'b':
            tokens = v;
            break;
        case 'p':
            chunk = v;
            break;
        case 'H':
            heads = v;
            break;
        case 'K':
            kvh = v;
            break;
        case 'd':
            hd = v;
            break;
        case 'r':
            reps = v;
            break;
        case 's':
            scale = (float)atof(optarg);
            break;
        default:
            fprintf(stderr,
                    "usage: %s [-t threads] [-c ctx] [-b tokens | -p rows] [-H heads] [-K kv_heads] [-d "
                    "head_dim] "
                    "[-r reps] [-s scale]\n",
                    argv[0]);
            return 2;
        }
    }
    if (chunk > 0) tokens = chunk;
    if (threads < 1 || ctx < 1 || tokens < 1 || heads < 1 || kvh < 1 || heads % kvh || hd < 1 || reps < 1 ||
        chunk > ctx) {
        fprintf(stderr, "bad sizes\n");
        return 2;
    }
    const int bs = 16, max_blocks = (ctx + bs - 1) / bs, n_blocks = max_blocks * (chunk ? 1 : tokens);
    const size_t row = (size_t)kvh * hd, cells = (size_t)n_blocks * bs * row;
    int32_t *table = malloc(sizeof(int32_t) * (size_t)n_blocks), *seq = malloc(sizeof(int32_t) * tokens),
            *pos = malloc(sizeof(int32_t) * tokens);
    float *q = malloc(sizeof(float) * (size_t)tokens * heads * hd),
          *out = malloc(sizeof(float) * (size_t)tokens * heads * hd);
    if (!table || !seq || !pos || !q || !out) return 1;
    for (int i = 0; i < n_blocks; i++) table[i] = i;
    double flop = 0;
    for (int t = 0; t < tokens; t++) {
        seq[t] = chunk ? 0 : t, pos[t] = chunk ? ctx - chunk + t : ctx - 1;
        flop += 4.0 * hd * heads * (pos[t] + 1);
    }
    for (size_t i = 0; i < (size_t)tokens * heads * hd; i++) q[i] = uniform_of(~(uint64_t)i);
    struct tpool *tp;
    if (tpool_init(&tp, threads)) return 1;
    printf("heads %d, kv heads %d, head_dim %d, context %d, %d %s, %d threads\n", heads, kvh, hd, ctx, tokens,
           chunk ? "rows of a prefill chunk" : "decode token(s)", threads);
    /* All four types' copies are filled first and the calls then go round the types, one call of each per
     * repetition, so that a burst of other work on the machine lands on every type, not on the one being
     * timed then. Run back to back, one type's calls took ~15 ms on the H200's host, and one type's best
     * moved by up to 1.6x between runs (kernels/cpu/NOTES.md, 2026-12-02i). */
    static const char *const names[4] = {"f32", "f16", "q8_0", "q8_0 planes"};
    const int n_el = hd % 32 ? KV_F16 + 1 : KV_Q8_0_PLANES + 1;
    int copies[4];
    void **k[4], **v[4];
    double *ms = malloc(sizeof(double) * 4 * (size_t)reps);
    if (!ms) return 1;
    for (int el = KV_F32; el < n_el; el++) {
        const size_t bytes = 2 * kv_elem_bytes((enum kv_elem)el, cells);
        copies[el] = (int)((512u << 20) / bytes) + 2;
        k[el] = calloc((size_t)copies[el], sizeof **k), v[el] = calloc((size_t)copies[el], sizeof **v);
        if (!k[el] || !v[el]) return 1;
        for (int c = 0; c < copies[el]; c++) {
            k[el][c] = malloc(bytes / 2), v[el][c] = malloc(bytes / 2);
            if (!k[el][c] || !v[el][c]) return 1;
            fill_copy((enum kv_elem)el, k[el][c], v[el][c], cells, c);
        }
    }
    for (int r = 0; r <= reps; r++)
        for (int el = KV_F32; el < n_el; el++) {
            const int c = r % copies[el];
            struct kv_layer_view kv = {.k = k[el][c],
                                       .v = v[el][c],
                                       .n_blocks = n_blocks,
                                       .block_size = bs,
                                       .block_table = table,
                                       .max_blocks = max_blocks,
                                       .n_kv_heads = kvh,
                                       .head_dim = hd,
                                       .elem = el};
            if (el == KV_Q8_0_PLANES) {
                kv.k_scale = (uint16_t *)((int8_t *)k[el][c] + cells);
                kv.v_scale = (uint16_t *)((int8_t *)v[el][c] + cells);
            }
            const double t0 = now_s();
            if (kern_cpu_attention(out, q, &kv, seq, pos, tokens, heads, scale, tp) != FERRY_OK) return 1;
            if (r > 0) ms[el * reps + r - 1] = (now_s() - t0) * 1e3; /* r = 0: warm-up */
        }
    for (int el = KV_F32; el < n_el; el++) {
        double *t = ms + el * reps;
        qsort(t, (size_t)reps, sizeof *t, cmp_double);
        const double best = t[0], med = reps % 2 ? t[reps / 2] : (t[reps / 2 - 1] + t[reps / 2]) / 2;
        const double bytes = 2 * kv_elem_bytes((enum kv_elem)el, cells);
        if (chunk)
            printf("%s KV: %8.3f ms per call (median %.3f), %6.1f GFLOP/s (%.1f MiB)\n", names[el], best, med,
                   flop / best / 1e6, bytes / 1048576.0);
        else
            printf("%s KV: %8.3f ms per call (median %.3f), %6.1f GB/s of K/V (%.1f MiB)\n", names[el], best,
                   med, (double)2 * tokens * kv_elem_bytes((enum kv_elem)el, (size_t)ctx * row) / best / 1e6,
                   bytes / 1048576.0);
        for (int c = 0; c < copies[el]; c++) free(k[el][c]), free(v[el][c]);
        free(k[el]);
        free(v[el]);
    }
    free(ms);
    tpool_free(tp);
    free(table), free(seq), free(pos), free(q), free(out);
    return 0;
}
