/* http_fair — which connection gives way at the connection cap (the contract is in server/http_fair.h). */
#include "server/http_fair.h"

int http_fair_eligible(const struct http_fair_cand *c, int newcomer_count)
{
    if (c->activity == HTTP_FAIR_WORKING) return 0;
    if (c->activity == HTTP_FAIR_READING && c->silent_s < HTTP_FAIR_SLOW_S) return 0;
    /* after the swap the newcomer's address holds newcomer_count + 1 and this one addr_count - 1: it gives
     * way only while it would still hold at least as many */
    return c->addr_count - 1 >= newcomer_count + 1;
}

int http_fair_prefer(const struct http_fair_cand *a, const struct http_fair_cand *b)
{
    if (a->addr_count != b->addr_count) return a->addr_count > b->addr_count;
    return a->silent_s > b->silent_s;
}
