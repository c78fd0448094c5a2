/* sched_policy — admission and batch composition for continuous batching, as pure functions.
 *
 * No engine, no threads, no HTTP: the scheduler describes the slots, the KV pool and its sequences in plain
 * numbers and applies what comes back. Invariants: admission is first come first served (the queue's head
 * waits for room rather than being overtaken, so no request starves); a running sequence holds a KV
 * reservation for its prompt + max_tokens, so it never finds the pool exhausted mid-generation; every
 * decoding sequence gets its token in every step, and prefill chunks fill the rest of the step's budget
 * in admission order (Sarathi-style chunked prefill: a long prompt is spread over several steps).
 * Usage: sched_policy_accepts() at submit, sched_policy_admit() for the queue's head each iteration,
 * sched_policy_plan_step() to cut the step.
 */
#ifndef FERRY_SERVER_SCHED_POLICY_H
#define FERRY_SERVER_SCHED_POLICY_H

struct sched_policy_params {
    int n_slots;          /* sequences the engine runs at once */
    int max_queue;        /* waiting sequences beyond the free slots */
    int max_batch_tokens; /* tokens of one engine step, decode rows included */
    int prefill_budget;   /* prefill tokens of one step at most; 0: max_batch_tokens minus the decode rows */
    int prompt_lp_rows;   /* prompt rows with logits (echo with logprobs) one step may hold */
    int ctx;              /* positions per sequence */
    int kv_blocks;        /* blocks in the KV pool */
    int kv_fast_blocks;   /* of them on the device (the rest: the extension in host memory, handed out last);
                           * 0: all */
    int kv_block;         /* positions per block (>= 1) */
    int ckpt_tail; /* a model whose state is saved where each prefill step ends (recurrent layers): a prompt's
                    * prefill also stops ckpt_tail positions before its end, so a next turn that re-renders
                    * the prompt's last few tokens (the generation prompt) resumes from there; 0: never */
};

/* KV blocks one sequence may use at most: prompt + max_tokens positions (capped at the context), rounded up
 * to whole blocks. */
int sched_policy_kv_need(const struct sched_policy_params *p, int n_prompt, int max_tokens);
/* Blocks that hold `positions` positions. */
int sched_policy_blocks(const struct sched_policy_params *p, int positions);

/* Whether a request can be queued: 0, or FERRY_ERR_BUSY when the queue has no room for it now. A request
 * with more sequences than the free slots and the queue hold is taken when nothing else is queued (it then
 * waits alone; the API bounds its sequences). n_queued and n_running are the current counts. */
int sched_policy_accepts(const struct sched_policy_params *p, int n_queued, int n_running, int n_seqs);
/* Whether one sequence can ever run: 0, or FERRY_ERR_DEVICE_MEM when it needs more KV blocks than the whole
 * pool (*need gets its blocks). */
int sched_policy_fits_pool(const struct sched_policy_params *p, int n_prompt, int max_tokens, int *need);

enum sched_admit {
    SCHED_ADMIT_NOW = 0, /* admit it; first drop *n_evict idle caches (least recently used first) */
    SCHED_ADMIT_WAIT = 1 /* no slot or no KV room yet: the head waits and nothing behind it is admitted */
};
/* The queue's head, needing `need` KV blocks: admitted when a slot is free and the running sequences'
 * reservations (kv_reserved), the head's need and the idle caches that stay fit in the pool.
 * idle_blocks[0, n_idle) are the blocks of the free slots' caches, least recently used first. Idle caches
 * are also dropped (least recently used first) where they would push the head's positions past the device's
 * blocks into the extension: a live sequence's positions there cost it every step, a cache's only a prefill
 * it may never be asked for. */
enum sched_admit sched_policy_admit(const struct sched_policy_params *p, int n_running, int kv_reserved,
                                    int need, const int *idle_blocks, int n_idle, int *n_evict);

