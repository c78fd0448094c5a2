/* gguf — a bounds-checked reader of GGUF v2/v3 files (see gguf.h for the format).
 *
 * Open parses the whole header once, checking every length, count, type and offset against the bytes that
 * remain before anything is allocated or read: a count is plausible only if that many of its smallest
 * possible elements fit in what is left of the file, so no allocation can exceed the file's own size.
 * After a successful open every stored offset is known to be inside the buffer, so getters only re-read
 * memory that was already checked. Errors are one line naming the key or tensor and the byte offset.
 */
#include "weights/gguf.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/core/status.h"
#include "weights/mapfile.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "gguf.c reads little-endian files by memcpy and needs a little-endian host"
#endif

#define GGUF_MAGIC             "GGUF"
#define GGUF_DEFAULT_ALIGNMENT 32
#define GGUF_MAX_NAME          95    /* tensor names must fit struct wtensor's name[96] */
#define GGUF_MAX_KEY           65535 /* the spec's bound on key length */
#define GGUF_MAX_NEST          8     /* nested arrays deeper than this are rejected (bounded recursion) */
#define GGUF_MIN_KV_BYTES      13    /* u64 key len + 1 key byte + u32 type + 1-byte value */
#define GGUF_MIN_TI_BYTES      33 /* u64 name len + 1 name byte + u32 n_dims + u64 ne + u32 type + u64 offset */

/* ---------------------------------------------------------------- types */

struct gguf_kv {
    struct gguf_str key;
    enum gguf_vtype type;
    size_t off;           /* file offset of the value; for arrays, of the first element */
    enum gguf_vtype elem; /* arrays: element type */
    uint64_t n;           /* arrays: element count */
    size_t *str_offs;     /* (n) string arrays: file offset of each element's u64 length; owned */
    size_t raw_at, raw_len; /* the whole entry as serialized (key, type, value): for copying it verbatim */
};

struct gguf {
    const uint8_t *base; /* (size) bytes: the mapping or the caller's buffer */
    size_t size;
    struct mapfile map; /* gguf_open only */
    uint32_t version;
    int n_kv;
    struct gguf_kv *kv; /* (n_kv) */
    int n_tensors;
    struct gguf_tensor_info *ti; /* (n_tensors) */
    size_t alignment;
    size_t data_start; /* byte offset of the tensor data section */
};

/* The reader's cursor: everything read goes through rd_need, which checks the remaining bytes. */
struct rd {
    const uint8_t *b;
    size_t size;
    size_t pos;
    char *err;
};

/* ---------------------------------------------------------------- helpers */

/* A printable, bounded copy of a name read from the file, for error messages. */
static const char *san(char out[80], const char *p, size_t len)
{
    size_t n = len < 64 ? len : 64, j = 0;
    for (size_t i = 0; i < n; i++) out[j++] = (p[i] >= 0x20 && p[i] < 0x7f && p[i] != '\'') ? p[i] : '?';
    if (len > n) {
        memcpy(out + j, "...", 3);
        j += 3;
    }
    out[j] = '\0';
    return out;
}

static size_t rd_left(const struct rd *r)
{
    return r->size - r->pos;
}

static int rd_need(struct rd *r, size_t n, const char *what, const char *name)
{
    if (n <= rd_left(r)) return FERRY_OK;
    char s[80];
    return ferry_fail(r->err, FERRY_ERR_FORMAT, "truncated: %s%s%s%s needs %zu bytes at offset %zu, file has %zu",
                what, name ? " '" : "", name ? san(s, name, strlen(name)) : "", name ? "'" : "", n, r->pos,
                r->size);
}

static uint32_t ld_u32(const uint8_t *p)
{
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}
static uint64_t ld_u64(const uint8_t *p)
{
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}

static int rd_u32(struct rd *r, uint32_t *v, const char *what, const char *name)
{
    int rc = rd_need(r, 4, what, name);
    if (rc) return rc;
    *v = ld_u32(r->b + r->pos);
    r->pos += 4;
    return FERRY_OK;
}
static int rd_u64(struct rd *r, uint64_t *v, const char *what, const char *name)
{
    int rc = rd_need(r, 8, what, name);
    if (rc) return rc;
    *v = ld_u64(r->b + r->pos);
    r->pos += 8;
    return FERRY_OK;
}

