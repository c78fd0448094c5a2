/* grammar — constrained decoding: a compiled grammar of JSON-shaped output (built from a JSON Schema, a
 * tool-call format, or "any JSON object") and a byte-level recogniser that says which tokens may come next.
 *
 * Contract: every prefix the recogniser accepts can still be completed (the compiler removes the parts that
 * accept nothing and refuses a grammar that accepts nothing), so constrained decoding never paints itself
 * into a corner. A state is a small set of threads (alternatives of anyOf that are still open), each a
 * stack of frames; it is a value that can be copied with grammar_state_copy. grammar_state_cost() is the
 * fewest bytes that complete the output: with a token budget, the mask keeps only tokens after which the
 * output can still close (and end-of-generation fit) within the budget, so a well-formed answer ends before
 * max_tokens whenever the budget allows it at all.
 * Masks walk a trie of the vocabulary's byte pieces (struct gvocab), pruning every subtree whose prefix is
 * refused; inside a plain JSON string the tokens made of ordinary characters are taken in bulk. A grammar and
 * a gvocab are immutable once built and may be shared by threads; states and scratch belong to one caller.
 * Usage: grammar from json_schema_compile()/tool_call_grammar(); st = grammar_state_new(g);
 *        grammar_mask(g, st, v, budget, allowed, scr); ... grammar_state_feed(g, st, piece, len); ...
 */
#ifndef FERRY_GRAMMAR_H
#define FERRY_GRAMMAR_H

#include <stddef.h>
#include <stdint.h>

#define GRAMMAR_MAX_THREADS 8  /* open alternatives kept at once (more are dropped: still valid) */
#define GRAMMAR_MAX_DEPTH   64 /* frames per thread: nesting of containers and sequences */
#define GRAMMAR_MAX_NODES   60000

struct grammar;
struct gstate;
struct gvocab;
struct gscratch;

void grammar_free(struct grammar *g);

/* A grammar for one JSON object of any content (response_format json_object), with whitespace allowed
 * before and after it; ws bounds each run of whitespace (0: none allowed). Whitespace gaps are an optional
 * newline and then spaces or tabs, unless any_ws (any of the four JSON whitespace bytes, in any order). */
int grammar_json_object(struct grammar **out, int ws, int any_ws, char err[256]);

/* A GBNF grammar (llama.cpp's format, runtime/grammar_gbnf.c) from len bytes of text; errors name the line. */
int grammar_gbnf(const char *src, size_t len, struct grammar **out, char err[256]);

/* ---- states ---- */
struct gstate *grammar_state_new(const struct grammar *g); /* the initial state; NULL when out of memory */
void grammar_state_free(struct gstate *st);
void grammar_state_copy(struct gstate *dst, const struct gstate *src);
/* Feeds bytes; 0 when all were accepted, -1 otherwise (st is then unchanged). */
int grammar_state_feed(const struct grammar *g, struct gstate *st, const char *s, size_t n);
/* 1 when the output may end here. */
int grammar_state_accepting(const struct grammar *g, const struct gstate *st);
/* 1 when no further byte can be accepted (the output is complete). */
int grammar_state_finished(const struct grammar *g, const struct gstate *st);
/* Fewest bytes that complete the output from st (0 when accepting). */
uint32_t grammar_state_cost(const struct grammar *g, const struct gstate *st);

/* ---- vocabulary and masks ---- */
/* Builds the tries over the tokens whose is_text[i] is set (pieces[i], lens[i] bytes each). The arrays are
 * read during the call only. */
int gvocab_init(struct gvocab **out, int n_vocab, const char *const *pieces, const size_t *lens,
                const uint8_t *is_text);
void gvocab_free(struct gvocab *v);

struct gscratch *gscratch_new(void);
void gscratch_free(struct gscratch *s);

/* Sets allowed[t] to 1 for every text token that may come next and to 0 for all others (allowed has n_vocab
 * entries). budget: the tokens still allowed including this one (end of generation included), or -1 for no
 * limit. Returns 1 when the output may end here (end-of-generation tokens are then allowed: the caller
 * decides), 0 when not, FERRY_ERR_NOMEM. When the budget leaves no token, the tokens that come closest are
 * allowed. */
int grammar_mask(const struct grammar *g, const struct gstate *st, const struct gvocab *v, int budget,
                 uint8_t *allowed, struct gscratch *scr);

#endif
