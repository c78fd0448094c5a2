/* qwen35 — what the Qwen3.5 / 3.6 families (qwen35.c dense, qwen35moe.c Mixture of Experts) and Qwen3-Next
 * (qwen3next.c) share: the mixer of both layer kinds (gated full attention, gated DeltaNet) as ops and
 * tensors, and the reading of their GGUF keys. A family appends its FFN: the ops after the FFN norm, the
 * FFN's tensors after the mixer's.
 */
#ifndef FERRY_ARCH_QWEN35_H
#define FERRY_ARCH_QWEN35_H

#include "weights/arch/arch.h"

/* Full attention up to the FFN's input (kv_first 4, kv_last 5):
 *   x += D; xn = norm(x)·attn_norm;  qkv = xn·Wqkvᵀ;  queries and gates apart;  QK-norm;
 *   q, cache = rope(qkv);  att = attention(q, cache) · sigmoid(gate);  D = att·Woᵀ;  x += D; xn = norm(x). */
#define ARCH_QWEN35_ATTN_OPS                                                                                 \
    {LOP_ADD_NORM, LACT_X, LACT_XN, LAYER_ATTN_NORM}, {LOP_LINEAR, LACT_XN, LACT_QKV, LAYER_QKV},            \
        {LOP_Q_GATE, LACT_QKV, LACT_QKV, 0}, {LOP_QK_NORM, LACT_QKV, LACT_QKV, 0},                           \
        {LOP_ROPE_KV, LACT_QKV, LACT_Q, 0}, {LOP_ATTENTION, LACT_Q, LACT_ATT, 0},                            \
        {LOP_ATT_GATE, LACT_ATT, LACT_ATT, 0}, {LOP_LINEAR, LACT_ATT, LACT_D, LAYER_O},                      \
    {                                                                                                        \
        LOP_ADD_NORM, LACT_X, LACT_XN, LAYER_FFN_NORM                                                        \
    }

/* Linear attention up to the FFN's input:  x += D; xn = norm(x)·attn_norm;  D = deltanet(xn, the sequence's
 * state);  x += D; xn = norm(x). */
#define ARCH_QWEN35_LINEAR_OPS                                                                               \
    {LOP_ADD_NORM, LACT_X, LACT_XN, LAYER_ATTN_NORM}, {LOP_DELTANET, LACT_XN, LACT_D, 0},                    \
    {                                                                                                        \
        LOP_ADD_NORM, LACT_X, LACT_XN, LAYER_FFN_NORM                                                        \
    }

/* The block norms and the full attention's tensors (GGUF names as llama.cpp's converter writes them). */
#define ARCH_QWEN35_ATTN_TENSORS                                                                             \
    {ARCH_ROLE_ATTN_NORM, ARCH_NEED_ALWAYS, "attn_norm.weight", "input_layernorm.weight"},                   \
        {ARCH_ROLE_FFN_NORM, ARCH_NEED_ALWAYS, "post_attention_norm.weight",                                 \
         "post_attention_layernorm.weight"},                                                                 \
        {ARCH_ROLE_WQ, ARCH_NEED_ATTN, "attn_q.weight", "self_attn.q_proj.weight"},                          \
        {ARCH_ROLE_WK, ARCH_NEED_ATTN, "attn_k.weight", "self_attn.k_proj.weight"},                          \
        {ARCH_ROLE_WV, ARCH_NEED_ATTN, "attn_v.weight", "self_attn.v_proj.weight"},                          \
        {ARCH_ROLE_WO, ARCH_NEED_ATTN, "attn_output.weight", "self_attn.o_proj.weight"},                     \
        {ARCH_ROLE_Q_NORM, ARCH_NEED_ATTN, "attn_q_norm.weight", "self_attn.q_norm.weight"},                 \
    {                                                                                                        \
        ARCH_ROLE_K_NORM, ARCH_NEED_ATTN, "attn_k_norm.weight", "self_attn.k_norm.weight"                    \
    }

/* The gated DeltaNet's tensors after its in-projections. */
#define ARCH_QWEN35_SSM_TENSORS                                                                              \
    {ARCH_ROLE_SSM_CONV, ARCH_NEED_RECURRENT, "ssm_conv1d.weight", "linear_attn.conv1d.weight"},             \
        {ARCH_ROLE_SSM_DT, ARCH_NEED_RECURRENT, "ssm_dt.bias", "linear_attn.dt_bias"},                       \
        {ARCH_ROLE_SSM_A, ARCH_NEED_RECURRENT, "ssm_a", "linear_attn.A_log"},                                \
        {ARCH_ROLE_SSM_NORM, ARCH_NEED_RECURRENT, "ssm_norm.weight", "linear_attn.norm.weight"},             \
    {                                                                                                        \
        ARCH_ROLE_SSM_OUT, ARCH_NEED_RECURRENT, "ssm_out.weight", "linear_attn.out_proj.weight"              \
    }

/* The block norms and both mixers' tensors, Qwen3.5's four in-projections among them. */
#define ARCH_QWEN35_MIXER_TENSORS                                                                            \
    ARCH_QWEN35_ATTN_TENSORS,                                                                                \
        {ARCH_ROLE_SSM_QKV, ARCH_NEED_RECURRENT, "attn_qkv.weight", "linear_attn.in_proj_qkv.weight"},       \
        {ARCH_ROLE_SSM_Z, ARCH_NEED_RECURRENT, "attn_gate.weight", "linear_attn.in_proj_z.weight"},          \
        {ARCH_ROLE_SSM_BETA, ARCH_NEED_RECURRENT, "ssm_beta.weight", "linear_attn.in_proj_b.weight"},        \
        {ARCH_ROLE_SSM_ALPHA, ARCH_NEED_RECURRENT, "ssm_alpha.weight", "linear_attn.in_proj_a.weight"},      \
        ARCH_QWEN35_SSM_TENSORS

