/* model_file, safetensors and hf_config tests: GGUF and HF fixtures against expected.json (hyperparameters,
 * GGUF names, reversed HF shapes, bytes), stories260K's README facts, and the errors for broken models and
 * hostile safetensors headers. */
#include <criterion/criterion.h>
#include <math.h>
#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kernels/core/status.h"
#include "weights/hf_config.h"
#include "weights/model_file.h"
#include "weights/safetensors.h"
#include "wtest.h"

struct prog {
    int calls;
    uint64_t last_done, last_total;
};
static void on_progress(uint64_t done, uint64_t total, void *user)
{
    struct prog *p = user;
    cr_assert(done <= total, "progress %llu of %llu", (unsigned long long)done, (unsigned long long)total);
    cr_assert(done >= p->last_done, "progress went backwards");
    p->calls++;
    p->last_done = done;
    p->last_total = total;
}

static void check_hp(const struct model_file *mf, json_t *hp)
{
    const struct llm_hparams *h = &mf->hp;
#define GETI(k) ((int)json_integer_value(json_object_get(hp, k)))
#define GETF(k) ((float)json_number_value(json_object_get(hp, k)))
    cr_assert_eq(h->dim, GETI("dim"));
    cr_assert_eq(h->ffn_dim, GETI("ffn"));
    cr_assert_eq(h->n_layers, GETI("layers"));
    cr_assert_eq(h->n_heads, GETI("heads"));
    cr_assert_eq(h->n_kv_heads, GETI("kv_heads"));
    cr_assert_eq(h->head_dim, GETI("head_dim"));
    cr_assert_eq(h->rope_dim, GETI("rope_dim"));
    cr_assert_eq(h->ctx_train, GETI("ctx"));
    cr_assert_eq(h->n_vocab, GETI("vocab"));
    cr_assert_eq(h->tied_embeddings, GETI("tied"));
    cr_assert_eq(h->qkv_bias, GETI("qkv_bias"));
    cr_assert_float_eq(h->norm_eps, GETF("eps"), 1e-12);
    cr_assert_float_eq(h->rope_theta, GETF("theta"), 1e-3);
#undef GETI
#undef GETF
}

/* Every expected tensor is present under its GGUF name with the expected type, ne and bytes. */
static void check_tensors(const struct model_file *mf, json_t *tensors)
{
    for (size_t i = 0; i < json_array_size(tensors); i++) {
        json_t *e = json_array_get(tensors, i);
        const char *name = json_string_value(json_object_get(e, "name"));
        const struct wtensor *t = model_file_tensor(mf, name);
        cr_assert(t != NULL, "tensor %s missing", name);
        wt_check_tensor(e, name, (int)t->type, t->ne, t->n_dims, t->data, t->nbytes);
    }
}

static struct model_file *open_ok(const char *path, struct prog *pr)
{
    char err[256];
    struct model_file *mf = NULL;
    int rc = model_file_open(path, &mf, pr ? on_progress : NULL, pr, err);
    cr_assert_eq(rc, FERRY_OK, "%s: %s", path, err);
    cr_assert_eq(model_file_validate(mf, err), FERRY_OK, "%s", err);
    return mf;
}

/* ---------------------------------------------------------------- GGUF models */

Test(model_file, stories260K_hparams)
{
    char p[4096];
    if (!wt_testdata(p, sizeof p, "models/stories260K.gguf")) cr_skip_test("missing FILE: %s", p);
    struct prog pr = {0};
    struct model_file *mf = open_ok(p, &pr);
    const struct llm_hparams *h = &mf->hp;
    cr_assert_eq(mf->format, MODEL_FORMAT_GGUF);
    cr_assert_str_eq(h->arch, "llama");
    cr_assert_eq(h->dim, 64);
    cr_assert_eq(h->ffn_dim, 172);
    cr_assert_eq(h->n_layers, 5);
    cr_assert_eq(h->n_heads, 8);
    cr_assert_eq(h->n_kv_heads, 4);
    cr_assert_eq(h->head_dim, 8);
    cr_assert_eq(h->rope_dim, 8);
    cr_assert_float_eq(h->norm_eps, 1e-5f, 1e-12);
    cr_assert_float_eq(h->rope_theta, 10000.0f, 0);
    cr_assert_eq(h->n_vocab, 512);
    cr_assert_eq(h->ctx_train, 2048);
    cr_assert_eq(h->tied_embeddings, 0);
    cr_assert_eq(h->qkv_bias, 0);
    cr_assert_eq(h->rope_style, ROPE_STYLE_INTERLEAVED);
    cr_assert_eq(h->rope_scaling.type, ROPE_SCALING_NONE);
    cr_assert_eq(mf->n_tensors, 48);
    cr_assert_null(mf->chat_template);
    cr_assert_null(mf->dir);
    cr_assert_not_null(mf->gguf);
    cr_assert_eq(mf->file_bytes, 1185376u);
    const struct wtensor *t = model_file_tensor(mf, "blk.4.ffn_down.weight");
    cr_assert_not_null(t);
    cr_assert(t->ne[0] == 172 && t->ne[1] == 64 && t->type == DTYPE_F32 && t->nbytes == 172 * 64 * 4);
    cr_assert_null(model_file_tensor(mf, "blk.5.ffn_down.weight"));
    cr_assert_gt(pr.calls, 0);
    cr_assert_eq(pr.last_done, pr.last_total);
    json_t *exp = wt_expected();
    json_t *st = json_object_get(exp, "stories260K.gguf");
    if (st) check_tensors(mf, json_object_get(st, "tensors"));
    json_decref(exp);
    model_file_close(mf);
}

