/* Paged causal GQA attention against the double-precision two-pass reference: three sequences interleaved in
 * one batch (a decode token, a prefill chunk, a short prompt), block_size 16 not dividing the lengths, blocks
 * assigned out of order, GQA ratios 1, 2, 4 and 8, positions 0..300; bitwise determinism across runs and pool
 * sizes; kv_store writes where the block table says. Each case runs with the cache in f32 and in f16, and in
 * Q8_0 where head_dim is a multiple of 32, both in blocks and split into planes of codes and scales (the GPU
 * cache's layout), whose outputs must be the blocks' bitwise.
 *
 * Tolerance: outputs are convex combinations of |v| <= 1; f32 dot products and expf against double give
 * errors around 1e-6, so atol 1e-5 + rtol 1e-5. A wrong block, head or position is an O(0.1) error.
 * The reference reads the f16 cache's values as stored, so the same tolerance holds for it; the f16 result is
 * also held against the f32 cache's (f16 rounds K and V by up to 2^-11 relative: atol 4e-3 at this sharper
 * scale), which a wrong conversion shared by kernel and reference would fail. Q8_0 rounds each element by up
 * to half its block's max|x|/127 (~0.4% of the range of these values): its result is held against the f32
 * cache's to 3e-2 (measured: 6e-3). */
#include "kt_common.h"

#include "kernels/core/status.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/threadpool.h"
#include "quant/dtype.h"
#include "quant/fp16.h"

#define BS         16
#define N_SEQ      3
#define MAX_BLOCKS 24 /* 24 * 16 = 384 positions per sequence */

static int is_q8(int elem)
{
    return elem == KV_Q8_0 || elem == KV_Q8_0_PLANES;
}

/* Allocates K and V of `cells` elements of kv->elem; for planes each is one allocation, the codes and then
 * the scales (k_scale/v_scale point into it), so free(kv->k) and free(kv->v) release a cache of any type. */
static void cache_alloc(struct kv_layer_view *kv, size_t cells)
{
    kv->k = malloc(kv_elem_bytes(kv->elem, cells));
    kv->v = malloc(kv_elem_bytes(kv->elem, cells));
    cr_assert(kv->k && kv->v);
    if (kv->elem == KV_Q8_0_PLANES) {
        kv->k_scale = (uint16_t *)((int8_t *)kv->k + cells);
        kv->v_scale = (uint16_t *)((int8_t *)kv->v + cells);
    }
}

/* A cache of Q8_0 blocks and its twin in planes, over the same block table (n_local blocks of bs positions,
 * ids from base), each allocated for `cells` elements (cache_alloc). */
static void q8_twins(struct kv_layer_view *q8, struct kv_layer_view *pl, const int32_t *table, int bs,
                     int max_blocks, int n_local, int base, int nkv, int hd, size_t cells)
{
    *q8 = (struct kv_layer_view){.n_blocks = base + n_local,
                                 .block_size = bs,
                                 .block_table = table,
                                 .max_blocks = max_blocks,
                                 .n_kv_heads = nkv,
                                 .head_dim = hd,
                                 .elem = KV_Q8_0,
                                 .block_base = base};
    *pl = *q8;
    pl->elem = KV_Q8_0_PLANES;
    cache_alloc(q8, cells);
    cache_alloc(pl, cells);
}

/* Splits the Q8_0 blocks of `cells` elements into codes and scales. */
static void q8_split(const struct block_q8_0 *b, size_t cells, int8_t *codes, uint16_t *scales)
{
    for (size_t i = 0; i < cells / 32; i++) {
        memcpy(codes + i * 32, b[i].qs, 32);
        scales[i] = b[i].d;
    }
}

/* Stores x (cells values) into K (v = 0) or V (v = 1) of a cache allocated by cache_alloc, as its type holds
 * them; Q8_0 by ggml's quantizer, split for planes. */
static void cache_fill(const struct kv_layer_view *kv, int v, const float *x, size_t cells)
{
    void *dst = v ? kv->v : kv->k;
    if (is_q8(kv->elem)) {
        struct block_q8_0 *b = kv->elem == KV_Q8_0 ? dst : malloc(cells / 32 * sizeof *b);
        cr_assert(b && dtype_from_f32(DTYPE_Q8_0, x, b, (int64_t)cells));
        if (kv->elem == KV_Q8_0_PLANES) {
            q8_split(b, cells, dst, v ? kv->v_scale : kv->k_scale);
            free(b);
        }
    } else if (kv->elem == KV_F16)
        for (size_t i = 0; i < cells; i++) ((uint16_t *)dst)[i] = f32_to_f16(x[i]);
    else
        memcpy(dst, x, sizeof(float) * cells);
}

/* The value element i of K (v = 0) or V (v = 1) holds; the planes' read here as code times scale, not through
 * the Q8_0 decoder, so that a layout error of one shows. */
static float cache_at(const struct kv_layer_view *kv, int v, size_t i)
{
    const void *base = v ? kv->v : kv->k;
    if (kv->elem == KV_Q8_0) {
        float blk[32];
        cr_assert(dtype_to_f32(DTYPE_Q8_0, (const uint8_t *)base + i / 32 * 34, blk, 32));
        return blk[i % 32];
    }
    if (kv->elem == KV_Q8_0_PLANES)
        return (float)((const int8_t *)base)[i] * f16_to_f32((v ? kv->v_scale : kv->k_scale)[i / 32]);
    return kv->elem == KV_F16 ? f16_to_f32(((const uint16_t *)base)[i]) : ((const float *)base)[i];
}

/* The n values (n a multiple of 32 for Q8_0) a cache stores for the row x. */
static void stored_row(const struct kv_layer_view *kv, const float *x, size_t n, float *out)
{
    if (is_q8(kv->elem)) {
        uint8_t q[34 * 16];
        cr_assert(n <= 512);
        cr_assert(dtype_from_f32(DTYPE_Q8_0, x, q, (int64_t)n));
        cr_assert(dtype_to_f32(DTYPE_Q8_0, q, out, (int64_t)n));
        return;
    }
    for (size_t i = 0; i < n; i++) out[i] = kv->elem == KV_F16 ? f16_to_f32(f32_to_f16(x[i])) : x[i];
}

