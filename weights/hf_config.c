/* hf_config — see hf_config.h. Every field is type- and range-checked; a wrong one is named in err. */
#include "weights/hf_config.h"

#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/core/log.h"
#include "kernels/core/status.h"
#include "weights/arch/arch.h"
#include "weights/mapfile.h"

#define HF_MAX_DIM (1 << 30) /* no sane size field is larger */

/* An integer field in 1..HF_MAX_DIM; absent or null gives def (def < 0: required). */
static int get_int(json_t *o, const char *key, int def, int *out, const char *file, char *err)
{
    json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v)) {
        if (def < 0) return ferry_fail(err, FERRY_ERR_FORMAT, "%s: missing key '%s'", file, key);
        *out = def;
        return FERRY_OK;
    }
    if (!json_is_integer(v) || json_integer_value(v) < 1 || json_integer_value(v) > HF_MAX_DIM)
        return ferry_fail(err, FERRY_ERR_FORMAT, "%s: key '%s' is not an integer in 1..%d", file, key,
                          HF_MAX_DIM);
    *out = (int)json_integer_value(v);
    return FERRY_OK;
}

/* A positive finite number (integer or real); absent or null gives def (def < 0: required). */
static int get_pos(json_t *o, const char *key, double def, float *out, const char *file, char *err)
{
    json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v)) {
        if (def < 0) return ferry_fail(err, FERRY_ERR_FORMAT, "%s: missing key '%s'", file, key);
        *out = (float)def;
        return FERRY_OK;
    }
    double d = json_is_number(v) ? json_number_value(v) : NAN;
    if (!(d > 0) || !isfinite((float)d))
        return ferry_fail(err, FERRY_ERR_FORMAT, "%s: key '%s' is not a positive number", file, key);
    *out = (float)d;
    return FERRY_OK;
}

static int get_bool(json_t *o, const char *key, int def, int *out, const char *file, char *err)
{
    json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v)) {
        *out = def;
        return FERRY_OK;
    }
    if (!json_is_boolean(v))
        return ferry_fail(err, FERRY_ERR_FORMAT, "%s: key '%s' is not a boolean", file, key);
    *out = json_is_true(v);
    return FERRY_OK;
}

