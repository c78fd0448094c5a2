/* mapfile — a whole file mapped read-only into memory (the storage under the GGUF and safetensors readers).
 *
 * mapfile_open maps a regular file with PROT_READ/MAP_PRIVATE; `data` stays valid until mapfile_close.
 * An empty file is mapped as data == NULL, size == 0 (readers reject it by its size).
 * mapfile_close accepts a zeroed or half-built struct and can be called twice.
 */
#ifndef FERRY_MAPFILE_H
#define FERRY_MAPFILE_H

#include <stddef.h>

struct mapfile {
    const void *data; /* (size) bytes, read-only, or NULL when size == 0 */
    size_t size;      /* bytes */
};

/* FERRY_OK, or FERRY_ERR_IO / FERRY_ERR_NOT_FOUND with err naming the path and the failing call. */
int mapfile_open(const char *path, struct mapfile *out, char err[256]);
void mapfile_close(struct mapfile *m);

/* err = "<base name of path>: <msg>", the form every reader's open-time error takes. */
void mapfile_name_error(const char *path, const char *msg, char err[256]);

/* Reads a whole small file (configs) into a NUL-terminated heap buffer of at most max_bytes; *len gets its
 * length. FERRY_ERR_NOT_FOUND when absent, FERRY_ERR_RANGE when larger than max_bytes. */
int mapfile_read_small(const char *path, size_t max_bytes, char **out, size_t *len, char err[256]);

#endif
