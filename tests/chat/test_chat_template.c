/* test_chat_template — the chat-template interpreter against the jinja2/transformers reference.
 *
 * chat_cases.json (written by make_chat_cases.py with transformers' render_jinja_template) holds the
 * built-in templates, SmolLM2-135M-Instruct's own template and small feature templates, each rendered
 * over conversations; every case must render byte for byte, or fail the way the reference failed
 * (raise_exception: same message). Hand-written tests cover errors, offsets and the bounds.
 */
#include "kernels/core/status.h"
#include "runtime/chat_template.h"

#include <criterion/criterion.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef CHAT_CASES_JSON
#define CHAT_CASES_JSON "tests/chat/chat_cases.json"
#endif

/* ---- reference cases ------------------------------------------------------------------------------ */

static json_t *load_cases(void)
{
    json_error_t jerr;
    json_t *root = json_load_file(CHAT_CASES_JSON, 0, &jerr);
    if (!root) cr_skip_test("missing FILE: %s (%s)", CHAT_CASES_JSON, jerr.text);
    return root;
}

static void show_diff(const char *name, const char *want, size_t want_len, const char *got, size_t got_len)
{
    size_t i = 0;
    while (i < want_len && i < got_len && want[i] == got[i]) i++;
    cr_log_error("%s: first difference at byte %zu (want %zu bytes, got %zu)\n  want: %.80s\n  got:  %.80s",
                 name, i, want_len, got_len, want + (i > 20 ? i - 20 : 0), got + (i > 20 ? i - 20 : 0));
}

/* Runs every case whose name starts with `prefix`; returns the number checked. */
static int run_cases(const char *prefix)
{
    json_t *root = load_cases();
    json_t *templates = json_object_get(root, "templates"), *cases = json_object_get(root, "cases");
    cr_assert(json_is_object(templates) && json_is_array(cases), "malformed %s", CHAT_CASES_JSON);
    size_t idx;
    json_t *cs;
    int checked = 0, failed = 0;
    json_array_foreach(cases, idx, cs)
    {
        const char *name = json_string_value(json_object_get(cs, "name"));
        if (strncmp(name, prefix, strlen(prefix)) != 0) continue;
        const char *tmpl =
            json_string_value(json_object_get(templates, json_string_value(json_object_get(cs, "template"))));
        cr_assert_not_null(tmpl, "%s: template missing", name);
        json_t *jm = json_object_get(cs, "messages");
        int n = (int)json_array_size(jm);
        struct chat_msg *msgs = calloc((size_t)n + 1, sizeof *msgs);
        for (int i = 0; i < n; i++) {
            msgs[i].role = json_string_value(json_object_get(json_array_get(jm, (size_t)i), "role"));
            msgs[i].content = json_string_value(json_object_get(json_array_get(jm, (size_t)i), "content"));
        }
        char *out = NULL, err[256];
        size_t out_len = 0;
        int rc;
        if (json_object_get(cs, "extra")) { /* tool cases: the JSON form, as the server renders */
            char *mj = json_dumps(jm, JSON_COMPACT), *tj = NULL,
                 *ej = json_dumps(json_object_get(cs, "extra"), 0);
            json_t *tools = json_object_get(cs, "tools");
            if (json_is_array(tools)) tj = json_dumps(tools, JSON_COMPACT);
            struct chat_render in = {mj,
                                     tj,
                                     ej,
                                     json_is_true(json_object_get(cs, "add_generation_prompt")),
                                     json_string_value(json_object_get(cs, "bos_token")),
                                     json_string_value(json_object_get(cs, "eos_token"))};
            rc = chat_template_render_json(tmpl, &in, NULL, &out, &out_len, err);
            free(mj);
            free(tj);
            free(ej);
        } else {
            rc = chat_template_render(
                tmpl, msgs, n, json_is_true(json_object_get(cs, "add_generation_prompt")),
                json_string_value(json_object_get(cs, "bos_token")),
                json_string_value(json_object_get(cs, "eos_token")), &out, &out_len, err);
        }
        json_t *want = json_object_get(cs, "expected");
        const char *kind = json_string_value(json_object_get(cs, "error"));
        if (want) {
            const char *w = json_string_value(want);
            size_t wl = json_string_length(want);
            if (rc != FERRY_OK) {
                cr_log_error("%s: render failed: %s (%s)", name, err, ferry_status_str(rc));
                failed++;
            } else if (out_len != wl || memcmp(out, w, wl) != 0) {
                show_diff(name, w, wl, out, out_len);
                failed++;
            }
        } else if (rc == FERRY_OK) {
            cr_log_error("%s: rendered but the reference failed (%s)", name, kind);
            failed++;
        } else if (strcmp(kind, "raise") == 0) {
            const char *msg = json_string_value(json_object_get(cs, "message"));
            if (rc != FERRY_ERR_INVALID || strcmp(err, msg) != 0) {
                cr_log_error("%s: want raise_exception '%s', got %d '%s'", name, msg, rc, err);
                failed++;
            }
        }
        free(out);
        free(msgs);
        checked++;
    }
    json_decref(root);
    cr_expect_eq(failed, 0, "%d of %d '%s' cases differ from the reference", failed, checked, prefix);
    return checked;
}

