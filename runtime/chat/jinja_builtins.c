/* jinja_builtins — filters, tests, str/dict methods and global functions of the chat-template subset.
 *
 * Each follows the Jinja2 / Python behaviour that HF's apply_chat_template exposes (sandboxed: no
 * mutating list methods). Case mapping is ASCII-only; whitespace stripping knows Unicode spaces.
 * An unknown filter, test or method is FERRY_ERR_UNSUPPORTED naming it and its byte offset.
 */
#include "runtime/chat/jinja_eval.h"

#include "kernels/core/status.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define NAME_IS(s) (n == sizeof(s) - 1 && memcmp(name, s, n) == 0)

/* ---- arguments ------------------------------------------------------------------------------------ */

/* Argument i (positional) or keyword kw; returns 0 when absent. */
static int argp(const struct jargs *A, int i, const char *kw, struct jv *out)
{
    if (i >= 0 && i < A->npos) {
        *out = A->pos[i];
        return 1;
    }
    if (kw)
        for (int k = 0; k < A->nkw; k++)
            if (A->kwn[k].s.n == strlen(kw) && memcmp(A->kwn[k].s.p, kw, A->kwn[k].s.n) == 0) {
                *out = A->kwv[k];
                return 1;
            }
    return 0;
}

static struct jv arg_or(const struct jargs *A, int i, const char *kw, struct jv dflt)
{
    struct jv v;
    return argp(A, i, kw, &v) ? v : dflt;
}

static struct jv want_str(struct jctx *c, struct jv v, const char *what, size_t off)
{
    if (v.type != JV_STR) {
        if (v.type == JV_UNDEF) jfail_undefined(c, v, off);
        jfail(c, FERRY_ERR_INVALID, off, "%s expects a string, got '%s'", what, jv_type_name(v));
    }
    return v;
}

static int64_t want_int(struct jctx *c, struct jv v, const char *what, size_t off)
{
    if (v.type != JV_INT && v.type != JV_BOOL)
        jfail(c, FERRY_ERR_INVALID, off, "%s expects an integer, got '%s'", what, jv_type_name(v));
    return v.i;
}

/* ---- string helpers ------------------------------------------------------------------------------- */

static int in_chars(int cp, struct jv chars)
{
    size_t i = 0, adv;
    while (i < chars.s.n) {
        if (jutf8_decode(chars.s.p + i, chars.s.n - i, &adv) == cp) return 1;
        i += adv;
    }
    return 0;
}

/* Python str.strip/lstrip/rstrip; chars NONE = whitespace. */
static struct jv str_strip(struct jv s, struct jv chars, int left, int right)
{
    size_t a = 0, b = s.s.n, adv;
    int use_chars = chars.type == JV_STR;
    if (left)
        while (a < b) {
            int cp = jutf8_decode(s.s.p + a, b - a, &adv);
            if (use_chars ? !in_chars(cp, chars) : !jis_space(cp)) break;
            a += adv;
        }
    if (right)
        while (b > a) {
            size_t k = b - 1;
            while (k > a && ((unsigned char)s.s.p[k] & 0xc0) == 0x80) k--;
            int cp = jutf8_decode(s.s.p + k, b - k, &adv);
            if (k + adv != b) cp = (unsigned char)s.s.p[b - 1], k = b - 1;
            if (use_chars ? !in_chars(cp, chars) : !jis_space(cp)) break;
            b = k;
        }
    return jv_str(s.s.p + a, b - a);
}

static char up(char ch)
{
    return ch >= 'a' && ch <= 'z' ? (char)(ch - 32) : ch;
}
static char low(char ch)
{
    return ch >= 'A' && ch <= 'Z' ? (char)(ch + 32) : ch;
}
static int alpha(char ch)
{
    return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z');
}

enum casing { CASE_UPPER, CASE_LOWER, CASE_CAPITALIZE, CASE_PYTITLE, CASE_JTITLE };

static struct jv str_case(struct jctx *c, struct jv s, int mode)
{
    char *p = jalloc(c, s.s.n + 1);
    int prev_cased = 0, word_start = 1;
    for (size_t i = 0; i < s.s.n; i++) {
        char ch = s.s.p[i];
        switch (mode) {
        case CASE_UPPER:
            p[i] = up(ch);
            break;
        case CASE_LOWER:
            p[i] = low(ch);
            break;
        case CASE_CAPITALIZE:
            p[i] = i == 0 ? up(ch) : low(ch);
            break;
        case CASE_PYTITLE: /* str.title(): a cased letter after an uncased character starts a word */
            p[i] = prev_cased ? low(ch) : up(ch);
            prev_cased = alpha(ch);
            break;
        default: { /* Jinja's title filter: words start after -, whitespace, ( { [ < */
            int sep = ch == '-' || ch == ' ' || ch == '\t' || ch == '\n' || ch == '\r' || ch == '\f' ||
                      ch == '\v' || ch == '(' || ch == '{' || ch == '[' || ch == '<';
            p[i] = sep ? ch : word_start ? up(ch) : low(ch);
            word_start = sep;
        }
        }
    }
    return jv_str(p, s.s.n);
}