static const char *elem_name(int elem)
{
    return elem == KV_Q8_0_PLANES ? "q8_0 planes" : elem == KV_Q8_0 ? "q8_0" : elem == KV_F16 ? "f16" : "f32";
}

/* out_f32: the f32 cache's output (written by the f32 run, read by the others); out_q8: the Q8_0 cache's
 * (written by the Q8_0 run; the planes' must equal it bitwise). */
static void run_case_kv(int n_heads, int n_kv_heads, int head_dim, int elem, float *out_f32, float *out_q8)
{
    const int len[N_SEQ] = {301, 77, 5}; /* positions 0..len-1 exist after this step */
    const int n_blocks = N_SEQ * MAX_BLOCKS;
    const size_t row = (size_t)n_kv_heads * head_dim, cells = (size_t)n_blocks * BS * row;
    int32_t table[N_SEQ * MAX_BLOCKS];
    /* Blocks handed out in a scrambled order: block id = (7 * i + 3) mod n_blocks. */
    for (int i = 0; i < N_SEQ * MAX_BLOCKS; i++) table[i] = (7 * i + 3) % n_blocks;
    struct kv_layer_view kv = {.n_blocks = n_blocks,
                               .block_size = BS,
                               .block_table = table,
                               .max_blocks = MAX_BLOCKS,
                               .n_kv_heads = n_kv_heads,
                               .head_dim = head_dim,
                               .elem = elem};
    cache_alloc(&kv, cells);
    void *kc = kv.k, *vc = kv.v;
    /* Poison: a read of an unwritten row shows up as a huge error. */
    for (size_t i = 0; i < cells; i++)
        if (elem == KV_Q8_0_PLANES) {
            ((int8_t *)kc)[i] = ((int8_t *)vc)[i] = 100;
            if (i % 32 == 0) kv.k_scale[i / 32] = kv.v_scale[i / 32] = f32_to_f16(6e4f);
        } else if (elem == KV_Q8_0) {
            if (i % 32 == 0) {
                const uint16_t d = f32_to_f16(6e4f);
                memcpy((uint8_t *)kc + i / 32 * 34, &d, 2), memcpy((uint8_t *)vc + i / 32 * 34, &d, 2);
                memset((uint8_t *)kc + i / 32 * 34 + 2, 100, 32),
                    memset((uint8_t *)vc + i / 32 * 34 + 2, 100, 32);
            }
        } else if (elem == KV_F16)
            ((uint16_t *)kc)[i] = ((uint16_t *)vc)[i] = f32_to_f16(6e4f);
        else
            ((float *)kc)[i] = ((float *)vc)[i] = 1e6f;

    /* History: everything before this step's tokens, stored one sequence at a time. */
    const int first_new[N_SEQ] = {300, 60, 0};
    for (int s = 0; s < N_SEQ; s++)
        for (int p = 0; p < first_new[s]; p++) {
            float kn[512], vn[512];
            kt_fill(kn, row, -1.0f, 1.0f);
            kt_fill(vn, row, -1.0f, 1.0f);
            const int32_t sq = s, ps = p;
            kern_cpu_kv_store(&kv, kn, vn, &sq, &ps, 1);
        }
    /* This step's batch, interleaved: seq 1 chunk 60..76, seq 0 decode at 300, seq 2 prompt 0..4. */
    int32_t seq[32], pos[32];
    int m = 0;
    for (int i = 0; i < 17; i++) {
        seq[m] = 1, pos[m++] = 60 + i;
        if (i == 5) seq[m] = 0, pos[m++] = 300;
        if (i % 4 == 1 && i / 4 < 5) seq[m] = 2, pos[m++] = i / 4;
    }
    for (int p = 4; p < 5; p++) seq[m] = 2, pos[m++] = p;
    cr_assert_eq(m, 17 + 1 + 5);
    float *kn = malloc(sizeof(float) * m * row), *vn = malloc(sizeof(float) * m * row);
    kt_fill(kn, (size_t)m * row, -1.0f, 1.0f);
    kt_fill(vn, (size_t)m * row, -1.0f, 1.0f);
    kern_cpu_kv_store(&kv, kn, vn, seq, pos, m);
    float *want_k = malloc(sizeof(float) * row), *want_v = malloc(sizeof(float) * row);
    for (int i = 0; i < m; i++) {
        const int blk = table[seq[i] * MAX_BLOCKS + pos[i] / BS];
        const size_t at = ((size_t)blk * BS + pos[i] % BS) * row;
        stored_row(&kv, kn + i * row, row, want_k);
        stored_row(&kv, vn + i * row, row, want_v);
        for (size_t e = 0; e < row; e++) {
            cr_assert_eq(cache_at(&kv, 0, at + e), want_k[e], "kv_store token %d k", i);
            cr_assert_eq(cache_at(&kv, 1, at + e), want_v[e], "kv_store token %d v", i);
        }
    }
    (void)len;

    const size_t qn = (size_t)m * n_heads * head_dim;
    float *q = malloc(sizeof(float) * qn), *out = malloc(sizeof(float) * qn),
          *out2 = malloc(sizeof(float) * qn);
    float *ref = malloc(sizeof(float) * qn);
    kt_fill(q, qn, -1.0f, 1.0f);
    const float scale =
        1.0f / sqrtf((float)head_dim) * 3.0f; /* sharper than usual: exercises the max shift */
    struct tpool *tp;
    cr_assert_eq(tpool_init(&tp, 2), FERRY_OK);
    kern_cpu_attention(out, q, &kv, seq, pos, m, n_heads, scale, tp);
    kern_cpu_attention_ref(ref, q, &kv, seq, pos, m, n_heads, scale);
    char what[96];
    snprintf(what, sizeof what, "attention heads=%d kv=%d hd=%d %s", n_heads, n_kv_heads, head_dim,
             elem_name(elem));
    kt_check_close(what, out, ref, qn, 1e-5, 1e-5);
    if (elem == KV_F16)
        kt_check_close("f16 cache against the f32 cache", out, out_f32, qn, 4e-3, 0);
    else if (is_q8(elem))
        kt_check_close("q8_0 cache against the f32 cache", out, out_f32, qn, 3e-2, 0);
    else
        memcpy(out_f32, out, qn * sizeof(float));
    if (elem == KV_Q8_0) memcpy(out_q8, out, qn * sizeof(float));
    if (elem == KV_Q8_0_PLANES)
        cr_assert(memcmp(out, out_q8, qn * sizeof(float)) == 0, "%s: differs from the q8_0 cache's", what);
    kern_cpu_attention(out2, q, &kv, seq, pos, m, n_heads, scale, tp);
    cr_assert(memcmp(out, out2, qn * 4) == 0, "%s: two runs differ", what);
    kern_cpu_attention(out2, q, &kv, seq, pos, m, n_heads, scale, NULL);
    cr_assert(memcmp(out, out2, qn * 4) == 0, "%s: 1 vs 2 threads differ", what);
    /* A token's result does not depend on the batch around it: seq 0's decode token (300 positions, two
     * attention parts) alone gives the same bits as inside the batch. */
    for (int i = 0; i < m; i++)
        if (seq[i] == 0) {
            const size_t hn = (size_t)n_heads * head_dim;
            kern_cpu_attention(out2, q + i * hn, &kv, seq + i, pos + i, 1, n_heads, scale, tp);
            cr_assert(memcmp(out + i * hn, out2, hn * 4) == 0, "%s: token alone differs from in batch", what);
        }
    /* A single decode token (too few KV heads to keep the pool busy: tasks are split per query head). */
    for (int i = 0; i < m; i += 7) {
        kern_cpu_attention(out2, q + (size_t)i * n_heads * head_dim, &kv, seq + i, pos + i, 1, n_heads, scale,
                           tp);
        cr_assert(memcmp(out2, out + (size_t)i * n_heads * head_dim, sizeof(float) * n_heads * head_dim) == 0,
                  "%s: token %d alone differs from the batch", what, i);
    }
    /* Position 0 attends to itself only: the output is its own v row. */
    for (int i = 0; i < m; i++)
        if (pos[i] == 0) {
            stored_row(&kv, vn + i * row, row, want_v);
            for (int h = 0; h < n_heads; h++)
                for (int d = 0; d < head_dim; d++)
                    cr_assert_float_eq(out[((size_t)i * n_heads + h) * head_dim + d],
                                       want_v[(size_t)(h / (n_heads / n_kv_heads)) * head_dim + d], 1e-6f);
        }
    free(want_k);
    free(want_v);
    tpool_free(tp);
    free(kc);
    free(vc);
    free(kn);
    free(vn);
    free(q);
    free(out);
    free(out2);
    free(ref);
}

