/* GGUF reader tests: real files (stories260K, fixtures written by the gguf Python package) against
 * expected.json; every truncation; seeded bit flips; hand-built hostile headers, each with its error. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kernels/core/status.h"
#include "weights/gguf.h"
#include "weights/gguf_write.h"
#include "wtest.h"

static void *read_all(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    cr_assert(f, "open %s", path);
    fseek(f, 0, SEEK_END);
    *n = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    void *p = malloc(*n);
    cr_assert(fread(p, 1, *n, f) == *n);
    fclose(f);
    return p;
}

static void check_tensors(struct gguf *g, json_t *exp_tensors)
{
    cr_assert_eq((size_t)gguf_n_tensors(g), json_array_size(exp_tensors));
    for (int i = 0; i < gguf_n_tensors(g); i++) {
        const struct gguf_tensor_info *t = gguf_tensor(g, i);
        json_t *e = json_array_get(exp_tensors, (size_t)i);
        const char *name = json_string_value(json_object_get(e, "name"));
        cr_assert(t->name.len == strlen(name) && memcmp(t->name.ptr, name, t->name.len) == 0,
                  "tensor %d is %.*s", i, (int)t->name.len, t->name.ptr);
        wt_check_tensor(e, name, (int)t->type, t->ne, t->n_dims, t->data, t->nbytes);
    }
}

/* ---------------------------------------------------------------- real files */

Test(gguf, stories260K_header_and_tensors)
{
    char p[4096], err[256];
    if (!wt_testdata(p, sizeof p, "models/stories260K.gguf")) cr_skip_test("missing FILE: %s", p);
    struct gguf *g;
    int rc = gguf_open(p, &g, err);
    cr_assert_eq(rc, FERRY_OK, "%s", err);
    cr_assert_eq(gguf_version(g), 3u);
    cr_assert_eq(gguf_n_tensors(g), 48);
    cr_assert_eq(gguf_n_kv(g), 19);
    cr_assert_eq(gguf_file_size(g), 1185376u);
    struct gguf_str s;
    cr_assert_eq(gguf_get_str(g, "general.architecture", &s), FERRY_OK);
    cr_assert(s.len == 5 && memcmp(s.ptr, "llama", 5) == 0);
    uint32_t u;
    cr_assert_eq(gguf_get_u32(g, "llama.embedding_length", &u), FERRY_OK);
    cr_assert_eq(u, 64u);
    cr_assert_eq(gguf_get_u32(g, "llama.attention.head_count_kv", &u), FERRY_OK);
    cr_assert_eq(u, 4u);
    float f;
    cr_assert_eq(gguf_get_f32(g, "llama.attention.layer_norm_rms_epsilon", &f), FERRY_OK);
    cr_assert_float_eq(f, 1e-5f, 1e-12);
    cr_assert_eq(gguf_get_f32(g, "llama.rope.freq_base", &f), FERRY_ERR_NOT_FOUND);
    cr_assert_eq(gguf_find_key(g, "general.alignment"), -1);
    enum gguf_vtype et;
    uint64_t n;
    cr_assert_eq(gguf_get_arr(g, "tokenizer.ggml.tokens", &et, &n), FERRY_OK);
    cr_assert_eq(et, GGUF_TYPE_STRING);
    cr_assert_eq(n, 512u);
    cr_assert_eq(gguf_arr_str(g, "tokenizer.ggml.tokens", 3, &s), FERRY_OK);
    cr_assert(s.len == 6 && memcmp(s.ptr, "<0x00>", 6) == 0, "token 3 is %.*s", (int)s.len, s.ptr);
    cr_assert_eq(gguf_arr_str(g, "tokenizer.ggml.tokens", 258, &s), FERRY_OK);
    cr_assert(s.len == 6 && memcmp(s.ptr, "<0xFF>", 6) == 0);
    cr_assert_eq(gguf_arr_str(g, "tokenizer.ggml.tokens", 512, &s), FERRY_ERR_RANGE);
    cr_assert_eq(gguf_get_u32(g, "tokenizer.ggml.eos_token_id", &u), FERRY_OK);
    cr_assert_eq(u, 2u);
    float *scores = malloc(512 * sizeof *scores);
    cr_assert_eq(gguf_arr_f32(g, "tokenizer.ggml.scores", scores, 512), FERRY_OK);
    cr_assert(isfinite(scores[511]));
    free(scores);

    json_t *exp = wt_expected();
    json_t *st = json_object_get(exp, "stories260K.gguf");
    if (!st) cr_skip_test("expected.json has no stories260K facts (make_fixtures.py ran without ../shared)");
    cr_assert_eq(json_integer_value(json_object_get(st, "data_offset")), 14176);
    /* The data section begins at 14176: the first tensor's data is that many bytes into the file. */
    size_t buf_n;
    uint8_t *buf = read_all(p, &buf_n);
    struct gguf *gm;
    cr_assert_eq(gguf_open_mem(buf, buf_n, &gm, err), FERRY_OK, "%s", err);
    cr_assert_eq((const uint8_t *)gguf_tensor(gm, 0)->data - buf, 14176);
    check_tensors(g, json_object_get(st, "tensors"));
    gguf_close(gm);
    free(buf);
    json_decref(exp);
    gguf_close(g);
}

