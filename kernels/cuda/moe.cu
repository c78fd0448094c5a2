/* moe (CUDA) — routing, the grouped expert GEMV and the weighted sum; see moe.h for the contract.
 *
 * The GEMV: a block of MOE_WARPS warps takes MOE_WARPS rows of one output row o (blockIdx.y); each warp one
 * row r of the J pairs' experts. Float types: per pair, lane i takes elements i, i + 32, ... of the row, the
 * lanes' sums are added by a butterfly, scaled by the pair's weight, and the J sums added in j order. Block
 * types read x's int8 form (x8.cuh, written by kern_cuda_moe_x8): the J rows' pieces of blocks form one list
 * that lane i walks from i in steps of 32, so the lanes of a warp read consecutive pieces of the weights and
 * consecutive units of xq (coalesced: the f32 form of x read per element, one cache line per lane, held this
 * kernel at 4% of the device's bandwidth); each unit is decoded (qblock.cuh) and multiplied with xq by dp4a
 * (qb_dot, the arithmetic of the dense int8 GEMV), each piece's sum scaled by its pair's weight, then one
 * butterfly. Either way the order of every sum is fixed: deterministic.
 */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda/check.h"
#include "kernels/cuda/matmul_q.h"
#include "kernels/cuda/moe.h"
#include "kernels/cuda/moe_dot.cuh"
#include "kernels/cuda/moe_tile.cuh"
#include "kernels/cuda/x8.cuh"

extern "C" {
#include "quant/dtype.h"
}

#define MOE_WARPS 4

/* ---- routing ------------------------------------------------------------------------------------------ */

/* One warp per token: lane i holds experts i, i + 32, ... The softmax's maximum and its double-precision sum
 * by butterflies; each pick is the warp's largest untaken logit, ties to the lowest id (a total order, so
 * every lane ends with the same pick); lane 0 writes the picks and, with norm, divides by their sum in pick
 * order as the CPU reference does. */
#define MOE_ROUTE_WORDS (KERN_CUDA_MOE_MAX_EXPERTS / 32 / 32) /* taken bits per lane */
__global__ void moe_route_kernel(const float *logits, int n, int ne, int k, int norm, int32_t *ids,
                                 float *wts)
{
    const int t = (int)((blockIdx.x * (unsigned)blockDim.x + threadIdx.x) >> 5), lane = threadIdx.x & 31;
    if (t >= n) return; /* (whole warps) */
    const float *l = logits + (size_t)t * ne;
    float mx = -INFINITY;
    for (int e = lane; e < ne; e += 32) mx = fmaxf(mx, l[e]);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    double sum = 0;
    for (int e = lane; e < ne; e += 32) sum += exp((double)l[e] - mx);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    uint32_t taken[MOE_ROUTE_WORDS] = {0};
    float picked = 0.0f; /* lane 0: the sum of the weights so far */
    for (int j = 0; j < k; j++) {
        float bv = -INFINITY;
        int be = -1;
        for (int e = lane, i = 0; e < ne; e += 32, i++)
            if (!(taken[i >> 5] >> (i & 31) & 1u) && (be < 0 || l[e] > bv)) bv = l[e], be = e;
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
            const int oe = __shfl_xor_sync(0xffffffffu, be, o);
            if (oe >= 0 && (be < 0 || ov > bv || (ov == bv && oe < be))) bv = ov, be = oe;
        }
        if ((be & 31) == lane) taken[(be >> 5) >> 5] |= 1u << ((be >> 5) & 31);
        if (lane == 0) {
            ids[(size_t)t * k + j] = be;
            const float w = (float)(exp((double)bv - mx) / sum);
            wts[(size_t)t * k + j] = w;
            picked += w;
        }
    }
    if (norm && lane == 0)
        for (int j = 0; j < k; j++) wts[(size_t)t * k + j] /= picked;
}

extern "C" int kern_cuda_moe_route(const float *logits, int n, int n_expert, int k, int norm, int32_t *ids,
                                   float *wts, cudaStream_t stream)
{
    if (n < 1 || n_expert < 1 || n_expert > KERN_CUDA_MOE_MAX_EXPERTS || k < 1 || k > n_expert)
        return FERRY_ERR_INVALID;
    moe_route_kernel<<<fcuda_blocks((int64_t)n * 32, 128, INT32_MAX), 128, 0, stream>>>(logits, n, n_expert,
                                                                                        k, norm, ids, wts);
    FCUDA_LAUNCH_CHECK("moe_route_kernel");
    return FERRY_OK;
}

/* ---- row dot products ---------------------------------------------------------------------------------- */

