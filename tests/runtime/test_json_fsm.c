/* test_json_fsm — the JSON recogniser against Python's json module (tests/runtime/make_json_cases.py writes
 * the labelled cases: valid objects with random whitespace, and mutations of them), plus nesting depth and
 * copy-to-try semantics. A case passes when "every byte accepted and the object closed" equals the label. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/json_fsm.h"

static int accepts(const char *s, size_t n)
{
    struct json_fsm f;
    json_fsm_init(&f);
    return json_fsm_feed_bytes(&f, s, n) == 0 && json_fsm_done(&f);
}

Test(json_fsm, matches_python_json_on_labelled_cases)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/tests/runtime/data/json_cases.txt", getenv("FERRY_SRC"));
    FILE *fp = fopen(path, "r");
    cr_assert(fp, "missing %s (tests/runtime/make_json_cases.py writes it)", path);
    static char line[1 << 16], doc[1 << 15];
    int n = 0, valid = 0;
    while (fgets(line, sizeof line, fp)) {
        int label = line[0] - '0';
        const char *h = line + 2;
        size_t len = 0;
        while (h[0] && h[1] && h[0] != '\n') {
            unsigned v;
            sscanf(h, "%2x", &v);
            doc[len++] = (char)v;
            h += 2;
        }
        cr_assert_eq(accepts(doc, len), label, "case %d (%.*s): json_fsm says %d, Python's json %d", n + 1, (int)len,
                     doc, !label, label);
        valid += label;
        n++;
    }
    fclose(fp);
    cr_assert(n > 1000 && valid > 100 && n - valid > 100, "%d cases, %d valid", n, valid);
}

Test(json_fsm, nesting_depth_is_bounded)
{
    char s[512];
    size_t n = 0;
    for (int i = 0; i < JSON_FSM_MAX_DEPTH; i++) n += (size_t)sprintf(s + n, "%s", i ? "[" : "{\"a\":");
    struct json_fsm f;
    json_fsm_init(&f);
    cr_assert_eq(json_fsm_feed_bytes(&f, s, n), 0, "64 levels are accepted");
    cr_assert_eq(json_fsm_feed(&f, '['), -1, "a 65th is refused");
    cr_assert_eq(json_fsm_feed(&f, ']'), -1, "and the state stays dead");
}

Test(json_fsm, copies_try_bytes_without_committing)
{
    struct json_fsm f, g;
    json_fsm_init(&f);
    cr_assert_eq(json_fsm_feed_bytes(&f, "{\"n\": 12", 8), 0);
    g = f;
    cr_assert_eq(json_fsm_feed_bytes(&g, "x", 1), -1);
    g = f;
    cr_assert_eq(json_fsm_feed_bytes(&g, "3}", 2), 0);
    cr_assert(json_fsm_done(&g) && !json_fsm_done(&f));
    cr_assert_eq(json_fsm_feed_bytes(&f, ".5e-3 }\n", 8), 0);
    cr_assert(json_fsm_done(&f));
    cr_assert_eq(f.ws_run, 1, "whitespace after the object is counted (the sampler limits runs)");
    cr_assert_eq(json_fsm_feed(&f, '{'), -1, "nothing but whitespace after the object");
}
