/* hf_config — a Hugging Face model directory's config.json and its chat template.
 *
 * Reads the config of a family of weights/arch/ (architectures[0], else model_type) into struct llm_hparams:
 * hidden_size, intermediate_size, num_hidden_layers, num_attention_heads, num_key_value_heads (default:
 * heads), head_dim (default hidden/heads), rms_norm_eps (default 1e-6), rope_theta (default 10000),
 * max_position_embeddings (default 2048), tie_word_embeddings (default false), vocab_size, rope_scaling
 * ({rope_type|type: "llama3", factor, low_freq_factor, high_freq_factor, original_max_position_embeddings} or
 * {"linear", factor}). HF checkpoints use rotate-half rotary pairs (ROPE_STYLE_HALF); the family says whether
 * they carry q/k/v biases.
 * The chat template comes from tokenizer_config.json's "chat_template" (a string, or a list of
 * {name, template} of which "default" is taken), else from a chat_template.jinja file beside it.
 */
#ifndef FERRY_HF_CONFIG_H
#define FERRY_HF_CONFIG_H

#include <stddef.h>

#include "weights/model_file.h"

#define HF_MAX_JSON (64u * 1024 * 1024) /* bytes; larger config/index/tokenizer_config files are rejected */

/* Fills every field of hp except tied_embeddings' final value (the caller decides it from the tensors: the
 * config's tie_word_embeddings is stored there as read). Unknown architectures: FERRY_ERR_UNSUPPORTED. */
int hf_config_parse(const char *json, size_t len, struct llm_hparams *hp, char err[256]);
int hf_config_load(const char *dir, struct llm_hparams *hp, char err[256]);

/* *out gets a malloc'ed NUL-terminated template, or NULL when the file has none (FERRY_OK either way). */
int hf_chat_template_parse(const char *json, size_t len, char **out, char err[256]);
/* Looks in dir/tokenizer_config.json then dir/chat_template.jinja; absent files are not an error. */
int hf_chat_template_load(const char *dir, char **out, char err[256]);

#endif
