/* test_host_layers — the host's share of the layers: the pinned thread pool, the CPU backend's layer program
 * against a plain reference at odd shapes, results independent of the thread count and of pinning, and the
 * exchange a GPU engine uses for host layers (KV ops on the cache's backend through `attend`, x moved between
 * backends with its pending delta), checked here between two CPU backends: any mix of layers computed with a
 * borrowed KV cache gives bitwise the logits of one backend alone. */
#include <criterion/criterion.h>
#include <math.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "kernels/core/status.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/threadpool.h"
#include "runtime/forward_cpu.h"
#include "runtime/kv_cache.h"
#include "runtime/model.h"

/* ----------------------------------------------------------------------------------------------------------
 */
/* The thread pool */

struct sq_job {
    long *out;
    int n;
};

static void sq_task(void *ctx, int i)
{
    struct sq_job *j = ctx;
    j->out[i] += (long)i * i + 1;
}

Test(host_layers, pinned_pool_runs_every_task_once_on_distinct_cores)
{
    const int online = tpool_cpus_online();
    cr_assert_geq(online, 1);
    int order[1024];
    const int n_order = tpool_cpu_order(order, 1024);
    cr_assert_eq(n_order, online, "the pinning order lists every allowed CPU once");
    cpu_set_t mask;
    CPU_ZERO(&mask);
    sched_getaffinity(0, sizeof mask, &mask);
    for (int i = 0; i < n_order; i++) {
        cr_assert(CPU_ISSET(order[i], &mask), "cpu %d is not in the affinity mask", order[i]);
        for (int j = 0; j < i; j++) cr_assert_neq(order[i], order[j]);
    }
    cr_assert_geq(tpool_numa_nodes(), 1);
    for (int threads = 1; threads <= online + 2; threads++) {
        struct tpool *tp;
        cr_assert_eq(tpool_init_pinned(&tp, threads), FERRY_OK);
        cr_assert_eq(tpool_size(tp), threads);
        for (int t = 1; t < threads; t++) {
            const int cpu = tpool_thread_cpu(tp, t);
            if (t < n_order)
                cr_assert_eq(cpu, order[t], "worker %d pinned to %d, expected %d", t, cpu, order[t]);
            else
                cr_assert_eq(cpu, -1, "worker %d beyond the cores stays unpinned", t);
        }
        cr_assert_eq(tpool_thread_cpu(tp, 0), -1, "the caller is not pinned");
        const int sizes[] = {1, 2, 7, 1001};
        for (size_t s = 0; s < 4; s++) {
            long out[1001] = {0};
            struct sq_job j = {out, sizes[s]};
            tpool_run(tp, sq_task, &j, sizes[s]);
            tpool_run(tp, sq_task, &j, sizes[s]);
            for (int i = 0; i < sizes[s]; i++) cr_assert_eq(out[i], 2 * ((long)i * i + 1), "task %d", i);
        }
        tpool_free(tp);
    }
}

Test(host_layers, numa_interleave_accepts_any_range)
{
    const size_t n = 3 << 20;
    char *p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    cr_assert(p != MAP_FAILED);
    /* Unaligned start and length are rounded to pages; one node is a no-op. */
    const int rc = tpool_numa_interleave(p + 100, n - 5000);
    cr_assert(rc == FERRY_OK || (rc == FERRY_ERR_UNSUPPORTED && tpool_numa_nodes() > 1));
    memset(p, 7, n);
    cr_assert_eq(p[n - 1], 7);
    munmap(p, n);
}

/* ----------------------------------------------------------------------------------------------------------
 */
/* The layer program against a reference */

/* Odd shapes: dim 40 (not a multiple of the vector length), 5 query heads over 1 KV head, ffn 72. */
static struct llm_hparams odd_shape(void)
{
    struct llm_hparams hp = {.n_vocab = 97,
                             .dim = 40,
                             .n_layers = 3,
                             .n_heads = 5,
                             .n_kv_heads = 1,
                             .head_dim = 8,
                             .ffn_dim = 72,
                             .ctx_train = 64,
                             .norm_eps = 1e-5f,
                             .rope_theta = 10000.0f,
                             .rope_dim = 8,
                             .rope_style = ROPE_STYLE_HALF};
    snprintf(hp.arch, sizeof hp.arch, "llama");
    return hp;
}

