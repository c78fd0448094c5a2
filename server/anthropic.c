/* anthropic — Anthropic's Messages API on top of chat: POST /v1/messages and /v1/messages/count_tokens.
 *
 * The request becomes a chat request: system (a string or text blocks) → a system message; user blocks
 * (text, tool_result) → user and tool messages; assistant blocks (text, thinking, tool_use) → an assistant
 * message with reasoning_content and tool_calls; tools {name, description, input_schema} and tool_choice
 * (auto, any, tool, none; disable_parallel_tool_use) → chat's; stop_sequences → stop; thinking
 * {type: enabled|disabled} → the template's enable_thinking; output_config.format → response_format; a final
 * assistant message is a prefill that the answer continues. The answer is a message object with thinking,
 * text and tool_use blocks and Anthropic's stop reasons, whole or as its event stream (message_start, ping,
 * content_block_start/delta/stop, message_delta, message_stop; error on failure). Errors have Anthropic's
 * shape ({"type": "error", "error": {"type", "message"}}). Images, documents and server tools are refused
 * by name: this server runs text models and executes no tools.
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

/* The text of a content value that may only hold text: a string, or text blocks joined with a newline. */
static int text_of(json_t *content, const char *field, struct strbuf *b, struct api_err *e)
{
    if (json_is_string(content)) {
        strbuf_add(b, json_string_value(content), json_string_length(content));
        return 0;
    }
    if (!json_is_array(content))
        FAIL(FERRY_ERR_INVALID, field, "'%s' must be a string or text blocks", field);
    size_t k;
    json_t *blk;
    json_array_foreach(content, k, blk)
    {
        const char *type = json_string_value(json_object_get(blk, "type"));
        json_t *text = json_object_get(blk, "text");
        if (!type || strcmp(type, "text") || !json_is_string(text))
            FAIL(FERRY_ERR_UNSUPPORTED, field,
                 "%s[%zu]: only text blocks are supported here (this server runs a text model)", field, k);
        if (k > 0) strbuf_add(b, "\n", 1);
        strbuf_add(b, json_string_value(text), json_string_length(text));
    }
    return 0;
}

/* A user message's blocks: tool results become tool messages (in order), text between them user messages. */
static int user_blocks(json_t *content, size_t i, json_t *msgs, struct api_err *e)
{
    struct strbuf text = {0};
    int have_text = 0;
    size_t k;
    json_t *blk;
    json_array_foreach(content, k, blk)
    {
        const char *type = json_string_value(json_object_get(blk, "type"));
        if (type && !strcmp(type, "text") && json_is_string(json_object_get(blk, "text"))) {
            if (have_text) strbuf_add(&text, "\n", 1);
            json_t *t = json_object_get(blk, "text");
            strbuf_add(&text, json_string_value(t), json_string_length(t));
            have_text = 1;
        } else if (type && !strcmp(type, "tool_result")) {
            if (have_text) { /* text written before the result stays before it */
                json_array_append_new(msgs, json_pack("{s:s,s:s}", "role", "user", "content", text.p));
                strbuf_free(&text);
                have_text = 0;
            }
            json_t *id = json_object_get(blk, "tool_use_id"), *c = json_object_get(blk, "content");
            if (!json_is_string(id)) {
                strbuf_free(&text);
                FAIL(FERRY_ERR_INVALID, "messages",
                     "messages[%zu].content[%zu]: tool_result needs 'tool_use_id'", i, k);
            }
            struct strbuf r = {0};
            strbuf_add(&r, "", 0);
            if (json_is_true(json_object_get(blk, "is_error"))) strbuf_add(&r, "Error: ", 7);
            if (c && !json_is_null(c) && text_of(c, "messages", &r, e)) {
                strbuf_free(&r);
                strbuf_free(&text);
                return e->status;
            }
            json_array_append_new(
                msgs, json_pack("{s:s,s:s,s:O}", "role", "tool", "content", r.p, "tool_call_id", id));
            strbuf_free(&r);
        } else {
            strbuf_free(&text);
            FAIL(FERRY_ERR_UNSUPPORTED, "messages",
                 "messages[%zu].content[%zu]: blocks of type '%.40s' are not supported in a user message "
                 "(this "
                 "server runs a text model: text and tool_result only)",
                 i, k, type ? type : "?");
        }
    }
    if (have_text) json_array_append_new(msgs, json_pack("{s:s,s:s}", "role", "user", "content", text.p));
    strbuf_free(&text);
    return 0;
}

