/* gemv_q (CUDA) — the x pre-pass of the int8 paths (x quantized to int8 per block of 32, in the layout each
 * kernel reads) and the dp4a GEMV for GGUF block weights (decode batches, m <= KERN_CUDA_QDP4A_MAX_M rows per
 * launch); see matmul_q.h for the contract and kernels/cuda/NOTES.md (Version 8) for the reasoning.
 *
 * Pre-pass: x (m, k) f32 -> xq int8 and per block of 32 {dx, Σx, Σxq over 0..15, over 16..31}, one group of 8
 * lanes per block (4 elements per lane, shuffle reductions in a fixed order), in the natural layout (this
 * kernel) or the MMA fragment layout (mmv_q.cu; matmul_q_steps.cuh says where each value goes).
 * GEMV: persistent warps stream W. A block of QS_WARPS warps holds T = QS_WARPS / S row tiles of R rows x S
 * splits of k (split s takes chunks s, s + S, ...); the block walks tile groups blockIdx.x, + gridDim.x, ...
 * Each warp copies its chunks (R rows x CB blocks, each row's enclosing 16-byte-aligned range) with cp.async
 * into a ring of NST stages private to the warp, NST - 1 chunks ahead across tile boundaries, so the warp's
 * loads never stop between tiles; only __syncwarp in the loop. Lanes r*LPR .. r*LPR + LPR-1 work on row r:
 * each takes PPL pieces of the chunk, decodes its units (qblock.cuh) and multiplies each with the M rows of
 * xq (dp4a into int32, qb_dot scales in f32). At a tile's end the row's lane sums are added with shuffles in
 * a fixed order, and the S splits through shared memory in split order (two block barriers; none when S = 1).
 * PDL: trigger at the top; the first NST - 1 chunks of W (immutable) are requested before pdl_wait(), xq and
 * y after.
 */
#include <stdint.h>

#include "kernels/cuda/check.h"
#include "kernels/cuda/matmul_q.h"
#include "kernels/cuda/pdl.h"
#include "kernels/cuda/matmul_q_steps.cuh"
#include "kernels/cuda/x8.cuh"

#define QS_WARPS 8 /* warps per block of the streaming kernels */
#define GQ_NST   4 /* ring stages per warp */

/* ----------------------------------------------------------------------------------------------------------
 */
/* x pre-pass */

/* Workspace for m rows of k: xq (m*k bytes), then the per-block values (m*k/32 x 16 bytes) at the next
 * 16-byte boundary; the same size in either layout (the fragment layout for m rows padded to a multiple of
 * 8). */
static size_t gq_xd_offset(int m, int k)
{
    return ((size_t)m * k + 15) & ~(size_t)15;
}

extern "C" size_t kern_cuda_qmm_x8_ws(int m, int k)
{
    return gq_xd_offset(m, k) + (size_t)m * (k / 32) * 16;
}

extern "C" void kern_cuda_qmm_x8_at(void *ws, int m, int k, uint8_t **xq, float **xd)
{
    *xq = (uint8_t *)ws;
    *xd = (float *)((char *)ws + gq_xd_offset(m, k));
}

/* Blocks of 32 of rows [0, mp) of x (rows past m read as zeros); thread g takes elements 4 (g % 8) .. + 3 of
 * block g / 8. FRAG: the fragment layout of matmul_q_steps.cuh, else xq (mp, k) and xd (mp, k/32) float4. */
