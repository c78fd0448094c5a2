/* moe: the router's top-k (softmax, ties to the lowest expert id, normalised or not) against hand-computed
 * values, and the experts' gathered products against the per-token reference at odd sizes, F32 and F16
 * weights, one thread and several; the shared expert (sigmoid-gated SwiGLU added onto the routed sum) against
 * its reference, gated and not. */
#include "kt_common.h"

#include "kernels/core/status.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/moe.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/threadpool.h"
#include "quant/dtype.h"

Test(moe, route_softmax_topk_and_ties)
{
    /* Token 0: experts 0, 2, 4 tie at the top; k = 2 takes 0 and 2 (the lowest ids). Token 1: all equal. */
    const float logits[2][5] = {{1.5f, 0.5f, 1.5f, -1.0f, 1.5f}, {0.25f, 0.25f, 0.25f, 0.25f, 0.25f}};
    int32_t ids[2 * 3];
    float w[2 * 3];
    cr_assert_eq(kern_cpu_moe_route(&logits[0][0], 2, 5, 2, 0, ids, w), FERRY_OK);
    cr_assert(ids[0] == 0 && ids[1] == 2 && ids[2] == 0 && ids[3] == 1, "%d %d %d %d", ids[0], ids[1], ids[2],
              ids[3]);
    const double z = 3 * exp(1.5) + exp(0.5) + exp(-1.0);
    cr_assert(fabs(w[0] - exp(1.5) / z) < 1e-6 && fabs(w[1] - exp(1.5) / z) < 1e-6);
    cr_assert(fabs(w[2] - 0.2) < 1e-6 && fabs(w[3] - 0.2) < 1e-6);
    cr_assert_eq(kern_cpu_moe_route(&logits[0][0], 2, 5, 3, 1, ids, w), FERRY_OK);
    cr_assert(ids[0] == 0 && ids[1] == 2 && ids[2] == 4 && ids[3] == 0 && ids[4] == 1 && ids[5] == 2);
    for (int i = 0; i < 6; i++) cr_assert(fabsf(w[i] - 1.0f / 3) < 1e-6f);
    /* Distinct values: descending order, normalised weights sum to 1. */
    const float l2[6] = {0.1f, 2.0f, -0.3f, 1.1f, 0.7f, 3.0f};
    cr_assert_eq(kern_cpu_moe_route(l2, 1, 6, 3, 1, ids, w), FERRY_OK);
    cr_assert(ids[0] == 5 && ids[1] == 1 && ids[2] == 3);
    const double s = exp(3.0) + exp(2.0) + exp(1.1);
    cr_assert(fabs(w[0] - exp(3.0) / s) < 1e-6 && fabs(w[2] - exp(1.1) / s) < 1e-6);
    cr_assert_eq(kern_cpu_moe_route(l2, 1, 6, 7, 1, ids, w), FERRY_ERR_INVALID);
    cr_assert_eq(kern_cpu_moe_route(l2, 1, 6, 0, 1, ids, w), FERRY_ERR_INVALID);
}

/* v (rows, cols) stored in wt (returned, malloc'd), and v replaced by the stored values decoded back to f32:
 * what the reference reads. */
static void *stored(enum dtype wt, float *v, int rows, int cols)
{
    const size_t rb = dtype_row_size(wt, cols);
    char *s = malloc(rb * (size_t)rows);
    for (int r = 0; r < rows; r++) {
        cr_assert(dtype_from_f32(wt, v + (size_t)r * cols, s + rb * r, cols));
        cr_assert(dtype_to_f32(wt, s + rb * r, v + (size_t)r * cols, cols));
    }
    return s;
}