Test(model_file, gguf_v2_llama_q8_tied_rope_freqs)
{
    char p[4096];
    struct model_file *mf = open_ok(wt_fixture(p, sizeof p, "v2_llama.gguf"), NULL);
    json_t *exp = wt_expected(), *e = json_object_get(exp, "v2_llama.gguf");
    check_hp(mf, json_object_get(e, "hp"));
    check_tensors(mf, json_object_get(e, "tensors"));
    cr_assert_eq(mf->hp.rope_style, ROPE_STYLE_INTERLEAVED);
    cr_assert_eq(mf->hp.rope_scaling.type, ROPE_SCALING_NONE, "llama3 scaling is baked into rope_freqs");
    const struct wtensor *rf = model_file_tensor(mf, "rope_freqs.weight");
    cr_assert(rf && rf->ne[0] == 4 && rf->type == DTYPE_F32);
    cr_assert_null(model_file_tensor(mf, "output.weight"));
    cr_assert_eq(model_file_tensor(mf, "blk.0.attn_q.weight")->type, DTYPE_Q8_0);
    cr_assert_str_eq(mf->chat_template,
                     json_string_value(json_object_get(json_object_get(e, "hp"), "chat_template")));
    json_decref(exp);
    model_file_close(mf);
}

Test(model_file, gguf_from_memory)
{
    char p[4096], err[256];
    FILE *f = fopen(wt_fixture(p, sizeof p, "qwen2.gguf"), "rb");
    cr_assert_not_null(f);
    static uint8_t buf[1 << 16];
    size_t n = fread(buf, 1, sizeof buf, f);
    fclose(f);
    struct model_file *mf;
    cr_assert_eq(model_file_open_gguf_mem(buf, n, &mf, err), FERRY_OK, "%s", err);
    cr_assert_eq(mf->hp.head_dim, 6);
    cr_assert_eq((const uint8_t *)model_file_tensor(mf, "output_norm.weight")->data > buf, 1);
    model_file_close(mf);
    cr_assert_eq(model_file_open_gguf_mem(buf, n / 2, &mf, err), FERRY_ERR_FORMAT);
    cr_assert_null(mf);
}

Test(model_file, gguf_qwen2_biases_half_rope)
{
    char p[4096];
    struct model_file *mf = open_ok(wt_fixture(p, sizeof p, "qwen2.gguf"), NULL);
    json_t *exp = wt_expected(), *e = json_object_get(exp, "qwen2.gguf");
    check_hp(mf, json_object_get(e, "hp"));
    check_tensors(mf, json_object_get(e, "tensors"));
    cr_assert_str_eq(mf->hp.arch, "qwen2");
    cr_assert_eq(mf->hp.rope_style, ROPE_STYLE_HALF);
    cr_assert_not_null(model_file_tensor(mf, "blk.0.attn_v.bias"));
    json_decref(exp);
    model_file_close(mf);
}

/* ---------------------------------------------------------------- HF models */

Test(model_file, hf_llama_sharded_f16_llama3_tied)
{
    char p[4096];
    struct prog pr = {0};
    struct model_file *mf = open_ok(wt_fixture(p, sizeof p, "hf_llama"), &pr);
    json_t *exp = wt_expected(), *e = json_object_get(exp, "hf_llama");
    cr_assert_eq(mf->format, MODEL_FORMAT_HF);
    cr_assert_str_eq(mf->dir, p);
    cr_assert_null(mf->gguf);
    check_hp(mf, json_object_get(e, "hp"));
    json_t *tensors = json_object_get(e, "tensors");
    check_tensors(mf, tensors);
    cr_assert_eq((size_t)mf->n_tensors, json_array_size(tensors), "rotary_emb.inv_freq must be dropped");
    cr_assert_str_eq(mf->hp.arch, "llama");
    cr_assert_eq(mf->hp.rope_style, ROPE_STYLE_HALF);
    const struct rope_scaling *rs = &mf->hp.rope_scaling;
    cr_assert_eq(rs->type, ROPE_SCALING_LLAMA3);
    cr_assert_float_eq(rs->factor, 8.0f, 0);
    cr_assert_float_eq(rs->low_freq_factor, 1.0f, 0);
    cr_assert_float_eq(rs->high_freq_factor, 4.0f, 0);
    cr_assert_eq(rs->orig_ctx, 64);
    /* HF q_proj is [out=16, in=16]; k_proj [out=8, in=16] -> ne {16, 8}. */
    const struct wtensor *k = model_file_tensor(mf, "blk.1.attn_k.weight");
    cr_assert(k && k->ne[0] == 16 && k->ne[1] == 8 && k->type == DTYPE_F16);
    cr_assert_str_eq(mf->chat_template, json_string_value(json_object_get(e, "chat_template")));
    cr_assert_gt(pr.calls, 0);
    cr_assert_eq(pr.last_done, pr.last_total);
    cr_assert_eq(pr.last_total, mf->file_bytes);
    json_decref(exp);
    model_file_close(mf);
}

