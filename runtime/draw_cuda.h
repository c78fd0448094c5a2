/* draw_cuda — engine_step_draw on the CUDA backend: the step's output rows sampled on the device by the GPU
 * sampler (kernels/cuda/sample.h), so that only the chosen ids and the logprobs asked for cross PCIe.
 *
 * Per step the rows' controls (struct draw_row: each sampler's parameters, logit_bias, penalty history when a
 * penalty is on, the grammar's mask as a bitmask) are packed into pinned host memory, uploaded in four
 * copies, the sampler runs over the device logits, and tokens and logprobs come back. Capacities are fixed
 * at init (rows, bias and history entries; draw_cuda_caps): engine_step_draw refuses a step beyond them
 * before running it. The device part is carved from the backend's arena (draw_cuda_device_bytes), the host
 * part is its own pinned allocation. Usage: draw_cuda_init(&d, dev, rows, n_vocab); per step
 * draw_cuda_enqueue(...) then draw_cuda_collect(...); draw_cuda_free(d).
 */
#ifndef FERRY_DRAW_CUDA_H
#define FERRY_DRAW_CUDA_H

#include <stddef.h>

#include <cuda_runtime_api.h>

#include "runtime/batch.h"

struct draw_cuda;

/* Device bytes draw_cuda_init needs for `rows` rows of n_vocab logits (a multiple of 256). */
size_t draw_cuda_device_bytes(int rows, int n_vocab);
/* dev: draw_cuda_device_bytes(rows, n_vocab) bytes of device memory, 256-byte aligned, kept by the caller. */
int draw_cuda_init(struct draw_cuda **out, void *dev, int rows, int n_vocab);
void draw_cuda_free(struct draw_cuda *d);
/* The most rows, logit_bias entries and history entries (of rows with a penalty on) one run takes. */
void draw_cuda_caps(const struct draw_cuda *d, int *rows, int *bias, int *hist);
/* Queues the draw of rows[0, n) from logits (n, n_vocab) f32 device on stream s, and the copies of its
 * results to the host; returns without waiting (rows are read here, not later). FERRY_ERR_UNSUPPORTED
 * beyond the capacities. */
int draw_cuda_enqueue(struct draw_cuda *d, const float *logits, const struct draw_row *rows, int n,
                      cudaStream_t s);
/* Waits for stream s, then out[i] gets row i's token and logprobs of the draw enqueued last (n: its rows;
 * FERRY_ERR_INVALID when no such draw is on its way). */
int draw_cuda_collect(struct draw_cuda *d, int n, struct draw_out *out, cudaStream_t s);

#endif
