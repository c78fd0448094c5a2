/* kv_cache — a paged KV cache: one pool of fixed-size blocks shared by all sequence slots.
 *
 * Layout per layer: k, v (n_blocks, block_size, n_kv_heads, head_dim), f32, f16 or Q8_0 blocks (enum kv_elem)
 * in host memory for the CPU backend; a GPU backend keeps its own f16 copy of that layout on the device and
 * uses only the tables (KV_NO_HOST: no host data).
 * Each slot has a row of the block table (max_blocks ids, -1 = none) and a length (positions stored).
 * Blocks are taken from a free list as a slot grows (kv_cache_reserve) and come back when no slot holds them
 * any more. Slots may share whole blocks (kv_cache_share: the same prompt prefix for several sequences);
 * a shared block is read by all of them and written by none. Everything is allocated once in kv_cache_init;
 * nothing per token.
 * The last n_ext blocks may be an extension in slower memory (the GPU backend's host-memory blocks,
 * runtime/NOTES.md): a block of it is handed out only when no other block is free, or to a slot whose last
 * block is in it (so a slot's extension blocks are one trailing run).
 * A pool for sliding-window layers drops a slot's blocks wholly before its window (kv_cache_drop): its table
 * row then starts with -1 entries up to lo[seq], which that pool's attention never reads.
 * Invariant: ref[b] is the number of slot rows holding block b, and b is on the free list iff ref[b] == 0;
 * a slot holds the blocks of its row's entries [lo[seq], n_held[seq]).
 */
#ifndef FERRY_KV_CACHE_H
#define FERRY_KV_CACHE_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/cpu/attention.h"
#include "weights/model_file.h"

struct kv_cache {
    int n_layers, n_kv_heads, head_dim;
    int block_size;       /* positions per block */
    int n_blocks;         /* blocks in the pool */
    int n_seqs;           /* slots */
    int max_blocks;       /* blocks per slot = ceil(ctx_size / block_size) */
    int ctx_size;         /* max positions per slot */
    void *k, *v;          /* (n_layers, n_blocks, block_size, n_kv_heads*head_dim) elements, or NULL */
    int elem;             /* enum kv_elem of k and v, or KV_NO_HOST */
    int32_t *block_table; /* (n_seqs, max_blocks) */
    int32_t *n_held;    /* (n_seqs) entries of each slot's table row in use (blocks it holds, and dropped) */
    int32_t *lo;        /* (n_seqs) entries before it are -1: dropped (kv_cache_drop), 0 when none are */
    int32_t *seq_len;   /* (n_seqs) positions stored */
    int32_t *free_list; /* (n_blocks) free block ids: a stack of the main blocks from the front, one of the
                         * extension's from the back */
    int32_t *ref;       /* (n_blocks) slots holding each block */
    int n_free;         /* free blocks, main and extension */
    int n_ext;          /* the last n_ext blocks are the extension */
    int n_free_ext;     /* free blocks of the extension */
};

#define KV_NO_HOST (-1)

/* elem: enum kv_elem of the host data, or KV_NO_HOST. Q8_0 needs head_dim a multiple of 32
 * (FERRY_ERR_INVALID otherwise). n_layers may be 0: block tables only (a model whose every layer is a
 * sliding-window one keeps the tables of full positions, by which requests are admitted, and no data). */
int kv_cache_init(struct kv_cache *kv, int n_layers, int n_kv_heads, int head_dim, int n_seqs, int ctx_size,
                  int pool_tokens, int block_size, int elem);
void kv_cache_free(struct kv_cache *kv);
/* Makes the last n_ext blocks the extension (0 <= n_ext <= n_blocks; only while no block is held). */
int kv_cache_set_ext(struct kv_cache *kv, int n_ext);
/* Bytes of K/V data stored as `elem` (the host cache's kv->elem, KV_F16 for the device's). */
size_t kv_cache_bytes(const struct kv_cache *kv, enum kv_elem elem);

/* Makes sure slot `seq` holds blocks for positions [0, n_pos). FERRY_ERR_RANGE when the pool is empty or
 * n_pos > ctx_size; blocks taken before the failure stay with the slot (the caller may trim). */
int kv_cache_reserve(struct kv_cache *kv, int seq, int n_pos);
/* The index in the slot's table row of the first block of its trailing run of extension blocks (n_held[seq]
 * when its last block is a main one, or it holds none). */
int kv_cache_ext_first(const struct kv_cache *kv, int seq);
/* Returns the slot's blocks beyond what n_pos positions need; when that leaves none of the held ones (n_pos
 * at most the first dropped block's end), the slot is emptied (n_held and lo 0). */
void kv_cache_trim(struct kv_cache *kv, int seq, int n_pos);
/* Returns the slot's blocks wholly before position pos (a sliding window's pool: positions its attention
 * no longer reads) and marks their entries -1. The last block of the row stays. */
void kv_cache_drop(struct kv_cache *kv, int seq, int pos);
/* The first position whose block the slot still holds (0 when none was dropped). */
int kv_cache_held_from(const struct kv_cache *kv, int seq);
void kv_cache_seq_free(struct kv_cache *kv, int seq);
/* Gives the empty slot dst the first n_blocks blocks of src (shared, not copied; dst's row has src's dropped
 * entries too). FERRY_ERR_INVALID when dst holds blocks, is src, or src holds fewer, or none of them
 * (n_blocks > 0 all dropped). */
int kv_cache_share(struct kv_cache *kv, int src, int dst, int n_blocks);
/* 1 when another slot also holds the block of `seq` that position pos falls in. */
int kv_cache_shared(const struct kv_cache *kv, int seq, int pos);

struct kv_layer_view kv_cache_layer(const struct kv_cache *kv, int layer);

/* Sliding-window layers in a pool of their own: the KV-cache layers (llm_kv_cache_layers) of hp that attend
 * through the window. */
int kv_cache_swa_layers(const struct llm_hparams *hp);
/* The place of layer l's K/V (its source layer's, for a KV-sharing layer) in its pool, and *swa: 1 when that
 * is the sliding-window layers' pool. split 0: one pool for all (llm_kv_layer's place, *swa 0). -1 when
 * the layer has no source. */
int kv_cache_layer_index(const struct llm_hparams *hp, int l, int split, int *swa);

#endif