/* Plain loops, double accumulation: logits (n_out, V) of the rows that want them. */
static void ref_forward(const struct model *m, struct kv_cache *kv, const int32_t *tok, const int32_t *pos,
                        const int32_t *seq, const uint8_t *want, int n, float *logits)
{
    const struct llm_hparams *hp = &m->hp;
    const int D = hp->dim, qd = hp->n_heads * hp->head_dim, kvd = hp->n_kv_heads * hp->head_dim,
              F = hp->ffn_dim;
    float *x = malloc(sizeof(float) * n * D), *xn = malloc(sizeof(float) * n * D),
          *t = malloc(sizeof(float) * n * D);
    float *q = malloc(sizeof(float) * n * qd), *k = malloc(sizeof(float) * n * kvd),
          *v = malloc(sizeof(float) * n * kvd);
    float *att = malloc(sizeof(float) * n * qd), *g = malloc(sizeof(float) * n * F),
          *u = malloc(sizeof(float) * n * F);
    cr_assert_eq(kern_cpu_embed(x, m->tok_embd.data, m->tok_embd.type, hp->n_vocab, D, tok, n), 0);
    for (int l = 0; l < hp->n_layers; l++) {
        const struct model_layer *L = &m->layers[l];
        struct kv_layer_view view = kv_cache_layer(kv, l);
        kern_cpu_rmsnorm_ref(xn, x, L->attn_norm, n, D, hp->norm_eps);
        kern_cpu_matmul_ref(q, xn, L->wq.data, L->wq.type, L->bq, n, qd, D);
        kern_cpu_matmul_ref(k, xn, L->wk.data, L->wk.type, L->bk, n, kvd, D);
        kern_cpu_matmul_ref(v, xn, L->wv.data, L->wv.type, L->bv, n, kvd, D);
        kern_cpu_rope_ref(q, pos, n, hp->n_heads, hp->head_dim, hp->rope_dim, m->inv_freq, hp->rope_style);
        kern_cpu_rope_ref(k, pos, n, hp->n_kv_heads, hp->head_dim, hp->rope_dim, m->inv_freq, hp->rope_style);
        kern_cpu_kv_store(&view, k, v, seq, pos, n);
        kern_cpu_attention_ref(att, q, &view, seq, pos, n, hp->n_heads, 1.0f / sqrtf((float)hp->head_dim));
        kern_cpu_matmul_ref(t, att, L->wo.data, L->wo.type, NULL, n, D, qd);
        for (int i = 0; i < n * D; i++) x[i] += t[i];
        kern_cpu_rmsnorm_ref(xn, x, L->ffn_norm, n, D, hp->norm_eps);
        kern_cpu_matmul_ref(g, xn, L->w_gate.data, L->w_gate.type, NULL, n, F, D);
        kern_cpu_matmul_ref(u, xn, L->w_up.data, L->w_up.type, NULL, n, F, D);
        for (int i = 0; i < n * F; i++) g[i] = (float)((double)g[i] / (1.0 + exp(-(double)g[i])) * u[i]);
        kern_cpu_matmul_ref(t, g, L->w_down.data, L->w_down.type, NULL, n, D, F);
        for (int i = 0; i < n * D; i++) x[i] += t[i];
    }
    int n_out = 0;
    for (int i = 0; i < n; i++)
        if (want[i]) memcpy(xn + (size_t)n_out++ * D, x + (size_t)i * D, sizeof(float) * D);
    kern_cpu_rmsnorm_ref(xn, xn, m->output_norm, n_out, D, hp->norm_eps);
    kern_cpu_matmul_ref(logits, xn, m->output.data, m->output.type, NULL, n_out, hp->n_vocab, D);
    free(x), free(xn), free(t), free(q), free(k), free(v), free(att), free(g), free(u);
}

static struct backend *cpu_backend(const struct model *m, struct kv_cache *kv, struct backend *owner,
                                   int threads, int pin)
{
    struct forward_cpu_params p = forward_cpu_default_params();
    p.max_tokens = 16;
    p.n_threads = threads;
    p.pin_threads = pin;
    p.kv = kv;
    p.kv_owner = owner;
    struct backend *be = NULL;
    cr_assert_eq(forward_cpu_init(&be, m, &p), FERRY_OK);
    return be;
}

/* The engine's walk over two backends: layer l runs on be[pattern[l] - 'a'] (x moves between them as in
 * runtime/engine.c), the head on be[0]. */
