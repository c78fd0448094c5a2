/* grammar — see grammar.h: the byte-level recogniser (the builder is grammar_build.c).
 *
 * The recogniser keeps, per thread, a stack of frames. Feeding a byte steps the top frame, which consumes
 * it, refuses it, finishes (popping, and letting its parent move on), or pushes a child that then sees the
 * byte. Alternatives (anyOf, the end of a repetition that could also go on) fork the thread; identical
 * threads are merged. Frames that are complete but could still grow (a number, a repetition) stay on the
 * stack until a byte they cannot take arrives, which then goes to the parent.
 */
#include "runtime/grammar.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/core/status.h"
#include "runtime/grammar_build.h" /* GB_NUM_* */
#include "runtime/grammar_impl.h"

#define MAX_FORKS    24 /* nested alternative expansions on one byte */
#define FORK_BUDGET  4096 /* alternative expansions of one byte over all threads: a grammar whose choices
                           * nest ambiguously (root ::= e{2,3}; e ::= " " root |) would otherwise explore
                           * up to 2^MAX_FORKS paths a byte; past the budget, threads not yet forked are
                           * dropped as past GRAMMAR_MAX_THREADS (the kept ones still describe valid outputs) */
#define NUM_INT_MAX  15 /* digits of the integer part of a bounded number */
#define NUM_FRAC_MAX 12 /* fraction digits of a bounded number */
#define NUM_FREE_MAX 64 /* digits of each part of an unbounded number */
#define NUM_EXP_MAX  4

/* ---- numbers ---- */

/* The value of "[-]I[.F]" (fd fraction digits) as Python's float() reads it. */
static double num_text_value(int neg, uint64_t I, int fd, uint64_t F, int nines)
{
    char buf[96];
    int k = snprintf(buf, sizeof buf, "%s%llu", neg ? "-" : "", (unsigned long long)I);
    if (fd > 0 || nines > 0) {
        k += snprintf(buf + k, sizeof buf - (size_t)k, ".");
        if (fd > 0) k += snprintf(buf + k, sizeof buf - (size_t)k, "%0*llu", fd, (unsigned long long)F);
        for (int i = 0; i < nines && k < (int)sizeof buf - 1; i++) buf[k++] = '9';
        buf[k] = 0;
    }
    return strtod(buf, NULL);
}

static int num_in_bounds(const struct gnode *n, double v)
{
    if (n->flags & GB_NUM_LO) {
        if (n->flags & GB_NUM_LO_EXCL ? !(v > n->lo) : !(v >= n->lo)) return 0;
    }
    if (n->flags & GB_NUM_HI) {
        if (n->flags & GB_NUM_HI_EXCL ? !(v < n->hi) : !(v <= n->hi)) return 0;
    }
    return 1;
}

/* Whether some value in [p, q] (magnitudes; negated when neg) lies within the bounds. */
static int num_overlap(const struct gnode *n, int neg, double p, double q)
{
    double lo = neg ? -q : p, hi = neg ? -p : q;
    if (n->flags & GB_NUM_HI) {
        if (n->flags & GB_NUM_HI_EXCL ? lo >= n->hi : lo > n->hi) return 0;
    }
    if (n->flags & GB_NUM_LO) {
        if (n->flags & GB_NUM_LO_EXCL ? hi <= n->lo : hi < n->lo) return 0;
    }
    return 1;
}

static uint64_t pow10u(int k)
{
    uint64_t p = 1;
    while (k-- > 0) p *= 10;
    return p;
}

enum { N_START, N_MINUS, N_ZERO, N_INT, N_DOT, N_FRAC, N_E, N_ESIGN, N_EXP };

/* Bounded numbers: whether the number begun so far can still end within the bounds. */
static int num_feasible(const struct gnode *n, int neg, int phase, int nd, uint64_t I, int fd, uint64_t F)
{
    if (!(n->flags & (GB_NUM_LO | GB_NUM_HI))) return 1;
    const int integer = n->flags & GB_NUM_INTEGER;
    const int nines = integer ? 0 : NUM_FRAC_MAX;
    switch (phase) {
    case N_MINUS:
        return num_overlap(n, 1, 0.0, num_text_value(0, pow10u(NUM_INT_MAX) - 1, 0, 0, nines));
    case N_ZERO:
        return num_overlap(n, neg, 0.0, num_text_value(0, 0, 0, 0, nines));
    case N_INT:
        for (int k = 0; nd + k <= NUM_INT_MAX; k++) {
            uint64_t p = I * pow10u(k), q = p + pow10u(k) - 1;
            if (num_overlap(n, neg, (double)p, num_text_value(0, q, 0, 0, nines))) return 1;
        }
        return 0;
    default: /* N_DOT, N_FRAC */
        return num_overlap(n, neg, num_text_value(0, I, fd, F, 0),
                           num_text_value(0, I, fd, F, NUM_FRAC_MAX - fd));
    }
}

/* Whether the number is complete here and its value within the bounds. */
static int num_ends(const struct gnode *n, const struct gframe *f)
{
    int phase = f->phase;
    if (phase != N_ZERO && phase != N_INT && phase != N_FRAC && phase != N_EXP) return 0;
    if (!(n->flags & (GB_NUM_LO | GB_NUM_HI))) return 1;
    int fd = (int)(f->a >> 8 & 0xFF);
    return num_in_bounds(n, num_text_value(f->ws, f->b, phase == N_FRAC ? fd : 0, f->c, 0));
}

