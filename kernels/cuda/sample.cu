/* sample (CUDA) — one block of 512 threads per row chooses that row's token; see sample.h for the contract
 * and runtime/sampler.h for the definition it shares with the CPU sampler.
 *
 * A row goes through these steps, each a pass over its vocabulary unless said otherwise (the row is read from
 * L2 after the first pass):
 *   1. bias and penalty tokens (sparse): their modified logits go to the working row, a shared-memory bitmap
 *      marks them;
 *   2. the working row: modified logit or raw, the mask, NaN as -inf; the argmax (value, lowest id); with
 *      logprobs, the raw row's max and sum of exponentials (online, per thread, merged in a fixed tree);
 *   3. with top-n logprobs: the n-th best raw logit by radix selection, then the n entries;
 *   4. greedy rows stop here; sampled rows: top-k by radix selection on the order key (3 passes), top-p by
 *      radix selection on integer masses (3 passes), ties at a boundary split by id with an ordered search;
 *   5. the draw: total kept mass (a pass), then one warp walks its segment of ids to the target.
 * Radix selection: 11-, 11- and 10-bit digits of the 32-bit order key, a shared histogram of counts and (for
 * top-p) masses per digit, filled with warp-aggregated atomics (__match_any_sync, __reduce_add_sync: sm_80+),
 * then a block scan from the highest digit down finds where the k-th element (or the threshold mass) falls.
 * Integer counts and masses make every reduction exact, so the result does not depend on thread timing.
 */
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

#include "kernels/core/sample_math.h"
#include "kernels/cuda/check.h"
#include "kernels/cuda/pdl.h"
#include "kernels/cuda/sample.h"

#define SMP_THREADS 512
#define SMP_WARPS   (SMP_THREADS / 32)
#define SMP_BINS    2048
#define SMP_BPT     (SMP_BINS / SMP_THREADS) /* histogram digits per thread in the scan */
#define SMP_NONE    0xFFFFFFFFu
#define SMP_FULL    0xFFFFFFFFu

typedef unsigned long long u64;

struct smp_shared {
    unsigned cnt[SMP_BINS]; /* radix histogram: elements per digit */
    u64 mass[SMP_BINS];     /* and their integer masses (top-p) */
    unsigned wcnt[SMP_WARPS];
    u64 wsum[SMP_WARPS];
    unsigned wcnt_ex[SMP_WARPS];
    u64 wsum_ex[SMP_WARPS];
    float red_v[SMP_WARPS], red_m[SMP_WARPS], red_s[SMP_WARPS];
    int red_i[SMP_WARPS];
    /* results broadcast to the block */
    unsigned tot_cnt;
    u64 tot_mass, thr;
    int sel_bin;
    unsigned sel_cnt_before, sel_cnt_bin;
    u64 sel_mass_before;
    int find_warp, find_idx;
    u64 find_target;
    int best;
    float best_v, raw_max, raw_sum;
    int n_found;
    kern_cuda_sample_row row; /* this block's controls */
    uint32_t top_key[KERN_SAMPLE_MAX_TOP];
    int top_id[KERN_SAMPLE_MAX_TOP];
};

static constexpr size_t smp_shared_bytes = (sizeof(smp_shared) + 15) / 16 * 16;

struct smp_sel {
    uint32_t key;       /* the boundary key: the k-th element's, or where the cumulative mass reaches thr */
    unsigned cnt_above; /* participating elements with a greater key */
    unsigned cnt_eq;    /* participating elements with this key */
    u64 above;          /* mass of those above (mass mode) */
    u64 thr;            /* the mass threshold searched for (mass mode) */
    bool all;           /* count mode: fewer than `target` elements participate */
};

__device__ __forceinline__ u64 smp_warp_sum(u64 v)
{
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(SMP_FULL, v, o);
    return v;
}

/* Radix selection over the elements for which get(i, key, d) is true (d = v - v_max, used for masses).
 * Count mode (MASS false): the `target`-th greatest key (1-based), or all = true when fewer participate.
 * Mass mode: the key at which the cumulative mass, greatest keys first, first reaches thr =
 * smath_top_p_threshold(top_p, total mass). Called by every thread of the block. */
