/* attention — causal GQA attention over the paged KV cache, f32 or f16 (see attention.h for the layout).
 *
 * kern_cpu_attention runs one task per (token, KV head) — all query heads of the group together, so each
 * K/V row is read once — or per (token, query head) when there are too few of those to keep the pool busy.
 * Tasks are split over the pool statically; each output row is computed by one thread in a fixed order, the
 * same whatever the grouping: deterministic and independent of the pool size. A token whose context is longer
 * than ATT_PART positions is cut into parts of ATT_PART (a function of its own position only, so results do
 * not depend on the batch or the pool either): each part is a task producing an unnormalised online-softmax
 * state, and the parts are merged in order afterwards (flash-decoding), so that one long sequence keeps both
 * threads busy while each K/V row is read once per KV head.
 * A task walks the token's sequence block by block; within a block it scores up to ATT_CHUNK positions,
 * then folds them into a running (max, sum, accumulator) per head — the online softmax — rescaling the
 * accumulator only when the maximum grows. Positions are visited in increasing order.
 * The reference computes all scores in double, takes the max, exponentiates and normalises (two passes).
 * An f16 cache is read through the same code: each element is widened to f32 as it is loaded (F16C where the
 * build has it), so the arithmetic, and its order, are those of the f32 cache on the rounded values.
 */
#include "kernels/cpu/attention.h"

#include "kernels/core/status.h"

#include <math.h>
#if defined(__AVX__)
#include <immintrin.h>
#endif
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/threadpool.h"
#include "quant/fp16.h"
#include "kernels/cpu/vexp.h"

/* Vector-passing static helpers are never called across an ABI boundary. */
#pragma GCC diagnostic ignored "-Wpsabi"

#define ATT_CHUNK          32         /* positions scored at a time */
#define ATT_MAX_GROUP      16         /* query heads one task may take */
#define ATT_MAX_ACC        2048       /* floats of accumulators in one task: heads * head_dim */
#define ATT_PREFETCH_BYTES (256u << 10) /* K+V of a sequence's layer beyond which rows are prefetched */
#define ATT_PART           256        /* positions per part of a long context (parallel, merged after) */
#define ATT_STATE_FLOATS   (1u << 20) /* budget of partial states per pass over the batch (4 MiB) */

/* The element index of (seq, pos, KV head kvh)'s row in a layer's K or V. */
static inline size_t kv_row(const struct kv_layer_view *kv, int seq, int pos, int kvh)
{
    const int32_t blk = kv->block_table[(size_t)seq * kv->max_blocks + pos / kv->block_size];
    const size_t row = (size_t)(blk - kv->block_base) * kv->block_size + pos % kv->block_size;
    return (row * kv->n_kv_heads + kvh) * kv->head_dim;
}

/* Elements i..i+7 (ld8) or i (ld1) of a K/V array as f32; f16 is a constant wherever these are inlined. */
static inline v8f ld8(const void *base, size_t i, const int f16)
{
    if (!f16) return *(const v8fu *)((const float *)base + i);
    const uint16_t *h = (const uint16_t *)base + i;
#if defined(__F16C__)
    return (v8f)_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)h));
#else
    v8f r;
    for (int l = 0; l < 8; l++) r[l] = f16_to_f32(h[l]);
    return r;
#endif
}

static inline float ld1(const void *base, size_t i, const int f16)
{
    return f16 ? f16_to_f32(((const uint16_t *)base)[i]) : ((const float *)base)[i];
}

static inline const void *kv_at(const void *base, size_t i, int f16)
{
    return (const char *)base + i * (f16 ? 2 : 4);
}

