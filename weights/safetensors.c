/* safetensors — see safetensors.h for the format.
 *
 * The header length is checked against the file and ST_MAX_HEADER before the JSON is parsed (jansson, with
 * duplicate keys rejected and its own nesting limit); every entry's dtype, shape and offsets are then checked
 * with overflow-safe arithmetic, and the ranges are sorted to reject overlaps. Errors name the tensor and the
 * byte offset of the header or of the data range.
 */
#include "weights/safetensors.h"

#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "quant/dtype.h"
#include "kernels/core/status.h"
#include "weights/mapfile.h"

struct safetensors {
    const uint8_t *base; /* (size) bytes */
    size_t size;
    struct mapfile map; /* safetensors_open only */
    size_t data_start;  /* 8 + header length */
    int n_tensors;
    struct st_tensor *t; /* (n_tensors) */
    int n_meta;
    char **meta; /* (2 * n_meta) key, value, key, value... */
};

/* A printable, bounded copy of a name, for messages. */
static const char *san(char out[80], const char *p)
{
    size_t j = 0, i = 0;
    for (; p[i] && i < 64; i++) out[j++] = (p[i] >= 0x20 && p[i] < 0x7f && p[i] != '\'') ? p[i] : '?';
    if (p[i]) {
        memcpy(out + j, "...", 3);
        j += 3;
    }
    out[j] = '\0';
    return out;
}

static const struct {
    const char *name;
    int size;
    int dtype;
} st_dtypes[] = {
    {"F32", 4, DTYPE_F32}, {"F16", 2, DTYPE_F16}, {"BF16", 2, DTYPE_BF16}, {"F64", 8, -1},
    {"I64", 8, -1},        {"U64", 8, -1},        {"I32", 4, -1},          {"U32", 4, -1},
    {"I16", 2, -1},        {"U16", 2, -1},        {"I8", 1, -1},           {"U8", 1, -1},
    {"BOOL", 1, -1},       {"F8_E4M3", 1, -1},    {"F8_E5M2", 1, -1},      {"F8_E8M0", 1, -1},
};

struct span {
    uint64_t begin, end;
    int idx;
};
static int span_cmp(const void *a, const void *b)
{
    const struct span *x = a, *y = b;
    return x->begin < y->begin ? -1 : x->begin > y->begin ? 1 : 0;
}

