/* pretok — pre-tokenizer splits (the regexes of GPT-2, Llama 3, Qwen2, StarCoder/SmolLM, DeepSeek...)
 * written natively, without a regex engine.
 *
 * A pretok is a sequence of stages; each stage splits every piece produced by the previous one further,
 * keeping both its matches and the unmatched gaps between them as pieces (Hugging Face's Split with
 * behaviour "Isolated", and llama.cpp's unicode_regex_split). A stage is made from a regex string: the
 * known alternation patterns (GPT-2, Llama 3, Qwen2, Qwen3.5, Seed-Coder, MiniCPM 5, Ling, Jais 2, EXAONE
 * MoE, o200k, Tekken, Kimi K2, DeepSeek V3, Gemma 4's lines, with their variants; in the tokenizer.json
 * spelling and in llama.cpp's) map to hand-written scanners, and simple patterns of the form [PREFIX?] ATOM
 * [QUANT] [$] (PREFIX ' ' or \s, ATOM a bracket class, \p{L}, \p{N}, \p{P}, \s or a literal, QUANT +, {m,n}
 * or a repetition like [0-9][0-9][0-9]) are parsed. Anything else is FERRY_ERR_UNSUPPORTED.
 */
#ifndef FERRY_TOK_PRETOK_H
#define FERRY_TOK_PRETOK_H

#include <stddef.h>
#include <stdint.h>

#define PRETOK_MAX_STAGES 8

struct cclass;
struct pretok_stage {
    int kind;           /* PRETOK_KIND_* in pretok.c */
    int opts;           /* scanner kinds: PRETOK_OPT_* in pretok.c */
    int prefix;         /* simple: 0 none, 1 optional ' ', 2 optional \s */
    int qmin, qmax;     /* simple: repetition bounds of the atom (qmax < 0: unbounded) */
    int anchor_end;     /* simple: the match must end at the end of the piece */
    struct cclass *cls; /* simple: the atom; owned */
};

struct pretok {
    int n_stages;
    struct pretok_stage stages[PRETOK_MAX_STAGES];
};

/* Appends the stage for one regex (UTF-8, as written in tokenizer.json / llama.cpp). */
int pretok_add_regex(struct pretok *p, const char *re, size_t len, char err[256]);
/* Appends HF Metaspace's split: a piece starts at every '▁'. */
int pretok_add_metaspace(struct pretok *p);
/* Fills p with the stages llama.cpp uses for a GGUF tokenizer.ggml.pre value ("gpt-2", "llama-bpe"...). */
int pretok_from_gguf_pre(struct pretok *p, const char *pre, char err[256]);
void pretok_free(struct pretok *p);

/* The code points of a text being split: cp[i], its flags (UCAT_*) and byte offset; off[n] = text length. */
struct cpbuf {
    int n;
    uint32_t *cp; /* (n) */
    uint8_t *fl;  /* (n) UCAT_* flags */
    int *off;     /* (n + 1) byte offsets */
};

/* Splits cps[0, n) into pieces; writes piece end indices (code point index, exclusive, increasing, last = n)
 * into *ends (malloc'd, caller frees) and returns their count, or a negative status. */
int pretok_split(const struct pretok *p, const struct cpbuf *cb, int **ends);

#endif