void kern_cpu_kv_store(const struct kv_layer_view *kv, const float *k_new, const float *v_new,
                       const int32_t *seq, const int32_t *pos, int m)
{
    const size_t w = (size_t)kv->n_kv_heads * kv->head_dim;
    for (int i = 0; i < m; i++) {
        const size_t at = kv_row(kv, seq[i], pos[i], 0);
        if (kv->f16) { /* f32_to_f16 rounds to nearest even: the same bits with or without F16C */
            uint16_t *kd = (uint16_t *)kv->k + at, *vd = (uint16_t *)kv->v + at;
            for (size_t e = 0; e < w; e++) {
                kd[e] = f32_to_f16(k_new[i * w + e]);
                vd[e] = f32_to_f16(v_new[i * w + e]);
            }
        } else {
            memcpy((float *)kv->k + at, k_new + i * w, w * sizeof(float));
            memcpy((float *)kv->v + at, v_new + i * w, w * sizeof(float));
        }
    }
}

struct att_ctx {
    float *out;
    const float *q;
    const struct kv_layer_view *kv;
    const int32_t *seq, *lo, *pos; /* lo NULL: every row from position 0 */
    float *lse;                    /* (m, n_heads) log-sum-exp of the scores, or NULL */
    int n_heads;
    int group; /* query heads per KV head */
    int split; /* tasks per (token, KV head, part): each takes group/split query heads */
    float scale;
    /* Long contexts are cut into parts of ATT_PART positions, run as separate tasks (partial online-softmax
     * states in `state`) and merged afterwards. Tokens [t0, t1) are in this pass; task_base[t - t0] is the
     * first task of token t (and [t1 - t0] the total), part_base[t - t0] its first part in `state`. */
    int t0, t1;
    const int *task_base, *part_base;
    float *state; /* (parts, n_heads, head_dim + 2): max, sum, accumulator */
};

/* Parts of ATT_PART positions that [lo, pos] touches, cut at multiples of ATT_PART (one, empty, when lo >
 * pos); part k starts at att_part_lo(lo, k). */
static inline int att_parts(int lo, int pos)
{
    return lo > pos ? 1 : pos / ATT_PART - lo / ATT_PART + 1;
}

static inline int att_part_lo(int lo, int k)
{
    return k == 0 ? lo : (lo / ATT_PART + k) * ATT_PART;
}

/* Row t's first position (lo NULL or negative: 0). */
static inline int lo_of(const int32_t *lo, int t)
{
    return lo && lo[t] > 0 ? lo[t] : 0;
}

/* q·(K/V elements b..b+d-1). */
static inline __attribute__((always_inline)) float dot(const float *a, const void *kb, size_t b, int d,
                                                       const int f16)
{
    v8f acc = {0};
    int i = 0;
    for (; i + 8 <= d; i += 8) acc += *(const v8fu *)(a + i) * ld8(kb, b + i, f16);
    float s = ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]));
    for (; i < d; i++) s += a[i] * ld1(kb, b + i, f16);
    return s;
}

/* Eight dot products q·k_r (r < 8; row r's elements start at kb[k + r kstride]) with eight independent
 * accumulators (one FMA chain each would leave the FMA units idle on latency); d a multiple of 8. Fixed
 * reduction order. */
static inline __attribute__((always_inline)) void dot8(float *out, const float *q, const void *kb, size_t k,
                                                       size_t kstride, int d, const int f16)
{
    v8f a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0}, a4 = {0}, a5 = {0}, a6 = {0}, a7 = {0};
    for (int i = 0; i < d; i += 8) {
        const v8f qv = *(const v8fu *)(q + i);
        a0 += qv * ld8(kb, k + i, f16);
        a1 += qv * ld8(kb, k + kstride + i, f16);
        a2 += qv * ld8(kb, k + 2 * kstride + i, f16);
        a3 += qv * ld8(kb, k + 3 * kstride + i, f16);
        a4 += qv * ld8(kb, k + 4 * kstride + i, f16);
        a5 += qv * ld8(kb, k + 5 * kstride + i, f16);
        a6 += qv * ld8(kb, k + 6 * kstride + i, f16);
        a7 += qv * ld8(kb, k + 7 * kstride + i, f16);
    }
