/* gguf_write — a GGUF v3 writer: metadata and tensor infos are collected in memory, then the file is streamed
 * to a temporary name and renamed into place (see gguf_write.h). */
#include "weights/gguf_write.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kernels/core/status.h"

#define GGUF_VERSION           3
#define GGUF_DEFAULT_ALIGNMENT 32
#define MAX_NAME               95 /* what weights/gguf.c accepts */

struct wtensor_info {
    char name[MAX_NAME + 1];
    enum dtype type;
    int n_dims;
    int64_t ne[4];
    size_t bytes;
    uint64_t offset; /* from the start of the data section */
};

/* A growable byte buffer. */
struct bytes {
    uint8_t *p;
    size_t len, cap;
};

struct gguf_writer {
    struct bytes kv; /* serialized metadata entries */
    uint64_t n_kv;
    char **keys; /* (n_kv) NUL-terminated copies, for duplicate checks */
    struct wtensor_info *t;
    int n_tensors, cap_tensors;
    size_t alignment;
    /* Streaming state, after gguf_writer_open. */
    FILE *f;
    char *path, *tmp;
    int cur;          /* tensor being written */
    size_t cur_done;  /* bytes of it written so far */
    uint64_t written; /* bytes in the file so far */
    int finished;
};

static int put(struct bytes *b, const void *p, size_t n)
{
    if (b->len + n > b->cap) {
        size_t cap = b->cap ? b->cap : 4096;
        while (cap < b->len + n) cap *= 2;
        uint8_t *q = realloc(b->p, cap);
        if (!q) return FERRY_ERR_NOMEM;
        b->p = q;
        b->cap = cap;
    }
    if (n) memcpy(b->p + b->len, p, n); /* p may be NULL when n is 0 (no metadata keys) */
    b->len += n;
    return FERRY_OK;
}
static int put_u32(struct bytes *b, uint32_t v)
{
    return put(b, &v, 4);
}
static int put_u64(struct bytes *b, uint64_t v)
{
    return put(b, &v, 8);
}
static int put_str(struct bytes *b, const char *s, size_t n)
{
    int rc = put_u64(b, n);
    return rc ? rc : put(b, s, n);
}

int gguf_writer_init(struct gguf_writer **out, char err[256])
{
    *out = calloc(1, sizeof **out);
    if (!*out) return ferry_fail(err, FERRY_ERR_NOMEM, "out of memory for a GGUF writer");
    (*out)->alignment = GGUF_DEFAULT_ALIGNMENT;
    return FERRY_OK;
}

void gguf_writer_free(struct gguf_writer *w)
{
    if (!w) return;
    if (w->f) fclose(w->f);
    if (w->tmp && !w->finished) unlink(w->tmp);
    for (uint64_t i = 0; i < w->n_kv; i++) free(w->keys[i]);
    free(w->keys);
    free(w->kv.p);
    free(w->t);
    free(w->path);
    free(w->tmp);
    free(w);
}

int gguf_writer_has_key(const struct gguf_writer *w, const char *key)
{
    for (uint64_t i = 0; i < w->n_kv; i++)
        if (!strcmp(w->keys[i], key)) return 1;
    return 0;
}

/* Records a new key (checked for duplicates and embedded NULs) before its entry is serialized. */
static int add_key(struct gguf_writer *w, const char *key, size_t len, char err[256])
{
    if (w->f) return ferry_fail(err, FERRY_ERR_INVALID, "metadata added after the GGUF header was written");
    if (len == 0 || memchr(key, '\0', len))
        return ferry_fail(err, FERRY_ERR_INVALID, "GGUF metadata key is empty or holds a NUL byte");
    char *k = malloc(len + 1);
    char **keys = realloc(w->keys, (size_t)(w->n_kv + 1) * sizeof *keys);
    if (!k || !keys) {
        free(k);
        if (keys) w->keys = keys;
        return ferry_fail(err, FERRY_ERR_NOMEM, "out of memory for GGUF metadata");
    }
    w->keys = keys;
    memcpy(k, key, len);
    k[len] = '\0';
    if (gguf_writer_has_key(w, k)) {
        int rc = ferry_fail(err, FERRY_ERR_INVALID, "duplicate GGUF metadata key '%.80s'", k);
        free(k);
        return rc;
    }
    w->keys[w->n_kv++] = k;
    return FERRY_OK;
}

