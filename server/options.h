/* options — the server's configuration as ONE table (name, env var, type, bounds, default, help).
 *
 * The table drives argv parsing (`--name VALUE`, `--name=VALUE`; a boolean also as a bare `--flag`), the
 * environment (FERRY_<NAME>, dashes as underscores, read before argv so argv wins) and `--help`.
 * Strings point into argv/environ or into allocations freed by serve_options_free(); sizes accept
 * K/M/G[iB] suffixes. Usage: o = serve_options_default(); serve_options_parse(&o, argc, argv, err);
 * ... serve_options_free(&o).
 */
#ifndef FERRY_SERVER_OPTIONS_H
#define FERRY_SERVER_OPTIONS_H

#include <stdint.h>
#include <stdio.h>

#define SERVE_MAX_API_KEYS 16
#define OPT_MAX_GPUS       16 /* devices --gpus may name */

/* --gpus LIST (CUDA ordinals, e.g. 0,1) and --gpu-memory SIZE[,SIZE...]: the devices and their budgets. One
 * size is every device's budget (with one device: today's --gpu-memory); a list gives one per device of
 * --gpus, in its order. Running across several devices is not built yet: serve, run and bench refuse more
 * than one (opt_gpus_single); `ferry inspect` plans for them. */
struct opt_gpus {
    int n;                        /* devices (default 1: ordinal 0) */
    int ordinal[OPT_MAX_GPUS];    /* distinct, in the order given */
    int n_memory;                 /* sizes --gpu-memory gave: 0 (none), 1 (every device's) or n */
    int64_t memory[OPT_MAX_GPUS]; /* bytes; 0 = free VRAM minus --reserve-vram */
};

struct serve_options {
    const char *model;                        /* GGUF file or HF directory; required */
    const char *host;                         /* bind address */
    int port;                                 /* 0 = any free port (logged) */
    const char *api_keys[SERVE_MAX_API_KEYS]; /* --api-key, repeatable */
    int n_api_keys;
    const char *api_key_file;       /* one key per line, '#' comments */
    int ctx_size;                   /* positions per sequence; 0 = engine default */
    int kv_tokens;                  /* KV pool positions over all sequences; 0 = parallel * ctx */
    const char *backend;            /* auto|cpu|cuda */
    int parallel;                   /* sequence slots */
    int max_batch_tokens;           /* tokens per engine step */
    int prefill_budget;             /* prompt tokens per step beside the decode rows; 0 = what is left */
    int gpu_sampling;               /* draw on the GPU (CUDA backend) */
    int overlap;                    /* begin a decode step before the last one is published */
    int threads;                    /* CPU threads; 0 = online cores */
    int max_queue;                  /* waiting sequences before 503 */
    int queue_timeout;              /* seconds a request may wait for its first slot (503 after); 0 = none */
    int fair_share;                 /* share the slots between clients (API key, else address) */
    int64_t body_limit;             /* bytes */
    int timeout;                    /* seconds per request (queue + generation); 0 = none */
    int conn_timeout;               /* seconds a connection may stay silent, or leave the response unread */
    int header_timeout;             /* seconds for a whole request head, from its first byte */
    int body_timeout;               /* seconds for a whole request body, from the end of the head */
    int max_connections;            /* open at once; past it 503 + Retry-After */
    int max_connections_per_ip;     /* from one address; 0 = no limit */
    const char *allowed_hosts;      /* without an API key: Host names accepted besides loopback ones */
    int shutdown_timeout;           /* seconds to drain on SIGTERM before cutting requests */
    const char *cors_origin;        /* Access-Control-Allow-Origin value; NULL = no CORS headers */
    const char *chat_template;      /* builtin template name overriding the model's */
    const char *chat_template_file; /* a template file overriding both */
    const char *reasoning_format;   /* auto|none: <think> blocks of chat answers into reasoning_content */
    const char *pooling;            /* mean|last: how /v1/embeddings pools the hidden states */
    int public_health;              /* 1: /health and /metrics need no key */
    const char *log_level;          /* error|warn|info|debug */
    const char *served_model_name;  /* NULL = file name of --model */
    int any_model;                  /* 1: accept any "model" value instead of 404 */
    int64_t seed;                   /* default seed when a request gives none; -1 = random per request */
    int64_t
        gpu_memory; /* CUDA backend budget (bytes; 0 = free VRAM minus reserve_vram): the first device's */
    struct opt_gpus gpus; /* --gpus and every size of --gpu-memory */
    int64_t reserve_vram;
    int gpu_layers;        /* -1 = planner decides */
    int cpu_moe;           /* expert layers whose experts stay in host memory; -1 = planner decides */
    int64_t expert_cache;  /* device bytes of the expert cache for host experts; -1 = auto (engine.h) */
    int ring_layers;       /* streaming ring size in the largest streamed layers; 0 = planner decides */
    const char *placement; /* auto|stream|cpu: what the host layers do (CUDA backend) */
    int cpu_threads;       /* pinned host threads for host layers; 0 = threads */
    const char *cpu_arith; /* f32|int8: x of CPU products with block-type weights */
    const char *kv_type;   /* f16|f32|q8_0: the CPU backend's KV cache */
    int swa_full;          /* sliding-window layers keep every position (engine_params.swa_full) */
    const char *quant;     /* none|int8|int4 */
    int deterministic;
    int prompt_cache;                    /* reuse a free slot's KV for a prompt with the same start */
    int ctx_checkpoints;                 /* recurrent models: state checkpoints a slot keeps */
    int checkpoint_min_step;             /* positions a full slot's checkpoints are thinned to */
    const char *spec_type;               /* none|ngram|draft: speculative decoding's drafter */
    const char *model_draft;             /* the draft model of --spec-type draft */
    int spec_draft_n_max;                /* tokens one sequence drafts a step at most */
    int spec_draft_adapt;                /* the draft length follows acceptance and the cost of rows */
    int spec_draft_n_min;                /* a shorter draft is not verified */
    double spec_draft_p_min;             /* the draft model stops at a token below this probability */
    int help;                            /* --help was given */
    char *owned[SERVE_MAX_API_KEYS + 1]; /* allocations to free (key-file keys) */
    int n_owned;
    /* --hf-repo OWNER/REPO[:QUANT]: the model from a hub (as ferry pull fetches it), instead of --model */
    const char *hf_repo;
};

