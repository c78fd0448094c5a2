/* vexp — exp on 8 floats at a time for the CPU kernels (silu, softmax), about 1 ulp, no libm call.
 *
 * Cody-Waite reduction x = n ln2 + r, |r| <= ln2/2, Cephes' expf minimax polynomial for e^r, scaled by 2^n
 * through the exponent bits. Inputs are clamped to [-87, 88]: no overflow to inf and no subnormal results
 * (e^-87 ~ 1.6e-38 stands for anything smaller). Internal to kernels/cpu; GCC/Clang vector extensions.
 */
#ifndef FERRY_KERN_CPU_VEXP_H
#define FERRY_KERN_CPU_VEXP_H

#include <stdint.h>

typedef float v8f __attribute__((vector_size(32)));
typedef float v8fu __attribute__((vector_size(32), aligned(4))); /* unaligned load/store */
typedef int32_t v8i __attribute__((vector_size(32)));

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wpsabi" /* static, never called across an ABI boundary */
static inline v8f v8_exp(v8f x)
{
    const v8i lo = x<-87.0f, hi = x> 88.0f; /* lane masks (0 or -1) */
    x = (v8f)(((v8i)x & ~(lo | hi)) | ((v8i)((v8f){0} - 87.0f) & lo) | ((v8i)((v8f){0} + 88.0f) & hi));
    const v8f t = x * 1.44269504088896341f + 12582912.0f; /* 1.5 * 2^23: rounds to an integer */
    const v8f n = t - 12582912.0f;
    v8f r = x - n * 0.693359375f;
    r = r - n * -2.12194440e-4f;
    const v8f z = r * r;
    v8f y = 1.9875691500e-4f * r + 1.3981999507e-3f;
    y = y * r + 8.3334519073e-3f;
    y = y * r + 4.1665795894e-2f;
    y = y * r + 1.6666665459e-1f;
    y = y * r + 5.0000001201e-1f;
    y = y * z + r + 1.0f;
    const v8i e = (__builtin_convertvector(n, v8i) + 127) << 23;
    return y * (v8f)e;
}
#pragma GCC diagnostic pop

#endif
