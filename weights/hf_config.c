/* hf_config.c: not written yet */
