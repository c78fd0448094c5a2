/* jinja_parse — lexer and recursive-descent parser for the chat-template Jinja subset.
 *
 * The lexer follows Jinja2's rules with trim_blocks and lstrip_blocks on (as HF renders templates):
 * `{%-`/`{{-`/`{#-` strip all whitespace before the tag, `-%}`/`-}}`/`-#}` all whitespace after it,
 * a block or comment end eats one following newline unless written `+%}`, and spaces/tabs that precede
 * a block or comment tag on its own line are dropped unless the tag opens with `{%+`. The parser builds
 * the AST of jinja.h with Jinja's operator precedence; anything outside the subset fails with
 * FERRY_ERR_UNSUPPORTED naming the construct and its byte offset, malformed input with FERRY_ERR_FORMAT.
 */
#include "runtime/chat/jinja.h"

#include "kernels/core/status.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_PARSE_DEPTH 100

/* ---- lexer ---------------------------------------------------------------------------------------- */

static int is_ws(char ch) { return ch == ' ' || ch == '\t' || ch == '\n' || ch == '\r' || ch == '\f' || ch == '\v'; }
static int is_alpha(char ch) { return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || ch == '_'; }
static int is_digit(char ch) { return ch >= '0' && ch <= '9'; }

struct lexer {
    struct jctx *c;
    struct jtok *v;
    size_t n, cap;
};

static struct jtok *tok_push(struct lexer *L, int type, size_t off, const char *p, size_t n)
{
    if (L->n == L->cap) {
        size_t cap = L->cap ? L->cap * 2 : 64;
        struct jtok *nv = jalloc(L->c, cap * sizeof *nv);
        if (L->n) memcpy(nv, L->v, L->n * sizeof *nv);
        L->v = nv;
        L->cap = cap;
    }
    struct jtok *t = &L->v[L->n++];
    *t = (struct jtok){.type = type, .off = off, .p = p, .n = n};
    return t;
}

static int hexval(char ch)
{
    if (ch >= '0' && ch <= '9') return ch - '0';
    if (ch >= 'a' && ch <= 'f') return ch - 'a' + 10;
    if (ch >= 'A' && ch <= 'F') return ch - 'A' + 10;
    return -1;
}

static void put_utf8(struct jctx *c, struct jbuf *b, unsigned cp, size_t off)
{
    char u[4];
    if (cp > 0x10ffff) jfail(c, FERRY_ERR_FORMAT, off, "invalid \\U escape in string literal");
    if (cp < 0x80) {
        u[0] = (char)cp;
        return jbuf_put(c, b, u, 1);
    }
    if (cp < 0x800) {
        u[0] = (char)(0xc0 | (cp >> 6));
        u[1] = (char)(0x80 | (cp & 0x3f));
        return jbuf_put(c, b, u, 2);
    }
    if (cp < 0x10000) {
        u[0] = (char)(0xe0 | (cp >> 12));
        u[1] = (char)(0x80 | ((cp >> 6) & 0x3f));
        u[2] = (char)(0x80 | (cp & 0x3f));
        return jbuf_put(c, b, u, 3);
    }
    u[0] = (char)(0xf0 | (cp >> 18));
    u[1] = (char)(0x80 | ((cp >> 12) & 0x3f));
    u[2] = (char)(0x80 | ((cp >> 6) & 0x3f));
    u[3] = (char)(0x80 | (cp & 0x3f));
    jbuf_put(c, b, u, 4);
}

/* A quoted literal from s[i] (the quote); Python escape rules, as Jinja's unicode-escape decoding. */
static size_t lex_string(struct lexer *L, size_t i)
{
    struct jctx *c = L->c;
    const char *s = c->src;
    char q = s[i];
    size_t start = i++;
    struct jbuf b = {0};
    for (;;) {
        if (i >= c->src_len) jfail(c, FERRY_ERR_FORMAT, start, "unterminated string literal");
        char ch = s[i];
        if (ch == q) break;
        if (ch != '\\') {
            jbuf_putc(c, &b, ch);
            i++;
            continue;
        }
        if (i + 1 >= c->src_len) jfail(c, FERRY_ERR_FORMAT, start, "unterminated string literal");
        char e = s[i + 1];
        i += 2;
        int nhex = 0;
        switch (e) {
        case 'n': jbuf_putc(c, &b, '\n'); break;
        case 't': jbuf_putc(c, &b, '\t'); break;
        case 'r': jbuf_putc(c, &b, '\r'); break;
        case 'a': jbuf_putc(c, &b, '\a'); break;
        case 'b': jbuf_putc(c, &b, '\b'); break;
        case 'f': jbuf_putc(c, &b, '\f'); break;
        case 'v': jbuf_putc(c, &b, '\v'); break;
        case '\\': jbuf_putc(c, &b, '\\'); break;
        case '\'': jbuf_putc(c, &b, '\''); break;
        case '"': jbuf_putc(c, &b, '"'); break;
        case '\n': break;
        case 'x': nhex = 2; break;
        case 'u': nhex = 4; break;
        case 'U': nhex = 8; break;
        default:
            if (e >= '0' && e <= '7') {
                unsigned v = (unsigned)(e - '0');
                for (int k = 0; k < 2 && i < c->src_len && s[i] >= '0' && s[i] <= '7'; k++) v = v * 8 + (unsigned)(s[i++] - '0');
                put_utf8(c, &b, v, i);
            } else {
                jbuf_putc(c, &b, '\\');
                jbuf_putc(c, &b, e);
            }
        }
        if (nhex) {
            unsigned v = 0;
            for (int k = 0; k < nhex; k++) {
                int h = i < c->src_len ? hexval(s[i]) : -1;
                if (h < 0) jfail(c, FERRY_ERR_FORMAT, i, "truncated \\%c escape in string literal", e);
                v = v * 16 + (unsigned)h;
                i++;
            }
            put_utf8(c, &b, v, i);
        }
    }
    struct jtok *t = tok_push(L, JT_STRING, start, b.p ? b.p : "", b.n);
    (void)t;
    return i + 1;
}

