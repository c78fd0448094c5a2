/* test_tool_call — the tool-call conventions (format detection on the real templates, the call grammar) and
 * the parsers of model output: tool calls (Hermes, Llama 3, Mistral) and <think> reasoning. Streaming
 * property for both: parsing every prefix never takes back content and only ever adds calls. */
#include <criterion/criterion.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/core/status.h"
#include "runtime/chat_template.h"
#include "runtime/grammar.h"
#include "runtime/reasoning.h"
#include "runtime/tool_call.h"

static char *read_template(const char *name)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/tests/chat/templates/%s", getenv("FERRY_SRC"), name);
    FILE *f = fopen(path, "rb");
    cr_assert(f, "missing %s", path);
    static char buf[1 << 16];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    return strdup(buf);
}

Test(tool_call, formats_of_real_templates)
{
    const struct {
        const char *file;
        enum tool_format f;
    } cases[] = {{"Qwen-Qwen2.5-7B-Instruct.jinja", TOOL_FORMAT_HERMES},
                 {"meta-llama-Llama-3.1-8B-Instruct.jinja", TOOL_FORMAT_LLAMA3},
                 {"mistralai-Mistral-Nemo-Instruct-2407.jinja", TOOL_FORMAT_MISTRAL},
                 {"deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja", TOOL_FORMAT_GENERIC}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *t = read_template(cases[i].file);
        cr_expect_eq(tool_format_of(t), cases[i].f, "%s: %s", cases[i].file,
                     tool_format_name(tool_format_of(t)));
        free(t);
    }
    cr_expect_eq(tool_format_of(chat_template_builtin("chatml")), TOOL_FORMAT_GENERIC);
    cr_expect_eq(tool_format_of(chat_template_builtin("llama3")), TOOL_FORMAT_GENERIC); /* 3.0: no tools */
}

/* Parses text with f; checks content and the calls' names and arguments (NULL-terminated pairs). */
static void expect_parse(enum tool_format f, const char *text, int prefixed, const char *content,
                         const char **calls)
{
    struct tool_parse p;
    cr_assert_eq(tool_call_parse(f, text, strlen(text), 1, prefixed, &p), 0);
    cr_expect_eq(p.content_end, strlen(content), "%s: content %zu bytes, want %zu", text, p.content_end,
                 strlen(content));
    cr_expect(!strncmp(text, content, strlen(content)));
    int n = 0;
    while (calls && calls[2 * n]) n++;
    cr_expect_eq(p.n_calls, n, "%s: %d calls, want %d", text, p.n_calls, n);
    for (int k = 0; k < n && k < p.n_calls; k++) {
        cr_expect_str_eq(p.calls[k].name, calls[2 * k]);
        json_t *got = json_loads(p.calls[k].arguments, 0, NULL),
               *want = json_loads(calls[2 * k + 1], 0, NULL);
        cr_expect(got && want && json_equal(got, want), "%s: arguments %s, want %s", text,
                  p.calls[k].arguments, calls[2 * k + 1]);
        json_decref(got);
        json_decref(want);
    }
    tool_parse_free(&p);
}

