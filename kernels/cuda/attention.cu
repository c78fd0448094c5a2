/* attention (CUDA) — KV store and the three attention kernels (a tensor-core prefill kernel for head_dim 64
 * and 128; a SIMT tile kernel for other prefill shapes and for what the decode kernel does not take; a decode
 * kernel), with the log-sum-exp merge of splits done by the last split block of each row; the host side that
 * routes the rows of a (mixed) batch to them. See attention.h for the contract.
 *
 * Tile kernel (attn_kernel): one block = up to ATT_RMAX query rows (tokens x query heads sharing one KV head)
 * x one KV range (a split). Per 64-position tile: K and V are copied to shared memory with cp.async (16-byte
 * chunks), scores S = q·k for all rows are computed with each thread holding one position and up to 8 rows (k
 * read once from shared memory, q broadcast), the rows' running max/sum are updated by one warp per row, and
 * P·V is accumulated in registers (each thread owns a pair of output dims for up to 16 rows). Rows whose
 * tokens belong to other sequences than the current run, positions past the token's own, and positions
 * outside the split are masked to -inf.
 *
 * Decode kernel (attn_decode_kernel): one block = one token x HB KV heads (all their query heads, up to 8 per
 * KV head) x one KV range. No block barrier in the main loop: each warp streams its own positions through a
 * private cp.async ring in shared memory (every lane copies 16 bytes of a K row and of a V row and later
 * reads back exactly those bytes), a group of D/8 lanes per (position, KV head) computes q·k with 8 dims per
 * lane and a shuffle sum, and keeps its own online softmax (base 2, q pre-scaled by log2 e); groups and warps
 * are merged at the end in a fixed order.
 *
 * Splits: every split block writes (max, sum, unnormalised output) to the workspace, then takes a ticket from
 * the row's arrival counter; the block that arrives last merges all splits in split order (so the result does
 * not depend on which block that is) and sets the counter back to 0 for the next call.
 *
 * The tensor-core kernel's addresses come from host+device functions (fa_*), which a host audit at the end of
 * this file (kern_cuda_attention_mma_audit) runs for every thread of a launch without a GPU, checking bounds,
 * alignment, races, tile contents and coverage: CI runs it over every shape the GPU tests and benches use.
 */
#include <cuda_fp16.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <vector>

#include "kernels/cuda/attention.h"
#include "kernels/cuda/check.h"
#include "kernels/cuda/pdl.h"

#define ATT_T       64 /* positions per K/V tile */
#define ATT_THREADS 128
#define ATT_RMAX    16 /* query rows per block */
#define ATT_DMAX      256 /* head_dim of the tile kernel with a dim pair per thread (PP 1) */
#define ATT_DMAX_WIDE 512 /* head_dim of its variant with two pairs per thread (PP 2, one K/V stage) */
#define ATT_KPAD    8 /* halves of padding per K/V row in shared memory: 16-byte reads stay conflict-free */
/* Arrival counters at the start of the workspace: splits only for grids of at most this many rows. */
#define ATT_MAX_ROWS  4096
#define ATT_CNT_BYTES (ATT_MAX_ROWS * 4)
#define ATT_MAX_SPLIT 256 /* splits per row at most */

/* Which rows of the grid a launch leaves alone (a mixed batch split between two launches, see
 * kern_cuda_attention): a "single" row is the only row of its sequence among its batch neighbours. */
#define ATT_SKIP_NONE    0
#define ATT_SKIP_RUNS    1 /* decode launches: rows that are part of a run of one sequence's rows */
#define ATT_SKIP_SINGLES 2 /* prefill launches: single rows */

#define DEC_WARPS      4
#define DEC_THREADS    (DEC_WARPS * 32)
#define DEC_ST         4 /* cp.async ring stages per warp */
#define DEC_U          2 /* positions per lane group per stage */
#define DEC_RING_BYTES (DEC_WARPS * DEC_ST * DEC_U * 2 * 32 * 16)

struct att_params {
    float *out;              /* (m, n_heads, D) */
    const float *q;          /* (m, n_heads, D) */
    const __half *k, *v;     /* cache: blocks [0, n_main) */
    const __half *kx, *vx;   /* its extension: blocks [n_main, n_blocks) at id - n_main */
    const int8_t *kq, *vq;   /* a Q8_0 cache (q8): its codes, (n_main, block_size, n_kv, D) */
    const __half *ksc, *vsc; /* and its scales, (n_main, block_size, n_kv, D / 32) */
    const int8_t *kqx, *vqx; /* the extension's codes (q8), blocks [n_main, n_blocks) at id - n_main */
    const __half *kscx, *vscx; /* and its scales */
    int q8;
    const int32_t *bt;
    const int32_t *seq, *pos;
    float *ws_o;   /* (n_split, m, n_heads, D) unnormalised partial outputs */
    float2 *ws_ml; /* (n_split, m, n_heads) running max and sum (base e in attn_kernel, 2 in decode) */
    unsigned *cnt; /* (grid.x * grid.y) arrival counters, 0 between calls */
    float *lse;    /* (m, n_heads) log Σ e^score of each row (natural log), or NULL */
    const float *sinks; /* (n_heads) each head's sink logit (natural units), or NULL: see att_sink_sum */
    int n_blocks, n_main, block_size, max_blocks, n_kv, D, n_heads, G;
    int m, qt, gb, n_hsub, n_split, chunk;
    int hb;                      /* decode kernel: KV heads per block */
    int row0;                    /* first batch row of this launch's grid (blockIdx.x counts from there) */
    int skip;                    /* ATT_SKIP_*: rows this launch leaves to the other kernel */
    unsigned long long bs_magic; /* ceil(2^32 / block_size): p / block_size = (p * bs_magic) >> 32 */
    float scale;
    int window; /* a row at pos attends to (pos - window, pos]: the layer's sliding window, or 2^30 */
};

__device__ __forceinline__ void cp_async16(void *smem, const void *gmem)
{
    const unsigned s = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(s), "l"(gmem));
}
/* 8 and 4 bytes (through L1; the source aligned to the size): a Q8_0 row's codes and a pair of its scales. */
__device__ __forceinline__ void cp_async8(void *smem, const void *gmem)
{
    const unsigned s = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.ca.shared.global [%0], [%1], 8;" ::"r"(s), "l"(gmem));
}
__device__ __forceinline__ void cp_async4(void *smem, const void *gmem)
{
    const unsigned s = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(s), "l"(gmem));
}
/* Code i (0..3) of a word of four int8 codes, as f32. */
__device__ __forceinline__ float q8_code(unsigned w, int i)
{
    return (float)((int)(w << (24 - 8 * i)) >> 24);
}
/* Scale j (0, 1) of a word holding two f16 scales. */
__device__ __forceinline__ float q8_scale(unsigned w, int j)
{
    return __half2float(__ushort_as_half((unsigned short)(j ? w >> 16 : w & 0xffffu)));
}
/* Eight codes (two words) times their scale, rounded to f16: a 16-byte piece of an f16 K/V tile. */
__device__ __forceinline__ uint4 q8_half8(uint2 c, float s)
{
    uint4 r;
    unsigned *o = &r.x;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const unsigned w = i < 2 ? c.x : c.y;
        const __half2 h = __floats2half2_rn(q8_code(w, 2 * (i & 1)) * s, q8_code(w, 2 * (i & 1) + 1) * s);
        o[i] = *reinterpret_cast<const unsigned *>(&h);
    }
    return r;
}

