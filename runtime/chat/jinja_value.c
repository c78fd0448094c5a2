/* jinja_value — the arena and the value model of the chat-template interpreter.
 *
 * Every allocation of a render comes from one arena with a byte limit; jfail() unwinds to the caller,
 * which frees the arena in one sweep. Values mirror the Python objects Jinja2 sees (None, bool, int,
 * float, str, list/tuple, dict, namespace) and format themselves as Python's str(), repr() and
 * json.dumps(ensure_ascii=False) would, because chat templates print them that way.
 */
#include "runtime/chat/jinja.h"

#include "kernels/core/status.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- arena ---------------------------------------------------------------------------------------- */

struct jarena_block {
    struct jarena_block *next;
    size_t cap, used;
    _Alignas(16) unsigned char data[];
};

void jfail(struct jctx *c, int status, size_t off, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(c->err, sizeof c->err, fmt, ap);
    va_end(ap);
    if (off != JNO_OFF && n >= 0 && (size_t)n < sizeof c->err)
        snprintf(c->err + n, sizeof c->err - (size_t)n, " (at byte %zu)", off);
    c->status = status;
    longjmp(c->fail, 1);
}

void jcharge(struct jctx *c, uint64_t steps)
{
    if (steps > (uint64_t)INT64_MAX - (uint64_t)c->steps || c->steps + (int64_t)steps > c->max_steps)
        jfail(c, FERRY_ERR_RANGE, JNO_OFF, "template exceeded %lld evaluation steps",
              (long long)c->max_steps);
    c->steps += (int64_t)steps;
}

uint64_t jv_cost(struct jv v)
{
    switch (v.type) {
    case JV_STR:
        return 1 + v.s.n / 256;
    case JV_LIST:
        return 1 + v.l->n;
    case JV_DICT:
    case JV_NS:
        return 1 + v.d->n;
    default:
        return 1;
    }
}

void *jalloc(struct jctx *c, size_t n)
{
    struct jarena *a = &c->arena;
    jcharge(c, n / 256);
    n = (n + 15) & ~(size_t)15;
    if (n == 0) n = 16;
    if (n > a->limit || a->used > a->limit - n)
        jfail(c, FERRY_ERR_RANGE, JNO_OFF, "template needs more than %zu bytes of memory", a->limit);
    struct jarena_block *b = a->head;
    if (!b || b->cap - b->used < n) {
        size_t cap = n > 65536 ? n : 65536;
        b = malloc(sizeof *b + cap);
        if (!b) jfail(c, FERRY_ERR_NOMEM, JNO_OFF, "out of memory");
        b->cap = cap;
        b->used = 0;
        b->next = a->head;
        a->head = b;
    }
    void *p = b->data + b->used;
    b->used += n;
    a->used += n;
    return p;
}

void jarena_free(struct jarena *a)
{
    struct jarena_block *b = a->head;
    while (b) {
        struct jarena_block *next = b->next;
        free(b);
        b = next;
    }
    a->head = NULL;
    a->used = 0;
}

char *jstrdup(struct jctx *c, const char *p, size_t n)
{
    char *s = jalloc(c, n + 1);
    if (n) memcpy(s, p, n);
    s[n] = 0;
    return s;
}

/* ---- constructors and containers ------------------------------------------------------------------ */

struct jv jv_undef(const char *name, size_t n)
{
    return (struct jv){.type = JV_UNDEF, .s = {name, n}};
}
struct jv jv_none(void)
{
    return (struct jv){.type = JV_NONE};
}
struct jv jv_bool(int b)
{
    return (struct jv){.type = JV_BOOL, .i = b != 0};
}
struct jv jv_int(int64_t i)
{
    return (struct jv){.type = JV_INT, .i = i};
}
struct jv jv_float(double f)
{
    return (struct jv){.type = JV_FLOAT, .f = f};
}
struct jv jv_str(const char *p, size_t n)
{
    return (struct jv){.type = JV_STR, .s = {p ? p : "", n}};
}
struct jv jv_cstr(const char *s)
{
    return jv_str(s, strlen(s));
}

