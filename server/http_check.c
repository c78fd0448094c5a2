/* http_check — the framing checks on a head MHD has parsed (the contract is in server/http_check.h). */
#include "server/http_check.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#define FIELDS_SEEN 128 /* fields whose bytes are checked for a NUL (a head with more is not checked) */

struct field_counts {
    int content_length, transfer_encoding, host;
    int bad_name, bad_value, nul_value;
    int n_fields;
    const char *key[FIELDS_SEEN], *end[FIELDS_SEEN]; /* each field's name and the end of its value */
};

/* RFC 9110 token characters (a field name) */
static int is_tchar(unsigned char ch)
{
    return (ch >= '0' && ch <= '9') || (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') ||
           (ch && strchr("!#$%&'*+-.^_`|~", ch));
}

static enum MHD_Result count_field(void *cls, enum MHD_ValueKind kind, const char *key, size_t key_size,
                                   const char *value, size_t value_size)
{
    struct field_counts *n = cls;
    (void)kind;
    /* a NUL inside a name or value: every C-string lookup would read the field cut at it ("Bearer KEY\0junk"
     * taken as "Bearer KEY"), so the head is refused instead */
    if (strlen(key) != key_size) n->bad_name++;
    if (value && strlen(value) != value_size) n->nul_value++;
    if (n->n_fields < FIELDS_SEEN) {
        n->key[n->n_fields] = key;
        n->end[n->n_fields] = value ? value + value_size : key + key_size;
    }
    n->n_fields++;
    /* MHD keeps "Name : v" as a field "Name " and lets a lone CR through in a value: a proxy in front may
     * read those differently (request smuggling) */
    if (!*key) n->bad_name++;
    for (const unsigned char *p = (const unsigned char *)key; *p; p++)
        if (!is_tchar(*p)) n->bad_name++;
    for (const unsigned char *p = (const unsigned char *)(value ? value : ""); *p; p++)
        if (*p == '\r' || *p == '\n') n->bad_value++;
    if (!strcasecmp(key, MHD_HTTP_HEADER_CONTENT_LENGTH)) n->content_length++;
    if (!strcasecmp(key, MHD_HTTP_HEADER_TRANSFER_ENCODING)) n->transfer_encoding++;
    if (!strcasecmp(key, MHD_HTTP_HEADER_HOST)) n->host++;
    return MHD_YES;
}

/* libmicrohttpd (0.9.x) parses the head in place in its read buffer and measures each value with strlen, so
 * a NUL sent inside a value cuts it there unseen ("Bearer KEY\0junk" reads as "Bearer KEY"). What the client
 * sent is still in the buffer: between the end of a value and the next field's name (or the end of the head)
 * there may only be the line's end, which MHD overwrote with NULs. Anything more there was cut off by a NUL.
 * Two forms cannot be told apart from MHD's own: a NUL right before a bare-LF line end (it cuts nothing), and
 * in the last field only, two NULs before more bytes (MHD's end of the head at a line ":x").
 * Checked only where the fields lie in order inside the head (else nothing is refused). */
static int nul_in_values(const struct field_counts *n, const char *head, size_t head_size)
{
    if (!head || !head_size || n->n_fields == 0 || n->n_fields > FIELDS_SEEN) return 0;
    const char *stop = head + head_size;
    for (int i = 0; i < n->n_fields; i++) {
        const char *from = n->end[i], *to = i + 1 < n->n_fields ? n->key[i + 1] : stop;
        if (n->key[i] < head || from < n->key[i] || to < from || to > stop) return 0; /* not in place */
        /* a line's end (CR LF or LF) is one or two NULs, and nothing else lies between two fields. The last
         * field's is followed by the empty line's, or by a line starting with ':' where MHD ends the head
         * (its ':' a NUL too, so at least two NULs before it; what follows it is not a field). */
        const int last = i + 1 == n->n_fields;
        const char *p = from;
        while (p < to && !*p) p++;
        if (p - from > (last ? 4 : 2) || (p < to && (!last || p - from < 2))) return 1;
    }
    return 0;
}

static int fail(const char **why, int status, const char *msg)
{
    *why = msg;
    return status;
}

int http_check_head(struct MHD_Connection *mc, const char *method, int http10, int64_t body_limit,
                    const char **why)
{
    struct field_counts n = {0};
    MHD_get_connection_values_n(mc, MHD_HEADER_KIND, count_field, &n);
    const union MHD_ConnectionInfo *hi = MHD_get_connection_info(mc, MHD_CONNECTION_INFO_REQUEST_HEADER_SIZE);
    if (hi && nul_in_values(&n, method, hi->header_size)) n.nul_value++;
    const char *te = MHD_lookup_connection_value(mc, MHD_HEADER_KIND, MHD_HTTP_HEADER_TRANSFER_ENCODING);
    const char *cl = MHD_lookup_connection_value(mc, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
    const char *ex = MHD_lookup_connection_value(mc, MHD_HEADER_KIND, MHD_HTTP_HEADER_EXPECT);
    /* request smuggling: a proxy in front may frame such a request differently */
    if (n.bad_name) return fail(why, 400, "a malformed header field name");
    if (n.bad_value) return fail(why, 400, "a CR or LF in a header field value");
    if (n.nul_value) return fail(why, 400, "a NUL byte in a header field value");
    if (n.content_length > 1) return fail(why, 400, "more than one Content-Length");
    if (n.content_length && n.transfer_encoding)
        return fail(why, 400, "Content-Length together with Transfer-Encoding");
    if (n.transfer_encoding > 1 || (te && strcasecmp(te, "chunked")))
        return fail(why, 501, "the only transfer coding accepted is one chunked");
    if (n.host > 1) return fail(why, 400, "more than one Host");
    if (!n.host && !http10) return fail(why, 400, "an HTTP/1.1 request needs a Host");
    if (te && http10) return fail(why, 400, "Transfer-Encoding in an HTTP/1.0 request");
    if (ex && strcasecmp(ex, "100-continue"))
        return fail(why, 417, "the only expectation met is 100-continue");
    if (cl) {
        char *end;
        errno = 0;
        unsigned long long v = strtoull(cl, &end, 10);
        if (cl[0] < '0' || cl[0] > '9' || *end || errno) return fail(why, 400, "a malformed Content-Length");
        if (v > (unsigned long long)body_limit)
            return fail(why, 413, "the request body is larger than the limit (--body-limit)");
    }
    return 0;
}

int http_check_chunk_line(const char *data, const char *lo, uint64_t *size)
{
    if (!data || !lo || data <= lo || data - lo < 2) return 0;
    const char *end = data - 1; /* the LF */
    if (*end != '\n') return 0;
    if (end > lo && end[-1] == '\r') end--;
    const char *start = end;
    while (start > lo && start[-1] != '\n' && end - start < CHUNK_LINE_MAX) start--;
    if (start > lo && start[-1] != '\n') return 0; /* longer than we look back */
    uint64_t v = 0;
    int digits = 0;
    const char *p = start;
    for (; p < end; p++, digits++) {
        const char ch = *p;
        int d = ch >= '0' && ch <= '9'   ? ch - '0'
                : ch >= 'a' && ch <= 'f' ? ch - 'a' + 10
                : ch >= 'A' && ch <= 'F' ? ch - 'A' + 10
                                         : -1;
        if (d < 0) break;
        v = v > (UINT64_MAX >> 4) ? UINT64_MAX : (v << 4) | (uint64_t)d;
    }
    if (!digits || (p < end && *p != ';' && *p != ' ' && *p != '\t')) return 0;
    *size = v;
    return 1;
}
