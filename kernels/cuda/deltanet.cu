/* deltanet (CUDA) — the gated DeltaNet ops on the device (see deltanet.h).
 *
 * The plan: one thread per row scans the step's seq array for its neighbours (O(n) each: a step has at most
 * a few thousand rows), then the first rows of the sequences are listed in row order with their count, so
 * the rule launches one block per sequence that the step can hold (min(n, n_slots)) and the spare ones
 * return at once. The convolution: one thread per (row, channel), its window gathered through the previous-
 * row links and the slot's state; a second launch, once every row has read the old state, writes each
 * sequence's new state. The rule: a block of 8 warps per (sequence, value head, 32 value columns); lane =
 * column, the key rows dealt out to the warps (row k * 8 + warp), so each thread keeps head_k / 8 values of
 * the state in registers for the whole sequence (a 128 x 128 head's 64 KiB lives in 4 blocks' registers,
 * never in shared memory). Per token: q and k to shared memory, u = (decayed S)ᵀ k and o = Sᵀ q reduced over
 * the warps through shared memory in a fixed order (deterministic); the next token's inputs load while this
 * one computes. By chunks (steps of many rows): the same blocks and threads take 16 tokens at a time through
 * kern_cpu_dn_chunked's small products (see dn_rule_chunk_kernel), about 8 block-wide synchronisations per
 * chunk instead of 4 per token. Transcendentals are expf/log1pf/sqrtf (not the fast intrinsics) to follow the
 * CPU within f32 rounding.
 */
#include <stdint.h>

#include "kernels/cuda/check.h"
#include "kernels/cuda/deltanet.h"
#include "kernels/cuda/pdl.h"

#define DN_WARPS 8 /* the rule's warps per block: key rows are dealt out over them */

__device__ __forceinline__ float dn_silu(float a)
{
    return a / (1.0f + expf(-a));
}

/* forward_cpu's gates: rate sigmoid(b); log-decay A softplus(a + dt), softplus as torch's (x past 20). */
__device__ __forceinline__ float dn_rate(float b)
{
    return 1.0f / (1.0f + expf(-b));
}
__device__ __forceinline__ float dn_log_decay(float a, float A, float dt)
{
    const float t = a + dt;
    return A * (t > 20.0f ? t : log1pf(expf(t)));
}

/* ---------------------------------------------------------------------------------------------------------
 */
/* Plan */

/* plan[0, n): previous row of the sequence; [n, 2n): next row; [2n, 3n): fresh (1), continuing (0) or
 * skipped (-1). */
__global__ void dn_plan_links_kernel(int32_t *plan, const int32_t *seq, const int32_t *pos, int n,
                                     int n_slots)
{
    pdl_wait();
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const int32_t s = seq[i];
    int prev = -1, next = -1, first = i;
    for (int j = 0; j < n; j++) {
        if (seq[j] != s) continue;
        if (j < i) {
            if (prev < 0) first = j;
            prev = j;
        } else if (j > i) {
            next = j;
            break;
        }
    }
    plan[i] = prev;
    plan[n + i] = next;
    plan[2 * n + i] = s < 0 || s >= n_slots ? -1 : pos[first] == 0;
}

/* plan[3n, 4n): the first rows of the sequences that are not skipped, in row order; plan[4n]: their count. */
__global__ void dn_plan_heads_kernel(int32_t *plan, int n)
{
    pdl_wait();
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const int32_t *prev = plan, *fresh = plan + 2 * n;
#define DN_HEAD(j) (prev[j] < 0 && fresh[j] >= 0)
    if (i == 0) {
        int count = 0;
        for (int j = 0; j < n; j++) count += DN_HEAD(j);
        plan[4 * n] = count;
    }
    if (!DN_HEAD(i)) return;
    int rank = 0;
    for (int j = 0; j < i; j++) rank += DN_HEAD(j);
    plan[3 * n + rank] = i;
#undef DN_HEAD
}

extern "C" int kern_cuda_dn_plan(int32_t *plan, const int32_t *seq, const int32_t *pos, int n, int n_slots,
                                 cudaStream_t stream)
{
    if (!plan || !seq || !pos || n < 0 || n > KERN_CUDA_DN_MAX_ROWS || n_slots < 1) return FERRY_ERR_INVALID;
    if (n == 0) return FERRY_OK;
    const unsigned blocks = (unsigned)((n + 127) / 128);
    FCUDA_CHECK(
        pdl_launch(dn_plan_links_kernel, dim3(blocks), dim3(128), 0, stream, plan, seq, pos, n, n_slots));
    FCUDA_CHECK(pdl_launch(dn_plan_heads_kernel, dim3(blocks), dim3(128), 0, stream, plan, n));
    return FERRY_OK;
}

