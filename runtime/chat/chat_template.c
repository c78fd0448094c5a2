/* chat_template — the public face of the Jinja chat-template interpreter and the built-in templates.
 *
 * A render normalises the source as Jinja does (CRLF/CR -> LF, one trailing newline dropped), parses it
 * (jinja_parse.c), binds messages / add_generation_prompt / bos_token / eos_token in the root scope and
 * evaluates (jinja_eval.c). All memory lives in one arena freed here; failures longjmp back here.
 * The built-in templates are the texts the model families ship in their tokenizer_config.json.
 */
#include "runtime/chat_template.h"

#include "kernels/core/status.h"
#include "runtime/chat/jinja.h"

#include <jansson.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- built-in templates --------------------------------------------------------------------------- */

struct builtin {
    const char *name;
    const char *src;
};

static const struct builtin builtins[] = {
    /* ChatML as in teknium/OpenHermes-2.5-Mistral-7B */
    {"chatml",
     "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + "
     "'<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif "
     "%}"},
    /* meta-llama/Llama-2-7b-chat-hf */
    {"llama2",
     "{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}{% set system_message = "
     "messages[0]['content'] %}{% else %}{% set loop_messages = messages %}{% set system_message = false "
     "%}{% endif "
     "%}{% for message in loop_messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ "
     "raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}{% "
     "if "
     "loop.index0 == 0 and system_message != false %}{% set content = '<<SYS>>\\n' + system_message + "
     "'\\n<</SYS>>\\n\\n' + message['content'] %}{% else %}{% set content = message['content'] %}{% endif "
     "%}{% if "
     "message['role'] == 'user' %}{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}{% elif "
     "message['role'] "
     "== 'assistant' %}{{ ' '  + content.strip() + ' ' + eos_token }}{% endif %}{% endfor %}"},
    /* meta-llama/Meta-Llama-3-8B-Instruct */
    {"llama3", "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = "
               "'<|start_header_id|>' + "
               "message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' %}{% if "
               "loop.index0 == 0 "
               "%}{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}{% if "
               "add_generation_prompt %}{{ "
               "'<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"},
    /* mistralai/Mistral-7B-Instruct-v0.2 */
    {"mistral", "{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') != "
                "(loop.index0 % 2 == 0) %}{{ "
                "raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% "
                "endif %}{% if "
                "message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}{% elif "
                "message['role'] == "
                "'assistant' %}{{ message['content'] + eos_token}}{% else %}{{ raise_exception('Only user "
                "and assistant roles "
                "are supported!') }}{% endif %}{% endfor %}"},
    /* google/gemma-7b-it */
    {"gemma",
     "{{ bos_token }}{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') "
     "}}{% "
     "endif %}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ "
     "raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}{% "
     "if "
     "(message['role'] == 'assistant') %}{% set role = 'model' %}{% else %}{% set role = message['role'] "
     "%}{% endif "
     "%}{{ '<start_of_turn>' + role + '\\n' + message['content'] | trim + '<end_of_turn>\\n' }}{% endfor "
     "%}{% if "
     "add_generation_prompt %}{{'<start_of_turn>model\\n'}}{% endif %}"},
    /* microsoft/Phi-3-mini-4k-instruct */
    {"phi3", "{% for message in messages %}{% if message['role'] == 'system' %}{{'<|system|>\n' + "
             "message['content'] + "
             "'<|end|>\n'}}{% elif message['role'] == 'user' %}{{'<|user|>\n' + message['content'] + "
             "'<|end|>\n'}}{% elif "
             "message['role'] == 'assistant' %}{{'<|assistant|>\n' + message['content'] + '<|end|>\n'}}{% "
             "endif %}{% endfor "
             "%}{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% else %}{{ eos_token }}{% endif %}"},
    /* HuggingFaceH4/zephyr-7b-beta */
    {"zephyr",
     "{% for message in messages %}\n{% if message['role'] == 'user' %}\n{{ '<|user|>\n' + "
     "message['content'] + "
     "eos_token }}\n{% elif message['role'] == 'system' %}\n{{ '<|system|>\n' + message['content'] + "
     "eos_token }}\n{% "
     "elif message['role'] == 'assistant' %}\n{{ '<|assistant|>\n'  + message['content'] + eos_token }}\n{% "
     "endif "
     "%}\n{% if loop.last and add_generation_prompt %}\n{{ '<|assistant|>' }}\n{% endif %}\n{% endfor %}"},
    /* google/gemma-4-31B-it's turns for plain messages (no tools; thinking off, its default) */
    {"gemma4",
     "{{ bos_token }}{% for message in messages %}{% if message['role'] == 'assistant' %}{% set role = "
     "'model' %}{% else %}{% set role = message['role'] %}{% endif %}{{ '<|turn>' + role + '\n' + "
     "message['content'] | trim + '<turn|>\n' }}{% endfor %}{% if add_generation_prompt %}{{ "
     "'<|turn>model\n<|channel>thought\n<channel|>' }}{% endif %}"},
};