/* Real templates with tools, tool calls and tool results (Llama 3.1, Qwen2.5, Mistral Nemo, DeepSeek-R1,
 * SmolLM2, chatml). */
Test(chat_reference, tools_llama31)
{
    cr_assert_geq(run_cases("tools/llama31/"), 6);
}
Test(chat_reference, tools_qwen25)
{
    cr_assert_geq(run_cases("tools/qwen25/"), 6);
}
Test(chat_reference, tools_mistral_nemo)
{
    cr_assert_geq(run_cases("tools/mistral_nemo/"), 6);
}
Test(chat_reference, tools_r1_and_chatml)
{
    cr_assert_geq(run_cases("tools/r1_qwen/") + run_cases("tools/smollm2/") + run_cases("tools/chatml/"), 15);
}

Test(chat_reference, builtin_chatml)
{
    cr_assert_geq(run_cases("chatml/"), 12);
}
Test(chat_reference, builtin_llama2)
{
    cr_assert_geq(run_cases("llama2/"), 12);
}
Test(chat_reference, builtin_llama3)
{
    cr_assert_geq(run_cases("llama3/"), 12);
}
Test(chat_reference, builtin_mistral)
{
    cr_assert_geq(run_cases("mistral/"), 12);
}
Test(chat_reference, builtin_gemma)
{
    cr_assert_geq(run_cases("gemma/"), 12);
}
Test(chat_reference, builtin_phi3)
{
    cr_assert_geq(run_cases("phi3/"), 12);
}
Test(chat_reference, builtin_zephyr)
{
    cr_assert_geq(run_cases("zephyr/"), 12);
}
Test(chat_reference, smollm2_gguf_template)
{
    cr_assert_geq(run_cases("smollm2/"), 12);
}
Test(chat_reference, language_features)
{
    cr_assert_geq(run_cases("feature/"), 50);
}

/* The committed reference must carry the same built-in texts as the library (make_chat_cases.py reads
 * them from chat_template.c; this catches an edit without regenerating). */
Test(chat_reference, builtins_match_reference)
{
    json_t *root = load_cases();
    json_t *templates = json_object_get(root, "templates");
    const char *const *names = chat_template_builtin_names();
    int n = 0;
    for (; names[n]; n++) {
        const char *ref = json_string_value(json_object_get(templates, names[n]));
        cr_assert_not_null(ref, "builtin %s missing from reference", names[n]);
        cr_expect_str_eq(chat_template_builtin(names[n]), ref, "builtin %s differs from reference", names[n]);
    }
    cr_expect_eq(n, 8);
    cr_expect_null(chat_template_builtin("no-such-template"));
    json_decref(root);
}

/* ---- hand-written cases --------------------------------------------------------------------------- */

static const struct chat_msg CONV[] = {{"system", "sys"}, {"user", "hi"}, {"assistant", "yo"}};

static int render(const char *tmpl, char **out, char err[256])
{
    size_t len;
    return chat_template_render(tmpl, CONV, 3, 1, "<s>", "</s>", out, &len, err);
}

