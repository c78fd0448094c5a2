/* moe — routing and the experts' products on the host (see moe.h). */
#include "kernels/cpu/moe.h"

#include <math.h>
#include <stdatomic.h>
#include <string.h>

#include "kernels/core/status.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/thread_buf.h"
#include "kernels/cpu/threadpool.h"

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
    /* none: kern_cpu_moe_ffn's scratch depends on k and lives in the calling thread's buffer (moe_buf); one
     * float per token keeps callers' allocations non-empty */
    (void)ex;
    return (size_t)(n > 0 ? n : 1);
}

/* Tasks per pool thread the phases aim at (the rest of a slow thread's share is taken by the others), and the
 * fewest rows a task takes: a task's rows are one stretch of each matrix, read at the machine's streaming
 * rate once it is under way, and each stretch costs a start (x prepared, the first rows' latency). */
#define MOE_TASKS_PER_THREAD 3
#define MOE_MIN_ROWS         32
/* Rows whose reading a task starts before it computes (an L2 prefetch): the first rows of its next stretch,
 * which the product's own prefetch (PF_AHEAD rows ahead within a stretch) does not reach. */
#define MOE_PF_ROWS 8

/* Rows per task when `rows` are cut into about `want` stretches of a multiple of 8 rows (whole groups of the
 * products' 4, and whole vectors of the activation's 8 lanes: where ffn is a multiple of 8 every h element
 * goes through the same vector exp, whatever the partition), none shorter than MOE_MIN_ROWS (or all). */
static int moe_block_rows(int rows, int want)
{
    int max_blocks = rows / MOE_MIN_ROWS;
    if (want > max_blocks) want = max_blocks;
    if (want < 1) want = 1;
    const int r = (rows + want - 1) / want;
    return (r + 7) / 8 * 8;
}

/* L2 prefetch of bytes [0, n) from p, a line at a time. */
static void moe_prefetch(const void *p, size_t n)
{
    for (size_t o = 0; o < n; o += 64) __builtin_prefetch((const char *)p + o, 0, 2);
}

/* The calling thread's scratch: the experts' gathered rows, their activations and down products, kept across
 * the phases (workers' scratch: moe_task_buf). */
static struct thread_buf moe_buf = THREAD_BUF_INIT, moe_task_buf = THREAD_BUF_INIT;

/* One call's plan. Slots: the (token, choice) pairs, grouped by expert in ascending id (expert e's are
 * slots start[e] .. start[e+1]), within an expert in token order. */
struct moe_plan {
    const struct kern_cpu_moe_experts *ex;
    float *y;
    const float **xe; /* (n_expert) expert e's rows of x: (count, dim), gathered or x's own row */
    float *h;         /* (slots, ffn) the activations */
    float *d;         /* (slots, dim) the down products */
    int32_t *start;   /* (n_expert + 1) */
    int32_t *tok;     /* (slots) */
    int32_t *tslot;   /* (n, k) each token's slots, in ascending expert id */
    float *rw;        /* (slots) routing weight */
    int32_t *act;     /* (n_act) the experts chosen by some token, ascending */
    int n_act, n, k;
    int rows_gu, n_blk_gu; /* phase 1: rows of gate and up per task, tasks per expert */
    int rows_d, n_blk_d;   /* phase 2: rows of down per task, tasks per expert */
    int rows_s, n_blk_s;   /* phase 3: columns of y per task, tasks */
    size_t gate_row, up_row, down_row;
    enum kern_cpu_act arith;
    enum kern_cpu_plain plain;
    _Atomic int err;
};

static void moe_fail(struct moe_plan *p, int rc)
{
    int zero = 0;
    if (rc) atomic_compare_exchange_strong(&p->err, &zero, rc);
}

/* Phase 1, task t: rows [r0, r1) of gate and up of the t / n_blk_gu-th chosen expert for all of its tokens,
 * in one product call (x prepared once for both), then the activation into those columns of h. */
