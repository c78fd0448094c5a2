/* CUDA matmul with GGUF block weights (kernels/cuda/matmul_q.h through matmul.h's entries) against host
 * references, every type x m in {1,2,3,5,8,13,16,17,33,64,100,512} x odd n x k (multiples of 256 for the
 * K-quants, of 32 but not of 256 for the 32-blocks; small k = 32..288 too), random blocks with sane non-zero
 * f16 scales, y poisoned with NaN before every launch and wider than n (ldy > n: the columns past n must keep
 * their NaN bits). Every variant of kern_cuda_qmm_set_variant runs (forced) besides the automatic choice and
 * the GEMM entry, so one GPU run validates every kernel and configuration the table can pick.
 *
 * References per checked element (double sums; x rows sampled when m > 16, every column):
 *   exact:  kern_cpu_matmul_ref (dequant_row of every weight, double accumulation), the CPU oracle;
 *   int8:   the int8 paths' arithmetic with exact sums (dp4a GEMV, int8 MMA): x quantized as the kernels do
 *           (tests/cuda/qref.h: bitwise the same xq and dx), Σ_units dx·Σ d(q+QOFF)·xq + m·Σx (A counts
 * |m|·Σ|x| for the last term: the kernel's f32 sum of a block of x is off by a few roundings of that); f16:
 * the GEMM's (and the f16 pieces') arithmetic with exact sums: Σ f16(x)·f16(w), w = dequant_row's value;
 * f16x: kern_cuda_gemv_q8's (Q8_0 only): Σ f16(x)·w, w exact (q in f16, d applied in f32 per block).
 * Tolerances, derived (u = 2^-24, A = the sum of the magnitudes of the reference's terms): int8 path vs int8
 * ref: (k/32 + 16)·2u·A — one f32 rounding per unit term and per addition of the k/32 unit terms, the lane
 * tree and the split sum, each at most u relative to a partial sum <= A, doubled; int8 path vs exact:
 * Σ|d(q+QOFF)|·dx/2 (each xq off by at most dx/2 from x/dx; Σ|w|·dx/2 for Q2_K, whose minimum per 16 elements
 * multiplies Σxq·dx, as llama.cpp's MMVQ/MMQ do, not the f32 Σx) + the above + 2u|exact|; f16 paths vs their
 * ref: (k/16 + 16)·8u·A — one tensor-core accumulation step per 16 products, allowing 4 ulp each (the tensor
 * cores' f32 adds are not specified as round-to-nearest); a wrong element, block, scale or offset gives
 * errors of the order of A itself; f16 path vs exact: Σ|x·w|·(2^-11 + 2^-11 + 2^-22) (x and w each rounded to
 * f16 once) + the above + 2u|exact| (f16x: x only). Every failing case prints one line (variant, type, m, n,
 * k, ldy, the worst element and its error / tolerance) and the test fails at the end, so one GPU run reports
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
    std::vector<float> deq;  /* (n, k) */
    std::vector<double> wd;  /* (n, k) d(i)·(q_i + QOFF) */
    std::vector<double> um;  /* (n, k/32) unit minimum term */
    std::vector<double> um1; /* (n, k/32) TWO_M types: the minimum of elements 16..31 (um: of 0..15) */
    bool two_m;
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
            W->um1[(size_t)r * (W->k / 32) + U] = Q::TWO_M ? (double)u.m1 : 0.0;
            W->two_m = Q::TWO_M;
        }
}

/* Q2_K blocks at the edges of their fields, block b by b % 8 and sub-block j (on top of random blocks): the
 * 4-bit scale and minimum of each 16 at 0 and 15 in every combination (a pure minimum, a pure scale,
 * neither), the sub-blocks' minimums differing between the two halves of a unit of 32 (so a kernel that
 * swapped them, or used one for both, is off), quants all 0, all 3 or random, and d and dmin of either sign,
 * of very different sizes, or zero (dmin < 0 makes the minimum term add: its sign must survive every path).
 */
static void q2k_extreme_blocks(uint8_t *w, int64_t nb)
{
    static const uint8_t sc_mn[8][2] = {{15, 15}, {0, 15}, {15, 0}, {0, 0}, {1, 15}, {15, 1}, {7, 8}, {8, 7}};
    for (int64_t b = 0; b < nb; b++) {
        uint8_t *p = w + (size_t)b * 84;
        const int kind = (int)(b % 8);
        for (int j = 0; j < 16; j++) {
            const uint8_t *c = sc_mn[(j + kind) % 8];
            if (kind != 7) p[j] = (uint8_t)(c[0] | c[1] << 4); /* kind 7: random scale bytes */
        }
        if (kind == 2) memset(p + 16, 0x00, 64); /* every q = 0: the minimums alone */
        if (kind == 3) memset(p + 16, 0xFF, 64); /* every q = 3 */
        const uint16_t big = f32_to_f16(0.25f), small = f32_to_f16(0x1.0p-12f), neg = 0x8000;
        uint16_t d, dmin;
        switch (kind) {
        case 0:
            d = big, dmin = big | neg;
            break; /* minimum term added */
        case 1:
            d = small, dmin = big;
            break; /* minimum dominates */
        case 2:
            d = big | neg, dmin = small | neg;
            break;
        case 3:
            d = 0, dmin = big | neg;
            break; /* no scale at all */
        case 4:
            d = big, dmin = 0x8000;
            break; /* dmin = -0 */
        case 5:
            d = small | neg, dmin = small;
            break;
        default:
            d = qref_scale(), dmin = qref_scale();
            break;
        }
        qref_put16(p + 80, d);
        qref_put16(p + 82, dmin);
    }
}

static void make_wmat(wmat *W, enum dtype t, int n, int k, int woff, bool extreme = false)
{
    W->t = t, W->n = n, W->k = k, W->woff = woff;
    const size_t rb = dtype_row_size(t, k);
    W->bytes = rb * n;
    W->buf.assign(W->bytes + 64, 0);
    W->w = W->buf.data() + (16 - (uintptr_t)W->buf.data() % 16) % 16 + woff;
    qref_random_blocks(t, W->w, (int64_t)n * k / dtype_block_size(t));
    if (extreme && t == DTYPE_Q2_K) q2k_extreme_blocks(W->w, (int64_t)n * k / 256);
    W->deq.resize((size_t)n * k);
    W->wd.resize((size_t)n * k);
    W->um.resize((size_t)n * (k / 32));
    W->um1.resize((size_t)n * (k / 32));
    for (int r = 0; r < n; r++)
        cr_assert_eq(dequant_row(t, W->w + rb * r, W->deq.data() + (size_t)r * k, k), 0);
    cr_assert(QREF_DISPATCH(t, fill_views, W));
}

/* Which arithmetic a variant runs (which reference it is checked against). */
enum ref_kind { REF_INT8, REF_F16, REF_F16X };
static const char *const ref_names[] = {"int8-path", "f16-path", "f16x-path"};

