/* test_harmony — the split of gpt-oss (harmony) output into reasoning, content and tool calls, on outputs
 * written as the harmony format (OpenAI's openai-harmony spec) and llama.cpp's gpt-oss parser read them:
 * analysis → reasoning (or left in content as written when reasoning is off), final/commentary → content,
 * `to=functions.F` → calls; the format detected from the gpt-oss chat template. Streaming property: every
 * byte-prefix parse is a prefix of the whole parse, and the deltas of a byte-by-byte stream add up to it. */
#include <criterion/criterion.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/core/status.h"
#include "runtime/harmony.h"
#include "runtime/tool_call.h"

#define BOTH (HARMONY_REASONING | HARMONY_CALLS)

/* Parses text (final) with flags; checks reasoning, content and the calls (NULL-terminated name, arguments
 * pairs; arguments compared as JSON). */
static void expect(const char *text, int flags, const char *reasoning, const char *content,
                   const char **calls)
{
    struct harmony_parse p;
    cr_assert_eq(harmony_parse(text, strlen(text), 1, flags, &p), 0);
    cr_expect_str_eq(p.reasoning, reasoning, "%s: reasoning", text);
    cr_expect_eq(p.r_len, strlen(p.reasoning));
    cr_expect_str_eq(p.content, content, "%s: content", text);
    cr_expect_eq(p.c_len, strlen(p.content));
    int n = 0;
    while (calls && calls[2 * n]) n++;
    cr_expect_eq(p.calls.n_calls, n, "%s: %d calls, want %d", text, p.calls.n_calls, n);
    for (int k = 0; k < n && k < p.calls.n_calls; k++) {
        cr_expect_str_eq(p.calls.calls[k].name, calls[2 * k]);
        json_t *got = json_loads(p.calls.calls[k].arguments, 0, NULL),
               *want = json_loads(calls[2 * k + 1], 0, NULL);
        cr_expect(got && want && json_equal(got, want), "%s: call %d arguments %s, want %s", text, k,
                  p.calls.calls[k].arguments, calls[2 * k + 1]);
        json_decref(got);
        json_decref(want);
    }
    harmony_parse_free(&p);
}

/* The outputs the tests share (the prompt ended with <|start|>assistant; <|return|> and <|call|> are
 * end-of-generation tokens, so the text usually ends before them). */
static const char ANALYSIS_FINAL[] = "<|channel|>analysis<|message|>User asks 2+2. Answer 4.<|end|>"
                                     "<|start|>assistant<|channel|>final<|message|>2 + 2 = 4.";
static const char ANALYSIS_CALL[] =
    "<|channel|>analysis<|message|>Need the weather.<|end|>"
    "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>"
    "{\"city\": \"Paris\", \"unit\": \"celsius\"}<|call|>";
static const char TWO_CALLS[] =
    "<|channel|>analysis<|message|>Two lookups.<|end|>"
    "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>"
    "{\"city\":\"Paris\"}<|call|>"
    "<|start|>assistant to=functions.get_time<|channel|>commentary json<|message|>{\"tz\":\"Europe/Paris\"}"
    "<|call|>";

Test(harmony, analysis_then_final)
{
    expect(ANALYSIS_FINAL, BOTH, "User asks 2+2. Answer 4.", "2 + 2 = 4.", NULL);
    /* the end marker and whatever a model writes after it are not the answer */
    char t[512];
    snprintf(t, sizeof t, "%s<|return|><|start|>user<|message|>more", ANALYSIS_FINAL);
    expect(t, BOTH, "User asks 2+2. Answer 4.", "2 + 2 = 4.", NULL);
    /* two analysis messages: their texts join, as llama.cpp joins them */
    expect("<|channel|>analysis<|message|>A.<|end|><|start|>assistant<|channel|>analysis<|message|>B.<|end|>"
           "<|start|>assistant<|channel|>final<|message|>C.",
           BOTH, "A.B.", "C.", NULL);
}

Test(harmony, reasoning_off_leaves_analysis_in_content)
{
    /* llama.cpp's reasoning_format none: the analysis message stays in content as written, without the
     * <|start|>assistant between messages */
    expect(ANALYSIS_FINAL, HARMONY_CALLS, "",
           "<|channel|>analysis<|message|>User asks 2+2. Answer 4.<|end|>2 + 2 = 4.", NULL);
}

Test(harmony, analysis_then_call)
{
    const char *calls[] = {"get_weather", "{\"city\": \"Paris\", \"unit\": \"celsius\"}", NULL};
    expect(ANALYSIS_CALL, BOTH, "Need the weather.", "", calls);
    /* the text ends where <|call|> was drawn (an end-of-generation token) */
    char t[512];
    snprintf(t, sizeof t, "%.*s", (int)(strlen(ANALYSIS_CALL) - strlen("<|call|>")), ANALYSIS_CALL);
    expect(t, BOTH, "Need the weather.", "", calls);
    /* the model writing the tool's answer after the call: another role, not the answer */
    snprintf(
        t, sizeof t,
        "%s<|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>{\"t\": 20}<|end|>",
        ANALYSIS_CALL);
    expect(t, BOTH, "Need the weather.", "", calls);
    /* without tools the call is dropped, as llama.cpp drops unsolicited calls */
    expect(ANALYSIS_CALL, HARMONY_REASONING, "Need the weather.", "", NULL);
}

