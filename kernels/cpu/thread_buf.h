/* thread_buf — scratch memory per thread: each thread that asks gets its own buffer, grown to the largest
 * size it has asked for and freed when the thread exits. For kernels that want working memory without
 * allocating per call (the CPU products' prepared x, the AMX tiles' converted weights). A `struct thread_buf`
 * is a static object, zero-initialized (THREAD_BUF_INIT); its key is made at first use. */
#ifndef FERRY_KERN_CPU_THREAD_BUF_H
#define FERRY_KERN_CPU_THREAD_BUF_H

#include <pthread.h>
#include <stddef.h>

struct thread_buf {
    pthread_key_t key;
    int state; /* 0: no key yet, 1: key made, -1: it could not be */
};
#define THREAD_BUF_INIT                                                                                      \
    {                                                                                                        \
        .state = 0                                                                                           \
    }

/* At least `bytes` of 64-byte aligned memory owned by the calling thread (its contents are those it left
 * there last time, up to the old size, unless the buffer had to grow), or NULL when it cannot be had. */
void *thread_buf_get(struct thread_buf *b, size_t bytes);

#endif
