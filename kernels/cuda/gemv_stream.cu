/* gemv_stream (CUDA) — the bandwidth GEMV for GGUF block weights (KERN_QV_STREAM): decode steps of 1..8 rows
 * of x read W once at the memory's pace, the m rows multiplying each weight unit while it is in registers;
 * see matmul_q.h for the contract and kernels/cuda/NOTES.md (Version 10) for the reasoning and the count of
 * instructions per weight byte. Every block type of qblock.cuh (its decode and qb_dot, as the dp4a GEMV);
 * designed and sized for the Q4_K_M mix (Q4_K, Q6_K) and Q8_0.
 *
 * x is quantized to int8 per block of 32 by gemv_q.cu's pre-pass (natural layout; skipped when the norm wrote
 * it) and read through L1 (W's copies bypass L1: cp.async.cg). The grid is persistent: warp gw of GW walks
 * tasks gw, gw + GW, ... (a task: R consecutive rows of W, all of k), and its chunks (R rows x CB blocks)
 * stream through a ring of NST stages private to the warp, NST - 1 chunks ahead and across task boundaries,
 * so the warp's loads never stop until its last chunk; the only barrier is __syncwarp. All 32 lanes take the
 * same k range of the R rows (gemv_stream.cuh: gs_lane_chunk), so each x value loaded serves R rows and each
 * unit decoded serves M rows of x. At a task's end the 32 lane sums of each (x row, W row) are added with a
 * fixed butterfly (deterministic) and one lane per pair stores it. No split of k: the host picks R (4, 2, 1)
 * and sizes the grid so that the tasks divide evenly over the warps it launches.
 * PDL: trigger at the top; the first NST - 1 chunks of W (immutable) are requested before pdl_wait(), x and y
 * after.
 */
#include <stdint.h>

#include "kernels/cuda/check.h"
#include "kernels/cuda/gemv_stream.cuh"
#include "kernels/cuda/matmul_q.h"
#include "kernels/cuda/pdl.h"

/* Warps per block: small blocks, so that the shared memory of 4-row stages still fits several per SM. */
#define GS_WARPS 4
/* Blocks per SM the registers must allow: 4 (at most 128 registers a thread, 16 warps per SM) while M x R
 * accumulators are few; 2 (up to 255) from M x R = 8, where 128 registers spill hundreds of bytes. */
#define GS_MINB(M, R) ((M) * (R) < 8 ? 4 : 2)

int gq_quantize_x(const struct kern_cuda_qmm *c, const float *x, int m, int mp, bool frag, uint8_t **xq,
                  float **xd); /* gemv_q.cu */

