/* gemma3 — Gemma 3 text models (1B-27B; Gemma3ForCausalLM, GGUF "gemma3").
 *
 * Block: x += postnorm(attn(prenorm(x))); x += postnorm(ffn(prenorm(x))) (sandwich norms), with QK-norm
 * before rotary, the query scaled by query_pre_attn_scalar^-1/2, GeGLU ffn = down(gelu_tanh(gate) * up),
 * and embeddings scaled by sqrt(dim). Layers are local (sliding window, rotary base rope_theta_swa = 10000,
 * unscaled) except every swa_pattern-th (global: rope_theta with the config's scaling). RMSNorm multiplies
 * by (1 + w): HF stores w, llama.cpp's converter writes 1 + w to GGUF (hf_norm_shift).
 * GGUF keys beyond the common ones (llama.cpp's): attention.sliding_window, attention.sliding_window_pattern
 * (default 6), rope.freq_base_swa (default 10000), and attention.scale, which ferry writes and reads; without
 * it the scale is llama.cpp's rule (the 62-layer 27B: (dim / heads)^-1/2, else head_dim^-1/2).
 */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "kernels/core/status.h"
#include "weights/arch/arch.h"
#include "weights/gguf.h"
#include "weights/gguf_write.h"
#include "weights/model_file.h"

static const struct layer_op gemma3_ops[] = {
    {LOP_ADD_NORM, LACT_X, LACT_XN, LAYER_ATTN_NORM},
    {LOP_LINEAR, LACT_XN, LACT_QKV, LAYER_QKV},
    {LOP_QK_NORM, LACT_QKV, LACT_QKV, 0},
    {LOP_ROPE_KV, LACT_QKV, LACT_Q, 0},
    {LOP_ATTENTION, LACT_Q, LACT_ATT, 0},
    {LOP_LINEAR, LACT_ATT, LACT_D, LAYER_O},
    {LOP_NORM, LACT_D, LACT_D, LAYER_POST_ATTN_NORM},
    {LOP_ADD_NORM, LACT_X, LACT_XN, LAYER_FFN_NORM},
    {LOP_LINEAR, LACT_XN, LACT_GU, LAYER_GU},
    {LOP_GELU_MUL, LACT_GU, LACT_H, 0},
    {LOP_LINEAR, LACT_H, LACT_D, LAYER_DOWN},
    {LOP_NORM, LACT_D, LACT_D, LAYER_POST_FFN_NORM},
};
static const struct layer_program gemma3_program = {
    .ops = gemma3_ops, .n_ops = sizeof gemma3_ops / sizeof gemma3_ops[0], .kv_first = 3, .kv_last = 4};

static const struct arch_tensor gemma3_tensors[] = {
    {ARCH_ROLE_ATTN_NORM, ARCH_NEED_ALWAYS, "attn_norm.weight", "input_layernorm.weight"},
    {ARCH_ROLE_WQ, ARCH_NEED_ALWAYS, "attn_q.weight", "self_attn.q_proj.weight"},
    {ARCH_ROLE_WK, ARCH_NEED_ALWAYS, "attn_k.weight", "self_attn.k_proj.weight"},
    {ARCH_ROLE_WV, ARCH_NEED_ALWAYS, "attn_v.weight", "self_attn.v_proj.weight"},
    {ARCH_ROLE_WO, ARCH_NEED_ALWAYS, "attn_output.weight", "self_attn.o_proj.weight"},
    {ARCH_ROLE_Q_NORM, ARCH_NEED_ALWAYS, "attn_q_norm.weight", "self_attn.q_norm.weight"},
    {ARCH_ROLE_K_NORM, ARCH_NEED_ALWAYS, "attn_k_norm.weight", "self_attn.k_norm.weight"},
    {ARCH_ROLE_POST_ATTN_NORM, ARCH_NEED_ALWAYS, "post_attention_norm.weight",
     "post_attention_layernorm.weight"},
    {ARCH_ROLE_FFN_NORM, ARCH_NEED_ALWAYS, "ffn_norm.weight", "pre_feedforward_layernorm.weight"},
    {ARCH_ROLE_W_GATE, ARCH_NEED_ALWAYS, "ffn_gate.weight", "mlp.gate_proj.weight"},
    {ARCH_ROLE_W_UP, ARCH_NEED_ALWAYS, "ffn_up.weight", "mlp.up_proj.weight"},
    {ARCH_ROLE_W_DOWN, ARCH_NEED_ALWAYS, "ffn_down.weight", "mlp.down_proj.weight"},
    {ARCH_ROLE_POST_FFN_NORM, ARCH_NEED_ALWAYS, "post_ffw_norm.weight", "post_feedforward_layernorm.weight"},
};

