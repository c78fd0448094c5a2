/* api — the OpenAI wire format: request JSON → struct sreq, outputs → JSON bodies and SSE chunks, errors.
 *
 * Parsing validates every field (type, range) and fills err with a message naming the field; unknown
 * fields are ignored, fields ferry cannot honour are refused. JSON objects never leave the API layer
 * (api*.c, responses.c, embeddings.c): the scheduler sees native structs only.
 * Rendering functions read a request's outputs and must be called with the scheduler lock held.
 * Status codes: ferry's (kernels/core/status.h) plus the few HTTP-only ones below, mapped to an HTTP
 * status, error type and code by api_http_status() — the one place where that mapping lives.
 */
#ifndef FERRY_SERVER_API_H
#define FERRY_SERVER_API_H

#include <stddef.h>
#include <stdint.h>

#include "runtime/tokenizer.h" /* utf8_sanitize */
#include "runtime/tool_call.h"
#include "server/scheduler.h"

/* HTTP-only statuses (below every ferry status). */
enum {
    SERVE_ERR_UNAUTHORIZED = -101, /* 401 */
    SERVE_ERR_METHOD = -102,       /* 405 */
    SERVE_ERR_TOO_LARGE = -103,    /* 413 */
    SERVE_ERR_LOADING = -104,      /* 503 while the model loads */
    SERVE_ERR_NO_ROUTE = -105,     /* 404 */
    SERVE_ERR_SHUTDOWN = -106,     /* 503 while draining */
    SERVE_ERR_FORBIDDEN = -107,    /* 403: a Host name not allowed without an API key */
    SERVE_ERR_MEDIA_TYPE = -108,   /* 415: a POST body that is not application/json */
    SERVE_ERR_CONTEXT = -109,      /* 400 context_length_exceeded: prompt (+ max_tokens) beyond the context */
};

struct api_ctx {
    const struct tokenizer *tok;
    const char *model_name;
    const char *const *model_aliases; /* every name the model answers to, NULL-terminated (model_names.h) */
    int any_model;                    /* accept any "model" value */
    const char *chat_tmpl;            /* template source */
    const char *bos_str, *eos_str;
    int ctx_size;            /* positions per sequence */
    int n_vocab;             /* valid token ids: [0, n_vocab) */
    int64_t default_seed;    /* -1 = random */
    double timeout;          /* seconds per request, 0 = none */
    int tool_format;         /* enum tool_format of chat_tmpl (runtime/tool_call.h) */
    int reasoning;           /* 1: a <think> block at the start of a chat answer goes to reasoning_content */
    const char *fingerprint; /* system_fingerprint of every answer ("fp_" and the build id) */
    int embd_dim;            /* width of an embedding (the model's hidden size) */
    int pooling;             /* embeddings: 0 = mean over the input's positions, 1 = its last position */
    int kv_positions; /* positions the whole KV pool holds (sched_kv_positions); 0 = unknown, not checked
                       * here (sched_submit still refuses a sequence that can never fit) */
};

struct api_err {
    int status;        /* ferry or SERVE_ERR_* status */
    const char *param; /* offending field or NULL */
    char msg[256];
};

/* A growable byte buffer. */
struct strbuf {
    char *p;
    size_t len, cap;
    int oom;
};
void strbuf_add(struct strbuf *b, const char *s, size_t n);
void strbuf_free(struct strbuf *b);

/* jansson's allocator in the server, and the mark of a failed allocation: each thread that builds an answer
 * calls api_oom_reset() first and api_oom_seen() after; a mark means the answer may have holes and must not
 * be sent. api_oom_mark() sets it where an allocation outside jansson fails (strbuf_add does so itself). */
void *api_json_alloc(size_t n);
void api_oom_mark(void);
void api_oom_reset(void);
int api_oom_seen(void);

/* HTTP status for a status code; *type and *code get OpenAI's error type and code (code may be NULL). */
int api_http_status(int status, const char **type, const char **code);
/* {"error":{"message","type","param","code"}} as a malloc'd string. */
char *api_error_body(int status, const char *msg, const char *param, size_t *len);

/* Parses and validates a /v1/completions or /v1/chat/completions body; renders the chat template and
 * tokenizes. *out is a new request (refs 1) with its choices laid out. */
int api_parse_request(const struct api_ctx *a, enum sreq_kind kind, const char *body, size_t len,
                      struct sreq **out, struct api_err *e);

/* With the scheduler lock held, for a request whose choices are all done: the non-streamed body. */
char *api_render_full(const struct api_ctx *a, struct sreq *r, size_t *len);
/* With the scheduler lock held: appends SSE events for everything new since the last call; sets *done
 * once `data: [DONE]` has been appended. */
void api_render_stream(const struct api_ctx *a, struct sreq *r, struct strbuf *out, int *done);

/* Anthropic's Messages API (anthropic.c): POST /v1/messages/count_tokens's answer, and the error body
 * {"type": "error", "error": {"type", "message"}} that the /v1/messages routes answer with. */
int api_anthropic_count_tokens(const struct api_ctx *a, const char *body, size_t len, char **out,
                               size_t *out_len, struct api_err *e);
char *api_anthropic_error_body(int status, const char *msg, size_t *len);

/* llama-server's native endpoints (llama_api.c): POST /completion and /infill parse into a request answered
 * in llama-server's shape; GET /props and GET /slots. */
struct api_llama_info {
    int n_slots;            /* --parallel */
    const char *model_path; /* as given */
};
struct sched_seq;
int api_parse_llama(const struct api_ctx *a, int infill, const char *body, size_t len, struct sreq **out,
                    struct api_err *e);
int api_chat_input_tokens(const struct api_ctx *a, const char *body, size_t len, char **out, size_t *out_len,
                          struct api_err *e);
char *api_llama_props(const struct api_ctx *a, const struct api_llama_info *info, size_t *len);
char *api_llama_slots(const struct api_ctx *a, const struct api_llama_info *info,
                      const struct sched_seq *seqs, int n_seqs, size_t *len);

/* /v1/models, /tokenize, /detokenize bodies. */
char *api_models_body(const struct api_ctx *a, const char *only_id, size_t *len);
int api_tokenize(const struct api_ctx *a, const char *body, size_t len, char **out, size_t *out_len,
                 struct api_err *e);
/* llama-server's POST /apply-template: the chat's rendered prompt, {"prompt": "..."}. */
int api_apply_template(const struct api_ctx *a, const char *body, size_t len, char **out, size_t *out_len,
                       struct api_err *e);
int api_detokenize(const struct api_ctx *a, const char *body, size_t len, char **out, size_t *out_len,
                   struct api_err *e);

#endif
