/* harmony — the output of gpt-oss models (OpenAI's "harmony" format) split into reasoning, content and tool
 * calls, as OpenAI's and llama.cpp's parsers read it.
 *
 * The answer is a run of messages, each `[<|start|>ROLE] HEADER <|message|> BODY END`, where the first
 * message's `<|start|>assistant` was written by the prompt. HEADER holds `<|channel|>NAME` (the last one
 * counts), an optional recipient ` to=functions.F` (in the role part or after the channel) and an optional
 * ` <|constrain|>json`. END is `<|end|>` (another message follows), `<|call|>` (after a tool call),
 * `<|return|>` (the end), or the end of the text. Channels map as:
 *   analysis                 → reasoning (HARMONY_REASONING), else its header, body and `<|end|>` stay in
 *                              content as written (llama.cpp's reasoning_format none)
 *   to=functions.F (any)     → a call of F whose arguments are the body (a JSON object); a body that is not
 *                              one is content. Without HARMONY_CALLS, for other recipients (built-in tools
 *                              such as `python`) and for names outside [A-Za-z0-9_.-]{1,64}, the message
 *                              is dropped, as llama.cpp drops them.
 *   final, commentary, other → content
 * Text where a header should start but none does is content up to the next marker; a message of another
 * role (the model writing a tool's answer) ends the parse. A body ends at the first <|start|>, <|channel|>,
 * <|end|>, <|return|> or <|call|>, so none of those reaches reasoning or content (but in the reasoning-off
 * case above).
 * Streaming: the parse of any prefix (final 0) gives reasoning and content that are prefixes of the whole
 * parse's and calls that are its first ones: a tail that may be the start of a marker is held back, and a
 * call is held until its END. Reads (ptr, len); the result is copied (harmony_parse_free).
 */
#ifndef FERRY_HARMONY_H
#define FERRY_HARMONY_H

#include <stddef.h>

#include "runtime/tool_call.h"

enum harmony_flags {
    HARMONY_REASONING = 1, /* analysis messages → reasoning (else raw in content) */
    HARMONY_CALLS = 2      /* messages to functions.F → calls (else dropped) */
};

struct harmony_parse {
    char *reasoning; /* [r_len] NUL-terminated, malloc'd */
    size_t r_len;
    char *content; /* [c_len] NUL-terminated, malloc'd */
    size_t c_len;
    struct tool_parse calls; /* complete calls in order; calls.content_end is unused (0) */
};

/* 1 when a chat template writes harmony messages (as llama.cpp detects gpt-oss: it holds `<|channel|>`). */
int harmony_template_is(const char *tmpl);

/* Parses text[0, len) (control tokens kept in the text). flags: enum harmony_flags. Returns 0 or
 * FERRY_ERR_NOMEM (out is then empty). */
int harmony_parse(const char *text, size_t len, int final, int flags, struct harmony_parse *out);
void harmony_parse_free(struct harmony_parse *p);

#endif
