/* options — the server's option table and the one parser that reads it from the environment and argv.
 *
 * Each row names the option, its type, bounds and default (as text, parsed through the same path as user
 * input, so --help shows exactly what is applied). Environment first, argv second: the last word wins.
 */
#include "server/options.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "kernels/core/log.h"
#include "kernels/core/status.h"

/* OPT_SIZES: a size (as OPT_SIZE, into the int64_t at off) or a comma list of sizes, every one recorded in
 * struct opt_gpus; OPT_GPUS: a list of device ordinals into struct opt_gpus. */
enum opt_type {
    OPT_STR,
    OPT_INT,
    OPT_I64,
    OPT_SIZE,
    OPT_BOOL,
    OPT_KEYS,
    OPT_ENUM,
    OPT_REAL,
    OPT_SIZES,
    OPT_GPUS
};

struct opt_row {
    const char *name; /* long option without dashes; env var is FERRY_<NAME> */
    enum opt_type type;
    size_t off;          /* offset into struct serve_options */
    int64_t lo, hi;      /* bounds for numbers */
    const char *def;     /* default as text, NULL = unset */
    const char *choices; /* OPT_ENUM: "a|b|c" */
    const char *help;
};

#define OFF(f) offsetof(struct serve_options, f)

static const struct opt_row rows[] = {
    {"model", OPT_STR, OFF(model), 0, 0, NULL, NULL, "GGUF file or Hugging Face directory (required)"},
    {"host", OPT_STR, OFF(host), 0, 0, "127.0.0.1", NULL, "address to bind"},
    {"port", OPT_INT, OFF(port), 0, 65535, "8080", NULL, "TCP port (0 = any free port, logged)"},
    {"api-key", OPT_KEYS, OFF(api_keys), 0, 0, NULL, NULL,
     "accepted bearer key (repeatable; env: one key); none = no auth. A key given here is visible to "
     "every local user in the process list (ps): prefer --api-key-file or the environment variable"},
    {"api-key-file", OPT_STR, OFF(api_key_file), 0, 0, NULL, NULL,
     "file with one key per line ('#' comments; keeps the keys out of the process list: make it readable "
     "by the server's user only)"},
    {"ctx-size", OPT_INT, OFF(ctx_size), 0, 1 << 20, "0", NULL,
     "positions per sequence (0 = min(model's, 4096))"},
    {"kv-tokens", OPT_INT, OFF(kv_tokens), 0, 1 << 30, "0", NULL,
     "KV cache positions over all sequences (0 = parallel x ctx-size, on a GPU sized to the budget with any "
     "excess in host memory); admission reserves prompt + max_tokens"},
    {"backend", OPT_ENUM, OFF(backend), 0, 0, "auto", "auto|cpu|cuda",
     "compute backend (auto = CUDA when built and a GPU is present)"},
    {"parallel", OPT_INT, OFF(parallel), 1, 1024, "4", NULL, "sequences decoded at once (slots)"},
    {"max-batch-tokens", OPT_INT, OFF(max_batch_tokens), 1, 1 << 20, "512", NULL,
     "tokens per engine step (decode + prefill chunks)"},
    {"prefill-budget", OPT_INT, OFF(prefill_budget), 0, 1 << 20, "0", NULL,
     "prompt tokens one step may take beside the decode rows (bounds the inter-token latency of running "
     "sequences while prompts arrive; 0 = --max-batch-tokens minus the decode rows)"},
    {"gpu-sampling", OPT_BOOL, OFF(gpu_sampling), 0, 1, "1", NULL,
     "draw tokens on the GPU where the logits are (CUDA backend): only the ids and the logprobs asked for "
     "cross PCIe; false samples every row on the host"},
    {"overlap", OPT_BOOL, OFF(overlap), 0, 1, "1", NULL,
     "while the GPU draws, begin the next decode step before the last one's tokens are published (the "
     "device runs while the host detokenizes and writes); false runs one step at a time"},
    {"prompt-cache", OPT_BOOL, OFF(prompt_cache), 0, 1, "1", NULL,
     "a finished sequence's KV stays in its slot; a prompt starting with the same tokens continues from it"},
    {"ctx-checkpoints", OPT_INT, OFF(ctx_checkpoints), 0, 4096, "32", NULL,
     "models with recurrent (gated DeltaNet) layers: copies of a slot's state kept where each prefill step "
     "ends (chunk boundaries of long prompts, 4 positions before each prompt's end and at it), as many a "
     "slot, the oldest dropped; the prompt cache continues a prompt from the latest one within its shared "
     "start. Each is the size of a slot's state, in host memory (ferry inspect shows it); 0 = none"},
    {"checkpoint-min-step", OPT_INT, OFF(checkpoint_min_step), 0, 1 << 30, "8192", NULL,
     "a slot with all its --ctx-checkpoints first drops one closer than this many positions to the one "
     "before it (keeping far-apart ones over a long conversation), else the oldest; 0 = always the oldest"},
    {"spec-type", OPT_ENUM, OFF(spec_type), 0, 0, "none", "none|ngram|draft|mtp",
     "speculative decoding: drafted tokens are verified in one step with a sequence's next token, and "
     "outputs are unchanged. ngram drafts continuations found earlier in the sequence's prompt and output "
     "(prompt lookup: answers that quote their prompt, code edits, RAG); draft asks --model-draft; mtp the "
     "model's own multi-token-prediction block (CPU backend). Pays most for one or few sequences, "
     "above all with layers in host memory"},
    {"model-draft", OPT_STR, OFF(model_draft), 0, 0, NULL, NULL,
     "a smaller model with the same vocabulary that drafts for --spec-type draft (implied by this option); "
     "on a GPU its bytes come out of --gpu-memory"},
    {"spec-draft-n-max", OPT_INT, OFF(spec_draft_n_max), 1, 32, "8", NULL,
     "tokens one sequence drafts a step at most (fewer when many sequences decode together)"},
    {"spec-draft-adapt", OPT_BOOL, OFF(spec_draft_adapt), 0, 1, "1", NULL,
     "the draft length follows how often drafts are accepted and what extra rows cost as measured (none "
     "where they cost more than they bring); false: always --spec-draft-n-max"},
    {"spec-draft-n-min", OPT_INT, OFF(spec_draft_n_min), 0, 32, "0", NULL,
     "a draft shorter than this is not verified (the step goes without it)"},
    {"spec-draft-p-min", OPT_REAL, OFF(spec_draft_p_min), 0, 1, "0", NULL,
     "--model-draft stops a draft at a token it gives less than this probability (0: always k tokens)"},
    {"threads", OPT_INT, OFF(threads), 0, 4096, "0", NULL, "CPU threads (0 = online cores)"},
    {"max-queue", OPT_INT, OFF(max_queue), 0, 1 << 20, "64", NULL,
     "sequences waiting for a slot before 503 + Retry-After"},
    {"queue-timeout", OPT_INT, OFF(queue_timeout), 0, 86400 * 7, "120", NULL,
     "seconds a request may wait for its first slot; then 503 + Retry-After (0 = as long as --timeout)"},
    {"fair-share", OPT_BOOL, OFF(fair_share), 0, 1, "1", NULL,
     "share the slots between clients (an API key, else an address) while others wait: a client holding more "
     "than its share gives a slot up (an embedding input starts over, a generation is recomputed); a stream "
     "whose client stops reading pauses and gives its slot to anyone waiting either way"},
    {"body-limit", OPT_SIZE, OFF(body_limit), 1024, (int64_t)1 << 30, "1MiB", NULL,
     "largest request body (413 above)"},
    {"timeout", OPT_INT, OFF(timeout), 0, 86400 * 7, "600", NULL,
     "seconds a request may take, queue included (0 = none)"},
    {"conn-timeout", OPT_INT, OFF(conn_timeout), 1, 86400, "30", NULL,
     "seconds a connection may stay silent (between requests or mid-request) or leave its answer unread"},
    {"header-timeout", OPT_INT, OFF(header_timeout), 1, 3600, "10", NULL,
     "seconds for a whole request head, from its first byte (a new connection's: from the accept); 408 "
     "after"},
    {"body-timeout", OPT_INT, OFF(body_timeout), 1, 86400, "60", NULL,
     "seconds for a whole request body, from the end of its head; 408 after"},
    {"max-connections", OPT_INT, OFF(max_connections), 1, 1 << 20, "4096", NULL,
     "open connections; past it a new one is answered 503 + Retry-After (kept within the open-file limit)"},
    {"max-connections-per-ip", OPT_INT, OFF(max_connections_per_ip), 0, 1 << 20, "256", NULL,
     "open connections from one address, 0 = no limit (behind a reverse proxy all come from the proxy)"},
    {"allowed-hosts", OPT_STR, OFF(allowed_hosts), 0, 0, NULL, NULL,
     "without an API key, Host names accepted besides localhost and IP literals (DNS-rebinding guard): "
     "comma-separated names, .suffix for a domain, * for any"},
    {"shutdown-timeout", OPT_INT, OFF(shutdown_timeout), 0, 86400, "10", NULL,
     "seconds to finish in-flight requests on SIGTERM/SIGINT before cutting them"},
    {"cors-origin", OPT_STR, OFF(cors_origin), 0, 0, NULL, NULL,
     "Access-Control-Allow-Origin value (e.g. * ); unset = no CORS headers"},
    {"chat-template", OPT_STR, OFF(chat_template), 0, 0, NULL, NULL,
     "builtin template name (chatml, llama2, llama3, mistral, gemma, phi3, zephyr) over the model's"},
    {"chat-template-file", OPT_STR, OFF(chat_template_file), 0, 0, NULL, NULL,
     "a Jinja chat template file used over the model's (and over --chat-template)"},
    {"pooling", OPT_ENUM, OFF(pooling), 0, 0, "mean", "mean|last",
     "/v1/embeddings: mean of the final hidden states of the input's positions, or the last position's"},
    {"reasoning-format", OPT_ENUM, OFF(reasoning_format), 0, 0, "auto", "auto|none",
     "auto: a <think> block at the start of a chat answer goes to reasoning_content; none: left in content"},
    {"public-health", OPT_BOOL, OFF(public_health), 0, 1, "0", NULL, "/health and /metrics need no API key"},
    {"log-level", OPT_ENUM, OFF(log_level), 0, 0, "info", "error|warn|info|debug", "log verbosity"},
    {"served-model-name", OPT_STR, OFF(served_model_name), 0, 0, NULL, NULL,
     "model id in the API (default: file name of --model)"},
    {"hf-repo", OPT_STR, OFF(hf_repo), 0, 0, NULL, NULL,
     "OWNER/REPO[:QUANT]: download the model from a Hugging Face hub into the cache (as ferry pull), then "
     "serve it"},
    {"any-model", OPT_BOOL, OFF(any_model), 0, 1, "0", NULL,
     "accept any \"model\" in requests (clients with a hard-coded name) instead of answering 404"},
    {"seed", OPT_I64, OFF(seed), -1, INT64_MAX, "-1", NULL,
     "seed for requests without one (-1 = random per request)"},
    {"gpus", OPT_GPUS, OFF(gpus), 0, 0, "0", NULL,
     "CUDA devices by ordinal, comma-separated (e.g. 0,1); default one device, the first. Running across "
     "several GPUs is not implemented yet: serve refuses more than one, and `ferry inspect --gpus 0,1 "
     "--gpu-memory 20GiB,12GiB` shows how they would be planned (layers, experts and KV split by budget). "
     "For one GPU other than the first, start ferry with CUDA_VISIBLE_DEVICES=N"},
    {"gpu-memory", OPT_SIZES, OFF(gpu_memory), 0, INT64_MAX, "0", NULL,
     "GPU memory budget (CUDA backend; 0 = free VRAM minus --reserve-vram); a comma list gives one per "
     "device of --gpus (20GiB,12GiB)"},
    {"reserve-vram", OPT_SIZE, OFF(reserve_vram), 0, INT64_MAX, "1GiB", NULL,
     "VRAM left free when --gpu-memory is 0 (CUDA backend)"},
    {"gpu-layers", OPT_INT, OFF(gpu_layers), -1, 1 << 16, "-1", NULL,
     "layers resident on the GPU, the rest streamed (-1 = as many as fit; CUDA backend)"},
    {"cpu-moe", OPT_INT, OFF(cpu_moe), -1, 1 << 16, "-1", NULL,
     "expert models: the experts of the first N layers stay in host memory (the host's cores compute them, "
     "or long steps copy the chosen ones to the GPU; -1 = as few as the budget needs; CUDA backend)"},
    {"expert-cache", OPT_SIZE, OFF(expert_cache), -1, INT64_MAX, "0", NULL,
     "expert models: device memory for a cache of the host layers' most used experts, taken before more "
     "layers' experts stay on the GPU (auto = what the budget leaves after the resident parts and the KV "
     "cache when --cpu-moe is -1; 0 = none, the default: with evenly spread routing the cache's fetches "
     "made one sequence's steps slower; CUDA backend)"},
    {"ring-layers", OPT_INT, OFF(ring_layers), 0, 1 << 16, "0", NULL,
     "the streaming ring's size in the largest streamed layers (0 = the planner's choice: two of the largest "
     "pieces, grown with what the resident layers leave up to two layers; CUDA backend)"},
    {"placement", OPT_ENUM, OFF(placement), 0, 0, "auto", "auto|stream|cpu",
     "layers that do not fit on the GPU: auto (per step size, streamed or computed by the host's cores, "
     "whichever is predicted faster), stream, cpu (CUDA backend)"},
    {"cpu-threads", OPT_INT, OFF(cpu_threads), 0, 4096, "0", NULL,
     "pinned host threads computing host layers beside the GPU (0 = --threads)"},
    {"cpu-arith", OPT_ENUM, OFF(cpu_arith), 0, 0, "auto", "auto|f32|int8",
     "CPU products with quantized weights: activations in f32 (closest to the reference) or quantized to "
     "int8 "
     "blocks as llama.cpp does (faster, slightly different outputs); auto: int8 for the host layers of a GPU "
     "engine (whose own products with such weights quantize x to int8 too); on the CPU backend int8 for "
     "K-quant and Q8_0 files (Q4_K_M, Q5_K_M, Q6_K, Q8_0: faster), f32 for the others. F16/BF16 weights on "
     "a CPU with AMX tiles (Sapphire Rapids and later): products of 32 or more rows (prompts, large batches) "
     "in bf16 on the tiles with int8, and with auto in a GPU engine's host layers"},
    {"kv-type", OPT_ENUM, OFF(kv_type), 0, 0, "f16", "f16|f32|q8_0",
     "element type of the KV cache: f16 (half the memory, and half the bytes a long-context step reads), f32 "
     "(closest to the reference; CPU backend only) or q8_0 (llama.cpp's 8-bit blocks: 17/32 of f16's memory, "
     "and of the bytes "
     "the host reads when the pool overflows into host memory; heads a multiple of 64 wide on the GPU)"},
    {"swa-full", OPT_BOOL, OFF(swa_full), 0, 1, "0", NULL,
     "sliding-window layers keep every position in the KV cache, as global ones do (llama.cpp's --swa-full); "
     "by default both backends keep only each sequence's window for them (and 64 positions before it)"},
    {"quant", OPT_ENUM, OFF(quant), 0, 0, "none", "none|int8|int4",
     "quantize F32/F16/BF16 weights at load: int8 = llama.cpp's Q8_0 (half the bytes of f16), int4 = its "
     "Q4_K_M mix "
     "(about 0.3x f16); the bytes `ferry quantize` writes"},
    {"deterministic", OPT_BOOL, OFF(deterministic), 0, 1, "0", NULL,
     "fixed reduction orders (passed to the engine; the CPU backend always is); the CPU engine's products "
     "batch-invariant (a row's logits do not depend on its step's other rows: the prompt cache and "
     "speculation answer bitwise as plain decoding), at a cost in prefill of Q4_0/Q4_1/Q5/Q8_0 files"},
};
#define N_ROWS (int)(sizeof rows / sizeof rows[0])