struct jv jv_list(struct jctx *c, size_t cap)
{
    struct jlist *l = jalloc(c, sizeof *l);
    *l = (struct jlist){0};
    if (cap) {
        l->v = jalloc(c, cap * sizeof *l->v);
        l->cap = cap;
    }
    return (struct jv){.type = JV_LIST, .l = l};
}

struct jv jv_dict(struct jctx *c, size_t cap)
{
    struct jdict *d = jalloc(c, sizeof *d);
    *d = (struct jdict){0};
    if (cap) {
        d->k = jalloc(c, cap * sizeof *d->k);
        d->v = jalloc(c, cap * sizeof *d->v);
        d->cap = cap;
    }
    return (struct jv){.type = JV_DICT, .d = d};
}

void jlist_push(struct jctx *c, struct jlist *l, struct jv v)
{
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 4;
        struct jv *nv = jalloc(c, cap * sizeof *nv);
        if (l->n) memcpy(nv, l->v, l->n * sizeof *nv);
        l->v = nv;
        l->cap = cap;
    }
    l->v[l->n++] = v;
}

struct jv *jdict_get(const struct jdict *d, struct jv k)
{
    for (size_t i = 0; i < d->n; i++)
        if (jv_equal(d->k[i], k)) return &d->v[i];
    return NULL;
}

struct jv *jdict_gets(const struct jdict *d, const char *k, size_t n)
{
    for (size_t i = 0; i < d->n; i++)
        if (d->k[i].type == JV_STR && d->k[i].s.n == n && memcmp(d->k[i].s.p, k, n) == 0) return &d->v[i];
    return NULL;
}

void jdict_set(struct jctx *c, struct jdict *d, struct jv k, struct jv v)
{
    struct jv *slot = jdict_get(d, k);
    if (slot) {
        *slot = v;
        return;
    }
    if (d->n == d->cap) {
        size_t cap = d->cap ? d->cap * 2 : 4;
        struct jv *nk = jalloc(c, cap * sizeof *nk), *nv = jalloc(c, cap * sizeof *nv);
        if (d->n) {
            memcpy(nk, d->k, d->n * sizeof *nk);
            memcpy(nv, d->v, d->n * sizeof *nv);
        }
        d->k = nk;
        d->v = nv;
        d->cap = cap;
    }
    d->k[d->n] = k;
    d->v[d->n] = v;
    d->n++;
}

/* ---- Python semantics ----------------------------------------------------------------------------- */

int jv_truthy(struct jv v)
{
    switch (v.type) {
    case JV_UNDEF:
    case JV_NONE:
        return 0;
    case JV_BOOL:
    case JV_INT:
        return v.i != 0;
    case JV_FLOAT:
        return v.f != 0.0;
    case JV_STR:
        return v.s.n != 0;
    case JV_LIST:
        return v.l->gen || v.l->n != 0;
    case JV_DICT:
        return v.d->n != 0;
    default:
        return 1;
    }
}

static int is_num(struct jv v)
{
    return v.type == JV_INT || v.type == JV_BOOL || v.type == JV_FLOAT;
}

int jv_equal(struct jv a, struct jv b)
{
    if (is_num(a) && is_num(b)) {
        if (a.type != JV_FLOAT && b.type != JV_FLOAT) return a.i == b.i;
        double x = a.type == JV_FLOAT ? a.f : (double)a.i, y = b.type == JV_FLOAT ? b.f : (double)b.i;
        return x == y;
    }
    if (a.type != b.type) return 0;
    switch (a.type) {
    case JV_UNDEF:
    case JV_NONE:
        return 1;
    case JV_STR:
        return a.s.n == b.s.n && memcmp(a.s.p, b.s.p, a.s.n) == 0;
    case JV_LIST:
        if (a.l->gen || b.l->gen) return a.l == b.l;
        if (a.l->n != b.l->n) return 0;
        for (size_t i = 0; i < a.l->n; i++)
            if (!jv_equal(a.l->v[i], b.l->v[i])) return 0;
        return 1;
    case JV_DICT:
        if (a.d->n != b.d->n) return 0;
        for (size_t i = 0; i < a.d->n; i++) {
            struct jv *o = jdict_get(b.d, a.d->k[i]);
            if (!o || !jv_equal(a.d->v[i], *o)) return 0;
        }
        return 1;
    case JV_NS:
        return a.d == b.d;
    case JV_FUNC:
        return a.i == b.i;
    case JV_MACRO:
        return a.m == b.m;
    case JV_LOOP:
        return a.loop == b.loop;
    }
    return 0;
}

