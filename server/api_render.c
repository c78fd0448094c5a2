/* api_render — the OpenAI answers: whole JSON bodies and SSE chunks for completions and chat completions
 * (text, logprobs, echo, usage; for chat also reasoning_content and tool_calls split out of the output).
 * Called with the scheduler lock held (outputs are read under it); see api.h.
 */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/core/status.h"
#include "server/api.h"
#include "runtime/harmony.h"
#include "runtime/reasoning.h"
#include "runtime/tool_call.h"
#include "server/api_impl.h"

/* ---- rendering -------------------------------------------------------------------------------------- */

static char *token_text(const struct api_ctx *a, int32_t id, size_t *len)
{
    char *s = NULL;
    size_t l = 0;
    if (tokenizer_decode(a->tok, &id, 1, 1, &s, &l) || !s) {
        api_oom_mark(); /* the id is valid: only memory can fail */
        *len = 0;
        return NULL;
    }
    *len = l;
    return s;
}

static json_t *bytes_array(const char *s, size_t n)
{
    json_t *b = json_array();
    for (size_t i = 0; i < n; i++) json_array_append_new(b, json_integer((unsigned char)s[i]));
    return b;
}

/* Logprobs of entries [from, to) in the format of the request's endpoint. `*offset` tracks text_offset. */
/* The completions API's logprobs object, built a token at a time. */
struct text_lps {
    json_t *tokens, *lps, *tops, *offs;
};

static struct text_lps text_lps_new(void)
{
    return (struct text_lps){json_array(), json_array(), json_array(), json_array()};
}

/* Token `id` with its entry (NULL: logprob and top_logprobs null, as for an echoed prompt's first token). */
static void text_lps_add(const struct api_ctx *a, struct text_lps *t, int32_t id, const struct lp_entry *le,
                         size_t *offset)
{
    size_t l;
    char *tx = token_text(a, id, &l);
    json_array_append_new(t->tokens, api_jstr(tx, l));
    json_array_append_new(t->lps, le ? json_real(le->lp) : json_null());
    json_array_append_new(t->offs, json_integer((json_int_t)*offset));
    *offset += l;
    free(tx);
    if (!le) {
        json_array_append_new(t->tops, json_null());
        return;
    }
    json_t *top = json_object();
    for (int k = 0; k < le->n_top; k++) {
        size_t tl;
        char *tt = token_text(a, le->top_id[k], &tl);
        size_t sl;
        char *san = utf8_sanitize(tt ? tt : "", tt ? tl : 0, &sl);
        if (san)
            json_object_set_new(top, san, json_real(le->top_lp[k]));
        else
            api_oom_mark();
        free(san);
        free(tt);
    }
    json_array_append_new(t->tops, top);
}

static json_t *text_lps_json(struct text_lps *t)
{
    return json_pack("{s:o,s:o,s:o,s:o}", "tokens", t->tokens, "token_logprobs", t->lps, "top_logprobs",
                     t->tops, "text_offset", t->offs);
}

static json_t *render_logprobs(const struct api_ctx *a, const struct sreq *r, const struct choice *c,
                               int from, int to, size_t *offset)
{
    if (r->kind == SREQ_CHAT) {
        json_t *content = json_array();
        for (int i = from; i < to; i++) {
            const struct lp_entry *le = &c->lps[i];
            size_t l;
            char *t = token_text(a, le->id, &l);
            json_t *tops = json_array();
            for (int k = 0; k < le->n_top; k++) {
                size_t tl;
                char *tt = token_text(a, le->top_id[k], &tl);
                json_array_append_new(tops, json_pack("{s:o,s:f,s:o}", "token", api_jstr(tt, tl), "logprob",
                                                      (double)le->top_lp[k], "bytes",
                                                      bytes_array(tt ? tt : "", tl)));
                free(tt);
            }
            json_array_append_new(content, json_pack("{s:o,s:f,s:o,s:o}", "token", api_jstr(t, l), "logprob",
                                                     (double)le->lp, "bytes", bytes_array(t ? t : "", l),
                                                     "top_logprobs", tops));
            free(t);
        }
        return json_pack("{s:o}", "content", content);
    }
    struct text_lps t = text_lps_new();
    for (int i = from; i < to; i++) text_lps_add(a, &t, c->lps[i].id, &c->lps[i], offset);
    return text_lps_json(&t);
}

