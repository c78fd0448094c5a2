/* threadpool — a fixed set of worker threads that run one parallel-for at a time.
 *
 * tpool_run(tp, fn, ctx, n) calls fn(ctx, i) once for each i in [0, n), spread over the workers plus the
 * calling thread, and returns when all calls are done. Tasks are handed out one at a time, so which thread
 * runs task i varies (a worker the OS has not scheduled yet simply gets fewer): callers make fn(ctx, i)
 * depend on i only — the work of task i is fixed by i (for example the i-th of n contiguous slices) — and
 * then results are deterministic whatever the pool size or the machine's load. Calls with different i may
 * run concurrently. A NULL pool runs everything on the caller. Not reentrant: one tpool_run at a time per pool.
 */
#ifndef FERRY_THREADPOOL_H
#define FERRY_THREADPOOL_H

struct tpool;

typedef void (*tpool_fn)(void *ctx, int task);

/* n_threads <= 0 means "number of online cores". */
int tpool_init(struct tpool **out, int n_threads);
void tpool_free(struct tpool *tp);
int tpool_size(const struct tpool *tp); /* 1 for NULL */
void tpool_run(struct tpool *tp, tpool_fn fn, void *ctx, int n_tasks);

#endif
