/* tokenizer — the core: vocabulary tables, special-token partition, SentencePiece and BPE merging,
 * decoding and streaming detokenization (see runtime/tokenizer.h for the contract; the loaders for GGUF
 * metadata and tokenizer.json are in tok_load.c).
 *
 * Encoding mirrors llama.cpp's llama_vocab::tokenize, whose outputs match the Hugging Face tokenizers:
 *   1. partition: special tokens are cut out of the text, longest first (CONTROL/UNKNOWN tokens only when
 *      parse_special; USER_DEFINED tokens always, like HF's added tokens);
 *   2. each remaining text fragment is normalized (SPM: ' ' -> '▁' and the leading '▁'), split by the
 *      pre-tokenizer (BPE) and merged: SPM by highest score, BPE by lowest merge rank, both with a binary
 *      heap over adjacent pairs, so a fragment of n characters costs O(n log n);
 *   3. leftovers become byte tokens <0xNN> (SPM / byte_fallback), single-byte tokens or <unk>.
 */
#include <ctype.h>
#include <stdio.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/core/log.h"
#include "kernels/core/status.h"
#include "runtime/tok/tok_impl.h"
#include "runtime/tok/unicode.h"

/* ---- tables ------------------------------------------------------------------------------------------ */

static uint32_t hash_bytes(const char *s, size_t n)
{
    uint32_t h = 2166136261u;
    for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * 16777619u;
    return h;
}

static uint64_t hash_u64(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ULL;
    x ^= x >> 33;
    return x;
}

int tok_alloc(struct tokenizer **out, int n_vocab)
{
    *out = NULL;
    if (n_vocab <= 0 || n_vocab > (1 << 24)) return FERRY_ERR_FORMAT;
    struct tokenizer *t = calloc(1, sizeof *t);
    if (!t) return FERRY_ERR_NOMEM;
    t->n_vocab = n_vocab;
    t->text = calloc((size_t)n_vocab, sizeof *t->text);
    t->len = calloc((size_t)n_vocab, sizeof *t->len);
    t->score = calloc((size_t)n_vocab, sizeof *t->score);
    t->type = calloc((size_t)n_vocab, 1);
    t->strip = calloc((size_t)n_vocab, 1);
    t->piece = calloc((size_t)n_vocab, sizeof *t->piece);
    t->piece_len = calloc((size_t)n_vocab, sizeof *t->piece_len);
    t->bos = t->eos = t->eot = t->unk = -1;
    if (!t->text || !t->len || !t->score || !t->type || !t->strip || !t->piece || !t->piece_len) {
        tokenizer_free(t);
        return FERRY_ERR_NOMEM;
    }
    *out = t;
    return FERRY_OK;
}

int tok_set_token(struct tokenizer *t, int id, const char *s, size_t len, float score, int type)
{
    if (id < 0 || id >= t->n_vocab || len > (1u << 20)) return FERRY_ERR_FORMAT;
    char *c = malloc(len + 1);
    if (!c) return FERRY_ERR_NOMEM;
    memcpy(c, s, len);
    c[len] = 0;
    free(t->text[id]);
    t->text[id] = c;
    t->len[id] = (int32_t)len;
    t->score[id] = score;
    t->type[id] = (uint8_t)type;
    return FERRY_OK;
}

int32_t tok_lookup(const struct tokenizer *t, const char *s, size_t len)
{
    if (!t->map.cap) return -1;
    uint32_t mask = t->map.cap - 1;
    for (uint32_t h = hash_bytes(s, len) & mask;; h = (h + 1) & mask) {
        int32_t id = t->map.slot[h];
        if (id < 0) return -1;
        if ((size_t)t->len[id] == len && memcmp(t->text[id], s, len) == 0) return id;
    }
}

