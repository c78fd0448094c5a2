/* json_schema — see json_schema.h. One pass over the schema document (jansson), one grammar node per
 * subschema; $ref targets are compiled once through a reserved node, which is what makes recursion work.
 */
#include "runtime/json_schema.h"

#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/core/status.h"
#include "runtime/grammar_build.h"
#include "runtime/regex.h"

#define MAX_ENUM      4096
#define MAX_MIN_ITEMS 1024
#define MAX_MEMO      1024

struct jsc {
    struct gbuilder *b;
    json_t *doc;
    int ws, depth;
    struct {
        json_t *s;
        int node;
    } memo[MAX_MEMO];
    int n_memo;
    char path[512];
    int status;
    char *err;
};

static int fail(struct jsc *J, int status, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int fail(struct jsc *J, int status, const char *fmt, ...)
{
    if (J->status) return -1;
    J->status = status;
    char msg[200];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    snprintf(J->err, 256, "%.150s (at %.90s)", msg, J->path[0] ? J->path : "the schema's root");
    return -1;
}

/* ---- keywords ---- */

static const char *const annotations[] = {"title",    "description", "default", "examples",    "$schema",
                                          "$id",      "$comment",    "$defs",   "definitions", "deprecated",
                                          "readOnly", "writeOnly",   NULL};
static const char *const handled[] = {"type",
                                      "properties",
                                      "required",
                                      "additionalProperties",
                                      "enum",
                                      "const",
                                      "items",
                                      "prefixItems",
                                      "additionalItems",
                                      "minItems",
                                      "maxItems",
                                      "anyOf",
                                      "oneOf",
                                      "allOf",
                                      "$ref",
                                      "pattern",
                                      "format",
                                      "minLength",
                                      "maxLength",
                                      "minimum",
                                      "maximum",
                                      "exclusiveMinimum",
                                      "exclusiveMaximum",
                                      "uniqueItems",
                                      NULL};

static int in_list(const char *const *list, const char *k)
{
    for (int i = 0; list[i]; i++)
        if (!strcmp(list[i], k)) return 1;
    return 0;
}

/* Fails unless every keyword of s is supported; with only_with set, every keyword other than annotations
 * must be `only_with` itself (combinators that do not mix with other constraints). */
static int check_keywords(struct jsc *J, json_t *s, const char *only_with)
{
    const char *k;
    json_t *v;
    json_object_foreach(s, k, v)
    {
        if (in_list(annotations, k)) continue;
        if (!in_list(handled, k))
            return fail(J, FERRY_ERR_UNSUPPORTED, "unsupported JSON Schema keyword '%.60s'", k);
        if (only_with && strcmp(k, only_with))
            return fail(J, FERRY_ERR_UNSUPPORTED, "'%s' together with '%.60s' is not supported", only_with,
                        k);
    }
    return 0;
}

/* ---- paths ---- */

static size_t path_push(struct jsc *J, const char *seg)
{
    size_t n = strlen(J->path);
    size_t at = n;
    if (at < sizeof J->path - 2) J->path[at++] = '/';
    for (const char *p = seg; *p && at < sizeof J->path - 3; p++) {
        if (*p == '/' || *p == '~') {
            J->path[at++] = '~';
            J->path[at++] = *p == '/' ? '1' : '0';
        } else {
            J->path[at++] = *p;
        }
    }
    J->path[at] = 0;
    return n;
}

static void path_pop(struct jsc *J, size_t n)
{
    J->path[n] = 0;
}

static int compile(struct jsc *J, json_t *s);

static int compile_at(struct jsc *J, json_t *s, const char *seg1, const char *seg2)
{
    size_t n = path_push(J, seg1);
    if (seg2) path_push(J, seg2);
    int node = compile(J, s);
    path_pop(J, n);
    return node;
}

/* ---- $ref ---- */

static json_t *resolve(struct jsc *J, const char *ref)
{
    if (ref[0] != '#') {
        fail(J, FERRY_ERR_UNSUPPORTED,
             "$ref '%.80s': only references within the schema ('#...') are supported", ref);
        return NULL;
    }
    json_t *cur = J->doc;
    const char *p = ref + 1;
    if (*p && *p != '/') {
        fail(J, FERRY_ERR_UNSUPPORTED, "$ref '%.80s': anchors are not supported, use a JSON pointer", ref);
        return NULL;
    }
    while (*p == '/') {
        p++;
        char seg[256];
        size_t n = 0;
        while (*p && *p != '/' && n < sizeof seg - 1) {
            if (p[0] == '~' && (p[1] == '0' || p[1] == '1')) {
                seg[n++] = p[1] == '0' ? '~' : '/';
                p += 2;
            } else {
                seg[n++] = *p++;
            }
        }
        seg[n] = 0;
        if (json_is_object(cur)) {
            cur = json_object_get(cur, seg);
        } else if (json_is_array(cur)) {
            char *end;
            long i = strtol(seg, &end, 10);
            cur = *seg && !*end && i >= 0 ? json_array_get(cur, (size_t)i) : NULL;
        } else {
            cur = NULL;
        }
        if (!cur) {
            fail(J, FERRY_ERR_INVALID, "$ref '%.80s' points to nothing", ref);
            return NULL;
        }
    }
    return cur;
}

static int compile_ref(struct jsc *J, const char *ref)
{
    json_t *t = resolve(J, ref);
    if (!t) return -1;
    for (int i = 0; i < J->n_memo; i++)
        if (J->memo[i].s == t) return J->memo[i].node;
    if (J->n_memo >= MAX_MEMO)
        return fail(J, FERRY_ERR_RANGE, "more than %d distinct $ref targets", MAX_MEMO);
    int id = gb_reserve(J->b);
    if (id < 0) return -1;
    J->memo[J->n_memo].s = t;
    J->memo[J->n_memo++].node = id;
    char saved[sizeof J->path];
    memcpy(saved, J->path, sizeof saved);
    snprintf(J->path, sizeof J->path, "%s", ref + 1);
    int node = compile(J, t);
    memcpy(J->path, saved, sizeof saved);
    if (node < 0) return -1;
    return gb_define(J->b, id, node);
}

/* ---- types ---- */

enum { T_NULL = 1, T_BOOL = 2, T_INT = 4, T_NUM = 8, T_STR = 16, T_OBJ = 32, T_ARR = 64, T_ALL = 127 };

static int type_bit(const char *t)
{
    static const char *names[] = {"null", "boolean", "integer", "number", "string", "object", "array"};
    for (int i = 0; i < 7; i++)
        if (!strcmp(t, names[i])) return 1 << i;
    return 0;
}

static int parse_types(struct jsc *J, json_t *s, int *types)
{
    json_t *t = json_object_get(s, "type");
    *types = 0;
    if (!t) return 0;
    if (json_is_string(t)) {
        *types = type_bit(json_string_value(t));
        if (!*types) return fail(J, FERRY_ERR_INVALID, "unknown type '%.40s'", json_string_value(t));
        return 0;
    }
    if (!json_is_array(t) || json_array_size(t) == 0)
        return fail(J, FERRY_ERR_INVALID, "'type' must be a string or a non-empty array");
    size_t i;
    json_t *x;
    json_array_foreach(t, i, x)
    {
        int b = json_is_string(x) ? type_bit(json_string_value(x)) : 0;
        if (!b) return fail(J, FERRY_ERR_INVALID, "'type' lists an unknown type");
        *types |= b;
    }
    return 0;
}

static int value_type(json_t *v)
{
    if (json_is_null(v)) return T_NULL;
    if (json_is_boolean(v)) return T_BOOL;
    if (json_is_integer(v)) return T_INT | T_NUM;
    if (json_is_real(v)) {
        double d = json_real_value(v);
        return d == floor(d) && fabs(d) < 9e15 ? T_INT | T_NUM : T_NUM;
    }
    if (json_is_string(v)) return T_STR;
    if (json_is_object(v)) return T_OBJ;
    return T_ARR;
}

/* enum / const: the members as compact JSON literals (those of the allowed types). */
static int compile_values(struct jsc *J, json_t *s, int types)
{
    json_t *e = json_object_get(s, "enum"), *c = json_object_get(s, "const");
    json_t *one[1] = {c};
    size_t n = 1;
    if (e) {
        if (!json_is_array(e)) return fail(J, FERRY_ERR_INVALID, "'enum' must be an array");
        n = json_array_size(e);
        if (n > MAX_ENUM) return fail(J, FERRY_ERR_RANGE, "'enum' has more than %d members", MAX_ENUM);
    }
    struct gb_lit *lits = calloc(n ? n : 1, sizeof *lits);
    char **texts = calloc(n ? n : 1, sizeof *texts);
    int m = 0, node = -1;
    if (!lits || !texts) {
        fail(J, FERRY_ERR_NOMEM, "out of memory");
        goto out;
    }
    for (size_t i = 0; i < n; i++) {
        json_t *v = e ? json_array_get(e, i) : one[0];
        if (c && e && !json_equal(v, c)) continue; /* both: only the members equal to const */
        if (types && !(value_type(v) & types)) continue;
        texts[m] = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
        if (!texts[m]) {
            fail(J, FERRY_ERR_NOMEM, "out of memory");
            goto out;
        }
        lits[m] = (struct gb_lit){texts[m], strlen(texts[m]), -1};
        m++;
    }
    node = m ? gb_litset(J->b, lits, m) : gb_alt(J->b, NULL, 0); /* no member fits: accepts nothing */
out:
    for (int i = 0; texts && i < m; i++) free(texts[i]);
    free(texts);
    free(lits);
    return node;
}

static int get_count(struct jsc *J, json_t *s, const char *k, long long lo, long long hi, long long *v)
{
    json_t *x = json_object_get(s, k);
    if (!x) return 0;
    double d = json_is_integer(x) ? (double)json_integer_value(x)
               : json_is_real(x)  ? json_real_value(x)
                                  : NAN;
    if (!(d == floor(d)) || d < 0)
        return fail(J, FERRY_ERR_INVALID, "'%s' must be a non-negative integer", k);
    if (d < (double)lo || d > (double)hi) return fail(J, FERRY_ERR_RANGE, "'%s' must be at most %lld", k, hi);
    *v = (long long)d;
    return 1;
}

static int compile_number(struct jsc *J, json_t *s, int integer)
{
    int flags = integer ? GB_NUM_INTEGER : 0;
    double lo = 0, hi = 0;
    json_t *mn = json_object_get(s, "minimum"), *mx = json_object_get(s, "maximum");
    json_t *emn = json_object_get(s, "exclusiveMinimum"), *emx = json_object_get(s, "exclusiveMaximum");
    if ((mn && !json_is_number(mn)) || (mx && !json_is_number(mx)))
        return fail(J, FERRY_ERR_INVALID, "'minimum' and 'maximum' must be numbers");
    if (mn) flags |= GB_NUM_LO, lo = json_number_value(mn);
    if (mx) flags |= GB_NUM_HI, hi = json_number_value(mx);
    if (emn) {
        if (json_is_boolean(emn)) { /* draft 4: a flag on minimum */
            if (json_is_true(emn) && mn) flags |= GB_NUM_LO_EXCL;
        } else if (json_is_number(emn)) {
            double v = json_number_value(emn);
            if (!(flags & GB_NUM_LO) || v >= lo) flags |= GB_NUM_LO | GB_NUM_LO_EXCL, lo = v;
        } else {
            return fail(J, FERRY_ERR_INVALID, "'exclusiveMinimum' must be a number");
        }
    }
    if (emx) {
        if (json_is_boolean(emx)) {
            if (json_is_true(emx) && mx) flags |= GB_NUM_HI_EXCL;
        } else if (json_is_number(emx)) {
            double v = json_number_value(emx);
            if (!(flags & GB_NUM_HI) || v <= hi) flags |= GB_NUM_HI | GB_NUM_HI_EXCL, hi = v;
        } else {
            return fail(J, FERRY_ERR_INVALID, "'exclusiveMaximum' must be a number");
        }
    }
    return gb_number(J->b, flags, lo, hi);
}

/* Regular expressions for the supported formats (generated forms: upper-case T/Z, lower-case hex). */
static const char *format_regex(const char *f)
{
#define DATE                                                                                                 \
    "[1-9]\\d{3}-(?:(?:0[13578]|1[02])-(?:0[1-9]|[12]\\d|3[01])|(?:0[469]|11)-(?:0[1-9]|[12]\\d|30)|02-(?:"  \
    "0[1-9]|1\\d|2[0-8]))"
#define TIME "(?:[01]\\d|2[0-3]):[0-5]\\d:[0-5]\\d(?:\\.\\d{1,6})?(?:Z|[+-](?:[01]\\d|2[0-3]):[0-5]\\d)"
    static const struct {
        const char *name, *re;
    } formats[] = {
        {"date-time", "^" DATE "T" TIME "$"},
        {"date", "^" DATE "$"},
        {"time", "^" TIME "$"},
        {"uuid", "^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$"},
        {"email", "^[a-z0-9]+(?:[._+-][a-z0-9]+)*@[a-z0-9]+(?:-[a-z0-9]+)*(?:\\.[a-z0-9]+(?:-[a-z0-9]+)*)*\\."
                  "[a-z]{2,6}$"},
        {"ipv4",
         "^(?:25[0-5]|2[0-4]\\d|1\\d\\d|[1-9]?\\d)(?:\\.(?:25[0-5]|2[0-4]\\d|1\\d\\d|[1-9]?\\d)){3}$"},
        {"hostname",
         "^[a-z0-9](?:[a-z0-9-]{0,20}[a-z0-9])?(?:\\.[a-z0-9](?:[a-z0-9-]{0,20}[a-z0-9])?){0,4}$"},
        {"uri", "^https?://[a-z0-9]+(?:-[a-z0-9]+)*(?:\\.[a-z0-9]+(?:-[a-z0-9]+)*)*(?:/[A-Za-z0-9._~%-]*)*$"},
    };
#undef DATE
#undef TIME
    for (size_t i = 0; i < sizeof formats / sizeof formats[0]; i++)
        if (!strcmp(formats[i].name, f)) return formats[i].re;
    return NULL;
}

static int compile_string(struct jsc *J, json_t *s)
{
    long long mn = 0, mx = -1;
    if (get_count(J, s, "minLength", 0, 1 << 20, &mn) < 0 ||
        get_count(J, s, "maxLength", 0, 1LL << 30, &mx) < 0)
        return -1;
    json_t *pat = json_object_get(s, "pattern"), *fmt = json_object_get(s, "format");
    const char *re = NULL;
    size_t re_len = 0;
    if (pat && fmt)
        return fail(J, FERRY_ERR_UNSUPPORTED, "'pattern' together with 'format' is not supported");
    if (pat) {
        if (!json_is_string(pat)) return fail(J, FERRY_ERR_INVALID, "'pattern' must be a string");
        re = json_string_value(pat);
        re_len = json_string_length(pat);
    } else if (fmt) {
        if (!json_is_string(fmt)) return fail(J, FERRY_ERR_INVALID, "'format' must be a string");
        re = format_regex(json_string_value(fmt));
        if (!re)
            return fail(J, FERRY_ERR_UNSUPPORTED,
                        "unsupported format '%.40s' (supported: date-time, date, time, uuid, "
                        "email, ipv4, hostname, uri)",
                        json_string_value(fmt));
        re_len = strlen(re);
    }
    struct regex_dfa *d = NULL;
    if (re) {
        char rerr[256];
        int rc = regex_compile(re, re_len, &d, rerr);
        if (rc) return fail(J, rc, "%s", rerr);
    }
    return gb_string(J->b, d, (int)mn, (int)mx);
}

static int compile_object(struct jsc *J, json_t *s)
{
    json_t *props = json_object_get(s, "properties"), *req = json_object_get(s, "required");
    json_t *addl = json_object_get(s, "additionalProperties");
    if (props && !json_is_object(props)) return fail(J, FERRY_ERR_INVALID, "'properties' must be an object");
    if (req && !json_is_array(req))
        return fail(J, FERRY_ERR_INVALID, "'required' must be an array of strings");
    if (addl && !json_is_boolean(addl) && !json_is_object(addl))
        return fail(J, FERRY_ERR_INVALID, "'additionalProperties' must be a boolean or a schema");
    size_t n_req = req ? json_array_size(req) : 0;
    for (size_t i = 0; i < n_req; i++)
        if (!json_is_string(json_array_get(req, i)))
            return fail(J, FERRY_ERR_INVALID, "'required' must be an array of strings");
    size_t cap = (props ? json_object_size(props) : 0) + n_req;
    if (cap > 64) return fail(J, FERRY_ERR_RANGE, "an object may declare at most 64 properties");
    struct gb_prop pr[64];
    int n = 0;
    const char *k;
    json_t *v;
    if (props) {
        json_object_foreach(props, k, v)
        {
            int node = compile_at(J, v, "properties", k);
            if (node < 0) return -1;
            int r = 0;
            for (size_t i = 0; i < n_req; i++) r |= !strcmp(json_string_value(json_array_get(req, i)), k);
            pr[n++] = (struct gb_prop){k, strlen(k), node, r};
        }
    }
    /* required keys without a schema of their own take additionalProperties' */
    for (size_t i = 0; i < n_req; i++) {
        const char *rk = json_string_value(json_array_get(req, i));
        int seen = 0;
        for (int j = 0; j < n; j++) seen |= !strcmp(pr[j].key, rk);
        if (seen) continue;
        if (json_is_false(addl))
            return fail(J, FERRY_ERR_INVALID,
                        "required property '%.60s' is not allowed (additionalProperties is false)", rk);
        int node = addl && json_is_object(addl) ? compile_at(J, addl, "additionalProperties", NULL)
                                                : gb_any(J->b, J->ws);
        if (node < 0) return -1;
        pr[n++] = (struct gb_prop){rk, strlen(rk), node, 1};
    }
    int additional = -1;
    if (n == 0 && !json_is_false(addl)) {
        additional = addl && json_is_object(addl) ? compile_at(J, addl, "additionalProperties", NULL)
                                                  : gb_any(J->b, J->ws);
        if (additional < 0) return -1;
    }
    return gb_object(J->b, pr, n, additional, J->ws);
}

static int compile_array(struct jsc *J, json_t *s)
{
    long long mn = 0, mx = -1;
    if (get_count(J, s, "minItems", 0, MAX_MIN_ITEMS, &mn) < 0 ||
        get_count(J, s, "maxItems", 0, 1LL << 30, &mx) < 0)
        return -1;
    json_t *u = json_object_get(s, "uniqueItems");
    if (u && !json_is_boolean(u)) return fail(J, FERRY_ERR_INVALID, "'uniqueItems' must be a boolean");
    if (json_is_true(u))
        return fail(J, FERRY_ERR_UNSUPPORTED, "unsupported JSON Schema keyword 'uniqueItems' (true)");
    json_t *items = json_object_get(s, "items"), *prefix = json_object_get(s, "prefixItems");
    json_t *rest = items, *tuple = prefix;
    const char *rest_name = "items";
    if (json_is_array(items)) { /* draft 4-2019 tuples */
        if (prefix) return fail(J, FERRY_ERR_INVALID, "'items' as an array and 'prefixItems' together");
        tuple = items;
        rest = json_object_get(s, "additionalItems");
        rest_name = "additionalItems";
    } else if (json_object_get(s, "additionalItems")) {
        rest = items; /* additionalItems means nothing without a tuple */
    }
    if (tuple && !json_is_array(tuple)) return fail(J, FERRY_ERR_INVALID, "'prefixItems' must be an array");
    size_t np = tuple ? json_array_size(tuple) : 0;
    if (np > 256) return fail(J, FERRY_ERR_RANGE, "at most 256 prefix items");
    int pre[256];
    for (size_t i = 0; i < np; i++) {
        char idx[24];
        snprintf(idx, sizeof idx, "%zu", i);
        pre[i] = compile_at(J, json_array_get(tuple, i), tuple == items ? "items" : "prefixItems", idx);
        if (pre[i] < 0) return -1;
    }
    int item;
    if (!rest || json_is_true(rest))
        item = gb_any(J->b, J->ws);
    else if (json_is_false(rest))
        item = -1;
    else if ((item = compile_at(J, rest, rest_name, NULL)) < 0)
        return -1;
    return gb_array(J->b, item, pre, (int)np, (int)mn, (int)mx, J->ws);
}

static int compile_type(struct jsc *J, json_t *s, int type)
{
    switch (type) {
    case T_NULL:
        return gb_lit(J->b, "null", 4);
    case T_BOOL: {
        struct gb_lit l[2] = {{"true", 4, -1}, {"false", 5, -1}};
        return gb_litset(J->b, l, 2);
    }
    case T_INT:
        return compile_number(J, s, 1);
    case T_NUM:
        return compile_number(J, s, 0);
    case T_STR:
        return compile_string(J, s);
    case T_OBJ:
        return compile_object(J, s);
    default:
        return compile_array(J, s);
    }
}

static int compile(struct jsc *J, json_t *s)
{
    if (J->status) return -1;
    if (json_is_true(s)) return gb_any(J->b, J->ws);
    if (json_is_false(s)) return gb_alt(J->b, NULL, 0);
    if (!json_is_object(s)) return fail(J, FERRY_ERR_INVALID, "a schema must be an object or a boolean");
    if (++J->depth > JSON_SCHEMA_MAX_DEPTH)
        return fail(J, FERRY_ERR_RANGE, "schemas nest deeper than %d", JSON_SCHEMA_MAX_DEPTH);
    int node = -1;
    json_t *ref = json_object_get(s, "$ref"), *all = json_object_get(s, "allOf");
    json_t *any = json_object_get(s, "anyOf"), *one = json_object_get(s, "oneOf");
    if (check_keywords(J, s, ref ? "$ref" : all ? "allOf" : any ? "anyOf" : one ? "oneOf" : NULL)) goto out;
    if (ref) {
        if (!json_is_string(ref)) {
            fail(J, FERRY_ERR_INVALID, "'$ref' must be a string");
            goto out;
        }
        node = compile_ref(J, json_string_value(ref));
    } else if (all) {
        if (!json_is_array(all) || json_array_size(all) != 1) {
            fail(J, FERRY_ERR_UNSUPPORTED, "'allOf' is supported with exactly one member");
            goto out;
        }
        node = compile_at(J, json_array_get(all, 0), "allOf", "0");
    } else if (any || one) {
        json_t *list = any ? any : one;
        const char *name = any ? "anyOf" : "oneOf";
        size_t n = json_is_array(list) ? json_array_size(list) : 0;
        if (n == 0 || n > 256) {
            fail(J, FERRY_ERR_INVALID, "'%s' must be an array of 1 to 256 schemas", name);
            goto out;
        }
        int kids[256];
        for (size_t i = 0; i < n; i++) {
            char idx[24];
            snprintf(idx, sizeof idx, "%zu", i);
            if ((kids[i] = compile_at(J, json_array_get(list, i), name, idx)) < 0) goto out;
        }
        node = gb_alt(J->b, kids, (int)n);
    } else {
        int types;
        if (parse_types(J, s, &types)) goto out;
        if (json_object_get(s, "enum") || json_object_get(s, "const")) {
            node = compile_values(J, s, types);
            goto out;
        }
        if (!types) { /* inferred from the keywords present, else any value */
            static const struct {
                const char *k;
                int t;
            } hints[] = {{"properties", T_OBJ}, {"required", T_OBJ},         {"additionalProperties", T_OBJ},
                         {"items", T_ARR},      {"prefixItems", T_ARR},      {"minItems", T_ARR},
                         {"maxItems", T_ARR},   {"pattern", T_STR},          {"format", T_STR},
                         {"minLength", T_STR},  {"maxLength", T_STR},        {"minimum", T_NUM},
                         {"maximum", T_NUM},    {"exclusiveMinimum", T_NUM}, {"exclusiveMaximum", T_NUM}};
            for (size_t i = 0; i < sizeof hints / sizeof hints[0]; i++)
                if (json_object_get(s, hints[i].k)) types |= hints[i].t;
            if (!types) {
                node = gb_any(J->b, J->ws);
                goto out;
            }
        }
        if ((types & T_INT) && (types & T_NUM)) types &= ~T_INT; /* numbers include the integers */
        int kids[7], n = 0;
        for (int t = 1; t <= T_ARR; t <<= 1)
            if (types & t) {
                if ((kids[n] = compile_type(J, s, t)) < 0) goto out;
                n++;
            }
        node = n == 1 ? kids[0] : gb_alt(J->b, kids, n);
    }
out:
    J->depth--;
    if (J->status) return -1;
    if (node < 0) {
        char berr[256];
        int st = gb_error(J->b, berr);
        fail(J, st ? st : FERRY_ERR_INTERNAL, "%s", st ? berr : "cannot compile the schema");
        return -1;
    }
    return node;
}

int json_schema_compile(struct gbuilder *b, const char *schema, size_t len, int ws, int *root, char err[256])
{
    *root = -1;
    json_error_t jerr;
    json_t *doc = json_loadb(schema, len, JSON_DECODE_ANY, &jerr);
    if (!doc)
        return ferry_fail(err, FERRY_ERR_INVALID, "the schema is not valid JSON: %s (line %d column %d)",
                          jerr.text, jerr.line, jerr.column);
    struct jsc *J = calloc(1, sizeof *J);
    if (!J) {
        json_decref(doc);
        return ferry_fail(err, FERRY_ERR_NOMEM, "out of memory");
    }
    J->b = b;
    J->doc = doc;
    J->ws = ws;
    J->err = err;
    *root = compile(J, doc);
    int st = J->status;
    free(J);
    json_decref(doc);
    return st;
}

int json_schema_grammar(const char *schema, size_t len, int ws, struct grammar **out, char err[256])
{
    *out = NULL;
    struct gbuilder *b;
    if (gb_init(&b)) return ferry_fail(err, FERRY_ERR_NOMEM, "out of memory");
    int root;
    int rc = json_schema_compile(b, schema, len, ws, &root, err);
    if (rc) {
        gb_free(b);
        return rc;
    }
    return gb_finish(b, root, out, err);
}
