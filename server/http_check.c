/* http_check — the framing checks on a head MHD has parsed (the contract is in server/http_check.h). */
#include "server/http_check.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

struct field_counts {
    int content_length, transfer_encoding, host;
    int bad_name, bad_value;
};

/* RFC 9110 token characters (a field name) */
static int is_tchar(unsigned char ch)
{
    return (ch >= '0' && ch <= '9') || (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') ||
           (ch && strchr("!#$%&'*+-.^_`|~", ch));
}

static enum MHD_Result count_field(void *cls, enum MHD_ValueKind kind, const char *key, const char *value)
{
    struct field_counts *n = cls;
    (void)kind;
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

static int fail(const char **why, int status, const char *msg)
{
    *why = msg;
    return status;
}

int http_check_head(struct MHD_Connection *mc, int http10, int64_t body_limit, const char **why)
{
    struct field_counts n = {0};
    MHD_get_connection_values(mc, MHD_HEADER_KIND, count_field, &n);
    const char *te = MHD_lookup_connection_value(mc, MHD_HEADER_KIND, MHD_HTTP_HEADER_TRANSFER_ENCODING);
    const char *cl = MHD_lookup_connection_value(mc, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
    const char *ex = MHD_lookup_connection_value(mc, MHD_HEADER_KIND, MHD_HTTP_HEADER_EXPECT);
    /* request smuggling: a proxy in front may frame such a request differently */
    if (n.bad_name) return fail(why, 400, "a malformed header field name");
    if (n.bad_value) return fail(why, 400, "a CR or LF in a header field value");
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
