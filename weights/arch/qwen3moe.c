/* qwen3moe — Qwen3-MoE (Qwen3-30B-A3B, Qwen3-235B-A22B and their successors): Qwen3's attention block
 * (QK-norm, explicit head_dim, rotate-half rotary) with a Mixture-of-Experts FFN in every layer: a router
 * (n_expert, dim), the softmax's top n_expert_used experts per token weighted by their probabilities divided
 * by their sum (norm_topk_prob, which every released checkpoint sets), each expert a SwiGLU FFN of
 * moe_intermediate_size. No shared expert.
 * Files: GGUF (llama.cpp's `qwen3moe`) stores each layer's experts stacked, ffn_{gate,up,down}_exps of
 * ne {dim, ffn, n_expert} / {ffn, dim, n_expert}; transformers writes one matrix per expert,
 * mlp.experts.E.{gate,up,down}_proj.weight, which the loader stacks the same way. Checkpoints whose dense
 * layers are mixed in (decoder_sparse_step > 1, mlp_only_layers) are refused.
 */
#include <jansson.h>
#include <stdio.h>
#include <string.h>

#include "kernels/core/status.h"
#include "weights/arch/arch.h"
#include "weights/gguf.h"
#include "weights/gguf_write.h"
#include "weights/model_file.h"

/*   x += D; xn = norm(x)·attn_norm;  Qwen3's attention;  x += D; xn = norm(x)·ffn_norm;  D = experts(xn). */
static const struct layer_op qwen3moe_ops[] = {
    {LOP_ADD_NORM, LACT_X, LACT_XN, LAYER_ATTN_NORM},
    {LOP_LINEAR, LACT_XN, LACT_QKV, LAYER_QKV},
    {LOP_QK_NORM, LACT_QKV, LACT_QKV, 0},
    {LOP_ROPE_KV, LACT_QKV, LACT_Q, 0},
    {LOP_ATTENTION, LACT_Q, LACT_ATT, 0},
    {LOP_LINEAR, LACT_ATT, LACT_D, LAYER_O},
    {LOP_ADD_NORM, LACT_X, LACT_XN, LAYER_FFN_NORM},
    {LOP_MOE, LACT_XN, LACT_D, 0},
};
static const struct layer_program qwen3moe_program = {
    .ops = qwen3moe_ops, .n_ops = sizeof qwen3moe_ops / sizeof qwen3moe_ops[0], .kv_first = 3, .kv_last = 4};

static const struct arch_tensor qwen3moe_tensors[] = {
    ARCH_LLAMA_ATTN_TENSORS,
    {ARCH_ROLE_Q_NORM, ARCH_NEED_ALWAYS, "attn_q_norm.weight", "self_attn.q_norm.weight"},
    {ARCH_ROLE_K_NORM, ARCH_NEED_ALWAYS, "attn_k_norm.weight", "self_attn.k_norm.weight"},
    {ARCH_ROLE_ROUTER, ARCH_NEED_ALWAYS, "ffn_gate_inp.weight", "mlp.gate.weight"},
    {ARCH_ROLE_EXP_GATE, ARCH_NEED_ALWAYS, "ffn_gate_exps.weight", "mlp.experts.*.gate_proj.weight"},
    {ARCH_ROLE_EXP_UP, ARCH_NEED_ALWAYS, "ffn_up_exps.weight", "mlp.experts.*.up_proj.weight"},
    {ARCH_ROLE_EXP_DOWN, ARCH_NEED_ALWAYS, "ffn_down_exps.weight", "mlp.experts.*.down_proj.weight"},
};

#define KEY(k) (snprintf(key, sizeof key, "%s.%s", arch, k), key)

int arch_moe_gguf_hparams(const struct gguf *g, struct llm_hparams *hp, char *err)
{
    const char *arch = hp->arch;
    char key[96];
    uint32_t u[3];
    static const char *const keys[3] = {"expert_count", "expert_used_count", "expert_feed_forward_length"};
    for (int i = 0; i < 3; i++) {
        /* Mixtral's llama files have no expert_feed_forward_length: the experts are the FFN. */
        if (i == 2 && gguf_get_u32(g, KEY(keys[i]), &u[i]) == FERRY_ERR_NOT_FOUND)
            u[i] = (uint32_t)hp->ffn_dim;
        else if (gguf_get_u32(g, KEY(keys[i]), &u[i]) != FERRY_OK || u[i] < 1 || u[i] > (1u << 30))
            return ferry_fail(err, FERRY_ERR_FORMAT, "key '%s' is missing or not a positive integer", key);
    }
    hp->n_expert = (int)u[0], hp->n_expert_used = (int)u[1], hp->expert_ffn_dim = (int)u[2];
    /* llama.cpp always normalises Qwen3-MoE's top-k weights; the key (which it defines) can say otherwise. */
    hp->expert_norm_topk = 1;
    int b;
    if (gguf_get_bool(g, KEY("expert_weights_norm"), &b) == FERRY_OK) hp->expert_norm_topk = b;
    return FERRY_OK;
}

