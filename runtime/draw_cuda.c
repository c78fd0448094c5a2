/* draw_cuda — engine_step_draw on the CUDA backend (see draw_cuda.h). */
#include "runtime/draw_cuda.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/core/log.h"
#include "kernels/core/status.h"
#include "runtime/cuda_check.h"
#include "kernels/cuda/sample.h"
#include "runtime/pinned.h"
#include "runtime/sampler.h"

#define ALIGN        256
#define BIAS_PER_ROW 64 /* logit_bias entries per row on average, beyond one request's most (4096) */
#define BIAS_BASE    4096
#define HIST_PER_ROW 2048 /* distinct penalized tokens per row on average */


/* One layout for the host staging and the device copy: the arrays in this order, each 256-byte aligned. */
struct draw_layout {
    size_t rows, bias_tok, bias_val, hist_tok, hist_cnt, mask, tokens, lp, end; /* byte offsets */
};

struct draw_cuda {
    int cap_rows, cap_bias, cap_hist, n_vocab, words; /* words: u32 of one row's mask */
    struct draw_layout lay;
    unsigned char *host; /* (lay.end) pinned */
    unsigned char *dev;  /* (lay.end) then the sampler's workspace */
    void *ws;
    size_t ws_bytes;
    int n_enqueued; /* rows of the draw on its way (draw_cuda_enqueue), 0 when none */
};

static size_t align_up(size_t n)
{
    return (n + ALIGN - 1) / ALIGN * ALIGN;
}

static void caps_of(int rows, int *bias, int *hist)
{
    *bias = BIAS_BASE + rows * BIAS_PER_ROW;
    *hist = rows * HIST_PER_ROW;
}

static struct draw_layout layout(int rows, int n_vocab)
{
    int cb, ch;
    caps_of(rows, &cb, &ch);
    const size_t words = ((size_t)n_vocab + 31) / 32;
    struct draw_layout l;
    size_t at = 0;
    l.rows = at, at += align_up((size_t)rows * sizeof(struct kern_cuda_sample_row));
    l.bias_tok = at, at += align_up((size_t)cb * sizeof(int32_t));
    l.bias_val = at, at += align_up((size_t)cb * sizeof(float));
    l.hist_tok = at, at += align_up((size_t)ch * sizeof(int32_t));
    l.hist_cnt = at, at += align_up((size_t)ch * sizeof(uint32_t));
    l.mask = at, at += align_up((size_t)rows * words * sizeof(uint32_t));
    l.tokens = at, at += align_up((size_t)rows * sizeof(int32_t));
    l.lp = at, at += align_up((size_t)rows * sizeof(struct kern_cuda_sample_lp));
    l.end = at;
    return l;
}

size_t draw_cuda_device_bytes(int rows, int n_vocab)
{
    return layout(rows, n_vocab).end + align_up(kern_cuda_sample_ws_size(rows, n_vocab));
}

int draw_cuda_init(struct draw_cuda **out, void *dev, int rows, int n_vocab)
{
    *out = NULL;
    if (rows <= 0 || rows > 65535 || n_vocab <= 0 || n_vocab > KERN_SAMPLE_MAX_VOCAB || !dev)
        return FERRY_ERR_INVALID;
    struct draw_cuda *d = calloc(1, sizeof *d);
    if (!d) return FERRY_ERR_NOMEM;
    d->cap_rows = rows;
    caps_of(rows, &d->cap_bias, &d->cap_hist);
    d->n_vocab = n_vocab;
    d->words = (n_vocab + 31) / 32;
    d->lay = layout(rows, n_vocab);
    d->dev = dev;
    d->ws = d->dev + d->lay.end;
    d->ws_bytes = kern_cuda_sample_ws_size(rows, n_vocab);
    d->host = pinned_mapped_alloc(d->lay.end);
    if (!d->host) {
        free(d);
        return FERRY_ERR_CUDA;
    }
    *out = d;
    return FERRY_OK;
}

void draw_cuda_free(struct draw_cuda *d)
{
    if (!d) return;
    pinned_mapped_free(d->host);
    free(d);
}

void draw_cuda_caps(const struct draw_cuda *d, int *rows, int *bias, int *hist)
{
    *rows = d->cap_rows;
    *bias = d->cap_bias;
    *hist = d->cap_hist;
}

