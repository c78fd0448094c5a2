/* CUDA element-wise and row-wise ops against double-precision references on random data, odd shapes.
 * The local references are themselves checked against the CPU oracle (kern_cpu_*_ref, kernels/cpu/ops.h) by
 * the `references_match_cpu_oracle` test, which needs no GPU and so also runs in CI. */
#include "tests/cuda/cuda_test.h"

#include "kernels/core/dtype.h"
#include "kernels/cpu/moe.h"
#include "kernels/cpu/ops.h"

/* ---- embed ---- */

static float ref_elem(const uint8_t *row, enum dtype t, int j)
{
    uint16_t h;
    switch (t) {
    case DTYPE_F32: {
        float f;
        memcpy(&f, row + 4 * j, 4);
        return f;
    }
    case DTYPE_F16:
        memcpy(&h, row + 2 * j, 2);
        return f16_to_f32(h);
    case DTYPE_BF16:
        memcpy(&h, row + 2 * j, 2);
        return bf16_to_f32(h);
    default: {
        const uint8_t *b = row + (size_t)(j / 32) * 34;
        memcpy(&h, b, 2);
        return f16_to_f32(h) * (float)(int8_t)b[2 + j % 32];
    }
    }
}

static void check_embed(enum dtype t, int d)
{
    const int n_rows = 37, m = 13;
    const size_t rb = dtype_row_size(t, d);
    uint8_t *table = malloc(rb * n_rows);
    for (size_t i = 0; i < rb * n_rows; i++) table[i] = (uint8_t)rng_u64();
    /* Make every stored value finite: rewrite as proper values of the type. */
    for (int r = 0; r < n_rows; r++) {
        uint8_t *row = table + rb * r;
        if (t == DTYPE_F32)
            for (int j = 0; j < d; j++) {
                float f = frand();
                memcpy(row + 4 * j, &f, 4);
            }
        if (t == DTYPE_F16)
            for (int j = 0; j < d; j++) {
                uint16_t h = f32_to_f16(frand());
                memcpy(row + 2 * j, &h, 2);
            }
        if (t == DTYPE_BF16)
            for (int j = 0; j < d; j++) {
                uint16_t h = f32_to_bf16(frand());
                memcpy(row + 2 * j, &h, 2);
            }
        if (t == DTYPE_Q8_0)
            for (int b = 0; b < d / 32; b++) {
                uint16_t h = f32_to_f16(0.01f + 0.1f * (frand() + 1));
                memcpy(row + 34 * b, &h, 2);
            }
    }
    int32_t tok[13];
    for (int i = 0; i < m; i++) tok[i] = irand(n_rows);
    tok[0] = 0;
    tok[1] = n_rows - 1;
    tok[5] = n_rows; /* out of range: a row of zeros, no fault */
    void *dt = dev_upload(table, rb * n_rows);
    int32_t *dtok = dev_upload(tok, sizeof tok);
    float *dx = dev_poison((size_t)m * d * 4);
    cr_assert_eq(kern_cuda_embed(dx, dt, t, n_rows, d, dtok, m, 0), FERRY_OK);
    float *x = malloc((size_t)m * d * 4);
    dev_download(x, dx, (size_t)m * d * 4);
    for (int i = 0; i < m; i++)
        for (int j = 0; j < d; j++) {
            float want = i == 5 ? 0.0f : ref_elem(table + rb * tok[i], t, j);
            cr_assert_eq(x[(size_t)i * d + j], want, "%s row %d col %d: got %g want %g", dtype_name(t), i, j,
                         x[(size_t)i * d + j], want);
        }
    cudaFree(dt);
    cudaFree(dtok);
    cudaFree(dx);
    free(table);
    free(x);
}

Test(cuda_ops, embed_all_types)
{
    SKIP_WITHOUT_GPU();
    rng_seed(1);
    check_embed(DTYPE_F32, 77);
    check_embed(DTYPE_F16, 77);
    check_embed(DTYPE_BF16, 77);
    check_embed(DTYPE_Q8_0, 96);
}