/* An assistant message's blocks → one assistant message: text, reasoning_content, tool_calls. */
static int assistant_blocks(json_t *content, size_t i, json_t *msgs, struct api_err *e)
{
    struct strbuf text = {0}, think = {0};
    json_t *calls = json_array();
    size_t k;
    json_t *blk;
    int rc = 0;
    json_array_foreach(content, k, blk)
    {
        const char *type = json_string_value(json_object_get(blk, "type"));
        if (type && !strcmp(type, "text") && json_is_string(json_object_get(blk, "text"))) {
            json_t *t = json_object_get(blk, "text");
            if (text.len) strbuf_add(&text, "\n", 1);
            strbuf_add(&text, json_string_value(t), json_string_length(t));
        } else if (type && !strcmp(type, "thinking") && json_is_string(json_object_get(blk, "thinking"))) {
            json_t *t = json_object_get(blk, "thinking");
            if (think.len) strbuf_add(&think, "\n", 1);
            strbuf_add(&think, json_string_value(t), json_string_length(t));
        } else if (type && !strcmp(type, "redacted_thinking")) {
            continue; /* encrypted by another provider: nothing this model can read */
        } else if (type && !strcmp(type, "tool_use")) {
            json_t *id = json_object_get(blk, "id"), *name = json_object_get(blk, "name");
            json_t *input = json_object_get(blk, "input");
            if (!json_is_string(id) || !json_is_string(name) || (input && !json_is_object(input))) {
                e->status = rc = FERRY_ERR_INVALID, e->param = "messages";
                snprintf(e->msg, sizeof e->msg,
                         "messages[%zu].content[%zu]: tool_use needs 'id', 'name' and an object 'input'", i,
                         k);
                break;
            }
            json_array_append_new(calls, json_pack("{s:O,s:s,s:{s:O,s:o}}", "id", id, "type", "function",
                                                   "function", "name", name, "arguments",
                                                   input ? json_incref(input) : json_object()));
        } else {
            e->status = rc = FERRY_ERR_UNSUPPORTED, e->param = "messages";
            snprintf(e->msg, sizeof e->msg,
                     "messages[%zu].content[%zu]: blocks of type '%.40s' are not supported in an assistant "
                     "message",
                     i, k, type ? type : "?");
            break;
        }
    }
    if (!rc) {
        json_t *m = json_pack("{s:s}", "role", "assistant");
        /* "" rather than null next to tool calls: templates test `'x' in message.content` */
        json_object_set_new(m, "content", json_string(text.p ? text.p : ""));
        if (think.len) json_object_set_new(m, "reasoning_content", json_string(think.p));
        if (json_array_size(calls)) json_object_set(m, "tool_calls", calls);
        json_array_append_new(msgs, m);
    }
    json_decref(calls);
    strbuf_free(&text);
    strbuf_free(&think);
    return rc;
}

