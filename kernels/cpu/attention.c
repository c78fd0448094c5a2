/* attention — causal GQA attention over the paged KV cache, f32, f16 or Q8_0, the last in blocks or split
 * into planes of codes and scales as the GPU's cache holds it (see attention.h for the layouts).
 *
 * kern_cpu_attention runs one task per (tile, run of KV heads) — all query heads of their groups together, so
 * each K/V row is read once, and a position's rows of the run are adjacent in memory — or per (tile, query
 * head) when there are too few of those to keep the pool busy; runs are as long as 4 tasks per thread allow.
 * A tile is one token, or a run of up to ATT_ROWS consecutive tokens of one sequence (a prefill chunk's
 * rows): each chunk of K/V rows is then read from memory once for all of them, not once per row. Tasks are
 * split over the pool statically; each output row is computed by one thread in a fixed order, the same
 * whatever the grouping: deterministic and independent of the pool size. A token whose context is longer than
 * ATT_PART positions is cut into parts of ATT_PART (a function of its own position only, so results do not
 * depend on the batch or the pool either): each part is a task producing an unnormalised online-softmax
 * state, and the parts are merged in order afterwards (flash-decoding), so that one long sequence keeps both
 * threads busy while each K/V row is read once per KV head.
 * A task walks the token's sequence block by block; within a block it scores up to ATT_CHUNK positions,
 * then folds them into a running (max, sum, accumulator) per head — the online softmax — rescaling the
 * accumulator only when the maximum grows. Positions are visited in increasing order.
 * The reference computes all scores in double, takes the max, exponentiates and normalises (two passes).
 * An f16 or Q8_0 cache is read through the same walk: each element is widened to f32 as it is loaded (F16C
 * where the build has it; for Q8_0 the codes, with the block's scale applied once per block), and the
 * arithmetic is f32. With AVX-512 the f16 and Q8_0 products run 16 lanes wide (attention_kv.h), so their
 * rounding differs from the f32 cache's 8-lane order; every path stays within the tests' bound of the double
 * reference. The two Q8_0 layouts differ only in where a block's codes and scale are (q8_blk): the same codes
 * and scales give bitwise the same results in either.
 */
#include "kernels/cpu/attention.h"

#include "kernels/core/status.h"

#include <math.h>
/* _mm_getcsr / _mm_setcsr (FTZ, DAZ) in every x86-64 build; AVX, F16C and AVX-512 where the build has them.
 */
#if defined(__SSE__)
#include <immintrin.h>
#endif
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/threadpool.h"
#include "quant/blocks.h"
#include "quant/dtype.h"
#include "quant/fp16.h"
#include "kernels/cpu/vexp.h"

/* Vector-passing static helpers are never called across an ABI boundary. */
#pragma GCC diagnostic ignored "-Wpsabi"

#define ATT_CHUNK          32           /* positions scored at a time */
#define ATT_MAX_GROUP      16           /* query heads one task may take */
#define ATT_MAX_ACC        2048         /* floats of accumulators of one row in a task: heads * head_dim */
#define ATT_ROWS           16           /* rows of one sequence (a prefill chunk's) one task may take */
#define ATT_TILE_ACC       8192         /* floats of accumulators in one task: rows * heads * head_dim */
#define ATT_PREFETCH_BYTES (256u << 10) /* K+V of a sequence's layer beyond which rows are prefetched */
#define ATT_PART           256          /* positions per part of a long context (parallel, merged after) */
#define ATT_STATE_FLOATS   (1u << 20)   /* budget of partial states per pass over the batch (4 MiB) */

/* The element index of (seq, pos, KV head kvh)'s row in a layer's K or V. */
static inline size_t kv_row(const struct kv_layer_view *kv, int seq, int pos, int kvh)
{
    const int32_t blk = kv->block_table[(size_t)seq * kv->max_blocks + pos / kv->block_size];
    const size_t row = (size_t)(blk - kv->block_base) * kv->block_size + pos % kv->block_size;
    return (row * kv->n_kv_heads + kvh) * kv->head_dim;
}

