/* jinja — the private interface of the chat-template interpreter (runtime/chat only).
 *
 * One render is one `struct jctx`: an arena that owns every allocation (tokens, AST, values, output),
 * bounded in bytes, steps and recursion depth. Errors unwind with longjmp to chat_template_render, which
 * frees the arena: nothing below it needs cleanup code. Values are small structs passed by value; strings
 * are (ptr, len) views into the arena or the template source and are never mutated once built.
 * Semantics follow Jinja2 as Hugging Face's apply_chat_template configures it (sandboxed, trim_blocks,
 * lstrip_blocks, loopcontrols, raise_exception, tojson without HTML escaping).
 */
#ifndef FERRY_CHAT_JINJA_H
#define FERRY_CHAT_JINJA_H

#include <setjmp.h>
#include <stddef.h>
#include <stdint.h>

/* ---- arena ---------------------------------------------------------------------------------------- */

struct jarena_block;
struct jarena {
    struct jarena_block *head;
    size_t used;  /* bytes handed out, all blocks */
    size_t limit; /* bytes; exceeding it is an error */
};

/* ---- values --------------------------------------------------------------------------------------- */

enum jv_type {
    JV_UNDEF,
    JV_NONE,
    JV_BOOL,
    JV_INT,
    JV_FLOAT,
    JV_STR,
    JV_LIST,
    JV_DICT,
    JV_NS,
    JV_FUNC,
    JV_MACRO,
    JV_LOOP
};

enum jfunc { JF_RANGE, JF_NAMESPACE, JF_RAISE, JF_STRFTIME, JF_DICT };

struct jlist;
struct jdict;
struct jloop;
struct jnode;

struct jv {
    int type;   /* enum jv_type */
    int markup; /* JV_STR: a Markup string (the safe filter's): `+` escapes a plain string operand, as
                 * markupsafe does, though nothing is autoescaped on output */
    union {
        int64_t i; /* JV_BOOL (0/1), JV_INT, JV_FUNC (enum jfunc) */
        double f;
        struct {
            const char *p; /* JV_STR: bytes (UTF-8, not NUL-terminated); JV_UNDEF: the missing name or NULL */
            size_t n;
        } s;
        struct jlist *l;       /* JV_LIST */
        struct jdict *d;       /* JV_DICT, JV_NS (mutable attributes) */
        struct jloop *loop;    /* JV_LOOP */
        const struct jnode *m; /* JV_MACRO */
    };
};

struct jlist {
    size_t n, cap;
    struct jv *v; /* (cap) */
    int tuple;    /* printed with () */
    int gen;      /* a Jinja generator (map/select/items/reverse results): always truthy, no len() */
};

struct jdict {
    size_t n, cap;
    struct jv *k, *v; /* (cap) keys, values; insertion order, linear lookup */
};

struct jloop {
    int64_t index0, length;
    struct jlist *items; /* the (filtered) sequence being iterated */
};

/* ---- tokens and AST ------------------------------------------------------------------------------- */

enum jtok_type {
    JT_TEXT,
    JT_VAR_BEGIN,
    JT_VAR_END,
    JT_BLOCK_BEGIN,
    JT_BLOCK_END,
    JT_NAME,
    JT_INT,
    JT_FLOAT,
    JT_STRING,
    JT_OP,
    JT_EOF
};

struct jtok {
    int type;
    size_t off;    /* byte offset in the (newline-normalised) source */
    const char *p; /* JT_TEXT/JT_NAME/JT_OP: source bytes; JT_STRING: decoded bytes */
    size_t n;
    int64_t i;
    double f;
};

enum jn_kind {
    /* statements */
    JN_BODY,
    JN_TEXT,
    JN_OUTPUT,
    JN_IF,
    JN_FOR,
    JN_SET,
    JN_MACRO,
    JN_BREAK,
    JN_CONTINUE,
    JN_FILTERBLOCK, /* {% filter f | g %}body{% endfilter %}: a = the filter chain over FILTER_BODY_VAR */
    /* expressions */
    JN_CONST,
    JN_NAME,
    JN_ATTR,
    JN_INDEX,
    JN_SLICE,
    JN_CALL,
    JN_FILTER,
    JN_TEST,
    JN_NEG,
    JN_POS,
    JN_NOT,
    JN_AND,
    JN_OR,
    JN_BIN,
    JN_CMP,
    JN_COND,
    JN_LIST,
    JN_TUPLE,
    JN_DICT
};

enum jop {
    JOP_ADD,
    JOP_SUB,
    JOP_MUL,
    JOP_DIV,
    JOP_FDIV,
    JOP_MOD,
    JOP_POW,
    JOP_CAT,
    JOP_EQ,
    JOP_NE,
    JOP_LT,
    JOP_LE,
    JOP_GT,
    JOP_GE,
    JOP_IN,
    JOP_NOTIN
};

