/* deltanet: the gated delta rule token by token against a plain double-precision transcription of
 * transformers' torch_recurrent_gated_delta_rule, the chunked form against the token-by-token one (chunks
 * shorter than, equal to and longer than the sequence, one thread and several, value heads sharing key heads
 * tiled over them as llama.cpp's qwen35 files list them and grouped by key head as transformers and its
 * qwen3next files do), the causal convolution against its definition (all at once, and split with the
 * rolling state carried over), and the L2 and gated norms, at odd sizes on random data. */
#include "kt_common.h"

#include "kernels/cpu/deltanet.h"
#include "kernels/cpu/threadpool.h"

/* transformers' loop in double: S *= e^g; kv = Sᵀk; delta = (v - kv) beta; S += k deltaᵀ; o = Sᵀq. */
static void rule_ref(const struct kern_dn_seq *s, const struct kern_dn_dims *d, double *S, float *o)
{
    const int hk = d->head_k, hv = d->head_v, nv = d->n_v_heads;
    for (int j = 0; j < nv; j++) {
        double *Sj = S + (size_t)j * hk * hv;
        /* Grouped: transformers' repeat_interleave of the key heads; tiled: llama.cpp's qwen35 order. */
        const int kh = d->grouped ? j / (nv / d->n_k_heads) : j % d->n_k_heads;
        for (int t = 0; t < s->n; t++) {
            const float *q = s->q + (size_t)t * s->stride + kh * hk,
                        *k = s->k + (size_t)t * s->stride + kh * hk,
                        *v = s->v + (size_t)t * s->stride + j * hv;
            const double decay = exp((double)s->g[t * nv + j]), beta = s->beta[t * nv + j];
            for (int i = 0; i < hk * hv; i++) Sj[i] *= decay;
            for (int c = 0; c < hv; c++) {
                double kv = 0;
                for (int r = 0; r < hk; r++) kv += Sj[r * hv + c] * k[r];
                const double delta = (v[c] - kv) * beta;
                for (int r = 0; r < hk; r++) Sj[r * hv + c] += k[r] * delta;
            }
            for (int c = 0; c < hv; c++) {
                double acc = 0;
                for (int r = 0; r < hk; r++) acc += Sj[r * hv + c] * q[r];
                o[(size_t)t * nv * hv + j * hv + c] = (float)acc;
            }
        }
    }
}

struct case_data {
    struct kern_dn_dims d;
    int n, stride;
    float *row, *g, *beta, *S0;
};

/* Rows q | k | v as the convolution leaves them, q and k L2-normed (q scaled), decays and rates in their
 * ranges, a random initial state. */
static void case_make(struct case_data *c, int nk, int nv, int hk, int hv, int n, int grouped, uint64_t seed)
{
    kt_seed(seed);
    c->d = (struct kern_dn_dims){
        .n_k_heads = nk, .n_v_heads = nv, .head_k = hk, .head_v = hv, .grouped = grouped};
    c->n = n;
    c->stride = 2 * nk * hk + nv * hv;
    c->row = malloc(sizeof(float) * (size_t)n * c->stride);
    c->g = malloc(sizeof(float) * (size_t)n * nv);
    c->beta = malloc(sizeof(float) * (size_t)n * nv);
    c->S0 = malloc(sizeof(float) * (size_t)nv * hk * hv);
    kt_fill(c->row, (size_t)n * c->stride, -1.0f, 1.0f);
    for (int t = 0; t < n; t++)
        kern_cpu_dn_l2norm(c->row + (size_t)t * c->stride, 2 * nk, hk, hk, 1e-6f, 1.0f);
    for (int t = 0; t < n; t++)
        kern_cpu_dn_l2norm(c->row + (size_t)t * c->stride, nk, hk, hk, 0.0f, 1.0f / sqrtf((float)hk));
    kt_fill(c->g, (size_t)n * nv, -2.0f, -0.01f);
    kt_fill(c->beta, (size_t)n * nv, 0.05f, 0.95f);
    kt_fill(c->S0, (size_t)nv * hk * hv, -0.5f, 0.5f);
}

static void case_free(struct case_data *c)
{
    free(c->row);
    free(c->g);
    free(c->beta);
    free(c->S0);
}

static struct kern_dn_seq case_seq(const struct case_data *c, float *o, int t0, int n)
{
    const int qk = c->d.n_k_heads * c->d.head_k;
    const float *r = c->row + (size_t)t0 * c->stride;
    return (struct kern_dn_seq){.q = r,
                                .k = r + qk,
                                .v = r + 2 * qk,
                                .stride = c->stride,
                                .g = c->g + (size_t)t0 * c->d.n_v_heads,
                                .beta = c->beta + (size_t)t0 * c->d.n_v_heads,
                                .o = o + (size_t)t0 * c->d.n_v_heads * c->d.head_v,
                                .n = n};
}