__device__ __forceinline__ void cp_async_commit()
{
    asm volatile("cp.async.commit_group;" ::: "memory");
}
/* Waits until at most N of this thread's committed groups are pending. */
template <int N> __device__ __forceinline__ void cp_async_wait()
{
    asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

__device__ __forceinline__ float warp_max(float v)
{
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
__device__ __forceinline__ float warp_sum(float v)
{
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* Row i is the only row of its sequence among rows i-1, i, i+1 (a decode token). */
__device__ __forceinline__ bool att_single(const att_params &p, int i)
{
    const int s = p.seq[i];
    return (i == 0 || p.seq[i - 1] != s) && (i == p.m - 1 || p.seq[i + 1] != s);
}

template <bool LOG2> __device__ __forceinline__ float att_exp(float x)
{
    return LOG2 ? exp2f(x) : expf(x);
}

/* The natural log-sum-exp of a row from its running max and sum (base 2: scores in units of log2 e); -inf for
 * a row that saw no position. */
template <bool LOG2> __device__ __forceinline__ float att_lse(float m, float l)
{
    if (!(l > 0.0f)) return -INFINITY;
    return LOG2 ? (m + log2f(l)) * 0.69314718055994531f : m + logf(l);
}

/* A row's softmax denominator: its sum l over the positions (relative to its running max m, base 2 when LOG2),
 * plus e^(sink - max) of its head's sink when the layer has sinks (a logit with no value: gpt-oss). A row
 * with no position (m -inf) gets an infinite denominator, so its output stays 0. */
template <bool LOG2> __device__ __forceinline__ float att_sink_sum(const att_params &p, int head, float m, float l)
{
    if (!p.sinks) return l;
    const float s = __ldg(p.sinks + head);
    return l + att_exp<LOG2>((LOG2 ? s * 1.44269504088896341f : s) - m);
}

/* Called by every thread of a split block after it wrote its partials: true in the block of the row that
 * arrives last, which then owns the merge; that block also sets the counter back to 0 (all other blocks of
 * the row have taken their ticket by then), so the next call and graph replays start from 0. */
__device__ __forceinline__ bool att_last_arrival(const att_params &p)
{
    __shared__ int s_last;
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) {
        unsigned *c = p.cnt + (size_t)blockIdx.x * gridDim.y + blockIdx.y;
        const bool last = atomicAdd(c, 1u) == (unsigned)p.n_split - 1;
        if (last) *c = 0;
        s_last = last;
    }
    __syncthreads();
    const bool last = s_last != 0;
    if (last) __threadfence();
    return last;
}

/* out[row] = Σ_s o_s e^(m_s - M) / Σ_s l_s e^(m_s - M) over the splits in order, for the nrows rows (tok *
 * n_heads + head) of rows[] (shared memory); wts: shared memory for nrows * n_split floats. The partials of
 * other blocks are read through L2 (__ldcg): this block never cached them. */
template <bool LOG2>
__device__ void att_merge_rows(const att_params &p, const int *rows, int nrows, float *wts)
{
    const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32, nw = blockDim.x / 32;
    const int ns = p.n_split, D = p.D;
    const size_t total = (size_t)p.m * p.n_heads;
    for (int ri = warp; ri < nrows; ri += nw) {
        const size_t row = (size_t)rows[ri];
        float mx = -INFINITY;
        for (int s = lane; s < ns; s += 32) mx = fmaxf(mx, __ldcg(p.ws_ml + s * total + row).x);
        const float M = warp_max(mx);
        float sum = 0.0f;
        for (int s = lane; s < ns; s += 32) {
            const float2 ml = __ldcg(p.ws_ml + s * total + row);
            const float w = ml.y > 0.0f ? att_exp<LOG2>(ml.x - M) : 0.0f;
            wts[ri * ns + s] = w;
            sum += ml.y * w;
        }
        const float L = att_sink_sum<LOG2>(p, (int)(row % (size_t)p.n_heads), M, warp_sum(sum)),
                    inv = L > 0.0f ? 1.0f / L : 0.0f;
        for (int s = lane; s < ns; s += 32) wts[ri * ns + s] *= inv;
        if (p.lse && lane == 0) p.lse[row] = att_lse<LOG2>(M, L);
    }
    __syncthreads();
    for (int e = threadIdx.x; e < nrows * D; e += blockDim.x) {
        const int ri = e / D, d = e % D;
        const size_t row = (size_t)rows[ri];
        const float *w = wts + ri * ns;
        const float *o = p.ws_o + row * D + d;
        float acc = 0.0f;
#pragma unroll 8
        for (int s = 0; s < ns; s++) acc += w[s] * __ldcg(o + (size_t)s * total * D);
        p.out[row * D + d] = acc;
    }
}

/* ST = 1: each K/V tile is copied, waited for, then used. ST = 2: two K/V buffers; the copy of tile i+1 is
 * issued before tile i is used, so the block-table lookups and the copy latency overlap the math. PP: output
 * dim pairs per thread and row in P·V (1 up to head_dim ATT_DMAX; 2 up to ATT_DMAX_WIDE, where a row's D/2
 * pairs outnumber the block's threads): pairs dp, dp + D/(2 PP), ... */
template <int ST, int PP> __global__ void __launch_bounds__(ATT_THREADS) attn_kernel(const att_params p)
{
    extern __shared__ __align__(16) unsigned char smem[];
    const int D = p.D, DS = p.D + ATT_KPAD;
    float *Qs = (float *)smem;                   /* (ATT_RMAX, D) */
    __half *Kb = (__half *)(Qs + ATT_RMAX * D);  /* (ST, ATT_T, DS) */
    __half *Vb = Kb + ST * ATT_T * DS;           /* (ST, ATT_T, DS) */
    float *Ss = (float *)(Vb + ST * ATT_T * DS); /* (ATT_RMAX, ATT_T) */
    float *row_m = Ss + ATT_RMAX * ATT_T, *row_l = row_m + ATT_RMAX, *row_a = row_l + ATT_RMAX;
    int *row_pos = (int *)(row_a + ATT_RMAX);

    pdl_wait(); /* q, the cache, the block table and the workspace are all written by earlier work */
    pdl_trigger();
    const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
    const int i0 = p.row0 + blockIdx.x * p.qt;
    const int ntok = min(p.qt, p.m - i0);
    /* Decode tiles (one token) of a mixed batch: runs are the prefill launch's. The same answer for every
     * split of the token, so no split takes an arrival ticket. */
    if (p.skip == ATT_SKIP_RUNS && !att_single(p, i0)) return;
    const int kvh = blockIdx.y / p.n_hsub, hsub = blockIdx.y % p.n_hsub;
    const int split = blockIdx.z;
    const int R = ntok * p.gb;

    /* Query rows to shared memory; rows past the group's heads are zero and never written out. */
    for (int idx = tid; idx < ATT_RMAX * D; idx += ATT_THREADS) {
        const int r = idx / D, d = idx % D;
        const int tl = r / p.gb, hg = hsub * p.gb + r % p.gb;
        float val = 0.0f;
        if (r < R && hg < p.G) val = p.q[((size_t)(i0 + tl) * p.n_heads + kvh * p.G + hg) * D + d];
        Qs[idx] = val;
    }
    if (tid < ATT_RMAX) row_pos[tid] = tid < R ? p.pos[i0 + tid / p.gb] : -1;

    /* Thread roles. Scores: one position, rows rg, rg+2, ... PV: one dim pair, rows g, g+groups, ... */
    const int tt = tid % ATT_T, rg = tid / ATT_T;
    const int NP = D / 2 / PP, groups = ATT_THREADS / NP;
    const int dp = tid % NP, g = tid / NP;
    /* Tile copy: 16-byte chunk c8 of every step-th row. */
    const int cpr = D / 8, step = ATT_THREADS / cpr;
    const int c8 = tid % cpr, t_first = tid / cpr;

    for (int rs = 0; rs < ntok;) {
        const int sq = p.seq[i0 + rs];
        int re = rs + 1, maxpos = p.pos[i0 + rs];
        while (re < ntok && p.seq[i0 + re] == sq) maxpos = max(maxpos, p.pos[i0 + re++]);
        const int lo = split * p.chunk;
        const int hi = split == p.n_split - 1 ? maxpos + 1 : min(lo + p.chunk, maxpos + 1);
        const int r_lo = rs * p.gb, r_hi = re * p.gb; /* rows of this run */

        __syncthreads(); /* previous run's readers of row state and shared tiles are done */
        if (tid < ATT_RMAX) {
            row_m[tid] = -INFINITY;
            row_l[tid] = 0.0f;
        }
        /* The reset must be visible before the write-out below even when this split holds no position of the
         * run and the tile loop (whose barriers would order it) does not run: racecheck found this one. */
        __syncthreads();
        float o[ATT_RMAX][2 * PP];
#pragma unroll
        for (int j = 0; j < ATT_RMAX; j++)
#pragma unroll
            for (int c = 0; c < 2 * PP; c++) o[j][c] = 0.0f;

        /* K/V tile copy of the tile at t0 into buffer b: thread (t_first, c) copies 16-byte chunk c of rows
         * t_first, t_first + step, ... Rows nt..nt4-1 are zeroed so that the 4-wide P·V loop reads finite
         * values there (P is 0). */
        auto copy_tile = [&](int t0, int b) {
            const int nt = min(ATT_T, hi - t0);
            const int nt4 = min(ATT_T, (nt + 3) & ~3);
            __half *Kd = Kb + b * ATT_T * DS, *Vd = Vb + b * ATT_T * DS;
            if (t_first < step) {
                for (int t = t_first; t < nt4; t += step) {
                    __half *kd = Kd + t * DS + c8 * 8, *vd = Vd + t * DS + c8 * 8;
                    const int pp = t0 + t;
                    const int bi = pp / p.block_size;
                    const int blk = t < nt && bi < p.max_blocks ? p.bt[(size_t)sq * p.max_blocks + bi] : -1;
                    if (blk >= 0 && blk < p.n_blocks && p.q8) {
                        const bool ext = blk >= p.n_main;
                        const size_t r =
                            ((size_t)(ext ? blk - p.n_main : blk) * p.block_size + (pp - bi * p.block_size)) *
                                p.n_kv +
                            kvh;
                        const uint2 kc = __ldg((const uint2 *)((ext ? p.kqx : p.kq) + r * D + c8 * 8));
                        const uint2 vc = __ldg((const uint2 *)((ext ? p.vqx : p.vq) + r * D + c8 * 8));
                        const size_t si = r * (D / 32) + c8 / 4;
                        *(uint4 *)kd = q8_half8(kc, __half2float((ext ? p.kscx : p.ksc)[si]));
                        *(uint4 *)vd = q8_half8(vc, __half2float((ext ? p.vscx : p.vsc)[si]));
                    } else if (blk >= 0 && blk < p.n_blocks) {
                        const bool ext = blk >= p.n_main;
                        const int id = ext ? blk - p.n_main : blk;
                        const __half *kb = ext ? p.kx : p.k, *vb = ext ? p.vx : p.v;
                        const size_t off =
                            (((size_t)id * p.block_size + (pp - bi * p.block_size)) * p.n_kv + kvh) * D +
                            c8 * 8;
                        cp_async16(kd, kb + off);
                        cp_async16(vd, vb + off);
                    } else {
                        *(uint4 *)kd = make_uint4(0, 0, 0, 0);
                        *(uint4 *)vd = make_uint4(0, 0, 0, 0);
                    }
                }
            }
            cp_async_commit();
        };

        if (ST == 2 && lo < hi) copy_tile(lo, 0);
        for (int t0 = lo, it = 0; t0 < hi; t0 += ATT_T, it++) {
            const int nt = min(ATT_T, hi - t0);
            const int cur = ST == 2 ? it & 1 : 0;
            const __half *Ks = Kb + cur * ATT_T * DS, *Vs = Vb + cur * ATT_T * DS;
            if (ST == 2) {
                /* Buffer cur^1 was last read in the previous iteration, before its closing barrier. */
                if (t0 + ATT_T < hi)
                    copy_tile(t0 + ATT_T, cur ^ 1);
                else
                    cp_async_commit(); /* an empty group keeps the count: wait<1> below is then tile cur */
                cp_async_wait<1>();
            } else {
                copy_tile(t0, 0);
                cp_async_wait<0>();
            }
            __syncthreads();

            /* Scores. */
            {
                float s[ATT_RMAX / 2];
#pragma unroll
                for (int j = 0; j < ATT_RMAX / 2; j++) s[j] = 0.0f;
                const __half *kr = Ks + tt * DS;
                for (int dc = 0; dc < D; dc += 8) {
                    const uint4 kv4 = *(const uint4 *)(kr + dc);
                    const __half2 *h2 = (const __half2 *)&kv4;
                    float kf[8];
#pragma unroll
                    for (int i = 0; i < 4; i++) {
                        const float2 f = __half22float2(h2[i]);
                        kf[2 * i] = f.x;
                        kf[2 * i + 1] = f.y;
                    }
#pragma unroll
                    for (int j = 0; j < ATT_RMAX / 2; j++) {
                        const int r = rg + 2 * j;
                        if (r >= R) break;
                        const float4 qa = *(const float4 *)(Qs + r * D + dc);
                        const float4 qb = *(const float4 *)(Qs + r * D + dc + 4);
                        s[j] += qa.x * kf[0] + qa.y * kf[1] + qa.z * kf[2] + qa.w * kf[3] + qb.x * kf[4] +
                                qb.y * kf[5] + qb.z * kf[6] + qb.w * kf[7];
                    }
                }
                const int pp = t0 + tt;
#pragma unroll
                for (int j = 0; j < ATT_RMAX / 2; j++) {
                    const int r = rg + 2 * j;
                    if (r < R) {
                        const bool ok =
                            r >= r_lo && r < r_hi && tt < nt && pp <= row_pos[r] && pp > row_pos[r] - p.window;
                        Ss[r * ATT_T + tt] = ok ? s[j] * p.scale : -INFINITY;
                    }
                }
            }
            __syncthreads();

            /* Online softmax, one warp per row. */
            for (int r = warp; r < R; r += ATT_THREADS / 32) {
                const float a = Ss[r * ATT_T + lane], b = Ss[r * ATT_T + lane + 32];
                const float mold = row_m[r];
                const float mnew = fmaxf(mold, warp_max(fmaxf(a, b)));
                float pa = 0.0f, pb = 0.0f, alpha = 1.0f;
                if (mnew != -INFINITY) {
                    pa = expf(a - mnew);
                    pb = expf(b - mnew);
                    alpha = expf(mold - mnew);
                }
                Ss[r * ATT_T + lane] = pa;
                Ss[r * ATT_T + lane + 32] = pb;
                const float sum = warp_sum(pa + pb);
                __syncwarp();
                if (lane == 0) {
                    row_l[r] = row_l[r] * alpha + sum;
                    row_m[r] = mnew;
                    row_a[r] = alpha;
                }
            }
            __syncthreads();

            /* P·V. */
            if (g < groups) {
#pragma unroll
                for (int j = 0; j < ATT_RMAX; j++) {
                    const int r = g + groups * j;
                    if (r < R) {
                        const float al = row_a[r];
#pragma unroll
                        for (int c = 0; c < 2 * PP; c++) o[j][c] *= al;
                    }
                }
                const int nt4 = min(ATT_T, (nt + 3) & ~3);
                for (int t = 0; t < nt4; t += 4) {
#pragma unroll
                    for (int k = 0; k < PP; k++) {
                        const __half *vb = Vs + t * DS + 2 * (dp + k * NP);
                        const float2 v0 = __half22float2(*(const __half2 *)vb);
                        const float2 v1 = __half22float2(*(const __half2 *)(vb + DS));
                        const float2 v2 = __half22float2(*(const __half2 *)(vb + 2 * DS));
                        const float2 v3 = __half22float2(*(const __half2 *)(vb + 3 * DS));
#pragma unroll
                        for (int j = 0; j < ATT_RMAX; j++) {
                            const int r = g + groups * j;
                            if (r >= R) break;
                            const float4 pr = *(const float4 *)(Ss + r * ATT_T + t);
                            o[j][2 * k] += pr.x * v0.x + pr.y * v1.x + pr.z * v2.x + pr.w * v3.x;
                            o[j][2 * k + 1] += pr.x * v0.y + pr.y * v1.y + pr.z * v2.y + pr.w * v3.y;
                        }
                    }
                }
            }
            __syncthreads();
        }

        /* Write the run's rows. */
        if (g < groups) {
#pragma unroll
            for (int j = 0; j < ATT_RMAX; j++) {
                const int r = g + groups * j;
                const int hg = hsub * p.gb + r % p.gb;
                if (r >= r_lo && r < r_hi && hg < p.G) {
                    const int tok = i0 + r / p.gb, head = kvh * p.G + hg;
                    const size_t row = (size_t)tok * p.n_heads + head;
                    if (p.n_split == 1) {
                        const float l = row_l[r], ls = att_sink_sum<false>(p, head, row_m[r], l),
                                    inv = ls > 0.0f ? 1.0f / ls : 0.0f;
#pragma unroll
                        for (int k = 0; k < PP; k++)
                            *(float2 *)(p.out + row * D + 2 * (dp + k * NP)) =
                                make_float2(o[j][2 * k] * inv, o[j][2 * k + 1] * inv);
                        if (p.lse && dp == 0) p.lse[row] = att_lse<false>(row_m[r], l);
                    } else {
                        const size_t prow = (size_t)split * p.m * p.n_heads + row;
#pragma unroll
                        for (int k = 0; k < PP; k++)
                            *(float2 *)(p.ws_o + prow * D + 2 * (dp + k * NP)) =
                                make_float2(o[j][2 * k], o[j][2 * k + 1]);
                        if (dp == 0) p.ws_ml[prow] = make_float2(row_m[r], row_l[r]);
                    }
                }
            }
        }
        rs = re;
    }
    if (p.n_split > 1) {
        __shared__ int rows_s[ATT_RMAX], nrows_s;
        if (tid == 0) {
            int n = 0;
            for (int r = 0; r < R; r++) {
                const int hg = hsub * p.gb + r % p.gb;
                if (hg < p.G) rows_s[n++] = (i0 + r / p.gb) * p.n_heads + kvh * p.G + hg;
            }
            nrows_s = n;
        }
        /* The K/V tiles and scores are dead: the merge weights reuse them (the host sized n_split for that).
         */
        if (att_last_arrival(p)) att_merge_rows<false>(p, rows_s, nrows_s, (float *)Kb);
    }
}

/* The 8 elements lane li holds of a K or V row, from its ring slot: 8 f16, or (Q8) 8 codes times the scale of
 * their block, which is element (li / 4) % 2 of the pair in the slot's third word. */
template <bool Q8> __device__ __forceinline__ void slot_f32(const uint4 w, int li, float f[8])
{
    if (Q8) {
        const float sc = q8_scale(w.z, (li >> 2) & 1);
#pragma unroll
        for (int k = 0; k < 4; k++) f[k] = q8_code(w.x, k) * sc, f[4 + k] = q8_code(w.y, k) * sc;
    } else {
        const __half2 *h2 = (const __half2 *)&w;
#pragma unroll
        for (int k = 0; k < 4; k++) {
            const float2 v = __half22float2(h2[k]);
            f[2 * k] = v.x, f[2 * k + 1] = v.y;
        }
    }
}

/* Decode kernel; RM = rows per KV head held in registers (a power of two >= G); Q8: a Q8_0 cache (each lane's
 * slot holds its 8 codes and, in bytes 8..11, the pair of scales that contains its block's). Grid: (tokens,
 * n_kv / hb, splits). Lane roles: lane = grp * LG + hh * LP + li with LP = D/8 lanes per (position, KV head),
 * LG = LP * hb lanes per position and NG = 32 / LG position groups per warp; lane li holds dims 8 li .. 8 li
 * + 7. Warp w takes the block-steps j = 0, 1, ... and within one the positions lo + j * DEC_WARPS * PS + w *
 * PS + u * NG + grp (u < DEC_U, PS = NG * DEC_U), so the warps of a block read neighbouring positions at the
 * same time. */
template <int RM, bool Q8>
__global__ void __launch_bounds__(DEC_THREADS) attn_decode_kernel(const att_params p)
{
    extern __shared__ __align__(16) unsigned char smem[];
    pdl_wait(); /* everything below reads q, the cache, the block table or the workspace */
    pdl_trigger();
    const int D = p.D, LP = D / 8, HB = p.hb, LG = LP * HB, NG = 32 / LG, PS = NG * DEC_U;
    const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
    const int grp = lane / LG, hh = (lane % LG) / LP, li = lane % LP;
    const int tok = p.row0 + blockIdx.x, kvg = blockIdx.y, split = blockIdx.z;
    if (p.skip == ATT_SKIP_RUNS && !att_single(p, tok)) return; /* a prefill row: the prefill launch's */
    const int R = p.G, kvh = kvg * HB + hh;
    const int sq = p.seq[tok], pos = p.pos[tok];
    /* The splits cover [0, pos] in chunks of p.chunk; once a sliding-window layer's window is full, they
     * cover the window (pos - window, pos] alone, in n_split equal parts, so that deep in a sequence every
     * split still reads its share (the same ranges as before while pos < window). */
    const int base = max(0, pos + 1 - p.window);
    const int chunk = base > 0 ? (pos + 1 - base + p.n_split - 1) / p.n_split : p.chunk;
    const int lo = base + split * chunk;
    const int hi = split == p.n_split - 1 ? pos + 1 : min(lo + chunk, pos + 1);

    /* q in base-2 units: scores come out multiplied by log2 e, so exp2 gives the natural softmax. */
    const float qscale = p.scale * 1.44269504088896341f;
    float q[RM][8];
#pragma unroll
    for (int r = 0; r < RM; r++) {
        float4 a = make_float4(0.f, 0.f, 0.f, 0.f), b = a;
        if (r < R) {
            const float4 *src =
                (const float4 *)(p.q + ((size_t)tok * p.n_heads + kvh * p.G + r) * D + li * 8);
            a = src[0];
            b = src[1];
        }
        q[r][0] = a.x * qscale, q[r][1] = a.y * qscale, q[r][2] = a.z * qscale, q[r][3] = a.w * qscale;
        q[r][4] = b.x * qscale, q[r][5] = b.y * qscale, q[r][6] = b.z * qscale, q[r][7] = b.w * qscale;
    }
    float m[RM], l[RM], o[RM][8];
#pragma unroll
    for (int r = 0; r < RM; r++) {
        m[r] = -INFINITY, l[r] = 0.0f;
#pragma unroll
        for (int k = 0; k < 8; k++) o[r][k] = 0.0f;
    }

    /* This warp's ring: (DEC_ST stages, DEC_U positions, K|V, 32 lanes) 16-byte slots. */
    uint4 *ring = (uint4 *)smem + warp * (DEC_ST * DEC_U * 2 * 32);
    const int bstride = DEC_WARPS * PS, span = hi - lo;
    const int nsteps = span > warp * PS ? (span - warp * PS + bstride - 1) / bstride : 0;
    const int32_t *btrow = p.bt + (size_t)sq * p.max_blocks;
    const size_t pos_stride = (size_t)p.n_kv * D; /* halves from one position to the next within a block */
    const size_t lane_off = (size_t)kvh * D + li * 8;
    auto pos_of = [&](int j, int u) { return lo + j * bstride + warp * PS + u * NG + grp; };
    auto bidx = [&](int pp) { return (unsigned)(((unsigned long long)(unsigned)pp * p.bs_magic) >> 32); };
    /* Block id of position pp (read through the read-only path: no kernel writes the table while this runs);
     * -1 for a block index past the table row. */
    auto id_of = [&](int pp) {
        const unsigned bi = bidx(pp);
        return pp < hi && bi < (unsigned)p.max_blocks ? __ldg(btrow + bi) : -1;
    };
    /* Copies step j's K and V pieces of this lane into its slots; zeros for positions in range whose block id
     * is not a block of the pool; nothing for positions past hi (masked in the math). Always commits a group.
     */
    auto issue = [&](int j, const int *ids) {
        uint4 *slot = ring + (j % DEC_ST) * (DEC_U * 2 * 32);
#pragma unroll
        for (int u = 0; u < DEC_U; u++) {
            const int pp = pos_of(j, u), id = ids[u];
            uint4 *ks = slot + u * 64 + lane, *vs = ks + 32;
            if (pp >= hi) continue;
            if (Q8 && id >= 0 && id < p.n_blocks) {
                const bool ext = id >= p.n_main;
                const size_t r = ((size_t)(ext ? id - p.n_main : id) * p.block_size +
                                  (pp - (int)bidx(pp) * p.block_size)) *
                                     p.n_kv +
                                 kvh;
                const size_t si = r * (D / 32) + ((li >> 2) & ~1);
                cp_async8(ks, (ext ? p.kqx : p.kq) + r * D + li * 8);
                cp_async4((char *)ks + 8, (ext ? p.kscx : p.ksc) + si);
                cp_async8(vs, (ext ? p.vqx : p.vq) + r * D + li * 8);
                cp_async4((char *)vs + 8, (ext ? p.vscx : p.vsc) + si);
            } else if (id >= 0 && id < p.n_blocks) {
                const int row = pp - (int)bidx(pp) * p.block_size;
                const bool ext = id >= p.n_main;
                const int b = ext ? id - p.n_main : id;
                const __half *kb = ext ? p.kx : p.k, *vb = ext ? p.vx : p.v;
                const size_t off = ((size_t)b * p.block_size + row) * pos_stride + lane_off;
                cp_async16(ks, kb + off);
                cp_async16(vs, vb + off);
            } else {
                *ks = make_uint4(0, 0, 0, 0);
                *vs = make_uint4(0, 0, 0, 0);
            }
        }
        cp_async_commit();
    };

    {
        int ids[DEC_ST - 1][DEC_U];
#pragma unroll
        for (int j = 0; j < DEC_ST - 1; j++)
#pragma unroll
            for (int u = 0; u < DEC_U; u++) ids[j][u] = j < nsteps ? id_of(pos_of(j, u)) : -1;
#pragma unroll
        for (int j = 0; j < DEC_ST - 1; j++) {
            if (j < nsteps)
                issue(j, ids[j]);
            else
                cp_async_commit();
        }
    }
    int idn[DEC_U]; /* block ids of the next step to issue, loaded one step ahead */
#pragma unroll
    for (int u = 0; u < DEC_U; u++) idn[u] = DEC_ST - 1 < nsteps ? id_of(pos_of(DEC_ST - 1, u)) : -1;

    for (int i = 0; i < nsteps; i++) {
        const int jn = i + DEC_ST - 1;
        if (jn < nsteps)
            issue(jn, idn);
        else
            cp_async_commit(); /* an empty group keeps wait_group's count pointing at step i */
        if (jn + 1 < nsteps) {
#pragma unroll
            for (int u = 0; u < DEC_U; u++) idn[u] = id_of(pos_of(jn + 1, u));
        }
        cp_async_wait<DEC_ST - 1>(); /* this lane's copies of step i have landed; only it reads them */

        const uint4 *slot = ring + (i % DEC_ST) * (DEC_U * 2 * 32);
        float s[DEC_U][RM];
        bool ok[DEC_U];
#pragma unroll
        for (int u = 0; u < DEC_U; u++) {
            ok[u] = pos_of(i, u) < hi;
            float kf[8];
            slot_f32<Q8>(slot[u * 64 + lane], li, kf);
#pragma unroll
            for (int r = 0; r < RM; r++) {
                float a = q[r][0] * kf[0];
#pragma unroll
                for (int k = 1; k < 8; k++) a = fmaf(q[r][k], kf[k], a);
                s[u][r] = a;
            }
        }
        for (int off = 1; off < LP; off <<= 1)
#pragma unroll
            for (int u = 0; u < DEC_U; u++)
#pragma unroll
                for (int r = 0; r < RM; r++) s[u][r] += __shfl_xor_sync(0xffffffffu, s[u][r], off);
        float pr[DEC_U][RM];
#pragma unroll
        for (int r = 0; r < RM; r++) {
            float mx = -INFINITY;
#pragma unroll
            for (int u = 0; u < DEC_U; u++)
                if (ok[u]) mx = fmaxf(mx, s[u][r]);
            if (mx > m[r]) {
                const float al = exp2f(m[r] - mx); /* 0 while m is -inf */
                l[r] *= al;
#pragma unroll
                for (int k = 0; k < 8; k++) o[r][k] *= al;
                m[r] = mx;
            }
            float sum = 0.0f;
#pragma unroll
            for (int u = 0; u < DEC_U; u++) {
                pr[u][r] = ok[u] ? exp2f(s[u][r] - m[r]) : 0.0f;
                sum += pr[u][r];
            }
            l[r] += sum;
        }
#pragma unroll
        for (int u = 0; u < DEC_U; u++) {
            if (!ok[u]) continue;
            float vf[8];
            slot_f32<Q8>(slot[u * 64 + 32 + lane], li, vf);
#pragma unroll
            for (int r = 0; r < RM; r++)
#pragma unroll
                for (int k = 0; k < 8; k++) o[r][k] = fmaf(pr[u][r], vf[k], o[r][k]);
        }
    }

    /* Merge the position groups of the warp (butterfly over the group bits of the lane; fixed order). */
    for (int off = LG; off < 32; off <<= 1) {
#pragma unroll
        for (int r = 0; r < RM; r++) {
            const float mo = __shfl_xor_sync(0xffffffffu, m[r], off);
            const float lo2 = __shfl_xor_sync(0xffffffffu, l[r], off);
            float oo[8];
#pragma unroll
            for (int k = 0; k < 8; k++) oo[k] = __shfl_xor_sync(0xffffffffu, o[r][k], off);
            const float M = fmaxf(m[r], mo);
            if (M != -INFINITY) {
                const float a = exp2f(m[r] - M), b = exp2f(mo - M);
                l[r] = l[r] * a + lo2 * b;
#pragma unroll
                for (int k = 0; k < 8; k++) o[r][k] = o[r][k] * a + oo[k] * b;
                m[r] = M;
            }
        }
    }

    /* Merge the warps through shared memory (the rings are dead once every copy has landed). */
    cp_async_wait<0>();
    __syncthreads();
    const int ROWS = HB * RM;
    float *sc_o = (float *)smem;                             /* (DEC_WARPS, ROWS, D) */
    float2 *sc_ml = (float2 *)(sc_o + DEC_WARPS * ROWS * D); /* (DEC_WARPS, ROWS) */
    if (grp == 0) {
#pragma unroll
        for (int r = 0; r < RM; r++) {
            if (r >= R) break;
            float *dst = sc_o + ((size_t)warp * ROWS + hh * RM + r) * D + li * 8;
            *(float4 *)dst = make_float4(o[r][0], o[r][1], o[r][2], o[r][3]);
            *(float4 *)(dst + 4) = make_float4(o[r][4], o[r][5], o[r][6], o[r][7]);
            if (li == 0) sc_ml[warp * ROWS + hh * RM + r] = make_float2(m[r], l[r]);
        }
    }
    __syncthreads();
    const size_t total = (size_t)p.m * p.n_heads;
    for (int e = tid; e < HB * R * D; e += DEC_THREADS) {
        const int d = e % D, rr = e / D, r = rr % R, h2 = rr / R, row = h2 * RM + r;
        float M = -INFINITY;
#pragma unroll
        for (int w = 0; w < DEC_WARPS; w++) M = fmaxf(M, sc_ml[w * ROWS + row].x);
        float L = 0.0f, O = 0.0f;
        if (M != -INFINITY) {
#pragma unroll
            for (int w = 0; w < DEC_WARPS; w++) {
                const float2 ml = sc_ml[w * ROWS + row];
                const float f = exp2f(ml.x - M);
                L += ml.y * f;
                O += sc_o[((size_t)w * ROWS + row) * D + d] * f;
            }
        }
        const size_t grow = (size_t)tok * p.n_heads + (size_t)(kvg * HB + h2) * p.G + r;
        if (p.n_split == 1) {
            const float Ls = att_sink_sum<true>(p, (int)(grow % (size_t)p.n_heads), M, L);
            p.out[grow * D + d] = Ls > 0.0f ? O / Ls : 0.0f;
            if (p.lse && d == 0) p.lse[grow] = att_lse<true>(M, L);
        } else {
            p.ws_o[((size_t)split * total + grow) * D + d] = O;
            if (d == 0) p.ws_ml[(size_t)split * total + grow] = make_float2(M, L);
        }
    }
    if (p.n_split > 1) {
        __shared__ int rows_s[32];
        if (tid < HB * R) rows_s[tid] = tok * p.n_heads + (kvg * HB + tid / R) * p.G + tid % R;
        if (att_last_arrival(p)) att_merge_rows<true>(p, rows_s, HB * R, (float *)smem);
    }
}

/* ---------------------------------------------------------------------------------------------------------
 * Prefill kernel on tensor cores (attn_mma_kernel<D>), FlashAttention-2 style. Block = a window of qt
 * consecutive batch tokens x the gb query heads of one KV head (rows r = token * gb + head, at most FA_BM =
 * 64), 4 warps of 16 rows, x one KV range (a split). The window's tokens are processed one run of equal
 * sequence at a time (a prefill chunk is one run; a run of one single token is left to the decode launch
 * when p.skip says so). Per run, K/V tiles of FA_BN = 64 positions are copied to shared memory with cp.async
 * in two stages (the next tile's K and V during this tile's math, one barrier per tile; the element offsets
 * of a tile's rows are computed two tiles ahead into s_off). Registers (~210 at head_dim 128) allow 2 blocks
 * per SM, so the second stage (70 KB of shared memory per block in all) costs no occupancy. Per warp and
 * tile: S = Q Kᵀ (mma.sync m16n8k16, f16 in, f32 accumulate; Q is f32 in memory, scaled by scale*log2 e and
 * rounded to f16 once, held in registers as A fragments; K's B fragments by ldmatrix), the causal mask by
 * position, the online softmax in base 2 in f32 (row max over the 4 threads of a quad by shuffles), P rounded
 * to f16 and reused in registers as the A fragments of O += P V (V's B fragments by ldmatrix.trans). A warp
 * skips the math of tiles entirely past its rows' positions. Fragment layouts (PTX ISA, mma.m16n8k16 .f16):
 * lane = 4 g + t; A a0 (row g, k 2t..2t+1), a1 (row g+8, k 2t..), a2 (row g, k 2t+8..), a3 (row g+8, k
 * 2t+8..); B b0 (k 2t..2t+1, col g), b1 (k 2t+8.., col g); C c0 c1 (row g, cols 2t, 2t+1), c2 c3 (row g+8,
 * same cols). So the C fragments of S's column blocks 2kk and 2kk+1 are exactly the A fragment of P's k-block
 * kk. Splits write unnormalised partials and are merged by the last block to arrive, as in the other kernels.
 * ---------------------------------------------------------------------------------------------------------
 */
#define FA_BM      64 /* query rows per block */
#define FA_BN      64 /* positions per K/V tile */
#define FA_THREADS 128
#define FA_PAD     8 /* halves of padding per shared K/V row: ldmatrix rows 16 bytes apart in banks */

/* ---- The tensor-core kernel's index arithmetic ----
 * Everything that turns (block, thread, run, tile) into an address, in host+device functions: the kernel and
 * its host audit (kern_cuda_attention_mma_audit, which runs every thread's accesses of a launch on the CPU
 * and checks bounds, alignment, races and coverage) use the same code. */

/* Dynamic shared memory, bytes from its base: K stages 0 and 1, V stages 0 and 1 (each (FA_BN, D + FA_PAD)
 * f16), then the element offsets of two tiles' rows ((2, FA_BN) int64). */
__host__ __device__ constexpr int fa_tile_bytes(int D)
{
    return FA_BN * (D + FA_PAD) * 2;
}
__host__ __device__ constexpr int fa_k_at(int D, int st)
{
    return st * fa_tile_bytes(D);
}
__host__ __device__ constexpr int fa_v_at(int D, int st)
{
    return (2 + st) * fa_tile_bytes(D);
}
__host__ __device__ constexpr int fa_off_at(int D)
{
    return 4 * fa_tile_bytes(D);
}
__host__ __device__ constexpr int fa_smem_bytes(int D)
{
    return fa_off_at(D) + 2 * FA_BN * (int)sizeof(long long);
}
static_assert(fa_tile_bytes(64) % 16 == 0 && fa_tile_bytes(128) % 16 == 0, "stages start 16-byte aligned");

/* Per head_dim: halves per shared K/V row, k-blocks of Q·Kᵀ, column blocks of S and of O, 16-byte pieces per
 * K/V row, rows per copy pass. */
template <int D> struct fa_dims {
    static constexpr int DS = D + FA_PAD, KC = D / 16, NB = FA_BN / 8, OB = D / 8, CPR = D / 8,
                         RPP = FA_THREADS / CPR;
};

/* First batch row of block bx's window (of nx): the latest windows (the most work) are scheduled first. */
__host__ __device__ __forceinline__ int fa_window(const att_params &p, int bx, int nx)
{
    return p.row0 + (nx - 1 - bx) * p.qt;
}

/* Row r of a window starting at batch row i0 with ntok tokens (token r / gb of it, query head hsub*gb + r %
 * gb of KV head kvh's group) as a row of q and out (token * n_heads + head); -1 past the window's tokens or
 * the group's heads. */
__host__ __device__ __forceinline__ long long fa_qrow(const att_params &p, int i0, int ntok, int kvh,
                                                      int hsub, int r)
{
    const int tl = r / p.gb, hg = hsub * p.gb + r % p.gb;
    return tl < ntok && hg < p.G ? (long long)(i0 + tl) * p.n_heads + (long long)kvh * p.G + hg : -1;
}

/* Bit of an fa_row_off offset that puts it in the pool's extension (p.kx/p.vx) rather than the pool. */
#define FA_EXT (1LL << 62)

/* Element offset in the K/V pool of position pp's row (KV head kvh) of sequence sq, for a KV range ending at
 * hi, with FA_EXT set for a block of the extension; -1 (a row of zeros) at or past hi, past the block
 * table's row, or for a block id outside the pool. */
__host__ __device__ __forceinline__ long long fa_row_off(const att_params &p, int sq, int kvh, int D, int pp,
                                                         int hi)
{
    if (pp >= hi) return -1;
    const int bi = pp / p.block_size;
    if (bi >= p.max_blocks) return -1;
    const int32_t *e = p.bt + (size_t)sq * p.max_blocks + bi;
#ifdef __CUDA_ARCH__
    const int blk = __ldg(e); /* no kernel writes the table while this runs */
#else
    const int blk = *e;
#endif
    if (blk < 0 || blk >= p.n_blocks) return -1;
    const bool ext = blk >= p.n_main;
    return (((long long)(ext ? blk - p.n_main : blk) * p.block_size + (pp - bi * p.block_size)) * p.n_kv +
            kvh) *
               D |
           (ext ? FA_EXT : 0);
}

/* Halves from a K tile's start of the 16-byte row that `lane` gives to ldmatrix.x4 for S's column blocks 2np
 * and 2np+1 (positions 16np..16np+15) at k-block kc (dims 16kc..16kc+15): matrices (positions +0, dims +0),
 * (+0, +8), (+8, +0), (+8, +8), i.e. b0 b1 of column block 2np, then of 2np+1. */
__host__ __device__ __forceinline__ int fa_k_frag(int DS, int lane, int np, int kc)
{
    return (16 * np + (lane & 7) + ((lane >> 4) << 3)) * DS + 16 * kc + (((lane >> 3) & 1) << 3);
}
/* The same for ldmatrix.x4.trans of a V tile: O's column blocks 2dp and 2dp+1 (dims 16dp..16dp+15) at P's
 * k-block kk (positions 16kk..16kk+15): matrices (positions +0, dims +0), (+8, +0), (+0, +8), (+8, +8). */
__host__ __device__ __forceinline__ int fa_v_frag(int DS, int lane, int kk, int dp)
{
    return (16 * kk + (lane & 7) + (((lane >> 3) & 1) << 3)) * DS + 16 * dp + ((lane >> 4) << 3);
}

__device__ __forceinline__ uint32_t fa_pack_h2(float a, float b)
{
    __half2 h = __floats2half2_rn(a, b);
    return *reinterpret_cast<uint32_t *>(&h);
}

__device__ __forceinline__ void fa_mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1)
{
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* Four 8x8 b16 matrices; lanes 8i..8i+7 give the 16-byte rows of matrix i. */
__device__ __forceinline__ void fa_ldsm4(uint32_t (&r)[4], const void *row)
{
    const unsigned a = (unsigned)__cvta_generic_to_shared(row);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
}
__device__ __forceinline__ void fa_ldsm4_t(uint32_t (&r)[4], const void *row)
{
    const unsigned a = (unsigned)__cvta_generic_to_shared(row);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
}

template <int D> __global__ void __launch_bounds__(FA_THREADS, 2) attn_mma_kernel(const att_params p)
{
    using F = fa_dims<D>;
    constexpr int DS = F::DS, KC = F::KC, NB = F::NB, OB = F::OB, CPR = F::CPR, RPP = F::RPP;
    extern __shared__ __align__(16) unsigned char smem[];
    /* K and V: (2 stages, FA_BN, DS) f16 each, at fa_k_at / fa_v_at; s_off: (2, FA_BN) pool element offsets
     * of two tiles' rows (-1: a row of zeros). */
    long long *s_off = (long long *)(smem + fa_off_at(D));
    __shared__ int s_seq[FA_BM], s_pos[FA_BM];
    __shared__ int s_skip[FA_BM];
    __shared__ int rows_s[FA_BM], nrows_s;

    pdl_wait(); /* q, the cache, the block table and the workspace are written by earlier work */
    pdl_trigger();
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int i0 = fa_window(p, blockIdx.x, gridDim.x);
    const int ntok = min(p.qt, p.m - i0);
    const int kvh = blockIdx.y / p.n_hsub, hsub = blockIdx.y % p.n_hsub;
    const int split = blockIdx.z, gb = p.gb;

    if (tid < ntok) {
        const int i = i0 + tid;
        s_seq[tid] = p.seq[i];
        s_pos[tid] = p.pos[i];
        s_skip[tid] = p.skip == ATT_SKIP_SINGLES && att_single(p, i);
    }
    __syncthreads();
    if (tid == 0) {
        int n = 0;
        for (int r = 0; r < FA_BM; r++) {
            const long long row = fa_qrow(p, i0, ntok, kvh, hsub, r);
            if (row >= 0 && !s_skip[r / gb]) rows_s[n++] = (int)row;
        }
        nrows_s = n;
    }

    /* This thread's two rows (g and g + 8 of its warp's 16): token in the window, row of q and out. */
    const int ra = warp * 16 + g, rb = ra + 8;
    const int tla = ra / gb, tlb = rb / gb;
    const long long rowa = fa_qrow(p, i0, ntok, kvh, hsub, ra), rowb = fa_qrow(p, i0, ntok, kvh, hsub, rb);
    const bool oka = rowa >= 0, okb = rowb >= 0;

    /* Q as A fragments, in base-2 units, rounded to f16 once. */
    uint32_t qf[KC][4];
    {
        const float qs = p.scale * 1.44269504088896341f;
        const float *qa = p.q + rowa * D + 2 * t, *qb = p.q + rowb * D + 2 * t;
#pragma unroll
        for (int kc = 0; kc < KC; kc++) {
            float2 a0 = make_float2(0.f, 0.f), a1 = a0, a2 = a0, a3 = a0;
            if (oka) a0 = *(const float2 *)(qa + 16 * kc), a2 = *(const float2 *)(qa + 16 * kc + 8);
            if (okb) a1 = *(const float2 *)(qb + 16 * kc), a3 = *(const float2 *)(qb + 16 * kc + 8);
            qf[kc][0] = fa_pack_h2(a0.x * qs, a0.y * qs);
            qf[kc][1] = fa_pack_h2(a1.x * qs, a1.y * qs);
            qf[kc][2] = fa_pack_h2(a2.x * qs, a2.y * qs);
            qf[kc][3] = fa_pack_h2(a3.x * qs, a3.y * qs);
        }
    }

    const size_t total = (size_t)p.m * p.n_heads;
    for (int rs = 0; rs < ntok;) {
        const int sq = s_seq[rs];
        int re = rs + 1, maxpos = s_pos[rs];
        while (re < ntok && s_seq[re] == sq) maxpos = max(maxpos, s_pos[re++]);
        if (re - rs == 1 && s_skip[rs]) { /* a decode token: the decode launch's */
            rs = re;
            continue;
        }
        const int lo = split * p.chunk;
        const int hi = split == p.n_split - 1 ? maxpos + 1 : min(lo + p.chunk, maxpos + 1);
        /* Last position each row sees in this range (-1: none; rows of other runs see none). */
        const bool ina = oka && tla >= rs && tla < re, inb = okb && tlb >= rs && tlb < re;
        const int lima = ina ? min(s_pos[tla], hi - 1) : -1, limb = inb ? min(s_pos[tlb], hi - 1) : -1;
        /* First position each row sees (its window's start). */
        const int lowa = ina ? s_pos[tla] + 1 - p.window : 0, lowb = inb ? s_pos[tlb] + 1 - p.window : 0;
        const int tlow = max(lowa, lowb);
        int wlim = max(lima, limb);
        for (int o = 16; o > 0; o >>= 1) wlim = max(wlim, __shfl_xor_sync(0xffffffffu, wlim, o));
        const int tlim = min(lima, limb);

        float o[OB][4];
#pragma unroll
        for (int j = 0; j < OB; j++) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.0f;
        float ma = -INFINITY, mb = -INFINITY, la = 0.0f, lb = 0.0f;

        /* Copies the K and V rows of a tile into stage `st` from the offsets so: thread (row r0 + k*RPP,
         * piece c). One commit group. */
        auto issue = [&](int st, const long long *so) {
            const int c = tid % CPR, r0 = tid / CPR;
            __half *kd = (__half *)(smem + fa_k_at(D, st)), *vd = (__half *)(smem + fa_v_at(D, st));
#pragma unroll
            for (int r = r0; r < FA_BN; r += RPP) {
                const long long off = so[r];
                const int at = r * DS + c * 8;
                if (off >= 0 && p.q8) { /* codes to f16 here, written like the zeros below */
                    const bool ext = off & FA_EXT;
                    const long long o = (off & ~FA_EXT) + c * 8;
                    *(uint4 *)(kd + at) = q8_half8(__ldg((const uint2 *)((ext ? p.kqx : p.kq) + o)),
                                                   __half2float((ext ? p.kscx : p.ksc)[o / 32]));
                    *(uint4 *)(vd + at) = q8_half8(__ldg((const uint2 *)((ext ? p.vqx : p.vq) + o)),
                                                   __half2float((ext ? p.vscx : p.vsc)[o / 32]));
                } else if (off >= 0) {
                    const bool ext = off & FA_EXT;
                    const long long o = (off & ~FA_EXT) + c * 8;
                    cp_async16(kd + at, (ext ? p.kx : p.k) + o);
                    cp_async16(vd + at, (ext ? p.vx : p.v) + o);
                } else {
                    *(uint4 *)(kd + at) = make_uint4(0, 0, 0, 0);
                    *(uint4 *)(vd + at) = make_uint4(0, 0, 0, 0);
                }
            }
            cp_async_commit();
        };

        if (lo < hi) {
            if (tid < FA_BN) {
                s_off[tid] = fa_row_off(p, sq, kvh, D, lo + tid, hi);
                s_off[FA_BN + tid] = fa_row_off(p, sq, kvh, D, lo + FA_BN + tid, hi);
            }
            __syncthreads();
            issue(0, s_off);
        }
        for (int t0 = lo, it = 0; t0 < hi; t0 += FA_BN, it++) {
            const int cur = it & 1;
            cp_async_wait<0>();
            __syncthreads(); /* tile it landed; every warp is done with tile it-1 (its buffers and offsets) */
            if (t0 + FA_BN < hi) issue(cur ^ 1, s_off + (cur ^ 1) * FA_BN); /* tile it+1, during this one */
            const long long off_next =
                tid < FA_BN && t0 + 2 * FA_BN < hi ? fa_row_off(p, sq, kvh, D, t0 + 2 * FA_BN + tid, hi) : -1;
            if (t0 <= wlim) { /* this warp has a row that sees a position of the tile */
                const __half *Kc = (const __half *)(smem + fa_k_at(D, cur));
                const __half *Vc = (const __half *)(smem + fa_v_at(D, cur));
                float s[NB][4];
#pragma unroll
                for (int j = 0; j < NB; j++) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
#pragma unroll
                for (int kc = 0; kc < KC; kc++) {
#pragma unroll
                    for (int np = 0; np < FA_BN / 16; np++) {
                        uint32_t b[4];
                        fa_ldsm4(b, Kc + fa_k_frag(DS, lane, np, kc));
                        fa_mma(s[2 * np], qf[kc], b[0], b[1]);
                        fa_mma(s[2 * np + 1], qf[kc], b[2], b[3]);
                    }
                }
                if (t0 + FA_BN - 1 > tlim) { /* some position of the tile is past one of this thread's rows */
#pragma unroll
                    for (int j = 0; j < NB; j++) {
                        const int c0 = t0 + 8 * j + 2 * t;
                        if (c0 > lima) s[j][0] = -INFINITY;
                        if (c0 + 1 > lima) s[j][1] = -INFINITY;
                        if (c0 > limb) s[j][2] = -INFINITY;
                        if (c0 + 1 > limb) s[j][3] = -INFINITY;
                    }
                }
                if (t0 < tlow) { /* some position of the tile is before one of this thread's rows' window */
#pragma unroll
                    for (int j = 0; j < NB; j++) {
                        const int c0 = t0 + 8 * j + 2 * t;
                        if (c0 < lowa) s[j][0] = -INFINITY;
                        if (c0 + 1 < lowa) s[j][1] = -INFINITY;
                        if (c0 < lowb) s[j][2] = -INFINITY;
                        if (c0 + 1 < lowb) s[j][3] = -INFINITY;
                    }
                }
                float xa = -INFINITY, xb = -INFINITY;
#pragma unroll
                for (int j = 0; j < NB; j++) {
                    xa = fmaxf(xa, fmaxf(s[j][0], s[j][1]));
                    xb = fmaxf(xb, fmaxf(s[j][2], s[j][3]));
                }
                xa = fmaxf(xa, __shfl_xor_sync(0xffffffffu, xa, 1));
                xa = fmaxf(xa, __shfl_xor_sync(0xffffffffu, xa, 2));
                xb = fmaxf(xb, __shfl_xor_sync(0xffffffffu, xb, 1));
                xb = fmaxf(xb, __shfl_xor_sync(0xffffffffu, xb, 2));
                /* A row with no visible position yet keeps max -inf: exponents are taken from 0 instead,
                 * so its P is exp2(-inf) = 0 and its rescale factor exp2(-inf - 0) = 0, never -inf - -inf. */
                const float na = fmaxf(ma, xa), nb = fmaxf(mb, xb);
                const float ba = na == -INFINITY ? 0.0f : na, bb = nb == -INFINITY ? 0.0f : nb;
                const float aa = exp2f(ma - ba), ab = exp2f(mb - bb);
                ma = na, mb = nb;
                float sa = 0.0f, sb = 0.0f;
#pragma unroll
                for (int j = 0; j < NB; j++) {
                    s[j][0] = exp2f(s[j][0] - ba);
                    s[j][1] = exp2f(s[j][1] - ba);
                    s[j][2] = exp2f(s[j][2] - bb);
                    s[j][3] = exp2f(s[j][3] - bb);
                    sa += s[j][0] + s[j][1];
                    sb += s[j][2] + s[j][3];
                }
                la = la * aa + sa;
                lb = lb * ab + sb;
#pragma unroll
                for (int j = 0; j < OB; j++) o[j][0] *= aa, o[j][1] *= aa, o[j][2] *= ab, o[j][3] *= ab;
#pragma unroll
                for (int kk = 0; kk < FA_BN / 16; kk++) {
                    uint32_t pf[4]; /* P's k-block kk as an A fragment: S's column blocks 2kk, 2kk+1 */
                    pf[0] = fa_pack_h2(s[2 * kk][0], s[2 * kk][1]);
                    pf[1] = fa_pack_h2(s[2 * kk][2], s[2 * kk][3]);
                    pf[2] = fa_pack_h2(s[2 * kk + 1][0], s[2 * kk + 1][1]);
                    pf[3] = fa_pack_h2(s[2 * kk + 1][2], s[2 * kk + 1][3]);
#pragma unroll
                    for (int dp = 0; dp < D / 16; dp++) {
                        uint32_t b[4];
                        fa_ldsm4_t(b, Vc + fa_v_frag(DS, lane, kk, dp));
                        fa_mma(o[2 * dp], pf, b[0], b[1]);
                        fa_mma(o[2 * dp + 1], pf, b[2], b[3]);
                    }
                }
            }
            /* Tile it+2's offsets go where tile it's were (read by the issue of the previous iteration). */
            if (tid < FA_BN) s_off[cur * FA_BN + tid] = off_next;
        }

        /* The run's rows: row sums over the quad, then normalised output or the split's partial. */
        la += __shfl_xor_sync(0xffffffffu, la, 1);
        la += __shfl_xor_sync(0xffffffffu, la, 2);
        lb += __shfl_xor_sync(0xffffffffu, lb, 1);
        lb += __shfl_xor_sync(0xffffffffu, lb, 2);
        if (p.n_split == 1) {
            /* (rows outside the window, -1, are not written: their head is not read either) */
            const float sa = ina ? att_sink_sum<true>(p, (int)(rowa % p.n_heads), ma, la) : la,
                        sb = inb ? att_sink_sum<true>(p, (int)(rowb % p.n_heads), mb, lb) : lb;
            const float ia = sa > 0.0f ? 1.0f / sa : 0.0f, ib = sb > 0.0f ? 1.0f / sb : 0.0f;
#pragma unroll
            for (int j = 0; j < OB; j++) {
                if (ina)
                    *(float2 *)(p.out + rowa * D + 8 * j + 2 * t) = make_float2(o[j][0] * ia, o[j][1] * ia);
                if (inb)
                    *(float2 *)(p.out + rowb * D + 8 * j + 2 * t) = make_float2(o[j][2] * ib, o[j][3] * ib);
            }
            if (p.lse && t == 0 && ina) p.lse[rowa] = att_lse<true>(ma, la);
            if (p.lse && t == 0 && inb) p.lse[rowb] = att_lse<true>(mb, lb);
        } else {
            const size_t pa = (size_t)split * total + rowa, pb = (size_t)split * total + rowb;
#pragma unroll
            for (int j = 0; j < OB; j++) {
                if (ina) *(float2 *)(p.ws_o + pa * D + 8 * j + 2 * t) = make_float2(o[j][0], o[j][1]);
                if (inb) *(float2 *)(p.ws_o + pb * D + 8 * j + 2 * t) = make_float2(o[j][2], o[j][3]);
            }
            if (t == 0 && ina) p.ws_ml[pa] = make_float2(ma, la);
            if (t == 0 && inb) p.ws_ml[pb] = make_float2(mb, lb);
        }
        rs = re;
        cp_async_wait<0>();
        __syncthreads(); /* the next run rewrites s_off and the tiles */
    }
    if (p.n_split > 1) {
        /* The K/V tiles are dead: the merge weights reuse them (the host sized n_split for that). */
        if (att_last_arrival(p)) att_merge_rows<true>(p, rows_s, nrows_s, (float *)smem);
    }
}

/* The attention temperature of a row at pos, as llm_attn_temp computes it on the CPU: the quotient and the
 * sum in f32 (IEEE division: the build has no fast-math), the logarithm in double rounded to f32 (equal to
 * glibc's logf for every 1 + floor(pos / len) below 1578, where CUDA's logf may be 1 ulp off), and
 * 1 + beta · ln as one fused multiply-add, as gcc -march=native compiles the CPU's on an FMA host. */
__device__ __forceinline__ float rope_attn_temp(int pos, float beta, int len)
{
    const float k = floorf(__fdiv_rn((float)pos, (float)len));
    return __fmaf_rn(beta, (float)log((double)__fadd_rn(1.0f, k)), 1.0f);
}

/* A query element after rotation: times rot when it is one of the rotated dims, then times the row's
 * temperature (kern_cuda_q_scale; each multiply skipped at 1, so models without them are unchanged). */
__device__ __forceinline__ float rope_q_scaled(float x, bool rotated, int pos, struct kern_cuda_q_scale qs)
{
    if (rotated && qs.rot != 1.0f) x = __fmul_rn(x, qs.rot);
    if (qs.temp_beta != 0.0f) x = __fmul_rn(x, rope_attn_temp(pos, qs.temp_beta, qs.temp_len));
    return x;
}

/* One thread per element pair of a token: the query and key heads' pairs are rotated (the first rope_dim
 * dims, pairs as in kernels/core/rope.h; angle = pos * inv_freq[i] in f32, cos/sin in double, like the CPU),
 * the rest copied; queries, scaled by qs, go to q_out (f32), keys and values to the cache (f16). */
__global__ void rope_kv_store_kernel(float *q_out, const float *qkv, __half *kc, __half *vc, __half *kcx,
                                     __half *vcx, const int32_t *seq, const int32_t *pos, const int32_t *bt,
                                     const float *inv_freq, int m, int n_heads, int n_kv, int D, int rope_dim,
                                     int half_style, int n_blocks, int n_main, int block_size, int max_blocks,
                                     struct kern_cuda_q_scale qs)
{
    pdl_wait();
    pdl_trigger();
    const int pairs = D / 2, heads = n_heads + 2 * n_kv, half = rope_dim / 2;
    const int qd = n_heads * D, kvd = n_kv * D;
    const int64_t total = (int64_t)m * heads * pairs;
    for (int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; t < total;
         t += (int64_t)gridDim.x * blockDim.x) {
        const int j = (int)(t % pairs);
        const int h = (int)((t / pairs) % heads);
        const int tok = (int)(t / ((int64_t)pairs * heads));
        const float *src = qkv + (size_t)tok * (qd + 2 * kvd) + (size_t)h * D;
        int i0, i1;
        float x0, x1;
        if (h < n_heads + n_kv && j < half) {
            i0 = half_style ? j : 2 * j;
            i1 = half_style ? j + half : 2 * j + 1;
            const float angle = __fmul_rn((float)pos[tok], inv_freq[j]);
            double sd, cd;
            sincos((double)angle, &sd, &cd);
            const float cf = (float)cd, sf = (float)sd, a = src[i0], b = src[i1];
            x0 = a * cf - b * sf;
            x1 = a * sf + b * cf;
        } else {
            i0 = h < n_heads + n_kv ? rope_dim + 2 * (j - half) : 2 * j;
            i1 = i0 + 1;
            x0 = src[i0];
            x1 = src[i1];
        }
        if (h < n_heads) {
            float *dst = q_out + (size_t)tok * qd + (size_t)h * D;
            dst[i0] = rope_q_scaled(x0, j < half, pos[tok], qs);
            dst[i1] = rope_q_scaled(x1, j < half, pos[tok], qs);
            continue;
        }
        const int pp = pos[tok];
        if (pp < 0 || pp / block_size >= max_blocks) continue;
        const int blk = bt[(size_t)seq[tok] * max_blocks + pp / block_size];
        if (blk < 0 || blk >= n_blocks) continue;
        const int kh = h < n_heads + n_kv ? h - n_heads : h - n_heads - n_kv;
        const bool ext = blk >= n_main;
        __half *base = h < n_heads + n_kv ? (ext ? kcx : kc) : (ext ? vcx : vc);
        __half *dst =
            base + (((size_t)(ext ? blk - n_main : blk) * block_size + pp % block_size) * n_kv + kh) * D;
        dst[i0] = __float2half_rn(x0);
        dst[i1] = __float2half_rn(x1);
    }
}

/* rope_kv_store_kernel for a Q8_0 cache, in one launch: one thread per element, a warp per block of 32
 * elements of a token's query, key or value head (D a multiple of 32, the grid a multiple of 32 threads and
 * the total one too, so every lane of a warp takes the same branches and the same number of iterations).
 * Queries and keys are rotated as rope_kv_store_kernel does, queries written in f32, keys and values
 * quantized as quantize_row_q8_0_ref: d = max|x| / 127 (the max by shuffles), codes round(x · (1/d)), d
 * stored as f16; queries scaled by qs. */
__global__ void rope_kv_store_q8_kernel(float *q_out, const float *qkv, int8_t *kc, int8_t *vc, __half *ks,
                                        __half *vs, int8_t *kcx, int8_t *vcx, __half *ksx, __half *vsx,
                                        const int32_t *seq, const int32_t *pos, const int32_t *bt,
                                        const float *inv_freq, int m, int n_heads, int n_kv, int D,
                                        int rope_dim, int half_style, int n_blocks, int n_main,
                                        int block_size, int max_blocks, struct kern_cuda_q_scale qs)
{
    pdl_wait();
    pdl_trigger();
    const int heads = n_heads + 2 * n_kv, qd = n_heads * D, kvd = n_kv * D, half = rope_dim / 2;
    const int64_t total = (int64_t)m * heads * D;
    for (int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; t < total;
         t += (int64_t)gridDim.x * blockDim.x) {
        const int el = (int)(t % D), h = (int)((t / D) % heads), tok = (int)(t / ((int64_t)D * heads));
        const int pp = pos[tok];
        const float *src = qkv + (size_t)tok * (qd + 2 * kvd) + (size_t)h * D;
        const bool rot = h < n_heads + n_kv;
        float val = src[el];
        if (rot && el < rope_dim) {
            const bool first = half_style ? el < half : (el & 1) == 0;
            const int j = half_style ? (first ? el : el - half) : el / 2;
            const float a = src[half_style ? j : 2 * j], c = src[half_style ? j + half : 2 * j + 1];
            const float angle = __fmul_rn((float)pp, inv_freq[j]);
            double sd, cd;
            sincos((double)angle, &sd, &cd);
            const float cf = (float)cd, sf = (float)sd;
            val = first ? a * cf - c * sf : a * sf + c * cf;
        }
        if (h < n_heads) {
            q_out[(size_t)tok * qd + (size_t)h * D + el] = rope_q_scaled(val, el < rope_dim, pp, qs);
            continue;
        }
        if (pp < 0 || pp / block_size >= max_blocks) continue;
        const int blk = bt[(size_t)seq[tok] * max_blocks + pp / block_size];
        if (blk < 0 || blk >= n_blocks) continue;
        float amax = fabsf(val);
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
        const float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        const bool is_v = !rot, ext = blk >= n_main;
        const size_t r = ((size_t)(ext ? blk - n_main : blk) * block_size + pp % block_size) * n_kv +
                         (is_v ? h - n_heads - n_kv : h - n_heads);
        (is_v ? (ext ? vcx : vc) : (ext ? kcx : kc))[r * D + el] = (int8_t)(int)roundf(val * id);
        if ((el & 31) == 0)
            (is_v ? (ext ? vsx : vs) : (ext ? ksx : ks))[r * (D / 32) + el / 32] = __float2half_rn(d);
    }
}

/* ----------------------------------------------------------------------------------------------------------
 */
/* host side */

struct att_plan {
    int qt, gb, n_hsub, n_tiles, n_split, chunk;
    int rm; /* decode kernel: rows per KV head in registers (1, 2, 4, 8); 0: the tile kernel */
    int hb; /* decode kernel: KV heads per block */
};

static size_t split_bytes(int n_split, int m, int n_heads, int D)
{
    return (size_t)n_split * m * n_heads * ((size_t)D + 2) * sizeof(float);
}

/* Splits of the KV range for a grid of `base` blocks (tokens x heads): enough to fill one wave of occ * sms
 * blocks, at most max_split (what the merging block's shared memory holds), one per 64 positions, what the
 * workspace holds after its counters, and none for grids with more rows than there are counters. */
static void plan_splits(struct att_plan *pl, int64_t base, int m, int n_heads, int D, int max_len,
                        size_t ws_bytes, int occ, int max_split, int sms)
{
    const int64_t target = (int64_t)occ * sms;
    int ns = base >= target || base > ATT_MAX_ROWS ? 1 : (int)(target / base);
    const int len_split = (max_len + ATT_T - 1) / ATT_T;
    if (ns > len_split) ns = len_split;
    if (ns > max_split) ns = max_split;
    const size_t per = split_bytes(1, m, n_heads, D);
    const size_t avail = ws_bytes > ATT_CNT_BYTES ? ws_bytes - ATT_CNT_BYTES : 0;
    if (ns > 1 && (size_t)ns * per > avail) ns = (int)(avail / per);
    if (ns < 1) ns = 1;
    int chunk = (max_len + ns - 1) / ns;
    chunk = (chunk + ATT_T - 1) / ATT_T * ATT_T;
    if (chunk < ATT_T) chunk = ATT_T;
    pl->chunk = chunk;
    pl->n_split = ns > 1 ? (max_len + chunk - 1) / chunk : 1;
    if (pl->n_split < 1) pl->n_split = 1;
}

/* The tile kernel's plan for `rows` rows of a batch of m; occ: its blocks resident per SM. */
static struct att_plan make_plan(int rows, int m, int n_heads, int n_kv, int D, int max_len, bool decode,
                                 size_t ws_bytes, int occ, int max_split)
{
    struct att_plan pl;
    const int G = n_heads / n_kv;
    pl.rm = 0;
    pl.hb = 1;
    pl.gb = G < ATT_RMAX ? G : ATT_RMAX;
    pl.n_hsub = (G + pl.gb - 1) / pl.gb;
    pl.qt = decode ? 1 : (ATT_RMAX / pl.gb > 0 ? ATT_RMAX / pl.gb : 1);
    pl.n_tiles = (rows + pl.qt - 1) / pl.qt;
    plan_splits(&pl, (int64_t)pl.n_tiles * n_kv * pl.n_hsub, m, n_heads, D, max_len, ws_bytes, occ, max_split,
                fcuda_sm_count());
    return pl;
}

static size_t attn_smem_bytes(int D, int stages)
{
    return (size_t)ATT_RMAX * D * 4 + 2 * (size_t)stages * ATT_T * (D + ATT_KPAD) * 2 +
           (size_t)ATT_RMAX * ATT_T * 4 + 4 * ATT_RMAX * 4;
}

/* Splits whose merge weights (ATT_RMAX rows) fit in the tile kernel's K/V and score buffers. */
static int tile_max_split(int D, int stages)
{
    const int n = (int)((attn_smem_bytes(D, stages) - (size_t)ATT_RMAX * D * 4) / 4 / ATT_RMAX);
    return n < ATT_MAX_SPLIT ? n : ATT_MAX_SPLIT;
}

static size_t dec_smem_bytes(int D, int hb, int rm)
{
    const size_t merge = (size_t)DEC_WARPS * hb * rm * ((size_t)D * 4 + 8);
    return merge > DEC_RING_BYTES ? merge : DEC_RING_BYTES;
}

/* Splits whose merge weights (hb * G rows) fit in the decode kernel's shared memory. */
static int dec_max_split(int D, int hb, int rm, int G)
{
    const int n = (int)(dec_smem_bytes(D, hb, rm) / 4 / (hb * G));
    return n < ATT_MAX_SPLIT ? n : ATT_MAX_SPLIT;
}

static int g_stages =
    1; /* K/V buffers per block: kern_cuda_attention_set_stages (1 measured faster, NOTES.md) */
static int g_dec_heads =
    0; /* kern_cuda_attention_set_decode_heads: 0 default, -1 tile kernel only, else HB */

extern "C" void kern_cuda_attention_set_stages(int stages)
{
    g_stages = stages == 2 ? 2 : 1;
}

extern "C" void kern_cuda_attention_set_decode_heads(int heads)
{
    g_dec_heads = heads == -1 || heads == 1 || heads == 2 || heads == 4 || heads == 8 ? heads : 0;
}

/* Raises the dynamic shared-memory limit of both tile kernel variants once (up to head_dim ATT_DMAX); the
 * decode kernel stays under the default 48 KB. */
static int attn_prepare(void)
{
    static bool done = false;
    if (!done) {
        FCUDA_CHECK(cudaFuncSetAttribute(attn_kernel<1, 1>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         (int)attn_smem_bytes(ATT_DMAX, 1)));
        FCUDA_CHECK(cudaFuncSetAttribute(attn_kernel<2, 1>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         (int)attn_smem_bytes(ATT_DMAX, 2)));
        done = true;
    }
    return FERRY_OK;
}

/* The wide variant's limit (head_dim up to ATT_DMAX_WIDE, one stage: 166 KB at 512), raised on first use
 * only, so that a device with less shared memory per block (sm_86, sm_89) refuses only those head sizes:
 * FERRY_ERR_UNSUPPORTED there. */
static int attn_prepare_wide(void)
{
    static int state = 0; /* 0 not tried, 1 ok, -1 refused */
    if (!state) {
        state = cudaFuncSetAttribute(attn_kernel<1, 2>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     (int)attn_smem_bytes(ATT_DMAX_WIDE, 1)) == cudaSuccess
                    ? 1
                    : -1;
        if (state < 0) (void)cudaGetLastError();
    }
    return state > 0 ? FERRY_OK : FERRY_ERR_UNSUPPORTED;
}

extern "C" int kern_cuda_attention_supports(int head_dim)
{
    if (head_dim <= 0 || head_dim % 8 || head_dim > ATT_DMAX_WIDE) return FERRY_ERR_UNSUPPORTED;
    return head_dim <= ATT_DMAX ? FERRY_OK : attn_prepare_wide();
}

/* The tile kernel variant for head_dim D: its K/V stages (the wide variant has one) and the kernel. */
typedef void (*tile_kernel_fn)(const att_params);
static int tile_stages(int D)
{
    return D > ATT_DMAX ? 1 : g_stages;
}
static tile_kernel_fn tile_kernel(int D)
{
    return D > ATT_DMAX ? attn_kernel<1, 2> : tile_stages(D) == 1 ? attn_kernel<1, 1> : attn_kernel<2, 1>;
}

/* Resident blocks per SM of the tile kernel variant at head_dim D (cached; 2 if the query fails). */
static int blocks_per_sm(int D, int stages)
{
    static int cache[2][ATT_DMAX_WIDE / 8 + 1];
    if (D > ATT_DMAX) stages = 1;
    int *c = &cache[stages - 1][D / 8];
    if (!*c) {
        int nb = 0, n_dev = 0;
        if (cudaGetDeviceCount(&n_dev) != cudaSuccess || n_dev == 0) { /* planning offline (ferry inspect) */
            (void)cudaGetLastError();
            return 2;
        }
        if (attn_prepare() == FERRY_OK && (D <= ATT_DMAX || attn_prepare_wide() == FERRY_OK) &&
            cudaOccupancyMaxActiveBlocksPerMultiprocessor(
                &nb, D > ATT_DMAX ? attn_kernel<1, 2> : stages == 1 ? attn_kernel<1, 1> : attn_kernel<2, 1>,
                ATT_THREADS, attn_smem_bytes(D, stages)) == cudaSuccess &&
            nb > 0)
            *c = nb;
        else {
            (void)cudaGetLastError();
            return 2;
        }
    }
    return *c;
}

static int rm_index(int rm)
{
    return rm == 1 ? 0 : rm == 2 ? 1 : rm == 4 ? 2 : 3;
}

typedef void (*dec_kernel_fn)(const att_params);
static dec_kernel_fn dec_kernel(int rm, int q8)
{
    const dec_kernel_fn k[2][4] = {{attn_decode_kernel<1, false>, attn_decode_kernel<2, false>,
                                    attn_decode_kernel<4, false>, attn_decode_kernel<8, false>},
                                   {attn_decode_kernel<1, true>, attn_decode_kernel<2, true>,
                                    attn_decode_kernel<4, true>, attn_decode_kernel<8, true>}};
    return k[q8 != 0][rm_index(rm)];
}

/* Resident blocks per SM of the decode kernel (cached; 2 if the query fails). */
static int dec_blocks_per_sm(int D, int hb, int rm, int q8)
{
    static int cache[2][4][ATT_DMAX_WIDE / 8 + 1][4];
    const int hi = hb == 1 ? 0 : hb == 2 ? 1 : hb == 4 ? 2 : 3;
    int *c = &cache[q8 != 0][rm_index(rm)][D / 8][hi];
    if (!*c) {
        int nb = 0;
        if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&nb, dec_kernel(rm, q8), DEC_THREADS,
                                                          dec_smem_bytes(D, hb, rm)) == cudaSuccess &&
            nb > 0)
            *c = nb;
        else {
            (void)cudaGetLastError();
            return 2;
        }
    }
    return *c;
}