Test(harmony, two_calls_and_the_recipient_in_the_role)
{
    const char *calls[] = {"get_weather", "{\"city\":\"Paris\"}", "get_time", "{\"tz\":\"Europe/Paris\"}",
                           NULL};
    expect(TWO_CALLS, BOTH, "Two lookups.", "", calls);
    /* the first message's role was written by the prompt: the recipient opens the output */
    const char *one[] = {"f", "{}", NULL};
    expect(" to=functions.f<|channel|>commentary <|constrain|>json<|message|>{}", BOTH, "", "", one);
}

Test(harmony, preamble_stray_commentary_and_unknown_channels)
{
    const char *calls[] = {"lookup", "{\"q\":\"x\"}", NULL};
    expect("<|channel|>commentary<|message|>Let me check.<|end|><|start|>assistant<|channel|>commentary "
           "to=functions.lookup <|constrain|>json<|message|>{\"q\":\"x\"}<|call|>",
           BOTH, "", "Let me check.", calls);
    /* gpt-oss-20b sometimes opens with a commentary channel before the analysis one */
    expect("<|channel|>commentary to=assistant<|channel|>analysis<|message|>t<|end|><|start|>assistant"
           "<|channel|>final<|message|>a",
           BOTH, "t", "a", NULL);
    /* a channel the format does not name is content; so is text without any header */
    expect("<|channel|>weird<|message|>hello<|end|>", BOTH, "", "hello", NULL);
    expect("plain answer", BOTH, "", "plain answer", NULL);
    expect("", BOTH, "", "", NULL);
    /* a built-in tool (python, browser): dropped */
    expect("<|channel|>analysis<|message|>r<|end|><|start|>assistant<|channel|>commentary to=python "
           "<|message|>print(1)<|call|>",
           BOTH, "r", "", NULL);
    /* a final message with a constrained format */
    expect("<|channel|>final <|constrain|>json<|message|>{\"a\": 1}", BOTH, "", "{\"a\": 1}", NULL);
}

Test(harmony, malformed_arguments_are_content)
{
    /* not a JSON object: not a call (llama.cpp refuses the output; the text is kept rather than lost) */
    expect("<|channel|>commentary to=functions.f <|constrain|>json<|message|>{not json}<|call|>", BOTH, "",
           "{not json}", NULL);
    expect("<|channel|>commentary to=functions.f <|constrain|>json<|message|>[1, 2]<|call|>", BOTH, "",
           "[1, 2]", NULL);
    /* cut off inside the arguments (max_tokens) */
    expect("<|channel|>commentary to=functions.f <|constrain|>json<|message|>{\"a\": ", BOTH, "",
           "{\"a\": ", NULL);
    /* an empty name is no call either */
    expect("<|channel|>commentary to=functions. <|message|>{}<|call|>", BOTH, "", "", NULL);
    expect("<|channel|>commentary to=functions.f$x <|message|>{}<|call|>", BOTH, "", "", NULL);
}

Test(harmony, truncated_inside_a_marker_or_header)
{
    struct harmony_parse p;
    const char *t = "<|channel|>analysis<|message|>thinking<|en";
    /* streaming: the start of a marker is held back */
    cr_assert_eq(harmony_parse(t, strlen(t), 0, BOTH, &p), 0);
    cr_expect_str_eq(p.reasoning, "thinking");
    harmony_parse_free(&p);
    /* at the end it was text */
    expect(t, BOTH, "thinking<|en", "", NULL);
    /* a header cut off: nothing of it shows */
    expect("<|channel|>analysis<|message|>x<|end|><|start|>assistant<|channel|>fin", BOTH, "x", "", NULL);
    expect("<|channel|>analysis<|message|>x<|end|><|start|>assis", BOTH, "x", "", NULL);
    expect("<|chan", BOTH, "", "<|chan", NULL);
    cr_assert_eq(harmony_parse("<|chan", 6, 0, BOTH, &p), 0);
    cr_expect_eq(p.c_len, 0);
    harmony_parse_free(&p);
    cr_assert_eq(harmony_parse(" to", 3, 0, BOTH, &p), 0);
    cr_expect_eq(p.c_len, 0, "may still be a recipient");
    harmony_parse_free(&p);
}

/* ---- streaming -------------------------------------------------------------------------------------- */

static int is_prefix(const char *a, size_t an, const char *b, size_t bn)
{
    return an <= bn && !memcmp(a, b, an);
}

/* Parsing every byte prefix: parts are prefixes of the whole parse's and only grow, calls only add; the
 * deltas a streaming renderer sends (each prefix, then the final parse) add up to the whole parse. */
