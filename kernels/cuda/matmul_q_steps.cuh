/* matmul_q_steps — the index math of the quantized kernels' inner steps (gemv_q.cu, mmv_q.cu, gemm_q.cu),
 * host+device so that tests/cuda/test_qblock.cc runs them on the CPU against staged copies it builds itself.
 *
 * Staging (every kernel): the bytes of blocks [b0, b0 + cb) of a W row, which start at global address
 * ga = row start + b0 * BYTES, are copied with the enclosing 16-byte-aligned range, so block b0 + i sits at
 * staged offset (ga & 15) + i * BYTES and keeps its address mod 16 (the type's loads rely on it). qs_geom
 * gives a staged chunk's shape (rows of STRIDE bytes, an odd multiple of 16 so that rows fall in different
 * banks). gq_lane_chunk: the dp4a GEMV, one lane's pieces (sl, sl + LPR, ...) of one staged chunk of a row,
 * times M rows of int8 x (natural layout: xq (m, k), xd (m, k/32) float4 {dx, Σx, Σxq lo, Σxq hi}). gqm_*:
 * the int8-MMA skinny kernel, per thread (g, t) of a warp: its A words (Q::frag) of rows g and g+8, its B
 * words of x in the fragment layout (gqm_xq_off / gqm_xd_off), and the f32 epilogue of one unit.
 *   gm_decode_task: the GEMM, one unit of 32 weights of a tile from its staged raw stage, as f16.
 */
#ifndef FERRY_KERN_CUDA_MATMUL_Q_STEPS_CUH
#define FERRY_KERN_CUDA_MATMUL_Q_STEPS_CUH

#include "kernels/cuda/qblock.cuh"

/* A staged chunk of RW rows x CB blocks: QMAX 16-byte pieces per row (the range starts up to 16 - ALIGN bytes
 * before the chunk), STRIDE bytes per staged row (odd multiple of 16: rows in different banks), PIECES to
 * copy, NP per lane, BYTES per stage (plus 16 bytes of slack at the end of a kernel's staging area: the
 * 2-byte-aligned types read aligned words up to 3 bytes past a block). */
template <class Q, int RW, int CB> struct qs_geom {
    static constexpr int QMAX = (16 - Q::ALIGN + CB * Q::BYTES + 15) / 16;
    static constexpr int STRIDE = (QMAX | 1) * 16;
    static constexpr int PIECES = RW * QMAX;
    static constexpr int NP = (PIECES + 31) / 32;
    static constexpr int BYTES = RW * STRIDE;
};

/* The dp4a GEMV's chunk shape for R rows per warp: LPR lanes per row, PPL pieces per lane per chunk (X, or 2X
 * for the small 32-blocks, so a chunk holds ~1.1-1.7 KB per X for every type), CB blocks per row per chunk; G
 * its staging geometry. The kernel uses X = GQ_X (small chunks: a 25 MB product is only ~3.5 chunks of 2.3 KB
 * per resident warp, so the granularity of the last round weighs). */
#define GQ_X 1
template <class Q, int R, int X = GQ_X> struct gq_shape {
    static constexpr int LPR = 32 / R;
    static constexpr int PPL = (Q::PPB == 1 && Q::BYTES <= 24 ? 2 : 1) * X;
    static constexpr int CB = LPR * PPL / Q::PPB;
    static_assert(CB >= 1 && CB * Q::PPB == LPR * PPL, "a chunk must split evenly over a row's lanes");
    using G = qs_geom<Q, R, CB>;
    static constexpr int QMAX = G::QMAX, STRIDE = G::STRIDE, NP = G::NP;
};

/* The int8-MMA kernel's chunk: CB blocks per row (8 units of 32 for the K-quants and the small 32-blocks, 4
 * for Q8_0), UPB units per block, UPC units per chunk. */
