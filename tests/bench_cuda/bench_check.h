/* bench_check — the CUDA benches' two checking macros: a failed CUDA runtime call (CK) or ferry call (FK) prints
 * the call, file and line and ends the bench (a benchmark has nothing to recover). */
#ifndef FERRY_BENCH_CHECK_H
#define FERRY_BENCH_CHECK_H

#include <stdio.h>
#include <stdlib.h>

#include <cuda_runtime_api.h>

#include "kernels/core/status.h"

#define CK(call)                                                                                             \
    do {                                                                                                     \
        cudaError_t e_ = (call);                                                                             \
        if (e_ != cudaSuccess) {                                                                             \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_));           \
            exit(1);                                                                                         \
        }                                                                                                    \
    } while (0)
#define FK(call)                                                                                             \
    do {                                                                                                     \
        int rc_ = (call);                                                                                    \
        if (rc_ != FERRY_OK) {                                                                               \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, ferry_status_str(rc_));            \
            exit(1);                                                                                         \
        }                                                                                                    \
    } while (0)

#endif