/* ---------------------------------------------------------------------------------------------------------
 */
/* Convolution */

/* The inputs of channel c before row i into win, oldest first: with self 0 the h = width - 1 before it (lags
 * h..1 in win[0, h)), with self 1 the last h up to and including it (lags h-1..0: the state that follows row
 * i). Lags within the step come through the previous-row links; one beyond them, d tokens back with m of
 * them in the step, is d - m tokens before the step, which is the state's row h - (d - m) (row k holds the
 * input h - k tokens back), or zero when the sequence starts here. */
__device__ __forceinline__ void dn_window(float *win, const float *x, int ldx, int i, int c, int h,
                                          const int32_t *prev, int fresh, const float *cs, int C, int self)
{
    int r = i, m = 0, in = 1; /* r: the row of lag d while in; m: the lags in the step */
#pragma unroll
    for (int d = 0; d < KERN_CUDA_DN_MAX_WIDTH; d++) {
        if (d > h - self) break;
        if (d > 0 && in) {
            r = prev[r];
            if (r < 0)
                in = 0;
            else
                m = d;
        }
        if (d < 1 - self) continue;
        float v = 0.0f;
        if (in)
            v = x[(int64_t)r * ldx + c];
        else if (!fresh)
            v = cs[(size_t)(h - d + m) * C + c];
        win[self ? h - 1 - d : h - d] = v;
    }
}

/* One thread per (row, channel). STATE 0: y = silu(the convolution); STATE 1, launched after (every row has
 * read the old states by then): each sequence's last row writes its slot's new state. */
template <int STATE>
__global__ void dn_conv_kernel(float *y, const float *x, int ldx, int n, int C, const float *w, int width,
                               float *conv, size_t stride, const int32_t *seq, const int32_t *plan)
{
    pdl_wait();
    const int h = width - 1;
    const int64_t total = (int64_t)n * C, step = (int64_t)gridDim.x * blockDim.x;
    for (int64_t it = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; it < total; it += step) {
        const int i = (int)(it / C), c = (int)(it - (int64_t)i * C);
        const int fresh = plan[2 * n + i];
        if (fresh < 0 || (STATE && plan[n + i] >= 0)) continue;
        float *cs = conv + (size_t)seq[i] * stride;
        float win[KERN_CUDA_DN_MAX_WIDTH];
        dn_window(win, x, ldx, i, c, h, plan, fresh, cs, C, STATE); /* every read before the writes */
        if (STATE) {
            for (int k = 0; k < h; k++) cs[(size_t)k * C + c] = win[k];
            continue;
        }
        /* kern_cpu_dn_conv's order: the row's own tap, then the window oldest first. */
        const float *wc = w + (size_t)c * width;
        float acc = wc[h] * x[(int64_t)i * ldx + c];
        for (int k = 0; k < h; k++) acc += wc[k] * win[k];
        y[(int64_t)i * C + c] = dn_silu(acc);
    }
}

extern "C" int kern_cuda_dn_conv(float *y, const float *x, int ldx, int n, int channels, const float *w,
                                 int width, const struct kern_cuda_dn_state *st, const int32_t *seq,
                                 const int32_t *plan, cudaStream_t stream)
{
    if (!y || !x || !w || !st || !seq || !plan || n < 0 || n > KERN_CUDA_DN_MAX_ROWS || channels < 1 ||
        ldx < channels || width < 1 || width > KERN_CUDA_DN_MAX_WIDTH || (width > 1 && !st->conv) ||
        st->stride < (size_t)(width - 1) * channels)
        return FERRY_ERR_INVALID;
    if (n == 0) return FERRY_OK;
    const int64_t total = (int64_t)n * channels;
    const unsigned blocks = fcuda_blocks(total, 256, (int64_t)fcuda_sm_count() * 16);
    for (int state = 0; state < (width > 1 ? 2 : 1); state++)
        FCUDA_CHECK(pdl_launch(state ? dn_conv_kernel<1> : dn_conv_kernel<0>, dim3(blocks), dim3(256), 0,
                               stream, y, x, ldx, n, channels, w, width, st->conv, st->stride, seq, plan));
    return FERRY_OK;
}