/* The case with an f32 cache, then the same data (same seed) with an f16 one and Q8_0 in blocks and in
 * planes. */
static void run_case(int n_heads, int n_kv_heads, int head_dim, unsigned seed)
{
    const size_t qn = (size_t)(17 + 1 + 5) * n_heads * head_dim;
    float *out_f32 = malloc(sizeof(float) * qn), *out_q8 = malloc(sizeof(float) * qn);
    kt_seed(seed);
    run_case_kv(n_heads, n_kv_heads, head_dim, KV_F32, out_f32, out_q8);
    kt_seed(seed);
    run_case_kv(n_heads, n_kv_heads, head_dim, KV_F16, out_f32, out_q8);
    if (head_dim % 32 == 0) {
        kt_seed(seed);
        run_case_kv(n_heads, n_kv_heads, head_dim, KV_Q8_0, out_f32, out_q8);
        kt_seed(seed);
        run_case_kv(n_heads, n_kv_heads, head_dim, KV_Q8_0_PLANES, out_f32, out_q8);
    }
    free(out_f32);
    free(out_q8);
}

Test(attention, gqa_ratio_1)
{
    run_case(2, 2, 64, 21);
}
Test(attention, gqa_ratio_2)
{
    run_case(4, 2, 40, 22);
}
Test(attention, gqa_ratio_4)
{
    run_case(8, 2, 128, 23);
}
Test(attention, gqa_single_kv_head_odd_dim)
{
    run_case(3, 1, 17, 24);
}
/* head_dim 96: three Q8_0 blocks a head, read without the 64-wide V loop. */
Test(attention, gqa_ratio_8_head_dim_96)
{
    run_case(16, 2, 96, 28);
}

/* 4100 positions x 8 KV heads x 64 dims: K+V is 16 MiB in f32 (8 in f16, 4.25 in Q8_0), above the size where
 * rows are prefetched. */
static void long_sequence(int elem)
{
    kt_seed(25);
    const int len = 4100, bs = 32, nkv = 8, hd = 64, nh = 16, max_blocks = (len + bs - 1) / bs;
    const size_t row = (size_t)nkv * hd, cells = (size_t)max_blocks * bs * row;
    float *kf = malloc(sizeof(float) * cells), *vf = malloc(sizeof(float) * cells);
    kt_fill(kf, cells, -1.0f, 1.0f);
    kt_fill(vf, cells, -1.0f, 1.0f);
    int32_t *table = malloc(sizeof(int32_t) * max_blocks);
    for (int i = 0; i < max_blocks; i++) table[i] = max_blocks - 1 - i; /* reversed */
    struct kv_layer_view kv = {.n_blocks = max_blocks,
                               .block_size = bs,
                               .block_table = table,
                               .max_blocks = max_blocks,
                               .n_kv_heads = nkv,
                               .head_dim = hd,
                               .elem = elem};
    cache_alloc(&kv, cells);
    cache_fill(&kv, 0, kf, cells);
    cache_fill(&kv, 1, vf, cells);
    const int32_t seq[3] = {0, 0, 0}, pos[3] = {4099, 2000, 33};
    float q[3 * 16 * 64], out[3 * 16 * 64], ref[3 * 16 * 64];
    kt_fill(q, sizeof q / sizeof q[0], -1.0f, 1.0f);
    struct tpool *tp;
    cr_assert_eq(tpool_init(&tp, 2), FERRY_OK);
    kern_cpu_attention(out, q, &kv, seq, pos, 3, nh, 0.125f, tp);
    kern_cpu_attention_ref(ref, q, &kv, seq, pos, 3, nh, 0.125f);
    char what[64];
    snprintf(what, sizeof what, "attention long sequence %s", elem_name(elem));
    kt_check_close(what, out, ref, sizeof q / sizeof q[0], 1e-5, 1e-5);
    tpool_free(tp);
    free(kf);
    free(vf);
    free(kv.k);
    free(kv.v);
    free(table);
}

