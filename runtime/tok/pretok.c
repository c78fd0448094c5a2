/* pretok — native pre-tokenizer splits (see pretok.h).
 *
 * The scanners follow the regex semantics of Oniguruma (what Hugging Face tokenizers runs): leftmost-first
 * alternation, greedy quantifiers with backtracking written out by hand. Every piece boundary produced by
 * one stage is a hard boundary for the next (a stage never looks past the end of the piece it splits).
 */
#include "runtime/tok/pretok.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/core/status.h"
#include "runtime/tok/unicode.h"

enum {
    PRETOK_KIND_SIMPLE = 0,
    PRETOK_KIND_GPT2 = 1,
    PRETOK_KIND_LLAMA3 = 2, /* Llama 3 / Qwen2 and variants (opts PRETOK_OPT_*), qmax = max digits */
    PRETOK_KIND_METASPACE = 3,
    PRETOK_KIND_CASE = 4,  /* o200k (gpt-4o) / Tekken: words split at case changes, qmax = max digits */
    PRETOK_KIND_LINES = 5, /* [^\n]+|[\n]+ (Gemma 4) */
    PRETOK_KIND_DSV3 = 6,  /* DeepSeek V3's third stage: punctuation-led ASCII words, \p{P}\p{S} runs */
};
/* Options of the scanner kinds. LLAMA3: MARKS words are [\p{L}\p{M}]+ and marks no "other" (Qwen3.5);
 * NO_RN_TAIL " ?[^\s\p{L}\p{N}]+" without its [\r\n]* (Seed-Coder); NO_CONTR no contractions (Ufakzeka);
 * SPACED words are (?:\p{L}\p{M}*(?: \p{L}\p{M}*)*)+ and the tail [\r\n/]? (EXAONE MoE); WS_POW2 whitespace
 * in chunks \s{512}..\s{4}, \s{1,2}, \s (Jais 2). CASE: CONTR a word may end with a contraction (o200k);
 * HAN Han runs first, no Han in words, tail [\r\n]* (Kimi K2). */
enum {
    PRETOK_OPT_MARKS = 1,
    PRETOK_OPT_NO_RN_TAIL = 2,
    PRETOK_OPT_CONTR = 4,
    PRETOK_OPT_HAN = 8,
    PRETOK_OPT_NO_CONTR = 16,
    PRETOK_OPT_SPACED = 32,
    PRETOK_OPT_WS_POW2 = 64,
};

struct cclass {
    int neg;          /* the class is negated ([^...]) */
    int cats;         /* UCAT_* categories included */
    int n;            /* number of ranges */
    uint32_t (*r)[2]; /* (n) inclusive code point ranges */
};

static int cclass_has(const struct cclass *c, uint32_t cp, int fl)
{
    int in = (fl & c->cats) != 0;
    for (int i = 0; !in && i < c->n; i++) in = cp >= c->r[i][0] && cp <= c->r[i][1];
    return in != c->neg;
}

static void cclass_free(struct cclass *c)
{
    if (c) free(c->r);
    free(c);
}

static int cclass_add(struct cclass *c, uint32_t lo, uint32_t hi)
{
    void *r = realloc(c->r, (size_t)(c->n + 1) * sizeof *c->r);
    if (!r) return FERRY_ERR_NOMEM;
    c->r = r;
    c->r[c->n][0] = lo;
    c->r[c->n][1] = hi;
    c->n++;
    return FERRY_OK;
}

/* ---- known alternation patterns ---------------------------------------------------------------------- */

static const char *const re_gpt2[] = {
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)",
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+",
};
/* The patterns are kept in readable pieces. */
/* clang-format off */
#define LLAMA3_TAIL(N) \
    "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}" N "| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
#define CONTR_I "(?i:'s|'t|'re|'ve|'m|'ll|'d)"
#define CONTR_X "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
static const char *const re_llama3[] = {CONTR_I LLAMA3_TAIL("{1,3}"), CONTR_X LLAMA3_TAIL("{1,3}")};
static const char *const re_qwen2[] = {CONTR_I LLAMA3_TAIL(""), CONTR_X LLAMA3_TAIL("")};
#define QWEN35_TAIL \
    "|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+|\\p{N}| ?[^\\s\\p{L}\\p{M}\\p{N}]+[\\r\\n]*" \
    "|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
static const char *const re_qwen35[] = {CONTR_I QWEN35_TAIL, CONTR_X QWEN35_TAIL};
#define SEED_TAIL \
    "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1}| ?[^\\s\\p{L}\\p{N}\\r\\n]+|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
static const char *const re_seed[] = {CONTR_I SEED_TAIL, CONTR_X SEED_TAIL};
/* MiniCPM 5 (after "\p{N}{1,3}"): Llama 3's pattern with \p{N}+. */
static const char *const re_minicpm5[] = {CONTR_I LLAMA3_TAIL("+"), CONTR_X LLAMA3_TAIL("+")};
/* Ling / Ring (bailingmoe): Qwen2's split written with possessive quantifiers (tokenizer.json) or greedy
 * ones (llama.cpp); \s*[\r\n] ends where \s*[\r\n]+ does. */
