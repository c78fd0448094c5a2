/* CUDA Q8_0 GEMV (kern_cuda_gemv_q8) against double-precision references on random data, odd shapes.
 *
 * W is random f32 quantized with quant_row (ggml's reference Q8_0 quantizer: d = max|w|/127, q = round(w/d)),
 * so the scales and codes look like a real GGUF's; the references use its dequantized values (dequant_row),
 * so the weight quantization itself is not part of the error. Two references per case: exact x: the kernel
 * rounds x to f16 once (2^-11 relative per element, round-to-nearest-even; q is exact in f16, the products
 * are exact in f32), which averages to ~1.5e-4 relative error of y over k random terms: tolerance 1e-3 on ‖y
 * − ref‖ / ‖ref‖; x rounded to f16 (as the kernel does): what is left is f32 accumulation (tensor cores
 * within a block of 32, then one fma per block), so each element must satisfy |y − ref| <= 1e-4 · Σ|x·w| (the
 * worst case of f32 summation over k <= 4128 terms is ~k·2^-24 ≈ 2.5e-4 of Σ|x·w|, the random-walk case ~100x
 * less), and the whole tensor 2e-5. A wrong block, scale, row or k permutation gives O(1) errors on both.
 * Shapes: every m = 1..16, n not a multiple of the 16- or 32-row tiles, k = 32, 96 (rows of 34 and 102 bytes:
 * 2-byte aligned only), 4128 (a ragged last chunk), W starting 2 or 6 bytes past a 16-byte boundary (the
 * copy's edge path at both ends), n large enough for every split count. Every kernel configuration is run
 * (the automatic one and each forced one) on the same data, twice (bitwise equal), outputs poisoned with NaN;
 * y has 3 columns more than n (ldy), which must keep their NaN bits.
 */
#include "tests/cuda/cuda_test.h"

#include "kernels/cpu/matmul.h"
#include "kernels/cuda/gemv_q8.h"
#include "quant/dequant.h"

struct q8_case {
    uint8_t *w; /* (n, k) Q8_0 at w + woff */
    float *wv;  /* (n, k) dequantized */
    float *x, *bias;
    int m, n, k, woff;
};

static struct q8_case make_case(int m, int n, int k, int woff, int with_bias)
{
    struct q8_case c = {0};
    c.m = m;
    c.n = n;
    c.k = k;
    c.woff = woff;
    const size_t rb = dtype_row_size(DTYPE_Q8_0, k);
    c.w = malloc(rb * n + woff + 16);
    c.wv = malloc((size_t)n * k * 4);
    float *row = host_rand(k, -1, 1);
    for (int r = 0; r < n; r++) {
        const float s = 0.05f + 0.5f * (frand() + 1.0f); /* rows of different magnitude */
        for (int e = 0; e < k; e++) row[e] = frand() * s;
        cr_assert_eq(quant_row(DTYPE_Q8_0, row, c.w + woff + rb * r, k), FERRY_OK);
        cr_assert_eq(dequant_row(DTYPE_Q8_0, c.w + woff + rb * r, c.wv + (size_t)r * k, k), FERRY_OK);
    }
    free(row);
    c.x = host_rand((size_t)m * k, -1, 1);
    c.bias = with_bias ? host_rand(n, -1, 1) : NULL;
    return c;
}

static void free_case(struct q8_case *c)
{
    free(c->w);
    free(c->wv);
    free(c->x);
    free(c->bias);
}

/* y = x · Wᵀ + bias in double; with round_x, x rounded to f16 first. absum gets Σ|x·w| per element. */
static void ref_q8(double *y, double *absum, const struct q8_case *c, int round_x)
{
    for (int i = 0; i < c->m; i++)
        for (int j = 0; j < c->n; j++) {
            double s = c->bias ? c->bias[j] : 0.0, a = 0.0;
            const float *xr = c->x + (size_t)i * c->k, *wr = c->wv + (size_t)j * c->k;
            for (int e = 0; e < c->k; e++) {
                const double xv = round_x ? f16_to_f32(f32_to_f16(xr[e])) : xr[e];
                s += xv * wr[e];
                a += fabs(xv * wr[e]);
            }
            y[(size_t)i * c->n + j] = s;
            if (absum) absum[(size_t)i * c->n + j] = a;
        }
}

