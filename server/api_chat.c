/* api_chat — the prompt of a chat request and what constrains its output.
 *
 * OpenAI messages (text parts, assistant tool_calls, tool results) and tools become the template's variables
 * the way Hugging Face's apply_chat_template receives them (tool-call arguments as objects; a template that
 * wants them as strings gets strings on a second try). Templates that do not render tools (chatml, SmolLM2:
 * TOOL_FORMAT_GENERIC) get the tools described in the system message and earlier calls and results written
 * as <tool_call>/<tool_response> text. tool_choice "required" or a named function constrains decoding to a
 * well-formed call (runtime/tool_call.c); response_format json_object/json_schema to the schema.
 */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/core/status.h"
#include "runtime/chat_template.h"
#include "runtime/grammar.h"
#include "runtime/json_schema.h"
#include "runtime/reasoning.h"
#include "runtime/tool_call.h"
#include "server/api.h"
#include "server/api_impl.h"

#define API_MAX_TOOLS    128
#define API_MAX_MESSAGES 4096
#define API_JSON_WS      16 /* whitespace bytes per gap in constrained JSON */

enum { CHOICE_NONE, CHOICE_AUTO, CHOICE_REQUIRED, CHOICE_NAMED };

struct tools {
    int n;
    json_t *arr; /* the request's tools (borrowed) */
    struct tool_def defs[API_MAX_TOOLS];
    char *params[API_MAX_TOOLS]; /* JSON Schema texts (owned) */
    int choice, named, parallel;
    int parallel_set; /* the request said parallel_tool_calls */
};

static void tools_free(struct tools *t)
{
    for (int i = 0; i < t->n; i++) free(t->params[i]);
}

static int valid_name(const char *s)
{
    size_t n = strlen(s);
    if (n == 0 || n > 64) return 0;
    for (size_t i = 0; i < n; i++)
        if (!((s[i] >= 'a' && s[i] <= 'z') || (s[i] >= 'A' && s[i] <= 'Z') || (s[i] >= '0' && s[i] <= '9') ||
              s[i] == '_' || s[i] == '-'))
            return 0;
    return 1;
}

static int parse_tools(json_t *o, struct tools *t, struct api_err *e)
{
    memset(t, 0, sizeof *t);
    t->choice = CHOICE_AUTO;
    t->parallel = 1;
    json_t *arr = json_object_get(o, "tools"), *tc = json_object_get(o, "tool_choice");
    if (arr && !json_is_null(arr)) {
        if (!json_is_array(arr))
            FAIL(FERRY_ERR_INVALID, "tools", "'tools' must be an array of function tools");
        if (json_array_size(arr) > API_MAX_TOOLS)
            FAIL(FERRY_ERR_INVALID, "tools", "at most %d tools", API_MAX_TOOLS);
        size_t i;
        json_t *x;
        json_array_foreach(arr, i, x)
        {
            json_t *type = json_object_get(x, "type"), *fn = json_object_get(x, "function");
            if (!json_is_object(x) || !json_is_string(type) || strcmp(json_string_value(type), "function"))
                FAIL(FERRY_ERR_UNSUPPORTED, "tools",
                     "tools[%zu]: only tools of type 'function' are supported", i);
            const char *name = json_string_value(json_object_get(fn, "name"));
            if (!json_is_object(fn) || !name || !valid_name(name))
                FAIL(FERRY_ERR_INVALID, "tools",
                     "tools[%zu].function.name must be 1 to 64 letters, digits, '_' or '-'", i);
            for (int k = 0; k < t->n; k++)
                if (!strcmp(t->defs[k].name, name))
                    FAIL(FERRY_ERR_INVALID, "tools", "tool '%s' is declared twice", name);
            json_t *params = json_object_get(fn, "parameters");
            if (params && !json_is_null(params) && !json_is_object(params))
                FAIL(FERRY_ERR_INVALID, "tools",
                     "tools[%zu].function.parameters must be a JSON Schema object", i);
            t->defs[t->n].name = name;
            if (params && json_is_object(params)) {
                t->params[t->n] = json_dumps(params, JSON_COMPACT);
                if (!t->params[t->n]) FAIL(FERRY_ERR_NOMEM, NULL, "out of memory");
            }
            t->defs[t->n].parameters = t->params[t->n];
            t->n++;
        }
        t->arr = t->n ? arr : NULL;
    }
    if (tc && !json_is_null(tc)) {
        const char *s = json_string_value(tc);
        if (s && !strcmp(s, "none"))
            t->choice = CHOICE_NONE;
        else if (s && !strcmp(s, "auto"))
            t->choice = CHOICE_AUTO;
        else if (s && !strcmp(s, "required"))
            t->choice = CHOICE_REQUIRED;
        else if (json_is_object(tc)) {
            const char *name = json_string_value(json_object_get(json_object_get(tc, "function"), "name"));
            if (!name)
                FAIL(FERRY_ERR_INVALID, "tool_choice",
                     "'tool_choice' must name a function: {\"type\": \"function\", \"function\": {\"name\": "
                     "...}}");
            t->named = -1;
            for (int k = 0; k < t->n; k++)
                if (!strcmp(t->defs[k].name, name)) t->named = k;
            if (t->named < 0)
                FAIL(FERRY_ERR_INVALID, "tool_choice",
                     "tool_choice names '%.64s', which is not among the tools", name);
            t->choice = CHOICE_NAMED;
        } else {
            FAIL(FERRY_ERR_INVALID, "tool_choice",
                 "'tool_choice' must be 'none', 'auto', 'required' or a named function");
        }
    }
    if (t->choice == CHOICE_REQUIRED && t->n == 0)
        FAIL(FERRY_ERR_INVALID, "tool_choice", "tool_choice 'required' needs 'tools'");
    int b;
    if (api_get_bool(o, "parallel_tool_calls", &b, e) < 0) return e->status;
    if (e->status == 0 && json_object_get(o, "parallel_tool_calls") &&
        !json_is_null(json_object_get(o, "parallel_tool_calls")))
        t->parallel = b, t->parallel_set = 1;
    return 0;
}

