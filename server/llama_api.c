/* llama_api — llama-server's native endpoints, so that its clients (web UIs, editor plugins, scripts) work
 * unchanged: POST /completion and /infill (answered in llama-server's shape, whole or as `data:` chunks
 * without [DONE]), GET /props and GET /slots (read-only).
 *
 * A /completion request becomes a completions request: the prompt (text, token ids, ids and text mixed in one
 * sequence, {"prompt_string": ...}, or a list of those) is tokenized here the way llama-server does (special
 * tokens parsed, BOS added before text that starts a prompt); n_predict -1 runs to the end of the context;
 * sampling defaults are llama-server's (temperature 0.8, top_k 40, top_p 0.95, min_p 0.05). /infill builds
 * [extra chunks][FIM_PRE]prefix prompt[FIM_SUF]suffix[FIM_MID] from the vocabulary's fill-in-the-middle
 * tokens. Fields ferry cannot honour (mirostat, DRY, XTC, typical_p, sampler order, slots, ...) are refused
 * by name when they ask for something other than llama-server's default, never ignored. Token ids and n_probs
 * come from the request's logprobs, which every /completion request records.
 */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/core/status.h"
#include "server/api.h"
#include "server/api_impl.h"

#define LLAMA_MAX_PROMPTS 64

/* ---- request ---------------------------------------------------------------------------------------- */

/* llama-server's fields that ferry has no such control for: accepted at their default value only. */
static const struct {
    const char *name;
    double dflt;
} llama_fixed[] = {
    {"typical_p", 1.0},       {"adaptive_target", -1.0}, {"mirostat", 0.0},       {"dry_multiplier", 0.0},
    {"xtc_probability", 0.0}, {"top_n_sigma", -1.0},     {"dynatemp_range", 0.0}, {"n_keep", 0.0},
    {"n_discard", 0.0},       {"id_slot", -1.0},         {"n_indent", 0.0},       {"t_max_predict_ms", 0.0},
    {"n_cmpl", 1.0},
};
/* ... and booleans that must be false. */
static const char *const llama_off[] = {"post_sampling_probs", "timings_per_token", "return_progress",
                                        "backend_sampling", NULL};

static int refuse_unsupported(json_t *o, struct api_err *e)
{
    for (size_t i = 0; i < sizeof llama_fixed / sizeof llama_fixed[0]; i++) {
        json_t *v = json_object_get(o, llama_fixed[i].name);
        if (!v || json_is_null(v)) continue;
        if (!json_is_number(v) || fabs(json_number_value(v) - llama_fixed[i].dflt) > 1e-9)
            FAIL(FERRY_ERR_UNSUPPORTED, llama_fixed[i].name,
                 "'%s' is not supported by this server (only its default, %g, is accepted)",
                 llama_fixed[i].name, llama_fixed[i].dflt);
    }
    for (int i = 0; llama_off[i]; i++) {
        json_t *v = json_object_get(o, llama_off[i]);
        if (v && !json_is_null(v) && !json_is_false(v))
            FAIL(FERRY_ERR_UNSUPPORTED, llama_off[i], "'%s' is not supported by this server", llama_off[i]);
    }
    static const char *const never[] = {"samplers", "lora", "slot_id", NULL};
    for (int i = 0; never[i]; i++) {
        json_t *v = json_object_get(o, never[i]);
        if (v && !json_is_null(v) && !(json_is_array(v) && json_array_size(v) == 0))
            FAIL(FERRY_ERR_UNSUPPORTED, never[i],
                 "'%s' is not supported by this server (its sampler order is fixed: penalties, temperature, "
                 "top_k, top_p, min_p)",
                 never[i]);
    }
    /* penalties look at the whole history here: a shorter window would change them */
    json_t *rl = json_object_get(o, "repeat_last_n");
    const int penalised = (json_is_number(json_object_get(o, "repeat_penalty")) &&
                           json_number_value(json_object_get(o, "repeat_penalty")) != 1.0) ||
                          (json_is_number(json_object_get(o, "presence_penalty")) &&
                           json_number_value(json_object_get(o, "presence_penalty")) != 0.0) ||
                          (json_is_number(json_object_get(o, "frequency_penalty")) &&
                           json_number_value(json_object_get(o, "frequency_penalty")) != 0.0);
    if (penalised && json_is_number(rl) && json_number_value(rl) != -1)
        FAIL(FERRY_ERR_UNSUPPORTED, "repeat_last_n",
             "'repeat_last_n' other than -1 is not supported: penalties here count the whole history");
    return 0;
}

