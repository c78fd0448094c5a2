/* kt_common — helpers shared by the kernel tests: a seeded RNG, committed-fixture loading, and the
 * element-wise tolerance check |got - ref| <= atol + rtol * |ref| that reports the worst element. */
#ifndef FERRY_TESTS_KT_COMMON_H
#define FERRY_TESTS_KT_COMMON_H

#include <criterion/criterion.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static uint64_t kt_rng_state = 0x9E3779B97F4A7C15ull;

static inline void kt_seed(uint64_t s)
{
    kt_rng_state = s * 0x9E3779B97F4A7C15ull + 1;
}

static inline uint64_t kt_next(void)
{
    uint64_t z = (kt_rng_state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* Uniform in [lo, hi). */
static inline float kt_uniform(float lo, float hi)
{
    return lo + (hi - lo) * (float)((kt_next() >> 40) * 0x1.0p-24);
}

static inline void kt_fill(float *x, size_t n, float lo, float hi)
{
    for (size_t i = 0; i < n; i++) x[i] = kt_uniform(lo, hi);
}

/* Reads tests/kernels/data/<name> (committed, found through FERRY_SRC). Returns NULL and sets *len = 0
 * when the file is absent; the caller skips with a message. */
static inline void *kt_load(const char *name, size_t *len)
{
    const char *src = getenv("FERRY_SRC");
    char path[4096];
    snprintf(path, sizeof path, "%s/tests/kernels/data/%s", src ? src : ".", name);
    *len = 0;
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    void *p = malloc(n > 0 ? (size_t)n : 1);
    if (p && fread(p, 1, (size_t)n, f) != (size_t)n) {
        free(p);
        p = NULL;
    }
    fclose(f);
    if (p) *len = (size_t)n;
    return p;
}

#define KT_LOAD(var, name, len)                                                                              \
    do {                                                                                                     \
        var = kt_load(name, &(len));                                                                         \
        if (!(var)) cr_skip_test("missing FILE: tests/kernels/data/%s (run make_quant_fixtures.py)", name);  \
    } while (0)

/* A fixture's blocks and their f32 values: tests/kernels/data/<name>.blocks into blocks (nb bytes) and
 * <name>.deq into deq (nd bytes); skips the test when either is missing. */
#define KT_LOAD_BLOCKS(blocks, deq, name, nb, nd)                                                            \
    do {                                                                                                     \
        char kt_fb_[96], kt_fd_[96];                                                                         \
        snprintf(kt_fb_, sizeof kt_fb_, "%s.blocks", name);                                                  \
        snprintf(kt_fd_, sizeof kt_fd_, "%s.deq", name);                                                     \
        KT_LOAD(blocks, kt_fb_, nb);                                                                         \
        KT_LOAD(deq, kt_fd_, nd);                                                                            \
    } while (0)

/* Asserts every element is within atol + rtol*|ref|; names the worst element on failure. */
static inline void kt_check_close(const char *what, const float *got, const float *ref, size_t n, double atol,
                                  double rtol)
{
    size_t worst = 0;
    double worst_excess = -1e300;
    int bad = 0;
    for (size_t i = 0; i < n; i++) {
        const double err = fabs((double)got[i] - (double)ref[i]);
        const double tol = atol + rtol * fabs((double)ref[i]);
        if (!(err <= tol)) bad++;
        const double excess = isnan(err) ? 1e300 : err - tol;
        if (excess > worst_excess) {
            worst_excess = excess;
            worst = i;
        }
    }
    cr_assert(bad == 0,
              "%s: %d of %zu elements out of tolerance (atol %g, rtol %g); worst [%zu] got %.9g ref %.9g",
              what, bad, n, atol, rtol, worst, (double)got[worst], (double)ref[worst]);
}

#endif