static void walk(struct backend **be, const char *pattern, const struct step *st, float *logits, int L)
{
    struct backend *cur = be[pattern[0] - 'a'];
    cr_assert_eq(cur->ops->begin(cur, st), 0);
    cr_assert_eq(cur->ops->embed(cur, st), 0);
    for (int l = 0; l < L; l++) {
        struct backend *b = be[pattern[l] - 'a'];
        if (b != cur) {
            float *h = b->ops->x_host(b);
            cr_assert_eq(cur->ops->x_out(cur, h, st->b->n_tokens), 0);
            cr_assert_eq(b->ops->x_in(b, h, st->b->n_tokens), 0);
            cur = b;
        }
        cr_assert_eq(b->ops->layer(b, l, st), 0, "layer %d", l);
    }
    if (cur != be[0]) {
        float *h = be[0]->ops->x_host(be[0]);
        cr_assert_eq(cur->ops->x_out(cur, h, st->b->n_tokens), 0);
        cr_assert_eq(be[0]->ops->x_in(be[0], h, st->b->n_tokens), 0);
    }
    cr_assert_eq(be[0]->ops->head(be[0], st, logits), 0);
}

/* A prefill of 7 tokens then two decode tokens, every row's logits; kv's sequence 0 is reset first. */
static void run_seq(struct backend **be, const char *pattern, struct kv_cache *kv, const struct model *m,
                    float *logits)
{
    const int V = m->hp.n_vocab, L = m->hp.n_layers;
    int32_t tok[7], pos[7], seq[7] = {0};
    uint8_t want[7];
    kv_cache_seq_free(kv, 0);
    for (int i = 0; i < 7; i++) tok[i] = (int32_t)((i * 31 + 5) % V), pos[i] = i, want[i] = 1;
    cr_assert_eq(kv_cache_reserve(kv, 0, 9), 0);
    struct batch b = {.n_tokens = 7, .tokens = tok, .pos = pos, .seq = seq, .want_logits = want};
    struct step st = {.b = &b, .max_len = 7, .n_out = 7};
    walk(be, pattern, &st, logits, L);
    for (int d = 0; d < 2; d++) {
        int32_t t = (int32_t)(d * 13 + 2), p = 7 + d, s = 0;
        uint8_t w = 1;
        struct batch b1 = {.n_tokens = 1, .tokens = &t, .pos = &p, .seq = &s, .want_logits = &w};
        struct step st1 = {.b = &b1, .max_len = p + 1, .n_out = 1};
        walk(be, pattern + (d + 1) * (L + 1), &st1, logits + (size_t)(7 + d) * V, L);
    }
}

static void check_against_reference(enum dtype wt)
{
    const struct llm_hparams hp = odd_shape();
    struct model m;
    char err[256] = "";
    cr_assert_eq(model_init_synthetic(&m, &hp, wt, 77, 1, err), 0, "%s", err);
    struct kv_cache kv_ref, kv;
    cr_assert_eq(kv_cache_init(&kv_ref, hp.n_layers, hp.n_kv_heads, hp.head_dim, 1, 64, 64, 16, KV_F32), 0);
    cr_assert_eq(kv_cache_init(&kv, hp.n_layers, hp.n_kv_heads, hp.head_dim, 1, 64, 64, 16, KV_F32), 0);
    const int V = hp.n_vocab;
    float *ref = malloc(sizeof(float) * 9 * V), *got = malloc(sizeof(float) * 9 * V),
          *first = malloc(sizeof(float) * 9 * V);
    /* Reference: the same three steps. */
    {
        int32_t tok[7], pos[7], seq[7] = {0};
        uint8_t want[7];
        for (int i = 0; i < 7; i++) tok[i] = (int32_t)((i * 31 + 5) % V), pos[i] = i, want[i] = 1;
        cr_assert_eq(kv_cache_reserve(&kv_ref, 0, 9), 0);
        ref_forward(&m, &kv_ref, tok, pos, seq, want, 7, ref);
        for (int d = 0; d < 2; d++) {
            int32_t t = (int32_t)(d * 13 + 2), p = 7 + d, s = 0;
            uint8_t w = 1;
            ref_forward(&m, &kv_ref, &t, &p, &s, &w, 1, ref + (size_t)(7 + d) * V);
        }
    }
    const int threads[] = {1, 2, 3};
    for (int ti = 0; ti < 3; ti++)
        for (int pin = 0; pin < 2; pin++) {
            struct backend *a = cpu_backend(&m, &kv, NULL, threads[ti], pin);
            struct backend *be[1] = {a};
            run_seq(be, "aaa/aaa/aaa", &kv, &m, got);
            double worst = 0, maxref = 0;
            for (int i = 0; i < 9 * V; i++) {
                maxref = fmax(maxref, fabs(ref[i]));
                worst = fmax(worst, fabs((double)got[i] - ref[i]));
            }
            cr_assert_leq(worst, 1e-4 * maxref + 1e-5, "%s, %d threads%s: |got - ref| = %g (max |ref| %g)",
                          dtype_name(wt), threads[ti], pin ? " pinned" : "", worst, maxref);
            if (ti == 0 && pin == 0)
                memcpy(first, got, sizeof(float) * 9 * V);
            else
                cr_assert_eq(memcmp(first, got, sizeof(float) * 9 * V), 0,
                             "%d threads%s differ bitwise from 1 thread", threads[ti], pin ? " pinned" : "");
            a->ops->free(a);
        }
    free(ref), free(got), free(first);
    kv_cache_free(&kv_ref);
    kv_cache_free(&kv);
    model_free(&m);
}