Test(tool_call, parses_each_convention)
{
    const char *one[] = {"get_weather", "{\"city\": \"Paris\"}", NULL};
    const char *two[] = {"a", "{}", "b", "{\"x\": [1, 2]}", NULL};
    expect_parse(TOOL_FORMAT_HERMES,
                 "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": "
                 "{\"city\": \"Paris\"}}\n</tool_call>",
                 0, "Let me check.\n", one);
    expect_parse(TOOL_FORMAT_HERMES,
                 "<tool_call>\n{\"name\": \"a\", \"arguments\": {}}\n</tool_call>\n<tool_call>\n"
                 "{\"name\": \"b\", \"arguments\": {\"x\": [1, 2]}}\n</tool_call>",
                 0, "", two);
    /* arguments as a JSON string, as some models write them */
    expect_parse(TOOL_FORMAT_HERMES,
                 "<tool_call>{\"name\": \"get_weather\", \"arguments\": \"{\\\"city\\\": "
                 "\\\"Paris\\\"}\"}</tool_call>",
                 0, "", one);
    expect_parse(TOOL_FORMAT_HERMES, "No call here, <tool> is not one.", 0,
                 "No call here, <tool> is not one.", NULL);
    /* a broken call is content, not lost */
    expect_parse(TOOL_FORMAT_HERMES, "x <tool_call>\n{\"name\": \"f\", \"argu", 0,
                 "x <tool_call>\n{\"name\": \"f\", \"argu", NULL);
    expect_parse(TOOL_FORMAT_HERMES, "<tool_call>{\"arguments\": {}}</tool_call>", 0,
                 "<tool_call>{\"arguments\": {}}</tool_call>", NULL);
    expect_parse(TOOL_FORMAT_LLAMA3, "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}", 0,
                 "", one);
    expect_parse(TOOL_FORMAT_LLAMA3,
                 "<|python_tag|>{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}", 0, "",
                 one);
    expect_parse(TOOL_FORMAT_LLAMA3,
                 " {\"name\": \"a\", \"parameters\": {}}; {\"name\": \"b\", \"arguments\": "
                 "{\"x\": [1, 2]}}",
                 0, "", two);
    expect_parse(TOOL_FORMAT_LLAMA3, "{\"answer\": 42}", 0, "{\"answer\": 42}", NULL);
    expect_parse(TOOL_FORMAT_LLAMA3, "Paris is the capital.", 0, "Paris is the capital.", NULL);
    expect_parse(TOOL_FORMAT_MISTRAL,
                 "Sure.[TOOL_CALLS][{\"name\": \"a\", \"arguments\": {}}, {\"name\": \"b\", "
                 "\"arguments\": {\"x\": [1, 2]}, \"id\": \"abcdefghi\"}]",
                 0, "Sure.", two);
    expect_parse(TOOL_FORMAT_MISTRAL, "[{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}]",
                 1, "", one);
    expect_parse(TOOL_FORMAT_MISTRAL, "[TOOL_CALLS][{\"nam", 0, "[TOOL_CALLS][{\"nam", NULL);
}

static void check_stream(enum tool_format f, const char *text);

/* One HERMES call {"name": "f", "arguments": <args>} (args as JSON text), parsed whole: the arguments it
 * yields (NULL when it is content, not a call). The caller frees. */
static char *hermes_args(const char *args)
{
    char text[1024];
    snprintf(text, sizeof text, "<tool_call>\n{\"name\": \"f\", \"arguments\": %s}\n</tool_call>", args);
    struct tool_parse p;
    cr_assert_eq(tool_call_parse(TOOL_FORMAT_HERMES, text, strlen(text), 1, 0, &p), 0);
    char *a = NULL;
    if (p.n_calls) {
        cr_assert_eq(p.n_calls, 1, "%s", text);
        cr_expect_eq(p.content_end, 0);
        a = strdup(p.calls[0].arguments);
    } else {
        cr_expect_eq(p.content_end, strlen(text), "%s: not a call, so all of it is content", text);
    }
    tool_parse_free(&p);
    return a;
}

/* args (JSON text) gives a call whose arguments decode (Python's way: jansson, or the raw text compared) to
 * want_json; want_json NULL: not a call. */
static void expect_args(const char *args, const char *want_json)
{
    char *a = hermes_args(args);
    if (!want_json) {
        cr_expect(!a, "%s: taken as a call with arguments %s", args, a ? a : "");
    } else {
        cr_assert(a, "%s: not taken as a call", args);
        json_t *got = json_loads(a, JSON_ALLOW_NUL, NULL),
               *want = json_loads(want_json, JSON_ALLOW_NUL, NULL);
        cr_assert(want);
        cr_expect(json_is_object(got) && json_equal(got, want), "%s: arguments %s, want %s", args, a,
                  want_json);
        json_decref(got);
        json_decref(want);
    }
    free(a);
}

/* Arguments must reach the client as the text of a JSON object: a string holding one is unwrapped, any other
 * string (or value) is not a call. */