#define BAILING_RE(Q) \
    "'(?i:[sdmt]|ll|ve|re)|[^\\r\\n\\p{L}\\p{N}]?" Q "\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+" Q "[\\r\\n]*" \
    "|\\s*[\\r\\n]|\\s+(?!\\S)|\\s+"
#define BAILING_X \
    "'(?:[sSdDmMtT]|[lL][lL]|[vV][eE]|[rR][eE])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}" \
    "| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]|\\s+(?!\\S)|\\s+"
static const char *const re_bailing[] = {BAILING_RE("+"), BAILING_X};
/* Jais 2: Llama 3's pattern with whitespace cut in power-of-two chunks. */
#define JAIS2_TAIL \
    "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+" \
    "|\\s{512}(?!\\S)|\\s{256}(?!\\S)|\\s{128}(?!\\S)|\\s{64}(?!\\S)|\\s{32}(?!\\S)|\\s{16}(?!\\S)" \
    "|\\s{8}(?!\\S)|\\s{4}(?!\\S)|\\s{1,2}(?!\\S)|\\s{1}"
static const char *const re_jais2[] = {CONTR_I JAIS2_TAIL, CONTR_X JAIS2_TAIL};
/* EXAONE MoE: words run on over single spaces. */
#define EXAONE_TAIL \
    "|[^\\r\\n\\p{L}\\p{N}]?(?:\\p{L}\\p{M}*(?: \\p{L}\\p{M}*)*)+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]?" \
    "|\\s*[\\r\\n]|\\s+(?!\\S)|\\s+"
static const char *const re_exaone_moe[] = {CONTR_I EXAONE_TAIL, CONTR_X EXAONE_TAIL};
/* Ufakzeka: Qwen2's split without the contractions (the tail without its leading '|'). */
static const char *const re_ufakzeka = LLAMA3_TAIL("") + 1;
/* o200k (gpt-4o, gpt-oss) and Tekken: an optional non-letter, then upper-case letters and lower-case ones. */
#define CASE_U "[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]"
#define CASE_W "[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]"
#define CASE_PRE "[^\\r\\n\\p{L}\\p{N}]?"
#define CASE_RE(C, D) \
    CASE_PRE CASE_U "*" CASE_W "+" C "|" CASE_PRE CASE_U "+" CASE_W "*" C \
    "|\\p{N}" D "| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
static const char *const re_o200k[] = {CASE_RE(CONTR_I "?", "{1,3}"), CASE_RE(CONTR_X "?", "{1,3}")};
static const char *const re_tekken[] = {CASE_RE("", "")};
/* Kimi K2 (tiktoken): Han runs, then o200k's words without Han letters. */
#define KIMI_U "[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}&&[^\\p{Han}]]"
#define KIMI_W "[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}&&[^\\p{Han}]]"
#define KIMI_RE(C) \
    "[\\p{Han}]+|" CASE_PRE KIMI_U "*" KIMI_W "+" C "?|" CASE_PRE KIMI_U "+" KIMI_W "*" C "?" \
    "|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
static const char *const re_kimi[] = {KIMI_RE(CONTR_I), KIMI_RE(CONTR_X)};
static const char *const re_lines = "[^\\n]+|[\\n]+";
/* DeepSeek V3 (also Hunyuan dense, JoyAI, HY v4), after "\p{N}{1,3}" and "[一-龥぀-ゟ゠-ヿ]+";
 * llama.cpp writes CR and LF as raw characters, a tokenizer.json as escapes. */
#define DSV3_RE(R, N) \
    "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^" R N "\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+" \
    "| ?[\\p{P}\\p{S}]+[" R N "]*|\\s*[" R N "]+|\\s+(?!\\S)|\\s+"
static const char *const re_dsv3[] = {DSV3_RE("\r", "\n"), DSV3_RE("\\r", "\\n")};
/* clang-format on */

static int streq_n(const char *a, const char *b, size_t blen)
{
    return strlen(a) == blen && memcmp(a, b, blen) == 0;
}

/* ---- simple pattern parser --------------------------------------------------------------------------- */

/* Reads one class item at *s (an escape, \p{X} or a literal UTF-8 char). Returns 1 for a code point in *cp,
 * 2 for categories in *cats, 0 on a syntax error. */
