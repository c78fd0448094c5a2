/* sched_impl — what the scheduler's two halves share: scheduler.c (lifecycle, submission, cancellation) and
 * sched_engine.c (the engine thread: admission, steps, sampling, publishing). Not for other modules. */
#ifndef FERRY_SCHED_IMPL_H
#define FERRY_SCHED_IMPL_H

#include <pthread.h>
#include <stdint.h>

#include "server/scheduler.h"
#include "server/sched_policy.h"
#include "server/sreq.h"

/* Prompt rows whose logprobs one step may compute (echo with logprobs); a longer prompt is prefilled in
 * chunks of this many rows. */
#define PROMPT_LP_ROWS 64

struct sched {
    pthread_mutex_t mu;
    pthread_cond_t cv_work; /* engine thread waits here when idle */
    pthread_t thread;
    int started, stop;
    struct engine *e;
    const struct tokenizer *tok;
    struct metrics *m;
    struct sched_params p;
    struct sched_policy_params pp; /* admission and step limits, the KV pool's shape */
    int n_slots, n_vocab, ctx, dim;
    int kv_reserved; /* blocks promised to running choices (engine thread, under mu) */
    /* queue (under mu) */
    struct choice *qhead, *qtail;
    int n_queued;
    int in_flight;       /* requests submitted and not finished */
    struct choice **run; /* (n_slots) running choices in admission order; changed by the engine
                          * thread under mu, so readable under mu */
    int n_run;
    /* engine thread only */
    int *slot_free; /* (n_slots) 1 when free */
    struct prompt_cache *pc;
    int *idle, *idle_blocks;           /* (n_slots) free slots with a cache, LRU first, and their KV blocks */
    struct sched_step_seq *steps;      /* (n_slots) the running choices as the policy sees them */
    int *chunk;                        /* (n_slots) the policy's prompt tokens for each this step */
    int32_t *b_tokens, *b_pos, *b_seq; /* (max_batch_tokens) */
    uint8_t *b_want;
    /* embeddings run in a step of their own (its rows are hidden states, not logits) */
    int32_t *e_tokens, *e_pos, *e_seq; /* (max_batch_tokens) */
    uint8_t *e_want;
    float *e_out;              /* (max_batch_tokens, dim) */
    struct choice **row_owner; /* (n_slots) choice of each sampled row */
    int *row_at;               /* (n_slots) its row in logits */
    struct choice *
        *pub_owner; /* (n_slots) row_owner of a step whose successor began before its publication */
    /* prompt rows whose logprobs are asked (echo): at most PROMPT_LP_ROWS per step */
    struct choice *plp_owner[PROMPT_LP_ROWS];
    int plp_pos[PROMPT_LP_ROWS], plp_at[PROMPT_LP_ROWS], n_plp;
    struct seq_vocab *vocab;   /* every token's text and kind, for the outputs and grammar masks */
    float *logits;             /* (n_slots + PROMPT_LP_ROWS, n_vocab): the engine's rows, in batch order */
    float *scratch;            /* (n_slots + PROMPT_LP_ROWS, n_vocab) raw rows kept for logprobs */
    struct row_pool *samplers; /* rows of one step are sampled in parallel (each row's state is its own) */
    enum { ROWS_SAMPLE, ROWS_MASK, ROWS_DRAWN } rows_do; /* what the pool does to each row this time */
    int draws;                        /* the engine draws the tokens (engine_step_draw) when a step allows */
    struct draw_row *draw;            /* (n_slots) the step's draws, by output row */
    struct draw_out *drawn;           /* (n_slots) */
    int n_draft_step;                 /* drafted tokens in the step being built (sched_params.spec_n_max) */
    struct sched_spec_cost spec_cost; /* step times by rows, for the draft length (engine thread) */
    float
        *hid; /* (max_batch_tokens, dim) with sched_params.mtp: the step's hidden states (batch.hidden_out) */
    int want_hid; /* the step being built has rows of a sequence the MTP block drafts for */
    /* clients with requests in flight (under mu): sreq.client_id indexes them; an entry is free at refs 0 */
    struct sched_client {
        char name[48];
        int refs; /* requests in flight */
    } * clients;
    int clients_cap;
    int *running_of;        /* (clients_cap) engine thread: running sequences by client, this iteration */
    int *waiting_of;        /* (clients_cap) queued ones */
    int *q_client;          /* (q_cap) engine thread: the queue's clients, in order */
    unsigned char *q_ready; /* (q_cap) */
    int q_cap;
    struct sched_fair_seq *fair_run; /* (n_slots) the running sequences as the sharing policy sees them */
};

/* With mu held: new output, a finish or an error on r. */
void sched_req_signal_locked(struct sreq *r);
/* With mu held: drops one reference (the last frees r). */
void sched_req_unref_locked(struct sreq *r);
/* With mu held: c is finished (finish: its finish_reason), its request told. */
void sched_choice_done_locked(struct sched *s, struct choice *c, const char *finish);
/* With mu held: takes req's queued choices off the queue. */
void sched_unqueue_locked(struct sched *s, struct sreq *req);
int sched_wants_prompt_lps(const struct sreq *r);
/* KV blocks c may need: its prompt and max_tokens. */
int sched_kv_need(const struct sched *s, const struct choice *c);
/* The engine thread (arg: the sched) and the row pool's work for row i. */
void *sched_engine_main(void *arg);
void sched_sample_row(void *arg, int i);

#endif
