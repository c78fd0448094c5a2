/* qwen3next — Qwen3-Next (80B-A3B Instruct / Thinking): the hybrid layers of Qwen3.5-MoE, which descends from
 * it, in their first form. Three of every four layers are gated DeltaNet linear attention, the fourth gated
 * full attention (per head queries then an output gate in attn_q, QK-norm, rotate-half rotary on the first
 * rope.dimension_count dims), every FFN the router's softmax top n_expert_used experts weighted by their
 * probabilities over their sum, plus a shared expert scaled by sigmoid(x · ffn_gate_inp_shexp)
 * (LOP_MOE_SHARED) — qwen35moe's programs, keys and expert tensors. Where Qwen3.5 differs, GGUF files as
 * llama.cpp's converter writes the "qwen3next" architecture (and transformers' qwen3_next model computes):
 *  - value heads stay grouped by key head (value head j reads key head j / (n_v / n_k)), not tiled;
 *  - b and a are one tensor, ssm_ba (2 n_v, dim): per key head the b of its value heads, then their a;
 *  - q|k|v and z come as attn_qkv and attn_gate (today's converter), or as one ssm_in (conv_dim + inner,
 *    dim) of older files: per key head its q, its k, its value heads' v, then their z.
 * The packed products are split per key head after the product (runtime/forward_cpu.c), no copy at load.
 * As for qwen35: RMSNorm weights already 1 + w (the gated output norm's not), ssm_a = -exp(A_log), the
 * multi-token-prediction block (nextn_predict_layers) left to runtime/mtp.h. Hugging Face checkpoints are read as
 * qwen35moe's, their in_proj_qkvz split into attn_qkv and attn_gate as the converter does
 * (arch_qwen35_hf_tensors).
 */
#include "kernels/core/status.h"
#include "weights/arch/qwen35.h"
#include "weights/model_file.h"

/* The in-projections are optional one by one (ssm_in, or attn_qkv and attn_gate; model_init refuses a
 * recurrent layer with neither); attn_qkv after ssm_in, so a file with both runs the split pair. HF names:
 * transformers' where it has the tensor (it has no split q|k|v or z). */
static const struct arch_tensor qwen3next_tensors[] = {
    ARCH_QWEN35_ATTN_TENSORS,
    {ARCH_ROLE_SSM_QKVZ, ARCH_NEED_NEVER, "ssm_in.weight", "linear_attn.in_proj_qkvz.weight"},
    {ARCH_ROLE_SSM_QKV, ARCH_NEED_NEVER, "attn_qkv.weight", ""},
    {ARCH_ROLE_SSM_Z, ARCH_NEED_NEVER, "attn_gate.weight", ""},
    {ARCH_ROLE_SSM_BA, ARCH_NEED_RECURRENT, "ssm_ba.weight", "linear_attn.in_proj_ba.weight"},
    ARCH_QWEN35_SSM_TENSORS,
    ARCH_QWEN35_MOE_TENSORS,
};

static int qwen3next_gguf_hparams(const struct gguf *g, struct llm_hparams *hp, char *err)
{
    int rc = arch_qwen35moe_gguf_hparams(g, hp, err);
    hp->ssm_grouped = 1;
    return rc;
}

static int qwen3next_hf_hparams(struct json_t *c, struct llm_hparams *hp, char *err)
{
    hp->ssm_grouped = 1;
    return arch_qwen35moe_hf_hparams(c, hp, err);
}

const struct arch_family arch_qwen3next = {
    .name = "qwen3next",
    .title = "Qwen3-Next",
    .sizes = "80B-A3B",
    .notes = "qwen35moe's hybrid layers in their first form: packed b/a (and, in older files, q/k/v/z) "
             "in-projections, value heads grouped by key head",
    .gguf_names = (const char *const[]){"qwen3next", NULL},
    .hf_classes = (const char *const[]){"Qwen3NextForCausalLM", NULL},
    .hf_types = (const char *const[]){"qwen3_next", NULL},
    .gguf_writes = "qwen3next",
    .gguf_rope = ROPE_STYLE_HALF,
    .tensors = qwen3next_tensors,
    .n_tensors = sizeof qwen3next_tensors / sizeof qwen3next_tensors[0],
    .program = &arch_qwen35moe_attn_program,
    .program_recurrent = &arch_qwen35moe_linear_program,
    .chat_template = "chatml",
    .gguf_hparams = qwen3next_gguf_hparams,
    .gguf_ffn_optional = 1,
    .hf_hparams = qwen3next_hf_hparams,
    .hf_tensors = arch_qwen35_hf_tensors,
    .gguf_write = arch_qwen35moe_gguf_write,
    .nextn = &arch_qwen35_nextn,
};
