/* program — the layer program: the ops of one transformer layer over named activations, as a family declares
 * it (weights/arch/) and every backend runs it (runtime/layer.h, runtime/forward_*.c).
 *
 * A program is a constant array of ops. Each backend implements each op kind with its own kernels and maps
 * the activations onto its own buffers; a family that needs a new layer kind adds an op kind here, a CPU
 * reference and a CUDA kernel, and a family that does not use it pays nothing (no op, no launch). The ops
 * between kv_first and kv_last read or write the KV cache: they run on the backend that holds it. The matrix
 * groups and norm vectors an op names by `arg` are the LAYER_* indices below.
 */
#ifndef FERRY_ARCH_PROGRAM_H
#define FERRY_ARCH_PROGRAM_H

/* Activations a program names; each backend maps them onto its buffers (shapes per token row). */
enum layer_act {
    LACT_X,   /* (dim) residual stream */
    LACT_XN,  /* (dim) normed input of a block */
    LACT_QKV, /* (q_dim + 2 kv_dim) the q|k|v product */
    LACT_Q,   /* (q_dim) rotated queries */
    LACT_ATT, /* (q_dim) attention output */
    LACT_D,   /* (dim) a block's output, added to x by the next LOP_ADD_NORM */
    LACT_GU,  /* (2 ffn) the gate|up product */
    LACT_H,   /* (ffn) act(gate) * up */
    /* (q_dim) the attention's output gate (LOP_Q_GATE) */
    LACT_GATE,
};

enum layer_op_kind {
    LOP_ADD_NORM,  /* x += D when a delta is pending; out = rmsnorm(x) * norm[arg] */
    LOP_LINEAR,    /* out = in · (matrix group arg)ᵀ + the parts' biases */
    LOP_ROPE_KV,   /* out = rope(in's queries); the cache rows of (seq, pos) = rope(in's keys), in's values;
                    * the queries' rotated dims times llm_rope_q_scale and each query row times
                    * llm_attn_temp of its position where the family's hyperparameters have them */
    LOP_ATTENTION, /* out = causal attention of the queries in over the cache rows of the token's sequence */
    LOP_SILU_MUL,  /* out = silu(in's gate half) * in's up half */
    LOP_QK_NORM,   /* in place on q|k|v: each query head = rmsnorm(head) * norm[LAYER_Q_NORM] (head_dim), each
                    * key head likewise with norm[LAYER_K_NORM]; values untouched (Qwen3, Gemma 3) */
    LOP_NORM,      /* out = rmsnorm(in) * norm[arg], in place allowed; a pending D stays pending (sandwich
                    * norms: Gemma's post-attention and post-FFN norms) */
    LOP_GELU_MUL,  /* out = gelu_tanh(in's gate half) * in's up half (Gemma's GeGLU) */
    LOP_MOE,       /* out = the layer's experts on in (rows of dim): the router's softmax top-k, each chosen
                    * expert's SwiGLU FFN on the rows routed to it, their weighted sum (kernels/cpu/moe.h) */
    LOP_ATTENTION_SINKS, /* LOP_ATTENTION whose softmax denominators also count e^sink of the head
                          * (norm[LAYER_ATTN_SINKS], n_heads): a learned logit with no value (gpt-oss) */
    LOP_MOE_CLAMPED,     /* LOP_MOE with the router's and the experts' biases and gpt-oss's clamped SwiGLU
                          * (hp swiglu_alpha, swiglu_limit); weights: the softmax of the top-k logits */
    LOP_DELTANET,  /* out = the gated DeltaNet block on in (rows of dim), with the token's sequence's conv and
                    * recurrent state: q|k|v, z, b, a products; causal depthwise conv (rolling state) and
                    * silu; L2-normed q, k; decay -exp(A_log)·softplus(a + dt_bias) and rate sigmoid(b) into
                    * the gated delta rule; rmsnorm(o)·w·silu(z); the out product (kernels/cpu/deltanet.h).
                    * A sequence whose first row here is position 0 starts from a zero state. */
    LOP_Q_GATE,    /* in place on q|k|v whose query part holds per head (queries, gate): the queries packed
                    * as LOP_QK_NORM and the KV ops read them, the gates to LACT_GATE (Qwen3.5) */
    LOP_ATT_GATE,  /* out = in * sigmoid(LACT_GATE), in place allowed */
    LOP_V_NORM,    /* in place on q|k|v: each value head = rmsnorm(head), no weight (Gemma 4) */
    LOP_SCALE_X,   /* x += D when a delta is pending; x *= norm[arg][0] (Gemma 4's layer output scalar) */
    LOP_PLE, /* with per-layer inputs (hp.ple_dim): x += D when pending; x += norm(proj(gelu_tanh(gate(x)) *
              * the layer's input)) (Gemma 4 E2B/E4B); without them nothing */
    /* LOP_MOE plus the shared expert every token runs: out += sigmoid(in · the layer's shared-expert gate
     * (dim)) * the SwiGLU FFN of in with the gate|up and down groups (LAYER_GU, LAYER_DOWN) (Qwen3.5-MoE;
     * kernels/cpu/moe.h kern_cpu_moe_shared) */
    LOP_MOE_SHARED,
};

struct layer_op {
    enum layer_op_kind kind;
    enum layer_act in, out;
    int arg; /* LOP_LINEAR: a LAYER_* group; LOP_ADD_NORM: a LAYER_*_NORM vector */
};

struct layer_program {
    const struct layer_op *ops;
    int n_ops;
    int kv_first, kv_last; /* ops [kv_first, kv_last] touch the KV cache; -1, -1: none does */
};

/* Matrix groups: q|k|v, o, gate|up, down. */
enum { LAYER_QKV, LAYER_O, LAYER_GU, LAYER_DOWN, LAYER_N_MATS };
/* Norm vectors: the two block norms (dim), the per-head q and k norms (head_dim) and the post-attention and
 * post-FFN norms (dim); all but the first two are absent in most families. Other per-layer f32 vectors
 * travel with them: the attention sinks (n_heads). */
enum {
    LAYER_ATTN_NORM,
    LAYER_FFN_NORM,
    LAYER_Q_NORM,
    LAYER_K_NORM,
    LAYER_POST_ATTN_NORM,
    LAYER_POST_FFN_NORM,
    LAYER_ATTN_SINKS,
    LAYER_OUT_SCALE, /* (1) the layer's output scalar */
    LAYER_N_NORMS
};

#endif