/* y (m, ldy) = xq · Wᵀ (+ bias) for m <= M rows of x (rows past m repeat row m-1 and are not stored). */
template <class Q, int M, int R>
__global__ void __launch_bounds__(GS_WARPS * 32, GS_MINB(M, R))
    gs_kernel(float *y, int ldy, const int8_t *xq, const float *xd, const uint8_t *w, const float *bias,
              int m, int n, int k)
{
    using SH = gs_shape<Q, R>;
    using G = typename SH::G;
    constexpr int CB = SH::CB, NST = SH::NST;
    extern __shared__ __align__(16) unsigned char smem[];
    pdl_trigger();
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int gw = (int)blockIdx.x * GS_WARPS + warp, GW = (int)gridDim.x * GS_WARPS;
    const int nb = k / Q::QK, rowbytes = nb * Q::BYTES, nch = (nb + CB - 1) / CB;
    const int ntasks = (n + R - 1) / R, J = gw < ntasks ? (ntasks - 1 - gw) / GW + 1 : 0;
    const uintptr_t wlo = (uintptr_t)w, a16 = wlo & ~(uintptr_t)15;
    const uint32_t w0 = (uint32_t)(wlo & 15), wbytes = (uint32_t)n * (uint32_t)rowbytes;
    unsigned char *ring = smem + (size_t)warp * NST * G::BYTES;

    /* The chunk stream: chunk i of the warp's task j is its (j * nch + i)-th, in ring slot (j * nch + i) %
     * NST; issue() requests the next one (or nothing past the end) and always commits a group, so that at the
     * top of iteration c exactly NST - 1 + c groups are committed. */
    int is_j = 0, is_i = 0, is_slot = 0;
    auto issue = [&]() {
        if (is_j < J) {
            const int row0 = (gw + is_j * GW) * R, b0 = is_i * CB;
            qs_issue<Q, R, CB>(ring + is_slot * G::BYTES, a16, w0, wbytes, row0, n, (uint32_t)rowbytes, b0,
                               min(CB, nb - b0), lane);
            if (++is_i == nch) is_i = 0, is_j++;
            is_slot = is_slot + 1 == NST ? 0 : is_slot + 1;
        }
        qs_commit();
    };
#pragma unroll 1
    for (int s = 0; s < NST - 1; s++) issue();
    pdl_wait();
    int xoff[M], doff[M]; /* row offsets into xq and xd */
#pragma unroll
    for (int c = 0; c < M; c++) xoff[c] = min(c, m - 1) * k, doff[c] = min(c, m - 1) * (k / 32);
    int slot = 0;
#pragma unroll 1
    for (int j = 0; j < J; j++) {
        const int row0 = (gw + j * GW) * R;
        uintptr_t rowaddr[R];
#pragma unroll
        for (int r = 0; r < R; r++) rowaddr[r] = wlo + (size_t)min(row0 + r, n - 1) * rowbytes;
        float acc[M][R];
#pragma unroll
        for (int c = 0; c < M; c++)
#pragma unroll
            for (int r = 0; r < R; r++) acc[c][r] = 0.0f;
#pragma unroll 1
        for (int i = 0; i < nch; i++) {
            qs_wait<NST - 2>();
            __syncwarp();
            issue();
            const int b0 = i * CB, nbc = min(CB, nb - b0);
            unsigned sh[R];
#pragma unroll
            for (int r = 0; r < R; r++) sh[r] = (unsigned)((rowaddr[r] + (size_t)b0 * Q::BYTES) & 15);
            gs_lane_chunk<Q, M, R, SH::PPL>(acc, ring + slot * G::BYTES, G::STRIDE, sh, b0, nbc, lane, xq, xd,
                                            xoff, doff);
            slot = slot + 1 == NST ? 0 : slot + 1;
        }
        /* Every lane ends with the 32 lanes' sums (butterfly: a fixed order); lane c * R + r stores (c, r).
         */
#pragma unroll
        for (int c = 0; c < M; c++)
#pragma unroll
            for (int r = 0; r < R; r++)
#pragma unroll
                for (int o = 16; o > 0; o >>= 1) acc[c][r] += __shfl_xor_sync(0xffffffffu, acc[c][r], o);
#pragma unroll
        for (int c = 0; c < M; c++)
#pragma unroll
            for (int r = 0; r < R; r++)
                if (lane == c * R + r && c < m && row0 + r < n)
                    y[(size_t)c * ldy + row0 + r] = acc[c][r] + (bias ? bias[row0 + r] : 0.0f);
    }
    qs_wait<0>();
}

/* ----------------------------------------------------------------------------------------------------------
 */
/* Host side: rows per task, grid, launch */

static int g_rows = 0; /* kern_cuda_qstream_set_rows: 0 = the choice below */

extern "C" int kern_cuda_qstream_set_rows(int rows)
{
    if (rows != 0 && rows != 1 && rows != 2 && rows != 4) return FERRY_ERR_INVALID;
    const int prev = g_rows;
    g_rows = rows;
    return prev;
}

/* Warps of gs_kernel<Q, M, R> resident on the device (0: it cannot run); sets its shared memory once. */
template <class Q, int M, int R> static int64_t gs_resident(void)
{
    using SH = gs_shape<Q, R>;
    constexpr size_t smem = (size_t)GS_WARPS * SH::NST * SH::G::BYTES + 16;
    static int per_sm = -1;
    if (per_sm < 0) {
        per_sm = 0;
        if (smem > (size_t)fcuda_smem_optin()) return 0;
        auto kern = gs_kernel<Q, M, R>;
        if (cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem) !=
                cudaSuccess ||
            cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kern, GS_WARPS * 32, smem) !=
                cudaSuccess) {
            (void)cudaGetLastError();
            per_sm = 0;
        }
    }
    return (int64_t)fcuda_sm_count() * per_sm * GS_WARPS;
}

