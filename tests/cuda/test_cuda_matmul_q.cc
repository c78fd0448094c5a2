/* CUDA matmul with GGUF block weights (kernels/cuda/matmul_q.h through matmul.h's entries) against host
 * references, every type x m in {1,2,3,5,8,13,16,17,33,64,100,512} x odd n x k (multiples of 256 for the
 * K-quants, of 32 but not of 256 for the 32-blocks), random blocks with sane non-zero f16 scales, y poisoned
 * with NaN before every launch and wider than n (ldy > n: the columns past n must keep their NaN bits).
 *
 * References per checked element (double sums; x rows sampled when m > 16, every column):
 *   exact:  kern_cpu_matmul_ref (dequant_row of every weight, double accumulation), the CPU oracle;
 *   int8:   the int8 GEMV's arithmetic with exact sums: x quantized as the kernel does (tests/cuda/qref.h:
 *           bitwise the same xq and dx), Σ_units dx·Σ d(q+QOFF)·xq + m·Σx (A counts |m|·Σ|x| for the last
 *           term: the kernel's f32 sum of a block of x is off by a few roundings of that);
 *   f16:    the GEMM's arithmetic with exact sums: Σ f16(x)·f16(w), w = dequant_row's value.
 * Tolerances, derived (u = 2^-24, A = the sum of the magnitudes of the reference's terms):
 *   int8 path vs int8 ref: (k/32 + 16)·2u·A — one f32 rounding per unit term and per addition of the k/32
 *     unit terms, the lane tree and the split sum, each at most u relative to a partial sum <= A, doubled;
 *   int8 path vs exact: Σ|d(q+QOFF)|·dx/2 (each xq off by at most dx/2 from x/dx) + the above + 2u|exact|;
 *   f16 path vs f16 ref: (k/16 + 16)·8u·A — one tensor-core accumulation step per 16 products, allowing 4 ulp
 *     each (the tensor cores' f32 adds are not specified as round-to-nearest); a wrong element, block, scale
 * or offset gives errors of the order of A itself; f16 path vs exact: Σ|x·w|·(2^-11 + 2^-11 + 2^-22) (x and w
 * each rounded to f16 once) + the above + 2u|exact|. Every failing case prints one line (path, type, m, n, k,
 * ldy, the worst element and its error / tolerance) and the test fails at the end, so one GPU run reports
 * everything.
 */
#include <criterion/criterion.h>
#include <stdio.h>

#include <algorithm>
#include <vector>

#include "tests/cuda/qref.h"

extern "C" {
#include "kernels/cpu/matmul.h"
}
#include "kernels/cuda/matmul.h"
#include "kernels/cuda/matmul_q.h"
#include "kernels/cuda/ops.h"

#include <cuda_runtime_api.h>

#define SKIP_WITHOUT_GPU()                                                                                   \
    do {                                                                                                     \
        if (kern_cuda_device_count() <= 0)                                                                   \
            cr_skip_test("no CUDA device (cudaGetDeviceCount reports none); run tests/gpu/quant_kernels.sh " \
                         "on a GPU machine");                                                                \
    } while (0)
#define CU_OK(call) cr_assert_eq((call), cudaSuccess, "%s failed", #call)

static const double U24 = 0x1.0p-24;

template <class Q> static void get_align(int *a)
{
    *a = Q::ALIGN;
}
/* The alignment W must have for type t (its blocks' alignment). */
static int w_align(enum dtype t)
{
    int a = 0;
    QREF_DISPATCH(t, get_align, &a);
    return a;
}

/* A weight matrix on the host: stored blocks (at an offset from 16-byte alignment), dequantized values, and
 * the int8 path's view (d·(q+QOFF) per element, m per unit). */
struct wmat {
    enum dtype t;
    int n, k, woff;
    std::vector<uint8_t> buf;
    uint8_t *w;
    size_t bytes;
    std::vector<float> deq; /* (n, k) */
    std::vector<double> wd; /* (n, k) d(i)·(q_i + QOFF) */
    std::vector<double> um; /* (n, k/32) unit minimum term */
};