template <class Q> struct gqm_shape {
    static constexpr int UPB = Q::QK / 32;
    static constexpr int CB = Q::QK == 256 ? 1 : Q::BYTES >= 32 ? 4 : 8;
    static constexpr int UPC = CB * UPB;
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

/* ---- int8-MMA skinny kernel (mmv_q.cu) ------------------------------------------------------------------
 * x in the fragment layout, rows padded to col groups of 8 (zeros past m): for col group c, unit u, the 256
 * bytes of xqf at ((c * nu + u) * 32 + lane) * 8 are what lane (g, t) = (lane / 4, lane % 4) feeds the MMA:
 * xq[8c + g][32u + 4t ..+3] then xq[8c + g][32u + 16 + 4t ..+3] (words t and t+4 of the unit, as the A side's
 * Q::frag). xdf holds per (c, u) four pairs, pair t = {dx, Σx of rows 8c+2t, 8c+2t+1} then {Σxq lo, Σxq hi of
 * the same rows (int bits)}: 8 floats from ((c * nu + u) * 4 + t) * 8, the rows lane (g, t)'s C fragment
 * holds. */
QB_FN size_t gqm_xq_off(int row, int u, int sub, int nu)
{
    return ((size_t)((row >> 3) * nu + u) * 32 + (row & 7) * 4 + (sub & 3)) * 8 + 4 * (sub >> 2);
}
QB_FN size_t gqm_xd_off(int row, int u, int nu)
{
    return ((size_t)((row >> 3) * nu + u) * 4 + ((row & 7) >> 1)) * 8 + 2 * (row & 1);
}

/* Lane's B words and epilogue inputs for col group c, global unit gu. */
struct gqm_x {
    uint32_t b0, b1;
    float dx[2], sx[2]; /* rows 8c + 2t, 8c + 2t + 1 */
    int sq[2][2];       /* [row][half] */
};

template <class Q>
QB_FN void gqm_load_x(gqm_x &x, const uint8_t *xqf, const float *xdf, int nu, int c, int gu, int lane)
{
    const size_t cu = (size_t)c * nu + gu;
    uint32_t b[2];
    qb_ld64(xqf + (cu * 32 + lane) * 8, b[0], b[1]);
    x.b0 = b[0], x.b1 = b[1];
    const qb_v4 d = qb_ldg128(xdf + (cu * 4 + (lane & 3)) * 8);
    memcpy(&x.dx[0], &d.x, 4), memcpy(&x.sx[0], &d.y, 4), memcpy(&x.dx[1], &d.z, 4),
        memcpy(&x.sx[1], &d.w, 4);
    if (Q::QOFF != 0 || Q::TWO_M) { /* the halves' sums of xq: offsets, and TWO_M's minimums */
        const qb_v4 q = qb_ldg128(xdf + (cu * 4 + (lane & 3)) * 8 + 4);
        x.sq[0][0] = (int)q.x, x.sq[0][1] = (int)q.y, x.sq[1][0] = (int)q.z, x.sq[1][1] = (int)q.w;
    }
}

/* The int8 MMAs (sm_80+): C (16 x 8, int32) += A (16 x 32 or 16 x 16, int8, row-major) times B (col-major);
 * thread (g, t) holds A words of rows g and g+8, B words of column g, C elements rows g, g+8 x columns 2t,
 * 2t+1. Device code only. */
#ifdef __CUDACC__
__device__ __forceinline__ void gqm_mma_k32(int (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                            uint32_t b0, uint32_t b1)
{
    asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};"
        : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}
__device__ __forceinline__ void gqm_mma_k16(int (&c)[4], uint32_t a0, uint32_t a1, uint32_t b0)
{
    asm("mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%0,%1,%2,%3};"
        : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
        : "r"(a0), "r"(a1), "r"(b0));
}
#endif

/* acc (C fragment: e = 0, 1 -> row g, x rows 2t, 2t+1; e = 2, 3 -> row g+8) += one unit: c the int32 MMA
 * result over the unit (c_hi unused) or, for TWO_D types, over its first half (c_hi the second), r[h] the
 * frags of rows g and g+8. The same arithmetic as qb_dot per element. */
template <class Q>
QB_FN void gqm_epilogue(float (&acc)[4], const int (&c)[4], const int (&c_hi)[4], const qb_frag (&r)[2],
                        const gqm_x &x)
{
    QB_UNROLL
    for (int e = 0; e < 4; e++) {
        const int h = e >> 1, col = e & 1;
        float t;
        if (Q::TWO_D) {
            const int lo = c[e] + Q::QOFF * x.sq[col][0], hi = c_hi[e] + Q::QOFF * x.sq[col][1];
            t = qb_fma(r[h].d0, (float)lo, qb_mul(r[h].d1, (float)hi));
        } else {
            const int s = Q::QOFF != 0 ? c[e] + Q::QOFF * (x.sq[col][0] + x.sq[col][1]) : c[e];
            t = qb_mul(r[h].d0, (float)s);
        }
        acc[e] = qb_fma(x.dx[col], t, acc[e]);
        if (Q::TWO_M)
            acc[e] = qb_fma(
                x.dx[col], qb_fma(r[h].m, (float)x.sq[col][0], qb_mul(r[h].m1, (float)x.sq[col][1])), acc[e]);
        else if (Q::HAS_M)
            acc[e] = qb_fma(r[h].m, x.sx[col], acc[e]);
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

/* ---- the staging copy, host+device (the host copies synchronously: tests/cuda/test_qblock.cc stages with
 * it) */

QB_FN void qs_copy16(unsigned char *dst, uintptr_t src)
{
#ifdef __CUDA_ARCH__
    const unsigned d = (unsigned)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(d), "l"(src) : "memory");
#else
    memcpy(dst, (const void *)src, 16);
#endif
}
QB_FN void qs_copy1(unsigned char *dst, uintptr_t src)
{
#ifdef __CUDA_ARCH__
    *dst = __ldg(reinterpret_cast<const unsigned char *>(src));
#else
    *dst = *(const unsigned char *)src;
#endif
}
QB_FN void qs_copy2(unsigned char *dst, uintptr_t src)
{
#ifdef __CUDA_ARCH__
    *reinterpret_cast<uint16_t *>(dst) = __ldg(reinterpret_cast<const uint16_t *>(src));
#else
    memcpy(dst, (const void *)src, 2);
#endif
}

/* Copies blocks [b0, b0 + nbc) of rows [row0, row0 + RW) (rows past n repeat row n-1) of W into stage with
 * the lane's share of the 16-byte pieces (G = qs_geom<Q, RW, CB>); pieces past a row's chunk are skipped,
 * pieces that would reach outside W (its first and last 16 bytes when W's ends are not aligned) are assembled
 * from the chunk's own bytes with 2-byte loads (1-byte loads for byte-aligned types). Offsets are 32-bit,
 * relative to W's 16-byte-aligned base a16 (W's start is a16 + w0, its size wbytes: the caller guarantees w0
 * + wbytes + 16 < 2^32). */
template <class Q, int RW, int CB>
QB_FN void qs_issue(unsigned char *stage, uintptr_t a16, uint32_t w0, uint32_t wbytes, int row0, int n,
                    uint32_t rowbytes, int b0, int nbc, int lane)
{
    using G = qs_geom<Q, RW, CB>;
    const uint32_t nbytes = (uint32_t)(nbc * Q::BYTES), boff = w0 + (uint32_t)b0 * Q::BYTES;
    QB_UNROLL
    for (int p = 0; p < G::NP; p++) {
        const int i = lane + 32 * p;
        if (G::PIECES % 32 && i >= G::PIECES) break;
        const int r = RW == 1 ? 0 : i / G::QMAX, q = i - r * G::QMAX;
        const uint32_t ga =
            (uint32_t)(row0 + r < n - 1 ? row0 + r : n - 1) * rowbytes + boff; /* the chunk's row start */
        const uint32_t src = (ga & ~15u) + 16u * (uint32_t)q;
        if (src >= ga + nbytes) continue;
        unsigned char *dst = stage + r * G::STRIDE + 16 * q;
        if (src >= w0 && src + 16 <= w0 + wbytes) {
            qs_copy16(dst, a16 + src);
        } else if constexpr (Q::ALIGN == 1) { /* byte-aligned blocks (MXFP4): byte loads */
            QB_UNROLL
            for (uint32_t e = 0; e < 16; e++) {
                const uint32_t a = src + e;
                if (a >= ga && a < ga + nbytes) qs_copy1(dst + e, a16 + a);
            }
        } else {
            QB_UNROLL
            for (uint32_t e = 0; e < 16; e += 2) {
                const uint32_t a = src + e;
                if (a >= ga && a < ga + nbytes) qs_copy2(dst + e, a16 + a);
            }
        }
    }
}

#ifdef __CUDACC__
/* ---- device-only: the per-warp cp.async staging ring shared by the streaming kernels ------------------- */

__device__ __forceinline__ void qs_commit(void)
{
    asm volatile("cp.async.commit_group;" ::: "memory");
}
template <int N> __device__ __forceinline__ void qs_wait(void)
{
    asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

#endif

#endif
