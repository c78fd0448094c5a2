/* test_cuda_deltanet — the gated DeltaNet layer on the device (kernels/cuda/deltanet.h through
 * runtime/forward_cuda_deltanet.h) against kernels/cpu/deltanet.h, composed as forward_cpu's deltanet() does.
 *
 * A two-layer linear-attention model (random tensors) at odd shapes: one key head per value head and value
 * heads grouped over key heads, head sizes below, at and above a warp and at the kernels' largest head_k,
 * convolution widths 1 to 4. Two steps through its second recurrent layer: first prefills of odd lengths
 * beside single tokens, rows of the sequences interleaved, some sequences continuing a random state and some
 * starting at position 0 over a slot full of junk (which must read as zero); then a decode row for each and a
 * new prefill. Each step's outputs, and then every slot's state (the other layer's and the unused slot's
 * untouched), must equal the CPU's within f32 rounding of recurrences over a few dozen tokens:
 * |got - ref| <= 2e-4 + 2e-3 |ref| (the chunked CPU form, what forward_cpu runs for prefills, is held to the
 * same bound). Each case runs three times: the rule token by token, by chunks of 16 (steps of 49 rows: full
 * chunks and a partial one; 9 rows: chunks of one), and as chosen by the step's rows. A row never written
 * stays NaN and fails.
 */
#include "kernels/cpu/deltanet.h"
#include "kernels/cuda/deltanet.h"
#include "runtime/forward_cuda_deltanet.h"
#include "tests/cuda/cuda_test.h"

#define ATOL 2e-4
#define RTOL 2e-3

struct dn_case {
    int nk, nv, hk, hv, width;
};

/* The CPU's layer on one step: forward_cpu's deltanet() after its products. proj rows (n, C | I | nv | nv);
 * conv, rec: each slot's states; out (n, I). chunked: the chunked rule for sequences of several rows. */
static void cpu_step(const struct dn_case *c, const struct model_layer *L, const float *proj, int n,
                     const int32_t *seq, const int32_t *pos, float **conv, float **rec, float *out,
                     int chunked, float eps)
{
    const int C = 2 * c->nk * c->hk + c->nv * c->hv, I = c->nv * c->hv, nv = c->nv, P = C + I + 2 * nv;
    const struct kern_dn_dims d = {.n_k_heads = c->nk, .n_v_heads = nv, .head_k = c->hk, .head_v = c->hv};
    float *run = malloc((size_t)n * C * 4), *g = malloc((size_t)n * nv * 4),
          *beta = malloc((size_t)n * nv * 4), *o = malloc((size_t)n * I * 4),
          *ws = malloc(kern_cpu_dn_chunk_ws_floats(&d, 8) * 4 + 4);
    int *rows = malloc((size_t)n * sizeof(int)), *done = calloc((size_t)n, sizeof(int));
    cr_assert(run && g && beta && o && ws && rows && done);
    for (int i0 = 0; i0 < n; i0++) {
        if (done[i0]) continue;
        const int s = seq[i0];
        int m = 0;
        for (int i = i0; i < n; i++)
            if (!done[i] && seq[i] == s) rows[m++] = i, done[i] = 1;
        if (pos[i0] == 0) {
            memset(conv[s], 0, (size_t)(c->width - 1) * C * 4);
            memset(rec[s], 0, (size_t)nv * c->hk * c->hv * 4);
        }
        for (int t = 0; t < m; t++) {
            const float *pr = proj + (size_t)rows[t] * P;
            memcpy(run + (size_t)t * C, pr, (size_t)C * 4);
            for (int j = 0; j < nv; j++) {
                const float tt = pr[C + I + nv + j] + L->ssm_dt[j];
                beta[(size_t)t * nv + j] = 1.0f / (1.0f + expf(-pr[C + I + j]));
                g[(size_t)t * nv + j] = L->ssm_a[j] * (tt > 20.0f ? tt : log1pf(expf(tt)));
            }
        }
        kern_cpu_dn_conv(run, run, m, C, L->ssm_conv, c->width, conv[s]);
        for (int t = 0; t < m; t++) {
            float *row = run + (size_t)t * C;
            kern_cpu_dn_l2norm(row, c->nk, c->hk, c->hk, 1e-6f, 1.0f / sqrtf((float)c->hk));
            kern_cpu_dn_l2norm(row + (size_t)c->nk * c->hk, c->nk, c->hk, c->hk, 1e-6f, 1.0f);
        }
        const struct kern_dn_seq sq = {.q = run,
                                       .k = run + (size_t)c->nk * c->hk,
                                       .v = run + (size_t)2 * c->nk * c->hk,
                                       .stride = C,
                                       .g = g,
                                       .beta = beta,
                                       .o = o,
                                       .n = m};
        if (chunked && m > 1)
            kern_cpu_dn_chunked(&sq, &d, rec[s], 8, ws, NULL);
        else
            kern_cpu_dn_recurrent(&sq, &d, rec[s], NULL);
        for (int t = 0; t < m; t++) {
            float *orow = out + (size_t)rows[t] * I;
            memcpy(orow, o + (size_t)t * I, (size_t)I * 4);
            kern_cpu_dn_gated_norm(orow, proj + (size_t)rows[t] * P + C, L->ssm_norm, nv, c->hv, eps);
        }
    }
    free(run);
    free(g);
    free(beta);
    free(o);
    free(ws);
    free(rows);
    free(done);
}