int tok_build_map(struct tokenizer *t)
{
    uint32_t cap = 16;
    while (cap < (uint32_t)t->n_vocab * 2) cap <<= 1;
    t->map.slot = malloc(cap * sizeof *t->map.slot);
    if (!t->map.slot) return FERRY_ERR_NOMEM;
    memset(t->map.slot, 0xff, cap * sizeof *t->map.slot);
    t->map.cap = cap;
    for (int id = 0; id < t->n_vocab; id++) {
        if (!t->text[id]) {
            if (tok_set_token(t, id, "", 0, 0.0f, TOK_TYPE_UNUSED) != FERRY_OK) return FERRY_ERR_NOMEM;
        }
        if (t->len[id] == 0) continue; /* empty strings never match */
        /* Duplicate strings: the last id wins, as in llama.cpp's token_to_id. */
        for (uint32_t h = hash_bytes(t->text[id], (size_t)t->len[id]) & (cap - 1);; h = (h + 1) & (cap - 1)) {
            int32_t o = t->map.slot[h];
            if (o < 0 ||
                (t->len[o] == t->len[id] && memcmp(t->text[o], t->text[id], (size_t)t->len[id]) == 0)) {
                t->map.slot[h] = id;
                break;
            }
        }
    }
    return FERRY_OK;
}

static int mergemap_grow(struct mergemap *m)
{
    uint32_t cap = m->cap ? m->cap * 2 : 1024;
    struct mergemap n = {cap, calloc(cap, sizeof(uint64_t)), malloc(cap * sizeof(int32_t)),
                         malloc(cap * sizeof(int32_t))};
    if (!n.key || !n.rank || !n.result) {
        free(n.key);
        free(n.rank);
        free(n.result);
        return FERRY_ERR_NOMEM;
    }
    for (uint32_t i = 0; i < m->cap; i++) {
        if (!m->key[i]) continue;
        uint32_t h = (uint32_t)hash_u64(m->key[i]) & (cap - 1);
        while (n.key[h]) h = (h + 1) & (cap - 1);
        n.key[h] = m->key[i];
        n.rank[h] = m->rank[i];
        n.result[h] = m->result[i];
    }
    free(m->key);
    free(m->rank);
    free(m->result);
    *m = n;
    return FERRY_OK;
}

int tok_merge_rank(const struct tokenizer *t, int32_t a, int32_t b, int32_t *result)
{
    const struct mergemap *m = &t->merges;
    if (!m->cap || a < 0 || b < 0) return -1;
    uint64_t key = (((uint64_t)(uint32_t)a << 32) | (uint32_t)b) + 1;
    for (uint32_t h = (uint32_t)hash_u64(key) & (m->cap - 1);; h = (h + 1) & (m->cap - 1)) {
        if (!m->key[h]) return -1;
        if (m->key[h] == key) {
            *result = m->result[h];
            return m->rank[h];
        }
    }
}

int tok_add_merge_str(struct tokenizer *t, const char *a, size_t alen, const char *b, size_t blen, int rank)
{
    int32_t ia = tok_lookup(t, a, alen), ib = tok_lookup(t, b, blen);
    if (ia < 0 || ib < 0) return FERRY_ERR_NOT_FOUND; /* a merge of strings that are no tokens never fires */
    struct mergemap *m = &t->merges;
    if ((uint64_t)(t->n_merges + 1) * 2 > m->cap && mergemap_grow(m) != FERRY_OK) return FERRY_ERR_NOMEM;
    uint64_t key = (((uint64_t)(uint32_t)ia << 32) | (uint32_t)ib) + 1;
    uint32_t h = (uint32_t)hash_u64(key) & (m->cap - 1);
    while (m->key[h] && m->key[h] != key) h = (h + 1) & (m->cap - 1);
    if (m->key[h]) return FERRY_OK; /* duplicate merge: the first (lowest) rank stays */
    char *cat = malloc(alen + blen + 1);
    if (!cat) return FERRY_ERR_NOMEM;
    memcpy(cat, a, alen);
    memcpy(cat + alen, b, blen);
    m->key[h] = key;
    m->rank[h] = rank;
    m->result[h] = tok_lookup(t, cat, alen + blen);
    free(cat);
    t->n_merges++;
    return FERRY_OK;
}

/* ---- finishing ------------------------------------------------------------------------------------------
 */

static int hexval(char c)
{
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
}

/* The byte of a "<0xNN>" token, or -1. */
static int byte_token_value(const char *s, int len)
{
    if (len != 6 || memcmp(s, "<0x", 3) != 0 || s[5] != '>') return -1;
    int hi = hexval(s[3]), lo = hexval(s[4]);
    return hi < 0 || lo < 0 ? -1 : hi * 16 + lo;
}

