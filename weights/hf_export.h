/* hf_export — the GGUF metadata llama.cpp expects for a Hugging Face Llama-family checkpoint, as its
 * convert_hf_to_gguf.py writes it: general.*, the {arch}.* hyperparameters, and the tokenizer.
 *
 * Keys written (llama arch; qwen2 likewise with its own prefix): general.architecture, general.type,
 * general.name, {arch}.block_count, context_length, embedding_length, feed_forward_length,
 * attention.head_count, attention.head_count_kv, rope.freq_base, attention.layer_norm_rms_epsilon,
 * [attention.key_length/value_length when head_dim != dim / heads], vocab_size, rope.dimension_count,
 * [rope.scaling.type/factor for linear scaling; llama3 scaling goes into a rope_freqs.weight tensor instead,
 * see hf_export_rope_freqs], then tokenizer.* (see hf_export_tokenizer).
 */
#ifndef FERRY_HF_EXPORT_H
#define FERRY_HF_EXPORT_H

#include "weights/gguf_write.h"
#include "weights/model_file.h"

/* All of it: hyperparameters, then hf_export_tokenizer. arch: the general.architecture to write (the family's
 * gguf_writes, weights/arch/arch.h: llama.cpp writes Mistral checkpoints as llama). */
int hf_export_metadata(struct gguf_writer *w, const struct model_file *mf, const char *arch, char err[256]);

/* A byte-level BPE tokenizer.json (Llama 3, Qwen2, SmolLM, GPT-2 style) as llama.cpp's "gpt2" tokenizer:
 * tokenizer.ggml.model, pre (recognised from the pre-tokenizer: llama-bpe, qwen2, smollm, gpt-2, else
 * "default" with a warning), tokens (padded with [PADi] UNUSED up to the embedding's rows), token_type (added
 * special tokens CONTROL, other added ones USER_DEFINED), merges, bos/eos/unk/padding ids and add_bos/add_eos
 * (the post-processor's template, then tokenizer_config.json), and the chat template. Anything else, or no
 * tokenizer.json, gives tokenizer.ggml.model = "no_vocab" with a warning (llama.cpp loads that; text prompts
 * need a tokenizer). */
int hf_export_tokenizer(struct gguf_writer *w, const struct model_file *mf, char err[256]);

/* llama3 rope scaling as llama.cpp stores it: per-frequency divisors for a rope_freqs.weight tensor of
 * rope_dim / 2 F32 values (convert_hf_to_gguf.py's LlamaModel.generate_extra_tensors). Returns how many it
 * wrote to factors (rope_dim / 2 at most), 0 when the model has no llama3 scaling. */
int hf_export_rope_freqs(const struct model_file *mf, float *factors);

#endif
