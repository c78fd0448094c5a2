/* phi3 — Phi-3 and Phi-4 (Phi3ForCausalLM, GGUF "phi3"): the Llama block with its q|k|v and gate|up
 * products stored fused (attn_qkv: q rows, then k, then v; ffn_up: gate rows, then up) and split at load
 * into row ranges of the one tensor (no copy), partial rotary (partial_rotary_factor: the first
 * rope_dim of each head's dims rotate, rotate-half pairs), and, where the config has one, a sliding window
 * on every layer (Phi-3 mini; Phi-4 has none). LongRoPE (Phi-3.5, Phi-4-mini) is read with the common rope
 * fields (config.json's rope_scaling, or llama.cpp's rope_factors_short/long.weight tensors and
 * rope.scaling.attn_factor key), its factors chosen by the context (runtime/model.h model_fit_ctx).
 */
#include <jansson.h>
#include <math.h>
#include <stdio.h>

#include "kernels/core/status.h"
#include "weights/arch/arch.h"
#include "weights/gguf.h"
#include "weights/gguf_write.h"
#include "weights/model_file.h"

static const struct arch_tensor phi3_tensors[] = {
    {ARCH_ROLE_ATTN_NORM, ARCH_NEED_ALWAYS, "attn_norm.weight", "input_layernorm.weight"},
    {ARCH_ROLE_WQKV, ARCH_NEED_ALWAYS, "attn_qkv.weight", "self_attn.qkv_proj.weight"},
    {ARCH_ROLE_WO, ARCH_NEED_ALWAYS, "attn_output.weight", "self_attn.o_proj.weight"},
    {ARCH_ROLE_FFN_NORM, ARCH_NEED_ALWAYS, "ffn_norm.weight", "post_attention_layernorm.weight"},
    {ARCH_ROLE_W_GATE_UP, ARCH_NEED_ALWAYS, "ffn_up.weight", "mlp.gate_up_proj.weight"},
    {ARCH_ROLE_W_DOWN, ARCH_NEED_ALWAYS, "ffn_down.weight", "mlp.down_proj.weight"},
};

/* A window on every layer, with the global rotary base (its local layers are all of them). */
static int every_layer_local(struct llm_hparams *hp, long long window, const char *what, char *err)
{
    if (window <= 0 || window >= hp->ctx_train) return FERRY_OK;
    if (window > (1 << 30)) return ferry_fail(err, FERRY_ERR_FORMAT, "%s is out of range", what);
    if (hp->rope_scaling.type != ROPE_SCALING_NONE)
        return ferry_fail(err, FERRY_ERR_UNSUPPORTED, "%s with rope scaling is not supported", what);
    hp->sliding_window = (int)window;
    hp->swa_pattern = 0;
    hp->rope_theta_swa = hp->rope_theta;
    return FERRY_OK;
}

static int phi3_gguf_hparams(const struct gguf *g, struct llm_hparams *hp, char *err)
{
    uint32_t w;
    if (gguf_get_u32(g, "phi3.attention.sliding_window", &w) != FERRY_OK) return FERRY_OK;
    return every_layer_local(hp, w, "key 'phi3.attention.sliding_window'", err);
}

static int phi3_hf_hparams(json_t *c, struct llm_hparams *hp, char *err)
{
    json_t *f = json_object_get(json_object_get(c, "rope_parameters"), "partial_rotary_factor");
    if (!json_is_number(f)) f = json_object_get(c, "partial_rotary_factor");
    if (json_is_number(f)) {
        const double p = json_number_value(f);
        const int rd = (int)(hp->head_dim * p); /* transformers: int(head_dim * partial_rotary_factor) */
        if (!(p > 0 && p <= 1) || rd < 2 || rd % 2)
            return ferry_fail(err, FERRY_ERR_FORMAT,
                              "config.json: partial_rotary_factor %g gives %d rotary dims of %d", p, rd,
                              hp->head_dim);
        hp->rope_dim = rd;
    }
    json_t *sw = json_object_get(c, "sliding_window");
    return json_is_integer(sw)
               ? every_layer_local(hp, json_integer_value(sw), "config.json: sliding_window", err)
               : FERRY_OK;
}

/* llama.cpp's converter writes the window, 0 for none (Phi-4). */
static int phi3_gguf_write(struct gguf_writer *w, const struct llm_hparams *hp, const char *arch, char *err)
{
    (void)arch;
    return gguf_writer_kv_u32(w, "phi3.attention.sliding_window", (uint32_t)hp->sliding_window, err);
}

const struct arch_family arch_phi3 = {
    .name = "phi3",
    .title = "Phi-3, Phi-3.5, Phi-4, Phi-4-mini",
    .sizes = "3.8B-14B",
    .notes = "fused q/k/v and gate/up tensors (split at load, no copy), partial rotary, LongRoPE (short or "
             "long factors by the context size), a window on every layer where the config has one",
    .gguf_names = (const char *const[]){"phi3", NULL},
    .hf_classes = (const char *const[]){"Phi3ForCausalLM", NULL},
    .hf_types = (const char *const[]){"phi3", NULL},
    .gguf_writes = "phi3",
    .gguf_rope = ROPE_STYLE_HALF,
    .tensors = phi3_tensors,
    .n_tensors = sizeof phi3_tensors / sizeof phi3_tensors[0],
    .program = &arch_llama_program,
    .chat_template = "phi3",
    .gguf_hparams = phi3_gguf_hparams,
    .hf_hparams = phi3_hf_hparams,
    .gguf_write = phi3_gguf_write,
};
