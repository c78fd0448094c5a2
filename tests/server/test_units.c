/* Unit tests of the server's pure parts: the option table (env vs argv, bounds, sizes, help), the one
 * status → HTTP mapping, the OpenAI error object, the UTF-8 sanitizer applied to model output, and gpt-oss
 * (harmony) answers rendered as chat completions and Anthropic messages, whole and streamed. */
#include <criterion/criterion.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kernels/core/status.h"
#include "server/api.h"
#include "server/options.h"
#include "server/api_impl.h"
#include "server/sreq.h"
#include "runtime/tool_call.h"

static int parse(struct serve_options *o, char err[256], int argc, char **argv)
{
    *o = serve_options_default();
    return serve_options_parse(o, argc, argv, err);
}

Test(options, defaults)
{
    struct serve_options o = serve_options_default();
    cr_assert_str_eq(o.host, "127.0.0.1");
    cr_assert_eq(o.port, 8080);
    cr_assert_eq(o.parallel, 4);
    cr_assert_eq(o.body_limit, 1 << 20);
    cr_assert_eq(o.seed, -1);
    cr_assert_eq(o.gpu_layers, -1);
    cr_assert_str_eq(o.quant, "none");
    cr_assert_null(o.model);
    cr_assert_eq(o.n_api_keys, 0);
}

Test(options, env_then_argv)
{
    setenv("FERRY_PORT", "9001", 1);
    setenv("FERRY_PARALLEL", "7", 1);
    setenv("FERRY_PUBLIC_HEALTH", "true", 1);
    setenv("FERRY_BODY_LIMIT", "512KiB", 1);
    char *argv[] = {"serve", "--port",    "9002", "--model=/m.gguf", "--api-key",
                    "a",     "--api-key", "b",    "--deterministic"};
    struct serve_options o;
    char err[256];
    cr_assert_eq(parse(&o, err, 9, argv), 0, "%s", err);
    cr_assert_eq(o.port, 9002, "argv wins over the environment");
    cr_assert_eq(o.parallel, 7);
    cr_assert_eq(o.public_health, 1);
    cr_assert_eq(o.body_limit, 512 * 1024);
    cr_assert_str_eq(o.model, "/m.gguf");
    cr_assert_eq(o.n_api_keys, 2);
    cr_assert_str_eq(o.api_keys[1], "b");
    cr_assert_eq(o.deterministic, 1);
}

Test(options, sizes)
{
    char *argv[] = {"serve", "--gpu-memory", "4GiB", "--reserve-vram", "1.5G", "--body-limit", "2048"};
    struct serve_options o;
    char err[256];
    cr_assert_eq(parse(&o, err, 7, argv), 0, "%s", err);
    cr_assert_eq(o.gpu_memory, 4LL << 30);
    cr_assert_eq(o.reserve_vram, 3LL << 29);
    cr_assert_eq(o.body_limit, 2048);
}

