/* cli_run — `ferry run`: one generation from the command line (the stable interface of DESIGN.md).
 *
 *   ferry run --model PATH (--prompt TEXT | --prompt-tokens 1,2,3 | --chat --message role:text ...)
 *             [--max-tokens N] [--temperature T] [--seed S] [--json] [--dump-logits FILE] ...
 * --prompt chats when the model has a chat template (the prompt is the user's message, as llama.cpp's CLI
 * does); --raw completes the text as it is.
 * --json prints {"prompt_tokens":[...],"tokens":[...],"text":"..."}; --dump-logits writes the logits of the
 * last prompt position as little-endian float32. Works without a tokenizer when given token ids.
 */
#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernels/core/status.h"
#include "runtime/chat_template.h"
#include "runtime/engine.h"
#include "runtime/sampler.h"
#include "runtime/draft_model.h"
#include "runtime/mtp.h"
#include "runtime/spec.h"
#include "runtime/tokenizer.h"
#include "server/cli.h"
#include "server/sched_policy.h"
#include "server/seq_output.h"
#include "server/gpu_arch.h"
#include "server/options.h"

#define MAX_MESSAGES 256

struct run_opts {
    const char *model;
    const char *hf_repo; /* --hf-repo OWNER/REPO[:QUANT]: pulled into the cache, then model */
    char pulled[4096];   /* its local path */
    const char *prompt;
    const char *prompt_tokens;
    int chat;
    int raw; /* --raw: --prompt is completed as plain text even when the model has a chat template */
    const char *system; /* --system: a system message before the --prompt one */
    const char *messages_file;
    struct chat_msg msgs[MAX_MESSAGES];
    int n_msgs;
    const char *chat_template;
    int max_tokens;
    struct sampler_params sp;
    int seed_given;
    int json;
    const char *dump_logits;
    int threads;
    int ctx_size;
    int bos; /* -1 = the model's default */
    int ignore_eos;
    int log_level;
    enum engine_quant quant;
    enum engine_backend backend;
    int kv_type;             /* --kv-type: enum kv_elem (default f16) */
    int swa_full;            /* --swa-full: sliding-window layers keep every position */
    int spec_n_max;          /* --spec-type: drafts of up to this many tokens a step; 0 = off */
    int spec_n_min;          /* a shorter draft is not verified */
    int spec_fixed;          /* drafts of spec_n_max tokens, not adapted to acceptance and the cost of rows */
    float spec_p_min;        /* --model-draft stops a draft at a token below this probability */
    const char *model_draft; /* --spec-type draft: the draft model */
    int spec_mtp;            /* --spec-type mtp: the model's multi-token-prediction block drafts */
};

static void run_usage(FILE *f)
{
    fprintf(f,
            "usage: ferry run --model PATH (--prompt TEXT | --prompt-tokens IDS | --chat ...) [options]\n\n"
            "  --model PATH           GGUF file or Hugging Face directory (env FERRY_MODEL)\n"
            "  --prompt TEXT          prompt text (needs the model's tokenizer); sent as the user's message\n"
            "                         through the chat template when the model has one\n"
            "  --raw                  complete --prompt as plain text, without the chat template\n"
            "  --system TEXT          a system message before --prompt (chat)\n"
            "  --prompt-tokens IDS    prompt as comma-separated token ids (no tokenizer needed)\n"
            "  --chat                 render messages with the model's chat template\n"
            "  --message ROLE:TEXT    a chat message (repeatable; implies --chat)\n"
            "  --messages FILE        chat messages as a JSON array of {role, content} (implies --chat)\n"
            "  --chat-template NAME   built-in template instead of the model's (chatml, llama2, llama3,\n"
            "                         mistral, gemma, phi3, zephyr)\n"
            "  --max-tokens N         tokens to generate (default 128)\n"
            "  --temperature T        0 = greedy, the default; e.g. 0.8 to sample\n"
            "  --top-k K              (default 40; 0 = off)\n"
            "  --top-p P              (default 0.95; 1 = off)\n"
            "  --min-p P              (default 0.05; 0 = off)\n"
            "  --repeat-penalty R     (default 1 = off)\n"
            "  --presence-penalty P   (default 0)\n"
            "  --frequency-penalty P  (default 0)\n"
            "  --seed S               sampling seed (default: from the clock, printed with --json)\n"
            "  --bos / --no-bos       force adding BOS or not (default: the model's metadata)\n"
            "  --ignore-eos           keep generating past end-of-generation tokens\n"
            "  --json                 print {\"prompt_tokens\",\"tokens\",\"text\"} as JSON\n"
            "  --dump-logits FILE     write the last prompt position's logits (float32 LE)\n"
            "  --threads N            CPU threads (default: all cores)\n"
            "  --quant none|int8|int4 quantize F32/F16/BF16 weights at load (int8: llama.cpp's Q8_0, int4:\n"
            "                         its Q4_K_M mix; as `ferry quantize` writes them)\n"
            "  --kv-type f16|f32|q8_0 the CPU backend's KV cache (default f16)\n"
            "  --swa-full             sliding-window layers keep every position in the KV cache (by default\n"
            "                         they keep only their window, on the CPU and on the GPU)\n"
            "  --backend B            auto|cpu|cuda (default auto: CUDA when built and a GPU is present)\n"
            "  --gpus N               the CUDA device (default 0, the first; several: not implemented yet,\n"
            "                         `ferry inspect --gpus 0,1` shows their plan)\n"
            "  --hf-repo OWNER/REPO[:QUANT]  the model from a Hugging Face hub, as ferry pull fetches it\n"
            "  --ctx-size N           context length (default: the model's, at most 4096)\n"
            "  --spec-type none|ngram|draft|mtp  speculative decoding: ngram drafts continuations found\n"
            "                         earlier in the prompt and output (prompt lookup), draft asks\n"
            "                         --model-draft, mtp the model's own multi-token-prediction block\n"
            "                         (Qwen3.5/3.6, Qwen3-Next files that have one; CPU backend);\n"
            "                         drafts are verified k+1 tokens a step and the output is the same as\n"
            "                         without (default none; draft when --model-draft is given)\n"
            "  --model-draft PATH     a smaller model with the same vocabulary that drafts (GGUF or HF)\n"
            "  --spec-draft-n-max N   tokens drafted a step, 1..32 (default 8)\n"
            "  --spec-draft-n-min N   a shorter draft is not verified (default 0)\n"
            "  --spec-draft-adapt 0|1 the draft length follows acceptance and the measured cost of rows\n"
            "                         (default 1); 0: always --spec-draft-n-max\n"
            "  --spec-draft-p-min P   the draft model stops at a token it gives less than P (default 0)\n"
            "  --log-level LEVEL      error|warn|info|debug (default warn)\n");
}

