/* regex — see regex.h. Pattern → syntax tree (code-point sets, concatenation, alternation, repetition) →
 * Thompson NFA over UTF-8 bytes (each code-point range split into byte-range sequences) → DFA by subset
 * construction → states that cannot reach acceptance removed → distance to acceptance by reverse BFS.
 */
#include "runtime/regex.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/core/status.h"

#define MAX_NODES 8192
#define MAX_NFA   60000
#define MAX_DEPTH 64
#define CP_MAX    0x10FFFF

/* ---- code-point sets ------------------------------------------------------------------------------- */

struct cpset {
    int n, cap;
    uint32_t (*r)[2]; /* (n) inclusive ranges, sorted and disjoint once normalised */
};

enum { RX_SET, RX_CAT, RX_ALT, RX_REP, RX_EMPTY };

struct rxnode {
    int kind;
    int a, b;     /* CAT/ALT children; REP child in a */
    int min, max; /* REP: max -1 = unbounded */
    int set;      /* SET: index into sets */
};

struct rxparse {
    const char *p;
    size_t n, i;
    int depth;
    int status;
    char *err;
    struct rxnode *nodes;
    int n_nodes;
    struct cpset *sets;
    int n_sets, sets_cap;
};

static int fail(struct rxparse *P, int status, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int fail(struct rxparse *P, int status, const char *fmt, ...)
{
    if (P->status) return -1;
    P->status = status;
    char msg[200];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    snprintf(P->err, 256, "pattern: %s (at byte %zu)", msg, P->i);
    return -1;
}

static int set_add(struct rxparse *P, struct cpset *s, uint32_t lo, uint32_t hi)
{
    if (s->n == s->cap) {
        int nc = s->cap ? s->cap * 2 : 8;
        void *q = realloc(s->r, (size_t)nc * sizeof *s->r);
        if (!q) return fail(P, FERRY_ERR_NOMEM, "out of memory");
        s->r = q;
        s->cap = nc;
    }
    s->r[s->n][0] = lo;
    s->r[s->n][1] = hi;
    s->n++;
    return 0;
}

static int cmp_range(const void *a, const void *b)
{
    const uint32_t *x = a, *y = b;
    return x[0] < y[0] ? -1 : x[0] > y[0];
}

/* Sorts and merges; removes the surrogates (never valid UTF-8). */
static int set_normalise(struct rxparse *P, struct cpset *s)
{
    if (s->n == 0) return 0;
    qsort(s->r, (size_t)s->n, sizeof *s->r, cmp_range);
    int m = 0;
    for (int i = 0; i < s->n; i++) {
        if (m && s->r[i][0] <= s->r[m - 1][1] + 1) {
            if (s->r[i][1] > s->r[m - 1][1]) s->r[m - 1][1] = s->r[i][1];
        } else {
            s->r[m][0] = s->r[i][0];
            s->r[m][1] = s->r[i][1];
            m++;
        }
    }
    s->n = m;
    for (int i = 0; i < s->n; i++) {
        uint32_t lo = s->r[i][0], hi = s->r[i][1];
        if (hi < 0xD800 || lo > 0xDFFF) continue;
        if (lo < 0xD800 && hi > 0xDFFF) { /* split around the surrogates */
            s->r[i][1] = 0xD7FF;
            if (set_add(P, s, 0xE000, hi)) return -1;
            return set_normalise(P, s);
        }
        if (lo >= 0xD800 && hi <= 0xDFFF) {
            memmove(&s->r[i], &s->r[i + 1], (size_t)(s->n - i - 1) * sizeof *s->r);
            s->n--;
            i--;
        } else if (lo < 0xD800) {
            s->r[i][1] = 0xD7FF;
        } else {
            s->r[i][0] = 0xE000;
        }
    }
    return 0;
}

/* The complement within [0, CP_MAX] (or within [0x20, 0x7E] when ascii). s must be normalised. */
static int set_negate(struct rxparse *P, struct cpset *s, int ascii)
{
    struct cpset o = {0};
    uint32_t lo = ascii ? 0x20 : 0, top = ascii ? 0x7E : CP_MAX;
    for (int i = 0; i < s->n && lo <= top; i++) {
        if (s->r[i][1] < lo) continue;
        if (s->r[i][0] > lo && set_add(P, &o, lo, (s->r[i][0] - 1 < top ? s->r[i][0] - 1 : top))) goto oom;
        lo = s->r[i][1] + 1;
    }
    if (lo <= top && set_add(P, &o, lo, top)) goto oom;
    free(s->r);
    *s = o;
    return set_normalise(P, s);
oom:
    free(o.r);
    return -1;
}

static int new_set(struct rxparse *P)
{
    if (P->n_sets == P->sets_cap) {
        int nc = P->sets_cap ? P->sets_cap * 2 : 16;
        void *q = realloc(P->sets, (size_t)nc * sizeof *P->sets);
        if (!q) return fail(P, FERRY_ERR_NOMEM, "out of memory");
        P->sets = q;
        P->sets_cap = nc;
    }
    P->sets[P->n_sets] = (struct cpset){0};
    return P->n_sets++;
}

static int new_node(struct rxparse *P, int kind, int a, int b)
{
    if (P->n_nodes >= MAX_NODES)
        return fail(P, FERRY_ERR_RANGE, "too complex (more than %d parts)", MAX_NODES);
    P->nodes[P->n_nodes] = (struct rxnode){kind, a, b, 0, 0, -1};
    return P->n_nodes++;
}

/* ---- parser --------------------------------------------------------------------------------------- */

static int peek(const struct rxparse *P)
{
    return P->i < P->n ? (unsigned char)P->p[P->i] : -1;
}

/* One UTF-8 code point of the pattern. */
static int read_cp(struct rxparse *P, uint32_t *cp)
{
    const unsigned char *s = (const unsigned char *)P->p + P->i;
    size_t left = P->n - P->i;
    unsigned c = s[0];
    int len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (!len || (size_t)len > left) return fail(P, FERRY_ERR_INVALID, "invalid UTF-8");
    uint32_t v = len == 1 ? c : len == 2 ? c & 0x1F : len == 3 ? c & 0x0F : c & 0x07;
    for (int k = 1; k < len; k++) {
        if ((s[k] & 0xC0) != 0x80) return fail(P, FERRY_ERR_INVALID, "invalid UTF-8");
        v = (v << 6) | (s[k] & 0x3F);
    }
    P->i += (size_t)len;
    *cp = v;
    return 0;
}

static int hexval(int c)
{
    return c >= '0' && c <= '9'   ? c - '0'
           : c >= 'a' && c <= 'f' ? c - 'a' + 10
           : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                  : -1;
}

static int read_hex(struct rxparse *P, int digits, uint32_t *v)
{
    *v = 0;
    for (int k = 0; k < digits; k++) {
        int h = hexval(peek(P));
        if (h < 0) return fail(P, FERRY_ERR_INVALID, "expected %d hex digits", digits);
        *v = *v * 16 + (uint32_t)h;
        P->i++;
    }
    return 0;
}

/* Shorthand classes, ASCII forms (a subset of Python's Unicode ones). neg: \D \W \S within printable ASCII.
 */
static int add_shorthand(struct rxparse *P, struct cpset *s, int c)
{
    struct cpset t = {0};
    int lower = c | 0x20, rc = 0;
    if (lower == 'd') {
        rc = set_add(P, &t, '0', '9');
    } else if (lower == 'w') {
        rc = set_add(P, &t, '0', '9') || set_add(P, &t, 'A', 'Z') || set_add(P, &t, 'a', 'z') ||
             set_add(P, &t, '_', '_');
    } else {
        rc = set_add(P, &t, ' ', ' ') || set_add(P, &t, '\t', '\r');
    }
    if (!rc && c != lower) rc = set_normalise(P, &t) || set_negate(P, &t, 1);
    for (int k = 0; !rc && k < t.n; k++) rc = set_add(P, s, t.r[k][0], t.r[k][1]);
    free(t.r);
    return rc ? -1 : 0;
}

/* After a backslash: a single code point (*cp), or a shorthand class added to s (returns 1). */
static int read_escape(struct rxparse *P, struct cpset *s, uint32_t *cp, int in_class)
{
    if (P->i >= P->n) return fail(P, FERRY_ERR_INVALID, "trailing backslash");
    int c = peek(P);
    P->i++;
    switch (c) {
    case 'd':
    case 'D':
    case 'w':
    case 'W':
    case 's':
    case 'S':
        return add_shorthand(P, s, c) ? -1 : 1;
    case 'n':
        *cp = '\n';
        return 0;
    case 't':
        *cp = '\t';
        return 0;
    case 'r':
        *cp = '\r';
        return 0;
    case 'f':
        *cp = '\f';
        return 0;
    case 'v':
        *cp = '\v';
        return 0;
    case 'a':
        *cp = 7;
        return 0;
    case '0':
        *cp = 0;
        return 0;
    case 'x':
        return read_hex(P, 2, cp);
    case 'u':
        return read_hex(P, 4, cp);
    case 'U':
        return read_hex(P, 8, cp) || *cp > CP_MAX ? fail(P, FERRY_ERR_INVALID, "bad \\U escape") : 0;
    case 'b':
        if (in_class) {
            *cp = 8;
            return 0;
        }
        return fail(P, FERRY_ERR_UNSUPPORTED, "word boundaries (\\b) are not supported");
    case 'B':
    case 'A':
    case 'Z':
    case 'z':
    case 'G':
        return fail(P, FERRY_ERR_UNSUPPORTED, "the assertion \\%c is not supported", c);
    default:
        if (c >= '1' && c <= '9') return fail(P, FERRY_ERR_UNSUPPORTED, "backreferences are not supported");
        if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'))
            return fail(P, FERRY_ERR_UNSUPPORTED, "the escape \\%c is not supported", c);
        P->i--;
        return read_cp(P, cp);
    }
}

static int parse_class(struct rxparse *P)
{
    int si = new_set(P);
    if (si < 0) return -1;
    int neg = 0, shorthand = 0, first = 1;
    if (peek(P) == '^') neg = 1, P->i++;
    for (;;) {
        if (P->i >= P->n) return fail(P, FERRY_ERR_INVALID, "unterminated character class");
        int c = peek(P);
        if (c == ']' && !first) {
            P->i++;
            break;
        }
        first = 0;
        if (c == '[' && P->i + 1 < P->n &&
            (P->p[P->i + 1] == ':' || P->p[P->i + 1] == '=' || P->p[P->i + 1] == '.'))
            return fail(P, FERRY_ERR_UNSUPPORTED, "POSIX character classes are not supported");
        uint32_t lo;
        if (c == '\\') {
            P->i++;
            int r = read_escape(P, &P->sets[si], &lo, 1);
            if (r < 0) return -1;
            if (r == 1) {
                shorthand = 1;
                continue;
            }
        } else if (read_cp(P, &lo)) {
            return -1;
        }
        uint32_t hi = lo;
        if (peek(P) == '-' && P->i + 1 < P->n && P->p[P->i + 1] != ']') {
            P->i++;
            if (peek(P) == '\\') {
                P->i++;
                struct cpset dummy = {0};
                int r = read_escape(P, &dummy, &hi, 1);
                free(dummy.r);
                if (r < 0) return -1;
                if (r == 1) return fail(P, FERRY_ERR_INVALID, "a class shorthand cannot end a range");
            } else if (read_cp(P, &hi)) {
                return -1;
            }
            if (hi < lo) return fail(P, FERRY_ERR_INVALID, "bad character range");
        }
        if (set_add(P, &P->sets[si], lo, hi)) return -1;
    }
    if (set_normalise(P, &P->sets[si])) return -1;
    /* [^\d] etc.: Python's shorthands are Unicode-wide, so the complement stays within printable ASCII */
    if (neg && set_negate(P, &P->sets[si], shorthand)) return -1;
    if (P->sets[si].n == 0) return fail(P, FERRY_ERR_INVALID, "the character class matches nothing");
    int nd = new_node(P, RX_SET, 0, 0);
    if (nd >= 0) P->nodes[nd].set = si;
    return nd;
}

static int set_node(struct rxparse *P, uint32_t lo, uint32_t hi)
{
    int si = new_set(P);
    if (si < 0 || set_add(P, &P->sets[si], lo, hi) || set_normalise(P, &P->sets[si])) return -1;
    int nd = new_node(P, RX_SET, 0, 0);
    if (nd >= 0) P->nodes[nd].set = si;
    return nd;
}

static int parse_alt(struct rxparse *P, int top);

static int parse_atom(struct rxparse *P)
{
    int c = peek(P);
    if (c == '(') {
        P->i++;
        if (peek(P) == '?') {
            P->i++;
            int k = peek(P);
            if (k == ':') {
                P->i++;
            } else if (k == 'P' && P->i + 1 < P->n && P->p[P->i + 1] == '<') {
                P->i += 2;
                while (P->i < P->n && P->p[P->i] != '>') P->i++;
                P->i++;
            } else if (k == '<' && P->i + 1 < P->n && P->p[P->i + 1] != '=' && P->p[P->i + 1] != '!') {
                P->i++;
                while (P->i < P->n && P->p[P->i] != '>') P->i++;
                P->i++;
            } else if (k == '=' || k == '!' || k == '<') {
                return fail(P, FERRY_ERR_UNSUPPORTED, "lookaround assertions are not supported");
            } else {
                return fail(P, FERRY_ERR_UNSUPPORTED, "group flags (?%c are not supported", k > 0 ? k : '?');
            }
        }
        if (++P->depth > MAX_DEPTH) return fail(P, FERRY_ERR_RANGE, "groups nest deeper than %d", MAX_DEPTH);
        int nd = parse_alt(P, 0);
        P->depth--;
        if (nd < 0) return -1;
        if (peek(P) != ')') return fail(P, FERRY_ERR_INVALID, "missing )");
        P->i++;
        return nd;
    }
    if (c == '[') {
        P->i++;
        return parse_class(P);
    }
    if (c == '.') {
        P->i++;
        int si = new_set(P);
        if (si < 0 || set_add(P, &P->sets[si], 0, '\n' - 1) || set_add(P, &P->sets[si], '\n' + 1, CP_MAX) ||
            set_normalise(P, &P->sets[si]))
            return -1;
        int nd = new_node(P, RX_SET, 0, 0);
        if (nd >= 0) P->nodes[nd].set = si;
        return nd;
    }
    if (c == '^' || c == '$')
        return fail(P, FERRY_ERR_UNSUPPORTED,
                    "anchors are supported only at the start and end of the pattern");
    if (c == '*' || c == '+' || c == '?') return fail(P, FERRY_ERR_INVALID, "nothing to repeat");
    if (c == ')') return fail(P, FERRY_ERR_INVALID, "unbalanced )");
    uint32_t cp;
    if (c == '\\') {
        P->i++;
        int si = new_set(P);
        if (si < 0) return -1;
        int r = read_escape(P, &P->sets[si], &cp, 0);
        if (r < 0) return -1;
        if (r == 0 && set_add(P, &P->sets[si], cp, cp)) return -1;
        if (set_normalise(P, &P->sets[si])) return -1;
        int nd = new_node(P, RX_SET, 0, 0);
        if (nd >= 0) P->nodes[nd].set = si;
        return nd;
    }
    if (read_cp(P, &cp)) return -1;
    return set_node(P, cp, cp);
}

/* {n}, {n,}, {n,m} at P->i (just after '{'); 0 when it is not a quantifier (then '{' is a literal). */
static int read_braces(struct rxparse *P, int *mn, int *mx)
{
    size_t j = P->i;
    long a = 0, b = -1;
    int digits = 0;
    while (j < P->n && P->p[j] >= '0' && P->p[j] <= '9' && digits < 9)
        a = a * 10 + (P->p[j++] - '0'), digits++;
    if (!digits) return 0;
    if (j < P->n && P->p[j] == ',') {
        j++;
        int d2 = 0;
        long v = 0;
        while (j < P->n && P->p[j] >= '0' && P->p[j] <= '9' && d2 < 9) v = v * 10 + (P->p[j++] - '0'), d2++;
        b = d2 ? v : -1;
    } else {
        b = a;
    }
    if (j >= P->n || P->p[j] != '}') return 0;
    P->i = j + 1;
    if (a > REGEX_MAX_REPEAT || b > REGEX_MAX_REPEAT)
        return fail(P, FERRY_ERR_RANGE, "repetition counts are limited to %d", REGEX_MAX_REPEAT);
    if (b >= 0 && b < a) return fail(P, FERRY_ERR_INVALID, "bad repetition {%ld,%ld}", a, b);
    *mn = (int)a;
    *mx = (int)b;
    return 1;
}

static int parse_repeat(struct rxparse *P)
{
    int nd = parse_atom(P);
    while (nd >= 0) {
        int c = peek(P), mn = 0, mx = 0;
        if (c == '*') {
            mn = 0, mx = -1, P->i++;
        } else if (c == '+') {
            mn = 1, mx = -1, P->i++;
        } else if (c == '?') {
            mn = 0, mx = 1, P->i++;
        } else if (c == '{') {
            P->i++;
            int r = read_braces(P, &mn, &mx);
            if (r < 0) return -1;
            if (r == 0) {
                P->i--;
                break;
            }
        } else {
            break;
        }
        if (peek(P) == '?')
            P->i++; /* lazy: the same language */
        else if (peek(P) == '+')
            return fail(P, FERRY_ERR_UNSUPPORTED, "possessive quantifiers are not supported");
        int r = new_node(P, RX_REP, nd, 0);
        if (r < 0) return -1;
        P->nodes[r].min = mn;
        P->nodes[r].max = mx;
        nd = r;
        /* ECMAScript refuses a quantifier on a quantifier ("a**", "a+{2}"): there is nothing to repeat */
        c = peek(P);
        if (c == '*' || c == '+' || c == '?' ||
            (c == '{' && P->i + 1 < P->n && P->p[P->i + 1] >= '0' && P->p[P->i + 1] <= '9'))
            return fail(P, FERRY_ERR_INVALID, "nothing to repeat: a quantifier follows a quantifier");
    }
    return nd;
}

/* Any code point, repeated: the unanchored sides of a search. */
static int any_star(struct rxparse *P)
{
    int s = set_node(P, 0, CP_MAX);
    if (s < 0) return -1;
    int r = new_node(P, RX_REP, s, 0);
    if (r >= 0) P->nodes[r].min = 0, P->nodes[r].max = -1;
    return r;
}

static int parse_cat(struct rxparse *P, int top)
{
    int nd = -1, anchored_start = 0, anchored_end = 0;
    if (top && peek(P) == '^') anchored_start = 1, P->i++;
    for (;;) {
        int c = peek(P);
        if (c < 0 || c == '|' || c == ')') break;
        if (top && c == '$' && (P->i + 1 == P->n || P->p[P->i + 1] == '|')) {
            P->i++;
            anchored_end = 1;
            break;
        }
        int x = parse_repeat(P);
        if (x < 0) return -1;
        nd = nd < 0 ? x : new_node(P, RX_CAT, nd, x);
        if (nd < 0) return -1;
    }
    if (nd < 0 && (nd = new_node(P, RX_EMPTY, 0, 0)) < 0) return -1;
    if (top && !anchored_start) {
        int a = any_star(P);
        if (a < 0 || (nd = new_node(P, RX_CAT, a, nd)) < 0) return -1;
    }
    if (top && !anchored_end) {
        int a = any_star(P);
        if (a < 0 || (nd = new_node(P, RX_CAT, nd, a)) < 0) return -1;
    }
    return nd;
}

static int parse_alt(struct rxparse *P, int top)
{
    int nd = parse_cat(P, top);
    while (nd >= 0 && peek(P) == '|') {
        P->i++;
        int b = parse_cat(P, top);
        if (b < 0) return -1;
        nd = new_node(P, RX_ALT, nd, b);
    }
    return nd;
}

/* ---- NFA ------------------------------------------------------------------------------------------ */

enum { NS_EPS, NS_RANGE, NS_MATCH };

struct nstate {
    uint8_t type, lo, hi;
    int out, out2; /* NS_EPS: out2 may be -1 */
};

struct nfa {
    struct nstate *s;
    int n, cap;
    int status;
};

static int nfa_add(struct nfa *N, int type, int lo, int hi, int out, int out2)
{
    if (N->status) return -1;
    if (N->n >= MAX_NFA) {
        N->status = FERRY_ERR_RANGE;
        return -1;
    }
    if (N->n == N->cap) {
        int nc = N->cap ? N->cap * 2 : 1024;
        void *q = realloc(N->s, (size_t)nc * sizeof *N->s);
        if (!q) {
            N->status = FERRY_ERR_NOMEM;
            return -1;
        }
        N->s = q;
        N->cap = nc;
    }
    N->s[N->n] = (struct nstate){(uint8_t)type, (uint8_t)lo, (uint8_t)hi, out, out2};
    return N->n++;
}

static int utf8_encode(uint32_t cp, uint8_t *b)
{
    if (cp < 0x80) return b[0] = (uint8_t)cp, 1;
    if (cp < 0x800) return b[0] = (uint8_t)(0xC0 | cp >> 6), b[1] = (uint8_t)(0x80 | (cp & 0x3F)), 2;
    if (cp < 0x10000) {
        b[0] = (uint8_t)(0xE0 | cp >> 12), b[1] = (uint8_t)(0x80 | ((cp >> 6) & 0x3F));
        b[2] = (uint8_t)(0x80 | (cp & 0x3F));
        return 3;
    }
    b[0] = (uint8_t)(0xF0 | cp >> 18), b[1] = (uint8_t)(0x80 | ((cp >> 12) & 0x3F));
    b[2] = (uint8_t)(0x80 | ((cp >> 6) & 0x3F)), b[3] = (uint8_t)(0x80 | (cp & 0x3F));
    return 4;
}

/* Adds byte-range chains for the code points [lo, hi] (one UTF-8 length, no surrogates) as alternatives
 * leading to `next`; *alt is the fan-out built so far (-1: none). Splits until every byte position is one
 * range: the classic decomposition of a code-point range into UTF-8 byte-range sequences. */
static void utf8_range(struct nfa *N, uint32_t lo, uint32_t hi, int next, int *alt)
{
    static const uint32_t limits[] = {0x7F, 0x7FF, 0xFFFF, CP_MAX};
    for (int k = 0; k < 3; k++)
        if (lo <= limits[k] && hi > limits[k]) {
            utf8_range(N, lo, limits[k], next, alt);
            utf8_range(N, limits[k] + 1, hi, next, alt);
            return;
        }
    uint8_t a[4], b[4];
    int len = utf8_encode(lo, a);
    for (int i = 1; i < len; i++) {
        uint32_t m = (1u << (6 * i)) - 1;
        if ((lo & ~m) != (hi & ~m)) {
            if ((lo & m) != 0) {
                utf8_range(N, lo, lo | m, next, alt);
                utf8_range(N, (lo | m) + 1, hi, next, alt);
                return;
            }
            if ((hi & m) != m) {
                utf8_range(N, lo, (hi & ~m) - 1, next, alt);
                utf8_range(N, hi & ~m, hi, next, alt);
                return;
            }
        }
    }
    utf8_encode(hi, b);
    int s = next;
    for (int i = len - 1; i >= 0; i--) s = nfa_add(N, NS_RANGE, a[i], b[i], s, -1);
    *alt = *alt < 0 ? s : nfa_add(N, NS_EPS, 0, 0, s, *alt);
}

/* Builds node nd in front of `next`; returns its start state. */
static int build(struct nfa *N, const struct rxparse *P, int nd, int next)
{
    if (N->status) return -1;
    const struct rxnode *x = &P->nodes[nd];
    switch (x->kind) {
    case RX_EMPTY:
        return next;
    case RX_SET: {
        int alt = -1;
        const struct cpset *s = &P->sets[x->set];
        for (int i = 0; i < s->n; i++) utf8_range(N, s->r[i][0], s->r[i][1], next, &alt);
        return alt;
    }
    case RX_CAT:
        return build(N, P, x->a, build(N, P, x->b, next));
    case RX_ALT:
        return nfa_add(N, NS_EPS, 0, 0, build(N, P, x->a, next), build(N, P, x->b, next));
    default: { /* RX_REP */
        int s = next;
        if (x->max < 0) {
            int loop = nfa_add(N, NS_EPS, 0, 0, -1, next);
            if (loop < 0) return -1;
            int body = build(N, P, x->a, loop);
            if (body < 0) return -1;
            N->s[loop].out = body;
            s = loop;
        } else {
            for (int k = 0; k < x->max - x->min && !N->status; k++)
                s = nfa_add(N, NS_EPS, 0, 0, build(N, P, x->a, s), next);
        }
        for (int k = 0; k < x->min && !N->status; k++) s = build(N, P, x->a, s);
        return s;
    }
    }
}

/* ---- DFA ------------------------------------------------------------------------------------------ */

struct dfa_build {
    const struct nfa *N;
    int words;      /* uint64 words per NFA set */
    uint64_t *sets; /* (cap, words) */
    int n, cap;
    int *hash; /* (hcap) DFA id + 1, 0 empty */
    int hcap;
    uint16_t *next; /* (cap, 256) */
    uint8_t *accept;
    int *stack; /* (N->n) */
};

static uint64_t hash_set(const uint64_t *w, int words)
{
    uint64_t h = 1469598103934665603ull;
    for (int i = 0; i < words; i++) h = (h ^ w[i]) * 1099511628211ull;
    return h;
}

static void closure(struct dfa_build *B, uint64_t *set, int seed)
{
    int sp = 0;
    if (seed < 0 || (set[seed >> 6] >> (seed & 63) & 1)) return;
    set[seed >> 6] |= 1ull << (seed & 63);
    B->stack[sp++] = seed;
    while (sp) {
        int q = B->stack[--sp];
        const struct nstate *st = &B->N->s[q];
        if (st->type != NS_EPS) continue;
        int outs[2] = {st->out, st->out2};
        for (int k = 0; k < 2; k++) {
            int t = outs[k];
            if (t >= 0 && !(set[t >> 6] >> (t & 63) & 1)) {
                set[t >> 6] |= 1ull << (t & 63);
                B->stack[sp++] = t;
            }
        }
    }
}

/* The DFA id of a set, adding it when new; -1 on a bound or allocation failure (*status set). */
static int intern(struct dfa_build *B, const uint64_t *set, int *status)
{
    uint64_t h = hash_set(set, B->words);
    int slot = (int)(h & (uint64_t)(B->hcap - 1));
    while (B->hash[slot]) {
        int id = B->hash[slot] - 1;
        if (!memcmp(B->sets + (size_t)id * B->words, set, (size_t)B->words * 8)) return id;
        slot = (slot + 1) & (B->hcap - 1);
    }
    if (B->n >= REGEX_MAX_STATES) {
        *status = FERRY_ERR_RANGE;
        return -1;
    }
    if (B->n == B->cap) {
        int nc = B->cap * 2;
        uint64_t *s = realloc(B->sets, (size_t)nc * B->words * 8);
        if (s) B->sets = s;
        uint16_t *nx = realloc(B->next, (size_t)nc * 256 * sizeof *nx);
        if (nx) B->next = nx;
        uint8_t *ac = realloc(B->accept, (size_t)nc);
        if (ac) B->accept = ac;
        if (!s || !nx || !ac) {
            *status = FERRY_ERR_NOMEM;
            return -1;
        }
        B->cap = nc;
    }
    int id = B->n++;
    memcpy(B->sets + (size_t)id * B->words, set, (size_t)B->words * 8);
    B->hash[slot] = id + 1;
    return id;
}

static int dfa_build(struct dfa_build *B, int start_state, int match, char *err)
{
    int status = 0;
    B->words = (B->N->n + 63) / 64;
    B->cap = 64;
    B->hcap = 2 * REGEX_MAX_STATES;
    B->sets = calloc((size_t)B->cap * B->words, 8);
    B->next = malloc((size_t)B->cap * 256 * sizeof *B->next);
    B->accept = malloc((size_t)B->cap);
    B->hash = calloc((size_t)B->hcap, sizeof *B->hash);
    B->stack = malloc((size_t)B->N->n * sizeof *B->stack);
    uint64_t *tmp = calloc((size_t)B->words, 8);
    uint8_t *bound = malloc(257);
    if (!B->sets || !B->next || !B->accept || !B->hash || !B->stack || !tmp || !bound) {
        free(tmp);
        free(bound);
        return ferry_fail(err, FERRY_ERR_NOMEM, "pattern: out of memory");
    }
    closure(B, tmp, start_state);
    intern(B, tmp, &status);
    for (int d = 0; d < B->n && !status; d++) {
        const uint64_t *set = B->sets + (size_t)d * B->words;
        memset(bound, 0, 257);
        bound[0] = bound[256] = 1;
        int any_match = 0;
        for (int w = 0; w < B->words; w++)
            for (uint64_t m = set[w]; m; m &= m - 1) {
                int q = w * 64 + __builtin_ctzll(m);
                const struct nstate *st = &B->N->s[q];
                if (q == match) any_match = 1;
                if (st->type == NS_RANGE) bound[st->lo] = bound[st->hi + 1] = 1;
            }
        B->accept[d] = (uint8_t)any_match;
        for (int lo = 0; lo < 256 && !status;) {
            int hi = lo + 1;
            while (!bound[hi]) hi++;
            memset(tmp, 0, (size_t)B->words * 8);
            int any = 0;
            for (int w = 0; w < B->words; w++)
                for (uint64_t m = set[w]; m; m &= m - 1) {
                    int q = w * 64 + __builtin_ctzll(m);
                    const struct nstate *st = &B->N->s[q];
                    if (st->type == NS_RANGE && st->lo <= lo && lo <= st->hi) {
                        closure(B, tmp, st->out);
                        any = 1;
                    }
                }
            int t = any ? intern(B, tmp, &status) : -1;
            /* intern may have moved B->sets */
            set = B->sets + (size_t)d * B->words;
            for (int b = lo; b < hi; b++) B->next[(size_t)d * 256 + b] = t < 0 ? REGEX_DEAD : (uint16_t)t;
            lo = hi;
        }
    }
    free(tmp);
    free(bound);
    if (status == FERRY_ERR_RANGE)
        return ferry_fail(err, status, "pattern: more than %d automaton states; simplify it",
                          REGEX_MAX_STATES);
    if (status) return ferry_fail(err, status, "pattern: out of memory");
    return 0;
}

static int weighted_dist(const struct regex_dfa *d, const int16_t w[256], uint32_t **out);

/* A byte that starts a code point (not a UTF-8 continuation byte). */
static int starts_cp(int b)
{
    return (b & 0xC0) != 0x80;
}

/* cmin by relaxation over the (small) live DFA, cmax by a depth-first search that marks loops. */
static int code_points(struct regex_dfa *d)
{
    const int n = d->n_states;
    d->cmin = malloc((size_t)n * sizeof *d->cmin);
    d->cmax = malloc((size_t)n * sizeof *d->cmax);
    uint8_t *color = calloc((size_t)n, 1);
    int *stack = malloc((size_t)n * 2 * sizeof *stack);
    if (!d->cmin || !d->cmax || !color || !stack) {
        free(color);
        free(stack);
        return -1;
    }
    {
        int16_t w[256];
        for (int b = 0; b < 256; b++) w[b] = (int16_t)starts_cp(b);
        uint32_t *cmin;
        if (weighted_dist(d, w, &cmin)) {
            free(color);
            free(stack);
            return -1;
        }
        free(d->cmin);
        d->cmin = cmin;
    }
    /* iterative DFS: color 1 = on the stack, 2 = done; an edge back to the stack is a loop */
    for (int root = 0; root < n; root++) {
        if (color[root]) continue;
        int sp = 0;
        stack[sp++] = root, stack[sp++] = 0;
        color[root] = 1;
        d->cmax[root] = 0;
        while (sp) {
            int s = stack[sp - 2], b = stack[sp - 1];
            if (b == 256) {
                color[s] = 2;
                sp -= 2;
                continue;
            }
            stack[sp - 1] = b + 1;
            uint16_t t = d->next[(size_t)s * 256 + b];
            if (t == REGEX_DEAD) continue;
            if (color[t] == 1) {
                d->cmax[s] = REGEX_UNBOUNDED;
                continue;
            }
            if (color[t] == 0) {
                color[t] = 1;
                d->cmax[t] = 0;
                stack[sp - 1] = b; /* revisit this edge once t is done */
                stack[sp++] = t, stack[sp++] = 0;
                continue;
            }
            uint32_t c =
                d->cmax[t] == REGEX_UNBOUNDED ? REGEX_UNBOUNDED : d->cmax[t] + (uint32_t)starts_cp(b);
            if (c > d->cmax[s] || c == REGEX_UNBOUNDED) d->cmax[s] = c;
        }
    }
    free(color);
    free(stack);
    return 0;
}

/* Keeps the states that can reach acceptance, renumbered; distances by reverse BFS. */
static int finish(struct dfa_build *B, struct regex_dfa *d, char *err)
{
    const int n = B->n;
    int *rev_cnt = calloc((size_t)n + 1, sizeof(int)), *rev = NULL, *dist = malloc((size_t)n * sizeof(int));
    int *queue = malloc((size_t)n * sizeof(int)), *map = calloc((size_t)n + 1, sizeof(int));
    int rc = 0;
    if (!rev_cnt || !dist || !queue || !map) goto oom;
    /* reverse edges, one per (from, to) pair and byte class */
    for (int s = 0; s < n; s++)
        for (int b = 0; b < 256; b++) {
            uint16_t t = B->next[(size_t)s * 256 + b];
            if (t != REGEX_DEAD && (b == 0 || B->next[(size_t)s * 256 + b - 1] != t)) rev_cnt[t + 1]++;
        }
    for (int s = 0; s < n; s++) rev_cnt[s + 1] += rev_cnt[s];
    rev = malloc((size_t)(rev_cnt[n] ? rev_cnt[n] : 1) * sizeof(int));
    if (!rev) goto oom;
    {
        int *fill = calloc((size_t)n, sizeof(int));
        if (!fill) goto oom;
        for (int s = 0; s < n; s++)
            for (int b = 0; b < 256; b++) {
                uint16_t t = B->next[(size_t)s * 256 + b];
                if (t != REGEX_DEAD && (b == 0 || B->next[(size_t)s * 256 + b - 1] != t))
                    rev[rev_cnt[t] + fill[t]++] = s;
            }
        free(fill);
    }
    int qh = 0, qt = 0;
    for (int s = 0; s < n; s++) {
        dist[s] = -1;
        if (B->accept[s]) dist[s] = 0, queue[qt++] = s;
    }
    while (qh < qt) {
        int t = queue[qh++];
        for (int k = rev_cnt[t]; k < rev_cnt[t + 1]; k++) {
            int s = rev[k];
            if (dist[s] < 0) dist[s] = dist[t] + 1, queue[qt++] = s;
        }
    }
    if (n <= 0 || dist[0] < 0) {
        rc = ferry_fail(err, FERRY_ERR_INVALID, "pattern: matches no string");
        goto out;
    }
    int m = 0;
    for (int s = 0; s < n; s++) map[s] = dist[s] >= 0 ? m++ : -1;
    d->n_states = m;
    d->start = map[0];
    d->next = malloc((size_t)m * 256 * sizeof *d->next);
    d->accept = malloc((size_t)m);
    d->dist = malloc((size_t)m * sizeof *d->dist);
    if (!d->next || !d->accept || !d->dist) goto oom;
    for (int s = 0; s < n; s++) {
        if (map[s] < 0) continue;
        d->accept[map[s]] = B->accept[s];
        d->dist[map[s]] = (uint32_t)dist[s];
        for (int b = 0; b < 256; b++) {
            uint16_t t = B->next[(size_t)s * 256 + b];
            d->next[(size_t)map[s] * 256 + b] = t == REGEX_DEAD || map[t] < 0 ? REGEX_DEAD : (uint16_t)map[t];
        }
    }
    if (code_points(d)) goto oom;
    goto out;
oom:
    rc = ferry_fail(err, FERRY_ERR_NOMEM, "pattern: out of memory");
out:
    free(rev_cnt);
    free(rev);
    free(dist);
    free(queue);
    free(map);
    return rc;
}

/* ---- public ----------------------------------------------------------------------------------------- */

int regex_compile(const char *pat, size_t len, struct regex_dfa **out, char err[256])
{
    *out = NULL;
    if (len > REGEX_MAX_PATTERN)
        return ferry_fail(err, FERRY_ERR_RANGE, "pattern: longer than %d bytes", REGEX_MAX_PATTERN);
    struct rxparse P = {.p = pat, .n = len, .err = err};
    P.nodes = malloc(MAX_NODES * sizeof *P.nodes);
    struct nfa N = {0};
    struct dfa_build B = {0};
    struct regex_dfa *d = NULL;
    int rc = 0;
    if (!P.nodes) {
        rc = ferry_fail(err, FERRY_ERR_NOMEM, "pattern: out of memory");
        goto out;
    }
    int root = parse_alt(&P, 1);
    if (root >= 0 && P.i < P.n) fail(&P, FERRY_ERR_INVALID, "unbalanced )");
    if (P.status) {
        rc = P.status;
        goto out;
    }
    int match = nfa_add(&N, NS_MATCH, 0, 0, -1, -1);
    int start = build(&N, &P, root, match);
    if (N.status || start < 0) {
        rc = N.status == FERRY_ERR_NOMEM
                 ? ferry_fail(err, N.status, "pattern: out of memory")
                 : ferry_fail(err, FERRY_ERR_RANGE, "pattern: too large once expanded (%d states)", MAX_NFA);
        goto out;
    }
    B.N = &N;
    if ((rc = dfa_build(&B, start, match, err))) goto out;
    d = calloc(1, sizeof *d);
    if (!d) {
        rc = ferry_fail(err, FERRY_ERR_NOMEM, "pattern: out of memory");
        goto out;
    }
    if ((rc = finish(&B, d, err))) goto out;
    *out = d;
    d = NULL;
out:
    regex_free(d);
    for (int i = 0; i < P.n_sets; i++) free(P.sets[i].r);
    free(P.sets);
    free(P.nodes);
    free(N.s);
    free(B.sets);
    free(B.next);
    free(B.accept);
    free(B.hash);
    free(B.stack);
    return rc;
}

void regex_free(struct regex_dfa *d)
{
    if (!d) return;
    free(d->next);
    free(d->accept);
    free(d->dist);
    free(d->cmin);
    free(d->cmax);
    free(d->wdist);
    free(d);
}

/* Distances to acceptance where byte b weighs w[b] (-1: the byte is never taken): Dijkstra over reverse edges
 * (one per (from, to) pair, at its lightest byte) with a binary heap, O(E log V) for E <= 256 V. *out is
 * malloc'd, REGEX_UNBOUNDED where acceptance cannot be reached. */
static int weighted_dist(const struct regex_dfa *d, const int16_t w[256], uint32_t **out)
{
    const int n = d->n_states;
    int *cnt = calloc((size_t)n + 1, sizeof *cnt), *light = malloc((size_t)n * sizeof *light);
    uint32_t *dist = malloc((size_t)n * sizeof *dist);
    int *heap = malloc(((size_t)n * 257 + 1) * sizeof *heap), *from = NULL;
    uint8_t *w_of = NULL; /* weights of the edges (w <= 255) */
    int rc = FERRY_ERR_NOMEM;
    if (!cnt || !light || !dist || !heap) goto out;
    /* light[t]: the lightest byte weight from the current s to t (reset per s); edges counted then filled */
    for (int t = 0; t < n; t++) light[t] = -1;
    for (int pass = 0; pass < 2; pass++) {
        int *fill = pass ? calloc((size_t)n, sizeof *fill) : NULL;
        if (pass && !fill) goto out;
        for (int s = 0; s < n; s++) {
            for (int b = 0; b < 256; b++) {
                uint16_t t = d->next[(size_t)s * 256 + b];
                if (t == REGEX_DEAD || w[b] < 0) continue;
                if (light[t] < 0 || w[b] < light[t]) light[t] = w[b];
            }
            for (int b = 0; b < 256; b++) {
                uint16_t t = d->next[(size_t)s * 256 + b];
                if (t == REGEX_DEAD || light[t] < 0) continue;
                if (pass == 0) {
                    cnt[t + 1]++;
                } else {
                    from[cnt[t] + fill[t]] = s;
                    w_of[cnt[t] + fill[t]++] = (uint8_t)light[t];
                }
                light[t] = -1; /* one edge per pair */
            }
        }
        if (pass == 0) {
            for (int t = 0; t < n; t++) cnt[t + 1] += cnt[t];
            from = malloc(((size_t)cnt[n] + 1) * sizeof *from);
            w_of = malloc((size_t)cnt[n] + 1);
            if (!from || !w_of) goto out;
        }
        free(fill);
    }
    int hn = 0;
    for (int s = 0; s < n; s++) {
        dist[s] = d->accept[s] ? 0 : REGEX_UNBOUNDED;
        if (d->accept[s]) heap[hn++] = s;
    }
    /* lazy deletion: a state may sit in the heap more than once; stale entries are skipped */
    while (hn) {
        int t = heap[0];
        heap[0] = heap[--hn];
        for (int i = 0;;) { /* sift down */
            int l = 2 * i + 1, r = l + 1, m = i;
            if (l < hn && dist[heap[l]] < dist[heap[m]]) m = l;
            if (r < hn && dist[heap[r]] < dist[heap[m]]) m = r;
            if (m == i) break;
            int x = heap[i];
            heap[i] = heap[m];
            heap[m] = x;
            i = m;
        }
        for (int k = cnt[t]; k < cnt[t + 1]; k++) {
            int s = from[k];
            uint32_t c = dist[t] + w_of[k];
            if (c >= dist[s]) continue;
            dist[s] = c;
            int i = hn++;
            heap[i] = s;
            while (i && dist[heap[(i - 1) / 2]] > dist[heap[i]]) { /* sift up */
                int x = heap[i];
                heap[i] = heap[(i - 1) / 2];
                heap[(i - 1) / 2] = x;
                i = (i - 1) / 2;
            }
        }
    }
    *out = dist;
    dist = NULL;
    rc = 0;
out:
    free(cnt);
    free(light);
    free(dist);
    free(heap);
    free(from);
    free(w_of);
    return rc;
}

int regex_weigh(struct regex_dfa *d, const uint8_t weight[256])
{
    int16_t w[256];
    for (int b = 0; b < 256; b++) w[b] = weight[b] ? weight[b] : -1;
    uint32_t *dist;
    if (weighted_dist(d, w, &dist)) return FERRY_ERR_NOMEM;
    free(d->wdist);
    d->wdist = dist;
    return 0;
}

int regex_match(const struct regex_dfa *d, const char *s, size_t n)
{
    int q = d->start;
    for (size_t i = 0; i < n; i++) {
        uint16_t t = d->next[(size_t)q * 256 + (unsigned char)s[i]];
        if (t == REGEX_DEAD) return 0;
        q = t;
    }
    return d->accept[q];
}