const char *jv_type_name(struct jv v)
{
    static const char *names[] = {"undefined", "NoneType", "bool",      "int",      "float", "str",
                                  "list",      "dict",     "Namespace", "function", "Macro", "LoopContext"};
    if (v.type == JV_LIST && v.l->tuple) return "tuple";
    return names[v.type];
}

/* ---- buffers -------------------------------------------------------------------------------------- */

void jbuf_put(struct jctx *c, struct jbuf *b, const char *p, size_t n)
{
    if (n == 0) return;
    if (b->cap - b->n < n) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap - b->n < n) {
            if (cap > ((size_t)1 << 40)) jfail(c, FERRY_ERR_RANGE, JNO_OFF, "string too large");
            cap *= 2;
        }
        char *np = jalloc(c, cap);
        if (b->n) memcpy(np, b->p, b->n);
        b->p = np;
        b->cap = cap;
    }
    memcpy(b->p + b->n, p, n);
    b->n += n;
    if (b == c->out && b->n > c->max_output)
        jfail(c, FERRY_ERR_RANGE, JNO_OFF, "rendered output exceeds %zu bytes", c->max_output);
}

void jbuf_putc(struct jctx *c, struct jbuf *b, char ch)
{
    jbuf_put(c, b, &ch, 1);
}

struct jv jbuf_take(struct jbuf *b)
{
    return jv_str(b->n ? b->p : "", b->n);
}

static void put_cstr(struct jctx *c, struct jbuf *b, const char *s)
{
    jbuf_put(c, b, s, strlen(s));
}

/* Python's repr(float): the shortest digits that round-trip, scientific below 1e-4 and from 1e16. */
static void write_float(struct jctx *c, struct jbuf *b, double f)
{
    if (isnan(f)) return put_cstr(c, b, "nan");
    if (isinf(f)) return put_cstr(c, b, f < 0 ? "-inf" : "inf");
    char tmp[64];
    int prec;
    for (prec = 1; prec < 17; prec++) {
        snprintf(tmp, sizeof tmp, "%.*e", prec - 1, f);
        if (strtod(tmp, NULL) == f) break;
    }
    snprintf(tmp, sizeof tmp, "%.*e", prec - 1, f);
    /* tmp = [-]D[.DDD]e[+-]XX */
    char digits[32];
    int nd = 0, neg = 0;
    const char *q = tmp;
    if (*q == '-') {
        neg = 1;
        q++;
    }
    for (; *q && *q != 'e'; q++)
        if (*q >= '0' && *q <= '9') digits[nd++] = *q;
    int exp = atoi(q + 1);
    while (nd > 1 && digits[nd - 1] == '0') nd--;
    char outb[64];
    int o = 0;
    if (neg) outb[o++] = '-';
    if (exp < -4 || exp >= 16) {
        outb[o++] = digits[0];
        if (nd > 1) {
            outb[o++] = '.';
            for (int i = 1; i < nd; i++) outb[o++] = digits[i];
        }
        o +=
            snprintf(outb + o, sizeof outb - (size_t)o, "e%c%02d", exp < 0 ? '-' : '+', exp < 0 ? -exp : exp);
    } else if (exp < 0) {
        outb[o++] = '0';
        outb[o++] = '.';
        for (int i = 0; i < -exp - 1; i++) outb[o++] = '0';
        for (int i = 0; i < nd; i++) outb[o++] = digits[i];
    } else {
        for (int i = 0; i <= exp; i++) outb[o++] = i < nd ? digits[i] : '0';
        outb[o++] = '.';
        if (nd > exp + 1)
            for (int i = exp + 1; i < nd; i++) outb[o++] = digits[i];
        else
            outb[o++] = '0';
    }
    jbuf_put(c, b, outb, (size_t)o);
}

