/* mmv_q (CUDA) — the int8 tensor-core skinny GEMM for GGUF block weights (decode batches and small prefill
 * chunks, m <= KERN_CUDA_QMMA_MAX_M rows per launch); see matmul_q.h for the contract and
 * kernels/cuda/NOTES.md (Version 8) for the reasoning.
 *
 * x is quantized to int8 per block of 32 by gemv_q.cu's pre-pass, in the MMA fragment layout, rows padded
 * with zeros to NT col groups of 8. The streaming structure is gemv_q.cu's (persistent warps, T row tiles x S
 * splits of k per block, a per-warp cp.async ring of NST chunks running ahead across tiles), with row tiles
 * of 16 * AT rows and chunks of 8 units of 32 (4 for Q8_0). Per unit, thread (g, t) takes its A words of rows
 * g and g+8 straight from the staged bytes (Q::frag: quants as int8, no conversion), its B words of every col
 * group from the fragment layout (one 8-byte load), and runs mma.sync m16n8k32 s8 into a fresh int32 fragment
 * (two m16n8k16 for Q6_K, whose scales cover 16 elements); the f32 epilogue (gqm_epilogue, qb_dot's
 * arithmetic) adds d·dx·(Σq·xq + QOFF·Σxq) + m·Σx. Each weight byte is read from memory once per launch,
 * whatever m. S > 1 splits are summed through shared memory in split order. PDL as in gemv_q.cu.
 */
#include <stdint.h>

#include "kernels/cuda/check.h"
#include "kernels/cuda/matmul_q.h"
#include "kernels/cuda/pdl.h"
#include "kernels/cuda/matmul_q_steps.cuh"

#define QS_WARPS 8