static int convert_tools(json_t *tools, json_t *chat, struct api_err *e)
{
    if (!tools || json_is_null(tools)) return 0;
    if (!json_is_array(tools)) FAIL(FERRY_ERR_INVALID, "tools", "'tools' must be an array");
    json_t *ct = json_array();
    json_object_set_new(chat, "tools", ct);
    size_t i;
    json_t *t;
    json_array_foreach(tools, i, t)
    {
        const char *type = json_string_value(json_object_get(t, "type"));
        if (!json_is_object(t) || (type && strcmp(type, "custom")))
            FAIL(FERRY_ERR_UNSUPPORTED, "tools",
                 "tools[%zu]: server tools ('%.40s') are not supported; declare client tools with name, "
                 "description and input_schema",
                 i, type ? type : "?");
        json_t *fn = json_object();
        json_object_set(fn, "name", json_object_get(t, "name") ? json_object_get(t, "name") : json_null());
        if (json_is_string(json_object_get(t, "description")))
            json_object_set(fn, "description", json_object_get(t, "description"));
        json_t *schema = json_object_get(t, "input_schema");
        if (schema) json_object_set(fn, "parameters", schema);
        json_array_append_new(ct, json_pack("{s:s,s:o}", "type", "function", "function", fn));
    }
    return 0;
}

static int convert_tool_choice(json_t *tc, json_t *chat, struct api_err *e)
{
    if (!tc || json_is_null(tc)) return 0;
    const char *type = json_string_value(json_object_get(tc, "type"));
    if (!json_is_object(tc) || !type)
        FAIL(FERRY_ERR_INVALID, "tool_choice", "'tool_choice' must be an object with a 'type'");
    if (!strcmp(type, "auto"))
        json_object_set_new(chat, "tool_choice", json_string("auto"));
    else if (!strcmp(type, "any"))
        json_object_set_new(chat, "tool_choice", json_string("required"));
    else if (!strcmp(type, "none"))
        json_object_set_new(chat, "tool_choice", json_string("none"));
    else if (!strcmp(type, "tool") && json_is_string(json_object_get(tc, "name")))
        json_object_set_new(
            chat, "tool_choice",
            json_pack("{s:s,s:{s:O}}", "type", "function", "function", "name", json_object_get(tc, "name")));
    else
        FAIL(FERRY_ERR_INVALID, "tool_choice",
             "'tool_choice' type must be 'auto', 'any', 'none' or 'tool' (with a 'name')");
    json_t *dp = json_object_get(tc, "disable_parallel_tool_use");
    if (dp && !json_is_boolean(dp))
        FAIL(FERRY_ERR_INVALID, "tool_choice", "'disable_parallel_tool_use' must be a boolean");
    if (dp) json_object_set_new(chat, "parallel_tool_calls", json_boolean(!json_is_true(dp)));
    return 0;
}