/* ---------------------------------------------------------------------------------------------------------
 */
/* Normalisations */

#define DN_NORM_WARPS 4

/* One warp per (row, query or key head). */
__global__ void dn_qk_l2norm_kernel(float *x, int ld, int n, int nk, int hk, float eps, float q_scale)
{
    pdl_wait();
    const int lane = threadIdx.x & 31;
    const int64_t item = (int64_t)blockIdx.x * DN_NORM_WARPS + (threadIdx.x >> 5);
    if (item >= (int64_t)n * 2 * nk) return;
    const int64_t r = item / (2 * nk);
    const int h = (int)(item - r * 2 * nk);
    float *p = x + r * ld + (int64_t)h * hk;
    float ss = 0.0f;
    for (int j = lane; j < hk; j += 32) ss += p[j] * p[j];
    for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    const float f = (h < nk ? q_scale : 1.0f) / sqrtf(ss + eps);
    for (int j = lane; j < hk; j += 32) p[j] *= f;
}

extern "C" int kern_cuda_dn_qk_l2norm(float *x, int ld, int n, int n_k_heads, int head_k, float eps,
                                      float q_scale, cudaStream_t stream)
{
    if (!x || n < 0 || n > KERN_CUDA_DN_MAX_ROWS || n_k_heads < 1 || head_k < 1 ||
        (int64_t)ld < 2 * (int64_t)n_k_heads * head_k || !(eps >= 0.0f))
        return FERRY_ERR_INVALID;
    if (n == 0) return FERRY_OK;
    const int64_t blocks = ((int64_t)n * 2 * n_k_heads + DN_NORM_WARPS - 1) / DN_NORM_WARPS;
    if (blocks > INT32_MAX) return FERRY_ERR_INVALID;
    FCUDA_CHECK(pdl_launch(dn_qk_l2norm_kernel, dim3((unsigned)blocks), dim3(32 * DN_NORM_WARPS), 0, stream,
                           x, ld, n, n_k_heads, head_k, eps, q_scale));
    return FERRY_OK;
}

/* One warp per (row, head): rmsnorm(o) * w * silu(z) in kern_cpu_dn_gated_norm's order of products. */
__global__ void dn_gated_norm_kernel(float *y, const float *o, const float *z, int ldz, const float *w, int n,
                                     int nh, int d, float eps)
{
    pdl_wait();
    const int lane = threadIdx.x & 31;
    const int64_t item = (int64_t)blockIdx.x * DN_NORM_WARPS + (threadIdx.x >> 5);
    if (item >= (int64_t)n * nh) return;
    const int64_t r = item / nh;
    const int h = (int)(item - r * nh);
    const float *op = o + item * d, *zp = z + r * ldz + (int64_t)h * d;
    float *yp = y + item * d;
    float ss = 0.0f;
    for (int j = lane; j < d; j += 32) ss += op[j] * op[j];
    for (int k = 16; k > 0; k >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, k);
    const float f = 1.0f / sqrtf(ss / (float)d + eps);
    for (int j = lane; j < d; j += 32) yp[j] = op[j] * f * w[j] * dn_silu(zp[j]);
}

extern "C" int kern_cuda_dn_gated_norm(float *y, const float *o, const float *z, int ldz, const float *w,
                                       int n, int n_heads, int d, float eps, cudaStream_t stream)
{
    if (!y || !o || !z || !w || n < 0 || n > KERN_CUDA_DN_MAX_ROWS || n_heads < 1 || d < 1 ||
        (int64_t)ldz < (int64_t)n_heads * d || !(eps >= 0.0f))
        return FERRY_ERR_INVALID;
    if (n == 0) return FERRY_OK;
    const int64_t blocks = ((int64_t)n * n_heads + DN_NORM_WARPS - 1) / DN_NORM_WARPS;
    if (blocks > INT32_MAX) return FERRY_ERR_INVALID;
    FCUDA_CHECK(pdl_launch(dn_gated_norm_kernel, dim3((unsigned)blocks), dim3(32 * DN_NORM_WARPS), 0, stream,
                           y, o, z, ldz, w, n, n_heads, d, eps));
    return FERRY_OK;
}

/* ---------------------------------------------------------------------------------------------------------
 */
