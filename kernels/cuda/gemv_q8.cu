/* gemv_q8 (CUDA) — Q8_0 GEMV / skinny GEMM for m = 1..16 on tensor cores; see gemv_q8.h for the contract.
 *
 * Design. A warp owns a tile of R = 16*AT output rows and walks k in chunks of CB Q8_0 blocks. A row's chunk
 * is contiguous but starts on any 2-byte boundary, so the warp copies the enclosing 16-byte-aligned range of
 * each of its rows into a shared-memory buffer private to the warp (only __syncwarp, no block barrier in the
 * loop) and remembers the offset. Two ways to stage, by configuration: cp.async, NST chunks deep; or 16-byte
 * ld.global.nc loads of chunk i+1 into registers while chunk i is multiplied, then st.shared (one buffer).
 * Pieces at W's two ends that would reach outside W are assembled with 2-byte loads of the chunk's own bytes.
 * From shared memory each thread takes its MMA fragment bytes with aligned 4-byte reads and a funnel shift,
 * turns int8 into f16 exactly (byte permute into 1024+u, subtract 1152), and runs mma.sync m16n8k16 (f16 in,
 * f32 accumulate): two MMAs per block of 32 k, into a fresh accumulator that is then scaled by the block's
 * d (f32) and added to the running f32 sum. W is the A operand, x^T the B operand (NT tiles of 8 batch rows):
 * thread (g = lane/4, t = lane%4) holds q bytes 4t..4t+3 (first MMA) and 16+4t..16+4t+3 (second MMA) of rows
 * g and g+8 — the k order inside an MMA is free as long as A and B agree — so its x is two float4 per block,
 * read through L1 and rounded to f16.
 * A block of WARPS warps (8 or 16) holds T = WARPS/S row tiles x S splits of k (split j takes chunks j, j+S,
 * ...); the S partial tiles are summed through shared memory in split order (deterministic, no atomics). PDL:
 * trigger at the top; the first chunks of W (immutable) are requested before pdl_wait(); x, bias, y after.
 * Measured (NOTES.md, Version 5): 45-54% of the copy ceiling at m = 1, 30-36% at m = 16; the limit is not
 * the staging path (cp.async and registers end within a few points of each other at the same warps per SM).
 */
#include <cuda_fp16.h>
#include <stdint.h>

#include "kernels/cuda/check.h"
#include "kernels/cuda/gemv_q8.h"
#include "kernels/cuda/pdl.h"

#define Q8_BLOCK 34 /* bytes per Q8_0 block */

/* ----------------------------------------------------------------------------------------------------------
 */
/* Shared-memory layout: a staged row holds the 16-byte-aligned range around CB blocks (at most QMAX pieces of
 * 16 bytes; the range starts up to 14 bytes before the chunk), padded to an odd number of pieces so that the
 * 8 rows g = 0..7 of one fragment read fall in distinct banks. */
__host__ __device__ constexpr int q8_qmax(int cb)
{
    return (14 + cb * Q8_BLOCK + 15) / 16;
}
__host__ __device__ constexpr int q8_stride(int cb)
{
    return (q8_qmax(cb) | 1) * 16;
}
__host__ __device__ constexpr size_t q8_smem(int warps, int at, int cb, int nbuf)
{
    return (size_t)warps * nbuf * at * 16 * q8_stride(cb);
}

