/* responses — OpenAI's /v1/responses on top of chat: the request becomes a chat request (input items →
 * messages, instructions → a system message, function tools and text.format → their chat forms), and the
 * answer is rendered as a response object with output items (reasoning, message, function_call), whole or as
 * typed SSE events (response.created ... response.output_text.delta ... response.completed).
 *
 * Stateless: previous_response_id and conversation are refused (send the whole conversation as input), and
 * store is reported false. Built-in tools (web_search, file_search, ...) are refused; so are background runs.
 */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/core/status.h"
#include "runtime/tool_call.h"
#include "server/api.h"
#include "server/api_impl.h"

/* ---- request ---------------------------------------------------------------------------------------- */

/* One input item → zero or one chat message appended to msgs. */
static int input_item(json_t *it, size_t i, json_t *msgs, struct api_err *e)
{
    if (!json_is_object(it)) FAIL(FERRY_ERR_INVALID, "input", "input[%zu] must be an object", i);
    const char *type = json_string_value(json_object_get(it, "type"));
    const char *role = json_string_value(json_object_get(it, "role"));
    if (!type || !strcmp(type, "message")) {
        if (!role) FAIL(FERRY_ERR_INVALID, "input", "input[%zu] needs a 'role'", i);
        if (strcmp(role, "user") && strcmp(role, "assistant") && strcmp(role, "system") &&
            strcmp(role, "developer"))
            FAIL(FERRY_ERR_INVALID, "input",
                 "input[%zu]: role '%.40s' is not one of user, assistant, system, developer", i, role);
        json_t *content = json_object_get(it, "content");
        if (!json_is_string(content) && !json_is_array(content))
            FAIL(FERRY_ERR_INVALID, "input",
                 "input[%zu]: a message needs 'content' (a string or an array of content parts)", i);
        json_array_append_new(msgs, json_pack("{s:s,s:O}", "role", role, "content", content));
        return 0;
    }
    if (!strcmp(type, "function_call")) {
        const char *name = json_string_value(json_object_get(it, "name"));
        json_t *args = json_object_get(it, "arguments"), *id = json_object_get(it, "call_id");
        if (!name || !json_is_string(args))
            FAIL(FERRY_ERR_INVALID, "input",
                 "input[%zu]: a function_call needs 'name' and 'arguments' (a JSON string)", i);
        json_t *call = json_pack("{s:O,s:s,s:{s:s,s:O}}", "id", json_is_string(id) ? id : json_string(""),
                                 "type", "function", "function", "name", name, "arguments", args);
        /* consecutive calls belong to one assistant turn */
        json_t *last = json_array_get(msgs, json_array_size(msgs) - 1);
        json_t *calls = last ? json_object_get(last, "tool_calls") : NULL;
        if (json_is_array(calls))
            json_array_append_new(calls, call);
        else
            json_array_append_new(
                msgs, json_pack("{s:s,s:n,s:[o]}", "role", "assistant", "content", "tool_calls", call));
        return 0;
    }
    if (!strcmp(type, "function_call_output")) {
        json_t *out = json_object_get(it, "output"), *id = json_object_get(it, "call_id");
        if (!json_is_string(out))
            FAIL(FERRY_ERR_INVALID, "input", "input[%zu]: function_call_output needs a string 'output'", i);
        json_array_append_new(msgs, json_pack("{s:s,s:O,s:O}", "role", "tool", "content", out, "tool_call_id",
                                              json_is_string(id) ? id : json_string("")));
        return 0;
    }
    if (!strcmp(type, "reasoning")) return 0; /* earlier reasoning is not sent back to the model */
    FAIL(FERRY_ERR_UNSUPPORTED, "input", "input[%zu]: items of type '%.40s' are not supported", i, type);
}

