/* ops (CUDA) — embedding gather, RMSNorm (plain and fused with the residual add), the SiLU- and GELU-gated
 * activation, and Gemma 4's per-head norm, scaled residual, soft-capping and per-layer-input gate; see ops.h
 * for the contracts. (Rotary embedding is fused with the KV store:
 * kernels/cuda/attention.h.)
 *
 * Row-wise ops run one block per row with a fixed-order tree reduction (deterministic); element-wise ops are
 * grid-stride loops with coalesced f32 accesses, which reach the memory bandwidth without vector loads.
 */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

#include "kernels/cuda/check.h"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/pdl.h"
#include "kernels/cuda/x8.cuh"

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

/* y = rmsnorm(x) * w for one row per block; with ADD, x is first resid + delta, written back to resid.
 * Vector path (d % 4 == 0, 16-byte aligned rows, d <= 4 * ROW_THREADS * VPT): every element is loaded once
 * into registers with 16-byte loads, all loads of a thread in flight together; the row is read once and
 * written once. Otherwise (odd d) a scalar loop. The norm weight is read before waiting for the previous
 * kernel (pdl.h). */
template <bool ADD, int VPT, bool X8 = false>
__global__ void __launch_bounds__(ROW_THREADS)
    norm_vec_kernel(float *resid, const float *delta, float *y, const float *w, int d, float eps,
                    uint8_t *xq, float *xd)
{
    __shared__ float red[33];
    const int d4 = d / 4;
    const size_t off4 = (size_t)blockIdx.x * d4;
    float4 wv[VPT], v[VPT];
#pragma unroll
    for (int i = 0; i < VPT; i++) {
        const int j = threadIdx.x + i * ROW_THREADS;
        if (j < d4) wv[i] = reinterpret_cast<const float4 *>(w)[j];
    }
    pdl_wait();
    pdl_trigger();
    float ss = 0.0f;
#pragma unroll
    for (int i = 0; i < VPT; i++) {
        const int j = threadIdx.x + i * ROW_THREADS;
        if (j >= d4) break;
        v[i] = reinterpret_cast<const float4 *>(resid)[off4 + j];
        if (ADD) {
            const float4 dl = reinterpret_cast<const float4 *>(delta)[off4 + j];
            v[i].x += dl.x, v[i].y += dl.y, v[i].z += dl.z, v[i].w += dl.w;
            reinterpret_cast<float4 *>(resid)[off4 + j] = v[i];
        }
        ss += v[i].x * v[i].x + v[i].y * v[i].y + v[i].z * v[i].z + v[i].w * v[i].w;
    }
    const float inv = rsqrtf(block_sum(ss, red) / (float)d + eps);
#pragma unroll
    for (int i = 0; i < VPT; i++) {
        const int j = threadIdx.x + i * ROW_THREADS;
        if (X8) { /* every lane, for the shuffles; groups of 8 lanes are whole blocks of 32 (d % 32 == 0) */
            const float4 o = j < d4 ? make_float4(v[i].x * inv * wv[i].x, v[i].y * inv * wv[i].y,
                                                  v[i].z * inv * wv[i].z, v[i].w * inv * wv[i].w)
                                    : make_float4(0.f, 0.f, 0.f, 0.f);
            const x8_part p = x8_quant4(o);
            if (j < d4) {
                reinterpret_cast<float4 *>(y)[off4 + j] = o;
                x8_store(xq, xd, p, (int)blockIdx.x, j >> 3, j & 7, d);
            }
            continue;
        }
        if (j >= d4) break;
        reinterpret_cast<float4 *>(y)[off4 + j] = make_float4(v[i].x * inv * wv[i].x, v[i].y * inv * wv[i].y,
                                                              v[i].z * inv * wv[i].z, v[i].w * inv * wv[i].w);
    }
}

