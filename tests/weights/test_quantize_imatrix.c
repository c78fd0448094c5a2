/* ferry quantize --imatrix against llama.cpp's llama-quantize --imatrix, byte for byte, and the
 * importance-matrix reader on broken files.
 *
 * fixtures/quantize_imatrix.json was written by make_quantize_imatrix_fixtures.py with llama.cpp lcp0336 (a
 * CPU build of llama-quantize given --imatrix). For two small random Llama models (a: dense, 10 layers,
 * ffn_down rows of 352 columns; c: 8 stacked experts) and sixteen types it holds the SHA-256 of the output
 * file made with a synthetic importance matrix in llama-imatrix's GGUF format, for two types with the same
 * matrix in the legacy .dat format, for IQ2_XS (which needs an entry for every matrix) with a complete one,
 * and for IQ3_S and IQ3_M also without an importance matrix. This test rebuilds the models (their SHA-256
 * must match the script's) and the matrix files with the script's generator, quantizes in the same directory
 * under the same file names (llama-quantize records the name it was given), and requires the same output
 * files: the weighted quantizers, the per-expert weights, the mixes' importance-matrix rules, the missing and
 * mismatched entries llama-quantize tolerates, and the quantize.imatrix.* metadata.
 */
#include <criterion/criterion.h>
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kernels/core/status.h"
#include "kernels/cpu/threadpool.h"
#include "qcheck.h"
#include "qgen.h"
#include "weights/gguf_write.h"
#include "weights/imatrix.h"
#include "weights/model_file.h"
#include "weights/quantize.h"
#include "wtest.h"

/* ---- the script's importance matrix -------------------------------------------------------------------- */

struct im_entry {
    char name[64];
    int64_t ne0, n_mat;
    float *sums, *counts; /* (n_mat, ne0), (n_mat) */
};

static int im_entries(const struct qgen_spec *s, struct im_entry *out, bool full)
{
    struct gen_tensor *t = malloc(sizeof *t * (size_t)(10 * s->n_layers + 4));
    const int n = gen_tensors(s, t);
    int k = 0;
    for (int i = 0; i < n; i++) {
        if (!t[i].rows || (!full && !strcmp(t[i].name, "blk.0.attn_k.weight"))) continue;
        struct im_entry *e = &out[k++];
        snprintf(e->name, sizeof e->name, "%s", t[i].name);
        e->ne0 = t[i].cols + (strcmp(t[i].name, "token_embd.weight") ? 0 : 5);
        e->n_mat = t[i].experts ? t[i].experts : 1;
        e->sums = malloc(sizeof(float) * (size_t)(e->ne0 * e->n_mat));
        e->counts = malloc(sizeof(float) * (size_t)e->n_mat);
        for (int64_t j = 0; j < e->n_mat; j++) {
            const double c = e->n_mat > 1 && j == 5 ? 0.0 : 7.0 + 3.0 * (double)j;
            e->counts[j] = (float)c;
            for (int64_t c0 = 0; c0 < e->ne0; c0++) {
                const int64_t el = j * e->ne0 + c0;
                const double u =
                    (double)(splitmix64((uint64_t)(i + 500) * (1ull << 40) + (uint64_t)el) >> 40) * 0x1p-24;
                e->sums[el] = (float)(c * (0.05 + u) * (c0 % 17 == 0 ? 21.0 : 1.0));
            }
        }
    }
    free(t);
    return k;
}

static void im_free(struct im_entry *e, int n)
{
    for (int i = 0; i < n; i++) free(e[i].sums), free(e[i].counts);
}

