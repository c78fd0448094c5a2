/* Unit tests of seq_output, one sequence's output pipeline (sample → grammar → detokenize → stop strings →
 * logprobs → finish), with the stories260K tokenizer and logits rows that force each token: the text
 * released step by step equals the tokenizer's own decoding; a stop string is held back while it may still
 * match and never released; max_tokens and end-of-generation end the output ("length", "stop");
 * --ignore-eos makes an end token ordinary; logprobs are those of the row. Skips (with the path) when the
 * model is missing. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/core/status.h"
#include "runtime/grammar.h"
#include "runtime/grammar_build.h"
#include "server/seq_output.h"
#include "weights/model_file.h"

static struct model_file *mf;
static struct tokenizer *tok;
static struct seq_vocab *voc;
static int n_vocab;

static void setup(void)
{
    const char *td = getenv("FERRY_TESTDATA");
    char path[1024], err[256] = "";
    snprintf(path, sizeof path, "%s/models/stories260K.gguf", td ? td : "../shared/testdata");
    FILE *f = fopen(path, "rb");
    if (!f) cr_skip_test("missing FILE: %s", path);
    fclose(f);
    cr_assert_eq(model_file_open(path, &mf, NULL, NULL, err), 0, "%s", err);
    cr_assert_eq(tokenizer_init(&tok, mf, err), 0, "%s", err);
    n_vocab = tokenizer_n_vocab(tok);
    cr_assert_eq(seq_vocab_init(&voc, tok, n_vocab, 1), 0);
}

static void teardown(void)
{
    seq_vocab_free(voc);
    tokenizer_free(tok);
    model_file_close(mf);
}

/* A row whose greedy choice is t: t at 0, every other token at -20 (finite, so logprobs stay finite). */
static void force(float *row, int32_t t)
{
    for (int i = 0; i < n_vocab; i++) row[i] = -20.0f;
    row[t] = 0.0f;
}

static int encode(const char *text, int32_t *ids, int cap)
{
    int n = tokenizer_encode(tok, text, strlen(text), 0, 0, ids, cap);
    cr_assert_gt(n, 0);
    return n;
}

static struct seq_output_params params(int max_tokens)
{
    struct seq_output_params p = {.logprobs = -1, .max_tokens = max_tokens, .n_prompt = 1, .ctx = 1 << 20};
    return p;
}

static struct sampler_params greedy(void)
{
    struct sampler_params sp = sampler_default_params();
    sp.temperature = 0;
    return sp;
}

/* Feeds ids; appends the released text to out (cap bytes); returns the step that finished (or n). */
static int run(struct seq_output *o, const int32_t *ids, int n, char *out, size_t cap, float *row, float *raw)
{
    size_t len = strlen(out);
    for (int i = 0; i < n; i++) {
        force(row, ids[i]);
        cr_assert_eq(seq_output_step(o, row, raw), ids[i]);
        cr_assert_leq(len + o->release, cap - 1);
        memcpy(out + len, o->hold, o->release);
        len += o->release;
        out[len] = 0;
        seq_output_take(o, o->release);
        if (o->fin) return i;
    }
    return n;
}

TestSuite(seq_output, .init = setup, .fini = teardown);

Test(seq_output, released_text_is_the_decoding)
{
    int32_t ids[64];
    const int n = encode("Once upon a time, there was a little girl named Lily.", ids, 64);
    char *ref = NULL;
    size_t ref_len = 0;
    cr_assert_eq(tokenizer_decode(tok, ids, n, 0, &ref, &ref_len), 0);
    struct seq_output o = {0};
    struct seq_output_params p = params(1000);
    struct sampler_params sp = greedy();
    cr_assert_eq(seq_output_init(&o, voc, &p, &sp), 0);
    float *row = malloc((size_t)n_vocab * sizeof *row);
    char out[1024] = "";
    cr_assert_eq(run(&o, ids, n, out, sizeof out, row, NULL), n);
    cr_assert_null(o.fin);
    cr_assert_eq(o.n_gen, n);
    cr_assert_str_eq(out, ref);
    free(ref);
    free(row);
    seq_output_free(&o);
}

