/* imatrix — importance-matrix files, GGUF and legacy .dat (see imatrix.h). */
#include "weights/imatrix.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/core/status.h"
#include "weights/gguf.h"

#define MAX_NAME 4096 /* bytes of a legacy entry's name */

void imatrix_free(struct imatrix *m)
{
    if (!m) return;
    for (int i = 0; i < m->n_entries; i++) {
        free(m->entries[i].name);
        free(m->entries[i].w);
    }
    free(m->entries);
    free(m->path);
    free(m->dataset);
    free(m);
}

static int cmp_entry(const void *a, const void *b)
{
    return strcmp(((const struct imatrix_entry *)a)->name, ((const struct imatrix_entry *)b)->name);
}

const struct imatrix_entry *imatrix_find(const struct imatrix *m, const char *name)
{
    if (!m || !name) return NULL;
    const struct imatrix_entry key = {.name = (char *)name};
    return bsearch(&key, m->entries, (size_t)m->n_entries, sizeof key, cmp_entry);
}

static char *dup_n(const char *s, size_t n)
{
    char *d = malloc(n + 1);
    if (d) {
        memcpy(d, s, n);
        d[n] = 0;
    }
    return d;
}

/* A new entry named (name, len) with n values; NULL when out of memory. */
static struct imatrix_entry *add_entry(struct imatrix *m, const char *name, size_t len, int64_t n)
{
    struct imatrix_entry *e = realloc(m->entries, (size_t)(m->n_entries + 1) * sizeof *e);
    if (!e) return NULL;
    m->entries = e;
    e = &m->entries[m->n_entries];
    *e = (struct imatrix_entry){.name = dup_n(name, len), .w = malloc((size_t)n * sizeof(float)), .n = n};
    if (!e->name || !e->w) {
        free(e->name);
        free(e->w);
        return NULL;
    }
    m->n_entries++;
    return e;
}

/* ---- GGUF ---------------------------------------------------------------------------------------------- */

static bool has_suffix(struct gguf_str s, const char *suf, size_t *stem)
{
    const size_t n = strlen(suf);
    if (s.len <= n || memcmp(s.ptr + s.len - n, suf, n)) return false;
    *stem = s.len - n;
    return true;
}

static int load_gguf(struct imatrix *m, const char *path, char err[256])
{
    struct gguf *g = NULL;
    int rc = gguf_open(path, &g, err);
    if (rc) return rc;
    uint32_t chunks = 0, chunk_size = 0;
    enum gguf_vtype et;
    uint64_t n_sets = 0;
    if (gguf_get_arr(g, "imatrix.datasets", &et, &n_sets) ||
        gguf_get_u32(g, "imatrix.chunk_count", &chunks) ||
        gguf_get_u32(g, "imatrix.chunk_size", &chunk_size)) {
        rc = ferry_fail(
            err, FERRY_ERR_FORMAT,
            "%s: missing imatrix metadata (imatrix.datasets, imatrix.chunk_count, imatrix.chunk_size)", path);
        goto out;
    }
    m->chunk_count = (int32_t)chunks;
    struct gguf_str ds;
    if (et == GGUF_TYPE_STRING && n_sets > 0 && !gguf_arr_str(g, "imatrix.datasets", 0, &ds) &&
        !(m->dataset = dup_n(ds.ptr, ds.len))) {
        rc = ferry_fail(err, FERRY_ERR_NOMEM, "out of memory");
        goto out;
    }
    if (gguf_n_tensors(g) < 1) {
        rc = ferry_fail(err, FERRY_ERR_FORMAT, "%s: no data", path);
        goto out;
    }
    for (int i = 0; i < gguf_n_tensors(g); i++) {
        const struct gguf_tensor_info *sums = gguf_tensor(g, i);
        size_t stem;
        if (!has_suffix(sums->name, ".in_sum2", &stem)) continue;
        const struct gguf_tensor_info *counts = NULL;
        for (int k = 0; k < gguf_n_tensors(g) && !counts; k++) {
            const struct gguf_tensor_info *c = gguf_tensor(g, k);
            size_t cs;
            if (has_suffix(c->name, ".counts", &cs) && cs == stem &&
                !memcmp(c->name.ptr, sums->name.ptr, stem))
                counts = c;
        }
        if (!counts || sums->type != DTYPE_F32 || counts->type != DTYPE_F32) {
            rc = ferry_fail(err, FERRY_ERR_FORMAT, "%s: %.*s: %s", path, (int)stem, sums->name.ptr,
                            counts ? "sums and counts must be F32" : "sums without counts");
            goto out;
        }
        const int64_t nval = (int64_t)(sums->nbytes / 4), ncounts = (int64_t)(counts->nbytes / 4);
        if (ncounts < 1 || nval < 1 || nval % ncounts) {
            rc = ferry_fail(err, FERRY_ERR_FORMAT, "%s: %.*s: %lld sums do not split over %lld counts", path,
                            (int)stem, sums->name.ptr, (long long)nval, (long long)ncounts);
            goto out;
        }
        struct imatrix_entry *e = add_entry(m, sums->name.ptr, stem, nval);
        if (!e) {
            rc = ferry_fail(err, FERRY_ERR_NOMEM, "out of memory");
            goto out;
        }
        const int64_t ne0 = nval / ncounts;
        for (int64_t j = 0; j < ncounts; j++) {
            float c32;
            memcpy(&c32, (const uint8_t *)counts->data + 4 * j, 4);
            /* Counts are integers stored as f32: rounded, then divided by as f32. */
            const float count = isfinite(c32) && fabsf(c32) < 9e18f ? (float)lroundf(c32) : 0.0f;
            for (int64_t k = 0; k < ne0; k++) {
                float s;
                memcpy(&s, (const uint8_t *)sums->data + 4 * (j * ne0 + k), 4);
                e->w[j * ne0 + k] = count > 0.0f ? s / count : 1.0f;
            }
        }
    }
out:
    gguf_close(g);
    return rc;
}