/* Appends the tokens of text (special tokens parsed; BOS first when `first` and the model adds one). */
static int add_text(const struct api_ctx *a, const char *s, size_t n, int bos, json_t *ids, struct api_err *e)
{
    int32_t *t = NULL;
    int nt = 0;
    int rc = api_encode(a, s, n, bos, 1, &t, &nt);
    if (rc) FAIL(rc, "prompt", "cannot tokenize the prompt: %s", ferry_status_str(rc));
    for (int i = 0; i < nt; i++) json_array_append_new(ids, json_integer(t[i]));
    free(t);
    return 0;
}

/* One prompt (a string, ids, ids and strings mixed, or {"prompt_string"}) → an array of token ids. */
static int one_prompt(const struct api_ctx *a, json_t *p, json_t **out, struct api_err *e)
{
    *out = json_array();
    const int bos = tokenizer_add_bos(a->tok);
    if (json_is_object(p)) {
        if (json_object_get(p, "multimodal_data"))
            FAIL(FERRY_ERR_UNSUPPORTED, "prompt",
                 "multimodal_data is not supported (this server runs text models)");
        p = json_object_get(p, "prompt_string");
        if (!json_is_string(p)) FAIL(FERRY_ERR_INVALID, "prompt", "a prompt object needs a 'prompt_string'");
    }
    if (json_is_string(p)) return add_text(a, json_string_value(p), json_string_length(p), bos, *out, e);
    if (!json_is_array(p))
        FAIL(FERRY_ERR_INVALID, "prompt", "'prompt' must be a string, token ids, or a list of prompts");
    size_t i;
    json_t *x;
    json_array_foreach(p, i, x)
    {
        if (json_is_integer(x)) {
            if (json_integer_value(x) < 0 || json_integer_value(x) >= a->n_vocab)
                FAIL(FERRY_ERR_INVALID, "prompt", "token ids in 'prompt' must be in [0, %d)", a->n_vocab);
            json_array_append(*out, x);
        } else if (json_is_string(x)) {
            if (add_text(a, json_string_value(x), json_string_length(x), bos && i == 0, *out, e))
                return e->status;
        } else {
            FAIL(FERRY_ERR_INVALID, "prompt", "a prompt sequence holds token ids and strings only");
        }
    }
    return 0;
}

/* The prompts of a request: a list of prompts when the top level is an array of non-integers. */
static int prompts_of(const struct api_ctx *a, json_t *p, json_t **out, struct api_err *e)
{
    *out = json_array();
    if (!p || json_is_null(p)) FAIL(FERRY_ERR_INVALID, "prompt", "'prompt' is required");
    int list = json_is_array(p) && json_array_size(p) > 0 && !json_is_integer(json_array_get(p, 0));
    if (list) { /* [ids, "text", {...}] is several prompts; [1, 2, "text"] is one */
        size_t i;
        json_t *x;
        json_array_foreach(p, i, x) if (json_is_integer(x)) list = 0;
    }
    if (list && json_array_size(p) > LLAMA_MAX_PROMPTS)
        FAIL(FERRY_ERR_INVALID, "prompt", "at most %d prompts per request", LLAMA_MAX_PROMPTS);
    size_t n = list ? json_array_size(p) : 1;
    for (size_t i = 0; i < n; i++) {
        json_t *ids;
        int rc = one_prompt(a, list ? json_array_get(p, i) : p, &ids, e);
        json_array_append_new(*out, ids);
        if (rc) return rc;
        if (json_array_size(ids) == 0) FAIL(FERRY_ERR_INVALID, "prompt", "the prompt is empty (0 tokens)");
    }
    return 0;
}

/* A fill-in-the-middle token of the vocabulary, by the spellings model families use; -1 when none. */
static int32_t fim_token(const struct api_ctx *a, const char *const *names)
{
    for (int i = 0; names[i]; i++) {
        int32_t id = tokenizer_find(a->tok, names[i], strlen(names[i]));
        if (id >= 0) return id;
    }
    return -1;
}

static const char *const fim_pre[] = {"<|fim_prefix|>", "<fim_prefix>", "<fim-prefix>",
                                      "<PRE>",          "▁<PRE>",       NULL};
static const char *const fim_suf[] = {"<|fim_suffix|>", "<fim_suffix>", "<fim-suffix>",
                                      "<SUF>",          "▁<SUF>",       NULL};
static const char *const fim_mid[] = {"<|fim_middle|>", "<fim_middle>", "<fim-middle>",
                                      "<MID>",          "▁<MID>",       NULL};