template <class Q> static void fill_views(wmat *W)
{
    const size_t rb = dtype_row_size(W->t, W->k);
    for (int r = 0; r < W->n; r++)
        for (int U = 0; U < W->k / 32; U++) {
            qb_unit u;
            qref_unit<Q>(W->w + rb * r, U, u);
            for (int i = 0; i < 32; i++) {
                const int q = (int)(int8_t)(u.q[i >> 2] >> (8 * (i & 3))) + Q::QOFF;
                W->wd[(size_t)r * W->k + 32 * U + i] = (double)(i < 16 ? u.d0 : u.d1) * q;
            }
            W->um[(size_t)r * (W->k / 32) + U] = Q::HAS_M ? (double)u.m : 0.0;
        }
}

static void make_wmat(wmat *W, enum dtype t, int n, int k, int woff)
{
    W->t = t, W->n = n, W->k = k, W->woff = woff;
    const size_t rb = dtype_row_size(t, k);
    W->bytes = rb * n;
    W->buf.assign(W->bytes + 64, 0);
    W->w = W->buf.data() + (16 - (uintptr_t)W->buf.data() % 16) % 16 + woff;
    qref_random_blocks(t, W->w, (int64_t)n * k / dtype_block_size(t));
    W->deq.resize((size_t)n * k);
    W->wd.resize((size_t)n * k);
    W->um.resize((size_t)n * (k / 32));
    for (int r = 0; r < n; r++)
        cr_assert_eq(dequant_row(t, W->w + rb * r, W->deq.data() + (size_t)r * k, k), 0);
    cr_assert(QREF_DISPATCH(t, fill_views, W));
}

enum path { PATH_AUTO, PATH_GEMV, PATH_GEMM };
static const char *const path_names[] = {"auto", "gemv entry", "gemm entry"};

/* Whether a call takes the int8 GEMV (else the f16 GEMM), given the threshold in force. */
static int uses_int8(enum path p, int m, int thr)
{
    if (p == PATH_GEMM) return 0;
    if (p == PATH_AUTO && m > KERN_CUDA_GEMV_MAX_M) return 0;
    return m <= thr;
}

struct xdata {
    int m, k;
    std::vector<float> x;
    qref_xq xq;
};

static void make_x(xdata *X, int m, int k)
{
    X->m = m, X->k = k;
    X->x.resize((size_t)m * k);
    for (size_t i = 0; i < X->x.size(); i++) X->x[i] = qref_frand() * (i % 17 == 3 ? 4.0f : 1.0f);
    for (int i = 0; i < 32 && i < k; i++) X->x[i] = 0.0f; /* one block of zeros: dx = 0 */
    qref_quantize_x(X->x.data(), m, k, &X->xq);
}

/* The x rows a case checks: all when m <= 16, else the edges of the 16/32/64/128-row tiles and a few more. */
static std::vector<int> checked_rows(int m)
{
    std::vector<int> r;
    if (m <= 16) {
        for (int i = 0; i < m; i++) r.push_back(i);
        return r;
    }
    const int cand[] = {0, 1, 2, 15, 16, 17, 31, 32, 63, 64, 127, 128, m / 2, m - 3, m - 2, m - 1};
    for (int c : cand)
        if (c >= 0 && c < m && (r.empty() || std::find(r.begin(), r.end(), c) == r.end())) r.push_back(c);
    return r;
}

struct refs {
    std::vector<int> rows;
    std::vector<double> exact, q8, q8abs, q8bound, h, habs, xwabs; /* (rows, n) */
};

