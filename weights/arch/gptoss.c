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
 * (it stores none either). Hugging Face directories with F32/F16/BF16 experts are read (transformers stores
 * them transposed, gate and up interleaved: rearranged at load); the released checkpoints' MXFP4 blocks are
 * not: convert those with llama.cpp's convert_hf_to_gguf.py.
 * Chat: the harmony format, from the file's own template.
 */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
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

/* HF names as transformers writes them; its experts are stacked and transposed, gate and up in one tensor
 * (gptoss_hf_tensors makes the GGUF layout of them). */
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
    {ARCH_ROLE_EXP_UP, ARCH_NEED_ALWAYS, "ffn_up_exps.weight", "(split from gate_up_proj)"},
    {ARCH_ROLE_EXP_DOWN, ARCH_NEED_ALWAYS, "ffn_down_exps.weight", "mlp.experts.down_proj"},
    {ARCH_ROLE_EXP_GATE_BIAS, ARCH_NEED_ALWAYS, "ffn_gate_exps.bias", "mlp.experts.gate_up_proj_bias"},
    {ARCH_ROLE_EXP_UP_BIAS, ARCH_NEED_ALWAYS, "ffn_up_exps.bias", "(split from gate_up_proj_bias)"},
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

/* config.json: the experts (num_local_experts, num_experts_per_tok, intermediate_size), the window on the
 * even layers (sliding_window; layer_types must alternate from a sliding one), the clamped SwiGLU's
 * swiglu_alpha and swiglu_limit. rope_scaling (yarn, with its truncate) is read with the common fields. */
static int gptoss_hf_hparams(json_t *c, struct llm_hparams *hp, char *err)
{
    const char *f = "config.json";
    json_t *n = json_object_get(c, "num_local_experts"), *k = json_object_get(c, "num_experts_per_tok"),
           *sw = json_object_get(c, "sliding_window");
    if (!json_is_integer(n) || !json_is_integer(k) || json_integer_value(n) < 1 ||
        json_integer_value(n) > (1 << 20) || json_integer_value(k) < 1 || json_integer_value(k) > (1 << 20))
        return ferry_fail(err, FERRY_ERR_FORMAT,
                          "%s: num_local_experts and num_experts_per_tok must be positive integers", f);
    if (!json_is_integer(sw) || json_integer_value(sw) < 1 || json_integer_value(sw) > (1 << 30))
        return ferry_fail(err, FERRY_ERR_FORMAT, "%s: sliding_window must be a positive integer", f);
    hp->n_expert = (int)json_integer_value(n);
    hp->n_expert_used = (int)json_integer_value(k);
    hp->expert_ffn_dim = hp->ffn_dim;
    hp->expert_norm_topk = 1;
    hp->qkv_bias = 1;
    hp->sliding_window = (int)json_integer_value(sw);
    hp->swa_pattern = 2;
    hp->swa_rope_scaled = 1;
    hp->rope_theta_swa = hp->rope_theta;
    json_t *types = json_object_get(c, "layer_types");
    for (int l = 0; types && !json_is_null(types) && l < hp->n_layers; l++) {
        const char *t = json_string_value(json_array_get(types, (size_t)l));
        if (!json_is_array(types) || (int)json_array_size(types) != hp->n_layers || !t ||
            strcmp(t, l % 2 ? "full_attention" : "sliding_attention") != 0)
            return ferry_fail(err, FERRY_ERR_UNSUPPORTED,
                              "%s: layer_types[%d] breaks the sliding/full alternation", f, l);
    }
    json_t *a = json_object_get(c, "swiglu_alpha"), *lim = json_object_get(c, "swiglu_limit");
    hp->swiglu_alpha = json_is_number(a) ? (float)json_number_value(a) : 1.702f;
    hp->swiglu_limit = json_is_number(lim) ? (float)json_number_value(lim) : 7.0f;
    if (!(hp->swiglu_alpha > 0) || !(hp->swiglu_limit > 0) || hp->swiglu_alpha > 1e6f ||
        hp->swiglu_limit > 1e6f)
        return ferry_fail(err, FERRY_ERR_FORMAT, "%s: swiglu_alpha and swiglu_limit must be positive", f);
    return FERRY_OK;
}

