/* threadpool — a fixed pool of pthreads running one parallel-for at a time (see threadpool.h).
 *
 * Dispatch is a generation counter: tpool_run publishes (fn, ctx, n_tasks), bumps `gen` and the workers,
 * spinning briefly on `gen` and then sleeping on it with a futex, pick the new job up. Thread t (the caller
 * is thread 0) runs tasks [t*n/T, (t+1)*n/T): a static partition, so the same pool size always gives the
 * same thread the same tasks. Completion is a countdown of the workers; the caller spins on it, then sleeps.
 * Futex wake-ups are only issued when someone has announced it is (about to be) asleep, so a busy pool
 * issues no system calls at all.
 */
#include "kernels/cpu/threadpool.h"

#include <limits.h>
#include <linux/futex.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "kernels/core/status.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define cpu_relax() _mm_pause()
#else
#define cpu_relax() ((void)0)
#endif

/* Spin iterations (each a pause, ~tens of ns) before sleeping: long enough to cover the gap between two
 * tpool_run calls of one forward pass, short enough not to burn a core when the engine is idle. */
#define TPOOL_SPIN 20000

struct tpool_worker {
    struct tpool *tp;
    int index;
    pthread_t thread;
};

struct tpool {
    int n_threads;                /* workers + the caller */
    struct tpool_worker *workers; /* (n_threads - 1) */
    _Atomic uint32_t gen;         /* bumped once per job (and on shutdown) */
    _Atomic uint32_t remaining;   /* workers that have not finished the current job */
    _Atomic int n_sleepers;       /* workers asleep (or about to be) on gen */
    _Atomic int caller_sleeping;  /* the caller is asleep (or about to be) on remaining */
    _Atomic int stop;
    tpool_fn fn;
    void *ctx;
    int n_tasks;
};

static void futex_wait(_Atomic uint32_t *addr, uint32_t val)
{
    syscall(SYS_futex, (uint32_t *)addr, FUTEX_WAIT_PRIVATE, val, NULL, NULL, 0);
}

static void futex_wake(_Atomic uint32_t *addr)
{
    syscall(SYS_futex, (uint32_t *)addr, FUTEX_WAKE_PRIVATE, INT_MAX, NULL, NULL, 0);
}

static void tpool_run_slice(struct tpool *tp, int t)
{
    const int64_t n = tp->n_tasks, nt = tp->n_threads;
    const int lo = (int)(n * t / nt), hi = (int)(n * (t + 1) / nt);
    for (int i = lo; i < hi; i++) tp->fn(tp->ctx, i);
}

static void *tpool_worker_main(void *arg)
{
    struct tpool_worker *w = arg;
    struct tpool *tp = w->tp;
    uint32_t seen = 0;
    for (;;) {
        uint32_t g;
        int spins = 0;
        while ((g = atomic_load(&tp->gen)) == seen) {
            if (++spins < TPOOL_SPIN) {
                cpu_relax();
                continue;
            }
            atomic_fetch_add(&tp->n_sleepers, 1);
            if (atomic_load(&tp->gen) == seen) futex_wait(&tp->gen, seen);
            atomic_fetch_sub(&tp->n_sleepers, 1);
            spins = 0;
        }
        seen = g;
        if (atomic_load(&tp->stop)) return NULL;
        tpool_run_slice(tp, w->index);
        if (atomic_fetch_sub(&tp->remaining, 1) == 1 && atomic_load(&tp->caller_sleeping))
            futex_wake(&tp->remaining);
    }
}

int tpool_init(struct tpool **out, int n_threads)
{
    *out = NULL;
    if (n_threads <= 0) {
        long nc = sysconf(_SC_NPROCESSORS_ONLN);
        n_threads = nc > 0 ? (int)nc : 1;
    }
    if (n_threads > 1024) return FERRY_ERR_INVALID;
    struct tpool *tp = calloc(1, sizeof *tp);
    if (!tp) return FERRY_ERR_NOMEM;
    tp->n_threads = 1;
    if (n_threads > 1) {
        tp->workers = calloc((size_t)n_threads - 1, sizeof *tp->workers);
        if (!tp->workers) {
            free(tp);
            return FERRY_ERR_NOMEM;
        }
    }
    for (int i = 1; i < n_threads; i++) {
        struct tpool_worker *w = &tp->workers[i - 1];
        w->tp = tp;
        w->index = i;
        if (pthread_create(&w->thread, NULL, tpool_worker_main, w) != 0) {
            tpool_free(tp);
            return FERRY_ERR_NOMEM;
        }
        tp->n_threads++;
    }
    *out = tp;
    return FERRY_OK;
}

void tpool_free(struct tpool *tp)
{
    if (!tp) return;
    atomic_store(&tp->stop, 1);
    atomic_fetch_add(&tp->gen, 1);
    futex_wake(&tp->gen);
    for (int i = 1; i < tp->n_threads; i++) pthread_join(tp->workers[i - 1].thread, NULL);
    free(tp->workers);
    free(tp);
}

int tpool_size(const struct tpool *tp)
{
    return tp ? tp->n_threads : 1;
}

void tpool_run(struct tpool *tp, tpool_fn fn, void *ctx, int n_tasks)
{
    if (n_tasks <= 0) return;
    if (!tp || tp->n_threads == 1 || n_tasks == 1) {
        for (int i = 0; i < n_tasks; i++) fn(ctx, i);
        return;
    }
    tp->fn = fn;
    tp->ctx = ctx;
    tp->n_tasks = n_tasks;
    atomic_store(&tp->remaining, (uint32_t)(tp->n_threads - 1));
    atomic_fetch_add(&tp->gen, 1);
    if (atomic_load(&tp->n_sleepers) > 0) futex_wake(&tp->gen);
    tpool_run_slice(tp, 0);
    uint32_t r;
    int spins = 0;
    while ((r = atomic_load(&tp->remaining)) != 0) {
        if (++spins < TPOOL_SPIN) {
            cpu_relax();
            continue;
        }
        atomic_store(&tp->caller_sleeping, 1);
        if ((r = atomic_load(&tp->remaining)) != 0) futex_wait(&tp->remaining, r);
        atomic_store(&tp->caller_sleeping, 0);
        spins = 0;
    }
}