static int kv_head(struct gguf_writer *w, const char *key, enum gguf_vtype t, char err[256])
{
    int rc = add_key(w, key, strlen(key), err);
    if (rc) return rc;
    if (put_str(&w->kv, key, strlen(key)) || put_u32(&w->kv, (uint32_t)t))
        return ferry_fail(err, FERRY_ERR_NOMEM, "out of memory for GGUF metadata");
    return FERRY_OK;
}

static int kv_scalar(struct gguf_writer *w, const char *key, enum gguf_vtype t, const void *v, size_t n,
                     char err[256])
{
    int rc = kv_head(w, key, t, err);
    if (rc) return rc;
    if (put(&w->kv, v, n)) return ferry_fail(err, FERRY_ERR_NOMEM, "out of memory for GGUF metadata");
    return FERRY_OK;
}

int gguf_writer_kv_u32(struct gguf_writer *w, const char *key, uint32_t v, char err[256])
{
    if (!strcmp(key, "general.alignment")) {
        if (v == 0 || (v & (v - 1)))
            return ferry_fail(err, FERRY_ERR_INVALID, "general.alignment %u is not a power of two", v);
        w->alignment = v;
    }
    return kv_scalar(w, key, GGUF_TYPE_UINT32, &v, 4, err);
}
int gguf_writer_kv_i32(struct gguf_writer *w, const char *key, int32_t v, char err[256])
{
    return kv_scalar(w, key, GGUF_TYPE_INT32, &v, 4, err);
}
int gguf_writer_kv_f32(struct gguf_writer *w, const char *key, float v, char err[256])
{
    return kv_scalar(w, key, GGUF_TYPE_FLOAT32, &v, 4, err);
}
int gguf_writer_kv_bool(struct gguf_writer *w, const char *key, int v, char err[256])
{
    const uint8_t b = v != 0;
    return kv_scalar(w, key, GGUF_TYPE_BOOL, &b, 1, err);
}
int gguf_writer_kv_str(struct gguf_writer *w, const char *key, const char *s, size_t len, char err[256])
{
    int rc = kv_head(w, key, GGUF_TYPE_STRING, err);
    if (rc) return rc;
    if (put_str(&w->kv, s, len)) return ferry_fail(err, FERRY_ERR_NOMEM, "out of memory for GGUF metadata");
    return FERRY_OK;
}

int gguf_writer_kv_arr(struct gguf_writer *w, const char *key, enum gguf_vtype elem_type, const void *data,
                       uint64_t n, char err[256])
{
    const int es_ = gguf_vtype_size(elem_type);
    const size_t es = es_ > 0 ? (size_t)es_ : 0;
    if (!es)
        return ferry_fail(err, FERRY_ERR_INVALID, "key '%.80s': bad array element type %d", key, elem_type);
    int rc = kv_head(w, key, GGUF_TYPE_ARRAY, err);
    if (rc) return rc;
    if (put_u32(&w->kv, (uint32_t)elem_type) || put_u64(&w->kv, n) || put(&w->kv, data, es * (size_t)n))
        return ferry_fail(err, FERRY_ERR_NOMEM, "out of memory for GGUF metadata");
    return FERRY_OK;
}

int gguf_writer_kv_arr_str(struct gguf_writer *w, const char *key, const char *const *strs,
                           const size_t *lens, uint64_t n, char err[256])
{
    int rc = kv_head(w, key, GGUF_TYPE_ARRAY, err);
    if (rc) return rc;
    if (put_u32(&w->kv, GGUF_TYPE_STRING) || put_u64(&w->kv, n))
        return ferry_fail(err, FERRY_ERR_NOMEM, "out of memory for GGUF metadata");
    for (uint64_t i = 0; i < n; i++)
        if (put_str(&w->kv, strs[i], lens[i]))
            return ferry_fail(err, FERRY_ERR_NOMEM, "out of memory for GGUF metadata");
    return FERRY_OK;
}

int gguf_writer_kv_raw(struct gguf_writer *w, const void *entry, size_t len, char err[256])
{
    const uint8_t *p = entry;
    uint64_t klen;
    if (len < 12)
        return ferry_fail(err, FERRY_ERR_INVALID, "GGUF metadata entry of %zu bytes is too short", len);
    memcpy(&klen, p, 8);
    if (klen > len - 12)
        return ferry_fail(err, FERRY_ERR_INVALID, "GGUF metadata entry: key longer than entry");
    int rc = add_key(w, (const char *)p + 8, (size_t)klen, err);
    if (rc) return rc;
    uint32_t t;
    memcpy(&t, p + 8 + klen, 4);
    if (!strcmp(w->keys[w->n_kv - 1], "general.alignment")) {
        uint32_t a = 0;
        if (t == GGUF_TYPE_UINT32 && len == 8 + klen + 8) memcpy(&a, p + 8 + klen + 4, 4);
        if (a == 0 || (a & (a - 1)))
            return ferry_fail(err, FERRY_ERR_INVALID, "general.alignment is not a power-of-two u32");
        w->alignment = a;
    }
    if (put(&w->kv, entry, len)) return ferry_fail(err, FERRY_ERR_NOMEM, "out of memory for GGUF metadata");
    return FERRY_OK;
}

