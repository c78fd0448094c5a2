/* model_file.c: not written yet */