static double max_err(const float *got, const float *ref, size_t n, size_t *bad)
{
    double m = 0;
    *bad = SIZE_MAX;
    for (size_t i = 0; i < n; i++) {
        const double e = fabs((double)got[i] - ref[i]);
        if (!isfinite(got[i]) || !(e <= ATOL + RTOL * fabs(ref[i]))) {
            if (*bad == SIZE_MAX) *bad = i;
        }
        if (!isfinite(got[i])) return INFINITY;
        if (e > m) m = e;
    }
    return m;
}

/* A step's rows: the sequences' runs interleaved at random, each run in order. */
static int make_rows(int32_t *seq, int32_t *pos, const int *slots, const int *start, const int *len, int k)
{
    int left[8], next[8], n = 0, total = 0;
    for (int i = 0; i < k; i++) left[i] = len[i], next[i] = start[i], total += len[i];
    while (n < total) {
        const int i = irand(k);
        if (!left[i]) continue;
        seq[n] = slots[i], pos[n] = next[i]++, left[i]--, n++;
    }
    return n;
}

static void run_case(const struct dn_case *c, int ci, const char *rule)
{
    setenv("FERRY_DN_RULE", rule, 1); /* read by cuda_deltanet_init */
    const int C = 2 * c->nk * c->hk + c->nv * c->hv, I = c->nv * c->hv, nv = c->nv, P = C + I + 2 * nv;
    const int n_seqs = 5, T = 64, LAYER = 1;
    const size_t cf = (size_t)(c->width - 1) * C, rf = (size_t)nv * c->hk * c->hv, slot = 2 * (cf + rf);
    struct model_layer layers[3];
    memset(layers, 0, sizeof layers);
    for (int l = 0; l < 2; l++) {
        layers[l].ssm_conv = host_rand((size_t)C * c->width, -0.8f, 0.8f);
        layers[l].ssm_dt = host_rand((size_t)nv, -1.0f, 1.0f);
        layers[l].ssm_a = host_rand((size_t)nv, -2.0f, -0.05f);
        layers[l].ssm_norm = host_rand((size_t)c->hv, 0.5f, 1.5f);
    }
    layers[LAYER].ssm_dt[0] = 21.0f; /* softplus past its threshold */
    const int dim = 24;
    for (int l = 0; l < 2; l++) {
        const int64_t rows[5] = {C, I, nv, nv, dim}, cols[5] = {dim, dim, dim, dim, I};
        struct wview *w[5] = {&layers[l].ssm_qkv, &layers[l].ssm_z, &layers[l].ssm_beta, &layers[l].ssm_alpha,
                              &layers[l].ssm_out};
        for (int k = 0; k < 5; k++)
            *w[k] = (struct wview){.data = host_rand((size_t)rows[k] * cols[k], -1, 1),
                                   .type = DTYPE_F32,
                                   .rows = rows[k],
                                   .cols = cols[k]};
    }
    struct model m = {.layers = layers};
    m.hp.n_layers = 3, m.hp.full_attn_interval = 3, m.hp.norm_eps = 1e-6f, m.hp.dim = dim;
    m.hp.ssm_conv_kernel = c->width, m.hp.ssm_head_k = c->hk, m.hp.ssm_n_k_heads = c->nk;
    m.hp.ssm_n_v_heads = nv, m.hp.ssm_inner = I;
    const size_t bytes = cuda_deltanet_bytes(&m, T, n_seqs);
    cr_assert(bytes > 0);
    void *mem = dev_alloc(bytes);
    struct cuda_deltanet *dn = NULL;
    char err[256];
    cr_assert_eq(cuda_deltanet_init(&dn, &m, T, n_seqs, mem, err), FERRY_OK, "%s", err);
    cr_assert(dn);
    /* The matrices in a layer's block (from an odd offset's next 256 bytes): two pieces, each matrix
     * 256-byte aligned in them and bitwise the model's; none in the attention layer. */
    struct cuda_dn_block blk;
    cuda_deltanet_block_of(&m, 2, 512, &blk);
    cr_assert_eq(blk.bytes, 0, "layer 2 is not recurrent");
    for (int l = 0; l < 2; l++) {
        cuda_deltanet_block_of(&m, l, 512, &blk);
        const struct wview *hm[5] = {&layers[l].ssm_qkv, &layers[l].ssm_z, &layers[l].ssm_beta,
                                     &layers[l].ssm_alpha, &layers[l].ssm_out};
        cr_assert_eq(blk.in_off, 512);
        cr_assert_eq(blk.out_off % 256, 0);
        cr_assert_eq(blk.in_bytes, blk.off[CUDA_DN_A] - 512 + (size_t)nv * dim * 4);
        cr_assert_eq(blk.out_bytes, (size_t)dim * I * 4);
        cr_assert_eq(blk.bytes, (blk.out_off + blk.out_bytes - 512 + 255) / 256 * 256);
        char *block = calloc(1, 512 + blk.bytes);
        cuda_deltanet_block_pack(&m, l, &blk, block);
        struct layer_deltanet v = {0};
        cuda_deltanet_block_place(&m, l, &blk, block + blk.in_off, block + blk.out_off, &v);
        const struct wview *got[5] = {&v.qkv, &v.z, &v.beta, &v.alpha, &v.out};
        for (int k = 0; k < CUDA_DN_MATS; k++) {
            cr_assert_eq(blk.off[k] % 256, 0, "case %d layer %d matrix %d", ci, l, k);
            cr_assert(got[k]->data == block + blk.off[k] && got[k]->rows == hm[k]->rows &&
                      got[k]->cols == hm[k]->cols && got[k]->type == hm[k]->type);
            cr_assert(memcmp(got[k]->data, hm[k]->data, (size_t)hm[k]->rows * hm[k]->cols * 4) == 0,
                      "case %d layer %d matrix %d", ci, l, k);
        }
        free(block);
    }
    cr_assert_eq(cuda_deltanet_slot_bytes(dn), slot * 4);

    /* Every slot starts with random state in both layers; the CPU's copy is layer 1's. */
    float *host = host_rand(slot * n_seqs, -0.5f, 0.5f), *conv[5], *rec[5];
    for (int s = 0; s < n_seqs; s++) {
        cr_assert_eq(cuda_deltanet_upload(dn, s, host + s * slot, 0), FERRY_OK);
        conv[s] = malloc(cf * 4 + 4), rec[s] = malloc(rf * 4 + 4);
        memcpy(conv[s], host + s * slot + (cf + rf), cf * 4);
        memcpy(rec[s], host + s * slot + (cf + rf) + cf, rf * 4);
    }
    float *conv2[5], *rec2[5]; /* the chunked CPU form's own copy */
    for (int s = 0; s < n_seqs; s++) {
        conv2[s] = malloc(cf * 4 + 4), rec2[s] = malloc(rf * 4 + 4);
        memcpy(conv2[s], conv[s], cf * 4);
        memcpy(rec2[s], rec[s], rf * 4);
    }
    /* Step 1: slot 0 prefills 13 from 0, slot 2 one token at 7, slot 3 prefills 29 from 0 over junk, slot 4
     * continues at 3 with 6; slot 1 is idle. Step 2: a decode row each, slot 1 a prefill of 5 from 0. */
    static const int s1_slots[] = {0, 2, 3, 4}, s1_start[] = {0, 7, 0, 3}, s1_len[] = {13, 1, 29, 6};
    static const int s2_slots[] = {0, 2, 3, 4, 1}, s2_start[] = {13, 8, 29, 9, 0}, s2_len[] = {1, 1, 1, 1, 5};
    int32_t seq[64], pos[64];
    for (int step = 0; step < 2; step++) {
        const int n = step == 0 ? make_rows(seq, pos, s1_slots, s1_start, s1_len, 4)
                                : make_rows(seq, pos, s2_slots, s2_start, s2_len, 5);
        float *proj = host_rand((size_t)n * P, -2.0f, 2.0f), *ref = malloc((size_t)n * I * 4),
              *ref2 = malloc((size_t)n * I * 4), *got = malloc((size_t)n * I * 4);
        cpu_step(c, &layers[LAYER], proj, n, seq, pos, conv, rec, ref, 0, m.hp.norm_eps);
        cpu_step(c, &layers[LAYER], proj, n, seq, pos, conv2, rec2, ref2, 1, m.hp.norm_eps);
        float *dproj = dev_upload(proj, (size_t)n * P * 4), *dout = dev_poison((size_t)n * I * 4);
        int32_t *dseq = dev_upload(seq, (size_t)n * 4), *dpos = dev_upload(pos, (size_t)n * 4);
        /* One stacked row per token, the four products side by side. */
        const struct cuda_deltanet_in in = {.qkv = dproj,
                                            .z = dproj + C,
                                            .b = dproj + C + I,
                                            .a = dproj + C + I + nv,
                                            .ld_qkv = P,
                                            .ld_z = P,
                                            .ld_b = P,
                                            .ld_a = P};
        if (step == 1) { /* refused before anything runs: a slot out of range, too many rows, layer 2 */
            int32_t bad_seq[64];
            memcpy(bad_seq, seq, sizeof bad_seq);
            bad_seq[n - 1] = n_seqs;
            cr_assert_eq(cuda_deltanet_run(dn, LAYER, dout, &in, n, dseq, dpos, bad_seq, 0),
                         FERRY_ERR_INVALID);
            cr_assert_eq(cuda_deltanet_run(dn, LAYER, dout, &in, T + 1, dseq, dpos, NULL, 0),
                         FERRY_ERR_INVALID);
            cr_assert_eq(cuda_deltanet_run(dn, 2, dout, &in, n, dseq, dpos, NULL, 0), FERRY_ERR_INVALID);
        }
        cr_assert_eq(cuda_deltanet_run(dn, LAYER, dout, &in, n, dseq, dpos, seq, 0), FERRY_OK);
        dev_download(got, dout, (size_t)n * I * 4);
        size_t bad, bad2;
        const double e = max_err(got, ref, (size_t)n * I, &bad),
                     e2 = max_err(ref2, ref, (size_t)n * I, &bad2);
        printf("deltanet case %d (k heads %d, v heads %d, head_k %d, head_v %d, width %d), rule %s, step %d, "
               "%d rows: max |gpu - cpu| %.3g, max |cpu chunked - cpu| %.3g\n",
               ci, c->nk, nv, c->hk, c->hv, c->width, rule, step, n, e, e2);
        cr_assert(bad == SIZE_MAX, "case %d step %d row %zu col %zu: %g, reference %g", ci, step, bad / I,
                  bad % I, got[bad], ref[bad]);
        cr_assert(bad2 == SIZE_MAX, "case %d step %d: the chunked CPU form differs at %zu", ci, step, bad2);
        cudaFree(dproj);
        cudaFree(dout);
        cudaFree(dseq);
        cudaFree(dpos);
        free(proj);
        free(ref);
        free(ref2);
        free(got);
    }
    /* The states: layer 1's as the CPU left them, layer 0's as uploaded. */
    float *back = malloc(slot * n_seqs * 4);
    for (int s = 0; s < n_seqs; s++)
        cr_assert_eq(cuda_deltanet_download(dn, s, back + s * slot, 0), FERRY_OK);
    CU_OK(cudaDeviceSynchronize());
    double es = 0;
    for (int s = 0; s < n_seqs; s++) {
        const float *b = back + s * slot;
        cr_assert(memcmp(b, host + s * slot, (cf + rf) * 4) == 0, "case %d slot %d: layer 0's state changed",
                  ci, s);
        size_t bad;
        const double e1 = max_err(b + cf + rf, conv[s], cf, &bad);
        cr_assert(bad == SIZE_MAX, "case %d slot %d conv state [%zu]", ci, s, bad);
        const double e2 = max_err(b + cf + rf + cf, rec[s], rf, &bad);
        cr_assert(bad == SIZE_MAX, "case %d slot %d rule state [%zu]: %g, reference %g", ci, s, bad,
                  b[cf + rf + cf + bad], rec[s][bad]);
        es = fmax(es, fmax(e1, e2));
    }
    printf("deltanet case %d, rule %s: max |gpu - cpu| of the states %.3g\n", ci, rule, es);
    /* A reset slot reads back as zeros. */
    cr_assert_eq(cuda_deltanet_reset(dn, 3, 0), FERRY_OK);
    cr_assert_eq(cuda_deltanet_download(dn, 3, back, 0), FERRY_OK);
    CU_OK(cudaDeviceSynchronize());
    for (size_t i = 0; i < slot; i++) cr_assert(back[i] == 0.0f, "case %d: reset slot word %zu", ci, i);
    cuda_deltanet_free(dn);
    cudaFree(mem);
    for (int s = 0; s < n_seqs; s++) free(conv[s]), free(rec[s]), free(conv2[s]), free(rec2[s]);
    for (int l = 0; l < 2; l++) {
        free(layers[l].ssm_conv);
        free(layers[l].ssm_dt);
        free(layers[l].ssm_a);
        free(layers[l].ssm_norm);
        free((void *)layers[l].ssm_qkv.data), free((void *)layers[l].ssm_z.data);
        free((void *)layers[l].ssm_beta.data), free((void *)layers[l].ssm_alpha.data);
        free((void *)layers[l].ssm_out.data);
    }
    free(host);
    free(back);
}

