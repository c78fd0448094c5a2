/* model_file — one opened model, GGUF file or Hugging Face directory, under GGUF tensor names (see
 * model_file.h).
 *
 * GGUF: hyperparameters from {arch}.* keys, tensors as they are. HF: hyperparameters from config.json,
 * tensors from model.safetensors or the shards named by model.safetensors.index.json, renamed to GGUF names
 * and with shapes reversed (HF [out, in] is ne = {in, out}). Both end in model_file_validate, so a model that
 * opens has every tensor the forward pass reads, with the right shape.
 */
#include "weights/model_file.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "kernels/core/log.h"
#include "kernels/core/status.h"
#include "weights/arch/arch.h"
#include "weights/gguf.h"
#include "weights/gguf_split.h"
#include "weights/hf_config.h"
#include "weights/mapfile.h"
#include "weights/safetensors.h"

#define PROGRESS_STEP (64ull << 20) /* bytes between progress reports */
#define MAX_LAYERS    4096
#define MAX_EXPERTS   1024

struct mf_priv {
    int n_st;
    struct safetensors **st;  /* (n_st) HF shards */
    void *experts;            /* HF only: the experts' matrices stacked per layer (stack_experts), or NULL */
    struct gguf_split *split; /* GGUF only: shards 2..N of a split model, or NULL for one file */
};

static const char *base_name(const char *path)
{
    const char *b = strrchr(path, '/');
    return b && b[1] ? b + 1 : path;
}

/* Reports mapping progress every PROGRESS_STEP bytes of registered tensors, and once at the end. */
struct progress {
    model_file_progress_fn fn;
    void *user;
    uint64_t done, total, next;
};
static void progress_add(struct progress *p, uint64_t n)
{
    p->done += n;
    if (p->fn && p->done >= p->next) {
        p->fn(p->done, p->total, p->user);
        while (p->next <= p->done) p->next += PROGRESS_STEP;
    }
}

float llm_attn_scale(const struct llm_hparams *hp)
{
    const float s = hp->attn_scale > 0 ? hp->attn_scale : 1.0f / sqrtf((float)hp->head_dim);
    if (hp->rope_dim != hp->head_dim) return s; /* llm_rope_q_scale carries it */
    /* transformers scales cos and sin by it, so q and k each carry it into the scores. */
    const float m = rope_scaling_attn_factor(&hp->rope_scaling);
    return s * m * m;
}

float llm_rope_q_scale(const struct llm_hparams *hp)
{
    const float m = rope_scaling_attn_factor(&hp->rope_scaling);
    return hp->rope_dim != hp->head_dim ? m * m : 1.0f;
}

const struct wtensor *model_file_tensor(const struct model_file *mf, const char *name)
{
    for (int i = 0; i < mf->n_tensors; i++)
        if (strcmp(mf->tensors[i].name, name) == 0) return &mf->tensors[i];
    return NULL;
}

/* ---------------------------------------------------------------- GGUF */

/* A positive u32 hyperparameter {arch}.{key}; def < 0 means required. A per-layer array of integers
 * (llama.cpp writes head_count_kv so when layers differ) gives its first layer's; when its layers differ the
 * status is FERRY_ERR_RANGE (with *out set): only a family that reads the array itself (gguf_layer_arrays)
 * goes on. */
static int gguf_hp(const struct gguf *g, const char *arch, const char *key, int def, int *out, char *err)
{
    char k[96];
    snprintf(k, sizeof k, "%s.%s", arch, key);
    uint32_t v;
    int rc = gguf_get_u32(g, k, &v);
    enum gguf_vtype et;
    uint64_t na;
    int32_t *arr;
    if (rc && rc != FERRY_ERR_NOT_FOUND && gguf_get_arr(g, k, &et, &na) == FERRY_OK && na > 0 &&
        na <= MAX_LAYERS && (arr = malloc(na * sizeof *arr))) {
        int same = 1;
        if (gguf_arr_i32(g, k, arr, na) == FERRY_OK) {
            rc = FERRY_OK, v = arr[0] < 0 ? 0 : (uint32_t)arr[0];
            for (uint64_t i = 1; i < na; i++) same &= arr[i] == arr[0];
        }
        free(arr);
        if (!rc && !same && v >= 1 && v <= (1u << 30)) {
            *out = (int)v;
            return ferry_fail(err, FERRY_ERR_RANGE, "key '%s' differs between layers", k);
        }
    }
    if (rc == FERRY_ERR_NOT_FOUND && def >= 0) {
        *out = def;
        return FERRY_OK;
    }
    if (rc == FERRY_ERR_NOT_FOUND) return ferry_fail(err, FERRY_ERR_FORMAT, "missing key '%s'", k);
    if (rc || v < 1 || v > (1u << 30))
        return ferry_fail(err, FERRY_ERR_FORMAT, "key '%s' is not an integer in 1..2^30 (type %d)", k,
                          (int)gguf_kv_type(g, gguf_find_key(g, k)));
    *out = (int)v;
    return FERRY_OK;
}

static int gguf_hp_f(const struct gguf *g, const char *arch, const char *key, float def, float *out,
                     char *err)
{
    char k[96];
    snprintf(k, sizeof k, "%s.%s", arch, key);
    int rc = gguf_get_f32(g, k, out);
    if (rc == FERRY_ERR_NOT_FOUND && def >= 0) {
        *out = def;
        return FERRY_OK;
    }
    if (rc == FERRY_ERR_NOT_FOUND) return ferry_fail(err, FERRY_ERR_FORMAT, "missing key '%s'", k);
    if (rc || !(*out > 0) || *out > 1e30f)
        return ferry_fail(err, FERRY_ERR_FORMAT, "key '%s' is not a positive number", k);
    return FERRY_OK;
}

/* YaRN as llama.cpp's converter writes it: rope.scaling.factor and original_context_length, and when the
 * checkpoint set them yarn_beta_fast, yarn_beta_slow, yarn_attn_factor. GGUF has no key for transformers'
 * truncate: its default (true) here, a family may say otherwise. DeepSeek's yarn_log_multiplier is refused.
 */
