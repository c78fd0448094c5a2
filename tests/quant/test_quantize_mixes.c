/* test_quantize_mixes — `ferry quantize`'s mixes written, loaded and run.
 *
 * A small Llama model written in the test (4 layers, dim 256, 8 heads sharing 2 KV heads, ffn 512, vocab 256:
 * every row fits the 256-element blocks, so the Q2_K ... IQ4_XS blocks themselves are exercised) is quantized
 * in each mix ferry writes. Its tensor types must be the ones llama.cpp's llama_tensor_get_type gives (the
 * table below, read from src/llama-quant.cpp of lcp0336), and the quantized model must run on the CPU backend
 * and stay close to the F32 model over a 24-token greedy continuation (teacher-forced): the relative RMS
 * error of the logits within the stated bound, the same top token at most positions, and more bits never
 * worse than fewer (Q2_K > Q3_K_M > Q4_K_M > Q5_K_M > Q6_K in error). stories260K (a trained model, rows of
 * 64 that fit no 256-block: every K type falls back to a 32-block type, as llama-quantize does) is run the
 * same way when
 * ../shared/testdata has it.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kernels/core/status.h"
#include "qgen.h"
#include "qrun.h"
#include "runtime/engine.h"
#include "weights/model_file.h"
#include "weights/quantize.h"
#include "wtest.h"

#define N_LAYERS 4
#define DIM      256
#define N_VOCAB  256
#define N_GEN    24

static const struct qgen_spec spec = {"mixrun", N_LAYERS, DIM, 8, 2, 32, 512, N_VOCAB, 0, 0, 1, 0, 0};

/* The model of spec with well-conditioned weights: qgen's values (sums of four uniforms, standard deviation
 * 0.58) scaled to unit gain per row, the head 4x sharper so that the top token is clear; norms 1 + 0.1 g. */
static void write_model_of(const char *path, const struct qgen_spec *sp)
{
    char err[256] = "";
    struct gguf_writer *w;
    CHECK(gguf_writer_init(&w, err));
    add_metadata(w, sp, err);
    struct gen_tensor *t = malloc(sizeof *t * (size_t)(12 * sp->n_layers + 4));
    const int n = gen_tensors(sp, t);
    for (int i = 0; i < n; i++) {
        const int64_t ne[3] = {t[i].cols, t[i].rows, t[i].experts};
        CHECK(gguf_writer_tensor(w, t[i].name, DTYPE_F32, t[i].experts ? 3 : t[i].rows ? 2 : 1, ne, err));
    }
    CHECK(gguf_writer_open(w, path, err));
    for (int i = 0; i < n; i++) {
        const int64_t rows = (t[i].rows ? t[i].rows : 1) * (t[i].experts ? t[i].experts : 1),
                      cols = t[i].cols;
        const double scale =
            !t[i].rows ? 0.1 : (strcmp(t[i].name, "output.weight") ? 1.0 : 4.0) / sqrt(cols) / 0.58;
        float *v = malloc(sizeof(float) * (size_t)(rows * cols));
        for (int64_t e = 0; e < rows * cols; e++)
            v[e] = (float)((t[i].rows ? 0.0 : 1.0) + scale * base_value(100 + i, e));
        CHECK(gguf_writer_data(w, v, sizeof(float) * (size_t)(rows * cols), err));
        free(v);
    }
    CHECK(gguf_writer_finish(w, err));
    gguf_writer_free(w);
    free(t);
}

static void write_model(const char *path)
{
    write_model_of(path, &spec);
}

/* Logits (n, V) of toks fed one at a time on the CPU backend. */
static float *run_logits(const char *path, const int32_t *toks, int n, int *V_out)
{
    char err[256] = "";
    struct model_file *mf;
    cr_assert_eq(model_file_open(path, &mf, NULL, NULL, err), FERRY_OK, "%s: %s", path, err);
    struct engine_params p = engine_default_params();
    p.backend = ENGINE_BACKEND_CPU;
    p.ctx_size = 64;
    p.n_threads = 2;
    p.cpu_int8 = 0; /* x in f32: the products of the stored blocks, exactly */
    p.kv_type = KV_F32;
    struct engine *e = NULL;
    cr_assert_eq(engine_init(&e, mf, &p, err), FERRY_OK, "%s: %s", path, err);
    const int V = engine_hparams(e)->n_vocab;
    float *out = malloc(sizeof(float) * (size_t)V * (size_t)n);
    qrun_steps(e, toks, n, out);
    engine_free(e);
    model_file_close(mf);
    *V_out = V;
    return out;
}