Test(cuda_ops, embed_rejects)
{
    SKIP_WITHOUT_GPU();
    float *dx = dev_alloc(64);
    int32_t *dt = dev_alloc(64);
    cr_assert_eq(kern_cuda_embed(dx, dt, DTYPE_Q4_0, 4, 32, dt, 1, 0), FERRY_ERR_UNSUPPORTED);
    cr_assert_eq(kern_cuda_embed(dx, dt, DTYPE_Q8_0, 4, 33, dt, 1, 0), FERRY_ERR_INVALID);
    cr_assert_eq(kern_cuda_embed(dx, dt, DTYPE_F32, 4, 0, dt, 1, 0), FERRY_ERR_INVALID);
    cudaFree(dx);
    cudaFree(dt);
}

/* ---- rmsnorm ---- */

static void ref_rmsnorm(double *y, const float *x, const float *w, int m, int d, float eps)
{
    for (int i = 0; i < m; i++) {
        double ss = 0;
        for (int j = 0; j < d; j++) ss += (double)x[(size_t)i * d + j] * x[(size_t)i * d + j];
        double inv = 1.0 / sqrt(ss / d + eps);
        for (int j = 0; j < d; j++) y[(size_t)i * d + j] = x[(size_t)i * d + j] * inv * w[j];
    }
}

Test(cuda_ops, rmsnorm_odd_shapes)
{
    SKIP_WITHOUT_GPU();
    rng_seed(2);
    /* Scalar path (odd d, d > 8192) and the register-resident vector path with 1, 2, 4 and 8 float4 per
     * thread. */
    const int ds[] = {1, 4, 33, 1028, 4096, 4099, 8192, 12288};
    for (int c = 0; c < 8; c++) {
        const int m = 7, d = ds[c];
        const size_t n = (size_t)m * d;
        float *x = host_rand(n, -3, 3), *w = host_rand(d, 0.5f, 1.5f), *y = malloc(n * 4);
        double *ref = malloc(n * 8);
        ref_rmsnorm(ref, x, w, m, d, 1e-5f);
        float *dx = dev_upload(x, n * 4), *dw = dev_upload(w, d * 4), *dy = dev_poison(n * 4);
        cr_assert_eq(kern_cuda_rmsnorm(dy, dx, dw, m, d, 1e-5f, 0), FERRY_OK);
        dev_download(y, dy, n * 4);
        double e = rel_err(y, ref, n);
        cr_assert(e <= 1e-6, "d=%d rel err %g > 1e-6", d, e);
        /* in place */
        cr_assert_eq(kern_cuda_rmsnorm(dx, dx, dw, m, d, 1e-5f, 0), FERRY_OK);
        dev_download(y, dx, n * 4);
        e = rel_err(y, ref, n);
        cr_assert(e <= 1e-6, "in place d=%d rel err %g", d, e);
        cudaFree(dx);
        cudaFree(dw);
        cudaFree(dy);
        free(x);
        free(w);
        free(y);
        free(ref);
    }
    cr_assert_eq(kern_cuda_rmsnorm((float *)16, (float *)16, (float *)16, 1, 0, 1e-5f, 0), FERRY_ERR_INVALID);
}

Test(cuda_ops, add_rmsnorm_fused)
{
    SKIP_WITHOUT_GPU();
    rng_seed(3);
    const int ds[] = {1031, 4096};
    for (int c = 0; c < 2; c++) {
        const int m = 5, d = ds[c];
        const size_t n = (size_t)m * d;
        float *r = host_rand(n, -2, 2), *dl = host_rand(n, -2, 2), *w = host_rand(d, 0.5f, 1.5f);
        float *sum = malloc(n * 4), *got = malloc(n * 4);
        for (size_t i = 0; i < n; i++) sum[i] = r[i] + dl[i];
        double *ref = malloc(n * 8), *sref = malloc(n * 8);
        ref_rmsnorm(ref, sum, w, m, d, 1e-6f);
        for (size_t i = 0; i < n; i++) sref[i] = sum[i];
        float *dr = dev_upload(r, n * 4), *dd = dev_upload(dl, n * 4), *dw = dev_upload(w, d * 4),
              *dy = dev_poison(n * 4);
        cr_assert_eq(kern_cuda_add_rmsnorm(dr, dd, dy, dw, m, d, 1e-6f, 0), FERRY_OK);
        dev_download(got, dr, n * 4);
        cr_assert(rel_err(got, sref, n) == 0.0, "residual sum is not exact");
        dev_download(got, dy, n * 4);
        double e = rel_err(got, ref, n);
        cr_assert(e <= 1e-6, "rel err %g", e);
        cr_assert_eq(kern_cuda_add_rmsnorm(dr, dd, dr, dw, m, d, 1e-6f, 0), FERRY_ERR_INVALID);
        cudaFree(dr);
        cudaFree(dd);
        cudaFree(dw);
        cudaFree(dy);
        free(r);
        free(dl);
        free(w);
        free(sum);
        free(got);
        free(ref);
        free(sref);
    }
}

