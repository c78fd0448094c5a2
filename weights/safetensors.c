/* safetensors.c: not written yet */
