/* ops (CUDA) — embedding gather, RMSNorm (plain and fused with the residual add), rotary embedding,
 * SiLU-gated activation and residual add; see ops.h for the contracts.
 *
 * Row-wise ops run one block per row with a fixed-order tree reduction (deterministic); element-wise ops are
 * grid-stride loops with coalesced f32 accesses, which reach the memory bandwidth without vector loads.
 */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

#include "kernels/cuda/check.h"
#include "kernels/cuda/ops.h"

#define ROW_THREADS 256

extern "C" int kern_cuda_device_count(void)
{
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        (void)cudaGetLastError(); /* clear the non-sticky error left by a missing driver */
        return 0;
    }
    return n;
}

/* ----------------------------------------------------------------------------------------------------------
 */
/* embed */

__device__ __forceinline__ float load_elem(const void *row, enum dtype t, int j)
{
    switch (t) {
    case DTYPE_F32:
        return ((const float *)row)[j];
    case DTYPE_F16:
        return __half2float(((const __half *)row)[j]);
    case DTYPE_BF16:
        return __bfloat162float(((const __nv_bfloat16 *)row)[j]);
    default: { /* Q8_0: blocks of 32: f16 scale, 32 int8 */
        const uint8_t *b = (const uint8_t *)row + (size_t)(j / 32) * 34;
        __half d;
        memcpy(&d, b, 2);
        return __half2float(d) * (float)((const int8_t *)b)[2 + j % 32];
    }
    }
}

__global__ void embed_kernel(float *x, const uint8_t *table, enum dtype tt, size_t row_bytes, int n_rows,
                             int d, const int32_t *tokens)
{
    const int i = blockIdx.x;
    const int tok = tokens[i];
    float *xr = x + (size_t)i * d;
    if (tok < 0 || tok >= n_rows) {
        for (int j = threadIdx.x; j < d; j += blockDim.x) xr[j] = 0.0f;
        return;
    }
    const uint8_t *row = table + (size_t)tok * row_bytes;
    for (int j = threadIdx.x; j < d; j += blockDim.x) xr[j] = load_elem(row, tt, j);
}

extern "C" int kern_cuda_embed(float *x, const void *table, enum dtype tt, int n_rows, int d,
                               const int32_t *tokens, int m, cudaStream_t stream)
{
    if (!x || !table || !tokens || m < 0 || d <= 0 || n_rows <= 0) return FERRY_ERR_INVALID;
    if (tt != DTYPE_F32 && tt != DTYPE_F16 && tt != DTYPE_BF16 && tt != DTYPE_Q8_0)
        return FERRY_ERR_UNSUPPORTED;
    size_t row_bytes = dtype_row_size(tt, d);
    if (row_bytes == 0 || !FCUDA_ALIGNED(x, 4) || !FCUDA_ALIGNED(tokens, 4)) return FERRY_ERR_INVALID;
    if (tt != DTYPE_Q8_0 && !FCUDA_ALIGNED(table, tt == DTYPE_F32 ? 4 : 2)) return FERRY_ERR_INVALID;
    if (m == 0) return FERRY_OK;
    embed_kernel<<<m, ROW_THREADS, 0, stream>>>(x, (const uint8_t *)table, tt, row_bytes, n_rows, d, tokens);
    FCUDA_LAUNCH_CHECK("embed_kernel");
    return FERRY_OK;
}

/* ----------------------------------------------------------------------------------------------------------
 */
/* rmsnorm */

/* Sum over the block in a fixed order: warp trees, then warp 0 over the warp sums. Every thread gets it. */
__device__ __forceinline__ float block_sum(float v, float *red)
{
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, nw = blockDim.x / 32;
    if (lane == 0) red[warp] = v;
    __syncthreads();
    if (warp == 0) {
        float s = lane < nw ? red[lane] : 0.0f;
        for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
        if (lane == 0) red[32] = s;
    }
    __syncthreads();
    return red[32];
}

__global__ void rmsnorm_kernel(float *y, const float *x, const float *w, int d, float eps)
{
    __shared__ float red[33];
    const size_t off = (size_t)blockIdx.x * d;
    float ss = 0.0f;
    for (int j = threadIdx.x; j < d; j += blockDim.x) ss += x[off + j] * x[off + j];
    const float inv = rsqrtf(block_sum(ss, red) / (float)d + eps);
    for (int j = threadIdx.x; j < d; j += blockDim.x) y[off + j] = x[off + j] * inv * w[j];
}

__global__ void add_rmsnorm_kernel(float *resid, const float *delta, float *y, const float *w, int d,
                                   float eps)
{
    __shared__ float red[33];
    const size_t off = (size_t)blockIdx.x * d;
    float ss = 0.0f;
    for (int j = threadIdx.x; j < d; j += blockDim.x) {
        float r = resid[off + j] + delta[off + j];
        resid[off + j] = r;
        ss += r * r;
    }
    const float inv = rsqrtf(block_sum(ss, red) / (float)d + eps);
    /* Each thread re-reads only the elements it wrote itself, so no barrier is needed for them. */
    for (int j = threadIdx.x; j < d; j += blockDim.x) y[off + j] = resid[off + j] * inv * w[j];
}

