/* deltanet — the gated delta rule, token by token and by chunks, and the ops around it (see deltanet.h). */
#include "kernels/cpu/deltanet.h"

#include <math.h>
#include <string.h>
#ifdef __AVX512F__
#include <immintrin.h>
#endif

#include "kernels/cpu/threadpool.h"
#include "kernels/cpu/vexp.h"

static float silu(float a)
{
    return a / (1.0f + expf(-a));
}

/* ---------------------------------------------------------------------------------------------------------
 */
/* Token by token */

struct rec_job {
    const struct kern_dn_seq *s;
    const struct kern_dn_dims *d;
    float *S;
};

/* One token of one value head in plain loops: the reference the vector step is tested against (through the
 * tests' double loop). */
__attribute__((unused)) static void rec_step_plain(float *S, int hk, int hv, const float *q, const float *k,
                                                   const float *v, float decay, float beta, float *o)
{
    /* u = beta (v - (decay S)ᵀ k), then S = decay S + k uᵀ, o = Sᵀ q. */
    float u[hv];
    for (int c = 0; c < hv; c++) u[c] = 0.0f;
    for (int r = 0; r < hk; r++) {
        float *Sr = S + (size_t)r * hv;
        for (int c = 0; c < hv; c++) {
            Sr[c] *= decay;
            u[c] += Sr[c] * k[r];
        }
    }
    for (int c = 0; c < hv; c++) u[c] = beta * (v[c] - u[c]), o[c] = 0.0f;
    for (int r = 0; r < hk; r++) {
        float *Sr = S + (size_t)r * hv;
        for (int c = 0; c < hv; c++) {
            Sr[c] += k[r] * u[c];
            o[c] += Sr[c] * q[r];
        }
    }
}

#ifdef __AVX512F__
/* The same token in one read-only and one read-write pass over the state, 128 columns at a time (a whole
 * row of the models' heads; a 64 KiB 128x128 state stays in L2 between the two passes): pass 1 gathers Sᵀk
 * and Sᵀq in 16 registers, then u = beta (v - decay Sᵀk), o = decay Sᵀq + (k·q) u (the new state's Sᵀq
 * without reading it again), and pass 2 writes S = decay S + k uᵀ. Columns past head_v are masked off. */
#define PREFETCH_ROWS 8 /* rows ahead pass 1 asks for: at decode the state comes from memory */
static void rec_step_avx512(float *S, int hk, int hv, const float *q, const float *k, const float *v,
                            float decay, float beta, float *o)
{
    float kq = 0.0f;
    for (int r = 0; r < hk; r++) kq += k[r] * q[r];
    const __m512 vdecay = _mm512_set1_ps(decay), vbeta = _mm512_set1_ps(beta), vkq = _mm512_set1_ps(kq);
    for (int c0 = 0; c0 < hv; c0 += 128) {
        __mmask16 m[8];
        for (int i = 0; i < 8; i++) {
            const int left = hv - c0 - 16 * i;
            m[i] = left >= 16 ? (__mmask16)0xffff : left <= 0 ? 0 : (__mmask16)((1u << left) - 1);
        }
        __m512 ak[8], aq[8], u[8];
        for (int i = 0; i < 8; i++) ak[i] = aq[i] = _mm512_setzero_ps();
        for (int r = 0; r < hk; r++) {
            const float *Sr = S + (size_t)r * hv + c0;
            const __m512 kr = _mm512_set1_ps(k[r]), qr = _mm512_set1_ps(q[r]);
            for (int i = 0; i < 8; i++) {
                _mm_prefetch((const char *)(Sr + (size_t)PREFETCH_ROWS * hv + 16 * i), _MM_HINT_T0);
                const __m512 x = _mm512_maskz_loadu_ps(m[i], Sr + 16 * i);
                ak[i] = _mm512_fmadd_ps(x, kr, ak[i]);
                aq[i] = _mm512_fmadd_ps(x, qr, aq[i]);
            }
        }
        for (int i = 0; i < 8; i++) {
            const __m512 vi = _mm512_maskz_loadu_ps(m[i], v + c0 + 16 * i);
            u[i] = _mm512_mul_ps(vbeta, _mm512_fnmadd_ps(vdecay, ak[i], vi));
            _mm512_mask_storeu_ps(o + c0 + 16 * i, m[i],
                                  _mm512_fmadd_ps(vdecay, aq[i], _mm512_mul_ps(vkq, u[i])));
        }
        for (int r = 0; r < hk; r++) {
            float *Sr = S + (size_t)r * hv + c0;
            const __m512 kr = _mm512_set1_ps(k[r]);
            for (int i = 0; i < 8; i++) {
                const __m512 x = _mm512_maskz_loadu_ps(m[i], Sr + 16 * i);
                _mm512_mask_storeu_ps(Sr + 16 * i, m[i], _mm512_fmadd_ps(x, vdecay, _mm512_mul_ps(kr, u[i])));
            }
        }
    }
}
#endif