Test(model_file, hf_qwen2_bf16_biases)
{
    char p[4096];
    struct model_file *mf = open_ok(wt_fixture(p, sizeof p, "hf_qwen2"), NULL);
    json_t *exp = wt_expected(), *e = json_object_get(exp, "hf_qwen2");
    check_hp(mf, json_object_get(e, "hp"));
    check_tensors(mf, json_object_get(e, "tensors"));
    cr_assert_str_eq(mf->hp.arch, "qwen2");
    cr_assert_eq(mf->hp.rope_scaling.type, ROPE_SCALING_NONE);
    cr_assert_eq(model_file_tensor(mf, "output.weight")->type, DTYPE_BF16);
    cr_assert_eq(model_file_tensor(mf, "blk.0.attn_q.bias")->ne[0], 12);
    cr_assert_str_eq(mf->chat_template, json_string_value(json_object_get(e, "chat_template")));
    json_decref(exp);
    model_file_close(mf);
}

/* ---------------------------------------------------------------- broken models */

/* Copies a fixture directory into a fresh temporary one; returns its path (static buffer). */
static const char *copy_dir(const char *fixture)
{
    static char tmp[256];
    snprintf(tmp, sizeof tmp, "/tmp/ferry_wt_XXXXXX");
    cr_assert_not_null(mkdtemp(tmp));
    char src[4096];
    wt_fixture(src, sizeof src, fixture);
    DIR *d = opendir(src);
    cr_assert_not_null(d);
    struct dirent *de;
    while ((de = readdir(d))) {
        if (de->d_name[0] == '.') continue;
        char a[4600], b[4600];
        snprintf(a, sizeof a, "%s/%s", src, de->d_name);
        snprintf(b, sizeof b, "%s/%s", tmp, de->d_name);
        FILE *fi = fopen(a, "rb"), *fo = fopen(b, "wb");
        cr_assert(fi && fo);
        char buf[8192];
        size_t n;
        while ((n = fread(buf, 1, sizeof buf, fi)) > 0) cr_assert_eq(fwrite(buf, 1, n, fo), n);
        fclose(fi);
        fclose(fo);
    }
    closedir(d);
    return tmp;
}

static void rm_dir(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *de;
    while ((de = readdir(d))) {
        if (de->d_name[0] == '.') continue;
        char a[4600];
        snprintf(a, sizeof a, "%s/%s", dir, de->d_name);
        unlink(a);
    }
    closedir(d);
    rmdir(dir);
}

static void write_file(const char *dir, const char *name, const char *text)
{
    char p[4600];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    FILE *f = fopen(p, "wb");
    cr_assert_not_null(f);
    fputs(text, f);
    fclose(f);
}

/* Edits config.json: sets key to a raw JSON value (or deletes it when value is NULL). */
static void edit_config(const char *dir, const char *key, const char *value)
{
    char p[4600];
    snprintf(p, sizeof p, "%s/config.json", dir);
    json_error_t je;
    json_t *c = json_load_file(p, 0, &je);
    cr_assert_not_null(c);
    if (value)
        json_object_set_new(c, key, json_loads(value, JSON_DECODE_ANY, &je));
    else
        json_object_del(c, key);
    cr_assert_eq(json_dump_file(c, p, 0), 0);
    json_decref(c);
}

static void expect_open_fail(const char *path, int want_rc, const char *want_msg)
{
    char err[256] = "";
    struct model_file *mf = NULL;
    int rc = model_file_open(path, &mf, NULL, NULL, err);
    cr_expect_eq(rc, want_rc, "want %d got %d: %s", want_rc, rc, err);
    cr_expect_null(mf);
    cr_expect(strstr(err, want_msg) != NULL, "message '%s' lacks '%s'", err, want_msg);
}

