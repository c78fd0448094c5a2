/* chat_template — renders a list of chat messages through a model's Jinja chat template.
 *
 * Implements the Jinja subset that real chat templates use, with the semantics of HF's
 * apply_chat_template (jinja2 sandbox, trim_blocks + lstrip_blocks, loopcontrols, raise_exception,
 * strftime_now, HF's tojson); anything else is a clear FERRY_ERR_UNSUPPORTED naming the construct and
 * its byte offset. Built-in templates (chatml, llama2, llama3, mistral, gemma, phi3, zephyr) serve
 * models without one and the --chat-template override. Rendering is bounded in output size, memory,
 * steps and depth. Thread-safe: a render shares no state with another.
 *
 * Supported: text, {{ }}, {% %}, {# #}, `-`/`+` whitespace control; if/elif/else, for (loop.index,
 * index0, revindex, revindex0, first, last, length, previtem, nextitem, cycle; `for a, b in`; `if`
 * filter; else), break/continue, set (names, tuples, `ns.attr`, block set), macro (positional,
 * keyword, defaults), generation blocks; None/bool/int/float/str/list/tuple/dict/namespace values;
 * + - * / // % ** ~, comparisons (chained), and/or/not, in/not in, ternary, [] index, [a:b:c] slices
 * (code points), . attributes, list/dict/tuple literals; filters trim upper lower capitalize title
 * length count first last join default/d replace tojson string int float abs list reverse items
 * indent safe select reject selectattr rejectattr map sort unique min max sum; str methods strip
 * lstrip rstrip upper lower title capitalize startswith endswith split replace join find count;
 * dict get items keys values; tests defined undefined none string number integer float boolean true
 * false sequence mapping iterable callable equalto/eq ne lt le gt ge in odd even divisibleby lower
 * upper; globals range namespace dict raise_exception strftime_now; Undefined like Jinja's default.
 * Context: messages (dicts with role, content), add_generation_prompt, bos_token, eos_token, and
 * tools = documents = None as HF passes them; chat_template_render_json passes messages, tools and extra
 * variables from JSON (tool calls, tool results, date_string ...).
 * Also: filter blocks, dictsort, str.format with plain fields, Markup (`|safe` + str escapes the str, as
 * markupsafe does), select/selectattr/map over none (nothing).
 * Not supported: include/extends/import/block, raw, call blocks, recursive loops, printf-style `%`
 * formatting, str.format specs and conversions, macro varargs/caller; case mapping is ASCII-only.
 */
#ifndef FERRY_CHAT_TEMPLATE_H
#define FERRY_CHAT_TEMPLATE_H

#include <stddef.h>

struct chat_msg {
    const char *role;    /* "system", "user", "assistant", "tool" */
    const char *content; /* UTF-8, NUL-terminated */
};

/* Bounds of one render; exceeding any is FERRY_ERR_RANGE, never a crash or unbounded memory. */
struct chat_template_params {
    size_t max_output;   /* bytes of rendered text (default 4 MiB) */
    size_t max_memory;   /* bytes of working memory (default 64 MiB + 16x the message bytes) */
    long long max_steps; /* evaluation steps: statements + expression nodes (default 1M) */
    int max_depth;       /* nesting of evaluation, macro calls included (default 400) */
};
struct chat_template_params chat_template_default_params(void);

/* Renders; *out is malloc'd and NUL-terminated. err gets a one-line message on failure.
 * bos_token/eos_token may be NULL (then undefined in the template, as in Jinja).
 * Errors: FERRY_ERR_FORMAT malformed template, FERRY_ERR_UNSUPPORTED construct outside the subset (both
 * name the byte offset in the template, after CRLF->LF normalisation), FERRY_ERR_INVALID runtime error
 * (raise_exception: err is exactly its message; type errors, undefined access), FERRY_ERR_RANGE a bound
 * was exceeded, FERRY_ERR_NOMEM. */
int chat_template_render(const char *tmpl, const struct chat_msg *msgs, int n_msgs, int add_generation_prompt,
                         const char *bos_token, const char *eos_token, char **out, size_t *out_len,
                         char err[256]);

/* Compiles without rendering: FERRY_OK, or the error a render would report for the template itself
 * (FERRY_ERR_FORMAT malformed, FERRY_ERR_UNSUPPORTED a construct outside the subset, with the byte offset).
 * A server checks its template once at start-up. Filters and methods are looked up when they run. */
int chat_template_check(const char *tmpl, char err[256]);

/* The same with explicit bounds (params NULL: defaults). */
int chat_template_render_ex(const char *tmpl, const struct chat_msg *msgs, int n_msgs,
                            int add_generation_prompt, const char *bos_token, const char *eos_token,
                            const struct chat_template_params *params, char **out, size_t *out_len,
                            char err[256]);

/* The variables of a render as JSON texts, the way HF's apply_chat_template receives them: messages (an array
 * of objects: role, content, and tool_calls, tool_call_id, name, ... as the template reads them), tools (an
 * array, or NULL for None) and extra variables (an object, or NULL: e.g. date_string, enable_thinking). */
struct chat_render {
    const char *messages_json;
    const char *tools_json;
    const char *extra_json;
    int add_generation_prompt;
    const char *bos_token, *eos_token; /* may be NULL */
};

/* Renders with JSON-described variables (params NULL: defaults). Errors as chat_template_render; malformed
 * JSON is FERRY_ERR_INVALID. */
int chat_template_render_json(const char *tmpl, const struct chat_render *in,
                              const struct chat_template_params *params, char **out, size_t *out_len,
                              char err[256]);

/* The source of a built-in template by name, or NULL. */
const char *chat_template_builtin(const char *name);

/* The names of the built-in templates, NULL-terminated. */
const char *const *chat_template_builtin_names(void);

#endif
