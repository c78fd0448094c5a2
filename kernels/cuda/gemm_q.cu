/* gemm_q (CUDA) — the tensor-core GEMM for GGUF block weights (prefill and batches past the int8 GEMV); see
 * matmul_q.h for the contract and kernels/cuda/NOTES.md (Version 7) for the reasoning.
 *
 * Pre-pass: x (m, k) f32 -> f16 (round to nearest even) in the workspace. Main kernel: a block computes a BM
 * x BN tile of y (BM rows of x, BN rows of W) over k in tiles of 64. Three shared-memory rings: raw   RST
 * stages of W's raw bytes, 256 elements of k per stage (8 blocks of 32 or one K-quant block) for the BN rows,
 * copied with 16-byte cp.async of each row's enclosing 16-byte-aligned range (so blocks keep their address
 * mod 16 for the type's aligned loads; the bytes at W's two ends go through 2-byte loads, 1-byte loads for
 * the byte-aligned MXFP4, whose stage may start at an odd address); w16   two tiles of BN x 64 f16 weights,
 * decoded from raw by all threads (one unit of 32 per task: Q::load + Q::unit + qb_decode_h2, each value the
 * f16 rounding of dequant_row's, bitwise); x16   XST tiles of BM x 64 f16 x, by cp.async (rows past m and
 * columns past k zero-filled). Per tile t, after one __syncthreads: issue x tile t+XST-1 (and the next raw
 * stage when one is used up), decode tile t+1 into the other w16 buffer, and multiply tile t (ldmatrix +
 * mma.sync m16n8k16, f32 accumulators in registers: warp tile (BM/WM) x (BN/WN)). The decode of the next tile
 * and the MMAs of this one overlap across warps. Every weight byte is read from memory once per block, i.e.
 * once per BM rows of x. PDL: trigger at the top; the first raw stages (weights) are requested before
 * pdl_wait(), x after.
 */
#include <cuda_fp16.h>
#include <stdint.h>

#include "kernels/cuda/check.h"
#include "kernels/cuda/matmul_q.h"
#include "kernels/cuda/pdl.h"
#include "kernels/cuda/matmul_q_steps.cuh"

/* k per tile; halves per row of a w16 / x16 tile (144 bytes: ldmatrix rows in distinct banks). */
#define GM_BK  64
#define GM_LD  (GM_BK + 8)
#define GM_TPR (GM_RKS / GM_BK)

/* ----------------------------------------------------------------------------------------------------------
 */
/* x pre-pass */

extern "C" size_t kern_cuda_qmm_gemm_ws(int m, int k)
{
    return (size_t)m * k * sizeof(__half);
}

/* n8 groups of 8 consecutive elements. */
__global__ void __launch_bounds__(256) gm_round_x_kernel(uint4 *xh, const float4 *x, int64_t n8)
{
    pdl_wait(); /* x comes from the previous kernel, and the previous product may still read xh */
    pdl_trigger();
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n8;
         i += (int64_t)gridDim.x * blockDim.x) {
        const float4 a = __ldg(x + 2 * i), b = __ldg(x + 2 * i + 1);
        const __half2 h0 = __floats2half2_rn(a.x, a.y), h1 = __floats2half2_rn(a.z, a.w);
        const __half2 h2 = __floats2half2_rn(b.x, b.y), h3 = __floats2half2_rn(b.z, b.w);
        xh[i] =
            make_uint4(*reinterpret_cast<const uint32_t *>(&h0), *reinterpret_cast<const uint32_t *>(&h1),
                       *reinterpret_cast<const uint32_t *>(&h2), *reinterpret_cast<const uint32_t *>(&h3));
    }
}

/* ----------------------------------------------------------------------------------------------------------
 */
/* Shapes and shared-memory layout */

