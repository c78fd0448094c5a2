/* tok_encode — tokenizer_encode(): special-token partition, normalization, pre-tokenization and the two
 * merge algorithms (see the description at the top of tokenizer.c).
 *
 * Scratch memory is allocated per call (encoding is not on the per-token path) and sized by the input:
 * every array is O(len), so the cost of a call is O(len log len) plus O(n_specials * len) for matching
 * special tokens.
 */
#include <ctype.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/core/status.h"
#include "runtime/tok/tok_impl.h"
#include "runtime/tok/unicode.h"

#define SPM_SPACE "\xe2\x96\x81" /* U+2581 '▁' */

struct sym {
    int start, len; /* byte span in the word buffer; len 0 once merged into its left neighbour */
    int prev, next; /* neighbours in the chain, -1 at the ends */
    int32_t id;     /* BPE: token id of the span, -1 when it is not a token */
};

struct pair {
    double key;       /* SPM: -score, BPE: rank; the smallest pops first */
    int left, right;  /* symbol indices */
    int size;         /* SPM: byte length of the merged span */
    int32_t lid, rid; /* BPE: ids the symbols had when the pair was queued */
    int32_t result;   /* BPE: id of the merged span */
};

struct enc {
    const struct tokenizer *t;
    int32_t *out;
    int cap;
    long n;
    int err;
    struct sym *syms;
    int syms_cap;
    struct pair *heap;
    int heap_n, heap_cap;
    char *buf; /* normalized / byte-level encoded text of one fragment or word */
    size_t buf_cap;
};

static void emit(struct enc *e, int32_t id)
{
    if (id < 0) return;
    if (e->n < e->cap) e->out[e->n] = id;
    e->n++;
}

static int grow(void **p, int *cap, int need, size_t elem)
{
    if (need <= *cap) return FERRY_OK;
    int c = *cap ? *cap : 64;
    while (c < need) c *= 2;
    void *q = realloc(*p, (size_t)c * elem);
    if (!q) return FERRY_ERR_NOMEM;
    *p = q;
    *cap = c;
    return FERRY_OK;
}

static int buf_reserve(struct enc *e, size_t need)
{
    if (need <= e->buf_cap) return FERRY_OK;
    size_t c = e->buf_cap ? e->buf_cap : 256;
    while (c < need) c *= 2;
    char *q = realloc(e->buf, c);
    if (!q) return FERRY_ERR_NOMEM;
    e->buf = q;
    e->buf_cap = c;
    return FERRY_OK;
}

/* ---- binary heap of candidate pairs ---------------------------------------------------------------- */

static int pair_less(const struct pair *a, const struct pair *b)
{
    return a->key < b->key || (a->key == b->key && a->left < b->left);
}

static int heap_push(struct enc *e, const struct pair *p)
{
    if (grow((void **)&e->heap, &e->heap_cap, e->heap_n + 1, sizeof *e->heap) != FERRY_OK)
        return FERRY_ERR_NOMEM;
    int i = e->heap_n++;
    while (i > 0) {
        int up = (i - 1) / 2;
        if (!pair_less(p, &e->heap[up])) break;
        e->heap[i] = e->heap[up];
        i = up;
    }
    e->heap[i] = *p;
    return FERRY_OK;
}

static struct pair heap_pop(struct enc *e)
{
    struct pair top = e->heap[0], last = e->heap[--e->heap_n];
    int i = 0, n = e->heap_n;
    for (;;) {
        int c = 2 * i + 1;
        if (c >= n) break;
        if (c + 1 < n && pair_less(&e->heap[c + 1], &e->heap[c])) c++;
        if (!pair_less(&e->heap[c], &last)) break;
        e->heap[i] = e->heap[c];
        i = c;
    }
    if (n > 0) e->heap[i] = last;
    return top;
}

/* ---- SentencePiece (score) merging ------------------------------------------------------------------ */

