/* The GPU sampler against the CPU sampler (runtime/sampler.c) on random logits: the same token in every case.
 *
 * Both sides implement one definition with the same arithmetic (kernels/core/sample_math.h: integer masses,
 * a deterministic exponential, the counter-based draw), so no case is excluded as "too close to a boundary":
 * the count of such exclusions is zero by construction and every row must match. Rows draw their options
 * from every control and their combinations: temperature (greedy included), top-k (1 to beyond the
 * vocabulary), top-p, min-p, repetition/presence/frequency penalties over a history, logit_bias (duplicates
 * and ids out of range), an allowed-token mask (the JSON mask), NaN and -inf logits, ties, seeds and steps,
 * logprobs (the chosen token's and the top n <= 20: ids equal, values within 2e-4 of the CPU's double
 * log-softmax). Vocabularies 7, 1000, 32000, 152064 and 262144 (the maximum); batches up to 64 rows; the
 * output of a row must not depend on the batch (the same rows permuted give the same tokens) nor on the run
 * (bitwise).
 */
#include "tests/cuda/cuda_test.h"

#include "kernels/cuda/sample.h"
#include "runtime/sampler.h"

struct host_row {
    struct sampler_params sp;
    struct logit_bias bias[12];
    int n_bias;
    int32_t hist[256]; /* accepted tokens, with repeats */
    int n_hist;
    int warm;       /* draws taken before this one */
    int mask_kind;  /* 0 none, 1 half the vocabulary, 2 three tokens */
    int n_logprobs; /* -1 none */
    int lp_token;   /* -1: the chosen token's logprob; else this token's (prompt logprobs) */
};

enum { OPT_ALL = -1, OPT_TEMP, OPT_TOPK, OPT_TOPP, OPT_MINP, OPT_PEN, OPT_BIAS, OPT_MASK, OPT_LP, N_OPT };

static void pick_row(struct host_row *r, int V, int only)
{
    memset(r, 0, sizeof *r);
    r->sp = sampler_default_params();
    r->sp.seed = rng_u64();
    r->warm = irand(4);
    r->n_logprobs = -1;
    r->lp_token = -1;
    const int all = only == OPT_ALL;
    static const float temps[] = {0.0f, 0.3f, 0.7f, 1.0f, 1.5f};
    r->sp.temperature = all || only == OPT_TEMP ? temps[irand(5)] : 0.8f;
    if (only == OPT_TEMP && irand(4) == 0) r->sp.temperature = 0.0f;
    if (all || only == OPT_TOPK) {
        const int ks[] = {0, 1, 2, 5, 40, 1000, V + 5};
        r->sp.top_k = ks[irand(7)];
    }
    if (all || only == OPT_TOPP) {
        static const float ps[] = {1.0f, 0.5f, 0.9f, 0.95f, 0.99f, 0.1f};
        r->sp.top_p = ps[irand(6)];
    }
    if (all || only == OPT_MINP) {
        static const float ms[] = {0.0f, 0.02f, 0.05f, 0.3f, 1.0f};
        r->sp.min_p = ms[irand(5)];
    }
    if (all || only == OPT_PEN) {
        static const float rp[] = {1.0f, 1.3f, 0.8f}, pp[] = {0.0f, 0.5f, -0.3f}, fp[] = {0.0f, 0.2f, 1.1f};
        r->sp.repetition_penalty = rp[irand(3)];
        r->sp.presence_penalty = pp[irand(3)];
        r->sp.frequency_penalty = fp[irand(3)];
        r->n_hist = irand(257);
        for (int i = 0; i < r->n_hist; i++) /* repeats: a small pool of ids, and some anywhere */
            r->hist[i] = irand(3) ? irand(V < 50 ? V : 50) : irand(V);
    }
    if (all || only == OPT_BIAS) {
        r->n_bias = irand(13);
        for (int i = 0; i < r->n_bias; i++) {
            const int k = irand(10);
            r->bias[i].token = k == 0 ? -1 : k == 1 ? V : k < 4 && i > 0 ? r->bias[i - 1].token : irand(V);
            r->bias[i].bias = (float)(irand(41) - 20) * 0.37f;
        }
        r->sp.logit_bias = r->bias;
        r->sp.n_logit_bias = r->n_bias;
    }
    if (all || only == OPT_MASK) r->mask_kind = irand(3);
    if (all || only == OPT_LP) {
        static const int ns[] = {-1, 0, 1, 5, 20};
        r->n_logprobs = ns[irand(5)];
        if (irand(3) == 0) r->lp_token = irand(V);
    }
}