Test(tool_call, string_arguments)
{
    expect_args("\"Paris\"", NULL);
    expect_args("\"{\\\"city\\\":\\\"Paris\\\"}\"", "{\"city\": \"Paris\"}");
    expect_args("\" \\n {\\\"city\\\": \\\"Paris\\\"} \\t\"",
                "{\"city\": \"Paris\"}"); /* whitespace around */
    expect_args("\"\"", NULL);
    expect_args("\"   \"", NULL);
    expect_args("\"[1]\"", NULL);
    expect_args("\"42\"", NULL);
    expect_args("\"null\"", NULL);
    expect_args("\"{}\"", "{}");
    expect_args("\"{\\\"a\\\": 1} x\"", NULL); /* an object, then more */
    expect_args("\"{\\\"a\\\": 1}{}\"", NULL); /* two objects */
    expect_args("\"{\\\"a\\\": \"", NULL);     /* cut off */
    expect_args("\"{'a': 1}\"", NULL);         /* not JSON */
    /* nested escapes: a string inside the stringified object, holding a quote, a backslash and JSON */
    expect_args("\"{\\\"q\\\": \\\"say \\\\\\\"hi\\\\\\\" \\\\\\\\ {\\\\\\\"x\\\\\\\": 1}\\\"}\"",
                "{\"q\": \"say \\\"hi\\\" \\\\ {\\\"x\\\": 1}\"}");
    expect_args("\"{\\\"s\\\": \\\"\\\\u00e9\\\\u0000\\\"}\"", "{\"s\": \"\\u00e9\\u0000\"}");
    /* a stringified object holding the close marker */
    expect_args("\"{\\\"s\\\": \\\"</tool_call>\\\"}\"", "{\"s\": \"</tool_call>\"}");
    /* arguments that are neither an object nor a string */
    expect_args("[1]", NULL);
    expect_args("42", NULL);
    expect_args("null", NULL);
    expect_args("{\"city\": \"Paris\"}", "{\"city\": \"Paris\"}");
    /* the other conventions unwrap the same way */
    const char *one[] = {"get_weather", "{\"city\": \"Paris\"}", NULL};
    expect_parse(TOOL_FORMAT_LLAMA3,
                 "{\"name\": \"get_weather\", \"parameters\": \"{\\\"city\\\": \\\"Paris\\\"}\"}", 0, "",
                 one);
    expect_parse(TOOL_FORMAT_LLAMA3, "{\"name\": \"get_weather\", \"parameters\": \"Paris\"}", 0,
                 "{\"name\": \"get_weather\", \"parameters\": \"Paris\"}", NULL);
    expect_parse(TOOL_FORMAT_MISTRAL,
                 "[{\"name\": \"get_weather\", \"arguments\": \"{\\\"city\\\": \\\"Paris\\\"}\"}]", 1, "",
                 one);
    expect_parse(TOOL_FORMAT_MISTRAL, "[{\"name\": \"get_weather\", \"arguments\": \"Paris\"}]", 1,
                 "[{\"name\": \"get_weather\", \"arguments\": \"Paris\"}]", NULL);
}

/* What the call grammar generates must parse as a call: the close marker inside a string of the arguments
 * (SmolLM2 wrote one in test_structured, and the call came back as content), numbers beyond jansson's range,
 * \u0000, and a repeated key. */
