/* mixtral — Mixtral 8x7B / 8x22B: the Llama attention block with a Mixture-of-Experts FFN in every layer (8
 * SwiGLU experts of intermediate_size, the softmax's top 2 per token, their probabilities divided by their
 * sum). llama.cpp writes these checkpoints as "llama" GGUF files with llama.expert_count (read as this
 * family, weights/model_file.c), interleaved rotary rows and the experts stacked per layer
 * (ffn_{gate,up,down}_exps); transformers writes block_sparse_moe.experts.E.w1/w3/w2 (gate/up/down) one per
 * expert, stacked at load. The config's sliding_window is ignored (full attention), with a warning when it
 * is shorter than the context.
 */
#include <jansson.h>

#include "kernels/core/status.h"
#include "weights/arch/arch.h"
#include "weights/model_file.h"

/*   Llama's attention;  x += D; xn = norm(x)·ffn_norm;  D = experts(xn). */
static const struct layer_op mixtral_ops[] = {
    {LOP_ADD_NORM, LACT_X, LACT_XN, LAYER_ATTN_NORM},
    {LOP_LINEAR, LACT_XN, LACT_QKV, LAYER_QKV},
    {LOP_ROPE_KV, LACT_QKV, LACT_Q, 0},
    {LOP_ATTENTION, LACT_Q, LACT_ATT, 0},
    {LOP_LINEAR, LACT_ATT, LACT_D, LAYER_O},
    {LOP_ADD_NORM, LACT_X, LACT_XN, LAYER_FFN_NORM},
    {LOP_MOE, LACT_XN, LACT_D, 0},
};
static const struct layer_program mixtral_program = {
    .ops = mixtral_ops, .n_ops = sizeof mixtral_ops / sizeof mixtral_ops[0], .kv_first = 2, .kv_last = 3};

static const struct arch_tensor mixtral_tensors[] = {
    ARCH_LLAMA_ATTN_TENSORS,
    {ARCH_ROLE_ROUTER, ARCH_NEED_ALWAYS, "ffn_gate_inp.weight", "block_sparse_moe.gate.weight"},
    {ARCH_ROLE_EXP_GATE, ARCH_NEED_ALWAYS, "ffn_gate_exps.weight", "block_sparse_moe.experts.*.w1.weight"},
    {ARCH_ROLE_EXP_UP, ARCH_NEED_ALWAYS, "ffn_up_exps.weight", "block_sparse_moe.experts.*.w3.weight"},
    {ARCH_ROLE_EXP_DOWN, ARCH_NEED_ALWAYS, "ffn_down_exps.weight", "block_sparse_moe.experts.*.w2.weight"},
};

static int mixtral_hf_hparams(json_t *c, struct llm_hparams *hp, char *err)
{
    json_t *n = json_object_get(c, "num_local_experts"), *k = json_object_get(c, "num_experts_per_tok");
    if (!json_is_integer(n) || !json_is_integer(k) || json_integer_value(n) < 1 ||
        json_integer_value(n) > (1 << 20) || json_integer_value(k) < 1 || json_integer_value(k) > (1 << 20))
        return ferry_fail(err, FERRY_ERR_FORMAT,
                          "config.json: num_local_experts and num_experts_per_tok must be positive integers");
    hp->n_expert = (int)json_integer_value(n);
    hp->n_expert_used = (int)json_integer_value(k);
    hp->expert_ffn_dim = hp->ffn_dim;
    hp->expert_norm_topk = 1;
    return FERRY_OK;
}

const struct arch_family arch_mixtral = {
    .name = "mixtral",
    .title = "Mixtral",
    .sizes = "8x7B, 8x22B",
    .notes = "the Llama block with a top-2 Mixture of Experts FFN; GGUF: `llama` with experts",
    .gguf_names = (const char *const[]){NULL},
    .hf_classes = (const char *const[]){"MixtralForCausalLM", NULL},
    .hf_types = (const char *const[]){"mixtral", NULL},
    .gguf_writes = "llama",
    .gguf_rope = ROPE_STYLE_INTERLEAVED,
    .hf_window_warn = 1,
    .tensors = mixtral_tensors,
    .n_tensors = sizeof mixtral_tensors / sizeof mixtral_tensors[0],
    .program = &mixtral_program,
    .chat_template = "chatml",
    .gguf_hparams = arch_moe_gguf_hparams,
    .hf_hparams = mixtral_hf_hparams,
    .gguf_write = arch_moe_gguf_write,
};