/* Bytes of the shortest number within the bounds, or GCOST_INF. */
uint32_t gnum_min_len(const struct gnode *n)
{
    const int integer = n->flags & GB_NUM_INTEGER;
    const double big = (double)pow10u(NUM_INT_MAX) - 1;
    double lo = n->flags & GB_NUM_LO ? n->lo : -big, hi = n->flags & GB_NUM_HI ? n->hi : big;
    /* integers first: they are the shortest texts */
    double ilo = ceil(lo), ihi = floor(hi);
    if ((n->flags & GB_NUM_LO_EXCL) && ilo == lo) ilo += 1;
    if ((n->flags & GB_NUM_HI_EXCL) && ihi == hi) ihi -= 1;
    if (ilo < -big) ilo = -big;
    if (ihi > big) ihi = big;
    if (ilo <= ihi) {
        double v = ilo > 0 ? ilo : ihi < 0 ? ihi : 0;
        char buf[48];
        return (uint32_t)snprintf(buf, sizeof buf, "%.0f", v);
    }
    if (integer) return GCOST_INF;
    for (int fd = 1; fd <= NUM_FRAC_MAX; fd++) {
        double s = (double)pow10u(fd);
        double cand[2] = {ceil(lo * s) / s, floor(hi * s) / s};
        for (int k = 0; k < 2; k++) {
            char buf[64];
            int len = snprintf(buf, sizeof buf, "%.*f", fd, cand[k]);
            if (len > 0 && num_in_bounds(n, strtod(buf, NULL)) && fabs(cand[k]) <= big) return (uint32_t)len;
        }
    }
    return GCOST_INF;
}

/* ---- the recogniser --------------------------------------------------------------------------------------
 */

enum { O_OPEN, O_FIRST, O_KEY, O_COLON, O_VALUE, O_AFTER, O_NEXT };
enum { A_OPEN, A_FIRST, A_AFTER, A_NEXT };
enum { S_OPEN, S_CONTENT, S_ESC, S_HEX, S_UTF8 };
#define FREE_KEY UINT64_MAX

enum { ACT_REJECT, ACT_CONSUME, ACT_DONE, ACT_PASS, ACT_PUSH };

struct thr {
    int depth;
    struct gframe f[GRAMMAR_MAX_DEPTH];
};

/* One whitespace byte in a gap of at most max bytes (*w so far). The usual policy is JSON as models and
 * json.dumps write it: an optional newline first, then spaces and tabs; any_ws lifts it (any of the four
 * whitespace bytes anywhere). */
static int gap_ws(const struct grammar *g, int max, uint8_t *w, int c)
{
    if (*w >= max) return 0;
    if (!g->any_ws && (c == '\r' || (c == '\n' && *w != 0))) return 0;
    (*w)++;
    return 1;
}

static int push(struct thr *t, int node)
{
    if (t->depth >= GRAMMAR_MAX_DEPTH) return -1;
    t->f[t->depth++] = (struct gframe){(uint16_t)node, 0, 0, 0, 0, 0};
    return 0;
}

/* Properties that may come next in an object: from index `from` up to and including the first required. */
static uint64_t key_candidates(const struct grammar *g, const struct gnode *n, uint32_t from)
{
    uint64_t m = 0;
    for (int i = (int)from; i < n->b; i++) {
        const struct gprop *p = &g->props[n->a + i];
        if (p->enabled) m |= 1ull << i;
        if (p->required) break;
    }
    return m;
}

static int required_left(const struct grammar *g, const struct gnode *n, uint32_t from)
{
    for (int i = (int)from; i < n->b; i++)
        if (g->props[n->a + i].required) return 1;
    return 0;
}

static int array_item(const struct grammar *g, const struct gnode *n, uint32_t i)
{
    return (int)i < n->c ? g->kids[n->b + i] : n->a;
}

static int dfa_step(const struct grammar *g, const struct gnode *n, struct gframe *f, int byte)
{
    if (n->a < 0) return 0;
    const struct regex_dfa *d = g->dfas[n->a];
    uint16_t s = d->next[(size_t)(f->b & 0xFFFF) * 256 + (unsigned)byte];
    if (s == REGEX_DEAD || d->wdist[s] == REGEX_UNBOUNDED) return -1; /* the rest could not be written */
    f->b = s;
    return 0;
}

static int hexv(int c)
{
    return c >= '0' && c <= '9'   ? c - '0'
           : c >= 'a' && c <= 'f' ? c - 'a' + 10
           : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                  : -1;
}

static int dfa_len_ok(const struct grammar *g, const struct gnode *n, const struct gframe *f);
static int dfa_step(const struct grammar *g, const struct gnode *n, struct gframe *f, int byte);