template <bool ADD>
__global__ void __launch_bounds__(ROW_THREADS)
    norm_scalar_kernel(float *resid, const float *delta, float *y, const float *w, int d, float eps)
{
    __shared__ float red[33];
    pdl_wait();
    pdl_trigger();
    const size_t off = (size_t)blockIdx.x * d;
    float ss = 0.0f;
    for (int j = threadIdx.x; j < d; j += blockDim.x) {
        float r = resid[off + j];
        if (ADD) resid[off + j] = r = r + delta[off + j];
        ss += r * r;
    }
    const float inv = rsqrtf(block_sum(ss, red) / (float)d + eps);
    /* Each thread re-reads only the elements it wrote itself, so no barrier is needed for them. */
    for (int j = threadIdx.x; j < d; j += blockDim.x) y[off + j] = resid[off + j] * inv * w[j];
}

template <bool ADD>
static int norm_launch(float *resid, const float *delta, float *y, const float *w, int m, int d, float eps,
                       cudaStream_t st)
{
    const bool vec = d % 4 == 0 && FCUDA_ALIGNED(resid, 16) && FCUDA_ALIGNED(y, 16) && FCUDA_ALIGNED(w, 16) &&
                     (!ADD || FCUDA_ALIGNED(delta, 16));
    const int vpt = (d / 4 + ROW_THREADS - 1) / ROW_THREADS;
    const dim3 g(m), b(ROW_THREADS);
    if (vec && vpt <= 1)
        FCUDA_CHECK(pdl_launch(norm_vec_kernel<ADD, 1>, g, b, 0, st, resid, delta, y, w, d, eps, nullptr,
                               nullptr));
    else if (vec && vpt <= 2)
        FCUDA_CHECK(pdl_launch(norm_vec_kernel<ADD, 2>, g, b, 0, st, resid, delta, y, w, d, eps, nullptr,
                               nullptr));
    else if (vec && vpt <= 4)
        FCUDA_CHECK(pdl_launch(norm_vec_kernel<ADD, 4>, g, b, 0, st, resid, delta, y, w, d, eps, nullptr,
                               nullptr));
    else if (vec && vpt <= 8)
        FCUDA_CHECK(pdl_launch(norm_vec_kernel<ADD, 8>, g, b, 0, st, resid, delta, y, w, d, eps, nullptr,
                               nullptr));
    else
        FCUDA_CHECK(pdl_launch(norm_scalar_kernel<ADD>, g, b, 0, st, resid, delta, y, w, d, eps));
    return FERRY_OK;
}

extern "C" int kern_cuda_rmsnorm(float *y, const float *x, const float *w, int m, int d, float eps,
                                 cudaStream_t stream)
{
    if (!y || !x || !w || m < 0 || d <= 0 || !(eps >= 0.0f)) return FERRY_ERR_INVALID;
    if (!FCUDA_ALIGNED(y, 4) || !FCUDA_ALIGNED(x, 4) || !FCUDA_ALIGNED(w, 4)) return FERRY_ERR_INVALID;
    if (m == 0) return FERRY_OK;
    /* The plain norm is the fused one without the add: x is read through `resid` and never written. */
    return norm_launch<false>(const_cast<float *>(x), nullptr, y, w, m, d, eps, stream);
}

extern "C" int kern_cuda_add_rmsnorm(float *resid, const float *delta, float *y, const float *w, int m, int d,
                                     float eps, cudaStream_t stream)
{
    if (!resid || !delta || !y || !w || m < 0 || d <= 0 || !(eps >= 0.0f)) return FERRY_ERR_INVALID;
    if (y == resid || y == delta) return FERRY_ERR_INVALID;
    if (!FCUDA_ALIGNED(resid, 4) || !FCUDA_ALIGNED(delta, 4) || !FCUDA_ALIGNED(y, 4) || !FCUDA_ALIGNED(w, 4))
        return FERRY_ERR_INVALID;
    if (m == 0) return FERRY_OK;
    return norm_launch<true>(resid, delta, y, w, m, d, eps, stream);
}

