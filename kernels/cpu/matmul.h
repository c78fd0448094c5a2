/* matmul — y = x · Wᵀ (+ bias) on the CPU with the weight in its stored type.
 *
 * W is (n, k) row-major in any dtype of quant/dtype.h (quantized rows are blocks along k);
 * x is (m, k) f32, y is (m, n) f32, bias (n) f32 or NULL. The whole weight is never expanded: blocks are
 * decoded into a small per-thread tile and reused for all m rows of x. Plain types (F32/F16/BF16) multiply in
 * f32. Quantized types multiply in f32 too (KERN_CPU_ACT_F32), or, with KERN_CPU_ACT_INT8, quantize x once
 * per product to int8 blocks of 32 (one f32 scale each) and take integer dot products, as llama.cpp does:
 * |y - exact| <= Σ_blocks (max|x_block| / 254)·Σ|w_block| + f32 rounding (matmul.c's first comment).
 * Work is split over output rows with the thread pool. Results are bitwise the same whatever the pool size;
 * for quantized types also whatever instruction set runs them (kern_cpu_isa), and with the int8 arithmetic
 * whatever m (a row of a batch equals the row alone); with the f32 arithmetic and plain types, whatever m
 * only under kern_cpu_matmul_set_invariant.
 */
#ifndef FERRY_KERN_CPU_MATMUL_H
#define FERRY_KERN_CPU_MATMUL_H

#include <stdint.h>

#include "quant/dtype.h"

struct tpool;

/* Returns FERRY_ERR_INVALID on bad shape (k not a multiple of the block size, m/n/k <= 0), FERRY_ERR_NOMEM
 * when the calling thread's buffer for the quantized x (about 2.25 bytes per element of x, kept for the
 * thread's later products and freed when it exits) cannot grow. */
int kern_cpu_matmul(float *y, const float *x, const void *w, enum dtype wt, const float *bias, int m, int n,
                    int k, struct tpool *tp);

/* Several products sharing x (q/k/v, gate/up) in one dispatch of the pool: job j computes
 * jobs[j].y (m, n_j) = x (m, k) · W_jᵀ (+ bias). Each job's result is bitwise what kern_cpu_matmul gives; the
 * saving is the pool wake-ups and the tail imbalance of separate calls. At most KERN_CPU_MM_MAX_JOBS jobs. */
#define KERN_CPU_MM_MAX_JOBS 4
struct kern_cpu_mm {
    float *y;      /* (m, n) */
    const void *w; /* (n, k) in wt */
    enum dtype wt;
    const float *bias; /* (n) or NULL */
    int n;
};
int kern_cpu_matmul_multi(const struct kern_cpu_mm *jobs, int n_jobs, const float *x, int m, int k,
                          struct tpool *tp);

/* The arithmetic of products with quantized weights (process-wide; plain types always multiply in f32). */
enum kern_cpu_act {
    KERN_CPU_ACT_F32,  /* x in f32 times the dequantized weights, f32 sums (exact x: the golden oracle) */
    KERN_CPU_ACT_INT8, /* x quantized to int8 blocks of 32, integer dot products: llama.cpp's arithmetic (and
                        * the GPU's), 1.2-1.7x the f32 rate (kernels/cpu/NOTES.md); adds x's rounding to the
                        * error (SmolLM2-135M Q4_1 then answers "What is the capital of France?" with
                        * "L'Étoile...": the CPU engine keeps f32 by default except on K-quant files,
                        * runtime/engine.c) */
    KERN_CPU_ACT_COUNT,
};
/* Sets the arithmetic of this thread's later products. The build's default is KERN_CPU_ACT_DEFAULT
 * (KERN_CPU_ACT_F32 unless defined otherwise). */
void kern_cpu_matmul_set_act(enum kern_cpu_act act);
enum kern_cpu_act kern_cpu_matmul_act(void);

