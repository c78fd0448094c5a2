/* reasoning — splits model output into reasoning (a <think>...</think> block at its start) and the answer, as
 * vLLM's and llama.cpp's reasoning parsers do (message.reasoning_content / delta.reasoning_content).
 *
 * The block either opens in the output, or was opened by the prompt (templates whose generation prompt ends
 * with <think>: `started`). While the output grows, a tail that may be the start of a marker is held back,
 * so what the split calls reasoning or answer never changes later: a streaming caller sends the growth.
 * An unclosed block at the end is all reasoning. Works on (ptr, len) views; allocates nothing.
 */
#ifndef FERRY_REASONING_H
#define FERRY_REASONING_H

#include <stddef.h>

struct reasoning_split {
    size_t r_start, r_end; /* reasoning: text[r_start, r_end) (final part; empty when none) */
    size_t a_start, a_end; /* the answer: text[a_start, a_end) (final part) */
};

/* 1 when a rendered prompt ends inside an open <think> block (whitespace after the marker allowed). */
int reasoning_prompt_started(const char *prompt, size_t len);

void reasoning_split(const char *text, size_t len, int started, int final, struct reasoning_split *out);

#endif