template <bool MASS, class Get>
__device__ smp_sel smp_select(int V, Get get, u64 target, float top_p, smp_shared &sh)
{
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    smp_sel r = {};
    uint32_t prefix = 0, pmask = 0;
    u64 remaining = target;
    for (int pass = 0; pass < 3; pass++) {
        const int shift = pass == 0 ? 21 : pass == 1 ? 10 : 0;
        const uint32_t dmask = pass == 2 ? 0x3FFu : 0x7FFu;
        for (int b = tid; b < SMP_BINS; b += SMP_THREADS) {
            sh.cnt[b] = 0;
            if (MASS) sh.mass[b] = 0;
        }
        __syncthreads();
        for (int base = tid - lane; base < V; base += SMP_THREADS) { /* warp-uniform */
            const int i = base + lane;
            unsigned digit = SMP_NONE;
            u64 q = 0;
            uint32_t key;
            float d;
            if (i < V && get(i, key, d) && (key & pmask) == prefix) {
                digit = (key >> shift) & dmask;
                if (MASS) q = smath_mass(d);
            }
            if (__ballot_sync(SMP_FULL, digit != SMP_NONE) == 0) continue;
            const unsigned peers = __match_any_sync(SMP_FULL, digit);
            if (digit != SMP_NONE) {
                u64 m = 0;
                if (MASS) { /* q <= 2^44: two 22-bit halves, each summed over <= 32 lanes without overflow */
                    const unsigned lo = __reduce_add_sync(peers, (unsigned)(q & 0x3FFFFFu));
                    const unsigned hi = __reduce_add_sync(peers, (unsigned)(q >> 22));
                    m = ((u64)hi << 22) + lo;
                }
                if (lane == __ffs(peers) - 1) {
                    atomicAdd(&sh.cnt[digit], (unsigned)__popc(peers));
                    if (MASS) atomicAdd(&sh.mass[digit], m);
                }
            }
        }
        __syncthreads();

        /* Block scan, highest digit first: thread t holds digits SMP_BINS-1 - (SMP_BPT*t + j), j < SMP_BPT.
         */
        const int btop = SMP_BINS - 1 - SMP_BPT * tid;
        unsigned c = 0;
        u64 m = 0;
#pragma unroll
        for (int j = 0; j < SMP_BPT; j++) {
            c += sh.cnt[btop - j];
            if (MASS) m += sh.mass[btop - j];
        }
        const unsigned c_own = c;
        const u64 m_own = m;
        for (int o = 1; o < 32; o <<= 1) {
            const unsigned oc = __shfl_up_sync(SMP_FULL, c, o);
            const u64 om = __shfl_up_sync(SMP_FULL, m, o);
            if (lane >= o) c += oc, m += om;
        }
        if (lane == 31) sh.wcnt[warp] = c, sh.wsum[warp] = m;
        __syncthreads();
        if (warp == 0) {
            const unsigned wc = lane < SMP_WARPS ? sh.wcnt[lane] : 0;
            const u64 wm = lane < SMP_WARPS ? sh.wsum[lane] : 0;
            unsigned ic = wc;
            u64 im = wm;
            for (int o = 1; o < 32; o <<= 1) {
                const unsigned oc = __shfl_up_sync(SMP_FULL, ic, o);
                const u64 om = __shfl_up_sync(SMP_FULL, im, o);
                if (lane >= o) ic += oc, im += om;
            }
            if (lane < SMP_WARPS) sh.wcnt_ex[lane] = ic - wc, sh.wsum_ex[lane] = im - wm;
            if (lane == 31 && pass == 0) {
                sh.tot_cnt = ic;
                sh.tot_mass = im;
                sh.thr = MASS ? smath_top_p_threshold(top_p, im) : 0;
            }
        }
        __syncthreads();
        if (pass == 0) {
            if (!MASS && sh.tot_cnt < target) {
                r.all = true;
                return r; /* uniform: every thread read the same total */
            }
            if (MASS) remaining = r.thr = sh.thr;
        }
        {
            /* the exclusive prefix (all higher digits), then this thread's digits in turn */
            unsigned cb = c - c_own + sh.wcnt_ex[warp];
            u64 mb = m - m_own + sh.wsum_ex[warp];
#pragma unroll
            for (int j = 0; j < SMP_BPT; j++) {
                const unsigned cj = sh.cnt[btop - j];
                const u64 mj = MASS ? sh.mass[btop - j] : 0;
                const u64 before = MASS ? mb : cb, v = MASS ? mj : cj;
                if (before < remaining && remaining <= before + v) {
                    sh.sel_bin = btop - j, sh.sel_cnt_before = cb, sh.sel_mass_before = mb,
                    sh.sel_cnt_bin = cj;
                    break;
                }
                cb += cj, mb += mj;
            }
        }
        __syncthreads();
        prefix |= (uint32_t)sh.sel_bin << shift;
        pmask |= dmask << shift;
        r.cnt_above += sh.sel_cnt_before;
        r.above += sh.sel_mass_before;
        remaining -= MASS ? sh.sel_mass_before : sh.sel_cnt_before;
        if (pass == 2) r.cnt_eq = sh.sel_cnt_bin;
        __syncthreads(); /* sh.sel_* and the histogram are rewritten by the next pass */
    }
    r.key = prefix;
    return r;
}

