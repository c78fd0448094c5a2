/* toktest — helpers shared by the tokenizer tests: locating test data (skipping with a message when it is
 * absent), loading a vocab GGUF, reading files, comparing id lists with a readable failure message. */
#ifndef FERRY_TOKTEST_H
#define FERRY_TOKTEST_H

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kernels/core/status.h"
#include "runtime/tokenizer.h"
#include "weights/gguf.h"

/* $FERRY_TESTDATA/<rel>, or skips the test when the file is not there. */
static inline char *tt_data_path(const char *rel)
{
    const char *root = getenv("FERRY_TESTDATA");
    if (!root) root = "../shared/testdata";
    char *p = malloc(strlen(root) + strlen(rel) + 2);
    sprintf(p, "%s/%s", root, rel);
    if (access(p, R_OK) != 0) {
        cr_skip_test("missing FILE: %s (set FERRY_TESTDATA to ../shared/testdata)", p);
    }
    return p;
}

/* <$FERRY_SRC or .>/<rel> into out (a file of the source tree). */
static inline void tt_src_path(char out[4096], const char *rel)
{
    const char *src = getenv("FERRY_SRC");
    snprintf(out, 4096, "%s/%s", src ? src : ".", rel);
}

static inline char *tt_read_file(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    cr_assert(f, "cannot open %s", path);
    fseek(f, 0, SEEK_END);
    long sz = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *p = malloc((size_t)sz + 1);
    cr_assert(fread(p, 1, (size_t)sz, f) == (size_t)sz);
    p[sz] = 0;
    fclose(f);
    if (n) *n = (size_t)sz;
    return p;
}

/* Loads a tokenizer from a GGUF file; the gguf stays open in *g (close after tokenizer_free is fine too:
 * the tokenizer copies what it needs). Returns the status; fills err. */
static inline int tt_load_gguf(const char *path, struct tokenizer **t, char err[256])
{
    struct gguf *g = NULL;
    int rc = gguf_open(path, &g, err);
    if (rc != FERRY_OK) return rc;
    rc = tokenizer_init_gguf(t, g, err);
    gguf_close(g);
    return rc;
}

/* Encodes and returns a malloc'd id array (count in *n). */
static inline int32_t *tt_encode(const struct tokenizer *t, const char *s, size_t len, int add_bos,
                                 int special, int *n)
{
    int cap = 64;
    int32_t *ids = malloc((size_t)cap * sizeof *ids);
    int k = tokenizer_encode(t, s, len, add_bos, special, ids, cap);
    cr_assert(k >= 0, "tokenizer_encode failed: %s", ferry_status_str(k));
    if (k > cap) {
        ids = realloc(ids, (size_t)k * sizeof *ids);
        int k2 = tokenizer_encode(t, s, len, add_bos, special, ids, k);
        cr_assert_eq(k2, k);
    }
    *n = k;
    return ids;
}

static inline void tt_fmt_ids(char *buf, size_t cap, const int32_t *ids, int n)
{
    size_t k = 0;
    buf[0] = 0;
    for (int i = 0; i < n && k + 16 < cap; i++) k += (size_t)snprintf(buf + k, cap - k, " %d", ids[i]);
    if (k + 16 >= cap) snprintf(buf + k, cap - k, " ...");
}

/* 1 when equal; otherwise logs the case and both id lists. */
static inline int tt_ids_equal(const char *what, const int32_t *got, int ng, const int32_t *exp, int ne)
{
    int ok = ng == ne;
    for (int i = 0; ok && i < ng; i++) ok = got[i] == exp[i];
    if (!ok) {
        char a[600], b[600];
        tt_fmt_ids(a, sizeof a, got, ng);
        tt_fmt_ids(b, sizeof b, exp, ne);
        cr_log_error("%s\n   got:     %s\n   expected:%s", what, a, b);
    }
    return ok;
}

#endif