static int gguf_yarn(const struct gguf *g, const char *a, struct rope_scaling *sc, char *err)
{
    int rc;
    sc->type = ROPE_SCALING_YARN;
    sc->truncate = 1;
    if ((rc = gguf_hp_f(g, a, "rope.scaling.factor", -1, &sc->factor, err))) return rc;
    if ((rc = gguf_hp(g, a, "rope.scaling.original_context_length", -1, &sc->orig_ctx, err))) return rc;
    if ((rc = gguf_hp_f(g, a, "rope.scaling.yarn_beta_fast", 32.0f, &sc->beta_fast, err))) return rc;
    if ((rc = gguf_hp_f(g, a, "rope.scaling.yarn_beta_slow", 1.0f, &sc->beta_slow, err))) return rc;
    if ((rc = gguf_hp_f(g, a, "rope.scaling.yarn_attn_factor", 0.0f, &sc->attn_factor, err))) return rc;
    /* The log multiplier (transformers' mscale_all_dim, mscale 1; Ministral 3): without an attention factor
     * of its own the file's is (0.1 ln f + 1) / (0.1 m ln f + 1), as llama.cpp derives it. */
    float lm = 0;
    char k[96];
    snprintf(k, sizeof k, "%s.rope.scaling.yarn_log_multiplier", a);
    if (gguf_get_f32(g, k, &lm) == FERRY_OK && lm != 0.0f) {
        if (!(fabsf(lm) < 1e6f)) return ferry_fail(err, FERRY_ERR_FORMAT, "key '%s' is out of range", k);
        sc->yarn_log_mul = lm;
        if (sc->attn_factor == 0)
            sc->attn_factor = (float)(rope_yarn_mscale(sc->factor, 1) / rope_yarn_mscale(sc->factor, lm));
    }
    return FERRY_OK;
}

/* LongRoPE as llama.cpp's converter writes it (Phi-3.5, Phi-4-mini): the F32 tensors
 * rope_factors_short.weight and rope_factors_long.weight (rope_dim / 2 each),
 * rope.scaling.original_context_length and rope.scaling.attn_factor (no rope.scaling.type); without the
 * attention factor, transformers' default. */
static int gguf_longrope(struct model_file *mf, char *err)
{
    struct llm_hparams *hp = &mf->hp;
    struct rope_scaling *sc = &hp->rope_scaling;
    const struct wtensor *ts = model_file_tensor(mf, "rope_factors_short.weight"),
                         *tl = model_file_tensor(mf, "rope_factors_long.weight");
    if (!tl) return FERRY_OK;
    if (sc->type != ROPE_SCALING_NONE || model_file_tensor(mf, "rope_freqs.weight"))
        return ferry_fail(err, FERRY_ERR_UNSUPPORTED, "LongRoPE factors with another rope scaling");
    if (!ts || ts->type != DTYPE_F32 || tl->type != DTYPE_F32 || ts->ne[0] != tl->ne[0] || tl->ne[0] < 1 ||
        tl->ne[0] > ROPE_MAX_FACTORS || ts->n_dims != 1 || tl->n_dims != 1)
        return ferry_fail(
            err, FERRY_ERR_FORMAT,
            "tensors 'rope_factors_short.weight' and 'rope_factors_long.weight' must both be F32 "
            "vectors of 1..%d factors",
            ROPE_MAX_FACTORS);
    sc->type = ROPE_SCALING_LONGROPE;
    sc->n_factors = (int)tl->ne[0];
    memcpy(sc->short_factor, ts->data, (size_t)sc->n_factors * sizeof(float));
    memcpy(sc->long_factor, tl->data, (size_t)sc->n_factors * sizeof(float));
    if (sc->orig_ctx < 1) sc->orig_ctx = hp->ctx_train;
    sc->factor = (float)hp->ctx_train / (float)sc->orig_ctx;
    return gguf_hp_f(mf->gguf, hp->arch, "rope.scaling.attn_factor",
                     (float)rope_longrope_attn_factor(sc->factor, sc->orig_ctx), &sc->attn_factor, err);
}

