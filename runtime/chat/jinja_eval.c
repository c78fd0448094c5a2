/* jinja_eval — the evaluator of the chat-template interpreter: statements, expressions, scopes.
 *
 * Scoping follows Jinja2: `if` shares its scope, each for-loop iteration and each macro call gets a
 * fresh frame (so plain `set` inside a loop does not leak out; namespaces are how templates carry
 * state), lookups walk frames outward, a missing name is Undefined (falsy, prints empty, errors on
 * attribute access). Every statement and expression costs one step and one level of depth, so runaway
 * templates stop with FERRY_ERR_RANGE. Filters, tests and methods live in jinja_builtins.c.
 */
#include "runtime/chat/jinja_eval.h"

#include "kernels/core/status.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- frames --------------------------------------------------------------------------------------- */

struct jv jframe_lookup(const struct jframe *f, const char *name, size_t n)
{
    for (; f; f = f->parent) {
        struct jv *v = jdict_gets(&f->vars, name, n);
        if (v) return *v;
    }
    static const struct {
        const char *name;
        int fn;
    } globals[] = {{"range", JF_RANGE},
                   {"namespace", JF_NAMESPACE},
                   {"raise_exception", JF_RAISE},
                   {"strftime_now", JF_STRFTIME},
                   {"dict", JF_DICT}};
    for (size_t i = 0; i < sizeof globals / sizeof *globals; i++)
        if (strlen(globals[i].name) == n && memcmp(globals[i].name, name, n) == 0)
            return (struct jv){.type = JV_FUNC, .i = globals[i].fn};
    return jv_undef(name, n);
}

static void frame_set(struct jctx *c, struct jframe *f, struct jv name, struct jv v)
{
    jdict_set(c, &f->vars, name, v);
}

static void tick(struct jctx *c, size_t off)
{
    if (++c->steps > c->max_steps)
        jfail(c, FERRY_ERR_RANGE, off, "template exceeded %lld evaluation steps", (long long)c->max_steps);
    if (++c->depth > c->max_depth)
        jfail(c, FERRY_ERR_RANGE, off, "template recursion deeper than %d", c->max_depth);
}

/* ---- attribute and item access -------------------------------------------------------------------- */

__attribute__((noreturn)) void jfail_undefined(struct jctx *c, struct jv u, size_t off)
{
    if (u.s.p) jfail(c, FERRY_ERR_INVALID, off, "'%.*s' is undefined", (int)(u.s.n > 60 ? 60 : u.s.n), u.s.p);
    jfail(c, FERRY_ERR_INVALID, off, "use of an undefined value");
}

static struct jv loop_attr(struct jctx *c, struct jloop *l, const char *name, size_t n)
{
#define IS(s) (n == sizeof(s) - 1 && memcmp(name, s, n) == 0)
    if (IS("index")) return jv_int(l->index0 + 1);
    if (IS("index0")) return jv_int(l->index0);
    if (IS("first")) return jv_bool(l->index0 == 0);
    if (IS("last")) return jv_bool(l->index0 == l->length - 1);
    if (IS("length")) return jv_int(l->length);
    if (IS("revindex")) return jv_int(l->length - l->index0);
    if (IS("revindex0")) return jv_int(l->length - l->index0 - 1);
    if (IS("depth")) return jv_int(1);
    if (IS("depth0")) return jv_int(0);
    if (IS("previtem")) return l->index0 > 0 ? l->items->v[l->index0 - 1] : jv_undef("previtem", 8);
    if (IS("nextitem"))
        return l->index0 + 1 < l->length ? l->items->v[l->index0 + 1] : jv_undef("nextitem", 8);
#undef IS
    (void)c;
    return jv_undef(name, n);
}

struct jv jv_getattr(struct jctx *c, struct jv obj, const char *name, size_t n, size_t off)
{
    switch (obj.type) {
    case JV_UNDEF:
        jfail_undefined(c, obj, off);
    case JV_DICT:
    case JV_NS: {
        struct jv *v = jdict_gets(obj.d, name, n);
        return v ? *v : jv_undef(name, n);
    }
    case JV_LOOP:
        return loop_attr(c, obj.loop, name, n);
    default:
        return jv_undef(name, n);
    }
}

