/* hf_export — Hugging Face hyperparameters and tokenizer as llama.cpp GGUF metadata (see hf_export.h). */
#include "weights/arch/arch.h"
#include "weights/hf_export.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/core/log.h"
#include "kernels/core/status.h"
#include "weights/hf_config.h"
#include "weights/mapfile.h"

/* llama.cpp's token types (llama_token_type). */
enum { TT_NORMAL = 1, TT_UNKNOWN = 2, TT_CONTROL = 3, TT_USER_DEFINED = 4, TT_UNUSED = 5, TT_BYTE = 6 };

static const char *base_name(const char *path)
{
    const char *e = path + strlen(path);
    while (e > path && e[-1] == '/') e--;
    const char *b = e;
    while (b > path && b[-1] != '/') b--;
    return b;
}

int hf_export_metadata(struct gguf_writer *w, const struct model_file *mf, const char *arch, char err[256])
{
    const struct llm_hparams *hp = &mf->hp;
    char k[128];
    int rc;
#define KEY(suffix) (snprintf(k, sizeof k, "%s.%s", arch, suffix), k)
#define TRY(call)                                                                                            \
    do {                                                                                                     \
        if ((rc = (call))) return rc;                                                                        \
    } while (0)
    TRY(gguf_writer_kv_str(w, "general.architecture", arch, strlen(arch), err));
    TRY(gguf_writer_kv_str(w, "general.type", "model", 5, err));
    const char *name = mf->dir ? base_name(mf->dir) : "model";
    const size_t name_len = strcspn(name, "/");
    TRY(gguf_writer_kv_str(w, "general.name", name, name_len, err));
    TRY(gguf_writer_kv_u32(w, KEY("block_count"), (uint32_t)hp->n_layers, err));
    TRY(gguf_writer_kv_u32(w, KEY("context_length"), (uint32_t)hp->ctx_train, err));
    TRY(gguf_writer_kv_u32(w, KEY("embedding_length"), (uint32_t)hp->dim, err));
    /* Families whose FFNs are all experts (their files may lack the key) write their sizes in gguf_write, as
     * llama.cpp's converter does for Qwen3.5-MoE. */
    const struct arch_family *fam = arch_find_gguf(arch, strlen(arch));
    if (!fam || !fam->gguf_ffn_optional || hp->n_expert == 0)
        TRY(gguf_writer_kv_u32(w, KEY("feed_forward_length"), (uint32_t)hp->ffn_dim, err));
    TRY(gguf_writer_kv_u32(w, KEY("attention.head_count"), (uint32_t)hp->n_heads, err));
    TRY(gguf_writer_kv_u32(w, KEY("attention.head_count_kv"), (uint32_t)hp->n_kv_heads, err));
    TRY(gguf_writer_kv_f32(w, KEY("rope.freq_base"), hp->rope_theta, err));
    TRY(gguf_writer_kv_f32(w, KEY("attention.layer_norm_rms_epsilon"), hp->norm_eps, err));
    if (hp->head_dim * hp->n_heads != hp->dim) {
        TRY(gguf_writer_kv_u32(w, KEY("attention.key_length"), (uint32_t)hp->head_dim, err));
        TRY(gguf_writer_kv_u32(w, KEY("attention.value_length"), (uint32_t)hp->head_dim, err));
    }
    TRY(gguf_writer_kv_u32(w, KEY("vocab_size"), (uint32_t)hp->n_vocab, err));
    TRY(gguf_writer_kv_u32(w, KEY("rope.dimension_count"), (uint32_t)hp->rope_dim, err));
    if (hp->rope_scaling.type == ROPE_SCALING_LINEAR) {
        TRY(gguf_writer_kv_str(w, KEY("rope.scaling.type"), "linear", 6, err));
        TRY(gguf_writer_kv_f32(w, KEY("rope.scaling.factor"), hp->rope_scaling.factor, err));
    }
    if (hp->rope_scaling.type == ROPE_SCALING_YARN) { /* as llama.cpp's converter (truncate has no key) */
        const struct rope_scaling *sc = &hp->rope_scaling;
        TRY(gguf_writer_kv_str(w, KEY("rope.scaling.type"), "yarn", 4, err));
        TRY(gguf_writer_kv_f32(w, KEY("rope.scaling.factor"), sc->factor, err));
        TRY(gguf_writer_kv_u32(w, KEY("rope.scaling.original_context_length"), (uint32_t)sc->orig_ctx, err));
        TRY(gguf_writer_kv_f32(w, KEY("rope.scaling.yarn_beta_fast"), sc->beta_fast, err));
        TRY(gguf_writer_kv_f32(w, KEY("rope.scaling.yarn_beta_slow"), sc->beta_slow, err));
        if (sc->attn_factor > 0)
            TRY(gguf_writer_kv_f32(w, KEY("rope.scaling.yarn_attn_factor"), sc->attn_factor, err));
        if (sc->yarn_log_mul != 0)
            TRY(gguf_writer_kv_f32(w, KEY("rope.scaling.yarn_log_multiplier"), sc->yarn_log_mul, err));
    }
    if (hp->rope_scaling.type == ROPE_SCALING_LONGROPE) { /* conversion/phi.py: no type key; factor tensors */
        const struct rope_scaling *sc = &hp->rope_scaling;
        TRY(gguf_writer_kv_u32(w, KEY("rope.scaling.original_context_length"), (uint32_t)sc->orig_ctx, err));
        TRY(gguf_writer_kv_f32(w, KEY("rope.scaling.attn_factor"), sc->attn_factor, err));
    }
    if (fam && hp->n_expert > 0 && fam->gguf_experts) fam = fam->gguf_experts; /* Mixtral: llama + experts */
    if (fam && fam->gguf_write) TRY(fam->gguf_write(w, hp, arch, err));
#undef KEY
#undef TRY
    return hf_export_tokenizer(w, mf, err);
}

