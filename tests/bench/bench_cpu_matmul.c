/* bench_cpu_matmul — weight-read rate of kern_cpu_matmul per stored type and batch size (not a test).
 *
 * For each thread count, first the ceiling: a streaming read (vector sums, 4 streams per thread, with and
 * without software prefetch, the better) of a 256 MiB buffer with the same pool. Then for each type and m
 * (rows of x), y (m, n) = x (m, k) · Wᵀ, best of a few timed calls after a warm-up: ms per call, GB/s of
 * weight bytes (n * row_bytes per call), that rate as a share of the ceiling, GFLOP/s, and t/t1, the call's
 * time over the first m's call (m = 1: 16 single-token steps cost 16); last, the median call's GB/s (the
 * best call flatters a product that sometimes finds the memory idle). Each call reads a different copy of
 * the weight from a rotation of at least 512 MiB, so no call finds its weight in cache. The last column, cpu
 * ms, is the least process CPU time of a call: on a machine shared with other work it leaves out the time
 * this process was descheduled, which the wall times do not. Use it with -t 1 (Linux adds the pool threads'
 * running time to the process clock only when they stop or at a tick, so it undercounts them).
 * --hot uses one copy (weights from cache: the kernel's compute rate; with -t 1 and a small n, the run to
 * give valgrind --tool=callgrind for instruction counts per weight byte).
 *
 * Quantized types run in the arithmetic --act names (f32, int8, or both: one line each) on the instruction
 * set --isa caps (portable, avx2, avx-vnni, avx512-vnni; default: the best the CPU has). F16 and BF16 run
 * in the arithmetic --plain names (f32, bf16: AMX tiles where the CPU has them, from KERN_CPU_AMX_M_MIN rows;
 * or both).
 * Usage: bench_cpu_matmul [-t 1,2] [-m 1,2,4,16,64] [-T Q8_0,Q4_K] [-n 4096] [-k 4096] [-r reps] [--hot]
 *        [--no-ceiling] [--act f32|int8|both] [--plain f32|bf16|both] [--isa NAME]
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_util.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/threadpool.h"
#include "quant/dequant.h"
#include "quant/dtype.h"
#include "quant/fp16.h"

/* (n, k) of type t quantized from uniform floats by quant's reference quantizers; the types without one (the
 * i-quants but IQ4_NL/IQ4_XS, NVFP4): random bytes (every grid index and sign) with an f16 scale of 0.005
 * where the block starts with one, NVFP4's four scales below 1. */
static uint8_t *make_weight(enum dtype t, int n, int k)
{
    const size_t rb = dtype_row_size(t, k), bsz = dtype_type_size(t);
    uint8_t *w = aligned_alloc(64, (rb * n + 63) / 64 * 64);
    float *row = malloc(sizeof(float) * k);
    for (int j = 0; j < n; j++) {
        uint8_t *wr = w + rb * j;
        for (int i = 0; i < k; i++) row[i] = frand();
        if (quant_row(t, row, wr, k) == 0) continue;
        for (size_t b = 0; b < rb; b++) wr[b] = (uint8_t)(frand() * 1e6f);
        const uint16_t d = f32_to_f16(0.005f);
        for (size_t b = 0; b + bsz <= rb; b += bsz) {
            if (t == DTYPE_NVFP4)
                for (int e = 0; e < 4; e++) wr[b + e] %= 0x38;
            else if (t != DTYPE_IQ1_M)
                memcpy(wr + b, &d, 2);
        }
    }
    free(row);
    return w;
}

struct bw_ctx {
    const float *a;
    int64_t n;
    int n_threads;
    int prefetch; /* also ask for the lines 4 KiB ahead of each stream (into L2), as the kernels do */
    float sink[256];
};

typedef float v8f __attribute__((vector_size(32)));

/* Each thread reads its contiguous slice in 64 KiB pieces, each as 4 concurrent 16 KiB streams (the pattern
 * of a product reading 4 weight rows at a time, which the prefetchers serve best). */
static void bw_task(void *arg, int t)
{
    struct bw_ctx *c = arg;
    const int64_t piece = 16384, q = piece / 4;
    const int64_t lo = c->n * t / c->n_threads / piece * piece,
                  hi = c->n * (t + 1) / c->n_threads / piece * piece;
    v8f s0 = {0}, s1 = {0}, s2 = {0}, s3 = {0};
    for (int64_t b = lo; b < hi; b += piece) {
        const float *p0 = c->a + b, *p1 = p0 + q, *p2 = p1 + q, *p3 = p2 + q;
        for (int64_t i = 0; i < q; i += 8) {
            if (c->prefetch && (i & 15) == 0) {
                __builtin_prefetch(p0 + i + 1024, 0, 2), __builtin_prefetch(p1 + i + 1024, 0, 2);
                __builtin_prefetch(p2 + i + 1024, 0, 2), __builtin_prefetch(p3 + i + 1024, 0, 2);
            }
            s0 += *(const v8f *)(p0 + i);
            s1 += *(const v8f *)(p1 + i);
            s2 += *(const v8f *)(p2 + i);
            s3 += *(const v8f *)(p3 + i);
        }
    }
    const v8f s = s0 + s1 + s2 + s3;
    c->sink[t & 255] = s[0] + s[7];
}

