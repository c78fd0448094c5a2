// SOURCES: runtime/tool_call.c runtime/reasoning.c runtime/harmony.c runtime/json_schema.c runtime/grammar.c
// SOURCES: runtime/grammar_build.c runtime/regex.c kernels/core/status.c kernels/core/log.c
// SOURCES: runtime/tok/unicode.c runtime/tok/unicode_tables.c
// LIBS: -ljansson -lm
// MAXLEN: 16384
/* fuzz_tool_call — libFuzzer target for the parsers of model output: the tool-call parser of each convention
 * (runtime/tool_call.c) and the <think> splitter (runtime/reasoning.c). The first byte picks the convention,
 * final, prefixed and started; the rest is the model's text. Checks, besides no crash, leak or sanitizer
 * report:
 *   tool calls: content_end <= len; at most TOOL_CALL_MAX calls, each with a non-empty name and arguments that
 *   parse as a JSON object (jansson, NUL allowed; where jansson refuses a number beyond its range or a lone
 *   surrogate escape, which JSON allows and the parser then passes through as written, the text must still
 *   open an object); streaming never takes content back: parsing every prefix (in steps) gives a
 *   content_end that never decreases and never exceeds the final parse's, and a call count that never drops.
 *   reasoning: both parts lie inside the text, in order, without overlap; a streamed split's parts only grow
 *   and stay prefixes of the final one.
 */
#include <jansson.h>
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/reasoning.h"
#include "runtime/tool_call.h"

/* a failed check names its line, then traps */
#define CHECK_FAILED() (fprintf(stderr, "%s:%d: check failed\n", __FILE__, __LINE__), __builtin_trap())

static void check_calls(const struct tool_parse *p, size_t len)
{
    if (p->content_end > len || p->n_calls < 0 || p->n_calls > TOOL_CALL_MAX) CHECK_FAILED();
    for (int i = 0; i < p->n_calls; i++) {
        const struct tool_call_out *c = &p->calls[i];
        if (!c->name || !c->name[0] || !c->arguments) CHECK_FAILED();
        json_error_t e;
        json_t *v = json_loads(c->arguments, JSON_ALLOW_NUL, &e);
        if (v ? !json_is_object(v)
              : c->arguments[0] != '{' || !(strstr(e.text, "too big") || strstr(e.text, "overflow") ||
                                            strstr(e.text, "invalid Unicode")))
            CHECK_FAILED();
        json_decref(v);
    }
}

static void check_split(const struct reasoning_split *s, size_t len)
{
    if (s->r_start > s->r_end || s->r_end > len || s->a_start > s->a_end || s->a_end > len) CHECK_FAILED();
    if (s->r_end > s->r_start && s->a_end > s->a_start && s->r_end > s->a_start) CHECK_FAILED();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1) return 0;
    const int f = data[0] & 3, prefixed = data[0] >> 2 & 1, started = data[0] >> 3 & 1;
    const size_t step = 1 + (data[0] >> 4); /* prefix lengths of the streaming check */
    const char *text = (const char *)data + 1;
    const size_t len = size - 1;

    struct tool_parse fin;
    if (tool_call_parse((enum tool_format)f, text, len, 1, prefixed, &fin)) return 0; /* out of memory */
    check_calls(&fin, len);
    size_t last_end = 0;
    int last_calls = 0;
    for (size_t n = 0; n <= len; n += step) {
        struct tool_parse p;
        if (tool_call_parse((enum tool_format)f, text, n, 0, prefixed, &p)) break;
        check_calls(&p, n);
        if (p.content_end < last_end || p.content_end > fin.content_end || p.n_calls < last_calls)
            CHECK_FAILED();
        last_end = p.content_end;
        last_calls = p.n_calls;
        tool_parse_free(&p);
    }
    tool_parse_free(&fin);

    struct reasoning_split whole, part;
    reasoning_split(text, len, started, 1, &whole);
    check_split(&whole, len);
    size_t r_len = 0, a_len = 0;
    for (size_t n = 0; n <= len; n += step) {
        reasoning_split(text, n, started, 0, &part);
        check_split(&part, n);
        const size_t rl = part.r_end - part.r_start, al = part.a_end - part.a_start;
        if (rl < r_len || al < a_len) CHECK_FAILED();
        if (rl && (part.r_start != whole.r_start || rl > whole.r_end - whole.r_start)) CHECK_FAILED();
        if (al && (part.a_start != whole.a_start || al > whole.a_end - whole.a_start)) CHECK_FAILED();
        r_len = rl;
        a_len = al;
    }
    (void)reasoning_prompt_started(text, len);
    return 0;
}