template <class Q, int BM, int BN, int WM, int WN, int RST, int XST> struct gm_shape {
    static constexpr int THREADS = WM * WN * 32;
    static constexpr int WTM = BM / WM, WTN = BN / WN; /* warp tile */
    static constexpr int MT = WTM / 16, NT = WTN / 8;  /* MMA tiles per warp */
    static_assert(WTM % 16 == 0 && WTN % 8 == 0 && (NT == 1 || NT % 2 == 0), "warp tile");
    static constexpr int RBLK = gm_raw<Q>::RBLK, RQ = gm_raw<Q>::RQ, RSTRIDE = gm_raw<Q>::RSTRIDE;
    static constexpr size_t X_BYTES = (size_t)XST * BM * GM_LD * 2;
    static constexpr size_t W_BYTES = (size_t)2 * BN * GM_LD * 2;
    static constexpr size_t R_BYTES = (size_t)RST * BN * RSTRIDE;
    static constexpr size_t SMEM = X_BYTES + W_BYTES + R_BYTES;
};

/* ----------------------------------------------------------------------------------------------------------
 */
/* Copies */

__device__ __forceinline__ void gm_cp16(void *dst, const void *src, int src_bytes)
{
    const unsigned d = (unsigned)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(d), "l"(src), "r"(src_bytes)
                 : "memory");
}
__device__ __forceinline__ void gm_commit(void)
{
    asm volatile("cp.async.commit_group;" ::: "memory");
}
template <int N> __device__ __forceinline__ void gm_wait(void)
{
    asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

/* Raw stage r (blocks r*RBLK ..) of rows [n0, n0 + BN) into buf (rows past n repeat row n-1). */
template <class Q, int BN, int THREADS, int RQ, int RSTRIDE, int RBLK>
__device__ __forceinline__ void gm_issue_raw(unsigned char *buf, uintptr_t wlo, uintptr_t whi, int n0, int n,
                                             int rowbytes, int nb, int r, int tid)
{
    const int b0 = r * RBLK, nbytes = min(RBLK, nb - b0) * Q::BYTES;
    for (int i = tid; i < BN * RQ; i += THREADS) {
        const int row = i / RQ, q = i - row * RQ;
        const uintptr_t ga = wlo + (size_t)min(n0 + row, n - 1) * rowbytes + (size_t)b0 * Q::BYTES;
        const uintptr_t src = (ga & ~(uintptr_t)15) + 16 * q;
        if (src >= ga + nbytes) continue;
        unsigned char *dst = buf + row * RSTRIDE + 16 * q;
        if (src >= wlo && src + 16 <= whi) {
            gm_cp16(dst, (const void *)src, 16);
        } else if constexpr (Q::ALIGN == 1) { /* byte-aligned blocks (MXFP4): W's ends byte by byte */
#pragma unroll
            for (int e = 0; e < 16; e++) {
                const uintptr_t a = src + e;
                if (a >= ga && a < ga + nbytes) dst[e] = __ldg(reinterpret_cast<const unsigned char *>(a));
            }
        } else { /* W's first or last 16-byte piece: only the stage's own bytes (2-byte-aligned blocks) */
#pragma unroll
            for (int e = 0; e < 16; e += 2) {
                const uintptr_t a = src + e;
                if (a >= ga && a < ga + nbytes)
                    *reinterpret_cast<uint16_t *>(dst + e) = __ldg(reinterpret_cast<const uint16_t *>(a));
            }
        }
    }
}

/* x tile t (columns 64t ..) of rows [m0, m0 + BM) into xs; rows past m and columns past k are zeros. */
template <int BM, int THREADS>
__device__ __forceinline__ void gm_issue_x(__half *xs, const __half *xh, int m0, int m, int k, int t, int tid)
{
    for (int i = tid; i < BM * 8; i += THREADS) {
        const int row = i >> 3, c = i & 7, kk = t * GM_BK + 8 * c;
        const bool ok = m0 + row < m && kk < k;
        gm_cp16(xs + row * GM_LD + 8 * c,
                ok ? (const void *)(xh + (size_t)(m0 + row) * k + kk) : (const void *)xh, ok ? 16 : 0);
    }
}

/* Tile t of W (64 columns: units 2t, 2t+1 of every row) from its raw stage rbuf into wt as f16. */
template <class Q, int BN, int THREADS, int RSTRIDE, int RBLK>
__device__ __forceinline__ void gm_decode(__half *wt, const unsigned char *rbuf, uintptr_t wlo, int n0, int n,
                                          int rowbytes, int k, int t, int tid)
{
    const int r = t / GM_TPR;
    for (int task = tid; task < 2 * BN; task += THREADS) {
        const int row = task >> 1, ul = task & 1;
        const uintptr_t ga = wlo + (size_t)min(n0 + row, n - 1) * rowbytes + (size_t)r * RBLK * Q::BYTES;
        gm_decode_task<Q>(reinterpret_cast<uint8_t *>(wt + row * GM_LD + 32 * ul), rbuf + row * RSTRIDE, ga,
                          t, ul, k);
    }
}

/* ----------------------------------------------------------------------------------------------------------
 */
/* Tensor cores */

__device__ __forceinline__ void gm_ldsm_x4(uint32_t (&r)[4], const void *p)
{
    const unsigned a = (unsigned)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
}
__device__ __forceinline__ void gm_ldsm_x2(uint32_t (&r)[2], const void *p)
{
    const unsigned a = (unsigned)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];" : "=r"(r[0]), "=r"(r[1]) : "r"(a));
}
__device__ __forceinline__ void gm_mma(float (&c)[4], const uint32_t (&a)[4], const uint32_t (&b)[2])
{
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

/* acc += x tile (rows of this warp) · w tile (rows of this warp)ᵀ over 64 columns. A fragments: ldmatrix.x4
 * of the 16x16 x block (lanes 0-15 rows 0-15 at column 0, lanes 16-31 at column 8: a0..a3 = rows 0-7 / 8-15 x
 * columns 0-7 / 8-15). B fragments: ldmatrix (non-transposed) of W rows, which is the "col" layout of B:
 * matrices (rows 0-7, k 0-7), (rows 0-7, k 8-15), (rows 8-15, k 0-7), (rows 8-15, k 8-15) = b0, b1 of two n8
 * tiles. */
template <int MT, int NT>
__device__ __forceinline__ void gm_mma_tile(float (&acc)[MT][NT][4], const __half *xs, const __half *wt,
                                            int lane)
{
#pragma unroll
    for (int ks = 0; ks < GM_BK / 16; ks++) {
        uint32_t a[MT][4], b[NT][2];
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
            gm_ldsm_x4(a[mt], xs + (mt * 16 + (lane & 15)) * GM_LD + ks * 16 + (lane >> 4) * 8);
        if constexpr (NT == 1) {
            gm_ldsm_x2(b[0], wt + (lane & 7) * GM_LD + ks * 16 + ((lane >> 3) & 1) * 8);
        } else {
#pragma unroll
            for (int np = 0; np < NT / 2; np++) {
                uint32_t r[4];
                gm_ldsm_x4(r, wt + (np * 16 + (lane >> 4) * 8 + (lane & 7)) * GM_LD + ks * 16 +
                                  ((lane >> 3) & 1) * 8);
                b[2 * np][0] = r[0], b[2 * np][1] = r[1], b[2 * np + 1][0] = r[2], b[2 * np + 1][1] = r[3];
            }
        }
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int nt = 0; nt < NT; nt++) gm_mma(acc[mt][nt], a[mt], b[nt]);
    }
}

