/* http_door — the sockets ferry handles itself, before libmicrohttpd or instead of it: this layer's JSON
 * error bodies and the raw answers built from them, the count of open connections per client address, and the
 * graceful close of a refused connection (answer, shut down, drop the client's bytes until it closes).
 *
 * A refused connection never enters MHD: http_door_refuse_fd writes a canned answer and lingers at most
 * LINGER_SECONDS (HTTP_LINGER_MAX at once; past that it is closed), so the client reads the 503 rather than
 * a reset. An ip_entry lives while count > 0. Loop thread only; the server's layout is in server/http_impl.h.
 * Usage: accept -> http_door_peer_of, http_door_ip_find (count++), or http_door_refuse_fd; the connection's
 * close -> http_door_ip_release; the sweep -> http_door_linger_expire; close -> http_door_linger_close_all.
 */
#ifndef FERRY_SERVER_HTTP_DOOR_H
#define FERRY_SERVER_HTTP_DOOR_H

#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

struct http_server;

#define LINGER_SECONDS 2.0

/* ---- error bodies ---- */

/* The OpenAI-style error object for a protocol-level error, into out (cap bytes); msg is one of this layer's
 * constant sentences (no quotes or backslashes: written as is). Returns snprintf's count. */
int http_door_error_json(char *out, size_t cap, int status, const char *msg);
/* A whole answer (head and error body, Connection: close; Retry-After on 503) as bytes, for writing raw on a
 * socket that has sent nothing of the current request. Returns its length, 0 when it does not fit. */
size_t http_door_canned(char *out, size_t cap, int status, const char *msg);

/* ---- per-address counts ---- */

struct ip_entry {
    unsigned char key[16]; /* IPv6, or IPv4 mapped into it */
    int count;             /* open connections from this address; the entry is freed when it drops to 0 */
    struct ip_entry *next;
};

/* The entry for key; with create, a new one (count 0) when there is none. NULL: none, or out of memory. */
struct ip_entry *http_door_ip_find(struct http_server *s, const unsigned char k[16], int create);
/* One connection from e's address closed (e may be NULL). */
void http_door_ip_release(struct http_server *s, struct ip_entry *e);
void http_door_ips_free(struct http_server *s); /* every entry, at the server's free */
/* The client's address as a 16-byte key and as text; whether it is a loopback address. */
void http_door_peer_of(const struct sockaddr_storage *ss, unsigned char key[16], char *peer, size_t cap,
                       int *loopback);
/* Bytes the kernel has received on the socket since it was opened (0 when unknown). */
uint64_t http_door_rx_bytes(int fd);

/* ---- refused connections ---- */

/* Closes fd gracefully (taken over): shut down after what was written, the client's bytes dropped until it
 * closes or LINGER_SECONDS pass. */
void http_door_linger_fd(struct http_server *s, int fd);
/* Writes resp on a freshly accepted fd and closes it gracefully; the fd is taken over. */
void http_door_refuse_fd(struct http_server *s, int fd, const char *resp, size_t len);
void http_door_linger_expire(struct http_server *s, double now); /* closes those older than LINGER_SECONDS */
void http_door_linger_close_all(struct http_server *s);
#endif
