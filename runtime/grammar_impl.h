/* grammar_impl — the layout of a compiled grammar and of recogniser states, shared by grammar.c (builder and
 * recogniser) and grammar_mask.c (token masks). Nothing outside those two files includes it. */
#ifndef FERRY_GRAMMAR_IMPL_H
#define FERRY_GRAMMAR_IMPL_H

#include <stddef.h>
#include <stdint.h>

#include "runtime/grammar.h"
#include "runtime/regex.h"

#define GCOST_INF   0x3FFFFFFFu
#define GHEIGHT_INF 0xFFFFu

enum gkind {
    GK_LIT,    /* a: byte offset, b: length */
    GK_SEQ,    /* a: kid offset, b: count */
    GK_ALT,    /* a: kid offset, b: count */
    GK_REP,    /* a: child; min, max (-1 unbounded) */
    GK_WS,     /* max: bytes */
    GK_STRING, /* a: dfa index or -1; min, max code points (max -1 unbounded) */
    GK_NUMBER, /* flags GB_NUM_*; lo, hi */
    GK_OBJECT, /* a: prop offset, b: count, c: additional value node or -1; ws */
    GK_ARRAY,  /* a: items node or -1, b: prefix kid offset, c: prefix count; min, max; ws */
    GK_LITSET, /* a: lit offset, b: count (sorted by bytes) */
};

struct gnode {
    uint8_t kind;
    uint8_t flags;
    uint8_t nullable;
    uint8_t ws;
    int32_t a, b, c;
    int32_t min, max;
    double lo, hi;
    uint32_t cost;     /* fewest bytes of a complete match; GCOST_INF when none */
    uint16_t height;   /* frames a complete match needs at most, its own included, along the path that needs
                        * fewest (GHEIGHT_INF when none): a thread whose completion needs more frames than a
                        * state holds is dropped, so a walk never reaches a prefix it cannot finish */
    uint8_t first[32]; /* bit set of the bytes a match can start with */
};

struct gprop {
    int32_t key_off, key_len; /* the key as JSON text with its quotes, in bytes[] */
    int32_t value;
    uint8_t required, enabled;
};

struct glit {
    int32_t off, len; /* bytes[] */
    int32_t cont;     /* node or -1 */
};

struct grammar {
    struct gnode *nodes;
    int n_nodes;
    int root;
    char *bytes; /* literal pool */
    int32_t *kids;
    struct gprop *props;
    struct glit *lits;
    struct regex_dfa **dfas;
    int n_dfas;
    int free_string; /* node of an unconstrained string (object keys without properties) */
    int any_ws;      /* whitespace gaps take any of the four bytes anywhere (else: a newline first only) */
};

/* One frame of a thread's stack: the node and where the match of it stands. 24 bytes, no padding: frames
 * compare with memcmp. */
struct gframe {
    uint16_t node;
    uint8_t phase;
    uint8_t ws; /* whitespace bytes in the current gap; NUMBER: 1 when negative */
    uint32_t a;
    uint64_t b;
    uint64_t c;
};

struct gstate {
    uint16_t n;                          /* threads */
    uint16_t depth[GRAMMAR_MAX_THREADS]; /* frames of each thread, bottom first */
    struct gframe f[GRAMMAR_MAX_THREADS * GRAMMAR_MAX_DEPTH];
};

/* Bytes of a state holding `frames` frames (what a copy must move). */
static inline size_t gstate_size(int frames)
{
    return offsetof(struct gstate, f) + (size_t)frames * sizeof(struct gframe);
}
static inline int gstate_frames(const struct gstate *st)
{
    int k = 0;
    for (int i = 0; i < st->n; i++) k += st->depth[i];
    return k;
}

/* Saturating cost arithmetic (GCOST_INF absorbs). */
static inline uint32_t cadd(uint32_t a, uint32_t b)
{
    uint64_t s = (uint64_t)a + b;
    return s >= GCOST_INF ? GCOST_INF : (uint32_t)s;
}

static inline uint32_t cmul(uint32_t a, uint32_t k)
{
    uint64_t s = (uint64_t)a * k;
    return s >= GCOST_INF ? GCOST_INF : (uint32_t)s;
}

static inline int is_ws(int c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

static inline int bit(const uint8_t *set, int c)
{
    return set[c >> 3] >> (c & 7) & 1;
}

/* Bytes of the shortest number within a GK_NUMBER node's bounds, or GCOST_INF (grammar.c). */
uint32_t gnum_min_len(const struct gnode *n);

/* 1 when thread frames f[0, depth) can still be completed within GRAMMAR_MAX_DEPTH frames (grammar.c). */
int gthread_fits(const struct grammar *g, const struct gframe *f, int depth);

/* Feeds one byte of `in` into `out` (which must have room for a full state); returns the threads left. */
int gstate_step(const struct grammar *g, const struct gstate *in, int c, struct gstate *out);
uint32_t gstate_cost(const struct grammar *g, const struct gstate *st);

/* When st is one thread inside an unconstrained JSON string (between characters), returns 1 and sets *room to
 * the code points that still fit (-1: no limit): tokens of plain characters are accepted in bulk there. */
int gstate_plain_string(const struct grammar *g, const struct gstate *st, int *room);

#endif
