/* model_names — the names a served model answers to (see model_names.h). */
#include "server/model_names.h"

#include <stdio.h>
#include <string.h>

static void add(struct model_names *mn, const char *s, size_t len)
{
    if (len == 0 || mn->n >= MODEL_NAMES_MAX) return;
    if (len >= MODEL_NAME_LEN) len = MODEL_NAME_LEN - 1;
    for (int i = 0; i < mn->n; i++)
        if (strlen(mn->name[i]) == len && !memcmp(mn->name[i], s, len)) return;
    memcpy(mn->name[mn->n], s, len);
    mn->name[mn->n][len] = 0;
    mn->list[mn->n] = mn->name[mn->n];
    mn->n++;
    mn->list[mn->n] = NULL;
}

void model_names_build(struct model_names *mn, const char *path, const char *general_name, const char *served)
{
    memset(mn, 0, sizeof *mn);
    const char *p = path ? path : "";
    size_t n = strlen(p);
    while (n > 1 && p[n - 1] == '/') n--;
    size_t b = n;
    while (b > 0 && p[b - 1] != '/') b--;
    const char *base = p + b;
    size_t blen = n - b;
    if (served) add(mn, served, strlen(served));
    add(mn, base, blen);
    if (blen > 5 && !memcmp(base + blen - 5, ".gguf", 5)) add(mn, base, blen - 5);
    const char *dot = memchr(base, '.', blen);
    if (dot && dot > base) add(mn, base, (size_t)(dot - base));
    if (general_name) add(mn, general_name, strlen(general_name));
}
