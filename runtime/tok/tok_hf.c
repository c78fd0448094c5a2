/* tok_hf — building a tokenizer from a Hugging Face directory (tokenizer.json + tokenizer_config.json).
 * The settings understood are listed at the top of tok_load.c; everything else fails with
 * FERRY_ERR_UNSUPPORTED and a message naming the setting.
 */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/core/log.h"
#include "kernels/core/status.h"
#include "runtime/tok/tok_impl.h"
#include "weights/model_file.h"

struct hf_cfg {
    int bytelevel;
    int prefix_space;
    int nfc;
    int norm;          /* enum tok_norm */
    int prepend;       /* normalizer Prepend("▁") */
    int meta_prepend;
};

static const char *jstr(const json_t *o, const char *key)
{
    return json_string_value(json_object_get(o, key));
}

static int type_is(const json_t *o, const char *ty)
{
    const char *s = jstr(o, "type");
    return s && strcmp(s, ty) == 0;
}

static int hf_normalizer(const json_t *n, struct hf_cfg *c, char err[256])
{
    if (!n || json_is_null(n)) return FERRY_OK;
    if (type_is(n, "Sequence")) {
        const json_t *v;
        size_t i;
        json_array_foreach(json_object_get(n, "normalizers"), i, v)
        {
            int rc = hf_normalizer(v, c, err);
            if (rc != FERRY_OK) return rc;
        }
        return FERRY_OK;
    }
    if (type_is(n, "Prepend") && jstr(n, "prepend") && strcmp(jstr(n, "prepend"), "\xe2\x96\x81") == 0) {
        c->prepend = 1;
        return FERRY_OK;
    }
    if (type_is(n, "Replace")) {
        const char *pat = jstr(json_object_get(n, "pattern"), "String"), *to = jstr(n, "content");
        if (pat && to && strcmp(pat, " ") == 0 && strcmp(to, "\xe2\x96\x81") == 0) {
            c->norm = TOK_NORM_SPM;
            return FERRY_OK;
        }
    }
    if (type_is(n, "NFC")) {
        c->nfc = 1;
        return FERRY_OK;
    }
    if (type_is(n, "NFKC")) {
        FLOG_WARN("tokenizer.json: NFKC normalization is not implemented; NFC is used instead");
        c->nfc = 1;
        return FERRY_OK;
    }
    snprintf(err, 256, "tokenizer.json: unsupported normalizer \"%.40s\"", jstr(n, "type") ? jstr(n, "type") : "?");
    return FERRY_ERR_UNSUPPORTED;
}

static int hf_pretok(const json_t *p, struct tokenizer *t, struct hf_cfg *c, char err[256])
{
    if (!p || json_is_null(p)) return FERRY_OK;
    const char *ty = jstr(p, "type");
    if (!ty) ty = "?";
    if (strcmp(ty, "Sequence") == 0) {
        const json_t *v;
        size_t i;
        json_array_foreach(json_object_get(p, "pretokenizers"), i, v)
        {
            int rc = hf_pretok(v, t, c, err);
            if (rc != FERRY_OK) return rc;
        }
        return FERRY_OK;
    }
    if (strcmp(ty, "Split") == 0) {
        const json_t *pat = json_object_get(p, "pattern");
        const char *re = jstr(pat, "Regex");
        const char *beh = jstr(p, "behavior");
        if (!re || (beh && strcmp(beh, "Isolated") != 0) || json_is_true(json_object_get(p, "invert"))) {
            snprintf(err, 256, "tokenizer.json: unsupported Split (only Regex patterns, Isolated, not inverted)");
            return FERRY_ERR_UNSUPPORTED;
        }
        return pretok_add_regex(&t->pre, re, json_string_length(json_object_get(pat, "Regex")), err);
    }
    if (strcmp(ty, "ByteLevel") == 0) {
        c->bytelevel = 1;
        if (json_is_true(json_object_get(p, "add_prefix_space"))) {
            /* HF prepends ' ' to each piece ByteLevel sees; as the first stage those are the text fragments. */
            if (t->pre.n_stages > 0) {
                snprintf(err, 256, "tokenizer.json: ByteLevel add_prefix_space=true after other splits is not supported");
                return FERRY_ERR_UNSUPPORTED;
            }
            c->prefix_space = 1;
        }
        const json_t *ur = json_object_get(p, "use_regex");
        if (!ur || json_is_true(ur)) {
            static const char gpt2[] =
                "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";
            return pretok_add_regex(&t->pre, gpt2, strlen(gpt2), err);
        }
        return FERRY_OK;
    }
    if (strcmp(ty, "Digits") == 0) {
        const char *re = json_is_true(json_object_get(p, "individual_digits")) ? "\\p{N}" : "\\p{N}+";
        return pretok_add_regex(&t->pre, re, strlen(re), err);
    }
    if (strcmp(ty, "Metaspace") == 0) {
        const char *rep = jstr(p, "replacement");
        if (rep && strcmp(rep, "\xe2\x96\x81") != 0) {
            snprintf(err, 256, "tokenizer.json: Metaspace replacement other than U+2581 is not supported");
            return FERRY_ERR_UNSUPPORTED;
        }
        c->norm = TOK_NORM_METASPACE;
        const char *scheme = jstr(p, "prepend_scheme");
        if (scheme) c->meta_prepend = strcmp(scheme, "first") == 0 ? 1 : strcmp(scheme, "always") == 0 ? 2 : 0;
        else c->meta_prepend = json_is_false(json_object_get(p, "add_prefix_space")) ? 0 : 2;
        const json_t *split = json_object_get(p, "split");
        if (!split || json_is_true(split)) return pretok_add_metaspace(&t->pre);
        return FERRY_OK;
    }
    snprintf(err, 256, "tokenizer.json: unsupported pre_tokenizer \"%.40s\"", ty);
    return FERRY_ERR_UNSUPPORTED;
}