/* Random logits: uniform in [-s, s] for a scale s that leaves all (s = 1) or few (s = 40) tokens within 30
 * of the best, sometimes rounded to 0.5 (ties everywhere), with a few NaN and -inf. */
static void fill_logits(float *l, int V)
{
    static const float scales[] = {1.0f, 5.0f, 12.0f, 40.0f};
    const float s = scales[irand(4)];
    const int ties = irand(4) == 0;
    for (int i = 0; i < V; i++) {
        float x = frand() * s;
        if (ties) x = roundf(x * 2.0f) * 0.5f;
        l[i] = x;
    }
    for (int k = irand(3); k > 0; k--) l[irand(V)] = NAN;
    for (int k = irand(3); k > 0; k--) l[irand(V)] = -INFINITY;
}

static void fill_mask(uint32_t *m, int V, int kind)
{
    const int words = (V + 31) / 32;
    memset(m, 0, (size_t)words * 4);
    for (int i = 0; i < V; i++) {
        const int on = kind == 1 ? irand(2) : 0;
        if (on) m[i / 32] |= 1u << (i % 32);
    }
    if (kind == 2)
        for (int k = 0; k < 3; k++) {
            const int t = irand(V);
            m[t / 32] |= 1u << (t % 32);
        }
}

struct batch_run {
    int32_t *tokens;
    struct kern_cuda_sample_lp *lp;
};

