/* attention (CUDA) — KV store and the tiled online-softmax attention kernel (prefill tiles and split-K
 * decode), with the log-sum-exp merge of splits; see attention.h for the contract.
 *
 * One block = up to ATT_RMAX query rows (tokens x query heads sharing one KV head) x one KV range (a split).
 * Per 64-position tile: K and V are copied to shared memory with cp.async (16-byte chunks), scores S = q·k
 * for all rows are computed with each thread holding one position and up to 8 rows (k read once from shared
 * memory, q broadcast), the rows' running max/sum are updated by one warp per row, and P·V is accumulated in
 * registers (each thread owns a pair of output dims for up to 16 rows). Rows whose tokens belong to other
 * sequences than the current run, positions past the token's own, and positions outside the split are masked
 * to -inf.
 */
#include <cuda_fp16.h>
#include <math.h>
#include <stdint.h>

#include "kernels/cuda/attention.h"
#include "kernels/cuda/check.h"
#include "kernels/cuda/pdl.h"

#define ATT_T       64 /* positions per K/V tile */
#define ATT_THREADS 128
#define ATT_RMAX    16 /* query rows per block */
#define ATT_DMAX    256
#define ATT_KPAD    8 /* halves of padding per K/V row in shared memory: 16-byte reads stay conflict-free */

struct att_params {
    float *out;          /* (m, n_heads, D) */
    const float *q;      /* (m, n_heads, D) */
    const __half *k, *v; /* cache */
    const int32_t *bt;
    const int32_t *seq, *pos;
    float *ws_o;   /* (n_split, m, n_heads, D) unnormalised partial outputs */
    float2 *ws_ml; /* (n_split, m, n_heads) running max and sum */
    int n_blocks, block_size, max_blocks, n_kv, D, n_heads, G;
    int m, qt, gb, n_hsub, n_split, chunk;
    float scale;
};

__device__ __forceinline__ void cp_async16(void *smem, const void *gmem)
{
    const unsigned s = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(s), "l"(gmem));
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

/* ST = 1: each K/V tile is copied, waited for, then used. ST = 2: two K/V buffers; the copy of tile i+1 is
 * issued before tile i is used, so the block-table lookups and the copy latency overlap the math. */
template <int ST> __global__ void __launch_bounds__(ATT_THREADS) attn_kernel(const att_params p)
{
    extern __shared__ __align__(16) unsigned char smem[];
    const int D = p.D, DS = p.D + ATT_KPAD;
    float *Qs = (float *)smem;                   /* (ATT_RMAX, D) */
    __half *Kb = (__half *)(Qs + ATT_RMAX * D);  /* (ST, ATT_T, DS) */
    __half *Vb = Kb + ST * ATT_T * DS;           /* (ST, ATT_T, DS) */
    float *Ss = (float *)(Vb + ST * ATT_T * DS); /* (ATT_RMAX, ATT_T) */
    float *row_m = Ss + ATT_RMAX * ATT_T, *row_l = row_m + ATT_RMAX, *row_a = row_l + ATT_RMAX;
    int *row_pos = (int *)(row_a + ATT_RMAX);

    const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
    const int i0 = blockIdx.x * p.qt;
    const int ntok = min(p.qt, p.m - i0);
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
    const int NP = D / 2, groups = ATT_THREADS / NP;
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
        float o[ATT_RMAX][2];
#pragma unroll
        for (int j = 0; j < ATT_RMAX; j++) o[j][0] = o[j][1] = 0.0f;

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
                    if (blk >= 0 && blk < p.n_blocks) {
                        const size_t off =
                            (((size_t)blk * p.block_size + (pp - bi * p.block_size)) * p.n_kv + kvh) * D +
                            c8 * 8;
                        cp_async16(kd, p.k + off);
                        cp_async16(vd, p.v + off);
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
                        const bool ok = r >= r_lo && r < r_hi && tt < nt && pp <= row_pos[r];
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
                        o[j][0] *= al;
                        o[j][1] *= al;
                    }
                }
                const int nt4 = min(ATT_T, (nt + 3) & ~3);
                for (int t = 0; t < nt4; t += 4) {
                    const __half *vb = Vs + t * DS + 2 * dp;
                    const float2 v0 = __half22float2(*(const __half2 *)vb);
                    const float2 v1 = __half22float2(*(const __half2 *)(vb + DS));
                    const float2 v2 = __half22float2(*(const __half2 *)(vb + 2 * DS));
                    const float2 v3 = __half22float2(*(const __half2 *)(vb + 3 * DS));
#pragma unroll
                    for (int j = 0; j < ATT_RMAX; j++) {
                        const int r = g + groups * j;
                        if (r >= R) break;
                        const float4 pr = *(const float4 *)(Ss + r * ATT_T + t);
                        o[j][0] += pr.x * v0.x + pr.y * v1.x + pr.z * v2.x + pr.w * v3.x;
                        o[j][1] += pr.x * v0.y + pr.y * v1.y + pr.z * v2.y + pr.w * v3.y;
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
                        const float l = row_l[r], inv = l > 0.0f ? 1.0f / l : 0.0f;
                        *(float2 *)(p.out + row * D + 2 * dp) = make_float2(o[j][0] * inv, o[j][1] * inv);
                    } else {
                        const size_t prow = (size_t)split * p.m * p.n_heads + row;
                        *(float2 *)(p.ws_o + prow * D + 2 * dp) = make_float2(o[j][0], o[j][1]);
                        if (dp == 0) p.ws_ml[prow] = make_float2(row_m[r], row_l[r]);
                    }
                }
            }
        }
        rs = re;
    }
}

