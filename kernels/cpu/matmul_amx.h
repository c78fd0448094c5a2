/* matmul_amx — y = x · Wᵀ on Intel AMX tiles in bf16, for plain F16/BF16 weights and x of many rows.
 *
 * Internal to kernels/cpu/matmul.c (which chooses it: kern_cpu_matmul_set_plain). x (m, k) f32 is packed once
 * per product into bf16 B tiles (amx_pack_x, spread over the pool by row groups). A task (at most
 * AMX_TASK_ROWS weight rows) walks k in chunks of AMX_KC: it converts each block of AMX_WB rows' chunk to
 * bf16 (L1) and multiplies it by every pair of x groups of the panel (L2) with TDPBF16PS into f32 sums that
 * wait in an L2 buffer between chunks. Each output element is one tile element's sequence of operations in k
 * order, so the results do not depend on the pool size, the partition or the other rows of x. Error against
 * exact f32: x and W each rounded to bf16 (relative 2^-9, to nearest even), products exact, f32 sums: |y - Σ
 * w·x| <= (2^-8 + 2^-16)·Σ|w·x| + ~k·2^-24·Σ|w·x| (inputs' and outputs' denormals flushed).
 */
#ifndef FERRY_KERN_CPU_MATMUL_AMX_H
#define FERRY_KERN_CPU_MATMUL_AMX_H

#include <stddef.h>
#include <stdint.h>

#include "quant/dtype.h"

#define AMX_WB        32  /* weight rows converted and multiplied at a time (two tiles of 16) */
#define AMX_KC        512 /* columns of a converted chunk: AMX_WB x AMX_KC bf16 = 32 KiB, in L1 */
#define AMX_XP        512 /* rows of x per panel: a task's sums (its rows, AMX_XP) f32 stay in L2 */
#define AMX_TASK_ROWS 128 /* most weight rows per task: (128, AMX_XP) f32 = 256 KiB of sums */

/* 1 when the CPU has AMX-BF16 and AVX512-BF16 and the kernel granted this process the tile state (asked
 * once, process-wide). */
int amx_available(void);

/* Bytes of x packed for m rows and k columns (rows rounded up to 32, columns to 32). */
size_t amx_x_bytes(int m, int k);
/* The calling thread's buffer for x packed (amx_x_bytes; kept for its later products), or NULL. */
uint16_t *amx_x_buffer(int m, int k);
/* Packs rows [g_lo*16, g_hi*16) of x (m, k) f32 into xp (amx_x_bytes): B tiles of 16 rows of x by 32
 * columns, bf16 pairs (tile row p holds columns 2p, 2p+1 of each of the 16 rows); rows past m and columns
 * past k are zero. Groups are independent: the pool packs them in parallel. */
void amx_pack_x(const float *x, int m, int k, uint16_t *xp, int g_lo, int g_hi);
/* y rows [0, m) x columns [j_lo, j_hi) (y is (m, ldy)) = x · W[j_lo..j_hi)ᵀ, W (n, k) F16 or BF16 with rows
 * row_bytes apart, x packed by amx_pack_x. Overwrites y. Returns FERRY_ERR_NOMEM when the thread's buffer
 * (the converted chunk and the range's sums, kept for its later products) cannot grow. */
int amx_matmul_rows(const uint16_t *xp, int m, int k, const uint8_t *w, enum dtype wt, size_t row_bytes,
                    int j_lo, int j_hi, float *y, int ldy);

#endif
