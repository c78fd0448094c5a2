// SOURCES: runtime/json_schema.c runtime/grammar.c runtime/grammar_build.c runtime/regex.c
// SOURCES: kernels/core/status.c kernels/core/log.c
// LIBS: -ljansson -lm
// MAXLEN: 8192
/* fuzz_json_schema — libFuzzer target for the JSON-schema compiler (runtime/json_schema.c) and the grammar it
 * builds. Input: a schema text, optionally followed by a NUL and walk bytes (without a NUL the schema's own
 * bytes steer the walk). The schema is compiled; a refusal must leave a NUL-terminated message and no
 * grammar. An accepted schema is walked: each walk byte picks a candidate byte from a JSON-shaped alphabet,
 * rotating until the recogniser accepts one, and whenever the state is accepting, the bytes so far must parse
 * as one JSON value (jansson): the grammar only generates what the schema accepts, and that is JSON. A state
 * the recogniser calls finished must refuse every further byte. */
#include <jansson.h>
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/grammar.h"
#include "runtime/json_schema.h"

/* a failed check names its line, then traps */
#define CHECK_FAILED() (fprintf(stderr, "%s:%d: check failed\n", __FILE__, __LINE__), __builtin_trap())

static const char alphabet[] = "{}[]\":, \n\t0123456789-+.eEtrufalsn\\/abcxyzABC_@T:Z";

static void check_json(const char *s, size_t n)
{
    json_error_t e;
    json_t *v = json_loadb(s, n, JSON_DECODE_ANY | JSON_ALLOW_NUL, &e);
    /* the grammar accepted text that is not JSON (jansson refuses integers beyond int64 and reals beyond a
     * double's range, which JSON allows: the grammar bounds digits only where the schema bounds the value;
     * and \u0000 in an object's key, which JSON allows too) */
    if (!v && !strstr(e.text, "overflow") && !strstr(e.text, "too big") &&
        !strstr(e.text, "NUL byte in object key")) {
        fprintf(stderr, "not JSON (%s): [%.*s]\n", e.text, (int)n, s);
        CHECK_FAILED();
    }
    json_decref(v);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const uint8_t *nul = memchr(data, 0, size);
    const size_t schema_len = nul ? (size_t)(nul - data) : size;
    const uint8_t *walk = nul ? nul + 1 : data;
    const size_t walk_len = nul ? size - schema_len - 1 : size;
    struct grammar *g = NULL;
    char err[256];
    memset(err, 'x', sizeof err);
    int rc = json_schema_grammar((const char *)data, schema_len, (int)(size % 3), &g, err);
    if (rc) {
        if (g || !memchr(err, 0, sizeof err)) CHECK_FAILED();
        return 0;
    }
    if (!g) CHECK_FAILED();
    struct gstate *st = grammar_state_new(g);
    char out[512];
    size_t n = 0;
    if (st) {
        for (size_t i = 0; i < walk_len && n < sizeof out; i++) {
            if (grammar_state_accepting(g, st)) check_json(out, n);
            if (grammar_state_finished(g, st)) {
                for (const char *a = alphabet; *a; a++)
                    if (grammar_state_feed(g, st, a, 1) == 0) CHECK_FAILED();
                break;
            }
            const size_t k = sizeof alphabet - 1;
            size_t j = walk[i] % k, tried = 0;
            while (tried < k && grammar_state_feed(g, st, &alphabet[j], 1) != 0) j = (j + 1) % k, tried++;
            if (tried == k) break; /* the next byte is outside the alphabet (a pattern, a long string) */
            out[n++] = alphabet[j];
        }
        if (grammar_state_accepting(g, st)) check_json(out, n);
        grammar_state_free(st);
    }
    grammar_free(g);
    return 0;
}