/* The chat request equivalent to a messages request (a new object in *out). */
static int to_chat(json_t *o, int count_only, json_t **out, struct api_err *e)
{
    *out = NULL;
    static const char *const refused[] = {"container", "mcp_servers", "context_management", NULL};
    for (int k = 0; refused[k]; k++) {
        json_t *v = json_object_get(o, refused[k]);
        if (v && !json_is_null(v))
            FAIL(FERRY_ERR_UNSUPPORTED, refused[k], "'%s' is not supported by this server", refused[k]);
    }
    json_t *mt = json_object_get(o, "max_tokens");
    if (!count_only && (!mt || json_is_null(mt)))
        FAIL(FERRY_ERR_INVALID, "max_tokens", "max_tokens: Field required");
    json_t *chat = json_object(), *msgs = json_array();
    json_object_set_new(chat, "messages", msgs);
    int rc = 0;
    json_t *sys = json_object_get(o, "system");
    if (sys && !json_is_null(sys)) {
        struct strbuf b = {0};
        strbuf_add(&b, "", 0);
        rc = text_of(sys, "system", &b, e);
        if (!rc) json_array_append_new(msgs, json_pack("{s:s,s:s}", "role", "system", "content", b.p));
        strbuf_free(&b);
    }
    json_t *in = json_object_get(o, "messages");
    if (!rc && !json_is_array(in)) {
        e->status = rc = FERRY_ERR_INVALID, e->param = "messages";
        snprintf(e->msg, sizeof e->msg, "messages: Field required (an array of messages)");
    }
    size_t i;
    json_t *m;
    if (!rc) json_array_foreach(in, i, m)
        {
            const char *role = json_string_value(json_object_get(m, "role"));
            json_t *content = json_object_get(m, "content");
            if (!json_is_object(m) || !role || (strcmp(role, "user") && strcmp(role, "assistant"))) {
                e->status = rc = FERRY_ERR_INVALID, e->param = "messages";
                snprintf(e->msg, sizeof e->msg, "messages[%zu].role must be 'user' or 'assistant'", i);
                break;
            }
            if (json_is_string(content)) {
                json_array_append_new(msgs, json_pack("{s:s,s:O}", "role", role, "content", content));
            } else if (json_is_array(content)) {
                rc = !strcmp(role, "user") ? user_blocks(content, i, msgs, e)
                                           : assistant_blocks(content, i, msgs, e);
                if (rc) break;
            } else {
                e->status = rc = FERRY_ERR_INVALID, e->param = "messages";
                snprintf(e->msg, sizeof e->msg,
                         "messages[%zu].content must be a string or an array of blocks", i);
                break;
            }
        }
    /* a final assistant message is a prefill: the answer continues it */
    json_t *last = json_array_get(msgs, json_array_size(msgs) - 1);
    const char *lc = json_string_value(json_object_get(last, "content"));
    if (!rc && lc && lc[0] && !strcmp(json_string_value(json_object_get(last, "role")), "assistant") &&
        !json_object_get(last, "tool_calls"))
        json_object_set_new(chat, "continue_final_message", json_true());
    if (!rc) rc = convert_tools(json_object_get(o, "tools"), chat, e);
    if (!rc) rc = convert_tool_choice(json_object_get(o, "tool_choice"), chat, e);
    json_t *th = json_object_get(o, "thinking");
    if (!rc && th && !json_is_null(th)) {
        const char *type = json_string_value(json_object_get(th, "type"));
        if (!type || (strcmp(type, "enabled") && strcmp(type, "disabled") && strcmp(type, "adaptive") &&
                      strcmp(type, "between_tools"))) {
            e->status = rc = FERRY_ERR_INVALID, e->param = "thinking";
            snprintf(e->msg, sizeof e->msg,
                     "'thinking' type must be 'enabled', 'adaptive', 'between_tools' or 'disabled'");
        } else {
            json_object_set_new(chat, "chat_template_kwargs",
                                json_pack("{s:b}", "enable_thinking", strcmp(type, "disabled") != 0));
        }
    }
    json_t *oc = json_object_get(o, "output_config");
    if (!rc && oc && !json_is_null(oc)) { /* structured output: {format: {type: json_schema, schema}} */
        json_t *fmt = json_object_get(oc, "format");
        const char *ft = json_string_value(json_object_get(fmt, "type"));
        if (!json_is_object(oc) || (fmt && !json_is_null(fmt) && (!ft || strcmp(ft, "json_schema")))) {
            e->status = rc = FERRY_ERR_INVALID, e->param = "output_config";
            snprintf(e->msg, sizeof e->msg,
                     "'output_config.format' must be {\"type\": \"json_schema\", \"schema\": ...}");
        } else if (fmt && !json_is_null(fmt)) {
            json_object_set_new(chat, "response_format",
                                json_pack("{s:s,s:{s:O?}}", "type", "json_schema", "json_schema", "schema",
                                          json_object_get(fmt, "schema")));
        }
    }
    if (rc) {
        json_decref(chat);
        return rc;
    }
    static const char *const copied[][2] = {
        {"temperature", "temperature"}, {"top_p", "top_p"},           {"top_k", "top_k"},
        {"stream", "stream"},           {"max_tokens", "max_tokens"}, {"stop_sequences", "stop"}};
    for (size_t k = 0; k < sizeof copied / sizeof copied[0]; k++) {
        json_t *v = json_object_get(o, copied[k][0]);
        if (v) json_object_set(chat, copied[k][1], v);
    }
    if (count_only) json_object_del(chat, "max_tokens");
    *out = chat;
    return 0;
}