static int cmp_special(const void *a, const void *b, void *ctx)
{
    const struct tokenizer *t = ctx;
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    int lx = t->len[x], ly = t->len[y];
    if (lx != ly) return ly - lx;
    return x - y;
}

static int build_piece(struct tokenizer *t, int id)
{
    const char *s = t->text[id];
    int n = t->len[id];
    char *p = malloc((size_t)n + 1);
    if (!p) return FERRY_ERR_NOMEM;
    int k = 0;
    switch (t->type[id]) {
    case TOK_TYPE_BYTE: {
        int v = byte_token_value(s, n);
        if (v >= 0) {
            p[k++] = (char)v;
        } else {
            memcpy(p, s, (size_t)n);
            k = n;
        }
        break;
    }
    case TOK_TYPE_UNUSED:
        break;
    case TOK_TYPE_CONTROL:
    case TOK_TYPE_UNKNOWN:
    case TOK_TYPE_USER_DEFINED:
        memcpy(p, s, (size_t)n);
        k = n;
        break;
    default: /* NORMAL */
        if (t->bytelevel) {
            for (int i = 0; i < n;) {
                int l;
                uint32_t cp = utf8_decode((const unsigned char *)s + i, (size_t)(n - i), &l);
                int b = cp < UTF8_INVALID_BASE ? bytelevel_byte(cp) : -1;
                if (b >= 0) {
                    p[k++] = (char)b;
                } else {
                    memcpy(p + k, s + i, (size_t)l);
                    k += l;
                }
                i += l;
            }
        } else {
            for (int i = 0; i < n;) {
                if (i + 3 <= n && memcmp(s + i, "\xe2\x96\x81", 3) == 0) {
                    p[k++] = ' ';
                    i += 3;
                } else {
                    p[k++] = s[i++];
                }
            }
        }
    }
    p[k] = 0;
    t->piece[id] = p;
    t->piece_len[id] = k;
    return FERRY_OK;
}

void tok_add_eog(struct tokenizer *t, int32_t id)
{
    if (id < 0 || id >= t->n_vocab) return;
    for (int i = 0; i < t->n_eog; i++)
        if (t->eog[i] == id) return;
    if (t->n_eog < (int)(sizeof t->eog / sizeof t->eog[0])) t->eog[t->n_eog++] = id;
}