static int parse_item(const char **s, const char *end, uint32_t *cp, int *cats)
{
    const char *p = *s;
    if (p >= end) return 0;
    if (*p == '\\') {
        if (p + 1 >= end) return 0;
        char e = p[1];
        if (e == 'p') {
            if (p + 5 > end || p[2] != '{' || p[4] != '}') return 0;
            char k = p[3];
            *cats = k == 'L' ? UCAT_LETTER : k == 'N' ? UCAT_NUMBER : k == 'P' ? UCAT_PUNCT : 0;
            if (!*cats) return 0;
            *s = p + 5;
            return 2;
        }
        *s = p + 2;
        if (e == 's') {
            *cats = UCAT_SPACE;
            return 2;
        }
        if (e == 'r')
            *cp = '\r';
        else if (e == 'n')
            *cp = '\n';
        else if (e == 't')
            *cp = '\t';
        else if ((unsigned char)e < 0x80 &&
                 !((e >= 'a' && e <= 'z') || (e >= 'A' && e <= 'Z') || (e >= '0' && e <= '9')))
            *cp = (unsigned char)e;
        else
            return 0;
        return 1;
    }
    int l;
    *cp = utf8_decode((const unsigned char *)p, (size_t)(end - p), &l);
    if (*cp >= UTF8_INVALID_BASE) return 0;
    *s = p + l;
    return 1;
}

/* Parses one atom: [class], \p{X}, \s or a literal. */
static int parse_atom(const char **s, const char *end, struct cclass **out)
{
    struct cclass *c = calloc(1, sizeof *c);
    if (!c) return FERRY_ERR_NOMEM;
    const char *p = *s;
    int rc = FERRY_ERR_UNSUPPORTED;
    if (p < end && *p == '[') {
        p++;
        if (p < end && *p == '^') {
            c->neg = 1;
            p++;
        }
        while (p < end && *p != ']') {
            uint32_t lo = 0, hi;
            int cats = 0;
            int k = parse_item(&p, end, &lo, &cats);
            if (k == 0) goto fail;
            if (k == 2) {
                c->cats |= cats;
                continue;
            }
            hi = lo;
            if (p + 1 < end && *p == '-' && p[1] != ']') {
                p++;
                if (parse_item(&p, end, &hi, &cats) != 1 || hi < lo) goto fail;
            }
            if ((rc = cclass_add(c, lo, hi)) != FERRY_OK) goto fail;
            rc = FERRY_ERR_UNSUPPORTED;
        }
        if (p >= end) goto fail;
        p++;
    } else {
        if (p < end && strchr("()|.*+?{}^$", *p)) goto fail;
        uint32_t cp = 0;
        int cats = 0;
        int k = parse_item(&p, end, &cp, &cats);
        if (k == 0) goto fail;
        if (k == 2)
            c->cats = cats;
        else if ((rc = cclass_add(c, cp, cp)) != FERRY_OK)
            goto fail;
    }
    *s = p;
    *out = c;
    return FERRY_OK;
fail:
    cclass_free(c);
    return rc;
}

static int parse_simple(struct pretok_stage *st, const char *re, size_t len)
{
    const char *p = re, *end = re + len;
    if (len >= 2 && p[0] == ' ' && p[1] == '?') {
        st->prefix = 1;
        p += 2;
    } else if (len >= 3 && memcmp(p, "\\s?", 3) == 0) {
        st->prefix = 2;
        p += 3;
    }
    const char *atom_start = p;
    int rc = parse_atom(&p, end, &st->cls);
    if (rc != FERRY_OK) return rc;
    size_t atom_len = (size_t)(p - atom_start);
    st->qmin = st->qmax = 1;
    if (p < end && *p == '+') {
        st->qmax = -1;
        p++;
    } else if (p < end && *p == '{') {
        int a = 0, b = 0, n = 0;
        if (sscanf(p, "{%d,%d}%n", &a, &b, &n) == 2 && n > 0 && a >= 1 && b >= a) {
            st->qmin = a;
            st->qmax = b;
            p += n;
        } else if (sscanf(p, "{%d}%n", &a, &n) == 1 && n > 0 && a >= 1) {
            st->qmin = st->qmax = a;
            p += n;
        } else {
            return FERRY_ERR_UNSUPPORTED;
        }
    } else {
        while ((size_t)(end - p) >= atom_len && memcmp(p, atom_start, atom_len) == 0) {
            st->qmin++;
            st->qmax++;
            p += atom_len;
        }
    }
    if (p < end && *p == '$') {
        st->anchor_end = 1;
        p++;
    }
    return p == end ? FERRY_OK : FERRY_ERR_UNSUPPORTED;
}

int pretok_add_metaspace(struct pretok *p)
{
    if (p->n_stages >= PRETOK_MAX_STAGES) return FERRY_ERR_UNSUPPORTED;
    memset(&p->stages[p->n_stages], 0, sizeof p->stages[0]);
    p->stages[p->n_stages++].kind = PRETOK_KIND_METASPACE;
    return FERRY_OK;
}