/* Float types E: a lane's share of the dot product of one weight row (cols elements) with x. */
__device__ __forceinline__ float moe_val(float v)
{
    return v;
}
__device__ __forceinline__ float moe_val(__half v)
{
    return __half2float(v);
}
__device__ __forceinline__ float moe_val(__nv_bfloat16 v)
{
    return __bfloat162float(v);
}
template <class E>
__device__ __forceinline__ float moe_float_dot(const uint8_t *row, const float *x, int cols, int lane)
{
    const E *w = reinterpret_cast<const E *>(row);
    float a = 0.0f;
    for (int i = lane; i < cols; i += 32) a = fmaf(moe_val(w[i]), __ldg(x + i), a);
    return a;
}

template <class E>
__global__ void __launch_bounds__(MOE_WARPS * 32)
    moe_gemv_float_kernel(float *y, int ldy, const float *x, int ldx, const uint8_t *w, size_t expert_bytes,
                          size_t row_bytes, int n_expert, int rows, int cols, const int32_t *ids,
                          const float *wts, const float *bias, int J, int xdiv)
{
    const int lane = threadIdx.x & 31, r = blockIdx.x * MOE_WARPS + (threadIdx.x >> 5), o = blockIdx.y;
    if (r >= rows) return;
    float acc = 0.0f;
    for (int j = 0; j < J; j++) {
        const int pair = o * J + j, e = ids[pair];
        if (e < 0 || e >= n_expert) continue;
        float d = moe_float_dot<E>(w + (size_t)e * expert_bytes + (size_t)r * row_bytes,
                                   x + (size_t)(pair / xdiv) * ldx, cols, lane);
#pragma unroll
        for (int s = 16; s > 0; s >>= 1) d += __shfl_xor_sync(0xffffffffu, d, s);
        if (bias) d += bias[(size_t)e * rows + r];
        acc = wts ? fmaf(wts[pair], d, acc) : acc + d;
    }
    if (lane == 0) y[(size_t)o * ldy + r] = acc;
}

/* x's int8 form, rows of cols at stride ldx: thread g takes elements 4 (g % 8) .. + 3 of unit g / 8 (x8.cuh's
 * group of 8 lanes); a group past the last unit quantizes zeros and stores nothing (8 divides 32, so a group
 * is never split between a stored and an unstored half). */
__global__ void __launch_bounds__(256)
    moe_x8_kernel(uint8_t *xq, float *xd, const float *x, int ldx, int m, int cols)
{
    const int64_t g = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    const int nu = cols / 32, sub = (int)(g & 7);
    const int64_t unit = g >> 3;
    const bool in = unit < (int64_t)m * nu;
    const int row = in ? (int)(unit / nu) : 0, u = in ? (int)(unit - (int64_t)row * nu) : 0;
    const float4 v = in ? *reinterpret_cast<const float4 *>(x + (size_t)row * ldx + 32 * u + 4 * sub)
                        : make_float4(0.f, 0.f, 0.f, 0.f);
    const x8_part q = x8_quant4(v);
    if (in) x8_store(xq, xd, q, row, u, sub, cols);
}

/* Block type Q on x's int8 form: lane i walks the J rows' pieces i, i + 32, ... (piece p of block b of the
 * row of pair j), each piece's units dotted with xq in f32 (qb_dot) and weighted by its pair's weight. */
template <class Q>
__global__ void __launch_bounds__(MOE_WARPS * 32)
    moe_gemv_q_kernel(float *y, int ldy, const uint8_t *xq, const float *xd, const uint8_t *w,
                      size_t expert_bytes, size_t row_bytes, int n_expert, int rows, int cols,
                      const int32_t *ids, const float *wts, const float *bias, int J, int xdiv)
{
    const int lane = threadIdx.x & 31, r = blockIdx.x * MOE_WARPS + (threadIdx.x >> 5), o = blockIdx.y;
    if (r >= rows) return;
    const int items = moe_q_items<Q>(cols), total = J * items;
    float acc = 0.0f;
    for (int g = lane; g < total; g += 32) {
        const int j = g / items, pair = o * J + j, e = ids[pair];
        if (e < 0 || e >= n_expert) continue;
        const size_t xrow = (size_t)(pair / xdiv) * cols;
        const float t = moe_q_item<Q>(w + (size_t)e * expert_bytes + (size_t)r * row_bytes, xq + xrow,
                                      xd + xrow / 8, g - j * items, 0.0f);
        acc = wts ? fmaf(wts[pair], t, acc) : acc + t;
    }
#pragma unroll
    for (int s = 16; s > 0; s >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, s);
    if (bias) /* each pair's bias, weighted as its product is (in j order, after the products) */
        for (int j = 0; j < J; j++) {
            const int pair = o * J + j, e = ids[pair];
            if (e >= 0 && e < n_expert) acc = fmaf(wts ? wts[pair] : 1.0f, bias[(size_t)e * rows + r], acc);
        }
    if (lane == 0) y[(size_t)o * ldy + r] = acc;
}

