/* http_fair — which open connection gives way when the connection cap is reached, as pure functions.
 *
 * At the cap, a new connection would otherwise be refused: a few addresses holding every connection (silent
 * sockets, reopened as they time out) would keep everyone else out. Instead the address holding the most
 * connections gives one up, provided it holds more than the newcomer's address would after being let in
 * (so two addresses never trade one connection back and forth), and only a connection that does nothing
 * for anyone: idle between requests, a head or body that is silent or trickling, never a request the
 * application is working on or answering. Among that address's, the one silent longest goes first.
 * Usage: for each open connection, http_fair_eligible(&cand, newcomer_count); keep the best by
 * http_fair_prefer(&a, &best); close it, then take the newcomer.
 */
#ifndef FERRY_SERVER_HTTP_FAIR_H
#define FERRY_SERVER_HTTP_FAIR_H

enum http_fair_activity {
    HTTP_FAIR_IDLE = 0, /* no request in progress (a new connection that sent nothing, or between requests) */
    HTTP_FAIR_READING,  /* a head or body arriving */
    HTTP_FAIR_WORKING   /* the application has the request, or its answer is being written */
};

struct http_fair_cand {
    int addr_count; /* open connections from this connection's address */
    enum http_fair_activity activity;
    double silent_s; /* seconds since the client last sent a byte (or since the accept) */
};

/* A reading connection silent this long counts as slow (it may give way); one that sends gets to finish. */
#define HTTP_FAIR_SLOW_S 1.0

/* Whether c may give way to a newcomer whose address holds newcomer_count connections now. */
int http_fair_eligible(const struct http_fair_cand *c, int newcomer_count);
/* Whether a should give way before b (both eligible): its address holds more, else it is silent longer. */
int http_fair_prefer(const struct http_fair_cand *a, const struct http_fair_cand *b);

#endif
