/* matmul.c: not written yet */
