/* ops — embedding lookup, RMSNorm, rotary embedding, SiLU gate and residual add on the CPU (see ops.h).
 *
 * Precision follows Hugging Face transformers in fp32, because the runtime's logits are compared with it:
 * RMSNorm squares and sums in double, rounds the mean to f32 and scales by an f32 rsqrt, then multiplies by
 * the weight (HF: weight * (x * rsqrt(var + eps))). Rotary frequencies are computed in f32 in the same order
 * as HF's _compute_default_rope_parameters / _compute_llama3_parameters, and angles as f32(pos) * inv_freq
 * rounded to f32, with cos/sin evaluated in double and rounded. The float steps that must not be fused into
 * FMAs go through f32_keep(), which forces a rounding to f32.
 */
#include "kernels/cpu/ops.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "kernels/core/status.h"
#include "kernels/cpu/vexp.h"
#include "quant/dequant.h"

/* Vector-returning static helpers are never called across an ABI boundary. */
#pragma GCC diagnostic ignored "-Wpsabi"

/* Rounds to f32 and stops the compiler from contracting the surrounding expression into an FMA. */
static inline float f32_keep(float v)
{
    volatile float r = v;
    return r;
}

int kern_cpu_embed(float *x, const void *table, enum dtype tt, int n_rows, int d, const int32_t *tokens,
                   int m)
{
    if (!x || !table || !tokens || d <= 0 || m < 0 || n_rows <= 0 || !dtype_valid(tt))
        return FERRY_ERR_INVALID;
    const size_t row_bytes = dtype_row_size(tt, d);
    if (row_bytes == 0) return FERRY_ERR_INVALID;
    for (int i = 0; i < m; i++)
        if (tokens[i] < 0 || tokens[i] >= n_rows) return FERRY_ERR_RANGE;
    for (int i = 0; i < m; i++) {
        int st =
            dequant_row(tt, (const uint8_t *)table + (size_t)tokens[i] * row_bytes, x + (size_t)i * d, d);
        if (st) return st;
    }
    return FERRY_OK;
}

/* ---- RMSNorm ---------------------------------------------------------------------------------------------
 */

typedef double v4d __attribute__((vector_size(32)));
typedef float v4f __attribute__((vector_size(16), aligned(4)));

static double sum_squares(const float *x, int d)
{
    v4d a0 = {0}, a1 = {0};
    int i = 0;
    for (; i + 8 <= d; i += 8) {
        v4d x0 = __builtin_convertvector(*(const v4f *)(x + i), v4d);
        v4d x1 = __builtin_convertvector(*(const v4f *)(x + i + 4), v4d);
        a0 += x0 * x0;
        a1 += x1 * x1;
    }
    v4d a = a0 + a1;
    double s = (a[0] + a[2]) + (a[1] + a[3]);
    for (; i < d; i++) s += (double)x[i] * x[i];
    return s;
}

void kern_cpu_rmsnorm(float *y, const float *x, const float *w, int m, int d, float eps)
{
    for (int r = 0; r < m; r++) {
        const float *xr = x + (size_t)r * d;
        float *yr = y + (size_t)r * d;
        const float var = (float)(sum_squares(xr, d) / d);
        const float s = (float)(1.0 / sqrt((double)(var + eps)));
        for (int i = 0; i < d; i++) yr[i] = w[i] * (xr[i] * s);
    }
}

void kern_cpu_rmsnorm_ref(float *y, const float *x, const float *w, int m, int d, float eps)
{
    for (int r = 0; r < m; r++) {
        const float *xr = x + (size_t)r * d;
        double ss = 0;
        for (int i = 0; i < d; i++) ss += (double)xr[i] * xr[i];
        const double s = 1.0 / sqrt(ss / d + eps);
        for (int i = 0; i < d; i++) y[(size_t)r * d + i] = (float)((double)w[i] * xr[i] * s);
    }
}

void kern_cpu_qk_norm_ref(float *qkv, int ld, const float *qw, const float *kw, int m, int n_heads,
                          int n_kv_heads, int head_dim, float eps)
{
    for (int r = 0; r < m; r++) {
        float *row = qkv + (size_t)r * ld;
        kern_cpu_rmsnorm_ref(row, row, qw, n_heads, head_dim, eps);
        kern_cpu_rmsnorm_ref(row + (size_t)n_heads * head_dim, row + (size_t)n_heads * head_dim, kw,
                             n_kv_heads, head_dim, eps);
    }
}

/* ---- rotary embedding ------------------------------------------------------------------------------------
 */

