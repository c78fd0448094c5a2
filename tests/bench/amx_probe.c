/* amx_probe — can this process use Intel AMX, and at what rate? (x86-64 Linux, GCC >= 11)
 *
 *   gcc -O2 -mamx-tile -mamx-int8 -mamx-bf16 -pthread tests/bench/amx_probe.c -o amx_probe && ./amx_probe
 * [threads]
 *
 * Asks the kernel for the tile data state (arch_prctl ARCH_REQ_XCOMP_PERM), then per thread runs TDPBSSD
 * (int8) and TDPBF16PS (bf16) on tiles in registers (peak), and an int8 product that streams its A tiles from
 * a 256 MiB buffer (16 rows of 64 bytes each, the layout a weight matrix would be repacked into) against one
 * B tile: the rate a memory-bound decode product could reach. Prints GOP/s (2 ops per multiply-add) and GB/s.
 */
#include <immintrin.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA  18

struct tilecfg {
    uint8_t palette, start;
    uint8_t rsv[14];
    uint16_t colsb[16];
    uint8_t rows[16];
};

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static void config(void)
{
    struct tilecfg c;
    memset(&c, 0, sizeof c);
    c.palette = 1;
    for (int i = 0; i < 8; i++) c.colsb[i] = 64, c.rows[i] = 16;
    _tile_loadconfig(&c);
}

enum { N_PEAK = 2000000 };
static int8_t *big;
static size_t big_bytes = (size_t)256 << 20;
static int n_threads = 1;
struct res {
    double int8_s, bf16_s, stream_s;
    size_t stream_bytes;
};

static void *run(void *arg)
{
    struct res *r = arg;
    config();
    static __thread int8_t a[16 * 64] __attribute__((aligned(64))), b[16 * 64] __attribute__((aligned(64)));
    static __thread int32_t c[16 * 16] __attribute__((aligned(64)));
    for (int i = 0; i < 16 * 64; i++) a[i] = (int8_t)(i * 7), b[i] = (int8_t)(i * 3);
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    _tile_loadd(4, a, 64);
    _tile_loadd(5, b, 64);
    _tile_loadd(6, b, 64);
    _tile_loadd(7, a, 64);
    /* Four independent accumulators (tiles 0-3) from two A and two B tiles, N_PEAK times; seconds into dst. */
#define PEAK(op, dst)                                                                                        \
    do {                                                                                                     \
        const double t0 = now();                                                                             \
        for (int i = 0; i < N_PEAK; i++) {                                                                   \
            op(0, 4, 6);                                                                                     \
            op(1, 4, 7);                                                                                     \
            op(2, 5, 6);                                                                                     \
            op(3, 5, 7);                                                                                     \
        }                                                                                                    \
        _tile_stored(0, c, 64);                                                                              \
        (dst) = now() - t0;                                                                                  \
    } while (0)
    PEAK(_tile_dpbssd, r->int8_s);
    PEAK(_tile_dpbf16ps, r->bf16_s);
#undef PEAK
    return NULL;
}

struct sarg {
    struct res *r;
    int t;
};
static void *stream(void *arg)
{
    struct sarg *s = arg;
    config();
    static __thread int32_t c[16 * 16] __attribute__((aligned(64)));
    const size_t per = big_bytes / n_threads / 1024 * 1024;
    const int8_t *p = big + per * s->t;
    _tile_zero(0);
    _tile_zero(1);
    _tile_loadd(6, p, 64); /* B: stands for 16 rows of x, kept in a tile */
    double t0 = now();
    for (int rep = 0; rep < 4; rep++)
        for (size_t o = 0; o + 2048 <= per; o += 2048) {
            _tile_loadd(4, p + o, 64);
            _tile_loadd(5, p + o + 1024, 64);
            _tile_dpbssd(0, 4, 6);
            _tile_dpbssd(1, 5, 6);
        }
    _tile_stored(0, c, 64);
    s->r->stream_s = now() - t0;
    s->r->stream_bytes = per * 4;
    return NULL;
}

int main(int argc, char **argv)
{
    n_threads = argc > 1 ? atoi(argv[1]) : 1;
    if (n_threads < 1 || n_threads > 256) return 2;
    long rc = syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA);
    printf("arch_prctl(ARCH_REQ_XCOMP_PERM, XTILEDATA) = %ld%s\n", rc, rc ? " (AMX refused)" : " (granted)");
    if (rc) return 1;
    big = aligned_alloc(64, big_bytes);
    for (size_t i = 0; i < big_bytes; i++) big[i] = (int8_t)(i * 13);
    struct res *r = calloc((size_t)n_threads, sizeof *r);
    pthread_t *th = calloc((size_t)n_threads, sizeof *th);
    for (int t = 0; t < n_threads; t++) pthread_create(&th[t], NULL, run, &r[t]);
    for (int t = 0; t < n_threads; t++) pthread_join(th[t], NULL);
    double ops = 4.0 * N_PEAK * 16 * 16 * 64 * 2, i8 = 0, bf = 0;
    for (int t = 0; t < n_threads; t++) i8 += ops / r[t].int8_s, bf += ops / 2 / r[t].bf16_s;
    printf("%d threads, tiles in registers: int8 %.1f TOP/s, bf16 %.1f TFLOP/s (sum over threads)\n",
           n_threads, i8 / 1e12, bf / 1e12);
    struct sarg *sa = calloc((size_t)n_threads, sizeof *sa);
    for (int t = 0; t < n_threads; t++)
        sa[t] = (struct sarg){&r[t], t}, pthread_create(&th[t], NULL, stream, &sa[t]);
    double gbs = 0, mx = 0;
    for (int t = 0; t < n_threads; t++) {
        pthread_join(th[t], NULL);
        if (r[t].stream_s > mx) mx = r[t].stream_s;
        gbs += r[t].stream_bytes;
    }
    printf(
        "%d threads, int8 A tiles streamed from a 256 MiB buffer against one B tile: %.1f GB/s, %.1f TOP/s\n",
        n_threads, gbs / mx / 1e9, gbs / 1024 * 16 * 16 * 64 * 2 / mx / 1e12);
    return 0;
}
