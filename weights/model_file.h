/* model_file — one opened model, whatever its format: hyperparameters, tensors under one internal naming,
 * and where its tokenizer and chat template live.
 *
 * MODEL is a GGUF file or a Hugging Face directory (config.json + model.safetensors or
 * model.safetensors.index.json with shards, tokenizer.json, tokenizer_config.json).
 * Tensor names are GGUF's ("token_embd.weight", "blk.7.attn_q.weight", "blk.7.attn_q.bias",
 * "blk.7.ffn_down.weight", "output_norm.weight", "output.weight"...); HF names are mapped on open.
 * Tensor data is borrowed from read-only mmaps and stays valid until model_file_close().
 * Matrices are row-major (rows, cols) = (ne[1], ne[0]): a linear layer is (n_out, n_in).
 * Rotary layout: llama.cpp's GGUF conversion permutes Q/K rows of llama-arch models so rotary pairs are
 * adjacent (ROPE_STYLE_INTERLEAVED); HF checkpoints (and GGUF qwen2) use rotate-half pairs (ROPE_STYLE_HALF).
 * The weights are never permuted; the rope kernel takes the style.
 */
#ifndef FERRY_MODEL_FILE_H
#define FERRY_MODEL_FILE_H

#include <stddef.h>
#include <stdint.h>

#include "quant/dtype.h"
#include "kernels/core/rope.h"

struct gguf;
struct arch_family;

enum model_format { MODEL_FORMAT_GGUF = 0, MODEL_FORMAT_HF = 1 };

