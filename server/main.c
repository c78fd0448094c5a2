/* main.c: not written yet */