static void write_int(struct jctx *c, struct jbuf *b, int64_t i)
{
    char tmp[32];
    int n = snprintf(tmp, sizeof tmp, "%lld", (long long)i);
    jbuf_put(c, b, tmp, (size_t)n);
}

static void write_str_repr(struct jctx *c, struct jbuf *b, const char *p, size_t n)
{
    int has_sq = memchr(p, '\'', n) != NULL, has_dq = memchr(p, '"', n) != NULL;
    char q = has_sq && !has_dq ? '"' : '\'';
    jbuf_putc(c, b, q);
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)p[i];
        char esc[8];
        if (ch == '\\' || ch == (unsigned char)q) {
            esc[0] = '\\';
            esc[1] = (char)ch;
            jbuf_put(c, b, esc, 2);
        } else if (ch == '\n') {
            jbuf_put(c, b, "\\n", 2);
        } else if (ch == '\r') {
            jbuf_put(c, b, "\\r", 2);
        } else if (ch == '\t') {
            jbuf_put(c, b, "\\t", 2);
        } else if (ch < 0x20 || ch == 0x7f) {
            snprintf(esc, sizeof esc, "\\x%02x", ch);
            jbuf_put(c, b, esc, 4);
        } else {
            jbuf_putc(c, b, (char)ch);
        }
    }
    jbuf_putc(c, b, q);
}

void jv_write_repr(struct jctx *c, struct jbuf *b, struct jv v)
{
    if (++c->depth > c->max_depth) jfail(c, FERRY_ERR_RANGE, JNO_OFF, "value nested too deeply");
    switch (v.type) {
    case JV_STR:
        write_str_repr(c, b, v.s.p, v.s.n);
        break;
    case JV_UNDEF:
        put_cstr(c, b, "Undefined");
        break;
    case JV_LIST: {
        if (v.l->gen) {
            put_cstr(c, b, "<generator object>");
            break;
        }
        jbuf_putc(c, b, v.l->tuple ? '(' : '[');
        for (size_t i = 0; i < v.l->n; i++) {
            if (i) jbuf_put(c, b, ", ", 2);
            jv_write_repr(c, b, v.l->v[i]);
        }
        if (v.l->tuple && v.l->n == 1) jbuf_putc(c, b, ',');
        jbuf_putc(c, b, v.l->tuple ? ')' : ']');
        break;
    }
    case JV_DICT:
    case JV_NS: {
        if (v.type == JV_NS) put_cstr(c, b, "<Namespace ");
        jbuf_putc(c, b, '{');
        for (size_t i = 0; i < v.d->n; i++) {
            if (i) jbuf_put(c, b, ", ", 2);
            jv_write_repr(c, b, v.d->k[i]);
            jbuf_put(c, b, ": ", 2);
            jv_write_repr(c, b, v.d->v[i]);
        }
        jbuf_putc(c, b, '}');
        if (v.type == JV_NS) jbuf_putc(c, b, '>');
        break;
    }
    default:
        jv_write_str(c, b, v);
        break;
    }
    c->depth--;
}

void jv_write_str(struct jctx *c, struct jbuf *b, struct jv v)
{
    switch (v.type) {
    case JV_UNDEF:
        break;
    case JV_NONE:
        put_cstr(c, b, "None");
        break;
    case JV_BOOL:
        put_cstr(c, b, v.i ? "True" : "False");
        break;
    case JV_INT:
        write_int(c, b, v.i);
        break;
    case JV_FLOAT:
        write_float(c, b, v.f);
        break;
    case JV_STR:
        jbuf_put(c, b, v.s.p, v.s.n);
        break;
    case JV_LIST:
    case JV_DICT:
    case JV_NS:
        jv_write_repr(c, b, v);
        break;
    case JV_FUNC:
        put_cstr(c, b, "<built-in function>");
        break;
    case JV_MACRO:
        put_cstr(c, b, "<Macro>");
        break;
    case JV_LOOP:
        put_cstr(c, b, "<LoopContext>");
        break;
    }
}