/* Best-of-7 streaming read rate in GB/s, the better of plain loads and loads with software prefetch. */
static double read_bandwidth(struct tpool *tp)
{
    const int64_t n = 64ll << 20; /* 256 MiB of f32 */
    float *a = aligned_alloc(64, (size_t)n * 4);
    if (!a) return 0;
    for (int64_t i = 0; i < n; i++) a[i] = (float)(i & 7);
    struct bw_ctx c = {.a = a, .n = n, .n_threads = tpool_size(tp)};
    double best = 1e9;
    for (int r = 0; r < 14; r++) {
        c.prefetch = r & 1;
        const double t0 = now_s();
        tpool_run(tp, bw_task, &c, c.n_threads);
        const double dt = now_s() - t0;
        if (dt < best) best = dt;
    }
    free(a);
    return (double)n * 4 / best * 1e-9;
}

/* Comma-separated ints into v (at most cap); returns the count. */
static int parse_ints(const char *s, int *v, int cap)
{
    int n = 0;
    while (*s && n < cap) {
        v[n++] = (int)strtol(s, (char **)&s, 10);
        if (*s == ',')
            s++;
        else
            break;
    }
    return n;
}

static double load_avg(void)
{
    double l = -1;
    FILE *f = fopen("/proc/loadavg", "r");
    if (f) {
        if (fscanf(f, "%lf", &l) != 1) l = -1;
        fclose(f);
    }
    return l;
}

