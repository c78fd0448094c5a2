/* moe (CUDA) — routing, the grouped expert GEMV and the weighted sum; see moe.h for the contract.
 *
 * The GEMV: a block of MOE_WARPS warps takes MOE_WARPS rows of one output row o (blockIdx.y); each warp one
 * row r of the J pairs' experts. Float types: per pair, lane i takes elements i, i + 32, ... of the row, the
 * lanes' sums are added by a butterfly, scaled by the pair's weight, and the J sums added in j order. Block
 * types: the J rows' work items (moe_dot.cuh: a piece of a block, decoded with qblock.cuh's unit decoders
 * into the exact f32 values dequant_row gives and multiplied with x in f32) form one list that lane i walks
 * from i in steps of 32, each item's sum scaled by its pair's weight, then one butterfly. Either way the
 * order of every sum is fixed: deterministic.
 */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

#include "kernels/cuda/check.h"
#include "kernels/cuda/moe.h"
#include "kernels/cuda/moe_dot.cuh"

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
template <class E> struct moe_float {
    static constexpr bool BLOCK = false;
    static __device__ __forceinline__ float dot(const uint8_t *row, const float *x, int cols, int lane)
    {
        const E *w = reinterpret_cast<const E *>(row);
        float a = 0.0f;
        for (int i = lane; i < cols; i += 32) a = fmaf(moe_val(w[i]), __ldg(x + i), a);
        return a;
    }
};
/* Block type Q: work items as moe_dot.cuh lays them. */
template <class Q> struct moe_q {
    static constexpr bool BLOCK = true;
    static __device__ __forceinline__ int items(int cols) { return moe_q_items<Q>(cols); }
    static __device__ __forceinline__ float item(const uint8_t *row, const float *x, int it)
    {
        return moe_q_item<Q>(row, x, it, 0.0f);
    }
};

template <class D>
__global__ void __launch_bounds__(MOE_WARPS * 32)
    moe_gemv_kernel(float *y, int ldy, const float *x, int ldx, const uint8_t *w, size_t expert_bytes,
                    size_t row_bytes, int n_expert, int rows, int cols, const int32_t *ids, const float *wts,
                    int J, int xdiv)
{
    const int lane = threadIdx.x & 31, r = blockIdx.x * MOE_WARPS + (threadIdx.x >> 5), o = blockIdx.y;
    if (r >= rows) return;
    float acc = 0.0f;
    if constexpr (D::BLOCK) {
        /* The J rows' items as one list, so that a short row (the down product's: ffn / 32 units) still
         * keeps every lane busy; each item's sum is weighted by its pair's weight. */
        const int items = D::items(cols), total = J * items;
        for (int g = lane; g < total; g += 32) {
            const int j = g / items, pair = o * J + j, e = ids[pair];
            if (e < 0 || e >= n_expert) continue;
            const float t = D::item(w + (size_t)e * expert_bytes + (size_t)r * row_bytes,
                                    x + (size_t)(pair / xdiv) * ldx, g - j * items);
            acc = wts ? fmaf(wts[pair], t, acc) : acc + t;
        }
#pragma unroll
        for (int s = 16; s > 0; s >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, s);
    } else {
        for (int j = 0; j < J; j++) {
            const int pair = o * J + j, e = ids[pair];
            if (e < 0 || e >= n_expert) continue;
            float d = D::dot(w + (size_t)e * expert_bytes + (size_t)r * row_bytes,
                             x + (size_t)(pair / xdiv) * ldx, cols, lane);
#pragma unroll
            for (int s = 16; s > 0; s >>= 1) d += __shfl_xor_sync(0xffffffffu, d, s);
            acc = wts ? fmaf(wts[pair], d, acc) : acc + d;
        }
    }
    if (lane == 0) y[(size_t)o * ldy + r] = acc;
}

template <class D>
static int moe_gemv_launch(float *y, int ldy, const float *x, int ldx, const void *w, size_t row_bytes,
                           int n_expert, int rows, int cols, const int32_t *ids, const float *wts, int n_out,
                           int J, int xdiv, cudaStream_t stream)
{
    const dim3 grid((unsigned)((rows + MOE_WARPS - 1) / MOE_WARPS), (unsigned)n_out);
    moe_gemv_kernel<D><<<grid, MOE_WARPS * 32, 0, stream>>>(y, ldy, x, ldx, (const uint8_t *)w,
                                                            row_bytes * (size_t)rows, row_bytes, n_expert,
                                                            rows, cols, ids, wts, J, xdiv);
    FCUDA_LAUNCH_CHECK("moe_gemv_kernel");
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

extern "C" int kern_cuda_moe_gemv(float *y, int ldy, const float *x, int ldx, const void *w, enum dtype t,
                                  int n_expert, int rows, int cols, const int32_t *ids, const float *wts,
                                  int n_out, int J, int xdiv, cudaStream_t stream)
{
    if (!kern_cuda_moe_supports(t)) return FERRY_ERR_UNSUPPORTED;
    if (rows < 1 || cols < 1 || rows > ldy || ldx < cols || n_out < 1 || n_out > 65535 || J < 1 || xdiv < 1 ||
        n_expert < 1 || cols % dtype_block_size(t) || !FCUDA_ALIGNED(y, 4) || !FCUDA_ALIGNED(x, 4))
        return FERRY_ERR_INVALID;
    const size_t rb = dtype_row_size(t, cols);
    switch (t) {
    case DTYPE_F32:
        return moe_gemv_launch<moe_float<float>>(y, ldy, x, ldx, w, rb, n_expert, rows, cols, ids, wts, n_out,
                                                 J, xdiv, stream);
    case DTYPE_F16:
        return moe_gemv_launch<moe_float<__half>>(y, ldy, x, ldx, w, rb, n_expert, rows, cols, ids, wts,
                                                  n_out, J, xdiv, stream);
    case DTYPE_BF16:
        return moe_gemv_launch<moe_float<__nv_bfloat16>>(y, ldy, x, ldx, w, rb, n_expert, rows, cols, ids,
                                                         wts, n_out, J, xdiv, stream);
#define MOE_LAUNCH(T, name, Q)                                                                               \
    case DTYPE_##T:                                                                                          \
        if (!FCUDA_ALIGNED(w, Q::ALIGN) || rb % Q::ALIGN) return FERRY_ERR_INVALID;                          \
        return moe_gemv_launch<moe_q<Q>>(y, ldy, x, ldx, w, rb, n_expert, rows, cols, ids, wts, n_out, J,    \
                                         xdiv, stream);
        QB_TYPES(MOE_LAUNCH)
#undef MOE_LAUNCH
    default:
        return FERRY_ERR_UNSUPPORTED;
    }
}

/* ---- the weighted sum ---------------------------------------------------------------------------------- */

__global__ void moe_combine_kernel(float *y, const float *yp, const int32_t *slot, const float *wts, int n,
                                   int k, int d)
{
    const int64_t g = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (g >= (int64_t)n * d) return;
    const int t = (int)(g / d), i = (int)(g - (int64_t)t * d);
    float acc = 0.0f;
    for (int j = 0; j < k; j++) acc = fmaf(wts[t * k + j], yp[(size_t)slot[t * k + j] * d + i], acc);
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
