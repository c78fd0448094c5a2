/* cli_inspect.c: not written yet */
