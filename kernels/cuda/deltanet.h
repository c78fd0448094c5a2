/* deltanet (CUDA) — the gated DeltaNet linear attention's ops on the device, for a batch of rows of many
 * sequences at once: kernels/cpu/deltanet.h's functions (the oracle), the same math in the same order.
 *
 * A step's rows may mix sequences in any order; the rows of one sequence are its consecutive tokens, in row
 * order. kern_cuda_dn_plan links them on the device from the step's seq and pos arrays (nothing comes back
 * to the host, so a captured graph replays it): per row its previous and next row of the same sequence and
 * whether that sequence starts at position 0 here (its state then reads as zero, as LOP_DELTANET zeroes it).
 * Each slot's state of one layer lies at a fixed stride from a base (struct kern_cuda_dn_state), laid out as
 * runtime/seq_state.h lays it out on the host: conv (width - 1, channels) oldest first, rule (n_v_heads,
 * head_k, head_v). The rule runs one block per (first row of a sequence, value head, tile of 32 value
 * columns) that walks the sequence's rows in order with its slice of the state in registers: the per-token
 * recurrence of kern_cpu_dn_recurrent, for decode (one row per sequence) and prefill alike. All calls are
 * asynchronous on `stream`, allocate nothing and check their arguments (FERRY_ERR_INVALID).
 */
#ifndef FERRY_KERN_CUDA_DELTANET_H
#define FERRY_KERN_CUDA_DELTANET_H

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

#define KERN_CUDA_DN_MAX_HEAD_K 256 /* the rule keeps head_k / 8 state values per thread in registers */
#define KERN_CUDA_DN_MAX_WIDTH  8   /* convolution width */
#define KERN_CUDA_DN_MAX_ROWS   (1 << 20)

/* Each slot's state of one recurrent layer: slot s's convolution state (width - 1, channels) at conv + s *
 * stride and its rule state (n_v_heads, head_k, head_v) at rec + s * stride, floats on the device (n_slots
 * the plan's). */
struct kern_cuda_dn_state {
    float *conv, *rec;
    size_t stride; /* floats from one slot's state to the next's */
    int n_slots;   /* the plan's */
};

/* Plan words for n rows: kern_cuda_dn_plan's output size in int32. */
#define KERN_CUDA_DN_PLAN_WORDS(n) (4 * (size_t)(n) + 1)
/* plan (KERN_CUDA_DN_PLAN_WORDS(n)) int32 on the device, from seq and pos (n) on the device: per row i its
 * sequence's previous row (-1: none), next row (-1: none) and 1 when that sequence's first row in the step
 * has position 0 (-1 when seq is outside [0, n_slots)); then the first rows of the sequences with seq in [0,
 * n_slots), in row order, and their count. Every other call reads it; rows whose seq is outside [0, n_slots)
 * are skipped by all of them (no state touched, outputs left unwritten: the caller checks seq). */
int kern_cuda_dn_plan(int32_t *plan, const int32_t *seq, const int32_t *pos, int n, int n_slots,
                      cudaStream_t stream);

/* y (n, channels) = silu(the causal depthwise convolution of x) with weights w (channels, width) f32, the
 * window of row i being its sequence's width - 1 inputs before it (earlier rows of the step, then the slot's
 * convolution state) and x_i; then each sequence's state becomes its last width - 1 inputs
 * (kern_cpu_dn_conv). x: n rows of channels floats at stride ldx; y must not overlap x. */
int kern_cuda_dn_conv(float *y, const float *x, int ldx, int n, int channels, const float *w, int width,
                      const struct kern_cuda_dn_state *st, const int32_t *seq, const int32_t *plan,
                      cudaStream_t stream);

/* In place on n rows at stride ld: the first n_k_heads heads of head_k floats (queries) become x / sqrt(sum
 * x² + eps) * q_scale, the next n_k_heads (keys) x / sqrt(sum x² + eps) (kern_cpu_dn_l2norm). */
int kern_cuda_dn_qk_l2norm(float *x, int ld, int n, int n_k_heads, int head_k, float eps, float q_scale,
                           cudaStream_t stream);

/* The gated delta rule over the step's rows. x: n rows at stride ldx of queries (n_k_heads, head_k), keys
 * (same) and values (n_v_heads, head_v) one after the other (the normed convolution output); value head j
 * reads query/key head j % n_k_heads. The gates come raw from the in-products: braw, araw (n rows at stride
 * ldb, lda of n_v_heads floats); rate beta = sigmoid(b), decay g = A[j] * softplus(a + dt[j]) (softplus as
 * torch's: x past 20 stays x), A = -exp(A_log), dt (n_v_heads) f32. o: n rows at stride ldo of (n_v_heads,
 * head_v). Each slot's state advances over its rows (zeroed first where the plan says so). Token by token
 * is the recurrence itself (decode steps); by chunks, a sequence's rows go 16 at a time through small matrix
 * products (prefill steps: fewer synchronisations per token), equal to it within f32 rounding. */
struct kern_cuda_dn_rule {
    int n_k_heads, n_v_heads, head_k, head_v;
    const float *x, *braw, *araw, *A, *dt;
    int ldx, ldb, lda, ldo;
    float *o;
    int chunked; /* 0: token by token; 1: by chunks of 16 tokens (kern_cpu_dn_chunked's form) */
};
int kern_cuda_dn_rule(const struct kern_cuda_dn_rule *r, int n, const struct kern_cuda_dn_state *st,
                      const int32_t *seq, const int32_t *plan, cudaStream_t stream);

/* y (n, n_heads * d) = rmsnorm(o) * w * silu(z) per head of d floats (kern_cpu_dn_gated_norm); o (n, n_heads
 * * d) contiguous, z n rows at stride ldz, w (d). y may be o. */
int kern_cuda_dn_gated_norm(float *y, const float *o, const float *z, int ldz, const float *w, int n,
                            int n_heads, int d, float eps, cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif
