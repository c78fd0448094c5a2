/* The GGUF side of the Llama 3 family on a tiny vocab (tiny_llama3.gguf + tiny_llama3_cases.json, both from
 * make_tiny_llama3.py, ids from HF tokenizers with Llama 3's settings): tokenizer.ggml.pre "llama-bpe"
 * selects the Llama 3 split and ignore_merges, add_bos defaults to true without the key, and eos/eot end
 * generations. */
#include <jansson.h>

#include "toktest.h"

Test(llama3, tiny_gguf_matches_hf_tokenizers)
{
    const char *src = getenv("FERRY_SRC");
    char path[4096], cases_path[4096];
    snprintf(path, sizeof path, "%s/tests/tokenizer/tiny_llama3.gguf", src ? src : ".");
    snprintf(cases_path, sizeof cases_path, "%s/tests/tokenizer/tiny_llama3_cases.json", src ? src : ".");
    json_error_t je;
    json_t *doc = json_load_file(cases_path, 0, &je), *c;
    cr_assert(doc, "%s: %s", cases_path, je.text);
    struct tokenizer *t = NULL;
    char err[256] = "";
    int rc = tt_load_gguf(path, &t, err);
    cr_assert_eq(rc, FERRY_OK, "%s: %s", path, err);
    cr_assert_eq(tokenizer_n_vocab(t), json_integer_value(json_object_get(doc, "n_vocab")));
    int32_t bos = (int32_t)json_integer_value(json_object_get(doc, "bos"));
    int32_t eos = (int32_t)json_integer_value(json_object_get(doc, "eos"));
    int32_t eot = (int32_t)json_integer_value(json_object_get(doc, "eot"));
    cr_assert_eq(tokenizer_bos(t), bos);
    cr_assert_eq(tokenizer_eos(t), eos);
    cr_assert_eq(tokenizer_add_bos(t), 1, "llama-bpe adds BOS by default");
    cr_assert(tokenizer_is_eog(t, eos) && tokenizer_is_eog(t, eot) && !tokenizer_is_eog(t, bos));
    size_t i;
    int n_bad = 0;
    json_array_foreach(json_object_get(doc, "cases"), i, c)
    {
        const char *text = json_string_value(json_object_get(c, "text"));
        json_t *jids = json_object_get(c, "ids");
        int ne = (int)json_array_size(jids), ng;
        int32_t *exp = malloc((size_t)(ne + 1) * sizeof *exp);
        for (int k = 0; k < ne; k++) exp[k] = (int32_t)json_integer_value(json_array_get(jids, (size_t)k));
        int32_t *got = tt_encode(t, text, strlen(text), 0, 1, &ng);
        char what[160];
        snprintf(what, sizeof what, "case %zu \"%s\"", i, text);
        if (!tt_ids_equal(what, got, ng, exp, ne)) n_bad++;
        char *dec;
        size_t dl;
        cr_assert_eq(tokenizer_decode(t, got, ng, 1, &dec, &dl), FERRY_OK);
        cr_expect_str_eq(dec, text);
        free(dec);
        free(got);
        got = tt_encode(t, text, strlen(text), 1, 1, &ng);
        cr_assert(ng == ne + 1 && got[0] == bos);
        free(got);
        free(exp);
    }
    cr_assert_eq(n_bad, 0, "%d cases differ", n_bad);
    tokenizer_free(t);
    json_decref(doc);
}
