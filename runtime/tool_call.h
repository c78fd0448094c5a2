/* tool_call — model-side tool calling: which convention a chat template uses, the grammar of a call when one
 * is required (constrained decoding), and the parser that turns model output into calls.
 *
 * Conventions (tool_format_of reads the template's source):
 *   HERMES  (Qwen2.5, Hermes): <tool_call>\n{"name": "f", "arguments": {...}}\n</tool_call>, repeatable
 *   LLAMA3  (Llama 3.1+): {"name": "f", "parameters": {...}} as the whole answer (after <|python_tag|> or
 * not) MISTRAL (Nemo and later): [TOOL_CALLS][{"name": "f", "arguments": {...}}, ...] GENERIC (templates that
 * do not render tools, e.g. SmolLM2/chatml): the server describes the tools in the system prompt and the
 * model answers as HERMES does. The parser works on the text so far (streaming) or the whole text (final): it
 * never takes back what it called content, so the caller can stream content[0, content_end) as it grows. Text
 * that may still become a call is held back. A call section that does not parse at the end is returned as
 * content. HARMONY (gpt-oss) messages carry their calls in headers: runtime/harmony.h reads them. Parsers
 * read (ptr, len) and copy what they return; tool_parse_free releases it. The grammar and the parser agree:
 * everything the grammar generates parses as calls, arguments included (always an object).
 */
#ifndef FERRY_TOOL_CALL_H
#define FERRY_TOOL_CALL_H

#include <stddef.h>

#include "runtime/grammar.h"

enum tool_format {
    TOOL_FORMAT_GENERIC = 0,
    TOOL_FORMAT_HERMES = 1,
    TOOL_FORMAT_LLAMA3 = 2,
    TOOL_FORMAT_MISTRAL = 3,
    /* gpt-oss: read by runtime/harmony.h, not by tool_call_parse; no call grammar */
    TOOL_FORMAT_HARMONY = 4
};

#define TOOL_CALL_MAX 16 /* calls kept from one answer */

enum tool_format tool_format_of(const char *tmpl);
const char *tool_format_name(enum tool_format f);

struct tool_def {
    const char *name;       /* [A-Za-z0-9_-]{1,64} (the API checks) */
    const char *parameters; /* JSON Schema text of the arguments; NULL: an object of any content */
};

/* The grammar of the output when a call is required: at least one call to one of tools[0, n) (the caller
 * passes only the named tool for a named tool_choice), up to max_calls of them where the convention allows
 * several. err names the tool whose schema fails. */
int tool_call_grammar(enum tool_format f, const struct tool_def *tools, int n, int max_calls, int ws,
                      struct grammar **out, char err[256]);
/* What the prompt must end with before a required call (MISTRAL: "[TOOL_CALLS]"), else "". */
const char *tool_call_prompt_suffix(enum tool_format f);

struct tool_call_out {
    char *name;
    char *arguments; /* the text of a JSON object, always (a string holding one is unwrapped; anything else
                      * is not a call) */
};

struct tool_parse {
    size_t content_end; /* text[0, content_end) is content, final */
    int n_calls;
    struct tool_call_out calls[TOOL_CALL_MAX]; /* complete calls, in order */
};

/* Parses text[0, len). prefixed: the prompt already ended with the convention's call marker (a required
 * call), so the whole text is the call section. Returns 0 or FERRY_ERR_NOMEM. */
int tool_call_parse(enum tool_format f, const char *text, size_t len, int final, int prefixed,
                    struct tool_parse *out);
void tool_parse_free(struct tool_parse *p);
/* The arguments of a call written as s[0, n): one JSON object, whitespace around it allowed. *out gets its
 * text (malloc'd), compact as jansson writes it, or as written where jansson cannot hold a number of it.
 * Returns 1 (an object), 0 (not one: *out NULL) or FERRY_ERR_NOMEM. */
int tool_call_args_object(const char *s, size_t n, char **out);

#endif
