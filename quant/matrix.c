/* matrix — whole-matrix type conversion over the caller's threads (see matrix.h). */
#include "quant/matrix.h"

#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

/* Elements per step through the f32 buffer: a multiple of every block size (1, 32, 256); 16 KiB of stack. */
#define STEP 4096
/* Elements per task: large enough that handing out tasks costs nothing, small enough to balance 16+ threads
 * over a 4096 x 4096 matrix. */
#define TASK_ELEMS (1 << 18)

struct job {
    const struct dtype_traits *to, *from;
    uint8_t *dst;
    const uint8_t *src;
    int64_t rows, cols, rows_per_task;
    size_t dst_row, src_row; /* bytes */
    _Atomic int64_t bad_row; /* smallest row with a non-finite value, or INT64_MAX */
    const struct quant_weights *qw;
    _Atomic int failed; /* a row buffer could not be allocated */
};

static bool all_finite(const float *x, int64_t n)
{
    /* An all-ones exponent (infinity, NaN) carries into bit 31 when 2^23 is added to it; an integer OR
     * vectorizes where a float test would not. */
    uint32_t acc = 0;
    for (int64_t i = 0; i < n; i++) {
        uint32_t b;
        memcpy(&b, &x[i], 4);
        acc |= (b & 0x7f800000u) + 0x00800000u;
    }
    return !(acc & 0x80000000u);
}

static void note_bad_row(struct job *j, int64_t r)
{
    int64_t cur = atomic_load(&j->bad_row);
    while (r < cur && !atomic_compare_exchange_weak(&j->bad_row, &cur, r)) {
    }
}

static void convert_task(void *ctx, int task)
{
    struct job *j = ctx;
    const int64_t r0 = (int64_t)task * j->rows_per_task;
    const int64_t r1 = r0 + j->rows_per_task < j->rows ? r0 + j->rows_per_task : j->rows;
    float buf[STEP];
    const size_t to_step = STEP / (size_t)j->to->block_size * j->to->type_size;
    const size_t from_step = STEP / (size_t)j->from->block_size * j->from->type_size;
    for (int64_t r = r0; r < r1; r++) {
        const uint8_t *s = j->src + j->src_row * (size_t)r;
        uint8_t *d = j->dst + j->dst_row * (size_t)r;
        bool finite = true;
        for (int64_t c = 0; c < j->cols; c += STEP, s += from_step, d += to_step) {
            const int64_t n = j->cols - c < STEP ? j->cols - c : STEP;
            j->from->to_f32(s, buf, n);
            finite &= all_finite(buf, n);
            j->to->from_f32(buf, d, n);
        }
        if (!finite) note_bad_row(j, r);
    }
}

/* Whole rows through a heap buffer, with the row's importance weights. */
static void convert_weighted_task(void *ctx, int task)
{
    struct job *j = ctx;
    const int64_t r0 = (int64_t)task * j->rows_per_task;
    const int64_t r1 = r0 + j->rows_per_task < j->rows ? r0 + j->rows_per_task : j->rows;
    float *buf = malloc((size_t)j->cols * sizeof(float));
    if (!buf) {
        atomic_store(&j->failed, 1);
        return;
    }
    for (int64_t r = r0; r < r1; r++) {
        j->from->to_f32(j->src + j->src_row * (size_t)r, buf, j->cols);
        if (!all_finite(buf, j->cols)) note_bad_row(j, r);
        const float *w = j->qw->w + (size_t)((j->qw->row0 + r) / j->qw->rows_per_set) * (size_t)j->cols;
        j->to->from_f32_w(buf, j->dst + j->dst_row * (size_t)r, j->cols, w);
    }
    free(buf);
}

static void copy_task(void *ctx, int task)
{
    struct job *j = ctx;
    const int64_t r0 = (int64_t)task * j->rows_per_task;
    const int64_t r1 = r0 + j->rows_per_task < j->rows ? r0 + j->rows_per_task : j->rows;
    memcpy(j->dst + j->dst_row * (size_t)r0, j->src + j->src_row * (size_t)r0,
           j->dst_row * (size_t)(r1 - r0));
}

bool quant_matrix(enum dtype to, void *dst, enum dtype from, const void *src, int64_t rows, int64_t cols,
                  const struct quant_runner *runner, int64_t *bad_row)
{
    return quant_matrix_w(to, dst, from, src, rows, cols, runner, bad_row, NULL);
}

bool quant_matrix_w(enum dtype to, void *dst, enum dtype from, const void *src, int64_t rows, int64_t cols,
                    const struct quant_runner *runner, int64_t *bad_row, const struct quant_weights *qw)
{
    const struct dtype_traits *tt = dtype_get_traits(to), *ft = dtype_get_traits(from);
    if (!tt || !ft || !dst || !src || rows < 0 || cols < 0 || cols % tt->block_size || cols % ft->block_size)
        return false;
    if (qw && (!qw->w || qw->rows_per_set < 1)) return false;
    if (qw && (to == from || !tt->from_f32_w)) qw = NULL; /* weights change nothing for this type */
    if (to != from && !tt->from_f32 && !qw) return false; /* a type ferry reads but does not write */
    if (bad_row) *bad_row = -1;
    if (rows == 0 || cols == 0) return true;
    struct job j = {.to = tt,
                    .from = ft,
                    .dst = dst,
                    .src = src,
                    .rows = rows,
                    .cols = cols,
                    .dst_row = dtype_row_size(to, cols),
                    .src_row = dtype_row_size(from, cols)};
    atomic_init(&j.bad_row, INT64_MAX);
    atomic_init(&j.failed, 0);
    j.qw = qw;
    j.rows_per_task = TASK_ELEMS / cols > 0 ? TASK_ELEMS / cols : 1;
    int64_t n_tasks = (rows + j.rows_per_task - 1) / j.rows_per_task;
    if (n_tasks > (1 << 30)) { /* keep the task count an int */
        j.rows_per_task = (rows + (1 << 30) - 1) / (1 << 30);
        n_tasks = (rows + j.rows_per_task - 1) / j.rows_per_task;
    }
    const quant_task_fn fn = to == from ? copy_task : qw ? convert_weighted_task : convert_task;
    if (runner && runner->run)
        runner->run(runner->pool, fn, &j, (int)n_tasks);
    else
        for (int i = 0; i < (int)n_tasks; i++) fn(&j, i);
    if (bad_row) {
        const int64_t b = atomic_load(&j.bad_row);
        *bad_row = b == INT64_MAX ? -1 : b;
    }
    return !atomic_load(&j.failed);
}