static void check_recurrent(int nk, int nv, int hk, int hv, int n, int threads, int grouped)
{
    struct case_data c;
    case_make(&c, nk, nv, hk, hv, n, grouped, 100 + (uint64_t)n);
    const size_t ns = (size_t)nv * hk * hv, no = (size_t)n * nv * hv;
    float *o = malloc(sizeof(float) * no), *oref = malloc(sizeof(float) * no),
          *S = malloc(sizeof(float) * ns), *Sf = malloc(sizeof(float) * ns);
    double *Sref = malloc(sizeof(double) * ns);
    for (size_t i = 0; i < ns; i++) S[i] = c.S0[i], Sref[i] = c.S0[i];
    struct tpool *tp = NULL;
    cr_assert_eq(tpool_init(&tp, threads), 0);
    struct kern_dn_seq s = case_seq(&c, oref, 0, n);
    rule_ref(&s, &c.d, Sref, oref);
    /* In two calls: the state carries the sequence over. */
    const int n1 = n / 3;
    s = case_seq(&c, o, 0, n1);
    kern_cpu_dn_recurrent(&s, &c.d, S, tp);
    s = case_seq(&c, o, n1, n - n1);
    kern_cpu_dn_recurrent(&s, &c.d, S, tp);
    for (size_t i = 0; i < ns; i++) Sf[i] = (float)Sref[i];
    char what[96];
    snprintf(what, sizeof what, "recurrent out (%d/%d heads %dx%d, %d tokens, %s)", nk, nv, hk, hv, n,
             grouped ? "grouped" : "tiled");
    kt_check_close(what, o, oref, no, 1e-5, 1e-4);
    kt_check_close("recurrent state", S, Sf, ns, 1e-5, 1e-4);
    tpool_free(tp);
    free(o), free(oref), free(S), free(Sf), free(Sref);
    case_free(&c);
}

Test(deltanet, recurrent_matches_transformers_loop)
{
    check_recurrent(1, 1, 8, 8, 9, 1, 0);
    check_recurrent(3, 6, 7, 5, 37, 1, 0); /* two value heads per key head */
    check_recurrent(2, 6, 16, 12, 50, 3, 0);
    check_recurrent(2, 4, 128, 128, 12, 2, 0); /* the models' heads: one full strip of 128 columns */
    check_recurrent(1, 2, 33, 80, 9, 1, 0);    /* a strip of 128 columns, 48 masked off */
    check_recurrent(1, 1, 5, 144, 7, 1, 0);    /* a full strip and one of 16 columns */
}

Test(deltanet, grouped_value_heads_match_transformers_loop)
{
    check_recurrent(3, 6, 7, 5, 37, 1, 1);
    check_recurrent(2, 6, 16, 12, 50, 3, 1);
    check_recurrent(1, 3, 9, 7, 11, 2, 1);
}

static void check_chunked(int nk, int nv, int hk, int hv, int n, int chunk, int threads, int grouped)
{
    struct case_data c;
    case_make(&c, nk, nv, hk, hv, n, grouped, 200 + (uint64_t)n * 7 + (uint64_t)chunk);
    const size_t ns = (size_t)nv * hk * hv, no = (size_t)n * nv * hv;
    float *o = malloc(sizeof(float) * no), *oref = malloc(sizeof(float) * no),
          *S = malloc(sizeof(float) * ns), *Sref = malloc(sizeof(float) * ns);
    float *ws = malloc(sizeof(float) * kern_cpu_dn_chunk_ws_floats(&c.d, chunk));
    memcpy(S, c.S0, sizeof(float) * ns);
    memcpy(Sref, c.S0, sizeof(float) * ns);
    for (size_t i = 0; i < no; i++) o[i] = NAN;
    struct tpool *tp = NULL;
    cr_assert_eq(tpool_init(&tp, threads), 0);
    struct kern_dn_seq s = case_seq(&c, oref, 0, n);
    kern_cpu_dn_recurrent(&s, &c.d, Sref, NULL);
    s = case_seq(&c, o, 0, n);
    kern_cpu_dn_chunked(&s, &c.d, S, chunk, ws, tp);
    char what[128];
    snprintf(what, sizeof what, "chunked out (%d/%d heads %dx%d, %d tokens, chunks of %d)", nk, nv, hk, hv, n,
             chunk);
    kt_check_close(what, o, oref, no, 2e-5, 2e-4);
    snprintf(what, sizeof what, "chunked state (%d tokens, chunks of %d)", n, chunk);
    kt_check_close(what, S, Sref, ns, 2e-5, 2e-4);
    tpool_free(tp);
    free(o), free(oref), free(S), free(Sref), free(ws);
    case_free(&c);
}