int pretok_add_regex(struct pretok *p, const char *re, size_t len, char err[256])
{
    if (p->n_stages >= PRETOK_MAX_STAGES) {
        snprintf(err, 256, "pre-tokenizer: more than %d split stages", PRETOK_MAX_STAGES);
        return FERRY_ERR_UNSUPPORTED;
    }
    struct pretok_stage *st = &p->stages[p->n_stages];
    memset(st, 0, sizeof *st);
    for (size_t i = 0; i < 2; i++) {
        if (streq_n(re_gpt2[i], re, len)) {
            st->kind = PRETOK_KIND_GPT2;
        } else if (streq_n(re_llama3[i], re, len)) {
            st->kind = PRETOK_KIND_LLAMA3;
            st->qmax = 3;
        } else if (streq_n(re_qwen2[i], re, len)) {
            st->kind = PRETOK_KIND_LLAMA3;
            st->qmax = 1;
        } else if (streq_n(re_qwen35[i], re, len)) {
            st->kind = PRETOK_KIND_LLAMA3;
            st->qmax = 1;
            st->opts = PRETOK_OPT_MARKS;
        } else if (streq_n(re_minicpm5[i], re, len)) {
            st->kind = PRETOK_KIND_LLAMA3;
            st->qmax = INT_MAX;
        } else if (streq_n(re_bailing[i], re, len)) {
            st->kind = PRETOK_KIND_LLAMA3;
            st->qmax = 1;
        } else if (streq_n(re_jais2[i], re, len)) {
            st->kind = PRETOK_KIND_LLAMA3;
            st->qmax = 3;
            st->opts = PRETOK_OPT_WS_POW2;
        } else if (streq_n(re_exaone_moe[i], re, len)) {
            st->kind = PRETOK_KIND_LLAMA3;
            st->qmax = 1;
            st->opts = PRETOK_OPT_SPACED;
        } else if (i == 0 && streq_n(re_ufakzeka, re, len)) {
            st->kind = PRETOK_KIND_LLAMA3;
            st->qmax = 1;
            st->opts = PRETOK_OPT_NO_CONTR;
        } else if (streq_n(re_seed[i], re, len)) {
            st->kind = PRETOK_KIND_LLAMA3;
            st->qmax = 1;
            st->opts = PRETOK_OPT_NO_RN_TAIL;
        } else if (streq_n(re_o200k[i], re, len)) {
            st->kind = PRETOK_KIND_CASE;
            st->qmax = 3;
            st->opts = PRETOK_OPT_CONTR;
        } else if (streq_n(re_kimi[i], re, len)) {
            st->kind = PRETOK_KIND_CASE;
            st->qmax = 3;
            st->opts = PRETOK_OPT_CONTR | PRETOK_OPT_HAN;
        } else if (i == 0 && streq_n(re_tekken[0], re, len)) {
            st->kind = PRETOK_KIND_CASE;
            st->qmax = 1;
        } else if (i == 0 && streq_n(re_lines, re, len)) {
            st->kind = PRETOK_KIND_LINES;
        } else if (streq_n(re_dsv3[i], re, len)) {
            st->kind = PRETOK_KIND_DSV3;
        } else {
            continue;
        }
        p->n_stages++;
        return FERRY_OK;
    }
    st->kind = PRETOK_KIND_SIMPLE;
    int rc = parse_simple(st, re, len);
    if (rc != FERRY_OK) {
        cclass_free(st->cls);
        st->cls = NULL;
        snprintf(err, 256, "pre-tokenizer: unsupported split regex \"%.*s\"", (int)(len > 160 ? 160 : len),
                 re);
        return rc;
    }
    p->n_stages++;
    return FERRY_OK;
}

/* The regexes llama.cpp (llm_tokenizer_bpe) uses for each tokenizer.ggml.pre value. The \u escapes keep
 * code points that Unicode normalization would fold (Kelvin sign, Ohm sign, Greek oxia forms) intact. */
