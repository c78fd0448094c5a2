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
ROW_FNS(iq3_s) /* from_f32: iq_quant.c */
#undef ROW_FNS
/* Types ferry reads but does not write (no quantizer): dequant.c (NVFP4) and dequant_iq.c. */
#define ROW_TO_F32(t) void row_##t##_to_f32(const void *src, float *dst, int64_t n);
ROW_TO_F32(nvfp4)
ROW_TO_F32(iq2_xxs)
ROW_TO_F32(iq2_xs)
ROW_TO_F32(iq2_s)
ROW_TO_F32(iq3_xxs)
ROW_TO_F32(iq1_s)
ROW_TO_F32(iq1_m)
#undef ROW_TO_F32
/* With an importance matrix: qw (n) weighs each column of the row (weighted.c; quantize_lut.c for IQ4). */
#define ROW_FROM_F32_W(t) void row_##t##_from_f32_w(const float *src, void *dst, int64_t n, const float *qw);
ROW_FROM_F32_W(q4_0)
ROW_FROM_F32_W(q4_1)
ROW_FROM_F32_W(q5_0)
ROW_FROM_F32_W(q5_1)
ROW_FROM_F32_W(q2_k)
ROW_FROM_F32_W(q3_k)
ROW_FROM_F32_W(q4_k)
ROW_FROM_F32_W(q5_k)
ROW_FROM_F32_W(q6_k)
ROW_FROM_F32_W(iq4_nl)
ROW_FROM_F32_W(iq4_xs)
ROW_FROM_F32_W(iq2_xs) /* iq_quant.c; these six have no unweighted quantizer */
ROW_FROM_F32_W(iq2_xxs)
ROW_FROM_F32_W(iq2_s)
ROW_FROM_F32_W(iq1_s) /* iq1_quant.c */
ROW_FROM_F32_W(iq1_m)
ROW_FROM_F32_W(iq3_xxs)
ROW_FROM_F32_W(iq3_s) /* iq_quant.c */
#undef ROW_FROM_F32_W

/* Block packing shared by the reference and the weighted quantizers (kquant.c, quantize.c). L: codes, one
 * byte per element. */
struct block_q3_k;
struct block_q6_k;
void quant_pack_q5(const uint8_t q[32], uint8_t qs[16], uint8_t qh[4]);
void kquant_pack_2bit(const uint8_t L[256], uint8_t qs[64]);
void kquant_pack_scales_mins(const uint8_t sc[8], const uint8_t mn[8], uint8_t s[12]);
void kquant_pack_q4_k(const uint8_t L[256], uint8_t qs[128]);
void kquant_pack_q5_k(const uint8_t L[256], uint8_t qs[128], uint8_t qh[32]);
/* Q4_K/Q5_K codes (in [0, nmax]) re-quantized with the block's rounded sub-block scales and mins. */
void kquant_affine_requantize(const float *x, int nmax, uint16_t d, uint16_t dmin, const uint8_t scales[12],
                              uint8_t L[256]);
/* Q3_K with b->d and b->scales set: the codes L (l + 4) re-quantized with them, then hmask and qs. */
void kquant_q3_k_finish(const float *x, uint8_t L[256], struct block_q3_k *b);
/* Levels L in [0, nmax] of non-negative x (n) by a weighted fit; the scale (ggml's make_qp_quants;
 * weighted.c). */
float quant_fit_positive_w(int n, int nmax, const float *x, uint8_t *L, const float *w);
/* Q6_K from its 16 sub-block scales and codes (l + 32): the int8 scales, d, re-quantized codes, packing. */
void kquant_q6_k_finish(const float *x, const float scales[16], int8_t L[256], struct block_q6_k *b);

#endif
