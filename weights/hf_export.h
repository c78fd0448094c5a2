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

/* arch: "llama" or "qwen2" (llama.cpp writes Mistral checkpoints as llama). */
int hf_export_metadata(struct gguf_writer *w, const struct model_file *mf, const char *arch, char err[256]);

#endif