static void write_imatrix_gguf(const struct im_entry *e, int n, const char *path)
{
    char err[256] = "";
    struct gguf_writer *w;
    CHECK(gguf_writer_init(&w, err));
    const char *ds = "fixture.txt";
    const size_t dl = strlen(ds);
    CHECK(gguf_writer_kv_str(w, "general.type", "imatrix", 7, err));
    CHECK(gguf_writer_kv_arr_str(w, "imatrix.datasets", &ds, &dl, 1, err));
    CHECK(gguf_writer_kv_u32(w, "imatrix.chunk_count", 11, err));
    CHECK(gguf_writer_kv_u32(w, "imatrix.chunk_size", 512, err));
    for (int i = 0; i < n; i++) {
        char nm[96];
        const int64_t ne_s[2] = {e[i].ne0, e[i].n_mat}, ne_c[2] = {1, e[i].n_mat};
        snprintf(nm, sizeof nm, "%s.in_sum2", e[i].name);
        CHECK(gguf_writer_tensor(w, nm, DTYPE_F32, 2, ne_s, err));
        snprintf(nm, sizeof nm, "%s.counts", e[i].name);
        CHECK(gguf_writer_tensor(w, nm, DTYPE_F32, 2, ne_c, err));
    }
    CHECK(gguf_writer_open(w, path, err));
    for (int i = 0; i < n; i++) {
        CHECK(gguf_writer_data(w, e[i].sums, sizeof(float) * (size_t)(e[i].ne0 * e[i].n_mat), err));
        CHECK(gguf_writer_data(w, e[i].counts, sizeof(float) * (size_t)e[i].n_mat, err));
    }
    CHECK(gguf_writer_finish(w, err));
    gguf_writer_free(w);
}

static void put_i32(FILE *f, int32_t v)
{
    cr_assert_eq(fwrite(&v, 4, 1, f), 1u);
}

static void write_imatrix_dat(const struct im_entry *e, int n, const char *path)
{
    FILE *f = fopen(path, "wb");
    cr_assert_not_null(f);
    put_i32(f, n);
    for (int i = 0; i < n; i++) {
        put_i32(f, (int32_t)strlen(e[i].name));
        fwrite(e[i].name, 1, strlen(e[i].name), f);
        put_i32(f, 3);
        put_i32(f, (int32_t)(e[i].ne0 * e[i].n_mat));
        fwrite(e[i].sums, 4, (size_t)(e[i].ne0 * e[i].n_mat), f);
    }
    put_i32(f, 11);
    put_i32(f, 11);
    fwrite("fixture.txt", 1, 11, f);
    cr_assert_eq(fclose(f), 0);
}

/* ---- against llama-quantize ---------------------------------------------------------------------------- */

static void run_on_pool(void *pool, quant_task_fn task, void *ctx, int n_tasks)
{
    tpool_run(pool, task, ctx, n_tasks);
}

/* A fresh directory to work in: llama-quantize recorded the imatrix's name relative to its own. */
static void enter_tmpdir(char dir[4096])
{
    const char *tmp = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
    snprintf(dir, 4096, "%s/ferry-qimx-XXXXXX", tmp);
    cr_assert_not_null(mkdtemp(dir));
    cr_assert_eq(chdir(dir), 0);
}

static void quantize_all(struct model_file *mf, json_t *model, json_t *types, const char *key,
                         const char *im_name)
{
    char err[256] = "", hex[65];
    struct imatrix *im = NULL;
    if (im_name) CHECK(imatrix_load(im_name, &im, err));
    struct tpool *tp;
    cr_assert_eq(tpool_init(&tp, 2), 0);
    for (size_t ti = 0; ti < json_array_size(types); ti++) {
        const char *type = json_string_value(json_array_get(types, ti));
        json_t *want = json_object_get(json_object_get(model, key), type);
        cr_assert_not_null(want, "fixture has no %s output for %s", key, type);
        const struct quantize_params qp = {
            .ftype = quant_ftype_from_name(type), .runner = {run_on_pool, tp}, .imatrix = im};
        CHECK(quantize_model_file(mf, "out.gguf", &qp, err));
        file_sha("out.gguf", hex);
        if (strcmp(hex, json_string_value(json_object_get(want, "sha256"))) != 0)
            explain_mismatch("out.gguf", model, want, type);
        unlink("out.gguf");
    }
    tpool_free(tp);
    imatrix_free(im);
}

