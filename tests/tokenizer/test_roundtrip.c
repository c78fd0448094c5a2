/* Properties over random inputs (seeded, reproducible):
 *  - decode(encode(s)) == s for 2,000 random valid UTF-8 strings on each byte-level vocab (ASCII, spaces,
 *    newlines, digits, punctuation, Latin, Cyrillic, CJK, emoji, any plane's code points, special-token text);
 *  - streaming: the concatenation of detok_push pieces + detok_flush equals tokenizer_decode, on random id
 *    sequences (byte tokens splitting multi-byte sequences included); when the whole text is valid UTF-8,
 *    every streamed piece is valid UTF-8 by itself (no half sequences);
 *  - speed: a 100 KB prompt encodes in well under a second of CPU (the merge loops are O(n log n); a
 *    quadratic loop would take minutes on the one-long-word and repeated-letter inputs). */
#include <time.h>

#include "toktest.h"

static uint64_t rng_state;
static uint32_t rnd(void)
{
    rng_state = rng_state * 6364136223846793005ULL + 1442695040888963407ULL;
    return (uint32_t)(rng_state >> 33);
}

static int put_cp(char *o, uint32_t cp)
{
    if (cp < 0x80) {
        o[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (char)(0xC0 | (cp >> 6));
        o[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (char)(0xE0 | (cp >> 12));
        o[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        o[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (char)(0xF0 | (cp >> 18));
    o[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    o[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    o[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

/* A random valid UTF-8 string of up to max_cps code points into o (>= 4*max_cps+32 bytes). */
static size_t random_text(char *o, int max_cps)
{
    static const char *const words[] = {"the", " of", "Hello", " world", "'s", "'ll", "<|endoftext|>", "<s>",
                                        "</s>", "  ", "\n\n", "\r\n", "\t", "123", "3.14", "💩", "ü", "日本", "é"};
    int n = (int)(rnd() % (unsigned)(max_cps + 1));
    size_t k = 0;
    for (int i = 0; i < n; i++) {
        uint32_t r = rnd() % 100, cp;
        if (r < 30) cp = 'a' + rnd() % 26;
        else if (r < 40) cp = ' ';
        else if (r < 45) cp = "\n\t\r\v\f"[rnd() % 5];
        else if (r < 52) cp = '0' + rnd() % 10;
        else if (r < 60) cp = "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~"[rnd() % 32];
        else if (r < 66) cp = 0x80 + rnd() % 0x780;    /* Latin, Greek, Cyrillic, ... */
        else if (r < 72) cp = 0x4E00 + rnd() % 0x5000; /* CJK */
        else if (r < 76) cp = 0x1F300 + rnd() % 0x300; /* emoji */
        else if (r < 80) cp = 0xA0 + rnd() % 0x10;     /* nbsp and Latin-1 punctuation */
        else if (r < 85) cp = 0x2000 + rnd() % 0x70;   /* unicode spaces, dashes, quotes */
        else if (r < 92) {
            const char *w = words[rnd() % (sizeof words / sizeof words[0])];
            memcpy(o + k, w, strlen(w));
            k += strlen(w);
            continue;
        } else {
            do cp = rnd() % 0x110000;
            while (cp >= 0xD800 && cp <= 0xDFFF);
        }
        k += (size_t)put_cp(o + k, cp);
    }
    o[k] = 0;
    return k;
}

static struct tokenizer *load_vocab(const char *name)
{
    char rel[128];
    snprintf(rel, sizeof rel, "vocab/ggml-vocab-%s.gguf", name);
    char *path = tt_data_path(rel);
    struct tokenizer *t = NULL;
    char err[256] = "";
    int rc = tt_load_gguf(path, &t, err);
    cr_assert_eq(rc, FERRY_OK, "%s: %s", path, err);
    free(path);
    return t;
}

static void roundtrip(const char *name)
{
    struct tokenizer *t = load_vocab(name);
    rng_state = 0x5eed0000u + (uint64_t)strlen(name);
    static char text[4 * 64 + 64 * 16];
    int32_t ids[2048];
    int n_bad = 0, n_skipped = 0;
    /* Some vocabs lack the byte-level character of bytes their training data never had (StarCoder, Refact
     * and Falcon have no token for some of 0xF1..0xF4, the leads of planes 4-16, and Falcon none for 14 ASCII
     * control characters such as \v): text with such a byte cannot
     * round-trip under any implementation, so those strings are skipped (and counted). */
    int missing[256] = {0};
    for (int b = 0; b < 256; b++) {
        char c = (char)b, *dec;
        size_t dl;
        int n = tokenizer_encode(t, &c, 1, 0, 0, ids, 2048);
        cr_assert(n >= 0);
        cr_assert_eq(tokenizer_decode(t, ids, n, 1, &dec, &dl), FERRY_OK);
        missing[b] = !(dl == 1 && dec[0] == c);
        free(dec);
    }
    for (int i = 0; i < 2000; i++) {
        size_t len;
        for (int tries = 0;; tries++) {
            len = random_text(text, 48);
            int skip = 0;
            for (size_t j = 0; j < len; j++) skip |= missing[(unsigned char)text[j]];
            if (!skip) break;
            n_skipped++;
            cr_assert(tries < 1000);
        }
        for (int special = 0; special < 2; special++) {
            int n = tokenizer_encode(t, text, len, 0, special, ids, 2048);
            cr_assert(n >= 0 && n <= 2048, "encode: %d", n);
            char *dec;
            size_t dl;
            cr_assert_eq(tokenizer_decode(t, ids, n, 1, &dec, &dl), FERRY_OK);
            if (dl != len || memcmp(dec, text, len) != 0) {
                if (n_bad++ < 3) {
                    char hx[2][600];
                    for (int w = 0; w < 2; w++) {
                        const unsigned char *src = (const unsigned char *)(w ? dec : text);
                        size_t sl = w ? dl : len, o = 0;
                        for (size_t j = 0; j < sl && o + 3 < sizeof hx[w]; j++) o += (size_t)sprintf(hx[w] + o, "%02x", src[j]);
                    }
                    cr_log_error("%s: round trip (parse_special %d) of\n  %s gave\n  %s", name, special, hx[0], hx[1]);
                }
            }
            free(dec);
        }
    }
    int n_missing = 0;
    for (int b = 0; b < 256; b++) n_missing += missing[b];
    if (n_missing > 32)
        for (int b = 0; b < 256; b++)
            if (missing[b]) cr_log_error("%s: byte %02x", name, b);
    cr_assert(n_missing <= 32, "%s: %d bytes cannot be represented", name, n_missing);
    cr_log_info("%s: %d bytes without a token; %d generated strings containing them were replaced", name, n_missing,
                n_skipped);
    cr_assert_eq(n_bad, 0, "%s: %d of 4000 round trips differ", name, n_bad);
    tokenizer_free(t);
}

Test(roundtrip, gpt_2) { roundtrip("gpt-2"); }
Test(roundtrip, starcoder) { roundtrip("starcoder"); }
Test(roundtrip, refact) { roundtrip("refact"); }
Test(roundtrip, falcon) { roundtrip("falcon"); }
Test(roundtrip, mpt) { roundtrip("mpt"); }
Test(roundtrip, deepseek_coder) { roundtrip("deepseek-coder"); }
Test(roundtrip, deepseek_llm) { roundtrip("deepseek-llm"); }
Test(roundtrip, gpt_neox) { roundtrip("gpt-neox"); }

static int valid_utf8(const unsigned char *s, size_t n)
{
    for (size_t i = 0; i < n;) {
        unsigned char c = s[i];
        size_t l = c < 0x80 ? 1 : (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 0;
        if (!l || i + l > n) return 0;
        for (size_t j = 1; j < l; j++)
            if ((s[i + j] & 0xC0) != 0x80) return 0;
        i += l;
    }
    return 1;
}

/* Streams ids and checks the pieces against tokenizer_decode; with check_valid every piece must be valid. */
static void check_stream(const struct tokenizer *t, const int32_t *ids, int n, int check_valid)
{
    char *whole;
    size_t wl;
    cr_assert_eq(tokenizer_decode(t, ids, n, 0, &whole, &wl), FERRY_OK);
    char *acc = malloc(wl + 16), piece[1024];
    size_t k = 0;
    struct detok d;
    detok_init(&d, t);
    for (int i = 0; i < n; i++) {
        int m = detok_push(&d, ids[i], piece, sizeof piece);
        cr_assert(m >= 0, "detok_push: %d", m);
        cr_assert(k + (size_t)m <= wl, "streamed more than the whole");
        if (check_valid) cr_assert(valid_utf8((unsigned char *)piece, (size_t)m), "piece %d is not valid UTF-8", i);
        memcpy(acc + k, piece, (size_t)m);
        k += (size_t)m;
    }
    int m = detok_flush(&d, piece, sizeof piece);
    cr_assert(m >= 0);
    memcpy(acc + k, piece, (size_t)m);
    k += (size_t)m;
    cr_assert(k == wl && memcmp(acc, whole, wl) == 0, "streamed pieces differ from the whole decode");
    free(acc);
    free(whole);
}

static void stream_vocab(const char *name)
{
    struct tokenizer *t = load_vocab(name);
    int nv = tokenizer_n_vocab(t);
    rng_state = 77;
    int32_t ids[256];
    /* Random ids, with runs of byte-ish tokens (low ids are single bytes / byte tokens in these vocabs). */
    for (int it = 0; it < 500; it++) {
        int n = 1 + (int)(rnd() % 64);
        for (int i = 0; i < n; i++) ids[i] = (int32_t)(rnd() % 4 ? rnd() % 300 : rnd() % (uint32_t)nv);
        check_stream(t, ids, n, 0);
    }
    /* Valid text encoded: every streamed piece must be whole UTF-8. */
    static char text[4 * 64 + 64 * 16];
    for (int it = 0; it < 500; it++) {
        size_t len = random_text(text, 40);
        int n = tokenizer_encode(t, text, len, 0, 0, ids, 256);
        cr_assert(n >= 0 && n <= 256);
        check_stream(t, ids, n, 1);
    }
    tokenizer_free(t);
}

Test(stream, gpt_2) { stream_vocab("gpt-2"); }
Test(stream, llama_spm) { stream_vocab("llama-spm"); }
Test(stream, deepseek_llm) { stream_vocab("deepseek-llm"); }

static double now_s(void)
{
    struct timespec ts;
    /* CPU time of this process: the check is about the algorithm, not about how busy the machine is. */
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void speed(const char *name)
{
    struct tokenizer *t = load_vocab(name);
    const size_t len = 100 * 1024;
    char *text = malloc(len + 64);
    rng_state = 99;
    size_t k = 0;
    while (k < len) {
        char buf[2048];
        size_t l = random_text(buf, 40);
        if (k + l > len) break;
        memcpy(text + k, buf, l);
        k += l;
    }
    int32_t *ids = malloc(len * 2 * sizeof *ids);
    const char *kinds[] = {"mixed text", "one long word", "one repeated letter"};
    for (int kind = 0; kind < 3; kind++) {
        size_t n = k;
        if (kind == 1)
            for (size_t i = 0; i < n; i++) text[i] = (char)('a' + (i * 7 + i / 13) % 26);
        if (kind == 2) memset(text, 'a', n);
        double t0 = now_s();
        int m = tokenizer_encode(t, text, n, 0, 1, ids, (int)(len * 2));
        double dt = now_s() - t0;
        cr_assert(m > 0);
        cr_log_info("%s: %zu bytes of %s -> %d tokens in %.3f s", name, n, kinds[kind], m, dt);
        cr_expect(dt < 0.75, "%s: encoding %zu bytes of %s took %.3f s of CPU", name, n, kinds[kind], dt);
    }
    free(ids);
    free(text);
    tokenizer_free(t);
}

Test(speed, llama_spm_100k) { speed("llama-spm"); }
Test(speed, gpt_2_100k) { speed("gpt-2"); }
Test(speed, deepseek_llm_100k) { speed("deepseek-llm"); }
