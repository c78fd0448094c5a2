/* http_door — the sockets ferry handles itself, before libmicrohttpd or instead of it (the contract is in
 * server/http_door.h): error bodies, per-address counts, and refused connections that linger.
 */
#include "server/http_door.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "server/http_impl.h"

/* ---- error bodies ---- */

static const struct {
    int status;
    const char *reason, *type, *code;
} statuses[] = {
    {400, "Bad Request", "invalid_request_error", "bad_request"},
    {408, "Request Timeout", "timeout_error", "request_timeout"},
    {413, "Content Too Large", "invalid_request_error", "request_too_large"},
    {417, "Expectation Failed", "invalid_request_error", "expectation_failed"},
    {500, "Internal Server Error", "server_error", "internal_error"},
    {501, "Not Implemented", "invalid_request_error", "not_implemented"},
    {503, "Service Unavailable", "server_overloaded", "too_many_connections"},
};

static int status_row(int status)
{
    for (size_t i = 0; i < sizeof statuses / sizeof statuses[0]; i++)
        if (statuses[i].status == status) return (int)i;
    return -1;
}

/* The OpenAI-style error object for a protocol-level error; msg is one of this layer's constant sentences
 * (no quotes or backslashes: written as is). */
int http_door_error_json(char *out, size_t cap, int status, const char *msg)
{
    int i = status_row(status);
    const char *type = i >= 0 ? statuses[i].type : "server_error";
    const char *code = i >= 0 ? statuses[i].code : "internal_error";
    return snprintf(out, cap,
                    "{\"error\":{\"message\":\"%s\",\"type\":\"%s\",\"param\":null,\"code\":\"%s\"}}", msg,
                    type, code);
}

/* A whole answer as bytes, for writing raw on a socket that has sent nothing of the current request. */
size_t http_door_canned(char *out, size_t cap, int status, const char *msg)
{
    char body[300];
    int bl = http_door_error_json(body, sizeof body, status, msg);
    int i = status_row(status);
    int n = snprintf(out, cap,
                     "HTTP/1.1 %d %s\r\nContent-Type: application/json\r\n%sConnection: close\r\n"
                     "Content-Length: %d\r\n\r\n%s",
                     status, i >= 0 ? statuses[i].reason : "Error", status == 503 ? "Retry-After: 1\r\n" : "",
                     bl, body);
    return n > 0 && (size_t)n < cap ? (size_t)n : 0;
}

/* ---- per-address counts ---- */

static unsigned ip_hash(const unsigned char k[16])
{
    unsigned h = 2166136261u;
    for (int i = 0; i < 16; i++) h = (h ^ k[i]) * 16777619u;
    return h % IP_BUCKETS;
}

struct ip_entry *http_door_ip_find(struct http_server *s, const unsigned char k[16], int create)
{
    struct ip_entry **b = &s->ips[ip_hash(k)];
    for (struct ip_entry *e = *b; e; e = e->next)
        if (!memcmp(e->key, k, 16)) return e;
    if (!create) return NULL;
    struct ip_entry *e = calloc(1, sizeof *e);
    if (!e) return NULL;
    memcpy(e->key, k, 16);
    e->next = *b;
    *b = e;
    return e;
}

void http_door_ip_release(struct http_server *s, struct ip_entry *e)
{
    if (!e || --e->count > 0) return;
    struct ip_entry **pp = &s->ips[ip_hash(e->key)];
    while (*pp != e) pp = &(*pp)->next;
    *pp = e->next;
    free(e);
}

void http_door_ips_free(struct http_server *s)
{
    for (int i = 0; i < IP_BUCKETS; i++)
        for (struct ip_entry *e = s->ips[i], *n; e; e = n) {
            n = e->next;
            free(e);
        }
}

/* The client's address as a 16-byte key and as text; whether it is a loopback address. */
void http_door_peer_of(const struct sockaddr_storage *ss, unsigned char key[16], char *peer, size_t cap,
                       int *loopback)
{
    memset(key, 0, 16);
    snprintf(peer, cap, "?");
    *loopback = 0;
    if (ss->ss_family == AF_INET) {
        const struct sockaddr_in *a = (const struct sockaddr_in *)ss;
        key[10] = key[11] = 0xff;
        memcpy(key + 12, &a->sin_addr, 4);
        uv_ip4_name(a, peer, cap);
        *loopback = key[12] == 127;
    } else if (ss->ss_family == AF_INET6) {
        const struct sockaddr_in6 *a = (const struct sockaddr_in6 *)ss;
        memcpy(key, &a->sin6_addr, 16);
        static const unsigned char mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
        static const unsigned char lo6[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1};
        if (!memcmp(key, mapped, 12)) {
            struct sockaddr_in v4 = {.sin_family = AF_INET};
            memcpy(&v4.sin_addr, key + 12, 4);
            uv_ip4_name(&v4, peer, cap);
            *loopback = key[12] == 127;
        } else {
            uv_ip6_name(a, peer, cap);
            *loopback = !memcmp(key, lo6, 16);
        }
    }
}

