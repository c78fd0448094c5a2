/* matmul_pick — which kernel a CUDA product with GGUF block weights runs, by weight type and rows of x: the
 * automatic choice of kernels/cuda/matmul.cu, as a pure function of (type, m) with no CUDA in it, so that it
 * is built in every configuration and CPU tests hold the policy (tests/cuda/test_cuda_matmul_q_pick.cc).
 *
 * The policy: every block type is multiplied from its stored blocks. Up to 32 rows of x (decode steps and
 * small batches) only the int8 paths run (x quantized to int8 per block of 32, W's blocks decoded in
 * registers: the dp4a GEMV, the int8 tensor-core skinny GEMM), or for Q8_0 at 3 rows its f16-x GEMV on the
 * same blocks. From KERN_CUDA_W16_MIN_M rows (prefill) a type may take the f16 pieces instead, where measured
 * faster: W's rows decoded to f16 into the context's bounded piece buffer (at most KERN_CUDA_W16_MAX_BYTES,
 * whatever the model) one piece at a time for cuBLAS; the weights themselves stay in their blocks, resident
 * or in the streaming ring. The f16-tile GEMM is never the automatic choice (matmul.cu runs it only when a
 * context's workspace cannot hold one tile of the int8 paths' x). Types without measurements take the shape
 * most measured types share.
 */
#ifndef FERRY_KERN_CUDA_MATMUL_PICK_H
#define FERRY_KERN_CUDA_MATMUL_PICK_H

#ifdef __cplusplus
extern "C" {
#endif

#include "quant/dtype.h"

/* The kernels the automatic choice picks from (NOTES.md, Version 8, says where the table's entries come
 * from). */
enum kern_cuda_qvariant {
    KERN_QV_AUTO = 0,
    KERN_QV_DP4A_R1, /* dp4a GEMV, 1 row of W per warp */
    KERN_QV_DP4A_R2, /* 2 rows per warp (lanes of different rows share x loads) */
    KERN_QV_DP4A_R4, /* 4 rows per warp */
    KERN_QV_MMA_16,  /* int8 MMA, 16 rows of W per warp, 4 ring stages */
    KERN_QV_MMA_32,  /* 32 rows per warp (x fragments shared by two row tiles), 3 stages */
    KERN_QV_GEMM,    /* f16 GEMM, tile by m and n (gemm_q.cu's gm_pick) */
    KERN_QV_GEMM_C1, /* f16 GEMM, configuration 1 .. KERN_CUDA_QGEMM_CONFIGS (gemm_q.cu's GM_CONFIGS) */
    KERN_QV_Q8OLD = KERN_QV_GEMM_C1 + 12, /* kern_cuda_gemv_q8 (f16 x, f16 MMA), Q8_0 only */
    KERN_QV_F16_PIECES, /* W decoded to f16 in pieces of rows (the context's piece buffer), then cuBLAS */
    KERN_QV_STREAM,     /* bandwidth GEMV, 1..8 rows of x per launch, R rows of W per warp sharing each x load
                           (gemv_stream.cu) */
    KERN_QV_COUNT
};
#define KERN_CUDA_QGEMM_CONFIGS 12

/* The arithmetic of a variant and where W's values live while it runs. */
enum kern_cuda_qpath {
    KERN_QPATH_NONE = 0,  /* KERN_QV_AUTO or out of range */
    KERN_QPATH_INT8,      /* dp4a GEMV, int8 MMA: blocks decoded in registers, x in int8 per block of 32 */
    KERN_QPATH_F16X,      /* KERN_QV_Q8OLD: Q8_0 blocks in registers, x in f16 */
    KERN_QPATH_F16_TILES, /* the f16-tile GEMM: blocks decoded into shared memory as f16, x in f16 */
    KERN_QPATH_F16_PIECES /* W's rows decoded to f16 in the context's piece buffer, then cuBLAS */
};

/* The smallest m at which the choice may give KERN_QV_F16_PIECES (engines size the piece buffer by it:
 * kernels/cuda/matmul.h's kern_cuda_w16_bytes). */
#define KERN_CUDA_W16_MIN_M 33

/* The variant the automatic choice gives block type t at m rows of x (m >= 1; never KERN_QV_AUTO);
 * KERN_QV_AUTO when t is not a block type. */
int kern_cuda_qmm_pick(enum dtype t, int m);
/* 1 when variant v can multiply block type t: every variant except KERN_QV_Q8OLD (Q8_0 only). */
int kern_cuda_qmm_variant_applies(enum dtype t, int variant);
/* The path variant v runs on (KERN_QPATH_NONE for KERN_QV_AUTO and values out of range). */
enum kern_cuda_qpath kern_cuda_qmm_variant_path(int variant);

#ifdef __cplusplus
}
#endif

#endif
