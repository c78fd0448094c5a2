/* test_http_parse — the request-head parser, body framing and the chunked decoder (server/http_parse.c).
 *
 * Heads are parsed at every prefix length with the last byte flush against a PROT_NONE guard page, so a read
 * one byte too far faults; the chunked decoder is checked against the original body over random chunkings,
 * fed in random pieces with the caller's compaction between calls.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "server/http_parse.h"

/* A copy of s whose last byte is the last byte before a guard page. */
static char *guarded(const char *s, size_t n, void **map, size_t *map_len)
{
    size_t pg = (size_t)sysconf(_SC_PAGESIZE);
    size_t pages = (n + pg - 1) / pg + 1;
    char *m = mmap(NULL, pages * pg, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    cr_assert(m != MAP_FAILED);
    cr_assert(mprotect(m + (pages - 1) * pg, pg, PROT_NONE) == 0);
    char *p = m + (pages - 1) * pg - n;
    memcpy(p, s, n);
    *map = m;
    *map_len = pages * pg;
    return p;
}

static int parse_all_prefixes(const char *s, size_t n, struct http_head *h, const char **why)
{
    int rc = 0;
    for (size_t k = 0; k <= n; k++) {
        void *m;
        size_t ml;
        char *p = guarded(s, k, &m, &ml);
        rc = http_parse_head(p, k, 32768, h, why);
        munmap(m, ml);
        if (k < n && rc != 0) return rc; /* an error before the end: fine for bad heads, checked by callers */
    }
    return rc;
}

Test(http_parse, good_head_every_prefix)
{
    const char *s =
        "\r\nPOST /v1/completions?x=1 HTTP/1.1\r\nHost: localhost:8080\r\nContent-Type:  application/json "
        "\r\nX-Empty:\r\nContent-Length: 12\r\n\r\n{\"prompt\":1}";
    size_t head = strstr(s, "\r\n\r\n") + 4 - s;
    struct http_head h;
    const char *why;
    for (size_t k = 0; k < head; k++) {
        void *m;
        size_t ml;
        char *p = guarded(s, k, &m, &ml);
        cr_assert_eq(http_parse_head(p, k, 32768, &h, &why), 0, "prefix %zu", k);
        munmap(m, ml);
    }
    cr_assert_eq(http_parse_head(s, strlen(s), 32768, &h, &why), (int)head);
    cr_assert_eq(h.minor, 1);
    cr_assert(h.method_len == 4 && !memcmp(h.method, "POST", 4));
    cr_assert(h.target_len == 19 && !memcmp(h.target, "/v1/completions?x=1", 19));
    cr_assert_eq(h.n_fields, 4);
    size_t len;
    int count;
    const char *v = http_head_field(&h, "content-type", &len, &count);
    cr_assert(v && len == 16 && !memcmp(v, "application/json", 16) && count == 1);
    v = http_head_field(&h, "X-EMPTY", &len, &count);
    cr_assert(v && len == 0);
    cr_assert_null(http_head_field(&h, "nope", NULL, &count));
    cr_assert_eq(count, 0);
    struct http_framing f;
    cr_assert_eq(http_head_framing(&h, &f, &why), 0);
    cr_assert(f.content_length == 12 && !f.chunked && f.keep_alive && !f.expect_continue);
}

Test(http_parse, bad_heads)
{
    static const struct {
        const char *head;
        int status;
    } cases[] = {
        {"GET / HTTP/1.1\nHost: x\r\n\r\n", -400},
        {"GET / HTTP/1.1\r\nHost : x\r\n\r\n", -400},
        {"GET / HTTP/1.1\r\n Host: x\r\n\r\n", -400},
        {"GET / HTTP/1.1\r\nHost: x\r\n folded\r\n\r\n", -400},
        {"GET / HTTP/1.1\r\nHost: a\rb\r\n\r\n", -400},
        {"GET / HTTP/1.1\r\nHost: a\nb\r\n\r\n", -400},
        {"GET / HTTP/3.0\r\n\r\n", -505},
        {"GET / HTTP/1.x\r\n\r\n", -400},
        {"GET / http/1.1\r\n\r\n", -400},
        {"GET /\x7f HTTP/1.1\r\n\r\n", -400},
        {" GET / HTTP/1.1\r\n\r\n", -400},
        {"GET / HTTP/1.1\r\n\r\r\n", -400},
        {"GET / HTTP/1.1\r\n:x\r\n\r\n", -400},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct http_head h;
        const char *why = NULL;
        int rc = parse_all_prefixes(cases[i].head, strlen(cases[i].head), &h, &why);
        cr_assert_eq(rc, cases[i].status, "case %zu: %d", i, rc);
        cr_assert(why && why[0]);
    }
}

Test(http_parse, limits)
{
    struct http_head h;
    const char *why;
    char *big = malloc(40000);
    memset(big, 'a', 40000);
    memcpy(big, "GET /", 5);
    cr_assert_eq(http_parse_head(big, 40000, 32768, &h, &why), -414); /* request line without an end */
    memcpy(big, "GET / HTTP/1.1\r\nX: ", 19);
    cr_assert_eq(http_parse_head(big, 40000, 32768, &h, &why), -431);
    cr_assert_eq(http_parse_head(big, 20000, 32768, &h, &why), 0); /* still room: wait */
    size_t o = (size_t)sprintf(big, "GET / HTTP/1.1\r\n");
    for (int i = 0; i < HTTP_MAX_FIELDS + 1; i++) o += (size_t)sprintf(big + o, "X-%d: v\r\n", i);
    o += (size_t)sprintf(big + o, "\r\n");
    cr_assert_eq(http_parse_head(big, o, 32768, &h, &why), -431);
    free(big);
}

static int framing_of(const char *head, struct http_framing *f)
{
    struct http_head h;
    const char *why;
    int n = http_parse_head(head, strlen(head), 32768, &h, &why);
    cr_assert_gt(n, 0, "%s", head);
    return http_head_framing(&h, f, &why);
}

Test(http_parse, framing)
{
    struct http_framing f;
    cr_assert_eq(
        framing_of("POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\n", &f), -400);
    cr_assert_eq(
        framing_of("POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n",
                   &f),
        -400);
    cr_assert_eq(framing_of("POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip, chunked\r\n\r\n", &f),
                 -501);
    cr_assert_eq(framing_of("POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: Chunked\r\n\r\n", &f), 0);
    cr_assert(f.chunked && f.content_length == -1);
    cr_assert_eq(framing_of("POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n", &f), -400);
    cr_assert_eq(framing_of("POST / HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n", &f), -400);
    cr_assert_eq(framing_of("POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 1234567890123456789\r\n\r\n", &f),
                 -400);
    cr_assert_eq(framing_of("POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 123456789012345678\r\n\r\n", &f),
                 0);
    cr_assert_eq(f.content_length, 123456789012345678LL);
    cr_assert_eq(framing_of("GET / HTTP/1.1\r\n\r\n", &f), -400);
    cr_assert_eq(framing_of("GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", &f), -400);
    cr_assert_eq(framing_of("GET / HTTP/1.0\r\n\r\n", &f), 0);
    cr_assert(!f.keep_alive);
    cr_assert_eq(framing_of("GET / HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\n", &f), 0);
    cr_assert(f.keep_alive);
    cr_assert_eq(framing_of("GET / HTTP/1.1\r\nHost: x\r\nConnection: foo, close\r\n\r\n", &f), 0);
    cr_assert(!f.keep_alive);
    cr_assert_eq(framing_of("GET / HTTP/1.1\r\nHost: x\r\nExpect: 100-Continue\r\n\r\n", &f), 0);
    cr_assert(f.expect_continue);
    cr_assert_eq(framing_of("GET / HTTP/1.1\r\nHost: x\r\nExpect: 200-ok\r\n\r\n", &f), -417);
}

/* Encodes body in chunks of random sizes with random extensions and a trailer; returns the length. */
static size_t chunk_encode(const char *body, size_t n, char *out, unsigned *seed)
{
    size_t o = 0, i = 0;
    while (i < n) {
        size_t k = 1 + (size_t)rand_r(seed) % 300;
        if (k > n - i) k = n - i;
        o += (size_t)sprintf(out + o, rand_r(seed) % 2 ? "%zx" : "%zX", k);
        if (rand_r(seed) % 4 == 0) o += (size_t)sprintf(out + o, ";ext=\"v\"");
        o += (size_t)sprintf(out + o, "\r\n");
        memcpy(out + o, body + i, k);
        o += k;
        i += k;
        o += (size_t)sprintf(out + o, "\r\n");
    }
    o += (size_t)sprintf(out + o, "0\r\n%s\r\n", rand_r(seed) % 2 ? "X-Trailer: t\r\n" : "");
    return o;
}

Test(http_parse, chunked_random)
{
    unsigned seed = 12345;
    char *body = malloc(5000), *enc = malloc(20000), *buf = malloc(20000 + 16);
    for (int iter = 0; iter < 300; iter++) {
        size_t n = (size_t)rand_r(&seed) % 5000;
        for (size_t i = 0; i < n; i++) body[i] = (char)rand_r(&seed);
        size_t en = chunk_encode(body, n, enc, &seed);
        memcpy(enc + en, "NEXT", 4); /* the next pipelined request must be left alone */
        /* fed in random pieces, compacting between calls as the connection does */
        struct http_chunked c = {0};
        size_t fed = 0, len = 0;
        int rc = 0;
        const char *why;
        while (rc == 0) {
            cr_assert_lt(fed, en + 4);
            size_t k = 1 + (size_t)rand_r(&seed) % 64;
            if (k > en + 4 - fed) k = en + 4 - fed;
            memcpy(buf + len, enc + fed, k);
            fed += k, len += k;
            rc = http_chunked_decode(&c, buf, len, 1 << 20, &why);
            cr_assert_geq(rc, 0, "%s", why);
            size_t gap = c.in - c.out;
            memmove(buf + c.out, buf + c.in, len - c.in);
            len -= gap;
            c.in = c.out;
        }
        cr_assert_eq(c.out, n);
        cr_assert(!memcmp(buf, body, n));
        cr_assert_eq(fed - (len - c.out), en, "consumed exactly the chunked body");
        /* and in one piece with a limit just below the size */
        if (n) {
            memcpy(buf, enc, en);
            struct http_chunked d = {0};
            cr_assert_eq(http_chunked_decode(&d, buf, en, n - 1, &why), -413);
        }
    }
    free(body);
    free(enc);
    free(buf);
}

Test(http_parse, chunked_malformed)
{
    static const char *bad[] = {"x\r\n",
                                "\r\n",
                                "5\r\nabcdeX\r\n",
                                "5\nabcde\r\n",
                                "1;\x01\x00\r\n",
                                "10000000000000000\r\n",
                                "0\r\nbad trailer\r\n\r\n",
                                "0\r\n\r\r",
                                "5 \r\nabcde\r\n"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char buf[64];
        size_t n = strlen(bad[i]);
        if (i == 4) n = 6; /* with its NUL */
        memcpy(buf, bad[i], n);
        struct http_chunked c = {0};
        const char *why;
        cr_assert_eq(http_chunked_decode(&c, buf, n, 1 << 20, &why), -400, "case %zu", i);
    }
}

Test(http_parse, target_path)
{
    char out[64];
    cr_assert_eq(http_target_path("/v1/models/a%20b?x=%41", 22, out, sizeof out), 14);
    cr_assert_str_eq(out, "/v1/models/a b");
    cr_assert_eq(http_target_path("http://host:1/health?q", 22, out, sizeof out), 7);
    cr_assert_str_eq(out, "/health");
    cr_assert_eq(http_target_path("https://host", 12, out, sizeof out), 1);
    cr_assert_str_eq(out, "/");
    cr_assert_eq(http_target_path("/a%00b", 6, out, sizeof out), -1);
    cr_assert_eq(http_target_path("/a%zzb%4", 8, out, sizeof out), 8);
    cr_assert_str_eq(out, "/a%zzb%4");
    cr_assert_eq(http_target_path("nope", 4, out, sizeof out), -1);
    cr_assert_eq(http_target_path("*", 1, out, sizeof out), 1);
    char big[200];
    memset(big, 'a', sizeof big);
    big[0] = '/';
    cr_assert_eq(http_target_path(big, sizeof big, out, sizeof out), -1);
}