int arch_moe_gguf_write(struct gguf_writer *w, const struct llm_hparams *hp, const char *arch, char *err)
{
    char key[96];
    int rc;
    if ((rc = gguf_writer_kv_u32(w, KEY("expert_count"), (uint32_t)hp->n_expert, err))) return rc;
    if ((rc = gguf_writer_kv_u32(w, KEY("expert_used_count"), (uint32_t)hp->n_expert_used, err))) return rc;
    if ((rc = gguf_writer_kv_u32(w, KEY("expert_feed_forward_length"), (uint32_t)hp->expert_ffn_dim, err)))
        return rc;
    return hp->expert_norm_topk ? FERRY_OK : gguf_writer_kv_bool(w, KEY("expert_weights_norm"), 0, err);
}

/* A positive integer of config.json; num_experts may be spelled num_local_experts (transformers 5 writes). */
static int cfg_int(json_t *c, const char *k1, const char *k2, int *out, char *err)
{
    json_t *v = json_object_get(c, k1);
    if (!json_is_integer(v) && k2) v = json_object_get(c, k2);
    if (!json_is_integer(v) || json_integer_value(v) < 1 || json_integer_value(v) > (1 << 30))
        return ferry_fail(err, FERRY_ERR_FORMAT, "config.json: '%s' is missing or not a positive integer",
                          k1);
    *out = (int)json_integer_value(v);
    return FERRY_OK;
}

int arch_qwen3moe_hf_hparams(json_t *c, struct llm_hparams *hp, char *err)
{
    int rc;
    if ((rc = cfg_int(c, "num_experts", "num_local_experts", &hp->n_expert, err)) ||
        (rc = cfg_int(c, "num_experts_per_tok", NULL, &hp->n_expert_used, err)) ||
        (rc = cfg_int(c, "moe_intermediate_size", NULL, &hp->expert_ffn_dim, err)))
        return rc;
    json_t *norm = json_object_get(c, "norm_topk_prob");
    hp->expert_norm_topk = norm && !json_is_null(norm) ? json_is_true(norm) : 0;
    json_t *step = json_object_get(c, "decoder_sparse_step"), *only = json_object_get(c, "mlp_only_layers");
    if ((step && !json_is_null(step) && (!json_is_integer(step) || json_integer_value(step) != 1)) ||
        (only && !json_is_null(only) && (!json_is_array(only) || json_array_size(only) != 0)))
        return ferry_fail(err, FERRY_ERR_UNSUPPORTED,
                          "config.json: dense layers among the expert layers (decoder_sparse_step != 1 or "
                          "mlp_only_layers) are not supported");
    return FERRY_OK;
}

const struct arch_family arch_qwen3moe = {
    .name = "qwen3moe",
    .title = "Qwen3-MoE",
    .sizes = "30B-A3B, 235B-A22B",
    .notes = "Qwen3 attention, every FFN a softmax top-k Mixture of Experts",
    .gguf_names = (const char *const[]){"qwen3moe", NULL},
    .hf_classes = (const char *const[]){"Qwen3MoeForCausalLM", NULL},
    .hf_types = (const char *const[]){"qwen3_moe", NULL},
    .gguf_writes = "qwen3moe",
    .gguf_rope = ROPE_STYLE_HALF,
    .tensors = qwen3moe_tensors,
    .n_tensors = sizeof qwen3moe_tensors / sizeof qwen3moe_tensors[0],
    .program = &qwen3moe_program,
    .chat_template = "chatml",
    .gguf_hparams = arch_moe_gguf_hparams,
    .hf_hparams = arch_qwen3moe_hf_hparams,
    .gguf_write = arch_moe_gguf_write,
};