extern "C" int kern_cuda_norm_x8(float *resid, const float *delta, float *y, const float *w, int m, int d,
                                 float eps, uint8_t *xq, float *xd, cudaStream_t stream)
{
    if (!resid || !y || !w || !xq || !xd || m < 0 || d <= 0 || !(eps >= 0.0f)) return FERRY_ERR_INVALID;
    if (delta && (y == resid || y == delta)) return FERRY_ERR_INVALID;
    const int vpt = (d / 4 + ROW_THREADS - 1) / ROW_THREADS;
    if (d % 32 || vpt > 8 || !FCUDA_ALIGNED(resid, 16) || !FCUDA_ALIGNED(y, 16) || !FCUDA_ALIGNED(w, 16) ||
        (delta && !FCUDA_ALIGNED(delta, 16)) || !FCUDA_ALIGNED(xq, 16) || !FCUDA_ALIGNED(xd, 16))
        return FERRY_ERR_UNSUPPORTED;
    if (m == 0) return FERRY_OK;
    const dim3 g(m), b(ROW_THREADS);
#define NORM_X8(ADD, V)                                                                                      \
    FCUDA_CHECK(pdl_launch(norm_vec_kernel<ADD, V, true>, g, b, 0, stream, resid, delta, y, w, d, eps, xq, xd))
    if (delta) {
        if (vpt <= 1) NORM_X8(true, 1); else if (vpt <= 2) NORM_X8(true, 2);
        else if (vpt <= 4) NORM_X8(true, 4); else NORM_X8(true, 8);
    } else {
        if (vpt <= 1) NORM_X8(false, 1); else if (vpt <= 2) NORM_X8(false, 2);
        else if (vpt <= 4) NORM_X8(false, 4); else NORM_X8(false, 8);
    }
#undef NORM_X8
    return FERRY_OK;
}

/* ----------------------------------------------------------------------------------------------------------
 */
/* Gated activations: SiLU (SwiGLU) and GELU-tanh (GeGLU) */

/* h (m, n) = act(gate) * up, row i's gate at gate + i * ld and its up at up + i * ld (the fused gate|up rows:
 * ld = 2n, up = gate + n; the per-layer input's: a plain gate row and a slice of a wider row). */
/* One gated activation: act(a) * u (SiLU, or GELU with the tanh approximation). */
template <bool GELU> __device__ __forceinline__ float glu_one(float a, float u)
{
    if (GELU) return 0.5f * a * (1.0f + tanhf(0.7978845608028654f * (a + 0.044715f * a * a * a))) * u;
    return a / (1.0f + expf(-a)) * u;
}

template <bool GELU>
__global__ void glu_kernel(float *h, const float *gate, int ldg, const float *up, int ldu, int m, int n)
{
    pdl_wait();
    pdl_trigger();
    const int64_t total = (int64_t)m * n;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t row = i / n, col = i - row * n;
        h[i] = glu_one<GELU>(gate[row * ldg + col], up[row * ldu + col]);
    }
}

template <bool GELU>
static int glu_launch(float *h, const float *gate, int ldg, const float *up, int ldu, int m, int n,
                      cudaStream_t stream)
{
    if (!h || !gate || !up || m < 0 || n <= 0 || ldg < n || ldu < n || !FCUDA_ALIGNED(h, 4) ||
        !FCUDA_ALIGNED(gate, 4) || !FCUDA_ALIGNED(up, 4))
        return FERRY_ERR_INVALID;
    if (m == 0) return FERRY_OK;
    FCUDA_CHECK(pdl_launch(glu_kernel<GELU>, dim3(fcuda_blocks((int64_t)m * n, 256)), dim3(256), 0, stream, h,
                           gate, ldg, up, ldu, m, n));
    return FERRY_OK;
}

/* The gated activation of glu_kernel (the same glu_one, so h is bitwise the same) that also writes h's
 * int8 form (x8.cuh) for the down product: a group of 8 lanes per block of 32 elements of a row, 4 per lane,
 * a warp 4 blocks. A group past the last block takes zeros and stores nothing (its shuffles stay in-group).
 */
