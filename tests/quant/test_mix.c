/* test_mix — quant/mix.c's per-tensor types against llama.cpp's own record of llama_tensor_get_type
 * (fixtures/mix_snapshots.txt: the lcp0336 snapshots of Qwen3-0.6B, Qwen3-14B, gemma-3-4b-it, Llama-3.1-70B
 * and gpt-oss-120b, copied by make_mix_fixtures.py).
 *
 * Each snapshot gives a model's dimensions and, per file type, the tensors whose type differs from the
 * default. The test rebuilds each model's tensor list from its dimensions (the names llama.cpp's converters
 * write, 1-D norms and biases and the MoE router included), runs the mix over it in llama.cpp's order, and
 * requires every quantizable tensor to get the listed type (or the default), every listed tensor to exist,
 * and every norm, bias and router to stay as it is. Also: the names `ferry quantize` accepts and the ones it
 * refuses with a reason.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "quant/mix.h"

#define MAX_TENSORS 2048

struct tensor {
    char name[64];
    int n_dims;
    int64_t ne0;
};

struct model {
    char title[300];
    int n_embd, n_ff, n_layer, n_head, n_head_kv, n_expert;
    int head_dim; /* per model: not in the snapshot header */
    bool has_output, is_70b, qk_norm, gemma_norms, gpt_oss;
    struct tensor t[MAX_TENSORS];
    int n;
};

static void add(struct model *m, const char *name, int n_dims, int64_t ne0)
{
    cr_assert_lt(m->n, MAX_TENSORS);
    struct tensor *t = &m->t[m->n++];
    snprintf(t->name, sizeof t->name, "%s", name);
    t->n_dims = n_dims;
    t->ne0 = ne0;
}

static void add_layer(struct model *m, int l, const char *suffix, int n_dims, int64_t ne0)
{
    char name[64];
    snprintf(name, sizeof name, "blk.%d.%s", l, suffix);
    add(m, name, n_dims, ne0);
}

/* The tensors of the GGUF files llama.cpp's converters write for these families. */
static void build_tensors(struct model *m)
{
    const int q_dim = m->n_head * m->head_dim;
    add(m, "token_embd.weight", 2, m->n_embd);
    add(m, "output_norm.weight", 1, m->n_embd);
    if (m->has_output) add(m, "output.weight", 2, m->n_embd);
    if (m->is_70b) add(m, "rope_freqs.weight", 1, m->head_dim / 2);
    for (int l = 0; l < m->n_layer; l++) {
        add_layer(m, l, "attn_norm.weight", 1, m->n_embd);
        add_layer(m, l, "attn_q.weight", 2, m->n_embd);
        add_layer(m, l, "attn_k.weight", 2, m->n_embd);
        add_layer(m, l, "attn_v.weight", 2, m->n_embd);
        add_layer(m, l, "attn_output.weight", 2, q_dim);
        if (m->qk_norm) {
            add_layer(m, l, "attn_q_norm.weight", 1, m->head_dim);
            add_layer(m, l, "attn_k_norm.weight", 1, m->head_dim);
        }
        if (m->gemma_norms) {
            add_layer(m, l, "post_attention_norm.weight", 1, m->n_embd);
            add_layer(m, l, "post_ffw_norm.weight", 1, m->n_embd);
        }
        if (m->gpt_oss) {
            add_layer(m, l, "attn_q.bias", 1, q_dim);
            add_layer(m, l, "attn_sinks.weight", 1, m->n_head);
            add_layer(m, l, "post_attention_norm.weight", 1, m->n_embd);
            add_layer(m, l, "ffn_gate_inp.weight", 2, m->n_embd); /* the router: never quantized */
            add_layer(m, l, "ffn_gate_inp.bias", 1, m->n_expert);
            add_layer(m, l, "ffn_gate_exps.weight", 3, m->n_embd);
            add_layer(m, l, "ffn_up_exps.weight", 3, m->n_embd);
            add_layer(m, l, "ffn_down_exps.weight", 3, m->n_ff);
            add_layer(m, l, "ffn_down_exps.bias", 2, m->n_embd);
        } else {
            add_layer(m, l, "ffn_norm.weight", 1, m->n_embd);
            add_layer(m, l, "ffn_gate.weight", 2, m->n_embd);
            add_layer(m, l, "ffn_up.weight", 2, m->n_embd);
            add_layer(m, l, "ffn_down.weight", 2, m->n_ff);
        }
    }
}

static int cmp_tensor(const void *a, const void *b)
{
    return quant_mix_order(((const struct tensor *)a)->name, ((const struct tensor *)b)->name);
}

