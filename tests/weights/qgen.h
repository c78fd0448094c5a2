/* qgen — the random Llama models of make_quantize_fixtures.py, rebuilt in C: the same values (splitmix64
 * sums, eleven row kinds), metadata and tensor order, written with ferry's GGUF writer. qgen_write returns
 * the file's SHA-256, which test_quantize_llama.c checks against the script's gguf-py file. Header-only (each
 * test file is its own executable). */
#ifndef FERRY_TESTS_QGEN_H
#define FERRY_TESTS_QGEN_H

#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/core/status.h"
#include "quant/fp16.h"
#include "sha256.h"
#include "weights/gguf_write.h"

/* ---- the generator of make_quantize_fixtures.py ----------------------------------------------------------
 */

static uint64_t splitmix64(uint64_t x)
{
    uint64_t z = x + 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static double base_value(int t, int64_t e)
{
    const uint64_t key = (uint64_t)t * (1ull << 40) + 4ull * (uint64_t)e;
    double g = 0;
    for (int k = 0; k < 4; k++) g += (double)(splitmix64(key + (uint64_t)k) >> 40) * 0x1p-24;
    return g - 2.0;
}

static void fill_matrix(int t, int64_t rows, int64_t cols, float *out)
{
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols; c++) {
            const double g = base_value(t, r * cols + c);
            double v;
            switch (r % 11) {
            case 0:
                v = g * 1.0;
                break;
            case 1:
                v = g * 0.02;
                break;
            case 2:
                v = g * 30.0;
                break;
            case 3:
                v = g * 0.0;
                break;
            case 4:
                v = 0.25;
                break;
            case 5:
                v = g * 1e-7;
                break;
            case 6:
                v = floor(g * 16.0) / 8.0;
                break;
            case 7:
                v = c == (r * 37) % cols ? g * 64.0 : g;
                break;
            case 8:
                v = fabs(g);
                break;
            case 9:
                v = (c / 32) % 2 == 1 ? 0.0 : g;
                break;
            default:
                v = g * 1e-30;
                break;
            }
            out[r * cols + c] = (float)v;
        }
}

struct qgen_spec {
    const char *name;
    int n_layers, dim, heads, kv_heads, head_dim, ffn, vocab, tied, f16, tokenizer;
    int n_expert, n_expert_used; /* 0: dense; else every FFN is n_expert stacked experts of ffn (Mixtral) */
};

static const struct qgen_spec qgen_specs[] = {
    {"a_f32", 10, 256, 4, 1, 64, 352, 103, 0, 0, 1, 0, 0},
    {"a_f16", 10, 256, 4, 1, 64, 352, 103, 0, 1, 1, 0, 0},
    {"b_f32", 80, 32, 2, 1, 16, 256, 67, 1, 0, 0, 0, 0},
    {"c_moe", 4, 256, 4, 1, 64, 256, 103, 0, 0, 1, 8, 2},
};

#define CHECK(call) cr_assert_eq((call), FERRY_OK, "%s", err)

/* The metadata gguf-py's GGUFWriter writes for the script's calls, in its order and types. */
static void add_metadata(struct gguf_writer *w, const struct qgen_spec *s, char err[256])
{
    char name[64];
    snprintf(name, sizeof name, "quantfixture-%s", s->name);
    CHECK(gguf_writer_kv_str(w, "general.architecture", "llama", 5, err));
    CHECK(gguf_writer_kv_str(w, "general.name", name, strlen(name), err));
    CHECK(gguf_writer_kv_u32(w, "llama.context_length", 512, err));
    CHECK(gguf_writer_kv_u32(w, "llama.embedding_length", (uint32_t)s->dim, err));
    CHECK(gguf_writer_kv_u32(w, "llama.feed_forward_length", (uint32_t)s->ffn, err));
    CHECK(gguf_writer_kv_u32(w, "llama.block_count", (uint32_t)s->n_layers, err));
    CHECK(gguf_writer_kv_u32(w, "llama.attention.head_count", (uint32_t)s->heads, err));
    CHECK(gguf_writer_kv_u32(w, "llama.attention.head_count_kv", (uint32_t)s->kv_heads, err));
    CHECK(gguf_writer_kv_f32(w, "llama.rope.freq_base", 10000.0f, err));
    CHECK(gguf_writer_kv_f32(w, "llama.attention.layer_norm_rms_epsilon", 1e-5f, err));
    CHECK(gguf_writer_kv_u32(w, "general.file_type", s->f16 ? 1 : 0, err));
    CHECK(gguf_writer_kv_u32(w, "llama.rope.dimension_count", (uint32_t)s->head_dim, err));
    CHECK(gguf_writer_kv_u32(w, "general.quantization_version", 2, err));
    if (s->n_expert) {
        CHECK(gguf_writer_kv_u32(w, "llama.expert_count", (uint32_t)s->n_expert, err));
        CHECK(gguf_writer_kv_u32(w, "llama.expert_used_count", (uint32_t)s->n_expert_used, err));
    }
    if (!s->tokenizer) return;
    CHECK(gguf_writer_kv_str(w, "tokenizer.ggml.model", "llama", 5, err));
    const int V = s->vocab;
    char **toks = calloc((size_t)V, sizeof *toks);
    size_t *lens = calloc((size_t)V, sizeof *lens);
    float *scores = malloc(sizeof(float) * V);
    int32_t *types = malloc(sizeof(int32_t) * V);
    for (int i = 0; i < V; i++) {
        toks[i] = malloc(32);
        if (i < 3)
            snprintf(toks[i], 32, "%s", i == 0 ? "<unk>" : i == 1 ? "<s>" : "</s>");
        else
            snprintf(toks[i], 32, "\xe2\x96\x81t%d", i - 3);
        lens[i] = strlen(toks[i]);
        scores[i] = -(float)i;
        types[i] = i == 0 ? 2 : i < 3 ? 3 : 1;
    }
    CHECK(gguf_writer_kv_arr_str(w, "tokenizer.ggml.tokens", (const char *const *)toks, lens, (uint64_t)V,
                                 err));
    CHECK(gguf_writer_kv_arr(w, "tokenizer.ggml.scores", GGUF_TYPE_FLOAT32, scores, (uint64_t)V, err));
    CHECK(gguf_writer_kv_arr(w, "tokenizer.ggml.token_type", GGUF_TYPE_INT32, types, (uint64_t)V, err));
    CHECK(gguf_writer_kv_u32(w, "tokenizer.ggml.bos_token_id", 1, err));
    CHECK(gguf_writer_kv_u32(w, "tokenizer.ggml.eos_token_id", 2, err));
    CHECK(gguf_writer_kv_bool(w, "tokenizer.ggml.add_bos_token", 1, err));
    for (int i = 0; i < V; i++) free(toks[i]);
    free(toks);
    free(lens);
    free(scores);
    free(types);
}

