/* The native pre-tokenizer splits (runtime/tok/pretok.c) against the Hugging Face `tokenizers` package's
 * regex splits (pretok_cases.json, written by make_pretok_cases.py): GPT-2, Llama 3, Qwen2, StarCoder,
 * Falcon, the GGUF default, DeepSeek coder, llm and V3, o200k (gpt-4o), Kimi K2, Tekken, Qwen3.5, Seed-Coder
 * and Gemma 4 — piece for piece, on llama.cpp's 46 vocab test strings, hard strings (case changes,
 * contractions, combining marks, Indic/Arabic/CJK scripts, emoji, whitespace runs) and seeded random ones.
 * Each family is built twice: from its GGUF tokenizer.ggml.pre name and from the regex strings (as a
 * tokenizer.json would give them). Also: unknown regexes are refused, and every family cuts random bytes
 * (invalid UTF-8 included) into non-empty pieces that cover them. */
#include <jansson.h>

#include "runtime/tok/pretok.h"
#include "runtime/tok/unicode.h"
#include "toktest.h"

static json_t *load_cases(void)
{
    const char *src = getenv("FERRY_SRC");
    char path[4096];
    snprintf(path, sizeof path, "%s/tests/tokenizer/pretok_cases.json", src ? src : ".");
    json_error_t je;
    json_t *doc = json_load_file(path, JSON_ALLOW_NUL, &je);
    cr_assert(doc, "%s: %s", path, je.text);
    return doc;
}

/* The code points of s[0, len) with their flags and offsets (free cp, fl, off). */
static struct cpbuf cpbuf_of(const char *s, size_t len)
{
    struct cpbuf cb = {0};
    cb.cp = malloc((len + 1) * sizeof *cb.cp);
    cb.fl = malloc(len + 1);
    cb.off = malloc((len + 1) * sizeof *cb.off);
    cr_assert(cb.cp && cb.fl && cb.off);
    for (size_t k = 0; k < len;) {
        int l;
        cb.cp[cb.n] = utf8_decode((const unsigned char *)s + k, len - k, &l);
        cb.fl[cb.n] = (uint8_t)ucat_flags(cb.cp[cb.n]);
        cb.off[cb.n++] = (int)k;
        k += (size_t)l;
    }
    cb.off[cb.n] = (int)len;
    return cb;
}

static int check_family(const struct pretok *p, json_t *strings, json_t *pieces, const char *name,
                        const char *how)
{
    int n_bad = 0;
    for (size_t i = 0; i < json_array_size(strings); i++) {
        json_t *js = json_array_get(strings, i);
        const char *s = json_string_value(js);
        size_t len = json_string_length(js);
        struct cpbuf cb = cpbuf_of(s, len);
        int *ends = NULL;
        int n = pretok_split(p, &cb, &ends);
        cr_assert(n >= 0);
        json_t *exp = json_array_get(pieces, i);
        int ok = (size_t)n == json_array_size(exp);
        for (int k = 0, a = 0; ok && k < n; a = ends[k++]) {
            json_t *e = json_array_get(exp, (size_t)k);
            size_t pl = (size_t)(cb.off[ends[k]] - cb.off[a]);
            ok = pl == json_string_length(e) && memcmp(s + cb.off[a], json_string_value(e), pl) == 0;
        }
        if (!ok && n_bad++ < 3) {
            char got[800] = "";
            size_t g = 0;
            for (int k = 0, a = 0; k < n && g < 700; a = ends[k++])
                g += (size_t)snprintf(got + g, sizeof got - g, "[%.*s]", cb.off[ends[k]] - cb.off[a],
                                      s + cb.off[a]);
            char *want = json_dumps(exp, JSON_COMPACT | JSON_ENSURE_ASCII);
            cr_log_error("%s (%s) string %zu \"%.80s\":\n  got  %s\n  want %.700s", name, how, i, s, got,
                         want);
            free(want);
        }
        free(ends);
        free(cb.cp);
        free(cb.fl);
        free(cb.off);
    }
    return n_bad;
}