/* The model of a snapshot header ("# Model: X" and its dimensions line). */
static void model_from_header(struct model *m, const char *title, const char *dims)
{
    memset(m, 0, sizeof *m);
    snprintf(m->title, sizeof m->title, "%s", title);
    int n_vocab;
    cr_assert_geq(
        sscanf(dims, "# n_embd=%d, n_ff=%d, n_vocab=%d, n_layer=%d, n_head=%d, n_head_kv=%d, n_expert=%d",
               &m->n_embd, &m->n_ff, &n_vocab, &m->n_layer, &m->n_head, &m->n_head_kv, &m->n_expert),
        6, "%s", dims);
    m->head_dim = 128;
    m->has_output = true;
    if (!strcmp(title, "Qwen3-0.6B") || !strcmp(title, "Qwen3-14B")) {
        m->qk_norm = true;
    } else if (!strcmp(title, "gemma-3-4b-it")) {
        m->head_dim = 256, m->has_output = false, m->qk_norm = m->gemma_norms = true;
    } else if (!strcmp(title, "Meta-Llama-3.1-70B-Instruct")) {
        m->is_70b = true; /* llama, 80 layers, grouped-query attention */
    } else if (!strcmp(title, "gpt-oss-120b")) {
        m->head_dim = 64, m->gpt_oss = true;
    } else {
        cr_assert_fail("no tensor list for %s", title);
    }
    build_tensors(m);
    qsort(m->t, (size_t)m->n, sizeof m->t[0], cmp_tensor);
}

struct override {
    char name[64];
    int type;
    bool seen;
};

/* One section: the mix of file type ftype_name over model m against the listed overrides. Returns the number
 * of tensors checked. */
static int check_section(const struct model *m, const char *ftype_name, int def, struct override *ov,
                         int n_ov)
{
    const int ftype = quant_ftype_rules_from_name(ftype_name);
    cr_assert_geq(ftype, 0, "%s", ftype_name);
    struct quant_mix_model mm = {.n_layers = m->n_layer,
                                 .n_gqa = m->n_head / m->n_head_kv,
                                 .n_expert = m->n_expert,
                                 .has_output = m->has_output,
                                 .is_70b = m->is_70b};
    for (int i = 0; i < m->n; i++) mm.n_attn_v += quant_mix_attn_v_like(m->t[i].name);
    struct quant_mix mix;
    cr_assert(quant_mix_init_model(&mix, ftype, &mm));
    cr_assert_eq((int)mix.base, def, "%s: default %s, snapshot %s", ftype_name, dtype_name(mix.base),
                 dtype_name((enum dtype)def));
    int checked = 0;
    for (int i = 0; i < m->n; i++) {
        const struct tensor *t = &m->t[i];
        const int got = quant_mix_type(&mix, t->name, t->n_dims, t->ne0, DTYPE_F32);
        const bool kept = t->n_dims < 2 || strstr(t->name, "_norm") || strstr(t->name, "ffn_gate_inp") ||
                          strstr(t->name, ".bias");
        if (kept) {
            cr_assert_eq(got, DTYPE_F32, "%s %s: %s is not quantized, got %s", m->title, ftype_name, t->name,
                         dtype_name((enum dtype)got));
            continue;
        }
        int want = def;
        for (int k = 0; k < n_ov; k++)
            if (!strcmp(ov[k].name, t->name)) want = ov[k].type, ov[k].seen = true;
        cr_assert_eq(got, want, "%s %s: %s got %s, llama.cpp %s", m->title, ftype_name, t->name,
                     dtype_name((enum dtype)got), dtype_name((enum dtype)want));
        checked++;
    }
    for (int k = 0; k < n_ov; k++)
        cr_assert(ov[k].seen, "%s %s: the snapshot's %s is not in the tensor list", m->title, ftype_name,
                  ov[k].name);
    return checked;
}

Test(mix, types_equal_llama_cpp_snapshots, .timeout = 60)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/tests/quant/fixtures/mix_snapshots.txt", getenv("FERRY_SRC"));
    FILE *f = fopen(path, "r");
    cr_assert_not_null(f, "%s", path);
    static struct model m;
    static struct override ov[4096];
    char line[256], title[300] = "", ftype_name[32] = "";
    int n_ov = 0, def = -1, n_sections = 0, n_checked = 0;
    bool have_model = false;
    /* A section ends at the next header or at the end of the file. */
#define FLUSH()                                                                                              \
    do {                                                                                                     \
        if (def >= 0) {                                                                                      \
            n_checked += check_section(&m, ftype_name, def, ov, n_ov);                                       \
            n_sections++;                                                                                    \
        }                                                                                                    \
        def = -1, n_ov = 0;                                                                                  \
    } while (0)
    while (fgets(line, sizeof line, f)) {
        line[strcspn(line, "\n")] = 0;
        if (!strncmp(line, "# Model: ", 9)) {
            FLUSH();
            snprintf(title, sizeof title, "%s", line + 9);
            have_model = false;
        } else if (!strncmp(line, "# n_embd=", 9)) {
            model_from_header(&m, title, line);
            have_model = true;
        } else if (line[0] == '[') {
            FLUSH();
            cr_assert(have_model);
            char dname[32];
            cr_assert_eq(sscanf(line, "[%31[^]]] %31s", ftype_name, dname), 2, "%s", line);
            def = dtype_from_name(dname);
            cr_assert_geq(def, 0, "%s", line);
        } else if (line[0] && line[0] != '#') {
            cr_assert_geq(def, 0, "%s", line);
            cr_assert_lt(n_ov, 4096);
            char tname[64], dname[32];
            cr_assert_eq(sscanf(line, "%63s %31s", tname, dname), 2, "%s", line);
            snprintf(ov[n_ov].name, sizeof ov[n_ov].name, "%s", tname);
            ov[n_ov].type = dtype_from_name(dname);
            ov[n_ov].seen = false;
            cr_assert_geq(ov[n_ov].type, 0, "%s", line);
            n_ov++;
        }
    }
    FLUSH();
