/* dequant — reference conversion of GGUF/ggml storage blocks to f32, and quantizers for the simple types.
 *
 * Block layouts (restated from ggml, little-endian, f16 = IEEE half):
 *   Q8_0: { f16 d; int8 qs[32]; }                       x = d * q
 *   Q4_0: { f16 d; u8 qs[16]; }  x[j] = d*((qs[j]&15)-8), x[j+16] = d*((qs[j]>>4)-8)
 *   Q4_1: { f16 d; f16 m; u8 qs[16]; }  x[j] = d*(qs[j]&15)+m, x[j+16] = d*(qs[j]>>4)+m
 *   Q4_K: { f16 d; f16 dmin; u8 scales[12]; u8 qs[128]; } 8 sub-blocks of 32 with 6-bit scales/mins
 *   Q6_K: { u8 ql[128]; u8 qh[64]; int8 scales[16]; f16 d; } 16 sub-blocks of 16, 6-bit quants
 * F32/F16/BF16 are accepted too, so any weight row can be turned into f32 through one call.
 * The structs are in quant/blocks.h; the full Q4_K/Q6_K bit layouts are restated in dequant.c.
 * Results are bitwise those of ggml's scalar code and of gguf-py (tests/kernels/test_quant.c).
 */
#ifndef FERRY_DEQUANT_H
#define FERRY_DEQUANT_H

#include <stdint.h>

#include "kernels/core/dtype.h"

/* dst (n) f32 from src holding n elements of type t; n must be a multiple of the block size
 * (FERRY_ERR_INVALID otherwise). */
int dequant_row(enum dtype t, const void *src, float *dst, int64_t n);

/* Reference quantizers (round-to-nearest, as ggml's reference quantize_row_*_ref) for Q8_0, Q4_0, Q4_1,
 * byte-identical to ggml and gguf-py; F32/F16/BF16 are accepted too (round to nearest even). K-quants are
 * FERRY_ERR_UNSUPPORTED. dst must hold dtype_row_size(t, n) bytes. Used by tests and by load-time conversion. */
int quant_row(enum dtype t, const float *src, void *dst, int64_t n);

#endif