/* ---- SiLU-gated activation over the fused gate|up rows ---- */

Test(cuda_ops, silu_mul_fused_rows)
{
    SKIP_WITHOUT_GPU();
    rng_seed(5);
    const int m = 7, ffn = 10007;
    const size_t n = (size_t)m * ffn;
    float *gu = host_rand(2 * n, -8, 8), *got = malloc(n * 4);
    double *ref = malloc(n * 8);
    for (int i = 0; i < m; i++)
        for (int j = 0; j < ffn; j++) {
            const double g = gu[(size_t)i * 2 * ffn + j], u = gu[(size_t)i * 2 * ffn + ffn + j];
            ref[(size_t)i * ffn + j] = g / (1.0 + exp(-g)) * u;
        }
    float *dgu = dev_upload(gu, 2 * n * 4), *dh = dev_poison(n * 4);
    cr_assert_eq(kern_cuda_silu_mul(dh, dgu, m, ffn, 0), FERRY_OK);
    dev_download(got, dh, n * 4);
    double e = rel_err(got, ref, n);
    cr_assert(e <= 1e-6, "silu_mul rel err %g", e);
    cr_assert_eq(kern_cuda_silu_mul(dh, dgu, m, 0, 0), FERRY_ERR_INVALID);
    cudaFree(dgu);
    cudaFree(dh);
    free(gu);
    free(got);
    free(ref);
}

/* ---- the local references mirror the CPU oracle (no GPU needed) ---- */

Test(cuda_ops, references_match_cpu_oracle)
{
    rng_seed(6);
    /* embed: every type, exact */
    const enum dtype ts[] = {DTYPE_F32, DTYPE_F16, DTYPE_BF16, DTYPE_Q8_0};
    for (int ti = 0; ti < 4; ti++) {
        const enum dtype t = ts[ti];
        const int d = 96, n_rows = 5;
        const size_t rb = dtype_row_size(t, d);
        uint8_t *table = malloc(rb * n_rows);
        for (size_t i = 0; i < rb * n_rows; i += 2) {
            uint16_t h = t == DTYPE_BF16 ? f32_to_bf16(frand()) : f32_to_f16(frand() * 0.1f);
            memcpy(table + i, &h, 2);
        }
        int32_t tok[3] = {4, 0, 2};
        float *x = malloc(3 * d * 4);
        cr_assert_eq(kern_cpu_embed(x, table, t, n_rows, d, tok, 3), FERRY_OK);
        for (int i = 0; i < 3; i++)
            for (int j = 0; j < d; j++) {
                float want = ref_elem(table + rb * tok[i], t, j);
                cr_assert(x[i * d + j] == want || (isnan(want) && isnan(x[i * d + j])),
                          "%s embed %d,%d: %g vs %g", dtype_name(t), i, j, x[i * d + j], want);
            }
        free(table);
        free(x);
    }
    /* rmsnorm */
    {
        const int m = 3, d = 1001;
        float *x = host_rand((size_t)m * d, -3, 3), *w = host_rand(d, 0.5f, 1.5f),
              *y = malloc((size_t)m * d * 4);
        double *ref = malloc((size_t)m * d * 8);
        ref_rmsnorm(ref, x, w, m, d, 1e-5f);
        kern_cpu_rmsnorm_ref(y, x, w, m, d, 1e-5f);
        double e = rel_err(y, ref, (size_t)m * d);
        cr_assert(e <= 1e-6, "rmsnorm: local ref vs kern_cpu_rmsnorm_ref rel err %g", e);
        free(x);
        free(w);
        free(y);
        free(ref);
    }
    /* rope, both styles, partial rotation, large positions */
    for (int style = 0; style < 2; style++) {
        const int m = 4, nh = 2, hd = 14, rd = 10, half = rd / 2;
        const size_t n = (size_t)m * nh * hd;
        float *x = host_rand(n, -2, 2), *cpu = malloc(n * 4), *inv = malloc(half * 4);
        double *ref = malloc(n * 8);
        for (int i = 0; i < half; i++) inv[i] = (float)pow(500000.0, -2.0 * i / rd);
        int32_t pos[4] = {0, 3, 1000, 8190};
        memcpy(cpu, x, n * 4);
        kern_cpu_rope_ref(cpu, pos, m, nh, hd, rd, inv, (enum rope_style)style);
        for (size_t i = 0; i < n; i++) ref[i] = x[i];
        for (int t = 0; t < m; t++)
            for (int h = 0; h < nh; h++)
                for (int i = 0; i < half; i++) {
                    const size_t b = ((size_t)t * nh + h) * hd;
                    const int i0 = style == ROPE_STYLE_HALF ? i : 2 * i,
                              i1 = style == ROPE_STYLE_HALF ? i + half : 2 * i + 1;
                    const float angle = (float)pos[t] * inv[i];
                    const double c = cos((double)angle), sn = sin((double)angle);
                    ref[b + i0] = x[b + i0] * c - (double)x[b + i1] * sn;
                    ref[b + i1] = x[b + i0] * sn + (double)x[b + i1] * c;
                }
        double e = max_abs_err(cpu, ref, n);
        cr_assert(e <= 2e-6, "rope style %d: local ref vs kern_cpu_rope_ref max abs err %g", style, e);
        free(x);
        free(cpu);
        free(inv);
        free(ref);
    }
    /* silu_mul and add */
    {
        const int64_t n = 1003;
        float *g = host_rand(n, -8, 8), *u = host_rand(n, -2, 2), *a = malloc(n * 4);
        double *ref = malloc(n * 8);
        memcpy(a, g, n * 4);
        kern_cpu_silu_mul(a, u, n);
        for (int64_t i = 0; i < n; i++) ref[i] = g[i] / (1.0 + exp(-(double)g[i])) * u[i];
        double e = rel_err(a, ref, n);
        cr_assert(e <= 1e-6, "silu_mul: formula vs kern_cpu_silu_mul rel err %g", e);
        memcpy(a, g, n * 4);
        kern_cpu_add(a, u, n);
        for (int64_t i = 0; i < n; i++) cr_assert_eq(a[i], g[i] + u[i]);
        free(g);
        free(u);
        free(a);
        free(ref);
    }
}

