/* CUDA matmul (GEMV path and cuBLAS path) against a double-precision reference on random data, odd shapes.
 *
 * Tolerances (relative error of the whole y tensor against the exact reference):
 *   GEMV m = 1 (any weight type), GEMV f32 weights, GEMV scalar path (k % 8 != 0): 1e-5 (each w*x product is
 *     exact in f32, only the f32 sums round);
 *   GEMV m >= 2 with f16/bf16 weights (tensor cores, x rounded to the weight type) and cuBLAS: f16 1e-3 (x is
 *     rounded to f16 once: 2^-11 relative per element, averaged over k), bf16 8e-3 (2^-8 per element);
 *     cuBLAS f32: 1e-5.
 * The paths that round x are also compared with a reference computed from x rounded (round-to-nearest-even)
 * to the weight type: 5e-5 there (f16/bf16 products are exact in f32; what is left is the tensor cores' f32
 * accumulation, ~1e-6..1e-5 at these k), which is far below the rounding error itself (f16 ~3e-4), so it
 * checks that x is rounded exactly once and to the right type. y is (m, ldy) with ldy > n in half the cases:
 * the columns past n must keep their NaN bits. The GGUF block types are tested in test_cuda_matmul_q.cc. The
 * local reference is checked against the CPU oracle kern_cpu_matmul_ref (no GPU needed, runs in CI).
 */
#include "tests/cuda/cuda_test.h"

#include "kernels/cpu/matmul.h"
#include "kernels/cuda/matmul.h"

struct wbuf {
    void *host;  /* stored weights, (n, k) in type t */
    float *vals; /* their values as f32 */
};

static struct wbuf make_w(enum dtype t, int n, int k)
{
    struct wbuf w;
    const size_t ne = (size_t)n * k;
    w.vals = malloc(ne * 4);
    w.host = malloc(ne * 4);
    if (t == DTYPE_Q8_0) { /* blocks of 32: f16 scale, 32 int8 */
        uint8_t *b = w.host;
        for (size_t blk = 0; blk < ne / 32; blk++, b += 34) {
            uint16_t h = f32_to_f16(frand() * 0.01f);
            memcpy(b, &h, 2);
            for (int i = 0; i < 32; i++) {
                int8_t q = (int8_t)(irand(255) - 127);
                b[2 + i] = (uint8_t)q;
                w.vals[blk * 32 + i] = f16_to_f32(h) * (float)q;
            }
        }
        return w;
    }
    for (size_t i = 0; i < ne; i++) {
        float f = frand() * 0.5f;
        if (t == DTYPE_F32) ((float *)w.host)[i] = f;
        if (t == DTYPE_F16) {
            uint16_t h = f32_to_f16(f);
            ((uint16_t *)w.host)[i] = h;
            f = f16_to_f32(h);
        }
        if (t == DTYPE_BF16) {
            uint16_t h = f32_to_bf16(f);
            ((uint16_t *)w.host)[i] = h;
            f = bf16_to_f32(h);
        }
        w.vals[i] = f;
    }
    return w;
}

static void ref_matmul(double *y, const float *x, const float *w, const float *bias, int m, int n, int k)
{
    for (int i = 0; i < m; i++)
        for (int j = 0; j < n; j++) {
            double s = bias ? bias[j] : 0.0;
            for (int e = 0; e < k; e++) s += (double)x[(size_t)i * k + e] * w[(size_t)j * k + e];
            y[(size_t)i * n + j] = s;
        }
}

enum path { PATH_GEMV, PATH_CUBLAS, PATH_AUTO };

/* x rounded to the weight type, as the tensor-core paths do. */
static float *round_x(const float *x, size_t n, enum dtype t)
{
    float *r = malloc(n * 4);
    for (size_t i = 0; i < n; i++)
        r[i] = t == DTYPE_F16    ? f16_to_f32(f32_to_f16(x[i]))
               : t == DTYPE_BF16 ? bf16_to_f32(f32_to_bf16(x[i]))
                                 : x[i];
    return r;
}