struct llm_hparams {
    char arch[32]; /* the name the file gives its architecture (GGUF general.architecture, the HF
                    * model_type of its family): the prefix of its GGUF keys */
    const struct arch_family *family; /* weights/arch/arch.h; NULL in hyperparameters built in code */
    int n_vocab;
    int dim; /* hidden size */
    int n_layers;
    int n_heads;
    int n_kv_heads;
    int head_dim;     /* dim / n_heads unless the file says otherwise */
    int ffn_dim;      /* intermediate size */
    int ctx_train;    /* max_position_embeddings / context_length */
    float norm_eps;   /* RMSNorm epsilon */
    float rope_theta; /* base, default 10000 */
    int rope_dim;     /* rotary dimensions per head (== head_dim for the Llama family) */
    enum rope_style rope_style;
    struct rope_scaling rope_scaling;
    int tied_embeddings; /* 1 when there is no output.weight and the head reuses token_embd.weight */
    int qkv_bias;        /* 1 when attn_q/k/v have biases (Qwen2) */
    /* Family extras (weights/arch/; zero in the Llama family, which then computes exactly as before): */
    float embed_scale;    /* the embedding rows are multiplied by it (Gemma: sqrt(dim)); 0: not scaled */
    float attn_scale;     /* the attention's query scale; 0: 1/sqrt(head_dim) (llm_attn_scale) */
    int sliding_window;   /* positions a local layer attends to (itself included); 0: every layer is global */
    int swa_pattern;      /* with a window: layer l is local unless l % swa_pattern == swa_pattern - 1 */
    float rope_theta_swa; /* the local layers' rotary base (no scaling); used with a window */
    /* Mixture of experts (0 in dense families): every layer's FFN is n_expert SwiGLU experts of
     * expert_ffn_dim, of which the router picks n_expert_used per token, weighted by their softmax
     * probabilities (divided by their sum when expert_norm_topk). */
    int n_expert;
    int n_expert_used;
    int expert_ffn_dim;
    int expert_norm_topk;
    int swa_rope_scaled; /* 1: local layers rotate as the global ones (rope_theta and its scaling; gpt-oss) */
    float swiglu_alpha;  /* LOP_MOE_CLAMPED's sigmoid gain (gpt-oss: 1.702) */
    float swiglu_limit;  /* LOP_MOE_CLAMPED's clamp of gate (above) and up (both sides) (gpt-oss: 7) */
    /* Gated DeltaNet linear attention (Qwen3.5; 0 in other families): layer l is recurrent
     * (llm_layer_is_recurrent) unless (l + 1) % full_attn_interval == 0. The ssm_* fields are the GGUF
     * {arch}.ssm.* keys as llama.cpp names them. */
    int full_attn_interval;
    int ssm_conv_kernel; /* ssm.conv_kernel: width of the causal convolution (4) */
    int ssm_head_k;      /* ssm.state_size: size of a key (and query) head */
    int ssm_n_k_heads;   /* ssm.group_count: key heads */
    int ssm_n_v_heads;   /* ssm.time_step_rank: value heads, a multiple of the key heads */
    int ssm_inner;       /* ssm.inner_size: n_v_heads * value head size */
    int attn_out_gate;   /* full attention: attn_q holds, per head, its queries then its output gate */
    /* 1: value heads grouped by key head, value head j reading key head j / (n_v_heads / n_k_heads)
     * (Qwen3-Next); 0: tiled over them, j % n_k_heads (llama.cpp's Qwen3.5 files). */
    int ssm_grouped;
    int rope_sections[4]; /* Qwen3.5 HF: rope_parameters' mrope_section, for the GGUF writer; text positions
                           * are the same in every section, so the forward pass never reads it */
    /* Gemma 4 (0 elsewhere): head_dim, n_kv_heads and rope_dim above are the global layers' (as llama.cpp's
     * GGUF keys give them); the local layers have their own. A global layer without attn_v takes its keys as
     * its values. Logits are soft-capped: c * tanh(logits / c). */
    int head_dim_swa;    /* the local layers' head size; 0: head_dim */
    int n_kv_heads_swa;  /* the local layers' KV heads; 0: n_kv_heads */
    int rope_dim_swa;    /* the local layers' rotary dims; 0: rope_dim */
    float final_softcap; /* c; 0: none */
    /* Gemma 4 E2B/E4B (0 elsewhere): layers [n_layer_kv, n_layers) compute no K/V of their own and attend
     * over the cache of the last earlier layer of their kind (llm_kv_source), with an FFN of ffn_dim_shared;
     * each layer adds a per-layer input of ple_dim (the per-layer embeddings and a projection of the input).
     */
    int n_layer_kv;     /* 0: every layer has its own K/V */
    int ffn_dim_shared; /* the KV-sharing layers' FFN size; 0: ffn_dim */
    int ple_dim;        /* per-layer input size; 0: none */
    /* Multi-token-prediction blocks the file holds after the n_layers layers (its block_count is the sum;
     * Qwen3.5's nextn_predict_layers): never run, but quantized with the rest. */
    int n_layer_nextn;
    /* Mistral 3 / Llama 4 attention temperature (llm_attn_temp; 0: none): attention.temperature_scale and
     * the original context (rope.scaling.original_context_length). */
    float attn_temp_beta;
    int attn_temp_len;
};

/* 1 when layer l of hp attends through the sliding window only. */
static inline int llm_layer_is_local(const struct llm_hparams *hp, int l)
{
    return hp->sliding_window > 0 && (hp->swa_pattern <= 0 || l % hp->swa_pattern != hp->swa_pattern - 1);
}

/* 1 when layer l of hp is a gated DeltaNet (linear-attention) layer. */
static inline int llm_layer_is_recurrent(const struct llm_hparams *hp, int l)
{
    return hp->full_attn_interval > 0 && (l + 1) % hp->full_attn_interval != 0;
}

/* Layers with a KV cache (all but the recurrent ones), and layer l's place among them (l not recurrent). */
static inline int llm_kv_layers(const struct llm_hparams *hp)
{
    return hp->full_attn_interval > 0 ? hp->n_layers / hp->full_attn_interval : hp->n_layers;
}
static inline int llm_kv_layer(const struct llm_hparams *hp, int l)
{
    return hp->full_attn_interval > 0 ? (l + 1) / hp->full_attn_interval - 1 : l;
}

