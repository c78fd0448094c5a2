/* web_assets — the web page's files, embedded in the binary at build time (server/web/embed.py writes the
 * table from the files of server/web). Paths start with '/'; "/" serves "/index.html". The page is public (it
 * holds no data); the endpoints it calls take the API key like every other. */
#ifndef FERRY_SERVER_WEB_ASSETS_H
#define FERRY_SERVER_WEB_ASSETS_H

#include <stddef.h>

struct web_asset {
    const char *path;
    const char *content_type;
    const unsigned char *data; /* (len) bytes, NUL after them */
    size_t len;
};

extern const struct web_asset web_assets[]; /* ends with a NULL path */

/* The asset served at path, or NULL. */
static inline const struct web_asset *web_asset_find(const char *path)
{
    if (path[0] == '/' && path[1] == 0) path = "/index.html";
    for (const struct web_asset *a = web_assets; a->path; a++)
        if (!__builtin_strcmp(a->path, path)) return a;
    return 0;
}

#endif
