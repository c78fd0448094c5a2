/* arch — the model families ferry runs: one file per family in this folder, one table (arch.c).
 *
 * A family says which names it answers to (GGUF general.architecture, Hugging Face architectures[0] and
 * model_type), how its files differ (rotary layout of its GGUF files, biases, what ferry's GGUF writer calls
 * it), its tensors per layer (GGUF names as llama.cpp writes them, safetensors names as transformers writes
 * them, each with a role that gives its shape and where the model keeps it), its layer program
 * (weights/arch/program.h) and its chat defaults. Nothing outside this folder compares architecture names:
 * loaders call arch_find_gguf / arch_find_hf, everything after them reads the family (arch_of).
 * Adding a dense family: one file here (its entry) and one line in arch.c's table.
 */
#ifndef FERRY_ARCH_H
#define FERRY_ARCH_H

#include <stddef.h>

#include "kernels/core/rope.h"
#include "weights/arch/program.h"

struct llm_hparams;
struct gguf;
struct gguf_writer;
struct json_t;
struct model_file;

/* What a per-layer tensor is; its shape follows from the role and the hyperparameters (arch_role_shape). */
enum arch_role {
    ARCH_ROLE_ATTN_NORM,      /* (dim) */
    ARCH_ROLE_WQ,             /* (q_dim, dim) */
    ARCH_ROLE_WK,             /* (kv_dim, dim) */
    ARCH_ROLE_WV,             /* (kv_dim, dim) */
    ARCH_ROLE_WO,             /* (dim, q_dim) */
    ARCH_ROLE_BQ,             /* (q_dim) */
    ARCH_ROLE_BK,             /* (kv_dim) */
    ARCH_ROLE_BV,             /* (kv_dim) */
    ARCH_ROLE_BO,             /* (dim) */
    ARCH_ROLE_Q_NORM,         /* (head_dim) */
    ARCH_ROLE_K_NORM,         /* (head_dim) */
    ARCH_ROLE_FFN_NORM,       /* (dim) */
    ARCH_ROLE_POST_ATTN_NORM, /* (dim) */
    ARCH_ROLE_POST_FFN_NORM,  /* (dim) */
    ARCH_ROLE_W_GATE,         /* (ffn, dim) */
    ARCH_ROLE_W_UP,           /* (ffn, dim) */
    ARCH_ROLE_W_DOWN,         /* (dim, ffn) */
    ARCH_ROLE_WQKV,           /* (q_dim + 2 kv_dim, dim): q, k, v as one tensor (split into WQ/WK/WV views) */
    ARCH_ROLE_W_GATE_UP,      /* (2 ffn, dim): gate then up as one tensor (split into W_GATE/W_UP views) */
    ARCH_ROLE_ROUTER,         /* (n_expert, dim): the router's logits */
    ARCH_ROLE_EXP_GATE,       /* (n_expert, expert_ffn, dim): the experts' gates stacked */
    ARCH_ROLE_EXP_UP,         /* (n_expert, expert_ffn, dim) */
    ARCH_ROLE_EXP_DOWN,       /* (n_expert, dim, expert_ffn) */
    ARCH_ROLE_ATTN_SINKS,     /* (n_heads) */
    ARCH_ROLE_ROUTER_BIAS,    /* (n_expert) */
    ARCH_ROLE_EXP_GATE_BIAS,  /* (n_expert, expert_ffn) */
    ARCH_ROLE_EXP_UP_BIAS,    /* (n_expert, expert_ffn) */
    ARCH_ROLE_EXP_DOWN_BIAS,  /* (n_expert, dim) */
    /* Gated DeltaNet layers (conv_dim = 2 n_k_heads head_k + inner, llm_ssm_conv_dim): */
    ARCH_ROLE_SSM_QKV,   /* (conv_dim, dim): queries | keys | values before the convolution */
    ARCH_ROLE_SSM_Z,     /* (inner, dim): the output gate */
    ARCH_ROLE_SSM_BETA,  /* (n_v_heads, dim): the write rate, before its sigmoid */
    ARCH_ROLE_SSM_ALPHA, /* (n_v_heads, dim): the decay's input */
    ARCH_ROLE_SSM_CONV,  /* (conv_dim, conv_kernel) f32: the depthwise convolution */
    ARCH_ROLE_SSM_DT,    /* (n_v_heads): the decay's bias */
    ARCH_ROLE_SSM_A,     /* (n_v_heads): -exp(A_log), the decay's scale */
    ARCH_ROLE_SSM_NORM,  /* (head_v): the gated output norm */
    ARCH_ROLE_SSM_OUT,   /* (dim, inner) */
    ARCH_ROLE_OUT_SCALE,      /* (1): the layer's output scalar (Gemma 4) */
    ARCH_ROLE_PLE_GATE,       /* (ple_dim, dim): the per-layer input's gate (Gemma 4 E2B/E4B) */
    ARCH_ROLE_PLE_PROJ,       /* (dim, ple_dim): its projection back */
    ARCH_ROLE_PLE_NORM,       /* (dim): the norm after that projection */
    /* (dim): the shared expert's gate logit (LOP_MOE_SHARED) */
    ARCH_ROLE_SHEXP_GATE,
    /* Qwen3-Next's packed in-projections, per key head (of its r = n_v_heads / n_k_heads value heads):
     * (2 n_v_heads, dim), rows [b of its value heads, then their a] per key head; */
    ARCH_ROLE_SSM_BA,
    /* (conv_dim + inner, dim), rows [its q, its k, v of its value heads, their z] per key head. */
    ARCH_ROLE_SSM_QKVZ,
    ARCH_N_ROLES
};

