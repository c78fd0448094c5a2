/* spec — prompt-lookup drafting, the verification step and the walk over its rows (see spec.h). */
#include "runtime/spec.h"

#include <string.h>

#include "kernels/core/status.h"

int spec_ngram_draft(const int32_t *hist, int n_hist, int n_min, int n_max, int k, int32_t *out)
{
    if (!hist || n_hist < 2 || k <= 0 || n_min < 1) return 0;
    if (n_max > n_hist - 1) n_max = n_hist - 1;
    for (int n = n_max; n >= n_min; n--) {
        const int32_t *suffix = hist + n_hist - n;
        /* The latest earlier occurrence (it starts before the suffix does, so a token follows it) that is
         * followed by k tokens, else the one followed by the most: near the end (a run of one token) the
         * latest is followed by few. */
        int best = -1, best_m = 0;
        for (int i = n_hist - n - 1; i >= 0 && best_m < k; i--) {
            if (hist[i] != suffix[0] || memcmp(hist + i, suffix, (size_t)n * sizeof *hist) != 0) continue;
            int m = n_hist - (i + n);
            if (m > best_m) best = i, best_m = m;
        }
        if (best >= 0) {
            int m = best_m < k ? best_m : k;
            memcpy(out, hist + best + n, (size_t)m * sizeof *out);
            return m;
        }
    }
    return 0;
}

int spec_step(struct engine *e, int seq, int32_t pending, int pos, const int32_t *draft, int k, float *logits)
{
    return spec_step_hidden(e, seq, pending, pos, draft, k, logits, NULL);
}

int spec_step_hidden(struct engine *e, int seq, int32_t pending, int pos, const int32_t *draft, int k,
                     float *logits, float *hidden)
{
    if (k < 0 || k > SPEC_MAX_DRAFT || pos < 0) return FERRY_ERR_INVALID;
    int rc = k > 0 && pos > 0 ? engine_seq_checkpoint(e, seq) : FERRY_OK;
    if (rc) return rc;
    int32_t tok[SPEC_MAX_DRAFT + 1], ps[SPEC_MAX_DRAFT + 1], sq[SPEC_MAX_DRAFT + 1];
    uint8_t want[SPEC_MAX_DRAFT + 1];
    for (int i = 0; i <= k; i++) {
        tok[i] = i == 0 ? pending : draft[i - 1];
        ps[i] = pos + i;
        sq[i] = seq;
        want[i] = 1;
    }
    struct batch b = {
        .n_tokens = k + 1, .tokens = tok, .pos = ps, .seq = sq, .want_logits = want, .hidden_out = hidden};
    return engine_step(e, &b, logits);
}

int spec_keep(struct engine *e, int seq, int32_t pending, int pos, const int32_t *draft, int k, int n_acc,
              float *hidden)
{
    if (n_acc < 0 || n_acc > k || k > SPEC_MAX_DRAFT) return FERRY_ERR_INVALID;
    const int want = pos + n_acc + 1;
    if (n_acc == k) return FERRY_OK;
    const int kept = engine_seq_keep(e, seq, want);
    if (kept < 0) return kept;
    if (kept == want) return FERRY_OK;
    if (kept != pos) return FERRY_ERR_INTERNAL; /* no checkpoint where the step began */
    int32_t tok[SPEC_MAX_DRAFT + 1], ps[SPEC_MAX_DRAFT + 1], sq[SPEC_MAX_DRAFT + 1];
    uint8_t none[SPEC_MAX_DRAFT + 1];
    for (int i = 0; i <= n_acc; i++) {
        tok[i] = i == 0 ? pending : draft[i - 1];
        ps[i] = pos + i, sq[i] = seq, none[i] = 0;
    }
    struct batch b = {.n_tokens = n_acc + 1,
                      .tokens = tok,
                      .pos = ps,
                      .seq = sq,
                      .want_logits = none,
                      .hidden_out = hidden};
    return engine_step(e, &b, NULL);
}

int spec_walk(float *logits, int n_vocab, const int32_t *draft, int k, spec_draw_fn draw, void *ctx,
              int32_t *out, int *ended)
{
    *ended = 0;
    for (int i = 0; i <= k; i++) {
        out[i] = draw(ctx, logits + (size_t)i * n_vocab);
        if (out[i] < 0) {
            *ended = 1;
            return i + 1;
        }
        if (i == k || out[i] != draft[i]) return i + 1;
    }
    return k + 1; /* not reached */
}