static int parse_entry(struct safetensors *st, const char *key, json_t *v, struct st_tensor *t,
                       uint64_t data_size, uint64_t off[2], char *err)
{
    char sn[80];
    san(sn, key);
    if (!json_is_object(v))
        return ferry_fail(err, FERRY_ERR_FORMAT, "tensor '%s' in header at offset 8: entry is not an object", sn);
    json_t *jd = json_object_get(v, "dtype"), *js = json_object_get(v, "shape"),
           *jo = json_object_get(v, "data_offsets");
    if (!json_is_string(jd) || !json_is_array(js) || !json_is_array(jo) || json_array_size(jo) != 2)
        return ferry_fail(
            err, FERRY_ERR_FORMAT,
            "tensor '%s' in header at offset 8: needs string dtype, array shape, [begin, end] data_offsets",
            sn);
    const char *ds = json_string_value(jd);
    int es = 0;
    t->dtype = -1;
    for (size_t i = 0; i < sizeof st_dtypes / sizeof st_dtypes[0]; i++) {
        if (strcmp(ds, st_dtypes[i].name) == 0) {
            es = st_dtypes[i].size;
            t->dtype = st_dtypes[i].dtype;
            snprintf(t->dtype_str, sizeof t->dtype_str, "%s", st_dtypes[i].name);
        }
    }
    if (!es) {
        char sd[80];
        return ferry_fail(err, FERRY_ERR_UNSUPPORTED, "tensor '%s' in header at offset 8: unknown dtype '%s'", sn,
                    san(sd, ds));
    }
    size_t nd = json_array_size(js);
    if (nd > ST_MAX_DIMS)
        return ferry_fail(err, FERRY_ERR_UNSUPPORTED,
                    "tensor '%s' in header at offset 8: %zu dimensions (at most %d)", sn, nd, ST_MAX_DIMS);
    t->n_dims = (int)nd;
    uint64_t nb = (uint64_t)es;
    for (size_t d = 0; d < nd; d++) {
        json_t *x = json_array_get(js, d);
        if (!json_is_integer(x) || json_integer_value(x) < 0)
            return ferry_fail(err, FERRY_ERR_FORMAT, "tensor '%s' in header at offset 8: shape[%zu] is not a size",
                        sn, d);
        t->shape[d] = (int64_t)json_integer_value(x);
        if (__builtin_mul_overflow(nb, (uint64_t)t->shape[d], &nb))
            return ferry_fail(err, FERRY_ERR_FORMAT, "tensor '%s' in header at offset 8: byte size overflows", sn);
    }
    for (int i = 0; i < 2; i++) {
        json_t *x = json_array_get(jo, (size_t)i);
        if (!json_is_integer(x) || json_integer_value(x) < 0)
            return ferry_fail(err, FERRY_ERR_FORMAT,
                        "tensor '%s' in header at offset 8: data_offsets[%d] is not a size", sn, i);
        off[i] = (uint64_t)json_integer_value(x);
    }
    if (off[0] > off[1] || off[1] > data_size)
        return ferry_fail(err, FERRY_ERR_FORMAT,
                    "tensor '%s': data [%llu, %llu) at file offset %zu is outside the %llu-byte data section",
                    sn, (unsigned long long)off[0], (unsigned long long)off[1], st->data_start,
                    (unsigned long long)data_size);
    if (off[1] - off[0] != nb)
        return ferry_fail(err, FERRY_ERR_FORMAT,
                    "tensor '%s' at file offset %llu: %llu bytes but shape x %s needs %llu", sn,
                    (unsigned long long)(st->data_start + off[0]), (unsigned long long)(off[1] - off[0]),
                    t->dtype_str, (unsigned long long)nb);
    t->data = st->base + st->data_start + off[0];
    t->offset = st->data_start + off[0];
    t->nbytes = (size_t)nb;
    t->name = strdup(key);
    if (!t->name) return ferry_fail(err, FERRY_ERR_NOMEM, "out of memory");
    return FERRY_OK;
}

static int parse_meta(struct safetensors *st, json_t *m, char *err)
{
    if (!json_is_object(m))
        return ferry_fail(err, FERRY_ERR_FORMAT, "__metadata__ in header at offset 8 is not an object");
    size_t n = json_object_size(m);
    st->meta = calloc(2 * n + 1, sizeof *st->meta);
    if (!st->meta) return ferry_fail(err, FERRY_ERR_NOMEM, "out of memory");
    const char *k;
    json_t *v;
    json_object_foreach(m, k, v)
    {
        char sk[80];
        if (!json_is_string(v))
            return ferry_fail(err, FERRY_ERR_FORMAT,
                        "__metadata__ key '%s' in header at offset 8: value is not a string", san(sk, k));
        st->meta[2 * st->n_meta] = strdup(k);
        st->meta[2 * st->n_meta + 1] = strdup(json_string_value(v));
        st->n_meta++;
        if (!st->meta[2 * st->n_meta - 2] || !st->meta[2 * st->n_meta - 1])
            return ferry_fail(err, FERRY_ERR_NOMEM, "out of memory");
    }
    return FERRY_OK;
}

