/* llama — Llama 1/2/3 (and the checkpoints built on its block: SmolLM, TinyLlama, Mistral's GGUF files).
 *
 * Block: x += attn(rmsnorm(x)); x += ffn(rmsnorm(x)), with SwiGLU ffn = down(silu(gate(x)) * up(x)) and
 * rotary attention over grouped-query heads; optional q/k/v biases when the file has them. llama.cpp's
 * converter permutes the q/k rows of its GGUF files so rotary pairs are adjacent (interleaved layout).
 */
#include "weights/arch/arch.h"
#include "weights/model_file.h"

extern const struct arch_family arch_mixtral;

/*   x += D; xn = norm(x)·attn_norm;  qkv = xn·Wqkvᵀ + b;  q, cache = rope(qkv);  att = attention(q, cache);
 *   D = att·Woᵀ;  x += D; xn = norm(x)·ffn_norm;  gu = xn·Wguᵀ;  h = silu(g)·u;  D = h·Wdownᵀ. */
static const struct layer_op llama_ops[] = {
    {LOP_ADD_NORM, LACT_X, LACT_XN, LAYER_ATTN_NORM},
    {LOP_LINEAR, LACT_XN, LACT_QKV, LAYER_QKV},
    {LOP_ROPE_KV, LACT_QKV, LACT_Q, 0},
    {LOP_ATTENTION, LACT_Q, LACT_ATT, 0},
    {LOP_LINEAR, LACT_ATT, LACT_D, LAYER_O},
    {LOP_ADD_NORM, LACT_X, LACT_XN, LAYER_FFN_NORM},
    {LOP_LINEAR, LACT_XN, LACT_GU, LAYER_GU},
    {LOP_SILU_MUL, LACT_GU, LACT_H, 0},
    {LOP_LINEAR, LACT_H, LACT_D, LAYER_DOWN},
};
const struct layer_program arch_llama_program = {
    .ops = llama_ops, .n_ops = sizeof llama_ops / sizeof llama_ops[0], .kv_first = 2, .kv_last = 3};

static const struct arch_tensor llama_tensors[] = {ARCH_LLAMA_TENSORS};

/* llama-model.cpp: 80 layers is 70B with grouped-query attention (65B without). */
int arch_llama_is_70b(const struct llm_hparams *hp)
{
    return hp->n_layers == 80 && hp->n_heads != hp->n_kv_heads;
}

const struct arch_family arch_llama = {
    .name = "llama",
    .title = "Llama 2 / 3 / 3.1-3.3, SmolLM, TinyLlama",
    .sizes = "135M-70B",
    .notes = "the reference block: RMSNorm, SwiGLU, GQA; Llama 3 rope scaling; GGUF q/k rows interleaved",
    .gguf_names = (const char *const[]){"llama", NULL},
    .hf_classes = (const char *const[]){"LlamaForCausalLM", NULL},
    .hf_types = (const char *const[]){"llama", NULL},
    .gguf_writes = "llama",
    .gguf_rope = ROPE_STYLE_INTERLEAVED,
    .tensors = llama_tensors,
    .n_tensors = sizeof llama_tensors / sizeof llama_tensors[0],
    .program = &arch_llama_program,
    .is_70b = arch_llama_is_70b,
    .chat_template = "chatml",
    .gguf_experts = &arch_mixtral,
};
