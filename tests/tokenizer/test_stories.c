/* stories260K (SentencePiece, 512 tokens with byte fallback) against llama.cpp's goldens in
 * ../shared/testdata/goldens: tokenization (with/without parse_special), the pieces of the ids, prompt
 * tokens of the greedy runs, and decoding of the generated ids into llama.cpp's generated_text. Also the
 * encode API's buffer protocol and BOS/EOS metadata. */
#include <jansson.h>

#include "toktest.h"

static struct tokenizer *load_stories(void)
{
    char *path = tt_data_path("models/stories260K.gguf");
    struct tokenizer *t = NULL;
    char err[256] = "";
    int rc = tt_load_gguf(path, &t, err);
    cr_assert_eq(rc, FERRY_OK, "%s: %s", path, err);
    free(path);
    return t;
}

static json_t *load_json(const char *rel)
{
    char *path = tt_data_path(rel);
    json_error_t je;
    json_t *doc = json_load_file(path, 0, &je);
    cr_assert(doc, "%s: %s", path, je.text);
    free(path);
    return doc;
}

static int32_t *json_ids(json_t *arr, int *n)
{
    *n = (int)json_array_size(arr);
    int32_t *ids = malloc((size_t)(*n + 1) * sizeof *ids);
    for (int i = 0; i < *n; i++) ids[i] = (int32_t)json_integer_value(json_array_get(arr, (size_t)i));
    return ids;
}

Test(stories, tokenize_golden)
{
    struct tokenizer *t = load_stories();
    json_t *doc = load_json("goldens/stories260K_tokenize.json"), *c;
    size_t i;
    int n_bad = 0, n_special_off = 0;
    cr_assert(json_array_size(doc) >= 10);
    json_array_foreach(doc, i, c)
    {
        const char *text = json_string_value(json_object_get(c, "text"));
        int add_bos = json_is_true(json_object_get(c, "add_bos"));
        int special = json_is_true(json_object_get(c, "parse_special"));
        n_special_off += !special;
        int ne, ng;
        int32_t *exp = json_ids(json_object_get(c, "tokens"), &ne);
        int32_t *got = tt_encode(t, text, strlen(text), add_bos, special, &ng);
        char what[160];
        snprintf(what, sizeof what, "case %zu \"%s\" (add_bos %d, parse_special %d)", i, text, add_bos, special);
        if (!tt_ids_equal(what, got, ng, exp, ne)) n_bad++;
        /* Without BOS the ids are the same minus the leading 1 (README). */
        int nn;
        int32_t *nobos = tt_encode(t, text, strlen(text), 0, special, &nn);
        if (!tt_ids_equal(what, nobos, nn, exp + 1, ne - 1)) n_bad++;
        json_t *pieces = json_object_get(c, "pieces");
        for (int k = 0; k < ne && k < (int)json_array_size(pieces); k++)
            cr_expect_str_eq(tokenizer_token_str(t, exp[k]), json_string_value(json_array_get(pieces, (size_t)k)));
        free(exp);
        free(got);
        free(nobos);
    }
    cr_assert(n_special_off >= 1, "the golden file has a parse_special=false case");
    cr_assert_eq(n_bad, 0, "%d mismatches", n_bad);
    json_decref(doc);
    tokenizer_free(t);
}

Test(stories, greedy_prompts_and_generated_text)
{
    struct tokenizer *t = load_stories();
    json_t *doc = load_json("goldens/stories260K_greedy.json"), *c;
    size_t i;
    cr_assert(tokenizer_add_bos(t), "SPM vocab without add_bos_token key adds BOS");
    json_array_foreach(doc, i, c)
    {
        const char *prompt = json_string_value(json_object_get(c, "prompt"));
        int ne, ng, ngen;
        int32_t *exp = json_ids(json_object_get(c, "prompt_tokens"), &ne);
        int32_t *got = tt_encode(t, prompt, strlen(prompt), tokenizer_add_bos(t), 0, &ng);
        cr_expect(tt_ids_equal(prompt, got, ng, exp, ne), "prompt tokens of \"%s\"", prompt);
        int32_t *gen = json_ids(json_object_get(c, "generated_tokens"), &ngen);
        char *text;
        size_t len;
        cr_assert_eq(tokenizer_decode(t, gen, ngen, 0, &text, &len), FERRY_OK);
        cr_expect_str_eq(text, json_string_value(json_object_get(c, "generated_text")), "case %zu", i);
        /* The same text, streamed. */
        struct detok d;
        detok_init(&d, t);
        char *acc = calloc(1, len + 512), piece[256];
        size_t k = 0;
        for (int j = 0; j < ngen; j++) {
            int m = detok_push(&d, gen[j], piece, sizeof piece);
            cr_assert(m >= 0);
            memcpy(acc + k, piece, (size_t)m);
            k += (size_t)m;
        }
        int m = detok_flush(&d, piece, sizeof piece);
        cr_assert(m >= 0);
        memcpy(acc + k, piece, (size_t)m);
        k += (size_t)m;
        cr_expect(k == len && memcmp(acc, text, len) == 0, "streamed text differs for case %zu", i);
        free(acc);
        free(text);
        free(exp);
        free(got);
        free(gen);
    }
    json_decref(doc);
    tokenizer_free(t);
}

