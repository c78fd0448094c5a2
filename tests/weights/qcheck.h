/* qcheck — comparing ferry quantize's output with a llama-quantize fixture entry (file SHA-256, and on a
 * mismatch the first tensor whose type or data hash differs). Header-only (each test is its own executable).
 * A fixture entry: "sha256", "types" (space-separated, output order), "tensor_sha" (8 hex digits per
 * tensor) and optionally "first_rows" (tensor name -> hex bytes of its first row); the model's "names". */
#ifndef FERRY_TESTS_QCHECK_H
#define FERRY_TESTS_QCHECK_H

#include <criterion/criterion.h>
#include <jansson.h>
#include <stdio.h>
#include <string.h>

#include "kernels/core/status.h"
#include "quant/dtype.h"
#include "sha256.h"
#include "weights/gguf.h"

static void file_sha(const char *path, char hex[65])
{
    FILE *f = fopen(path, "rb");
    cr_assert_not_null(f, "cannot read %s", path);
    struct sha256 s;
    sha256_init(&s);
    static uint8_t buf[1 << 16];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, f)) > 0) sha256_update(&s, buf, n);
    fclose(f);
    sha256_hex(&s, hex);
}

/* Names the first tensor of the output whose type or data hash differs from llama-quantize's. */
static void explain_mismatch(const char *path, json_t *model, json_t *want, const char *type)
{
    char err[256] = "";
    struct gguf *g;
    cr_assert_eq(gguf_open(path, &g, err), FERRY_OK, "%s", err);
    json_t *names = json_object_get(model, "names");
    const char *types = json_string_value(json_object_get(want, "types"));
    const char *shas = json_string_value(json_object_get(want, "tensor_sha"));
    cr_assert_eq((size_t)gguf_n_tensors(g), json_array_size(names),
                 "%s: %d tensors, llama-quantize wrote %zu", type, gguf_n_tensors(g), json_array_size(names));
    for (int i = 0; i < gguf_n_tensors(g); i++) {
        const struct gguf_tensor_info *ti = gguf_tensor(g, i);
        const char *want_name = json_string_value(json_array_get(names, (size_t)i));
        cr_assert(ti->name.len == strlen(want_name) && !memcmp(ti->name.ptr, want_name, ti->name.len),
                  "%s: tensor %d is %.*s, llama-quantize has %s", type, i, (int)ti->name.len, ti->name.ptr,
                  want_name);
        const char *tw = types;
        for (int k = 0; k < i; k++) tw = strchr(tw, ' ') + 1;
        const size_t tl = strcspn(tw, " ");
        cr_assert(strlen(dtype_name(ti->type)) == tl && !memcmp(dtype_name(ti->type), tw, tl),
                  "%s: %s is %s, llama-quantize chose %.*s", type, want_name, dtype_name(ti->type), (int)tl,
                  tw);
        char hex[65];
        sha256_of(ti->data, ti->nbytes, hex);
        if (memcmp(hex, shas + 8 * i, 8) != 0) {
            json_t *row = json_object_get(json_object_get(want, "first_rows"), want_name);
            if (row) {
                const char *rh = json_string_value(row);
                const uint8_t *p = ti->data;
                for (size_t b = 0; b < strlen(rh) / 2; b++) {
                    unsigned v;
                    sscanf(rh + 2 * b, "%2x", &v);
                    cr_assert_eq(p[b], v, "%s: %s (%s) first row byte %zu: 0x%02x, llama-quantize 0x%02x",
                                 type, want_name, dtype_name(ti->type), b, p[b], v);
                }
            }
            cr_assert_fail("%s: the data of %s (%s) differs from llama-quantize's", type, want_name,
                           dtype_name(ti->type));
        }
    }
    gguf_close(g);
    cr_assert_fail("%s: every tensor matches llama-quantize's but the file does not (metadata or layout)",
                   type);
}

#endif