#define N_BUILTINS (sizeof builtins / sizeof *builtins)

const char *chat_template_builtin(const char *name)
{
    if (!name) return NULL;
    for (size_t i = 0; i < N_BUILTINS; i++)
        if (strcmp(builtins[i].name, name) == 0) return builtins[i].src;
    return NULL;
}

const char *const *chat_template_builtin_names(void)
{
    /* a constant table (no lazy init, so no race); chat_template_builtin() is the source of truth */
    static const char *const names[] = {"chatml", "llama2", "llama3", "mistral", "gemma",
                                        "phi3",   "zephyr", "gemma4", NULL};
    _Static_assert(sizeof names / sizeof *names == N_BUILTINS + 1, "names and builtins differ");
    return names;
}

/* ---- render --------------------------------------------------------------------------------------- */

struct chat_template_params chat_template_default_params(void)
{
    return (struct chat_template_params){
        .max_output = (size_t)4 << 20, .max_memory = 0, .max_steps = 1000000, .max_depth = 400};
}

static void normalise_source(struct jctx *c, const char *tmpl)
{
    size_t n = strlen(tmpl), o = 0;
    char *s = jalloc(c, n + 1);
    for (size_t i = 0; i < n; i++) {
        if (tmpl[i] == '\r') {
            s[o++] = '\n';
            if (i + 1 < n && tmpl[i + 1] == '\n') i++;
        } else {
            s[o++] = tmpl[i];
        }
    }
    if (o > 0 && s[o - 1] == '\n') o--; /* Jinja drops one trailing newline (keep_trailing_newline=False) */
    s[o] = 0;
    c->src = s;
    c->src_len = o;
}

static struct jv cstr_value(struct jctx *c, const char *s)
{
    size_t n = strlen(s);
    return jv_str(jstrdup(c, s, n), n);
}

/* JSON (jansson) -> template values, in the render's arena. Objects keep their key order. */
static struct jv json_to_jv(struct jctx *c, json_t *j)
{
    jcharge(c, 1);
    switch (json_typeof(j)) {
    case JSON_OBJECT: {
        struct jv d = jv_dict(c, json_object_size(j));
        const char *k;
        json_t *v;
        json_object_foreach(j, k, v) jdict_set(c, d.d, cstr_value(c, k), json_to_jv(c, v));
        return d;
    }
    case JSON_ARRAY: {
        struct jv l = jv_list(c, json_array_size(j));
        size_t i;
        json_t *v;
        json_array_foreach(j, i, v) jlist_push(c, l.l, json_to_jv(c, v));
        return l;
    }
    case JSON_STRING:
        return jv_str(jstrdup(c, json_string_value(j), json_string_length(j)), json_string_length(j));
    case JSON_INTEGER:
        return jv_int(json_integer_value(j));
    case JSON_REAL:
        return jv_float(json_real_value(j));
    case JSON_TRUE:
        return jv_bool(1);
    case JSON_FALSE:
        return jv_bool(0);
    default:
        return jv_none();
    }
}

