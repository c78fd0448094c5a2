/* x8 — the int8 form of x that the block-type products read (kernels/cuda/matmul_q.h): per block of 32
 * elements dx = max|x| / 127, xq = rint(x / dx), the f32 sum of the block and the sums of xq over elements
 * 0..15 and 16..31. One group of 8 consecutive lanes per block, lane `sub` (lane % 8) holding elements 4 sub
 * .. 4 sub + 3, sums in a fixed shuffle order. Shared by the products' pre-pass (gemv_q.cu) and the norm that
 * writes this form beside its output (ops.cu), so the two are bitwise the same. Every lane of the warp must
 * call it (shuffles over the full warp). */
#ifndef FERRY_KERN_CUDA_X8_CUH
#define FERRY_KERN_CUDA_X8_CUH

#include <stdint.h>

struct x8_part {
    uint32_t word; /* the lane's 4 int8 values, element 4 sub + i in byte i */
    float dx, s;   /* the block's scale and f32 sum (every lane of the group) */
    int sq, sq_hi; /* lanes 0-3 of the group: Σxq over elements 0..15, sq_hi over 16..31 */
};

__device__ __forceinline__ x8_part x8_quant4(float4 v)
{
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
    x8_part r;
    r.sq_hi = __shfl_xor_sync(0xffffffffu, sq, 4);
    r.word = (uint32_t)(q0 & 255) | (uint32_t)(q1 & 255) << 8 | (uint32_t)(q2 & 255) << 16 |
             (uint32_t)(q3 & 255) << 24;
    r.dx = dx, r.s = s, r.sq = sq;
    return r;
}

/* The natural layout (what the dp4a GEMV reads): the lane's word at element offset row * k + 32 u + 4 sub of
 * xq, and lane 0 of the group {dx, Σx, Σxq lo, Σxq hi} at float4 index row * (k / 32) + u of xd. */
__device__ __forceinline__ void x8_store(uint8_t *xq, float *xd, const x8_part &p, int row, int u, int sub,
                                         int k)
{
    reinterpret_cast<uint32_t *>(xq)[((size_t)row * (k / 32) + u) * 8 + sub] = p.word;
    if (sub == 0)
        reinterpret_cast<float4 *>(xd)[(size_t)row * (k / 32) + u] =
            make_float4(p.dx, p.s, __int_as_float(p.sq), __int_as_float(p.sq_hi));
}

#endif