/* ---- the grouped product for many rows -------------------------------------------------------------------
 */

/* One block: each expert's pairs counted (shared atomics), their offsets scanned (each thread a run of
 * MOE_SORT_PER experts, then a scan of the threads' totals), and each pair placed in its expert's range. The
 * order within an expert depends on the atomics' order, which changes nothing in the products: each pair's
 * sums are its own. */
#define MOE_SORT_THREADS 1024
#define MOE_SORT_PER     (KERN_CUDA_MOE_MAX_EXPERTS / MOE_SORT_THREADS)
__global__ void __launch_bounds__(MOE_SORT_THREADS)
    moe_sort_kernel(const int32_t *ids, int P, int ne, int32_t *off, int32_t *order)
{
    __shared__ int cnt[KERN_CUDA_MOE_MAX_EXPERTS];
    __shared__ int part[MOE_SORT_THREADS];
    const int t = threadIdx.x;
    for (int e = t; e < ne; e += MOE_SORT_THREADS) cnt[e] = 0;
    __syncthreads();
    for (int p = t; p < P; p += MOE_SORT_THREADS) {
        const int e = ids[p];
        if (e >= 0 && e < ne) atomicAdd(&cnt[e], 1);
    }
    __syncthreads();
    const int e0 = t * MOE_SORT_PER;
    int run = 0;
    for (int i = 0; i < MOE_SORT_PER; i++)
        if (e0 + i < ne) run += cnt[e0 + i];
    part[t] = run;
    __syncthreads();
    for (int s = 1; s < MOE_SORT_THREADS; s <<= 1) { /* inclusive scan of the runs */
        const int v = t >= s ? part[t - s] : 0;
        __syncthreads();
        part[t] += v;
        __syncthreads();
    }
    int at = part[t] - run; /* the first offset of this thread's experts */
    for (int i = 0; i < MOE_SORT_PER; i++)
        if (e0 + i < ne) {
            const int c = cnt[e0 + i];
            off[e0 + i] = at;
            cnt[e0 + i] = at; /* now the next free place */
            at += c;
        }
    if (t == MOE_SORT_THREADS - 1) off[ne] = part[t];
    __syncthreads();
    for (int p = t; p < P; p += MOE_SORT_THREADS) {
        const int e = ids[p];
        if (e >= 0 && e < ne) order[atomicAdd(&cnt[e], 1)] = p;
    }
}

/* One unit of 32 into a 16 x 8 C fragment: the int8 MMA of rows g, g + 8 (f) with x's col group (x), then the
 * f32 epilogue (mma.sync m16n8k32, or two m16n8k16 for TWO_D types whose halves have their own scales). */
template <class Q>
__device__ __forceinline__ void moe_mma_unit(float (&acc)[4], const qb_frag (&f)[2], const gqm_x &x)
{
    int c[4] = {0, 0, 0, 0}, ch[4] = {0, 0, 0, 0};
    if (Q::TWO_D) {
        gqm_mma_k16(c, f[0].w0, f[1].w0, x.b0);
        gqm_mma_k16(ch, f[0].w1, f[1].w1, x.b1);
    } else {
        gqm_mma_k32(c, f[0].w0, f[1].w0, f[0].w1, f[1].w1, x.b0, x.b1);
    }
    gqm_epilogue<Q>(acc, c, ch, f, x);
}

/* The grouped products on the tensor cores: warp w of block (row group, expert e) takes 16 rows of e (rows g
 * and g+8 of lane (g, t)) and e's pairs 8 at a time as the 8 columns of mma.sync m16n8k32 s8 (two m16n8k16
 * for TWO_D types): per unit of 32, A from the rows' blocks (Q::frag), B from the pairs' rows of xq (words t
 * and t+4 of the unit), then the dense int8 MMA kernel's epilogue (gqm_epilogue: each unit scaled in f32 as
 * qb_dot scales it). Rows past the last repeat the last row's loads and are not written. */