/* ---- Gemma 4's ops, against the CPU references the CPU backend's ops mirror ---- */

/* Per-head norm of a strided slice of rows (the value heads of q|k|v rows), with and without a weight:
 * against kern_cpu_rmsnorm_ref over the same heads (a weight of ones for the weightless norm); columns
 * outside the heads untouched. */
Test(cuda_ops, head_rmsnorm_strided)
{
    SKIP_WITHOUT_GPU();
    rng_seed(31);
    static const int cfg[][3] = {{5, 3, 24}, {7, 1, 512}, {3, 8, 16}, {4, 2, 256}, {2, 5, 40}};
    for (int c = 0; c < 5; c++)
        for (int weighted = 0; weighted < 2; weighted++) {
            const int m = cfg[c][0], nh = cfg[c][1], hd = cfg[c][2], ld = nh * hd + 13, off = 7;
            const size_t n = (size_t)m * ld + off;
            float *x = host_rand(n, -3, 3), *w = host_rand(hd, 0.5f, 1.5f), *ones = malloc(hd * 4),
                  *ref = malloc(n * 4), *got = malloc(n * 4);
            for (int j = 0; j < hd; j++) ones[j] = 1.0f;
            memcpy(ref, x, n * 4);
            for (int i = 0; i < m; i++)
                kern_cpu_rmsnorm_ref(ref + off + (size_t)i * ld, ref + off + (size_t)i * ld,
                                     weighted ? w : ones, nh, hd, 1e-6f);
            float *dx = dev_upload(x, n * 4), *dw = dev_upload(w, hd * 4);
            cr_assert_eq(kern_cuda_head_rmsnorm(dx + off, ld, weighted ? dw : NULL, m, nh, hd, 1e-6f, 0),
                         FERRY_OK);
            dev_download(got, dx, n * 4);
            double worst = 0;
            for (size_t i = 0; i < n; i++) {
                const double e = fabs((double)got[i] - ref[i]) / (1e-3 + fabs(ref[i]));
                worst = !isfinite(got[i]) ? INFINITY : e > worst ? e : worst;
            }
            fprintf(stderr, "head_rmsnorm m %d heads %d hd %d weighted %d: max rel err %.3g\n", m, nh, hd,
                    weighted, worst);
            cr_assert(worst <= 2e-6, "head_rmsnorm m %d heads %d hd %d weighted %d: max rel err %g", m, nh,
                      hd, weighted, worst);
            cudaFree(dx);
            cudaFree(dw);
            free(x);
            free(w);
            free(ones);
            free(ref);
            free(got);
        }
    cr_assert_eq(kern_cuda_head_rmsnorm((float *)16, 10, NULL, 1, 2, 8, 1e-6f, 0), FERRY_ERR_INVALID);
}