/* The decode kernel's plan, or rm = 0 when it does not take the batch: it needs head_dim/8 a power of two (a
 * lane group per position within a warp), at most 8 query heads per KV head, and a block size for which the
 * multiply-shift division is exact over the table. */
static struct att_plan make_dec_plan(int rows, int m, int n_heads, const struct kern_cuda_kv_layer *kv,
                                     int max_len, size_t ws_bytes)
{
    struct att_plan pl;
    memset(&pl, 0, sizeof pl);
    const int D = kv->head_dim, LP = D / 8, G = n_heads / kv->n_kv_heads;
    if (g_dec_heads < 0 || (LP & (LP - 1)) || LP > 32 || G > 8) return pl;
    if ((unsigned long long)kv->max_blocks * kv->block_size * kv->block_size > (1ull << 32)) return pl;
    int hb = g_dec_heads > 0 ? g_dec_heads : 1;
    if (hb * LP > 32 || kv->n_kv_heads % hb) hb = 1;
    const int rm = G <= 1 ? 1 : G <= 2 ? 2 : G <= 4 ? 4 : 8;
    pl.rm = rm;
    pl.hb = hb;
    pl.gb = G;
    pl.n_hsub = 1;
    pl.qt = 1;
    pl.n_tiles = rows;
    plan_splits(&pl, (int64_t)rows * (kv->n_kv_heads / hb), m, n_heads, D, max_len, ws_bytes,
                dec_blocks_per_sm(D, hb, rm, kv->q8), dec_max_split(D, hb, rm, G), fcuda_sm_count());
    return pl;
}

