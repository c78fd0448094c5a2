/* matmul_q_steps — the index math of the quantized kernels' inner steps (gemv_q.cu, gemm_q.cu), host+device
 * so that tests/cuda/test_qblock.cc runs them on the CPU against staged copies it builds itself.
 *
 * Staging (both kernels): the bytes of blocks [b0, b0 + cb) of a W row, which start at global address
 * ga = row start + b0 * BYTES, are copied with the enclosing 16-byte-aligned range, so block b0 + i sits at
 * staged offset (ga & 15) + i * BYTES and keeps its address mod 16 (the type's loads rely on it).
 *   gq_lane_chunk: one lane's pieces (sl, sl + LPR, ...) of one staged chunk of a row, times M rows of int8
 * x. gm_decode_task: one unit of 32 weights of a GEMM tile from its staged raw stage, as f16 into the tile.
 */
#ifndef FERRY_KERN_CUDA_MATMUL_Q_STEPS_CUH
#define FERRY_KERN_CUDA_MATMUL_Q_STEPS_CUH

#include "kernels/cuda/qblock.cuh"

/* The GEMV's chunk shape for R rows per warp: LPR lanes per row, PPL pieces per lane per chunk (two
 * 32-element blocks for the small 32-blocks, so a chunk row holds ~300-700 bytes for every type, else one
 * piece), CB blocks per row per chunk, QMAX 16-byte pieces per staged row, STRIDE bytes per staged row (odd
 * multiple of 16: rows in different banks), NP staging registers (uint4) per lane. */
template <class Q, int R> struct gq_shape {
    static constexpr int LPR = 32 / R;
    static constexpr int PPL = Q::PPB == 1 && Q::BYTES <= 24 ? 2 : 1;
    static constexpr int CB = LPR * PPL / Q::PPB;
    static_assert(CB >= 1 && CB * Q::PPB == LPR * PPL, "a chunk must split evenly over a row's lanes");
    static constexpr int QMAX = (16 - Q::ALIGN + CB * Q::BYTES + 15) / 16;
    static constexpr int STRIDE = (QMAX | 1) * 16;
    static constexpr int NP = (R * QMAX + 31) / 32;
};

/* The GEMM's raw stages: RKS elements of k per row per stage, RBLK blocks, RQ 16-byte pieces per staged row.
 */
#define GM_RKS 256
template <class Q> struct gm_raw {
    static constexpr int RBLK = GM_RKS / Q::QK;
    static constexpr int RBYTES = RBLK * Q::BYTES;
    static constexpr int RQ = (16 - Q::ALIGN + RBYTES + 15) / 16;
    static constexpr int RSTRIDE = (RQ | 1) * 16; /* odd: neighbouring rows in different banks */
};

/* 16 bytes of data no kernel writes during the read (read-only path on the device). */
QB_FN qb_v4 qb_ldg128(const void *p)
{
    qb_v4 r;
#ifdef __CUDA_ARCH__
    const uint4 v = __ldg(reinterpret_cast<const uint4 *>(p));
    r.x = v.x, r.y = v.y, r.z = v.z, r.w = v.w;
#else
    memcpy(&r, p, 16);
#endif
    return r;
}

QB_FN void qb_st128(void *p, uint32_t a, uint32_t b, uint32_t c, uint32_t d)
{
#ifdef __CUDA_ARCH__
    *reinterpret_cast<uint4 *>(p) = make_uint4(a, b, c, d);
#else
    const uint32_t v[4] = {a, b, c, d};
    memcpy(p, v, 16);
#endif
}

/* acc[c] += row · x_c over the pieces of one staged chunk that lane sl of the row's LPR lanes takes (PPL of
 * them: pieces sl + LPR*pp of the chunk's nbc blocks, Q::PPB pieces per block). rb: the row's staged bytes at
 * (ga & 15), i.e. block b0 at rb. xq (m, k) int8 and xd (m, k/32) x 4 floats {dx, Σx, Σxq lo, Σxq hi}: row c
 * of x at xq + xoff[c], xd + 4 * doff[c]. */
template <class Q, int M, int LPR, int PPL>
QB_FN void gq_lane_chunk(float (&acc)[M], const uint8_t *rb, int b0, int nbc, int sl, const int8_t *xq,
                         const float *xd, const int (&xoff)[M], const int (&doff)[M])
{
    QB_UNROLL
    for (int pp = 0; pp < PPL; pp++) {
        const int pi = sl + LPR * pp, bl = pi / Q::PPB, j = pi % Q::PPB;
        if (bl >= nbc) continue;
        typename Q::raw raw;
        Q::load(raw, rb + bl * Q::BYTES, j);
        QB_UNROLL
        for (int vv = 0; vv < Q::UPP; vv++) {
            qb_unit u;
            Q::unit(raw, j, vv, u);
            const int e = (b0 + bl) * Q::QK + Q::unit_elem(j, vv);
            QB_UNROLL
            for (int c = 0; c < M; c++) {
                const qb_v4 a = qb_ldg128(xq + xoff[c] + e), b = qb_ldg128(xq + xoff[c] + e + 16);
                const uint32_t xw[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
                const qb_v4 d = qb_ldg128(xd + 4 * (doff[c] + e / 32));
                float dx, sx;
                memcpy(&dx, &d.x, 4);
                memcpy(&sx, &d.y, 4);
                acc[c] = qb_dot<Q>(u, xw, dx, sx, (int)d.z, (int)d.w, acc[c]);
            }
        }
    }
}

/* The piece and unit of Q holding element e (a multiple of 32) of a block. */
template <class Q> QB_FN void gm_unit_at(int e, int &p, int &v)
{
    p = 0, v = 0;
    QB_UNROLL
    for (int pp = 0; pp < Q::PPB; pp++) QB_UNROLL
    for (int vv = 0; vv < Q::UPP; vv++)
        if (Q::unit_elem(pp, vv) == e) p = pp, v = vv;
}

/* Unit ul (0 or 1) of row `row` of GEMM tile t (64 columns: elements 64t + 32ul ..) into dst (32 f16), from
 * the row's staged raw stage r = t / (GM_RKS/64) (gm_raw's RBLK blocks per stage): rrow is the row's staged
 * bytes (the aligned range's start), ga_stage its global address of block r * RBLK. Columns past k are zeros.
 */
template <class Q>
QB_FN void gm_decode_task(uint8_t *dst, const uint8_t *rrow, uintptr_t ga_stage, int t, int ul, int k)
{
    constexpr int RBLK = gm_raw<Q>::RBLK, RKS = GM_RKS;
    const int e = t * 64 + 32 * ul;
    if (e >= k) {
        QB_UNROLL
        for (int i = 0; i < 4; i++) qb_st128(dst + 16 * i, 0u, 0u, 0u, 0u);
        return;
    }
    const int r = t / (RKS / 64), b = e / Q::QK, within = e - b * Q::QK;
    const uint8_t *blk = rrow + (unsigned)(ga_stage & 15) + (b - r * RBLK) * Q::BYTES;
    int p, v;
    gm_unit_at<Q>(within, p, v);
    typename Q::raw raw;
    Q::load(raw, blk, p);
    qb_unit u;
    Q::unit(raw, p, v, u);
    uint32_t h[16];
    qb_decode_h2<Q>(u, h);
    QB_UNROLL
    for (int i = 0; i < 4; i++) qb_st128(dst + 16 * i, h[4 * i], h[4 * i + 1], h[4 * i + 2], h[4 * i + 3]);
}

#endif