int gguf_writer_tensor(struct gguf_writer *w, const char *name, enum dtype type, int n_dims,
                       const int64_t *ne, char err[256])
{
    if (w->f)
        return ferry_fail(err, FERRY_ERR_INVALID, "tensor %.80s declared after the GGUF header was written",
                          name);
    const size_t nl = strlen(name);
    if (nl == 0 || nl > MAX_NAME)
        return ferry_fail(err, FERRY_ERR_INVALID, "tensor name '%.80s' is empty or too long", name);
    if (!dtype_valid(type) || n_dims < 1 || n_dims > 4)
        return ferry_fail(err, FERRY_ERR_INVALID, "tensor %s: bad type %d or %d dimensions", name, type,
                          n_dims);
    struct wtensor_info ti = {.type = type};
    memcpy(ti.name, name, nl + 1);
    uint64_t n = 1;
    for (int d = 0; d < 4; d++) {
        ti.ne[d] = d < n_dims ? ne[d] : 1;
        if (ti.ne[d] < 0 || (ti.ne[d] > 0 && n > INT64_MAX / (uint64_t)ti.ne[d]))
            return ferry_fail(err, FERRY_ERR_INVALID, "tensor %s: bad shape", name);
        n *= (uint64_t)ti.ne[d];
        if (ti.ne[d] > 1) ti.n_dims = d + 1;
    }
    if (ti.n_dims == 0) ti.n_dims = 1;
    const size_t row = dtype_row_size(type, ti.ne[0]);
    if (ti.ne[0] % dtype_block_size(type))
        return ferry_fail(err, FERRY_ERR_INVALID,
                          "tensor %s: %lld columns are not a multiple of %s's block of %d", name,
                          (long long)ti.ne[0], dtype_name(type), dtype_block_size(type));
    ti.bytes = row * (size_t)(ti.ne[0] ? n / (uint64_t)ti.ne[0] : 0);
    for (int i = 0; i < w->n_tensors; i++)
        if (!strcmp(w->t[i].name, name))
            return ferry_fail(err, FERRY_ERR_INVALID, "duplicate tensor %s", name);
    if (w->n_tensors == w->cap_tensors) {
        const int cap = w->cap_tensors ? 2 * w->cap_tensors : 64;
        struct wtensor_info *t = realloc(w->t, (size_t)cap * sizeof *t);
        if (!t) return ferry_fail(err, FERRY_ERR_NOMEM, "out of memory for tensor infos");
        w->t = t;
        w->cap_tensors = cap;
    }
    w->t[w->n_tensors++] = ti;
    return FERRY_OK;
}

size_t gguf_writer_tensor_bytes(const struct gguf_writer *w, int i)
{
    return i >= 0 && i < w->n_tensors ? w->t[i].bytes : 0;
}

static size_t pad_to(uint64_t n, size_t a)
{
    return (size_t)((a - n % a) % a);
}

static int out(struct gguf_writer *w, const void *p, size_t n, char err[256])
{
    if (n && fwrite(p, 1, n, w->f) != n)
        return ferry_fail(err, FERRY_ERR_IO, "writing %s: %s", w->tmp, strerror(errno));
    w->written += n;
    return FERRY_OK;
}

static int out_zeros(struct gguf_writer *w, size_t n, char err[256])
{
    static const uint8_t zeros[256];
    while (n) {
        const size_t k = n < sizeof zeros ? n : sizeof zeros;
        int rc = out(w, zeros, k, err);
        if (rc) return rc;
        n -= k;
    }
    return FERRY_OK;
}