static const char *const fim_rep[] = {"<|repo_name|>", "<repo_name>", "<reponame>", NULL};
static const char *const fim_sep[] = {"<|file_sep|>", "<file_sep>", "<filename>", NULL};

static int add_plain(const struct api_ctx *a, const char *s, json_t *ids, struct api_err *e)
{
    return add_text(a, s, strlen(s), 0, ids, e);
}

/* /infill: [FIM_REP]myproject\n [FIM_SEP]file\n text ... [FIM_SEP]filename\n [BOS] [FIM_PRE]prefix prompt
 * [FIM_SUF]suffix [FIM_MID] (llama-server's repo-level layout, whole: nothing is cut to a batch). */
static int infill_prompt(const struct api_ctx *a, json_t *o, json_t **out, struct api_err *e)
{
    *out = json_array();
    int32_t pre = fim_token(a, fim_pre), suf = fim_token(a, fim_suf), mid = fim_token(a, fim_mid);
    if (pre < 0 || suf < 0 || mid < 0)
        FAIL(FERRY_ERR_UNSUPPORTED, NULL,
             "/infill needs a model whose vocabulary has fill-in-the-middle tokens (prefix, suffix, middle); "
             "this one has none");
    int32_t rep = fim_token(a, fim_rep), sep = fim_token(a, fim_sep);
    json_t *prefix = json_object_get(o, "input_prefix"), *suffix = json_object_get(o, "input_suffix");
    json_t *extra = json_object_get(o, "input_extra"), *prompt = json_object_get(o, "prompt");
    if ((prefix && !json_is_string(prefix)) || (suffix && !json_is_string(suffix)) ||
        (prompt && !json_is_null(prompt) && !json_is_string(prompt)))
        FAIL(FERRY_ERR_INVALID, "input_prefix",
             "'input_prefix', 'input_suffix' and 'prompt' must be strings");
    if (extra && !json_is_null(extra) && !json_is_array(extra))
        FAIL(FERRY_ERR_INVALID, "input_extra", "'input_extra' must be an array of {filename, text}");
    json_t *ids = *out;
    if (rep >= 0) {
        json_array_append_new(ids, json_integer(rep));
        if (add_plain(a, "myproject\n", ids, e)) return e->status;
    }
    size_t i;
    json_t *ch;
    json_array_foreach(extra, i, ch)
    {
        const char *text = json_string_value(json_object_get(ch, "text"));
        const char *file = json_string_value(json_object_get(ch, "filename"));
        if (!json_is_object(ch) || !text)
            FAIL(FERRY_ERR_INVALID, "input_extra", "input_extra[%zu] must be {\"filename\", \"text\"}", i);
        if (sep >= 0) {
            json_array_append_new(ids, json_integer(sep));
            char name[300];
            snprintf(name, sizeof name, "%.250s\n", file ? file : "tmp");
            if (add_plain(a, name, ids, e)) return e->status;
        } else if (add_plain(a, "\n\n--- snippet ---\n\n", ids, e)) {
            return e->status;
        }
        if (add_plain(a, text, ids, e)) return e->status;
    }
    if (sep >= 0) {
        json_array_append_new(ids, json_integer(sep));
        if (add_plain(a, "filename\n", ids, e)) return e->status;
    }
    int32_t bos = tokenizer_bos(a->tok);
    if (tokenizer_add_bos(a->tok) && bos >= 0) json_array_append_new(ids, json_integer(bos));
    json_array_append_new(ids, json_integer(pre));
    if (prefix && add_plain(a, json_string_value(prefix), ids, e)) return e->status;
    if (json_is_string(prompt) && add_plain(a, json_string_value(prompt), ids, e)) return e->status;
    json_array_append_new(ids, json_integer(suf));
    if (suffix && add_plain(a, json_string_value(suffix), ids, e)) return e->status;
    json_array_append_new(ids, json_integer(mid));
    return 0;
}

/* llama-server's logit_bias: {"id" or "text": bias} or [[id or text, bias or false], ...] (false bans the
 * token; text biases each of its tokens) → OpenAI's object. */