static int as_index(struct jv k, int64_t *out)
{
    if (k.type != JV_INT && k.type != JV_BOOL) return 0;
    *out = k.i;
    return 1;
}

struct jv jv_getitem(struct jctx *c, struct jv obj, struct jv key, size_t off)
{
    int64_t i;
    switch (obj.type) {
    case JV_UNDEF:
        jfail_undefined(c, obj, off);
    case JV_DICT: {
        struct jv *v = jdict_get(obj.d, key);
        return v ? *v : jv_undef(key.type == JV_STR ? key.s.p : NULL, key.s.n);
    }
    case JV_LIST:
        if (obj.l->gen) return jv_undef(NULL, 0);
        if (!as_index(key, &i)) break;
        if (i < 0) i += (int64_t)obj.l->n;
        if (i < 0 || (uint64_t)i >= obj.l->n) return jv_undef(NULL, 0);
        return obj.l->v[i];
    case JV_STR: {
        if (!as_index(key, &i)) break;
        jcharge(c, jv_cost(obj));
        int64_t len = (int64_t)jutf8_len(obj.s.p, obj.s.n);
        if (i < 0) i += len;
        if (i < 0 || i >= len) return jv_undef(NULL, 0);
        size_t a = jutf8_offset(obj.s.p, obj.s.n, (size_t)i);
        size_t adv;
        jutf8_decode(obj.s.p + a, obj.s.n - a, &adv);
        return jv_str(obj.s.p + a, adv);
    }
    default:
        break;
    }
    if (key.type == JV_STR) return jv_getattr(c, obj, key.s.p, key.s.n, off);
    return jv_undef(NULL, 0);
}

/* Python's slice.indices(): normalised start/stop/step for a sequence of length len. */
static void slice_indices(struct jctx *c, struct jv s0, struct jv s1, struct jv s2, int64_t len,
                          int64_t *start, int64_t *stop, int64_t *step, size_t off)
{
    *step = 1;
    if (s2.type != JV_NONE && s2.type != JV_UNDEF) {
        if (!as_index(s2, step)) jfail(c, FERRY_ERR_INVALID, off, "slice indices must be integers");
        if (*step == 0) jfail(c, FERRY_ERR_INVALID, off, "slice step cannot be zero");
    }
    int64_t lo = *step < 0 ? -1 : 0, hi = *step < 0 ? len - 1 : len;
    struct jv in[2] = {s0, s1};
    int64_t outv[2];
    for (int k = 0; k < 2; k++) {
        if (in[k].type == JV_NONE || in[k].type == JV_UNDEF) {
            outv[k] = (k == 0) == (*step > 0) ? lo : hi;
            if (k == 0 && *step < 0) outv[k] = hi;
            if (k == 1 && *step < 0) outv[k] = lo;
            if (k == 0 && *step > 0) outv[k] = lo;
            if (k == 1 && *step > 0) outv[k] = hi;
            continue;
        }
        int64_t v;
        if (!as_index(in[k], &v)) jfail(c, FERRY_ERR_INVALID, off, "slice indices must be integers");
        if (v < 0) {
            v += len;
            if (v < lo) v = lo;
        } else if (v > hi) {
            v = hi;
        }
        outv[k] = v;
    }
    *start = outv[0];
    *stop = outv[1];
}

static struct jv do_slice(struct jctx *c, struct jv obj, struct jv s0, struct jv s1, struct jv s2, size_t off)
{
    if (obj.type == JV_UNDEF) jfail_undefined(c, obj, off);
    if ((obj.type != JV_LIST && obj.type != JV_STR) ||
        (obj.type == JV_LIST && obj.l->gen)) /* Jinja slices directly */
        jfail(c, FERRY_ERR_INVALID, off, "'%s' object is not subscriptable",
              obj.type == JV_LIST ? "generator" : jv_type_name(obj));
    int64_t len, start, stop, step;
    size_t *cps = NULL;
    if (obj.type == JV_LIST) {
        len = (int64_t)obj.l->n;
    } else {
        len = (int64_t)jutf8_len(obj.s.p, obj.s.n);
        cps = jalloc(c, ((size_t)len + 1) * sizeof *cps);
        size_t i = 0, k = 0, adv;
        while (i < obj.s.n) {
            cps[k++] = i;
            jutf8_decode(obj.s.p + i, obj.s.n - i, &adv);
            i += adv;
        }
        cps[k] = obj.s.n;
    }
    slice_indices(c, s0, s1, s2, len, &start, &stop, &step, off);
    if (obj.type == JV_STR && step == 1) {
        if (stop <= start) return jv_str("", 0);
        return jv_str(obj.s.p + cps[start], cps[stop] - cps[start]);
    }
    struct jv out = obj.type == JV_LIST ? jv_list(c, 0) : jv_none();
    struct jbuf b = {0};
    for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
        if (obj.type == JV_LIST) {
            jlist_push(c, out.l, obj.l->v[i]);
        } else {
            jbuf_put(c, &b, obj.s.p + cps[i], cps[i + 1] - cps[i]);
        }
    }
    return obj.type == JV_LIST ? out : jbuf_take(&b);
}