/* When a family's file must have a tensor. */
enum arch_need {
    ARCH_NEED_ALWAYS,    /* every layer has it */
    ARCH_NEED_IF_BIAS,   /* q/k/v biases: required when hp->qkv_bias (the file has blk.0.attn_q.bias) */
    ARCH_NEED_NEVER,     /* read when present, never required */
    ARCH_NEED_ATTN,      /* every full-attention layer has it, no recurrent layer (llm_layer_is_recurrent) */
    ARCH_NEED_RECURRENT, /* every recurrent layer has it, no full-attention layer */
};

/* 0 when a tensor of this need has no place in layer l (an attention tensor in a recurrent layer, or the
 * reverse); 1 otherwise. */
int arch_need_in_layer(enum arch_need need, const struct llm_hparams *hp, int l);

struct arch_tensor {
    enum arch_role role;
    enum arch_need need;
    const char *gguf; /* after "blk.N." */
    const char *hf;   /* after "model.layers.N."; for the stacked expert roles, the name of one expert's
                       * matrix with '*' for its number (transformers stores them one per expert) */
};

/* A multi-token-prediction block (GGUF {arch}.nextn_predict_layers, stored as block N = the trunk's layer
 * count, runtime/mtp.h): its own tensors' names after "blk.N.", beside the family's full-attention layer
 * tensors that the block also has. embed, head and head_norm may be absent (then the trunk's token_embd,
 * output and output_norm serve). */
struct arch_nextn {
    const char *eh_proj;   /* (dim, 2 dim): [normed embedding ; normed hidden state] -> dim */
    const char *enorm;     /* (dim) */
    const char *hnorm;     /* (dim) */
    const char *embed;     /* (n_vocab, dim) */
    const char *head;      /* (n_vocab, dim) */
    const char *head_norm; /* (dim) */
};