#define GPT2_RE "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)"
/* clang-format off */
static const struct {
    const char *names; /* '|'-separated tokenizer.ggml.pre values */
    const char *re[6];
} pre_table[] = {
    {"default|", {"[\\p{P}\\$\\+<=>\\^~\\|]+", GPT2_RE, "\\p{N}+", "[0-9][0-9][0-9]"}},
    {"llama3|llama-v3|llama-bpe|falcon3|falcon-h1|pixtral|dbrx|smaug-bpe|midm-2.0|lfm2|jina-v5-nano|"
     "chatglm-bpe|glm4|glm5|", {CONTR_X LLAMA3_TAIL("{1,3}")}},
    {"qwen2|deepseek-r1-qwen|megrez|stablelm2|hunyuan|kormo|f2llmv2|solar-open|grok-2|",
     {CONTR_X LLAMA3_TAIL("")}},
    {"qwen35|", {CONTR_X QWEN35_TAIL}},
    {"seed-coder|", {CONTR_X SEED_TAIL}},
    {"minicpm5|", {"\\p{N}{1,3}", CONTR_X LLAMA3_TAIL("+")}},
    {"bailingmoe|bailingmoe2|llada-moe|", {BAILING_X}},
    {"ufakzeka|", {LLAMA3_TAIL("") + 1}},
    {"exaone-moe|", {CONTR_X EXAONE_TAIL}},
    {"jais-2|", {CONTR_X JAIS2_TAIL}},
    {"laguna|", {"[^\\n]+|[\\n]+", CONTR_X LLAMA3_TAIL("")}},
    /* llama.cpp rewrites the letter classes of these two as (?=\p{L})[^a-z] and (?=\p{L})[^A-Z], which its
     * std::regex can run but which counts every non-ASCII letter as both cases; these are the classes of
     * the models' own tokenizer.json (what tiktoken and Hugging Face tokenizers apply). */
    {"gpt-4o|llama4|kanana2|talkie|minimax-m2|", {CASE_RE(CONTR_X "?", "{1,3}")}},
    {"tekken|", {CASE_RE("", "")}},
    /* llama.cpp's own Kimi K2 scanner does not split words at case changes; this is the tokenizer's regex. */
    {"kimi-k2|", {KIMI_RE(CONTR_X)}},
    {"deepseek-v3|hunyuan-dense|joyai-llm|hy_v4|",
     {"\\p{N}{1,3}", "[一-龥぀-ゟ゠-ヿ]+", DSV3_RE("\r", "\n")}},
    /* Gemma 4: spaces become U+2581 first (tok_load.c), then lines are merged whole. */
    {"gemma4|granite-embed-multi-311m|sarvam-moe|", {"[^\\n]+|[\\n]+"}},
    {"deepseek-llm|",
     {"[\r\n]",
      "\\s?[A-Za-zµÀ-ÖØ-öø-ƺƼ-ƿǄ-ʓʕ-ʯͰ-ͳͶͷͻ-ͽͿΆΈ-ΊΌΎ-ΡΣ-ϵϷ-ҁҊ-ԯԱ-ՖႠ-ჅᎠ-Ᏽᏸ-ᏽᲐ-ᲺᲽ-Ჿᴀ-ᴫᵫ-ᵷᵹ-ᶚḀ-ἕἘ-Ἕἠ-ὅὈ-Ὅὐ-ὗὙὛὝὟ-\u1F7Dᾀ-ᾴᾶ-ᾼ\u1FBEῂ-ῄῆ-ῌῐ-\u1FD3ῖ-\u1FDBῠ-Ῥῲ-ῴῶ-ῼℂℇℊ-ℓℕℙ-ℝℤ\u2126ℨ\u212A-ℭℯ-ℴℹℼ-ℿⅅ-ⅉⅎↃↄⰀ-ⱻⱾ-ⳤⳫ-ⳮⳲⳳꙀ-ꙭꚀ-ꚛꜢ-ꝯꝱ-ꞇꞋ-ꞎꭰ-ꮿﬀ-ﬆﬓ-ﬗＡ-Ｚａ-ｚ𐐀-𐑏𐒰-𐓓𐓘-𐓻𐲀-𐲲𐳀-𐳲𑢠-𑣟𞤀-𞥃]+",
      "\\s?[!-/:-~！-／：-～‘-‟　-。]+", "\\s+$", "[一-龥ࠀ-一가-퟿]+", "\\p{N}+"}},
    {"deepseek-coder|", {"[\r\n]", "\\s?\\p{L}+", "\\s?\\p{P}+", "[一-龥ࠀ-一가-퟿]+", "\\p{N}"}},
    {"falcon|", {"[\\p{P}\\$\\+<=>\\^~\\|`]+", GPT2_RE, "[0-9][0-9][0-9]"}},
    {"starcoder|refact|command-r|smollm|codeshell|exaone|minerva-7b|mellum2|", {"\\p{N}", GPT2_RE}},
    {"gpt-2|phi-2|jina-es|jina-de|gigachat|jina-v1-en|jina-v2-es|jina-v2-de|jina-v2-code|roberta-bpe|mpt|olmo|"
     "jais|trillion|mellum|a.x-4.0|exaone4|modern-bert|granite-docling|", {GPT2_RE}},
};
/* clang-format on */

int pretok_from_gguf_pre(struct pretok *p, const char *pre, char err[256])
{
    memset(p, 0, sizeof *p);
    char key[72];
    snprintf(key, sizeof key, "%s|", pre && *pre ? pre : "default");
    for (size_t i = 0; i < sizeof pre_table / sizeof pre_table[0]; i++) {
        const char *names = pre_table[i].names;
        for (const char *q = names; *q;) {
            const char *bar = strchr(q, '|');
            if ((size_t)(bar - q + 1) == strlen(key) && memcmp(q, key, strlen(key)) == 0) {
                for (int j = 0; j < 6 && pre_table[i].re[j]; j++) {
                    const char *re = pre_table[i].re[j];
                    int rc = pretok_add_regex(p, re, strlen(re), err);
                    if (rc != FERRY_OK) {
                        pretok_free(p);
                        return rc;
                    }
                }
                return FERRY_OK;
            }
            q = bar + 1;
        }
    }
    snprintf(err, 256, "tokenizer.ggml.pre \"%.60s\" is not supported", pre);
    return FERRY_ERR_UNSUPPORTED;
}

void pretok_free(struct pretok *p)
{
    for (int i = 0; i < p->n_stages; i++) {
        cclass_free(p->stages[i].cls);
        p->stages[i].cls = NULL;
    }
    p->n_stages = 0;
}

/* ---- scanners ---------------------------------------------------------------------------------------- */