/* Parses a JSON text into a template value; fails the render when it is not JSON of the expected type. */
static struct jv json_text_value(struct jctx *c, const char *text, int type, const char *what)
{
    json_error_t jerr;
    json_t *j = json_loads(text, JSON_DECODE_ANY, &jerr);
    if (!j) jfail(c, FERRY_ERR_INVALID, JNO_OFF, "%s is not valid JSON: %s", what, jerr.text);
    if ((int)json_typeof(j) != type) {
        json_decref(j);
        jfail(c, FERRY_ERR_INVALID, JNO_OFF, "%s must be a JSON %s", what,
              type == JSON_ARRAY ? "array" : "object");
    }
    struct jv v = json_to_jv(c, j);
    json_decref(j);
    return v;
}

/* What a render binds: JSON variables (in), or plain role/content messages when in is NULL. */
struct render_args {
    const struct chat_render *in;
    const struct chat_msg *msgs;
    int n_msgs;
    int add_generation_prompt;
    const char *bos_token, *eos_token;
};

/* A render context bounded by p (max_memory set); NULL with err filled when out of memory. */
static struct jctx *jctx_new(const struct chat_template_params *p, char err[256])
{
    struct jctx *c = calloc(1, sizeof *c);
    if (!c) {
        if (err) snprintf(err, 256, "out of memory");
        return NULL;
    }
    c->arena.limit = p->max_memory;
    c->max_output = p->max_output;
    c->max_steps = p->max_steps;
    c->max_depth = p->max_depth;
    return c;
}

/* The common render (its arguments come in one struct: nothing here is modified after setjmp). */
static int render(const char *tmpl, const struct render_args *a, const struct chat_template_params *params,
                  char **out, size_t *out_len, char err[256])
{
    const struct chat_render *in = a->in;
    const struct chat_msg *msgs = a->msgs;
    const int n_msgs = a->n_msgs;
    if (err) err[0] = 0;
    if (out) *out = NULL;
    if (out_len) *out_len = 0;
    if (!tmpl || !out || (!in && (n_msgs < 0 || (n_msgs > 0 && !msgs))) || (in && !in->messages_json)) {
        if (err) snprintf(err, 256, "chat_template_render: invalid argument");
        return FERRY_ERR_INVALID;
    }
    struct chat_template_params p = params ? *params : chat_template_default_params();
    const char *const bos = in ? in->bos_token : a->bos_token, *const eos = in ? in->eos_token : a->eos_token;
    const int add_gen = in ? in->add_generation_prompt : a->add_generation_prompt;
    size_t msg_bytes = 0;
    if (in) {
        msg_bytes = strlen(in->messages_json) + (in->tools_json ? strlen(in->tools_json) : 0) +
                    (in->extra_json ? strlen(in->extra_json) : 0);
    } else {
        for (int i = 0; i < n_msgs; i++)
            msg_bytes +=
                (msgs[i].role ? strlen(msgs[i].role) : 0) + (msgs[i].content ? strlen(msgs[i].content) : 0);
    }
    if (p.max_memory == 0) p.max_memory = ((size_t)64 << 20) + 16 * msg_bytes + 4 * strlen(tmpl);

    struct jctx *c = jctx_new(&p, err);
    if (!c) return FERRY_ERR_NOMEM;
    int rc = FERRY_OK;
    if (setjmp(c->fail)) {
        rc = c->status;
        if (err) snprintf(err, 256, "%s", c->err);
        jarena_free(&c->arena);
        free(c);
        return rc;
    }
    normalise_source(c, tmpl);
    struct jnode *body = jinja_parse(c);

    struct jframe *root = jalloc(c, sizeof *root);
    *root = (struct jframe){0};
    struct jv list;
    if (in) {
        list = json_text_value(c, in->messages_json, JSON_ARRAY, "messages");
    } else {
        list = jv_list(c, (size_t)n_msgs);
        for (int i = 0; i < n_msgs; i++) {
            struct jv m = jv_dict(c, 2);
            jdict_set(c, m.d, jv_cstr("role"), msgs[i].role ? cstr_value(c, msgs[i].role) : jv_none());
            jdict_set(c, m.d, jv_cstr("content"),
                      msgs[i].content ? cstr_value(c, msgs[i].content) : jv_none());
            jlist_push(c, list.l, m);
        }
    }
    jdict_set(c, &root->vars, jv_cstr("messages"), list);
    jdict_set(c, &root->vars, jv_cstr("add_generation_prompt"), jv_bool(add_gen));
    /* HF's apply_chat_template always passes these, as None when absent */
    jdict_set(c, &root->vars, jv_cstr("tools"),
              in && in->tools_json ? json_text_value(c, in->tools_json, JSON_ARRAY, "tools") : jv_none());
    jdict_set(c, &root->vars, jv_cstr("documents"), jv_none());
    if (in && in->extra_json) {
        struct jv extra = json_text_value(c, in->extra_json, JSON_OBJECT, "the extra template variables");
        for (size_t i = 0; i < extra.d->n; i++) jdict_set(c, &root->vars, extra.d->k[i], extra.d->v[i]);
    }
    c->root = root;
    if (bos) jdict_set(c, &root->vars, jv_cstr("bos_token"), cstr_value(c, bos));
    if (eos) jdict_set(c, &root->vars, jv_cstr("eos_token"), cstr_value(c, eos));

    struct jbuf buf = {0};
    c->out = &buf;
    jinja_render(c, body);

    char *res = malloc(buf.n + 1);
    if (!res) {
        if (err) snprintf(err, 256, "out of memory");
        rc = FERRY_ERR_NOMEM;
    } else {
        if (buf.n) memcpy(res, buf.p, buf.n);
        res[buf.n] = 0;
        *out = res;
        if (out_len) *out_len = buf.n;
    }
    jarena_free(&c->arena);
    free(c);
    return rc;
}

