/* seq_state — the fixed-size state of each sequence slot in the recurrent (gated DeltaNet) layers, and the
 * checkpoints each slot keeps of it.
 *
 * Beside its paged K/V in the full-attention layers (runtime/kv_cache.h), every slot owns, per recurrent
 * layer, the convolution's last conv_kernel - 1 inputs (conv_kernel - 1, conv_dim) and the delta rule's
 * state (n_v_heads, head_k, head_v), f32 in host memory, sized once at init. The state of a slot is that
 * after the positions the slot holds (kv_cache seq_len): it cannot be cut back to a shorter prefix, so a slot
 * either continues where it is, starts again at position 0 (LOP_DELTANET then zeroes it first), or goes back
 * to one of its checkpoints: saved copies of all its layers' state, each with the position it was saved at
 * (the engine saves one where each prefill step ends: at the chunk boundaries of a long prompt and at the end
 * of each prompt). A slot keeps at most n_ckpt of them, in ascending positions; when full, a new one first
 * evicts one lying within ckpt_step positions after the one before it (neither the first nor the newest),
 * else the oldest. Invariant: every checkpoint's position is at most the slot's length, and its K/V is held.
 * Models without recurrent layers have an empty seq_state. One seq_state serves an engine, whichever backend
 * computes a layer: the CPU engine's layers all live here; a GPU engine's recurrent layers that the host's
 * cores compute (CPU-only host layers, runtime/device_map.h) keep their live state here too, read and written
 * in place by the host's backend (forward_cpu_params.state), while the device keeps the others' and copies
 * them into their places in a slot's block before a checkpoint is saved and out of it after one is restored
 * (forward_cuda_state_get/put, which leave the host's layers' places alone). A save or restore of the whole
 * block is then consistent across both sides, and a slot that starts again at position 0 is zeroed by
 * whichever side computes each layer. Usage: seq_state_init → (seq_state_conv / seq_state_rec per layer and
 * slot; save, restore, drop)* → seq_state_free.
 */
#ifndef FERRY_SEQ_STATE_H
#define FERRY_SEQ_STATE_H

#include <stddef.h>
#include <stdint.h>

#include "weights/model_file.h"

struct seq_state_params {
    int n_ckpt;    /* checkpoints a slot keeps at most (0: none; a slot then continues or starts again) */
    int ckpt_step; /* positions between checkpoints that a full slot thins down to (0: it drops the oldest) */
};

struct seq_state {
    int n_seqs;
    int n_layers;       /* recurrent layers */
    int n_model_layers; /* hp.n_layers */
    int *slot;          /* (n_model_layers) index among the recurrent layers, or -1 */
    size_t conv_floats; /* per layer and sequence: (conv_kernel - 1) * conv_dim */
    size_t rec_floats;  /* per layer and sequence: n_v_heads * head_k * head_v */
    float *data;        /* (n_seqs, n_layers, conv_floats + rec_floats) */
    struct seq_state_params p;
    /* Slot q's checkpoints are entries [q * n_ckpt, q * n_ckpt + ckpt_n[q]) of ckpt and ckpt_pos, positions
     * ascending; its later entries keep the blocks of evicted ones for reuse. A block (n_layers, conv_floats
     * + rec_floats) is allocated when the slot first needs it, and kept until seq_state_free. */
    float **ckpt;      /* (n_seqs, n_ckpt) */
    int32_t *ckpt_pos; /* (n_seqs, n_ckpt) */
    int *ckpt_n;       /* (n_seqs) */
};

/* 32 checkpoints a slot, thinned to 8,192 positions apart when full (llama.cpp's --ctx-checkpoints and
 * --checkpoint-min-step). */
struct seq_state_params seq_state_default_params(void);
/* Bytes of the state of n_seqs slots of a model of hp with up to n_ckpt checkpoints each, all of them
 * allocated (0 without recurrent layers). */
uint64_t seq_state_bytes(const struct llm_hparams *hp, int n_seqs, int n_ckpt);
/* FERRY_OK, FERRY_ERR_NOMEM or FERRY_ERR_INVALID; s is then valid for seq_state_free either way. */
int seq_state_init(struct seq_state *s, const struct llm_hparams *hp, int n_seqs, struct seq_state_params p);
void seq_state_free(struct seq_state *s);
/* Slot seq's convolution state (conv_kernel - 1, conv_dim) and delta-rule state (n_v_heads, head_k, head_v)
 * in layer l, or NULL when l is not recurrent or seq is out of range. */
float *seq_state_conv(const struct seq_state *s, int seq, int l);
float *seq_state_rec(const struct seq_state *s, int seq, int l);
/* Slot seq's state of all its layers, one block of seq_state_slot_bytes (how a backend that keeps the live
 * state elsewhere copies it in or out), or NULL. */
float *seq_state_slot(const struct seq_state *s, int seq);
size_t seq_state_slot_bytes(const struct seq_state *s);
/* Zeroes both states of slot seq in layer l. */
void seq_state_reset(struct seq_state *s, int seq, int l);
/* Saves slot seq's state (that after `pos` positions, pos >= 1) as a checkpoint: checkpoints past pos are
 * forgot, one at pos replaced, and a full slot evicts one first. Returns the checkpoint's block (the copy of
 * the state, seq_state_slot_bytes) or NULL when none was saved (no recurrent layers, n_ckpt 0, a bad
 * argument, or no memory for a new block). */
float *seq_state_save(struct seq_state *s, int seq, int pos);
/* Copies slot seq's latest checkpoint at a position in [1, max_pos] back into its state, forgets those past
 * it and returns its position; returns 0 and leaves everything as it is when there is none. */
int seq_state_restore(struct seq_state *s, int seq, int max_pos);
/* The position seq_state_restore(s, seq, max_pos) would return, changing nothing. */
int seq_state_ckpt_within(const struct seq_state *s, int seq, int max_pos);
/* Forgets slot seq's checkpoints (its positions are about to be rewritten or freed). */
void seq_state_drop(struct seq_state *s, int seq);
/* Position of slot seq's latest checkpoint, or -1. */
int seq_state_ckpt_pos(const struct seq_state *s, int seq);
/* Slot seq's checkpoints (0 for none or a bad slot) and the position of its i-th, oldest first (-1 outside).
 */
int seq_state_ckpt_count(const struct seq_state *s, int seq);
int seq_state_ckpt_at(const struct seq_state *s, int seq, int i);

#endif