/* A running sequence as a step sees it. */
struct sched_step_seq {
    int n_prompt;   /* prompt tokens */
    int n_fed;      /* of them computed; n_fed == n_prompt: it decodes */
    int no_prefill; /* its prompt is not prefilled in this batch (embeddings run in a batch of their own) */
    int prompt_lp;  /* its prompt rows want logits: they count against prompt_lp_rows */
};
struct sched_step_plan {
    int n_decode;  /* decode rows (one per decoding sequence) */
    int n_prefill; /* prefill tokens */
    int n_lp_rows; /* prompt rows with logits */
};
/* Cuts one step over seqs[0, n) in admission order: chunk[i] gets the prompt tokens sequence i feeds (0 for
 * a decoding one). Decode rows come first; prefill chunks then take, in order, what is left of
 * min(prefill budget, max_batch_tokens - decode rows). Returns the step's tokens. */
int sched_policy_plan_step(const struct sched_policy_params *p, const struct sched_step_seq *seqs, int n,
                           int *chunk, struct sched_step_plan *plan);
/* Prefill only (the embedding batch): chunk[i] of seqs' remaining prompts up to `budget` tokens, in order.
 * Returns the tokens. */
int sched_policy_plan_prefill(int budget, const struct sched_step_seq *seqs, int n, int *chunk);

/* Speculative decoding: a step verifies at most SCHED_SPEC_ROWS drafted tokens, and none when more than
 * SCHED_SPEC_MAX_SEQS sequences decode (a large batch already shares each pass over the weights). */
#define SCHED_SPEC_ROWS     32
#define SCHED_SPEC_MAX_SEQS 8
/* The tokens each of n_dec decoding sequences may draft this step: an equal share of rows_left (what the
 * step's decode rows and prefill chunks leave of max_batch_tokens), at most SCHED_SPEC_ROWS in all and n_max
 * each. */
int sched_policy_spec_len(int n_max, int n_dec, int rows_left);

/* What a step costs by its rows, as measured: t[r] the smoothed seconds of a step of r tokens (0: none seen),
 * r = 1..SCHED_SPEC_COST_ROWS; and what drafting costs: draft the smoothed seconds a draft position takes the
 * drafter (a draft model's or MTP block's step per drafted token, all sequences together; 0 for prompt
 * lookup, or none seen). */
#define SCHED_SPEC_COST_ROWS 64
struct sched_spec_cost {
    double t[SCHED_SPEC_COST_ROWS + 1];
    double draft;
};
/* A step of `rows` tokens took `seconds`. */
void sched_spec_cost_note(struct sched_spec_cost *c, int rows, double seconds);
/* Drafting up to k tokens a sequence took the drafter `seconds`. */
void sched_spec_cost_draft_note(struct sched_spec_cost *c, int k, double seconds);

/* How often one sequence's drafts are accepted, and when it drafts at all. The estimate is draft tokens
 * accepted (`succ`) out of those the walk reached (`tried`: the accepted ones and the first rejected one),
 * decayed by SCHED_SPEC_DECAY a drafting step so that recent steps count most, plus a prior of `n0` tries
 * accepted at `alpha0` that does not decay: a few early rejections move it, they do not decide it. Until
 * SCHED_SPEC_TRIES_MIN tries were seen the rate is no lower than the prior (a sequence starts trusted). A
 * step without drafts fades the evidence by SCHED_SPEC_FADE, so an estimate that chose no drafts drifts back
 * towards the prior and the sequence probes again. Back-off: after SCHED_SPEC_GRACE drafting steps in a row
 * whose drafts were all rejected the sequence waits 1, 2, 4, then SCHED_SPEC_WAIT_MAX steps (doubling with
 * each further such step) before drafting again; any accepted draft ends it. The prior by drafter: a draft
 * model and a multi-token-prediction block are trained to predict the model's tokens and start more trusted
 * than prompt lookup, whose proposals are right only where the text repeats. */
enum sched_spec_kind { SCHED_SPEC_NGRAM, SCHED_SPEC_MODEL, SCHED_SPEC_MTP };
#define SCHED_SPEC_DECAY     0.85
#define SCHED_SPEC_FADE      0.9
#define SCHED_SPEC_TRIES_MIN 6
#define SCHED_SPEC_GRACE     3
#define SCHED_SPEC_WAIT_MAX  8
struct sched_spec_accept {
    double succ, tried;   /* the decayed evidence */
    double alpha0, n0;    /* the prior */
    int seen, miss, wait; /* tries seen (up to SCHED_SPEC_TRIES_MIN), steps rejected in a row, steps left */
};
struct sched_spec_accept sched_spec_accept_new(enum sched_spec_kind kind);
/* One decoding step of the sequence: `drafted` drafts of which `accepted` were accepted; drafted 0: a step
 * without drafts (the back-off's wait counts down, the evidence fades). */
