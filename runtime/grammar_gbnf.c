/* grammar_gbnf — llama.cpp's GBNF grammars compiled into the recogniser that JSON Schemas use (grammar.h).
 *
 * The format: rules `name ::= alternatives`, one per line (a rule may continue on the next lines inside
 * parentheses, after `::=`, or with a line that starts with `|`); `#` comments; items are "literals" (escapes
 * \n \r \t \\ \" \xHH \uHHHH \UHHHHHHHH), [character classes] (ranges, ^ negation, the same escapes), `.`
 * (any character), rule names and ( groups ), each optionally followed by *, +, ?, {m}, {m,} or {m,n}. `root`
 * is the start. Characters are Unicode code points, matched as their UTF-8 bytes: a class becomes the
 * alternatives of its ranges' byte sequences. Refused with the line named: syntax errors, undefined or
 * twice-defined rules, no root, left recursion (which a top-down recogniser cannot run), token references
 * (<...>), a grammar that accepts nothing, and grammars beyond the recogniser's node budget. The parser
 * builds a small tree first (checks need it: nullable rules and left recursion), then the nodes.
 */
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/core/status.h"
#include "runtime/grammar.h"
#include "runtime/grammar_build.h"

#define GBNF_MAX_SRC   (1 << 20) /* bytes of grammar text */
#define GBNF_MAX_ITEMS 20000     /* tree nodes */
#define GBNF_MAX_RULES 2000
#define GBNF_MAX_DEPTH 64 /* nesting of ( ) */
#define GBNF_MAX_REP   1000

enum { X_LIT, X_CLASS, X_RULE, X_SEQ, X_ALT, X_REP };

struct xnode {
    int kind;
    int a, n;     /* LIT: bytes offset, length; CLASS: ranges offset, count; SEQ/ALT: kids offset, count; */
    int rule;     /* RULE: the rule; REP: the child node */
    int min, max; /* REP; max -1 unbounded */
};

struct rule {
    const char *name;
    size_t len;
    int body;     /* node, -1 until defined */
    int line;     /* where it was defined, else first used */
    int nullable; /* matches the empty string */
    int state;    /* left-recursion walk: 0 new, 1 on the path, 2 done */
    int gb;       /* the builder's reserved node */
};

struct gbnf {
    const char *s, *end;
    int line;
    struct xnode *x;
    int nx, capx;
    int *kids;
    int nkids, capkids;
    char *bytes;
    int nbytes, capbytes;
    uint32_t *ranges; /* (lo, hi) pairs of code points */
    int nranges, capranges;
    struct rule *rules;
    int nrules, caprules;
    int depth;
    int status;
    char err[256];
};