Test(tool_call, grammar_forms_parse)
{
    const char *marker[] = {"send_email", "{\"unit\": \"a</tool_call><b>\\\"}\"}", NULL};
    expect_parse(
        TOOL_FORMAT_HERMES,
        "<tool_call>\n{\"name\": \"send_email\", \"arguments\": {\"unit\": \"a</tool_call><b>\\\"}\"}}\n"
        "</tool_call>",
        0, "", marker);
    check_stream(TOOL_FORMAT_HERMES,
                 "<tool_call>\n{\"name\": \"send_email\", \"arguments\": {\"unit\": \"a</tool_call><b>\"}}\n"
                 "</tool_call>");
    /* SmolLM2-135M's answer to case 107 of test_tool_choice_required_random (the old parser gave it back as
     * content, finish_reason "stop") */
    const char *smol[] = {
        "send_email",
        "{\"unit\": \"email-target-rounded-to-12emrinted-to-text-field_address_to_text_anchor(true)},"
        "'dropdown':true,}]</tool_call><script>alert({{user}});</script>The_method_to_check_if_mail_"
        "is_available_to_usermail_to_get_bin_bound_by_lawx_to_1jg+z+tg+bgv+j4zv+j9tjcmp+vg1j@1+\"}",
        NULL};
    expect_parse(
        TOOL_FORMAT_HERMES,
        "<tool_call>\n{\"name\": \"send_email\", \"arguments\": {\"unit\": \"email-target-rounded-to-"
        "12emrinted-to-text-field_address_to_text_anchor(true)},'dropdown':true,}]</tool_call><script>alert("
        "{{user}});</script>The_method_to_check_if_mail_is_available_to_usermail_to_get_bin_bound_by_lawx_"
        "to_1jg+z+tg+bgv+j4zv+j9tjcmp+vg1j@1+\"}}\n</tool_call>",
        0, "", smol);
    /* the marker inside a string, then the object never closes: content */
    expect_parse(TOOL_FORMAT_HERMES, "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"u\": \"</tool_call>",
                 0, "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"u\": \"</tool_call>", NULL);
    char *a = hermes_args("{\"n\": 123456789012345678901234567890, \"x\": -1.5e9999, \"y\": [0.25E-3]}");
    cr_assert(a, "big numbers: not a call");
    cr_expect_str_eq(a, "{\"n\": 123456789012345678901234567890, \"x\": -1.5e9999, \"y\": [0.25E-3]}");
    free(a);
    a = hermes_args("{\"s\": \"nul \\u0000 here\"}");
    cr_assert(a, "\\u0000: not a call");
    cr_expect_str_eq(a, "{\"s\":\"nul \\u0000 here\"}");
    free(a);
    expect_args("{\"a\": 1, \"a\": 2}", "{\"a\": 2}");
    const char *last[] = {"g", "{\"b\": 1}", NULL};
    expect_parse(TOOL_FORMAT_HERMES,
                 "<tool_call>{\"name\": \"f\", \"arguments\": {}, \"name\": \"g\", "
                 "\"arguments\": {\"b\": 1}}</tool_call>",
                 0, "", last);
    /* a key written with escapes is the same key */
    const char *esc[] = {"f", "{\"c\": 1}", NULL};
    expect_parse(TOOL_FORMAT_HERMES,
                 "<tool_call>{\"n\\u0061me\": \"f\", \"argument\\u0073\": {\"c\": 1}}</tool_call>", 0, "",
                 esc);
    /* not JSON after all: an invalid escape, a raw control byte, bad UTF-8, a name with \u0000 */
    expect_args("{\"s\": \"\\x\"}", NULL);
    expect_args("{\"s\": \"a\tb\"}", NULL);
    expect_args("{\"s\": \"\xc3\x28\"}", NULL);
    expect_parse(TOOL_FORMAT_HERMES, "<tool_call>{\"name\": \"f\\u0000\", \"arguments\": {}}</tool_call>", 0,
                 "<tool_call>{\"name\": \"f\\u0000\", \"arguments\": {}}</tool_call>", NULL);
}

/* The call grammar generates only objects as arguments: a schema that leaves the type open is narrowed to
 * objects, one that allows only something else is refused. */
Test(tool_call, grammar_arguments_are_objects)
{
    const char *ok[] = {"{}",
                        "{\"description\": \"any\"}",
                        "{\"type\": [\"object\", \"string\"]}",
                        "{\"properties\": {\"a\": {\"type\": \"integer\"}}}",
                        "{\"type\": \"object\", \"properties\": {\"a\": {\"type\": \"string\"}}}",
                        NULL};
    const char *bad[] = {"{\"type\": \"string\"}",
                         "{\"type\": [\"string\", \"null\"]}",
                         "{\"anyOf\": [{\"type\": \"object\"}, {\"type\": \"integer\"}]}",
                         "{\"enum\": [\"a\", 1]}",
                         "{\"const\": \"Paris\"}",
                         NULL};
    const enum tool_format fmts[] = {TOOL_FORMAT_HERMES, TOOL_FORMAT_LLAMA3, TOOL_FORMAT_MISTRAL};
    for (size_t fi = 0; fi < 3; fi++) {
        for (int i = 0; ok[i]; i++) {
            struct tool_def t = {"f", ok[i]};
            struct grammar *g;
            char err[256];
            cr_expect_eq(tool_call_grammar(fmts[fi], &t, 1, 1, 4, &g, err), 0, "%s: %s", ok[i], err);
            grammar_free(g);
        }
        for (int i = 0; bad[i]; i++) {
            struct tool_def t[2] = {{"g", NULL}, {"f", bad[i]}};
            struct grammar *g;
            char err[256];
            cr_expect_eq(tool_call_grammar(fmts[fi], t, 2, 1, 4, &g, err), FERRY_ERR_INVALID, "%s", bad[i]);
            cr_expect(!g);
            cr_expect(strstr(err, "'f'") && strstr(err, "object"), "%s: %s", bad[i], err);
        }
    }
}