struct jv jv_to_str(struct jctx *c, struct jv v)
{
    if (v.type == JV_STR) return v;
    struct jbuf b = {0};
    jv_write_str(c, &b, v);
    return jbuf_take(&b);
}

static void write_json_str(struct jctx *c, struct jbuf *b, const char *p, size_t n, int ascii)
{
    jbuf_putc(c, b, '"');
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)p[i];
        char esc[16];
        switch (ch) {
        case '"':
            jbuf_put(c, b, "\\\"", 2);
            break;
        case '\\':
            jbuf_put(c, b, "\\\\", 2);
            break;
        case '\n':
            jbuf_put(c, b, "\\n", 2);
            break;
        case '\r':
            jbuf_put(c, b, "\\r", 2);
            break;
        case '\t':
            jbuf_put(c, b, "\\t", 2);
            break;
        case '\b':
            jbuf_put(c, b, "\\b", 2);
            break;
        case '\f':
            jbuf_put(c, b, "\\f", 2);
            break;
        default:
            if (ch < 0x20) {
                snprintf(esc, sizeof esc, "\\u%04x", ch);
                jbuf_put(c, b, esc, 6);
            } else if (ch >= 0x80 && ascii) {
                size_t adv;
                unsigned cp = (unsigned)jutf8_decode(p + i, n - i, &adv);
                if (cp >= 0x10000) {
                    cp -= 0x10000;
                    snprintf(esc, sizeof esc, "\\u%04x\\u%04x", 0xd800 + (cp >> 10), 0xdc00 + (cp & 0x3ff));
                    jbuf_put(c, b, esc, 12);
                } else {
                    snprintf(esc, sizeof esc, "\\u%04x", cp);
                    jbuf_put(c, b, esc, 6);
                }
                i += adv - 1;
            } else {
                jbuf_putc(c, b, (char)ch);
            }
        }
    }
    jbuf_putc(c, b, '"');
}

static void json_newline(struct jctx *c, struct jbuf *b, const struct jjson_opts *o, int level)
{
    jbuf_putc(c, b, '\n');
    for (int i = 0; i < level; i++) jbuf_put(c, b, o->indent_str.s.p, o->indent_str.s.n);
}

static int key_less(struct jv a, struct jv b)
{
    size_t n = a.s.n < b.s.n ? a.s.n : b.s.n;
    int r = memcmp(a.s.p, b.s.p, n);
    return r < 0 || (r == 0 && a.s.n < b.s.n);
}

