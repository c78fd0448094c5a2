/* bench_cpu_moe — one MoE layer's experts on the host (kern_cpu_moe_ffn) at a few token counts (not a test).
 *
 * The layer: n_expert experts of gate and up (ffn, dim) in one type and down (dim, ffn) in another, by
 * default Qwen3-30B-A3B's shape in its Q4_K_M mix as tests/gpu/make_moe_gguf.py writes it (128 experts,
 * 8 per token, dim 2048, ffn 768, Q4_K gate/up, Q6_K down). Every call routes each token to k distinct
 * experts drawn at random, so that a layer of 128 experts (393 MiB) is read from memory, not the caches.
 * For each n (tokens): the median and the best µs of the calls, the weight bytes the call read (the chosen
 * experts' three matrices, each expert once), those bytes per µs (MB/s... here GB/s = bytes/ns), and that
 * rate as a share of the machine's read ceiling: a streaming read of a 256 MiB buffer by the same pool
 * (vector sums, every thread a contiguous slice), measured first.
 * --act picks the products' arithmetic (f32, int8, or both: one line each).
 * Usage: bench_cpu_moe [-t threads] [-n 1,4,16] [-E 128] [-k 8] [-d 2048] [-f 768] [-G Q4_K] [-D Q6_K]
 *        [-r reps] [--act f32|int8|both]
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_util.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/moe.h"
#include "kernels/cpu/threadpool.h"
#include "quant/dequant.h"
#include "quant/dtype.h"

/* n_expert stacked (rows, cols) matrices of type t: the first expert quantized from uniform floats, the
 * others its copies (the time does not depend on the values; quantizing 393 MiB would take minutes). */
static void *make_stack(enum dtype t, int n_expert, int rows, int cols)
{
    const size_t rb = dtype_row_size(t, cols), each = rb * rows;
    uint8_t *w = aligned_alloc(64, (each * n_expert + 63) / 64 * 64);
    float *row = malloc(sizeof(float) * cols);
    if (!w || !row) return NULL;
    for (int r = 0; r < rows; r++) {
        for (int i = 0; i < cols; i++) row[i] = frand() * 0.1f;
        if (quant_row(t, row, w + rb * r, cols)) return NULL;
    }
    for (int e = 1; e < n_expert; e++) memcpy(w + each * e, w, each);
    free(row);
    return w;
}

struct read_job {
    const float *p;
    size_t n;
    int n_tasks;
    float sums[1024];
};
static void read_task(void *arg, int t)
{
    struct read_job *j = arg;
    const size_t lo = j->n * t / j->n_tasks / 64 * 64, hi = j->n * (t + 1) / j->n_tasks / 64 * 64;
    typedef float v16 __attribute__((vector_size(64)));
    v16 a = {0}, b = {0}, c = {0}, d = {0};
    for (size_t i = lo; i < hi; i += 64) {
        a += *(const v16 *)(j->p + i), b += *(const v16 *)(j->p + i + 16);
        c += *(const v16 *)(j->p + i + 32), d += *(const v16 *)(j->p + i + 48);
    }
    a += b + c + d;
    float s = 0;
    for (int l = 0; l < 16; l++) s += a[l];
    j->sums[t] = s;
}

/* GB/s of a streaming read of 256 MiB by the pool, the best of 5. */
static double read_ceiling(struct tpool *tp)
{
    const size_t n = (size_t)64 << 20;
    float *p = aligned_alloc(64, n * sizeof(float));
    if (!p) return 0;
    for (size_t i = 0; i < n; i++) p[i] = (float)(i & 7);
    struct read_job *j = calloc(1, sizeof *j);
    j->p = p, j->n = n, j->n_tasks = tpool_size(tp);
    double best = 1e9;
    for (int r = 0; r < 5; r++) {
        const double t0 = now_s();
        tpool_run(tp, read_task, j, j->n_tasks);
        const double dt = now_s() - t0;
        best = dt < best ? dt : best;
    }
    free(j), free(p);
    return n * sizeof(float) / best * 1e-9;
}

