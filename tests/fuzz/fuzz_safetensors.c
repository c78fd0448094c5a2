// SOURCES: weights/*.c weights/arch/*.c quant/*.c kernels/core/status.c kernels/core/log.c
// LIBS: -ljansson -lm
/* libFuzzer target for the safetensors reader, and (on the same bytes) the JSON readers of an HF directory:
 * config.json, model.safetensors.index.json and tokenizer_config.json. Built and run by tests/fuzz/run.sh. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/core/status.h"
#include "weights/hf_config.h"
#include "weights/safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char err[256];
    struct safetensors *st;
    if (safetensors_open_mem(data, size, &st, err) == FERRY_OK) {
        for (int i = 0; i < safetensors_n_tensors(st); i++) {
            const struct st_tensor *t = safetensors_tensor(st, i);
            const uint8_t *p = t->data;
            if (p < data || t->nbytes > size || p + t->nbytes > data + size) abort();
            if (t->nbytes) {
                volatile uint8_t x = p[0] ^ p[t->nbytes - 1];
                (void)x;
            }
            if (safetensors_find(st, t->name) == NULL) abort();
        }
        safetensors_metadata(st, "format");
        safetensors_close(st);
    } else if (err[0] == '\0') {
        abort();
    }
    /* The JSON readers see the bytes after the 8-byte length prefix, so seeds serve both. */
    const char *j = (const char *)data + (size >= 8 ? 8 : 0);
    size_t jn = size >= 8 ? size - 8 : size;
    struct llm_hparams hp;
    hf_config_parse(j, jn, &hp, err);
    struct st_index ix;
    if (st_index_parse(j, jn, &ix, err) == FERRY_OK) st_index_free(&ix);
    char *tpl = NULL;
    if (hf_chat_template_parse(j, jn, &tpl, err) == FERRY_OK) free(tpl);
    return 0;
}