/* A GGUF string: u64 length then bytes. The view borrows the buffer. */
static int rd_str(struct rd *r, struct gguf_str *s, size_t max_len, const char *what, const char *name)
{
    size_t at = r->pos;
    uint64_t len;
    int rc = rd_u64(r, &len, what, name);
    if (rc) return rc;
    if (len > max_len) {
        char sn[80];
        return ferry_fail(r->err, FERRY_ERR_FORMAT, "%s%s%s%s at offset %zu: string length %llu exceeds %zu", what,
                    name ? " '" : "", name ? san(sn, name, strlen(name)) : "", name ? "'" : "", at,
                    (unsigned long long)len, max_len);
    }
    if (len > rd_left(r)) {
        char sn[80];
        return ferry_fail(r->err, FERRY_ERR_FORMAT,
                    "truncated: %s%s%s%s at offset %zu: string length %llu but only %zu bytes remain", what,
                    name ? " '" : "", name ? san(sn, name, strlen(name)) : "", name ? "'" : "", at,
                    (unsigned long long)len, rd_left(r));
    }
    s->ptr = (const char *)r->b + r->pos;
    s->len = (size_t)len;
    r->pos += (size_t)len;
    return FERRY_OK;
}

int gguf_vtype_size(uint32_t t)
{
    switch (t) {
    case GGUF_TYPE_UINT8:
    case GGUF_TYPE_INT8:
    case GGUF_TYPE_BOOL:
        return 1;
    case GGUF_TYPE_UINT16:
    case GGUF_TYPE_INT16:
        return 2;
    case GGUF_TYPE_UINT32:
    case GGUF_TYPE_INT32:
    case GGUF_TYPE_FLOAT32:
        return 4;
    case GGUF_TYPE_UINT64:
    case GGUF_TYPE_INT64:
    case GGUF_TYPE_FLOAT64:
        return 8;
    case GGUF_TYPE_STRING:
    case GGUF_TYPE_ARRAY:
        return 0;
    default:
        return -1;
    }
}

/* The smallest number of bytes one element of type t can take (for plausibility of counts). */
static size_t vtype_min_bytes(uint32_t t)
{
    if (t == GGUF_TYPE_STRING) return 8;
    if (t == GGUF_TYPE_ARRAY) return 12;
    return (size_t)gguf_vtype_size(t);
}

/* ggml's type names, for errors about types ferry does not read. */
static const char *ggml_type_name(uint32_t t)
{
    static const char *const names[] = {
        "F32",    "F16",   "Q4_0",  "Q4_1",   NULL,    NULL,    "Q5_0",    "Q5_1",   "Q8_0",    "Q8_1",
        "Q2_K",   "Q3_K",  "Q4_K",  "Q5_K",   "Q6_K",  "Q8_K",  "IQ2_XXS", "IQ2_XS", "IQ3_XXS", "IQ1_S",
        "IQ4_NL", "IQ3_S", "IQ2_S", "IQ4_XS", "I8",    "I16",   "I32",     "I64",    "F64",     "IQ1_M",
        "BF16",   NULL,    NULL,    NULL,     "TQ1_0", "TQ2_0", NULL,      NULL,     NULL,      "MXFP4",
        "NVFP4",  "Q1_0",  "Q2_0",
    };
    return t < sizeof names / sizeof names[0] ? names[t] : NULL;
}

/* ---------------------------------------------------------------- hashing (duplicate detection) */

static uint64_t hash_bytes(const char *p, size_t n)
{
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ (uint8_t)p[i]) * 1099511628211ull;
    return h;
}

/* Inserts names[i] for i in 0..n-1 into an open-addressing table; returns the index of the first
 * duplicate found (the later one), -1 when all are distinct, or -2 on allocation failure. */
static long long find_duplicate(const struct gguf_str *(*get)(const void *, size_t), const void *ctx,
                                size_t n)
{
    size_t cap = 16;
    while (cap < 2 * n) cap *= 2;
    int64_t *tab = malloc(cap * sizeof *tab);
    if (!tab) return -2;
    for (size_t i = 0; i < cap; i++) tab[i] = -1;
    long long dup = -1;
    for (size_t i = 0; i < n && dup < 0; i++) {
        const struct gguf_str *s = get(ctx, i);
        size_t h = (size_t)hash_bytes(s->ptr, s->len) & (cap - 1);
        while (tab[h] >= 0) {
            const struct gguf_str *o = get(ctx, (size_t)tab[h]);
            if (o->len == s->len && memcmp(o->ptr, s->ptr, s->len) == 0) {
                dup = (long long)i;
                break;
            }
            h = (h + 1) & (cap - 1);
        }
        if (dup < 0) tab[h] = (int64_t)i;
    }
    free(tab);
    return dup;
}

static const struct gguf_str *kv_key_at(const void *ctx, size_t i)
{
    return &((const struct gguf_kv *)ctx)[i].key;
}
static const struct gguf_str *ti_name_at(const void *ctx, size_t i)
{
    return &((const struct gguf_tensor_info *)ctx)[i].name;
}

