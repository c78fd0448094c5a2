/* wtest — helpers shared by the weights tests: fixture paths, expected.json (written by make_fixtures.py from
 * the gguf/safetensors Python packages), FNV-1a hashes of tensor bytes, and a little-endian byte builder for
 * hand-made hostile GGUF headers. Header-only: each test file is its own executable. */
#ifndef FERRY_TESTS_WTEST_H
#define FERRY_TESTS_WTEST_H

#include <criterion/criterion.h>
#include <jansson.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "quant/fp16.h"

static inline const char *wt_fixture(char *buf, size_t n, const char *name)
{
    const char *src = getenv("FERRY_SRC");
    snprintf(buf, n, "%s/tests/weights/fixtures/%s", src ? src : ".", name);
    return buf;
}

/* The path of a ../shared testdata file, or NULL (after cr_skip_test) when it is absent. */
static inline const char *wt_testdata(char *buf, size_t n, const char *rel)
{
    const char *td = getenv("FERRY_TESTDATA");
    snprintf(buf, n, "%s/%s", td ? td : "../shared/testdata", rel);
    FILE *f = fopen(buf, "rb");
    if (!f) return NULL;
    fclose(f);
    return buf;
}

static inline json_t *wt_expected(void)
{
    char p[4096];
    json_error_t je;
    json_t *j = json_load_file(wt_fixture(p, sizeof p, "expected.json"), 0, &je);
    cr_assert(j != NULL, "cannot read %s: %s", p, je.text);
    return j;
}

static inline uint64_t wt_fnv(const void *data, size_t n)
{
    const uint8_t *p = data;
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 1099511628211ull;
    return h;
}

/* Element i of a float tensor as f32 (F32/F16/BF16 only). */
static inline float wt_elem(int type, const void *data, size_t i)
{
    if (type == 0) {
        float f;
        memcpy(&f, (const char *)data + 4 * i, 4);
        return f;
    }
    uint16_t h;
    memcpy(&h, (const char *)data + 2 * i, 2);
    return type == 1 ? f16_to_f32(h) : bf16_to_f32(h);
}

/* Checks one tensor against its expected.json entry: type, ne, nbytes, byte hash, first values. */
static inline void wt_check_tensor(json_t *e, const char *name, int type, const int64_t ne[4], int n_dims,
                                   const void *data, size_t nbytes)
{
    cr_assert_eq(type, (int)json_integer_value(json_object_get(e, "type")), "%s: type", name);
    json_t *jne = json_object_get(e, "ne");
    cr_assert_eq(n_dims, (int)json_array_size(jne), "%s: n_dims", name);
    for (int d = 0; d < 4; d++) {
        int64_t want = d < n_dims ? json_integer_value(json_array_get(jne, (size_t)d)) : 1;
        cr_assert_eq(ne[d], want, "%s: ne[%d] = %lld, want %lld", name, d, (long long)ne[d], (long long)want);
    }
    cr_assert_eq((long long)nbytes, json_integer_value(json_object_get(e, "nbytes")), "%s: nbytes", name);
    char h[24];
    snprintf(h, sizeof h, "%016llx", (unsigned long long)wt_fnv(data, nbytes));
    cr_assert_str_eq(h, json_string_value(json_object_get(e, "fnv")), "%s: bytes differ", name);
    json_t *first = json_object_get(e, "first");
    if (first && (type == 0 || type == 1 || type == 30)) {
        for (size_t i = 0; i < json_array_size(first); i++) {
            float want = (float)json_real_value(json_array_get(first, i));
            cr_assert_float_eq(wt_elem(type, data, i), want, 1e-6, "%s[%zu]", name, i);
        }
    }
}

/* ---------------------------------------------------------------- byte builder */

struct wt_buf {
    uint8_t *p;
    size_t n, cap;
};
static inline void wt_put(struct wt_buf *b, const void *src, size_t n)
{
    if (b->n + n > b->cap) {
        b->cap = (b->n + n) * 2 + 64;
        b->p = realloc(b->p, b->cap);
        cr_assert(b->p);
    }
    memcpy(b->p + b->n, src, n);
    b->n += n;
}
static inline void wt_u32(struct wt_buf *b, uint32_t v)
{
    wt_put(b, &v, 4);
}
static inline void wt_u64(struct wt_buf *b, uint64_t v)
{
    wt_put(b, &v, 8);
}
static inline void wt_str(struct wt_buf *b, const char *s)
{
    wt_u64(b, strlen(s));
    wt_put(b, s, strlen(s));
}
static inline void wt_pad(struct wt_buf *b, size_t align)
{
    while (b->n % align) wt_put(b, "", 1);
}
static inline void wt_zeros(struct wt_buf *b, size_t n)
{
    for (size_t i = 0; i < n; i++) wt_put(b, "", 1);
}

/* got vs ref logits (V): finite; the relative RMS bound rel_rms for quantized types, or (rel_rms 0) the
 * element-wise fp32 bound |got - ref| <= fp_rtol·(1 + max|ref|); and the same top-1 token either way (up to
 * rel_rms 0.1). */
static inline void wt_check_logits(const char *what, const char *type, const float *got, const float *ref,
                                   int V, double rel_rms, double fp_rtol)
{
    double num = 0, den = 0, maxref = 0, worst = 0;
    int top_g = 0, top_r = 0;
    for (int v = 0; v < V; v++) {
        num += ((double)got[v] - ref[v]) * ((double)got[v] - ref[v]);
        den += (double)ref[v] * ref[v];
        maxref = fmax(maxref, fabs(ref[v]));
        worst = fmax(worst, fabs((double)got[v] - ref[v]));
        if (got[v] > got[top_g]) top_g = v;
        if (ref[v] > ref[top_r]) top_r = v;
    }
    cr_assert(isfinite(num) && den > 0, "%s %s: logits not finite (or all zero)", what, type);
    if (rel_rms > 0)
        cr_assert(sqrt(num / den) <= rel_rms, "%s %s: logits relative RMS error %.3g > %.3g", what, type,
                  sqrt(num / den), rel_rms);
    else
        cr_assert(worst <= fp_rtol * maxref + fp_rtol, "%s %s: logits differ by %.3g (max|ref| %.3g)", what,
                  type, worst, maxref);
    if (rel_rms == 0 || rel_rms <= 0.1)
        cr_assert_eq(top_g, top_r, "%s %s: top token %d, reference %d", what, type, top_g, top_r);
}

#endif