template <bool FRAG>
__global__ void __launch_bounds__(256)
    gq_quantize_x_kernel(uint8_t *xq, float *xd, const float *x, int m, int mp, int k)
{
    pdl_wait(); /* x comes from the previous kernel, and the previous product may still read xq */
    pdl_trigger();
    const int nu = k / 32;
    const int64_t g = (int64_t)blockIdx.x * blockDim.x + threadIdx.x, ua = g >> 3;
    const int sub = threadIdx.x & 7;
    const bool ok = ua < (int64_t)mp * nu;
    const int row = ok ? (int)(ua / nu) : 0, u = ok ? (int)(ua - (int64_t)row * nu) : 0;
    const float4 v = ok && row < m
                         ? __ldg(reinterpret_cast<const float4 *>(x + (size_t)row * k + 32 * u) + sub)
                         : make_float4(0.f, 0.f, 0.f, 0.f);
    const x8_part p = x8_quant4(v);
    if (!ok) return;
    if (FRAG) {
        *reinterpret_cast<uint32_t *>(xq + gqm_xq_off(row, u, sub, nu)) = p.word;
        if (sub == 0) {
            const size_t o = gqm_xd_off(row, u, nu);
            *reinterpret_cast<float2 *>(xd + o) = make_float2(p.dx, p.s);
            *reinterpret_cast<float2 *>(xd + o + 4) =
                make_float2(__int_as_float(p.sq), __int_as_float(p.sq_hi));
        }
    } else {
        x8_store(xq, xd, p, row, u, sub, k);
    }
}

/* Quantizes rows [0, m) of x into the workspace for a kernel reading mp rows (mp >= m; rows past m zeros). */
int gq_quantize_x(const struct kern_cuda_qmm *c, const float *x, int m, int mp, bool frag, uint8_t **xq,
                  float **xd)
{
    *xq = (uint8_t *)c->ws;
    *xd = (float *)((char *)c->ws + gq_xd_offset(mp, c->k));
    const int64_t threads = (int64_t)mp * (c->k / 32) * 8;
    if (frag)
        FCUDA_CHECK(pdl_launch(gq_quantize_x_kernel<true>, dim3(fcuda_blocks(threads, 256)), dim3(256), 0,
                               c->stream, *xq, *xd, x, m, mp, c->k));
    else
        FCUDA_CHECK(pdl_launch(gq_quantize_x_kernel<false>, dim3(fcuda_blocks(threads, 256)), dim3(256), 0,
                               c->stream, *xq, *xd, x, m, mp, c->k));
    FCUDA_LAUNCH_CHECK("gq_quantize_x_kernel");
    return FERRY_OK;
}

/* ----------------------------------------------------------------------------------------------------------
 */
/* The dp4a GEMV */