/* ---------------------------------------------------------------- parsing */

/* Skips one value of type t (already read), validating it; depth counts array nesting. */
static int skip_value(struct rd *r, uint32_t t, int depth, const char *key);

static int skip_array_body(struct rd *r, uint32_t et, uint64_t n, int depth, const char *key)
{
    char sk[80];
    int es = gguf_vtype_size(et);
    if (es > 0) {
        if (n > rd_left(r) / (size_t)es)
            return ferry_fail(
                r->err, FERRY_ERR_FORMAT,
                "key '%s' at offset %zu: array of %llu elements of %d bytes exceeds the %zu bytes left",
                san(sk, key, strlen(key)), r->pos, (unsigned long long)n, es, rd_left(r));
        r->pos += (size_t)n * (size_t)es;
        return FERRY_OK;
    }
    for (uint64_t i = 0; i < n; i++) {
        int rc = skip_value(r, et, depth, key);
        if (rc) return rc;
    }
    return FERRY_OK;
}

/* Reads an array header (u32 elem type, u64 n) and checks n against the remaining bytes. */
static int rd_array_head(struct rd *r, uint32_t *et, uint64_t *n, int depth, const char *key)
{
    char sk[80];
    size_t at = r->pos;
    int rc = rd_u32(r, et, "array type of key", key);
    if (rc) return rc;
    if (gguf_vtype_size(*et) < 0)
        return ferry_fail(r->err, FERRY_ERR_FORMAT, "key '%s' at offset %zu: unknown array element type %u",
                    san(sk, key, strlen(key)), at, *et);
    if (*et == GGUF_TYPE_ARRAY && depth + 1 >= GGUF_MAX_NEST)
        return ferry_fail(r->err, FERRY_ERR_FORMAT, "key '%s' at offset %zu: arrays nested deeper than %d",
                    san(sk, key, strlen(key)), at, GGUF_MAX_NEST);
    rc = rd_u64(r, n, "array length of key", key);
    if (rc) return rc;
    if (*n > rd_left(r) / vtype_min_bytes(*et))
        return ferry_fail(r->err, FERRY_ERR_FORMAT,
                    "key '%s' at offset %zu: array length %llu is impossible with %zu bytes left",
                    san(sk, key, strlen(key)), at + 4, (unsigned long long)*n, rd_left(r));
    return FERRY_OK;
}

static int skip_value(struct rd *r, uint32_t t, int depth, const char *key)
{
    int es = gguf_vtype_size(t);
    if (es > 0) {
        int rc = rd_need(r, (size_t)es, "value of key", key);
        if (rc) return rc;
        r->pos += (size_t)es;
        return FERRY_OK;
    }
    if (t == GGUF_TYPE_STRING) {
        struct gguf_str s;
        return rd_str(r, &s, SIZE_MAX, "string value of key", key);
    }
    uint32_t et = 0;
    uint64_t n = 0;
    int rc = rd_array_head(r, &et, &n, depth, key);
    if (rc) return rc;
    return skip_array_body(r, et, n, depth + 1, key);
}

static int parse_kv(struct gguf *g, struct rd *r, struct gguf_kv *kv)
{
    char key[80];
    size_t at = r->pos;
    int rc = rd_str(r, &kv->key, GGUF_MAX_KEY, "metadata key", NULL);
    if (rc) return rc;
    if (kv->key.len == 0) return ferry_fail(r->err, FERRY_ERR_FORMAT, "empty metadata key at offset %zu", at);
    /* A NUL-terminated copy for messages: the key view is not terminated. */
    char kz[80];
    san(kz, kv->key.ptr, kv->key.len);
    uint32_t t;
    size_t tat = r->pos;
    rc = rd_u32(r, &t, "value type of key", kz);
    if (rc) return rc;
    if (gguf_vtype_size(t) < 0)
        return ferry_fail(r->err, FERRY_ERR_FORMAT, "key '%s' at offset %zu: unknown value type %u",
                    san(key, kz, strlen(kz)), tat, t);
    kv->type = (enum gguf_vtype)t;
    if (t != GGUF_TYPE_ARRAY) {
        kv->off = r->pos;
        return skip_value(r, t, 0, kz);
    }
    uint32_t et = 0;
    uint64_t n = 0;
    rc = rd_array_head(r, &et, &n, 0, kz);
    if (rc) return rc;
    kv->elem = (enum gguf_vtype)et;
    kv->n = n;
    kv->off = r->pos;
    if (et == GGUF_TYPE_STRING) {
        /* n <= remaining/8 was checked, so this table is at most the size of the file. */
        kv->str_offs = malloc((size_t)(n ? n : 1) * sizeof *kv->str_offs);
        if (!kv->str_offs)
            return ferry_fail(r->err, FERRY_ERR_NOMEM, "key '%s': out of memory for %llu strings", kz,
                        (unsigned long long)n);
        for (uint64_t i = 0; i < n; i++) {
            kv->str_offs[i] = r->pos;
            struct gguf_str s;
            rc = rd_str(r, &s, SIZE_MAX, "string element of key", kz);
            if (rc) return rc;
        }
        return FERRY_OK;
    }
    (void)g;
    return skip_array_body(r, et, n, 1, kz);
}

