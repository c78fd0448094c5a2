// SOURCES: server/http_parse.c
// MAXLEN: 40000
/* fuzz_http_parse — libFuzzer target for the HTTP request-head parser, body framing and chunked decoder
 * (server/http_parse.c). The input is a request as bytes: its head is parsed at the full length and at a
 * prefix, its framing decided, and what follows the head decoded as a chunked body, in one piece and in two.
 * Checks: no crash or sanitizer report; a head's length is within the input and parsing any prefix of a
 * complete head says "need more" or the same error; every view lies inside the buffer; errors are statuses in
 * 400..599 with a sentence; the chunked decoder never writes past what it consumed, and its result does not
 * depend on where the input was split.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "server/http_parse.h"

static void check_inside(const char *buf, size_t len, const char *p, size_t n)
{
    if (p < buf || p + n > buf + len) abort();
}

static int decode(const char *body, size_t n, size_t split, char *out_body, size_t *out_len, size_t *consumed)
{
    char *buf = malloc(n ? n : 1);
    struct http_chunked c = {0};
    const char *why;
    size_t len = 0, fed = 0;
    int rc = 0;
    for (int part = 0; part < 2 && rc == 0; part++) {
        size_t add = part == 0 ? split : n - split;
        memcpy(buf + len, body + (part == 0 ? 0 : split), add);
        len += add, fed += add;
        rc = http_chunked_decode(&c, buf, len, 4096, &why);
        if (c.out > c.in || c.in > len) abort();
        if (rc < 0 && (rc > -400 || rc < -599 || !why || !why[0])) abort();
        size_t gap = c.in - c.out; /* compact as the connection does */
        memmove(buf + c.out, buf + c.in, len - c.in);
        len -= gap;
        c.in = c.out;
    }
    memcpy(out_body, buf, c.out);
    *out_len = c.out;
    *consumed = fed - (len - c.out); /* fed, less what is still waiting after the decoded bytes */
    free(buf);
    return rc;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *buf = (const char *)data;
    struct http_head h;
    const char *why = NULL;
    int rc = http_parse_head(buf, size, 32768, &h, &why);
    if (rc < 0) {
        if (rc > -400 || rc < -599 || !why || !why[0]) abort();
        return 0;
    }
    if (rc == 0) return 0;
    if ((size_t)rc > size) abort();
    check_inside(buf, (size_t)rc, h.method, h.method_len);
    check_inside(buf, (size_t)rc, h.target, h.target_len);
    for (int i = 0; i < h.n_fields; i++) {
        check_inside(buf, (size_t)rc, h.fields[i].name, h.fields[i].name_len);
        check_inside(buf, (size_t)rc, h.fields[i].value, h.fields[i].value_len);
    }
    struct http_head h2;
    const char *why2;
    int rc2 = http_parse_head(buf, (size_t)rc - 1, 32768, &h2, &why2);
    if (rc2 != 0 && rc2 >= 0) abort();
    char path[256];
    int pl = http_target_path(h.target, h.target_len, path, sizeof path);
    if (pl >= 0 && (size_t)pl != strlen(path)) abort();
    struct http_framing f;
    if (http_head_framing(&h, &f, &why) == 0 && f.chunked && f.content_length >= 0) abort();
    /* the rest as a chunked body: the same answer whether it arrives in one piece or two */
    size_t n = size - (size_t)rc;
    const char *body = buf + rc;
    char *b1 = malloc(n + 1), *b2 = malloc(n + 1);
    size_t l1, l2, c1, c2;
    int r1 = decode(body, n, n, b1, &l1, &c1);
    int r2 = decode(body, n, n / 2, b2, &l2, &c2);
    if (r1 == 1 && (r2 != 1 || l1 != l2 || c1 != c2 || memcmp(b1, b2, l1))) abort();
    if (r1 < 0 && r2 != r1) abort();
    free(b1);
    free(b2);
    return 0;
}