/* ---- messages ------------------------------------------------------------------------------------------ */

/* A message's content as one string, or NULL for null. Text parts are joined with a newline, as llama.cpp
 * and vLLM join them ("What is" + "the best book" must not read "What isthe best book"). */
static int content_text(json_t *content, size_t i, char **out, struct api_err *e)
{
    *out = NULL;
    if (!content || json_is_null(content)) return 0;
    if (json_is_string(content)) {
        *out = strdup(json_string_value(content));
        if (!*out) FAIL(FERRY_ERR_NOMEM, NULL, "out of memory");
        return 0;
    }
    if (!json_is_array(content))
        FAIL(FERRY_ERR_INVALID, "messages",
             "messages[%zu].content must be a string or an array of text parts", i);
    struct strbuf b = {0};
    strbuf_add(&b, "", 0);
    size_t k;
    json_t *part;
    json_array_foreach(content, k, part)
    {
        const char *type = json_string_value(json_object_get(part, "type"));
        json_t *text = json_object_get(part, "text");
        if (!type || (strcmp(type, "text") && strcmp(type, "input_text") && strcmp(type, "output_text")) ||
            !json_is_string(text)) {
            strbuf_free(&b);
            FAIL(FERRY_ERR_UNSUPPORTED, "messages",
                 "messages[%zu].content[%zu]: only text parts are supported (this server runs a text model)",
                 i, k);
        }
        if (k > 0) strbuf_add(&b, "\n", 1);
        strbuf_add(&b, json_string_value(text), json_string_length(text));
    }
    if (b.oom) {
        strbuf_free(&b);
        FAIL(FERRY_ERR_NOMEM, NULL, "out of memory");
    }
    *out = b.p;
    return 0;
}

