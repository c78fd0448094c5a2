/* kv_cache — paged block pool (see kv_cache.h). */
#include "runtime/kv_cache.h"

#include <stdlib.h>
#include <string.h>

#include "kernels/core/status.h"

int kv_cache_init(struct kv_cache *kv, int n_layers, int n_kv_heads, int head_dim, int n_seqs, int ctx_size,
                  int pool_tokens, int block_size, int elem)
{
    memset(kv, 0, sizeof *kv);
    if (n_layers < 0 || n_kv_heads <= 0 || head_dim <= 0 || n_seqs <= 0 || ctx_size <= 0 || block_size <= 0 ||
        pool_tokens <= 0 || elem < KV_NO_HOST || elem > KV_Q8_0 || (elem == KV_Q8_0 && head_dim % 32))
        return FERRY_ERR_INVALID;
    const int host_data = elem != KV_NO_HOST && n_layers > 0;
    kv->elem = elem;
    kv->n_layers = n_layers;
    kv->n_kv_heads = n_kv_heads;
    kv->head_dim = head_dim;
    kv->block_size = block_size;
    kv->n_seqs = n_seqs;
    kv->ctx_size = ctx_size;
    kv->max_blocks = (ctx_size + block_size - 1) / block_size;
    kv->n_blocks = (pool_tokens + block_size - 1) / block_size;
    size_t per_layer = (size_t)kv->n_blocks * block_size * n_kv_heads * head_dim;
    if (host_data) {
        kv->k = malloc(kv_elem_bytes((enum kv_elem)elem, per_layer * n_layers));
        kv->v = malloc(kv_elem_bytes((enum kv_elem)elem, per_layer * n_layers));
    }
    kv->block_table = malloc((size_t)n_seqs * kv->max_blocks * sizeof(int32_t));
    kv->n_held = calloc((size_t)n_seqs, sizeof(int32_t));
    kv->seq_len = calloc((size_t)n_seqs, sizeof(int32_t));
    kv->lo = calloc((size_t)n_seqs, sizeof(int32_t));
    kv->free_list = malloc((size_t)kv->n_blocks * sizeof(int32_t));
    kv->ref = calloc((size_t)kv->n_blocks, sizeof(int32_t));
    if ((host_data && (!kv->k || !kv->v)) || !kv->block_table || !kv->n_held || !kv->seq_len || !kv->lo ||
        !kv->free_list || !kv->ref) {
        kv_cache_free(kv);
        return FERRY_ERR_NOMEM;
    }
    for (size_t i = 0; i < (size_t)n_seqs * kv->max_blocks; i++) kv->block_table[i] = -1;
    /* Stack order: block 0 is handed out first. */
    for (int i = 0; i < kv->n_blocks; i++) kv->free_list[i] = kv->n_blocks - 1 - i;
    kv->n_free = kv->n_blocks;
    return FERRY_OK;
}

int kv_cache_set_ext(struct kv_cache *kv, int n_ext)
{
    if (n_ext < 0 || n_ext > kv->n_blocks || kv->n_free != kv->n_blocks) return FERRY_ERR_INVALID;
    const int n_main = kv->n_blocks - n_ext;
    /* Main blocks from the front (block 0 on top), the extension's from the back (block n_main on top). */
    for (int i = 0; i < n_main; i++) kv->free_list[i] = n_main - 1 - i;
    for (int i = 0; i < n_ext; i++) kv->free_list[kv->n_blocks - 1 - i] = kv->n_blocks - 1 - i;
    kv->n_ext = n_ext;
    kv->n_free_ext = n_ext;
    return FERRY_OK;
}

/* Free block ids: main blocks at free_list[0, n_free - n_free_ext), the extension's at
 * free_list[n_blocks - n_free_ext, n_blocks). A main block unless none is free or ext is set and the
 * extension has one. */
