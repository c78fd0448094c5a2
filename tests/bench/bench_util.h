/* bench_util — what the CPU benches share: wall and process CPU clocks in seconds, and a xorshift64 stream of
 * uniform floats in [-1, 1) (the same sequence in every bench: the weights of a given shape are the same). */
#ifndef FERRY_BENCH_UTIL_H
#define FERRY_BENCH_UTIL_H

#include <stdint.h>
#include <time.h>

static inline double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* This process's CPU time: leaves out the time it was descheduled (see bench_cpu_matmul's first comment). */
static inline double cpu_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static uint64_t bench_rng = 88172645463325252ull;
static inline uint64_t next_u64(void)
{
    bench_rng ^= bench_rng << 13;
    bench_rng ^= bench_rng >> 7;
    bench_rng ^= bench_rng << 17;
    return bench_rng;
}
static inline float frand(void)
{
    return (float)((next_u64() >> 40) * 0x1.0p-24) * 2.0f - 1.0f;
}

#endif
