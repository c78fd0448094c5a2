/* seq_state — the fixed-size state of each sequence slot in the recurrent (gated DeltaNet) layers.
 *
 * Beside its paged K/V in the full-attention layers (runtime/kv_cache.h), every slot owns, per recurrent
 * layer, the convolution's last conv_kernel - 1 inputs (conv_kernel - 1, conv_dim) and the delta rule's
 * state (n_v_heads, head_k, head_v), f32 in host memory, all sized once at init. The state of a slot is that
 * after the positions the slot holds (kv_cache seq_len): it cannot be cut back to a shorter prefix, so a slot
 * either continues where it is or starts again at position 0 (LOP_DELTANET then zeroes it first), or goes
 * back to its checkpoint: one saved copy of all its layers' state and the position it was saved at
 * (seq_state_save / seq_state_restore; the engine saves one after each prefill step, so a later prompt that
 * shares the earlier one can continue from there). Models without recurrent layers have an empty seq_state.
 * Usage: seq_state_init → (seq_state_conv / seq_state_rec per layer and slot; save, restore, drop)* →
 * seq_state_free.
 */
#ifndef FERRY_SEQ_STATE_H
#define FERRY_SEQ_STATE_H

#include <stddef.h>
#include <stdint.h>

#include "weights/model_file.h"

struct seq_state {
    int n_seqs;
    int n_layers;       /* recurrent layers */
    int n_model_layers; /* hp.n_layers */
    int *slot;          /* (n_model_layers) index among the recurrent layers, or -1 */
    size_t conv_floats; /* per layer and sequence: (conv_kernel - 1) * conv_dim */
    size_t rec_floats;  /* per layer and sequence: n_v_heads * head_k * head_v */
    float *data;        /* (n_seqs, n_layers, conv_floats + rec_floats) */
    float *ckpt;        /* (n_seqs, n_layers, conv_floats + rec_floats): each slot's checkpoint */
    int32_t *ckpt_pos;  /* (n_seqs) the position each checkpoint was saved at, or -1 for none */
};

/* Bytes of the state of n_seqs slots of a model of hp, their checkpoints included (0 without recurrent
 * layers). */
uint64_t seq_state_bytes(const struct llm_hparams *hp, int n_seqs);
/* FERRY_OK, FERRY_ERR_NOMEM or FERRY_ERR_INVALID; s is then valid for seq_state_free either way. */
int seq_state_init(struct seq_state *s, const struct llm_hparams *hp, int n_seqs);
void seq_state_free(struct seq_state *s);
/* Slot seq's convolution state (conv_kernel - 1, conv_dim) and delta-rule state (n_v_heads, head_k, head_v)
 * in layer l, or NULL when l is not recurrent or seq is out of range. */
float *seq_state_conv(const struct seq_state *s, int seq, int l);
float *seq_state_rec(const struct seq_state *s, int seq, int l);
/* Zeroes both states of slot seq in layer l. */
void seq_state_reset(struct seq_state *s, int seq, int l);
/* Copies slot seq's state (that after `pos` positions) into its checkpoint. */
void seq_state_save(struct seq_state *s, int seq, int pos);
/* Copies slot seq's checkpoint back into its state and returns its position, when it has one at a position
 * in [1, max_pos]; else returns 0 and leaves the state as it is. */
int seq_state_restore(struct seq_state *s, int seq, int max_pos);
/* Forgets slot seq's checkpoint (its positions are about to be rewritten or freed). */
void seq_state_drop(struct seq_state *s, int seq);
/* Position of slot seq's checkpoint, or -1. */
int seq_state_ckpt_pos(const struct seq_state *s, int seq);

#endif