/* Every prefix of text, parsed as a stream: content never shrinks, calls only grow, and the end agrees. */
static void check_stream(enum tool_format f, const char *text)
{
    size_t n = strlen(text), last_content = 0;
    int last_calls = 0;
    for (size_t k = 0; k <= n; k++) {
        struct tool_parse p;
        cr_assert_eq(tool_call_parse(f, text, k, 0, 0, &p), 0);
        cr_expect_geq(p.content_end, last_content, "%s: content shrank at %zu", text, k);
        cr_expect_geq(p.n_calls, last_calls, "%s: calls shrank at %zu", text, k);
        cr_expect_leq(p.content_end, k);
        last_content = p.content_end;
        last_calls = p.n_calls;
        tool_parse_free(&p);
    }
    struct tool_parse fin;
    cr_assert_eq(tool_call_parse(f, text, n, 1, 0, &fin), 0);
    cr_expect_geq(fin.content_end, last_content);
    cr_expect_geq(fin.n_calls, last_calls);
    tool_parse_free(&fin);
}

Test(tool_call, streaming_never_takes_back)
{
    check_stream(TOOL_FORMAT_HERMES,
                 "Checking <tool_ca> then <tool_call>\n{\"name\": \"a\", \"arguments\": "
                 "{\"s\": \"</tool_call>\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"b\", "
                 "\"arguments\": {}}\n</tool_call>");
    check_stream(TOOL_FORMAT_HERMES, "plain text with < and <tool but no call");
    check_stream(TOOL_FORMAT_MISTRAL, "ok [TOOL_CALLS][{\"name\": \"a\", \"arguments\": {}}]");
    check_stream(TOOL_FORMAT_LLAMA3, "<|python_tag|>{\"name\": \"a\", \"parameters\": {}}");
    check_stream(TOOL_FORMAT_LLAMA3, "An answer.");
    /* found by fuzz_tool_call: leading whitespace was content until a '<' followed, then held back */
    check_stream(TOOL_FORMAT_LLAMA3, " </think>I think so.");
    check_stream(TOOL_FORMAT_LLAMA3, "\n\n {\"name\": \"a\", \"parameters\": {}}");
}

/* A random walk through the call grammar gives text that parses back into calls to the given tools. */
Test(tool_call, grammar_outputs_parse_back)
{
    const struct tool_def tools[] = {
        {"get_weather",
         "{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\",\"maxLength\":12},"
         "\"unit\":{\"enum\":[\"c\",\"f\"]}},\"required\":[\"city\"]}"},
        {"get_time", NULL},
        {"get", "{\"type\":\"object\",\"properties\":{\"n\":{\"type\":\"integer\",\"minimum\":1}},"
                "\"required\":[\"n\"]}"}};
    const enum tool_format fmts[] = {TOOL_FORMAT_HERMES, TOOL_FORMAT_LLAMA3, TOOL_FORMAT_MISTRAL};
    uint64_t rng = 12345;
    for (size_t fi = 0; fi < 3; fi++)
        for (int walk = 0; walk < 40; walk++) {
            struct grammar *g;
            char err[256];
            cr_assert_eq(tool_call_grammar(fmts[fi], tools, 3, 3, 4, &g, err), 0, "%s", err);
            struct gstate *st = grammar_state_new(g), *tmp = grammar_state_new(g);
            char out[4096];
            size_t len = 0;
            while (len < sizeof out - 1) {
                int cand[256], nc = 0;
                for (int c = 0; c < 256; c++) {
                    grammar_state_copy(tmp, st);
                    char ch = (char)c;
                    if (!grammar_state_feed(g, tmp, &ch, 1)) cand[nc++] = c;
                }
                if (grammar_state_accepting(g, st) &&
                    (nc == 0 || (rng = rng * 6364136223846793005ull + 1) >> 61 == 0))
                    break;
                cr_assert(nc > 0, "dead end after %.*s", (int)len, out);
                rng = rng * 6364136223846793005ull + 1442695040888963407ull;
                /* past 300 bytes, take the cheapest way to the end */
                int c = cand[(rng >> 33) % (uint64_t)nc];
                if (len > 300) {
                    uint32_t best = UINT32_MAX;
                    for (int k = 0; k < nc; k++) {
                        grammar_state_copy(tmp, st);
                        char ch = (char)cand[k];
                        grammar_state_feed(g, tmp, &ch, 1);
                        if (grammar_state_cost(g, tmp) < best) best = grammar_state_cost(g, tmp), c = cand[k];
                    }
                }
                char ch = (char)c;
                grammar_state_feed(g, st, &ch, 1);
                out[len++] = ch;
            }
            out[len] = 0;
            struct tool_parse p;
            cr_assert_eq(tool_call_parse(fmts[fi], out, len, 1, fmts[fi] == TOOL_FORMAT_MISTRAL, &p), 0);
            cr_expect(p.n_calls >= 1 && p.content_end == 0, "%s: %d calls from %s",
                      tool_format_name(fmts[fi]), p.n_calls, out);
            for (int k = 0; k < p.n_calls; k++) {
                cr_expect(!strcmp(p.calls[k].name, "get_weather") || !strcmp(p.calls[k].name, "get_time") ||
                          !strcmp(p.calls[k].name, "get"));
                json_t *a = json_loads(p.calls[k].arguments, 0, NULL);
                cr_expect(json_is_object(a), "arguments %s", p.calls[k].arguments);
                json_decref(a);
            }
            if (fmts[fi] == TOOL_FORMAT_LLAMA3) cr_expect_eq(p.n_calls, 1);
            tool_parse_free(&p);
            grammar_state_free(st);
            grammar_state_free(tmp);
            grammar_free(g);
        }
}

