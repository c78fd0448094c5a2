// SOURCES: runtime/tok/tokenizer.c runtime/tok/tok_encode.c runtime/tok/tok_decode.c runtime/tok/tok_load.c runtime/tok/tok_hf.c runtime/tok/pretok.c runtime/tok/unicode.c runtime/tok/unicode_tables.c runtime/tok/nfc.c weights/gguf.c weights/mapfile.c quant/*.c kernels/core/status.c kernels/core/log.c
// LIBS: -ljansson -lm
// MAXLEN: 16384
/* fuzz_tokenizer — libFuzzer target for the tokenizer: the input is text, encoded with parse_special off and
 * on by every loaded vocab, decoded whole and streamed; the input read as token ids is decoded and streamed
 * too, and the text goes through NFC twice. Checks: no crash or sanitizer report, encode's count protocol,
 * streamed pieces == whole decode, NFC(NFC(x)) == NFC(x).
 *
 * Vocabs, loaded once: $FERRY_FUZZ_VOCAB (one GGUF path, or several separated by ':'), else the llama-spm
 * (SentencePiece) and gpt-2 (byte-level BPE) vocabs in $FERRY_TESTDATA/vocab (default
 * ../shared/testdata/vocab, relative to the repo root where tests/fuzz/run.sh runs). With none found the
 * target says so once and exercises nothing. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/core/status.h"
#include "runtime/tok/unicode.h"
#include "runtime/tokenizer.h"
#include "weights/gguf.h"

#define MAX_VOCABS 4
static struct tokenizer *vocabs[MAX_VOCABS];
static int n_vocabs = -1;

static void load_one(const char *path)
{
    struct gguf *g = NULL;
    char err[256] = "";
    if (n_vocabs >= MAX_VOCABS || gguf_open(path, &g, err) != FERRY_OK) {
        fprintf(stderr, "fuzz_tokenizer: cannot open %s: %s\n", path, err);
        return;
    }
    if (tokenizer_init_gguf(&vocabs[n_vocabs], g, err) == FERRY_OK) n_vocabs++;
    else fprintf(stderr, "fuzz_tokenizer: %s: %s\n", path, err);
    gguf_close(g);
}

static void load_vocabs(void)
{
    n_vocabs = 0;
    const char *env = getenv("FERRY_FUZZ_VOCAB");
    if (env && *env) {
        char *list = strdup(env), *save = NULL;
        for (char *p = strtok_r(list, ":", &save); p; p = strtok_r(NULL, ":", &save)) load_one(p);
        free(list);
    } else {
        const char *root = getenv("FERRY_TESTDATA");
        char path[4096];
        const char *names[] = {"llama-spm", "gpt-2"};
        for (int i = 0; i < 2; i++) {
            snprintf(path, sizeof path, "%s/vocab/ggml-vocab-%s.gguf", root ? root : "../shared/testdata", names[i]);
            load_one(path);
        }
    }
    if (n_vocabs == 0) fprintf(stderr, "fuzz_tokenizer: no vocab loaded; nothing is exercised\n");
}

static void check_decode(const struct tokenizer *t, const int32_t *ids, int n)
{
    char *whole = NULL;
    size_t wl = 0;
    if (tokenizer_decode(t, ids, n, 0, &whole, &wl) != FERRY_OK) abort();
    char *special = NULL;
    size_t sl = 0;
    if (tokenizer_decode(t, ids, n, 1, &special, &sl) != FERRY_OK || sl < wl) abort();
    free(special);
    struct detok d;
    detok_init(&d, t);
    char piece[4096];
    size_t k = 0;
    for (int i = 0; i < n; i++) {
        int m = detok_push(&d, ids[i], piece, sizeof piece);
        if (m < 0 || k + (size_t)m > wl || memcmp(whole + k, piece, (size_t)m) != 0) abort();
        k += (size_t)m;
    }
    int m = detok_flush(&d, piece, sizeof piece);
    if (m < 0 || k + (size_t)m != wl || memcmp(whole + k, piece, (size_t)m) != 0) abort();
    free(whole);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (n_vocabs < 0) load_vocabs();
    /* NFC (tokenizer.json normalizers): idempotent, and ASCII stays as is. */
    char *nfc = NULL, *nfc2 = NULL;
    size_t nl = 0, nl2 = 0;
    if (unicode_nfc((const char *)data, size, &nfc, &nl) != FERRY_OK) abort();
    if (unicode_nfc(nfc, nl, &nfc2, &nl2) != FERRY_OK || nl2 != nl || memcmp(nfc, nfc2, nl) != 0) abort();
    free(nfc);
    free(nfc2);
    for (int v = 0; v < n_vocabs; v++) {
        const struct tokenizer *t = vocabs[v];
        for (int special = 0; special < 2; special++) {
            int n = tokenizer_encode(t, (const char *)data, size, special, special, NULL, 0);
            if (n < 0) abort();
            int32_t *ids = malloc((size_t)(n + 1) * sizeof *ids);
            int n2 = tokenizer_encode(t, (const char *)data, size, special, special, ids, n);
            if (n2 != n) abort();
            for (int i = 0; i < n; i++)
                if (ids[i] < 0 || ids[i] >= tokenizer_n_vocab(t)) abort();
            check_decode(t, ids, n);
            free(ids);
        }
        /* The bytes as token ids. */
        int n = (int)(size / 2);
        int32_t *ids = malloc((size_t)(n + 1) * sizeof *ids);
        for (int i = 0; i < n; i++) ids[i] = (int32_t)((data[2 * i] | data[2 * i + 1] << 8) % tokenizer_n_vocab(t));
        check_decode(t, ids, n);
        free(ids);
    }
    return 0;
}