/* The arithmetic of products with F16 or BF16 weights (per thread, as kern_cpu_matmul_set_act). */
enum kern_cpu_plain {
    KERN_CPU_PLAIN_F32,  /* f32 products and sums (the default: exact inputs) */
    KERN_CPU_PLAIN_BF16, /* on a CPU with AMX (Sapphire Rapids and later), products of KERN_CPU_AMX_M_MIN rows
                          * of x or more take x and W rounded to bf16 on the AMX tiles, f32 sums
                          * (kernels/cpu/matmul_amx.h: relative 2^-8 of Σ|w·x|); elsewhere, and below that
                          * many rows, f32. FERRY_NO_AMX in the environment turns the tiles off. */
};
/* From 32 rows the tiles beat f32 (a 7B F16 layer on the host at 32 tokens: 11.5-12.2 ms against 22-25; at 16
 * they were even, 10.0-11.6 against 10.0-10.2: kernels/cpu/NOTES.md, 2026-12-06b). */
#define KERN_CPU_AMX_M_MIN 32
/* Sets the plain types' arithmetic of this thread's later products. */
void kern_cpu_matmul_set_plain(enum kern_cpu_plain p);
enum kern_cpu_plain kern_cpu_matmul_plain(void);
/* 1 when this process can use the AMX tiles (the CPU has them and the OS granted them). */
int kern_cpu_amx_available(void);

/* Batch invariance of this thread's later products (default off): on, row i of a batch is bitwise the product
 * of that row alone for every type and arithmetic. The int8 arithmetic always is; what the switch changes:
 *  - quantized types in f32 arithmetic past MR (4) rows keep the per-block factored sums of decode
 *    (t = Σ code·x, acc += s·t) instead of going back to the f32 tile (w = s·code, Σ w·x, fewer operations);
 *  - plain types past STREAM_M_MAX (16) rows stream whole rows as smaller batches do, instead of summing
 *    chunks of the tile's KC columns separately (which rounds otherwise when k > KC);
 *  - F16/BF16 products do not go to the AMX tiles.
 * The cost is in prefill-sized products (kernels/cpu/NOTES.md, 2026-12-07 batch invariance): Q4_1/Q8_0 at
 * 64 rows 1.2-1.4x with AVX-512, about 3x with AVX2 only; decode-sized ones are unchanged or faster. */
void kern_cpu_matmul_set_invariant(int on);

/* The instruction sets the quantized products can run on; the best the CPU has is chosen at run time. */
enum kern_cpu_isa {
    KERN_CPU_ISA_PORTABLE,   /* plain C */
    KERN_CPU_ISA_AVX2,       /* AVX2 + FMA + F16C: pmaddubsw */
    KERN_CPU_ISA_AVXVNNI,    /* AVX-VNNI (VEX vpdpbusd on 256 bits: Alder Lake, Sapphire Rapids, Zen 5) */
    KERN_CPU_ISA_AVX512VNNI, /* AVX512-VNNI with VL (EVEX vpdpbusd: Ice Lake server and later, Zen 4) */
    KERN_CPU_ISA_COUNT,
};
/* The best set this CPU supports (cpuid, with the OS's register state). */
enum kern_cpu_isa kern_cpu_isa_best(void);
/* The set products use now: the best, capped by kern_cpu_isa_limit (AVX-VNNI steps down to AVX2 on a CPU
 * that has only AVX512-VNNI). */
enum kern_cpu_isa kern_cpu_isa_current(void);
/* Caps the set for later products (tests, comparisons; not while products run); returns the one in effect. */
enum kern_cpu_isa kern_cpu_isa_limit(enum kern_cpu_isa max);
/* "avx512-vnni", ...; "?" for anything else. */
const char *kern_cpu_isa_name(enum kern_cpu_isa isa);
/* The set of that name (kern_cpu_isa_name's), or -1. */
int kern_cpu_isa_parse(const char *name);

/* Reference: plain loops, each weight element dequantized through the type table (quant/dtype.h), double
 * accumulation. */
int kern_cpu_matmul_ref(float *y, const float *x, const void *w, enum dtype wt, const float *bias, int m,
                        int n, int k);

#endif