static void expect_render(const char *tmpl, const char *want)
{
    char *out = NULL, err[256];
    int rc = render(tmpl, &out, err);
    cr_assert_eq(rc, FERRY_OK, "template %s: %s", tmpl, err);
    cr_expect_str_eq(out, want, "template %s", tmpl);
    free(out);
}

static void expect_error(const char *tmpl, int want_rc, const char *want_substr)
{
    char *out = (char *)1, err[256];
    int rc = render(tmpl, &out, err);
    cr_expect_eq(rc, want_rc, "template %s: rc %d (%s), want %d", tmpl, rc, err, want_rc);
    cr_expect_null(out, "output must be NULL on error");
    cr_expect(strstr(err, want_substr) != NULL, "template %s: error '%s' lacks '%s'", tmpl, err, want_substr);
}

Test(chat_errors, raise_exception_message_surfaces)
{
    expect_error("ok{{ raise_exception('Bad role: ' ~ messages[1].role) }}", FERRY_ERR_INVALID,
                 "Bad role: user");
    char *out, err[256];
    render("{{ raise_exception('exact') }}", &out, err);
    cr_expect_str_eq(err, "exact");
}

Test(chat_errors, unsupported_syntax_names_offset)
{
    expect_error("0123456789{% include 'x.j2' %}", FERRY_ERR_UNSUPPORTED, "at byte 13");
    expect_error("0123456789{% include 'x.j2' %}", FERRY_ERR_UNSUPPORTED, "include");
    expect_error("abc{% extends 'base' %}", FERRY_ERR_UNSUPPORTED, "extends");
    expect_error("{% raw %}x{% endraw %}", FERRY_ERR_UNSUPPORTED, "raw");
    expect_error("{{ x | no_such_filter }}", FERRY_ERR_UNSUPPORTED, "no_such_filter");
    expect_error("{{ 1 is no_such_test }}", FERRY_ERR_UNSUPPORTED, "no_such_test");
    expect_error("{{ messages.append(1) }}", FERRY_ERR_UNSUPPORTED, "append");
    expect_error("{{ '%s' % 1 }}", FERRY_ERR_UNSUPPORTED, "at byte 8");
}

Test(chat_errors, malformed_templates)
{
    expect_error("{% if true %}no end", FERRY_ERR_FORMAT, "unclosed 'if'");
    expect_error("{{ 1 + }}", FERRY_ERR_FORMAT, "at byte 7");
    expect_error("{{ 'unterminated }}", FERRY_ERR_FORMAT, "unterminated string");
    expect_error("{{ x ", FERRY_ERR_FORMAT, "unclosed tag");
    expect_error("{# never closed", FERRY_ERR_FORMAT, "unclosed comment");
    expect_error("{% endfor %}", FERRY_ERR_FORMAT, "unexpected 'endfor'");
    expect_error("{% break %}", FERRY_ERR_FORMAT, "outside of a loop");
    expect_error("{{ 1 $ 2 }}", FERRY_ERR_FORMAT, "at byte 5");
}

Test(chat_errors, runtime_errors)
{
    expect_error("{{ nope.attr }}", FERRY_ERR_INVALID, "'nope' is undefined");
    expect_error("{{ 'a' + 1 }}", FERRY_ERR_INVALID, "unsupported operand");
    expect_error("{{ 1 / 0 }}", FERRY_ERR_INVALID, "division by zero");
    expect_error("{{ 9223372036854775807 + 1 }}", FERRY_ERR_RANGE, "overflow");
    expect_error("{% for x in 5 %}{% endfor %}", FERRY_ERR_INVALID, "not iterable");
    expect_error("{% set x = 1 %}{% set x.y = 2 %}", FERRY_ERR_INVALID, "non-namespace");
}

Test(chat_bounds, runaway_loops_stop)
{
    expect_error("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
                 FERRY_ERR_RANGE, "steps");
    expect_error("{{ range(1000000000) | length }}", FERRY_ERR_RANGE, "range too big");
    /* work inside one step (scans of big strings and lists, quadratic filters) is charged too */
    expect_error("{% set big = 'x' * 4000000 %}{% for i in range(100000) %}{% if 'zz' in big %}{% endif %}{% "
                 "endfor %}",
                 FERRY_ERR_RANGE, "steps");
    expect_error("{{ range(100000) | unique | list | length }}", FERRY_ERR_RANGE, "steps");
    expect_error("{% set l = range(100000) | list %}{% for i in range(100000) %}{% if -1 in l %}{% endif "
                 "%}{% endfor %}",
                 FERRY_ERR_RANGE, "steps");
}

