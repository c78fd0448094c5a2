/* hf_export — Hugging Face hyperparameters and tokenizer as llama.cpp GGUF metadata (see hf_export.h). */
#include "weights/hf_export.h"

#include <stdio.h>
#include <string.h>

#include "kernels/core/status.h"

static const char *base_name(const char *path)
{
    const char *e = path + strlen(path);
    while (e > path && e[-1] == '/') e--;
    const char *b = e;
    while (b > path && b[-1] != '/') b--;
    return b;
}

int hf_export_metadata(struct gguf_writer *w, const struct model_file *mf, const char *arch, char err[256])
{
    const struct llm_hparams *hp = &mf->hp;
    char k[128];
    int rc;
#define KEY(suffix) (snprintf(k, sizeof k, "%s.%s", arch, suffix), k)
#define TRY(call)                                                                                            \
    do {                                                                                                     \
        if ((rc = (call))) return rc;                                                                        \
    } while (0)
    TRY(gguf_writer_kv_str(w, "general.architecture", arch, strlen(arch), err));
    TRY(gguf_writer_kv_str(w, "general.type", "model", 5, err));
    const char *name = mf->dir ? base_name(mf->dir) : "model";
    const size_t name_len = strcspn(name, "/");
    TRY(gguf_writer_kv_str(w, "general.name", name, name_len, err));
    TRY(gguf_writer_kv_u32(w, KEY("block_count"), (uint32_t)hp->n_layers, err));
    TRY(gguf_writer_kv_u32(w, KEY("context_length"), (uint32_t)hp->ctx_train, err));
    TRY(gguf_writer_kv_u32(w, KEY("embedding_length"), (uint32_t)hp->dim, err));
    TRY(gguf_writer_kv_u32(w, KEY("feed_forward_length"), (uint32_t)hp->ffn_dim, err));
    TRY(gguf_writer_kv_u32(w, KEY("attention.head_count"), (uint32_t)hp->n_heads, err));
    TRY(gguf_writer_kv_u32(w, KEY("attention.head_count_kv"), (uint32_t)hp->n_kv_heads, err));
    TRY(gguf_writer_kv_f32(w, KEY("rope.freq_base"), hp->rope_theta, err));
    TRY(gguf_writer_kv_f32(w, KEY("attention.layer_norm_rms_epsilon"), hp->norm_eps, err));
    if (hp->head_dim * hp->n_heads != hp->dim) {
        TRY(gguf_writer_kv_u32(w, KEY("attention.key_length"), (uint32_t)hp->head_dim, err));
        TRY(gguf_writer_kv_u32(w, KEY("attention.value_length"), (uint32_t)hp->head_dim, err));
    }
    TRY(gguf_writer_kv_u32(w, KEY("vocab_size"), (uint32_t)hp->n_vocab, err));
    TRY(gguf_writer_kv_u32(w, KEY("rope.dimension_count"), (uint32_t)hp->rope_dim, err));
    if (hp->rope_scaling.type == ROPE_SCALING_LINEAR) {
        TRY(gguf_writer_kv_str(w, KEY("rope.scaling.type"), "linear", 6, err));
        TRY(gguf_writer_kv_f32(w, KEY("rope.scaling.factor"), hp->rope_scaling.factor, err));
    } else if (hp->rope_scaling.type == ROPE_SCALING_LLAMA3) {
        return ferry_fail(err, FERRY_ERR_UNSUPPORTED, "llama3 rope scaling is not exported yet");
    }
#undef KEY
#undef TRY
    return FERRY_OK;
}
