/* attention (CUDA) — causal grouped-query attention over a paged f16 or Q8_0 KV cache, on the GPU.
 *
 * The cache has the layout and block-table semantics of kernels/cpu/attention.h, with f16 elements:
 *   k, v: (n_blocks, block_size, n_kv_heads, head_dim) f16
 * or, with q8 set, llama.cpp's Q8_0 blocks of 32 elements split into two planes, so that every row's codes
 * stay 8-byte aligned for the copies (the CPU cache keeps the blocks whole):
 *   k, v: (n_blocks, block_size, n_kv_heads, head_dim) int8 codes
 *   k_scale, v_scale: (n_blocks, block_size, n_kv_heads, head_dim / 32) f16 scales; element = code x scale
 * (head_dim a multiple of 64; an extension in host memory has both planes too). The decode kernel multiplies
 * code by scale in f32; the tile and tensor-core kernels round the product to f16 as they fill their shared
 * K/V tiles (plain loads where f16 rows are copied with cp.async). Sequence s maps position p to block
 * block_table[s*max_blocks + p/block_size], row p%block_size. Token i of a batch belongs to seq[i] at
 * position pos[i] and attends to positions 0..pos[i] of its sequence (already stored with
 * kern_cuda_rope_kv_store). Query head h uses KV head h / (n_heads/n_kv_heads). Every kernel is correct for
 * any batch; which rows go where is a matter of speed only. Three kernels: PREFILL (head_dim 64 and 128):
 * tensor cores, FlashAttention-2 style. A block takes a window of consecutive batch rows (tokens x the query
 * heads of one KV head, 64 rows), one run of equal seq at a time, and walks K/V tiles of 64 positions of the
 * run's sequence: S = Q Kᵀ and O += P V with mma.sync m16n8k16 (f16 in, f32 accumulate), online softmax in
 * f32, causal mask by position. Q is rounded to f16 (after scaling by scale * log2 e) and P to f16 for the
 * second product, so results differ from an f32 computation by ~1e-4 relative (tests: max abs error 2e-3,
 * tensor relative error 1e-3, for |v| <= 1). PREFILL (other head_dims) and decode shapes the decode kernel
 * does not take: a SIMT tile kernel (16 rows, K/V tiles staged in shared memory, f32 math). DECODE:  a block
 * takes one token (its query heads of one or a few KV heads) and the KV range is split over blocks
 * (flash-decoding; a sliding-window layer's window alone, once it is full, so that a row deep in its sequence
 * still spreads over every split); partial (max, sum, output) go to the workspace and the last block of each
 * row to finish merges them with a log-sum-exp in split order (one launch in all). One long sequence fills
 * the GPU. It takes decode batches with head_dim/8 a power of two up to 256 and at most 8 query heads per KV
 * head; other shapes (heads of 264..512 dims among them: Gemma 4's global layers) use the tile kernel, a
 * token per tile. Attention sinks (kern_cuda_kv_layer.sinks) enter wherever a kernel normalises a row. A
 * mixed batch (decode tokens of many sequences plus prefill chunks, which may start at any position) is two
 * launches on the stream, no host synchronisation: decode rows through the decode kernel, chunk rows through
 * the prefill kernel (kern_cuda_attention_mixed, or AUTO, which decides per row on the device). Splits are
 * also used in PREFILL when the grid would be too small. Deterministic: the only atomic is the per-row
 * arrival counter, and the merge order does not depend on it. Launched with programmatic dependent launch
 * (kernels/cuda/pdl.h). All pointers are device memory except `kv` itself (a host struct holding device
 * pointers). The caller guarantees seq[i] < the rows of block_table and pos[i] < max_blocks*block_size with
 * the blocks present (the runtime's KV cache does); block ids outside [0, n_blocks) read as zeros instead of
 * faulting.
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
    void *k; /* (n_blocks - n_ext, block_size, n_kv_heads, head_dim) f16 (or int8 codes), 16-byte aligned */
    void *v; /* same shape */
    int n_blocks;
    int block_size;             /* positions per block */
    const int32_t *block_table; /* (n_seqs, max_blocks) block ids, device */
    int max_blocks;             /* blocks per sequence row of block_table */
    int n_kv_heads;
    int head_dim; /* a multiple of 8, at most 512 (above 256: the tile kernel with one K/V stage, 166 KB of
                   * shared memory per block, which sm_90 and sm_100 give and sm_80 (163 KB) and sm_86/89
                   * do not: there FERRY_ERR_UNSUPPORTED, kern_cuda_attention_supports) */
    /* The pool's extension: blocks [n_blocks - n_ext, n_blocks) live at k_ext/v_ext (index id - (n_blocks -
     * n_ext)), in memory the device reaches over the link (pinned, mapped host memory: runtime/NOTES.md).
     * n_ext 0: none (k_ext/v_ext unused). */
    void *k_ext, *v_ext; /* (n_ext, block_size, n_kv_heads, head_dim) f16 (or int8 codes), 16-byte aligned */
    int n_ext;
    int q8; /* 0: f16 elements; 1: Q8_0, the codes in k/v and their scales in k_scale/v_scale */
    uint16_t *k_scale,
        *v_scale; /* q8: (n_blocks - n_ext, block_size, n_kv_heads, head_dim / 32) f16, 4-byte aligned */
    uint16_t *k_ext_scale, *v_ext_scale; /* q8 with an extension: its scales, (n_ext, ...) as k_scale */
    int window; /* sliding-window layers: a row at pos attends to positions (pos - window, pos] only; 0: all
                 */
    /* Attention sinks (gpt-oss): (n_heads) f32 on the device, each query head's learned logit, which joins
     * its softmax's denominator with no value: out = Σ e^s v / (Σ e^s + e^sink), as llama.cpp's soft_max_ext
     * and flash-attention sinks (a row that attends to no position gets 0). NULL: none. Every kernel applies
     * it where it normalises a row (its own write-out or the split merge), so it costs nothing per position;
     * not with an lse output (kern_cuda_attention_mixed: FERRY_ERR_INVALID). */
    const float *sinks;
};