/* ---- reasoning ---- */

static void expect_split(const char *text, int started, const char *reasoning, const char *answer)
{
    struct reasoning_split s;
    size_t n = strlen(text);
    reasoning_split(text, n, started, 1, &s);
    cr_expect(s.r_end - s.r_start == strlen(reasoning) &&
                  !memcmp(text + s.r_start, reasoning, strlen(reasoning)),
              "%s: reasoning '%.*s'", text, (int)(s.r_end - s.r_start), text + s.r_start);
    cr_expect(s.a_end - s.a_start == strlen(answer) && !memcmp(text + s.a_start, answer, strlen(answer)),
              "%s: answer '%.*s'", text, (int)(s.a_end - s.a_start), text + s.a_start);
    /* streaming: both parts only grow and never exceed the final ones */
    size_t lr = 0, la = 0;
    for (size_t k = 0; k <= n; k++) {
        reasoning_split(text, k, started, 0, &s);
        cr_expect_geq(s.r_end - s.r_start, lr, "%s at %zu", text, k);
        cr_expect_geq(s.a_end - s.a_start, la, "%s at %zu", text, k);
        cr_expect_leq(s.r_end - s.r_start, strlen(reasoning));
        lr = s.r_end - s.r_start;
        la = s.a_end - s.a_start;
    }
}

Test(reasoning, splits_think_blocks)
{
    expect_split("<think>\nadd them\n</think>\n\n4", 0, "\nadd them\n", "4");
    expect_split("  <think>x</think>y", 0, "x", "y");
    expect_split("no block <think>x</think>", 0, "", "no block <think>x</think>");
    expect_split("<thin", 0, "", "<thin");
    expect_split("add them\n</think>\n\nThe answer is 4.", 1, "add them\n", "The answer is 4.");
    expect_split("<think>\nagain\n</think>ok", 1, "\nagain\n", "ok");
    expect_split("still thinking", 1, "still thinking", "");
    expect_split("<think>unclosed </thi", 0, "unclosed </thi", "");
    cr_expect(reasoning_prompt_started("<|Assistant|><think>\n", 21));
    cr_expect(!reasoning_prompt_started("<|im_start|>assistant\n", 22));
}

/* A tool whose parameters no value satisfies is refused by name, also beside tools that can be called (the
 * alternation would drop it silently, and the model could never call it). */
Test(tool_call, grammar_refuses_a_tool_that_accepts_no_value)
{
    const char *impossible =
        "{\"type\": \"object\", \"properties\": {\"unit\": {\"type\": \"string\", \"minLength\": 3, "
        "\"maxLength\": 1}}, \"required\": [\"unit\"]}";
    const enum tool_format fmts[] = {TOOL_FORMAT_HERMES, TOOL_FORMAT_LLAMA3, TOOL_FORMAT_MISTRAL};
    for (size_t fi = 0; fi < 3; fi++)
        for (int n = 1; n <= 2; n++) {
            struct tool_def t[2] = {{"get_time", impossible}, {"get_weather", NULL}};
            struct grammar *g = NULL;
            char err[256] = "";
            cr_expect_eq(tool_call_grammar(fmts[fi], t, n, 1, 4, &g, err), FERRY_ERR_INVALID, "%d tools", n);
            cr_expect(!g);
            cr_expect(strstr(err, "'get_time'") && strstr(err, "no value"), "%d tools: %s", n, err);
            grammar_free(g);
        }
}