/* What a call runs: the automatic choice (kern_cuda_matmul), the GEMM entry, or a forced variant. */
enum { RUN_AUTO = -1, RUN_GEMM_ENTRY = -2 };

/* The arithmetic variant v runs at m rows with the context's workspace (ws bytes): the int8 kernels run in
 * the row tiles ws holds (the MMA falling back to the dp4a GEMV below 8 rows), down to one row; below that,
 * the GEMM.
 */
static enum ref_kind ref_of(enum dtype t, int v, int m, int k, size_t ws)
{
    if (v == RUN_GEMM_ENTRY) v = KERN_QV_GEMM;
    if (v == RUN_AUTO) v = kern_cuda_qmm_pick(t, m);
    switch (kern_cuda_qmm_variant_path(v)) {
    case KERN_QPATH_INT8:
        return kern_cuda_qmm_x8_ws(1, k) <= ws ? REF_INT8 : REF_F16;
    case KERN_QPATH_F16X:
        return REF_F16X;
    default:
        return REF_F16;
    }
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
    std::vector<double> exact, q8, q8abs, q8bound, h, habs, xwabs, hx, hxabs; /* (rows, n) */
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
    R->hx.assign(nr * n, 0), R->hxabs.assign(nr * n, 0);
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
            double q8 = b, q8a = fabs(b), q8b = 0, h = b, ha = fabs(b), xwa = 0, hx = b, hxa = fabs(b);
            for (int U = 0; U < ku; U++) {
                const size_t xu = (size_t)xr * ku + U;
                const double dx = X->xq.dx[xu];
                double t = 0, ta = 0, bd = 0;
                for (int i2 = 0; i2 < 32; i2++) {
                    const double v = wd[32 * U + i2] * xq[32 * U + i2];
                    /* x's rounding meets the whole weight where the minimum goes through Σxq (TWO_M), else
                     * only d(q+QOFF) (the minimum multiplies the f32 sum of x) */
                    t += v, ta += fabs(v), bd += fabs(W->two_m ? (double)wr[32 * U + i2] : wd[32 * U + i2]);
                }
                /* The minimum term with the exact sum of x; the kernel's f32 sum of the block is off by at
                 * most a few roundings of Σ|x|, so that magnitude joins the terms'. */
                const double um = W->um[(size_t)j * ku + U], um1 = W->um1[(size_t)j * ku + U];
                if (W->two_m) { /* TWO_M (Q2_K): per-half sums of xq */
                    const double lo = um * X->xq.sq_lo[xu] * dx, hi = um1 * X->xq.sq_hi[xu] * dx;
                    q8 += t * dx + lo + hi, q8a += ta * dx + fabs(lo) + fabs(hi);
                } else {
                    q8 += t * dx + um * X->xq.sxd[xu], q8a += ta * dx + fabs(um) * X->xq.sxa[xu];
                }
                q8b += bd * 0.5 * dx;
            }
            for (int e = 0; e < k; e++) {
                const double v = (double)xh[e] * whr[e], vx = (double)xh[e] * wr[e];
                h += v, ha += fabs(v), xwa += fabs((double)x[e] * wr[e]);
                hx += vx, hxa += fabs(vx);
            }
            const size_t o = i * n + j;
            R->q8[o] = q8, R->q8abs[o] = q8a, R->q8bound[o] = q8b, R->h[o] = h, R->habs[o] = ha,
            R->xwabs[o] = xwa, R->hx[o] = hx, R->hxabs[o] = hxa;
        }
    }
}

/* Checks y (m, ldy) from the device against the references; returns 1 when it passes, else prints the worst
 * element and returns 0. */
static int check_y(const char *what, const wmat *W, const xdata *X, const refs *R,
                   const std::vector<float> &y, int ldy, enum ref_kind kind, int quiet = 0)
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
            if (kind == REF_INT8) {
                ref = R->q8[o];
                tol = (k / 32 + 16) * 2 * U24 * R->q8abs[o];
                tol_ex = R->q8bound[o] + tol + 2 * U24 * fabs(ex);
            } else if (kind == REF_F16) {
                ref = R->h[o];
                tol = (k / 16 + 16) * 8 * U24 * R->habs[o];
                tol_ex = R->xwabs[o] * (0x1.0p-10 + 0x1.0p-22) + tol + 2 * U24 * fabs(ex);
            } else {
                ref = R->hx[o];
                tol = (k / 16 + 16) * 8 * U24 * R->hxabs[o];
                tol_ex = R->xwabs[o] * (0x1.0p-11 + 0x1.0p-22) + tol + 2 * U24 * fabs(ex);
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
            what, wi, wj, wgot, wref ? ref_names[kind] : "exact", wval, fabs(wgot - wval), worst, wtol);
    return 0;
}

struct dev_case {
    void *w;
    float *x, *y, *bias;
    int ldy;
};

/* The stream GEMV's rows per task as last set (kern_cuda_qstream_set_rows), for the FAIL lines. */
static int g_stream_rows = 0;
static const char *stream_rows_name(void)
{
    static const char *const names[] = {" (rows auto)", " (1 row)", " (2 rows)", "?", " (4 rows)"};
    return names[g_stream_rows];
}
static void set_stream_rows(int rows)
{
    cr_assert_geq(kern_cuda_qstream_set_rows(rows), 0);
    g_stream_rows = rows;
}

/* Runs one variant twice (NaN-poisoned y each time), checks it, and compares the two runs bitwise. Returns
 * the number of failures (0 or 1); a forced configuration the device cannot hold is skipped. */
