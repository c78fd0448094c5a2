/* embeddings — OpenAI's /v1/embeddings: each input (a string, or token ids) runs through the model once; the
 * final normed hidden states of its positions are pooled (mean, or the last position: --pooling) and scaled
 * to unit length, as OpenAI's embeddings are. encoding_format float or base64 (little-endian float32).
 *
 * Refused with a message: empty inputs, more than 2048 inputs, inputs longer than the context, "dimensions"
 * other than the model's hidden size (these models have no shorter embeddings to give).
 */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernels/core/status.h"
#include "server/api.h"
#include "server/api_impl.h"
#include "server/model_names.h"

#define API_MAX_EMBED_INPUTS 2048

static int add_input(const struct api_ctx *a, struct sreq *r, json_t *x, size_t i, struct api_err *e)
{
    int32_t *ids = NULL;
    int n = 0;
    if (json_is_string(x)) {
        if (json_string_length(x) == 0) FAIL(FERRY_ERR_INVALID, "input", "input[%zu] is an empty string", i);
        int rc = api_encode(a, json_string_value(x), json_string_length(x), tokenizer_add_bos(a->tok), 0,
                            &ids, &n);
        if (rc) FAIL(rc, "input", "cannot tokenize input[%zu]: %s", i, ferry_status_str(rc));
    } else if (json_is_array(x)) {
        size_t m = json_array_size(x);
        if (m == 0) FAIL(FERRY_ERR_INVALID, "input", "input[%zu] is an empty array of token ids", i);
        ids = malloc(m * sizeof *ids);
        if (!ids) FAIL(FERRY_ERR_NOMEM, NULL, "out of memory");
        for (size_t k = 0; k < m; k++) {
            json_t *t = json_array_get(x, k);
            if (!json_is_integer(t) || json_integer_value(t) < 0 || json_integer_value(t) >= a->n_vocab) {
                free(ids);
                FAIL(FERRY_ERR_INVALID, "input", "input[%zu]: token ids must be integers in [0, %d)", i,
                     a->n_vocab);
            }
            ids[k] = (int32_t)json_integer_value(t);
        }
        n = (int)m;
    } else {
        FAIL(FERRY_ERR_INVALID, "input", "'input' must be a string, an array of strings, or token ids");
    }
    if (n == 0 || n >= a->ctx_size) {
        free(ids);
        FAIL(n ? FERRY_ERR_RANGE : FERRY_ERR_INVALID, "input",
             "input[%zu] has %d tokens; this model takes 1 to %d", i, n, a->ctx_size - 1);
    }
    r->prompts[r->n_prompts] = ids;
    r->n_prompt_toks[r->n_prompts] = n;
    r->n_prompts++;
    r->prompt_tokens += n;
    return 0;
}

static int parse(const struct api_ctx *a, json_t *o, struct sreq *r, struct api_err *e)
{
    const char *str = NULL;
    if (api_get_str(o, "model", &str, e) < 0) return e->status;
    if (str && !a->any_model && !model_names_match(a->model_name, a->model_aliases, str))
        FAIL(FERRY_ERR_NOT_FOUND, "model", "The model '%.100s' does not exist; this server serves '%.100s'",
             str, a->model_name);
    const char *fmt = "float";
    if (api_get_str(o, "encoding_format", &fmt, e) < 0) return e->status;
    if (strcmp(fmt, "float") && strcmp(fmt, "base64"))
        FAIL(FERRY_ERR_INVALID, "encoding_format", "'encoding_format' must be 'float' or 'base64'");
    r->embd_base64 = !strcmp(fmt, "base64");
    long long dims;
    int has = api_get_int(o, "dimensions", 1, 1 << 20, &dims, e);
    if (has < 0) return e->status;
    if (has && dims != a->embd_dim)
        FAIL(FERRY_ERR_UNSUPPORTED, "dimensions",
             "'dimensions' %lld is not supported: this model's embeddings have %d dimensions", dims,
             a->embd_dim);
    json_t *in = json_object_get(o, "input");
    json_t *one[1] = {in};
    json_t **items = NULL;
    size_t m = 0;
    if (json_is_string(in) ||
        (json_is_array(in) && json_array_size(in) && json_is_integer(json_array_get(in, 0)))) {
        items = one, m = 1;
    } else if (json_is_array(in) && json_array_size(in)) {
        m = json_array_size(in);
    } else {
        FAIL(FERRY_ERR_INVALID, "input",
             "'input' must be a non-empty string, array of strings, or token ids");
    }
    if (m > API_MAX_EMBED_INPUTS)
        FAIL(FERRY_ERR_INVALID, "input", "at most %d inputs per request", API_MAX_EMBED_INPUTS);
    r->prompts = calloc(m, sizeof *r->prompts);
    r->n_prompt_toks = calloc(m, sizeof *r->n_prompt_toks);
    r->prompt_texts = calloc(m, sizeof *r->prompt_texts);
    if (!r->prompts || !r->n_prompt_toks || !r->prompt_texts) FAIL(FERRY_ERR_NOMEM, NULL, "out of memory");
    for (size_t i = 0; i < m; i++)
        if (add_input(a, r, items ? items[i] : json_array_get(in, i), i, e)) return e->status;
    return 0;
}