static struct jv str_replace(struct jctx *c, struct jv s, struct jv old, struct jv new_, int64_t count)
{
    struct jbuf b = {0};
    size_t i = 0;
    int64_t done = 0;
    if (old.s.n == 0) { /* Python inserts `new` between every character */
        size_t adv;
        while (count < 0 || done < count) {
            jbuf_put(c, &b, new_.s.p, new_.s.n);
            done++;
            if (i >= s.s.n) break;
            jutf8_decode(s.s.p + i, s.s.n - i, &adv);
            jbuf_put(c, &b, s.s.p + i, adv);
            i += adv;
        }
        jbuf_put(c, &b, s.s.p + i, s.s.n - i);
        return jbuf_take(&b);
    }
    while (i < s.s.n && (count < 0 || done < count)) {
        const char *hit = memmem(s.s.p + i, s.s.n - i, old.s.p, old.s.n);
        if (!hit) break;
        size_t k = (size_t)(hit - s.s.p);
        jbuf_put(c, &b, s.s.p + i, k - i);
        jbuf_put(c, &b, new_.s.p, new_.s.n);
        i = k + old.s.n;
        done++;
    }
    jbuf_put(c, &b, s.s.p + i, s.s.n - i);
    return jbuf_take(&b);
}

static struct jv str_split(struct jctx *c, struct jv s, struct jv sep, int64_t maxsplit, size_t off)
{
    struct jv out = jv_list(c, 0);
    size_t i = 0, n = s.s.n, adv;
    int64_t splits = 0;
    if (sep.type == JV_STR) {
        if (sep.s.n == 0) jfail(c, FERRY_ERR_INVALID, off, "empty separator");
        for (;;) {
            const char *hit =
                (maxsplit < 0 || splits < maxsplit) ? memmem(s.s.p + i, n - i, sep.s.p, sep.s.n) : NULL;
            if (!hit) {
                jlist_push(c, out.l, jv_str(s.s.p + i, n - i));
                return out;
            }
            size_t k = (size_t)(hit - s.s.p);
            jlist_push(c, out.l, jv_str(s.s.p + i, k - i));
            i = k + sep.s.n;
            splits++;
        }
    }
    for (;;) { /* whitespace runs; no empty strings */
        while (i < n && jis_space(jutf8_decode(s.s.p + i, n - i, &adv))) i += adv;
        if (i >= n) return out;
        if (maxsplit >= 0 && splits >= maxsplit) {
            size_t e = n;
            while (e > i) { /* Python strips trailing whitespace from the remainder */
                size_t k = e - 1;
                while (k > i && ((unsigned char)s.s.p[k] & 0xc0) == 0x80) k--;
                if (!jis_space(jutf8_decode(s.s.p + k, e - k, &adv))) break;
                e = k;
            }
            jlist_push(c, out.l, jv_str(s.s.p + i, e - i));
            return out;
        }
        size_t st = i;
        while (i < n && !jis_space(jutf8_decode(s.s.p + i, n - i, &adv))) i += adv;
        jlist_push(c, out.l, jv_str(s.s.p + st, i - st));
        splits++;
    }
}

static int str_affix(struct jctx *c, struct jv s, struct jv affix, int end, size_t off)
{
    if (affix.type == JV_LIST) {
        for (size_t i = 0; i < affix.l->n; i++)
            if (str_affix(c, s, affix.l->v[i], end, off)) return 1;
        return 0;
    }
    want_str(c, affix, end ? "endswith" : "startswith", off);
    if (affix.s.n > s.s.n) return 0;
    return memcmp(s.s.p + (end ? s.s.n - affix.s.n : 0), affix.s.p, affix.s.n) == 0;
}

static struct jv join(struct jctx *c, struct jlist *l, struct jv sep, struct jv attr, size_t off)
{
    struct jbuf b = {0};
    for (size_t i = 0; i < l->n; i++) {
        if (i) jv_write_str(c, &b, sep);
        struct jv item = l->v[i];
        if (attr.type == JV_STR) item = jv_getitem(c, item, attr, off);
        jv_write_str(c, &b, item);
    }
    return jbuf_take(&b);
}

static struct jv items_of(struct jctx *c, struct jv d, size_t off)
{
    if (d.type == JV_UNDEF) return jv_list(c, 0);
    if (d.type != JV_DICT && d.type != JV_NS)
        jfail(c, FERRY_ERR_INVALID, off, "items expects a mapping, got '%s'", jv_type_name(d));
    struct jv out = jv_list(c, d.d->n);
    for (size_t i = 0; i < d.d->n; i++) {
        struct jv pair = jv_list(c, 2);
        pair.l->tuple = 1;
        jlist_push(c, pair.l, d.d->k[i]);
        jlist_push(c, pair.l, d.d->v[i]);
        jlist_push(c, out.l, pair);
    }
    return out;
}

/* ---- methods -------------------------------------------------------------------------------------- */

/* Python's str.format with plain fields: {}, {0}, {name}, {{ and }}; conversions (!r), attribute or item
 * fields and format specs are outside the subset. */