static int take_block(struct kv_cache *kv, int ext)
{
    const int main_free = kv->n_free - kv->n_free_ext;
    kv->n_free--;
    if (main_free > 0 && !(ext && kv->n_free_ext > 0)) return kv->free_list[main_free - 1];
    return kv->free_list[kv->n_blocks - kv->n_free_ext--];
}

static void give_block(struct kv_cache *kv, int b)
{
    if (b >= kv->n_blocks - kv->n_ext)
        kv->free_list[kv->n_blocks - 1 - kv->n_free_ext++] = b;
    else
        kv->free_list[kv->n_free - kv->n_free_ext] = b;
    kv->n_free++;
}

void kv_cache_free(struct kv_cache *kv)
{
    if (!kv) return;
    free(kv->k);
    free(kv->v);
    free(kv->block_table);
    free(kv->n_held);
    free(kv->seq_len);
    free(kv->lo);
    free(kv->free_list);
    free(kv->ref);
    memset(kv, 0, sizeof *kv);
}

size_t kv_cache_bytes(const struct kv_cache *kv, enum kv_elem elem)
{
    return 2 * kv_elem_bytes(elem, (size_t)kv->n_layers * kv->n_blocks * kv->block_size * kv->n_kv_heads *
                                       kv->head_dim);
}

int kv_cache_reserve(struct kv_cache *kv, int seq, int n_pos)
{
    if (seq < 0 || seq >= kv->n_seqs || n_pos < 0 || n_pos > kv->ctx_size) return FERRY_ERR_RANGE;
    int need = (n_pos + kv->block_size - 1) / kv->block_size;
    int32_t *row = kv->block_table + (size_t)seq * kv->max_blocks;
    while (kv->n_held[seq] < need) {
        if (kv->n_free == 0) return FERRY_ERR_RANGE;
        /* A slot that has reached the extension stays there: its extension blocks are then one trailing run,
         * which the GPU backend's host cores attend to (runtime/forward_cuda.c, ext_plan). A main block freed
         * meanwhile would end the run, and the device would read every extension block before it over the
         * link. Main blocks go to slots still on the device, and to new ones. */
        const int in_ext = kv->n_held[seq] > 0 && row[kv->n_held[seq] - 1] >= kv->n_blocks - kv->n_ext;
        const int b = take_block(kv, in_ext);
        kv->ref[b] = 1;
        row[kv->n_held[seq]++] = b;
    }
    return FERRY_OK;
}

int kv_cache_ext_first(const struct kv_cache *kv, int seq)
{
    const int32_t *row = kv->block_table + (size_t)seq * kv->max_blocks;
    int j = kv->n_held[seq];
    while (j > kv->lo[seq] && row[j - 1] >= kv->n_blocks - kv->n_ext) j--;
    return j;
}

void kv_cache_trim(struct kv_cache *kv, int seq, int n_pos)
{
    if (seq < 0 || seq >= kv->n_seqs) return;
    int keep = (n_pos + kv->block_size - 1) / kv->block_size;
    if (keep <= kv->lo[seq]) keep = 0; /* none of the held blocks stays: the dropped entries go too */
    int32_t *row = kv->block_table + (size_t)seq * kv->max_blocks;
    while (kv->n_held[seq] > keep) {
        const int b = row[--kv->n_held[seq]];
        row[kv->n_held[seq]] = -1;
        if (b >= 0 && --kv->ref[b] == 0) give_block(kv, b);
    }
    if (kv->lo[seq] > kv->n_held[seq]) kv->lo[seq] = kv->n_held[seq];
}

void kv_cache_drop(struct kv_cache *kv, int seq, int pos)
{
    if (seq < 0 || seq >= kv->n_seqs) return;
    int end = pos / kv->block_size; /* blocks [0, end) end at or before pos */
    if (end > kv->n_held[seq] - 1) end = kv->n_held[seq] - 1;
    int32_t *row = kv->block_table + (size_t)seq * kv->max_blocks;
    for (; kv->lo[seq] < end; kv->lo[seq]++) {
        const int b = row[kv->lo[seq]];
        row[kv->lo[seq]] = -1;
        if (--kv->ref[b] == 0) give_block(kv, b);
    }
}

