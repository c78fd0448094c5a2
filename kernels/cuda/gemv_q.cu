/* gemv_q (CUDA) — the int8 GEMV for GGUF block weights (decode batches, m <= KERN_CUDA_QGEMV_MAX_M per
 * launch); see matmul_q.h for the contract and kernels/cuda/NOTES.md (Version 7) for the reasoning.
 *
 * Pre-pass: x (m, k) f32 -> xq (m, k) int8 and xd (m, k/32) float4 {dx, Σx, Σxq over 0..15, over 16..31} in
 * the workspace, one group of 8 lanes per block of 32 (4 elements per lane, shuffle reductions in a fixed
 * order). Main kernel: a warp owns R rows of W and walks k in chunks of CB blocks. It copies the chunk of its
 * R rows with 16-byte loads of the enclosing 16-byte-aligned range (so each row keeps its address mod 16,
 * which the type's aligned loads rely on) into registers one chunk ahead, then into a shared-memory buffer
 * private to the warp (only __syncwarp in the loop). Lanes r*LPR .. r*LPR + LPR-1 work on row r: each takes
 * PPL pieces of the chunk, loads a piece from shared memory with the type's loader (qblock.cuh), decodes its
 * units and multiplies each with the M rows of xq (dp4a into int32, qb_dot scales in f32). A row's lane sums
 * are added with shuffles in a fixed order; the S warps that split k for the same rows are added through
 * shared memory in split order. PDL: trigger at the top, the first chunk of W (immutable) requested before
 * pdl_wait(), xq / y after.
 */
#include <stdint.h>

#include "kernels/cuda/check.h"
#include "kernels/cuda/matmul_q.h"
#include "kernels/cuda/pdl.h"
#include "kernels/cuda/matmul_q_steps.cuh"

/* ----------------------------------------------------------------------------------------------------------
 */
/* x pre-pass */

/* Workspace layout for m rows of k: xq (m*k bytes), then xd (m*k/32 float4) at the next 16-byte boundary. */
static size_t gq_xd_offset(int m, int k)
{
    return ((size_t)m * k + 15) & ~(size_t)15;
}

extern "C" size_t kern_cuda_qmm_gemv_ws(int m, int k)
{
    return gq_xd_offset(m, k) + (size_t)m * (k / 32) * sizeof(float4);
}

/* nu blocks of 32 of x (contiguous rows); thread g takes elements 4g .. 4g+3. */
__global__ void __launch_bounds__(256)
    gq_quantize_x_kernel(int8_t *xq, float4 *xd, const float *x, int64_t nu)
{
    pdl_wait(); /* x comes from the previous kernel, and the previous product may still read xq */
    pdl_trigger();
    const int64_t g = (int64_t)blockIdx.x * blockDim.x + threadIdx.x, u = g >> 3;
    const int sub = threadIdx.x & 7;
    const bool ok = u < nu;
    const float4 v = ok ? __ldg(reinterpret_cast<const float4 *>(x) + g) : make_float4(0.f, 0.f, 0.f, 0.f);
    float amax = fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w)));
#pragma unroll
    for (int o = 1; o < 8; o <<= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    const float dx = __fdiv_rn(amax, 127.0f), id = amax > 0.0f ? __fdiv_rn(127.0f, amax) : 0.0f;
    const int q0 = __float2int_rn(__fmul_rn(v.x, id)), q1 = __float2int_rn(__fmul_rn(v.y, id));
    const int q2 = __float2int_rn(__fmul_rn(v.z, id)), q3 = __float2int_rn(__fmul_rn(v.w, id));
    float s = __fadd_rn(__fadd_rn(v.x, v.y), __fadd_rn(v.z, v.w));
    int sq = q0 + q1 + q2 + q3;
#pragma unroll
    for (int o = 1; o < 8; o <<= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    sq += __shfl_xor_sync(0xffffffffu, sq, 1);
    sq += __shfl_xor_sync(0xffffffffu, sq, 2); /* lanes 0-3: elements 0..15, lanes 4-7: 16..31 */
    const int sq_hi = __shfl_xor_sync(0xffffffffu, sq, 4);
    if (!ok) return;
    reinterpret_cast<uint32_t *>(xq)[g] = (uint32_t)(q0 & 255) | (uint32_t)(q1 & 255) << 8 |
                                          (uint32_t)(q2 & 255) << 16 | (uint32_t)(q3 & 255) << 24;
    if (sub == 0) xd[u] = make_float4(dx, s, __int_as_float(sq), __int_as_float(sq_hi));
}

/* ----------------------------------------------------------------------------------------------------------
 */
/* The GEMV kernel */

/* 16-byte streaming load that skips L1 (weights are read once; xq keeps L1). */
__device__ __forceinline__ uint4 gq_ld_stream(uintptr_t p)
{
    uint4 r;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
                 : "l"(p));
    return r;
}