extern "C" size_t kern_cuda_attention_ws_size(int m, int n_heads, int head_dim, int max_len)
{
    if (m <= 0 || n_heads <= 0 || head_dim <= 0 || max_len <= 0 || head_dim > ATT_DMAX_WIDE) return 0;
    /* Decode tiles with one KV head give the most splits, and the kernel with the most resident blocks; bound
     * by that. */
    int occ = max(blocks_per_sm(head_dim, 1), head_dim <= ATT_DMAX ? blocks_per_sm(head_dim, 2) : 0);
    if (!((head_dim / 8) & (head_dim / 8 - 1)) && head_dim / 8 <= 32)
        for (int rm = 1; rm <= 8; rm *= 2)
            for (int q8 = 0; q8 < 2; q8++) occ = max(occ, dec_blocks_per_sm(head_dim, 1, rm, q8));
    /* Any batch of up to m tokens: the runtime sizes the workspace once for its largest batch, and smaller
     * batches (one decode token) take the most splits. Past occ * SMs tokens there are no splits. */
    const int64_t last = min((int64_t)m, (int64_t)occ * fcuda_sm_count());
    size_t best = 0;
    for (int mm = 1; mm <= last; mm++) {
        struct att_plan pl;
        plan_splits(&pl, mm, mm, n_heads, head_dim, max_len, SIZE_MAX, occ, ATT_MAX_SPLIT, fcuda_sm_count());
        const size_t b = pl.n_split > 1 ? split_bytes(pl.n_split, mm, n_heads, head_dim) : 0;
        if (b > best) best = b;
    }
    return best ? best + ATT_CNT_BYTES : 0;
}

