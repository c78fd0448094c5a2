/* mtp — the drafter of a model's own multi-token-prediction block (Qwen3.5 / 3.6 and Qwen3-Next files with
 * {arch}.nextn_predict_layers 1): proposes the next tokens of a sequence for speculative decoding
 * (runtime/spec.h) from the model's last hidden state, with no second model.
 *
 * The block (llama.cpp's graph_mtp): for the token x at position p and h, the model's final normed hidden
 * state at p - 1 (what its output head reads; zeros at p = 0),
 *   y = eh_proj · [rmsnorm(embed(x)) · enorm ; rmsnorm(h) · hnorm],
 * one full-attention layer of the family over y with a KV cache of its own, then o = rmsnorm(y') ·
 * shared_head_norm and logits = output · o. The draft for p + 1 is the argmax; chaining, the next step pairs
 * that draft with o in place of h.
 * State per slot: the block's K/V for positions [0, n) and the model's hidden state at n - 1. The K/V at a
 * position is right only when its h came from the model, so drafts' positions are dropped before the model's
 * rows are fed back: after each model step the caller keeps what the model kept (mtp_seq_keep) and feeds
 * the step's accepted rows with their hidden states (mtp_seq_feed).
 * Usage: mtp_init → (model step with batch.hidden_out → mtp_seq_keep + mtp_seq_feed → mtp_draft ...;
 * mtp_seq_free)* → mtp_free. The CPU computes it; one thread (the engine's) calls it.
 */
#ifndef FERRY_MTP_H
#define FERRY_MTP_H

#include <stdint.h>

#include "weights/model_file.h"

struct mtp;

struct mtp_params {
    int n_seqs;     /* slots, as the model's engine */
    int ctx_size;   /* positions per slot, as the model's engine */
    int max_tokens; /* most rows of one mtp_seq_feed call's step (larger feeds run in pieces) */
    int n_threads;  /* 0: the online cores */
    int kv_type;    /* enum kv_elem of the block's KV cache */
};

struct mtp_params mtp_default_params(void);

/* 1 when mf has a multi-token-prediction block its family can run (arch_family.nextn). */
int mtp_available(const struct model_file *mf);
/* Reads the block (block mf->hp.n_layers) and its nextn tensors, checking every shape: FERRY_ERR_FORMAT with
 * err naming the tensor as the file names it; FERRY_ERR_UNSUPPORTED when the file has no block or more
 * than one. */
int mtp_init(struct mtp **out, const struct model_file *mf, const struct mtp_params *p, char err[256]);
void mtp_free(struct mtp *m);

/* Positions the slot's K/V holds. */
int mtp_seq_len(const struct mtp *m, int seq);
/* Keeps the slot's first n positions (n at most its length), as the model's slot keeps them; the hidden
 * state to continue from is then the one fed last at n - 1, so a keep is followed by a feed from n. */
void mtp_seq_keep(struct mtp *m, int seq, int n);
void mtp_seq_free(struct mtp *m, int seq);
/* Keeps the slot's first n positions of K/V whatever hidden state it holds: a prompt cache's prefix, where
 * the model's state at n - 1 was not kept. Zeros stand for it, as at position 0, so the next feed continues
 * from n and only the drafts that follow it soon are less likely to be accepted. Returns n, or 0 (the slot
 * emptied) when it holds fewer than n positions. */
int mtp_seq_resume(struct mtp *m, int seq, int n);
/* The model ran tokens[0, n) of the slot at positions pos, pos + 1, ... (pos = mtp_seq_len: a feed continues
 * the slot) and gave their hidden states hidden ((n, dim) f32, batch.hidden_out): their K/V is stored and
 * hidden's last row is the state the next draft starts from. FERRY_ERR_INVALID for another pos. */
int mtp_seq_feed(struct mtp *m, int seq, int pos, const int32_t *tokens, int n, const float *hidden);
/* Drafts up to k (<= 32) tokens after `token`, the slot's next one at position mtp_seq_len (the model's
 * pending token), into out; *n_out gets how many: fewer when the context ends, or before a draft whose
 * probability is below p_min (0: none). logits, when not NULL, gets each draft's row ((k, n_vocab)). The
 * slot's K/V then holds the drafts' positions: the caller keeps it back before the next feed. */
int mtp_draft(struct mtp *m, int seq, int32_t token, int k, float p_min, int32_t *out, int *n_out,
              float *logits);

#endif
