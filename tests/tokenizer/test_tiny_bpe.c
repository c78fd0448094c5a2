/* Full tokenization of this year's GGUF BPE families on tiny vocabs (tiny_*.gguf + tiny_bpe_cases.json, both
 * from make_tiny_bpe.py, ids from HF tokenizers with each family's settings): tokenizer.ggml.pre "gpt-4o",
 * "tekken" (ignore_merges, BOS by default), "qwen35", "kimi-k2", "deepseek-v3" (three split stages),
 * "sarvam-moe" (raw UTF-8 BPE with spaces as U+2581), and
 * tokenizer.ggml.model "gemma4" (raw UTF-8 BPE, spaces as U+2581, <0xNN> byte fallback, whole newline runs,
 * BOS even when the file says not to). Every case must give the expected ids and decode back to its text.
 * Also: a pre value ferry does not implement is refused with its name in the message. */
#include <jansson.h>

#include "toktest.h"

static void check_family(const char *name, json_t *fam)
{
    char rel[256], path[4096];
    snprintf(rel, sizeof rel, "tests/tokenizer/%s", json_string_value(json_object_get(fam, "gguf")));
    tt_src_path(path, rel);
    struct tokenizer *t = NULL;
    char err[256] = "";
    int rc = tt_load_gguf(path, &t, err);
    cr_assert_eq(rc, FERRY_OK, "%s: %s", path, err);
    cr_assert_eq(tokenizer_n_vocab(t), json_integer_value(json_object_get(fam, "n_vocab")), "%s", name);
    int32_t bos = (int32_t)json_integer_value(json_object_get(fam, "bos"));
    cr_assert_eq(tokenizer_bos(t), bos, "%s", name);
    cr_assert_eq(tokenizer_eos(t), json_integer_value(json_object_get(fam, "eos")), "%s", name);
    cr_assert_eq(tokenizer_add_bos(t), json_is_true(json_object_get(fam, "add_bos")), "%s: add_bos", name);
    size_t i;
    json_t *c;
    int n_bad = 0;
    json_array_foreach(json_object_get(fam, "cases"), i, c)
    {
        const char *text = json_string_value(json_object_get(c, "text"));
        size_t len = json_string_length(json_object_get(c, "text"));
        json_t *jids = json_object_get(c, "ids");
        int ne = (int)json_array_size(jids), ng;
        int32_t *exp = malloc((size_t)(ne + 1) * sizeof *exp);
        for (int k = 0; k < ne; k++) exp[k] = (int32_t)json_integer_value(json_array_get(jids, (size_t)k));
        int32_t *got = tt_encode(t, text, len, 0, 1, &ng);
        char what[160];
        snprintf(what, sizeof what, "%s case %zu \"%.60s\"", name, i, text);
        if (!tt_ids_equal(what, got, ng, exp, ne)) n_bad++;
        char *dec;
        size_t dl;
        cr_assert_eq(tokenizer_decode(t, got, ng, 1, &dec, &dl), FERRY_OK);
        cr_expect(dl == len && memcmp(dec, text, len) == 0, "%s: decodes to \"%s\"", what, dec);
        free(dec);
        free(got);
        free(exp);
    }
    cr_assert_eq(n_bad, 0, "%s: %d cases differ", name, n_bad);
    tokenizer_free(t);
}

Test(tiny_bpe, families_match_hf_tokenizers)
{
    char path[4096];
    tt_src_path(path, "tests/tokenizer/tiny_bpe_cases.json");
    json_error_t je;
    json_t *doc = json_load_file(path, 0, &je), *fam;
    cr_assert(doc, "%s: %s", path, je.text);
    const char *name;
    int n_fam = 0;
    json_object_foreach(json_object_get(doc, "families"), name, fam)
    {
        check_family(name, fam);
        n_fam++;
    }
    cr_assert_eq(n_fam, 7);
    json_decref(doc);
}

Test(tiny_bpe, unsupported_pre_is_refused_by_name)
{
    char path[4096];
    tt_src_path(path, "tests/tokenizer/tiny_badpre.gguf");
    struct tokenizer *t = NULL;
    char err[256] = "";
    cr_assert_eq(tt_load_gguf(path, &t, err), FERRY_ERR_UNSUPPORTED);
    cr_assert_null(t);
    cr_assert(strstr(err, "tokenizer.ggml.pre") && strstr(err, "\"afmoe\"") && strstr(err, "not supported"),
              "%s", err);
    tt_src_path(path, "tests/tokenizer/tiny_longpre.gguf");
    cr_assert_eq(tt_load_gguf(path, &t, err), FERRY_ERR_UNSUPPORTED, "a too long pre is no default");
    cr_assert_null(t);
    cr_assert(strstr(err, "\"qwen2-x-x-x") && strstr(err, "not supported"), "%s", err);
}
