/* sample_math — the arithmetic of sampling that the CPU sampler (runtime/sampler.c) and the GPU sampler
 * (kernels/cuda/sample.cu) do bit for bit alike, so that both choose the same token from the same logits.
 *
 * Every function is a fixed sequence of IEEE-754 operations, each rounded once to nearest (fmaf where a fused
 * multiply-add is meant, nowhere else): on the device through the _rn intrinsics, which the compiler never
 * fuses; on the host a C file that includes this must be compiled without floating-point contraction (GCC
 * fuses a*b-c into an FMA by default in GNU C modes; runtime/sampler.c turns that off with pragmas).
 * Probabilities are integers: token i's mass is q_i = round(exp(d_i) * 2^44) with d_i = v_i - v_max <= 0, so
 * sums, cumulative sums and thresholds are exact and independent of the order of summation.
 * The random draw is counter-based: draw `step` of a stream `seed` is a hash of the two, so any row of any
 * batch can compute its own without state.
 */
#ifndef FERRY_SAMPLE_MATH_H
#define FERRY_SAMPLE_MATH_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#ifdef __CUDACC__
#define SMATH_FN static __host__ __device__ __forceinline__
#else
#define SMATH_FN static inline
#endif

/* Tokens more than this far (in temperature-scaled logits) below the best one carry less than e^-30 of its
 * probability each; they are not candidates. */
#define SMATH_TAIL 30.0f
/* Fixed-point scale of the integer masses: q = round(p * 2^44), p in (0, 1]; e^-30 * 2^44 = 1.65, so every
 * candidate has q >= 1, and 2^19 tokens sum to less than 2^63. */
#define SMATH_MASS_BITS 44
#define SMATH_MAX_VOCAB (1 << 19)

SMATH_FN float smath_mul(float a, float b)
{
#ifdef __CUDA_ARCH__
    return __fmul_rn(a, b);
#else
    return a * b;
#endif
}
SMATH_FN float smath_add(float a, float b)
{
#ifdef __CUDA_ARCH__
    return __fadd_rn(a, b);
#else
    return a + b;
#endif
}
SMATH_FN float smath_sub(float a, float b)
{
#ifdef __CUDA_ARCH__
    return __fsub_rn(a, b);
#else
    return a - b;
#endif
}
SMATH_FN float smath_div(float a, float b)
{
#ifdef __CUDA_ARCH__
    return __fdiv_rn(a, b);
#else
    return a / b;
#endif
}
SMATH_FN float smath_fma(float a, float b, float c)
{
#ifdef __CUDA_ARCH__
    return __fmaf_rn(a, b, c);
#else
    return fmaf(a, b, c);
#endif
}
SMATH_FN float smath_from_bits(uint32_t w)
{
#ifdef __CUDA_ARCH__
    return __uint_as_float(w);
#else
    float f;
    memcpy(&f, &w, 4);
    return f;
#endif
}
SMATH_FN uint32_t smath_to_bits(float f)
{
#ifdef __CUDA_ARCH__
    return __float_as_uint(f);
#else
    uint32_t w;
    memcpy(&w, &f, 4);
    return w;
#endif
}

/* splitmix64's finaliser: a bijection of 64-bit words that mixes every input bit into every output bit. */
SMATH_FN uint64_t smath_mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Draw `step` of the stream `seed`: uniform in [0, 1) with 53 random bits (the product is exact). */
SMATH_FN double smath_uniform(uint64_t seed, uint64_t step)
{
    const uint64_t z = smath_mix64(seed ^ smath_mix64(step ^ 0xd1b54a32d192ed03ull));
    return (double)(z >> 11) * 0x1.0p-53;
}

/* e^d for -87 < d <= 0 (0 below): d = k ln 2 + f with |f| <= ln2/2, e^f by a degree-7 polynomial (Cephes
 * expf, ~1e-7 relative), times 2^k built from its bits. Monotone up to its rounding; what matters is that it
 * is the same function on both sides. */
SMATH_FN float smath_exp(float d)
{
    if (!(d > -87.0f)) return 0.0f;
    const float k = rintf(smath_mul(d, 1.44269504088896341f));
    float f = smath_fma(k, -0.693145751953125f, d);
    f = smath_fma(k, -1.428606765330187045e-06f, f);
    float p = 1.9875691500e-4f;
    p = smath_fma(p, f, 1.3981999507e-3f);
    p = smath_fma(p, f, 8.3334519073e-3f);
    p = smath_fma(p, f, 4.1665795894e-2f);
    p = smath_fma(p, f, 1.6666665459e-1f);
    p = smath_fma(p, f, 5.0000001201e-1f);
    float r = smath_fma(p, smath_mul(f, f), f);
    r = smath_add(r, 1.0f);
    return smath_mul(r, smath_from_bits((uint32_t)(127 + (int)k) << 23));
}

/* The integer mass of a candidate with d = v - v_max in [-SMATH_TAIL, 0]: round(e^d * 2^44), >= 1. */
SMATH_FN uint64_t smath_mass(float d)
{
    const float x = smath_mul(smath_exp(d), 0x1.0p44f);
#ifdef __CUDA_ARCH__
    return __float2ull_rn(x);
#else
    return (uint64_t)llrintf(x);
#endif
}

/* A 32-bit key whose unsigned order is the order of the floats (-inf lowest; no NaN is ever keyed). -0 and +0
 * compare equal as floats and get the same key (+0's). */
SMATH_FN uint32_t smath_key(float v)
{
    uint32_t b = smath_to_bits(v);
    if (b == 0x80000000u) b = 0;
    return (b & 0x80000000u) ? ~b : b | 0x80000000u;
}
SMATH_FN float smath_key_value(uint32_t key)
{
    return smath_from_bits((key & 0x80000000u) ? key & 0x7fffffffu : ~key);
}

/* Repetition penalty (HF style: divide a positive logit, multiply a negative one), then presence and
 * frequency (OpenAI: subtract presence once and frequency per occurrence), for a token seen `count` times. */
SMATH_FN float smath_penalize(float l, uint32_t count, float rep, float presence, float frequency)
{
    if (rep != 1.0f) l = l > 0.0f ? smath_div(l, rep) : smath_mul(l, rep);
    if (presence != 0.0f || frequency != 0.0f) l = smath_sub(l, smath_fma(frequency, (float)count, presence));
    return l;
}

/* top-p: the prefix of the candidates (best first) is kept up to the first whose cumulative mass reaches
 * this threshold; s = the total mass of the top-k candidates. In [1, s]. */
SMATH_FN uint64_t smath_top_p_threshold(float top_p, uint64_t s)
{
    uint64_t t = (uint64_t)ceil((double)top_p * (double)s);
    if (t > s) t = s;
    if (t < 1) t = 1;
    return t;
}

/* The draw's target in [0, s): the chosen token is the first (by id) whose cumulative mass exceeds it. */
SMATH_FN uint64_t smath_draw_target(double u, uint64_t s)
{
    uint64_t r = (uint64_t)(u * (double)s);
    return r < s ? r : s - 1;
}

#endif