static int check_kv(const struct kern_cuda_kv_layer *kv)
{
    if (!kv || !kv->k || !kv->v || !kv->block_table) return FERRY_ERR_INVALID;
    if (kv->n_blocks <= 0 || kv->block_size <= 0 || kv->max_blocks <= 0 || kv->n_kv_heads <= 0)
        return FERRY_ERR_INVALID;
    if (kv->n_ext < 0 || kv->n_ext > kv->n_blocks ||
        (kv->n_ext &&
         (!kv->k_ext || !kv->v_ext || !FCUDA_ALIGNED(kv->k_ext, 16) || !FCUDA_ALIGNED(kv->v_ext, 16))))
        return FERRY_ERR_INVALID;
    if (kv->head_dim <= 0 || kv->head_dim % 8 || kv->head_dim > ATT_DMAX_WIDE) return FERRY_ERR_UNSUPPORTED;
    if (kv->sinks && !FCUDA_ALIGNED(kv->sinks, 4)) return FERRY_ERR_INVALID;
    if (kv->q8 && kv->head_dim % 64) return FERRY_ERR_UNSUPPORTED;
    if (kv->q8 &&
        (!kv->k_scale || !kv->v_scale || !FCUDA_ALIGNED(kv->k_scale, 4) || !FCUDA_ALIGNED(kv->v_scale, 4)))
        return FERRY_ERR_INVALID;
    if (kv->q8 && kv->n_ext &&
        (!kv->k_ext_scale || !kv->v_ext_scale || !FCUDA_ALIGNED(kv->k_ext_scale, 4) ||
         !FCUDA_ALIGNED(kv->v_ext_scale, 4)))
        return FERRY_ERR_INVALID;
    if (!FCUDA_ALIGNED(kv->k, 16) || !FCUDA_ALIGNED(kv->v, 16) || !FCUDA_ALIGNED(kv->block_table, 4))
        return FERRY_ERR_INVALID;
    return FERRY_OK;
}

/* A finite rotary factor, and a temperature's original context positive where it has one. */
static bool q_scale_valid(struct kern_cuda_q_scale qs)
{
    return isfinite(qs.rot) && isfinite(qs.temp_beta) && (qs.temp_beta == 0.0f || qs.temp_len > 0);
}

extern "C" int kern_cuda_rope_kv_store(float *q_out, const float *qkv, const struct kern_cuda_kv_layer *kv,
                                       const int32_t *seq, const int32_t *pos, int m, int n_heads,
                                       int rope_dim, const float *inv_freq, enum rope_style style,
                                       struct kern_cuda_q_scale qs, cudaStream_t stream)
{
    int rc = check_kv(kv);
    if (rc) return rc;
    if (!q_scale_valid(qs)) return FERRY_ERR_INVALID;
    if (!q_out || !qkv || !seq || !pos || !inv_freq || m < 0 || n_heads <= 0) return FERRY_ERR_INVALID;
    if (rope_dim <= 0 || rope_dim > kv->head_dim || rope_dim % 2) return FERRY_ERR_INVALID;
    if (style != ROPE_STYLE_INTERLEAVED && style != ROPE_STYLE_HALF) return FERRY_ERR_INVALID;
    if (!FCUDA_ALIGNED(q_out, 4) || !FCUDA_ALIGNED(qkv, 4) || !FCUDA_ALIGNED(seq, 4) ||
        !FCUDA_ALIGNED(pos, 4) || !FCUDA_ALIGNED(inv_freq, 4))
        return FERRY_ERR_INVALID;
    if (m == 0) return FERRY_OK;
    if (kv->q8) {
        if (!FCUDA_ALIGNED(q_out, 16)) return FERRY_ERR_INVALID;
        const int64_t total = (int64_t)m * (n_heads + 2 * kv->n_kv_heads) * kv->head_dim;
        FCUDA_CHECK(pdl_launch(rope_kv_store_q8_kernel, dim3(fcuda_blocks(total, 128)), dim3(128), 0, stream,
                               q_out, qkv, (int8_t *)kv->k, (int8_t *)kv->v, (__half *)kv->k_scale,
                               (__half *)kv->v_scale, (int8_t *)kv->k_ext, (int8_t *)kv->v_ext,
                               (__half *)kv->k_ext_scale, (__half *)kv->v_ext_scale, seq, pos,
                               kv->block_table, inv_freq, m, n_heads, kv->n_kv_heads, kv->head_dim, rope_dim,
                               (int)(style == ROPE_STYLE_HALF), kv->n_blocks, kv->n_blocks - kv->n_ext,
                               kv->block_size, kv->max_blocks, qs));
        return FERRY_OK;
    }
    const int64_t total = (int64_t)m * (n_heads + 2 * kv->n_kv_heads) * (kv->head_dim / 2);
    FCUDA_CHECK(pdl_launch(rope_kv_store_kernel, dim3(fcuda_blocks(total, 256)), dim3(256), 0, stream, q_out,
                           qkv, (__half *)kv->k, (__half *)kv->v, (__half *)kv->k_ext, (__half *)kv->v_ext,
                           seq, pos, kv->block_table, inv_freq, m, n_heads, kv->n_kv_heads, kv->head_dim,
                           rope_dim, (int)(style == ROPE_STYLE_HALF), kv->n_blocks, kv->n_blocks - kv->n_ext,
                           kv->block_size, kv->max_blocks, qs));
    return FERRY_OK;
}