/* YaRN, as transformers' _compute_yarn_parameters: the correction range [low, high] of pair indices from
 * the rotations beta_fast and beta_slow over the original context (in double, as Python's math does),
 * rounded outwards when truncate, and a linear ramp over it between the extrapolated frequencies (below
 * low, kept) and the interpolated ones (above high, divided by factor); every tensor step in f32 as torch
 * rounds it. */
static void rope_freqs_yarn(float *inv_freq, int rope_dim, float theta, const struct rope_scaling *sc)
{
    const int half = rope_dim / 2;
    const double two_pi = 2.0 * M_PI, base = (double)theta, dim = (double)rope_dim;
    const double beta_fast = sc->beta_fast > 0 ? sc->beta_fast : 32.0;
    const double beta_slow = sc->beta_slow > 0 ? sc->beta_slow : 1.0;
    const double ctx = (double)sc->orig_ctx;
    double low = dim * log(ctx / (beta_fast * two_pi)) / (2.0 * log(base));
    double high = dim * log(ctx / (beta_slow * two_pi)) / (2.0 * log(base));
    if (sc->truncate) low = floor(low), high = ceil(high);
    low = low > 0 ? low : 0;
    high = high < dim - 1 ? high : dim - 1;
    if (low == high) high += 0.001; /* transformers' guard against a zero-width ramp */
    const float lo = (float)low, span = (float)(high - low);
    for (int i = 0; i < half; i++) {
        const float e = f32_keep((float)(2 * i) / (float)rope_dim);
        const float pos_freq = (float)pow(base, (double)e); /* as kern_cpu_rope_freqs computes it */
        const float extra = f32_keep(1.0f / pos_freq);
        const float inter = f32_keep(1.0f / f32_keep(sc->factor * pos_freq));
        float ramp = f32_keep(f32_keep((float)i - lo) / span);
        ramp = ramp < 0 ? 0 : ramp > 1 ? 1 : ramp;
        const float keep = f32_keep(1.0f - ramp); /* the extrapolation factor */
        inv_freq[i] = f32_keep(f32_keep(inter * f32_keep(1.0f - keep)) + f32_keep(extra * keep));
    }
}

/* theta^(2i / rope_dim) in f32, as transformers' base ** (arange(0, dim, 2).float() / dim). */
static float rope_pos_freq(int i, int rope_dim, float theta)
{
    const float e = f32_keep((float)(2 * i) / (float)rope_dim);
    return (float)pow((double)theta, (double)e); /* correctly rounded; torch is within 1 ulp */
}

void kern_cpu_rope_freqs_ext(float *inv_freq, int rope_dim, float theta, const float *ext)
{
    for (int i = 0; i < rope_dim / 2; i++)
        inv_freq[i] = f32_keep(1.0f / f32_keep(ext[i] * rope_pos_freq(i, rope_dim, theta)));
}

void kern_cpu_q_scale(float *x, int m, int n_heads, int head_dim, int rope_dim, float rot_scale,
                      float all_scale)
{
    for (int64_t r = 0; r < (int64_t)m * n_heads; r++) {
        float *h = x + r * head_dim;
        if (rot_scale != 1.0f)
            for (int d = 0; d < rope_dim; d++) h[d] *= rot_scale;
        if (all_scale != 1.0f)
            for (int d = 0; d < head_dim; d++) h[d] *= all_scale;
    }
}