static int failf(struct gbnf *p, int status, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int failf(struct gbnf *p, int status, const char *fmt, ...)
{
    if (p->status) return -1;
    p->status = status;
    va_list ap;
    va_start(ap, fmt);
    char msg[200];
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    snprintf(p->err, sizeof p->err, "line %d: %s", p->line, msg);
    return -1;
}

static int grow(struct gbnf *p, void **arr, int *cap, int need, size_t elem)
{
    if (need <= *cap) return 0;
    int nc = *cap ? *cap * 2 : 64;
    while (nc < need) nc *= 2;
    void *q = realloc(*arr, (size_t)nc * elem);
    if (!q) return failf(p, FERRY_ERR_NOMEM, "out of memory");
    *arr = q;
    *cap = nc;
    return 0;
}

static int new_x(struct gbnf *p, int kind)
{
    if (p->nx >= GBNF_MAX_ITEMS)
        return failf(p, FERRY_ERR_RANGE, "the grammar has more than %d items", GBNF_MAX_ITEMS);
    if (grow(p, (void **)&p->x, &p->capx, p->nx + 1, sizeof *p->x)) return -1;
    p->x[p->nx] = (struct xnode){kind, 0, 0, -1, 0, 0};
    return p->nx++;
}

static int list_x(struct gbnf *p, int kind, const int *kids, int n)
{
    if (n == 1) return kids[0];
    if (grow(p, (void **)&p->kids, &p->capkids, p->nkids + n, sizeof *p->kids)) return -1;
    int k = new_x(p, kind);
    if (k < 0) return -1;
    memcpy(p->kids + p->nkids, kids, (size_t)n * sizeof *kids);
    p->x[k].a = p->nkids;
    p->x[k].n = n;
    p->nkids += n;
    return k;
}

static int rule_of(struct gbnf *p, const char *name, size_t len)
{
    for (int i = 0; i < p->nrules; i++)
        if (p->rules[i].len == len && !memcmp(p->rules[i].name, name, len)) return i;
    if (p->nrules >= GBNF_MAX_RULES) return failf(p, FERRY_ERR_RANGE, "more than %d rules", GBNF_MAX_RULES);
    if (grow(p, (void **)&p->rules, &p->caprules, p->nrules + 1, sizeof *p->rules)) return -1;
    p->rules[p->nrules] = (struct rule){name, len, -1, p->line, 0, 0, -1};
    return p->nrules++;
}

/* ---- lexing ---- */

static int is_name(int c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_';
}

/* Skips blanks and comments, and newlines when nl. */
static void space(struct gbnf *p, int nl)
{
    while (p->s < p->end) {
        char c = *p->s;
        if (c == ' ' || c == '\t' || c == '\r') {
            p->s++;
        } else if (c == '#') {
            while (p->s < p->end && *p->s != '\n') p->s++;
        } else if (c == '\n' && nl) {
            p->s++;
            p->line++;
        } else {
            break;
        }
    }
}

/* One UTF-8 code point of the source; -1 when malformed. */
static int32_t utf8_next(struct gbnf *p)
{
    const unsigned char *u = (const unsigned char *)p->s;
    size_t left = (size_t)(p->end - p->s);
    int n = u[0] < 0x80             ? 1
            : (u[0] & 0xE0) == 0xC0 ? 2
            : (u[0] & 0xF0) == 0xE0 ? 3
            : (u[0] & 0xF8) == 0xF0 ? 4
                                    : 0;
    if (!n || (size_t)n > left) return -1;
    int32_t cp = n == 1 ? u[0] : u[0] & (0x7F >> n);
    for (int i = 1; i < n; i++) {
        if ((u[i] & 0xC0) != 0x80) return -1;
        cp = cp << 6 | (u[i] & 0x3F);
    }
    p->s += n;
    return cp;
}

static int hex_digits(struct gbnf *p, int n)
{
    uint32_t v = 0; /* 8 digits fit; beyond U+10FFFF is refused by the caller */
    for (int i = 0; i < n; i++) {
        if (p->s >= p->end) return -1;
        char c = *p->s++;
        int d = c >= '0' && c <= '9'   ? c - '0'
                : c >= 'a' && c <= 'f' ? c - 'a' + 10
                : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                       : -1;
        if (d < 0) return -1;
        v = v * 16 + (uint32_t)d;
    }
    return v > 0x7FFFFFFF ? 0x7FFFFFFF : (int)v;
}

/* One character of a literal or class (escapes decoded); -1 after an error. */
static int32_t char_of(struct gbnf *p)
{
    if (p->s >= p->end) return failf(p, FERRY_ERR_FORMAT, "unexpected end of the grammar");
    if (*p->s != '\\') {
        int32_t cp = utf8_next(p);
        return cp < 0 ? failf(p, FERRY_ERR_FORMAT, "invalid UTF-8") : cp;
    }
    p->s++;
    if (p->s >= p->end) return failf(p, FERRY_ERR_FORMAT, "unfinished escape");
    char c = *p->s++;
    int32_t v;
    switch (c) {
    case 'n':
        return '\n';
    case 'r':
        return '\r';
    case 't':
        return '\t';
    case 'x':
        v = hex_digits(p, 2);
        break;
    case 'u':
        v = hex_digits(p, 4);
        break;
    case 'U':
        v = hex_digits(p, 8);
        break;
    case '\\':
    case '"':
    case '[':
    case ']':
    case '-':
    case '^':
    case '/':
    case '\'':
        return c;
    default:
        return failf(p, FERRY_ERR_FORMAT, "unknown escape '\\%c'", c);
    }
    if (v < 0 || v > 0x10FFFF) return failf(p, FERRY_ERR_FORMAT, "bad escape '\\%c'", c);
    return v;
}

static void put_utf8(struct gbnf *p, int32_t cp)
{
    char b[4];
    int n = cp < 0x80 ? 1 : cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4;
    if (n == 1)
        b[0] = (char)cp;
    else {
        for (int i = n - 1; i > 0; i--, cp >>= 6) b[i] = (char)(0x80 | (cp & 0x3F));
        b[0] = (char)((0xF00 >> n) | cp);
    }
    if (grow(p, (void **)&p->bytes, &p->capbytes, p->nbytes + n, 1)) return;
    memcpy(p->bytes + p->nbytes, b, (size_t)n);
    p->nbytes += n;
}

/* ---- parsing ---- */

static int parse_alts(struct gbnf *p, int nested);

static int parse_literal(struct gbnf *p)
{
    p->s++; /* the opening quote */
    int k = new_x(p, X_LIT);
    if (k < 0) return -1;
    p->x[k].a = p->nbytes;
    while (!p->status && p->s < p->end && *p->s != '"') {
        if (*p->s == '\n') return failf(p, FERRY_ERR_FORMAT, "unterminated literal");
        int32_t cp = char_of(p);
        if (cp >= 0) put_utf8(p, cp);
    }
    if (p->status) return -1;
    if (p->s >= p->end) return failf(p, FERRY_ERR_FORMAT, "unterminated literal");
    p->s++;
    p->x[k].n = p->nbytes - p->x[k].a;
    return k;
}

static int add_range(struct gbnf *p, uint32_t lo, uint32_t hi)
{
    if (grow(p, (void **)&p->ranges, &p->capranges, 2 * (p->nranges + 1), sizeof *p->ranges)) return -1;
    p->ranges[2 * p->nranges] = lo;
    p->ranges[2 * p->nranges + 1] = hi;
    p->nranges++;
    return 0;
}

static int cmp_range(const void *a, const void *b)
{
    uint32_t x = ((const uint32_t *)a)[0], y = ((const uint32_t *)b)[0];
    return x < y ? -1 : x > y;
}

/* The ranges from `from` on, sorted and merged, then complemented over the code points when neg. */
static int normalise_class(struct gbnf *p, int from, int neg)
{
    int n = p->nranges - from, m = 0;
    uint32_t *r = n ? p->ranges + 2 * from : NULL; /* `.` has none yet (and the pool may be unallocated) */
    if (n) qsort(r, (size_t)n, 2 * sizeof *r, cmp_range);
    for (int i = 0; i < n; i++) {
        if (m && r[2 * i] <= r[2 * m - 1] + 1) {
            if (r[2 * i + 1] > r[2 * m - 1]) r[2 * m - 1] = r[2 * i + 1];
        } else {
            r[2 * m] = r[2 * i], r[2 * m + 1] = r[2 * i + 1], m++;
        }
    }
    p->nranges = from + m;
    if (!neg) return m;
    uint32_t *copy = malloc((size_t)(2 * m + 1) * sizeof *copy);
    if (!copy) return failf(p, FERRY_ERR_NOMEM, "out of memory");
    if (m) memcpy(copy, r, (size_t)(2 * m) * sizeof *copy);
    p->nranges = from;
    uint32_t next = 0;
    for (int i = 0; i < m; i++) {
        if (copy[2 * i] > next) add_range(p, next, copy[2 * i] - 1);
        next = copy[2 * i + 1] + 1;
    }
    if (next <= 0x10FFFF) add_range(p, next, 0x10FFFF);
    free(copy);
    return p->nranges - from;
}

static int parse_class(struct gbnf *p)
{
    p->s++; /* [ */
    int neg = p->s < p->end && *p->s == '^';
    if (neg) p->s++;
    int from = p->nranges;
    while (!p->status && p->s < p->end && *p->s != ']') {
        if (*p->s == '\n') return failf(p, FERRY_ERR_FORMAT, "unterminated character class");
        int32_t lo = char_of(p), hi = lo;
        if (lo < 0) return -1;
        if (p->s + 1 < p->end && *p->s == '-' && p->s[1] != ']') {
            p->s++;
            hi = char_of(p);
            if (hi < 0) return -1;
            if (hi < lo) return failf(p, FERRY_ERR_FORMAT, "character range out of order");
        }
        if (add_range(p, (uint32_t)lo, (uint32_t)hi)) return -1;
    }
    if (p->s >= p->end) return failf(p, FERRY_ERR_FORMAT, "unterminated character class");
    p->s++;
    int n = normalise_class(p, from, neg);
    if (n < 0) return -1;
    if (n == 0) return failf(p, FERRY_ERR_FORMAT, "a character class that matches nothing");
    int k = new_x(p, X_CLASS);
    if (k >= 0) p->x[k].a = from, p->x[k].n = n;
    return k;
}

static int parse_count(struct gbnf *p, int *v)
{
    if (p->s >= p->end || *p->s < '0' || *p->s > '9')
        return failf(p, FERRY_ERR_FORMAT, "expected a number in { }");
    long x = 0;
    while (p->s < p->end && *p->s >= '0' && *p->s <= '9') {
        x = x * 10 + (*p->s++ - '0');
        if (x > GBNF_MAX_REP)
            return failf(p, FERRY_ERR_RANGE, "repetition counts are at most %d", GBNF_MAX_REP);
    }
    *v = (int)x;
    return 0;
}

static int parse_item(struct gbnf *p)
{
    char c = *p->s;
    int k;
    if (c == '"') {
        k = parse_literal(p);
    } else if (c == '[') {
        k = parse_class(p);
    } else if (c == '.') {
        p->s++;
        int from = p->nranges;
        if (normalise_class(p, from, 1) < 0) return -1;
        k = new_x(p, X_CLASS);
        if (k >= 0) p->x[k].a = from, p->x[k].n = p->nranges - from;
    } else if (c == '(') {
        p->s++;
        if (++p->depth > GBNF_MAX_DEPTH)
            return failf(p, FERRY_ERR_RANGE, "groups nest deeper than %d", GBNF_MAX_DEPTH);
        space(p, 1);
        k = parse_alts(p, 1);
        p->depth--;
        if (k < 0) return -1;
        space(p, 1);
        if (p->s >= p->end || *p->s != ')') return failf(p, FERRY_ERR_FORMAT, "expected ')'");
        p->s++;
    } else if (is_name(c)) {
        const char *name = p->s;
        while (p->s < p->end && is_name(*p->s)) p->s++;
        int r = rule_of(p, name, (size_t)(p->s - name));
        if (r < 0) return -1;
        k = new_x(p, X_RULE);
        if (k >= 0) p->x[k].rule = r;
    } else if (c == '<') {
        return failf(p, FERRY_ERR_UNSUPPORTED, "token references (<...>) are not supported");
    } else {
        return failf(p, FERRY_ERR_FORMAT, "unexpected '%c'", c);
    }
    if (k < 0) return -1;
    for (int ops = 0;; ops++) { /* postfix operators (a few: each one nests the walks below) */
        int min, max;
        if (ops == 4 && p->s < p->end && *p->s && strchr("*+?{", *p->s))
            return failf(p, FERRY_ERR_FORMAT, "more than 4 repetition operators on one item");
        if (p->s >= p->end) break;
        c = *p->s;
        if (c == '*' || c == '+' || c == '?') {
            p->s++;
            min = c == '+', max = c == '?' ? 1 : -1;
        } else if (c == '{') {
            p->s++;
            space(p, 0);
            if (parse_count(p, &min)) return -1;
            space(p, 0);
            max = min;
            if (p->s < p->end && *p->s == ',') {
                p->s++;
                space(p, 0);
                max = -1;
                if (p->s < p->end && *p->s != '}' && parse_count(p, &max)) return -1;
                space(p, 0);
            }
            if (p->s >= p->end || *p->s != '}') return failf(p, FERRY_ERR_FORMAT, "expected '}'");
            p->s++;
            if (max >= 0 && max < min) return failf(p, FERRY_ERR_FORMAT, "{%d,%d}: max below min", min, max);
        } else {
            break;
        }
        int r = new_x(p, X_REP);
        if (r < 0) return -1;
        p->x[r].rule = k, p->x[r].min = min, p->x[r].max = max;
        k = r;
    }
    return k;
}

/* A sequence ends at '|', ')', the end, or (outside groups) the end of the line. */
static int parse_seq(struct gbnf *p, int nested)
{
    int items[256], n = 0;
    space(p, nested);
    while (p->s < p->end && *p->s != '|' && *p->s != ')' && *p->s != '\n') {
        if (n == 256) return failf(p, FERRY_ERR_RANGE, "more than 256 items in a sequence");
        int k = parse_item(p);
        if (k < 0) return -1;
        items[n++] = k;
        space(p, nested);
    }
    if (n == 0) { /* the empty sequence */
        int k = new_x(p, X_SEQ);
        return k;
    }
    return list_x(p, X_SEQ, items, n);
}

static int parse_alts(struct gbnf *p, int nested)
{
    int alts[256], n = 0;
    for (;;) {
        if (n == 256) return failf(p, FERRY_ERR_RANGE, "more than 256 alternatives");
        int k = parse_seq(p, nested);
        if (k < 0) return -1;
        alts[n++] = k;
        const char *save = p->s;
        int line = p->line;
        space(p, 1); /* a rule may go on with a line that starts with '|' */
        if (p->s < p->end && *p->s == '|') {
            p->s++;
            space(p, 1);
            continue;
        }
        p->s = save, p->line = line;
        break;
    }
    return list_x(p, X_ALT, alts, n);
}

static int parse_rules(struct gbnf *p)
{
    for (;;) {
        space(p, 1);
        if (p->s >= p->end) return 0;
        const char *name = p->s;
        while (p->s < p->end && is_name(*p->s)) p->s++;
        if (p->s == name) return failf(p, FERRY_ERR_FORMAT, "expected a rule name");
        size_t len = (size_t)(p->s - name);
        space(p, 0);
        if (p->end - p->s < 3 || memcmp(p->s, "::=", 3))
            return failf(p, FERRY_ERR_FORMAT, "expected '::=' after '%.*s'", (int)(len > 40 ? 40 : len),
                         name);
        p->s += 3;
        int r = rule_of(p, name, len);
        if (r < 0) return -1;
        if (p->rules[r].body >= 0)
            return failf(p, FERRY_ERR_FORMAT, "rule '%.*s' is defined twice", (int)(len > 40 ? 40 : len),
                         name);
        p->rules[r].line = p->line;
        space(p, 1);
        int body = parse_alts(p, 0);
        if (body < 0) return -1;
        p->rules[r].body = body;
        space(p, 0);
        if (p->s < p->end && *p->s != '\n') return failf(p, FERRY_ERR_FORMAT, "unexpected '%c'", *p->s);
    }
}

/* ---- checks ---- */

static int x_nullable(const struct gbnf *p, int k)
{
    const struct xnode *x = &p->x[k];
    switch (x->kind) {
    case X_LIT:
        return x->n == 0;
    case X_CLASS:
        return 0;
    case X_RULE:
        return p->rules[x->rule].nullable;
    case X_SEQ:
        for (int i = 0; i < x->n; i++)
            if (!x_nullable(p, p->kids[x->a + i])) return 0;
        return 1;
    case X_ALT:
        for (int i = 0; i < x->n; i++)
            if (x_nullable(p, p->kids[x->a + i])) return 1;
        return 0;
    default:
        return x->min == 0 || x_nullable(p, x->rule);
    }
}

static int walk_left(struct gbnf *p, int r);

/* 1 when node k matches the empty string and nothing else (a repetition of it is the empty string too);
 * *budget bounds the walk (0 when spent: then "no", the plain repetition). */
static int x_empty_only(const struct gbnf *p, int k, int *budget)
{
    if (--*budget <= 0) return 0;
    const struct xnode *x = &p->x[k];
    switch (x->kind) {
    case X_LIT:
        return x->n == 0;
    case X_CLASS:
        return 0;
    case X_RULE:
        return x_empty_only(p, p->rules[x->rule].body, budget);
    case X_SEQ:
    case X_ALT:
        for (int i = 0; i < x->n; i++)
            if (!x_empty_only(p, p->kids[x->a + i], budget)) return 0;
        return 1;
    default:
        return x->max == 0 || x_empty_only(p, x->rule, budget);
    }
}

/* The rules at the left edge of node k, walked for left recursion. */
static int left_edge(struct gbnf *p, int k)
{
    const struct xnode *x = &p->x[k];
    switch (x->kind) {
    case X_RULE:
        return walk_left(p, x->rule);
    case X_SEQ:
        for (int i = 0; i < x->n; i++) {
            if (left_edge(p, p->kids[x->a + i])) return -1;
            if (!x_nullable(p, p->kids[x->a + i])) break;
        }
        return 0;
    case X_ALT:
        for (int i = 0; i < x->n; i++)
            if (left_edge(p, p->kids[x->a + i])) return -1;
        return 0;
    case X_REP:
        return x->max != 0 ? left_edge(p, x->rule) : 0;
    default:
        return 0;
    }
}

static int walk_left(struct gbnf *p, int r)
{
    struct rule *ru = &p->rules[r];
    if (ru->state == 2) return 0;
    if (ru->state == 1) {
        p->line = ru->line;
        return failf(p, FERRY_ERR_UNSUPPORTED, "rule '%.*s' is left-recursive (rewrite it with repetition)",
                     (int)(ru->len > 40 ? 40 : ru->len), ru->name);
    }
    ru->state = 1;
    if (left_edge(p, ru->body)) return -1;
    p->rules[r].state = 2;
    return 0;
}

static int check(struct gbnf *p)
{
    int root = -1;
    for (int i = 0; i < p->nrules; i++) {
        struct rule *ru = &p->rules[i];
        if (ru->body < 0) {
            p->line = ru->line;
            return failf(p, FERRY_ERR_FORMAT, "undefined rule '%.*s'", (int)(ru->len > 40 ? 40 : ru->len),
                         ru->name);
        }
        if (ru->len == 4 && !memcmp(ru->name, "root", 4)) root = i;
    }
    if (root < 0) {
        p->line = 1;
        return failf(p, FERRY_ERR_FORMAT, "no 'root' rule");
    }
    for (int changed = 1; changed;) { /* nullable rules: a fixpoint */
        changed = 0;
        for (int i = 0; i < p->nrules; i++)
            if (!p->rules[i].nullable && x_nullable(p, p->rules[i].body)) p->rules[i].nullable = changed = 1;
    }
    for (int i = 0; i < p->nrules; i++)
        if (walk_left(p, i)) return -1;
    return root;
}

/* ---- building ---- */

/* One byte range [lo, hi] as a node (a set of one-byte literals), shared between classes. */
static int byte_range(struct gbuilder *b, unsigned lo, unsigned hi, int *memo)
{
    int *slot = &memo[lo * 256 + hi];
    if (*slot >= 0) return *slot;
    struct gb_lit lits[256];
    char bytes[256];
    int n = 0;
    for (unsigned c = lo; c <= hi; c++) {
        bytes[n] = (char)c;
        lits[n] = (struct gb_lit){&bytes[n], 1, -1};
        n++;
    }
    return *slot = n == 1 ? gb_lit(b, bytes, 1) : gb_litset(b, lits, n);
}

/* The UTF-8 byte sequences of the code points [lo, hi] (surrogates excluded), as alternatives in out. */
static int utf8_ranges(struct gbuilder *b, int *memo, uint32_t lo, uint32_t hi, int *out, int *n, int cap)
{
    static const uint32_t bounds[] = {0x7F, 0x7FF, 0xFFFF, 0x10FFFF};
    if (lo <= 0xDFFF && hi >= 0xD800) { /* no surrogates in UTF-8 */
        if (lo < 0xD800 && utf8_ranges(b, memo, lo, 0xD7FF, out, n, cap)) return -1;
        return hi > 0xDFFF ? utf8_ranges(b, memo, 0xE000, hi, out, n, cap) : 0;
    }
    for (int i = 0; i < 3; i++) /* split where the encoded length changes */
        if (lo <= bounds[i] && hi > bounds[i]) {
            if (utf8_ranges(b, memo, lo, bounds[i], out, n, cap)) return -1;
            return utf8_ranges(b, memo, bounds[i] + 1, hi, out, n, cap);
        }
    if (hi < 0x80) {
        if (*n >= cap) return gb_fail(b, FERRY_ERR_RANGE, "a character class too large");
        out[(*n)++] = byte_range(b, lo, hi, memo);
        return 0;
    }
    const int len = hi <= 0x7FF ? 2 : hi <= 0xFFFF ? 3 : 4;
    for (int i = 1; i < len; i++) { /* split until the continuation bytes of lo and hi span whole ranges */
        uint32_t m = (1u << (6 * i)) - 1;
        if ((lo & ~m) != (hi & ~m)) {
            if ((lo & m) != 0) {
                if (utf8_ranges(b, memo, lo, lo | m, out, n, cap)) return -1;
                return utf8_ranges(b, memo, (lo | m) + 1, hi, out, n, cap);
            }
            if ((hi & m) != m) {
                if (utf8_ranges(b, memo, lo, (hi & ~m) - 1, out, n, cap)) return -1;
                return utf8_ranges(b, memo, hi & ~m, hi, out, n, cap);
            }
        }
    }
    unsigned char a[4], z[4];
    for (int i = len - 1; i > 0; i--) {
        a[i] = (unsigned char)(0x80 | ((lo >> (6 * (len - 1 - i))) & 0x3F));
        z[i] = (unsigned char)(0x80 | ((hi >> (6 * (len - 1 - i))) & 0x3F));
    }
    const unsigned lead = len == 2 ? 0xC0 : len == 3 ? 0xE0 : 0xF0;
    a[0] = (unsigned char)(lead | (lo >> (6 * (len - 1))));
    z[0] = (unsigned char)(lead | (hi >> (6 * (len - 1))));
    int kids[4];
    for (int i = 0; i < len; i++) kids[i] = byte_range(b, a[i], z[i], memo);
    if (*n >= cap) return gb_fail(b, FERRY_ERR_RANGE, "a character class too large");
    out[(*n)++] = gb_seq(b, kids, len);
    return 0;
}

static int build(struct gbnf *p, struct gbuilder *b, int *memo, int k)
{
    const struct xnode *x = &p->x[k];
    switch (x->kind) {
    case X_LIT:
        return x->n ? gb_lit(b, p->bytes + x->a, (size_t)x->n) : gb_seq(b, NULL, 0);
    case X_CLASS: {
        int alts[512], n = 0;
        for (int i = 0; i < x->n; i++)
            if (utf8_ranges(b, memo, p->ranges[2 * (x->a + i)], p->ranges[2 * (x->a + i) + 1], alts, &n, 512))
                return -1;
        return n == 1 ? alts[0] : gb_alt(b, alts, n);
    }
    case X_RULE:
        return p->rules[x->rule].gb;
    case X_SEQ:
    case X_ALT: {
        int *kids = malloc((size_t)(x->n ? x->n : 1) * sizeof *kids);
        if (!kids) return gb_fail(b, FERRY_ERR_NOMEM, "out of memory");
        for (int i = 0; i < x->n; i++) kids[i] = build(p, b, memo, p->kids[x->a + i]);
        int r = x->kind == X_SEQ ? gb_seq(b, kids, x->n) : gb_alt(b, kids, x->n);
        free(kids);
        return r;
    }
    default: {
        int budget = 4096; /* a repetition of what matches only "" is "" (the recogniser needs it so) */
        if (x_empty_only(p, x->rule, &budget)) return gb_seq(b, NULL, 0);
        return gb_rep(b, build(p, b, memo, x->rule), x->min, x->max);
    }
    }
}

int grammar_gbnf(const char *src, size_t len, struct grammar **out, char err[256])
{
    *out = NULL;
    err[0] = 0;
    if (len > GBNF_MAX_SRC) {
        snprintf(err, 256, "the grammar is longer than %d bytes", GBNF_MAX_SRC);
        return FERRY_ERR_RANGE;
    }
    struct gbnf p = {.s = src, .end = src + len, .line = 1};
    int root = parse_rules(&p) ? -1 : check(&p);
    int rc = p.status;
    if (!rc) {
        struct gbuilder *b = NULL;
        int *memo = malloc(256 * 256 * sizeof *memo);
        if (!memo || gb_init(&b)) {
            free(memo);
            snprintf(err, 256, "out of memory");
            rc = FERRY_ERR_NOMEM;
        } else {
            for (int i = 0; i < 256 * 256; i++) memo[i] = -1;
            for (int i = 0; i < p.nrules; i++) p.rules[i].gb = gb_reserve(b);
            for (int i = 0; i < p.nrules; i++)
                gb_define(b, p.rules[i].gb, build(&p, b, memo, p.rules[i].body));
            char berr[256];
            rc = gb_finish(b, p.rules[root].gb, out, berr); /* frees b */
            if (rc == FERRY_ERR_INVALID)                    /* the builder words it for schemas */
                snprintf(err, 256, "the grammar accepts nothing: 'root' never ends (%.180s)", berr);
            else if (rc)
                snprintf(err, 256, "%s", berr);
            free(memo);
        }
    } else {
        snprintf(err, 256, "%s", p.err);
    }
    free(p.x);
    free(p.kids);
    free(p.bytes);
    free(p.ranges);
    free(p.rules);
    return rc;
}