template <bool GELU>
__global__ void __launch_bounds__(256)
    glu_x8_kernel(float *h, const float *gu, int m, int ffn, uint8_t *xq, float *xd)
{
    pdl_wait();
    pdl_trigger();
    const int lane = threadIdx.x & 31, sub = lane & 7, nb = ffn / 32;
    const int64_t unit = ((int64_t)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32) * 4 + lane / 8;
    const bool live = unit < (int64_t)m * nb;
    const int row = live ? (int)(unit / nb) : 0, u = live ? (int)(unit - (int64_t)row * nb) : 0;
    const int col = u * 32 + 4 * sub;
    float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (live) {
        const float4 a = *reinterpret_cast<const float4 *>(gu + (size_t)row * 2 * ffn + col);
        const float4 b = *reinterpret_cast<const float4 *>(gu + (size_t)row * 2 * ffn + ffn + col);
        v = make_float4(glu_one<GELU>(a.x, b.x), glu_one<GELU>(a.y, b.y), glu_one<GELU>(a.z, b.z),
                        glu_one<GELU>(a.w, b.w));
        *reinterpret_cast<float4 *>(h + (size_t)row * ffn + col) = v;
    }
    const x8_part p = x8_quant4(v);
    if (live) x8_store(xq, xd, p, row, u, sub, ffn);
}

extern "C" int kern_cuda_glu_x8(float *h, const float *gu, int m, int ffn, int gelu, uint8_t *xq, float *xd,
                                cudaStream_t stream)
{
    if (!h || !gu || !xq || !xd || m < 0 || ffn <= 0) return FERRY_ERR_INVALID;
    if (ffn % 32 || !FCUDA_ALIGNED(h, 16) || !FCUDA_ALIGNED(gu, 16) || !FCUDA_ALIGNED(xq, 16) ||
        !FCUDA_ALIGNED(xd, 16))
        return FERRY_ERR_UNSUPPORTED;
    if (m == 0) return FERRY_OK;
    const int64_t warps = ((int64_t)m * (ffn / 32) + 3) / 4;
    const dim3 g((unsigned)((warps + 7) / 8)), b(256);
    if (gelu)
        FCUDA_CHECK(pdl_launch(glu_x8_kernel<true>, g, b, 0, stream, h, gu, m, ffn, xq, xd));
    else
        FCUDA_CHECK(pdl_launch(glu_x8_kernel<false>, g, b, 0, stream, h, gu, m, ffn, xq, xd));
    return FERRY_OK;
}

extern "C" int kern_cuda_silu_mul(float *h, const float *gu, int m, int ffn, cudaStream_t stream)
{
    return glu_launch<false>(h, gu, 2 * ffn, gu ? gu + ffn : NULL, 2 * ffn, m, ffn, stream);
}

extern "C" int kern_cuda_gelu_mul(float *h, const float *gu, int m, int ffn, cudaStream_t stream)
{
    return glu_launch<true>(h, gu, 2 * ffn, gu ? gu + ffn : NULL, 2 * ffn, m, ffn, stream);
}

/* ----------------------------------------------------------------------------------------------------------
 */
/* Gemma 4: scaled residual, soft-capping */

__global__ void add_scale_kernel(float *x, const float *delta, const float *s, int64_t n)
{
    pdl_wait();
    pdl_trigger();
    const float k = s ? *s : 1.0f;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        x[i] = (delta ? x[i] + delta[i] : x[i]) * k;
}

extern "C" int kern_cuda_add_scale(float *x, const float *delta, const float *s, int64_t n, cudaStream_t stream)
{
    if (!x || n < 0 || !FCUDA_ALIGNED(x, 4) || (delta && !FCUDA_ALIGNED(delta, 4)) ||
        (s && !FCUDA_ALIGNED(s, 4)))
        return FERRY_ERR_INVALID;
    if (n == 0) return FERRY_OK;
    FCUDA_CHECK(pdl_launch(add_scale_kernel, dim3(fcuda_blocks(n, 256)), dim3(256), 0, stream, x, delta, s, n));
    return FERRY_OK;
}

__global__ void axpby_kernel(float *y, float a, const float *x, float b, int64_t n)
{
    pdl_wait();
    pdl_trigger();
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        y[i] = (x ? __fadd_rn(__fmul_rn(a, y[i]), x[i]) : __fmul_rn(a, y[i])) * b;
}