static const char *const ops3[] = {NULL};
static const char *const ops2[] = {"//", "**", "==", "!=", "<=", ">="};
static const char ops1[] = "+-*/%~<>()[]{},.:|=";

/* Tokens of one tag; returns the position after the end delimiter and whether it strips/keeps after. */
static size_t lex_tag(struct lexer *L, size_t i, int is_block, int *strip_after, int *keep_newline)
{
    struct jctx *c = L->c;
    const char *s = c->src;
    size_t n = c->src_len, open = i - 2;
    int balance = 0; /* open ( [ {: like Jinja, `}}` inside a dict literal does not end the tag */
    (void)ops3;
    for (;;) {
        while (i < n && is_ws(s[i])) i++;
        if (i >= n) jfail(c, FERRY_ERR_FORMAT, open, "unclosed tag");
        char e = is_block ? '%' : '}';
        if (balance == 0 && (s[i] == '-' || s[i] == '+') && i + 2 < n && s[i + 1] == e && s[i + 2] == '}') {
            if (s[i] == '+' && !is_block) jfail(c, FERRY_ERR_FORMAT, i, "unexpected '+'");
            *strip_after = s[i] == '-';
            *keep_newline = s[i] == '+';
            tok_push(L, is_block ? JT_BLOCK_END : JT_VAR_END, i, s + i, 3);
            return i + 3;
        }
        if (balance == 0 && s[i] == e && i + 1 < n && s[i + 1] == '}') {
            tok_push(L, is_block ? JT_BLOCK_END : JT_VAR_END, i, s + i, 2);
            return i + 2;
        }
        char ch = s[i];
        if (is_alpha(ch)) {
            size_t j = i;
            while (j < n && (is_alpha(s[j]) || is_digit(s[j]))) j++;
            tok_push(L, JT_NAME, i, s + i, j - i);
            i = j;
        } else if (is_digit(ch)) {
            size_t j = i;
            while (j < n && (is_digit(s[j]) || s[j] == '_')) j++;
            int is_float = 0;
            if (j + 1 < n && s[j] == '.' && is_digit(s[j + 1]) && !(i > 0 && s[i - 1] == '.')) {
                is_float = 1;
                j++;
                while (j < n && (is_digit(s[j]) || s[j] == '_')) j++;
            }
            if (j < n && (s[j] == 'e' || s[j] == 'E')) {
                size_t k = j + 1;
                if (k < n && (s[k] == '+' || s[k] == '-')) k++;
                if (k < n && is_digit(s[k])) {
                    is_float = 1;
                    j = k;
                    while (j < n && is_digit(s[j])) j++;
                }
            }
            char buf[64];
            size_t bl = 0;
            for (size_t k = i; k < j && bl + 1 < sizeof buf; k++)
                if (s[k] != '_') buf[bl++] = s[k];
            buf[bl] = 0;
            if (j - i >= sizeof buf - 1) jfail(c, FERRY_ERR_UNSUPPORTED, i, "numeric literal too long");
            struct jtok *t = tok_push(L, is_float ? JT_FLOAT : JT_INT, i, s + i, j - i);
            if (is_float) {
                t->f = strtod(buf, NULL);
            } else {
                char *end;
                unsigned long long v = strtoull(buf, &end, 10);
                if (bl > 18 && (bl > 19 || v > (unsigned long long)INT64_MAX))
                    jfail(c, FERRY_ERR_UNSUPPORTED, i, "integer literal out of 64-bit range");
                t->i = (int64_t)v;
            }
            i = j;
        } else if (ch == '\'' || ch == '"') {
            i = lex_string(L, i);
        } else {
            size_t k;
            for (k = 0; k < sizeof ops2 / sizeof *ops2; k++)
                if (i + 1 < n && s[i] == ops2[k][0] && s[i + 1] == ops2[k][1]) break;
            if (k < sizeof ops2 / sizeof *ops2) {
                tok_push(L, JT_OP, i, s + i, 2);
                i += 2;
            } else if (strchr(ops1, ch) && ch) {
                if (ch == '(' || ch == '[' || ch == '{') balance++;
                if ((ch == ')' || ch == ']' || ch == '}') && balance > 0) balance--;
                tok_push(L, JT_OP, i, s + i, 1);
                i += 1;
            } else {
                jfail(c, FERRY_ERR_FORMAT, i, "unexpected character '%c' in tag", ch >= 0x20 && ch < 0x7f ? ch : '?');
            }
        }
    }
}