/* This lane's 16-byte pieces of chunk rows [row0, row0 + R) x blocks [b0, b0 + cb) (rows past n repeat row
 * n-1): piece i = lane + 32p is row i / QMAX, piece i % QMAX of the row's aligned range. Pieces past the
 * chunk are left as they are (never read); pieces that would reach outside W (at its two ends, when W's start
 * or end is not 16-byte aligned) are assembled from the chunk's own bytes with 2-byte loads. */
template <int R, int QMAX, int NP>
__device__ __forceinline__ void gq_stage_load(uint4 (&v)[NP], uintptr_t wlo, uintptr_t whi, int row0, int n,
                                              int rowbytes, int b0, int nbytes, int bytes, int lane)
{
#pragma unroll
    for (int p = 0; p < NP; p++) {
        const int i = lane + 32 * p;
        if (R * QMAX % 32 && i >= R * QMAX) break;
        const int r = i / QMAX, q = i - r * QMAX;
        const uintptr_t ga = wlo + (size_t)min(row0 + r, n - 1) * rowbytes + (size_t)b0 * bytes;
        const uintptr_t src = (ga & ~(uintptr_t)15) + 16 * q;
        if (src >= ga + nbytes) continue;
        if (src >= wlo && src + 16 <= whi) {
            v[p] = gq_ld_stream(src);
        } else {
            uint32_t u[4] = {0, 0, 0, 0};
#pragma unroll
            for (int e = 0; e < 16; e += 2) {
                const uintptr_t a = src + e;
                if (a >= ga && a < ga + nbytes)
                    u[e / 4] |= (uint32_t)__ldg(reinterpret_cast<const uint16_t *>(a)) << (8 * (e % 4));
            }
            v[p] = make_uint4(u[0], u[1], u[2], u[3]);
        }
    }
}

template <int R, int QMAX, int NP, int STRIDE>
__device__ __forceinline__ void gq_stage_store(unsigned char *buf, const uint4 (&v)[NP], int lane)
{
#pragma unroll
    for (int p = 0; p < NP; p++) {
        const int i = lane + 32 * p;
        if (R * QMAX % 32 && i >= R * QMAX) break;
        const int r = i / QMAX, q = i - r * QMAX;
        *reinterpret_cast<uint4 *>(buf + r * STRIDE + 16 * q) = v[p];
    }
}

/* y (m, ldy) = xq · Wᵀ for m <= M rows of x (rows past m repeat row m-1 and are not stored). A block of WARPS
 * warps holds T = WARPS/S row tiles of R rows x S splits of k (split j takes chunks j, j+S, ...). */