/* After the mixers': the routed experts and the shared one (its FFN in the dense FFN's roles, ffn_dim). */
#define ARCH_QWEN35_MOE_TENSORS                                                                              \
    {ARCH_ROLE_ROUTER, ARCH_NEED_ALWAYS, "ffn_gate_inp.weight", "mlp.gate.weight"},                          \
        {ARCH_ROLE_EXP_GATE, ARCH_NEED_ALWAYS, "ffn_gate_exps.weight", "mlp.experts.*.gate_proj.weight"},    \
        {ARCH_ROLE_EXP_UP, ARCH_NEED_ALWAYS, "ffn_up_exps.weight", "mlp.experts.*.up_proj.weight"},          \
        {ARCH_ROLE_EXP_DOWN, ARCH_NEED_ALWAYS, "ffn_down_exps.weight", "mlp.experts.*.down_proj.weight"},    \
        {ARCH_ROLE_W_GATE, ARCH_NEED_ALWAYS, "ffn_gate_shexp.weight", "mlp.shared_expert.gate_proj.weight"}, \
        {ARCH_ROLE_W_UP, ARCH_NEED_ALWAYS, "ffn_up_shexp.weight", "mlp.shared_expert.up_proj.weight"},       \
        {ARCH_ROLE_W_DOWN, ARCH_NEED_ALWAYS, "ffn_down_shexp.weight", "mlp.shared_expert.down_proj.weight"}, \
    {                                                                                                        \
        ARCH_ROLE_SHEXP_GATE, ARCH_NEED_ALWAYS, "ffn_gate_inp_shexp.weight", "mlp.shared_expert_gate.weight" \
    }

/* The multi-token-prediction block's tensors as llama.cpp's converter writes them (nextn.eh_proj, enorm,
 * hnorm, shared_head_norm; embed_tokens and shared_head_head when the checkpoint has them), for all three
 * families. */
extern const struct arch_nextn arch_qwen35_nextn;

/* Qwen3.5-MoE's programs (qwen35moe.c): each mixer, then the experts and the shared expert (LOP_MOE_SHARED);
 * Qwen3-Next's layers are the same. */
extern const struct layer_program arch_qwen35moe_attn_program, arch_qwen35moe_linear_program;

/* The linear-attention keys ({arch}.ssm.*, full_attention_interval, attention.recurrent_layers), with the
 * gated queries of the full-attention layers. FERRY_OK or a status with err naming the key. */
int arch_qwen35_gguf_hparams(const struct gguf *g, struct llm_hparams *hp, char *err);
/* Those plus the experts' keys and the shared expert's size (expert_shared_feed_forward_length, else
 * feed_forward_length) as ffn_dim (qwen35moe.c). */
int arch_qwen35moe_gguf_hparams(const struct gguf *g, struct llm_hparams *hp, char *err);

/* Hugging Face checkpoints (transformers' qwen3_5 / qwen3_5_moe / qwen3_next text models, config.json and
 * safetensors). config.json: linear_conv_kernel_dim, linear_{key,value}_head_dim,
 * linear_num_{key,value}_heads, full_attention_interval or layer_types (which must follow it),
 * partial_rotary_factor (rope_parameters' or top level; 0.25 when absent), rope_parameters.mrope_section
 * (kept for the GGUF writer). */
int arch_qwen35_hf_hparams(struct json_t *c, struct llm_hparams *hp, char *err);
/* Those plus Qwen3-MoE's expert fields (arch_qwen3moe_hf_hparams, norm_topk_prob defaulting to true here) and
 * shared_expert_intermediate_size (as ffn_dim). */
int arch_qwen35moe_hf_hparams(struct json_t *c, struct llm_hparams *hp, char *err);
/* The checkpoint's tensors, mapped to GGUF names, made what llama.cpp's converter writes: every RMSNorm
 * weight but the gated norm's as 1 + w, ssm_a as -exp(A_log), the conv weight (conv_dim, 1, width) as
 * (conv_dim, width); unless hp->ssm_grouped, value heads reordered from grouped by key head to tiled over
 * the key heads (in_proj_qkv's v rows, in_proj_z, in_proj_b, in_proj_a, the conv's v channels, A_log,
 * dt_bias, out_proj's columns); Qwen3-Next's in_proj_qkvz (ssm_in) split into attn_qkv and attn_gate. New
 * data in mf->arch_owned. FERRY_OK or a status with err naming the tensor. */
int arch_qwen35_hf_tensors(struct model_file *mf, char *err);
/* The GGUF keys llama.cpp's converter writes for the families: the ssm.* keys, full_attention_interval,
 * attention.recurrent_layers, rope.dimension_sections (not for Qwen3-Next, hp->ssm_grouped); the MoE one
 * adds the expert keys and expert_shared_feed_forward_length (= ffn_dim). */
int arch_qwen35_gguf_write(struct gguf_writer *w, const struct llm_hparams *hp, const char *arch, char *err);
int arch_qwen35moe_gguf_write(struct gguf_writer *w, const struct llm_hparams *hp, const char *arch,
                              char *err);

#endif