extern "C" int kern_cuda_rmsnorm(float *y, const float *x, const float *w, int m, int d, float eps,
                                 cudaStream_t stream)
{
    if (!y || !x || !w || m < 0 || d <= 0 || !(eps >= 0.0f)) return FERRY_ERR_INVALID;
    if (!FCUDA_ALIGNED(y, 4) || !FCUDA_ALIGNED(x, 4) || !FCUDA_ALIGNED(w, 4)) return FERRY_ERR_INVALID;
    if (m == 0) return FERRY_OK;
    rmsnorm_kernel<<<m, ROW_THREADS, 0, stream>>>(y, x, w, d, eps);
    FCUDA_LAUNCH_CHECK("rmsnorm_kernel");
    return FERRY_OK;
}

extern "C" int kern_cuda_add_rmsnorm(float *resid, const float *delta, float *y, const float *w, int m, int d,
                                     float eps, cudaStream_t stream)
{
    if (!resid || !delta || !y || !w || m < 0 || d <= 0 || !(eps >= 0.0f)) return FERRY_ERR_INVALID;
    if (y == resid || y == delta) return FERRY_ERR_INVALID;
    if (!FCUDA_ALIGNED(resid, 4) || !FCUDA_ALIGNED(delta, 4) || !FCUDA_ALIGNED(y, 4) || !FCUDA_ALIGNED(w, 4))
        return FERRY_ERR_INVALID;
    if (m == 0) return FERRY_OK;
    add_rmsnorm_kernel<<<m, ROW_THREADS, 0, stream>>>(resid, delta, y, w, d, eps);
    FCUDA_LAUNCH_CHECK("add_rmsnorm_kernel");
    return FERRY_OK;
}

/* ----------------------------------------------------------------------------------------------------------
 */
/* rope */

__global__ void rope_kernel(float *x, const int32_t *pos, int m, int n_heads, int head_dim, int rope_dim,
                            const float *inv_freq, int half_style)
{
    const int half = rope_dim / 2;
    const int64_t total = (int64_t)m * n_heads * half;
    for (int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; t < total;
         t += (int64_t)gridDim.x * blockDim.x) {
        const int i = (int)(t % half);
        const int64_t th = t / half; /* token * n_heads + head */
        const int tok = (int)(th / n_heads);
        float *xh = x + th * head_dim;
        const float angle = __fmul_rn((float)pos[tok], inv_freq[i]);
        double s, c;
        sincos((double)angle, &s, &c);
        const float cf = (float)c, sf = (float)s;
        const int i0 = half_style ? i : 2 * i;
        const int i1 = half_style ? i + half : 2 * i + 1;
        const float x0 = xh[i0], x1 = xh[i1];
        xh[i0] = x0 * cf - x1 * sf;
        xh[i1] = x0 * sf + x1 * cf;
    }
}

extern "C" int kern_cuda_rope(float *x, const int32_t *pos, int m, int n_heads, int head_dim, int rope_dim,
                              const float *inv_freq, enum rope_style style, cudaStream_t stream)
{
    if (!x || !pos || !inv_freq || m < 0 || n_heads <= 0 || head_dim <= 0) return FERRY_ERR_INVALID;
    if (rope_dim <= 0 || rope_dim > head_dim || rope_dim % 2) return FERRY_ERR_INVALID;
    if (style != ROPE_STYLE_INTERLEAVED && style != ROPE_STYLE_HALF) return FERRY_ERR_INVALID;
    if (!FCUDA_ALIGNED(x, 4) || !FCUDA_ALIGNED(pos, 4) || !FCUDA_ALIGNED(inv_freq, 4))
        return FERRY_ERR_INVALID;
    if (m == 0) return FERRY_OK;
    const int64_t total = (int64_t)m * n_heads * (rope_dim / 2);
    rope_kernel<<<fcuda_blocks(total, 256), 256, 0, stream>>>(x, pos, m, n_heads, head_dim, rope_dim,
                                                              inv_freq, style == ROPE_STYLE_HALF);
    FCUDA_LAUNCH_CHECK("rope_kernel");
    return FERRY_OK;
}

/* ----------------------------------------------------------------------------------------------------------
 */
/* element-wise */

__global__ void silu_mul_kernel(float *gate, const float *up, int64_t n)
{
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        const float a = gate[i];
        gate[i] = a / (1.0f + expf(-a)) * up[i];
    }
}

__global__ void add_kernel(float *y, const float *x, int64_t n)
{
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        y[i] += x[i];
}

extern "C" int kern_cuda_silu_mul(float *gate, const float *up, int64_t n, cudaStream_t stream)
{
    if (!gate || !up || n < 0 || !FCUDA_ALIGNED(gate, 4) || !FCUDA_ALIGNED(up, 4)) return FERRY_ERR_INVALID;
    if (n == 0) return FERRY_OK;
    silu_mul_kernel<<<fcuda_blocks(n, 256), 256, 0, stream>>>(gate, up, n);
    FCUDA_LAUNCH_CHECK("silu_mul_kernel");
    return FERRY_OK;
}

extern "C" int kern_cuda_add(float *y, const float *x, int64_t n, cudaStream_t stream)
{
    if (!y || !x || n < 0 || !FCUDA_ALIGNED(y, 4) || !FCUDA_ALIGNED(x, 4)) return FERRY_ERR_INVALID;
    if (n == 0) return FERRY_OK;
    add_kernel<<<fcuda_blocks(n, 256), 256, 0, stream>>>(y, x, n);
    FCUDA_LAUNCH_CHECK("add_kernel");
    return FERRY_OK;
}