static int parse_rope_scaling(json_t *rs, struct rope_scaling *out, char *err)
{
    const char *f = "config.json";
    memset(out, 0, sizeof *out);
    out->type = ROPE_SCALING_NONE;
    if (!rs || json_is_null(rs)) return FERRY_OK;
    if (!json_is_object(rs))
        return ferry_fail(err, FERRY_ERR_FORMAT, "%s: key 'rope_scaling' is not an object", f);
    json_t *t = json_object_get(rs, "rope_type");
    if (!t || json_is_null(t)) t = json_object_get(rs, "type");
    const char *ts = json_string_value(t);
    if (!ts)
        return ferry_fail(err, FERRY_ERR_FORMAT, "%s: rope_scaling has no string 'rope_type' or 'type'", f);
    int rc;
    if (strcmp(ts, "default") == 0) return FERRY_OK;
    if (strcmp(ts, "linear") == 0) {
        out->type = ROPE_SCALING_LINEAR;
        return get_pos(rs, "factor", -1, &out->factor, "config.json rope_scaling", err);
    }
    if (strcmp(ts, "llama3") == 0) {
        out->type = ROPE_SCALING_LLAMA3;
        const char *g = "config.json rope_scaling";
        if ((rc = get_pos(rs, "factor", -1, &out->factor, g, err))) return rc;
        if ((rc = get_pos(rs, "low_freq_factor", -1, &out->low_freq_factor, g, err))) return rc;
        if ((rc = get_pos(rs, "high_freq_factor", -1, &out->high_freq_factor, g, err))) return rc;
        if ((rc = get_int(rs, "original_max_position_embeddings", -1, &out->orig_ctx, g, err))) return rc;
        if (out->high_freq_factor <= out->low_freq_factor)
            return ferry_fail(err, FERRY_ERR_FORMAT,
                              "%s: llama3 high_freq_factor must exceed low_freq_factor", g);
        return FERRY_OK;
    }
    if (strcmp(ts, "yarn") == 0) { /* transformers' _compute_yarn_parameters */
        out->type = ROPE_SCALING_YARN;
        const char *g = "config.json rope_scaling";
        if ((rc = get_pos(rs, "factor", -1, &out->factor, g, err))) return rc;
        if ((rc = get_int(rs, "original_max_position_embeddings", -1, &out->orig_ctx, g, err))) return rc;
        if ((rc = get_pos(rs, "beta_fast", 32.0, &out->beta_fast, g, err))) return rc;
        if ((rc = get_pos(rs, "beta_slow", 1.0, &out->beta_slow, g, err))) return rc;
        if ((rc = get_pos(rs, "attention_factor", 0.0, &out->attn_factor, g, err))) return rc;
        if ((rc = get_bool(rs, "truncate", 1, &out->truncate, g, err))) return rc;
        /* mscale and mscale_all_dim, both set (Ministral 3: 1 and 1): the attention factor is their ratio
         * of 0.1·m·ln(factor) + 1; either one unset leaves the default, as transformers does. */
        json_t *m = json_object_get(rs, "mscale"), *ma = json_object_get(rs, "mscale_all_dim");
        const double ms = json_is_number(m) ? json_number_value(m) : 0,
                     msa = json_is_number(ma) ? json_number_value(ma) : 0;
        if ((m && !json_is_null(m) && !json_is_number(m)) ||
            (ma && !json_is_null(ma) && !json_is_number(ma)) || !(fabs(ms) < 1e6) || !(fabs(msa) < 1e6))
            return ferry_fail(err, FERRY_ERR_FORMAT, "%s: mscale and mscale_all_dim must be numbers", g);
        if (ms != 0 && msa != 0 && out->attn_factor == 0) {
            out->attn_factor =
                (float)(rope_yarn_mscale(out->factor, ms) / rope_yarn_mscale(out->factor, msa));
            if (!(out->attn_factor > 0) || !isfinite(out->attn_factor))
                return ferry_fail(err, FERRY_ERR_FORMAT, "%s: mscale %g / mscale_all_dim %g", g, ms, msa);
            if (ms == 1) out->yarn_log_mul = (float)msa; /* what llama.cpp's converter writes */
        }
        return FERRY_OK;
    }
    if (strcmp(ts, "longrope") == 0 || strcmp(ts, "su") == 0) {
        out->type = ROPE_SCALING_LONGROPE;
        return FERRY_OK; /* its fields: parse_longrope, once max_position_embeddings is known */
    }
    return ferry_fail(err, FERRY_ERR_UNSUPPORTED,
                      "%s: rope_scaling type '%.40s' is not supported (llama3, linear, yarn, longrope)", f,
                      ts);
}

/* One LongRoPE factor list: numbers > 0, at most ROPE_MAX_FACTORS, of the same length as *n when *n > 0. */
static int longrope_list(json_t *rs, const char *key, float *out, int *n, char *err)
{
    json_t *a = json_object_get(rs, key);
    const size_t len = json_array_size(a);
    if (!json_is_array(a) || len < 1 || len > ROPE_MAX_FACTORS || (*n > 0 && (int)len != *n))
        return ferry_fail(
            err, FERRY_ERR_FORMAT,
            "config.json rope_scaling: '%s' must be a list of 1..%d numbers (as long as the other)", key,
            ROPE_MAX_FACTORS);
    for (size_t i = 0; i < len; i++) {
        json_t *v = json_array_get(a, i);
        const double d = json_is_number(v) ? json_number_value(v) : NAN;
        if (!(d > 0) || !isfinite((float)d))
            return ferry_fail(err, FERRY_ERR_FORMAT,
                              "config.json rope_scaling: %s[%zu] is not a positive number", key, i);
        out[i] = (float)d;
    }
    *n = (int)len;
    return FERRY_OK;
}