Test(cuda_deltanet, layer_against_cpu)
{
    SKIP_WITHOUT_GPU();
    rng_seed(43);
    static const struct dn_case cs[] = {
        {1, 1, 5, 7, 4},    {2, 6, 33, 40, 4},  {2, 4, 128, 128, 4},
        {3, 3, 200, 65, 3}, {1, 2, 256, 31, 1}, {4, 8, 17, 96, 2},
    };
    static const char *const rules[] = {"auto", "token", "chunk"};
    for (int k = 0; k < 3; k++)
        for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++) run_case(&cs[i], (int)i, rules[k]);
    unsetenv("FERRY_DN_RULE");
}

/* The gated norm alone, z rows wider than the heads (a stacked in-product row), in place. */
Test(cuda_deltanet, gated_norm)
{
    SKIP_WITHOUT_GPU();
    rng_seed(44);
    static const int shapes[][3] = {{1, 1, 1}, {3, 5, 33}, {7, 32, 128}, {2, 3, 1000}};
    for (int k = 0; k < 4; k++) {
        const int n = shapes[k][0], nh = shapes[k][1], d = shapes[k][2], ldz = nh * d + 5;
        float *o = host_rand((size_t)n * nh * d, -3, 3), *z = host_rand((size_t)n * ldz, -4, 4),
              *w = host_rand((size_t)d, 0.5f, 1.5f), *ref = malloc((size_t)n * nh * d * 4),
              *got = malloc((size_t)n * nh * d * 4);
        for (int r = 0; r < n; r++) {
            memcpy(ref + (size_t)r * nh * d, o + (size_t)r * nh * d, (size_t)nh * d * 4);
            kern_cpu_dn_gated_norm(ref + (size_t)r * nh * d, z + (size_t)r * ldz, w, nh, d, 1e-6f);
        }
        float *dO = dev_upload(o, (size_t)n * nh * d * 4), *dz = dev_upload(z, (size_t)n * ldz * 4),
              *dw = dev_upload(w, (size_t)d * 4);
        cr_assert_eq(kern_cuda_dn_gated_norm(dO, dO, dz, ldz, dw, n, nh, d, 1e-6f, 0), FERRY_OK);
        dev_download(got, dO, (size_t)n * nh * d * 4);
        size_t bad;
        const double e = max_err(got, ref, (size_t)n * nh * d, &bad);
        printf("gated norm %d x %d x %d: max |gpu - cpu| %.3g\n", n, nh, d, e);
        cr_assert(bad == SIZE_MAX, "shape %d [%zu]: %g, reference %g", k, bad, got[bad], ref[bad]);
        cudaFree(dO);
        cudaFree(dz);
        cudaFree(dw);
        free(o);
        free(z);
        free(w);
        free(ref);
        free(got);
    }
}