/* y (m, ldy) = xq · Wᵀ for m <= M rows of x (rows past m repeat row m-1 and are not stored). */
template <class Q, int M, int R, int MINB>
__global__ void __launch_bounds__(QS_WARPS * 32, MINB)
    gq_kernel(float *y, int ldy, const int8_t *xq, const float *xd, const uint8_t *w, const float *bias,
              int m, int n, int k, int S)
{
    using SH = gq_shape<Q, R>;
    using G = typename SH::G;
    constexpr int LPR = SH::LPR, PPL = SH::PPL, CB = SH::CB, NST = GQ_NST;
    extern __shared__ __align__(16) unsigned char smem[];
    __shared__ float red[QS_WARPS][R][M];
    pdl_trigger();
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int T = QS_WARPS / S, tw = warp / S, split = warp - tw * S;
    const int nb = k / Q::QK, rowbytes = nb * Q::BYTES, nch = (nb + CB - 1) / CB, kb = k / 32;
    const int ntiles = (n + R - 1) / R, ntg = (ntiles + T - 1) / T, bx = (int)blockIdx.x, gx = (int)gridDim.x;
    const int J = bx < ntg ? (ntg - 1 - bx) / gx + 1 : 0;
    const int cnt = split < nch ? (nch - 1 - split) / S + 1 : 0;
    const uintptr_t wlo = (uintptr_t)w, a16 = wlo & ~(uintptr_t)15;
    const uint32_t w0 = (uint32_t)(wlo & 15), wbytes = (uint32_t)n * (uint32_t)rowbytes;
    unsigned char *ring = smem + (size_t)warp * NST * G::BYTES;
    const int r = lane / LPR, sl = lane % LPR;

    /* The chunk stream: chunk i of tile group j is the warp's (j * cnt + i)-th, in ring slot (j * cnt + i) %
     * NST; issue() requests the next one (or nothing past the end) and always commits a group, so that at the
     * top of iteration c exactly NST - 1 + c groups are committed. */
    int is_j = 0, is_i = 0, is_slot = 0;
    auto issue = [&]() {
        if (is_j < J && cnt > 0) {
            const int row0 = ((bx + is_j * gx) * T + tw) * R, b0 = (split + is_i * S) * CB;
            if (row0 < n)
                qs_issue<Q, R, CB>(ring + is_slot * G::BYTES, a16, w0, wbytes, row0, n, (uint32_t)rowbytes,
                                   b0, min(CB, nb - b0), lane);
            if (++is_i == cnt) is_i = 0, is_j++;
            is_slot = is_slot + 1 == NST ? 0 : is_slot + 1;
        }
        qs_commit();
    };
#pragma unroll 1
    for (int s = 0; s < NST - 1; s++) issue();
    pdl_wait();
    int xoff[M], doff[M]; /* row offsets into xq and xd */
#pragma unroll
    for (int c = 0; c < M; c++) xoff[c] = min(c, m - 1) * k, doff[c] = min(c, m - 1) * kb;
    int slot = 0;
    for (int j = 0; j < J; j++) {
        const int row0 = ((bx + j * gx) * T + tw) * R;
        const uintptr_t rowaddr = wlo + (size_t)min(row0 + r, n - 1) * rowbytes;
        float acc[M];
#pragma unroll
        for (int c = 0; c < M; c++) acc[c] = 0.0f;
        for (int i = 0; i < cnt; i++) {
            qs_wait<NST - 2>();
            __syncwarp();
            issue();
            const int b0 = (split + i * S) * CB, nbc = min(CB, nb - b0);
            const uint8_t *rb =
                ring + slot * G::BYTES + r * G::STRIDE + (unsigned)((rowaddr + (size_t)b0 * Q::BYTES) & 15);
            if (row0 < n) gq_lane_chunk<Q, M, LPR, PPL>(acc, rb, b0, nbc, sl, xq, xd, xoff, doff);
            slot = slot + 1 == NST ? 0 : slot + 1;
        }
        /* The LPR lanes of a row: butterfly sums; lane sl == 0's result is the one used. */
#pragma unroll
        for (int c = 0; c < M; c++)
#pragma unroll
            for (int o = LPR / 2; o > 0; o >>= 1) acc[c] += __shfl_xor_sync(0xffffffffu, acc[c], o);
        if (S > 1) {
            if (sl == 0)
#pragma unroll
                for (int c = 0; c < M; c++) red[warp][r][c] = acc[c];
            __syncthreads();
            if (split == 0 && sl == 0)
                for (int o = 1; o < S; o++)
#pragma unroll
                    for (int c = 0; c < M; c++) acc[c] += red[warp + o][r][c];
        }
        const int row = row0 + r;
        if (split == 0 && sl == 0 && row < n) {
            const float bv = bias ? bias[row] : 0.0f;
#pragma unroll
            for (int c = 0; c < M; c++)
                if (c < m) y[(size_t)c * ldy + row] = acc[c] + bv;
        }
        if (S > 1) __syncthreads(); /* red is rewritten by the next tile group */
    }
    qs_wait<0>();
}

/* ----------------------------------------------------------------------------------------------------------
 */
/* Host side: splits, grid, launch */

/* Splits of k per row tile (a power of two, at most the block's warps and the chunks per row): the block
 * holds T = QS_WARPS / S tiles, the persistent grid of `resident` blocks walks the ceil(tiles / T) tile
 * groups, so the busiest warp streams ceil(groups / resident) * ceil(nch / S) chunks; the S with the fewest,
 * ties to fewer splits (each split costs two block barriers per tile group). */
int qs_splits(int tiles, int nch, int64_t resident)
{
    int best = 1;
    int64_t best_cost = -1;
    for (int S = 1; S <= QS_WARPS && S <= nch; S *= 2) {
        const int64_t groups = ((int64_t)tiles * S + QS_WARPS - 1) / QS_WARPS;
        const int64_t cost = (groups + resident - 1) / resident * ((nch + S - 1) / S);
        if (best_cost < 0 || cost < best_cost) best = S, best_cost = cost;
    }
    return best;
}

