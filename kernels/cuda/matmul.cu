/* matmul (CUDA) — the type table (each weight type's decode and large-batch entries), the GEMV / skinny-GEMM
 * kernels of the F32/F16/BF16 decode entry and the cuBLAS path of their large-batch entry; see matmul.h for
 * the contract. The GGUF block types' kernels are in gemv_q.cu and gemm_q.cu (matmul_q.h).
 *
 * GEMV design: one warp per R output rows (R = 1..4 by m); each lane streams 16-byte chunks of the weight
 * rows (up to 8 in flight before the first use, loaded with L1::no_allocate so that x keeps L1), multiplies
 * them with up to 16 rows of x (f32, read through L1, each x chunk used for the R rows) and the warp reduces
 * with shuffles in a fixed order. Weight bytes are read exactly once per call, so the time is n*k*sizeof(w) /
 * bandwidth plus the x traffic through L1, which grows with m.
 */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda/check.h"
#include "kernels/cuda/gemv_q8.h"
#include "kernels/cuda/matmul.h"
#include "kernels/cuda/matmul_q.h"
#include "kernels/cuda/pdl.h"
#include "kernels/cuda/qblock.cuh"

#define GEMV_WARPS      4
#define GEMV_UNROLL     4
#define CUBLAS_WS_BYTES (32u << 20)

struct kern_cuda_ctx {
    cublasHandle_t handle;
    void *xbuf; /* (2 * max_x_elems) bytes: x rounded to f16/bf16, or x as int8 + scales (matmul_q.h) */
    size_t max_x_elems;
    void *cublas_ws; /* (CUBLAS_WS_BYTES) cuBLAS workspace, so that calls allocate nothing (graph capture) */
    void *w16;       /* (w16_bytes) rows of a block-type W decoded to f16 (KERN_QV_F16_PIECES), or NULL */
    size_t w16_bytes;
    /* xbuf holds the int8 form of x8_src (x8_m rows of x8_k) in the natural layout, written beside x by the
     * kernel that wrote x (kern_cuda_matmul_x8_target); NULL when not. */
    const float *x8_src;
    int x8_m, x8_k;
};

/* ----------------------------------------------------------------------------------------------------------
 */
/* GEMV kernels */

enum { WT_F32 = 0, WT_F16 = 1, WT_BF16 = 2 };

__device__ __forceinline__ uint4 ld_stream(const uint4 *p)
{
    uint4 r;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
                 : "l"(p));
    return r;
}

template <int WT> __device__ __forceinline__ void unpack16(uint4 v, float *f)
{
    const uint32_t u[4] = {v.x, v.y, v.z, v.w};
    if (WT == WT_F32) {
#pragma unroll
        for (int i = 0; i < 4; i++) f[i] = __uint_as_float(u[i]);
    } else if (WT == WT_F16) {
#pragma unroll
        for (int i = 0; i < 4; i++) {
            __half2 h = *reinterpret_cast<const __half2 *>(&u[i]);
            float2 t = __half22float2(h);
            f[2 * i] = t.x;
            f[2 * i + 1] = t.y;
        }
    } else {
#pragma unroll
        for (int i = 0; i < 4; i++) {
            f[2 * i] = __uint_as_float(u[i] << 16);
            f[2 * i + 1] = __uint_as_float(u[i] & 0xffff0000u);
        }
    }
}

/* acc[mi][r] += w_r · x_mi over the VEC elements starting at e0: each x chunk is loaded once for the R rows.
 */
template <int WT, int M, int R>
__device__ __forceinline__ void gemv_fma(float (&acc)[M][R], const uint4 (&wv)[R],
                                         const float *const (&xr)[M], int e0)
{
    constexpr int VEC = WT == WT_F32 ? 4 : 8;
    float wf[R][VEC];
#pragma unroll
    for (int r = 0; r < R; r++) unpack16<WT>(wv[r], wf[r]);
#pragma unroll
    for (int mi = 0; mi < M; mi++) {
        const float4 *xp = reinterpret_cast<const float4 *>(xr[mi] + e0);
#pragma unroll
        for (int q = 0; q < VEC / 4; q++) {
            const float4 xv = __ldg(xp + q);
#pragma unroll
            for (int r = 0; r < R; r++)
                acc[mi][r] += wf[r][4 * q] * xv.x + wf[r][4 * q + 1] * xv.y + wf[r][4 * q + 2] * xv.z +
                              wf[r][4 * q + 3] * xv.w;
        }
    }
}

template <int M, int R>
__device__ __forceinline__ void gemv_store(float (&acc)[M][R], float *y, int ldy, const float *bias, int m,
                                           int n, int row0)
{
    const int lane = threadIdx.x % 32;
#pragma unroll
    for (int mi = 0; mi < M; mi++)
#pragma unroll
        for (int r = 0; r < R; r++)
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) acc[mi][r] += __shfl_xor_sync(0xffffffffu, acc[mi][r], o);
#pragma unroll
    for (int r = 0; r < R; r++) {
        const int row = row0 + r;
        if (row >= n) break;
        const float b = bias ? bias[row] : 0.0f;
#pragma unroll
        for (int mi = 0; mi < M; mi++)
            if (lane == ((mi * R + r) & 31) && mi < m) y[(size_t)mi * ldy + row] = acc[mi][r] + b;
    }
}

/* Each warp computes R consecutive output rows; W rows are 16-byte aligned (k % VEC == 0, w and x 16-byte
 * aligned). Rows of x past m repeat the last row and rows of W past n repeat the last one (their results are
 * not stored), so the inner loop has no guard. U chunks per row are in flight per lane before the first use.
 */