static int argmax(const float *x, int n)
{
    int best = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return best;
}

/* The F32 model's greedy continuation of prompt: toks[0..n) (prompt first). */
static void greedy(const char *path, int32_t *toks, int n_prompt, int n)
{
    for (int i = n_prompt; i < n; i++) {
        int V;
        float *lg = run_logits(path, toks, i, &V);
        toks[i] = argmax(lg + (size_t)V * (i - 1), V);
        free(lg);
    }
}

struct mix_case {
    const char *type;
    double rel_rms; /* relative RMS error of all positions' logits at most */
    int min_top1;   /* positions (of N_GEN) whose top token is the F32 model's, at least */
};

/* Relative RMS error of the logits of path against ref (n positions), and the top-1 agreement count. */
static double compare(const char *path, const int32_t *toks, int n, const float *ref, int V, int *top1)
{
    int V2;
    float *lg = run_logits(path, toks, n, &V2);
    cr_assert_eq(V2, V);
    double num = 0, den = 0;
    *top1 = 0;
    for (int i = 0; i < n; i++) {
        for (int v = 0; v < V; v++) {
            const double d = (double)lg[(size_t)V * i + v] - ref[(size_t)V * i + v];
            num += d * d;
            den += (double)ref[(size_t)V * i + v] * ref[(size_t)V * i + v];
        }
        *top1 += argmax(lg + (size_t)V * i, V) == argmax(ref + (size_t)V * i, V);
    }
    free(lg);
    cr_assert(isfinite(num) && den > 0, "%s: logits not finite", path);
    return sqrt(num / den);
}

/* ---- the types of each tensor ----------------------------------------------------------------------------
 *
 * llama_tensor_get_type (lcp0336) for this model: 4 layers (use_more_bits(i, 4) picks layers 2 and 3: i >=
 * 7n/8 or (i - n/8) % 3 == 2), n_heads / n_kv_heads = 4, an output head, every row a multiple of 256.
 * Columns: token_embd, output, attn_q, attn_k, attn_v of layers 0-3, attn_output, ffn_gate, ffn_up, ffn_down
 * of layers 0-3. */
struct mix_types {
    const char *type;
    const char *embd, *output, *q, *k, *v[N_LAYERS], *o, *gate, *up, *down[N_LAYERS];
};