Test(model_file, hf_errors)
{
    const char *d = copy_dir("hf_llama");
    edit_config(d, "architectures", "[\"GPT2LMHeadModel\"]");
    expect_open_fail(d, FERRY_ERR_UNSUPPORTED, "architecture 'GPT2LMHeadModel'");
    rm_dir(d);

    d = copy_dir("hf_llama");
    edit_config(d, "hidden_size", "20");
    edit_config(d, "head_dim", "4");
    expect_open_fail(d, FERRY_ERR_FORMAT,
                     "tensor 'token_embd.weight' has shape [16, 40, 1, 1], expected [20, 40]");
    rm_dir(d);

    d = copy_dir("hf_llama");
    edit_config(d, "intermediate_size", "25");
    expect_open_fail(d, FERRY_ERR_FORMAT, "tensor 'blk.0.ffn_gate.weight'");
    rm_dir(d);

    d = copy_dir("hf_llama");
    edit_config(d, "tie_word_embeddings", "false");
    expect_open_fail(d, FERRY_ERR_FORMAT, "lm_head.weight");
    rm_dir(d);

    d = copy_dir("hf_llama");
    edit_config(d, "num_hidden_layers", "3");
    expect_open_fail(d, FERRY_ERR_FORMAT, "missing tensor 'blk.2.attn_norm.weight' (llama family)");
    rm_dir(d);

    d = copy_dir("hf_llama");
    edit_config(d, "rope_scaling", "{\"rope_type\": \"dynamic\", \"factor\": 4.0}");
    expect_open_fail(d, FERRY_ERR_UNSUPPORTED, "rope_scaling type 'dynamic'");
    edit_config(d, "rope_scaling", "{\"rope_type\": \"yarn\", \"factor\": 4.0}");
    expect_open_fail(d, FERRY_ERR_FORMAT, "rope_scaling: missing key 'original_max_position_embeddings'");
    rm_dir(d);

    d = copy_dir("hf_llama");
    edit_config(d, "hidden_size", NULL);
    expect_open_fail(d, FERRY_ERR_FORMAT, "missing key 'hidden_size'");
    rm_dir(d);

    d = copy_dir("hf_llama");
    edit_config(d, "num_attention_heads", "-4");
    expect_open_fail(d, FERRY_ERR_FORMAT, "num_attention_heads");
    rm_dir(d);

    d = copy_dir("hf_llama");
    write_file(d, "model.safetensors.index.json",
               "{\"weight_map\": {\"model.norm.weight\": \"../../etc/passwd\"}}");
    expect_open_fail(d, FERRY_ERR_FORMAT, "not a plain file name");
    rm_dir(d);

    d = copy_dir("hf_llama");
    write_file(d, "model.safetensors.index.json",
               "{\"weight_map\": {\"model.norm.weight\": \"model-00001-of-00003.safetensors\"}}");
    expect_open_fail(d, FERRY_ERR_FORMAT, "index lists tensor 'model.norm.weight'");
    rm_dir(d);

    d = copy_dir("hf_llama");
    write_file(d, "model.safetensors.index.json",
               "{\"weight_map\": {\"model.norm.weight\": \"gone.safetensors\"}}");
    expect_open_fail(d, FERRY_ERR_NOT_FOUND, "gone.safetensors");
    rm_dir(d);

    d = copy_dir("hf_qwen2");
    char p[4600];
    snprintf(p, sizeof p, "%s/model.safetensors", d);
    cr_assert_eq(truncate(p, 3000), 0);
    expect_open_fail(d, FERRY_ERR_FORMAT, "model.safetensors: tensor");
    rm_dir(d);

    d = copy_dir("hf_qwen2");
    snprintf(p, sizeof p, "%s/model.safetensors", d);
    unlink(p);
    expect_open_fail(d, FERRY_ERR_NOT_FOUND, "no model.safetensors");
    rm_dir(d);

    d = copy_dir("hf_qwen2");
    write_file(d, "config.json", "{\"architectures\": [\"Qwen2ForCausalLM\"], ");
    expect_open_fail(d, FERRY_ERR_FORMAT, "config.json");
    rm_dir(d);
}

/* Rewrites `from` to `to` (same length) everywhere in a copy of a fixture file. */
static const char *patched_copy(const char *fixture, const char *from, const char *to, size_t fl,
                                long truncate_at)
{
    static char tmp[64];
    char src[4096];
    snprintf(tmp, sizeof tmp, "/tmp/ferry_wt_XXXXXX");
    int fd = mkstemp(tmp);
    cr_assert(fd >= 0);
    FILE *f = fopen(wt_fixture(src, sizeof src, fixture), "rb");
    cr_assert_not_null(f);
    static uint8_t buf[1 << 16];
    size_t n = fread(buf, 1, sizeof buf, f);
    fclose(f);
    for (size_t i = 0; from && i + fl <= n; i++)
        if (memcmp(buf + i, from, fl) == 0) memcpy(buf + i, to, fl);
    if (truncate_at >= 0 && (size_t)truncate_at < n) n = (size_t)truncate_at;
    cr_assert_eq(write(fd, buf, n), (ssize_t)n);
    close(fd);
    return tmp;
}

Test(model_file, gguf_errors)
{
    const char *p =
        patched_copy("v2_llama.gguf", "\x05\0\0\0\0\0\0\0llama", "\x05\0\0\0\0\0\0\0gemma", 13, -1);
    /* The message names the architecture and lists the supported ones. */
    expect_open_fail(p, FERRY_ERR_UNSUPPORTED,
                     "architecture 'gemma' is not supported (llama, mistral, qwen2");
    unlink(p);
    p = patched_copy("v2_llama.gguf", "blk.0.ffn_up.weight", "blk.0.ffn_xx.weight", 19, -1);
    expect_open_fail(p, FERRY_ERR_FORMAT, "missing tensor 'blk.0.ffn_up.weight' (llama family)");
    unlink(p);
    p = patched_copy("v2_llama.gguf", "llama.block_count", "llama.block_kount", 17, -1);
    expect_open_fail(p, FERRY_ERR_FORMAT, "missing key 'llama.block_count'");
    unlink(p);
    p = patched_copy("v2_llama.gguf", NULL, NULL, 0, 1000);
    expect_open_fail(p, FERRY_ERR_FORMAT, "ferry_wt_");
    unlink(p);
    p = patched_copy("hf_llama/config.json", NULL, NULL, 0, -1);
    expect_open_fail(p, FERRY_ERR_FORMAT, "bad magic at offset 0");
    unlink(p);
    expect_open_fail("/nonexistent/model.gguf", FERRY_ERR_NOT_FOUND, "/nonexistent/model.gguf");
}