#undef FLUSH
    fclose(f);
    /* 5 models x 31 file types (F32 ... MXFP4_MOE and the eleven i-quant mixes), and over 30000 tensor
     * decisions.
     */
    cr_assert_eq(n_sections, 155, "sections %d", n_sections);
    cr_assert_gt(n_checked, 30000, "checked %d", n_checked);
}

Test(mix, names)
{
    /* llama-quantize's spellings, any case, and its aliases for the _M mixes. */
    cr_assert_eq(quant_ftype_from_name("q4_k_m"), QUANT_FTYPE_Q4_K_M);
    cr_assert_eq(quant_ftype_from_name("Q3_K"), QUANT_FTYPE_Q3_K_M);
    cr_assert_eq(quant_ftype_from_name("q5_k"), QUANT_FTYPE_Q5_K_M);
    cr_assert_eq(quant_ftype_from_name("Q4_K"), QUANT_FTYPE_Q4_K_M);
    cr_assert_eq(quant_ftype_from_name("mxfp4_moe"), QUANT_FTYPE_MXFP4_MOE);
    cr_assert_eq(quant_ftype_from_name("IQ4_xs"), QUANT_FTYPE_IQ4_XS);
    cr_assert_eq(quant_ftype_from_name("Q2_K"), QUANT_FTYPE_Q2_K);
    cr_assert_eq(quant_ftype_from_name("Q3_K_L"), QUANT_FTYPE_Q3_K_L);
    cr_assert_eq(quant_ftype_from_name("TQ2_0"), -1);
    cr_assert_eq(quant_ftype_from_name(""), -1);
    cr_assert_eq(quant_ftype_from_name(NULL), -1);
    /* Every name in the help text is accepted and names itself back. */
    char names[512];
    snprintf(names, sizeof names, "%s", quant_ftype_names());
    int n = 0;
    for (char *s = strtok(names, ", "); s; s = strtok(NULL, ", "), n++) {
        const int ft = quant_ftype_from_name(s);
        cr_assert_geq(ft, 0, "%s", s);
        cr_assert_str_eq(quant_ftype_name(ft), s);
        cr_assert_null(quant_ftype_refusal(s), "%s", s);
    }
    cr_assert_eq(n, 31);
    /* The types ferry does not read, and COPY, are refused with a reason. */
    static const char *const refused[] = {"TQ1_0", "TQ2_0", "tq1_0", "Q1_0", "COPY"};
    for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++) {
        cr_assert_eq(quant_ftype_from_name(refused[i]), -1, "%s", refused[i]);
        cr_assert_not_null(quant_ftype_refusal(refused[i]), "%s", refused[i]);
    }
    cr_assert(strstr(quant_ftype_refusal("TQ1_0"), "ternary"));
    cr_assert_eq(quant_ftype_from_name("iq1_m"), QUANT_FTYPE_IQ1_M);
    cr_assert_eq(quant_ftype_from_name("iq2_xs"), QUANT_FTYPE_IQ2_XS);
    cr_assert_eq(quant_ftype_from_name("IQ3_M"), QUANT_FTYPE_IQ3_M);
    cr_assert_null(quant_ftype_refusal("Q9_K"));
}

Test(mix, moe_expert_without_layer_is_refused)
{
    const struct quant_mix_model mm = {.n_layers = 16, .n_attn_v = 16, .n_gqa = 4, .n_expert = 16};
    struct quant_mix mix;
    cr_assert(quant_mix_init_model(&mix, QUANT_FTYPE_Q4_K_M, &mm));
    cr_assert_eq(quant_mix_type(&mix, "blk.16.ffn_down_exps.weight", 3, 256, DTYPE_F32), -1);
    cr_assert_eq(quant_mix_type(&mix, "ffn_up_exps.weight", 3, 256, DTYPE_F32), -1);
    cr_assert_eq(quant_mix_type(&mix, "blk.0.ffn_down_exps.weight", 3, 256, DTYPE_F32), DTYPE_Q6_K);
    /* Rows of 48 fit no block at all: F16, as llama-quantize falls back. */
    cr_assert_eq(quant_mix_type(&mix, "blk.1.attn_q.weight", 2, 48, DTYPE_F32), DTYPE_F16);
    cr_assert(!quant_mix_init_model(&mix, 36 /* TQ1_0 */, &mm));
    cr_assert_eq(quant_ftype_rules_from_name("IQ1_M"), QUANT_FTYPE_IQ1_M);
}