static int parse_tensor_info(struct rd *r, struct gguf_tensor_info *ti, uint64_t *offset)
{
    char sn[80];
    size_t at = r->pos;
    int rc = rd_str(r, &ti->name, GGUF_MAX_NAME, "tensor name", NULL);
    if (rc) return rc;
    if (ti->name.len == 0) return ferry_fail(r->err, FERRY_ERR_FORMAT, "empty tensor name at offset %zu", at);
    san(sn, ti->name.ptr, ti->name.len);
    uint32_t nd;
    size_t dat = r->pos;
    if ((rc = rd_u32(r, &nd, "n_dims of tensor", sn))) return rc;
    if (nd < 1 || nd > 4)
        return ferry_fail(r->err, FERRY_ERR_FORMAT, "tensor '%s' at offset %zu: n_dims %u not in 1..4", sn, dat,
                    nd);
    ti->n_dims = (int)nd;
    int64_t nel = 1;
    for (int d = 0; d < 4; d++) ti->ne[d] = 1;
    for (uint32_t d = 0; d < nd; d++) {
        uint64_t ne;
        size_t nat = r->pos;
        if ((rc = rd_u64(r, &ne, "shape of tensor", sn))) return rc;
        if (ne < 1 || ne > (uint64_t)INT64_MAX)
            return ferry_fail(r->err, FERRY_ERR_FORMAT,
                        "tensor '%s' at offset %zu: ne[%u] = %llu is not in 1..2^63-1", sn, nat, d,
                        (unsigned long long)ne);
        if (__builtin_mul_overflow(nel, (int64_t)ne, &nel))
            return ferry_fail(r->err, FERRY_ERR_FORMAT, "tensor '%s' at offset %zu: element count overflows", sn,
                        nat);
        ti->ne[d] = (int64_t)ne;
    }
    uint32_t t;
    size_t tat = r->pos;
    if ((rc = rd_u32(r, &t, "type of tensor", sn))) return rc;
    if (!dtype_valid(t)) {
        const char *gn = ggml_type_name(t);
        if (gn)
            return ferry_fail(r->err, FERRY_ERR_UNSUPPORTED,
                        "tensor '%s' at offset %zu: type %s (%u) is not supported", sn, tat, gn, t);
        return ferry_fail(r->err, FERRY_ERR_FORMAT, "tensor '%s' at offset %zu: unknown ggml type %u", sn, tat, t);
    }
    ti->type = (enum dtype)t;
    return rd_u64(r, offset, "offset of tensor", sn);
}

struct span {
    uint64_t begin, end;
    int idx;
};
static int span_cmp(const void *a, const void *b)
{
    const struct span *x = a, *y = b;
    return x->begin < y->begin ? -1 : x->begin > y->begin ? 1 : 0;
}