/* The layer output scalar (x + D) * s with s on the device, its forms without D or s, and axpby: exact
 * against the same f32 arithmetic on the host (no fused multiply-add in either). */
Test(cuda_ops, add_scale_and_axpby)
{
    SKIP_WITHOUT_GPU();
    rng_seed(32);
    const int64_t n = 100003;
    float *x = host_rand((size_t)n, -4, 4), *d = host_rand((size_t)n, -4, 4), s = 0.3711f,
          *got = malloc(n * 4), *ref = malloc(n * 4);
    float *dx = dev_upload(x, n * 4), *dd = dev_upload(d, n * 4), *ds = dev_upload(&s, 4);
    for (int form = 0; form < 4; form++) { /* delta and s, delta only, s only, axpby */
        CU_OK(cudaMemcpy(dx, x, n * 4, cudaMemcpyHostToDevice));
        if (form < 3)
            cr_assert_eq(kern_cuda_add_scale(dx, form == 2 ? NULL : dd, form == 1 ? NULL : ds, n, 0),
                         FERRY_OK);
        else
            cr_assert_eq(kern_cuda_axpby(dx, 1.7f, dd, 0.70710678f, n, 0), FERRY_OK);
        dev_download(got, dx, n * 4);
        for (int64_t i = 0; i < n; i++) {
            volatile float a = form == 2 ? x[i] : form < 2 ? x[i] + d[i] : 1.7f * x[i];
            if (form == 3) a = a + d[i];
            ref[i] = form == 1 ? a : form == 3 ? a * 0.70710678f : a * s;
        }
        int bad = 0;
        for (int64_t i = 0; i < n && !bad; i++) bad = got[i] != ref[i] ? (int)i + 1 : 0;
        fprintf(stderr, "add_scale/axpby form %d: %s\n", form, bad ? "differs" : "bitwise equal");
        cr_assert(!bad, "form %d: element %d: %g vs %g", form, bad - 1, got[bad - 1], ref[bad - 1]);
    }
    cr_assert_eq(kern_cuda_add_scale(NULL, NULL, NULL, 4, 0), FERRY_ERR_INVALID);
    cudaFree(dx);
    cudaFree(dd);
    cudaFree(ds);
    free(x);
    free(d);
    free(got);
    free(ref);
}

/* Logit soft-capping against kern_cpu_softcap_ref (double), logits well past the cap included. */
Test(cuda_ops, softcap_odd_sizes)
{
    SKIP_WITHOUT_GPU();
    rng_seed(33);
    const int64_t sizes[] = {1, 37, 262147};
    for (int c = 0; c < 3; c++) {
        const int64_t n = sizes[c];
        float *x = host_rand((size_t)n, -200, 200), *ref = malloc(n * 4), *got = malloc(n * 4);
        memcpy(ref, x, n * 4);
        kern_cpu_softcap_ref(ref, 30.0f, n);
        float *dx = dev_upload(x, n * 4);
        cr_assert_eq(kern_cuda_softcap(dx, 30.0f, n, 0), FERRY_OK);
        dev_download(got, dx, n * 4);
        double worst = 0;
        for (int64_t i = 0; i < n; i++) {
            const double e = fabs((double)got[i] - ref[i]) / (1.0 + fabs(ref[i]));
            worst = !isfinite(got[i]) ? INFINITY : e > worst ? e : worst;
        }
        fprintf(stderr, "softcap n %lld: max rel err %.3g\n", (long long)n, worst);
        cr_assert(worst <= 1e-6, "softcap n %lld: max rel err %g", (long long)n, worst);
        cudaFree(dx);
        free(x);
        free(ref);
        free(got);
    }
    cr_assert_eq(kern_cuda_softcap((float *)16, 0.0f, 4, 0), FERRY_ERR_INVALID);
}