static int only_ws(const char *p, size_t n)
{
    if (n == 0) return 0;
    for (size_t i = 0; i < n; i++)
        if (!is_ws(p[i])) return 0;
    return 1;
}

static void lex(struct jctx *c, struct lexer *L)
{
    const char *s = c->src;
    size_t n = c->src_len, pos = 0;
    int line_starting = 1, strip_next = 0;
    for (;;) {
        if (strip_next) {
            size_t p0 = pos;
            while (pos < n && is_ws(s[pos])) pos++;
            if (pos > p0) line_starting = s[pos - 1] == '\n';
            strip_next = 0;
        }
        size_t t = pos;
        int kind = 0;
        while (t + 1 < n) {
            if (s[t] == '{' && (s[t + 1] == '{' || s[t + 1] == '%' || s[t + 1] == '#')) {
                kind = s[t + 1];
                break;
            }
            t++;
        }
        if (!kind) {
            if (pos < n) tok_push(L, JT_TEXT, pos, s + pos, n - pos);
            break;
        }
        size_t text_len = t - pos;
        char mod = t + 2 < n ? s[t + 2] : 0;
        if (mod == '-') {
            while (text_len > 0 && is_ws(s[pos + text_len - 1])) text_len--;
        } else if (mod != '+' && kind != '{') {
            size_t l_pos = text_len;
            while (l_pos > 0 && s[pos + l_pos - 1] != '\n') l_pos--;
            if ((l_pos > 0 || line_starting) && only_ws(s + pos + l_pos, text_len - l_pos)) text_len = l_pos;
        }
        if (text_len) tok_push(L, JT_TEXT, pos, s + pos, text_len);
        size_t i = t + 2 + (mod == '-' || mod == '+');
        if (kind == '#') {
            if (i >= n) break; /* Jinja ignores a `{#` that ends the template */
            size_t e = i;
            while (e + 1 < n && !(s[e] == '#' && s[e + 1] == '}')) e++;
            if (e + 1 >= n) jfail(c, FERRY_ERR_FORMAT, t, "unclosed comment");
            char m2 = e > i ? s[e - 1] : 0;
            pos = e + 2;
            if (m2 == '-') {
                strip_next = 1;
                line_starting = 0;
            } else if (m2 != '+' && pos < n && s[pos] == '\n') {
                pos++;
                line_starting = 1;
            } else {
                line_starting = 0;
            }
            continue;
        }
        int is_block = kind == '%';
        if (is_block) {
            /* {% raw %} changes lexing; it is not part of the subset. */
            size_t k = i;
            while (k < n && is_ws(s[k])) k++;
            if (n - k >= 3 && memcmp(s + k, "raw", 3) == 0 && (k + 3 >= n || !is_alpha(s[k + 3]) ))
                jfail(c, FERRY_ERR_UNSUPPORTED, t, "unsupported tag 'raw'");
        }
        tok_push(L, is_block ? JT_BLOCK_BEGIN : JT_VAR_BEGIN, t, s + t, 2);
        int strip_after = 0, keep_nl = 0;
        pos = lex_tag(L, i, is_block, &strip_after, &keep_nl);
        line_starting = 0;
        if (strip_after) {
            strip_next = 1;
        } else if (is_block && !keep_nl && pos < n && s[pos] == '\n') {
            pos++;
            line_starting = 1;
        }
    }
    tok_push(L, JT_EOF, n, s + n, 0);
}

/* ---- parser helpers ------------------------------------------------------------------------------- */

static struct jtok *cur(struct jctx *c) { return &c->toks[c->pos]; }
static struct jtok *next_tok(struct jctx *c)
{
    struct jtok *t = &c->toks[c->pos];
    if (t->type != JT_EOF) c->pos++;
    return t;
}

static int is_op(struct jctx *c, const char *op)
{
    struct jtok *t = cur(c);
    return t->type == JT_OP && t->n == strlen(op) && memcmp(t->p, op, t->n) == 0;
}

static int is_name(struct jctx *c, const char *name)
{
    struct jtok *t = cur(c);
    return t->type == JT_NAME && t->n == strlen(name) && memcmp(t->p, name, t->n) == 0;
}

static int tok_is_name(struct jtok *t, const char *name)
{
    return t->type == JT_NAME && t->n == strlen(name) && memcmp(t->p, name, t->n) == 0;
}

static void describe(struct jtok *t, char *buf, size_t cap)
{
    static const char *tn[] = {"text", "'{{'", "'}}'", "'{%'", "'%}'", "name", "integer", "float", "string", "operator", "end of template"};
    if (t->type == JT_NAME || t->type == JT_OP)
        snprintf(buf, cap, "'%.*s'", (int)(t->n > 40 ? 40 : t->n), t->p);
    else
        snprintf(buf, cap, "%s", tn[t->type]);
}