extern "C" int kern_cuda_rope_q(float *q_out, const float *q, const int32_t *pos, int m, int n_heads,
                                int head_dim, int rope_dim, const float *inv_freq, enum rope_style style,
                                struct kern_cuda_q_scale qs, cudaStream_t stream)
{
    if (!q_out || !q || q_out == q || !pos || !inv_freq || m < 0 || n_heads <= 0 || head_dim <= 0 ||
        head_dim % 2 || rope_dim <= 0 || rope_dim > head_dim || rope_dim % 2 || !q_scale_valid(qs))
        return FERRY_ERR_INVALID;
    if (style != ROPE_STYLE_INTERLEAVED && style != ROPE_STYLE_HALF) return FERRY_ERR_INVALID;
    if (!FCUDA_ALIGNED(q_out, 4) || !FCUDA_ALIGNED(q, 4) || !FCUDA_ALIGNED(pos, 4) ||
        !FCUDA_ALIGNED(inv_freq, 4))
        return FERRY_ERR_INVALID;
    if (m == 0) return FERRY_OK;
    /* The store kernel with no KV heads: rows of n_heads heads, every head a query (the cache untouched). */
    const int64_t total = (int64_t)m * n_heads * (head_dim / 2);
    FCUDA_CHECK(pdl_launch(rope_kv_store_kernel, dim3(fcuda_blocks(total, 256)), dim3(256), 0, stream, q_out, q,
                           (__half *)NULL, (__half *)NULL, (__half *)NULL, (__half *)NULL, (const int32_t *)NULL,
                           pos, (const int32_t *)NULL, inv_freq, m, n_heads, 0, head_dim, rope_dim,
                           (int)(style == ROPE_STYLE_HALF), 0, 0, 1, 1, qs));
    return FERRY_OK;
}

/* ---- the tensor-core prefill kernel's host side ---- */

/* On by default (its first GPU run faulted on a shared-memory layout bug, fixed since and covered by
 * kern_cuda_attention_mma_audit in CI); kern_cuda_attention_set_prefill_mma(0) sends prefill rows to the SIMT
 * tile kernel. */
static int g_prefill_mma = 1; /* kern_cuda_attention_set_prefill_mma */

extern "C" void kern_cuda_attention_set_prefill_mma(int on)
{
    g_prefill_mma = on == 0 ? 0 : 1;
}

static bool mma_takes(int D)
{
    return g_prefill_mma && (D == 64 || D == 128);
}

static size_t mma_smem_bytes(int D)
{
    return (size_t)fa_smem_bytes(D);
}

typedef void (*mma_kernel_fn)(const att_params);
static mma_kernel_fn mma_kernel(int D)
{
    return D == 64 ? attn_mma_kernel<64> : attn_mma_kernel<128>;
}

/* Raises the dynamic shared-memory limit of both tensor-core kernels once (70 KB at head_dim 128). */
static int mma_prepare(void)
{
    static bool done = false;
    if (!done) {
        FCUDA_CHECK(cudaFuncSetAttribute(attn_mma_kernel<64>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         (int)mma_smem_bytes(64)));
        FCUDA_CHECK(cudaFuncSetAttribute(attn_mma_kernel<128>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         (int)mma_smem_bytes(128)));
        done = true;
    }
    return FERRY_OK;
}

/* Resident blocks per SM of the tensor-core kernel at head_dim D (cached; 2 if the query fails). */
static int mma_blocks_per_sm(int D)
{
    static int cache[2];
    int *c = &cache[D == 128];
    if (!*c) {
        int nb = 0;
        if (mma_prepare() == FERRY_OK &&
            cudaOccupancyMaxActiveBlocksPerMultiprocessor(&nb, mma_kernel(D), FA_THREADS,
                                                          mma_smem_bytes(D)) == cudaSuccess &&
            nb > 0)
            *c = nb;
        else {
            (void)cudaGetLastError();
            return 2;
        }
    }
    return *c;
}

/* Splits whose merge weights (FA_BM rows) fit in the tensor-core kernel's shared memory. */
static int mma_max_split(int D)
{
    const int n = (int)(mma_smem_bytes(D) / 4 / FA_BM);
    return n < ATT_MAX_SPLIT ? n : ATT_MAX_SPLIT;
}

/* The tensor-core kernel's plan for `rows` rows of a batch of m: windows of FA_BM / gb tokens x the gb query
 * heads (of G) of one KV head, splits for a device of sms SMs holding occ blocks each. */
static struct att_plan mma_plan(int rows, int m, int n_heads, int n_kv, int D, int max_len, size_t ws_bytes,
                                int occ, int sms)
{
    struct att_plan pl;
    memset(&pl, 0, sizeof pl);
    const int G = n_heads / n_kv;
    pl.hb = 1;
    pl.gb = G < FA_BM ? G : FA_BM;
    pl.n_hsub = (G + pl.gb - 1) / pl.gb;
    pl.qt = FA_BM / pl.gb;
    pl.n_tiles = (rows + pl.qt - 1) / pl.qt;
    plan_splits(&pl, (int64_t)pl.n_tiles * n_kv * pl.n_hsub, m, n_heads, D, max_len, ws_bytes, occ,
                mma_max_split(D), sms);
    return pl;
}

/* ---- launches ---- */

/* The wide tile kernel's shared-memory limit, raised or refused (FERRY_ERR_UNSUPPORTED) before a launch. */
#define RC_WIDE()                                                                                            \
    do {                                                                                                     \
        const int rc_ = attn_prepare_wide();                                                                 \
        if (rc_) return rc_;                                                                                 \
    } while (0)

/* The split fields of p for plan pl (partials of a batch of p.m rows at the start of ws, after the counters).
 */
static void set_plan(att_params &p, const struct att_plan &pl, void *ws)
{
    p.qt = pl.qt;
    p.gb = pl.gb;
    p.n_hsub = pl.n_hsub;
    p.n_split = pl.n_split;
    p.chunk = pl.chunk;
    p.hb = pl.hb;
    p.cnt = pl.n_split > 1 ? (unsigned *)ws : nullptr;
    p.ws_o = pl.n_split > 1 ? (float *)((char *)ws + ATT_CNT_BYTES) : nullptr;
    p.ws_ml = pl.n_split > 1 ? (float2 *)(p.ws_o + (size_t)pl.n_split * p.m * p.n_heads * p.D) : nullptr;
}

/* Rows [row0, row0 + rows) as decode tokens: the decode kernel, or the tile kernel one token per tile. */
static int launch_decode(att_params p, const struct kern_cuda_kv_layer *kv, int row0, int rows, int skip,
                         int max_len, void *ws, size_t ws_bytes, cudaStream_t stream)
{
    const int D = p.D, stages = tile_stages(D);
    struct att_plan pl = make_dec_plan(rows, p.m, p.n_heads, kv, max_len, ws_bytes);
    if (!pl.rm)
        pl = make_plan(rows, p.m, p.n_heads, p.n_kv, D, max_len, true, ws_bytes, blocks_per_sm(D, stages),
                       tile_max_split(D, stages));
    set_plan(p, pl, ws);
    p.row0 = row0;
    p.skip = skip;
    if (pl.rm) {
        const dim3 grid((unsigned)rows, (unsigned)(p.n_kv / pl.hb), (unsigned)pl.n_split);
        FCUDA_CHECK(pdl_launch(dec_kernel(pl.rm, p.q8), grid, dim3(DEC_THREADS),
                               dec_smem_bytes(D, pl.hb, pl.rm), stream, p));
        FCUDA_LAUNCH_CHECK("attn_decode_kernel");
        return FERRY_OK;
    }
    if (D > ATT_DMAX) RC_WIDE();
    const dim3 grid((unsigned)pl.n_tiles, (unsigned)(p.n_kv * pl.n_hsub), (unsigned)pl.n_split);
    FCUDA_CHECK(pdl_launch(tile_kernel(D), grid, dim3(ATT_THREADS), attn_smem_bytes(D, stages), stream, p));
    FCUDA_LAUNCH_CHECK("attn_kernel");
    return FERRY_OK;
}

/* Rows [row0, p.m) as prefill chunks: the tensor-core kernel (head_dim 64, 128), else the tile kernel (which
 * takes skip = ATT_SKIP_NONE only). */
static int launch_prefill(att_params p, int row0, int skip, int max_len, void *ws, size_t ws_bytes,
                          cudaStream_t stream)
{
    const int D = p.D, rows = p.m - row0, stages = tile_stages(D);
    if (mma_takes(D)) {
        const int rc = mma_prepare();
        if (rc) return rc;
        const struct att_plan pl = mma_plan(rows, p.m, p.n_heads, p.n_kv, D, max_len, ws_bytes,
                                            mma_blocks_per_sm(D), fcuda_sm_count());
        set_plan(p, pl, ws);
        p.row0 = row0;
        p.skip = skip;
        const dim3 grid((unsigned)pl.n_tiles, (unsigned)(p.n_kv * pl.n_hsub), (unsigned)pl.n_split);
        FCUDA_CHECK(pdl_launch(mma_kernel(D), grid, dim3(FA_THREADS), mma_smem_bytes(D), stream, p));
        FCUDA_LAUNCH_CHECK("attn_mma_kernel");
        return FERRY_OK;
    }
    const struct att_plan pl = make_plan(rows, p.m, p.n_heads, p.n_kv, D, max_len, false, ws_bytes,
                                         blocks_per_sm(D, stages), tile_max_split(D, stages));
    set_plan(p, pl, ws);
    p.row0 = row0;
    p.skip = ATT_SKIP_NONE;
    if (D > ATT_DMAX) RC_WIDE();
    const dim3 grid((unsigned)pl.n_tiles, (unsigned)(p.n_kv * pl.n_hsub), (unsigned)pl.n_split);
    FCUDA_CHECK(pdl_launch(tile_kernel(D), grid, dim3(ATT_THREADS), attn_smem_bytes(D, stages), stream, p));
    FCUDA_LAUNCH_CHECK("attn_kernel");
    return FERRY_OK;
}

/* Checks the arguments and fills the fields every launch shares; FERRY_OK or an error status. */
static int attn_begin(att_params &p, float *out, const float *q, const struct kern_cuda_kv_layer *kv,
                      const int32_t *seq, const int32_t *pos, int m, int n_heads, float scale, int *max_len,
                      void *ws, size_t *ws_bytes)
{
    int rc = check_kv(kv);
    if (rc) return rc;
    if (!out || !q || !seq || !pos || m < 0 || n_heads <= 0 || n_heads % kv->n_kv_heads)
        return FERRY_ERR_INVALID;
    if (!FCUDA_ALIGNED(out, 16) || !FCUDA_ALIGNED(q, 16) || !FCUDA_ALIGNED(seq, 4) || !FCUDA_ALIGNED(pos, 4))
        return FERRY_ERR_INVALID;
    if (*max_len <= 0 || *max_len > kv->max_blocks * kv->block_size)
        *max_len = kv->max_blocks * kv->block_size;
    if (!ws || !FCUDA_ALIGNED(ws, 16)) *ws_bytes = 0;
    rc = attn_prepare();
    if (rc) return rc;
    memset(&p, 0, sizeof p);
    p.out = out;
    p.q = q;
    p.k = (const __half *)kv->k;
    p.v = (const __half *)kv->v;
    p.kx = (const __half *)kv->k_ext;
    p.vx = (const __half *)kv->v_ext;
    p.q8 = kv->q8 != 0;
    p.kq = (const int8_t *)kv->k;
    p.vq = (const int8_t *)kv->v;
    p.ksc = (const __half *)kv->k_scale;
    p.vsc = (const __half *)kv->v_scale;
    p.kqx = (const int8_t *)kv->k_ext;
    p.vqx = (const int8_t *)kv->v_ext;
    p.kscx = (const __half *)kv->k_ext_scale;
    p.vscx = (const __half *)kv->v_ext_scale;
    p.bt = kv->block_table;
    p.seq = seq;
    p.pos = pos;
    p.n_blocks = kv->n_blocks;
    p.n_main = kv->n_blocks - kv->n_ext;
    p.block_size = kv->block_size;
    p.max_blocks = kv->max_blocks;
    p.n_kv = kv->n_kv_heads;
    p.D = kv->head_dim;
    p.n_heads = n_heads;
    p.G = n_heads / kv->n_kv_heads;
    p.m = m;
    p.bs_magic = ((1ull << 32) + (unsigned long long)kv->block_size - 1) / (unsigned long long)kv->block_size;
    p.scale = scale;
    p.window = kv->window > 0 ? kv->window : 1 << 30;
    p.sinks = kv->sinks;
    return FERRY_OK;
}

extern "C" int kern_cuda_attention(float *out, const float *q, const struct kern_cuda_kv_layer *kv,
                                   const int32_t *seq, const int32_t *pos, int m, int n_heads, float scale,
                                   int max_len, enum kern_cuda_attn_mode mode, void *ws, size_t ws_bytes,
                                   cudaStream_t stream)
{
    if (mode != KERN_ATTN_AUTO && mode != KERN_ATTN_PREFILL && mode != KERN_ATTN_DECODE)
        return FERRY_ERR_INVALID;
    att_params p;
    int rc = attn_begin(p, out, q, kv, seq, pos, m, n_heads, scale, &max_len, ws, &ws_bytes);
    if (rc || m == 0) return rc;
    if (mode == KERN_ATTN_DECODE || (mode == KERN_ATTN_AUTO && m <= 16))
        return launch_decode(p, kv, 0, m, ATT_SKIP_NONE, max_len, ws, ws_bytes, stream);
    if (mode == KERN_ATTN_PREFILL || !mma_takes(p.D))
        return launch_prefill(p, 0, ATT_SKIP_NONE, max_len, ws, ws_bytes, stream);
    /* AUTO, a larger batch: single rows to the decode path, runs to the tensor-core kernel, both deciding
     * from seq on the device. */
    rc = launch_decode(p, kv, 0, m, ATT_SKIP_RUNS, max_len, ws, ws_bytes, stream);
    if (rc) return rc;
    return launch_prefill(p, 0, ATT_SKIP_SINGLES, max_len, ws, ws_bytes, stream);
}

extern "C" int kern_cuda_attention_mixed(float *out, float *lse, const float *q,
                                         const struct kern_cuda_kv_layer *kv, const int32_t *seq,
                                         const int32_t *pos, int m, int n_decode, int n_heads, float scale,
                                         int max_len, void *ws, size_t ws_bytes, cudaStream_t stream)
{
    if (n_decode < 0 || n_decode > m) return FERRY_ERR_INVALID;
    att_params p;
    int rc = attn_begin(p, out, q, kv, seq, pos, m, n_heads, scale, &max_len, ws, &ws_bytes);
    if (rc || m == 0) return rc;
    if (lse && (!FCUDA_ALIGNED(lse, 4) || kv->sinks)) return FERRY_ERR_INVALID;
    p.lse = lse;
    if (n_decode > 0) {
        rc = launch_decode(p, kv, 0, n_decode, ATT_SKIP_NONE, max_len, ws, ws_bytes, stream);
        if (rc) return rc;
    }
    if (n_decode < m) rc = launch_prefill(p, n_decode, ATT_SKIP_NONE, max_len, ws, ws_bytes, stream);
    return rc;
}

/* One thread per element of the n rows: out = the two partial attentions weighted by their exp(lse). */
__global__ void attn_merge_kernel(float *out, const float *lse, const float *o2, const float *lse2, int n,
                                  int D)
{
    const size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= (size_t)n * D) return;
    const size_t r = e / D;
    const float a = lse[r], b = lse2[r], M = fmaxf(a, b);
    if (M == -INFINITY) { /* neither part saw a position: as an empty softmax, 0 */
        out[e] = 0.0f;
        return;
    }
    const float wa = expf(a - M), wb = expf(b - M);
    out[e] = (out[e] * wa + o2[e] * wb) / (wa + wb);
}

extern "C" int kern_cuda_attention_merge(float *out, const float *lse, const float *o2, const float *lse2,
                                         int n_rows, int head_dim, cudaStream_t stream)
{
    if (!out || !lse || !o2 || !lse2 || n_rows < 0 || head_dim <= 0) return FERRY_ERR_INVALID;
    if (n_rows == 0) return FERRY_OK;
    const size_t n = (size_t)n_rows * head_dim;
    attn_merge_kernel<<<(unsigned)((n + 255) / 256), 256, 0, stream>>>(out, lse, o2, lse2, n_rows, head_dim);
    FCUDA_LAUNCH_CHECK("attn_merge_kernel");
    return FERRY_OK;
}

/* ---------------------------------------------------------------------------------------------------------
 * Host audit of the tensor-core kernel (kern_cuda_attention_mma_audit). One launch of attn_mma_kernel<D> is
 * run on the CPU, block by block, barrier interval by barrier interval and thread by thread, with the
 * kernel's own plan (mma_plan, set_plan) and index functions (fa_*). Checked: every global access in bounds
 * and aligned for its width; every shared access inside the piece of the layout it means (the pieces disjoint
 * and inside the bytes launched), aligned, and free of races: two threads touching a word in one barrier
 * interval, one of them writing; a cp.async writes from its issue until the wait_group before the barrier
 * that publishes it, and nothing may read or overwrite its words meanwhile, its own thread included. Every
 * K/V row a warp reads holds the position and head the math assumes (zeros past the range), recomputed from
 * the block table with a plain formula; every (row, position <= pos) is seen unmasked exactly once over the
 * splits and nothing else is; every output element routed to the kernel is written exactly once (by its
 * block, or by the merge, which must read only partials written in this launch); every arrival counter ends
 * at 0. Numbers are the GPU tests' job; this catches what makes a GPU run fault or read stale data before it
 * can say where.
 * ---------------------------------------------------------------------------------------------------------
 */