static int parse_i64(const char *s, int64_t *v)
{
    if (!s || !*s) return -1;
    errno = 0;
    char *end;
    long long x = strtoll(s, &end, 10);
    if (errno || *end) return -1;
    *v = x;
    return 0;
}

int opt_parse_size_auto(const char *s, int64_t *v)
{
    if (s && !strcasecmp(s, "auto")) {
        *v = -1;
        return 0;
    }
    return opt_parse_size(s, v);
}

int opt_parse_size(const char *s, int64_t *v)
{
    if (!s || !*s) return -1;
    errno = 0;
    char *end;
    double x = strtod(s, &end);
    if (errno || end == s || x < 0) return -1;
    double mul = 1;
    while (*end == ' ') end++;
    switch (tolower((unsigned char)*end)) {
    case 0:
        break;
    case 'b':
        mul = 1;
        end++;
        break;
    case 'k':
        mul = 1024.0;
        end++;
        break;
    case 'm':
        mul = 1024.0 * 1024;
        end++;
        break;
    case 'g':
        mul = 1024.0 * 1024 * 1024;
        end++;
        break;
    case 't':
        mul = 1024.0 * 1024 * 1024 * 1024;
        end++;
        break;
    default:
        return -1;
    }
    if (mul > 1) {
        if (*end == 'i' || *end == 'I') end++;
        if (*end == 'b' || *end == 'B') end++;
    }
    if (*end) return -1;
    x *= mul;
    if (x > 9.0e18) return -1;
    *v = (int64_t)x;
    return 0;
}