int draw_cuda_enqueue(struct draw_cuda *d, const float *logits, const struct draw_row *rows, int n,
                      cudaStream_t s)
{
    d->n_enqueued = 0;
    if (n <= 0) return FERRY_OK;
    if (n > d->cap_rows) return FERRY_ERR_UNSUPPORTED;
    const struct draw_layout *l = &d->lay;
    struct kern_cuda_sample_row *kr = (struct kern_cuda_sample_row *)(d->host + l->rows);
    int32_t *bias_tok = (int32_t *)(d->host + l->bias_tok), *hist_tok = (int32_t *)(d->host + l->hist_tok);
    float *bias_val = (float *)(d->host + l->bias_val);
    uint32_t *hist_cnt = (uint32_t *)(d->host + l->hist_cnt), *mask = (uint32_t *)(d->host + l->mask);
    int nb = 0, nh = 0, nm = 0, any_lp = 0;
    for (int i = 0; i < n; i++) {
        const struct sampler *smp = rows[i].smp;
        const struct sampler_params *p = sampler_get_params(smp);
        struct kern_cuda_sample_row *k = &kr[i];
        memset(k, 0, sizeof *k);
        k->temperature = p->temperature;
        k->top_p = p->top_p;
        k->min_p = p->min_p;
        k->repetition_penalty = p->repetition_penalty;
        k->presence_penalty = p->presence_penalty;
        k->frequency_penalty = p->frequency_penalty;
        k->top_k = p->top_k;
        k->seed = p->seed;
        k->step = sampler_step(smp);
        k->n_logprobs = rows[i].n_logprobs < 0              ? -1
                        : rows[i].n_logprobs > DRAW_MAX_TOP ? DRAW_MAX_TOP
                                                            : rows[i].n_logprobs;
        any_lp |= k->n_logprobs >= 0;
        k->lp_token = -1;
        if (nb + p->n_logit_bias > d->cap_bias) return FERRY_ERR_UNSUPPORTED;
        k->bias_begin = nb;
        for (int j = 0; j < p->n_logit_bias; j++, nb++) {
            bias_tok[nb] = p->logit_bias[j].token;
            bias_val[nb] = p->logit_bias[j].bias;
        }
        k->bias_end = nb;
        k->hist_begin = k->hist_end = nh;
        if (sampler_penalizes(smp)) {
            const int h = sampler_history(smp, NULL, NULL, 0);
            if (nh + h > d->cap_hist) return FERRY_ERR_UNSUPPORTED;
            sampler_history(smp, hist_tok + nh, hist_cnt + nh, h);
            nh += h;
            k->hist_end = nh;
        }
        k->mask_row = -1;
        if (rows[i].allowed) {
            uint32_t *m = mask + (size_t)nm * d->words;
            memset(m, 0, (size_t)d->words * sizeof *m);
            for (int t = 0; t < d->n_vocab; t++)
                if (rows[i].allowed[t]) m[t >> 5] |= 1u << (t & 31);
            k->mask_row = nm++;
        }
    }
    CK(cudaMemcpyAsync(d->dev + l->rows, kr, (size_t)n * sizeof *kr, cudaMemcpyHostToDevice, s));
    if (nb) {
        CK(cudaMemcpyAsync(d->dev + l->bias_tok, bias_tok, (size_t)nb * sizeof *bias_tok,
                           cudaMemcpyHostToDevice, s));
        CK(cudaMemcpyAsync(d->dev + l->bias_val, bias_val, (size_t)nb * sizeof *bias_val,
                           cudaMemcpyHostToDevice, s));
    }
    if (nh) {
        CK(cudaMemcpyAsync(d->dev + l->hist_tok, hist_tok, (size_t)nh * sizeof *hist_tok,
                           cudaMemcpyHostToDevice, s));
        CK(cudaMemcpyAsync(d->dev + l->hist_cnt, hist_cnt, (size_t)nh * sizeof *hist_cnt,
                           cudaMemcpyHostToDevice, s));
    }
    if (nm)
        CK(cudaMemcpyAsync(d->dev + l->mask, mask, (size_t)nm * d->words * sizeof *mask,
                           cudaMemcpyHostToDevice, s));
    const struct kern_cuda_sample_batch kb = {
        .logits = logits,
        .rows = (const struct kern_cuda_sample_row *)(d->dev + l->rows),
        .bias_tok = nb ? (const int32_t *)(d->dev + l->bias_tok) : NULL,
        .bias_val = nb ? (const float *)(d->dev + l->bias_val) : NULL,
        .hist_tok = nh ? (const int32_t *)(d->dev + l->hist_tok) : NULL,
        .hist_cnt = nh ? (const uint32_t *)(d->dev + l->hist_cnt) : NULL,
        .mask = nm ? (const uint32_t *)(d->dev + l->mask) : NULL,
        .b = n,
        .n_vocab = d->n_vocab,
    };
    int rc = kern_cuda_sample(&kb, (int32_t *)(d->dev + l->tokens),
                              any_lp ? (struct kern_cuda_sample_lp *)(d->dev + l->lp) : NULL, d->ws,
                              d->ws_bytes, s);
    if (rc) return rc;
    CK(cudaMemcpyAsync(d->host + l->tokens, d->dev + l->tokens, (size_t)n * sizeof(int32_t),
                       cudaMemcpyDeviceToHost, s));
    if (any_lp)
        CK(cudaMemcpyAsync(d->host + l->lp, d->dev + l->lp, (size_t)n * sizeof(struct kern_cuda_sample_lp),
                           cudaMemcpyDeviceToHost, s));
    d->n_enqueued = n;
    return FERRY_OK;
}

int draw_cuda_collect(struct draw_cuda *d, int n, struct draw_out *out, cudaStream_t s)
{
    if (n <= 0) return FERRY_OK;
    if (n != d->n_enqueued) return FERRY_ERR_INVALID;
    d->n_enqueued = 0;
    CK(cudaStreamSynchronize(s));
    const struct draw_layout *l = &d->lay;
    const struct kern_cuda_sample_row *kr = (const struct kern_cuda_sample_row *)(d->host + l->rows);
    const int32_t *tokens = (const int32_t *)(d->host + l->tokens);
    const struct kern_cuda_sample_lp *lp = (const struct kern_cuda_sample_lp *)(d->host + l->lp);
    for (int i = 0; i < n; i++) {
        struct draw_out *o = &out[i];
        o->token = tokens[i];
        o->logprob = 0.0f;
        o->n_top = 0;
        if (kr[i].n_logprobs >= 0) {
            o->logprob = lp[i].logprob;
            o->n_top = lp[i].n_top < 0 ? 0 : lp[i].n_top > DRAW_MAX_TOP ? DRAW_MAX_TOP : lp[i].n_top;
            memcpy(o->top_id, lp[i].top_id, (size_t)o->n_top * sizeof *o->top_id);
            memcpy(o->top_lp, lp[i].top_lp, (size_t)o->n_top * sizeof *o->top_lp);
        }
    }
    return FERRY_OK;
}