int main(int argc, char **argv)
{
    int threads[8] = {1, 2}, n_thr = 2;
    int ms[32] = {1, 2, 4, 8, 16, 64}, n_m = 6;
    enum dtype types[DTYPE_COUNT] = {DTYPE_F16,  DTYPE_BF16, DTYPE_Q8_0, DTYPE_Q4_0, DTYPE_Q4_1,
                                     DTYPE_Q5_0, DTYPE_Q5_1, DTYPE_Q4_K, DTYPE_Q5_K, DTYPE_Q6_K};
    int n_types = 10, n = 4096, k = 4096, reps = 0, hot = 0, ceiling = 1;
    int act_lo = KERN_CPU_ACT_F32, act_hi = KERN_CPU_ACT_INT8;
    int plain_lo = KERN_CPU_PLAIN_F32, plain_hi = KERN_CPU_PLAIN_BF16;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : "";
        if (!strcmp(a, "-t"))
            n_thr = parse_ints(v, threads, 8), i++;
        else if (!strcmp(a, "-m"))
            n_m = parse_ints(v, ms, 32), i++;
        else if (!strcmp(a, "-n"))
            n = atoi(v), i++;
        else if (!strcmp(a, "-k"))
            k = atoi(v), i++;
        else if (!strcmp(a, "-r"))
            reps = atoi(v), i++;
        else if (!strcmp(a, "--hot"))
            hot = 1;
        else if (!strcmp(a, "--no-ceiling"))
            ceiling = 0;
        else if (!strcmp(a, "--act")) {
            act_lo = strcmp(v, "int8") ? KERN_CPU_ACT_F32 : KERN_CPU_ACT_INT8;
            act_hi = strcmp(v, "f32") ? KERN_CPU_ACT_INT8 : KERN_CPU_ACT_F32;
            i++;
        } else if (!strcmp(a, "--plain")) {
            plain_lo = strcmp(v, "bf16") ? KERN_CPU_PLAIN_F32 : KERN_CPU_PLAIN_BF16;
            plain_hi = strcmp(v, "f32") ? KERN_CPU_PLAIN_BF16 : KERN_CPU_PLAIN_F32;
            i++;
        } else if (!strcmp(a, "--isa")) {
            const int isa = kern_cpu_isa_parse(v);
            if (isa < 0) {
                fprintf(stderr, "unknown instruction set %s\n", v);
                return 2;
            }
            kern_cpu_isa_limit((enum kern_cpu_isa)isa);
            i++;
        } else if (!strcmp(a, "-T")) {
            n_types = 0;
            char buf[256];
            snprintf(buf, sizeof buf, "%s", v);
            for (char *tok = strtok(buf, ","); tok && n_types < DTYPE_COUNT; tok = strtok(NULL, ",")) {
                const int t = dtype_from_name(tok);
                if (t < 0) {
                    fprintf(stderr, "unknown type %s\n", tok);
                    return 2;
                }
                types[n_types++] = (enum dtype)t;
            }
            i++;
        } else {
            fprintf(stderr,
                    "usage: %s [-t 1,2] [-m 1,2,4] [-T Q8_0,Q4_K] [-n N] [-k K] [-r reps] [--hot] "
                    "[--no-ceiling]\n",
                    argv[0]);
            fprintf(stderr, "       [--act f32|int8|both] [--plain f32|bf16|both] "
                            "[--isa portable|avx2|avx-vnni|avx512-vnni]\n");
            return 2;
        }
    }
    double ceil_gbs[8] = {0};
    if (ceiling)
        for (int ci = 0; ci < n_thr; ci++) {
            struct tpool *tp = NULL;
            if (tpool_init(&tp, threads[ci]) != 0) return 1;
            ceil_gbs[ci] = read_bandwidth(tp);
            printf("ceiling: streaming read with %d thread(s): %.2f GB/s (load %.2f)\n", tpool_size(tp),
                   ceil_gbs[ci], load_avg());
            tpool_free(tp);
        }
    printf("quantized types on %s; AMX tiles %s\n", kern_cpu_isa_name(kern_cpu_isa_current()),
           kern_cpu_amx_available() ? "available" : "not available");
    printf("%-5s %4s %3s %5s %5s %3s %9s %8s %5s %8s %6s %5s %8s %8s\n", "type", "act", "m", "n", "k", "thr",
           "ms/call", "GB/s(W)", "%ceil", "GFLOP/s", "t/t1", "load", "med GB/s", "cpu ms");
    int max_m = 1;
    for (int i = 0; i < n_m; i++) max_m = ms[i] > max_m ? ms[i] : max_m;
    float *x = malloc(sizeof(float) * max_m * k), *y = malloc(sizeof(float) * max_m * n);
    for (int i = 0; i < max_m * k; i++) x[i] = frand();
    for (int ti = 0; ti < n_types; ti++) {
        const enum dtype t = types[ti];
        if (k % dtype_block_size(t)) continue;
        const size_t wsize = dtype_row_size(t, k) * (size_t)n;
        const int n_copies = hot ? 1 : (int)((512u << 20) / wsize) + 1;
        uint8_t **w = malloc(sizeof(*w) * n_copies);
        w[0] = make_weight(t, n, k);
        for (int cp = 1; cp < n_copies; cp++) {
            w[cp] = aligned_alloc(64, (wsize + 63) / 64 * 64);
            memcpy(w[cp], w[0], wsize);
            /* One changed byte per page: copies that are not identical pages (a hypervisor may merge those).
             * For quantized types this changes a quant or a scale, which does not matter here. */
            for (size_t b = 0; b < wsize; b += 4096) w[cp][b] ^= (uint8_t)cp;
        }
        int rot = 0;
        const int q = dtype_get_traits(t)->is_quantized;
        const int plain = t == DTYPE_F16 || t == DTYPE_BF16;
        for (int act = q ? act_lo : plain ? plain_lo : 0; act <= (q ? act_hi : plain ? plain_hi : 0); act++)
            for (int ci = 0; ci < n_thr; ci++) {
                if (q)
                    kern_cpu_matmul_set_act((enum kern_cpu_act)act);
                else
                    kern_cpu_matmul_set_plain((enum kern_cpu_plain)act);
                struct tpool *tp = NULL;
                if (tpool_init(&tp, threads[ci]) != 0) return 1;
                double t1 = 0;
                for (int mi = 0; mi < n_m; mi++) {
                    const int m = ms[mi];
                    kern_cpu_matmul(y, x, w[rot++ % n_copies], t, NULL, m, n, k, tp); /* warm-up */
                    double best = 1e9, best_cpu = 1e9;
                    const int r_n = reps > 0 ? reps : m <= 4 ? 20 : m <= 16 ? 8 : 4;
                    double *times = malloc(sizeof(double) * r_n);
                    for (int r = 0; r < r_n; r++) {
                        const double t0 = now_s(), c0 = cpu_s();
                        kern_cpu_matmul(y, x, w[rot++ % n_copies], t, NULL, m, n, k, tp);
                        const double dt = now_s() - t0, dc = cpu_s() - c0;
                        if (dc < best_cpu) best_cpu = dc;
                        if (dt < best) best = dt;
                        int p = r; /* insertion: times[0..r] sorted */
                        for (; p > 0 && times[p - 1] > dt; p--) times[p] = times[p - 1];
                        times[p] = dt;
                    }
                    const double med = times[r_n / 2];
                    free(times);
                    if (m == ms[0]) t1 = best * ms[0];
                    const double gbs = (double)wsize / best * 1e-9;
                    printf("%-5s %4s %3d %5d %5d %3d %9.3f %8.2f %5.0f %8.1f %6.2f %5.2f %8.2f %8.3f\n",
                           dtype_name(t),
                           !q                         ? (act == KERN_CPU_PLAIN_BF16 ? "bf16" : "f32")
                           : act == KERN_CPU_ACT_INT8 ? "int8"
                                                      : "f32",
                           m, n, k, tpool_size(tp), best * 1e3, gbs,
                           ceil_gbs[ci] > 0 ? 100 * gbs / ceil_gbs[ci] : 0, 2.0 * m * n * k / best * 1e-9,
                           t1 > 0 ? best / t1 : 0, load_avg(), (double)wsize / med * 1e-9, best_cpu * 1e3);
                    fflush(stdout);
                }
                tpool_free(tp);
            }
        for (int cp = 0; cp < n_copies; cp++) free(w[cp]);
        free(w);
    }
    free(x);
    free(y);
    return 0;
}
