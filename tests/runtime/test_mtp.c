/* test_mtp — the multi-token-prediction drafter (runtime/mtp.h) on the tiny Qwen3.5 golden with an MTP block
 * (tests/golden/models/qwen35_mtp_f32.gguf, f32, made with its torch reference by
 * tests/golden/make_qwen35_golden.py --mtp):
 *  - the block's logits for each chained draft within 1e-4 (of the range, + 1e-4) of the torch reference,
 *    after the prompt and after the prompt and some greedy tokens, and the drafted tokens equal;
 *  - greedy generation with speculation (MTP drafts, and drafts that are partly right so that some are
 *    accepted and some rejected) gives exactly the tokens of generation without it, which are the
 *    reference's; the acceptance rate is counted over the drafts;
 *  - after steps with rejected drafts the target's recurrent state and the block's K/V are those of a
 *    sequence that never saw the drafts: the next drafts match the torch reference, and a second request on
 *    the freed slot matches its reference too;
 *  - a file whose nextn or block tensor has a wrong shape is refused, the tensor named.
 */
#include <criterion/criterion.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/core/status.h"
#include "kernels/cpu/attention.h"
#include "runtime/engine.h"
#include "runtime/mtp.h"
#include "runtime/spec.h"

#include "qwen35_fixture.h"

#define NAME    "qwen35_mtp_f32"
#define MAX_TOK 128
#define TOL     1e-4

struct fx {
    json_t *golden;
    struct model_file *mf;
    struct engine *e;
    struct mtp *m;
    int n_vocab, dim;
    float *logits; /* (SPEC_MAX_DRAFT + 1, n_vocab) */
    float *hid;    /* (MAX_TOK, dim) */
};

static void fx_open(struct fx *f)
{
    char *model = qwen35_fixture_src("tests/golden/models/" NAME ".gguf"),
         *json = qwen35_fixture_src("tests/golden/" NAME ".json");
    struct engine_params p = engine_default_params();
    p.n_seqs = 1;
    p.kv_type = KV_F32;
    qwen35_fixture_open(model, json, NAME, p, &f->golden, &f->mf, &f->e);
    free(model);
    free(json);
    f->n_vocab = engine_hparams(f->e)->n_vocab;
    f->dim = engine_hparams(f->e)->dim;
    cr_assert(mtp_available(f->mf));
    struct mtp_params mp = mtp_default_params();
    mp.ctx_size = engine_ctx_size(f->e);
    mp.kv_type = KV_F32;
    mp.n_threads = 2;
    char err[256] = "";
    cr_assert_eq(mtp_init(&f->m, f->mf, &mp, err), FERRY_OK, "mtp_init: %s", err);
    f->logits = malloc((size_t)(SPEC_MAX_DRAFT + 1) * f->n_vocab * sizeof(float));
    f->hid = malloc((size_t)MAX_TOK * f->dim * sizeof(float));
}

static void fx_close(struct fx *f)
{
    mtp_free(f->m);
    engine_free(f->e);
    model_file_close(f->mf);
    json_decref(f->golden);
    free(f->logits);
    free(f->hid);
}

static int ints(json_t *a, int32_t *out, int max)
{
    int n = (int)json_array_size(a);
    cr_assert(n <= max);
    for (int i = 0; i < n; i++) out[i] = (int32_t)json_integer_value(json_array_get(a, (size_t)i));
    return n;
}

#define argmax qwen35_fixture_argmax

/* A fresh slot 0 runs seq (n tokens) in one step, its last row's logits into f->logits, and feeds the block.
 */
static void prefill(struct fx *f, const int32_t *seq, int n)
{
    engine_seq_free(f->e, 0);
    mtp_seq_free(f->m, 0);
    int32_t pos[MAX_TOK], sq[MAX_TOK];
    uint8_t want[MAX_TOK];
    for (int i = 0; i < n; i++) pos[i] = i, sq[i] = 0, want[i] = i == n - 1;
    const struct batch b = {.n_tokens = n,
                            .tokens = (int32_t *)seq,
                            .pos = pos,
                            .seq = sq,
                            .want_logits = want,
                            .hidden_out = f->hid};
    cr_assert_eq(engine_step(f->e, &b, f->logits), FERRY_OK);
    cr_assert_eq(mtp_seq_feed(f->m, 0, 0, seq, n, f->hid), FERRY_OK);
}

