/* NFC (runtime/tok/nfc.c) against Python's unicodedata.normalize("NFC", ...) on hard and seeded random
 * strings (nfc_cases.json, from make_nfc_cases.py); invalid UTF-8 passes through unchanged. */
#include <jansson.h>

#include "runtime/tok/unicode.h"
#include "toktest.h"

Test(nfc, matches_python_unicodedata)
{
    const char *src = getenv("FERRY_SRC");
    char path[4096];
    snprintf(path, sizeof path, "%s/tests/tokenizer/nfc_cases.json", src ? src : ".");
    json_error_t je;
    json_t *doc = json_load_file(path, 0, &je), *c;
    cr_assert(doc, "%s: %s", path, je.text);
    size_t i;
    int n_bad = 0, n_changed = 0;
    json_array_foreach(json_object_get(doc, "cases"), i, c)
    {
        json_t *in = json_array_get(c, 0), *exp = json_array_get(c, 1);
        char *out;
        size_t ol;
        cr_assert_eq(unicode_nfc(json_string_value(in), json_string_length(in), &out, &ol), FERRY_OK);
        n_changed += !json_equal(in, exp);
        if (ol != json_string_length(exp) || memcmp(out, json_string_value(exp), ol) != 0) {
            if (n_bad++ < 5) cr_log_error("case %zu: NFC(\"%s\") gave \"%s\", want \"%s\"", i, json_string_value(in), out,
                                          json_string_value(exp));
        }
        free(out);
    }
    cr_assert(n_changed > 100, "the cases exercise normalization (%d changed)", n_changed);
    cr_assert_eq(n_bad, 0, "%d cases differ", n_bad);
    json_decref(doc);
}

Test(nfc, invalid_utf8_passes_through)
{
    const char in[] = "a\xff" "e\xcc\x81" "\xe2\x82" "x\x80";
    char *out;
    size_t ol;
    cr_assert_eq(unicode_nfc(in, sizeof in - 1, &out, &ol), FERRY_OK);
    cr_assert_eq(ol, sizeof in - 2, "e + U+0301 composes to one 2-byte char, the rest is unchanged");
    cr_assert(memcmp(out, "a\xff" "\xc3\xa9" "\xe2\x82" "x\x80", ol) == 0);
    free(out);
}