/* out = Σ_s o_s e^(m_s - M) / Σ_s l_s e^(m_s - M) over the splits in order. One block per (token, head). */
__global__ void attn_merge_kernel(float *out, const float *ws_o, const float2 *ws_ml, int n_split, int rows,
                                  int D)
{
    const size_t row = blockIdx.x;
    float M = -INFINITY;
    for (int s = 0; s < n_split; s++) M = fmaxf(M, ws_ml[(size_t)s * rows + row].x);
    float L = 0.0f;
    for (int s = 0; s < n_split; s++) {
        const float2 ml = ws_ml[(size_t)s * rows + row];
        if (ml.y > 0.0f) L += ml.y * expf(ml.x - M);
    }
    const float inv = L > 0.0f ? 1.0f / L : 0.0f;
    for (int d = threadIdx.x; d < D; d += blockDim.x) {
        float acc = 0.0f;
        for (int s = 0; s < n_split; s++) {
            const float2 ml = ws_ml[(size_t)s * rows + row];
            if (ml.y > 0.0f) acc += ws_o[((size_t)s * rows + row) * D + d] * expf(ml.x - M);
        }
        out[row * D + d] = acc * inv;
    }
}

/* One thread per element pair of a token: the query and key heads' pairs are rotated (the first rope_dim dims,
 * pairs as in kernels/core/rope.h; angle = pos * inv_freq[i] in f32, cos/sin in double, like the CPU), the rest
 * copied; queries go to q_out (f32), keys and values to the cache (f16). */
__global__ void rope_kv_store_kernel(float *q_out, const float *qkv, __half *kc, __half *vc, const int32_t *seq,
                                     const int32_t *pos, const int32_t *bt, const float *inv_freq, int m,
                                     int n_heads, int n_kv, int D, int rope_dim, int half_style, int n_blocks,
                                     int block_size, int max_blocks)
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
            dst[i0] = x0;
            dst[i1] = x1;
            continue;
        }
        const int pp = pos[tok];
        if (pp < 0 || pp / block_size >= max_blocks) continue;
        const int blk = bt[(size_t)seq[tok] * max_blocks + pp / block_size];
        if (blk < 0 || blk >= n_blocks) continue;
        const int kh = h < n_heads + n_kv ? h - n_heads : h - n_heads - n_kv;
        __half *dst = (h < n_heads + n_kv ? kc : vc) + (((size_t)blk * block_size + pp % block_size) * n_kv + kh) * D;
        dst[i0] = __float2half_rn(x0);
        dst[i1] = __float2half_rn(x1);
    }
}