struct gen_tensor {
    char name[64];
    int64_t rows, cols; /* rows 0: a 1-D norm of cols elements */
    int64_t experts;    /* > 0: (experts, rows, cols) stacked, valued as one (experts * rows, cols) matrix */
};

static int gen_tensors(const struct qgen_spec *s, struct gen_tensor *t)
{
    int n = 0;
#define ADD(nm, r, c)                                                                                        \
    (snprintf(t[n].name, sizeof t[n].name, "%s", nm), t[n].rows = (r), t[n].cols = (c), t[n].experts = 0, n++)
    ADD("token_embd.weight", s->vocab, s->dim);
    char nm[64];
    const int qd = s->heads * s->head_dim, kvd = s->kv_heads * s->head_dim;
    for (int l = 0; l < s->n_layers; l++) {
#define L(suffix, r, c) (snprintf(nm, sizeof nm, "blk.%d.%s", l, suffix), ADD(nm, r, c))
        L("attn_norm.weight", 0, s->dim);
        L("attn_q.weight", qd, s->dim);
        L("attn_k.weight", kvd, s->dim);
        L("attn_v.weight", kvd, s->dim);
        L("attn_output.weight", s->dim, qd);
        L("ffn_norm.weight", 0, s->dim);
        if (s->n_expert) {
            L("ffn_gate_inp.weight", s->n_expert, s->dim);
            L("ffn_gate_exps.weight", s->ffn, s->dim), t[n - 1].experts = s->n_expert;
            L("ffn_up_exps.weight", s->ffn, s->dim), t[n - 1].experts = s->n_expert;
            L("ffn_down_exps.weight", s->dim, s->ffn), t[n - 1].experts = s->n_expert;
            continue;
        }
        L("ffn_gate.weight", s->ffn, s->dim);
        L("ffn_up.weight", s->ffn, s->dim);
        L("ffn_down.weight", s->dim, s->ffn);
#undef L
    }
    ADD("output_norm.weight", 0, s->dim);
    if (!s->tied) ADD("output.weight", s->vocab, s->dim);
#undef ADD
    return n;
}

/* Writes spec s to path as the script does and returns the file's SHA-256. */
static inline void qgen_write(const struct qgen_spec *s, const char *path, char hex[65])
{
    char err[256] = "";
    struct gguf_writer *w;
    CHECK(gguf_writer_init(&w, err));
    add_metadata(w, s, err);
    struct gen_tensor *t = malloc(sizeof *t * (size_t)(10 * s->n_layers + 4));
    const int n = gen_tensors(s, t);
    for (int i = 0; i < n; i++) {
        const int64_t ne[3] = {t[i].cols, t[i].rows, t[i].experts};
        const enum dtype ty = t[i].rows && s->f16 ? DTYPE_F16 : DTYPE_F32;
        CHECK(gguf_writer_tensor(w, t[i].name, ty, t[i].experts ? 3 : t[i].rows ? 2 : 1, ne, err));
    }
    CHECK(gguf_writer_open(w, path, err));
    for (int i = 0; i < n; i++) {
        const int64_t rows = (t[i].rows ? t[i].rows : 1) * (t[i].experts ? t[i].experts : 1),
                      cols = t[i].cols, ne = rows * cols;
        float *v = malloc(sizeof(float) * (size_t)ne);
        if (t[i].rows)
            fill_matrix(i, rows, cols, v);
        else
            for (int64_t e = 0; e < cols; e++) v[e] = (float)(1.0 + 0.1 * base_value(i, e));
        if (t[i].rows && s->f16) {
            uint16_t *h = malloc(2 * (size_t)ne);
            for (int64_t e = 0; e < ne; e++) h[e] = f32_to_f16(v[e]);
            CHECK(gguf_writer_data(w, h, 2 * (size_t)ne, err));
            free(h);
        } else {
            CHECK(gguf_writer_data(w, v, 4 * (size_t)ne, err));
        }
        free(v);
    }
    CHECK(gguf_writer_finish(w, err));
    gguf_writer_free(w);
    free(t);
    size_t len;
    void *bytes = NULL;
    FILE *f = fopen(path, "rb");
    cr_assert_not_null(f);
    fseek(f, 0, SEEK_END);
    len = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    bytes = malloc(len);
    cr_assert_eq(fread(bytes, 1, len, f), len);
    fclose(f);
    sha256_of(bytes, len, hex);
    free(bytes);
}

#endif