/* ------------------------------------------------------------------------------------------------------------
 */
/* --gpus and per-device --gpu-memory */

struct opt_gpus opt_gpus_default(void)
{
    return (struct opt_gpus){.n = 1};
}

/* Calls item(g, i, text, err) on each comma-separated item of s (at most OPT_MAX_GPUS, none empty); what is
 * one of `what` for messages. */
static int each_item(struct opt_gpus *g, const char *s, const char *what,
                     int (*item)(struct opt_gpus *, int, const char *, char[256]), int *count, char err[256])
{
    if (!s || !*s) {
        snprintf(err, 256, "an empty list of %s", what);
        return FERRY_ERR_INVALID;
    }
    int n = 0;
    for (const char *p = s;; n++) {
        const char *comma = strchr(p, ',');
        const size_t len = comma ? (size_t)(comma - p) : strlen(p);
        char text[64];
        if (n >= OPT_MAX_GPUS) {
            snprintf(err, 256, "more than %d %s", OPT_MAX_GPUS, what);
            return FERRY_ERR_INVALID;
        }
        if (len == 0 || len >= sizeof text) {
            snprintf(err, 256, "item %d of '%.64s' is %s", n + 1, s, len ? "too long" : "empty");
            return FERRY_ERR_INVALID;
        }
        memcpy(text, p, len);
        text[len] = 0;
        if (item(g, n, text, err)) return FERRY_ERR_INVALID;
        if (!comma) break;
        p = comma + 1;
    }
    *count = n + 1;
    return 0;
}