/* Fills mf from mf->gguf, already opened. */
static int from_gguf(struct model_file *mf, struct progress *pr, char *err)
{
    int rc;
    const struct gguf *g = mf->gguf;
    const struct gguf_split *split = ((struct mf_priv *)mf->priv)->split;
    uint32_t n_split = 0;
    if (!split && gguf_get_u32(g, "split.count", &n_split) == FERRY_OK && n_split > 1)
        return ferry_fail(err, FERRY_ERR_UNSUPPORTED, "one shard of %u: open the model from its first file",
                          n_split);
    mf->file_bytes = gguf_file_size(g);
    for (int f = 1; f < gguf_split_n(split); f++)
        mf->file_bytes += gguf_file_size(gguf_split_shard(split, f));
    struct llm_hparams *hp = &mf->hp;

    struct gguf_str s;
    rc = gguf_get_str(g, "general.architecture", &s);
    if (rc)
        return ferry_fail(err, FERRY_ERR_FORMAT, "key 'general.architecture' is %s",
                          rc == FERRY_ERR_NOT_FOUND ? "missing" : "not a string");
    hp->family = arch_find_gguf(s.ptr, s.len);
    if (hp->family && hp->family->gguf_experts && s.len < 64) { /* e.g. Mixtral: "llama" with experts */
        char k[96];
        uint32_t ne = 0;
        snprintf(k, sizeof k, "%.*s.expert_count", (int)s.len, s.ptr);
        if (gguf_get_u32(g, k, &ne) == FERRY_OK && ne > 0) hp->family = hp->family->gguf_experts;
    }
    if (!hp->family || s.len >= sizeof hp->arch) {
        char name[48], list[160];
        size_t n = s.len < sizeof name - 1 ? s.len : sizeof name - 1;
        for (size_t i = 0; i < n; i++) name[i] = s.ptr[i] < 0x20 || s.ptr[i] >= 0x7f ? '?' : s.ptr[i];
        name[n] = '\0';
        return ferry_fail(err, FERRY_ERR_UNSUPPORTED, "architecture '%s' is not supported (%s)", name,
                          arch_supported(0, list, sizeof list));
    }
    memcpy(hp->arch, s.ptr, s.len);
    hp->arch[s.len] = '\0';
    const char *a = hp->arch;
    if ((rc = gguf_hp(g, a, "context_length", -1, &hp->ctx_train, err))) return rc;
    if ((rc = gguf_hp(g, a, "embedding_length", -1, &hp->dim, err))) return rc;
    rc = gguf_hp(g, a, "feed_forward_length", hp->family->gguf_ffn_optional ? 0 : -1, &hp->ffn_dim, err);
    if (rc && !(rc == FERRY_ERR_RANGE && hp->family->gguf_layer_arrays)) return rc;
    if ((rc = gguf_hp(g, a, "block_count", -1, &hp->n_layers, err))) return rc;
    if ((rc = gguf_hp(g, a, "attention.head_count", -1, &hp->n_heads, err))) return rc;
    rc = gguf_hp(g, a, "attention.head_count_kv", hp->n_heads, &hp->n_kv_heads, err);
    if (rc && !(rc == FERRY_ERR_RANGE && hp->family->gguf_layer_arrays)) return rc;
    if ((rc = gguf_hp(g, a, "attention.key_length", hp->dim / hp->n_heads, &hp->head_dim, err))) return rc;
    if ((rc = gguf_hp(g, a, "rope.dimension_count", hp->head_dim, &hp->rope_dim, err))) return rc;
    if ((rc = gguf_hp_f(g, a, "attention.layer_norm_rms_epsilon", -1, &hp->norm_eps, err))) return rc;
    if ((rc = gguf_hp_f(g, a, "rope.freq_base", 10000.0f, &hp->rope_theta, err))) return rc;
    hp->rope_style = hp->family->gguf_rope;

    /* Rope scaling: rope.scaling.type (+ factor), or the older rope.scale_linear. */
    char k[96];
    hp->rope_scaling.type = ROPE_SCALING_NONE;
    snprintf(k, sizeof k, "%s.rope.scaling.type", a);
    rc = gguf_get_str(g, k, &s);
    if (rc == FERRY_OK) {
        if (s.len == 6 && memcmp(s.ptr, "linear", 6) == 0) {
            hp->rope_scaling.type = ROPE_SCALING_LINEAR;
            if ((rc = gguf_hp_f(g, a, "rope.scaling.factor", -1, &hp->rope_scaling.factor, err))) return rc;
        } else if (s.len == 4 && memcmp(s.ptr, "yarn", 4) == 0) {
            if ((rc = gguf_yarn(g, a, &hp->rope_scaling, err))) return rc;
        } else if (!(s.len == 4 && memcmp(s.ptr, "none", 4) == 0)) {
            return ferry_fail(err, FERRY_ERR_UNSUPPORTED,
                              "key '%s': rope scaling '%.*s' is not supported (none, linear, yarn)", k,
                              (int)(s.len < 32 ? s.len : 32), s.ptr);
        }
    } else if (rc != FERRY_ERR_NOT_FOUND) {
        return ferry_fail(err, FERRY_ERR_FORMAT, "key '%s' is not a string", k);
    } else {
        float f = 0;
        if ((rc = gguf_hp_f(g, a, "rope.scale_linear", 0.0f, &f, err))) return rc;
        if (f > 0 && f != 1.0f) {
            hp->rope_scaling.type = ROPE_SCALING_LINEAR;
            hp->rope_scaling.factor = f;
        }
    }
    snprintf(k, sizeof k, "%s.rope.scaling.original_context_length", a);
    uint32_t oc;
    if (gguf_get_u32(g, k, &oc) == FERRY_OK && oc <= (1u << 30)) hp->rope_scaling.orig_ctx = (int)oc;
    if (hp->family->gguf_hparams && (rc = hp->family->gguf_hparams(g, hp, err))) return rc;

    /* Tensors, names as they are (the reader bounds them to 95 bytes), of every shard in order. */
    long long n_all = 0;
    for (int f = 0; f < gguf_split_n(split); f++) n_all += gguf_n_tensors(f ? gguf_split_shard(split, f) : g);
    if (n_all > INT32_MAX) return ferry_fail(err, FERRY_ERR_FORMAT, "%lld tensors", n_all);
    const int n = (int)n_all;
    mf->tensors = calloc(n ? (size_t)n : 1, sizeof *mf->tensors);
    if (!mf->tensors) return ferry_fail(err, FERRY_ERR_NOMEM, "out of memory for %d tensors", n);
    for (int i = 0, f = 0, fi = 0; i < n; i++, fi++) {
        while (fi >= gguf_n_tensors(f ? gguf_split_shard(split, f) : g)) f++, fi = 0;
        const struct gguf_tensor_info *ti = gguf_tensor(f ? gguf_split_shard(split, f) : g, fi);
        struct wtensor *w = &mf->tensors[i];
        pr->total += ti->nbytes;
        memcpy(w->name, ti->name.ptr, ti->name.len);
        w->name[ti->name.len] = '\0';
        w->type = ti->type;
        w->n_dims = ti->n_dims;
        memcpy(w->ne, ti->ne, sizeof w->ne);
        w->data = ti->data;
        w->nbytes = ti->nbytes;
    }
    mf->n_tensors = n;
    for (int i = 0; i < n; i++) progress_add(pr, mf->tensors[i].nbytes);

    const struct wtensor *te = model_file_tensor(mf, "token_embd.weight");
    if (!te) return ferry_fail(err, FERRY_ERR_FORMAT, "missing tensor 'token_embd.weight'");
    if (te->ne[1] > (1 << 30))
        return ferry_fail(err, FERRY_ERR_FORMAT, "tensor 'token_embd.weight': absurd vocab size");
    hp->n_vocab = (int)te->ne[1];
    hp->tied_embeddings = model_file_tensor(mf, "output.weight") == NULL;
    hp->qkv_bias = model_file_tensor(mf, "blk.0.attn_q.bias") != NULL;
    if ((rc = gguf_longrope(mf, err))) return rc;

    if (gguf_get_str(g, "tokenizer.chat_template", &s) == FERRY_OK) {
        if (memchr(s.ptr, '\0', s.len))
            return ferry_fail(err, FERRY_ERR_FORMAT, "key 'tokenizer.chat_template' has a NUL");
        mf->chat_template = strndup(s.ptr, s.len);
        if (!mf->chat_template) return ferry_fail(err, FERRY_ERR_NOMEM, "out of memory");
    }
    return FERRY_OK;
}