/* One value head's tokens in order, each step the vector one where the build has it. */
static void rec_head(void *ctx, int j)
{
    const struct rec_job *job = ctx;
    const struct kern_dn_seq *s = job->s;
    const struct kern_dn_dims *d = job->d;
    const int hk = d->head_k, hv = d->head_v, nv = d->n_v_heads, kh = kern_dn_key_head(d, j);
    float *S = job->S + (size_t)j * hk * hv;
    for (int t = 0; t < s->n; t++) {
        const float *q = s->q + (size_t)t * s->stride + (size_t)kh * hk;
        const float *k = s->k + (size_t)t * s->stride + (size_t)kh * hk;
        const float *v = s->v + (size_t)t * s->stride + (size_t)j * hv;
        const float decay = expf(s->g[(size_t)t * nv + j]), beta = s->beta[(size_t)t * nv + j];
        float *o = s->o + (size_t)t * nv * hv + (size_t)j * hv;
#ifdef __AVX512F__
        rec_step_avx512(S, hk, hv, q, k, v, decay, beta, o);
#else
        rec_step_plain(S, hk, hv, q, k, v, decay, beta, o);
#endif
    }
}

void kern_cpu_dn_recurrent(const struct kern_dn_seq *s, const struct kern_dn_dims *d, float *S,
                           struct tpool *tp)
{
    struct rec_job job = {.s = s, .d = d, .S = S};
    if (s->n > 0) tpool_run(tp, rec_head, &job, d->n_v_heads);
}

/* ---------------------------------------------------------------------------------------------------------
 */
/* By chunks */

/* Per value head: KK, QK (C, C); W, U (C, head_v); G (C). */
static size_t head_ws(const struct kern_dn_dims *d, int chunk)
{
    return 2 * (size_t)chunk * chunk + 2 * (size_t)chunk * d->head_v + (size_t)chunk;
}

size_t kern_cpu_dn_chunk_ws_floats(const struct kern_dn_dims *d, int chunk)
{
    return head_ws(d, chunk) * (size_t)d->n_v_heads;
}

struct chunk_job {
    const struct kern_dn_seq *s;
    const struct kern_dn_dims *d;
    float *S, *ws;
    int chunk;
};

/* In 8 running sums, which the compiler keeps in one vector register. */
static float dot(const float *a, const float *b, int n)
{
    float acc[8] = {0};
    int i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++) acc[j] += a[i + j] * b[i + j];
    float sum = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
    for (; i < n; i++) sum += a[i] * b[i];
    return sum;
}

static void chunk_head(void *ctx, int j)
{
    const struct chunk_job *job = ctx;
    const struct kern_dn_seq *s = job->s;
    const struct kern_dn_dims *d = job->d;
    const int hk = d->head_k, hv = d->head_v, nv = d->n_v_heads, kh = kern_dn_key_head(d, j), C = job->chunk;
    float *S = job->S + (size_t)j * hk * hv;
    float *KK = job->ws + head_ws(d, C) * (size_t)j, *QK = KK + (size_t)C * C, *W = QK + (size_t)C * C,
          *U = W + (size_t)C * hv, *G = U + (size_t)C * hv;
#define ROW(p, t, h, w) ((p) + (size_t)(t)*s->stride + (size_t)(h) * (w))
#define OUT(t)          (s->o + (size_t)(t0 + (t)) * nv * hv + (size_t)j * hv)
    for (int t0 = 0; t0 < s->n; t0 += C) {
        const int c = s->n - t0 < C ? s->n - t0 : C;
        float acc = 0.0f;
        for (int t = 0; t < c; t++) G[t] = acc += s->g[(size_t)(t0 + t) * nv + j];
        /* Key-key and query-key products of the chunk, already decayed: KK[t][s] (s < t) and QK[t][s]
         * (s <= t) carry e^{G_t - G_s}. */
        for (int t = 0; t < c; t++) {
            const float *kt = ROW(s->k, t0 + t, kh, hk), *qt = ROW(s->q, t0 + t, kh, hk);
            for (int u = 0; u <= t; u++) {
                const float *ku = ROW(s->k, t0 + u, kh, hk), e = expf(G[t] - G[u]);
                if (u < t) KK[(size_t)t * C + u] = e * dot(kt, ku, hk);
                QK[(size_t)t * C + u] = e * dot(qt, ku, hk);
            }
        }
        /* The old state read by each key and each query: W_t = S0ᵀ k_t, and o_t starts as e^{G_t} S0ᵀ q_t. */
        for (int t = 0; t < c; t++) {
            const float *kt = ROW(s->k, t0 + t, kh, hk), *qt = ROW(s->q, t0 + t, kh, hk);
            float *w = W + (size_t)t * hv, *o = OUT(t);
            for (int x = 0; x < hv; x++) w[x] = o[x] = 0.0f;
            for (int r = 0; r < hk; r++) {
                const float *Sr = S + (size_t)r * hv;
                for (int x = 0; x < hv; x++) w[x] += Sr[x] * kt[r], o[x] += Sr[x] * qt[r];
            }
            const float e = expf(G[t]);
            for (int x = 0; x < hv; x++) o[x] *= e;
        }
        /* The deltas, by forward substitution. */
        for (int t = 0; t < c; t++) {
            const float beta = s->beta[(size_t)(t0 + t) * nv + j], e = expf(G[t]);
            const float *v = ROW(s->v, t0 + t, j, hv), *w = W + (size_t)t * hv;
            float *u = U + (size_t)t * hv;
            for (int x = 0; x < hv; x++) u[x] = v[x] - e * w[x];
            for (int p = 0; p < t; p++) {
                const float a = KK[(size_t)t * C + p];
                const float *up = U + (size_t)p * hv;
                for (int x = 0; x < hv; x++) u[x] -= a * up[x];
            }
            for (int x = 0; x < hv; x++) u[x] *= beta;
        }
        /* The outputs' intra-chunk part. */
        for (int t = 0; t < c; t++) {
            float *o = OUT(t);
            for (int p = 0; p <= t; p++) {
                const float a = QK[(size_t)t * C + p];
                const float *up = U + (size_t)p * hv;
                for (int x = 0; x < hv; x++) o[x] += a * up[x];
            }
        }
        /* The state at the chunk's end, row by row (each row of S written once); G becomes e^{G_last - G_p}.
         */
        const float last = G[c - 1], el = expf(last);
        for (int p = 0; p < c; p++) G[p] = expf(last - G[p]);
        for (int r = 0; r < hk; r++) {
            float *Sr = S + (size_t)r * hv;
            for (int x = 0; x < hv; x++) Sr[x] *= el;
            for (int p = 0; p < c; p++) {
                const float a = G[p] * ROW(s->k, t0 + p, kh, hk)[r];
                const float *up = U + (size_t)p * hv;
                for (int x = 0; x < hv; x++) Sr[x] += a * up[x];
            }
        }
    }
#undef ROW
#undef OUT
}