int chat_template_check(const char *tmpl, char err[256])
{
    if (err) err[0] = 0;
    if (!tmpl) {
        if (err) snprintf(err, 256, "chat_template_check: invalid argument");
        return FERRY_ERR_INVALID;
    }
    struct chat_template_params p = chat_template_default_params();
    p.max_memory = ((size_t)64 << 20) + 4 * strlen(tmpl);
    struct jctx *c = jctx_new(&p, err);
    if (!c) return FERRY_ERR_NOMEM;
    int rc = FERRY_OK;
    if (setjmp(c->fail)) {
        rc = c->status;
        if (err) snprintf(err, 256, "%s", c->err);
    } else {
        normalise_source(c, tmpl);
        jinja_parse(c);
    }
    jarena_free(&c->arena);
    free(c);
    return rc;
}

int chat_template_render_ex(const char *tmpl, const struct chat_msg *msgs, int n_msgs,
                            int add_generation_prompt, const char *bos_token, const char *eos_token,
                            const struct chat_template_params *params, char **out, size_t *out_len,
                            char err[256])
{
    struct render_args a = {NULL, msgs, n_msgs, add_generation_prompt, bos_token, eos_token};
    return render(tmpl, &a, params, out, out_len, err);
}

int chat_template_render_json(const char *tmpl, const struct chat_render *in,
                              const struct chat_template_params *params, char **out, size_t *out_len,
                              char err[256])
{
    struct render_args a = {in, NULL, 0, 0, NULL, NULL};
    return render(tmpl, &a, params, out, out_len, err);
}

int chat_template_render(const char *tmpl, const struct chat_msg *msgs, int n_msgs, int add_generation_prompt,
                         const char *bos_token, const char *eos_token, char **out, size_t *out_len,
                         char err[256])
{
    return chat_template_render_ex(tmpl, msgs, n_msgs, add_generation_prompt, bos_token, eos_token, NULL, out,
                                   out_len, err);
}