Test(cuda_deltanet, bad_arguments)
{
    SKIP_WITHOUT_GPU();
    float *d = dev_alloc(1 << 16);
    int32_t *p = dev_alloc(1 << 12);
    const struct kern_cuda_dn_state st = {.conv = d, .rec = d, .stride = 1024, .n_slots = 2};
    cr_assert_eq(kern_cuda_dn_plan(p, p, p, 4, 0, 0), FERRY_ERR_INVALID, "no slots");
    cr_assert_eq(kern_cuda_dn_conv(d, d, 3, 1, 4, d, 4, &st, p, p, 0), FERRY_ERR_INVALID,
                 "ldx below channels");
    cr_assert_eq(kern_cuda_dn_conv(d, d, 4, 1, 4, d, 9, &st, p, p, 0), FERRY_ERR_INVALID, "width 9");
    struct kern_cuda_dn_rule r = {.n_k_heads = 2,
                                  .n_v_heads = 3,
                                  .head_k = 4,
                                  .head_v = 4,
                                  .x = d,
                                  .braw = d,
                                  .araw = d,
                                  .A = d,
                                  .dt = d,
                                  .ldx = 64,
                                  .ldb = 3,
                                  .lda = 3,
                                  .ldo = 12,
                                  .o = d};
    cr_assert_eq(kern_cuda_dn_rule(&r, 1, &st, p, p, 0), FERRY_ERR_INVALID, "value heads not a multiple");
    r.n_v_heads = 4, r.head_k = 257, r.ldx = 2000, r.ldb = r.lda = 4, r.ldo = 16;
    cr_assert_eq(kern_cuda_dn_rule(&r, 1, &st, p, p, 0), FERRY_ERR_INVALID, "head_k above 256");
    cr_assert_eq(kern_cuda_dn_qk_l2norm(d, 7, 1, 2, 4, 1e-6f, 1.0f, 0), FERRY_ERR_INVALID, "ld below q|k");
    cr_assert_eq(kern_cuda_dn_gated_norm(d, d, d, 4, d, 0, 2, 4, 1e-6f, 0), FERRY_ERR_INVALID, "ldz below");
    cr_assert_eq(kern_cuda_dn_gated_norm(d, d, d, 8, d, 0, 2, 4, 1e-6f, 0), FERRY_OK, "no rows");
    cudaFree(d);
    cudaFree(p);
}
