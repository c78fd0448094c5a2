/* gptoss — OpenAI's gpt-oss (gpt-oss-20b, gpt-oss-120b; GGUF "gpt-oss", transformers' GptOssForCausalLM).
 *
 * Block: x += o(attn(rmsnorm(x))) + o bias; x += experts(rmsnorm(x)). Attention: grouped-query heads with
 * q/k/v/o biases, rotate-half rotary with YaRN scaling (its attention factor squared in the query scale),
 * and a learned sink per head in every softmax's denominator; layers alternate between a sliding window
 * (even layers, 128 positions) and full attention, both with the same rotary. Experts: the router's logits
 * plus its bias, the top-k logits softmaxed, each chosen expert's gate and up products plus biases through
 * the clamped SwiGLU (g = min(gate, 7), u = clamp(up, ±7), g·σ(1.702 g)·(u + 1)), its down product plus bias,
 * weighted and summed. llama.cpp's files store the experts stacked (ffn_{gate,up,down}_exps, MXFP4 in the
 * released ones) with their biases as (n_expert, rows) tables, the router as ffn_gate_inp.{weight,bias}, the
 * pre-FFN norm as post_attention_norm and the sinks as attn_sinks.weight.
 * GGUF keys beyond the common ones: the expert keys, attention.sliding_window (required),
 * attention.sliding_window_pattern (default 2), rope.freq_base_swa (default rope.freq_base). GGUF has no key
 * for YaRN's truncation: the released checkpoints' config says false, and transformers is the reference, so
 * the correction range is not rounded (llama.cpp rounds it). The clamped SwiGLU's constants are llama.cpp's
 * (it stores none either). Hugging Face directories are not read: transformers stores these experts
 * transposed with gate and up interleaved (and the released ones in MXFP4 blocks); convert them with
 * llama.cpp's convert_hf_to_gguf.py.
 * Chat: the harmony format, from the file's own template.
 */
#include <stdio.h>
#include <string.h>

#include "kernels/core/status.h"
#include "weights/arch/arch.h"
#include "weights/gguf.h"
#include "weights/gguf_write.h"
#include "weights/model_file.h"

/*   x += D; xn = norm(x)·attn_norm;  qkv = xn·Wqkvᵀ + b;  q, cache = rope(qkv);  att = attention with sinks;
 *   D = att·Woᵀ + bo;  x += D; xn = norm(x)·ffn_norm;  D = clamped experts(xn). */
static const struct layer_op gptoss_ops[] = {
    {LOP_ADD_NORM, LACT_X, LACT_XN, LAYER_ATTN_NORM},
    {LOP_LINEAR, LACT_XN, LACT_QKV, LAYER_QKV},
    {LOP_ROPE_KV, LACT_QKV, LACT_Q, 0},
    {LOP_ATTENTION_SINKS, LACT_Q, LACT_ATT, 0},
    {LOP_LINEAR, LACT_ATT, LACT_D, LAYER_O},
    {LOP_ADD_NORM, LACT_X, LACT_XN, LAYER_FFN_NORM},
    {LOP_MOE_CLAMPED, LACT_XN, LACT_D, 0},
};
static const struct layer_program gptoss_program = {
    .ops = gptoss_ops, .n_ops = sizeof gptoss_ops / sizeof gptoss_ops[0], .kv_first = 2, .kv_last = 3};

/* HF names as transformers writes them; the experts' are its stacked, transposed tensors (not read). */
static const struct arch_tensor gptoss_tensors[] = {
    {ARCH_ROLE_ATTN_NORM, ARCH_NEED_ALWAYS, "attn_norm.weight", "input_layernorm.weight"},
    {ARCH_ROLE_WQ, ARCH_NEED_ALWAYS, "attn_q.weight", "self_attn.q_proj.weight"},
    {ARCH_ROLE_WK, ARCH_NEED_ALWAYS, "attn_k.weight", "self_attn.k_proj.weight"},
    {ARCH_ROLE_WV, ARCH_NEED_ALWAYS, "attn_v.weight", "self_attn.v_proj.weight"},
    {ARCH_ROLE_WO, ARCH_NEED_ALWAYS, "attn_output.weight", "self_attn.o_proj.weight"},
    {ARCH_ROLE_BQ, ARCH_NEED_ALWAYS, "attn_q.bias", "self_attn.q_proj.bias"},
    {ARCH_ROLE_BK, ARCH_NEED_ALWAYS, "attn_k.bias", "self_attn.k_proj.bias"},
    {ARCH_ROLE_BV, ARCH_NEED_ALWAYS, "attn_v.bias", "self_attn.v_proj.bias"},
    {ARCH_ROLE_BO, ARCH_NEED_ALWAYS, "attn_output.bias", "self_attn.o_proj.bias"},
    {ARCH_ROLE_ATTN_SINKS, ARCH_NEED_ALWAYS, "attn_sinks.weight", "self_attn.sinks"},
    {ARCH_ROLE_FFN_NORM, ARCH_NEED_ALWAYS, "post_attention_norm.weight", "post_attention_layernorm.weight"},
    {ARCH_ROLE_ROUTER, ARCH_NEED_ALWAYS, "ffn_gate_inp.weight", "mlp.router.weight"},
    {ARCH_ROLE_ROUTER_BIAS, ARCH_NEED_ALWAYS, "ffn_gate_inp.bias", "mlp.router.bias"},
    {ARCH_ROLE_EXP_GATE, ARCH_NEED_ALWAYS, "ffn_gate_exps.weight", "mlp.experts.gate_up_proj"},
    {ARCH_ROLE_EXP_UP, ARCH_NEED_ALWAYS, "ffn_up_exps.weight", "mlp.experts.gate_up_proj"},
    {ARCH_ROLE_EXP_DOWN, ARCH_NEED_ALWAYS, "ffn_down_exps.weight", "mlp.experts.down_proj"},
    {ARCH_ROLE_EXP_GATE_BIAS, ARCH_NEED_ALWAYS, "ffn_gate_exps.bias", "mlp.experts.gate_up_proj_bias"},
    {ARCH_ROLE_EXP_UP_BIAS, ARCH_NEED_ALWAYS, "ffn_up_exps.bias", "mlp.experts.gate_up_proj_bias"},
    {ARCH_ROLE_EXP_DOWN_BIAS, ARCH_NEED_ALWAYS, "ffn_down_exps.bias", "mlp.experts.down_proj_bias"},
};

