/* CUDA paged attention and KV store against a double-precision two-pass softmax on random data.
 *
 * The cache is filled with random f16 values in blocks placed at shuffled pool positions; the reference reads
 * the same f16 values, so the only differences are f32 rounding in the f32 kernels (scores, expf, sums of up
 * to 8192 terms): tolerance max abs error 2e-5 (|v| <= 1, weights sum to 1) and tensor rel err 3e-5
 * (estimated f32 accumulation error at 8192 positions: ~6e-6 relative); the tensor-core prefill kernel also
 * rounds q and P to f16: 2e-3 and 1e-3 (see MMA_ABS). The prefill matrix (chunks of 1, 7, 64, 255, 300 rows
 * at positions 0, 13, 200; head_dim 64, 128; GQA 1, 4, 8; block sizes 16, 4; decode rows of other sequences
 * before, after or inside the chunk; AUTO, the mixed entry and PREFILL) reports every failing shape with its
 * worst error before it fails, so one GPU run diagnoses everything. Sequence lengths 1, 7, 64, 129, 1000 and
 * 8192; GQA ratios 1, 4, 8 and 24 (more heads than one block takes); head_dim 8 (stories260K), 64, 96, 128,
 * 256; block sizes 7, 16, 32; prefill, decode and auto modes; the decode kernel and the tile kernel; no
 * splits, a few and many; one workspace reused across calls and CUDA-graph replays (the split arrival
 * counters reset). The local reference is checked against the CPU oracle kern_cpu_attention_ref (same cache
 * layout and block table, f32 elements holding the f16 values) by a test that needs no GPU and so also runs
 * in CI, and so does the tensor-core kernel's host audit (kern_cuda_attention_mma_audit: bounds, alignment,
 * races, tile contents and coverage of every thread's accesses) over every batch the GPU tests and
 * bench_attn give that kernel. Attention sinks (gpt-oss) run through the same matrix of kernels, variants,
 * windows and GQA ratios (sinks_every_kernel), head size 512 through the tile kernel's wide variant
 * (wide_heads_d512); both print every case's errors, and the sinks reference is checked against
 * kern_cpu_attention_sinks_ref without a GPU. Sliding windows run over a window pool too
 * (sliding_window_pool): each sequence holds only its window's blocks, the rest of its table -1.
 */
#include "tests/cuda/cuda_test.h"

#include "kernels/cpu/attention.h"
#include "kernels/cpu/ops.h"
#include "kernels/cuda/attention.h"
#include "weights/model_file.h"

struct cache {
    int n_heads, n_kv, D, bs, n_seqs, max_blocks, n_blocks;
    int *len;        /* (n_seqs) positions filled */
    int32_t *bt;     /* (n_seqs, max_blocks) */
    uint16_t *k, *v; /* (n_blocks, bs, n_kv, D) f16 */
    int q8;          /* the device holds Q8_0 codes and scales; k, v hold their values rounded to f16 */
    float *sinks;    /* (n_heads) the attention sinks dev.sinks holds on the device, or NULL */
    struct kern_cuda_kv_layer dev;
};

/* A sliding-window layers' own pool (runtime/kv_cache.h kv_cache_drop), for the next cache_init_table: the
 * position from which each sequence still holds its blocks (the table's entries of the blocks wholly before
 * it -1, and those blocks not in the pool at all); NULL: every block. */
static const int *test_from;

