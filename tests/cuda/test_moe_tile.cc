/* The tiled grouped expert product (kernels/cuda/moe.cu's moe_tile_kernel) on the CPU, with its own index
 * math (kernels/cuda/moe_tile.cuh; no GPU needed: runs in CI). For every block type, one expert's W at an odd
 * row count (row tiles with rows past the last, warps with no rows), at every start alignment the type
 * allows, and pairs whose x rows are scattered and shared (xdiv 3), passes of MT_PAIRS with a short last
 * one: per pass and chunk a stage filled with garbage, then filled as the block fills it (W by qs_issue,
 * lane by lane of each warp; x granule by granule through mt_x_granule / mt_stage_x), per unit every lane's
 * A fragment (mt_rows, Q::frag; the K-quants' scales decoded once per chunk by lane (g, U / 2) and shuffled,
 * as the kernel takes them) and B words and epilogue inputs (mt_load_x), mma.sync m16n8k32 (m16n8k16
 * pairs for TWO_D types) emulated from the PTX fragment tables (A: a0 = row g, k 4t..4t+3, a1 = row g+8,
 * a2/a3 the same rows at k 16+4t..; B: b0 = k 4t.., col g, b1 = k 16+4t..; C: c0, c1 = row g, cols 2t, 2t+1,
 * c2, c3 = row g+8), gqm_epilogue, and the store's mapping back to (pair, row). Every (pair, row) output is
 * written exactly once and equals the exact-sum int8 reference (tests/cuda/qref.h) within (k/32 + 16) f32
 * roundings of the sum of the terms' magnitudes.
 */
#include <criterion/criterion.h>
#include <vector>

#include "kernels/cuda/moe_tile.cuh"
#include "tests/cuda/qref.h"

static int tile_dot4(uint32_t a, uint32_t b)
{
    int s = 0;
    for (int i = 0; i < 4; i++) s += (int)(int8_t)(a >> (8 * i)) * (int)(int8_t)(b >> (8 * i));
    return s;
}