/* A linear layer's value head size, and its convolution's channels (queries | keys | values). */
static inline int llm_ssm_head_v(const struct llm_hparams *hp)
{
    return hp->ssm_n_v_heads > 0 ? hp->ssm_inner / hp->ssm_n_v_heads : 0;
}
static inline int llm_ssm_conv_dim(const struct llm_hparams *hp)
{
    return 2 * hp->ssm_n_k_heads * hp->ssm_head_k + hp->ssm_inner;
}

/* Layer l's attention shape: head size, KV heads and rotary dims (Gemma 4's local layers differ). */
static inline void llm_layer_shape(const struct llm_hparams *hp, int l, int *head_dim, int *n_kv_heads,
                                   int *rope_dim)
{
    const int own = hp->head_dim_swa > 0 && llm_layer_is_local(hp, l);
    *head_dim = own ? hp->head_dim_swa : hp->head_dim;
    *n_kv_heads = own && hp->n_kv_heads_swa > 0 ? hp->n_kv_heads_swa : hp->n_kv_heads;
    *rope_dim = own && hp->rope_dim_swa > 0 ? hp->rope_dim_swa : hp->rope_dim;
}

/* 1 when layer l reads another layer's K/V and has none of its own. */
static inline int llm_layer_kv_shared(const struct llm_hparams *hp, int l)
{
    return hp->n_layer_kv > 0 && l >= hp->n_layer_kv;
}

/* The layer whose KV cache layer l attends over: l, or for a KV-sharing layer the last layer before
 * n_layer_kv of its kind (local or global); -1 when there is none (the file is then refused at load). */
static inline int llm_kv_source(const struct llm_hparams *hp, int l)
{
    if (!llm_layer_kv_shared(hp, l)) return l;
    for (int s = hp->n_layer_kv - 1; s >= 0; s--)
        if (llm_layer_is_local(hp, s) == llm_layer_is_local(hp, l)) return s;
    return -1;
}

/* Layers of the KV cache (at least 1): the full-attention layers of a recurrent model (llm_kv_layer gives
 * each its place), else the first n_layer_kv (every KV-sharing layer's source is one of them). */
static inline int llm_kv_cache_layers(const struct llm_hparams *hp)
{
    const int n = hp->full_attn_interval > 0 ? llm_kv_layers(hp) : hp->n_layer_kv > 0 ? hp->n_layer_kv : hp->n_layers;
    return n > 0 ? n : 1;
}

/* Layer l's FFN size. */
static inline int llm_layer_ffn(const struct llm_hparams *hp, int l)
{
    return hp->ffn_dim_shared > 0 && llm_layer_kv_shared(hp, l) ? hp->ffn_dim_shared : hp->ffn_dim;
}

/* hp with layer l's attention shape and FFN size as its own (for the per-layer tensor shapes of
 * arch_role_shape). */
static inline struct llm_hparams llm_hparams_at(const struct llm_hparams *hp, int l)
{
    struct llm_hparams h = *hp;
    llm_layer_shape(hp, l, &h.head_dim, &h.n_kv_heads, &h.rope_dim);
    h.ffn_dim = llm_layer_ffn(hp, l);
    return h;
}

/* The largest (n_heads * head_dim) and (n_kv_heads * head_dim) of any layer: activation and KV row sizes. */
static inline void llm_max_dims(const struct llm_hparams *hp, int *q_dim, int *kv_dim)
{
    *q_dim = hp->n_heads * hp->head_dim;
    *kv_dim = hp->n_kv_heads * hp->head_dim;
    if (hp->head_dim_swa <= 0) return;
    const int kv_swa = hp->n_kv_heads_swa > 0 ? hp->n_kv_heads_swa : hp->n_kv_heads;
    if (hp->n_heads * hp->head_dim_swa > *q_dim) *q_dim = hp->n_heads * hp->head_dim_swa;
    if (kv_swa * hp->head_dim_swa > *kv_dim) *kv_dim = kv_swa * hp->head_dim_swa;
}

