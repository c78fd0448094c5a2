/* tool_call — see tool_call.h. The grammar reuses json_schema.c for each tool's arguments; the parser finds
 * the convention's markers and reads each call with jansson (JSON_DISABLE_EOF_CHECK: one value, then its
 * end).
 */
#include "runtime/tool_call.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/core/status.h"
#include "runtime/grammar_build.h"
#include "runtime/json_schema.h"

static const char HERMES_OPEN[] = "<tool_call>", HERMES_CLOSE[] = "</tool_call>";
static const char MISTRAL_MARK[] = "[TOOL_CALLS]", PYTHON_TAG[] = "<|python_tag|>";

enum tool_format tool_format_of(const char *tmpl)
{
    if (!tmpl) return TOOL_FORMAT_GENERIC;
    if (strstr(tmpl, HERMES_OPEN)) return TOOL_FORMAT_HERMES;
    if (strstr(tmpl, MISTRAL_MARK)) return TOOL_FORMAT_MISTRAL;
    if (strstr(tmpl, PYTHON_TAG) || (strstr(tmpl, "<|start_header_id|>") && strstr(tmpl, "tools")))
        return TOOL_FORMAT_LLAMA3;
    return TOOL_FORMAT_GENERIC;
}

const char *tool_format_name(enum tool_format f)
{
    static const char *names[] = {"generic", "hermes", "llama3", "mistral"};
    return (unsigned)f < 4 ? names[f] : "?";
}

const char *tool_call_prompt_suffix(enum tool_format f)
{
    return f == TOOL_FORMAT_MISTRAL ? MISTRAL_MARK : "";
}

/* ---- grammar ---------------------------------------------------------------------------------------- */

/* {"name": "<one of the tools>", "<key>": <its arguments>} */
static int call_node(struct gbuilder *b, const struct tool_def *tools, int n, const char *key, int ws,
                     char err[256])
{
    struct gb_lit *lits = calloc((size_t)n, sizeof *lits);
    char **names = calloc((size_t)n, sizeof *names);
    int node = -1;
    if (!lits || !names) {
        gb_fail(b, FERRY_ERR_NOMEM, "out of memory");
        goto out;
    }
    char sep[32];
    snprintf(sep, sizeof sep, ", \"%s\": ", key);
    for (int i = 0; i < n; i++) {
        int args;
        if (tools[i].parameters) {
            char serr[256];
            int rc =
                json_schema_compile(b, tools[i].parameters, strlen(tools[i].parameters), ws, &args, serr);
            if (rc) {
                snprintf(err, 256, "tool '%.64s': %.170s", tools[i].name, serr);
                gb_fail(b, rc, "%s", err);
                goto out;
            }
        } else { /* no schema: an object of any content (the arguments are always an object) */
            args = gb_object(b, NULL, 0, gb_any(b, ws), ws);
        }
        int kids[3] = {gb_lit(b, sep, strlen(sep)), args, gb_lit(b, "}", 1)};
        size_t nl = strlen(tools[i].name);
        names[i] = malloc(nl + 2);
        if (!names[i]) {
            gb_fail(b, FERRY_ERR_NOMEM, "out of memory");
            goto out;
        }
        memcpy(names[i], tools[i].name, nl);
        names[i][nl] = '"'; /* the name's closing quote makes the members prefix-free */
        names[i][nl + 1] = 0;
        lits[i] = (struct gb_lit){names[i], nl + 1, gb_seq(b, kids, 3)};
    }
    {
        int kids[2] = {gb_lit(b, "{\"name\": \"", 10), gb_litset(b, lits, n)};
        node = gb_seq(b, kids, 2);
    }
out:
    for (int i = 0; names && i < n; i++) free(names[i]);
    free(names);
    free(lits);
    return node;
}

/* first, then up to more - 1 times (sep first) */
static int repeat(struct gbuilder *b, int first, int again, int max)
{
    if (max <= 1) return first;
    int kids[2] = {first, gb_rep(b, again, 0, max - 1)};
    return gb_seq(b, kids, 2);
}