/* Runs every configuration on one case and checks it against both references. */
static void check_case(int m, int n, int k, int woff, int with_bias)
{
    struct q8_case c = make_case(m, n, k, woff, with_bias);
    const size_t ny = (size_t)m * n, wbytes = dtype_row_size(DTYPE_Q8_0, k) * n + woff;
    double *ref = malloc(ny * 8), *refr = malloc(ny * 8), *absum = malloc(ny * 8);
    ref_q8(ref, NULL, &c, 0);
    ref_q8(refr, absum, &c, 1);
    uint8_t *dw = dev_upload(c.w, wbytes);
    float *dx = dev_upload(c.x, (size_t)m * k * 4), *db = c.bias ? dev_upload(c.bias, n * 4) : NULL;
    const int ldy = n + 3; /* y is (m, ldy): columns past n must keep their NaN bits */
    const size_t nyl = (size_t)m * ldy;
    float *dy = dev_poison(nyl * 4);
    float *y = malloc(ny * 4), *y2 = malloc(ny * 4), *yl = malloc(nyl * 4);
    for (int cfg = 0; cfg <= KERN_CUDA_GEMV_Q8_CONFIGS; cfg++) {
        cr_assert_geq(kern_cuda_gemv_q8_set_config(cfg), 0);
        for (int rep = 0; rep < 2; rep++) {
            CU_OK(cudaMemset(dy, 0xFF, nyl * 4));
            const int rc = kern_cuda_gemv_q8(dy, ldy, dx, dw + woff, db, m, n, k, 0);
            cr_assert_eq(rc, FERRY_OK, "cfg %d m=%d n=%d k=%d: rc %d", cfg, m, n, k, rc);
            dev_download(yl, dy, nyl * 4);
            for (int i = 0; i < m; i++) {
                memcpy((rep ? y2 : y) + (size_t)i * n, yl + (size_t)i * ldy, (size_t)n * 4);
                for (int j = n; j < ldy; j++) {
                    uint32_t bits;
                    memcpy(&bits, yl + (size_t)i * ldy + j, 4);
                    cr_assert_eq(bits, 0xFFFFFFFFu, "cfg %d m=%d n=%d: y[%d][%d] past n written", cfg, m, n,
                                 i, j);
                }
            }
        }
        const double e = rel_err(y, ref, ny), er = rel_err(y, refr, ny);
        cr_assert(e <= 1e-3, "cfg %d (%s) m=%d n=%d k=%d woff=%d: rel err %g > 1e-3", cfg,
                  kern_cuda_gemv_q8_config_name(cfg), m, n, k, woff, e);
        cr_assert(er <= 2e-5, "cfg %d m=%d n=%d k=%d woff=%d: rel err vs f16-rounded-x reference %g > 2e-5",
                  cfg, m, n, k, woff, er);
        for (size_t i = 0; i < ny; i++)
            cr_assert(fabs(y[i] - refr[i]) <= 1e-4 * absum[i] + 1e-30,
                      "cfg %d m=%d n=%d k=%d: y[%zu] (row %zu of x, row %zu of W) = %.9g, ref %.9g, bound %g",
                      cfg, m, n, k, i, i / n, i % n, y[i], refr[i], 1e-4 * absum[i]);
        cr_assert(memcmp(y, y2, ny * 4) == 0, "cfg %d m=%d n=%d k=%d: two runs differ", cfg, m, n, k);
    }
    kern_cuda_gemv_q8_set_config(0);
    cudaFree(dw);
    cudaFree(dx);
    cudaFree(db);
    cudaFree(dy);
    free(y);
    free(y2);
    free(yl);
    free(ref);
    free(refr);
    free(absum);
    free_case(&c);
}

Test(cuda_gemv_q8, every_m_misaligned_rows)
{
    SKIP_WITHOUT_GPU();
    rng_seed(81);
    for (int m = 1; m <= 16; m++) check_case(m, 37 + 2 * m, m % 2 ? 96 : 32, m % 3 == 0 ? 2 : 0, m % 2);
}