static struct jv str_format(struct jctx *c, struct jv fmt, const struct jargs *A)
{
    struct jbuf b = {0};
    int auto_idx = 0, manual = 0;
    const char *p = fmt.s.p, *end = fmt.s.p + fmt.s.n;
    while (p < end) {
        if (*p == '}') {
            if (p + 1 < end && p[1] == '}') {
                jbuf_putc(c, &b, '}');
                p += 2;
                continue;
            }
            jfail(c, FERRY_ERR_INVALID, A->off, "Single '}' encountered in format string");
        }
        if (*p != '{') {
            jbuf_putc(c, &b, *p++);
            continue;
        }
        if (p + 1 < end && p[1] == '{') {
            jbuf_putc(c, &b, '{');
            p += 2;
            continue;
        }
        const char *q = memchr(p, '}', (size_t)(end - p));
        if (!q) jfail(c, FERRY_ERR_INVALID, A->off, "Single '{' encountered in format string");
        const char *f = p + 1;
        size_t fl = (size_t)(q - f);
        for (size_t i = 0; i < fl; i++)
            if (f[i] == '!' || f[i] == ':' || f[i] == '.' || f[i] == '[' || f[i] == '{')
                jfail(c, FERRY_ERR_UNSUPPORTED, A->off, "unsupported str.format field '{%.*s}'",
                      (int)(fl > 40 ? 40 : fl), f);
        struct jv v;
        if (fl == 0 || (f[0] >= '0' && f[0] <= '9')) {
            long idx;
            if (fl == 0) {
                if (manual)
                    jfail(c, FERRY_ERR_INVALID, A->off,
                          "cannot switch from manual field specification to automatic field numbering");
                idx = auto_idx++;
            } else {
                if (auto_idx)
                    jfail(c, FERRY_ERR_INVALID, A->off,
                          "cannot switch from automatic field numbering to manual field specification");
                manual = 1;
                idx = 0;
                for (size_t i = 0; i < fl; i++) {
                    if (f[i] < '0' || f[i] > '9' || idx > 100000)
                        jfail(c, FERRY_ERR_INVALID, A->off, "bad str.format field '{%.*s}'",
                              (int)(fl > 40 ? 40 : fl), f);
                    idx = idx * 10 + (f[i] - '0');
                }
            }
            if (idx >= A->npos)
                jfail(c, FERRY_ERR_INVALID, A->off,
                      "Replacement index %ld out of range for positional args tuple", idx);
            v = A->pos[idx];
        } else {
            int found = 0;
            for (int k = 0; k < A->nkw && !found; k++)
                if (A->kwn[k].s.n == fl && !memcmp(A->kwn[k].s.p, f, fl)) v = A->kwv[k], found = 1;
            if (!found) jfail(c, FERRY_ERR_INVALID, A->off, "KeyError: '%.*s'", (int)(fl > 40 ? 40 : fl), f);
        }
        jv_write_str(c, &b, v);
        p = q + 1;
    }
    return jbuf_take(&b);
}

int jcall_method(struct jctx *c, struct jv obj, const char *name, size_t n, const struct jargs *A,
                 struct jv *out)
{
    jcharge(c, jv_cost(obj));
    size_t off = A->off;
    struct jv a0 = arg_or(A, 0, NULL, jv_none()), a1 = arg_or(A, 1, NULL, jv_none());
    if (obj.type == JV_STR) {
        if (NAME_IS("strip") || NAME_IS("lstrip") || NAME_IS("rstrip")) {
            if (a0.type != JV_NONE) want_str(c, a0, "strip", off);
            *out = str_strip(obj, a0, name[0] != 'r', name[0] != 'l');
        } else if (NAME_IS("upper"))
            *out = str_case(c, obj, CASE_UPPER);
        else if (NAME_IS("lower"))
            *out = str_case(c, obj, CASE_LOWER);
        else if (NAME_IS("capitalize"))
            *out = str_case(c, obj, CASE_CAPITALIZE);
        else if (NAME_IS("title"))
            *out = str_case(c, obj, CASE_PYTITLE);
        else if (NAME_IS("startswith"))
            *out = jv_bool(str_affix(c, obj, a0, 0, off));
        else if (NAME_IS("endswith"))
            *out = jv_bool(str_affix(c, obj, a0, 1, off));
        else if (NAME_IS("split")) {
            struct jv sep = arg_or(A, 0, "sep", jv_none());
            if (sep.type != JV_NONE) want_str(c, sep, "split", off);
            *out =
                str_split(c, obj, sep, want_int(c, arg_or(A, 1, "maxsplit", jv_int(-1)), "split", off), off);
        } else if (NAME_IS("replace")) {
            want_str(c, a0, "replace", off);
            want_str(c, a1, "replace", off);
            *out =
                str_replace(c, obj, a0, a1, want_int(c, arg_or(A, 2, "count", jv_int(-1)), "replace", off));
        } else if (NAME_IS("join")) {
            *out = join(c, jv_iter_list(c, a0, off), obj, jv_none(), off);
        } else if (NAME_IS("format")) {
            *out = str_format(c, obj, A);
        } else if (NAME_IS("find") || NAME_IS("count")) {
            want_str(c, a0, "find", off);
            int64_t found = -1, cnt = 0;
            size_t i = 0;
            while (i <= obj.s.n) {
                const char *hit = a0.s.n ? memmem(obj.s.p + i, obj.s.n - i, a0.s.p, a0.s.n) : obj.s.p + i;
                if (!hit) break;
                if (found < 0) found = (int64_t)jutf8_len(obj.s.p, (size_t)(hit - obj.s.p));
                cnt++;
                i = (size_t)(hit - obj.s.p) + (a0.s.n ? a0.s.n : 1);
                if (name[0] == 'f') break;
            }
            *out = jv_int(name[0] == 'f' ? found : cnt);
        } else {
            return 0;
        }
        return 1;
    }
    if (obj.type == JV_DICT) {
        if (NAME_IS("get")) {
            struct jv *v = jdict_get(obj.d, a0);
            *out = v ? *v : a1;
        } else if (NAME_IS("items"))
            *out = items_of(c, obj, off);
        else if (NAME_IS("keys"))
            *out = (struct jv){.type = JV_LIST, .l = jv_iter_list(c, obj, off)};
        else if (NAME_IS("values")) {
            *out = jv_list(c, obj.d->n);
            for (size_t i = 0; i < obj.d->n; i++) jlist_push(c, out->l, obj.d->v[i]);
        } else {
            return 0;
        }
        return 1;
    }
    if (obj.type == JV_LOOP && NAME_IS("cycle")) {
        if (A->npos == 0) jfail(c, FERRY_ERR_INVALID, off, "no items for cycling given");
        *out = A->pos[obj.loop->index0 % A->npos];
        return 1;
    }
    return 0;
}