static int parse(struct gguf *g, char *err)
{
    struct rd r = {.b = g->base, .size = g->size, .pos = 0, .err = err};
    int rc;
    char sn[80];
    if (g->size < 4 || memcmp(g->base, GGUF_MAGIC, 4) != 0)
        return ferry_fail(err, FERRY_ERR_FORMAT, "not a GGUF file: bad magic at offset 0");
    r.pos = 4;
    if ((rc = rd_u32(&r, &g->version, "version", NULL))) return rc;
    if (g->version == 1)
        return ferry_fail(err, FERRY_ERR_UNSUPPORTED,
                    "GGUF version 1 at offset 4 is not supported (only v2 and v3)");
    if (g->version != 2 && g->version != 3) {
        if (g->version >= 0x01000000u)
            return ferry_fail(err, FERRY_ERR_UNSUPPORTED,
                        "GGUF version %u at offset 4: a big-endian file? only little-endian v2/v3 are read",
                        g->version);
        return ferry_fail(err, FERRY_ERR_UNSUPPORTED,
                    "GGUF version %u at offset 4 is not supported (only v2 and v3)", g->version);
    }
    uint64_t n_tensors, n_kv;
    if ((rc = rd_u64(&r, &n_tensors, "tensor count", NULL))) return rc;
    if ((rc = rd_u64(&r, &n_kv, "metadata count", NULL))) return rc;
    if (n_kv > rd_left(&r) / GGUF_MIN_KV_BYTES || n_kv > INT32_MAX)
        return ferry_fail(err, FERRY_ERR_FORMAT,
                    "metadata count %llu at offset 16 is impossible with %zu bytes left",
                    (unsigned long long)n_kv, rd_left(&r));
    if (n_tensors > rd_left(&r) / GGUF_MIN_TI_BYTES || n_tensors > INT32_MAX)
        return ferry_fail(err, FERRY_ERR_FORMAT, "tensor count %llu at offset 8 is impossible with %zu bytes left",
                    (unsigned long long)n_tensors, rd_left(&r));

    g->kv = calloc(n_kv ? n_kv : 1, sizeof *g->kv);
    if (!g->kv)
        return ferry_fail(err, FERRY_ERR_NOMEM, "out of memory for %llu metadata entries",
                    (unsigned long long)n_kv);
    for (uint64_t i = 0; i < n_kv; i++) {
        g->n_kv = (int)i + 1; /* so that gguf_close frees what was allocated so far */
        const size_t at = r.pos;
        if ((rc = parse_kv(g, &r, &g->kv[i]))) return rc;
        g->kv[i].raw_at = at;
        g->kv[i].raw_len = r.pos - at;
    }
    long long dup = find_duplicate(kv_key_at, g->kv, (size_t)n_kv);
    if (dup == -2) return ferry_fail(err, FERRY_ERR_NOMEM, "out of memory checking metadata keys");
    if (dup >= 0)
        return ferry_fail(err, FERRY_ERR_FORMAT, "duplicate metadata key '%s' at offset %zu (entry %lld)",
                    san(sn, g->kv[dup].key.ptr, g->kv[dup].key.len),
                    (size_t)((const uint8_t *)g->kv[dup].key.ptr - g->base) - 8, dup);

    g->alignment = GGUF_DEFAULT_ALIGNMENT;
    int ai = gguf_find_key(g, "general.alignment");
    if (ai >= 0) {
        uint32_t a;
        if (gguf_get_u32(g, "general.alignment", &a) != FERRY_OK || a == 0 || (a & (a - 1)) != 0)
            return ferry_fail(err, FERRY_ERR_FORMAT,
                        "key 'general.alignment' at offset %zu: not a power-of-two u32", g->kv[ai].off);
        g->alignment = a;
    }

    uint64_t *offsets = malloc((n_tensors ? n_tensors : 1) * sizeof *offsets);
    g->ti = calloc(n_tensors ? n_tensors : 1, sizeof *g->ti);
    if (!offsets || !g->ti) {
        free(offsets);
        return ferry_fail(err, FERRY_ERR_NOMEM, "out of memory for %llu tensors", (unsigned long long)n_tensors);
    }
    g->n_tensors = (int)n_tensors;
    size_t *info_at = malloc((n_tensors ? n_tensors : 1) * sizeof *info_at);
    if (!info_at) {
        free(offsets);
        return ferry_fail(err, FERRY_ERR_NOMEM, "out of memory for %llu tensors", (unsigned long long)n_tensors);
    }
    for (uint64_t i = 0; i < n_tensors; i++) {
        info_at[i] = r.pos;
        if ((rc = parse_tensor_info(&r, &g->ti[i], &offsets[i]))) goto out;
    }
    dup = find_duplicate(ti_name_at, g->ti, (size_t)n_tensors);
    if (dup == -2) {
        rc = ferry_fail(err, FERRY_ERR_NOMEM, "out of memory checking tensor names");
        goto out;
    }
    if (dup >= 0) {
        rc = ferry_fail(err, FERRY_ERR_FORMAT, "duplicate tensor name '%s' at offset %zu",
                  san(sn, g->ti[dup].name.ptr, g->ti[dup].name.len), info_at[dup]);
        goto out;
    }

    /* The data section starts at the next multiple of the alignment after the tensor infos. */
    size_t pad = (g->alignment - r.pos % g->alignment) % g->alignment;
    g->data_start = r.pos + pad; /* r.pos <= size, pad < 2^32: no overflow */
    if (n_tensors > 0 && g->data_start > g->size) {
        rc = ferry_fail(err, FERRY_ERR_FORMAT,
                  "truncated: tensor data would start at offset %zu, file has %zu bytes", g->data_start,
                  g->size);
        goto out;
    }
    size_t data_size = n_tensors > 0 ? g->size - g->data_start : 0;
    for (uint64_t i = 0; i < n_tensors; i++) {
        struct gguf_tensor_info *ti = &g->ti[i];
        san(sn, ti->name.ptr, ti->name.len);
        size_t row = dtype_row_size(ti->type, ti->ne[0]);
        if (row == 0) {
            rc = ferry_fail(err, FERRY_ERR_FORMAT,
                      "tensor '%s' at offset %zu: row length %lld is not a multiple of %s's "
                      "block size %d",
                      sn, info_at[i], (long long)ti->ne[0], dtype_name(ti->type), dtype_block_size(ti->type));
            goto out;
        }
        size_t nb = row;
        for (int d = 1; d < 4; d++) {
            if (__builtin_mul_overflow(nb, (size_t)ti->ne[d], &nb)) {
                rc = ferry_fail(err, FERRY_ERR_FORMAT, "tensor '%s' at offset %zu: byte size overflows", sn,
                          info_at[i]);
                goto out;
            }
        }
        if (offsets[i] % g->alignment != 0) {
            rc = ferry_fail(err, FERRY_ERR_FORMAT,
                      "tensor '%s' at offset %zu: data offset %llu is not a multiple of the "
                      "alignment %zu",
                      sn, info_at[i], (unsigned long long)offsets[i], g->alignment);
            goto out;
        }
        if (offsets[i] > data_size || nb > data_size - offsets[i]) {
            rc = ferry_fail(
                err, FERRY_ERR_FORMAT,
                "tensor '%s' at offset %zu: data [%llu, +%zu) at file offset %zu+%llu runs past the end of "
                "the file (%zu bytes)",
                sn, info_at[i], (unsigned long long)offsets[i], nb, g->data_start,
                (unsigned long long)offsets[i], g->size);
            goto out;
        }
        ti->data = g->base + g->data_start + offsets[i];
        ti->nbytes = nb;
    }

    /* Tensors must not overlap: aliasing weights is never what a writer meant. */
    if (n_tensors > 1) {
        struct span *sp = malloc(n_tensors * sizeof *sp);
        if (!sp) {
            rc = ferry_fail(err, FERRY_ERR_NOMEM, "out of memory checking tensor ranges");
            goto out;
        }
        for (uint64_t i = 0; i < n_tensors; i++)
            sp[i] = (struct span){offsets[i], offsets[i] + g->ti[i].nbytes, (int)i};
        qsort(sp, n_tensors, sizeof *sp, span_cmp);
        for (uint64_t i = 1; i < n_tensors; i++) {
            if (sp[i].begin < sp[i - 1].end) {
                const struct gguf_tensor_info *a = &g->ti[sp[i].idx];
                char sa[80];
                rc = ferry_fail(err, FERRY_ERR_FORMAT, "tensor '%s' at offset %zu: data overlaps tensor '%s'",
                          san(sa, a->name.ptr, a->name.len), info_at[sp[i].idx],
                          san(sn, g->ti[sp[i - 1].idx].name.ptr, g->ti[sp[i - 1].idx].name.len));
                free(sp);
                goto out;
            }
        }
        free(sp);
    }
    rc = FERRY_OK;
out:
    free(offsets);
    free(info_at);
    return rc;
}

