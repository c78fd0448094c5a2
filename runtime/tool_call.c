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
#include "runtime/harmony.h"
#include "runtime/json_schema.h"
#include "runtime/tok/unicode.h"

static const char HERMES_OPEN[] = "<tool_call>", HERMES_CLOSE[] = "</tool_call>";
static const char MISTRAL_MARK[] = "[TOOL_CALLS]", PYTHON_TAG[] = "<|python_tag|>";

enum tool_format tool_format_of(const char *tmpl)
{
    if (!tmpl) return TOOL_FORMAT_GENERIC;
    if (harmony_template_is(tmpl)) return TOOL_FORMAT_HARMONY;
    if (strstr(tmpl, HERMES_OPEN)) return TOOL_FORMAT_HERMES;
    if (strstr(tmpl, MISTRAL_MARK)) return TOOL_FORMAT_MISTRAL;
    if (strstr(tmpl, PYTHON_TAG) || (strstr(tmpl, "<|start_header_id|>") && strstr(tmpl, "tools")))
        return TOOL_FORMAT_LLAMA3;
    return TOOL_FORMAT_GENERIC;
}

const char *tool_format_name(enum tool_format f)
{
    static const char *names[] = {"generic", "hermes", "llama3", "mistral", "harmony"};
    return (unsigned)f < 5 ? names[f] : "?";
}

const char *tool_call_prompt_suffix(enum tool_format f)
{
    return f == TOOL_FORMAT_MISTRAL ? MISTRAL_MARK : "";
}

/* ---- grammar ---------------------------------------------------------------------------------------- */

/* The schema a call's arguments are generated from. Arguments are always a JSON object (clients decode them
 * as one), so a schema that leaves the type open (no "type", combinator, $ref, enum or const) or lists
 * several types with "object" among them is narrowed to objects: a subset of what it accepts, as
 * json_schema.c generates elsewhere. A schema that still allows something else is refused after the grammar
 * is built (args_only_objects). *out: the narrowed text (malloc'd), or NULL to compile the schema as given.
 * Returns 0 or FERRY_ERR_NOMEM; a schema jansson cannot read is left for json_schema_compile to report. */
static int args_schema(const char *schema, char **out)
{
    *out = NULL;
    json_t *s = json_loads(schema, JSON_DECODE_ANY, NULL);
    if (!json_is_object(s)) {
        json_decref(s);
        return 0;
    }
    static const char *const fixed[] = {"$ref", "allOf", "anyOf", "oneOf", "enum", "const"};
    int open = 1;
    for (size_t i = 0; i < sizeof fixed / sizeof fixed[0]; i++)
        if (json_object_get(s, fixed[i])) open = 0;
    json_t *t = json_object_get(s, "type");
    if (json_is_array(t)) {
        size_t i;
        json_t *x;
        int has_object = 0;
        json_array_foreach(t, i, x) has_object |=
            json_is_string(x) && !strcmp(json_string_value(x), "object");
        if (!has_object) open = 0;
    } else if (t) {
        open = 0; /* one type: "object", or refused later */
    }
    int rc = 0;
    if (open) {
        if (json_object_set_new(s, "type", json_string("object")) || !(*out = json_dumps(s, JSON_COMPACT)))
            rc = FERRY_ERR_NOMEM;
    }
    json_decref(s);
    return rc;
}

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
            char serr[256] = "", *narrowed;
            int rc = args_schema(tools[i].parameters, &narrowed);
            const char *schema = narrowed ? narrowed : tools[i].parameters;
            if (!rc) rc = json_schema_compile(b, schema, strlen(schema), ws, &args, serr);
            free(narrowed);
            if (rc == FERRY_ERR_NOMEM && !serr[0]) snprintf(serr, sizeof serr, "out of memory");
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

/* Whether every tool can be called, and its arguments, as the finished grammar g generates them, begin with
 * '{' (they are then an object: the schema's value is one JSON value). Feeds each tool's call up to its
 * arguments (a tool whose schema accepts no value was dropped from g: the feed fails) and tries every other
 * byte there. 0, or FERRY_ERR_INVALID naming the tool in err, or FERRY_ERR_NOMEM. */