template <int WT, int M, int R, int U>
__global__ void __launch_bounds__(GEMV_WARPS * 32)
    gemv_vec_kernel(float *y, int ldy, const float *x, const uint4 *w, const float *bias, int m, int n, int k)
{
    constexpr int VEC = WT == WT_F32 ? 4 : 8;
    const int lane = threadIdx.x % 32;
    const int row0 = (blockIdx.x * GEMV_WARPS + threadIdx.x / 32) * R;
    const int nc = k / VEC;
    const uint4 *wr[R];
#pragma unroll
    for (int r = 0; r < R; r++) wr[r] = w + (size_t)(row0 + r < n ? row0 + r : n - 1) * nc;
    /* The weights are never written by a kernel: the first U chunks per row are loaded before waiting for the
     * previous kernel (pdl.h), then each batch is multiplied while the next one is in flight. */
    int c = lane;
    bool full = row0 < n && c + 32 * (U - 1) < nc;
    uint4 cur[U][R];
    if (full)
#pragma unroll
        for (int u = 0; u < U; u++)
#pragma unroll
            for (int r = 0; r < R; r++) cur[u][r] = ld_stream(wr[r] + c + 32 * u);
    pdl_wait();
    pdl_trigger();
    if (row0 >= n) return;
    const float *xr[M];
#pragma unroll
    for (int mi = 0; mi < M; mi++) xr[mi] = x + (size_t)(mi < m ? mi : m - 1) * k;
    float acc[M][R];
#pragma unroll
    for (int mi = 0; mi < M; mi++)
#pragma unroll
        for (int r = 0; r < R; r++) acc[mi][r] = 0.0f;

    while (full) {
        const int cn = c + 32 * U;
        const bool more = cn + 32 * (U - 1) < nc;
        uint4 nxt[U][R];
        if (more)
#pragma unroll
            for (int u = 0; u < U; u++)
#pragma unroll
                for (int r = 0; r < R; r++) nxt[u][r] = ld_stream(wr[r] + cn + 32 * u);
#pragma unroll
        for (int u = 0; u < U; u++) gemv_fma<WT, M, R>(acc, cur[u], xr, (c + 32 * u) * VEC);
        c = cn;
        full = more;
        if (more)
#pragma unroll
            for (int u = 0; u < U; u++)
#pragma unroll
                for (int r = 0; r < R; r++) cur[u][r] = nxt[u][r];
    }
    for (; c < nc; c += 32) {
        uint4 wv[R];
#pragma unroll
        for (int r = 0; r < R; r++) wv[r] = ld_stream(wr[r] + c);
        gemv_fma<WT, M, R>(acc, wv, xr, c * VEC);
    }
    gemv_store<M, R>(acc, y, ldy, bias, m, n, row0);
}

/* ----------------------------------------------------------------------------------------------------------
 */
/* Skinny GEMM on tensor cores, m = 2..16, f16/bf16 weights (mma.sync m16n8k16, f32 accumulation).
 *
 * W is the A operand (16 output rows x 16 k per MMA), x^T the B operand (16 k x 8 batch rows), so one warp
 * covers MMA_ROWS = 32 output rows (two A tiles) x NT*8 batch rows. The k order inside an MMA is free as long
 * as A and B agree, so thread (g = lane/4, t = lane%4) loads its A fragment straight from memory: per step of
 * 64 k it loads W[row][64s + 8t .. +8] and W[row][64s + 32 + 8t .. +8] (16 bytes each, L1::no_allocate) for
 * rows g, g+8, g+16, g+24, and the same 8+8 k of x rows g and g+8 (f32 through L1, rounded to the weight type
 * with round-to-nearest). Half 0 (k +0..3) of each 16-byte piece feeds one MMA and half 1 (k +4..7) the next:
 * MMA A regs {a0,a1,a2,a3} = {W[g] word0, W[g+8] word0, W[g] word1, W[g+8] word1}, B regs {x(k0,k1),
 * x(k2,k3)}, i.e. logical k {2t,2t+1,2t+8,2t+9} <-> physical k {8t..8t+3}.
 * A block of MMA_WARPS warps holds T = MMA_WARPS/S warp tiles x S splits of k: split j takes steps j, j+S,
 * ... (so the block's warps read neighbouring x and W ranges at the same time) and the S partial tiles are
 * summed through shared memory in split order: deterministic, no atomics. The next step's W is loaded before
 * the current one is multiplied (two steps, 8 KB per warp, in flight).
 */
#define MMA_WARPS 8
#define MMA_ROWS  32

template <int WT> __device__ __forceinline__ uint32_t pack2(float a, float b)
{
    if (WT == WT_F16) {
        __half2 h = __floats2half2_rn(a, b);
        return *reinterpret_cast<uint32_t *>(&h);
    }
    __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
    return *reinterpret_cast<uint32_t *>(&h);
}

