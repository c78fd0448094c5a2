/* gemv_stream — the index math of the bandwidth GEMV (gemv_stream.cu, KERN_QV_STREAM), host+device so that
 * tests/cuda/test_qblock.cc runs it on the CPU against chunks staged as the kernel stages them.
 *
 * A warp owns R rows of W at a time (a task) and walks their k in chunks of CB blocks per row, staged by
 * matmul_q_steps.cuh's qs_issue (rows of the chunk at STRIDE bytes, each keeping its address mod 16). All 32
 * lanes work on the same k range of the R rows: lane sl takes pieces sl, sl + 32, ... (PPL of them) of every
 * row, so the x values of a piece (M rows of int8 x, natural layout) are loaded once and multiply the R rows'
 * units while they are in registers. acc[c][r] (x row c, W row r) gets qb_dot's terms in unit order: the same
 * arithmetic as the dp4a GEMV (gq_lane_chunk), checked against the same exact-sum int8 reference.
 */
#ifndef FERRY_KERN_CUDA_GEMV_STREAM_CUH
#define FERRY_KERN_CUDA_GEMV_STREAM_CUH

#include "kernels/cuda/matmul_q_steps.cuh"

/* Rows of x per launch (larger m runs in row tiles of this size). */
#define GS_MAX_M 8

/* The chunk of R rows: PPL pieces per lane per row (2 for the small 32-blocks, so a row's chunk is ~1.1-1.7 KB
 * for every type), CB blocks per row, G its staging geometry, NST ring stages per warp (3 for 4 rows: a stage
 * of Q6_K is then 6.8 KB). */
template <class Q, int R> struct gs_shape {
    static constexpr int PPL = Q::PPB == 1 && Q::BYTES <= 24 ? 2 : 1;
    static constexpr int CB = 32 * PPL / Q::PPB;
    static_assert(CB >= 1 && CB * Q::PPB == 32 * PPL, "a chunk must split evenly over the lanes");
    using G = qs_geom<Q, R, CB>;
    static constexpr int NST = R >= 4 ? 3 : 4;
};

/* acc[c][r] += row r · x_c over the pieces of one staged chunk that lane sl takes. stage: the chunk's staging
 * area (row r at stage + r * stride), sh[r]: row r's block b0 offset in its staged row (its address mod 16);
 * nbc blocks in this chunk (lanes past them idle). xq (m, k) int8 and xd (m, k/32) x 4 floats {dx, Σx, Σxq
 * lo, Σxq hi}: row c of x at xq + xoff[c], xd + 4 * doff[c]. A piece is loaded once per unit it holds (UPP
 * loads, so that only one unit per row is live: R units in registers, not R x UPP). */
template <class Q, int M, int R, int PPL>
QB_FN void gs_lane_chunk(float (&acc)[M][R], const uint8_t *stage, int stride, const unsigned (&sh)[R], int b0,
                         int nbc, int sl, const int8_t *xq, const float *xd, const int (&xoff)[M],
                         const int (&doff)[M])
{
    QB_UNROLL
    for (int pp = 0; pp < PPL; pp++) {
        const int pi = sl + 32 * pp, bl = pi / Q::PPB, j = pi % Q::PPB;
        if (bl >= nbc) continue;
        QB_UNROLL
        for (int vv = 0; vv < Q::UPP; vv++) {
            qb_unit u[R];
            QB_UNROLL
            for (int r = 0; r < R; r++) {
                typename Q::raw raw;
                Q::load(raw, stage + r * stride + sh[r] + bl * Q::BYTES, j);
                Q::unit(raw, j, vv, u[r]);
            }
            const int e = (b0 + bl) * Q::QK + Q::unit_elem(j, vv);
            QB_UNROLL
            for (int c = 0; c < M; c++) {
                const qb_v4 a = qb_ldg128(xq + xoff[c] + e), b = qb_ldg128(xq + xoff[c] + e + 16);
                const uint32_t xw[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
                const qb_v4 d = qb_ldg128(xd + 4 * (doff[c] + e / 32));
                float dx, sx;
                memcpy(&dx, &d.x, 4);
                memcpy(&sx, &d.y, 4);
                QB_UNROLL
                for (int r = 0; r < R; r++) acc[c][r] = qb_dot<Q>(u[r], xw, dx, sx, (int)d.z, (int)d.w, acc[c][r]);
            }
        }
    }
}

#endif
