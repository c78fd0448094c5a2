/* qwen35 — Qwen3.5 / 3.6 dense (0.8B-27B): a hybrid of gated DeltaNet linear attention and full attention.
 * Three of every four layers (all but those with (l + 1) % full_attention_interval == 0) are linear: their
 * mixer keeps a fixed-size convolution and recurrent state per sequence instead of a KV cache
 * (LOP_DELTANET). The others are full attention whose q_proj also yields a per-head output gate (attn *
 * sigmoid(gate)), with QK-norm and rotary on the first rope.dimension_count dims of each head only (Qwen3.5's
 * interleaved multimodal rotary gives every section the same position for text, so it is ordinary rotate-half
 * rotary there). Every layer ends with a SwiGLU FFN after post_attention_norm.
 * GGUF files as llama.cpp's converter writes the "qwen35" architecture: its RMSNorm weights already 1 + w,
 * ssm_a already -exp(A_log), value heads tiled over the key heads (kernels/cpu/deltanet.h). Hugging Face
 * checkpoints (Qwen3_5ForCausalLM, and the language model of Qwen3_5ForConditionalGeneration) are read and
 * rearranged into that layout (arch_qwen35_hf_tensors).
 */
#include "weights/arch/qwen35.h"

#include <jansson.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/core/status.h"
#include "quant/dtype.h"
#include "weights/gguf.h"
#include "weights/gguf_write.h"
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
     * the trunk's layers in block_count; the trunk's reader leaves their tensors alone (runtime/mtp.h reads
     * them for drafting). */
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

const struct arch_nextn arch_qwen35_nextn = {
    .eh_proj = "nextn.eh_proj.weight",
    .enorm = "nextn.enorm.weight",
    .hnorm = "nextn.hnorm.weight",
    .embed = "nextn.embed_tokens.weight",
    .head = "nextn.shared_head_head.weight",
    .head_norm = "nextn.shared_head_norm.weight",
};

const struct arch_family arch_qwen35 = {
    .name = "qwen35",
    .title = "Qwen3.5 / 3.6 (dense)",
    .sizes = "0.8B-27B",
    .notes = "gated DeltaNet linear attention in 3 of 4 layers (per-sequence state); "
             "gated full attention with partial rotary",
    .gguf_names = (const char *const[]){"qwen35", NULL},
    .hf_classes = (const char *const[]){"Qwen3_5ForCausalLM", "Qwen3_5ForConditionalGeneration", NULL},
    .hf_types = (const char *const[]){"qwen3_5_text", "qwen3_5", NULL},
    .gguf_writes = "qwen35",
    .gguf_rope = ROPE_STYLE_HALF,
    .tensors = qwen35_tensors,
    .n_tensors = sizeof qwen35_tensors / sizeof qwen35_tensors[0],
    .program = &qwen35_attn_program,
    .program_recurrent = &qwen35_linear_program,
    .chat_template = "chatml",
    .gguf_hparams = arch_qwen35_gguf_hparams,
    .hf_hparams = arch_qwen35_hf_hparams,
    .hf_tensors = arch_qwen35_hf_tensors,
    .gguf_write = arch_qwen35_gguf_write,
    .nextn = &arch_qwen35_nextn,
};

/* ---------------------------------------------------------------- Hugging Face checkpoints */

/* A positive integer of config.json no larger than max; absent: def (def < 1: required). */
static int cfg_int(json_t *c, const char *key, int def, int max, int *out, char *err)
{
    json_t *v = json_object_get(c, key);
    if ((!v || json_is_null(v)) && def >= 1) {
        *out = def;
        return FERRY_OK;
    }
    if (!json_is_integer(v) || json_integer_value(v) < 1 || json_integer_value(v) > max)
        return ferry_fail(err, FERRY_ERR_FORMAT, "config.json: '%s' is missing or not an integer in 1..%d",
                          key, max);
    *out = (int)json_integer_value(v);
    return FERRY_OK;
}

/* The layer pattern: full_attention_interval, else the position of layer_types' first full-attention layer
 * plus one, else 4; layer_types, when given, must be that pattern. */