void kern_cpu_rope_freqs(float *inv_freq, int rope_dim, float theta, const struct rope_scaling *sc)
{
    const int half = rope_dim / 2;
    if (sc && sc->type == ROPE_SCALING_LONGROPE && sc->n_factors == half) {
        kern_cpu_rope_freqs_ext(inv_freq, rope_dim, theta, sc->short_factor);
        return;
    }
    for (int i = 0; i < half; i++) inv_freq[i] = f32_keep(1.0f / rope_pos_freq(i, rope_dim, theta));
    if (!sc || sc->type == ROPE_SCALING_NONE || sc->type == ROPE_SCALING_LONGROPE) return;
    if (sc->type == ROPE_SCALING_LINEAR) {
        for (int i = 0; i < half; i++) inv_freq[i] = f32_keep(inv_freq[i] / sc->factor);
        return;
    }
    if (sc->type == ROPE_SCALING_YARN) {
        rope_freqs_yarn(inv_freq, rope_dim, theta, sc);
        return;
    }
    /* llama3, as transformers' _compute_llama3_parameters. torch evaluates `python_scalar / tensor` as
     * reciprocal(tensor) * scalar, and converts python scalars to f32 before the element-wise op. */
    const float factor = sc->factor, lo = sc->low_freq_factor, hi = sc->high_freq_factor;
    const float old_ctx = (float)sc->orig_ctx;
    const float lo_wavelen = (float)((double)sc->orig_ctx / (double)lo);
    const float hi_wavelen = (float)((double)sc->orig_ctx / (double)hi);
    const float two_pi = (float)(2.0 * M_PI);
    const float hi_minus_lo = (float)((double)hi - (double)lo);
    for (int i = 0; i < half; i++) {
        const float f = inv_freq[i];
        const float wavelen = f32_keep(f32_keep(1.0f / f) * two_pi);
        float fl = wavelen > lo_wavelen ? f32_keep(f / factor) : f;
        const float smooth =
            f32_keep(f32_keep(f32_keep(f32_keep(1.0f / wavelen) * old_ctx) - lo) / hi_minus_lo);
        const float smoothed =
            f32_keep(f32_keep(f32_keep(f32_keep(1.0f - smooth) * fl) / factor) + f32_keep(smooth * fl));
        const int medium = !(wavelen < hi_wavelen) && !(wavelen > lo_wavelen);
        inv_freq[i] = medium ? smoothed : fl;
    }
}

/* Rotates one head given cs[i] = (cos, sin) of pair i. */
static inline void rope_head(float *h, const float *cs, int rope_dim, enum rope_style style)
{
    const int half = rope_dim / 2;
    if (style == ROPE_STYLE_HALF) {
        for (int i = 0; i < half; i++) {
            const float a = h[i], b = h[i + half], c = cs[2 * i], s = cs[2 * i + 1];
            h[i] = a * c - b * s;
            h[i + half] = b * c + a * s;
        }
    } else {
        for (int i = 0; i < half; i++) {
            const float a = h[2 * i], b = h[2 * i + 1], c = cs[2 * i], s = cs[2 * i + 1];
            h[2 * i] = a * c - b * s;
            h[2 * i + 1] = b * c + a * s;
        }
    }
}

#define ROPE_MAX_PAIRS 1024

/* The (cos, sin) table of the last position seen by this thread, with the frequencies it was computed for:
 * a decode step calls rope twice per layer at the same position, so sincos runs once per step instead of
 * once per call. Bounded (12 KiB per thread); the values are the ones a fresh computation gives. */
static _Thread_local struct {
    int half; /* 0: empty */
    int32_t pos;
    float inv[ROPE_MAX_PAIRS];
    float cs[2 * ROPE_MAX_PAIRS];
} rope_cache;

void kern_cpu_rope(float *x, const int32_t *pos, int m, int n_heads, int head_dim, int rope_dim,
                   const float *inv_freq, enum rope_style style)
{
    const int half = rope_dim / 2;
    if (half > ROPE_MAX_PAIRS || half <= 0) {
        kern_cpu_rope_ref(x, pos, m, n_heads, head_dim, rope_dim, inv_freq, style);
        return;
    }
    if (rope_cache.half != half || memcmp(rope_cache.inv, inv_freq, sizeof(float) * (size_t)half) != 0) {
        memcpy(rope_cache.inv, inv_freq, sizeof(float) * (size_t)half);
        rope_cache.half = half;
        rope_cache.pos = INT32_MIN;
    }
    float *cs = rope_cache.cs;
    for (int t = 0; t < m; t++) {
        if (pos[t] != rope_cache.pos) {
            const float p = (float)pos[t];
            for (int i = 0; i < half; i++) {
                const double ang = (double)(p * inv_freq[i]);
                double s, c;
                sincos(ang, &s, &c);
                cs[2 * i] = (float)c;
                cs[2 * i + 1] = (float)s;
            }
            rope_cache.pos = pos[t];
        }
        for (int h = 0; h < n_heads; h++)
            rope_head(x + ((size_t)t * n_heads + h) * head_dim, cs, rope_dim, style);
    }
}

void kern_cpu_rope_ref(float *x, const int32_t *pos, int m, int n_heads, int head_dim, int rope_dim,
                       const float *inv_freq, enum rope_style style)
{
    const int half = rope_dim / 2;
    for (int t = 0; t < m; t++)
        for (int h = 0; h < n_heads; h++) {
            float *v = x + ((size_t)t * n_heads + h) * head_dim;
            for (int i = 0; i < half; i++) {
                const float ang = (float)pos[t] * inv_freq[i];
                const double c = cos((double)ang), s = sin((double)ang);
                const int ia = style == ROPE_STYLE_HALF ? i : 2 * i;
                const int ib = style == ROPE_STYLE_HALF ? i + half : 2 * i + 1;
                const double a = v[ia], b = v[ib];
                v[ia] = (float)(a * c - b * s);
                v[ib] = (float)(b * c + a * s);
            }
        }
}