/* The gated delta rule */

struct dn_rule_args {
    int nk, nv, hk, hv;
    const float *x, *braw, *araw, *A, *dt;
    int ldx, ldb, lda, ldo;
    float *o;
    float *rec;
    size_t stride;
};

/* Block (sequence blockIdx.x of the plan's list, value head blockIdx.y, columns [32 blockIdx.z, +32)); thread
 * (lane, warp) owns column 32 blockIdx.z + lane of key rows k * DN_WARPS + warp, k < KPT. */
template <int KPT>
__global__ void __launch_bounds__(32 * DN_WARPS)
    dn_rule_kernel(struct dn_rule_args a, int n, const int32_t *seq, const int32_t *plan)
{
    static_assert(32 * DN_WARPS >= KERN_CUDA_DN_MAX_HEAD_K, "a thread loads one query and one key element");
    __shared__ float qs[KERN_CUDA_DN_MAX_HEAD_K], ks[KERN_CUDA_DN_MAX_HEAD_K];
    __shared__ float red_u[DN_WARPS][32], red_o[DN_WARPS][32];
    pdl_wait();
    if ((int)blockIdx.x >= plan[4 * n])
        return; /* fewer sequences than blocks: the same for the whole block */
    const int32_t *next = plan + n, *fresh = plan + 2 * n;
    const int i0 = plan[3 * n + blockIdx.x], j = blockIdx.y, kh = j % a.nk;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, c = blockIdx.z * 32 + lane;
    const int hk = a.hk, hv = a.hv;
    const bool col = c < hv;
    float *S = a.rec + (size_t)seq[i0] * a.stride + (size_t)j * hk * hv;
    float s[KPT];
    const bool zero = fresh[i0] != 0;
#pragma unroll
    for (int k = 0; k < KPT; k++) {
        const int r = k * DN_WARPS + warp;
        s[k] = col && r < hk && !zero ? S[(size_t)r * hv + c] : 0.0f;
    }
    const float A = a.A[j], dtb = a.dt[j];
    /* Token i's inputs are loaded while token i - 1 computes: this thread's query and key element (blockDim
     * >= head_k), its value and the raw gates. */
    const int tid = threadIdx.x;
    float qn, kn, vn, bn, an;
#define DN_LOAD(i)                                                                                           \
    do {                                                                                                     \
        const float *xr_ = a.x + (int64_t)(i)*a.ldx;                                                         \
        qn = tid < hk ? xr_[(size_t)kh * hk + tid] : 0.0f;                                                   \
        kn = tid < hk ? xr_[((size_t)a.nk + kh) * hk + tid] : 0.0f;                                          \
        vn = col ? xr_[(size_t)2 * a.nk * hk + (size_t)j * hv + c] : 0.0f;                                   \
        bn = a.braw[(int64_t)(i)*a.ldb + j];                                                                 \
        an = a.araw[(int64_t)(i)*a.lda + j];                                                                 \
    } while (0)
    DN_LOAD(i0);
    for (int i = i0; i >= 0;) {
        const int i_next = next[i];
        __syncthreads(); /* the previous token's reads of qs, ks and red_o are done */
        if (tid < hk) qs[tid] = qn, ks[tid] = kn;
        const float v = vn;
        const float beta = dn_rate(bn), decay = expf(dn_log_decay(an, A, dtb));
        if (i_next >= 0) DN_LOAD(i_next);
        __syncthreads();
        /* u = beta (v - (decay S)ᵀ k) */
        float pu = 0.0f;
#pragma unroll
        for (int k = 0; k < KPT; k++) {
            const int r = k * DN_WARPS + warp;
            if (r < hk) {
                s[k] *= decay;
                pu += s[k] * ks[r];
            }
        }
        red_u[warp][lane] = pu;
        __syncthreads();
        float u = 0.0f;
#pragma unroll
        for (int w = 0; w < DN_WARPS; w++) u += red_u[w][lane];
        u = beta * (v - u);
        /* S += k uᵀ; o = Sᵀ q */
        float po = 0.0f;
#pragma unroll
        for (int k = 0; k < KPT; k++) {
            const int r = k * DN_WARPS + warp;
            if (r < hk) {
                s[k] += ks[r] * u;
                po += s[k] * qs[r];
            }
        }
        red_o[warp][lane] = po;
        __syncthreads();
        if (warp == 0 && col) {
            float o = 0.0f;
#pragma unroll
            for (int w = 0; w < DN_WARPS; w++) o += red_o[w][lane];
            a.o[(int64_t)i * a.ldo + (int64_t)j * hv + c] = o;
        }
        i = i_next;
    }
#undef DN_LOAD
    if (!col) return;
#pragma unroll
    for (int k = 0; k < KPT; k++) {
        const int r = k * DN_WARPS + warp;
        if (r < hk) S[(size_t)r * hv + c] = s[k];
    }
}