/* KV heads of head_dim each that hold the widest layer's K (or V) row: the KV cache's shape. */
static inline int llm_kv_cache_heads(const struct llm_hparams *hp)
{
    int q, kv;
    llm_max_dims(hp, &q, &kv);
    return (kv + hp->head_dim - 1) / hp->head_dim;
}

/* The attention's query scale, times the rotary attention factor squared (YaRN, LongRoPE:
 * kernels/core/rope.h) when every dim of a head rotates. */
float llm_attn_scale(const struct llm_hparams *hp);
/* With partial rotary dims the factor scales the rotated dims' scores only: the rope op multiplies the
 * queries' rotated dims by this (the factor squared; 1 when llm_attn_scale carries it or there is none). */
float llm_rope_q_scale(const struct llm_hparams *hp);
/* The attention temperature of Llama 4 and Mistral 3: the queries at position p are multiplied by
 * 1 + attn_temp_beta · ln(1 + floor(p / attn_temp_len)) after rotation (1 below attn_temp_len). */
static inline float llm_attn_temp(const struct llm_hparams *hp, int pos)
{
    if (hp->attn_temp_beta == 0) return 1.0f;
    return 1.0f + hp->attn_temp_beta * logf(1.0f + floorf((float)pos / (float)hp->attn_temp_len));
}

struct wtensor {
    char name[96]; /* internal name, NUL-terminated */
    enum dtype type;
    int n_dims;       /* 1..4 */
    int64_t ne[4];    /* GGUF order: ne[0] is the contiguous (row) dimension; unused dims are 1 */
    const void *data; /* borrowed from the mmap */
    size_t nbytes;
};

struct model_file {
    enum model_format format;
    struct llm_hparams hp;
    int n_tensors;
    struct wtensor *tensors; /* (n_tensors) */
    struct gguf *gguf;       /* GGUF only: the parsed file, for tokenizer.ggml.* metadata; else NULL */
    char *dir;               /* HF only: the directory (tokenizer.json, tokenizer_config.json); else NULL */
    char *chat_template;     /* the model's own template (GGUF tokenizer.chat_template or HF
                              * tokenizer_config.json chat_template), NUL-terminated, or NULL */
    uint64_t file_bytes;     /* total size of the mapped weight files */
    void *priv;              /* mappings; owned */
    void *arch_owned; /* HF only: tensors the family rearranged (arch_family.hf_tensors), or NULL; owned */
};

/* Progress callback for long loads: done/total bytes checked so far. May be NULL. */
typedef void (*model_file_progress_fn)(uint64_t done, uint64_t total, void *user);

/* Opens a GGUF file or an HF directory. On error returns a negative status and fills err with one line
 * naming the file, key/tensor and byte offset. Never crashes or allocates absurdly on hostile input. */
int model_file_open(const char *path, struct model_file **out, model_file_progress_fn progress, void *user,
                    char err[256]);
void model_file_close(struct model_file *mf); /* accepts NULL and half-built objects */
/* A GGUF model over a caller-owned buffer that must outlive it (fuzzing, tests); same checks as a file. */
int model_file_open_gguf_mem(const void *buf, size_t size, struct model_file **out, char err[256]);

/* The tensor with this internal name, or NULL. */
const struct wtensor *model_file_tensor(const struct model_file *mf, const char *name);

/* Checks the hyperparameters and that every tensor the family's forward pass reads exists with the shape
 * the hyperparameters imply (norms and biases in F32/F16/BF16; rope_freqs.weight, if present, F32 of
 * rope_dim/2). FERRY_OK or FERRY_ERR_FORMAT with err naming the tensor and the family, its shape and the
 * expected one. model_file_open calls it. */
int model_file_validate(const struct model_file *mf, char err[256]);

#endif