namespace
{

enum fa_acc { FA_READ, FA_WRITE, FA_ASYNC };

/* Pieces of a block's shared memory: the dynamic layout, the merge weights over it, then the kernel's static
 * arrays (placed after the dynamic bytes here). */
enum fa_region {
    FR_K0,
    FR_K1,
    FR_V0,
    FR_V1,
    FR_OFF,
    FR_WTS,
    FR_SEQ,
    FR_POS,
    FR_SKIP,
    FR_ROWS,
    FR_NROWS,
    FR_LAST,
    FR_N
};
const char *const fa_region_name[FR_N] = {"K stage 0", "K stage 1",     "V stage 0", "V stage 1",
                                          "s_off",     "merge weights", "s_seq",     "s_pos",
                                          "s_skip",    "rows_s",        "nrows_s",   "s_last"};

/* Shadow of one 4-byte word of a block's shared memory (fields valid when gen is the block's). The last
 * write: thread w_tid (-1: none), landing in barrier intervals w_lo..w_hi (INT_MAX: a cp.async not yet waited
 * for). The reads of interval r_ep: by thread r_tid, or -2 for several threads. */
struct fa_word {
    int gen; /* the block that last touched the word */
    int w_tid, w_lo, w_hi;
    int r_tid, r_ep;
    long long tag; /* K/V tile words: 0 never written, 1 zeros, 2 + 2 * (pool element) + (1 for V) */
};

struct fa_auditor {
    att_params p;
    const int32_t *seq, *pos; /* host copies of the batch */
    int D, n_seqs, nx, ny, nz;
    size_t q_elems, kv_elems, bt_elems;
    size_t ws_bytes, ws_o_at, ws_ml_at; /* the workspace and where the partials start in it, bytes */
    int reg_lo[FR_N], reg_hi[FR_N];
    std::vector<fa_word> sh;
    int gen, ep; /* the block being run (counted over the launch) and its barrier interval */
    std::vector<int> pending[FA_THREADS];
    long long soff[2 * FA_BN]; /* the block's s_off */
    int s_seq[FA_BM], s_pos[FA_BM], s_skip[FA_BM], rows_s[FA_BM], nrows_s;
    std::vector<uint8_t> out_w, ws_o_w, ws_ml_w, seen; /* writes per element; views per (row, position) */
    std::vector<int> ws_o_rows;                        /* (n_split, m * n_heads) partial o elements written */
    std::vector<size_t> seen_at;                       /* (m * n_heads) start of each row in seen */
    std::vector<unsigned> cnt;                         /* arrival counters */
    int bx, by, bz, t0c;                               /* where the emulation is, for messages */
    long long n_checked;
    char *err;
    bool bad;

    bool fail(const char *fmt, ...) __attribute__((format(printf, 2, 3)))
    {
        if (bad) return false;
        bad = true;
        int n = snprintf(err, 256, "block (%d,%d,%d) tile %d: ", bx, by, bz, t0c);
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err + n, 256 - (size_t)n, fmt, ap);
        va_end(ap);
        return false;
    }

    /* A global access of n elements at element idx of a buffer of n_elems, 16-byte aligned at its base. */
    bool gl(const char *what, long long idx, int n, long long n_elems)
    {
        n_checked++;
        if (idx < 0 || idx + n > n_elems)
            return fail("%s: elements %lld..%lld outside 0..%lld", what, idx, idx + n - 1, n_elems - 1);
        if (idx % n) return fail("%s: %d-element access at element %lld is misaligned", what, n, idx);
        return true;
    }

    /* A shared access by thread tid of `bytes` at byte `at` meant to fall in piece reg. Writes from the pool
     * (src >= 0, its element) or of zeros (src = -1) set the words' tags. */
    bool sm(int tid, int reg, long long at, int bytes, fa_acc kind, long long src = -2, int is_v = 0)
    {
        n_checked++;
        if (at % (bytes < 16 ? bytes : 16))
            return fail("thread %d: %d-byte access to %s at byte %lld is misaligned", tid, bytes,
                        fa_region_name[reg], at);
        if (at < reg_lo[reg] || at + bytes > reg_hi[reg])
            return fail("thread %d: bytes %lld..%lld are outside %s (%d..%d)", tid, at, at + bytes - 1,
                        fa_region_name[reg], reg_lo[reg], reg_hi[reg] - 1);
        for (long long w = at / 4; w < (at + bytes) / 4; w++) {
            fa_word &x = sh[(size_t)w];
            if (x.gen != gen) x = fa_word{gen, -1, 0, 0, -1, -1, 0};
            if (x.w_tid >= 0 && x.w_hi == INT_MAX)
                return fail("thread %d %s %s byte %lld while thread %d's cp.async to it is pending", tid,
                            kind == FA_READ ? "reads" : "writes", fa_region_name[reg], 4 * w, x.w_tid);
            if (x.w_tid >= 0 && x.w_tid != tid && x.w_hi >= ep)
                return fail("race: thread %d %s %s byte %lld in the barrier interval of thread %d's write",
                            tid, kind == FA_READ ? "reads" : "writes", fa_region_name[reg], 4 * w, x.w_tid);
            if (kind == FA_READ) {
                if (x.r_ep != ep)
                    x.r_ep = ep, x.r_tid = tid;
                else if (x.r_tid != tid)
                    x.r_tid = -2;
                continue;
            }
            if (x.r_ep == ep && x.r_tid != tid)
                return fail(
                    "race: thread %d writes %s byte %lld read by thread %d in the same barrier interval", tid,
                    fa_region_name[reg], 4 * w, x.r_tid);
            x.w_tid = tid;
            x.w_lo = ep;
            x.w_hi = kind == FA_ASYNC ? INT_MAX : ep;
            if (kind == FA_ASYNC) pending[tid].push_back((int)w);
            if (src != -2) x.tag = src < 0 ? 1 : 2 + 2 * (src + 2 * (w - at / 4)) + is_v;
        }
        return true;
    }

    /* cp.async.wait_group 0 in thread tid: its copies land in this interval at the latest. */
    void wait_all(int tid)
    {
        for (int w : pending[tid]) sh[(size_t)w].w_hi = ep;
        pending[tid].clear();
    }
    void barrier() { ep++; }

    /* The pool element of position pp's row (KV head kvh) of sequence sq; -1 where a tile holds zeros (at or
     * past hi, or no block). Written apart from fa_row_off on purpose. */
    long long ref_off(int sq, int kvh, int pp, int hi) const
    {
        if (pp < 0 || pp >= hi || pp / p.block_size >= p.max_blocks) return -1;
        const int blk = p.bt[(size_t)sq * p.max_blocks + pp / p.block_size];
        if (blk < 0 || blk >= p.n_blocks) return -1;
        return ((long long)(blk * (long long)p.block_size + pp % p.block_size) * p.n_kv + kvh) * D;
    }

    /* The 16 bytes at half e = row * DS + col of tile piece reg that the warps' ldmatrix read in tile t0 must
     * hold dims col.. of the pool row ref (ref_off of position t0 + row), or zeros (ref < 0). */
    bool check_row(int reg, int DS, int e, long long ref, int t0, int warp)
    {
        const int row = e / DS, col = e % DS, is_v = reg == FR_V0 || reg == FR_V1;
        const size_t w0 = (size_t)(reg_lo[reg] + 2 * e) / 4;
        for (int w = 0; w < 4; w++) {
            const long long want = ref < 0 ? 1 : 2 + 2 * (ref + col + 2 * w) + is_v, got = sh[w0 + w].tag;
            if (got != want)
                return fail(
                    "warp %d reads %s row %d (position %d) dims %d..: holds %s %lld, the math wants %s %lld",
                    warp, fa_region_name[reg], row, t0 + row, col + 2 * w,
                    got == 0    ? "nothing"
                    : got == 1  ? "zeros"
                    : (got & 1) ? "V element"
                                : "K element",
                    got >= 2 ? (got - 2) / 2 : -1, want == 1 ? "zeros" : "element",
                    want >= 2 ? (want - 2) / 2 : -1);
        }
        return true;
    }

    template <int D_> bool check_frags();
    template <int D_> bool run_block();
    template <int D_> bool run();
};

/* The rows a warp's ldmatrix calls read (fa_k_frag, fa_v_frag over every lane and fragment): each 16-byte
 * piece of a tile's D columns exactly once, 16-byte aligned, never the padding. So a tile's math reads all of
 * the tile, which run_block checks as one read by several threads when a warp does it. */
template <int D_> bool fa_auditor::check_frags()
{
    using F = fa_dims<D_>;
    for (int v = 0; v < 2; v++) {
        std::vector<int> hits(FA_BN * D_ / 8, 0);
        for (int lane = 0; lane < 32; lane++)
            for (int a = 0; a < (v ? FA_BN / 16 : F::KC); a++)
                for (int b = 0; b < (v ? D_ / 16 : FA_BN / 16); b++) {
                    const int e = v ? fa_v_frag(F::DS, lane, a, b) : fa_k_frag(F::DS, lane, b, a);
                    if (e % 8 || e / F::DS >= FA_BN || e % F::DS + 8 > D_)
                        return fail("%s fragment (%d, %d) of lane %d: half %d of the tile", v ? "V" : "K", a,
                                    b, lane, e);
                    hits[(size_t)(e / F::DS * (D_ / 8) + e % F::DS / 8)]++;
                }
        for (size_t i = 0; i < hits.size(); i++)
            if (hits[i] != 1)
                return fail("%s fragments read tile row %zu dims %zu.. %d times", v ? "V" : "K", i / (D_ / 8),
                            i % (D_ / 8) * 8, hits[i]);
    }
    return true;
}