/* Runs rows[0..b) on the GPU with logits (b, V) and masks; returns tokens and logprobs (caller frees). */
static struct batch_run gpu_run(const struct host_row *rows, const int *order, int b, int V,
                                const float *logits, const uint32_t *masks, const struct sampler **cpu)
{
    const int words = (V + 31) / 32;
    struct kern_cuda_sample_row *kr = calloc((size_t)b, sizeof *kr);
    int32_t *btok = malloc(12 * (size_t)b * 4 + 4), *htok = malloc(256 * (size_t)b * 4 + 4);
    float *bval = malloc(12 * (size_t)b * 4 + 4);
    uint32_t *hcnt = malloc(256 * (size_t)b * 4 + 4);
    float *lg = malloc((size_t)b * V * 4);
    uint32_t *mk = malloc((size_t)b * words * 4 + 4);
    int nb = 0, nh = 0, nm = 0;
    for (int j = 0; j < b; j++) {
        const int i = order[j];
        const struct host_row *r = &rows[i];
        struct kern_cuda_sample_row *k = &kr[j];
        memcpy(lg + (size_t)j * V, logits + (size_t)i * V, (size_t)V * 4);
        k->temperature = r->sp.temperature;
        k->top_p = r->sp.top_p;
        k->min_p = r->sp.min_p;
        k->repetition_penalty = r->sp.repetition_penalty;
        k->presence_penalty = r->sp.presence_penalty;
        k->frequency_penalty = r->sp.frequency_penalty;
        k->top_k = r->sp.top_k;
        k->n_logprobs = r->n_logprobs;
        k->seed = r->sp.seed;
        k->step = sampler_step(cpu[i]);
        k->bias_begin = nb;
        for (int e = 0; e < r->n_bias; e++, nb++) btok[nb] = r->bias[e].token, bval[nb] = r->bias[e].bias;
        k->bias_end = nb;
        k->hist_begin = nh;
        nh += sampler_history(cpu[i], htok + nh, hcnt + nh, 256);
        k->hist_end = nh;
        k->mask_row = -1;
        k->lp_token = r->lp_token;
        if (r->mask_kind) {
            memcpy(mk + (size_t)nm * words, masks + (size_t)i * words, (size_t)words * 4);
            k->mask_row = nm++;
        }
    }
    struct kern_cuda_sample_batch B = {
        .logits = dev_upload(lg, (size_t)b * V * 4),
        .rows = dev_upload(kr, (size_t)b * sizeof *kr),
        .bias_tok = dev_upload(btok, (size_t)nb * 4),
        .bias_val = dev_upload(bval, (size_t)nb * 4),
        .hist_tok = dev_upload(htok, (size_t)nh * 4),
        .hist_cnt = dev_upload(hcnt, (size_t)nh * 4),
        .mask = dev_upload(mk, (size_t)nm * words * 4),
        .b = b,
        .n_vocab = V,
    };
    int32_t *dtok = dev_poison((size_t)b * 4);
    struct kern_cuda_sample_lp *dlp = dev_poison((size_t)b * sizeof *dlp);
    const size_t wsb = kern_cuda_sample_ws_size(b, V);
    void *ws = dev_poison(wsb);
    cr_assert_eq(kern_cuda_sample(&B, dtok, dlp, ws, wsb, 0), FERRY_OK);
    struct batch_run out = {malloc((size_t)b * 4), malloc((size_t)b * sizeof *out.lp)};
    dev_download(out.tokens, dtok, (size_t)b * 4);
    dev_download(out.lp, dlp, (size_t)b * sizeof *out.lp);
    cudaFree((void *)B.logits);
    cudaFree((void *)B.rows);
    cudaFree((void *)B.bias_tok);
    cudaFree((void *)B.bias_val);
    cudaFree((void *)B.hist_tok);
    cudaFree((void *)B.hist_cnt);
    cudaFree((void *)B.mask);
    cudaFree(dtok);
    cudaFree(dlp);
    cudaFree(ws);
    free(kr);
    free(btok);
    free(htok);
    free(bval);
    free(hcnt);
    free(lg);
    free(mk);
    return out;
}

static const char *opt_name(int o)
{
    static const char *n[] = {"temperature", "top_k", "top_p", "min_p",
                              "penalties",   "bias",  "mask",  "logprobs"};
    return o < 0 ? "all" : n[o];
}

/* b rows of vocabulary V with options from `only` (OPT_ALL: every option at random); each row's GPU token
 * and logprobs against its CPU sampler's, then the batch again in reverse order. */