Test(attention, long_sequence_prefetch_path)
{
    long_sequence(KV_F32);
}
Test(attention, long_sequence_prefetch_path_f16)
{
    long_sequence(KV_F16);
}
Test(attention, long_sequence_prefetch_path_q8_0)
{
    long_sequence(KV_Q8_0);
}
Test(attention, long_sequence_prefetch_path_q8_0_planes)
{
    long_sequence(KV_Q8_0_PLANES);
}

/* kern_cpu_attention_range: a row's attention cut at any position into two ranges, each with its
 * log-sum-exp, merges back into the whole row's attention; the lse is that of the scores (double reference);
 * lo 0 everywhere is kern_cpu_attention bitwise; an empty range gives 0 and -inf. The pool is a slice of
 * blocks starting at block id 1000 (block_base), as the GPU backend's host-memory extension is. */
Test(attention, ranges_merge_into_the_whole_row)
{
    kt_seed(26);
    const int len = 1300, bs = 16, nkv = 2, hd = 64, nh = 8, max_blocks = (len + bs - 1) / bs, base = 1000;
    const size_t row = (size_t)nkv * hd, cells = (size_t)max_blocks * bs * row;
    uint16_t *kh = malloc(2 * cells), *vh = malloc(2 * cells);
    for (size_t i = 0; i < cells; i++) {
        float a, b;
        kt_fill(&a, 1, -1.0f, 1.0f);
        kt_fill(&b, 1, -1.0f, 1.0f);
        kh[i] = f32_to_f16(a), vh[i] = f32_to_f16(b);
    }
    int32_t *table = malloc(sizeof(int32_t) * max_blocks);
    for (int i = 0; i < max_blocks; i++) table[i] = base + (5 * i + 2) % max_blocks;
    struct kv_layer_view kv = {.k = kh,
                               .v = vh,
                               .n_blocks = base + max_blocks,
                               .block_size = bs,
                               .block_table = table,
                               .max_blocks = max_blocks,
                               .n_kv_heads = nkv,
                               .head_dim = hd,
                               .elem = KV_F16,
                               .block_base = base};
    enum { M = 6 };
    const int32_t seq[M] = {0, 0, 0, 0, 0, 0}, pos[M] = {1299, 700, 33, 255, 9, 520};
    const int32_t lo[M] = {600, 0, 40, 256, 9, 256}; /* row 2 and 3 empty; row 4 one position */
    int32_t zero[M], hi_a[M];
    for (int i = 0; i < M; i++) zero[i] = 0, hi_a[i] = (lo[i] <= pos[i] ? lo[i] : pos[i] + 1) - 1;
    const size_t qn = (size_t)M * nh * hd;
    float *q = malloc(sizeof(float) * qn), *full = malloc(sizeof(float) * qn),
          *a = malloc(sizeof(float) * qn), *b = malloc(sizeof(float) * qn), *c = malloc(sizeof(float) * qn);
    float la[M * 8], lb[M * 8], lf[M * 8];
    kt_fill(q, qn, -1.0f, 1.0f);
    const float scale = 0.3f;
    struct tpool *tp;
    cr_assert_eq(tpool_init(&tp, 2), FERRY_OK);
    cr_assert_eq(kern_cpu_attention(full, q, &kv, seq, pos, M, nh, scale, tp), FERRY_OK);
    cr_assert_eq(kern_cpu_attention_range(c, lf, q, &kv, seq, zero, pos, M, nh, scale, tp), FERRY_OK);
    cr_assert(memcmp(full, c, qn * sizeof(float)) == 0, "lo = 0 differs from kern_cpu_attention");
    /* [0, lo - 1] and [lo, pos] (the first range ends at pos where lo is past it). */
    cr_assert_eq(kern_cpu_attention_range(a, la, q, &kv, seq, zero, hi_a, M, nh, scale, tp), FERRY_OK);
    cr_assert_eq(kern_cpu_attention_range(b, lb, q, &kv, seq, lo, pos, M, nh, scale, NULL), FERRY_OK);
    for (int i = 0; i < M; i++)
        for (int h = 0; h < nh; h++) {
            const int r = i * nh + h;
            if (lo[i] > pos[i]) {
                cr_assert(isinf(lb[r]) && lb[r] < 0, "row %d: an empty range's lse is -inf", i);
                for (int d = 0; d < hd; d++) cr_assert_eq(b[(size_t)r * hd + d], 0.0f);
            }
            if (lo[i] == 0) cr_assert(isinf(la[r]) && la[r] < 0);
            /* The lse against double. */
            double mx = -INFINITY, s = 0;
            double sc[1300];
            for (int p = 0; p <= pos[i]; p++) {
                const int blk = table[p / bs] - base;
                const uint16_t *k = kh + ((size_t)blk * bs + p % bs) * row + (size_t)(h / (nh / nkv)) * hd;
                double d = 0;
                for (int e = 0; e < hd; e++) d += (double)q[(size_t)r * hd + e] * f16_to_f32(k[e]);
                sc[p] = d * scale;
            }
            for (int p = 0; p <= pos[i]; p++) mx = sc[p] > mx ? sc[p] : mx;
            for (int p = 0; p <= pos[i]; p++) s += exp(sc[p] - mx);
            cr_assert_float_eq(lf[r], mx + log(s), 1e-4, "row %d head %d: lse %f, want %f", i, h, lf[r],
                               mx + log(s));
            /* The merge. */
            const float M2 = la[r] > lb[r] ? la[r] : lb[r];
            const float wa = isinf(la[r]) ? 0.0f : expf(la[r] - M2),
                        wb = isinf(lb[r]) ? 0.0f : expf(lb[r] - M2);
            for (int d = 0; d < hd; d++)
                c[(size_t)r * hd + d] = (a[(size_t)r * hd + d] * wa + b[(size_t)r * hd + d] * wb) / (wa + wb);
        }
    kt_check_close("two ranges merged against the whole row", c, full, qn, 1e-5, 1e-5);
    tpool_free(tp);
    free(kh);
    free(vh);
    free(table);
    free(q);
    free(full);
    free(a);
    free(b);
    free(c);
}

/* A prefill chunk's rows are read as tiles (a K/V chunk once for up to ATT_ROWS rows): each row's result is
 * still the one it has alone, bitwise, over the whole row and over a range, with the chunk crossing parts
 * (ATT_PART = 256) and blocks of an odd size, beside decode rows of other sequences; and it matches the
 * double reference. f32, f16 and Q8_0 caches, GQA groups of 4 and 1. */
