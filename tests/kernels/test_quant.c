/* Dequantization and quantization against gguf-py (tests/kernels/make_quant_fixtures.py wrote the data):
 * dequant_row must reproduce gguf.quants.dequantize bit for bit (both evaluate the same f32 expressions
 * without fused multiply-adds), quant_row must produce gguf.quants.quantize's bytes exactly, and the
 * fp16.h conversions must round like numpy (f16) and gguf-py (bf16). */
#include "kt_common.h"

#include "kernels/core/dtype.h"
#include "kernels/core/fp16.h"
#include "kernels/core/status.h"
#include "quant/blocks.h"
#include "quant/dequant.h"

static void check_dequant(enum dtype t, const char *name)
{
    char fb[64], fd[64];
    snprintf(fb, sizeof fb, "%s.blocks", name);
    snprintf(fd, sizeof fd, "%s.deq", name);
    size_t nb, nd;
    uint8_t *blocks;
    float *want;
    KT_LOAD(blocks, fb, nb);
    KT_LOAD(want, fd, nd);
    const int64_t n = (int64_t)(nd / 4);
    cr_assert_eq(dtype_row_size(t, n), nb, "%s: fixture sizes disagree", name);
    float *got = malloc(nd);
    cr_assert_eq(dequant_row(t, blocks, got, n), FERRY_OK);
    int mismatches = 0;
    int64_t first = -1;
    for (int64_t i = 0; i < n; i++)
        if (memcmp(&got[i], &want[i], 4) != 0 && !(isnan(got[i]) && isnan(want[i]))) {
            if (first < 0) first = i;
            mismatches++;
        }
    cr_assert_eq(mismatches, 0, "%s: %d of %ld values differ from gguf-py; first [%ld] got %.9g want %.9g",
                 name, mismatches, (long)n, (long)first, first >= 0 ? got[first] : 0.0,
                 first >= 0 ? want[first] : 0.0);
    /* A row in the middle of the data (not block 0) also decodes alone. */
    const int bs = dtype_block_size(t);
    const int64_t off = (n / bs / 2) * bs;
    cr_assert_eq(dequant_row(t, blocks + dtype_row_size(t, off), got, bs), FERRY_OK);
    cr_assert(memcmp(got, want + off, (size_t)bs * 4) == 0, "%s: single block at %ld", name, (long)off);
    free(got);
    free(blocks);
    free(want);
}

Test(quant, dequant_q8_0)
{
    check_dequant(DTYPE_Q8_0, "Q8_0");
}
Test(quant, dequant_q4_0)
{
    check_dequant(DTYPE_Q4_0, "Q4_0");
}
Test(quant, dequant_q4_1)
{
    check_dequant(DTYPE_Q4_1, "Q4_1");
}
Test(quant, dequant_q4_k)
{
    check_dequant(DTYPE_Q4_K, "Q4_K");
}
Test(quant, dequant_q6_k)
{
    check_dequant(DTYPE_Q6_K, "Q6_K");
}
Test(quant, dequant_f16)
{
    check_dequant(DTYPE_F16, "F16");
}
Test(quant, dequant_bf16)
{
    check_dequant(DTYPE_BF16, "BF16");
}

static void check_quant(enum dtype t, const char *name)
{
    char fq[64];
    snprintf(fq, sizeof fq, "%s.quant", name);
    size_t nx, nq;
    float *x;
    uint8_t *want;
    KT_LOAD(x, "quant_in.f32", nx);
    KT_LOAD(want, fq, nq);
    const int64_t n = (int64_t)(nx / 4);
    cr_assert_eq(dtype_row_size(t, n), nq);
    uint8_t *got = malloc(nq);
    cr_assert_eq(quant_row(t, x, got, n), FERRY_OK);
    const size_t bsz = dtype_type_size(t);
    int bad_blocks = 0;
    long first = -1;
    for (size_t b = 0; b < nq / bsz; b++)
        if (memcmp(got + b * bsz, want + b * bsz, bsz) != 0) {
            if (first < 0) first = (long)b;
            bad_blocks++;
        }
    cr_assert_eq(bad_blocks, 0, "%s: %d blocks differ from gguf-py's quantize, first block %ld", name,
                 bad_blocks, first);
    /* Round trip: within half a step plus the f16 rounding of d (127 steps of at most 2^-11 d), for Q8_0. */
    if (t == DTYPE_Q8_0) {
        float *back = malloc(nx);
        cr_assert_eq(dequant_row(t, got, back, n), FERRY_OK);
        const struct block_q8_0 *bl = (const void *)got;
        for (int64_t i = 0; i < n; i++) {
            const float d = f16_to_f32(bl[i / 32].d);
            cr_assert(fabsf(back[i] - x[i]) <= 0.5f * d + 127.0f * d * 0x1p-11f + 1e-7f,
                      "Q8_0 round trip [%ld]", (long)i);
        }
        free(back);
    }
    free(got);
    free(x);
    free(want);
}

Test(quant, quant_q8_0)
{
    check_quant(DTYPE_Q8_0, "Q8_0");
}
Test(quant, quant_q4_0)
{
    check_quant(DTYPE_Q4_0, "Q4_0");
}
Test(quant, quant_q4_1)
{
    check_quant(DTYPE_Q4_1, "Q4_1");
}

Test(quant, fp16_conversions_round_like_numpy)
{
    size_t nf, nh, nb;
    float *f;
    uint16_t *h, *b;
    KT_LOAD(f, "fp16_in.f32", nf);
    KT_LOAD(h, "fp16_out.u16", nh);
    KT_LOAD(b, "bf16_out.u16", nb);
    for (size_t i = 0; i < nf / 4; i++) {
        cr_assert_eq(f32_to_f16(f[i]), h[i], "f32_to_f16(%.9g) = 0x%04x, numpy 0x%04x", f[i],
                     f32_to_f16(f[i]), h[i]);
        cr_assert_eq(f32_to_bf16(f[i]), b[i], "f32_to_bf16(%.9g) = 0x%04x, gguf-py 0x%04x", f[i],
                     f32_to_bf16(f[i]), b[i]);
        /* Every finite f16 converts back to an f32 that converts to the same bits. */
        if ((h[i] & 0x7C00) != 0x7C00) cr_assert_eq(f32_to_f16(f16_to_f32(h[i])), h[i]);
    }
    free(f);
    free(h);
    free(b);
}

Test(quant, rejects_bad_lengths)
{
    float dst[64];
    uint8_t src[64 * 4] = {0};
    cr_assert_eq(dequant_row(DTYPE_Q8_0, src, dst, 33), FERRY_ERR_INVALID);
    cr_assert_eq(dequant_row(DTYPE_Q4_K, src, dst, 32), FERRY_ERR_INVALID);
    cr_assert_eq(dequant_row((enum dtype)9, src, dst, 32), FERRY_ERR_INVALID);
    cr_assert_eq(quant_row(DTYPE_Q4_0, dst, src, 31), FERRY_ERR_INVALID);
    cr_assert_eq(quant_row(DTYPE_Q6_K, dst, src, 256), FERRY_ERR_UNSUPPORTED);
    cr_assert_eq(dequant_row(DTYPE_F32, src, dst, 0), FERRY_OK);
}