static void moe_gate_up_task(void *arg, int t)
{
    struct moe_plan *p = arg;
    const struct kern_cpu_moe_experts *ex = p->ex;
    kern_cpu_matmul_set_act(p->arith);
    kern_cpu_matmul_set_plain(p->plain);
    const int e = p->act[t / p->n_blk_gu], b = t % p->n_blk_gu, ffn = ex->ffn;
    const int r0 = b * p->rows_gu, r1 = r0 + p->rows_gu < ffn ? r0 + p->rows_gu : ffn, nr = r1 - r0;
    const int s0 = p->start[e], c = p->start[e + 1] - s0;
    float *g = thread_buf_get(&moe_task_buf, sizeof(float) * 2 * (size_t)c * nr);
    if (!g) {
        moe_fail(p, FERRY_ERR_NOMEM);
        return;
    }
    float *u = g + (size_t)c * nr;
    const struct kern_cpu_mm jobs[2] = {
        {.y = g,
         .w = (const char *)ex->gate + p->gate_row * ((size_t)ffn * e + r0),
         .wt = ex->gate_t,
         .bias = ex->gate_b ? ex->gate_b + (size_t)e * ffn + r0 : NULL,
         .n = nr},
        {.y = u,
         .w = (const char *)ex->up + p->up_row * ((size_t)ffn * e + r0),
         .wt = ex->up_t,
         .bias = ex->up_b ? ex->up_b + (size_t)e * ffn + r0 : NULL,
         .n = nr},
    };
    const int pf = nr < MOE_PF_ROWS ? nr : MOE_PF_ROWS;
    moe_prefetch(jobs[0].w, p->gate_row * pf);
    moe_prefetch(jobs[1].w, p->up_row * pf);
    const int rc = kern_cpu_matmul_multi(jobs, 2, p->xe[e], c, ex->dim, NULL);
    if (rc) {
        moe_fail(p, rc);
        return;
    }
    if (ex->act == KERN_CPU_MOE_SWIGLU_CLAMPED)
        kern_cpu_swiglu_clamped(g, u, (int64_t)c * nr, ex->alpha, ex->limit);
    else
        kern_cpu_silu_mul(g, u, (int64_t)c * nr);
    for (int r = 0; r < c; r++)
        memcpy(p->h + (size_t)(s0 + r) * ffn + r0, g + (size_t)r * nr, sizeof(float) * (size_t)nr);
}

/* Phase 2, task t: rows [r0, r1) of the t / n_blk_d-th chosen expert's down for all of its tokens, into
 * those columns of d. */
static void moe_down_task(void *arg, int t)
{
    struct moe_plan *p = arg;
    const struct kern_cpu_moe_experts *ex = p->ex;
    kern_cpu_matmul_set_act(p->arith);
    kern_cpu_matmul_set_plain(p->plain);
    const int dim = ex->dim, ffn = ex->ffn, e = p->act[t / p->n_blk_d], b = t % p->n_blk_d;
    const int r0 = b * p->rows_d, r1 = r0 + p->rows_d < dim ? r0 + p->rows_d : dim, nr = r1 - r0;
    const int s0 = p->start[e], c = p->start[e + 1] - s0;
    float *d = thread_buf_get(&moe_task_buf, sizeof(float) * (size_t)c * nr);
    if (!d) {
        moe_fail(p, FERRY_ERR_NOMEM);
        return;
    }
    const char *w = (const char *)ex->down + p->down_row * ((size_t)dim * e + r0);
    moe_prefetch(w, p->down_row * (size_t)(nr < MOE_PF_ROWS ? nr : MOE_PF_ROWS));
    const int rc = kern_cpu_matmul(d, p->h + (size_t)s0 * ffn, w, ex->down_t,
                                   ex->down_b ? ex->down_b + (size_t)e * dim + r0 : NULL, c, nr, ffn, NULL);
    if (rc) {
        moe_fail(p, rc);
        return;
    }
    for (int r = 0; r < c; r++)
        memcpy(p->d + (size_t)(s0 + r) * dim + r0, d + (size_t)r * nr, sizeof(float) * (size_t)nr);
}

/* Phase 3, task t: columns [r0, r1) of y, each token's terms w·d added in ascending expert id from zero (the
 * order of one expert at a time). */
static void moe_sum_task(void *arg, int t)
{
    const struct moe_plan *p = arg;
    const int dim = p->ex->dim, k = p->k;
    const int r0 = t * p->rows_s, r1 = r0 + p->rows_s < dim ? r0 + p->rows_s : dim;
    for (int tk = 0; tk < p->n; tk++) {
        float *yt = p->y + (size_t)tk * dim;
        for (int i = r0; i < r1; i++) yt[i] = 0.0f;
        for (int j = 0; j < k; j++) {
            const int s = p->tslot[(size_t)tk * k + j];
            const float w = p->rw[s], *dr = p->d + (size_t)s * dim;
            for (int i = r0; i < r1; i++) yt[i] += w * dr[i];
        }
    }
}