/* The shape and a shuffled block table, no K/V data (k and v NULL). */
static void cache_init_table(struct cache *c, int n_heads, int n_kv, int D, int bs, int n_seqs,
                             const int *len)
{
    c->n_heads = n_heads, c->n_kv = n_kv, c->D = D, c->bs = bs, c->n_seqs = n_seqs;
    c->len = malloc(n_seqs * sizeof(int));
    memcpy(c->len, len, n_seqs * sizeof(int));
    int maxl = 1, total = 0;
    for (int s = 0; s < n_seqs; s++) {
        if (len[s] > maxl) maxl = len[s];
        total += (len[s] + bs - 1) / bs - (test_from ? test_from[s] / bs : 0);
    }
    c->max_blocks = (maxl + bs - 1) / bs + 1;
    c->n_blocks = total + 3;
    /* A shuffled pool: block ids handed out in random order, with spare blocks between. */
    int *perm = malloc(c->n_blocks * sizeof(int));
    for (int i = 0; i < c->n_blocks; i++) perm[i] = i;
    for (int i = c->n_blocks - 1; i > 0; i--) {
        int j = irand(i + 1), t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
    c->bt = malloc((size_t)n_seqs * c->max_blocks * 4);
    int next = 0;
    for (int s = 0; s < n_seqs; s++)
        for (int b = 0; b < c->max_blocks; b++)
            c->bt[(size_t)s * c->max_blocks + b] =
                b < (len[s] + bs - 1) / bs && b >= (test_from ? test_from[s] / bs : 0) ? perm[next++] : -1;
    free(perm);
    c->k = c->v = NULL;
    c->q8 = 0;
    c->sinks = NULL;
    memset(&c->dev, 0, sizeof c->dev);
}

static void cache_init_host(struct cache *c, int n_heads, int n_kv, int D, int bs, int n_seqs, const int *len)
{
    cache_init_table(c, n_heads, n_kv, D, bs, n_seqs, len);
    const size_t ne = (size_t)c->n_blocks * bs * n_kv * D;
    c->k = malloc(ne * 2);
    c->v = malloc(ne * 2);
    for (size_t i = 0; i < ne; i++) {
        c->k[i] = f32_to_f16(frand());
        c->v[i] = f32_to_f16(frand());
    }
}

static void cache_init(struct cache *c, int n_heads, int n_kv, int D, int bs, int n_seqs, const int *len)
{
    cache_init_host(c, n_heads, n_kv, D, bs, n_seqs, len);
    const size_t ne = (size_t)c->n_blocks * bs * n_kv * D;
    c->dev.k = dev_upload(c->k, ne * 2);
    c->dev.v = dev_upload(c->v, ne * 2);
    c->dev.n_blocks = c->n_blocks;
    c->dev.block_size = bs;
    c->dev.block_table = dev_upload(c->bt, (size_t)n_seqs * c->max_blocks * 4);
    c->dev.max_blocks = c->max_blocks;
    c->dev.n_kv_heads = n_kv;
    c->dev.head_dim = D;
}

/* llama.cpp's quantize_row_q8_0_ref on 32 values: d = max|x| / 127, codes round(x / d) (through 1/d), d as
 * f16.
 */
static void q8_quantize32(const float *x, int8_t *codes, uint16_t *scale)
{
    float amax = 0.0f;
    for (int e = 0; e < 32; e++) amax = fmaxf(amax, fabsf(x[e]));
    const float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
    for (int e = 0; e < 32; e++) codes[e] = (int8_t)roundf(x[e] * id);
    *scale = f32_to_f16(d);
}

/* The cache of cache_init with the device holding Q8_0 codes and scales of its random values, and the host
 * arrays the dequantized values (code x scale) rounded to f16 for the reference. */
static void cache_init_q8(struct cache *c, int n_heads, int n_kv, int D, int bs, int n_seqs, const int *len)
{
    cache_init_host(c, n_heads, n_kv, D, bs, n_seqs, len);
    const size_t ne = (size_t)c->n_blocks * bs * n_kv * D;
    int8_t *codes[2] = {malloc(ne), malloc(ne)};
    uint16_t *scales[2] = {malloc(ne / 32 * 2), malloc(ne / 32 * 2)};
    uint16_t *vals[2] = {c->k, c->v};
    for (int kv = 0; kv < 2; kv++)
        for (size_t b = 0; b < ne / 32; b++) {
            float x[32];
            for (int e = 0; e < 32; e++) x[e] = f16_to_f32(vals[kv][b * 32 + e]);
            q8_quantize32(x, codes[kv] + b * 32, scales[kv] + b);
            const float d = f16_to_f32(scales[kv][b]);
            for (int e = 0; e < 32; e++) vals[kv][b * 32 + e] = f32_to_f16(codes[kv][b * 32 + e] * d);
        }
    c->q8 = 1;
    c->dev.q8 = 1;
    c->dev.k = dev_upload(codes[0], ne);
    c->dev.v = dev_upload(codes[1], ne);
    c->dev.k_scale = dev_upload(scales[0], ne / 32 * 2);
    c->dev.v_scale = dev_upload(scales[1], ne / 32 * 2);
    c->dev.n_blocks = c->n_blocks;
    c->dev.block_size = bs;
    c->dev.block_table = dev_upload(c->bt, (size_t)n_seqs * c->max_blocks * 4);
    c->dev.max_blocks = c->max_blocks;
    c->dev.n_kv_heads = n_kv;
    c->dev.head_dim = D;
    for (int kv = 0; kv < 2; kv++) free(codes[kv]), free(scales[kv]);
}

static void cache_free(struct cache *c)
{
    cudaFree(c->dev.k);
    cudaFree(c->dev.v);
    cudaFree(c->dev.k_scale);
    cudaFree(c->dev.v_scale);
    cudaFree((void *)c->dev.block_table);
    cudaFree((void *)c->dev.sinks);
    free(c->sinks);
    free(c->len);
    free(c->bt);
    free(c->k);
    free(c->v);
}

static const uint16_t *cache_row(const struct cache *c, const uint16_t *base, int s, int p, int kvh)
{
    int blk = c->bt[(size_t)s * c->max_blocks + p / c->bs];
    return base + (((size_t)blk * c->bs + p % c->bs) * c->n_kv + kvh) * c->D;
}

static void ref_attention(double *out, const float *q, const struct cache *c, const int32_t *seq,
                          const int32_t *pos, int m, float scale)
{
    const int D = c->D, G = c->n_heads / c->n_kv;
    double *sc = malloc(((size_t)pos[0] + 1) * 8);
    int cap = pos[0] + 1;
    for (int i = 0; i < m; i++) {
        if (pos[i] + 1 > cap) {
            cap = pos[i] + 1;
            sc = realloc(sc, (size_t)cap * 8);
        }
        for (int h = 0; h < c->n_heads; h++) {
            const float *qh = q + ((size_t)i * c->n_heads + h) * D;
            /* A sink joins the denominator with no value (gpt-oss). */
            const double sink = c->sinks ? c->sinks[h] : -INFINITY;
            double mx = sink, sum = 0;
            /* A sliding-window layer's row sees (pos - window, pos]. */
            const int plo = c->dev.window > 0 && pos[i] + 1 > c->dev.window ? pos[i] + 1 - c->dev.window : 0;
            for (int p = plo; p <= pos[i]; p++) {
                const uint16_t *kr = cache_row(c, c->k, seq[i], p, h / G);
                double s = 0;
                for (int d = 0; d < D; d++) s += (double)qh[d] * f16_to_f32(kr[d]);
                sc[p] = s * scale;
                if (sc[p] > mx) mx = sc[p];
            }
            for (int p = plo; p <= pos[i]; p++) sum += (sc[p] = exp(sc[p] - mx));
            if (c->sinks) sum += exp(sink - mx);
            double *o = out + ((size_t)i * c->n_heads + h) * D;
            for (int d = 0; d < D; d++) o[d] = 0;
            for (int p = plo; p <= pos[i]; p++) {
                const uint16_t *vr = cache_row(c, c->v, seq[i], p, h / G);
                for (int d = 0; d < D; d++) o[d] += sc[p] / sum * f16_to_f32(vr[d]);
            }
        }
    }
    free(sc);
}

/* Tolerances. The f32 kernels (decode, SIMT tile): max abs error 2e-5 and tensor relative error 3e-5 (|v| <=
 * 1, weights sum to 1; f32 accumulation over up to 8192 positions). The tensor-core prefill kernel rounds q
 * (scaled) to f16 (relative 2^-11: the scores move by ~1e-4 at head_dim 128 with |q|, |k| <= 1) and P to f16
 * for P·V (each weight off by at most 2^-11 of itself, so the output by at most ~5e-4 * max|v|): max abs
 * error 2e-3 and tensor relative error 1e-3, about 4x the worst case seen in analysis. */
#define F32_ABS 2e-5
#define F32_REL 3e-5
#define MMA_ABS 2e-3
#define MMA_REL 1e-3

/* Whether rows of a batch of m in `mode` go through the tensor-core prefill kernel (head_dim 64 and 128). */
static int mode_uses_mma(int D, enum kern_cuda_attn_mode mode, int m)
{
    return (D == 64 || D == 128) && (mode == KERN_ATTN_PREFILL || (mode == KERN_ATTN_AUTO && m > 16));
}

/* 1: run_case prints every case's errors (the sinks and wide-head tests), so that one GPU log shows them all.
 */
static int test_verbose;

/* Runs the batch (seq, pos) in `mode` with and without a workspace and compares both with the reference. */
static void run_case(const struct cache *c, const int32_t *seq, const int32_t *pos, int m,
                     enum kern_cuda_attn_mode mode, const char *what)
{
    const size_t nq = (size_t)m * c->n_heads * c->D;
    const float scale = 1.0f / sqrtf((float)c->D);
    float *q = host_rand(nq, -1, 1), *got = malloc(nq * 4), *got2 = malloc(nq * 4);
    double *ref = malloc(nq * 8);
    ref_attention(ref, q, c, seq, pos, m, scale);
    int max_len = 0;
    for (int i = 0; i < m; i++)
        if (pos[i] + 1 > max_len) max_len = pos[i] + 1;
    float *dq = dev_upload(q, nq * 4), *dout = dev_poison(nq * 4);
    int32_t *dseq = dev_upload(seq, m * 4), *dpos = dev_upload(pos, m * 4);
    const size_t wsb = kern_cuda_attention_ws_size(m, c->n_heads, c->D, max_len);
    void *ws = dev_alloc(wsb);
    CU_OK(cudaMemset(ws, 0, wsb ? wsb : 16)); /* once, as the contract asks; every call leaves it reusable */
    /* 0: full workspace (splits); 1: the same again, bitwise equal (the arrival counters were reset); 2: no
     * workspace (one split); 3: full workspace with two K/V buffers per block instead of one
     * (kern_cuda_attention_set_stages); 4: the tile kernel only (kern_cuda_attention_set_decode_heads(-1));
     * 5: the decode kernel with 2 KV heads per block where the shape allows it; 6: prefill rows through the
     * SIMT tile kernel instead of the tensor-core kernel (kern_cuda_attention_set_prefill_mma(0)) */
    for (int variant = 0; variant < 7; variant++) {
        CU_OK(cudaMemset(dout, 0xFF, nq * 4));
        kern_cuda_attention_set_stages(variant == 3 ? 2 : 0);
        kern_cuda_attention_set_decode_heads(variant == 4 ? -1 : variant == 5 ? 2 : 0);
        kern_cuda_attention_set_prefill_mma(variant == 6 ? 0 : 1);
        int rc = kern_cuda_attention(dout, dq, &c->dev, dseq, dpos, m, c->n_heads, scale, max_len, mode,
                                     variant == 2 ? NULL : ws, variant == 2 ? 0 : wsb, 0);
        kern_cuda_attention_set_stages(0);
        kern_cuda_attention_set_decode_heads(0);
        kern_cuda_attention_set_prefill_mma(1);
        cr_assert_eq(rc, FERRY_OK, "%s: rc %d", what, rc);
        dev_download(variant == 1 ? got2 : got, dout, nq * 4);
        if (variant == 1) {
            cr_assert(memcmp(got, got2, nq * 4) == 0, "%s: two identical runs differ", what);
            continue;
        }
        /* A Q8_0 cache: the decode kernel multiplies code by scale in f32 where the reference reads the
         * product rounded to f16, and the tile kernel rounds it as the reference does: the tensor-core
         * bounds. */
        const int mma = c->q8 || (variant != 6 && mode_uses_mma(c->D, mode, m));
        const double ta = mma ? MMA_ABS : F32_ABS, tr = mma ? MMA_REL : F32_REL;
        double ea = max_abs_err(got, ref, nq), er = rel_err(got, ref, nq);
        if (test_verbose)
            fprintf(
                stderr,
                "%-44s mode %d variant %d m %4d: max abs err %.3g (tol %.0e), rel err %.3g (tol %.0e)%s\n",
                what, mode, variant, m, ea, ta, er, tr, ea <= ta && er <= tr ? "" : "  FAIL");
        cr_assert(ea <= ta && er <= tr, "%s (mode %d, variant %d, m %d): max abs err %g, rel err %g", what,
                  mode, variant, m, ea, er);
    }
    cudaFree(dq);
    cudaFree(dout);
    cudaFree(dseq);
    cudaFree(dpos);
    cudaFree(ws);
    free(q);
    free(got);
    free(got2);
    free(ref);
}

/* The sliding window the next check_config_of gives its cache (kern_cuda_kv_layer.window; 0: none). */
static int test_window;
/* 1: the next check_config_of gives its cache random attention sinks (kern_cuda_kv_layer.sinks). */
static int test_sinks;

/* Random sinks for c's heads, on the host and the device: mostly in the range of the scores, one far above
 * them (the head's output nearly 0) and one far below (no effect). */
static void cache_add_sinks(struct cache *c)
{
    c->sinks = malloc((size_t)c->n_heads * sizeof(float));
    for (int h = 0; h < c->n_heads; h++) c->sinks[h] = 2.0f * frand() + 0.5f;
    c->sinks[0] = 12.0f;
    if (c->n_heads > 1) c->sinks[c->n_heads - 1] = -30.0f;
    c->dev.sinks = dev_upload(c->sinks, (size_t)c->n_heads * sizeof(float));
}

/* Every position of every sequence (a prefill batch), and the last position of each (a decode batch); q8: the
 * device's cache in Q8_0 blocks. */
static void check_config_of(int n_heads, int n_kv, int D, int bs, const int *len, int n_seqs, int q8,
                            const char *what)
{
    struct cache c;
    if (q8)
        cache_init_q8(&c, n_heads, n_kv, D, bs, n_seqs, len);
    else
        cache_init(&c, n_heads, n_kv, D, bs, n_seqs, len);
    c.dev.window = test_window;
    if (test_sinks) cache_add_sinks(&c);
    int total = 0;
    for (int s = 0; s < n_seqs; s++) total += len[s];
    int32_t *seq = malloc(total * 4), *pos = malloc(total * 4);
    int m = 0;
    for (int s = 0; s < n_seqs; s++)
        for (int p = 0; p < len[s]; p++) seq[m] = s, pos[m++] = p;
    char buf[160];
    snprintf(buf, sizeof buf, "%s prefill", what);
    run_case(&c, seq, pos, m, KERN_ATTN_PREFILL, buf);
    snprintf(buf, sizeof buf, "%s prefill-as-decode", what);
    if (m <= 1300) run_case(&c, seq, pos, m, KERN_ATTN_DECODE, buf);
    m = 0;
    for (int s = 0; s < n_seqs; s++) seq[m] = s, pos[m++] = len[s] - 1;
    snprintf(buf, sizeof buf, "%s decode", what);
    run_case(&c, seq, pos, m, KERN_ATTN_DECODE, buf);
    snprintf(buf, sizeof buf, "%s decode-auto", what);
    run_case(&c, seq, pos, m, KERN_ATTN_AUTO, buf);
    snprintf(buf, sizeof buf, "%s decode-as-prefill", what);
    run_case(&c, seq, pos, m, KERN_ATTN_PREFILL, buf);
    free(seq);
    free(pos);
    cache_free(&c);
}

static void check_config(int n_heads, int n_kv, int D, int bs, const int *len, int n_seqs, const char *what)
{
    check_config_of(n_heads, n_kv, D, bs, len, n_seqs, 0, what);
}

static const int lens[] = {1, 7, 64, 129, 1000};

/* The same batches over a Q8_0 cache: every kernel and variant against the dequantized values. */
Test(cuda_attention, q8_cache_every_kernel)
{
    SKIP_WITHOUT_GPU();
    rng_seed(41);
    check_config_of(8, 2, 128, 16, lens, 5, 1, "Q8_0 G=4 D=128 bs=16");
    check_config_of(2, 2, 64, 7, lens, 5, 1, "Q8_0 G=1 D=64 bs=7");
    check_config_of(8, 1, 64, 16, lens, 5, 1, "Q8_0 G=8 D=64 bs=16");
    const int l2[] = {3, 50, 129};
    check_config_of(4, 2, 256, 32, l2, 3, 1, "Q8_0 D=256");
}

/* What a Q8_0 cache refuses: heads not a multiple of 64 wide, an extension, missing scales. */
Test(cuda_attention, q8_cache_bad_arguments)
{
    SKIP_WITHOUT_GPU();
    rng_seed(42);
    const int l[] = {5};
    struct cache c;
    cache_init_q8(&c, 2, 2, 64, 16, 1, l);
    int32_t seq[1] = {0}, pos[1] = {4};
    int32_t *ds = dev_upload(seq, 4), *dp = dev_upload(pos, 4);
    float *dq = dev_poison(2 * 64 * 4), *dout = dev_poison(2 * 64 * 4);
    cr_assert_eq(kern_cuda_attention(dout, dq, &c.dev, ds, dp, 1, 2, 0.125f, 5, KERN_ATTN_AUTO, NULL, 0, 0),
                 FERRY_OK);
    struct kern_cuda_kv_layer bad = c.dev;
    bad.head_dim = 32;
    cr_assert_eq(kern_cuda_attention(dout, dq, &bad, ds, dp, 1, 2, 0.125f, 5, KERN_ATTN_AUTO, NULL, 0, 0),
                 FERRY_ERR_UNSUPPORTED);
    bad = c.dev;
    bad.v_scale = NULL;
    cr_assert_eq(kern_cuda_attention(dout, dq, &bad, ds, dp, 1, 2, 0.125f, 5, KERN_ATTN_AUTO, NULL, 0, 0),
                 FERRY_ERR_INVALID);
    bad = c.dev; /* an extension without its scales */
    bad.n_ext = 1, bad.k_ext = c.dev.k, bad.v_ext = c.dev.v;
    cr_assert_eq(kern_cuda_attention(dout, dq, &bad, ds, dp, 1, 2, 0.125f, 5, KERN_ATTN_AUTO, NULL, 0, 0),
                 FERRY_ERR_INVALID);
    cudaFree(ds);
    cudaFree(dp);
    cudaFree(dq);
    cudaFree(dout);
    cache_free(&c);
}

/* Sliding-window layers (Gemma): windows of 1 position, shorter than a tile, between tiles and longer than
 * most sequences, through the tensor-core (64, 128), tile (32, 96) and decode kernels, every variant. */
Test(cuda_attention, sliding_window, .timeout = 600)
{
    SKIP_WITHOUT_GPU();
    rng_seed(77);
    static const int wl[] = {1, 7, 129, 300};
    static const int windows[] = {1, 5, 64, 100};
    static const int dims[] = {64, 128, 32, 96};
    for (int di = 0; di < 4; di++)
        for (int wi = 0; wi < 4; wi++) {
            char what[64];
            snprintf(what, sizeof what, "window %d D %d", windows[wi], dims[di]);
            test_window = windows[wi];
            check_config(8, 2, dims[di], 16, wl, 4, what);
            test_window = 0;
        }
}

/* Phi-3's shape (tests/golden/models/phi3_fused_bf16): heads of 16, two queries per KV head, a 24-position
 * window that ends inside a tile. */
Test(cuda_attention, sliding_window_head16)
{
    SKIP_WITHOUT_GPU();
    rng_seed(78);
    static const int wl[] = {1, 23, 25, 200};
    test_window = 24;
    check_config(4, 2, 16, 16, wl, 4, "window 24 D 16");
    test_window = 0;
}

/* A sliding-window layers' own pool (runtime/kv_cache.h, as runtime/engine.c keeps it): each sequence,
 * several windows long, holds only the blocks from its window's start less a slack of 0..bs positions (the
 * blocks before it -1 in its table and absent from the pool, which holds just the rest, shuffled). The last
 * `chunk` rows of every sequence (a prefill chunk: the slot's blocks must cover the first row's window), the
 * decode row at each end, and a mixed batch (decode rows of the other sequences, then the first one's chunk)
 * attend through that table in every kernel and variant, against the reference over the window. */
static void check_window_pool(int n_heads, int n_kv, int D, int bs, int window, int chunk, const int *len,
                              int n_seqs, int q8, const char *what)
{
    int *from = malloc(n_seqs * sizeof(int)), dropped = 0;
    for (int s = 0; s < n_seqs; s++) {
        cr_assert(len[s] >= chunk);
        const int f = len[s] - chunk - window + 1 - irand(bs + 1);
        from[s] = f > 0 ? f : 0;
        dropped += from[s] / bs;
    }
    cr_assert_gt(dropped, 0, "%s: the case drops no block", what);
    struct cache c;
    test_from = from;
    if (q8)
        cache_init_q8(&c, n_heads, n_kv, D, bs, n_seqs, len);
    else
        cache_init(&c, n_heads, n_kv, D, bs, n_seqs, len);
    test_from = NULL;
    c.dev.window = window;
    if (test_sinks) cache_add_sinks(&c);
    int total = chunk * n_seqs + n_seqs;
    int32_t *seq = malloc(total * 4), *pos = malloc(total * 4);
    char buf[160];
    int m = 0;
    for (int s = 0; s < n_seqs; s++)
        for (int p = len[s] - chunk; p < len[s]; p++) seq[m] = s, pos[m++] = p;
    snprintf(buf, sizeof buf, "%s window pool: chunks", what);
    run_case(&c, seq, pos, m, KERN_ATTN_PREFILL, buf);
    run_case(&c, seq, pos, m, KERN_ATTN_AUTO, buf);
    m = 0;
    for (int s = 0; s < n_seqs; s++) seq[m] = s, pos[m++] = len[s] - 1;
    snprintf(buf, sizeof buf, "%s window pool: decode", what);
    run_case(&c, seq, pos, m, KERN_ATTN_DECODE, buf);
    run_case(&c, seq, pos, m, KERN_ATTN_AUTO, buf);
    run_case(&c, seq, pos, m, KERN_ATTN_PREFILL, buf);
    m = 0;
    for (int s = 1; s < n_seqs; s++) seq[m] = s, pos[m++] = len[s] - 1;
    for (int p = len[0] - chunk; p < len[0]; p++) seq[m] = 0, pos[m++] = p;
    snprintf(buf, sizeof buf, "%s window pool: mixed", what);
    run_case(&c, seq, pos, m, KERN_ATTN_AUTO, buf);
    free(seq);
    free(pos);
    free(from);
    cache_free(&c);
}

Test(cuda_attention, sliding_window_pool, .timeout = 900)
{
    SKIP_WITHOUT_GPU();
    rng_seed(79);
    test_verbose = 1;
    const int l1[] = {300, 517, 1000}, l2[] = {700, 1500, 385}, l3[] = {60, 200, 77}, l4[] = {1000, 450, 333},
              l5[] = {300, 170}, l6[] = {200, 99}, l7[] = {500};
    check_window_pool(8, 2, 64, 16, 24, 37, l1, 3, 0, "G=4 D=64 bs=16 window 24 chunk 37");
    check_window_pool(8, 1, 128, 16, 128, 64, l2, 3, 0, "G=8 D=128 bs=16 window 128 chunk 64");
    check_window_pool(6, 3, 32, 7, 5, 9, l3, 3, 0, "G=2 D=32 bs=7 window 5 chunk 9");
    check_window_pool(24, 1, 96, 16, 100, 129, l4, 3, 0, "G=24 D=96 bs=16 window 100 chunk 129");
    check_window_pool(4, 2, 80, 32, 33, 1, l5, 2, 0, "G=2 D=80 bs=32 window 33 decode only");
    check_window_pool(4, 2, 16, 16, 24, 7, l6, 2, 0, "G=2 D=16 bs=16 window 24 chunk 7 (phi3)");
    check_window_pool(4, 2, 256, 16, 64, 20, l7, 1, 0, "G=2 D=256 bs=16 window 64 chunk 20");
    const int q1[] = {600, 900}, q2[] = {100, 400};
    check_window_pool(16, 2, 64, 16, 128, 50, q1, 2, 1, "Q8_0 G=8 D=64 window 128 chunk 50");
    check_window_pool(8, 2, 128, 7, 17, 3, q2, 2, 1, "Q8_0 G=4 D=128 bs=7 window 17 chunk 3");
    test_sinks = 1; /* gpt-oss: sinks on its 128-position window layers */
    check_window_pool(16, 2, 64, 16, 128, 33, q1, 2, 0, "sinks G=8 D=64 window 128 chunk 33 (gpt-oss)");
    test_sinks = 0;
    test_verbose = 0;
}

Test(cuda_attention, gqa1_d64)
{
    SKIP_WITHOUT_GPU();
    rng_seed(21);
    check_config(2, 2, 64, 16, lens, 5, "G=1 D=64 bs=16");
}

Test(cuda_attention, gqa4_d128)
{
    SKIP_WITHOUT_GPU();
    rng_seed(22);
    check_config(8, 2, 128, 16, lens, 5, "G=4 D=128 bs=16");
}

Test(cuda_attention, gqa8_d64_bs7)
{
    SKIP_WITHOUT_GPU();
    rng_seed(23);
    check_config(8, 1, 64, 7, lens, 5, "G=8 D=64 bs=7");
}

Test(cuda_attention, small_and_wide_heads)
{
    SKIP_WITHOUT_GPU();
    rng_seed(24);
    const int l2[] = {3, 50, 129};
    check_config(8, 4, 8, 7, l2, 3, "stories-like D=8");
    check_config(24, 1, 96, 16, l2, 3, "G=24 D=96");
    check_config(4, 2, 256, 32, l2, 3, "D=256");
}

Test(cuda_attention, long_context_8192)
{
    SKIP_WITHOUT_GPU();
    rng_seed(25);
    const int l3[] = {8192, 7, 1000};
    struct cache c;
    cache_init(&c, 8, 2, 128, 32, 3, l3);
    /* A decode batch: the last token of each sequence. */
    int32_t seq[64], pos[64];
    for (int s = 0; s < 3; s++) seq[s] = s, pos[s] = l3[s] - 1;
    run_case(&c, seq, pos, 3, KERN_ATTN_DECODE, "8192 decode");
    run_case(&c, seq, pos, 1, KERN_ATTN_AUTO, "8192 decode alone");
    /* A mixed batch: a 40-token prefill chunk at the end of the long sequence, interleaved with the others.
     */
    int m = 0;
    for (int i = 0; i < 40; i++) {
        seq[m] = 0, pos[m++] = 8152 + i;
        if (i == 10) seq[m] = 1, pos[m++] = 6;
        if (i == 20) seq[m] = 2, pos[m++] = 999;
    }
    run_case(&c, seq, pos, m, KERN_ATTN_PREFILL, "8192 mixed prefill chunk");
    run_case(&c, seq, pos, m, KERN_ATTN_DECODE, "8192 mixed as decode");
    cache_free(&c);
}

/* What both rope_kv_store tests give it: 5 tokens of (q | k | v) rows of 2 sequences, positions up to 4095,
 * on the host and the device, the CPU's rotated (and by qs scaled) queries, rotated keys and the plain
 * values (the reference). */
struct rope_case {
    int n_heads, n_kv, D, rope_dim, m, qd, kvd, rowlen;
    enum rope_style style;
    struct kern_cuda_q_scale qs;
    int32_t seq[5], pos[5];
    float *qkv, *inv;        /* host inputs */
    float *dqkv, *dinv, *dq; /* device inputs, and the queries' output */
    int32_t *ds, *dp;
    float *q, *k, *v; /* the CPU's (m, qd), (m, kvd), (m, kvd) */
};

/* The CPU's scaling of m query rows at pos (forward_cpu.c's rope step, llm_attn_temp of the hyperparameters
 * that carry qs's temperature). */
static void q_scale_cpu(float *q, const int32_t *pos, int m, int n_heads, int D, int rope_dim,
                        struct kern_cuda_q_scale qs)
{
    const struct llm_hparams hp = {.attn_temp_beta = qs.temp_beta, .attn_temp_len = qs.temp_len};
    for (int i = 0; i < m; i++)
        kern_cpu_q_scale(q + (size_t)i * n_heads * D, 1, n_heads, D, rope_dim, qs.rot,
                         llm_attn_temp(&hp, pos[i]));
}

static void rope_case_init(struct rope_case *r, enum rope_style style, int n_heads, int n_kv, int D,
                           int rope_dim, struct kern_cuda_q_scale qs)
{
    *r = (struct rope_case){.n_heads = n_heads,
                            .n_kv = n_kv,
                            .D = D,
                            .rope_dim = rope_dim,
                            .m = 5,
                            .qd = n_heads * D,
                            .kvd = n_kv * D,
                            .style = style,
                            .qs = qs,
                            .seq = {0, 0, 1, 0, 1},
                            .pos = {0, 17, 8, 4095, 3}};
    const int m = r->m, qd = r->qd, kvd = r->kvd;
    r->rowlen = qd + 2 * kvd;
    r->qkv = host_rand((size_t)m * r->rowlen, -3, 3);
    r->inv = malloc(rope_dim / 2 * sizeof(float));
    kern_cpu_rope_freqs(r->inv, rope_dim, 10000.0f, NULL);
    r->dqkv = dev_upload(r->qkv, (size_t)m * r->rowlen * 4);
    r->dinv = dev_upload(r->inv, rope_dim / 2 * 4);
    r->dq = dev_poison((size_t)m * qd * 4);
    r->ds = dev_upload(r->seq, sizeof r->seq);
    r->dp = dev_upload(r->pos, sizeof r->pos);
    r->q = malloc((size_t)m * qd * 4), r->k = malloc((size_t)m * kvd * 4), r->v = malloc((size_t)m * kvd * 4);
    for (int i = 0; i < m; i++) {
        memcpy(r->q + (size_t)i * qd, r->qkv + (size_t)i * r->rowlen, qd * 4);
        memcpy(r->k + (size_t)i * kvd, r->qkv + (size_t)i * r->rowlen + qd, kvd * 4);
        memcpy(r->v + (size_t)i * kvd, r->qkv + (size_t)i * r->rowlen + qd + kvd, kvd * 4);
    }
    kern_cpu_rope_ref(r->q, r->pos, m, n_heads, D, rope_dim, r->inv, style);
    q_scale_cpu(r->q, r->pos, m, n_heads, D, rope_dim, qs);
    kern_cpu_rope_ref(r->k, r->pos, m, n_kv, D, rope_dim, r->inv, style);
}

/* kern_cuda_rope_kv_store into kv, then the queries against the CPU's (f32, 2e-6 relative: the CPU and GPU
 * may differ in the last bit of a product). */
static void rope_case_run(struct rope_case *r, const struct kern_cuda_kv_layer *kv)
{
    cr_assert_eq(kern_cuda_rope_kv_store(r->dq, r->dqkv, kv, r->ds, r->dp, r->m, r->n_heads, r->rope_dim,
                                         r->dinv, r->style, r->qs, 0),
                 FERRY_OK);
    cr_assert_eq(cudaDeviceSynchronize(), cudaSuccess);
    const size_t nq = (size_t)r->m * r->qd;
    float *gq = malloc(nq * 4);
    dev_download(gq, r->dq, nq * 4);
    for (size_t i = 0; i < nq; i++)
        cr_assert(fabsf(gq[i] - r->q[i]) <= 2e-6f * (1.0f + fabsf(r->q[i])), "q[%zu] %g vs %g", i, gq[i],
                  r->q[i]);
    free(gq);
}

static void rope_case_free(struct rope_case *r)
{
    cudaFree(r->dqkv);
    cudaFree(r->dinv);
    cudaFree(r->dq);
    cudaFree(r->ds);
    cudaFree(r->dp);
    free(r->qkv);
    free(r->inv);
    free(r->q);
    free(r->k);
    free(r->v);
}

/* rope_kv_store on a (q | k | v) row per token: queries as above, keys rotated and rounded to f16 (equal to
 * the f16 of the CPU result or one f16 step away), values rounded to f16 exactly; every other cache row
 * untouched. Both rope styles, a partial rope_dim, GQA. */
static void rope_store_case(enum rope_style style, int n_heads, int n_kv, int D, int rope_dim,
                            struct kern_cuda_q_scale qs)
{
    const int l[] = {4100, 9};
    struct cache c;
    cache_init(&c, n_heads, n_kv, D, 8, 2, l);
    struct rope_case r;
    rope_case_init(&r, style, n_heads, n_kv, D, rope_dim, qs);
    rope_case_run(&r, &c.dev);
    const int kvd = r.kvd;
    const size_t ne = (size_t)c.n_blocks * c.bs * kvd;
    uint16_t *gk = malloc(ne * 2), *gv = malloc(ne * 2);
    dev_download(gk, c.dev.k, ne * 2);
    dev_download(gv, c.dev.v, ne * 2);
    for (int i = 0; i < r.m; i++) {
        uint16_t *ek = (uint16_t *)cache_row(&c, c.k, r.seq[i], r.pos[i], 0);
        uint16_t *ev = (uint16_t *)cache_row(&c, c.v, r.seq[i], r.pos[i], 0);
        const size_t at = (size_t)(ek - c.k);
        for (int e = 0; e < kvd; e++) {
            const uint16_t want = f32_to_f16(r.k[(size_t)i * kvd + e]);
            cr_assert(abs((int)gk[at + e] - (int)want) <= 1, "token %d k[%d]: %04x vs %04x", i, e, gk[at + e],
                      want);
            ek[e] = gk[at + e]; /* accepted: the whole-pool comparison below checks every other row */
            ev[e] = f32_to_f16(r.v[(size_t)i * kvd + e]);
        }
    }
    cr_assert(memcmp(gk, c.k, ne * 2) == 0, "K pool differs from expected");
    cr_assert(memcmp(gv, c.v, ne * 2) == 0, "V pool differs from expected");
    struct kern_cuda_kv_layer bad = c.dev;
    bad.head_dim = 12;
    cr_assert_eq(kern_cuda_rope_kv_store(r.dq, r.dqkv, &bad, r.ds, r.dp, r.m, n_heads, rope_dim, r.dinv,
                                         style, KERN_CUDA_Q_SCALE_NONE, 0),
                 FERRY_ERR_UNSUPPORTED);
    cr_assert_eq(kern_cuda_rope_kv_store(r.dq, r.dqkv, &c.dev, r.ds, r.dp, r.m, n_heads, D + 2, r.dinv, style,
                                         KERN_CUDA_Q_SCALE_NONE, 0),
                 FERRY_ERR_INVALID);
    free(gk);
    free(gv);
    rope_case_free(&r);
    cache_free(&c);
}

Test(cuda_attention, rope_kv_store_rotates_and_writes_the_right_rows)
{
    SKIP_WITHOUT_GPU();
    rng_seed(26);
    const struct kern_cuda_q_scale none = KERN_CUDA_Q_SCALE_NONE;
    rope_store_case(ROPE_STYLE_INTERLEAVED, 4, 2, 16, 16, none);
    rope_store_case(ROPE_STYLE_HALF, 4, 2, 16, 16, none);
    rope_store_case(ROPE_STYLE_HALF, 6, 2, 24, 8, none);
    rope_store_case(ROPE_STYLE_INTERLEAVED, 2, 2, 128, 64, none);
}

/* rope_kv_store into a Q8_0 cache: queries as with f16; each written key block is llama.cpp's quantization of
 * the CPU-rotated keys (a code may move by one and the scale by one f16 step where the rotation's last bit
 * differs), each value block exactly its quantization; every other row of both planes untouched. */
static void rope_store_q8_case(enum rope_style style, int n_heads, int n_kv, int D, int rope_dim,
                               struct kern_cuda_q_scale qs)
{
    const int l[] = {4100, 9};
    struct cache c;
    cache_init_q8(&c, n_heads, n_kv, D, 8, 2, l);
    struct rope_case r;
    rope_case_init(&r, style, n_heads, n_kv, D, rope_dim, qs);
    const int kvd = r.kvd;
    const size_t ne = (size_t)c.n_blocks * c.bs * kvd;
    int8_t *code0[2] = {malloc(ne), malloc(ne)}, *code1[2] = {malloc(ne), malloc(ne)};
    uint16_t *sc0[2] = {malloc(ne / 16), malloc(ne / 16)}, *sc1[2] = {malloc(ne / 16), malloc(ne / 16)};
    void *dcode[2] = {c.dev.k, c.dev.v}, *dsc[2] = {c.dev.k_scale, c.dev.v_scale};
    for (int kv = 0; kv < 2; kv++)
        dev_download(code0[kv], dcode[kv], ne), dev_download(sc0[kv], dsc[kv], ne / 16);
    rope_case_run(&r, &c.dev);
    for (int kv = 0; kv < 2; kv++)
        dev_download(code1[kv], dcode[kv], ne), dev_download(sc1[kv], dsc[kv], ne / 16);
    for (int i = 0; i < r.m; i++) {
        const size_t at =
            (size_t)(cache_row(&c, c.k, r.seq[i], r.pos[i], 0) - c.k); /* the row's first element */
        for (int kv = 0; kv < 2; kv++)
            for (int b = 0; b < kvd / 32; b++) {
                int8_t want[32];
                uint16_t ws;
                q8_quantize32((kv ? r.v : r.k) + (size_t)i * kvd + b * 32, want, &ws);
                const size_t e0 = at + (size_t)b * 32;
                const int ds_ = abs((int)sc1[kv][e0 / 32] - (int)ws);
                cr_assert(kv ? ds_ == 0 : ds_ <= 1, "token %d %s block %d: scale %04x vs %04x", i,
                          kv ? "v" : "k", b, sc1[kv][e0 / 32], ws);
                for (int e = 0; e < 32; e++) {
                    const int dc = abs((int)code1[kv][e0 + e] - (int)want[e]);
                    cr_assert(kv ? dc == 0 : dc <= 1, "token %d %s[%d]: code %d vs %d", i, kv ? "v" : "k",
                              b * 32 + e, code1[kv][e0 + e], want[e]);
                    code0[kv][e0 + e] =
                        code1[kv][e0 + e]; /* accepted: the comparison below checks the rest */
                }
                sc0[kv][e0 / 32] = sc1[kv][e0 / 32];
            }
    }
    for (int kv = 0; kv < 2; kv++) {
        cr_assert(memcmp(code0[kv], code1[kv], ne) == 0, "%s codes differ outside the written rows",
                  kv ? "V" : "K");
        cr_assert(memcmp(sc0[kv], sc1[kv], ne / 16) == 0, "%s scales differ outside the written rows",
                  kv ? "V" : "K");
    }
    rope_case_free(&r);
    for (int kv = 0; kv < 2; kv++) free(code0[kv]), free(code1[kv]), free(sc0[kv]), free(sc1[kv]);
    cache_free(&c);
}

Test(cuda_attention, rope_kv_store_quantizes_into_a_q8_cache)
{
    SKIP_WITHOUT_GPU();
    rng_seed(43);
    const struct kern_cuda_q_scale none = KERN_CUDA_Q_SCALE_NONE;
    rope_store_q8_case(ROPE_STYLE_INTERLEAVED, 4, 2, 64, 64, none);
    rope_store_q8_case(ROPE_STYLE_HALF, 4, 2, 64, 64, none);
    rope_store_q8_case(ROPE_STYLE_HALF, 8, 2, 128, 96, none);
    rope_store_q8_case(ROPE_STYLE_INTERLEAVED, 2, 2, 128, 64, none);
}

/* The queries' rotary factor on the rotated dims and the temperature per position (original context 7:
 * the five positions give floor(pos / 7) = 0, 2, 1, 585, 0), each alone and both, against the CPU's scaling;
 * keys and values stored as without them. Partial rotary at odd head counts. */
Test(cuda_attention, rope_kv_store_scales_the_queries)
{
    SKIP_WITHOUT_GPU();
    rng_seed(27);
    const struct kern_cuda_q_scale qs[] = {{1.37f, 0.0f, 0}, {1.0f, 0.3f, 7}, {1.2113f, 0.1f, 7}};
    for (int i = 0; i < 3; i++) {
        rope_store_case(ROPE_STYLE_HALF, 5, 1, 24, 16, qs[i]);
        rope_store_case(ROPE_STYLE_INTERLEAVED, 3, 3, 40, 24, qs[i]);
        rope_store_q8_case(ROPE_STYLE_HALF, 7, 1, 64, 48, qs[i]);
        rope_store_q8_case(ROPE_STYLE_INTERLEAVED, 3, 3, 96, 96, qs[i]);
    }
    /* A temperature needs its original context; a rotary factor must be finite. */
    struct rope_case r;
    const int l[] = {4100, 9};
    struct cache c;
    cache_init(&c, 2, 2, 16, 8, 2, l);
    rope_case_init(&r, ROPE_STYLE_HALF, 2, 2, 16, 16, KERN_CUDA_Q_SCALE_NONE);
    const struct kern_cuda_q_scale bad[] = {{1.0f, 0.1f, 0}, {NAN, 0.0f, 0}, {INFINITY, 0.0f, 0}};
    for (int i = 0; i < 3; i++) {
        cr_assert_eq(kern_cuda_rope_kv_store(r.dq, r.dqkv, &c.dev, r.ds, r.dp, r.m, 2, 16, r.dinv,
                                             ROPE_STYLE_HALF, bad[i], 0),
                     FERRY_ERR_INVALID);
        cr_assert_eq(kern_cuda_rope_q(r.dq, r.dqkv, r.dp, r.m, 2, 16, 16, r.dinv, ROPE_STYLE_HALF, bad[i], 0),
                     FERRY_ERR_INVALID);
    }
    rope_case_free(&r);
    cache_free(&c);
}

/* The pool's extension (kern_cuda_kv_layer.k_ext): the same cache with its upper blocks moved to pinned,
 * mapped host memory gives bitwise the same attention through every kernel (decode, SIMT tile, tensor-core
 * prefill), and rope_kv_store writes the same rows into it; q8: a Q8_0 cache, whose extension holds codes and
 * scales (k_ext_scale) as the pool does. */
static void ext_case(int n_heads, int n_kv, int D, int bs, const int *len, int n_seqs, int q8)
{
    struct cache c;
    if (q8)
        cache_init_q8(&c, n_heads, n_kv, D, bs, n_seqs, len);
    else
        cache_init(&c, n_heads, n_kv, D, bs, n_seqs, len);
    const size_t blk_el = (size_t)bs * n_kv * D;
    const int n_ext = c.n_blocks / 2 + 1, n_main = c.n_blocks - n_ext;
    /* The planes: K, V (f16 or codes), then for q8 the K and V scales; bytes of one block of each. */
    const int n_planes = q8 ? 4 : 2;
    void *whole[4] = {c.dev.k, c.dev.v, c.dev.k_scale, c.dev.v_scale};
    const size_t per_blk[4] = {blk_el * (q8 ? 1 : 2), blk_el * (q8 ? 1 : 2), blk_el / 32 * 2,
                               blk_el / 32 * 2};
    char *host[4] = {0}, *devp[4] = {0};
    void *host_dev[4] = {0};
    for (int i = 0; i < n_planes; i++) {
        CU_OK(cudaHostAlloc((void **)&host[i], (size_t)n_ext * per_blk[i], cudaHostAllocMapped));
        CU_OK(cudaMemcpy(host[i], (char *)whole[i] + (size_t)n_main * per_blk[i], (size_t)n_ext * per_blk[i],
                         cudaMemcpyDeviceToHost));
        CU_OK(cudaHostGetDevicePointer(&host_dev[i], host[i], 0));
        /* The device part holds only the first n_main blocks: poison the rest of the device arrays. */
        devp[i] = dev_alloc((size_t)c.n_blocks * per_blk[i]);
        CU_OK(cudaMemset(devp[i], 0xFF, (size_t)c.n_blocks * per_blk[i]));
        CU_OK(cudaMemcpy(devp[i], whole[i], (size_t)n_main * per_blk[i], cudaMemcpyDeviceToDevice));
    }
    struct kern_cuda_kv_layer ext = c.dev;
    ext.n_ext = n_ext;
    ext.k = devp[0], ext.v = devp[1], ext.k_ext = host_dev[0], ext.v_ext = host_dev[1];
    if (q8) {
        ext.k_scale = (uint16_t *)devp[2], ext.v_scale = (uint16_t *)devp[3];
        ext.k_ext_scale = host_dev[2], ext.v_ext_scale = host_dev[3];
    }

    int total = 0;
    for (int s = 0; s < n_seqs; s++) total += len[s];
    int32_t *seq = malloc(total * 4), *pos = malloc(total * 4);
    const float scale = 1.0f / sqrtf((float)D);
    for (int batch = 0; batch < 2; batch++) { /* every position (prefill), then the last ones (decode) */
        int m = 0, max_len = 0;
        for (int s = 0; s < n_seqs; s++)
            for (int p = batch ? len[s] - 1 : 0; p < len[s]; p++) seq[m] = s, pos[m++] = p;
        for (int i = 0; i < m; i++) max_len = pos[i] + 1 > max_len ? pos[i] + 1 : max_len;
        const size_t nq = (size_t)m * n_heads * D;
        float *q = host_rand(nq, -1, 1), *a = malloc(nq * 4), *b = malloc(nq * 4);
        float *dq = dev_upload(q, nq * 4), *dout = dev_poison(nq * 4);
        int32_t *dseq = dev_upload(seq, m * 4), *dpos = dev_upload(pos, m * 4);
        const size_t wsb = kern_cuda_attention_ws_size(m, n_heads, D, max_len);
        void *ws = dev_alloc(wsb);
        CU_OK(cudaMemset(ws, 0, wsb ? wsb : 16));
        const enum kern_cuda_attn_mode modes[] = {KERN_ATTN_AUTO, KERN_ATTN_PREFILL, KERN_ATTN_DECODE};
        for (int mi = 0; mi < 3; mi++)
            for (int variant = 0; variant < 3; variant++) { /* default; tile kernel only; SIMT prefill */
                kern_cuda_attention_set_decode_heads(variant == 1 ? -1 : 0);
                kern_cuda_attention_set_prefill_mma(variant == 2 ? 0 : 1);
                for (int e = 0; e < 2; e++) {
                    CU_OK(cudaMemset(dout, 0xFF, nq * 4));
                    cr_assert_eq(kern_cuda_attention(dout, dq, e ? &ext : &c.dev, dseq, dpos, m, n_heads,
                                                     scale, max_len, modes[mi], ws, wsb, 0),
                                 FERRY_OK);
                    dev_download(e ? b : a, dout, nq * 4);
                }
                kern_cuda_attention_set_decode_heads(0);
                kern_cuda_attention_set_prefill_mma(1);
                cr_assert(memcmp(a, b, nq * 4) == 0,
                          "q8 %d D %d bs %d m %d mode %d variant %d: the extension differs", q8, D, bs, m,
                          modes[mi], variant);
            }
        cudaFree(dq);
        cudaFree(dout);
        cudaFree(dseq);
        cudaFree(dpos);
        cudaFree(ws);
        free(q);
        free(a);
        free(b);
    }
    /* rope_kv_store: the last position of each sequence written through both views. */
    const int m = n_seqs, rowlen = (n_heads + 2 * n_kv) * D;
    for (int s = 0; s < n_seqs; s++) seq[s] = s, pos[s] = len[s] - 1;
    float *qkv = host_rand((size_t)m * rowlen, -3, 3), *inv = malloc(D / 2 * sizeof(float));
    kern_cpu_rope_freqs(inv, D, 10000.0f, NULL);
    float *dqkv = dev_upload(qkv, (size_t)m * rowlen * 4), *dinv = dev_upload(inv, D / 2 * 4);
    float *dq = dev_poison((size_t)m * n_heads * D * 4);
    int32_t *dseq = dev_upload(seq, m * 4), *dpos = dev_upload(pos, m * 4);
    cr_assert_eq(kern_cuda_rope_kv_store(dq, dqkv, &c.dev, dseq, dpos, m, n_heads, D, dinv, ROPE_STYLE_HALF,
                                         KERN_CUDA_Q_SCALE_NONE, 0),
                 FERRY_OK);
    cr_assert_eq(kern_cuda_rope_kv_store(dq, dqkv, &ext, dseq, dpos, m, n_heads, D, dinv, ROPE_STYLE_HALF,
                                         KERN_CUDA_Q_SCALE_NONE, 0),
                 FERRY_OK);
    CU_OK(cudaDeviceSynchronize());
    for (int i = 0; i < n_planes; i++) {
        const size_t bytes = (size_t)c.n_blocks * per_blk[i], lo = (size_t)n_main * per_blk[i];
        char *full = malloc(bytes), *part = malloc(bytes);
        dev_download(full, whole[i], bytes);
        dev_download(part, devp[i], lo);
        memcpy(part + lo, host[i], bytes - lo);
        cr_assert(memcmp(full, part, bytes) == 0, "plane %d: the rows written through the extension differ",
                  i);
        free(full);
        free(part);
    }
    struct kern_cuda_kv_layer bad = ext;
    bad.k_ext = NULL;
    cr_assert_eq(kern_cuda_rope_kv_store(dq, dqkv, &bad, dseq, dpos, m, n_heads, D, dinv, ROPE_STYLE_HALF,
                                         KERN_CUDA_Q_SCALE_NONE, 0),
                 FERRY_ERR_INVALID);
    if (q8) {
        bad = ext;
        bad.v_ext_scale = NULL;
        cr_assert_eq(kern_cuda_rope_kv_store(dq, dqkv, &bad, dseq, dpos, m, n_heads, D, dinv, ROPE_STYLE_HALF,
                                             KERN_CUDA_Q_SCALE_NONE, 0),
                     FERRY_ERR_INVALID);
    }
    cudaFree(dqkv);
    cudaFree(dinv);
    cudaFree(dq);
    cudaFree(dseq);
    cudaFree(dpos);
    for (int i = 0; i < n_planes; i++) {
        cudaFree(devp[i]);
        cudaFreeHost(host[i]);
    }
    free(qkv);
    free(inv);
    free(seq);
    free(pos);
    cache_free(&c);
}

Test(cuda_attention, extension_in_host_memory_reads_and_writes_like_the_pool)
{
    SKIP_WITHOUT_GPU();
    rng_seed(41);
    const int l1[] = {1, 37, 300};
    ext_case(8, 2, 64, 16, l1, 3, 0);
    const int l2[] = {129, 5};
    ext_case(12, 4, 128, 7, l2, 2, 0);
    const int l3[] = {40};
    ext_case(6, 6, 24, 16, l3, 1, 0);
}

Test(cuda_attention, q8_extension_in_host_memory_reads_and_writes_like_the_pool)
{
    SKIP_WITHOUT_GPU();
    rng_seed(43);
    const int l1[] = {1, 37, 300};
    ext_case(8, 2, 64, 16, l1, 3, 1);
    const int l2[] = {129, 5};
    ext_case(12, 4, 128, 7, l2, 2, 1);
    const int l3[] = {70};
    ext_case(4, 4, 64, 5, l3, 1, 1);
}

Test(cuda_attention, reference_matches_cpu_oracle)
{
    rng_seed(27);
    const int l[] = {1, 40, 129};
    struct cache c;
    cache_init_host(&c, 8, 2, 16, 7, 3, l);
    const size_t ne = (size_t)c.n_blocks * c.bs * c.n_kv * c.D;
    float *k32 = malloc(ne * 4), *v32 = malloc(ne * 4);
    for (size_t i = 0; i < ne; i++) {
        k32[i] = f16_to_f32(c.k[i]);
        v32[i] = f16_to_f32(c.v[i]);
    }
    struct kv_layer_view view = {k32,    v32, c.n_blocks, c.bs, c.bt, c.max_blocks,
                                 c.n_kv, c.D, 0,          0,    NULL, NULL};
    int32_t seq[8] = {0, 1, 1, 2, 2, 1, 2, 2}, pos[8] = {0, 0, 39, 0, 128, 20, 64, 100};
    const int m = 8;
    const size_t nq = (size_t)m * c.n_heads * c.D;
    float *q = host_rand(nq, -1, 1), *cpu = malloc(nq * 4);
    double *ref = malloc(nq * 8);
    ref_attention(ref, q, &c, seq, pos, m, 0.25f);
    kern_cpu_attention_ref(cpu, q, &view, seq, pos, m, c.n_heads, 0.25f);
    double e = max_abs_err(cpu, ref, nq);
    cr_assert(e <= 1e-6, "local ref vs kern_cpu_attention_ref max abs err %g", e);
    free(k32);
    free(v32);
    free(q);
    free(cpu);
    free(ref);
    free(c.len);
    free(c.bt);
    free(c.k);
    free(c.v);
}

/* The runtime sizes one workspace for its largest batch (e.g. 512 tokens) and decodes single tokens with it:
 * the size must cover every smaller batch, and a one-token decode at long context must get splits. */
Test(cuda_attention, ws_size_covers_smaller_batches)
{
    SKIP_WITHOUT_GPU();
    const int shapes[3][3] = {{32, 128, 8192}, {32, 128, 4096}, {8, 64, 2048}};
    for (int si = 0; si < 3; si++) {
        const int nh = shapes[si][0], D = shapes[si][1], len = shapes[si][2];
        const size_t big = kern_cuda_attention_ws_size(512, nh, D, len);
        cr_assert(kern_cuda_attention_ws_size(1, nh, D, len) > 0, "no splits for one token at %d", len);
        for (int m = 1; m <= 512; m++) {
            const size_t s = kern_cuda_attention_ws_size(m, nh, D, len);
            cr_assert(s <= big, "ws_size(%d) = %zu > ws_size(512) = %zu", m, s, big);
            cr_assert(s >= kern_cuda_attention_ws_size(m > 1 ? m - 1 : 1, nh, D, len), "not monotone at %d",
                      m);
        }
    }
}

/* One workspace, zero-filled once, shared by many calls of different shapes without a synchronisation between
 * them (the runtime's pattern): each call's output must be bitwise the one it gave alone. A counter left
 * non-zero would make a later call merge early (wrong output) or never (NaN poison left). */
Test(cuda_attention, workspace_reused_by_many_calls)
{
    SKIP_WITHOUT_GPU();
    rng_seed(28);
    const int l[] = {8192, 300, 1000};
    struct cache c;
    cache_init(&c, 8, 2, 128, 16, 3, l);
    enum { NB = 4 };
    int32_t seq[NB][48], pos[NB][48];
    const int m[NB] = {1, 3, 40, 16};
    const enum kern_cuda_attn_mode mode[NB] = {KERN_ATTN_DECODE, KERN_ATTN_DECODE, KERN_ATTN_PREFILL,
                                               KERN_ATTN_AUTO};
    for (int i = 0; i < 48; i++) {
        seq[0][i] = 0, pos[0][i] = 8191;
        seq[1][i] = i % 3, pos[1][i] = l[i % 3] - 1;
        seq[2][i] = 0, pos[2][i] = 8100 + i;
        seq[3][i] = i % 3, pos[3][i] = l[i % 3] - 1 - i;
    }
    const int nh = 8, D = 128;
    const size_t wsb = kern_cuda_attention_ws_size(48, nh, D, 8192);
    cr_assert(wsb > 0);
    void *ws = dev_alloc(wsb);
    CU_OK(cudaMemset(ws, 0, wsb));
    float *dq = dev_alloc((size_t)48 * nh * D * 4), *dout[NB], *want[NB],
          *got = malloc((size_t)48 * nh * D * 4);
    float *hq = host_rand((size_t)48 * nh * D, -1, 1);
    CU_OK(cudaMemcpy(dq, hq, (size_t)48 * nh * D * 4, cudaMemcpyHostToDevice));
    int32_t *ds[NB], *dp[NB];
    for (int b = 0; b < NB; b++) {
        ds[b] = dev_upload(seq[b], sizeof seq[b]);
        dp[b] = dev_upload(pos[b], sizeof pos[b]);
        dout[b] = dev_poison((size_t)m[b] * nh * D * 4);
        want[b] = malloc((size_t)m[b] * nh * D * 4);
        /* Alone, then checked against the reference. */
        cr_assert_eq(kern_cuda_attention(dout[b], dq, &c.dev, ds[b], dp[b], m[b], nh, 0.0884f, 8192, mode[b],
                                         ws, wsb, 0),
                     FERRY_OK);
        dev_download(want[b], dout[b], (size_t)m[b] * nh * D * 4);
        double *ref = malloc((size_t)m[b] * nh * D * 8);
        ref_attention(ref, hq, &c, seq[b], pos[b], m[b], 0.0884f);
        const double ea = max_abs_err(want[b], ref, (size_t)m[b] * nh * D);
        cr_assert(ea <= (mode_uses_mma(D, mode[b], m[b]) ? MMA_ABS : F32_ABS),
                  "batch %d alone: max abs err %g", b, ea);
        free(ref);
    }
    /* 40 calls back to back on one stream, the batch kinds interleaved; outputs poisoned before each round.
     */
    for (int round = 0; round < 10; round++) {
        for (int b = 0; b < NB; b++) CU_OK(cudaMemset(dout[b], 0xFF, (size_t)m[b] * nh * D * 4));
        for (int b = 0; b < NB; b++)
            cr_assert_eq(kern_cuda_attention(dout[b], dq, &c.dev, ds[b], dp[b], m[b], nh, 0.0884f, 8192,
                                             mode[b], ws, wsb, 0),
                         FERRY_OK);
        for (int b = 0; b < NB; b++) {
            dev_download(got, dout[b], (size_t)m[b] * nh * D * 4);
            cr_assert(memcmp(got, want[b], (size_t)m[b] * nh * D * 4) == 0, "round %d batch %d differs",
                      round, b);
        }
    }
    /* A CUDA graph of the four calls, replayed three times. */
    cudaStream_t st;
    CU_OK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    cudaGraph_t gr;
    cudaGraphExec_t ge;
    CU_OK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
    for (int b = 0; b < NB; b++)
        cr_assert_eq(kern_cuda_attention(dout[b], dq, &c.dev, ds[b], dp[b], m[b], nh, 0.0884f, 8192, mode[b],
                                         ws, wsb, st),
                     FERRY_OK);
    CU_OK(cudaStreamEndCapture(st, &gr));
    CU_OK(cudaGraphInstantiate(&ge, gr, 0));
    for (int rep = 0; rep < 3; rep++) {
        for (int b = 0; b < NB; b++) CU_OK(cudaMemset(dout[b], 0xFF, (size_t)m[b] * nh * D * 4));
        CU_OK(cudaGraphLaunch(ge, st));
        CU_OK(cudaStreamSynchronize(st));
        for (int b = 0; b < NB; b++) {
            dev_download(got, dout[b], (size_t)m[b] * nh * D * 4);
            cr_assert(memcmp(got, want[b], (size_t)m[b] * nh * D * 4) == 0,
                      "graph replay %d batch %d differs", rep, b);
        }
    }
    CU_OK(cudaGraphExecDestroy(ge));
    CU_OK(cudaGraphDestroy(gr));
    CU_OK(cudaStreamDestroy(st));
    for (int b = 0; b < NB; b++) {
        cudaFree(ds[b]);
        cudaFree(dp[b]);
        cudaFree(dout[b]);
        free(want[b]);
    }
    cudaFree(dq);
    cudaFree(ws);
    free(hq);
    free(got);
    cache_free(&c);
}

/* Split counts from 1 to many: the same one-token decode at 5000 positions with workspaces from too small for
 * any split (16 bytes) through a few splits to the full size, and MHA / GQA 4 / GQA 8 (the decode kernel's
 * row counts 1, 4, 8). Block size 4: 1250 block ids in one split (the decode kernel reads each one step ahead
 * of its copy). */
Test(cuda_attention, split_counts_one_to_many)
{
    SKIP_WITHOUT_GPU();
    rng_seed(29);
    const int shapes[4][3] = {{4, 4, 16}, {8, 2, 16}, {8, 1, 16}, {4, 2, 4}};
    for (int si = 0; si < 4; si++) {
        const int l[] = {5000};
        struct cache c;
        cache_init(&c, shapes[si][0], shapes[si][1], 128, shapes[si][2], 1, l);
        const int nh = c.n_heads, D = 128;
        int32_t seq[1] = {0}, pos[1] = {4999};
        float *hq = host_rand((size_t)nh * D, -1, 1), *got = malloc((size_t)nh * D * 4);
        double *ref = malloc((size_t)nh * D * 8);
        ref_attention(ref, hq, &c, seq, pos, 1, 0.0884f);
        float *dq = dev_upload(hq, (size_t)nh * D * 4), *dout = dev_alloc((size_t)nh * D * 4);
        int32_t *ds = dev_upload(seq, 4), *dp = dev_upload(pos, 4);
        const size_t full = kern_cuda_attention_ws_size(1, nh, D, 5000);
        void *ws = dev_alloc(full);
        CU_OK(cudaMemset(ws, 0, full));
        const size_t per = (size_t)nh * (D + 2) * 4; /* one split's partials of a one-token batch */
        const size_t sizes[] = {16, 16384 + per, 16384 + 2 * per, 16384 + 3 * per + 8, full / 2, full};
        for (int k = 0; k < 6; k++)
            for (int tile = 0; tile < 2; tile++) {
                CU_OK(cudaMemset(dout, 0xFF, (size_t)nh * D * 4));
                kern_cuda_attention_set_decode_heads(tile ? -1 : 0);
                const int rc = kern_cuda_attention(dout, dq, &c.dev, ds, dp, 1, nh, 0.0884f, 5000,
                                                   KERN_ATTN_DECODE, ws, sizes[k], 0);
                kern_cuda_attention_set_decode_heads(0);
                cr_assert_eq(rc, FERRY_OK);
                dev_download(got, dout, (size_t)nh * D * 4);
                const double ea = max_abs_err(got, ref, (size_t)nh * D),
                             er = rel_err(got, ref, (size_t)nh * D);
                cr_assert(ea <= F32_ABS && er <= F32_REL,
                          "shape %d ws %zu bytes tile %d: max abs err %g rel %g", si, sizes[k], tile, ea, er);
            }
        cudaFree(dq);
        cudaFree(dout);
        cudaFree(ds);
        cudaFree(dp);
        cudaFree(ws);
        free(hq);
        free(got);
        free(ref);
        cache_free(&c);
    }
}

/* ---- The tensor-core prefill kernel: chunks of odd lengths at odd start positions, mixed batches ---- */

struct pf_report {
    int n_cases, n_fail;
    double worst; /* worst error relative to its tolerance */
    char worst_what[400];
};

/* Row i of (seq) is the only row of its sequence among its neighbours (the device's routing rule). */
static int row_single(const int32_t *seq, int m, int i)
{
    return (i == 0 || seq[i - 1] != seq[i]) && (i == m - 1 || seq[i + 1] != seq[i]);
}

/* The batch of a prefill case: a chunk of `chunk` rows of sequence 0 at positions start .. start+chunk-1 and
 * the last position of each of n_dec other sequences (lengths from dlen), decode rows first (order 0), last
 * (1) or inside the chunk (2). seq, pos: (m) allocated here; sl (1 + n_dec) sequence lengths; n_lead: the
 * leading decode rows (kern_cuda_attention_mixed's n_decode). */
struct pf_batch {
    int n_seq, m, n_lead;
    int sl[8];
    int32_t *seq, *pos;
};

static void pf_batch_init(struct pf_batch *b, int chunk, int start, int n_dec, int order)
{
    static const int dlen[] = {1000, 1, 129, 50, 700, 3, 64};
    b->n_seq = 1 + n_dec;
    b->sl[0] = start + chunk;
    for (int d = 0; d < n_dec; d++) b->sl[1 + d] = dlen[d];
    b->m = chunk + n_dec;
    b->seq = malloc((size_t)b->m * 4), b->pos = malloc((size_t)b->m * 4);
    int32_t *seq = b->seq, *pos = b->pos;
    int k = 0, next_dec = 0;
    if (order == 0)
        for (; next_dec < n_dec; next_dec++) seq[k] = 1 + next_dec, pos[k++] = b->sl[1 + next_dec] - 1;
    for (int j = 0; j < chunk; j++) {
        if (order == 2 && next_dec < n_dec && j == (next_dec + 1) * chunk / (n_dec + 1))
            seq[k] = 1 + next_dec, pos[k++] = b->sl[1 + next_dec] - 1, next_dec++;
        seq[k] = 0, pos[k++] = start + j;
    }
    for (; next_dec < n_dec; next_dec++) seq[k] = 1 + next_dec, pos[k++] = b->sl[1 + next_dec] - 1;
    b->n_lead = order == 0 ? n_dec : 0;
}

/* One mixed batch: a chunk of `chunk` rows of sequence 0 at positions start .. start+chunk-1 and a decode row
 * (its last position) of each of n_dec other sequences, decode rows first (order 0), last (1) or inside the
 * chunk (2). Run through AUTO, kern_cuda_attention_mixed, PREFILL (with and without splits) and AUTO with the
 * tile kernel for decode rows; outputs poisoned with NaN before each call. Rows routed to the decode path are
 * held to the f32 tolerance, the others to the tensor-core one. Failures are printed and counted, not fatal.
 */
static void prefill_case(int D, int G, int bs, int chunk, int start, int n_dec, int order,
                         struct pf_report *rep)
{
    const int n_heads = 8, n_kv = n_heads / G;
    struct pf_batch pb;
    pf_batch_init(&pb, chunk, start, n_dec, order);
    struct cache c;
    cache_init(&c, n_heads, n_kv, D, bs, pb.n_seq, pb.sl);
    const int m = pb.m, n_lead = pb.n_lead;
    int32_t *seq = pb.seq, *pos = pb.pos;

    const size_t rowlen = (size_t)n_heads * D, nq = (size_t)m * rowlen;
    const float scale = 1.0f / sqrtf((float)D);
    float *q = host_rand(nq, -1, 1), *got = malloc(nq * 4), *first = malloc(nq * 4);
    double *ref = malloc(nq * 8);
    ref_attention(ref, q, &c, seq, pos, m, scale);
    int max_len = 0;
    for (int i = 0; i < m; i++) max_len = pos[i] + 1 > max_len ? pos[i] + 1 : max_len;
    float *dq = dev_upload(q, nq * 4), *dout = dev_poison(nq * 4);
    int32_t *dseq = dev_upload(seq, (size_t)m * 4), *dpos = dev_upload(pos, (size_t)m * 4);
    const size_t wsb = kern_cuda_attention_ws_size(m, n_heads, D, max_len);
    void *ws = dev_alloc(wsb);
    CU_OK(cudaMemset(ws, 0, wsb ? wsb : 16));
    static const char *vname[] = {"auto",          "auto again",  "mixed",           "prefill",
                                  "prefill no ws", "mixed no ws", "auto tile-decode"};
    for (int v = 0; v < 7; v++) {
        CU_OK(cudaMemset(dout, 0xFF, nq * 4));
        void *w = v == 4 || v == 5 ? NULL : ws;
        const size_t wb = w ? wsb : 0;
        if (v == 6) kern_cuda_attention_set_decode_heads(-1);
        int rc;
        if (v == 2 || v == 5)
            rc = kern_cuda_attention_mixed(dout, NULL, dq, &c.dev, dseq, dpos, m, n_lead, n_heads, scale,
                                           max_len, w, wb, 0);
        else
            rc = kern_cuda_attention(dout, dq, &c.dev, dseq, dpos, m, n_heads, scale, max_len,
                                     v == 3 || v == 4 ? KERN_ATTN_PREFILL : KERN_ATTN_AUTO, w, wb, 0);
        kern_cuda_attention_set_decode_heads(0);
        char what[256];
        snprintf(what, sizeof what, "D %d G %d bs %d chunk %d start %d n_dec %d order %d m %d: %s", D, G, bs,
                 chunk, start, n_dec, order, m, vname[v]);
        rep->n_cases++;
        if (rc != FERRY_OK) {
            rep->n_fail++;
            fprintf(stderr, "FAIL %s: rc %d\n", what, rc);
            continue;
        }
        dev_download(got, dout, nq * 4);
        if (v == 0) memcpy(first, got, nq * 4);
        if (v == 1 && memcmp(first, got, nq * 4) != 0) {
            rep->n_fail++;
            fprintf(stderr, "FAIL %s: differs from the first run (not deterministic)\n", what);
        }
        /* Worst error over the rows of each path, relative to that path's tolerance. */
        double worst = 0, worst_abs = 0;
        int worst_row = -1, any_mma = 0;
        for (int i = 0; i < m; i++) {
            int dec;
            if (v == 2 || v == 5)
                dec = i < n_lead;
            else if (v == 3 || v == 4)
                dec = 0;
            else
                dec = m <= 16 || row_single(seq, m, i);
            any_mma |= !dec;
            const double e = max_abs_err(got + i * rowlen, ref + i * rowlen, rowlen);
            const double r = e / (dec ? F32_ABS : MMA_ABS);
            if (!(r <= worst)) worst = r, worst_abs = e, worst_row = i;
        }
        const double er = rel_err(got, ref, nq), rr = er / (any_mma ? MMA_REL : F32_REL);
        if (rr > worst) worst = rr;
        if (worst > rep->worst) {
            rep->worst = worst;
            snprintf(rep->worst_what, sizeof rep->worst_what, "%.250s (max abs %g at row %d, rel %g)", what,
                     worst_abs, worst_row, er);
        }
        if (!(worst <= 1.0)) {
            rep->n_fail++;
            fprintf(stderr, "FAIL %s: max abs err %g at row %d (seq %d pos %d), tensor rel err %g\n", what,
                    worst_abs, worst_row, worst_row >= 0 ? seq[worst_row] : -1,
                    worst_row >= 0 ? pos[worst_row] : -1, er);
        }
    }
    cudaFree(dq);
    cudaFree(dout);
    cudaFree(dseq);
    cudaFree(dpos);
    cudaFree(ws);
    free(q);
    free(got);
    free(first);
    free(ref);
    free(seq);
    free(pos);
    cache_free(&c);
}

/* Case idx (0 .. PF_CASES - 1) of the prefill matrix: chunk lengths 1, 7, 64, 255, 300 x start positions 0,
 * 13, 200 x GQA ratios 1, 4, 8 x block sizes 16 and 4, with 0, 3 or 7 decode rows of other sequences
 * (contexts 1 to 1000) before, after or inside the chunk. */
#define PF_CASES 90
static void pf_matrix_case(int idx, int *chunk, int *start, int *G, int *bs, int *n_dec, int *order)
{
    static const int chunks[] = {1, 7, 64, 255, 300}, starts[] = {0, 13, 200}, gs[] = {1, 4, 8},
                     bss[] = {16, 4}, ndec[] = {0, 3, 7};
    *bs = bss[idx % 2];
    *G = gs[idx / 2 % 3];
    *start = starts[idx / 6 % 3];
    *chunk = chunks[idx / 18];
    *n_dec = ndec[idx % 3];
    *order = idx / 3 % 3;
}

static void prefill_matrix(int D)
{
    struct pf_report rep;
    memset(&rep, 0, sizeof rep);
    for (int idx = 0; idx < PF_CASES; idx++) {
        int chunk, start, G, bs, n_dec, order;
        pf_matrix_case(idx, &chunk, &start, &G, &bs, &n_dec, &order);
        prefill_case(D, G, bs, chunk, start, n_dec, order, &rep);
    }
    fprintf(stderr, "prefill D %d: %d runs, %d failed; worst error / tolerance %.3f: %s\n", D, rep.n_cases,
            rep.n_fail, rep.worst, rep.worst_what);
    cr_assert_eq(rep.n_fail, 0, "D %d: %d of %d runs failed (listed above); worst: %s", D, rep.n_fail,
                 rep.n_cases, rep.worst_what);
}

Test(cuda_attention, prefill_chunks_d64, .timeout = 600)
{
    SKIP_WITHOUT_GPU();
    rng_seed(41);
    prefill_matrix(64);
}

Test(cuda_attention, prefill_chunks_d128, .timeout = 600)
{
    SKIP_WITHOUT_GPU();
    rng_seed(42);
    prefill_matrix(128);
}

/* A chunk whose q rows are 6x larger (scores spread over ~+-15: peaked softmax, where P's rounding to f16
 * weighs most) at a long context with splits, against the tensor-core tolerance scaled by 2. */
Test(cuda_attention, prefill_peaked_scores)
{
    SKIP_WITHOUT_GPU();
    rng_seed(43);
    const int l[] = {3000};
    struct cache c;
    cache_init(&c, 8, 2, 128, 16, 1, l);
    const int m = 100;
    int32_t seq[100], pos[100];
    for (int i = 0; i < m; i++) seq[i] = 0, pos[i] = 2900 + i;
    const size_t nq = (size_t)m * 8 * 128;
    float *q = host_rand(nq, -6, 6), *got = malloc(nq * 4);
    double *ref = malloc(nq * 8);
    ref_attention(ref, q, &c, seq, pos, m, 0.0884f);
    float *dq = dev_upload(q, nq * 4), *dout = dev_poison(nq * 4);
    int32_t *ds = dev_upload(seq, sizeof seq), *dp = dev_upload(pos, sizeof pos);
    const size_t wsb = kern_cuda_attention_ws_size(m, 8, 128, 3000);
    void *ws = dev_alloc(wsb);
    CU_OK(cudaMemset(ws, 0, wsb));
    cr_assert_eq(
        kern_cuda_attention(dout, dq, &c.dev, ds, dp, m, 8, 0.0884f, 3000, KERN_ATTN_PREFILL, ws, wsb, 0),
        FERRY_OK);
    dev_download(got, dout, nq * 4);
    const double ea = max_abs_err(got, ref, nq), er = rel_err(got, ref, nq);
    cr_assert(ea <= 2 * MMA_ABS && er <= 2 * MMA_REL, "peaked: max abs err %g rel %g", ea, er);
    cudaFree(dq);
    cudaFree(dout);
    cudaFree(ds);
    cudaFree(dp);
    cudaFree(ws);
    free(q);
    free(got);
    free(ref);
    cache_free(&c);
}

Test(cuda_attention, mixed_bad_arguments)
{
    SKIP_WITHOUT_GPU();
    const int l[] = {10};
    struct cache c;
    cache_init(&c, 2, 2, 64, 16, 1, l);
    float *dq = dev_alloc(2 * 64 * 4), *dout = dev_alloc(2 * 64 * 4);
    int32_t *ds = dev_alloc(4), *dp = dev_alloc(4);
    cr_assert_eq(kern_cuda_attention_mixed(dout, NULL, dq, &c.dev, ds, dp, 1, 2, 2, 0.1f, 10, NULL, 0, 0),
                 FERRY_ERR_INVALID);
    cr_assert_eq(kern_cuda_attention_mixed(dout, NULL, dq, &c.dev, ds, dp, 1, -1, 2, 0.1f, 10, NULL, 0, 0),
                 FERRY_ERR_INVALID);
    cr_assert_eq(kern_cuda_attention_mixed(dout, NULL, dq, &c.dev, ds, dp, 0, 0, 2, 0.1f, 10, NULL, 0, 0),
                 FERRY_OK);
    cudaFree(dq);
    cudaFree(dout);
    cudaFree(ds);
    cudaFree(dp);
    cache_free(&c);
}

/* A few small mixed batches through every tensor-core path (both head_dims, GQA, splits, a window holding
 * several runs): the case tests/gpu/attn_sample.sh runs under compute-sanitizer memcheck and racecheck. */
Test(cuda_attention, mixed_small)
{
    SKIP_WITHOUT_GPU();
    rng_seed(44);
    struct pf_report rep;
    memset(&rep, 0, sizeof rep);
    prefill_case(64, 1, 16, 70, 13, 3, 0, &rep);
    prefill_case(128, 4, 4, 23, 200, 3, 2, &rep);
    prefill_case(128, 8, 16, 9, 0, 7, 1, &rep);
    cr_assert_eq(rep.n_fail, 0, "%d of %d runs failed (listed above); worst: %s", rep.n_fail, rep.n_cases,
                 rep.worst_what);
}

/* The first case the first GPU run failed (every mode, an illegal address soon after): what
 * tests/gpu/attn_sample.sh runs under compute-sanitizer memcheck before anything else. */
Test(cuda_attention, mma_first_failure)
{
    SKIP_WITHOUT_GPU();
    rng_seed(44);
    struct pf_report rep;
    memset(&rep, 0, sizeof rep);
    prefill_case(64, 1, 16, 70, 13, 3, 0, &rep);
    cr_assert_eq(rep.n_fail, 0, "%d of %d runs failed (listed above); worst: %s", rep.n_fail, rep.n_cases,
                 rep.worst_what);
}

/* ---- The tensor-core kernel's host audit: every launch of the GPU tests and bench_attn, no GPU needed ----
 */

struct audit_tally {
    int n_runs, n_split_runs;
    long long n_checked;
};

/* Audits one batch over a cache shaped (n_heads, n_kv, D, bs) with sequences of lengths len: as PREFILL, as
 * kern_cuda_attention_mixed with n_lead leading decode rows (when n_lead > 0) and with AUTO's routing (m >
 * 16); each for a device of 132 SMs x 2 blocks with room for two splits and with no workspace, 132 x 3 with
 * an unbounded workspace (most splits), and 108 x 2 unbounded with max_len 0 (the whole table; chunks as the
 * runtime's calls without a max_len get). stride 2: only the first and third; 4: only the first (the largest
 * batches, to keep the test at a few seconds). */
static void audit_batch(int n_heads, int n_kv, int D, int bs, const int *len, int n_seqs, const int32_t *seq,
                        const int32_t *pos, int m, int n_lead, int stride, const char *what,
                        struct audit_tally *tally)
{
    struct cache c;
    cache_init_table(&c, n_heads, n_kv, D, bs, n_seqs, len);
    struct kern_cuda_kv_layer kv = {.n_blocks = c.n_blocks,
                                    .block_size = bs,
                                    .block_table = c.bt,
                                    .max_blocks = c.max_blocks,
                                    .n_kv_heads = n_kv,
                                    .head_dim = D};
    int max_len = 0;
    for (int i = 0; i < m; i++) max_len = pos[i] + 1 > max_len ? pos[i] + 1 : max_len;
    const int routes[3] = {0, n_lead > 0 ? n_lead : 0, m > 16 ? -1 : 0};
    const size_t two = 16384 + 2 * (size_t)m * n_heads * (D + 2) * 4, unbounded = (size_t)1 << 40;
    const struct {
        int sms, occ;
        size_t ws;
        int max_len;
    } vars[4] = {
        {132, 2, two, max_len}, {132, 2, 0, max_len}, {132, 3, unbounded, max_len}, {108, 2, unbounded, 0}};
    for (int ri = 0; ri < 3; ri++) {
        if (ri > 0 && routes[ri] == 0) continue;
        for (int vi = 0; vi < 4; vi += stride) {
            struct kern_cuda_attn_audit a;
            memset(&a, 0, sizeof a);
            a.n_decode = routes[ri];
            a.ws_bytes = vars[vi].ws;
            a.sms = vars[vi].sms;
            a.occ = vars[vi].occ;
            const int rc =
                kern_cuda_attention_mma_audit(&kv, n_seqs, seq, pos, m, n_heads, vars[vi].max_len, &a);
            cr_assert_eq(rc, FERRY_OK, "%s, n_decode %d, %d SMs x %d, ws %zu, max_len %d: %s (rc %d)", what,
                         a.n_decode, a.sms, a.occ, a.ws_bytes, vars[vi].max_len, a.err, rc);
            tally->n_runs++;
            tally->n_split_runs += a.n_split > 1;
            tally->n_checked += a.n_checked;
        }
    }
    free(c.len);
    free(c.bt);
}

/* Every position of every sequence, or the last position of each. */
static void audit_config(int n_heads, int n_kv, int D, int bs, const int *len, int n_seqs, const char *what,
                         struct audit_tally *tally)
{
    int total = 0;
    for (int s = 0; s < n_seqs; s++) total += len[s];
    int32_t *seq = malloc(total * 4), *pos = malloc(total * 4);
    int m = 0;
    for (int s = 0; s < n_seqs; s++)
        for (int p = 0; p < len[s]; p++) seq[m] = s, pos[m++] = p;
    audit_batch(n_heads, n_kv, D, bs, len, n_seqs, seq, pos, m, 0, 2, what, tally);
    m = 0;
    for (int s = 0; s < n_seqs; s++) seq[m] = s, pos[m++] = len[s] - 1;
    audit_batch(n_heads, n_kv, D, bs, len, n_seqs, seq, pos, m, 0, 1, what, tally);
    free(seq);
    free(pos);
}

Test(cuda_attention, mma_audit_every_shape, .timeout = 300)
{
    struct audit_tally tally;
    memset(&tally, 0, sizeof tally);
    char what[160];
    /* The prefill matrix and mixed_small. */
    for (int D = 64; D <= 128; D += 64)
        for (int idx = 0; idx < PF_CASES; idx++) {
            int chunk, start, G, bs, n_dec, order;
            pf_matrix_case(idx, &chunk, &start, &G, &bs, &n_dec, &order);
            struct pf_batch pb;
            pf_batch_init(&pb, chunk, start, n_dec, order);
            snprintf(what, sizeof what, "D %d G %d bs %d chunk %d start %d n_dec %d order %d", D, G, bs,
                     chunk, start, n_dec, order);
            audit_batch(8, 8 / G, D, bs, pb.sl, pb.n_seq, pb.seq, pb.pos, pb.m, pb.n_lead, D == 128 ? 2 : 1,
                        what, &tally);
            free(pb.seq);
            free(pb.pos);
        }
    static const int small[3][7] = {
        {64, 1, 16, 70, 13, 3, 0}, {128, 4, 4, 23, 200, 3, 2}, {128, 8, 16, 9, 0, 7, 1}};
    for (int i = 0; i < 3; i++) {
        struct pf_batch pb;
        pf_batch_init(&pb, small[i][3], small[i][4], small[i][5], small[i][6]);
        audit_batch(8, 8 / small[i][1], small[i][0], small[i][2], pb.sl, pb.n_seq, pb.seq, pb.pos, pb.m,
                    pb.n_lead, 1, "mixed_small", &tally);
        free(pb.seq);
        free(pb.pos);
    }
    /* check_config's shapes (prefill of every position; decode rows as prefill). */
    audit_config(2, 2, 64, 16, lens, 5, "G=1 D=64 bs=16", &tally);
    audit_config(8, 2, 128, 16, lens, 5, "G=4 D=128 bs=16", &tally);
    audit_config(8, 1, 64, 7, lens, 5, "G=8 D=64 bs=7", &tally);
    /* long_context_8192's mixed chunk, workspace_reused's prefill batch, prefill_peaked_scores. */
    {
        const int l3[] = {8192, 7, 1000};
        int32_t seq[64], pos[64];
        int m = 0;
        for (int i = 0; i < 40; i++) {
            seq[m] = 0, pos[m++] = 8152 + i;
            if (i == 10) seq[m] = 1, pos[m++] = 6;
            if (i == 20) seq[m] = 2, pos[m++] = 999;
        }
        audit_batch(8, 2, 128, 32, l3, 3, seq, pos, m, 0, 2, "8192 mixed prefill chunk", &tally);
        const int l[] = {8192, 300, 1000};
        for (int i = 0; i < 40; i++) seq[i] = 0, pos[i] = 8100 + i;
        audit_batch(8, 2, 128, 16, l, 3, seq, pos, 40, 0, 2, "workspace_reused prefill", &tally);
    }
    {
        const int l[] = {3000};
        int32_t seq[100], pos[100];
        for (int i = 0; i < 100; i++) seq[i] = 0, pos[i] = 2900 + i;
        audit_batch(8, 2, 128, 16, l, 1, seq, pos, 100, 0, 2, "peaked", &tally);
    }
    /* bench_attn: 512-row chunks at 0 and 1536 (Llama-2-7B and Llama-3-8B heads), 32 decode rows + a chunk.
     */
    {
        int32_t *seq = malloc(512 * 4), *pos = malloc(512 * 4);
        for (int start = 0; start <= 1536; start += 1536)
            for (int kv = 32; kv >= 8; kv /= 4) {
                const int l[] = {start + 512};
                for (int i = 0; i < 512; i++) seq[i] = 0, pos[i] = start + i;
                snprintf(what, sizeof what, "bench prefill 512 @%d, 32 heads / %d KV heads", start, kv);
                audit_batch(32, kv, 128, 16, l, 1, seq, pos, 512, 0, 4, what, &tally);
            }
        int l[33];
        for (int s = 0; s < 33; s++) l[s] = 512;
        for (int i = 0; i < 32; i++) seq[i] = i, pos[i] = 511;
        for (int i = 0; i < 256; i++) seq[32 + i] = 32, pos[32 + i] = 256 + i;
        for (int kv = 32; kv >= 8; kv /= 4)
            audit_batch(32, kv, 128, 16, l, 33, seq, pos, 288, 32, 4, "bench mixed", &tally);
        free(seq);
        free(pos);
    }
    fprintf(stderr, "mma audit: %d launches (%d with splits), %lld accesses checked\n", tally.n_runs,
            tally.n_split_runs, tally.n_checked);
    cr_assert(tally.n_split_runs > tally.n_runs / 4, "too few launches with splits: %d of %d",
              tally.n_split_runs, tally.n_runs);
}

/* ---- An attention split by position between the device and the host (runtime: the KV pool's extension) ----
 * Each sequence s is cut at cut[s]: the device attends to positions [0, cut - 1] (pos clamped there, its lse
 * written), the CPU (kern_cpu_attention_range) to [cut, pos], and kern_cuda_attention_merge combines the two.
 * The result is held against the whole attention's reference; the device's lse against the double log-sum-exp
 * of its own range. Mixed batches through the decode kernel and the tensor-core kernel (head_dim 64, 128),
 * and the tile kernel (head_dim 24), with splits (a workspace) and without; cuts at 1 (the device sees
 * position 0 only), inside, and past the end (the host has nothing). */
static void split_case(int D, int G, int bs, int chunk, int start, int n_dec, int with_ws)
{
    const int n_heads = 8, n_kv = n_heads / G;
    struct pf_batch pb;
    pf_batch_init(&pb, chunk, start, n_dec, 0);
    struct cache c;
    cache_init(&c, n_heads, n_kv, D, bs, pb.n_seq, pb.sl);
    const int m = pb.m;
    int32_t *seq = pb.seq, *pos = pb.pos;
    int cut[8];
    for (int s = 0; s < pb.n_seq; s++) cut[s] = s % 3 == 0 ? pb.sl[s] / 2 + 1 : s % 3 == 1 ? 1 : pb.sl[s] + 5;
    int32_t *pos_dev = malloc((size_t)m * 4), *lo = malloc((size_t)m * 4);
    int max_len = 0;
    for (int i = 0; i < m; i++) {
        lo[i] = cut[seq[i]];
        pos_dev[i] = pos[i] < lo[i] - 1 ? pos[i] : lo[i] - 1;
        max_len = pos[i] + 1 > max_len ? pos[i] + 1 : max_len;
    }
    const size_t rowlen = (size_t)n_heads * D, nq = (size_t)m * rowlen, nr = (size_t)m * n_heads;
    const float scale = 1.0f / sqrtf((float)D);
    float *q = host_rand(nq, -1, 1), *got = malloc(nq * 4), *hb = malloc(nq * 4), *lb = malloc(nr * 4),
          *la = malloc(nr * 4);
    double *ref = malloc(nq * 8);
    ref_attention(ref, q, &c, seq, pos, m, scale);
    /* The device part's lse from the double scores. */
    double *lse_ref = malloc(nr * 8);
    for (int i = 0; i < m; i++)
        for (int h = 0; h < n_heads; h++) {
            double sc[1400], mx = -INFINITY, sum = 0;
            for (int p = 0; p <= pos_dev[i]; p++) {
                const uint16_t *kr = cache_row(&c, c.k, seq[i], p, h / G);
                double d = 0;
                for (int e = 0; e < D; e++)
                    d += (double)q[((size_t)i * n_heads + h) * D + e] * f16_to_f32(kr[e]);
                sc[p] = d * scale;
                mx = sc[p] > mx ? sc[p] : mx;
            }
            for (int p = 0; p <= pos_dev[i]; p++) sum += exp(sc[p] - mx);
            lse_ref[(size_t)i * n_heads + h] = mx + log(sum);
        }
    /* The host part on the f32 copy of the same cache. */
    const size_t ne = (size_t)c.n_blocks * c.bs * c.n_kv * c.D;
    float *k32 = malloc(ne * 4), *v32 = malloc(ne * 4);
    for (size_t i = 0; i < ne; i++) k32[i] = f16_to_f32(c.k[i]), v32[i] = f16_to_f32(c.v[i]);
    struct kv_layer_view view = {k32,    v32, c.n_blocks, c.bs, c.bt, c.max_blocks,
                                 c.n_kv, c.D, 0,          0,    NULL, NULL};
    cr_assert_eq(kern_cpu_attention_range(hb, lb, q, &view, seq, lo, pos, m, n_heads, scale, NULL), FERRY_OK);

    float *dq = dev_upload(q, nq * 4), *dout = dev_poison(nq * 4), *dlse = dev_poison(nr * 4);
    float *dhb = dev_upload(hb, nq * 4), *dlb = dev_upload(lb, nr * 4);
    int32_t *dseq = dev_upload(seq, (size_t)m * 4), *dpos = dev_upload(pos_dev, (size_t)m * 4);
    const size_t wsb = with_ws ? kern_cuda_attention_ws_size(m, n_heads, D, max_len) : 0;
    void *ws = wsb ? dev_alloc(wsb) : NULL;
    if (ws) CU_OK(cudaMemset(ws, 0, wsb));
    cr_assert_eq(kern_cuda_attention_mixed(dout, dlse, dq, &c.dev, dseq, dpos, m, pb.n_lead, n_heads, scale,
                                           max_len, ws, wsb, 0),
                 FERRY_OK);
    dev_download(la, dlse, nr * 4);
    cr_assert_eq(kern_cuda_attention_merge(dout, dlse, dhb, dlb, (int)nr, D, 0), FERRY_OK);
    dev_download(got, dout, nq * 4);
    char what[160];
    snprintf(what, sizeof what, "D %d G %d bs %d chunk %d start %d n_dec %d ws %d", D, G, bs, chunk, start,
             n_dec, with_ws);
    double wl = 0;
    for (size_t r = 0; r < nr; r++) wl = fmax(wl, fabs(la[r] - lse_ref[r]));
    cr_assert(wl <= 2e-3, "%s: device lse max abs err %g", what, wl);
    const double ea = max_abs_err(got, ref, nq), er = rel_err(got, ref, nq);
    cr_assert(ea <= MMA_ABS && er <= MMA_REL, "%s: merged max abs err %g rel %g", what, ea, er);
    cudaFree(dq);
    cudaFree(dout);
    cudaFree(dlse);
    cudaFree(dhb);
    cudaFree(dlb);
    cudaFree(dseq);
    cudaFree(dpos);
    if (ws) cudaFree(ws);
    free(q), free(got), free(hb), free(lb), free(la), free(ref), free(lse_ref), free(k32), free(v32),
        free(pos_dev), free(lo), free(pb.seq), free(pb.pos);
    cache_free(&c);
}

Test(cuda_attention, split_by_position_merges_into_the_whole_attention)
{
    SKIP_WITHOUT_GPU();
    rng_seed(44);
    for (int ws = 0; ws < 2; ws++) {
        split_case(128, 1, 16, 64, 200, 4, ws);
        split_case(64, 4, 16, 37, 13, 6, ws);
        split_case(128, 8, 4, 1, 0, 5, ws);  /* decode rows only (a one-row "chunk" is a decode row too) */
        split_case(24, 2, 7, 20, 30, 3, ws); /* the tile kernel for both */
    }
}

/* ---- attention sinks (gpt-oss) and wide heads (Gemma 4) ---- */

/* The local reference with sinks, with and without a window, against the CPU oracle
 * kern_cpu_attention_sinks_ref (same cache, f32 elements holding the f16 values); no GPU needed. */
Test(cuda_attention, sinks_reference_matches_cpu_oracle)
{
    rng_seed(91);
    const int l[] = {1, 40, 129};
    struct cache c;
    cache_init_host(&c, 6, 2, 24, 7, 3, l);
    c.sinks = malloc(6 * sizeof(float));
    for (int h = 0; h < 6; h++) c.sinks[h] = 2.0f * frand() + 0.5f;
    c.sinks[0] = 12.0f;
    const size_t ne = (size_t)c.n_blocks * c.bs * c.n_kv * c.D;
    float *k32 = malloc(ne * 4), *v32 = malloc(ne * 4);
    for (size_t i = 0; i < ne; i++) k32[i] = f16_to_f32(c.k[i]), v32[i] = f16_to_f32(c.v[i]);
    struct kv_layer_view view = {k32,    v32, c.n_blocks, c.bs, c.bt, c.max_blocks,
                                 c.n_kv, c.D, 0,          0,    NULL, NULL};
    int32_t seq[8] = {0, 1, 1, 2, 2, 1, 2, 2}, pos[8] = {0, 0, 39, 0, 128, 20, 64, 100}, lo[8];
    const int m = 8;
    const size_t nq = (size_t)m * c.n_heads * c.D;
    float *q = host_rand(nq, -1, 1), *cpu = malloc(nq * 4);
    double *ref = malloc(nq * 8);
    for (int window = 0; window <= 5; window += 5) {
        c.dev.window = window;
        for (int i = 0; i < m; i++) lo[i] = window && pos[i] >= window ? pos[i] - window + 1 : 0;
        ref_attention(ref, q, &c, seq, pos, m, 0.25f);
        kern_cpu_attention_sinks_ref(cpu, q, &view, seq, lo, pos, c.sinks, m, c.n_heads, 0.25f);
        const double e = max_abs_err(cpu, ref, nq);
        fprintf(stderr, "sinks reference vs kern_cpu_attention_sinks_ref, window %d: max abs err %.3g\n",
                window, e);
        cr_assert(e <= 1e-6, "window %d: local ref vs kern_cpu_attention_sinks_ref max abs err %g", window,
                  e);
    }
    free(k32);
    free(v32);
    free(q);
    free(cpu);
    free(ref);
    free(c.sinks);
    free(c.len);
    free(c.bt);
    free(c.k);
    free(c.v);
}

/* Sinks through every kernel (decode, tile, tensor-core prefill, the split merge) and every variant of
 * run_case, with and without a sliding window (gpt-oss alternates 128-position windows with full layers),
 * odd head sizes and GQA ratios, an f16 and a Q8_0 cache. Every case prints its errors. */
Test(cuda_attention, sinks_every_kernel, .timeout = 900)
{
    SKIP_WITHOUT_GPU();
    rng_seed(92);
    test_sinks = 1;
    test_verbose = 1;
    static const int sl[] = {1, 7, 64, 129, 300};
    static const struct {
        int n_heads, n_kv, D, bs, window;
        const char *what;
    } cfg[] = {
        {8, 2, 64, 16, 0, "sinks G=4 D=64"},
        {16, 2, 64, 16, 128, "sinks G=8 D=64 window 128 (gpt-oss)"},
        {8, 1, 128, 7, 5, "sinks G=8 D=128 bs=7 window 5"},
        {3, 3, 128, 16, 0, "sinks G=1 D=128"},
        {6, 3, 80, 16, 0, "sinks G=2 D=80"},
        {6, 3, 80, 16, 33, "sinks G=2 D=80 window 33"},
        {24, 1, 96, 16, 64, "sinks G=24 D=96 window 64"},
        {4, 2, 256, 32, 0, "sinks G=2 D=256"},
    };
    for (size_t i = 0; i < sizeof cfg / sizeof cfg[0]; i++) {
        test_window = cfg[i].window;
        check_config(cfg[i].n_heads, cfg[i].n_kv, cfg[i].D, cfg[i].bs, sl, 5, cfg[i].what);
    }
    test_window = 128;
    check_config_of(16, 2, 64, 16, sl, 5, 1, "sinks Q8_0 G=8 D=64 window 128");
    test_window = 0;
    test_sinks = 0;
}

/* An lse output (a partial attention merged with another) cannot carry the sinks: refused. */
Test(cuda_attention, sinks_with_lse_output_are_refused)
{
    SKIP_WITHOUT_GPU();
    rng_seed(93);
    const int l[] = {9};
    struct cache c;
    cache_init(&c, 4, 2, 64, 16, 1, l);
    cache_add_sinks(&c);
    int32_t seq[1] = {0}, pos[1] = {8};
    int32_t *ds = dev_upload(seq, 4), *dp = dev_upload(pos, 4);
    float *dq = dev_poison(4 * 64 * 4), *dout = dev_poison(4 * 64 * 4), *dlse = dev_poison(4 * 4);
    cr_assert_eq(kern_cuda_attention_mixed(dout, dlse, dq, &c.dev, ds, dp, 1, 1, 4, 0.125f, 9, NULL, 0, 0),
                 FERRY_ERR_INVALID);
    cr_assert_eq(kern_cuda_attention_mixed(dout, NULL, dq, &c.dev, ds, dp, 1, 1, 4, 0.125f, 9, NULL, 0, 0),
                 FERRY_OK);
    cudaFree(ds);
    cudaFree(dp);
    cudaFree(dq);
    cudaFree(dout);
    cudaFree(dlse);
    cache_free(&c);
}

/* Head size 512 (Gemma 4's global layers): the tile kernel's wide variant, for decode and prefill, with
 * GQA 8 and 2, a window, sinks and a Q8_0 cache. Skipped where the device cannot give a block 166 KB of
 * shared memory (there the kernels refuse the shape). */
Test(cuda_attention, wide_heads_d512, .timeout = 900)
{
    SKIP_WITHOUT_GPU();
    int optin = 0;
    CU_OK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, 0));
    if (optin < 170240)
        cr_skip_test("the device gives a block %d bytes of shared memory: head size 512 needs "
                     "170240",
                     optin);
    rng_seed(94);
    test_verbose = 1;
    const int l2[] = {3, 50, 129, 200};
    check_config(8, 1, 512, 16, l2, 4, "D=512 G=8");
    test_window = 24;
    check_config(8, 2, 512, 32, l2, 4, "D=512 G=4 window 24");
    test_window = 0;
    test_sinks = 1;
    check_config(4, 2, 512, 16, l2, 4, "D=512 G=2 sinks");
    test_sinks = 0;
    check_config_of(4, 2, 512, 16, l2, 4, 1, "Q8_0 D=512 G=2");
}