/* Bytes the kernel has received on the socket since it was opened (0 when unknown): Linux's tcp_info field
 * tcpi_bytes_received (since 4.1), at byte 128 of the struct; glibc's struct tcp_info stops before it. */
#define TCPI_BYTES_RECEIVED_OFFSET 128
uint64_t http_door_rx_bytes(int fd)
{
    unsigned char ti[256];
    socklen_t len = sizeof ti;
    if (getsockopt(fd, IPPROTO_TCP, TCP_INFO, ti, &len)) return 0;
    if (len < TCPI_BYTES_RECEIVED_OFFSET + 8) return 0;
    uint64_t v;
    memcpy(&v, ti + TCPI_BYTES_RECEIVED_OFFSET, 8);
    return v;
}

/* ---- refused connections: answer, shut down, drain, close ---- */

/* A connection refused at the accept: the 503 is written, our side shut down, and the client's bytes are
 * dropped until it closes (or LINGER_SECONDS), so that it reads the answer rather than a reset. */
struct linger_conn {
    uv_tcp_t tcp;
    uv_shutdown_t shut;
    struct http_server *srv;
    struct linger_conn *prev, *next;
    double t_start;
    int closing;
};

static void linger_closed(uv_handle_t *hd)
{
    struct linger_conn *l = hd->data;
    struct http_server *s = l->srv;
    if (l->prev)
        l->prev->next = l->next;
    else
        s->lingers = l->next;
    if (l->next) l->next->prev = l->prev;
    s->n_linger--;
    free(l);
}

static void linger_close(struct linger_conn *l)
{
    if (l->closing) return;
    l->closing = 1;
    uv_close((uv_handle_t *)&l->tcp, linger_closed);
}

static void linger_shut(uv_shutdown_t *sh, int status)
{
    if (status < 0) linger_close(sh->data);
}

static void linger_alloc(uv_handle_t *hd, size_t suggested, uv_buf_t *buf)
{
    static char sink[16384]; /* loop thread only; what lands here is dropped */
    (void)hd, (void)suggested;
    *buf = uv_buf_init(sink, sizeof sink);
}

static void linger_read(uv_stream_t *st, ssize_t n, const uv_buf_t *buf)
{
    (void)buf;
    if (n < 0) linger_close(st->data);
}

/* Closes fd gracefully (taken over): our side is shut down after what was written, and the client's bytes are
 * read and dropped until it closes or LINGER_SECONDS pass. */
void http_door_linger_fd(struct http_server *s, int fd)
{
    struct linger_conn *l = s->n_linger < HTTP_LINGER_MAX && !s->closed ? calloc(1, sizeof *l) : NULL;
    if (!l || uv_tcp_init(s->loop, &l->tcp)) {
        free(l);
        shutdown(fd, SHUT_WR);
        close(fd);
        return;
    }
    l->tcp.data = l;
    l->srv = s;
    l->t_start = http_now_s();
    l->next = s->lingers;
    if (s->lingers) s->lingers->prev = l;
    s->lingers = l;
    s->n_linger++;
    if (uv_tcp_open(&l->tcp, fd)) {
        close(fd);
        linger_close(l);
        return;
    }
    l->shut.data = l;
    if (uv_shutdown(&l->shut, (uv_stream_t *)&l->tcp, linger_shut) ||
        uv_read_start((uv_stream_t *)&l->tcp, linger_alloc, linger_read))
        linger_close(l);
}

/* Writes `resp` on a freshly accepted fd and closes it gracefully; the fd is taken over. */
void http_door_refuse_fd(struct http_server *s, int fd, const char *resp, size_t len)
{
    if (len) send(fd, resp, len, MSG_NOSIGNAL | MSG_DONTWAIT);
    http_door_linger_fd(s, fd);
}

void http_door_linger_expire(struct http_server *s, double now)
{
    for (struct linger_conn *l = s->lingers, *next; l; l = next) {
        next = l->next;
        if (now - l->t_start > LINGER_SECONDS) linger_close(l);
    }
}

void http_door_linger_close_all(struct http_server *s)
{
    for (struct linger_conn *l = s->lingers; l; l = l->next) linger_close(l);
}
