/* regex — a regular-expression subset compiled to a DFA over UTF-8 bytes, for JSON Schema `pattern` and
 * `format` (constrained decoding generates only strings the DFA accepts).
 *
 * Semantics are those of a JSON Schema pattern as Python's re.search applies it: unanchored unless a
 * top-level alternative starts with ^ / ends with $. The DFA accepts a SUBSET of what Python accepts, never
 * more: \d \w \s are their ASCII forms; \D \W \S and negated classes holding a shorthand stay within
 * printable ASCII. Supported: literals (UTF-8), . [...] [^...] ranges, \d\w\s\D\W\S, escapes \n\t\r\f\v
 * \xHH \uHHHH and of punctuation, groups (...) (?:...) (?P<n>...) (?<n>...), | * + ? {n} {n,} {n,m} and their
 * lazy forms. Refused with a message (FERRY_ERR_UNSUPPORTED): lookaround, backreferences, \b \B, anchors
 * inside the pattern, possessive quantifiers, inline flags, POSIX classes. Bounded: pattern length, counted
 * repetition, NFA size and DFA states (FERRY_ERR_RANGE). States that cannot reach acceptance are removed, so
 * every byte the DFA accepts keeps acceptance reachable.
 * Usage: regex_compile(pat, len, &d, err); d->next[s * 256 + byte] ...; regex_free(d).
 */
#ifndef FERRY_REGEX_H
#define FERRY_REGEX_H

#include <stddef.h>
#include <stdint.h>

#define REGEX_DEAD        0xFFFFu
#define REGEX_MAX_PATTERN 1024 /* bytes */
#define REGEX_MAX_REPEAT  256  /* largest n, m of {n,m} */
#define REGEX_MAX_STATES  4096 /* DFA states */

struct regex_dfa {
    int n_states;
    int start;
    uint16_t *next;  /* (n_states, 256) next state, REGEX_DEAD where the byte is refused */
    uint8_t *accept; /* (n_states) 1 where the input so far matches */
    uint32_t *dist;  /* (n_states) fewest bytes from the state to acceptance */
    uint32_t *cmin;  /* (n_states) fewest code points from the state to acceptance */
    uint32_t *cmax;  /* (n_states) most code points from the state to acceptance, REGEX_UNBOUNDED when a
                      * loop lies on the way */
    uint32_t *wdist; /* (n_states) after regex_weigh: least total weight from the state to acceptance,
                      * REGEX_UNBOUNDED when acceptance cannot be reached with the allowed bytes */
};

#define REGEX_UNBOUNDED 0xFFFFFFFFu

/* Compiles pat[0, len). err names the construct and its byte offset on failure. Errors: FERRY_ERR_INVALID
 * (malformed), FERRY_ERR_UNSUPPORTED (outside the subset), FERRY_ERR_RANGE (bounds), FERRY_ERR_NOMEM. A
 * pattern that matches nothing is FERRY_ERR_INVALID. */
int regex_compile(const char *pat, size_t len, struct regex_dfa **out, char err[256]);
void regex_free(struct regex_dfa *d);
/* Fills d->wdist with distances where byte b costs weight[b] (0: the byte is never written). For callers that
 * write some bytes in several (JSON escapes) or not at all. FERRY_ERR_NOMEM on failure. */
int regex_weigh(struct regex_dfa *d, const uint8_t weight[256]);
/* 1 when the whole of s[0, n) is accepted (a test helper; the decoder steps the table itself). */
int regex_match(const struct regex_dfa *d, const char *s, size_t n);

#endif