template <int WT>
__device__ __forceinline__ void mma16816(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                         uint32_t b0, uint32_t b1)
{
    if (WT == WT_F16)
        asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
            "{%0,%1,%2,%3};"
            : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
            : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
    else
        asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
            "{%0,%1,%2,%3};"
            : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
            : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

/* W pieces of step s for this thread: [piece][row set]; chunks past the row's end read as zeros. */
__device__ __forceinline__ void mma_load_w(uint4 (&wv)[2][4], const uint4 *const (&wr)[4], int s, int t,
                                           int nc)
{
#pragma unroll
    for (int pc = 0; pc < 2; pc++) {
        const int c = s * 8 + pc * 4 + t;
#pragma unroll
        for (int i = 0; i < 4; i++) wv[pc][i] = c < nc ? ld_stream(wr[i] + c) : make_uint4(0, 0, 0, 0);
    }
}

template <int WT, int NT>
__device__ __forceinline__ void mma_step(float (&acc)[2][NT][4], const uint4 (&wv)[2][4],
                                         const float *const (&xr)[NT], int s, int t, int nc)
{
#pragma unroll
    for (int pc = 0; pc < 2; pc++) {
        const int c = s * 8 + pc * 4 + t;
        uint32_t bx[NT][4];
#pragma unroll
        for (int j = 0; j < NT; j++) {
            if (c < nc) {
                const float4 lo = __ldg(reinterpret_cast<const float4 *>(xr[j] + (size_t)c * 8));
                const float4 hi = __ldg(reinterpret_cast<const float4 *>(xr[j] + (size_t)c * 8 + 4));
                bx[j][0] = pack2<WT>(lo.x, lo.y);
                bx[j][1] = pack2<WT>(lo.z, lo.w);
                bx[j][2] = pack2<WT>(hi.x, hi.y);
                bx[j][3] = pack2<WT>(hi.z, hi.w);
            } else {
                bx[j][0] = bx[j][1] = bx[j][2] = bx[j][3] = 0u;
            }
        }
#pragma unroll
        for (int at = 0; at < 2; at++) {
            const uint4 r0 = wv[pc][2 * at], r8 = wv[pc][2 * at + 1]; /* rows g and g+8 of A tile at */
#pragma unroll
            for (int j = 0; j < NT; j++) {
                mma16816<WT>(acc[at][j], r0.x, r8.x, r0.y, r8.y, bx[j][0], bx[j][1]);
                mma16816<WT>(acc[at][j], r0.z, r8.z, r0.w, r8.w, bx[j][2], bx[j][3]);
            }
        }
    }
}

/* Needs k % 8 == 0 and w, x 16-byte aligned; m <= NT*8. */
template <int WT, int NT>
__global__ void __launch_bounds__(MMA_WARPS * 32, 2)
    gemm_mma_kernel(float *y, int ldy, const float *x, const uint4 *w, const float *bias, int m, int n, int k,
                    int S)
{
    __shared__ float red[MMA_WARPS][2 * NT * 4][32];
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const int g = lane / 4, t = lane % 4;
    const int T = MMA_WARPS / S, tile = warp / S, split = warp % S;
    const int row0 = (blockIdx.x * T + tile) * MMA_ROWS;
    const int nc = k / 8, nsteps = (k + 63) / 64;
    const uint4 *wr[4];
#pragma unroll
    for (int i = 0; i < 4; i++) wr[i] = w + (size_t)min(row0 + g + 8 * i, n - 1) * nc;
    const float *xr[NT];
#pragma unroll
    for (int j = 0; j < NT; j++) xr[j] = x + (size_t)min(g + 8 * j, m - 1) * k;
    float acc[2][NT][4];
#pragma unroll
    for (int at = 0; at < 2; at++)
#pragma unroll
        for (int j = 0; j < NT; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) acc[at][j][e] = 0.0f;

    /* The first step's weights are loaded before waiting for the previous kernel (pdl.h). */
    const bool active = row0 < n && split < nsteps;
    uint4 cur[2][4], nxt[2][4];
    if (active) mma_load_w(cur, wr, split, t, nc);
    pdl_wait();
    pdl_trigger();
    if (active) {
        for (int s = split; s < nsteps; s += S) {
            const bool more = s + S < nsteps;
            if (more) mma_load_w(nxt, wr, s + S, t, nc);
            mma_step<WT, NT>(acc, cur, xr, s, t, nc);
            if (more) {
#pragma unroll
                for (int pc = 0; pc < 2; pc++)
#pragma unroll
                    for (int i = 0; i < 4; i++) cur[pc][i] = nxt[pc][i];
            }
        }
    }
    if (S > 1) {
#pragma unroll
        for (int at = 0; at < 2; at++)
#pragma unroll
            for (int j = 0; j < NT; j++)
#pragma unroll
                for (int e = 0; e < 4; e++) red[warp][(at * NT + j) * 4 + e][lane] = acc[at][j][e];
        __syncthreads();
        if (split != 0) return;
        for (int o = 1; o < S; o++)
#pragma unroll
            for (int at = 0; at < 2; at++)
#pragma unroll
                for (int j = 0; j < NT; j++)
#pragma unroll
                    for (int e = 0; e < 4; e++) acc[at][j][e] += red[warp + o][(at * NT + j) * 4 + e][lane];
    }
    /* C fragment: e = 0,1 -> row g, batch rows 2t, 2t+1; e = 2,3 -> row g+8. */
#pragma unroll
    for (int at = 0; at < 2; at++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const int row = row0 + 16 * at + g + (e >= 2 ? 8 : 0);
            if (row >= n) continue;
            const float b = bias ? bias[row] : 0.0f;
#pragma unroll
            for (int j = 0; j < NT; j++) {
                const int mi = 8 * j + 2 * t + (e & 1);
                if (mi < m) y[(size_t)mi * ldy + row] = acc[at][j][e] + b;
            }
        }
}

/* Splits of k per warp tile: the most (up to MMA_WARPS) that keep the grid within two blocks per SM. */
static int mma_splits(int n)
{
    const int64_t tiles = (n + MMA_ROWS - 1) / MMA_ROWS, cap = 2LL * MMA_WARPS * fcuda_sm_count();
    int S = MMA_WARPS;
    while (S > 1 && tiles * S > cap) S /= 2;
    return S;
}

template <int WT>
static int gemm_mma_launch(float *y, int ldy, const float *x, const void *w, const float *bias, int m, int n,
                           int k, cudaStream_t st)
{
    const int S = mma_splits(n), T = MMA_WARPS / S;
    const int tiles = (n + MMA_ROWS - 1) / MMA_ROWS;
    const unsigned blocks = (unsigned)((tiles + T - 1) / T);
    if (m <= 8)
        FCUDA_CHECK(pdl_launch(gemm_mma_kernel<WT, 1>, dim3(blocks), dim3(MMA_WARPS * 32), 0, st, y, ldy, x,
                               (const uint4 *)w, bias, m, n, k, S));
    else
        FCUDA_CHECK(pdl_launch(gemm_mma_kernel<WT, 2>, dim3(blocks), dim3(MMA_WARPS * 32), 0, st, y, ldy, x,
                               (const uint4 *)w, bias, m, n, k, S));
    return FERRY_OK;
}

template <int WT> __device__ __forceinline__ float load_w(const void *w, size_t i)
{
    if (WT == WT_F32) return ((const float *)w)[i];
    if (WT == WT_F16) return __half2float(((const __half *)w)[i]);
    return __bfloat162float(((const __nv_bfloat16 *)w)[i]);
}

/* Any k and alignment (2-byte weights, 4-byte x): element-wise loads, one row per warp. */
template <int WT, int M>
__global__ void __launch_bounds__(GEMV_WARPS * 32)
    gemv_scalar_kernel(float *y, int ldy, const float *x, const void *w, const float *bias, int m, int n,
                       int k)
{
    pdl_wait();
    pdl_trigger();
    const int lane = threadIdx.x % 32;
    const int row = blockIdx.x * GEMV_WARPS + threadIdx.x / 32;
    if (row >= n) return;
    float acc[M][1];
#pragma unroll
    for (int mi = 0; mi < M; mi++) acc[mi][0] = 0.0f;
    for (int e = lane; e < k; e += 32) {
        const float wf = load_w<WT>(w, (size_t)row * k + e);
#pragma unroll
        for (int mi = 0; mi < M; mi++) acc[mi][0] += wf * x[(size_t)(mi < m ? mi : m - 1) * k + e];
    }
    gemv_store<M, 1>(acc, y, ldy, bias, m, n, row);
}

template <int WT, int M, int R, int U>
static int gemv_launch(float *y, int ldy, const float *x, const void *w, const float *bias, int m, int n,
                       int k, bool vec, cudaStream_t st)
{
    if (vec) {
        const int rows_per_block = GEMV_WARPS * R;
        const unsigned blocks = (unsigned)((n + rows_per_block - 1) / rows_per_block);
        FCUDA_CHECK(pdl_launch(gemv_vec_kernel<WT, M, R, U>, dim3(blocks), dim3(GEMV_WARPS * 32), 0, st, y,
                               ldy, x, (const uint4 *)w, bias, m, n, k));
    } else {
        const unsigned blocks = (unsigned)((n + GEMV_WARPS - 1) / GEMV_WARPS);
        FCUDA_CHECK(pdl_launch(gemv_scalar_kernel<WT, M>, dim3(blocks), dim3(GEMV_WARPS * 32), 0, st, y, ldy,
                               x, w, bias, m, n, k));
    }
    return FERRY_OK;
}

/* Output rows per warp at m = 1 (kern_cuda_matmul_set_m1_rows). */
static int g_m1_rows = 2;

extern "C" void kern_cuda_matmul_set_m1_rows(int rows)
{
    g_m1_rows = rows == 1 ? 1 : 2;
}

/* Rows per warp R and chunks in flight U by m: more rows per warp share each x load (x traffic through L1 per
 * weight byte is 2*M/R for 2-byte weights), at the price of registers (M*R accumulators). */
template <int WT>
static int gemv_tile(float *y, int ldy, const float *x, const void *w, const float *bias, int m, int n, int k,
                     bool vec, cudaStream_t st)
{
    if (m <= 1)
        return g_m1_rows == 1 ? gemv_launch<WT, 1, 1, 4>(y, ldy, x, w, bias, m, n, k, vec, st)
                              : gemv_launch<WT, 1, 2, 4>(y, ldy, x, w, bias, m, n, k, vec, st);
    if constexpr (WT != WT_F32)
        if (vec) return gemm_mma_launch<WT>(y, ldy, x, w, bias, m, n, k, st);
    if (m <= 2) return gemv_launch<WT, 2, 2, 4>(y, ldy, x, w, bias, m, n, k, vec, st);
    if (m <= 4) return gemv_launch<WT, 4, 4, 2>(y, ldy, x, w, bias, m, n, k, vec, st);
    if (m <= 8) return gemv_launch<WT, 8, 4, 2>(y, ldy, x, w, bias, m, n, k, vec, st);
    return gemv_launch<WT, 16, 4, 1>(y, ldy, x, w, bias, m, n, k, vec, st);
}

/* ----------------------------------------------------------------------------------------------------------
 */
/* cuBLAS path (f32, f16, bf16 weights, m > 16) */

__global__ void round_x_kernel(void *dst, const float *x, int64_t n, int to_bf16)
{
    pdl_wait();
    pdl_trigger();
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        if (to_bf16)
            ((__nv_bfloat16 *)dst)[i] = __float2bfloat16_rn(x[i]);
        else
            ((__half *)dst)[i] = __float2half_rn(x[i]);
    }
}