/* The block's drafts after `pending` against case c's reference. */
static void expect_drafts(struct fx *f, json_t *c, int32_t pending, const char *what)
{
    json_t *rows = json_object_get(c, "draft_logits");
    const int k = (int)json_array_size(rows);
    int32_t ref_tok[SPEC_MAX_DRAFT], got[SPEC_MAX_DRAFT];
    ints(json_object_get(c, "draft_tokens"), ref_tok, SPEC_MAX_DRAFT);
    int n = 0;
    float *lg = malloc((size_t)k * f->n_vocab * sizeof *lg);
    cr_assert_eq(mtp_draft(f->m, 0, pending, k, 0, got, &n, lg), FERRY_OK);
    cr_assert_eq(n, k);
    float *ref = malloc((size_t)f->n_vocab * sizeof *ref);
    for (int i = 0; i < k; i++) {
        json_t *r = json_array_get(rows, (size_t)i);
        for (int v = 0; v < f->n_vocab; v++) ref[v] = (float)json_real_value(json_array_get(r, (size_t)v));
        char w[96];
        snprintf(w, sizeof w, "%s draft %d", what, i);
        qwen35_fixture_expect_close(lg + (size_t)i * f->n_vocab, ref, f->n_vocab, TOL, w);
        if (json_real_value(json_object_get(c, "draft_min_top2_margin")) > 1e-3)
            cr_expect_eq(got[i], ref_tok[i], "%s: draft %d is %d, the reference's %d", what, i, got[i],
                         ref_tok[i]);
    }
    free(lg);
    free(ref);
    /* The drafts' positions go: the slot continues from the fed ones. */
    mtp_seq_keep(f->m, 0, engine_seq_len(f->e, 0));
}

Test(mtp, logits_match_reference)
{
    struct fx f;
    fx_open(&f);
    json_t *cases = json_object_get(f.golden, "cases");
    for (size_t ci = 0; ci < json_array_size(cases); ci++) {
        json_t *c = json_array_get(cases, ci);
        int32_t seq[MAX_TOK], greedy[64];
        const int np = ints(json_object_get(c, "prompt_tokens"), seq, MAX_TOK);
        ints(json_object_get(c, "greedy_tokens"), greedy, 64);
        const int off = (int)json_integer_value(json_object_get(c, "offset"));
        memcpy(seq + np, greedy, (size_t)off * sizeof *seq);
        prefill(&f, seq, np + off);
        char what[64];
        snprintf(what, sizeof what, "prompt %d offset %d", np, off);
        expect_drafts(&f, c, greedy[off], what);
    }
    fx_close(&f);
}

struct gen_stats {
    int steps, drafted, accepted;
};

/* n greedy tokens after the prompt with speculation of k drafts a step: the block's drafts, or (oracle not
 * NULL) oracle's tokens with the second of each step's drafts made wrong. */