/* The per-layer input's gate: gelu_tanh(a) * the layer's slice of a wider row, against kern_cpu_gelu_mul_ref.
 */
Test(cuda_ops, gelu_mul_rows_strided)
{
    SKIP_WITHOUT_GPU();
    rng_seed(34);
    const int m = 9, k = 37, ldb = 5 * k + 3, off = 2 * k;
    const size_t na = (size_t)m * k;
    float *a = host_rand(na, -6, 6), *b = host_rand((size_t)m * ldb, -2, 2), *ref = malloc(na * 4),
          *up = malloc(na * 4), *got = malloc(na * 4);
    memcpy(ref, a, na * 4);
    for (int i = 0; i < m; i++) memcpy(up + (size_t)i * k, b + (size_t)i * ldb + off, k * 4);
    kern_cpu_gelu_mul_ref(ref, up, (int64_t)na);
    float *da = dev_upload(a, na * 4), *db = dev_upload(b, (size_t)m * ldb * 4), *dh = dev_poison(na * 4);
    cr_assert_eq(kern_cuda_gelu_mul_rows(dh, da, db + off, ldb, m, k, 0), FERRY_OK);
    dev_download(got, dh, na * 4);
    double worst = 0;
    for (size_t i = 0; i < na; i++) {
        const double e = fabs((double)got[i] - ref[i]) / (1e-2 + fabs(ref[i]));
        worst = !isfinite(got[i]) ? INFINITY : e > worst ? e : worst;
    }
    fprintf(stderr, "gelu_mul_rows: max rel err %.3g\n", worst);
    /* f32 arithmetic against the f64 reference: where gelu is small (a near -6), 1 + tanh cancels and keeps
     * tanhf's absolute error (2 ulp of 1, 2.4e-7) times |a u| / 2 <= 6: 1.4e-6 absolute, 1.4e-4 of the floor
     */
    cr_assert(worst <= 5e-4, "gelu_mul_rows: max rel err %g", worst);
    /* in place over a (as the per-layer input runs it) */
    cr_assert_eq(kern_cuda_gelu_mul_rows(da, da, db + off, ldb, m, k, 0), FERRY_OK);
    dev_download(got, da, na * 4);
    for (size_t i = 0; i < na; i++) cr_assert(fabsf(got[i] - ref[i]) <= 5e-4f * (1e-2f + fabsf(ref[i])));
    cr_assert_eq(kern_cuda_gelu_mul_rows(dh, da, db, k - 1, m, k, 0), FERRY_ERR_INVALID);
    cudaFree(da);
    cudaFree(db);
    cudaFree(dh);
    free(a);
    free(b);
    free(ref);
    free(up);
    free(got);
}

/* ---- Qwen3.5's gated attention and shared expert, Qwen3-Next's column blocks ---- */

/* The split of LOP_Q_GATE (weights/arch/program.h): per head its queries then its gate in, queries packed
 * before the keys and values out, the gates apart; an exact copy. */
Test(cuda_ops, q_gate_split_odd_shapes)
{
    SKIP_WITHOUT_GPU();
    rng_seed(41);
    const int shapes[][4] = {
        {37, 5, 24, 48}, {1, 3, 8, 8}, {70, 7, 40, 120}}; /* m, heads, head_dim, kv_dim */
    for (size_t c = 0; c < sizeof shapes / sizeof shapes[0]; c++) {
        const int m = shapes[c][0], nh = shapes[c][1], hd = shapes[c][2], kvd = shapes[c][3];
        const int qd = nh * hd, in_row = 2 * qd + 2 * kvd, out_row = qd + 2 * kvd;
        float *src = host_rand((size_t)m * in_row, -3, 3), *got = malloc((size_t)m * out_row * 4),
              *gate = malloc((size_t)m * qd * 4);
        float *ds = dev_upload(src, (size_t)m * in_row * 4), *dq = dev_poison((size_t)m * out_row * 4),
              *dg = dev_poison((size_t)m * qd * 4);
        cr_assert_eq(kern_cuda_q_gate_split(dq, dg, ds, m, nh, hd, kvd, 0), FERRY_OK);
        dev_download(got, dq, (size_t)m * out_row * 4);
        dev_download(gate, dg, (size_t)m * qd * 4);
        for (int i = 0; i < m; i++) {
            const float *s = src + (size_t)i * in_row;
            for (int h = 0; h < nh; h++)
                for (int j = 0; j < hd; j++) {
                    cr_assert_eq(got[(size_t)i * out_row + h * hd + j], s[2 * h * hd + j], "row %d head %d",
                                 i, h);
                    cr_assert_eq(gate[(size_t)i * qd + h * hd + j], s[2 * h * hd + hd + j], "gate %d %d", i,
                                 h);
                }
            for (int j = 0; j < 2 * kvd; j++) cr_assert_eq(got[(size_t)i * out_row + qd + j], s[2 * qd + j]);
        }
        cudaFree(ds);
        cudaFree(dq);
        cudaFree(dg);
        free(src);
        free(got);
        free(gate);
    }
    cr_assert_eq(kern_cuda_q_gate_split(NULL, NULL, NULL, 1, 1, 8, 8, 0), FERRY_ERR_INVALID);
}