static void check_model(int mi)
{
    const struct qgen_spec *s = &qgen_specs[mi];
    char p[4096], dir[4096], hex[65], err[256] = "";
    json_error_t je;
    json_t *fx = json_load_file(wt_fixture(p, sizeof p, "quantize_imatrix.json"), 0, &je);
    cr_assert_not_null(fx, "cannot read %s: %s", p, je.text);
    json_t *model = json_object_get(json_object_get(fx, "models"), s->name);
    cr_assert_not_null(model, "fixture has no model %s", s->name);

    enter_tmpdir(dir);
    qgen_write(s, "model.gguf", hex);
    cr_assert_str_eq(hex, json_string_value(json_object_get(model, "input_sha256")),
                     "%s: the rebuilt input differs from the script's gguf-py file", s->name);
    struct im_entry *e = calloc((size_t)(10 * s->n_layers + 4), sizeof *e);
    int n = im_entries(s, e, false);
    write_imatrix_gguf(e, n, "imatrix.gguf");
    write_imatrix_dat(e, n, "imatrix.dat");
    im_free(e, n);
    n = im_entries(s, e, true);
    write_imatrix_gguf(e, n, "imatrix-full.gguf");
    im_free(e, n);
    free(e);

    struct model_file *mf;
    CHECK(model_file_open("model.gguf", &mf, NULL, NULL, err));
    quantize_all(mf, model, json_object_get(fx, "types"), "outputs", "imatrix.gguf");
    quantize_all(mf, model, json_object_get(fx, "legacy_types"), "legacy_outputs", "imatrix.dat");
    quantize_all(mf, model, json_object_get(fx, "full_types"), "full_outputs", "imatrix-full.gguf");
    quantize_all(mf, model, json_object_get(fx, "plain_types"), "plain_outputs", NULL);
    model_file_close(mf);
    unlink("model.gguf");
    unlink("imatrix.gguf");
    unlink("imatrix.dat");
    unlink("imatrix-full.gguf");
    cr_assert_eq(chdir("/"), 0);
    rmdir(dir);
    json_decref(fx);
}

Test(quantize_imatrix, model_a_f32, .timeout = 600)
{
    check_model(0);
}

Test(quantize_imatrix, model_c_8_experts, .timeout = 600)
{
    check_model(3);
}

/* ---- the reader ---------------------------------------------------------------------------------------- */

/* Normalization: sums / count per expert, 1 for an expert never counted; legacy values / ncall. */
Test(quantize_imatrix, reader_values)
{
    char dir[4096], err[256] = "";
    enter_tmpdir(dir);
    struct im_entry e[1] = {{.name = "blk.0.ffn_up_exps.weight", .ne0 = 3, .n_mat = 3}};
    float sums[9] = {1, 2, 3, 4, 5, 6, 7, 8, 9}, counts[3] = {2, 0, 3.4f};
    e[0].sums = sums, e[0].counts = counts;
    write_imatrix_gguf(e, 1, "m.gguf");
    struct imatrix *im;
    CHECK(imatrix_load("m.gguf", &im, err));
    const struct imatrix_entry *x = imatrix_find(im, "blk.0.ffn_up_exps.weight");
    cr_assert_not_null(x);
    cr_assert_eq(x->n, 9);
    const float want[9] = {0.5f, 1.0f, 1.5f, 1, 1, 1, 7.0f / 3, 8.0f / 3, 9.0f / 3}; /* 3.4 rounds to 3 */
    for (int i = 0; i < 9; i++) cr_assert_eq(x->w[i], want[i], "w[%d] = %g, want %g", i, x->w[i], want[i]);
    cr_assert_str_eq(im->dataset, "fixture.txt");
    cr_assert_eq(im->chunk_count, 11);
    cr_assert_null(imatrix_find(im, "blk.0.ffn_up_exps"));
    imatrix_free(im);

    write_imatrix_dat(e, 1, "m.dat");
    CHECK(imatrix_load("m.dat", &im, err));
    x = imatrix_find(im, "blk.0.ffn_up_exps.weight");
    cr_assert(im->legacy && x && x->n == 9);
    for (int i = 0; i < 9; i++) cr_assert_eq(x->w[i], sums[i] / 3.0f);
    imatrix_free(im);
    unlink("m.gguf");
    unlink("m.dat");
    cr_assert_eq(chdir("/"), 0);
    rmdir(dir);
}

/* Every prefix of a legacy file and of a GGUF one is refused or read without a fault (ASan holds the reads);
 * a non-finite value and a GGUF file without the imatrix keys are refused. */