/* ---------------------------------------------------------------- open/close */

int gguf_open_mem(const void *buf, size_t size, struct gguf **out, char err[256])
{
    *out = NULL;
    err[0] = '\0';
    struct gguf *g = calloc(1, sizeof *g);
    if (!g) return ferry_fail(err, FERRY_ERR_NOMEM, "out of memory");
    g->base = buf;
    g->size = buf ? size : 0;
    int rc = parse(g, err);
    if (rc) {
        gguf_close(g);
        return rc;
    }
    *out = g;
    return FERRY_OK;
}

int gguf_open(const char *path, struct gguf **out, char err[256])
{
    *out = NULL;
    struct mapfile m;
    int rc = mapfile_open(path, &m, err);
    if (rc) return rc;
    char e2[256];
    struct gguf *g;
    rc = gguf_open_mem(m.data, m.size, &g, e2);
    if (rc) {
        mapfile_name_error(path, e2, err);
        mapfile_close(&m);
        return rc;
    }
    g->map = m;
    *out = g;
    return FERRY_OK;
}

void gguf_close(struct gguf *g)
{
    if (!g) return;
    if (g->kv)
        for (int i = 0; i < g->n_kv; i++) free(g->kv[i].str_offs);
    free(g->kv);
    free(g->ti);
    mapfile_close(&g->map);
    free(g);
}

/* ---------------------------------------------------------------- accessors */