static int bias_entry(const struct api_ctx *a, json_t *what, json_t *bias, json_t *obj, struct api_err *e)
{
    if (!(json_is_number(bias) || json_is_false(bias)))
        FAIL(FERRY_ERR_INVALID, "logit_bias", "logit_bias values must be numbers or false");
    double b = json_is_false(bias) ? -100 : json_number_value(bias);
    b = b < -100 ? -100 : b > 100 ? 100 : b;
    json_t *ids = json_array();
    if (json_is_integer(what)) {
        json_array_append(ids, what);
    } else if (json_is_string(what)) {
        if (add_text(a, json_string_value(what), json_string_length(what), 0, ids, e)) {
            json_decref(ids);
            return e->status;
        }
    } else {
        json_decref(ids);
        FAIL(FERRY_ERR_INVALID, "logit_bias", "logit_bias keys must be token ids or strings");
    }
    size_t k;
    json_t *id;
    json_array_foreach(ids, k, id)
    {
        char key[24];
        snprintf(key, sizeof key, "%lld", (long long)json_integer_value(id));
        json_object_set_new(obj, key, json_real(b));
    }
    json_decref(ids);
    return 0;
}

static int convert_bias(const struct api_ctx *a, json_t *lb, json_t *dst, struct api_err *e)
{
    if (!lb || json_is_null(lb)) return 0;
    json_t *obj = json_object();
    json_object_set_new(dst, "logit_bias", obj);
    if (json_is_object(lb)) {
        const char *k;
        json_t *v;
        json_object_foreach(lb, k, v)
        {
            char *end;
            long long id = strtoll(k, &end, 10);
            json_t *what = *k && !*end ? json_integer(id) : json_string(k);
            int rc = bias_entry(a, what, v, obj, e);
            json_decref(what);
            if (rc) return rc;
        }
        return 0;
    }
    if (!json_is_array(lb))
        FAIL(FERRY_ERR_INVALID, "logit_bias", "'logit_bias' must be an object or an array");
    size_t i;
    json_t *pair;
    json_array_foreach(lb, i, pair)
    {
        if (!json_is_array(pair) || json_array_size(pair) != 2)
            FAIL(FERRY_ERR_INVALID, "logit_bias", "logit_bias[%zu] must be [token id or text, bias or false]",
                 i);
        if (bias_entry(a, json_array_get(pair, 0), json_array_get(pair, 1), obj, e)) return e->status;
    }
    return 0;
}