/* The request's tool_calls of an assistant message, arguments as objects (as_objects) or as strings. */
static int convert_calls(json_t *calls, size_t i, int as_objects, json_t **out, struct api_err *e)
{
    *out = NULL;
    if (!json_is_array(calls))
        FAIL(FERRY_ERR_INVALID, "messages", "messages[%zu].tool_calls must be an array", i);
    json_t *arr = json_array();
    size_t k;
    json_t *tc;
    json_array_foreach(calls, k, tc)
    {
        json_t *fn = json_object_get(tc, "function");
        const char *name = json_string_value(json_object_get(fn, "name"));
        json_t *args = json_object_get(fn, "arguments");
        if (!name || (args && !json_is_string(args) && !json_is_object(args))) {
            json_decref(arr);
            FAIL(FERRY_ERR_INVALID, "messages",
                 "messages[%zu].tool_calls[%zu] must have function.name and function.arguments (a JSON "
                 "string)",
                 i, k);
        }
        json_t *a;
        if (as_objects) {
            a = json_is_object(args) ? json_incref(args)
                : args               ? json_loads(json_string_value(args), 0, NULL)
                                     : json_object();
            if (!a || !json_is_object(a)) { /* not an object: kept as the client wrote it */
                json_decref(a);
                a = json_string(args ? json_string_value(args) : "{}");
            }
        } else {
            if (json_is_string(args)) {
                a = json_incref(args);
            } else {
                char *d = args ? json_dumps(args, JSON_COMPACT) : NULL;
                a = json_string(d ? d : "{}");
                free(d);
            }
        }
        json_t *id = json_object_get(tc, "id");
        json_array_append_new(arr, json_pack("{s:o,s:s,s:{s:s,s:o}}", "id",
                                             json_is_string(id) ? json_incref(id) : json_string(""), "type",
                                             "function", "function", "name", name, "arguments", a));
    }
    *out = arr;
    return 0;
}

/* Hermes text of earlier calls, for templates that do not render tool_calls (GENERIC). */
static void calls_as_text(json_t *calls, struct strbuf *b)
{
    size_t k;
    json_t *tc;
    json_array_foreach(calls, k, tc)
    {
        json_t *fn = json_object_get(tc, "function");
        json_t *args = json_object_get(fn, "arguments");
        char *a = json_is_string(args) ? strdup(json_string_value(args)) : json_dumps(args, JSON_COMPACT);
        if (!a && args) api_oom_mark(); /* the call would lose its arguments */
        if (b->len) strbuf_add(b, "\n", 1);
        strbuf_add(b, "<tool_call>\n{\"name\": \"", 23);
        const char *name = json_string_value(json_object_get(fn, "name"));
        strbuf_add(b, name, strlen(name));
        strbuf_add(b, "\", \"arguments\": ", 16);
        if (a) strbuf_add(b, a, strlen(a));
        strbuf_add(b, "}\n</tool_call>", 14);
        free(a);
    }
}

/* The system text that describes the tools to a model whose template does not (Hermes' own wording). */
static void tools_system_text(const struct tools *t, struct strbuf *b)
{
    static const char head[] =
        "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
        "You are provided with function signatures within <tools></tools> XML tags:\n<tools>";
    static const char tail[] =
        "\n</tools>\n\nFor each function call, return a json object with function name and "
        "arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": "
        "<function-name>, \"arguments\": <args-json-object>}\n</tool_call>";
    strbuf_add(b, head, sizeof head - 1);
    size_t i;
    json_t *x;
    json_array_foreach(t->arr, i, x)
    {
        char *s = json_dumps(x, JSON_COMPACT);
        strbuf_add(b, "\n", 1);
        if (s) strbuf_add(b, s, strlen(s));
        free(s);
    }
    strbuf_add(b, tail, sizeof tail - 1);
}

/* messages → the template's messages (a new JSON array). generic: write tool calls/results as text and put
 * the tools' description (tools_text, may be NULL) in the system message. */