/* ---------------------------------------------------------------- Hugging Face */

/* HF name -> GGUF name under the family's tensor list; 0 when it maps, -1 for names ferry does not use. */
static int hf_map_name(const struct arch_family *fam, const char *hf, char out[96])
{
    /* A multimodal checkpoint's language model (model.language_model.*): named as a text model's. */
    static const char lm[] = "model.language_model.";
    if (!strncmp(hf, lm, sizeof lm - 1)) {
        char text[160];
        if ((size_t)snprintf(text, sizeof text, "model.%s", hf + sizeof lm - 1) >= sizeof text) return -1;
        return hf_map_name(fam, text, out);
    }
    for (int i = 0; i < arch_n_globals; i++)
        if (strcmp(hf, arch_globals[i].hf) == 0) return snprintf(out, 96, "%s", arch_globals[i].gguf), 0;
    const char *p = "model.layers.";
    if (strncmp(hf, p, strlen(p)) != 0) return -1;
    const char *d = hf + strlen(p);
    int nd = 0, li = 0;
    while (d[nd] >= '0' && d[nd] <= '9' && nd < 5) li = li * 10 + (d[nd++] - '0');
    if (nd == 0 || d[nd] != '.' || (nd > 1 && d[0] == '0') || li >= MAX_LAYERS) return -1;
    const char *rest = d + nd + 1;
    for (int i = 0; i < fam->n_tensors; i++) {
        const char *hf_name = fam->tensors[i].hf, *star = strchr(hf_name, '*');
        if (!star) {
            if (strcmp(rest, hf_name) == 0)
                return snprintf(out, 96, "blk.%d.%s", li, fam->tensors[i].gguf), 0;
            continue;
        }
        /* One expert's matrix: "<gguf name>#E" until stack_experts stacks the layer's experts. */
        const size_t pre = (size_t)(star - hf_name);
        if (strncmp(rest, hf_name, pre) != 0) continue;
        /* transformers 5's fused experts under the same prefix: down_proj (E, dim, ffn) is the stacked
         * tensor as GGUF has it; gate_up_proj (E, 2 ffn, dim) stays "<gate's gguf name>#gate_up" until
         * stack_experts splits it. */
        const enum arch_role role = fam->tensors[i].role;
        if ((role == ARCH_ROLE_EXP_DOWN && !strcmp(rest + pre, "down_proj")) ||
            (role == ARCH_ROLE_EXP_GATE && !strcmp(rest + pre, "gate_up_proj")))
            return snprintf(out, 96, "blk.%d.%s%s", li, fam->tensors[i].gguf,
                            role == ARCH_ROLE_EXP_GATE ? "#gate_up" : ""),
                   0;
        int ne = 0, ei = 0;
        while (rest[pre + ne] >= '0' && rest[pre + ne] <= '9' && ne < 5)
            ei = ei * 10 + (rest[pre + ne++] - '0');
        if (ne == 0 || (ne > 1 && rest[pre] == '0') || strcmp(rest + pre + ne, star + 1) != 0) continue;
        return snprintf(out, 96, "blk.%d.%s#%d", li, fam->tensors[i].gguf, ei), 0;
    }
    return -1;
}

/* The per-expert matrices of an HF checkpoint ("blk.N.ffn_gate_exps.weight#E") as the stacked tensors
 * GGUF files have ("blk.N.ffn_gate_exps.weight", ne {cols, rows, n_expert}), copied into one owned
 * buffer; the per-expert entries leave the tensor list. Every expert of a layer must be present with the
 * shape and type of the first. */