/* With a pattern: whether some escape (\" \\ \/ \b \f \n \r \t) can follow a backslash here. */
static int escape_possible(const struct grammar *g, const struct gnode *n, const struct gframe *f)
{
    static const char decoded[] = {'"', '\\', '/', 8, 12, 10, 13, 9};
    if (n->a < 0) return 1;
    for (int i = 0; i < 8; i++) {
        struct gframe t = *f;
        if (dfa_step(g, n, &t, decoded[i])) continue;
        t.a++;
        if (dfa_len_ok(g, n, &t)) return 1;
    }
    return 0;
}

static int string_step_raw(const struct grammar *g, const struct gnode *n, struct gframe *f, int c)
{
    const int full = n->max >= 0 && (int)f->a >= n->max;
    switch (f->phase) {
    case S_OPEN:
        if (c != '"') return ACT_REJECT;
        f->phase = S_CONTENT;
        if (n->a >= 0) f->b = (uint64_t)g->dfas[n->a]->start;
        return ACT_CONSUME;
    case S_CONTENT:
        if (c == '"') {
            if ((int)f->a < n->min) return ACT_REJECT;
            if (n->a >= 0 && !g->dfas[n->a]->accept[f->b & 0xFFFF]) return ACT_REJECT;
            return ACT_DONE;
        }
        if (c < 0x20 || full) return ACT_REJECT;
        if (c == '\\') {
            if (!escape_possible(g, n, f)) return ACT_REJECT;
            f->phase = S_ESC;
            return ACT_CONSUME;
        }
        if (c >= 0x80) {
            int need, lo = 0x80, hi = 0xBF;
            if (c >= 0xC2 && c <= 0xDF)
                need = 1;
            else if (c == 0xE0)
                need = 2, lo = 0xA0;
            else if (c == 0xED)
                need = 2, hi = 0x9F;
            else if (c >= 0xE1 && c <= 0xEF)
                need = 2;
            else if (c == 0xF0)
                need = 3, lo = 0x90;
            else if (c >= 0xF1 && c <= 0xF3)
                need = 3;
            else if (c == 0xF4)
                need = 3, hi = 0x8F;
            else
                return ACT_REJECT;
            if (dfa_step(g, n, f, c)) return ACT_REJECT;
            f->phase = S_UTF8;
            f->c = (uint64_t)need | (uint64_t)lo << 8 | (uint64_t)hi << 16;
            f->a++;
            return ACT_CONSUME;
        }
        if (dfa_step(g, n, f, c)) return ACT_REJECT;
        f->a++;
        return ACT_CONSUME;
    case S_UTF8: {
        int lo = (int)(f->c >> 8 & 0xFF), hi = (int)(f->c >> 16 & 0xFF), need = (int)(f->c & 0xFF);
        if (c < lo || c > hi || dfa_step(g, n, f, c)) return ACT_REJECT;
        if (--need == 0) f->phase = S_CONTENT;
        f->c = (uint64_t)need | (uint64_t)0x80 << 8 | (uint64_t)0xBF << 16;
        return ACT_CONSUME;
    }
    case S_ESC: {
        int d;
        switch (c) {
        case '"':
            d = '"';
            break;
        case '\\':
            d = '\\';
            break;
        case '/':
            d = '/';
            break;
        case 'b':
            d = 8;
            break;
        case 'f':
            d = 12;
            break;
        case 'n':
            d = 10;
            break;
        case 'r':
            d = 13;
            break;
        case 't':
            d = 9;
            break;
        case 'u':
            if (n->a >= 0) return ACT_REJECT; /* with a pattern: characters are written as themselves */
            f->phase = S_HEX;
            f->c = 0;
            return ACT_CONSUME;
        default:
            return ACT_REJECT;
        }
        if (dfa_step(g, n, f, d)) return ACT_REJECT;
        f->a++;
        f->phase = S_CONTENT;
        return ACT_CONSUME;
    }
    default: { /* S_HEX: c = value | digits << 16 */
        int h = hexv(c);
        if (h < 0) return ACT_REJECT;
        uint32_t v = (uint32_t)(f->c & 0xFFFF) * 16 + (uint32_t)h;
        int digits = (int)(f->c >> 16) + 1;
        if (digits == 2 && v >= 0xD8 && v <= 0xDF) return ACT_REJECT; /* surrogates: never generated */
        if (digits < 4) {
            f->c = v | (uint64_t)digits << 16;
            return ACT_CONSUME;
        }
        if (n->a >= 0) {
            uint8_t u[4];
            int k = v < 0x80 ? 1 : v < 0x800 ? 2 : 3;
            if (k == 1)
                u[0] = (uint8_t)v;
            else if (k == 2)
                u[0] = (uint8_t)(0xC0 | v >> 6), u[1] = (uint8_t)(0x80 | (v & 0x3F));
            else
                u[0] = (uint8_t)(0xE0 | v >> 12), u[1] = (uint8_t)(0x80 | (v >> 6 & 0x3F)),
                u[2] = (uint8_t)(0x80 | (v & 0x3F));
            for (int i = 0; i < k; i++)
                if (dfa_step(g, n, f, u[i])) return ACT_REJECT;
        }
        f->a++;
        f->phase = S_CONTENT;
        f->c = 0;
        return ACT_CONSUME;
    }
    }
}