/* ----------------------------------------------------------------------------------------------------------
 */
/* host side */

struct att_plan {
    int qt, gb, n_hsub, n_tiles, n_split, chunk;
};

static int sm_count(void)
{
    static int cached = 0;
    if (!cached) {
        int dev = 0, n = 0;
        if (cudaGetDevice(&dev) == cudaSuccess &&
            cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev) == cudaSuccess && n > 0)
            cached = n;
        else {
            (void)cudaGetLastError();
            return 132;
        }
    }
    return cached;
}

static size_t split_bytes(int n_split, int m, int n_heads, int D)
{
    return (size_t)n_split * m * n_heads * ((size_t)D + 2) * sizeof(float);
}

/* occ: blocks of attn_kernel resident per SM; the splits fill one wave of occ * SMs blocks. */
static struct att_plan make_plan(int m, int n_heads, int n_kv, int D, int max_len, bool decode,
                                 size_t ws_bytes, int occ)
{
    struct att_plan pl;
    const int G = n_heads / n_kv;
    pl.gb = G < ATT_RMAX ? G : ATT_RMAX;
    pl.n_hsub = (G + pl.gb - 1) / pl.gb;
    pl.qt = decode ? 1 : (ATT_RMAX / pl.gb > 0 ? ATT_RMAX / pl.gb : 1);
    pl.n_tiles = (m + pl.qt - 1) / pl.qt;
    const int64_t base = (int64_t)pl.n_tiles * n_kv * pl.n_hsub;
    const int64_t target = (int64_t)occ * sm_count();
    const int max_split = (max_len + ATT_T - 1) / ATT_T;
    int ns = base >= target ? 1 : (int)(target / base);
    if (ns > max_split) ns = max_split;
    const size_t per = split_bytes(1, m, n_heads, D);
    if (ns > 1 && (size_t)ns * per > ws_bytes) ns = (int)(ws_bytes / per);
    if (ns < 1) ns = 1;
    int chunk = (max_len + ns - 1) / ns;
    chunk = (chunk + ATT_T - 1) / ATT_T * ATT_T;
    if (chunk < ATT_T) chunk = ATT_T;
    pl.chunk = chunk;
    pl.n_split = ns > 1 ? (max_len + chunk - 1) / chunk : 1;
    if (pl.n_split < 1) pl.n_split = 1;
    return pl;
}

static size_t attn_smem_bytes(int D, int stages)
{
    return (size_t)ATT_RMAX * D * 4 + 2 * (size_t)stages * ATT_T * (D + ATT_KPAD) * 2 +
           (size_t)ATT_RMAX * ATT_T * 4 + 4 * ATT_RMAX * 4;
}

static int g_stages =
    1; /* K/V buffers per block: kern_cuda_attention_set_stages (1 measured faster, NOTES.md) */

extern "C" void kern_cuda_attention_set_stages(int stages)
{
    g_stages = stages == 2 ? 2 : 1;
}

/* Raises the dynamic shared-memory limit of both kernel variants once (up to head_dim ATT_DMAX). */
static int attn_prepare(void)
{
    static bool done = false;
    if (!done) {
        FCUDA_CHECK(cudaFuncSetAttribute(attn_kernel<1>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         (int)attn_smem_bytes(ATT_DMAX, 1)));
        FCUDA_CHECK(cudaFuncSetAttribute(attn_kernel<2>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         (int)attn_smem_bytes(ATT_DMAX, 2)));
        done = true;
    }
    return FERRY_OK;
}