static int parse_int(const char *s, long lo, long hi, int *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) return -1;
    *out = (int)v;
    return 0;
}

static int parse_float(const char *s, float lo, float hi, float *out)
{
    char *end;
    errno = 0;
    float v = strtof(s, &end);
    if (errno || end == s || *end || !(v >= lo && v <= hi)) return -1;
    *out = v;
    return 0;
}

/* "1,2,3" → ids; returns the count or -1. */
static int parse_ids(const char *s, int32_t **out)
{
    int cap = 16, n = 0;
    int32_t *ids = malloc(cap * sizeof *ids);
    if (!ids) return -1;
    const char *p = s;
    while (*p) {
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (errno || end == p || v < 0 || v > INT32_MAX || (*end && *end != ',')) {
            free(ids);
            return -1;
        }
        if (n == cap) {
            int32_t *grown = realloc(ids, (cap *= 2) * sizeof *ids);
            if (!grown) {
                free(ids);
                return -1;
            }
            ids = grown;
        }
        ids[n++] = (int32_t)v;
        p = *end ? end + 1 : end;
    }
    *out = ids;
    return n;
}

static int add_message(struct run_opts *o, const char *spec)
{
    const char *colon = strchr(spec, ':');
    if (!colon || colon == spec || o->n_msgs == MAX_MESSAGES) return -1;
    o->msgs[o->n_msgs].role = strndup(spec, (size_t)(colon - spec));
    o->msgs[o->n_msgs].content = strdup(colon + 1);
    o->n_msgs++;
    return 0;
}

static int load_messages(struct run_opts *o, const char *path)
{
    json_error_t jerr;
    json_t *root = json_load_file(path, 0, &jerr);
    if (!root || !json_is_array(root)) {
        fprintf(stderr, "ferry: %s: %s\n", path, root ? "expected a JSON array of messages" : jerr.text);
        json_decref(root);
        return -1;
    }
    size_t i;
    json_t *m;
    json_array_foreach(root, i, m)
    {
        const char *role = json_string_value(json_object_get(m, "role"));
        const char *content = json_string_value(json_object_get(m, "content"));
        if (!role || !content || o->n_msgs == MAX_MESSAGES) {
            fprintf(stderr, "ferry: %s: message %zu needs string fields role and content\n", path, i);
            json_decref(root);
            return -1;
        }
        o->msgs[o->n_msgs].role = strdup(role);
        o->msgs[o->n_msgs].content = strdup(content);
        o->n_msgs++;
    }
    json_decref(root);
    return 0;
}