__attribute__((noreturn)) static void unexpected(struct jctx *c, const char *want)
{
    char d[64];
    describe(cur(c), d, sizeof d);
    jfail(c, FERRY_ERR_FORMAT, cur(c)->off, "expected %s, got %s", want, d);
}

static void expect_op(struct jctx *c, const char *op)
{
    if (!is_op(c, op)) {
        char w[16];
        snprintf(w, sizeof w, "'%s'", op);
        unexpected(c, w);
    }
    next_tok(c);
}

static struct jv expect_name(struct jctx *c)
{
    if (cur(c)->type != JT_NAME) unexpected(c, "a name");
    struct jtok *t = next_tok(c);
    return jv_str(t->p, t->n);
}

static void expect_block_end(struct jctx *c)
{
    if (cur(c)->type != JT_BLOCK_END) unexpected(c, "'%}'");
    next_tok(c);
}

static struct jnode *node(struct jctx *c, int kind, size_t off)
{
    struct jnode *n = jalloc(c, sizeof *n);
    *n = (struct jnode){.kind = kind, .off = off};
    return n;
}

struct nodevec {
    struct jnode **v;
    int n, cap;
};

static void nv_push(struct jctx *c, struct nodevec *nv, struct jnode *x)
{
    if (nv->n == nv->cap) {
        int cap = nv->cap ? nv->cap * 2 : 4;
        struct jnode **p = jalloc(c, (size_t)cap * sizeof *p);
        if (nv->n) memcpy(p, nv->v, (size_t)nv->n * sizeof *p);
        nv->v = p;
        nv->cap = cap;
    }
    nv->v[nv->n++] = x;
}

static void enter(struct jctx *c)
{
    if (++c->parse_depth > MAX_PARSE_DEPTH)
        jfail(c, FERRY_ERR_RANGE, cur(c)->off, "template nested deeper than %d levels", MAX_PARSE_DEPTH);
}

/* ---- expressions ---------------------------------------------------------------------------------- */

static struct jnode *parse_expr(struct jctx *c, int with_cond);
static struct jnode *parse_unary(struct jctx *c, int with_filter);

static void parse_call_args(struct jctx *c, struct jnode *n)
{
    struct nodevec args = {0}, kwv = {0};
    struct jv *kwn = NULL;
    int nkw = 0, cap = 0;
    expect_op(c, "(");
    while (!is_op(c, ")")) {
        if (args.n || nkw) expect_op(c, ",");
        if (is_op(c, ")")) break;
        if (is_op(c, "*") || is_op(c, "**")) jfail(c, FERRY_ERR_UNSUPPORTED, cur(c)->off, "unsupported *args/**kwargs in call");
        if (cur(c)->type == JT_NAME && c->toks[c->pos + 1].type == JT_OP && c->toks[c->pos + 1].n == 1 &&
            c->toks[c->pos + 1].p[0] == '=') {
            struct jv name = expect_name(c);
            next_tok(c);
            if (nkw == cap) {
                cap = cap ? cap * 2 : 4;
                struct jv *p = jalloc(c, (size_t)cap * sizeof *p);
                if (nkw) memcpy(p, kwn, (size_t)nkw * sizeof *p);
                kwn = p;
            }
            kwn[nkw++] = name;
            nv_push(c, &kwv, parse_expr(c, 1));
        } else {
            if (nkw) jfail(c, FERRY_ERR_FORMAT, cur(c)->off, "positional argument after keyword argument");
            nv_push(c, &args, parse_expr(c, 1));
        }
    }
    next_tok(c);
    n->kids = args.v;
    n->nkids = args.n;
    n->kwnames = kwn;
    n->kwvals = kwv.v;
    n->nkw = nkw;
}

static struct jnode *parse_primary(struct jctx *c)
{
    struct jtok *t = cur(c);
    struct jnode *n;
    switch (t->type) {
    case JT_NAME: {
        next_tok(c);
        n = node(c, JN_CONST, t->off);
        if (tok_is_name(t, "true") || tok_is_name(t, "True")) n->val = jv_bool(1);
        else if (tok_is_name(t, "false") || tok_is_name(t, "False")) n->val = jv_bool(0);
        else if (tok_is_name(t, "none") || tok_is_name(t, "None")) n->val = jv_none();
        else {
            n->kind = JN_NAME;
            n->val = jv_str(t->p, t->n);
        }
        return n;
    }
    case JT_STRING: {
        n = node(c, JN_CONST, t->off);
        next_tok(c);
        if (cur(c)->type != JT_STRING) {
            n->val = jv_str(t->p, t->n);
            return n;
        }
        struct jbuf b = {0};
        jbuf_put(c, &b, t->p, t->n);
        while (cur(c)->type == JT_STRING) {
            struct jtok *u = next_tok(c);
            jbuf_put(c, &b, u->p, u->n);
        }
        n->val = jbuf_take(&b);
        return n;
    }
    case JT_INT:
        next_tok(c);
        n = node(c, JN_CONST, t->off);
        n->val = jv_int(t->i);
        return n;
    case JT_FLOAT:
        next_tok(c);
        n = node(c, JN_CONST, t->off);
        n->val = jv_float(t->f);
        return n;
    case JT_OP:
        if (is_op(c, "(")) {
            next_tok(c);
            if (is_op(c, ")")) {
                next_tok(c);
                return node(c, JN_TUPLE, t->off);
            }
            enter(c);
            struct jnode *e = parse_expr(c, 1);
            if (is_op(c, ",")) {
                struct nodevec items = {0};
                nv_push(c, &items, e);
                while (is_op(c, ",")) {
                    next_tok(c);
                    if (is_op(c, ")")) break;
                    nv_push(c, &items, parse_expr(c, 1));
                }
                e = node(c, JN_TUPLE, t->off);
                e->kids = items.v;
                e->nkids = items.n;
            }
            c->parse_depth--;
            expect_op(c, ")");
            return e;
        }
        if (is_op(c, "[") || is_op(c, "{")) {
            int is_dict = is_op(c, "{");
            const char *close = is_dict ? "}" : "]";
            next_tok(c);
            enter(c);
            struct nodevec items = {0};
            while (!is_op(c, close)) {
                if (items.n) expect_op(c, ",");
                if (is_op(c, close)) break;
                nv_push(c, &items, parse_expr(c, 1));
                if (is_dict) {
                    expect_op(c, ":");
                    nv_push(c, &items, parse_expr(c, 1));
                }
            }
            next_tok(c);
            c->parse_depth--;
            n = node(c, is_dict ? JN_DICT : JN_LIST, t->off);
            n->kids = items.v;
            n->nkids = items.n;
            return n;
        }
        break;
    default: break;
    }
    unexpected(c, "an expression");
}

