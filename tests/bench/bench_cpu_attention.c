/* bench_cpu_attention — decode attention over a long context with the KV cache in f32, f16 and Q8_0, the last
 * both in blocks and split into code and scale planes as the GPU's cache holds it (not a test). One sequence
 * of `ctx` positions, `tokens` decode rows of other sequences of the same length (a batch of decodes),
 * heads/kv heads/head_dim of a model; best of `reps` calls after a warm-up; K/V rotate over
 * copies of at least 512 MiB so no call finds them in cache. Prints ms per call and the K/V read rate.
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
    for (size_t i = 0; i < (size_t)tokens * heads * hd; i++)
        q[i] = (float)((i * 2654435761u) % 2001) / 1000.0f - 1.0f;
    struct tpool *tp;
    if (tpool_init(&tp, threads)) return 1;
    printf("heads %d, kv heads %d, head_dim %d, context %d, %d %s, %d threads\n", heads, kvh, hd, ctx, tokens,
           chunk ? "rows of a prefill chunk" : "decode token(s)", threads);
    static const char *const names[4] = {"f32", "f16", "q8_0", "q8_0 planes"};
    for (int el = KV_F32; el <= KV_Q8_0_PLANES; el++) {
        if (el >= KV_Q8_0 && hd % 32) break;
        const size_t bytes = 2 * kv_elem_bytes((enum kv_elem)el, cells);
        const int copies = (int)((512u << 20) / bytes) + 2;
        void **k = calloc((size_t)copies, sizeof *k), **v = calloc((size_t)copies, sizeof *v);
        for (int c = 0; c < copies; c++) {
            k[c] = malloc(bytes / 2), v[c] = malloc(bytes / 2);
            float *vals = malloc(sizeof(float) * 32);
            if (!k[c] || !v[c] || !vals) return 1;
            for (size_t i = 0; i < cells; i += 32) {
                const size_t n = cells - i < 32 ? cells - i : 32;
                for (size_t e = 0; e < n; e++)
                    vals[e] = (float)(((i + e + c) * 40503u) % 2001) / 1000.0f - 1.0f;
                if (el == KV_Q8_0) {
                    dtype_from_f32(DTYPE_Q8_0, vals, (uint8_t *)k[c] + i / 32 * 34, 32);
                    dtype_from_f32(DTYPE_Q8_0, vals, (uint8_t *)v[c] + i / 32 * 34, 32);
                } else if (el == KV_Q8_0_PLANES) { /* the codes, then the scales (cells / 32 f16) */
                    struct block_q8_0 b;
                    dtype_from_f32(DTYPE_Q8_0, vals, &b, 32);
                    memcpy((int8_t *)k[c] + i, b.qs, 32), memcpy((int8_t *)v[c] + i, b.qs, 32);
                    memcpy((uint8_t *)k[c] + cells + i / 32 * 2, &b.d, 2);
                    memcpy((uint8_t *)v[c] + cells + i / 32 * 2, &b.d, 2);
                } else
                    for (size_t e = 0; e < n; e++)
                        if (el == KV_F16)
                            ((uint16_t *)k[c])[i + e] = ((uint16_t *)v[c])[i + e] = f32_to_f16(vals[e]);
                        else
                            ((float *)k[c])[i + e] = ((float *)v[c])[i + e] = vals[e];
            }
            free(vals);
        }
        double best = 1e30;
        for (int r = 0; r <= reps; r++) {
            const int c = r % copies;
            struct kv_layer_view kv = {.k = k[c],
                                       .v = v[c],
                                       .n_blocks = n_blocks,
                                       .block_size = bs,
                                       .block_table = table,
                                       .max_blocks = max_blocks,
                                       .n_kv_heads = kvh,
                                       .head_dim = hd,
                                       .elem = el};
            if (el == KV_Q8_0_PLANES) {
                kv.k_scale = (uint16_t *)((int8_t *)k[c] + cells);
                kv.v_scale = (uint16_t *)((int8_t *)v[c] + cells);
            }
            const double t0 = now_s();
            if (kern_cpu_attention(out, q, &kv, seq, pos, tokens, heads, scale, tp) != FERRY_OK) return 1;
            const double dt = now_s() - t0;
            if (r > 0 && dt < best) best = dt; /* r = 0: warm-up */
        }
        if (chunk)
            printf("%s KV: %8.3f ms per call, %6.1f GFLOP/s (%.1f MiB)\n", names[el], best * 1e3,
                   flop / best / 1e9, bytes / 1048576.0);
        else
            printf("%s KV: %8.3f ms per call, %6.1f GB/s of K/V (%.1f MiB)\n", names[el], best * 1e3,
                   (double)2 * tokens * kv_elem_bytes((enum kv_elem)el, (size_t)ctx * row) / best / 1e9,
                   bytes / 1048576.0);
        for (int c = 0; c < copies; c++) free(k[c]), free(v[c]);
        free(k);
        free(v);
    }
    tpool_free(tp);
    free(table), free(seq), free(pos), free(q), free(out);
    return 0;
}
