/* ops: embed, rmsnorm, rope_freqs, rope, silu_mul, add — each against its reference on random data, and
 * rmsnorm / rope_freqs / rope against Hugging Face transformers fixtures (make_quant_fixtures.py). */
#include "kt_common.h"

#include "quant/fp16.h"
#include "kernels/core/status.h"
#include "kernels/cpu/ops.h"
#include "quant/dtype.h"

Test(ops, embed_every_dtype)
{
    const enum dtype types[] = {DTYPE_F32, DTYPE_F16, DTYPE_BF16, DTYPE_Q8_0, DTYPE_Q4_0, DTYPE_Q4_1};
    const int n_rows = 29, d = 32 * 7;
    const int32_t tok[5] = {28, 0, 13, 13, 5};
    kt_seed(11);
    float *src = malloc(sizeof(float) * n_rows * d), *x = malloc(sizeof(float) * 5 * d), row[32 * 7];
    kt_fill(src, (size_t)n_rows * d, -3.0f, 3.0f);
    for (unsigned ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
        const enum dtype t = types[ti];
        const size_t rb = dtype_row_size(t, d);
        uint8_t *table = malloc(rb * n_rows);
        for (int r = 0; r < n_rows; r++) cr_assert(dtype_from_f32(t, src + (size_t)r * d, table + rb * r, d));
        cr_assert_eq(kern_cpu_embed(x, table, t, n_rows, d, tok, 5), FERRY_OK);
        for (int i = 0; i < 5; i++) {
            cr_assert(dtype_to_f32(t, table + rb * tok[i], row, d));
            cr_assert(memcmp(row, x + (size_t)i * d, sizeof row) == 0, "%s token %d", dtype_name(t), i);
            /* And the decoded row is close to the source row (the quantization step of each type). */
            const float tol = t == DTYPE_F32    ? 0
                              : t == DTYPE_F16  ? 2e-3f
                              : t == DTYPE_BF16 ? 2e-2f
                              : t == DTYPE_Q8_0 ? 3.0f / 127
                                                : 0.4f;
            for (int e = 0; e < d; e++)
                cr_assert(fabsf(x[(size_t)i * d + e] - src[(size_t)tok[i] * d + e]) <= tol, "%s [%d,%d]",
                          dtype_name(t), i, e);
        }
        free(table);
    }
    const int32_t bad[2] = {3, 29}, neg[1] = {-1};
    cr_assert_eq(kern_cpu_embed(x, src, DTYPE_F32, n_rows, d, bad, 2), FERRY_ERR_RANGE);
    cr_assert_eq(kern_cpu_embed(x, src, DTYPE_F32, n_rows, d, neg, 1), FERRY_ERR_RANGE);
    cr_assert_eq(kern_cpu_embed(x, src, DTYPE_Q8_0, n_rows, 33, tok, 1), FERRY_ERR_INVALID);
    free(src);
    free(x);
}

Test(ops, rmsnorm_vs_ref_and_hf)
{
    const int dims[] = {1, 7, 333, 4096};
    kt_seed(12);
    for (unsigned di = 0; di < 4; di++) {
        const int d = dims[di], m = 3;
        float *x = malloc(sizeof(float) * m * d), *w = malloc(sizeof(float) * d);
        float *y = malloc(sizeof(float) * m * d), *r = malloc(sizeof(float) * m * d);
        kt_fill(x, (size_t)m * d, -5.0f, 5.0f);
        kt_fill(w, d, 0.1f, 2.0f);
        kern_cpu_rmsnorm(y, x, w, m, d, 1e-5f);
        kern_cpu_rmsnorm_ref(r, x, w, m, d, 1e-5f);
        kt_check_close("rmsnorm vs ref", y, r, (size_t)m * d, 1e-7, 1e-6);
        kern_cpu_rmsnorm(x, x, w, m, d, 1e-5f); /* in place */
        cr_assert(memcmp(x, y, sizeof(float) * m * d) == 0, "rmsnorm in place differs");
        free(x);
        free(w);
        free(y);
        free(r);
    }
    size_t nx, nw, ny;
    float *x, *w, *want;
    KT_LOAD(x, "rms_in.f32", nx);
    KT_LOAD(w, "rms_w.f32", nw);
    KT_LOAD(want, "rms_out.f32", ny);
    float y[3 * 333];
    cr_assert_eq(nx, sizeof y);
    kern_cpu_rmsnorm(y, x, w, 3, 333, 1e-5f);
    /* transformers: f32 mean (pairwise) and rsqrt; ours rounds a double mean: within 2 ulp or so. */
    kt_check_close("rmsnorm vs transformers", y, want, 3 * 333, 0, 3e-7);
    free(x);
    free(w);
    free(want);
}