static void check_batch(int V, int b, int only)
{
    struct host_row *rows = malloc((size_t)b * sizeof *rows);
    struct sampler **cpu = malloc((size_t)b * sizeof *cpu);
    float *logits = malloc((size_t)b * V * 4), *scratch = malloc((size_t)V * 4);
    uint32_t *masks = malloc((size_t)b * ((V + 31) / 32) * 4);
    int32_t *want = malloc((size_t)b * 4);
    int *order = malloc((size_t)b * sizeof *order);
    for (int i = 0; i < b; i++) {
        struct host_row *r = &rows[i];
        pick_row(r, V, only);
        cr_assert_eq(sampler_init(&cpu[i], &r->sp, V), FERRY_OK);
        for (int h = 0; h < r->n_hist; h++) sampler_accept(cpu[i], r->hist[h]);
        for (int k = 0; k < r->warm; k++) { /* earlier draws: only the step counter must carry over */
            fill_logits(scratch, V);
            (void)sampler_sample(cpu[i], scratch);
        }
        fill_logits(logits + (size_t)i * V, V);
        fill_mask(masks + (size_t)i * ((V + 31) / 32), V, r->mask_kind);
        order[i] = i;
    }
    struct batch_run g = gpu_run(rows, order, b, V, logits, masks, (const struct sampler **)cpu);
    for (int i = 0; i < b; i++) order[i] = b - 1 - i;
    struct batch_run g2 = gpu_run(rows, order, b, V, logits, masks, (const struct sampler **)cpu);
    int mismatches = 0, first_bad = -1;
    for (int i = 0; i < b; i++) {
        const struct host_row *r = &rows[i];
        memcpy(scratch, logits + (size_t)i * V, (size_t)V * 4);
        if (r->mask_kind) {
            const uint32_t *m = masks + (size_t)i * ((V + 31) / 32);
            for (int t = 0; t < V; t++)
                if (!((m[t / 32] >> (t % 32)) & 1u)) scratch[t] = -INFINITY;
        }
        want[i] = sampler_sample(cpu[i], scratch);
        if (g.tokens[i] != want[i]) {
            mismatches++;
            if (first_bad < 0) first_bad = i;
        }
        cr_assert_eq(g2.tokens[b - 1 - i], g.tokens[i],
                     "V %d row %d: the token depends on the row's place in the batch", V, i);
        if (r->n_logprobs >= 0) {
            int32_t ids[20];
            float lps[20];
            const int n = r->n_logprobs > 20 ? 20 : r->n_logprobs < V ? r->n_logprobs : V;
            const float lp = sampler_logprob(logits + (size_t)i * V, V,
                                             r->lp_token >= 0 ? r->lp_token : g.tokens[i], n, ids, lps);
            const struct kern_cuda_sample_lp *o = &g.lp[i];
            cr_assert(fabsf(o->logprob - lp) <= 2e-4f || (isinf(lp) && o->logprob == lp),
                      "V %d row %d: logprob %g vs CPU %g", V, i, o->logprob, lp);
            cr_assert_eq(o->n_top, n, "V %d row %d: %d top entries, want %d", V, i, o->n_top, n);
            for (int k = 0; k < n; k++) {
                cr_assert_eq(o->top_id[k], ids[k], "V %d row %d top %d: id %d vs CPU %d", V, i, k,
                             o->top_id[k], ids[k]);
                cr_assert(fabsf(o->top_lp[k] - lps[k]) <= 2e-4f || o->top_lp[k] == lps[k],
                          "V %d row %d top %d: %g vs %g", V, i, k, o->top_lp[k], lps[k]);
            }
            cr_assert_eq(memcmp(&g.lp[i], &g2.lp[b - 1 - i], sizeof g.lp[i]), 0, "V %d row %d: logprobs vary",
                         V, i);
        }
    }
    if (mismatches) {
        const struct host_row *r = &rows[first_bad];
        cr_assert_fail(
            "V %d options %s: %d of %d rows differ; first: row %d GPU %d CPU %d (T %g top_k %d top_p %g "
            "min_p %g rep %g pres %g freq %g bias %d hist %d mask %d warm %d seed %llu)",
            V, opt_name(only), mismatches, b, first_bad, g.tokens[first_bad], want[first_bad],
            r->sp.temperature, r->sp.top_k, r->sp.top_p, r->sp.min_p, r->sp.repetition_penalty,
            r->sp.presence_penalty, r->sp.frequency_penalty, r->n_bias, r->n_hist, r->mask_kind, r->warm,
            (unsigned long long)r->sp.seed);
    }
    for (int i = 0; i < b; i++) sampler_free(cpu[i]);
    free(rows);
    free(cpu);
    free(logits);
    free(scratch);
    free(masks);
    free(want);
    free(order);
    free(g.tokens);
    free(g.lp);
    free(g2.tokens);
    free(g2.lp);
}

Test(cuda_sample, each_option_alone)
{
    SKIP_WITHOUT_GPU();
    rng_seed(71);
    for (int o = 0; o < N_OPT; o++) {
        check_batch(1000, 64, o);
        check_batch(32000, 16, o);
    }
}