static int run_variant(struct kern_cuda_ctx *ctx, int v, size_t ws, const wmat *W, const xdata *X,
                       const refs *R, const dev_case *D, const float *bias)
{
    const int m = X->m, n = W->n, k = W->k, ldy = D->ldy;
    const size_t ybytes = (size_t)m * ldy * 4;
    std::vector<float> y[2];
    char what[240];
    snprintf(what, sizeof what, "%s%s %s m=%d n=%d k=%d ldy=%d woff=%d bias=%d",
             v == RUN_AUTO         ? "auto"
             : v == RUN_GEMM_ENTRY ? "gemm entry"
                                   : kern_cuda_qmm_variant_name(v),
             v == KERN_QV_STREAM ? stream_rows_name() : "", dtype_name(W->t), m, n, k, ldy, W->woff,
             bias != NULL);
    kern_cuda_qmm_set_variant(v > 0 ? v : KERN_QV_AUTO);
    for (int rep = 0; rep < 2; rep++) {
        CU_OK(cudaMemset(D->y, 0xFF, ybytes));
        const float *db = bias ? D->bias : NULL;
        const int rc = v == RUN_GEMM_ENTRY
                           ? kern_cuda_matmul_gemm(ctx, D->y, ldy, D->x, D->w, W->t, db, m, n, k, 0)
                           : kern_cuda_matmul(ctx, D->y, ldy, D->x, D->w, W->t, db, m, n, k, 0);
        if (rc == FERRY_ERR_UNSUPPORTED && v > 0) {
            kern_cuda_qmm_set_variant(KERN_QV_AUTO);
            return 0; /* forced configuration too large for this device */
        }
        if (rc != FERRY_OK) {
            fprintf(stderr, "FAIL %s: rc %d (%s)\n", what, rc, ferry_status_str(rc));
            kern_cuda_qmm_set_variant(KERN_QV_AUTO);
            return 1;
        }
        y[rep].resize((size_t)m * ldy);
        CU_OK(cudaDeviceSynchronize());
        CU_OK(cudaMemcpy(y[rep].data(), D->y, ybytes, cudaMemcpyDeviceToHost));
    }
    kern_cuda_qmm_set_variant(KERN_QV_AUTO);
    if (!check_y(what, W, X, R, y[0], ldy, ref_of(W->t, v, m, k, ws))) return 1;
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

/* Which variants a case runs: SWEEP_ALL every one (GEMM configurations included), SWEEP_INT8 the int8
 * kernels' (dp4a and stream GEMVs up to m = 8, MMA up to m = 128: their tiling included) and the f16 pieces
 * from m = 16, SWEEP_NONE the automatic choice and the GEMM entry only, SWEEP_STREAM the automatic choice and
 * the stream GEMV with each of its rows per task (auto, 1, 2, 4). */
enum sweep { SWEEP_NONE, SWEEP_INT8, SWEEP_ALL, SWEEP_STREAM };

/* One weight matrix, every m up to m_max: the automatic choice, the GEMM entry, and the variants of `sweep`.
 * Returns the number of failures. */
static int check_matrix(struct kern_cuda_ctx *ctx, size_t ws, enum dtype t, int n, int k, int ldy, int woff,
                        int with_bias, enum sweep sweep, int m_max, bool extreme = false,
                        const std::vector<int> *m_list = NULL)
{
    wmat W;
    make_wmat(&W, t, n, k, woff, extreme);
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
    const std::vector<int> ms = m_list ? *m_list : test_ms();
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
        fails += run_variant(ctx, RUN_AUTO, ws, &W, &X, &R, &D, b);
        if (sweep == SWEEP_STREAM) {
            static const int rows[] = {0, 1, 2, 4};
            for (int ri = 0; ri < 4; ri++) {
                set_stream_rows(rows[ri]);
                fails += run_variant(ctx, KERN_QV_STREAM, ws, &W, &X, &R, &D, b);
            }
            set_stream_rows(0);
        } else {
            fails += run_variant(ctx, RUN_GEMM_ENTRY, ws, &W, &X, &R, &D, b);
        }
        for (int v = 1; v < KERN_QV_COUNT && sweep != SWEEP_NONE && sweep != SWEEP_STREAM; v++) {
            if (!kern_cuda_qmm_variant_applies(t, v)) continue;
            const int gemv = (v >= KERN_QV_DP4A_R1 && v <= KERN_QV_DP4A_R4) || v == KERN_QV_STREAM;
            const int mma = v == KERN_QV_MMA_16 || v == KERN_QV_MMA_32;
            const int pieces = v == KERN_QV_F16_PIECES && m >= 16;
            if (sweep == SWEEP_INT8 && !((gemv && m <= 8) || (mma && m <= 128) || pieces)) continue;
            if (gemv && m > 64) continue; /* tiles of 4 or 8 rows: slow, nothing new past a few tiles */
            fails += run_variant(ctx, v, ws, &W, &X, &R, &D, b);
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
    const int bs = dtype_block_size(t); /* 32, 64 (NVFP4: rounded up to whole blocks) or 256 */
    return bs == 256 ? k256 : (k256 + 32 * extra32 + bs - 1) / bs * bs;
}

/* w16: the piece buffer for W decoded to f16 (KERN_QV_F16_PIECES; 0: that variant runs the GEMM). */
static struct kern_cuda_ctx *make_ctx(size_t max_x, size_t w16)
{
    struct kern_cuda_ctx *ctx = NULL;
    cr_assert_eq(kern_cuda_ctx_init(&ctx, max_x, w16), FERRY_OK);
    return ctx;
}

/* Small n, every m, every variant; W 16-byte aligned and at the type's smallest alignment. */
Test(cuda_matmul_q, every_type_every_m_small_n_all_variants)
{
    SKIP_WITHOUT_GPU();
    qref_seed(101);
    const size_t max_x = (size_t)512 * 1024;
    struct kern_cuda_ctx *ctx = make_ctx(max_x, KERN_CUDA_W16_MAX_BYTES);
    int fails = 0;
    for (int ti = 0; ti < QREF_NTYPES; ti++) {
        const enum dtype t = qref_types[ti];
        const int al = w_align(t);
        fails +=
            check_matrix(ctx, 2 * max_x, t, 37, k_of(t, 512, 3), 40, al < 16 ? al : 0, 1, SWEEP_ALL, 512);
    }
    kern_cuda_ctx_free(ctx);
    cr_assert_eq(fails, 0, "%d failing cases (see the FAIL lines above)", fails);
}

/* Small k (a row of 1..9 blocks of 32, or 1..2 K-quant blocks: fewer blocks than lanes, chunks or splits),
 * n = 311 (a vocabulary head of a tiny model), every variant at m <= 33. */
Test(cuda_matmul_q, small_k_all_variants)
{
    SKIP_WITHOUT_GPU();
    qref_seed(105);
    const size_t max_x = (size_t)512 * 1024;
    struct kern_cuda_ctx *ctx = make_ctx(max_x, KERN_CUDA_W16_MAX_BYTES);
    static const int ks32[] = {32, 64, 96, 128, 160, 224, 256, 288}, ks256[] = {256, 512};
    int fails = 0;
    for (int ti = 0; ti < QREF_NTYPES; ti++) {
        const enum dtype t = qref_types[ti];
        const int al = w_align(t), big = dtype_block_size(t) == 256;
        const int nk = big ? 2 : 8;
        for (int i = 0; i < nk; i++) {
            const int k = big ? ks256[i] : ks32[i];
            if (k % dtype_block_size(t)) continue; /* NVFP4: 64-element blocks */
            fails += check_matrix(ctx, 2 * max_x, t, 311, k, 313, i % 2 && al < 16 ? al : 0, i % 3 == 0,
                                  SWEEP_ALL, 33);
        }
    }
    kern_cuda_ctx_free(ctx);
    cr_assert_eq(fails, 0, "%d failing cases (see the FAIL lines above)", fails);
}

/* n = 4097 (many row tiles, splits, tile groups per block and grids) and long rows (many chunks, raw stages
 * and k tiles); the int8 kernels' variants and the f16 pieces forced too. */
Test(cuda_matmul_q, every_type_every_m_large_shapes)
{
    SKIP_WITHOUT_GPU();
    qref_seed(102);
    const size_t max_x = (size_t)512 * 2400;
    /* Pieces of W in f16: 1024 rows at k = 256 (4 pieces and one row), 896 at k = 288 (4 and 513 rows); at
     * k = 2304 fewer than 128 rows fit, so that variant runs the GEMM. */
    struct kern_cuda_ctx *ctx = make_ctx(max_x, (size_t)2 * 288 * 1000);
    int fails = 0;
    for (int ti = 0; ti < QREF_NTYPES; ti++) {
        const enum dtype t = qref_types[ti];
        const int al = w_align(t);
        fails += check_matrix(ctx, 2 * max_x, t, 4097, k_of(t, 256, 1), 4097, 0, 0, SWEEP_INT8, 512);
        fails +=
            check_matrix(ctx, 2 * max_x, t, 129, k_of(t, 2304, 7), 131, al < 16 ? al : 0, 1, SWEEP_INT8, 512);
    }
    kern_cuda_ctx_free(ctx);
    cr_assert_eq(fails, 0, "%d failing cases (see the FAIL lines above)", fails);
}

/* The stream GEMV (KERN_QV_STREAM) at decode shapes: m = 1, 2, 3, 4, 5, 8 (every tile of x rows it compiles,
 * full and partial: 1, 2, 4, 8), each rows-per-task setting, odd n (the
 * last task partial), k = 4096 and 11008 (many chunks per row, the last one partial for the 32-blocks at
 * 11008 = 344 blocks: 5 chunks of 64 and 24 for Q4_0), W 16-byte aligned and at the type's smallest
 * alignment, bias on every other m. Then every block type at a smaller shape. */
Test(cuda_matmul_q, stream_gemv_decode_shapes)
{
    SKIP_WITHOUT_GPU();
    qref_seed(109);
    const size_t max_x = (size_t)512 * 11008;
    struct kern_cuda_ctx *ctx = make_ctx(max_x, 0);
    const std::vector<int> ms = {1, 2, 3, 4, 5, 8};
    static const enum dtype main_types[] = {DTYPE_Q4_K, DTYPE_Q6_K, DTYPE_Q8_0, DTYPE_Q5_K, DTYPE_Q4_0};
    int fails = 0;
    for (int ti = 0; ti < 5; ti++) {
        const enum dtype t = main_types[ti];
        const int al = w_align(t);
        fails += check_matrix(ctx, 2 * max_x, t, 1031, 11008, 1033, al < 16 ? al : 0, 1, SWEEP_STREAM, 8,
                              false, &ms);
        fails += check_matrix(ctx, 2 * max_x, t, 4099, 4096, 4099, 0, 1, SWEEP_STREAM, 8, false, &ms);
    }
    const std::vector<int> ms_small = {1, 3, 8};
    for (int ti = 0; ti < QREF_NTYPES; ti++) {
        const enum dtype t = qref_types[ti];
        const int al = w_align(t);
        fails += check_matrix(ctx, 2 * max_x, t, 333, k_of(t, 2304, 5), 335, al < 16 ? al : 0, 1,
                              SWEEP_STREAM, 8, false, &ms_small);
    }
    kern_cuda_ctx_free(ctx);
    cr_assert_eq(fails, 0, "%d failing cases (see the FAIL lines above)", fails);
}

/* A workspace of 100 rows of x: the automatic choice (W in f16 pieces) runs m = 512 in chunks of 100; one row
 * less than k: FERRY_ERR_RANGE. A workspace of 20 rows: the int8 MMA cannot hold 32 or 64 padded rows and
 * runs in row tiles of 16 (the int8 reference, not the f16 GEMM's). */
Test(cuda_matmul_q, small_workspace_row_chunks)
{
    SKIP_WITHOUT_GPU();
    qref_seed(103);
    int fails = 0;
    for (int ti = 0; ti < QREF_NTYPES; ti++) {
        const enum dtype t = qref_types[ti];
        const int k = k_of(t, 512, 1);
        struct kern_cuda_ctx *ctx = make_ctx((size_t)100 * k, (size_t)2 * 128 * k);
        fails += check_matrix(ctx, (size_t)200 * k, t, 77, k, 77, 0, 1, SWEEP_NONE, 512);
        kern_cuda_ctx_free(ctx);
        ctx = make_ctx((size_t)20 * k, 0);
        fails += check_matrix(ctx, (size_t)40 * k, t, 77, k, 77, 0, 0, SWEEP_INT8, 64);
        kern_cuda_ctx_free(ctx);
        ctx = make_ctx((size_t)k / 2 - 1, 0);
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

/* The norm that writes x's int8 form beside x (kern_cuda_norm_x8 into kern_cuda_matmul_x8_target's place):
 * for every type whose choice at m reads that form, the norm's output, the residual and two products on it
 * (as v runs after q|k) are bitwise those of the plain norm and products. The products read the norm's form,
 * not x: x is overwritten with NaN after the norm and they still match. A product on another x ends it: x
 * rewritten by the plain norm with other weights then gives that norm's products, bitwise. */
Test(cuda_matmul_q, norm_writes_the_products_int8_x)
{
    SKIP_WITHOUT_GPU();
    qref_seed(107);
    const int k = 512, n = 96;
    struct kern_cuda_ctx *ctx = make_ctx((size_t)4 * 11008, 0);
    float *buf[9];
    for (int i = 0; i < 9; i++) CU_OK(cudaMalloc((void **)&buf[i], (size_t)4 * n * k * sizeof(float)));
    float *resid_a = buf[0], *resid_b = buf[1], *delta = buf[2], *nw = buf[3], *nw2 = buf[4], *xa = buf[5],
          *xb = buf[6], *ya = buf[7], *yb = buf[8];
    int used = 0;
    for (int ti = 0; ti < QREF_NTYPES; ti++) {
        const enum dtype t = qref_types[ti];
        wmat W1, W2;
        make_wmat(&W1, t, n, k, 0);
        make_wmat(&W2, t, n + 8, k, 0);
        void *w1, *w2;
        CU_OK(cudaMalloc(&w1, W1.bytes));
        CU_OK(cudaMalloc(&w2, W2.bytes));
        CU_OK(cudaMemcpy(w1, W1.w, W1.bytes, cudaMemcpyHostToDevice));
        CU_OK(cudaMemcpy(w2, W2.w, W2.bytes, cudaMemcpyHostToDevice));
        for (int m = 1; m <= 4; m++) {
            std::vector<float> h((size_t)m * k), hw(k), hw2(k);
            for (float &v : h) v = qref_frand();
            for (int j = 0; j < k; j++)
                hw[j] = 0.5f + qref_frand() * 0.25f, hw2[j] = 1.0f - qref_frand() * 0.25f;
            CU_OK(cudaMemcpy(resid_a, h.data(), h.size() * 4, cudaMemcpyHostToDevice));
            CU_OK(cudaMemcpy(resid_b, h.data(), h.size() * 4, cudaMemcpyHostToDevice));
            for (float &v : h) v = qref_frand();
            CU_OK(cudaMemcpy(delta, h.data(), h.size() * 4, cudaMemcpyHostToDevice));
            CU_OK(cudaMemcpy(nw, hw.data(), (size_t)k * 4, cudaMemcpyHostToDevice));
            CU_OK(cudaMemcpy(nw2, hw2.data(), (size_t)k * 4, cudaMemcpyHostToDevice));
            uint8_t *xq;
            float *xd;
            const int rc = kern_cuda_matmul_x8_target(ctx, xb, t, m, k, &xq, &xd);
            const int v = kern_cuda_qmm_pick(t, m);
            if ((v < KERN_QV_DP4A_R1 || v > KERN_QV_DP4A_R4) && v != KERN_QV_STREAM) {
                cr_assert_eq(rc, FERRY_ERR_UNSUPPORTED, "%s m=%d: variant %d reads its own layout",
                             dtype_name(t), m);
                continue;
            }
            cr_assert_eq(rc, FERRY_OK, "%s m=%d", dtype_name(t), m);
            used++;
            /* B: the norm with the int8 form, x poisoned, two products. A: the plain path. */
            cr_assert_eq(kern_cuda_norm_x8(resid_b, delta, xb, nw, m, k, 1e-5f, xq, xd, 0), FERRY_OK);
            std::vector<float> xb_h((size_t)m * k), xa_h((size_t)m * k);
            CU_OK(cudaMemcpy(xb_h.data(), xb, xb_h.size() * 4, cudaMemcpyDeviceToHost));
            CU_OK(cudaMemset(xb, 0xFF, (size_t)m * k * 4));
            cr_assert_eq(kern_cuda_matmul(ctx, yb, n + 8, xb, w1, t, NULL, m, n, k, 0), FERRY_OK);
            cr_assert_eq(kern_cuda_matmul(ctx, yb + n, n + 8, xb, w2, t, NULL, m, 8, k, 0), FERRY_OK);
            cr_assert_eq(kern_cuda_add_rmsnorm(resid_a, delta, xa, nw, m, k, 1e-5f, 0), FERRY_OK);
            cr_assert_eq(kern_cuda_matmul(ctx, ya, n + 8, xa, w1, t, NULL, m, n, k, 0), FERRY_OK);
            cr_assert_eq(kern_cuda_matmul(ctx, ya + n, n + 8, xa, w2, t, NULL, m, 8, k, 0), FERRY_OK);
            std::vector<float> ra((size_t)m * k), rb((size_t)m * k), oa((size_t)m * (n + 8)), ob(oa.size());
            CU_OK(cudaMemcpy(xa_h.data(), xa, xa_h.size() * 4, cudaMemcpyDeviceToHost));
            CU_OK(cudaMemcpy(ra.data(), resid_a, ra.size() * 4, cudaMemcpyDeviceToHost));
            CU_OK(cudaMemcpy(rb.data(), resid_b, rb.size() * 4, cudaMemcpyDeviceToHost));
            CU_OK(cudaMemcpy(oa.data(), ya, oa.size() * 4, cudaMemcpyDeviceToHost));
            CU_OK(cudaMemcpy(ob.data(), yb, ob.size() * 4, cudaMemcpyDeviceToHost));
            cr_assert(!memcmp(xa_h.data(), xb_h.data(), xa_h.size() * 4), "%s m=%d: norm output",
                      dtype_name(t), m);
            cr_assert(!memcmp(ra.data(), rb.data(), ra.size() * 4), "%s m=%d: residual", dtype_name(t), m);
            cr_assert(!memcmp(oa.data(), ob.data(), oa.size() * 4), "%s m=%d: products on the norm's int8 x",
                      dtype_name(t), m);
            /* A product on another x, then x rewritten by the plain norm: its own pre-pass again. */
            cr_assert_eq(kern_cuda_matmul(ctx, ya, n + 8, xa, w2, t, NULL, m, 8, k, 0), FERRY_OK);
            cr_assert_eq(kern_cuda_rmsnorm(xb, resid_b, nw2, m, k, 1e-5f, 0), FERRY_OK);
            cr_assert_eq(kern_cuda_matmul(ctx, yb, n + 8, xb, w1, t, NULL, m, n, k, 0), FERRY_OK);
            cr_assert_eq(kern_cuda_rmsnorm(xa, resid_a, nw2, m, k, 1e-5f, 0), FERRY_OK);
            cr_assert_eq(kern_cuda_matmul(ctx, ya, n + 8, xa, w1, t, NULL, m, n, k, 0), FERRY_OK);
            CU_OK(cudaMemcpy(oa.data(), ya, oa.size() * 4, cudaMemcpyDeviceToHost));
            CU_OK(cudaMemcpy(ob.data(), yb, ob.size() * 4, cudaMemcpyDeviceToHost));
            for (int r = 0; r < m; r++)
                cr_assert(!memcmp(&oa[(size_t)r * (n + 8)], &ob[(size_t)r * (n + 8)], (size_t)n * 4),
                          "%s m=%d: a stale int8 x after x was rewritten", dtype_name(t), m);
        }
        cudaFree(w1);
        cudaFree(w2);
    }
    cr_assert(used >= 8, "only %d type/m pairs read the norm's int8 x", used);
    for (int i = 0; i < 9; i++) cudaFree(buf[i]);
    kern_cuda_ctx_free(ctx);
}

/* The stream GEMV forced: at m = 1..8 it reads the int8 x that the norm writes (kern_cuda_matmul_x8_target
 * accepts up to 8 rows for it, 9 is refused), and its products on that form are bitwise those on its own
 * pre-pass of the plain norm's output (x poisoned after the norm, so the form is what is read). */
Test(cuda_matmul_q, stream_gemv_reads_the_norms_int8_x)
{
    SKIP_WITHOUT_GPU();
    qref_seed(111);
    const int k = 1024, n = 203;
    struct kern_cuda_ctx *ctx = make_ctx((size_t)16 * k, 0);
    float *buf[8];
    for (int i = 0; i < 8; i++) CU_OK(cudaMalloc((void **)&buf[i], (size_t)9 * n * k * sizeof(float)));
    float *resid_a = buf[0], *resid_b = buf[1], *nw = buf[2], *xa = buf[3], *xb = buf[4], *ya = buf[5],
          *yb = buf[6];
    static const enum dtype types[] = {DTYPE_Q4_K, DTYPE_Q6_K, DTYPE_Q8_0};
    kern_cuda_qmm_set_variant(KERN_QV_STREAM);
    for (int ti = 0; ti < 3; ti++) {
        const enum dtype t = types[ti];
        wmat W;
        make_wmat(&W, t, n, k, 0);
        void *w;
        CU_OK(cudaMalloc(&w, W.bytes));
        CU_OK(cudaMemcpy(w, W.w, W.bytes, cudaMemcpyHostToDevice));
        uint8_t *xq;
        float *xd;
        cr_assert_eq(kern_cuda_matmul_x8_target(ctx, xb, t, 9, k, &xq, &xd), FERRY_ERR_UNSUPPORTED);
        for (int m = 1; m <= 8; m++) {
            std::vector<float> h((size_t)m * k), hw(k);
            for (float &v : h) v = qref_frand();
            for (int j = 0; j < k; j++) hw[j] = 0.5f + qref_frand() * 0.25f;
            CU_OK(cudaMemcpy(resid_a, h.data(), h.size() * 4, cudaMemcpyHostToDevice));
            CU_OK(cudaMemcpy(resid_b, h.data(), h.size() * 4, cudaMemcpyHostToDevice));
            CU_OK(cudaMemcpy(nw, hw.data(), (size_t)k * 4, cudaMemcpyHostToDevice));
            cr_assert_eq(kern_cuda_matmul_x8_target(ctx, xb, t, m, k, &xq, &xd), FERRY_OK, "%s m=%d",
                         dtype_name(t), m);
            cr_assert_eq(kern_cuda_norm_x8(resid_b, NULL, xb, nw, m, k, 1e-5f, xq, xd, 0), FERRY_OK);
            CU_OK(cudaMemset(xb, 0xFF, (size_t)m * k * 4));
            cr_assert_eq(kern_cuda_matmul(ctx, yb, n, xb, w, t, NULL, m, n, k, 0), FERRY_OK);
            cr_assert_eq(kern_cuda_rmsnorm(xa, resid_a, nw, m, k, 1e-5f, 0), FERRY_OK);
            cr_assert_eq(kern_cuda_matmul(ctx, ya, n, xa, w, t, NULL, m, n, k, 0), FERRY_OK);
            std::vector<float> oa((size_t)m * n), ob(oa.size());
            CU_OK(cudaMemcpy(oa.data(), ya, oa.size() * 4, cudaMemcpyDeviceToHost));
            CU_OK(cudaMemcpy(ob.data(), yb, ob.size() * 4, cudaMemcpyDeviceToHost));
            cr_assert(!memcmp(oa.data(), ob.data(), oa.size() * 4),
                      "%s m=%d: stream GEMV on the norm's int8 x", dtype_name(t), m);
            for (size_t i = 0; i < oa.size(); i++)
                cr_assert(isfinite(oa[i]), "%s m=%d: y[%zu]", dtype_name(t), m, i);
        }
        cudaFree(w);
    }
    kern_cuda_qmm_set_variant(KERN_QV_AUTO);
    for (int i = 0; i < 8; i++) cudaFree(buf[i]);
    kern_cuda_ctx_free(ctx);
}

/* The gated activation that writes h's int8 form (kern_cuda_glu_x8 into kern_cuda_matmul_x8_target's place):
 * for every type and m whose product reads that form (the automatic choice, then the stream GEMV forced up to
 * 8 rows), SiLU and GELU, h and the down product on it are bitwise those of the plain activation and the
 * product's own pre-pass; h is poisoned after the activation, so the form is what the product reads. ffn =
 * 800 is not a multiple of 128 (a warp's 4 blocks end past the row: the last group stores nothing). */
Test(cuda_matmul_q, glu_writes_the_down_products_int8_x)
{
    SKIP_WITHOUT_GPU();
    qref_seed(113);
    const int n = 203;
    struct kern_cuda_ctx *ctx = make_ctx((size_t)16 * 1536, 0);
    float *gu, *ha, *hb, *ya, *yb;
    CU_OK(cudaMalloc((void **)&gu, (size_t)8 * 2 * 1536 * 4));
    CU_OK(cudaMalloc((void **)&ha, (size_t)8 * 1536 * 4));
    CU_OK(cudaMalloc((void **)&hb, (size_t)8 * 1536 * 4));
    CU_OK(cudaMalloc((void **)&ya, (size_t)8 * n * 4));
    CU_OK(cudaMalloc((void **)&yb, (size_t)8 * n * 4));
    int used = 0;
    for (int forced = 0; forced < 2; forced++) {
        kern_cuda_qmm_set_variant(forced ? KERN_QV_STREAM : KERN_QV_AUTO);
        for (int ti = 0; ti < QREF_NTYPES; ti++) {
            const enum dtype t = qref_types[ti];
            const int ffn = dtype_block_size(t) > 32 ? 1536 : 800;
            wmat W;
            make_wmat(&W, t, n, ffn, 0);
            void *w;
            CU_OK(cudaMalloc(&w, W.bytes));
            CU_OK(cudaMemcpy(w, W.w, W.bytes, cudaMemcpyHostToDevice));
            for (int m = 1; m <= 8; m++)
                for (int gelu = 0; gelu < 2; gelu++) {
                    std::vector<float> hg((size_t)m * 2 * ffn);
                    for (float &v : hg) v = 3.0f * qref_frand();
                    CU_OK(cudaMemcpy(gu, hg.data(), hg.size() * 4, cudaMemcpyHostToDevice));
                    uint8_t *xq;
                    float *xd;
                    if (kern_cuda_matmul_x8_target(ctx, hb, t, m, ffn, &xq, &xd) != FERRY_OK) continue;
                    used++;
                    cr_assert_eq(kern_cuda_glu_x8(hb, gu, m, ffn, gelu, xq, xd, 0), FERRY_OK);
                    std::vector<float> hah((size_t)m * ffn), hbh(hah.size());
                    CU_OK(cudaMemcpy(hbh.data(), hb, hbh.size() * 4, cudaMemcpyDeviceToHost));
                    CU_OK(cudaMemset(hb, 0xFF, hbh.size() * 4));
                    cr_assert_eq(kern_cuda_matmul(ctx, yb, n, hb, w, t, NULL, m, n, ffn, 0), FERRY_OK);
                    cr_assert_eq(gelu ? kern_cuda_gelu_mul(ha, gu, m, ffn, 0)
                                      : kern_cuda_silu_mul(ha, gu, m, ffn, 0),
                                 FERRY_OK);
                    cr_assert_eq(kern_cuda_matmul(ctx, ya, n, ha, w, t, NULL, m, n, ffn, 0), FERRY_OK);
                    std::vector<float> oa((size_t)m * n), ob(oa.size());
                    CU_OK(cudaMemcpy(hah.data(), ha, hah.size() * 4, cudaMemcpyDeviceToHost));
                    CU_OK(cudaMemcpy(oa.data(), ya, oa.size() * 4, cudaMemcpyDeviceToHost));
                    CU_OK(cudaMemcpy(ob.data(), yb, ob.size() * 4, cudaMemcpyDeviceToHost));
                    cr_assert(!memcmp(hah.data(), hbh.data(), hah.size() * 4), "%s m=%d gelu=%d: h",
                              dtype_name(t), m, gelu);
                    cr_assert(!memcmp(oa.data(), ob.data(), oa.size() * 4),
                              "%s m=%d gelu=%d forced=%d: down product on the activation's int8 x",
                              dtype_name(t), m, gelu, forced);
                }
            cudaFree(w);
        }
    }
    kern_cuda_qmm_set_variant(KERN_QV_AUTO);
    cr_assert(used >= 16, "only %d type/m pairs read the activation's int8 x", used);
    cudaFree(gu), cudaFree(ha), cudaFree(hb), cudaFree(ya), cudaFree(yb);
    kern_cuda_ctx_free(ctx);
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
        if (al > 1) /* (MXFP4's 17-byte blocks: any address) */
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
    cr_assert_eq(kern_cuda_matmul(ctx, p, 1 << 20, p, p, DTYPE_Q8_0, NULL, 1, 1 << 20, 8192, 0),
                 FERRY_ERR_INVALID, "W of 9 GB: the kernels address W with 32-bit offsets");
    cr_assert(!kern_cuda_matmul_supports((enum dtype)5));
    cr_assert(!kern_cuda_matmul_supports((enum dtype)99));
    cr_assert_eq(kern_cuda_matmul(ctx, p, 1, p, p, (enum dtype)5, NULL, 1, 1, 32, 0), FERRY_ERR_UNSUPPORTED);
    cr_assert(kern_cuda_matmul_supports(DTYPE_F16) && kern_cuda_matmul_supports(DTYPE_BF16) &&
              kern_cuda_matmul_supports(DTYPE_F32));
    cr_assert_eq(kern_cuda_qmm_set_variant(KERN_QV_COUNT), FERRY_ERR_INVALID);
    cr_assert_eq(kern_cuda_qmm_set_variant(-1), FERRY_ERR_INVALID);
    cr_assert_eq(kern_cuda_qmm_set_variant(KERN_QV_AUTO), KERN_QV_AUTO);
    cr_assert_eq(kern_cuda_qstream_set_rows(3), FERRY_ERR_INVALID);
    cr_assert_eq(kern_cuda_qstream_set_rows(4), 0);
    cr_assert_eq(kern_cuda_qstream_set_rows(0), 4);
    cr_assert(!kern_cuda_qmm_variant_applies(DTYPE_Q4_K, KERN_QV_Q8OLD));
    cr_assert(kern_cuda_qmm_variant_applies(DTYPE_Q8_0, KERN_QV_Q8OLD));
    for (int ti = 0; ti < QREF_NTYPES; ti++) /* the table names a real variant for every type and m */
        for (int m = 1; m <= 4096; m = m < 16 ? m + 1 : 2 * m) {
            const int v = kern_cuda_qmm_pick(qref_types[ti], m);
            cr_assert(v > KERN_QV_AUTO && v < KERN_QV_COUNT &&
                          kern_cuda_qmm_variant_applies(qref_types[ti], v),
                      "%s m=%d: variant %d", dtype_name(qref_types[ti]), m, v);
            cr_assert(v != KERN_QV_F16_PIECES || m >= KERN_CUDA_W16_MIN_M,
                      "%s m=%d: the pieces below KERN_CUDA_W16_MIN_M (engines size the buffer by it)",
                      dtype_name(qref_types[ti]), m);
        }
    cr_assert(kern_cuda_ctx_size(1000, 0) >= 2000);
    cr_assert(kern_cuda_ctx_size(1000, 100) >= kern_cuda_ctx_size(1000, 0) + 100);
    cr_assert_eq(kern_cuda_w16_bytes(KERN_CUDA_W16_MIN_M - 1, 1000), 0u, "no piece buffer below its m");
    cr_assert_eq(kern_cuda_w16_bytes(KERN_CUDA_W16_MIN_M, 1000), 2000u);
    cr_assert_eq(kern_cuda_w16_bytes(4096, (size_t)1 << 30), KERN_CUDA_W16_MAX_BYTES);
}

/* y (m, ldy) holding value(i, j) at the references' rows i (R->rows) and columns j < n, 0 at the rows they
 * skip (any finite value passes there) and NaN bits past n, as a product would leave it. */
template <class F> static std::vector<float> y_from(const refs *R, int m, int n, int ldy, F value)
{
    std::vector<float> y((size_t)m * ldy);
    memset(y.data(), 0xFF, y.size() * 4);
    for (int r = 0; r < m; r++)
        if (std::find(R->rows.begin(), R->rows.end(), r) == R->rows.end())
            for (int j = 0; j < n; j++) y[(size_t)r * ldy + j] = 0.0f;
    for (size_t i = 0; i < R->rows.size(); i++)
        for (int j = 0; j < n; j++) y[(size_t)R->rows[i] * ldy + j] = (float)value(i, j);
    return y;
}

/* One weight matrix against its references at m = 1, 5, 33: y built from each reference passes as that path's
 * result (so its bound against the exact product holds on these data), and fails with one element moved by 5x
 * its tolerance. */
static void self_check(enum dtype t, int n, int k, bool extreme)
{
    const int ms2[3] = {1, 5, 33}, ldy = n + 2;
    wmat W;
    make_wmat(&W, t, n, k, 0, extreme);
    std::vector<float> bias(n);
    for (int j = 0; j < n; j++) bias[j] = qref_frand();
    for (int mi = 0; mi < 3; mi++) {
        const int m = ms2[mi];
        xdata X;
        make_x(&X, m, k);
        refs R;
        make_refs(&R, &W, &X, bias.data());
        for (int kind = 0; kind < 3; kind++) {
            const int int8 = kind == REF_INT8;
            std::vector<float> y = y_from(&R, m, n, ldy, [&](size_t i, int j) {
                return int8 ? R.q8[i * n + j] : kind == REF_F16 ? R.h[i * n + j] : R.hx[i * n + j];
            });
            char what[96];
            snprintf(what, sizeof what, "self-check %s%s n=%d k=%d m=%d %s", extreme ? "extreme " : "",
                     dtype_name(t), n, k, m, ref_names[kind]);
            cr_assert(check_y(what, &W, &X, &R, y, ldy, (enum ref_kind)kind),
                      "%s: a reference fails its own bounds", what);
            const size_t o = (R.rows.size() / 2) * n + n / 2;
            const double tol = int8              ? (k / 32 + 16) * 2 * U24 * R.q8abs[o]
                               : kind == REF_F16 ? (k / 16 + 16) * 8 * U24 * R.habs[o]
                                                 : (k / 16 + 16) * 8 * U24 * R.hxabs[o];
            y[(size_t)R.rows[R.rows.size() / 2] * ldy + n / 2] += (float)(5 * tol);
            cr_assert(!check_y(what, &W, &X, &R, y, ldy, (enum ref_kind)kind, 1),
                      "%s: a wrong element passes", what);
        }
        qref_free_xq(&X.xq);
    }
}

/* No GPU needed: the references and tolerances above are consistent on their own, at the small shape and at
 * the GPU tests' n = 311 (many rows: the worst of x's rounding shows), and for Q2_K's extreme blocks. */
Test(cuda_matmul_q, references_within_their_bounds)
{
    qref_seed(104);
    for (int ti = 0; ti < QREF_NTYPES; ti++) {
        const enum dtype t = qref_types[ti];
        self_check(t, 19, k_of(t, 512, 3), false);
        self_check(t, 311, k_of(t, 256, 1), false);
    }
    self_check(DTYPE_Q2_K, 37, 768, true);
    self_check(DTYPE_Q2_K, 311, 256, true);
}

/* No GPU needed: Q2_K's extreme blocks (q2k_extreme_blocks) decode through qblock.cuh's unit and f16 decoders
 * bitwise as quant/dequant.c's dequant_row (bitwise llama.cpp's dequantize_row_q2_K:
 * tests/kernels/test_quant.c), -0.0 against +0.0 included. */
Test(cuda_matmul_q, q2_k_extreme_blocks_decode_bitwise)
{
    qref_seed(108);
    wmat W;
    make_wmat(&W, DTYPE_Q2_K, 16, 512, 0, true);
    for (int r = 0; r < W.n; r++)
        for (int U = 0; U < W.k / 32; U++) {
            qb_unit u;
            qref_unit<qb_q2_k>(W.w + dtype_row_size(DTYPE_Q2_K, W.k) * r, U, u);
            uint32_t h[16];
            qb_decode_h2<qb_q2_k>(u, h);
            for (int i = 0; i < 32; i++) {
                const float got = qb_value<qb_q2_k>(u, i), want = W.deq[(size_t)r * W.k + 32 * U + i];
                cr_assert(!memcmp(&got, &want, 4), "row %d unit %d element %d: %.9g, dequant_row %.9g", r, U,
                          i, got, want);
                cr_assert_eq((uint16_t)(h[i / 2] >> (16 * (i & 1))), f32_to_f16(want),
                             "row %d unit %d element %d: f16 decode of %.9g", r, U, i, want);
            }
        }
}

/* No GPU needed: the checks catch the ways a Q2_K product can get its minimums wrong. On extreme blocks, y
 * built from the int8-path reference passes; the same with each unit's minimum term negated (dmin's sign
 * lost), with the two halves' minimums swapped, with one minimum for the whole unit, or without the minimums,
 * fails; and so does the f16-path reference with its minimums negated. */
Test(cuda_matmul_q, q2_k_wrong_minimums_fail)
{
    qref_seed(109);
    const int n = 37, k = 768, m = 5, ldy = n + 2, ku = k / 32;
    wmat W;
    make_wmat(&W, DTYPE_Q2_K, n, k, 0, true);
    xdata X;
    make_x(&X, m, k);
    refs R;
    make_refs(&R, &W, &X, NULL);
    /* The int8 path's minimum term of x row xr and W row j, with the halves' minimums as given. */
    auto mins = [&](int xr, int j, int how) {
        double s = 0;
        for (int U = 0; U < ku; U++) {
            const size_t xu = (size_t)xr * ku + U;
            const double m0 = W.um[(size_t)j * ku + U], m1 = W.um1[(size_t)j * ku + U];
            const double lo = how == 1 ? m1 : how == 2 ? m0 : m0, hi = how == 1 ? m0 : how == 2 ? m0 : m1;
            s += (lo * X.xq.sq_lo[xu] + hi * X.xq.sq_hi[xu]) * X.xq.dx[xu];
        }
        return s;
    };
    std::vector<float> y = y_from(&R, m, n, ldy, [&](size_t i, int j) { return R.q8[i * n + j]; });
    cr_assert(check_y("q2_k int8 reference", &W, &X, &R, y, ldy, REF_INT8));
    static const char *const wrong[4] = {"minimums negated", "halves' minimums swapped",
                                         "one minimum per unit", "no minimums"};
    for (int how = 0; how < 4; how++) {
        y = y_from(&R, m, n, ldy, [&](size_t i, int j) {
            const int xr = R.rows[i];
            const double right = mins(xr, j, 0);
            const double bad = how == 0 ? -right : how == 3 ? 0.0 : mins(xr, j, how);
            return R.q8[i * n + j] - right + bad;
        });
        cr_assert(!check_y(wrong[how], &W, &X, &R, y, ldy, REF_INT8, 1), "int8 path with %s passes",
                  wrong[how]);
    }
    /* The f16 path: each element's minimum rounded with it; negate it in the exact sum. */
    y = y_from(&R, m, n, ldy, [&](size_t i, int j) {
        double mt = 0;
        for (int e = 0; e < k; e++) {
            const double mm = (e % 32 < 16 ? W.um : W.um1)[(size_t)j * ku + e / 32];
            mt += mm * f16_to_f32(f32_to_f16(X.x[(size_t)R.rows[i] * k + e]));
        }
        return R.h[i * n + j] - 2 * mt;
    });
    cr_assert(!check_y("f16 path, minimums negated", &W, &X, &R, y, ldy, REF_F16, 1),
              "f16 path with its minimums negated passes");
    qref_free_xq(&X.xq);
}

/* Q2_K's extreme blocks (q2k_extreme_blocks) through every variant at odd n and every m, the tile edges of
 * the int8 kernels at n = 311 and 4097, W at its smallest alignment (4 bytes) and 16-byte aligned. */
Test(cuda_matmul_q, q2_k_extreme_blocks_every_path)
{
    SKIP_WITHOUT_GPU();
    qref_seed(110);
    const size_t max_x = (size_t)512 * 1024;
    struct kern_cuda_ctx *ctx = make_ctx(max_x, KERN_CUDA_W16_MAX_BYTES);
    int fails = 0;
    fails += check_matrix(ctx, 2 * max_x, DTYPE_Q2_K, 37, 768, 40, 4, 1, SWEEP_ALL, 512, true);
    fails += check_matrix(ctx, 2 * max_x, DTYPE_Q2_K, 311, 256, 313, 0, 0, SWEEP_INT8, 100, true);
    fails += check_matrix(ctx, 2 * max_x, DTYPE_Q2_K, 4097, 512, 4099, 4, 1, SWEEP_INT8, 64, true);
    kern_cuda_ctx_free(ctx);
    cr_assert_eq(fails, 0, "%d failing cases (see the FAIL lines above)", fails);
}