static void chunk_rows(int elem, int nh, int nkv)
{
    kt_seed(27 + elem + nkv);
    const int bs = 7, hd = 64, n_seq = 2, max_blocks = 600 / bs + 1, n_blocks = n_seq * max_blocks;
    const size_t row = (size_t)nkv * hd, cells = (size_t)n_blocks * bs * row;
    int32_t *table = malloc(sizeof(int32_t) * n_blocks);
    for (int i = 0; i < n_blocks; i++) table[i] = (11 * i + 5) % n_blocks;
    struct kv_layer_view kv = {.n_blocks = n_blocks,
                               .block_size = bs,
                               .block_table = table,
                               .max_blocks = max_blocks,
                               .n_kv_heads = nkv,
                               .head_dim = hd,
                               .elem = elem};
    cache_alloc(&kv, cells);
    float *kn = malloc(sizeof(float) * row), *vn = malloc(sizeof(float) * row);
    for (int s = 0; s < n_seq; s++)
        for (int p = 0; p < 560; p++) {
            kt_fill(kn, row, -1.0f, 1.0f);
            kt_fill(vn, row, -1.0f, 1.0f);
            const int32_t sq = s, ps = p;
            kern_cpu_kv_store(&kv, kn, vn, &sq, &ps, 1);
        }
    /* A decode row of seq 1, the chunk of seq 0 at positions 200..499, another decode row of seq 1. */
    enum { M = 302 };
    int32_t seq[M], pos[M], lo[M];
    seq[0] = 1, pos[0] = 555, lo[0] = 300;
    for (int i = 1; i <= 300; i++) seq[i] = 0, pos[i] = 199 + i, lo[i] = 100;
    seq[M - 1] = 1, pos[M - 1] = 17, lo[M - 1] = 300; /* an empty range */
    const size_t hn = (size_t)nh * hd, qn = M * hn;
    float *q = malloc(sizeof(float) * qn), *out = malloc(sizeof(float) * qn),
          *ref = malloc(sizeof(float) * qn);
    float *one = malloc(sizeof(float) * hn), *lse = malloc(sizeof(float) * M * nh), lse1[16];
    kt_fill(q, qn, -1.0f, 1.0f);
    struct tpool *tp;
    cr_assert_eq(tpool_init(&tp, 2), FERRY_OK);
    const float scale = 0.35f;
    char what[64];
    snprintf(what, sizeof what, "prefill chunk %s, %d heads / %d", elem_name(elem), nh, nkv);
    cr_assert_eq(kern_cpu_attention(out, q, &kv, seq, pos, M, nh, scale, tp), FERRY_OK);
    kern_cpu_attention_ref(ref, q, &kv, seq, pos, M, nh, scale);
    kt_check_close(what, out, ref, qn, 1e-5, 1e-5);
    for (int i = 0; i < M; i += (i % 17 == 3 ? 1 : 5)) {
        cr_assert_eq(kern_cpu_attention(one, q + i * hn, &kv, seq + i, pos + i, 1, nh, scale, tp), FERRY_OK);
        cr_assert(memcmp(one, out + i * hn, sizeof(float) * hn) == 0, "%s: row %d alone differs", what, i);
    }
    cr_assert_eq(kern_cpu_attention_range(out, lse, q, &kv, seq, lo, pos, M, nh, scale, tp), FERRY_OK);
    for (int i = 0; i < M; i += (i % 13 == 2 ? 1 : 7)) {
        cr_assert_eq(kern_cpu_attention_range(one, lse1, q + i * hn, &kv, seq + i, lo + i, pos + i, 1, nh,
                                              scale, NULL),
                     FERRY_OK);
        cr_assert(memcmp(one, out + i * hn, sizeof(float) * hn) == 0, "%s: range row %d alone differs", what,
                  i);
        cr_assert(memcmp(lse1, lse + (size_t)i * nh, sizeof(float) * nh) == 0, "%s: lse of row %d", what, i);
    }
    tpool_free(tp);
    free(kv.k);
    free(kv.v);
    free(table);
    free(kn);
    free(vn);
    free(q);
    free(out);
    free(ref);
    free(one);
    free(lse);
}

Test(attention, prefill_chunk_rows_read_together_f32)
{
    chunk_rows(KV_F32, 8, 2);
}
Test(attention, prefill_chunk_rows_read_together_f16_mha)
{
    chunk_rows(KV_F16, 4, 4);
}
Test(attention, prefill_chunk_rows_read_together_q8_0)
{
    chunk_rows(KV_Q8_0, 8, 2);
}
Test(attention, prefill_chunk_rows_read_together_q8_0_planes_gqa_8)
{
    chunk_rows(KV_Q8_0_PLANES, 16, 2);
}

/* KV_Q8_0_PLANES is KV_Q8_0 split in two. A Q8_0 cache of random codes (the whole int8 range, -128 included,
 * which the quantizer never writes) and scales, and the same blocks as planes, give bitwise the same
 * kern_cpu_attention, kern_cpu_attention_range (lo > 0, with its lse) and reference outputs, over a pool
 * slice whose block ids start at 700 (block_base), as the GPU backend's host-memory extension reads it. Three
 * sequences, block_size 16 dividing none of their lengths, a prefill chunk's rows among decode rows. The
 * planes' results are also held to two double references: the library's (1e-5, as above: |v| <= 1.02), and,
 * for the ranges, one written here over values decoded by quant's dtype_to_f32, which shares no code with the
 * kernel's loads (lse to 1e-4). */
