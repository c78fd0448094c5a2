/* tok_impl — the tokenizer's private layout, shared by its core (tokenizer.c) and loaders (tok_load.c).
 *
 * A tokenizer is built by a loader in three steps: tok_alloc(n_vocab), fill the token strings, scores,
 * types and (BPE) merges through tok_set_token/tok_add_merge, then tok_finish() which builds the lookup
 * tables, the special-token list and the decoded piece of every token. After tok_finish() it is immutable
 * and may be shared between threads.
 */
#ifndef FERRY_TOK_IMPL_H
#define FERRY_TOK_IMPL_H

#include <stddef.h>
#include <stdint.h>

#include "runtime/tok/pretok.h"
#include "runtime/tokenizer.h"

/* GGUF token types (llama.cpp's llama_token_type). */
enum tok_type {
    TOK_TYPE_UNDEFINED = 0,
    TOK_TYPE_NORMAL = 1,
    TOK_TYPE_UNKNOWN = 2,
    TOK_TYPE_CONTROL = 3,
    TOK_TYPE_USER_DEFINED = 4,
    TOK_TYPE_UNUSED = 5,
    TOK_TYPE_BYTE = 6,
};

enum tok_algo {
    TOK_ALGO_SPM =
        0, /* SentencePiece BPE: merge the highest-scoring adjacent pair (llama.cpp llm_tokenizer_spm) */
    TOK_ALGO_BPE = 1, /* merge the lowest-ranked pair from the merges list (GPT-2 style, HF BPE model) */
};

enum tok_norm {
    TOK_NORM_NONE = 0,      /* byte-level: text goes to the pre-tokenizer as is */
    TOK_NORM_SPM = 1,       /* ' ' -> '▁', '▁' prepended to each text fragment (add_space_prefix) */
    TOK_NORM_METASPACE = 2, /* like SPM but '▁' prepended only to the fragment at the start of the text */
};

struct strmap {
    uint32_t cap;  /* power of two */
    int32_t *slot; /* (cap) token id or -1 */
};

struct mergemap {
    uint32_t cap;    /* power of two */
    uint64_t *key;   /* (cap) (left_id << 32 | right_id) + 1, 0 = empty */
    int32_t *rank;   /* (cap) */
    int32_t *result; /* (cap) id of the merged string, -1 when it is not in the vocab */
};

struct tokenizer {
    int n_vocab;
    char **text;    /* (n_vocab) token strings as stored, NUL-terminated, owned */
    int32_t *len;   /* (n_vocab) byte length of text */
    float *score;   /* (n_vocab) SPM scores (0 when absent) */
    uint8_t *type;  /* (n_vocab) enum tok_type */
    uint8_t *strip; /* (n_vocab) bit 0: lstrip, bit 1: rstrip (special-token matching) */
    char **piece;   /* (n_vocab) decoded bytes of each token, built by tok_finish */
    int32_t *piece_len;

    enum tok_algo algo;
    enum tok_norm norm;
    int bytelevel;        /* words are mapped through GPT-2's byte->unicode table before BPE */
    int byte_fallback;    /* unknown characters become <0xNN> tokens */
    int ignore_merges;    /* a word that is a token is emitted whole (Llama 3) */
    int whole_newlines;   /* a word of only '\n' that is a token is emitted whole (Gemma 4) */
    int add_space_prefix; /* TOK_NORM_SPM: '▁' before a fragment at the start or after a special token */
    int nfc;              /* text fragments are put in Unicode NFC first (Qwen2's tokenizer.json) */
    int prefix_space;     /* byte-level: ' ' before each text fragment that does not start with one (HF
                           * ByteLevel add_prefix_space) */
    int meta_prepend;     /* TOK_NORM_METASPACE: 0 never, 1 first fragment only, 2 always */
    struct pretok pre;

    struct strmap map;
    struct mergemap merges;
    int n_merges;
    int32_t byte_tok[256]; /* id of <0xNN>, or -1 */
    uint32_t byte_cp[256]; /* GPT-2 byte -> code point */

    int32_t bos, eos, eot, unk;
    int add_bos, add_eos;
    int32_t *specials; /* (n_specials) CONTROL/USER_DEFINED/UNKNOWN ids, longest text first */
    int n_specials;
    int32_t eog[16];
    int n_eog;
};

int tok_alloc(struct tokenizer **out, int n_vocab);
/* Sets token id to a copy of s[0, len) (owned by the tokenizer) with its score and enum tok_type. */
int tok_set_token(struct tokenizer *t, int id, const char *s, size_t len, float score, int type);
/* Registers merge `a b` with the given rank (ids of a and b, looked up after all tokens are set). */
int tok_add_merge_str(struct tokenizer *t, const char *a, size_t alen, const char *b, size_t blen, int rank);
/* Builds the string -> id table; call once all tokens are set, before merges are added. Ids never set
 * become empty UNUSED tokens. */
int tok_build_map(struct tokenizer *t);
/* Byte tokens, the special-token list (longest first), decoded pieces, EOG set; clamps bad special ids. */
int tok_finish(struct tokenizer *t, char err[256]);
/* Marks a token as ending a generation (tokenizer_is_eog); ids out of range are ignored. */
void tok_add_eog(struct tokenizer *t, int32_t id);
int32_t tok_lookup(const struct tokenizer *t, const char *s, size_t len);
/* Rank of merging tokens a and b (and the merged id in *result), or -1 when they do not merge. */
int tok_merge_rank(const struct tokenizer *t, int32_t a, int32_t b, int32_t *result);

#endif