/* By chunks of DN_CHUNK tokens (kern_cpu_dn_chunked's algebra, same block and thread layout as above): per
 * chunk the decayed key-key and query-key products of its tokens (every block of the head computes them), W_t
 * = S0ᵀ k_t and S0ᵀ q_t reduced over the warps, the deltas U by forward substitution (warp 0, one column per
 * lane), the outputs, then the state's update from the registers. Shared memory (floats): K, Q (DN_CHUNK,
 * head_k + 1: rows padded off the banks), KK, QK (DN_CHUNK, DN_CHUNK + 1), G, beta (DN_CHUNK), the
 * reduction (DN_WARPS, DN_CHUNK, 32), W (then S0ᵀq), U, V (DN_CHUNK, 32). */
#define DN_CHUNK 16
static size_t dn_chunk_smem(int hk)
{
    return sizeof(float) * (2 * (size_t)DN_CHUNK * (hk + 1) + 2 * DN_CHUNK * (DN_CHUNK + 1) + 2 * DN_CHUNK +
                            (size_t)DN_WARPS * DN_CHUNK * 32 + 3 * DN_CHUNK * 32);
}

/* red[warp][t][lane] = this thread's part of S0ᵀ x_t (its key rows), for the chunk's m rows x_t of X. */
template <int KPT>
__device__ __forceinline__ void dn_partials(float *red, const float s[KPT], const float *X, int ldk, int m,
                                            int hk, int warp, int lane)
{
    for (int t = 0; t < m; t++) {
        float p = 0.0f;
#pragma unroll
        for (int k = 0; k < KPT; k++) {
            const int r = k * DN_WARPS + warp;
            if (r < hk) p += s[k] * X[t * ldk + r];
        }
        red[(warp * DN_CHUNK + t) * 32 + lane] = p;
    }
}

