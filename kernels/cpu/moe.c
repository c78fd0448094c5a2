/* moe — routing and the experts' products on the host (see moe.h). */
#include "kernels/cpu/moe.h"

#include <math.h>
#include <string.h>

#include "kernels/core/status.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/ops.h"

int kern_cpu_moe_route(const float *logits, int n, int n_expert, int k, int norm, int32_t *ids, float *wts)
{
    if (n <= 0 || n_expert <= 0 || k < 1 || k > n_expert) return FERRY_ERR_INVALID;
    for (int t = 0; t < n; t++) {
        const float *l = logits + (size_t)t * n_expert;
        int32_t *id = ids + (size_t)t * k;
        float *w = wts + (size_t)t * k;
        float mx = l[0];
        for (int e = 1; e < n_expert; e++) mx = l[e] > mx ? l[e] : mx;
        double sum = 0;
        for (int e = 0; e < n_expert; e++) sum += exp((double)l[e] - mx);
        /* Selection: the j-th pick is the largest probability not yet taken, the lowest id among equals. */
        for (int j = 0; j < k; j++) {
            int best = -1;
            for (int e = 0; e < n_expert; e++) {
                int taken = 0;
                for (int i = 0; i < j; i++) taken |= id[i] == e;
                if (!taken && (best < 0 || l[e] > l[best])) best = e;
            }
            id[j] = best;
            w[j] = (float)(exp((double)l[best] - mx) / sum);
        }
        if (norm) {
            float s = 0;
            for (int j = 0; j < k; j++) s += w[j];
            for (int j = 0; j < k; j++) w[j] /= s;
        }
    }
    return FERRY_OK;
}

size_t kern_cpu_moe_ws_floats(const struct kern_cpu_moe_experts *ex, int n)
{
    /* gathered rows (n, dim), gate and up (n, ffn) each, down (n, dim); token list and weight per row. */
    return (size_t)n * (2 * (size_t)ex->dim + 2 * (size_t)ex->ffn + 2);
}

int kern_cpu_moe_ffn(float *y, const float *x, const int32_t *ids, const float *wts, int n, int k,
                     const struct kern_cpu_moe_experts *ex, float *ws, struct tpool *tp)
{
    const int dim = ex->dim, ffn = ex->ffn;
    if (n <= 0 || k < 1 || k > ex->n_expert) return FERRY_ERR_INVALID;
    for (size_t i = 0; i < (size_t)n * k; i++)
        if (ids[i] < 0 || ids[i] >= ex->n_expert) return FERRY_ERR_RANGE;
    float *xs = ws, *g = xs + (size_t)n * dim, *u = g + (size_t)n * ffn, *d = u + (size_t)n * ffn,
          *rw = d + (size_t)n * dim;
    int32_t *tok = (int32_t *)(rw + n);
    const size_t gate_row = dtype_row_size(ex->gate_t, dim), up_row = dtype_row_size(ex->up_t, dim),
                 down_row = dtype_row_size(ex->down_t, ffn);
    memset(y, 0, (size_t)n * dim * sizeof *y);
    for (int e = 0; e < ex->n_expert; e++) {
        int c = 0; /* a token chooses an expert at most once */
        for (int t = 0; t < n; t++)
            for (int j = 0; j < k; j++)
                if (ids[(size_t)t * k + j] == e) {
                    memcpy(xs + (size_t)c * dim, x + (size_t)t * dim, (size_t)dim * sizeof *x);
                    tok[c] = t, rw[c++] = wts[(size_t)t * k + j];
                }
        if (!c) continue;
        const char *wg = (const char *)ex->gate + gate_row * (size_t)ffn * e,
                   *wu = (const char *)ex->up + up_row * (size_t)ffn * e,
                   *wd = (const char *)ex->down + down_row * (size_t)dim * e;
        const float *bg = ex->gate_b ? ex->gate_b + (size_t)e * ffn : NULL,
                    *bu = ex->up_b ? ex->up_b + (size_t)e * ffn : NULL,
                    *bd = ex->down_b ? ex->down_b + (size_t)e * dim : NULL;
        int rc = kern_cpu_matmul(g, xs, wg, ex->gate_t, bg, c, ffn, dim, tp);
        if (!rc) rc = kern_cpu_matmul(u, xs, wu, ex->up_t, bu, c, ffn, dim, tp);
        if (rc) return rc;
        if (ex->act == KERN_CPU_MOE_SWIGLU_CLAMPED)
            kern_cpu_swiglu_clamped(g, u, (int64_t)c * ffn, ex->alpha, ex->limit);
        else
            kern_cpu_silu_mul(g, u, (int64_t)c * ffn);
        if ((rc = kern_cpu_matmul(d, g, wd, ex->down_t, bd, c, dim, ffn, tp))) return rc;
        for (int r = 0; r < c; r++) {
            float *yt = y + (size_t)tok[r] * dim;
            const float *dr = d + (size_t)r * dim;
            for (int i = 0; i < dim; i++) yt[i] += rw[r] * dr[i];
        }
    }
    return FERRY_OK;
}

