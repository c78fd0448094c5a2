/* quantize — a model_file to a quantized GGUF (see quantize.h). Plan first (order, types, metadata, sizes),
 * then stream: each tensor is converted in row chunks of at most CHUNK_BYTES of output and written. */
#include "weights/quantize.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/core/status.h"
#include "weights/arch/arch.h"
#include "weights/gguf.h"
#include "weights/gguf_write.h"
#include "weights/hf_export.h"

#define CHUNK_BYTES   (64u << 20) /* output bytes converted per step: bounds memory, paces progress */
#define QUANT_VERSION 2           /* general.quantization_version (ggml's GGML_QNT_VERSION) */

/* One output tensor: where it comes from and what it becomes. */
struct plan {
    const struct wtensor *src;
    enum dtype to;
    int n_dims;         /* ggml's count: trailing dimensions of 1 dropped */
    int permute;        /* HF llama-arch attn_q/attn_k: rows reordered to llama.cpp's rotary layout (heads) */
    float shift;        /* added to every element of a norm (HF Gemma's w becomes llama.cpp's 1 + w) */
    bool needs_imatrix; /* llama-quantize refuses to write it without importance weights */
};

static int ggml_n_dims(const int64_t ne[4])
{
    for (int d = 3; d >= 1; d--)
        if (ne[d] > 1) return d + 1;
    return 1;
}

static int cmp_plan(const void *a, const void *b)
{
    return quant_mix_order(((const struct plan *)a)->src->name, ((const struct plan *)b)->src->name);
}

/* The output family: llama.cpp writes Mistral checkpoints as llama. */
static const struct arch_family *out_family(const struct model_file *mf)
{
    const struct arch_family *f = arch_of(&mf->hp);
    const struct arch_family *w = arch_find_gguf(f->gguf_writes, strlen(f->gguf_writes));
    return w ? w : f;
}

/* llama.cpp's LLM_TYPE_70B of the output family, which bumps attn_v. */
static bool is_70b(const struct model_file *mf)
{
    const struct arch_family *f = out_family(mf);
    return f->is_70b && f->is_70b(&mf->hp);
}

/* The tensors convert_hf_to_gguf.py always writes in F32 (its base rules), among the names ferry writes: the
 * MoE routers, the recurrent layers' convolutions, position and token-type tables, and everything whose name
 * does not end in ".weight" (biases). */
static bool hf_kept_f32(const char *name)
{
    static const char *const suffix[] = {"ffn_gate_inp.weight", "ffn_gate_inp_shexp.weight",
                                         "ssm_conv1d.weight", "position_embd.weight", "token_types.weight"};
    const size_t nl = strlen(name);
    if (nl < 7 || strcmp(name + nl - 7, ".weight") != 0) return true;
    for (size_t i = 0; i < sizeof suffix / sizeof suffix[0]; i++) {
        const size_t sl = strlen(suffix[i]);
        if (nl >= sl && !strcmp(name + nl - sl, suffix[i])) return true;
    }
    return false;
}

/* The output tensors: the model's, and for a Hugging Face llama3- or LongRoPE-scaled model the tensors
 * llama.cpp keeps its scaling in (extra: n - mf->n_tensors of them). */