/* The chat request equivalent to a responses request (a new object). */
static int to_chat(json_t *o, json_t **out, struct api_err *e)
{
    *out = NULL;
    static const char *const refused[] = {"previous_response_id", "conversation", "background", "prompt",
                                          NULL};
    for (int k = 0; refused[k]; k++) {
        json_t *v = json_object_get(o, refused[k]);
        if (v && !json_is_null(v) && !json_is_false(v))
            FAIL(FERRY_ERR_UNSUPPORTED, refused[k],
                 "'%s' is not supported: ferry keeps no state between requests; send the whole conversation "
                 "as 'input'",
                 refused[k]);
    }
    json_t *chat = json_object();
    json_t *msgs = json_array();
    json_object_set_new(chat, "messages", msgs);
    json_t *ins = json_object_get(o, "instructions");
    if (ins && !json_is_null(ins)) {
        if (!json_is_string(ins)) {
            json_decref(chat);
            FAIL(FERRY_ERR_INVALID, "instructions", "'instructions' must be a string");
        }
        json_array_append_new(msgs, json_pack("{s:s,s:O}", "role", "system", "content", ins));
    }
    json_t *input = json_object_get(o, "input");
    if (json_is_string(input)) {
        json_array_append_new(msgs, json_pack("{s:s,s:O}", "role", "user", "content", input));
    } else if (json_is_array(input) && json_array_size(input) > 0) {
        size_t i;
        json_t *it;
        json_array_foreach(input, i, it) if (input_item(it, i, msgs, e))
        {
            json_decref(chat);
            return e->status;
        }
    } else {
        json_decref(chat);
        FAIL(FERRY_ERR_INVALID, "input", "'input' must be a string or a non-empty array of items");
    }
    static const char *const copied[] = {"model", "temperature", "top_p", "stream", "parallel_tool_calls",
                                         "user",  "seed",        "top_k", "min_p",  NULL};
    for (int k = 0; copied[k]; k++) {
        json_t *v = json_object_get(o, copied[k]);
        if (v) json_object_set(chat, copied[k], v);
    }
    json_t *mot = json_object_get(o, "max_output_tokens");
    if (mot) json_object_set(chat, "max_completion_tokens", mot);
    json_t *tools = json_object_get(o, "tools");
    if (json_is_array(tools) && json_array_size(tools)) { /* {type, name, description, parameters} → chat's */
        json_t *ct = json_array();
        size_t i;
        json_t *t;
        json_array_foreach(tools, i, t)
        {
            const char *type = json_string_value(json_object_get(t, "type"));
            if (!type || strcmp(type, "function")) {
                json_decref(ct);
                json_decref(chat);
                FAIL(FERRY_ERR_UNSUPPORTED, "tools",
                     "tools[%zu]: only function tools are supported (not '%.40s')", i, type ? type : "?");
            }
            json_t *fn = json_object();
            const char *keys[] = {"name", "description", "parameters", "strict"};
            for (int k = 0; k < 4; k++)
                if (json_object_get(t, keys[k])) json_object_set(fn, keys[k], json_object_get(t, keys[k]));
            json_array_append_new(ct, json_pack("{s:s,s:o}", "type", "function", "function", fn));
        }
        json_object_set_new(chat, "tools", ct);
    } else if (tools && !json_is_null(tools) && !json_is_array(tools)) {
        json_decref(chat);
        FAIL(FERRY_ERR_INVALID, "tools", "'tools' must be an array");
    }
    json_t *tc = json_object_get(o, "tool_choice");
    if (json_is_object(tc) && json_is_string(json_object_get(tc, "name")))
        json_object_set_new(
            chat, "tool_choice",
            json_pack("{s:s,s:{s:O}}", "type", "function", "function", "name", json_object_get(tc, "name")));
    else if (tc)
        json_object_set(chat, "tool_choice", tc);
    json_t *text = json_object_get(o, "text");
    json_t *fmt = json_is_object(text) ? json_object_get(text, "format") : NULL;
    if (fmt)
        json_object_set(chat, "response_format", fmt); /* flat {type, name, schema, strict}: read as such */
    *out = chat;
    return 0;
}

/* Chat's field names in errors → the responses request's. */
static void rename_param(struct api_err *e)
{
    static const char *const map[][2] = {{"messages", "input"},
                                         {"max_completion_tokens", "max_output_tokens"},
                                         {"max_tokens", "max_output_tokens"},
                                         {"response_format", "text.format"}};
    for (size_t i = 0; e->param && i < sizeof map / sizeof map[0]; i++)
        if (!strcmp(e->param, map[i][0])) {
            e->param = map[i][1];
            return;
        }
}