#define KEY(k) (snprintf(key, sizeof key, "%s.%s", arch, k), key)

static int gptoss_gguf_hparams(const struct gguf *g, struct llm_hparams *hp, char *err)
{
    const char *arch = hp->arch;
    char key[96];
    int rc;
    if ((rc = arch_moe_gguf_hparams(g, hp, err))) return rc;
    hp->expert_norm_topk = 1; /* the softmax over the top-k logits */
    hp->swiglu_alpha = 1.702f;
    hp->swiglu_limit = 7.0f;
    hp->qkv_bias = 1;
    uint32_t u;
    if (gguf_get_u32(g, KEY("attention.sliding_window"), &u) != FERRY_OK || u < 1 || u > (1u << 30))
        return ferry_fail(err, FERRY_ERR_FORMAT, "key '%s' is missing or not a positive integer", key);
    hp->sliding_window = (int)u;
    hp->swa_pattern = 2;
    rc = gguf_get_u32(g, KEY("attention.sliding_window_pattern"), &u);
    if (rc == FERRY_OK) {
        if (u < 1 || u > (1u << 20))
            return ferry_fail(err, FERRY_ERR_FORMAT, "key '%s' is out of range", key);
        hp->swa_pattern = (int)u;
    } else if (rc != FERRY_ERR_NOT_FOUND) {
        return ferry_fail(err, FERRY_ERR_UNSUPPORTED, "key '%s': only a period (u32) is supported", key);
    }
    hp->swa_rope_scaled = 1;
    hp->rope_theta_swa = hp->rope_theta;
    float v;
    if (gguf_get_f32(g, KEY("rope.freq_base_swa"), &v) == FERRY_OK) {
        if (v != hp->rope_theta)
            return ferry_fail(err, FERRY_ERR_UNSUPPORTED,
                              "key '%s': a local rotary base of its own (%g) is "
                              "not supported",
                              key, v);
    }
    if (hp->rope_scaling.type == ROPE_SCALING_YARN) hp->rope_scaling.truncate = 0;
    return FERRY_OK;
}

static int gptoss_gguf_write(struct gguf_writer *w, const struct llm_hparams *hp, const char *arch, char *err)
{
    char key[96];
    int rc;
    if ((rc = arch_moe_gguf_write(w, hp, arch, err))) return rc;
    return gguf_writer_kv_u32(w, KEY("attention.sliding_window"), (uint32_t)hp->sliding_window, err);
}

const struct arch_family arch_gptoss = {
    .name = "gpt-oss",
    .title = "gpt-oss",
    .sizes = "20B, 120B",
    .notes = "attention sinks, 128-position windows on every other layer, YaRN, q/k/v/o biases; top-4 "
             "experts with biases and a clamped SwiGLU (CPU backend; GGUF only)",
    .gguf_names = (const char *const[]){"gpt-oss", NULL},
    .hf_classes = (const char *const[]){NULL},
    .hf_types = (const char *const[]){NULL},
    .gguf_writes = "gpt-oss",
    .gguf_rope = ROPE_STYLE_HALF,
    .tensors = gptoss_tensors,
    .n_tensors = sizeof gptoss_tensors / sizeof gptoss_tensors[0],
    .program = &gptoss_program,
    .chat_template = "chatml",
    .gguf_hparams = gptoss_gguf_hparams,
    .gguf_write = gptoss_gguf_write,
};
