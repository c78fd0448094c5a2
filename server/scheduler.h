/* scheduler — the scheduler and the engine thread: a queue of sequences served first come first served
 * within each client's fair share of the slots, continuous batching at iteration level, chunked prefill. What
 * is admitted and how a step is cut is sched_policy's; a sequence's sampling, stops and text are
 * seq_output's; the slots' reusable prompts are prompt_cache's.
 *
 * HTTP threads build a `struct sreq` (api.c), sched_submit() it, then read its choices' outputs under
 * sched_lock() and wait on sched_wait(); the engine thread is the only caller of the engine. A request is
 * reference-counted (HTTP side + scheduler side) and freed by whichever lets go last. Every iteration the
 * engine thread reaps cancelled or timed-out sequences (engine_seq_free), admits queued ones first come
 * first served into free slots, and runs one engine_step over all decode tokens plus prefill chunks up to
 * max_batch_tokens (or prefill_budget). Stop strings are held back until they can no longer match, so they
 * never leak.
 */
#ifndef FERRY_SERVER_SCHEDULER_H
#define FERRY_SERVER_SCHEDULER_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "runtime/grammar.h"
#include "runtime/sampler.h"
#include "runtime/spec.h"
#include "runtime/tokenizer.h"
#include "server/sched_policy.h"
#include "server/seq_output.h"

struct engine;
struct metrics;

#define SCHED_MAX_TOP_LOGPROBS SEQ_MAX_TOP_LOGPROBS

enum sreq_kind {
    SREQ_COMPLETION = 0,
    SREQ_CHAT = 1,
    SREQ_RESPONSES = 2, /* /v1/responses: a chat, answered as a response */
    SREQ_EMBED = 3,     /* /v1/embeddings: each choice's prompt is run for its final hidden states, pooled */
    SREQ_ANTHROPIC = 4, /* /v1/messages: a chat, answered as an Anthropic message */
    SREQ_LLAMA = 5,     /* llama-server's /completion: a completion, answered in its shape */
};
enum choice_state { CHOICE_QUEUED = 0, CHOICE_RUNNING = 1, CHOICE_DONE = 2 };

struct sreq;

struct choice { /* one sequence: (prompt i, sample j) of a request */
    struct sreq *req;
    int index;             /* choices[] index = prompt * n + j */
    const int32_t *prompt; /* (n_prompt) borrowed from req */
    int n_prompt;
    struct choice *qnext; /* queue link */
    /* engine thread only */
    const int32_t *feed; /* (n_feed) what its slot computes before it decodes: the prompt, or for a sequence
                          * that gave its slot up mid-generation (resume), the prompt and its tokens so far */
    int n_feed;
    int resume;   /* it gave its slot up mid-generation: its output state is kept, its KV recomputed */
    int32_t *gen; /* (n_rec) the tokens generated so far, kept where it may give its slot up */
    int n_rec, gen_cap;
    int32_t *feed_buf; /* (feed_cap) owned: the feed of a resumed sequence */
    int feed_cap;
    int no_yield; /* it cannot give its slot up (the record of its tokens failed) */
    int slot, n_fed;
    int n_cached;          /* prompt positions taken from the slot's previous sequence (the prompt cache) */
    struct seq_output out; /* sampling, grammar, detokenization, stop strings, logprobs (seq_output.h) */
    double t_last;
    double t_first;  /* when its first token was published (sched_now), 0 before */
    int chunk;       /* prompt tokens in the current step */
    const char *fin; /* finish decided in this step */
    int e_at;        /* SREQ_EMBED: this step's first output row */
    /* speculative decoding (sched_params.spec_n_max): the prompt and the tokens generated so far, this
     * step's drafts (verified in rows after the pending token's), what the walk over them drew */
    int32_t *hist; /* (hist_cap) NULL: this choice does not speculate */
    int hist_cap;
    int n_draft, spec_pos, spec_drawn;
    struct sched_spec_accept spec_acc; /* how often its drafts are accepted; its back-off */
    int n_model_draft; /* drafts the draft model (or the MTP block) made for the next step, in draft[] */
    int mtp_on;      /* sched_params.mtp drafts for it: the block's slot holds what the engine's slot holds */
    int b_at, b_n;   /* its rows in the step's batch: first one and count (0: none) */
    int spec_refeed; /* 1 + the positions a rejection left its slot when it went back further than the step's
                      * start (0: none): under mu, the sequence so far is then fed again from there */
    int32_t draft[SPEC_MAX_DRAFT];
    struct lp_entry *spec_lps; /* (spec_drawn) with logprobs: the entries of the tokens the walk drew */
    /* shared, under the scheduler mutex */
    enum choice_state state;
    char *text; /* released text (never contains a stop string) */
    size_t text_len, text_cap;
    struct lp_entry *lps; /* (n_lps) when logprobs were asked */
    int n_lps, lps_cap;
    /* echo with logprobs (completions): entry i is prompt token i+1 given tokens 0..i, (n_prompt - 1)
     * entries, written by the engine thread during the prefill; readable once prompt_lps_ready is set (under
     * mu). */
    struct lp_entry *prompt_lps;
    int prompt_lps_ready;
    const char *finish; /* "stop", "length" or NULL while running */
    int stop_hit;       /* 1 + the index in req->stops of the stop string that ended it; 0 when none did */
    float *embd;      /* (dim) SREQ_EMBED: the pooled final hidden state, complete once the choice is done */
    int n_completion; /* tokens generated */
    /* HTTP thread only: streaming progress */
    size_t r_sent, a_sent; /* bytes of reasoning / answer content streamed (chat with tools or reasoning) */
    int calls_sent;
    int seq; /* /v1/responses streams: the next event's sequence_number */
    int rs_item, msg_item,
        items;            /* ... output index of the reasoning and message items (-1: not open), items */
    char (*call_ids)[40]; /* (TOOL_CALL_MAX) ids of the tool calls, made when first rendered */
    size_t sent;
    int lps_sent, head_sent, finish_sent;
    size_t echo_len; /* bytes of the echoed prompt text, where the generated text's offsets start */
};