static int gpu_item(struct opt_gpus *g, int i, const char *text, char err[256])
{
    int64_t v;
    if (strspn(text, "0123456789") != strlen(text) || parse_i64(text, &v) || v > 255) {
        snprintf(err, 256, "'%s' is not a device ordinal (0 to 255)", text);
        return FERRY_ERR_INVALID;
    }
    for (int j = 0; j < i; j++)
        if (g->ordinal[j] == v) {
            snprintf(err, 256, "GPU %lld is named twice", (long long)v);
            return FERRY_ERR_INVALID;
        }
    g->ordinal[i] = (int)v;
    return 0;
}

static int size_item(struct opt_gpus *g, int i, const char *text, char err[256])
{
    if (opt_parse_size(text, &g->memory[i])) {
        snprintf(err, 256, "'%s' is not a size (e.g. 512MiB, 20GiB)", text);
        return FERRY_ERR_INVALID;
    }
    return 0;
}

int opt_gpus_parse(struct opt_gpus *g, const char *s, char err[256])
{
    struct opt_gpus t = *g;
    if (each_item(&t, s, "devices", gpu_item, &t.n, err)) return FERRY_ERR_INVALID;
    *g = t;
    return 0;
}

int opt_gpus_parse_memory(struct opt_gpus *g, const char *s, char err[256])
{
    struct opt_gpus t = *g;
    if (each_item(&t, s, "sizes", size_item, &t.n_memory, err)) return FERRY_ERR_INVALID;
    *g = t;
    return 0;
}