/* ----------------------------------------------------------------------------------------------------------
 */
/* The kernel */

template <class Q, int BM, int BN, int WM, int WN, int RST, int XST, int MINB>
__global__ void __launch_bounds__(WM *WN * 32, MINB)
    gm_kernel(float *y, int ldy, const __half *xh, const uint8_t *w, const float *bias, int m, int n, int k)
{
    using SH = gm_shape<Q, BM, BN, WM, WN, RST, XST>;
    constexpr int THREADS = SH::THREADS, MT = SH::MT, NT = SH::NT, RQ = SH::RQ, RSTRIDE = SH::RSTRIDE;
    constexpr int RBLK = SH::RBLK;
    extern __shared__ __align__(16) unsigned char smem[];
    __half *xs = reinterpret_cast<__half *>(smem);
    __half *wt = reinterpret_cast<__half *>(smem + SH::X_BYTES);
    unsigned char *rs = smem + SH::X_BYTES + SH::W_BYTES;
    pdl_trigger();
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int wm = warp % WM, wn = warp / WM;
    const int n0 = blockIdx.x * BN, m0 = blockIdx.y * BM;
    const int nb = k / Q::QK, rowbytes = nb * Q::BYTES, ntiles = (k + GM_BK - 1) / GM_BK;
    const int nraw = (nb + RBLK - 1) / RBLK;
    const uintptr_t wlo = (uintptr_t)w, whi = wlo + (size_t)n * rowbytes;

    /* Prologue: raw stages 0..RST-1 (weights: before waiting for the previous kernel), x tiles 0..XST-2;
     * group g holds x tile g (and group 0 the raw stages); then tile 0 decoded. */
    for (int r = 0; r < RST && r < nraw; r++)
        gm_issue_raw<Q, BN, THREADS, RQ, RSTRIDE, RBLK>(rs + (size_t)r * BN * RSTRIDE, wlo, whi, n0, n,
                                                        rowbytes, nb, r, tid);
    pdl_wait();
#pragma unroll
    for (int s = 0; s < XST - 1; s++) {
        if (s < ntiles) gm_issue_x<BM, THREADS>(xs + (size_t)s * BM * GM_LD, xh, m0, m, k, s, tid);
        gm_commit();
    }
    gm_wait<XST - 2>();
    __syncthreads();
    gm_decode<Q, BN, THREADS, RSTRIDE, RBLK>(wt, rs, wlo, n0, n, rowbytes, k, 0, tid);

    float acc[MT][NT][4];
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) acc[mt][nt][e] = 0.0f;

    /* At the top of iteration t, groups 0 .. t+XST-2 are committed; waiting until at most XST-2 are pending
     * completes group t (x tile t, and every raw stage the decode of tile t+1 needs: a stage is issued TPR
     * tiles before its first use and XST-1 <= (RST-1)*TPR). The barrier then also makes tile t's decode (done
     * in iteration t-1) visible, and frees the buffers the issues below overwrite: x slot (t-1) mod XST, w16
     * buffer (t+1) mod 2 and the raw stage of tiles up to t (all last read before it). */
    for (int t = 0; t < ntiles; t++) {
        gm_wait<XST - 2>();
        __syncthreads();
        if (t + XST - 1 < ntiles)
            gm_issue_x<BM, THREADS>(xs + (size_t)((t + XST - 1) % XST) * BM * GM_LD, xh, m0, m, k,
                                    t + XST - 1, tid);
        if ((t + 1) % GM_TPR == 0) {
            const int rr = (t + 1) / GM_TPR + RST - 1;
            if (rr < nraw)
                gm_issue_raw<Q, BN, THREADS, RQ, RSTRIDE, RBLK>(rs + (size_t)(rr % RST) * BN * RSTRIDE, wlo,
                                                                whi, n0, n, rowbytes, nb, rr, tid);
        }
        gm_commit();
        if (t + 1 < ntiles)
            gm_decode<Q, BN, THREADS, RSTRIDE, RBLK>(wt + (size_t)((t + 1) & 1) * BN * GM_LD,
                                                     rs + (size_t)(((t + 1) / GM_TPR) % RST) * BN * RSTRIDE,
                                                     wlo, n0, n, rowbytes, k, t + 1, tid);
        gm_mma_tile<MT, NT>(acc, xs + (size_t)(t % XST) * BM * GM_LD + (size_t)wm * SH::WTM * GM_LD,
                            wt + (size_t)(t & 1) * BN * GM_LD + (size_t)wn * SH::WTN * GM_LD, lane);
    }
    gm_wait<0>();

    /* C fragment: e = 0,1 -> row g, columns 2q, 2q+1; e = 2,3 -> row g+8 (rows: x, columns: W rows). */
    const int g = lane >> 2, q = lane & 3;