template <class Q, int M, int R, int WARPS, int MINB>
__global__ void __launch_bounds__(WARPS * 32, MINB)
    gq_gemv_kernel(float *y, int ldy, const int8_t *xq, const float4 *xd, const uint8_t *w, const float *bias,
                   int m, int n, int k, int S)
{
    using SH = gq_shape<Q, R>;
    constexpr int LPR = SH::LPR, PPL = SH::PPL, CB = SH::CB, QMAX = SH::QMAX, STRIDE = SH::STRIDE,
                  NP = SH::NP;
    extern __shared__ __align__(16) unsigned char smem[];
    __shared__ float red[WARPS][R][M];
    pdl_trigger();
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const int T = WARPS / S, tile = warp / S, split = warp % S;
    const int row0 = (blockIdx.x * T + tile) * R;
    const int nb = k / Q::QK, rowbytes = nb * Q::BYTES, nch = (nb + CB - 1) / CB, kb = k / 32;
    const uintptr_t wlo = (uintptr_t)w, whi = wlo + (size_t)n * rowbytes;
    unsigned char *buf = smem + (size_t)warp * R * STRIDE;
    const int my_n = row0 < n && split < nch ? (nch - split + S - 1) / S : 0;
    const int r = lane / LPR, sl = lane % LPR;
    const uintptr_t rowaddr = wlo + (size_t)min(row0 + r, n - 1) * rowbytes;

    uint4 v[NP];
#pragma unroll
    for (int p = 0; p < NP; p++) v[p] = make_uint4(0, 0, 0, 0);
    if (my_n > 0)
        gq_stage_load<R, QMAX, NP>(v, wlo, whi, row0, n, rowbytes, split * CB,
                                   min(CB, nb - split * CB) * Q::BYTES, Q::BYTES, lane);
    pdl_wait();
    int xoff[M], doff[M]; /* row offsets into xq and xd */
#pragma unroll
    for (int c = 0; c < M; c++) xoff[c] = min(c, m - 1) * k, doff[c] = min(c, m - 1) * kb;
    float acc[M];
#pragma unroll
    for (int c = 0; c < M; c++) acc[c] = 0.0f;

    for (int i = 0; i < my_n; i++) {
        const int ch = split + i * S, b0 = ch * CB, nbc = min(CB, nb - b0);
        gq_stage_store<R, QMAX, NP, STRIDE>(buf, v, lane);
        __syncwarp();
        if (i + 1 < my_n) {
            const int bn = (ch + S) * CB;
            gq_stage_load<R, QMAX, NP>(v, wlo, whi, row0, n, rowbytes, bn, min(CB, nb - bn) * Q::BYTES,
                                       Q::BYTES, lane);
        }
        const uint8_t *rb = buf + r * STRIDE + (unsigned)((rowaddr + (size_t)b0 * Q::BYTES) & 15);
        gq_lane_chunk<Q, M, LPR, PPL>(acc, rb, b0, nbc, sl, xq, reinterpret_cast<const float *>(xd), xoff,
                                      doff);
        __syncwarp();
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
        if (split != 0) return;
        if (sl == 0)
            for (int o = 1; o < S; o++)
#pragma unroll
                for (int c = 0; c < M; c++) acc[c] += red[warp + o][r][c];
    }
    const int row = row0 + r;
    if (sl != 0 || row >= n) return;
    const float bv = bias ? bias[row] : 0.0f;
#pragma unroll
    for (int c = 0; c < M; c++)
        if (c < m) y[(size_t)c * ldy + row] = acc[c] + bv;
}

/* ----------------------------------------------------------------------------------------------------------
 */
/* Host side: configurations, split choice, launch */

static int gq_forced = 0;

static const char *const gq_names[KERN_CUDA_QGEMV_CONFIGS + 1] = {
    "auto",
    "4 rows/warp, 8-warp blocks, 3/SM (m > 2: 2)",
    "2 rows/warp, 8-warp blocks, 3/SM (m > 2: 2)",
    "4 rows/warp, 16-warp blocks, 2/SM (m > 1: 1)",
};

/* Splits of k per row tile, as gemv_q8.cu: a memory-bound block's time is about its rows, an SM runs
 * ceil(blocks / SMs) blocks of T = warps/S tiles one after another, so the cost of S is ceil(blocks / SMs) *
 * T; ties go to more splits (more warps resident for the same work). */
static int gq_splits(int tiles, int nch, int warps)
{
    const int64_t sms = fcuda_sm_count();
    int best = 1;
    int64_t best_cost = -1;
    for (int S = 1; S <= warps && S <= nch; S *= 2) {
        const int T = warps / S;
        const int64_t blocks = (tiles + T - 1) / T, cost = (blocks + sms - 1) / sms * T;
        if (best_cost < 0 || cost <= best_cost) {
            best = S;
            best_cost = cost;
        }
    }
    return best;
}

template <class Q, int M, int R, int WARPS, int MINB>
static int gq_launch(const struct kern_cuda_qmm *c, float *y, const int8_t *xq, const float4 *xd, int m)
{
    using SH = gq_shape<Q, R>;
    constexpr size_t smem = (size_t)WARPS * R * SH::STRIDE;
    auto kern = gq_gemv_kernel<Q, M, R, WARPS, MINB>;
    static bool attr_set = false;
    if (!attr_set) {
        FCUDA_CHECK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        attr_set = true;
    }
    const int tiles = (c->n + R - 1) / R, nch = (c->k / Q::QK + SH::CB - 1) / SH::CB;
    const int S = gq_splits(tiles, nch, WARPS), T = WARPS / S;
    const unsigned blocks = (unsigned)((tiles + T - 1) / T);
    FCUDA_CHECK(pdl_launch(kern, dim3(blocks), dim3(WARPS * 32), smem, c->stream, y, c->ldy, xq, xd,
                           (const uint8_t *)c->w, c->bias, m, c->n, c->k, S));
    FCUDA_LAUNCH_CHECK("gq_gemv_kernel");
    return FERRY_OK;
}