static void make_refs(refs *R, const wmat *W, const xdata *X, const float *bias)
{
    const int n = W->n, k = W->k, ku = k / 32;
    R->rows = checked_rows(X->m);
    const size_t nr = R->rows.size();
    std::vector<float> xs(nr * k), ys(nr * n);
    for (size_t i = 0; i < nr; i++) memcpy(&xs[i * k], &X->x[(size_t)R->rows[i] * k], (size_t)k * 4);
    cr_assert_eq(kern_cpu_matmul_ref(ys.data(), xs.data(), W->w, W->t, bias, (int)nr, n, k), 0);
    R->exact.assign(ys.begin(), ys.end());
    R->q8.assign(nr * n, 0), R->q8abs.assign(nr * n, 0), R->q8bound.assign(nr * n, 0);
    R->h.assign(nr * n, 0), R->habs.assign(nr * n, 0), R->xwabs.assign(nr * n, 0);
    std::vector<float> xh(k), wh((size_t)n * k);
    for (size_t e = 0; e < wh.size(); e++) wh[e] = f16_to_f32(f32_to_f16(W->deq[e]));
    for (size_t i = 0; i < nr; i++) {
        const int xr = R->rows[i];
        const float *x = &X->x[(size_t)xr * k];
        const int8_t *xq = X->xq.q + (size_t)xr * k;
        for (int e = 0; e < k; e++) xh[e] = f16_to_f32(f32_to_f16(x[e]));
        for (int j = 0; j < n; j++) {
            const double b = bias ? bias[j] : 0.0;
            const double *wd = &W->wd[(size_t)j * k];
            const float *wr = &W->deq[(size_t)j * k], *whr = &wh[(size_t)j * k];
            double q8 = b, q8a = fabs(b), q8b = 0, h = b, ha = fabs(b), xwa = 0;
            for (int U = 0; U < ku; U++) {
                const size_t xu = (size_t)xr * ku + U;
                const double dx = X->xq.dx[xu];
                double t = 0, ta = 0, bd = 0;
                for (int i2 = 0; i2 < 32; i2++) {
                    const double v = wd[32 * U + i2] * xq[32 * U + i2];
                    t += v, ta += fabs(v), bd += fabs(wd[32 * U + i2]);
                }
                /* The minimum term with the exact sum of x; the kernel's f32 sum of the block is off by at
                 * most a few roundings of Σ|x|, so that magnitude joins the terms'. */
                const double um = W->um[(size_t)j * ku + U];
                q8 += t * dx + um * X->xq.sxd[xu], q8a += ta * dx + fabs(um) * X->xq.sxa[xu];
                q8b += bd * 0.5 * dx;
            }
            for (int e = 0; e < k; e++) {
                const double v = (double)xh[e] * whr[e];
                h += v, ha += fabs(v), xwa += fabs((double)x[e] * wr[e]);
            }
            const size_t o = i * n + j;
            R->q8[o] = q8, R->q8abs[o] = q8a, R->q8bound[o] = q8b, R->h[o] = h, R->habs[o] = ha,
            R->xwabs[o] = xwa;
        }
    }
}

/* Checks y (m, ldy) from the device against the references; returns 1 when it passes, else prints the worst
 * element and returns 0. */
static int check_y(const char *what, const wmat *W, const xdata *X, const refs *R,
                   const std::vector<float> &y, int ldy, int int8, int quiet = 0)
{
    const int n = W->n, k = W->k, m = X->m;
    for (int r = 0; r < m; r++)
        for (int j = 0; j < ldy; j++) {
            const float v = y[(size_t)r * ldy + j];
            uint32_t bits;
            memcpy(&bits, &v, 4);
            if (j < n && !isfinite(v)) {
                if (!quiet)
                    fprintf(stderr, "FAIL %s: y[%d][%d] = %g (unwritten or not finite)\n", what, r, j, v);
                return 0;
            }
            if (j >= n && bits != 0xFFFFFFFFu) {
                if (!quiet)
                    fprintf(stderr, "FAIL %s: y[%d][%d] past n = %d was written (%g)\n", what, r, j, n, v);
                return 0;
            }
        }
    double worst = 0;
    int wi = -1, wj = -1, wref = 0;
    double wgot = 0, wval = 0, wtol = 0;
    for (size_t i = 0; i < R->rows.size(); i++)
        for (int j = 0; j < n; j++) {
            const size_t o = i * n + j;
            const double got = y[(size_t)R->rows[i] * ldy + j], ex = R->exact[o];
            double ref, tol, tol_ex;
            if (int8) {
                ref = R->q8[o];
                tol = (k / 32 + 16) * 2 * U24 * R->q8abs[o];
                tol_ex = R->q8bound[o] + tol + 2 * U24 * fabs(ex);
            } else {
                ref = R->h[o];
                tol = (k / 16 + 16) * 8 * U24 * R->habs[o];
                tol_ex = R->xwabs[o] * (0x1.0p-10 + 0x1.0p-22) + tol + 2 * U24 * fabs(ex);
            }
            const double e1 = fabs(got - ref) / (tol + 1e-30), e2 = fabs(got - ex) / (tol_ex + 1e-30);
            if (e1 > worst || e2 > worst) {
                worst = e1 > e2 ? e1 : e2;
                wi = R->rows[i], wj = j, wgot = got, wref = e1 >= e2;
                wval = wref ? ref : ex, wtol = wref ? tol : tol_ex;
            }
        }
    if (worst <= 1.0) return 1;
    if (quiet) return 0;
    fprintf(stderr,
            "FAIL %s: worst y[%d][%d] = %.9g vs %s reference %.9g: error %.3g = %.3g x tolerance %.3g\n",
            what, wi, wj, wgot, wref ? (int8 ? "int8-path" : "f16-path") : "exact", wval, fabs(wgot - wval),
            worst, wtol);
    return 0;
}