static int convert_messages(json_t *msgs, int as_objects, int generic, const char *tools_text, json_t **out,
                            struct api_err *e)
{
    *out = NULL;
    json_t *res = json_array();
    size_t i;
    json_t *m;
    int rc = 0;
    json_array_foreach(msgs, i, m)
    {
        const char *role = json_string_value(json_object_get(m, "role"));
        if (!json_is_object(m) || !role) {
            json_decref(res);
            FAIL(FERRY_ERR_INVALID, "messages", "messages[%zu] must be an object with a string 'role'", i);
        }
        if (!strcmp(role, "developer")) role = "system"; /* OpenAI's newer name for it */
        char *content = NULL;
        if ((rc = content_text(json_object_get(m, "content"), i, &content, e))) break;
        json_t *calls = json_object_get(m, "tool_calls");
        if (calls && json_is_null(calls)) calls = NULL;
        json_t *o = json_object();
        if (generic && !strcmp(role, "tool")) {
            struct strbuf b = {0};
            strbuf_add(&b, "<tool_response>\n", 16);
            if (content) strbuf_add(&b, content, strlen(content));
            strbuf_add(&b, "\n</tool_response>", 17);
            json_object_set_new(o, "role", json_string("user"));
            json_object_set_new(o, "content", b.p ? json_string(b.p) : json_string(""));
            strbuf_free(&b);
        } else if (generic && calls && !strcmp(role, "assistant")) {
            struct strbuf b = {0};
            if (content) strbuf_add(&b, content, strlen(content));
            if (!json_is_array(calls)) {
                free(content);
                json_decref(o);
                json_decref(res);
                FAIL(FERRY_ERR_INVALID, "messages", "messages[%zu].tool_calls must be an array", i);
            }
            calls_as_text(calls, &b);
            json_object_set_new(o, "role", json_string(role));
            json_object_set_new(o, "content", json_string(b.p ? b.p : ""));
            strbuf_free(&b);
        } else {
            json_object_set_new(o, "role", json_string(role));
            /* null content stays None next to tool calls (templates test it), "" elsewhere (templates add it)
             */
            json_object_set_new(o, "content",
                                content ? json_string(content)
                                : calls ? json_null()
                                        : json_string(""));
            if (calls && !strcmp(role, "assistant")) {
                json_t *conv;
                if ((rc = convert_calls(calls, i, as_objects, &conv, e))) {
                    free(content);
                    json_decref(o);
                    break;
                }
                json_object_set_new(o, "tool_calls", conv);
            }
            json_t *tcid = json_object_get(m, "tool_call_id"), *name = json_object_get(m, "name");
            if (json_is_string(tcid)) json_object_set(o, "tool_call_id", tcid);
            if (json_is_string(name)) json_object_set(o, "name", name);
        }
        json_t *reasoning = json_object_get(m, "reasoning_content"); /* earlier thinking, for templates that
                                                                      * render it (Qwen3, DeepSeek) */
        if (json_is_string(reasoning) && !strcmp(role, "assistant"))
            json_object_set(o, "reasoning_content", reasoning);
        free(content);
        json_array_append_new(res, o);
    }
    if (rc) {
        json_decref(res);
        return rc;
    }
    if (tools_text) { /* into the system message, or a new one first */
        json_t *first = json_array_get(res, 0);
        const char *r0 = json_string_value(json_object_get(first, "role"));
        if (r0 && !strcmp(r0, "system")) {
            const char *c0 = json_string_value(json_object_get(first, "content"));
            struct strbuf b = {0};
            strbuf_add(&b, c0 ? c0 : "", c0 ? strlen(c0) : 0);
            if (b.len) strbuf_add(&b, "\n\n", 2);
            strbuf_add(&b, tools_text, strlen(tools_text));
            json_object_set_new(first, "content", json_string(b.p));
            strbuf_free(&b);
        } else {
            json_array_insert_new(res, 0, json_pack("{s:s,s:s}", "role", "system", "content", tools_text));
        }
    }
    *out = res;
    return 0;
}

static int has_tool_history(json_t *msgs)
{
    size_t i;
    json_t *m;
    json_array_foreach(msgs, i, m)
    {
        const char *role = json_string_value(json_object_get(m, "role"));
        json_t *calls = json_object_get(m, "tool_calls");
        if ((role && !strcmp(role, "tool")) || (calls && !json_is_null(calls))) return 1;
    }
    return 0;
}

/* gpt-oss's template reads an assistant message's earlier reasoning from "thinking" and refuses one with
 * both thinking and content beside tool calls: as llama.cpp passes them, the content then goes. */
static void harmony_thinking(json_t *conv)
{
    size_t i;
    json_t *m;
    json_array_foreach(conv, i, m)
    {
        json_t *rs = json_object_get(m, "reasoning_content");
        if (!json_is_string(rs)) continue;
        json_object_set(m, "thinking", rs);
        if (json_array_size(json_object_get(m, "tool_calls"))) json_object_del(m, "content");
    }
}