/* Blocks per SM the registers must allow: 3 x 8 warps (80 registers) up to m = 2, 2 x 8 (128) above, where
 * holding a K-quant piece, its unit and M rows of x would spill; 16-warp blocks likewise 2 then 1. */
template <class Q, int M>
static int gq_config(int cfg, const struct kern_cuda_qmm *c, float *y, const int8_t *xq, const float4 *xd,
                     int m)
{
    switch (cfg) {
    case 2:
        return gq_launch < Q, M, 2, 8, M <= 2 ? 3 : 2 > (c, y, xq, xd, m);
    case 3:
        return gq_launch < Q, M, 4, 16, M <= 1 ? 2 : 1 > (c, y, xq, xd, m);
    default:
        return gq_launch < Q, M, 4, 8, M <= 2 ? 3 : 2 > (c, y, xq, xd, m);
    }
}

/* One tile of at most KERN_CUDA_QGEMV_MAX_M rows: quantize x, then the GEMV with M = m rounded up. */
template <class Q> static int gq_tile(const struct kern_cuda_qmm *c, float *y, const float *x, int m)
{
    const int k = c->k;
    int8_t *xq = (int8_t *)c->ws;
    float4 *xd = (float4 *)((char *)c->ws + gq_xd_offset(m, k));
    const int64_t nu = (int64_t)m * (k / 32);
    FCUDA_CHECK(pdl_launch(gq_quantize_x_kernel, dim3(fcuda_blocks(nu * 8, 256)), dim3(256), 0, c->stream, xq,
                           xd, x, nu));
    FCUDA_LAUNCH_CHECK("gq_quantize_x_kernel");
    const int cfg = gq_forced ? gq_forced : 1;
    switch (m) {
    case 1:
        return gq_config<Q, 1>(cfg, c, y, xq, xd, m);
    case 2:
        return gq_config<Q, 2>(cfg, c, y, xq, xd, m);
    case 3:
        return gq_config<Q, 3>(cfg, c, y, xq, xd, m);
    case 4:
        return gq_config<Q, 4>(cfg, c, y, xq, xd, m);
    default:
        return gq_config<Q, 8>(cfg, c, y, xq, xd, m);
    }
}

template <class Q> static int gq_run(const struct kern_cuda_qmm *c)
{
    /* Row tiles of at most KERN_CUDA_QGEMV_MAX_M, each fitting the workspace (checked by the caller for one).
     */
    for (int i = 0; i < c->m; i += KERN_CUDA_QGEMV_MAX_M) {
        const int mt = min(KERN_CUDA_QGEMV_MAX_M, c->m - i);
        const int rc = gq_tile<Q>(c, c->y + (size_t)i * c->ldy, c->x + (size_t)i * c->k, mt);
        if (rc) return rc;
    }
    return FERRY_OK;
}

/* The entry for type Q (matmul.cu's type table): arguments checked by the caller, the workspace holds
 * kern_cuda_qmm_gemv_ws(min(m, KERN_CUDA_QGEMV_MAX_M), k) bytes. */
template <class Q> int kern_cuda_qgemv(const struct kern_cuda_qmm *c)
{
    return gq_run<Q>(c);
}
#define GQ_INSTANCE(T, name, Q) template int kern_cuda_qgemv<Q>(const struct kern_cuda_qmm *);
QB_TYPES(GQ_INSTANCE)
#undef GQ_INSTANCE

extern "C" int kern_cuda_qmm_set_gemv_config(int config)
{
    if (config < 0 || config > KERN_CUDA_QGEMV_CONFIGS) return FERRY_ERR_INVALID;
    const int prev = gq_forced;
    gq_forced = config;
    return prev;
}

extern "C" const char *kern_cuda_qmm_gemv_config_name(int config)
{
    return config >= 0 && config <= KERN_CUDA_QGEMV_CONFIGS ? gq_names[config] : "?";
}