Test(host_layers, layer_program_matches_reference_f32)
{
    check_against_reference(DTYPE_F32);
}
Test(host_layers, layer_program_matches_reference_f16)
{
    check_against_reference(DTYPE_F16);
}

/* ----------------------------------------------------------------------------------------------------------
 */
/* The exchange */

/* Backend b computes the layers the pattern gives it with a's KV cache (b has none): for each step (prefill
 * of 7, then two single tokens: the stacked q|k|v rows of m > 1 and m = 1), any pattern equals a alone,
 * bitwise. */
/* A random f16 model of odd_shape and an empty KV cache for it (one sequence of 64 positions). */
static struct llm_hparams odd_model(struct model *m, struct kv_cache *kv, uint64_t seed)
{
    const struct llm_hparams hp = odd_shape();
    char err[256] = "";
    cr_assert_eq(model_init_synthetic(m, &hp, DTYPE_F16, seed, 1, err), 0, "%s", err);
    cr_assert_eq(kv_cache_init(kv, hp.n_layers, hp.n_kv_heads, hp.head_dim, 1, 64, 64, 16, KV_F32), 0);
    return hp;
}

Test(host_layers, borrowed_kv_cache_gives_bitwise_the_same_logits)
{
    struct model m;
    struct kv_cache kv;
    const struct llm_hparams hp = odd_model(&m, &kv, 78);
    const int V = hp.n_vocab;
    float *alone = malloc(sizeof(float) * 9 * V), *mixed = malloc(sizeof(float) * 9 * V);
    struct backend *a = cpu_backend(&m, &kv, NULL, 2, 0);
    struct backend *b = cpu_backend(&m, NULL, a, 3, 1);
    struct backend *be[2] = {a, b};
    run_seq(be, "aaa/aaa/aaa", &kv, &m, alone);
    /* Per step: which layers b computes (the head is a's). */
    const char *patterns[] = {"bbb/bbb/bbb", "bab/aba/bbb", "abb/bba/aab", "baa/bab/abb"};
    for (size_t i = 0; i < sizeof patterns / sizeof patterns[0]; i++) {
        memset(mixed, 0xff, sizeof(float) * 9 * V); /* NaN: a row never written fails */
        run_seq(be, patterns[i], &kv, &m, mixed);
        for (int r = 0; r < 9; r++)
            cr_assert_eq(memcmp(alone + (size_t)r * V, mixed + (size_t)r * V, sizeof(float) * V), 0,
                         "pattern %s: row %d differs", patterns[i], r);
    }
    struct backend_stats st;
    b->ops->stats(b, &st);
    cr_assert_eq(st.layers_run, (uint64_t)(9 + 6 + 5 + 5), "b ran %llu layers",
                 (unsigned long long)st.layers_run);
    /* b has no cache of its own to lend. */
    int32_t t = 1, p = 0, s = 0;
    uint8_t w = 1;
    struct batch b1 = {.n_tokens = 1, .tokens = &t, .pos = &p, .seq = &s, .want_logits = &w};
    struct step st1 = {.b = &b1, .max_len = 1, .n_out = 1};
    cr_assert_eq(b->ops->attend(b, 0, &st1, mixed, mixed), FERRY_ERR_INVALID);
    b->ops->free(b);
    a->ops->free(a);
    /* A backend needs exactly one of a cache and an owner. */
    struct forward_cpu_params bad = forward_cpu_default_params();
    struct backend *x = NULL;
    cr_assert_eq(forward_cpu_init(&x, &m, &bad), FERRY_ERR_INVALID);
    free(alone), free(mixed);
    kv_cache_free(&kv);
    model_free(&m);
}