static void planes_match_blocks(int nh, int nkv, int hd, unsigned seed)
{
    kt_seed(seed);
    const int bs = 16, n_seq = 3, max_blocks = 40, n_local = n_seq * max_blocks, base = 700;
    const size_t row = (size_t)nkv * hd, cells = (size_t)n_local * bs * row;
    int32_t *table = malloc(sizeof(int32_t) * n_local);
    for (int i = 0; i < n_local; i++) table[i] = base + (7 * i + 3) % n_local;
    struct kv_layer_view q8, pl;
    q8_twins(&q8, &pl, table, bs, max_blocks, n_local, base, nkv, hd, cells);
    struct block_q8_0 *kb = q8.k, *vb = q8.v;
    for (size_t b = 0; b < cells / 32; b++) {
        kb[b].d = f32_to_f16(kt_uniform(0.002f, 0.008f)), vb[b].d = f32_to_f16(kt_uniform(0.002f, 0.008f));
        for (int l = 0; l < 32; l++)
            kb[b].qs[l] = (int8_t)(kt_next() % 256 - 128), vb[b].qs[l] = (int8_t)(kt_next() % 256 - 128);
    }
    q8_split(kb, cells, pl.k, pl.k_scale);
    q8_split(vb, cells, pl.v, pl.v_scale);

    /* Seq 2's chunk at 280..298 (lo 100), with seq 0's decode row at 610 (lo 300: parts 1 and 2 of
     * ATT_PART), seq 1's at 36 (lo 36: one position) and seq 0's at 0 (lo 1: empty) among its rows. */
    enum { M = 22 };
    int32_t seq[M], pos[M], lo[M];
    int m = 0;
    for (int i = 0; i < 19; i++) {
        seq[m] = 2, pos[m] = 280 + i, lo[m++] = 100;
        if (i == 4) seq[m] = 0, pos[m] = 610, lo[m++] = 300;
        if (i == 10) seq[m] = 1, pos[m] = 36, lo[m++] = 36;
    }
    seq[m] = 0, pos[m] = 0, lo[m++] = 1;
    cr_assert_eq(m, M);
    const size_t hn = (size_t)nh * hd, qn = M * hn;
    float *q = malloc(sizeof(float) * qn), *a = malloc(sizeof(float) * qn), *b = malloc(sizeof(float) * qn),
          *ref = malloc(sizeof(float) * qn);
    float *la = malloc(sizeof(float) * M * nh), *lb = malloc(sizeof(float) * M * nh);
    kt_fill(q, qn, -1.0f, 1.0f);
    const float scale = 2.0f / sqrtf((float)hd);
    struct tpool *tp;
    cr_assert_eq(tpool_init(&tp, 2), FERRY_OK);
    char what[96];
    snprintf(what, sizeof what, "q8_0 planes, %d heads / %d, head_dim %d", nh, nkv, hd);

    cr_assert_eq(kern_cpu_attention(a, q, &q8, seq, pos, M, nh, scale, tp), FERRY_OK);
    cr_assert_eq(kern_cpu_attention(b, q, &pl, seq, pos, M, nh, scale, tp), FERRY_OK);
    cr_assert(memcmp(a, b, sizeof(float) * qn) == 0, "%s: attention differs from the q8_0 cache's", what);
    kern_cpu_attention_ref(ref, q, &pl, seq, pos, M, nh, scale);
    kt_check_close(what, b, ref, qn, 1e-5, 1e-5);
    kern_cpu_attention_ref(a, q, &q8, seq, pos, M, nh, scale);
    cr_assert(memcmp(a, ref, sizeof(float) * qn) == 0, "%s: reference differs from the q8_0 cache's", what);

    cr_assert_eq(kern_cpu_attention_range(a, la, q, &q8, seq, lo, pos, M, nh, scale, tp), FERRY_OK);
    cr_assert_eq(kern_cpu_attention_range(b, lb, q, &pl, seq, lo, pos, M, nh, scale, tp), FERRY_OK);
    cr_assert(memcmp(a, b, sizeof(float) * qn) == 0, "%s: range differs from the q8_0 cache's", what);
    cr_assert(memcmp(la, lb, sizeof(float) * M * nh) == 0, "%s: range lse differs from the q8_0 cache's",
              what);
    cr_assert_eq(kern_cpu_attention_range(a, la, q, &pl, seq, lo, pos, M, nh, scale, NULL), FERRY_OK);
    cr_assert(memcmp(a, b, sizeof(float) * qn) == 0, "%s: range on 1 vs 2 threads differs", what);

    /* The ranges against double over the decoded values. */
    float *kf = malloc(sizeof(float) * cells), *vf = malloc(sizeof(float) * cells);
    cr_assert(dtype_to_f32(DTYPE_Q8_0, kb, kf, (int64_t)cells) &&
              dtype_to_f32(DTYPE_Q8_0, vb, vf, (int64_t)cells));
    double *sc = malloc(sizeof(double) * 640), *acc = malloc(sizeof(double) * hd);
    for (int i = 0; i < M; i++)
        for (int h = 0; h < nh; h++) {
            const float *qh = q + i * hn + (size_t)h * hd, *got = b + i * hn + (size_t)h * hd;
            const float got_lse = lb[i * nh + h];
            if (lo[i] > pos[i]) {
                cr_assert(isinf(got_lse) && got_lse < 0, "%s: row %d's empty range: lse %f", what, i,
                          got_lse);
                for (int d = 0; d < hd; d++) cr_assert_eq(got[d], 0.0f);
                continue;
            }
            double mx = -INFINITY, sum = 0;
            for (int p = lo[i]; p <= pos[i]; p++) {
                const size_t at = ((size_t)(table[seq[i] * max_blocks + p / bs] - base) * bs + p % bs) * row +
                                  (size_t)(h / (nh / nkv)) * hd;
                double d = 0;
                for (int e = 0; e < hd; e++) d += (double)qh[e] * kf[at + e];
                sc[p] = d * scale;
                mx = sc[p] > mx ? sc[p] : mx;
            }
            for (int d = 0; d < hd; d++) acc[d] = 0;
            for (int p = lo[i]; p <= pos[i]; p++) {
                const size_t at = ((size_t)(table[seq[i] * max_blocks + p / bs] - base) * bs + p % bs) * row +
                                  (size_t)(h / (nh / nkv)) * hd;
                const double w = exp(sc[p] - mx);
                sum += w;
                for (int d = 0; d < hd; d++) acc[d] += w * vf[at + d];
            }
            for (int d = 0; d < hd; d++) ref[d] = (float)(acc[d] / sum);
            snprintf(what, sizeof what, "q8_0 planes range, row %d head %d, head_dim %d", i, h, hd);
            kt_check_close(what, got, ref, (size_t)hd, 1e-5, 1e-5);
            cr_assert_float_eq(got_lse, mx + log(sum), 1e-4, "%s: lse %f, want %f", what, got_lse,
                               mx + log(sum));
        }
    tpool_free(tp);
    free(kf), free(vf), free(sc), free(acc);
    free(q8.k), free(q8.v), free(pl.k), free(pl.v), free(table);
    free(q), free(a), free(b), free(ref), free(la), free(lb);
}