struct sreq {
    enum sreq_kind kind;
    char id[48];       /* "cmpl-..." / "chatcmpl-..." */
    char client[48];   /* who sent it, for fair sharing and /status: "key N" (the Nth API key) or the
                        * client's address; "" = unknown (one client of its own) */
    long long created; /* unix seconds */
    double t_arrival;  /* monotonic seconds */
    double deadline;   /* monotonic seconds; 0 = none */
    /* parsed parameters */
    struct sampler_params sp; /* sp.seed is the base: choice j uses seed + j */
    struct logit_bias *bias;  /* (n_bias) owned */
    int n_bias;
    int max_tokens; /* per choice */
    int n;          /* choices per prompt */
    int stream, include_usage;
    int logprobs; /* -1 off, else number of top alternatives (0..20) */
    int echo;
    int ignore_eos;      /* end-of-generation tokens are sampled as text: only max_tokens and stops end it */
    int no_prompt_cache; /* llama-server's cache_prompt false: this request neither continues from the prompt
                          * cache nor leaves its KV behind for a later one */
    /* speculative decoding for this request (llama-server's speculative.n_max/n_min/p_min), within the
     * server's: drafts a step at most (0: none), the shortest draft worth a verification, and the draft
     * model's lowest token probability; -1: the server's */
    int spec_n_max, spec_n_min;
    float spec_p_min;
    struct grammar *grammar; /* owned; non-NULL: outputs are constrained to it (response_format json_object or
                              * json_schema, a required tool call); the output ends when the grammar does */
    int keep_special; /* control tokens other than end-of-generation go into the text (tool-call markers
                       * such as [TOOL_CALLS] and <|python_tag|> that the output parser looks for) */
    /* chat output parsing (read by the renderer) */
    int tools;             /* the output may hold tool calls (tools given, tool_choice not "none") */
    int tool_format;       /* enum tool_format */
    int tool_prefixed;     /* the prompt ends with the call marker: the whole output is the call section */
    int reasoning;         /* split a <think> block off the start of the output */
    int reasoning_started; /* the prompt opened the block */
    char *echo_json;       /* /v1/responses: request fields the response object repeats (JSON text, owned) */
    int pooling;           /* SREQ_EMBED: 0 = mean of the prompt's rows, 1 = its last row */
    int embd_base64;       /* SREQ_EMBED: answer with base64 float32 instead of arrays */
    char **stops;          /* (n_stops) owned, non-empty */
    int n_stops;
    /* prompts */
    int n_prompts;
    int32_t **prompts;      /* (n_prompts) owned token arrays */
    int *n_prompt_toks;     /* (n_prompts) */
    char **prompt_texts;    /* (n_prompts) owned, for echo; may hold NULLs */
    int prompt_tokens;      /* sum of n_prompt_toks */
    int n_choices;          /* n_prompts * n */
    struct choice *choices; /* (n_choices) */
    /* shared, under the scheduler mutex */
    pthread_cond_t cv; /* signalled on every new output, finish or error */
    /* Called right after each signal of cv, under the scheduler mutex, by the thread that signals (the engine
     * thread, or a sched_cancel caller): an event loop learns of progress without a thread waiting on cv. It
     * must not block or call the scheduler. Set before sched_submit; cleared under sched_lock() before
     * wake_user goes away. */
    void (*wake)(void *user);
    void *wake_user;
    int client_id; /* its client in the scheduler's table (sched_submit) */
    int started;   /* a choice was admitted: the queue timeout no longer applies */
    int oversize;  /* more choices than slots + queue: queued apart from the others (sched_submit) */
    int paused; /* the client does not read the stream: its choices get no decode rows (sched_set_paused) */
    int n_done; /* choices in CHOICE_DONE */
    int cancelled; /* 0 or the status that cut it (CANCELLED, TIMEOUT) */
    int error;     /* 0 or the status of an engine failure */
    char errmsg[160];
    int refs;
};

