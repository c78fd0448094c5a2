/* tokenizer.json loading (tokenizer_init_hf) for the SentencePiece-style setups, against the ids of the
 * Hugging Face `tokenizers` package (hf_stories_cases.json from make_hf_stories.py): a Llama 2 style
 * directory (Prepend/Replace normalizer, byte fallback, TemplateProcessing BOS, tokenizer_config.json) and
 * a Mistral style one (Metaspace pre-tokenizer, prepend_scheme "first"). Also: settings ferry does not
 * implement are refused with FERRY_ERR_UNSUPPORTED and a message, broken files with an error. */
#include <jansson.h>

#include "toktest.h"

static const char *src_dir(void)
{
    const char *s = getenv("FERRY_SRC");
    return s ? s : ".";
}

static void run_dir(const char *name)
{
    char dir[4096], path[4200];
    snprintf(dir, sizeof dir, "%s/tests/tokenizer/%s", src_dir(), name);
    snprintf(path, sizeof path, "%s/tests/tokenizer/hf_stories_cases.json", src_dir());
    json_error_t je;
    json_t *doc = json_load_file(path, 0, &je);
    cr_assert(doc, "%s: %s", path, je.text);
    struct tokenizer *t = NULL;
    char err[256] = "";
    int rc = tokenizer_init_hf(&t, dir, err);
    cr_assert_eq(rc, FERRY_OK, "%s: %s", dir, err);
    cr_assert_eq(tokenizer_n_vocab(t), 512);
    cr_assert_eq(tokenizer_bos(t), 1);
    cr_assert_eq(tokenizer_eos(t), 2);
    cr_assert_eq(tokenizer_add_bos(t), 1);
    json_t *cases = json_object_get(json_object_get(doc, "dirs"), name), *c;
    cr_assert(json_array_size(cases) >= 15);
    size_t i;
    int n_bad = 0;
    json_array_foreach(cases, i, c)
    {
        const char *text = json_string_value(json_object_get(c, "text"));
        json_t *jids = json_object_get(c, "ids");
        int ne = (int)json_array_size(jids), ng;
        int32_t *exp = malloc((size_t)(ne + 1) * sizeof *exp);
        for (int k = 0; k < ne; k++) exp[k] = (int32_t)json_integer_value(json_array_get(jids, (size_t)k));
        int32_t *got = tt_encode(t, text, strlen(text), 0, 1, &ng);
        char what[160];
        snprintf(what, sizeof what, "%s case %zu \"%s\"", name, i, text);
        if (!tt_ids_equal(what, got, ng, exp, ne)) n_bad++;
        free(got);
        free(exp);
    }
    cr_assert_eq(n_bad, 0, "%s: %d cases differ", name, n_bad);
    int n;
    int32_t *ids = tt_encode(t, "Hello world", 11, 1, 0, &n);
    cr_assert_eq(ids[0], 1, "BOS first");
    char *dec;
    size_t dl;
    cr_assert_eq(tokenizer_decode(t, ids, n, 0, &dec, &dl), FERRY_OK);
    cr_assert_str_eq(dec, " Hello world", "'▁' decodes to a space (kept at the start)");
    free(dec);
    free(ids);
    tokenizer_free(t);
    json_decref(doc);
}

Test(hf, llama2_style_tokenizer_json) { run_dir("hf_stories_llama2"); }
Test(hf, metaspace_style_tokenizer_json) { run_dir("hf_stories_metaspace"); }

/* Writes text as dir/tokenizer.json (and gen as generation_config.json when not NULL) and returns
 * tokenizer_init_hf's status (err filled); the tokenizer goes to *out when out is not NULL. */
static int load_files(const char *json_text, const char *gen, struct tokenizer **out, char err[256])
{
    char dir[] = "/tmp/ferry_tok_bad_XXXXXX";
    cr_assert(mkdtemp(dir));
    char path[200];
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    FILE *f = fopen(path, "w");
    cr_assert(f);
    fputs(json_text, f);
    fclose(f);
    char gpath[200];
    snprintf(gpath, sizeof gpath, "%s/generation_config.json", dir);
    if (gen) {
        f = fopen(gpath, "w");
        cr_assert(f);
        fputs(gen, f);
        fclose(f);
    }
    struct tokenizer *t = NULL;
    int rc = tokenizer_init_hf(&t, dir, err);
    if (out) *out = t;
    else tokenizer_free(t);
    remove(path);
    remove(gpath);
    rmdir(dir);
    return rc;
}