void sched_spec_accept_note(struct sched_spec_accept *a, int drafted, int accepted);
/* The chance that a draft token is accepted after the previous one was, for the draft length. */
double sched_spec_accept_rate(const struct sched_spec_accept *a);
/* Whether the sequence may draft this step (not backing off). */
int sched_spec_accept_may_draft(const struct sched_spec_accept *a);

/* The draft length for a step whose other rows number `base`, of n speculating sequences whose draft tokens
 * are accepted with chances alpha[0, n): the k <= k_max that makes the expected tokens per second largest,
 * sum_i (1 + alpha_i + ... + alpha_i^k) / (cost(base + n k) + k draft). A row count not measured yet costs
 * what the nearest measured count below it cost (so a longer draft is tried, and then measured); with nothing
 * measured, or past SCHED_SPEC_COST_ROWS, k_max. Ties go to the shorter draft. Where rows cost nearly
 * nothing (a step bound by reading weights: a GPU, host layers) this is k_max; where each row costs about
 * as much as the first (the CPU backend on few cores) it is short, or 0 when drafts are seldom accepted. */
int sched_policy_spec_pick(const struct sched_spec_cost *c, int base, const double *alpha, int n, int k_max);
/* ---- sharing between clients ----
 * A client is an API key, else an address (struct sreq's client). While others wait, no client keeps more
 * than its share of the slots: the queue is served first to clients below their share, and a slot held
 * beyond the share by a sequence that can give it up is taken back. A stream whose client stopped reading
 * (paused: it gets no decode rows) gives its slot to any waiting sequence; it is recomputed (prompt and
 * tokens so far) when its client reads again. Other sequences give their slot up only beyond their client's
 * share: an embedding input starts over, a generating sequence is recomputed as a paused one. Embedding
 * prefill shares the engine too: in small steps, and none in a step that gives another its first token. */

/* Slots one client may hold while others wait: n_slots / n_clients, at least 1. */
int sched_policy_fair_share(int n_slots, int n_clients);

/* The queued sequence to admit next, over the queue in order: q_client[i] its client, q_ready[i] 0 for one
 * that must not run now (a paused stream waiting to resume). The first ready one whose client holds fewer
 * than `share` running sequences (running_of, by client) goes first; else the first ready one. -1: none. */
int sched_policy_fair_pick(const int *q_client, const unsigned char *q_ready, int nq, const int *running_of,
                           int share);

enum sched_yield {
    SCHED_YIELD_NO = 0,     /* keeps its slot */
    SCHED_YIELD_PAUSED = 1, /* a stream nobody reads: gives its slot to anyone, resumed later */
    SCHED_YIELD_SHARE = 2,  /* gives its slot up beyond its client's share (an embedding input starts over,
                             * a generating sequence is recomputed) */
};
struct sched_fair_seq {
    int client;           /* index of its client */
    enum sched_yield how; /* whether and how it may give its slot up */
    int cost;             /* positions recomputed if it does */
};
/* The running sequence (index into run) that gives its slot to a waiting sequence of client w, or -1: a
 * paused stream first, the cheapest to recompute; else, only while w holds fewer than `share`, a
 * SCHED_YIELD_SHARE one of the client holding the most beyond its share, the cheapest first. */
int sched_policy_fair_victim(const struct sched_fair_seq *run, int n, const int *running_of, int share,
                             int w);

/* Embedding prefill tokens of one step (at least 1): a quarter of max_batch_tokens alone (a request arriving
 * meanwhile waits for that step), an eighth while other sequences run or wait, and none while another
 * sequence is starting (its prompt prefilled, its first token not out yet: a step's outputs are published
 * once its embedding batch is done too). Prefill of 64-128 rows per step costs little throughput on the
 * CPU; the steps between a newcomer and its first token are what it buys. */
int sched_policy_embed_budget(const struct sched_policy_params *p, int others_running, int others_waiting,
                              int others_starting);

#endif