static int stack_experts(struct model_file *mf, char *err)
{
    const struct llm_hparams *hp = &mf->hp;
    const struct arch_family *fam = hp->family;
    struct mf_priv *pv = mf->priv;
    size_t bytes = 0;
    int n_stacked = 0;
    char name[96];
    for (int pass = 0; pass < 2; pass++) {
        char *dst = pv->experts;
        for (int l = 0; l < hp->n_layers; l++) {
            for (int i = 0; i < fam->n_tensors; i++) {
                const struct arch_tensor *at = &fam->tensors[i];
                if (!strchr(at->hf, '*')) continue;
                long long ne[3];
                arch_role_shape(at->role, hp, ne);
                snprintf(name, sizeof name, "blk.%d.%s", l, at->gguf);
                const struct wtensor *whole = model_file_tensor(mf, name);
                const struct arch_tensor *gt = arch_tensor_of(fam, ARCH_ROLE_EXP_GATE);
                snprintf(name, sizeof name, "blk.%d.%s#gate_up", l, gt ? gt->gguf : "");
                const struct wtensor *gu = model_file_tensor(mf, name);
                if (pass == 1 && whole) continue; /* a fused down_proj, checked in pass 0 */
                if (whole || (gu && (at->role == ARCH_ROLE_EXP_GATE || at->role == ARCH_ROLE_EXP_UP))) {
                    /* Fused: down_proj as it is, gate and up the halves of each expert's gate_up_proj. */
                    const struct wtensor *f = whole ? whole : gu;
                    const long long rows = whole ? ne[1] : 2 * ne[1];
                    if (f->ne[0] != ne[0] || f->ne[1] != rows || f->ne[2] != ne[2] || f->ne[3] != 1)
                        return ferry_fail(
                            err, FERRY_ERR_FORMAT,
                            "tensor 'model.layers.%d.mlp.experts.%s' has ne [%lld, %lld, %lld], "
                            "expected [%lld, %lld, %lld]",
                            l, whole ? "down_proj" : "gate_up_proj", (long long)f->ne[0], (long long)f->ne[1],
                            (long long)f->ne[2], ne[0], rows, ne[2]);
                    if (whole) continue;
                    const size_t half = f->nbytes / 2 / (size_t)hp->n_expert; /* one expert's gate or up */
                    if (pass == 0) {
                        bytes += half * (size_t)hp->n_expert, n_stacked++;
                        continue;
                    }
                    for (int e = 0; e < hp->n_expert; e++, dst += half)
                        memcpy(dst,
                               (const char *)f->data +
                                   (2 * (size_t)e + (at->role == ARCH_ROLE_EXP_UP)) * half,
                               half);
                    struct wtensor *w = &mf->tensors[mf->n_tensors++];
                    *w = *f;
                    snprintf(w->name, sizeof w->name, "blk.%d.%s", l, at->gguf);
                    w->ne[1] = ne[1], w->nbytes = half * (size_t)hp->n_expert, w->data = dst - w->nbytes;
                    continue;
                }
                const struct wtensor *first = NULL;
                for (int e = 0; e < hp->n_expert; e++) {
                    snprintf(name, sizeof name, "blk.%d.%s#%d", l, at->gguf, e);
                    const struct wtensor *t = model_file_tensor(mf, name);
                    char hf[96];
                    snprintf(hf, sizeof hf, "model.layers.%d.%.*s%d%s", l,
                             (int)(strchr(at->hf, '*') - at->hf), at->hf, e, strchr(at->hf, '*') + 1);
                    if (!t)
                        return ferry_fail(err, FERRY_ERR_FORMAT, "missing tensor '%s' (%d experts)", hf,
                                          hp->n_expert);
                    if (t->n_dims != 2 || t->ne[0] != ne[0] || t->ne[1] != ne[1] ||
                        (first && t->type != first->type))
                        return ferry_fail(
                            err, FERRY_ERR_FORMAT,
                            "expert tensor '%s' has shape [%lld, %lld] %s, expected [%lld, %lld]%s%s", hf,
                            (long long)t->ne[1], (long long)t->ne[0], dtype_name(t->type), ne[1], ne[0],
                            first ? " " : "", first ? dtype_name(first->type) : "");
                    if (!first) first = t;
                    if (pass == 1) memcpy(dst, t->data, t->nbytes);
                    if (pass == 1)
                        dst += t->nbytes;
                    else
                        bytes += t->nbytes;
                }
                if (pass == 0) {
                    n_stacked++;
                    continue;
                }
                struct wtensor *w = &mf->tensors[mf->n_tensors++];
                memset(w, 0, sizeof *w);
                snprintf(w->name, sizeof w->name, "blk.%d.%s", l, at->gguf);
                w->type = first->type;
                w->n_dims = 3;
                w->ne[0] = ne[0], w->ne[1] = ne[1], w->ne[2] = ne[2], w->ne[3] = 1;
                w->nbytes = first->nbytes * (size_t)hp->n_expert;
                w->data = dst - w->nbytes;
            }
        }
        if (pass == 1) break;
        if (!n_stacked) return FERRY_OK;
        if (!(pv->experts = malloc(bytes ? bytes : 1)))
            return ferry_fail(err, FERRY_ERR_NOMEM, "out of memory for %zu MiB of experts", bytes >> 20);
        /* Drop the per-expert entries (their data stays mapped until copied below, in pass 1, which reads
         * them before they are overwritten: the list is compacted only after). */
        struct wtensor *nt =
            realloc(mf->tensors, ((size_t)mf->n_tensors + (size_t)n_stacked + 1) * sizeof *nt);
        if (!nt) return ferry_fail(err, FERRY_ERR_NOMEM, "out of memory for tensors");
        mf->tensors = nt;
    }
    int o = 0;
    for (int i = 0; i < mf->n_tensors; i++)
        if (!strchr(mf->tensors[i].name, '#')) mf->tensors[o++] = mf->tensors[i];
    mf->n_tensors = o;
    return FERRY_OK;
}

static int add_shard(struct model_file *mf, const char *dir, const char *file, struct progress *pr, char *err)
{
    struct mf_priv *pv = mf->priv;
    char path[4096];
    if ((size_t)snprintf(path, sizeof path, "%s/%s", dir, file) >= sizeof path)
        return ferry_fail(err, FERRY_ERR_INVALID, "path too long: %.100s/%.60s", dir, file);
    struct safetensors *st;
    int rc = safetensors_open(path, &st, err);
    if (rc) return rc;
    pv->st[pv->n_st++] = st;
    mf->file_bytes += safetensors_file_size(st);
    int n = safetensors_n_tensors(st);
    struct wtensor *nt = realloc(mf->tensors, ((size_t)mf->n_tensors + (size_t)n + 1) * sizeof *nt);
    if (!nt) return ferry_fail(err, FERRY_ERR_NOMEM, "out of memory for tensors of %.60s", file);
    mf->tensors = nt;
    for (int i = 0; i < n; i++) {
        const struct st_tensor *t = safetensors_tensor(st, i);
        char name[96];
        if (hf_map_name(mf->hp.family, t->name, name) != 0) {
            FLOG_DEBUG("%s: ignoring tensor '%s'", file, t->name);
            continue;
        }
        if (t->dtype < 0)
            return ferry_fail(err, FERRY_ERR_UNSUPPORTED,
                              "%.60s: tensor '%.80s' has dtype %s (F32, F16, BF16 only)", file, t->name,
                              t->dtype_str);
        /* Kernels load elements directly: the mapping is page-aligned, so this checks the file offset. */
        if ((uintptr_t)t->data % dtype_type_size((enum dtype)t->dtype) != 0)
            return ferry_fail(err, FERRY_ERR_UNSUPPORTED,
                              "%.60s: tensor '%.80s' at file offset %zu is not aligned to its "
                              "element size",
                              file, t->name, (size_t)t->offset);
        if (t->n_dims < 1 || t->n_dims > 4)
            return ferry_fail(err, FERRY_ERR_FORMAT, "%.60s: tensor '%.80s' has %d dimensions (1..4)", file,
                              t->name, t->n_dims);
        if (model_file_tensor(mf, name))
            return ferry_fail(err, FERRY_ERR_FORMAT, "%.60s: tensor '%.80s' appears twice among the shards",
                              file, t->name);
        struct wtensor *w = &mf->tensors[mf->n_tensors];
        memset(w, 0, sizeof *w);
        snprintf(w->name, sizeof w->name, "%s", name);
        w->type = (enum dtype)t->dtype;
        w->n_dims = t->n_dims;
        for (int dd = 0; dd < 4; dd++) w->ne[dd] = 1;
        for (int dd = 0; dd < t->n_dims; dd++) {
            w->ne[dd] = t->shape[t->n_dims - 1 - dd];
            if (w->ne[dd] < 1)
                return ferry_fail(err, FERRY_ERR_FORMAT, "%.60s: tensor '%.80s' has an empty dimension", file,
                                  t->name);
        }
        w->data = t->data;
        w->nbytes = t->nbytes;
        mf->n_tensors++;
    }
    progress_add(pr, safetensors_file_size(st));
    return FERRY_OK;
}