/* clamped: gpt-oss's experts, with biases (large enough to reach both clamps) and the clamped SwiGLU. */
static void check_ffn_act(enum dtype wt, int n_threads, int dim, int ffn, int clamped)
{
    const int n = 13, n_expert = 7, k = 3;
    kt_seed(5 + (uint64_t)wt);
    float *x = malloc(sizeof(float) * n * dim), *logits = malloc(sizeof(float) * n * n_expert);
    float *g = malloc(sizeof(float) * n_expert * ffn * dim),
          *u = malloc(sizeof(float) * n_expert * ffn * dim),
          *d = malloc(sizeof(float) * n_expert * dim * ffn);
    kt_fill(x, (size_t)n * dim, -1.0f, 1.0f);
    kt_fill(logits, (size_t)n * n_expert, -2.0f, 2.0f);
    kt_fill(g, (size_t)n_expert * ffn * dim, -0.3f, 0.3f);
    kt_fill(u, (size_t)n_expert * ffn * dim, -0.3f, 0.3f);
    kt_fill(d, (size_t)n_expert * dim * ffn, -0.3f, 0.3f);
    /* Expert 6 is chosen by no token: it must cost nothing and change nothing. */
    for (int t = 0; t < n; t++) logits[(size_t)t * n_expert + 6] = -50.0f;
    /* Stored in wt; the reference reads the same values decoded back to f32. */
    void *gs = stored(wt, g, n_expert * ffn, dim), *us = stored(wt, u, n_expert * ffn, dim),
         *ds = stored(wt, d, n_expert * dim, ffn);
    int32_t ids[13 * 3];
    float w[13 * 3];
    cr_assert_eq(kern_cpu_moe_route(logits, n, n_expert, k, 1, ids, w), FERRY_OK);
    float *gb = malloc(sizeof(float) * n_expert * ffn), *ub = malloc(sizeof(float) * n_expert * ffn),
          *db = malloc(sizeof(float) * n_expert * dim);
    kt_fill(gb, (size_t)n_expert * ffn, -4.0f, 9.0f);
    kt_fill(ub, (size_t)n_expert * ffn, -9.0f, 9.0f);
    kt_fill(db, (size_t)n_expert * dim, -1.0f, 1.0f);
    const struct kern_cpu_moe_experts ex = {.gate = gs,
                                            .up = us,
                                            .down = ds,
                                            .gate_t = wt,
                                            .up_t = wt,
                                            .down_t = wt,
                                            .n_expert = n_expert,
                                            .dim = dim,
                                            .ffn = ffn,
                                            .gate_b = clamped ? gb : NULL,
                                            .up_b = clamped ? ub : NULL,
                                            .down_b = clamped ? db : NULL,
                                            .act = clamped ? KERN_CPU_MOE_SWIGLU_CLAMPED : KERN_CPU_MOE_SILU,
                                            .alpha = 1.702f,
                                            .limit = 7.0f};
    struct kern_cpu_moe_experts ex_ref = ex;
    ex_ref.gate = g, ex_ref.up = u, ex_ref.down = d;
    ex_ref.gate_t = ex_ref.up_t = ex_ref.down_t = DTYPE_F32;
    float *ws = malloc(sizeof(float) * kern_cpu_moe_ws_floats(&ex, n));
    float *y = malloc(sizeof(float) * n * dim), *ref = malloc(sizeof(float) * n * dim);
    struct tpool *tp;
    cr_assert_eq(tpool_init(&tp, n_threads), FERRY_OK);
    cr_assert_eq(kern_cpu_moe_ffn(y, x, ids, w, n, k, &ex, ws, tp), FERRY_OK);
    if (clamped)
        cr_assert_eq(kern_cpu_moe_ref_ex(ref, x, ids, w, n, k, &ex_ref), FERRY_OK);
    else
        cr_assert_eq(kern_cpu_moe_ref(ref, x, ids, w, n, k, g, u, d, n_expert, dim, ffn), FERRY_OK);
    float amax = 0;
    for (int i = 0; i < n * dim; i++) amax = fmaxf(amax, fabsf(ref[i]));
    cr_assert(amax > 1e-2f, "degenerate reference");
    /* F16 weights: the products round x to the weights' type on some paths; the reference uses f32 x. Q8_0:
     * f32 x times the decoded blocks (the default arithmetic), as the reference computes. */
    const float tol = (wt == DTYPE_F16 ? 3e-3f : 1e-5f) * amax;
    for (int i = 0; i < n * dim; i++)
        cr_assert(fabsf(y[i] - ref[i]) <= tol, "%s [%d] %g vs %g", dtype_name(wt), i, y[i], ref[i]);
    /* An expert id out of range is refused, not read. */
    ids[4] = n_expert;
    cr_assert_eq(kern_cpu_moe_ffn(y, x, ids, w, n, k, &ex, ws, tp), FERRY_ERR_RANGE);
    tpool_free(tp);
    free(x), free(logits), free(g), free(u), free(d), free(gs), free(us), free(ds), free(ws), free(y),
        free(ref), free(gb), free(ub), free(db);
}