static int parse_args(int argc, char **argv, struct run_opts *o)
{
    enum {
        O_PROMPT_TOKENS = 256,
        O_MESSAGE,
        O_MESSAGES,
        O_CHAT_TEMPLATE,
        O_MAX_TOKENS,
        O_TEMP,
        O_TOP_K,
        O_TOP_P,
        O_MIN_P,
        O_REPEAT,
        O_PRESENCE,
        O_FREQUENCY,
        O_SEED,
        O_JSON,
        O_DUMP,
        O_THREADS,
        O_CTX,
        O_BOS,
        O_NO_BOS,
        O_IGNORE_EOS,
        O_LOG,
        O_QUANT,
        O_KV_TYPE,
        O_SWA_FULL,
        O_BACKEND,
        O_RAW,
        O_SYSTEM,
        O_SPEC_TYPE,
        O_SPEC_N_MAX,
        O_SPEC_N_MIN,
        O_SPEC_ADAPT,
        O_SPEC_P_MIN,
        O_MODEL_DRAFT,
        O_HF_REPO,
        O_GPUS
    };
    static const struct option longopts[] = {
        {"model", required_argument, 0, 'm'},
        {"prompt", required_argument, 0, 'p'},
        {"prompt-tokens", required_argument, 0, O_PROMPT_TOKENS},
        {"chat", no_argument, 0, 'c'},
        {"raw", no_argument, 0, O_RAW},
        {"system", required_argument, 0, O_SYSTEM},
        {"message", required_argument, 0, O_MESSAGE},
        {"messages", required_argument, 0, O_MESSAGES},
        {"chat-template", required_argument, 0, O_CHAT_TEMPLATE},
        {"max-tokens", required_argument, 0, O_MAX_TOKENS},
        {"temperature", required_argument, 0, O_TEMP},
        {"top-k", required_argument, 0, O_TOP_K},
        {"top-p", required_argument, 0, O_TOP_P},
        {"min-p", required_argument, 0, O_MIN_P},
        {"repeat-penalty", required_argument, 0, O_REPEAT},
        {"presence-penalty", required_argument, 0, O_PRESENCE},
        {"frequency-penalty", required_argument, 0, O_FREQUENCY},
        {"seed", required_argument, 0, O_SEED},
        {"json", no_argument, 0, O_JSON},
        {"dump-logits", required_argument, 0, O_DUMP},
        {"threads", required_argument, 0, O_THREADS},
        {"ctx-size", required_argument, 0, O_CTX},
        {"bos", no_argument, 0, O_BOS},
        {"no-bos", no_argument, 0, O_NO_BOS},
        {"ignore-eos", no_argument, 0, O_IGNORE_EOS},
        {"log-level", required_argument, 0, O_LOG},
        {"quant", required_argument, 0, O_QUANT},
        {"kv-type", required_argument, 0, O_KV_TYPE},
        {"swa-full", no_argument, 0, O_SWA_FULL},
        {"backend", required_argument, 0, O_BACKEND},
        {"spec-type", required_argument, 0, O_SPEC_TYPE},
        {"spec-draft-n-max", required_argument, 0, O_SPEC_N_MAX},
        {"spec-draft-n-min", required_argument, 0, O_SPEC_N_MIN},
        {"spec-draft-adapt", required_argument, 0, O_SPEC_ADAPT},
        {"spec-draft-p-min", required_argument, 0, O_SPEC_P_MIN},
        {"model-draft", required_argument, 0, O_MODEL_DRAFT},
        {"hf-repo", required_argument, 0, O_HF_REPO},
        {"gpus", required_argument, 0, O_GPUS},
        {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0},
    };
    o->model = getenv("FERRY_MODEL");
    o->max_tokens = 128;
    o->sp = sampler_default_params();
    o->sp.temperature = 0.0f; /* greedy: one prompt, one answer, the same every time */
    o->sp.top_k = 40;
    o->sp.top_p = 0.95f;
    o->sp.min_p = 0.05f;
    o->bos = -1;
    o->kv_type = KV_F16;
    o->log_level = LOG_LEVEL_WARN;
    int c, bad = 0, idx = -1, spec_on = -1, spec_n_max = 8;
    struct opt_gpus gpus = opt_gpus_default();
    char gerr[256] = "";
    optind = 1;
    while ((c = getopt_long(argc, argv, "m:p:ch", longopts, &idx)) != -1) {
        switch (c) {
        case 'm':
            o->model = optarg;
            break;
        case 'p':
            o->prompt = optarg;
            break;
        case O_PROMPT_TOKENS:
            o->prompt_tokens = optarg;
            break;
        case 'c':
            o->chat = 1;
            break;
        case O_RAW:
            o->raw = 1;
            break;
        case O_SYSTEM:
            o->system = optarg;
            break;
        case O_MESSAGE:
            o->chat = 1;
            if (add_message(o, optarg)) {
                fprintf(stderr, "ferry: --message wants ROLE:TEXT (at most %d messages)\n", MAX_MESSAGES);
                bad = 1;
            }
            break;
        case O_MESSAGES:
            o->chat = 1;
            o->messages_file = optarg;
            break;
        case O_CHAT_TEMPLATE:
            o->chat_template = optarg;
            break;
        case O_MAX_TOKENS:
            bad |= parse_int(optarg, 0, 1 << 20, &o->max_tokens) ? 1 : 0;
            break;
        case O_TEMP:
            bad |= parse_float(optarg, 0, 100, &o->sp.temperature) ? 1 : 0;
            break;
        case O_TOP_K:
            bad |= parse_int(optarg, 0, INT_MAX, &o->sp.top_k) ? 1 : 0;
            break;
        case O_TOP_P:
            bad |= parse_float(optarg, 1e-6f, 1, &o->sp.top_p) ? 1 : 0;
            break;
        case O_MIN_P:
            bad |= parse_float(optarg, 0, 1, &o->sp.min_p) ? 1 : 0;
            break;
        case O_REPEAT:
            bad |= parse_float(optarg, 1e-3f, 100, &o->sp.repetition_penalty) ? 1 : 0;
            break;
        case O_PRESENCE:
            bad |= parse_float(optarg, -2, 2, &o->sp.presence_penalty) ? 1 : 0;
            break;
        case O_FREQUENCY:
            bad |= parse_float(optarg, -2, 2, &o->sp.frequency_penalty) ? 1 : 0;
            break;
        case O_SEED: {
            char *end;
            errno = 0;
            o->sp.seed = strtoull(optarg, &end, 10);
            if (errno || end == optarg || *end) bad = 1;
            o->seed_given = 1;
            break;
        }
        case O_JSON:
            o->json = 1;
            break;
        case O_DUMP:
            o->dump_logits = optarg;
            break;
        case O_THREADS:
            bad |= parse_int(optarg, 0, 1024, &o->threads) ? 1 : 0;
            break;
        case O_CTX:
            bad |= parse_int(optarg, 1, 1 << 20, &o->ctx_size) ? 1 : 0;
            break;
        case O_BOS:
            o->bos = 1;
            break;
        case O_NO_BOS:
            o->bos = 0;
            break;
        case O_IGNORE_EOS:
            o->ignore_eos = 1;
            break;
        case O_LOG:
            if ((o->log_level = cli_log_level_parse(optarg)) < 0) bad = 1;
            break;
        case O_QUANT: {
            const int q = engine_quant_parse(optarg);
            if (q < 0)
                bad = 1;
            else
                o->quant = (enum engine_quant)q;
            break;
        }
        case O_KV_TYPE:
            if ((o->kv_type = engine_kv_type_parse(optarg)) < 0) bad = 1;
            break;
        case O_SWA_FULL:
            o->swa_full = 1;
            break;
        case O_HF_REPO:
            o->hf_repo = optarg;
            break;
        case O_GPUS:
            if (opt_gpus_parse(&gpus, optarg, gerr)) {
                fprintf(stderr, "ferry run: --gpus: %s\n", gerr);
                return -1;
            }
            break;
        case O_BACKEND:
            if (!strcmp(optarg, "auto"))
                o->backend = ENGINE_BACKEND_AUTO;
            else if (!strcmp(optarg, "cpu"))
                o->backend = ENGINE_BACKEND_CPU;
            else if (!strcmp(optarg, "cuda"))
                o->backend = ENGINE_BACKEND_CUDA;
            else
                bad = 1;
            break;
        case O_SPEC_TYPE:
            if (!strcmp(optarg, "none"))
                spec_on = 0;
            else if (!strcmp(optarg, "ngram"))
                spec_on = 1;
            else if (!strcmp(optarg, "draft"))
                spec_on = 2;
            else if (!strcmp(optarg, "mtp"))
                spec_on = 3;
            else
                bad = 1;
            break;
        case O_MODEL_DRAFT:
            o->model_draft = optarg;
            break;
        case O_SPEC_N_MAX:
            bad |= parse_int(optarg, 1, SPEC_MAX_DRAFT, &spec_n_max) ? 1 : 0;
            break;
        case O_SPEC_ADAPT:
            if (!strcmp(optarg, "0") || !strcmp(optarg, "false"))
                o->spec_fixed = 1;
            else if (!strcmp(optarg, "1") || !strcmp(optarg, "true"))
                o->spec_fixed = 0;
            else
                bad = 1;
            break;
        case O_SPEC_N_MIN:
            bad |= parse_int(optarg, 0, SPEC_MAX_DRAFT, &o->spec_n_min) ? 1 : 0;
            break;
        case O_SPEC_P_MIN:
            bad |= parse_float(optarg, 0, 1, &o->spec_p_min) ? 1 : 0;
            break;
        case 'h':
            run_usage(stdout);
            exit(0);
        default:
            bad = 1;
        }
        if (bad) {
            if (c != '?' && optarg)
                fprintf(stderr, "ferry run: invalid value '%s' for --%s\n", optarg,
                        idx >= 0   ? longopts[idx].name
                        : c == 'm' ? "model"
                                   : "prompt");
            return -1;
        }
        idx = -1;
    }
    if (opt_gpus_single(&gpus, gerr)) {
        fprintf(stderr, "ferry run: %s\n", gerr);
        return -1;
    }
    if (spec_on < 0) spec_on = o->model_draft ? 2 : 0;
    if ((spec_on == 2) != !!o->model_draft) {
        fprintf(stderr, "ferry run: --spec-type draft and --model-draft go together\n");
        return -1;
    }
    o->spec_n_max = spec_on ? spec_n_max : 0;
    o->spec_mtp = spec_on == 3;
    if (optind < argc) {
        fprintf(stderr, "ferry run: unexpected argument '%s'\n", argv[optind]);
        return -1;
    }
    if (o->hf_repo && o->model && !getenv("FERRY_MODEL")) {
        fprintf(stderr, "ferry run: give --model or --hf-repo, not both\n");
        return -1;
    }
    if (o->hf_repo) {
        if (cli_pull_model(o->hf_repo, o->pulled, sizeof o->pulled)) return -1;
        o->model = o->pulled;
    }
    if (!o->model) {
        fprintf(stderr, "ferry run: --model (or --hf-repo) is required\n");
        return -1;
    }
    int n_src = !!o->prompt + !!o->prompt_tokens + !!o->chat;
    if (n_src != 1) {
        fprintf(stderr, "ferry run: give exactly one of --prompt, --prompt-tokens, --chat/--message%s\n",
                n_src ? "" : " (for an interactive chat: ferry chat -m MODEL)");
        return -1;
    }
    if (o->messages_file && load_messages(o, o->messages_file)) return -1;
    if (o->raw && !o->prompt) {
        fprintf(stderr, "ferry run: --raw goes with --prompt\n");
        return -1;
    }
    if (o->system && !o->prompt) {
        fprintf(stderr, "ferry run: --system goes with --prompt (or give --message system:TEXT)\n");
        return -1;
    }
    if (o->chat && o->n_msgs == 0) {
        fprintf(stderr, "ferry run: --chat needs --message ROLE:TEXT or --messages FILE\n");
        return -1;
    }
    if (!o->seed_given) o->sp.seed = (uint64_t)time(NULL) ^ ((uint64_t)clock() << 32);
    return 0;
}