/* ---------------------------------------------------------------- safetensors headers */

static int st_try(const char *header, const void *data, size_t data_len, char err[256])
{
    struct wt_buf b = {0};
    wt_u64(&b, strlen(header));
    wt_put(&b, header, strlen(header));
    if (data_len) wt_put(&b, data, data_len);
    uint8_t *exact = malloc(b.n);
    memcpy(exact, b.p, b.n);
    struct safetensors *st = NULL;
    int rc = safetensors_open_mem(exact, b.n, &st, err);
    if (rc == FERRY_OK) safetensors_close(st);
    free(exact);
    free(b.p);
    return rc;
}

static void st_expect(const char *header, size_t data_len, int want_rc, const char *want_msg)
{
    static uint8_t zeros[256];
    char err[256] = "";
    int rc = st_try(header, zeros, data_len, err);
    cr_expect_eq(rc, want_rc, "header %s: want %d got %d: %s", header, want_rc, rc, err);
    if (want_msg) cr_expect(strstr(err, want_msg) != NULL, "message '%s' lacks '%s'", err, want_msg);
}

Test(safetensors, valid_minimal_with_metadata)
{
    float data[6] = {1, 2, 3, 4, 5, 6};
    const char *h =
        "{\"__metadata__\":{\"format\":\"pt\"},\"b\":{\"dtype\":\"F16\",\"shape\":[2],"
        "\"data_offsets\":[16,20]},\"a\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[0,16]},"
        "\"i\":{\"dtype\":\"I64\",\"shape\":[3,0],\"data_offsets\":[16,16]}}  ";
    struct wt_buf b = {0};
    wt_u64(&b, strlen(h));
    wt_put(&b, h, strlen(h));
    wt_put(&b, data, sizeof data);
    struct safetensors *st;
    char err[256];
    cr_assert_eq(safetensors_open_mem(b.p, b.n, &st, err), FERRY_OK, "%s", err);
    cr_assert_eq(safetensors_n_tensors(st), 3);
    const struct st_tensor *a = safetensors_find(st, "a");
    cr_assert(a && a->dtype == DTYPE_F32 && a->n_dims == 2 && a->shape[0] == 2 && a->nbytes == 16);
    cr_assert_eq(wt_elem(0, a->data, 3), 4.0f);
    const struct st_tensor *i = safetensors_find(st, "i");
    cr_assert(i && i->dtype == -1 && i->n_dims == 2 && i->shape[1] == 0 && i->nbytes == 0);
    cr_assert_str_eq(i->dtype_str, "I64");
    cr_assert_str_eq(safetensors_metadata(st, "format"), "pt");
    cr_assert_null(safetensors_metadata(st, "nope"));
    cr_assert_null(safetensors_find(st, "__metadata__"));
    safetensors_close(st);
    free(b.p);
}

Test(safetensors, hostile_headers)
{
    char err[256];
    struct safetensors *st;
    cr_expect_eq(safetensors_open_mem("\x01\x02", 2, &st, err), FERRY_ERR_FORMAT);
    uint8_t big[16] = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f, '{', '}'};
    cr_expect_eq(safetensors_open_mem(big, sizeof big, &st, err), FERRY_ERR_FORMAT);
    cr_expect(strstr(err, "exceeds") != NULL, "%s", err);
    uint8_t lie[16] = {100, 0, 0, 0, 0, 0, 0, 0, '{', '}'};
    cr_expect_eq(safetensors_open_mem(lie, sizeof lie, &st, err), FERRY_ERR_FORMAT);
    cr_expect(strstr(err, "truncated") != NULL, "%s", err);

    st_expect("[1,2]", 0, FERRY_ERR_FORMAT, "not a JSON object");
    st_expect("{\"a\":", 0, FERRY_ERR_FORMAT, "header JSON at offset");
    st_expect("{\"a\":1}", 0, FERRY_ERR_FORMAT, "tensor 'a'");
    st_expect("{\"a\":{\"dtype\":\"F99\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4, FERRY_ERR_UNSUPPORTED,
              "unknown dtype 'F99'");
    st_expect("{\"a\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]}}", 4, FERRY_ERR_FORMAT,
              "shape[0]");
    st_expect("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,8]}}", 4, FERRY_ERR_FORMAT,
              "outside the 4-byte data section");
    st_expect("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,4]}}", 8, FERRY_ERR_FORMAT,
              "4 bytes but shape x F32 needs 8");
    st_expect("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,0]}}", 8, FERRY_ERR_FORMAT,
              "outside");
    st_expect(
        "{\"a\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296,4294967296],\"data_offsets\":[0,4]}}", 8,
        FERRY_ERR_FORMAT, "overflows");
    st_expect("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,99999999999999999999]}}", 8,
              FERRY_ERR_FORMAT, NULL);
    st_expect("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
              "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
              8, FERRY_ERR_FORMAT, "overlaps");
    st_expect("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
              "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
              8, FERRY_ERR_FORMAT, "duplicate");
    st_expect("{\"__metadata__\":{\"x\":1}}", 0, FERRY_ERR_FORMAT, "__metadata__ key 'x'");
    st_expect("{\"a\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,4]}}", 4,
              FERRY_ERR_UNSUPPORTED, "9 dimensions");
    st_expect("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0]}}", 4, FERRY_ERR_FORMAT,
              "data_offsets");
    /* Deep nesting is bounded by jansson's parser depth limit, not the stack. */
    char deep[6000];
    size_t n = 0;
    n += (size_t)snprintf(deep, sizeof deep, "{\"a\":");
    for (int i = 0; i < 2500; i++) deep[n++] = '[';
    deep[n] = 0;
    st_expect(deep, 0, FERRY_ERR_FORMAT, NULL);
}

