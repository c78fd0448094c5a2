/* iq_tables — the value tables of the lookup-table types, for quant/ and the CPU kernels.
 *
 * Grids (quant/iq_grids.h, generated from gguf-py): row r holds 8 (or 4) elements, byte j = element j, as
 * ggml's iq*_grid tables. iq1s_grid's bytes are int8 (-1, 0, 1). iq4nl_values are IQ4_NL's and IQ4_XS's 16
 * non-linear values, fp4_values the E2M1 values doubled (MXFP4, NVFP4). iq_signs7[i] is 7 sign bits i with an
 * eighth that makes the count of set bits even (ggml's ksigns_iq2xs).
 */
#ifndef FERRY_QUANT_IQ_TABLES_H
#define FERRY_QUANT_IQ_TABLES_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif
extern const uint64_t iq2xxs_grid[256];
extern const uint64_t iq2xs_grid[512];
extern const uint64_t iq2s_grid[1024];
extern const uint32_t iq3xxs_grid[256];
extern const uint32_t iq3s_grid[512];
extern const uint64_t iq1s_grid[2048];
extern const int8_t iq4nl_values[16];
extern const int8_t fp4_values[16];
#ifdef __cplusplus
}
#endif

/* The eighth sign bit of 7 (ggml's ksigns_iq2xs[i]: i with bit 7 = parity of i). */
static inline uint8_t iq_signs7(uint32_t i)
{
    i &= 127;
    return (uint8_t)(i | (uint32_t)(__builtin_parity(i) << 7));
}

/* Element j (< 8) of grid row g, as a byte. */
static inline uint8_t iq_grid8(uint64_t g, int j)
{
    return (uint8_t)(g >> (8 * j));
}

#define IQ1S_DELTA 0.125f

#endif
