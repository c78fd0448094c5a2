/* ops.c: not written yet */