/* kern_cuda_rope_q on m rows at random positions up to 4999 against the CPU's rotation and scaling by qs
 * (f32, 2e-6 relative: the CPU and GPU may differ in the last bit of a product); with a scaling, also bitwise
 * the CPU's scaling (kern_cpu_q_scale, llm_attn_temp) of the GPU's own unscaled rotation, so the factor and
 * each position's temperature are the CPU's to the bit (the CPU's 1 + beta · ln fused, as gcc -march=native
 * builds it on an FMA host). In place is refused. */
static void rope_q_case(int nh, int D, int rd, enum rope_style style, int m, struct kern_cuda_q_scale qs)
{
    const size_t n = (size_t)m * nh * D;
    float *q = host_rand(n, -3, 3), *ref = malloc(n * 4), *plain = malloc(n * 4), *got = malloc(n * 4),
          *inv = malloc((size_t)rd / 2 * 4);
    int32_t *pos = malloc((size_t)m * 4);
    for (int i = 0; i < m; i++) pos[i] = irand(5000);
    if (m > 1 && qs.temp_len > 0) pos[0] = qs.temp_len - 1, pos[1] = qs.temp_len; /* either side of a step */
    kern_cpu_rope_freqs(inv, rd, 10000.0f, NULL);
    memcpy(ref, q, n * 4);
    kern_cpu_rope_ref(ref, pos, m, nh, D, rd, inv, style);
    q_scale_cpu(ref, pos, m, nh, D, rd, qs);
    float *dq = dev_upload(q, n * 4), *dout = dev_poison(n * 4), *dinv = dev_upload(inv, rd / 2 * 4);
    int32_t *dp = dev_upload(pos, (size_t)m * 4);
    cr_assert_eq(kern_cuda_rope_q(dout, dq, dp, m, nh, D, rd, dinv, style, KERN_CUDA_Q_SCALE_NONE, 0),
                 FERRY_OK);
    dev_download(plain, dout, n * 4);
    CU_OK(cudaMemset(dout, 0xFF, n * 4));
    cr_assert_eq(kern_cuda_rope_q(dout, dq, dp, m, nh, D, rd, dinv, style, qs, 0), FERRY_OK);
    dev_download(got, dout, n * 4);
    double worst = 0;
    for (size_t i = 0; i < n; i++) {
        const double e = fabs((double)got[i] - ref[i]) / (1.0 + fabs(ref[i]));
        worst = isfinite(got[i]) && e > worst ? e : isfinite(got[i]) ? worst : INFINITY;
    }
    fprintf(stderr, "rope_q heads %d D %d rope %d style %d scale %g temp %g/%d: max rel err %.3g\n", nh, D,
            rd, (int)style, qs.rot, qs.temp_beta, qs.temp_len, worst);
    cr_assert(worst <= 2e-6, "rope_q heads %d D %d rope %d style %d: max rel err %g", nh, D, rd, (int)style,
              worst);
    q_scale_cpu(plain, pos, m, nh, D, rd, qs);
    for (size_t i = 0; i < n; i++)
        cr_assert(memcmp(&plain[i], &got[i], 4) == 0,
                  "heads %d D %d rope %d style %d: q[%zu] (pos %d) %a, the CPU's scaling %a", nh, D, rd,
                  (int)style, i, pos[i / ((size_t)nh * D)], got[i], plain[i]);
    cr_assert_eq(kern_cuda_rope_q(dq, dq, dp, m, nh, D, rd, dinv, style, qs, 0), FERRY_ERR_INVALID);
    cudaFree(dq);
    cudaFree(dout);
    cudaFree(dinv);
    cudaFree(dp);
    free(q);
    free(ref);
    free(plain);
    free(got);
    free(inv);
    free(pos);
}