int api_parse_embeddings(const struct api_ctx *a, const char *body, size_t len, struct sreq **out,
                         struct api_err *e)
{
    *out = NULL;
    json_t *o = api_load_object(body, len, e);
    if (!o) return e->status;
    struct sreq *r = sreq_new();
    if (!r) {
        json_decref(o);
        FAIL(FERRY_ERR_NOMEM, NULL, "out of memory");
    }
    r->kind = SREQ_EMBED;
    r->pooling = a->pooling;
    r->sp = sampler_default_params();
    int rc = parse(a, o, r, e);
    json_decref(o);
    if (rc) {
        sched_release(NULL, r);
        return rc;
    }
    r->n_choices = r->n_prompts;
    r->choices = calloc((size_t)r->n_choices, sizeof *r->choices);
    if (!r->choices) {
        sched_release(NULL, r);
        FAIL(FERRY_ERR_NOMEM, NULL, "out of memory");
    }
    for (int i = 0; i < r->n_choices; i++) {
        struct choice *c = &r->choices[i];
        c->req = r;
        c->index = i;
        c->prompt = r->prompts[i];
        c->n_prompt = r->n_prompt_toks[i];
        c->slot = -1;
    }
    api_make_id(r->id, sizeof r->id, "embd-");
    r->created = (long long)time(NULL);
    r->t_arrival = sched_now();
    r->deadline = a->timeout > 0 ? r->t_arrival + a->timeout : 0;
    *out = r;
    return 0;
}

static void base64(const unsigned char *p, size_t n, struct strbuf *b)
{
    static const char tab[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    for (size_t i = 0; i < n; i += 3) {
        unsigned v =
            (unsigned)p[i] << 16 | (i + 1 < n ? (unsigned)p[i + 1] << 8 : 0) | (i + 2 < n ? p[i + 2] : 0);
        char q[4] = {tab[v >> 18 & 63], tab[v >> 12 & 63], i + 1 < n ? tab[v >> 6 & 63] : '=',
                     i + 2 < n ? tab[v & 63] : '='};
        strbuf_add(b, q, 4);
    }
}

char *api_embeddings_full(const struct api_ctx *a, struct sreq *r, size_t *len)
{
    json_t *data = json_array();
    const int dim = a->embd_dim;
    float *v = malloc((size_t)dim * sizeof *v);
    if (!v) api_oom_mark(); /* the list would be empty */
    for (int i = 0; v && i < r->n_choices; i++) {
        const struct choice *c = &r->choices[i];
        double norm = 0;
        for (int d = 0; d < dim; d++) norm += (double)c->embd[d] * c->embd[d];
        const float scale = norm > 0 ? (float)(1.0 / sqrt(norm)) : 0.0f;
        for (int d = 0; d < dim; d++) v[d] = c->embd[d] * scale;
        json_t *emb;
        if (r->embd_base64) {
            struct strbuf b = {0};
            base64((const unsigned char *)v, (size_t)dim * sizeof *v, &b); /* little-endian hosts only */
            if (b.oom) api_oom_mark();
            emb = b.p && !b.oom ? json_string(b.p) : json_null();
            strbuf_free(&b);
        } else {
            emb = json_array();
            for (int d = 0; d < dim; d++) json_array_append_new(emb, json_real(v[d]));
        }
        json_array_append_new(
            data, json_pack("{s:s,s:i,s:o}", "object", "embedding", "index", i, "embedding", emb));
    }
    free(v);
    json_t *o = json_pack("{s:s,s:o,s:s,s:{s:i,s:i}}", "object", "list", "data", data, "model", a->model_name,
                          "usage", "prompt_tokens", r->prompt_tokens, "total_tokens", r->prompt_tokens);
    return api_dump(o, len);
}
