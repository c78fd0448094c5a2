/* seq_state — per-slot state of the recurrent layers (see seq_state.h). */
#include "runtime/seq_state.h"

#include <stdlib.h>
#include <string.h>

#include "kernels/core/status.h"

static size_t conv_floats(const struct llm_hparams *hp)
{
    return (size_t)(hp->ssm_conv_kernel - 1) * (size_t)llm_ssm_conv_dim(hp);
}

static size_t rec_floats(const struct llm_hparams *hp)
{
    return (size_t)hp->ssm_n_v_heads * hp->ssm_head_k * llm_ssm_head_v(hp);
}

static int recurrent_layers(const struct llm_hparams *hp)
{
    int n = 0;
    for (int l = 0; l < hp->n_layers; l++) n += llm_layer_is_recurrent(hp, l);
    return n;
}

uint64_t seq_state_bytes(const struct llm_hparams *hp, int n_seqs)
{
    const int n = recurrent_layers(hp);
    if (n == 0 || n_seqs <= 0) return 0;
    return 2 * (uint64_t)n_seqs * n * (conv_floats(hp) + rec_floats(hp)) * sizeof(float);
}

int seq_state_init(struct seq_state *s, const struct llm_hparams *hp, int n_seqs)
{
    memset(s, 0, sizeof *s);
    if (n_seqs <= 0 || hp->n_layers <= 0) return FERRY_ERR_INVALID;
    s->n_seqs = n_seqs;
    s->n_layers = recurrent_layers(hp);
    if (s->n_layers == 0) return FERRY_OK;
    if (hp->ssm_conv_kernel < 1 || hp->ssm_n_v_heads < 1 || hp->ssm_head_k < 1 || llm_ssm_head_v(hp) < 1)
        return FERRY_ERR_INVALID;
    s->n_model_layers = hp->n_layers;
    s->conv_floats = conv_floats(hp);
    s->rec_floats = rec_floats(hp);
    s->slot = malloc((size_t)hp->n_layers * sizeof *s->slot);
    if (!s->slot) return FERRY_ERR_NOMEM;
    for (int l = 0, i = 0; l < hp->n_layers; l++) s->slot[l] = llm_layer_is_recurrent(hp, l) ? i++ : -1;
    /* calloc: pages of slots never used are never touched. */
    s->data = calloc((size_t)n_seqs * s->n_layers, (s->conv_floats + s->rec_floats) * sizeof(float));
    s->ckpt = calloc((size_t)n_seqs * s->n_layers, (s->conv_floats + s->rec_floats) * sizeof(float));
    s->ckpt_pos = malloc((size_t)n_seqs * sizeof *s->ckpt_pos);
    if (!s->data || !s->ckpt || !s->ckpt_pos) return FERRY_ERR_NOMEM;
    for (int i = 0; i < n_seqs; i++) s->ckpt_pos[i] = -1;
    return FERRY_OK;
}

void seq_state_free(struct seq_state *s)
{
    if (!s) return;
    free(s->slot);
    free(s->data);
    free(s->ckpt);
    free(s->ckpt_pos);
    memset(s, 0, sizeof *s);
}

static float *block(const struct seq_state *s, int seq, int l)
{
    if (!s->data || seq < 0 || seq >= s->n_seqs || l < 0 || l >= s->n_model_layers || s->slot[l] < 0)
        return NULL;
    return s->data + ((size_t)seq * s->n_layers + (size_t)s->slot[l]) * (s->conv_floats + s->rec_floats);
}

float *seq_state_conv(const struct seq_state *s, int seq, int l)
{
    return block(s, seq, l);
}

float *seq_state_rec(const struct seq_state *s, int seq, int l)
{
    float *b = block(s, seq, l);
    return b ? b + s->conv_floats : NULL;
}

void seq_state_reset(struct seq_state *s, int seq, int l)
{
    float *b = block(s, seq, l);
    if (b) memset(b, 0, (s->conv_floats + s->rec_floats) * sizeof(float));
}

/* Slot seq's live state or its checkpoint: all its layers, one block. */
static float *slot_block(const struct seq_state *s, float *base, int seq)
{
    return base + (size_t)seq * s->n_layers * (s->conv_floats + s->rec_floats);
}

static size_t slot_bytes(const struct seq_state *s)
{
    return (size_t)s->n_layers * (s->conv_floats + s->rec_floats) * sizeof(float);
}

void seq_state_save(struct seq_state *s, int seq, int pos)
{
    if (!s->data || seq < 0 || seq >= s->n_seqs || pos < 1) return;
    memcpy(slot_block(s, s->ckpt, seq), slot_block(s, s->data, seq), slot_bytes(s));
    s->ckpt_pos[seq] = pos;
}

int seq_state_restore(struct seq_state *s, int seq, int max_pos)
{
    if (!s->data || seq < 0 || seq >= s->n_seqs || s->ckpt_pos[seq] < 1 || s->ckpt_pos[seq] > max_pos)
        return 0;
    memcpy(slot_block(s, s->data, seq), slot_block(s, s->ckpt, seq), slot_bytes(s));
    return s->ckpt_pos[seq];
}

void seq_state_drop(struct seq_state *s, int seq)
{
    if (s->ckpt_pos && seq >= 0 && seq < s->n_seqs) s->ckpt_pos[seq] = -1;
}

int seq_state_ckpt_pos(const struct seq_state *s, int seq)
{
    return s->ckpt_pos && seq >= 0 && seq < s->n_seqs ? s->ckpt_pos[seq] : -1;
}