/* ---- globals -------------------------------------------------------------------------------------- */

struct jv jcall_global(struct jctx *c, int fn, const struct jargs *A)
{
    size_t off = A->off;
    switch (fn) {
    case JF_RANGE: {
        int64_t start = 0, stop, step = 1;
        if (A->npos < 1 || A->npos > 3) jfail(c, FERRY_ERR_INVALID, off, "range expects 1 to 3 arguments");
        if (A->npos == 1) {
            stop = want_int(c, A->pos[0], "range", off);
        } else {
            start = want_int(c, A->pos[0], "range", off);
            stop = want_int(c, A->pos[1], "range", off);
            if (A->npos == 3) step = want_int(c, A->pos[2], "range", off);
        }
        if (step == 0) jfail(c, FERRY_ERR_INVALID, off, "range() arg 3 must not be zero");
        double count = ceil(((double)stop - (double)start) / (double)step);
        if (count > 100000)
            jfail(c, FERRY_ERR_RANGE, off, "range too big (%.0f items, the limit is 100000)", count);
        struct jv out = jv_list(c, count > 0 ? (size_t)count : 0);
        for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) jlist_push(c, out.l, jv_int(i));
        return out;
    }
    case JF_NAMESPACE:
    case JF_DICT: {
        struct jv d = jv_dict(c, (size_t)A->nkw);
        if (A->npos > 1) jfail(c, FERRY_ERR_INVALID, off, "expected at most 1 positional argument");
        if (A->npos == 1) {
            if (A->pos[0].type != JV_DICT) jfail(c, FERRY_ERR_INVALID, off, "expected a mapping argument");
            for (size_t i = 0; i < A->pos[0].d->n; i++)
                jdict_set(c, d.d, A->pos[0].d->k[i], A->pos[0].d->v[i]);
        }
        for (int k = 0; k < A->nkw; k++) jdict_set(c, d.d, A->kwn[k], A->kwv[k]);
        if (fn == JF_NAMESPACE) d.type = JV_NS;
        return d;
    }
    case JF_RAISE: {
        struct jv msg = jv_to_str(c, arg_or(A, 0, NULL, jv_str("", 0)));
        jfail(c, FERRY_ERR_INVALID, JNO_OFF, "%.*s", (int)(msg.s.n > 250 ? 250 : msg.s.n), msg.s.p);
    }
    case JF_STRFTIME: {
        struct jv fmt = want_str(c, arg_or(A, 0, NULL, jv_undef(NULL, 0)), "strftime_now", off);
        char *f = jstrdup(c, fmt.s.p, fmt.s.n);
        time_t now = time(NULL);
        struct tm tm;
        localtime_r(&now, &tm);
        char *buf = jalloc(c, 512);
        size_t len = strftime(buf, 512, f, &tm);
        return jv_str(buf, len);
    }
    }
    jfail(c, FERRY_ERR_INTERNAL, off, "bad builtin %d", fn);
}

/* ---- tests ---------------------------------------------------------------------------------------- */

