/* row_pool — a few threads that run fn(ctx, i) for every row i of a round, the caller's thread included.
 *
 * The scheduler samples the rows of one engine step in parallel: each row is one sequence, whose state is
 * its own, so rows need no lock. Rows are taken off a shared counter; row_pool_run returns when all are
 * done. A round of fewer than 4 rows runs on the caller alone (waking threads would cost more). Only one
 * thread calls row_pool_run at a time. Usage: row_pool_init → row_pool_run ... → row_pool_free (joins).
 */
#ifndef FERRY_SERVER_ROW_POOL_H
#define FERRY_SERVER_ROW_POOL_H

typedef void (*row_pool_fn)(void *ctx, int row);

struct row_pool;

/* n_threads: threads besides the caller's (0: the caller runs every row). Fewer start when creating one
 * fails; FERRY_ERR_NOMEM when the pool itself cannot be allocated. */
int row_pool_init(struct row_pool **out, int n_threads, row_pool_fn fn, void *ctx);
void row_pool_run(struct row_pool *p, int rows);
void row_pool_free(struct row_pool *p);

#endif