static int plan_types(const struct model_file *mf, const struct wtensor *extra, int n, int ftype,
                      bool has_imatrix, struct plan *pl, char err[256])
{
    /* llama-quantize counts the FFN positions over every block, multi-token-prediction ones included. */
    struct quant_mix_model mm = {.n_layers = mf->hp.n_layers + mf->hp.n_layer_nextn,
                                 .n_gqa = mf->hp.n_kv_heads ? mf->hp.n_heads / mf->hp.n_kv_heads : 0,
                                 .n_expert = mf->hp.n_expert,
                                 .has_output = model_file_tensor(mf, "output.weight") != NULL,
                                 .is_70b = is_70b(mf),
                                 .has_imatrix = has_imatrix};
    for (int i = 0; i < n; i++) {
        const struct wtensor *t = i < mf->n_tensors ? &mf->tensors[i] : &extra[i - mf->n_tensors];
        pl[i] = (struct plan){.src = t, .n_dims = ggml_n_dims(t->ne)};
        mm.n_attn_v += quant_mix_attn_v_like(t->name);
    }
    qsort(pl, (size_t)n, sizeof *pl, cmp_plan);
    struct quant_mix mix;
    if (!quant_mix_init_model(&mix, ftype, &mm))
        return ferry_fail(err, FERRY_ERR_INVALID, "unknown file type %d", ftype);
    const int hf = mf->format == MODEL_FORMAT_HF;
    for (int i = 0; i < n; i++) {
        struct plan *p = &pl[i];
        const struct wtensor *t = p->src;
        /* convert_hf_to_gguf.py stores 1-D tensors (norms, biases) and hf_kept_f32's in F32 whatever the
         * checkpoint's type. */
        const enum dtype cur = hf && (p->n_dims == 1 || hf_kept_f32(t->name)) ? DTYPE_F32 : t->type;
        const int to = quant_mix_type(&mix, t->name, p->n_dims, t->ne[0], cur);
        if (to < 0)
            return ferry_fail(err, FERRY_ERR_FORMAT,
                              "tensor %s: no layer below %d in the name of an expert tensor", t->name,
                              mf->hp.n_layers);
        p->to = (enum dtype)to;
        const struct dtype_traits *tt = dtype_get_traits(p->to);
        if (p->to != t->type && !tt->from_f32 && !tt->from_f32_w)
            return ferry_fail(err, FERRY_ERR_UNSUPPORTED, "tensor %s: ferry has no quantizer for %s yet",
                              t->name, tt->name);
        p->needs_imatrix = p->to != t->type && quant_mix_needs_imatrix(&mix, t->name, p->to);
        if (p->needs_imatrix && !has_imatrix)
            return ferry_fail(err, FERRY_ERR_INVALID,
                              "this quantization requires an importance matrix (--imatrix): tensor %s is %s",
                              t->name, dtype_name(p->to));
        if (p->to != t->type && dtype_get_traits(t->type)->is_quantized &&
            dtype_get_traits(p->to)->is_quantized)
            return ferry_fail(err, FERRY_ERR_UNSUPPORTED,
                              "tensor %s is already %s: ferry quantize reads F32, F16 or BF16 weights "
                              "(requantizing compounds the errors; llama-quantize refuses it too)",
                              t->name, dtype_name(t->type));
        const size_t nl = strlen(t->name);
        if (hf && p->n_dims == 1 && nl >= 11 && !strcmp(t->name + nl - 11, "norm.weight"))
            p->shift = arch_of(&mf->hp)->hf_norm_shift;
        p->permute = hf && out_family(mf)->gguf_rope == ROPE_STYLE_INTERLEAVED && p->n_dims == 2 &&
                     (strstr(t->name, ".attn_q.weight") || strstr(t->name, ".attn_k.weight"));
    }
    return FERRY_OK;
}

/* A GGUF input's metadata, verbatim, in order, except the keys llama-quantize sets or drops. */
static int copy_gguf_metadata(struct gguf_writer *w, const struct gguf *g, char err[256])
{
    static const char *const skip[] = {"general.quantization_version",
                                       "general.file_type",
                                       "split.no",
                                       "split.count",
                                       "split.tensors.count",
                                       "quantize.imatrix.file",
                                       "quantize.imatrix.dataset",
                                       "quantize.imatrix.entries_count",
                                       "quantize.imatrix.chunks_count"};
    for (int i = 0; i < gguf_n_kv(g); i++) {
        const struct gguf_str k = gguf_kv_key(g, i);
        int skipped = 0;
        for (size_t s = 0; s < sizeof skip / sizeof skip[0]; s++)
            skipped |= k.len == strlen(skip[s]) && !memcmp(k.ptr, skip[s], k.len);
        if (skipped) continue;
        const struct gguf_str raw = gguf_kv_raw(g, i);
        int rc = gguf_writer_kv_raw(w, raw.ptr, raw.len, err);
        if (rc) return rc;
    }
    return FERRY_OK;
}

/* Row r of a permuted attn_q/attn_k comes from this source row (convert_hf_to_gguf.py's LlamaModel.permute:
 * per head, the rotate-half pairs (j, j + hd/2) become adjacent rows (2j, 2j + 1)). */
static int64_t permuted_row(int64_t r, int64_t hd)
{
    const int64_t h = r / hd, w = r % hd;
    return h * hd + (w % 2) * (hd / 2) + w / 2;
}

/* What llama-quantize records of its importance matrix (strings cut to 127 bytes, as it copies them). */
static int imatrix_metadata(struct gguf_writer *w, const struct imatrix *im, char err[256])
{
    int rc = gguf_writer_kv_str(w, "quantize.imatrix.file", im->path, strnlen(im->path, 127), err);
    if (!rc && im->dataset)
        rc = gguf_writer_kv_str(w, "quantize.imatrix.dataset", im->dataset, strnlen(im->dataset, 127), err);
    if (!rc) rc = gguf_writer_kv_u32(w, "quantize.imatrix.entries_count", (uint32_t)im->n_entries, err);
    if (!rc && im->chunk_count > 0)
        rc = gguf_writer_kv_u32(w, "quantize.imatrix.chunks_count", (uint32_t)im->chunk_count, err);
    return rc;
}

/* The importance weights of tensor t (rows of cols), or NULL when the matrix has no entry for it. An entry
 * of another length is an error, but for the token embedding (whose entry, when there is one, never fits:
 * llama-quantize ignores it). */