/* y (m, ldy) columns [0, n) += bias. */
__global__ void add_bias_kernel(float *y, int ldy, const float *bias, int64_t total, int n)
{
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (int64_t)gridDim.x * blockDim.x)
        y[i / n * ldy + i % n] += bias[i % n];
}

extern "C" size_t kern_cuda_ctx_size(size_t max_x_elems, size_t w16_bytes)
{
    return max_x_elems * 2 + CUBLAS_WS_BYTES + (w16_bytes + 255) / 256 * 256;
}

extern "C" size_t kern_cuda_w16_bytes(int max_m, size_t max_w16_elems)
{
    if (max_m < KERN_CUDA_W16_MIN_M) return 0;
    const size_t b = max_w16_elems * sizeof(__half);
    return b < KERN_CUDA_W16_MAX_BYTES ? b : KERN_CUDA_W16_MAX_BYTES;
}

extern "C" int kern_cuda_ctx_init(struct kern_cuda_ctx **out, size_t max_x_elems, size_t w16_bytes)
{
    if (!out) return FERRY_ERR_INVALID;
    *out = NULL;
    struct kern_cuda_ctx *c = (struct kern_cuda_ctx *)calloc(1, sizeof *c);
    if (!c) return FERRY_ERR_NOMEM;
    cublasStatus_t bs = cublasCreate(&c->handle);
    if (bs != CUBLAS_STATUS_SUCCESS) {
        FLOG_ERROR("%s:%d: cublasCreate failed: %s", __FILE__, __LINE__, cublasGetStatusString(bs));
        c->handle = NULL;
        kern_cuda_ctx_free(c);
        return FERRY_ERR_CUDA;
    }
    c->max_x_elems = max_x_elems;
    c->w16_bytes = (w16_bytes + 255) / 256 * 256;
    if ((max_x_elems && cudaMalloc(&c->xbuf, max_x_elems * 2) != cudaSuccess) ||
        cudaMalloc(&c->cublas_ws, CUBLAS_WS_BYTES) != cudaSuccess ||
        (c->w16_bytes && cudaMalloc(&c->w16, c->w16_bytes) != cudaSuccess)) {
        (void)cudaGetLastError();
        FLOG_ERROR("kern_cuda_ctx_init: cudaMalloc of %zu bytes failed",
                   kern_cuda_ctx_size(max_x_elems, w16_bytes));
        kern_cuda_ctx_free(c);
        return FERRY_ERR_DEVICE_MEM;
    }
    *out = c;
    return FERRY_OK;
}