#define MOE_MMA_WARPS 4
template <class Q>
__global__ void __launch_bounds__(MOE_MMA_WARPS * 32)
    moe_grouped_mma_kernel(float *y, int ldy, const uint8_t *xq, const float *xd, const uint8_t *w,
                           size_t expert_bytes, size_t row_bytes, int rows, int cols, const int32_t *off,
                           const int32_t *order, const float *bias, int xdiv)
{
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3, e = blockIdx.y;
    const int r0 = (blockIdx.x * MOE_MMA_WARPS + (threadIdx.x >> 5)) * 16;
    const int beg = off[e], end = off[e + 1];
    if (r0 >= rows || beg == end) return;
    constexpr int UPB = Q::QK / 32;
    const int nu = cols / 32;
    const uint8_t *wr[2];
    float bv[2];
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const int row = min(r0 + 8 * h + g, rows - 1);
        wr[h] = w + (size_t)e * expert_bytes + (size_t)row * row_bytes;
        bv[h] = bias ? bias[(size_t)e * rows + row] : 0.0f;
    }
    for (int s = beg; s < end; s += 8) {
        const int np = min(8, end - s);
        const int pg = g < np ? order[s + g] : -1;
        int pc[2];
        size_t xc[2];
#pragma unroll
        for (int col = 0; col < 2; col++) {
            pc[col] = 2 * t + col < np ? order[s + 2 * t + col] : -1;
            xc[col] = pc[col] >= 0 ? (size_t)(pc[col] / xdiv) * nu : 0;
        }
        const size_t xg = pg >= 0 ? (size_t)(pg / xdiv) * nu : 0;
        float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        for (int gu = 0; gu < nu; gu++) {
            const int b = gu / UPB, U = gu - b * UPB;
            qb_frag f[2];
#pragma unroll
            for (int h = 0; h < 2; h++) Q::frag(wr[h] + (size_t)b * Q::BYTES, U, t, f[h]);
            gqm_x x;
            x.b0 = x.b1 = 0u;
            if (pg >= 0) {
                const uint8_t *p = xq + (xg + gu) * 32;
                x.b0 = __ldg(reinterpret_cast<const uint32_t *>(p + 4 * t));
                x.b1 = __ldg(reinterpret_cast<const uint32_t *>(p + 16 + 4 * t));
            }
#pragma unroll
            for (int col = 0; col < 2; col++) {
                qb_v4 d = {0u, 0u, 0u, 0u};
                if (pc[col] >= 0) d = qb_ldg128(xd + 4 * (xc[col] + gu));
                x.dx[col] = __uint_as_float(d.x), x.sx[col] = __uint_as_float(d.y);
                x.sq[col][0] = (int)d.z, x.sq[col][1] = (int)d.w;
            }
            moe_mma_unit<Q>(acc, f, x);
        }
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int h = i >> 1, col = i & 1, row = r0 + 8 * h + g;
            if (row < rows && pc[col] >= 0) y[(size_t)pc[col] * ldy + row] = acc[i] + bv[h];
        }
    }
}

/* The grouped products, tiled (moe_tile.cuh's layout): block (row tile, expert e) takes MT_WARPS * 16 rows of
 * e, warp w rows 16w .. 16w + 15 of them, and e's pairs MT_PAIRS at a time (a pass). Per chunk of k, the
 * block stages its rows of W and its pairs' x once (cp.async, 2 or 3 stages: the next chunks' copies run
 * while this one is multiplied); per unit, each warp takes its A fragment (Q::frag of rows g and g + 8) from
 * the stage once and runs it against every col group of 8 pairs of the pass (mma.sync m16n8k32 s8, two
 * m16n8k16 for TWO_D types), then gqm_epilogue. So each chosen expert's bytes are read once per pass,
 * whatever its pairs, and x once per row tile. The same unit order and arithmetic per output as
 * moe_grouped_mma_kernel: the same bits. */