static int tensor_weights(const struct imatrix *im, const struct wtensor *t, const float **w, char err[256])
{
    *w = NULL;
    const struct imatrix_entry *e = imatrix_find(im, t->name);
    if (!e) return FERRY_OK;
    const int64_t want = t->ne[0] * t->ne[2];
    if (e->n == want) {
        *w = e->w;
        return FERRY_OK;
    }
    if (!strcmp(t->name, "token_embd.weight") || !strcmp(t->name, "per_layer_token_embd.weight"))
        return FERRY_OK;
    return ferry_fail(err, FERRY_ERR_FORMAT, "imatrix size %lld is different from tensor size %lld for %s",
                      (long long)e->n, (long long)want, t->name);
}

struct progress {
    const struct quantize_params *p;
    int i, n;
    uint64_t done, total;
};

static void report(struct progress *pg, const struct plan *pl)
{
    if (pg->p->progress)
        pg->p->progress(pg->i, pg->n, pl->src->name, pl->src->type, pl->to, pg->done, pg->total, pg->p->user);
}

static int write_tensor(struct gguf_writer *w, const struct model_file *mf, const struct plan *pl, void *buf,
                        void *perm_buf, struct progress *pg, char err[256])
{
    const struct wtensor *t = pl->src;
    const int64_t cols = t->ne[0], rows = cols ? (int64_t)(t->nbytes / dtype_row_size(t->type, cols)) : 0;
    const size_t src_row = dtype_row_size(t->type, cols), dst_row = dtype_row_size(pl->to, cols);
    const uint8_t *src = t->data;
    if (pl->permute) {
        const int64_t hd = mf->hp.head_dim;
        if (hd < 2 || hd % 2 || rows % hd)
            return ferry_fail(err, FERRY_ERR_FORMAT, "tensor %s: %lld rows are not whole heads of %lld",
                              t->name, (long long)rows, (long long)hd);
        for (int64_t r = 0; r < rows; r++)
            memcpy((uint8_t *)perm_buf + src_row * (size_t)r, src + src_row * (size_t)permuted_row(r, hd),
                   src_row);
        src = perm_buf;
    }
    if (pl->shift != 0.0f) { /* a norm vector, written as F32 (plan_types) */
        const int64_t n = cols * rows;
        float *v = buf;
        if (pl->to != DTYPE_F32 || !dtype_to_f32(t->type, src, v, n))
            return ferry_fail(err, FERRY_ERR_INTERNAL, "tensor %s: cannot shift a %s norm", t->name,
                              dtype_name(t->type));
        for (int64_t i = 0; i < n; i++) v[i] = v[i] + pl->shift;
        int rc = gguf_writer_data(w, v, (size_t)n * sizeof(float), err);
        pg->done += (size_t)n * sizeof(float);
        report(pg, pl);
        return rc;
    }
    if (pl->to == t->type) { /* kept as it is */
        int rc = gguf_writer_data(w, src, t->nbytes, err);
        pg->done += t->nbytes;
        report(pg, pl);
        return rc;
    }
    const float *iw = NULL;
    int rc0 = pg->p->imatrix ? tensor_weights(pg->p->imatrix, t, &iw, err) : FERRY_OK;
    if (rc0) return rc0;
    if (!iw && (pl->needs_imatrix || !dtype_get_traits(pl->to)->from_f32))
        return ferry_fail(err, FERRY_ERR_INVALID,
                          "missing importance matrix for tensor %s in a very low-bit quantization (%s)",
                          t->name, dtype_name(pl->to));
    const int64_t chunk = dst_row ? (int64_t)(CHUNK_BYTES / dst_row > 0 ? CHUNK_BYTES / dst_row : 1) : rows;
    for (int64_t r0 = 0; r0 < rows; r0 += chunk) {
        const int64_t nr = rows - r0 < chunk ? rows - r0 : chunk;
        int64_t bad = -1;
        /* Stacked experts: row r belongs to expert r / ne1, whose weights follow the previous expert's. */
        const struct quant_weights qw = {.w = iw, .rows_per_set = t->ne[1] > 0 ? t->ne[1] : 1, .row0 = r0};
        if (!quant_matrix_w(pl->to, buf, t->type, src + src_row * (size_t)r0, nr, cols, &pg->p->runner, &bad,
                            iw ? &qw : NULL))
            return ferry_fail(err, FERRY_ERR_INTERNAL, "tensor %s: cannot convert %s to %s", t->name,
                              dtype_name(t->type), dtype_name(pl->to));
        if (bad >= 0)
            return ferry_fail(err, FERRY_ERR_FORMAT, "tensor %s: row %lld holds a NaN or an infinity",
                              t->name, (long long)(r0 + bad));
        int rc = gguf_writer_data(w, buf, dst_row * (size_t)nr, err);
        if (rc) return rc;
        pg->done += dst_row * (size_t)nr;
        report(pg, pl);
    }
    return FERRY_OK;
}

