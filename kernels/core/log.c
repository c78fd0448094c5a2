/* log — see log.h. The sink is process-global and set once at start-up, before threads exist. */
#include "kernels/core/log.h"

#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>

static ferry_log_fn log_fn;
static void *log_user;
static enum log_level log_max = LOG_LEVEL_INFO;

void ferry_log_set(ferry_log_fn fn, void *user, enum log_level max_level)
{
    log_fn = fn;
    log_user = user;
    log_max = max_level;
}

int ferry_log_enabled(enum log_level level) { return log_fn && level <= log_max; }

void ferry_log(enum log_level level, const char *fmt, ...)
{
    char buf[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    if (log_fn) log_fn(level, buf, log_user);
}

const char *ferry_log_safe(const char *s, char *out, size_t cap)
{
    size_t o = 0;
    for (; *s && o + 5 < cap; s++) {
        unsigned char c = (unsigned char)*s;
        if (c < 0x20 || c >= 0x7f || c == '\\' || c == '"')
            o += (size_t)snprintf(out + o, cap - o, "\\x%02x", c);
        else
            out[o++] = (char)c;
    }
    if (*s && o + 4 <= cap) o += (size_t)snprintf(out + o, cap - o, "...");
    out[o] = 0;
    return out;
}

void ferry_assert_fail(const char *expr, const char *file, int line)
{
    fprintf(stderr, "ferry: assertion failed: %s (%s:%d)\n", expr, file, line);
    abort();
}