/* ---- operators ------------------------------------------------------------------------------------ */

static int is_num(struct jv v)
{
    return v.type == JV_INT || v.type == JV_BOOL || v.type == JV_FLOAT;
}
static double as_f(struct jv v)
{
    return v.type == JV_FLOAT ? v.f : (double)v.i;
}

__attribute__((noreturn)) static void type_error(struct jctx *c, const char *op, struct jv a, struct jv b,
                                                 size_t off)
{
    if (a.type == JV_UNDEF) jfail_undefined(c, a, off);
    if (b.type == JV_UNDEF) jfail_undefined(c, b, off);
    jfail(c, FERRY_ERR_INVALID, off, "unsupported operand types for %s: '%s' and '%s'", op, jv_type_name(a),
          jv_type_name(b));
}

static struct jv repeat(struct jctx *c, struct jv seq, int64_t k, size_t off)
{
    if (k < 0) k = 0;
    if (seq.type == JV_STR) {
        if (seq.s.n && (uint64_t)k > c->arena.limit / seq.s.n)
            jfail(c, FERRY_ERR_RANGE, off, "string repetition too large");
        struct jbuf b = {0};
        for (int64_t i = 0; i < k; i++) jbuf_put(c, &b, seq.s.p, seq.s.n);
        return jbuf_take(&b);
    }
    if (seq.l->n && (uint64_t)k > c->arena.limit / (seq.l->n * sizeof(struct jv)))
        jfail(c, FERRY_ERR_RANGE, off, "list repetition too large");
    struct jv out = jv_list(c, 0);
    for (int64_t i = 0; i < k; i++)
        for (size_t j = 0; j < seq.l->n; j++) jlist_push(c, out.l, seq.l->v[j]);
    return out;
}

struct jv jv_concat(struct jctx *c, struct jv a, struct jv b)
{
    struct jbuf buf = {0};
    jv_write_str(c, &buf, a);
    jv_write_str(c, &buf, b);
    return jbuf_take(&buf);
}

/* A string into a Markup result: as it is when it is Markup, else HTML-escaped the way markupsafe escapes. */
static void markup_put(struct jctx *c, struct jbuf *b, struct jv s)
{
    if (s.markup) {
        jbuf_put(c, b, s.s.p, s.s.n);
        return;
    }
    for (size_t i = 0; i < s.s.n; i++) {
        switch (s.s.p[i]) {
        case '&':
            jbuf_put(c, b, "&amp;", 5);
            break;
        case '<':
            jbuf_put(c, b, "&lt;", 4);
            break;
        case '>':
            jbuf_put(c, b, "&gt;", 4);
            break;
        case '"':
            jbuf_put(c, b, "&#34;", 5);
            break;
        case '\'':
            jbuf_put(c, b, "&#39;", 5);
            break;
        default:
            jbuf_putc(c, b, s.s.p[i]);
        }
    }
}