/* y (m, ldy) = x · Wᵀ for m <= 8 * NT rows of x (the padding rows of the layout are zeros; not stored). */
template <class Q, int NT, int AT, int NST, int MINB>
__global__ void __launch_bounds__(QS_WARPS * 32, MINB)
    gqm_kernel(float *y, int ldy, const uint8_t *xqf, const float *xdf, const uint8_t *w, const float *bias,
               int m, int n, int k, int S)
{
    using SHP = gqm_shape<Q>;
    constexpr int CB = SHP::CB, UPB = SHP::UPB, UPC = SHP::UPC, RW = 16 * AT;
    using G = qs_geom<Q, RW, CB>;
    extern __shared__ __align__(16) unsigned char smem[];
    pdl_trigger();
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    const int T = QS_WARPS / S, tw = warp / S, split = warp - tw * S;
    const int nb = k / Q::QK, rowbytes = nb * Q::BYTES, nch = (nb + CB - 1) / CB, nu = k / 32;
    const int ntiles = (n + RW - 1) / RW, ntg = (ntiles + T - 1) / T, bx = (int)blockIdx.x,
              gx = (int)gridDim.x;
    const int J = bx < ntg ? (ntg - 1 - bx) / gx + 1 : 0;
    const int cnt = split < nch ? (nch - 1 - split) / S + 1 : 0;
    const uintptr_t wlo = (uintptr_t)w, a16 = wlo & ~(uintptr_t)15;
    const uint32_t w0 = (uint32_t)(wlo & 15), wbytes = (uint32_t)n * (uint32_t)rowbytes;
    unsigned char *ring = smem + (size_t)warp * NST * G::BYTES;
    float *red = reinterpret_cast<float *>(smem + (size_t)QS_WARPS * NST * G::BYTES + 16);

    int is_j = 0, is_i = 0, is_slot = 0; /* the chunk stream, as in gemv_q.cu */
    auto issue = [&]() {
        if (is_j < J && cnt > 0) {
            const int row0 = ((bx + is_j * gx) * T + tw) * RW, b0 = (split + is_i * S) * CB;
            if (row0 < n)
                qs_issue<Q, RW, CB>(ring + is_slot * G::BYTES, a16, w0, wbytes, row0, n, (uint32_t)rowbytes,
                                    b0, min(CB, nb - b0), lane);
            if (++is_i == cnt) is_i = 0, is_j++;
            is_slot = is_slot + 1 == NST ? 0 : is_slot + 1;
        }
        qs_commit();
    };
#pragma unroll 1
    for (int s = 0; s < NST - 1; s++) issue();
    pdl_wait();
    int slot = 0;
    for (int j = 0; j < J; j++) {
        const int row0 = ((bx + j * gx) * T + tw) * RW;
        size_t rstart[AT][2]; /* byte offsets of this thread's rows g + 8h + 16at in W */
#pragma unroll
        for (int at = 0; at < AT; at++)
#pragma unroll
            for (int h = 0; h < 2; h++)
                rstart[at][h] = (size_t)min(row0 + 16 * at + 8 * h + g, n - 1) * rowbytes;
        float acc[AT][NT][4];
#pragma unroll
        for (int at = 0; at < AT; at++)
#pragma unroll
            for (int jn = 0; jn < NT; jn++)
#pragma unroll
                for (int e = 0; e < 4; e++) acc[at][jn][e] = 0.0f;
        for (int i = 0; i < cnt; i++) {
            qs_wait<NST - 2>();
            __syncwarp();
            issue();
            const int b0 = (split + i * S) * CB, nbc = min(CB, nb - b0);
            if (row0 < n) {
                const uint8_t *rp[AT][2];
#pragma unroll
                for (int at = 0; at < AT; at++)
#pragma unroll
                    for (int h = 0; h < 2; h++) /* staged at the chunk start's address mod 16 */
                        rp[at][h] = ring + slot * G::BYTES + (16 * at + 8 * h + g) * G::STRIDE +
                                    (unsigned)((wlo + rstart[at][h] + (size_t)b0 * Q::BYTES) & 15);
                /* K-quants (one block per chunk): thread t decodes the scales of units 2t and 2t+1 of its
                 * rows once per chunk, and each unit's come from lane (g, U / 2) by shuffles, instead of
                 * every thread decoding every unit's packed scale bytes. */
                float ks[AT][2][2][4]; /* [at][h][unit 2t + v][d0, d1, m, m1] */
                if constexpr (UPB == 8) {
#pragma unroll
                    for (int at = 0; at < AT; at++)
#pragma unroll
                        for (int h = 0; h < 2; h++)
#pragma unroll
                            for (int v = 0; v < 2; v++) {
                                qb_frag sf;
                                Q::frag(rp[at][h], 2 * t + v, t, sf);
                                ks[at][h][v][0] = sf.d0, ks[at][h][v][1] = sf.d1, ks[at][h][v][2] = sf.m;
                                ks[at][h][v][3] = sf.m1;
                            }
                }
                /* Two units per iteration, one from 32 columns of x on: a full unroll holds every unit's
                 * fragments and x at once (spills). */
                constexpr int UNROLL = AT * NT >= 4 ? 1 : 2;
#pragma unroll UNROLL
                for (int uu = 0; uu < UPC; uu++) {
                    const int bl = uu / UPB, U = uu % UPB;
                    if (bl >= nbc) break;
                    const int gu = (b0 + bl) * UPB + U;
                    qb_frag f[AT][2];
#pragma unroll
                    for (int at = 0; at < AT; at++)
#pragma unroll
                        for (int h = 0; h < 2; h++) Q::frag(rp[at][h] + bl * Q::BYTES, U, t, f[at][h]);
                    if constexpr (UPB == 8) { /* the scales from ks (the frag's own are then dead code) */
                        const int src = (lane & ~3) | (U >> 1), v = U & 1;
#pragma unroll
                        for (int at = 0; at < AT; at++)
#pragma unroll
                            for (int h = 0; h < 2; h++) {
                                f[at][h].d0 =
                                    __shfl_sync(0xffffffffu, v ? ks[at][h][1][0] : ks[at][h][0][0], src);
                                f[at][h].d1 =
                                    Q::TWO_D
                                        ? __shfl_sync(0xffffffffu, v ? ks[at][h][1][1] : ks[at][h][0][1], src)
                                        : f[at][h].d0;
                                f[at][h].m =
                                    Q::HAS_M
                                        ? __shfl_sync(0xffffffffu, v ? ks[at][h][1][2] : ks[at][h][0][2], src)
                                        : -0.0f;
                                if (Q::TWO_M)
                                    f[at][h].m1 =
                                        __shfl_sync(0xffffffffu, v ? ks[at][h][1][3] : ks[at][h][0][3], src);
                            }
                    }
#pragma unroll
                    for (int jn = 0; jn < NT; jn++) {
                        gqm_x x;
                        gqm_load_x<Q>(x, xqf, xdf, nu, jn, gu, lane);
#pragma unroll
                        for (int at = 0; at < AT; at++) {
                            int c[4] = {0, 0, 0, 0}, ch[4] = {0, 0, 0, 0};
                            if (Q::TWO_D) {
                                gqm_mma_k16(c, f[at][0].w0, f[at][1].w0, x.b0);
                                gqm_mma_k16(ch, f[at][0].w1, f[at][1].w1, x.b1);
                            } else {
                                gqm_mma_k32(c, f[at][0].w0, f[at][1].w0, f[at][0].w1, f[at][1].w1, x.b0,
                                            x.b1);
                            }
                            gqm_epilogue<Q>(acc[at][jn], c, ch, f[at], x);
                        }
                    }
                }
            }
            slot = slot + 1 == NST ? 0 : slot + 1;
        }
        if (S > 1) { /* splits summed by split 0 in split order */
            constexpr int NV = AT * NT * 4;
            if (split != 0)
#pragma unroll
                for (int v = 0; v < NV; v++) red[(warp * NV + v) * 32 + lane] = (&acc[0][0][0])[v];
            __syncthreads();
            if (split == 0)
                for (int o = 1; o < S; o++)
#pragma unroll
                    for (int v = 0; v < NV; v++) (&acc[0][0][0])[v] += red[((warp + o) * NV + v) * 32 + lane];
        }
        /* C fragment: e = 0, 1 -> W row g, x rows 2t, 2t+1 of the col group; e = 2, 3 -> W row g+8. */
        if (split == 0)
#pragma unroll
            for (int at = 0; at < AT; at++)
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    const int row = row0 + 16 * at + 8 * h + g;
                    if (row >= n) continue;
                    const float bv = bias ? bias[row] : 0.0f;
#pragma unroll
                    for (int jn = 0; jn < NT; jn++)
#pragma unroll
                        for (int e1 = 0; e1 < 2; e1++) {
                            const int xr = 8 * jn + 2 * t + e1;
                            if (xr < m) y[(size_t)xr * ldy + row] = acc[at][jn][2 * h + e1] + bv;
                        }
                }
        if (S > 1) __syncthreads(); /* red is rewritten by the next tile group */
    }
    qs_wait<0>();
}