int api_parse_llama(const struct api_ctx *a, int infill, const char *body, size_t len, struct sreq **out,
                    struct api_err *e)
{
    *out = NULL;
    memset(e, 0, sizeof *e);
    json_t *o = api_load_object(body, len, e);
    if (!o) return e->status;
    json_t *c = json_object(), *prompts = NULL;
    int rc = refuse_unsupported(o, e);
    if (!rc) {
        if (infill) {
            json_t *ids;
            rc = infill_prompt(a, o, &ids, e);
            prompts = json_array();
            json_array_append_new(prompts, ids);
        } else {
            rc = prompts_of(a, json_object_get(o, "prompt"), &prompts, e);
        }
    }
    /* sampling: llama-server's defaults, then the request's fields under their OpenAI names */
    json_object_set_new(c, "temperature", json_real(0.8));
    json_object_set_new(c, "top_k", json_integer(40));
    json_object_set_new(c, "top_p", json_real(0.95));
    json_object_set_new(c, "min_p", json_real(0.05));
    static const char *const copied[][2] = {
        {"temperature", "temperature"},
        {"top_k", "top_k"},
        {"top_p", "top_p"},
        {"min_p", "min_p"},
        {"repeat_penalty", "repetition_penalty"},
        {"presence_penalty", "presence_penalty"},
        {"frequency_penalty", "frequency_penalty"},
        {"seed", "seed"},
        {"stream", "stream"},
        {"stop", "stop"},
        {"ignore_eos", "ignore_eos"},
        {"json_schema", "json_schema"},
        {"response_format", "response_format"},
        {"grammar", "grammar"},
        {"speculative.n_max", "speculative.n_max"},
        {"speculative.n_min", "speculative.n_min"},
        {"speculative.p_min", "speculative.p_min"},
    };
    for (size_t k = 0; !rc && k < sizeof copied / sizeof copied[0]; k++) {
        json_t *v = json_object_get(o, copied[k][0]);
        if (v && !json_is_null(v)) json_object_set(c, copied[k][1], v);
    }
    json_t *seed = json_object_get(c, "seed"); /* llama-server's -1 (and 0xFFFFFFFF) mean "random" */
    if (json_is_integer(seed) && (json_integer_value(seed) == -1 || json_integer_value(seed) == 0xFFFFFFFFLL))
        json_object_del(c, "seed");
    if (!rc) rc = convert_bias(a, json_object_get(o, "logit_bias"), c, e);
    long long n_predict = -1, n_probs = 0;
    int return_tokens = 0;
    if (!rc && api_get_int(o, "n_predict", -1, 1 << 30, &n_predict, e) < 0) rc = e->status;
    if (!rc && json_object_get(o, "max_tokens") &&
        api_get_int(o, "max_tokens", -1, 1 << 30, &n_predict, e) < 0)
        rc = e->status;
    if (!rc && api_get_int(o, "n_probs", 0, SCHED_MAX_TOP_LOGPROBS, &n_probs, e) < 0) rc = e->status;
    if (!rc && api_get_bool(o, "return_tokens", &return_tokens, e) < 0) rc = e->status;
    /* cache_prompt false: this request neither reuses nor records the prompt cache. Either way the answer is
     * the same only where a row's logits do not depend on the step around it: always with the int8
     * arithmetic, else under --deterministic (runtime/engine.h; docs/api-llama-server.md). */
    int cache_prompt = 1;
    if (!rc && api_get_bool(o, "cache_prompt", &cache_prompt, e) < 0) rc = e->status;
    json_t *fields = json_object_get(o, "response_fields");
    if (!rc && fields && !json_is_null(fields)) {
        size_t i;
        json_t *f;
        int ok = json_is_array(fields);
        json_array_foreach(fields, i, f) ok &= json_is_string(f);
        if (!ok) {
            e->status = rc = FERRY_ERR_INVALID, e->param = "response_fields";
            snprintf(e->msg, sizeof e->msg, "'response_fields' must be an array of strings");
        }
    }
    if (!rc) {
        /* n_predict -1: to the end of the context (and of the KV pool a sequence can take) */
        size_t longest = 0, i;
        json_t *p;
        json_array_foreach(prompts, i, p) if (json_array_size(p) > longest) longest = json_array_size(p);
        long long room = (long long)a->ctx_size - (long long)longest;
        if (a->kv_positions > 0 && (long long)a->kv_positions - (long long)longest < room)
            room = (long long)a->kv_positions - (long long)longest;
        long long mt = n_predict < 0 ? (room > 0 ? room : 0) : n_predict;
        json_object_set_new(c, "max_tokens", json_integer(mt));
        json_object_set_new(c, "prompt", json_incref(prompts));
        json_object_set_new(c, "logprobs", json_integer(0)); /* every token's id is recorded */
        rc = api_parse_object(a, SREQ_COMPLETION, c, out, e);
    }
    if (!rc) {
        struct sreq *r = *out;
        r->kind = SREQ_LLAMA;
        r->logprobs = (int)n_probs;
        r->no_prompt_cache = !cache_prompt;
        /* what the answers repeat: generation_settings and the request's own choices */
        json_t *gs = json_pack(
            "{s:I,s:f,s:i,s:f,s:f,s:f,s:f,s:f,s:I,s:I,s:b,s:I,s:b,s:b,s:s,s:f,s:i,s:f,s:f,s:f,s:i,s:i,s:[s,s,"
            "s,s,"
            "s]}",
            "seed", (json_int_t)(r->sp.seed & 0xFFFFFFFFu), "temperature", (double)r->sp.temperature, "top_k",
            r->sp.top_k, "top_p", (double)r->sp.top_p, "min_p", (double)r->sp.min_p, "repeat_penalty",
            (double)r->sp.repetition_penalty, "presence_penalty", (double)r->sp.presence_penalty,
            "frequency_penalty", (double)r->sp.frequency_penalty, "n_predict", (json_int_t)n_predict,
            "max_tokens", (json_int_t)n_predict, "stream", r->stream, "n_probs", (json_int_t)n_probs,
            "ignore_eos", r->ignore_eos, "cache_prompt", cache_prompt, "grammar", "", "typical_p", 1.0,
            "mirostat", 0, "dry_multiplier", 0.0, "xtc_probability", 0.0, "top_n_sigma", -1.0, "n_keep", 0,
            "repeat_last_n", -1, "samplers", "penalties", "temperature", "top_k", "top_p", "min_p");
        json_object_set_new(gs, "adaptive_target", json_real(-1.0));
        json_object_set_new(gs, "adaptive_decay", json_real(0.9));
        json_t *stops = json_array();
        for (int i = 0; i < r->n_stops; i++) json_array_append_new(stops, json_string(r->stops[i]));
        json_object_set_new(gs, "stop", stops);
        json_t *echo = json_pack("{s:o,s:b,s:O?}", "generation_settings", gs, "return_tokens", return_tokens,
                                 "response_fields", fields && json_is_array(fields) ? fields : NULL);
        r->echo_json = json_dumps(echo, JSON_COMPACT);
        json_decref(echo);
        if (!r->echo_json) {
            sched_release(NULL, r);
            *out = NULL;
            e->status = rc = FERRY_ERR_NOMEM;
            snprintf(e->msg, sizeof e->msg, "out of memory");
        }
    }
    if (rc && e->param && !strcmp(e->param, "max_tokens")) e->param = "n_predict";
    if (rc && e->param && !strcmp(e->param, "repetition_penalty")) e->param = "repeat_penalty";
    json_decref(prompts);
    json_decref(c);
    json_decref(o);
    return rc;
}

