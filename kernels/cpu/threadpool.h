/* threadpool — a fixed set of worker threads that run one parallel-for at a time.
 *
 * tpool_run(tp, fn, ctx, n) calls fn(ctx, i) once for each i in [0, n), spread over the workers plus the
 * calling thread, and returns when all calls are done. Tasks are handed out one at a time, so which thread
 * runs task i varies (a worker the OS has not scheduled yet simply gets fewer): callers make fn(ctx, i)
 * depend on i only — the work of task i is fixed by i (for example the i-th of n contiguous slices) — and
 * then results are deterministic whatever the pool size or the machine's load. Calls with different i may
 * run concurrently. A NULL pool runs everything on the caller. Not reentrant: one tpool_run at a time per
 * pool.
 */
#ifndef FERRY_THREADPOOL_H
#define FERRY_THREADPOOL_H

#include <stddef.h>

struct tpool;

typedef void (*tpool_fn)(void *ctx, int task);

/* n_threads <= 0 means "the cores this process may run on" (tpool_cpus_online). */
int tpool_init(struct tpool **out, int n_threads);
/* The same pool with each worker pinned to one core of the process's affinity mask, in tpool_cpu_order's
 * order from its second entry on (the first is left to the calling thread, which is not pinned: it belongs to
 * the caller). For a host that computes layers beside a GPU: a worker that stays on its core keeps its caches
 * and its NUMA node. Pinning is best effort (a core the kernel refuses is left unpinned). */
int tpool_init_pinned(struct tpool **out, int n_threads);
void tpool_free(struct tpool *tp);
int tpool_size(const struct tpool *tp); /* 1 for NULL */
void tpool_run(struct tpool *tp, tpool_fn fn, void *ctx, int n_tasks);
/* The CPU a worker is pinned to, or -1 (unpinned, the caller's slot 0, or no such thread). */
int tpool_thread_cpu(const struct tpool *tp, int thread);

/* Host topology (Linux sysfs; a machine without it reads as one node, one thread per core). */
/* Cores in this process's affinity mask. */
int tpool_cpus_online(void);
/* Fills cpus (cap entries) with the affinity mask's CPU ids in pinning order: one hardware thread of every
 * physical core first, round-robin over the NUMA nodes, then the second threads of the cores. Returns the
 * count. */
int tpool_cpu_order(int *cpus, int cap);
/* NUMA nodes holding the affinity mask's CPUs. */
int tpool_numa_nodes(void);
/* Asks the kernel to spread the pages of [p, p + n) over those nodes page by page (MPOL_INTERLEAVE), before
 * they are first touched, so that threads on every node read them at the machine's aggregate rate. A no-op
 * with one node. FERRY_OK, or FERRY_ERR_UNSUPPORTED when the kernel refuses. */
int tpool_numa_interleave(void *p, size_t n);

#endif