/* ---- rope factors ----------------------------------------------------------------------------------------
 */

int hf_export_rope_freqs(const struct model_file *mf, float *factors)
{
    const struct llm_hparams *hp = &mf->hp;
    const struct rope_scaling *sc = &hp->rope_scaling;
    if (sc->type != ROPE_SCALING_LLAMA3) return 0;
    const int dim = hp->rope_dim;
    const double old_ctx = sc->orig_ctx > 0 ? sc->orig_ctx : 8192;
    const double low_wavelen = old_ctx / sc->low_freq_factor, high_wavelen = old_ctx / sc->high_freq_factor;
    for (int i = 0; i < dim / 2; i++) {
        const float freq = 1.0f / powf(hp->rope_theta, (float)(2 * i) / (float)dim);
        const double wavelen = 2 * M_PI / freq;
        double f;
        if (wavelen < high_wavelen) {
            f = 1;
        } else if (wavelen > low_wavelen) {
            f = sc->factor;
        } else {
            const double smooth =
                (old_ctx / wavelen - sc->low_freq_factor) / (sc->high_freq_factor - sc->low_freq_factor);
            f = 1 / ((1 - smooth) / sc->factor + smooth);
        }
        factors[i] = (float)f;
    }
    return dim / 2;
}

/* ---- tokenizer -------------------------------------------------------------------------------------------
 */

/* The pre-tokenizer of a byte-level BPE tokenizer.json, as llama.cpp's tokenizer.ggml.pre names it (its
 * convert_hf_to_gguf.py identifies it by hashing the tokenizer's output; the split regexes identify it too).
 */
static const char *pre_name(const json_t *pre)
{
    static const char *const llama3 =
        "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "
        "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
    static const char *const qwen2 = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| "
                                     "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
    const json_t *items[8];
    size_t n = 0, i;
    const json_t *v;
    const char *ty = json_string_value(json_object_get(pre, "type"));
    if (ty && !strcmp(ty, "Sequence")) {
        json_array_foreach(json_object_get(pre, "pretokenizers"), i, v) if (n < 8) items[n++] = v;
    } else if (pre) {
        items[n++] = pre;
    }
    const char *regex = NULL;
    int digits = 0, bytelevel_regex = 0;
    for (i = 0; i < n; i++) {
        const char *t = json_string_value(json_object_get(items[i], "type"));
        if (!t) continue;
        if (!strcmp(t, "Split"))
            regex = json_string_value(json_object_get(json_object_get(items[i], "pattern"), "Regex"));
        if (!strcmp(t, "Digits")) digits = json_is_true(json_object_get(items[i], "individual_digits"));
        if (!strcmp(t, "ByteLevel")) bytelevel_regex = !json_is_false(json_object_get(items[i], "use_regex"));
    }
    if (regex && !strcmp(regex, llama3)) return "llama-bpe";
    if (regex && !strcmp(regex, qwen2)) return "qwen2";
    if (!regex && digits && bytelevel_regex) return "smollm";
    if (!regex && !digits && bytelevel_regex) return "gpt-2";
    return NULL;
}