static int cmp_double(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv)
{
    int threads = 2, n_expert = 128, k = 8, dim = 2048, ffn = 768, reps = 40, ns[16] = {1, 4, 16}, n_ns = 3;
    enum dtype gt = DTYPE_Q4_K, dt = DTYPE_Q6_K;
    const char *act = "both";
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v) {
            fprintf(stderr, "%s: missing value\n", a);
            return 2;
        }
        i++;
        if (!strcmp(a, "-t"))
            threads = atoi(v);
        else if (!strcmp(a, "-E"))
            n_expert = atoi(v);
        else if (!strcmp(a, "-k"))
            k = atoi(v);
        else if (!strcmp(a, "-d"))
            dim = atoi(v);
        else if (!strcmp(a, "-f"))
            ffn = atoi(v);
        else if (!strcmp(a, "-r"))
            reps = atoi(v);
        else if (!strcmp(a, "--act"))
            act = v;
        else if (!strcmp(a, "-G") || !strcmp(a, "-D")) {
            const int t = dtype_from_name(v);
            if (t < 0) {
                fprintf(stderr, "unknown type %s\n", v);
                return 2;
            }
            *(a[1] == 'G' ? &gt : &dt) = (enum dtype)t;
        } else if (!strcmp(a, "-n")) {
            n_ns = 0;
            for (char *s = (char *)v; *s && n_ns < 16;
                 s = strchr(s, ',') ? strchr(s, ',') + 1 : s + strlen(s))
                ns[n_ns++] = atoi(s);
        } else {
            fprintf(stderr, "unknown option %s\n", a);
            return 2;
        }
    }
    if (k < 1 || k > n_expert || reps < 2 || threads < 1) return 2;
    struct tpool *tp;
    if (tpool_init(&tp, threads)) return 1;
    const double ceil_gbs = read_ceiling(tp);
    void *g = make_stack(gt, n_expert, ffn, dim), *u = make_stack(gt, n_expert, ffn, dim),
         *d = make_stack(dt, n_expert, dim, ffn);
    if (!g || !u || !d) return 1;
    const size_t e_bytes = 2 * dtype_row_size(gt, dim) * ffn + dtype_row_size(dt, ffn) * dim;
    const struct kern_cpu_moe_experts ex = {.gate = g,
                                            .up = u,
                                            .down = d,
                                            .gate_t = gt,
                                            .up_t = gt,
                                            .down_t = dt,
                                            .n_expert = n_expert,
                                            .dim = dim,
                                            .ffn = ffn};
    printf(
        "# %d threads, %d experts (%d per token), dim %d, ffn %d, %s gate/up, %s down: %.2f MiB per expert; "
        "read ceiling %.1f GB/s\n",
        threads, n_expert, k, dim, ffn, dtype_name(gt), dtype_name(dt), e_bytes / 1048576.0, ceil_gbs);
    printf("%-5s %4s %10s %10s %9s %8s %7s %10s\n", "act", "n", "med_us", "best_us", "MB_read", "GB/s",
           "ceil%", "cpu_us");
    for (int a = 0; a < 2; a++) {
        if (strcmp(act, "both") && strcmp(act, a ? "int8" : "f32")) continue;
        kern_cpu_matmul_set_act(a ? KERN_CPU_ACT_INT8 : KERN_CPU_ACT_F32);
        for (int ni = 0; ni < n_ns; ni++) {
            const int n = ns[ni];
            if (n < 1) continue;
            float *x = malloc(sizeof(float) * n * dim), *y = malloc(sizeof(float) * n * dim),
                  *w = malloc(sizeof(float) * n * k),
                  *ws = malloc(sizeof(float) * kern_cpu_moe_ws_floats(&ex, n));
            int32_t *ids = malloc(sizeof(int32_t) * n * k);
            unsigned char *used = malloc(n_expert);
            double *ts = malloc(sizeof(double) * reps), bytes = 0, cpu_best = 1e9;
            for (int i = 0; i < n * dim; i++) x[i] = frand();
            for (int i = 0; i < n * k; i++) w[i] = 1.0f / k;
            for (int r = -2; r < reps; r++) {
                memset(used, 0, n_expert);
                for (int t = 0; t < n; t++)
                    for (int j = 0; j < k; j++) {
                        int e;
                        int dup;
                        do {
                            e = (int)(next_u64() % (uint64_t)n_expert);
                            dup = 0;
                            for (int i = 0; i < j; i++) dup |= ids[t * k + i] == e;
                        } while (dup);
                        ids[t * k + j] = e;
                        used[e] = 1;
                    }
                const double t0 = now_s(), c0 = cpu_s();
                if (kern_cpu_moe_ffn(y, x, ids, w, n, k, &ex, ws, tp)) return 1;
                const double dts = now_s() - t0, dc = cpu_s() - c0;
                if (r < 0) continue;
                cpu_best = dc < cpu_best ? dc : cpu_best;
                ts[r] = dts;
                int c = 0;
                for (int e = 0; e < n_expert; e++) c += used[e];
                bytes += (double)c * e_bytes;
            }
            qsort(ts, reps, sizeof *ts, cmp_double);
            const double med = ts[reps / 2], mb = bytes / reps / 1e6, gbs = bytes / reps / med * 1e-9;
            printf("%-5s %4d %10.1f %10.1f %9.2f %8.2f %6.0f%% %10.1f\n", a ? "int8" : "f32", n, med * 1e6,
                   ts[0] * 1e6, mb, gbs, 100 * gbs / ceil_gbs, cpu_best * 1e6);
            fflush(stdout);
            free(x), free(y), free(w), free(ws), free(ids), free(used), free(ts);
        }
    }
    tpool_free(tp);
    free(g), free(u), free(d);
    return 0;
}