/* LongRoPE as transformers reads it (_compute_longrope_parameters): short_factor and long_factor; the
 * original context from the top-level original_max_position_embeddings (Phi-3's place, which wins) or
 * rope_scaling's; factor, else max_position_embeddings / original; attention_factor, else
 * sqrt(1 + ln(factor) / ln(original)) (1 when factor <= 1). The list lengths are checked against the rotary
 * dims at validation (the family may set partial rotary after this). */
static int parse_longrope(json_t *root, json_t *rs, struct llm_hparams *hp, char *err)
{
    struct rope_scaling *sc = &hp->rope_scaling;
    const char *g = "config.json rope_scaling";
    int rc;
    sc->n_factors = 0;
    if ((rc = longrope_list(rs, "short_factor", sc->short_factor, &sc->n_factors, err))) return rc;
    if ((rc = longrope_list(rs, "long_factor", sc->long_factor, &sc->n_factors, err))) return rc;
    json_t *top = json_object_get(root, "original_max_position_embeddings");
    if (top && !json_is_null(top)) {
        if ((rc = get_int(root, "original_max_position_embeddings", -1, &sc->orig_ctx, "config.json", err)))
            return rc;
    } else if ((rc = get_int(rs, "original_max_position_embeddings", hp->ctx_train, &sc->orig_ctx, g, err))) {
        return rc;
    }
    if ((rc = get_pos(rs, "factor", (double)hp->ctx_train / sc->orig_ctx, &sc->factor, g, err))) return rc;
    return get_pos(rs, "attention_factor", rope_longrope_attn_factor(sc->factor, sc->orig_ctx),
                   &sc->attn_factor, g, err);
}

