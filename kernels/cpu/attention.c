/* attention.c: not written yet */
