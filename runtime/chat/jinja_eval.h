/* jinja_eval — evaluator internals shared by jinja_eval.c and jinja_builtins.c (runtime/chat only).
 *
 * jeval/jrender walk the AST; the builtins (filters, tests, str/dict methods, global functions) receive
 * their arguments already evaluated as a `struct jargs`. All of them fail through jfail().
 */
#ifndef FERRY_CHAT_JINJA_EVAL_H
#define FERRY_CHAT_JINJA_EVAL_H

#include "runtime/chat/jinja.h"

struct jargs {
    struct jv *pos; /* (npos) positional arguments */
    int npos;
    const struct jv *kwn; /* (nkw) keyword names (strings) */
    struct jv *kwv;       /* (nkw) keyword values */
    int nkw;
    size_t off; /* byte offset of the call, for errors */
};

struct jv jeval(struct jctx *c, const struct jnode *n, struct jframe *f);
void jrender(struct jctx *c, const struct jnode *n, struct jframe *f);
struct jv jframe_lookup(const struct jframe *f, const char *name, size_t n);

struct jv jv_getattr(struct jctx *c, struct jv obj, const char *name, size_t n, size_t off);
struct jv jv_getitem(struct jctx *c, struct jv obj, struct jv key, size_t off);
int jv_contains(struct jctx *c, struct jv hay, struct jv needle, size_t off);
int jv_compare(struct jctx *c, struct jv a, struct jv b, size_t off);
struct jlist *jv_iter_list(struct jctx *c, struct jv v, size_t off);
struct jv jv_concat(struct jctx *c, struct jv a, struct jv b);
void jfail_undefined(struct jctx *c, struct jv u, size_t off) __attribute__((noreturn));

/* jinja_builtins.c */
struct jv japply_filter(struct jctx *c, const char *name, size_t n, struct jv v, const struct jargs *A);
int japply_test(struct jctx *c, const char *name, size_t n, struct jv v, const struct jargs *A);
int jcall_method(struct jctx *c, struct jv obj, const char *name, size_t n, const struct jargs *A,
                 struct jv *out);
struct jv jcall_global(struct jctx *c, int fn, const struct jargs *A);

#endif