/* One expert of `rows` rows of k, np_all pairs reading x rows order[j] / xdiv of m rows. */
template <class Q> static void emulate_tile(enum dtype t, int rows, int k, int woff, int np_all, int xdiv)
{
    using M = mt_geom<Q>;
    using SHP = typename M::SHP;
    using G = typename M::G;
    constexpr int CB = SHP::CB, UPB = SHP::UPB;
    const size_t rb = dtype_row_size(t, k);
    const int nb = k / Q::QK, nu = k / 32, nch = (nb + CB - 1) / CB;
    const int m = (np_all * 2 - 1) / xdiv + 1; /* x rows: pairs read a scattered subset */
    std::vector<uint8_t> wbuf(rb * rows + 64);
    uint8_t *w = wbuf.data() + (16 - (uintptr_t)wbuf.data() % 16) % 16 + 16 + woff;
    qref_random_blocks(t, w, (int64_t)rows * nb);
    std::vector<float> x((size_t)m * k);
    for (size_t i = 0; i < x.size(); i++) x[i] = qref_frand() * (i % 13 == 0 ? 3.0f : 1.0f);
    struct qref_xq xq;
    qref_quantize_x(x.data(), m, k, &xq);
    /* x's int8 form in the natural layout, 16-byte aligned */
    std::vector<uint8_t> xqb((size_t)m * k + 16);
    std::vector<float> xdb((size_t)m * nu * 4 + 4);
    uint8_t *xqn = xqb.data() + (16 - (uintptr_t)xqb.data() % 16) % 16;
    float *xdn = xdb.data() + (16 - (uintptr_t)xdb.data() % 16) % 16 / 4;
    cr_assert_eq((uintptr_t)xdn % 16, 0u);
    memcpy(xqn, xq.q, (size_t)m * k);
    for (size_t u = 0; u < (size_t)m * nu; u++) {
        xdn[4 * u] = xq.dx[u], xdn[4 * u + 1] = xq.sx[u];
        memcpy(&xdn[4 * u + 2], &xq.sq_lo[u], 4);
        memcpy(&xdn[4 * u + 3], &xq.sq_hi[u], 4);
    }
    std::vector<int32_t> order((size_t)np_all);
    for (int j = 0; j < np_all; j++) order[j] = (int32_t)((j * 7 + 3) % (np_all * 2)); /* < m * xdiv */
    std::vector<float> out((size_t)np_all * rows, NAN);
    std::vector<int> written((size_t)np_all * rows, 0);
    std::vector<uint8_t> sbuf((size_t)M::BYTES + 32);
    uint8_t *st = sbuf.data() + (16 - (uintptr_t)sbuf.data() % 16) % 16;
    const uintptr_t wlo = (uintptr_t)w, a16 = wlo & ~(uintptr_t)15;
    const uint32_t w0 = (uint32_t)(wlo & 15), wbytes = (uint32_t)(rb * rows);
    static float acc[MT_WARPS][32][MT_PAIRS / 8][4];
    for (int rt = 0; rt * MT_WARPS * 16 < rows; rt++)
        for (int s0 = 0; s0 < np_all; s0 += MT_PAIRS) {
            const int np = np_all - s0 < MT_PAIRS ? np_all - s0 : MT_PAIRS, ncg = (np + 7) / 8;
            memset(acc, 0, sizeof acc);
            for (int ch = 0; ch < nch; ch++) {
                const int b0 = ch * CB, nbc = nb - b0 < CB ? nb - b0 : CB, nuc = nbc * UPB;
                /* garbage: 0xA5 in W's area, 0x01 in x's (the padding pairs' junk columns are computed: sums
                 * of 0x01010101 stay inside int, as the device's wrapping arithmetic would not need) */
                memset(st, 0xA5, (size_t)M::XQ);
                memset(st + M::XQ, 0x01, (size_t)(M::BYTES - M::XQ) + 16);
                for (int wp = 0; wp < MT_WARPS; wp++) {
                    const int row0 = (rt * MT_WARPS + wp) * 16;
                    if (row0 < rows)
                        for (int lane = 0; lane < 32; lane++)
                            qs_issue<Q, 16, CB>(st + wp * G::BYTES, a16, w0, wbytes, row0, rows, (uint32_t)rb,
                                                b0, nbc, lane);
                }
                for (int i = 0; i < np * 3 * SHP::UPC; i++) {
                    int j, ul, part;
                    mt_x_granule<SHP::UPC>(i, j, ul, part);
                    if (ul < nuc)
                        mt_stage_x(st + M::XQ, xqn, xdn, order[s0 + j] / xdiv, nu, b0 * UPB, j, ul, part);
                }
                for (int wp = 0; wp < MT_WARPS; wp++) {
                    const int row0 = (rt * MT_WARPS + wp) * 16;
                    if (row0 >= rows) continue;
                    for (int uu = 0; uu < SHP::UPC; uu++) {
                        const int bl = uu / UPB, U = uu % UPB;
                        if (bl >= nbc) break;
                        static qb_frag f[32][2];
                        for (int lane = 0; lane < 32; lane++) {
                            const unsigned char *rp[2];
                            mt_rows<Q>(rp, st, wp, lane >> 2, row0, rows, wlo, rb, b0);
                            for (int h = 0; h < 2; h++)
                                Q::frag(rp[h] + bl * Q::BYTES, U, lane & 3, f[lane][h]);
                        }
                        if (UPB == 8) { /* the kernel's K-quant scales: lane (g, t) decodes units 2t, 2t+1 */
                            static qb_frag ks[32][2][2];
                            for (int lane = 0; lane < 32; lane++) {
                                const unsigned char *rp[2];
                                mt_rows<Q>(rp, st, wp, lane >> 2, row0, rows, wlo, rb, b0);
                                for (int h = 0; h < 2; h++)
                                    for (int v = 0; v < 2; v++)
                                        Q::frag(rp[h], 2 * (lane & 3) + v, lane & 3, ks[lane][h][v]);
                            }
                            for (int lane = 0; lane < 32;
                                 lane++) { /* and the shuffles from lane (g, U / 2) */
                                const int src = (lane & ~3) | (U >> 1), v = U & 1;
                                for (int h = 0; h < 2; h++) {
                                    f[lane][h].d0 = ks[src][h][v].d0;
                                    f[lane][h].d1 = Q::TWO_D ? ks[src][h][v].d1 : f[lane][h].d0;
                                    f[lane][h].m = Q::HAS_M ? ks[src][h][v].m : -0.0f;
                                    if (Q::TWO_M) f[lane][h].m1 = ks[src][h][v].m1;
                                }
                            }
                        }
                        for (int c = 0; c < ncg; c++) {
                            static gqm_x xv[32];
                            for (int lane = 0; lane < 32; lane++)
                                mt_load_x(xv[lane], st + M::XQ, c, uu, lane);
                            for (int lane = 0; lane < 32; lane++) {
                                const int g = lane >> 2, th = lane & 3;
                                int cc[4], chh[4];
                                for (int e = 0; e < 4; e++) {
                                    const int row = g + 8 * (e >> 1), col = 2 * th + (e & 1);
                                    int lo = 0, hi = 0;
                                    for (int tq = 0; tq < 4; tq++) {
                                        const qb_frag &fa = f[(row % 8) * 4 + tq][row / 8];
                                        lo += tile_dot4(fa.w0, xv[col * 4 + tq].b0);
                                        hi += tile_dot4(fa.w1, xv[col * 4 + tq].b1);
                                    }
                                    if (Q::TWO_D)
                                        cc[e] = lo, chh[e] = hi;
                                    else
                                        cc[e] = lo + hi, chh[e] = 0;
                                }
                                gqm_epilogue<Q>(acc[wp][lane][c], cc, chh, f[lane], xv[lane]);
                            }
                        }
                    }
                }
            }
            for (int wp = 0; wp < MT_WARPS; wp++)
                for (int lane = 0; lane < 32; lane++)
                    for (int c = 0; c < ncg; c++)
                        for (int i = 0; i < 4; i++) {
                            const int row = (rt * MT_WARPS + wp) * 16 + 8 * (i >> 1) + (lane >> 2);
                            const int j = 8 * c + 2 * (lane & 3) + (i & 1);
                            if (row >= rows || j >= np) continue;
                            out[(size_t)(s0 + j) * rows + row] = acc[wp][lane][c][i];
                            written[(size_t)(s0 + j) * rows + row]++;
                        }
        }
    for (int j = 0; j < np_all; j++)
        for (int r = 0; r < rows; r++) {
            cr_assert_eq(written[(size_t)j * rows + r], 1, "%s pair %d row %d written %d times",
                         dtype_name(t), j, r, written[(size_t)j * rows + r]);
            double ref, absum;
            qref_q8_row<Q>(w + rb * r, &xq, order[j] / xdiv, k, &ref, &absum);
            const float got = out[(size_t)j * rows + r];
            cr_assert(
                fabs(got - ref) <= (k / 32 + 16) * 0x1.0p-23 * absum,
                "%s tile emulation rows %d k %d woff %d pairs %d: pair %d row %d: %.9g vs %.9g (|terms| %g)",
                dtype_name(t), rows, k, woff, np_all, j, r, got, ref, absum);
        }
    qref_free_xq(&xq);
}

/* k a multiple of the type's block near 32 * n */
template <class Q> static int tile_k(int n32)
{
    return (32 * n32 + Q::QK - 1) / Q::QK * Q::QK;
}

template <class Q> static void emulate_tile_all(enum dtype t)
{
    const int al = Q::ALIGN < 16 ? Q::ALIGN : 0;
    emulate_tile<Q>(t, 131, tile_k<Q>(21), 0, 37, 3); /* two row tiles (the second 3 rows), two passes */
    emulate_tile<Q>(t, 19, tile_k<Q>(24), al, 5, 1);  /* one col group, part filled */
    emulate_tile<Q>(t, 40, tile_k<Q>(9), al, 32, 2);  /* one full pass, a chunk of a single block */
}

Test(moe_tile, emulated_every_type)
{
    qref_seed(17);
    for (int ti = 0; ti < QREF_NTYPES; ti++)
        cr_assert(QREF_DISPATCH(qref_types[ti], emulate_tile_all, qref_types[ti]));
}