/* Renders once: arguments as objects, or as strings. */
static int render_once(const struct api_ctx *a, json_t *msgs, const struct tools *t, int tools_active,
                       int generic, int as_objects, int add_gen, json_t *kwargs, char **out, size_t *len,
                       char terr[256], struct api_err *e)
{
    struct strbuf sys = {0};
    if (generic && tools_active) tools_system_text(t, &sys);
    json_t *conv;
    int rc = convert_messages(msgs, as_objects, generic, sys.p, &conv, e);
    strbuf_free(&sys);
    if (rc) return rc;
    if (a->tool_format == TOOL_FORMAT_HARMONY) harmony_thinking(conv);
    char *mj = json_dumps(conv, JSON_COMPACT);
    char *tj = tools_active && !generic ? json_dumps(t->arr, JSON_COMPACT) : NULL;
    char *ej = kwargs ? json_dumps(kwargs, JSON_COMPACT) : NULL;
    json_decref(conv);
    if (!mj || (tools_active && !generic && !tj) || (kwargs && !ej)) {
        free(mj);
        free(tj);
        free(ej);
        FAIL(FERRY_ERR_NOMEM, NULL, "out of memory");
    }
    struct chat_render in = {mj, tj, ej, add_gen, a->bos_str ? a->bos_str : "", a->eos_str ? a->eos_str : ""};
    rc = chat_template_render_json(a->chat_tmpl, &in, NULL, out, len, terr);
    free(mj);
    free(tj);
    free(ej);
    return rc ? rc : 0;
}

/* add_generation_prompt (default true) and continue_final_message (default false), as vLLM and HF's
 * apply_chat_template take them: continuing needs an assistant message last and no generation prompt. */
static int chat_flags(json_t *o, json_t *msgs, int *add_gen, int *cont, struct api_err *e)
{
    if (api_get_bool(o, "add_generation_prompt", add_gen, e) < 0) return e->status;
    if (api_get_bool(o, "continue_final_message", cont, e) < 0) return e->status;
    if (!*cont) return 0;
    json_t *add = json_object_get(o, "add_generation_prompt");
    if (add && json_is_true(add))
        FAIL(FERRY_ERR_INVALID, "continue_final_message",
             "'continue_final_message' and 'add_generation_prompt' cannot both be true");
    *add_gen = 0;
    json_t *last = json_array_get(msgs, json_array_size(msgs) - 1);
    const char *role = json_string_value(json_object_get(last, "role"));
    if (!role || strcmp(role, "assistant"))
        FAIL(FERRY_ERR_INVALID, "continue_final_message",
             "'continue_final_message' needs an assistant message last in 'messages'");
    return 0;
}

/* chat_template_kwargs (vLLM's and llama-server's): extra variables of the template, such as
 * enable_thinking; the variables the server itself sets are refused. */
static int template_kwargs(json_t *o, json_t **out, struct api_err *e)
{
    *out = NULL;
    json_t *k = json_object_get(o, "chat_template_kwargs");
    if (!k || json_is_null(k)) return 0;
    if (!json_is_object(k))
        FAIL(FERRY_ERR_INVALID, "chat_template_kwargs", "'chat_template_kwargs' must be an object");
    static const char *const own[] = {"messages",  "tools",     "add_generation_prompt",
                                      "bos_token", "eos_token", NULL};
    for (int i = 0; own[i]; i++)
        if (json_object_get(k, own[i]))
            FAIL(FERRY_ERR_INVALID, "chat_template_kwargs",
                 "'chat_template_kwargs' cannot set '%s' (the request's own fields do)", own[i]);
    *out = k;
    return 0;
}

/* Cuts the rendered chat right after the final message's text (HF's continue_final_message): what the
 * template writes after it (end of turn) goes, so the model continues the message. */