/* ---------------------------------------------------------------- hf_config */

Test(hf_config, defaults_and_variants)
{
    char err[256];
    struct llm_hparams hp;
    const char *c =
        "{\"architectures\":[\"MistralForCausalLM\"],\"hidden_size\":64,\"intermediate_size\":128,"
        "\"num_hidden_layers\":2,\"num_attention_heads\":8,\"vocab_size\":100}";
    cr_assert_eq(hf_config_parse(c, strlen(c), &hp, err), FERRY_OK, "%s", err);
    cr_assert_str_eq(hp.arch, "mistral");
    cr_assert_eq(hp.n_kv_heads, 8, "kv heads default to heads");
    cr_assert_eq(hp.head_dim, 8);
    cr_assert_float_eq(hp.rope_theta, 10000.0f, 0);
    cr_assert_eq(hp.tied_embeddings, 0);
    cr_assert_eq(hp.qkv_bias, 0);
    cr_assert_eq(hp.ctx_train, 2048);
    cr_assert_eq(hp.rope_style, ROPE_STYLE_HALF);

    c = "{\"model_type\":\"qwen2\",\"hidden_size\":64,\"intermediate_size\":128,\"num_hidden_layers\":2,"
        "\"num_attention_heads\":8,\"num_key_value_heads\":null,\"head_dim\":16,\"vocab_size\":100,"
        "\"rope_scaling\":{\"type\":\"linear\",\"factor\":2}}";
    cr_assert_eq(hf_config_parse(c, strlen(c), &hp, err), FERRY_OK, "%s", err);
    cr_assert_str_eq(hp.arch, "qwen2");
    cr_assert_eq(hp.qkv_bias, 1);
    cr_assert_eq(hp.head_dim, 16);
    cr_assert_eq(hp.n_kv_heads, 8);
    cr_assert_eq(hp.rope_scaling.type, ROPE_SCALING_LINEAR);
    cr_assert_float_eq(hp.rope_scaling.factor, 2.0f, 0);

    /* transformers 5: rope_parameters carries theta and the scaling. */
    c = "{\"architectures\":[\"Qwen2ForCausalLM\"],\"hidden_size\":56,\"intermediate_size\":90,"
        "\"num_hidden_layers\":2,\"num_attention_heads\":7,\"num_key_value_heads\":1,\"vocab_size\":263,"
        "\"rope_parameters\":{\"rope_theta\":1000000.0,\"rope_type\":\"default\"}}";
    cr_assert_eq(hf_config_parse(c, strlen(c), &hp, err), FERRY_OK, "%s", err);
    cr_assert_float_eq(hp.rope_theta, 1e6f, 0);
    cr_assert_eq(hp.rope_scaling.type, ROPE_SCALING_NONE);
    c = "{\"architectures\":[\"LlamaForCausalLM\"],\"hidden_size\":64,\"intermediate_size\":128,"
        "\"num_hidden_layers\":2,\"num_attention_heads\":8,\"vocab_size\":100,\"rope_parameters\":"
        "{\"rope_theta\":500000,\"rope_type\":\"llama3\",\"factor\":32,\"low_freq_factor\":1,"
        "\"high_freq_factor\":4,\"original_max_position_embeddings\":8192}}";
    cr_assert_eq(hf_config_parse(c, strlen(c), &hp, err), FERRY_OK, "%s", err);
    cr_assert_float_eq(hp.rope_theta, 500000.0f, 0);
    cr_assert_eq(hp.rope_scaling.type, ROPE_SCALING_LLAMA3);
    cr_assert_float_eq(hp.rope_scaling.factor, 32.0f, 0);
    cr_assert_eq(hp.rope_scaling.orig_ctx, 8192);

    c = "{\"architectures\":[\"LlamaForCausalLM\"],\"hidden_size\":64,\"intermediate_size\":128,"
        "\"num_hidden_layers\":2,\"num_attention_heads\":8,\"vocab_size\":100,"
        "\"rope_scaling\":{\"rope_type\":\"llama3\",\"factor\":8}}";
    cr_assert_eq(hf_config_parse(c, strlen(c), &hp, err), FERRY_ERR_FORMAT);
    cr_assert(strstr(err, "low_freq_factor") != NULL, "%s", err);
    c = "{\"architectures\":[\"LlamaForCausalLM\"],\"hidden_size\":64,\"intermediate_size\":128,"
        "\"num_hidden_layers\":2,\"num_attention_heads\":8,\"vocab_size\":100,\"attention_bias\":true}";
    cr_assert_eq(hf_config_parse(c, strlen(c), &hp, err), FERRY_ERR_UNSUPPORTED);
    c = "{\"architectures\":[\"LlamaForCausalLM\"],\"hidden_size\":64.5}";
    cr_assert_eq(hf_config_parse(c, strlen(c), &hp, err), FERRY_ERR_FORMAT);
    cr_assert(strstr(err, "hidden_size") != NULL, "%s", err);
    c = "{\"architectures\":[\"LlamaForCausalLM\"],\"architectures\":[\"X\"]}";
    cr_assert_eq(hf_config_parse(c, strlen(c), &hp, err), FERRY_ERR_FORMAT, "duplicate keys");
    /* An unknown class names itself and the supported ones; model_type alone picks a family. */
    c = "{\"architectures\":[\"FalconForCausalLM\"],\"model_type\":\"llama\"}";
    cr_assert_eq(hf_config_parse(c, strlen(c), &hp, err), FERRY_ERR_UNSUPPORTED);
    cr_assert(strstr(err, "'FalconForCausalLM' is not supported (LlamaForCausalLM, MistralForCausalLM, "
                          "Qwen2ForCausalLM") != NULL,
              "%s", err);
    c = "{\"model_type\":\"qwen2\",\"hidden_size\":56,\"intermediate_size\":90,\"num_hidden_layers\":2,"
        "\"num_attention_heads\":7,\"vocab_size\":100}";
    cr_assert_eq(hf_config_parse(c, strlen(c), &hp, err), FERRY_OK, "%s", err);
    cr_assert_str_eq(hp.arch, "qwen2");
    cr_assert_eq(hp.qkv_bias, 1);
    cr_assert_not_null(hp.family);
}