Test(cuda_gemv_q8, long_rows_and_pointer_offsets)
{
    SKIP_WITHOUT_GPU();
    rng_seed(82);
    check_case(1, 1001, 4128, 2, 1); /* 129 blocks: ragged last chunk, rows 2 mod 16 */
    check_case(7, 333, 4128, 6, 0);
    check_case(16, 301, 4128, 0, 1);
    check_case(9, 65, 11008, 0, 1); /* an aligned Llama shape's k */
}

/* n large enough that the split choice goes through every count (1, 2, 4, 8 warps per row tile on 132 SMs)
 * and the grid has several blocks per SM. */
Test(cuda_gemv_q8, split_counts)
{
    SKIP_WITHOUT_GPU();
    rng_seed(83);
    check_case(3, 20001, 256, 2, 1);
    check_case(16, 3001, 1024, 0, 0);
    check_case(1, 9000, 512, 0, 1);
    check_case(12, 130, 2048, 2, 1);
}

/* No GPU needed: argument checks return before any CUDA call. */
Test(cuda_gemv_q8, bad_arguments)
{
    static float buf[64] __attribute__((aligned(16)));
    float *p = buf;
    cr_assert_eq(kern_cuda_gemv_q8(p, 1, p, p, NULL, 0, 1, 32, 0), FERRY_ERR_INVALID);
    cr_assert_eq(kern_cuda_gemv_q8(p, 1, p, p, NULL, 17, 1, 32, 0), FERRY_ERR_INVALID);
    cr_assert_eq(kern_cuda_gemv_q8(p, 1, p, p, NULL, 1, 0, 32, 0), FERRY_ERR_INVALID);
    cr_assert_eq(kern_cuda_gemv_q8(p, 2, p, p, NULL, 1, 3, 32, 0), FERRY_ERR_INVALID); /* ldy < n */
    cr_assert_eq(kern_cuda_gemv_q8(p, 1, p, p, NULL, 1, 1, 48, 0), FERRY_ERR_INVALID);
    cr_assert_eq(kern_cuda_gemv_q8(p, 1, p, p, NULL, 1, 1, 0, 0), FERRY_ERR_INVALID);
    cr_assert_eq(kern_cuda_gemv_q8(NULL, 1, p, p, NULL, 1, 1, 32, 0), FERRY_ERR_INVALID);
    cr_assert_eq(kern_cuda_gemv_q8(p, 1, p + 1, p, NULL, 1, 1, 32, 0),
                 FERRY_ERR_INVALID); /* x not 16-aligned */
    cr_assert_eq(kern_cuda_gemv_q8(p, 1, p, (char *)p + 1, NULL, 1, 1, 32, 0), FERRY_ERR_INVALID);
    cr_assert_eq(kern_cuda_gemv_q8_set_config(KERN_CUDA_GEMV_Q8_CONFIGS + 1), FERRY_ERR_INVALID);
    cr_assert_eq(kern_cuda_gemv_q8_set_config(-1), FERRY_ERR_INVALID);
}

/* No GPU needed: the local double reference agrees with the CPU oracle (kern_cpu_matmul_ref, which
 * dequantizes each element itself) on exact x. */
Test(cuda_gemv_q8, reference_matches_cpu_oracle)
{
    rng_seed(84);
    struct q8_case c = make_case(5, 29, 160, 0, 1);
    double *ref = malloc((size_t)5 * 29 * 8);
    float *y = malloc((size_t)5 * 29 * 4);
    ref_q8(ref, NULL, &c, 0);
    cr_assert_eq(kern_cpu_matmul_ref(y, c.x, c.w, DTYPE_Q8_0, c.bias, 5, 29, 160), FERRY_OK);
    for (int i = 0; i < 5 * 29; i++)
        cr_assert(fabs(y[i] - ref[i]) <= 1e-5 * (1 + fabs(ref[i])), "y[%d] %g vs %g", i, y[i], ref[i]);
    free(ref);
    free(y);
    free_case(&c);
}