/* Resident blocks per SM of the variant at head_dim D (cached; 2 if the query fails). */
static int blocks_per_sm(int D, int stages)
{
    static int cache[2][ATT_DMAX / 8 + 1];
    int *c = &cache[stages - 1][D / 8];
    if (!*c) {
        int nb = 0;
        if (attn_prepare() == FERRY_OK &&
            cudaOccupancyMaxActiveBlocksPerMultiprocessor(&nb, stages == 1 ? attn_kernel<1> : attn_kernel<2>,
                                                          ATT_THREADS,
                                                          attn_smem_bytes(D, stages)) == cudaSuccess &&
            nb > 0)
            *c = nb;
        else {
            (void)cudaGetLastError();
            return 2;
        }
    }
    return *c;
}

extern "C" size_t kern_cuda_attention_ws_size(int m, int n_heads, int head_dim, int max_len)
{
    if (m <= 0 || n_heads <= 0 || head_dim <= 0 || max_len <= 0 || head_dim > ATT_DMAX) return 0;
    /* Decode tiles with one KV head give the most splits, and the variant with more resident blocks; bound by
     * that. */
    const int occ = max(blocks_per_sm(head_dim, 1), blocks_per_sm(head_dim, 2));
    /* Any batch of up to m tokens: the runtime sizes the workspace once for its largest batch, and smaller
     * batches (one decode token) take the most splits. Past occ * SMs tokens there are no splits. */
    const int64_t last = min((int64_t)m, (int64_t)occ * sm_count());
    size_t best = 0;
    for (int mm = 1; mm <= last; mm++) {
        struct att_plan pl = make_plan(mm, n_heads, 1, head_dim, max_len, true, SIZE_MAX, occ);
        const size_t b = pl.n_split > 1 ? split_bytes(pl.n_split, mm, n_heads, head_dim) : 0;
        if (b > best) best = b;
    }
    return best;
}

static int check_kv(const struct kern_cuda_kv_layer *kv)
{
    if (!kv || !kv->k || !kv->v || !kv->block_table) return FERRY_ERR_INVALID;
    if (kv->n_blocks <= 0 || kv->block_size <= 0 || kv->max_blocks <= 0 || kv->n_kv_heads <= 0)
        return FERRY_ERR_INVALID;
    if (kv->head_dim <= 0 || kv->head_dim % 8 || kv->head_dim > ATT_DMAX) return FERRY_ERR_UNSUPPORTED;
    if (!FCUDA_ALIGNED(kv->k, 16) || !FCUDA_ALIGNED(kv->v, 16) || !FCUDA_ALIGNED(kv->block_table, 4))
        return FERRY_ERR_INVALID;
    return FERRY_OK;
}

extern "C" int kern_cuda_rope_kv_store(float *q_out, const float *qkv, const struct kern_cuda_kv_layer *kv,
                                      const int32_t *seq, const int32_t *pos, int m, int n_heads, int rope_dim,
                                      const float *inv_freq, enum rope_style style, cudaStream_t stream)
{
    int rc = check_kv(kv);
    if (rc) return rc;
    if (!q_out || !qkv || !seq || !pos || !inv_freq || m < 0 || n_heads <= 0) return FERRY_ERR_INVALID;
    if (rope_dim <= 0 || rope_dim > kv->head_dim || rope_dim % 2) return FERRY_ERR_INVALID;
    if (style != ROPE_STYLE_INTERLEAVED && style != ROPE_STYLE_HALF) return FERRY_ERR_INVALID;
    if (!FCUDA_ALIGNED(q_out, 4) || !FCUDA_ALIGNED(qkv, 4) || !FCUDA_ALIGNED(seq, 4) || !FCUDA_ALIGNED(pos, 4) ||
        !FCUDA_ALIGNED(inv_freq, 4))
        return FERRY_ERR_INVALID;
    if (m == 0) return FERRY_OK;
    const int64_t total = (int64_t)m * (n_heads + 2 * kv->n_kv_heads) * (kv->head_dim / 2);
    FCUDA_CHECK(pdl_launch(rope_kv_store_kernel, dim3(fcuda_blocks(total, 256)), dim3(256), 0, stream, q_out, qkv,
                           (__half *)kv->k, (__half *)kv->v, seq, pos, kv->block_table, inv_freq, m, n_heads,
                           kv->n_kv_heads, kv->head_dim, rope_dim, (int)(style == ROPE_STYLE_HALF), kv->n_blocks,
                           kv->block_size, kv->max_blocks));
    return FERRY_OK;
}

