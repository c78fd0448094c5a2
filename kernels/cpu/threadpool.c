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
 * Pinning (tpool_init_pinned): workers are created with their affinity set to one CPU each, in the order of
 * tpool_cpu_order (one hardware thread per physical core first, spread over the NUMA nodes); the topology is
 * read from sysfs.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "kernels/cpu/threadpool.h"

#include <dirent.h>
#include <limits.h>
#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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
    int cpu; /* pinned to this CPU, or -1 */
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

/* cpus: (n_threads) the CPU of each thread (index 0, the caller's, unused), -1 = not pinned; or NULL. */
static int tpool_create(struct tpool **out, int n_threads, const int *cpus)
{
    *out = NULL;
    if (n_threads <= 0) n_threads = tpool_cpus_online();
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
        w->cpu = -1;
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        if (cpus && cpus[i] >= 0 && cpus[i] < CPU_SETSIZE) {
            cpu_set_t set;
            CPU_ZERO(&set);
            CPU_SET(cpus[i], &set);
            if (pthread_attr_setaffinity_np(&attr, sizeof set, &set) == 0) w->cpu = cpus[i];
        }
        int rc = pthread_create(&w->thread, &attr, tpool_worker_main, w);
        if (rc != 0 && w->cpu >= 0) { /* a CPU the kernel refuses: run unpinned rather than not at all */
            w->cpu = -1;
            rc = pthread_create(&w->thread, NULL, tpool_worker_main, w);
        }
        pthread_attr_destroy(&attr);
        if (rc != 0) {
            tpool_free(tp);
            return FERRY_ERR_NOMEM;
        }
        tp->n_threads++;
    }
    *out = tp;
    return FERRY_OK;
}

int tpool_init(struct tpool **out, int n_threads)
{
    return tpool_create(out, n_threads, NULL);
}

int tpool_init_pinned(struct tpool **out, int n_threads)
{
    if (n_threads <= 0) n_threads = tpool_cpus_online();
    if (n_threads > 1024) return FERRY_ERR_INVALID;
    int order[CPU_SETSIZE], cpus[1024];
    const int n_cpus = tpool_cpu_order(order, CPU_SETSIZE);
    for (int i = 0; i < n_threads; i++) cpus[i] = i < n_cpus ? order[i] : -1;
    return tpool_create(out, n_threads, cpus);
}

int tpool_thread_cpu(const struct tpool *tp, int thread)
{
    if (!tp || thread <= 0 || thread >= tp->n_threads) return -1;
    return tp->workers[thread - 1].cpu;
}

/* ----------------------------------------------------------------------------------------------------------
 */
/* Topology */

static int affinity(cpu_set_t *set)
{
    CPU_ZERO(set);
    return sched_getaffinity(0, sizeof *set, set);
}

int tpool_cpus_online(void)
{
    cpu_set_t set;
    if (affinity(&set) == 0 && CPU_COUNT(&set) > 0) return CPU_COUNT(&set);
    long nc = sysconf(_SC_NPROCESSORS_ONLN);
    return nc > 0 ? (int)nc : 1;
}

/* Reads one integer from a sysfs file; -1 when absent. */
static long read_long(const char *path)
{
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    long v = -1;
    if (fscanf(f, "%ld", &v) != 1) v = -1;
    fclose(f);
    return v;
}

/* node_of[c] = the NUMA node of CPU c (0 when sysfs has no nodes); returns the highest node id + 1. */
static int numa_map(int *node_of)
{
    for (int c = 0; c < CPU_SETSIZE; c++) node_of[c] = 0;
    DIR *d = opendir("/sys/devices/system/node");
    if (!d) return 1;
    int n_nodes = 1;
    struct dirent *e;
    while ((e = readdir(d))) {
        int node;
        char tail;
        if (sscanf(e->d_name, "node%d%c", &node, &tail) != 1 || node < 0 || node >= 4096) continue;
        char path[96];
        snprintf(path, sizeof path, "/sys/devices/system/node/node%d/cpulist", node);
        FILE *f = fopen(path, "r");
        if (!f) continue;
        char list[4096];
        if (fgets(list, sizeof list, f)) {
            /* "0-3,8-11\n" */
            for (char *p = list; *p && *p != '\n';) {
                char *end;
                long a = strtol(p, &end, 10), b = a;
                if (end == p) break;
                if (*end == '-') b = strtol(end + 1, &end, 10);
                for (long c = a; c <= b && c < CPU_SETSIZE; c++)
                    if (c >= 0) node_of[c] = node;
                p = *end == ',' ? end + 1 : end;
            }
        }
        fclose(f);
        if (node + 1 > n_nodes) n_nodes = node + 1;
    }
    closedir(d);
    return n_nodes;
}

