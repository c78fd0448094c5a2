/* http_parse — request heads (RFC 9112 §2-5), body framing (§6) and chunked bodies (§7.1), read strictly.
 *
 *   request-line = method SP request-target SP "HTTP/1." DIGIT CRLF
 *   field-line   = field-name ":" OWS field-value OWS CRLF      (no whitespace before the colon)
 *   head         = request-line *field-line CRLF
 *   chunked-body = *( chunk-size [ ";" ext ] CRLF data CRLF ) "0" [ ";" ext ] CRLF *( trailer CRLF ) CRLF
 *
 * Bytes are classified by two tables below (token characters, field-value characters). Nothing here allocates
 * or keeps state between calls except the chunked decoder's struct.
 */
#include "server/http_parse.h"

#include <string.h>
#include <strings.h>

/* tchar = "!" / "#" / "$" / "%" / "&" / "'" / "*" / "+" / "-" / "." / "^" / "_" / "`" / "|" / "~" / DIGIT /
 * ALPHA */
static int is_tchar(unsigned char c)
{
    if ((c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) return 1;
    return c && strchr("!#$%&'*+-.^_`|~", c) != NULL;
}

/* A byte a field value may hold: anything but NUL, CR and LF, which RFC 9110 §5.5 says to refuse (the other
 * control bytes are invalid too, but may be kept; the application treats values as untrusted text anyway) */
static int is_value_char(unsigned char c)
{
    return c != 0 && c != '\r' && c != '\n';
}

#define FAIL(code, msg)                                                                                      \
    do {                                                                                                     \
        *why = (msg);                                                                                        \
        return -(code);                                                                                      \
    } while (0)

int http_parse_head(const char *buf, size_t len, size_t max_len, struct http_head *h, const char **why)
{
    const unsigned char *p = (const unsigned char *)buf;
    size_t n = len < max_len ? len : max_len, i = 0, line0 = 0;
    *why = "";
    h->n_fields = 0;
    /* a server should ignore empty lines before the request line (RFC 9112 §2.2): some clients send a CRLF
     * after a POST body */
    while (i + 1 < n && p[i] == '\r' && p[i + 1] == '\n') i += 2;
    line0 = i;
    if (i + 1 == n && p[i] == '\r') goto more;

    /* request line */
    size_t m0 = i;
    while (i < n && is_tchar(p[i])) i++;
    if (i == n) goto more;
    if (i == m0 || p[i] != ' ') FAIL(400, "malformed request line (method)");
    h->method = buf + m0, h->method_len = i - m0;
    size_t t0 = ++i;
    while (i < n && p[i] > 0x20 && p[i] < 0x7f) i++;
    if (i == n) goto more;
    if (i == t0 || p[i] != ' ') FAIL(400, "malformed request line (target)");
    h->target = buf + t0, h->target_len = i - t0;
    i++;
    if (n - i < 10) goto more; /* "HTTP/x.y\r\n" */
    if (memcmp(p + i, "HTTP/", 5) || p[i + 5] < '0' || p[i + 5] > '9' || p[i + 6] != '.' || p[i + 7] < '0' ||
        p[i + 7] > '9' || p[i + 8] != '\r' || p[i + 9] != '\n')
        FAIL(400, "malformed request line (version)");
    if (p[i + 5] != '1') FAIL(505, "only HTTP/1.0 and HTTP/1.1 are served");
    h->minor = p[i + 7] == '0' ? 0 : 1; /* 1.2 and later minors read as 1.1 (RFC 9110 §2.5) */
    i += 10;
    if (i - line0 > HTTP_MAX_REQUEST_LINE) FAIL(414, "the request line is too long");

    /* fields */
    for (;;) {
        if (n - i < 2) goto more;
        if (p[i] == '\r') {
            if (p[i + 1] != '\n') FAIL(400, "malformed head (CR without LF)");
            return (int)(i + 2);
        }
        if (p[i] == ' ' || p[i] == '\t') FAIL(400, "obsolete line folding in the head");
        size_t f0 = i;
        while (i < n && is_tchar(p[i])) i++;
        if (i == n) goto more;
        if (i == f0 || p[i] != ':') FAIL(400, "malformed header field name");
        if (h->n_fields == HTTP_MAX_FIELDS) FAIL(431, "too many header fields");
        struct http_field *f = &h->fields[h->n_fields];
        f->name = buf + f0, f->name_len = i - f0;
        i++;
        while (i < n && (p[i] == ' ' || p[i] == '\t')) i++;
        size_t v0 = i;
        while (i < n && is_value_char(p[i])) i++;
        if (i == n) goto more;
        if (p[i] != '\r') FAIL(400, "a NUL or bare LF in a header field value");
        if (i + 1 == n) goto more;
        if (p[i + 1] != '\n') FAIL(400, "malformed head (CR without LF)");
        size_t v1 = i;
        while (v1 > v0 && (p[v1 - 1] == ' ' || p[v1 - 1] == '\t')) v1--;
        f->value = buf + v0, f->value_len = v1 - v0;
        h->n_fields++;
        i += 2;
    }
more:
    if (h->n_fields == 0 && n - line0 >= HTTP_MAX_REQUEST_LINE && !memchr(p + line0, '\n', n - line0))
        FAIL(414, "the request line is too long");
    if (len >= max_len) FAIL(431, "the request head is too large");
    return 0;
}

const char *http_head_field(const struct http_head *h, const char *name, size_t *len, int *count)
{
    size_t nl = strlen(name);
    const char *v = NULL;
    int c = 0;
    for (int i = 0; i < h->n_fields; i++) {
        const struct http_field *f = &h->fields[i];
        if (f->name_len == nl && !strncasecmp(f->name, name, nl)) {
            if (!v) {
                v = f->value;
                if (len) *len = f->value_len;
            }
            c++;
        }
    }
    if (count) *count = c;
    return v;
}

/* 1 when the comma-separated list (case-insensitive) holds `tok`. */
static int list_has(const char *v, size_t len, const char *tok)
{
    size_t tl = strlen(tok), i = 0;
    while (i < len) {
        while (i < len && (v[i] == ' ' || v[i] == '\t' || v[i] == ',')) i++;
        size_t s = i;
        while (i < len && v[i] != ',') i++;
        size_t e = i;
        while (e > s && (v[e - 1] == ' ' || v[e - 1] == '\t')) e--;
        if (e - s == tl && !strncasecmp(v + s, tok, tl)) return 1;
    }
    return 0;
}

int http_head_framing(const struct http_head *h, struct http_framing *f, const char **why)
{
    *why = "";
    memset(f, 0, sizeof *f);
    f->content_length = -1;
    size_t len;
    int count;
    const char *v = http_head_field(h, "host", &len, &count);
    if ((h->minor == 1 && count != 1) || count > 1)
        FAIL(400,
             count ? "more than one Host header field" : "an HTTP/1.1 request needs a Host header field");
    v = http_head_field(h, "content-length", &len, &count);
    if (count > 1) FAIL(400, "more than one Content-Length header field");
    if (v) {
        if (len == 0 || len > 18) FAIL(400, "malformed Content-Length");
        int64_t x = 0;
        for (size_t i = 0; i < len; i++) {
            if (v[i] < '0' || v[i] > '9') FAIL(400, "malformed Content-Length");
            x = x * 10 + (v[i] - '0');
        }
        f->content_length = x;
    }
    v = http_head_field(h, "transfer-encoding", &len, &count);
    if (v) {
        if (h->minor == 0) FAIL(400, "Transfer-Encoding in an HTTP/1.0 request");
        if (f->content_length >= 0) FAIL(400, "both Content-Length and Transfer-Encoding");
        if (count > 1 || len != 7 || strncasecmp(v, "chunked", 7))
            FAIL(501, "the only transfer coding served is chunked");
        f->chunked = 1;
    }
    int close = 0, keep = 0; /* every Connection field counts */
    for (int i = 0; i < h->n_fields; i++) {
        const struct http_field *c = &h->fields[i];
        if (c->name_len != 10 || strncasecmp(c->name, "connection", 10)) continue;
        close |= list_has(c->value, c->value_len, "close");
        keep |= list_has(c->value, c->value_len, "keep-alive");
    }
    f->keep_alive = !close && (h->minor == 1 || keep);
    v = http_head_field(h, "expect", &len, &count);
    if (v) {
        if (count > 1 || len != 12 || strncasecmp(v, "100-continue", 12))
            FAIL(417, "the only expectation served is 100-continue");
        f->expect_continue = h->minor == 1;
    }
    return 0;
}

enum {
    CH_SIZE = 0, /* hex digits of a chunk size */
    CH_EXT,      /* after ';' up to CR */
    CH_SIZE_LF,
    CH_DATA,
    CH_DATA_CR,
    CH_DATA_LF,
    CH_TRAILER, /* at the start of a trailer line, or of the final CRLF */
    CH_TRAILER_NAME,
    CH_TRAILER_LINE,
    CH_TRAILER_LF,
    CH_FINAL_LF,
    CH_DONE,
};

#define CHUNK_EXT_MAX     1024 /* bytes of extensions on one size line */
#define CHUNK_TRAILER_MAX 8192 /* bytes of the whole trailer section */

int http_chunked_decode(struct http_chunked *c, char *buf, size_t len, uint64_t limit, const char **why)
{
    *why = "";
    while (c->in < len) {
        unsigned char b = (unsigned char)buf[c->in];
        switch (c->state) {
        case CH_SIZE: {
            int d = b >= '0' && b <= '9'   ? b - '0'
                    : b >= 'a' && b <= 'f' ? b - 'a' + 10
                    : b >= 'A' && b <= 'F' ? b - 'A' + 10
                                           : -1;
            if (d >= 0) {
                if (++c->n > 15) FAIL(400, "chunk size too long");
                c->left = c->left * 16 + (uint64_t)d;
            } else if (c->n && b == ';') {
                c->state = CH_EXT, c->n = 0;
            } else if (c->n && b == '\r') {
                c->state = CH_SIZE_LF;
            } else {
                FAIL(400, "malformed chunk size");
            }
            c->in++;
            break;
        }
        case CH_EXT:
            if (b == '\r')
                c->state = CH_SIZE_LF;
            else if (!is_value_char(b) || ++c->n > CHUNK_EXT_MAX)
                FAIL(400, "malformed chunk extension");
            c->in++;
            break;
        case CH_SIZE_LF:
            if (b != '\n') FAIL(400, "malformed chunk size line");
            c->in++;
            if (c->left == 0) {
                c->state = CH_TRAILER;
            } else {
                if (c->left > limit - c->out) FAIL(413, "the request body is larger than the limit");
                c->state = CH_DATA;
            }
            break;
        case CH_DATA: {
            size_t take = len - c->in;
            if (take > c->left) take = (size_t)c->left;
            memmove(buf + c->out, buf + c->in, take);
            c->out += take, c->in += take, c->left -= take;
            if (c->left == 0) c->state = CH_DATA_CR;
            break;
        }
        case CH_DATA_CR:
            if (b != '\r') FAIL(400, "chunk data longer than its size");
            c->state = CH_DATA_LF, c->in++;
            break;
        case CH_DATA_LF:
            if (b != '\n') FAIL(400, "malformed chunk end");
            c->state = CH_SIZE, c->n = 0, c->left = 0, c->in++;
            break;
        case CH_TRAILER:
            if (b == '\r')
                c->state = CH_FINAL_LF;
            else if (is_tchar(b))
                c->state = CH_TRAILER_NAME;
            else
                FAIL(400, "malformed trailer field");
            c->in++;
            if (++c->trailer_bytes > CHUNK_TRAILER_MAX) FAIL(400, "trailer section too large");
            break;
        case CH_TRAILER_NAME:
            if (b == ':')
                c->state = CH_TRAILER_LINE;
            else if (!is_tchar(b))
                FAIL(400, "malformed trailer field");
            c->in++;
            if (++c->trailer_bytes > CHUNK_TRAILER_MAX) FAIL(400, "trailer section too large");
            break;
        case CH_TRAILER_LINE:
            if (b == '\r')
                c->state = CH_TRAILER_LF;
            else if (!is_value_char(b))
                FAIL(400, "a NUL or bare LF in a trailer field");
            c->in++;
            if (++c->trailer_bytes > CHUNK_TRAILER_MAX) FAIL(400, "trailer section too large");
            break;
        case CH_TRAILER_LF:
            if (b != '\n') FAIL(400, "malformed trailer line");
            c->state = CH_TRAILER, c->in++;
            break;
        case CH_FINAL_LF:
            if (b != '\n') FAIL(400, "malformed end of a chunked body");
            c->state = CH_DONE, c->in++;
            return 1;
        default:
            return 1;
        }
    }
    return c->state == CH_DONE;
}

static int hexval(unsigned char c)
{
    return c >= '0' && c <= '9'   ? c - '0'
           : c >= 'a' && c <= 'f' ? c - 'a' + 10
           : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                  : -1;
}

int http_target_path(const char *target, size_t len, char *out, size_t cap)
{
    size_t i = 0;
    if (len >= 7 &&
        (!strncasecmp(target, "http://", 7) || (len >= 8 && !strncasecmp(target, "https://", 8)))) {
        i = target[4] == ':' ? 7 : 8; /* absolute form: skip the scheme and the authority */
        while (i < len && target[i] != '/' && target[i] != '?') i++;
        if (i == len || target[i] == '?') {
            if (cap < 2) return -1;
            out[0] = '/', out[1] = 0;
            return 1;
        }
    }
    if (len == 1 && target[0] == '*') { /* OPTIONS * */
        if (cap < 2) return -1;
        out[0] = '*', out[1] = 0;
        return 1;
    }
    if (i >= len || target[i] != '/') return -1;
    size_t o = 0;
    for (; i < len && target[i] != '?'; i++) {
        unsigned char c = (unsigned char)target[i];
        int hi, lo;
        if (c == '%' && i + 2 < len && (hi = hexval((unsigned char)target[i + 1])) >= 0 &&
            (lo = hexval((unsigned char)target[i + 2])) >= 0) {
            c = (unsigned char)(hi * 16 + lo);
            if (c == 0) return -1;
            i += 2;
        }
        if (o + 1 >= cap) return -1;
        out[o++] = (char)c;
    }
    out[o] = 0;
    return (int)o;
}