extern "C" int kern_cuda_axpby(float *y, float a, const float *x, float b, int64_t n, cudaStream_t stream)
{
    if (!y || n < 0 || !FCUDA_ALIGNED(y, 4) || (x && !FCUDA_ALIGNED(x, 4))) return FERRY_ERR_INVALID;
    if (n == 0) return FERRY_OK;
    FCUDA_CHECK(pdl_launch(axpby_kernel, dim3(fcuda_blocks(n, 256)), dim3(256), 0, stream, y, a, x, b, n));
    return FERRY_OK;
}

__global__ void softcap_kernel(float *x, float c, int64_t n)
{
    pdl_wait();
    pdl_trigger();
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        x[i] = c * tanhf(x[i] / c);
}

extern "C" int kern_cuda_softcap(float *x, float c, int64_t n, cudaStream_t stream)
{
    if (!x || n < 0 || !(c > 0.0f) || !FCUDA_ALIGNED(x, 4)) return FERRY_ERR_INVALID;
    if (n == 0) return FERRY_OK;
    FCUDA_CHECK(pdl_launch(softcap_kernel, dim3(fcuda_blocks(n, 256)), dim3(256), 0, stream, x, c, n));
    return FERRY_OK;
}

extern "C" int kern_cuda_gelu_mul_rows(float *h, const float *a, const float *b, int ldb, int m, int n,
                                       cudaStream_t stream)
{
    return glu_launch<true>(h, a, n, b, ldb, m, n, stream);
}

/* ----------------------------------------------------------------------------------------------------------
 */
/* Qwen3.5: the attention's output gate, the shared expert's gated sum */

__global__ void q_gate_split_kernel(float *qkv, float *gate, const float *src, int n_heads, int head_dim,
                                    int kv_dim)
{
    pdl_wait();
    pdl_trigger();
    const int i = blockIdx.y, qd = n_heads * head_dim, in_row = 2 * qd + 2 * kv_dim,
              out_row = qd + 2 * kv_dim;
    const float *s = src + (size_t)i * in_row;
    float *o = qkv + (size_t)i * out_row, *g = gate + (size_t)i * qd;
    for (int j = blockIdx.x * blockDim.x + threadIdx.x; j < in_row; j += gridDim.x * blockDim.x) {
        const float v = s[j];
        if (j >= 2 * qd) {
            o[j - qd] = v; /* keys and values follow the queries */
        } else {
            const int h = j / (2 * head_dim), c = j % (2 * head_dim);
            if (c < head_dim)
                o[h * head_dim + c] = v;
            else
                g[h * head_dim + c - head_dim] = v;
        }
    }
}

extern "C" int kern_cuda_q_gate_split(float *qkv, float *gate, const float *src, int m, int n_heads,
                                      int head_dim, int kv_dim, cudaStream_t stream)
{
    if (!qkv || !gate || !src || m < 0 || n_heads <= 0 || head_dim <= 0 || kv_dim < 0 ||
        !FCUDA_ALIGNED(qkv, 4) || !FCUDA_ALIGNED(gate, 4) || !FCUDA_ALIGNED(src, 4))
        return FERRY_ERR_INVALID;
    const int qd = n_heads * head_dim, in_row = 2 * qd + 2 * kv_dim;
    for (int i0 = 0; i0 < m; i0 += 65535) { /* (grid.y's limit) */
        const int rows = m - i0 < 65535 ? m - i0 : 65535;
        const dim3 grid((unsigned)((in_row + 255) / 256 < 64 ? (in_row + 255) / 256 : 64), (unsigned)rows);
        FCUDA_CHECK(pdl_launch(q_gate_split_kernel, grid, dim3(256), 0, stream,
                               qkv + (size_t)i0 * (qd + 2 * kv_dim), gate + (size_t)i0 * qd,
                               src + (size_t)i0 * in_row, n_heads, head_dim, kv_dim));
    }
    return FERRY_OK;
}

__global__ void sigmoid_mul_kernel(float *y, const float *x, const float *gate, int64_t n)
{
    pdl_wait();
    pdl_trigger();
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        y[i] = x[i] / (1.0f + expf(-gate[i]));
}