Test(attention, q8_0_planes_match_blocks_mha_64)
{
    planes_match_blocks(4, 4, 64, 41);
}
Test(attention, q8_0_planes_match_blocks_gqa_4_128)
{
    planes_match_blocks(16, 4, 128, 42);
}
Test(attention, q8_0_planes_match_blocks_gqa_8_96)
{
    planes_match_blocks(8, 1, 96, 43);
}

/* A peaked softmax, as served models have, over Q8_0 planes at odd sizes: scale 20 on q and K uniform in
 * [-1, 1] spreads a row's scores by 20·√(head_dim)/3 (~65), so all but a few weights are e^-87 or below and
 * their products with V's scales subnormal (flushed), and parts of ATT_PART positions have maxima tens to
 * hundreds apart (merge weights that underflow). Blocks of 7 positions from block id 5, 3 KV heads, decode
 * rows of 1 to 3 parts and a prefill chunk crossing a part, on a pool of 3 and none: against the double
 * reference, and bitwise the Q8_0 blocks' output. Tolerance: a weight moves by the rounding of its f32 score
 * times 20, and the output by that times |v| <= 1: 1e-4 + 1e-4 |ref| (the worst seen, on the 8-lane path:
 * 1.1e-5 at |ref| 0.47; the 16-lane path rounds in another order). */
static void planes_peaked(int nh, int nkv, int hd, unsigned seed)
{
    kt_seed(seed);
    const int bs = 7, n_seq = 3, max_blocks = 610 / bs + 1, n_local = n_seq * max_blocks, base = 5;
    const size_t row = (size_t)nkv * hd, cells = (size_t)n_local * bs * row;
    int32_t *table = malloc(sizeof(int32_t) * n_local);
    for (int i = 0; i < n_local; i++) table[i] = base + (13 * i + 4) % n_local;
    struct kv_layer_view q8, pl;
    q8_twins(&q8, &pl, table, bs, max_blocks, n_local, base, nkv, hd, cells);
    float *x = malloc(sizeof(float) * cells);
    for (int v = 0; v < 2; v++) {
        kt_fill(x, cells, -1.0f, 1.0f);
        cache_fill(&q8, v, x, cells);
        cache_fill(&pl, v, x, cells);
    }
    /* Seq 0 at 600 (3 parts), seq 1 at 300 (2) and 0, seq 2's chunk at 250..262 and its row at 30. */
    enum { M = 17 };
    int32_t seq[M] = {0, 1, 1, 2}, pos[M] = {600, 300, 0, 30};
    for (int i = 4; i < M; i++) seq[i] = 2, pos[i] = 246 + i;
    const size_t qn = (size_t)M * nh * hd;
    float *q = malloc(sizeof(float) * qn), *a = malloc(sizeof(float) * qn), *b = malloc(sizeof(float) * qn),
          *ref = malloc(sizeof(float) * qn);
    kt_fill(q, qn, -1.0f, 1.0f);
    struct tpool *tp;
    cr_assert_eq(tpool_init(&tp, 3), FERRY_OK);
    char what[96];
    snprintf(what, sizeof what, "q8_0 planes, peaked softmax, %d heads / %d, head_dim %d", nh, nkv, hd);
    cr_assert_eq(kern_cpu_attention(b, q, &pl, seq, pos, M, nh, 20.0f, tp), FERRY_OK);
    kern_cpu_attention_ref(ref, q, &pl, seq, pos, M, nh, 20.0f);
    kt_check_close(what, b, ref, qn, 1e-4, 1e-4);
    cr_assert_eq(kern_cpu_attention(a, q, &q8, seq, pos, M, nh, 20.0f, tp), FERRY_OK);
    cr_assert(memcmp(a, b, sizeof(float) * qn) == 0, "%s: differs from the q8_0 cache's", what);
    cr_assert_eq(kern_cpu_attention(a, q, &pl, seq, pos, M, nh, 20.0f, NULL), FERRY_OK);
    cr_assert(memcmp(a, b, sizeof(float) * qn) == 0, "%s: 3 threads vs none differ", what);
    tpool_free(tp);
    free(x), free(q), free(a), free(b), free(ref), free(table);
    free(q8.k), free(q8.v), free(pl.k), free(pl.v);
}

Test(attention, q8_0_planes_peaked_softmax_gqa_2_96)
{
    planes_peaked(6, 3, 96, 45);
}
Test(attention, q8_0_planes_peaked_softmax_mha_128)
{
    planes_peaked(3, 3, 128, 46);
}

/* kern_cpu_kv_store into planes writes the split of what it writes into Q8_0 blocks, and nothing else: both
 * caches start with the same poison and are compared whole. Rows of 9 blocks (3 KV heads of 96, more than the
 * store's stack buffer of 8), magnitudes from 1e-3 to 1e2, one block all zeros (scale 0), block_size 5,
 * block ids from 3. */
