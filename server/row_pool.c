/* row_pool — the scheduler's sampling threads (see row_pool.h). A round is published by bumping `gen`
 * under mu; each thread takes rows until none is left, then counts itself done. */
#include "server/row_pool.h"

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>

#include "kernels/core/status.h"

struct row_pool {
    row_pool_fn fn;
    void *ctx;
    pthread_t *threads; /* (n_threads) */
    int n_threads;
    pthread_mutex_t mu;
    pthread_cond_t go, done;
    uint64_t gen; /* bumped for each round */
    int stop, rows, next, busy;
};

/* Takes rows off the shared counter until none is left. */
static void run_some(struct row_pool *p)
{
    for (;;) {
        int i = __atomic_fetch_add(&p->next, 1, __ATOMIC_ACQ_REL);
        if (i >= p->rows) return;
        p->fn(p->ctx, i);
    }
}

static void *worker(void *arg)
{
    struct row_pool *p = arg;
    uint64_t seen = 0;
    pthread_mutex_lock(&p->mu);
    for (;;) {
        while (p->gen == seen && !p->stop) pthread_cond_wait(&p->go, &p->mu);
        if (p->stop) break;
        seen = p->gen;
        pthread_mutex_unlock(&p->mu);
        run_some(p);
        pthread_mutex_lock(&p->mu);
        if (--p->busy == 0) pthread_cond_signal(&p->done);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

int row_pool_init(struct row_pool **out, int n_threads, row_pool_fn fn, void *ctx)
{
    *out = NULL;
    struct row_pool *p = calloc(1, sizeof *p);
    if (!p) return FERRY_ERR_NOMEM;
    p->fn = fn;
    p->ctx = ctx;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->go, NULL);
    pthread_cond_init(&p->done, NULL);
    if (n_threads > 0) {
        p->threads = calloc((size_t)n_threads, sizeof *p->threads);
        if (!p->threads) {
            row_pool_free(p);
            return FERRY_ERR_NOMEM;
        }
        for (int i = 0; i < n_threads; i++) {
            if (pthread_create(&p->threads[i], NULL, worker, p)) break;
            p->n_threads++;
        }
    }
    *out = p;
    return 0;
}

void row_pool_run(struct row_pool *p, int rows)
{
    p->rows = rows;
    p->next = 0;
    if (p->n_threads == 0 || rows < 4) {
        run_some(p);
        return;
    }
    pthread_mutex_lock(&p->mu);
    p->busy = p->n_threads;
    p->gen++;
    pthread_cond_broadcast(&p->go);
    pthread_mutex_unlock(&p->mu);
    run_some(p);
    pthread_mutex_lock(&p->mu);
    while (p->busy > 0) pthread_cond_wait(&p->done, &p->mu);
    pthread_mutex_unlock(&p->mu);
}

void row_pool_free(struct row_pool *p)
{
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    p->stop = 1;
    pthread_cond_broadcast(&p->go);
    pthread_mutex_unlock(&p->mu);
    for (int i = 0; i < p->n_threads; i++) pthread_join(p->threads[i], NULL);
    free(p->threads);
    pthread_cond_destroy(&p->go);
    pthread_cond_destroy(&p->done);
    pthread_mutex_destroy(&p->mu);
    free(p);
}