static int hf_layer_pattern(json_t *c, struct llm_hparams *hp, char *err)
{
    json_t *types = json_object_get(c, "layer_types");
    const int have_types = types && !json_is_null(types);
    if (have_types && (!json_is_array(types) || (int)json_array_size(types) != hp->n_layers))
        return ferry_fail(err, FERRY_ERR_FORMAT, "config.json: layer_types is not a list of %d layer kinds",
                          hp->n_layers);
    int def = 4;
    for (int l = 0; have_types && l < hp->n_layers; l++) {
        const char *t = json_string_value(json_array_get(types, (size_t)l));
        if (t && !strcmp(t, "full_attention")) {
            def = l + 1;
            break;
        }
    }
    int rc = cfg_int(c, "full_attention_interval", def, 4096, &hp->full_attn_interval, err);
    for (int l = 0; rc == FERRY_OK && have_types && l < hp->n_layers; l++) {
        const char *t = json_string_value(json_array_get(types, (size_t)l));
        const char *want = llm_layer_is_recurrent(hp, l) ? "linear_attention" : "full_attention";
        if (!t || strcmp(t, want) != 0)
            rc = ferry_fail(err, FERRY_ERR_UNSUPPORTED,
                            "config.json: layer_types[%d] is '%.30s', which the full_attention_interval %d "
                            "pattern does not give (only that pattern is supported)",
                            l, t ? t : "?", hp->full_attn_interval);
    }
    return rc;
}

int arch_qwen35_hf_hparams(json_t *c, struct llm_hparams *hp, char *err)
{
    int rc, head_v = 0;
    hp->attn_out_gate = 1;
    json_t *gate = json_object_get(c, "attn_output_gate");
    if (gate && !json_is_null(gate) && !json_is_true(gate))
        return ferry_fail(err, FERRY_ERR_UNSUPPORTED,
                          "config.json: attn_output_gate false (full attention without its output gate) is "
                          "not supported");
    if ((rc = cfg_int(c, "linear_conv_kernel_dim", 0, 16, &hp->ssm_conv_kernel, err)) ||
        (rc = cfg_int(c, "linear_key_head_dim", 0, 1024, &hp->ssm_head_k, err)) ||
        (rc = cfg_int(c, "linear_num_key_heads", 0, 1024, &hp->ssm_n_k_heads, err)) ||
        (rc = cfg_int(c, "linear_num_value_heads", 0, 1024, &hp->ssm_n_v_heads, err)) ||
        (rc = cfg_int(c, "linear_value_head_dim", 0, 1024, &head_v, err)))
        return rc;
    hp->ssm_inner = head_v * hp->ssm_n_v_heads;
    if (hp->ssm_n_v_heads % hp->ssm_n_k_heads)
        return ferry_fail(
            err, FERRY_ERR_FORMAT,
            "config.json: linear_num_value_heads %d is not a multiple of linear_num_key_heads %d",
            hp->ssm_n_v_heads, hp->ssm_n_k_heads);
    if ((rc = hf_layer_pattern(c, hp, err))) return rc;
    /* Rotary on the first head_dim * partial_rotary_factor dims (rope_parameters' or the top-level key;
     * 0.25 when neither has it, as llama.cpp's converter assumes). */
    json_t *rp = json_object_get(c, "rope_parameters");
    json_t *pf = json_object_get(json_is_object(rp) ? rp : c, "partial_rotary_factor");
    if (!pf) pf = json_object_get(c, "partial_rotary_factor");
    const double f = !pf || json_is_null(pf) ? 0.25 : json_is_number(pf) ? json_number_value(pf) : -1;
    if (!(f > 0 && f <= 1))
        return ferry_fail(err, FERRY_ERR_FORMAT, "config.json: partial_rotary_factor is not in (0, 1]");
    hp->rope_dim = (int)(hp->head_dim * f);
    if (hp->rope_dim < 2 || hp->rope_dim % 2)
        return ferry_fail(
            err, FERRY_ERR_FORMAT,
            "config.json: head_dim %d * partial_rotary_factor %g gives %d rotary dims (even, >= 2)",
            hp->head_dim, f, hp->rope_dim);
    /* The multimodal rotary's sections: text positions are equal in all of them, so only kept for the GGUF
     * writer (llama.cpp requires the key; its converter's default when the config has none). */
    static const int def_sections[4] = {11, 11, 10, 0};
    memcpy(hp->rope_sections, def_sections, sizeof def_sections);
    json_t *ms = json_is_object(rp) ? json_object_get(rp, "mrope_section") : NULL;
    if (ms && !json_is_null(ms)) {
        if (!json_is_array(ms) || json_array_size(ms) < 1 || json_array_size(ms) > 4)
            return ferry_fail(err, FERRY_ERR_FORMAT,
                              "config.json: mrope_section is not a list of 1..4 numbers");
        for (size_t i = 0; i < 4; i++) {
            json_t *v = json_array_get(ms, i);
            if (v && (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > 4096))
                return ferry_fail(err, FERRY_ERR_FORMAT, "config.json: mrope_section[%zu] is out of range",
                                  i);
            hp->rope_sections[i] = v ? (int)json_integer_value(v) : 0;
        }
    }
    return FERRY_OK;
}