struct jnode {
    int kind; /* enum jn_kind */
    int op;   /* JN_BIN/JN_CMP: enum jop; JN_TEST: negated; JN_SET: 1 = namespace attribute target */
    size_t off;
    struct jv val; /* JN_CONST value; name of JN_NAME/JN_ATTR/JN_FILTER/JN_TEST/JN_MACRO/set attr */
    struct jnode *a, *b, *c, *d;
    struct jnode **kids; /* body statements, call args, list items, dict key/value pairs, slice parts */
    int nkids;
    struct jv *names; /* JN_FOR/JN_SET targets, JN_MACRO parameters */
    int nnames;
    struct jv *kwnames; /* call keyword arguments */
    struct jnode **kwvals;
    int nkw;
};

/* The name a filter block's body is bound to while its chain runs (no template can spell it). */
#define FILTER_BODY_VAR " body"

/* ---- render context ------------------------------------------------------------------------------- */

struct jbuf {
    char *p;
    size_t n, cap;
};

struct jframe {
    struct jframe *parent;
    struct jdict vars;
};

struct jctx {
    struct jarena arena;
    jmp_buf fail;
    int status;
    char err[256];

    const char *src; /* normalised source */
    size_t src_len;
    struct jtok *toks;
    size_t ntoks, pos;
    int parse_depth;
    int loop_depth; /* enclosing for-loops while parsing (break/continue need one) */

    struct jbuf *out;
    size_t max_output;
    int64_t steps, max_steps;
    int depth, max_depth;
    int flow; /* 0, or 1 = break, 2 = continue pending */
    struct jframe *root;
};

/* Fails the render: records status and a message "... (at byte OFF)" and longjmps out. */
void jfail(struct jctx *c, int status, size_t off, const char *fmt, ...)
    __attribute__((noreturn, format(printf, 4, 5)));
#define JNO_OFF ((size_t)-1)

void *jalloc(struct jctx *c, size_t n);
/* Work accounting: long scans and copies cost steps in proportion to their size, so the step bound is
 * also a time bound (strings: 1 step per 256 bytes, containers: 1 per element). */
void jcharge(struct jctx *c, uint64_t steps);
uint64_t jv_cost(struct jv v);
void jarena_free(struct jarena *a);
char *jstrdup(struct jctx *c, const char *p, size_t n);

/* Constructors. */
struct jv jv_undef(const char *name, size_t n);
struct jv jv_none(void);
struct jv jv_bool(int b);
struct jv jv_int(int64_t i);
struct jv jv_float(double f);
struct jv jv_str(const char *p, size_t n);
struct jv jv_cstr(const char *s);
struct jv jv_list(struct jctx *c, size_t cap);
struct jv jv_dict(struct jctx *c, size_t cap);

void jlist_push(struct jctx *c, struct jlist *l, struct jv v);
void jdict_set(struct jctx *c, struct jdict *d, struct jv k, struct jv v);
struct jv *jdict_get(const struct jdict *d, struct jv k);
struct jv *jdict_gets(const struct jdict *d, const char *k, size_t n);

/* Python semantics. */
int jv_truthy(struct jv v);
int jv_equal(struct jv a, struct jv b);
const char *jv_type_name(struct jv v);
void jbuf_put(struct jctx *c, struct jbuf *b, const char *p, size_t n);
void jbuf_putc(struct jctx *c, struct jbuf *b, char ch);
void jv_write_str(struct jctx *c, struct jbuf *b, struct jv v);  /* str(v); undefined is empty */
void jv_write_repr(struct jctx *c, struct jbuf *b, struct jv v); /* repr(v) */
/* json.dumps options as HF's tojson filter passes them. */
struct jjson_opts {
    int indent;           /* -1: none (one line), else newline + indent_str per level */
    struct jv indent_str; /* the per-level indent (a string) when indent >= 0 */
    int ascii;            /* ensure_ascii: non-ASCII as \uXXXX */
    struct jv item_sep, key_sep;
    int sort_keys;
};
void jv_write_json(struct jctx *c, struct jbuf *b, struct jv v, const struct jjson_opts *o, int level,
                   size_t off);
struct jv jv_to_str(struct jctx *c, struct jv v);
struct jv jbuf_take(struct jbuf *b);

/* UTF-8 helpers: code point count and byte offset of the k-th code point (clamped to n). */
size_t jutf8_len(const char *p, size_t n);
size_t jutf8_offset(const char *p, size_t n, size_t k);
int jutf8_decode(const char *p, size_t n, size_t *adv); /* one code point; invalid byte -> itself */
int jis_space(int cp);                                  /* Python str.isspace() */

/* Lexer: c->src into c->toks (jinja_lex.c). */
void jinja_lex(struct jctx *c);
/* Front end: lex + parse the whole template into a JN_BODY. */
struct jnode *jinja_parse(struct jctx *c);
/* Evaluator: render the body into c->out with the given root frame. */
void jinja_render(struct jctx *c, const struct jnode *body);

#endif