int opt_gpus_check(const struct opt_gpus *g, char err[256])
{
    if (g->n_memory > 1 && g->n_memory != g->n) {
        snprintf(
            err, 256,
            "--gpu-memory gives %d sizes for the %d device%s of --gpus: give one size for every device, or "
            "one per device in --gpus order",
            g->n_memory, g->n, g->n == 1 ? "" : "s");
        return FERRY_ERR_INVALID;
    }
    return 0;
}

int64_t opt_gpus_memory(const struct opt_gpus *g, int d)
{
    return g->n_memory == 0 ? 0 : g->n_memory == 1 ? g->memory[0] : d < g->n_memory ? g->memory[d] : 0;
}

int opt_gpus_single(const struct opt_gpus *g, char err[256])
{
    if (g->n > 1) {
        char list[OPT_MAX_GPUS * 5] = "";
        for (int d = 0, w = 0; d < g->n; d++)
            w += snprintf(list + w, sizeof list - (size_t)w, "%s%d", d ? "," : "", g->ordinal[d]);
        snprintf(
            err, 256,
            "--gpus %s names %d GPUs: running across several GPUs is not implemented yet (`ferry inspect "
            "--gpus %s --gpu-memory ...` shows how they would be planned); give one",
            list, g->n, list);
        return FERRY_ERR_UNSUPPORTED;
    }
    if (g->n == 1 && g->ordinal[0] != 0) {
        snprintf(err, 256,
                 "--gpus %d: ferry runs on the first visible GPU; to use GPU %d, start it with "
                 "CUDA_VISIBLE_DEVICES=%d (that GPU is then the first)",
                 g->ordinal[0], g->ordinal[0], g->ordinal[0]);
        return FERRY_ERR_UNSUPPORTED;
    }
    return 0;
}