static struct jnode *parse_subscript(struct jctx *c, struct jnode *obj)
{
    size_t off = cur(c)->off;
    if (is_op(c, ".")) {
        next_tok(c);
        struct jtok *t = cur(c);
        struct jnode *n = node(c, JN_ATTR, off);
        n->a = obj;
        if (t->type == JT_NAME) {
            n->val = jv_str(t->p, t->n);
        } else if (t->type == JT_INT) {
            n->kind = JN_INDEX;
            n->b = node(c, JN_CONST, t->off);
            n->b->val = jv_int(t->i);
        } else {
            unexpected(c, "an attribute name");
        }
        next_tok(c);
        return n;
    }
    /* '[' */
    next_tok(c);
    enter(c);
    struct jnode *parts[3] = {NULL, NULL, NULL};
    int is_slice = 0, k = 0;
    for (;;) {
        if (is_op(c, ":")) {
            if (++k > 2) unexpected(c, "']'");
            is_slice = 1;
            next_tok(c);
            continue;
        }
        if (is_op(c, "]")) break;
        if (parts[k]) unexpected(c, "':' or ']'");
        parts[k] = parse_expr(c, 1);
        if (!is_slice && is_op(c, ",")) jfail(c, FERRY_ERR_UNSUPPORTED, cur(c)->off, "unsupported tuple subscript");
    }
    next_tok(c);
    c->parse_depth--;
    struct jnode *n = node(c, is_slice ? JN_SLICE : JN_INDEX, off);
    n->a = obj;
    if (is_slice) {
        n->kids = jalloc(c, 3 * sizeof *n->kids);
        memcpy(n->kids, parts, sizeof parts);
        n->nkids = 3;
    } else {
        if (!parts[0]) unexpected(c, "an index");
        n->b = parts[0];
    }
    return n;
}

static struct jnode *parse_postfix(struct jctx *c, struct jnode *n)
{
    for (;;) {
        if (is_op(c, ".") || is_op(c, "[")) {
            n = parse_subscript(c, n);
        } else if (is_op(c, "(")) {
            struct jnode *call = node(c, JN_CALL, cur(c)->off);
            call->a = n;
            parse_call_args(c, call);
            n = call;
        } else {
            return n;
        }
    }
}

static struct jnode *parse_filter_expr(struct jctx *c, struct jnode *n)
{
    for (;;) {
        if (is_op(c, "|")) {
            next_tok(c);
            size_t off = cur(c)->off;
            struct jv name = expect_name(c);
            while (is_op(c, ".")) { /* dotted names parse (as in Jinja) and fail as unknown when applied */
                next_tok(c);
                struct jv part = expect_name(c);
                name = jv_str(c->src + off, (size_t)(part.s.p + part.s.n - (c->src + off)));
            }
            struct jnode *f = node(c, JN_FILTER, off);
            f->val = name;
            f->a = n;
            if (is_op(c, "(")) parse_call_args(c, f);
            n = f;
        } else if (is_name(c, "is")) {
            next_tok(c);
            size_t off = cur(c)->off;
            struct jnode *t = node(c, JN_TEST, off);
            if (is_name(c, "not")) {
                next_tok(c);
                t->op = 1;
            }
            t->val = expect_name(c);
            while (is_op(c, ".")) { /* dotted test names parse and fail as unknown when applied */
                next_tok(c);
                struct jv part = expect_name(c);
                t->val = jv_str(c->src + off, (size_t)(part.s.p + part.s.n - (c->src + off)));
            }
            t->a = n;
            struct jtok *k = cur(c);
            if (is_op(c, "(")) {
                parse_call_args(c, t);
            } else if ((k->type == JT_NAME || k->type == JT_STRING || k->type == JT_INT || k->type == JT_FLOAT ||
                        is_op(c, "[") || is_op(c, "{")) &&
                       !is_name(c, "else") && !is_name(c, "or") && !is_name(c, "and")) {
                if (is_name(c, "is")) jfail(c, FERRY_ERR_FORMAT, k->off, "cannot chain multiple tests with 'is'");
                struct jnode *arg = parse_postfix(c, parse_primary(c));
                t->kids = jalloc(c, sizeof *t->kids);
                t->kids[0] = arg;
                t->nkids = 1;
            }
            n = t;
        } else if (is_op(c, "(")) {
            struct jnode *call = node(c, JN_CALL, cur(c)->off);
            call->a = n;
            parse_call_args(c, call);
            n = call;
        } else {
            return n;
        }
    }
}