int gguf_writer_open(struct gguf_writer *w, const char *path, char err[256])
{
    if (w->f || w->finished) return ferry_fail(err, FERRY_ERR_INVALID, "GGUF writer already opened");
    const size_t pl = strlen(path);
    w->path = strdup(path);
    w->tmp = malloc(pl + 32);
    if (!w->path || !w->tmp) return ferry_fail(err, FERRY_ERR_NOMEM, "out of memory");
    snprintf(w->tmp, pl + 32, "%s.tmp-%ld", path, (long)getpid());
    const int fd = open(w->tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        int rc = ferry_fail(err, FERRY_ERR_IO, "cannot create %s: %s", w->tmp, strerror(errno));
        free(w->tmp);
        w->tmp = NULL; /* nothing to remove */
        return rc;
    }
    w->f = fdopen(fd, "wb");
    if (!w->f) {
        close(fd);
        return ferry_fail(err, FERRY_ERR_IO, "cannot open %s: %s", w->tmp, strerror(errno));
    }
    setvbuf(w->f, NULL, _IOFBF, 1 << 20);
    /* Tensor offsets: each tensor starts at an aligned offset of the data section. */
    uint64_t off = 0;
    for (int i = 0; i < w->n_tensors; i++) {
        w->t[i].offset = off;
        off += w->t[i].bytes + pad_to(w->t[i].bytes, w->alignment);
    }
    struct bytes h = {0};
    int rc = FERRY_OK;
    if (put(&h, "GGUF", 4) || put_u32(&h, GGUF_VERSION) || put_u64(&h, (uint64_t)w->n_tensors) ||
        put_u64(&h, w->n_kv) || put(&h, w->kv.p, w->kv.len))
        rc = FERRY_ERR_NOMEM;
    for (int i = 0; i < w->n_tensors && !rc; i++) {
        const struct wtensor_info *t = &w->t[i];
        if (put_str(&h, t->name, strlen(t->name)) || put_u32(&h, (uint32_t)t->n_dims)) rc = FERRY_ERR_NOMEM;
        for (int d = 0; d < t->n_dims && !rc; d++)
            if (put_u64(&h, (uint64_t)t->ne[d])) rc = FERRY_ERR_NOMEM;
        if (!rc && (put_u32(&h, (uint32_t)t->type) || put_u64(&h, t->offset))) rc = FERRY_ERR_NOMEM;
    }
    if (rc) {
        free(h.p);
        return ferry_fail(err, rc, "out of memory for the GGUF header");
    }
    rc = out(w, h.p, h.len, err);
    free(h.p);
    if (!rc) rc = out_zeros(w, pad_to(w->written, w->alignment), err);
    /* Zero-size tensors are complete before any data comes. */
    while (!rc && w->cur < w->n_tensors && w->t[w->cur].bytes == 0) w->cur++;
    return rc;
}

int gguf_writer_data(struct gguf_writer *w, const void *data, size_t n, char err[256])
{
    if (!w->f) return ferry_fail(err, FERRY_ERR_INVALID, "GGUF data written before gguf_writer_open");
    const uint8_t *p = data;
    while (n) {
        if (w->cur >= w->n_tensors)
            return ferry_fail(err, FERRY_ERR_INVALID, "%s: more tensor data than the tensors declared",
                              w->tmp);
        const struct wtensor_info *t = &w->t[w->cur];
        const size_t k = n < t->bytes - w->cur_done ? n : t->bytes - w->cur_done;
        int rc = out(w, p, k, err);
        if (rc) return rc;
        p += k;
        n -= k;
        w->cur_done += k;
        if (w->cur_done == t->bytes) {
            if ((rc = out_zeros(w, pad_to(t->bytes, w->alignment), err))) return rc;
            w->cur_done = 0;
            do w->cur++;
            while (w->cur < w->n_tensors && w->t[w->cur].bytes == 0);
        }
    }
    return FERRY_OK;
}

int gguf_writer_finish(struct gguf_writer *w, char err[256])
{
    if (!w->f) return ferry_fail(err, FERRY_ERR_INVALID, "GGUF writer not open");
    if (w->cur < w->n_tensors)
        return ferry_fail(err, FERRY_ERR_INVALID, "%s: tensor %s not written (%zu of %zu bytes)", w->tmp,
                          w->t[w->cur].name, w->cur_done, w->t[w->cur].bytes);
    if (fflush(w->f) != 0 || fsync(fileno(w->f)) != 0)
        return ferry_fail(err, FERRY_ERR_IO, "writing %s: %s", w->tmp, strerror(errno));
    const int rc = fclose(w->f);
    w->f = NULL;
    if (rc != 0) return ferry_fail(err, FERRY_ERR_IO, "closing %s: %s", w->tmp, strerror(errno));
    if (rename(w->tmp, w->path) != 0)
        return ferry_fail(err, FERRY_ERR_IO, "renaming %s to %s: %s", w->tmp, w->path, strerror(errno));
    w->finished = 1;
    return FERRY_OK;
}
