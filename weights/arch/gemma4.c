/* gemma4 — Gemma 4's dense text models (E2B, E4B, 31B; GGUF "gemma4" as llama.cpp's converter writes it).
 *
 * Block (as Gemma 3): x += postnorm(attn(prenorm(x))); x += postnorm(ffn(prenorm(x))), GeGLU, QK-norm,
 * embeddings scaled by sqrt(dim), local sliding-window layers with every swa_pattern-th layer global. New in
 * Gemma 4: the global layers have their own head size and KV-head count (GGUF attention.key_length and the
 * global entries of head_count_kv; the local layers' are key_length_swa and the local entries), a layer
 * without attn_v uses its keys as its values (taken before the norms), values are RMS-normed per head without
 * a weight, the attention scale is 1, norms multiply by w (no 1 + w), each layer's output (the residual
 * stream) is multiplied by its layer_output_scale, and logits are soft-capped (final_logit_softcapping). The
 * global layers' "proportional" rotary turns the first pairs of a head (i, i + head/2) at base^(-2i/head) and
 * leaves the others: llama.cpp's file carries rope_freqs.weight, 1 for a turned pair and 1e30 for the others,
 * which ferry divides the global frequencies by, as it does for Llama 3. E2B/E4B add: the last
 * attention.shared_kv_layers layers compute no K/V and attend over the cache of the last earlier layer of
 * their kind, with their own FFN size (feed_forward_length per layer: double-wide); every layer adds a
 * per-layer input (embedding_length_per_layer_input: per_layer_token_embd, per_layer_model_proj,
 * per_layer_proj_norm; per layer inp_gate, proj, post_norm) before its output scalar.
 * Refused at load, by name: experts (26B-A4B), sizes that differ by layer in other ways, layer kinds out of a
 * fixed period, a Hugging Face directory (convert it with llama.cpp's converter).
 */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/core/status.h"
#include "weights/arch/arch.h"
#include "weights/gguf.h"
#include "weights/model_file.h"

static const struct layer_op gemma4_ops[] = {
    {LOP_ADD_NORM, LACT_X, LACT_XN, LAYER_ATTN_NORM},
    {LOP_LINEAR, LACT_XN, LACT_QKV, LAYER_QKV},
    {LOP_QK_NORM, LACT_QKV, LACT_QKV, 0},
    {LOP_V_NORM, LACT_QKV, LACT_QKV, 0},
    {LOP_ROPE_KV, LACT_QKV, LACT_Q, 0},
    {LOP_ATTENTION, LACT_Q, LACT_ATT, 0},
    {LOP_LINEAR, LACT_ATT, LACT_D, LAYER_O},
    {LOP_NORM, LACT_D, LACT_D, LAYER_POST_ATTN_NORM},
    {LOP_ADD_NORM, LACT_X, LACT_XN, LAYER_FFN_NORM},
    {LOP_LINEAR, LACT_XN, LACT_GU, LAYER_GU},
    {LOP_GELU_MUL, LACT_GU, LACT_H, 0},
    {LOP_LINEAR, LACT_H, LACT_D, LAYER_DOWN},
    {LOP_NORM, LACT_D, LACT_D, LAYER_POST_FFN_NORM},
    {LOP_PLE, LACT_X, LACT_X, 0},
    {LOP_SCALE_X, LACT_X, LACT_X, LAYER_OUT_SCALE},
};
static const struct layer_program gemma4_program = {
    .ops = gemma4_ops, .n_ops = sizeof gemma4_ops / sizeof gemma4_ops[0], .kv_first = 4, .kv_last = 5};