#if defined(__AVX__)
    const __m256 t0 = _mm256_hadd_ps((__m256)a0, (__m256)a1), t1 = _mm256_hadd_ps((__m256)a2, (__m256)a3);
    const __m256 t2 = _mm256_hadd_ps((__m256)a4, (__m256)a5), t3 = _mm256_hadd_ps((__m256)a6, (__m256)a7);
    const __m256 u0 = _mm256_hadd_ps(t0, t1), u1 = _mm256_hadd_ps(t2, t3);
    _mm256_storeu_ps(out, _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31)));
#else
    const v8f a[8] = {a0, a1, a2, a3, a4, a5, a6, a7};
    for (int r = 0; r < 8; r++) {
        const v8f v = a[r];
        out[r] = ((v[0] + v[1]) + (v[2] + v[3])) + ((v[4] + v[5]) + (v[6] + v[7]));
    }
#endif
}

/* acc (64) += Σ_j e[j] * v_j (64) for j < len, row j's elements from vb[v + j vstride]: the 64 accumulators
 * stay in registers over the whole chunk (8 independent FMA chains). */
static inline __attribute__((always_inline)) void pv64(float *acc, const float *e, const void *vb, size_t v,
                                                       size_t vstride, int len, const int f16)
{
    v8f a0 = *(v8fu *)acc, a1 = *(v8fu *)(acc + 8), a2 = *(v8fu *)(acc + 16), a3 = *(v8fu *)(acc + 24);
    v8f a4 = *(v8fu *)(acc + 32), a5 = *(v8fu *)(acc + 40), a6 = *(v8fu *)(acc + 48), a7 = *(v8fu *)(acc + 56);
    for (int j = 0; j < len; j++) {
        const size_t r = v + j * vstride;
        const float w = e[j];
        a0 += w * ld8(vb, r, f16), a1 += w * ld8(vb, r + 8, f16);
        a2 += w * ld8(vb, r + 16, f16), a3 += w * ld8(vb, r + 24, f16);
        a4 += w * ld8(vb, r + 32, f16), a5 += w * ld8(vb, r + 40, f16);
        a6 += w * ld8(vb, r + 48, f16), a7 += w * ld8(vb, r + 56, f16);
    }
    *(v8fu *)acc = a0, *(v8fu *)(acc + 8) = a1, *(v8fu *)(acc + 16) = a2, *(v8fu *)(acc + 24) = a3;
    *(v8fu *)(acc + 32) = a4, *(v8fu *)(acc + 40) = a5, *(v8fu *)(acc + 48) = a6, *(v8fu *)(acc + 56) = a7;
}

/* Query heads [h0, h1) of token t, all reading KV head kvh: each K/V row is loaded once for all of them.
 * Instantiated for each element type (f16 a constant). */