Test(gguf, v2_file)
{
    char p[4096], err[256];
    struct gguf *g;
    cr_assert_eq(gguf_open(wt_fixture(p, sizeof p, "v2_llama.gguf"), &g, err), FERRY_OK, "%s", err);
    cr_assert_eq(gguf_version(g), 2u);
    json_t *exp = wt_expected();
    check_tensors(g, json_object_get(json_object_get(exp, "v2_llama.gguf"), "tensors"));
    float f;
    cr_assert_eq(gguf_get_f32(g, "llama.rope.freq_base", &f), FERRY_OK);
    cr_assert_float_eq(f, 500000.0f, 0);
    json_decref(exp);
    gguf_close(g);
}

Test(gguf, every_metadata_and_tensor_type)
{
    char p[4096], err[256];
    struct gguf *g;
    cr_assert_eq(gguf_open(wt_fixture(p, sizeof p, "types.gguf"), &g, err), FERRY_OK, "%s", err);
    uint32_t u;
    int64_t i64;
    float f;
    int b;
    struct gguf_str s;
    cr_assert_eq(gguf_get_u32(g, "t.u8", &u), FERRY_OK);
    cr_assert_eq(u, 200u);
    cr_assert_eq(gguf_kv_type(g, gguf_find_key(g, "t.u8")), GGUF_TYPE_UINT8);
    cr_assert_eq(gguf_get_i64(g, "t.i8", &i64), FERRY_OK);
    cr_assert_eq(i64, -100);
    cr_assert_eq(gguf_get_u32(g, "t.i8", &u), FERRY_ERR_FORMAT, "negative into u32");
    cr_assert_eq(gguf_get_u32(g, "t.u16", &u), FERRY_OK);
    cr_assert_eq(u, 60000u);
    cr_assert_eq(gguf_get_i64(g, "t.i16", &i64), FERRY_OK);
    cr_assert_eq(i64, -30000);
    cr_assert_eq(gguf_get_u32(g, "t.u32", &u), FERRY_OK);
    cr_assert_eq(u, 4000000000u);
    cr_assert_eq(gguf_get_i64(g, "t.i32", &i64), FERRY_OK);
    cr_assert_eq(i64, -2000000000);
    cr_assert_eq(gguf_get_f32(g, "t.f32", &f), FERRY_OK);
    cr_assert_float_eq(f, 1.5f, 0);
    cr_assert_eq(gguf_get_bool(g, "t.bool", &b), FERRY_OK);
    cr_assert_eq(b, 1);
    cr_assert_eq(gguf_get_bool(g, "t.u8", &b), FERRY_ERR_FORMAT);
    cr_assert_eq(gguf_get_str(g, "t.str", &s), FERRY_OK);
    cr_assert(s.len == 6 && memcmp(s.ptr, "h\xc3\xa9llo", 6) == 0);
    cr_assert_eq(gguf_get_str(g, "t.u8", &s), FERRY_ERR_FORMAT);
    cr_assert_eq(gguf_get_i64(g, "t.u64", &i64), FERRY_ERR_FORMAT, "2^63+5 does not fit i64");
    cr_assert_eq(gguf_get_u32(g, "t.u64", &u), FERRY_ERR_FORMAT);
    cr_assert_eq(gguf_kv_type(g, gguf_find_key(g, "t.u64")), GGUF_TYPE_UINT64);
    cr_assert_eq(gguf_get_i64(g, "t.i64", &i64), FERRY_OK);
    cr_assert_eq(i64, -(1ll << 40));
    cr_assert_eq(gguf_get_f32(g, "t.f64", &f), FERRY_OK);
    cr_assert_float_eq(f, 2.25f, 0);
    cr_assert_eq(gguf_get_f32(g, "t.i32", &f), FERRY_OK, "integers convert to float");
    cr_assert_float_eq(f, -2e9f, 1);
    cr_assert_eq(gguf_get_f32(g, "t.str", &f), FERRY_ERR_FORMAT);
    cr_assert_eq(gguf_get_u32(g, "no.such.key", &u), FERRY_ERR_NOT_FOUND);

    enum gguf_vtype et;
    uint64_t n;
    int32_t iv[3];
    float fv[3];
    cr_assert_eq(gguf_get_arr(g, "t.arr_i32", &et, &n), FERRY_OK);
    cr_assert_eq(et, GGUF_TYPE_INT32);
    cr_assert_eq(n, 3u);
    cr_assert_eq(gguf_arr_i32(g, "t.arr_i32", iv, 3), FERRY_OK);
    cr_assert(iv[0] == 1 && iv[1] == -2 && iv[2] == 3);
    cr_assert_eq(gguf_arr_i32(g, "t.arr_i32", iv, 2), FERRY_ERR_RANGE, "n must match");
    cr_assert_eq(gguf_arr_f32(g, "t.arr_i32", fv, 3), FERRY_OK);
    cr_assert_float_eq(fv[1], -2.0f, 0);
    cr_assert_eq(gguf_arr_f32(g, "t.arr_f32", fv, 3), FERRY_OK);
    cr_assert(fv[0] == 0.5f && fv[1] == 1.5f && fv[2] == -2.0f);
    cr_assert_eq(gguf_arr_i32(g, "t.arr_f32", iv, 3), FERRY_ERR_FORMAT);
    cr_assert_eq(gguf_get_arr(g, "t.arr_str", &et, &n), FERRY_OK);
    cr_assert(et == GGUF_TYPE_STRING && n == 3);
    cr_assert_eq(gguf_arr_str(g, "t.arr_str", 1, &s), FERRY_OK);
    cr_assert_eq(s.len, 0u);
    cr_assert_eq(gguf_arr_str(g, "t.arr_str", 2, &s), FERRY_OK);
    cr_assert(s.len == 3 && memcmp(s.ptr, "ccc", 3) == 0);
    cr_assert_eq(gguf_get_arr(g, "t.arr_bool", &et, &n), FERRY_OK);
    cr_assert(et == GGUF_TYPE_BOOL && n == 2);
    cr_assert_eq(gguf_get_arr(g, "t.nested", &et, &n), FERRY_OK);
    cr_assert(et == GGUF_TYPE_ARRAY && n == 3);
    cr_assert_eq(gguf_arr_f32(g, "t.nested", fv, 3), FERRY_ERR_FORMAT, "nested elements are not exposed");
    cr_assert_eq(gguf_get_arr(g, "t.nested_str", &et, &n), FERRY_OK);
    cr_assert(et == GGUF_TYPE_ARRAY && n == 2);
    cr_assert_eq(gguf_get_arr(g, "t.nested3", &et, &n), FERRY_OK);
    cr_assert(et == GGUF_TYPE_ARRAY && n == 2);
    cr_assert_eq(gguf_get_arr(g, "t.u8", &et, &n), FERRY_ERR_FORMAT);

    /* Iteration by index sees every key once. */
    int seen = 0;
    for (int i = 0; i < gguf_n_kv(g); i++) {
        struct gguf_str k = gguf_kv_key(g, i);
        if (k.len > 2 && memcmp(k.ptr, "t.", 2) == 0) seen++;
    }
    cr_assert_eq(seen, 19);

    json_t *exp = wt_expected();
    check_tensors(g, json_object_get(json_object_get(exp, "types.gguf"), "tensors"));
    json_decref(exp);
    gguf_close(g);
}