static struct jnode *parse_unary(struct jctx *c, int with_filter)
{
    enter(c);
    struct jnode *n;
    size_t off = cur(c)->off;
    if (is_op(c, "-") || is_op(c, "+")) {
        int neg = is_op(c, "-");
        next_tok(c);
        n = node(c, neg ? JN_NEG : JN_POS, off);
        n->a = parse_unary(c, 0);
    } else {
        n = parse_primary(c);
    }
    n = parse_postfix(c, n);
    if (with_filter) n = parse_filter_expr(c, n);
    c->parse_depth--;
    return n;
}

static struct jnode *binop(struct jctx *c, int kind, int op, size_t off, struct jnode *a, struct jnode *b)
{
    struct jnode *n = node(c, kind, off);
    n->op = op;
    n->a = a;
    n->b = b;
    return n;
}

static struct jnode *parse_pow(struct jctx *c)
{
    struct jnode *l = parse_unary(c, 1);
    while (is_op(c, "**")) {
        size_t off = next_tok(c)->off;
        l = binop(c, JN_BIN, JOP_POW, off, l, parse_unary(c, 1));
    }
    return l;
}

static struct jnode *parse_math2(struct jctx *c)
{
    struct jnode *l = parse_pow(c);
    for (;;) {
        int op = is_op(c, "*") ? JOP_MUL : is_op(c, "/") ? JOP_DIV : is_op(c, "//") ? JOP_FDIV : is_op(c, "%") ? JOP_MOD : -1;
        if (op < 0) return l;
        size_t off = next_tok(c)->off;
        l = binop(c, JN_BIN, op, off, l, parse_pow(c));
    }
}

static struct jnode *parse_concat(struct jctx *c)
{
    struct jnode *l = parse_math2(c);
    while (is_op(c, "~")) {
        size_t off = next_tok(c)->off;
        l = binop(c, JN_BIN, JOP_CAT, off, l, parse_math2(c));
    }
    return l;
}

static struct jnode *parse_math1(struct jctx *c)
{
    struct jnode *l = parse_concat(c);
    for (;;) {
        int op = is_op(c, "+") ? JOP_ADD : is_op(c, "-") ? JOP_SUB : -1;
        if (op < 0) return l;
        size_t off = next_tok(c)->off;
        l = binop(c, JN_BIN, op, off, l, parse_concat(c));
    }
}

static struct jnode *parse_compare(struct jctx *c)
{
    struct jnode *l = parse_math1(c), *result = NULL;
    for (;;) {
        int op = is_op(c, "==") ? JOP_EQ : is_op(c, "!=") ? JOP_NE : is_op(c, "<") ? JOP_LT : is_op(c, "<=") ? JOP_LE
               : is_op(c, ">") ? JOP_GT : is_op(c, ">=") ? JOP_GE : is_name(c, "in") ? JOP_IN : -1;
        size_t off = cur(c)->off;
        if (op < 0 && is_name(c, "not") && tok_is_name(&c->toks[c->pos + 1], "in")) {
            next_tok(c);
            op = JOP_NOTIN;
        }
        if (op < 0) break;
        next_tok(c);
        struct jnode *r = parse_math1(c);
        struct jnode *cmp = binop(c, JN_CMP, op, off, l, r);
        result = result ? binop(c, JN_AND, 0, off, result, cmp) : cmp; /* a < b < c: (a < b) and (b < c) */
        l = r;
    }
    return result ? result : l;
}

static struct jnode *parse_not(struct jctx *c)
{
    if (is_name(c, "not")) {
        size_t off = next_tok(c)->off;
        enter(c);
        struct jnode *n = node(c, JN_NOT, off);
        n->a = parse_not(c);
        c->parse_depth--;
        return n;
    }
    return parse_compare(c);
}

static struct jnode *parse_and(struct jctx *c)
{
    struct jnode *l = parse_not(c);
    while (is_name(c, "and")) {
        size_t off = next_tok(c)->off;
        l = binop(c, JN_AND, 0, off, l, parse_not(c));
    }
    return l;
}

static struct jnode *parse_or(struct jctx *c)
{
    struct jnode *l = parse_and(c);
    while (is_name(c, "or")) {
        size_t off = next_tok(c)->off;
        l = binop(c, JN_OR, 0, off, l, parse_and(c));
    }
    return l;
}