/* json.dumps(v, ensure_ascii, indent, separators, sort_keys) as HF's tojson calls it. */
void jv_write_json(struct jctx *c, struct jbuf *b, struct jv v, const struct jjson_opts *o, int level,
                   size_t off)
{
    if (++c->depth > c->max_depth) jfail(c, FERRY_ERR_RANGE, off, "value nested too deeply for tojson");
    switch (v.type) {
    case JV_NONE:
        put_cstr(c, b, "null");
        break;
    case JV_BOOL:
        put_cstr(c, b, v.i ? "true" : "false");
        break;
    case JV_INT:
        write_int(c, b, v.i);
        break;
    case JV_FLOAT:
        if (isnan(v.f))
            put_cstr(c, b, "NaN");
        else if (isinf(v.f))
            put_cstr(c, b, v.f < 0 ? "-Infinity" : "Infinity");
        else
            write_float(c, b, v.f);
        break;
    case JV_STR:
        write_json_str(c, b, v.s.p, v.s.n, o->ascii);
        break;
    case JV_LIST:
        if (v.l->gen) jfail(c, FERRY_ERR_INVALID, off, "Object of type generator is not JSON serializable");
        if (v.l->n == 0) {
            put_cstr(c, b, "[]");
            break;
        }
        jbuf_putc(c, b, '[');
        for (size_t i = 0; i < v.l->n; i++) {
            if (i) jbuf_put(c, b, o->item_sep.s.p, o->item_sep.s.n);
            if (o->indent >= 0) json_newline(c, b, o, level + 1);
            jv_write_json(c, b, v.l->v[i], o, level + 1, off);
        }
        if (o->indent >= 0) json_newline(c, b, o, level);
        jbuf_putc(c, b, ']');
        break;
    case JV_DICT: {
        if (v.d->n == 0) {
            put_cstr(c, b, "{}");
            break;
        }
        size_t *order = jalloc(c, v.d->n * sizeof *order);
        for (size_t i = 0; i < v.d->n; i++) {
            if (v.d->k[i].type != JV_STR)
                jfail(c, FERRY_ERR_UNSUPPORTED, off, "tojson: only string dict keys are supported");
            order[i] = i;
        }
        if (o->sort_keys) /* insertion sort: dicts in templates are small */
            for (size_t i = 1; i < v.d->n; i++)
                for (size_t j = i; j > 0 && key_less(v.d->k[order[j]], v.d->k[order[j - 1]]); j--) {
                    size_t t = order[j];
                    order[j] = order[j - 1];
                    order[j - 1] = t;
                }
        jbuf_putc(c, b, '{');
        for (size_t i = 0; i < v.d->n; i++) {
            if (i) jbuf_put(c, b, o->item_sep.s.p, o->item_sep.s.n);
            if (o->indent >= 0) json_newline(c, b, o, level + 1);
            write_json_str(c, b, v.d->k[order[i]].s.p, v.d->k[order[i]].s.n, o->ascii);
            jbuf_put(c, b, o->key_sep.s.p, o->key_sep.s.n);
            jv_write_json(c, b, v.d->v[order[i]], o, level + 1, off);
        }
        if (o->indent >= 0) json_newline(c, b, o, level);
        jbuf_putc(c, b, '}');
        break;
    }
    default:
        jfail(c, FERRY_ERR_INVALID, off, "Object of type %s is not JSON serializable", jv_type_name(v));
    }
    c->depth--;
}

/* ---- UTF-8 ---------------------------------------------------------------------------------------- */

int jutf8_decode(const char *s, size_t n, size_t *adv)
{
    const unsigned char *p = (const unsigned char *)s;
    unsigned c0 = p[0];
    size_t len = c0 < 0x80 ? 1 : (c0 >> 5) == 6 ? 2 : (c0 >> 4) == 14 ? 3 : (c0 >> 3) == 30 ? 4 : 0;
    if (len == 0 || len > n) {
        *adv = 1;
        return (int)c0;
    }
    unsigned cp = len == 1 ? c0 : len == 2 ? (c0 & 0x1f) : len == 3 ? (c0 & 0x0f) : (c0 & 0x07);
    for (size_t i = 1; i < len; i++) {
        if ((p[i] & 0xc0) != 0x80) {
            *adv = 1;
            return (int)c0;
        }
        cp = (cp << 6) | (p[i] & 0x3f);
    }
    *adv = len;
    return (int)cp;
}

size_t jutf8_len(const char *p, size_t n)
{
    size_t k = 0, i = 0, adv;
    while (i < n) {
        jutf8_decode(p + i, n - i, &adv);
        i += adv;
        k++;
    }
    return k;
}

size_t jutf8_offset(const char *p, size_t n, size_t k)
{
    size_t i = 0, adv;
    while (k > 0 && i < n) {
        jutf8_decode(p + i, n - i, &adv);
        i += adv;
        k--;
    }
    return i;
}

int jis_space(int cp)
{
    return (cp >= 0x09 && cp <= 0x0d) || (cp >= 0x1c && cp <= 0x20) || cp == 0x85 || cp == 0xa0 ||
           cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200a) || cp == 0x2028 || cp == 0x2029 || cp == 0x202f ||
           cp == 0x205f || cp == 0x3000;
}
