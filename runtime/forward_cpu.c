/* forward_cpu.c: not written yet */