struct dev_case {
    void *w;
    float *x, *y, *bias;
    int ldy;
};

/* Runs one path twice (NaN-poisoned y each time), checks it, and compares the two runs bitwise. Returns the
 * number of failures (0 or 1); a forced configuration the device cannot hold is skipped. */
static int run_path(struct kern_cuda_ctx *ctx, enum path p, const wmat *W, const xdata *X, const refs *R,
                    const dev_case *D, const float *bias, int thr, const char *cfg)
{
    const int m = X->m, n = W->n, k = W->k, ldy = D->ldy;
    const size_t ybytes = (size_t)m * ldy * 4;
    std::vector<float> y[2];
    char what[200];
    snprintf(what, sizeof what, "%s%s %s m=%d n=%d k=%d ldy=%d woff=%d bias=%d", path_names[p], cfg,
             dtype_name(W->t), m, n, k, ldy, W->woff, bias != NULL);
    for (int rep = 0; rep < 2; rep++) {
        CU_OK(cudaMemset(D->y, 0xFF, ybytes));
        const float *db = bias ? D->bias : NULL;
        const int rc = p == PATH_AUTO ? kern_cuda_matmul(ctx, D->y, ldy, D->x, D->w, W->t, db, m, n, k, 0)
                       : p == PATH_GEMV
                           ? kern_cuda_matmul_gemv(ctx, D->y, ldy, D->x, D->w, W->t, db, m, n, k, 0)
                           : kern_cuda_matmul_gemm(ctx, D->y, ldy, D->x, D->w, W->t, db, m, n, k, 0);
        if (rc == FERRY_ERR_UNSUPPORTED && cfg[0])
            return 0; /* forced configuration too large for this device */
        if (rc != FERRY_OK) {
            fprintf(stderr, "FAIL %s: rc %d (%s)\n", what, rc, ferry_status_str(rc));
            return 1;
        }
        y[rep].resize((size_t)m * ldy);
        CU_OK(cudaDeviceSynchronize());
        CU_OK(cudaMemcpy(y[rep].data(), D->y, ybytes, cudaMemcpyDeviceToHost));
    }
    if (!check_y(what, W, X, R, y[0], ldy, uses_int8(p, m, thr))) return 1;
    if (memcmp(y[0].data(), y[1].data(), ybytes)) {
        fprintf(stderr, "FAIL %s: two runs differ\n", what);
        return 1;
    }
    return 0;
}

/* The batch sizes; QMM_TEST_MS="1,5,17" in the environment runs a subset (for compute-sanitizer runs). */
static std::vector<int> test_ms(void)
{
    std::vector<int> v = {1, 2, 3, 5, 8, 13, 16, 17, 33, 64, 100, 512};
    const char *e = getenv("QMM_TEST_MS");
    if (e && *e) {
        v.clear();
        for (char *p = (char *)e; *p;) {
            const long m = strtol(p, &p, 10);
            if (m > 0 && m <= 4096) v.push_back((int)m);
            while (*p == ',' || *p == ' ') p++;
            if (*p && (*p < '0' || *p > '9')) break;
        }
    }
    return v;
}

/* One weight matrix, every m: the automatic path, the decode entry with the int8 threshold at its maximum,
 * and the large-batch entry; with sweep, every forced configuration too. Returns the number of failures. */
