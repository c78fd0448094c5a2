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

/* The chunk of R rows: PPL pieces per lane per row (2 for the small 32-blocks, so a row's chunk is ~1.1-1.7
 * KB for every type), CB blocks per row, G its staging geometry, NST ring stages per warp (3 for 4 rows: a
 * stage of Q6_K is then 6.8 KB). */
template <class Q, int R> struct gs_shape {
    static constexpr int PPL = Q::PPB == 1 && Q::BYTES <= 24 ? 2 : 1;
    static constexpr int CB = 32 * PPL / Q::PPB;
    static_assert(CB >= 1 && CB * Q::PPB == 32 * PPL, "a chunk must split evenly over the lanes");
    using G = qs_geom<Q, R, CB>;
    static constexpr int NST = R >= 4 ? 3 : 4;
};

/* The x values of one unit of one row of x: its 32 int8 values and {dx, Σx, Σxq lo, Σxq hi}. */
struct gs_x {
    uint32_t w[8];
    qb_v4 d;
};
QB_FN void gs_load_x(gs_x &x, const int8_t *xq, const float *xd, int xoff, int doff, int e)
{
    const qb_v4 a = qb_ldg128(xq + xoff + e), b = qb_ldg128(xq + xoff + e + 16);
    x.w[0] = a.x, x.w[1] = a.y, x.w[2] = a.z, x.w[3] = a.w, x.w[4] = b.x, x.w[5] = b.y, x.w[6] = b.z,
    x.w[7] = b.w;
    x.d = qb_ldg128(xd + 4 * (doff + e / 32));
}
template <class Q> QB_FN float gs_dot(const qb_unit &u, const gs_x &x, float acc)
{
    float dx, sx;
    memcpy(&dx, &x.d.x, 4);
    memcpy(&sx, &x.d.y, 4);
    return qb_dot<Q>(u, x.w, dx, sx, (int)x.d.z, (int)x.d.w, acc);
}

/* acc[c][r] += row r · x_c over the pieces of one staged chunk that lane sl takes. stage: the chunk's staging
 * area (row r at stage + r * stride), sh[r]: row r's block b0 offset in its staged row (its address mod 16);
 * nbc blocks in this chunk (lanes past them idle). xq (m, k) int8 and xd (m, k/32) x 4 floats {dx, Σx, Σxq
 * lo, Σxq hi}: row c of x at xq + xoff[c], xd + 4 * doff[c]. Two orders, the same terms in the same order per
 * (c, r): up to 2 rows of x, the piece's x (UPP units x M rows, 12 registers each) is loaded first and each
 * row's piece once (its UPP units decoded from one load); from 4 rows of x, unit by unit, the R rows' units
 * decoded first (R units live, the piece loaded once per unit) and each x row loaded once for them. */
template <class Q, int M, int R, int PPL>
QB_FN void gs_lane_chunk(float (&acc)[M][R], const uint8_t *stage, int stride, const unsigned (&sh)[R],
                         int b0, int nbc, int sl, const int8_t *xq, const float *xd, const int (&xoff)[M],
                         const int (&doff)[M])
{
    QB_UNROLL
    for (int pp = 0; pp < PPL; pp++) {
        const int pi = sl + 32 * pp, bl = pi / Q::PPB, j = pi % Q::PPB;
        if (bl >= nbc) continue;
        if constexpr (M <= 2) {
            gs_x x[Q::UPP][M];
            QB_UNROLL
            for (int vv = 0; vv < Q::UPP; vv++) {
                const int e = (b0 + bl) * Q::QK + Q::unit_elem(j, vv);
                QB_UNROLL
                for (int c = 0; c < M; c++) gs_load_x(x[vv][c], xq, xd, xoff[c], doff[c], e);
            }
            QB_UNROLL
            for (int r = 0; r < R; r++) {
                typename Q::raw raw;
                Q::load(raw, stage + r * stride + sh[r] + bl * Q::BYTES, j);
                QB_UNROLL
                for (int vv = 0; vv < Q::UPP; vv++) {
                    qb_unit u;
                    Q::unit(raw, j, vv, u);
                    QB_UNROLL
                    for (int c = 0; c < M; c++) acc[c][r] = gs_dot<Q>(u, x[vv][c], acc[c][r]);
                }
            }
        } else {
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
                    gs_x x;
                    gs_load_x(x, xq, xd, xoff[c], doff[c], e);
                    QB_UNROLL
                    for (int r = 0; r < R; r++) acc[c][r] = gs_dot<Q>(u[r], x, acc[c][r]);
                }
            }
        }
    }
}

#endif
