/* test_family_chat — each family's chat conventions against the reference.
 *
 * tests/runtime/data/family_chat.json (make_family_chat.py: the family's own template from llama.cpp's
 * models/templates, rendered by transformers' render_jinja_template) holds conversations with tools, tool
 * calls and results, reasoning and enable_thinking false; ferry's renderer must give the same bytes. Then
 * the conventions the server derives from that template: its tool-call format (tool_format_of), whether a
 * rendered prompt opened a <think> block, and how a typical answer of the family splits into reasoning,
 * content and tool calls. Every family of the table has a built-in fallback template.
 */
#include <criterion/criterion.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/core/status.h"
#include "runtime/chat_template.h"
#include "runtime/reasoning.h"
#include "runtime/tool_call.h"
#include "weights/arch/arch.h"

static json_t *load_cases(void)
{
    const char *src = getenv("FERRY_SRC");
    cr_assert(src, "FERRY_SRC is not set (run through meson test)");
    char path[4096];
    snprintf(path, sizeof path, "%s/tests/runtime/data/family_chat.json", src);
    json_error_t e;
    json_t *j = json_load_file(path, 0, &e);
    cr_assert(j, "cannot parse %s: %s", path, e.text);
    return j;
}

/* Renders every case of the family's template and compares with transformers; returns the template. */
static const char *check_renders(json_t *fam, const char *name)
{
    const char *tmpl = json_string_value(json_object_get(fam, "template"));
    cr_assert(tmpl);
    size_t i;
    json_t *c;
    int n = 0;
    json_array_foreach(json_object_get(fam, "cases"), i, c)
    {
        char *mj = json_dumps(json_object_get(c, "messages"), JSON_COMPACT);
        json_t *tools = json_object_get(c, "tools");
        char *tj = json_is_array(tools) ? json_dumps(tools, JSON_COMPACT) : NULL;
        char *ej = json_dumps(json_object_get(c, "extra"), JSON_COMPACT);
        const struct chat_render in = {.messages_json = mj,
                                       .tools_json = tj,
                                       .extra_json = ej,
                                       .add_generation_prompt = 1,
                                       .bos_token = json_string_value(json_object_get(c, "bos")),
                                       .eos_token = json_string_value(json_object_get(c, "eos"))};
        char *out = NULL, err[256] = "";
        size_t len = 0;
        const char *cname = json_string_value(json_object_get(c, "name"));
        int rc = chat_template_render_json(tmpl, &in, NULL, &out, &len, err);
        cr_assert_eq(rc, FERRY_OK, "%s %s: %s", name, cname, err);
        const char *want = json_string_value(json_object_get(c, "expected"));
        cr_expect(len == strlen(want) && memcmp(out, want, len) == 0, "%s %s:\n got: %s\nwant: %s", name,
                  cname, out, want);
        /* The prompt never leaves a <think> block open (the model opens its own; enable_thinking false
         * renders an empty closed one). */
        cr_expect_eq(reasoning_prompt_started(out, len), 0, "%s %s", name, cname);
        free(out);
        free(mj);
        free(tj);
        free(ej);
        n++;
    }
    cr_assert_geq(n, 10, "%s: only %d cases", name, n);
    return tmpl;
}

Test(family_chat, qwen3_template_tools_reasoning)
{
    json_t *j = load_cases();
    cr_assert_not_null(arch_find_gguf("qwen3", 5), "qwen3 is a family of the table");
    const char *tmpl = check_renders(json_object_get(j, "qwen3"), "qwen3");
    cr_assert_eq(tool_format_of(tmpl), TOOL_FORMAT_HERMES,
                 "Qwen3's template offers Hermes <tool_call> tools");

    /* An answer as Qwen3 writes it: reasoning, then a call. */
    const char *ans =
        "<think>\nThe user wants the weather.\n</think>\n\n<tool_call>\n{\"name\": \"get_weather\", "
        "\"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";
    struct reasoning_split rs;
    reasoning_split(ans, strlen(ans), 0, 1, &rs);
    cr_assert_eq(rs.r_end - rs.r_start, strlen("\nThe user wants the weather.\n"));
    cr_assert(!memcmp(ans + rs.r_start, "\nThe user wants the weather.\n", rs.r_end - rs.r_start));
    struct tool_parse tp;
    cr_assert_eq(tool_call_parse(TOOL_FORMAT_HERMES, ans + rs.a_start, rs.a_end - rs.a_start, 1, 0, &tp), 0);
    cr_assert_eq(tp.n_calls, 1);
    cr_assert_str_eq(tp.calls[0].name, "get_weather");
    json_error_t e;
    json_t *args = json_loads(tp.calls[0].arguments, 0, &e);
    cr_assert(args && json_is_object(args), "%s", tp.calls[0].arguments);
    cr_assert_str_eq(json_string_value(json_object_get(args, "city")), "Paris");
    cr_assert_eq(tp.content_end, 0, "nothing before the call is content");
    json_decref(args);
    tool_parse_free(&tp);
    json_decref(j);
}

Test(family_chat, every_family_has_a_builtin_fallback)
{
    int n = 0;
    for (const struct arch_family *f; (f = arch_family_at(n)); n++) {
        cr_assert_not_null(f->chat_template, "%s", f->name);
        cr_assert_not_null(chat_template_builtin(f->chat_template), "%s: builtin '%s'", f->name,
                           f->chat_template);
        cr_assert_not_null(f->program, "%s", f->name);
        cr_assert_eq(arch_find_gguf(f->gguf_writes, strlen(f->gguf_writes)) != NULL, 1, "%s writes '%s'",
                     f->name, f->gguf_writes);
    }
    cr_assert_geq(n, 4);
}

/* The gemma4 fallback renders plain conversations as google/gemma-4-31B-it's own template does (the bytes
 * jinja2 gives for llama.cpp's models/templates/google-gemma-4-31B-it.jinja, trim_blocks + lstrip_blocks). */
Test(family_chat, gemma4_builtin_matches_the_model_template)
{
    const char *tmpl = chat_template_builtin("gemma4");
    cr_assert_not_null(tmpl);
    const char *msgs =
        "[{\"role\":\"system\",\"content\":\"Be brief.\"},{\"role\":\"user\",\"content\":\"Hi\"},"
        "{\"role\":\"assistant\",\"content\":\"Hello!\"},{\"role\":\"user\",\"content\":\"Bye\"}]";
    const char *want = "<bos><|turn>system\nBe brief.<turn|>\n<|turn>user\nHi<turn|>\n<|turn>model\nHello!"
                       "<turn|>\n<|turn>user\nBye<turn|>\n<|turn>model\n<|channel>thought\n<channel|>";
    const struct chat_render in = {
        .messages_json = msgs, .add_generation_prompt = 1, .bos_token = "<bos>", .eos_token = "<eos>"};
    char *out = NULL, err[256] = "";
    size_t len = 0;
    cr_assert_eq(chat_template_render_json(tmpl, &in, NULL, &out, &len, err), FERRY_OK, "%s", err);
    cr_expect(len == strlen(want) && memcmp(out, want, len) == 0, "got: %s\nwant: %s", out, want);
    free(out);
}