__device__ __forceinline__ void cp_async16(void *dst, const void *src)
{
    const unsigned d = (unsigned)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(d), "l"(src) : "memory");
}
__device__ __forceinline__ void cp_async_commit(void)
{
    asm volatile("cp.async.commit_group;" ::: "memory");
}
template <int N> __device__ __forceinline__ void cp_async_wait(void)
{
    asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

/* Copies chunk ch (blocks ch*CB .. of each row) of the warp's R rows into buf. Rows past n repeat row n-1.
 * Pieces that would reach outside W (its first and last 16-byte piece when W's ends are not aligned) are
 * copied with 2-byte loads of the chunk's own bytes only. */
template <int R, int CB>
__device__ __forceinline__ void q8_issue(unsigned char *buf, const uint8_t *w, uintptr_t wend, int row0,
                                         int n, int rowbytes, int nb, int ch, int lane)
{
    constexpr int QMAX = q8_qmax(CB), STRIDE = q8_stride(CB);
    const int b0 = ch * CB;
    const int nbytes = min(CB, nb - b0) * Q8_BLOCK;
    const uintptr_t wlo = (uintptr_t)w;
    for (int i = lane; i < R * QMAX; i += 32) {
        const int r = i / QMAX, q = i - r * QMAX;
        const uintptr_t ga = wlo + (size_t)min(row0 + r, n - 1) * rowbytes + (size_t)b0 * Q8_BLOCK;
        const uintptr_t src = (ga & ~(uintptr_t)15) + 16 * q;
        if (src >= ga + nbytes) continue;
        unsigned char *dst = buf + r * STRIDE + 16 * q;
        if (src >= wlo && src + 16 <= wend) {
            cp_async16(dst, (const void *)src);
        } else {
#pragma unroll
            for (int e = 0; e < 16; e += 2) {
                const uintptr_t a = src + e;
                if (a >= ga && a < ga + nbytes)
                    *reinterpret_cast<uint16_t *>(dst + e) = __ldg(reinterpret_cast<const uint16_t *>(a));
            }
        }
    }
}

/* The 4 bytes at shared-memory byte offset off (2-byte aligned) of the array sw. */
__device__ __forceinline__ uint32_t lds_u32_a2(const uint32_t *sw, unsigned off)
{
    const unsigned i = off >> 2;
    return __funnelshift_r(sw[i], sw[i + 1], (off & 2u) * 8u);
}

/* Four int8 -> two f16x2, exact: (q ^ 0x80) = q + 128 as the low byte of the half 0x64xx = 1024 + that, then
 * subtract 1152. Element order is kept (byte 0 -> low half of lo). */
__device__ __forceinline__ void q8_to_h2(uint32_t v, uint32_t &lo, uint32_t &hi)
{
    const uint32_t u = v ^ 0x80808080u;
    uint32_t a = __byte_perm(u, 0x64646464u, 0x5140), b = __byte_perm(u, 0x64646464u, 0x5342);
    const __half2 off = __halves2half2(__ushort_as_half(0x6480), __ushort_as_half(0x6480));
    __half2 ha = __hsub2(*reinterpret_cast<__half2 *>(&a), off),
            hb = __hsub2(*reinterpret_cast<__half2 *>(&b), off);
    lo = *reinterpret_cast<uint32_t *>(&ha);
    hi = *reinterpret_cast<uint32_t *>(&hb);
}

__device__ __forceinline__ uint32_t pack_h2(float a, float b)
{
    __half2 h = __floats2half2_rn(a, b);
    return *reinterpret_cast<uint32_t *>(&h);
}

__device__ __forceinline__ void mma_f16(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                        uint32_t b0, uint32_t b1)
{
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

/* One staged row's block b for this thread: the scale and q bytes 4t..4t+3 and 16+4t..16+4t+3 as f16x2. */
__device__ __forceinline__ void q8_row_frag(const uint32_t *sw, unsigned off, int t, float &d,
                                            uint32_t (&h)[4])
{
    d = __half2float(__ushort_as_half(reinterpret_cast<const uint16_t *>(sw)[off >> 1]));
    const uint32_t va = lds_u32_a2(sw, off + 2 + 4 * t), vb = lds_u32_a2(sw, off + 18 + 4 * t);
    q8_to_h2(va, h[0], h[1]);
    q8_to_h2(vb, h[2], h[3]);
}

/* 16-byte streaming load that skips L1 (weights are read once; x keeps L1). */
__device__ __forceinline__ uint4 ld_stream16(const void *p)
{
    uint4 r;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
                 : "l"(p));
    return r;
}

/* Register staging: this lane's pieces of chunk ch (piece i = lane + 32p of the R*QMAX, row i/QMAX, piece
 * i%QMAX of the row's aligned range); pieces past the chunk are left as they are (never read), pieces at W's
 * ends are assembled from the chunk's own bytes with 2-byte loads. */
template <int R, int CB>
__device__ __forceinline__ void q8_load_regs(uint4 (&v)[(R * q8_qmax(CB) + 31) / 32], const uint8_t *w,
                                             uintptr_t wend, int row0, int n, int rowbytes, int nb, int ch,
                                             int lane)
{
    constexpr int QMAX = q8_qmax(CB), NP = (R * QMAX + 31) / 32;
    const int b0 = ch * CB;
    const int nbytes = min(CB, nb - b0) * Q8_BLOCK;
    const uintptr_t wlo = (uintptr_t)w;
#pragma unroll
    for (int p = 0; p < NP; p++) {
        const int i = lane + 32 * p;
        if (R * QMAX % 32 && i >= R * QMAX) break;
        const int r = i / QMAX, q = i - r * QMAX;
        const uintptr_t ga = wlo + (size_t)min(row0 + r, n - 1) * rowbytes + (size_t)b0 * Q8_BLOCK;
        const uintptr_t src = (ga & ~(uintptr_t)15) + 16 * q;
        if (src >= ga + nbytes) continue;
        if (src >= wlo && src + 16 <= wend) {
            v[p] = ld_stream16((const void *)src);
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

template <int R, int CB>
__device__ __forceinline__ void q8_store_regs(unsigned char *buf,
                                              const uint4 (&v)[(R * q8_qmax(CB) + 31) / 32], int lane)
{
    constexpr int QMAX = q8_qmax(CB), NP = (R * QMAX + 31) / 32, STRIDE = q8_stride(CB);
#pragma unroll
    for (int p = 0; p < NP; p++) {
        const int i = lane + 32 * p;
        if (R * QMAX % 32 && i >= R * QMAX) break;
        const int r = i / QMAX, q = i - r * QMAX;
        *reinterpret_cast<uint4 *>(buf + r * STRIDE + 16 * q) = v[p];
    }
}

/* acc += the staged chunk (nbc blocks starting at block b0, at shared byte offset sbase) times x. */
template <int NT, int AT, int CB>
__device__ __forceinline__ void q8_compute(float (&acc)[AT][NT][4], const uint32_t *sw, unsigned sbase,
                                           const unsigned (&rsh)[AT][2], int b0, int nbc,
                                           const float *const (&xr)[NT], int g, int t)
{
    constexpr int STRIDE = q8_stride(CB);
    const unsigned csh = (unsigned)(b0 * Q8_BLOCK);
#pragma unroll
    for (int b = 0; b < CB; b++) {
        if (b >= nbc) break;
        uint32_t bx[NT][4];
#pragma unroll
        for (int j = 0; j < NT; j++) {
            const float *xp = xr[j] + (size_t)(b0 + b) * 32 + 4 * t;
            const float4 lo = __ldg(reinterpret_cast<const float4 *>(xp));
            const float4 hi = __ldg(reinterpret_cast<const float4 *>(xp + 16));
            bx[j][0] = pack_h2(lo.x, lo.y);
            bx[j][1] = pack_h2(lo.z, lo.w);
            bx[j][2] = pack_h2(hi.x, hi.y);
            bx[j][3] = pack_h2(hi.z, hi.w);
        }
#pragma unroll
        for (int at = 0; at < AT; at++) {
            float d[2];
            uint32_t hf[2][4];
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const int r = 16 * at + g + 8 * h;
                const unsigned off = sbase + r * STRIDE + ((rsh[at][h] + csh) & 15u) + b * Q8_BLOCK;
                q8_row_frag(sw, off, t, d[h], hf[h]);
            }
#pragma unroll
            for (int j = 0; j < NT; j++) {
                float c[4] = {0.0f, 0.0f, 0.0f, 0.0f};
                mma_f16(c, hf[0][0], hf[1][0], hf[0][1], hf[1][1], bx[j][0], bx[j][1]);
                mma_f16(c, hf[0][2], hf[1][2], hf[0][3], hf[1][3], bx[j][2], bx[j][3]);
#pragma unroll
                for (int e = 0; e < 4; e++) acc[at][j][e] = fmaf(c[e], d[e >> 1], acc[at][j][e]);
            }
        }
    }
}

/* STAGE = Q8_CPASYNC: W chunks reach shared memory by cp.async, NST deep. STAGE = Q8_REGS: by 16-byte loads
 * into registers (one chunk in flight while the previous one is multiplied) and st.shared; one buffer. */
enum { Q8_CPASYNC = 0, Q8_REGS = 1 };

template <int NT, int AT, int CB, int NST, int STAGE, int WARPS, int MINB>
__global__ void __launch_bounds__(WARPS * 32, MINB)
    gemv_q8_mma_kernel(float *y, int ldy, const float *x, const uint8_t *w, const float *bias, int m, int n,
                       int k, int S)
{
    extern __shared__ __align__(16) unsigned char smem[];
    constexpr int R = AT * 16, STRIDE = q8_stride(CB), WBUF = R * STRIDE;
    constexpr int NBUF = STAGE == Q8_REGS ? 1 : NST;
    pdl_trigger();
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const int g = lane / 4, t = lane % 4;
    const int T = WARPS / S, tile = warp / S, split = warp % S;
    const int row0 = (blockIdx.x * T + tile) * R;
    const int nb = k / 32, rowbytes = nb * Q8_BLOCK, nch = (nb + CB - 1) / CB;
    const uintptr_t wend = (uintptr_t)w + (size_t)n * rowbytes;
    unsigned char *wbuf = smem + (size_t)warp * NBUF * WBUF;
    const unsigned wbuf_off = (unsigned)(warp * NBUF * WBUF); /* byte offset of wbuf in smem */
    const int my_n = row0 < n && split < nch ? (nch - split + S - 1) / S : 0;
    const uint32_t *sw = reinterpret_cast<const uint32_t *>(smem);

    /* Each thread's rows: 16*at + g + 8*h; their start offsets modulo 16 (the staged range's shift). */
    unsigned rsh[AT][2];
#pragma unroll
    for (int at = 0; at < AT; at++)
#pragma unroll
        for (int h = 0; h < 2; h++)
            rsh[at][h] =
                (unsigned)(((uintptr_t)w + (size_t)min(row0 + 16 * at + g + 8 * h, n - 1) * rowbytes) & 15);
    float acc[AT][NT][4];
#pragma unroll
    for (int at = 0; at < AT; at++)
#pragma unroll
        for (int j = 0; j < NT; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) acc[at][j][e] = 0.0f;
    const float *xr[NT];

    if constexpr (STAGE == Q8_REGS) {
        uint4 v[(R * q8_qmax(CB) + 31) / 32] = {};
        if (my_n > 0) q8_load_regs<R, CB>(v, w, wend, row0, n, rowbytes, nb, split, lane);
        pdl_wait();
#pragma unroll
        for (int j = 0; j < NT; j++) xr[j] = x + (size_t)min(g + 8 * j, m - 1) * k;
        for (int i = 0; i < my_n; i++) {
            const int ch = split + i * S, b0 = ch * CB, nbc = min(CB, nb - b0);
            q8_store_regs<R, CB>(wbuf, v, lane);
            __syncwarp();
            if (i + 1 < my_n) q8_load_regs<R, CB>(v, w, wend, row0, n, rowbytes, nb, ch + S, lane);
            q8_compute<NT, AT, CB>(acc, sw, wbuf_off, rsh, b0, nbc, xr, g, t);
            __syncwarp();
        }
    } else {
#pragma unroll
        for (int s = 0; s < NST - 1; s++) {
            if (s < my_n)
                q8_issue<R, CB>(wbuf + s * WBUF, w, wend, row0, n, rowbytes, nb, split + s * S, lane);
            cp_async_commit();
        }
        pdl_wait();
#pragma unroll
        for (int j = 0; j < NT; j++) xr[j] = x + (size_t)min(g + 8 * j, m - 1) * k;
        for (int i = 0; i < my_n; i++) {
            const int ch = split + i * S, b0 = ch * CB, nbc = min(CB, nb - b0);
            cp_async_wait<NST - 2>();
            __syncwarp();
            if (i + NST - 1 < my_n)
                q8_issue<R, CB>(wbuf + ((i + NST - 1) % NST) * WBUF, w, wend, row0, n, rowbytes, nb,
                                split + (i + NST - 1) * S, lane);
            cp_async_commit();
            q8_compute<NT, AT, CB>(acc, sw, wbuf_off + (unsigned)((i % NST) * WBUF), rsh, b0, nbc, xr, g, t);
        }
        cp_async_wait<0>();
    }

    if (S > 1) { /* partial tiles through shared memory, summed in split order by split 0 */
        constexpr int NV = AT * NT * 4;
        static_assert(NV * 32 * 4 <= NBUF * WBUF, "reduction area");
        __syncthreads();
        float *red = reinterpret_cast<float *>(smem);
        const int stride = NBUF * WBUF / 4; /* floats per warp region */
#pragma unroll
        for (int at = 0; at < AT; at++)
#pragma unroll
            for (int j = 0; j < NT; j++)
#pragma unroll
                for (int e = 0; e < 4; e++)
                    red[warp * stride + ((at * NT + j) * 4 + e) * 32 + lane] = acc[at][j][e];
        __syncthreads();
        if (split != 0) return;
        for (int o = 1; o < S; o++)
#pragma unroll
            for (int v = 0; v < NV; v++) (&acc[0][0][0])[v] += red[(warp + o) * stride + v * 32 + lane];
    }
    /* C fragment: e = 0,1 -> row g, batch rows 2t, 2t+1; e = 2,3 -> row g+8. */
#pragma unroll
    for (int at = 0; at < AT; at++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const int row = row0 + 16 * at + g + (e >= 2 ? 8 : 0);
            if (row >= n) continue;
            const float bv = bias ? bias[row] : 0.0f;
#pragma unroll
            for (int j = 0; j < NT; j++) {
                const int mi = 8 * j + 2 * t + (e & 1);
                if (mi < m) y[(size_t)mi * ldy + row] = acc[at][j][e] + bv;
            }
        }
}

/* ----------------------------------------------------------------------------------------------------------
 */
/* Host side: configurations, split choice, launch. */

static int q8_forced = 0;

static const char *const q8_names[KERN_CUDA_GEMV_Q8_CONFIGS + 1] = {
    "auto",
    "16 rows/warp, 4 blocks/chunk, register staging",
    "16 rows/warp, 2 blocks/chunk, register staging",
    "32 rows/warp, 2 blocks/chunk, register staging",
    "16 rows/warp, 4 blocks/chunk, cp.async 4 stages",
    "16 rows/warp, 4 blocks/chunk, cp.async 2 stages",
    "16 rows/warp, 4 blocks/chunk, register staging, 8-warp blocks",
    "16 rows/warp, 3 blocks/chunk, register staging",
};

/* Splits of k per row tile. A memory-bound block's time is about its rows; an SM runs ceil(blocks / SMs)
 * blocks of T = warps/S tiles one after the other (or side by side, sharing its bandwidth), so the cost of S
 * is ceil(blocks / SMs) * T. Ties go to more splits (more warps resident for the same work). */
static int q8_splits(int tiles, int nch, int warps)
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

template <int NT, int AT, int CB, int NST, int STAGE, int WARPS, int MINB>
static int q8_launch(float *y, int ldy, const float *x, const void *w, const float *bias, int m, int n, int k,
                     cudaStream_t st)
{
    constexpr size_t smem = q8_smem(WARPS, AT, CB, STAGE == Q8_REGS ? 1 : NST);
    static bool attr_set = false;
    auto kern = gemv_q8_mma_kernel<NT, AT, CB, NST, STAGE, WARPS, MINB>;
    if (!attr_set) {
        FCUDA_CHECK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        attr_set = true;
    }
    const int tiles = (n + AT * 16 - 1) / (AT * 16), nch = (k / 32 + CB - 1) / CB;
    const int S = q8_splits(tiles, nch, WARPS), T = WARPS / S;
    const unsigned blocks = (unsigned)((tiles + T - 1) / T);
    FCUDA_CHECK(pdl_launch(kern, dim3(blocks), dim3(WARPS * 32), smem, st, y, ldy, x, (const uint8_t *)w,
                           bias, m, n, k, S));
    FCUDA_LAUNCH_CHECK("gemv_q8_mma_kernel");
    return FERRY_OK;
}

/* MINB (blocks per SM the registers must allow): 2 (64 registers, 32 warps per SM) where that does not spill.
 */
template <int NT>
static int q8_dispatch(int cfg, float *y, int ldy, const float *x, const void *w, const float *bias, int m,
                       int n, int k, cudaStream_t st)
{
    switch (cfg) {
    case 1:
        return q8_launch<NT, 1, 4, 1, Q8_REGS, 16, 2>(y, ldy, x, w, bias, m, n, k, st);
    case 2:
        return q8_launch<NT, 1, 2, 1, Q8_REGS, 16, 2>(y, ldy, x, w, bias, m, n, k, st);
    case 3:
        return q8_launch < NT, 2, 2, 1, Q8_REGS, 16, NT == 1 ? 2 : 1 > (y, ldy, x, w, bias, m, n, k, st);
    case 4:
        return q8_launch<NT, 1, 4, 4, Q8_CPASYNC, 16, 1>(y, ldy, x, w, bias, m, n, k, st);
    case 5:
        return q8_launch<NT, 1, 4, 2, Q8_CPASYNC, 16, 2>(y, ldy, x, w, bias, m, n, k, st);
    case 6:
        return q8_launch<NT, 1, 4, 1, Q8_REGS, 8, 3>(y, ldy, x, w, bias, m, n, k, st);
    default:
        return q8_launch<NT, 1, 3, 1, Q8_REGS, 16, 2>(y, ldy, x, w, bias, m, n, k, st);
    }
}

/* The automatic choice, from run 2 of NOTES.md "Version 5" (graph-timed, % of the copy ceiling; every
 * configuration was measured at m = 1, 4, 16 on the four Llama-2-7B shapes): m = 1 takes register staging, in
 * 8-warp blocks (3 per SM) when n is large enough to give every SM three of them (11008x4096: 46.8%,
 * 32000x4096: 54.2%), else 3 blocks per chunk in 16-warp blocks (4096x4096: 44.6%, 4096x11008: 53.7%); m >= 2
 * takes cp.async with 2 stages in 16-warp blocks, 2 per SM, the best or within 2 points of it at m = 4 and 16
 * (m = 4: 42-46%, m = 16: 30-36%). */
static int q8_pick(int m, int n, int k)
{
    (void)k;
    if (m == 1) return n >= 8192 ? 6 : 7;
    return 5;
}

extern "C" int kern_cuda_gemv_q8(float *y, int ldy, const float *x, const void *w, const float *bias, int m,
                                 int n, int k, cudaStream_t stream)
{
    if (!y || !x || !w || m < 1 || m > KERN_CUDA_GEMV_Q8_MAX_M || n < 1 || n > ldy || k < 32 || k % 32)
        return FERRY_ERR_INVALID;
    if (!FCUDA_ALIGNED(x, 16) || !FCUDA_ALIGNED(y, 4) || !FCUDA_ALIGNED(w, 2) ||
        (bias && !FCUDA_ALIGNED(bias, 4)))
        return FERRY_ERR_INVALID;
    if ((int64_t)k / 32 * Q8_BLOCK > INT32_MAX / 32) return FERRY_ERR_INVALID;
    const int cfg = q8_forced ? q8_forced : q8_pick(m, n, k);
    return m <= 8 ? q8_dispatch<1>(cfg, y, ldy, x, w, bias, m, n, k, stream)
                  : q8_dispatch<2>(cfg, y, ldy, x, w, bias, m, n, k, stream);
}

extern "C" int kern_cuda_gemv_q8_set_config(int config)
{
    if (config < 0 || config > KERN_CUDA_GEMV_Q8_CONFIGS) return FERRY_ERR_INVALID;
    const int prev = q8_forced;
    q8_forced = config;
    return prev;
}

extern "C" const char *kern_cuda_gemv_q8_config_name(int config)
{
    return config >= 0 && config <= KERN_CUDA_GEMV_Q8_CONFIGS ? q8_names[config] : "?";
}