#define IS_L(i)     (cb->fl[i] & UCAT_LETTER)
#define IS_N(i)     (cb->fl[i] & UCAT_NUMBER)
#define IS_WS(i)    (cb->fl[i] & UCAT_SPACE)
#define IS_OTHER(i) (!(cb->fl[i] & (UCAT_LETTER | UCAT_NUMBER | UCAT_SPACE)))

static uint32_t lower_ascii(uint32_t c)
{
    return c >= 'A' && c <= 'Z' ? c + 32 : c;
}

/* 's|'t|'re|'ve|'m|'ll|'d (ci: ASCII case-insensitive); returns the match end or -1. */
static int match_contraction(const struct cpbuf *cb, int p, int b, int ci)
{
    if (cb->cp[p] != '\'' || p + 1 >= b) return -1;
    uint32_t c1 = ci ? lower_ascii(cb->cp[p + 1]) : cb->cp[p + 1];
    if (c1 == 's' || c1 == 't' || c1 == 'm' || c1 == 'd') return p + 2;
    if (p + 2 >= b) return -1;
    uint32_t c2 = ci ? lower_ascii(cb->cp[p + 2]) : cb->cp[p + 2];
    if ((c1 == 'r' && c2 == 'e') || (c1 == 'v' && c2 == 'e') || (c1 == 'l' && c2 == 'l')) return p + 3;
    return -1;
}

/* Whitespace alternatives shared by GPT-2 and Llama 3: \s+(?!\S) | \s+ ; with_rn adds \s*[\r\n]+ first. */
static int match_space(const struct cpbuf *cb, int p, int b, int with_rn)
{
    int q = p, last_rn = -1;
    while (q < b && IS_WS(q)) {
        if (cb->cp[q] == '\r' || cb->cp[q] == '\n') last_rn = q + 1;
        q++;
    }
    if (q == p) return -1;
    if (with_rn && last_rn > 0) return last_rn;
    if (q - p > 1 && q < b) return q - 1;
    return q;
}

/* \s*[\r\n]+ | \s{512}(?!\S) | \s{256}(?!\S) | ... | \s{4}(?!\S) | \s{1,2}(?!\S) | \s (Jais 2). */
static int match_space_pow2(const struct cpbuf *cb, int p, int b)
{
    int q = p, last_rn = -1;
    while (q < b && IS_WS(q)) {
        if (cb->cp[q] == '\r' || cb->cp[q] == '\n') last_rn = q + 1;
        q++;
    }
    if (q == p) return -1;
    if (last_rn > 0) return last_rn;
    int n = q - p, at_end = q == b;
    for (int k = 512; k >= 4; k /= 2)
        if (n > k || (n == k && at_end)) return p + k;
    return p + ((n > 2 || (n == 2 && at_end)) ? 2 : 1);
}

static int match_gpt2(const struct cpbuf *cb, int p, int b)
{
    int e = match_contraction(cb, p, b, 0);
    if (e > 0) return e;
    int k = (cb->cp[p] == ' ' && p + 1 < b && !IS_WS(p + 1)) ? p + 1 : p;
    if (IS_L(k)) {
        while (k < b && IS_L(k)) k++;
        return k;
    }
    if (IS_N(k)) {
        while (k < b && IS_N(k)) k++;
        return k;
    }
    if (IS_OTHER(k)) {
        while (k < b && IS_OTHER(k)) k++;
        return k;
    }
    return match_space(cb, p, b, 0);
}

/* \p{N}{1,max} at p; -1 when p is no digit. */
static int match_digits(const struct cpbuf *cb, int p, int b, int max_digits)
{
    if (!IS_N(p)) return -1;
    int k = p;
    while (k < b && k - p < max_digits && IS_N(k)) k++;
    return k;
}

/* " ?[^\s\p{L}\p{N}]+" and a tail: tail 0 none, 1 [\r\n]*, 2 [\r\n/]* (o200k), 3 [\r\n/]? (EXAONE MoE);
 * marks: \p{M} is also excluded from the class. */
static int match_other(const struct cpbuf *cb, int p, int b, int tail, int marks)
{
    int ex = UCAT_LETTER | UCAT_NUMBER | UCAT_SPACE | (marks ? UCAT_MARK : 0);
    int k = (cb->cp[p] == ' ' && p + 1 < b && !(cb->fl[p + 1] & ex)) ? p + 1 : p;
    if (cb->fl[k] & ex) return -1;
    while (k < b && !(cb->fl[k] & ex)) k++;
    for (int n = 0; tail && k < b && (tail != 3 || n < 1); n++) {
        if (cb->cp[k] != '\r' && cb->cp[k] != '\n' && !(tail >= 2 && cb->cp[k] == '/')) break;
        k++;
    }
    return k;
}

/* [^\r\n\p{L}\p{N}]: the optional character before a word. */
static int is_word_prefix(const struct cpbuf *cb, int p)
{
    return cb->cp[p] != '\r' && cb->cp[p] != '\n' && !(cb->fl[p] & (UCAT_LETTER | UCAT_NUMBER));
}