extern "C" int kern_cuda_sigmoid_mul(float *y, const float *x, const float *gate, int64_t n,
                                     cudaStream_t stream)
{
    if (!y || !x || !gate || n < 0 || !FCUDA_ALIGNED(y, 4) || !FCUDA_ALIGNED(x, 4) || !FCUDA_ALIGNED(gate, 4))
        return FERRY_ERR_INVALID;
    if (n == 0) return FERRY_OK;
    FCUDA_CHECK(
        pdl_launch(sigmoid_mul_kernel, dim3(fcuda_blocks(n, 256)), dim3(256), 0, stream, y, x, gate, n));
    return FERRY_OK;
}

/* One block per row: the gate's dot product in a fixed-order tree (f32 partials of ROW_THREADS strided sums),
 * then the scaled add. */
__global__ void gated_add_kernel(float *y, const float *s, const float *x, const float *g, int d)
{
    pdl_wait();
    pdl_trigger();
    __shared__ float part[ROW_THREADS];
    const int i = blockIdx.x;
    const float *xr = x + (size_t)i * d, *sr = s + (size_t)i * d;
    float *yr = y + (size_t)i * d;
    float acc = 0.0f;
    for (int j = threadIdx.x; j < d; j += blockDim.x) acc = fmaf(xr[j], g[j], acc);
    part[threadIdx.x] = acc;
    __syncthreads();
    for (int w = ROW_THREADS / 2; w > 0; w >>= 1) {
        if ((int)threadIdx.x < w) part[threadIdx.x] += part[threadIdx.x + w];
        __syncthreads();
    }
    const float k = 1.0f / (1.0f + expf(-part[0]));
    for (int j = threadIdx.x; j < d; j += blockDim.x) yr[j] = fmaf(k, sr[j], yr[j]);
}

extern "C" int kern_cuda_gated_add(float *y, const float *s, const float *x, const float *g, int m, int d,
                                   cudaStream_t stream)
{
    if (!y || !s || !x || !g || m < 0 || d <= 0 || !FCUDA_ALIGNED(y, 4) || !FCUDA_ALIGNED(s, 4) ||
        !FCUDA_ALIGNED(x, 4) || !FCUDA_ALIGNED(g, 4))
        return FERRY_ERR_INVALID;
    if (m == 0) return FERRY_OK;
    FCUDA_CHECK(pdl_launch(gated_add_kernel, dim3((unsigned)m), dim3(ROW_THREADS), 0, stream, y, s, x, g, d));
    return FERRY_OK;
}

/* ----------------------------------------------------------------------------------------------------------
 */
/* Column blocks: Qwen3-Next's packed in-products apart, grouped heads repeated */

__global__ void copy_blocks_kernel(float *y, int ldy, const float *x, int ldx, const int32_t *table)
{
    pdl_wait();
    pdl_trigger();
    const int b = blockIdx.x, i = blockIdx.y;
    const int dst = table[3 * b], src = table[3 * b + 1], w = table[3 * b + 2];
    const float *xr = x + (size_t)i * ldx + src;
    float *yr = y + (size_t)i * ldy + dst;
    for (int c = threadIdx.x; c < w; c += blockDim.x) yr[c] = xr[c];
}

extern "C" int kern_cuda_copy_blocks(float *y, int ldy, const float *x, int ldx, int m, const int32_t *table,
                                     int n_blocks, cudaStream_t stream)
{
    if (!y || !x || !table || m < 0 || n_blocks < 0 || n_blocks > 65535 || ldy < 0 || ldx < 0 ||
        !FCUDA_ALIGNED(y, 4) || !FCUDA_ALIGNED(x, 4) || !FCUDA_ALIGNED(table, 4))
        return FERRY_ERR_INVALID;
    if (n_blocks == 0) return FERRY_OK;
    for (int i0 = 0; i0 < m; i0 += 65535) { /* (grid.y's limit) */
        const int rows = m - i0 < 65535 ? m - i0 : 65535;
        FCUDA_CHECK(pdl_launch(copy_blocks_kernel, dim3((unsigned)n_blocks, (unsigned)rows), dim3(128), 0,
                               stream, y + (size_t)i0 * ldy, ldy, x + (size_t)i0 * ldx, ldx, table));
    }
    return FERRY_OK;
}