static int cut_after_final(json_t *msgs, char *rendered, size_t *len, struct api_err *e)
{
    size_t last = json_array_size(msgs) - 1;
    char *text = NULL;
    if (content_text(json_object_get(json_array_get(msgs, last), "content"), last, &text, e))
        return e->status;
    const char *t = text ? text : "";
    size_t n = strlen(t);
    for (int pass = 0; pass < 2; pass++) { /* the text as given, then without its outer whitespace */
        const char *p = t;
        size_t m = n;
        if (pass) {
            while (m && (*p == ' ' || *p == '\n' || *p == '\t' || *p == '\r')) p++, m--;
            while (m && (p[m - 1] == ' ' || p[m - 1] == '\n' || p[m - 1] == '\t' || p[m - 1] == '\r')) m--;
        }
        for (size_t at = *len >= m ? *len - m + 1 : 0; m && at-- > 0;) {
            if (!memcmp(rendered + at, p, m)) {
                *len = at + m;
                rendered[*len] = 0;
                free(text);
                return 0;
            }
        }
    }
    free(text);
    FAIL(FERRY_ERR_INVALID, "continue_final_message",
         "'continue_final_message' is set but the final message does not appear in the rendered chat (it "
         "needs non-empty text)");
}

/* Parses the tools and renders the messages through the template (the chat's whole prompt text, before any
 * tool-call marker): *t must be freed with tools_free whatever the outcome; *rendered is malloc'd. */
static int chat_render(const struct api_ctx *a, json_t *o, json_t *msgs, struct tools *t, char **rendered,
                       size_t *rlen, struct api_err *e)
{
    memset(t, 0, sizeof *t);
    *rendered = NULL;
    *rlen = 0;
    if (!msgs || json_is_null(msgs)) FAIL(FERRY_ERR_INVALID, "messages", "'messages' is required");
    if (!json_is_array(msgs) || json_array_size(msgs) == 0)
        FAIL(FERRY_ERR_INVALID, "messages", "'messages' must be a non-empty array");
    if (json_array_size(msgs) > API_MAX_MESSAGES)
        FAIL(FERRY_ERR_INVALID, "messages", "at most %d messages", API_MAX_MESSAGES);
    int rc = parse_tools(o, t, e);
    if (rc) return rc;
    int add_gen = 1, cont = 0;
    if ((rc = chat_flags(o, msgs, &add_gen, &cont, e))) return rc;
    json_t *kwargs = NULL;
    if ((rc = template_kwargs(o, &kwargs, e))) return rc;
    const int fmt = a->tool_format;
    const int tools_active = t->n > 0 && t->choice != CHOICE_NONE;
    const int generic = fmt == TOOL_FORMAT_GENERIC && (tools_active || has_tool_history(msgs));
    char terr[256] = "";
    rc = render_once(a, msgs, t, tools_active, generic, 1, add_gen, kwargs, rendered, rlen, terr, e);
    if (rc && !e->status && has_tool_history(msgs)) { /* this template may want the arguments as strings */
        char terr2[256] = "";
        if (!render_once(a, msgs, t, tools_active, generic, 0, add_gen, kwargs, rendered, rlen, terr2, e))
            rc = 0;
    }
    if (rc) {
        if (!e->status) {
            e->status = rc == FERRY_ERR_NOMEM ? rc : FERRY_ERR_INVALID;
            e->param = "messages";
            snprintf(e->msg, sizeof e->msg, "the chat template failed: %.200s",
                     terr[0] ? terr : ferry_status_str(rc));
        }
        return e->status;
    }
    if (cont && (rc = cut_after_final(msgs, *rendered, rlen, e))) return rc;
    return 0;
}

int api_apply_template(const struct api_ctx *a, const char *body, size_t len, char **out, size_t *out_len,
                       struct api_err *e)
{
    memset(e, 0, sizeof *e);
    json_t *o = api_load_object(body, len, e);
    if (!o) return e->status;
    struct tools t;
    char *rendered = NULL;
    size_t rlen = 0;
    int rc = chat_render(a, o, json_object_get(o, "messages"), &t, &rendered, &rlen, e);
    tools_free(&t);
    json_decref(o);
    if (rc) {
        free(rendered);
        return rc;
    }
    *out = api_dump(json_pack("{s:o}", "prompt", api_jstr(rendered, rlen)), out_len);
    free(rendered);
    return *out ? 0 : FERRY_ERR_NOMEM;
}