template <int KPT>
__global__ void __launch_bounds__(32 * DN_WARPS)
    dn_rule_chunk_kernel(struct dn_rule_args a, int n, const int32_t *seq, const int32_t *plan)
{
    extern __shared__ float sm[];
    __shared__ int rows[DN_CHUNK];
    __shared__ int n_rows, i_after;
    pdl_wait();
    if ((int)blockIdx.x >= plan[4 * n]) return; /* the same for the whole block */
    const int32_t *next = plan + n, *fresh = plan + 2 * n;
    const int i0 = plan[3 * n + blockIdx.x], j = blockIdx.y, kh = j % a.nk;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, c = blockIdx.z * 32 + lane;
    const int hk = a.hk, hv = a.hv, ldk = hk + 1, CK1 = DN_CHUNK + 1;
    float *Ks = sm, *Qs = Ks + DN_CHUNK * ldk, *KK = Qs + DN_CHUNK * ldk, *QK = KK + DN_CHUNK * CK1;
    float *G = QK + DN_CHUNK * CK1, *Bt = G + DN_CHUNK, *red = Bt + DN_CHUNK,
          *Wt = red + DN_WARPS * DN_CHUNK * 32;
    float *Ut = Wt + DN_CHUNK * 32, *Vt = Ut + DN_CHUNK * 32;
    const bool col = c < hv;
    float *S = a.rec + (size_t)seq[i0] * a.stride + (size_t)j * hk * hv;
    float s[KPT];
    const bool zero = fresh[i0] != 0;
#pragma unroll
    for (int k = 0; k < KPT; k++) {
        const int r = k * DN_WARPS + warp;
        s[k] = col && r < hk && !zero ? S[(size_t)r * hv + c] : 0.0f;
    }
    const float A = a.A[j], dtb = a.dt[j];
    for (int i = i0; i >= 0;) {
        __syncthreads(); /* the previous chunk is done with every shared array */
        if (tid == 0) {
            int m = 0, r = i;
            for (; r >= 0 && m < DN_CHUNK; r = next[r]) rows[m++] = r;
            n_rows = m, i_after = r;
        }
        __syncthreads();
        const int m = n_rows;
        for (int e = tid; e < m * hk; e += 32 * DN_WARPS) {
            const int t = e / hk, r = e - t * hk;
            const float *xr = a.x + (int64_t)rows[t] * a.ldx;
            Qs[t * ldk + r] = xr[(size_t)kh * hk + r];
            Ks[t * ldk + r] = xr[((size_t)a.nk + kh) * hk + r];
        }
        for (int e = tid; e < m * 32; e += 32 * DN_WARPS) {
            const int t = e >> 5, cc = blockIdx.z * 32 + (e & 31);
            Vt[e] =
                cc < hv ? a.x[(int64_t)rows[t] * a.ldx + (size_t)2 * a.nk * hk + (size_t)j * hv + cc] : 0.0f;
        }
        if (tid < m) {
            G[tid] = dn_log_decay(a.araw[(int64_t)rows[tid] * a.lda + j], A, dtb);
            Bt[tid] = dn_rate(a.braw[(int64_t)rows[tid] * a.ldb + j]);
        }
        __syncthreads();
        if (tid == 0) { /* the running sum, in kern_cpu_dn_chunked's order */
            float acc = 0.0f;
            for (int t = 0; t < m; t++) G[t] = acc += G[t];
        }
        __syncthreads();
        /* KK[t][u] (u < t) and QK[t][u] (u <= t), decayed by e^{G_t - G_u}. */
        for (int e = tid; e < m * m; e += 32 * DN_WARPS) {
            const int t = e / m, u = e - t * m;
            if (u > t) continue;
            float dk = 0.0f, dq = 0.0f;
            for (int r = 0; r < hk; r++) {
                const float ku = Ks[u * ldk + r];
                dk += Ks[t * ldk + r] * ku;
                dq += Qs[t * ldk + r] * ku;
            }
            const float ex = expf(G[t] - G[u]);
            if (u < t) KK[t * CK1 + u] = ex * dk;
            QK[t * CK1 + u] = ex * dq;
        }
        /* W_t = S0ᵀ k_t, reduced over the warps. */
        dn_partials<KPT>(red, s, Ks, ldk, m, hk, warp, lane);
        __syncthreads();
        for (int e = tid; e < m * 32; e += 32 * DN_WARPS) {
            const int t = e >> 5, l = e & 31;
            float w = 0.0f;
            for (int ww = 0; ww < DN_WARPS; ww++) w += red[(ww * DN_CHUNK + t) * 32 + l];
            Wt[e] = w;
        }
        __syncthreads();
        /* Warp 0: the deltas by forward substitution, one column per lane. Meanwhile every warp: S0ᵀ q_t. */
        if (warp == 0)
            for (int t = 0; t < m; t++) {
                float u = Vt[t * 32 + lane] - expf(G[t]) * Wt[t * 32 + lane];
                for (int p = 0; p < t; p++) u -= KK[t * CK1 + p] * Ut[p * 32 + lane];
                Ut[t * 32 + lane] = u * Bt[t];
            }
        dn_partials<KPT>(red, s, Qs, ldk, m, hk, warp, lane);
        __syncthreads();
        /* o_t = e^{G_t} S0ᵀ q_t + sum_{p <= t} QK[t][p] U_p. */
        for (int e = tid; e < m * 32; e += 32 * DN_WARPS) {
            const int t = e >> 5, l = e & 31, cc = blockIdx.z * 32 + l;
            float o = 0.0f;
            for (int ww = 0; ww < DN_WARPS; ww++) o += red[(ww * DN_CHUNK + t) * 32 + l];
            o *= expf(G[t]);
            for (int p = 0; p <= t; p++) o += QK[t * CK1 + p] * Ut[p * 32 + l];
            if (cc < hv) a.o[(int64_t)rows[t] * a.ldo + (int64_t)j * hv + cc] = o;
        }
        /* S = e^{G_last} S0 + sum_p e^{G_last - G_p} k_p U_pᵀ, in registers. */
        const float last = G[m - 1], el = expf(last);
#pragma unroll
        for (int k = 0; k < KPT; k++) {
            const int r = k * DN_WARPS + warp;
            if (r < hk) {
                float v = s[k] * el;
                for (int p = 0; p < m; p++) v += expf(last - G[p]) * Ks[p * ldk + r] * Ut[p * 32 + lane];
                s[k] = v;
            }
        }
        i = i_after;
    }
    if (!col) return;
#pragma unroll
    for (int k = 0; k < KPT; k++) {
        const int r = k * DN_WARPS + warp;
        if (r < hk) S[(size_t)r * hv + c] = s[k];
    }
}

