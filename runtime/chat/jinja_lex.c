/* jinja_lex — the lexer of the chat-template Jinja subset: template source -> token array.
 *
 * Follows Jinja2's rules with trim_blocks and lstrip_blocks on (as HF renders templates):
 * `{%-`/`{{-`/`{#-` strip all whitespace before the tag, `-%}`/`-}}`/`-#}` all whitespace after it,
 * a block or comment end eats one following newline unless written `+%}`, and spaces/tabs that precede
 * a block or comment tag on its own line are dropped unless the tag opens with `{%+`. Inside a tag,
 * `}}`/`%}` ends it only outside brackets (so `{'a': {}}` works), as in Jinja. String literals are
 * decoded with Python's escapes. Tokens point into the source or the arena.
 */
#include "runtime/chat/jinja.h"

#include "kernels/core/status.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- lexer ---------------------------------------------------------------------------------------- */

static int is_ws(char ch)
{
    return ch == ' ' || ch == '\t' || ch == '\n' || ch == '\r' || ch == '\f' || ch == '\v';
}
static int is_alpha(char ch)
{
    return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || ch == '_';
}
static int is_digit(char ch)
{
    return ch >= '0' && ch <= '9';
}

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
        case 'n':
            jbuf_putc(c, &b, '\n');
            break;
        case 't':
            jbuf_putc(c, &b, '\t');
            break;
        case 'r':
            jbuf_putc(c, &b, '\r');
            break;
        case 'a':
            jbuf_putc(c, &b, '\a');
            break;
        case 'b':
            jbuf_putc(c, &b, '\b');
            break;
        case 'f':
            jbuf_putc(c, &b, '\f');
            break;
        case 'v':
            jbuf_putc(c, &b, '\v');
            break;
        case '\\':
            jbuf_putc(c, &b, '\\');
            break;
        case '\'':
            jbuf_putc(c, &b, '\'');
            break;
        case '"':
            jbuf_putc(c, &b, '"');
            break;
        case '\n':
            break;
        case 'x':
            nhex = 2;
            break;
        case 'u':
            nhex = 4;
            break;
        case 'U':
            nhex = 8;
            break;
        default:
            if (e >= '0' && e <= '7') {
                unsigned v = (unsigned)(e - '0');
                for (int k = 0; k < 2 && i < c->src_len && s[i] >= '0' && s[i] <= '7'; k++)
                    v = v * 8 + (unsigned)(s[i++] - '0');
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

static const char *const ops2[] = {"//", "**", "==", "!=", "<=", ">="};
static const char ops1[] = "+-*/%~<>()[]{},.:|=";

/* Tokens of one tag; returns the position after the end delimiter and whether it strips/keeps after. */
static size_t lex_tag(struct lexer *L, size_t i, int is_block, int *strip_after, int *keep_newline)
{
    struct jctx *c = L->c;
    const char *s = c->src;
    size_t n = c->src_len, open = i - 2;
    int balance = 0; /* open ( [ {: like Jinja, `}}` inside a dict literal does not end the tag */
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
                jfail(c, FERRY_ERR_FORMAT, i, "unexpected character '%c' in tag",
                      ch >= 0x20 && ch < 0x7f ? ch : '?');
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
            if (n - k >= 3 && memcmp(s + k, "raw", 3) == 0 && (k + 3 >= n || !is_alpha(s[k + 3])))
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

void jinja_lex(struct jctx *c)
{
    struct lexer L = {.c = c};
    lex(c, &L);
    c->toks = L.v;
    c->ntoks = L.n;
    c->pos = 0;
}