int arch_qwen35_gguf_write(struct gguf_writer *w, const struct llm_hparams *hp, const char *arch, char *err)
{
    char key[96];
    int rc;
#define WKEY(k) (snprintf(key, sizeof key, "%s.%s", arch, k), key)
    if ((rc = gguf_writer_kv_u32(w, WKEY("ssm.conv_kernel"), (uint32_t)hp->ssm_conv_kernel, err)) ||
        (rc = gguf_writer_kv_u32(w, WKEY("ssm.state_size"), (uint32_t)hp->ssm_head_k, err)) ||
        (rc = gguf_writer_kv_u32(w, WKEY("ssm.group_count"), (uint32_t)hp->ssm_n_k_heads, err)) ||
        (rc = gguf_writer_kv_u32(w, WKEY("ssm.time_step_rank"), (uint32_t)hp->ssm_n_v_heads, err)) ||
        (rc = gguf_writer_kv_u32(w, WKEY("ssm.inner_size"), (uint32_t)hp->ssm_inner, err)))
        return rc;
    uint8_t rec[4096];
    const int n = hp->n_layers < (int)sizeof rec ? hp->n_layers : (int)sizeof rec;
    for (int l = 0; l < n; l++) rec[l] = (uint8_t)llm_layer_is_recurrent(hp, l);
    if ((rc = gguf_writer_kv_arr(w, WKEY("attention.recurrent_layers"), GGUF_TYPE_BOOL, rec, (uint64_t)n,
                                 err)) ||
        (rc = gguf_writer_kv_u32(w, WKEY("full_attention_interval"), (uint32_t)hp->full_attn_interval, err)))
        return rc;
    if (hp->ssm_grouped) return FERRY_OK; /* Qwen3-Next: no multimodal rotary */
    int32_t sec[4];
    for (int i = 0; i < 4; i++) sec[i] = hp->rope_sections[i];
    return gguf_writer_kv_arr(w, WKEY("rope.dimension_sections"), GGUF_TYPE_INT32, sec, 4, err);
#undef WKEY
}

/* Owned memory for the rearranged tensors: counted in a first pass (base NULL), carved in the second. */
struct hf_arena {
    char *base;
    size_t used;
};

static void *arena_take(struct hf_arena *a, size_t n)
{
    void *p = a->base ? a->base + a->used : NULL;
    a->used += (n + 15) & ~(size_t)15;
    return p;
}

/* Row i of a block of value heads in llama.cpp's Qwen3.5 order (tiled over the key heads: value head
 * j * n_k + g) comes from this row of transformers' order (grouped by key head: g * r + j), heads of hd
 * rows each (convert_hf_to_gguf.py's _reorder_v_heads). */
static size_t tiled_src(size_t i, size_t nk, size_t r, size_t hd)
{
    const size_t j = i / (nk * hd), g = i / hd % nk, d = i % hd;
    return (g * r + j) * hd + d;
}

/* t's rows [first, first + nk r hd) (or, cols set, every row's elements there) in the tiled order, into
 * owned memory. */
static void reorder_v(struct hf_arena *a, struct wtensor *t, size_t first, size_t nk, size_t r, size_t hd,
                      int cols)
{
    const size_t nelem = (size_t)(t->ne[0] * t->ne[1] * t->ne[2] * t->ne[3]);
    char *dst = arena_take(a, nelem * 4); /* F32 at most: the same count before and after map_vector */
    if (!dst) return;
    const size_t es = dtype_type_size(t->type), row = (size_t)t->ne[0] * es, n = nk * r * hd;
    const size_t rows = t->nbytes / row;
    memcpy(dst, t->data, t->nbytes);
    for (size_t i = 0; i < n; i++) {
        const size_t s = tiled_src(i, nk, r, hd);
        if (cols)
            for (size_t y = 0; y < rows; y++)
                memcpy(dst + y * row + (first + i) * es, (const char *)t->data + y * row + (first + s) * es,
                       es);
        else
            memcpy(dst + (first + i) * row, (const char *)t->data + (first + s) * row, row);
    }
    t->data = dst;
}