/* The first id i (in id order) whose cumulative weight, ids <= i, exceeds target_of(total weight); target_of
 * must return less than the total. Warp w owns ids [w*seg, (w+1)*seg): a pass sums each warp's segment, then
 * the warp holding the target walks its segment 32 ids at a time with a shuffle scan. Called by every thread;
 * returns -1 only if target_of broke its contract. */
template <class W, class T> __device__ int smp_find(int V, W weight, T target_of, smp_shared &sh)
{
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int seg = (V + SMP_THREADS - 1) / SMP_THREADS * 32;
    const int lo = warp * seg, hi = min(lo + seg, V);
    u64 s = 0;
    for (int base = lo; base < hi; base += 32) {
        const int i = base + lane;
        if (i < hi) s += weight(i);
    }
    s = smp_warp_sum(s);
    if (lane == 0) sh.wsum[warp] = s;
    __syncthreads();
    if (tid == 0) {
        u64 tot = 0;
        for (int k = 0; k < SMP_WARPS; k++) tot += sh.wsum[k];
        const u64 t = target_of(tot);
        u64 pre = 0;
        sh.find_warp = -1;
        sh.find_idx = -1;
        for (int k = 0; k < SMP_WARPS; k++) {
            if (t < pre + sh.wsum[k]) {
                sh.find_warp = k;
                sh.find_target = t - pre;
                break;
            }
            pre += sh.wsum[k];
        }
    }
    __syncthreads();
    if (warp == sh.find_warp) {
        const u64 t = sh.find_target;
        u64 cum = 0;
        for (int base = lo; base < hi; base += 32) {
            const int i = base + lane;
            const u64 x = i < hi ? weight(i) : 0;
            u64 incl = x;
            for (int o = 1; o < 32; o <<= 1) {
                const u64 y = __shfl_up_sync(SMP_FULL, incl, o);
                if (lane >= o) incl += y;
            }
            const unsigned hit = __ballot_sync(SMP_FULL, x > 0 && cum + incl > t);
            if (hit) {
                if (lane == 0) sh.find_idx = base + __ffs(hit) - 1;
                break;
            }
            cum += __shfl_sync(SMP_FULL, incl, 31);
        }
    }
    __syncthreads();
    const int idx = sh.find_idx;
    __syncthreads(); /* sh.find_* may be rewritten by the next call */
    return idx;
}

/* (max, sum of e^(x - max)) pairs, merged. */
__device__ __forceinline__ void smp_lse_merge(float &m, float &s, float om, float os)
{
    const float M = fmaxf(m, om);
    if (M == -INFINITY) return;
    s = s * expf(m - M) + os * expf(om - M);
    m = M;
}