static const struct arch_tensor gemma4_tensors[] = {
    {ARCH_ROLE_ATTN_NORM, ARCH_NEED_ALWAYS, "attn_norm.weight", "input_layernorm.weight"},
    {ARCH_ROLE_WQ, ARCH_NEED_ALWAYS, "attn_q.weight", "self_attn.q_proj.weight"},
    {ARCH_ROLE_WK, ARCH_NEED_NEVER, "attn_k.weight", "self_attn.k_proj.weight"}, /* absent: KV-sharing */
    {ARCH_ROLE_WV, ARCH_NEED_NEVER, "attn_v.weight", "self_attn.v_proj.weight"}, /* absent: V = K */
    {ARCH_ROLE_WO, ARCH_NEED_ALWAYS, "attn_output.weight", "self_attn.o_proj.weight"},
    {ARCH_ROLE_Q_NORM, ARCH_NEED_ALWAYS, "attn_q_norm.weight", "self_attn.q_norm.weight"},
    {ARCH_ROLE_K_NORM, ARCH_NEED_NEVER, "attn_k_norm.weight", "self_attn.k_norm.weight"},
    {ARCH_ROLE_POST_ATTN_NORM, ARCH_NEED_ALWAYS, "post_attention_norm.weight",
     "post_attention_layernorm.weight"},
    {ARCH_ROLE_FFN_NORM, ARCH_NEED_ALWAYS, "ffn_norm.weight", "pre_feedforward_layernorm.weight"},
    {ARCH_ROLE_W_GATE, ARCH_NEED_ALWAYS, "ffn_gate.weight", "mlp.gate_proj.weight"},
    {ARCH_ROLE_W_UP, ARCH_NEED_ALWAYS, "ffn_up.weight", "mlp.up_proj.weight"},
    {ARCH_ROLE_W_DOWN, ARCH_NEED_ALWAYS, "ffn_down.weight", "mlp.down_proj.weight"},
    {ARCH_ROLE_POST_FFN_NORM, ARCH_NEED_ALWAYS, "post_ffw_norm.weight", "post_feedforward_layernorm.weight"},
    {ARCH_ROLE_OUT_SCALE, ARCH_NEED_ALWAYS, "layer_output_scale.weight", "layer_scalar"},
    /* With per-layer inputs (runtime/model.c requires them then). */
    {ARCH_ROLE_PLE_GATE, ARCH_NEED_NEVER, "inp_gate.weight", "per_layer_input_gate.weight"},
    {ARCH_ROLE_PLE_PROJ, ARCH_NEED_NEVER, "proj.weight", "per_layer_projection.weight"},
    {ARCH_ROLE_PLE_NORM, ARCH_NEED_NEVER, "post_norm.weight", "post_per_layer_input_norm.weight"},
};

#define KEY(k)        (snprintf(key, sizeof key, "gemma4.%s", k), key)
#define MAX_LAYERS_G4 4096

/* A u32 key that must be 0 or absent for what ferry runs: FERRY_ERR_UNSUPPORTED naming `what` otherwise. */
static int refuse_nonzero(const struct gguf *g, const char *key, const char *what, char *err)
{
    uint32_t u = 0;
    int rc = gguf_get_u32(g, key, &u);
    if (rc == FERRY_ERR_NOT_FOUND || (rc == FERRY_OK && u == 0)) return FERRY_OK;
    if (rc == FERRY_OK)
        return ferry_fail(err, FERRY_ERR_UNSUPPORTED, "key '%s' = %u: %s are not supported", key, u, what);
    return ferry_fail(err, FERRY_ERR_UNSUPPORTED, "key '%s': %s are not supported", key, what);
}

/* An optional positive u32 key; *out keeps its value when absent. */
static int opt_u32(const struct gguf *g, const char *key, int *out, char *err)
{
    uint32_t u;
    int rc = gguf_get_u32(g, key, &u);
    if (rc == FERRY_ERR_NOT_FOUND) return FERRY_OK;
    if (rc || u < 1 || u > (1u << 20))
        return ferry_fail(err, FERRY_ERR_FORMAT, "key '%s' is not an integer in 1..2^20", key);
    *out = (int)u;
    return FERRY_OK;
}

/* The local/global pattern: sliding_window_pattern, one bool per layer (true: local), must be periodic with
 * the global layer last in each period (ferry's llm_layer_is_local); sets hp->swa_pattern. */
static int layer_pattern(const struct gguf *g, struct llm_hparams *hp, uint8_t *swa, char *err)
{
    char key[96];
    enum gguf_vtype et;
    uint64_t n;
    if (gguf_get_arr(g, KEY("attention.sliding_window_pattern"), &et, &n) != FERRY_OK ||
        n != (uint64_t)hp->n_layers || gguf_arr_bool(g, key, swa, n) != FERRY_OK)
        return ferry_fail(err, FERRY_ERR_FORMAT, "key '%s' is not %d bools", key, hp->n_layers);
    int first = -1;
    for (int l = 0; l < hp->n_layers && first < 0; l++)
        if (!swa[l]) first = l;
    hp->swa_pattern = first < 0 ? 0 : first + 1;
    for (int l = 0; l < hp->n_layers; l++)
        if (!!swa[l] != llm_layer_is_local(hp, l))
            return ferry_fail(err, FERRY_ERR_UNSUPPORTED,
                              "key '%s': layer %d breaks the local/global pattern of period %d", key, l,
                              hp->swa_pattern);
    return FERRY_OK;
}