static int has_bytelevel(const json_t *o)
{
    const char *ty = json_string_value(json_object_get(o, "type"));
    if (ty && !strcmp(ty, "ByteLevel")) return 1;
    size_t i;
    const json_t *v;
    json_array_foreach(json_object_get(o, "pretokenizers"), i, v) if (has_bytelevel(v)) return 1;
    return 0;
}

/* convert_hf_to_gguf.py's does_token_look_special: added tokens that are CONTROL although not "special". */
static int looks_special(const char *s)
{
    const size_t n = strlen(s);
#define ENDS(suf) (n >= strlen(suf) && !strcmp(s + n - strlen(suf), suf))
    return !strcmp(s, "<pad>") || !strcmp(s, "<mask>") || !strcmp(s, "<2mass>") || !strcmp(s, "[@BOS@]") ||
           (!strncmp(s, "<|", 2) && ENDS("|>")) ||
           (!strncmp(s, "<\xef\xbd\x9c", 4) && ENDS("\xef\xbd\x9c>")) ||
           (!strncmp(s, "<start_of_", 10) && ENDS(">")) || (!strncmp(s, "<end_of_", 8) && ENDS(">"));
#undef ENDS
}

static json_t *load_json(const char *dir, const char *file, char err[256])
{
    char path[4096], *buf;
    size_t len;
    snprintf(path, sizeof path, "%s/%s", dir, file);
    if (mapfile_read_small(path, HF_MAX_JSON, &buf, &len, err) != FERRY_OK) return NULL;
    json_error_t je;
    json_t *j = json_loadb(buf, len, 0, &je);
    free(buf);
    if (!j) snprintf(err, 256, "%s: %.100s (line %d)", file, je.text, je.line);
    return j;
}

struct vocab {
    int n;
    char **tok;  /* (n) NUL-terminated, owned */
    size_t *len; /* (n) */
    int32_t *type;
};

static void vocab_free(struct vocab *v)
{
    for (int i = 0; v->tok && i < v->n; i++) free(v->tok[i]);
    free(v->tok);
    free(v->len);
    free(v->type);
}

static int vocab_set(struct vocab *v, json_int_t id, const char *s, size_t len, int type)
{
    if (id < 0 || id >= v->n) return FERRY_OK; /* beyond the embedding: llama.cpp drops it too */
    char *c = malloc(len + 1);
    if (!c) return FERRY_ERR_NOMEM;
    memcpy(c, s, len);
    c[len] = 0;
    free(v->tok[id]);
    v->tok[id] = c;
    v->len[id] = len;
    v->type[id] = type;
    return FERRY_OK;
}

/* The id of the token named by tokenizer_config.json's key (a string or {"content": ...}), or -1. */
static int32_t config_token(const struct vocab *v, const json_t *cfg, const char *key)
{
    const json_t *j = json_object_get(cfg, key);
    const char *s =
        json_is_string(j) ? json_string_value(j) : json_string_value(json_object_get(j, "content"));
    if (!s) return -1;
    for (int i = 0; i < v->n; i++)
        if (v->tok[i] && !strcmp(v->tok[i], s)) return i;
    return -1;
}