static int match_llama3(const struct cpbuf *cb, int p, int b, int max_digits, int opts)
{
    int e = (opts & PRETOK_OPT_NO_CONTR) ? -1 : match_contraction(cb, p, b, 1);
    if (e > 0) return e;
    if (opts & PRETOK_OPT_SPACED) {
        int s = IS_L(p) ? p : (is_word_prefix(cb, p) && p + 1 < b && IS_L(p + 1)) ? p + 1 : -1;
        if (s >= 0) {
            int k = s + 1;
            while (k < b) {
                if (cb->fl[k] & (UCAT_LETTER | UCAT_MARK))
                    k++;
                else if (cb->cp[k] == ' ' && k + 1 < b && IS_L(k + 1))
                    k += 2;
                else
                    break;
            }
            return k;
        }
        if ((e = match_digits(cb, p, b, max_digits)) > 0) return e;
        if ((e = match_other(cb, p, b, 3, 0)) > 0) return e;
        return match_space(cb, p, b, 1);
    }
    /* [^\r\n\p{L}\p{N}]?\p{L}+  (Qwen3.5: [\p{L}\p{M}]+) */
    int word = UCAT_LETTER | ((opts & PRETOK_OPT_MARKS) ? UCAT_MARK : 0);
    if ((cb->fl[p] & word) || (is_word_prefix(cb, p) && p + 1 < b && (cb->fl[p + 1] & word))) {
        int k = p + 1;
        while (k < b && (cb->fl[k] & word)) k++;
        return k;
    }
    if ((e = match_digits(cb, p, b, max_digits)) > 0) return e;
    if ((e = match_other(cb, p, b, !(opts & PRETOK_OPT_NO_RN_TAIL), opts & PRETOK_OPT_MARKS)) > 0) return e;
    return (opts & PRETOK_OPT_WS_POW2) ? match_space_pow2(cb, p, b) : match_space(cb, p, b, 1);
}

/* o200k's letter classes: U = [\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}], W = [\p{Ll}\p{Lm}\p{Lo}\p{M}]. */
static int is_case_u(const struct cpbuf *cb, int i, int han)
{
    int f = cb->fl[i];
    if (han && (f & UCAT_LETTER) && ucat_is_han(cb->cp[i])) return 0;
    return (f & UCAT_MARK) || ((f & UCAT_LETTER) && !(f & UCAT_LOWER));
}

static int is_case_w(const struct cpbuf *cb, int i, int han)
{
    int f = cb->fl[i];
    if (han && (f & UCAT_LETTER) && ucat_is_han(cb->cp[i])) return 0;
    return (f & UCAT_MARK) || ((f & UCAT_LETTER) && !(f & UCAT_UPPER));
}

/* U*W+ at s: U* takes the longest run it can leave at least one W after (backtracking), W+ is greedy. */
static int match_case_uw(const struct cpbuf *cb, int s, int b, int han)
{
    int u = s;
    while (u < b && is_case_u(cb, u, han)) u++;
    int k = u;
    if (k >= b || !is_case_w(cb, k, han)) {
        k = u - 1;
        while (k >= s && !is_case_w(cb, k, han)) k--;
        if (k < s) return -1;
    }
    while (k < b && is_case_w(cb, k, han)) k++;
    return k;
}

/* U+W* at s. */
static int match_case_u_w(const struct cpbuf *cb, int s, int b, int han)
{
    if (s >= b || !is_case_u(cb, s, han)) return -1;
    int k = s;
    while (k < b && is_case_u(cb, k, han)) k++;
    while (k < b && is_case_w(cb, k, han)) k++;
    return k;
}

/* P?U*W+C? | P?U+W*C? | \p{N}{1,max} | ?[^\s\p{L}\p{N}]+[\r\n/]* | whitespace, with P the word prefix
 * class and C an optional contraction (opts PRETOK_OPT_CONTR). */
static int match_case(const struct cpbuf *cb, int p, int b, int max_digits, int opts)
{
    int han = (opts & PRETOK_OPT_HAN) != 0, pre = is_word_prefix(cb, p) && p + 1 < b, e = -1;
    if (han && ucat_is_han(cb->cp[p])) {
        e = p + 1;
        while (e < b && ucat_is_han(cb->cp[e])) e++;
        return e;
    }
    for (int alt = 0; alt < 2 && e < 0; alt++) {
        int (*body)(const struct cpbuf *, int, int, int) = alt == 0 ? match_case_uw : match_case_u_w;
        if (pre) e = body(cb, p + 1, b, han);
        if (e < 0) e = body(cb, p, b, han);
    }
    if (e > 0) {
        int c = (opts & PRETOK_OPT_CONTR) && e < b ? match_contraction(cb, e, b, 1) : -1;
        return c > 0 ? c : e;
    }
    if ((e = match_digits(cb, p, b, max_digits)) > 0) return e;
    if ((e = match_other(cb, p, b, han ? 1 : 2, 0)) > 0) return e;
    return match_space(cb, p, b, 1);
}