template <class Q>
__global__ void __launch_bounds__(MT_WARPS * 32, 2) /* two blocks per SM: at most 128 registers */
    moe_tile_kernel(float *y, int ldy, const uint8_t *xq, const float *xd, const uint8_t *w,
                    size_t expert_bytes, int rows, int cols, const int32_t *off, const int32_t *order,
                    const float *bias, int xdiv)
{
    using M = mt_geom<Q>;
    using SHP = gqm_shape<Q>;
    constexpr int CB = SHP::CB, UPB = SHP::UPB, UPC = SHP::UPC, NCG = MT_PAIRS / 8;
    extern __shared__ __align__(16) unsigned char smem[];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
    const int e = blockIdx.y, row0 = (blockIdx.x * MT_WARPS + warp) * 16;
    const int beg = off[e], end = off[e + 1];
    if (beg >= end || (int)blockIdx.x * MT_WARPS * 16 >= rows) return; /* the whole block */
    const int nb = cols / Q::QK, rowbytes = nb * Q::BYTES, nch = (nb + CB - 1) / CB, nu = cols / 32;
    const uint8_t *we = w + (size_t)e * expert_bytes;
    const uintptr_t wlo = (uintptr_t)we, a16 = wlo & ~(uintptr_t)15;
    const uint32_t w0 = (uint32_t)(wlo & 15), wbytes = (uint32_t)rows * (uint32_t)rowbytes;
    float bv[2];
#pragma unroll
    for (int h = 0; h < 2; h++)
        bv[h] = bias ? bias[(size_t)e * rows + min(row0 + 8 * h + g, rows - 1)] : 0.0f;
    __shared__ int pair_s[MT_PAIRS], xrow_s[MT_PAIRS]; /* the pass's pairs and their rows of x */
    for (int s0 = beg; s0 < end; s0 += MT_PAIRS) {
        const int np = min(MT_PAIRS, end - s0), ncg = (np + 7) >> 3;
        if (tid < np) {
            const int p = __ldg(order + s0 + tid);
            pair_s[tid] = p, xrow_s[tid] = p / xdiv;
        }
        __syncthreads();
        auto issue = [&](int ch) {
            if (ch < nch) {
                unsigned char *st = smem + (ch % M::STAGES) * M::BYTES;
                const int b0 = ch * CB, nbc = min(CB, nb - b0), nuc = nbc * UPB;
                if (row0 < rows)
                    qs_issue<Q, 16, CB>(st + warp * M::G::BYTES, a16, w0, wbytes, row0, rows,
                                        (uint32_t)rowbytes, b0, nbc, lane);
                for (int i = tid; i < np * 3 * UPC; i += MT_WARPS * 32) {
                    int j, ul, part;
                    mt_x_granule<UPC>(i, j, ul, part);
                    if (ul < nuc) mt_stage_x(st + M::XQ, xq, xd, xrow_s[j], nu, b0 * UPB, j, ul, part);
                }
            }
            qs_commit();
        };
#pragma unroll 1
        for (int c = 0; c < M::STAGES - 1; c++) issue(c);
        float acc[NCG][4];
#pragma unroll
        for (int c = 0; c < NCG; c++)
#pragma unroll
            for (int i = 0; i < 4; i++) acc[c][i] = 0.0f;
#pragma unroll 1
        for (int ch = 0; ch < nch; ch++) {
            qs_wait<M::STAGES - 2>();
            __syncthreads();
            issue(ch + M::STAGES - 1);
            const unsigned char *st = smem + (ch % M::STAGES) * M::BYTES;
            const int b0 = ch * CB, nbc = min(CB, nb - b0);
            if (row0 < rows) {
                const unsigned char *rp[2];
                mt_rows<Q>(rp, st, warp, g, row0, rows, wlo, (size_t)rowbytes, b0);
                /* K-quants (one block per chunk): lane (g, t) decodes the scales of units 2t and 2t + 1 of
                 * its rows once per chunk, and each unit's come from lane (g, U / 2) by shuffles (as
                 * mmv_q.cu), instead of every lane decoding every unit's packed scale bytes. */
                float ks[2][2][4]; /* [h][unit 2t + v][d0, d1, m, m1] */
                if constexpr (UPB == 8) {
#pragma unroll
                    for (int h = 0; h < 2; h++)
#pragma unroll
                        for (int v = 0; v < 2; v++) {
                            qb_frag sf;
                            Q::frag(rp[h], 2 * t + v, t, sf);
                            ks[h][v][0] = sf.d0, ks[h][v][1] = sf.d1, ks[h][v][2] = sf.m, ks[h][v][3] = sf.m1;
                        }
                }
#pragma unroll 2
                for (int uu = 0; uu < UPC; uu++) {
                    const int bl = uu / UPB, U = uu - bl * UPB;
                    if (bl >= nbc) break;
                    qb_frag f[2];
#pragma unroll
                    for (int h = 0; h < 2; h++) Q::frag(rp[h] + bl * Q::BYTES, U, t, f[h]);
                    if constexpr (UPB == 8) { /* the scales from ks (the frag's own are then dead code) */
                        const int src = (lane & ~3) | (U >> 1), v = U & 1;
#pragma unroll
                        for (int h = 0; h < 2; h++) {
                            f[h].d0 = __shfl_sync(0xffffffffu, v ? ks[h][1][0] : ks[h][0][0], src);
                            f[h].d1 = Q::TWO_D ? __shfl_sync(0xffffffffu, v ? ks[h][1][1] : ks[h][0][1], src)
                                               : f[h].d0;
                            f[h].m = Q::HAS_M ? __shfl_sync(0xffffffffu, v ? ks[h][1][2] : ks[h][0][2], src)
                                              : -0.0f;
                            if (Q::TWO_M)
                                f[h].m1 = __shfl_sync(0xffffffffu, v ? ks[h][1][3] : ks[h][0][3], src);
                        }
                    }
#pragma unroll
                    for (int c = 0; c < NCG; c++) {
                        if (c >= ncg) break;
                        gqm_x x;
                        mt_load_x(x, st + M::XQ, c, uu, lane);
                        moe_mma_unit<Q>(acc[c], f, x);
                    }
                }
            }
        }
        /* C fragment: e = 0, 1 -> row g, pairs 2t, 2t + 1 of the col group; e = 2, 3 -> row g + 8. */
#pragma unroll
        for (int c = 0; c < NCG; c++) {
            if (c >= ncg) break;
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const int h = i >> 1, j = 8 * c + 2 * t + (i & 1), row = row0 + 8 * h + g;
                if (row < rows && j < np) y[(size_t)pair_s[j] * ldy + row] = acc[c][i] + bv[h];
            }
        }
        qs_wait<0>();
        __syncthreads(); /* the next pass restages every slot */
    }
}