/* kern_cuda_rope_q (the queries of a layer that reads another layer's K/V) against the CPU's rotation. */
Test(cuda_attention, rope_q_matches_cpu)
{
    SKIP_WITHOUT_GPU();
    rng_seed(95);
    static const struct {
        int n_heads, D, rope_dim;
    } cfg[] = {{4, 64, 64}, {3, 24, 16}, {8, 512, 128}, {5, 256, 256}};
    for (size_t ci = 0; ci < sizeof cfg / sizeof cfg[0]; ci++)
        for (int st = 0; st < 2; st++)
            rope_q_case(cfg[ci].n_heads, cfg[ci].D, cfg[ci].rope_dim,
                        st ? ROPE_STYLE_INTERLEAVED : ROPE_STYLE_HALF, 37, KERN_CUDA_Q_SCALE_NONE);
}

/* With a rotary factor and a temperature (original context 37: floor(pos / 37) up to 135), each alone and
 * both, at odd sizes and partial rotary. */
Test(cuda_attention, rope_q_scales_as_cpu)
{
    SKIP_WITHOUT_GPU();
    rng_seed(96);
    static const struct {
        int n_heads, D, rope_dim;
    } cfg[] = {{3, 24, 16}, {5, 40, 40}, {7, 72, 54}};
    const struct kern_cuda_q_scale qs[] = {{1.4219f, 0.0f, 0}, {1.0f, 0.1f, 37}, {1.4219f, 0.1f, 37}};
    for (size_t ci = 0; ci < sizeof cfg / sizeof cfg[0]; ci++)
        for (int st = 0; st < 2; st++)
            for (int k = 0; k < 3; k++)
                rope_q_case(cfg[ci].n_heads, cfg[ci].D, cfg[ci].rope_dim,
                            st ? ROPE_STYLE_INTERLEAVED : ROPE_STYLE_HALF, 41, qs[k]);
}