static int check_matrix(struct kern_cuda_ctx *ctx, enum dtype t, int n, int k, int ldy, int woff,
                        int with_bias, int sweep, int m_max)
{
    wmat W;
    make_wmat(&W, t, n, k, woff);
    std::vector<float> bias(n);
    for (int j = 0; j < n; j++) bias[j] = qref_frand();
    dev_case D;
    D.ldy = ldy;
    CU_OK(cudaMalloc(&D.w, W.bytes + 64));
    /* The same offset from 16-byte alignment on the device as on the host. */
    uint8_t *dw = (uint8_t *)D.w + woff;
    CU_OK(cudaMemcpy(dw, W.w, W.bytes, cudaMemcpyHostToDevice));
    D.w = dw;
    CU_OK(cudaMalloc((void **)&D.bias, (size_t)n * 4));
    CU_OK(cudaMemcpy(D.bias, bias.data(), (size_t)n * 4, cudaMemcpyHostToDevice));
    int fails = 0;
    const std::vector<int> ms = test_ms();
    for (size_t mi = 0; mi < ms.size(); mi++) {
        const int m = ms[mi];
        if (m > m_max) continue;
        xdata X;
        make_x(&X, m, k);
        const float *b = with_bias && mi % 2 == 0 ? bias.data() : NULL;
        refs R;
        make_refs(&R, &W, &X, b);
        CU_OK(cudaMalloc((void **)&D.x, (size_t)m * k * 4));
        CU_OK(cudaMemcpy(D.x, X.x.data(), (size_t)m * k * 4, cudaMemcpyHostToDevice));
        CU_OK(cudaMalloc((void **)&D.y, (size_t)m * ldy * 4));
        kern_cuda_qmm_set_gemv_max_m(-1);
        fails += run_path(ctx, PATH_AUTO, &W, &X, &R, &D, b, KERN_CUDA_QGEMV_DEFAULT_M, "");
        kern_cuda_qmm_set_gemv_max_m(KERN_CUDA_QGEMV_MAX_M);
        fails += run_path(ctx, PATH_GEMV, &W, &X, &R, &D, b, KERN_CUDA_QGEMV_MAX_M, "");
        kern_cuda_qmm_set_gemv_max_m(-1);
        fails += run_path(ctx, PATH_GEMM, &W, &X, &R, &D, b, 0, "");
        if (sweep) {
            char cfg[48];
            kern_cuda_qmm_set_gemv_max_m(KERN_CUDA_QGEMV_MAX_M);
            for (int c = 1; c <= KERN_CUDA_QGEMV_CONFIGS && m <= KERN_CUDA_QGEMV_MAX_M; c++) {
                kern_cuda_qmm_set_gemv_config(c);
                snprintf(cfg, sizeof cfg, " (gemv cfg %d)", c);
                fails += run_path(ctx, PATH_GEMV, &W, &X, &R, &D, b, KERN_CUDA_QGEMV_MAX_M, cfg);
            }
            kern_cuda_qmm_set_gemv_config(0);
            kern_cuda_qmm_set_gemv_max_m(-1);
            for (int c = 1; c <= KERN_CUDA_QGEMM_CONFIGS; c++) {
                kern_cuda_qmm_set_gemm_config(c);
                snprintf(cfg, sizeof cfg, " (gemm cfg %d)", c);
                fails += run_path(ctx, PATH_GEMM, &W, &X, &R, &D, b, 0, cfg);
            }
            kern_cuda_qmm_set_gemm_config(0);
        }
        cudaFree(D.x);
        cudaFree(D.y);
        qref_free_xq(&X.xq);
    }
    cudaFree((uint8_t *)D.w - woff);
    cudaFree(D.bias);
    return fails;
}

/* k: a multiple of 256 for the K-quants, of 32 but not of 256 for the 32-blocks. */
static int k_of(enum dtype t, int k256, int extra32)
{
    return dtype_block_size(t) == 256 ? k256 : k256 + 32 * extra32;
}

static struct kern_cuda_ctx *make_ctx(size_t max_x)
{
    struct kern_cuda_ctx *ctx = NULL;
    cr_assert_eq(kern_cuda_ctx_init(&ctx, max_x), FERRY_OK);
    return ctx;
}

/* Small n, every m, every forced configuration; W 16-byte aligned and at the type's smallest alignment. */
Test(cuda_matmul_q, every_type_every_m_small_n_all_configs)
{
    SKIP_WITHOUT_GPU();
    qref_seed(101);
    struct kern_cuda_ctx *ctx = make_ctx((size_t)512 * 1024);
    int fails = 0;
    for (int ti = 0; ti < QREF_NTYPES; ti++) {
        const enum dtype t = qref_types[ti];
        const int al = w_align(t);
        fails += check_matrix(ctx, t, 37, k_of(t, 512, 3), 40, al < 16 ? al : 0, 1, 1, 512);
    }
    kern_cuda_ctx_free(ctx);
    cr_assert_eq(fails, 0, "%d failing cases (see the FAIL lines above)", fails);
}

