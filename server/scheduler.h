/* scheduler — the scheduler and the engine thread: a FIFO queue of sequences, continuous batching at
 * iteration level, chunked prefill, sampling, stop conditions and streaming detokenization.
 *
 * HTTP threads build a `struct sreq` (api.c), sched_submit() it, then read its choices' outputs under
 * sched_lock() and wait on sched_wait(); the engine thread is the only caller of the engine. A request is
 * reference-counted (HTTP side + scheduler side) and freed by whichever lets go last. Every iteration the
 * engine thread reaps cancelled or timed-out sequences (engine_seq_free), admits queued ones first come
 * first served into free slots, and runs one engine_step over all decode tokens plus prefill chunks up to
 * max_batch_tokens. Stop strings are held back until they can no longer match, so they never leak.
 */
#ifndef FERRY_SERVER_SCHEDULER_H
#define FERRY_SERVER_SCHEDULER_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "runtime/json_fsm.h"
#include "runtime/sampler.h"
#include "runtime/tokenizer.h"

struct engine;
struct metrics;

#define SCHED_MAX_TOP_LOGPROBS 20

enum sreq_kind { SREQ_COMPLETION = 0, SREQ_CHAT = 1 };
enum choice_state { CHOICE_QUEUED = 0, CHOICE_RUNNING = 1, CHOICE_DONE = 2 };

struct lp_entry { /* one generated token's log-probabilities */
    int32_t id;
    float lp;
    int n_top;
    int32_t top_id[SCHED_MAX_TOP_LOGPROBS];
    float top_lp[SCHED_MAX_TOP_LOGPROBS];
};

struct sreq;

struct choice { /* one sequence: (prompt i, sample j) of a request */
    struct sreq *req;
    int index;             /* choices[] index = prompt * n + j */
    const int32_t *prompt; /* (n_prompt) borrowed from req */
    int n_prompt;
    struct choice *qnext; /* queue link */
    /* engine thread only */
    int slot, n_fed, n_gen;
    int n_cached; /* prompt positions taken from the slot's previous sequence (the prompt cache) */
    struct json_fsm json; /* the output so far, when the request asks for a JSON object */
    int32_t last;
    struct sampler *smp;
    struct detok dt;
    char *hold; /* text held back while it may be the start of a stop string */
    size_t hold_len, hold_cap;
    double t_last;
    int chunk;       /* prompt tokens in the current step */
    size_t release;  /* bytes of hold to publish after this step */
    const char *fin; /* finish decided in this step */
    int has_lp;
    struct lp_entry lp_stage; /* logprobs of this step's token */
    int oom;                  /* an allocation failed while sampling: the request fails in the locked update */
    /* shared, under the scheduler mutex */
    enum choice_state state;
    char *text; /* released text (never contains a stop string) */
    size_t text_len, text_cap;
    struct lp_entry *lps; /* (n_lps) when logprobs were asked */
    int n_lps, lps_cap;
    /* echo with logprobs (completions): entry i is prompt token i+1 given tokens 0..i, (n_prompt - 1) entries,
     * written by the engine thread during the prefill; readable once prompt_lps_ready is set (under mu). */
    struct lp_entry *prompt_lps;
    int prompt_lps_ready;
    const char *finish; /* "stop", "length" or NULL while running */
    int n_completion;   /* tokens generated */
    /* HTTP thread only: streaming progress */
    size_t sent;
    int lps_sent, head_sent, finish_sent;
    size_t echo_len; /* bytes of the echoed prompt text, where the generated text's offsets start */
};

struct sreq {
    enum sreq_kind kind;
    char id[48];       /* "cmpl-..." / "chatcmpl-..." */
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
    int json_object; /* response_format json_object: the output is constrained to one JSON object */
    char **stops; /* (n_stops) owned, non-empty */
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
    int n_done;        /* choices in CHOICE_DONE */
    int cancelled;     /* 0 or the status that cut it (CANCELLED, TIMEOUT) */
    int error;         /* 0 or the status of an engine failure */
    char errmsg[160];
    int refs;
};

struct sched_params {
    int max_queue; /* waiting sequences beyond the free slots */
    int max_batch_tokens;
    int sample_threads; /* threads sampling the rows of one step (engine thread included) */
    int prompt_cache;   /* a finished sequence's KV stays in its slot; a later prompt starting with the same
                         * tokens continues from there instead of recomputing them */
};

struct sched;

/* Allocates a zeroed request with its condition variable ready and refs = 1 (the caller's). */
struct sreq *sreq_new(void);

int sched_init(struct sched **out, struct engine *e, const struct tokenizer *t, struct metrics *m,
               const struct sched_params *p);
int sched_start(struct sched *s); /* spawns the engine thread */
void sched_stop(struct sched *s); /* cancels everything, joins the engine thread */
void sched_free(struct sched *s);

/* Queues every choice of req (FCFS). Returns FERRY_ERR_BUSY when the queue is full (nothing queued),
 * FERRY_ERR_RANGE when the request has more choices than slots + queue could ever hold,
 * FERRY_ERR_DEVICE_MEM when one sequence needs more KV blocks than the whole pool. */
int sched_submit(struct sched *s, struct sreq *req);
/* Cuts a request (client gone, timeout, shutdown): queued choices leave now, running ones at the next
 * iteration, where their KV blocks are freed. */
void sched_cancel(struct sched *s, struct sreq *req, int status);
void sched_cancel_all(struct sched *s, int status);
/* Drops the caller's reference; frees the request when the scheduler is done with it too. */
void sched_release(struct sched *s, struct sreq *req);

void sched_lock(struct sched *s);
void sched_unlock(struct sched *s);
/* With the lock held: waits up to ms for new output on req. */
void sched_wait(struct sched *s, struct sreq *req, int ms);
/* Requests submitted and not yet finished. */
int sched_in_flight(struct sched *s);

double sched_now(void); /* monotonic seconds */

#endif