/* ---- legacy .dat --------------------------------------------------------------------------------------- */

static bool read_i32(FILE *f, int32_t *v)
{
    return fread(v, 4, 1, f) == 1;
}

static int load_legacy(struct imatrix *m, FILE *f, const char *path, char err[256])
{
    int32_t n_entries;
    if (!read_i32(f, &n_entries) || n_entries < 1)
        return ferry_fail(err, FERRY_ERR_FORMAT, "%s: not a GGUF imatrix and no legacy entries", path);
    char *name = malloc(MAX_NAME + 1);
    if (!name) return ferry_fail(err, FERRY_ERR_NOMEM, "out of memory");
    int rc = FERRY_OK;
    for (int32_t i = 0; i < n_entries && !rc; i++) {
        int32_t len, ncall, nval;
        if (!read_i32(f, &len) || len < 0 || len > MAX_NAME ||
            fread(name, 1, (size_t)len, f) != (size_t)len) {
            rc = ferry_fail(err, FERRY_ERR_FORMAT, "%s: entry %d: bad name", path, i + 1);
            break;
        }
        name[len] = 0; /* the name ends at its first NUL, as std::string(char *) reads it */
        if (!read_i32(f, &ncall) || !read_i32(f, &nval) || nval < 1 || nval > (1 << 28)) {
            rc = ferry_fail(err, FERRY_ERR_FORMAT, "%s: entry %s: bad value count", path, name);
            break;
        }
        struct imatrix_entry *e = add_entry(m, name, strlen(name), nval);
        if (!e) {
            rc = ferry_fail(err, FERRY_ERR_NOMEM, "out of memory");
            break;
        }
        if (fread(e->w, 4, (size_t)nval, f) != (size_t)nval) {
            rc = ferry_fail(err, FERRY_ERR_FORMAT, "%s: entry %s: truncated values", path, name);
            break;
        }
        if (ncall > 0)
            for (int32_t k = 0; k < nval; k++) e->w[k] = e->w[k] / (float)ncall;
    }
    int32_t chunks, dlen;
    if (!rc && read_i32(f, &chunks)) { /* the optional trailer */
        m->chunk_count = chunks;
        if (read_i32(f, &dlen) && dlen > 0 && dlen <= MAX_NAME &&
            fread(name, 1, (size_t)dlen, f) == (size_t)dlen) {
            name[dlen] = 0;
            if (!(m->dataset = dup_n(name, strlen(name))))
                rc = ferry_fail(err, FERRY_ERR_NOMEM, "out of memory");
        }
    }
    free(name);
    m->legacy = true;
    return rc;
}

int imatrix_load(const char *path, struct imatrix **out, char err[256])
{
    *out = NULL;
    FILE *f = fopen(path, "rb");
    if (!f) return ferry_fail(err, FERRY_ERR_IO, "cannot open imatrix %s", path);
    struct imatrix *m = calloc(1, sizeof *m);
    if (!m || !(m->path = dup_n(path, strlen(path)))) {
        fclose(f);
        imatrix_free(m);
        return ferry_fail(err, FERRY_ERR_NOMEM, "out of memory");
    }
    char magic[4] = {0};
    const bool is_gguf = fread(magic, 1, 4, f) == 4 && !memcmp(magic, "GGUF", 4);
    int rc;
    if (is_gguf) {
        fclose(f);
        rc = load_gguf(m, path, err);
    } else {
        rewind(f);
        rc = load_legacy(m, f, path, err);
        fclose(f);
    }
    if (!rc && m->n_entries < 1)
        rc = ferry_fail(err, FERRY_ERR_FORMAT, "%s: no importance matrix entries", path);
    for (int i = 0; !rc && i < m->n_entries; i++)
        for (int64_t k = 0; k < m->entries[i].n; k++)
            if (!isfinite(m->entries[i].w[k])) {
                rc = ferry_fail(err, FERRY_ERR_FORMAT, "%s: entry %s holds a non-finite value at %lld", path,
                                m->entries[i].name, (long long)k);
                break;
            }
    if (!rc) {
        qsort(m->entries, (size_t)m->n_entries, sizeof *m->entries, cmp_entry);
        for (int i = 1; !rc && i < m->n_entries; i++)
            if (!strcmp(m->entries[i - 1].name, m->entries[i].name))
                rc =
                    ferry_fail(err, FERRY_ERR_FORMAT, "%s: entry %s appears twice", path, m->entries[i].name);
    }
    if (rc) {
        imatrix_free(m);
        return rc;
    }
    *out = m;
    return FERRY_OK;
}