/* ---- answer ------------------------------------------------------------------------------------------ */

static char *piece(const struct api_ctx *a, int32_t id, size_t *len)
{
    char *s = NULL;
    if (tokenizer_decode(a->tok, &id, 1, 0, &s, len) || !s) {
        api_oom_mark();
        *len = 0;
        return NULL;
    }
    return s;
}

static json_t *bytes_of(const char *s, size_t n)
{
    json_t *b = json_array();
    for (size_t i = 0; i < n; i++) json_array_append_new(b, json_integer((unsigned char)s[i]));
    return b;
}

/* {id, token, bytes, logprob} of one token (llama-server's form). */
static json_t *prob_entry(const struct api_ctx *a, int32_t id, float lp)
{
    size_t l;
    char *t = piece(a, id, &l);
    json_t *o = json_pack("{s:i,s:o,s:o,s:f}", "id", (int)id, "token", api_jstr(t, l), "bytes",
                          bytes_of(t ? t : "", l), "logprob", (double)lp);
    free(t);
    return o;
}

static json_t *probs_json(const struct api_ctx *a, const struct choice *c, int from, int to)
{
    json_t *arr = json_array();
    for (int i = from; i < to; i++) {
        const struct lp_entry *le = &c->lps[i];
        json_t *e = prob_entry(a, le->id, le->lp), *top = json_array();
        for (int k = 0; k < le->n_top; k++)
            json_array_append_new(top, prob_entry(a, le->top_id[k], le->top_lp[k]));
        json_object_set_new(e, "top_logprobs", top);
        json_array_append_new(arr, e);
    }
    return arr;
}

static json_t *token_ids(const struct choice *c, int from, int to)
{
    json_t *arr = json_array();
    for (int i = from; i < to; i++) json_array_append_new(arr, json_integer(c->lps[i].id));
    return arr;
}

static json_t *timings(const struct sreq *r, const struct choice *c)
{
    const int prompt_n = c->n_prompt - c->n_cached, pred_n = c->n_completion;
    const double t_first = c->t_first > 0 ? c->t_first : c->t_last;
    const double prompt_ms = t_first > r->t_arrival ? (t_first - r->t_arrival) * 1e3 : 0;
    const double pred_ms = c->t_last > t_first ? (c->t_last - t_first) * 1e3 : 0;
    return json_pack("{s:i,s:i,s:f,s:f,s:f,s:i,s:f,s:f,s:f}", "cache_n", c->n_cached, "prompt_n", prompt_n,
                     "prompt_ms", prompt_ms, "prompt_per_token_ms", prompt_n ? prompt_ms / prompt_n : 0.0,
                     "prompt_per_second", prompt_ms > 0 ? prompt_n * 1e3 / prompt_ms : 0.0, "predicted_n",
                     pred_n, "predicted_ms", pred_ms, "predicted_per_token_ms",
                     pred_n > 1 ? pred_ms / (pred_n - 1) : 0.0, "predicted_per_second",
                     pred_ms > 0 ? (pred_n - 1) * 1e3 / pred_ms : 0.0);
}

static const char *stop_type(const struct sreq *r, const struct choice *c)
{
    if (!c->finish || r->cancelled || r->error) return "none";
    if (!strcmp(c->finish, "length")) return "limit";
    return c->stop_hit > 0 && c->stop_hit <= r->n_stops ? "word" : "eos";
}

/* Picks "a/b" paths out of res (llama-server's response_fields): a flat object keyed by the paths found. */
static json_t *pick_fields(json_t *res, json_t *fields)
{
    json_t *out = json_object();
    size_t i;
    json_t *f;
    json_array_foreach(fields, i, f)
    {
        const char *path = json_string_value(f);
        json_t *v = res;
        char part[128];
        for (const char *p = path; v && *p;) {
            size_t n = strcspn(p, "/");
            snprintf(part, sizeof part, "%.*s", (int)(n < sizeof part - 1 ? n : sizeof part - 1), p);
            v = json_object_get(v, part);
            p += n + (p[n] == '/');
        }
        if (v) json_object_set(out, path, v);
    }
    json_decref(res);
    return out;
}