/* The configurations of make_quant_fixtures.py's ROPE_CONFIGS, in order. */
static const struct {
    float theta;
    int dim;
    struct rope_scaling sc;
} rope_cfgs[] = {
    {10000.0f, 64, {.type = ROPE_SCALING_NONE}},
    {500000.0f, 128, {ROPE_SCALING_LLAMA3, 8.0f, 1.0f, 4.0f, .orig_ctx = 8192}},
    {500000.0f, 64, {ROPE_SCALING_LLAMA3, 32.0f, 1.0f, 4.0f, .orig_ctx = 8192}},
    {10000.0f, 48, {ROPE_SCALING_LINEAR, .factor = 4.0f}},
    {1000000.0f, 128, {.type = ROPE_SCALING_NONE}},
};

Test(ops, rope_freqs_match_transformers)
{
    size_t n;
    float *want;
    KT_LOAD(want, "rope_freqs.f32", n);
    size_t off = 0;
    for (unsigned c = 0; c < sizeof rope_cfgs / sizeof rope_cfgs[0]; c++) {
        float f[64];
        kern_cpu_rope_freqs(f, rope_cfgs[c].dim, rope_cfgs[c].theta, &rope_cfgs[c].sc);
        cr_assert_leq((off + rope_cfgs[c].dim / 2) * 4, n);
        for (int i = 0; i < rope_cfgs[c].dim / 2; i++) {
            /* Same f32 operations in the same order: at most 1 ulp apart (torch's powf vs our rounded pow).
             */
            const int32_t a = (int32_t)fp32_to_bits(f[i]), b = (int32_t)fp32_to_bits(want[off + i]);
            cr_assert(abs(a - b) <= 1, "config %u inv_freq[%d] = %.9g, transformers %.9g", c, i, f[i],
                      want[off + i]);
        }
        off += rope_cfgs[c].dim / 2;
    }
    cr_assert_eq(off * 4, n);
    free(want);
}

Test(ops, rope_half_matches_transformers)
{
    size_t np, nx, ny;
    int32_t *pos;
    float *x, *want;
    KT_LOAD(pos, "rope_pos.i32", np);
    KT_LOAD(x, "rope_in.f32", nx);
    KT_LOAD(want, "rope_out.f32", ny);
    const int m = (int)(np / 4), h = 3, hd = 128;
    cr_assert_eq(nx, (size_t)m * h * hd * 4);
    float f[64];
    kern_cpu_rope_freqs(f, hd, rope_cfgs[1].theta, &rope_cfgs[1].sc);
    kern_cpu_rope(x, pos, m, h, hd, hd, f, ROPE_STYLE_HALF);
    /* cos/sin within an ulp of torch's f32 ones, then two products and a sum in f32. */
    kt_check_close("rope vs transformers", x, want, (size_t)m * h * hd, 1e-6, 1e-6);
    free(pos);
    free(x);
    free(want);
}

Test(ops, rope_vs_ref_both_styles_partial)
{
    const int m = 9, nh = 5, hd = 80;
    const int rope_dims[] = {80, 32};
    int32_t pos[9] = {0, 1, 3, 77, 300, 301, 4096, 30000, 2};
    kt_seed(13);
    for (int style = 0; style < 2; style++)
        for (int rd = 0; rd < 2; rd++) {
            const int rope_dim = rope_dims[rd];
            float f[40];
            const struct rope_scaling none = {.type = ROPE_SCALING_NONE};
            kern_cpu_rope_freqs(f, rope_dim, 10000.0f, &none);
            float *a = malloc(sizeof(float) * m * nh * hd), *b = malloc(sizeof(float) * m * nh * hd);
            float *orig = malloc(sizeof(float) * m * nh * hd);
            kt_fill(a, (size_t)m * nh * hd, -2.0f, 2.0f);
            memcpy(b, a, sizeof(float) * m * nh * hd);
            memcpy(orig, a, sizeof(float) * m * nh * hd);
            kern_cpu_rope(a, pos, m, nh, hd, rope_dim, f, (enum rope_style)style);
            kern_cpu_rope_ref(b, pos, m, nh, hd, rope_dim, f, (enum rope_style)style);
            kt_check_close("rope vs ref", a, b, (size_t)m * nh * hd, 1e-6, 1e-6);
            for (int t = 0; t < m; t++)
                for (int hh = 0; hh < nh; hh++) {
                    const size_t base = ((size_t)t * nh + hh) * hd;
                    /* Dims past rope_dim are untouched; the rotated pairs keep their norm. */
                    for (int e = rope_dim; e < hd; e++) cr_assert_eq(a[base + e], orig[base + e]);
                    for (int i = 0; i < rope_dim / 2; i++) {
                        const int ia = style == ROPE_STYLE_HALF ? i : 2 * i;
                        const int ib = style == ROPE_STYLE_HALF ? i + rope_dim / 2 : 2 * i + 1;
                        const double n0 = hypot(orig[base + ia], orig[base + ib]);
                        const double n1 = hypot(a[base + ia], a[base + ib]);
                        cr_assert(fabs(n0 - n1) <= 1e-5 * (1 + n0), "rope norm t=%d h=%d i=%d", t, hh, i);
                    }
                    /* Position 0 is the identity. */
                    if (pos[t] == 0)
                        for (int e = 0; e < hd; e++) cr_assert_eq(a[base + e], orig[base + e]);
                }
            free(a);
            free(b);
            free(orig);
        }
}

