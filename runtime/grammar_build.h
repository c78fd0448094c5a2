/* grammar_build — assembling a grammar from nodes (used by json_schema.c and tool_call.c; runtime only).
 *
 * Nodes are JSON-shaped: literal bytes, sequences, alternatives, repetitions, bounded whitespace, strings
 * (optionally constrained by a regex DFA and a length in code points), numbers with bounds, objects with
 * properties in a fixed order, arrays, and literal sets (enum/const) whose members may continue with a node.
 * Every call returns a node id (>= 0) or -1 once an error was recorded (the first error wins; later calls
 * return -1 too), so callers can check once at gb_finish. gb_reserve/gb_define build recursive grammars.
 * gb_finish computes each node's shortest completion and first bytes, drops the parts that accept nothing,
 * and fails when the root accepts nothing.
 */
#ifndef FERRY_GRAMMAR_BUILD_H
#define FERRY_GRAMMAR_BUILD_H

#include <stddef.h>

#include "runtime/grammar.h"
#include "runtime/regex.h"

struct gbuilder;

#define GB_NUM_INTEGER 1
#define GB_NUM_LO      2 /* lo bound present */
#define GB_NUM_HI      4
#define GB_NUM_LO_EXCL 8 /* lo is exclusive */
#define GB_NUM_HI_EXCL 16

struct gb_prop {
    const char *key; /* raw key (not JSON-escaped) */
    size_t key_len;
    int value; /* node */
    int required;
};

struct gb_lit {
    const char *s; /* bytes matched exactly */
    size_t n;
    int cont; /* node that follows once the literal is matched, or -1 */
};

int gb_init(struct gbuilder **out);
void gb_free(struct gbuilder *b);
/* The first recorded error (status), with its message in err. */
int gb_error(const struct gbuilder *b, char err[256]);
/* Records an error (the first one wins); returns -1. */
int gb_fail(struct gbuilder *b, int status, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

int gb_lit(struct gbuilder *b, const char *s, size_t n);
int gb_seq(struct gbuilder *b, const int *kids, int n);
int gb_alt(struct gbuilder *b, const int *kids, int n);
int gb_rep(struct gbuilder *b, int child, int min, int max); /* max -1: unbounded */
int gb_ws(struct gbuilder *b, int max);
/* dfa: owned by the builder from here on (NULL: any content). max -1: unbounded. */
int gb_string(struct gbuilder *b, struct regex_dfa *dfa, int min, int max);
int gb_number(struct gbuilder *b, int flags, double lo, double hi);
/* additional: value node for keys other than the properties (only used when n == 0), or -1. */
int gb_object(struct gbuilder *b, const struct gb_prop *props, int n, int additional, int ws);
/* items: node of the items after the prefix ones, or -1 (none). max -1: unbounded. */
int gb_array(struct gbuilder *b, int items, const int *prefix, int n_prefix, int min, int max, int ws);
int gb_litset(struct gbuilder *b, const struct gb_lit *lits, int n);
/* Any JSON value (containers nest up to the recogniser's depth). */
int gb_any(struct gbuilder *b, int ws);
/* A node to be defined later (recursion): gb_define(b, id, node) makes it stand for node. */
int gb_reserve(struct gbuilder *b);
int gb_define(struct gbuilder *b, int id, int node);

/* Completes the grammar with `root` as its start; frees the builder in every case. */
int gb_finish(struct gbuilder *b, int root, struct grammar **out, char err[256]);

#endif