static int args_only_objects(const struct grammar *g, enum tool_format f, const struct tool_def *tools, int n,
                             char err[256])
{
    struct gstate *st = grammar_state_new(g), *tmp = grammar_state_new(g), *init = grammar_state_new(g);
    int rc = st && tmp && init ? 0 : ferry_fail(err, FERRY_ERR_NOMEM, "out of memory");
    const char *open = f == TOOL_FORMAT_HERMES || f == TOOL_FORMAT_GENERIC ? "<tool_call>\n"
                       : f == TOOL_FORMAT_MISTRAL                          ? "["
                                                                           : "";
    const char *key = f == TOOL_FORMAT_LLAMA3 ? "parameters" : "arguments";
    for (int i = 0; !rc && i < n; i++) {
        char pre[160];
        int k = snprintf(pre, sizeof pre, "%s{\"name\": \"%s\", \"%s\": ", open, tools[i].name, key);
        grammar_state_copy(st, init);
        if (k < 0 || (size_t)k >= sizeof pre) continue; /* (names are at most 64 bytes) */
        if (grammar_state_feed(g, st, pre, (size_t)k)) {
            rc = ferry_fail(err, FERRY_ERR_INVALID,
                            "tool '%.64s': its parameters schema accepts no value that ferry can generate",
                            tools[i].name);
            break;
        }
        for (int c = 0; c < 256 && !rc; c++) {
            const char ch = (char)c;
            grammar_state_copy(tmp, st);
            if (c != '{' && !grammar_state_feed(g, tmp, &ch, 1))
                rc = ferry_fail(err, FERRY_ERR_INVALID,
                                "tool '%.64s': its parameters allow arguments that are not a JSON object",
                                tools[i].name);
        }
    }
    grammar_state_free(st);
    grammar_state_free(tmp);
    grammar_state_free(init);
    return rc;
}