int hf_export_tokenizer(struct gguf_writer *w, const struct model_file *mf, char err[256])
{
    char jerr[256] = "";
    json_t *root = mf->dir ? load_json(mf->dir, "tokenizer.json", jerr) : NULL;
    const json_t *model = json_object_get(root, "model");
    const char *mty = json_string_value(json_object_get(model, "type"));
    const int bytelevel = has_bytelevel(json_object_get(root, "pre_tokenizer")) ||
                          has_bytelevel(json_object_get(root, "decoder"));
    if (!root || !mty || strcmp(mty, "BPE") || !bytelevel ||
        !json_is_object(json_object_get(model, "vocab"))) {
        /* llama.cpp loads such a file (a model without a vocabulary: token ids in, logits out). */
        if (root)
            FLOG_WARN(
                "tokenizer.json is not a byte-level BPE tokenizer (model %s): the GGUF gets no vocabulary; "
                "convert it with llama.cpp's convert_hf_to_gguf.py",
                mty ? mty : "?");
        else
            FLOG_WARN("no tokenizer.json in %s (%s): the GGUF gets no vocabulary", mf->dir ? mf->dir : "?",
                      jerr);
        json_decref(root);
        return gguf_writer_kv_str(w, "tokenizer.ggml.model", "no_vocab", 8, err);
    }
    struct vocab v = {.n = mf->hp.n_vocab};
    v.tok = calloc((size_t)v.n, sizeof *v.tok);
    v.len = calloc((size_t)v.n, sizeof *v.len);
    v.type = calloc((size_t)v.n, sizeof *v.type);
    json_t *cfg = load_json(mf->dir, "tokenizer_config.json", jerr);
    const char **merges = NULL;
    size_t *merge_len = NULL;
    char **merge_buf = NULL;
    int rc = v.tok && v.len && v.type ? FERRY_OK : FERRY_ERR_NOMEM;
    const char *k;
    json_t *val;
    json_object_foreach(json_object_get(model, "vocab"), k, val)
    {
        if (!rc && json_is_integer(val)) rc = vocab_set(&v, json_integer_value(val), k, strlen(k), TT_NORMAL);
    }
    size_t i;
    json_array_foreach(json_object_get(root, "added_tokens"), i, val)
    {
        const json_t *c = json_object_get(val, "content");
        if (rc || !json_is_string(c)) continue;
        const char *s = json_string_value(c);
        if (json_is_true(json_object_get(val, "special")) || looks_special(s)) {
            rc = vocab_set(&v, json_integer_value(json_object_get(val, "id")), s, json_string_length(c),
                           TT_CONTROL);
        } else {
            /* User-defined tokens are matched before normalization: "▁" stands for a space there. */
            char *t = malloc(json_string_length(c) + 1);
            size_t n = 0;
            for (const char *p = s; t && *p;)
                if (!strncmp(p, "\xe2\x96\x81", 3))
                    t[n++] = ' ', p += 3;
                else
                    t[n++] = *p++;
            rc = t ? vocab_set(&v, json_integer_value(json_object_get(val, "id")), t, n, TT_USER_DEFINED)
                   : FERRY_ERR_NOMEM;
            free(t);
        }
    }
    char pad[32];
    for (int id = 0; id < v.n && !rc; id++)
        if (!v.tok[id]) {
            snprintf(pad, sizeof pad, "[PAD%d]", id);
            rc = vocab_set(&v, id, pad, strlen(pad), TT_UNUSED);
        }
    const json_t *jm = json_object_get(model, "merges");
    const size_t n_merges = json_array_size(jm);
    merges = calloc(n_merges + 1, sizeof *merges);
    merge_len = calloc(n_merges + 1, sizeof *merge_len);
    merge_buf = calloc(n_merges + 1, sizeof *merge_buf);
    if (!merges || !merge_len || !merge_buf) rc = FERRY_ERR_NOMEM;
    size_t nm = 0;
    json_array_foreach(jm, i, val)
    {
        if (rc) break;
        if (json_is_string(val)) {
            merges[nm] = json_string_value(val);
            merge_len[nm++] = json_string_length(val);
        } else if (json_array_size(val) == 2 && json_is_string(json_array_get(val, 0)) &&
                   json_is_string(json_array_get(val, 1))) {
            /* Newer tokenizer.json files store [a, b]; GGUF keeps "a b". */
            const json_t *a = json_array_get(val, 0), *b = json_array_get(val, 1);
            const size_t la = json_string_length(a), lb = json_string_length(b);
            char *m = malloc(la + lb + 2);
            if (!m) {
                rc = FERRY_ERR_NOMEM;
                break;
            }
            memcpy(m, json_string_value(a), la);
            m[la] = ' ';
            memcpy(m + la + 1, json_string_value(b), lb);
            m[la + lb + 1] = 0;
            merge_buf[nm] = m;
            merges[nm] = m;
            merge_len[nm++] = la + lb + 1;
        }
    }
    const char *pre = pre_name(json_object_get(root, "pre_tokenizer"));
    if (!pre) {
        FLOG_WARN(
            "tokenizer.json: pre-tokenizer not recognised (llama-bpe, qwen2, smollm, gpt-2): written as "
            "\"default\"");
        pre = "default";
    }
    /* BOS added by the post-processor (TemplateProcessing "single" starting with a special token), then
     * tokenizer_config.json's tokens and flags, as ferry's own tokenizer.json reader decides them. */
    int32_t bos = -1, eos = -1, unk = -1, pad_id = -1;
    int add_bos = 0, add_eos = 0;
    const json_t *pp = json_object_get(root, "post_processor");
    const json_t *tps[8];
    int n_tp = 0;
    const char *ppt = json_string_value(json_object_get(pp, "type"));
    if (ppt && !strcmp(ppt, "TemplateProcessing")) tps[n_tp++] = pp;
    if (ppt && !strcmp(ppt, "Sequence")) json_array_foreach(json_object_get(pp, "processors"), i, val)
        {
            const char *t = json_string_value(json_object_get(val, "type"));
            if (n_tp < 8 && t && !strcmp(t, "TemplateProcessing")) tps[n_tp++] = val;
        }
    for (int j = 0; j < n_tp; j++) {
        const json_t *first = json_array_get(json_object_get(tps[j], "single"), 0);
        const char *sid = json_string_value(json_object_get(json_object_get(first, "SpecialToken"), "id"));
        for (int id = 0; sid && id < v.n; id++)
            if (!strcmp(v.tok[id], sid)) {
                bos = id;
                add_bos = 1;
                break;
            }
    }
    if (cfg) {
        int32_t id;
        if ((id = config_token(&v, cfg, "bos_token")) >= 0) bos = id;
        if ((id = config_token(&v, cfg, "eos_token")) >= 0) eos = id;
        if ((id = config_token(&v, cfg, "unk_token")) >= 0) unk = id;
        if ((id = config_token(&v, cfg, "pad_token")) >= 0) pad_id = id;
        const json_t *ab = json_object_get(cfg, "add_bos_token"), *ae = json_object_get(cfg, "add_eos_token");
        if (json_is_boolean(ab)) add_bos = json_is_true(ab);
        if (json_is_boolean(ae)) add_eos = json_is_true(ae);
    }
    if (!rc) rc = gguf_writer_kv_str(w, "tokenizer.ggml.model", "gpt2", 4, err);
    if (!rc) rc = gguf_writer_kv_str(w, "tokenizer.ggml.pre", pre, strlen(pre), err);
    if (!rc)
        rc = gguf_writer_kv_arr_str(w, "tokenizer.ggml.tokens", (const char *const *)v.tok, v.len,
                                    (uint64_t)v.n, err);
    if (!rc)
        rc = gguf_writer_kv_arr(w, "tokenizer.ggml.token_type", GGUF_TYPE_INT32, v.type, (uint64_t)v.n, err);
    if (!rc) rc = gguf_writer_kv_arr_str(w, "tokenizer.ggml.merges", merges, merge_len, nm, err);
    if (!rc && bos >= 0) rc = gguf_writer_kv_u32(w, "tokenizer.ggml.bos_token_id", (uint32_t)bos, err);
    if (!rc && eos >= 0) rc = gguf_writer_kv_u32(w, "tokenizer.ggml.eos_token_id", (uint32_t)eos, err);
    if (!rc && unk >= 0) rc = gguf_writer_kv_u32(w, "tokenizer.ggml.unknown_token_id", (uint32_t)unk, err);
    if (!rc && pad_id >= 0)
        rc = gguf_writer_kv_u32(w, "tokenizer.ggml.padding_token_id", (uint32_t)pad_id, err);
    if (!rc) rc = gguf_writer_kv_bool(w, "tokenizer.ggml.add_bos_token", add_bos, err);
    if (!rc) rc = gguf_writer_kv_bool(w, "tokenizer.ggml.add_eos_token", add_eos, err);
    if (!rc && mf->chat_template)
        rc = gguf_writer_kv_str(w, "tokenizer.chat_template", mf->chat_template, strlen(mf->chat_template),
                                err);
    if (rc == FERRY_ERR_NOMEM) ferry_fail(err, rc, "out of memory exporting the tokenizer");
    for (size_t m = 0; merge_buf && m < nm; m++) free(merge_buf[m]);
    free(merge_buf);
    free(merges);
    free(merge_len);
    vocab_free(&v);
    json_decref(cfg);
    json_decref(root);
    return rc;
}