/* The tiled launch for type Q: FERRY_ERR_UNSUPPORTED when its stages do not fit the device's shared memory.
 */
template <class Q>
static int moe_tile_launch(float *y, int ldy, const uint8_t *xq, const float *xd, const uint8_t *w, size_t eb,
                           int rows, int cols, const int32_t *off, const int32_t *order, const float *bias,
                           int xdiv, int n_expert, cudaStream_t stream)
{
    constexpr size_t smem = (size_t)mt_geom<Q>::STAGES * mt_geom<Q>::BYTES;
    static int ready = 0; /* 1: the attribute set, -1: does not fit */
    if (!ready) {
        if (smem > (size_t)fcuda_smem_optin()) {
            ready = -1;
        } else {
            FCUDA_CHECK(cudaFuncSetAttribute(moe_tile_kernel<Q>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                             (int)smem));
            ready = 1;
        }
    }
    if (ready < 0) return FERRY_ERR_UNSUPPORTED;
    const int per = 16 * MT_WARPS;
    const dim3 grid((unsigned)((rows + per - 1) / per), (unsigned)n_expert);
    moe_tile_kernel<Q>
        <<<grid, MT_WARPS * 32, smem, stream>>>(y, ldy, xq, xd, w, eb, rows, cols, off, order, bias, xdiv);
    FCUDA_LAUNCH_CHECK("moe_tile_kernel");
    return FERRY_OK;
}

extern "C" int kern_cuda_moe_sort(const int32_t *ids, int P, int n_expert, int32_t *off, int32_t *order,
                                  cudaStream_t stream)
{
    if (P < 1 || n_expert < 1 || n_expert > KERN_CUDA_MOE_MAX_EXPERTS) return FERRY_ERR_INVALID;
    moe_sort_kernel<<<1, MOE_SORT_THREADS, 0, stream>>>(ids, P, n_expert, off, order);
    FCUDA_LAUNCH_CHECK("moe_sort_kernel");
    return FERRY_OK;
}

/* -1: not chosen yet (the default: AUTO, or FERRY_MOE_GROUPED=warp|tile, read once). */
static int moe_grouped_kind = -1;

static int grouped_kind(void)
{
    if (moe_grouped_kind < 0) {
        const char *e = getenv("FERRY_MOE_GROUPED");
        moe_grouped_kind = e && !strcmp(e, "warp")   ? KERN_CUDA_MOE_GROUPED_WARP
                           : e && !strcmp(e, "tile") ? KERN_CUDA_MOE_GROUPED_TILE
                                                     : KERN_CUDA_MOE_GROUPED_AUTO;
    }
    return moe_grouped_kind;
}

extern "C" int kern_cuda_moe_grouped_set_kind(int kind)
{
    if (kind < KERN_CUDA_MOE_GROUPED_AUTO || kind > KERN_CUDA_MOE_GROUPED_TILE) return FERRY_ERR_INVALID;
    const int prev = grouped_kind();
    moe_grouped_kind = kind;
    return prev;
}