Test(chat_bounds, output_and_memory_are_bounded)
{
    expect_error("{% for i in range(100000) %}{{ 'x' * 100 }}{% endfor %}", FERRY_ERR_RANGE,
                 "output exceeds");
    expect_error("{{ 'x' * 9000000000000 }}", FERRY_ERR_RANGE, "too large");
    expect_error(
        "{% set ns = namespace(s='xxxxxxxxxxxxxxxx') %}{% for i in range(40) %}{% set ns.s = ns.s + ns.s %}"
        "{% endfor %}{{ ns.s | length }}",
        FERRY_ERR_RANGE, "memory");
}

Test(chat_bounds, recursion_is_bounded)
{
    expect_error("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", FERRY_ERR_RANGE, "recursion");
    char *deep = malloc(4000);
    strcpy(deep, "{{ ");
    for (int i = 0; i < 1000; i++) strcat(deep, "(");
    strcat(deep, "1");
    for (int i = 0; i < 1000; i++) strcat(deep, ")");
    strcat(deep, " }}");
    expect_error(deep, FERRY_ERR_RANGE, "nested");
    free(deep);
}

Test(chat_bounds, custom_params)
{
    struct chat_template_params p = chat_template_default_params();
    p.max_output = 10;
    char *out, err[256];
    size_t len;
    int rc = chat_template_render_ex("0123456789", CONV, 3, 0, NULL, NULL, &p, &out, &len, err);
    cr_expect_eq(rc, FERRY_OK, "%s", err);
    free(rc == FERRY_OK ? out : NULL);
    rc = chat_template_render_ex("0123456789A", CONV, 3, 0, NULL, NULL, &p, &out, &len, err);
    cr_expect_eq(rc, FERRY_ERR_RANGE);
    p = chat_template_default_params();
    p.max_steps = 1000;
    rc = chat_template_render_ex("{% for i in range(2000) %}{% endfor %}", CONV, 3, 0, NULL, NULL, &p, &out,
                                 &len, err);
    cr_expect_eq(rc, FERRY_ERR_RANGE, "%s", err);
}

Test(chat_api, basics)
{
    expect_render(
        "{{ bos_token }}{% for m in messages %}[{{ m.role }}:{{ m.content }}]{% endfor %}{{ eos_token }}",
        "<s>[system:sys][user:hi][assistant:yo]</s>");
    /* NULL tokens are undefined, as in Jinja */
    char *out, err[256];
    size_t len;
    int rc = chat_template_render("[{{ bos_token }}|{{ bos_token is defined }}]", CONV, 3, 0, NULL, NULL,
                                  &out, &len, err);
    cr_assert_eq(rc, FERRY_OK, "%s", err);
    cr_expect_str_eq(out, "[|False]");
    cr_expect_eq(len, strlen(out));
    free(out);
    rc = chat_template_render(NULL, CONV, 3, 0, NULL, NULL, &out, &len, err);
    cr_expect_eq(rc, FERRY_ERR_INVALID);
    rc = chat_template_render("x", NULL, 0, 0, NULL, NULL, &out, &len, err);
    cr_expect_eq(rc, FERRY_OK);
    cr_expect_str_eq(out, "x");
    free(out);
}

Test(chat_api, builtins_render_smoke)
{
    const char *const *names = chat_template_builtin_names();
    static const struct chat_msg conv[] = {{"user", "What is the capital of France?"}};
    for (int i = 0; names[i]; i++) {
        char *out = NULL, err[256];
        size_t len;
        int rc =
            chat_template_render(chat_template_builtin(names[i]), conv, 1, 1, "<s>", "</s>", &out, &len, err);
        cr_expect_eq(rc, FERRY_OK, "%s: %s", names[i], err);
        cr_expect(rc != FERRY_OK || strstr(out, "What is the capital of France?") != NULL, "%s: %s", names[i],
                  out);
        free(out);
    }
}
