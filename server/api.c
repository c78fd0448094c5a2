/* api — OpenAI request parsing/validation and response rendering (JSON bodies and SSE chunks).
 *
 * Request fields follow OpenAI's semantics and defaults; null means absent; unknown fields are ignored.
 * Output text is sanitized to valid UTF-8 before it is put into JSON (a model can emit broken bytes).
 */
#include "server/api.h"

#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernels/core/status.h"
#include "runtime/chat_template.h"
#include "runtime/tokenizer.h"
#include "server/api_impl.h"
#include "server/model_names.h"

#define API_MAX_PROMPTS             128
#define API_MAX_N                   128
#define API_MAX_STOPS               4 /* OpenAI's limit */
#define API_MAX_STOP_LEN            1024
#define API_MAX_BIAS                4096
#define API_MAX_COMPLETION_LOGPROBS 5 /* OpenAI's limit for /v1/completions */

/* ---- small helpers ------------------------------------------------------------------------------- */

void strbuf_add(struct strbuf *b, const char *s, size_t n)
{
    if (b->oom) return;
    if (b->len + n + 1 > b->cap) {
        size_t nc = b->cap ? b->cap * 2 : 1024;
        while (nc < b->len + n + 1) nc *= 2;
        char *q = realloc(b->p, nc);
        if (!q) {
            b->oom = 1;
            api_oom_mark(); /* whatever the buffer was building now has a hole */
            return;
        }
        b->p = q;
        b->cap = nc;
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = 0;
}

void strbuf_free(struct strbuf *b)
{
    free(b->p);
    memset(b, 0, sizeof *b);
}

/* A failed allocation while an answer is built leaves a hole in it (jansson drops what it cannot allocate):
 * every such failure marks the thread, and the server answers "out of memory" instead of the holed body. */
static __thread int oom_mark;

void *api_json_alloc(size_t n)
{
    void *p = malloc(n);
    if (!p) oom_mark = 1;
    return p;
}

void api_oom_mark(void)
{
    oom_mark = 1;
}

void api_oom_reset(void)
{
    oom_mark = 0;
}

int api_oom_seen(void)
{
    return oom_mark;
}

json_t *api_jstr(const char *s, size_t n)
{
    size_t m;
    char *c = utf8_sanitize(s ? s : "", s ? n : 0, &m);
    if (!c) {
        oom_mark = 1;
        return json_null();
    }
    json_t *j = json_stringn_nocheck(c, m);
    free(c);
    return j ? j : json_null();
}

char *api_dump(json_t *j, size_t *len)
{
    char *s = json_dumps(j, JSON_COMPACT);
    json_decref(j);
    if (s && len) *len = strlen(s);
    return s;
}

void api_sse_event(struct strbuf *out, const char *name, json_t *data)
{
    size_t n;
    char *s = api_dump(data, &n);
    if (!s) {
        out->oom = 1;
        return;
    }
    if (name) {
        strbuf_add(out, "event: ", 7);
        strbuf_add(out, name, strlen(name));
        strbuf_add(out, "\n", 1);
    }
    strbuf_add(out, "data: ", 6);
    strbuf_add(out, s, n);
    strbuf_add(out, "\n\n", 2);
    free(s);
}

/* ---- errors ---------------------------------------------------------------------------------------- */

int api_http_status(int status, const char **type, const char **code)
{
    const char *t = "server_error", *c = NULL;
    int http = 500;
    switch (status) {
    case FERRY_ERR_INVALID:
    case FERRY_ERR_FORMAT:
    case FERRY_ERR_RANGE:
    case FERRY_ERR_UNSUPPORTED:
        http = 400, t = "invalid_request_error";
        break;
    case FERRY_ERR_NOT_FOUND:
        http = 404, t = "invalid_request_error", c = "model_not_found";
        break;
    case SERVE_ERR_NO_ROUTE:
        http = 404, t = "invalid_request_error", c = "not_found";
        break;
    case SERVE_ERR_UNAUTHORIZED:
        http = 401, t = "invalid_request_error", c = "invalid_api_key";
        break;
    case SERVE_ERR_METHOD:
        http = 405, t = "invalid_request_error", c = "method_not_allowed";
        break;
    case SERVE_ERR_TOO_LARGE:
        http = 413, t = "invalid_request_error", c = "request_too_large";
        break;
    case SERVE_ERR_FORBIDDEN:
        http = 403, t = "invalid_request_error", c = "host_not_allowed";
        break;
    case SERVE_ERR_CONTEXT:
        http = 400, t = "invalid_request_error", c = "context_length_exceeded";
        break;
    case SERVE_ERR_MEDIA_TYPE:
        http = 415, t = "invalid_request_error", c = "unsupported_media_type";
        break;
    case FERRY_ERR_BUSY:
        http = 503, t = "server_overloaded", c = "queue_full";
        break;
    case SERVE_ERR_LOADING:
        http = 503, t = "unavailable_error", c = "model_loading";
        break;
    case SERVE_ERR_SHUTDOWN:
    case FERRY_ERR_CANCELLED:
        http = 503, t = "unavailable_error", c = "shutting_down";
        break;
    case FERRY_ERR_TIMEOUT:
        http = 504, t = "timeout_error", c = "request_timeout";
        break;
    case FERRY_ERR_NOMEM:
        http = 503, t = "server_error", c = "out_of_memory";
        break;
    default:
        http = 500, t = "server_error";
        break;
    }
    if (type) *type = t;
    if (code) *code = c;
    return http;
}

char *api_error_body(int status, const char *msg, const char *param, size_t *len)
{
    const char *type, *code;
    api_http_status(status, &type, &code);
    json_t *e = json_object();
    json_object_set_new(e, "message", api_jstr(msg, strlen(msg)));
    json_object_set_new(e, "type", json_string(type));
    json_object_set_new(e, "param", param ? json_string(param) : json_null());
    json_object_set_new(e, "code", code ? json_string(code) : json_null());
    json_t *o = json_object();
    json_object_set_new(o, "error", e);
    return api_dump(o, len);
}

/* ---- field readers: 1 = present, 0 = absent or null, negative = wrong type/range (e filled) ------------ */

int api_get_num(json_t *o, const char *k, double lo, double hi, double *v, struct api_err *e)
{
    json_t *j = json_object_get(o, k);
    if (!j || json_is_null(j)) return 0;
    if (!json_is_number(j)) FAIL(FERRY_ERR_INVALID, k, "'%s' must be a number", k);
    double x = json_number_value(j);
    if (!isfinite(x) || x < lo || x > hi)
        FAIL(FERRY_ERR_INVALID, k, "'%s' must be in [%g, %g], got %g", k, lo, hi, x);
    *v = x;
    return 1;
}

int api_get_int(json_t *o, const char *k, long long lo, long long hi, long long *v, struct api_err *e)
{
    json_t *j = json_object_get(o, k);
    if (!j || json_is_null(j)) return 0;
    long long x;
    if (json_is_integer(j))
        x = json_integer_value(j);
    else if (json_is_real(j) && json_real_value(j) == floor(json_real_value(j)) &&
             fabs(json_real_value(j)) < 9e18)
        x = (long long)json_real_value(j);
    else
        FAIL(FERRY_ERR_INVALID, k, "'%s' must be an integer", k);
    if (x < lo || x > hi) FAIL(FERRY_ERR_INVALID, k, "'%s' must be in [%lld, %lld], got %lld", k, lo, hi, x);
    *v = x;
    return 1;
}

int api_get_bool(json_t *o, const char *k, int *v, struct api_err *e)
{
    json_t *j = json_object_get(o, k);
    if (!j || json_is_null(j)) return 0;
    if (!json_is_boolean(j)) FAIL(FERRY_ERR_INVALID, k, "'%s' must be a boolean", k);
    *v = json_is_true(j);
    return 1;
}

int api_get_str(json_t *o, const char *k, const char **v, struct api_err *e)
{
    json_t *j = json_object_get(o, k);
    if (!j || json_is_null(j)) return 0;
    if (!json_is_string(j)) FAIL(FERRY_ERR_INVALID, k, "'%s' must be a string", k);
    *v = json_string_value(j);
    return 1;
}

#define TRY(x)                                                                                               \
    do {                                                                                                     \
        int rc_ = (x);                                                                                       \
        if (rc_ < 0) goto fail;                                                                              \
    } while (0)

/* Tokenizes text into a malloc'd array. */
int api_encode(const struct api_ctx *a, const char *text, size_t len, int add_bos, int special, int32_t **out,
               int *n_out)
{
    int cap = (int)(len / 2) + 16;
    if (cap > 1 << 22) cap = 1 << 22;
    for (int tries = 0; tries < 2; tries++) {
        int32_t *ids = malloc((size_t)cap * sizeof *ids);
        if (!ids) return FERRY_ERR_NOMEM;
        int n = tokenizer_encode(a->tok, text, len, add_bos, special, ids, cap);
        if (n < 0) {
            free(ids);
            return n;
        }
        if (n <= cap) {
            *out = ids;
            *n_out = n;
            return 0;
        }
        free(ids);
        cap = n;
    }
    return FERRY_ERR_INTERNAL;
}

char *api_decode(const struct api_ctx *a, const int32_t *ids, int n, size_t *len)
{
    char *s = NULL;
    size_t l = 0;
    if (tokenizer_decode(a->tok, ids, n, 0, &s, &l)) {
        oom_mark = 1; /* the ids are valid: only memory can fail */
        return NULL;
    }
    if (len) *len = l;
    return s;
}

uint64_t api_random_seed(void)
{
    static uint64_t counter;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    uint64_t x = (uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 30) ^
                 (__atomic_add_fetch(&counter, 1, __ATOMIC_RELAXED) * 0x9e3779b97f4a7c15ull);
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    return x;
}

/* Reads one prompt of token ids. */
static int parse_token_array(const struct api_ctx *a, json_t *arr, int32_t **out, int *n, struct api_err *e)
{
    size_t m = json_array_size(arr);
    int32_t *ids = malloc((m ? m : 1) * sizeof *ids);
    if (!ids) FAIL(FERRY_ERR_NOMEM, "prompt", "out of memory");
    for (size_t i = 0; i < m; i++) {
        json_t *t = json_array_get(arr, i);
        if (!json_is_integer(t) || json_integer_value(t) < 0 || json_integer_value(t) >= a->n_vocab) {
            free(ids);
            FAIL(FERRY_ERR_INVALID, "prompt", "token ids in 'prompt' must be integers in [0, %d)",
                 a->n_vocab);
        }
        ids[i] = (int32_t)json_integer_value(t);
    }
    *out = ids;
    *n = (int)m;
    return 0;
}

/* Fills r->prompts from a completions "prompt". */
static int parse_prompt(const struct api_ctx *a, struct sreq *r, json_t *p, struct api_err *e)
{
    if (!p || json_is_null(p)) FAIL(FERRY_ERR_INVALID, "prompt", "'prompt' is required");
    json_t *list[API_MAX_PROMPTS];
    int kinds[API_MAX_PROMPTS]; /* 0 string, 1 token array, 2 whole top-level token array */
    int np = 0;
    if (json_is_string(p)) {
        list[0] = p, kinds[0] = 0, np = 1;
    } else if (json_is_array(p)) {
        size_t m = json_array_size(p);
        if (m == 0) FAIL(FERRY_ERR_INVALID, "prompt", "'prompt' must not be empty");
        json_t *first = json_array_get(p, 0);
        if (json_is_integer(first)) {
            list[0] = p, kinds[0] = 1, np = 1;
        } else {
            if (m > API_MAX_PROMPTS)
                FAIL(FERRY_ERR_INVALID, "prompt", "at most %d prompts per request", API_MAX_PROMPTS);
            for (size_t i = 0; i < m; i++) {
                json_t *x = json_array_get(p, i);
                if (json_is_string(x))
                    kinds[np] = 0;
                else if (json_is_array(x) && json_array_size(x) > 0)
                    kinds[np] = 1;
                else
                    FAIL(FERRY_ERR_INVALID, "prompt",
                         "'prompt' must be a string, an array of strings, an array of token ids or an array "
                         "of non-empty arrays of token ids");
                if (np > 0 && kinds[np] != kinds[0]) /* OpenAI's four forms: none of them mixes */
                    FAIL(FERRY_ERR_INVALID, "prompt",
                         "'prompt' mixes strings and arrays of token ids: all its elements must be strings "
                         "or all arrays of token ids");
                list[np++] = x;
            }
        }
    } else {
        FAIL(FERRY_ERR_INVALID, "prompt", "'prompt' must be a string, an array of strings or token ids");
    }
    r->n_prompts = np;
    r->prompts = calloc((size_t)np, sizeof *r->prompts);
    r->prompt_texts = calloc((size_t)np, sizeof *r->prompt_texts);
    r->n_prompt_toks = calloc((size_t)np, sizeof *r->n_prompt_toks);
    if (!r->prompts || !r->prompt_texts || !r->n_prompt_toks) FAIL(FERRY_ERR_NOMEM, NULL, "out of memory");
    for (int i = 0; i < np; i++) {
        if (kinds[i] == 0) {
            const char *s = json_string_value(list[i]);
            size_t len = json_string_length(list[i]);
            int rc =
                api_encode(a, s, len, tokenizer_add_bos(a->tok), 0, &r->prompts[i], &r->n_prompt_toks[i]);
            if (rc) FAIL(rc, "prompt", "cannot tokenize the prompt: %s", ferry_status_str(rc));
            r->prompt_texts[i] = strdup(s);
            if (!r->prompt_texts[i]) FAIL(FERRY_ERR_NOMEM, NULL, "out of memory");
        } else {
            int rc = parse_token_array(a, list[i], &r->prompts[i], &r->n_prompt_toks[i], e);
            if (rc) return rc;
        }
        if (r->n_prompt_toks[i] == 0) FAIL(FERRY_ERR_INVALID, "prompt", "the prompt is empty (0 tokens)");
    }
    return 0;
}

static int parse_stop(struct sreq *r, json_t *j, struct api_err *e)
{
    if (!j || json_is_null(j)) return 0;
    json_t *one[1] = {j};
    json_t **items = one;
    size_t m = 1;
    if (json_is_array(j)) {
        m = json_array_size(j);
        if (m > API_MAX_STOPS) FAIL(FERRY_ERR_INVALID, "stop", "at most %d stop sequences", API_MAX_STOPS);
        items = NULL;
    } else if (!json_is_string(j)) {
        FAIL(FERRY_ERR_INVALID, "stop", "'stop' must be a string or an array of strings");
    }
    r->stops = calloc(m ? m : 1, sizeof *r->stops);
    if (!r->stops) FAIL(FERRY_ERR_NOMEM, NULL, "out of memory");
    for (size_t i = 0; i < m; i++) {
        json_t *x = items ? items[i] : json_array_get(j, i);
        if (!json_is_string(x))
            FAIL(FERRY_ERR_INVALID, "stop", "'stop' must be a string or an array of strings");
        size_t l = json_string_length(x);
        if (l > API_MAX_STOP_LEN)
            FAIL(FERRY_ERR_INVALID, "stop", "stop sequences are at most %d bytes", API_MAX_STOP_LEN);
        if (l == 0 || memchr(json_string_value(x), 0, l)) continue;
        r->stops[r->n_stops] = strdup(json_string_value(x));
        if (!r->stops[r->n_stops]) FAIL(FERRY_ERR_NOMEM, NULL, "out of memory");
        r->n_stops++;
    }
    return 0;
}

static int parse_bias(const struct api_ctx *a, struct sreq *r, json_t *j, struct api_err *e)
{
    if (!j || json_is_null(j)) return 0;
    if (!json_is_object(j))
        FAIL(FERRY_ERR_INVALID, "logit_bias", "'logit_bias' must be an object of token id → bias");
    size_t m = json_object_size(j);
    if (m > API_MAX_BIAS)
        FAIL(FERRY_ERR_INVALID, "logit_bias", "at most %d logit_bias entries", API_MAX_BIAS);
    r->bias = calloc(m ? m : 1, sizeof *r->bias);
    if (!r->bias) FAIL(FERRY_ERR_NOMEM, NULL, "out of memory");
    const char *key;
    json_t *v;
    json_object_foreach(j, key, v)
    {
        char *end;
        long id = strtol(key, &end, 10);
        /* digits only: strtol alone would take " 5" or "+5" as 5 */
        if (*key < '0' || *key > '9' || *end || id < 0 || id >= a->n_vocab)
            FAIL(FERRY_ERR_INVALID, "logit_bias", "logit_bias key '%.40s' is not a token id in [0, %d)", key,
                 a->n_vocab);
        if (!json_is_number(v) || json_number_value(v) < -100 || json_number_value(v) > 100)
            FAIL(FERRY_ERR_INVALID, "logit_bias", "logit_bias values must be numbers in [-100, 100]");
        r->bias[r->n_bias].token = (int32_t)id;
        r->bias[r->n_bias].bias = (float)json_number_value(v);
        r->n_bias++;
    }
    return 0;
}

void api_make_id(char *out, size_t cap, const char *prefix)
{
    uint64_t x = api_random_seed();
    snprintf(out, cap, "%s%016llx", prefix, (unsigned long long)x);
}

int api_parse_request(const struct api_ctx *a, enum sreq_kind kind, const char *body, size_t len,
                      struct sreq **out, struct api_err *e)
{
    *out = NULL;
    memset(e, 0, sizeof *e);
    if (kind == SREQ_RESPONSES) return api_parse_responses(a, body, len, out, e);
    if (kind == SREQ_EMBED) return api_parse_embeddings(a, body, len, out, e);
    if (kind == SREQ_ANTHROPIC) return api_parse_anthropic(a, body, len, out, e);
    json_t *o = api_load_object(body, len, e);
    if (!o) return e->status;
    int rc = api_parse_object(a, kind, o, out, e);
    json_decref(o);
    return rc;
}

/* The numeric fields that go straight into the request: one row each (name, bounds, the int or float they
 * set), read in this order so the first bad one is the one named. */
static const struct num_field {
    const char *name;
    int is_int; /* 1: an int field, else a float */
    double lo, hi;
    size_t off; /* in struct sreq */
} num_fields[] = {
    {"temperature", 0, 0, 2, offsetof(struct sreq, sp.temperature)},
    {"top_p", 0, 0, 1, offsetof(struct sreq, sp.top_p)},
    {"top_k", 1, 0, INT_MAX, offsetof(struct sreq, sp.top_k)},
    {"min_p", 0, 0, 1, offsetof(struct sreq, sp.min_p)},
    {"repetition_penalty", 0, 1e-3, 100, offsetof(struct sreq, sp.repetition_penalty)},
    {"presence_penalty", 0, -2, 2, offsetof(struct sreq, sp.presence_penalty)},
    {"frequency_penalty", 0, -2, 2, offsetof(struct sreq, sp.frequency_penalty)},
    {"n", 1, 1, API_MAX_N, offsetof(struct sreq, n)},
};

int api_parse_object(const struct api_ctx *a, enum sreq_kind kind, json_t *o, struct sreq **out,
                     struct api_err *e)
{
    *out = NULL;
    struct sreq *r = sreq_new();
    if (!r) {
        e->status = FERRY_ERR_NOMEM;
        snprintf(e->msg, sizeof e->msg, "out of memory");
        return e->status;
    }
    r->kind = kind;
    r->sp = sampler_default_params();
    r->sp.temperature = 1.0f;
    r->sp.top_p = 1.0f;
    double d;
    long long ll;
    int b;
    const char *str = NULL;

    if (api_get_str(o, "model", &str, e) < 0) goto fail;
    if (str && !a->any_model && !model_names_match(a->model_name, a->model_aliases, str)) {
        e->status = FERRY_ERR_NOT_FOUND, e->param = "model";
        snprintf(e->msg, sizeof e->msg, "The model '%.100s' does not exist; this server serves '%.100s'", str,
                 a->model_name);
        goto fail;
    }
    str = NULL;
    TRY(api_get_str(o, "user", &str, e));
    for (size_t i = 0; i < sizeof num_fields / sizeof num_fields[0]; i++) {
        const struct num_field *f = &num_fields[i];
        char *dst = (char *)r + f->off;
        if (f->is_int) {
            if (api_get_int(o, f->name, (long long)f->lo, (long long)f->hi, &ll, e) > 0)
                *(int *)dst = (int)ll;
        } else if (api_get_num(o, f->name, f->lo, f->hi, &d, e) > 0) {
            *(float *)dst = (float)d;
        }
        if (e->status) goto fail;
    }
    if (api_get_bool(o, "ignore_eos", &b, e) > 0) r->ignore_eos = b;
    if (e->status) goto fail;
    if (api_get_int(o, "speculative.n_max", 0, SPEC_MAX_DRAFT, &ll, e) > 0) r->spec_n_max = (int)ll;
    if (e->status) goto fail;
    if (api_get_int(o, "speculative.n_min", 0, SPEC_MAX_DRAFT, &ll, e) > 0) r->spec_n_min = (int)ll;
    if (e->status) goto fail;
    if (api_get_num(o, "speculative.p_min", 0, 1, &d, e) > 0) r->spec_p_min = (float)d;
    if (e->status) goto fail;
    if (api_get_bool(o, "stream", &b, e) > 0) r->stream = b;
    if (e->status) goto fail;
    json_t *so = json_object_get(o, "stream_options");
    if (so && !json_is_null(so)) {
        if (!json_is_object(so)) {
            e->status = FERRY_ERR_INVALID, e->param = "stream_options";
            snprintf(e->msg, sizeof e->msg, "'stream_options' must be an object");
            goto fail;
        }
        if (api_get_bool(so, "include_usage", &b, e) > 0) r->include_usage = b;
        if (e->status) goto fail;
    }
    if (api_get_int(o, "seed", LLONG_MIN, LLONG_MAX, &ll, e) > 0)
        r->sp.seed = (uint64_t)ll;
    else if (e->status)
        goto fail;
    else
        r->sp.seed = a->default_seed >= 0 ? (uint64_t)a->default_seed : api_random_seed();
    if (parse_stop(r, json_object_get(o, "stop"), e)) goto fail;
    if (parse_bias(a, r, json_object_get(o, "logit_bias"), e)) goto fail;
    if (kind == SREQ_COMPLETION) {
        json_t *lp = json_object_get(o, "logprobs");
        if (lp && json_is_boolean(lp))
            r->logprobs = json_is_true(lp) ? 0 : -1;
        else if (api_get_int(o, "logprobs", 0, API_MAX_COMPLETION_LOGPROBS, &ll, e) > 0)
            r->logprobs = (int)ll;
        if (e->status) goto fail;
        if (api_get_bool(o, "echo", &b, e) > 0) r->echo = b;
        if (e->status) goto fail;
    } else {
        if (api_get_bool(o, "logprobs", &b, e) > 0 && b) r->logprobs = 0;
        if (e->status) goto fail;
        if (api_get_int(o, "top_logprobs", 0, SCHED_MAX_TOP_LOGPROBS, &ll, e) > 0) {
            if (r->logprobs < 0) {
                e->status = FERRY_ERR_INVALID, e->param = "top_logprobs";
                snprintf(e->msg, sizeof e->msg, "'top_logprobs' needs 'logprobs' set to true");
                goto fail;
            }
            r->logprobs = (int)ll;
        }
        if (e->status) goto fail;
    }
    long long max_tokens = -1;
    if (api_get_int(o, "max_tokens", 0, LLONG_MAX, &ll, e) > 0) max_tokens = ll;
    if (e->status) goto fail;
    if (kind != SREQ_COMPLETION && api_get_int(o, "max_completion_tokens", 0, LLONG_MAX, &ll, e) > 0)
        max_tokens = ll;
    if (e->status) goto fail;

    if (kind == SREQ_COMPLETION) {
        if (parse_prompt(a, r, json_object_get(o, "prompt"), e)) goto fail;
    } else {
        if (api_chat_prompt(a, r, o, json_object_get(o, "messages"), e)) goto fail;
    }
    if (api_output_constraints(a, r, o, e)) goto fail;
    if ((long long)r->n_prompts * r->n > API_MAX_N) {
        e->status = FERRY_ERR_INVALID, e->param = "n";
        snprintf(e->msg, sizeof e->msg, "prompts × n must be at most %d", API_MAX_N);
        goto fail;
    }
    int longest = 0;
    for (int i = 0; i < r->n_prompts; i++) {
        r->prompt_tokens += r->n_prompt_toks[i];
        if (r->n_prompt_toks[i] > longest) longest = r->n_prompt_toks[i];
    }
    if (longest >= a->ctx_size) {
        e->status = SERVE_ERR_CONTEXT, e->param = kind != SREQ_COMPLETION ? "messages" : "prompt";
        snprintf(e->msg, sizeof e->msg,
                 "This model's maximum context length is %d tokens, but the prompt has %d tokens",
                 a->ctx_size, longest);
        goto fail;
    }
    /* compared as max_tokens > room, never longest + max_tokens: a max_tokens near LLONG_MAX would overflow
     */
    if (max_tokens > (long long)a->ctx_size - longest) {
        e->status = SERVE_ERR_CONTEXT,
        e->param = kind != SREQ_COMPLETION && json_object_get(o, "max_completion_tokens")
                       ? "max_completion_tokens"
                       : "max_tokens";
        snprintf(
            e->msg, sizeof e->msg,
            "This model's maximum context length is %d tokens; you requested %d tokens in the prompt and "
            "%lld for the completion (at most %d)",
            a->ctx_size, longest, max_tokens, a->ctx_size - longest);
        goto fail;
    }
    if (max_tokens < 0) {
        max_tokens = a->ctx_size - longest;
        if (kind == SREQ_COMPLETION && max_tokens > 16)
            max_tokens = 16; /* OpenAI's default for completions */
    }
    /* Never fits: one sequence needs prompt + max_tokens KV positions, and the pool is shared by all slots
     * but cannot lend one sequence more than it holds. Refused here, with the numbers, rather than queued
     * forever. */
    if (a->kv_positions > 0 && (long long)longest + max_tokens > a->kv_positions) {
        const int prompt_alone = longest > a->kv_positions;
        e->status = FERRY_ERR_RANGE;
        e->param = prompt_alone ? (kind != SREQ_COMPLETION ? "messages" : "prompt")
                   : kind != SREQ_COMPLETION && json_object_get(o, "max_completion_tokens")
                       ? "max_completion_tokens"
                       : "max_tokens";
        snprintf(e->msg, sizeof e->msg,
                 "this request needs %lld KV positions (prompt %d + max_tokens %lld); the pool holds %d "
                 "(--kv-tokens)",
                 (long long)longest + max_tokens, longest, max_tokens, a->kv_positions);
        goto fail;
    }
    r->max_tokens = (int)max_tokens;

    r->choices = calloc((size_t)r->n_prompts * r->n, sizeof *r->choices);
    if (r->choices) r->n_choices = r->n_prompts * r->n; /* set once there are choices to free */
    if (!r->choices) {
        e->status = FERRY_ERR_NOMEM;
        snprintf(e->msg, sizeof e->msg, "out of memory");
        goto fail;
    }
    for (int i = 0; i < r->n_choices; i++) {
        struct choice *c = &r->choices[i];
        c->req = r;
        c->index = i;
        c->prompt = r->prompts[i / r->n];
        c->n_prompt = r->n_prompt_toks[i / r->n];
        c->slot = -1;
    }
    api_make_id(r->id, sizeof r->id,
                kind == SREQ_CHAT        ? "chatcmpl-"
                : kind == SREQ_RESPONSES ? "resp_"
                : kind == SREQ_ANTHROPIC ? "msg_"
                                         : "cmpl-");
    r->created = (long long)time(NULL);
    r->t_arrival = sched_now();
    r->deadline = a->timeout > 0 ? r->t_arrival + a->timeout : 0;
    *out = r;
    return 0;
fail:
    if (!e->status) e->status = FERRY_ERR_INVALID;
    sched_release(NULL, r);
    return e->status;
}

/* ---- small endpoints -------------------------------------------------------------------------------- */

char *api_models_body(const struct api_ctx *a, const char *only_id, size_t *len)
{
    json_t *m = json_pack("{s:s,s:s,s:I,s:s,s:{s:i,s:i}}", "id", a->model_name, "object", "model", "created",
                          (json_int_t)time(NULL), "owned_by", "ferry", "meta", "n_ctx", a->ctx_size,
                          "n_vocab", a->n_vocab);
    if (only_id) return api_dump(m, len);
    return api_dump(json_pack("{s:s,s:[o]}", "object", "list", "data", m), len);
}

json_t *api_load_object(const char *body, size_t len, struct api_err *e)
{
    json_error_t jerr;
    json_t *o = json_loadb(body, len, 0, &jerr);
    if (!o) {
        e->status = FERRY_ERR_INVALID;
        snprintf(e->msg, sizeof e->msg, "invalid JSON at line %d column %d: %s", jerr.line, jerr.column,
                 jerr.text);
        return NULL;
    }
    if (!json_is_object(o)) {
        json_decref(o);
        e->status = FERRY_ERR_INVALID;
        snprintf(e->msg, sizeof e->msg, "the request body must be a JSON object");
        return NULL;
    }
    return o;
}

/* {"id", "piece"} as llama-server writes it: the piece as a string when its bytes are valid UTF-8, else as
 * the array of its byte values (a byte token, or half of a character). */
static json_t *token_piece_json(const struct api_ctx *a, int32_t id)
{
    size_t len = 0;
    const char *p = tokenizer_piece(a->tok, id, &len);
    if (!p) len = 0;
    size_t m = 0;
    char *clean = utf8_sanitize(p ? p : "", len, &m);
    json_t *piece;
    if (clean && m == len && !memcmp(clean, p ? p : "", len)) {
        piece = json_stringn_nocheck(clean, m);
    } else {
        piece = json_array();
        for (size_t i = 0; i < len; i++) json_array_append_new(piece, json_integer((unsigned char)p[i]));
    }
    free(clean);
    return json_pack("{s:i,s:o}", "id", (int)id, "piece", piece ? piece : json_null());
}

int api_tokenize(const struct api_ctx *a, const char *body, size_t len, char **out, size_t *out_len,
                 struct api_err *e)
{
    memset(e, 0, sizeof *e);
    json_t *o = api_load_object(body, len, e);
    if (!o) return e->status;
    json_t *c = json_object_get(o, "content");
    if (!c) c = json_object_get(o, "prompt");
    int add_special = 0, parse_special = 0, with_pieces = 0;
    if (!json_is_string(c)) {
        json_decref(o);
        FAIL(FERRY_ERR_INVALID, "content", "'content' must be a string");
    }
    if (api_get_bool(o, "add_special", &add_special, e) < 0 ||
        api_get_bool(o, "parse_special", &parse_special, e) < 0 ||
        api_get_bool(o, "with_pieces", &with_pieces, e) < 0) {
        json_decref(o);
        return e->status;
    }
    int32_t *ids = NULL;
    int n = 0;
    int rc = api_encode(a, json_string_value(c), json_string_length(c),
                        add_special && tokenizer_add_bos(a->tok), parse_special, &ids, &n);
    json_decref(o);
    if (rc) FAIL(rc, "content", "cannot tokenize: %s", ferry_status_str(rc));
    json_t *arr = json_array();
    for (int i = 0; i < n; i++)
        json_array_append_new(arr, with_pieces ? token_piece_json(a, ids[i]) : json_integer(ids[i]));
    free(ids);
    *out = api_dump(json_pack("{s:o}", "tokens", arr), out_len);
    return *out ? 0 : FERRY_ERR_NOMEM;
}

int api_detokenize(const struct api_ctx *a, const char *body, size_t len, char **out, size_t *out_len,
                   struct api_err *e)
{
    memset(e, 0, sizeof *e);
    json_t *o = api_load_object(body, len, e);
    if (!o) return e->status;
    json_t *t = json_object_get(o, "tokens");
    if (!json_is_array(t)) {
        json_decref(o);
        FAIL(FERRY_ERR_INVALID, "tokens", "'tokens' must be an array of token ids");
    }
    int32_t *ids = NULL;
    int n = 0;
    if (parse_token_array(a, t, &ids, &n, e)) {
        json_decref(o);
        e->param = "tokens";
        return e->status;
    }
    json_decref(o);
    size_t l = 0;
    char *s = api_decode(a, ids, n, &l);
    free(ids);
    if (!s) FAIL(FERRY_ERR_INTERNAL, NULL, "cannot detokenize");
    *out = api_dump(json_pack("{s:o}", "content", api_jstr(s, l)), out_len);
    free(s);
    return *out ? 0 : FERRY_ERR_NOMEM;
}