/* Tokenizes the prompt according to the options. */
static int build_prompt(const struct run_opts *o, const struct model_file *mf, const struct tokenizer *tok,
                        int32_t **ids, int *n_ids)
{
    if (o->prompt_tokens) {
        *n_ids = parse_ids(o->prompt_tokens, ids);
        if (*n_ids <= 0) {
            fprintf(stderr, "ferry run: --prompt-tokens wants comma-separated non-negative ids\n");
            return -1;
        }
        return 0;
    }
    char *rendered = NULL;
    const char *text = o->prompt;
    size_t len = text ? strlen(text) : 0;
    int parse_special = 0;
    if (o->chat) {
        const char *tmpl = o->chat_template ? chat_template_builtin(o->chat_template) : mf->chat_template;
        if (!tmpl) {
            fprintf(stderr,
                    "ferry run: %s; pass --chat-template NAME (chatml, llama2, llama3, mistral, gemma, "
                    "phi3, zephyr)\n",
                    o->chat_template ? "unknown chat template name" : "the model has no chat template");
            return -1;
        }
        int32_t bos = tokenizer_bos(tok), eos = tokenizer_eos(tok);
        const char *bos_s = bos >= 0 ? tokenizer_token_str(tok, bos) : "";
        const char *eos_s = eos >= 0 ? tokenizer_token_str(tok, eos) : "";
        char err[256] = "";
        int rc = chat_template_render(tmpl, o->msgs, o->n_msgs, 1, bos_s ? bos_s : "", eos_s ? eos_s : "",
                                      &rendered, &len, err);
        if (rc) {
            fprintf(stderr, "ferry run: chat template: %s\n", err);
            return -1;
        }
        text = rendered;
        parse_special = 1;
    }
    int add_bos = o->bos >= 0 ? o->bos : tokenizer_add_bos(tok);
    if (o->chat && add_bos && tokenizer_bos(tok) >= 0) {
        /* Templates that write the BOS text themselves must not get a second one. */
        const char *bos_s = tokenizer_token_str(tok, tokenizer_bos(tok));
        if (bos_s && *bos_s && !strncmp(text, bos_s, strlen(bos_s))) add_bos = 0;
    }
    int cap = (int)(len + 16 < INT_MAX / 4 ? len + 16 : INT_MAX / 4);
    *ids = malloc((size_t)cap * sizeof **ids);
    int n = *ids ? tokenizer_encode(tok, text, len, add_bos, parse_special, *ids, cap) : FERRY_ERR_NOMEM;
    free(rendered);
    if (n < 0 || n > cap) {
        fprintf(stderr, "ferry run: cannot tokenize the prompt: %s\n",
                ferry_status_str(n < 0 ? n : FERRY_ERR_INTERNAL));
        return -1;
    }
    *n_ids = n;
    return 0;
}

