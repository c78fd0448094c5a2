/* deltanet — the gated DeltaNet linear attention of one sequence on the host (Qwen3.5's linear layers).
 *
 * Per value head j the state S_j (head_k, head_v) maps keys to values. A token t with decay g_t <= 0 (log
 * space), rate beta_t in (0, 1), unit-norm key k_t, query q_t (already scaled) and value v_t does
 *   S = exp(g_t) S;  u = beta_t (v_t - Sᵀ k_t);  S += k_t uᵀ;  o_t = Sᵀ q_t
 * (the delta rule: only the part of v_t the state does not already predict is written). Value head j reads
 * query/key head j % n_k_heads when the value heads are tiled over the key heads (llama.cpp's qwen35 files),
 * or j / (n_v_heads / n_k_heads) when they are grouped by key head (transformers' order, which llama.cpp's
 * qwen3next files keep): kern_dn_dims.grouped. kern_cpu_dn_recurrent is that loop, token by token: the
 * reference, and the decode path. kern_cpu_dn_chunked computes the same function over chunks of C tokens at
 * once: within a chunk, with G_t the running sum of g and S0 the state at its start, the deltas u solve the
 * unit lower-triangular system u_t + sum_{s<t} beta_t e^{G_t-G_s} (k_t·k_s) u_s = beta_t (v_t - e^{G_t} S0ᵀ
 * k_t), and o_t = e^{G_t} S0ᵀ q_t + sum_{s<=t} e^{G_t-G_s} (q_t·k_s) u_s, S = e^{G_last} S0 + sum_s
 * e^{G_last-G_s} k_s u_sᵀ: products of small matrices instead of one rank-1 update of every state per token
 * (the form of the flash-linear-attention kernels). Every factor e^{G_t-G_s} with s <= t is at most 1, so
 * nothing overflows. kern_cpu_dn_conv is the causal depthwise convolution before it, with its rolling state.
 */
#ifndef FERRY_KERN_CPU_DELTANET_H
#define FERRY_KERN_CPU_DELTANET_H

#include <stddef.h>

struct tpool;

struct kern_dn_dims {
    int n_k_heads, n_v_heads; /* n_v_heads a multiple of n_k_heads */
    int head_k, head_v;
    int grouped; /* 1: value heads grouped by key head (j / (n_v/n_k)); 0: tiled over them (j % n_k) */
};

/* The query/key head value head j reads. */
static inline int kern_dn_key_head(const struct kern_dn_dims *d, int j)
{
    return d->grouped ? j / (d->n_v_heads / d->n_k_heads) : j % d->n_k_heads;
}

/* The tokens of one sequence, in order. Row t of q and k holds n_k_heads heads of head_k floats, of v
 * n_v_heads heads of head_v floats, each at t * stride from its pointer (they may share one row: the
 * convolution's output q | k | v). g and beta: (n, n_v_heads); o: (n, n_v_heads * head_v). */
struct kern_dn_seq {
    const float *q, *k, *v;
    int stride;
    const float *g, *beta;
    float *o;
    int n;
};

/* S: (n_v_heads, head_k, head_v), updated in place. Value heads are spread over tp (NULL: the caller). */
void kern_cpu_dn_recurrent(const struct kern_dn_seq *s, const struct kern_dn_dims *d, float *S,
                           struct tpool *tp);

/* Floats of workspace kern_cpu_dn_chunked needs for chunks of `chunk` tokens (one slice per value head, so
 * the result does not depend on which thread ran which head). */
size_t kern_cpu_dn_chunk_ws_floats(const struct kern_dn_dims *d, int chunk);
/* The same function as kern_cpu_dn_recurrent, chunk tokens at a time (chunk >= 1); ws holds
 * kern_cpu_dn_chunk_ws_floats(d, chunk) floats. */
void kern_cpu_dn_chunked(const struct kern_dn_seq *s, const struct kern_dn_dims *d, float *S, int chunk,
                         float *ws, struct tpool *tp);

/* y (n, channels) = silu(causal depthwise convolution of x (n, channels)) with weights w (channels, width),
 * the window of token t being the width - 1 inputs before it (from state at the start) and x_t itself;
 * state (width - 1, channels), oldest first, becomes the last width - 1 inputs. y may be x. */
void kern_cpu_dn_conv(float *y, const float *x, int n, int channels, const float *w, int width, float *state);

/* Each of the rows of d floats at x + r * stride: x / sqrt(sum x² + eps) (the L2 norm of flash-linear-
 * attention and transformers' Qwen3.5, eps 1e-6 there), then times scale. */
void kern_cpu_dn_l2norm(float *x, int rows, int d, int stride, float eps, float scale);

/* o (rows, d) = rmsnorm(o) * w * silu(z), z (rows, d): the output norm gated by z. */
void kern_cpu_dn_gated_norm(float *o, const float *z, const float *w, int rows, int d, float eps);

#endif
