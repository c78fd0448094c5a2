// SOURCES: runtime/chat/chat_template.c runtime/chat/jinja_value.c runtime/chat/jinja_lex.c
// SOURCES: runtime/chat/jinja_parse.c runtime/chat/jinja_eval.c runtime/chat/jinja_builtins.c
// SOURCES: kernels/core/status.c kernels/core/log.c
// LIBS: -ljansson -lm
/* fuzz_chat_template — libFuzzer target: the input is a chat-template source, rendered over a fixed
 * small conversation with tight bounds. Any crash, sanitizer report, leak or runaway is a bug; render
 * errors are expected and ignored. When the render succeeds, the output length must be consistent. */
#include "runtime/chat_template.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const struct chat_msg conv[] = {
        {"system", "You are helpful."},
        {"user", "Hi ü 🤖  "},
        {"assistant", " Hello! "},
        {"user", ""},
    };
    char *tmpl = malloc(size + 1);
    if (!tmpl) return 0;
    memcpy(tmpl, data, size);
    tmpl[size] = 0;
    struct chat_template_params p = chat_template_default_params();
    p.max_output = 1 << 16;
    p.max_memory = 16 << 20;
    p.max_steps = 200000;
    char *out = NULL, err[256];
    size_t out_len = 0;
    int rc = chat_template_render_ex(tmpl, conv, 4, (int)(size & 1), "<s>", "</s>", &p, &out, &out_len, err);
    if (rc == 0) {
        if (!out || strlen(out) > out_len || out_len > p.max_output) __builtin_trap();
    } else if (out || !memchr(err, 0, 256)) {
        __builtin_trap();
    }
    free(out);
    free(tmpl);
    return 0;
}