static int open_hf(struct model_file *mf, const char *dir, struct progress *pr, char *err)
{
    int rc;
    if (!(mf->dir = strdup(dir))) return ferry_fail(err, FERRY_ERR_NOMEM, "out of memory");
    if ((rc = hf_config_load(dir, &mf->hp, err))) return rc;
    int config_tied = mf->hp.tied_embeddings;
    if ((rc = hf_chat_template_load(dir, &mf->chat_template, err))) return rc;
    struct mf_priv *pv = mf->priv;

    char path[4096];
    if ((size_t)snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir) >= sizeof path)
        return ferry_fail(err, FERRY_ERR_INVALID, "path too long: %.100s", dir);
    char *buf;
    size_t len;
    rc = mapfile_read_small(path, HF_MAX_JSON, &buf, &len, err);
    if (rc == FERRY_ERR_NOT_FOUND) {
        snprintf(path, sizeof path, "%s/model.safetensors", dir);
        struct stat sb;
        if (stat(path, &sb) != 0) {
            snprintf(path, sizeof path, "%s/pytorch_model.bin", dir);
            if (stat(path, &sb) == 0)
                return ferry_fail(err, FERRY_ERR_UNSUPPORTED,
                                  "%.100s: only safetensors weights are read, not "
                                  "pytorch_model.bin",
                                  base_name(dir));
            return ferry_fail(err, FERRY_ERR_NOT_FOUND,
                              "%.100s: no model.safetensors or model.safetensors.index.json", base_name(dir));
        }
        if (!(pv->st = calloc(1, sizeof *pv->st))) return ferry_fail(err, FERRY_ERR_NOMEM, "out of memory");
        pr->total = (uint64_t)sb.st_size;
        if ((rc = add_shard(mf, dir, "model.safetensors", pr, err))) return rc;
    } else if (rc) {
        return rc;
    } else {
        struct st_index ix;
        rc = st_index_parse(buf, len, &ix, err);
        free(buf);
        if (rc) return rc;
        if (!(pv->st = calloc((size_t)ix.n_files + 1, sizeof *pv->st))) {
            st_index_free(&ix);
            return ferry_fail(err, FERRY_ERR_NOMEM, "out of memory");
        }
        for (int i = 0; i < ix.n_files; i++) {
            struct stat sb;
            char sp[4096];
            snprintf(sp, sizeof sp, "%s/%s", dir, ix.files[i]);
            if (stat(sp, &sb) == 0) pr->total += (uint64_t)sb.st_size;
        }
        for (int i = 0; i < ix.n_files && rc == FERRY_OK; i++) rc = add_shard(mf, dir, ix.files[i], pr, err);
        for (int i = 0; i < ix.n_entries && rc == FERRY_OK; i++) {
            if (!safetensors_find(pv->st[ix.file_of[i]], ix.names[i]))
                rc = ferry_fail(err, FERRY_ERR_FORMAT,
                                "index lists tensor '%.80s' in %.60s but that shard lacks it", ix.names[i],
                                ix.files[ix.file_of[i]]);
        }
        st_index_free(&ix);
        if (rc) return rc;
    }

    /* tied_embeddings means "no output.weight": a tied checkpoint that also stores lm_head keeps it. */
    int has_out = model_file_tensor(mf, "output.weight") != NULL;
    if (!has_out && !config_tied)
        return ferry_fail(err, FERRY_ERR_FORMAT,
                          "missing tensor 'lm_head.weight' (config.json says tie_word_embeddings "
                          "is false)");
    mf->hp.tied_embeddings = !has_out;
    if (model_file_tensor(mf, "blk.0.attn_q.bias")) mf->hp.qkv_bias = 1;
    if (mf->hp.n_expert > 0 && (rc = stack_experts(mf, err))) return rc;
    return mf->hp.family->hf_tensors ? mf->hp.family->hf_tensors(mf, err) : FERRY_OK;
}

/* ---------------------------------------------------------------- validation */

static int is_float(enum dtype t)
{
    return dtype_valid(t) && !dtype_get_traits(t)->is_quantized;
}

/* The tensor `name` must exist (unless optional) with exactly n_dims dims {a, b}; float_only for norms. */
static int want(const struct model_file *mf, const char *name, int n_dims, int64_t a, int64_t b,
                int float_only, char *err)
{
    const struct wtensor *t = model_file_tensor(mf, name);
    if (!t)
        return ferry_fail(err, FERRY_ERR_FORMAT, "missing tensor '%s' (%s family)", name,
                          mf->hp.family ? mf->hp.family->name : mf->hp.arch);
    int64_t e[4] = {a, n_dims > 1 ? b : 1, 1, 1};
    if (t->ne[0] != e[0] || t->ne[1] != e[1] || t->ne[2] != 1 || t->ne[3] != 1) {
        if (n_dims == 1)
            return ferry_fail(err, FERRY_ERR_FORMAT,
                              "tensor '%s' has shape [%lld, %lld, %lld, %lld], expected [%lld]", name,
                              (long long)t->ne[0], (long long)t->ne[1], (long long)t->ne[2],
                              (long long)t->ne[3], (long long)a);
        return ferry_fail(err, FERRY_ERR_FORMAT,
                          "tensor '%s' has shape [%lld, %lld, %lld, %lld], expected [%lld, %lld]", name,
                          (long long)t->ne[0], (long long)t->ne[1], (long long)t->ne[2], (long long)t->ne[3],
                          (long long)a, (long long)b);
    }
    if (float_only && !is_float(t->type))
        return ferry_fail(err, FERRY_ERR_UNSUPPORTED, "tensor '%s' has type %s; F32, F16 or BF16 expected",
                          name, dtype_name(t->type));
    return FERRY_OK;
}