#pragma unroll
    for (int nt = 0; nt < NT; nt++)
#pragma unroll
        for (int e1 = 0; e1 < 2; e1++) {
            const int col = n0 + wn * SH::WTN + nt * 8 + 2 * q + e1;
            if (col >= n) continue;
            const float bv = bias ? bias[col] : 0.0f;
#pragma unroll
            for (int mt = 0; mt < MT; mt++)
#pragma unroll
                for (int e2 = 0; e2 < 2; e2++) {
                    const int row = m0 + wm * SH::WTM + mt * 16 + g + 8 * e2;
                    if (row < m) y[(size_t)row * ldy + col] = acc[mt][nt][2 * e2 + e1] + bv;
                }
        }
}

/* ----------------------------------------------------------------------------------------------------------
 */
/* Host side: configurations and launch */

/* Every configuration: number, tile BM x BN, warps WM x WN, raw stages, x stages, blocks per SM for the
 * registers (__launch_bounds__), and a description for bench output. */
#define GM_CONFIGS(X)                                                                                        \
    X(1, 16, 32, 1, 4, 4, 3, 4, "16x32 tiles, 4 warps of 16x8, 4 raw stages")                                \
    X(2, 16, 64, 1, 4, 3, 3, 3, "16x64 tiles, 4 warps of 16x16, 3 raw stages")                               \
    X(3, 32, 32, 2, 2, 4, 3, 3, "32x32 tiles, 4 warps of 16x16, 4 raw stages")                               \
    X(4, 64, 32, 4, 1, 4, 3, 3, "64x32 tiles, 4 warps of 16x32, 4 raw stages")                               \
    X(5, 64, 64, 2, 2, 3, 3, 2, "64x64 tiles, 4 warps of 32x32, 3 raw stages")                               \
    X(6, 128, 64, 4, 2, 2, 3, 1, "128x64 tiles, 8 warps of 32x32, 2 raw stages")                             \
    X(7, 128, 128, 2, 4, 2, 3, 1, "128x128 tiles, 8 warps of 64x32, 2 raw stages")                           \
    X(8, 16, 16, 1, 2, 4, 3, 6, "16x16 tiles, 2 warps of 16x8, 4 raw stages")                                \
    X(9, 32, 16, 2, 2, 4, 3, 4, "32x16 tiles, 4 warps of 16x8, 4 raw stages")                                \
    X(10, 128, 64, 4, 2, 3, 5, 1, "128x64 tiles, 8 warps of 32x32, 3 raw / 5 x stages")                      \
    X(11, 128, 128, 2, 4, 3, 4, 1, "128x128 tiles, 8 warps of 64x32, 3 raw / 4 x stages")                    \
    X(12, 128, 64, 4, 2, 2, 4, 2, "128x64 tiles, 8 warps of 32x32, 2 raw / 4 x stages, 2 blocks/SM")