/* The final object of choice c (content: its whole text, or "" for a stream's last chunk). */
static json_t *final_obj(const struct api_ctx *a, const struct sreq *r, const struct choice *c, json_t *echo,
                         int stream)
{
    size_t pl = 0;
    char *prompt = NULL;
    if (tokenizer_decode(a->tok, c->prompt, c->n_prompt, 1, &prompt, &pl)) api_oom_mark();
    const char *text = c->text ? c->text : "";
    const int hit = c->stop_hit > 0 && c->stop_hit <= r->n_stops;
    json_t *o = json_pack(
        "{s:i,s:o,s:o,s:i,s:b,s:s,s:i,s:i,s:O,s:o,s:b,s:b,s:s,s:s,s:i,s:o}", "index", c->index, "content",
        stream ? json_string("") : api_jstr(text, c->text_len), "tokens",
        json_is_true(json_object_get(echo, "return_tokens")) && !stream ? token_ids(c, 0, c->n_lps)
                                                                        : json_array(),
        "id_slot", -1, "stop", 1, "model", a->model_name, "tokens_predicted", c->n_completion,
        "tokens_evaluated", c->n_prompt, "generation_settings", json_object_get(echo, "generation_settings"),
        "prompt", api_jstr(prompt, pl), "has_new_line", memchr(text, '\n', c->text_len) != NULL, "truncated",
        0, "stop_type", stop_type(r, c), "stopping_word", hit ? r->stops[c->stop_hit - 1] : "",
        "tokens_cached", c->n_prompt + c->n_completion, "timings", timings(r, c));
    free(prompt);
    if (!stream && r->logprobs > 0)
        json_object_set_new(o, "completion_probabilities", probs_json(a, c, 0, c->n_lps));
    json_t *fields = json_object_get(echo, "response_fields");
    if (json_array_size(fields)) o = pick_fields(o, fields);
    return o;
}

char *api_llama_full(const struct api_ctx *a, struct sreq *r, size_t *len)
{
    json_t *echo = json_loads(r->echo_json ? r->echo_json : "{}", 0, NULL);
    if (!echo) api_oom_mark();
    json_t *res;
    if (r->n_choices == 1) {
        res = final_obj(a, r, &r->choices[0], echo, 0);
    } else { /* several prompts: a list, as llama-server answers them */
        res = json_array();
        for (int i = 0; i < r->n_choices; i++)
            json_array_append_new(res, final_obj(a, r, &r->choices[i], echo, 0));
    }
    json_decref(echo);
    return api_dump(res, len);
}

static void chunk(struct strbuf *out, json_t *o)
{
    api_sse_event(out, NULL, o);
}

void api_llama_stream(const struct api_ctx *a, struct sreq *r, struct strbuf *out, int *done)
{
    *done = 0;
    json_t *echo = NULL;
    for (int i = 0; i < r->n_choices; i++) {
        struct choice *c = &r->choices[i];
        if (c->finish_sent) continue;
        /* new tokens (and the text they released) since the last chunk */
        /* one chunk per new token, as llama-server sends them; the text released since the last chunk rides
         * on the last one (text that may still become a stop string is held back until it cannot) */
        for (int k = c->lps_sent; k < c->n_lps || (k == c->lps_sent && c->text_len > c->sent); k++) {
            const int last = k + 1 >= c->n_lps, to = k < c->n_lps ? k + 1 : k;
            json_t *o = json_pack("{s:i,s:o,s:o,s:b,s:i,s:i,s:i}", "index", c->index, "content",
                                  last ? api_jstr(c->text + c->sent, c->text_len - c->sent) : json_string(""),
                                  "tokens", token_ids(c, k, to), "stop", 0, "id_slot", -1, "tokens_predicted",
                                  c->n_completion - (c->n_lps - to), "tokens_evaluated", c->n_prompt);
            if (r->logprobs > 0) json_object_set_new(o, "completion_probabilities", probs_json(a, c, k, to));
            chunk(out, o);
            if (last) c->sent = c->text_len;
        }
        c->lps_sent = c->n_lps;
        if (c->state == CHOICE_DONE) {
            if (!echo) echo = json_loads(r->echo_json ? r->echo_json : "{}", 0, NULL);
            if (r->cancelled || r->error) {
                const char *type;
                api_http_status(r->error ? r->error : r->cancelled, &type, NULL);
                chunk(out, json_pack("{s:{s:s,s:s}}", "error", "message",
                                     r->error ? r->errmsg : "the request was cancelled or timed out", "type",
                                     type));
            } else {
                chunk(out, final_obj(a, r, c, echo, 1));
            }
            c->finish_sent = 1;
        }
    }
    json_decref(echo);
    *done = r->n_done == r->n_choices;
}