/* LOP_ATT_GATE: x · sigmoid(gate) against double, gates far into both tails; in place too. */
Test(cuda_ops, sigmoid_mul_odd_sizes)
{
    SKIP_WITHOUT_GPU();
    rng_seed(42);
    const int64_t n = 30011;
    float *x = host_rand((size_t)n, -5, 5), *g = host_rand((size_t)n, -40, 40), *got = malloc(n * 4);
    double *ref = malloc(n * sizeof(double));
    for (int64_t i = 0; i < n; i++) ref[i] = x[i] / (1.0 + exp(-(double)g[i]));
    float *dx = dev_upload(x, n * 4), *dg = dev_upload(g, n * 4), *dy = dev_poison(n * 4);
    cr_assert_eq(kern_cuda_sigmoid_mul(dy, dx, dg, n, 0), FERRY_OK);
    dev_download(got, dy, n * 4);
    for (int64_t i = 0; i < n; i++)
        cr_assert_leq(fabs(got[i] - ref[i]), 1e-6 + 1e-6 * fabs(ref[i]), "element %lld: %g vs %g",
                      (long long)i, got[i], ref[i]);
    cr_assert_eq(kern_cuda_sigmoid_mul(dx, dx, dg, n, 0), FERRY_OK); /* in place */
    dev_download(got, dx, n * 4);
    for (int64_t i = 0; i < n; i++) cr_assert_leq(fabs(got[i] - ref[i]), 1e-6 + 1e-6 * fabs(ref[i]));
    cudaFree(dx);
    cudaFree(dg);
    cudaFree(dy);
    free(x);
    free(g);
    free(got);
    free(ref);
}

/* The shared expert's gated sum against kern_cpu_moe_shared_ref (kernels/cpu/moe.h, double sums): the GPU is
 * given the FFN's output (computed here in double, as the reference does inside) and adds it scaled by
 * sigmoid(x · gate). Odd dims, a block-wide and a partial reduction. */