template <class Q, int M, int R>
static int gq_launch(const struct kern_cuda_qmm *c, float *y, const int8_t *xq, const float *xd, int m)
{
    using SH = gq_shape<Q, R>;
    constexpr int MINB = M <= 2 ? 3 : 2;
    constexpr size_t smem = (size_t)QS_WARPS * GQ_NST * SH::G::BYTES + 16;
    auto kern = gq_kernel<Q, M, R, MINB>;
    static int per_sm = 0;
    if (!per_sm) {
        if (smem > (size_t)fcuda_smem_optin()) return FERRY_ERR_UNSUPPORTED;
        FCUDA_CHECK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        FCUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kern, QS_WARPS * 32, smem));
        if (per_sm < 1) return FERRY_ERR_UNSUPPORTED;
    }
    const int tiles = (c->n + R - 1) / R, nch = (c->k / Q::QK + SH::CB - 1) / SH::CB;
    const int64_t resident = (int64_t)fcuda_sm_count() * per_sm;
    const int S = qs_splits(tiles, nch, resident), T = QS_WARPS / S;
    const int64_t ntg = (tiles + T - 1) / T;
    const unsigned blocks = (unsigned)(ntg < resident ? ntg : resident);
    FCUDA_CHECK(pdl_launch(kern, dim3(blocks), dim3(QS_WARPS * 32), smem, c->stream, y, c->ldy, xq, xd,
                           (const uint8_t *)c->w, c->bias, m, c->n, c->k, S));
    FCUDA_LAUNCH_CHECK("gq_kernel");
    return FERRY_OK;
}

template <class Q, int R>
static int gq_tile(const struct kern_cuda_qmm *c, float *y, const float *x, int m, bool ready)
{
    uint8_t *xq;
    float *xd;
    if (ready) {
        kern_cuda_qmm_x8_at(c->ws, m, c->k, &xq, &xd);
    } else {
        const int rc = gq_quantize_x(c, x, m, m, false, &xq, &xd);
        if (rc) return rc;
    }
    switch (m) {
    case 1:
        return gq_launch<Q, 1, R>(c, y, (const int8_t *)xq, xd, m);
    case 2:
        return gq_launch<Q, 2, R>(c, y, (const int8_t *)xq, xd, m);
    case 3:
        return gq_launch<Q, 3, R>(c, y, (const int8_t *)xq, xd, m);
    default:
        return gq_launch<Q, 4, R>(c, y, (const int8_t *)xq, xd, m);
    }
}

/* The entry for type Q: row tiles of at most KERN_CUDA_QDP4A_MAX_M rows of x (fewer when the workspace cannot
 * hold x's int8 form for 4 rows; FERRY_ERR_RANGE when it cannot hold one), R rows of W per warp (1, 2, 4);
 * the caller checked the arguments. */
template <class Q> int kern_cuda_qgemv(const struct kern_cuda_qmm *c, int R)
{
    int tile = KERN_CUDA_QDP4A_MAX_M;
    while (tile > 0 && c->ws_bytes < kern_cuda_qmm_x8_ws(tile, c->k)) tile--;
    if (tile == 0) return FERRY_ERR_RANGE;
    const bool ready = c->x_ready && c->m <= tile; /* one tile, its x already in ws */
    for (int i = 0; i < c->m; i += tile) {
        const int mt = min(tile, c->m - i);
        float *y = c->y + (size_t)i * c->ldy;
        const float *x = c->x + (size_t)i * c->k;
        const int rc = R == 1   ? gq_tile<Q, 1>(c, y, x, mt, ready)
                       : R == 2 ? gq_tile<Q, 2>(c, y, x, mt, ready)
                                : gq_tile<Q, 4>(c, y, x, mt, ready);
        if (rc) return rc;
    }
    return FERRY_OK;
}
#define GQ_INSTANCE(T, name, Q) template int kern_cuda_qgemv<Q>(const struct kern_cuda_qmm *, int);
QB_TYPES(GQ_INSTANCE)
#undef GQ_INSTANCE
