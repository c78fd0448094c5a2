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

struct seq_state_params seq_state_default_params(void)
{
    return (struct seq_state_params){.n_ckpt = 32, .ckpt_step = 8192};
}

uint64_t seq_state_bytes(const struct llm_hparams *hp, int n_seqs, int n_ckpt)
{
    const int n = recurrent_layers(hp);
    if (n == 0 || n_seqs <= 0) return 0;
    return (1 + (uint64_t)(n_ckpt > 0 ? n_ckpt : 0)) * n_seqs * n * (conv_floats(hp) + rec_floats(hp)) *
           sizeof(float);
}

int seq_state_init(struct seq_state *s, const struct llm_hparams *hp, int n_seqs, struct seq_state_params p)
{
    memset(s, 0, sizeof *s);
    if (n_seqs <= 0 || hp->n_layers <= 0 || p.n_ckpt < 0 || p.ckpt_step < 0) return FERRY_ERR_INVALID;
    s->n_seqs = n_seqs;
    s->p = p;
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
    s->ckpt_n = calloc((size_t)n_seqs, sizeof *s->ckpt_n);
    if (!s->data || !s->ckpt_n) return FERRY_ERR_NOMEM;
    if (p.n_ckpt > 0) {
        s->ckpt = calloc((size_t)n_seqs * p.n_ckpt, sizeof *s->ckpt);
        s->ckpt_pos = calloc((size_t)n_seqs * p.n_ckpt, sizeof *s->ckpt_pos);
        if (!s->ckpt || !s->ckpt_pos) return FERRY_ERR_NOMEM;
    }
    return FERRY_OK;
}

void seq_state_free(struct seq_state *s)
{
    if (!s) return;
    if (s->ckpt)
        for (size_t i = 0; i < (size_t)s->n_seqs * s->p.n_ckpt; i++) free(s->ckpt[i]);
    free(s->ckpt);
    free(s->ckpt_pos);
    free(s->ckpt_n);
    free(s->slot);
    free(s->data);
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

static int slot_ok(const struct seq_state *s, int seq)
{
    return s->data && seq >= 0 && seq < s->n_seqs;
}

size_t seq_state_slot_bytes(const struct seq_state *s)
{
    return (size_t)s->n_layers * (s->conv_floats + s->rec_floats) * sizeof(float);
}

float *seq_state_slot(const struct seq_state *s, int seq)
{
    if (!slot_ok(s, seq)) return NULL;
    return s->data + (size_t)seq * s->n_layers * (s->conv_floats + s->rec_floats);
}

/* Forgets slot seq's checkpoint i: the later ones move down, its block goes to the spare end. */
static void ckpt_remove(struct seq_state *s, int seq, int i)
{
    float **blk = s->ckpt + (size_t)seq * s->p.n_ckpt;
    int32_t *pos = s->ckpt_pos + (size_t)seq * s->p.n_ckpt;
    const int n = s->ckpt_n[seq];
    float *b = blk[i];
    for (int k = i; k + 1 < n; k++) blk[k] = blk[k + 1], pos[k] = pos[k + 1];
    blk[n - 1] = b;
    s->ckpt_n[seq] = n - 1;
}

/* Makes room in a full slot: the first checkpoint after the oldest and before the newest that lies within
 * ckpt_step positions of the one before it, else the oldest. */
static void ckpt_evict(struct seq_state *s, int seq)
{
    const int32_t *pos = s->ckpt_pos + (size_t)seq * s->p.n_ckpt;
    const int n = s->ckpt_n[seq];
    int victim = 0;
    for (int i = 1; i + 1 < n; i++)
        if (pos[i] - pos[i - 1] < s->p.ckpt_step) {
            victim = i;
            break;
        }
    ckpt_remove(s, seq, victim);
}

float *seq_state_save(struct seq_state *s, int seq, int pos)
{
    if (!slot_ok(s, seq) || !s->ckpt || pos < 1) return NULL;
    float **blk = s->ckpt + (size_t)seq * s->p.n_ckpt;
    int32_t *at = s->ckpt_pos + (size_t)seq * s->p.n_ckpt;
    while (s->ckpt_n[seq] > 0 && at[s->ckpt_n[seq] - 1] >= pos) ckpt_remove(s, seq, s->ckpt_n[seq] - 1);
    if (s->ckpt_n[seq] == s->p.n_ckpt) ckpt_evict(s, seq);
    const int i = s->ckpt_n[seq];
    if (!blk[i] && !(blk[i] = malloc(seq_state_slot_bytes(s)))) return NULL;
    memcpy(blk[i], seq_state_slot(s, seq), seq_state_slot_bytes(s));
    at[i] = pos;
    s->ckpt_n[seq] = i + 1;
    return blk[i];
}

/* Index of slot seq's latest checkpoint at a position in [1, max_pos], or -1. */
static int ckpt_latest(const struct seq_state *s, int seq, int max_pos)
{
    if (!slot_ok(s, seq) || !s->ckpt) return -1;
    const int32_t *at = s->ckpt_pos + (size_t)seq * s->p.n_ckpt;
    int i = s->ckpt_n[seq] - 1;
    while (i >= 0 && at[i] > max_pos) i--;
    return i >= 0 && at[i] >= 1 ? i : -1;
}

int seq_state_ckpt_within(const struct seq_state *s, int seq, int max_pos)
{
    const int i = ckpt_latest(s, seq, max_pos);
    return i < 0 ? 0 : s->ckpt_pos[(size_t)seq * s->p.n_ckpt + i];
}

int seq_state_restore(struct seq_state *s, int seq, int max_pos)
{
    const int i = ckpt_latest(s, seq, max_pos);
    if (i < 0) return 0;
    const int32_t *at = s->ckpt_pos + (size_t)seq * s->p.n_ckpt;
    memcpy(seq_state_slot(s, seq), s->ckpt[(size_t)seq * s->p.n_ckpt + i], seq_state_slot_bytes(s));
    s->ckpt_n[seq] = i + 1; /* the later ones' blocks stay for reuse */
    return at[i];
}

void seq_state_drop(struct seq_state *s, int seq)
{
    if (s->ckpt_n && seq >= 0 && seq < s->n_seqs) s->ckpt_n[seq] = 0;
}

int seq_state_ckpt_count(const struct seq_state *s, int seq)
{
    return s->ckpt_n && seq >= 0 && seq < s->n_seqs ? s->ckpt_n[seq] : 0;
}

int seq_state_ckpt_at(const struct seq_state *s, int seq, int i)
{
    if (i < 0 || i >= seq_state_ckpt_count(s, seq)) return -1;
    return s->ckpt_pos[(size_t)seq * s->p.n_ckpt + i];
}

int seq_state_ckpt_pos(const struct seq_state *s, int seq)
{
    const int n = seq_state_ckpt_count(s, seq);
    return n > 0 ? seq_state_ckpt_at(s, seq, n - 1) : -1;
}