Test(stories, metadata_and_buffer_protocol)
{
    struct tokenizer *t = load_stories();
    cr_assert_eq(tokenizer_n_vocab(t), 512);
    cr_assert_eq(tokenizer_bos(t), 1);
    cr_assert_eq(tokenizer_eos(t), 2);
    cr_assert(tokenizer_is_eog(t, 2));
    cr_assert(!tokenizer_is_eog(t, 1));
    cr_assert_eq(tokenizer_find(t, "<s>", 3), 1);
    cr_assert_eq(tokenizer_find(t, "\xe2\x96\x81He", 5), 346);
    cr_assert_eq(tokenizer_find(t, "no such token", 13), -1);
    size_t pl = 0;
    cr_assert_str_eq(tokenizer_piece(t, 346, &pl), " He");
    cr_assert_eq(pl, 3);
    cr_assert_null(tokenizer_piece(t, 512, &pl));
    /* Too small a buffer: the total count comes back and the prefix is written. */
    int32_t small[3] = {-5, -5, -5};
    int n = tokenizer_encode(t, "Hello world", 11, 1, 1, small, 2);
    cr_assert_eq(n, 7);
    cr_assert_eq(small[0], 1);
    cr_assert_eq(small[1], 346);
    cr_assert_eq(small[2], -5, "nothing written past cap");
    cr_assert_eq(tokenizer_encode(t, "Hello world", 11, 1, 1, NULL, 0), 7);
    cr_assert_eq(tokenizer_encode(t, "", 0, 1, 1, small, 3), 1, "empty text is BOS only");
    cr_assert_eq(tokenizer_encode(t, "", 0, 0, 1, small, 3), 0);
    /* Decoding ids out of range is an error, not a crash. */
    int32_t bad[] = {5, 99999};
    char *s = NULL;
    size_t len;
    cr_assert_eq(tokenizer_decode(t, bad, 2, 0, &s, &len), FERRY_ERR_RANGE);
    cr_assert_null(s);
    struct detok d;
    detok_init(&d, t);
    char out[256];
    cr_assert_eq(detok_push(&d, -1, out, sizeof out), FERRY_ERR_RANGE);
    cr_assert_eq(detok_push(&d, 346, out, 2), FERRY_ERR_RANGE, "cap too small is reported");
    cr_assert_eq(detok_push(&d, 346, out, sizeof out), 3);
    cr_assert_str_eq(out, " He");
    /* Byte tokens: <0xC3> <0xA9> is 'é', held back until complete. */
    int32_t c3 = -1, a9 = -1;
    for (int i = 0; i < 512; i++) {
        if (strcmp(tokenizer_token_str(t, i), "<0xC3>") == 0) c3 = i;
        if (strcmp(tokenizer_token_str(t, i), "<0xA9>") == 0) a9 = i;
    }
    cr_assert(c3 >= 0 && a9 >= 0);
    cr_assert_eq(detok_push(&d, c3, out, sizeof out), 0);
    cr_assert_eq(detok_push(&d, a9, out, sizeof out), 2);
    cr_assert_str_eq(out, "\xc3\xa9");
    cr_assert_eq(detok_push(&d, c3, out, sizeof out), 0);
    cr_assert_eq(detok_flush(&d, out, sizeof out), 1, "an incomplete sequence comes out at the end as is");
    cr_assert_eq((unsigned char)out[0], 0xC3);
    tokenizer_free(t);
}
