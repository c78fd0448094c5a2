/* rows — quant/'s internal row conversions, one pair per type, collected by the table in dtype.c.
 *
 * Each takes n elements (a multiple of the type's block size, unchecked: dtype_to_f32/dtype_from_f32 check).
 * *_to_f32 are exact (dequant.c); *_from_f32 are ggml's reference quantizers quantize_row_*_ref without an
 * importance matrix (quantize.c: plain and 32-element types; kquant.c: the 256-element K-quants).
 * Not for use outside quant/: everyone else goes through quant/dtype.h.
 */
#ifndef FERRY_QUANT_ROWS_H
#define FERRY_QUANT_ROWS_H

#include <stdint.h>

#define ROW_FNS(t)                                                                                           \
    void row_##t##_to_f32(const void *src, float *dst, int64_t n);                                           \
    void row_##t##_from_f32(const float *src, void *dst, int64_t n);
ROW_FNS(f32)
ROW_FNS(f16)
ROW_FNS(bf16)
ROW_FNS(q8_0)
ROW_FNS(q4_0)
ROW_FNS(q4_1)
ROW_FNS(q5_0)
ROW_FNS(q5_1)
ROW_FNS(q2_k)
ROW_FNS(q3_k)
ROW_FNS(q4_k)
ROW_FNS(q5_k)
ROW_FNS(q6_k)
ROW_FNS(iq4_nl) /* from_f32: quantize_lut.c */
ROW_FNS(iq4_xs)
ROW_FNS(mxfp4)
#undef ROW_FNS
/* Types ferry reads but does not write (no quantizer): dequant.c (NVFP4) and dequant_iq.c. */
#define ROW_TO_F32(t) void row_##t##_to_f32(const void *src, float *dst, int64_t n);
ROW_TO_F32(nvfp4)
ROW_TO_F32(iq2_xxs)
ROW_TO_F32(iq2_xs)
ROW_TO_F32(iq2_s)
ROW_TO_F32(iq3_xxs)
ROW_TO_F32(iq3_s)
ROW_TO_F32(iq1_s)
ROW_TO_F32(iq1_m)
#undef ROW_TO_F32

#endif