int japply_test(struct jctx *c, const char *name, size_t n, struct jv v, const struct jargs *A)
{
    size_t off = A->off;
    struct jv a0 = arg_or(A, 0, NULL, jv_undef(NULL, 0));
    if (NAME_IS("defined")) return v.type != JV_UNDEF;
    if (NAME_IS("undefined")) return v.type == JV_UNDEF;
    if (NAME_IS("none")) return v.type == JV_NONE;
    if (NAME_IS("string")) return v.type == JV_STR;
    if (NAME_IS("number")) return v.type == JV_INT || v.type == JV_FLOAT || v.type == JV_BOOL;
    if (NAME_IS("integer")) return v.type == JV_INT;
    if (NAME_IS("float")) return v.type == JV_FLOAT;
    if (NAME_IS("boolean")) return v.type == JV_BOOL;
    if (NAME_IS("true")) return v.type == JV_BOOL && v.i;
    if (NAME_IS("false")) return v.type == JV_BOOL && !v.i;
    if (NAME_IS("sequence")) /* Jinja: has len() and [] -- Undefined does */
        return v.type == JV_STR || (v.type == JV_LIST && !v.l->gen) || v.type == JV_DICT ||
               v.type == JV_UNDEF;
    if (NAME_IS("mapping")) return v.type == JV_DICT;
    if (NAME_IS("iterable"))
        return v.type == JV_STR || v.type == JV_LIST || v.type == JV_DICT || v.type == JV_UNDEF;
    if (NAME_IS("callable")) return v.type == JV_FUNC || v.type == JV_MACRO;
    if (NAME_IS("equalto") || NAME_IS("eq") || NAME_IS("==") || NAME_IS("sameas")) return jv_equal(v, a0);
    if (NAME_IS("ne") || NAME_IS("!=")) return !jv_equal(v, a0);
    if (NAME_IS("lt") || NAME_IS("lessthan") || NAME_IS("<")) return jv_compare(c, v, a0, off) < 0;
    if (NAME_IS("le") || NAME_IS("<=")) return jv_compare(c, v, a0, off) <= 0;
    if (NAME_IS("gt") || NAME_IS("greaterthan") || NAME_IS(">")) return jv_compare(c, v, a0, off) > 0;
    if (NAME_IS("ge") || NAME_IS(">=")) return jv_compare(c, v, a0, off) >= 0;
    if (NAME_IS("in")) return jv_contains(c, a0, v, off);
    if ((NAME_IS("odd") || NAME_IS("even")) && v.type == JV_FLOAT) {
        double m = fmod(v.f, 2.0);
        if (m < 0) m += 2.0;
        return NAME_IS("odd") ? m == 1.0 : m == 0.0;
    }
    if (NAME_IS("odd") || NAME_IS("even") || NAME_IS("divisibleby")) {
        int64_t x = want_int(c, v, "test odd/even/divisibleby", off);
        if (NAME_IS("odd")) return x % 2 != 0;
        if (NAME_IS("even")) return x % 2 == 0;
        int64_t d = want_int(c, a0, "test divisibleby", off);
        if (d == 0) jfail(c, FERRY_ERR_INVALID, off, "division by zero");
        return d == -1 || x % d == 0;
    }
    if (NAME_IS("lower") || NAME_IS("upper")) {
        if (v.type != JV_STR) return 0;
        for (size_t i = 0; i < v.s.n; i++)
            if (NAME_IS("lower") ? (v.s.p[i] >= 'A' && v.s.p[i] <= 'Z')
                                 : (v.s.p[i] >= 'a' && v.s.p[i] <= 'z'))
                return 0;
        return 1;
    }
    jfail(c, FERRY_ERR_UNSUPPORTED, off, "unsupported test '%.*s'", (int)(n > 40 ? 40 : n), name);
}

/* ---- filters -------------------------------------------------------------------------------------- */

/* select/reject/selectattr/rejectattr: args after `skip` are (test name, test args...). */
static struct jv select_items(struct jctx *c, struct jv seq, const struct jargs *A, int skip, struct jv attr,
                              int keep)
{
    struct jv out = jv_list(c, 0);
    out.l->gen = 1;
    if (!jv_truthy(seq)) return out; /* Jinja's `if seq:` — none selects nothing */
    struct jlist *l = jv_iter_list(c, seq, A->off);
    struct jargs TA = {.off = A->off};
    if (A->npos > skip + 1) {
        TA.pos = A->pos + skip + 1;
        TA.npos = A->npos - skip - 1;
    }
    for (size_t i = 0; i < l->n; i++) {
        struct jv item = attr.type == JV_STR ? jv_getitem(c, l->v[i], attr, A->off) : l->v[i];
        int t;
        if (A->npos > skip) {
            struct jv tn = want_str(c, A->pos[skip], "select", A->off);
            t = japply_test(c, tn.s.p, tn.s.n, item, &TA);
        } else {
            t = jv_truthy(item);
        }
        if (t == keep) jlist_push(c, out.l, l->v[i]);
    }
    out.l->gen = 1;
    return out;
}

static struct jv to_int(struct jctx *c, struct jv v, struct jv dflt)
{
    if (v.type == JV_INT || v.type == JV_BOOL) return jv_int(v.i);
    if (v.type == JV_FLOAT) {
        if (!(fabs(v.f) < 9.2e18)) return dflt;
        return jv_int((int64_t)v.f);
    }
    if (v.type == JV_STR) {
        struct jv s = str_strip(v, jv_none(), 1, 1);
        char *z = jstrdup(c, s.s.p, s.s.n), *end;
        if (!*z) return dflt;
        long long x = strtoll(z, &end, 10);
        if (*end == 0) return jv_int(x);
        double f = strtod(z, &end);
        if (*end == 0 && fabs(f) < 9.2e18) return jv_int((int64_t)f);
    }
    return dflt;
}

static struct jv do_indent(struct jctx *c, struct jv s, const struct jargs *A)
{
    struct jv w = arg_or(A, 0, "width", jv_int(4));
    struct jv pad;
    if (w.type == JV_STR) {
        pad = w;
    } else {
        int64_t k = want_int(c, w, "indent", A->off);
        if (k < 0) k = 0;
        if (k > 1000) jfail(c, FERRY_ERR_RANGE, A->off, "indent width too large");
        char *p = jalloc(c, (size_t)k + 1);
        memset(p, ' ', (size_t)k);
        pad = jv_str(p, (size_t)k);
    }
    int first = jv_truthy(arg_or(A, 1, "first", jv_bool(0))),
        blank = jv_truthy(arg_or(A, 2, "blank", jv_bool(0)));
    struct jbuf b = {0};
    size_t i = 0;
    int line = 0;
    while (i <= s.s.n) {
        const char *nl = memchr(s.s.p + i, '\n', s.s.n - i);
        size_t e = nl ? (size_t)(nl - s.s.p) : s.s.n;
        int is_blank = 1;
        for (size_t k = i; k < e; k++) is_blank &= s.s.p[k] == ' ' || s.s.p[k] == '\t' || s.s.p[k] == '\r';
        if ((line > 0 || first) && (blank || !is_blank)) jbuf_put(c, &b, pad.s.p, pad.s.n);
        jbuf_put(c, &b, s.s.p + i, e - i);
        if (!nl) break;
        jbuf_putc(c, &b, '\n');
        i = e + 1;
        line++;
    }
    return jbuf_take(&b);
}

