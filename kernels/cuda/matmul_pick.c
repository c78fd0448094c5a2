/* matmul_pick — the automatic choice of the CUDA block-type products (see matmul_pick.h): one table of
 * measured entries per type, and one rule for the types without entries. Pure C: built with or without CUDA.
 */
#include "kernels/cuda/matmul_pick.h"

#include <limits.h>
#include <stddef.h>

/* Per type, entries in increasing m_max; the first entry with m <= m_max gives the variant, past a type's
 * last entry KERN_QV_F16_PIECES. The entries are bench_cuda --quant's "table lines", pasted from a GPU run
 * (NOTES.md, Version 8 and 9, say which): the best variant per type and m measured on the H200 (2026-12-02b)
 * over the Llama-2-7B layer shapes. The stream GEMV's entries (KERN_QV_STREAM, up to 4 rows, Q6_K up to 8) are
 * bench_cuda --stream's on an H100 (2026-12-07, NOTES.md Version 10, "Measured"): faster than the best of the
 * others by 1.06-1.26x (Q4_K, Q5_K, Q4_0, Q8_0) and 1.16-1.51x (Q6_K) at 1-4 rows, 0.74-0.97x at 8 rows
 * (1.05x for Q6_K); types it was not timed on keep their entries. */
struct qmm_pick {
    enum dtype t;
    int m_max;
    int variant;
};
static const struct qmm_pick qmm_picks[] = {
    {DTYPE_Q4_0, 4, KERN_QV_STREAM},
    {DTYPE_Q4_0, 32, KERN_QV_MMA_16},
    {DTYPE_Q4_0, 64, KERN_QV_MMA_32},
    {DTYPE_Q4_0, 512, KERN_QV_F16_PIECES},
    {DTYPE_Q4_1, 2, KERN_QV_DP4A_R1},
    {DTYPE_Q4_1, 32, KERN_QV_MMA_16},
    {DTYPE_Q4_1, 128, KERN_QV_MMA_32},
    {DTYPE_Q4_1, 512, KERN_QV_F16_PIECES},
    {DTYPE_Q5_0, 2, KERN_QV_DP4A_R1},
    {DTYPE_Q5_0, 3, KERN_QV_DP4A_R2},
    {DTYPE_Q5_0, 16, KERN_QV_MMA_16},
    {DTYPE_Q5_0, 64, KERN_QV_MMA_32},
    {DTYPE_Q5_0, 512, KERN_QV_F16_PIECES},
    {DTYPE_Q5_1, 2, KERN_QV_DP4A_R1},
    {DTYPE_Q5_1, 16, KERN_QV_MMA_16},
    {DTYPE_Q5_1, 128, KERN_QV_MMA_32},
    {DTYPE_Q5_1, 512, KERN_QV_F16_PIECES},
    {DTYPE_Q8_0, 4, KERN_QV_STREAM},
    {DTYPE_Q8_0, 32, KERN_QV_MMA_16},
    {DTYPE_Q8_0, 64, KERN_QV_MMA_32},
    {DTYPE_Q8_0, 512, KERN_QV_F16_PIECES},
    {DTYPE_Q4_K, 4, KERN_QV_STREAM},
    {DTYPE_Q4_K, 32, KERN_QV_MMA_16},
    {DTYPE_Q4_K, 128, KERN_QV_MMA_32},
    {DTYPE_Q4_K, 512, KERN_QV_F16_PIECES},
    {DTYPE_Q5_K, 4, KERN_QV_STREAM},
    {DTYPE_Q5_K, 32, KERN_QV_MMA_16},
    {DTYPE_Q5_K, 64, KERN_QV_MMA_32},
    {DTYPE_Q5_K, 512, KERN_QV_F16_PIECES},
    {DTYPE_Q6_K, 8, KERN_QV_STREAM},
    {DTYPE_Q6_K, 16, KERN_QV_MMA_16},
    {DTYPE_Q6_K, 32, KERN_QV_MMA_32},
    {DTYPE_Q6_K, 512, KERN_QV_F16_PIECES},
    /* MXFP4 stays on the int8 paths at every m: the only ones a GPU run has checked for its byte-aligned
     * blocks so far, and gpt-oss's experts multiply few rows each. */
    {DTYPE_MXFP4, 2, KERN_QV_DP4A_R1},
    {DTYPE_MXFP4, INT_MAX, KERN_QV_MMA_32},
};

int kern_cuda_qmm_pick(enum dtype t, int m)
{
    const struct dtype_traits *tr = dtype_get_traits((uint32_t)t);
    if (!tr || !tr->is_quantized) return KERN_QV_AUTO;
    int listed = 0;
    for (size_t i = 0; i < sizeof qmm_picks / sizeof qmm_picks[0]; i++) {
        listed |= qmm_picks[i].t == t;
        if (qmm_picks[i].t == t && m <= qmm_picks[i].m_max) return qmm_picks[i].variant;
    }
    /* Types not measured yet (Q2_K, Q3_K and the lookup-table types of qblock_lut.cuh): the shape most
     * measured types share, dp4a for 1-2 rows, the int8 MMA up to 128, then f16 pieces. */
    if (!listed && m <= 2) return KERN_QV_DP4A_R1;
    if (!listed && m <= 32) return KERN_QV_MMA_16;
    if (!listed && m <= 128) return KERN_QV_MMA_32;
    return KERN_QV_F16_PIECES;
}

int kern_cuda_qmm_variant_applies(enum dtype t, int variant)
{
    if (variant <= KERN_QV_AUTO || variant >= KERN_QV_COUNT) return 0;
    return variant != KERN_QV_Q8OLD || t == DTYPE_Q8_0;
}

enum kern_cuda_qpath kern_cuda_qmm_variant_path(int variant)
{
    if ((variant >= KERN_QV_DP4A_R1 && variant <= KERN_QV_MMA_32) || variant == KERN_QV_STREAM)
        return KERN_QPATH_INT8;
    if (variant >= KERN_QV_GEMM && variant < KERN_QV_Q8OLD) return KERN_QPATH_F16_TILES;
    if (variant == KERN_QV_Q8OLD) return KERN_QPATH_F16X;
    if (variant == KERN_QV_F16_PIECES) return KERN_QPATH_F16_PIECES;
    return KERN_QPATH_NONE;
}
