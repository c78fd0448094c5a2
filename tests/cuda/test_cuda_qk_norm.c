/* test_cuda_qk_norm — the CUDA kernels of the family ops (QK-norm, GeGLU) against their CPU references.
 *
 * kern_cuda_qk_norm against kern_cpu_qk_norm_ref on random q|k|v rows at odd shapes:
 * head sizes below, at and above a warp (and not multiples of it), GQA and MHA head counts, rows with padding
 * past the values (ld > row). The queries and keys must match within fp32 rounding of a sum of at most a few
 * hundred squares (|got - ref| <= 2e-6 |ref| + 1e-6); the values and the padding must be bitwise untouched.
 */
#include "kernels/cpu/ops.h"
#include "tests/cuda/cuda_test.h"

Test(cuda_qk_norm, odd_shapes)
{
    SKIP_WITHOUT_GPU();
    rng_seed(36);
    static const struct {
        int m, n_heads, n_kv, hd, pad;
    } cs[] = {{1, 1, 1, 2, 0},    {3, 7, 1, 31, 3},  {5, 8, 2, 64, 0},  {17, 6, 6, 33, 1},
              {2, 16, 8, 128, 5}, {9, 4, 2, 256, 0}, {1, 3, 3, 1000, 7}};
    for (size_t c = 0; c < sizeof cs / sizeof cs[0]; c++) {
        const int m = cs[c].m, nh = cs[c].n_heads, nkv = cs[c].n_kv, hd = cs[c].hd;
        const int ld = (nh + 2 * nkv) * hd + cs[c].pad;
        const size_t n = (size_t)m * ld;
        float *x = host_rand(n, -4, 4), *qw = host_rand((size_t)hd, 0.2f, 2.0f),
              *kw = host_rand((size_t)hd, -1.5f, 1.5f), *ref = malloc(n * 4), *got = malloc(n * 4);
        memcpy(ref, x, n * 4);
        kern_cpu_qk_norm_ref(ref, ld, qw, kw, m, nh, nkv, hd, 1e-6f);
        float *dx = dev_upload(x, n * 4), *dq = dev_upload(qw, (size_t)hd * 4),
              *dk = dev_upload(kw, (size_t)hd * 4);
        cr_assert_eq(kern_cuda_qk_norm(dx, ld, dq, dk, m, nh, nkv, hd, 1e-6f, 0), FERRY_OK);
        dev_download(got, dx, n * 4);
        for (int r = 0; r < m; r++)
            for (int j = 0; j < ld; j++) {
                const size_t i = (size_t)r * ld + j;
                if (j >= (nh + nkv) * hd) { /* values and padding */
                    cr_assert(memcmp(&got[i], &x[i], 4) == 0, "case %zu row %d col %d was written", c, r, j);
                    continue;
                }
                cr_assert(isfinite(got[i]) && fabsf(got[i] - ref[i]) <= 2e-6f * fabsf(ref[i]) + 1e-6f,
                          "case %zu row %d col %d: %g, reference %g", c, r, j, got[i], ref[i]);
            }
        cudaFree(dx);
        cudaFree(dq);
        cudaFree(dk);
        free(x);
        free(qw);
        free(kw);
        free(ref);
        free(got);
    }
}

Test(cuda_qk_norm, bad_arguments)
{
    SKIP_WITHOUT_GPU();
    float *d = dev_alloc(4096);
    cr_assert_eq(kern_cuda_qk_norm(d, 10, d, d, 1, 2, 1, 4, 1e-6f, 0), FERRY_ERR_INVALID, "ld below the row");
    cr_assert_eq(kern_cuda_qk_norm(d, 8192, d, d, 1, 2, 1, 2048, 1e-6f, 0), FERRY_ERR_INVALID,
                 "head_dim > 1024");
    cr_assert_eq(kern_cuda_qk_norm(NULL, 16, d, d, 1, 2, 1, 4, 1e-6f, 0), FERRY_ERR_INVALID);
    cr_assert_eq(kern_cuda_qk_norm(d, 16, d, d, 0, 2, 1, 4, 1e-6f, 0), FERRY_OK, "no rows");
    cudaFree(d);
}

/* GeGLU: gelu_tanh(gate) * up against the double reference, odd widths, |x| up to 6 (tanh saturating). */
Test(cuda_gelu_mul, odd_shapes)
{
    SKIP_WITHOUT_GPU();
    rng_seed(37);
    static const int ms[] = {1, 3, 17}, ffns[] = {1, 33, 1000, 4099};
    for (int a = 0; a < 3; a++)
        for (int b = 0; b < 4; b++) {
            const int m = ms[a], ffn = ffns[b];
            const size_t n = (size_t)m * ffn;
            float *gu = host_rand(2 * n, -6, 6), *ref = malloc(n * 4), *got = malloc(n * 4);
            for (int r = 0; r < m; r++) {
                memcpy(ref + (size_t)r * ffn, gu + (size_t)r * 2 * ffn, (size_t)ffn * 4);
                kern_cpu_gelu_mul_ref(ref + (size_t)r * ffn, gu + (size_t)r * 2 * ffn + ffn, ffn);
            }
            float *dgu = dev_upload(gu, 2 * n * 4), *dh = dev_poison(n * 4);
            cr_assert_eq(kern_cuda_gelu_mul(dh, dgu, m, ffn, 0), FERRY_OK);
            dev_download(got, dh, n * 4);
            for (size_t i = 0; i < n; i++)
                cr_assert(isfinite(got[i]) && fabsf(got[i] - ref[i]) <= 1e-5f * fabsf(ref[i]) + 1e-6f,
                          "m %d ffn %d [%zu]: %g, reference %g", m, ffn, i, got[i], ref[i]);
            cudaFree(dgu);
            cudaFree(dh);
            free(gu);
            free(ref);
            free(got);
        }
    cr_assert_eq(kern_cuda_gelu_mul(NULL, NULL, 1, 1, 0), FERRY_ERR_INVALID);
}
