/* gguf_split — the shards of a split GGUF model, found and checked (see gguf_split.h).
 *
 * Names follow llama.cpp's llama_split_path: PREFIX + "-%05d-of-%05d.gguf" with the 1-based shard number and
 * the count; the prefix is what precedes that ending in the first shard's path. */
#include "weights/gguf_split.h"

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "kernels/core/status.h"
#include "weights/gguf.h"

#define SPLIT_MAX 65535 /* split.count is a u16 */

struct gguf_split {
    int n;
    struct gguf **shard; /* (n) [0] is NULL: the caller's first file */
};

static const char *base_name(const char *path)
{
    const char *b = strrchr(path, '/');
    return b && b[1] ? b + 1 : path;
}

/* The key as a u16-ranged count or index; FERRY_ERR_NOT_FOUND when absent. */
static int get_split_key(const struct gguf *g, const char *key, uint32_t *out)
{
    int rc = gguf_get_u32(g, key, out);
    if (rc == FERRY_OK && *out > SPLIT_MAX) return FERRY_ERR_FORMAT;
    return rc;
}

static uint64_t hash_name(const char *p, size_t n)
{
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ (uint8_t)p[i]) * 1099511628211ull;
    return h;
}

/* Every tensor name of the set once: FERRY_OK, or FERRY_ERR_FORMAT naming the tensor and its two shards. */
static int check_names(const struct gguf_split *s, const struct gguf *first, const char *const *paths,
                       char err[256])
{
    size_t total = 0;
    for (int f = 0; f < s->n; f++) total += (size_t)gguf_n_tensors(f ? s->shard[f] : first);
    size_t cap = 16;
    while (cap < 2 * total) cap *= 2;
    struct slot {
        int file, index; /* file -1: empty */
    } *tab = malloc(cap * sizeof *tab);
    if (!tab) return ferry_fail(err, FERRY_ERR_NOMEM, "out of memory for %zu tensor names", total);
    for (size_t i = 0; i < cap; i++) tab[i].file = -1;
    int rc = FERRY_OK;
    for (int f = 0; f < s->n && !rc; f++) {
        const struct gguf *g = f ? s->shard[f] : first;
        for (int i = 0; i < gguf_n_tensors(g) && !rc; i++) {
            const struct gguf_str nm = gguf_tensor(g, i)->name;
            size_t h = (size_t)hash_name(nm.ptr, nm.len) & (cap - 1);
            for (; tab[h].file >= 0; h = (h + 1) & (cap - 1)) {
                const int of = tab[h].file;
                const struct gguf_str o = gguf_tensor(of ? s->shard[of] : first, tab[h].index)->name;
                if (o.len == nm.len && !memcmp(o.ptr, nm.ptr, nm.len)) {
                    rc = ferry_fail(err, FERRY_ERR_FORMAT, "tensor '%.*s' is in both %.80s and %.80s",
                                    (int)(nm.len < 96 ? nm.len : 96), nm.ptr, base_name(paths[of]),
                                    base_name(paths[f]));
                    break;
                }
            }
            tab[h].file = f;
            tab[h].index = i;
        }
    }
    free(tab);
    return rc;
}