extern "C" void kern_cuda_ctx_free(struct kern_cuda_ctx *ctx)
{
    if (!ctx) return;
    if (ctx->handle) cublasDestroy(ctx->handle);
    cudaFree(ctx->xbuf);
    cudaFree(ctx->cublas_ws);
    cudaFree(ctx->w16);
    free(ctx);
}

extern "C" size_t kern_cuda_ctx_bytes(const struct kern_cuda_ctx *ctx)
{
    return ctx ? kern_cuda_ctx_size(ctx->max_x_elems, ctx->w16_bytes) : 0;
}

/* ----------------------------------------------------------------------------------------------------------
 */
/* The type table: each weight type's decode entry (m <= KERN_CUDA_GEMV_MAX_M) and large-batch entry, and the
 * shape and alignment rules its kernels need. Arguments reach the entries checked (check_args). */

typedef int (*mm_fn)(struct kern_cuda_ctx *ctx, float *y, int ldy, const float *x, const void *w,
                     const float *bias, int m, int n, int k, cudaStream_t st);

struct mm_type {
    enum dtype t;
    mm_fn gemv;     /* m <= KERN_CUDA_GEMV_MAX_M (any m: tiles); block types: the automatic choice at any m */
    mm_fn gemm;     /* m > KERN_CUDA_GEMV_MAX_M (any m); block types: the f16 GEMM */
    int k_multiple; /* k must be a multiple of it */
    int w_align;    /* bytes; W's rows then keep the alignment the kernels load with */
    int x_align;    /* bytes */
    int needs_ctx;  /* the GEMV entry uses the context's workspace */
};

/* F32/F16/BF16: the SIMT / tensor-core GEMV of this file in row tiles of 16 (16-byte loads when k and the
 * pointers allow, else element-wise); no context needed. */
template <int WT>
static int mm_gemv_plain(struct kern_cuda_ctx *, float *y, int ldy, const float *x, const void *w,
                         const float *bias, int m, int n, int k, cudaStream_t st)
{
    const bool vec = k % (WT == WT_F32 ? 4 : 8) == 0 && FCUDA_ALIGNED(w, 16) && FCUDA_ALIGNED(x, 16);
    for (int i = 0; i < m; i += KERN_CUDA_GEMV_MAX_M) {
        const int mt = min(KERN_CUDA_GEMV_MAX_M, m - i);
        const int rc = gemv_tile<WT>(y + (size_t)i * ldy, ldy, x + (size_t)i * k, w, bias, mt, n, k, vec, st);
        if (rc) return rc;
    }
    return FERRY_OK;
}

/* F32/F16/BF16: cuBLAS on tensor cores (cublasGemmEx, f32 accumulation); x first rounded to the weight's type
 * (f16/bf16) in the context's workspace, in row chunks that fit. */