/* ---------------------------------------------------------------- truncation and bit flips */

/* Opens a private exact-size copy so that any read past the end is a heap overflow under ASan. */
static int open_copy(const uint8_t *src, size_t n, char err[256], size_t *max_end)
{
    uint8_t *b = malloc(n ? n : 1);
    memcpy(b, src, n);
    struct gguf *g;
    int rc = gguf_open_mem(b, n, &g, err);
    if (rc == FERRY_OK) {
        /* Exercise every accessor over whatever was accepted; all views must lie inside the buffer. */
        for (int i = 0; i < gguf_n_kv(g); i++) {
            struct gguf_str k = gguf_kv_key(g, i);
            cr_assert((const uint8_t *)k.ptr >= b && (const uint8_t *)k.ptr + k.len <= b + n);
            char key[256];
            if (k.len >= sizeof key || memchr(k.ptr, 0, k.len)) continue;
            memcpy(key, k.ptr, k.len);
            key[k.len] = 0;
            uint32_t u;
            int64_t i64;
            float f;
            int bo;
            struct gguf_str s;
            gguf_get_u32(g, key, &u);
            gguf_get_i64(g, key, &i64);
            gguf_get_f32(g, key, &f);
            gguf_get_bool(g, key, &bo);
            if (gguf_get_str(g, key, &s) == FERRY_OK)
                cr_assert((const uint8_t *)s.ptr >= b && (const uint8_t *)s.ptr + s.len <= b + n);
            enum gguf_vtype et;
            uint64_t cnt;
            if (gguf_get_arr(g, key, &et, &cnt) == FERRY_OK) {
                if (et == GGUF_TYPE_STRING)
                    for (uint64_t j = 0; j < cnt; j++) {
                        cr_assert_eq(gguf_arr_str(g, key, j, &s), FERRY_OK);
                        cr_assert((const uint8_t *)s.ptr >= b && (const uint8_t *)s.ptr + s.len <= b + n);
                    }
                else if (cnt <= n) {
                    float *fv = malloc((cnt ? cnt : 1) * sizeof *fv);
                    gguf_arr_f32(g, key, fv, cnt);
                    free(fv);
                }
            }
        }
        for (int i = 0; i < gguf_n_tensors(g); i++) {
            const struct gguf_tensor_info *t = gguf_tensor(g, i);
            const uint8_t *d = t->data;
            cr_assert(d >= b && t->nbytes <= n && d + t->nbytes <= b + n, "tensor %d outside the buffer", i);
            if (max_end && (size_t)(d + t->nbytes - b) > *max_end) *max_end = (size_t)(d + t->nbytes - b);
        }
        gguf_close(g);
    } else {
        cr_assert(err[0] != '\0', "an error without a message (rc %d)", rc);
        cr_assert(strchr(err, '\n') == NULL, "multi-line error: %s", err);
    }
    free(b);
    return rc;
}