static inline __attribute__((always_inline)) void att_heads_t(const struct att_ctx *c, int t, int kvh, int h0,
                                                              int h1, int p_lo, int p_hi, float *state,
                                                              const int f16)
{
    const struct kv_layer_view *kv = c->kv;
    const int hd = kv->head_dim, nh = h1 - h0;
    const float *q = c->q + ((size_t)t * c->n_heads + h0) * hd;
    float *o = c->out + ((size_t)t * c->n_heads + h0) * hd;
    const int seq = c->seq[t], last = c->pos[t];
    const size_t stride = (size_t)kv->n_kv_heads * hd;
    const int es = f16 ? 2 : 4, line = 64 / es; /* bytes per element, elements per cache line */
    const int prefetch = (size_t)(last + 1) * stride * 2 * es > ATT_PREFETCH_BYTES;
    float acc[ATT_MAX_ACC];
    float sc[ATT_MAX_GROUP][ATT_CHUNK];
    float mx[ATT_MAX_GROUP], sum[ATT_MAX_GROUP];
    for (int g = 0; g < nh; g++) mx[g] = -INFINITY, sum[g] = 0.0f;
    for (int d = 0; d < nh * hd; d++) acc[d] = 0.0f;

    for (int p0 = p_lo; p0 < p_hi;) {
        /* A chunk never crosses a block boundary: its rows are contiguous in the cache. */
        int len = kv->block_size - p0 % kv->block_size;
        if (len > ATT_CHUNK) len = ATT_CHUNK;
        if (len > p_hi - p0) len = p_hi - p0;
        const size_t kr = kv_row(kv, seq, p0, kvh), vr = kr; /* K and V share the layout */
        /* Rows of one KV head are n_kv_heads*head_dim floats apart (often a whole page), which hardware
         * prefetchers do not follow: when the sequence's cache is too big to stay in cache, ask for this
         * chunk's V rows and the next chunk's K rows now (2-3x faster from DRAM; slower when cached). */
        const int p1 = p0 + len;
        const int has_next = p1 < p_hi;
        const size_t kn = has_next ? kv_row(kv, seq, p1, kvh) : 0;
        int len_n = kv->block_size - p1 % kv->block_size;
        if (len_n > ATT_CHUNK) len_n = ATT_CHUNK;
        if (len_n > p_hi - p1) len_n = p_hi - p1;
        if (prefetch) {
            for (int j = 0; j < len; j++)
                for (int d = 0; d < hd; d += line) __builtin_prefetch(kv_at(kv->v, vr + j * stride + d, f16));
            if (has_next)
                for (int j = 0; j < len_n; j++)
                    for (int d = 0; d < hd; d += line) __builtin_prefetch(kv_at(kv->k, kn + j * stride + d, f16));
        }
        {
            int j = 0;
            if (hd % 8 == 0)
                for (; j + 8 <= len; j += 8)
                    for (int g = 0; g < nh; g++) {
                        dot8(&sc[g][j], q + (size_t)g * hd, kv->k, kr + j * stride, stride, hd, f16);
                        for (int r = 0; r < 8; r++) sc[g][j + r] *= c->scale;
                    }
            for (; j < len; j++)
                for (int g = 0; g < nh; g++)
                    sc[g][j] = dot(q + (size_t)g * hd, kv->k, kr + j * stride, hd, f16) * c->scale;
        }
        for (int g = 0; g < nh; g++) {
            float cmx = -INFINITY;
            for (int j = 0; j < len; j++) cmx = sc[g][j] > cmx ? sc[g][j] : cmx;
            if (cmx > mx[g]) {
                const float r = expf(mx[g] - cmx); /* 0 on the first chunk */
                sum[g] *= r;
                for (int d = 0; d < hd; d++) acc[g * hd + d] *= r;
                mx[g] = cmx;
            }
            int j = 0;
            for (; j + 8 <= len; j += 8) *(v8fu *)&sc[g][j] = v8_exp(*(v8fu *)&sc[g][j] - mx[g]);
            for (; j < len; j++) sc[g][j] = expf(sc[g][j] - mx[g]);
            for (j = 0; j < len; j++) sum[g] += sc[g][j];
        }
        if (hd % 64 == 0) {
            for (int g = 0; g < nh; g++)
                for (int d0 = 0; d0 < hd; d0 += 64)
                    pv64(acc + g * hd + d0, sc[g], kv->v, vr + d0, stride, len, f16);
        } else
        for (int j = 0; j < len; j++) {
            const size_t v = vr + j * stride;
            for (int g = 0; g < nh; g++) {
                const float e = sc[g][j];
                float *a = acc + g * hd;
                for (int d = 0; d < hd; d++) a[d] += e * ld1(kv->v, v + d, f16);
            }
        }
        p0 += len;
    }
    if (state) { /* one part of several: keep the unnormalised state for att_merge */
        for (int g = 0; g < nh; g++) {
            float *st = state + (size_t)g * (hd + 2);
            st[0] = mx[g];
            st[1] = sum[g];
            memcpy(st + 2, acc + g * hd, sizeof(float) * (size_t)hd);
        }
        return;
    }
    for (int g = 0; g < nh; g++) {
        const float inv = sum[g] > 0.0f ? 1.0f / sum[g] : 0.0f; /* 0: an empty range */
        for (int d = 0; d < hd; d++) o[(size_t)g * hd + d] = acc[g * hd + d] * inv;
        if (c->lse)
            c->lse[(size_t)t * c->n_heads + h0 + g] = sum[g] > 0.0f ? mx[g] + logf(sum[g]) : -INFINITY;
    }
}