int tool_call_grammar(enum tool_format f, const struct tool_def *tools, int n, int max_calls, int ws,
                      struct grammar **out, char err[256])
{
    *out = NULL;
    err[0] = 0;
    if (n <= 0) return ferry_fail(err, FERRY_ERR_INVALID, "no tools to call");
    if (f == TOOL_FORMAT_HARMONY) /* its call headers are control tokens, which a grammar cannot emit */
        return ferry_fail(err, FERRY_ERR_UNSUPPORTED, "no call grammar for the harmony format");
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
    int rc = gb_finish(b, root, out, err);
    if (rc == FERRY_ERR_INVALID && n == 1) { /* the one tool's schema accepts nothing: name it */
        char why[256];
        snprintf(why, sizeof why, "%s", err);
        snprintf(err, 256, "tool '%.64s': %.180s", tools[0].name, why);
    }
    if (!rc && (rc = args_only_objects(*out, f, tools, n, err))) {
        grammar_free(*out);
        *out = NULL;
    }
    return rc;
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

/* ---- JSON spans ----
 * The parser reads the calls with its own scanner of JSON text (RFC 8259), not with jansson: the call grammar
 * generates any JSON, and jansson refuses some of it (integers beyond int64, reals beyond a double, \u0000),
 * which would turn a constrained call into content. jansson decodes only strings and re-encodes the
 * arguments where it can; where it cannot, the arguments are the model's own text, which is valid JSON. */

#define SPAN_MAX_DEPTH 512 /* nesting taken in a call */

/* End of the string at s[i] == '"' (after its closing quote); 0 when invalid or cut off. */
static size_t string_end(const char *s, size_t i, size_t n)
{
    for (i++; i < n;) {
        const unsigned char c = (unsigned char)s[i];
        if (c == '"') return i + 1;
        if (c < 0x20) return 0;
        if (c == '\\') {
            if (i + 1 >= n) return 0;
            if (s[i + 1] == 'u') {
                if (n - i < 6) return 0;
                for (int k = 2; k < 6; k++)
                    if (!strchr("0123456789abcdefABCDEF", s[i + k]) || !s[i + k]) return 0;
                i += 6;
            } else {
                if (!s[i + 1] || !strchr("\"\\/bfnrt", s[i + 1])) return 0;
                i += 2;
            }
            continue;
        }
        if (c < 0x80) {
            i++;
            continue;
        }
        /* UTF-8, as jansson checks it: no overlong forms, surrogates or code points past U+10FFFF */
        int len;
        if (utf8_decode((const unsigned char *)s + i, n - i, &len) >= UTF8_INVALID_BASE) return 0;
        i += (size_t)len;
    }
    return 0;
}

static int is_digit(char c)
{
    return c >= '0' && c <= '9';
}

/* End of the number, string or literal at s[i]; 0 when there is none. A number that reaches the end of the
 * text is taken as it stands (a top-level number is never a call). */
static size_t scalar_end(const char *s, size_t i, size_t n)
{
    if (s[i] == '"') return string_end(s, i, n);
    static const char *const lits[] = {"true", "false", "null"};
    for (int k = 0; k < 3; k++) {
        size_t m = strlen(lits[k]);
        if (s[i] == lits[k][0]) return n - i >= m && !memcmp(s + i, lits[k], m) ? i + m : 0;
    }
    if (s[i] == '-') i++;
    if (i >= n || !is_digit(s[i])) return 0;
    if (s[i] == '0')
        i++;
    else
        while (i < n && is_digit(s[i])) i++;
    if (i < n && s[i] == '.') {
        if (++i >= n || !is_digit(s[i])) return 0;
        while (i < n && is_digit(s[i])) i++;
    }
    if (i < n && (s[i] == 'e' || s[i] == 'E')) {
        if (++i < n && (s[i] == '+' || s[i] == '-')) i++;
        if (i >= n || !is_digit(s[i])) return 0;
        while (i < n && is_digit(s[i])) i++;
    }
    return i;
}

/* After an object's '{' or ',' at s[i - 1]: the member's key and its ':'; the position after them, or 0. */
static size_t member_key(const char *s, size_t i, size_t n)
{
    i = skip_ws(s, i, n);
    if (i >= n || s[i] != '"' || !(i = string_end(s, i, n))) return 0;
    i = skip_ws(s, i, n);
    return i < n && s[i] == ':' ? i + 1 : 0;
}

/* Length of the one JSON value at s[0, n) (no leading whitespace); 0 when s does not begin with a complete
 * one (invalid, cut off, or nested deeper than SPAN_MAX_DEPTH). */
static size_t json_span(const char *s, size_t n)
{
    char open[SPAN_MAX_DEPTH]; /* '{' or '[' of each container around i */
    int depth = 0;
    size_t i = 0;
    for (;;) {
        /* a value at i */
        i = skip_ws(s, i, n);
        if (i >= n) return 0;
        if (s[i] == '{' || s[i] == '[') {
            if (depth == SPAN_MAX_DEPTH) return 0;
            const char close = s[i] == '{' ? '}' : ']';
            open[depth++] = s[i++];
            i = skip_ws(s, i, n);
            if (i < n && s[i] == close) {
                i++;
                depth--;
            } else {
                if (close == '}' && !(i = member_key(s, i, n))) return 0;
                continue;
            }
        } else if (!(i = scalar_end(s, i, n))) {
            return 0;
        }
        /* after a value: a separator, a container's end, or the end of the top-level value */
        for (;;) {
            if (depth == 0) return i;
            i = skip_ws(s, i, n);
            if (i >= n) return 0;
            const int obj = open[depth - 1] == '{';
            if (s[i] == (obj ? '}' : ']')) {
                i++;
                depth--;
                continue;
            }
            if (s[i] != ',') return 0;
            i++;
            if (obj && !(i = member_key(s, i, n))) return 0;
            break;
        }
    }
}

/* The string value s[0, n) (a span from json_span) decoded; NULL when jansson cannot (a lone surrogate). */
static json_t *string_decode(const char *s, size_t n)
{
    return json_loadb(s, n, JSON_DECODE_ANY | JSON_ALLOW_NUL, NULL);
}

/* Whether the key span s[0, n) (quotes included) is the key w. */
static int key_is(const char *s, size_t n, const char *w)
{
    const size_t m = strlen(w);
    if (!memchr(s, '\\', n)) return n == m + 2 && !memcmp(s + 1, w, m);
    json_t *k = string_decode(s, n);
    const int eq = k && json_string_length(k) == m && !memcmp(json_string_value(k), w, m);
    json_decref(k);
    return eq;
}

/* The arguments' text from the object span s[0, n): compact as jansson writes it, or, where jansson cannot
 * read the object (numbers beyond its range), the span itself. NULL when out of memory. */
static char *object_text(const char *s, size_t n)
{
    json_t *v = json_loadb(s, n, JSON_ALLOW_NUL, NULL);
    char *a = v ? json_dumps(v, JSON_COMPACT) : strndup(s, n);
    if (!a && v) a = strndup(s, n); /* jansson could not write it */
    json_decref(v);
    return a;
}

int tool_call_args_object(const char *s, size_t n, char **out)
{
    *out = NULL;
    const size_t i = skip_ws(s, 0, n);
    const size_t span = i < n && s[i] == '{' ? json_span(s + i, n - i) : 0;
    if (!span || skip_ws(s, i + span, n) != n) return 0;
    return (*out = object_text(s + i, span)) ? 1 : FERRY_ERR_NOMEM;
}

/* Arguments written as a JSON string (as OpenAI's API carries them): the string span s[0, n) must hold one
 * JSON object and nothing else but whitespace. *out gets its text; 0 = not an object, FERRY_ERR_NOMEM. */
static int string_args(const char *s, size_t n, char **out)
{
    *out = NULL;
    json_t *str = string_decode(s, n);
    if (!str) return 0;
    const int r = tool_call_args_object(json_string_value(str), json_string_length(str), out);
    json_decref(str);
    return r;
}

/* A call from the value span s[0, n): {"name": str, "arguments" | "parameters": object, or a string holding
 * one}; where a key repeats, the last one counts (as jansson and Python read it). 1 = added, 0 = not a call,
 * FERRY_ERR_NOMEM. */
static int add_call(struct tool_parse *p, const char *s, size_t n)
{
    if (n < 2 || s[0] != '{') return 0;
    const char *name = NULL, *args = NULL, *params = NULL;
    size_t name_n = 0, args_n = 0, params_n = 0;
    size_t i = skip_ws(s, 1, n);
    while (s[i] != '}') { /* a valid span: members, ',' between them, '}' */
        const size_t k0 = i, k1 = string_end(s, i, n);
        i = skip_ws(s, skip_ws(s, k1, n) + 1, n); /* past ':' */
        const size_t vn = json_span(s + i, n - i);
        if (key_is(s + k0, k1 - k0, "name")) name = s + i, name_n = vn;
        if (key_is(s + k0, k1 - k0, "arguments")) args = s + i, args_n = vn;
        if (key_is(s + k0, k1 - k0, "parameters")) params = s + i, params_n = vn;
        i = skip_ws(s, i + vn, n);
        if (s[i] == ',') i = skip_ws(s, i + 1, n);
    }
    if (!args) args = params, args_n = params_n;
    if (!name || name[0] != '"' || (args && args[0] != '{' && args[0] != '"')) return 0;
    json_t *nm = string_decode(name, name_n);
    const int name_ok =
        nm && json_string_length(nm) > 0 && strlen(json_string_value(nm)) == json_string_length(nm);
    char *a = NULL;
    int r = !name_ok ? 0 : !args ? 1 : args[0] == '"' ? string_args(args, args_n, &a) : 1;
    if (r == 1 && p->n_calls >= TOOL_CALL_MAX) { /* kept the first ones */
        json_decref(nm);
        free(a);
        return 1;
    }
    if (r == 1 && !a) a = args ? object_text(args, args_n) : strdup("{}");
    char *copy = r == 1 ? strdup(json_string_value(nm)) : NULL;
    json_decref(nm);
    if (r == 1 && (!a || !copy)) r = FERRY_ERR_NOMEM;
    if (r != 1) {
        free(a);
        free(copy);
        return r;
    }
    p->calls[p->n_calls].name = copy;
    p->calls[p->n_calls].arguments = a;
    p->n_calls++;
    return 1;
}

/* The call section of HERMES: blocks from `at`, each a JSON object and then its close marker (a marker inside
 * the object's strings is text of the arguments). Returns 1 when the section failed (the caller decides). */
static int parse_hermes(struct tool_parse *p, const char *t, size_t n, size_t at, int final, int *rc)
{
    const size_t open_n = sizeof HERMES_OPEN - 1, close_n = sizeof HERMES_CLOSE - 1;
    for (;;) {
        at = skip_ws(t, at, n);
        if (at >= n) return 0;
        if (n - at < open_n) return final || memcmp(t + at, HERMES_OPEN, n - at) ? final : 0;
        if (memcmp(t + at, HERMES_OPEN, open_n)) return final; /* other text: ends the section */
        at = skip_ws(t, at + open_n, n);
        const size_t span = at < n ? json_span(t + at, n - at) : 0;
        if (!span) return final; /* not (yet) one value */
        const size_t e = skip_ws(t, at + span, n);
        const int closed = n - e >= close_n && !memcmp(t + e, HERMES_CLOSE, close_n);
        if (!closed) {
            if (e < n && (n - e >= close_n || memcmp(t + e, HERMES_CLOSE, n - e)))
                return 1;         /* other text after the object */
            if (!final) return 0; /* the marker is still coming */
            if (e < n) return 1;  /* ended inside the marker */
        }
        int r = add_call(p, t + at, span); /* closed, or the text ends after the object */
        if (r < 0) {
            *rc = r;
            return 0;
        }
        if (r == 0) return 1;
        if (!closed) return 0;
        at = e + close_n;
    }
}

/* LLAMA3 and the array of MISTRAL: JSON values separated by whitespace or ';' (LLAMA3), or one array of call
 * objects (MISTRAL), from `at`. Returns 1 when the section failed. */
static int parse_json_calls(struct tool_parse *p, const char *t, size_t n, size_t at, int array, int *rc)
{
    at = skip_ws(t, at, n);
    if (!array && n - at >= sizeof PYTHON_TAG - 1 && !memcmp(t + at, PYTHON_TAG, sizeof PYTHON_TAG - 1))
        at += sizeof PYTHON_TAG - 1;
    int any = 0;
    while ((at = skip_ws(t, at, n)) < n) {
        const size_t span = json_span(t + at, n - at);
        if (!span) return 1;
        int r = 0;
        if (array && t[at] == '[') { /* a valid span: elements, ',' between them, ']' */
            size_t i = skip_ws(t, at + 1, n);
            r = t[i] != ']';
            while (r > 0 && t[i] != ']') {
                const size_t en = json_span(t + i, n - i);
                r = add_call(p, t + i, en);
                i = skip_ws(t, i + en, n);
                if (t[i] == ',') i = skip_ws(t, i + 1, n);
            }
        } else if (!array) {
            r = add_call(p, t + at, span);
        }
        if (r < 0) {
            *rc = r;
            return 0;
        }
        if (r == 0) return 1;
        any = 1;
        at = skip_ws(t, at + span, n);
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
    if (f == TOOL_FORMAT_HARMONY) { /* harmony_parse reads these */
        out->content_end = len;
        return 0;
    }
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
            const size_t v = skip_ws(text, start, len);
            if (final || (v < len && json_span(text + v, len - v))) /* else the array is still coming */
                failed = parse_json_calls(out, text, len, start, 1, &rc);
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