static int parse(struct safetensors *st, char *err)
{
    if (st->size < 8)
        return ferry_fail(err, FERRY_ERR_FORMAT, "truncated: %zu bytes, the header length at offset 0 needs 8",
                    st->size);
    uint64_t hlen;
    memcpy(&hlen, st->base, 8);
    if (hlen > ST_MAX_HEADER)
        return ferry_fail(err, FERRY_ERR_FORMAT, "header length %llu at offset 0 exceeds the %u-byte limit",
                    (unsigned long long)hlen, ST_MAX_HEADER);
    if (hlen > st->size - 8)
        return ferry_fail(err, FERRY_ERR_FORMAT,
                    "truncated: header length %llu at offset 0 but only %zu bytes follow",
                    (unsigned long long)hlen, st->size - 8);
    if (hlen < 2 || st->base[8] != '{')
        return ferry_fail(err, FERRY_ERR_FORMAT, "header at offset 8 is not a JSON object");
    st->data_start = 8 + (size_t)hlen;
    uint64_t data_size = st->size - st->data_start;

    json_error_t je;
    json_t *root = json_loadb((const char *)st->base + 8, (size_t)hlen, JSON_REJECT_DUPLICATES, &je);
    if (!root)
        return ferry_fail(err, FERRY_ERR_FORMAT, "header JSON at offset %lld: %.120s", (long long)(8 + je.position),
                    je.text);
    int rc = FERRY_OK;
    struct span *sp = NULL;
    uint64_t *offs = NULL;
    size_t n_spans = 0;
    if (!json_is_object(root)) {
        rc = ferry_fail(err, FERRY_ERR_FORMAT, "header at offset 8 is not a JSON object");
        goto out;
    }
    size_t n = json_object_size(root);
    st->t = calloc(n ? n : 1, sizeof *st->t);
    sp = malloc((n ? n : 1) * sizeof *sp);
    offs = malloc(2 * (n ? n : 1) * sizeof *offs);
    if (!st->t || !sp || !offs) {
        rc = ferry_fail(err, FERRY_ERR_NOMEM, "out of memory for %zu header entries", n);
        goto out;
    }
    const char *key;
    json_t *v;
    json_object_foreach(root, key, v)
    {
        if (strcmp(key, "__metadata__") == 0) {
            if ((rc = parse_meta(st, v, err))) goto out;
            continue;
        }
        int i = st->n_tensors;
        if ((rc = parse_entry(st, key, v, &st->t[i], data_size, offs + 2 * i, err))) {
            free((char *)st->t[i].name);
            st->t[i].name = NULL;
            goto out;
        }
        if (offs[2 * i + 1] > offs[2 * i]) sp[n_spans++] = (struct span){offs[2 * i], offs[2 * i + 1], i};
        st->n_tensors++;
    }
    /* Empty tensors take no bytes and overlap nothing. */
    qsort(sp, n_spans, sizeof *sp, span_cmp);
    for (size_t i = 1; i < n_spans; i++) {
        if (sp[i].begin < sp[i - 1].end) {
            char a[80], b[80];
            rc = ferry_fail(err, FERRY_ERR_FORMAT, "tensor '%s' at file offset %llu: data overlaps tensor '%s'",
                      san(a, st->t[sp[i].idx].name), (unsigned long long)(st->data_start + sp[i].begin),
                      san(b, st->t[sp[i - 1].idx].name));
            goto out;
        }
    }
out:
    free(sp);
    free(offs);
    json_decref(root);
    return rc;
}

int safetensors_open_mem(const void *buf, size_t size, struct safetensors **out, char err[256])
{
    *out = NULL;
    err[0] = '\0';
    struct safetensors *st = calloc(1, sizeof *st);
    if (!st) return ferry_fail(err, FERRY_ERR_NOMEM, "out of memory");
    st->base = buf;
    st->size = buf ? size : 0;
    int rc = parse(st, err);
    if (rc) {
        safetensors_close(st);
        return rc;
    }
    *out = st;
    return FERRY_OK;
}

int safetensors_open(const char *path, struct safetensors **out, char err[256])
{
    *out = NULL;
    struct mapfile m;
    int rc = mapfile_open(path, &m, err);
    if (rc) return rc;
    char e2[256];
    struct safetensors *st;
    rc = safetensors_open_mem(m.data, m.size, &st, e2);
    if (rc) {
        mapfile_name_error(path, e2, err);
        mapfile_close(&m);
        return rc;
    }
    st->map = m;
    *out = st;
    return FERRY_OK;
}

void safetensors_close(struct safetensors *st)
{
    if (!st) return;
    if (st->t)
        for (int i = 0; i < st->n_tensors; i++) free((char *)st->t[i].name);
    free(st->t);
    if (st->meta)
        for (int i = 0; i < 2 * st->n_meta; i++) free(st->meta[i]);
    free(st->meta);
    mapfile_close(&st->map);
    free(st);
}