struct serve_options serve_options_default(void);
/* Applies FERRY_* environment variables, then argv[1..] (argv[0] is the subcommand). Returns 0 or
 * FERRY_ERR_INVALID with err naming the option and the problem. Does not check that --model is set. */
int serve_options_parse(struct serve_options *o, int argc, char **argv, char err[256]);
/* Reads --api-key-file into api_keys. */
int serve_options_load_key_file(struct serve_options *o, char err[256]);
void serve_options_help(FILE *f);
void serve_options_free(struct serve_options *o);

/* "4GiB", "512M", "1.5g", "1000000" → bytes (K/M/G/T, optional "iB"/"B"); -1 when malformed. Shared by every
 * subcommand that takes a size. */
int opt_parse_size(const char *s, int64_t *v);
/* The same, or "auto" → -1 (options whose default the planner chooses). */
int opt_parse_size_auto(const char *s, int64_t *v);

/* One device, ordinal 0, no size. */
struct opt_gpus opt_gpus_default(void);
/* "0,1" into g's ordinals (1 to OPT_MAX_GPUS distinct ordinals in [0, 255], comma-separated, nothing else);
 * FERRY_ERR_INVALID with err saying what is wrong. */
int opt_gpus_parse(struct opt_gpus *g, const char *s, char err[256]);
/* "4GiB" or "20GiB,12GiB" into g's sizes (1 to OPT_MAX_GPUS of opt_parse_size's sizes); FERRY_ERR_INVALID. */
int opt_gpus_parse_memory(struct opt_gpus *g, const char *s, char err[256]);
/* After both were given: a list of sizes must have one size per device. FERRY_ERR_INVALID otherwise. */
int opt_gpus_check(const struct opt_gpus *g, char err[256]);
/* Device d's budget (bytes; 0 when --gpu-memory gave none or 0). */
int64_t opt_gpus_memory(const struct opt_gpus *g, int d);
/* For commands that run on one device: FERRY_ERR_UNSUPPORTED with err saying so when g names several (running
 * across them is not built yet; `ferry inspect` shows their plan) or an ordinal other than 0 (use
 * CUDA_VISIBLE_DEVICES). */
int opt_gpus_single(const struct opt_gpus *g, char err[256]);

#endif
