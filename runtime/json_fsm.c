/* json_fsm — see json_fsm.h. A pushdown recogniser: the lexical state below plus a stack of container kinds
 * (one bit per depth). */
#include "runtime/json_fsm.h"

enum {
    S_START,     /* before the top-level object */
    S_OBJ_FIRST, /* after '{': a key or '}' */
    S_OBJ_KEY,   /* after ',' in an object: a key */
    S_COLON,     /* after a key */
    S_VALUE,     /* after ':' or ',' in an array */
    S_ARR_FIRST, /* after '[': a value or ']' */
    S_AFTER,     /* after a value inside a container: ',' or the closing bracket */
    S_STR,
    S_STR_ESC,
    S_STR_U, /* lit = hex digits left */
    S_N_MINUS,
    S_N_ZERO,
    S_N_INT,
    S_N_DOT,
    S_N_FRAC,
    S_N_E,
    S_N_ESIGN,
    S_N_EXP,
    S_LIT, /* aux = bytes of the literal matched */
    S_DONE,
    S_DEAD,
};

static const char *literal(unsigned char lit)
{
    return lit == 't' ? "true" : lit == 'f' ? "false" : "null";
}

static int is_ws(unsigned char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

static int is_digit(unsigned char c)
{
    return c >= '0' && c <= '9';
}

static int is_hex(unsigned char c)
{
    return is_digit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}

static int top_is_array(const struct json_fsm *f)
{
    return (f->arrays >> (f->depth - 1)) & 1u;
}

static int push(struct json_fsm *f, int array)
{
    if (f->depth >= JSON_FSM_MAX_DEPTH) return -1;
    if (array)
        f->arrays |= (uint64_t)1 << f->depth;
    else
        f->arrays &= ~((uint64_t)1 << f->depth);
    f->depth++;
    f->state = array ? S_ARR_FIRST : S_OBJ_FIRST;
    return 0;
}

/* A value ended: back in its container, or the document is complete. */
static void close_value(struct json_fsm *f)
{
    f->state = f->depth ? S_AFTER : S_DONE;
}

static int start_value(struct json_fsm *f, unsigned char c)
{
    switch (c) {
    case '{': return push(f, 0);
    case '[': return push(f, 1);
    case '"': f->state = S_STR, f->aux = 0; return 0;
    case '-': f->state = S_N_MINUS; return 0;
    case '0': f->state = S_N_ZERO; return 0;
    case 't':
    case 'f':
    case 'n': f->state = S_LIT, f->lit = c, f->aux = 1; return 0;
    default:
        if (is_digit(c)) {
            f->state = S_N_INT;
            return 0;
        }
        return -1;
    }
}

void json_fsm_init(struct json_fsm *f)
{
    *f = (struct json_fsm){0};
    f->state = S_START;
}

int json_fsm_done(const struct json_fsm *f)
{
    return f->state == S_DONE;
}

static int feed(struct json_fsm *f, unsigned char c)
{
    const int structural = f->state <= S_AFTER || f->state == S_DONE;
    if (structural && is_ws(c)) {
        if (f->ws_run < 255) f->ws_run++;
        return 0;
    }
    f->ws_run = 0;
    switch (f->state) {
    case S_START:
        return c == '{' ? push(f, 0) : -1;
    case S_OBJ_FIRST:
    case S_OBJ_KEY:
        if (c == '"') {
            f->state = S_STR, f->aux = 1;
            return 0;
        }
        if (c == '}' && f->state == S_OBJ_FIRST) {
            f->depth--;
            close_value(f);
            return 0;
        }
        return -1;
    case S_COLON:
        if (c != ':') return -1;
        f->state = S_VALUE;
        return 0;
    case S_ARR_FIRST:
        if (c == ']') {
            f->depth--;
            close_value(f);
            return 0;
        }
        return start_value(f, c);
    case S_VALUE:
        return start_value(f, c);
    case S_AFTER:
        if (c == ',') {
            f->state = top_is_array(f) ? S_VALUE : S_OBJ_KEY;
            return 0;
        }
        if (c == (top_is_array(f) ? ']' : '}')) {
            f->depth--;
            close_value(f);
            return 0;
        }
        return -1;
    case S_STR:
        if (c == '"') {
            if (f->aux)
                f->state = S_COLON;
            else
                close_value(f);
            return 0;
        }
        if (c == '\\') {
            f->state = S_STR_ESC;
            return 0;
        }
        return c < 0x20 ? -1 : 0;
    case S_STR_ESC:
        if (c == 'u') {
            f->state = S_STR_U, f->lit = 4;
            return 0;
        }
        if (c == '"' || c == '\\' || c == '/' || c == 'b' || c == 'f' || c == 'n' || c == 'r' || c == 't') {
            f->state = S_STR;
            return 0;
        }
        return -1;
    case S_STR_U:
        if (!is_hex(c)) return -1;
        if (--f->lit == 0) f->state = S_STR;
        return 0;
    case S_N_MINUS:
        if (c == '0') f->state = S_N_ZERO;
        else if (is_digit(c)) f->state = S_N_INT;
        else return -1;
        return 0;
    case S_N_DOT:
        if (!is_digit(c)) return -1;
        f->state = S_N_FRAC;
        return 0;
    case S_N_E:
        if (c == '+' || c == '-') f->state = S_N_ESIGN;
        else if (is_digit(c)) f->state = S_N_EXP;
        else return -1;
        return 0;
    case S_N_ESIGN:
        if (!is_digit(c)) return -1;
        f->state = S_N_EXP;
        return 0;
    case S_N_ZERO:
    case S_N_INT:
    case S_N_FRAC:
    case S_N_EXP:
        if (is_digit(c) && f->state != S_N_ZERO) return 0;
        if (c == '.' && f->state <= S_N_INT) {
            f->state = S_N_DOT;
            return 0;
        }
        if ((c == 'e' || c == 'E') && f->state != S_N_EXP) {
            f->state = S_N_E;
            return 0;
        }
        /* The number ended at the previous byte: this one belongs to what follows it. */
        close_value(f);
        return feed(f, c);
    case S_LIT: {
        const char *w = literal(f->lit);
        if (c != (unsigned char)w[f->aux]) return -1;
        if (w[++f->aux] == '\0') close_value(f);
        return 0;
    }
    default: /* S_DONE takes whitespace only (above); S_DEAD nothing */
        return -1;
    }
}

int json_fsm_feed(struct json_fsm *f, unsigned char c)
{
    if (f->state == S_DEAD) return -1;
    if (feed(f, c)) {
        f->state = S_DEAD;
        return -1;
    }
    return 0;
}

int json_fsm_feed_bytes(struct json_fsm *f, const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (json_fsm_feed(f, (unsigned char)s[i])) return -1;
    return 0;
}
