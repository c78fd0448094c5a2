/* nfc — Unicode Normalization Form C (canonical decomposition, canonical ordering, canonical composition),
 * the normalizer Qwen2's tokenizer.json asks for. Tables come from gen_unicode.py (unicode_tables.c);
 * Hangul syllables are decomposed and composed algorithmically (Unicode §3.12).
 * Pure ASCII text is returned as a copy without any work; otherwise the cost is linear in the text plus
 * the sorting of combining-mark runs.
 */
#include <stdlib.h>
#include <string.h>

#include "kernels/core/status.h"
#include "runtime/tok/unicode.h"

enum { S_BASE = 0xAC00, L_BASE = 0x1100, V_BASE = 0x1161, T_BASE = 0x11A7, L_COUNT = 19, V_COUNT = 21,
       T_COUNT = 28, N_COUNT = V_COUNT * T_COUNT, S_COUNT = L_COUNT * N_COUNT };

static int ccc_of(uint32_t cp)
{
    int lo = 0, hi = ucd_n_ccc - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2;
        if (cp < ucd_ccc[mid].lo) hi = mid - 1;
        else if (cp > ucd_ccc[mid].hi) lo = mid + 1;
        else return ucd_ccc[mid].ccc;
    }
    return 0;
}

static const struct ucd_decomp *decomp_of(uint32_t cp)
{
    int lo = 0, hi = ucd_n_decomp - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2;
        if (cp < ucd_decomp[mid].cp) hi = mid - 1;
        else if (cp > ucd_decomp[mid].cp) lo = mid + 1;
        else return &ucd_decomp[mid];
    }
    return NULL;
}

/* The primary composite of a + b, or 0. */
static uint32_t compose(uint32_t a, uint32_t b)
{
    if (a >= L_BASE && a < L_BASE + L_COUNT && b >= V_BASE && b < V_BASE + V_COUNT)
        return S_BASE + ((a - L_BASE) * V_COUNT + (b - V_BASE)) * T_COUNT;
    if (a >= S_BASE && a < S_BASE + S_COUNT && (a - S_BASE) % T_COUNT == 0 && b > T_BASE && b < T_BASE + T_COUNT)
        return a + (b - T_BASE);
    int lo = 0, hi = ucd_n_comp - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2;
        const struct ucd_decomp *d = &ucd_decomp[ucd_comp[mid]];
        if (a < d->first || (a == d->first && b < d->second)) hi = mid - 1;
        else if (a > d->first || b > d->second) lo = mid + 1;
        else return d->cp;
    }
    return 0;
}

struct cpvec {
    uint32_t *v;
    size_t n, cap;
};

static int push(struct cpvec *c, uint32_t cp)
{
    if (c->n == c->cap) {
        size_t cap = c->cap ? c->cap * 2 : 64;
        uint32_t *v = realloc(c->v, cap * sizeof *v);
        if (!v) return FERRY_ERR_NOMEM;
        c->v = v;
        c->cap = cap;
    }
    c->v[c->n++] = cp;
    return FERRY_OK;
}

static int decompose(struct cpvec *c, uint32_t cp, int depth)
{
    if (cp >= S_BASE && cp < S_BASE + S_COUNT) {
        uint32_t s = cp - S_BASE;
        if (push(c, L_BASE + s / N_COUNT) || push(c, V_BASE + (s % N_COUNT) / T_COUNT)) return FERRY_ERR_NOMEM;
        return s % T_COUNT ? push(c, T_BASE + s % T_COUNT) : FERRY_OK;
    }
    const struct ucd_decomp *d = cp < UTF8_INVALID_BASE && depth < 8 ? decomp_of(cp) : NULL;
    if (!d) return push(c, cp);
    if (decompose(c, d->first, depth + 1)) return FERRY_ERR_NOMEM;
    return d->second ? decompose(c, d->second, depth + 1) : FERRY_OK;
}

int unicode_nfc(const char *s, size_t n, char **out, size_t *out_len)
{
    *out = NULL;
    size_t i = 0;
    while (i < n && (unsigned char)s[i] < 0x80) i++;
    if (i == n) {
        char *o = malloc(n + 1);
        if (!o) return FERRY_ERR_NOMEM;
        memcpy(o, s, n);
        o[n] = 0;
        *out = o;
        *out_len = n;
        return FERRY_OK;
    }
    struct cpvec c = {0};
    for (i = 0; i < n;) {
        int l;
        uint32_t cp = utf8_decode((const unsigned char *)s + i, n - i, &l);
        if (decompose(&c, cp, 0) != FERRY_OK) goto nomem;
        i += (size_t)l;
    }
    /* Canonical ordering: a stable insertion sort of each run of non-starters by combining class. */
    for (size_t k = 1; k < c.n; k++) {
        int ck = c.v[k] < UTF8_INVALID_BASE ? ccc_of(c.v[k]) : 0;
        if (!ck) continue;
        size_t j = k;
        uint32_t cp = c.v[k];
        while (j > 0) {
            int cj = c.v[j - 1] < UTF8_INVALID_BASE ? ccc_of(c.v[j - 1]) : 0;
            if (cj <= ck) break;
            c.v[j] = c.v[j - 1];
            j--;
        }
        c.v[j] = cp;
    }
    /* Canonical composition. */
    size_t w = 0, starter = (size_t)-1;
    int last_cc = 0;
    for (size_t k = 0; k < c.n; k++) {
        uint32_t cp = c.v[k];
        int cc = cp < UTF8_INVALID_BASE ? ccc_of(cp) : 0;
        if (starter != (size_t)-1 && cp < UTF8_INVALID_BASE && (last_cc < cc || (last_cc == 0 && w == starter + 1))) {
            uint32_t p = c.v[starter] < UTF8_INVALID_BASE ? compose(c.v[starter], cp) : 0;
            if (p) {
                c.v[starter] = p;
                continue;
            }
        }
        if (cc == 0) {
            starter = cp < UTF8_INVALID_BASE ? w : (size_t)-1;
            last_cc = 0;
        } else {
            last_cc = cc;
        }
        c.v[w++] = cp;
    }
    char *o = malloc(w * 4 + 1);
    if (!o) goto nomem;
    size_t k = 0;
    for (size_t j = 0; j < w; j++) {
        if (c.v[j] >= UTF8_INVALID_BASE) o[k++] = (char)(c.v[j] - UTF8_INVALID_BASE);
        else k += (size_t)utf8_encode(c.v[j], o + k);
    }
    o[k] = 0;
    free(c.v);
    *out = o;
    *out_len = k;
    return FERRY_OK;
nomem:
    free(c.v);
    return FERRY_ERR_NOMEM;
}
