/* qwen3 — Qwen3 dense (0.6B-32B): the Llama block with QK-norm (each query and key head RMS-normed with its
 * own head_dim weights before rotary), no biases, an explicit head_dim (128 where hidden / heads differs),
 * rotate-half rotary pairs in its GGUF files too (llama.cpp's NEOX rope, no permutation).
 * Chat: ChatML with <think> reasoning and Hermes-style <tool_call> tools, as its template renders them (the
 * template comes with every checkpoint; runtime/tool_call.c and runtime/reasoning.c read its conventions).
 */
#include "weights/arch/arch.h"

/*   x += D; xn = norm(x)·attn_norm;  qkv = xn·Wqkvᵀ;  q, k = per-head norm(q)·q_norm, norm(k)·k_norm;
 *   q, cache = rope(qkv);  att = attention(q, cache);  D = att·Woᵀ;  then Llama's SwiGLU block. */
static const struct layer_op qwen3_ops[] = {
    {LOP_ADD_NORM, LACT_X, LACT_XN, LAYER_ATTN_NORM},
    {LOP_LINEAR, LACT_XN, LACT_QKV, LAYER_QKV},
    {LOP_QK_NORM, LACT_QKV, LACT_QKV, 0},
    {LOP_ROPE_KV, LACT_QKV, LACT_Q, 0},
    {LOP_ATTENTION, LACT_Q, LACT_ATT, 0},
    {LOP_LINEAR, LACT_ATT, LACT_D, LAYER_O},
    {LOP_ADD_NORM, LACT_X, LACT_XN, LAYER_FFN_NORM},
    {LOP_LINEAR, LACT_XN, LACT_GU, LAYER_GU},
    {LOP_SILU_MUL, LACT_GU, LACT_H, 0},
    {LOP_LINEAR, LACT_H, LACT_D, LAYER_DOWN},
};
static const struct layer_program qwen3_program = {
    .ops = qwen3_ops, .n_ops = sizeof qwen3_ops / sizeof qwen3_ops[0], .kv_first = 3, .kv_last = 4};

static const struct arch_tensor qwen3_tensors[] = {
    ARCH_LLAMA_TENSORS,
    {ARCH_ROLE_Q_NORM, ARCH_NEED_ALWAYS, "attn_q_norm.weight", "self_attn.q_norm.weight"},
    {ARCH_ROLE_K_NORM, ARCH_NEED_ALWAYS, "attn_k_norm.weight", "self_attn.k_norm.weight"},
};

const struct arch_family arch_qwen3 = {
    .name = "qwen3",
    .title = "Qwen3 (dense)",
    .sizes = "0.6B-32B",
    .notes = "per-head QK-norm, explicit head_dim; `<think>` reasoning, Hermes `<tool_call>` tools",
    .gguf_names = (const char *const[]){"qwen3", NULL},
    .hf_classes = (const char *const[]){"Qwen3ForCausalLM", NULL},
    .hf_types = (const char *const[]){"qwen3", NULL},
    .gguf_writes = "qwen3",
    .gguf_rope = ROPE_STYLE_HALF,
    .tensors = qwen3_tensors,
    .n_tensors = sizeof qwen3_tensors / sizeof qwen3_tensors[0],
    .program = &qwen3_program,
    .chat_template = "chatml",
};