/* Whether this call rounds x to the weight type (tensor cores): cuBLAS f16/bf16, GEMV m >= 2 f16/bf16 on the
 * vector path (k % 8 == 0; the test buffers are 16-byte aligned). */
static int rounds_x(enum path path, enum dtype t, int m, int k)
{
    if (t != DTYPE_F16 && t != DTYPE_BF16) return 0;
    if (path == PATH_CUBLAS || (path == PATH_AUTO && m > 16)) return 1;
    return m >= 2 && k % 8 == 0;
}

static void check(struct kern_cuda_ctx *ctx, enum path path, enum dtype t, int m, int n, int k, int with_bias,
                  double tol)
{
    struct wbuf w = make_w(t, n, k);
    float *x = host_rand((size_t)m * k, -1, 1), *bias = with_bias ? host_rand(n, -1, 1) : NULL;
    double *ref = malloc((size_t)m * n * 8);
    float *y = malloc((size_t)m * n * 4), *y2 = malloc((size_t)m * n * 4);
    ref_matmul(ref, x, w.vals, bias, m, n, k);
    void *dw = dev_upload(w.host, dtype_row_size(t, k) * n);
    float *dx = dev_upload(x, (size_t)m * k * 4), *db = bias ? dev_upload(bias, n * 4) : NULL;
    const int ldy = n + (with_bias ? 0 : 3); /* y (m, ldy): columns past n must keep their NaN bits */
    float *dy = dev_poison((size_t)m * ldy * 4), *yl = malloc((size_t)m * ldy * 4);
    for (int rep = 0; rep < 2; rep++) {
        CU_OK(cudaMemset(dy, 0xFF, (size_t)m * ldy * 4));
        int rc = path == PATH_GEMV     ? kern_cuda_matmul_gemv(ctx, dy, ldy, dx, dw, t, db, m, n, k, 0)
                 : path == PATH_CUBLAS ? kern_cuda_matmul_gemm(ctx, dy, ldy, dx, dw, t, db, m, n, k, 0)
                                       : kern_cuda_matmul(ctx, dy, ldy, dx, dw, t, db, m, n, k, 0);
        cr_assert_eq(rc, FERRY_OK, "rc %d", rc);
        dev_download(yl, dy, (size_t)m * ldy * 4);
        for (int i = 0; i < m; i++) {
            memcpy((rep ? y2 : y) + (size_t)i * n, yl + (size_t)i * ldy, (size_t)n * 4);
            for (int j = n; j < ldy; j++) {
                uint32_t bits;
                memcpy(&bits, yl + (size_t)i * ldy + j, 4);
                cr_assert_eq(bits, 0xFFFFFFFFu, "path %d %s m=%d n=%d: y[%d][%d] past n written", path,
                             dtype_name(t), m, n, i, j);
            }
        }
    }
    free(yl);
    double e = rel_err(y, ref, (size_t)m * n);
    cr_assert(e <= tol, "path %d %s m=%d n=%d k=%d bias=%d: rel err %g > %g", path, dtype_name(t), m, n, k,
              with_bias, e, tol);
    if (rounds_x(path, t, m, k)) {
        float *xr = round_x(x, (size_t)m * k, t);
        ref_matmul(ref, xr, w.vals, bias, m, n, k);
        const double er = rel_err(y, ref, (size_t)m * n);
        cr_assert(er <= 5e-5, "path %d %s m=%d n=%d k=%d: rel err vs rounded-x reference %g > 5e-5", path,
                  dtype_name(t), m, n, k, er);
        free(xr);
    }
    cr_assert(memcmp(y, y2, (size_t)m * n * 4) == 0, "path %d %s m=%d: two runs differ", path, dtype_name(t),
              m);
    cudaFree(dw);
    cudaFree(dx);
    cudaFree(db);
    cudaFree(dy);
    free(w.host);
    free(w.vals);
    free(x);
    free(bias);
    free(ref);
    free(y);
    free(y2);
}