/* LongRoPE as transformers reads it (Phi-3.5-mini's layout: rope_scaling with short_factor / long_factor, the
 * original context at the top level), YaRN's mscale pair and Ministral 3's attention temperature. */
Test(hf_config, longrope_yarn_mscale_temperature)
{
    char err[256];
    struct llm_hparams hp;
    const char *c =
        "{\"architectures\":[\"Phi3ForCausalLM\"],\"hidden_size\":64,\"intermediate_size\":96,"
        "\"num_hidden_layers\":2,\"num_attention_heads\":4,\"vocab_size\":100,\"max_position_embeddings\":"
        "131072,\"original_max_position_embeddings\":4096,\"rope_scaling\":{\"type\":\"longrope\","
        "\"short_factor\":[1,1.5,2,2.5,3,3.5,4,4.5],\"long_factor\":[1,2,3,4,5,6,7,8],"
        "\"original_max_position_embeddings\":2048}}";
    cr_assert_eq(hf_config_parse(c, strlen(c), &hp, err), FERRY_OK, "%s", err);
    const struct rope_scaling *sc = &hp.rope_scaling;
    cr_assert_eq(sc->type, ROPE_SCALING_LONGROPE);
    cr_assert_eq(sc->orig_ctx, 4096, "the top-level original context wins");
    cr_assert_eq(sc->n_factors, 8);
    cr_assert_float_eq(sc->short_factor[7], 4.5f, 0);
    cr_assert_float_eq(sc->long_factor[1], 2.0f, 0);
    cr_assert_float_eq(sc->factor, 32.0f, 0);
    /* transformers: sqrt(1 + ln(32) / ln(4096)) */
    cr_assert_float_eq(sc->attn_factor, (float)sqrt(1 + log(32.0) / log(4096.0)), 1e-7);
    cr_assert_float_eq(rope_scaling_attn_factor(sc), sc->attn_factor, 0);
    cr_assert_float_eq(llm_attn_scale(&hp), 0.25f * sc->attn_factor * sc->attn_factor, 1e-7,
                       "every dim rotates: the factor folds into the scale");
    cr_assert_float_eq(llm_rope_q_scale(&hp), 1.0f, 0);
    /* an explicit attention_factor; partial rotary puts the factor on the rotated dims */
    c = "{\"architectures\":[\"Phi3ForCausalLM\"],\"hidden_size\":64,\"intermediate_size\":96,"
        "\"num_hidden_layers\":2,\"num_attention_heads\":4,\"vocab_size\":100,\"partial_rotary_factor\":0.5,"
        "\"rope_parameters\":{\"rope_type\":\"longrope\",\"short_factor\":[1,1,1,1],\"long_factor\":[2,2,2,2]"
        ","
        "\"original_max_position_embeddings\":64,\"attention_factor\":1.5}}";
    cr_assert_eq(hf_config_parse(c, strlen(c), &hp, err), FERRY_OK, "%s", err);
    cr_assert_eq(hp.rope_dim, 8);
    cr_assert_float_eq(hp.rope_scaling.attn_factor, 1.5f, 0);
    cr_assert_float_eq(llm_attn_scale(&hp), 0.25f, 0);
    cr_assert_float_eq(llm_rope_q_scale(&hp), 2.25f, 0);
    /* lists of different lengths, or not of positive numbers */
    c = "{\"architectures\":[\"Phi3ForCausalLM\"],\"hidden_size\":64,\"intermediate_size\":96,"
        "\"num_hidden_layers\":2,\"num_attention_heads\":4,\"vocab_size\":100,"
        "\"rope_scaling\":{\"type\":\"longrope\",\"short_factor\":[1,1],\"long_factor\":[2,2,2]}}";
    cr_assert_eq(hf_config_parse(c, strlen(c), &hp, err), FERRY_ERR_FORMAT);
    cr_assert(strstr(err, "long_factor") != NULL, "%s", err);
    c = "{\"architectures\":[\"Phi3ForCausalLM\"],\"hidden_size\":64,\"intermediate_size\":96,"
        "\"num_hidden_layers\":2,\"num_attention_heads\":4,\"vocab_size\":100,"
        "\"rope_scaling\":{\"type\":\"longrope\",\"short_factor\":[1,-1],\"long_factor\":[2,2]}}";
    cr_assert_eq(hf_config_parse(c, strlen(c), &hp, err), FERRY_ERR_FORMAT);
    cr_assert(strstr(err, "short_factor[1]") != NULL, "%s", err);

    /* Ministral 3: mscale 1 / mscale_all_dim 1 give an attention factor of 1 and the log multiplier
     * llama.cpp's converter writes; llama_4_scaling_beta over the original context. */
    c = "{\"architectures\":[\"Ministral3ForCausalLM\"],\"hidden_size\":64,\"intermediate_size\":96,"
        "\"num_hidden_layers\":2,\"num_attention_heads\":4,\"head_dim\":16,\"vocab_size\":100,"
        "\"rope_parameters\":{\"rope_type\":\"yarn\",\"factor\":16,\"original_max_position_embeddings\":"
        "16384,"
        "\"mscale\":1.0,\"mscale_all_dim\":1.0,\"llama_4_scaling_beta\":0.1,\"rope_theta\":1e6}}";
    cr_assert_eq(hf_config_parse(c, strlen(c), &hp, err), FERRY_OK, "%s", err);
    cr_assert_str_eq(hp.arch, "ministral3");
    cr_assert_eq(hp.rope_scaling.type, ROPE_SCALING_YARN);
    cr_assert_float_eq(hp.rope_scaling.attn_factor, 1.0f, 1e-7);
    cr_assert_float_eq(hp.rope_scaling.yarn_log_mul, 1.0f, 0);
    cr_assert_float_eq(hp.attn_temp_beta, 0.1f, 0);
    cr_assert_eq(hp.attn_temp_len, 16384);
    cr_assert_float_eq(llm_attn_temp(&hp, 16383), 1.0f, 0);
    cr_assert_float_eq(llm_attn_temp(&hp, 16384), 1.0f + 0.1f * logf(2.0f), 1e-7);
    cr_assert_float_eq(llm_attn_temp(&hp, 3 * 16384 + 5), 1.0f + 0.1f * logf(4.0f), 1e-7);
    /* mscale 1 / mscale_all_dim 0.5: (0.1 ln 16 + 1) / (0.05 ln 16 + 1) */
    c = "{\"architectures\":[\"Ministral3ForCausalLM\"],\"hidden_size\":64,\"intermediate_size\":96,"
        "\"num_hidden_layers\":2,\"num_attention_heads\":4,\"vocab_size\":100,\"rope_parameters\":"
        "{\"rope_type\":\"yarn\",\"factor\":16,\"original_max_position_embeddings\":64,\"mscale\":1,"
        "\"mscale_all_dim\":0.5}}";
    cr_assert_eq(hf_config_parse(c, strlen(c), &hp, err), FERRY_OK, "%s", err);
    cr_assert_float_eq(hp.rope_scaling.attn_factor, (float)((0.1 * log(16.0) + 1) / (0.05 * log(16.0) + 1)),
                       1e-7);
    cr_assert_float_eq(hp.attn_temp_beta, 0.0f, 0);
}

