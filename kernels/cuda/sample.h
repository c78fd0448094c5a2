/* sample (CUDA) — the next token of each row of a batch of logits, chosen on the GPU, with the CPU sampler's
 * definition and arithmetic (runtime/sampler.h; kernels/core/sample_math.h), so that both choose the same
 * token for the same logits, history, seed and step.
 *
 * Per row: logit_bias (entries in order) → repetition / presence / frequency penalties over the row's history
 * (distinct tokens with their counts) → the allowed-token bitmask (a JSON or grammar mask computed by the
 * host; disallowed tokens become -inf) → NaN as -inf → greedy if temperature <= 0 → temperature → candidates
 * within 30 of the best → top-k → top-p → min-p → a counter-based draw (seed, step). Optionally the
 * log-softmax of the raw row at the chosen token and its top n (n <= 20) entries. No sort of the vocabulary:
 * the k-th best and the top-p boundary are found by radix selection (three 11-bit passes over the row,
 * integer counts and masses, warp-aggregated shared-memory atomics: exact, so the result is deterministic).
 * One block of 512 threads per row; the result of a row depends only on that row's inputs (not on the
 * batch). No host synchronisation and no allocation: graph-capturable. Only `tokens` (b int32) and, when
 * asked, `lp` need to cross PCIe afterwards.
 */
#ifndef FERRY_KERN_CUDA_SAMPLE_H
#define FERRY_KERN_CUDA_SAMPLE_H

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

#define KERN_SAMPLE_MAX_TOP   20
#define KERN_SAMPLE_MAX_VOCAB (1 << 18)

/* One row's controls (device memory, uploaded per step; 72 bytes). The semantics of each field are those of
 * struct sampler_params (runtime/sampler.h). */
struct kern_cuda_sample_row {
    float temperature;        /* <= 0: greedy (argmax, lowest id on ties) */
    float top_p;              /* >= 1: off */
    float min_p;              /* <= 0: off */
    float repetition_penalty; /* 1: off; > 0 */
    float presence_penalty;   /* 0: off */
    float frequency_penalty;  /* 0: off */
    int32_t top_k;            /* <= 0: off */
    int32_t n_logprobs; /* < 0: none; 0: the chosen token's logprob; 1..20: and the top n of the raw row */
    uint64_t seed;
    uint64_t step; /* index of this draw in the stream `seed` (sampler_step() on the CPU side) */
    int32_t bias_begin, bias_end; /* entries [begin, end) of bias_tok/bias_val, applied in order */
    int32_t hist_begin, hist_end; /* entries [begin, end) of hist_tok/hist_cnt: distinct tokens, counts > 0 */
    int32_t mask_row; /* < 0: all allowed; else row of `mask` (bit t % 32 of word t / 32 = allowed) */
    int32_t lp_token; /* < 0: logprob of the chosen token; else of this token (prompt logprobs) */
};

/* Where the batch's inputs are (a host struct holding device pointers). */
struct kern_cuda_sample_batch {
    const float *logits;                     /* (b, n_vocab) f32; not modified */
    const struct kern_cuda_sample_row *rows; /* (b) */
    const int32_t *bias_tok;                 /* (total bias entries) token ids; NULL if no row has any */
    const float *bias_val;                   /* same length: added to the logit */
    const int32_t *hist_tok;                 /* (total history entries) token ids, distinct within a row */
    const uint32_t *hist_cnt;                /* same length: occurrences (> 0) */
    const uint32_t *mask;                    /* (rows of masks, ceil(n_vocab / 32)); NULL if no row has one */
    int b;                                   /* rows, 1..65535 */
    int n_vocab;                             /* 1..KERN_SAMPLE_MAX_VOCAB */
};

/* Log-probabilities of one row (written when its n_logprobs >= 0). */
struct kern_cuda_sample_lp {
    float logprob;                       /* log-softmax of the raw logits at the chosen token (or lp_token) */
    int32_t n_top;                       /* entries below: min(n_logprobs, 20, n_vocab) */
    int32_t top_id[KERN_SAMPLE_MAX_TOP]; /* by raw logit descending, lowest id first on ties */
    float top_lp[KERN_SAMPLE_MAX_TOP];
};

/* Device workspace bytes for b rows (a working copy of the logits). */
size_t kern_cuda_sample_ws_size(int b, int n_vocab);

/* tokens (b) int32 device: the chosen ids. lp (b) device: written for rows with n_logprobs >= 0 (may be NULL
 * when no row asks). ws: kern_cuda_sample_ws_size(b, n_vocab) bytes, 16-byte aligned, any contents.
 * Returns FERRY_ERR_INVALID for bad sizes or pointers (row contents are not read on the host: a bias or
 * history token outside [0, n_vocab) is ignored on the device, a mask_row is trusted). */
int kern_cuda_sample(const struct kern_cuda_sample_batch *batch, int32_t *tokens,
                     struct kern_cuda_sample_lp *lp, void *ws, size_t ws_bytes, cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif
