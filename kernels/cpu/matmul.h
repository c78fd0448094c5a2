/* matmul — y = x · Wᵀ (+ bias) on the CPU with the weight in its stored type.
 *
 * W is (n, k) row-major in any dtype of quant/dtype.h (quantized rows are blocks along k);
 * x is (m, k) f32, y is (m, n) f32, bias (n) f32 or NULL. Accumulation is in f32 or wider; the whole
 * weight is never expanded to f32 (rows are dequantized into a small per-thread buffer and reused for all m
 * rows of x). Work is split over output rows with the thread pool; deterministic for a given pool size.
 */
#ifndef FERRY_KERN_CPU_MATMUL_H
#define FERRY_KERN_CPU_MATMUL_H

#include <stdint.h>

#include "quant/dtype.h"

struct tpool;

/* Returns FERRY_ERR_INVALID on bad shape (k not a multiple of the block size, m/n/k <= 0). */
int kern_cpu_matmul(float *y, const float *x, const void *w, enum dtype wt, const float *bias, int m, int n,
                    int k, struct tpool *tp);

/* Several products sharing x (q/k/v, gate/up) in one dispatch of the pool: job j computes
 * jobs[j].y (m, n_j) = x (m, k) · W_jᵀ (+ bias). Each job's result is bitwise what kern_cpu_matmul gives; the
 * saving is the pool wake-ups and the tail imbalance of separate calls. At most KERN_CPU_MM_MAX_JOBS jobs. */
#define KERN_CPU_MM_MAX_JOBS 4
struct kern_cpu_mm {
    float *y;          /* (m, n) */
    const void *w;     /* (n, k) in wt */
    enum dtype wt;
    const float *bias; /* (n) or NULL */
    int n;
};
int kern_cpu_matmul_multi(const struct kern_cpu_mm *jobs, int n_jobs, const float *x, int m, int k, struct tpool *tp);

/* Reference: plain loops, each weight element dequantized through the type table (quant/dtype.h), double accumulation. */
int kern_cpu_matmul_ref(float *y, const float *x, const void *w, enum dtype wt, const float *bias, int m, int n,
                        int k);

#endif