int tool_call_grammar(enum tool_format f, const struct tool_def *tools, int n, int max_calls, int ws,
                      struct grammar **out, char err[256])
{
    *out = NULL;
    err[0] = 0;
    if (n <= 0) return ferry_fail(err, FERRY_ERR_INVALID, "no tools to call");
    if (max_calls > TOOL_CALL_MAX) max_calls = TOOL_CALL_MAX;
    struct gbuilder *b;
    if (gb_init(&b)) return ferry_fail(err, FERRY_ERR_NOMEM, "out of memory");
    int root;
    if (f == TOOL_FORMAT_LLAMA3) {
        root = call_node(b, tools, n, "parameters", ws, err);
    } else if (f == TOOL_FORMAT_MISTRAL) {
        int call = call_node(b, tools, n, "arguments", ws, err);
        int next[2] = {gb_lit(b, ", ", 2), call};
        int kids[3] = {gb_lit(b, "[", 1), repeat(b, call, gb_seq(b, next, 2), max_calls), gb_lit(b, "]", 1)};
        root = gb_seq(b, kids, 3);
    } else {
        int call = call_node(b, tools, n, "arguments", ws, err);
        int blk[3] = {gb_lit(b, "<tool_call>\n", 12), call, gb_lit(b, "\n</tool_call>", 13)};
        int block = gb_seq(b, blk, 3);
        int next[2] = {gb_lit(b, "\n", 1), block};
        root = repeat(b, block, gb_seq(b, next, 2), max_calls);
    }
    if (err[0]) {
        int st = gb_error(b, NULL);
        gb_free(b);
        return st ? st : FERRY_ERR_INVALID;
    }
    return gb_finish(b, root, out, err);
}

/* ---- parser ------------------------------------------------------------------------------------------- */

void tool_parse_free(struct tool_parse *p)
{
    for (int i = 0; i < p->n_calls; i++) {
        free(p->calls[i].name);
        free(p->calls[i].arguments);
    }
    p->n_calls = 0;
}