int model_file_validate(const struct model_file *mf, char err[256])
{
    const struct llm_hparams *hp = &mf->hp;
    if (hp->dim < 1 || hp->n_layers < 1 || hp->n_heads < 1 || hp->n_kv_heads < 1 || hp->head_dim < 1 ||
        hp->ffn_dim < 1 || hp->n_vocab < 1 || hp->ctx_train < 1)
        return ferry_fail(err, FERRY_ERR_FORMAT,
                          "hyperparameters must be positive (dim %d, layers %d, heads %d/%d, "
                          "head_dim %d, ffn %d, vocab %d, ctx %d)",
                          hp->dim, hp->n_layers, hp->n_heads, hp->n_kv_heads, hp->head_dim, hp->ffn_dim,
                          hp->n_vocab, hp->ctx_train);
    if (hp->n_layers > MAX_LAYERS)
        return ferry_fail(err, FERRY_ERR_FORMAT, "%d layers is more than %d", hp->n_layers, MAX_LAYERS);
    if (hp->n_heads % hp->n_kv_heads != 0)
        return ferry_fail(err, FERRY_ERR_FORMAT, "%d attention heads is not a multiple of %d kv heads",
                          hp->n_heads, hp->n_kv_heads);
    if (hp->head_dim % 2 != 0 || hp->rope_dim < 2 || hp->rope_dim % 2 != 0 || hp->rope_dim > hp->head_dim)
        return ferry_fail(err, FERRY_ERR_FORMAT, "rotary dims %d must be even and at most head_dim %d (even)",
                          hp->rope_dim, hp->head_dim);
    if (!(hp->norm_eps > 0) || !(hp->rope_theta > 0))
        return ferry_fail(err, FERRY_ERR_FORMAT, "norm eps %g and rope theta %g must be positive",
                          hp->norm_eps, hp->rope_theta);
    if (!(hp->attn_scale >= 0) || !isfinite(hp->attn_scale) || !(hp->embed_scale >= 0) ||
        !isfinite(hp->embed_scale) || hp->sliding_window < 0 || hp->swa_pattern < 0 ||
        (hp->sliding_window > 0 && (!(hp->rope_theta_swa > 0) || !isfinite(hp->rope_theta_swa))))
        return ferry_fail(
            err, FERRY_ERR_FORMAT,
            "attention scale %g, embedding scale %g, window %d/%d, local rope theta %g are invalid",
            hp->attn_scale, hp->embed_scale, hp->sliding_window, hp->swa_pattern, hp->rope_theta_swa);
    const struct rope_scaling *rs = &hp->rope_scaling;
    if (rs->type != ROPE_SCALING_NONE && !(rs->factor > 0))
        return ferry_fail(err, FERRY_ERR_FORMAT, "rope scaling factor %g must be positive", rs->factor);
    if (rs->type == ROPE_SCALING_LLAMA3 &&
        (rs->orig_ctx < 1 || !(rs->high_freq_factor > rs->low_freq_factor)))
        return ferry_fail(err, FERRY_ERR_FORMAT,
                          "llama3 rope scaling needs original context and high > low freq factor");
    if (rs->type == ROPE_SCALING_YARN && (rs->orig_ctx < 1 || !(rs->beta_fast > 0) || !(rs->beta_slow > 0) ||
                                          !(rs->attn_factor >= 0) || !isfinite(rs->attn_factor)))
        return ferry_fail(
            err, FERRY_ERR_FORMAT,
            "yarn rope scaling needs an original context and positive betas (attention factor %g)",
            rs->attn_factor);
    if (rs->type == ROPE_SCALING_LONGROPE) {
        int bad = rs->orig_ctx < 1 || rs->n_factors != hp->rope_dim / 2 || !(rs->attn_factor > 0) ||
                  !isfinite(rs->attn_factor);
        for (int i = 0; i < rs->n_factors && i < ROPE_MAX_FACTORS; i++)
            bad |= !(rs->short_factor[i] > 0) || !(rs->long_factor[i] > 0) ||
                   !isfinite(rs->short_factor[i]) || !isfinite(rs->long_factor[i]);
        if (bad)
            return ferry_fail(
                err, FERRY_ERR_FORMAT,
                "longrope scaling needs an original context, positive attention factor (%g) and "
                "%d positive short and long factors (has %d)",
                rs->attn_factor, hp->rope_dim / 2, rs->n_factors);
    }
    if (hp->attn_temp_beta != 0 && (!(fabsf(hp->attn_temp_beta) < 1e6f) || hp->attn_temp_len < 1))
        return ferry_fail(err, FERRY_ERR_FORMAT, "attention temperature %g per %d positions is invalid",
                          hp->attn_temp_beta, hp->attn_temp_len);
    /* The attention factor of YaRN and LongRoPE applies to every layer's scores (llm_attn_scale): local
     * layers must then rotate with the same scaling. */
    if ((rs->type == ROPE_SCALING_YARN || rs->type == ROPE_SCALING_LONGROPE) && hp->sliding_window > 0 &&
        !hp->swa_rope_scaled)
        return ferry_fail(err, FERRY_ERR_UNSUPPORTED,
                          "%s rope scaling with unscaled sliding-window layers is not supported",
                          rs->type == ROPE_SCALING_YARN ? "yarn" : "longrope");

    const int64_t dim = hp->dim, vocab = hp->n_vocab;
    int rc;
    if ((rc = want(mf, "token_embd.weight", 2, dim, vocab, 0, err))) return rc;
    if ((rc = want(mf, "output_norm.weight", 1, dim, 1, 1, err))) return rc;
    if (!hp->tied_embeddings && (rc = want(mf, "output.weight", 2, dim, vocab, 0, err))) return rc;
    if (model_file_tensor(mf, "rope_freqs.weight")) {
        if ((rc = want(mf, "rope_freqs.weight", 1, hp->rope_dim / 2, 1, 1, err))) return rc;
        if (model_file_tensor(mf, "rope_freqs.weight")->type != DTYPE_F32)
            return ferry_fail(err, FERRY_ERR_UNSUPPORTED, "tensor 'rope_freqs.weight' must be F32");
    }
    const struct arch_family *fam = arch_of(hp);
    if (!fam)
        return ferry_fail(err, FERRY_ERR_UNSUPPORTED, "architecture '%.31s' is not supported", hp->arch);
    if (arch_tensor_of(fam, ARCH_ROLE_EXP_GATE) &&
        (hp->n_expert < 1 || hp->n_expert > MAX_EXPERTS || hp->n_expert_used < 1 ||
         hp->n_expert_used > hp->n_expert || hp->expert_ffn_dim < 1))
        return ferry_fail(err, FERRY_ERR_FORMAT,
                          "experts: %d of %d per token with FFN %d (1..%d experts, at most all of them used)",
                          hp->n_expert_used, hp->n_expert, hp->expert_ffn_dim, MAX_EXPERTS);
    for (int l = 0; l < hp->n_layers; l++) {
        for (int i = 0; i < fam->n_tensors; i++) {
            const struct arch_tensor *at = &fam->tensors[i];
            char name[96];
            snprintf(name, sizeof name, "blk.%d.%s", l, at->gguf);
            if ((at->need == ARCH_NEED_IF_BIAS && !hp->qkv_bias) ||
                (at->need == ARCH_NEED_NEVER && !model_file_tensor(mf, name)) ||
                !arch_need_in_layer(at->need, hp, l))
                continue;
            long long ne[3];
            const struct llm_hparams hl = llm_hparams_at(hp, l);
            const int nd = arch_role_shape(at->role, &hl, ne);
            if (nd == 3) {
                const struct wtensor *t = model_file_tensor(mf, name);
                if (!t)
                    return ferry_fail(err, FERRY_ERR_FORMAT, "missing tensor '%s' (%s family)", name,
                                      fam->name);
                if (t->ne[0] != ne[0] || t->ne[1] != ne[1] || t->ne[2] != ne[2] || t->ne[3] != 1)
                    return ferry_fail(
                        err, FERRY_ERR_FORMAT,
                        "expert tensor '%s' has shape [%lld, %lld, %lld, %lld], expected [%lld, "
                        "%lld, %lld] (%d experts)",
                        name, (long long)t->ne[0], (long long)t->ne[1], (long long)t->ne[2],
                        (long long)t->ne[3], ne[0], ne[1], ne[2], hp->n_expert);
                continue;
            }
            if ((rc = want(mf, name, nd, ne[0], ne[1], nd == 1 || at->role == ARCH_ROLE_SSM_CONV, err)))
                return rc;
        }
    }
    return FERRY_OK;
}