Test(quantize_imatrix, reader_refuses_broken_files)
{
    char dir[4096], err[256] = "";
    enter_tmpdir(dir);
    struct im_entry e[2] = {{.name = "a.weight", .ne0 = 4, .n_mat = 1},
                            {.name = "b.weight", .ne0 = 2, .n_mat = 2}};
    float s0[4] = {1, 2, 3, 4}, c0[1] = {1}, s1[4] = {1, 2, 3, 4}, c1[2] = {1, 2};
    e[0].sums = s0, e[0].counts = c0, e[1].sums = s1, e[1].counts = c1;
    const char *names[2] = {"m.dat", "m.gguf"};
    write_imatrix_dat(e, 2, names[0]);
    write_imatrix_gguf(e, 2, names[1]);
    for (int k = 0; k < 2; k++) {
        FILE *f = fopen(names[k], "rb");
        cr_assert_not_null(f);
        static uint8_t buf[1 << 16];
        const size_t len = fread(buf, 1, sizeof buf, f);
        fclose(f);
        for (size_t cut = 0; cut < len; cut++) {
            f = fopen("cut", "wb");
            fwrite(buf, 1, cut, f);
            fclose(f);
            struct imatrix *im = NULL;
            const int rc = imatrix_load("cut", &im, err);
            /* The legacy trailer is optional, and so is a GGUF file's padding after its last tensor: a file
             * cut there still holds both entries. */
            if (rc == FERRY_OK) {
                cr_assert(im->n_entries == 2 && (k == 0 || cut + 32 > len), "%s cut at %zu read", names[k],
                          cut);
                imatrix_free(im);
            } else {
                cr_assert_null(im);
            }
        }
    }
    s0[2] = NAN;
    write_imatrix_gguf(e, 2, "nan.gguf");
    struct imatrix *im = NULL;
    cr_assert_eq(imatrix_load("nan.gguf", &im, err), FERRY_ERR_FORMAT);
    cr_assert(strstr(err, "a.weight"), "%s", err);
    cr_assert_eq(imatrix_load("model-without-keys.gguf", &im, err), FERRY_ERR_IO);
    /* A GGUF file that is not an importance matrix (no imatrix.* keys). */
    struct gguf_writer *w;
    CHECK(gguf_writer_init(&w, err));
    CHECK(gguf_writer_kv_str(w, "general.type", "model", 5, err));
    const int64_t ne[1] = {4};
    CHECK(gguf_writer_tensor(w, "a.weight.in_sum2", DTYPE_F32, 1, ne, err));
    CHECK(gguf_writer_open(w, "plain.gguf", err));
    CHECK(gguf_writer_data(w, s1, sizeof s1, err));
    CHECK(gguf_writer_finish(w, err));
    gguf_writer_free(w);
    cr_assert_eq(imatrix_load("plain.gguf", &im, err), FERRY_ERR_FORMAT);
    cr_assert(strstr(err, "metadata"), "%s", err);
    unlink("m.dat"), unlink("m.gguf"), unlink("cut"), unlink("nan.gguf"), unlink("plain.gguf");
    cr_assert_eq(chdir("/"), 0);
    rmdir(dir);
}

/* An entry whose length is not the tensor's columns (times experts) stops the quantization, naming the
 * tensor, as llama-quantize does. */
Test(quantize_imatrix, mismatched_entry_is_refused, .timeout = 120)
{
    char dir[4096], hex[65], err[256] = "";
    enter_tmpdir(dir);
    qgen_write(&qgen_specs[0], "model.gguf", hex);
    float s[255], c[1] = {1};
    for (int i = 0; i < 255; i++) s[i] = 1;
    struct im_entry e[1] = {{.name = "blk.3.attn_q.weight", .ne0 = 255, .n_mat = 1, .sums = s, .counts = c}};
    write_imatrix_gguf(e, 1, "imatrix.gguf");
    struct imatrix *im;
    CHECK(imatrix_load("imatrix.gguf", &im, err));
    struct model_file *mf;
    CHECK(model_file_open("model.gguf", &mf, NULL, NULL, err));
    const struct quantize_params qp = {.ftype = QUANT_FTYPE_Q4_K_M, .imatrix = im};
    cr_assert_eq(quantize_model_file(mf, "out.gguf", &qp, err), FERRY_ERR_FORMAT);
    cr_assert(strstr(err, "blk.3.attn_q.weight") && strstr(err, "255"), "%s", err);
    cr_assert_neq(access("out.gguf", F_OK), 0, "a refused quantization leaves no output");
    model_file_close(mf);
    imatrix_free(im);
    unlink("model.gguf"), unlink("imatrix.gguf");
    cr_assert_eq(chdir("/"), 0);
    rmdir(dir);
}

/* The types llama-quantize writes only with weights: refused without an importance matrix, and when a matrix
 * that gets such a type has no entry; the output head and the token embedding need none. */