/* bos_token / eos_token in tokenizer_config.json: a string or {"content": ...}. */
static int32_t cfg_token(const struct tokenizer *t, const json_t *cfg, const char *key)
{
    const json_t *v = json_object_get(cfg, key);
    const char *s = json_is_string(v) ? json_string_value(v) : jstr(v, "content");
    return s ? tok_lookup(t, s, strlen(s)) : -1;
}

static int hf_build(struct tokenizer **out, const json_t *root, const json_t *cfg, const json_t *gen_cfg,
                    char err[256])
{
    const json_t *model = json_object_get(root, "model");
    const char *mty = jstr(model, "type");
    const json_t *vocab = json_object_get(model, "vocab");
    const json_t *merges = json_object_get(model, "merges");
    if ((mty && strcmp(mty, "BPE") != 0) || !json_is_object(vocab) || !json_is_array(merges)) {
        snprintf(err, 256, "tokenizer.json: model type \"%.30s\" is not supported (only BPE)", mty ? mty : "?");
        return FERRY_ERR_UNSUPPORTED;
    }
    const char *cs = jstr(model, "continuing_subword_prefix"), *ew = jstr(model, "end_of_word_suffix");
    if ((cs && *cs) || (ew && *ew)) {
        snprintf(err, 256, "tokenizer.json: BPE continuing_subword_prefix/end_of_word_suffix are not supported");
        return FERRY_ERR_UNSUPPORTED;
    }
    const json_t *added = json_object_get(root, "added_tokens");
    long long max_id = -1;
    const char *k;
    const json_t *v;
    size_t i;
    json_object_foreach((json_t *)vocab, k, v)
    {
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) >= (1 << 24)) goto bad;
        if (json_integer_value(v) > max_id) max_id = json_integer_value(v);
    }
    json_array_foreach(added, i, v)
    {
        json_int_t id = json_integer_value(json_object_get(v, "id"));
        if (id < 0 || id >= (1 << 24) || !jstr(v, "content")) goto bad;
        if (id > max_id) max_id = id;
    }
    struct tokenizer *t;
    int byte_fallback = json_is_true(json_object_get(model, "byte_fallback"));
    int rc = tok_alloc(&t, (int)(max_id + 1));
    if (rc != FERRY_OK) return rc;
    json_object_foreach((json_t *)vocab, k, v)
    {
        int ty = TOK_TYPE_NORMAL;
        size_t kl = strlen(k);
        if (byte_fallback && kl == 6 && memcmp(k, "<0x", 3) == 0 && k[5] == '>') ty = TOK_TYPE_BYTE;
        if ((rc = tok_set_token(t, (int)json_integer_value(v), k, kl, 0.0f, ty)) != FERRY_OK) goto fail;
    }
    json_array_foreach(added, i, v)
    {
        int id = (int)json_integer_value(json_object_get(v, "id"));
        const json_t *c = json_object_get(v, "content");
        int ty = json_is_true(json_object_get(v, "special")) ? TOK_TYPE_CONTROL : TOK_TYPE_USER_DEFINED;
        if ((rc = tok_set_token(t, id, json_string_value(c), json_string_length(c), 0.0f, ty)) != FERRY_OK) goto fail;
        t->strip[id] = (uint8_t)((json_is_true(json_object_get(v, "lstrip")) ? 1 : 0) |
                                 (json_is_true(json_object_get(v, "rstrip")) ? 2 : 0));
    }
    if ((rc = tok_build_map(t)) != FERRY_OK) goto fail;
    json_array_foreach(merges, i, v)
    {
        const char *a, *b;
        size_t al, bl;
        if (json_is_string(v)) {
            a = json_string_value(v);
            const char *sp = strchr(a + (a[0] ? 1 : 0), ' ');
            if (!sp) continue;
            al = (size_t)(sp - a);
            b = sp + 1;
            bl = strlen(b);
        } else if (json_is_array(v) && json_array_size(v) == 2) {
            a = json_string_value(json_array_get(v, 0));
            b = json_string_value(json_array_get(v, 1));
            if (!a || !b) continue;
            al = json_string_length(json_array_get(v, 0));
            bl = json_string_length(json_array_get(v, 1));
        } else {
            continue;
        }
        rc = tok_add_merge_str(t, a, al, b, bl, (int)i);
        if (rc == FERRY_ERR_NOMEM) goto fail;
    }
    struct hf_cfg c = {0};
    if ((rc = hf_normalizer(json_object_get(root, "normalizer"), &c, err)) != FERRY_OK) goto out;
    if ((rc = hf_pretok(json_object_get(root, "pre_tokenizer"), t, &c, err)) != FERRY_OK) goto out;
    if (type_is(json_object_get(root, "decoder"), "ByteLevel")) c.bytelevel = 1;
    t->algo = TOK_ALGO_BPE;
    t->bytelevel = c.bytelevel;
    t->byte_fallback = byte_fallback;
    t->ignore_merges = json_is_true(json_object_get(model, "ignore_merges"));
    t->norm = c.norm;
    t->nfc = c.nfc;
    t->prefix_space = c.prefix_space;
    t->add_space_prefix = c.prepend;
    t->meta_prepend = c.meta_prepend;
    if (c.bytelevel && c.norm != TOK_NORM_NONE) {
        snprintf(err, 256, "tokenizer.json: ByteLevel combined with a '▁' normalizer is not supported");
        rc = FERRY_ERR_UNSUPPORTED;
        goto out;
    }
    const char *unk = jstr(model, "unk_token");
    if (unk) t->unk = tok_lookup(t, unk, strlen(unk));
    /* post_processor TemplateProcessing: a leading special token in "single" is the BOS that is added. */
    const json_t *pp = json_object_get(root, "post_processor");
    const json_t *tps[8];
    int n_tp = 0;
    if (type_is(pp, "TemplateProcessing")) tps[n_tp++] = pp;
    if (type_is(pp, "Sequence")) {
        json_array_foreach(json_object_get(pp, "processors"), i, v) if (n_tp < 8 && type_is(v, "TemplateProcessing"))
            tps[n_tp++] = v;
    }
    for (int j = 0; j < n_tp; j++) {
        const json_t *first = json_array_get(json_object_get(tps[j], "single"), 0);
        const char *sid = jstr(json_object_get(first, "SpecialToken"), "id");
        if (sid) {
            t->bos = tok_lookup(t, sid, strlen(sid));
            t->add_bos = t->bos >= 0;
        }
    }
    if (cfg) {
        int32_t id = cfg_token(t, cfg, "bos_token");
        if (id >= 0) t->bos = id;
        id = cfg_token(t, cfg, "eos_token");
        if (id >= 0) t->eos = id;
        const json_t *ab = json_object_get(cfg, "add_bos_token");
        if (json_is_boolean(ab)) t->add_bos = json_is_true(ab);
        const json_t *ae = json_object_get(cfg, "add_eos_token");
        if (json_is_boolean(ae)) t->add_eos = json_is_true(ae);
    }
    rc = tok_finish(t, err);
    /* generation_config.json's eos_token_id (an id or a list: Llama 3 Instruct lists <|eot_id|> there)
     * also ends generations. */
    const json_t *gen = json_object_get(gen_cfg, "eos_token_id");
    if (rc == FERRY_OK && json_is_integer(gen)) tok_add_eog(t, (int32_t)json_integer_value(gen));
    if (rc == FERRY_OK)
        json_array_foreach(gen, i, v) if (json_is_integer(v)) tok_add_eog(t, (int32_t)json_integer_value(v));