/* POST /chat/completions/input_tokens: {"input_tokens": N}, the chat's prompt as the model would see it. */
int api_chat_input_tokens(const struct api_ctx *a, const char *body, size_t len, char **out, size_t *out_len,
                          struct api_err *e)
{
    memset(e, 0, sizeof *e);
    json_t *o = api_load_object(body, len, e);
    if (!o) return e->status;
    static const char *const dropped[] = {"max_tokens", "max_completion_tokens", "stream", "n", NULL};
    for (int i = 0; dropped[i]; i++) json_object_del(o, dropped[i]);
    struct sreq *r = NULL;
    int rc = api_parse_object(a, SREQ_CHAT, o, &r, e);
    json_decref(o);
    if (rc) return rc;
    *out = api_dump(json_pack("{s:i}", "input_tokens", r->prompt_tokens), out_len);
    sched_release(NULL, r);
    return *out ? 0 : FERRY_ERR_NOMEM;
}

/* ---- GET /props, GET /slots ------------------------------------------------------------------------------
 */

static json_t *default_params(const struct api_ctx *a)
{
    return json_pack("{s:I,s:f,s:i,s:f,s:f,s:f,s:f,s:f,s:i,s:i,s:b,s:i,s:b,s:[s,s,s,s,s]}", "seed",
                     (json_int_t)(a->default_seed >= 0 ? a->default_seed : 0xFFFFFFFFLL), "temperature", 0.8,
                     "top_k", 40, "top_p", 0.95, "min_p", 0.05, "repeat_penalty", 1.0, "presence_penalty",
                     0.0, "frequency_penalty", 0.0, "n_predict", -1, "max_tokens", -1, "stream", 0, "n_probs",
                     0, "ignore_eos", 0, "samplers", "penalties", "temperature", "top_k", "top_p", "min_p");
}

char *api_llama_props(const struct api_ctx *a, const struct api_llama_info *info, size_t *len)
{
    json_t *o = json_pack("{s:{s:o,s:i},s:i,s:s,s:s,s:{s:b,s:b,s:b},s:s,s:s,s:s,s:s,s:b,s:b,s:b,s:b}",
                          "default_generation_settings", "params", default_params(a), "n_ctx", a->ctx_size,
                          "total_slots", info->n_slots, "model_alias", a->model_name, "model_path",
                          info->model_path ? info->model_path : "", "modalities", "vision", 0, "video", 0,
                          "audio", 0, "chat_template", a->chat_tmpl ? a->chat_tmpl : "", "bos_token",
                          a->bos_str ? a->bos_str : "", "eos_token", a->eos_str ? a->eos_str : "",
                          "build_info", a->fingerprint ? a->fingerprint : "", "endpoint_slots", 1,
                          "endpoint_props", 1, "endpoint_metrics", 1, "is_sleeping", 0);
    return api_dump(o, len);
}

char *api_llama_slots(const struct api_ctx *a, const struct api_llama_info *info,
                      const struct sched_seq *seqs, int n_seqs, size_t *len)
{
    json_t *arr = json_array();
    for (int s = 0; s < info->n_slots; s++) {
        const struct sched_seq *q = NULL;
        for (int i = 0; i < n_seqs; i++)
            if (seqs[i].running && seqs[i].slot == s) q = &seqs[i];
        json_t *o =
            json_pack("{s:i,s:i,s:b,s:b,s:s,s:o}", "id", s, "n_ctx", a->ctx_size, "speculative", 0,
                      "is_processing", q != NULL, "id_task", q ? q->id : "", "params", default_params(a));
        json_object_set_new(o, "next_token",
                            json_pack("[{s:b,s:b,s:i,s:i,s:s}]", "has_next_token", q != NULL, "has_new_line",
                                      0, "n_remain", q ? q->max_tokens - q->n_gen : -1, "n_decoded",
                                      q ? q->n_gen : 0, "stopping_word", ""));
        if (q)
            json_object_set_new(o, "n_prompt_tokens_processed", json_integer(q->n_fed)),
                json_object_set_new(o, "n_prompt_tokens", json_integer(q->n_prompt));
        json_array_append_new(arr, o);
    }
    return api_dump(arr, len);
}