/* With a pattern and a length: whether acceptance stays reachable within the length bounds. */
static int dfa_len_ok(const struct grammar *g, const struct gnode *n, const struct gframe *f)
{
    if (n->a < 0) return 1;
    const struct regex_dfa *d = g->dfas[n->a];
    const uint32_t s = (uint32_t)(f->b & 0xFFFF);
    if (n->max >= 0 && f->a + d->cmin[s] > (uint32_t)n->max) return 0;
    if (n->min > 0 && d->cmax[s] != REGEX_UNBOUNDED && f->a + d->cmax[s] < (uint32_t)n->min) return 0;
    return 1;
}

static int string_step(const struct grammar *g, const struct gnode *n, struct gframe *f, int c)
{
    int act = string_step_raw(g, n, f, c);
    if (act == ACT_CONSUME && f->phase != S_ESC && f->phase != S_HEX && !dfa_len_ok(g, n, f))
        return ACT_REJECT;
    return act;
}

static int number_step(const struct gnode *n, struct gframe *f, int c)
{
    const int bounded = (n->flags & (GB_NUM_LO | GB_NUM_HI)) != 0, integer = n->flags & GB_NUM_INTEGER;
    const int int_max = bounded ? NUM_INT_MAX : NUM_FREE_MAX,
              frac_max = bounded ? NUM_FRAC_MAX : NUM_FREE_MAX;
    int nd = (int)(f->a & 0xFF), fd = (int)(f->a >> 8 & 0xFF), ed = (int)(f->a >> 16 & 0xFF);
    const int digit = c >= '0' && c <= '9';
    struct gframe nf = *f;
    switch (f->phase) {
    case N_START:
        if (c == '-') {
            nf.phase = N_MINUS, nf.ws = 1;
            break;
        }
        /* fall through */
    case N_MINUS:
        if (!digit) return ACT_REJECT;
        nf.phase = c == '0' ? N_ZERO : N_INT;
        nf.b = (uint64_t)(c - '0');
        nd = 1;
        break;
    case N_ZERO:
    case N_INT:
        if (digit && f->phase == N_INT && nd < int_max) {
            nf.b = f->b * 10 + (uint64_t)(c - '0');
            nd++;
            break;
        }
        if (c == '.' && !integer) {
            nf.phase = N_DOT;
            break;
        }
        if ((c == 'e' || c == 'E') && !integer && !bounded) {
            nf.phase = N_E;
            break;
        }
        return num_ends(n, f) ? ACT_PASS : ACT_REJECT;
    case N_DOT:
    case N_FRAC:
        if (digit && fd < frac_max) {
            nf.phase = N_FRAC;
            nf.c = f->c * 10 + (uint64_t)(c - '0');
            fd++;
            break;
        }
        if (f->phase == N_DOT) return ACT_REJECT;
        if ((c == 'e' || c == 'E') && !bounded) {
            nf.phase = N_E;
            break;
        }
        return num_ends(n, f) ? ACT_PASS : ACT_REJECT;
    case N_E:
        if (c == '+' || c == '-') {
            nf.phase = N_ESIGN;
            break;
        }
        /* fall through */
    case N_ESIGN:
        if (!digit) return ACT_REJECT;
        nf.phase = N_EXP;
        ed = 1;
        break;
    default: /* N_EXP */
        if (digit && ed < NUM_EXP_MAX) {
            ed++;
            break;
        }
        return ACT_PASS;
    }
    nf.a = (uint32_t)nd | (uint32_t)fd << 8 | (uint32_t)ed << 16;
    if (bounded && nf.phase != N_START && !num_feasible(n, nf.ws, nf.phase, nd, nf.b, fd, nf.c))
        return ACT_REJECT;
    *f = nf;
    return ACT_CONSUME;
}