int api_parse_responses(const struct api_ctx *a, const char *body, size_t len, struct sreq **out,
                        struct api_err *e)
{
    json_t *o = api_load_object(body, len, e);
    if (!o) return e->status;
    json_t *chat = NULL;
    int rc = to_chat(o, &chat, e);
    if (!rc) rc = api_parse_object(a, SREQ_RESPONSES, chat, out, e);
    if (!rc && (*out)->n != 1) {
        sched_release(NULL, *out);
        *out = NULL;
        e->status = rc = FERRY_ERR_INVALID, e->param = "n";
        snprintf(e->msg, sizeof e->msg, "/v1/responses makes one answer per request");
    }
    if (rc) rename_param(e);
    if (!rc) {
        /* what the response object echoes back */
        json_t *echo =
            json_pack("{s:O?,s:O?,s:O?,s:O?,s:O?}", "instructions", json_object_get(o, "instructions"),
                      "max_output_tokens", json_object_get(o, "max_output_tokens"), "tools",
                      json_object_get(o, "tools"), "tool_choice", json_object_get(o, "tool_choice"), "text",
                      json_object_get(o, "text"));
        (*out)->echo_json = echo ? json_dumps(echo, JSON_COMPACT) : NULL;
        json_decref(echo);
        for (int i = 0; i < (*out)->n_choices; i++)
            (*out)->choices[i].rs_item = (*out)->choices[i].msg_item = -1;
    }
    json_decref(chat);
    json_decref(o);
    return rc;
}

/* ---- answer ------------------------------------------------------------------------------------------ */

static json_t *usage(const struct sreq *r)
{
    const struct choice *c = &r->choices[0];
    return json_pack("{s:i,s:{s:i},s:i,s:{s:i},s:i}", "input_tokens", r->prompt_tokens,
                     "input_tokens_details", "cached_tokens", c->n_cached, "output_tokens", c->n_completion,
                     "output_tokens_details", "reasoning_tokens", 0, "total_tokens",
                     r->prompt_tokens + c->n_completion);
}

static const char *status_of(const struct sreq *r)
{
    const struct choice *c = &r->choices[0];
    if (r->error || r->cancelled) return "failed";
    if (c->state != CHOICE_DONE) return "in_progress";
    return c->finish && !strcmp(c->finish, "length") ? "incomplete" : "completed";
}

/* The response object; items NULL: the output so far from the split (a final state when done). */
static json_t *response_obj(const struct api_ctx *a, const struct sreq *r, json_t *output)
{
    json_t *echo = r->echo_json ? json_loads(r->echo_json, 0, NULL) : json_object();
    const char *st = status_of(r);
    json_t *o =
        json_pack("{s:s,s:s,s:I,s:s,s:n,s:o,s:s,s:o,s:b,s:n,s:{s:n,s:n},s:b,s:f,s:f,s:s,s:o,s:o}", "id",
                  r->id, "object", "response", "created_at", (json_int_t)r->created, "status", st, "error",
                  "incomplete_details",
                  !strcmp(st, "incomplete") ? json_pack("{s:s}", "reason", "max_output_tokens") : json_null(),
                  "model", a->model_name, "output", output ? output : json_array(), "parallel_tool_calls", 1,
                  "previous_response_id", "reasoning", "effort", "summary", "store", 0, "temperature",
                  (double)r->sp.temperature, "top_p", (double)r->sp.top_p, "truncation", "disabled",
                  "metadata", json_object(), "usage", !strcmp(st, "in_progress") ? json_null() : usage(r));
    const char *keys[] = {"instructions", "max_output_tokens", "tools", "tool_choice", "text"};
    const json_t *dflt[] = {json_null(), json_null(), json_array(), json_string("auto"),
                            json_pack("{s:{s:s}}", "format", "type", "text")};
    for (int k = 0; k < 5; k++) {
        json_t *v = echo ? json_object_get(echo, keys[k]) : NULL;
        json_object_set_new(o, keys[k], v ? json_incref(v) : (json_t *)dflt[k]);
        if (v) json_decref((json_t *)dflt[k]);
    }
    json_decref(echo);
    return o;
}

static json_t *message_item(const struct sreq *r, int index, const char *text, size_t len, const char *status)
{
    char id[48];
    snprintf(id, sizeof id, "msg_%s_%d", r->id + 5, index);
    json_t *content = json_array();
    if (text)
        json_array_append_new(content, json_pack("{s:s,s:o,s:[]}", "type", "output_text", "text",
                                                 api_jstr(text, len), "annotations"));
    return json_pack("{s:s,s:s,s:s,s:s,s:o}", "type", "message", "id", id, "status", status, "role",
                     "assistant", "content", content);
}

