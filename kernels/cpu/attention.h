/* attention — causal grouped-query attention over a paged KV cache, on the CPU; f32 arithmetic over K/V
 * stored in f32, f16 or Q8_0 blocks.
 *
 * The cache of one layer is a pool of blocks; a block holds `block_size` consecutive positions of one
 * sequence, each position a row of n_kv_heads*head_dim elements for K and the same for V:
 *   k, v: (n_blocks, block_size, n_kv_heads, head_dim) f32, IEEE f16 or Q8_0 blocks (half and 17/64 of the
 *   f32 bytes each step reads: at long contexts decode reads more K/V than weights)
 * Sequence s maps logical position p to block block_table[s*max_blocks + p/block_size], row p%block_size.
 * A batch mixes tokens of many sequences (prefill chunks and decode tokens): token i belongs to seq[i] at
 * position pos[i] and attends to positions 0..pos[i] of its sequence, which must already be stored (the
 * runtime stores the batch's K/V before calling attention). Query head h uses KV head h /
 * (n_heads/n_kv_heads). Softmax is computed online (running max and sum), never materialising a score matrix
 * larger than one row.
 */
#ifndef FERRY_KERN_CPU_ATTENTION_H
#define FERRY_KERN_CPU_ATTENTION_H

#include <stddef.h>
#include <stdint.h>

#include "quant/blocks.h"

struct tpool;

/* How a K/V element is stored. Q8_0: llama.cpp's blocks of 32 elements (an f16 scale and 32 int8 codes, 34
 * bytes), the elements of a row in order (head_dim a multiple of 32, so each head starts a block).
 * Q8_0_PLANES: the same blocks split in two planes, as the GPU's cache holds them (kernels/cuda/attention.h):
 * k/v hold the int8 codes, one per element in element order, and k_scale/v_scale the f16 scale of each run of
 * 32 (element i's scale at index i / 32); the values are bitwise those of Q8_0. */
enum kv_elem { KV_F32 = 0, KV_F16 = 1, KV_Q8_0 = 2, KV_Q8_0_PLANES = 3 };

/* Bytes of n elements (n a multiple of 32 for Q8_0; both planes together for Q8_0_PLANES). */
static inline size_t kv_elem_bytes(enum kv_elem e, size_t n)
{
    return e == KV_F32 ? 4 * n : e == KV_F16 ? 2 * n : n / QK8_0 * sizeof(struct block_q8_0);
}

struct kv_layer_view {
    void *k; /* (n_blocks, block_size, n_kv_heads, head_dim) elements of type elem */
    void *v; /* same shape */
    int n_blocks;
    int block_size;             /* positions per block */
    const int32_t *block_table; /* (n_seqs, max_blocks) block ids */
    int max_blocks;             /* blocks per sequence row of block_table */
    int n_kv_heads;
    int head_dim;
    int elem; /* enum kv_elem */
    /* k and v hold blocks [block_base, ...): block id b is at index b - block_base (0 for a whole pool; the
     * GPU backend's host-memory extension, whose first block is the device pool's n_blocks - n_ext). */
    int block_base;
    /* KV_Q8_0_PLANES: the scales, (n_blocks - block_base, block_size, n_kv_heads, head_dim / 32) f16 (k/v
     * then hold the codes, int8 of the elements' shape); unused otherwise. */
    uint16_t *k_scale, *v_scale;
};

/* Writes k_new/v_new (m, n_kv_heads*head_dim) f32 to the cache rows of (seq[i], pos[i]) (rounded to nearest
 * when the cache is f16, quantized as llama.cpp's quantize_row_q8_0 when Q8_0). */
void kern_cpu_kv_store(const struct kv_layer_view *kv, const float *k_new, const float *v_new,
                       const int32_t *seq, const int32_t *pos, int m);

/* out (m, n_heads*head_dim) = softmax(q kᵀ * scale) v per token and head; q (m, n_heads, head_dim).
 * Returns FERRY_OK, or FERRY_ERR_NOMEM when its small per-call workspace cannot be had (out is then
 * unwritten). */
int kern_cpu_attention(float *out, const float *q, const struct kv_layer_view *kv, const int32_t *seq,
                       const int32_t *pos, int m, int n_heads, float scale, struct tpool *tp);
/* The same over positions lo[i]..pos[i] only, with lse (m, n_heads) = log Σ exp(score) over them (natural
 * log, scores scaled): a partial attention that merges with another over the other positions of the row by
 * o = (o₁ e^(lse₁ - M) + o₂ e^(lse₂ - M)) / (e^(lse₁ - M) + e^(lse₂ - M)). A row with lo[i] > pos[i] gets
 * out 0 and lse -inf. Only the blocks of positions [lo[i], pos[i]] are read. Deterministic for given
 * (lo[i], pos[i]), as kern_cpu_attention (lo all 0 gives its out bitwise). FERRY_OK or FERRY_ERR_NOMEM. */
int kern_cpu_attention_range(float *out, float *lse, const float *q, const struct kv_layer_view *kv,
                             const int32_t *seq, const int32_t *lo, const int32_t *pos, int m, int n_heads,
                             float scale, struct tpool *tp);
/* Attention sinks (gpt-oss): each head's softmax denominator also counts e^sinks[h], a learned logit that
 * takes probability mass and contributes no value. Applied to the output of kern_cpu_attention_range with
 * its lse (m, n_heads): out (m, n_heads, head_dim) *= 1 / (1 + e^(sinks[h] - lse)), in place; a row that
 * attended to nothing (lse -inf) stays 0. sinks (n_heads) f32. */
void kern_cpu_attention_sinks(float *out, const float *lse, const float *sinks, int m, int n_heads,
                              int head_dim);
/* Its reference: attention over positions lo[i]..pos[i] (lo NULL: from 0) with the sinks (NULL: none),
 * two-pass softmax in double; kern_cpu_attention_ref is it without either. */
void kern_cpu_attention_sinks_ref(float *out, const float *q, const struct kv_layer_view *kv,
                                  const int32_t *seq, const int32_t *lo, const int32_t *pos,
                                  const float *sinks, int m, int n_heads, float scale);
/* Reference: two-pass softmax in double, over the values as stored. */
void kern_cpu_attention_ref(float *out, const float *q, const struct kv_layer_view *kv, const int32_t *seq,
                            const int32_t *pos, int m, int n_heads, float scale);

#endif
