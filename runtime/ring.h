/* ring — the bookkeeping of the streaming ring: which piece of which host layer each copy brings into which
 * bytes of the device's ring buffer.
 *
 * Pure arithmetic (no CUDA; forward_cuda.c does the copies and events around it), so it is tested on any
 * machine. A streamed layer crosses the link as pieces (its matrix groups, layer.h), one copy each; an item
 * names one piece (the caller's numbering) and has a size. The ring is `cap` bytes. Copies are numbered
 * c = 0, 1, 2, ... over the whole run and laid end to end, each at a RING_ALIGN boundary, a piece that would
 * run past the end starting again at 0 (ring_place). A step declares the items it streams, in use order
 * (ring_begin); its uses consume copies in that order (ring_use). A copy is issued (ring_next_copy) once its
 * bytes overlap no copy still waiting for its use, and at most RING_MAX_WAIT wait; it then must wait on the
 * device for the use of the newest used copy its bytes overlap (`after`). Copies continue past the end of
 * the step's list into a repetition of it (the guess that the next step has the same plan), so the next
 * step's first copies overlap this step's last layers. When a step streams a different list (its size bucket
 * chose another plan), the waiting copies after the longest prefix that matches the new list are dropped:
 * the copy counter rewinds and their bytes are written again in order (on the FIFO copy stream a later copy
 * lands after the dropped one; the dropped bytes cost link time, never correctness).
 * Against slots of a whole layer each: a ring of two of the largest pieces (a quarter to a half of a layer)
 * keeps the link busy while the device computes, and the bytes it saves hold more resident layers; a deeper
 * ring holds as many pieces as fit, with no slot's tail left empty by a smaller layer.
 * A step may rotate through less than the whole ring (`cap` of ring_begin): the rest holds parked layers
 * (forward_cuda.c), and waiting copies that reach past the step's cap are dropped.
 * Invariants: next_use <= next_copy <= next_use + RING_MAX_WAIT; waiting copies never overlap; copy c's item,
 * offset and size stay in hist[c mod RING_HISTORY] until copy c + RING_HISTORY is issued.
 */
#ifndef FERRY_RING_H
#define FERRY_RING_H

#include <stdint.h>

#define RING_ALIGN    256
#define RING_HISTORY  64
#define RING_MAX_WAIT (RING_HISTORY / 2)

/* x rounded up to RING_ALIGN: where copies start, and what a parked layer takes (runtime/step_plan.h). */
static inline uint64_t ring_align(uint64_t x)
{
    return (x + RING_ALIGN - 1) / RING_ALIGN * RING_ALIGN;
}

struct ring_copy {
    int item;
    uint64_t off, bytes;
};

/* One copy to issue: item's bytes into [off, off + bytes) of the ring, copy number `copy`, after the use of
 * copy `after` has finished on the device (-1: nothing to wait for). */
struct ring_issue {
    int item;
    uint64_t off, bytes, copy;
    int64_t after;
};

struct ring {
    uint64_t size;      /* bytes */
    uint64_t cap;       /* the bytes this step rotates through: [0, cap) */
    uint64_t next_copy; /* copies issued: numbers below it */
    uint64_t next_use;  /* copies consumed */
    struct ring_copy hist[RING_HISTORY];
    int *list;       /* (max_list) the step's streamed items, in use order */
    uint64_t *bytes; /* (max_list) their sizes */
    int n_list, max_list;
    int64_t cursor; /* copies issued for the current list, counting its repetitions */
};

/* Where a copy of `bytes` goes when the previous one ended at prev_end: there (rounded up to RING_ALIGN), or
 * at 0 when it would run past cap. */
uint64_t ring_place(uint64_t cap, uint64_t prev_end, uint64_t bytes);

/* size: the ring's bytes; max_list: the most items a step may stream. FERRY_ERR_INVALID / FERRY_ERR_NOMEM. */
int ring_init(struct ring *r, uint64_t size, int max_list);
void ring_free(struct ring *r);
/* Declares the step's streamed items and their sizes, and the ring's bytes [0, cap) it rotates through (cap
 * <= size; n may be 0: then the waiting copies within cap are kept for a later step). Returns the number of
 * waiting copies dropped, or FERRY_ERR_INVALID when n > max_list, cap > size or an item does not fit cap. */
int ring_begin(struct ring *r, const int *items, const uint64_t *bytes, int n, uint64_t cap);
/* The next copy to issue: 1 with it in *out, or 0 when it must wait for uses (or the list is empty). The
 * caller must issue it (the ring counts it as issued). */
int ring_next_copy(struct ring *r, struct ring_issue *out);
/* Consumes the next use, which must be `item` with its copy issued: its offset and copy number.
 * FERRY_ERR_INTERNAL when the step uses items in another order than it declared. */
int ring_use(struct ring *r, int item, uint64_t *off, uint64_t *copy);
/* Copies issued and not yet used. */
int ring_waiting(const struct ring *r);

#endif
