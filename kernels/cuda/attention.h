/* attention (CUDA) — causal grouped-query attention over a paged f16 KV cache, on the GPU.
 *
 * The cache has the layout and block-table semantics of kernels/cpu/attention.h, with f16 elements:
 *   k, v: (n_blocks, block_size, n_kv_heads, head_dim) f16
 * Sequence s maps position p to block block_table[s*max_blocks + p/block_size], row p%block_size.
 * Token i of a batch belongs to seq[i] at position pos[i] and attends to positions 0..pos[i] of its sequence
 * (already stored with kern_cuda_rope_kv_store). Query head h uses KV head h / (n_heads/n_kv_heads).
 * One kernel serves both phases (FlashAttention-style: K/V tiles of 64 positions staged in shared memory,
 * online softmax in f32, the score matrix never materialised beyond one 16x64 tile):
 *   PREFILL: a block takes up to 16 query rows (consecutive tokens x the query heads of one KV head), so each
 *            K/V tile read from memory serves them all; tokens of different sequences in one tile are handled
 *            one run of equal seq at a time (correct for any batch, fastest when chunks are long).
 *   DECODE:  a block takes one token (its query heads of one or a few KV heads) and the KV range is split
 *            over blocks (flash-decoding); partial (max, sum, output) go to the workspace and the last block
 *            of each row to finish merges them with a log-sum-exp in split order (one launch in all). One
 *            long sequence fills the GPU. A dedicated kernel takes decode batches with head_dim/8 a power of
 *            two and at most 8 query heads per KV head; other shapes use the tile kernel, a token per tile.
 * Splits are also used in PREFILL when the grid would be too small. Deterministic: the only atomic is the
 * per-row arrival counter, and the merge order does not depend on it. Launched with programmatic dependent
 * launch (kernels/cuda/pdl.h).
 * All pointers are device memory except `kv` itself (a host struct holding device pointers).
 * The caller guarantees seq[i] < the rows of block_table and pos[i] < max_blocks*block_size with the blocks
 * present (the runtime's KV cache does); block ids outside [0, n_blocks) read as zeros instead of faulting.
 */
#ifndef FERRY_KERN_CUDA_ATTENTION_H
#define FERRY_KERN_CUDA_ATTENTION_H

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "kernels/core/rope.h"

struct kern_cuda_kv_layer {
    uint16_t *k; /* (n_blocks, block_size, n_kv_heads, head_dim) f16, 16-byte aligned */
    uint16_t *v; /* same shape */
    int n_blocks;
    int block_size;             /* positions per block */
    const int32_t *block_table; /* (n_seqs, max_blocks) block ids, device */
    int max_blocks;             /* blocks per sequence row of block_table */
    int n_kv_heads;
    int head_dim; /* a multiple of 8, at most 256 */
};

enum kern_cuda_attn_mode { KERN_ATTN_AUTO = 0, KERN_ATTN_PREFILL = 1, KERN_ATTN_DECODE = 2 };

/* The step after the fused q/k/v projection: qkv (m, (n_heads + 2*n_kv_heads)*head_dim) f32 holds each token's
 * query, key and value heads in that order. Queries and keys are rotated at pos[i] (the first rope_dim dims of
 * each head, pairs and angles exactly as kern_cuda_rope), the queries written to q_out (m, n_heads*head_dim)
 * f32, and the keys and values, rounded to f16, to the cache rows of (seq[i], pos[i]). A (seq, pos) whose block
 * id is outside [0, n_blocks) is skipped on the device (the caller checks). inv_freq (rope_dim/2) on the device. */
int kern_cuda_rope_kv_store(float *q_out, const float *qkv, const struct kern_cuda_kv_layer *kv,
                            const int32_t *seq, const int32_t *pos, int m, int n_heads, int rope_dim,
                            const float *inv_freq, enum rope_style style, cudaStream_t stream);

/* Workspace bytes kern_cuda_attention uses at most for any batch of up to m tokens (so one workspace sized
 * for the largest batch also gives a one-token decode all its splits); max_len = 1 + the largest pos.
 * The workspace must be zero-filled once before its first use (cudaMemset at init): its first 16 KB hold
 * the splits' arrival counters, which every call leaves at 0 again, so it can then be reused by any number
 * of calls and CUDA-graph replays on one stream. Calls that may run at the same time need separate
 * workspaces. */
size_t kern_cuda_attention_ws_size(int m, int n_heads, int head_dim, int max_len);

/* out (m, n_heads*head_dim) f32 = softmax(q kᵀ * scale) v per token and head; q (m, n_heads, head_dim) f32.
 * max_len: 1 + the largest pos[i] in the batch (the host knows it); it sizes the KV split only, so a wrong
 * value costs speed, not correctness (<= 0: max_blocks*block_size). ws/ws_bytes: device workspace for the
 * split partials; with less than kern_cuda_attention_ws_size() fewer splits are used (none when ws is NULL).
 * AUTO picks DECODE for m <= 16 and PREFILL otherwise. */
int kern_cuda_attention(float *out, const float *q, const struct kern_cuda_kv_layer *kv, const int32_t *seq,
                        const int32_t *pos, int m, int n_heads, float scale, int max_len,
                        enum kern_cuda_attn_mode mode, void *ws, size_t ws_bytes, cudaStream_t stream);

/* Tuning hook for tests and benches: K/V tile buffers per block, 1 (copy, wait, compute; the default) or 2
 * (the next tile's copy overlaps the current tile's math, but twice the shared memory: slower on the H200,
 * see kernels/cuda/NOTES.md). Any other value selects the default. Not thread-safe: call it before launching
 * work. */
void kern_cuda_attention_set_stages(int stages);

/* Tuning hook for tests and benches: KV heads per block of the decode kernel (1, the default; 2, 4 or 8 when
 * n_kv_heads and head_dim allow, else 1), or -1 to send decode batches to the tile kernel as before. Any
 * other value selects the default. Not thread-safe: call it before launching work. */
void kern_cuda_attention_set_decode_heads(int heads);

#ifdef __cplusplus
}
#endif

#endif
