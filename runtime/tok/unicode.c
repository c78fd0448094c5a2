/* unicode — UTF-8 stepping, category lookup and GPT-2's byte<->unicode map (see unicode.h). */
#include "runtime/tok/unicode.h"

/* The range of r[0, n) (sorted, disjoint) holding cp, or NULL. */
static const struct ucat_range *range_find(const struct ucat_range *r, int n, uint32_t cp)
{
    int lo = 0, hi = n - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2;
        if (cp < r[mid].lo) {
            hi = mid - 1;
        } else if (cp > r[mid].hi) {
            lo = mid + 1;
        } else {
            return &r[mid];
        }
    }
    return NULL;
}

int ucat_flags(uint32_t cp)
{
    const struct ucat_range *r = range_find(ucat_ranges, ucat_n_ranges, cp);
    return r ? r->flags : 0;
}

int ucat_is_han(uint32_t cp)
{
    return range_find(ucd_han, ucd_n_han, cp) != NULL;
}

int utf8_len(unsigned char c)
{
    if (c < 0x80) return 1;
    if ((c & 0xE0) == 0xC0) return 2;
    if ((c & 0xF0) == 0xE0) return 3;
    if ((c & 0xF8) == 0xF0) return 4;
    return 1;
}

uint32_t utf8_decode(const unsigned char *s, size_t n, int *len)
{
    unsigned char c = s[0];
    *len = 1;
    if (c < 0x80) return c;
    int l = utf8_len(c);
    if (l == 1 || (size_t)l > n) return UTF8_INVALID_BASE + c;
    uint32_t cp = c & (0x7F >> l);
    for (int i = 1; i < l; i++) {
        if ((s[i] & 0xC0) != 0x80) return UTF8_INVALID_BASE + c;
        cp = (cp << 6) | (s[i] & 0x3F);
    }
    /* Reject overlong forms, surrogates and values past U+10FFFF like a strict decoder would. */
    static const uint32_t min_cp[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < min_cp[l] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return UTF8_INVALID_BASE + c;
    *len = l;
    return cp;
}

int utf8_encode(uint32_t cp, char *out)
{
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (char)(0xC0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (char)(0xE0 | (cp >> 12));
        out[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (char)(0xF0 | (cp >> 18));
    out[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    out[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    out[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

/* GPT-2 keeps the printable bytes !..~, ¡..¬, ®..ÿ as themselves and maps the other 68 bytes, in order, to
 * U+0100.. so that every byte becomes a visible character. */
static int bytelevel_keeps(unsigned b)
{
    return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
}

uint32_t bytelevel_cp(unsigned char b)
{
    if (bytelevel_keeps(b)) return b;
    unsigned n = 0;
    for (unsigned i = 0; i < b; i++) n += !bytelevel_keeps(i);
    return 0x100 + n;
}

int bytelevel_byte(uint32_t cp)
{
    if (cp < 0x100) return bytelevel_keeps(cp) ? (int)cp : -1;
    if (cp >= 0x100 + 68) return -1;
    unsigned n = cp - 0x100;
    for (unsigned b = 0; b < 256; b++) {
        if (!bytelevel_keeps(b)) {
            if (n == 0) return (int)b;
            n--;
        }
    }
    return -1;
}