struct arch_family {
    const char *name;                  /* for messages: "llama" */
    const char *title;                 /* for listings: "Llama 2 / 3 / 3.x, SmolLM, TinyLlama" */
    const char *sizes;                 /* the sizes people run: "1B-70B" */
    const char *notes;                 /* what is special about it, one line */
    const char *const *gguf_names;     /* general.architecture values it answers to; NULL-terminated */
    const char *const *hf_classes;     /* config.json architectures[0]; NULL-terminated */
    const char *const *hf_types;       /* config.json model_type (read when there is no architectures) */
    const char *gguf_writes;           /* general.architecture of the GGUF files ferry writes for it */
    enum rope_style gguf_rope;         /* rotary layout of its GGUF files (HF checkpoints: rotate-half) */
    int hf_qkv_bias;                   /* its HF checkpoints always carry q/k/v biases */
    int hf_window_warn;                /* warn when config.json's sliding_window is below the context */
    const struct arch_tensor *tensors; /* (n_tensors) per layer */
    int n_tensors;
    const struct layer_program *program;
    /* llama.cpp's LLM_TYPE_70B for these hyperparameters (its quantization mixes bump attn_v); NULL: never.
     */
    int (*is_70b)(const struct llm_hparams *hp);
    const char *chat_template; /* builtin template (runtime/chat_template.h) when the file has none */
    const char *hf_act;        /* config.json hidden_act/hidden_activation it runs; NULL: "silu" */
    float hf_norm_shift; /* HF stores norm weights minus this (Gemma: 1; llama.cpp's GGUF adds it back) */
    /* Hyperparameters beyond the common ones (NULL: none), after those are read. GGUF: from g's {arch}.*
     * keys; HF: from config.json's object; the writer: the keys llama.cpp's converter adds for the family.
     * FERRY_OK or a status with err naming the key. */
    int (*gguf_hparams)(const struct gguf *g, struct llm_hparams *hp, char *err);
    int (*hf_hparams)(struct json_t *config, struct llm_hparams *hp, char *err);
    int (*gguf_write)(struct gguf_writer *w, const struct llm_hparams *hp, const char *arch, char *err);
    /* The family a GGUF file of this architecture is when it has {arch}.expert_count > 0 (llama.cpp writes
     * Mixtral as "llama" with experts), or NULL. */
    const struct arch_family *gguf_experts;
    /* config.json's attention_bias (q/k/v/o biases) is read rather than refused. */
    int hf_attention_bias;
    /* HF checkpoints: rearranges the tensors, once mapped to GGUF names, into the layout of the family's GGUF
     * files (gpt-oss: its experts stored transposed, gate and up interleaved), keeping any new data in
     * mf->arch_owned; NULL: none needed. FERRY_OK or a status with err naming the tensor. */
    int (*hf_tensors)(struct model_file *mf, char *err);
    /* The program of its recurrent layers (llm_layer_is_recurrent), or NULL: every layer runs `program`. */
    const struct layer_program *program_recurrent;
    /* 1: its GGUF files may give attention.head_count_kv and feed_forward_length per layer (arrays whose
     * layers differ), which its gguf_hparams reads; the common read takes layer 0's. */
    int gguf_layer_arrays;
    /* 1: its GGUF files may lack feed_forward_length (read as 0; its gguf_hparams sets ffn_dim). */
    int gguf_ffn_optional;
    /* Its multi-token-prediction block's tensors, or NULL: the family has none ferry runs. The block's
     * layer runs `program` (a full-attention layer). */
    const struct arch_nextn *nextn;
};

/* The family answering to a GGUF general.architecture of len bytes, or NULL. */
const struct arch_family *arch_find_gguf(const char *name, size_t len);
/* The family of a config.json: by architectures[0] when cls is not NULL, else by model_type; or NULL. */
const struct arch_family *arch_find_hf(const char *cls, const char *model_type);
/* hp's family: hp->family, or for hyperparameters built in code (synthetic models) the family answering to
 * hp->arch as a GGUF name; NULL when neither names one. */
const struct arch_family *arch_of(const struct llm_hparams *hp);
/* Family i of the table (0 ..), or NULL past its end: for listings and tests. */
const struct arch_family *arch_family_at(int i);
/* "llama, mistral, qwen2, ..." (GGUF names) or, hf set, "LlamaForCausalLM, ..." into buf; returns buf. */
const char *arch_supported(int hf, char *buf, size_t n);

/* The shape of a tensor of this role as GGUF dims (ne[0] contiguous; unused dims 1); returns its number of
 * dims (1, 2, or 3 for the stacked experts). */