int gguf_split_open(const char *path, const struct gguf *first, struct gguf_split **out, char err[256])
{
    *out = NULL;
    uint32_t count = 0, no = 0;
    int rc = get_split_key(first, "split.count", &count);
    if (rc == FERRY_ERR_NOT_FOUND || (rc == FERRY_OK && count <= 1)) return FERRY_OK;
    if (rc) return ferry_fail(err, FERRY_ERR_FORMAT, "key 'split.count' is not a count of shards");
    const char *b = base_name(path);
    if (get_split_key(first, "split.no", &no))
        return ferry_fail(err, FERRY_ERR_FORMAT, "key 'split.no' is missing or not a shard number");
    char ending[40];
    snprintf(ending, sizeof ending, "-%05u-of-%05u.gguf", 1u, count);
    const size_t lp = strlen(path), le = strlen(ending);
    if (no != 0) {
        char own[40];
        snprintf(own, sizeof own, "-%05u-of-%05u.gguf", no + 1, count);
        const size_t lb = strlen(b), lo = strlen(own);
        if (lb > lo && lb - lo < 80 && strcmp(b + lb - lo, own) == 0)
            return ferry_fail(err, FERRY_ERR_FORMAT, "%s is shard %u of %u: open the first, %.*s%s", b,
                              no + 1, count, (int)(lb - lo), b, ending);
        return ferry_fail(err, FERRY_ERR_FORMAT, "%.80s is shard %u of %u: open the first, NAME%s", b, no + 1,
                          count, ending);
    }
    if (lp <= le || strcmp(path + lp - le, ending) != 0 || lp - le > 4000)
        return ferry_fail(err, FERRY_ERR_FORMAT,
                          "%.80s is the first of %u shards but is not named NAME%s, the name the others are "
                          "found by",
                          b, count, ending);
    const size_t lprefix = lp - le;

    struct gguf_split *s = calloc(1, sizeof *s);
    char **paths = calloc(count, sizeof *paths);
    if (s) s->shard = calloc(count, sizeof *s->shard);
    if (!s || !paths || !s->shard) {
        rc = ferry_fail(err, FERRY_ERR_NOMEM, "out of memory for %u shards", count);
        goto out;
    }
    s->n = (int)count;
    for (uint32_t i = 0; i < count && !rc; i++) {
        paths[i] = malloc(lprefix + le + 1);
        if (!paths[i]) {
            rc = ferry_fail(err, FERRY_ERR_NOMEM, "out of memory");
            break;
        }
        snprintf(paths[i], lprefix + le + 1, "%.*s-%05u-of-%05u.gguf", (int)lprefix, path, i + 1, count);
        if (i == 0) continue;
        const char *bi = base_name(paths[i]);
        struct stat sb;
        if (stat(paths[i], &sb) != 0 && errno == ENOENT) {
            rc = ferry_fail(err, FERRY_ERR_NOT_FOUND, "shard %u of %u is missing: %.150s", i + 1, count,
                            paths[i]);
            break;
        }
        if ((rc = gguf_open(paths[i], &s->shard[i], err))) break; /* its error names the file */
        uint32_t v = 0;
        int krc = get_split_key(s->shard[i], "split.no", &v);
        if (krc || v != i) {
            rc = krc ? ferry_fail(err, FERRY_ERR_FORMAT,
                                  "%.80s: key 'split.no' is missing or not a shard number", bi)
                     : ferry_fail(err, FERRY_ERR_FORMAT, "%.80s: split.no says shard %u, its name says %u",
                                  bi, v + 1, i + 1);
            break;
        }
        krc = get_split_key(s->shard[i], "split.count", &v);
        if (krc || v != count) {
            rc = krc ? ferry_fail(err, FERRY_ERR_FORMAT, "%.80s: key 'split.count' is missing or not a count",
                                  bi)
                     : ferry_fail(err, FERRY_ERR_FORMAT, "%.80s: split.count is %u, but %.80s says %u", bi, v,
                                  b, count);
            break;
        }
    }
    if (!rc) rc = check_names(s, first, (const char *const *)paths, err);
    if (!rc) {
        int64_t want = -1;
        if (gguf_get_i64(first, "split.tensors.count", &want))
            rc = ferry_fail(err, FERRY_ERR_FORMAT, "key 'split.tensors.count' is missing or not an integer");
        long long have = 0;
        for (int f = 0; f < s->n; f++) have += gguf_n_tensors(f ? s->shard[f] : first);
        if (!rc && want != have)
            rc = ferry_fail(err, FERRY_ERR_FORMAT,
                            "split.tensors.count is %lld, but the %u shards hold %lld tensors",
                            (long long)want, count, have);
    }
out:
    if (paths)
        for (uint32_t i = 0; i < count; i++) free(paths[i]);
    free(paths);
    if (rc) {
        gguf_split_close(s);
        return rc;
    }
    *out = s;
    return FERRY_OK;
}

int gguf_split_n(const struct gguf_split *s)
{
    return s ? s->n : 1;
}

const struct gguf *gguf_split_shard(const struct gguf_split *s, int i)
{
    return s && i > 0 && i < s->n ? s->shard[i] : NULL;
}

void gguf_split_close(struct gguf_split *s)
{
    if (!s) return;
    if (s->shard)
        for (int i = 0; i < s->n; i++) gguf_close(s->shard[i]);
    free(s->shard);
    free(s);
}