/* t's elements through f (x -> x + 1, or -> -exp x), in F16 when t is F16 (the converter computes in the
 * checkpoint's F16), else F32 (it widens BF16 first). */
static int map_vector(struct hf_arena *a, struct wtensor *t, int neg_exp, char *err)
{
    const int64_t n = t->ne[0] * t->ne[1] * t->ne[2] * t->ne[3];
    const enum dtype to = t->type == DTYPE_F16 ? DTYPE_F16 : DTYPE_F32;
    float *tmp = arena_take(a, (size_t)n * sizeof *tmp);
    char *dst = arena_take(a, (size_t)n * dtype_type_size(to));
    if (!dst) return FERRY_OK;
    if (!dtype_to_f32(t->type, t->data, tmp, n))
        return ferry_fail(err, FERRY_ERR_FORMAT, "tensor %s: type %s is not F32, F16 or BF16", t->name,
                          dtype_name(t->type));
    for (int64_t i = 0; i < n; i++) tmp[i] = neg_exp ? (float)-exp((double)tmp[i]) : tmp[i] + 1.0f;
    dtype_from_f32(to, tmp, dst, n);
    t->data = dst, t->type = to, t->nbytes = (size_t)n * dtype_type_size(to);
    return FERRY_OK;
}

static int ends_with(const char *s, const char *suffix)
{
    const size_t n = strlen(s), m = strlen(suffix);
    return n >= m && !strcmp(s + n - m, suffix);
}

/* Qwen3-Next's in_proj_qkvz (ssm_in: per key head its q, its k, its value heads' v, then their z) as the
 * converter splits it: attn_qkv (all q, all k, all v) in t's place, attn_gate (all z) appended at *extra. */
static void split_qkvz(struct hf_arena *a, const struct llm_hparams *hp, struct wtensor *t,
                       struct wtensor *extra)
{
    const size_t nk = (size_t)hp->ssm_n_k_heads, hk = (size_t)hp->ssm_head_k,
                 rv = (size_t)(hp->ssm_inner / hp->ssm_n_k_heads), row = t->nbytes / (size_t)t->ne[1];
    char *qkv = arena_take(a, t->nbytes);
    if (!qkv) return;
    char *z = qkv + (size_t)llm_ssm_conv_dim(hp) * row;
    const char *src = t->data;
    for (size_t g = 0; g < nk; g++) {
        const char *s = src + g * (2 * hk + 2 * rv) * row;
        memcpy(qkv + g * hk * row, s, hk * row);
        memcpy(qkv + (nk + g) * hk * row, s + hk * row, hk * row);
        memcpy(qkv + (2 * nk * hk + g * rv) * row, s + 2 * hk * row, rv * row);
        memcpy(z + g * rv * row, s + (2 * hk + rv) * row, rv * row);
    }
    char blk[24]; /* "blk.N." */
    snprintf(blk, sizeof blk, "%.*s", (int)(strstr(t->name, "ssm_in.weight") - t->name), t->name);
    *extra = *t;
    snprintf(t->name, sizeof t->name, "%sattn_qkv.weight", blk);
    snprintf(extra->name, sizeof extra->name, "%sattn_gate.weight", blk);
    t->data = qkv, t->ne[1] = llm_ssm_conv_dim(hp), t->nbytes = (size_t)t->ne[1] * row;
    extra->data = z, extra->ne[1] = hp->ssm_inner, extra->nbytes = (size_t)hp->ssm_inner * row;
}