__global__ void __launch_bounds__(SMP_THREADS, 1)
    sample_kernel(const kern_cuda_sample_batch B, int32_t *tokens, kern_cuda_sample_lp *lp, float *ws)
{
    extern __shared__ __align__(16) unsigned char smem[];
    smp_shared &sh = *reinterpret_cast<smp_shared *>(smem);
    uint32_t *bits =
        reinterpret_cast<uint32_t *>(smem + smp_shared_bytes); /* tokens set in the working row */
    pdl_wait(); /* the logits and the per-step arrays are written by earlier work */
    pdl_trigger();
    const int row = blockIdx.x, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int V = B.n_vocab, words = (V + 31) / 32;
    if (tid == 0) sh.row = B.rows[row];
    const float *raw = B.logits + (size_t)row * V;
    float *w = ws + (size_t)row * V;
    auto bit = [&](int i) { return (bits[i >> 5] >> (i & 31)) & 1u; };

    /* 1. Sparse modifications: bias (duplicates summed in list order by their first entry's thread), then
     * the penalties of the history's tokens on the biased values. */
    for (int i = tid; i < words; i += SMP_THREADS) bits[i] = 0;
    __syncthreads();
    const kern_cuda_sample_row &R = sh.row; /* read from shared memory where needed: fewer live registers */
    for (int j = R.bias_begin + tid; j < R.bias_end; j += SMP_THREADS) {
        const int t = B.bias_tok[j];
        if (t < 0 || t >= V) continue;
        bool first = true;
        for (int jj = R.bias_begin; jj < j && first; jj++) first = B.bias_tok[jj] != t;
        if (!first) continue;
        float v = raw[t];
        for (int jj = j; jj < R.bias_end; jj++)
            if (B.bias_tok[jj] == t) v = smath_add(v, B.bias_val[jj]);
        w[t] = v;
        atomicOr(&bits[t >> 5], 1u << (t & 31));
    }
    __syncthreads();
    if (R.repetition_penalty != 1.0f || R.presence_penalty != 0.0f || R.frequency_penalty != 0.0f) {
        for (int j = R.hist_begin + tid; j < R.hist_end; j += SMP_THREADS) {
            const int t = B.hist_tok[j];
            const unsigned c = B.hist_cnt[j];
            if (t < 0 || t >= V || c == 0) continue;
            const float v = bit(t) ? w[t] : raw[t];
            w[t] = smath_penalize(v, c, R.repetition_penalty, R.presence_penalty, R.frequency_penalty);
            atomicOr(&bits[t >> 5], 1u << (t & 31));
        }
        __syncthreads();
    }

    /* 2. The working row, its argmax, and the raw row's log-sum-exp. */
    const uint32_t *mrow = R.mask_row >= 0 && B.mask ? B.mask + (size_t)R.mask_row * words : nullptr;
    const bool want_lp = R.n_logprobs >= 0 && lp != nullptr;
    float bv = -INFINITY, rm = -INFINITY, rs = 0.0f;
    int bi = 0x7fffffff;
    for (int i = tid; i < V; i += SMP_THREADS) {
        const float r = raw[i];
        float v = bit(i) ? w[i] : r;
        if (mrow && !((mrow[i >> 5] >> (i & 31)) & 1u)) v = -INFINITY;
        if (isnan(v)) v = -INFINITY;
        w[i] = v;
        if (v > bv || (v == bv && i < bi)) bv = v, bi = i;
        if (want_lp) {
            const float x = isnan(r) ? -INFINITY : r;
            if (x > rm) {
                rs = rs * expf(rm - x) + 1.0f;
                rm = x;
            } else if (x > -INFINITY) {
                rs += expf(x - rm);
            }
        }
    }
    for (int o = 16; o > 0; o >>= 1) {
        const float ov = __shfl_xor_sync(SMP_FULL, bv, o), om = __shfl_xor_sync(SMP_FULL, rm, o),
                    os = __shfl_xor_sync(SMP_FULL, rs, o);
        const int oi = __shfl_xor_sync(SMP_FULL, bi, o);
        if (ov > bv || (ov == bv && oi < bi)) bv = ov, bi = oi;
        smp_lse_merge(rm, rs, om, os);
    }
    if (lane == 0) sh.red_v[warp] = bv, sh.red_i[warp] = bi, sh.red_m[warp] = rm, sh.red_s[warp] = rs;
    __syncthreads();
    if (warp == 0) {
        const bool own = lane < SMP_WARPS;
        bv = own ? sh.red_v[lane] : -INFINITY, bi = own ? sh.red_i[lane] : 0x7fffffff;
        rm = own ? sh.red_m[lane] : -INFINITY, rs = own ? sh.red_s[lane] : 0.0f;
        for (int o = 16; o > 0; o >>= 1) {
            const float ov = __shfl_xor_sync(SMP_FULL, bv, o), om = __shfl_xor_sync(SMP_FULL, rm, o),
                        os = __shfl_xor_sync(SMP_FULL, rs, o);
            const int oi = __shfl_xor_sync(SMP_FULL, bi, o);
            if (ov > bv || (ov == bv && oi < bi)) bv = ov, bi = oi;
            smp_lse_merge(rm, rs, om, os);
        }
        if (lane == 0) sh.best = bi, sh.best_v = bv, sh.raw_max = rm, sh.raw_sum = rs;
    }
    __syncthreads(); /* also orders every w[] write before the passes below */
    const int best = sh.best;
    const float best_v = sh.best_v, lse = sh.raw_max + logf(sh.raw_sum);

    /* 3. The raw row's top n, best first, lowest id first on ties. */
    int n_top = 0;
    if (want_lp) {
        n_top = min(min(R.n_logprobs, KERN_SAMPLE_MAX_TOP), V);
        if (n_top > 0) {
            auto rkey = [&](int i) {
                const float x = raw[i];
                return smath_key(isnan(x) ? -INFINITY : x);
            };
            auto get = [&](int i, uint32_t &key, float &d) {
                key = rkey(i);
                d = 0.0f;
                return true;
            };
            const smp_sel s = smp_select<false>(V, get, (u64)n_top, 0.0f, sh);
            const unsigned need = (unsigned)n_top - s.cnt_above;
            int cut = 0x7fffffff;
            if (need < s.cnt_eq)
                cut = smp_find(
                    V, [&](int i) -> u64 { return rkey(i) == s.key; }, [&](u64) { return (u64)(need - 1); },
                    sh);
            if (tid == 0) sh.n_found = 0;
            __syncthreads();
            for (int i = tid; i < V; i += SMP_THREADS) {
                const uint32_t k = rkey(i);
                if (k > s.key || (k == s.key && i <= cut)) {
                    const int slot = atomicAdd(&sh.n_found, 1);
                    if (slot < KERN_SAMPLE_MAX_TOP) sh.top_key[slot] = k, sh.top_id[slot] = i;
                }
            }
            __syncthreads();
        }
    }

    /* 4-5. The choice. */
    int tok = best;
    const float T = R.temperature;
    const float inv_t = smath_div(1.0f, T > 0.0f ? T : 1.0f), maxv = smath_mul(best_v, inv_t);
    if (T > 0.0f && best_v != -INFINITY && isfinite(maxv)) {
        auto elem = [&](int i, uint32_t &key, float &d) {
            const float v = smath_mul(w[i], inv_t);
            d = smath_sub(v, maxv);
            key = smath_key(v);
            return d >= -SMATH_TAIL;
        };
        bool lim_k = false, lim_p = false;
        uint32_t tk = 0, tp = 0;
        int idk = 0x7fffffff, idp = 0x7fffffff;
        if (R.top_k > 0) {
            const smp_sel s = smp_select<false>(V, elem, (u64)R.top_k, 0.0f, sh);
            if (!s.all) {
                lim_k = true;
                tk = s.key;
                const unsigned need = (unsigned)R.top_k - s.cnt_above;
                if (need < s.cnt_eq)
                    idk = smp_find(
                        V,
                        [&](int i) -> u64 {
                            uint32_t key;
                            float d;
                            return elem(i, key, d) && key == tk;
                        },
                        [&](u64) { return (u64)(need - 1); }, sh);
            }
        }
        auto in_k = [&](uint32_t key, int i) { return !lim_k || key > tk || (key == tk && i <= idk); };
        if (R.top_p < 1.0f) {
            auto get = [&](int i, uint32_t &key, float &d) { return elem(i, key, d) && in_k(key, i); };
            const smp_sel s = smp_select<true>(V, get, 0, R.top_p, sh);
            lim_p = true;
            tp = s.key;
            const u64 qt = smath_mass(smath_sub(smath_key_value(tp), maxv));
            const u64 c = (s.thr - s.above + qt - 1) / qt; /* ties at the boundary needed: 1..cnt_eq */
            if (c < s.cnt_eq)
                idp = smp_find(
                    V,
                    [&](int i) -> u64 {
                        uint32_t key;
                        float d;
                        return elem(i, key, d) && in_k(key, i) && key == tp;
                    },
                    [&](u64) { return c - 1; }, sh);
        }
        const float min_p = R.min_p;
        auto mass_kept = [&](int i) -> u64 {
            uint32_t key;
            float d;
            if (!elem(i, key, d) || !in_k(key, i)) return 0;
            if (lim_p && !(key > tp || (key == tp && i <= idp))) return 0;
            if (min_p > 0.0f && !(smath_exp(d) >= min_p)) return 0;
            return smath_mass(d);
        };
        const double u = smath_uniform(R.seed, R.step);
        const int found = smp_find(
            V, mass_kept, [&](u64 total) { return smath_draw_target(u, total); }, sh);
        if (found >= 0) tok = found;
    }

    if (tid == 0) {
        tokens[row] = tok;
        if (want_lp) {
            kern_cuda_sample_lp *o = lp + row;
            const int lt = R.lp_token >= 0 && R.lp_token < V ? R.lp_token : tok;
            const float x = raw[lt];
            o->logprob = isnan(x) ? -INFINITY : x - lse;
            const int n = n_top > 0 ? min(n_top, sh.n_found) : 0;
            /* insertion sort of the n entries: key descending, id ascending */
            for (int a = 1; a < n; a++) {
                const uint32_t k = sh.top_key[a];
                const int id = sh.top_id[a];
                int b = a - 1;
                while (b >= 0 && (sh.top_key[b] < k || (sh.top_key[b] == k && sh.top_id[b] > id))) {
                    sh.top_key[b + 1] = sh.top_key[b];
                    sh.top_id[b + 1] = sh.top_id[b];
                    b--;
                }
                sh.top_key[b + 1] = k;
                sh.top_id[b + 1] = id;
            }
            o->n_top = n;
            for (int k = 0; k < n; k++) {
                o->top_id[k] = sh.top_id[k];
                o->top_lp[k] = smath_key_value(sh.top_key[k]) - lse;
            }
        }
    }
}

