/* qk_norm (CUDA) — per-head RMSNorm of the queries and keys in a q|k|v row (Qwen3, Gemma 3), and of any run of
 * heads with or without a weight (Gemma 4's value norm); see ops.h.
 *
 * One warp per (row, head): each lane sums the squares of its strided elements, a butterfly shuffle
 * reduction (fixed order, so deterministic) gives the head's mean square, then every lane scales its
 * elements in place. Heads are at most a few hundred floats, so a warp covers one in a few loads; a family
 * without QK-norm never launches it.
 */
#include <stdint.h>

#include "kernels/cuda/check.h"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/pdl.h"

#define QKN_WARPS 4 /* heads per block */

__global__ void qk_norm_kernel(float *qkv, int ld, const float *qw, const float *kw, int m, int n_heads,
                               int n_heads_all, int head_dim, float eps)
{
    pdl_wait();
    pdl_trigger();
    const int lane = threadIdx.x & 31;
    const int64_t item = (int64_t)blockIdx.x * QKN_WARPS + (threadIdx.x >> 5);
    if (item >= (int64_t)m * n_heads_all) return;
    const int64_t r = item / n_heads_all;
    const int h = (int)(item - r * n_heads_all);
    float *x = qkv + r * ld + (int64_t)h * head_dim;
    const float *w = h < n_heads ? qw : kw;
    float ss = 0.0f;
    for (int j = lane; j < head_dim; j += 32) ss += x[j] * x[j];
    for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    const float s = rsqrtf(ss / (float)head_dim + eps);
    if (w)
        for (int j = lane; j < head_dim; j += 32) x[j] = w[j] * (x[j] * s);
    else /* no weight (kern_cuda_head_rmsnorm) */
        for (int j = lane; j < head_dim; j += 32) x[j] = x[j] * s;
}

extern "C" int kern_cuda_qk_norm(float *qkv, int ld, const float *qw, const float *kw, int m, int n_heads,
                                 int n_kv_heads, int head_dim, float eps, cudaStream_t stream)
{
    if (!qkv || !qw || !kw || m < 0 || n_heads <= 0 || n_kv_heads <= 0 || head_dim <= 0 || head_dim > 1024 ||
        !(eps >= 0.0f) || (int64_t)ld < (int64_t)(n_heads + n_kv_heads) * head_dim)
        return FERRY_ERR_INVALID;
    if (!FCUDA_ALIGNED(qkv, 4) || !FCUDA_ALIGNED(qw, 4) || !FCUDA_ALIGNED(kw, 4)) return FERRY_ERR_INVALID;
    if (m == 0) return FERRY_OK;
    const int64_t items = (int64_t)m * (n_heads + n_kv_heads);
    const int64_t blocks = (items + QKN_WARPS - 1) / QKN_WARPS;
    if (blocks > INT32_MAX) return FERRY_ERR_INVALID;
    FCUDA_CHECK(pdl_launch(qk_norm_kernel, dim3((unsigned)blocks), dim3(32 * QKN_WARPS), 0, stream, qkv, ld,
                           qw, kw, m, n_heads, n_heads + n_kv_heads, head_dim, eps));
    return FERRY_OK;
}

extern "C" int kern_cuda_head_rmsnorm(float *x, int ld, const float *w, int m, int n_heads, int head_dim,
                                      float eps, cudaStream_t stream)
{
    if (!x || m < 0 || n_heads <= 0 || head_dim <= 0 || head_dim > 1024 || !(eps >= 0.0f) ||
        (int64_t)ld < (int64_t)n_heads * head_dim || !FCUDA_ALIGNED(x, 4) || (w && !FCUDA_ALIGNED(w, 4)))
        return FERRY_ERR_INVALID;
    if (m == 0) return FERRY_OK;
    const int64_t blocks = ((int64_t)m * n_heads + QKN_WARPS - 1) / QKN_WARPS;
    if (blocks > INT32_MAX) return FERRY_ERR_INVALID;
    /* Every head a "query" head of weight w. */
    FCUDA_CHECK(pdl_launch(qk_norm_kernel, dim3((unsigned)blocks), dim3(32 * QKN_WARPS), 0, stream, x, ld, w, w,
                           m, n_heads, n_heads, head_dim, eps));
    return FERRY_OK;
}