enum kern_cuda_attn_mode { KERN_ATTN_AUTO = 0, KERN_ATTN_PREFILL = 1, KERN_ATTN_DECODE = 2 };

/* The queries' scaling after rotation, as the CPU's kern_cpu_q_scale applies it: the first rope_dim dims of
 * each query head times rot (llm_rope_q_scale: LongRoPE's attention factor squared with partial rotary),
 * then every dim of a row at pos times 1 + temp_beta · ln(1 + floor(pos / temp_len)) (llm_attn_temp:
 * Mistral 3's attention temperature). rot 1 and temp_beta 0 skip the multiplies, so a model without them
 * gets bitwise the plain rotation. Keys are never scaled. */
struct kern_cuda_q_scale {
    float rot;       /* finite */
    float temp_beta; /* 0: no temperature */
    int temp_len;    /* positions of the original context; > 0 when temp_beta != 0 */
};
#define KERN_CUDA_Q_SCALE_NONE ((struct kern_cuda_q_scale){1.0f, 0.0f, 0})

/* The step after the fused q/k/v projection: qkv (m, (n_heads + 2*n_kv_heads)*head_dim) f32 holds each
 * token's query, key and value heads in that order. Queries and keys are rotated at pos[i] (the first
 * rope_dim dims of each head, pairs and angles exactly as kern_cuda_rope), the queries written to q_out (m,
 * n_heads*head_dim) f32, and the keys and values, rounded to f16 (or quantized to Q8_0 as llama.cpp's
 * quantize_row_q8_0_ref: d = max|x| / 127 in f32, code = round(x · (1/d)), the scale d rounded to f16), to
 * the cache rows of (seq[i], pos[i]). A (seq, pos) whose block id is outside [0, n_blocks) is skipped on the
 * device (the caller checks). inv_freq (rope_dim/2) on the device. The queries are scaled by qs. */
int kern_cuda_rope_kv_store(float *q_out, const float *qkv, const struct kern_cuda_kv_layer *kv,
                            const int32_t *seq, const int32_t *pos, int m, int n_heads, int rope_dim,
                            const float *inv_freq, enum rope_style style, struct kern_cuda_q_scale qs,
                            cudaStream_t stream);

/* FERRY_OK when this device's kernels take heads of head_dim (a multiple of 8 up to 512; above 256 only
 * where a block may have 166 KB of shared memory), else FERRY_ERR_UNSUPPORTED. */
int kern_cuda_attention_supports(int head_dim);

/* The queries alone (a layer that reads another layer's K/V and stores none): q (m, n_heads*head_dim) f32
 * rotated at pos[i] and scaled by qs into q_out (same shape; may not alias q) as kern_cuda_rope_kv_store
 * rotates and scales them. */
