/* tok_load — building a tokenizer from GGUF metadata or from a Hugging Face tokenizer.json.
 *
 * GGUF keys read (llama.cpp's names): tokenizer.ggml.model ("llama" = SentencePiece, "gpt2" = byte-level
 * BPE, "gemma4" = BPE on raw UTF-8 with spaces as U+2581), .pre (the pre-tokenizer), .tokens, .scores,
 * .token_type, .merges ("a b" strings, rank = index), .bos_token_id, .eos_token_id, .unknown_token_id,
 * .eot_token_id, .add_bos_token, .add_eos_token, .add_space_prefix; general.name (Phi-3's special tokens
 * strip the whitespace that follows them). Defaults when a key is absent follow llama.cpp: SPM bos 1, eos 2,
 * unk 0, add_bos true, add_space_prefix true; BPE add_bos only for the Llama 3 family and Tekken; Gemma 4
 * always adds BOS.
 *
 * tokenizer.json (model type BPE): vocab, merges ("a b" or ["a", "b"]), byte_fallback, ignore_merges,
 * unk_token, added_tokens (special -> CONTROL, else USER_DEFINED; lstrip/rstrip), normalizer (Prepend "▁",
 * Replace " " -> "▁", NFC; NFKC is approximated by NFC), pre_tokenizer (Sequence, Split with a known regex,
 * ByteLevel (add_prefix_space when first), Digits, Metaspace), post_processor (TemplateProcessing: BOS).
 * tokenizer_config.json may override add_bos_token, add_eos_token, bos_token, eos_token;
 * generation_config.json's eos_token_id adds end-of-generation ids. Anything else is FERRY_ERR_UNSUPPORTED.
 */
#include <ctype.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/core/log.h"
#include "kernels/core/status.h"
#include "runtime/tok/tok_impl.h"
#include "weights/gguf.h"
#include "weights/model_file.h"

/* ---- GGUF ----------------------------------------------------------------------------------------- */

static int32_t gguf_id(const struct gguf *g, const char *key, int32_t dflt)
{
    int64_t v;
    if (gguf_get_i64(g, key, &v) != FERRY_OK) return dflt;
    return v >= 0 && v < (1 << 30) ? (int32_t)v : -1;
}

static int gguf_flag(const struct gguf *g, const char *key, int dflt)
{
    int v;
    return gguf_get_bool(g, key, &v) == FERRY_OK ? v : dflt;
}

static int str_is(struct gguf_str s, const char *lit)
{
    return s.len == strlen(lit) && memcmp(s.ptr, lit, s.len) == 0;
}