/* n = 4097 (many row tiles, splits and grids) and long rows (many chunks, raw stages and k tiles). */
Test(cuda_matmul_q, every_type_every_m_large_shapes)
{
    SKIP_WITHOUT_GPU();
    qref_seed(102);
    struct kern_cuda_ctx *ctx = make_ctx((size_t)512 * 2400);
    int fails = 0;
    for (int ti = 0; ti < QREF_NTYPES; ti++) {
        const enum dtype t = qref_types[ti];
        const int al = w_align(t);
        fails += check_matrix(ctx, t, 4097, k_of(t, 256, 1), 4097, 0, 0, 0, 512);
        fails += check_matrix(ctx, t, 129, k_of(t, 2304, 7), 131, al < 16 ? al : 0, 1, 0, 512);
    }
    kern_cuda_ctx_free(ctx);
    cr_assert_eq(fails, 0, "%d failing cases (see the FAIL lines above)", fails);
}

/* A workspace of 100 rows of x: the GEMM runs m = 512 in chunks of 100; one row less than k: FERRY_ERR_RANGE.
 */
Test(cuda_matmul_q, small_workspace_row_chunks)
{
    SKIP_WITHOUT_GPU();
    qref_seed(103);
    int fails = 0;
    for (int ti = 0; ti < QREF_NTYPES; ti++) {
        const enum dtype t = qref_types[ti];
        const int k = k_of(t, 512, 1);
        struct kern_cuda_ctx *ctx = make_ctx((size_t)100 * k);
        fails += check_matrix(ctx, t, 77, k, 77, 0, 1, 0, 512);
        kern_cuda_ctx_free(ctx);
        ctx = make_ctx((size_t)k / 2 - 1);
        float *d = NULL;
        CU_OK(cudaMalloc((void **)&d, (size_t)k * 4 * 4));
        cr_assert_eq(kern_cuda_matmul(ctx, d, 1, d, d, t, NULL, 1, 1, k, 0), FERRY_ERR_RANGE, "%s",
                     dtype_name(t));
        cr_assert_eq(kern_cuda_matmul(ctx, d, 1, d, d, t, NULL, 20, 1, k, 0), FERRY_ERR_RANGE, "%s",
                     dtype_name(t));
        cudaFree(d);
        kern_cuda_ctx_free(ctx);
    }
    cr_assert_eq(fails, 0, "%d failing cases (see the FAIL lines above)", fails);
}