static int object_step(const struct grammar *g, const struct gnode *n, struct thr *t, int c)
{
    struct gframe *f = &t->f[t->depth - 1];
    const int free_keys = n->b == 0 && n->c >= 0;
    switch (f->phase) {
    case O_OPEN:
        if (c != '{') return ACT_REJECT;
        f->phase = O_FIRST;
        return ACT_CONSUME;
    case O_FIRST:
    case O_NEXT:
        if (is_ws(c)) return gap_ws(g, n->ws, &f->ws, c) ? ACT_CONSUME : ACT_REJECT;
        if (c == '}' && f->phase == O_FIRST) return required_left(g, n, f->a) ? ACT_REJECT : ACT_DONE;
        if (c != '"') return ACT_REJECT;
        f->ws = 0;
        if (free_keys) {
            f->phase = O_COLON;
            f->b = FREE_KEY;
            return push(t, g->free_string) ? ACT_REJECT : ACT_PUSH;
        }
        f->b = key_candidates(g, n, f->a);
        if (!f->b) return ACT_REJECT;
        f->c = 1; /* every key literal starts with its quote */
        f->phase = O_KEY;
        return ACT_CONSUME;
    case O_KEY: {
        const uint32_t pos = (uint32_t)f->c;
        uint64_t m = 0;
        int done = -1;
        for (uint64_t r = f->b; r; r &= r - 1) {
            int k = __builtin_ctzll(r);
            const struct gprop *p = &g->props[n->a + k];
            if ((int)pos < p->key_len && (unsigned char)g->bytes[p->key_off + pos] == c) {
                m |= 1ull << k;
                if ((int)pos + 1 == p->key_len) done = k;
            }
        }
        if (!m) return ACT_REJECT;
        if (done >= 0) {
            f->phase = O_COLON;
            f->a = (uint32_t)done + 1;
            f->b = (uint64_t)done;
            f->c = 0;
        } else {
            f->b = m;
            f->c = pos + 1;
        }
        return ACT_CONSUME;
    }
    case O_COLON:
        if (is_ws(c)) return gap_ws(g, n->ws, &f->ws, c) ? ACT_CONSUME : ACT_REJECT;
        if (c != ':') return ACT_REJECT;
        f->phase = O_VALUE;
        f->ws = 0;
        return ACT_CONSUME;
    case O_VALUE: {
        if (is_ws(c)) return gap_ws(g, n->ws, &f->ws, c) ? ACT_CONSUME : ACT_REJECT;
        int v = f->b == FREE_KEY ? n->c : g->props[n->a + f->b].value;
        f->phase = O_AFTER;
        f->ws = 0;
        return push(t, v) ? ACT_REJECT : ACT_PUSH;
    }
    default: /* O_AFTER */
        if (is_ws(c)) return gap_ws(g, n->ws, &f->ws, c) ? ACT_CONSUME : ACT_REJECT;
        if (c == ',') {
            if (!free_keys && !key_candidates(g, n, f->a)) return ACT_REJECT;
            f->phase = O_NEXT;
            f->ws = 0;
            return ACT_CONSUME;
        }
        if (c == '}') return free_keys || !required_left(g, n, f->a) ? ACT_DONE : ACT_REJECT;
        return ACT_REJECT;
    }
}

static int array_step(const struct grammar *g, const struct gnode *n, struct thr *t, int c)
{
    struct gframe *f = &t->f[t->depth - 1];
    switch (f->phase) {
    case A_OPEN:
        if (c != '[') return ACT_REJECT;
        f->phase = A_FIRST;
        return ACT_CONSUME;
    case A_FIRST:
    case A_NEXT:
        if (is_ws(c)) return gap_ws(g, n->ws, &f->ws, c) ? ACT_CONSUME : ACT_REJECT;
        if (c == ']' && f->phase == A_FIRST) return n->min == 0 ? ACT_DONE : ACT_REJECT;
        if (n->max >= 0 && (int)f->a >= n->max) return ACT_REJECT;
        {
            int item = array_item(g, n, f->a);
            if (item < 0) return ACT_REJECT;
            f->a++;
            f->phase = A_AFTER;
            f->ws = 0;
            return push(t, item) ? ACT_REJECT : ACT_PUSH;
        }
    default: /* A_AFTER */
        if (is_ws(c)) return gap_ws(g, n->ws, &f->ws, c) ? ACT_CONSUME : ACT_REJECT;
        if (c == ',') {
            if (n->max >= 0 && (int)f->a >= n->max) return ACT_REJECT;
            f->phase = A_NEXT;
            f->ws = 0;
            return ACT_CONSUME;
        }
        if (c == ']') return (int)f->a >= n->min ? ACT_DONE : ACT_REJECT;
        return ACT_REJECT;
    }
}

/* Literal sets: f->a = bytes matched, f->b = lo | hi << 32 (the range of members still possible). */
static int litset_step(const struct grammar *g, const struct gnode *n, struct thr *t, int c)
{
    struct gframe *f = &t->f[t->depth - 1];
    const uint32_t pos = f->a;
    int lo = (int)(f->b & 0xFFFFFFFF), hi = (int)(f->b >> 32);
    if (pos == 0 && f->b == 0) hi = n->b - 1;
    int nlo = -1, nhi = -1;
    for (int k = lo; k <= hi; k++) {
        const struct glit *l = &g->lits[n->a + k];
        if ((int)pos < l->len && (unsigned char)g->bytes[l->off + pos] == c) {
            if (nlo < 0) nlo = k;
            nhi = k;
        } else if (nlo >= 0) {
            break;
        }
    }
    if (nlo < 0) {
        const struct glit *l = &g->lits[n->a + lo];
        if (lo > hi || l->len != (int)pos) return ACT_REJECT;
        if (l->cont < 0) return ACT_PASS;
        *f = (struct gframe){(uint16_t)l->cont, 0, 0, 0, 0, 0};
        return ACT_PUSH; /* replaced: the continuation sees the byte */
    }
    f->a = pos + 1;
    f->b = (uint64_t)(uint32_t)nlo | (uint64_t)(uint32_t)nhi << 32;
    const struct glit *l = &g->lits[n->a + nlo];
    if (nlo == nhi && l->len == (int)pos + 1) {
        if (l->cont < 0) return ACT_DONE;
        *f = (struct gframe){(uint16_t)l->cont, 0, 0, 0, 0, 0};
    }
    return ACT_CONSUME;
}

/* A finished child's parent moves on; returns 1 when the parent is now finished too. */
static int child_done(const struct grammar *g, struct gframe *p)
{
    const struct gnode *n = &g->nodes[p->node];
    if (n->kind == GK_SEQ) return (int)p->a >= n->b;
    if (n->kind == GK_REP) return n->max >= 0 && (int)p->a >= n->max;
    return 0;
}