static struct jv binary(struct jctx *c, int op, struct jv a, struct jv b, size_t off)
{
    static const char *names[] = {"+", "-", "*", "/", "//", "%", "**", "~"};
    int64_t r;
    if (op == JOP_CAT) return jv_concat(c, a, b);
    if (is_num(a) && is_num(b)) {
        int ints = a.type != JV_FLOAT && b.type != JV_FLOAT;
        switch (op) {
        case JOP_ADD:
            if (!ints) return jv_float(as_f(a) + as_f(b));
            if (__builtin_add_overflow(a.i, b.i, &r)) goto overflow;
            return jv_int(r);
        case JOP_SUB:
            if (!ints) return jv_float(as_f(a) - as_f(b));
            if (__builtin_sub_overflow(a.i, b.i, &r)) goto overflow;
            return jv_int(r);
        case JOP_MUL:
            if (!ints) return jv_float(as_f(a) * as_f(b));
            if (__builtin_mul_overflow(a.i, b.i, &r)) goto overflow;
            return jv_int(r);
        case JOP_DIV:
            if (as_f(b) == 0.0) jfail(c, FERRY_ERR_INVALID, off, "division by zero");
            return jv_float(as_f(a) / as_f(b));
        case JOP_FDIV:
        case JOP_MOD:
            if (as_f(b) == 0.0) jfail(c, FERRY_ERR_INVALID, off, "integer division or modulo by zero");
            if (ints) {
                if (a.i == INT64_MIN && b.i == -1) goto overflow;
                int64_t q = a.i / b.i, m = a.i % b.i;
                if (m != 0 && ((m < 0) != (b.i < 0))) {
                    q -= 1;
                    m += b.i;
                }
                return jv_int(op == JOP_FDIV ? q : m);
            } else {
                double x = as_f(a), y = as_f(b), m = fmod(x, y);
                if (m != 0 && ((m < 0) != (y < 0))) m += y;
                return op == JOP_FDIV ? jv_float(floor(x / y)) : jv_float(m);
            }
        case JOP_POW:
            if (ints && b.i >= 0) {
                int64_t acc = 1, base = a.i, e = b.i;
                while (e > 0) {
                    if (e & 1)
                        if (__builtin_mul_overflow(acc, base, &acc)) goto overflow;
                    e >>= 1;
                    if (e && __builtin_mul_overflow(base, base, &base)) goto overflow;
                }
                return jv_int(acc);
            }
            return jv_float(pow(as_f(a), as_f(b)));
        }
    }
    if (op == JOP_ADD && a.type == JV_STR && b.type == JV_STR && (a.markup || b.markup)) {
        struct jbuf buf = {0};
        markup_put(c, &buf, a);
        markup_put(c, &buf, b);
        struct jv m = jbuf_take(&buf);
        m.markup = 1;
        return m;
    }
    if (op == JOP_ADD && a.type == JV_STR && b.type == JV_STR) {
        char *p = jalloc(c, a.s.n + b.s.n + 1);
        memcpy(p, a.s.p, a.s.n);
        memcpy(p + a.s.n, b.s.p, b.s.n);
        return jv_str(p, a.s.n + b.s.n);
    }
    if (op == JOP_ADD && a.type == JV_LIST && b.type == JV_LIST && !a.l->gen && !b.l->gen) {
        struct jv out = jv_list(c, a.l->n + b.l->n);
        for (size_t i = 0; i < a.l->n; i++) jlist_push(c, out.l, a.l->v[i]);
        for (size_t i = 0; i < b.l->n; i++) jlist_push(c, out.l, b.l->v[i]);
        return out;
    }
    if (op == JOP_MUL && (a.type == JV_STR || a.type == JV_LIST) && (b.type == JV_INT || b.type == JV_BOOL))
        return repeat(c, a, b.i, off);
    if (op == JOP_MUL && (b.type == JV_STR || b.type == JV_LIST) && (a.type == JV_INT || a.type == JV_BOOL))
        return repeat(c, b, a.i, off);
    if (op == JOP_MOD && a.type == JV_STR)
        jfail(c, FERRY_ERR_UNSUPPORTED, off, "unsupported printf-style string formatting");
    type_error(c, names[op], a, b, off);
overflow:
    jfail(c, FERRY_ERR_RANGE, off, "integer overflow");
}

static int str_find(struct jv hay, struct jv needle)
{
    if (needle.s.n == 0) return 1;
    return memmem(hay.s.p, hay.s.n, needle.s.p, needle.s.n) != NULL;
}