Test(gguf, every_truncation_fails_cleanly, .timeout = 60)
{
    char p[4096], err[256];
    if (!wt_testdata(p, sizeof p, "models/stories260K.gguf")) cr_skip_test("missing FILE: %s", p);
    size_t n;
    uint8_t *buf = read_all(p, &n);
    size_t end = 0;
    cr_assert_eq(open_copy(buf, n, err, &end), FERRY_OK, "%s", err);
    cr_assert(end > 14176 && end <= n);
    for (size_t len = 0; len <= 14176; len++) {
        int rc = open_copy(buf, len, err, NULL);
        cr_assert(rc == FERRY_ERR_FORMAT, "prefix of %zu bytes: rc %d (%s)", len, rc, err);
    }
    /* Cuts inside the data: any cut before the last tensor's end must fail. */
    for (size_t len = 14177; len < end; len += 4099) {
        int rc = open_copy(buf, len, err, NULL);
        cr_assert(rc == FERRY_ERR_FORMAT, "prefix of %zu bytes: rc %d", len, rc);
        cr_assert(strstr(err, "runs past the end") != NULL, "%s", err);
    }
    cr_assert_eq(open_copy(buf, end - 1, err, NULL), FERRY_ERR_FORMAT);
    cr_assert(strstr(err, "offset") != NULL, "%s", err);
    free(buf);
}