/* sort/unique/min/max compare keys: the item or its attribute, strings lower-cased unless case_sensitive. */
static struct jv sort_key(struct jctx *c, struct jv item, struct jv attr, int case_sensitive, size_t off)
{
    struct jv k = attr.type == JV_STR ? jv_getitem(c, item, attr, off) : item;
    if (k.type == JV_STR && !case_sensitive) k = str_case(c, k, CASE_LOWER);
    return k;
}

/* Stable merge sort of (key, item) pairs by key; O(n log n) so large lists stay cheap. */
static void merge_sort(struct jctx *c, struct jv *keys, struct jv *items, struct jv *tk, struct jv *ti,
                       size_t n, int reverse, size_t off)
{
    if (n < 2) return;
    size_t h = n / 2;
    merge_sort(c, keys, items, tk, ti, h, reverse, off);
    merge_sort(c, keys + h, items + h, tk, ti, n - h, reverse, off);
    size_t i = 0, j = h, k = 0;
    while (i < h || j < n) {
        int take_left = j >= n;
        if (i < h && j < n) {
            int r = jv_compare(c, keys[i], keys[j], off);
            take_left = reverse ? r >= 0 : r <= 0;
        } else if (i < h) {
            take_left = 1;
        }
        size_t from = take_left ? i++ : j++;
        tk[k] = keys[from];
        ti[k++] = items[from];
    }
    memcpy(keys, tk, n * sizeof *keys);
    memcpy(items, ti, n * sizeof *items);
}

static struct jv do_sort(struct jctx *c, struct jv v, const struct jargs *A, int reverse_pos, int cs_pos,
                         int attr_pos)
{
    struct jlist *l = jv_iter_list(c, v, A->off);
    int reverse = reverse_pos >= 0 && jv_truthy(arg_or(A, reverse_pos, "reverse", jv_bool(0)));
    int cs = jv_truthy(arg_or(A, cs_pos, "case_sensitive", jv_bool(0)));
    struct jv attr = arg_or(A, attr_pos, "attribute", jv_none());
    size_t n = l->n;
    struct jv out = jv_list(c, n);
    struct jv *keys = jalloc(c, (n + 1) * sizeof *keys), *tk = jalloc(c, (n + 1) * sizeof *tk);
    struct jv *ti = jalloc(c, (n + 1) * sizeof *ti);
    for (size_t i = 0; i < n; i++) {
        keys[i] = sort_key(c, l->v[i], attr, cs, A->off);
        out.l->v[i] = l->v[i];
    }
    out.l->n = n;
    for (size_t m = n; m > 1; m /= 2) jcharge(c, n); /* n log n comparisons */
    merge_sort(c, keys, out.l->v, tk, ti, n, reverse, A->off);
    return out;
}

/* dictsort(case_sensitive=False, by='key', reverse=False): the (key, value) pairs sorted by key or value. */
static struct jv dictsort(struct jctx *c, struct jv d, const struct jargs *A)
{
    if (d.type != JV_DICT && d.type != JV_NS)
        jfail(c, FERRY_ERR_INVALID, A->off, "dictsort: '%s' is not a mapping", jv_type_name(d));
    int cs = jv_truthy(arg_or(A, 0, "case_sensitive", jv_bool(0)));
    struct jv by = arg_or(A, 1, "by", jv_str("key", 3));
    int reverse = jv_truthy(arg_or(A, 2, "reverse", jv_bool(0)));
    int pos;
    if (by.type == JV_STR && by.s.n == 3 && !memcmp(by.s.p, "key", 3))
        pos = 0;
    else if (by.type == JV_STR && by.s.n == 5 && !memcmp(by.s.p, "value", 5))
        pos = 1;
    else
        jfail(c, FERRY_ERR_INVALID, A->off, "You can only sort by either \"key\" or \"value\"");
    struct jv pairs = items_of(c, d, A->off);
    size_t n = pairs.l->n;
    struct jv *keys = jalloc(c, (n + 1) * sizeof *keys), *tk = jalloc(c, (n + 1) * sizeof *tk);
    struct jv *ti = jalloc(c, (n + 1) * sizeof *ti);
    for (size_t i = 0; i < n; i++) keys[i] = sort_key(c, pairs.l->v[i].l->v[pos], jv_none(), cs, A->off);
    for (size_t m = n; m > 1; m /= 2) jcharge(c, n);
    merge_sort(c, keys, pairs.l->v, tk, ti, n, reverse, A->off);
    return pairs;
}

