/* ring — streaming ring bookkeeping (see ring.h). */
#include "runtime/ring.h"

#include <stdlib.h>
#include <string.h>

#include "kernels/core/status.h"

uint64_t ring_place(uint64_t cap, uint64_t prev_end, uint64_t bytes)
{
    const uint64_t at = ring_align(prev_end);
    return at + bytes <= cap ? at : 0;
}

int ring_init(struct ring *r, uint64_t size, int max_list)
{
    memset(r, 0, sizeof *r);
    if (size == 0 || max_list < 0) return FERRY_ERR_INVALID;
    r->size = r->cap = size;
    r->max_list = max_list;
    r->list = malloc((size_t)(max_list > 0 ? max_list : 1) * sizeof *r->list);
    r->bytes = malloc((size_t)(max_list > 0 ? max_list : 1) * sizeof *r->bytes);
    if (!r->list || !r->bytes) {
        ring_free(r);
        return FERRY_ERR_NOMEM;
    }
    return FERRY_OK;
}

void ring_free(struct ring *r)
{
    if (!r) return;
    free(r->list);
    free(r->bytes);
    memset(r, 0, sizeof *r);
}

int ring_waiting(const struct ring *r)
{
    return (int)(r->next_copy - r->next_use);
}

static const struct ring_copy *copy_of(const struct ring *r, uint64_t c)
{
    return &r->hist[c % RING_HISTORY];
}

int ring_begin(struct ring *r, const int *items, const uint64_t *bytes, int n, uint64_t cap)
{
    if (n < 0 || n > r->max_list || cap == 0 || cap > r->size) return FERRY_ERR_INVALID;
    for (int i = 0; i < n; i++)
        if (bytes[i] == 0 || bytes[i] > cap) return FERRY_ERR_INVALID;
    r->cap = cap;
    if (n > 0) {
        memcpy(r->list, items, (size_t)n * sizeof *items);
        memcpy(r->bytes, bytes, (size_t)n * sizeof *bytes);
    }
    r->n_list = n;
    /* Keep the waiting copies within cap that are what this list (and its repetitions) would have issued (an
     * empty list keeps them all for a later step). */
    const int waiting = ring_waiting(r);
    int keep = 0;
    while (keep < waiting) {
        const struct ring_copy *w = copy_of(r, r->next_use + (uint64_t)keep);
        if (w->off + w->bytes > cap || (n && (w->item != items[keep % n] || w->bytes != bytes[keep % n])))
            break;
        keep++;
    }
    r->next_copy = r->next_use + (uint64_t)keep;
    r->cursor = n ? keep : 0;
    return waiting - keep;
}

static int overlap(const struct ring_copy *a, uint64_t off, uint64_t bytes)
{
    return a->off < off + bytes && off < a->off + a->bytes;
}

int ring_next_copy(struct ring *r, struct ring_issue *out)
{
    if (r->n_list == 0 || ring_waiting(r) >= RING_MAX_WAIT) return 0;
    const uint64_t c = r->next_copy;
    const int i = (int)(r->cursor % r->n_list);
    const uint64_t bytes = r->bytes[i];
    const uint64_t off = c ? ring_place(r->cap, copy_of(r, c - 1)->off + copy_of(r, c - 1)->bytes, bytes) : 0;
    for (uint64_t j = r->next_use; j < c; j++)
        if (overlap(copy_of(r, j), off, bytes)) return 0; /* its bytes still wait for their use */
    /* The newest used copy it overwrites. Past the history the newest used copy stands in for an older one
     * (it finishes after them all); before the history runs out, no overlap means bytes never written. */
    int64_t after = c >= RING_HISTORY ? (int64_t)r->next_use - 1 : -1;
    for (uint64_t j = r->next_use; j-- > 0 && j + RING_HISTORY > c;)
        if (overlap(copy_of(r, j), off, bytes)) {
            after = (int64_t)j;
            break;
        }
    r->hist[c % RING_HISTORY] = (struct ring_copy){.item = r->list[i], .off = off, .bytes = bytes};
    r->next_copy++;
    r->cursor++;
    *out = (struct ring_issue){.item = r->list[i], .off = off, .bytes = bytes, .copy = c, .after = after};
    return 1;
}

int ring_use(struct ring *r, int item, uint64_t *off, uint64_t *copy)
{
    if (r->next_use >= r->next_copy) return FERRY_ERR_INTERNAL;
    const uint64_t c = r->next_use;
    if (copy_of(r, c)->item != item) return FERRY_ERR_INTERNAL;
    r->next_use++;
    *off = copy_of(r, c)->off;
    *copy = c;
    return FERRY_OK;
}