extern "C" int kern_cuda_moe_grouped(float *y, int ldy, const void *x8, int x_rows, const void *w,
                                     enum dtype t, const float *bias, int n_expert, int rows, int cols,
                                     const int32_t *off, const int32_t *order, int xdiv, cudaStream_t stream)
{
    if (rows < 1 || cols < 32 || rows > ldy || x_rows < 1 || xdiv < 1 || n_expert < 1 || n_expert > 65535 ||
        cols % dtype_block_size(t) || !x8 || !FCUDA_ALIGNED(x8, 16) || !FCUDA_ALIGNED(y, 4))
        return FERRY_ERR_INVALID;
    const size_t rb = dtype_row_size(t, cols), eb = rb * (size_t)rows;
    const int per = 16 * MOE_MMA_WARPS, kind = grouped_kind();
    const dim3 grid((unsigned)((rows + per - 1) / per), (unsigned)n_expert);
    uint8_t *xq;
    float *xd;
    kern_cuda_qmm_x8_at((void *)x8, x_rows, cols, &xq, &xd);
    const uint8_t *wb = (const uint8_t *)w;
    switch (t) {
#define MOE_GROUPED(T, name, Q)                                                                              \
    case DTYPE_##T:                                                                                          \
        if (!FCUDA_ALIGNED(w, Q::ALIGN) || rb % Q::ALIGN) return FERRY_ERR_INVALID;                          \
        if (kind != KERN_CUDA_MOE_GROUPED_WARP &&                                                            \
            (size_t)rows * rb + 32 < ((size_t)1 << 32)) { /* qs_issue's 32-bit offsets */                    \
            const int rc = moe_tile_launch<Q>(y, ldy, xq, xd, wb, eb, rows, cols, off, order, bias, xdiv,    \
                                              n_expert, stream);                                             \
            if (rc != FERRY_ERR_UNSUPPORTED || kind == KERN_CUDA_MOE_GROUPED_TILE) return rc;                \
        } else if (kind == KERN_CUDA_MOE_GROUPED_TILE) {                                                     \
            return FERRY_ERR_UNSUPPORTED;                                                                    \
        }                                                                                                    \
        moe_grouped_mma_kernel<Q><<<grid, MOE_MMA_WARPS * 32, 0, stream>>>(y, ldy, xq, xd, wb, eb, rb, rows, \
                                                                           cols, off, order, bias, xdiv);    \
        break;
        QB_TYPES(MOE_GROUPED)
#undef MOE_GROUPED
    default:
        return FERRY_ERR_UNSUPPORTED;
    }
    FCUDA_LAUNCH_CHECK("moe_grouped_mma_kernel");
    return FERRY_OK;
}

extern "C" int kern_cuda_moe_supports(enum dtype t)
{
    switch (t) {
    case DTYPE_F32:
    case DTYPE_F16:
    case DTYPE_BF16:
#define MOE_CASE(T, name, Q) case DTYPE_##T:
        QB_TYPES(MOE_CASE)
#undef MOE_CASE
        return 1;
    default:
        return 0;
    }
}

extern "C" size_t kern_cuda_moe_x8_bytes(int m, int cols)
{
    return m < 1 || cols < 32 || cols % 32 ? 0 : kern_cuda_qmm_x8_ws(m, cols);
}

extern "C" int kern_cuda_moe_x8(void *x8, const float *x, int ldx, int m, int cols, cudaStream_t stream)
{
    if (m < 1 || cols < 32 || cols % 32 || ldx < cols || ldx % 4 || !FCUDA_ALIGNED(x, 16) ||
        !FCUDA_ALIGNED(x8, 16))
        return FERRY_ERR_INVALID;
    uint8_t *xq;
    float *xd;
    kern_cuda_qmm_x8_at(x8, m, cols, &xq, &xd);
    const int64_t threads = (int64_t)m * (cols / 32) * 8;
    moe_x8_kernel<<<fcuda_blocks(threads, 256, INT32_MAX), 256, 0, stream>>>(xq, xd, x, ldx, m, cols);
    FCUDA_LAUNCH_CHECK("moe_x8_kernel");
    return FERRY_OK;
}

