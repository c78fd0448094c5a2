/* ring — the bookkeeping of the streaming ring: which host layer each copy brings into which device slot.
 *
 * Pure arithmetic (no CUDA; forward_cuda.c does the copies and events around it), so it is tested on any
 * machine. Copies are numbered c = 0, 1, 2, ... over the whole run and copy c goes to slot c mod k. A step
 * declares the layers it streams, in order (ring_begin); its uses consume copies in that order (ring_use).
 * Copies are issued ahead (ring_next_copy) while fewer than k wait, and past the end of the step's list into
 * a repetition of it (the guess that the next step has the same plan), so the next step's first copies
 * overlap this step's last layers. When a step streams a different list (its size bucket chose another
 * plan), the waiting copies after the longest prefix that matches the new list are dropped: the copy counter
 * rewinds, so their slots are refilled in order (on the FIFO copy stream a later copy into a slot lands after
 * the dropped one; the dropped bytes cost link time, never correctness).
 * Invariants: next_use <= next_copy <= next_use + k; copy c's layer is queue[c mod k] while it waits; copy c
 * may be written only once use c - k has released its slot (the caller orders it after that release).
 */
#ifndef FERRY_RING_H
#define FERRY_RING_H

#include <stdint.h>

struct ring {
    int k;              /* slots */
    uint64_t next_copy; /* copies issued: numbers below it */
    uint64_t next_use;  /* copies consumed */
    int *queue;         /* (k) layer of copy c at c mod k, for next_use <= c < next_copy */
    int *list;          /* (cap) the step's streamed layers, in use order */
    int n_list, cap;
    int64_t cursor; /* copies issued for the current list, counting its repetitions */
};

/* max_list: the most layers a step may stream. FERRY_ERR_INVALID / FERRY_ERR_NOMEM. */
int ring_init(struct ring *r, int k, int max_list);
void ring_free(struct ring *r);
/* Declares the step's streamed layers (n may be 0: then the waiting copies are kept for a later step).
 * Returns the number of waiting copies dropped, or FERRY_ERR_INVALID when n > max_list. */
int ring_begin(struct ring *r, const int *layers, int n);
/* The next copy to issue: returns 1 with its layer, slot and number, or 0 when k copies wait or the list is
 * empty. The caller must issue it (the ring counts it as issued). */
int ring_next_copy(struct ring *r, int *layer, int *slot, uint64_t *copy);
/* Consumes the next use, which must be `layer` with its copy issued: its slot and copy number.
 * FERRY_ERR_INTERNAL when the step uses layers in another order than it declared. */
int ring_use(struct ring *r, int layer, int *slot, uint64_t *copy);
/* Copies issued and not yet used. */
int ring_waiting(const struct ring *r);

#endif