static const enum dtype types[] = {DTYPE_F16, DTYPE_BF16, DTYPE_F32};

Test(cuda_matmul, gemv_vector_path)
{
    SKIP_WITHOUT_GPU();
    rng_seed(11);
    const int ms[] = {1, 2, 3, 5, 8, 9, 13, 16};
    for (int ti = 0; ti < 3; ti++)
        for (int mi = 0; mi < 8; mi++) {
            const double tol = ms[mi] == 1 || types[ti] == DTYPE_F32 ? 1e-5
                               : types[ti] == DTYPE_F16              ? 1e-3
                                                                     : 8e-3;
            check(NULL, PATH_GEMV, types[ti], ms[mi], 257, 1032, mi % 2,
                  tol); /* k = 16*64 + 8: ragged step */
        }
    check(NULL, PATH_GEMV, DTYPE_F16, 4, 3, 4096, 1, 1e-3);
    check(NULL, PATH_GEMV, DTYPE_F16, 1, 1001, 8, 0, 1e-5);
    check(NULL, PATH_GEMV, DTYPE_BF16, 16, 5, 8, 1, 8e-3);
}

/* m = 1 with one or two output rows per warp (two: the last row of an odd n is computed twice, stored once).
 */
Test(cuda_matmul, gemv_m1_rows_per_warp)
{
    SKIP_WITHOUT_GPU();
    rng_seed(18);
    for (int r = 1; r <= 2; r++) {
        kern_cuda_matmul_set_m1_rows(r);
        for (int ti = 0; ti < 3; ti++) {
            check(NULL, PATH_GEMV, types[ti], 1, 257, 1032, 1, 1e-5);
            check(NULL, PATH_GEMV, types[ti], 1, 1, 4096, 0, 1e-5);
            check(NULL, PATH_GEMV, types[ti], 1, 2, 8, 1, 1e-5);
            check(NULL, PATH_GEMV, types[ti], 1, 1001, 64, 0, 1e-5);
        }
    }
    kern_cuda_matmul_set_m1_rows(0); /* back to the default */
}

/* The tensor-core kernel splits k over 8, 4, 2 or 1 warps by n (thresholds for 132 SMs: n <= 8448, 16896,
 * 33792): one shape per split count, ragged k and m, rows not a multiple of the 32-row warp tile. */
Test(cuda_matmul, gemv_tensor_core_splits)
{
    SKIP_WITHOUT_GPU();
    rng_seed(16);
    check(NULL, PATH_GEMV, DTYPE_F16, 16, 300, 4096, 1, 1e-3);
    check(NULL, PATH_GEMV, DTYPE_F16, 6, 9000, 264, 0, 1e-3);
    check(NULL, PATH_GEMV, DTYPE_BF16, 9, 17001, 128, 1, 8e-3);
    check(NULL, PATH_GEMV, DTYPE_F16, 3, 34000, 72, 0, 1e-3);
    check(NULL, PATH_GEMV, DTYPE_BF16, 2, 40, 11008, 1, 8e-3);
}

Test(cuda_matmul, gemv_scalar_path_and_large_m)
{
    SKIP_WITHOUT_GPU();
    rng_seed(12);
    for (int ti = 0; ti < 3; ti++) {
        check(NULL, PATH_GEMV, types[ti], 3, 33, 70, 1, 1e-5); /* k % 8 != 0: scalar path */
        check(NULL, PATH_GEMV, types[ti], 16, 65, 13, 0, 1e-5);
        /* m > 16: tiles of 16 (tensor cores for f16/bf16: x rounded) */
        check(NULL, PATH_GEMV, types[ti], 21, 40, 96, 1, types[ti] == DTYPE_F32 ? 1e-5 : 8e-3);
    }
}