int kern_cuda_rope_q(float *q_out, const float *q, const int32_t *pos, int m, int n_heads, int head_dim,
                     int rope_dim, const float *inv_freq, enum rope_style style, struct kern_cuda_q_scale qs,
                     cudaStream_t stream);

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
 * DECODE: every row through the decode path. PREFILL: every row through the prefill kernel (rows of one
 * sequence next to each other share K/V tiles). AUTO: m <= 16: as DECODE (one launch; decode steps captured
 * as graphs stay one launch per layer); larger batches: a row whose neighbours (i-1, i+1) belong to other
 * sequences is a decode token and goes to the decode path, every other row to the prefill kernel (as
 * kern_cuda_attention_mixed, but the split is found on the device: each launch's grid covers all m rows and
 * skips the others' rows, which costs a few microseconds of empty blocks when the host could say it). */
int kern_cuda_attention(float *out, const float *q, const struct kern_cuda_kv_layer *kv, const int32_t *seq,
                        const int32_t *pos, int m, int n_heads, float scale, int max_len,
                        enum kern_cuda_attn_mode mode, void *ws, size_t ws_bytes, cudaStream_t stream);

/* A mixed batch whose rows [0, n_decode) are decode tokens (one row each, any sequences) and rows
 * [n_decode, m) prefill chunks (runs of consecutive rows of one sequence, any start position): the first
 * through the decode path with exactly the launch a decode-only batch of n_decode rows gets, the rest through
 * the prefill kernel; two launches on `stream`, the second waiting for the first on the device. Every row is
 * computed correctly whatever n_decode says (it only routes rows); the arguments are those of
 * kern_cuda_attention, 0 <= n_decode <= m. The scheduler builds its batches in this order (decode tokens,
 * then chunks), so the runtime can pass the number of leading rows whose sequence appears once. */
/* lse: NULL, or (m, n_heads) f32 on the device that gets each row's natural log Σ exp(score) over the
 * positions it attended to (-inf for none, with out 0): the row's part of an attention whose other positions
 * another device computed (kern_cuda_attention_merge). */
int kern_cuda_attention_mixed(float *out, float *lse, const float *q, const struct kern_cuda_kv_layer *kv,
                              const int32_t *seq, const int32_t *pos, int m, int n_decode, int n_heads,
                              float scale, int max_len, void *ws, size_t ws_bytes, cudaStream_t stream);

/* Two partial attentions of the same n_rows rows (token x head, head_dim each) over disjoint positions, each
 * normalised over its own positions with its log-sum-exp: out = (out e^(lse - M) + o2 e^(lse2 - M)) /
 * (e^(lse - M) + e^(lse2 - M)), M the larger (0 where both are -inf). All device pointers. */
int kern_cuda_attention_merge(float *out, const float *lse, const float *o2, const float *lse2, int n_rows,
                              int head_dim, cudaStream_t stream);

/* Tuning hook for tests and benches: K/V tile buffers per block, 1 (copy, wait, compute; the default) or 2
 * (the next tile's copy overlaps the current tile's math, but twice the shared memory: slower on the H200,
 * see kernels/cuda/NOTES.md). Any other value selects the default. Not thread-safe: call it before launching
 * work. */
void kern_cuda_attention_set_stages(int stages);

/* Tuning hook for tests and benches: KV heads per block of the decode kernel (1, the default; 2, 4 or 8 when
 * n_kv_heads and head_dim allow, else 1), or -1 to send decode batches to the tile kernel as before. Any
 * other value selects the default. Not thread-safe: call it before launching work. */
void kern_cuda_attention_set_decode_heads(int heads);

/* Tuning hook for tests and benches: 0 sends prefill rows to the SIMT tile kernel as before the tensor-core
 * kernel existed; anything else (the default) to the tensor-core kernel where the head_dim allows. Not
 * thread-safe: call it before launching work. */
void kern_cuda_attention_set_prefill_mma(int on);

/* Test hook, no GPU needed: the host audit of the tensor-core prefill kernel. It makes the launch plan that
 * kern_cuda_attention would make for the batch and runs every block's and thread's index arithmetic on the
 * CPU with the kernel's own functions, checking: global accesses in bounds and aligned; shared accesses
 * inside the layout piece they mean, aligned, and free of races between barriers (cp.async copies included);
 * the K/V rows each warp reads holding the positions the math assumes; every (row, position <= pos) seen once
 * over the splits; every output element routed to the kernel written once (directly or by the split merge,
 * from partials written in the same launch); the arrival counters back at 0. */
struct kern_cuda_attn_audit {
    int n_decode;        /* -1: rows routed as AUTO does (rows alone among their neighbours go to the decode
                            path); else rows [n_decode, m), as kern_cuda_attention_mixed (0: PREFILL) */
    size_t ws_bytes;     /* the call's workspace */
    int sms, occ;        /* the device the plan is for: SMs, resident blocks of the kernel per SM */
    int n_split;         /* out: the plan's splits */
    long long n_checked; /* out: accesses checked */
    char err[256];       /* out: the first violation (block (x,y,z), tile start, thread; thread -2: an access
                            made by several threads, as a warp's ldmatrix) */
};

/* kv: the layer's shape, with block_table a host array of n_seqs rows (k and v are not read); seq, pos (m)
 * on the host. FERRY_OK, FERRY_ERR_UNSUPPORTED (head_dim not 64 or 128), FERRY_ERR_INVALID (bad arguments,
 * a seq outside the table or a pos outside it), FERRY_ERR_INTERNAL with the first violation in a->err. */
int kern_cuda_attention_mma_audit(const struct kern_cuda_kv_layer *kv, int n_seqs, const int32_t *seq,
                                  const int32_t *pos, int m, int n_heads, int max_len,
                                  struct kern_cuda_attn_audit *a);

#ifdef __cplusplus
}
#endif

#endif