static void att_heads(const struct att_ctx *c, int t, int kvh, int h0, int h1, int p_lo, int p_hi, float *state)
{
    if (c->kv->f16)
        att_heads_t(c, t, kvh, h0, h1, p_lo, p_hi, state, 1);
    else
        att_heads_t(c, t, kvh, h0, h1, p_lo, p_hi, state, 0);
}

/* out of token t, all heads, from its n_parts partial states, combined in part order. */
static void att_merge(const struct att_ctx *c, int t, const float *state, int n_parts)
{
    const int hd = c->kv->head_dim;
    for (int h = 0; h < c->n_heads; h++) {
        float *o = c->out + ((size_t)t * c->n_heads + h) * hd;
        float mxx = -INFINITY;
        for (int p = 0; p < n_parts; p++) {
            const float m = state[((size_t)p * c->n_heads + h) * (hd + 2)];
            mxx = m > mxx ? m : mxx;
        }
        float sum = 0.0f;
        for (int d = 0; d < hd; d++) o[d] = 0.0f;
        for (int p = 0; p < n_parts; p++) {
            const float *st = state + ((size_t)p * c->n_heads + h) * (hd + 2);
            const float r = expf(st[0] - mxx);
            sum += st[1] * r;
            for (int d = 0; d < hd; d++) o[d] += st[2 + d] * r;
        }
        const float inv = 1.0f / sum;
        for (int d = 0; d < hd; d++) o[d] *= inv;
        if (c->lse) c->lse[(size_t)t * c->n_heads + h] = mxx + logf(sum);
    }
}

static void att_task(void *arg, int task)
{
    const struct att_ctx *c = arg;
    /* The token: the last window index whose first task is <= task (binary search). */
    int lo = 0, hi = c->t1 - c->t0 - 1;
    while (lo < hi) {
        const int mid = (lo + hi + 1) / 2;
        if (c->task_base[mid] <= task)
            lo = mid;
        else
            hi = mid - 1;
    }
    const int t = c->t0 + lo, n_kv = c->kv->n_kv_heads, per = c->group / c->split;
    const int r = task - c->task_base[lo], part = r / (n_kv * c->split), rr = r % (n_kv * c->split);
    const int kvh = rr / c->split, s = rr % c->split;
    const int h0 = kvh * c->group + s * per;
    const int lo_t = lo_of(c->lo, t), n_parts = att_parts(lo_t, c->pos[t]);
    const int p_lo = att_part_lo(lo_t, part);
    const int p_hi = part + 1 < n_parts ? att_part_lo(lo_t, part + 1) : c->pos[t] + 1;
    float *state = n_parts > 1 ? c->state + ((size_t)(c->part_base[lo] + part) * c->n_heads + h0) *
                                                (c->kv->head_dim + 2)
                               : NULL;
    att_heads(c, t, kvh, h0, h0 + per, p_lo, p_hi, state);
}

int kern_cpu_attention(float *out, const float *q, const struct kv_layer_view *kv, const int32_t *seq,
                        const int32_t *pos, int m, int n_heads, float scale, struct tpool *tp)
{
    if (kv->head_dim > ATT_MAX_ACC) { /* no such model; correct but slow */
        if (m > 0) kern_cpu_attention_ref(out, q, kv, seq, pos, m, n_heads, scale);
        return FERRY_OK;
    }
    return kern_cpu_attention_range(out, NULL, q, kv, seq, NULL, pos, m, n_heads, scale, tp);
}

