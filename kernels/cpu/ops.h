/* ops — the small element-wise and row-wise ops of a Llama forward pass on the CPU, f32 activations.
 *
 * Each op has a plain reference (`_ref`) used by tests; the unsuffixed version is the one the runtime calls
 * (vectorizable loops, optionally threaded). Shapes are in the comments; rows are contiguous.
 */
#ifndef FERRY_KERN_CPU_OPS_H
#define FERRY_KERN_CPU_OPS_H

#include <stdint.h>

#include "kernels/core/dtype.h"
#include "kernels/core/rope.h"

struct tpool;

/* x (m, d) = rows tokens[i] of the table (n_rows, d) in dtype tt, dequantized. Token ids must be checked by
 * the caller (FERRY_ERR_RANGE otherwise). */
int kern_cpu_embed(float *x, const void *table, enum dtype tt, int n_rows, int d, const int32_t *tokens,
                   int m);

/* y (m, d) = x / sqrt(mean(x^2) + eps) * w, w (d) f32. y may alias x. */
void kern_cpu_rmsnorm(float *y, const float *x, const float *w, int m, int d, float eps);
void kern_cpu_rmsnorm_ref(float *y, const float *x, const float *w, int m, int d, float eps);

/* QK-norm (Qwen3, Gemma 3) on stacked q|k|v rows qkv (m, ld), in place: each of the n_heads query heads
 * (head_dim floats from column 0) = rmsnorm(head) * qw (head_dim), each of the n_kv_heads key heads after
 * them likewise with kw; the values are untouched. The reference of kern_cuda_qk_norm (double accumulation).
 */
void kern_cpu_qk_norm_ref(float *qkv, int ld, const float *qw, const float *kw, int m, int n_heads,
                          int n_kv_heads, int head_dim, float eps);

/* Rotary frequencies: inv_freq (rope_dim/2) for base theta, with linear, llama3 or YaRN scaling applied;
 * LongRoPE with its short factors (kern_cpu_rope_freqs_ext). */
void kern_cpu_rope_freqs(float *inv_freq, int rope_dim, float theta, const struct rope_scaling *sc);
/* LongRoPE's: inv_freq[i] = 1 / (ext[i] · theta^(2i / rope_dim)) (ext: rope_dim/2 factors), in f32 as
 * transformers computes it. */
void kern_cpu_rope_freqs_ext(float *inv_freq, int rope_dim, float theta, const float *ext);
/* Queries x (m, n_heads, head_dim) after rotation, in place: the first rope_dim dims of each head times
 * rot_scale (a rotary attention factor squared, llm_rope_q_scale), then every dim times all_scale (the
 * attention temperature of the rows' position, llm_attn_temp). */
void kern_cpu_q_scale(float *x, int m, int n_heads, int head_dim, int rope_dim, float rot_scale,
                      float all_scale);

/* In-place rotary embedding of x (m, n_heads, head_dim) at positions pos (m). The first rope_dim dims of
 * each head rotate. INTERLEAVED rotates pairs (2i, 2i+1); HALF rotates pairs (i, i + rope_dim/2).
 * Angles are computed as pos * inv_freq[i] in f32 then cos/sin in double precision (matches HF to ~1e-7). */
void kern_cpu_rope(float *x, const int32_t *pos, int m, int n_heads, int head_dim, int rope_dim,
                   const float *inv_freq, enum rope_style style);
void kern_cpu_rope_ref(float *x, const int32_t *pos, int m, int n_heads, int head_dim, int rope_dim,
                       const float *inv_freq, enum rope_style style);

/* gate (n) = silu(gate) * up, silu(a) = a / (1 + exp(-a)). */
void kern_cpu_silu_mul(float *gate, const float *up, int64_t n);
/* gate (n) = gelu_tanh(gate) * up (n), in place: GeGLU with transformers' gelu_pytorch_tanh,
 * 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))). _ref: the same in double, rounded once. */
void kern_cpu_gelu_mul(float *gate, const float *up, int64_t n);
void kern_cpu_gelu_mul_ref(float *gate, const float *up, int64_t n);
/* gpt-oss's clamped SwiGLU, in place on gate (n): g = min(gate, limit), u = clamp(up, -limit, limit),
 * gate = g * sigmoid(alpha * g) * (u + 1) (transformers' GptOssExperts._apply_gate), in f32. */
void kern_cpu_swiglu_clamped(float *gate, const float *up, int64_t n, float alpha, float limit);
/* x (n) *= s. */
void kern_cpu_scale(float *x, float s, int64_t n);
/* y (n) += x (n). */
void kern_cpu_add(float *y, const float *x, int64_t n);
/* x (n) = c * tanh(x / c), c > 0: logit soft-capping (Gemma 2 and 4), computed in f32 as transformers does.
 * _ref: the same in double, rounded once. */
void kern_cpu_softcap(float *x, float c, int64_t n);
void kern_cpu_softcap_ref(float *x, float c, int64_t n);

#endif
