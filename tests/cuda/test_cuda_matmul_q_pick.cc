/* The CUDA block-type products' automatic choice (kernels/cuda/matmul_pick.h) on the CPU (no GPU needed; runs
 * in CI): every quantized type of the type table (quant/dtype.h) has block kernels (qblock.cuh's QB_TYPES,
 * the types kern_cuda_matmul reads: the engines keep each matrix in its stored type and refuse a type the
 * table lacks), and the choice multiplies each from its stored blocks: up to 32 rows of x the int8 paths
 * (dp4a GEMV, int8 MMA; for Q8_0 also its f16-x GEMV on the same blocks), never the f16-tile GEMM, and the
 * f16 pieces only from KERN_CUDA_W16_MIN_M rows. Q2_K, which once ran on the f16-tile GEMM at every m, takes
 * the int8 paths as the other K-quants do, and every variant applies to every type (none is switched off for
 * a type).
 */
#include <criterion/criterion.h>

#include "kernels/cuda/matmul_pick.h"
#include "kernels/cuda/qblock.cuh"

/* The types QB_TYPES lists, as dtype ids. */
static const enum dtype block_types[] = {
#define QP_TYPE(T, name, Q) DTYPE_##T,
    QB_TYPES(QP_TYPE)
#undef QP_TYPE
};
#define N_BLOCK_TYPES (int)(sizeof block_types / sizeof block_types[0])

static bool has_block_kernels(int t)
{
    for (int i = 0; i < N_BLOCK_TYPES; i++)
        if (block_types[i] == t) return true;
    return false;
}

/* Rows of x the checks walk: every m up to 160, then doublings and their neighbours up to 8192. */
static bool next_m(int *m)
{
    if (*m < 160)
        ++*m;
    else if (*m % 2 == 0)
        *m += 1;
    else
        *m = 2 * (*m - 1);
    return *m <= 8192;
}

Test(cuda_matmul_q_pick, every_quantized_type_has_block_kernels)
{
    int quantized = 0;
    for (int t = 0; t < DTYPE_COUNT; t++) {
        const struct dtype_traits *tr = dtype_get_traits((uint32_t)t);
        if (!tr) continue;
        cr_assert_eq(has_block_kernels(t), tr->is_quantized, "%s: block kernels %d, quantized %d", tr->name,
                     has_block_kernels(t), tr->is_quantized);
        quantized += tr->is_quantized;
        if (!tr->is_quantized)
            cr_assert_eq(kern_cuda_qmm_pick((enum dtype)t, 1), KERN_QV_AUTO, "%s", tr->name);
    }
    cr_assert_eq(quantized, N_BLOCK_TYPES);
    cr_assert_eq(kern_cuda_qmm_pick((enum dtype)5, 1), KERN_QV_AUTO, "not a type");
    cr_assert_eq(kern_cuda_qmm_pick((enum dtype)99, 1), KERN_QV_AUTO, "not a type");
}

Test(cuda_matmul_q_pick, every_type_stays_in_its_blocks)
{
    for (int i = 0; i < N_BLOCK_TYPES; i++) {
        const enum dtype t = block_types[i];
        int int8_max = 0;
        for (int m = 1; m <= 8192; next_m(&m)) {
            const int v = kern_cuda_qmm_pick(t, m);
            const enum kern_cuda_qpath p = kern_cuda_qmm_variant_path(v);
            cr_assert(kern_cuda_qmm_variant_applies(t, v), "%s m=%d: variant %d does not apply",
                      dtype_name(t), m, v);
            cr_assert(p != KERN_QPATH_NONE && p != KERN_QPATH_F16_TILES, "%s m=%d: variant %d (path %d)",
                      dtype_name(t), m, v, p);
            if (m < KERN_CUDA_W16_MIN_M)
                cr_assert(p == KERN_QPATH_INT8 || (p == KERN_QPATH_F16X && t == DTYPE_Q8_0),
                          "%s m=%d: variant %d decodes W to f16 below KERN_CUDA_W16_MIN_M", dtype_name(t), m,
                          v);
            if (p == KERN_QPATH_INT8 && m == int8_max + 1) int8_max = m;
        }
        cr_assert(int8_max >= 32 || t == DTYPE_Q8_0, "%s: the int8 paths stop at m = %d", dtype_name(t),
                  int8_max);
    }
}