/* The prompt's entries of an echoed completion: its first token (no logprob: nothing precedes it), then each
 * later token given the ones before it. Offsets count from 0 through the prompt's token texts. */
static json_t *render_prompt_logprobs(const struct api_ctx *a, const struct choice *c, size_t *offset)
{
    struct text_lps t = text_lps_new();
    for (int i = 0; i < c->n_prompt; i++)
        text_lps_add(a, &t, c->prompt[i], i && c->prompt_lps ? &c->prompt_lps[i - 1] : NULL, offset);
    return text_lps_json(&t);
}

/* Appends the arrays of `more` (the same four keys) to those of `base`; consumes `more`. */
static void text_lps_extend(json_t *base, json_t *more)
{
    const char *keys[4] = {"tokens", "token_logprobs", "top_logprobs", "text_offset"};
    for (int k = 0; k < 4; k++)
        json_array_extend(json_object_get(base, keys[k]), json_object_get(more, keys[k]));
    json_decref(more);
}

json_t *api_usage(const struct sreq *r)
{
    int gen = 0;
    for (int i = 0; i < r->n_choices; i++) gen += r->choices[i].n_completion;
    /* cached_tokens: of each prompt, the positions its first choice continued from the prompt cache */
    int cached = 0;
    for (int i = 0; i < r->n_choices; i += r->n) cached += r->choices[i].n_cached;
    return json_pack("{s:i,s:i,s:i,s:{s:i}}", "prompt_tokens", r->prompt_tokens, "completion_tokens", gen,
                     "total_tokens", r->prompt_tokens + gen, "prompt_tokens_details", "cached_tokens",
                     cached);
}

/* ---- output split: reasoning, content, tool calls ---------------------------------------------------- */

/* Whether the choices of r are harmony messages (gpt-oss) to split. Under a grammar they are not: it allows
 * text tokens only, so the output is one plain answer. */
static int split_harmony(const struct sreq *r)
{
    return r->kind != SREQ_COMPLETION && r->tool_format == TOOL_FORMAT_HARMONY && !r->grammar;
}

static void split_harmony_output(const struct sreq *r, const struct choice *c, int final, struct api_split *o)
{
    struct harmony_parse hp;
    const int flags = (r->reasoning ? HARMONY_REASONING : 0) | (r->tools ? HARMONY_CALLS : 0);
    o->tp = calloc(1, sizeof *o->tp);
    if (!o->tp || harmony_parse(c->text, c->text_len, final, flags, &hp)) {
        api_oom_mark(); /* the answer is refused rather than shown without its parts */
        free(o->tp);
        o->tp = NULL;
        o->content = o->reasoning = "";
        return;
    }
    *o->tp = hp.calls;
    o->n_calls = hp.calls.n_calls;
    o->owned[0] = hp.reasoning, o->reasoning = hp.reasoning, o->r_len = hp.r_len;
    o->owned[1] = hp.content, o->content = hp.content, o->c_len = hp.c_len;
}

void api_split_output(const struct sreq *r, const struct choice *c, int final, struct api_split *o)
{
    memset(o, 0, sizeof *o);
    if (split_harmony(r)) {
        split_harmony_output(r, c, final, o);
        return;
    }
    const char *text = c->text ? c->text : "";
    size_t len = c->text_len;
    const char *ans = text;
    size_t alen = len;
    if (r->kind != SREQ_COMPLETION && r->reasoning) {
        struct reasoning_split rs;
        reasoning_split(text, len, r->reasoning_started, final, &rs);
        o->reasoning = text + rs.r_start;
        o->r_len = rs.r_end - rs.r_start;
        ans = text + rs.a_start;
        alen = rs.a_end - rs.a_start;
    }
    o->content = ans;
    o->c_len = alen;
    if (r->kind != SREQ_COMPLETION && r->tools) {
        o->tp = calloc(1, sizeof *o->tp);
        if (o->tp &&
            !tool_call_parse((enum tool_format)r->tool_format, ans, alen, final, r->tool_prefixed, o->tp)) {
            o->c_len = o->tp->content_end;
            o->n_calls = o->tp->n_calls;
        } else { /* out of memory: the calls would show as text, so the answer is refused */
            api_oom_mark();
            free(o->tp);
            o->tp = NULL;
        }
    }
}

