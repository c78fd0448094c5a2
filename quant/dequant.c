/* dequant.c: not written yet */