#define KEY(k) (snprintf(key, sizeof key, "gemma3.%s", k), key)

static int gemma3_gguf_hparams(const struct gguf *g, struct llm_hparams *hp, char *err)
{
    char key[96];
    uint32_t u;
    float v;
    hp->embed_scale = sqrtf((float)hp->dim);
    if (gguf_get_f32(g, KEY("final_logit_softcapping"), &v) == FERRY_OK && v != 0.0f)
        return ferry_fail(err, FERRY_ERR_UNSUPPORTED, "key '%s': logit soft-capping is not supported", key);
    if (gguf_get_f32(g, KEY("attention.scale"), &v) == FERRY_OK) {
        if (!(v > 0) || !isfinite(v))
            return ferry_fail(err, FERRY_ERR_FORMAT, "key '%s' is not positive", key);
        hp->attn_scale = v;
    } else {
        hp->attn_scale = hp->n_layers == 62 ? 1.0f / sqrtf((float)(hp->dim / hp->n_heads))
                                            : 1.0f / sqrtf((float)hp->head_dim);
    }
    if (gguf_get_u32(g, KEY("attention.sliding_window"), &u) != FERRY_OK || u == 0) return FERRY_OK;
    if (u > (1u << 30)) return ferry_fail(err, FERRY_ERR_FORMAT, "key '%s' is out of range", key);
    hp->sliding_window = (int)u;
    hp->swa_pattern = 6;
    int rc = gguf_get_u32(g, KEY("attention.sliding_window_pattern"), &u);
    if (rc == FERRY_OK) {
        if (u < 1 || u > (1u << 20))
            return ferry_fail(err, FERRY_ERR_FORMAT, "key '%s' is out of range", key);
        hp->swa_pattern = (int)u;
    } else if (rc != FERRY_ERR_NOT_FOUND) {
        return ferry_fail(err, FERRY_ERR_UNSUPPORTED, "key '%s': only a period (u32) is supported", key);
    }
    hp->rope_theta_swa = 10000.0f;
    if (gguf_get_f32(g, KEY("rope.freq_base_swa"), &v) == FERRY_OK) {
        if (!(v > 0) || !isfinite(v))
            return ferry_fail(err, FERRY_ERR_FORMAT, "key '%s' is not positive", key);
        hp->rope_theta_swa = v;
    }
    return FERRY_OK;
}

static int gemma3_gguf_write(struct gguf_writer *w, const struct llm_hparams *hp, const char *arch, char *err)
{
    char key[96];
    int rc;
    (void)arch;
    if ((rc = gguf_writer_kv_f32(w, KEY("attention.scale"), llm_attn_scale(hp), err))) return rc;
    if (hp->sliding_window <= 0) return FERRY_OK;
    if ((rc = gguf_writer_kv_u32(w, KEY("attention.sliding_window"), (uint32_t)hp->sliding_window, err)))
        return rc;
    if ((rc = gguf_writer_kv_u32(w, KEY("attention.sliding_window_pattern"), (uint32_t)hp->swa_pattern, err)))
        return rc;
    return gguf_writer_kv_f32(w, KEY("rope.freq_base_swa"), hp->rope_theta_swa, err);
}

/* The period P of layer_types: every layer is "sliding_attention" except those with l % P == P - 1. */
static int layer_pattern(json_t *types, int n_layers, int *pattern, char *err)
{
    if (!json_is_array(types) || (int)json_array_size(types) != n_layers)
        return ferry_fail(err, FERRY_ERR_FORMAT, "config.json: layer_types is not a list of %d strings",
                          n_layers);
    int first = -1;
    for (int l = 0; l < n_layers && first < 0; l++) {
        const char *t = json_string_value(json_array_get(types, (size_t)l));
        if (t && strcmp(t, "full_attention") == 0) first = l;
    }
    *pattern = first < 0 ? 0 : first + 1;
    for (int l = 0; l < n_layers; l++) {
        const char *t = json_string_value(json_array_get(types, (size_t)l));
        const int global = *pattern > 0 && l % *pattern == *pattern - 1;
        if (!t || strcmp(t, global ? "full_attention" : "sliding_attention") != 0)
            return ferry_fail(err, FERRY_ERR_UNSUPPORTED,
                              "config.json: layer_types[%d] breaks the local/global pattern of period %d", l,
                              *pattern);
    }
    return FERRY_OK;
}