Test(hf_config, chat_templates)
{
    char err[256], *t;
    const char *c = "{\"chat_template\":[{\"name\":\"rag\",\"template\":\"R\"},{\"name\":\"default\","
                    "\"template\":\"D\"}]}";
    cr_assert_eq(hf_chat_template_parse(c, strlen(c), &t, err), FERRY_OK);
    cr_assert_str_eq(t, "D");
    free(t);
    c = "{\"chat_template\":[{\"name\":\"rag\",\"template\":\"R\"}]}";
    cr_assert_eq(hf_chat_template_parse(c, strlen(c), &t, err), FERRY_OK);
    cr_assert_null(t);
    c = "{\"bos_token\":\"<s>\"}";
    cr_assert_eq(hf_chat_template_parse(c, strlen(c), &t, err), FERRY_OK);
    cr_assert_null(t);
    c = "{\"chat_template\":5}";
    cr_assert_eq(hf_chat_template_parse(c, strlen(c), &t, err), FERRY_ERR_FORMAT);

    /* Without a template in tokenizer_config.json, chat_template.jinja beside it is used. */
    const char *d = copy_dir("hf_qwen2");
    write_file(d, "tokenizer_config.json", "{}");
    write_file(d, "chat_template.jinja", "{{ messages }}\n");
    cr_assert_eq(hf_chat_template_load(d, &t, err), FERRY_OK, "%s", err);
    cr_assert_str_eq(t, "{{ messages }}\n");
    free(t);
    rm_dir(d);
}