template <class Q, int M, int R>
static int gs_launch(const struct kern_cuda_qmm *c, float *y, const int8_t *xq, const float *xd, int m)
{
    using SH = gs_shape<Q, R>;
    constexpr size_t smem = (size_t)GS_WARPS * SH::NST * SH::G::BYTES + 16;
    const int64_t resident = gs_resident<Q, M, R>();
    if (resident <= 0) return FERRY_ERR_UNSUPPORTED;
    /* As many warps as give every warp the same number of rounds: the tasks divide evenly, and no warp holds
     * the last round alone. */
    const int64_t ntasks = (c->n + R - 1) / R, rounds = (ntasks + resident - 1) / resident;
    const int64_t warps = (ntasks + rounds - 1) / rounds;
    const unsigned blocks = (unsigned)((warps + GS_WARPS - 1) / GS_WARPS);
    FCUDA_CHECK(pdl_launch(gs_kernel<Q, M, R>, dim3(blocks), dim3(GS_WARPS * 32), smem, c->stream, y, c->ldy,
                           xq, xd, (const uint8_t *)c->w, c->bias, m, c->n, c->k));
    FCUDA_LAUNCH_CHECK("gs_kernel");
    return FERRY_OK;
}

/* Rows per task: the set hook's, else the most rows (each x value then serves more of them) that still give
 * at least 8 tasks per SM (8 warps streaming on every SM: at 2 chunks of 4.6-6.8 KB in flight each for 4
 * rows, ~75-110 KB per SM, several times what the memory's latency needs); n = 4096 takes 2 rows, the
 * Llama-2-7B q|k|v and gate|up products 4. */
static int gs_pick_rows(int n)
{
    if (g_rows) return g_rows;
    const int64_t want = (int64_t)8 * fcuda_sm_count();
    if ((n + 3) / 4 >= want) return 4;
    if ((n + 1) / 2 >= want) return 2;
    return 1;
}

/* The chosen rows per task; without the set hook, fewer rows where the device cannot hold a block of the
 * chosen configuration (a type whose 4-row stages exceed its shared memory). */
template <class Q, int M>
static int gs_tile_m(const struct kern_cuda_qmm *c, float *y, const int8_t *xq, const float *xd, int m)
{
    const int rows = gs_pick_rows(c->n);
    int rc = FERRY_ERR_UNSUPPORTED;
    if (rows == 4) rc = gs_launch<Q, M, 4>(c, y, xq, xd, m);
    if (rows == 2 || (rc == FERRY_ERR_UNSUPPORTED && rows == 4 && !g_rows))
        rc = gs_launch<Q, M, 2>(c, y, xq, xd, m);
    if (rows == 1 || (rc == FERRY_ERR_UNSUPPORTED && rows >= 2 && !g_rows))
        rc = gs_launch<Q, M, 1>(c, y, xq, xd, m);
    return rc;
}

template <class Q>
static int gs_tile(const struct kern_cuda_qmm *c, float *y, const float *x, int m, bool ready)
{
    uint8_t *xq;
    float *xd;
    if (ready) {
        kern_cuda_qmm_x8_at(c->ws, m, c->k, &xq, &xd);
    } else {
        const int rc = gq_quantize_x(c, x, m, m, false, &xq, &xd);
        if (rc) return rc;
    }
    const int8_t *q = (const int8_t *)xq;
    if (m == 1) return gs_tile_m<Q, 1>(c, y, q, xd, m);
    if (m == 2) return gs_tile_m<Q, 2>(c, y, q, xd, m);
    if (m <= 4) return gs_tile_m<Q, 4>(c, y, q, xd, m);
    return gs_tile_m<Q, 8>(c, y, q, xd, m);
}

/* The entry for type Q: row tiles of at most GS_MAX_M rows of x (fewer when the workspace cannot hold x's
 * int8 form for 8 rows; FERRY_ERR_RANGE when it cannot hold one); the caller checked the arguments. */
template <class Q> int kern_cuda_qstream(const struct kern_cuda_qmm *c)
{
    int tile = GS_MAX_M;
    while (tile > 0 && c->ws_bytes < kern_cuda_qmm_x8_ws(tile, c->k)) tile--;
    if (tile == 0) return FERRY_ERR_RANGE;
    const bool ready = c->x_ready && c->m <= tile; /* one tile, its x already in ws */
    for (int i = 0; i < c->m; i += tile) {
        const int mt = min(tile, c->m - i);
        const int rc = gs_tile<Q>(c, c->y + (size_t)i * c->ldy, c->x + (size_t)i * c->k, mt, ready);
        if (rc) return rc;
    }
    return FERRY_OK;
}
#define GS_INSTANCE(T, name, Q) template int kern_cuda_qstream<Q>(const struct kern_cuda_qmm *);
QB_TYPES(GS_INSTANCE)
#undef GS_INSTANCE
