/* sreq — allocation and release of a request (struct sreq, scheduler.h). sreq_new() is declared in
 * scheduler.h for the API layer; sreq_free() is the scheduler's, called when the last reference goes.
 */
#ifndef FERRY_SERVER_SREQ_H
#define FERRY_SERVER_SREQ_H

#include "server/scheduler.h"

/* Frees r and everything it owns; r may be half built (NULL arrays), or NULL. */
void sreq_free(struct sreq *r);

#endif
