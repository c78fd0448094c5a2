/* qwen2 — Qwen2 and Qwen2.5: the Llama block with q/k/v biases (always present in its HF checkpoints) and
 * rotate-half rotary pairs in its GGUF files too (llama.cpp's NEOX rope; its converter does not permute).
 */
#include "weights/arch/arch.h"
#include "weights/model_file.h"

static const struct arch_tensor qwen2_tensors[] = {ARCH_LLAMA_TENSORS};

/* llama-model.cpp: any qwen2 of 80 layers is 70B. */
static int qwen2_is_70b(const struct llm_hparams *hp)
{
    return hp->n_layers == 80;
}

const struct arch_family arch_qwen2 = {
    .name = "qwen2",
    .title = "Qwen2, Qwen2.5",
    .sizes = "0.5B-72B",
    .notes = "q/k/v biases; rotate-half rotary in GGUF too",
    .gguf_names = (const char *const[]){"qwen2", NULL},
    .hf_classes = (const char *const[]){"Qwen2ForCausalLM", NULL},
    .hf_types = (const char *const[]){"qwen2", NULL},
    .gguf_writes = "qwen2",
    .gguf_rope = ROPE_STYLE_HALF,
    .hf_qkv_bias = 1,
    .tensors = qwen2_tensors,
    .n_tensors = sizeof qwen2_tensors / sizeof qwen2_tensors[0],
    .program = &arch_llama_program,
    .is_70b = qwen2_is_70b,
    .chat_template = "chatml",
};
