/* http_parse — the HTTP/1.1 request head parser and chunked-body decoder; they never allocate.
 *
 * http_parse_head() reads a request head (request line, header fields, the empty line) from a byte buffer and
 * returns views into it: nothing is copied, and the views stay valid while the buffer is unchanged. It is
 * strict wherever leniency has let one request be read two ways by two servers (request smuggling, RFC 9112
 * §11.2): every line ends in CRLF, no whitespace before a colon, no obsolete line folding, no control bytes.
 * http_head_framing() then decides how the body is delimited and refuses the ambiguous cases: two
 * Content-Lengths, Content-Length with Transfer-Encoding, a transfer coding other than chunked.
 * http_chunked_decode() decodes a chunked body in place, a piece at a time as it arrives.
 * Errors are negative HTTP statuses (-400, -413, -414, -417, -431, -501, -505) with a sentence for the
 * client.
 */
#ifndef FERRY_SERVER_HTTP_PARSE_H
#define FERRY_SERVER_HTTP_PARSE_H

#include <stddef.h>
#include <stdint.h>

#define HTTP_MAX_FIELDS       64   /* header fields in one head */
#define HTTP_MAX_REQUEST_LINE 8192 /* bytes, CRLF included: longer is 414 */

struct http_field {
    const char *name, *value; /* views into the parsed buffer; value without surrounding whitespace */
    size_t name_len, value_len;
};

struct http_head {
    const char *method, *target; /* views into the parsed buffer */
    size_t method_len, target_len;
    int minor; /* HTTP/1.<minor>: 0 or 1 */
    struct http_field fields[HTTP_MAX_FIELDS];
    int n_fields;
};

/* Parses the head at the start of buf[0, len). Returns its length in bytes (through the empty line) when it
 * is complete, 0 when more bytes are needed (and len < max_len), or a negative HTTP status: -400 malformed,
 * -414 request line too long, -431 head longer than max_len or more than HTTP_MAX_FIELDS fields, -505 a
 * version other than HTTP/1.0 and HTTP/1.1. *why names the problem (a static string). */
int http_parse_head(const char *buf, size_t len, size_t max_len, struct http_head *h, const char **why);

/* The first field named `name` (case-insensitive): its value, with *len; NULL when absent. *count, when not
 * NULL, gets the number of fields with that name. */
const char *http_head_field(const struct http_head *h, const char *name, size_t *len, int *count);

struct http_framing {
    int64_t content_length; /* bytes; -1 when the request has no Content-Length */
    int chunked;            /* Transfer-Encoding: chunked */
    int keep_alive;         /* the connection may carry another request after this one */
    int expect_continue;    /* Expect: 100-continue */
};

/* How the body of a parsed head is delimited, and whether the connection persists. Returns 0 or a negative
 * HTTP status with *why: -400 for two Content-Length fields (even equal ones), Content-Length with
 * Transfer-Encoding, a malformed Content-Length, Transfer-Encoding in HTTP/1.0, a missing or repeated Host in
 * HTTP/1.1; -501 for a transfer coding other than chunked; -417 for an Expect other than 100-continue. */
int http_head_framing(const struct http_head *h, struct http_framing *f, const char **why);

/* Incremental chunked-body decoder. Zero it before the body's first byte. */
struct http_chunked {
    size_t in;     /* bytes of the raw body consumed */
    size_t out;    /* bytes of decoded body, written over the start of the raw body */
    uint64_t left; /* bytes of the current chunk's data still to come */
    int state;
    unsigned n; /* digits of the size line, or bytes of an extension or trailer line, so far */
    size_t trailer_bytes;
};

/* buf[0, len) is the body as received so far, its first c->out bytes already decoded: decodes what follows
 * c->in, writing the data over buf[c->out, ...) (never past c->in). Returns 1 when the last chunk and the
 * trailer section have been read (the request's bytes end at c->in), 0 when more bytes are needed, -400 when
 * malformed, -413 when the decoded body would exceed `limit` bytes. The caller may move buf[c->in, len) down
 * to c->out and set c->in = c->out between calls, to reclaim the space. */
int http_chunked_decode(struct http_chunked *c, char *buf, size_t len, uint64_t limit, const char **why);

/* Percent-decodes a request target's path (up to '?' or its end) into out (cap bytes, NUL-terminated); an
 * absolute-form target ("http://host/path") gives its path. Returns the length, or -1 when the path does not
 * start with '/', decodes to a NUL byte, or does not fit. */
int http_target_path(const char *target, size_t len, char *out, size_t cap);

#endif
