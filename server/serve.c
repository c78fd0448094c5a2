/* serve.c: not written yet */