Test(cuda_ops, gated_add_matches_cpu_shared_expert)
{
    SKIP_WITHOUT_GPU();
    rng_seed(43);
    const int dims[] = {37, 300, 1031};
    for (size_t c = 0; c < sizeof dims / sizeof dims[0]; c++) {
        const int d = dims[c], ffn = 7, m = 19;
        float *x = host_rand((size_t)m * d, -1, 1), *y0 = host_rand((size_t)m * d, -2, 2),
              *gi = host_rand((size_t)d, -0.2f, 0.2f), *wg = host_rand((size_t)ffn * d, -0.3f, 0.3f),
              *wu = host_rand((size_t)ffn * d, -0.3f, 0.3f), *wd = host_rand((size_t)d * ffn, -0.3f, 0.3f);
        float *ref = malloc((size_t)m * d * 4), *s = malloc((size_t)m * d * 4),
              *got = malloc((size_t)m * d * 4);
        memcpy(ref, y0, (size_t)m * d * 4);
        const struct kern_cpu_moe_shared sh = {.gate = wg,
                                               .up = wu,
                                               .down = wd,
                                               .gate_t = DTYPE_F32,
                                               .up_t = DTYPE_F32,
                                               .down_t = DTYPE_F32,
                                               .dim = d,
                                               .ffn = ffn,
                                               .gate_inp = gi};
        cr_assert_eq(kern_cpu_moe_shared_ref(ref, x, m, &sh), FERRY_OK);
        for (int t = 0; t < m; t++) { /* the FFN alone, unscaled */
            double h[7];
            for (int f = 0; f < ffn; f++) {
                double a = 0, b = 0;
                for (int k = 0; k < d; k++)
                    a += (double)wg[(size_t)f * d + k] * x[(size_t)t * d + k],
                        b += (double)wu[(size_t)f * d + k] * x[(size_t)t * d + k];
                h[f] = a / (1.0 + exp(-a)) * b;
            }
            for (int i = 0; i < d; i++) {
                double o = 0;
                for (int f = 0; f < ffn; f++) o += h[f] * wd[(size_t)i * ffn + f];
                s[(size_t)t * d + i] = (float)o;
            }
        }
        float *dy = dev_upload(y0, (size_t)m * d * 4), *dsh = dev_upload(s, (size_t)m * d * 4),
              *dx = dev_upload(x, (size_t)m * d * 4), *dgi = dev_upload(gi, (size_t)d * 4);
        cr_assert_eq(kern_cuda_gated_add(dy, dsh, dx, dgi, m, d, 0), FERRY_OK);
        dev_download(got, dy, (size_t)m * d * 4);
        for (size_t i = 0; i < (size_t)m * d; i++)
            cr_assert_leq(fabs(got[i] - ref[i]), 1e-5 + 1e-5 * fabs(ref[i]), "dim %d element %zu: %g vs %g",
                          d, i, got[i], ref[i]);
        cudaFree(dy);
        cudaFree(dsh);
        cudaFree(dx);
        cudaFree(dgi);
        free(x), free(y0), free(gi), free(wg), free(wu), free(wd), free(ref), free(s), free(got);
    }
}

/* Column blocks: Qwen3-Next's b|a split (per key head h, its value heads' b then their a) as the CPU backend
 * splits it, plus blocks of other widths; an exact copy, columns no block names left alone. */
Test(cuda_ops, copy_blocks_splits_packed_rows)
{
    SKIP_WITHOUT_GPU();
    rng_seed(44);
    const int m = 23, nk = 3, per = 5, nv = nk * per, ld = 2 * nv + 11;
    float *x = host_rand((size_t)m * ld, -1, 1), *got = malloc((size_t)m * ld * 4);
    int32_t table[2 * 3 + 1][3];
    int nb = 0;
    for (int h = 0; h < nk; h++) {
        table[nb][0] = h * per, table[nb][1] = h * 2 * per, table[nb++][2] = per;
        table[nb][0] = nv + h * per, table[nb][1] = h * 2 * per + per, table[nb++][2] = per;
    }
    table[nb][0] = 2 * nv + 1, table[nb][1] = 2 * nv, table[nb++][2] = 9; /* a shifted tail */
    float *dx = dev_upload(x, (size_t)m * ld * 4), *dy = dev_poison((size_t)m * ld * 4);
    int32_t *dt = dev_upload(table, sizeof table);
    cr_assert_eq(kern_cuda_copy_blocks(dy, ld, dx, ld, m, dt, nb, 0), FERRY_OK);
    dev_download(got, dy, (size_t)m * ld * 4);
    for (int i = 0; i < m; i++) {
        const float *r = x + (size_t)i * ld, *g = got + (size_t)i * ld;
        for (int h = 0; h < nk; h++)
            for (int j = 0; j < per; j++) {
                cr_assert_eq(g[h * per + j], r[h * 2 * per + j], "row %d b of key head %d", i, h);
                cr_assert_eq(g[nv + h * per + j], r[h * 2 * per + per + j], "row %d a of key head %d", i, h);
            }
        for (int j = 0; j < 9; j++) cr_assert_eq(g[2 * nv + 1 + j], r[2 * nv + j]);
        cr_assert(isnan(g[2 * nv]) && isnan(g[ld - 1]), "row %d: a column outside every block was written",
                  i);
    }
    cr_assert_eq(kern_cuda_copy_blocks(dy, ld, dx, ld, m, NULL, nb, 0), FERRY_ERR_INVALID);
    cudaFree(dx);
    cudaFree(dy);
    cudaFree(dt);
    free(x);
    free(got);
}