Test(ops, rope_styles_differ_by_permutation)
{
    /* INTERLEAVED on x equals HALF on x with pairs (2i, 2i+1) moved to (i, i + d/2): the relation between
     * llama.cpp's permuted GGUF weights and HF's layout. */
    const int hd = 64;
    float f[32], a[64], b[64];
    const struct rope_scaling none = {.type = ROPE_SCALING_NONE};
    kern_cpu_rope_freqs(f, hd, 10000.0f, &none);
    kt_seed(14);
    kt_fill(a, hd, -1.0f, 1.0f);
    for (int i = 0; i < hd / 2; i++) {
        b[i] = a[2 * i];
        b[i + hd / 2] = a[2 * i + 1];
    }
    const int32_t pos[1] = {123};
    kern_cpu_rope(a, pos, 1, 1, hd, hd, f, ROPE_STYLE_INTERLEAVED);
    kern_cpu_rope(b, pos, 1, 1, hd, hd, f, ROPE_STYLE_HALF);
    /* Equal but for rounding: the two styles' loops may fuse their multiply-adds differently (-march=native
     * builds contract them into FMAs where the compiler sees fit). */
    for (int i = 0; i < hd / 2; i++) {
        cr_assert_float_eq(a[2 * i], b[i], 1e-6f);
        cr_assert_float_eq(a[2 * i + 1], b[i + hd / 2], 1e-6f);
    }
}

Test(ops, silu_mul_and_add)
{
    const int n = 1001;
    float g[1001], u[1001], y[1001], y0[1001];
    kt_seed(15);
    kt_fill(g, n, -20.0f, 20.0f);
    kt_fill(u, n, -3.0f, 3.0f);
    /* Past the vector exp's clamp at [-87, 88], and NaN-free at the extremes. */
    g[0] = -100.0f, g[1] = 100.0f, g[2] = -88.5f, g[3] = 88.5f, g[4] = 0.0f, g[5] = -87.0f;
    float want[1001];
    for (int i = 0; i < n; i++) want[i] = (float)((double)g[i] / (1.0 + exp(-(double)g[i])) * u[i]);
    kern_cpu_silu_mul(g, u, n);
    kt_check_close("silu_mul", g, want, n, 1e-30, 1e-6);
    kt_fill(y, n, -3.0f, 3.0f);
    memcpy(y0, y, sizeof y);
    kern_cpu_add(y, u, n);
    for (int i = 0; i < n; i++) cr_assert_eq(y[i], y0[i] + u[i]);
}

/* GeGLU against torch's gelu(approximate="tanh") formula evaluated in double (written out here, independent
 * of kern_cpu_gelu_mul_ref), then the reference against the same; odd length, tails of tanh included. */
