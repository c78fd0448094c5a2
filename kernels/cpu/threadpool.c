/* threadpool — a fixed pool of pthreads running one parallel-for at a time (see threadpool.h).
 *
 * A job is published as one 64-bit claim word, (n_tasks << 32) | next: the caller and the workers take tasks
 * one at a time by compare-and-swap on it, and count finished tasks in `done`; tpool_run returns when
 * done == n_tasks. The caller starts at once and the workers join as they wake, so a worker that the OS has
 * not scheduled (a busy machine) never holds up a job unless it is preempted in the middle of a task.
 * Waking is a generation counter: workers spin briefly on `gen`, then sleep on it with a futex; the caller,
 * after its share, spins on `done`, then sleeps on it. Futex wake-ups are only issued when someone has said
 * it is (about to be) asleep, so a busy pool makes no system calls.
 * Safety of late workers: a worker whose claim CAS succeeds with next < n holds a task of the *current* job
 * (the word carries n and next), and the caller does not publish the next job before that task is counted
 * in `done`; so fn/ctx read after a successful claim are always those of the job the task belongs to.
 * Results: which thread runs a task varies from run to run, but fn(ctx, i) depends only on i in every
 * kernel of ferry, so results are bitwise reproducible and independent of the pool size.
 */
#include "kernels/cpu/threadpool.h"

#include <limits.h>
#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
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
/* After this many pauses a spinning thread also yields its core every few spins: when the machine is
 * oversubscribed (other processes, more threads than free cores), the thread it waits for may be runnable
 * but not running, and spinning on the core it needs only delays it. Costs one syscall per few spins. */
#define TPOOL_SPIN_YIELD 1000

static inline void spin_wait(int spins)
{
    if (spins > TPOOL_SPIN_YIELD && (spins & 15) == 0)
        sched_yield();
    else
        cpu_relax();
}

struct tpool_worker {
    struct tpool *tp;
    pthread_t thread;
};

struct tpool {
    int n_threads;                /* workers + the caller */
    struct tpool_worker *workers; /* (n_threads - 1) */
    _Atomic uint64_t claim;       /* (n_tasks << 32) | next task to hand out */
    _Atomic uint32_t done;        /* tasks of the current job finished */
    _Atomic uint32_t gen;         /* bumped once per job (and on shutdown) */
    _Atomic int n_sleepers;       /* workers asleep (or about to be) on gen */
    _Atomic int caller_sleeping;  /* the caller is asleep (or about to be) on done */
    _Atomic int stop;
    tpool_fn _Atomic fn;
    void *_Atomic ctx;
};

static void futex_wait(_Atomic uint32_t *addr, uint32_t val)
{
    syscall(SYS_futex, (uint32_t *)addr, FUTEX_WAIT_PRIVATE, val, NULL, NULL, 0);
}

static void futex_wake(_Atomic uint32_t *addr)
{
    syscall(SYS_futex, (uint32_t *)addr, FUTEX_WAKE_PRIVATE, INT_MAX, NULL, NULL, 0);
}

/* Takes the next task of the current job: its index, or -1 when all are handed out. */
static int tpool_claim(struct tpool *tp)
{
    uint64_t c = atomic_load(&tp->claim);
    for (;;) {
        const uint32_t next = (uint32_t)c, n = (uint32_t)(c >> 32);
        if (next >= n) return -1;
        if (atomic_compare_exchange_weak(&tp->claim, &c, c + 1)) return (int)next;
    }
}

/* Runs tasks until none is left; returns how many this thread ran. */
static void tpool_work(struct tpool *tp, int is_caller)
{
    int i;
    while ((i = tpool_claim(tp)) >= 0) {
        /* Valid: our task keeps the job from completing, so fn/ctx cannot change under us. */
        atomic_load (&tp->fn)(atomic_load(&tp->ctx), i);
        const uint32_t n = (uint32_t)(atomic_load(&tp->claim) >> 32);
        if (atomic_fetch_add(&tp->done, 1) + 1 == n && !is_caller && atomic_load(&tp->caller_sleeping))
            futex_wake(&tp->done);
    }
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
                spin_wait(spins);
                continue;
            }
            atomic_fetch_add(&tp->n_sleepers, 1);
            if (atomic_load(&tp->gen) == seen) futex_wait(&tp->gen, seen);
            atomic_fetch_sub(&tp->n_sleepers, 1);
            spins = 0;
        }
        seen = g;
        if (atomic_load(&tp->stop)) return NULL;
        tpool_work(tp, 0);
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
    /* The previous job is complete (done == its n), so no thread can be reading fn/ctx now. */
    atomic_store(&tp->fn, fn);
    atomic_store(&tp->ctx, ctx);
    atomic_store(&tp->done, 0);
    atomic_store(&tp->claim, (uint64_t)(uint32_t)n_tasks << 32);
    atomic_fetch_add(&tp->gen, 1);
    if (atomic_load(&tp->n_sleepers) > 0) futex_wake(&tp->gen);
    tpool_work(tp, 1);
    uint32_t d;
    int spins = 0;
    while ((d = atomic_load(&tp->done)) != (uint32_t)n_tasks) {
        if (++spins < TPOOL_SPIN) {
            spin_wait(spins);
            continue;
        }
        atomic_store(&tp->caller_sleeping, 1);
        if ((d = atomic_load(&tp->done)) != (uint32_t)n_tasks) futex_wait(&tp->done, d);
        atomic_store(&tp->caller_sleeping, 0);
        spins = 0;
    }
}
