/* seq_output — one sequence's output pipeline: sample → grammar mask → detokenize → stop strings →
 * logprobs → finish.
 *
 * Each step hands one logits row to seq_output_step(), which picks the token and decides, in o->release,
 * how many bytes at the start of o->hold may be shown: text that may still become a stop string is held
 * back until it cannot, and a stop string itself never appears. o->fin says when and why the sequence ends.
 * A seq_output belongs to one thread at a time (the scheduler samples rows in parallel, one row per
 * sequence); struct seq_vocab, the per-token tables, is read-only and shared.
 * Usage: seq_vocab_init once; per sequence seq_output_init → (seq_output_step, use o->hold[0, o->release),
 * seq_output_take) ... → seq_output_free. Both `serve` (scheduler.c) and `run` (cli_run.c) drive it.
 */
#ifndef FERRY_SERVER_SEQ_OUTPUT_H
#define FERRY_SERVER_SEQ_OUTPUT_H

#include <stddef.h>
#include <stdint.h>

#include "runtime/grammar.h"
#include "runtime/sampler.h"
#include "runtime/tokenizer.h"

#define SEQ_MAX_TOP_LOGPROBS 20

enum seq_tok_kind { SEQ_TOK_TEXT = 0, SEQ_TOK_CONTROL = 1, SEQ_TOK_EOG = 2 };

struct lp_entry { /* one token's log-probabilities */
    int32_t id;
    float lp;
    int n_top;
    int32_t top_id[SEQ_MAX_TOP_LOGPROBS];
    float top_lp[SEQ_MAX_TOP_LOGPROBS];
};

/* Every token's decoded bytes and kind, and the text tokens as tries for grammar masks. */
struct seq_vocab {
    const struct tokenizer *tok; /* NULL: token ids only (no text, no end-of-generation tokens) */
    int n_vocab;
    const char **piece;    /* (n_vocab) borrowed from tok; NULL for tokens without text */
    size_t *piece_len;     /* (n_vocab) */
    uint8_t *kind;         /* (n_vocab) enum seq_tok_kind */
    struct gvocab *gvocab; /* NULL without a tokenizer or when not asked for */
};
/* with_grammar 0: no gvocab (no constrained decoding; building the tries costs time on a large vocabulary).
 */
int seq_vocab_init(struct seq_vocab **out, const struct tokenizer *t, int n_vocab, int with_grammar);
void seq_vocab_free(struct seq_vocab *v);

struct seq_output_params {
    const struct grammar
        *grammar;       /* non-NULL: outputs are constrained to it; it ends when the grammar does */
    char *const *stops; /* (n_stops) non-empty strings that end the output, never shown */
    int n_stops;
    int logprobs;     /* -1 off, else top alternatives to report (0..SEQ_MAX_TOP_LOGPROBS) */
    int keep_special; /* control tokens other than end-of-generation go into the text */
    int ignore_eos;   /* end-of-generation tokens are ordinary tokens */
    int max_tokens;   /* tokens to generate at most */
    int n_prompt;     /* with ctx: the output also ends where the context does */
    int ctx;
};

struct seq_output {
    const struct seq_vocab *v;
    struct seq_output_params p;
    struct sampler *smp;
    struct gstate *gst;    /* where the output stands in the grammar */
    struct gscratch *gscr; /* its mask workspace */
    uint8_t *allowed;      /* (n_vocab) the grammar's mask of this step (seq_output_mask) */
    int mask_ready;        /* allowed is this step's already (a draw fell back to sampling on the host) */
    int first_eog;         /* the first end-of-generation token, -1 when none */
    struct detok dt;
    char *hold; /* decoded text not yet taken: [0, hold_len), NUL-terminated */
    size_t hold_len, hold_cap;
    int n_gen;    /* tokens sampled */
    int32_t last; /* the last one */
    /* the outcome of the last step */
    size_t release;  /* bytes at the start of hold that may be shown */
    const char *fin; /* "stop", "length" or NULL */
    int eog;         /* the token was an end-of-generation token */
    int stop_hit;    /* 1 + the index of the stop string that ended the output; 0 when none did */
    int has_lp;      /* lp holds its logprobs */
    struct lp_entry lp;
    int oom; /* an allocation failed: the text may have a hole (sticky) */
};

/* Sets up o for a new sequence (o may hold a previous one's freed state). Returns FERRY_ERR_INVALID for bad
 * sampling parameters, FERRY_ERR_NOMEM. */
int seq_output_init(struct seq_output *o, const struct seq_vocab *v, const struct seq_output_params *p,
                    const struct sampler_params *sp);
/* Frees what o holds; o may be zeroed or half set up, and is zeroed again. */
void seq_output_free(struct seq_output *o);
/* Tokens that count for the sampler's penalties without being generated (a prompt). */
void seq_output_accept(struct seq_output *o, const int32_t *toks, int n);
/* Samples the next token from row (n_vocab logits, modified by the mask); raw (n_vocab) is scratch for the
 * unconstrained row when logprobs are asked. Sets release, fin, eog, has_lp/lp. Returns the token. */
int32_t seq_output_step(struct seq_output *o, float *row, float *raw);
/* With a grammar: this step's allowed tokens, 1 each (the text tokens the grammar takes next, the
 * end-of-generation tokens when the output may end here, the first of those when nothing else is), in
 * o->allowed, which it returns; NULL without a grammar (any token). For a draw made elsewhere; a
 * seq_output_step of the same step then uses it rather than computing it again. */
const uint8_t *seq_output_mask(struct seq_output *o);
/* The step's token drawn elsewhere (engine_step_draw, on the GPU) with this sequence's sampler from
 * seq_output_mask's tokens: records the draw, then as seq_output_step. lp: its logprobs, when asked. */
void seq_output_drawn(struct seq_output *o, int32_t tok, const struct lp_entry *lp);
/* The caller used the first n released bytes: they leave hold. */
void seq_output_take(struct seq_output *o, size_t n);

#endif