int hf_config_parse(const char *json, size_t len, struct llm_hparams *hp, char err[256])
{
    const char *f = "config.json";
    memset(hp, 0, sizeof *hp);
    json_error_t je;
    json_t *root = json_loadb(json, len, JSON_REJECT_DUPLICATES, &je);
    if (!root) return ferry_fail(err, FERRY_ERR_FORMAT, "%s at offset %d: %.150s", f, je.position, je.text);
    int rc = FERRY_OK;
    if (!json_is_object(root)) {
        rc = ferry_fail(err, FERRY_ERR_FORMAT, "%s: not a JSON object", f);
        goto out;
    }

    /* The architecture: architectures[0], else model_type. */
    json_t *ja = json_object_get(root, "architectures");
    const char *cls = json_is_array(ja) ? json_string_value(json_array_get(ja, 0)) : NULL;
    const char *mt = json_string_value(json_object_get(root, "model_type"));
    const struct arch_family *fam = arch_find_hf(cls, mt);
    if (!fam) {
        char list[200];
        rc = ferry_fail(err, FERRY_ERR_UNSUPPORTED, "%s: architecture '%.60s' is not supported (%s)", f,
                        cls  ? cls
                        : mt ? mt
                             : "(none)",
                        arch_supported(1, list, sizeof list));
        goto out;
    }
    hp->family = fam;
    snprintf(hp->arch, sizeof hp->arch, "%s", fam->hf_types[0]);

    /* A multimodal model (Qwen3_5ForConditionalGeneration) keeps its language model's fields in text_config.
     */
    json_t *cfg = json_object_get(root, "text_config");
    if (!json_is_object(cfg)) cfg = root;
    if ((rc = get_int(cfg, "hidden_size", -1, &hp->dim, f, err))) goto out;
    /* MoE families whose FFNs are all experts may have none (their hf_hparams sets ffn_dim). */
    if ((rc = get_int(cfg, "intermediate_size", fam->gguf_ffn_optional ? 0 : -1, &hp->ffn_dim, f, err)))
        goto out;
    if ((rc = get_int(cfg, "num_hidden_layers", -1, &hp->n_layers, f, err))) goto out;
    if ((rc = get_int(cfg, "num_attention_heads", -1, &hp->n_heads, f, err))) goto out;
    if ((rc = get_int(cfg, "num_key_value_heads", hp->n_heads, &hp->n_kv_heads, f, err))) goto out;
    if ((rc = get_int(cfg, "head_dim", hp->dim / hp->n_heads > 0 ? hp->dim / hp->n_heads : 1, &hp->head_dim,
                      f, err)))
        goto out;
    if ((rc = get_int(cfg, "vocab_size", -1, &hp->n_vocab, f, err))) goto out;
    if ((rc = get_int(cfg, "max_position_embeddings", 2048, &hp->ctx_train, f, err))) goto out;
    if ((rc = get_pos(cfg, "rms_norm_eps", 1e-6, &hp->norm_eps, f, err))) goto out;
    /* transformers >= 5 writes rope_parameters {rope_type, rope_theta, factor, ...} instead of top-level
     * rope_theta and rope_scaling; the top-level keys win when both are present. */
    json_t *rp = json_object_get(cfg, "rope_parameters");
    if (rp && !json_is_null(rp) && !json_is_object(rp)) {
        rc = ferry_fail(err, FERRY_ERR_FORMAT, "%s: key 'rope_parameters' is not an object", f);
        goto out;
    }
    /* Per layer kind ({"full_attention": {...}, "sliding_attention": {...}}): the global layers' here, the
     * local layers' read by the family. */
    if (json_is_object(json_object_get(rp, "full_attention"))) rp = json_object_get(rp, "full_attention");
    json_t *jt = json_object_get(cfg, "rope_theta");
    if ((!jt || json_is_null(jt)) && json_is_object(rp)) {
        if ((rc = get_pos(rp, "rope_theta", 10000.0, &hp->rope_theta, "config.json rope_parameters", err)))
            goto out;
    } else if ((rc = get_pos(cfg, "rope_theta", 10000.0, &hp->rope_theta, f, err))) {
        goto out;
    }
    /* A composite model's tie_word_embeddings is its own (top level), else its text part's. */
    json_t *tie = json_object_get(cfg, "tie_word_embeddings");
    if ((rc = get_bool(tie && !json_is_null(tie) ? root : cfg, "tie_word_embeddings", 0, &hp->tied_embeddings,
                       f, err)))
        goto out;
    json_t *rs = json_object_get(cfg, "rope_scaling");
    if ((!rs || json_is_null(rs)) && json_is_object(rp)) rs = rp;
    if ((rc = parse_rope_scaling(rs, &hp->rope_scaling, err))) goto out;
    if (hp->rope_scaling.type == ROPE_SCALING_LONGROPE && (rc = parse_longrope(cfg, rs, hp, err))) goto out;
    hp->rope_dim = hp->head_dim;
    hp->rope_style = ROPE_STYLE_HALF;
    hp->qkv_bias = fam->hf_qkv_bias;

    int ab = 0, mb = 0;
    if ((rc = get_bool(cfg, "attention_bias", 0, &ab, f, err))) goto out;
    if ((rc = get_bool(cfg, "mlp_bias", 0, &mb, f, err))) goto out;
    if ((ab && !fam->hf_attention_bias) || mb) {
        rc = ferry_fail(err, FERRY_ERR_UNSUPPORTED, "%s: %s is not supported", f,
                        ab ? "attention_bias" : "mlp_bias");
        goto out;
    }
    const char *want_act = fam->hf_act ? fam->hf_act : "silu";
    static const char *const act_keys[] = {"hidden_act", "hidden_activation"};
    for (int i = 0; i < 2; i++) {
        json_t *hact = json_object_get(cfg, act_keys[i]);
        if (hact && json_is_string(hact) && strcmp(json_string_value(hact), want_act) != 0) {
            rc = ferry_fail(err, FERRY_ERR_UNSUPPORTED, "%s: %s '%.40s' is not supported (%s)", f,
                            act_keys[i], json_string_value(hact), want_act);
            goto out;
        }
    }
    int sw = 0;
    if ((rc = get_bool(cfg, "use_sliding_window", 0, &sw, f, err))) goto out;
    if (sw) FLOG_WARN("%s: use_sliding_window is set; ferry attends to the full context", f);
    json_t *swin = json_object_get(cfg, "sliding_window");
    if (fam->hf_window_warn && json_is_integer(swin) && json_integer_value(swin) < hp->ctx_train)
        FLOG_WARN("%s: sliding_window %lld is ignored; ferry attends to the full context", f,
                  (long long)json_integer_value(swin));
    if (fam->hf_hparams) rc = fam->hf_hparams(cfg, hp, err);
out:
    json_decref(root);
    return rc;
}