static int parse_bool(const char *s, int *v)
{
    if (!s) return -1;
    if (!strcasecmp(s, "1") || !strcasecmp(s, "true") || !strcasecmp(s, "yes") || !strcasecmp(s, "on")) {
        *v = 1;
        return 0;
    }
    if (!strcasecmp(s, "0") || !strcasecmp(s, "false") || !strcasecmp(s, "no") || !strcasecmp(s, "off")) {
        *v = 0;
        return 0;
    }
    return -1;
}

static int choice_ok(const char *choices, const char *s)
{
    size_t n = strlen(s);
    const char *p = choices;
    while (p && *p) {
        const char *bar = strchr(p, '|');
        size_t len = bar ? (size_t)(bar - p) : strlen(p);
        if (len == n && !strncmp(p, s, n)) return 1;
        p = bar ? bar + 1 : NULL;
    }
    return 0;
}

/* Applies one textual value to a row; `from` names the source for the error message. */
static int apply(struct serve_options *o, const struct opt_row *r, const char *val, const char *from,
                 char err[256])
{
    char *base = (char *)o + r->off;
    int64_t v = 0;
    switch (r->type) {
    case OPT_STR:
        if (!val || !*val) {
            snprintf(err, 256, "%s: --%s needs a non-empty value", from, r->name);
            return FERRY_ERR_INVALID;
        }
        *(const char **)base = val;
        return 0;
    case OPT_ENUM:
        if (!val || !choice_ok(r->choices, val)) {
            snprintf(err, 256, "%s: --%s must be one of %s, got '%s'", from, r->name, r->choices,
                     val ? val : "");
            return FERRY_ERR_INVALID;
        }
        *(const char **)base = val;
        return 0;
    case OPT_KEYS:
        if (!val || !*val) {
            snprintf(err, 256, "%s: --%s needs a non-empty value", from, r->name);
            return FERRY_ERR_INVALID;
        }
        if (o->n_api_keys >= SERVE_MAX_API_KEYS) {
            snprintf(err, 256, "%s: at most %d API keys", from, SERVE_MAX_API_KEYS);
            return FERRY_ERR_INVALID;
        }
        o->api_keys[o->n_api_keys++] = val;
        return 0;
    case OPT_BOOL: {
        int b;
        if (parse_bool(val, &b)) {
            snprintf(err, 256, "%s: --%s takes true/false/1/0, got '%s'", from, r->name, val ? val : "");
            return FERRY_ERR_INVALID;
        }
        *(int *)base = b;
        return 0;
    }
    case OPT_REAL: {
        char *end = NULL;
        double d = val && *val ? strtod(val, &end) : NAN;
        if (!end || *end || !(d >= (double)r->lo && d <= (double)r->hi)) {
            snprintf(err, 256, "%s: --%s: '%s' is not a number in [%lld, %lld]", from, r->name,
                     val ? val : "", (long long)r->lo, (long long)r->hi);
            return FERRY_ERR_INVALID;
        }
        *(double *)base = d;
        return 0;
    }
    case OPT_GPUS: {
        char e[256];
        if (opt_gpus_parse(&o->gpus, val, e)) {
            snprintf(err, 256, "%s: --%s: %.200s", from, r->name, e);
            return FERRY_ERR_INVALID;
        }
        return 0;
    }
    case OPT_SIZES:
        if (val && strchr(val, ',')) {
            char e[256];
            if (opt_gpus_parse_memory(&o->gpus, val, e)) {
                snprintf(err, 256, "%s: --%s: %.200s", from, r->name, e);
                return FERRY_ERR_INVALID;
            }
            *(int64_t *)base = o->gpus.memory[0];
            return 0;
        }
        __attribute__((fallthrough)); /* one size, as OPT_SIZE */
    case OPT_INT:
    case OPT_I64:
    case OPT_SIZE: {
        int bad = r->type != OPT_SIZE && r->type != OPT_SIZES ? parse_i64(val, &v)
                  : r->lo < 0                                 ? opt_parse_size_auto(val, &v)
                                                              : opt_parse_size(val, &v);
        if (bad) {
            snprintf(err, 256, "%s: --%s: '%s' is not %s", from, r->name, val ? val : "",
                     r->type != OPT_INT && r->type != OPT_I64 ? "a size (e.g. 512KiB, 4GiB)" : "an integer");
            return FERRY_ERR_INVALID;
        }
        if (v < r->lo || v > r->hi) {
            snprintf(err, 256, "%s: --%s=%s is out of range [%lld, %lld]", from, r->name, val,
                     (long long)r->lo, (long long)r->hi);
            return FERRY_ERR_INVALID;
        }
        if (r->type == OPT_INT)
            *(int *)base = (int)v;
        else
            *(int64_t *)base = v;
        if (r->type == OPT_SIZES) o->gpus.n_memory = 1, o->gpus.memory[0] = v;
        return 0;
    }
    }
    return FERRY_ERR_INVALID;
}