static int gemma3_hf_hparams(json_t *c, struct llm_hparams *hp, char *err)
{
    const char *f = "config.json";
    static const char *const caps[] = {"final_logit_softcapping", "attn_logit_softcapping"};
    for (int i = 0; i < 2; i++) {
        json_t *v = json_object_get(c, caps[i]);
        if (v && !json_is_null(v))
            return ferry_fail(err, FERRY_ERR_UNSUPPORTED, "%s: %s is not supported", f, caps[i]);
    }
    hp->embed_scale = (float)sqrt((double)hp->dim);
    json_t *q = json_object_get(c, "query_pre_attn_scalar");
    const double qs = json_is_number(q) ? json_number_value(q) : 256.0;
    if (!(qs > 0) || qs > 1e9)
        return ferry_fail(err, FERRY_ERR_FORMAT, "%s: query_pre_attn_scalar is not a positive number", f);
    hp->attn_scale = (float)(1.0 / sqrt(qs));
    json_t *sw = json_object_get(c, "sliding_window");
    if (!json_is_integer(sw) || json_integer_value(sw) <= 0) return FERRY_OK;
    if (json_integer_value(sw) > (1 << 30))
        return ferry_fail(err, FERRY_ERR_FORMAT, "%s: sliding_window is out of range", f);
    hp->sliding_window = (int)json_integer_value(sw);
    json_t *types = json_object_get(c, "layer_types");
    int rc;
    if (types && !json_is_null(types)) {
        if ((rc = layer_pattern(types, hp->n_layers, &hp->swa_pattern, err))) return rc;
    } else {
        json_t *p = json_object_get(c, "sliding_window_pattern");
        if (!json_is_integer(p)) p = json_object_get(c, "_sliding_window_pattern");
        hp->swa_pattern = json_is_integer(p) && json_integer_value(p) > 0 && json_integer_value(p) < (1 << 20)
                              ? (int)json_integer_value(p)
                              : 6;
    }
    /* The local layers' base: rope_parameters.sliding_attention (transformers 5), or rope_local_base_freq. */
    json_t *rl = json_object_get(json_object_get(json_object_get(c, "rope_parameters"), "sliding_attention"),
                                 "rope_theta");
    if (!json_is_number(rl)) rl = json_object_get(c, "rope_local_base_freq");
    hp->rope_theta_swa = json_is_number(rl) ? (float)json_number_value(rl) : 10000.0f;
    if (!(hp->rope_theta_swa > 0) || !isfinite(hp->rope_theta_swa))
        return ferry_fail(err, FERRY_ERR_FORMAT, "%s: the local rope_theta is not positive", f);
    return FERRY_OK;
}

const struct arch_family arch_gemma3 = {
    .name = "gemma3",
    .title = "Gemma 3 (text)",
    .sizes = "1B-27B",
    .notes = "local sliding-window layers (own rotary base) every 5 of 6, sandwich norms, GeGLU, QK-norm, "
             "scaled embeddings and queries, (1 + w) norms",
    .gguf_names = (const char *const[]){"gemma3", NULL},
    .hf_classes = (const char *const[]){"Gemma3ForCausalLM", NULL},
    .hf_types = (const char *const[]){"gemma3_text", NULL},
    .gguf_writes = "gemma3",
    .gguf_rope = ROPE_STYLE_HALF,
    .tensors = gemma3_tensors,
    .n_tensors = sizeof gemma3_tensors / sizeof gemma3_tensors[0],
    .program = &gemma3_program,
    .chat_template = "gemma",
    .hf_act = "gelu_pytorch_tanh",
    .hf_norm_shift = 1.0f,
    .gguf_hparams = gemma3_gguf_hparams,
    .hf_hparams = gemma3_hf_hparams,
    .gguf_write = gemma3_gguf_write,
};
