/* attention — causal grouped-query attention over a paged KV cache, on the CPU; f32 arithmetic over K/V
 * stored in f32 or f16.
 *
 * The cache of one layer is a pool of blocks; a block holds `block_size` consecutive positions of one
 * sequence, each position a row of n_kv_heads*head_dim elements for K and the same for V:
 *   k, v: (n_blocks, block_size, n_kv_heads, head_dim) f32, or IEEE f16 (half the bytes each step reads:
 *   at long contexts decode reads more K/V than weights)
 * Sequence s maps logical position p to block block_table[s*max_blocks + p/block_size], row p%block_size.
 * A batch mixes tokens of many sequences (prefill chunks and decode tokens): token i belongs to seq[i] at
 * position pos[i] and attends to positions 0..pos[i] of its sequence, which must already be stored (the
 * runtime stores the batch's K/V before calling attention). Query head h uses KV head h / (n_heads/n_kv_heads).
 * Softmax is computed online (running max and sum), never materialising a score matrix larger than one row.
 */
#ifndef FERRY_KERN_CPU_ATTENTION_H
#define FERRY_KERN_CPU_ATTENTION_H

#include <stdint.h>

struct tpool;

struct kv_layer_view {
    void *k;                    /* (n_blocks, block_size, n_kv_heads, head_dim) f32, or f16 (uint16_t) */
    void *v;                    /* same shape */
    int n_blocks;
    int block_size;             /* positions per block */
    const int32_t *block_table; /* (n_seqs, max_blocks) block ids */
    int max_blocks;             /* blocks per sequence row of block_table */
    int n_kv_heads;
    int head_dim;
    int f16; /* elements are f16 (else f32) */
};

/* Writes k_new/v_new (m, n_kv_heads*head_dim) f32 to the cache rows of (seq[i], pos[i]) (rounded to nearest
 * when the cache is f16). */
void kern_cpu_kv_store(const struct kv_layer_view *kv, const float *k_new, const float *v_new,
                       const int32_t *seq, const int32_t *pos, int m);

/* out (m, n_heads*head_dim) = softmax(q kᵀ * scale) v per token and head; q (m, n_heads, head_dim).
 * Returns FERRY_OK, or FERRY_ERR_NOMEM when its small per-call workspace cannot be had (out is then unwritten). */
int kern_cpu_attention(float *out, const float *q, const struct kv_layer_view *kv, const int32_t *seq,
                        const int32_t *pos, int m, int n_heads, float scale, struct tpool *tp);
/* Reference: two-pass softmax in double, over the values as stored. */
void kern_cpu_attention_ref(float *out, const float *q, const struct kv_layer_view *kv, const int32_t *seq,
                            const int32_t *pos, int m, int n_heads, float scale);

#endif
