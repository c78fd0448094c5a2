/* dequant — transitional: the status-returning row conversions from before the type table.
 *
 * New code calls dtype_to_f32 / dtype_from_f32 (quant/dtype.h), which return bool. These wrappers remain only
 * for kernels/cpu/ops.c, runtime/forward_cuda.c and tests/cuda/test_cuda_gemv_q8.c until their owners switch;
 * then this file goes, and with it the last include from quant/ up into kernels/core (the status codes).
 */
#ifndef FERRY_QUANT_DEQUANT_H
#define FERRY_QUANT_DEQUANT_H

#include "kernels/core/status.h"
#include "quant/dtype.h"

static inline int dequant_row(enum dtype t, const void *src, float *dst, int64_t n)
{
    return dtype_to_f32(t, src, dst, n) ? FERRY_OK : FERRY_ERR_INVALID;
}

static inline int quant_row(enum dtype t, const float *src, void *dst, int64_t n)
{
    return dtype_from_f32(t, src, dst, n) ? FERRY_OK : FERRY_ERR_INVALID;
}

#endif
