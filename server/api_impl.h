/* api_impl — helpers shared by the files of the API layer (api.c, api_chat.c, api_render.c, responses.c,
 * embeddings.c). JSON values (jansson) live only in these files: the scheduler and the runtime see native
 * structs and JSON text.
 */
#ifndef FERRY_SERVER_API_IMPL_H
#define FERRY_SERVER_API_IMPL_H

#include <jansson.h>
#include <stdint.h>
#include <stdio.h>

#include "server/api.h"

/* Fills *e and returns the status from the current function. */
#define FAIL(st, prm, ...)                                                                                   \
    do {                                                                                                     \
        e->status = (st);                                                                                    \
        e->param = (prm);                                                                                    \
        snprintf(e->msg, sizeof e->msg, __VA_ARGS__);                                                        \
        return (st);                                                                                         \
    } while (0)

/* A JSON string of s[0, n) made valid UTF-8 (json null when out of memory). */
json_t *api_jstr(const char *s, size_t n);
/* Compact JSON text of j (consumed); NULL when out of memory. */
char *api_dump(json_t *j, size_t *len);

/* Appends one server-sent event: "event: NAME\n" when name is given (else none), then "data: " and data as
 * compact JSON (consumed); a failed allocation marks out->oom. */
void api_sse_event(struct strbuf *out, const char *name, json_t *data);

/* Field readers: 1 = present, 0 = absent or null, negative = wrong type or range (e filled, naming k). */
int api_get_num(json_t *o, const char *k, double lo, double hi, double *v, struct api_err *e);
int api_get_int(json_t *o, const char *k, long long lo, long long hi, long long *v, struct api_err *e);
int api_get_bool(json_t *o, const char *k, int *v, struct api_err *e);
int api_get_str(json_t *o, const char *k, const char **v, struct api_err *e);

/* Tokenizes text into a malloc'd array (*n_out ids). */
int api_encode(const struct api_ctx *a, const char *text, size_t len, int add_bos, int special, int32_t **out,
               int *n_out);
/* Decodes ids into a malloc'd string; NULL on failure. */
char *api_decode(const struct api_ctx *a, const int32_t *ids, int n, size_t *len);
uint64_t api_random_seed(void);
/* prefix + 16 hex digits of randomness. */
void api_make_id(char *out, size_t cap, const char *prefix);
/* The body as a JSON object, or NULL with e filled. */
json_t *api_load_object(const char *body, size_t len, struct api_err *e);

/* A completions / chat request from its JSON object (not consumed). */
int api_parse_object(const struct api_ctx *a, enum sreq_kind kind, json_t *o, struct sreq **out,
                     struct api_err *e);
/* /v1/responses: the request becomes a chat (responses.c). */
int api_parse_responses(const struct api_ctx *a, const char *body, size_t len, struct sreq **out,
                        struct api_err *e);
/* /v1/embeddings (embeddings.c). */
int api_parse_embeddings(const struct api_ctx *a, const char *body, size_t len, struct sreq **out,
                         struct api_err *e);
/* /v1/messages (anthropic.c): the request becomes a chat; the answer is an Anthropic message. */
int api_parse_anthropic(const struct api_ctx *a, const char *body, size_t len, struct sreq **out,
                        struct api_err *e);
char *api_anthropic_full(const struct api_ctx *a, struct sreq *r, size_t *len);
void api_anthropic_stream(const struct api_ctx *a, struct sreq *r, struct strbuf *out, int *done);
/* llama-server's /completion answers (llama_api.c). */
char *api_llama_full(const struct api_ctx *a, struct sreq *r, size_t *len);
void api_llama_stream(const struct api_ctx *a, struct sreq *r, struct strbuf *out, int *done);
/* Anthropic's error type for a status ("invalid_request_error", "overloaded_error", ...). */
const char *api_anthropic_error_type(int status);
char *api_embeddings_full(const struct api_ctx *a, struct sreq *r, size_t *len);
char *api_responses_full(const struct api_ctx *a, struct sreq *r, size_t *len);
void api_responses_stream(const struct api_ctx *a, struct sreq *r, struct strbuf *out, int *done);

/* Chat: renders "messages" (and "tools") through the template into r's prompt; sets up tool calling and
 * reasoning on r. Reads tools, tool_choice, parallel_tool_calls from o. (api_chat.c) */
int api_chat_prompt(const struct api_ctx *a, struct sreq *r, json_t *o, json_t *messages, struct api_err *e);
/* response_format / text.format: {"type": "text" | "json_object" | "json_schema", ...}; r->grammar set for
 * the last two. field names the request field in errors. (api_chat.c) */
int api_response_format(const struct api_ctx *a, struct sreq *r, json_t *j, const char *field,
                        struct api_err *e);

/* The output constraints of a completions or chat request: response_format, llama-server's top-level
 * json_schema, and its GBNF grammar. (api_chat.c) */
int api_output_constraints(const struct api_ctx *a, struct sreq *r, json_t *o, struct api_err *e);

/* One choice's output split for the client: reasoning, content and tool calls (api_render.c). */
struct api_split {
    const char *reasoning, *content;
    size_t r_len, c_len;
    int n_calls;
    struct tool_parse *tp; /* owned: api_split_free */
    char *owned[2];        /* harmony: the reasoning and content text (reasoning, content point here) */
};
void api_split_output(const struct sreq *r, const struct choice *c, int final, struct api_split *o);
void api_split_free(struct api_split *o);
/* usage of a request (chat/completions field names). */
json_t *api_usage(const struct sreq *r);
/* Call k of sp as chat's tool_calls element ({id, type, function}; with "index" when index is set). */
json_t *api_tool_call_json(const struct api_ctx *a, struct choice *c, const struct api_split *sp, int k,
                           int index);
/* The id of call k of a choice (made on first use, then stable). */
const char *api_call_id(const struct api_ctx *a, struct choice *c, int k);

#endif
