/* convert (CUDA) — see convert.h. One thread per 32-element Q8_0 block: { f16 d; int8 q[32]; } (34 bytes, so
 * blocks are only 2-byte aligned: loads are 2-byte). */
#include <cuda_fp16.h>
#include <stdint.h>

#include "kernels/cuda/check.h"
#include "kernels/cuda/convert.h"

__global__ void q8_0_to_f16_kernel(__half *dst, const uint8_t *src, int64_t n_blocks)
{
    int64_t b = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (b >= n_blocks) return;
    const uint8_t *blk = src + b * 34;
    const __half d = *reinterpret_cast<const __half *>(blk);
    const float df = __half2float(d);
    const int8_t *q = reinterpret_cast<const int8_t *>(blk + 2);
    __half *out = dst + b * 32;
#pragma unroll
    for (int i = 0; i < 32; i++) out[i] = __float2half_rn(df * (float)q[i]);
}

extern "C" int kern_cuda_q8_0_to_f16(uint16_t *dst, const void *src, int64_t rows, int64_t cols, cudaStream_t stream)
{
    if (!dst || !src || rows <= 0 || cols <= 0 || cols % 32 || !FCUDA_ALIGNED(src, 2) || !FCUDA_ALIGNED(dst, 2))
        return FERRY_ERR_INVALID;
    const int64_t n_blocks = rows * (cols / 32);
    const int threads = 256;
    q8_0_to_f16_kernel<<<(unsigned)((n_blocks + threads - 1) / threads), threads, 0, stream>>>(
        reinterpret_cast<__half *>(dst), static_cast<const uint8_t *>(src), n_blocks);
    FCUDA_LAUNCH_CHECK("q8_0_to_f16_kernel");
    return FERRY_OK;
}