template <int KPT>
static int dn_rule_launch(const struct dn_rule_args *a, int n, int n_slots, int chunked, const int32_t *seq,
                          const int32_t *plan, cudaStream_t stream)
{
    const dim3 grid((unsigned)(n < n_slots ? n : n_slots), (unsigned)a->nv, (unsigned)((a->hv + 31) / 32));
    if (!chunked) {
        FCUDA_CHECK(pdl_launch(dn_rule_kernel<KPT>, grid, dim3(32 * DN_WARPS), 0, stream, *a, n, seq, plan));
        return FERRY_OK;
    }
    const size_t smem = dn_chunk_smem(a->hk);
    if (smem > (size_t)fcuda_smem_optin()) return FERRY_ERR_UNSUPPORTED;
    static bool opted = false; /* per instantiation */
    if (smem > (48u << 10) && !opted) {
        FCUDA_CHECK(cudaFuncSetAttribute(dn_rule_chunk_kernel<KPT>,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         (int)dn_chunk_smem(KERN_CUDA_DN_MAX_HEAD_K)));
        opted = true;
    }
    FCUDA_CHECK(
        pdl_launch(dn_rule_chunk_kernel<KPT>, grid, dim3(32 * DN_WARPS), smem, stream, *a, n, seq, plan));
    return FERRY_OK;
}

extern "C" int kern_cuda_dn_rule(const struct kern_cuda_dn_rule *r, int n,
                                 const struct kern_cuda_dn_state *st, const int32_t *seq, const int32_t *plan,
                                 cudaStream_t stream)
{
    if (!r || !st || !seq || !plan || !r->x || !r->braw || !r->araw || !r->A || !r->dt || !r->o || !st->rec ||
        n < 0 || n > KERN_CUDA_DN_MAX_ROWS || st->n_slots < 1)
        return FERRY_ERR_INVALID;
    const int nk = r->n_k_heads, nv = r->n_v_heads, hk = r->head_k, hv = r->head_v;
    if (nk < 1 || nv < 1 || nv % nk != 0 || nv > 65535 || hk < 1 || hk > KERN_CUDA_DN_MAX_HEAD_K || hv < 1 ||
        (hv + 31) / 32 > 65535)
        return FERRY_ERR_INVALID;
    if ((int64_t)r->ldx < 2 * (int64_t)nk * hk + (int64_t)nv * hv || r->ldb < nv || r->lda < nv ||
        (int64_t)r->ldo < (int64_t)nv * hv || st->stride < (size_t)nv * hk * hv)
        return FERRY_ERR_INVALID;
    if (n == 0) return FERRY_OK;
    const struct dn_rule_args a = {.nk = nk,
                                   .nv = nv,
                                   .hk = hk,
                                   .hv = hv,
                                   .x = r->x,
                                   .braw = r->braw,
                                   .araw = r->araw,
                                   .A = r->A,
                                   .dt = r->dt,
                                   .ldx = r->ldx,
                                   .ldb = r->ldb,
                                   .lda = r->lda,
                                   .ldo = r->ldo,
                                   .o = r->o,
                                   .rec = st->rec,
                                   .stride = st->stride};
    const int kpt = (hk + DN_WARPS - 1) / DN_WARPS;
    if (kpt <= 1) return dn_rule_launch<1>(&a, n, st->n_slots, r->chunked, seq, plan, stream);
    if (kpt <= 2) return dn_rule_launch<2>(&a, n, st->n_slots, r->chunked, seq, plan, stream);
    if (kpt <= 4) return dn_rule_launch<4>(&a, n, st->n_slots, r->chunked, seq, plan, stream);
    if (kpt <= 8) return dn_rule_launch<8>(&a, n, st->n_slots, r->chunked, seq, plan, stream);
    if (kpt <= 16) return dn_rule_launch<16>(&a, n, st->n_slots, r->chunked, seq, plan, stream);
    return dn_rule_launch<32>(&a, n, st->n_slots, r->chunked, seq, plan, stream);
}