/* Appends bytes to a growing buffer. */
static int buf_append(char **buf, size_t *len, size_t *cap, const char *s, size_t n)
{
    if (*len + n + 1 > *cap) {
        size_t nc = (*cap ? *cap * 2 : 256) + n;
        char *g = realloc(*buf, nc);
        if (!g) return -1;
        *buf = g;
        *cap = nc;
    }
    memcpy(*buf + *len, s, n);
    *len += n;
    (*buf)[*len] = 0;
    return 0;
}

/* What a draw of `ferry run` updates: the output pipeline, the text shown, the tokens generated. */
struct run_draw {
    struct seq_output *so;
    const struct run_opts *o;
    char **text;
    size_t *text_len, *text_cap;
    int32_t *gen;
    int *n_gen;
};

/* spec_draw_fn: samples the row through the output pipeline and shows the text it releases; -1 when the
 * output ends (an end-of-generation token is not kept; the token that hit a stop or the length is). */
static int32_t run_draw_row(void *arg, float *row)
{
    struct run_draw *d = arg;
    struct seq_output *so = d->so;
    int32_t t = seq_output_step(so, row, NULL);
    if (so->release) { /* the text so far, flushed at the end (an end-of-generation token included) */
        buf_append(d->text, d->text_len, d->text_cap, so->hold, so->release);
        if (!d->o->json) {
            fwrite(so->hold, 1, so->release, stdout);
            fflush(stdout);
        }
        seq_output_take(so, so->release);
    }
    if (so->eog) return -1;
    d->gen[(*d->n_gen)++] = t;
    return so->fin ? -1 : t;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* --spec-type mtp: the model's block on a CPU engine, and the buffer of hidden states its steps give. */
static int run_mtp_init(const struct run_opts *o, const struct model_file *mf, struct engine *eng,
                        struct mtp **mtp, float **hid)
{
    char err[256];
    struct engine_stats st;
    engine_get_stats(eng, &st);
    if (strcmp(st.backend, "cpu") != 0) {
        fprintf(stderr, "ferry run: --spec-type mtp runs on the CPU backend only (give --backend cpu)\n");
        return FERRY_ERR_UNSUPPORTED;
    }
    struct mtp_params mp = mtp_default_params();
    mp.ctx_size = engine_ctx_size(eng);
    mp.max_tokens = 512;
    mp.n_threads = o->threads;
    mp.kv_type = o->kv_type;
    int rc = mtp_init(mtp, mf, &mp, err);
    if (rc) {
        fprintf(stderr, "ferry run: --spec-type mtp: %s (%s)\n", err, ferry_status_str(rc));
        return rc;
    }
    const int rows = 512 > SPEC_MAX_DRAFT + 1 ? 512 : SPEC_MAX_DRAFT + 1;
    *hid = malloc((size_t)rows * engine_hparams(eng)->dim * sizeof **hid);
    if (!*hid) {
        fprintf(stderr, "ferry run: out of memory\n");
        return FERRY_ERR_NOMEM;
    }
    return FERRY_OK;
}

/* After the walk of a step at pos (pending, then k drafts, n_acc accepted): the engine keeps the accepted
 * positions (spec_keep) and the MTP block, when drafting, takes them with their hidden states hid. */
static int run_spec_keep(struct engine *eng, struct mtp *mtp, int32_t pending, int pos, const int32_t *draft,
                         int k, int n_acc, float *hid)
{
    int rc = spec_keep(eng, 0, pending, pos, draft, k, n_acc, hid);
    if (rc || !mtp) return rc;
    int32_t rows[SPEC_MAX_DRAFT + 1];
    rows[0] = pending;
    memcpy(rows + 1, draft, (size_t)n_acc * sizeof *rows);
    mtp_seq_keep(mtp, 0, pos);
    return mtp_seq_feed(mtp, 0, pos, rows, n_acc + 1, hid);
}

int cli_run_main(int argc, char **argv)
{
    struct run_opts o = {0};
    if (parse_args(argc, argv, &o)) {
        fprintf(stderr, "(see ferry run --help)\n");
        return 2;
    }
    cli_log_init(o.log_level);
    int status = 1;
    struct model_file *mf = NULL;
    struct tokenizer *tok = NULL;
    struct engine *eng = NULL;
    struct draft_model *dm = NULL;
    struct mtp *mtp = NULL;
    float *hid = NULL; /* (512 or more rows, dim) the model's hidden states for the MTP block */
    struct model_file *mf_draft = NULL;
    struct seq_vocab *voc = NULL;
    struct seq_output so = {0};
    int32_t *prompt = NULL, *gen = NULL;
    float *logits = NULL;
    char *text = NULL;
    size_t text_len = 0, text_cap = 0;
    char err[256] = "";
    int n_prompt = 0, n_gen = 0;

    char arch_err[512];
    if (gpu_arch_check(o.backend == ENGINE_BACKEND_CPU ? "cpu" : "auto", arch_err)) {
        fprintf(stderr, "ferry run: %s\n", arch_err);
        goto out;
    }
    if (cli_open_model(o.model, &mf)) goto out;
    int rc = tokenizer_init(&tok, mf, err);
    if (rc) {
        tok = NULL;
        if (!o.prompt_tokens) {
            fprintf(stderr, "ferry run: this model's tokenizer cannot be loaded (%s): use --prompt-tokens\n",
                    err);
            goto out;
        }
    }
    if (o.prompt && !o.raw && tok && (o.chat_template || mf->chat_template)) {
        /* a chat model: the prompt is the user's message (what a user typing a question means) */
        if (o.system) {
            o.msgs[o.n_msgs].role = strdup("system");
            o.msgs[o.n_msgs++].content = strdup(o.system);
        }
        o.msgs[o.n_msgs].role = strdup("user");
        o.msgs[o.n_msgs++].content = strdup(o.prompt);
        o.chat = 1;
        o.prompt = NULL;
        if (!o.json)
            fprintf(stderr,
                    "ferry run: chatting through the model's chat template (--raw: plain completion)\n");
    } else if (o.system) {
        fprintf(stderr,
                "ferry run: --system needs a chat template (the model has none; give --chat-template)\n");
        goto out;
    }
    if (build_prompt(&o, mf, tok, &prompt, &n_prompt)) goto out;

    struct engine_params ep = engine_default_params();
    ep.n_threads = o.threads;
    ep.ctx_size = o.ctx_size;
    ep.n_seqs = 1;
    ep.quant = o.quant;
    ep.kv_type = o.kv_type;
    ep.swa_full = o.swa_full;
    ep.backend = o.backend;
    if (o.model_draft) {
        /* The draft model first, with a GPU budget of its own bytes and room for its KV and activations;
         * the model then takes what the device has left. */
        if (cli_open_model(o.model_draft, &mf_draft)) goto out;
        struct engine_params dp = ep;
        dp.gpu_memory = (int64_t)mf_draft->file_bytes + ((int64_t)512 << 20);
        dp.max_batch_tokens = 512;
        if ((rc = draft_model_init(&dm, mf_draft, &dp, mf->hp.n_vocab, err))) {
            fprintf(stderr, "ferry run: --model-draft: %s (%s)\n", err, ferry_status_str(rc));
            goto out;
        }
    }
    if ((rc = engine_init(&eng, mf, &ep, err))) {
        fprintf(stderr, "ferry run: %s (%s)\n", err, ferry_status_str(rc));
        goto out;
    }
    const int n_vocab = engine_hparams(eng)->n_vocab, ctx = engine_ctx_size(eng);
    if (o.spec_mtp && (rc = run_mtp_init(&o, mf, eng, &mtp, &hid))) goto out;
    for (int i = 0; i < n_prompt; i++)
        if (prompt[i] < 0 || prompt[i] >= n_vocab) {
            fprintf(stderr, "ferry run: prompt token %d at index %d is outside the vocabulary (%d)\n",
                    prompt[i], i, n_vocab);
            goto out;
        }
    if (n_prompt >= ctx) {
        fprintf(stderr, "ferry run: the prompt has %d tokens; the context holds %d\n", n_prompt, ctx);
        goto out;
    }
    if (o.max_tokens > ctx - n_prompt) o.max_tokens = ctx - n_prompt;
    if (seq_vocab_init(&voc, tok, n_vocab, 0)) {
        fprintf(stderr, "ferry run: out of memory\n");
        goto out;
    }
    /* the server's output pipeline: sampling, end of generation, detokenization (no stops, no grammar) */
    const struct seq_output_params op = {
        .logprobs = -1,
        .ignore_eos = o.ignore_eos,
        .max_tokens = o.max_tokens,
        .n_prompt = n_prompt,
        .ctx = ctx,
    };
    if ((rc = seq_output_init(&so, voc, &op, &o.sp))) {
        fprintf(stderr, "ferry run: %s\n",
                rc == FERRY_ERR_NOMEM ? "out of memory" : "invalid sampling parameters");
        goto out;
    }
    const int max_rows = 1 + o.spec_n_max; /* a verification step's rows: the pending token and the drafts */
    logits = malloc((size_t)max_rows * n_vocab * sizeof *logits);
    gen = malloc(((size_t)o.max_tokens + 1) * sizeof *gen);
    int32_t *hist = malloc(((size_t)n_prompt + o.max_tokens + 1) * sizeof *hist);
    int32_t *bt = malloc(512 * 3 * sizeof(int32_t));
    uint8_t *want = malloc(512);
    if (!logits || !gen || !hist || !bt || !want) {
        free(bt);
        free(want);
        free(hist);
        fprintf(stderr, "ferry run: out of memory\n");
        goto out;
    }
    memcpy(hist, prompt, (size_t)n_prompt * sizeof *hist);

    /* Prefill in chunks of the engine's batch size; logits only for the last prompt position. */
    double t0 = now_s();
    struct batch b = {
        .tokens = bt, .pos = bt + 512, .seq = bt + 1024, .want_logits = want, .hidden_out = hid};
    for (int start = 0; start < n_prompt && !rc; start += 512) {
        int n = n_prompt - start < 512 ? n_prompt - start : 512;
        for (int i = 0; i < n; i++) {
            bt[i] = prompt[start + i];
            b.pos[i] = start + i;
            b.seq[i] = 0;
            want[i] = start + i == n_prompt - 1;
        }
        b.n_tokens = n;
        rc = engine_step(eng, &b, logits);
        if (!rc && mtp) rc = mtp_seq_feed(mtp, 0, start, bt, n, hid);
    }
    double t1 = now_s();
    free(bt);
    free(want);
    if (rc) {
        fprintf(stderr, "ferry run: forward pass failed: %s\n", ferry_status_str(rc));
        free(hist);
        goto out;
    }
    if (o.dump_logits) {
        FILE *f = fopen(o.dump_logits, "wb");
        if (!f || fwrite(logits, sizeof(float), (size_t)n_vocab, f) != (size_t)n_vocab || fclose(f)) {
            fprintf(stderr, "ferry run: cannot write %s: %s\n", o.dump_logits, strerror(errno));
            free(hist);
            goto out;
        }
    }
    seq_output_accept(&so, prompt, n_prompt); /* the prompt counts for repetition penalties */

    /* Each step's rows are drawn in order (runtime/spec.h): the first row after the prompt, then the pending
     * token's row and those of the drafts, until a draw differs from its draft. */
    struct run_draw rd = {.so = &so,
                          .o = &o,
                          .text = &text,
                          .text_len = &text_len,
                          .text_cap = &text_cap,
                          .gen = gen,
                          .n_gen = &n_gen};
    int32_t draft[SPEC_MAX_DRAFT], drawn[SPEC_MAX_DRAFT + 1];
    int nd = 0, ended = 0, step_pos = -1;
    int32_t step_pending = 0;
    uint64_t n_steps = 0, n_drafted = 0, n_accepted = 0;
    struct sched_spec_cost cost = {0}; /* the draft length: what steps cost by rows, what is accepted */
    struct sched_spec_accept acc = sched_spec_accept_new(dm    ? SCHED_SPEC_MODEL
                                                         : mtp ? SCHED_SPEC_MTP
                                                               : SCHED_SPEC_NGRAM);
    n_gen = 0;
    while (!ended && n_gen < o.max_tokens) {
        int m = spec_walk(logits, n_vocab, draft, nd, run_draw_row, &rd, drawn, &ended);
        n_accepted += (uint64_t)(m - 1);
        sched_spec_accept_note(&acc, nd, m - 1);
        if (ended || n_gen >= o.max_tokens) break;
        /* The pending token sits at pos; the positions past it that held rejected drafts go (a recurrent
         * state goes back to where the step began and runs the accepted rows again); the MTP block takes
         * the kept rows with their hidden states. */
        const int pos = n_prompt + n_gen - 1;
        if (step_pos >= 0 && (rc = run_spec_keep(eng, mtp, step_pending, step_pos, draft, nd, m - 1, hid))) {
            fprintf(stderr, "\nferry run: forward pass failed: %s\n", ferry_status_str(rc));
            break;
        }
        memcpy(hist + n_prompt, gen, (size_t)n_gen * sizeof *hist);
        int k = o.spec_n_max < o.max_tokens - n_gen - 1 ? o.spec_n_max : o.max_tokens - n_gen - 1;
        const double alpha = sched_spec_accept_rate(&acc);
        if (!o.spec_fixed) k = sched_policy_spec_pick(&cost, 1, &alpha, 1, k);
        nd = 0;
        const double t_draft = now_s();
        if (k > 0 && dm) {
            const int32_t *h = hist;
            const int nh = n_prompt + n_gen, s0 = 0;
            int32_t *dout = draft;
            if ((rc = draft_model_propose(dm, 1, &s0, &h, &nh, &k, &o.spec_p_min, &dout, &nd))) {
                fprintf(stderr, "\nferry run: the draft model failed: %s\n", ferry_status_str(rc));
                break;
            }
        } else if (k > 0 && mtp) {
            if ((rc = mtp_draft(mtp, 0, gen[n_gen - 1], k, o.spec_p_min, draft, &nd, NULL))) {
                fprintf(stderr, "\nferry run: the multi-token-prediction block failed: %s\n",
                        ferry_status_str(rc));
                break;
            }
        } else if (k > 0) {
            nd = spec_ngram_draft(hist, n_prompt + n_gen, SPEC_NGRAM_MIN, SPEC_NGRAM_MAX, k, draft);
        }
        if ((dm || mtp) && n_steps > 0) /* the first proposal reads the prompt */
            sched_spec_cost_draft_note(&cost, k, now_s() - t_draft);
        if (nd < o.spec_n_min) nd = 0;
        n_drafted += (uint64_t)nd;
        n_steps++;
        const double t_step = now_s();
        step_pending = gen[n_gen - 1], step_pos = pos;
        if ((rc = spec_step_hidden(eng, 0, step_pending, pos, draft, nd, logits, hid))) {
            fprintf(stderr, "\nferry run: forward pass failed: %s\n", ferry_status_str(rc));
            break;
        }
        sched_spec_cost_note(&cost, 1 + nd, now_s() - t_step);
    }
    double t2 = now_s();
    free(hist);
    if (rc) goto out;

    if (o.json) {
        json_t *root = json_object(), *pt = json_array(), *gt = json_array();
        for (int i = 0; i < n_prompt; i++) json_array_append_new(pt, json_integer(prompt[i]));
        for (int i = 0; i < n_gen; i++) json_array_append_new(gt, json_integer(gen[i]));
        json_object_set_new(root, "prompt_tokens", pt);
        json_object_set_new(root, "tokens", gt);
        /* Byte tokens can split a character: invalid bytes become U+FFFD (jansson only takes valid UTF-8). */
        char *clean = tok ? utf8_sanitize(text ? text : "", text_len, NULL) : NULL;
        json_object_set_new(root, "text", clean ? json_string(clean) : json_null());
        free(clean);
        json_object_set_new(root, "seed", json_integer((json_int_t)o.sp.seed));
        char *s = json_dumps(root, JSON_COMPACT);
        if (s) puts(s);
        free(s);
        json_decref(root);
    } else {
        putchar('\n');
        fflush(stdout);
    }
    fprintf(
        stderr,
        "ferry run: prompt %d tokens in %.3f s (%.1f tok/s), generated %d tokens in %.3f s (%.1f tok/s)\n",
        n_prompt, t1 - t0, n_prompt / (t1 - t0 + 1e-9), n_gen, t2 - t1,
        n_gen > 1 ? (n_gen - 1) / (t2 - t1 + 1e-9) : 0.0);
    if (o.spec_n_max)
        fprintf(stderr, "ferry run: speculative: %llu steps, %llu drafted, %llu accepted (%.0f%%)\n",
                (unsigned long long)n_steps, (unsigned long long)n_drafted, (unsigned long long)n_accepted,
                n_drafted ? 100.0 * (double)n_accepted / (double)n_drafted : 0.0);
    status = 0;
out:
    free(text);
    free(logits);
    free(gen);
    free(prompt);
    seq_output_free(&so);
    seq_vocab_free(voc);
    mtp_free(mtp);
    free(hid);
    engine_free(eng);
    draft_model_free(dm);
    tokenizer_free(tok);
    model_file_close(mf);
    model_file_close(mf_draft);
    for (int i = 0; i < o.n_msgs; i++) {
        free((char *)o.msgs[i].role);
        free((char *)o.msgs[i].content);
    }
    return status;
}