template <int D_> bool fa_auditor::run_block()
{
    using F = fa_dims<D_>;
    constexpr int DS = F::DS, KC = F::KC, NB = F::NB, OB = F::OB, CPR = F::CPR, RPP = F::RPP;
    gen++;
    ep = 0;
    t0c = -1;
    const int i0 = fa_window(p, bx, nx);
    const int ntok = min(p.qt, p.m - i0);
    if (ntok <= 0 || i0 < p.row0) return fail("window at row %d of %d has no tokens", i0, p.m);
    const int kvh = by / p.n_hsub, hsub = by % p.n_hsub, split = bz, gb = p.gb;
    const size_t total = (size_t)p.m * p.n_heads;

    for (int tid = 0; tid < ntok; tid++) {
        const int i = i0 + tid;
        if (!gl("seq/pos", i, 1, p.m)) return false;
        if (p.skip == ATT_SKIP_SINGLES &&
            !(gl("seq[i-1]", i > 0 ? i - 1 : 0, 1, p.m) && gl("seq[i+1]", i < p.m - 1 ? i + 1 : i, 1, p.m)))
            return false;
        s_seq[tid] = seq[i];
        s_pos[tid] = pos[i];
        s_skip[tid] = p.skip == ATT_SKIP_SINGLES && (i == 0 || seq[i - 1] != seq[i]) &&
                      (i == p.m - 1 || seq[i + 1] != seq[i]);
        if (!sm(tid, FR_SEQ, reg_lo[FR_SEQ] + 4 * tid, 4, FA_WRITE) ||
            !sm(tid, FR_POS, reg_lo[FR_POS] + 4 * tid, 4, FA_WRITE) ||
            !sm(tid, FR_SKIP, reg_lo[FR_SKIP] + 4 * tid, 4, FA_WRITE))
            return false;
    }
    barrier();
    {
        int n = 0;
        for (int r = 0; r < FA_BM; r++) {
            const long long row = fa_qrow(p, i0, ntok, kvh, hsub, r);
            if (row < 0) continue;
            if (!sm(0, FR_SKIP, reg_lo[FR_SKIP] + 4 * (r / gb), 4, FA_READ)) return false;
            if (s_skip[r / gb]) continue;
            if (!sm(0, FR_ROWS, reg_lo[FR_ROWS] + 4 * n, 4, FA_WRITE)) return false;
            rows_s[n++] = (int)row;
        }
        nrows_s = n;
        if (!sm(0, FR_NROWS, reg_lo[FR_NROWS], 4, FA_WRITE)) return false;
    }

    /* Per thread: its two rows, their tokens in the window; the q fragments it loads. */
    long long rowa[FA_THREADS], rowb[FA_THREADS];
    int tla[FA_THREADS], tlb[FA_THREADS], lima[FA_THREADS], limb[FA_THREADS];
    bool ina[FA_THREADS], inb[FA_THREADS];
    for (int tid = 0; tid < FA_THREADS; tid++) {
        const int lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
        const int ra = warp * 16 + g, rb = ra + 8;
        tla[tid] = ra / gb, tlb[tid] = rb / gb;
        rowa[tid] = fa_qrow(p, i0, ntok, kvh, hsub, ra), rowb[tid] = fa_qrow(p, i0, ntok, kvh, hsub, rb);
        for (int kc = 0; kc < KC; kc++)
            for (int h = 0; h < 2; h++) {
                if (rowa[tid] >= 0 &&
                    !gl("q", rowa[tid] * D_ + 2 * t + 16 * kc + 8 * h, 2, (long long)q_elems))
                    return false;
                if (rowb[tid] >= 0 &&
                    !gl("q", rowb[tid] * D_ + 2 * t + 16 * kc + 8 * h, 2, (long long)q_elems))
                    return false;
            }
    }

    for (int rs = 0; rs < ntok;) {
        for (int tid = 0; tid < FA_THREADS; tid++)
            if (!sm(tid, FR_SEQ, reg_lo[FR_SEQ] + 4 * rs, 4, FA_READ) ||
                !sm(tid, FR_POS, reg_lo[FR_POS] + 4 * rs, 4, FA_READ))
                return false;
        const int sq = s_seq[rs];
        int re = rs + 1, maxpos = s_pos[rs];
        while (re < ntok && s_seq[re] == sq) {
            for (int tid = 0; tid < FA_THREADS; tid++)
                if (!sm(tid, FR_SEQ, reg_lo[FR_SEQ] + 4 * re, 4, FA_READ) ||
                    !sm(tid, FR_POS, reg_lo[FR_POS] + 4 * re, 4, FA_READ))
                    return false;
            maxpos = max(maxpos, s_pos[re++]);
        }
        if (re < ntok)
            for (int tid = 0; tid < FA_THREADS; tid++)
                if (!sm(tid, FR_SEQ, reg_lo[FR_SEQ] + 4 * re, 4, FA_READ)) return false;
        if (re - rs == 1) {
            for (int tid = 0; tid < FA_THREADS; tid++)
                if (!sm(tid, FR_SKIP, reg_lo[FR_SKIP] + 4 * rs, 4, FA_READ)) return false;
            if (s_skip[rs]) {
                rs = re;
                continue;
            }
        }
        if (sq < 0 || sq >= n_seqs)
            return fail("token %d: sequence %d is not a row of the block table", i0 + rs, sq);
        const int lo = split * p.chunk;
        const int hi = split == p.n_split - 1 ? maxpos + 1 : min(lo + p.chunk, maxpos + 1);
        int wlim[4] = {-1, -1, -1, -1}, tlim[FA_THREADS], posr[FA_THREADS][2];
        for (int tid = 0; tid < FA_THREADS; tid++) {
            ina[tid] = rowa[tid] >= 0 && tla[tid] >= rs && tla[tid] < re;
            inb[tid] = rowb[tid] >= 0 && tlb[tid] >= rs && tlb[tid] < re;
            if (ina[tid] && !sm(tid, FR_POS, reg_lo[FR_POS] + 4 * tla[tid], 4, FA_READ)) return false;
            if (inb[tid] && !sm(tid, FR_POS, reg_lo[FR_POS] + 4 * tlb[tid], 4, FA_READ)) return false;
            lima[tid] = ina[tid] ? min(s_pos[tla[tid]], hi - 1) : -1;
            limb[tid] = inb[tid] ? min(s_pos[tlb[tid]], hi - 1) : -1;
            posr[tid][0] = ina[tid] ? pos[rowa[tid] / p.n_heads] : -1;
            posr[tid][1] = inb[tid] ? pos[rowb[tid] / p.n_heads] : -1;
            wlim[tid >> 5] = max(wlim[tid >> 5], max(lima[tid], limb[tid]));
            tlim[tid] = min(lima[tid], limb[tid]);
        }
        /* The offsets of a tile row, as the kernel computes them (its block-table read checked first). */
        auto row_off = [&](int pp) -> long long {
            if (pp < hi && pp / p.block_size < p.max_blocks &&
                !gl("block table", (long long)sq * p.max_blocks + pp / p.block_size, 1, (long long)bt_elems))
                return -2;
            return fa_row_off(p, sq, kvh, D_, pp, hi);
        };
        auto issue = [&](int st, int so) -> bool {
            for (int tid = 0; tid < FA_THREADS; tid++) {
                const int c = tid % CPR, r0 = tid / CPR;
                for (int r = r0; r < FA_BN; r += RPP) {
                    /* Row r's offset, read by the CPR threads of the row: checked once, as several threads.
                     */
                    if (c == 0 && !sm(-2, FR_OFF, reg_lo[FR_OFF] + 8 * (so + r), 8, FA_READ)) return false;
                    const long long off = soff[so + r];
                    const int at = r * DS + c * 8;
                    const int kr = st ? FR_K1 : FR_K0, vr = st ? FR_V1 : FR_V0;
                    if (off >= 0) {
                        if (!gl("K/V pool", off + c * 8, 8, (long long)kv_elems)) return false;
                        if (!sm(tid, kr, fa_k_at(D_, st) + 2LL * at, 16, FA_ASYNC, off + c * 8, 0) ||
                            !sm(tid, vr, fa_v_at(D_, st) + 2LL * at, 16, FA_ASYNC, off + c * 8, 1))
                            return false;
                    } else if (!sm(tid, kr, fa_k_at(D_, st) + 2LL * at, 16, FA_WRITE, -1, 0) ||
                               !sm(tid, vr, fa_v_at(D_, st) + 2LL * at, 16, FA_WRITE, -1, 1))
                        return false;
                }
            }
            return true;
        };

        if (lo < hi) {
            for (int tid = 0; tid < FA_BN; tid++) {
                const long long a = row_off(lo + tid), b = row_off(lo + FA_BN + tid);
                if (a == -2 || b == -2) return false;
                if (!sm(tid, FR_OFF, reg_lo[FR_OFF] + 8 * tid, 8, FA_WRITE) ||
                    !sm(tid, FR_OFF, reg_lo[FR_OFF] + 8 * (FA_BN + tid), 8, FA_WRITE))
                    return false;
                soff[tid] = a, soff[FA_BN + tid] = b;
            }
            barrier();
            if (!issue(0, 0)) return false;
        }
        for (int t0 = lo, it = 0; t0 < hi; t0 += FA_BN, it++) {
            const int cur = it & 1;
            t0c = t0;
            for (int tid = 0; tid < FA_THREADS; tid++) wait_all(tid);
            barrier();
            if (t0 + FA_BN < hi && !issue(cur ^ 1, (cur ^ 1) * FA_BN)) return false;
            long long off_next[FA_BN];
            for (int tid = 0; tid < FA_BN; tid++) {
                off_next[tid] = t0 + 2 * FA_BN < hi ? row_off(t0 + 2 * FA_BN + tid) : -1;
                if (off_next[tid] == -2) return false;
            }
            int active = -1; /* a warp that does this tile's math */
            for (int warp = 0; warp < FA_THREADS / 32; warp++)
                if (t0 <= wlim[warp]) active = warp;
            if (active >= 0) { /* the whole K and V tile, by several threads (check_frags) */
                const int kr = cur ? FR_K1 : FR_K0, vr = cur ? FR_V1 : FR_V0;
                for (int r = 0; r < FA_BN; r++) {
                    const long long ref = ref_off(sq, kvh, t0 + r, hi);
                    if (!sm(-2, kr, fa_k_at(D_, cur) + 2LL * r * DS, 2 * D_, FA_READ) ||
                        !sm(-2, vr, fa_v_at(D_, cur) + 2LL * r * DS, 2 * D_, FA_READ))
                        return false;
                    for (int e = r * DS; e < r * DS + D_; e += 8)
                        if (!check_row(kr, DS, e, ref, t0, active) || !check_row(vr, DS, e, ref, t0, active))
                            return false;
                }
            }
            /* The positions each thread's rows keep after the mask (its columns 8j + 2t + {0, 1}). */
            for (int warp = 0; warp < FA_THREADS / 32; warp++) {
                if (t0 > wlim[warp]) continue;
                for (int lane = 0; lane < 32; lane++) {
                    const int tid = warp * 32 + lane, t = lane & 3;
                    const bool mask = t0 + FA_BN - 1 > tlim[tid];
                    for (int h = 0; h < 2; h++) {
                        const long long row = h ? rowb[tid] : rowa[tid];
                        const int lim = h ? limb[tid] : lima[tid];
                        const bool in = h ? inb[tid] : ina[tid];
                        const int rpos = posr[tid][h];
                        const int s_lo = split * p.chunk,
                                  s_hi = split < p.n_split - 1 ? s_lo + p.chunk : INT_MAX;
                        for (int j = 0; j < NB; j++)
                            for (int cc = 0; cc < 2; cc++) {
                                const int c = t0 + 8 * j + 2 * t + cc;
                                if (mask && c > lim) continue;
                                if (!in)
                                    return fail("thread %d keeps position %d for a row not in the run", tid,
                                                c);
                                if (c > rpos || c < s_lo || c >= s_hi)
                                    return fail("row %lld (at %d) keeps position %d in split %d (%d..)", row,
                                                rpos, c, split, s_lo);
                                seen[seen_at[(size_t)row] + (size_t)c]++;
                            }
                    }
                }
            }
            for (int tid = 0; tid < FA_BN; tid++) {
                if (!sm(tid, FR_OFF, reg_lo[FR_OFF] + 8 * (cur * FA_BN + tid), 8, FA_WRITE)) return false;
                soff[cur * FA_BN + tid] = off_next[tid];
            }
        }
        t0c = -1;

        /* The run's rows. */
        for (int tid = 0; tid < FA_THREADS; tid++) {
            const int t = tid & 3;
            for (int h = 0; h < 2; h++) {
                const bool in = h ? inb[tid] : ina[tid];
                const long long row = h ? rowb[tid] : rowa[tid];
                if (!in) continue;
                for (int j = 0; j < OB; j++) {
                    if (p.n_split == 1) {
                        const long long e = row * D_ + 8 * j + 2 * t;
                        if (!gl("out", e, 2, (long long)total * D_)) return false;
                        out_w[(size_t)e]++, out_w[(size_t)e + 1]++;
                    } else {
                        const long long e = ((long long)split * total + row) * D_ + 8 * j + 2 * t;
                        if (!gl("ws partial o", e, 2, (long long)(p.n_split * total * D_))) return false;
                        if (ws_o_w[(size_t)e]++ || ws_o_w[(size_t)e + 1]++)
                            return fail("partial o of split %d row %lld written twice", split, row);
                        ws_o_rows[(size_t)split * total + (size_t)row] += 2;
                    }
                }
                if (p.n_split > 1 && t == 0) {
                    const long long e = (long long)split * total + row;
                    if (!gl("ws partial (m, l)", e, 1, (long long)(p.n_split * total))) return false;
                    if (ws_ml_w[(size_t)e]++)
                        return fail("partial (m, l) of split %d row %lld written twice", split, row);
                }
            }
            wait_all(tid);
        }
        barrier();
        rs = re;
    }
    for (int tid = 0; tid < FA_THREADS; tid++)
        if (!pending[tid].empty()) return fail("thread %d exits with a cp.async pending", tid);

    if (p.n_split > 1) {
        barrier(); /* att_last_arrival */
        const long long ci = (long long)bx * ny + by;
        if (!gl("arrival counter", ci, 1, ATT_CNT_BYTES / 4)) return false;
        const bool last = cnt[(size_t)ci]++ == (unsigned)p.n_split - 1;
        if (last) cnt[(size_t)ci] = 0;
        if (!sm(0, FR_LAST, reg_lo[FR_LAST], 4, FA_WRITE)) return false;
        barrier();
        for (int tid = 0; tid < FA_THREADS; tid++)
            if (!sm(tid, FR_LAST, reg_lo[FR_LAST], 4, FA_READ)) return false;
        if (!last) return true;
        /* att_merge_rows<true>(p, rows_s, nrows_s, smem): weights by warps, then the outputs. */
        const int ns = p.n_split, nrows = nrows_s;
        for (int tid = 0; tid < FA_THREADS; tid++)
            if (!sm(tid, FR_NROWS, reg_lo[FR_NROWS], 4, FA_READ)) return false;
        for (int warp = 0; warp < FA_THREADS / 32; warp++)
            for (int ri = warp; ri < nrows; ri += FA_THREADS / 32)
                for (int lane = 0; lane < 32; lane++) {
                    const int tid = warp * 32 + lane;
                    if (!sm(tid, FR_ROWS, reg_lo[FR_ROWS] + 4 * ri, 4, FA_READ)) return false;
                    for (int s = lane; s < ns; s += 32) {
                        const long long e = (long long)s * total + rows_s[ri];
                        if (!gl("merge: ws partial (m, l)", e, 1, (long long)(ns * total))) return false;
                        if (!ws_ml_w[(size_t)e])
                            return fail("merge reads partial (m, l) of split %d row %d, never written", s,
                                        rows_s[ri]);
                        if (!sm(tid, FR_WTS, 4LL * (ri * ns + s), 4, FA_WRITE)) return false;
                    }
                }
        barrier();
        /* Element e = (ri, d) by thread e % FA_THREADS: row ri's weights of every split (read by several
         * threads: checked once per row), the split partials of (row, d) (checked per row and split: every
         * element of it written), out (row, d). */
        for (int ri = 0; ri < nrows; ri++) {
            if (!sm(-2, FR_ROWS, reg_lo[FR_ROWS] + 4 * ri, 4, FA_READ)) return false;
            const long long row = rows_s[ri];
            for (int s = 0; s < ns; s++) {
                const long long oe = ((long long)s * total + row) * D_;
                if (!sm(-2, FR_WTS, 4LL * (ri * ns + s), 4, FA_READ) ||
                    !gl("merge: ws partial o", oe, D_, (long long)(ns * total * D_)))
                    return false;
                if (ws_o_rows[(size_t)s * total + (size_t)row] != D_)
                    return fail("merge reads partial o of split %d row %lld: %d of %d elements written", s,
                                row, ws_o_rows[(size_t)s * total + (size_t)row], D_);
            }
            for (int d = 0; d < D_; d++) {
                if (!gl("merge: out", row * D_ + d, 1, (long long)total * D_)) return false;
                out_w[(size_t)(row * D_ + d)]++;
            }
        }
    }
    return true;
}

template <int D_> bool fa_auditor::run()
{
    if (!check_frags<D_>()) return false;
    for (bx = 0; bx < nx; bx++)
        for (by = 0; by < ny; by++)
            for (bz = 0; bz < nz; bz++)
                if (!run_block<D_>()) return false;
    bx = by = bz = t0c = -1;
    for (size_t i = 0; i < cnt.size(); i++)
        if (cnt[i]) return fail("arrival counter %zu ends at %u, not 0", i, cnt[i]);
    return true;
}

} /* namespace */

extern "C" int kern_cuda_attention_mma_audit(const struct kern_cuda_kv_layer *kv, int n_seqs,
                                             const int32_t *seq, const int32_t *pos, int m, int n_heads,
                                             int max_len, struct kern_cuda_attn_audit *a)
{
    if (!a) return FERRY_ERR_INVALID;
    a->err[0] = 0;
    a->n_split = 0;
    a->n_checked = 0;
    if (!kv || !kv->block_table || kv->n_blocks <= 0 || kv->block_size <= 0 || kv->max_blocks <= 0 ||
        kv->n_kv_heads <= 0 || n_seqs <= 0 || !seq || !pos || m <= 0 || n_heads <= 0 ||
        n_heads % kv->n_kv_heads || a->n_decode < -1 || a->n_decode >= m || a->sms <= 0 || a->occ <= 0)
        return FERRY_ERR_INVALID;
    const int D = kv->head_dim;
    if (D != 64 && D != 128) return FERRY_ERR_UNSUPPORTED;
    for (int i = 0; i < m; i++)
        if (seq[i] < 0 || seq[i] >= n_seqs || pos[i] < 0 || pos[i] >= kv->max_blocks * kv->block_size)
            return FERRY_ERR_INVALID;
    if (max_len <= 0 || max_len > kv->max_blocks * kv->block_size) max_len = kv->max_blocks * kv->block_size;

    fa_auditor A;
    memset(&A.p, 0, sizeof A.p);
    att_params &p = A.p;
    p.bt = kv->block_table;
    p.n_blocks = kv->n_blocks;
    p.n_main = kv->n_blocks; /* (the audit follows offsets in one pool) */
    p.block_size = kv->block_size;
    p.max_blocks = kv->max_blocks;
    p.n_kv = kv->n_kv_heads;
    p.D = D;
    p.n_heads = n_heads;
    p.G = n_heads / kv->n_kv_heads;
    p.m = m;
    const int row0 = a->n_decode < 0 ? 0 : a->n_decode;
    const struct att_plan pl =
        mma_plan(m - row0, m, n_heads, p.n_kv, D, max_len, a->ws_bytes, a->occ, a->sms);
    /* The workspace at a made-up 16-byte-aligned address: only offsets from it are used. */
    char *const ws = (char *)(uintptr_t)(1ull << 40);
    set_plan(p, pl, ws);
    p.row0 = row0;
    p.skip = a->n_decode < 0 ? ATT_SKIP_SINGLES : ATT_SKIP_NONE;
    a->n_split = pl.n_split;

    A.seq = seq, A.pos = pos, A.D = D, A.n_seqs = n_seqs;
    A.nx = pl.n_tiles, A.ny = p.n_kv * pl.n_hsub, A.nz = pl.n_split;
    A.q_elems = (size_t)m * n_heads * D;
    A.kv_elems = (size_t)kv->n_blocks * kv->block_size * kv->n_kv_heads * D;
    A.bt_elems = (size_t)n_seqs * kv->max_blocks;
    A.ws_bytes = a->ws_bytes;
    A.err = a->err;
    A.bad = false;
    A.n_checked = 0;
    A.bx = A.by = A.bz = A.t0c = -1;
    const size_t total = (size_t)m * n_heads;
    if (pl.n_split > 1) {
        A.ws_o_at = (size_t)((char *)p.ws_o - ws), A.ws_ml_at = (size_t)((char *)p.ws_ml - ws);
        if (p.cnt != (unsigned *)ws || A.ws_o_at < ATT_CNT_BYTES || A.ws_o_at % 16 ||
            A.ws_ml_at < A.ws_o_at + (size_t)pl.n_split * total * D * 4 || A.ws_ml_at % 8 ||
            A.ws_ml_at + (size_t)pl.n_split * total * 8 > a->ws_bytes) {
            A.fail("%d splits: partials at bytes %zu (o) and %zu (m, l) of a %zu-byte workspace", pl.n_split,
                   A.ws_o_at, A.ws_ml_at, a->ws_bytes);
            return FERRY_ERR_INTERNAL;
        }
        if ((int64_t)A.nx * A.ny > ATT_MAX_ROWS) {
            A.fail("%d splits over %d x %d blocks: more than the %d arrival counters", pl.n_split, A.nx, A.ny,
                   ATT_MAX_ROWS);
            return FERRY_ERR_INTERNAL;
        }
    }
    if (A.ny > 65535 || A.nz > 65535 || pl.n_split > mma_max_split(D)) {
        A.fail("grid %d x %d x %d (at most %d splits)", A.nx, A.ny, A.nz, mma_max_split(D));
        return FERRY_ERR_INTERNAL;
    }

    /* The layout: pieces disjoint, aligned, inside the bytes launched; static arrays after them. */
    const int dyn = fa_smem_bytes(D);
    const int lo[5] = {fa_k_at(D, 0), fa_k_at(D, 1), fa_v_at(D, 0), fa_v_at(D, 1), fa_off_at(D)};
    const int len[5] = {fa_tile_bytes(D), fa_tile_bytes(D), fa_tile_bytes(D), fa_tile_bytes(D),
                        2 * FA_BN * 8};
    for (int r = 0; r < 5; r++) {
        A.reg_lo[r] = lo[r], A.reg_hi[r] = lo[r] + len[r];
        if (lo[r] % 16 || A.reg_hi[r] > dyn || (size_t)dyn != mma_smem_bytes(D)) {
            A.fail("%s at bytes %d..%d of %d launched (%zu)", fa_region_name[r], lo[r], A.reg_hi[r] - 1, dyn,
                   mma_smem_bytes(D));
            return FERRY_ERR_INTERNAL;
        }
        for (int s = 0; s < r; s++)
            if (lo[r] < A.reg_hi[s] && lo[s] < A.reg_hi[r]) {
                A.fail("%s (bytes %d..%d) overlaps %s (%d..%d)", fa_region_name[r], lo[r], A.reg_hi[r] - 1,
                       fa_region_name[s], lo[s], A.reg_hi[s] - 1);
                return FERRY_ERR_INTERNAL;
            }
    }
    A.reg_lo[FR_WTS] = 0, A.reg_hi[FR_WTS] = dyn;
    const int stat_len[6] = {4 * FA_BM, 4 * FA_BM, 4 * FA_BM, 4 * FA_BM, 4, 4};
    for (int r = FR_SEQ, at = dyn; r < FR_N; at += stat_len[r - FR_SEQ], r++)
        A.reg_lo[r] = at, A.reg_hi[r] = at + stat_len[r - FR_SEQ];
    A.sh.assign((size_t)A.reg_hi[FR_LAST] / 4, fa_word{-1, -1, 0, 0, -1, -1, 0});
    A.gen = 0;

    A.out_w.assign(total * D, 0);
    if (pl.n_split > 1) {
        A.ws_o_w.assign((size_t)pl.n_split * total * D, 0);
        A.ws_ml_w.assign((size_t)pl.n_split * total, 0);
        A.ws_o_rows.assign((size_t)pl.n_split * total, 0);
    }
    A.cnt.assign(ATT_CNT_BYTES / 4, 0);
    A.seen_at.resize(total);
    size_t n_seen = 0;
    for (size_t r = 0; r < total; r++) A.seen_at[r] = n_seen, n_seen += (size_t)pos[r / n_heads] + 1;
    A.seen.assign(n_seen, 0);

    if (!(D == 64 ? A.run<64>() : A.run<128>())) {
        a->n_checked = A.n_checked;
        return FERRY_ERR_INTERNAL;
    }
    /* Routed rows: every element written once, every position up to pos seen once; other rows untouched. */
    for (int i = 0; i < m; i++) {
        const bool single = (i == 0 || seq[i - 1] != seq[i]) && (i == m - 1 || seq[i + 1] != seq[i]);
        const bool routed = a->n_decode < 0 ? !single : i >= a->n_decode;
        for (int h = 0; h < n_heads; h++) {
            const size_t row = (size_t)i * n_heads + h;
            for (int d = 0; d < D; d++)
                if (A.out_w[row * D + d] != (routed ? 1 : 0)) {
                    A.fail("out row %d head %d dim %d written %d times (%s row)", i, h, d,
                           A.out_w[row * D + d], routed ? "a routed" : "an unrouted");
                    return FERRY_ERR_INTERNAL;
                }
            for (int c = 0; c <= pos[i]; c++)
                if (A.seen[A.seen_at[row] + c] != (routed ? 1 : 0)) {
                    A.fail("row %d (seq %d at %d) head %d sees position %d %d times", i, seq[i], pos[i], h, c,
                           A.seen[A.seen_at[row] + c]);
                    return FERRY_ERR_INTERNAL;
                }
        }
    }
    a->n_checked = A.n_checked;
    return FERRY_OK;
}
