/* cli_chat — `ferry chat -m MODEL`: an interactive chat in the terminal.
 *
 * Each line typed is the user's next message; the answer streams as it is generated. The conversation is kept
 * and rendered through the model's chat template every turn; the KV cache keeps what the previous turns
 * computed, so a turn runs only its new tokens. When the conversation outgrows the context, the oldest turns
 * are dropped (the system message stays). Lines starting with '/' are commands: /reset, /exit, /help.
 * Ctrl-C stops an answer; Ctrl-C or Ctrl-D at the prompt ends the chat. Without a terminal (a pipe) it reads
 * the messages line by line and prints no prompt.
 */
#include <errno.h>
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "kernels/core/status.h"
#include "runtime/chat_template.h"
#include "runtime/engine.h"
#include "runtime/sampler.h"
#include "runtime/tokenizer.h"
#include "server/cli.h"
#include "server/gpu_arch.h"
#include "server/seq_output.h"

#define CHAT_MAX_MESSAGES 512
#define CHAT_CHUNK        512 /* prompt tokens per engine step */
#define CHAT_MAX_LINE     (1 << 20)

struct chat_opts {
    const char *model, *system, *chat_template;
    int max_tokens, ctx_size, threads, verbose, log_level, help;
    enum engine_backend backend;
    struct sampler_params sp;
};

struct chat {
    const struct chat_opts *o;
    struct model_file *mf;
    struct tokenizer *tok;
    struct engine *eng;
    struct seq_vocab *voc;
    const char *tmpl;
    struct chat_msg msgs[CHAT_MAX_MESSAGES];
    int n_msgs;
    int32_t *kv; /* the tokens the engine holds for sequence 0, in order */
    int n_kv, ctx, n_vocab;
    float *logits;
};

static volatile sig_atomic_t interrupted;
static void on_sigint(int sig)
{
    (void)sig;
    interrupted = 1;
}

static void chat_usage(FILE *f)
{
    fprintf(
        f, "usage: ferry chat -m MODEL [options]\n\n"
           "An interactive chat with a model in the terminal; answers stream as they are generated.\n"
           "Commands: /reset (forget the conversation), /exit (or Ctrl-D), /help. Ctrl-C stops an answer.\n\n"
           "options:\n"
           "  -m, --model PATH       GGUF file or Hugging Face directory (or FERRY_MODEL)\n"
           "  --system TEXT          a system message at the start of the conversation\n"
           "  --chat-template NAME   built-in template instead of the model's\n"
           "  --max-tokens N         tokens per answer at most (default 1024)\n"
           "  --temperature T        (default 0.8; 0 = greedy)\n"
           "  --top-k K, --top-p P, --min-p P   (defaults 40, 0.95, 0.05)\n"
           "  --seed S               sampling seed (default: from the clock)\n"
           "  --ctx-size N           positions of the conversation (default: min(model, 4096))\n"
           "  --threads N            CPU threads (default: all cores)\n"
           "  --backend B            auto|cpu|cuda (default auto)\n"
           "  --verbose              after each answer, its token counts and speed on stderr\n"
           "  --log-level L          error|warn|info|debug (default warn)\n");
}