uint32_t gguf_version(const struct gguf *g)
{
    return g->version;
}
size_t gguf_file_size(const struct gguf *g)
{
    return g->size;
}
int gguf_n_kv(const struct gguf *g)
{
    return g->n_kv;
}
int gguf_n_tensors(const struct gguf *g)
{
    return g->n_tensors;
}

const struct gguf_tensor_info *gguf_tensor(const struct gguf *g, int i)
{
    return (i >= 0 && i < g->n_tensors) ? &g->ti[i] : NULL;
}

int gguf_find_key(const struct gguf *g, const char *key)
{
    size_t n = strlen(key);
    for (int i = 0; i < g->n_kv; i++)
        if (g->kv[i].key.len == n && memcmp(g->kv[i].key.ptr, key, n) == 0) return i;
    return -1;
}

struct gguf_str gguf_kv_key(const struct gguf *g, int i)
{
    if (i < 0 || i >= g->n_kv) return (struct gguf_str){NULL, 0};
    return g->kv[i].key;
}

size_t gguf_alignment(const struct gguf *g)
{
    return g->alignment;
}

struct gguf_str gguf_kv_raw(const struct gguf *g, int i)
{
    if (i < 0 || i >= g->n_kv) return (struct gguf_str){NULL, 0};
    return (struct gguf_str){(const char *)g->base + g->kv[i].raw_at, g->kv[i].raw_len};
}

enum gguf_vtype gguf_kv_type(const struct gguf *g, int i)
{
    return (i >= 0 && i < g->n_kv) ? g->kv[i].type : (enum gguf_vtype) - 1;
}

/* A scalar at p of type t as a signed 128-bit integer; 0 if t is an integer type, -1 otherwise. */
static int load_int(const uint8_t *p, uint32_t t, __int128 *v)
{
    switch (t) {
    case GGUF_TYPE_UINT8:
        *v = *p;
        return 0;
    case GGUF_TYPE_INT8:
        *v = (int8_t)*p;
        return 0;
    case GGUF_TYPE_UINT16: {
        uint16_t x;
        memcpy(&x, p, 2);
        *v = x;
        return 0;
    }
    case GGUF_TYPE_INT16: {
        int16_t x;
        memcpy(&x, p, 2);
        *v = x;
        return 0;
    }
    case GGUF_TYPE_UINT32: {
        uint32_t x;
        memcpy(&x, p, 4);
        *v = x;
        return 0;
    }
    case GGUF_TYPE_INT32: {
        int32_t x;
        memcpy(&x, p, 4);
        *v = x;
        return 0;
    }
    case GGUF_TYPE_UINT64: {
        uint64_t x;
        memcpy(&x, p, 8);
        *v = x;
        return 0;
    }
    case GGUF_TYPE_INT64: {
        int64_t x;
        memcpy(&x, p, 8);
        *v = x;
        return 0;
    }
    default:
        return -1;
    }
}

/* A numeric scalar at p as a double; 0 on success, -1 for non-numeric types. */
static int load_num(const uint8_t *p, uint32_t t, double *v)
{
    __int128 i;
    if (load_int(p, t, &i) == 0) {
        *v = (double)i;
        return 0;
    }
    if (t == GGUF_TYPE_FLOAT32) {
        float f;
        memcpy(&f, p, 4);
        *v = f;
        return 0;
    }
    if (t == GGUF_TYPE_FLOAT64) {
        memcpy(v, p, 8);
        return 0;
    }
    return -1;
}

static const struct gguf_kv *kv_get(const struct gguf *g, const char *key)
{
    int i = gguf_find_key(g, key);
    return i < 0 ? NULL : &g->kv[i];
}

int gguf_get_u32(const struct gguf *g, const char *key, uint32_t *out)
{
    const struct gguf_kv *kv = kv_get(g, key);
    if (!kv) return FERRY_ERR_NOT_FOUND;
    __int128 v;
    if (load_int(g->base + kv->off, kv->type, &v) != 0 || v < 0 || v > UINT32_MAX) return FERRY_ERR_FORMAT;
    *out = (uint32_t)v;
    return FERRY_OK;
}

int gguf_get_i64(const struct gguf *g, const char *key, int64_t *out)
{
    const struct gguf_kv *kv = kv_get(g, key);
    if (!kv) return FERRY_ERR_NOT_FOUND;
    __int128 v;
    if (load_int(g->base + kv->off, kv->type, &v) != 0 || v < INT64_MIN || v > INT64_MAX)
        return FERRY_ERR_FORMAT;
    *out = (int64_t)v;
    return FERRY_OK;
}