static void gen_spec(struct fx *f, const int32_t *prompt, int np, int n, int k, const int32_t *oracle,
                     int32_t *out, struct gen_stats *st)
{
    prefill(f, prompt, np);
    out[0] = argmax(f->logits, f->n_vocab);
    int ng = 1;
    while (ng < n) {
        const int pos = np + ng - 1;
        const int32_t t = out[ng - 1];
        int kk = k < n - ng - 1 ? k : n - ng - 1, nd = 0;
        int32_t d[SPEC_MAX_DRAFT];
        if (oracle) {
            for (nd = 0; nd < kk; nd++)
                d[nd] = nd == 1 ? (oracle[ng + nd] + 1) % f->n_vocab : oracle[ng + nd];
        } else if (kk > 0) {
            cr_assert_eq(mtp_draft(f->m, 0, t, kk, 0, d, &nd, NULL), FERRY_OK);
        }
        cr_assert_eq(spec_step_hidden(f->e, 0, t, pos, d, nd, f->logits, f->hid), FERRY_OK);
        int a = 0;
        while (a < nd && argmax(f->logits + (size_t)a * f->n_vocab, f->n_vocab) == d[a]) a++;
        const int32_t next = argmax(f->logits + (size_t)a * f->n_vocab, f->n_vocab);
        st->steps++, st->drafted += nd, st->accepted += a;
        cr_assert_eq(spec_keep(f->e, 0, t, pos, d, nd, a, f->hid), FERRY_OK);
        cr_assert_eq(engine_seq_len(f->e, 0), pos + a + 1);
        /* The block keeps what the model kept and takes the kept rows with the model's hidden states. */
        int32_t rows[SPEC_MAX_DRAFT + 1];
        rows[0] = t;
        memcpy(rows + 1, d, (size_t)a * sizeof *d);
        mtp_seq_keep(f->m, 0, pos);
        cr_assert_eq(mtp_seq_len(f->m, 0), pos);
        cr_assert_eq(mtp_seq_feed(f->m, 0, pos, rows, a + 1, f->hid), FERRY_OK);
        for (int i = 0; i < a; i++) out[ng++] = d[i];
        out[ng++] = next;
    }
}

static void gen_plain(struct fx *f, const int32_t *prompt, int np, int n, int32_t *out)
{
    engine_seq_free(f->e, 0);
    cr_assert_eq(qwen35_fixture_feed(f->e, 0, prompt, 0, np, np, f->logits), FERRY_OK);
    for (int i = 0; i < n; i++) {
        out[i] = argmax(f->logits, f->n_vocab);
        if (i + 1 < n) cr_assert_eq(spec_step(f->e, 0, out[i], np + i, NULL, 0, f->logits), FERRY_OK);
    }
}

Test(mtp, greedy_identity)
{
    struct fx f;
    fx_open(&f);
    json_t *cases = json_object_get(f.golden, "cases");
    struct gen_stats mtp_st = {0}, orc_st = {0};
    for (size_t ci = 0; ci < json_array_size(cases); ci++) {
        json_t *c = json_array_get(cases, ci);
        if (json_integer_value(json_object_get(c, "offset")) != 0) continue;
        int32_t prompt[MAX_TOK], ref[64], plain[64], spec[64 + SPEC_MAX_DRAFT];
        const int np = ints(json_object_get(c, "prompt_tokens"), prompt, MAX_TOK);
        const int n = ints(json_object_get(c, "greedy_tokens"), ref, 64);
        gen_plain(&f, prompt, np, n, plain);
        if (json_real_value(json_object_get(c, "min_top2_margin")) > 1e-3)
            for (int i = 0; i < n; i++) cr_expect_eq(plain[i], ref[i], "prompt %d: token %d", np, i);
        for (int k = 1; k <= 4; k += 3) {
            gen_spec(&f, prompt, np, n, k, NULL, spec, &mtp_st);
            for (int i = 0; i < n; i++)
                cr_expect_eq(spec[i], plain[i], "prompt %d, %d MTP drafts: token %d is %d, without %d", np, k,
                             i, spec[i], plain[i]);
            gen_spec(&f, prompt, np, n, k + 1, plain, spec, &orc_st);
            for (int i = 0; i < n; i++)
                cr_expect_eq(spec[i], plain[i],
                             "prompt %d, %d partly right drafts: token %d is %d, without %d", np, k + 1, i,
                             spec[i], plain[i]);
        }
    }
    /* Partly right drafts: the first of each step's is accepted, the second never. */
    cr_expect(orc_st.accepted > 0 && orc_st.accepted < orc_st.drafted);
    cr_expect(mtp_st.drafted > 0 && mtp_st.accepted <= mtp_st.drafted);
    fprintf(stderr, "mtp acceptance on the random tiny model: %d of %d drafts (%.1f%%) in %d steps\n",
            mtp_st.accepted, mtp_st.drafted, 100.0 * mtp_st.accepted / mtp_st.drafted, mtp_st.steps);
    fx_close(&f);
}