int jv_contains(struct jctx *c, struct jv hay, struct jv needle, size_t off)
{
    jcharge(c, jv_cost(hay));
    switch (hay.type) {
    case JV_STR:
        if (needle.type != JV_STR)
            jfail(c, FERRY_ERR_INVALID, off, "'in <string>' requires string as left operand, not %s",
                  jv_type_name(needle));
        return str_find(hay, needle);
    case JV_LIST:
        for (size_t i = 0; i < hay.l->n; i++)
            if (jv_equal(hay.l->v[i], needle)) return 1;
        return 0;
    case JV_DICT:
        return jdict_get(hay.d, needle) != NULL;
    case JV_UNDEF:
        return 0;
    default:
        jfail(c, FERRY_ERR_INVALID, off, "argument of type '%s' is not iterable", jv_type_name(hay));
    }
}

/* <0, 0, >0 like Python's ordering; a type error for unordered pairs. */
int jv_compare(struct jctx *c, struct jv a, struct jv b, size_t off)
{
    if (is_num(a) && is_num(b)) {
        if (a.type != JV_FLOAT && b.type != JV_FLOAT) return (a.i > b.i) - (a.i < b.i);
        double x = as_f(a), y = as_f(b);
        return (x > y) - (x < y);
    }
    if (a.type == JV_STR && b.type == JV_STR) {
        size_t n = a.s.n < b.s.n ? a.s.n : b.s.n;
        int r = memcmp(a.s.p, b.s.p, n);
        if (r) return r;
        return (a.s.n > b.s.n) - (a.s.n < b.s.n);
    }
    if (a.type == JV_LIST && b.type == JV_LIST) {
        for (size_t i = 0; i < a.l->n && i < b.l->n; i++) {
            if (jv_equal(a.l->v[i], b.l->v[i])) continue;
            return jv_compare(c, a.l->v[i], b.l->v[i], off);
        }
        return (a.l->n > b.l->n) - (a.l->n < b.l->n);
    }
    type_error(c, "comparison", a, b, off);
}

static int compare(struct jctx *c, int op, struct jv a, struct jv b, size_t off)
{
    if (op != JOP_IN && op != JOP_NOTIN) jcharge(c, jv_cost(a) < jv_cost(b) ? jv_cost(a) : jv_cost(b));
    switch (op) {
    case JOP_EQ:
        return jv_equal(a, b);
    case JOP_NE:
        return !jv_equal(a, b);
    case JOP_IN:
        return jv_contains(c, b, a, off);
    case JOP_NOTIN:
        return !jv_contains(c, b, a, off);
    case JOP_LT:
        return jv_compare(c, a, b, off) < 0;
    case JOP_LE:
        return jv_compare(c, a, b, off) <= 0;
    case JOP_GT:
        return jv_compare(c, a, b, off) > 0;
    default:
        return jv_compare(c, a, b, off) >= 0;
    }
}

/* The items a for-loop or a filter iterates: lists as is, dict keys, string characters. */
struct jlist *jv_iter_list(struct jctx *c, struct jv v, size_t off)
{
    switch (v.type) {
    case JV_LIST:
        return v.l;
    case JV_UNDEF:
        return jv_list(c, 0).l;
    case JV_DICT: {
        struct jv out = jv_list(c, v.d->n);
        for (size_t i = 0; i < v.d->n; i++) jlist_push(c, out.l, v.d->k[i]);
        return out.l;
    }
    case JV_STR: {
        struct jv out = jv_list(c, 0);
        size_t i = 0, adv;
        while (i < v.s.n) {
            jutf8_decode(v.s.p + i, v.s.n - i, &adv);
            jlist_push(c, out.l, jv_str(v.s.p + i, adv));
            i += adv;
        }
        return out.l;
    }
    default:
        jfail(c, FERRY_ERR_INVALID, off, "'%s' object is not iterable", jv_type_name(v));
    }
}

/* ---- calls ---------------------------------------------------------------------------------------- */

static void eval_args(struct jctx *c, const struct jnode *n, struct jframe *f, struct jargs *A)
{
    A->off = n->off;
    A->npos = n->nkids;
    A->nkw = n->nkw;
    A->pos = n->nkids ? jalloc(c, (size_t)n->nkids * sizeof *A->pos) : NULL;
    A->kwn = n->kwnames;
    A->kwv = n->nkw ? jalloc(c, (size_t)n->nkw * sizeof *A->kwv) : NULL;
    for (int i = 0; i < n->nkids; i++) A->pos[i] = jeval(c, n->kids[i], f);
    for (int i = 0; i < n->nkw; i++) A->kwv[i] = jeval(c, n->kwvals[i], f);
}