/* Chat's field names in errors → the messages request's. */
static void rename_param(struct api_err *e)
{
    if (e->param && !strcmp(e->param, "stop")) e->param = "stop_sequences";
    if (e->param && !strcmp(e->param, "response_format")) e->param = "output_config";
}

int api_parse_anthropic(const struct api_ctx *a, const char *body, size_t len, struct sreq **out,
                        struct api_err *e)
{
    *out = NULL;
    memset(e, 0, sizeof *e);
    json_t *o = api_load_object(body, len, e);
    if (!o) return e->status;
    json_t *chat = NULL;
    int rc = to_chat(o, 0, &chat, e);
    if (!rc) {
        /* Anthropic's temperature is [0, 1]; chat's wider bound would let 1.5 through */
        double t;
        if (api_get_num(o, "temperature", 0, 1, &t, e) < 0) rc = e->status;
    }
    if (!rc) rc = api_parse_object(a, SREQ_ANTHROPIC, chat, out, e);
    if (rc) rename_param(e);
    if (!rc)
        for (int i = 0; i < (*out)->n_choices; i++)
            (*out)->choices[i].rs_item = (*out)->choices[i].msg_item = -1;
    json_decref(chat);
    json_decref(o);
    return rc;
}

int api_anthropic_count_tokens(const struct api_ctx *a, const char *body, size_t len, char **out,
                               size_t *out_len, struct api_err *e)
{
    memset(e, 0, sizeof *e);
    json_t *o = api_load_object(body, len, e);
    if (!o) return e->status;
    json_t *chat = NULL;
    int rc = to_chat(o, 1, &chat, e);
    struct sreq *r = NULL;
    if (!rc) {
        json_object_del(chat, "stream");
        rc = api_parse_object(a, SREQ_ANTHROPIC, chat, &r, e);
    }
    if (rc) rename_param(e);
    json_decref(chat);
    json_decref(o);
    if (rc) return rc;
    *out = api_dump(json_pack("{s:i}", "input_tokens", r->prompt_tokens), out_len);
    sched_release(NULL, r);
    return *out ? 0 : FERRY_ERR_NOMEM;
}

/* ---- answer ------------------------------------------------------------------------------------------ */

static const char *stop_reason(const struct sreq *r, const struct choice *c, int n_calls)
{
    if (!c->finish) return NULL;
    if (!strcmp(c->finish, "length")) return "max_tokens";
    if (n_calls) return "tool_use";
    if (c->stop_hit > 0 && c->stop_hit <= r->n_stops) return "stop_sequence";
    return "end_turn";
}

static json_t *stop_sequence(const struct sreq *r, const struct choice *c, int n_calls)
{
    if (n_calls || c->stop_hit <= 0 || c->stop_hit > r->n_stops) return json_null();
    const char *s = r->stops[c->stop_hit - 1];
    return api_jstr(s, strlen(s));
}

static json_t *usage(const struct sreq *r, const struct choice *c)
{
    return json_pack("{s:i,s:i,s:i,s:i}", "input_tokens", r->prompt_tokens - c->n_cached, "output_tokens",
                     c->n_completion, "cache_creation_input_tokens", 0, "cache_read_input_tokens",
                     c->n_cached);
}

/* The input of tool call k (its arguments as an object; {} when the model's were not an object). */
static json_t *call_input(const struct api_split *sp, int k)
{
    const char *args = sp->tp->calls[k].arguments;
    json_t *in = json_loads(args, 0, NULL);
    if (!json_is_object(in)) {
        json_decref(in);
        in = json_object();
    }
    return in;
}

