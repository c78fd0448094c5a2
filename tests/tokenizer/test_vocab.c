/* llama.cpp's tokenizer test vectors (../shared/testdata/vocab, see its README.md): for each vocab GGUF,
 * every string of ggml-vocab-NAME.gguf.inp must encode (no BOS, special text as plain text) to the ids on
 * the same line of .out, which came from the Hugging Face tokenizer of the original model. One test per
 * vocab so that a failure names the vocabulary. Byte-level vocabs also check decode(encode(s)) == s. */
#include "toktest.h"

#define SEP "\n__ggml_vocab_test__\n"

static void run_vocab(const char *name, int expect_roundtrip)
{
    char rel[128];
    snprintf(rel, sizeof rel, "vocab/ggml-vocab-%s.gguf", name);
    char *gguf = tt_data_path(rel);
    snprintf(rel, sizeof rel, "vocab/ggml-vocab-%s.gguf.inp", name);
    char *inp_path = tt_data_path(rel);
    snprintf(rel, sizeof rel, "vocab/ggml-vocab-%s.gguf.out", name);
    char *out_path = tt_data_path(rel);

    struct tokenizer *t = NULL;
    char err[256] = "";
    int rc = tt_load_gguf(gguf, &t, err);
    cr_assert_eq(rc, FERRY_OK, "load %s: %s (%s)", gguf, ferry_status_str(rc), err);

    size_t inp_len;
    char *inp = tt_read_file(inp_path, &inp_len);
    char *outs = tt_read_file(out_path, NULL);
    char *line = outs, *next_line = NULL;
    /* Lines can be empty (no tokens), so split on every newline. */
#define NEXT_LINE()                                                                                          \
    do {                                                                                                     \
        next_line = line ? strchr(line, '\n') : NULL;                                                       \
        if (next_line) *next_line++ = 0;                                                                     \
    } while (0)
    NEXT_LINE();
    int n_cases = 0, n_bad = 0;
    for (char *p = inp; p < inp + inp_len;) {
        char *sep = strstr(p, SEP);
        if (!sep) break;
        cr_assert(line, "%s: .out has fewer lines than .inp has cases", name);
        int32_t exp[512];
        int ne = 0;
        for (char *q = line; *q;) {
            char *e;
            long v = strtol(q, &e, 10);
            if (e == q) break;
            cr_assert(ne < 512);
            exp[ne++] = (int32_t)v;
            q = e;
        }
        int ng;
        int32_t *got = tt_encode(t, p, (size_t)(sep - p), 0, 0, &ng);
        char what[200];
        snprintf(what, sizeof what, "%s case %d: \"%.*s\"", name, n_cases, (int)((sep - p) > 60 ? 60 : (sep - p)), p);
        if (!tt_ids_equal(what, got, ng, exp, ne)) n_bad++;
        if (expect_roundtrip) {
            char *dec;
            size_t dl;
            cr_assert_eq(tokenizer_decode(t, got, ng, 1, &dec, &dl), FERRY_OK);
            if (dl != (size_t)(sep - p) || memcmp(dec, p, dl) != 0) {
                cr_log_error("%s: decode(encode) differs: \"%s\"", what, dec);
                n_bad++;
            }
            free(dec);
        }
        free(got);
        n_cases++;
        p = sep + strlen(SEP);
        line = next_line;
        if (line && *line == 0 && !strchr(line, '\n') && line[0] == 0 && p >= inp + inp_len) line = NULL;
        NEXT_LINE();
    }
    cr_expect_eq(n_cases, 46, "%s: expected the 46 cases of the README, found %d", name, n_cases);
    cr_assert_eq(n_bad, 0, "%s: %d of %d cases differ (see the log)", name, n_bad, n_cases);
    tokenizer_free(t);
    free(inp);
    free(outs);
    free(gguf);
    free(inp_path);
    free(out_path);
}

Test(vocab, llama_spm) { run_vocab("llama-spm", 0); }
Test(vocab, phi_3) { run_vocab("phi-3", 0); }
Test(vocab, deepseek_coder) { run_vocab("deepseek-coder", 1); }
Test(vocab, deepseek_llm) { run_vocab("deepseek-llm", 1); }
Test(vocab, falcon) { run_vocab("falcon", 1); }
Test(vocab, gpt_2) { run_vocab("gpt-2", 1); }
Test(vocab, mpt) { run_vocab("mpt", 1); }
Test(vocab, refact) { run_vocab("refact", 1); }
Test(vocab, starcoder) { run_vocab("starcoder", 1); }

/* bert-bge is WordPiece: not supported; the loader must say so rather than tokenize wrongly. */
Test(vocab, bert_bge_unsupported)
{
    char *gguf = tt_data_path("vocab/ggml-vocab-bert-bge.gguf");
    struct tokenizer *t = NULL;
    char err[256] = "";
    int rc = tt_load_gguf(gguf, &t, err);
    cr_assert_eq(rc, FERRY_ERR_UNSUPPORTED, "bert-bge: expected UNSUPPORTED, got %s", ferry_status_str(rc));
    cr_assert(strstr(err, "bert") != NULL, "message should name the model type: %s", err);
    cr_assert_null(t);
    free(gguf);
    cr_skip_test("bert-bge is a WordPiece vocab: reported as unsupported (%s)", err);
}

/* Vocabs without test vectors still load. */
Test(vocab, load_baichuan_and_gpt_neox)
{
    const char *names[] = {"vocab/ggml-vocab-baichuan.gguf", "vocab/ggml-vocab-gpt-neox.gguf"};
    for (int i = 0; i < 2; i++) {
        char *gguf = tt_data_path(names[i]);
        struct tokenizer *t = NULL;
        char err[256] = "";
        int rc = tt_load_gguf(gguf, &t, err);
        cr_assert_eq(rc, FERRY_OK, "%s: %s (%s)", names[i], ferry_status_str(rc), err);
        int n;
        int32_t *ids = tt_encode(t, "Hello world", 11, 0, 0, &n);
        cr_assert(n >= 2 && n <= 4, "%s: 'Hello world' gave %d tokens", names[i], n);
        char *dec;
        size_t dl;
        cr_assert_eq(tokenizer_decode(t, ids, n, 0, &dec, &dl), FERRY_OK);
        cr_assert_str_eq(dec + (dec[0] == ' '), "Hello world");
        free(dec);
        free(ids);
        tokenizer_free(t);
        free(gguf);
    }
}
