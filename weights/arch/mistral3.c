/* mistral3 — Mistral Small 3.x and Ministral 3 text models (GGUF "mistral3" as llama.cpp's converter writes
 * them; transformers' Ministral3ForCausalLM, model_type "ministral3").
 *
 * The Llama block (llama.c) with two things of its own, both in the rotary step: YaRN (Ministral 3: factor
 * 16 over 16384 positions, mscale and mscale_all_dim 1, so an attention factor of 1; read with the common
 * rope fields) and the Llama 4 attention temperature: after rotation the queries at position p are
 * multiplied by 1 + beta · ln(1 + floor(p / original context)) (transformers' get_llama_4_attn_scale,
 * rope_parameters.llama_4_scaling_beta; GGUF attention.temperature_scale with
 * rope.scaling.original_context_length). GGUF files have llama.cpp's permuted q/k rows. Mistral Small 3.1 /
 * 3.2 have neither (plain rope). Only the text model: the vision tower and projector live in their own
 * mmproj GGUF, which ferry does not read (architecture "clip" is refused by name), and Hugging Face
 * Mistral3ForConditionalGeneration directories are refused (convert them, or use the text checkpoint).
 * Expert layers of this architecture (Mistral 4's GGUF) are refused.
 */
#include <jansson.h>
#include <math.h>
#include <stdio.h>

#include "kernels/core/status.h"
#include "weights/arch/arch.h"
#include "weights/gguf.h"
#include "weights/gguf_write.h"
#include "weights/model_file.h"

static const struct arch_tensor mistral3_tensors[] = {ARCH_LLAMA_TENSORS};

#define KEY(k) (snprintf(key, sizeof key, "%s.%s", hp->arch, k), key)

/* The temperature's beta and its length (the original context), checked. */
static int set_temp(struct llm_hparams *hp, double beta, const char *what, char *err)
{
    if (beta == 0) return FERRY_OK;
    if (!(fabs(beta) < 1e6) || hp->rope_scaling.orig_ctx < 1)
        return ferry_fail(err, FERRY_ERR_FORMAT, "%s %g needs a finite value and an original context length",
                          what, beta);
    hp->attn_temp_beta = (float)beta;
    hp->attn_temp_len = hp->rope_scaling.orig_ctx;
    return FERRY_OK;
}

static int mistral3_gguf_hparams(const struct gguf *g, struct llm_hparams *hp, char *err)
{
    char key[96];
    uint32_t ne = 0;
    if (gguf_get_u32(g, KEY("expert_count"), &ne) == FERRY_OK && ne > 0)
        return ferry_fail(err, FERRY_ERR_UNSUPPORTED, "key '%s': expert layers of mistral3 are not supported",
                          key);
    float beta = 0;
    int rc = gguf_get_f32(g, KEY("attention.temperature_scale"), &beta);
    if (rc == FERRY_ERR_NOT_FOUND) return FERRY_OK;
    if (rc) return ferry_fail(err, FERRY_ERR_FORMAT, "key '%s' is not a float", key);
    return set_temp(hp, beta, key, err);
}

static int mistral3_hf_hparams(json_t *c, struct llm_hparams *hp, char *err)
{
    json_t *b = json_object_get(json_object_get(c, "rope_parameters"), "llama_4_scaling_beta");
    if (!b) b = json_object_get(json_object_get(c, "rope_scaling"), "llama_4_scaling_beta");
    if (!b || json_is_null(b)) return FERRY_OK;
    if (!json_is_number(b))
        return ferry_fail(err, FERRY_ERR_FORMAT, "config.json: llama_4_scaling_beta is not a number");
    return set_temp(hp, json_number_value(b), "config.json: llama_4_scaling_beta", err);
}

/* conversion/mistral3.py: the temperature's beta (its length is the original context, written with YaRN). */
static int mistral3_gguf_write(struct gguf_writer *w, const struct llm_hparams *hp, const char *arch,
                               char *err)
{
    char key[96];
    if (hp->attn_temp_beta == 0) return FERRY_OK;
    if (hp->rope_scaling.orig_ctx != hp->attn_temp_len)
        return ferry_fail(err, FERRY_ERR_UNSUPPORTED,
                          "an attention temperature over %d positions with an original context of %d",
                          hp->attn_temp_len, hp->rope_scaling.orig_ctx);
    snprintf(key, sizeof key, "%s.attention.temperature_scale", arch);
    return gguf_writer_kv_f32(w, key, hp->attn_temp_beta, err);
}

const struct arch_family arch_mistral3 = {
    .name = "mistral3",
    .title = "Mistral Small 3.x, Ministral 3 (text)",
    .sizes = "3B-24B",
    .notes = "the Llama block with YaRN and the Llama 4 attention temperature by position (queries "
             "scaled past the original context); text model only",
    .gguf_names = (const char *const[]){"mistral3", NULL},
    .hf_classes = (const char *const[]){"Ministral3ForCausalLM", NULL},
    .hf_types = (const char *const[]){"ministral3", NULL},
    .gguf_writes = "mistral3",
    .gguf_rope = ROPE_STYLE_INTERLEAVED,
    .hf_window_warn = 1,
    .tensors = mistral3_tensors,
    .n_tensors = sizeof mistral3_tensors / sizeof mistral3_tensors[0],
    .program = &arch_llama_program,
    .chat_template = "mistral",
    .gguf_hparams = mistral3_gguf_hparams,
    .hf_hparams = mistral3_hf_hparams,
    .gguf_write = mistral3_gguf_write,
};