struct emit {
    const struct grammar *g;
    struct gstate *out;
    int frames; /* frames already in out */
    int forks;  /* alternative expansions left for this byte (FORK_BUDGET) */
};

/* Frames still needed above index i by the frame there (its own included), along the path needing fewest. */
static uint32_t frame_height(const struct grammar *g, const struct gframe *f)
{
    const struct gnode *n = &g->nodes[f->node];
    uint32_t h = 0;
    switch (n->kind) {
    case GK_SEQ:
        for (int i = (int)f->a; i < n->b; i++)
            if (g->nodes[g->kids[n->a + i]].height > h) h = g->nodes[g->kids[n->a + i]].height;
        return 1 + h;
    case GK_REP:
        return (int)f->a < n->min ? 1 + (uint32_t)g->nodes[n->a].height : 1;
    case GK_LITSET: {
        int lo = (int)(f->b & 0xFFFFFFFF), hi = f->a == 0 && f->b == 0 ? n->b - 1 : (int)(f->b >> 32);
        h = GHEIGHT_INF;
        for (int k = lo; k <= hi; k++) {
            const struct glit *l = &g->lits[n->a + k];
            uint32_t c = l->cont >= 0 ? g->nodes[l->cont].height : 1;
            if (c < h) h = c;
        }
        return h;
    }
    default:
        return n->height; /* objects and arrays: all their required parts (no fewer remain) */
    }
}

int gthread_fits(const struct grammar *g, const struct gframe *f, int depth)
{
    for (int i = 0; i < depth; i++)
        if ((uint32_t)i + frame_height(g, &f[i]) > GRAMMAR_MAX_DEPTH) return 0;
    return 1;
}

static void emit(struct emit *o, const struct thr *t)
{
    if (!gthread_fits(o->g, t->f, t->depth)) return; /* it could not finish within the frames a state has */
    struct gstate *s = o->out;
    int at = 0;
    for (int i = 0; i < s->n; i++) {
        if (s->depth[i] == t->depth && !memcmp(&s->f[at], t->f, (size_t)t->depth * sizeof *t->f)) return;
        at += s->depth[i];
    }
    if (s->n >= GRAMMAR_MAX_THREADS) return; /* dropped: the others still describe valid outputs */
    memcpy(&s->f[o->frames], t->f, (size_t)t->depth * sizeof *t->f);
    s->depth[s->n++] = (uint16_t)t->depth;
    o->frames += t->depth;
}

/* Pops the top frame as finished, and every parent that finishes with it. */
static void pop_done(const struct grammar *g, struct thr *t)
{
    while (t->depth > 0) {
        t->depth--;
        if (t->depth == 0 || !child_done(g, &t->f[t->depth - 1])) return;
    }
}

static void step(const struct grammar *g, struct thr *t, int c, struct emit *o, int forks)
{
    for (;;) {
        if (t->depth == 0) return; /* complete: nothing more is accepted */
        struct gframe *f = &t->f[t->depth - 1];
        const struct gnode *n = &g->nodes[f->node];
        int act;
        switch (n->kind) {
        case GK_LIT:
            if ((int)f->a >= n->b) {
                act = ACT_PASS;
            } else if ((unsigned char)g->bytes[n->a + f->a] == c) {
                f->a++;
                act = (int)f->a == n->b ? ACT_DONE : ACT_CONSUME;
            } else {
                act = ACT_REJECT;
            }
            break;
        case GK_SEQ:
            if ((int)f->a >= n->b) {
                act = ACT_PASS;
            } else {
                int kid = g->kids[n->a + f->a];
                f->a++;
                act = push(t, kid) ? ACT_REJECT : ACT_PUSH;
            }
            break;
        case GK_ALT: {
            if (forks > MAX_FORKS) return;
            t->depth--; /* the alternative takes the place of the choice */
            int last = -1;
            for (int i = 0; i < n->b; i++) {
                int k = g->kids[n->a + i];
                const struct gnode *x = &g->nodes[k];
                if (x->cost >= GCOST_INF || (!bit(x->first, c) && !x->nullable)) continue;
                if (last >= 0 && o->forks > 0) {
                    o->forks--;
                    struct thr u;
                    u.depth = t->depth;
                    memcpy(u.f, t->f, (size_t)t->depth * sizeof *t->f);
                    if (!push(&u, last)) step(g, &u, c, o, forks + 1);
                }
                last = k;
            }
            if (last < 0 || push(t, last)) return;
            forks++;
            continue;
        }
        case GK_REP: {
            const struct gnode *x = &g->nodes[n->a];
            int more = (n->max < 0 || (int)f->a < n->max) && x->cost < GCOST_INF && bit(x->first, c);
            /* an element that matches the empty string fills the remaining minimum with empty matches */
            int end = (int)f->a >= n->min || x->nullable;
            if (more && end && forks <= MAX_FORKS && o->forks > 0) {
                o->forks--;
                struct thr u;
                u.depth = t->depth;
                memcpy(u.f, t->f, (size_t)t->depth * sizeof *t->f);
                u.f[u.depth - 1].a++;
                if (!push(&u, n->a)) step(g, &u, c, o, forks + 1);
                act = ACT_PASS;
            } else if (more) {
                f->a++;
                act = push(t, n->a) ? ACT_REJECT : ACT_PUSH;
            } else {
                act = end ? ACT_PASS : ACT_REJECT;
            }
            break;
        }
        case GK_WS: {
            uint8_t w = (uint8_t)(f->a > 255 ? 255 : f->a);
            if (is_ws(c) && gap_ws(g, n->max, &w, c)) {
                f->a = w;
                act = ACT_CONSUME;
            } else {
                act = ACT_PASS;
            }
            break;
        }
        case GK_STRING:
            act = string_step(g, n, f, c);
            break;
        case GK_NUMBER:
            act = number_step(n, f, c);
            break;
        case GK_OBJECT:
            act = object_step(g, n, t, c);
            break;
        case GK_ARRAY:
            act = array_step(g, n, t, c);
            break;
        default:
            act = litset_step(g, n, t, c);
            break;
        }
        switch (act) {
        case ACT_REJECT:
            return;
        case ACT_CONSUME:
            emit(o, t);
            return;
        case ACT_DONE:
            pop_done(g, t);
            emit(o, t);
            return;
        case ACT_PASS:
            pop_done(g, t);
            continue;
        default:
            continue; /* ACT_PUSH */
        }
    }
}