struct serve_options serve_options_default(void)
{
    struct serve_options o;
    memset(&o, 0, sizeof o);
    char err[256];
    for (int i = 0; i < N_ROWS; i++)
        if (rows[i].def) ASSERT(apply(&o, &rows[i], rows[i].def, "default", err) == 0);
    return o;
}

static void env_name(const char *name, char *out, size_t cap)
{
    size_t n = 0;
    n += (size_t)snprintf(out, cap, "FERRY_");
    for (const char *p = name; *p && n + 1 < cap; p++) out[n++] = *p == '-' ? '_' : (char)toupper(*p);
    out[n] = 0;
}

int serve_options_parse(struct serve_options *o, int argc, char **argv, char err[256])
{
    err[0] = 0;
    for (int i = 0; i < N_ROWS; i++) {
        char env[64];
        env_name(rows[i].name, env, sizeof env);
        const char *v = getenv(env);
        if (v && apply(o, &rows[i], v, env, err)) return FERRY_ERR_INVALID;
    }
    for (int a = 1; a < argc; a++) {
        const char *arg = argv[a];
        if (!strcmp(arg, "-m")) arg = "--model"; /* the short form `ferry run` takes too */
        if (!strcmp(arg, "--help") || !strcmp(arg, "-h")) {
            o->help = 1;
            continue;
        }
        if (strncmp(arg, "--", 2)) {
            snprintf(err, 256, "unexpected argument '%s' (options start with --; see --help)", arg);
            return FERRY_ERR_INVALID;
        }
        const char *name = arg + 2;
        const char *eq = strchr(name, '=');
        size_t nlen = eq ? (size_t)(eq - name) : strlen(name);
        const struct opt_row *r = NULL;
        for (int i = 0; i < N_ROWS; i++)
            if (strlen(rows[i].name) == nlen && !strncmp(rows[i].name, name, nlen)) r = &rows[i];
        if (!r) {
            snprintf(err, 256, "unknown option '%.*s' (see --help)", (int)(nlen + 2), arg);
            return FERRY_ERR_INVALID;
        }
        const char *val;
        if (eq)
            val = eq + 1;
        else if (r->type == OPT_BOOL) /* `--flag`, or `--flag false` when a boolean word follows */
            val = a + 1 < argc && parse_bool(argv[a + 1], &(int){0}) == 0 ? argv[++a] : "1";
        else if (a + 1 < argc)
            val = argv[++a];
        else {
            snprintf(err, 256, "option --%s needs a value", r->name);
            return FERRY_ERR_INVALID;
        }
        if (apply(o, r, val, "argv", err)) return FERRY_ERR_INVALID;
    }
    return opt_gpus_check(&o->gpus, err);
}