struct sched_params {
    int max_queue; /* waiting sequences beyond the free slots */
    int max_batch_tokens;
    int sample_threads; /* threads sampling the rows of one step (engine thread included) */
    int prompt_cache;   /* a finished sequence's KV stays in its slot; a later prompt starting with the same
                         * tokens continues from there instead of recomputing them */
    int prefill_budget; /* prefill tokens per step at most; 0: max_batch_tokens minus the step's decode rows
                         */
    int gpu_sampling;   /* the engine draws the tokens where the logits are (engine_step_draw: on the GPU only
                         * the ids cross PCIe); steps it cannot draw (the CPU backend, prompt logprobs) sample
                         * on the host */
    int overlap;    /* with gpu_sampling: a decode step whose rows go on begins before the last one's outputs
                     * are published (the device runs while the host publishes; sched_engine.c) */
    int spec_n_max; /* speculative decoding (runtime/spec.h): tokens one sequence drafts a step at most;
                     * 0 = off */
    int spec_n_min; /* a shorter draft is dropped (the step goes without it) */
    int spec_adapt; /* the draft length follows acceptance and the measured cost of rows
                     * (sched_policy_spec_pick); 0: spec_n_max (as the load allows) */
    float spec_p_min; /* the draft model stops a draft at a token it gives less than this probability */
    struct draft_model *draft; /* the drafter (runtime/draft_model.h; borrowed, run by the engine thread),
                                * or NULL: prompt lookup */
    struct mtp *mtp; /* the model's multi-token-prediction block drafts (runtime/mtp.h; borrowed, run by the
                      * engine thread, CPU backend), or NULL */
    int fair_share;  /* share the slots between clients while others wait (sched_policy.h) */
    double queue_timeout; /* seconds a request may wait for its first slot; then 503 (0 = no limit) */
    int ckpt_tail; /* recurrent models with checkpoints: prompts' prefill also stops this many positions
                    * before their end (sched_policy.h); 0 = never */
};

struct sched;

/* Allocates a zeroed request with its condition variable ready and refs = 1 (the caller's). */
struct sreq *sreq_new(void);

int sched_init(struct sched **out, struct engine *e, const struct tokenizer *t, struct metrics *m,
               const struct sched_params *p);
int sched_start(struct sched *s); /* spawns the engine thread */
void sched_stop(struct sched *s); /* cancels everything, joins the engine thread */
void sched_free(struct sched *s);

/* Queues every choice of req. Returns FERRY_ERR_BUSY when the queue is full (nothing queued; a request with
 * more choices than slots + queue is taken when no other such request is queued, and does not count against
 * the others' room), FERRY_ERR_DEVICE_MEM when one
 * sequence needs more KV blocks than the whole pool (req->errmsg then names the positions it needs and the
 * pool's). */
int sched_submit(struct sched *s, struct sreq *req);
/* Cuts a request (client gone, timeout, shutdown): queued choices leave now, running ones at the next
 * iteration, where their KV blocks are freed. */
void sched_cancel(struct sched *s, struct sreq *req, int status);
void sched_cancel_all(struct sched *s, int status);
/* Drops the caller's reference; frees the request when the scheduler is done with it too. */
void sched_release(struct sched *s, struct sreq *req);

/* The HTTP side says whether req's client reads its stream (paused: it does not, and its choices get no
 * decode rows; a paused stream's slot goes to a waiting sequence). Wakes the engine on a change. */
void sched_set_paused(struct sched *s, struct sreq *req, int paused);

void sched_lock(struct sched *s);
void sched_unlock(struct sched *s);
/* With the lock held: waits up to ms for new output on req. */
void sched_wait(struct sched *s, struct sreq *req, int ms);
/* Requests submitted and not yet finished. */
int sched_in_flight(struct sched *s);

double sched_now(void); /* monotonic seconds */
/* One sequence as the dashboard shows it. */
struct sched_seq {
    char id[48];     /* its request's id */
    char client[48]; /* its request's client (struct sreq) */
    int kind;        /* enum sreq_kind */
    int running;     /* 1 running (in a slot), 0 queued */
    int slot;        /* -1 when queued */
    int n_prompt;    /* prompt tokens */
    int n_fed;       /* of them computed (or taken from the prompt cache) */
    int n_gen;       /* tokens generated */
    int max_tokens;
    double age; /* seconds since the request arrived */
};
/* Fills out[0, cap) with the running sequences, then the queued ones in order; returns how many exist. */
int sched_describe(struct sched *s, struct sched_seq *out, int cap);

/* Width of an embedding (the model's hidden size). */
int sched_embd_dim(const struct sched *s);
/* Positions the KV pool holds in all (whole blocks; INT32_MAX / 2 when the engine reports no pool). */
int sched_kv_positions(const struct sched *s);

#endif