int kern_cpu_moe_ref(float *y, const float *x, const int32_t *ids, const float *wts, int n, int k,
                     const float *gate, const float *up, const float *down, int n_expert, int dim, int ffn)
{
    for (int t = 0; t < n; t++) {
        const float *xt = x + (size_t)t * dim;
        for (int i = 0; i < dim; i++) y[(size_t)t * dim + i] = 0;
        for (int j = 0; j < k; j++) {
            const int e = ids[(size_t)t * k + j];
            if (e < 0 || e >= n_expert) return FERRY_ERR_RANGE;
            for (int f = 0; f < ffn; f++) {
                const float *gr = gate + ((size_t)e * ffn + f) * dim, *ur = up + ((size_t)e * ffn + f) * dim;
                double a = 0, b = 0;
                for (int c = 0; c < dim; c++) a += (double)gr[c] * xt[c], b += (double)ur[c] * xt[c];
                const double h = a / (1.0 + exp(-a)) * b * wts[(size_t)t * k + j];
                for (int i = 0; i < dim; i++)
                    y[(size_t)t * dim + i] += (float)(h * down[((size_t)e * dim + i) * ffn + f]);
            }
        }
    }
    return FERRY_OK;
}

int kern_cpu_moe_ref_ex(float *y, const float *x, const int32_t *ids, const float *wts, int n, int k,
                        const struct kern_cpu_moe_experts *ex)
{
    const int dim = ex->dim, ffn = ex->ffn;
    const float *gate = ex->gate, *up = ex->up, *down = ex->down;
    if (ex->gate_t != DTYPE_F32 || ex->up_t != DTYPE_F32 || ex->down_t != DTYPE_F32) return FERRY_ERR_INVALID;
    for (int t = 0; t < n; t++) {
        const float *xt = x + (size_t)t * dim;
        for (int i = 0; i < dim; i++) y[(size_t)t * dim + i] = 0;
        for (int j = 0; j < k; j++) {
            const int e = ids[(size_t)t * k + j];
            if (e < 0 || e >= ex->n_expert) return FERRY_ERR_RANGE;
            const double w = wts[(size_t)t * k + j];
            for (int f = 0; f < ffn; f++) {
                const float *gr = gate + ((size_t)e * ffn + f) * dim, *ur = up + ((size_t)e * ffn + f) * dim;
                double a = ex->gate_b ? ex->gate_b[(size_t)e * ffn + f] : 0;
                double b = ex->up_b ? ex->up_b[(size_t)e * ffn + f] : 0;
                for (int c = 0; c < dim; c++) a += (double)gr[c] * xt[c], b += (double)ur[c] * xt[c];
                double h;
                if (ex->act == KERN_CPU_MOE_SWIGLU_CLAMPED) {
                    const double g = fmin(a, ex->limit), u = fmax(-ex->limit, fmin(b, ex->limit));
                    h = g / (1.0 + exp(-(double)ex->alpha * g)) * (u + 1.0);
                } else {
                    h = a / (1.0 + exp(-a)) * b;
                }
                for (int i = 0; i < dim; i++)
                    y[(size_t)t * dim + i] += (float)(w * h * down[((size_t)e * dim + i) * ffn + f]);
            }
            if (ex->down_b)
                for (int i = 0; i < dim; i++)
                    y[(size_t)t * dim + i] += (float)(w * ex->down_b[(size_t)e * dim + i]);
        }
    }
    return FERRY_OK;
}