int serve_options_load_key_file(struct serve_options *o, char err[256])
{
    if (!o->api_key_file) return 0;
    FILE *f = fopen(o->api_key_file, "r");
    if (!f) {
        snprintf(err, 256, "--api-key-file %s: %s", o->api_key_file, strerror(errno));
        return FERRY_ERR_IO;
    }
    char *line = NULL;
    size_t line_cap = 0;
    ssize_t got;
    int rc = 0, lineno = 0;
    while ((got = getline(&line, &line_cap, f)) >= 0) {
        size_t len = (size_t)got;
        lineno++;
        if (len > 1023) {
            snprintf(err, 256, "--api-key-file %s: line %d is longer than 1022 bytes", o->api_key_file,
                     lineno);
            rc = FERRY_ERR_INVALID;
            break;
        }
        if (memchr(line, 0, len)) { /* a C string would end the key there: a different key than written */
            snprintf(err, 256, "--api-key-file %s: line %d holds a NUL byte", o->api_key_file, lineno);
            rc = FERRY_ERR_INVALID;
            break;
        }
        char *s = line;
        /* a UTF-8 byte-order mark (editors on Windows write one) is not part of the first key */
        if (lineno == 1 && len >= 3 && !memcmp(s, "\xEF\xBB\xBF", 3)) {
            FLOG_WARN("--api-key-file %s: skipping the UTF-8 byte-order mark at its start", o->api_key_file);
            s += 3;
        }
        while (isspace((unsigned char)*s)) s++;
        size_t n = strlen(s);
        while (n && isspace((unsigned char)s[n - 1])) s[--n] = 0;
        if (!n || *s == '#') continue;
        if (o->n_api_keys >= SERVE_MAX_API_KEYS || o->n_owned >= SERVE_MAX_API_KEYS) {
            snprintf(err, 256, "--api-key-file %s: at most %d keys", o->api_key_file, SERVE_MAX_API_KEYS);
            rc = FERRY_ERR_INVALID;
            break;
        }
        char *k = strdup(s);
        if (!k) {
            rc = FERRY_ERR_NOMEM;
            break;
        }
        o->owned[o->n_owned++] = k;
        o->api_keys[o->n_api_keys++] = k;
    }
    free(line);
    if (!rc && ferror(f)) {
        snprintf(err, 256, "--api-key-file %s: read error", o->api_key_file);
        rc = FERRY_ERR_IO;
    }
    fclose(f);
    /* a key file that yields no key must not leave the server open: that would be auth failing open */
    if (!rc && o->n_owned == 0) {
        snprintf(err, 256, "--api-key-file %s holds no key (only blank lines and # comments)",
                 o->api_key_file);
        rc = FERRY_ERR_INVALID;
    }
    return rc;
}

void serve_options_help(FILE *f)
{
    fprintf(
        f, "usage: ferry serve --model PATH [options]\n\n"
           "OpenAI-compatible HTTP server. Every option also reads from the environment variable shown.\n\n");
    for (int i = 0; i < N_ROWS; i++) {
        const struct opt_row *r = &rows[i];
        char env[64], lhs[64];
        env_name(r->name, env, sizeof env);
        const char *meta = r->type == OPT_BOOL                        ? " [BOOL]"
                           : r->type == OPT_SIZE                      ? " SIZE"
                           : r->type == OPT_SIZES                     ? " SIZE[,SIZE]"
                           : r->type == OPT_GPUS                      ? " N[,N]"
                           : r->type == OPT_INT || r->type == OPT_I64 ? " N"
                           : r->type == OPT_REAL                      ? " X"
                           : r->type == OPT_ENUM                      ? " WORD"
                                                                      : " TEXT";
        snprintf(lhs, sizeof lhs, "--%s%s", r->name, meta);
        fprintf(f, "  %-26s %s\n", lhs, r->help);
        fprintf(f, "  %-26s env %s", "", env);
        if (r->type == OPT_ENUM) fprintf(f, ", one of %s", r->choices);
        if ((r->type == OPT_INT || r->type == OPT_I64 || r->type == OPT_REAL) && r->hi > r->lo)
            fprintf(f, ", range [%lld, %lld]", (long long)r->lo, (long long)r->hi);
        if (r->def) fprintf(f, ", default %s", r->def);
        fprintf(f, "\n");
    }
    fprintf(f, "  %-26s this text\n", "--help");
}

void serve_options_free(struct serve_options *o)
{
    if (!o) return;
    for (int i = 0; i < o->n_owned; i++) free(o->owned[i]);
    o->n_owned = 0;
}