/* ----------------------------------------------------------------------------------------------------------
 */
/* Host side */

int qs_splits(int tiles, int nch, int64_t resident); /* gemv_q.cu */
int gq_quantize_x(const struct kern_cuda_qmm *c, const float *x, int m, int mp, bool frag, uint8_t **xq,
                  float **xd);

/* Ring stages by rows per warp: 4 for 16 rows, 3 for 32 (shared memory). Blocks per SM the registers must
 * allow (__launch_bounds__): 3 (80 registers) for one 16-row tile and up to 16 rows of x, 2 (128) up to 64
 * fragments of C, else 1; ptxas (sm_90) then spills at most a few dozen bytes (Q6_K: two MMAs per unit). */
template <class Q, int NT, int AT>
static int gqm_launch(const struct kern_cuda_qmm *c, float *y, const float *x, int m)
{
    constexpr int NST = AT == 1 ? 4 : 3;
    constexpr int MINB = AT == 1 && NT <= 2 && !Q::TWO_D ? 3 : AT * NT <= 8 ? 2 : 1;
    using G = qs_geom<Q, 16 * AT, gqm_shape<Q>::CB>;
    constexpr size_t ring = (size_t)QS_WARPS * NST * G::BYTES + 16;
    constexpr size_t red = (size_t)QS_WARPS * AT * NT * 4 * 32 * sizeof(float);
    auto kern = gqm_kernel<Q, NT, AT, NST, MINB>;
    /* Blocks per SM without / with the split reduction area (0: that size does not fit the device; the kernel
     * then runs with one split). */
    static int per_sm[2] = {-1, -1};
    if (per_sm[0] < 0) {
        const size_t optin = (size_t)fcuda_smem_optin();
        if (ring > optin) return FERRY_ERR_UNSUPPORTED;
        FCUDA_CHECK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         (int)(ring + red <= optin ? ring + red : ring)));
        FCUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm[0], kern, QS_WARPS * 32, ring));
        per_sm[1] = 0;
        if (ring + red <= optin)
            FCUDA_CHECK(
                cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm[1], kern, QS_WARPS * 32, ring + red));
    }
    if (per_sm[0] < 1) return FERRY_ERR_UNSUPPORTED;
    const int tiles = (c->n + 16 * AT - 1) / (16 * AT),
              nch = (c->k / Q::QK + gqm_shape<Q>::CB - 1) / gqm_shape<Q>::CB;
    int64_t resident = (int64_t)fcuda_sm_count() * per_sm[0];
    int S = qs_splits(tiles, nch, resident);
    if (S > 1 && per_sm[1] < 1) S = 1;
    if (S > 1) {
        resident = (int64_t)fcuda_sm_count() * per_sm[1];
        S = qs_splits(tiles, nch, resident);
    }
    const int T = QS_WARPS / S;
    const int64_t ntg = (tiles + T - 1) / T;
    const unsigned blocks = (unsigned)(ntg < resident ? ntg : resident);
    uint8_t *xq;
    float *xd;
    const int rc = gq_quantize_x(c, x, m, 8 * NT, true, &xq, &xd);
    if (rc) return rc;
    FCUDA_CHECK(pdl_launch(kern, dim3(blocks), dim3(QS_WARPS * 32), ring + (S > 1 ? red : 0), c->stream, y,
                           c->ldy, xq, xd, (const uint8_t *)c->w, c->bias, m, c->n, c->k, S));
    FCUDA_LAUNCH_CHECK("gqm_kernel");
    return FERRY_OK;
}