Test(seq_output, stop_string_is_held_back_and_never_released)
{
    int32_t ids[64];
    const int n = encode("Once upon a time, there was a little girl named Lily.", ids, 64);
    char *ref = NULL;
    size_t ref_len = 0;
    cr_assert_eq(tokenizer_decode(tok, ids, n, 0, &ref, &ref_len), 0);
    const char *stop = "there was";
    const char *at = strstr(ref, stop);
    cr_assert_not_null(at);
    char *stops[1] = {(char *)stop};
    struct seq_output o = {0};
    struct seq_output_params p = params(1000);
    p.stops = stops;
    p.n_stops = 1;
    struct sampler_params sp = greedy();
    cr_assert_eq(seq_output_init(&o, voc, &p, &sp), 0);
    float *row = malloc((size_t)n_vocab * sizeof *row);
    char out[1024] = "";
    size_t len = 0;
    int fin_at = -1, held = 0;
    for (int i = 0; i < n; i++) {
        force(row, ids[i]);
        seq_output_step(&o, row, NULL);
        memcpy(out + len, o.hold, o.release);
        len += o.release;
        out[len] = 0;
        seq_output_take(&o, o.release);
        /* never anything from the stop string's start on, and nothing else held longer than needed */
        cr_assert_leq(len, (size_t)(at - ref), "step %d released \"%s\"", i, out);
        if (o.hold_len > 0) held = 1;
        if (o.fin) {
            fin_at = i;
            break;
        }
    }
    cr_assert_geq(fin_at, 0, "the stop string never ended the output");
    cr_assert_str_eq(o.fin, "stop");
    cr_assert(held, "the start of the stop string was never held back");
    cr_assert_eq(len, (size_t)(at - ref));
    cr_assert_eq(strncmp(out, ref, len), 0);
    cr_assert_eq(o.hold_len, 0, "the stop string stays unreleased");
    free(ref);
    free(row);
    seq_output_free(&o);
}

Test(seq_output, max_tokens_and_end_of_generation)
{
    const int32_t eos = tokenizer_eos(tok);
    cr_assert_geq(eos, 0);
    int32_t ids[64];
    const int n = encode("Once upon a time", ids, 64);
    cr_assert_geq(n, 3);
    float *row = malloc((size_t)n_vocab * sizeof *row);
    struct sampler_params sp = greedy();
    /* max_tokens 2: "length" at the second token, with everything decoded released */
    struct seq_output o = {0};
    struct seq_output_params p = params(2);
    cr_assert_eq(seq_output_init(&o, voc, &p, &sp), 0);
    char out[256] = "";
    cr_assert_eq(run(&o, ids, n, out, sizeof out, row, NULL), 1);
    cr_assert_str_eq(o.fin, "length");
    char *ref = NULL;
    size_t ref_len = 0;
    cr_assert_eq(tokenizer_decode(tok, ids, 2, 0, &ref, &ref_len), 0);
    cr_assert_str_eq(out, ref);
    free(ref);
    /* the context's end is a length too */
    p = params(100);
    p.n_prompt = 10;
    p.ctx = 11;
    cr_assert_eq(seq_output_init(&o, voc, &p, &sp), 0);
    out[0] = 0;
    cr_assert_eq(run(&o, ids, n, out, sizeof out, row, NULL), 0);
    cr_assert_str_eq(o.fin, "length");
    /* an end-of-generation token: "stop", no text of its own */
    p = params(100);
    cr_assert_eq(seq_output_init(&o, voc, &p, &sp), 0);
    out[0] = 0;
    const int32_t seq[2] = {ids[0], eos};
    cr_assert_eq(run(&o, seq, 2, out, sizeof out, row, NULL), 1);
    cr_assert_str_eq(o.fin, "stop");
    cr_assert(o.eog);
    cr_assert_eq(tokenizer_decode(tok, ids, 1, 0, &ref, &ref_len), 0);
    cr_assert_str_eq(out, ref);
    free(ref);
    /* ignore_eos: the same token is an ordinary one */
    p.ignore_eos = 1;
    cr_assert_eq(seq_output_init(&o, voc, &p, &sp), 0);
    out[0] = 0;
    cr_assert_eq(run(&o, seq, 2, out, sizeof out, row, NULL), 2);
    cr_assert_null(o.fin);
    cr_assert(!o.eog);
    free(row);
    seq_output_free(&o);
}