static json_t *reasoning_item(const struct sreq *r, int index, const char *text, size_t len)
{
    char id[48];
    snprintf(id, sizeof id, "rs_%s_%d", r->id + 5, index);
    json_t *content = json_array();
    if (text)
        json_array_append_new(content,
                              json_pack("{s:s,s:o}", "type", "reasoning_text", "text", api_jstr(text, len)));
    return json_pack("{s:s,s:s,s:[],s:o}", "type", "reasoning", "id", id, "summary", "content", content);
}

static json_t *call_item(const struct api_ctx *a, struct choice *c, const struct api_split *sp, int k,
                         const char *status)
{
    const struct tool_call_out *tc = &sp->tp->calls[k];
    char id[64];
    snprintf(id, sizeof id, "fc_%s", api_call_id(a, c, k));
    return json_pack("{s:s,s:s,s:s,s:o,s:o,s:s}", "type", "function_call", "id", id, "call_id",
                     api_call_id(a, c, k), "name", api_jstr(tc->name, strlen(tc->name)), "arguments",
                     api_jstr(tc->arguments, strlen(tc->arguments)), "status", status);
}

char *api_responses_full(const struct api_ctx *a, struct sreq *r, size_t *len)
{
    struct choice *c = &r->choices[0];
    struct api_split sp;
    api_split_output(r, c, 1, &sp);
    json_t *out = json_array();
    int idx = 0;
    if (sp.r_len) json_array_append_new(out, reasoning_item(r, idx++, sp.reasoning, sp.r_len));
    if (sp.c_len || !sp.n_calls)
        json_array_append_new(out, message_item(r, idx++, sp.content, sp.c_len, "completed"));
    for (int k = 0; k < sp.n_calls; k++) json_array_append_new(out, call_item(a, c, &sp, k, "completed"));
    api_split_free(&sp);
    json_t *o = response_obj(a, r, out);
    return api_dump(o, len);
}

/* ---- streaming: typed events -----------------------------------------------------------------------------
 */

static void event(struct strbuf *out, struct choice *c, const char *type, json_t *data)
{
    json_object_set_new(data, "type", json_string(type));
    json_object_set_new(data, "sequence_number", json_integer(c->seq++));
    api_sse_event(out, type, data);
}

static void close_reasoning(struct sreq *r, struct choice *c, struct strbuf *out, const struct api_split *sp)
{
    json_t *item = reasoning_item(r, c->rs_item, sp->reasoning, sp->r_len);
    const char *id = json_string_value(json_object_get(item, "id"));
    event(out, c, "response.reasoning_text.done",
          json_pack("{s:s,s:i,s:i,s:o}", "item_id", id, "output_index", c->rs_item, "content_index", 0,
                    "text", api_jstr(sp->reasoning, sp->r_len)));
    event(out, c, "response.output_item.done",
          json_pack("{s:i,s:o}", "output_index", c->rs_item, "item", item));
    c->rs_item = -2; /* closed */
}

static void close_message(struct sreq *r, struct choice *c, struct strbuf *out, const struct api_split *sp)
{
    json_t *item = message_item(r, c->msg_item, sp->content, sp->c_len, "completed");
    const char *id = json_string_value(json_object_get(item, "id"));
    json_t *part = json_pack("{s:s,s:o,s:[]}", "type", "output_text", "text",
                             api_jstr(sp->content, sp->c_len), "annotations");
    event(out, c, "response.output_text.done",
          json_pack("{s:s,s:i,s:i,s:o}", "item_id", id, "output_index", c->msg_item, "content_index", 0,
                    "text", api_jstr(sp->content, sp->c_len)));
    event(out, c, "response.content_part.done",
          json_pack("{s:s,s:i,s:i,s:o}", "item_id", id, "output_index", c->msg_item, "content_index", 0,
                    "part", part));
    event(out, c, "response.output_item.done",
          json_pack("{s:i,s:o}", "output_index", c->msg_item, "item", item));
    c->msg_item = -2;
}