#include "kernels/cpu/attention_kv.h"

/* Quantizes x (n elements, n a multiple of 32) into the blocks KV_Q8_0 would store, a few at a time through
 * the stack, and writes their codes to codes + at and their scales to scales + at / 32. */
static void kv_store_planes(int8_t *codes, uint16_t *scales, size_t at, const float *x, size_t n)
{
    enum { NB = 8 };
    struct block_q8_0 blk[NB];
    for (size_t e = 0; e < n; e += NB * QK8_0) {
        const size_t nb = (n - e) / QK8_0 < NB ? (n - e) / QK8_0 : NB;
        dtype_from_f32(DTYPE_Q8_0, x + e, blk, (int64_t)(nb * QK8_0));
        for (size_t b = 0; b < nb; b++) {
            memcpy(codes + at + e + b * QK8_0, blk[b].qs, QK8_0);
            scales[(at + e) / QK8_0 + b] = blk[b].d;
        }
    }
}

void kern_cpu_kv_store(const struct kv_layer_view *kv, const float *k_new, const float *v_new,
                       const int32_t *seq, const int32_t *pos, int m)
{
    const size_t w = (size_t)kv->n_kv_heads * kv->head_dim;
    for (int i = 0; i < m; i++) {
        const size_t at = kv_row(kv, seq[i], pos[i], 0);
        if (kv->elem == KV_Q8_0) { /* ggml's reference quantizer: the bits llama.cpp's q8_0 cache holds */
            dtype_from_f32(DTYPE_Q8_0, k_new + i * w, (struct block_q8_0 *)kv->k + at / QK8_0, (int64_t)w);
            dtype_from_f32(DTYPE_Q8_0, v_new + i * w, (struct block_q8_0 *)kv->v + at / QK8_0, (int64_t)w);
        } else if (kv->elem == KV_Q8_0_PLANES) { /* the same blocks, split: the planes hold Q8_0's bits */
            kv_store_planes(kv->k, kv->k_scale, at, k_new + i * w, w);
            kv_store_planes(kv->v, kv->v_scale, at, v_new + i * w, w);
        } else if (kv->elem ==
                   KV_F16) { /* f32_to_f16 rounds to nearest even: the same bits with or without F16C */
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
    int kvt;   /* split 1: KV heads per task (the last task of a tile's part may take fewer) */
    float scale;
    /* Long contexts are cut into parts of ATT_PART positions, run as separate tasks (partial online-softmax
     * states in `state`) and merged afterwards. Tokens [t0, t1) are in this pass, cut into n_tiles tiles
     * (runs of up to ATT_ROWS rows of one sequence with one first position): tile i holds rows
     * [tile_row[i], tile_row[i + 1]) and its tasks start at task_base[i] (task_base[n_tiles]: the total);
     * part_base[t - t0] is token t's first part in `state`. */
    int t0, t1, n_tiles;
    const int *tile_row, *task_base, *part_base;
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

/* Part `part` of rows [ta, ta + nr) — one sequence, one first position: a prefill chunk's run of rows, or one
 * row — for query heads [h0, h1), which read KV heads h0/group .. (h1-1)/group. Each chunk of K/V rows is
 * loaded once for all of them (from memory once, then from L1 for the other rows and heads), its KV heads one
 * after another: a position's rows of adjacent KV heads are adjacent in the cache, so a task of several KV
 * heads reads runs of memory that hardware prefetchers follow, where one KV head's rows are a page apart.
 * Every (row, head) takes the steps it would take alone, in the same order: the same chunks, clipped at its
 * own last position, and the same arithmetic, so a row's result does not depend on the rows beside it.
 * Instantiated for each element type (et a constant). */
static inline __attribute__((always_inline)) void att_rows_t(const struct att_ctx *c, int ta, int nr, int h0,
                                                             int h1, int part, const int et)
{
    const struct kv_layer_view *kv = c->kv;
    const int hd = kv->head_dim, nh = h1 - h0, seq = c->seq[ta];
    const size_t stride = (size_t)kv->n_kv_heads * hd;
    const int es = et == KV_F32 ? 4 : et == KV_F16 ? 2 : 1; /* bytes per element (Q8_0: about) */
    const int line = et == KV_Q8_0 ? 32 : 64 / es;          /* elements per prefetch */
    const struct kv_data kd = {kv->k, kv->k_scale}, vd = {kv->v, kv->v_scale};
    float acc[ATT_TILE_ACC];
    float sc[ATT_MAX_GROUP][ATT_CHUNK];
#if ATT_Z
    /* Q8_0: the chunk's K and V scales, (len, nb) f32, and a head's weights times V's scales, (lr, nb). */
    float ksc[ATT_CHUNK * (ATT_MAX_ACC / QK8_0)], vsc[ATT_CHUNK * (ATT_MAX_ACC / QK8_0)];
    float wq[ATT_CHUNK * (ATT_MAX_ACC / QK8_0)];
    const int nb = hd / QK8_0; /* Q8_0 blocks per row */
#endif
    float mx[ATT_ROWS][ATT_MAX_GROUP], sum[ATT_ROWS][ATT_MAX_GROUP];
    int p_hi[ATT_ROWS], n_parts[ATT_ROWS];
    /* The rows share their first position, so part `part` starts at the same position for all of them. */
    const int p_lo = att_part_lo(lo_of(c->lo, ta), part);
    int p_end = p_lo, last = 0;
    for (int r = 0; r < nr; r++) {
        const int t = ta + r, lo_t = lo_of(c->lo, t);
        n_parts[r] = att_parts(lo_t, c->pos[t]);
        p_hi[r] = part >= n_parts[r]      ? p_lo /* past its last part: nothing to do */
                  : part + 1 < n_parts[r] ? att_part_lo(lo_t, part + 1)
                                          : c->pos[t] + 1;
        p_end = p_hi[r] > p_end ? p_hi[r] : p_end;
        last = c->pos[t] > last ? c->pos[t] : last;
        for (int g = 0; g < nh; g++) mx[r][g] = -INFINITY, sum[r][g] = 0.0f;
    }
    for (int d = 0; d < nr * nh * hd; d++) acc[d] = 0.0f;
    const int prefetch = (size_t)(last + 1) * stride * 2 * es > ATT_PREFETCH_BYTES;

    for (int p0 = p_lo; p0 < p_end;) {
        /* A chunk never crosses a block boundary: its rows are contiguous in the cache. */
        int len = kv->block_size - p0 % kv->block_size;
        if (len > ATT_CHUNK) len = ATT_CHUNK;
        if (len > p_end - p0) len = p_end - p0;
        const int p1 = p0 + len;
        for (int kvh = h0 / c->group; kvh * c->group < h1; kvh++) {
            /* The task's heads g0 <= g < g1 (counted from h0) read this KV head. */
            const int g0 = (kvh * c->group > h0 ? kvh * c->group : h0) - h0;
            const int g1 = ((kvh + 1) * c->group < h1 ? (kvh + 1) * c->group : h1) - h0;
            const size_t kr = kv_row(kv, seq, p0, kvh), vr = kr; /* K and V share the layout */
            /* Rows of one KV head are n_kv_heads*head_dim floats apart (often a whole page), which hardware
             * prefetchers do not follow: when the sequence's cache is too big to stay in cache, ask for this
             * chunk's V rows and the next chunk's K rows now (2-3x faster from DRAM; slower when cached). */
            if (prefetch) {
                for (int j = 0; j < len; j++) kv_prefetch(vd, vr + j * stride, hd, line, et);
                if (p1 < p_end) {
                    const size_t kn = kv_row(kv, seq, p1, kvh);
                    int len_n = kv->block_size - p1 % kv->block_size;
                    if (len_n > ATT_CHUNK) len_n = ATT_CHUNK;
                    if (len_n > p_end - p1) len_n = p_end - p1;
                    for (int j = 0; j < len_n; j++) kv_prefetch(kd, kn + j * stride, hd, line, et);
                }
            }
#if ATT_Z
            if (et == KV_Q8_0 || et == KV_Q8_0_PLANES) {
                q8_scales(ksc, kd, kr, stride, len, nb, et);
                q8_scales(vsc, vd, vr, stride, len, nb, et);
            }
#endif
            for (int r = 0; r < nr; r++) {
                if (p0 >= p_hi[r]) continue;
                /* The row's own chunk: the same as the tile's but clipped at its last position. */
                const int lr = p_hi[r] - p0 < len ? p_hi[r] - p0 : len;
                const float *q = c->q + ((size_t)(ta + r) * c->n_heads + h0) * hd;
                float *ra = acc + (size_t)r * nh * hd;
                int j = 0;
#if ATT_Z
                if (et != KV_F32 && hd % 16 == 0) { /* f32: the 8-lane code, its results as before */
                    for (; j + 8 <= lr; j += 8)
                        for (int g = g0; g < g1; g++) {
                            dot8z(&sc[g][j], q + (size_t)g * hd, kd, kr + j * stride, stride, hd,
                                  ksc + j * nb, nb, et);
                            for (int i = 0; i < 8; i++) sc[g][j + i] *= c->scale;
                        }
                    for (; j < lr; j++)
                        for (int g = g0; g < g1; g++)
                            sc[g][j] = dotz(q + (size_t)g * hd, kd, kr + j * stride, hd, ksc + j * nb, et) *
                                       c->scale;
                } /* j = lr now: the 8-lane loops below have nothing left */
#endif
                if (hd % 8 == 0)
                    for (; j + 8 <= lr; j += 8)
                        for (int g = g0; g < g1; g++) {
                            dot8(&sc[g][j], q + (size_t)g * hd, kd, kr + j * stride, stride, hd, et);
                            for (int i = 0; i < 8; i++) sc[g][j + i] *= c->scale;
                        }
                for (; j < lr; j++)
                    for (int g = g0; g < g1; g++)
                        sc[g][j] = dot(q + (size_t)g * hd, kd, kr + j * stride, hd, et) * c->scale;
                for (int g = g0; g < g1; g++) {
                    float cmx = -INFINITY;
                    for (j = 0; j < lr; j++) cmx = sc[g][j] > cmx ? sc[g][j] : cmx;
                    if (cmx > mx[r][g]) {
                        const float rs = expf(mx[r][g] - cmx); /* 0 on the first chunk */
                        sum[r][g] *= rs;
                        for (int d = 0; d < hd; d++) ra[g * hd + d] *= rs;
                        mx[r][g] = cmx;
                    }
                    for (j = 0; j + 8 <= lr; j += 8)
                        *(v8fu *)&sc[g][j] = v8_exp(*(v8fu *)&sc[g][j] - mx[r][g]);
                    for (; j < lr; j++) sc[g][j] = expf(sc[g][j] - mx[r][g]);
                    for (j = 0; j < lr; j++) sum[r][g] += sc[g][j];
                }
#if ATT_Z
                if (et != KV_F32 && hd % 32 == 0) {
                    for (int g = g0; g < g1; g++) {
                        if (et == KV_Q8_0 || et == KV_Q8_0_PLANES)
                            for (j = 0; j < lr; j++)
                                for (int b = 0; b < nb; b++) wq[j * nb + b] = sc[g][j] * vsc[j * nb + b];
                        float *a = ra + g * hd;
                        if (hd % 128 == 0)
                            for (int d0 = 0; d0 < hd; d0 += 128)
                                pvz(a + d0, sc[g], wq + d0 / QK8_0, nb, vd, vr + d0, stride, lr, 8, et);
                        else if (hd % 64 == 0)
                            for (int d0 = 0; d0 < hd; d0 += 64)
                                pvz(a + d0, sc[g], wq + d0 / QK8_0, nb, vd, vr + d0, stride, lr, 4, et);
                        else
                            for (int d0 = 0; d0 < hd; d0 += 32)
                                pvz(a + d0, sc[g], wq + d0 / QK8_0, nb, vd, vr + d0, stride, lr, 2, et);
                    }
                } else
#endif
                    if (hd % 64 == 0) {
                    for (int g = g0; g < g1; g++)
                        for (int d0 = 0; d0 < hd; d0 += 64)
                            pv64(ra + g * hd + d0, sc[g], vd, vr + d0, stride, lr, et);
                } else
                    for (j = 0; j < lr; j++) {
                        const size_t v = vr + j * stride;
                        for (int g = g0; g < g1; g++) {
                            const float e = sc[g][j];
                            float *a = ra + g * hd;
                            for (int d = 0; d < hd; d++) a[d] += e * ld1(vd, v + d, et);
                        }
                    }
            }
        }
        p0 = p1;
    }
    for (int r = 0; r < nr; r++) {
        if (part >= n_parts[r]) continue;
        const int t = ta + r;
        const float *ra = acc + (size_t)r * nh * hd;
        if (n_parts[r] > 1) { /* one part of several: keep the unnormalised state for att_merge */
            float *st = c->state + ((size_t)(c->part_base[t - c->t0] + part) * c->n_heads + h0) * (hd + 2);
            for (int g = 0; g < nh; g++, st += hd + 2) {
                st[0] = mx[r][g];
                st[1] = sum[r][g];
                memcpy(st + 2, ra + g * hd, sizeof(float) * (size_t)hd);
            }
            continue;
        }
        float *o = c->out + ((size_t)t * c->n_heads + h0) * hd;
        for (int g = 0; g < nh; g++) {
            const float inv = sum[r][g] > 0.0f ? 1.0f / sum[r][g] : 0.0f; /* 0: an empty range */
            for (int d = 0; d < hd; d++) o[(size_t)g * hd + d] = ra[g * hd + d] * inv;
            if (c->lse)
                c->lse[(size_t)t * c->n_heads + h0 + g] =
                    sum[r][g] > 0.0f ? mx[r][g] + logf(sum[r][g]) : -INFINITY;
        }
    }
}

static void att_rows(const struct att_ctx *c, int ta, int nr, int h0, int h1, int part)
{
    if (c->kv->elem == KV_Q8_0)
        att_rows_t(c, ta, nr, h0, h1, part, KV_Q8_0);
    else if (c->kv->elem == KV_Q8_0_PLANES)
        att_rows_t(c, ta, nr, h0, h1, part, KV_Q8_0_PLANES);
    else if (c->kv->elem == KV_F16)
        att_rows_t(c, ta, nr, h0, h1, part, KV_F16);
    else
        att_rows_t(c, ta, nr, h0, h1, part, KV_F32);
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

/* Subnormals flushed (FTZ, DAZ) from att_ftz_begin to att_ftz_end (given what begin returned), around every
 * task and the merges of parts: a peaked softmax makes many of the weights, and of their products with a
 * Q8_0 block's scale, subnormal, and so is a part's weight e^(m - M) in the merge when its maximum is 87-104
 * below the row's; on Intel each operation with a subnormal operand or result takes a microcode assist (tens
 * to hundreds of cycles). What they would add is below 2^-126 against a softmax sum of at least 1. */
static inline unsigned att_ftz_begin(void)
{
#if defined(__SSE__)
    const unsigned csr = _mm_getcsr();
    _mm_setcsr(csr | 0x8040);
    return csr;
#else
    return 0;
#endif
}

static inline void att_ftz_end(unsigned csr)
{
#if defined(__SSE__)
    _mm_setcsr(csr);
#else
    (void)csr;
#endif
}

static void att_task(void *arg, int task)
{
    const struct att_ctx *c = arg;
    /* The tile: the last one whose first task is <= task (binary search). */
    int lo = 0, hi = c->n_tiles - 1;
    while (lo < hi) {
        const int mid = (lo + hi + 1) / 2;
        if (c->task_base[mid] <= task)
            lo = mid;
        else
            hi = mid - 1;
    }
    const int n_kvt = (c->kv->n_kv_heads + c->kvt - 1) / c->kvt, per = c->group / c->split;
    const int r = task - c->task_base[lo], part = r / (n_kvt * c->split), rr = r % (n_kvt * c->split);
    const int kt = rr / c->split, s = rr % c->split;
    const int h0 = kt * c->kvt * c->group + s * per;
    const int h1 =
        c->split > 1 ? h0 + per : (h0 + c->kvt * c->group < c->n_heads ? h0 + c->kvt * c->group : c->n_heads);
    const unsigned csr = att_ftz_begin();
    att_rows(c, c->tile_row[lo], c->tile_row[lo + 1] - c->tile_row[lo], h0, h1, part);
    att_ftz_end(csr);
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
    int *base = malloc(sizeof(int) * 4 * ((size_t)m + 1));
    float *state = NULL;
    size_t state_cap = 0;
    for (int t0 = 0; t0 < m;) {
        int t1 = t0;
        int64_t multi = 0; /* parts of tokens with more than one */
        while (t1 < m) {
            const int np = att_parts(lo_of(lo, t1), pos[t1]);
            if (t1 > t0 && (size_t)(multi + (np > 1 ? np : 0)) * per_part > ATT_STATE_FLOATS) break;
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
        int *tile_row = base, *task_base = base + (m + 1), *part_base = base + 2 * (m + 1);
        int np = 0;
        for (int t = t0; t < t1; t++) {
            part_base[t - t0] = np;
            const int n = att_parts(lo_of(lo, t), pos[t]);
            np += n > 1 ? n : 0;
        }
        /* One task per (tile, part, KV head) reads each K/V chunk once for the whole group and the tile's
         * rows; when that leaves fewer than two tasks per thread, or the group's accumulators do not fit,
         * groups are split into one task per head. The arithmetic of a (row, head) is the same either way. */
        int split = 1, n_tiles = 0;
        for (int pass = 0; pass < 2; pass++) {
            const int per = group / split;
            int rows = ATT_TILE_ACC / (per * hd);
            rows = rows < 1 ? 1 : rows > ATT_ROWS ? ATT_ROWS : rows;
            int64_t tasks = 0;
            n_tiles = 0;
            for (int t = t0; t < t1;) {
                int e = t + 1, n = att_parts(lo_of(lo, t), pos[t]);
                while (e < t1 && e - t < rows && seq[e] == seq[t] && lo_of(lo, e) == lo_of(lo, t)) {
                    const int ne = att_parts(lo_of(lo, e), pos[e]);
                    n = ne > n ? ne : n;
                    e++;
                }
                tile_row[n_tiles] = t;
                task_base[n_tiles++] = (int)tasks;
                tasks += (int64_t)n * kv->n_kv_heads * split;
                t = e;
            }
            tile_row[n_tiles] = t1;
            task_base[n_tiles] = (int)tasks;
            if (split > 1 ||
                (tasks >= 2 * (int64_t)tpool_size(tp) && group <= ATT_MAX_GROUP && group * hd <= ATT_MAX_ACC))
                break;
            split = group;
        }
        /* Whole groups: several KV heads per task (each position's rows of them are adjacent in memory: runs
         * that hardware prefetchers follow) while at least 4 tasks per thread remain and the accumulators of
         * the tallest tile fit. The arithmetic of a (row, head) is again the same. */
        int kvt = 1;
        if (split == 1) {
            const int n_kv = kv->n_kv_heads;
            int max_rows = 1;
            for (int i = 0; i < n_tiles; i++)
                max_rows =
                    tile_row[i + 1] - tile_row[i] > max_rows ? tile_row[i + 1] - tile_row[i] : max_rows;
            const int64_t units = task_base[n_tiles] / n_kv; /* (tile, part) pairs */
            for (int k = 2 * kvt;
                 k <= n_kv && k * group <= ATT_MAX_GROUP && max_rows * k * group * hd <= ATT_TILE_ACC &&
                 units * ((n_kv + k - 1) / k) >= 4 * (int64_t)tpool_size(tp);
                 k *= 2)
                kvt = k;
            for (int i = 0; i <= n_tiles; i++) task_base[i] = task_base[i] / n_kv * ((n_kv + kvt - 1) / kvt);
        }
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
                            .kvt = kvt,
                            .scale = scale,
                            .t0 = t0,
                            .t1 = t1,
                            .n_tiles = n_tiles,
                            .tile_row = tile_row,
                            .task_base = task_base,
                            .part_base = part_base,
                            .state = state};
        tpool_run(tp, att_task, &c, task_base[n_tiles]);
        const unsigned csr = att_ftz_begin();
        for (int t = t0; t < t1; t++) {
            const int n = att_parts(lo_of(lo, t), pos[t]);
            if (n > 1) att_merge(&c, t, state + (size_t)part_base[t - t0] * per_part, n);
        }
        att_ftz_end(csr);
        t0 = t1;
    }
    free(base);
    free(state);
    return FERRY_OK;
}

void kern_cpu_attention_ref(float *out, const float *q, const struct kv_layer_view *kv, const int32_t *seq,
                            const int32_t *pos, int m, int n_heads, float scale)
{
    kern_cpu_attention_sinks_ref(out, q, kv, seq, NULL, pos, NULL, m, n_heads, scale);
}

/* ---- attention sinks ----------------------------------------------------------------------------------- */

void kern_cpu_attention_sinks(float *out, const float *lse, const float *sinks, int m, int n_heads,
                              int head_dim)
{
    for (int t = 0; t < m; t++)
        for (int h = 0; h < n_heads; h++) {
            /* Σ e^s / (Σ e^s + e^sink) = 1 / (1 + e^(sink - lse)); lse -inf (no position) gives 0. */
            const float l = lse[(size_t)t * n_heads + h];
            const float a = (float)(1.0 / (1.0 + exp((double)sinks[h] - (double)l)));
            float *o = out + ((size_t)t * n_heads + h) * head_dim;
            for (int i = 0; i < head_dim; i++) o[i] *= a;
        }
}

void kern_cpu_attention_sinks_ref(float *out, const float *q, const struct kv_layer_view *kv,
                                  const int32_t *seq, const int32_t *lo, const int32_t *pos,
                                  const float *sinks, int m, int n_heads, float scale)
{
    const int hd = kv->head_dim, group = n_heads / kv->n_kv_heads;
    const struct kv_data kd = {kv->k, kv->k_scale}, vd = {kv->v, kv->v_scale};
    int max_pos = 0;
    for (int t = 0; t < m; t++)
        if (pos[t] > max_pos) max_pos = pos[t];
    double *s = malloc(sizeof(double) * ((size_t)max_pos + 1 + hd));
    if (!s) return; /* reference only: used by tests */
    double *acc = s + max_pos + 1;
    for (int t = 0; t < m; t++)
        for (int h = 0; h < n_heads; h++) {
            const float *qh = q + ((size_t)t * n_heads + h) * hd;
            const int p0 = lo ? lo[t] : 0;
            double mx = sinks ? sinks[h] : -INFINITY, sum = 0;
            for (int p = p0; p <= pos[t]; p++) {
                const size_t kr = kv_row(kv, seq[t], p, h / group);
                double d = 0;
                for (int i = 0; i < hd; i++) d += (double)qh[i] * ld1(kd, kr + i, kv->elem);
                s[p] = d * scale;
                if (s[p] > mx) mx = s[p];
            }
            for (int i = 0; i < hd; i++) acc[i] = 0;
            if (sinks) sum = exp((double)sinks[h] - mx); /* the sink's share: in the sum, with no value */
            for (int p = p0; p <= pos[t]; p++) {
                const double e = exp(s[p] - mx);
                sum += e;
                const size_t vr = kv_row(kv, seq[t], p, h / group);
                for (int i = 0; i < hd; i++) acc[i] += e * ld1(vd, vr + i, kv->elem);
            }
            for (int i = 0; i < hd; i++) out[((size_t)t * n_heads + h) * hd + i] = (float)(acc[i] / sum);
        }
    free(s);
}