int quantize_model_file(const struct model_file *mf, const char *out_path, const struct quantize_params *p,
                        char err[256])
{
    /* The rope tensors convert_hf_to_gguf.py adds to a Hugging Face model: llama3 scaling's
     * rope_freqs.weight, LongRoPE's rope_factors_long.weight and rope_factors_short.weight. */
    float factors[512];
    const struct rope_scaling *sc = &mf->hp.rope_scaling;
    struct wtensor extra[2] = {
        {.name = "rope_freqs.weight", .type = DTYPE_F32, .n_dims = 1, .data = factors},
        {.name = "rope_factors_short.weight", .type = DTYPE_F32, .n_dims = 1, .data = sc->short_factor}};
    int n_extra = 0;
    if (mf->format == MODEL_FORMAT_HF && sc->type == ROPE_SCALING_LONGROPE) {
        snprintf(extra[0].name, sizeof extra[0].name, "rope_factors_long.weight");
        extra[0].data = sc->long_factor;
        n_extra = 2;
    } else if (mf->format == MODEL_FORMAT_HF && mf->hp.rope_dim / 2 <= 512) {
        n_extra = hf_export_rope_freqs(mf, factors) > 0;
    }
    for (int i = 0; i < n_extra; i++) {
        const int nf = sc->type == ROPE_SCALING_LONGROPE ? sc->n_factors : mf->hp.rope_dim / 2;
        extra[i].ne[0] = nf, extra[i].ne[1] = extra[i].ne[2] = extra[i].ne[3] = 1;
        extra[i].nbytes = sizeof(float) * (size_t)nf;
    }
    const int n = mf->n_tensors + n_extra;
    struct plan *pl = calloc(n ? (size_t)n : 1, sizeof *pl);
    struct gguf_writer *w = NULL;
    void *buf = NULL, *perm_buf = NULL;
    int rc;
    if (!pl) return ferry_fail(err, FERRY_ERR_NOMEM, "out of memory");
    if ((rc = plan_types(mf, extra, n, p->ftype, p->imatrix != NULL, pl, err))) goto out;
    if ((rc = gguf_writer_init(&w, err))) goto out;
    if (mf->format == MODEL_FORMAT_GGUF) {
        if ((rc = copy_gguf_metadata(w, mf->gguf, err))) goto out;
    } else if ((rc = hf_export_metadata(w, mf, out_family(mf)->gguf_writes, err))) {
        goto out;
    }
    if ((rc = gguf_writer_kv_u32(w, "general.quantization_version", QUANT_VERSION, err))) goto out;
    if ((rc = gguf_writer_kv_u32(w, "general.file_type", (uint32_t)p->ftype, err))) goto out;
    if (p->imatrix && (rc = imatrix_metadata(w, p->imatrix, err))) goto out;

    /* Buffers: a converted tensor goes through at most CHUNK_BYTES of whole rows at a time (one row when a
     * row is larger); a permuted one is reordered whole first. */
    size_t max_chunk = 0, max_perm = 0;
    uint64_t total = 0;
    for (int i = 0; i < n; i++) {
        const struct wtensor *t = pl[i].src;
        if ((rc = gguf_writer_tensor(w, t->name, pl[i].to, pl[i].n_dims, t->ne, err))) goto out;
        const size_t bytes = gguf_writer_tensor_bytes(w, i), row = dtype_row_size(pl[i].to, t->ne[0]);
        total += bytes;
        if (pl[i].to != t->type || pl[i].shift != 0.0f) {
            const size_t c = bytes < CHUNK_BYTES + row ? bytes : CHUNK_BYTES + row;
            if (c > max_chunk) max_chunk = c;
        }
        if (pl[i].permute && t->nbytes > max_perm) max_perm = t->nbytes;
    }
    buf = malloc(max_chunk + 1);
    perm_buf = max_perm ? malloc(max_perm) : NULL;
    if (!buf || (max_perm && !perm_buf)) {
        rc = ferry_fail(err, FERRY_ERR_NOMEM, "out of memory for %zu MiB of conversion buffers",
                        (max_chunk + max_perm) >> 20);
        goto out;
    }
    if ((rc = gguf_writer_open(w, out_path, err))) goto out;
    struct progress pg = {.p = p, .n = n, .total = total};
    for (int i = 0; i < n && !rc; i++) {
        pg.i = i;
        report(&pg, &pl[i]);
        rc = write_tensor(w, mf, &pl[i], buf, perm_buf, &pg, err);
    }
    if (!rc) rc = gguf_writer_finish(w, err);
out:
    gguf_writer_free(w);
    free(buf);
    free(perm_buf);
    free(pl);
    return rc;
}