/* One pass over the tensors (a->base NULL: counting only). */
static int hf_rearrange(struct model_file *mf, struct hf_arena *a, int n_split, char *err)
{
    const struct llm_hparams *hp = &mf->hp;
    const size_t nk = (size_t)hp->ssm_n_k_heads, r = (size_t)(hp->ssm_n_v_heads / hp->ssm_n_k_heads),
                 hv = (size_t)llm_ssm_head_v(hp), qk = 2 * nk * (size_t)hp->ssm_head_k;
    const int tile = !hp->ssm_grouped && r > 1;
    int split = 0;
    const int n = mf->n_tensors;
    for (int i = 0; i < n; i++) {
        struct wtensor *t = &mf->tensors[i];
        const char *nm = t->name;
        int rc = FERRY_OK;
        if (ends_with(nm, ".ssm_in.weight")) {
            if (t->ne[0] != hp->dim || t->ne[1] != llm_ssm_conv_dim(hp) + hp->ssm_inner || t->n_dims != 2)
                return ferry_fail(err, FERRY_ERR_FORMAT,
                                  "tensor %s (in_proj_qkvz) has ne [%lld, %lld], expected [%d, %d]", nm,
                                  (long long)t->ne[0], (long long)t->ne[1], hp->dim,
                                  llm_ssm_conv_dim(hp) + hp->ssm_inner);
            if (a->base)
                split_qkvz(a, hp, t, &mf->tensors[n + split]);
            else
                arena_take(a, t->nbytes);
            split++;
            continue;
        }
        if (ends_with(nm, ".ssm_conv1d.weight")) { /* (conv_dim, 1, width) -> (conv_dim, width) */
            if (t->n_dims != 3 || t->ne[1] != 1 || t->ne[2] != llm_ssm_conv_dim(hp))
                return ferry_fail(err, FERRY_ERR_FORMAT,
                                  "tensor %s has ne [%lld, %lld, %lld], expected [%d, 1, %d]", nm,
                                  (long long)t->ne[0], (long long)t->ne[1], (long long)t->ne[2],
                                  hp->ssm_conv_kernel, llm_ssm_conv_dim(hp));
            if (a->base) t->n_dims = 2, t->ne[1] = t->ne[2], t->ne[2] = 1;
            if (tile) reorder_v(a, t, qk, nk, r, hv, 0);
            continue;
        }
        /* Shapes are checked at validation; these reorders need only the row counts they touch. */
        const int64_t rows = t->ne[1] * t->ne[2] * t->ne[3];
        if (ends_with(nm, "norm.weight") && !ends_with(nm, ".ssm_norm.weight")) {
            rc = map_vector(a, t, 0, err);
        } else if (ends_with(nm, ".ssm_a")) {
            if ((rc = map_vector(a, t, 1, err)) == FERRY_OK && tile && t->ne[0] == (int64_t)(nk * r))
                reorder_v(a, t, 0, nk, r, 1, 1);
        } else if (!tile) {
            continue;
        } else if (ends_with(nm, ".ssm_dt.bias") && t->ne[0] == (int64_t)(nk * r)) {
            reorder_v(a, t, 0, nk, r, 1, 1);
        } else if (ends_with(nm, ".attn_qkv.weight") && rows == (int64_t)(qk + nk * r * hv)) {
            reorder_v(a, t, qk, nk, r, hv, 0);
        } else if (ends_with(nm, ".attn_gate.weight") && rows == (int64_t)(nk * r * hv)) {
            reorder_v(a, t, 0, nk, r, hv, 0);
        } else if ((ends_with(nm, ".ssm_beta.weight") || ends_with(nm, ".ssm_alpha.weight")) &&
                   rows == (int64_t)(nk * r)) {
            reorder_v(a, t, 0, nk, r, 1, 0);
        } else if (ends_with(nm, ".ssm_out.weight") && t->ne[0] == (int64_t)(nk * r * hv)) {
            reorder_v(a, t, 0, nk, r, hv, 1);
        }
        if (rc) return rc;
    }
    if (a->base) mf->n_tensors += n_split;
    return split;
}

int arch_qwen35_hf_tensors(struct model_file *mf, char *err)
{
    struct hf_arena a = {0};
    int n_split = hf_rearrange(mf, &a, 0, err);
    if (n_split < 0) return n_split;
    struct wtensor *nt = realloc(mf->tensors, ((size_t)mf->n_tensors + (size_t)n_split + 1) * sizeof *nt);
    if (!nt || !(a.base = malloc(a.used ? a.used : 1))) {
        if (nt) mf->tensors = nt;
        return ferry_fail(err, FERRY_ERR_NOMEM, "out of memory for the linear attention's layout");
    }
    mf->tensors = nt;
    mf->arch_owned = a.base;
    a.used = 0;
    const int rc = hf_rearrange(mf, &a, n_split, err);
    return rc < 0 ? rc : FERRY_OK;
}