/* No GPU needed: argument checks return before any CUDA call. */
Test(cuda_matmul_q, rejects_bad_arguments)
{
    static float buf[4096] __attribute__((aligned(16)));
    float *p = buf;
    struct kern_cuda_ctx *ctx = (struct kern_cuda_ctx *)buf; /* never dereferenced: the checks fail first */
    for (int ti = 0; ti < QREF_NTYPES; ti++) {
        const enum dtype t = qref_types[ti];
        const int bs = dtype_block_size(t), al = w_align(t);
        cr_assert(kern_cuda_matmul_supports(t), "%s", dtype_name(t));
        cr_assert_eq(kern_cuda_matmul(ctx, p, 1, p, p, t, NULL, 1, 1, bs == 256 ? 288 : 48, 0),
                     FERRY_ERR_INVALID, "%s: k not a multiple of the block", dtype_name(t));
        cr_assert_eq(kern_cuda_matmul(ctx, p, 1, p, (char *)p + al / 2, t, NULL, 1, 1, bs, 0),
                     FERRY_ERR_INVALID, "%s: W misaligned", dtype_name(t));
        cr_assert_eq(kern_cuda_matmul(ctx, p, 1, p + 1, p, t, NULL, 1, 1, bs, 0), FERRY_ERR_INVALID,
                     "%s: x not 16-byte aligned", dtype_name(t));
        cr_assert_eq(kern_cuda_matmul(ctx, p, 2, p, p, t, NULL, 1, 3, bs, 0), FERRY_ERR_INVALID,
                     "%s: ldy < n", dtype_name(t));
        cr_assert_eq(kern_cuda_matmul(NULL, p, 1, p, p, t, NULL, 1, 1, bs, 0), FERRY_ERR_INVALID,
                     "%s: no context", dtype_name(t));
        cr_assert_eq(kern_cuda_matmul_gemm(NULL, p, 1, p, p, t, NULL, 20, 1, bs, 0), FERRY_ERR_INVALID,
                     "%s: no context", dtype_name(t));
        cr_assert_eq(kern_cuda_matmul(ctx, p, 1, p, p, t, NULL, 0, 1, bs, 0), FERRY_ERR_INVALID, "m = 0");
    }
    cr_assert(!kern_cuda_matmul_supports((enum dtype)5));
    cr_assert(!kern_cuda_matmul_supports((enum dtype)99));
    cr_assert_eq(kern_cuda_matmul(ctx, p, 1, p, p, (enum dtype)5, NULL, 1, 1, 32, 0), FERRY_ERR_UNSUPPORTED);
    cr_assert(kern_cuda_matmul_supports(DTYPE_F16) && kern_cuda_matmul_supports(DTYPE_BF16) &&
              kern_cuda_matmul_supports(DTYPE_F32));
    cr_assert_eq(kern_cuda_qmm_set_gemv_max_m(KERN_CUDA_QGEMV_MAX_M + 1), FERRY_ERR_INVALID);
    cr_assert_eq(kern_cuda_qmm_set_gemv_config(KERN_CUDA_QGEMV_CONFIGS + 1), FERRY_ERR_INVALID);
    cr_assert_eq(kern_cuda_qmm_set_gemm_config(-1), FERRY_ERR_INVALID);
    cr_assert(kern_cuda_ctx_size(1000) >= 2000);
}

/* No GPU needed: the references and tolerances above are consistent on their own. y built from the int8-path
 * reference must pass as an int8-path result (so its bound against the exact product holds on real data), y
 * built from the f16-path reference likewise; either, with one element moved by 5x its tolerance, must fail.
 */
Test(cuda_matmul_q, references_within_their_bounds)
{
    qref_seed(104);
    const int ms2[3] = {1, 5, 33};
    for (int ti = 0; ti < QREF_NTYPES; ti++) {
        const enum dtype t = qref_types[ti];
        const int n = 19, k = k_of(t, 512, 3), ldy = n + 2;
        wmat W;
        make_wmat(&W, t, n, k, 0);
        std::vector<float> bias(n);
        for (int j = 0; j < n; j++) bias[j] = qref_frand();
        for (int mi = 0; mi < 3; mi++) {
            const int m = ms2[mi];
            xdata X;
            make_x(&X, m, k);
            refs R;
            make_refs(&R, &W, &X, bias.data());
            for (int int8 = 0; int8 < 2; int8++) {
                std::vector<float> y((size_t)m * ldy);
                memset(y.data(), 0xFF, y.size() * 4);
                for (size_t i = 0; i < R.rows.size(); i++)
                    for (int j = 0; j < n; j++)
                        y[(size_t)R.rows[i] * ldy + j] = (float)(int8 ? R.q8[i * n + j] : R.h[i * n + j]);
                for (int r = 0; r < m; r++) /* rows the references skip: any finite value */
                    if (std::find(R.rows.begin(), R.rows.end(), r) == R.rows.end())
                        for (int j = 0; j < n; j++) y[(size_t)r * ldy + j] = 0.0f;
                char what[64];
                snprintf(what, sizeof what, "self-check %s m=%d %s", dtype_name(t), m, int8 ? "int8" : "f16");
                cr_assert(check_y(what, &W, &X, &R, y, ldy, int8), "%s: a reference fails its own bounds",
                          what);
                const size_t o = (R.rows.size() / 2) * n + n / 2;
                const double tol =
                    int8 ? (k / 32 + 16) * 2 * U24 * R.q8abs[o] : (k / 16 + 16) * 8 * U24 * R.habs[o];
                y[(size_t)R.rows[R.rows.size() / 2] * ldy + n / 2] += (float)(5 * tol);
                cr_assert(!check_y(what, &W, &X, &R, y, ldy, int8, 1), "%s: a wrong element passes", what);
            }
            qref_free_xq(&X.xq);
        }
    }
}