int tok_finish(struct tokenizer *t, char err[256])
{
    if (!t->map.cap) {
        int rc = tok_build_map(t);
        if (rc != FERRY_OK) return rc;
    }
    for (int b = 0; b < 256; b++) {
        t->byte_cp[b] = bytelevel_cp((unsigned char)b);
        t->byte_tok[b] = -1;
    }
    for (int id = 0; id < t->n_vocab; id++) {
        int v = byte_token_value(t->text[id], t->len[id]);
        if (v >= 0 && (t->type[id] == TOK_TYPE_BYTE || !t->bytelevel) && t->byte_tok[v] < 0)
            t->byte_tok[v] = id;
    }
    int n_sp = 0;
    for (int id = 0; id < t->n_vocab; id++) {
        int ty = t->type[id];
        if ((ty == TOK_TYPE_CONTROL || ty == TOK_TYPE_USER_DEFINED || ty == TOK_TYPE_UNKNOWN) &&
            t->len[id] > 0)
            n_sp++;
    }
    t->specials = malloc((size_t)(n_sp + 1) * sizeof *t->specials);
    if (!t->specials) return FERRY_ERR_NOMEM;
    for (int id = 0; id < t->n_vocab; id++) {
        int ty = t->type[id];
        if ((ty == TOK_TYPE_CONTROL || ty == TOK_TYPE_USER_DEFINED || ty == TOK_TYPE_UNKNOWN) &&
            t->len[id] > 0)
            t->specials[t->n_specials++] = id;
    }
    qsort_r(t->specials, (size_t)t->n_specials, sizeof *t->specials, cmp_special, t);
    for (int id = 0; id < t->n_vocab; id++) {
        if (build_piece(t, id) != FERRY_OK) return FERRY_ERR_NOMEM;
    }
    if (t->bos >= t->n_vocab) t->bos = -1;
    if (t->unk >= t->n_vocab) t->unk = -1;
    if (t->eot >= t->n_vocab) t->eot = -1;
    if (t->eos >= t->n_vocab) {
        snprintf(err, 256, "tokenizer: eos id %d out of range (n_vocab %d)", t->eos, t->n_vocab);
        t->eos = -1;
    }
    tok_add_eog(t, t->eos);
    tok_add_eog(t, t->eot);
    static const char *const eog_names[] = {"<|im_end|>",
                                            "<|eot_id|>",
                                            "<|endoftext|>",
                                            "<end_of_turn>",
                                            "<|end|>",
                                            "<|end_of_text|>",
                                            "<｜end▁of▁sentence｜>",
                                            "<EOT>",
                                            "<|eom_id|>",
                                            "<|return|>",
                                            "<|call|>",
                                            "<|flush|>",
                                            "<|calls|>"};
    int32_t named[sizeof eog_names / sizeof eog_names[0]];
    for (size_t i = 0; i < sizeof eog_names / sizeof eog_names[0]; i++) {
        int32_t id = tok_lookup(t, eog_names[i], strlen(eog_names[i]));
        named[i] = id >= 0 && t->type[id] != TOK_TYPE_NORMAL ? id : -1;
        if (named[i] >= 0) tok_add_eog(t, id);
    }
    /* Harmony (gpt-oss: <|return|> and <|call|>) and Solar Open (<|calls|> and <|flush|>) end a message with
     * <|end|> and the answer with the others: there <|end|> is not the end, as llama.cpp decides. */
    if ((named[9] >= 0 && named[10] >= 0) || (named[11] >= 0 && named[12] >= 0))
        for (int i = 0; i < t->n_eog; i++)
            if (t->eog[i] == named[4]) {
                t->eog[i] = t->eog[--t->n_eog];
                break;
            }
    if (t->add_bos && t->bos < 0) t->add_bos = 0;
    return FERRY_OK;
}

/* ---- public getters -------------------------------------------------------------------------------- */

void tokenizer_free(struct tokenizer *t)
{
    if (!t) return;
    for (int i = 0; i < t->n_vocab; i++) {
        if (t->text) free(t->text[i]);
        if (t->piece) free(t->piece[i]);
    }
    free(t->text);
    free(t->len);
    free(t->score);
    free(t->type);
    free(t->strip);
    free(t->piece);
    free(t->piece_len);
    free(t->map.slot);
    free(t->merges.key);
    free(t->merges.rank);
    free(t->merges.result);
    free(t->specials);
    pretok_free(&t->pre);
    free(t);
}

int tokenizer_n_vocab(const struct tokenizer *t)
{
    return t->n_vocab;
}
int32_t tokenizer_bos(const struct tokenizer *t)
{
    return t->bos;
}
int32_t tokenizer_eos(const struct tokenizer *t)
{
    return t->eos;
}
int tokenizer_add_bos(const struct tokenizer *t)
{
    return t->add_bos;
}

int tokenizer_is_eog(const struct tokenizer *t, int32_t id)
{
    for (int i = 0; i < t->n_eog; i++)
        if (t->eog[i] == id) return 1;
    return 0;
}

int tokenizer_is_control(const struct tokenizer *t, int32_t id)
{
    if (id < 0 || id >= t->n_vocab) return 0;
    const int ty = t->type[id];
    return ty == TOK_TYPE_CONTROL || ty == TOK_TYPE_UNKNOWN || ty == TOK_TYPE_UNUSED;
}

const char *tokenizer_token_str(const struct tokenizer *t, int32_t id)
{
    return id >= 0 && id < t->n_vocab ? t->text[id] : NULL;
}

int32_t tokenizer_find(const struct tokenizer *t, const char *s, size_t len)
{
    return s ? tok_lookup(t, s, len) : -1;
}

const char *tokenizer_piece(const struct tokenizer *t, int32_t id, size_t *len)
{
    if (id < 0 || id >= t->n_vocab) return NULL;
    if (len) *len = (size_t)t->piece_len[id];
    return t->piece[id];
}
