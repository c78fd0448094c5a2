/* kv_cache.c: not written yet */