/* Copies element (i) of src to element (j) of dst, es bytes each. */
static inline void elem_copy(char *dst, size_t j, const char *src, size_t i, size_t es)
{
    memcpy(dst + j * es, src + i * es, es);
}

/* transformers stores layer l's experts as mlp.experts.gate_up_proj (E, dim, 2 ffn), gate and up in the even
 * and odd columns, gate_up_proj_bias (E, 2 ffn) likewise, and down_proj (E, ffn, dim): mapped by name to
 * ffn_gate_exps.{weight,bias} and ffn_down_exps.weight, they are rearranged here as llama.cpp's converter
 * does: gate and up split and each transposed to (E, ffn, dim), down transposed to (E, dim, ffn), the bias
 * split. The new layouts live in mf->arch_owned; ffn_up_exps.{weight,bias} are appended to the tensor list.
 */
static int gptoss_hf_tensors(struct model_file *mf, char *err)
{
    const struct llm_hparams *hp = &mf->hp;
    const size_t E = (size_t)hp->n_expert, F = (size_t)hp->expert_ffn_dim, D = (size_t)hp->dim;
    const int L = hp->n_layers;
    char name[96];
    size_t bytes = 0;
    if (L < 1 || L > 4096) return ferry_fail(err, FERRY_ERR_FORMAT, "%d layers is out of range", L);
    int *at = malloc(3 * (size_t)L * sizeof *at); /* per layer: gate_up, its bias, down (tensor indices) */
    if (!at) return ferry_fail(err, FERRY_ERR_NOMEM, "out of memory");
    for (int l = 0; l < L; l++) {
        static const char *const what[3] = {"ffn_gate_exps.weight", "ffn_gate_exps.bias",
                                            "ffn_down_exps.weight"};
        static const char *const hf[3] = {"gate_up_proj", "gate_up_proj_bias", "down_proj"};
        const int64_t want[3][3] = {{(int64_t)(2 * F), (int64_t)D, (int64_t)E},
                                    {(int64_t)(2 * F), (int64_t)E, 1},
                                    {(int64_t)D, (int64_t)F, (int64_t)E}};
        for (int i = 0; i < 3; i++) {
            snprintf(name, sizeof name, "blk.%d.%s", l, what[i]);
            int j = 0;
            while (j < mf->n_tensors && strcmp(mf->tensors[j].name, name) != 0) j++;
            const struct wtensor *t = j < mf->n_tensors ? &mf->tensors[j] : NULL;
            int rc = FERRY_OK;
            if (!t)
                rc = ferry_fail(err, FERRY_ERR_FORMAT,
                                "missing tensor 'model.layers.%d.mlp.experts.%s' (F32/F16/BF16; MXFP4 "
                                "checkpoints: convert them with llama.cpp's convert_hf_to_gguf.py)",
                                l, hf[i]);
            else if (t->ne[0] != want[i][0] || t->ne[1] != want[i][1] || t->ne[2] != want[i][2] ||
                     t->ne[3] != 1)
                rc = ferry_fail(err, FERRY_ERR_FORMAT,
                                "tensor 'model.layers.%d.mlp.experts.%s' has ne [%lld, %lld, %lld], expected "
                                "[%lld, %lld, %lld]",
                                l, hf[i], (long long)t->ne[0], (long long)t->ne[1], (long long)t->ne[2],
                                (long long)want[i][0], (long long)want[i][1], (long long)want[i][2]);
            if (rc) {
                free(at);
                return rc;
            }
            at[3 * l + i] = j;
            bytes += t->nbytes;
        }
    }
    char *buf = malloc(bytes ? bytes : 1);
    struct wtensor *nt =
        buf ? realloc(mf->tensors, ((size_t)mf->n_tensors + 2 * (size_t)L + 1) * sizeof *nt) : NULL;
    if (!nt) {
        free(buf);
        free(at);
        return ferry_fail(err, FERRY_ERR_NOMEM, "out of memory for the experts' layout");
    }
    mf->tensors = nt;
    mf->arch_owned = buf;
    char *o = buf;
    for (int l = 0; l < L; l++) {
        struct wtensor *g = &mf->tensors[at[3 * l]], *b = &mf->tensors[at[3 * l + 1]],
                       *d = &mf->tensors[at[3 * l + 2]];
        const size_t es = dtype_type_size(g->type), eb = dtype_type_size(b->type),
                     ed = dtype_type_size(d->type);
        const char *src = g->data;
        char *gate = o, *up = o + E * F * D * es;
        for (size_t e = 0; e < E; e++)
            for (size_t c = 0; c < D; c++)
                for (size_t r = 0; r < F; r++) {
                    const size_t s0 = (e * D + c) * 2 * F + 2 * r, t0 = (e * F + r) * D + c;
                    elem_copy(gate, t0, src, s0, es);
                    elem_copy(up, t0, src, s0 + 1, es);
                }
        o += 2 * E * F * D * es;
        const char *bs = b->data;
        char *gb = o, *ub = o + E * F * eb;
        for (size_t i = 0; i < E * F; i++)
            elem_copy(gb, i, bs, 2 * i, eb), elem_copy(ub, i, bs, 2 * i + 1, eb);
        o += 2 * E * F * eb;
        const char *ds = d->data;
        for (size_t e = 0; e < E; e++)
            for (size_t r = 0; r < F; r++)
                for (size_t c = 0; c < D; c++) elem_copy(o, (e * D + c) * F + r, ds, (e * F + r) * D + c, ed);
        d->data = o, d->ne[0] = (int64_t)F, d->ne[1] = (int64_t)D;
        o += E * F * D * ed;
        struct wtensor *u = &mf->tensors[mf->n_tensors++], *ubt = &mf->tensors[mf->n_tensors++];
        *u = *g, *ubt = *b;
        snprintf(u->name, sizeof u->name, "blk.%d.ffn_up_exps.weight", l);
        snprintf(ubt->name, sizeof ubt->name, "blk.%d.ffn_up_exps.bias", l);
        g->data = gate, u->data = up;
        g->ne[0] = u->ne[0] = (int64_t)D, g->ne[1] = u->ne[1] = (int64_t)F;
        g->nbytes = u->nbytes = E * F * D * es;
        b->data = gb, ubt->data = ub;
        b->ne[0] = ubt->ne[0] = (int64_t)F;
        b->nbytes = ubt->nbytes = E * F * eb;
    }
    free(at);
    return FERRY_OK;
}

const struct arch_family arch_gptoss = {
    .name = "gpt-oss",
    .title = "gpt-oss",
    .sizes = "20B, 120B",
    .notes = "attention sinks, 128-position windows on every other layer, YaRN, q/k/v/o biases; top-4 "
             "experts with biases and a clamped SwiGLU, MXFP4 in GGUF; harmony answers (analysis "
             "reasoning, `to=functions` tools)",
    .gguf_names = (const char *const[]){"gpt-oss", NULL},
    .hf_classes = (const char *const[]){"GptOssForCausalLM", NULL},
    .hf_types = (const char *const[]){"gpt_oss", NULL},
    .gguf_writes = "gpt-oss",
    .gguf_rope = ROPE_STYLE_HALF,
    .tensors = gptoss_tensors,
    .n_tensors = sizeof gptoss_tensors / sizeof gptoss_tensors[0],
    .program = &gptoss_program,
    .chat_template = "chatml",
    .hf_qkv_bias = 1,
    .gguf_hparams = gptoss_gguf_hparams,
    .hf_hparams = gptoss_hf_hparams,
    .gguf_write = gptoss_gguf_write,
    .hf_attention_bias = 1,
    .hf_tensors = gptoss_hf_tensors,
};