int kv_cache_held_from(const struct kv_cache *kv, int seq)
{
    return seq >= 0 && seq < kv->n_seqs ? kv->lo[seq] * kv->block_size : 0;
}

void kv_cache_seq_free(struct kv_cache *kv, int seq)
{
    if (seq < 0 || seq >= kv->n_seqs) return;
    kv_cache_trim(kv, seq, 0);
    kv->seq_len[seq] = 0;
}

struct kv_layer_view kv_cache_layer(const struct kv_cache *kv, int layer)
{
    size_t per_layer = (size_t)kv->n_blocks * kv->block_size * kv->n_kv_heads * kv->head_dim;
    return (struct kv_layer_view){
        .k = kv->k ? (char *)kv->k + kv_elem_bytes((enum kv_elem)kv->elem, per_layer * layer) : NULL,
        .v = kv->v ? (char *)kv->v + kv_elem_bytes((enum kv_elem)kv->elem, per_layer * layer) : NULL,
        .n_blocks = kv->n_blocks,
        .block_size = kv->block_size,
        .block_table = kv->block_table,
        .max_blocks = kv->max_blocks,
        .n_kv_heads = kv->n_kv_heads,
        .head_dim = kv->head_dim,
        .elem = kv->elem == KV_NO_HOST ? KV_F16 : kv->elem,
    };
}

int kv_cache_share(struct kv_cache *kv, int src, int dst, int n_blocks)
{
    if (src < 0 || src >= kv->n_seqs || dst < 0 || dst >= kv->n_seqs || src == dst || kv->n_held[dst] ||
        n_blocks < 0 || n_blocks > kv->n_held[src] || (n_blocks > 0 && n_blocks <= kv->lo[src]))
        return FERRY_ERR_INVALID;
    const int32_t *from = kv->block_table + (size_t)src * kv->max_blocks;
    int32_t *to = kv->block_table + (size_t)dst * kv->max_blocks;
    const int lo = n_blocks > 0 ? kv->lo[src] : 0;
    for (int i = lo; i < n_blocks; i++) {
        to[i] = from[i];
        kv->ref[from[i]]++;
    }
    kv->lo[dst] = lo;
    kv->n_held[dst] = n_blocks;
    return FERRY_OK;
}

int kv_cache_shared(const struct kv_cache *kv, int seq, int pos)
{
    if (seq < 0 || seq >= kv->n_seqs || pos < 0) return 0;
    const int i = pos / kv->block_size;
    if (i < kv->lo[seq] || i >= kv->n_held[seq]) return 0;
    return kv->ref[kv->block_table[(size_t)seq * kv->max_blocks + i]] > 1;
}

/* A layer with K/V of its own: not a recurrent one, nor one reading another's. */
static int owns_kv(const struct llm_hparams *hp, int l)
{
    return !llm_layer_is_recurrent(hp, l) && !llm_layer_kv_shared(hp, l);
}

int kv_cache_swa_layers(const struct llm_hparams *hp)
{
    int n = 0;
    for (int l = 0; l < hp->n_layers; l++) n += owns_kv(hp, l) && llm_layer_is_local(hp, l);
    return n;
}

int kv_cache_layer_index(const struct llm_hparams *hp, int l, int split, int *swa)
{
    *swa = 0;
    const int src = llm_kv_source(hp, l);
    if (src < 0) return -1;
    if (!split) return llm_kv_layer(hp, src);
    const int local = llm_layer_is_local(hp, src);
    int j = 0;
    for (int s = 0; s < src; s++) j += owns_kv(hp, s) && llm_layer_is_local(hp, s) == local;
    *swa = local;
    return j;
}