struct gm_cfg_info {
    int bm, bn;
    const char *name;
};
static const struct gm_cfg_info gm_cfgs[KERN_CUDA_QGEMM_CONFIGS + 1] = {{0, 0, "auto"},
#define GM_INFO(i, BM, BN, WM, WN, RST, XST, MINB, name) {BM, BN, name},
                                                                        GM_CONFIGS(GM_INFO)
#undef GM_INFO
};

template <class Q, int BM, int BN, int WM, int WN, int RST, int XST, int MINB>
static int gm_launch(const struct kern_cuda_qmm *c, float *y, const __half *xh, int m)
{
    constexpr size_t smem = gm_shape<Q, BM, BN, WM, WN, RST, XST>::SMEM;
    auto kern = gm_kernel<Q, BM, BN, WM, WN, RST, XST, MINB>;
    static bool attr_set = false;
    if (!attr_set) {
        FCUDA_CHECK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        attr_set = true;
    }
    const dim3 grid((unsigned)((c->n + BN - 1) / BN), (unsigned)((m + BM - 1) / BM));
    FCUDA_CHECK(pdl_launch(kern, grid, dim3(WM * WN * 32), smem, c->stream, y, c->ldy, xh,
                           (const uint8_t *)c->w, c->bias, m, c->n, c->k));
    FCUDA_LAUNCH_CHECK("gm_kernel");
    return FERRY_OK;
}

