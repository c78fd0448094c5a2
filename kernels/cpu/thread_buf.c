/* thread_buf — see thread_buf.h. A pthread key per buffer, made under one lock at first use; each thread's
 * value is its { memory, capacity }, released by the key's destructor when the thread exits. */
#include "kernels/cpu/thread_buf.h"

#include <stdlib.h>

struct tb_mem {
    void *p;
    size_t cap;
};

static pthread_mutex_t tb_lock = PTHREAD_MUTEX_INITIALIZER;

static void tb_release(void *v)
{
    struct tb_mem *s = v;
    free(s->p);
    free(s);
}

void *thread_buf_get(struct thread_buf *b, size_t bytes)
{
    int st = __atomic_load_n(&b->state, __ATOMIC_ACQUIRE);
    if (st == 0) {
        pthread_mutex_lock(&tb_lock);
        if (b->state == 0)
            __atomic_store_n(&b->state, pthread_key_create(&b->key, tb_release) == 0 ? 1 : -1,
                             __ATOMIC_RELEASE);
        st = b->state;
        pthread_mutex_unlock(&tb_lock);
    }
    if (st < 0) return NULL;
    struct tb_mem *s = pthread_getspecific(b->key);
    if (!s) {
        s = calloc(1, sizeof *s);
        if (!s || pthread_setspecific(b->key, s) != 0) {
            free(s);
            return NULL;
        }
    }
    if (s->cap < bytes) {
        free(s->p);
        s->cap = 0;
        s->p = aligned_alloc(64, (bytes + 63) / 64 * 64);
        if (!s->p) return NULL;
        s->cap = bytes;
    }
    return s->p;
}
