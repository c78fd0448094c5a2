/* moe_tile — the index math of the tiled grouped expert product (kernels/cuda/moe.cu, moe_tile_kernel),
 * host+device so that tests/cuda/test_moe_tile.cc runs it on the CPU against staged copies it builds itself.
 *
 * A block takes one expert, MT_WARPS * 16 rows of its W and up to MT_PAIRS of its pairs at a time (a pass),
 * and walks k in chunks of gqm_shape<Q> (CB blocks, UPC <= MT_UNITS units of 32). Every chunk of a pass is
 * staged once in shared memory for the whole block (cp.async, STAGES stages in a ring), mt_geom's layout:
 *  - W: warp w's 16 rows (qs_issue with the warp's lanes, G = qs_geom<Q, 16, CB>: block b0 + i of a row at
 *    (ga & 15) + i * BYTES of its staged row) at w * G::BYTES, then 16 bytes of slack (the 2-byte-aligned
 *    types' loads reach up to 3 bytes past a block);
 *  - x: the pass's pairs' rows of x's int8 form (x8.cuh's natural layout: xq (m, k) int8, xd (m, k/32) float4
 *    {dx, Σx, Σxq lo, Σxq hi}) for the chunk's units: pair j's 32 quants of chunk unit ul at XQ + j * MT_XQS
 *    + 32 ul, its float4 at XD + j * MT_XDS + 16 ul. MT_XQS = 272 bytes (68 words: word t of pair g of a col
 *    group falls in bank 4g + t + 8 ul mod 32, so a warp's B loads meet no conflict), MT_XDS = 144 (36
 *    words: pairs 2t and 2t + 1 of a col group in banks 8t.. and 8t + 4..).
 * Each of the pass's pairs is copied as 3 granules of 16 bytes per unit (two of xq, one of xd): granule i of
 * a chunk is pair i / (3 UPC), unit (i % (3 UPC)) / 3, part i % 3 (consecutive threads on consecutive
 * bytes of a pair's row). Col group c of the pass is pairs 8c .. 8c + 7; lane (g, t) reads B
 * words t and t + 4 of pair 8c + g (the B fragment of mma.sync m16n8k32) and the float4s of pairs 8c + 2t,
 * 8c + 2t + 1 (the C fragment's columns) into gqm_x, for gqm_epilogue. Pairs of the last col group past the
 * pass's end read whatever the stage holds: their C columns are never stored.
 */
#ifndef FERRY_KERN_CUDA_MOE_TILE_CUH
#define FERRY_KERN_CUDA_MOE_TILE_CUH

#include "kernels/cuda/matmul_q_steps.cuh"

#define MT_WARPS  8
#define MT_PAIRS  32
#define MT_UNITS  8
#define MT_XQS    272
#define MT_XDS    144
#define MT_XD_OFF (MT_PAIRS * MT_XQS) /* the float4s' area, from the quants' */

template <class Q> struct mt_geom {
    using SHP = gqm_shape<Q>;
    using G = qs_geom<Q, 16, SHP::CB>;
    static_assert(SHP::UPC <= MT_UNITS, "a chunk's units must fit the x stage");
    static constexpr int XQ = MT_WARPS * G::BYTES + 16;
    static constexpr int XD = XQ + MT_XD_OFF;
    static constexpr int BYTES = XD + MT_PAIRS * MT_XDS; /* one stage, a multiple of 16 */
    /* Stages in the ring: 3, or 2 where 3 would keep a second block off an SM of 228 KiB (Q6_K). */
    static constexpr int STAGES = 3 * BYTES <= 110 * 1024 ? 3 : 2;
};

/* Granule i of a chunk's x (i < np * 3 * UPC, UPC the chunk's units; granules of units past a short last
 * chunk's are skipped): its pair j of the pass, chunk unit ul and part; then its copy into xs (the stage's
 * XQ) from the pair's row xrow of x (u0: the chunk's first unit, nu: units per row). */
template <int UPC> QB_FN void mt_x_granule(int i, int &j, int &ul, int &part)
{
    j = i / (3 * UPC);
    const int r = i - j * 3 * UPC;
    ul = r / 3;
    part = r - 3 * ul;
}
QB_FN void mt_stage_x(unsigned char *xs, const uint8_t *xq, const float *xd, int xrow, int nu, int u0, int j,
                      int ul, int part)
{
    const size_t unit = (size_t)xrow * nu + u0 + ul;
    if (part < 2)
        qs_copy16(xs + j * MT_XQS + 32 * ul + 16 * part, (uintptr_t)(xq + unit * 32 + 16 * part));
    else
        qs_copy16(xs + MT_XD_OFF + j * MT_XDS + 16 * ul, (uintptr_t)(xd + unit * 4));
}

/* Lane's B words and epilogue inputs for col group c, chunk unit ul, from the stage's x (xs: its XQ). */
QB_FN void mt_load_x(gqm_x &x, const unsigned char *xs, int c, int ul, int lane)
{
    const int g = lane >> 2, t = lane & 3;
    const unsigned char *q = xs + (8 * c + g) * MT_XQS + 32 * ul;
    x.b0 = qb_ld32(q + 4 * t);
    x.b1 = qb_ld32(q + 16 + 4 * t);
    QB_UNROLL
    for (int col = 0; col < 2; col++) {
        const qb_v4 d = qb_ld128(xs + MT_XD_OFF + (8 * c + 2 * t + col) * MT_XDS + 16 * ul);
        memcpy(&x.dx[col], &d.x, 4);
        memcpy(&x.sx[col], &d.y, 4);
        x.sq[col][0] = (int)d.z, x.sq[col][1] = (int)d.w;
    }
}

/* Lane (g, t)'s staged rows g and g + 8 of warp w for the chunk whose first block is b0 (rows past the
 * last repeat it): ws the stage's start, wlo the expert's W address, rowbytes its row size. */
template <class Q>
QB_FN void mt_rows(const unsigned char *(&rp)[2], const unsigned char *ws, int w, int g, int row0, int rows,
                   uintptr_t wlo, size_t rowbytes, int b0)
{
    using G = typename mt_geom<Q>::G;
    QB_UNROLL
    for (int h = 0; h < 2; h++) {
        const int row = row0 + 8 * h + g < rows ? row0 + 8 * h + g : rows - 1;
        rp[h] = ws + w * G::BYTES + (8 * h + g) * G::STRIDE +
                (unsigned)((wlo + (size_t)row * rowbytes + (size_t)b0 * Q::BYTES) & 15);
    }
}

#endif
