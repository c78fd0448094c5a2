/* ring — streaming ring bookkeeping (see ring.h). */
#include "runtime/ring.h"

#include <stdlib.h>
#include <string.h>

#include "kernels/core/status.h"

int ring_init(struct ring *r, int k, int max_list)
{
    memset(r, 0, sizeof *r);
    if (k <= 0 || max_list < 0) return FERRY_ERR_INVALID;
    r->k = k;
    r->cap = max_list;
    r->queue = malloc((size_t)k * sizeof *r->queue);
    r->list = malloc((size_t)(max_list > 0 ? max_list : 1) * sizeof *r->list);
    if (!r->queue || !r->list) {
        ring_free(r);
        return FERRY_ERR_NOMEM;
    }
    return FERRY_OK;
}

void ring_free(struct ring *r)
{
    if (!r) return;
    free(r->queue);
    free(r->list);
    memset(r, 0, sizeof *r);
}

int ring_waiting(const struct ring *r)
{
    return (int)(r->next_copy - r->next_use);
}

int ring_begin(struct ring *r, const int *layers, int n)
{
    if (n < 0 || n > r->cap) return FERRY_ERR_INVALID;
    if (n == 0) {
        r->n_list = 0;
        r->cursor = 0;
        return 0;
    }
    memcpy(r->list, layers, (size_t)n * sizeof *layers);
    r->n_list = n;
    /* Keep the waiting copies that are what this list (and its repetitions) would have issued. */
    const int waiting = ring_waiting(r);
    int keep = 0;
    while (keep < waiting && r->queue[(r->next_use + (uint64_t)keep) % (uint64_t)r->k] == layers[keep % n])
        keep++;
    r->next_copy = r->next_use + (uint64_t)keep;
    r->cursor = keep;
    return waiting - keep;
}

int ring_next_copy(struct ring *r, int *layer, int *slot, uint64_t *copy)
{
    if (r->n_list == 0 || ring_waiting(r) >= r->k) return 0;
    const uint64_t c = r->next_copy++;
    *layer = r->list[r->cursor++ % r->n_list];
    *slot = (int)(c % (uint64_t)r->k);
    *copy = c;
    r->queue[*slot] = *layer;
    return 1;
}

int ring_use(struct ring *r, int layer, int *slot, uint64_t *copy)
{
    if (r->next_use >= r->next_copy) return FERRY_ERR_INTERNAL;
    const uint64_t c = r->next_use;
    const int s = (int)(c % (uint64_t)r->k);
    if (r->queue[s] != layer) return FERRY_ERR_INTERNAL;
    r->next_use++;
    *slot = s;
    *copy = c;
    return FERRY_OK;
}