static size_t smem_bytes(int n_vocab)
{
    return smp_shared_bytes + (size_t)(n_vocab + 31) / 32 * 4;
}

extern "C" size_t kern_cuda_sample_ws_size(int b, int n_vocab)
{
    if (b <= 0 || n_vocab <= 0) return 0;
    return ((size_t)b * n_vocab * sizeof(float) + 15) / 16 * 16;
}

extern "C" int kern_cuda_sample(const struct kern_cuda_sample_batch *batch, int32_t *tokens,
                                struct kern_cuda_sample_lp *lp, void *ws, size_t ws_bytes,
                                cudaStream_t stream)
{
    if (!batch || !tokens || !ws || !batch->logits || !batch->rows) return FERRY_ERR_INVALID;
    const int b = batch->b, V = batch->n_vocab;
    if (b <= 0 || b > 65535 || V <= 0 || V > KERN_SAMPLE_MAX_VOCAB) return FERRY_ERR_INVALID;
    if (ws_bytes < kern_cuda_sample_ws_size(b, V) || !FCUDA_ALIGNED(ws, 16) ||
        !FCUDA_ALIGNED(batch->logits, 4) || !FCUDA_ALIGNED(batch->rows, 8) || !FCUDA_ALIGNED(tokens, 4) ||
        !FCUDA_ALIGNED(lp, 4))
        return FERRY_ERR_INVALID;
    static bool prepared = false;
    if (!prepared) {
        FCUDA_CHECK(cudaFuncSetAttribute(sample_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         (int)smem_bytes(KERN_SAMPLE_MAX_VOCAB)));
        prepared = true;
    }
    FCUDA_CHECK(pdl_launch(sample_kernel, dim3((unsigned)b), dim3(SMP_THREADS), smem_bytes(V), stream, *batch,
                           tokens, lp, (float *)ws));
    FCUDA_LAUNCH_CHECK("sample_kernel");
    return FERRY_OK;
}