int kern_cpu_attention_range(float *out, float *lse, const float *q, const struct kv_layer_view *kv,
                             const int32_t *seq, const int32_t *lo, const int32_t *pos, int m, int n_heads,
                             float scale, struct tpool *tp)
{
    const int group = n_heads / kv->n_kv_heads, hd = kv->head_dim;
    if (hd > ATT_MAX_ACC) return FERRY_ERR_UNSUPPORTED;
    if (m <= 0) return FERRY_OK;
    /* Tiny steps (a small model's decode token) are not worth waking the pool for. */
    int64_t work = 0;
    for (int t = 0; t < m; t++) {
        const int l = lo_of(lo, t);
        if (pos[t] >= l) work += (int64_t)(pos[t] - l + 1) * n_heads * hd;
    }
    if (work < 32 * 1024) tp = NULL;
    /* Tokens are taken in windows whose partial states fit ATT_STATE_FLOATS (a token alone may exceed it). */
    const size_t per_part = (size_t)n_heads * (hd + 2);
    int *base = malloc(sizeof(int) * 2 * ((size_t)m + 1));
    float *state = NULL;
    size_t state_cap = 0;
    for (int t0 = 0; t0 < m;) {
        int t1 = t0;
        int64_t parts = 0, multi = 0; /* all parts; parts of tokens with more than one */
        while (t1 < m) {
            const int np = att_parts(lo_of(lo, t1), pos[t1]);
            if (t1 > t0 && (size_t)(multi + (np > 1 ? np : 0)) * per_part > ATT_STATE_FLOATS) break;
            parts += np;
            multi += np > 1 ? np : 0;
            t1++;
        }
        if (multi && (size_t)multi * per_part > state_cap) {
            free(state);
            state_cap = (size_t)multi * per_part;
            state = malloc(sizeof(float) * state_cap);
        }
        if (!base || (multi && !state)) { /* the reference would give other numbers: report it instead */
            free(base);
            free(state);
            return FERRY_ERR_NOMEM;
        }
        /* One task per (token, part, KV head) reads each K/V row once for the whole group; when that leaves
         * fewer than two tasks per thread, or the group's accumulators do not fit, groups are split into one
         * task per head. The arithmetic of a head is the same either way. */
        int split = 1;
        if (parts * kv->n_kv_heads < 2 * (int64_t)tpool_size(tp) || group > ATT_MAX_GROUP ||
            group * hd > ATT_MAX_ACC)
            split = group;
        int *task_base = base, *part_base = base + (m + 1);
        int nt = 0, np = 0;
        for (int t = t0; t < t1; t++) {
            task_base[t - t0] = nt;
            part_base[t - t0] = np;
            const int n = att_parts(lo_of(lo, t), pos[t]);
            nt += n * kv->n_kv_heads * split;
            np += n > 1 ? n : 0;
        }
        task_base[t1 - t0] = nt;
        struct att_ctx c = {.out = out,
                            .q = q,
                            .kv = kv,
                            .seq = seq,
                            .lo = lo,
                            .pos = pos,
                            .lse = lse,
                            .n_heads = n_heads,
                            .group = group,
                            .split = split,
                            .scale = scale,
                            .t0 = t0,
                            .t1 = t1,
                            .task_base = task_base,
                            .part_base = part_base,
                            .state = state};
        tpool_run(tp, att_task, &c, nt);
        for (int t = t0; t < t1; t++) {
            const int n = att_parts(lo_of(lo, t), pos[t]);
            if (n > 1) att_merge(&c, t, state + (size_t)part_base[t - t0] * per_part, n);
        }
        t0 = t1;
    }
    free(base);
    free(state);
    return FERRY_OK;
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
                const size_t kr = kv_row(kv, seq[t], p, h / group);
                double d = 0;
                for (int i = 0; i < hd; i++) d += (double)qh[i] * ld1(kv->k, kr + i, kv->f16);
                s[p] = d * scale;
                if (s[p] > mx) mx = s[p];
            }
            for (int i = 0; i < hd; i++) acc[i] = 0;
            for (int p = 0; p <= pos[t]; p++) {
                const double e = exp(s[p] - mx);
                sum += e;
                const size_t vr = kv_row(kv, seq[t], p, h / group);
                for (int i = 0; i < hd; i++) acc[i] += e * ld1(kv->v, vr + i, kv->f16);
            }
            for (int i = 0; i < hd; i++) out[((size_t)t * n_heads + h) * hd + i] = (float)(acc[i] / sum);
        }
    free(s);
}