/* llama.cpp's unicode_len_utf8: the length announced by the lead byte's high nibble. */
static int spm_char_len(unsigned char c)
{
    static const int lens[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
    return lens[c >> 4];
}

static int spm_try_pair(struct enc *e, const char *w, int left, int right)
{
    if (left < 0 || right < 0) return FERRY_OK;
    const struct sym *l = &e->syms[left], *r = &e->syms[right];
    int32_t id = tok_lookup(e->t, w + l->start, (size_t)(l->len + r->len));
    if (id < 0) return FERRY_OK;
    struct pair p = {-(double)e->t->score[id], left, right, l->len + r->len, -1, -1, id};
    return heap_push(e, &p);
}

static int spm_word(struct enc *e, const char *w, int n)
{
    const struct tokenizer *t = e->t;
    int n_syms = 0;
    for (int off = 0; off < n;) {
        int l = spm_char_len((unsigned char)w[off]);
        if (l > n - off) l = n - off;
        if (grow((void **)&e->syms, &e->syms_cap, n_syms + 1, sizeof *e->syms) != FERRY_OK)
            return FERRY_ERR_NOMEM;
        e->syms[n_syms] = (struct sym){off, l, n_syms - 1, off + l == n ? -1 : n_syms + 1, -1};
        n_syms++;
        off += l;
    }
    e->heap_n = 0;
    for (int i = 1; i < n_syms; i++)
        if (spm_try_pair(e, w, i - 1, i) != FERRY_OK) return FERRY_ERR_NOMEM;
    while (e->heap_n > 0) {
        struct pair p = heap_pop(e);
        struct sym *l = &e->syms[p.left], *r = &e->syms[p.right];
        if (l->len == 0 || r->len == 0 || l->len + r->len != p.size) continue;
        l->len += r->len;
        r->len = 0;
        l->next = r->next;
        if (r->next >= 0) e->syms[r->next].prev = p.left;
        if (spm_try_pair(e, w, l->prev, p.left) != FERRY_OK ||
            spm_try_pair(e, w, p.left, l->next) != FERRY_OK)
            return FERRY_ERR_NOMEM;
    }
    for (int i = n_syms > 0 ? 0 : -1; i >= 0; i = e->syms[i].next) {
        const struct sym *s = &e->syms[i];
        int32_t id = tok_lookup(t, w + s->start, (size_t)s->len);
        if (id >= 0) {
            emit(e, id);
            continue;
        }
        for (int j = 0; j < s->len; j++) {
            unsigned char b = (unsigned char)w[s->start + j];
            int32_t bid = t->byte_tok[b];
            if (bid < 0) bid = tok_lookup(t, (const char *)&b, 1);
            emit(e, bid >= 0 ? bid : t->unk);
        }
    }
    return FERRY_OK;
}

/* ---- BPE (rank) merging ------------------------------------------------------------------------------ */

static int bpe_try_pair(struct enc *e, int left, int right)
{
    if (left < 0 || right < 0) return FERRY_OK;
    int32_t result = -1;
    int rank = tok_merge_rank(e->t, e->syms[left].id, e->syms[right].id, &result);
    if (rank < 0) return FERRY_OK;
    struct pair p = {(double)rank, left, right, 0, e->syms[left].id, e->syms[right].id, result};
    return heap_push(e, &p);
}

/* Merges one pre-tokenized word w[0, n) (already byte-level encoded when t->bytelevel). */
static int bpe_word(struct enc *e, const char *w, int n)
{
    const struct tokenizer *t = e->t;
    if (n <= 0) return FERRY_OK;
    int newlines = t->whole_newlines;
    for (int i = 0; newlines && i < n; i++) newlines = w[i] == '\n';
    if (t->ignore_merges || newlines) {
        int32_t id = tok_lookup(t, w, (size_t)n);
        if (id >= 0) {
            emit(e, id);
            return FERRY_OK;
        }
    }
    int n_syms = 0;
    for (int off = 0; off < n;) {
        int l;
        utf8_decode((const unsigned char *)w + off, (size_t)(n - off), &l);
        if (grow((void **)&e->syms, &e->syms_cap, n_syms + 1, sizeof *e->syms) != FERRY_OK)
            return FERRY_ERR_NOMEM;
        e->syms[n_syms] = (struct sym){off, l, n_syms - 1, off + l == n ? -1 : n_syms + 1,
                                       tok_lookup(t, w + off, (size_t)l)};
        n_syms++;
        off += l;
    }
    e->heap_n = 0;
    for (int i = 1; i < n_syms; i++)
        if (bpe_try_pair(e, i - 1, i) != FERRY_OK) return FERRY_ERR_NOMEM;
    while (e->heap_n > 0) {
        struct pair p = heap_pop(e);
        struct sym *l = &e->syms[p.left], *r = &e->syms[p.right];
        if (l->len == 0 || r->len == 0 || l->id != p.lid || r->id != p.rid) continue;
        l->len += r->len;
        l->id = p.result;
        r->len = 0;
        l->next = r->next;
        if (r->next >= 0) e->syms[r->next].prev = p.left;
        if (bpe_try_pair(e, l->prev, p.left) != FERRY_OK || bpe_try_pair(e, p.left, l->next) != FERRY_OK)
            return FERRY_ERR_NOMEM;
    }
    for (int i = 0; i >= 0; i = e->syms[i].next) {
        const struct sym *s = &e->syms[i];
        if (s->id >= 0) {
            emit(e, s->id);
            continue;
        }
        if (t->bytelevel) {
            /* llama.cpp: a span that is no token falls back to its single bytes that are tokens. */
            for (int j = 0; j < s->len; j++) emit(e, tok_lookup(t, w + s->start + j, 1));
            continue;
        }
        int all_bytes = t->byte_fallback;
        for (int j = 0; all_bytes && j < s->len; j++)
            all_bytes = t->byte_tok[(unsigned char)w[s->start + j]] >= 0;
        if (all_bytes) {
            for (int j = 0; j < s->len; j++) emit(e, t->byte_tok[(unsigned char)w[s->start + j]]);
        } else {
            emit(e, t->unk);
        }
    }
    return FERRY_OK;
}

/* ---- fragments ---------------------------------------------------------------------------------------- */

static int encode_fragment(struct enc *e, const char *text, size_t len, int at_start, int prev_special,
                           char **wbuf, size_t *wcap)
{
    const struct tokenizer *t = e->t;
    const char *src = text;
    size_t n = len;
    if (t->norm != TOK_NORM_NONE) {
        int prefix;
        if (t->norm == TOK_NORM_SPM) {
            prefix = t->add_space_prefix && prev_special;
        } else {
            prefix = (t->meta_prepend == 2 || (t->meta_prepend == 1 && at_start)) &&
                     !(len > 0 && text[0] == ' ') && !(len >= 3 && memcmp(text, SPM_SPACE, 3) == 0);
        }
        if (buf_reserve(e, 3 * len + 4) != FERRY_OK) return FERRY_ERR_NOMEM;
        size_t k = 0;
        if (prefix) {
            memcpy(e->buf, SPM_SPACE, 3);
            k = 3;
        }
        for (size_t i = 0; i < len; i++) {
            if (text[i] == ' ') {
                memcpy(e->buf + k, SPM_SPACE, 3);
                k += 3;
            } else {
                e->buf[k++] = text[i];
            }
        }
        src = e->buf;
        n = k;
    }
    if (t->prefix_space && n > 0 && src[0] != ' ') {
        if (buf_reserve(e, n + 2) != FERRY_OK) return FERRY_ERR_NOMEM;
        e->buf[0] = ' ';
        memcpy(e->buf + 1, src, n);
        src = e->buf;
        n++;
    }
    if (n == 0) return FERRY_OK;
    if (t->algo == TOK_ALGO_SPM) return spm_word(e, src, (int)n);

    struct cpbuf cb = {0};
    cb.cp = malloc(n * sizeof *cb.cp);
    cb.fl = malloc(n);
    cb.off = malloc((n + 1) * sizeof *cb.off);
    int rc = FERRY_ERR_NOMEM, *ends = NULL;
    if (!cb.cp || !cb.fl || !cb.off) goto out;
    for (size_t i = 0; i < n;) {
        int l;
        uint32_t cp = utf8_decode((const unsigned char *)src + i, n - i, &l);
        cb.cp[cb.n] = cp;
        cb.fl[cb.n] = (uint8_t)ucat_flags(cp);
        cb.off[cb.n++] = (int)i;
        i += (size_t)l;
    }
    cb.off[cb.n] = (int)n;
    int n_words = pretok_split(&t->pre, &cb, &ends);
    if (n_words < 0) {
        rc = n_words;
        goto out;
    }
    rc = FERRY_OK;
    for (int i = 0, a = 0; i < n_words && rc == FERRY_OK; a = ends[i++]) {
        const char *w = src + cb.off[a];
        int wn = cb.off[ends[i]] - cb.off[a];
        if (!t->bytelevel) {
            rc = bpe_word(e, w, wn);
            continue;
        }
        if ((size_t)wn * 2 + 1 > *wcap) {
            size_t c = (size_t)wn * 2 + 64;
            char *q = realloc(*wbuf, c);
            if (!q) {
                rc = FERRY_ERR_NOMEM;
                break;
            }
            *wbuf = q;
            *wcap = c;
        }
        int k = 0;
        for (int j = 0; j < wn; j++) k += utf8_encode(t->byte_cp[(unsigned char)w[j]], *wbuf + k);
        rc = bpe_word(e, *wbuf, k);
    }
out:
    free(ends);
    free(cb.cp);
    free(cb.fl);
    free(cb.off);
    return rc;
}

struct frag {
    int32_t id;      /* special token id, or -1 for raw text */
    size_t off, len; /* raw text span */
};

/* Cuts special tokens out of the text, longest first (llama.cpp tokenizer_st_partition). */
static int partition(const struct tokenizer *t, const char *text, size_t len, int parse_special,
                     struct frag **out, int *n_out)
{
    int n = 1, cap = 16;
    struct frag *f = malloc((size_t)cap * sizeof *f), *g = NULL;
    if (!f) return FERRY_ERR_NOMEM;
    f[0] = (struct frag){-1, 0, len};
    if (len == 0) n = 0;
    for (int s = 0; s < t->n_specials; s++) {
        int32_t id = t->specials[s];
        int ty = t->type[id];
        if (!parse_special && (ty == TOK_TYPE_CONTROL || ty == TOK_TYPE_UNKNOWN)) continue;
        const char *st = t->text[id];
        size_t sl = (size_t)t->len[id];
        int any = 0;
        for (int i = 0; i < n && !any; i++)
            any = f[i].id < 0 && f[i].len >= sl && memmem(text + f[i].off, f[i].len, st, sl) != NULL;
        if (!any) continue;
        int gn = 0, gcap = n * 2 + 8;
        g = malloc((size_t)gcap * sizeof *g);
        if (!g) goto nomem;
        for (int i = 0; i < n; i++) {
            if (f[i].id >= 0) {
                if (grow((void **)&g, &gcap, gn + 1, sizeof *g) != FERRY_OK) goto nomem;
                g[gn++] = f[i];
                continue;
            }
            size_t pos = f[i].off, end = f[i].off + f[i].len;
            const char *m;
            while (pos < end && (m = memmem(text + pos, end - pos, st, sl)) != NULL) {
                size_t mo = (size_t)(m - text), ll = mo - pos;
                if (t->strip[id] & 1)
                    while (ll > 0 && isspace((unsigned char)text[pos + ll - 1])) ll--;
                if (grow((void **)&g, &gcap, gn + 2, sizeof *g) != FERRY_OK) goto nomem;
                if (ll > 0) g[gn++] = (struct frag){-1, pos, ll};
                g[gn++] = (struct frag){id, mo, sl};
                pos = mo + sl;
                if (t->strip[id] & 2)
                    while (pos < end && isspace((unsigned char)text[pos])) pos++;
            }
            if (pos < end) {
                if (grow((void **)&g, &gcap, gn + 1, sizeof *g) != FERRY_OK) goto nomem;
                g[gn++] = (struct frag){-1, pos, end - pos};
            }
        }
        free(f);
        f = g;
        g = NULL;
        n = gn;
    }
    *out = f;
    *n_out = n;
    return FERRY_OK;
nomem:
    free(f);
    free(g);
    return FERRY_ERR_NOMEM;
}

int tokenizer_encode(const struct tokenizer *t, const char *text, size_t len, int add_bos, int parse_special,
                     int32_t *out, int cap)
{
    if (!t || (!text && len > 0) || cap < 0 || (cap > 0 && !out)) return FERRY_ERR_INVALID;
    if (len > (size_t)INT_MAX / 4) return FERRY_ERR_RANGE;
    struct enc e = {.t = t, .out = out, .cap = cap};
    struct frag *f = NULL;
    int n_frags = 0;
    char *wbuf = NULL;
    size_t wcap = 0;
    int rc = partition(t, text ? text : "", len, parse_special, &f, &n_frags);
    if (rc != FERRY_OK) return rc;
    if (add_bos && t->bos >= 0) emit(&e, t->bos);
    int prev_special = 1;
    for (int i = 0; i < n_frags && rc == FERRY_OK; i++) {
        if (f[i].id >= 0) {
            emit(&e, f[i].id);
            prev_special = 1;
            continue;
        }
        if (t->nfc) {
            char *norm;
            size_t nlen;
            rc = unicode_nfc(text + f[i].off, f[i].len, &norm, &nlen);
            if (rc == FERRY_OK)
                rc = encode_fragment(&e, norm, nlen, f[i].off == 0, prev_special, &wbuf, &wcap);
            free(norm);
        } else {
            rc = encode_fragment(&e, text + f[i].off, f[i].len, f[i].off == 0, prev_special, &wbuf, &wcap);
        }
        prev_special = 0;
    }
    free(f);
    free(wbuf);
    free(e.syms);
    free(e.heap);
    free(e.buf);
    if (rc != FERRY_OK) return rc;
    return e.n > INT_MAX ? FERRY_ERR_RANGE : (int)e.n;
}