static struct jv call_macro(struct jctx *c, const struct jnode *m, const struct jargs *A)
{
    if (A->npos > m->nnames)
        jfail(c, FERRY_ERR_INVALID, A->off, "macro '%.*s' takes %d arguments, got %d", (int)m->val.s.n,
              m->val.s.p, m->nnames, A->npos);
    struct jframe frame = {.parent = c->root};
    for (int i = 0; i < m->nnames; i++) {
        struct jv v = jv_undef(m->names[i].s.p, m->names[i].s.n);
        if (i < A->npos) {
            v = A->pos[i];
        } else {
            int found = 0;
            for (int k = 0; k < A->nkw; k++)
                if (jv_equal(A->kwn[k], m->names[i])) {
                    v = A->kwv[k];
                    found = 1;
                }
            if (!found && m->kids[i]) v = jeval(c, m->kids[i], &frame);
        }
        frame_set(c, &frame, m->names[i], v);
    }
    for (int k = 0; k < A->nkw; k++) {
        int known = 0;
        for (int i = 0; i < m->nnames; i++) known |= jv_equal(A->kwn[k], m->names[i]);
        if (!known)
            jfail(c, FERRY_ERR_INVALID, A->off, "macro '%.*s' has no parameter '%.*s'", (int)m->val.s.n,
                  m->val.s.p, (int)A->kwn[k].s.n, A->kwn[k].s.p);
    }
    struct jbuf buf = {0}, *saved = c->out;
    c->out = &buf;
    jrender(c, m->b, &frame);
    c->out = saved;
    c->flow = 0;
    return jbuf_take(&buf);
}

static struct jv eval_call(struct jctx *c, const struct jnode *n, struct jframe *f)
{
    struct jargs A;
    struct jv callee;
    if (n->a->kind == JN_ATTR) {
        struct jv obj = jeval(c, n->a->a, f);
        if (obj.type == JV_UNDEF) jfail_undefined(c, obj, n->off);
        eval_args(c, n, f, &A);
        struct jv out;
        if (jcall_method(c, obj, n->a->val.s.p, n->a->val.s.n, &A, &out)) return out;
        callee = jv_getattr(c, obj, n->a->val.s.p, n->a->val.s.n, n->a->off);
        if (callee.type != JV_MACRO && callee.type != JV_FUNC)
            jfail(c, FERRY_ERR_UNSUPPORTED, n->a->off, "unsupported method '%.*s' of '%s'",
                  (int)n->a->val.s.n, n->a->val.s.p, jv_type_name(obj));
    } else {
        callee = jeval(c, n->a, f);
        eval_args(c, n, f, &A);
    }
    if (callee.type == JV_MACRO) return call_macro(c, callee.m, &A);
    if (callee.type == JV_FUNC) return jcall_global(c, (int)callee.i, &A);
    if (callee.type == JV_UNDEF) jfail_undefined(c, callee, n->off);
    jfail(c, FERRY_ERR_INVALID, n->off, "'%s' object is not callable", jv_type_name(callee));
}

/* ---- expressions ---------------------------------------------------------------------------------- */