/* The queries' scalings through a borrowed cache: the owner's rope applies the rotary factor on partial
 * rotary dims (YaRN's attention factor 1.25 with 6 of 8 dims rotating: llm_rope_q_scale 1.5625) and the
 * attention temperature (original context 3: positions 0-8 give floor(pos / 3) = 0-2) to the rows another
 * backend computed, so any pattern equals the owner alone, bitwise; and the scalings change the logits. */
Test(host_layers, borrowed_kv_cache_applies_the_query_scalings)
{
    struct llm_hparams hp = odd_shape();
    hp.rope_dim = 6;
    hp.rope_scaling = (struct rope_scaling){.type = ROPE_SCALING_YARN,
                                            .factor = 4,
                                            .orig_ctx = 16,
                                            .beta_fast = 32,
                                            .beta_slow = 1,
                                            .attn_factor = 1.25f,
                                            .truncate = 1};
    hp.attn_temp_beta = 0.3f, hp.attn_temp_len = 3;
    cr_assert_float_eq(llm_rope_q_scale(&hp), 1.5625f, 1e-6);
    const int V = hp.n_vocab;
    float *out[3];
    for (int k = 0; k < 3; k++) {
        out[k] = malloc(sizeof(float) * 9 * V);
        memset(out[k], 0xff, sizeof(float) * 9 * V); /* NaN: a row never written fails */
    }
    struct model m;
    struct kv_cache kv;
    char err[256] = "";
    cr_assert_eq(model_init_synthetic(&m, &hp, DTYPE_F16, 79, 1, err), 0, "%s", err);
    cr_assert_eq(kv_cache_init(&kv, hp.n_layers, hp.n_kv_heads, hp.head_dim, 1, 64, 64, 16, KV_F32), 0);
    struct backend *a = cpu_backend(&m, &kv, NULL, 2, 0);
    struct backend *b = cpu_backend(&m, NULL, a, 3, 1);
    struct backend *be[2] = {a, b};
    run_seq(be, "aaa/aaa/aaa", &kv, &m, out[0]);
    run_seq(be, "bab/bbb/abb", &kv, &m, out[1]);
    for (int r = 0; r < 9; r++)
        cr_assert_eq(memcmp(out[0] + (size_t)r * V, out[1] + (size_t)r * V, sizeof(float) * V), 0,
                     "row %d differs", r);
    /* Without the temperature (the factor alone) the rows past the original context differ. */
    m.hp.attn_temp_beta = 0;
    run_seq(be, "bab/bbb/abb", &kv, &m, out[2]);
    cr_assert_eq(memcmp(out[0], out[2], sizeof(float) * 3 * V), 0, "rows at positions 0-2 differ");
    cr_assert_neq(memcmp(out[0] + (size_t)8 * V, out[2] + (size_t)8 * V, sizeof(float) * V), 0);
    b->ops->free(b);
    a->ops->free(a);
    for (int k = 0; k < 3; k++) free(out[k]);
    kv_cache_free(&kv);
    model_free(&m);
}

/* The start-up timing cycles through the layers it is given and checks them: an index outside the model, an
 * empty list or a bad count are refused; a valid list gives a positive time, and a step after it gives the
 * logits a step gives without it (the timing touches no KV and leaves no pending residual). */
