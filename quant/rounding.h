/* rounding — ggml's integer rounding for quant/'s quantizers (internal to quant/).
 *
 * nearest_int() is ggml's trick of adding 1.5 * 2^23 and reading the mantissa: round half to even for
 * |v| < 2^22, and the same wrapped value beyond (which the callers then clamp as ggml does), so even
 * degenerate inputs give ggml's bytes. GROUP_MAX_EPS: below this largest magnitude a group counts as all
 * zero.
 */
#ifndef FERRY_QUANT_ROUNDING_H
#define FERRY_QUANT_ROUNDING_H

#include <stdint.h>
#include <string.h>

#define GROUP_MAX_EPS 1e-15f

static inline int nearest_int(float v)
{
    const float t = v + 12582912.0f; /* 1.5 * 2^23: the integer lands in the low mantissa bits */
    int32_t i;
    memcpy(&i, &t, sizeof i);
    return (i & 0x007fffff) - 0x00400000;
}

static inline int clamp_int(int v, int lo, int hi)
{
    return v < lo ? lo : v > hi ? hi : v;
}

#endif