static json_t *message_obj(const struct api_ctx *a, const struct sreq *r, json_t *content, const char *reason,
                           json_t *stop_seq, json_t *use)
{
    return json_pack("{s:s,s:s,s:s,s:s,s:o,s:s?,s:o,s:o}", "id", r->id, "type", "message", "role",
                     "assistant", "model", a->model_name, "content", content, "stop_reason", reason,
                     "stop_sequence", stop_seq, "usage", use);
}

char *api_anthropic_full(const struct api_ctx *a, struct sreq *r, size_t *len)
{
    struct choice *c = &r->choices[0];
    struct api_split sp;
    api_split_output(r, c, 1, &sp);
    json_t *content = json_array();
    if (sp.r_len)
        json_array_append_new(content, json_pack("{s:s,s:o,s:s}", "type", "thinking", "thinking",
                                                 api_jstr(sp.reasoning, sp.r_len), "signature", ""));
    if (sp.c_len || (!sp.n_calls && !sp.r_len)) /* an answer cut short while thinking has no text block */
        json_array_append_new(content,
                              json_pack("{s:s,s:o}", "type", "text", "text", api_jstr(sp.content, sp.c_len)));
    for (int k = 0; k < sp.n_calls; k++) {
        const char *name = sp.tp->calls[k].name;
        json_array_append_new(content,
                              json_pack("{s:s,s:s,s:o,s:o}", "type", "tool_use", "id", api_call_id(a, c, k),
                                        "name", api_jstr(name, strlen(name)), "input", call_input(&sp, k)));
    }
    json_t *o = message_obj(a, r, content, stop_reason(r, c, sp.n_calls), stop_sequence(r, c, sp.n_calls),
                            usage(r, c));
    api_split_free(&sp);
    return api_dump(o, len);
}

/* ---- streaming: Anthropic's events ------------------------------------------------------------------------
 */

static void event(struct strbuf *out, const char *type, json_t *data)
{
    json_object_set_new(data, "type", json_string(type));
    api_sse_event(out, type, data);
}

static void block_stop(struct strbuf *out, int index)
{
    event(out, "content_block_stop", json_pack("{s:i}", "index", index));
}

