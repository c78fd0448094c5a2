/* moe — the Mixture-of-Experts FFN on the host: the router's top-k choice and the experts' SwiGLU products.
 *
 * Routing (kern_cpu_moe_route): per token, softmax over the router's logits (n_expert), the k largest
 * probabilities (ties broken by the lowest expert id), and as weights either those probabilities or, with
 * norm, the probabilities divided by their sum (Qwen3-MoE's norm_topk_prob, Mixtral). torch.topk does not
 * promise an order among equal values (on the CPU, topk([0.3, 0.2, 0.3, 0.2, 0.3], 2) returns ids 2 and 4,
 * and topk of 8 equal values returns 6, 5, 4 for k = 3, as measured with torch 2.15); exact ties between
 * softmax outputs of real activations do not occur in practice, so ferry fixes the lowest id, the order
 * llama.cpp's stable argsort also gives.
 * Experts (kern_cpu_moe_ffn): for each expert, the rows of the tokens routed to it are gathered, multiplied
 * by its gate and up matrices (kern_cpu_matmul, any stored type), silu(gate)·up by its down matrix, and the
 * result scatter-added into y weighted by the token's routing weight. An expert no token chose costs nothing.
 * All of a call's experts share three pool dispatches: gate|up by (expert, stretch of rows), down by
 * (expert, stretch of rows), then y by stretches of columns, each token's terms added in ascending expert id;
 * the products run in the calling thread's arithmetic (kern_cpu_matmul_set_act), and the result is bitwise
 * the same whatever the pool size, and in the int8 arithmetic the same as one token at a time.
 * gpt-oss adds biases to each product and gates with its clamped SwiGLU; its router (softmax over the top-k
 * logits) is this softmax's top-k with norm: e^l_i / Σ_topk e^l_j either way.
 * kern_cpu_moe_ref is the plain per-token reference over f32 weights.
 * Shared expert (kern_cpu_moe_shared; Qwen3.5-MoE, Qwen2-MoE): one more SwiGLU FFN every token runs, its
 * output scaled by sigmoid(x · gate_inp) and added to the routed experts' sum.
 */
#ifndef FERRY_KERN_CPU_MOE_H
#define FERRY_KERN_CPU_MOE_H

#include <stddef.h>
#include <stdint.h>

#include "quant/dtype.h"

struct tpool;

/* ids, wts: (n, k) expert ids and weights of each token, in descending probability. logits (n, n_expert) is
 * left unchanged. FERRY_ERR_INVALID for k outside 1..n_expert or n <= 0. */
int kern_cpu_moe_route(const float *logits, int n, int n_expert, int k, int norm, int32_t *ids, float *wts);

/* The experts' activation: silu(gate) * up, or gpt-oss's clamped SwiGLU (kern_cpu_swiglu_clamped). */
enum kern_cpu_moe_act { KERN_CPU_MOE_SILU = 0, KERN_CPU_MOE_SWIGLU_CLAMPED = 1 };

/* The experts of one layer, stacked: expert e's gate and up are rows [e*ffn, (e+1)*ffn) of (n_expert*ffn,
 * dim) matrices, its down rows [e*dim, (e+1)*dim) of an (n_expert*dim, ffn) matrix. The fields after ffn
 * are zero in the SiLU families (no biases). */
struct kern_cpu_moe_experts {
    const void *gate, *up, *down;
    enum dtype gate_t, up_t, down_t;
    int n_expert, dim, ffn;
    const float *gate_b, *up_b; /* (n_expert, ffn) f32 biases of gate and up, or NULL */
    const float *down_b;        /* (n_expert, dim) f32, added before the routing weight, or NULL */
    enum kern_cpu_moe_act act;
    float alpha, limit; /* KERN_CPU_MOE_SWIGLU_CLAMPED's sigmoid gain and clamp */
};

/* Floats of workspace kern_cpu_moe_ffn needs for n tokens (its scratch, which depends on k, is the calling
 * thread's own buffer: about n·k·(2·dim + ffn) floats, kept for the thread's later calls). */
size_t kern_cpu_moe_ws_floats(const struct kern_cpu_moe_experts *ex, int n);
/* y (n, dim) = sum over each token's k experts of wts · down(silu(gate x) · up x); x (n, dim). ws holds
 * kern_cpu_moe_ws_floats floats. FERRY_ERR_RANGE for an expert id
 * outside 0..n_expert-1, FERRY_ERR_NOMEM when the scratch cannot grow. */
int kern_cpu_moe_ffn(float *y, const float *x, const int32_t *ids, const float *wts, int n, int k,
                     const struct kern_cpu_moe_experts *ex, float *ws, struct tpool *tp);
/* The reference: the same with f32 stacked weights, token by token, in double sums. */
int kern_cpu_moe_ref(float *y, const float *x, const int32_t *ids, const float *wts, int n, int k,
                     const float *gate, const float *up, const float *down, int n_expert, int dim, int ffn);
/* The reference with ex's biases and activation (ex's gate/up/down must be F32), token by token: the
 * products in double sums, the activation in double. */
int kern_cpu_moe_ref_ex(float *y, const float *x, const int32_t *ids, const float *wts, int n, int k,
                        const struct kern_cpu_moe_experts *ex);

/* A shared expert: gate and up (ffn, dim), down (dim, ffn) in any stored type; gate_inp (dim) f32, the
 * logit of its sigmoid gate, or NULL for an ungated shared expert. */
struct kern_cpu_moe_shared {
    const void *gate, *up, *down;
    enum dtype gate_t, up_t, down_t;
    int dim, ffn;
    const float *gate_inp;
};

/* Floats of workspace kern_cpu_moe_shared needs for n tokens. */
size_t kern_cpu_moe_shared_ws_floats(const struct kern_cpu_moe_shared *sh, int n);
/* y (n, dim) += sigmoid(x · gate_inp) · down(silu(gate x) · up x) per token; x (n, dim). ws holds
 * kern_cpu_moe_shared_ws_floats floats. FERRY_ERR_INVALID for n <= 0. */
int kern_cpu_moe_shared(float *y, const float *x, int n, const struct kern_cpu_moe_shared *sh, float *ws,
                        struct tpool *tp);
/* The reference (sh's matrices F32), token by token in double sums. */
int kern_cpu_moe_shared_ref(float *y, const float *x, int n, const struct kern_cpu_moe_shared *sh);

#endif