Test(seq_output, logprobs_of_the_row)
{
    float *row = malloc((size_t)n_vocab * sizeof *row), *raw = malloc((size_t)n_vocab * sizeof *raw);
    struct sampler_params sp = greedy();
    struct seq_output o = {0};
    struct seq_output_params p = params(10);
    p.logprobs = 2;
    cr_assert_eq(seq_output_init(&o, voc, &p, &sp), 0);
    for (int i = 0; i < n_vocab; i++) row[i] = -20.0f;
    row[100] = 0.0f;
    row[200] = -1.0f;
    cr_assert_eq(seq_output_step(&o, row, raw), 100);
    cr_assert(o.has_lp);
    cr_assert_eq(o.lp.id, 100);
    cr_assert_eq(o.lp.n_top, 2);
    /* log-softmax: 0 - log(1 + e^-1 + (n-2) e^-20) */
    const double lse = log(1.0 + exp(-1.0) + (n_vocab - 2) * exp(-20.0));
    cr_assert_float_eq(o.lp.lp, -lse, 1e-4);
    cr_assert_eq(o.lp.top_id[0], 100);
    cr_assert_eq(o.lp.top_id[1], 200);
    cr_assert_float_eq(o.lp.top_lp[1], -1.0 - lse, 1e-4);
    free(row);
    free(raw);
    seq_output_free(&o);
}

/* A draw that falls back to the host (over the device's capacities) has computed the step's grammar mask
 * already: the host step uses that mask, and the next step computes its own. The mask is tampered with after
 * seq_output_mask (one token the grammar refuses made the only one allowed) to see which one the step used.
 */
Test(seq_output, a_computed_mask_serves_the_host_step)
{
    struct gbuilder *b;
    struct grammar *g;
    char err[256] = "";
    cr_assert_eq(gb_init(&b), 0);
    const int root = gb_lit(b, "Once upon", 9);
    cr_assert_eq(gb_finish(b, root, &g, err), 0, "%s", err);
    struct seq_output_params p = params(8);
    p.grammar = g;
    struct sampler_params sp = greedy();
    struct seq_output o = {0};
    cr_assert_eq(seq_output_init(&o, voc, &p, &sp), 0);
    float *row = malloc((size_t)n_vocab * sizeof *row), *raw = malloc((size_t)n_vocab * sizeof *raw);
    int32_t ids[8];
    const int32_t refused = encode(" the", ids, 8) == 1 ? ids[0] : 0;
    const uint8_t *m = seq_output_mask(&o);
    cr_assert_not_null(m);
    cr_assert_eq(m[refused], 0, "the grammar refuses ' the' first");
    memset(o.allowed, 0, (size_t)n_vocab);
    o.allowed[refused] = 1;
    force(row, encode("Once", ids, 8) >= 1 ? ids[0] : 1);
    cr_assert_eq(seq_output_step(&o, row, raw), refused, "the step computed its mask again");
    /* the next step's mask is its own: the tampered one is gone (after ' the' the literal cannot go on, so
     * only the first end token is left) */
    force(row, refused);
    cr_assert_neq(seq_output_step(&o, row, raw), refused);
    free(row);
    free(raw);
    seq_output_free(&o);
    grammar_free(g);
}
