/* qwen35moe — Qwen3.5 / 3.6 Mixture of Experts (35B-A3B, 122B-A10B, 397B-A17B): the dense Qwen3.5 layers
 * (qwen35.c: gated DeltaNet in three of every four layers, gated full attention in the others) with every
 * FFN a sparse MoE plus a shared expert (LOP_MOE_SHARED): the router's softmax, its top n_expert_used
 * experts weighted by their probabilities divided by their sum (transformers' Qwen3_5MoeTopKRouter always
 * normalises; llama.cpp's qwen35moe graph too), each a SwiGLU FFN of expert_feed_forward_length; then a
 * dense SwiGLU FFN of expert_shared_feed_forward_length on every token, scaled by sigmoid(x · gate) and
 * added. GGUF files as llama.cpp's converter writes the "qwen35moe" architecture: qwen35's keys and mixer
 * tensors, the experts stacked (ffn_{gate,up,down}_exps, split from transformers' fused gate_up_proj), the
 * router ffn_gate_inp, the shared expert ffn_{gate,up,down}_shexp and its gate ffn_gate_inp_shexp (ne {dim}
 * or {dim, 1}). feed_forward_length may be absent (transformers' config has no intermediate_size): the shared
 * expert's size stands for it. Hugging Face checkpoints (Qwen3_5MoeForCausalLM, the language model of
 * Qwen3_5MoeForConditionalGeneration) are read as qwen35's (arch_qwen35_hf_tensors), their experts one tensor
 * each (as save_pretrained writes them) or fused per layer (as the released checkpoints have them), stacked
 * at load; the router and the shared expert need no rearranging.
 */
#include <jansson.h>
#include <stdint.h>
#include <stdio.h>

#include "kernels/core/status.h"
#include "weights/arch/qwen35.h"
#include "weights/gguf.h"
#include "weights/gguf_write.h"
#include "weights/model_file.h"

static const struct layer_op qwen35moe_attn_ops[] = {
    ARCH_QWEN35_ATTN_OPS,
    {LOP_MOE_SHARED, LACT_XN, LACT_D, 0},
};
const struct layer_program arch_qwen35moe_attn_program = {.ops = qwen35moe_attn_ops,
                                                          .n_ops = sizeof qwen35moe_attn_ops /
                                                                   sizeof qwen35moe_attn_ops[0],
                                                          .kv_first = 4,
                                                          .kv_last = 5};

static const struct layer_op qwen35moe_linear_ops[] = {
    ARCH_QWEN35_LINEAR_OPS,
    {LOP_MOE_SHARED, LACT_XN, LACT_D, 0},
};
const struct layer_program arch_qwen35moe_linear_program = {.ops = qwen35moe_linear_ops,
                                                            .n_ops = sizeof qwen35moe_linear_ops /
                                                                     sizeof qwen35moe_linear_ops[0],
                                                            .kv_first = -1,
                                                            .kv_last = -1};

static const struct arch_tensor qwen35moe_tensors[] = {
    ARCH_QWEN35_MIXER_TENSORS,
    ARCH_QWEN35_MOE_TENSORS,
};

int arch_qwen35moe_gguf_hparams(const struct gguf *g, struct llm_hparams *hp, char *err)
{
    int rc;
    if ((rc = arch_qwen35_gguf_hparams(g, hp, err)) || (rc = arch_moe_gguf_hparams(g, hp, err))) return rc;
    /* The shared expert's size; llama.cpp falls back to feed_forward_length, as here. */
    char key[96];
    uint32_t u = 0;
    snprintf(key, sizeof key, "%s.expert_shared_feed_forward_length", hp->arch);
    rc = gguf_get_u32(g, key, &u);
    if (rc == FERRY_OK && u >= 1 && u <= (1u << 30))
        hp->ffn_dim = (int)u;
    else if (rc != FERRY_ERR_NOT_FOUND)
        return ferry_fail(err, FERRY_ERR_FORMAT, "key '%s' is not a positive integer", key);
    if (hp->ffn_dim < 1)
        return ferry_fail(err, FERRY_ERR_FORMAT, "missing key '%s' (and %s.feed_forward_length)", key,
                          hp->arch);
    return FERRY_OK;
}

int arch_qwen35moe_hf_hparams(json_t *c, struct llm_hparams *hp, char *err)
{
    int rc;
    if ((rc = arch_qwen35_hf_hparams(c, hp, err)) || (rc = arch_qwen3moe_hf_hparams(c, hp, err))) return rc;
    json_t *sh = json_object_get(c, "shared_expert_intermediate_size");
    if (!json_is_integer(sh) || json_integer_value(sh) < 1 || json_integer_value(sh) > (1 << 30))
        return ferry_fail(
            err, FERRY_ERR_FORMAT,
            "config.json: 'shared_expert_intermediate_size' is missing or not a positive integer");
    hp->ffn_dim = (int)json_integer_value(sh);
    json_t *norm = json_object_get(c, "norm_topk_prob");
    if (!norm || json_is_null(norm)) hp->expert_norm_topk = 1; /* Qwen3.5-MoE's router always normalises */
    if (hp->n_expert_used > hp->n_expert)
        return ferry_fail(err, FERRY_ERR_FORMAT, "config.json: num_experts_per_tok %d exceeds num_experts %d",
                          hp->n_expert_used, hp->n_expert);
    return FERRY_OK;
}

int arch_qwen35moe_gguf_write(struct gguf_writer *w, const struct llm_hparams *hp, const char *arch,
                              char *err)
{
    char key[96];
    int rc;
    if ((rc = arch_qwen35_gguf_write(w, hp, arch, err)) || (rc = arch_moe_gguf_write(w, hp, arch, err)))
        return rc;
    snprintf(key, sizeof key, "%s.expert_shared_feed_forward_length", arch);
    return gguf_writer_kv_u32(w, key, (uint32_t)hp->ffn_dim, err);
}

const struct arch_family arch_qwen35moe = {
    .name = "qwen35moe",
    .title = "Qwen3.5 / 3.6 (MoE)",
    .sizes = "35B-A3B, 122B-A10B, 397B-A17B",
    .notes = "qwen35's hybrid layers; every FFN softmax top-k experts plus a sigmoid-gated shared expert",
    .gguf_names = (const char *const[]){"qwen35moe", NULL},
    .hf_classes = (const char *const[]){"Qwen3_5MoeForCausalLM", "Qwen3_5MoeForConditionalGeneration", NULL},
    .hf_types = (const char *const[]){"qwen3_5_moe_text", "qwen3_5_moe", NULL},
    .gguf_writes = "qwen35moe",
    .gguf_rope = ROPE_STYLE_HALF,
    .tensors = qwen35moe_tensors,
    .n_tensors = sizeof qwen35moe_tensors / sizeof qwen35moe_tensors[0],
    .program = &arch_qwen35moe_attn_program,
    .program_recurrent = &arch_qwen35moe_linear_program,
    .chat_template = "chatml",
    .gguf_hparams = arch_qwen35moe_gguf_hparams,
    .gguf_ffn_optional = 1,
    .hf_hparams = arch_qwen35moe_hf_hparams,
    .hf_tensors = arch_qwen35_hf_tensors,
    .gguf_write = arch_qwen35moe_gguf_write,
    .nextn = &arch_qwen35_nextn,
};