template <class Q> static size_t gm_cfg_smem(int cfg)
{
    switch (cfg) {
#define GM_SMEM_CASE(i, BM, BN, WM, WN, RST, XST, MINB, name)                                                \
    case i:                                                                                                  \
        return gm_shape<Q, BM, BN, WM, WN, RST, XST>::SMEM;
        GM_CONFIGS(GM_SMEM_CASE)
#undef GM_SMEM_CASE
    }
    return 0;
}

template <class Q>
static int gm_cfg_launch(int cfg, const struct kern_cuda_qmm *c, float *y, const __half *xh, int m)
{
    switch (cfg) {
#define GM_LAUNCH_CASE(i, BM, BN, WM, WN, RST, XST, MINB, name)                                              \
    case i:                                                                                                  \
        return gm_launch<Q, BM, BN, WM, WN, RST, XST, MINB>(c, y, xh, m);
        GM_CONFIGS(GM_LAUNCH_CASE)
#undef GM_LAUNCH_CASE
    }
    return FERRY_ERR_INVALID;
}

/* The automatic choice: the row-tile height by m (16, 32, 64, 128), then the widest W tile whose grid still
 * gives every SM a block (two up to m = 64, where the kernel streams W and several blocks per SM hide the
 * latency of the decode), else the narrowest, among the configurations whose shared memory fits the device.
 */
template <class Q> static int gm_pick(int m, int n)
{
    static const int by_m[4][6] = {{2, 1, 8, 0}, {3, 9, 0, 0}, {5, 4, 0, 0}, {11, 10, 7, 6, 5, 4}};
    const int *cand = by_m[m <= 16 ? 0 : m <= 32 ? 1 : m <= 64 ? 2 : 3];
    const int64_t want = (int64_t)fcuda_sm_count() * (m <= 64 ? 2 : 1); /* blocks */
    const size_t optin = (size_t)fcuda_smem_optin();
    int last = 1;
    for (int i = 0; i < 6 && cand[i]; i++) {
        const int cfg = cand[i];
        if (gm_cfg_smem<Q>(cfg) > optin) continue;
        last = cfg;
        const int64_t blocks = (int64_t)((n + gm_cfgs[cfg].bn - 1) / gm_cfgs[cfg].bn) *
                               ((m + gm_cfgs[cfg].bm - 1) / gm_cfgs[cfg].bm);
        if (blocks >= want) return cfg;
    }
    return last;
}

template <class Q> int kern_cuda_qgemm(const struct kern_cuda_qmm *c, int config)
{
    const int k = c->k;
    const int64_t rows_fit = (int64_t)(c->ws_bytes / ((size_t)k * sizeof(__half)));
    if (rows_fit < 1) return FERRY_ERR_RANGE;
    if (config < 0 || config > KERN_CUDA_QGEMM_CONFIGS) return FERRY_ERR_INVALID;
    if (config && gm_cfg_smem<Q>(config) > (size_t)fcuda_smem_optin()) return FERRY_ERR_UNSUPPORTED;
    __half *xh = (__half *)c->ws;
    for (int i = 0; i < c->m; i += (int)(rows_fit < c->m ? rows_fit : c->m)) {
        const int mt = (int)(c->m - i < rows_fit ? c->m - i : rows_fit);
        const int64_t n8 = (int64_t)mt * k / 8;
        FCUDA_CHECK(pdl_launch(gm_round_x_kernel, dim3(fcuda_blocks(n8, 256)), dim3(256), 0, c->stream,
                               (uint4 *)xh, (const float4 *)(c->x + (size_t)i * k), n8));
        FCUDA_LAUNCH_CHECK("gm_round_x_kernel");
        const int cfg = config ? config : gm_pick<Q>(mt, c->n);
        const int rc = gm_cfg_launch<Q>(cfg, c, c->y + (size_t)i * c->ldy, xh, mt);
        if (rc) return rc;
    }
    return FERRY_OK;
}
#define GM_INSTANCE(T, name, Q) template int kern_cuda_qgemm<Q>(const struct kern_cuda_qmm *, int);
QB_TYPES(GM_INSTANCE)
#undef GM_INSTANCE