int safetensors_n_tensors(const struct safetensors *st)
{
    return st->n_tensors;
}
size_t safetensors_file_size(const struct safetensors *st)
{
    return st->size;
}

const struct st_tensor *safetensors_tensor(const struct safetensors *st, int i)
{
    return (i >= 0 && i < st->n_tensors) ? &st->t[i] : NULL;
}

const struct st_tensor *safetensors_find(const struct safetensors *st, const char *name)
{
    for (int i = 0; i < st->n_tensors; i++)
        if (strcmp(st->t[i].name, name) == 0) return &st->t[i];
    return NULL;
}

const char *safetensors_metadata(const struct safetensors *st, const char *key)
{
    for (int i = 0; i < st->n_meta; i++)
        if (strcmp(st->meta[2 * i], key) == 0) return st->meta[2 * i + 1];
    return NULL;
}

/* ---------------------------------------------------------------- sharded index */

static int plain_file_name(const char *s)
{
    return s[0] && strchr(s, '/') == NULL && strchr(s, '\\') == NULL && strcmp(s, ".") != 0 &&
           strcmp(s, "..") != 0;
}

int st_index_parse(const char *json, size_t len, struct st_index *out, char err[256])
{
    memset(out, 0, sizeof *out);
    json_error_t je;
    json_t *root = json_loadb(json, len, JSON_REJECT_DUPLICATES, &je);
    if (!root)
        return ferry_fail(err, FERRY_ERR_FORMAT, "model.safetensors.index.json at offset %d: %.150s", je.position,
                    je.text);
    int rc = FERRY_OK;
    json_t *wm = json_object_get(root, "weight_map");
    if (!json_is_object(wm)) {
        rc = ferry_fail(err, FERRY_ERR_FORMAT, "model.safetensors.index.json: no \"weight_map\" object");
        goto out;
    }
    size_t n = json_object_size(wm);
    out->names = calloc(n ? n : 1, sizeof *out->names);
    out->file_of = calloc(n ? n : 1, sizeof *out->file_of);
    out->files = calloc(n ? n : 1, sizeof *out->files);
    if (!out->names || !out->file_of || !out->files) {
        rc = ferry_fail(err, FERRY_ERR_NOMEM, "out of memory");
        goto out;
    }
    const char *k;
    json_t *v;
    json_object_foreach(wm, k, v)
    {
        char sk[80], sf[80];
        const char *f = json_string_value(v);
        if (!f || !plain_file_name(f)) {
            rc = ferry_fail(err, FERRY_ERR_FORMAT,
                      "model.safetensors.index.json: weight_map['%s'] = '%s' is not a plain "
                      "file name",
                      san(sk, k), f ? san(sf, f) : "(not a string)");
            goto out;
        }
        int fi = -1;
        for (int j = 0; j < out->n_files; j++)
            if (strcmp(out->files[j], f) == 0) fi = j;
        if (fi < 0 && out->n_files >= 4096) {
            rc = ferry_fail(err, FERRY_ERR_FORMAT, "model.safetensors.index.json: more than 4096 shard files");
            goto out;
        }
        if (fi < 0) {
            if (!(out->files[out->n_files] = strdup(f))) {
                rc = ferry_fail(err, FERRY_ERR_NOMEM, "out of memory");
                goto out;
            }
            fi = out->n_files++;
        }
        if (!(out->names[out->n_entries] = strdup(k))) {
            rc = ferry_fail(err, FERRY_ERR_NOMEM, "out of memory");
            goto out;
        }
        out->file_of[out->n_entries++] = fi;
    }
out:
    json_decref(root);
    if (rc) st_index_free(out);
    return rc;
}

void st_index_free(struct st_index *ix)
{
    if (!ix) return;
    if (ix->files)
        for (int i = 0; i < ix->n_files; i++) free(ix->files[i]);
    if (ix->names)
        for (int i = 0; i < ix->n_entries; i++) free(ix->names[i]);
    free(ix->files);
    free(ix->names);
    free(ix->file_of);
    memset(ix, 0, sizeof *ix);
}