/* head_count_kv: one value, or one per layer, the same within each kind; sets both kinds' counts. */
static int kv_heads(const struct gguf *g, struct llm_hparams *hp, const uint8_t *swa, char *err)
{
    char key[96];
    enum gguf_vtype et;
    uint64_t n;
    snprintf(key, sizeof key, "gemma4.attention.head_count_kv");
    if (gguf_get_arr(g, key, &et, &n) != FERRY_OK) { /* a single value: read by the common code */
        hp->n_kv_heads_swa = hp->n_kv_heads;
        return FERRY_OK;
    }
    if (n != (uint64_t)hp->n_layers)
        return ferry_fail(err, FERRY_ERR_FORMAT, "key '%s' is not per layer", key);
    int32_t *v = malloc((size_t)n * sizeof *v);
    if (!v) return ferry_fail(err, FERRY_ERR_NOMEM, "out of memory");
    int rc = gguf_arr_i32(g, key, v, n);
    int kind[2] = {0, 0}; /* global, local */
    for (uint64_t l = 0; !rc && l < n; l++) {
        int *k = &kind[swa[l] ? 1 : 0];
        if (v[l] < 1 || v[l] > (1 << 20) || (*k && *k != v[l])) rc = FERRY_ERR_FORMAT;
        *k = v[l];
    }
    free(v);
    if (rc)
        return ferry_fail(err, FERRY_ERR_UNSUPPORTED,
                          "key '%s': KV-head counts must be positive and the same within each layer kind",
                          key);
    hp->n_kv_heads = kind[0] ? kind[0] : kind[1];
    hp->n_kv_heads_swa = kind[1] ? kind[1] : kind[0];
    return FERRY_OK;
}

/* E2B/E4B: the last shared_kv_layers layers attend over the KV of the last earlier layer of their kind, with
 * an FFN of their own size (feed_forward_length per layer: one size before them, one for them), and every
 * layer takes a per-layer input of embedding_length_per_layer_input. */
static int small_members(const struct gguf *g, struct llm_hparams *hp, char *err)
{
    char key[96];
    uint32_t u = 0;
    hp->n_layer_kv = 0;
    if (gguf_get_u32(g, KEY("attention.shared_kv_layers"), &u) == FERRY_OK && u > 0) {
        if (u >= (uint32_t)hp->n_layers)
            return ferry_fail(err, FERRY_ERR_UNSUPPORTED, "key '%s' = %u: no layer keeps K/V of its own", key,
                              u);
        hp->n_layer_kv = hp->n_layers - (int)u;
        for (int l = hp->n_layer_kv; l < hp->n_layers; l++)
            if (llm_kv_source(hp, l) < 0)
                return ferry_fail(err, FERRY_ERR_FORMAT,
                                  "key '%s': layer %d has no earlier layer of its kind", key, l);
    }
    enum gguf_vtype et;
    uint64_t n;
    if (gguf_get_arr(g, KEY("feed_forward_length"), &et, &n) == FERRY_OK) {
        if (n != (uint64_t)hp->n_layers)
            return ferry_fail(err, FERRY_ERR_FORMAT, "key '%s' is not per layer", key);
        int32_t *f = malloc((size_t)n * sizeof *f);
        if (!f) return ferry_fail(err, FERRY_ERR_NOMEM, "out of memory");
        int rc = gguf_arr_i32(g, key, f, n), first = f[0], shared = 0;
        for (int l = 0; !rc && l < hp->n_layers; l++) {
            const int own = llm_layer_kv_shared(hp, l);
            if (f[l] < 1 || f[l] > (1 << 30) || (!own && f[l] != first) || (own && shared && f[l] != shared))
                rc = FERRY_ERR_UNSUPPORTED;
            if (own) shared = f[l];
        }
        free(f);
        if (rc)
            return ferry_fail(err, FERRY_ERR_UNSUPPORTED,
                              "key '%s': FFN sizes must be one size for the layers with K/V of their own and "
                              "one for the KV-sharing layers",
                              key);
        hp->ffn_dim = first;
        hp->ffn_dim_shared = shared == first ? 0 : shared;
    }
    hp->ple_dim = 0;
    if (gguf_get_u32(g, KEY("embedding_length_per_layer_input"), &u) == FERRY_OK && u > 0) {
        if (u > (1u << 20) || (uint64_t)u * (uint64_t)hp->n_layers > (1u << 30))
            return ferry_fail(err, FERRY_ERR_FORMAT, "key '%s' is out of range", key);
        hp->ple_dim = (int)u;
    }
    return FERRY_OK;
}

