// SOURCES: runtime/harmony.c runtime/tool_call.c runtime/json_schema.c runtime/grammar.c
// SOURCES: runtime/grammar_build.c runtime/regex.c kernels/core/status.c kernels/core/log.c
// SOURCES: runtime/tok/unicode.c runtime/tok/unicode_tables.c
// LIBS: -ljansson -lm
// MAXLEN: 16384
/* fuzz_harmony — libFuzzer target for the split of gpt-oss (harmony) output (runtime/harmony.c). The first
 * byte picks the flags and the streaming step; the rest is the model's text. Checks, besides no crash, leak
 * or sanitizer report: reasoning and content are no longer than the text and NUL-terminated; at most
 * TOOL_CALL_MAX calls, each with a non-empty name and arguments that are a JSON object (or, where jansson
 * cannot hold a number, text that opens one); streaming never takes anything back: every prefix parse's
 * reasoning and content are prefixes of the whole parse's and its calls are the whole parse's first ones.
 */
#include <jansson.h>
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/harmony.h"

/* a failed check names its line, then traps */
#define CHECK_FAILED() (fprintf(stderr, "%s:%d: check failed\n", __FILE__, __LINE__), __builtin_trap())

static void check_parse(const struct harmony_parse *p, size_t len)
{
    if (!p->reasoning || !p->content || p->r_len > len || p->c_len > len) CHECK_FAILED();
    if (p->reasoning[p->r_len] || p->content[p->c_len]) CHECK_FAILED();
    if (p->calls.n_calls < 0 || p->calls.n_calls > TOOL_CALL_MAX) CHECK_FAILED();
    for (int i = 0; i < p->calls.n_calls; i++) {
        const struct tool_call_out *c = &p->calls.calls[i];
        if (!c->name || !c->name[0] || !c->arguments) CHECK_FAILED();
        json_t *v = json_loads(c->arguments, JSON_ALLOW_NUL, NULL);
        if (v ? !json_is_object(v) : c->arguments[0] != '{') CHECK_FAILED();
        json_decref(v);
    }
}

static int prefix_of(const char *a, size_t an, const char *b, size_t bn)
{
    return an <= bn && !memcmp(a, b, an);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1) return 0;
    const int flags = data[0] & 3;
    const size_t step = 1 + (data[0] >> 2); /* prefix lengths of the streaming check */
    const char *text = (const char *)data + 1;
    const size_t len = size - 1;
    struct harmony_parse whole;
    if (harmony_parse(text, len, 1, flags, &whole)) return 0; /* out of memory */
    check_parse(&whole, len);
    size_t r_len = 0, c_len = 0;
    int n_calls = 0;
    for (size_t n = 0; n <= len; n += step) {
        struct harmony_parse p;
        if (harmony_parse(text, n, 0, flags, &p)) break;
        check_parse(&p, n);
        if (!prefix_of(p.reasoning, p.r_len, whole.reasoning, whole.r_len) ||
            !prefix_of(p.content, p.c_len, whole.content, whole.c_len) || p.r_len < r_len ||
            p.c_len < c_len || p.calls.n_calls < n_calls || p.calls.n_calls > whole.calls.n_calls)
            CHECK_FAILED();
        for (int i = 0; i < p.calls.n_calls; i++)
            if (strcmp(p.calls.calls[i].name, whole.calls.calls[i].name) ||
                strcmp(p.calls.calls[i].arguments, whole.calls.calls[i].arguments))
                CHECK_FAILED();
        r_len = p.r_len, c_len = p.c_len, n_calls = p.calls.n_calls;
        harmony_parse_free(&p);
    }
    harmony_parse_free(&whole);
    char *tmpl = strndup(text, len); /* a template is a C string */
    if (tmpl) (void)harmony_template_is(tmpl);
    free(tmpl);
    return 0;
}