size_t kern_cpu_moe_shared_ws_floats(const struct kern_cpu_moe_shared *sh, int n)
{
    /* gate and up (n, ffn) each, down (n, dim). */
    return (size_t)n * (2 * (size_t)sh->ffn + (size_t)sh->dim);
}

/* sigmoid(x · g) of one row in a double sum; 1 without a gate. */
static double shared_gate(const float *x, const float *g, int dim)
{
    if (!g) return 1.0;
    double s = 0;
    for (int i = 0; i < dim; i++) s += (double)x[i] * g[i];
    return 1.0 / (1.0 + exp(-s));
}

int kern_cpu_moe_shared(float *y, const float *x, int n, const struct kern_cpu_moe_shared *sh, float *ws,
                        struct tpool *tp)
{
    const int dim = sh->dim, ffn = sh->ffn;
    if (n <= 0 || dim <= 0 || ffn <= 0) return FERRY_ERR_INVALID;
    float *g = ws, *u = g + (size_t)n * ffn, *d = u + (size_t)n * ffn;
    int rc = kern_cpu_matmul(g, x, sh->gate, sh->gate_t, NULL, n, ffn, dim, tp);
    if (!rc) rc = kern_cpu_matmul(u, x, sh->up, sh->up_t, NULL, n, ffn, dim, tp);
    if (rc) return rc;
    kern_cpu_silu_mul(g, u, (int64_t)n * ffn);
    if ((rc = kern_cpu_matmul(d, g, sh->down, sh->down_t, NULL, n, dim, ffn, tp))) return rc;
    for (int t = 0; t < n; t++) {
        const float s = (float)shared_gate(x + (size_t)t * dim, sh->gate_inp, dim);
        float *yt = y + (size_t)t * dim;
        const float *dt = d + (size_t)t * dim;
        for (int i = 0; i < dim; i++) yt[i] += s * dt[i];
    }
    return FERRY_OK;
}

int kern_cpu_moe_shared_ref(float *y, const float *x, int n, const struct kern_cpu_moe_shared *sh)
{
    const int dim = sh->dim, ffn = sh->ffn;
    const float *gate = sh->gate, *up = sh->up, *down = sh->down;
    if (sh->gate_t != DTYPE_F32 || sh->up_t != DTYPE_F32 || sh->down_t != DTYPE_F32 || n <= 0)
        return FERRY_ERR_INVALID;
    for (int t = 0; t < n; t++) {
        const float *xt = x + (size_t)t * dim;
        const double s = shared_gate(xt, sh->gate_inp, dim);
        for (int f = 0; f < ffn; f++) {
            const float *gr = gate + (size_t)f * dim, *ur = up + (size_t)f * dim;
            double a = 0, b = 0;
            for (int c = 0; c < dim; c++) a += (double)gr[c] * xt[c], b += (double)ur[c] * xt[c];
            const double h = s * a / (1.0 + exp(-a)) * b;
            for (int i = 0; i < dim; i++) y[(size_t)t * dim + i] += (float)(h * down[(size_t)i * ffn + f]);
        }
    }
    return FERRY_OK;
}
