/* model_names — the names a served model answers to in a request's "model" field and in /v1/models/ID.
 *
 * The first name is the model's id (what answers and /v1/models show): --served-model-name when given, else
 * the file (or directory) name. The model also answers to its file name, the file name without ".gguf", the
 * name before the first '.' (the stem without a quantization suffix: "SmolLM2-135M-Instruct" for
 * "SmolLM2-135M-Instruct.Q4_1.gguf"), and the GGUF's general.name. Names are compared exactly.
 */
#ifndef FERRY_SERVER_MODEL_NAMES_H
#define FERRY_SERVER_MODEL_NAMES_H

#include <string.h>

#define MODEL_NAMES_MAX 6
#define MODEL_NAME_LEN  256

struct model_names {
    int n;
    char name[MODEL_NAMES_MAX][MODEL_NAME_LEN];
    const char *list[MODEL_NAMES_MAX + 1]; /* name[0..n-1], then NULL: what api_ctx.model_aliases points to */
};

/* Fills mn from the model's path, its general.name (NULL or "" if none) and --served-model-name (NULL if not
 * given). Empty and repeated names are left out; names longer than MODEL_NAME_LEN - 1 bytes are cut. */
void model_names_build(struct model_names *mn, const char *path, const char *general_name,
                       const char *served);

/* 1 when name equals one of the NULL-terminated names (or primary, when names is NULL), else 0. Inline: the
 * API parsers use it without linking the rest of the server. */
static inline int model_names_match(const char *primary, const char *const *names, const char *name)
{
    if (!name) return 0;
    if (!names) return primary && !strcmp(primary, name);
    for (int i = 0; names[i]; i++)
        if (!strcmp(names[i], name)) return 1;
    return 0;
}

#endif