int api_chat_prompt(const struct api_ctx *a, struct sreq *r, json_t *o, json_t *msgs, struct api_err *e)
{
    struct tools t;
    char *rendered = NULL;
    size_t rlen = 0;
    int rc = chat_render(a, o, msgs, &t, &rendered, &rlen, e);
    if (rc) goto out;
    const int fmt = a->tool_format;
    const int tools_active = t.n > 0 && t.choice != CHOICE_NONE;
    const int forced = tools_active && (t.choice == CHOICE_REQUIRED || t.choice == CHOICE_NAMED);
    /* a forced call is generated by a grammar of text: harmony's call headers are control tokens, so its
     * models then write the call as HERMES does */
    const int call_fmt =
        fmt == TOOL_FORMAT_GENERIC || (fmt == TOOL_FORMAT_HARMONY && forced) ? TOOL_FORMAT_HERMES : fmt;
    if (forced) {
        char gerr[256] = "";
        const struct tool_def *defs = t.choice == CHOICE_NAMED ? &t.defs[t.named] : t.defs;
        /* a named function is one call, as OpenAI and vLLM answer it, unless parallel calls were asked for */
        const int many = t.choice == CHOICE_NAMED ? t.parallel_set && t.parallel : t.parallel;
        rc = tool_call_grammar(call_fmt, defs, t.choice == CHOICE_NAMED ? 1 : t.n, many ? TOOL_CALL_MAX : 1,
                               API_JSON_WS, &r->grammar, gerr);
        if (rc) {
            e->status = rc == FERRY_ERR_NOMEM || rc == FERRY_ERR_RANGE || rc == FERRY_ERR_UNSUPPORTED
                            ? rc
                            : FERRY_ERR_INVALID;
            rc = e->status;
            e->param = "tools";
            snprintf(e->msg, sizeof e->msg, "%.250s", gerr);
            goto out;
        }
        const char *suffix = tool_call_prompt_suffix(call_fmt);
        if (suffix[0]) {
            char *q = realloc(rendered, rlen + strlen(suffix) + 1);
            if (!q) {
                e->status = rc = FERRY_ERR_NOMEM;
                snprintf(e->msg, sizeof e->msg, "out of memory");
                goto out;
            }
            rendered = q;
            memcpy(rendered + rlen, suffix, strlen(suffix) + 1);
            rlen += strlen(suffix);
            r->tool_prefixed = 1;
        }
    }
    r->tools = tools_active;
    r->tool_format = call_fmt;
    r->keep_special = (tools_active && (call_fmt == TOOL_FORMAT_MISTRAL || call_fmt == TOOL_FORMAT_LLAMA3)) ||
                      call_fmt == TOOL_FORMAT_HARMONY; /* its parser reads the message headers */
    r->reasoning = a->reasoning && !r->grammar;
    r->reasoning_started = r->reasoning && reasoning_prompt_started(rendered, rlen);

    int add_bos = tokenizer_add_bos(a->tok);
    if (add_bos && a->bos_str && a->bos_str[0] && !strncmp(rendered, a->bos_str, strlen(a->bos_str)))
        add_bos = 0;
    r->n_prompts = 1;
    r->prompts = calloc(1, sizeof *r->prompts);
    r->prompt_texts = calloc(1, sizeof *r->prompt_texts);
    r->n_prompt_toks = calloc(1, sizeof *r->n_prompt_toks);
    if (!r->prompts || !r->prompt_texts || !r->n_prompt_toks) {
        e->status = rc = FERRY_ERR_NOMEM;
        snprintf(e->msg, sizeof e->msg, "out of memory");
        goto out;
    }
    rc = api_encode(a, rendered, rlen, add_bos, 1, &r->prompts[0], &r->n_prompt_toks[0]);
    if (rc) {
        e->status = rc, e->param = "messages";
        snprintf(e->msg, sizeof e->msg, "cannot tokenize the rendered chat: %s", ferry_status_str(rc));
        goto out;
    }
    if (r->n_prompt_toks[0] == 0) {
        e->status = rc = FERRY_ERR_INVALID, e->param = "messages";
        snprintf(e->msg, sizeof e->msg, "the rendered chat is empty (0 tokens)");
    }
out:
    tools_free(&t);
    free(rendered);
    return rc;
}

/* ---- response_format ------------------------------------------------------------------------------------
 */