/* After steps that rejected drafts, the target's state and the block's K/V are those of the plain sequence:
 * the block's next drafts are the torch reference's for that point; then a second request on the freed
 * slot gets its own reference. */
Test(mtp, rejected_drafts_leave_state_consistent)
{
    struct fx f;
    fx_open(&f);
    json_t *cases = json_object_get(f.golden, "cases");
    json_t *later = NULL, *other = NULL;
    for (size_t ci = 0; ci < json_array_size(cases); ci++) {
        json_t *c = json_array_get(cases, ci);
        const int off = (int)json_integer_value(json_object_get(c, "offset"));
        const int np = (int)json_array_size(json_object_get(c, "prompt_tokens"));
        if (np == 7 && off > 0) later = c;
        if (np == 20 && off == 0) other = c;
    }
    cr_assert(later && other, "the reference lacks its cases");
    int32_t prompt[MAX_TOK], ref[64], out[64 + SPEC_MAX_DRAFT];
    const int np = ints(json_object_get(later, "prompt_tokens"), prompt, MAX_TOK);
    ints(json_object_get(later, "greedy_tokens"), ref, 64);
    const int off = (int)json_integer_value(json_object_get(later, "offset"));
    struct gen_stats st = {0};
    /* off + 1 tokens with partly right drafts of 3: the last is pending, the slot holds np + off positions.
     */
    gen_spec(&f, prompt, np, off + 1, 3, ref, out, &st);
    cr_assert(st.drafted > st.accepted && st.accepted > 0, "the steps rejected no draft (%d of %d)",
              st.accepted, st.drafted);
    for (int i = 0; i <= off; i++) cr_assert_eq(out[i], ref[i]);
    cr_assert_eq(engine_seq_len(f.e, 0), np + off);
    cr_assert_eq(mtp_seq_len(f.m, 0), np + off);
    expect_drafts(&f, later, ref[off], "after rejected drafts");
    /* And the same drafts once more: a draft's positions are dropped by the keep. */
    expect_drafts(&f, later, ref[off], "drafting again");
    /* A second request on the freed slot. */
    engine_seq_free(f.e, 0);
    mtp_seq_free(f.m, 0);
    int32_t p2[MAX_TOK], r2[64];
    const int n2 = ints(json_object_get(other, "prompt_tokens"), p2, MAX_TOK);
    ints(json_object_get(other, "greedy_tokens"), r2, 64);
    prefill(&f, p2, n2);
    expect_drafts(&f, other, r2[0], "second request");
    fx_close(&f);
}

/* mtp_seq_resume (a prompt cache's prefix): the slot keeps the K/V of the first n positions and continues
 * with zeros for the hidden state at n - 1. Its drafts after feeding the rest equal those of a slot fed the
 * same rows through mtp_seq_feed alone with that hidden row zeroed (the K/V at n - 1 pairs its token with the
 * state at n - 2, which both have); resuming where the state is known changes nothing; a prefix longer than
 * the slot empties it. */
