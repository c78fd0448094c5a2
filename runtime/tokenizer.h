/* tokenizer — text ⇄ token ids for SentencePiece-style BPE ("llama") and byte-level BPE ("gpt2")
 * vocabularies, read from GGUF metadata or a Hugging Face tokenizer.json.
 *
 * Encoding follows the reference implementations token for token (see tests/tokenizer). Special tokens
 * in the text are recognised only when parse_special is set (chat templates set it; user text does not).
 * Decoding is streaming-safe through struct detok: it never emits half a UTF-8 sequence, and the
 * concatenation of the pieces it emits equals tokenizer_decode() of the whole sequence.
 *
 * Supported (runtime/tok/): GGUF tokenizer.ggml.model "llama" (SentencePiece BPE by scores, byte fallback,
 * add_space_prefix) and "gpt2" (byte-level BPE by merge rank) with the tokenizer.ggml.pre splits of
 * llama.cpp (default, gpt-2, llama3/llama-bpe, qwen2, smollm, starcoder, refact, falcon, mpt,
 * deepseek-llm, deepseek-coder, command-r, olmo, ...); tokenizer.json with model BPE (byte-level or
 * '▁'/byte_fallback), Split regexes of those families, ByteLevel (add_prefix_space only as the first
 * split), Digits, Metaspace, Prepend/Replace, NFC (NFKC approximated by NFC).
 * Not supported (FERRY_ERR_UNSUPPORTED with a message): WordPiece (bert), Unigram (t5), RWKV, unknown
 * split regexes. A tokenizer is immutable after init: encode/decode may run from several threads.
 */
#ifndef FERRY_TOKENIZER_H
#define FERRY_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

struct model_file;
struct gguf;
struct tokenizer;

int tokenizer_init(struct tokenizer **out, const struct model_file *mf, char err[256]); /* GGUF or HF */
int tokenizer_init_gguf(struct tokenizer **out, const struct gguf *g, char err[256]);
int tokenizer_init_hf(struct tokenizer **out, const char *dir, char err[256]); /* tokenizer.json (+ config) */
void tokenizer_free(struct tokenizer *t);

int tokenizer_n_vocab(const struct tokenizer *t);
int32_t tokenizer_bos(const struct tokenizer *t); /* -1 when none */
int32_t tokenizer_eos(const struct tokenizer *t); /* -1 when none */
int tokenizer_add_bos(const struct tokenizer *t); /* 1 when encoding a prompt should start with BOS */
/* 1 for tokens that end a generation (EOS, EOT, <|im_end|>, <|eot_id|>, ...). */
int tokenizer_is_eog(const struct tokenizer *t, int32_t id);
/* 1 for control, unknown and unused tokens (BOS, <|im_start|>, ...): the stream renders nothing for them. */
int tokenizer_is_control(const struct tokenizer *t, int32_t id);
/* The vocabulary string of a token (as stored, e.g. "▁the" or "Ġthe"), borrowed; NULL when out of range. */
const char *tokenizer_token_str(const struct tokenizer *t, int32_t id);
/* The id of the token whose vocabulary string is exactly s[0, len) (e.g. "<|im_end|>"), or -1. */
int32_t tokenizer_find(const struct tokenizer *t, const char *s, size_t len);
/* The decoded bytes of one token (what tokenizer_decode renders for it with render_special), borrowed;
 * *len gets the byte count (not NUL-terminated in general: byte tokens may be 0x00). NULL when out of range. */
const char *tokenizer_piece(const struct tokenizer *t, int32_t id, size_t *len);

/* Encodes len bytes of text. Writes up to cap ids to out and returns the total count (which may exceed
 * cap: call again with a larger buffer), or a negative status. add_bos prepends BOS if the vocab has one. */
int tokenizer_encode(const struct tokenizer *t, const char *text, size_t len, int add_bos, int parse_special,
                     int32_t *out, int cap);

/* Decodes ids into a malloc'd NUL-terminated string (*out, *out_len); special tokens are rendered as their
 * text only when render_special. Invalid UTF-8 produced by byte tokens is kept as bytes. */
int tokenizer_decode(const struct tokenizer *t, const int32_t *ids, int n, int render_special, char **out,
                     size_t *out_len);

/* Copies s[0..n) replacing invalid UTF-8 (and NUL) with U+FFFD, for text that must be valid (JSON); malloc'd,
 * NUL-terminated, NULL when out of memory. Model output can be invalid where byte tokens split a character. */
char *utf8_sanitize(const char *s, size_t n, size_t *out_len);

/* Streaming detokenizer. */
struct detok {
    const struct tokenizer *t;
    int n_seen;            /* tokens pushed so far */
    unsigned char pend[8]; /* bytes of an incomplete UTF-8 sequence */
    int n_pend;
};
void detok_init(struct detok *d, const struct tokenizer *t);
/* Appends the text of one token; writes complete UTF-8 to out (cap >= 256 recommended) and returns the byte
 * count, or a negative status when cap is too small. */
int detok_push(struct detok *d, int32_t id, char *out, size_t cap);
/* Emits what is still pending at the end of the sequence (incomplete bytes as they are). */
int detok_flush(struct detok *d, char *out, size_t cap);

#endif