static int join(char *buf, size_t n, const char *dir, const char *name, char *err)
{
    if ((size_t)snprintf(buf, n, "%s/%s", dir, name) >= n)
        return ferry_fail(err, FERRY_ERR_INVALID, "path too long: %.100s/%s", dir, name);
    return FERRY_OK;
}

int hf_config_load(const char *dir, struct llm_hparams *hp, char err[256])
{
    char path[4096];
    int rc = join(path, sizeof path, dir, "config.json", err);
    if (rc) return rc;
    char *buf;
    size_t len;
    if ((rc = mapfile_read_small(path, HF_MAX_JSON, &buf, &len, err))) return rc;
    rc = hf_config_parse(buf, len, hp, err);
    free(buf);
    return rc;
}

int hf_chat_template_parse(const char *json, size_t len, char **out, char err[256])
{
    *out = NULL;
    json_error_t je;
    json_t *root = json_loadb(json, len, JSON_REJECT_DUPLICATES, &je);
    if (!root)
        return ferry_fail(err, FERRY_ERR_FORMAT, "tokenizer_config.json at offset %d: %.150s", je.position,
                          je.text);
    int rc = FERRY_OK;
    json_t *ct = json_is_object(root) ? json_object_get(root, "chat_template") : NULL;
    const char *tpl = NULL;
    if (json_is_string(ct)) {
        tpl = json_string_value(ct);
    } else if (json_is_array(ct)) {
        size_t i;
        json_t *e;
        json_array_foreach(ct, i, e)
        {
            const char *name = json_string_value(json_object_get(e, "name"));
            if (name && strcmp(name, "default") == 0) tpl = json_string_value(json_object_get(e, "template"));
        }
        if (!tpl) FLOG_WARN("tokenizer_config.json: chat_template list has no \"default\" entry");
    } else if (ct && !json_is_null(ct)) {
        rc = ferry_fail(err, FERRY_ERR_FORMAT,
                        "tokenizer_config.json: chat_template is neither a string nor a list");
    }
    if (tpl && !(*out = strdup(tpl))) rc = ferry_fail(err, FERRY_ERR_NOMEM, "out of memory");
    json_decref(root);
    return rc;
}

int hf_chat_template_load(const char *dir, char **out, char err[256])
{
    *out = NULL;
    char path[4096];
    int rc = join(path, sizeof path, dir, "tokenizer_config.json", err);
    if (rc) return rc;
    char *buf;
    size_t len;
    rc = mapfile_read_small(path, HF_MAX_JSON, &buf, &len, err);
    if (rc == FERRY_OK) {
        rc = hf_chat_template_parse(buf, len, out, err);
        free(buf);
        if (rc || *out) return rc;
    } else if (rc != FERRY_ERR_NOT_FOUND) {
        return rc;
    }
    if ((rc = join(path, sizeof path, dir, "chat_template.jinja", err))) return rc;
    rc = mapfile_read_small(path, HF_MAX_JSON, &buf, &len, err);
    if (rc == FERRY_ERR_NOT_FOUND) return FERRY_OK;
    if (rc) return rc;
    if (strlen(buf) != len) {
        free(buf);
        return ferry_fail(err, FERRY_ERR_FORMAT, "chat_template.jinja: contains a NUL byte");
    }
    *out = buf;
    return FERRY_OK;
}