struct jv jeval(struct jctx *c, const struct jnode *n, struct jframe *f)
{
    tick(c, n->off);
    struct jv r;
    switch (n->kind) {
    case JN_CONST:
        r = n->val;
        break;
    case JN_NAME:
        r = jframe_lookup(f, n->val.s.p, n->val.s.n);
        break;
    case JN_ATTR:
        r = jv_getattr(c, jeval(c, n->a, f), n->val.s.p, n->val.s.n, n->off);
        break;
    case JN_INDEX: {
        struct jv obj = jeval(c, n->a, f);
        r = jv_getitem(c, obj, jeval(c, n->b, f), n->off);
        break;
    }
    case JN_SLICE: {
        struct jv obj = jeval(c, n->a, f), s[3];
        for (int i = 0; i < 3; i++) s[i] = n->kids[i] ? jeval(c, n->kids[i], f) : jv_none();
        r = do_slice(c, obj, s[0], s[1], s[2], n->off);
        break;
    }
    case JN_CALL:
        r = eval_call(c, n, f);
        break;
    case JN_FILTER: {
        struct jv subj = jeval(c, n->a, f);
        struct jargs A;
        eval_args(c, n, f, &A);
        r = japply_filter(c, n->val.s.p, n->val.s.n, subj, &A);
        break;
    }
    case JN_TEST: {
        struct jv subj = jeval(c, n->a, f);
        struct jargs A;
        eval_args(c, n, f, &A);
        int t = japply_test(c, n->val.s.p, n->val.s.n, subj, &A);
        r = jv_bool(n->op ? !t : t);
        break;
    }
    case JN_NEG:
    case JN_POS: {
        struct jv v = jeval(c, n->a, f);
        if (!is_num(v)) {
            if (v.type == JV_UNDEF) jfail_undefined(c, v, n->off);
            jfail(c, FERRY_ERR_INVALID, n->off, "bad operand type for unary %c: '%s'",
                  n->kind == JN_NEG ? '-' : '+', jv_type_name(v));
        }
        if (n->kind == JN_POS)
            r = v.type == JV_BOOL ? jv_int(v.i) : v;
        else if (v.type == JV_FLOAT)
            r = jv_float(-v.f);
        else if (v.i == INT64_MIN)
            jfail(c, FERRY_ERR_RANGE, n->off, "integer overflow");
        else
            r = jv_int(-v.i);
        break;
    }
    case JN_NOT:
        r = jv_bool(!jv_truthy(jeval(c, n->a, f)));
        break;
    case JN_AND: {
        struct jv a = jeval(c, n->a, f);
        r = jv_truthy(a) ? jeval(c, n->b, f) : a;
        break;
    }
    case JN_OR: {
        struct jv a = jeval(c, n->a, f);
        r = jv_truthy(a) ? a : jeval(c, n->b, f);
        break;
    }
    case JN_BIN: {
        struct jv a = jeval(c, n->a, f);
        r = binary(c, n->op, a, jeval(c, n->b, f), n->off);
        break;
    }
    case JN_CMP: {
        struct jv a = jeval(c, n->a, f);
        r = jv_bool(compare(c, n->op, a, jeval(c, n->b, f), n->off));
        break;
    }
    case JN_COND:
        if (jv_truthy(jeval(c, n->a, f)))
            r = jeval(c, n->b, f);
        else
            r = n->c ? jeval(c, n->c, f) : jv_undef(NULL, 0);
        break;
    case JN_LIST:
    case JN_TUPLE:
        r = jv_list(c, (size_t)n->nkids);
        r.l->tuple = n->kind == JN_TUPLE;
        for (int i = 0; i < n->nkids; i++) jlist_push(c, r.l, jeval(c, n->kids[i], f));
        break;
    case JN_DICT:
        r = jv_dict(c, (size_t)n->nkids / 2);
        for (int i = 0; i + 1 < n->nkids; i += 2) {
            struct jv k = jeval(c, n->kids[i], f);
            if (k.type == JV_LIST || k.type == JV_DICT || k.type == JV_UNDEF)
                jfail(c, FERRY_ERR_INVALID, n->kids[i]->off, "unhashable dict key of type '%s'",
                      jv_type_name(k));
            jdict_set(c, r.d, k, jeval(c, n->kids[i + 1], f));
        }
        break;
    default:
        jfail(c, FERRY_ERR_INTERNAL, n->off, "bad expression node %d", n->kind);
    }
    c->depth--;
    return r;
}

/* ---- statements ----------------------------------------------------------------------------------- */

static void bind_targets(struct jctx *c, struct jframe *f, const struct jv *names, int nnames, struct jv v,
                         size_t off)
{
    if (nnames == 1) {
        frame_set(c, f, names[0], v);
        return;
    }
    struct jlist *l = v.type == JV_LIST ? v.l : NULL;
    if (!l && (v.type == JV_DICT || v.type == JV_STR)) l = jv_iter_list(c, v, off);
    if (!l || l->n != (size_t)nnames)
        jfail(c, FERRY_ERR_INVALID, off, "cannot unpack '%s' into %d names", jv_type_name(v), nnames);
    for (int i = 0; i < nnames; i++) frame_set(c, f, names[i], l->v[i]);
}