static uint64_t rng_next(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

static void bit_flips(const char *path, int rounds, uint64_t seed)
{
    char err[256];
    size_t n;
    uint8_t *orig = read_all(path, &n);
    uint8_t *buf = malloc(n);
    struct gguf *g;
    cr_assert_eq(gguf_open_mem(orig, n, &g, err), FERRY_OK, "%s", err);
    /* The header is everything before the first tensor's data (or the whole file without tensors). */
    size_t hdr = gguf_n_tensors(g) ? (size_t)((const uint8_t *)gguf_tensor(g, 0)->data - orig) : n;
    for (int i = 0; i < gguf_n_tensors(g); i++) {
        size_t o = (size_t)((const uint8_t *)gguf_tensor(g, i)->data - orig);
        if (o < hdr) hdr = o;
    }
    gguf_close(g);
    uint64_t s = seed;
    int ok = 0, bad = 0;
    for (int r = 0; r < rounds; r++) {
        memcpy(buf, orig, n);
        int flips = 1 + (int)(rng_next(&s) % 4);
        for (int k = 0; k < flips; k++) {
            size_t at = (size_t)(rng_next(&s) % hdr);
            buf[at] ^= (uint8_t)(1u << (rng_next(&s) % 8));
        }
        /* Sometimes a whole byte, or a length's high byte, to reach the absurd-count paths. */
        if (r % 5 == 0) buf[rng_next(&s) % hdr] = (uint8_t)rng_next(&s);
        if (open_copy(buf, n, err, NULL) == FERRY_OK)
            ok++;
        else
            bad++;
    }
    cr_assert(bad > 0, "no flip was ever rejected: the test is not reaching the checks");
    cr_log_info("%s: %d flipped files accepted, %d rejected", path, ok, bad);
    free(buf);
    free(orig);
}

Test(gguf, seeded_bit_flips_never_crash, .timeout = 60)
{
    char p[4096];
    bit_flips(wt_fixture(p, sizeof p, "types.gguf"), 4000, 0x9e3779b97f4a7c15ull);
    bit_flips(wt_fixture(p, sizeof p, "v2_llama.gguf"), 2000, 12345);
    if (wt_testdata(p, sizeof p, "models/stories260K.gguf")) bit_flips(p, 1000, 777);
}

/* ---------------------------------------------------------------- hostile headers */

/* A small valid file, with knobs for each hostile variant. */
struct knobs {
    uint32_t magic_ok, version;
    uint64_t n_tensors, n_kv; /* as written (may lie) */
    int kv_dup, tensor_dup;
    uint64_t key_len;           /* 0: the real length */
    uint64_t str_len;           /* of general.name's value; 0: real */
    uint64_t arr_len;           /* of the u32 array; 0: real */
    uint32_t arr_type;          /* element type of the array (default u32) */
    int nest;                   /* depth of a nested-array key (0: none) */
    uint32_t align_type, align; /* general.alignment (align_type 0: no key) */
    uint32_t value_type;        /* type of general.name (default string) */
    uint32_t n_dims;
    uint64_t ne[4];
    uint32_t ttype;
    uint64_t offset0, offset1;
};

static struct knobs defaults(void)
{
    return (struct knobs){.magic_ok = 1,
                          .version = 3,
                          .n_tensors = 2,
                          .n_kv = 4,
                          .arr_type = GGUF_TYPE_UINT32,
                          .align_type = GGUF_TYPE_UINT32,
                          .align = 64,
                          .value_type = GGUF_TYPE_STRING,
                          .n_dims = 2,
                          .ne = {32, 2, 1, 1},
                          .ttype = 0,
                          .offset0 = 0,
                          .offset1 = 256};
}

static struct wt_buf build(struct knobs k)
{
    struct wt_buf b = {0};
    wt_put(&b, k.magic_ok ? "GGUF" : "GGUX", 4);
    wt_u32(&b, k.version);
    wt_u64(&b, k.n_tensors);
    wt_u64(&b, k.n_kv);
    /* kv 1: general.architecture = "llama" (key length may lie) */
    wt_u64(&b, k.key_len ? k.key_len : 20);
    wt_put(&b, "general.architecture", 20);
    wt_u32(&b, GGUF_TYPE_STRING);
    wt_str(&b, "llama");
    /* kv 2: general.name (type and string length may lie) */
    wt_str(&b, k.kv_dup ? "general.architecture" : "general.name");
    wt_u32(&b, k.value_type);
    wt_u64(&b, k.str_len ? k.str_len : 4);
    wt_put(&b, "tiny", 4);
    /* kv 3: an array of u32 (length and type may lie), or nested arrays */
    wt_str(&b, "test.arr");
    wt_u32(&b, GGUF_TYPE_ARRAY);
    for (int d = 0; d < k.nest; d++) {
        wt_u32(&b, GGUF_TYPE_ARRAY);
        wt_u64(&b, 1);
    }
    wt_u32(&b, k.arr_type);
    wt_u64(&b, k.arr_len ? k.arr_len : 3);
    wt_u32(&b, 1);
    wt_u32(&b, 2);
    wt_u32(&b, 3);
    /* kv 4: general.alignment */
    wt_str(&b, k.align_type ? "general.alignment" : "general.padding__");
    wt_u32(&b, k.align_type ? k.align_type : GGUF_TYPE_UINT32);
    wt_u32(&b, k.align);
    /* tensors */
    for (int t = 0; t < 2; t++) {
        wt_str(&b, (t == 1 && !k.tensor_dup) ? "second" : "first");
        wt_u32(&b, t == 0 ? k.n_dims : 1);
        for (uint32_t d = 0; d < (t == 0 ? k.n_dims : 1) && d < 4; d++) wt_u64(&b, t == 0 ? k.ne[d] : 8);
        wt_u32(&b, t == 0 ? k.ttype : 0);
        wt_u64(&b, t == 0 ? k.offset0 : k.offset1);
    }
    wt_pad(&b, k.align_type && k.align && !(k.align & (k.align - 1)) && k.align <= 4096 ? k.align : 32);
    wt_zeros(&b, 512);
    return b;
}

static void expect_fail(struct knobs k, int want_rc, const char *want_msg)
{
    struct wt_buf b = build(k);
    char err[256] = "";
    int rc = open_copy(b.p, b.n, err, NULL);
    cr_expect_eq(rc, want_rc, "want %d got %d: %s", want_rc, rc, err);
    cr_expect(strstr(err, want_msg) != NULL, "message '%s' lacks '%s'", err, want_msg);
    free(b.p);
}

Test(gguf, hostile_baseline_is_valid)
{
    struct wt_buf b = build(defaults());
    char err[256];
    struct gguf *g;
    cr_assert_eq(gguf_open_mem(b.p, b.n, &g, err), FERRY_OK, "%s", err);
    cr_assert_eq(gguf_n_tensors(g), 2);
    cr_assert_eq(gguf_tensor(g, 0)->nbytes, 256u);
    cr_assert_eq(gguf_tensor(g, 1)->nbytes, 32u);
    cr_assert_eq(((const uint8_t *)gguf_tensor(g, 0)->data - b.p) % 64, 0, "alignment 64 honoured");
    gguf_close(g);
    free(b.p);
}

Test(gguf, hostile_counts_and_lengths)
{
    struct knobs k;
    k = defaults(), k.n_kv = 1ull << 62;
    expect_fail(k, FERRY_ERR_FORMAT, "metadata count 4611686018427387904 at offset 16");
    k = defaults(), k.n_tensors = 1ull << 62;
    expect_fail(k, FERRY_ERR_FORMAT, "tensor count");
    k = defaults(), k.n_kv = 1000; /* plausible-looking but runs into the tensor infos and data */
    {
        struct wt_buf b = build(k);
        char err[256];
        cr_expect_lt(open_copy(b.p, b.n, err, NULL), 0);
        free(b.p);
    }
    k = defaults(), k.key_len = 1ull << 63;
    expect_fail(k, FERRY_ERR_FORMAT, "string length 9223372036854775808");
    k = defaults(), k.key_len = 70000;
    expect_fail(k, FERRY_ERR_FORMAT, "metadata key at offset 24: string length 70000 exceeds");
    k = defaults(), k.str_len = 0xFFFFFFFFFFFFull;
    expect_fail(k, FERRY_ERR_FORMAT, "general.name");
    k = defaults(), k.arr_len = 1ull << 61;
    expect_fail(k, FERRY_ERR_FORMAT, "key 'test.arr' at offset");
    k = defaults(), k.arr_len = 1ull << 61, k.arr_type = GGUF_TYPE_STRING;
    expect_fail(k, FERRY_ERR_FORMAT, "array length 2305843009213693952 is impossible");
    k = defaults(), k.arr_type = 13;
    expect_fail(k, FERRY_ERR_FORMAT, "unknown array element type 13");
    k = defaults(), k.value_type = 99;
    expect_fail(k, FERRY_ERR_FORMAT, "key 'general.name' at offset");
    k = defaults(), k.nest = 20;
    expect_fail(k, FERRY_ERR_FORMAT, "nested deeper");
}

Test(gguf, hostile_magic_version_alignment)
{
    struct knobs k;
    k = defaults(), k.magic_ok = 0;
    expect_fail(k, FERRY_ERR_FORMAT, "bad magic at offset 0");
    k = defaults(), k.version = 1;
    expect_fail(k, FERRY_ERR_UNSUPPORTED, "version 1 at offset 4");
    k = defaults(), k.version = 4;
    expect_fail(k, FERRY_ERR_UNSUPPORTED, "version 4");
    k = defaults(), k.version = 0x03000000;
    expect_fail(k, FERRY_ERR_UNSUPPORTED, "big-endian");
    k = defaults(), k.align = 48;
    expect_fail(k, FERRY_ERR_FORMAT, "general.alignment");
    k = defaults(), k.align = 0;
    expect_fail(k, FERRY_ERR_FORMAT, "power-of-two");
    k = defaults(), k.align_type = GGUF_TYPE_FLOAT32, k.align = 0x42000000; /* 32.0f */
    expect_fail(k, FERRY_ERR_FORMAT, "general.alignment");
    k = defaults(), k.kv_dup = 1;
    expect_fail(k, FERRY_ERR_FORMAT, "duplicate metadata key 'general.architecture' at offset 69");
}

Test(gguf, hostile_tensor_infos)
{
    struct knobs k;
    k = defaults(), k.tensor_dup = 1;
    expect_fail(k, FERRY_ERR_FORMAT, "duplicate tensor name 'first' at offset");
    k = defaults(), k.n_dims = 5;
    expect_fail(k, FERRY_ERR_FORMAT, "tensor 'first' at offset");
    k = defaults(), k.n_dims = 0;
    expect_fail(k, FERRY_ERR_FORMAT, "n_dims 0 not in 1..4");
    k = defaults(), k.ne[1] = 0;
    expect_fail(k, FERRY_ERR_FORMAT, "ne[1] = 0");
    k = defaults(), k.ne[0] = 1ull << 63;
    expect_fail(k, FERRY_ERR_FORMAT, "ne[0] = 9223372036854775808");
    k = defaults(), k.n_dims = 3, k.ne[0] = 1ull << 32, k.ne[1] = 1ull << 32, k.ne[2] = 16;
    expect_fail(k, FERRY_ERR_FORMAT, "element count overflows");
    k = defaults(), k.ne[0] = 1ull << 31, k.ne[1] = 1ull << 31; /* 2^62 f32 = 2^64 bytes */
    expect_fail(k, FERRY_ERR_FORMAT, "byte size overflows");
    k = defaults(), k.ne[0] = 1ull << 20, k.ne[1] = 1ull << 20;
    expect_fail(k, FERRY_ERR_FORMAT, "runs past the end");
    k = defaults(), k.ttype = 99;
    expect_fail(k, FERRY_ERR_FORMAT, "unknown ggml type 99");
    /* Types llama.cpp reads and ferry does not: refused by name, naming the tensor. */
    k = defaults(), k.ttype = 34;
    expect_fail(k, FERRY_ERR_UNSUPPORTED, "tensor 'first' at offset");
    k = defaults(), k.ttype = 34;
    expect_fail(k, FERRY_ERR_UNSUPPORTED, "type TQ1_0 (34) is not supported");
    k = defaults(), k.ttype = 35;
    expect_fail(k, FERRY_ERR_UNSUPPORTED, "type TQ2_0 (35) is not supported");
    k = defaults(), k.ttype = 41;
    expect_fail(k, FERRY_ERR_UNSUPPORTED, "type Q1_0 (41) is not supported");
    k = defaults(), k.ttype = 42;
    expect_fail(k, FERRY_ERR_UNSUPPORTED, "type Q2_0 (42) is not supported");
    k = defaults(), k.ttype = 43;
    expect_fail(k, FERRY_ERR_FORMAT, "unknown ggml type 43");
    k = defaults(), k.ttype = DTYPE_Q8_0, k.ne[0] = 31;
    expect_fail(k, FERRY_ERR_FORMAT, "not a multiple of Q8_0's block size 32");
    k = defaults(), k.offset0 = 1ull << 62;
    expect_fail(k, FERRY_ERR_FORMAT, "runs past the end");
    k = defaults(), k.offset0 = UINT64_MAX - 63;
    expect_fail(k, FERRY_ERR_FORMAT, "runs past the end");
    k = defaults(), k.offset0 = 4;
    expect_fail(k, FERRY_ERR_FORMAT, "not a multiple of the alignment 64");
    k = defaults(), k.offset1 = 128;
    expect_fail(k, FERRY_ERR_FORMAT, "overlaps");
}

Test(gguf, open_errors_name_the_file)
{
    char err[256];
    struct gguf *g;
    cr_assert_eq(gguf_open("/nonexistent/x.gguf", &g, err), FERRY_ERR_NOT_FOUND);
    cr_assert(strstr(err, "x.gguf") != NULL, "%s", err);
    cr_assert_eq(gguf_open_mem(NULL, 0, &g, err), FERRY_ERR_FORMAT);
    char p[] = "/tmp/ferry_wt_XXXXXX";
    int fd = mkstemp(p);
    cr_assert(fd >= 0);
    cr_assert_eq(write(fd, "GGUF\x03\x00\x00\x00", 8), 8);
    close(fd);
    cr_assert_eq(gguf_open(p, &g, err), FERRY_ERR_FORMAT);
    cr_assert(strstr(err, "ferry_wt_") != NULL && strstr(err, "truncated") != NULL, "%s", err);
    unlink(p);
}

/* A file with no metadata at all (gguf_write with zero keys: its empty key block is copied from no buffer)
 * and one tensor: written, read back, the tensor's bytes intact. */
Test(gguf, written_without_metadata)
{
    char err[256] = "", path[] = "/tmp/ferry-gguf-nokv-XXXXXX";
    const int fd = mkstemp(path);
    cr_assert_geq(fd, 0);
    close(fd);
    struct gguf_writer *w;
    const int64_t ne[1] = {8};
    const float v[8] = {1, -2, 3, -4, 5, -6, 7, -8};
    cr_assert_eq(gguf_writer_init(&w, err), FERRY_OK, "%s", err);
    cr_assert_eq(gguf_writer_tensor(w, "t", DTYPE_F32, 1, ne, err), FERRY_OK, "%s", err);
    cr_assert_eq(gguf_writer_open(w, path, err), FERRY_OK, "%s", err);
    cr_assert_eq(gguf_writer_data(w, v, sizeof v, err), FERRY_OK, "%s", err);
    cr_assert_eq(gguf_writer_finish(w, err), FERRY_OK, "%s", err);
    gguf_writer_free(w);
    struct gguf *g;
    cr_assert_eq(gguf_open(path, &g, err), FERRY_OK, "%s", err);
    cr_assert_eq(gguf_n_kv(g), 0);
    cr_assert_eq(gguf_n_tensors(g), 1);
    const struct gguf_tensor_info *t = gguf_tensor(g, 0);
    cr_assert(t->name.len == 1 && t->name.ptr[0] == 't' && t->nbytes == sizeof v);
    cr_assert_eq(memcmp(t->data, v, sizeof v), 0);
    gguf_close(g);
    unlink(path);
}