/* ----------------------------------------------------------------------------------------------------------
 */
/* W decoded to f16 (the pieces the cuBLAS variant multiplies): a block takes GD_BN rows x one raw stage (256
 * elements of k), stages the bytes as the GEMM does (gm_issue_raw), decodes each unit of 32 with the GEMM's
 * own task (gm_decode_task) into a shared tile (the lanes of a quarter-warp on 8 rows: rows 528 bytes apart
 * fall in different banks), then writes the tile out in 16-byte pieces, a warp per 512 contiguous bytes of a
 * row. PDL: the weights are requested before waiting for the previous kernel (which may still read out). */
#define GD_BN 32
#define GD_LD (GM_RKS + 8)

template <class Q>
__global__ void __launch_bounds__(256) gm_dequant_kernel(__half *out, const uint8_t *w, int n, int k)
{
    using R = gm_raw<Q>;
    constexpr int UPS = GM_RKS / 32, CPR = GM_RKS / 8; /* units, 16-byte pieces per row of a stage */
    __shared__ __align__(16) unsigned char rs[GD_BN * R::RSTRIDE + 16];
    __shared__ __align__(16) __half tile[GD_BN * GD_LD];
    pdl_trigger();
    const int tid = threadIdx.x, n0 = blockIdx.x * GD_BN, r = blockIdx.y;
    const int nb = k / Q::QK, rowbytes = nb * Q::BYTES, cols = min(GM_RKS, k - r * GM_RKS);
    const uintptr_t wlo = (uintptr_t)w, whi = wlo + (size_t)n * rowbytes;
    gm_issue_raw<Q, GD_BN, 256, R::RQ, R::RSTRIDE, R::RBLK>(rs, wlo, whi, n0, n, rowbytes, nb, r, tid);
    gm_commit();
    gm_wait<0>();
    __syncthreads();
    for (int task = tid; task < GD_BN * UPS; task += 256) {
        const int u = task / GD_BN, row = task - u * GD_BN, t = r * GM_TPR + (u >> 1);
        const uintptr_t ga = wlo + (size_t)min(n0 + row, n - 1) * rowbytes + (size_t)r * R::RBLK * Q::BYTES;
        gm_decode_task<Q>(reinterpret_cast<uint8_t *>(tile + row * GD_LD + 32 * u), rs + row * R::RSTRIDE, ga,
                          t, u & 1, k);
    }
    __syncthreads();
    pdl_wait();
    for (int i = tid; i < GD_BN * CPR; i += 256) {
        const int row = i / CPR, c = i - row * CPR;
        if (n0 + row < n && 8 * c < cols)
            *reinterpret_cast<uint4 *>(out + (size_t)(n0 + row) * k + r * GM_RKS + 8 * c) =
                *reinterpret_cast<const uint4 *>(tile + row * GD_LD + 8 * c);
    }
}

template <class Q> int kern_cuda_qdequant(__half *out, const void *w, int n, int k, cudaStream_t stream)
{
    const int nraw = (k / Q::QK + gm_raw<Q>::RBLK - 1) / gm_raw<Q>::RBLK;
    const dim3 grid((unsigned)((n + GD_BN - 1) / GD_BN), (unsigned)nraw);
    FCUDA_CHECK(pdl_launch(gm_dequant_kernel<Q>, grid, dim3(256), 0, stream, out, (const uint8_t *)w, n, k));
    FCUDA_LAUNCH_CHECK("gm_dequant_kernel");
    return FERRY_OK;
}
#define GD_INSTANCE(T, name, Q)                                                                              \
    template int kern_cuda_qdequant<Q>(__half *, const void *, int, int, cudaStream_t);
QB_TYPES(GD_INSTANCE)
#undef GD_INSTANCE

const char *kern_cuda_qgemm_config_name(int config)
{
    return config >= 0 && config <= KERN_CUDA_QGEMM_CONFIGS ? gm_cfgs[config].name : "?";
}
