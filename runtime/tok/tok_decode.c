/* tok_decode — tokenizer_decode() and the streaming detokenizer.
 *
 * Every token's decoded bytes are precomputed by tok_finish (t->piece): SPM pieces with '▁' as ' ' and
 * <0xNN> as the raw byte, byte-level pieces through GPT-2's reverse byte map, added tokens as their text.
 * CONTROL and UNKNOWN tokens render only when render_special (tokenizer_decode) — the stream never renders
 * them. The leading space of the first piece is kept (text continues a prompt).
 *
 * detok_push holds back the bytes of a UTF-8 sequence that is still incomplete at the end of what it has
 * seen; bytes that can never complete (an invalid lead, a broken sequence) go out as they are, so the
 * concatenation of all pushes and the final flush is exactly the byte concatenation of the pieces.
 */
#include <stdlib.h>
#include <string.h>

#include "kernels/core/status.h"
#include "runtime/tok/tok_impl.h"
#include "runtime/tok/unicode.h"

static int piece_visible(const struct tokenizer *t, int32_t id, int render_special)
{
    int ty = t->type[id];
    return render_special || (ty != TOK_TYPE_CONTROL && ty != TOK_TYPE_UNKNOWN);
}

int tokenizer_decode(const struct tokenizer *t, const int32_t *ids, int n, int render_special, char **out,
                     size_t *out_len)
{
    *out = NULL;
    if (out_len) *out_len = 0;
    if (!t || n < 0 || (n > 0 && !ids)) return FERRY_ERR_INVALID;
    size_t total = 0;
    for (int i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= t->n_vocab) return FERRY_ERR_RANGE;
        if (piece_visible(t, ids[i], render_special)) total += (size_t)t->piece_len[ids[i]];
    }
    char *s = malloc(total + 1);
    if (!s) return FERRY_ERR_NOMEM;
    size_t k = 0;
    for (int i = 0; i < n; i++) {
        if (!piece_visible(t, ids[i], render_special)) continue;
        memcpy(s + k, t->piece[ids[i]], (size_t)t->piece_len[ids[i]]);
        k += (size_t)t->piece_len[ids[i]];
    }
    s[k] = 0;
    *out = s;
    if (out_len) *out_len = k;
    return FERRY_OK;
}

void detok_init(struct detok *d, const struct tokenizer *t)
{
    memset(d, 0, sizeof *d);
    d->t = t;
}

/* Length of the tail of s[0, n) that is a valid but incomplete UTF-8 sequence (0..3). */
static int incomplete_tail(const unsigned char *s, size_t n)
{
    for (int back = 1; back <= 3 && (size_t)back <= n; back++) {
        unsigned char c = s[n - back];
        if ((c & 0xC0) == 0x80) continue; /* continuation: look further back */
        int need = utf8_len(c);
        if (need == 1) return 0; /* ASCII or an invalid lead: nothing to wait for */
        return need > back ? back : 0;
    }
    return 0;
}

int detok_push(struct detok *d, int32_t id, char *out, size_t cap)
{
    const struct tokenizer *t = d->t;
    if (!t || !out) return FERRY_ERR_INVALID;
    if (id < 0 || id >= t->n_vocab) return FERRY_ERR_RANGE;
    size_t pl = piece_visible(t, id, 0) ? (size_t)t->piece_len[id] : 0;
    const unsigned char *p = (const unsigned char *)t->piece[id];
    size_t total = (size_t)d->n_pend + pl;
    /* Decide how much of pend + piece stays pending, without building the concatenation. */
    int keep;
    if (pl >= 3) {
        keep = incomplete_tail(p, pl);
    } else {
        unsigned char tmp[8];
        memcpy(tmp, d->pend, (size_t)d->n_pend);
        memcpy(tmp + d->n_pend, p, pl);
        keep = incomplete_tail(tmp, total);
    }
    size_t emit = total - (size_t)keep;
    if (emit + 1 > cap) return FERRY_ERR_RANGE;
    unsigned char all_tail[8];
    /* The pending tail comes from the end of pend + piece. */
    size_t np = (size_t)d->n_pend;
    for (int i = 0; i < keep; i++) {
        size_t pos = total - (size_t)keep + (size_t)i;
        all_tail[i] = pos < np ? d->pend[pos] : p[pos - np];
    }
    size_t k = 0;
    size_t from_pend = emit < np ? emit : np;
    memcpy(out, d->pend, from_pend);
    k = from_pend;
    if (emit > np) {
        memcpy(out + k, p, emit - np);
        k += emit - np;
    }
    out[k] = 0;
    memcpy(d->pend, all_tail, (size_t)keep);
    d->n_pend = keep;
    d->n_seen++;
    return (int)k;
}

int detok_flush(struct detok *d, char *out, size_t cap)
{
    if (!out) return FERRY_ERR_INVALID;
    if ((size_t)d->n_pend + 1 > cap) return FERRY_ERR_RANGE;
    int k = d->n_pend;
    memcpy(out, d->pend, (size_t)k);
    out[k] = 0;
    d->n_pend = 0;
    return k;
}

char *utf8_sanitize(const char *s, size_t n, size_t *out_len)
{
    char *o = malloc(n * 3 + 1);
    if (!o) return NULL;
    size_t j = 0;
    const unsigned char *u = (const unsigned char *)s;
    for (size_t i = 0; i < n;) {
        const unsigned c = u[i];
        /* The sequence's length and its second byte's range (Unicode Table 3-7: E0, ED, F0 and F4 narrow it,
         * which excludes overlongs, surrogates and code points past U+10FFFF). */
        size_t k = 0;
        unsigned lo = 0x80, hi = 0xbf;
        if (c >= 0x01 && c < 0x80) /* NUL would cut C strings downstream */
            k = 1;
        else if (c >= 0xc2 && c <= 0xdf)
            k = 2;
        else if (c >= 0xe0 && c <= 0xef)
            k = 3, lo = c == 0xe0 ? 0xa0 : 0x80, hi = c == 0xed ? 0x9f : 0xbf;
        else if (c >= 0xf0 && c <= 0xf4)
            k = 4, lo = c == 0xf0 ? 0x90 : 0x80, hi = c == 0xf4 ? 0x8f : 0xbf;
        /* m: how many bytes of the sequence are well-formed so far (its maximal subpart when it is cut). */
        size_t m = k ? 1 : 0;
        while (m < k && i + m < n && u[i + m] >= (m == 1 ? lo : 0x80) && u[i + m] <= (m == 1 ? hi : 0xbf))
            m++;
        if (k && m == k) {
            memcpy(o + j, s + i, k);
            j += k;
            i += k;
        } else { /* one U+FFFD for the maximal subpart (at least one byte), as Python, ICU and WHATWG do */
            memcpy(o + j, "\xef\xbf\xbd", 3);
            j += 3;
            i += m ? m : 1;
        }
    }
    o[j] = 0;
    if (out_len) *out_len = j;
    return o;
}