int tpool_cpu_order(int *cpus, int cap)
{
    cpu_set_t set;
    if (affinity(&set) != 0) {
        int n = tpool_cpus_online();
        for (int i = 0; i < n && i < cap; i++) cpus[i] = i;
        return n < cap ? n : cap;
    }
    int node_of[CPU_SETSIZE];
    const int n_nodes = numa_map(node_of);
    /* For every CPU in the mask: its core (package, core id) and its rank among the core's threads. */
    int ids[CPU_SETSIZE], rank[CPU_SETSIZE], n = 0, max_rank = 0;
    long key[CPU_SETSIZE];
    for (int c = 0; c < CPU_SETSIZE; c++) {
        if (!CPU_ISSET(c, &set)) continue;
        char path[128];
        snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu%d/topology/core_id", c);
        const long core = read_long(path);
        snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu%d/topology/physical_package_id", c);
        const long pkg = read_long(path);
        key[n] = core < 0 ? -1 - c : pkg * 1000000 + core; /* no topology: every CPU its own core */
        rank[n] = 0;
        for (int j = 0; j < n; j++)
            if (key[j] == key[n]) rank[n]++;
        if (rank[n] > max_rank) max_rank = rank[n];
        ids[n++] = c;
    }
    /* Rank by rank; within a rank, round-robin over the nodes (each node's CPUs in id order). */
    int out = 0;
    for (int r = 0; r <= max_rank; r++) {
        int taken[CPU_SETSIZE] = {0}, left = 0;
        for (int i = 0; i < n; i++) left += rank[i] == r;
        while (left > 0)
            for (int node = 0; node < n_nodes && left > 0; node++)
                for (int i = 0; i < n; i++)
                    if (rank[i] == r && !taken[i] && node_of[ids[i]] == node) {
                        taken[i] = 1;
                        left--;
                        if (out < cap) cpus[out] = ids[i];
                        out++;
                        break;
                    }
    }
    return out < cap ? out : cap;
}

/* The set of nodes holding the affinity mask's CPUs, as a bit mask over node ids (< 64 nodes). */
static uint64_t numa_nodes_mask(void)
{
    cpu_set_t set;
    int node_of[CPU_SETSIZE];
    numa_map(node_of);
    if (affinity(&set) != 0) return 1;
    uint64_t mask = 0;
    for (int c = 0; c < CPU_SETSIZE; c++)
        if (CPU_ISSET(c, &set) && node_of[c] < 64) mask |= (uint64_t)1 << node_of[c];
    return mask ? mask : 1;
}

int tpool_numa_nodes(void)
{
    return __builtin_popcountll(numa_nodes_mask());
}

int tpool_numa_interleave(void *p, size_t n)
{
    const uint64_t mask = numa_nodes_mask();
    if (__builtin_popcountll(mask) <= 1 || !p || !n) return FERRY_OK;
    const uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    const uintptr_t a = (uintptr_t)p & ~(page - 1), b = ((uintptr_t)p + n + page - 1) & ~(page - 1);
    unsigned long nodes = (unsigned long)mask;
    /* mbind(addr, len, MPOL_INTERLEAVE = 3, nodemask, maxnode, flags) */
    if (syscall(SYS_mbind, (void *)a, (unsigned long)(b - a), 3, &nodes, (unsigned long)64 + 1, 0) != 0)
        return FERRY_ERR_UNSUPPORTED;
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
