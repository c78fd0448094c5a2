// SOURCES: weights/*.c weights/arch/*.c quant/*.c kernels/core/status.c kernels/core/log.c
// LIBS: -ljansson -lm
/* libFuzzer target for the GGUF reader and the model_file layer over it (hyperparameters, validation): any
 * input must be rejected with a message or accepted with every view inside the buffer. Built and run by
 * tests/fuzz/run.sh. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/core/status.h"
#include "weights/gguf.h"
#include "weights/model_file.h"

static void inside(const uint8_t *b, size_t n, const void *p, size_t len)
{
    if ((const uint8_t *)p < b || len > n || (const uint8_t *)p + len > b + n) abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char err[256];
    struct gguf *g;
    if (gguf_open_mem(data, size, &g, err) != FERRY_OK) {
        if (err[0] == '\0' || memchr(err, '\n', strnlen(err, 256))) abort();
        return 0;
    }
    for (int i = 0; i < gguf_n_kv(g); i++) {
        struct gguf_str k = gguf_kv_key(g, i);
        inside(data, size, k.ptr, k.len);
        char key[128];
        if (k.len >= sizeof key || memchr(k.ptr, 0, k.len)) continue;
        memcpy(key, k.ptr, k.len);
        key[k.len] = 0;
        uint32_t u;
        int64_t i64;
        float f;
        int bo;
        struct gguf_str s;
        gguf_get_u32(g, key, &u);
        gguf_get_i64(g, key, &i64);
        gguf_get_f32(g, key, &f);
        gguf_get_bool(g, key, &bo);
        if (gguf_get_str(g, key, &s) == FERRY_OK) inside(data, size, s.ptr, s.len);
        enum gguf_vtype et;
        uint64_t n;
        if (gguf_get_arr(g, key, &et, &n) != FERRY_OK) continue;
        if (et == GGUF_TYPE_STRING) {
            for (uint64_t j = 0; j < n; j++) {
                if (gguf_arr_str(g, key, j, &s) != FERRY_OK) abort();
                inside(data, size, s.ptr, s.len);
            }
        } else if (n <= size) {
            float *fv = malloc((n ? n : 1) * sizeof *fv);
            int32_t *iv = malloc((n ? n : 1) * sizeof *iv);
            gguf_arr_f32(g, key, fv, n);
            gguf_arr_i32(g, key, iv, n);
            free(fv);
            free(iv);
        }
    }
    for (int i = 0; i < gguf_n_tensors(g); i++) {
        const struct gguf_tensor_info *t = gguf_tensor(g, i);
        inside(data, size, t->name.ptr, t->name.len);
        inside(data, size, t->data, t->nbytes);
        if (t->nbytes == 0 || t->n_dims < 1 || t->n_dims > 4) abort();
        volatile uint8_t x = ((const uint8_t *)t->data)[0] ^ ((const uint8_t *)t->data)[t->nbytes - 1];
        (void)x;
    }
    gguf_close(g);

    struct model_file *mf;
    if (model_file_open_gguf_mem(data, size, &mf, err) == FERRY_OK) {
        const struct llm_hparams *hp = &mf->hp;
        if (hp->n_heads % hp->n_kv_heads || hp->head_dim < 1 || hp->n_vocab < 1) abort();
        for (int i = 0; i < mf->n_tensors; i++)
            inside(data, size, mf->tensors[i].data, mf->tensors[i].nbytes);
        if (!model_file_tensor(mf, "token_embd.weight")) abort();
        model_file_close(mf);
    } else if (err[0] == '\0') {
        abort();
    }
    return 0;
}