static int is_ws(char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

static size_t skip_ws(const char *s, size_t i, size_t n)
{
    while (i < n && is_ws(s[i])) i++;
    return i;
}

/* Length of the longest suffix of s[0, n) that is a proper prefix of marker. */
static size_t partial_marker(const char *s, size_t n, const char *marker)
{
    size_t m = strlen(marker);
    for (size_t k = m - 1 < n ? m - 1 : n; k > 0; k--)
        if (!memcmp(s + n - k, marker, k)) return k;
    return 0;
}

static const char *find(const char *s, size_t n, const char *needle)
{
    return memmem(s, n, needle, strlen(needle));
}

/* A call from a parsed object: {"name": str, "arguments" | "parameters": object or string}. 1 = added,
 * 0 = not a call, FERRY_ERR_NOMEM. */
static int add_call(struct tool_parse *p, json_t *o)
{
    json_t *name = json_object_get(o, "name");
    json_t *args = json_object_get(o, "arguments");
    if (!args) args = json_object_get(o, "parameters");
    if (!json_is_object(o) || !json_is_string(name) || json_string_length(name) == 0) return 0;
    if (args && !json_is_object(args) && !json_is_string(args)) return 0;
    if (p->n_calls >= TOOL_CALL_MAX) return 1; /* kept the first ones */
    char *a = !args                  ? strdup("{}")
              : json_is_string(args) ? strdup(json_string_value(args))
                                     : json_dumps(args, JSON_COMPACT);
    char *nm = strdup(json_string_value(name));
    if (!a || !nm) {
        free(a);
        free(nm);
        return FERRY_ERR_NOMEM;
    }
    p->calls[p->n_calls].name = nm;
    p->calls[p->n_calls].arguments = a;
    p->n_calls++;
    return 1;
}

/* Parses one JSON value at s[0, n); *used gets its length. NULL when it is not (yet) one. */
static json_t *parse_value(const char *s, size_t n, size_t *used)
{
    json_error_t e;
    json_t *v = json_loadb(s, n, JSON_DISABLE_EOF_CHECK | JSON_DECODE_ANY, &e);
    if (v) *used = (size_t)e.position;
    return v;
}

/* The call section of HERMES: blocks from `at`. Returns 1 when the section failed (the caller decides). */
static int parse_hermes(struct tool_parse *p, const char *t, size_t n, size_t at, int final, int *rc)
{
    for (;;) {
        at = skip_ws(t, at, n);
        if (at >= n) return 0;
        if (n - at < sizeof HERMES_OPEN - 1) return final || memcmp(t + at, HERMES_OPEN, n - at) ? final : 0;
        if (memcmp(t + at, HERMES_OPEN, sizeof HERMES_OPEN - 1))
            return final; /* other text: ends the section */
        at += sizeof HERMES_OPEN - 1;
        const char *close = find(t + at, n - at, HERMES_CLOSE);
        size_t end = close ? (size_t)(close - t) : n;
        if (!close && !final) return 0; /* still coming */
        size_t used;
        json_t *o = parse_value(t + at, end - at, &used);
        int r = o && skip_ws(t + at, used, end - at) == end - at ? add_call(p, o) : 0;
        json_decref(o);
        if (r < 0) {
            *rc = r;
            return 0;
        }
        if (r == 0) return 1;
        if (!close) return 0;
        at = end + sizeof HERMES_CLOSE - 1;
    }
}

/* LLAMA3 and the array of MISTRAL: JSON values separated by whitespace or ';' (LLAMA3) from `at`. */
static int parse_json_calls(struct tool_parse *p, const char *t, size_t n, size_t at, int array, int *rc)
{
    at = skip_ws(t, at, n);
    if (!array && n - at >= sizeof PYTHON_TAG - 1 && !memcmp(t + at, PYTHON_TAG, sizeof PYTHON_TAG - 1))
        at += sizeof PYTHON_TAG - 1;
    int any = 0;
    while ((at = skip_ws(t, at, n)) < n) {
        size_t used;
        json_t *v = parse_value(t + at, n - at, &used);
        if (!v) return 1;
        int r = 0;
        if (array && json_is_array(v)) {
            size_t i;
            json_t *x;
            r = json_array_size(v) > 0;
            json_array_foreach(v, i, x) if (r > 0) r = add_call(p, x);
        } else if (!array) {
            r = add_call(p, v);
        }
        json_decref(v);
        if (r < 0) {
            *rc = r;
            return 0;
        }
        if (r == 0) return 1;
        any = 1;
        at = skip_ws(t, at + used, n);
        if (array) return at < n; /* one array */
        if (at < n && t[at] == ';') at++;
    }
    return !any;
}

int tool_call_parse(enum tool_format f, const char *text, size_t len, int final, int prefixed,
                    struct tool_parse *out)
{
    memset(out, 0, sizeof *out);
    int rc = 0, failed = 0;
    size_t start = 0;
    if (f == TOOL_FORMAT_LLAMA3) {
        size_t a = skip_ws(text, 0, len);
        if (a == len) { /* only whitespace so far: a call may still follow, so none of it is content yet */
            out->content_end = final ? len : 0;
            return 0;
        }
        int maybe = prefixed || (a < len && text[a] == '{') ||
                    (a < len && !memcmp(text + a, PYTHON_TAG,
                                        len - a < sizeof PYTHON_TAG - 1 ? len - a : sizeof PYTHON_TAG - 1));
        if (!maybe) {
            out->content_end = len;
            return 0;
        }
        if (!final) return 0; /* held until the end: only then is it known to be a call */
        failed = parse_json_calls(out, text, len, 0, 0, &rc);
    } else {
        const char *mark = f == TOOL_FORMAT_MISTRAL ? MISTRAL_MARK : HERMES_OPEN;
        if (!prefixed) {
            const char *at = find(text, len, mark);
            if (!at) {
                out->content_end = final ? len : len - partial_marker(text, len, mark);
                return 0;
            }
            start = (size_t)(at - text);
            out->content_end = start;
        }
        if (f == TOOL_FORMAT_MISTRAL) {
            if (!prefixed) start += sizeof MISTRAL_MARK - 1;
            size_t used;
            json_t *v = parse_value(text + start, len - start, &used);
            if (v || final) {
                json_decref(v);
                failed = parse_json_calls(out, text, len, start, 1, &rc);
            }
        } else {
            failed = parse_hermes(out, text, len, start, final, &rc);
        }
    }
    if (rc) {
        tool_parse_free(out);
        return rc;
    }
    if (failed && final && out->n_calls == 0) out->content_end = len; /* not a call after all: content */
    return 0;
}