int tokenizer_init_gguf(struct tokenizer **out, const struct gguf *g, char err[256])
{
    *out = NULL;
    err[0] = 0;
    struct gguf_str model = {0}, pre = {0};
    if (gguf_get_str(g, "tokenizer.ggml.model", &model) != FERRY_OK) {
        snprintf(err, 256, "GGUF has no tokenizer.ggml.model");
        return FERRY_ERR_NOT_FOUND;
    }
    int spm = str_is(model, "llama"), gemma4 = str_is(model, "gemma4");
    if (!spm && !gemma4 && !str_is(model, "gpt2")) {
        snprintf(err, 256,
                 "tokenizer.ggml.model \"%.*s\" is not supported (only llama/SPM, gpt2/BPE and gemma4)",
                 (int)(model.len > 40 ? 40 : model.len), model.ptr);
        return FERRY_ERR_UNSUPPORTED;
    }
    enum gguf_vtype et;
    uint64_t n;
    if (gguf_get_arr(g, "tokenizer.ggml.tokens", &et, &n) != FERRY_OK || et != GGUF_TYPE_STRING || n == 0 ||
        n > (1u << 24)) {
        snprintf(err, 256, "GGUF tokenizer.ggml.tokens is missing or not a string array");
        return FERRY_ERR_FORMAT;
    }
    struct tokenizer *t;
    int rc = tok_alloc(&t, (int)n);
    if (rc != FERRY_OK) return rc;
    float *scores = NULL;
    int32_t *types = NULL;
    enum gguf_vtype st;
    uint64_t sn;
    if (gguf_get_arr(g, "tokenizer.ggml.scores", &st, &sn) == FERRY_OK && sn == n) {
        scores = malloc(n * sizeof *scores);
        if (!scores) rc = FERRY_ERR_NOMEM; /* not the same as a file without scores */
        if (!scores || gguf_arr_f32(g, "tokenizer.ggml.scores", scores, n) != FERRY_OK) {
            free(scores);
            scores = NULL;
        }
    }
    if (gguf_get_arr(g, "tokenizer.ggml.token_type", &st, &sn) == FERRY_OK && sn == n) {
        types = malloc(n * sizeof *types);
        if (!types) rc = FERRY_ERR_NOMEM;
        if (!types || gguf_arr_i32(g, "tokenizer.ggml.token_type", types, n) != FERRY_OK) {
            free(types);
            types = NULL;
        }
    }
    for (uint64_t i = 0; i < n && rc == FERRY_OK; i++) {
        struct gguf_str s;
        rc = gguf_arr_str(g, "tokenizer.ggml.tokens", i, &s);
        if (rc != FERRY_OK) break;
        int ty = types ? types[i] : TOK_TYPE_NORMAL;
        if (ty < TOK_TYPE_NORMAL || ty > TOK_TYPE_BYTE) ty = TOK_TYPE_NORMAL;
        rc = tok_set_token(t, (int)i, s.ptr, s.len, scores ? scores[i] : 0.0f, ty);
    }
    free(scores);
    free(types);
    if (rc == FERRY_OK) rc = tok_build_map(t);
    if (rc != FERRY_OK) {
        snprintf(err, 256, "GGUF tokenizer.ggml.tokens: %s", ferry_status_str(rc));
        tokenizer_free(t);
        return rc;
    }

    char prebuf[64] = "default";
    int pre_bad = 0; /* a name no table can hold (too long, NUL inside): refused below for BPE */
    if (gemma4) {
        strcpy(prebuf, "gemma4"); /* llama.cpp: the gemma4 model implies its pre-tokenizer */
    } else if (gguf_get_str(g, "tokenizer.ggml.pre", &pre) == FERRY_OK && pre.len > 0) {
        pre_bad = pre.len >= sizeof prebuf || memchr(pre.ptr, 0, pre.len) != NULL;
        if (!pre_bad) {
            memcpy(prebuf, pre.ptr, pre.len);
            prebuf[pre.len] = 0;
        }
    }
    int add_bos_dflt = spm;
    if (spm) {
        t->algo = TOK_ALGO_SPM;
        t->norm = TOK_NORM_SPM;
        t->add_space_prefix = gguf_flag(g, "tokenizer.ggml.add_space_prefix", 1);
        t->bos = gguf_id(g, "tokenizer.ggml.bos_token_id", 1);
        t->eos = gguf_id(g, "tokenizer.ggml.eos_token_id", 2);
        t->unk = gguf_id(g, "tokenizer.ggml.unknown_token_id", 0);
    } else {
        t->algo = TOK_ALGO_BPE;
        t->norm = TOK_NORM_NONE;
        t->bytelevel = 1;
        if (pre_bad) {
            snprintf(err, 256, "tokenizer.ggml.pre \"%.*s...\" is not supported", (int)strnlen(pre.ptr, 60),
                     pre.ptr);
            rc = FERRY_ERR_UNSUPPORTED;
        } else {
            rc = pretok_from_gguf_pre(&t->pre, prebuf, err);
        }
        if (rc != FERRY_OK) {
            tokenizer_free(t);
            return rc;
        }
        /* llama.cpp's llama_vocab::load: the pre values whose words that are tokens skip merging, and
         * whether they add BOS by default. */
        static const struct {
            const char *pre;
            int add_bos;
        } whole[] = {{"llama3", 1},  {"llama-v3", 1}, {"llama-bpe", 1}, {"falcon3", 1},      {"falcon-h1", 1},
                     {"pixtral", 1}, {"midm-2.0", 1}, {"lfm2", 1},      {"jina-v5-nano", 1}, {"tekken", 1},
                     {"glm4", 0},    {"glm5", 0},     {"minicpm5", 0}};
        for (size_t i = 0; i < sizeof whole / sizeof whole[0]; i++) {
            if (strcmp(prebuf, whole[i].pre) != 0) continue;
            t->ignore_merges = 1;
            add_bos_dflt = whole[i].add_bos;
        }
        int g4 = strcmp(prebuf, "gemma4") == 0 || strcmp(prebuf, "granite-embed-multi-311m") == 0;
        if (g4 || strcmp(prebuf, "sarvam-moe") == 0) {
            /* SentencePiece-style BPE on raw UTF-8: spaces become U+2581, unknown bytes <0xNN>; Gemma 4 also
             * keeps a run of newlines that is a token whole and always adds BOS (llama.cpp overrides
             * add_bos_token). */
            t->bytelevel = 0;
            t->norm = TOK_NORM_METASPACE;
            t->meta_prepend = 0;
            t->byte_fallback = 1;
            t->whole_newlines = g4;
            add_bos_dflt |= g4;
        }
        t->bos = gguf_id(g, "tokenizer.ggml.bos_token_id", -1);
        t->eos = gguf_id(g, "tokenizer.ggml.eos_token_id", -1);
        t->unk = gguf_id(g, "tokenizer.ggml.unknown_token_id", -1);
        if (gguf_get_arr(g, "tokenizer.ggml.merges", &et, &n) != FERRY_OK || et != GGUF_TYPE_STRING) {
            snprintf(err, 256, "GGUF gpt2 tokenizer has no tokenizer.ggml.merges");
            tokenizer_free(t);
            return FERRY_ERR_FORMAT;
        }
        for (uint64_t i = 0; i < n; i++) {
            struct gguf_str m;
            if (gguf_arr_str(g, "tokenizer.ggml.merges", i, &m) != FERRY_OK) break;
            const char *sp = m.len > 1 ? memchr(m.ptr + 1, ' ', m.len - 1) : NULL;
            if (!sp) continue;
            size_t al = (size_t)(sp - m.ptr);
            rc = tok_add_merge_str(t, m.ptr, al, sp + 1, m.len - al - 1, (int)i);
            if (rc == FERRY_ERR_NOMEM) {
                tokenizer_free(t);
                return rc;
            }
        }
    }
    t->eot = gguf_id(g, "tokenizer.ggml.eot_token_id", -1);
    t->add_bos = t->whole_newlines || gguf_flag(g, "tokenizer.ggml.add_bos_token", add_bos_dflt);
    t->add_eos = gguf_flag(g, "tokenizer.ggml.add_eos_token", 0);

    struct gguf_str name;
    if (gguf_get_str(g, "general.name", &name) == FERRY_OK) {
        char low[128];
        size_t l = name.len < sizeof low - 1 ? name.len : sizeof low - 1;
        for (size_t i = 0; i < l; i++) low[i] = (char)tolower((unsigned char)name.ptr[i]);
        low[l] = 0;
        if (strstr(low, "phi-3") || strstr(low, "phi3")) {
            /* llama.cpp: Phi-3's special tokens eat the whitespace after them, except <unk>, <s>,
             * <|endoftext|>; </s> does too. */
            for (int id = 0; id < t->n_vocab; id++) {
                int ty = t->type[id];
                if (ty == TOK_TYPE_CONTROL || ty == TOK_TYPE_USER_DEFINED || ty == TOK_TYPE_UNKNOWN)
                    t->strip[id] |= 2;
            }
            static const char *const keep[] = {"<unk>", "<s>", "<|endoftext|>"};
            for (size_t i = 0; i < 3; i++) {
                int32_t id = tok_lookup(t, keep[i], strlen(keep[i]));
                if (id >= 0) t->strip[id] &= (uint8_t)~2;
            }
            int32_t id = tok_lookup(t, "</s>", 4);
            if (id >= 0) t->strip[id] |= 2;
        }
    }
    rc = tok_finish(t, err);
    if (rc != FERRY_OK) {
        tokenizer_free(t);
        return rc;
    }
    *out = t;
    return FERRY_OK;
}