/* ---- element-wise ----------------------------------------------------------------------------------------
 */

/* For |a| > 87 the vector exp is clamped, which silu does not notice: 1 + e^-a is then either exactly 1 or
 * so large that the quotient underflows towards 0 either way. */
/* The last n % 8 elements of an element-wise op go through the same vector code as the others, from a padded
 * copy: an element's result must not depend on where it falls in the array (n is the rows of a step times a
 * row's width, so a row's elements fall at other offsets in a step of other size), or a row's result would
 * depend on the step around it. */
#define TAIL8(n, i, gate, up, body)                                                                          \
    if ((i) < (n)) {                                                                                         \
        float gt_[8] = {0}, ut_[8] = {0};                                                                    \
        const int64_t r_ = (n) - (i);                                                                        \
        memcpy(gt_, (gate) + (i), sizeof(float) * (size_t)r_);                                               \
        memcpy(ut_, (up) + (i), sizeof(float) * (size_t)r_);                                                 \
        const v8f g_ = *(const v8fu *)gt_, u_ = *(const v8fu *)ut_;                                          \
        *(v8fu *)gt_ = body(g_, u_);                                                                         \
        memcpy((gate) + (i), gt_, sizeof(float) * (size_t)r_);                                               \
    }

static inline v8f silu_mul8(v8f g, v8f u)
{
    return g / (1.0f + v8_exp(-g)) * u;
}

void kern_cpu_silu_mul(float *gate, const float *up, int64_t n)
{
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        *(v8fu *)(gate + i) = silu_mul8(*(const v8fu *)(gate + i), *(const v8fu *)(up + i));
    TAIL8(n, i, gate, up, silu_mul8)
}

/* 0.5·x·(1 + tanh(z)) as x / (1 + e^-2z), eight at a time through the vector exp (libm's tanhf per element
 * was ~30% of a Gemma prefill); the same function, without the cancellation of 1 + tanh(z) for negative z.
 * Clamped exp: past z = 44 the quotient is x; below z = -44 it underflows towards 0 either way. */
static inline v8f gelu_mul8(v8f x, v8f u)
{
    const float k = 0.7978845608028654f; /* sqrt(2/pi) */
    const v8f z = k * (x + 0.044715f * x * x * x);
    return x / (1.0f + v8_exp(-2.0f * z)) * u;
}

void kern_cpu_gelu_mul(float *gate, const float *up, int64_t n)
{
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        *(v8fu *)(gate + i) = gelu_mul8(*(const v8fu *)(gate + i), *(const v8fu *)(up + i));
    TAIL8(n, i, gate, up, gelu_mul8)
}

void kern_cpu_gelu_mul_ref(float *gate, const float *up, int64_t n)
{
    for (int64_t i = 0; i < n; i++) {
        const double x = gate[i];
        gate[i] = (float)(0.5 * x * (1.0 + tanh(sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x))) * up[i]);
    }
}

void kern_cpu_scale(float *x, float s, int64_t n)
{
    for (int64_t i = 0; i < n; i++) x[i] *= s;
}

void kern_cpu_add(float *y, const float *x, int64_t n)
{
    for (int64_t i = 0; i < n; i++) y[i] += x[i];
}

void kern_cpu_swiglu_clamped(float *gate, const float *up, int64_t n, float alpha, float limit)
{
    for (int64_t i = 0; i < n; i++) {
        const float g = gate[i] < limit ? gate[i] : limit;
        const float u = up[i] < -limit ? -limit : up[i] > limit ? limit : up[i];
        gate[i] = g / (1.0f + expf(-alpha * g)) * (u + 1.0f);
    }
}

/* ---- soft-capping ---------------------------------------------------------------------------------------
 */

void kern_cpu_softcap(float *x, float c, int64_t n)
{
    for (int64_t i = 0; i < n; i++) x[i] = c * tanhf(x[i] / c);
}

void kern_cpu_softcap_ref(float *x, float c, int64_t n)
{
    for (int64_t i = 0; i < n; i++) x[i] = (float)((double)c * tanh((double)x[i] / c));
}