extern "C" int kern_cuda_attention(float *out, const float *q, const struct kern_cuda_kv_layer *kv,
                                   const int32_t *seq, const int32_t *pos, int m, int n_heads, float scale,
                                   int max_len, enum kern_cuda_attn_mode mode, void *ws, size_t ws_bytes,
                                   cudaStream_t stream)
{
    int rc = check_kv(kv);
    if (rc) return rc;
    if (!out || !q || !seq || !pos || m < 0 || n_heads <= 0 || n_heads % kv->n_kv_heads)
        return FERRY_ERR_INVALID;
    if (!FCUDA_ALIGNED(out, 16) || !FCUDA_ALIGNED(q, 16) || !FCUDA_ALIGNED(seq, 4) || !FCUDA_ALIGNED(pos, 4))
        return FERRY_ERR_INVALID;
    if (mode != KERN_ATTN_AUTO && mode != KERN_ATTN_PREFILL && mode != KERN_ATTN_DECODE)
        return FERRY_ERR_INVALID;
    if (m == 0) return FERRY_OK;
    const int D = kv->head_dim;
    if (max_len <= 0 || max_len > kv->max_blocks * kv->block_size) max_len = kv->max_blocks * kv->block_size;
    const bool decode = mode == KERN_ATTN_DECODE || (mode == KERN_ATTN_AUTO && m <= 16);
    if (!ws || !FCUDA_ALIGNED(ws, 16)) ws_bytes = 0;
    rc = attn_prepare();
    if (rc) return rc;
    const int stages = g_stages;
    const struct att_plan pl =
        make_plan(m, n_heads, kv->n_kv_heads, D, max_len, decode, ws_bytes, blocks_per_sm(D, stages));

    att_params p;
    p.out = out;
    p.q = q;
    p.k = (const __half *)kv->k;
    p.v = (const __half *)kv->v;
    p.bt = kv->block_table;
    p.seq = seq;
    p.pos = pos;
    p.ws_o = (float *)ws;
    p.ws_ml = pl.n_split > 1 ? (float2 *)((float *)ws + (size_t)pl.n_split * m * n_heads * D) : nullptr;
    p.n_blocks = kv->n_blocks;
    p.block_size = kv->block_size;
    p.max_blocks = kv->max_blocks;
    p.n_kv = kv->n_kv_heads;
    p.D = D;
    p.n_heads = n_heads;
    p.G = n_heads / kv->n_kv_heads;
    p.m = m;
    p.qt = pl.qt;
    p.gb = pl.gb;
    p.n_hsub = pl.n_hsub;
    p.n_split = pl.n_split;
    p.chunk = pl.chunk;
    p.scale = scale;

    const size_t smem = attn_smem_bytes(D, stages);
    const dim3 grid((unsigned)pl.n_tiles, (unsigned)(kv->n_kv_heads * pl.n_hsub), (unsigned)pl.n_split);
    if (stages == 1)
        attn_kernel<1><<<grid, ATT_THREADS, smem, stream>>>(p);
    else
        attn_kernel<2><<<grid, ATT_THREADS, smem, stream>>>(p);
    FCUDA_LAUNCH_CHECK("attn_kernel");
    if (pl.n_split > 1) {
        attn_merge_kernel<<<(unsigned)m * n_heads, 128, 0, stream>>>(out, p.ws_o, p.ws_ml, pl.n_split,
                                                                     m * n_heads, D);
        FCUDA_LAUNCH_CHECK("attn_merge_kernel");
    }
    return FERRY_OK;
}