out:
    if (rc != FERRY_OK) goto fail;
    *out = t;
    return FERRY_OK;
fail:
    if (!err[0]) snprintf(err, 256, "tokenizer.json: %s", ferry_status_str(rc));
    tokenizer_free(t);
    return rc;
bad:
    snprintf(err, 256, "tokenizer.json: bad vocab or added_tokens entry");
    return FERRY_ERR_FORMAT;
}

int tokenizer_init_hf(struct tokenizer **out, const char *dir, char err[256])
{
    *out = NULL;
    err[0] = 0;
    char path[4096];
    json_error_t je;
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    json_t *root = json_load_file(path, 0, &je);
    if (!root) {
        snprintf(err, 256, "%.120s: %.100s (line %d)", path, je.text, je.line);
        return FERRY_ERR_IO;
    }
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    json_t *cfg = json_load_file(path, 0, &je); /* optional */
    snprintf(path, sizeof path, "%s/generation_config.json", dir);
    json_t *gen = json_load_file(path, 0, &je); /* optional */
    int rc = hf_build(out, root, cfg, gen, err);
    json_decref(root);
    json_decref(cfg);
    json_decref(gen);
    return rc;
}

int tokenizer_init(struct tokenizer **out, const struct model_file *mf, char err[256])
{
    *out = NULL;
    err[0] = 0;
    if (!mf) return FERRY_ERR_INVALID;
    if (mf->gguf) return tokenizer_init_gguf(out, mf->gguf, err);
    if (mf->dir) return tokenizer_init_hf(out, mf->dir, err);
    snprintf(err, 256, "model has neither GGUF metadata nor a directory with tokenizer.json");
    return FERRY_ERR_NOT_FOUND;
}