static const struct mix_types expected_types[] = {
    /* Q2_K: attn_v Q4_K (n_gqa >= 4), attn_output Q3_K, ffn_down Q3_K. */
    {"Q2_K",
     "Q2_K",
     "Q6_K",
     "Q2_K",
     "Q2_K",
     {"Q4_K", "Q4_K", "Q4_K", "Q4_K"},
     "Q3_K",
     "Q2_K",
     "Q2_K",
     {"Q3_K", "Q3_K", "Q3_K", "Q3_K"}},
    /* Q3_K_S: no bumps for a dense model below 70B. */
    {"Q3_K_S",
     "Q3_K",
     "Q6_K",
     "Q3_K",
     "Q3_K",
     {"Q3_K", "Q3_K", "Q3_K", "Q3_K"},
     "Q3_K",
     "Q3_K",
     "Q3_K",
     {"Q3_K", "Q3_K", "Q3_K", "Q3_K"}},
    /* Q3_K_M: the first two attn_v Q5_K, the rest Q4_K; attn_output Q4_K; ffn_down Q5_K below n/16 (none
     * here), else Q4_K. */
    {"Q3_K_M",
     "Q3_K",
     "Q6_K",
     "Q3_K",
     "Q3_K",
     {"Q5_K", "Q5_K", "Q4_K", "Q4_K"},
     "Q4_K",
     "Q3_K",
     "Q3_K",
     {"Q4_K", "Q4_K", "Q4_K", "Q4_K"}},
    /* Q3_K_L: attn_v, attn_output, ffn_down Q5_K. */
    {"Q3_K_L",
     "Q3_K",
     "Q6_K",
     "Q3_K",
     "Q3_K",
     {"Q5_K", "Q5_K", "Q5_K", "Q5_K"},
     "Q5_K",
     "Q3_K",
     "Q3_K",
     {"Q5_K", "Q5_K", "Q5_K", "Q5_K"}},
    /* Q4_K_S: the first four attn_v Q5_K; ffn_down Q5_K below n/8 (none here). */
    {"Q4_K_S",
     "Q4_K",
     "Q6_K",
     "Q4_K",
     "Q4_K",
     {"Q5_K", "Q5_K", "Q5_K", "Q5_K"},
     "Q4_K",
     "Q4_K",
     "Q4_K",
     {"Q4_K", "Q4_K", "Q4_K", "Q4_K"}},
    /* Q4_K_M / Q5_K_M: attn_v and ffn_down Q6_K where use_more_bits. */
    {"Q4_K_M",
     "Q4_K",
     "Q6_K",
     "Q4_K",
     "Q4_K",
     {"Q4_K", "Q4_K", "Q6_K", "Q6_K"},
     "Q4_K",
     "Q4_K",
     "Q4_K",
     {"Q4_K", "Q4_K", "Q6_K", "Q6_K"}},
    {"Q5_K_S",
     "Q5_K",
     "Q6_K",
     "Q5_K",
     "Q5_K",
     {"Q5_K", "Q5_K", "Q5_K", "Q5_K"},
     "Q5_K",
     "Q5_K",
     "Q5_K",
     {"Q5_K", "Q5_K", "Q5_K", "Q5_K"}},
    {"Q5_K_M",
     "Q5_K",
     "Q6_K",
     "Q5_K",
     "Q5_K",
     {"Q5_K", "Q5_K", "Q6_K", "Q6_K"},
     "Q5_K",
     "Q5_K",
     "Q5_K",
     {"Q5_K", "Q5_K", "Q6_K", "Q6_K"}},
    {"Q6_K",
     "Q6_K",
     "Q6_K",
     "Q6_K",
     "Q6_K",
     {"Q6_K", "Q6_K", "Q6_K", "Q6_K"},
     "Q6_K",
     "Q6_K",
     "Q6_K",
     {"Q6_K", "Q6_K", "Q6_K", "Q6_K"}},
    /* IQ4_NL / IQ4_XS: attn_v Q5_K (n_gqa >= 4); ffn_down Q5_K below n/8 without an importance matrix (none).
     */
    {"IQ4_NL",
     "IQ4_NL",
     "Q6_K",
     "IQ4_NL",
     "IQ4_NL",
     {"Q5_K", "Q5_K", "Q5_K", "Q5_K"},
     "IQ4_NL",
     "IQ4_NL",
     "IQ4_NL",
     {"IQ4_NL", "IQ4_NL", "IQ4_NL", "IQ4_NL"}},
    {"IQ4_XS",
     "IQ4_XS",
     "Q6_K",
     "IQ4_XS",
     "IQ4_XS",
     {"Q5_K", "Q5_K", "Q5_K", "Q5_K"},
     "IQ4_XS",
     "IQ4_XS",
     "IQ4_XS",
     {"IQ4_XS", "IQ4_XS", "IQ4_XS", "IQ4_XS"}},
    /* MXFP4_MOE: no stacked experts in a dense model, so everything Q8_0, the head too. */
    {"MXFP4_MOE",
     "Q8_0",
     "Q8_0",
     "Q8_0",
     "Q8_0",
     {"Q8_0", "Q8_0", "Q8_0", "Q8_0"},
     "Q8_0",
     "Q8_0",
     "Q8_0",
     {"Q8_0", "Q8_0", "Q8_0", "Q8_0"}},
};

static const char *want_type(const struct mix_types *m, const char *name)
{
    int l = -1;
    char kind[48] = "";
    if (!strcmp(name, "token_embd.weight")) return m->embd;
    if (!strcmp(name, "output.weight")) return m->output;
    if (sscanf(name, "blk.%d.%47s", &l, kind) != 2 || l < 0 || l >= N_LAYERS) return "F32";
    if (!strcmp(kind, "attn_q.weight")) return m->q;
    if (!strcmp(kind, "attn_k.weight")) return m->k;
    if (!strcmp(kind, "attn_v.weight")) return m->v[l];
    if (!strcmp(kind, "attn_output.weight")) return m->o;
    if (!strcmp(kind, "ffn_gate.weight")) return m->gate;
    if (!strcmp(kind, "ffn_up.weight")) return m->up;
    if (!strcmp(kind, "ffn_down.weight")) return m->down[l];
    return "F32"; /* norms */
}

