// SOURCES: runtime/grammar_gbnf.c runtime/grammar.c runtime/grammar_build.c runtime/regex.c
// SOURCES: kernels/core/status.c kernels/core/log.c
// LIBS: -lm
// MAXLEN: 4096
/* fuzz_gbnf — libFuzzer target for the GBNF compiler (runtime/grammar_gbnf.c) and the recogniser it builds.
 * Input: grammar text, optionally followed by a NUL and walk bytes (without a NUL the text's own bytes steer
 * the walk). A refusal must leave a NUL-terminated message naming a line and no grammar. An accepted grammar
 * is walked: each walk byte picks a candidate byte, rotating through all 256 until the recogniser accepts
 * one; while the output is not complete some byte must be accepted (the recogniser's contract: every prefix
 * it accepts can be completed), and a state it calls finished must refuse every further byte. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/grammar.h"

#define CHECK_FAILED() (fprintf(stderr, "%s:%d: check failed\n", __FILE__, __LINE__), __builtin_trap())

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const uint8_t *nul = memchr(data, 0, size);
    const size_t text_len = nul ? (size_t)(nul - data) : size;
    const uint8_t *walk = nul ? nul + 1 : data;
    const size_t walk_len = nul ? size - text_len - 1 : size;
    struct grammar *g = NULL;
    char err[256];
    memset(err, 'x', sizeof err);
    int rc = grammar_gbnf((const char *)data, text_len, &g, err);
    if (rc) {
        if (g || !memchr(err, 0, sizeof err)) CHECK_FAILED();
        return 0;
    }
    if (!g) CHECK_FAILED();
    struct gstate *st = grammar_state_new(g);
    if (st) {
        for (size_t i = 0; i < walk_len && i < 512; i++) {
            if (grammar_state_finished(g, st)) {
                for (int c = 0; c < 256; c++) {
                    char b = (char)c;
                    if (grammar_state_feed(g, st, &b, 1) == 0) CHECK_FAILED();
                }
                break;
            }
            int c = walk[i], tried = 0;
            char b = (char)c;
            while (tried < 256 && grammar_state_feed(g, st, &b, 1) != 0) b = (char)(++c & 0xFF), tried++;
            if (tried == 256) {
                if (!grammar_state_accepting(g, st)) CHECK_FAILED(); /* a dead end */
                break;
            }
        }
        grammar_state_free(st);
    }
    grammar_free(g);
    return 0;
}