int gstate_step(const struct grammar *g, const struct gstate *in, int c, struct gstate *out)
{
    struct emit o = {g, out, 0, FORK_BUDGET};
    out->n = 0;
    struct thr t;
    int at = 0;
    for (int i = 0; i < in->n; i++) {
        t.depth = in->depth[i];
        memcpy(t.f, &in->f[at], (size_t)t.depth * sizeof *t.f);
        at += t.depth;
        step(g, &t, c, &o, 0);
    }
    return out->n;
}

/* ---- costs ---- */

static uint32_t object_cost(const struct grammar *g, const struct gnode *n, const struct gframe *f)
{
    /* remaining required properties after index `from`: a comma, key, colon and value each */
    uint32_t after_req = 0;
    int n_req = 0;
    uint32_t from = f->a;
    if (f->phase == O_KEY) {
        /* the best candidate still possible */
        uint32_t best = GCOST_INF;
        for (uint64_t r = f->b; r; r &= r - 1) {
            int k = __builtin_ctzll(r);
            const struct gprop *p = &g->props[n->a + k];
            uint32_t s = cadd((uint32_t)(p->key_len - (int)f->c) + 1, g->nodes[p->value].cost);
            for (int i = k + 1; i < n->b; i++) {
                const struct gprop *q = &g->props[n->a + i];
                if (q->required) s = cadd(s, cadd((uint32_t)q->key_len + 2, g->nodes[q->value].cost));
            }
            if (s < best) best = s;
        }
        return cadd(best, 1);
    }
    for (int i = (int)from; i < n->b; i++) {
        const struct gprop *p = &g->props[n->a + i];
        if (!p->required) continue;
        after_req = cadd(after_req, cadd((uint32_t)p->key_len + 2, g->nodes[p->value].cost));
        n_req++;
    }
    switch (f->phase) {
    case O_OPEN:
        return n->cost;
    case O_FIRST:
        return cadd(after_req, 1) - (n_req ? 1 : 0);
    case O_NEXT:
        if (n_req) return cadd(after_req, 0); /* the comma is behind us, the closing brace ahead */
        {
            uint32_t best = GCOST_INF;
            if (n->c >= 0 && n->b == 0) best = cadd(3, g->nodes[n->c].cost);
            for (int i = (int)from; i < n->b; i++) {
                const struct gprop *p = &g->props[n->a + i];
                if (p->enabled) {
                    uint32_t s = cadd((uint32_t)p->key_len + 1, g->nodes[p->value].cost);
                    if (s < best) best = s;
                }
            }
            return cadd(best, 1);
        }
    case O_COLON:
    case O_VALUE: {
        uint32_t v = f->b == FREE_KEY ? g->nodes[n->c].cost : g->nodes[g->props[n->a + f->b].value].cost;
        return cadd(cadd(v, f->phase == O_COLON ? 1 : 0), cadd(after_req, 1));
    }
    default:
        return cadd(after_req, 1); /* O_AFTER */
    }
}