static void check_types(const char *path, const struct mix_types *m)
{
    char err[256] = "";
    struct model_file *mf;
    cr_assert_eq(model_file_open(path, &mf, NULL, NULL, err), FERRY_OK, "%s: %s", path, err);
    cr_assert_eq(mf->n_tensors, 9 * N_LAYERS + 3);
    for (int i = 0; i < mf->n_tensors; i++)
        cr_assert_str_eq(dtype_name(mf->tensors[i].type), want_type(m, mf->tensors[i].name), "%s: %s",
                         m->type, mf->tensors[i].name);
    model_file_close(mf);
}

Test(quantize_mixes, every_mix_types_and_logits, .timeout = 300)
{
    /* Against the F32 model: measured 2026-12-07 on x86-64 (rel RMS, top-1 of 24): Q2_K 0.739 3, Q3_K_S 0.545
     * 7, Q3_K_M 0.450 8, Q3_K_L 0.410 13, Q4_K_S 0.270 14, Q4_K_M 0.301 13, Q5_K_S 0.136 18, Q5_K_M 0.133 17,
     * Q6_K 0.086 21, IQ4_NL 0.270 16, IQ4_XS 0.276 17, MXFP4_MOE (all Q8_0 here) 0.028 24. This random model
     * amplifies weight noise about fourfold (the weights' own errors: Q2_K 0.30, Q3_K 0.15, Q4_K 0.071, Q5_K
     * 0.036, Q6_K 0.018 of their RMS), so its top token is a weak signal: the bounds are on the error, with
     * top-1 floors a few positions below what was measured. */
    static const struct mix_case cases[] = {
        {"Q2_K", 0.85, 1},    {"Q3_K_S", 0.65, 4},  {"Q3_K_M", 0.55, 5},  {"Q3_K_L", 0.5, 9},
        {"Q4_K_S", 0.35, 10}, {"Q4_K_M", 0.37, 10}, {"Q5_K_S", 0.18, 14}, {"Q5_K_M", 0.18, 14},
        {"Q6_K", 0.11, 18},   {"IQ4_NL", 0.35, 12}, {"IQ4_XS", 0.35, 12}, {"MXFP4_MOE", 0.04, 22},
    };
    char in[4096], out[4096], deq[4096];
    qrun_tmp_path(in, sizeof in, "ferry-qmix", "f32.gguf");
    qrun_tmp_path(deq, sizeof deq, "ferry-qmix", "deq.gguf");
    write_model(in);
    int32_t toks[N_GEN] = {1, 17, 99, 203};
    greedy(in, toks, 4, N_GEN);
    int V;
    float *ref = run_logits(in, toks, N_GEN, &V);
    cr_assert_eq(V, N_VOCAB);
    double err_of[sizeof cases / sizeof cases[0]];
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        char name[64];
        snprintf(name, sizeof name, "%s.gguf", cases[c].type);
        qrun_tmp_path(out, sizeof out, "ferry-qmix", name);
        qrun_quantize(in, out, cases[c].type);
        check_types(out, &expected_types[c]);
        cr_assert_str_eq(expected_types[c].type, cases[c].type);
        int top1;
        err_of[c] = compare(out, toks, N_GEN, ref, V, &top1);
        fprintf(stderr, "mix %-9s rel rms %.4f top-1 %d/%d", cases[c].type, err_of[c], top1, N_GEN);
        cr_assert_leq(err_of[c], cases[c].rel_rms, "%s: logits relative RMS error %.3g", cases[c].type,
                      err_of[c]);
        cr_assert_geq(top1, cases[c].min_top1, "%s: top token agrees at %d of %d positions", cases[c].type,
                      top1, N_GEN);
        /* The products themselves: the quantized model computes what its own weights, dequantized to an F32
         * file, compute (x in f32 in both: only the order of sums differs). */
        qrun_quantize(out, deq, "F32");
        float *ref_deq = run_logits(deq, toks, N_GEN, &V);
        const double e_deq = compare(out, toks, N_GEN, ref_deq, V, &top1);
        fprintf(stderr, "; against its dequantized weights %.2g top-1 %d/%d\n", e_deq, top1, N_GEN);
        cr_assert_leq(e_deq, 1e-4, "%s: %.3g from its own dequantized weights", cases[c].type, e_deq);
        cr_assert_eq(top1, N_GEN, "%s: top token differs from its dequantized weights' at %d positions",
                     cases[c].type, N_GEN - top1);
        free(ref_deq);
        unlink(deq);
        unlink(out);
    }
    /* More bits, less error: Q2_K > Q3_K_S > Q3_K_M > Q4_K_M > Q5_K_M > Q6_K > Q8_0. */
    static const int order[] = {0, 1, 2, 5, 7, 8, 11};
    for (size_t i = 0; i + 1 < sizeof order / sizeof order[0]; i++)
        cr_assert_gt(err_of[order[i]], err_of[order[i + 1]], "%s %.3g <= %s %.3g", cases[order[i]].type,
                     err_of[order[i]], cases[order[i + 1]].type, err_of[order[i + 1]]);
    free(ref);
    unlink(in);
}