/* [!-/:-@[-`{-~][A-Za-z]+ | [^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+ |  ?[\p{P}\p{S}]+[\r\n]* | whitespace. */
static int match_dsv3(const struct cpbuf *cb, int p, int b)
{
    uint32_t c = cb->cp[p];
    int ascii_punct =
        (c >= '!' && c <= '/') || (c >= ':' && c <= '@') || (c >= '[' && c <= '`') || (c >= '{' && c <= '~');
    if (ascii_punct && p + 1 < b && (lower_ascii(cb->cp[p + 1]) - 'a') < 26u) {
        int k = p + 1;
        while (k < b && (lower_ascii(cb->cp[k]) - 'a') < 26u) k++;
        return k;
    }
    int word = UCAT_LETTER | UCAT_MARK, ps = UCAT_PUNCT | UCAT_SYMBOL;
    int pre = c != '\r' && c != '\n' && !(cb->fl[p] & (UCAT_LETTER | ps));
    if ((cb->fl[p] & word) || (pre && p + 1 < b && (cb->fl[p + 1] & word))) {
        int k = p + 1;
        while (k < b && (cb->fl[k] & word)) k++;
        return k;
    }
    int k = (c == ' ' && p + 1 < b && (cb->fl[p + 1] & ps)) ? p + 1 : p;
    if (cb->fl[k] & ps) {
        while (k < b && (cb->fl[k] & ps)) k++;
        while (k < b && (cb->cp[k] == '\r' || cb->cp[k] == '\n')) k++;
        return k;
    }
    return match_space(cb, p, b, 1);
}

/* A run of '\n' or a run of anything else. */
static int match_lines(const struct cpbuf *cb, int p, int b)
{
    int nl = cb->cp[p] == '\n', k = p + 1;
    while (k < b && (cb->cp[k] == '\n') == nl) k++;
    return k;
}

static int match_simple(const struct pretok_stage *st, const struct cpbuf *cb, int p, int b)
{
    for (int pass = 0; pass < 2; pass++) {
        int q = p;
        if (pass == 0) {
            if (!st->prefix) continue;
            if (st->prefix == 1 ? cb->cp[p] != ' ' : !IS_WS(p)) continue;
            q = p + 1;
        }
        int k = q;
        while (k < b && (st->qmax < 0 || k - q < st->qmax) && cclass_has(st->cls, cb->cp[k], cb->fl[k])) k++;
        if (k - q < st->qmin) continue;
        if (st->anchor_end && k != b) continue;
        return k;
    }
    return -1;
}

/* '▁' followed by everything up to the next '▁' (HF Metaspace split, MergedWithNext). */
static int match_metaspace(const struct cpbuf *cb, int p, int b)
{
    if (cb->cp[p] != 0x2581) return -1;
    int k = p + 1;
    while (k < b && cb->cp[k] != 0x2581) k++;
    return k;
}

/* The end of the stage's match at p (the piece ends at b), or <= p when it does not match there. */
static int match_stage(const struct pretok_stage *st, const struct cpbuf *cb, int p, int b)
{
    switch (st->kind) {
    case PRETOK_KIND_GPT2:
        return match_gpt2(cb, p, b);
    case PRETOK_KIND_LLAMA3:
        return match_llama3(cb, p, b, st->qmax, st->opts);
    case PRETOK_KIND_CASE:
        return match_case(cb, p, b, st->qmax, st->opts);
    case PRETOK_KIND_LINES:
        return match_lines(cb, p, b);
    case PRETOK_KIND_DSV3:
        return match_dsv3(cb, p, b);
    case PRETOK_KIND_METASPACE:
        return match_metaspace(cb, p, b);
    default:
        return match_simple(st, cb, p, b);
    }
}

int pretok_split(const struct pretok *p, const struct cpbuf *cb, int **ends_out)
{
    int n = cb->n;
    int *ends = malloc((size_t)(n + 1) * sizeof *ends);
    int *tmp = malloc((size_t)(n + 1) * sizeof *tmp);
    if (!ends || !tmp) {
        free(ends);
        free(tmp);
        return FERRY_ERR_NOMEM;
    }
    int n_ends = 0;
    if (n > 0) ends[n_ends++] = n;
    for (int s = 0; s < p->n_stages; s++) {
        const struct pretok_stage *st = &p->stages[s];
        int n_tmp = 0, a = 0;
        for (int i = 0; i < n_ends; i++) {
            int b = ends[i], gap = a;
            for (int q = a; q < b;) {
                int e = match_stage(st, cb, q, b);
                if (e <= q) {
                    q++;
                    continue;
                }
                if (q > gap) tmp[n_tmp++] = q;
                tmp[n_tmp++] = e;
                q = gap = e;
            }
            if (b > gap) tmp[n_tmp++] = b;
            a = b;
        }
        int *sw = ends;
        ends = tmp;
        tmp = sw;
        n_ends = n_tmp;
    }
    free(tmp);
    *ends_out = ends;
    return n_ends;
}