Test(cuda_sample, all_options_combined)
{
    SKIP_WITHOUT_GPU();
    rng_seed(72);
    for (int round = 0; round < 6; round++) check_batch(1000, 64, OPT_ALL);
    check_batch(7, 64, OPT_ALL);
    check_batch(32000, 64, OPT_ALL);
    check_batch(152064, 32, OPT_ALL);
    check_batch(152064, 1, OPT_ALL);
    check_batch(KERN_SAMPLE_MAX_VOCAB, 8, OPT_ALL);
}

/* The same inputs twice: bitwise the same outputs (tokens and logprobs). */
Test(cuda_sample, runs_are_bitwise_equal)
{
    SKIP_WITHOUT_GPU();
    rng_seed(73);
    const int V = 50000, b = 16;
    struct host_row rows[16];
    struct sampler *cpu[16];
    float *logits = malloc((size_t)b * V * 4);
    uint32_t *masks = malloc((size_t)b * ((V + 31) / 32) * 4);
    int order[16];
    for (int i = 0; i < b; i++) {
        pick_row(&rows[i], V, OPT_ALL);
        rows[i].n_logprobs = 20;
        cr_assert_eq(sampler_init(&cpu[i], &rows[i].sp, V), FERRY_OK);
        for (int h = 0; h < rows[i].n_hist; h++) sampler_accept(cpu[i], rows[i].hist[h]);
        fill_logits(logits + (size_t)i * V, V);
        fill_mask(masks + (size_t)i * ((V + 31) / 32), V, rows[i].mask_kind);
        order[i] = i;
    }
    struct batch_run a = gpu_run(rows, order, b, V, logits, masks, (const struct sampler **)cpu);
    struct batch_run c = gpu_run(rows, order, b, V, logits, masks, (const struct sampler **)cpu);
    cr_assert_eq(memcmp(a.tokens, c.tokens, (size_t)b * 4), 0);
    cr_assert_eq(memcmp(a.lp, c.lp, (size_t)b * sizeof *a.lp), 0);
    for (int i = 0; i < b; i++) sampler_free(cpu[i]);
    free(logits);
    free(masks);
    free(a.tokens);
    free(a.lp);
    free(c.tokens);
    free(c.lp);
}

/* Sizes and pointers are checked before anything is launched (runs without a GPU too). */
Test(cuda_sample, bad_arguments_refused)
{
    struct kern_cuda_sample_row row;
    memset(&row, 0, sizeof row);
    float lg[16];
    int32_t tok[1];
    char wsbuf[256];
    void *ws = (void *)(((uintptr_t)wsbuf + 15) & ~(uintptr_t)15);
    struct kern_cuda_sample_batch B = {.logits = lg, .rows = &row, .b = 1, .n_vocab = 16};
    cr_assert_eq(kern_cuda_sample_ws_size(1, 16), 64);
    cr_assert_eq(kern_cuda_sample(NULL, tok, NULL, ws, 64, 0), FERRY_ERR_INVALID);
    B.b = 0;
    cr_assert_eq(kern_cuda_sample(&B, tok, NULL, ws, 64, 0), FERRY_ERR_INVALID);
    B.b = 1;
    B.n_vocab = KERN_SAMPLE_MAX_VOCAB + 1;
    cr_assert_eq(kern_cuda_sample(&B, tok, NULL, ws, 64, 0), FERRY_ERR_INVALID);
    B.n_vocab = 16;
    cr_assert_eq(kern_cuda_sample(&B, tok, NULL, ws, 63, 0), FERRY_ERR_INVALID);
    cr_assert_eq(kern_cuda_sample(&B, tok, NULL, (char *)ws + 4, 64, 0), FERRY_ERR_INVALID);
    cr_assert_eq(kern_cuda_sample(&B, NULL, NULL, ws, 64, 0), FERRY_ERR_INVALID);
}

/* Small: what tests/gpu/attn_sample.sh runs under compute-sanitizer (every option, short rows). */
Test(cuda_sample, small_batch)
{
    SKIP_WITHOUT_GPU();
    rng_seed(74);
    check_batch(300, 8, OPT_ALL);
    check_batch(2100, 4, OPT_ALL);
}
