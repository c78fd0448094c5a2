/* json_fsm — a byte-level recogniser of one JSON object (RFC 8259 syntax, top-level value an object), for
 * constraining generation to JSON (the API's response_format json_object).
 *
 * The state is a small value type: copy it to try a token's bytes without committing them. json_fsm_feed
 * returns 0 while the bytes so far are a prefix of some valid document and -1 at the first byte that makes
 * that impossible (the state is then unusable). Whitespace is allowed wherever JSON allows it, also after the
 * closing brace; strings take any byte >= 0x20 (UTF-8 is not validated here) and the escapes of RFC 8259.
 * Containers nest at most JSON_FSM_MAX_DEPTH deep.
 */
#ifndef FERRY_JSON_FSM_H
#define FERRY_JSON_FSM_H

#include <stddef.h>
#include <stdint.h>

#define JSON_FSM_MAX_DEPTH 64

struct json_fsm {
    uint64_t arrays; /* bit d: the container at depth d is an array (else an object) */
    uint8_t depth;   /* open containers */
    uint8_t state;   /* lexical state (json_fsm.c) */
    uint8_t aux;     /* string: 1 when the string is a key; \u: hex digits left; literal: index */
    uint8_t lit;     /* literal being matched: 't', 'f' or 'n' */
    uint8_t ws_run;  /* whitespace bytes since the last other byte */
};

void json_fsm_init(struct json_fsm *f);
int json_fsm_feed(struct json_fsm *f, unsigned char c);
/* Feeds n bytes; 0 when all were accepted. */
int json_fsm_feed_bytes(struct json_fsm *f, const char *s, size_t n);
/* 1 once the top-level object is closed (only whitespace may follow). */
int json_fsm_done(const struct json_fsm *f);

#endif
