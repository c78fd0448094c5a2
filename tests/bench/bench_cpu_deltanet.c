/* bench_cpu_deltanet — the gated delta rule of one linear-attention layer over a prompt, token by token
 * (kern_cpu_dn_recurrent) and by chunks (kern_cpu_dn_chunked), on random data (not a test). Best and median
 * of `reps` calls after a warm-up; prints ms per call and tokens/s. The state is read and written once per
 * token by the recurrence (n_v * head_k * head_v floats), once per chunk by the chunked form. Then decode:
 * one token on each of 1 and of 16 sequences, each on its own state taken in turn from a pool of 256 MiB of
 * states (so that each call reads its state from memory, as a model's layers do between tokens), with the
 * state bytes read and written per second; and the ops around the rule (convolution, the L2 norms of q and
 * k, the gated output norm) over the prompt.
 * Usage: bench_cpu_deltanet [-t threads] [-n tokens] [-K key_heads] [-V value_heads] [-d head_dim] [-c chunk]
 * [-r reps] (defaults: Qwen3.5-27B's linear layers, 16 key and 48 value heads of 128; 512 tokens, chunks of
 * 64, 2 threads, 5 reps).
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "kernels/cpu/deltanet.h"
#include "kernels/cpu/threadpool.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int cmp(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv)
{
    int threads = 2, n = 512, nk = 16, nv = 48, hd = 128, chunk = 64, reps = 5, c;
    while ((c = getopt(argc, argv, "t:n:K:V:d:c:r:")) != -1) {
        const int v = atoi(optarg);
        if (v <= 0) return 2;
        switch (c) {
        case 't':
            threads = v;
            break;
        case 'n':
            n = v;
            break;
        case 'K':
            nk = v;
            break;
        case 'V':
            nv = v;
            break;
        case 'd':
            hd = v;
            break;
        case 'c':
            chunk = v;
            break;
        case 'r':
            reps = v > 64 ? 64 : v;
            break;
        default:
            return 2;
        }
    }
    if (nv % nk) return 2;
    const struct kern_dn_dims d = {.n_k_heads = nk, .n_v_heads = nv, .head_k = hd, .head_v = hd};
    const int stride = 2 * nk * hd + nv * hd;
    float *row = malloc(sizeof(float) * (size_t)n * stride), *g = malloc(sizeof(float) * (size_t)n * nv),
          *beta = malloc(sizeof(float) * (size_t)n * nv), *o = malloc(sizeof(float) * (size_t)n * nv * hd),
          *S = calloc((size_t)nv * hd * hd, sizeof(float)),
          *ws = malloc(sizeof(float) * kern_cpu_dn_chunk_ws_floats(&d, chunk));
    if (!row || !g || !beta || !o || !S || !ws) return 1;
    uint64_t s = 0x9e3779b97f4a7c15ull;
    for (size_t i = 0; i < (size_t)n * stride; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        row[i] = (float)((s >> 40) * 0x1.0p-24) - 0.5f;
    }
    for (int t = 0; t < n; t++) kern_cpu_dn_l2norm(row + (size_t)t * stride, 2 * nk, hd, hd, 1e-6f, 1.0f);
    for (size_t i = 0; i < (size_t)n * nv; i++) g[i] = -0.05f - 0.001f * (float)(i % 97), beta[i] = 0.5f;
    struct tpool *tp = NULL;
    if (tpool_init(&tp, threads)) return 1;
    const struct kern_dn_seq sq = {.q = row,
                                   .k = row + nk * hd,
                                   .v = row + 2 * nk * hd,
                                   .stride = stride,
                                   .g = g,
                                   .beta = beta,
                                   .o = o,
                                   .n = n};
    printf("gated delta rule, %d tokens, %d key / %d value heads of %d, %d threads\n", n, nk, nv, hd,
           tpool_size(tp));
    for (int form = 0; form < 2; form++) {
        double t[65];
        for (int r = 0; r <= reps; r++) {
            memset(S, 0, sizeof(float) * (size_t)nv * hd * hd);
            const double t0 = now_s();
            if (form == 0)
                kern_cpu_dn_recurrent(&sq, &d, S, tp);
            else
                kern_cpu_dn_chunked(&sq, &d, S, chunk, ws, tp);
            t[r] = now_s() - t0;
        }
        qsort(t + 1, (size_t)reps, sizeof *t, cmp);
        printf("  %-22s best %8.2f ms  median %8.2f ms  %9.0f tokens/s\n",
               form == 0 ? "token by token" : "chunked", t[1] * 1e3, t[1 + reps / 2] * 1e3, n / t[1]);
        if (form == 1) printf("  (chunks of %d)\n", chunk);
    }
    /* Decode from states in memory. */
    const size_t sfl = (size_t)nv * hd * hd, npool = (256u << 20) / (sfl * sizeof(float)) + 1;
    float *pool = malloc(sizeof(float) * sfl * npool);
    if (!pool) return 1;
    for (size_t i = 0; i < sfl * npool; i++) pool[i] = 1e-3f * (float)(i % 101);
    for (int seqs = 1; seqs <= 16; seqs += 15) {
        struct kern_dn_seq one = sq;
        one.n = 1;
        double t[65];
        size_t at = 0;
        for (int r = 0; r <= reps; r++) {
            const double t0 = now_s();
            for (int q = 0; q < 32; q++)
                for (int i = 0; i < seqs; i++, at = (at + 1) % npool)
                    kern_cpu_dn_recurrent(&one, &d, pool + at * sfl, tp);
            t[r] = (now_s() - t0) / 32;
        }
        qsort(t + 1, (size_t)reps, sizeof *t, cmp);
        printf("  decode, %2d sequence%s  best %8.3f ms  median %8.3f ms  state %6.1f GB/s read + written\n",
               seqs, seqs > 1 ? "s" : " ", t[1] * 1e3, t[1 + reps / 2] * 1e3,
               2.0 * seqs * sfl * sizeof(float) / t[1] * 1e-9);
    }
    free(pool);
    /* The ops around the rule: the convolution (width 4) over q | k | v, the L2 norms, the gated norm. */
    {
        const int width = 4;
        float *w = malloc(sizeof(float) * (size_t)stride * width),
              *cst = calloc((size_t)stride * (width - 1), sizeof(float)),
              *z = malloc(sizeof(float) * (size_t)n * nv * hd), *nw = malloc(sizeof(float) * hd);
        if (!w || !cst || !z || !nw) return 1;
        for (size_t i = 0; i < (size_t)stride * width; i++) w[i] = 0.01f * (float)(i % 13) - 0.06f;
        for (size_t i = 0; i < (size_t)n * nv * hd; i++) z[i] = 0.02f * (float)(i % 17) - 0.15f, o[i] = 0.1f;
        for (int i = 0; i < hd; i++) nw[i] = 1.0f + 0.01f * i;
        double t[65];
        for (int r = 0; r <= reps; r++) {
            const double t0 = now_s();
            kern_cpu_dn_conv(row, row, n, stride, w, width, cst);
            for (int i = 0; i < n; i++)
                kern_cpu_dn_l2norm(row + (size_t)i * stride, 2 * nk, hd, hd, 1e-6f, 1.0f);
            kern_cpu_dn_gated_norm(o, z, nw, n * nv, hd, 1e-6f);
            t[r] = now_s() - t0;
        }
        qsort(t + 1, (size_t)reps, sizeof *t, cmp);
        printf("  conv + norms, %d tokens best %8.2f ms  median %8.2f ms\n", n, t[1] * 1e3,
               t[1 + reps / 2] * 1e3);
        free(w), free(cst), free(z), free(nw);
    }
    tpool_free(tp);
    free(row), free(g), free(beta), free(o), free(S), free(ws);
    return 0;
}
