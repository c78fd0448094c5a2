/* threadpool.c: not written yet */
