/* test_template_sweep — every chat template of llama.cpp's models/templates rendered by ferry equal to the
 * jinja2/transformers reference (template_sweep.json, written by make_template_sweep.py) over the same
 * conversations, tools and flags: byte for byte where the reference rendered, a failure where it failed
 * (raise_exception: the same message). The templates come from the peer's tarball, unpacked by
 * run_template_sweep.py into the directory named by FERRY_SWEEP_TEMPLATES; each one's sha256 must be the one
 * the reference was made from. strftime_now is pinned to the reference's date where a template printed today.
 */
#include "kernels/core/status.h"
#include "runtime/chat_template.h"
#include "tests/weights/sha256.h"

#include <criterion/criterion.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#ifndef SWEEP_JSON
#define SWEEP_JSON "tests/chat/template_sweep.json"
#endif

static char *read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *p = malloc((size_t)n + 1);
    if (p && fread(p, 1, (size_t)n, f) != (size_t)n) {
        free(p);
        p = NULL;
    }
    fclose(f);
    if (p) p[n] = 0, *len = (size_t)n;
    return p;
}

/* Replaces every s[0, *len) occurrence of `from` by `to` (same length: dates in one format), in place, or
 * through a new buffer when the lengths differ. */
static char *replace_all(char *s, size_t *len, const char *from, const char *to)
{
    size_t fl = strlen(from), tl = strlen(to);
    if (!fl || !strcmp(from, to)) return s;
    size_t cap = *len + 1, n = 0;
    char *o = malloc(cap);
    for (size_t i = 0; i < *len;) {
        if (i + fl <= *len && !memcmp(s + i, from, fl)) {
            if (n + tl + 1 > cap) o = realloc(o, cap = (n + tl + 1) * 2);
            memcpy(o + n, to, tl), n += tl, i += fl;
        } else {
            if (n + 2 > cap) o = realloc(o, cap *= 2);
            o[n++] = s[i++];
        }
    }
    o[n] = 0;
    free(s);
    *len = n;
    return o;
}

/* Where the template prints strftime_now(FMT), today's date in FMT becomes the reference's date in FMT. */
static char *pin_dates(const char *tmpl, char *out, size_t *len, const struct tm *ref)
{
    time_t now = time(NULL);
    struct tm today;
    localtime_r(&now, &today);
    for (const char *p = tmpl; (p = strstr(p, "strftime_now(")); p++) {
        const char *q = p + 13;
        char quote = *q;
        if (quote != '"' && quote != '\'') continue;
        const char *e = strchr(q + 1, quote);
        if (!e || e - q > 60) continue;
        char fmt[64], a[128], b[128];
        memcpy(fmt, q + 1, (size_t)(e - q - 1));
        fmt[e - q - 1] = 0;
        if (strftime(a, sizeof a, fmt, &today) && strftime(b, sizeof b, fmt, ref))
            out = replace_all(out, len, a, b);
    }
    return out;
}

static void show_diff(const char *name, const char *want, size_t want_len, const char *got, size_t got_len)
{
    size_t i = 0;
    while (i < want_len && i < got_len && want[i] == got[i]) i++;
    size_t from = i > 40 ? i - 40 : 0;
    cr_log_error("%s: first difference at byte %zu (want %zu bytes, got %zu)\n  want: %.120s\n  got:  %.120s",
                 name, i, want_len, got_len, want + (from < want_len ? from : want_len),
                 got + (from < got_len ? from : got_len));
}

Test(template_sweep, every_peer_template_renders_like_jinja2, .timeout = 120)
{
    const char *dir = getenv("FERRY_SWEEP_TEMPLATES");
    if (!dir || !*dir)
        cr_skip_test("missing FERRY_SWEEP_TEMPLATES (run through run_template_sweep.py, which unpacks "
                     "models/templates from ../shared/peers/llama.cpp-lcp0336.tar.gz)");
    json_error_t jerr;
    json_t *root = json_load_file(SWEEP_JSON, 0, &jerr);
    cr_assert_not_null(root, "cannot read %s: %s", SWEEP_JSON, jerr.text);
    json_t *scen = json_object_get(root, "scenarios"), *tmpls = json_object_get(root, "templates");
    const char *bos = json_string_value(json_object_get(root, "bos_token"));
    const char *eos = json_string_value(json_object_get(root, "eos_token"));
    struct tm ref = {0};
    cr_assert_not_null(strptime(json_string_value(json_object_get(root, "now")), "%Y-%m-%dT%H:%M:%S", &ref));
    int checked = 0, failed = 0, n_tmpl = 0;
    const char *tname;
    json_t *t;
    json_object_foreach(tmpls, tname, t)
    {
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", dir, tname);
        size_t tl = 0;
        char *src = read_file(path, &tl);
        if (!src) {
            cr_log_error("%s: missing from %s", tname, dir);
            failed++;
            continue;
        }
        char hex[65];
        sha256_of(src, tl, hex);
        if (strcmp(hex, json_string_value(json_object_get(t, "sha256")))) {
            cr_log_error("%s: not the template the reference was made from (sha256 %s)", tname, hex);
            failed++;
            free(src);
            continue;
        }
        n_tmpl++;
        const char *sname;
        json_t *cs;
        json_object_foreach(json_object_get(t, "cases"), sname, cs)
        {
            json_t *sc = json_object_get(scen, sname);
            char name[512];
            snprintf(name, sizeof name, "%s/%s", tname, sname);
            char *mj = json_dumps(json_object_get(sc, "messages"), JSON_COMPACT);
            json_t *tools = json_object_get(sc, "tools");
            char *tj = json_is_array(tools) ? json_dumps(tools, JSON_COMPACT) : NULL;
            char *ej = json_dumps(json_object_get(sc, "extra"), JSON_COMPACT);
            struct chat_render in = {mj,  tj, ej, json_is_true(json_object_get(sc, "add_generation_prompt")),
                                     bos, eos};
            char *out = NULL, err[256] = "";
            size_t out_len = 0;
            int rc = chat_template_render_json(src, &in, NULL, &out, &out_len, err);
            free(mj);
            free(tj);
            free(ej);
            json_t *want = json_object_get(cs, "expected");
            const char *kind = json_string_value(json_object_get(cs, "error"));
            if (want) {
                if (rc != FERRY_OK) {
                    cr_log_error("%s: render failed: %s (%s)", name, err, ferry_status_str(rc));
                    failed++;
                } else {
                    out = pin_dates(src, out, &out_len, &ref);
                    if (out_len != json_string_length(want) ||
                        memcmp(out, json_string_value(want), out_len)) {
                        show_diff(name, json_string_value(want), json_string_length(want), out, out_len);
                        failed++;
                    }
                }
            } else if (rc == FERRY_OK) {
                cr_log_error("%s: rendered but the reference failed (%s: %s)", name, kind,
                             json_string_value(json_object_get(cs, "message")));
                failed++;
            } else if (!strcmp(kind, "raise")) {
                const char *msg = json_string_value(json_object_get(cs, "message"));
                if (rc != FERRY_ERR_INVALID || strcmp(err, msg)) {
                    cr_log_error("%s: want raise_exception '%s', got %d '%s'", name, msg, rc, err);
                    failed++;
                }
            }
            free(out);
            checked++;
        }
        free(src);
    }
    json_decref(root);
    cr_log_info("%d templates, %d cases checked", n_tmpl, checked);
    cr_expect_gt(n_tmpl, 60, "only %d templates found", n_tmpl);
    cr_expect_eq(failed, 0, "%d of %d cases differ from jinja2", failed, checked);
}
