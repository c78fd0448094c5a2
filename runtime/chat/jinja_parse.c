/* jinja_parse — recursive-descent parser for the chat-template Jinja subset: tokens -> AST.
 *
 * Builds the AST of jinja.h with Jinja's operator precedence (or < and < not < comparisons < + - <
 * ~ < * / // % < ** < unary, filters and tests binding tightest). Anything outside the subset fails
 * with FERRY_ERR_UNSUPPORTED naming the construct and its byte offset, malformed input with
 * FERRY_ERR_FORMAT; nesting deeper than MAX_PARSE_DEPTH is FERRY_ERR_RANGE (bounded stack).
 */
#include "runtime/chat/jinja.h"

#include "kernels/core/status.h"

#include <stdio.h>
#include <string.h>

#define MAX_PARSE_DEPTH 100

/* ---- parser helpers ------------------------------------------------------------------------------- */

static struct jtok *cur(struct jctx *c)
{
    return &c->toks[c->pos];
}
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
    static const char *tn[] = {"text",    "'{{'",  "'}}'",   "'{%'",     "'%}'",           "name",
                               "integer", "float", "string", "operator", "end of template"};
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
        if (is_op(c, "*") || is_op(c, "**"))
            jfail(c, FERRY_ERR_UNSUPPORTED, cur(c)->off, "unsupported *args/**kwargs in call");
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
        if (tok_is_name(t, "true") || tok_is_name(t, "True"))
            n->val = jv_bool(1);
        else if (tok_is_name(t, "false") || tok_is_name(t, "False"))
            n->val = jv_bool(0);
        else if (tok_is_name(t, "none") || tok_is_name(t, "None"))
            n->val = jv_none();
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
    default:
        break;
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
        if (!is_slice && is_op(c, ","))
            jfail(c, FERRY_ERR_UNSUPPORTED, cur(c)->off, "unsupported tuple subscript");
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
            } else if ((k->type == JT_NAME || k->type == JT_STRING || k->type == JT_INT ||
                        k->type == JT_FLOAT || is_op(c, "[") || is_op(c, "{")) &&
                       !is_name(c, "else") && !is_name(c, "or") && !is_name(c, "and")) {
                if (is_name(c, "is"))
                    jfail(c, FERRY_ERR_FORMAT, k->off, "cannot chain multiple tests with 'is'");
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
        int op = is_op(c, "*")    ? JOP_MUL
                 : is_op(c, "/")  ? JOP_DIV
                 : is_op(c, "//") ? JOP_FDIV
                 : is_op(c, "%")  ? JOP_MOD
                                  : -1;
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
        int op = is_op(c, "==")     ? JOP_EQ
                 : is_op(c, "!=")   ? JOP_NE
                 : is_op(c, "<")    ? JOP_LT
                 : is_op(c, "<=")   ? JOP_LE
                 : is_op(c, ">")    ? JOP_GT
                 : is_op(c, ">=")   ? JOP_GE
                 : is_name(c, "in") ? JOP_IN
                                    : -1;
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
    if (is_name(c, "recursive"))
        jfail(c, FERRY_ERR_UNSUPPORTED, cur(c)->off, "unsupported recursive for loop");
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

/* {% filter name(args) | more %}...{% endfilter %}: the chain is parsed as a filter expression whose subject
 * is the body, bound to FILTER_BODY_VAR when it is rendered. */
static struct jnode *parse_filter_block(struct jctx *c, size_t off)
{
    struct jnode *n = node(c, JN_FILTERBLOCK, off);
    struct jnode *subject = node(c, JN_NAME, off);
    subject->val = jv_str(FILTER_BODY_VAR, sizeof FILTER_BODY_VAR - 1);
    size_t foff = cur(c)->off;
    struct jnode *f = node(c, JN_FILTER, foff);
    f->val = expect_name(c);
    f->a = subject;
    if (is_op(c, "(")) parse_call_args(c, f);
    n->a = parse_filter_expr(c, f);
    expect_block_end(c);
    static const char *const ends[] = {"endfilter", NULL};
    n->b = parse_body(c, ends, off, "filter");
    next_tok(c);
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
        if (!c->loop_depth)
            jfail(c, FERRY_ERR_FORMAT, kw->off, "'%.*s' outside of a loop", (int)kw->n, kw->p);
        expect_block_end(c);
        return node(c, tok_is_name(kw, "break") ? JN_BREAK : JN_CONTINUE, off);
    }
    if (tok_is_name(kw, "filter")) return parse_filter_block(c, off);
    if (tok_is_name(kw, "generation")) { /* HF's AssistantTracker marks; renders its body unchanged */
        expect_block_end(c);
        static const char *const ends[] = {"endgeneration", NULL};
        struct jnode *b = parse_body(c, ends, off, "generation");
        next_tok(c);
        expect_block_end(c);
        return b;
    }
    static const char *const known[] = {"elif",     "else",          "endif",     "endfor", "endset",
                                        "endmacro", "endgeneration", "endfilter", NULL};
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
    jinja_lex(c);
    return parse_body(c, NULL, 0, "template");
}