Test(mtp, resume_keeps_the_prefix)
{
    struct fx f;
    fx_open(&f);
    json_t *c = json_array_get(json_object_get(f.golden, "cases"), 2); /* the 20-token prompt */
    int32_t prompt[MAX_TOK], d1[8], d2[8];
    const int np = ints(json_object_get(c, "prompt_tokens"), prompt, MAX_TOK), m = 11;
    cr_assert(np == 20);
    float *h = malloc((size_t)np * f.dim * sizeof(float));
    prefill(&f, prompt, np); /* the model's hidden states of every row into f.hid */
    memcpy(h, f.hid, (size_t)np * f.dim * sizeof(float));
    int n1 = 0, n2 = 0;
    /* resumed at m: the slot held np positions */
    cr_assert_eq(mtp_seq_resume(f.m, 0, m), m);
    cr_assert_eq(mtp_seq_len(f.m, 0), m);
    cr_assert_eq(mtp_seq_feed(f.m, 0, m, prompt + m, np - m, h + (size_t)m * f.dim), FERRY_OK);
    cr_assert_eq(mtp_draft(f.m, 0, 7, 4, 0, d1, &n1, f.logits), FERRY_OK);
    /* the reference: fed alone, the hidden row at m - 1 zeroed */
    mtp_seq_free(f.m, 0);
    memset(h + (size_t)(m - 1) * f.dim, 0, (size_t)f.dim * sizeof(float));
    cr_assert_eq(mtp_seq_feed(f.m, 0, 0, prompt, m, h), FERRY_OK);
    memcpy(h + (size_t)(m - 1) * f.dim, f.hid + (size_t)(m - 1) * f.dim, (size_t)f.dim * sizeof(float));
    cr_assert_eq(mtp_seq_feed(f.m, 0, m, prompt + m, np - m, h + (size_t)m * f.dim), FERRY_OK);
    float *ref = malloc((size_t)4 * f.n_vocab * sizeof(float));
    cr_assert_eq(mtp_draft(f.m, 0, 7, 4, 0, d2, &n2, ref), FERRY_OK);
    cr_assert(n1 == 4 && n2 == 4);
    for (int i = 0; i < 4; i++) cr_expect_eq(d1[i], d2[i], "draft %d: %d, reference %d", i, d1[i], d2[i]);
    for (size_t i = 0; i < (size_t)4 * f.n_vocab; i++)
        cr_assert_float_eq(f.logits[i], ref[i], TOL, "logit %zu: %g, reference %g", i, f.logits[i], ref[i]);
    /* where the state is known, a resume is a keep: the drafts after it are the same */
    mtp_seq_keep(f.m, 0, np);
    cr_assert_eq(mtp_seq_resume(f.m, 0, np), np);
    cr_assert_eq(mtp_draft(f.m, 0, 7, 4, 0, d1, &n1, f.logits), FERRY_OK);
    for (int i = 0; i < 4; i++) cr_expect_eq(d1[i], d2[i]);
    /* a prefix the slot does not hold */
    mtp_seq_keep(f.m, 0, np);
    cr_assert_eq(mtp_seq_resume(f.m, 0, np + 1), 0);
    cr_assert_eq(mtp_seq_len(f.m, 0), 0);
    free(h);
    free(ref);
    fx_close(&f);
}

/* ---------------------------------------------------------------- malformed files */

/* The file's bytes with the ne[dim] of tensor `name` set to v. */
static void *with_ne(const char *path, const char *name, int dim, uint64_t v, size_t *size)
{
    FILE *fp = fopen(path, "rb");
    cr_assert(fp);
    fseek(fp, 0, SEEK_END);
    *size = (size_t)ftell(fp);
    fseek(fp, 0, SEEK_SET);
    unsigned char *buf = malloc(*size);
    cr_assert_eq(fread(buf, 1, *size, fp), *size);
    fclose(fp);
    /* Tensor infos: u64 name length, the name, u32 n_dims, u64 ne[n_dims], u32 type, u64 offset. */
    const size_t len = strlen(name);
    for (size_t i = 8; i + len + 12 < *size; i++) {
        uint64_t l;
        memcpy(&l, buf + i - 8, 8);
        if (l != len || memcmp(buf + i, name, len) != 0) continue;
        memcpy(buf + i + len + 4 + 8 * (size_t)dim, &v, 8);
        return buf;
    }
    cr_assert_fail("tensor %s not found in %s", name, path);
    return NULL;
}

static void expect_refused(const char *name, int dim, uint64_t v)
{
    char *path = qwen35_fixture_src("tests/golden/models/" NAME ".gguf");
    FILE *fp = fopen(path, "rb");
    if (!fp) cr_skip_test("missing FILE: %s (run tests/golden/make_qwen35_golden.py --mtp)", path);
    fclose(fp);
    size_t size;
    void *buf = with_ne(path, name, dim, v, &size);
    struct model_file *mf = NULL;
    char err[256] = "";
    cr_assert_eq(model_file_open_gguf_mem(buf, size, &mf, err), FERRY_OK, "the trunk still loads: %s", err);
    struct mtp *m = NULL;
    struct mtp_params mp = mtp_default_params();
    const int rc = mtp_init(&m, mf, &mp, err);
    cr_expect_eq(rc, FERRY_ERR_FORMAT, "%s", ferry_status_str(rc));
    cr_expect(strstr(err, name) != NULL, "the message names %s: %s", name, err);
    cr_expect_null(m);
    model_file_close(mf);
    free(buf);
    free(path);
}