Test(attention, kv_store_planes_hold_the_q8_0_blocks_split)
{
    kt_seed(44);
    const int bs = 5, nkv = 3, hd = 96, max_blocks = 8, n_local = 2 * max_blocks, base = 3;
    const size_t row = (size_t)nkv * hd, cells = (size_t)n_local * bs * row;
    int32_t table[2 * 8];
    for (int i = 0; i < n_local; i++) table[i] = base + (5 * i + 1) % n_local;
    struct kv_layer_view q8, pl;
    q8_twins(&q8, &pl, table, bs, max_blocks, n_local, base, nkv, hd, cells);
    struct block_q8_0 *kb = q8.k, *vb = q8.v;
    for (size_t b = 0; b < cells / 32; b++) {
        kb[b].d = vb[b].d = f32_to_f16(6e4f);
        memset(kb[b].qs, 100, 32), memset(vb[b].qs, 100, 32);
    }
    q8_split(kb, cells, pl.k, pl.k_scale);
    q8_split(vb, cells, pl.v, pl.v_scale);
    enum { M = 13 };
    int32_t seq[M], pos[M];
    for (int i = 0; i < M; i++) seq[i] = i % 2, pos[i] = (int32_t)((7 * i + 2) % (max_blocks * bs));
    float *kn = malloc(sizeof(float) * M * row), *vn = malloc(sizeof(float) * M * row);
    for (int i = 0; i < M; i++) {
        const float mag = powf(10.0f, (float)(i % 6) - 3.0f);
        kt_fill(kn + i * row, row, -mag, mag);
        kt_fill(vn + i * row, row, -mag, mag);
    }
    memset(kn + 32, 0, sizeof(float) * 32);
    kern_cpu_kv_store(&q8, kn, vn, seq, pos, M);
    kern_cpu_kv_store(&pl, kn, vn, seq, pos, M);
    int8_t *codes = malloc(cells);
    uint16_t *scales = malloc(sizeof(uint16_t) * (cells / 32));
    for (int v = 0; v < 2; v++) {
        q8_split(v ? vb : kb, cells, codes, scales);
        cr_assert(memcmp(codes, v ? pl.v : pl.k, cells) == 0, "%s codes differ from the q8_0 store's",
                  v ? "v" : "k");
        cr_assert(memcmp(scales, v ? pl.v_scale : pl.k_scale, sizeof(uint16_t) * (cells / 32)) == 0,
                  "%s scales differ from the q8_0 store's", v ? "v" : "k");
    }
    cr_assert_eq(pl.k_scale[((size_t)(table[0] - base) * bs + pos[0] % bs) * row / 32 + 1], 0,
                 "the zero block's scale");
    free(codes), free(scales), free(kn), free(vn);
    free(q8.k), free(q8.v), free(pl.k), free(pl.v);
}

/* Attention sinks (gpt-oss): kern_cpu_attention_range then kern_cpu_attention_sinks against the double
 * reference that puts e^sink in each softmax's denominator, at odd sizes (7 query heads over 1 KV head of 40,
 * then 6 over 3 of 24), f32 and f16 caches, full rows and windows, sinks from far below the scores (no
 * effect) to far above (the output shrinks towards 0); a row whose range is empty stays 0. Tolerance as
 * above. */
static void sinks_case(int nh, int nkv, int hd, int elem, unsigned seed)
{
    kt_seed(seed);
    const int len = 301, bs = 16, max_blocks = (len + bs - 1) / bs;
    const size_t row = (size_t)nkv * hd, cells = (size_t)max_blocks * bs * row;
    float *kf = malloc(sizeof(float) * cells), *vf = malloc(sizeof(float) * cells);
    kt_fill(kf, cells, -1.0f, 1.0f);
    kt_fill(vf, cells, -1.0f, 1.0f);
    int32_t table[32];
    for (int i = 0; i < max_blocks; i++) table[i] = (7 * i + 3) % max_blocks;
    struct kv_layer_view kv = {.n_blocks = max_blocks,
                               .block_size = bs,
                               .block_table = table,
                               .max_blocks = max_blocks,
                               .n_kv_heads = nkv,
                               .head_dim = hd,
                               .elem = elem};
    cache_alloc(&kv, cells);
    cache_fill(&kv, 0, kf, cells);
    cache_fill(&kv, 1, vf, cells);
    enum { M = 7 };
    const int32_t seq[M] = {0, 0, 0, 0, 0, 0, 0}, pos[M] = {0, 1, 16, 17, 128, 300, 5};
    const int32_t lo[M] = {0, 0, 1, 2, 0, 172, 6}; /* windows of 16 and 129; row 6 empty */
    const size_t qn = (size_t)M * nh * hd;
    float *q = malloc(sizeof(float) * qn), *got = malloc(sizeof(float) * qn),
          *ref = malloc(sizeof(float) * qn);
    float *lse = malloc(sizeof(float) * M * nh), *sinks = malloc(sizeof(float) * nh);
    kt_fill(q, qn, -1.0f, 1.0f);
    for (int h = 0; h < nh; h++) sinks[h] = h == 0 ? -30.0f : h == 1 ? 12.0f : kt_uniform(-2.0f, 3.0f);
    const float scale = 0.4f;
    struct tpool *tp;
    cr_assert_eq(tpool_init(&tp, 2), FERRY_OK);
    cr_assert_eq(kern_cpu_attention_range(got, lse, q, &kv, seq, lo, pos, M, nh, scale, tp), FERRY_OK);
    kern_cpu_attention_sinks(got, lse, sinks, M, nh, hd);
    kern_cpu_attention_sinks_ref(ref, q, &kv, seq, lo, pos, sinks, M, nh, scale);
    char what[96];
    snprintf(what, sizeof what, "sinks %d/%d heads of %d, %s", nh, nkv, hd, elem_name(elem));
    kt_check_close(what, got, ref, (size_t)(M - 1) * nh * hd, 1e-5, 1e-5);
    for (size_t i = (size_t)(M - 1) * nh * hd; i < qn; i++) cr_assert_eq(got[i], 0.0f, "empty row");
    /* The sinks change the output: head 1's (e^12) leaves a few percent of it, head 0's (e^-30) none. */
    float *plain = malloc(sizeof(float) * qn);
    cr_assert_eq(kern_cpu_attention_range(plain, lse, q, &kv, seq, lo, pos, M, nh, scale, tp), FERRY_OK);
    double n0 = 0, n1 = 0, d0 = 0;
    for (int t = 0; t < M - 1; t++)
        for (int e = 0; e < hd; e++) {
            const size_t h0 = ((size_t)t * nh) * hd + e, h1 = h0 + hd;
            d0 = fmax(d0, fabs(got[h0] - plain[h0]));
            n0 += fabs(plain[h1]), n1 += fabs(got[h1]);
        }
    cr_assert(d0 < 1e-6, "a sink far below the scores changes nothing (%g)", d0);
    cr_assert(n1 < 0.2 * n0, "a sink far above the scores takes most of the mass (%g of %g)", n1, n0);
    tpool_free(tp);
    free(kv.k);
    free(kv.v);
    free(kf);
    free(vf);
    free(q);
    free(got);
    free(ref);
    free(lse);
    free(sinks);
    free(plain);
}

Test(attention, sinks_against_reference)
{
    sinks_case(7, 1, 40, KV_F32, 61);
    sinks_case(6, 3, 24, KV_F32, 62);
    sinks_case(6, 3, 24, KV_F16, 63);
}
