/* qwen35 — Qwen3.5 / 3.6 dense (0.8B-27B): a hybrid of gated DeltaNet linear attention and full attention.
 * Three of every four layers (all but those with (l + 1) % full_attention_interval == 0) are linear: their
 * mixer keeps a fixed-size convolution and recurrent state per sequence instead of a KV cache
 * (LOP_DELTANET). The others are full attention whose q_proj also yields a per-head output gate (attn *
 * sigmoid(gate)), with QK-norm and rotary on the first rope.dimension_count dims of each head only (Qwen3.5's
 * interleaved multimodal rotary gives every section the same position for text, so it is ordinary rotate-half
 * rotary there). Every layer ends with a SwiGLU FFN after post_attention_norm.
 * GGUF files as llama.cpp's converter writes the "qwen35" architecture: its RMSNorm weights already 1 + w,
 * ssm_a already -exp(A_log), value heads tiled over the key heads (kernels/cpu/deltanet.h). Hugging Face
 * checkpoints are not read for this family yet (convert them with llama.cpp's convert_hf_to_gguf.py).
 */
#include "weights/arch/qwen35.h"

#include <stdint.h>
#include <stdio.h>

#include "kernels/core/status.h"
#include "weights/gguf.h"
#include "weights/model_file.h"

static const struct layer_op qwen35_attn_ops[] = {
    ARCH_QWEN35_ATTN_OPS,
    {LOP_LINEAR, LACT_XN, LACT_GU, LAYER_GU},
    {LOP_SILU_MUL, LACT_GU, LACT_H, 0},
    {LOP_LINEAR, LACT_H, LACT_D, LAYER_DOWN},
};
static const struct layer_program qwen35_attn_program = {.ops = qwen35_attn_ops,
                                                         .n_ops = sizeof qwen35_attn_ops /
                                                                  sizeof qwen35_attn_ops[0],
                                                         .kv_first = 4,
                                                         .kv_last = 5};

static const struct layer_op qwen35_linear_ops[] = {
    ARCH_QWEN35_LINEAR_OPS,
    {LOP_LINEAR, LACT_XN, LACT_GU, LAYER_GU},
    {LOP_SILU_MUL, LACT_GU, LACT_H, 0},
    {LOP_LINEAR, LACT_H, LACT_D, LAYER_DOWN},
};
static const struct layer_program qwen35_linear_program = {.ops = qwen35_linear_ops,
                                                           .n_ops = sizeof qwen35_linear_ops /
                                                                    sizeof qwen35_linear_ops[0],
                                                           .kv_first = -1,
                                                           .kv_last = -1};

/* The mixers, then the SwiGLU FFN. */
static const struct arch_tensor qwen35_tensors[] = {
    ARCH_QWEN35_MIXER_TENSORS,
    {ARCH_ROLE_W_GATE, ARCH_NEED_ALWAYS, "ffn_gate.weight", "mlp.gate_proj.weight"},
    {ARCH_ROLE_W_UP, ARCH_NEED_ALWAYS, "ffn_up.weight", "mlp.up_proj.weight"},
    {ARCH_ROLE_W_DOWN, ARCH_NEED_ALWAYS, "ffn_down.weight", "mlp.down_proj.weight"},
};

#define KEY(k) (snprintf(key, sizeof key, "%s.%s", hp->arch, k), key)

/* A required positive u32 key no larger than max. */
static int ssm_key(const struct gguf *g, const char *key, uint32_t max, int *out, char *err)
{
    uint32_t u = 0;
    int rc = gguf_get_u32(g, key, &u);
    if (rc == FERRY_ERR_NOT_FOUND) return ferry_fail(err, FERRY_ERR_FORMAT, "missing key '%s'", key);
    if (rc || u < 1 || u > max)
        return ferry_fail(err, FERRY_ERR_FORMAT, "key '%s' is not a number in 1..%u", key, max);
    *out = (int)u;
    return FERRY_OK;
}