Test(mtp, wrong_nextn_shape_refused)
{
    expect_refused("blk.4.nextn.eh_proj.weight", 0, 64);
    expect_refused("blk.4.nextn.hnorm.weight", 0, 63);
    expect_refused("blk.4.attn_k.weight", 1, 24);
}

Test(mtp, model_without_block)
{
    char *path = qwen35_fixture_src("tests/golden/models/qwen35_deltanet_f16.gguf");
    struct model_file *mf = NULL;
    char err[256] = "";
    FILE *fp = fopen(path, "rb");
    if (!fp) cr_skip_test("missing FILE: %s", path);
    fclose(fp);
    cr_assert_eq(model_file_open(path, &mf, NULL, NULL, err), FERRY_OK, "%s", err);
    cr_expect_not(mtp_available(mf));
    struct mtp *m = NULL;
    struct mtp_params mp = mtp_default_params();
    cr_expect_eq(mtp_init(&m, mf, &mp, err), FERRY_ERR_UNSUPPORTED);
    cr_expect(strstr(err, "multi-token-prediction") != NULL, "%s", err);
    model_file_close(mf);
    free(path);
}

/* The MoE families' goldens end with a block whose layer is a copy of the trunk's last (routed experts and
 * the shared expert) and random nextn tensors: it loads and drafts, each draft the argmax of its finite
 * logits. */
static void expect_moe_block_drafts(const char *name)
{
    char rel[128];
    snprintf(rel, sizeof rel, "tests/golden/models/%s.gguf", name);
    char *path = qwen35_fixture_src(rel);
    FILE *fp = fopen(path, "rb");
    if (!fp) cr_skip_test("missing FILE: %s", path);
    fclose(fp);
    struct model_file *mf = NULL;
    char err[256] = "";
    cr_assert_eq(model_file_open(path, &mf, NULL, NULL, err), FERRY_OK, "%s", err);
    cr_assert(mtp_available(mf), "%s", name);
    struct mtp *m = NULL;
    struct mtp_params mp = mtp_default_params();
    mp.ctx_size = 64;
    cr_assert_eq(mtp_init(&m, mf, &mp, err), FERRY_OK, "%s: %s", name, err);
    const int nv = mf->hp.n_vocab, dim = mf->hp.dim;
    float *hid = malloc((size_t)3 * dim * sizeof *hid), *lg = malloc((size_t)3 * nv * sizeof *lg);
    for (int i = 0; i < 3 * dim; i++) hid[i] = (float)((i * 37) % 19) / 9.0f - 1.0f;
    const int32_t toks[3] = {5, 77, 140};
    int32_t out[3];
    int n = 0;
    cr_assert_eq(mtp_seq_feed(m, 0, 0, toks, 3, hid), FERRY_OK);
    cr_assert_eq(mtp_draft(m, 0, 9, 3, 0, out, &n, lg), FERRY_OK);
    cr_assert_eq(n, 3);
    for (int i = 0; i < 3; i++) {
        for (int v = 0; v < nv; v++) cr_assert(isfinite(lg[(size_t)i * nv + v]));
        cr_expect_eq(out[i], qwen35_fixture_argmax(lg + (size_t)i * nv, nv));
    }
    cr_expect_eq(mtp_seq_len(m, 0), 6);
    free(hid);
    free(lg);
    mtp_free(m);
    model_file_close(mf);
    free(path);
}

Test(mtp, moe_families_load_their_block)
{
    expect_moe_block_drafts("qwen35moe_shexp_f16");
    expect_moe_block_drafts("qwen3next_f16");
}