Test(quantize_imatrix, low_bit_types_need_weights, .timeout = 120)
{
    char dir[4096], hex[65], err[256] = "";
    enter_tmpdir(dir);
    qgen_write(&qgen_specs[0], "model.gguf", hex);
    struct model_file *mf;
    CHECK(model_file_open("model.gguf", &mf, NULL, NULL, err));
    static const int ftypes[] = {QUANT_FTYPE_IQ2_XS, QUANT_FTYPE_IQ2_XXS, QUANT_FTYPE_IQ3_XS,
                                 QUANT_FTYPE_Q2_K_S};
    for (size_t i = 0; i < sizeof ftypes / sizeof ftypes[0]; i++) {
        const struct quantize_params qp = {.ftype = ftypes[i]};
        cr_assert_eq(quantize_model_file(mf, "out.gguf", &qp, err), FERRY_ERR_INVALID, "%d", ftypes[i]);
        cr_assert(strstr(err, "importance matrix"), "%s", err);
    }
    /* With an entry for every matrix but blk.0.attn_k (an IQ2_XS tensor in this mix). */
    struct im_entry *e = calloc(110, sizeof *e);
    const int n = im_entries(&qgen_specs[0], e, false);
    write_imatrix_gguf(e, n, "imatrix.gguf");
    im_free(e, n);
    free(e);
    struct imatrix *im;
    CHECK(imatrix_load("imatrix.gguf", &im, err));
    const struct quantize_params qp = {.ftype = QUANT_FTYPE_IQ2_XS, .imatrix = im};
    cr_assert_eq(quantize_model_file(mf, "out.gguf", &qp, err), FERRY_ERR_INVALID);
    cr_assert(strstr(err, "blk.0.attn_k.weight"), "%s", err);
    cr_assert_neq(access("out.gguf", F_OK), 0, "a refused quantization leaves no output");
    imatrix_free(im);
    model_file_close(mf);
    unlink("model.gguf"), unlink("imatrix.gguf");
    cr_assert_eq(chdir("/"), 0);
    rmdir(dir);
}

/* The fixtures' K and i-quant rows hold one super-block; the weighted quantizers work super-block by
 * super-block (their sigma2 and weights are per super-block), so a row of three must quantize to the three
 * single-block rows with the matching slices of the weights: this holds the weight offsets of longer rows.
 * Random data and weights, 5 rows of 768 through quant_matrix_w on the caller's thread. */
Test(quantize_imatrix, weighted_rows_are_per_super_block)
{
    enum { ROWS = 5, COLS = 768 };
    static const enum dtype types[] = {DTYPE_Q2_K,   DTYPE_Q3_K,    DTYPE_Q4_K,  DTYPE_Q5_K,    DTYPE_Q6_K,
                                       DTYPE_IQ4_XS, DTYPE_IQ4_NL,  DTYPE_IQ3_S, DTYPE_IQ3_XXS, DTYPE_IQ2_S,
                                       DTYPE_IQ2_XS, DTYPE_IQ2_XXS, DTYPE_IQ1_S, DTYPE_IQ1_M};
    float *x = malloc(sizeof(float) * ROWS * COLS), *qw = malloc(sizeof(float) * COLS);
    for (int i = 0; i < ROWS * COLS; i++) x[i] = (float)base_value(7, i) * (i % 97 == 0 ? 9.0f : 1.0f);
    for (int i = 0; i < COLS; i++) qw[i] = (float)(0.05 + 0.25 * (base_value(8, i) + 2.0));
    for (size_t t = 0; t < sizeof types / sizeof types[0]; t++) {
        const size_t row = dtype_row_size(types[t], COLS), blk = dtype_row_size(types[t], 256);
        uint8_t *whole = malloc(row * ROWS), *part = malloc(blk);
        const struct quant_weights w = {.w = qw, .rows_per_set = ROWS, .row0 = 0};
        cr_assert(quant_matrix_w(types[t], whole, DTYPE_F32, x, ROWS, COLS, NULL, NULL, &w), "%s",
                  dtype_name(types[t]));
        for (int r = 0; r < ROWS; r++)
            for (int s = 0; s < COLS / 256; s++) {
                cr_assert(dtype_from_f32_w(types[t], x + r * COLS + 256 * s, part, 256, qw + 256 * s));
                cr_assert(!memcmp(part, whole + row * r + blk * s, blk), "%s: row %d super-block %d differs",
                          dtype_name(types[t]), r, s);
            }
        free(whole);
        free(part);
    }
    free(x);
    free(qw);
}
