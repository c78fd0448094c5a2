/* http_check — the framing and expectation checks libmicrohttpd leaves to the application: which heads
 * ferry refuses although MHD parsed them.
 *
 * A proxy in front may frame an ambiguous request differently from MHD (request smuggling), so a head with a
 * malformed field name, a CR, LF or NUL in a value, two Content-Lengths, Content-Length with
 * Transfer-Encoding, a transfer coding other than one chunked, no or two Hosts (HTTP/1.1), or an unmet
 * expectation is refused; so is a declared body over the limit. Pure: reads the head's fields, changes
 * nothing. Usage: in the access handler, once the head is in: st = http_check_head(mc, method, http10, limit,
 * &why) (method: the access handler's own argument, which points at the start of the head in MHD's buffer).
 */
#ifndef FERRY_SERVER_HTTP_CHECK_H
#define FERRY_SERVER_HTTP_CHECK_H

#include <microhttpd.h>
#include <stdint.h>

/* Returns 0 when the head may go on, else the HTTP status to refuse it with (400, 413, 417 or 501) and *why,
 * a constant sentence for the error body (no quotes or backslashes). */
int http_check_head(struct MHD_Connection *mc, const char *method, int http10, int64_t body_limit,
                    const char **why);

/* The declared size of the chunk whose data starts at `data` in MHD's buffer, read from its chunk line just
 * before it (hex digits, then ';' extensions or white space, then LF or CR LF), looking back no further than
 * `lo` (the end of the head, in the same buffer) nor past CHUNK_LINE_MAX bytes. Returns 1 with *size
 * (saturated at UINT64_MAX), or 0 when no such line lies there (the caller stops shadowing). */
#define CHUNK_LINE_MAX 96
int http_check_chunk_line(const char *data, const char *lo, uint64_t *size);

#endif