static void render_for(struct jctx *c, const struct jnode *n, struct jframe *f)
{
    struct jlist *items = jv_iter_list(c, jeval(c, n->a, f), n->a->off);
    struct jframe frame = {.parent = f};
    if (n->d) { /* `for x in y if cond`: filter first, so loop.length counts what is rendered */
        struct jv kept = jv_list(c, 0);
        for (size_t i = 0; i < items->n; i++) {
            frame.vars.n = 0;
            bind_targets(c, &frame, n->names, n->nnames, items->v[i], n->off);
            if (jv_truthy(jeval(c, n->d, &frame))) jlist_push(c, kept.l, items->v[i]);
        }
        items = kept.l;
    }
    struct jloop *loop = jalloc(c, sizeof *loop);
    *loop = (struct jloop){.length = (int64_t)items->n, .items = items};
    for (size_t i = 0; i < items->n; i++) {
        tick(c, n->off);
        c->depth--;
        frame.vars.n = 0; /* a fresh scope per iteration, reusing its storage */
        loop->index0 = (int64_t)i;
        bind_targets(c, &frame, n->names, n->nnames, items->v[i], n->off);
        frame_set(c, &frame, jv_str("loop", 4), (struct jv){.type = JV_LOOP, .loop = loop});
        jrender(c, n->b, &frame);
        if (c->flow == 1) {
            c->flow = 0;
            break;
        }
        c->flow = 0;
    }
    if (items->n == 0 && n->c) jrender(c, n->c, f);
}

static void render_set(struct jctx *c, const struct jnode *n, struct jframe *f)
{
    struct jv v;
    if (n->a) {
        v = jeval(c, n->a, f);
    } else {
        struct jbuf buf = {0}, *saved = c->out;
        c->out = &buf;
        jrender(c, n->b, f);
        c->out = saved;
        v = jbuf_take(&buf);
    }
    if (n->op) {
        struct jv ns = jframe_lookup(f, n->names[0].s.p, n->names[0].s.n);
        if (ns.type != JV_NS)
            jfail(c, FERRY_ERR_INVALID, n->off, "cannot assign attribute on non-namespace object '%.*s'",
                  (int)n->names[0].s.n, n->names[0].s.p);
        jdict_set(c, ns.d, n->val, v);
        return;
    }
    bind_targets(c, f, n->names, n->nnames, v, n->off);
}

void jrender(struct jctx *c, const struct jnode *n, struct jframe *f)
{
    tick(c, n->off);
    switch (n->kind) {
    case JN_BODY:
        for (int i = 0; i < n->nkids && !c->flow; i++) jrender(c, n->kids[i], f);
        break;
    case JN_TEXT:
        jbuf_put(c, c->out, n->val.s.p, n->val.s.n);
        break;
    case JN_OUTPUT:
        jv_write_str(c, c->out, jeval(c, n->a, f));
        break;
    case JN_IF:
        if (jv_truthy(jeval(c, n->a, f)))
            jrender(c, n->b, f);
        else if (n->c)
            jrender(c, n->c, f);
        break;
    case JN_FOR:
        render_for(c, n, f);
        break;
    case JN_SET:
        render_set(c, n, f);
        break;
    case JN_MACRO:
        frame_set(c, f, n->val, (struct jv){.type = JV_MACRO, .m = n});
        break;
    case JN_FILTERBLOCK: {
        struct jbuf buf = {0}, *saved = c->out;
        c->out = &buf;
        jrender(c, n->b, f);
        c->out = saved;
        struct jframe frame = {.parent = f};
        frame_set(c, &frame, jv_str(FILTER_BODY_VAR, sizeof FILTER_BODY_VAR - 1), jbuf_take(&buf));
        jv_write_str(c, c->out, jeval(c, n->a, &frame));
        break;
    }
    case JN_BREAK:
        c->flow = 1;
        break;
    case JN_CONTINUE:
        c->flow = 2;
        break;
    default:
        jfail(c, FERRY_ERR_INTERNAL, n->off, "bad statement node %d", n->kind);
    }
    c->depth--;
}

void jinja_render(struct jctx *c, const struct jnode *body)
{
    jrender(c, body, c->root);
}