int gguf_get_f32(const struct gguf *g, const char *key, float *out)
{
    const struct gguf_kv *kv = kv_get(g, key);
    if (!kv) return FERRY_ERR_NOT_FOUND;
    double v;
    if (load_num(g->base + kv->off, kv->type, &v) != 0) return FERRY_ERR_FORMAT;
    *out = (float)v;
    return FERRY_OK;
}

int gguf_get_bool(const struct gguf *g, const char *key, int *out)
{
    const struct gguf_kv *kv = kv_get(g, key);
    if (!kv) return FERRY_ERR_NOT_FOUND;
    if (kv->type != GGUF_TYPE_BOOL) return FERRY_ERR_FORMAT;
    *out = g->base[kv->off] != 0;
    return FERRY_OK;
}

int gguf_get_str(const struct gguf *g, const char *key, struct gguf_str *out)
{
    const struct gguf_kv *kv = kv_get(g, key);
    if (!kv) return FERRY_ERR_NOT_FOUND;
    if (kv->type != GGUF_TYPE_STRING) return FERRY_ERR_FORMAT;
    out->len = (size_t)ld_u64(g->base + kv->off);
    out->ptr = (const char *)g->base + kv->off + 8;
    return FERRY_OK;
}

int gguf_get_arr(const struct gguf *g, const char *key, enum gguf_vtype *elem_type, uint64_t *n)
{
    const struct gguf_kv *kv = kv_get(g, key);
    if (!kv) return FERRY_ERR_NOT_FOUND;
    if (kv->type != GGUF_TYPE_ARRAY) return FERRY_ERR_FORMAT;
    *elem_type = kv->elem;
    *n = kv->n;
    return FERRY_OK;
}

int gguf_arr_str(const struct gguf *g, const char *key, uint64_t i, struct gguf_str *out)
{
    const struct gguf_kv *kv = kv_get(g, key);
    if (!kv) return FERRY_ERR_NOT_FOUND;
    if (kv->type != GGUF_TYPE_ARRAY || kv->elem != GGUF_TYPE_STRING) return FERRY_ERR_FORMAT;
    if (i >= kv->n) return FERRY_ERR_RANGE;
    size_t o = kv->str_offs[i];
    out->len = (size_t)ld_u64(g->base + o);
    out->ptr = (const char *)g->base + o + 8;
    return FERRY_OK;
}

/* Numeric array elements are fixed-size and contiguous from kv->off. */
static const struct gguf_kv *num_arr(const struct gguf *g, const char *key, uint64_t n, int *rc)
{
    const struct gguf_kv *kv = kv_get(g, key);
    *rc = FERRY_OK;
    if (!kv)
        *rc = FERRY_ERR_NOT_FOUND;
    else if (kv->type != GGUF_TYPE_ARRAY || gguf_vtype_size(kv->elem) <= 0 || kv->elem == GGUF_TYPE_BOOL)
        *rc = FERRY_ERR_FORMAT;
    else if (n != kv->n)
        *rc = FERRY_ERR_RANGE;
    return *rc ? NULL : kv;
}

int gguf_arr_f32(const struct gguf *g, const char *key, float *out, uint64_t n)
{
    int rc;
    const struct gguf_kv *kv = num_arr(g, key, n, &rc);
    if (!kv) return rc;
    size_t es = (size_t)gguf_vtype_size(kv->elem);
    for (uint64_t i = 0; i < n; i++) {
        double v;
        load_num(g->base + kv->off + i * es, kv->elem, &v);
        out[i] = (float)v;
    }
    return FERRY_OK;
}

int gguf_arr_bool(const struct gguf *g, const char *key, uint8_t *out, uint64_t n)
{
    const struct gguf_kv *kv = kv_get(g, key);
    if (!kv) return FERRY_ERR_NOT_FOUND;
    if (kv->type != GGUF_TYPE_ARRAY || kv->elem != GGUF_TYPE_BOOL) return FERRY_ERR_FORMAT;
    if (n != kv->n) return FERRY_ERR_RANGE;
    for (uint64_t i = 0; i < n; i++) out[i] = g->base[kv->off + i] != 0;
    return FERRY_OK;
}

int gguf_arr_i32(const struct gguf *g, const char *key, int32_t *out, uint64_t n)
{
    int rc;
    const struct gguf_kv *kv = num_arr(g, key, n, &rc);
    if (!kv) return rc;
    size_t es = (size_t)gguf_vtype_size(kv->elem);
    for (uint64_t i = 0; i < n; i++) {
        __int128 v;
        if (load_int(g->base + kv->off + i * es, kv->elem, &v) != 0 || v < INT32_MIN || v > INT32_MAX)
            return FERRY_ERR_FORMAT;
        out[i] = (int32_t)v;
    }
    return FERRY_OK;
}