static int chat_parse(int argc, char **argv, struct chat_opts *o)
{
    enum {
        O_SYSTEM = 256,
        O_TMPL,
        O_MAX,
        O_TEMP,
        O_TOPK,
        O_TOPP,
        O_MINP,
        O_SEED,
        O_CTX,
        O_THREADS,
        O_BACKEND,
        O_VERBOSE,
        O_LOG
    };
    static const struct option longopts[] = {
        {"model", required_argument, 0, 'm'},
        {"system", required_argument, 0, O_SYSTEM},
        {"chat-template", required_argument, 0, O_TMPL},
        {"max-tokens", required_argument, 0, O_MAX},
        {"temperature", required_argument, 0, O_TEMP},
        {"top-k", required_argument, 0, O_TOPK},
        {"top-p", required_argument, 0, O_TOPP},
        {"min-p", required_argument, 0, O_MINP},
        {"seed", required_argument, 0, O_SEED},
        {"ctx-size", required_argument, 0, O_CTX},
        {"threads", required_argument, 0, O_THREADS},
        {"backend", required_argument, 0, O_BACKEND},
        {"verbose", no_argument, 0, O_VERBOSE},
        {"log-level", required_argument, 0, O_LOG},
        {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0},
    };
    o->model = getenv("FERRY_MODEL");
    o->max_tokens = 1024;
    o->sp = sampler_default_params();
    o->sp.temperature = 0.8f;
    o->sp.top_k = 40;
    o->sp.top_p = 0.95f;
    o->sp.min_p = 0.05f;
    o->sp.seed = (uint64_t)time(NULL) ^ ((uint64_t)clock() << 32);
    o->log_level = LOG_LEVEL_WARN;
    int c, bad = 0;
    optind = 1;
    while ((c = getopt_long(argc, argv, "m:h", longopts, NULL)) != -1) {
        char *end = NULL;
        errno = 0;
        switch (c) {
        case 'm':
            o->model = optarg;
            break;
        case O_SYSTEM:
            o->system = optarg;
            break;
        case O_TMPL:
            o->chat_template = optarg;
            break;
        case O_MAX:
            o->max_tokens = (int)strtol(optarg, &end, 10);
            bad |= o->max_tokens < 1 || o->max_tokens > 1 << 20;
            break;
        case O_TEMP:
            o->sp.temperature = strtof(optarg, &end);
            bad |= !(o->sp.temperature >= 0 && o->sp.temperature <= 100);
            break;
        case O_TOPK:
            o->sp.top_k = (int)strtol(optarg, &end, 10);
            bad |= o->sp.top_k < 0;
            break;
        case O_TOPP:
            o->sp.top_p = strtof(optarg, &end);
            bad |= !(o->sp.top_p > 0 && o->sp.top_p <= 1);
            break;
        case O_MINP:
            o->sp.min_p = strtof(optarg, &end);
            bad |= !(o->sp.min_p >= 0 && o->sp.min_p <= 1);
            break;
        case O_SEED:
            o->sp.seed = strtoull(optarg, &end, 10);
            break;
        case O_CTX:
            o->ctx_size = (int)strtol(optarg, &end, 10);
            bad |= o->ctx_size < 0;
            break;
        case O_THREADS:
            o->threads = (int)strtol(optarg, &end, 10);
            bad |= o->threads < 0 || o->threads > 4096;
            break;
        case O_BACKEND:
            o->backend = !strcmp(optarg, "cpu")    ? ENGINE_BACKEND_CPU
                         : !strcmp(optarg, "cuda") ? ENGINE_BACKEND_CUDA
                                                   : ENGINE_BACKEND_AUTO;
            bad |= strcmp(optarg, "cpu") && strcmp(optarg, "cuda") && strcmp(optarg, "auto");
            break;
        case O_VERBOSE:
            o->verbose = 1;
            break;
        case O_LOG:
            o->log_level = cli_log_level_parse(optarg);
            bad |= o->log_level < 0;
            break;
        case 'h':
            o->help = 1;
            return 0;
        default:
            return -1;
        }
        if (end && (*end || errno)) bad = 1;
        if (bad) {
            fprintf(stderr, "ferry chat: invalid value '%s'\n", optarg ? optarg : "");
            return -1;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "ferry chat: unexpected argument '%s'\n", argv[optind]);
        return -1;
    }
    if (!o->model) {
        fprintf(stderr, "ferry chat: -m MODEL (or FERRY_MODEL) is required\n");
        return -1;
    }
    return 0;
}

static int chat_push(struct chat *ch, const char *role, const char *content, size_t len)
{
    if (ch->n_msgs >= CHAT_MAX_MESSAGES) return FERRY_ERR_RANGE;
    char *c = malloc(len + 1);
    if (!c) return FERRY_ERR_NOMEM;
    memcpy(c, content, len);
    c[len] = 0;
    ch->msgs[ch->n_msgs].role = role;
    ch->msgs[ch->n_msgs++].content = c;
    return 0;
}

