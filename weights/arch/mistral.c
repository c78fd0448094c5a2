/* mistral — Mistral 7B and Nemo: the Llama block (llama.c). llama.cpp writes these checkpoints as "llama"
 * GGUF files; a "mistral" GGUF architecture is read with the same keys. Their config.json's sliding_window
 * is ignored (full attention), with a warning when it is shorter than the context.
 */
#include "weights/arch/arch.h"
#include "weights/model_file.h"

static const struct arch_tensor mistral_tensors[] = {ARCH_LLAMA_TENSORS};

const struct arch_family arch_mistral = {
    .name = "mistral",
    .title = "Mistral 7B, Mistral Nemo",
    .sizes = "7B-12B",
    .notes = "the Llama block; the config's `sliding_window` is ignored (full attention)",
    .gguf_names = (const char *const[]){"mistral", NULL},
    .hf_classes = (const char *const[]){"MistralForCausalLM", NULL},
    .hf_types = (const char *const[]){"mistral", NULL},
    .gguf_writes = "llama",
    .gguf_rope = ROPE_STYLE_INTERLEAVED,
    .hf_window_warn = 1,
    .tensors = mistral_tensors,
    .n_tensors = sizeof mistral_tensors / sizeof mistral_tensors[0],
    .program = &arch_llama_program,
    .is_70b = arch_llama_is_70b,
    .chat_template = "chatml",
};