static int load_text(const char *json_text, char err[256])
{
    return load_files(json_text, NULL, NULL, err);
}

/* ignore_merges (Llama 3): a word that is a token is emitted whole. Expected ids from HF tokenizers:
 * vocab a b c ab bc abc x, merges "b c" then "a b": "abc" -> [0, 4] normally, [5] with ignore_merges;
 * "abcx" -> [0, 4, 6] either way. Also: generation_config.json eos_token_id lists end generations. */
Test(hf, ignore_merges_and_generation_config)
{
    const char *fmt = "{\"model\": {\"type\": \"BPE\", \"ignore_merges\": %s, \"vocab\": {\"a\": 0, \"b\": 1, "
                      "\"c\": 2, \"ab\": 3, \"bc\": 4, \"abc\": 5, \"x\": 6}, \"merges\": [\"b c\", [\"a\", \"b\"]]}}";
    char json[512], err[256] = "";
    for (int im = 0; im < 2; im++) {
        snprintf(json, sizeof json, fmt, im ? "true" : "false");
        struct tokenizer *t = NULL;
        cr_assert_eq(load_files(json, im ? "{\"eos_token_id\": [6, 4, 99]}" : NULL, &t, err), FERRY_OK, "%s", err);
        int n;
        int32_t *ids = tt_encode(t, "abc", 3, 0, 0, &n);
        int32_t exp0[] = {0, 4}, exp1[] = {5}, exp2[] = {0, 4, 6};
        cr_assert(im ? tt_ids_equal("abc", ids, n, exp1, 1) : tt_ids_equal("abc", ids, n, exp0, 2));
        free(ids);
        ids = tt_encode(t, "abcx", 4, 0, 0, &n);
        cr_assert(tt_ids_equal("abcx", ids, n, exp2, 3));
        free(ids);
        cr_assert_eq(tokenizer_is_eog(t, 6), im, "generation_config eos_token_id");
        cr_assert_eq(tokenizer_is_eog(t, 4), im);
        cr_assert(!tokenizer_is_eog(t, 0));
        tokenizer_free(t);
    }
}

#define MINI_VOCAB "\"vocab\": {\"a\": 0, \"b\": 1, \"ab\": 2}, \"merges\": [\"a b\"]"

Test(hf, unsupported_and_broken_files)
{
    char err[256];
    cr_assert_eq(load_text("{\"model\": {\"type\": \"WordPiece\", \"vocab\": {\"a\": 0}}}", err), FERRY_ERR_UNSUPPORTED);
    cr_assert(strstr(err, "WordPiece"), "%s", err);
    cr_assert_eq(load_text("{\"model\": {\"type\": \"BPE\", " MINI_VOCAB "}, \"pre_tokenizer\": {\"type\": \"Split\", "
                           "\"pattern\": {\"Regex\": \"(?<=x)y\"}, \"behavior\": \"Isolated\", \"invert\": false}}",
                           err),
                 FERRY_ERR_UNSUPPORTED);
    cr_assert(strstr(err, "regex"), "%s", err);
    cr_assert_eq(load_text("{\"model\": {\"type\": \"BPE\", " MINI_VOCAB "}, \"pre_tokenizer\": {\"type\": "
                           "\"Whitespace\"}}",
                           err),
                 FERRY_ERR_UNSUPPORTED);
    cr_assert(strstr(err, "Whitespace"), "%s", err);
    cr_assert_eq(load_text("{\"model\": {\"type\": \"BPE\", " MINI_VOCAB "}, \"normalizer\": {\"type\": "
                           "\"Lowercase\"}}",
                           err),
                 FERRY_ERR_UNSUPPORTED);
    cr_assert_eq(load_text("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": -4}, \"merges\": []}}", err),
                 FERRY_ERR_FORMAT);
    cr_assert_neq(load_text("{\"model\": {\"type\": \"BPE\", \"voc", err), FERRY_OK);
    /* A minimal byte-level file works: "ab" merges. */
    cr_assert_eq(load_text("{\"model\": {\"type\": \"BPE\", " MINI_VOCAB "}, \"pre_tokenizer\": {\"type\": "
                           "\"ByteLevel\", \"add_prefix_space\": false, \"use_regex\": true}}",
                           err),
                 FERRY_OK, "%s", err);
    struct tokenizer *t = NULL;
    cr_assert_eq(tokenizer_init_hf(&t, "/nonexistent/dir", err), FERRY_ERR_IO);
    cr_assert_null(t);
}