/* Rows of x padded to the MMA's column groups: 8, 16, 32 or 64. */
static int gqm_padded(int m)
{
    return m <= 8 ? 8 : m <= 16 ? 16 : m <= 32 ? 32 : 64;
}

template <class Q, int AT> static int gqm_tile(const struct kern_cuda_qmm *c, float *y, const float *x, int m)
{
    if (c->ws_bytes < kern_cuda_qmm_x8_ws(gqm_padded(m), c->k)) return FERRY_ERR_RANGE;
    if (m <= 8) return gqm_launch<Q, 1, AT>(c, y, x, m);
    if (m <= 16) return gqm_launch<Q, 2, AT>(c, y, x, m);
    if (m <= 32) return gqm_launch<Q, 4, AT>(c, y, x, m);
    return gqm_launch<Q, 8, AT>(c, y, x, m);
}

/* Row tiles of at most KERN_CUDA_QMMA_MAX_M rows of x, fewer (32, 16, 8) when the workspace cannot hold x's
 * padded int8 form for 64 (FERRY_ERR_RANGE when it cannot hold 8); 16 * AT rows of W per warp. The caller
 * checked the arguments. */
template <class Q> int kern_cuda_qmmv(const struct kern_cuda_qmm *c, int AT)
{
    int tile = KERN_CUDA_QMMA_MAX_M;
    while (tile > 8 && (tile >= 2 * c->m || c->ws_bytes < kern_cuda_qmm_x8_ws(tile, c->k))) tile /= 2;
    if (c->ws_bytes < kern_cuda_qmm_x8_ws(gqm_padded(min(tile, c->m)), c->k)) return FERRY_ERR_RANGE;
    for (int i = 0; i < c->m; i += tile) {
        const int mt = min(tile, c->m - i);
        float *y = c->y + (size_t)i * c->ldy;
        const float *x = c->x + (size_t)i * c->k;
        const int rc = AT == 1 ? gqm_tile<Q, 1>(c, y, x, mt) : gqm_tile<Q, 2>(c, y, x, mt);
        if (rc) return rc;
    }
    return FERRY_OK;
}
#define GQM_INSTANCE(T, name, Q) template int kern_cuda_qmmv<Q>(const struct kern_cuda_qmm *, int);
QB_TYPES(GQM_INSTANCE)
#undef GQM_INSTANCE
