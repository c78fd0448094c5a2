/* dtype — element types of tensors, numbered as GGUF numbers them (ggml_type), and their storage sizes.
 *
 * A tensor of `n` elements along its rows (ne0) is stored in blocks of dtype_block_size() elements taking
 * dtype_type_size() bytes each; `n` must be a multiple of the block size. Plain types have block size 1.
 * Only the types listed here are accepted; anything else in a file is FERRY_ERR_UNSUPPORTED.
 */
#ifndef FERRY_DTYPE_H
#define FERRY_DTYPE_H

#include <stddef.h>
#include <stdint.h>

enum dtype {
    DTYPE_F32 = 0,
    DTYPE_F16 = 1,
    DTYPE_Q4_0 = 2,
    DTYPE_Q4_1 = 3,
    DTYPE_Q5_0 = 6,
    DTYPE_Q5_1 = 7,
    DTYPE_Q8_0 = 8,
    DTYPE_Q4_K = 12,
    DTYPE_Q5_K = 13,
    DTYPE_Q6_K = 14,
    DTYPE_BF16 = 30,
    DTYPE_COUNT = 31, /* one past the largest id; not a type */
};

/* 1 if `t` is one of the types above. */
int dtype_valid(uint32_t t);
const char *dtype_name(enum dtype t);
/* Elements per block (1, 32 or 256). */
int dtype_block_size(enum dtype t);
/* Bytes per block. */
size_t dtype_type_size(enum dtype t);
/* Bytes of a row of n elements, or 0 when n is not a multiple of the block size. */
size_t dtype_row_size(enum dtype t, int64_t n);

#endif