static void check_ffn(enum dtype wt, int n_threads, int dim, int ffn)
{
    check_ffn_act(wt, n_threads, dim, ffn, 0);
}

Test(moe, ffn_f32_matches_reference)
{
    check_ffn(DTYPE_F32, 1, 37, 23);
}
Test(moe, ffn_f16_matches_reference_threads)
{
    check_ffn(DTYPE_F16, 3, 37, 23);
}
Test(moe, ffn_q8_0_matches_reference)
{
    check_ffn(DTYPE_Q8_0, 2, 96, 64);
}

/* gpt-oss's experts: biases on gate, up and down, the clamped SwiGLU; F32 at odd sizes, MXFP4 blocks (the
 * released checkpoints' type) on three threads. */
Test(moe, ffn_clamped_biased_f32_matches_reference)
{
    check_ffn_act(DTYPE_F32, 1, 37, 23, 1);
}
Test(moe, ffn_clamped_biased_mxfp4_matches_reference)
{
    check_ffn_act(DTYPE_MXFP4, 3, 96, 64, 1);
}

/* The shared expert (Qwen3.5-MoE): y += sigmoid(x · gate_inp) · down(silu(gate x) · up x), added onto what y
 * holds; at odd sizes, stored in wt, with and without its gate, against the double-sum reference. */
static void check_shared(enum dtype wt, int n_threads, int dim, int ffn, int gated)
{
    const int n = 11;
    kt_seed(17 + (uint64_t)wt);
    float *x = malloc(sizeof(float) * n * dim), *gi = malloc(sizeof(float) * dim);
    float *g = malloc(sizeof(float) * ffn * dim), *u = malloc(sizeof(float) * ffn * dim),
          *d = malloc(sizeof(float) * dim * ffn);
    kt_fill(x, (size_t)n * dim, -1.0f, 1.0f);
    kt_fill(gi, (size_t)dim, -0.5f, 0.5f);
    kt_fill(g, (size_t)ffn * dim, -0.3f, 0.3f);
    kt_fill(u, (size_t)ffn * dim, -0.3f, 0.3f);
    kt_fill(d, (size_t)dim * ffn, -0.3f, 0.3f);
    void *gs = stored(wt, g, ffn, dim), *us = stored(wt, u, ffn, dim), *ds = stored(wt, d, dim, ffn);
    const struct kern_cpu_moe_shared sh = {.gate = gs,
                                           .up = us,
                                           .down = ds,
                                           .gate_t = wt,
                                           .up_t = wt,
                                           .down_t = wt,
                                           .dim = dim,
                                           .ffn = ffn,
                                           .gate_inp = gated ? gi : NULL};
    struct kern_cpu_moe_shared sh_ref = sh;
    sh_ref.gate = g, sh_ref.up = u, sh_ref.down = d;
    sh_ref.gate_t = sh_ref.up_t = sh_ref.down_t = DTYPE_F32;
    float *ws = malloc(sizeof(float) * kern_cpu_moe_shared_ws_floats(&sh, n));
    float *y = malloc(sizeof(float) * n * dim), *ref = malloc(sizeof(float) * n * dim);
    /* y starts from the routed experts' sum: the shared expert adds to it. */
    kt_fill(y, (size_t)n * dim, -0.2f, 0.2f);
    memcpy(ref, y, sizeof(float) * n * dim);
    struct tpool *tp;
    cr_assert_eq(tpool_init(&tp, n_threads), FERRY_OK);
    cr_assert_eq(kern_cpu_moe_shared(y, x, n, &sh, ws, tp), FERRY_OK);
    cr_assert_eq(kern_cpu_moe_shared_ref(ref, x, n, &sh_ref), FERRY_OK);
    float amax = 0;
    for (int i = 0; i < n * dim; i++) amax = fmaxf(amax, fabsf(ref[i]));
    cr_assert(amax > 1e-2f, "degenerate reference");
    const float tol = (wt == DTYPE_F16 ? 3e-3f : 1e-5f) * amax;
    for (int i = 0; i < n * dim; i++)
        cr_assert(fabsf(y[i] - ref[i]) <= tol, "%s [%d] %g vs %g", dtype_name(wt), i, y[i], ref[i]);
    /* The gate matters: without it the same inputs give another sum. */
    if (gated) {
        struct kern_cpu_moe_shared open = sh_ref;
        open.gate_inp = NULL;
        float *alt = malloc(sizeof(float) * n * dim);
        memset(alt, 0, sizeof(float) * n * dim);
        memset(ref, 0, sizeof(float) * n * dim);
        cr_assert_eq(kern_cpu_moe_shared_ref(alt, x, n, &open), FERRY_OK);
        cr_assert_eq(kern_cpu_moe_shared_ref(ref, x, n, &sh_ref), FERRY_OK);
        double diff = 0;
        for (int i = 0; i < n * dim; i++) diff = fmax(diff, fabs((double)alt[i] - ref[i]));
        cr_assert(diff > 1e-3, "the sigmoid gate changed nothing");
        free(alt);
    }
    cr_assert_eq(kern_cpu_moe_shared(y, x, 0, &sh, ws, tp), FERRY_ERR_INVALID);
    tpool_free(tp);
    free(x), free(gi), free(g), free(u), free(d), free(gs), free(us), free(ds), free(ws), free(y), free(ref);
}