static struct jnode *parse_expr(struct jctx *c, int with_cond)
{
    enter(c);
    struct jnode *e = parse_or(c);
    while (with_cond && is_name(c, "if")) {
        size_t off = next_tok(c)->off;
        struct jnode *n = node(c, JN_COND, off);
        n->b = e;
        n->a = parse_or(c);
        if (is_name(c, "else")) {
            next_tok(c);
            n->c = parse_expr(c, 1);
        }
        e = n;
    }
    c->parse_depth--;
    return e;
}

/* An expression or a bare tuple `a, b` (as in `{{ a, b }}` or `set x = 1, 2`). */
static struct jnode *parse_tuple(struct jctx *c, int with_cond)
{
    size_t off = cur(c)->off;
    struct jnode *e = parse_expr(c, with_cond);
    if (!is_op(c, ",")) return e;
    struct nodevec items = {0};
    nv_push(c, &items, e);
    while (is_op(c, ",")) {
        next_tok(c);
        if (cur(c)->type == JT_VAR_END || cur(c)->type == JT_BLOCK_END) break;
        nv_push(c, &items, parse_expr(c, with_cond));
    }
    struct jnode *t = node(c, JN_TUPLE, off);
    t->kids = items.v;
    t->nkids = items.n;
    return t;
}

/* ---- statements ----------------------------------------------------------------------------------- */

/* Parses statements until a block tag whose keyword is in `ends` (NULL-terminated); leaves the
 * position on that keyword. `ends` NULL: until end of template. */
static struct jnode *parse_body(struct jctx *c, const char *const *ends, size_t open_off, const char *what);

static int names_list(struct jctx *c, struct jv **out)
{
    struct jv *v = NULL;
    int n = 0, cap = 0;
    int paren = is_op(c, "(");
    if (paren) next_tok(c);
    do {
        if (n) next_tok(c);
        if (n == cap) {
            cap = cap ? cap * 2 : 4;
            struct jv *p = jalloc(c, (size_t)cap * sizeof *p);
            if (n) memcpy(p, v, (size_t)n * sizeof *p);
            v = p;
        }
        v[n++] = expect_name(c);
    } while (is_op(c, ","));
    if (paren) expect_op(c, ")");
    *out = v;
    return n;
}

static struct jnode *parse_if(struct jctx *c, size_t off)
{
    static const char *const ends[] = {"elif", "else", "endif", NULL};
    struct jnode *n = node(c, JN_IF, off);
    n->a = parse_tuple(c, 0); /* as Jinja: `{% if a if b else c %}` is a syntax error */
    expect_block_end(c);
    n->b = parse_body(c, ends, off, "if");
    struct jtok *kw = next_tok(c);
    if (tok_is_name(kw, "elif")) {
        n->c = parse_if(c, kw->off);
        return n;
    }
    if (tok_is_name(kw, "else")) {
        expect_block_end(c);
        static const char *const endif[] = {"endif", NULL};
        n->c = parse_body(c, endif, off, "if");
        next_tok(c);
    }
    expect_block_end(c);
    return n;
}

static struct jnode *parse_for(struct jctx *c, size_t off)
{
    static const char *const ends[] = {"else", "endfor", NULL};
    struct jnode *n = node(c, JN_FOR, off);
    n->nnames = names_list(c, &n->names);
    if (!is_name(c, "in")) unexpected(c, "'in'");
    next_tok(c);
    n->a = parse_tuple(c, 0);
    if (is_name(c, "if")) {
        next_tok(c);
        n->d = parse_expr(c, 1);
    }
    if (is_name(c, "recursive")) jfail(c, FERRY_ERR_UNSUPPORTED, cur(c)->off, "unsupported recursive for loop");
    expect_block_end(c);
    c->loop_depth++;
    n->b = parse_body(c, ends, off, "for");
    c->loop_depth--;
    if (tok_is_name(next_tok(c), "else")) {
        expect_block_end(c);
        static const char *const endfor[] = {"endfor", NULL};
        n->c = parse_body(c, endfor, off, "for");
        next_tok(c);
    }
    expect_block_end(c);
    return n;
}

static struct jnode *parse_set(struct jctx *c, size_t off)
{
    struct jnode *n = node(c, JN_SET, off);
    if (cur(c)->type == JT_NAME && c->toks[c->pos + 1].type == JT_OP && c->toks[c->pos + 1].n == 1 &&
        c->toks[c->pos + 1].p[0] == '.') {
        n->names = jalloc(c, sizeof *n->names);
        n->names[0] = expect_name(c);
        n->nnames = 1;
        next_tok(c);
        n->val = expect_name(c);
        n->op = 1;
    } else {
        n->nnames = names_list(c, &n->names);
    }
    if (is_op(c, "=")) {
        next_tok(c);
        n->a = parse_tuple(c, 1);
        expect_block_end(c);
        return n;
    }
    if (n->nnames != 1 || n->op) unexpected(c, "'='");
    if (is_op(c, "|")) jfail(c, FERRY_ERR_UNSUPPORTED, cur(c)->off, "unsupported filtered block set");
    expect_block_end(c);
    static const char *const ends[] = {"endset", NULL};
    n->b = parse_body(c, ends, off, "set");
    next_tok(c);
    expect_block_end(c);
    return n;
}

