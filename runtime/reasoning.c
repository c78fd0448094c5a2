/* reasoning — see reasoning.h. */
#include "runtime/reasoning.h"

#include <string.h>

static const char OPEN[] = "<think>", CLOSE[] = "</think>";

static int is_ws(char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

/* Length of the longest suffix of s[0, n) that is a proper prefix of m. */
static size_t partial(const char *s, size_t n, const char *m)
{
    size_t ml = strlen(m);
    for (size_t k = ml - 1 < n ? ml - 1 : n; k > 0; k--)
        if (!memcmp(s + n - k, m, k)) return k;
    return 0;
}

int reasoning_prompt_started(const char *prompt, size_t len)
{
    while (len && is_ws(prompt[len - 1])) len--;
    return len >= sizeof OPEN - 1 && !memcmp(prompt + len - (sizeof OPEN - 1), OPEN, sizeof OPEN - 1);
}

void reasoning_split(const char *text, size_t len, int started, int final, struct reasoning_split *out)
{
    memset(out, 0, sizeof *out);
    size_t at = 0;
    if (started) { /* some models write the opening marker again */
        size_t w = 0;
        while (w < len && is_ws(text[w])) w++;
        if (len - w >= sizeof OPEN - 1 && !memcmp(text + w, OPEN, sizeof OPEN - 1))
            at = w + sizeof OPEN - 1;
        else if (!final && len - w < sizeof OPEN - 1 && !memcmp(text + w, OPEN, len - w))
            return; /* may be that marker: wait */
    } else {
        while (at < len && is_ws(text[at])) at++;
        size_t left = len - at;
        if (left < sizeof OPEN - 1 && !memcmp(text + at, OPEN, left) && !final) return; /* may still open */
        if (left < sizeof OPEN - 1 || memcmp(text + at, OPEN, sizeof OPEN - 1)) {
            out->a_end = len; /* no reasoning: all answer */
            return;
        }
        at += sizeof OPEN - 1;
    }
    out->r_start = at;
    const char *close = memmem(text + at, len - at, CLOSE, sizeof CLOSE - 1);
    if (!close) {
        out->r_end = final ? len : len - partial(text + at, len - at, CLOSE);
        out->a_start = out->a_end = len;
        return;
    }
    out->r_end = (size_t)(close - text);
    size_t a = out->r_end + sizeof CLOSE - 1;
    while (a < len && is_ws(text[a])) a++; /* the blank line after the block is not part of the answer */
    out->a_start = a;
    out->a_end = len;
}