template <int WT>
static int mm_gemm_cublas(struct kern_cuda_ctx *ctx, float *y, int ldy, const float *x, const void *w,
                          const float *bias, int m, int n, int k, cudaStream_t stream)
{
    FCUDA_CHECK(cublasSetStream(ctx->handle, stream));
    FCUDA_CHECK(cublasSetWorkspace(ctx->handle, ctx->cublas_ws, CUBLAS_WS_BYTES));
    const float one = 1.0f, zero = 0.0f;
    if (WT == WT_F32) {
        FCUDA_CHECK(cublasGemmEx(ctx->handle, CUBLAS_OP_T, CUBLAS_OP_N, n, m, k, &one, w, CUDA_R_32F, k, x,
                                 CUDA_R_32F, k, &zero, y, CUDA_R_32F, ldy, CUBLAS_COMPUTE_32F,
                                 CUBLAS_GEMM_DEFAULT));
    } else {
        const cudaDataType_t t = WT == WT_F16 ? CUDA_R_16F : CUDA_R_16BF;
        const int64_t rows_fit = ctx->max_x_elems / (size_t)k;
        if (rows_fit < 1) return FERRY_ERR_RANGE;
        for (int i = 0; i < m; i += (int)(rows_fit < m ? rows_fit : m)) {
            const int mt = (int)(m - i < rows_fit ? m - i : rows_fit);
            const int64_t ne = (int64_t)mt * k;
            FCUDA_CHECK(pdl_launch(round_x_kernel, dim3(fcuda_blocks(ne, 256)), dim3(256), 0, stream,
                                   ctx->xbuf, x + (size_t)i * k, ne, (int)(WT == WT_BF16)));
            FCUDA_CHECK(cublasGemmEx(ctx->handle, CUBLAS_OP_T, CUBLAS_OP_N, n, mt, k, &one, w, t, k,
                                     ctx->xbuf, t, k, &zero, y + (size_t)i * ldy, CUDA_R_32F, ldy,
                                     CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
        }
    }
    if (bias) {
        const int64_t total = (int64_t)m * n;
        add_bias_kernel<<<fcuda_blocks(total, 256), 256, 0, stream>>>(y, ldy, bias, total, n);
        FCUDA_LAUNCH_CHECK("add_bias_kernel");
    }
    return FERRY_OK;
}

/* ---- GGUF block types (kernels/cuda/matmul_q.h) ----------------------------------------------------------
 */

template <class Q> static enum dtype mm_q_dtype(void);
#define MM_Q_DTYPE(T, name, Q) template <> enum dtype mm_q_dtype<Q>(void) { return DTYPE_##T; }
QB_TYPES(MM_Q_DTYPE)
#undef MM_Q_DTYPE

static int g_qvariant = KERN_QV_AUTO;

extern "C" int kern_cuda_qmm_set_variant(int variant)
{
    if (variant < 0 || variant >= KERN_QV_COUNT) return FERRY_ERR_INVALID;
    const int prev = g_qvariant;
    g_qvariant = variant;
    return prev;
}

/* The variant of a block-type product: the forced one, else the table's; FERRY_QMM_DECODE=stream (read once)
 * takes the stream GEMV for every product of at most KERN_CUDA_QSTREAM_MAX_M rows, to time whole models with it
 * before the table does. */
static int qmm_choice(enum dtype t, int m)
{
    static int stream = -1;
    if (stream < 0) {
        const char *e = getenv("FERRY_QMM_DECODE");
        stream = e && !strcmp(e, "stream");
    }
    if (g_qvariant) return g_qvariant;
    if (stream && m <= KERN_CUDA_QSTREAM_MAX_M) return KERN_QV_STREAM;
    return kern_cuda_qmm_pick(t, m);
}

extern "C" const char *kern_cuda_qmm_variant_name(int variant)
{
    static const char *const names[KERN_QV_GEMM_C1] = {
        "auto",
        "dp4a GEMV, 1 row/warp",
        "dp4a GEMV, 2 rows/warp",
        "dp4a GEMV, 4 rows/warp",
        "int8 MMA, 16 rows/warp",
        "int8 MMA, 32 rows/warp",
        "f16 GEMM, auto tile",
    };
    if (variant >= 0 && variant < KERN_QV_GEMM_C1) return names[variant];
    if (variant >= KERN_QV_GEMM_C1 && variant < KERN_QV_Q8OLD)
        return kern_cuda_qgemm_config_name(variant - KERN_QV_GEMM_C1 + 1);
    if (variant == KERN_QV_Q8OLD) return "gemv_q8 (f16 x, f16 MMA)";
    if (variant == KERN_QV_F16_PIECES) return "W decoded to f16 in pieces, cuBLAS";
    if (variant == KERN_QV_STREAM) return "stream GEMV, x shared by W rows";
    return "?";
}

/* Whether variant v reads x's int8 form in the natural layout at m <= qv_x8_max_m(v) (and so can skip its
 * pre-pass). */
static bool qv_reads_x8(int v)
{
    return (v >= KERN_QV_DP4A_R1 && v <= KERN_QV_DP4A_R4) || v == KERN_QV_STREAM;
}
static int qv_x8_max_m(int v)
{
    return v == KERN_QV_STREAM ? KERN_CUDA_QSTREAM_MAX_M : KERN_CUDA_QDP4A_MAX_M;
}

static struct kern_cuda_qmm qmm_args(struct kern_cuda_ctx *ctx, float *y, int ldy, const float *x,
                                     const void *w, const float *bias, int m, int n, int k, cudaStream_t st)
{
    struct kern_cuda_qmm c;
    c.y = y, c.ldy = ldy, c.x = x, c.w = w, c.bias = bias, c.m = m, c.n = n, c.k = k;
    c.ws = ctx->xbuf, c.ws_bytes = ctx->max_x_elems * 2, c.stream = st;
    c.x_ready = ctx->x8_src == x && ctx->x8_m == m && ctx->x8_k == k;
    return c;
}

/* KERN_QV_F16_PIECES: W decoded to f16 in pieces of rows that fit the context's piece buffer (a multiple of
 * 128 rows when W does not fit whole), each multiplied by cuBLAS on tensor cores (f32 accumulation) with x
 * rounded to f16 once: the f16-tile GEMM's arithmetic (x and W each rounded to f16 once), summed in cuBLAS's
 * order. FERRY_ERR_RANGE when the buffer holds fewer than 128 rows of W (the caller then runs the GEMM). */
template <class Q> static int qmm_f16_pieces(struct kern_cuda_ctx *ctx, const struct kern_cuda_qmm *c)
{
    const int m = c->m, n = c->n, k = c->k;
    int64_t rows = ctx->w16 ? (int64_t)(ctx->w16_bytes / ((size_t)k * sizeof(__half))) : 0;
    if (rows < n) rows -= rows % 128;
    if (rows < 128 && rows < n) return FERRY_ERR_RANGE;
    const int64_t rows_fit = (int64_t)(ctx->max_x_elems / (size_t)k);
    if (rows_fit < 1) return FERRY_ERR_RANGE;
    FCUDA_CHECK(cublasSetStream(ctx->handle, c->stream));
    FCUDA_CHECK(cublasSetWorkspace(ctx->handle, ctx->cublas_ws, CUBLAS_WS_BYTES));
    const size_t rowbytes = dtype_row_size(mm_q_dtype<Q>(), k);
    const float one = 1.0f, zero = 0.0f;
    for (int p0 = 0; p0 < n; p0 += (int)rows) {
        const int np = (int)(rows < n - p0 ? rows : n - p0);
        const int rc = kern_cuda_qdequant<Q>((__half *)ctx->w16,
                                             (const uint8_t *)c->w + (size_t)p0 * rowbytes, np, k, c->stream);
        if (rc) return rc;
        for (int i = 0; i < m; i += (int)rows_fit) {
            const int mt = (int)(rows_fit < m - i ? rows_fit : m - i);
            if (p0 == 0 || rows_fit < m) { /* x rounded once when it fits whole */
                const int64_t ne = (int64_t)mt * k;
                FCUDA_CHECK(pdl_launch(round_x_kernel, dim3(fcuda_blocks(ne, 256)), dim3(256), 0, c->stream,
                                       ctx->xbuf, c->x + (size_t)i * k, ne, 0));
            }
            FCUDA_CHECK(cublasGemmEx(ctx->handle, CUBLAS_OP_T, CUBLAS_OP_N, np, mt, k, &one, ctx->w16,
                                     CUDA_R_16F, k, ctx->xbuf, CUDA_R_16F, k, &zero,
                                     c->y + (size_t)i * c->ldy + p0, CUDA_R_32F, c->ldy, CUBLAS_COMPUTE_32F,
                                     CUBLAS_GEMM_DEFAULT));
        }
    }
    if (c->bias) {
        const int64_t total = (int64_t)m * n;
        add_bias_kernel<<<fcuda_blocks(total, 256), 256, 0, c->stream>>>(c->y, c->ldy, c->bias, total, n);
        FCUDA_LAUNCH_CHECK("add_bias_kernel");
    }
    return FERRY_OK;
}

/* One variant of type Q. The int8 kernels run in row tiles their workspace holds; the MMA where it cannot
 * hold 8 rows of x falls back to the dp4a GEMV (the same int8 arithmetic), and that, or the f16 pieces
 * without a piece buffer of 128 rows, to the f16-tile GEMM (row chunks of one row at least: mm_q_auto checked
 * it). */
template <class Q>
static int qmm_run(struct kern_cuda_ctx *ctx, const struct kern_cuda_qmm *c, enum dtype t, int v)
{
    if (!kern_cuda_qmm_variant_applies(t, v)) return FERRY_ERR_UNSUPPORTED;
    int rc = FERRY_ERR_RANGE;
    switch (v) {
    case KERN_QV_DP4A_R1:
    case KERN_QV_DP4A_R2:
    case KERN_QV_DP4A_R4:
        rc = kern_cuda_qgemv<Q>(c, v == KERN_QV_DP4A_R1 ? 1 : v == KERN_QV_DP4A_R2 ? 2 : 4);
        break;
    case KERN_QV_MMA_16:
    case KERN_QV_MMA_32:
        rc = kern_cuda_qmmv<Q>(c, v == KERN_QV_MMA_16 ? 1 : 2);
        if (rc == FERRY_ERR_RANGE) rc = kern_cuda_qgemv<Q>(c, 1);
        break;
    case KERN_QV_F16_PIECES:
        rc = qmm_f16_pieces<Q>(ctx, c);
        break;
    case KERN_QV_STREAM:
        rc = kern_cuda_qstream<Q>(c);
        break;
    case KERN_QV_Q8OLD:
        for (int i = 0; i < c->m; i += KERN_CUDA_GEMV_Q8_MAX_M) {
            const int mt = min(KERN_CUDA_GEMV_Q8_MAX_M, c->m - i);
            rc = kern_cuda_gemv_q8(c->y + (size_t)i * c->ldy, c->ldy, c->x + (size_t)i * c->k, c->w, c->bias,
                                   mt, c->n, c->k, c->stream);
            if (rc) return rc;
        }
        return FERRY_OK;
    default:
        return kern_cuda_qgemm<Q>(c, v >= KERN_QV_GEMM_C1 ? v - KERN_QV_GEMM_C1 + 1 : 0);
    }
    return rc == FERRY_ERR_RANGE ? kern_cuda_qgemm<Q>(c, 0) : rc;
}

/* GGUF block types: the forced variant, else the table's (gemv entry: the table at any m; gemm entry: the
 * GEMM). Both use the context's x buffer as their workspace. */
template <class Q>
static int mm_q_auto(struct kern_cuda_ctx *ctx, float *y, int ldy, const float *x, const void *w,
                     const float *bias, int m, int n, int k, cudaStream_t st)
{
    const struct kern_cuda_qmm c = qmm_args(ctx, y, ldy, x, w, bias, m, n, k, st);
    if (c.ws_bytes < kern_cuda_qmm_gemm_ws(1, k)) return FERRY_ERR_RANGE;
    const enum dtype t = mm_q_dtype<Q>();
    const int v = qmm_choice(t, m);
    const int rc = qmm_run<Q>(ctx, &c, t, v);
    if (!(c.x_ready && qv_reads_x8(v))) ctx->x8_src = NULL; /* the workspace now holds something else */
    return rc;
}

template <class Q>
static int mm_q_gemm(struct kern_cuda_ctx *ctx, float *y, int ldy, const float *x, const void *w,
                     const float *bias, int m, int n, int k, cudaStream_t st)
{
    const struct kern_cuda_qmm c = qmm_args(ctx, y, ldy, x, w, bias, m, n, k, st);
    if (c.ws_bytes < kern_cuda_qmm_gemm_ws(1, k)) return FERRY_ERR_RANGE;
    return qmm_run<Q>(ctx, &c, mm_q_dtype<Q>(), g_qvariant ? g_qvariant : KERN_QV_GEMM);
}

static const struct mm_type mm_types[] = {
    {DTYPE_F32, mm_gemv_plain<WT_F32>, mm_gemm_cublas<WT_F32>, 1, 4, 4, 0},
    {DTYPE_F16, mm_gemv_plain<WT_F16>, mm_gemm_cublas<WT_F16>, 1, 2, 4, 0},
    {DTYPE_BF16, mm_gemv_plain<WT_BF16>, mm_gemm_cublas<WT_BF16>, 1, 2, 4, 0},
#define MM_QTYPE(T, name, Q) {DTYPE_##T, mm_q_auto<Q>, mm_q_gemm<Q>, Q::QK, Q::ALIGN, 16, 1},
    QB_TYPES(MM_QTYPE)
#undef MM_QTYPE
};

static const struct mm_type *mm_type_of(enum dtype t)
{
    for (size_t i = 0; i < sizeof mm_types / sizeof mm_types[0]; i++)
        if (mm_types[i].t == t) return &mm_types[i];
    return NULL;
}

extern "C" int kern_cuda_matmul_supports(enum dtype t)
{
    return mm_type_of(t) != NULL;
}

static int check_args(const struct mm_type *ty, float *y, int ldy, const float *x, const void *w,
                      const float *bias, int m, int n, int k)
{
    if (!y || !x || !w || m <= 0 || n <= 0 || k <= 0 || ldy < n) return FERRY_ERR_INVALID;
    if (!ty) return FERRY_ERR_UNSUPPORTED;
    if (k % ty->k_multiple || dtype_row_size(ty->t, k) > (size_t)INT32_MAX / 32) return FERRY_ERR_INVALID;
    /* The block types' kernels address W with 32-bit offsets (matmul_q_steps.cuh's qs_issue). */
    if (ty->needs_ctx && (uint64_t)dtype_row_size(ty->t, k) * (uint64_t)n > UINT32_MAX - 64)
        return FERRY_ERR_INVALID;
    if (!FCUDA_ALIGNED(y, 4) || !FCUDA_ALIGNED(x, ty->x_align) || (bias && !FCUDA_ALIGNED(bias, 4)))
        return FERRY_ERR_INVALID;
    if (!FCUDA_ALIGNED(w, ty->w_align)) return FERRY_ERR_INVALID;
    return FERRY_OK;
}

extern "C" int kern_cuda_matmul_gemv(struct kern_cuda_ctx *ctx, float *y, int ldy, const float *x,
                                     const void *w, enum dtype wt, const float *bias, int m, int n, int k,
                                     cudaStream_t stream)
{
    const struct mm_type *ty = mm_type_of(wt);
    const int rc = check_args(ty, y, ldy, x, w, bias, m, n, k);
    if (rc) return rc;
    if (ty->needs_ctx && !ctx) return FERRY_ERR_INVALID;
    if (ctx && ctx->x8_src != x)
        ctx->x8_src = NULL; /* a product of another x: x8_src may be rewritten next */
    return ty->gemv(ctx, y, ldy, x, w, bias, m, n, k, stream);
}

extern "C" int kern_cuda_matmul_gemm(struct kern_cuda_ctx *ctx, float *y, int ldy, const float *x,
                                     const void *w, enum dtype wt, const float *bias, int m, int n, int k,
                                     cudaStream_t stream)
{
    const struct mm_type *ty = mm_type_of(wt);
    const int rc = check_args(ty, y, ldy, x, w, bias, m, n, k);
    if (rc) return rc;
    if (!ctx) return FERRY_ERR_INVALID;
    ctx->x8_src = NULL; /* every large-batch entry rewrites the workspace */
    return ty->gemm(ctx, y, ldy, x, w, bias, m, n, k, stream);
}

extern "C" int kern_cuda_matmul(struct kern_cuda_ctx *ctx, float *y, int ldy, const float *x, const void *w,
                                enum dtype wt, const float *bias, int m, int n, int k, cudaStream_t stream)
{
    const struct mm_type *ty = mm_type_of(wt);
    if (m <= KERN_CUDA_GEMV_MAX_M || !ctx || (ty && ty->needs_ctx)) /* block types: the table at any m */
        return kern_cuda_matmul_gemv(ctx, y, ldy, x, w, wt, bias, m, n, k, stream);
    return kern_cuda_matmul_gemm(ctx, y, ldy, x, w, wt, bias, m, n, k, stream);
}

extern "C" int kern_cuda_matmul_x8_target(struct kern_cuda_ctx *ctx, const float *x, enum dtype wt, int m,
                                          int k, uint8_t **xq, float **xd)
{
    if (!ctx) return FERRY_ERR_INVALID;
    ctx->x8_src = NULL;
    if (!x) return FERRY_OK; /* forget a target that was not written */
    if (!xq || !xd || m < 1 || k <= 0) return FERRY_ERR_INVALID;
    const struct mm_type *ty = mm_type_of(wt);
    const int v = qmm_choice(wt, m);
    if (!ty || !ty->needs_ctx || k % ty->k_multiple || !qv_reads_x8(v) || m > qv_x8_max_m(v))
        return FERRY_ERR_UNSUPPORTED;
    const size_t ws = ctx->max_x_elems * 2;
    if (ws < kern_cuda_qmm_x8_ws(m, k) || ws < kern_cuda_qmm_gemm_ws(1, k)) return FERRY_ERR_RANGE;
    kern_cuda_qmm_x8_at(ctx->xbuf, m, k, xq, xd);
    ctx->x8_src = x, ctx->x8_m = m, ctx->x8_k = k;
    return FERRY_OK;
}