void api_responses_stream(const struct api_ctx *a, struct sreq *r, struct strbuf *out, int *done)
{
    *done = 0;
    struct choice *c = &r->choices[0];
    if (!c->head_sent) {
        c->head_sent = 1;
        event(out, c, "response.created", json_pack("{s:o}", "response", response_obj(a, r, NULL)));
        event(out, c, "response.in_progress", json_pack("{s:o}", "response", response_obj(a, r, NULL)));
    }
    const int final = c->state == CHOICE_DONE;
    struct api_split sp;
    api_split_output(r, c, final, &sp);
    char id[48];
    if (sp.r_len > c->r_sent) {
        if (c->rs_item == -1) {
            c->rs_item = c->items++;
            event(out, c, "response.output_item.added",
                  json_pack("{s:i,s:o}", "output_index", c->rs_item, "item",
                            reasoning_item(r, c->rs_item, NULL, 0)));
        }
        snprintf(id, sizeof id, "rs_%s_%d", r->id + 5, c->rs_item);
        event(out, c, "response.reasoning_text.delta",
              json_pack("{s:s,s:i,s:i,s:o}", "item_id", id, "output_index", c->rs_item, "content_index", 0,
                        "delta", api_jstr(sp.reasoning + c->r_sent, sp.r_len - c->r_sent)));
        c->r_sent = sp.r_len;
    }
    /* the reasoning is over once an answer or a call appears */
    if (c->rs_item >= 0 && (sp.c_len > 0 || sp.n_calls > 0 || final)) close_reasoning(r, c, out, &sp);
    if (sp.c_len > c->a_sent) {
        if (c->msg_item == -1) {
            c->msg_item = c->items++;
            json_t *item = message_item(r, c->msg_item, NULL, 0, "in_progress");
            const char *iid = json_string_value(json_object_get(item, "id"));
            snprintf(id, sizeof id, "%s", iid);
            event(out, c, "response.output_item.added",
                  json_pack("{s:i,s:o}", "output_index", c->msg_item, "item", item));
            event(out, c, "response.content_part.added",
                  json_pack("{s:s,s:i,s:i,s:{s:s,s:s,s:[]}}", "item_id", id, "output_index", c->msg_item,
                            "content_index", 0, "part", "type", "output_text", "text", "", "annotations"));
        }
        snprintf(id, sizeof id, "msg_%s_%d", r->id + 5, c->msg_item);
        event(out, c, "response.output_text.delta",
              json_pack("{s:s,s:i,s:i,s:o,s:[]}", "item_id", id, "output_index", c->msg_item, "content_index",
                        0, "delta", api_jstr(sp.content + c->a_sent, sp.c_len - c->a_sent), "logprobs"));
        c->a_sent = sp.c_len;
    }
    if (c->msg_item >= 0 && (sp.n_calls > 0 || final)) close_message(r, c, out, &sp);
    for (int k = c->calls_sent; k < sp.n_calls; k++) {
        int idx = c->items++;
        json_t *item = call_item(a, c, &sp, k, "in_progress");
        const char *iid = json_string_value(json_object_get(item, "id"));
        snprintf(id, sizeof id, "%s", iid);
        json_object_set_new(item, "arguments", json_string(""));
        event(out, c, "response.output_item.added",
              json_pack("{s:i,s:o}", "output_index", idx, "item", item));
        const char *args = sp.tp->calls[k].arguments;
        event(out, c, "response.function_call_arguments.delta",
              json_pack("{s:s,s:i,s:o}", "item_id", id, "output_index", idx, "delta",
                        api_jstr(args, strlen(args))));
        event(out, c, "response.function_call_arguments.done",
              json_pack("{s:s,s:i,s:o}", "item_id", id, "output_index", idx, "arguments",
                        api_jstr(args, strlen(args))));
        event(out, c, "response.output_item.done",
              json_pack("{s:i,s:o}", "output_index", idx, "item", call_item(a, c, &sp, k, "completed")));
    }
    c->calls_sent = sp.n_calls;
    api_split_free(&sp);
    if (r->n_done < r->n_choices) return;
    if (r->cancelled || r->error) {
        const char *msg = r->error                            ? r->errmsg
                          : r->cancelled == FERRY_ERR_TIMEOUT ? "the request timed out"
                                                              : "the request was cancelled";
        json_t *resp = response_obj(a, r, NULL);
        const char *type, *code;
        api_http_status(r->error ? r->error : r->cancelled, &type, &code);
        json_object_set_new(resp, "error",
                            json_pack("{s:s,s:s}", "code", code ? code : type, "message", msg));
        event(out, c, "response.failed", json_pack("{s:o}", "response", resp));
    } else {
        char *body = api_responses_full(a, r, NULL);
        json_t *resp = body ? json_loads(body, 0, NULL) : NULL;
        free(body);
        event(out, c, !strcmp(status_of(r), "incomplete") ? "response.incomplete" : "response.completed",
              json_pack("{s:o}", "response", resp ? resp : json_object()));
    }
    *done = 1;
}