int arch_role_shape(enum arch_role role, const struct llm_hparams *hp, long long ne[3]);
/* The family's tensor of this role, or NULL when it has none. */
const struct arch_tensor *arch_tensor_of(const struct arch_family *f, enum arch_role role);

/* Tensors outside the layers, the same in every family: GGUF name <-> HF name. */
struct arch_global {
    const char *gguf, *hf;
};
extern const struct arch_global arch_globals[];
extern const int arch_n_globals;

/* The Llama attention block's tensors and the FFN norm (GGUF and HF names as llama.cpp and transformers write
 * them), for families that put another FFN after them (the MoE families). */
#define ARCH_LLAMA_ATTN_TENSORS                                                                              \
    {ARCH_ROLE_ATTN_NORM, ARCH_NEED_ALWAYS, "attn_norm.weight", "input_layernorm.weight"},                   \
        {ARCH_ROLE_WQ, ARCH_NEED_ALWAYS, "attn_q.weight", "self_attn.q_proj.weight"},                        \
        {ARCH_ROLE_WK, ARCH_NEED_ALWAYS, "attn_k.weight", "self_attn.k_proj.weight"},                        \
        {ARCH_ROLE_WV, ARCH_NEED_ALWAYS, "attn_v.weight", "self_attn.v_proj.weight"},                        \
        {ARCH_ROLE_WO, ARCH_NEED_ALWAYS, "attn_output.weight", "self_attn.o_proj.weight"},                   \
        {ARCH_ROLE_BQ, ARCH_NEED_IF_BIAS, "attn_q.bias", "self_attn.q_proj.bias"},                           \
        {ARCH_ROLE_BK, ARCH_NEED_IF_BIAS, "attn_k.bias", "self_attn.k_proj.bias"},                           \
        {ARCH_ROLE_BV, ARCH_NEED_IF_BIAS, "attn_v.bias", "self_attn.v_proj.bias"},                           \
        {ARCH_ROLE_BO, ARCH_NEED_NEVER, "attn_output.bias", "self_attn.o_proj.bias"},                        \
    {                                                                                                        \
        ARCH_ROLE_FFN_NORM, ARCH_NEED_ALWAYS, "ffn_norm.weight", "post_attention_layernorm.weight"           \
    }

/* The Llama tensor set, for families that extend it. */
#define ARCH_LLAMA_TENSORS                                                                                   \
    ARCH_LLAMA_ATTN_TENSORS,                                                                                 \
        {ARCH_ROLE_W_GATE, ARCH_NEED_ALWAYS, "ffn_gate.weight", "mlp.gate_proj.weight"},                     \
        {ARCH_ROLE_W_UP, ARCH_NEED_ALWAYS, "ffn_up.weight", "mlp.up_proj.weight"},                           \
    {                                                                                                        \
        ARCH_ROLE_W_DOWN, ARCH_NEED_ALWAYS, "ffn_down.weight", "mlp.down_proj.weight"                        \
    }

/* The expert keys of GGUF files as llama.cpp writes them ({arch}.expert_count, expert_used_count,
 * expert_feed_forward_length (default: feed_forward_length), expert_weights_norm (default: true)), read and
 * written for the MoE families (qwen3moe.c). */
int arch_moe_gguf_hparams(const struct gguf *g, struct llm_hparams *hp, char *err);
int arch_moe_gguf_write(struct gguf_writer *w, const struct llm_hparams *hp, const char *arch, char *err);
/* config.json's experts as Qwen3-MoE has them (num_experts or num_local_experts, num_experts_per_tok,
 * moe_intermediate_size, norm_topk_prob (default false)); dense layers among them are refused. */
int arch_qwen3moe_hf_hparams(struct json_t *c, struct llm_hparams *hp, char *err);

/* The Llama layer program (llama.c), which several families run unchanged. */
extern const struct layer_program arch_llama_program;
/* Llama's LLM_TYPE_70B rule (llama.c): 80 layers with grouped-query attention. */
int arch_llama_is_70b(const struct llm_hparams *hp);

#endif