struct jv japply_filter(struct jctx *c, const char *name, size_t n, struct jv v, const struct jargs *A)
{
    jcharge(c, jv_cost(v));
    size_t off = A->off;
    if (NAME_IS("trim") || NAME_IS("strip")) {
        struct jv chars = arg_or(A, 0, "chars", jv_none());
        return str_strip(jv_to_str(c, v), chars, 1, 1);
    }
    if (NAME_IS("upper")) return str_case(c, jv_to_str(c, v), CASE_UPPER);
    if (NAME_IS("lower")) return str_case(c, jv_to_str(c, v), CASE_LOWER);
    if (NAME_IS("capitalize")) return str_case(c, jv_to_str(c, v), CASE_CAPITALIZE);
    if (NAME_IS("title")) return str_case(c, jv_to_str(c, v), CASE_JTITLE);
    if (NAME_IS("length") || NAME_IS("count")) {
        switch (v.type) {
        case JV_STR:
            return jv_int((int64_t)jutf8_len(v.s.p, v.s.n));
        case JV_LIST:
            if (v.l->gen)
                jfail(c, FERRY_ERR_INVALID, off, "object of type 'generator' has no len() (use '| list')");
            return jv_int((int64_t)v.l->n);
        case JV_DICT:
        case JV_NS:
            return jv_int((int64_t)v.d->n);
        case JV_UNDEF:
            return jv_int(0);
        default:
            jfail(c, FERRY_ERR_INVALID, off, "object of type '%s' has no len()", jv_type_name(v));
        }
    }
    if (NAME_IS("first") || NAME_IS("last")) {
        struct jlist *l = jv_iter_list(c, v, off);
        if (l->n == 0) return jv_undef(NULL, 0);
        return name[0] == 'f' ? l->v[0] : l->v[l->n - 1];
    }
    if (NAME_IS("join")) {
        struct jv sep = arg_or(A, 0, "d", jv_str("", 0)), attr = arg_or(A, 1, "attribute", jv_none());
        return join(c, jv_iter_list(c, v, off), sep, attr, off);
    }
    if (NAME_IS("default") || NAME_IS("d")) {
        struct jv dflt = arg_or(A, 0, "default_value", jv_str("", 0));
        int boolean = jv_truthy(arg_or(A, 1, "boolean", jv_bool(0)));
        if (v.type == JV_UNDEF || (boolean && !jv_truthy(v))) return dflt;
        return v;
    }
    if (NAME_IS("replace")) {
        struct jv s = jv_to_str(c, v), old = jv_to_str(c, arg_or(A, 0, "old", jv_str("", 0)));
        struct jv nw = jv_to_str(c, arg_or(A, 1, "new", jv_str("", 0)));
        struct jv cnt = arg_or(A, 2, "count", jv_none());
        return str_replace(c, s, old, nw, cnt.type == JV_NONE ? -1 : want_int(c, cnt, "replace", off));
    }
    if (NAME_IS("tojson")) { /* HF: tojson(x, ensure_ascii=False, indent=None, separators=None,
                                sort_keys=False) */
        struct jjson_opts o = {.indent = -1};
        o.ascii = jv_truthy(arg_or(A, 0, "ensure_ascii", jv_bool(0)));
        struct jv ind = arg_or(A, 1, "indent", jv_none()), seps = arg_or(A, 2, "separators", jv_none());
        if (ind.type == JV_STR) {
            o.indent = 0;
            o.indent_str = ind;
        } else if (ind.type != JV_NONE) {
            int64_t k = want_int(c, ind, "tojson indent", off);
            k = k < 0 ? 0 : k > 64 ? 64 : k;
            o.indent = (int)k;
            o.indent_str =
                jv_str("                                                                ", (size_t)k);
        }
        o.item_sep = jv_str(o.indent >= 0 ? "," : ", ", o.indent >= 0 ? 1 : 2);
        o.key_sep = jv_str(": ", 2);
        if (seps.type != JV_NONE) {
            if (seps.type != JV_LIST || seps.l->n != 2 || seps.l->v[0].type != JV_STR ||
                seps.l->v[1].type != JV_STR)
                jfail(c, FERRY_ERR_INVALID, off, "tojson separators must be a pair of strings");
            o.item_sep = seps.l->v[0];
            o.key_sep = seps.l->v[1];
        }
        o.sort_keys = jv_truthy(arg_or(A, 3, "sort_keys", jv_bool(0)));
        struct jbuf b = {0};
        jv_write_json(c, &b, v, &o, 0, off);
        return jbuf_take(&b);
    }
    if (NAME_IS("string")) return jv_to_str(c, v);
    if (NAME_IS("safe")) { /* Markup: `+` escapes the plain string it meets (jinja_eval.c) */
        struct jv r = jv_to_str(c, v);
        r.markup = 1;
        return r;
    }
    if (NAME_IS("dictsort")) return dictsort(c, v, A);
    if (NAME_IS("int")) return to_int(c, v, arg_or(A, 0, "default", jv_int(0)));
    if (NAME_IS("float")) {
        struct jv dflt = arg_or(A, 0, "default", jv_float(0.0));
        if (v.type == JV_FLOAT) return v;
        if (v.type == JV_INT || v.type == JV_BOOL) return jv_float((double)v.i);
        if (v.type == JV_STR) {
            struct jv s = str_strip(v, jv_none(), 1, 1);
            char *z = jstrdup(c, s.s.p, s.s.n), *end;
            double f = strtod(z, &end);
            if (*z && *end == 0) return jv_float(f);
        }
        return dflt;
    }
    if (NAME_IS("abs")) {
        if (v.type == JV_FLOAT) return jv_float(fabs(v.f));
        int64_t x = want_int(c, v, "abs", off);
        if (x == INT64_MIN) jfail(c, FERRY_ERR_RANGE, off, "integer overflow");
        return jv_int(x < 0 ? -x : x);
    }
    if (NAME_IS("list")) {
        struct jlist *l = jv_iter_list(c, v, off);
        struct jv out = jv_list(c, l->n);
        for (size_t i = 0; i < l->n; i++) jlist_push(c, out.l, l->v[i]);
        return out;
    }
    if (NAME_IS("reverse")) {
        if (v.type == JV_STR) {
            struct jlist *l = jv_iter_list(c, v, off);
            struct jbuf b = {0};
            for (size_t i = l->n; i > 0; i--) jbuf_put(c, &b, l->v[i - 1].s.p, l->v[i - 1].s.n);
            return jbuf_take(&b);
        }
        struct jlist *l = jv_iter_list(c, v, off);
        struct jv out = jv_list(c, l->n);
        for (size_t i = l->n; i > 0; i--) jlist_push(c, out.l, l->v[i - 1]);
        out.l->gen = 1; /* reversed() iterator */
        return out;
    }
    if (NAME_IS("items")) { /* a generator in Jinja */
        struct jv r = items_of(c, v, off);
        r.l->gen = 1;
        return r;
    }
    if (NAME_IS("indent")) return do_indent(c, want_str(c, v, "indent", off), A);
    if (NAME_IS("select") || NAME_IS("reject")) return select_items(c, v, A, 0, jv_none(), name[0] == 's');
    if (NAME_IS("selectattr") || NAME_IS("rejectattr")) {
        struct jv attr = want_str(c, arg_or(A, 0, NULL, jv_undef(NULL, 0)), "selectattr/rejectattr", off);
        return select_items(c, v, A, 1, attr, name[0] == 's');
    }
    if (NAME_IS("map")) {
        if (!jv_truthy(v)) { /* Jinja's `if value:` — none maps to nothing */
            struct jv out = jv_list(c, 0);
            out.l->gen = 1;
            return out;
        }
        struct jlist *l = jv_iter_list(c, v, off);
        struct jv out = jv_list(c, l->n), attr;
        if (argp(A, -1, "attribute", &attr)) {
            struct jv dflt = arg_or(A, -1, "default", jv_undef(NULL, 0));
            for (size_t i = 0; i < l->n; i++) {
                struct jv x = jv_getitem(c, l->v[i], attr, off);
                jlist_push(c, out.l, x.type == JV_UNDEF ? dflt : x);
            }
            out.l->gen = 1;
            return out;
        }
        struct jv fname = want_str(c, arg_or(A, 0, NULL, jv_undef(NULL, 0)), "map", off);
        struct jargs FA = {
            .pos = A->npos > 1 ? A->pos + 1 : NULL, .npos = A->npos > 1 ? A->npos - 1 : 0, .off = off};
        for (size_t i = 0; i < l->n; i++)
            jlist_push(c, out.l, japply_filter(c, fname.s.p, fname.s.n, l->v[i], &FA));
        out.l->gen = 1;
        return out;
    }
    if (NAME_IS("sort")) return do_sort(c, v, A, 0, 1, 2);
    if (NAME_IS("min") || NAME_IS("max")) {
        struct jv sorted = do_sort(c, v, A, -1, 0, 1);
        if (sorted.l->n == 0) return jv_undef(NULL, 0);
        return name[1] == 'i' ? sorted.l->v[0] : sorted.l->v[sorted.l->n - 1];
    }
    if (NAME_IS("unique")) { /* first occurrence wins; a generator in Jinja */
        struct jlist *l = jv_iter_list(c, v, off);
        int cs = jv_truthy(arg_or(A, 0, "case_sensitive", jv_bool(0)));
        struct jv attr = arg_or(A, 1, "attribute", jv_none()), out = jv_list(c, 0), seen = jv_list(c, 0);
        for (size_t i = 0; i < l->n; i++) {
            struct jv k = sort_key(c, l->v[i], attr, cs, off);
            if (k.type == JV_LIST || k.type == JV_DICT)
                jfail(c, FERRY_ERR_INVALID, off, "unhashable type: '%s'", jv_type_name(k));
            if (jv_contains(c, seen, k, off)) continue; /* charges seen.n: quadratic work is bounded */
            jlist_push(c, seen.l, k);
            jlist_push(c, out.l, l->v[i]);
        }
        out.l->gen = 1;
        return out;
    }
    if (NAME_IS("sum")) {
        struct jlist *l = jv_iter_list(c, v, off);
        struct jv attr = arg_or(A, 0, "attribute", jv_none()), acc = arg_or(A, 1, "start", jv_int(0));
        for (size_t i = 0; i < l->n; i++) {
            struct jv x = attr.type == JV_STR ? jv_getitem(c, l->v[i], attr, off) : l->v[i];
            if ((acc.type != JV_INT && acc.type != JV_FLOAT && acc.type != JV_BOOL) ||
                (x.type != JV_INT && x.type != JV_FLOAT && x.type != JV_BOOL))
                jfail(c, FERRY_ERR_INVALID, off, "sum: unsupported operand types '%s' and '%s'",
                      jv_type_name(acc), jv_type_name(x));
            if (acc.type == JV_FLOAT || x.type == JV_FLOAT) {
                acc = jv_float((acc.type == JV_FLOAT ? acc.f : (double)acc.i) +
                               (x.type == JV_FLOAT ? x.f : (double)x.i));
            } else {
                int64_t r;
                if (__builtin_add_overflow(acc.i, x.i, &r))
                    jfail(c, FERRY_ERR_RANGE, off, "integer overflow");
                acc = jv_int(r);
            }
        }
        return acc;
    }
    jfail(c, FERRY_ERR_UNSUPPORTED, off, "unsupported filter '%.*s'", (int)(n > 40 ? 40 : n), name);
}