/* Drops message i (its content is owned). */
static void chat_drop(struct chat *ch, int i)
{
    free((char *)ch->msgs[i].content);
    memmove(&ch->msgs[i], &ch->msgs[i + 1], (size_t)(ch->n_msgs - i - 1) * sizeof ch->msgs[0]);
    ch->n_msgs--;
}

/* The conversation rendered and tokenized, with the assistant's turn opened: *ids malloc'd. */
static int chat_tokenize(const struct chat *ch, int32_t **ids, int *n)
{
    char err[256] = "", *text = NULL;
    size_t len = 0;
    int32_t bos = tokenizer_bos(ch->tok), eos = tokenizer_eos(ch->tok);
    const char *bos_s = bos >= 0 ? tokenizer_token_str(ch->tok, bos) : "";
    const char *eos_s = eos >= 0 ? tokenizer_token_str(ch->tok, eos) : "";
    int rc = chat_template_render(ch->tmpl, ch->msgs, ch->n_msgs, 1, bos_s ? bos_s : "", eos_s ? eos_s : "",
                                  &text, &len, err);
    if (rc) {
        fprintf(stderr, "ferry chat: chat template: %s\n", err);
        return rc;
    }
    int add_bos = tokenizer_add_bos(ch->tok) && bos >= 0;
    if (add_bos && bos_s && *bos_s && !strncmp(text, bos_s, strlen(bos_s))) add_bos = 0; /* written by it */
    int cap = (int)len + 16;
    *ids = malloc((size_t)cap * sizeof **ids);
    *n = *ids ? tokenizer_encode(ch->tok, text, len, add_bos, 1, *ids, cap) : FERRY_ERR_NOMEM;
    free(text);
    if (*n < 0 || *n > cap) {
        fprintf(stderr, "ferry chat: cannot tokenize the conversation: %s\n",
                ferry_status_str(*n < 0 ? *n : FERRY_ERR_INTERNAL));
        free(*ids);
        *ids = NULL;
        return FERRY_ERR_INTERNAL;
    }
    return 0;
}