Test(pretok, families_match_hf_tokenizers)
{
    json_t *doc = load_cases();
    json_t *strings = json_object_get(doc, "strings"), *fam;
    const char *name;
    int n_bad = 0, n_fam = 0;
    cr_assert(json_array_size(strings) >= 80);
    json_object_foreach(json_object_get(doc, "families"), name, fam)
    {
        n_fam++;
        json_t *pieces = json_object_get(fam, "pieces");
        char err[256] = "";
        struct pretok p;
        int rc = pretok_from_gguf_pre(&p, json_string_value(json_object_get(fam, "gguf_pre")), err);
        cr_assert_eq(rc, FERRY_OK, "%s: %s", name, err);
        n_bad += check_family(&p, strings, pieces, name, "gguf pre");
        pretok_free(&p);
        memset(&p, 0, sizeof p);
        json_t *re;
        size_t i;
        json_array_foreach(json_object_get(fam, "regexes"), i, re)
        {
            rc = pretok_add_regex(&p, json_string_value(re), json_string_length(re), err);
            cr_assert_eq(rc, FERRY_OK, "%s regex %zu: %s", name, i, err);
        }
        n_bad += check_family(&p, strings, pieces, name, "regexes");
        pretok_free(&p);
    }
    cr_assert_eq(n_fam, 22);
    cr_assert_eq(n_bad, 0, "%d splits differ from HF tokenizers", n_bad);
    json_decref(doc);
}

Test(pretok, unknown_patterns_are_refused)
{
    const char *bad[] = {"(a|b)+", " ?[^(\\s|.,!?…。，、।۔،)]+x", "\\w+", "[a-", "a*", "(?=x)"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        struct pretok p = {0};
        char err[256] = "";
        int rc = pretok_add_regex(&p, bad[i], strlen(bad[i]), err);
        cr_assert_eq(rc, FERRY_ERR_UNSUPPORTED, "\"%s\" should be unsupported", bad[i]);
        cr_assert(strstr(err, "unsupported") != NULL, "%s", err);
        pretok_free(&p);
    }
    struct pretok p;
    char err[256] = "";
    cr_assert_eq(pretok_from_gguf_pre(&p, "no-such-pre", err), FERRY_ERR_UNSUPPORTED);
    cr_assert(strstr(err, "no-such-pre") != NULL);
}

/* Every family splits arbitrary bytes (invalid UTF-8, control characters, long runs) into non-empty pieces
 * that cover the text in order. */
Test(pretok, random_bytes_split_into_covering_pieces)
{
    json_t *doc = load_cases(), *fam;
    const char *name;
    uint32_t seed = 12345;
    json_object_foreach(json_object_get(doc, "families"), name, fam)
    {
        struct pretok p;
        char err[256] = "";
        cr_assert_eq(pretok_from_gguf_pre(&p, json_string_value(json_object_get(fam, "gguf_pre")), err),
                     FERRY_OK);
        for (int it = 0; it < 300; it++) {
            unsigned char s[200];
            size_t len = 0, want = (seed = seed * 1103515245u + 12345u) >> 24;
            static const char *const bits[] = {" ",  "\n",       "\r\n",         "A",           "b",    "7",
                                               "'s", "\xcc\x81", "\xe4\xb8\xad", "\xff",        "\xc3", "\t",
                                               "/",  "!",        "\xd9\xa3",     "\xe3\x80\x80"};
            while (len + 3 < want && len + 3 < sizeof s) {
                const char *b = bits[(seed = seed * 1103515245u + 12345u) >> 28];
                size_t bl = strlen(b);
                memcpy(s + len, b, bl);
                len += bl;
            }
            struct cpbuf cb = cpbuf_of((const char *)s, len);
            int *ends = NULL;
            int n = pretok_split(&p, &cb, &ends);
            cr_assert(n >= 0 && (n == 0) == (cb.n == 0), "%s: %d pieces of %d code points", name, n, cb.n);
            for (int k = 0; k < n; k++)
                cr_assert(ends[k] > (k ? ends[k - 1] : 0), "%s: piece %d empty", name, k);
            cr_assert(n == 0 || ends[n - 1] == cb.n, "%s: pieces end at %d of %d", name, ends[n - 1], cb.n);
            free(ends);
            free(cb.cp);
            free(cb.fl);
            free(cb.off);
        }
        pretok_free(&p);
    }
    json_decref(doc);
}