Test(ops, gelu_mul)
{
    const int n = 1003;
    float g[1003], g2[1003], u[1003], want[1003];
    kt_seed(36);
    kt_fill(g, n, -8.0f, 8.0f);
    kt_fill(u, n, -3.0f, 3.0f);
    g[0] = -30.0f, g[1] = 30.0f, g[2] = 0.0f;
    for (int i = 0; i < n; i++) {
        const double x = g[i], inner = 0.7978845608028654 * (x + 0.044715 * x * x * x);
        want[i] = (float)(0.5 * x * (1.0 + tanh(inner)) * u[i]);
    }
    memcpy(g2, g, sizeof g);
    kern_cpu_gelu_mul(g, u, n);
    kt_check_close("gelu_mul", g, want, n, 1e-6, 2e-6);
    kern_cpu_gelu_mul_ref(g2, u, n);
    kt_check_close("gelu_mul_ref", g2, want, n, 1e-7, 1e-7);
    float x[7] = {1, -2, 3, -4, 5, -6, 7};
    kern_cpu_scale(x, 0.5f, 7);
    for (int i = 0; i < 7; i++) cr_assert_eq(x[i], (i % 2 ? -0.5f : 0.5f) * (float)(i + 1));
}

/* The configurations of make_yarn_fixture.py's YARN_CONFIGS, in order. */
static const struct {
    float theta;
    int dim;
    struct rope_scaling sc;
} yarn_cfgs[] = {
    {150000.0f,
     64,
     {.type = ROPE_SCALING_YARN, .factor = 32, .orig_ctx = 4096, .beta_fast = 32, .beta_slow = 1}},
    {150000.0f,
     64,
     {.type = ROPE_SCALING_YARN,
      .factor = 32,
      .orig_ctx = 4096,
      .beta_fast = 32,
      .beta_slow = 1,
      .truncate = 1}},
    {1000000.0f,
     128,
     {.type = ROPE_SCALING_YARN,
      .factor = 4,
      .orig_ctx = 32768,
      .beta_fast = 32,
      .beta_slow = 1,
      .truncate = 1}},
    {10000.0f,
     80,
     {.type = ROPE_SCALING_YARN,
      .factor = 2.5f,
      .orig_ctx = 1000,
      .beta_fast = 16,
      .beta_slow = 2,
      .truncate = 1,
      .attn_factor = 1.25f}},
    {150000.0f,
     16,
     {.type = ROPE_SCALING_YARN, .factor = 4, .orig_ctx = 256, .beta_fast = 32, .beta_slow = 1}},
    {500000.0f,
     48,
     {.type = ROPE_SCALING_YARN,
      .factor = 8,
      .orig_ctx = 64,
      .beta_fast = 32,
      .beta_slow = 1,
      .truncate = 1}},
};

/* YaRN's frequencies and attention factor against transformers' _compute_yarn_parameters
 * (make_yarn_fixture.py): every frequency within 1 ulp (the f32 steps are torch's, pow is within 1 ulp of
 * it), the factor within 1e-6; the truncated and untruncated gpt-oss configurations differ. */
Test(ops, rope_freqs_yarn_match_transformers)
{
    size_t n;
    float *want;
    KT_LOAD(want, "rope_yarn.f32", n);
    size_t off = 0;
    float f[6][64];
    for (size_t c = 0; c < sizeof yarn_cfgs / sizeof yarn_cfgs[0]; c++) {
        const int half = yarn_cfgs[c].dim / 2;
        cr_assert_leq(off + (size_t)half + 1, n / sizeof(float), "rope_yarn.f32 is short");
        kern_cpu_rope_freqs(f[c], yarn_cfgs[c].dim, yarn_cfgs[c].theta, &yarn_cfgs[c].sc);
        for (int i = 0; i < half; i++) {
            const float w = want[off + (size_t)i];
            cr_assert(fabsf(f[c][i] - w) <= fabsf(w) * 0x1p-23f,
                      "config %zu pair %d: %.9g, transformers %.9g", c, i, f[c][i], w);
        }
        const float af = rope_scaling_attn_factor(&yarn_cfgs[c].sc);
        cr_assert_float_eq(af, want[off + (size_t)half], 1e-6f, "config %zu attention factor %.9g, want %.9g",
                           c, af, want[off + (size_t)half]);
        off += (size_t)half + 1;
    }
    cr_assert_eq(off, n / sizeof(float));
    int differ = 0;
    for (int i = 0; i < 32; i++) differ |= f[0][i] != f[1][i];
    cr_assert(differ, "truncation changes the gpt-oss frequencies");
    free(want);
}