void api_split_free(struct api_split *o)
{
    if (o->tp) tool_parse_free(o->tp);
    free(o->tp);
    o->tp = NULL;
    free(o->owned[0]);
    free(o->owned[1]);
    o->owned[0] = o->owned[1] = NULL;
}

const char *api_call_id(const struct api_ctx *a, struct choice *c, int k)
{
    if (!c->call_ids && !(c->call_ids = calloc(TOOL_CALL_MAX, sizeof *c->call_ids))) {
        api_oom_mark(); /* an id that is not the call's own */
        return "call_0";
    }
    if (!c->call_ids[k][0]) {
        if (a->tool_format == TOOL_FORMAT_MISTRAL) { /* its template wants 9 letters and digits */
            static const char al[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
            uint64_t x = api_random_seed();
            for (int i = 0; i < 9; i++, x /= 62) c->call_ids[k][i] = al[x % 62];
            c->call_ids[k][9] = 0;
        } else {
            api_make_id(c->call_ids[k], sizeof c->call_ids[k], "call_");
        }
    }
    return c->call_ids[k];
}

json_t *api_tool_call_json(const struct api_ctx *a, struct choice *c, const struct api_split *sp, int k,
                           int index)
{
    const struct tool_call_out *tc = &sp->tp->calls[k];
    json_t *o = json_pack("{s:s,s:s,s:{s:o,s:o}}", "id", api_call_id(a, c, k), "type", "function", "function",
                          "name", api_jstr(tc->name, strlen(tc->name)), "arguments",
                          api_jstr(tc->arguments, strlen(tc->arguments)));
    if (index) json_object_set_new(o, "index", json_integer(k));
    return o;
}

/* The finish reason a client sees: "tool_calls" when the answer ended with calls. */
static const char *finish_reason(const struct choice *c, int n_calls)
{
    return n_calls && c->finish && !strcmp(c->finish, "stop") ? "tool_calls" : c->finish;
}

static json_t *envelope(const struct api_ctx *a, const struct sreq *r, int chunk)
{
    const char *obj =
        r->kind == SREQ_CHAT ? (chunk ? "chat.completion.chunk" : "chat.completion") : "text_completion";
    json_t *o =
        json_pack("{s:s,s:s,s:I,s:s,s:s}", "id", r->id, "object", obj, "created", (json_int_t)r->created,
                  "model", a->model_name, "system_fingerprint", a->fingerprint ? a->fingerprint : "");
    if (chunk && r->include_usage)
        json_object_set_new(o, "usage", json_null()); /* OpenAI: null until the last */
    return o;
}

char *api_render_full(const struct api_ctx *a, struct sreq *r, size_t *len)
{
    if (r->kind == SREQ_RESPONSES) return api_responses_full(a, r, len);
    if (r->kind == SREQ_EMBED) return api_embeddings_full(a, r, len);
    if (r->kind == SREQ_ANTHROPIC) return api_anthropic_full(a, r, len);
    if (r->kind == SREQ_LLAMA) return api_llama_full(a, r, len);
    json_t *o = envelope(a, r, 0);
    json_t *choices = json_array();
    for (int i = 0; i < r->n_choices; i++) {
        struct choice *c = &r->choices[i];
        json_t *lp = json_null();
        size_t offset = 0;
        const char *pt = r->echo ? r->prompt_texts[i / r->n] : NULL;
        char *decoded = NULL;
        size_t plen = 0;
        if (r->echo && !pt) {
            decoded = api_decode(a, c->prompt, c->n_prompt, &plen);
            pt = decoded;
        } else if (pt) {
            plen = strlen(pt);
        }
        if (r->logprobs >= 0) {
            json_t *prompt_lp = NULL;
            if (r->echo && r->kind == SREQ_COMPLETION) prompt_lp = render_prompt_logprobs(a, c, &offset);
            offset = plen;
            lp = render_logprobs(a, r, c, 0, c->n_lps, &offset);
            if (prompt_lp) {
                text_lps_extend(prompt_lp, lp);
                lp = prompt_lp;
            }
        }
        json_t *ch;
        if (r->kind == SREQ_CHAT) {
            struct api_split sp;
            api_split_output(r, c, 1, &sp);
            json_t *msg =
                json_pack("{s:s,s:o}", "role", "assistant", "content",
                          sp.n_calls && sp.c_len == 0 ? json_null() : api_jstr(sp.content, sp.c_len));
            if (sp.r_len) json_object_set_new(msg, "reasoning_content", api_jstr(sp.reasoning, sp.r_len));
            if (sp.n_calls) {
                json_t *calls = json_array();
                for (int k = 0; k < sp.n_calls; k++)
                    json_array_append_new(calls, api_tool_call_json(a, c, &sp, k, 0));
                json_object_set_new(msg, "tool_calls", calls);
            }
            ch = json_pack("{s:i,s:o,s:o,s:s?}", "index", i, "message", msg, "logprobs", lp, "finish_reason",
                           finish_reason(c, sp.n_calls));
            api_split_free(&sp);
        } else {
            struct strbuf t = {0};
            if (pt) strbuf_add(&t, pt, plen);
            strbuf_add(&t, c->text ? c->text : "", c->text_len);
            if (t.oom) api_oom_mark();
            ch = json_pack("{s:i,s:o,s:o,s:s?}", "index", i, "text", api_jstr(t.p, t.len), "logprobs", lp,
                           "finish_reason", c->finish);
            strbuf_free(&t);
        }
        free(decoded);
        json_array_append_new(choices, ch);
    }
    json_object_set_new(o, "choices", choices);
    json_object_set_new(o, "usage", api_usage(r));
    return api_dump(o, len);
}

static void sse(struct strbuf *out, json_t *j)
{
    api_sse_event(out, NULL, j);
}

/* A chat delta of everything new in the choice's reasoning, content and tool calls (NULL when nothing is). */
static json_t *chat_delta(const struct api_ctx *a, struct sreq *r, struct choice *c, int *n_calls)
{
    if (!r->reasoning && !r->tools && !split_harmony(r)) { /* plain text: all of it is content */
        *n_calls = 0;
        if (c->text_len <= c->sent) return NULL;
        json_t *d = json_pack("{s:o}", "content", api_jstr(c->text + c->sent, c->text_len - c->sent));
        c->sent = c->text_len;
        return d;
    }
    struct api_split sp;
    api_split_output(r, c, c->state == CHOICE_DONE, &sp);
    *n_calls = sp.n_calls;
    json_t *d = json_object();
    if (sp.r_len > c->r_sent) {
        json_object_set_new(d, "reasoning_content", api_jstr(sp.reasoning + c->r_sent, sp.r_len - c->r_sent));
        c->r_sent = sp.r_len;
    }
    if (sp.c_len > c->a_sent) {
        json_object_set_new(d, "content", api_jstr(sp.content + c->a_sent, sp.c_len - c->a_sent));
        c->a_sent = sp.c_len;
    }
    if (sp.n_calls > c->calls_sent) {
        json_t *calls = json_array();
        for (int k = c->calls_sent; k < sp.n_calls; k++)
            json_array_append_new(calls, api_tool_call_json(a, c, &sp, k, 1));
        json_object_set_new(d, "tool_calls", calls);
        c->calls_sent = sp.n_calls;
    }
    api_split_free(&sp);
    if (json_object_size(d) == 0) {
        json_decref(d);
        return NULL;
    }
    return d;
}

void api_render_stream(const struct api_ctx *a, struct sreq *r, struct strbuf *out, int *done)
{
    if (r->kind == SREQ_RESPONSES) {
        api_responses_stream(a, r, out, done);
        return;
    }
    if (r->kind == SREQ_ANTHROPIC) {
        api_anthropic_stream(a, r, out, done);
        return;
    }
    if (r->kind == SREQ_LLAMA) {
        api_llama_stream(a, r, out, done);
        return;
    }
    *done = 0;
    for (int i = 0; i < r->n_choices; i++) {
        struct choice *c = &r->choices[i];
        if (!c->head_sent) {
            c->head_sent = 1;
            if (r->kind == SREQ_CHAT) {
                json_t *o = envelope(a, r, 1);
                json_object_set_new(o, "choices",
                                    json_pack("[{s:i,s:{s:s,s:s},s:n,s:n}]", "index", i, "delta", "role",
                                              "assistant", "content", "", "logprobs", "finish_reason"));
                sse(out, o);
            } else if (r->echo) {
                /* With logprobs, the prompt's go in this first chunk: wait until the prefill computed them.
                 */
                if (r->logprobs >= 0 && !c->prompt_lps_ready && c->state != CHOICE_DONE && !r->error &&
                    !r->cancelled) {
                    c->head_sent = 0;
                    continue;
                }
                const char *pt = r->prompt_texts[i / r->n];
                char *decoded = NULL;
                size_t plen = 0;
                if (!pt)
                    pt = decoded = api_decode(a, c->prompt, c->n_prompt, &plen);
                else
                    plen = strlen(pt);
                size_t off = 0;
                json_t *plp = r->logprobs >= 0 ? render_prompt_logprobs(a, c, &off) : json_null();
                json_t *o = envelope(a, r, 1);
                json_object_set_new(o, "choices",
                                    json_pack("[{s:i,s:o,s:o,s:n}]", "index", i, "text", api_jstr(pt, plen),
                                              "logprobs", plp, "finish_reason"));
                sse(out, o);
                free(decoded);
                c->echo_len = plen;
            }
        }
        int n_calls = 0;
        if (r->kind == SREQ_CHAT) {
            json_t *delta = chat_delta(a, r, c, &n_calls);
            if (delta || c->lps_sent < c->n_lps) {
                json_t *lp = json_null();
                size_t offset = 0;
                if (r->logprobs >= 0) lp = render_logprobs(a, r, c, c->lps_sent, c->n_lps, &offset);
                json_t *o = envelope(a, r, 1);
                json_object_set_new(o, "choices",
                                    json_pack("[{s:i,s:o,s:o,s:n}]", "index", i, "delta",
                                              delta ? delta : json_object(), "logprobs", lp,
                                              "finish_reason"));
                sse(out, o);
                c->lps_sent = c->n_lps;
            }
        } else if (c->text_len > c->sent || c->lps_sent < c->n_lps) {
            json_t *lp = json_null();
            size_t offset = c->echo_len + c->sent; /* as in the whole answer: after the echoed prompt */
            if (r->logprobs >= 0) lp = render_logprobs(a, r, c, c->lps_sent, c->n_lps, &offset);
            json_t *text = api_jstr(c->text + c->sent, c->text_len - c->sent);
            json_t *o = envelope(a, r, 1);
            json_object_set_new(
                o, "choices",
                json_pack("[{s:i,s:o,s:o,s:n}]", "index", i, "text", text, "logprobs", lp, "finish_reason"));
            sse(out, o);
            c->sent = c->text_len;
            c->lps_sent = c->n_lps;
        }
        if (c->state == CHOICE_DONE && c->finish && !c->finish_sent && !r->cancelled && !r->error) {
            c->finish_sent = 1;
            json_t *o = envelope(a, r, 1);
            if (r->kind == SREQ_CHAT)
                json_object_set_new(o, "choices",
                                    json_pack("[{s:i,s:{},s:n,s:s}]", "index", i, "delta", "logprobs",
                                              "finish_reason", finish_reason(c, c->calls_sent)));
            else
                json_object_set_new(o, "choices",
                                    json_pack("[{s:i,s:s,s:n,s:s}]", "index", i, "text", "", "logprobs",
                                              "finish_reason", c->finish));
            sse(out, o);
        }
    }
    if (r->n_done < r->n_choices) return;
    if (r->cancelled || r->error) {
        int st = r->error ? r->error : r->cancelled;
        const char *msg = r->error                            ? r->errmsg
                          : r->cancelled == FERRY_ERR_TIMEOUT ? "the request timed out"
                                                              : "the request was cancelled";
        size_t len;
        char *body = api_error_body(st, msg, NULL, &len);
        if (body) {
            strbuf_add(out, "data: ", 6);
            strbuf_add(out, body, len);
            strbuf_add(out, "\n\n", 2);
            free(body);
        }
    } else if (r->include_usage) {
        json_t *o = envelope(a, r, 1);
        json_object_set_new(o, "choices", json_array());
        json_object_set_new(o, "usage", api_usage(r));
        sse(out, o);
    }
    strbuf_add(out, "data: [DONE]\n\n", 14);
    *done = 1;
}