/* stories260K (trained; dim 64, ffn 172): greedy continuation of "Once upon a time" by the F32 file, then
 * each mix teacher-forced on it. Rows of 64 fit no 256-block, so the K mixes write Q4_0/Q5_0/Q5_1/Q8_0 (and
 * F16 for the 172-column ffn_down), as llama-quantize does. */
Test(quantize_mixes, stories260k_generates, .timeout = 120)
{
    /* Measured 2026-12-07 (rel RMS, top-1 of 24): Q2_K 0.168 24, Q3_K_M 0.114 24, Q4_K_M 0.052 24, Q5_K_M
     * 0.049 23, IQ4_XS 0.080 23, MXFP4_MOE (Q8_0 here) 0.0065 24. */
    static const struct mix_case cases[] = {
        {"Q2_K", 0.25, 20},    {"Q3_K_M", 0.17, 21}, {"Q4_K_M", 0.08, 22},
        {"Q5_K_M", 0.075, 22}, {"IQ4_XS", 0.12, 21}, {"MXFP4_MOE", 0.015, 23},
    };
    char in[4096], out[4096];
    if (!wt_testdata(in, sizeof in, "models/stories260K.gguf"))
        cr_skip_test("../shared/testdata/models/stories260K.gguf is absent");
    int32_t toks[N_GEN] = {1, 403, 407, 261, 378};
    greedy(in, toks, 5, N_GEN);
    int V;
    float *ref = run_logits(in, toks, N_GEN, &V);
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        char name[64];
        snprintf(name, sizeof name, "stories-%s.gguf", cases[c].type);
        qrun_tmp_path(out, sizeof out, "ferry-qmix", name);
        qrun_quantize(in, out, cases[c].type);
        int top1;
        const double e = compare(out, toks, N_GEN, ref, V, &top1);
        fprintf(stderr, "stories260K %-9s rel rms %.4f top-1 %d/%d\n", cases[c].type, e, top1, N_GEN);
        cr_assert_leq(e, cases[c].rel_rms, "%s: logits relative RMS error %.3g", cases[c].type, e);
        cr_assert_geq(top1, cases[c].min_top1, "%s: top token agrees at %d of %d positions", cases[c].type,
                      top1, N_GEN);
        unlink(out);
    }
    free(ref);
}

/* The CPU engine's default arithmetic follows the bytes of every matrix, experts included: a Q4_K_M expert
 * model computes with int8 x (as a dense Q4_K_M one does), its F32 original with f32 x. */
Test(quantize_mixes, expert_model_arithmetic_follows_its_experts)
{
    static const struct qgen_spec moe = {"mixmoe", 2, DIM, 8, 2, 32, 256, N_VOCAB, 0, 0, 1, 8, 2};
    char in[4096], out[4096];
    qrun_tmp_path(in, sizeof in, "ferry-qmoe", "f32.gguf");
    qrun_tmp_path(out, sizeof out, "ferry-qmoe", "q4km.gguf");
    write_model_of(in, &moe);
    qrun_quantize(in, out, "Q4_K_M");
    const char *paths[2] = {in, out}, *want[2] = {"x in f32", "x in int8"};
    for (int i = 0; i < 2; i++) {
        char err[256] = "";
        struct model_file *mf;
        cr_assert_eq(model_file_open(paths[i], &mf, NULL, NULL, err), FERRY_OK, "%s", err);
        cr_assert_eq(mf->hp.n_expert, 8);
        struct engine_params p = engine_default_params();
        p.backend = ENGINE_BACKEND_CPU;
        p.ctx_size = 64;
        struct engine *e = NULL;
        cr_assert_eq(engine_init(&e, mf, &p, err), FERRY_OK, "%s", err);
        cr_assert(strstr(engine_placement(e), want[i]), "%s: %s", paths[i], engine_placement(e));
        engine_free(e);
        model_file_close(mf);
    }
    unlink(in);
    unlink(out);
}