/* ---------------------------------------------------------------- open/close */

int model_file_open(const char *path, struct model_file **out, model_file_progress_fn progress, void *user,
                    char err[256])
{
    *out = NULL;
    err[0] = '\0';
    struct stat sb;
    if (stat(path, &sb) != 0)
        return ferry_fail(err, FERRY_ERR_NOT_FOUND, "%.200s: no such file or directory", path);
    struct model_file *mf = calloc(1, sizeof *mf);
    struct mf_priv *pv = calloc(1, sizeof *pv);
    if (!mf || !pv) {
        free(mf);
        free(pv);
        return ferry_fail(err, FERRY_ERR_NOMEM, "out of memory");
    }
    mf->priv = pv;
    struct progress pr = {.fn = progress, .user = user, .next = PROGRESS_STEP};
    char e2[256] = "";
    int rc;
    if (S_ISDIR(sb.st_mode)) {
        mf->format = MODEL_FORMAT_HF;
        rc = open_hf(mf, path, &pr, e2);
    } else {
        mf->format = MODEL_FORMAT_GGUF;
        char magic[4] = {0};
        FILE *f = fopen(path, "rb");
        size_t got = f ? fread(magic, 1, 4, f) : 0;
        if (f) fclose(f);
        if (!f)
            rc = ferry_fail(e2, FERRY_ERR_IO, "cannot open");
        else if (got != 4 || memcmp(magic, "GGUF", 4) != 0)
            rc = ferry_fail(e2, FERRY_ERR_FORMAT,
                            "neither a GGUF file (bad magic at offset 0) nor a directory");
        else
            rc = gguf_open(path, &mf->gguf, e2);
        if (rc == FERRY_OK) rc = gguf_split_open(path, mf->gguf, &pv->split, e2);
        if (rc == FERRY_OK) rc = from_gguf(mf, &pr, e2);
    }
    if (rc == FERRY_OK) rc = model_file_validate(mf, e2);
    if (rc) {
        /* gguf_open already names the file; everything else gets the model's name in front. */
        const char *b = base_name(path);
        if (strncmp(e2, b, strlen(b) < 60 ? strlen(b) : 60) == 0)
            snprintf(err, 256, "%s", e2);
        else
            snprintf(err, 256, "%.60s: %.190s", b, e2);
        model_file_close(mf);
        return rc;
    }
    if (progress) progress(pr.done, pr.total, user);
    *out = mf;
    return FERRY_OK;
}

int model_file_open_gguf_mem(const void *buf, size_t size, struct model_file **out, char err[256])
{
    *out = NULL;
    err[0] = '\0';
    struct model_file *mf = calloc(1, sizeof *mf);
    struct mf_priv *pv = calloc(1, sizeof *pv);
    if (!mf || !pv) {
        free(mf);
        free(pv);
        return ferry_fail(err, FERRY_ERR_NOMEM, "out of memory");
    }
    mf->priv = pv;
    mf->format = MODEL_FORMAT_GGUF;
    struct progress pr = {.next = PROGRESS_STEP};
    int rc = gguf_open_mem(buf, size, &mf->gguf, err);
    if (rc == FERRY_OK) rc = from_gguf(mf, &pr, err);
    if (rc == FERRY_OK) rc = model_file_validate(mf, err);
    if (rc) {
        model_file_close(mf);
        return rc;
    }
    *out = mf;
    return FERRY_OK;
}

void model_file_close(struct model_file *mf)
{
    if (!mf) return;
    struct mf_priv *pv = mf->priv;
    if (pv) {
        for (int i = 0; i < pv->n_st; i++) safetensors_close(pv->st[i]);
        free(pv->st);
        free(pv->experts);
        gguf_split_close(pv->split);
        free(pv);
    }
    gguf_close(mf->gguf);
    free(mf->arch_owned);
    free(mf->tensors);
    free(mf->dir);
    free(mf->chat_template);
    free(mf);
}
