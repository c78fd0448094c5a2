/* log — level-checked logging through a callback the program installs.
 *
 * Library code (runtime/, weights/, kernels/, quant/) logs with FLOG_*(fmt, ...); nothing is printed
 * unless the program installs a sink with ferry_log_set() (server/main.c does, to stderr).
 * The level check happens before the arguments are formatted.
 */
#ifndef FERRY_LOG_H
#define FERRY_LOG_H

#include <stddef.h>

enum log_level { LOG_LEVEL_ERROR = 0, LOG_LEVEL_WARN = 1, LOG_LEVEL_INFO = 2, LOG_LEVEL_DEBUG = 3 };

typedef void (*ferry_log_fn)(enum log_level level, const char *msg, void *user);

void ferry_log_set(ferry_log_fn fn, void *user, enum log_level max_level);
int ferry_log_enabled(enum log_level level);
void ferry_log(enum log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* s for a log line, in out (cap bytes, at least 8): bytes outside printable ASCII, '\\' and '"' written \xHH
 * (a %0a in a client's path decodes to a newline that would forge a line); "..." when cut. Returns out. */
const char *ferry_log_safe(const char *s, char *out, size_t cap);

#define FLOG(level, ...)                                                                                     \
    do {                                                                                                     \
        if (ferry_log_enabled(level)) ferry_log(level, __VA_ARGS__);                                         \
    } while (0)
#define FLOG_ERROR(...) FLOG(LOG_LEVEL_ERROR, __VA_ARGS__)
#define FLOG_WARN(...) FLOG(LOG_LEVEL_WARN, __VA_ARGS__)
#define FLOG_INFO(...) FLOG(LOG_LEVEL_INFO, __VA_ARGS__)
#define FLOG_DEBUG(...) FLOG(LOG_LEVEL_DEBUG, __VA_ARGS__)

/* ASSERT is for bugs only: never for anything a user or a file can cause. */
#define ASSERT(cond)                                                                                         \
    do {                                                                                                     \
        if (!(cond)) ferry_assert_fail(#cond, __FILE__, __LINE__);                                           \
    } while (0)
void ferry_assert_fail(const char *expr, const char *file, int line) __attribute__((noreturn));

#endif