extern "C" int kern_cuda_moe_gemv(float *y, int ldy, const float *x, int ldx, const void *x8, const void *w,
                                  enum dtype t, const float *bias, int n_expert, int rows, int cols,
                                  const int32_t *ids, const float *wts, int n_out, int J, int xdiv,
                                  cudaStream_t stream)
{
    if (!kern_cuda_moe_supports(t)) return FERRY_ERR_UNSUPPORTED;
    if (rows < 1 || cols < 1 || rows > ldy || ldx < cols || n_out < 1 || n_out > 65535 || J < 1 || xdiv < 1 ||
        n_expert < 1 || cols % dtype_block_size(t) || !FCUDA_ALIGNED(y, 4) || !FCUDA_ALIGNED(x, 4))
        return FERRY_ERR_INVALID;
    const size_t rb = dtype_row_size(t, cols), eb = rb * (size_t)rows;
    const dim3 grid((unsigned)((rows + MOE_WARPS - 1) / MOE_WARPS), (unsigned)n_out);
    const uint8_t *wb = (const uint8_t *)w;
    switch (t) {
    case DTYPE_F32:
        moe_gemv_float_kernel<float><<<grid, MOE_WARPS * 32, 0, stream>>>(
            y, ldy, x, ldx, wb, eb, rb, n_expert, rows, cols, ids, wts, bias, J, xdiv);
        break;
    case DTYPE_F16:
        moe_gemv_float_kernel<__half><<<grid, MOE_WARPS * 32, 0, stream>>>(
            y, ldy, x, ldx, wb, eb, rb, n_expert, rows, cols, ids, wts, bias, J, xdiv);
        break;
    case DTYPE_BF16:
        moe_gemv_float_kernel<__nv_bfloat16><<<grid, MOE_WARPS * 32, 0, stream>>>(
            y, ldy, x, ldx, wb, eb, rb, n_expert, rows, cols, ids, wts, bias, J, xdiv);
        break;
#define MOE_LAUNCH(T, name, Q)                                                                               \
    case DTYPE_##T: {                                                                                        \
        if (!x8 || !FCUDA_ALIGNED(x8, 16) || !FCUDA_ALIGNED(w, Q::ALIGN) || rb % Q::ALIGN)                   \
            return FERRY_ERR_INVALID;                                                                        \
        uint8_t *xq;                                                                                         \
        float *xd;                                                                                           \
        kern_cuda_qmm_x8_at((void *)x8, (n_out * J - 1) / xdiv + 1, cols, &xq, &xd);                         \
        moe_gemv_q_kernel<Q><<<grid, MOE_WARPS * 32, 0, stream>>>(y, ldy, xq, xd, wb, eb, rb, n_expert,      \
                                                                  rows, cols, ids, wts, bias, J, xdiv);      \
        break;                                                                                               \
    }
        QB_TYPES(MOE_LAUNCH)
#undef MOE_LAUNCH
    default:
        return FERRY_ERR_UNSUPPORTED;
    }
    FCUDA_LAUNCH_CHECK("moe_gemv_kernel");
    return FERRY_OK;
}

/* ---- gpt-oss's activation --------------------------------------------------------------------------------
 */

__global__ void moe_swiglu_clamped_kernel(float *h, const float *gu, int m, int ffn, float alpha, float limit)
{
    const int64_t g = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (g >= (int64_t)m * ffn) return;
    const int64_t t = g / ffn, i = g - t * ffn;
    const float gv = fminf(gu[t * 2 * ffn + i], limit),
                u = fminf(fmaxf(gu[t * 2 * ffn + ffn + i], -limit), limit);
    h[g] = gv / (1.0f + expf(-alpha * gv)) * (u + 1.0f);
}

extern "C" int kern_cuda_moe_swiglu_clamped(float *h, const float *gu, int m, int ffn, float alpha,
                                            float limit, cudaStream_t stream)
{
    if (m < 1 || ffn < 1) return FERRY_ERR_INVALID;
    const int64_t total = (int64_t)m * ffn;
    moe_swiglu_clamped_kernel<<<fcuda_blocks(total, 256, INT32_MAX), 256, 0, stream>>>(h, gu, m, ffn, alpha,
                                                                                       limit);
    FCUDA_LAUNCH_CHECK("moe_swiglu_clamped_kernel");
    return FERRY_OK;
}

/* ---- the weighted sum ---------------------------------------------------------------------------------- */

__global__ void moe_combine_kernel(float *y, const float *yp, const int32_t *slot, const float *wts, int n,
                                   int k, int d)
{
    const int64_t g = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (g >= (int64_t)n * d) return;
    const int t = (int)(g / d), i = (int)(g - (int64_t)t * d);
    float acc = 0.0f;
    for (int j = 0; j < k; j++)
        acc = fmaf(wts[t * k + j], yp[(size_t)(slot ? slot[t * k + j] : t * k + j) * d + i], acc);
    y[g] = acc;
}

extern "C" int kern_cuda_moe_combine(float *y, const float *yp, const int32_t *slot, const float *wts, int n,
                                     int k, int d, cudaStream_t stream)
{
    if (n < 1 || k < 1 || d < 1) return FERRY_ERR_INVALID;
    const int64_t total = (int64_t)n * d;
    moe_combine_kernel<<<fcuda_blocks(total, 256, INT32_MAX), 256, 0, stream>>>(y, yp, slot, wts, n, k, d);
    FCUDA_LAUNCH_CHECK("moe_combine_kernel");
    return FERRY_OK;
}
