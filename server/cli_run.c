/* cli_run.c: not written yet */