/* gpt-oss's clamped SwiGLU against its double formula, on an odd length spanning both clamps. */
Test(ops, swiglu_clamped_against_reference)
{
    const int n = 1001;
    const float alpha = 1.702f, limit = 7.0f;
    kt_seed(29);
    float *g = malloc(sizeof(float) * n), *u = malloc(sizeof(float) * n), *ref = malloc(sizeof(float) * n);
    kt_fill(g, n, -12.0f, 12.0f);
    kt_fill(u, n, -12.0f, 12.0f);
    for (int i = 0; i < n; i++) {
        const double a = fmin(g[i], limit), b = fmax(-limit, fmin(u[i], limit));
        ref[i] = (float)(a / (1.0 + exp(-alpha * a)) * (b + 1.0));
    }
    int clamped_g = 0, clamped_u = 0;
    for (int i = 0; i < n; i++) clamped_g += g[i] > limit, clamped_u += fabsf(u[i]) > limit;
    cr_assert(clamped_g > 50 && clamped_u > 100, "the data reach both clamps");
    kern_cpu_swiglu_clamped(g, u, n, alpha, limit);
    kt_check_close("clamped swiglu", g, ref, n, 1e-6, 1e-6);
    free(g);
    free(u);
    free(ref);
}

/* Soft-capping against values torch computes (torch.tanh(x / 30) * 30 in f32), then on random data at an odd
 * length against the double reference; the result stays inside (-c, c) and keeps the order. */
Test(ops, softcap)
{
    float x[8] = {-90.0f, -31.5f, -2.25f, 0.0f, 0.7f, 29.0f, 45.0f, 300.0f};
    const float torch30[8] = {-29.851642608642578f, -23.454191207885742f, -2.245790719985962f, 0.0f,
                              0.6998729705810547f,  22.41707420349121f,   27.154447555541992f, 30.0f};
    kern_cpu_softcap(x, 30.0f, 8);
    kt_check_close("softcap vs torch", x, torch30, 8, 1e-6, 1e-6);
    const int n = 1001;
    float a[1001], b[1001];
    kt_seed(37);
    kt_fill(a, n, -200.0f, 200.0f);
    memcpy(b, a, sizeof a);
    kern_cpu_softcap(a, 17.5f, n);
    kern_cpu_softcap_ref(b, 17.5f, n);
    kt_check_close("softcap vs ref", a, b, n, 1e-6, 1e-6);
    for (int i = 0; i < n; i++) cr_assert(fabsf(a[i]) <= 17.5f, "softcap %d: %g", i, a[i]);
}

/* LongRoPE's frequencies: 1 / (ext[i] · theta^(2i/d)) in double, within 2 f32 ulps; the LongRoPE scaling
 * type takes its short factors. Odd number of pairs (rope_dim 22). */
Test(ops, rope_freqs_ext_longrope)
{
    enum { D = 22, H = D / 2 };
    float ext[H], f[H], g[H];
    kt_seed(31);
    kt_fill(ext, H, 1.0f, 20.0f);
    kern_cpu_rope_freqs_ext(f, D, 10000.0f, ext);
    for (int i = 0; i < H; i++) {
        const double want = 1.0 / ((double)ext[i] * pow(10000.0, 2.0 * i / D));
        cr_assert(fabs(f[i] - want) <= 2.4e-7 * want, "pair %d: %.9g, want %.9g", i, f[i], want);
    }
    struct rope_scaling sc = {.type = ROPE_SCALING_LONGROPE, .n_factors = H};
    memcpy(sc.short_factor, ext, sizeof ext);
    for (int i = 0; i < H; i++) sc.long_factor[i] = 99.0f;
    kern_cpu_rope_freqs(g, D, 10000.0f, &sc);
    cr_assert_arr_eq(g, f, sizeof f);
}

/* Queries scaled after rotation: the rotated dims by one factor, every dim by another, per head, at odd
 * sizes (3 rows of 5 heads of 14 dims, 10 rotating), against the products written out. */
Test(ops, q_scale_rotated_dims_and_all)
{
    enum { M = 3, NH = 5, HD = 14, RD = 10, N = M * NH * HD };
    float x[N], x0[N];
    kt_seed(37);
    kt_fill(x, N, -4.0f, 4.0f);
    memcpy(x0, x, sizeof x);
    kern_cpu_q_scale(x, M, NH, HD, RD, 1.5f, 0.75f);
    for (int i = 0; i < N; i++) {
        const float want = i % HD < RD ? x0[i] * 1.5f * 0.75f : x0[i] * 0.75f;
        cr_assert_float_eq(x[i], want, 1e-6f * fabsf(want) + 1e-30f, "element %d", i);
    }
    memcpy(x, x0, sizeof x);
    kern_cpu_q_scale(x, M, NH, HD, RD, 1.0f, 1.0f);
    cr_assert_arr_eq(x, x0, sizeof x, "scales of 1 leave the queries alone");
}
