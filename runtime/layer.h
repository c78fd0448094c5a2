/* layer — one description of a transformer layer, read by every backend.
 *
 * Weights: four matrix groups (q|k|v, o, gate|up, down), each one or more parts stacked by rows (a group of
 * parts of one type is one product on the GPU), and the norm vectors (the two block norms; the per-head q and
 * k norms of families with QK-norm, absent otherwise). `struct layer_weights` views them
 * wherever they live: the model's tensors (mmap), or a packed block — one contiguous image per layer, the
 * unit that a stream copies in one piece, a resident layer keeps on the device and the host's cores read in
 * place
 * (`struct layer_layout` says where each tensor sits in it).
 * Computation: a short program of ops over named activations (weights/arch/program.h), the family's. Each
 * backend implements the op kinds with its own kernels and buffers; a new architecture is a new program,
 * written once in its family's file (and a new op kind only when it needs one). The ops between kv_first and
 * kv_last read or write the KV cache: they run on the backend that holds it, which for a layer computed on
 * the host is the GPU (backend.h `attend`). Residual stream: x plus a pending delta D. A layer ends with its
 * last product in D; the first op of the next layer (and of the head) adds it as it norms (x += D; xn =
 * norm(x)), one fused kernel on the GPU.
 */
#ifndef FERRY_LAYER_H
#define FERRY_LAYER_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/core/dtype.h"
#include "runtime/model.h"
#include "weights/arch/program.h"

/* The program of hp's family (weights/arch/), or NULL when hp names none. */
const struct layer_program *layer_program_of(const struct llm_hparams *hp);
/* 1 when program p has an op of this kind (a backend refuses a program with a kind it has no kernel for). */
int layer_program_has(const struct layer_program *p, enum layer_op_kind kind);
/* The program layer l runs: the family's recurrent one for its linear-attention layers, else the above. */
const struct layer_program *layer_program_of_layer(const struct llm_hparams *hp, int l);

#define LAYER_MAX_PARTS 3

/* One matrix of a group: rows [row0, row0 + rows) of the group's output, (rows, cols) in `type`. */
struct layer_part {
    const void *data;
    enum dtype type;
    int64_t row0, rows;
    const float *bias; /* (rows) f32 or NULL */
};

struct layer_group {
    struct layer_part part[LAYER_MAX_PARTS];
    int n_parts;
    int uniform;  /* 1 when every part has the same type (and they are contiguous in a packed block) */
    int64_t rows; /* sum of the parts' rows */
    int64_t cols;
};

/* A layer's experts (LOP_MOE) where the model keeps them: the router and the stacked experts
 * (runtime/model.h); n_expert 0 in a dense layer. */
struct layer_moe {
    struct wview router, gate, up, down;
    int n_expert, n_used, ffn, norm_topk;
    /* LOP_MOE_CLAMPED (gpt-oss): the biases, f32 or NULL, and the activation's gain and clamp. */
    const float *router_b;      /* (n_expert) */
    const float *gate_b, *up_b; /* (n_expert, ffn) */
    const float *down_b;        /* (n_expert, dim) */
    float alpha, limit;
    const float *shexp_gate; /* (dim) f32: LOP_MOE_SHARED's gate of the shared expert, or NULL */
};

/* A gated DeltaNet layer's mixer (LOP_DELTANET) where the model keeps it (runtime/model.h); data NULL in
 * other layers. */
struct layer_deltanet {
    struct wview qkv, z, beta, alpha, out;
    const float *conv, *dt, *a, *norm;
};

struct layer_weights {
    struct layer_group mat[LAYER_N_MATS];
    const float *norm[LAYER_N_NORMS]; /* (dim) f32 block norms, (head_dim) f32 q/k norms or NULL */
    struct layer_moe moe;             /* set by layer_weights_of_model only: packed blocks have no experts */
    struct layer_deltanet dn;         /* set by layer_weights_of_model only, like moe */
};

/* The layer's tensors where the model keeps them. */
void layer_weights_of_model(struct layer_weights *w, const struct model_layer *L);
/* The same with the layer's experts, for hp's expert layers. */
void layer_weights_of_model_moe(struct layer_weights *w, const struct model_layer *L,
                                const struct llm_hparams *hp);

/* A packed block: the parts of each group one after the other (each in its packed type), groups and vectors
 * 256-byte aligned, then the norms the layer has (an absent one takes no bytes) and the q|k|v biases stacked
 * like their rows (zeros for an absent one; none when the layer has no biases), then the o bias if any. */
struct layer_layout {
    struct {
        enum dtype type;
        int64_t row0, rows;
        size_t off;
    } part[LAYER_N_MATS][LAYER_MAX_PARTS];
    int n_parts[LAYER_N_MATS];
    int uniform[LAYER_N_MATS];
    int64_t rows[LAYER_N_MATS], cols[LAYER_N_MATS];
    size_t norm_off[LAYER_N_NORMS];
    int norm_len[LAYER_N_NORMS]; /* floats; 0 for a norm the layer does not have */
    size_t bias_off;             /* the stacked q|k|v biases, or SIZE_MAX */
    size_t bytes;
    size_t bias_o_off; /* the o bias (dim floats, after the q|k|v biases), or SIZE_MAX */
};

/* packed_type: the type a matrix of stored type t takes in the block (what its readers decode). */
void layer_layout_of(const struct model_layer *L, const struct llm_hparams *hp,
                     enum dtype (*packed_type)(enum dtype), struct layer_layout *lay);
/* Writes the block (lay->bytes) at dst; row_tmp holds max(cols) floats. Converts a part whose packed type
 * differs from its stored type (to F16 only). */
int layer_pack(const struct model_layer *L, const struct llm_hparams *hp, const struct layer_layout *lay,
               void *dst, float *row_tmp);
/* Copies the matrix w into dst as type `to`: its own type, or F16 (converted row by row); row_tmp holds
 * w->cols floats. FERRY_ERR_UNSUPPORTED for another conversion. */
int layer_pack_matrix(const struct wview *w, enum dtype to, void *dst, float *row_tmp);
/* The weights of the block at base (host or device memory: pointers are only offset, never read). */
void layer_weights_at(struct layer_weights *w, const struct layer_layout *lay, const void *base);
/* Pieces: a streamed layer crosses the link one matrix group at a time, each group's parts one range of the
 * block, [*off, *off + *bytes) (runtime/ring.h). The rest, the tail from lay->norm_off[0] to the end (norms
 * and biases), stays on the device for every host layer. */
void layer_piece(const struct layer_layout *lay, int i, size_t *off, size_t *bytes);
/* The weights of a layer whose tail is at `tail`: norms, biases and every group's shape, no matrix data yet
 * (layer_group_at places each group when its piece has arrived). */
void layer_weights_tail(struct layer_weights *w, const struct layer_layout *lay, const void *tail);
/* Group i's parts within its piece at `piece`. */
void layer_group_at(struct layer_weights *w, const struct layer_layout *lay, int i, const void *piece);

/* Every matrix a layer may have (empty views where its family has none): attention, dense FFN, router and
 * experts, gated DeltaNet, per-layer inputs. */
#define LAYER_N_VIEWS 18
void layer_model_views(const struct model_layer *L, const struct wview *v[LAYER_N_VIEWS]);
/* Bytes of a layer's matrices as the model stores them, and its multiply-adds per token. */
uint64_t layer_model_bytes(const struct model_layer *L);
uint64_t layer_params(const struct model_layer *L);

#endif