/* A JSON Schema (object or boolean) compiled into r->grammar; field names the request field in errors. */
static int schema_constrain(struct sreq *r, json_t *schema, const char *field, struct api_err *e)
{
    if (!schema || (!json_is_object(schema) && !json_is_boolean(schema)))
        FAIL(FERRY_ERR_INVALID, field, "'%s' needs a 'schema' (a JSON Schema object)", field);
    char *text = json_dumps(schema, JSON_COMPACT | JSON_ENCODE_ANY);
    if (!text) FAIL(FERRY_ERR_NOMEM, NULL, "out of memory");
    char err[256] = "";
    int rc = json_schema_grammar(text, strlen(text), API_JSON_WS, &r->grammar, err);
    free(text);
    if (rc) {
        e->status = rc == FERRY_ERR_NOMEM ? rc : rc == FERRY_ERR_UNSUPPORTED ? rc : FERRY_ERR_INVALID;
        e->param = field;
        snprintf(e->msg, sizeof e->msg, "%s: %.220s", field, err);
        return e->status;
    }
    r->reasoning = 0; /* the grammar decides the whole output */
    return 0;
}

static int refuse_with_tools(const struct sreq *r, const char *field, struct api_err *e)
{
    if (r->grammar || r->tools)
        FAIL(FERRY_ERR_UNSUPPORTED, field,
             "'%s' together with tools or another output constraint is not supported; use tool_choice "
             "'none' or drop one of them",
             field);
    return 0;
}

int api_response_format(const struct api_ctx *a, struct sreq *r, json_t *j, const char *field,
                        struct api_err *e)
{
    (void)a;
    if (!j || json_is_null(j)) return 0;
    const char *type = json_is_object(j) ? json_string_value(json_object_get(j, "type")) : NULL;
    if (!type) FAIL(FERRY_ERR_INVALID, field, "'%s' must be an object with a string 'type'", field);
    if (!strcmp(type, "text")) return 0;
    if (refuse_with_tools(r, field, e)) return e->status;
    json_t *schema = json_object_get(j, "schema");
    if (!strcmp(type, "json_object") && (!schema || json_is_null(schema))) {
        char err[256] = "";
        int rc = grammar_json_object(&r->grammar, API_JSON_WS, 0, err);
        if (rc) {
            e->status = rc == FERRY_ERR_NOMEM ? rc : FERRY_ERR_INVALID;
            e->param = field;
            snprintf(e->msg, sizeof e->msg, "%s: %.220s", field, err);
            return e->status;
        }
        r->reasoning = 0;
        return 0;
    }
    if (!strcmp(type, "json_object")) /* llama-server's {"type": "json_object", "schema": {...}} */
        return schema_constrain(r, schema, field, e);
    if (!strcmp(type, "json_schema")) {
        /* chat completions nest the schema in "json_schema"; /v1/responses' text.format and llama-server
         * hold it directly */
        json_t *js = json_object_get(j, "json_schema");
        return schema_constrain(r, json_object_get(js ? js : j, "schema"), field, e);
    }
    FAIL(FERRY_ERR_INVALID, field,
         "%s type '%.40s' is not supported (use 'text', 'json_object' or 'json_schema')", field, type);
}

int api_output_constraints(const struct api_ctx *a, struct sreq *r, json_t *o, struct api_err *e)
{
    if (api_response_format(a, r, json_object_get(o, "response_format"), "response_format", e))
        return e->status;
    json_t *js = json_object_get(o, "json_schema");
    if (js && !json_is_null(js)) { /* llama-server's top-level form */
        if (refuse_with_tools(r, "json_schema", e)) return e->status;
        if (schema_constrain(r, js, "json_schema", e)) return e->status;
    }
    json_t *g = json_object_get(o, "grammar"); /* llama-server's GBNF */
    if (g && !json_is_null(g)) {
        if (!json_is_string(g)) FAIL(FERRY_ERR_INVALID, "grammar", "'grammar' must be a string (GBNF)");
        if (refuse_with_tools(r, "grammar", e)) return e->status;
        char err[256] = "";
        int rc = grammar_gbnf(json_string_value(g), json_string_length(g), &r->grammar, err);
        if (rc) {
            e->status = rc == FERRY_ERR_NOMEM ? rc : rc == FERRY_ERR_UNSUPPORTED ? rc : FERRY_ERR_INVALID;
            e->param = "grammar";
            snprintf(e->msg, sizeof e->msg, "grammar: %.230s", err);
            return e->status;
        }
        r->reasoning = 0;
    }
    return 0;
}