Test(cuda_matmul, cublas_path)
{
    SKIP_WITHOUT_GPU();
    rng_seed(13);
    struct kern_cuda_ctx *ctx = NULL;
    cr_assert_eq(kern_cuda_ctx_init(&ctx, 40 * 1000, 0), FERRY_OK); /* small: m=64, k=1000 runs in chunks */
    const double tol[] = {1e-3, 8e-3, 1e-5};
    for (int ti = 0; ti < 3; ti++) {
        check(ctx, PATH_CUBLAS, types[ti], 17, 131, 1000, 1, tol[ti]);
        check(ctx, PATH_CUBLAS, types[ti], 64, 77, 1000, 0, tol[ti]);
        check(ctx, PATH_AUTO, types[ti], 33, 250, 264, 1, tol[ti]);
    }
    check(ctx, PATH_AUTO, DTYPE_F16, 7, 250, 264, 1, 1e-3);
    check(ctx, PATH_AUTO, DTYPE_F16, 1, 250, 264, 1, 1e-5); /* auto keeps m = 1 on the exact GEMV path */
    cr_assert(kern_cuda_ctx_bytes(ctx) >= 80000);
    cr_assert_eq(kern_cuda_ctx_bytes(ctx), kern_cuda_ctx_size(40 * 1000, 0));
    kern_cuda_ctx_free(ctx);
}

Test(cuda_matmul, rejects)
{
    SKIP_WITHOUT_GPU();
    float *d = dev_alloc(4096);
    cr_assert_eq(kern_cuda_matmul_gemv(NULL, d, 1, d, d, (enum dtype)5, NULL, 1, 1, 32, 0),
                 FERRY_ERR_UNSUPPORTED);
    cr_assert_eq(kern_cuda_matmul_gemv(NULL, d, 1, d, d, DTYPE_F16, NULL, 0, 1, 32, 0), FERRY_ERR_INVALID);
    cr_assert_eq(kern_cuda_matmul_gemv(NULL, d, 1, d, (char *)d + 1, DTYPE_F16, NULL, 1, 1, 32, 0),
                 FERRY_ERR_INVALID);
    cr_assert_eq(kern_cuda_matmul_gemv(NULL, d, 4, d, d, DTYPE_F16, NULL, 1, 5, 32, 0), FERRY_ERR_INVALID);
    cr_assert_eq(kern_cuda_matmul_gemm(NULL, d, 1, d, d, DTYPE_F16, NULL, 20, 1, 32, 0), FERRY_ERR_INVALID);
    kern_cuda_ctx_free(NULL);
    cudaFree(d);
}

/* The local reference (double sums of the stored weights' values) agrees with kern_cpu_matmul_ref. */
Test(cuda_matmul, reference_matches_cpu_oracle)
{
    rng_seed(15);
    const enum dtype all[] = {DTYPE_F16, DTYPE_BF16, DTYPE_F32, DTYPE_Q8_0};
    for (int ti = 0; ti < 4; ti++) {
        const int m = 3, n = 37, k = 128;
        struct wbuf w = make_w(all[ti], n, k);
        float *x = host_rand((size_t)m * k, -1, 1), *bias = host_rand(n, -1, 1),
              *y = malloc((size_t)m * n * 4);
        double *ref = malloc((size_t)m * n * 8);
        ref_matmul(ref, x, w.vals, bias, m, n, k);
        cr_assert_eq(kern_cpu_matmul_ref(y, x, w.host, all[ti], bias, m, n, k), FERRY_OK);
        double e = rel_err(y, ref, (size_t)m * n);
        cr_assert(e <= 1e-6, "%s: local ref vs kern_cpu_matmul_ref rel err %g", dtype_name(all[ti]), e);
        free(w.host);
        free(w.vals);
        free(x);
        free(bias);
        free(y);
        free(ref);
    }
}