Test(deltanet, chunked_equals_recurrent)
{
    check_chunked(3, 6, 7, 5, 37, 8, 1, 0);  /* 4 full chunks and a partial one */
    check_chunked(3, 6, 7, 5, 37, 64, 2, 0); /* one chunk longer than the sequence */
    check_chunked(3, 6, 7, 5, 37, 1, 1, 0);  /* chunks of one token */
    check_chunked(2, 2, 16, 16, 64, 64, 3, 0);
    check_chunked(1, 3, 13, 11, 131, 32, 3, 0);
    check_chunked(3, 6, 7, 5, 37, 8, 2, 1); /* value heads grouped by key head */
    check_chunked(2, 8, 9, 6, 70, 32, 3, 1);
}

Test(deltanet, conv_matches_definition_and_carries_state)
{
    const int n = 11, ch = 13, width = 4;
    kt_seed(7);
    float *x = malloc(sizeof(float) * n * ch), *y = malloc(sizeof(float) * n * ch),
          *y2 = malloc(sizeof(float) * n * ch), *ref = malloc(sizeof(float) * n * ch), w[13 * 4];
    float state[3 * 13] = {0}, state2[3 * 13] = {0};
    kt_fill(x, (size_t)n * ch, -2.0f, 2.0f);
    kt_fill(w, sizeof w / sizeof w[0], -1.0f, 1.0f);
    for (int t = 0; t < n; t++)
        for (int c = 0; c < ch; c++) {
            double acc = 0;
            for (int i = 0; i < width; i++) {
                const int src = t - (width - 1) + i;
                if (src >= 0) acc += (double)w[c * width + i] * x[src * ch + c];
            }
            ref[t * ch + c] = (float)(acc / (1 + exp(-acc)));
        }
    kern_cpu_dn_conv(y, x, n, ch, w, width, state);
    kt_check_close("conv all at once", y, ref, (size_t)n * ch, 1e-6, 1e-5);
    memcpy(y2, x, sizeof(float) * n * ch); /* in place, in pieces of 2, 1 and 8 tokens */
    kern_cpu_dn_conv(y2, y2, 2, ch, w, width, state2);
    kern_cpu_dn_conv(y2 + 2 * ch, y2 + 2 * ch, 1, ch, w, width, state2);
    kern_cpu_dn_conv(y2 + 3 * ch, y2 + 3 * ch, 8, ch, w, width, state2);
    kt_check_close("conv in pieces", y2, ref, (size_t)n * ch, 1e-6, 1e-5);
    /* Both states hold the last three inputs. */
    for (int i = 0; i < 3; i++)
        for (int c = 0; c < ch; c++) {
            cr_assert_eq(state[i * ch + c], x[(n - 3 + i) * ch + c]);
            cr_assert_eq(state2[i * ch + c], x[(n - 3 + i) * ch + c]);
        }
    free(x), free(y), free(y2), free(ref);
}

Test(deltanet, norms)
{
    const int rows = 5, d = 9;
    kt_seed(11);
    float x[5 * 9], z[5 * 9], w[9], got[5 * 9], ref[5 * 9];
    kt_fill(x, 45, -3.0f, 3.0f);
    kt_fill(z, 45, -3.0f, 3.0f);
    kt_fill(w, 9, 0.5f, 1.5f);
    for (int r = 0; r < rows; r++) {
        double ss = 0;
        for (int i = 0; i < d; i++) ss += (double)x[r * d + i] * x[r * d + i];
        for (int i = 0; i < d; i++) {
            const double zz = z[r * d + i];
            ref[r * d + i] = (float)(x[r * d + i] / sqrt(ss / d + 1e-6) * w[i] * zz / (1 + exp(-zz)));
        }
    }
    memcpy(got, x, sizeof got);
    kern_cpu_dn_gated_norm(got, z, w, rows, d, 1e-6f);
    kt_check_close("gated norm", got, ref, 45, 1e-6, 1e-5);
    /* L2 norm of every other row of 9 in a stride of 18, times 0.5. */
    memcpy(got, x, sizeof got);
    kern_cpu_dn_l2norm(got, 2, d, 2 * d, 1e-6f, 0.5f);
    for (int r = 0; r < 4; r++) {
        double ss = 0;
        for (int i = 0; i < d; i++) ss += (double)x[r * d + i] * x[r * d + i];
        for (int i = 0; i < d; i++)
            ref[r * d + i] = r % 2 ? x[r * d + i] : (float)(0.5 * x[r * d + i] / sqrt(ss + 1e-6));
    }
    kt_check_close("l2 norm", got, ref, 4 * d, 1e-6, 1e-5);
}