static uint32_t frame_cost(const struct grammar *g, const struct gframe *f)
{
    const struct gnode *n = &g->nodes[f->node];
    switch (n->kind) {
    case GK_LIT:
        return (uint32_t)(n->b - (int)f->a);
    case GK_SEQ: {
        uint32_t s = 0;
        for (int i = (int)f->a; i < n->b; i++) s = cadd(s, g->nodes[g->kids[n->a + i]].cost);
        return s;
    }
    case GK_ALT:
        return n->cost;
    case GK_REP:
        return (int)f->a >= n->min ? 0 : cmul(g->nodes[n->a].cost, (uint32_t)(n->min - (int)f->a));
    case GK_WS:
        return 0;
    case GK_STRING: {
        uint32_t rest = n->a >= 0 ? g->dfas[n->a]->wdist[f->b & 0xFFFF]
                                  : (uint32_t)((int)f->a < n->min ? n->min - (int)f->a : 0);
        switch (f->phase) {
        case S_OPEN:
            return n->cost;
        case S_CONTENT:
            return cadd(rest, 1);
        case S_ESC:
            if (n->a >= 0) { /* the cheapest escape that keeps the pattern possible */
                static const char decoded[] = {'"', '\\', '/', 8, 12, 10, 13, 9};
                uint32_t best = GCOST_INF;
                for (int i = 0; i < 8; i++) {
                    struct gframe t = *f;
                    if (!dfa_step(g, n, &t, decoded[i]))
                        best = best < g->dfas[n->a]->wdist[t.b & 0xFFFF] ? best
                                                                         : g->dfas[n->a]->wdist[t.b & 0xFFFF];
                }
                return cadd(best, 2);
            }
            return cadd(rest ? rest - 1 : 0, 2);
        case S_HEX:
            return cadd(rest ? rest - 1 : 0, (uint32_t)(5 - (int)(f->c >> 16)));
        default:
            return n->a >= 0 ? cadd(rest, 1) : cadd(rest ? rest - 1 : 0, (uint32_t)(f->c & 0xFF) + 1);
        }
    }
    case GK_NUMBER:
        if (f->phase == N_START) return n->cost;
        return num_ends(n, f) ? 0 : 1;
    case GK_OBJECT:
        return object_cost(g, n, f);
    case GK_ARRAY: {
        if (f->phase == A_OPEN) return n->cost;
        uint32_t s = 1;
        for (int i = (int)f->a; i < n->min; i++) {
            int item = array_item(g, n, (uint32_t)i);
            s = cadd(s, cadd(item < 0 ? GCOST_INF : g->nodes[item].cost, 1));
        }
        if (f->phase == A_NEXT && (int)f->a >= n->min) {
            int item = array_item(g, n, f->a);
            s = cadd(s, item < 0 ? GCOST_INF : g->nodes[item].cost);
        }
        if ((f->phase == A_FIRST || f->phase == A_NEXT) && (int)f->a < n->min) s -= 1;
        return s;
    }
    default: { /* GK_LITSET */
        int lo = (int)(f->b & 0xFFFFFFFF), hi = f->a == 0 && f->b == 0 ? n->b - 1 : (int)(f->b >> 32);
        uint32_t m = GCOST_INF;
        for (int k = lo; k <= hi; k++) {
            const struct glit *l = &g->lits[n->a + k];
            uint32_t c = cadd((uint32_t)(l->len - (int)f->a), l->cont >= 0 ? g->nodes[l->cont].cost : 0);
            if (c < m) m = c;
        }
        return m;
    }
    }
}

uint32_t gstate_cost(const struct grammar *g, const struct gstate *st)
{
    uint32_t best = GCOST_INF;
    int at = 0;
    for (int i = 0; i < st->n; i++) {
        uint32_t s = 0;
        for (int k = 0; k < st->depth[i] && s < best; k++) s = cadd(s, frame_cost(g, &st->f[at + k]));
        if (s < best) best = s;
        at += st->depth[i];
    }
    return best;
}

int gstate_plain_string(const struct grammar *g, const struct gstate *st, int *room)
{
    if (st->n != 1 || st->depth[0] == 0) return 0;
    const struct gframe *f = &st->f[st->depth[0] - 1];
    const struct gnode *n = &g->nodes[f->node];
    if (n->kind != GK_STRING || f->phase != S_CONTENT || n->a >= 0) return 0;
    *room = n->max < 0 ? -1 : n->max - (int)f->a;
    return 1;
}

/* ---- public state API ---- */

struct gstate *grammar_state_new(const struct grammar *g)
{
    struct gstate *st = malloc(sizeof *st);
    if (!st) return NULL;
    st->n = 1;
    st->depth[0] = 1;
    st->f[0] = (struct gframe){(uint16_t)g->root, 0, 0, 0, 0, 0};
    return st;
}

void grammar_state_free(struct gstate *st)
{
    free(st);
}

void grammar_state_copy(struct gstate *dst, const struct gstate *src)
{
    memcpy(dst, src, gstate_size(gstate_frames(src)));
}

int grammar_state_feed(const struct grammar *g, struct gstate *st, const char *s, size_t n)
{
    if (n == 0) return 0;
    struct gstate *a = malloc(sizeof *a), *b = malloc(sizeof *b);
    int rc = -1;
    if (!a || !b) goto out;
    grammar_state_copy(a, st);
    for (size_t i = 0; i < n; i++) {
        if (!gstate_step(g, a, (unsigned char)s[i], b)) goto out;
        struct gstate *t = a;
        a = b;
        b = t;
    }
    grammar_state_copy(st, a);
    rc = 0;
out:
    free(a);
    free(b);
    return rc;
}

uint32_t grammar_state_cost(const struct grammar *g, const struct gstate *st)
{
    return gstate_cost(g, st);
}

int grammar_state_accepting(const struct grammar *g, const struct gstate *st)
{
    return gstate_cost(g, st) == 0;
}

int grammar_state_finished(const struct grammar *g, const struct gstate *st)
{
    (void)g;
    for (int i = 0; i < st->n; i++)
        if (st->depth[i]) return 0;
    return 1;
}
