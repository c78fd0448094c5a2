/* chat_template — renders a list of chat messages through a model's Jinja chat template.
 *
 * Implements the Jinja subset that real chat templates use (for/if/elif/else, set, namespace, loop
 * variables, string concatenation and slicing, common filters and tests, raise_exception,
 * add_generation_prompt, bos_token/eos_token); anything else is a clear FERRY_ERR_UNSUPPORTED naming the
 * construct and its byte offset. Built-in templates (chatml, llama2, llama3, mistral, gemma, phi3, zephyr)
 * serve models without one and the --chat-template override. Rendering is bounded in output size and steps.
 */
#ifndef FERRY_CHAT_TEMPLATE_H
#define FERRY_CHAT_TEMPLATE_H

#include <stddef.h>

struct chat_msg {
    const char *role;    /* "system", "user", "assistant", "tool" */
    const char *content; /* UTF-8, NUL-terminated */
};

/* Renders; *out is malloc'd and NUL-terminated. err gets a one-line message on failure. */
int chat_template_render(const char *tmpl, const struct chat_msg *msgs, int n_msgs, int add_generation_prompt,
                         const char *bos_token, const char *eos_token, char **out, size_t *out_len,
                         char err[256]);

/* The source of a built-in template by name, or NULL. */
const char *chat_template_builtin(const char *name);

#endif
