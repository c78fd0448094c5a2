/* engine.c: not written yet */