Test(moe, shared_expert_f32_matches_reference)
{
    check_shared(DTYPE_F32, 1, 37, 23, 1);
    check_shared(DTYPE_F32, 2, 37, 23, 0);
}
Test(moe, shared_expert_f16_matches_reference_threads)
{
    check_shared(DTYPE_F16, 3, 45, 29, 1);
}

/* The K-quant mix of a Q4_K_M MoE file (gate and up Q4_K, down Q6_K) in the int8 arithmetic, at odd counts
 * (11 tokens, 9 experts, 3 per token): expert 7 chosen by every token, expert 8 by four, others by one or
 * several, expert 5 by none, each token's picks not in id order. Against (a) the products one token and one
 * expert at a time through kern_cpu_matmul (bitwise: the int8 products of a row do not depend on the batch,
 * and y's terms add in ascending expert id), (b) the double-sum reference on the decoded weights, within x's
 * and h's int8 rounding, and (c) itself on pools of 1, 3 and 4 threads (bitwise). */
Test(moe, ffn_kquant_int8_matches_per_expert_products_and_reference)
{
    const int n = 11, n_expert = 9, k = 3, dim = 512, ffn = 256;
    kt_seed(29);
    float *x = malloc(sizeof(float) * n * dim), *g = malloc(sizeof(float) * n_expert * ffn * dim),
          *u = malloc(sizeof(float) * n_expert * ffn * dim),
          *d = malloc(sizeof(float) * n_expert * dim * ffn);
    kt_fill(x, (size_t)n * dim, -1.0f, 1.0f);
    kt_fill(g, (size_t)n_expert * ffn * dim, -0.1f, 0.1f);
    kt_fill(u, (size_t)n_expert * ffn * dim, -0.1f, 0.1f);
    kt_fill(d, (size_t)n_expert * dim * ffn, -0.1f, 0.1f);
    void *gs = stored(DTYPE_Q4_K, g, n_expert * ffn, dim), *us = stored(DTYPE_Q4_K, u, n_expert * ffn, dim),
         *ds = stored(DTYPE_Q6_K, d, n_expert * dim, ffn);
    const int32_t ids[11 * 3] = {8, 7, 0, 6, 7, 1, 4, 7, 2, 7, 8, 3, 8, 4, 7, 6, 7,
                                 0, 7, 1, 2, 3, 7, 6, 8, 7, 1, 0, 2, 7, 7, 6, 4};
    float w[11 * 3];
    for (int i = 0; i < n * k; i++) w[i] = kt_uniform(0.1f, 0.6f);
    const struct kern_cpu_moe_experts ex = {.gate = gs,
                                            .up = us,
                                            .down = ds,
                                            .gate_t = DTYPE_Q4_K,
                                            .up_t = DTYPE_Q4_K,
                                            .down_t = DTYPE_Q6_K,
                                            .n_expert = n_expert,
                                            .dim = dim,
                                            .ffn = ffn};
    kern_cpu_matmul_set_act(KERN_CPU_ACT_INT8);
    float *ws = malloc(sizeof(float) * kern_cpu_moe_ws_floats(&ex, n));
    float *y[3], *one = malloc(sizeof(float) * n * dim), *ref = malloc(sizeof(float) * n * dim);
    const int pools[3] = {1, 3, 4};
    for (int p = 0; p < 3; p++) {
        struct tpool *tp;
        cr_assert_eq(tpool_init(&tp, pools[p]), FERRY_OK);
        y[p] = malloc(sizeof(float) * n * dim);
        cr_assert_eq(kern_cpu_moe_ffn(y[p], x, ids, w, n, k, &ex, ws, tp), FERRY_OK);
        tpool_free(tp);
    }
    for (int p = 1; p < 3; p++)
        cr_assert(!memcmp(y[0], y[p], sizeof(float) * n * dim), "%d threads differ from 1", pools[p]);
    /* (a) token by token, its experts in ascending id */
    const size_t gr = dtype_row_size(DTYPE_Q4_K, dim), dr = dtype_row_size(DTYPE_Q6_K, ffn);
    float *gt = malloc(sizeof(float) * ffn), *ut = malloc(sizeof(float) * ffn),
          *dt = malloc(sizeof(float) * dim);
    for (int t = 0; t < n; t++) {
        float *yt = one + (size_t)t * dim;
        memset(yt, 0, sizeof(float) * dim);
        for (int e = 0; e < n_expert; e++)
            for (int j = 0; j < k; j++) {
                if (ids[t * k + j] != e) continue;
                cr_assert_eq(kern_cpu_matmul(gt, x + (size_t)t * dim, (const char *)gs + gr * ffn * e,
                                             DTYPE_Q4_K, NULL, 1, ffn, dim, NULL),
                             FERRY_OK);
                cr_assert_eq(kern_cpu_matmul(ut, x + (size_t)t * dim, (const char *)us + gr * ffn * e,
                                             DTYPE_Q4_K, NULL, 1, ffn, dim, NULL),
                             FERRY_OK);
                kern_cpu_silu_mul(gt, ut, ffn);
                cr_assert_eq(kern_cpu_matmul(dt, gt, (const char *)ds + dr * dim * e, DTYPE_Q6_K, NULL, 1,
                                             dim, ffn, NULL),
                             FERRY_OK);
                for (int i = 0; i < dim; i++) yt[i] += w[t * k + j] * dt[i];
            }
    }
    for (int i = 0; i < n * dim; i++) cr_assert(y[0][i] == one[i], "[%d] %.9g vs %.9g", i, y[0][i], one[i]);
    /* (b) the double sums over the decoded weights */
    cr_assert_eq(kern_cpu_moe_ref(ref, x, ids, w, n, k, g, u, d, n_expert, dim, ffn), FERRY_OK);
    double amax = 0, emax = 0;
    for (int i = 0; i < n * dim; i++)
        amax = fmax(amax, fabs(ref[i])), emax = fmax(emax, fabs((double)y[0][i] - ref[i]));
    cr_assert(amax > 1e-2, "degenerate reference");
    /* x and h rounded to 8 bits per block of 32 (half a step each, max|block|/254): a few parts in a
     * thousand of the largest output here (0.8%); a wrong expert, weight or row is of the order of amax */
    cr_assert(emax <= 1.5e-2 * amax, "max error %g of %g", emax, amax);
    kern_cpu_matmul_set_act(KERN_CPU_ACT_F32);
    for (int p = 0; p < 3; p++) free(y[p]);
    free(x), free(g), free(u), free(d), free(gs), free(us), free(ds), free(ws), free(one), free(ref),
        free(gt), free(ut), free(dt);
}