/* Feeds tokens to sequence 0 from position ch->n_kv on; the logits of the last one land in ch->logits. */
static int chat_feed(struct chat *ch, const int32_t *toks, int n)
{
    int32_t bt[CHAT_CHUNK * 3];
    uint8_t want[CHAT_CHUNK];
    struct batch b = {.tokens = bt, .pos = bt + CHAT_CHUNK, .seq = bt + 2 * CHAT_CHUNK, .want_logits = want};
    for (int start = 0; start < n; start += CHAT_CHUNK) {
        int m = n - start < CHAT_CHUNK ? n - start : CHAT_CHUNK;
        for (int i = 0; i < m; i++) {
            bt[i] = toks[start + i];
            b.pos[i] = ch->n_kv + i;
            b.seq[i] = 0;
            want[i] = start + i == n - 1;
        }
        b.n_tokens = m;
        int rc = engine_step(ch->eng, &b, ch->logits);
        if (rc) return rc;
        memcpy(ch->kv + ch->n_kv, toks + start, (size_t)m * sizeof *toks);
        ch->n_kv += m;
    }
    return 0;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* One turn: the user's line is the last message. Streams the answer to stdout and appends it. */
static int chat_turn(struct chat *ch)
{
    const struct chat_opts *o = ch->o;
    int32_t *ids = NULL;
    int n = 0, rc;
    /* the oldest turns go when the conversation and an answer no longer fit */
    for (;;) {
        if ((rc = chat_tokenize(ch, &ids, &n))) return rc;
        int first = ch->n_msgs > 0 && !strcmp(ch->msgs[0].role, "system");
        int reserve = o->max_tokens < ch->ctx / 4 ? o->max_tokens : ch->ctx / 4; /* room for an answer */
        if (n + reserve <= ch->ctx || (ch->n_msgs - first <= 1 && n + 16 <= ch->ctx)) break;
        if (ch->n_msgs - first <= 1) {
            fprintf(stderr, "ferry chat: the message takes %d tokens; the context holds %d (--ctx-size)\n", n,
                    ch->ctx);
            free(ids);
            chat_drop(ch, ch->n_msgs - 1);
            return 0;
        }
        free(ids);
        chat_drop(ch, first); /* a user message and, after it, its answer */
        if (ch->n_msgs - first > 1 && strcmp(ch->msgs[first].role, "user")) chat_drop(ch, first);
        if (o->verbose) fprintf(stderr, "ferry chat: the oldest turn was dropped to fit the context\n");
    }
    if (n < 1) { /* a template that renders nothing: nothing to answer */
        free(ids);
        chat_drop(ch, ch->n_msgs - 1);
        return 0;
    }
    int keep = 0;
    while (keep < ch->n_kv && keep < n - 1 && ch->kv[keep] == ids[keep]) keep++;
    keep = engine_seq_keep(ch->eng, 0, keep);
    if (keep < 0) keep = 0, engine_seq_free(ch->eng, 0);
    ch->n_kv = keep;
    double t0 = now_s();
    if ((rc = chat_feed(ch, ids + keep, n - keep))) {
        fprintf(stderr, "ferry chat: forward pass failed: %s\n", ferry_status_str(rc));
        free(ids);
        return rc;
    }
    double t1 = now_s();
    const struct seq_output_params op = {.logprobs = -1,
                                         .max_tokens =
                                             o->max_tokens < ch->ctx - n ? o->max_tokens : ch->ctx - n,
                                         .n_prompt = n,
                                         .ctx = ch->ctx};
    struct seq_output so = {0};
    if ((rc = seq_output_init(&so, ch->voc, &op, &o->sp))) {
        fprintf(stderr, "ferry chat: invalid sampling parameters\n");
        free(ids);
        return rc;
    }
    seq_output_accept(&so, ids, n);
    free(ids);
    char *answer = NULL;
    size_t alen = 0;
    int n_gen = 0;
    interrupted = 0;
    while (!interrupted) {
        int32_t t = seq_output_step(&so, ch->logits, NULL);
        if (so.release) {
            char *grown = realloc(answer, alen + so.release + 1);
            if (!grown) {
                rc = FERRY_ERR_NOMEM;
                break;
            }
            answer = grown;
            memcpy(answer + alen, so.hold, so.release);
            alen += so.release;
            answer[alen] = 0;
            fwrite(so.hold, 1, so.release, stdout);
            fflush(stdout);
            seq_output_take(&so, so.release);
        }
        if (so.eog) break;
        n_gen++;
        if (so.fin) break;
        if ((rc = chat_feed(ch, &t, 1))) {
            fprintf(stderr, "\nferry chat: forward pass failed: %s\n", ferry_status_str(rc));
            break;
        }
    }
    double t2 = now_s();
    if (interrupted) fputs(" [stopped]", stdout);
    fputs("\n", stdout);
    fflush(stdout);
    seq_output_free(&so);
    if (!rc) rc = chat_push(ch, "assistant", answer ? answer : "", alen);
    free(answer);
    if (o->verbose)
        fprintf(stderr, "ferry chat: prompt %d tokens (%d reused) in %.3f s, answer %d tokens in %.3f s\n", n,
                keep, t1 - t0, n_gen, t2 - t1);
    return rc;
}

/* Forgets the conversation but the system message. */
static void chat_reset(struct chat *ch)
{
    int first = ch->n_msgs > 0 && !strcmp(ch->msgs[0].role, "system");
    while (ch->n_msgs > first) chat_drop(ch, ch->n_msgs - 1);
    engine_seq_free(ch->eng, 0);
    ch->n_kv = 0;
}

static int chat_loop(struct chat *ch)
{
    int tty = isatty(STDIN_FILENO);
    char *line = NULL;
    size_t cap = 0;
    int rc = 0;
    if (tty) printf("ferry chat: type a message and press Enter; /help for commands, Ctrl-D to quit\n");
    for (;;) {
        if (tty) {
            fputs("> ", stdout);
            fflush(stdout);
        }
        interrupted = 0;
        errno = 0;
        ssize_t len = getline(&line, &cap, stdin);
        if (len < 0) {
            if (tty) fputc('\n', stdout);
            break; /* end of input, or Ctrl-C at the prompt (EINTR) */
        }
        while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r')) line[--len] = 0;
        if (len == 0) continue;
        if (len > CHAT_MAX_LINE) {
            fprintf(stderr, "ferry chat: a message is limited to %d bytes\n", CHAT_MAX_LINE);
            continue;
        }
        if (line[0] == '/') {
            if (!strcmp(line, "/exit") || !strcmp(line, "/quit")) break;
            if (!strcmp(line, "/reset")) {
                chat_reset(ch);
                printf("(the conversation is forgotten)\n");
            } else {
                printf("/reset  forget the conversation (the system message stays)\n/exit   quit (also "
                       "Ctrl-D)\n");
            }
            continue;
        }
        if (ch->n_msgs >= CHAT_MAX_MESSAGES - 1)
            chat_drop(ch, ch->n_msgs > 0 && !strcmp(ch->msgs[0].role, "system"));
        if ((rc = chat_push(ch, "user", line, (size_t)len))) break;
        if ((rc = chat_turn(ch))) break;
    }
    free(line);
    return rc;
}

int cli_chat_main(int argc, char **argv)
{
    struct chat_opts o = {0};
    if (chat_parse(argc, argv, &o)) {
        fprintf(stderr, "(see ferry chat --help)\n");
        return 2;
    }
    if (o.help) {
        chat_usage(stdout);
        return 0;
    }
    cli_log_init((enum log_level)o.log_level);
    char err[512] = "";
    if (gpu_arch_check(o.backend == ENGINE_BACKEND_CPU ? "cpu" : "auto", err)) {
        fprintf(stderr, "ferry chat: %s\n", err);
        return 1;
    }
    struct chat ch = {.o = &o};
    int status = 1, rc;
    if (cli_open_model(o.model, &ch.mf)) goto out;
    if ((rc = tokenizer_init(&ch.tok, ch.mf, err))) {
        ch.tok = NULL;
        fprintf(stderr, "ferry chat: cannot load the tokenizer: %s (%s)\n", err, ferry_status_str(rc));
        goto out;
    }
    ch.tmpl = o.chat_template ? chat_template_builtin(o.chat_template) : ch.mf->chat_template;
    if (!ch.tmpl) {
        fprintf(stderr, "ferry chat: %s; pass --chat-template NAME (chatml, llama2, llama3, mistral, ...)\n",
                o.chat_template ? "unknown chat template name" : "the model has no chat template");
        goto out;
    }
    struct engine_params ep = engine_default_params();
    ep.n_threads = o.threads;
    ep.ctx_size = o.ctx_size;
    ep.n_seqs = 1;
    ep.backend = o.backend;
    if ((rc = engine_init(&ch.eng, ch.mf, &ep, err))) {
        fprintf(stderr, "ferry chat: %s (%s)\n", err, ferry_status_str(rc));
        goto out;
    }
    ch.ctx = engine_ctx_size(ch.eng);
    ch.n_vocab = engine_hparams(ch.eng)->n_vocab;
    ch.kv = malloc((size_t)ch.ctx * sizeof *ch.kv);
    ch.logits = malloc((size_t)ch.n_vocab * sizeof *ch.logits);
    if (!ch.kv || !ch.logits || seq_vocab_init(&ch.voc, ch.tok, ch.n_vocab, 0)) {
        fprintf(stderr, "ferry chat: out of memory\n");
        goto out;
    }
    if (o.system && chat_push(&ch, "system", o.system, strlen(o.system))) goto out;
    struct sigaction sa = {0}, old;
    sa.sa_handler = on_sigint; /* no SA_RESTART: Ctrl-C at the prompt ends getline */
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, &old);
    status = chat_loop(&ch) ? 1 : 0;
    sigaction(SIGINT, &old, NULL);
out:
    while (ch.n_msgs > 0) chat_drop(&ch, ch.n_msgs - 1);
    free(ch.kv);
    free(ch.logits);
    seq_vocab_free(ch.voc);
    engine_free(ch.eng);
    tokenizer_free(ch.tok);
    model_file_close(ch.mf);
    return status;
}