void api_anthropic_stream(const struct api_ctx *a, struct sreq *r, struct strbuf *out, int *done)
{
    *done = 0;
    struct choice *c = &r->choices[0];
    if (!c->head_sent) {
        c->head_sent = 1;
        json_t *use = json_pack("{s:i,s:i,s:i,s:i}", "input_tokens", r->prompt_tokens, "output_tokens", 0,
                                "cache_creation_input_tokens", 0, "cache_read_input_tokens", 0);
        event(out, "message_start",
              json_pack("{s:o}", "message", message_obj(a, r, json_array(), NULL, json_null(), use)));
        event(out, "ping", json_object());
    }
    const int final = c->state == CHOICE_DONE;
    struct api_split sp;
    api_split_output(r, c, final, &sp);
    if (sp.r_len > c->r_sent) {
        if (c->rs_item == -1) {
            c->rs_item = c->items++;
            event(out, "content_block_start",
                  json_pack("{s:i,s:{s:s,s:s,s:s}}", "index", c->rs_item, "content_block", "type", "thinking",
                            "thinking", "", "signature", ""));
        }
        event(out, "content_block_delta",
              json_pack("{s:i,s:{s:s,s:o}}", "index", c->rs_item, "delta", "type", "thinking_delta",
                        "thinking", api_jstr(sp.reasoning + c->r_sent, sp.r_len - c->r_sent)));
        c->r_sent = sp.r_len;
    }
    /* the thinking is over once an answer or a call appears */
    if (c->rs_item >= 0 && (sp.c_len > 0 || sp.n_calls > 0 || final)) {
        event(out, "content_block_delta",
              json_pack("{s:i,s:{s:s,s:s}}", "index", c->rs_item, "delta", "type", "signature_delta",
                        "signature", ""));
        block_stop(out, c->rs_item);
        c->rs_item = -2;
    }
    /* a text block opens for text, or at the end of an answer that has neither text nor calls */
    if (sp.c_len > c->a_sent || (final && c->msg_item == -1 && !sp.n_calls && !sp.r_len)) {
        if (c->msg_item == -1) {
            c->msg_item = c->items++;
            event(out, "content_block_start",
                  json_pack("{s:i,s:{s:s,s:s}}", "index", c->msg_item, "content_block", "type", "text",
                            "text", ""));
        }
        if (sp.c_len > c->a_sent)
            event(out, "content_block_delta",
                  json_pack("{s:i,s:{s:s,s:o}}", "index", c->msg_item, "delta", "type", "text_delta", "text",
                            api_jstr(sp.content + c->a_sent, sp.c_len - c->a_sent)));
        c->a_sent = sp.c_len;
    }
    if (c->msg_item >= 0 && (sp.n_calls > 0 || final)) {
        block_stop(out, c->msg_item);
        c->msg_item = -2;
    }
    for (int k = c->calls_sent; k < sp.n_calls; k++) {
        int idx = c->items++;
        const char *name = sp.tp->calls[k].name;
        event(out, "content_block_start",
              json_pack("{s:i,s:{s:s,s:s,s:o,s:{}}}", "index", idx, "content_block", "type", "tool_use", "id",
                        api_call_id(a, c, k), "name", api_jstr(name, strlen(name)), "input"));
        /* the input as compact JSON: a client concatenates the partial_json pieces and parses them */
        json_t *in = call_input(&sp, k);
        char *js = json_dumps(in, JSON_COMPACT);
        json_decref(in);
        if (!js) api_oom_mark();
        event(out, "content_block_delta",
              json_pack("{s:i,s:{s:s,s:s}}", "index", idx, "delta", "type", "input_json_delta",
                        "partial_json", js ? js : "{}"));
        free(js);
        block_stop(out, idx);
    }
    c->calls_sent = sp.n_calls;
    const char *reason = stop_reason(r, c, sp.n_calls);
    json_t *stop_seq = stop_sequence(r, c, sp.n_calls);
    api_split_free(&sp);
    if (r->n_done < r->n_choices) {
        json_decref(stop_seq);
        return;
    }
    if (r->cancelled || r->error) {
        json_decref(stop_seq);
        const char *msg = r->error                            ? r->errmsg
                          : r->cancelled == FERRY_ERR_TIMEOUT ? "the request timed out"
                                                              : "the request was cancelled";
        event(out, "error",
              json_pack("{s:{s:s,s:s}}", "error", "type",
                        api_anthropic_error_type(r->error ? r->error : r->cancelled), "message", msg));
    } else {
        event(out, "message_delta",
              json_pack("{s:{s:s?,s:o},s:{s:i}}", "delta", "stop_reason", reason, "stop_sequence", stop_seq,
                        "usage", "output_tokens", c->n_completion));
        event(out, "message_stop", json_object());
    }
    *done = 1;
}

/* ---- errors ------------------------------------------------------------------------------------------- */

const char *api_anthropic_error_type(int status)
{
    switch (api_http_status(status, NULL, NULL)) {
    case 400:
    case 405:
    case 415:
        return "invalid_request_error";
    case 401:
        return "authentication_error";
    case 403:
        return "permission_error";
    case 404:
        return "not_found_error";
    case 413:
        return "request_too_large";
    case 429:
        return "rate_limit_error";
    case 503:
        return "overloaded_error";
    case 504:
        return "timeout_error";
    default:
        return "api_error";
    }
}

char *api_anthropic_error_body(int status, const char *msg, size_t *len)
{
    return api_dump(json_pack("{s:s,s:{s:s,s:o}}", "type", "error", "error", "type",
                              api_anthropic_error_type(status), "message", api_jstr(msg, strlen(msg))),
                    len);
}
