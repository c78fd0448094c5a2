/* attention — causal GQA attention over the paged f32 KV cache (see attention.h for the cache layout).
 *
 * kern_cpu_attention runs one task per (token, query head) pair, split over the pool statically, so every
 * output row is computed by one thread in a fixed order: deterministic and independent of the pool size.
 * A task walks the token's sequence block by block; within a block it scores up to ATT_CHUNK positions,
 * then folds them into a running (max, sum, accumulator) — the online softmax — rescaling the accumulator
 * only when the maximum grows. Positions are visited in increasing order.
 * The reference computes all scores in double, takes the max, exponentiates and normalises (two passes).
 */
#include "kernels/cpu/attention.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/threadpool.h"

#define ATT_CHUNK 64
#define ATT_MAX_HEAD_DIM 1024

static inline const float *kv_row(const struct kv_layer_view *kv, const float *base, int seq, int pos, int kvh)
{
    const int32_t blk = kv->block_table[(size_t)seq * kv->max_blocks + pos / kv->block_size];
    const size_t row = (size_t)blk * kv->block_size + pos % kv->block_size;
    return base + (row * kv->n_kv_heads + kvh) * kv->head_dim;
}

void kern_cpu_kv_store(const struct kv_layer_view *kv, const float *k_new, const float *v_new, const int32_t *seq,
                       const int32_t *pos, int m)
{
    const size_t w = (size_t)kv->n_kv_heads * kv->head_dim;
    for (int i = 0; i < m; i++) {
        float *kd = (float *)kv_row(kv, kv->k, seq[i], pos[i], 0);
        float *vd = (float *)kv_row(kv, kv->v, seq[i], pos[i], 0);
        memcpy(kd, k_new + i * w, w * sizeof(float));
        memcpy(vd, v_new + i * w, w * sizeof(float));
    }
}

struct att_ctx {
    float *out;
    const float *q;
    const struct kv_layer_view *kv;
    const int32_t *seq, *pos;
    int n_heads;
    float scale;
};

static inline float dot(const float *a, const float *b, int d)
{
    float s0 = 0, s1 = 0, s2 = 0, s3 = 0, s4 = 0, s5 = 0, s6 = 0, s7 = 0;
    int i = 0;
    for (; i + 8 <= d; i += 8) {
        s0 += a[i] * b[i];
        s1 += a[i + 1] * b[i + 1];
        s2 += a[i + 2] * b[i + 2];
        s3 += a[i + 3] * b[i + 3];
        s4 += a[i + 4] * b[i + 4];
        s5 += a[i + 5] * b[i + 5];
        s6 += a[i + 6] * b[i + 6];
        s7 += a[i + 7] * b[i + 7];
    }
    for (; i < d; i++) s0 += a[i] * b[i];
    return ((s0 + s4) + (s2 + s6)) + ((s1 + s5) + (s3 + s7));
}

static void att_task(void *arg, int task)
{
    const struct att_ctx *c = arg;
    const struct kv_layer_view *kv = c->kv;
    const int t = task / c->n_heads, h = task % c->n_heads;
    const int hd = kv->head_dim;
    const int kvh = h / (c->n_heads / kv->n_kv_heads);
    const float *q = c->q + ((size_t)t * c->n_heads + h) * hd;
    float *o = c->out + ((size_t)t * c->n_heads + h) * hd;
    const int seq = c->seq[t], last = c->pos[t];
    float acc[ATT_MAX_HEAD_DIM];
    float sc[ATT_CHUNK];
    float mx = -INFINITY, sum = 0.0f;
    for (int d = 0; d < hd; d++) acc[d] = 0.0f;

    for (int p0 = 0; p0 <= last;) {
        /* A chunk never crosses a block boundary: its rows are contiguous in the cache. */
        int len = kv->block_size - p0 % kv->block_size;
        if (len > ATT_CHUNK) len = ATT_CHUNK;
        if (len > last + 1 - p0) len = last + 1 - p0;
        const float *kr = kv_row(kv, kv->k, seq, p0, kvh);
        const float *vr = kv_row(kv, kv->v, seq, p0, kvh);
        const size_t stride = (size_t)kv->n_kv_heads * hd;
        float cmx = -INFINITY;
        for (int j = 0; j < len; j++) {
            sc[j] = dot(q, kr + j * stride, hd) * c->scale;
            if (sc[j] > cmx) cmx = sc[j];
        }
        if (cmx > mx) {
            const float r = expf(mx - cmx); /* 0 on the first chunk */
            sum *= r;
            for (int d = 0; d < hd; d++) acc[d] *= r;
            mx = cmx;
        }
        for (int j = 0; j < len; j++) {
            const float e = expf(sc[j] - mx);
            sum += e;
            const float *v = vr + j * stride;
            for (int d = 0; d < hd; d++) acc[d] += e * v[d];
        }
        p0 += len;
    }
    const float inv = 1.0f / sum;
    for (int d = 0; d < hd; d++) o[d] = acc[d] * inv;
}

void kern_cpu_attention(float *out, const float *q, const struct kv_layer_view *kv, const int32_t *seq,
                        const int32_t *pos, int m, int n_heads, float scale, struct tpool *tp)
{
    if (kv->head_dim > ATT_MAX_HEAD_DIM) {
        kern_cpu_attention_ref(out, q, kv, seq, pos, m, n_heads, scale);
        return;
    }
    struct att_ctx c = {.out = out, .q = q, .kv = kv, .seq = seq, .pos = pos, .n_heads = n_heads, .scale = scale};
    tpool_run(tp, att_task, &c, m * n_heads);
}

void kern_cpu_attention_ref(float *out, const float *q, const struct kv_layer_view *kv, const int32_t *seq,
                            const int32_t *pos, int m, int n_heads, float scale)
{
    const int hd = kv->head_dim, group = n_heads / kv->n_kv_heads;
    int max_pos = 0;
    for (int t = 0; t < m; t++)
        if (pos[t] > max_pos) max_pos = pos[t];
    double *s = malloc(sizeof(double) * ((size_t)max_pos + 1 + hd));
    if (!s) return; /* reference only: used by tests */
    double *acc = s + max_pos + 1;
    for (int t = 0; t < m; t++)
        for (int h = 0; h < n_heads; h++) {
            const float *qh = q + ((size_t)t * n_heads + h) * hd;
            double mx = -INFINITY, sum = 0;
            for (int p = 0; p <= pos[t]; p++) {
                const float *kr = kv_row(kv, kv->k, seq[t], p, h / group);
                double d = 0;
                for (int i = 0; i < hd; i++) d += (double)qh[i] * kr[i];
                s[p] = d * scale;
                if (s[p] > mx) mx = s[p];
            }
            for (int i = 0; i < hd; i++) acc[i] = 0;
            for (int p = 0; p <= pos[t]; p++) {
                const double e = exp(s[p] - mx);
                sum += e;
                const float *vr = kv_row(kv, kv->v, seq[t], p, h / group);
                for (int i = 0; i < hd; i++) acc[i] += e * vr[i];
            }
            for (int i = 0; i < hd; i++) out[((size_t)t * n_heads + h) * hd + i] = (float)(acc[i] / sum);
        }
    free(s);
}
