/* gguf.c: not written yet */