Test(host_layers, layer_timing_over_several_layers)
{
    struct model m;
    struct kv_cache kv;
    const struct llm_hparams hp = odd_model(&m, &kv, 91);
    struct backend *a = cpu_backend(&m, &kv, NULL, 2, 0);
    const int V = hp.n_vocab;
    float *before = malloc(sizeof(float) * 9 * V), *after = malloc(sizeof(float) * 9 * V);
    run_seq((struct backend *[2]){a, a}, "aaa/aaa/aaa", &kv, &m, before);
    const int all[3] = {2, 0, 1}, past[2] = {0, 3}, neg[1] = {-1};
    double t = 0;
    cr_assert_eq(forward_cpu_time_layers(a, all, 3, 1, 7, &t), FERRY_OK);
    cr_assert_gt(t, 0.0);
    cr_assert_eq(forward_cpu_time_layers(a, all, 3, 4, 3, &t), FERRY_OK);
    cr_assert_gt(t, 0.0);
    cr_assert_eq(forward_cpu_time_layers(a, past, 2, 1, 3, &t), FERRY_ERR_INVALID);
    cr_assert_eq(forward_cpu_time_layers(a, neg, 1, 1, 3, &t), FERRY_ERR_INVALID);
    cr_assert_eq(forward_cpu_time_layers(a, all, 0, 1, 3, &t), FERRY_ERR_INVALID);
    cr_assert_eq(forward_cpu_time_layers(a, NULL, 1, 1, 3, &t), FERRY_ERR_INVALID);
    cr_assert_eq(forward_cpu_time_layers(a, all, 3, 1, 65, &t), FERRY_ERR_INVALID);
    kv_cache_free(&kv);
    cr_assert_eq(kv_cache_init(&kv, hp.n_layers, hp.n_kv_heads, hp.head_dim, 1, 64, 64, 16, KV_F32), 0);
    a->ops->free(a);
    a = cpu_backend(&m, &kv, NULL, 2, 0);
    cr_assert_eq(forward_cpu_time_layers(a, all, 3, 2, 5, &t), FERRY_OK);
    run_seq((struct backend *[2]){a, a}, "aaa/aaa/aaa", &kv, &m, after);
    cr_assert_eq(memcmp(before, after, sizeof(float) * 9 * V), 0, "a step after the timing differs");
    a->ops->free(a);
    free(before), free(after);
    kv_cache_free(&kv);
    model_free(&m);
}

/* A packed block carries the o bias and the attention sinks of a layer that has them (gpt-oss, from
 * tests/golden/models): the weights read back from the block (layer_weights_at) and from its tail alone
 * (layer_weights_tail, what a streamed layer keeps on the device) are the model's, value for value. */
static enum dtype same_type(enum dtype t)
{
    return t;
}

Test(host_layers, packed_block_keeps_o_bias_and_sinks)
{
    char path[4096], err[256] = "";
    snprintf(path, sizeof path, "%s/tests/golden/models/gptoss_yarn_f16.gguf", getenv("FERRY_SRC"));
    struct model_file *mf;
    cr_assert_eq(model_file_open(path, &mf, NULL, NULL, err), FERRY_OK, "%s", err);
    struct model m;
    cr_assert_eq(model_init(&m, mf, err), FERRY_OK, "%s", err);
    const struct llm_hparams *hp = &m.hp;
    const struct model_layer *L = &m.layers[1];
    cr_assert(L->bo && L->attn_sinks && L->bq);
    struct layer_layout lay;
    layer_layout_of(L, hp, same_type, &lay);
    cr_assert_neq(lay.bias_o_off, SIZE_MAX);
    void *blk = aligned_alloc(256, (lay.bytes + 255) / 256 * 256);
    float *tmp = malloc(sizeof(float) * 4096);
    cr_assert_eq(layer_pack(L, hp, &lay, blk, tmp), FERRY_OK);
    struct layer_weights a, b;
    layer_weights_at(&a, &lay, blk);
    layer_weights_tail(&b, &lay, (const char *)blk + lay.norm_off[0]);
    const struct layer_weights *ws[2] = {&a, &b};
    for (int k = 0; k < 2; k++) {
        const float *bo = ws[k]->mat[LAYER_O].part[0].bias, *sk = ws[k]->norm[LAYER_ATTN_SINKS],
                    *bk = ws[k]->mat[LAYER_QKV].part[1].bias;
        cr_assert(bo && sk && bk, "view %d", k);
        cr_assert(memcmp(bo, L->bo, sizeof(float) * hp->dim) == 0, "view %d: o bias", k);
        cr_assert(memcmp(sk, L->attn_sinks, sizeof(float) * hp->n_heads) == 0, "view %d: sinks", k);
        cr_assert(memcmp(bk, L->bk, sizeof(float) * hp->n_kv_heads * hp->head_dim) == 0, "view %d: k bias",
                  k);
    }
    free(tmp);
    free(blk);
    model_free(&m);
    model_file_close(mf);
}