static struct jnode *parse_macro(struct jctx *c, size_t off)
{
    struct jnode *n = node(c, JN_MACRO, off);
    n->val = expect_name(c);
    expect_op(c, "(");
    struct nodevec defs = {0};
    int cap = 0;
    while (!is_op(c, ")")) {
        if (n->nnames) expect_op(c, ",");
        if (n->nnames == cap) {
            cap = cap ? cap * 2 : 4;
            struct jv *p = jalloc(c, (size_t)cap * sizeof *p);
            if (n->nnames) memcpy(p, n->names, (size_t)n->nnames * sizeof *p);
            n->names = p;
        }
        n->names[n->nnames++] = expect_name(c);
        struct jnode *def = NULL;
        if (is_op(c, "=")) {
            next_tok(c);
            def = parse_expr(c, 1);
        }
        nv_push(c, &defs, def);
    }
    next_tok(c);
    n->kids = defs.v;
    n->nkids = defs.n;
    expect_block_end(c);
    static const char *const ends[] = {"endmacro", NULL};
    int saved_loops = c->loop_depth;
    c->loop_depth = 0;
    n->b = parse_body(c, ends, off, "macro");
    c->loop_depth = saved_loops;
    next_tok(c);
    if (cur(c)->type == JT_NAME) next_tok(c); /* {% endmacro name %} */
    expect_block_end(c);
    return n;
}

static struct jnode *parse_statement(struct jctx *c, size_t off)
{
    struct jtok *kw = cur(c);
    if (kw->type != JT_NAME) unexpected(c, "a statement keyword");
    next_tok(c);
    if (tok_is_name(kw, "if")) return parse_if(c, off);
    if (tok_is_name(kw, "for")) return parse_for(c, off);
    if (tok_is_name(kw, "set")) return parse_set(c, off);
    if (tok_is_name(kw, "macro")) return parse_macro(c, off);
    if (tok_is_name(kw, "break") || tok_is_name(kw, "continue")) {
        if (!c->loop_depth) jfail(c, FERRY_ERR_FORMAT, kw->off, "'%.*s' outside of a loop", (int)kw->n, kw->p);
        expect_block_end(c);
        return node(c, tok_is_name(kw, "break") ? JN_BREAK : JN_CONTINUE, off);
    }
    if (tok_is_name(kw, "generation")) { /* HF's AssistantTracker marks; renders its body unchanged */
        expect_block_end(c);
        static const char *const ends[] = {"endgeneration", NULL};
        struct jnode *b = parse_body(c, ends, off, "generation");
        next_tok(c);
        expect_block_end(c);
        return b;
    }
    static const char *const known[] = {"elif", "else", "endif", "endfor", "endset", "endmacro", "endgeneration", NULL};
    for (int i = 0; known[i]; i++)
        if (tok_is_name(kw, known[i])) jfail(c, FERRY_ERR_FORMAT, kw->off, "unexpected '%s'", known[i]);
    jfail(c, FERRY_ERR_UNSUPPORTED, kw->off, "unsupported tag '%.*s'", (int)(kw->n > 40 ? 40 : kw->n), kw->p);
}

static struct jnode *parse_body(struct jctx *c, const char *const *ends, size_t open_off, const char *what)
{
    enter(c);
    struct nodevec body = {0};
    size_t off = cur(c)->off;
    for (;;) {
        struct jtok *t = cur(c);
        if (t->type == JT_EOF) {
            if (ends) jfail(c, FERRY_ERR_FORMAT, open_off, "unclosed '%s' block", what);
            break;
        }
        if (t->type == JT_TEXT) {
            next_tok(c);
            struct jnode *n = node(c, JN_TEXT, t->off);
            n->val = jv_str(t->p, t->n);
            nv_push(c, &body, n);
        } else if (t->type == JT_VAR_BEGIN) {
            next_tok(c);
            struct jnode *n = node(c, JN_OUTPUT, t->off);
            n->a = parse_tuple(c, 1);
            if (cur(c)->type != JT_VAR_END) unexpected(c, "'}}'");
            next_tok(c);
            nv_push(c, &body, n);
        } else if (t->type == JT_BLOCK_BEGIN) {
            struct jtok *kw = &c->toks[c->pos + 1];
            int is_end = 0;
            for (int i = 0; ends && ends[i]; i++)
                if (tok_is_name(kw, ends[i])) is_end = 1;
            if (is_end) {
                next_tok(c); /* leave the position on the keyword */
                break;
            }
            next_tok(c);
            nv_push(c, &body, parse_statement(c, t->off));
        } else {
            unexpected(c, "text or a tag");
        }
    }
    struct jnode *b = node(c, JN_BODY, off);
    b->kids = body.v;
    b->nkids = body.n;
    c->parse_depth--;
    return b;
}

struct jnode *jinja_parse(struct jctx *c)
{
    struct lexer L = {.c = c};
    lex(c, &L);
    c->toks = L.v;
    c->ntoks = L.n;
    c->pos = 0;
    return parse_body(c, NULL, 0, "template");
}