int arch_qwen35_gguf_hparams(const struct gguf *g, struct llm_hparams *hp, char *err)
{
    char key[96];
    int rc;
    hp->attn_out_gate = 1;
    if ((rc = ssm_key(g, KEY("ssm.conv_kernel"), 16, &hp->ssm_conv_kernel, err)) ||
        (rc = ssm_key(g, KEY("ssm.state_size"), 1024, &hp->ssm_head_k, err)) ||
        (rc = ssm_key(g, KEY("ssm.group_count"), 1024, &hp->ssm_n_k_heads, err)) ||
        (rc = ssm_key(g, KEY("ssm.time_step_rank"), 1024, &hp->ssm_n_v_heads, err)) ||
        (rc = ssm_key(g, KEY("ssm.inner_size"), 1u << 20, &hp->ssm_inner, err)))
        return rc;
    if (hp->ssm_n_v_heads % hp->ssm_n_k_heads || hp->ssm_inner % hp->ssm_n_v_heads ||
        llm_ssm_head_v(hp) > 1024)
        return ferry_fail(
            err, FERRY_ERR_FORMAT,
            "linear attention: %d value heads over %d key heads, inner size %d (value heads must "
            "be a multiple of key heads, inner size of value heads, at most 1024 each)",
            hp->ssm_n_v_heads, hp->ssm_n_k_heads, hp->ssm_inner);
    hp->full_attn_interval = 4;
    uint32_t u = 0;
    rc = gguf_get_u32(g, KEY("full_attention_interval"), &u);
    if (rc == FERRY_OK) {
        if (u < 1 || u > 4096) return ferry_fail(err, FERRY_ERR_FORMAT, "key '%s' is out of range", key);
        hp->full_attn_interval = (int)u;
    } else if (rc != FERRY_ERR_NOT_FOUND) {
        return ferry_fail(err, FERRY_ERR_FORMAT, "key '%s' is not a number", key);
    }
    /* Multi-token-prediction blocks (nextn_predict_layers, which the converter exports by default) follow
     * the trunk's layers in block_count; ferry runs the trunk and leaves their tensors unread. */
    const int n_blocks = hp->n_layers;
    rc = gguf_get_u32(g, KEY("nextn_predict_layers"), &u);
    if (rc == FERRY_OK) {
        if (u >= (uint32_t)n_blocks)
            return ferry_fail(err, FERRY_ERR_FORMAT, "key '%s' (%u) leaves none of the %d blocks", key, u,
                              n_blocks);
        hp->n_layers -= (int)u, hp->n_layer_nextn = (int)u;
    } else if (rc != FERRY_ERR_NOT_FOUND) {
        return ferry_fail(err, FERRY_ERR_FORMAT, "key '%s' is not a number", key);
    }
    /* The converter also lists which layers are recurrent; ferry runs the periodic pattern only. */
    enum gguf_vtype et;
    uint64_t n = 0;
    if (gguf_get_arr(g, KEY("attention.recurrent_layers"), &et, &n) == FERRY_OK) {
        uint8_t rec[4096];
        if (n != (uint64_t)n_blocks || n > sizeof rec || gguf_arr_bool(g, key, rec, n) != FERRY_OK)
            return ferry_fail(err, FERRY_ERR_FORMAT, "key '%s' is not %d bools", key, n_blocks);
        for (int l = 0; l < hp->n_layers; l++)
            if (rec[l] != llm_layer_is_recurrent(hp, l))
                return ferry_fail(err, FERRY_ERR_UNSUPPORTED,
                                  "key '%s': layer %d is %s, which the full_attention_interval %d pattern "
                                  "does not give (only that pattern is supported)",
                                  key, l, rec[l] ? "recurrent" : "full attention", hp->full_attn_interval);
    }
    return FERRY_OK;
}

const struct arch_family arch_qwen35 = {
    .name = "qwen35",
    .title = "Qwen3.5 / 3.6 (dense)",
    .sizes = "0.8B-27B",
    .notes = "gated DeltaNet linear attention in 3 of 4 layers (per-sequence state, CPU backend, GGUF only); "
             "gated full attention with partial rotary",
    .gguf_names = (const char *const[]){"qwen35", NULL},
    .hf_classes = (const char *const[]){NULL},
    .hf_types = (const char *const[]){NULL},
    .gguf_writes = "qwen35",
    .gguf_rope = ROPE_STYLE_HALF,
    .tensors = qwen35_tensors,
    .n_tensors = sizeof qwen35_tensors / sizeof qwen35_tensors[0],
    .program = &qwen35_attn_program,
    .program_recurrent = &qwen35_linear_program,
    .chat_template = "chatml",
    .gguf_hparams = arch_qwen35_gguf_hparams,
};