int kern_cpu_moe_ffn(float *y, const float *x, const int32_t *ids, const float *wts, int n, int k,
                     const struct kern_cpu_moe_experts *ex, float *ws, struct tpool *tp)
{
    (void)ws;
    const int dim = ex->dim, ffn = ex->ffn, n_expert = ex->n_expert;
    if (n <= 0 || k < 1 || k > n_expert || dim <= 0 || ffn <= 0) return FERRY_ERR_INVALID;
    const size_t slots = (size_t)n * k;
    for (size_t i = 0; i < slots; i++)
        if (ids[i] < 0 || ids[i] >= n_expert) return FERRY_ERR_RANGE;
    /* The scratch: the gathered rows (slots, dim; an expert of one token reads x's row), h (slots, ffn), d
     * (slots, dim), the routing weights (slots), the slot tables and the per-expert lists. */
    const size_t f_x = slots * dim, f_h = slots * ffn, f_d = slots * dim;
    const size_t n_i = 3 * (size_t)n_expert + 1 + 2 * slots + (size_t)n;
    char *buf = thread_buf_get(&moe_buf, sizeof(float) * (f_x + f_h + f_d + slots) + sizeof(int32_t) * n_i +
                                             sizeof(float *) * (size_t)n_expert + 64);
    if (!buf) return FERRY_ERR_NOMEM;
    struct moe_plan p = {.ex = ex,
                         .y = y,
                         .n = n,
                         .k = k,
                         .gate_row = dtype_row_size(ex->gate_t, dim),
                         .up_row = dtype_row_size(ex->up_t, dim),
                         .down_row = dtype_row_size(ex->down_t, ffn),
                         .arith = kern_cpu_matmul_act(),
                         .plain = kern_cpu_matmul_plain()};
    atomic_init(&p.err, 0);
    const float **xe = (const float **)buf;
    float *xs = (float *)(buf + (sizeof(float *) * (size_t)n_expert + 63) / 64 * 64);
    p.xe = xe;
    p.h = xs + f_x;
    p.d = p.h + f_h;
    p.rw = p.d + f_d;
    p.start = (int32_t *)(p.rw + slots);
    p.act = p.start + n_expert + 1;
    p.tok = p.act + n_expert;
    p.tslot = p.tok + slots;
    int32_t *cnt = p.tslot + slots; /* (n_expert) then each expert's next free slot */
    int32_t *fill = cnt + n_expert; /* (n) each token's slots listed so far */
    /* Counting sort of the slots by expert, tokens ascending within an expert. */
    memset(cnt, 0, sizeof(int32_t) * (size_t)n_expert);
    for (size_t i = 0; i < slots; i++) cnt[ids[i]]++;
    p.start[0] = 0;
    for (int e = 0; e < n_expert; e++) {
        p.start[e + 1] = p.start[e] + cnt[e];
        if (cnt[e]) p.act[p.n_act++] = e;
        cnt[e] = p.start[e];
    }
    for (int t = 0; t < n; t++)
        for (int j = 0; j < k; j++) {
            const int e = ids[(size_t)t * k + j], s = cnt[e]++;
            p.tok[s] = t, p.rw[s] = wts[(size_t)t * k + j];
        }
    memset(fill, 0, sizeof(int32_t) * (size_t)n);
    for (size_t s = 0; s < slots; s++) {
        const int t = p.tok[s];
        p.tslot[(size_t)t * k + fill[t]++] = (int32_t)s;
    }
    for (int a = 0; a < p.n_act; a++) {
        const int e = p.act[a], s0 = p.start[e], c = p.start[e + 1] - s0;
        if (c == 1) {
            xe[e] = x + (size_t)p.tok[s0] * dim;
            continue;
        }
        float *xd = xs + (size_t)s0 * dim;
        for (int r = 0; r < c; r++)
            memcpy(xd + (size_t)r * dim, x + (size_t)p.tok[s0 + r] * dim, sizeof(float) * (size_t)dim);
        xe[e] = xd;
    }
    /* The partition: about MOE_TASKS_PER_THREAD tasks per thread in each phase (it changes no result: each
     * row of a product is computed alone, and y's terms add in expert order whatever the partition). */
    const int want = MOE_TASKS_PER_THREAD * tpool_size(tp);
    p.rows_gu = moe_block_rows(ffn, (want + p.n_act - 1) / p.n_act);
    p.n_blk_gu = (ffn + p.rows_gu - 1) / p.rows_gu;
    p.rows_d = moe_block_rows(dim, (want + p.n_act - 1) / p.n_act);
    p.n_blk_d = (dim + p.rows_d - 1) / p.rows_d;
    p.rows_s = moe_block_rows(dim, tpool_size(tp));
    p.n_blk_s = (dim + p.rows_s - 1) / p.rows_s;
    tpool_run(tp, moe_gate_up_task, &p, p.n_act * p.n_blk_gu);
    if (atomic_load(&p.err)) return atomic_load(&p.err);
    tpool_run(tp, moe_down_task, &p, p.n_act * p.n_blk_d);
    if (atomic_load(&p.err)) return atomic_load(&p.err);
    tpool_run(tp, moe_sum_task, &p, p.n_blk_s);
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