/* The stream GEMV where bench_cuda --stream measured it fastest (an H100, 2026-12-07): decode steps of 1-4 rows
 * of the types it was timed on, Q6_K up to 8; 5-8 rows of the others and every larger step take the int8 MMA or
 * more, and the types it was not timed on never take it automatically. */
Test(cuda_matmul_q_pick, decode_steps_take_the_stream_gemv_where_measured)
{
    static const enum dtype timed[] = {DTYPE_Q4_0, DTYPE_Q8_0, DTYPE_Q4_K, DTYPE_Q5_K, DTYPE_Q6_K};
    for (int i = 0; i < 5; i++)
        for (int m = 1; m <= 64; m++) {
            const int top = timed[i] == DTYPE_Q6_K ? 8 : 4, v = kern_cuda_qmm_pick(timed[i], m);
            cr_assert_eq(v == KERN_QV_STREAM, m <= top, "%s m=%d: variant %d", dtype_name(timed[i]), m, v);
        }
    for (int i = 0; i < N_BLOCK_TYPES; i++) {
        int is_timed = 0;
        for (int j = 0; j < 5; j++) is_timed |= block_types[i] == timed[j];
        for (int m = 1; m <= 64 && !is_timed; m++)
            cr_assert_neq(kern_cuda_qmm_pick(block_types[i], m), KERN_QV_STREAM, "%s m=%d",
                          dtype_name(block_types[i]), m);
    }
}

/* Q2_K as Q4_K: dp4a at 1 row, the int8 MMA at 8 and 64 rows, and the f16 pieces only for prefill batches. */
Test(cuda_matmul_q_pick, q2_k_takes_the_int8_paths)
{
    const int ms[] = {1, 2, 3, 8, 16, 17, 33, 64, 100, 128};
    for (size_t i = 0; i < sizeof ms / sizeof ms[0]; i++) {
        const int v = kern_cuda_qmm_pick(DTYPE_Q2_K, ms[i]);
        cr_assert_eq(kern_cuda_qmm_variant_path(v), KERN_QPATH_INT8, "Q2_K m=%d: variant %d", ms[i], v);
        cr_assert_eq(ms[i] <= 2, v >= KERN_QV_DP4A_R1 && v <= KERN_QV_DP4A_R4, "Q2_K m=%d: variant %d", ms[i],
                     v);
    }
    cr_assert_eq(kern_cuda_qmm_pick(DTYPE_Q2_K, 512), KERN_QV_F16_PIECES);
}

Test(cuda_matmul_q_pick, every_variant_applies_to_every_type)
{
    for (int i = 0; i < N_BLOCK_TYPES; i++)
        for (int v = KERN_QV_AUTO + 1; v < KERN_QV_COUNT; v++)
            cr_assert_eq(kern_cuda_qmm_variant_applies(block_types[i], v),
                         v != KERN_QV_Q8OLD || block_types[i] == DTYPE_Q8_0, "%s variant %d",
                         dtype_name(block_types[i]), v);
    cr_assert(!kern_cuda_qmm_variant_applies(DTYPE_Q4_K, KERN_QV_AUTO));
    cr_assert(!kern_cuda_qmm_variant_applies(DTYPE_Q4_K, KERN_QV_COUNT));
    cr_assert_eq(kern_cuda_qmm_variant_path(KERN_QV_AUTO), KERN_QPATH_NONE);
    cr_assert_eq(kern_cuda_qmm_variant_path(KERN_QV_COUNT), KERN_QPATH_NONE);
    cr_assert_eq(kern_cuda_qmm_variant_path(KERN_QV_GEMM_C1 + KERN_CUDA_QGEMM_CONFIGS - 1),
                 KERN_QPATH_F16_TILES);
    cr_assert_eq(kern_cuda_qmm_variant_path(KERN_QV_MMA_32), KERN_QPATH_INT8);
}