static int gemma4_gguf_hparams(const struct gguf *g, struct llm_hparams *hp, char *err)
{
    char key[96];
    int rc;
    float v;
    /* The 26B-A4B member's experts are not run here. */
    if ((rc = refuse_nonzero(g, KEY("expert_count"), "expert layers (Gemma 4 MoE)", err))) return rc;
    if (hp->n_layers > MAX_LAYERS_G4) return ferry_fail(err, FERRY_ERR_FORMAT, "%d layers", hp->n_layers);

    hp->embed_scale = sqrtf((float)hp->dim);
    hp->attn_scale = 1.0f;
    uint32_t u;
    if (gguf_get_u32(g, KEY("attention.sliding_window"), &u) != FERRY_OK || u < 1 || u > (1u << 30))
        return ferry_fail(err, FERRY_ERR_FORMAT, "key '%s' is missing or out of range", key);
    hp->sliding_window = (int)u;
    uint8_t *swa = malloc((size_t)hp->n_layers);
    if (!swa) return ferry_fail(err, FERRY_ERR_NOMEM, "out of memory");
    rc = layer_pattern(g, hp, swa, err);
    if (!rc) rc = kv_heads(g, hp, swa, err);
    free(swa);
    if (rc) return rc;

    /* Head sizes: key_length (global) and key_length_swa (local); values the same size as keys. */
    int vl = hp->head_dim, vl_swa = 0;
    hp->head_dim_swa = 0;
    if ((rc = opt_u32(g, KEY("attention.value_length"), &vl, err)) ||
        (rc = opt_u32(g, KEY("attention.key_length_swa"), &hp->head_dim_swa, err)))
        return rc;
    if (hp->head_dim_swa == 0) return ferry_fail(err, FERRY_ERR_FORMAT, "missing key '%s'", key);
    vl_swa = hp->head_dim_swa;
    if ((rc = opt_u32(g, KEY("attention.value_length_swa"), &vl_swa, err))) return rc;
    if (vl != hp->head_dim || vl_swa != hp->head_dim_swa)
        return ferry_fail(err, FERRY_ERR_UNSUPPORTED, "value sizes %d/%d differ from key sizes %d/%d", vl,
                          vl_swa, hp->head_dim, hp->head_dim_swa);
    hp->rope_dim_swa = hp->head_dim_swa;
    if ((rc = opt_u32(g, KEY("rope.dimension_count_swa"), &hp->rope_dim_swa, err))) return rc;
    if (hp->head_dim_swa % 2 || hp->rope_dim_swa % 2 || hp->rope_dim_swa > hp->head_dim_swa ||
        hp->n_heads % hp->n_kv_heads_swa)
        return ferry_fail(err, FERRY_ERR_FORMAT,
                          "local layers: head size %d, rotary dims %d, %d KV heads for %d heads are invalid",
                          hp->head_dim_swa, hp->rope_dim_swa, hp->n_kv_heads_swa, hp->n_heads);

    hp->rope_theta_swa = 10000.0f;
    if (gguf_get_f32(g, KEY("rope.freq_base_swa"), &v) == FERRY_OK) {
        if (!(v > 0) || !isfinite(v))
            return ferry_fail(err, FERRY_ERR_FORMAT, "key '%s' is not positive", key);
        hp->rope_theta_swa = v;
    }
    if (gguf_get_f32(g, KEY("final_logit_softcapping"), &v) == FERRY_OK && v != 0.0f) {
        if (!(v > 0) || !isfinite(v))
            return ferry_fail(err, FERRY_ERR_FORMAT, "key '%s' is not positive", key);
        hp->final_softcap = v;
    }
    if (gguf_get_f32(g, KEY("attn_logit_softcapping"), &v) == FERRY_OK && v != 0.0f)
        return ferry_fail(err, FERRY_ERR_UNSUPPORTED, "key '%s': attention soft-capping is not supported",
                          key);
    return small_members(g, hp, err);
}

static int gemma4_hf_hparams(json_t *c, struct llm_hparams *hp, char *err)
{
    (void)c;
    (void)hp;
    return ferry_fail(err, FERRY_ERR_UNSUPPORTED,
                      "config.json: Gemma 4 runs from GGUF files (convert the directory with llama.cpp's "
                      "convert_hf_to_gguf.py)");
}

const struct arch_family arch_gemma4 = {
    .name = "gemma4",
    .title = "Gemma 4 (text, dense)",
    .sizes = "E2B, E4B, 31B",
    .notes = "Gemma 3's block plus global layers with their own head size and KV heads (keys as values), "
             "proportional rotary, value norm, layer output scalars, logit soft-capping; E2B/E4B: per-layer "
             "inputs, KV shared by the last layers; GGUF only; not 26B-A4B (experts)",
    .gguf_names = (const char *const[]){"gemma4", NULL},
    .hf_classes = (const char *const[]){"Gemma4ForCausalLM", "Gemma4ForConditionalGeneration", NULL},
    .hf_types = (const char *const[]){"gemma4_text", "gemma4", NULL},
    .gguf_writes = "gemma4",
    .gguf_rope = ROPE_STYLE_HALF,
    .tensors = gemma4_tensors,
    .n_tensors = sizeof gemma4_tensors / sizeof gemma4_tensors[0],
    .program = &gemma4_program,
    .chat_template = "gemma4",
    .hf_act = "gelu_pytorch_tanh",
    .gguf_hparams = gemma4_gguf_hparams,
    .hf_hparams = gemma4_hf_hparams,
    .gguf_layer_arrays = 1,
};
