/* matrix — converts a whole matrix between types (F16 -> Q4_K, BF16 -> Q8_0, ...), spread over threads.
 *
 * Each row is converted to f32 exactly (dtype to_f32) and then by the destination type's from_f32, so the
 * result is byte for byte what converting it row by row gives (and what llama-quantize writes for an F32, F16
 * or BF16 source). Blocks are independent, so a row goes through a small stack buffer a few thousand elements
 * at a time: nothing is allocated. quant/ has no threads of its own: the caller lends its parallel-for (a
 * struct quant_runner; kernels/cpu/threadpool's tpool_run fits). Rows are split into tasks by index only, so
 * the bytes do not depend on the number of threads.
 */
#ifndef FERRY_QUANT_MATRIX_H
#define FERRY_QUANT_MATRIX_H

#include <stdbool.h>
#include <stdint.h>

#include "quant/dtype.h"

typedef void (*quant_task_fn)(void *ctx, int task);

/* run(pool, task, ctx, n) calls task(ctx, i) for every i in [0, n), in any order and possibly concurrently,
 * and returns when all calls are done. A NULL runner (or run) runs the tasks in order on the caller. */
struct quant_runner {
    void (*run)(void *pool, quant_task_fn task, void *ctx, int n_tasks);
    void *pool;
};

/* dst (rows, cols) in type `to` from src (rows, cols) in type `from`; from == to copies the bytes. When
 * bad_row is not NULL it receives the first row holding a NaN or an infinity (checked on the f32 values;
 * never for a copy), or -1; that row is converted all the same. False, with nothing written, when a type is
 * unknown, `to` has no quantizer (and differs from `from`), a pointer is NULL, rows or cols is negative, or
 * cols is not a multiple of both block sizes. */
bool quant_matrix(enum dtype to, void *dst, enum dtype from, const void *src, int64_t rows, int64_t cols,
                  const struct quant_runner *runner, int64_t *bad_row);

/* Importance weights of a matrix (an importance matrix's entry): w (n_sets, cols) f32, one set per stacked
 * expert; row r of a quant_matrix_w call uses set (row0 + r) / rows_per_set (row0: the index of the call's
 * first row in the whole tensor, for a tensor converted in chunks). */
struct quant_weights {
    const float *w;
    int64_t rows_per_set; /* >= 1 */
    int64_t row0;
};

/* quant_matrix with importance weights for the types that take them (dtype_from_f32_w): each row is
 * converted whole (one heap row buffer per task). qw NULL: quant_matrix. Also false when a row buffer
 * cannot be allocated or rows_per_set < 1. */
bool quant_matrix_w(enum dtype to, void *dst, enum dtype from, const void *src, int64_t rows, int64_t cols,
                    const struct quant_runner *runner, int64_t *bad_row, const struct quant_weights *qw);

#endif