Test(options, errors_name_the_option)
{
    struct {
        int argc;
        char *argv[4];
        const char *want;
    } cases[] = {
        {3, {"serve", "--port", "70000"}, "--port"},
        {3, {"serve", "--port", "12x"}, "--port"},
        {3, {"serve", "--parallel", "0"}, "--parallel"},
        {2, {"serve", "--bogus"}, "--bogus"},
        {2, {"serve", "--model"}, "--model"},
        {3, {"serve", "--log-level", "loud"}, "--log-level"},
        {3, {"serve", "--quant", "int3"}, "--quant"},
        {3, {"serve", "--body-limit", "12 parsecs"}, "--body-limit"},
        {3, {"serve", "--public-health=maybe", NULL}, "--public-health"},
        {2, {"serve", "positional"}, "positional"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct serve_options o;
        char err[256] = "";
        cr_assert_eq(parse(&o, err, cases[i].argc, cases[i].argv), FERRY_ERR_INVALID, "case %zu", i);
        cr_assert(strstr(err, cases[i].want), "case %zu: '%s' should name %s", i, err, cases[i].want);
    }
    setenv("FERRY_PORT", "-5", 1);
    char *argv[] = {"serve"};
    struct serve_options o;
    char err[256] = "";
    cr_assert_eq(parse(&o, err, 1, argv), FERRY_ERR_INVALID);
    cr_assert(strstr(err, "FERRY_PORT"), "%s", err);
}

/* --gpus and --gpu-memory per device: one size keeps its meaning (every device's budget), a list gives one
 * per device; every malformed list is refused with what is wrong. */
Test(options, gpus_and_per_device_memory)
{
    struct serve_options o;
    char err[256] = "";
    char *one[] = {"serve", "--gpu-memory", "4GiB"};
    cr_assert_eq(parse(&o, err, 3, one), 0, "%s", err);
    cr_assert_eq(o.gpu_memory, 4LL << 30);
    cr_assert_eq(o.gpus.n, 1);
    cr_assert_eq(o.gpus.ordinal[0], 0);
    cr_assert_eq(opt_gpus_memory(&o.gpus, 0), 4LL << 30);
    cr_assert_eq(opt_gpus_single(&o.gpus, err), 0);

    char *two[] = {"serve", "--gpus", "1,0", "--gpu-memory=20GiB,12.5GiB"};
    cr_assert_eq(parse(&o, err, 4, two), 0, "%s", err);
    cr_assert_eq(o.gpus.n, 2);
    cr_assert_eq(o.gpus.ordinal[0], 1);
    cr_assert_eq(o.gpus.ordinal[1], 0);
    cr_assert_eq(o.gpus.n_memory, 2);
    cr_assert_eq(opt_gpus_memory(&o.gpus, 0), 20LL << 30);
    cr_assert_eq(opt_gpus_memory(&o.gpus, 1), 25LL << 29);
    cr_assert_eq(o.gpu_memory, 20LL << 30, "the first device's budget");
    cr_assert_eq(opt_gpus_single(&o.gpus, err), FERRY_ERR_UNSUPPORTED);
    cr_assert(strstr(err, "--gpus 1,0 names 2 GPUs") && strstr(err, "not implemented yet") &&
                  strstr(err, "ferry inspect --gpus 1,0"),
              "%s", err);

    char *shared[] = {"serve", "--gpus", "0,1,2", "--gpu-memory", "8GiB"};
    cr_assert_eq(parse(&o, err, 5, shared), 0, "%s", err);
    for (int d = 0; d < 3; d++)
        cr_assert_eq(opt_gpus_memory(&o.gpus, d), 8LL << 30, "one size: every device's");

    setenv("FERRY_GPUS", "3", 1);
    char *env[] = {"serve"};
    cr_assert_eq(parse(&o, err, 1, env), 0, "%s", err);
    unsetenv("FERRY_GPUS");
    cr_assert_eq(o.gpus.ordinal[0], 3);
    cr_assert_eq(opt_gpus_single(&o.gpus, err), FERRY_ERR_UNSUPPORTED);
    cr_assert(strstr(err, "CUDA_VISIBLE_DEVICES=3"), "%s", err);

    struct {
        int argc;
        char *argv[5];
        const char *want;
    } bad[] = {
        {3, {"serve", "--gpu-memory", "1GiB,2GiB"}, "gives 2 sizes for the 1 device of --gpus"},
        {5, {"serve", "--gpus", "0,1,2", "--gpu-memory", "1GiB,2GiB"}, "gives 2 sizes for the 3 devices"},
        {3, {"serve", "--gpus", "0,1,0"}, "GPU 0 is named twice"},
        {3, {"serve", "--gpus", "0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16"}, "more than 16 devices"},
        {3, {"serve", "--gpus", "0,,1"}, "item 2 of '0,,1' is empty"},
        {3, {"serve", "--gpus", "0,"}, "item 2 of '0,' is empty"},
        {3, {"serve", "--gpus", "-1"}, "'-1' is not a device ordinal"},
        {3, {"serve", "--gpus", "256"}, "'256' is not a device ordinal"},
        {3, {"serve", "--gpus", "0, 1"}, "' 1' is not a device ordinal"},
        {3, {"serve", "--gpus", ""}, "an empty list of devices"},
        {5, {"serve", "--gpus", "0,1", "--gpu-memory", "4GiB,lots"}, "'lots' is not a size"},
        {5, {"serve", "--gpus", "0,1", "--gpu-memory", "4GiB,-1GiB"}, "'-1GiB' is not a size"},
        {3, {"serve", "--gpu-memory", "lots"}, "--gpu-memory: 'lots' is not a size (e.g. 512KiB, 4GiB)"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        err[0] = 0;
        cr_assert_eq(parse(&o, err, bad[i].argc, bad[i].argv), FERRY_ERR_INVALID, "case %zu", i);
        cr_assert(strstr(err, bad[i].want), "case %zu: '%s' should say %s", i, err, bad[i].want);
    }
}

Test(options, help_lists_every_option_and_env)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    serve_options_help(f);
    fclose(f);
    const char *must[] = {"--model",
                          "FERRY_MODEL",
                          "--api-key",
                          "--api-key-file",
                          "--ctx-size",
                          "--parallel",
                          "--max-batch-tokens",
                          "--threads",
                          "--max-queue",
                          "--body-limit",
                          "--timeout",
                          "--shutdown-timeout",
                          "--cors-origin",
                          "--chat-template",
                          "--public-health",
                          "--log-level",
                          "--served-model-name",
                          "--seed",
                          "--gpu-memory",
                          "--reserve-vram",
                          "--gpu-layers",
                          "--cpu-moe",
                          "--quant",
                          "--deterministic",
                          "FERRY_SHUTDOWN_TIMEOUT",
                          "default 8080",
                          "--gpus N[,N]",
                          "--gpu-memory SIZE[,SIZE]",
                          "FERRY_GPUS",
                          "not implemented yet"};
    for (size_t i = 0; i < sizeof must / sizeof must[0]; i++)
        cr_assert(strstr(buf, must[i]), "help lacks %s", must[i]);
    free(buf);
}

Test(options, key_file)
{
    char path[] = "/tmp/ferry-keys-XXXXXX";
    int fd = mkstemp(path);
    cr_assert(fd >= 0);
    FILE *f = fdopen(fd, "w");
    fputs("# comment\n\n  key-one  \nkey-two\n", f);
    fclose(f);
    struct serve_options o = serve_options_default();
    o.api_key_file = path;
    char err[256];
    cr_assert_eq(serve_options_load_key_file(&o, err), 0, "%s", err);
    cr_assert_eq(o.n_api_keys, 2);
    cr_assert_str_eq(o.api_keys[0], "key-one");
    cr_assert_str_eq(o.api_keys[1], "key-two");
    serve_options_free(&o);
    unlink(path);
    o = serve_options_default();
    o.api_key_file = "/nonexistent/keys";
    cr_assert_eq(serve_options_load_key_file(&o, err), FERRY_ERR_IO);
    cr_assert(strstr(err, "/nonexistent/keys"));
}

Test(api, status_mapping)
{
    struct {
        int st, http;
    } m[] = {{FERRY_ERR_INVALID, 400},      {FERRY_ERR_RANGE, 400},     {FERRY_ERR_FORMAT, 400},
             {FERRY_ERR_UNSUPPORTED, 400},  {FERRY_ERR_NOT_FOUND, 404}, {SERVE_ERR_NO_ROUTE, 404},
             {SERVE_ERR_UNAUTHORIZED, 401}, {SERVE_ERR_METHOD, 405},    {SERVE_ERR_TOO_LARGE, 413},
             {FERRY_ERR_BUSY, 503},         {SERVE_ERR_LOADING, 503},   {SERVE_ERR_SHUTDOWN, 503},
             {FERRY_ERR_TIMEOUT, 504},      {FERRY_ERR_INTERNAL, 500},  {FERRY_ERR_IO, 500},
             {FERRY_ERR_CUDA, 500}};
    for (size_t i = 0; i < sizeof m / sizeof m[0]; i++) {
        const char *type = NULL, *code = NULL;
        cr_assert_eq(api_http_status(m[i].st, &type, &code), m[i].http, "status %d", m[i].st);
        cr_assert(type && *type);
    }
}

Test(api, error_object)
{
    size_t len;
    char *body = api_error_body(FERRY_ERR_INVALID, "bad \"temperature\" \xff", "temperature", &len);
    cr_assert_not_null(body);
    json_error_t je;
    json_t *o = json_loads(body, 0, &je);
    cr_assert_not_null(o, "%s: %s", body, je.text);
    json_t *e = json_object_get(o, "error");
    cr_assert_eq(json_object_size(o), 1);
    cr_assert_str_eq(json_string_value(json_object_get(e, "type")), "invalid_request_error");
    cr_assert_str_eq(json_string_value(json_object_get(e, "param")), "temperature");
    cr_assert(json_is_null(json_object_get(e, "code")));
    cr_assert(strstr(json_string_value(json_object_get(e, "message")), "\xef\xbf\xbd"),
              "invalid byte replaced");
    json_decref(o);
    free(body);
}

Test(api, utf8_sanitize)
{
    struct {
        const char *in;
        size_t n;
        const char *out;
    } c[] = {
        {"plain", 5, "plain"},
        {"\xc3\xa9t\xc3\xa9", 5, "\xc3\xa9t\xc3\xa9"},
        {"\xf0\x9f\x98\x80", 4, "\xf0\x9f\x98\x80"},
        {"a\xff"
         "b",
         3,
         "a\xef\xbf\xbd"
         "b"},
        {"\xe2\x82", 2, "\xef\xbf\xbd"},                         /* truncated sequence: one U+FFFD */
        {"\xf0\x9f\x8c", 3, "\xef\xbf\xbd"},                     /* an emoji cut by max_tokens */
        {"\xe2\x82\xe2\x82\xac", 5, "\xef\xbf\xbd\xe2\x82\xac"}, /* cut, then a whole one */
        {"\xf0\x9f\x8c"
         "A",
         4,
         "\xef\xbf\xbd"
         "A"}, /* cut by an ASCII byte */
        {"\xf4\x90\x80\x80", 4, "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd"}, /* past U+10FFFF */
        {"\xe0\x80\x80", 3, "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd"},                 /* overlong, 3 bytes */
        {"\x80\x80", 2, "\xef\xbf\xbd\xef\xbf\xbd"},                 /* lone continuation bytes */
        {"\xc0\xaf", 2, "\xef\xbf\xbd\xef\xbf\xbd"},                 /* overlong */
        {"\xed\xa0\x80", 3, "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd"}, /* surrogate */
        {"a\0b", 3,
         "a\xef\xbf\xbd"
         "b"}, /* NUL */
    };
    for (size_t i = 0; i < sizeof c / sizeof c[0]; i++) {
        size_t n;
        char *s = utf8_sanitize(c[i].in, c[i].n, &n);
        cr_assert_not_null(s);
        cr_assert_eq(n, strlen(c[i].out), "case %zu", i);
        cr_assert_str_eq(s, c[i].out, "case %zu", i);
        free(s);
    }
}

/* A request that can never fit the KV pool is refused at parsing with a 400 naming the positions it needs
 * and the pool's (--kv-tokens), instead of waiting in the queue forever; one that fits exactly is accepted.
 * Token-id prompts need no tokenizer. */
Test(api, never_fits_the_kv_pool_is_a_400_with_the_numbers)
{
    struct api_ctx a = {0};
    a.model_name = "m";
    a.any_model = 1;
    a.ctx_size = 512;
    a.n_vocab = 100;
    a.default_seed = 1;
    a.kv_positions = 256;
    struct sreq *r = NULL;
    struct api_err e = {0};
    const char *body = "{\"prompt\": [1, 2, 3, 4, 5, 6, 7, 8, 9, 10], \"max_tokens\": 247}";
    int rc = api_parse_request(&a, SREQ_COMPLETION, body, strlen(body), &r, &e);
    cr_assert_eq(rc, FERRY_ERR_RANGE);
    cr_assert_null(r);
    cr_assert_eq(api_http_status(rc, NULL, NULL), 400);
    cr_assert_str_eq(e.param, "max_tokens");
    cr_assert_not_null(strstr(e.msg, "needs 257 KV positions"), "%s", e.msg);
    cr_assert_not_null(strstr(e.msg, "the pool holds 256 (--kv-tokens)"), "%s", e.msg);
    /* 10 + 246 = 256: fits exactly */
    memset(&e, 0, sizeof e);
    body = "{\"prompt\": [1, 2, 3, 4, 5, 6, 7, 8, 9, 10], \"max_tokens\": 246}";
    rc = api_parse_request(&a, SREQ_COMPLETION, body, strlen(body), &r, &e);
    cr_assert_eq(rc, 0, "%s", e.msg);
    cr_assert_eq(r->max_tokens, 246);
    sched_release(NULL, r);
    /* unknown pool (0): not checked here */
    a.kv_positions = 0;
    body = "{\"prompt\": [1, 2, 3], \"max_tokens\": 400}";
    rc = api_parse_request(&a, SREQ_COMPLETION, body, strlen(body), &r, &e);
    cr_assert_eq(rc, 0, "%s", e.msg);
    sched_release(NULL, r);
}

/* ---- gpt-oss (harmony) answers through the renderers --------------------------------------------------- */

/* A chat request of kind k whose one choice generated text (harmony messages with their control tokens, as
 * keep_special leaves them), done or not. */
static struct sreq *harmony_req(enum sreq_kind k, const char *text, size_t len, int done)
{
    struct sreq *r = sreq_new();
    cr_assert_not_null(r);
    r->kind = k;
    snprintf(r->id, sizeof r->id, "chatcmpl-test");
    r->tool_format = TOOL_FORMAT_HARMONY;
    r->reasoning = 1;
    r->tools = 1;
    r->keep_special = 1;
    r->n_choices = r->n = 1;
    r->choices = calloc(1, sizeof *r->choices);
    struct choice *c = &r->choices[0];
    c->rs_item = c->msg_item = -1;
    c->text = strndup(text, len);
    c->text_len = len;
    c->state = done ? CHOICE_DONE : CHOICE_RUNNING;
    c->finish = done ? "stop" : NULL;
    r->n_done = done;
    return r;
}

static const char HARMONY_OUT[] =
    "<|channel|>analysis<|message|>Need the weather; \"quote\" é.<|end|>"
    "<|start|>assistant<|channel|>commentary<|message|>Checking.<|end|>"
    "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>"
    "{\"city\": \"Paris\"}";

/* Streams HARMONY_OUT as r's choice would publish it, a character at a time, into out; then it is done. */
static void stream_bytes(const struct api_ctx *a, struct sreq *r, struct strbuf *out)
{
    const size_t n = strlen(HARMONY_OUT);
    int done = 0;
    for (size_t k = 1; k <= n; k++) {
        if (k < n && (HARMONY_OUT[k] & 0xC0) == 0x80) continue; /* released text holds whole characters */
        struct choice *c = &r->choices[0];
        free(c->text);
        c->text = strndup(HARMONY_OUT, k);
        c->text_len = k;
        if (k == n) c->state = CHOICE_DONE, c->finish = "stop", r->n_done = 1;
        api_render_stream(a, r, out, &done);
    }
    cr_expect(done);
}

/* Every `data:` line of an SSE stream as JSON, in order (the [DONE] line left out). */
static json_t *sse_events(const char *s, size_t n)
{
    json_t *all = json_array();
    for (const char *p = s; p < s + n;) {
        const char *eol = memchr(p, '\n', (size_t)(s + n - p));
        if (!eol) eol = s + n;
        if (eol - p > 6 && !memcmp(p, "data: ", 6) && memcmp(p + 6, "[DONE]", 6)) {
            json_t *j = json_loadb(p + 6, (size_t)(eol - p - 6), 0, NULL);
            cr_assert_not_null(j, "%.*s", (int)(eol - p), p);
            json_array_append_new(all, j);
        }
        p = eol + 1;
    }
    return all;
}

static void cat(char **acc, const char *s)
{
    if (!s) return;
    size_t a = *acc ? strlen(*acc) : 0;
    *acc = realloc(*acc, a + strlen(s) + 1);
    strcpy(*acc + a, s);
}

/* The chat completion of a harmony answer: reasoning_content, content and tool_calls with the arguments as
 * a JSON string; streamed byte by byte, the deltas add up to the same message and no marker shows. */
Test(api_harmony, chat_completion_whole_and_streamed)
{
    struct api_ctx a = {0};
    a.model_name = "m";
    a.tool_format = TOOL_FORMAT_HARMONY;
    const size_t n = strlen(HARMONY_OUT);
    struct sreq *r = harmony_req(SREQ_CHAT, HARMONY_OUT, n, 1);
    size_t len;
    char *body = api_render_full(&a, r, &len);
    json_t *o = json_loadb(body, len, 0, NULL);
    cr_assert_not_null(o, "%s", body);
    json_t *ch = json_array_get(json_object_get(o, "choices"), 0), *msg = json_object_get(ch, "message");
    cr_expect_str_eq(json_string_value(json_object_get(msg, "reasoning_content")),
                     "Need the weather; \"quote\" é.");
    cr_expect_str_eq(json_string_value(json_object_get(msg, "content")), "Checking.");
    cr_expect_str_eq(json_string_value(json_object_get(ch, "finish_reason")), "tool_calls");
    json_t *calls = json_object_get(msg, "tool_calls"), *call = json_array_get(calls, 0);
    cr_assert_eq(json_array_size(calls), 1, "%s", body);
    cr_expect_str_eq(json_string_value(json_object_get(call, "type")), "function");
    cr_expect(!strncmp(json_string_value(json_object_get(call, "id")), "call_", 5));
    json_t *fn = json_object_get(call, "function");
    cr_expect_str_eq(json_string_value(json_object_get(fn, "name")), "get_weather");
    json_t *args = json_loads(json_string_value(json_object_get(fn, "arguments")), 0, NULL);
    cr_expect_str_eq(json_string_value(json_object_get(args, "city")), "Paris");
    json_decref(args);
    free(body);
    sreq_free(r);

    /* streamed: the text grows a byte at a time */
    r = harmony_req(SREQ_CHAT, "", 0, 0);
    struct strbuf out = {0};
    stream_bytes(&a, r, &out);
    json_t *ev = sse_events(out.p, out.len);
    char *rs = NULL, *ct = NULL, *name = NULL, *argtext = NULL;
    const char *finish = NULL;
    size_t i;
    json_t *e;
    json_array_foreach(ev, i, e)
    {
        json_t *c0 = json_array_get(json_object_get(e, "choices"), 0), *d = json_object_get(c0, "delta");
        cat(&rs, json_string_value(json_object_get(d, "reasoning_content")));
        cat(&ct, json_string_value(json_object_get(d, "content")));
        size_t k;
        json_t *tc;
        json_array_foreach(json_object_get(d, "tool_calls"), k, tc)
        {
            cr_expect_eq(json_integer_value(json_object_get(tc, "index")), 0);
            cat(&name, json_string_value(json_object_get(json_object_get(tc, "function"), "name")));
            cat(&argtext, json_string_value(json_object_get(json_object_get(tc, "function"), "arguments")));
        }
        if (json_is_string(json_object_get(c0, "finish_reason")))
            finish = json_string_value(json_object_get(c0, "finish_reason"));
    }
    cr_expect_str_eq(rs, "Need the weather; \"quote\" é.");
    cr_expect_str_eq(ct, "Checking.");
    cr_expect_str_eq(name, "get_weather");
    args = json_loads(argtext, 0, NULL);
    cr_expect_str_eq(json_string_value(json_object_get(args, "city")), "Paris");
    cr_expect_str_eq(finish, "tool_calls");
    cr_expect_null(strstr(out.p, "<|"), "a marker leaked into the stream");
    json_decref(args);
    json_decref(ev);
    json_decref(o);
    free(rs), free(ct), free(name), free(argtext);
    strbuf_free(&out);
    sreq_free(r);
}

/* The same answer on /v1/messages: a thinking block, a text block and a tool_use block with its input as an
 * object, whole and streamed. */
Test(api_harmony, anthropic_message_whole_and_streamed)
{
    struct api_ctx a = {0};
    a.model_name = "m";
    a.tool_format = TOOL_FORMAT_HARMONY;
    const size_t n = strlen(HARMONY_OUT);
    struct sreq *r = harmony_req(SREQ_ANTHROPIC, HARMONY_OUT, n, 1);
    size_t len;
    char *body = api_render_full(&a, r, &len);
    json_t *o = json_loadb(body, len, 0, NULL);
    cr_assert_not_null(o, "%s", body);
    json_t *blocks = json_object_get(o, "content");
    cr_assert_eq(json_array_size(blocks), 3, "%s", body);
    json_t *b0 = json_array_get(blocks, 0), *b1 = json_array_get(blocks, 1), *b2 = json_array_get(blocks, 2);
    cr_expect_str_eq(json_string_value(json_object_get(b0, "type")), "thinking");
    cr_expect_str_eq(json_string_value(json_object_get(b0, "thinking")), "Need the weather; \"quote\" é.");
    cr_expect_str_eq(json_string_value(json_object_get(b1, "type")), "text");
    cr_expect_str_eq(json_string_value(json_object_get(b1, "text")), "Checking.");
    cr_expect_str_eq(json_string_value(json_object_get(b2, "type")), "tool_use");
    cr_expect_str_eq(json_string_value(json_object_get(b2, "name")), "get_weather");
    cr_expect_str_eq(json_string_value(json_object_get(json_object_get(b2, "input"), "city")), "Paris");
    cr_expect_str_eq(json_string_value(json_object_get(o, "stop_reason")), "tool_use");
    free(body);
    json_decref(o);
    sreq_free(r);

    r = harmony_req(SREQ_ANTHROPIC, "", 0, 0);
    struct strbuf out = {0};
    stream_bytes(&a, r, &out);
    json_t *ev = sse_events(out.p, out.len);
    char *thinking = NULL, *text = NULL, *input = NULL, *types = NULL;
    size_t i;
    json_t *e;
    json_array_foreach(ev, i, e)
    {
        const char *type = json_string_value(json_object_get(e, "type"));
        if (!strcmp(type, "content_block_start")) {
            cat(&types, json_string_value(json_object_get(json_object_get(e, "content_block"), "type")));
            cat(&types, " ");
        }
        json_t *d = json_object_get(e, "delta");
        if (!strcmp(type, "content_block_delta")) {
            cat(&thinking, json_string_value(json_object_get(d, "thinking")));
            cat(&text, json_string_value(json_object_get(d, "text")));
            cat(&input, json_string_value(json_object_get(d, "partial_json")));
        }
        if (!strcmp(type, "message_delta"))
            cr_expect_str_eq(json_string_value(json_object_get(d, "stop_reason")), "tool_use");
    }
    cr_expect_str_eq(types, "thinking text tool_use ");
    cr_expect_str_eq(thinking, "Need the weather; \"quote\" é.");
    cr_expect_str_eq(text, "Checking.");
    cr_expect_str_eq(input, "{\"city\":\"Paris\"}");
    cr_expect_null(strstr(out.p, "<|"), "a marker leaked into the stream");
    json_decref(ev);
    free(thinking), free(text), free(input), free(types);
    strbuf_free(&out);
    sreq_free(r);
}

/* An earlier turn's reasoning goes back to gpt-oss's template as "thinking" (its analysis message), and the
 * content beside its tool calls is left out, as llama.cpp passes them (the template refuses both). The
 * expected text is jinja2's rendering of the template with those messages. Run by
 * tests/chat/run_template_sweep.py, which unpacks the template from llama.cpp's tarball. */
Test(api_harmony_prompt, earlier_reasoning_renders_as_analysis)
{
    const char *dir = getenv("FERRY_SWEEP_TEMPLATES");
    if (!dir) cr_skip_test("missing FERRY_SWEEP_TEMPLATES (the gpt-oss template; see run_template_sweep.py)");
    char path[1024];
    snprintf(path, sizeof path, "%s/openai-gpt-oss-120b.jinja", dir);
    FILE *f = fopen(path, "rb");
    cr_assert_not_null(f, "missing %s", path);
    static char tmpl[1 << 17];
    tmpl[fread(tmpl, 1, sizeof tmpl - 1, f)] = 0;
    fclose(f);
    struct api_ctx a = {0};
    a.model_name = "m";
    a.chat_tmpl = tmpl;
    a.tool_format = tool_format_of(tmpl);
    cr_assert_eq(a.tool_format, TOOL_FORMAT_HARMONY);
    const char *body =
        "{\"messages\": [{\"role\": \"user\", \"content\": \"Weather in Paris?\"}, {\"role\": \"assistant\", "
        "\"content\": \"I will check.\", \"reasoning_content\": \"Need the weather.\", \"tool_calls\": "
        "[{\"id\": "
        "\"call_1\", \"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"arguments\": "
        "\"{\\\"city\\\": \\\"Paris\\\"}\"}}]}, {\"role\": \"tool\", \"tool_call_id\": \"call_1\", "
        "\"content\": "
        "\"20 C\"}], \"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", "
        "\"description\": \"Weather of a city.\", \"parameters\": {\"type\": \"object\", \"properties\": "
        "{\"city\": {\"type\": \"string\"}}, \"required\": [\"city\"]}}}]}";
    char *out = NULL;
    size_t len;
    struct api_err e;
    cr_assert_eq(api_apply_template(&a, body, strlen(body), &out, &len, &e), 0, "%s", e.msg);
    json_t *o = json_loadb(out, len, 0, NULL);
    const char *prompt = json_string_value(json_object_get(o, "prompt"));
    cr_assert_not_null(prompt);
    static const char want[] =
        "Weather in Paris?<|end|><|start|>assistant<|channel|>analysis<|message|>Need the weather.<|end|>"
        "<|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>{\"city\": "
        "\"Paris\"}"
        "<|call|><|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>\"20 C\"<|end|>"
        "<|start|>assistant";
    const size_t pl = strlen(prompt), wl = sizeof want - 1;
    cr_expect(pl >= wl && !strcmp(prompt + pl - wl, want), "%s", prompt);
    json_decref(o);
    free(out);
}