static void check_stream(const char *text, int flags)
{
    const size_t n = strlen(text);
    struct harmony_parse whole;
    cr_assert_eq(harmony_parse(text, n, 1, flags, &whole), 0);
    char *r = calloc(1, n + 1), *c = calloc(1, n + 1);
    size_t r_len = 0, c_len = 0;
    int n_calls = 0;
    for (size_t k = 0; k <= n; k++) {
        struct harmony_parse p;
        const int final = k == n;
        cr_assert_eq(harmony_parse(text, k, final, flags, &p), 0);
        cr_assert(is_prefix(p.reasoning, p.r_len, whole.reasoning, whole.r_len), "%s @%zu: reasoning '%s'",
                  text, k, p.reasoning);
        cr_assert(is_prefix(p.content, p.c_len, whole.content, whole.c_len), "%s @%zu: content '%s'", text, k,
                  p.content);
        cr_assert(p.r_len >= r_len && p.c_len >= c_len && p.calls.n_calls >= n_calls, "%s @%zu: shrank", text,
                  k);
        memcpy(r + r_len, p.reasoning + r_len, p.r_len - r_len);
        memcpy(c + c_len, p.content + c_len, p.c_len - c_len);
        r_len = p.r_len, c_len = p.c_len;
        cr_assert_leq(p.calls.n_calls, whole.calls.n_calls);
        for (int i = 0; i < p.calls.n_calls; i++) {
            cr_assert_str_eq(p.calls.calls[i].name, whole.calls.calls[i].name);
            cr_assert_str_eq(p.calls.calls[i].arguments, whole.calls.calls[i].arguments);
        }
        n_calls = p.calls.n_calls;
        harmony_parse_free(&p);
    }
    cr_assert_eq(r_len, whole.r_len);
    cr_assert_eq(c_len, whole.c_len);
    cr_assert(!memcmp(r, whole.reasoning, r_len) && !memcmp(c, whole.content, c_len));
    cr_assert_eq(n_calls, whole.calls.n_calls);
    free(r);
    free(c);
    harmony_parse_free(&whole);
}

Test(harmony, streamed_byte_by_byte_equals_whole)
{
    const char *texts[] = {
        ANALYSIS_FINAL,
        ANALYSIS_CALL,
        TWO_CALLS,
        "<|channel|>commentary<|message|>Let me check.<|end|><|start|>assistant<|channel|>commentary "
        "to=functions.lookup <|constrain|>json<|message|>{\"q\":\"<|end|> in a string\"}<|call|>",
        "<|channel|>analysis<|message|>a<|b "
        "<|end|><|start|>assistant<|channel|>final<|message|>x<|y<|return|>z",
        "<|channel|>commentary to=functions.f <|constrain|>json<|message|>{not json}<|call|>",
        "<|channel|>weird<|message|>hello<|end|>plain <|start|>user<|message|>no",
        " to=functions.f<|channel|>commentary json<|message|>{}",
        "plain answer with <|message|> inside",
    };
    for (size_t i = 0; i < sizeof texts / sizeof texts[0]; i++) {
        check_stream(texts[i], BOTH);
        check_stream(texts[i], HARMONY_CALLS);
        check_stream(texts[i], HARMONY_REASONING);
    }
}

/* A marker inside a call's JSON string ends the body there (markers are control tokens, never text of the
 * arguments): what came before is not an object, so it is content. */
Test(harmony, marker_inside_arguments_ends_them)
{
    expect("<|channel|>commentary to=functions.f <|constrain|>json<|message|>{\"q\":\"<|end|>x\"}<|call|>",
           BOTH, "", "{\"q\":\"x\"}", NULL);
}

/* ---- detection ------------------------------------------------------------------------------------------
 */

static char *slurp(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    static char buf[1 << 17];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    return strdup(buf);
}

Test(harmony, detected_from_the_template)
{
    /* the gpt-oss template, when the template sweep's copy is at hand */
    const char *dir = getenv("FERRY_SWEEP_TEMPLATES");
    if (dir) {
        char path[1024];
        snprintf(path, sizeof path, "%s/openai-gpt-oss-120b.jinja", dir);
        char *t = slurp(path);
        cr_assert(t, "missing %s", path);
        cr_expect(harmony_template_is(t));
        cr_expect_eq(tool_format_of(t), TOOL_FORMAT_HARMONY);
        free(t);
    }
    cr_expect_eq(
        tool_format_of("{{- '<|start|>assistant<|channel|>final<|message|>' + m.content + '<|end|>' }}"),
        TOOL_FORMAT_HARMONY);
    cr_expect_str_eq(tool_format_name(TOOL_FORMAT_HARMONY), "harmony");
    /* Gemma 4's channel marker is another one */
    cr_expect(!harmony_template_is("{{ '<|turn>model\\n<|channel>thought\\n<channel|>' }}"));
    cr_expect(!harmony_template_is(NULL));
    /* no call grammar: the markers are control tokens */
    struct tool_def d = {"f", NULL};
    struct grammar *g;
    char err[256];
    cr_expect_eq(tool_call_grammar(TOOL_FORMAT_HARMONY, &d, 1, 1, 0, &g, err), FERRY_ERR_UNSUPPORTED);
}