void kern_cpu_dn_chunked(const struct kern_dn_seq *s, const struct kern_dn_dims *d, float *S, int chunk,
                         float *ws, struct tpool *tp)
{
    if (s->n <= 0 || chunk < 1) return;
    struct chunk_job job = {.s = s, .d = d, .S = S, .ws = ws, .chunk = chunk};
    tpool_run(tp, chunk_head, &job, d->n_v_heads);
}

/* ---------------------------------------------------------------------------------------------------------
 */
/* Around the rule */

/* x silu(x) over n floats in place, 8 at a time through vexp.h's exp. */
static void silu_inplace(float *x, int n)
{
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        const v8f a = *(const v8fu *)(x + i);
        *(v8fu *)(x + i) = a / (1.0f + v8_exp(-a));
    }
    for (; i < n; i++) x[i] = silu(x[i]);
}

void kern_cpu_dn_conv(float *y, const float *x, int n, int channels, const float *w, int width, float *state)
{
    const int h = width - 1; /* rows of state */
    for (int t = 0; t < n; t++) {
        const float *xt = x + (size_t)t * channels;
        float *yt = y + (size_t)t * channels;
        for (int c = 0; c < channels; c++) {
            const float *wc = w + (size_t)c * width, xc = xt[c];
            float acc = wc[h] * xc;
            for (int i = 0; i < h; i++) acc += wc[i] * state[(size_t)i * channels + c];
            for (int i = 0; i + 1 < h; i++)
                state[(size_t)i * channels + c] = state[(size_t)(i + 1) * channels + c];
            if (h > 0) state[(size_t)(h - 1) * channels + c] = xc;
            yt[c] = acc;
        }
        silu_inplace(yt, channels);
    }
}

void kern_cpu_dn_l2norm(float *x, int rows, int d, int stride, float eps, float scale)
{
    for (int r = 0; r < rows; r++) {
        float *xr = x + (size_t)r * stride;
        float ss = 0.0f;
        for (int i = 0; i < d; i++) ss += xr[i] * xr[i];
        const float f = scale / sqrtf(ss + eps);
        for (int i = 0; i < d; i++) xr[i] *= f;
    }
}

void kern_cpu_dn_gated_norm(float *o, const float *z, const float *w, int rows, int d, float eps)
{
    for (int r = 0; r < rows; r++) {
        float *orow = o + (size_t)r * d;
        const float *zr = z + (size_t)r * d;
        float ss = 0.0f;
        for (int i = 0; i < d; i++) ss += orow[i] * orow[i];
        const float f = 1.0f / sqrtf(ss / d + eps);
        int i = 0;
        for (; i + 8 <= d; i += 8) {
            const v8f a = *(const v8fu *)(zr + i), x = *(const v8fu *)(orow + i), wi = *(const v8fu *)(w + i);
            *(v8fu *)(orow + i) = x * f * wi * (a / (1.0f + v8_exp(-a)));
        }
        for (; i < d; i++) orow[i] = orow[i] * f * w[i] * silu(zr[i]);
    }
}
