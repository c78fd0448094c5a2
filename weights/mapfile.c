/* mapfile — see mapfile.h. */
#include "weights/mapfile.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kernels/core/status.h"

int mapfile_open(const char *path, struct mapfile *out, char err[256])
{
    memset(out, 0, sizeof *out);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        int e = errno;
        snprintf(err, 256, "%s: open: %s", path, strerror(e));
        return e == ENOENT ? FERRY_ERR_NOT_FOUND : FERRY_ERR_IO;
    }
    struct stat st;
    if (fstat(fd, &st) != 0) {
        snprintf(err, 256, "%s: fstat: %s", path, strerror(errno));
        close(fd);
        return FERRY_ERR_IO;
    }
    if (!S_ISREG(st.st_mode)) {
        snprintf(err, 256, "%s: not a regular file", path);
        close(fd);
        return FERRY_ERR_IO;
    }
    if (st.st_size == 0) {
        close(fd);
        return FERRY_OK;
    }
    void *p = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    int e = errno;
    close(fd);
    if (p == MAP_FAILED) {
        snprintf(err, 256, "%s: mmap of %lld bytes: %s", path, (long long)st.st_size, strerror(e));
        return FERRY_ERR_IO;
    }
    out->data = p;
    out->size = (size_t)st.st_size;
    return FERRY_OK;
}

void mapfile_close(struct mapfile *m)
{
    if (!m) return;
    if (m->data) munmap((void *)m->data, m->size);
    m->data = NULL;
    m->size = 0;
}

int mapfile_read_small(const char *path, size_t max_bytes, char **out, size_t *len, char err[256])
{
    *out = NULL;
    *len = 0;
    FILE *f = fopen(path, "rb");
    if (!f) {
        int e = errno;
        snprintf(err, 256, "%s: open: %s", path, strerror(e));
        return e == ENOENT ? FERRY_ERR_NOT_FOUND : FERRY_ERR_IO;
    }
    char *buf = NULL;
    size_t n = 0, cap = 0;
    int rc = FERRY_OK;
    for (;;) {
        if (n == cap) {
            size_t ncap = cap ? cap * 2 : 4096;
            if (ncap > max_bytes + 1) ncap = max_bytes + 1;
            if (ncap <= n) {
                snprintf(err, 256, "%s: larger than %zu bytes", path, max_bytes);
                rc = FERRY_ERR_RANGE;
                break;
            }
            char *nb = realloc(buf, ncap + 1);
            if (!nb) {
                snprintf(err, 256, "%s: out of memory", path);
                rc = FERRY_ERR_NOMEM;
                break;
            }
            buf = nb;
            cap = ncap;
        }
        size_t got = fread(buf + n, 1, cap - n, f);
        n += got;
        if (got == 0) {
            if (ferror(f)) {
                snprintf(err, 256, "%s: read error", path);
                rc = FERRY_ERR_IO;
            }
            break;
        }
    }
    fclose(f);
    if (rc == FERRY_OK && n > max_bytes) {
        snprintf(err, 256, "%s: larger than %zu bytes", path, max_bytes);
        rc = FERRY_ERR_RANGE;
    }
    if (rc != FERRY_OK) {
        free(buf);
        return rc;
    }
    if (!buf) buf = malloc(1);
    if (!buf) {
        snprintf(err, 256, "%s: out of memory", path);
        return FERRY_ERR_NOMEM;
    }
    buf[n] = '\0';
    *out = buf;
    *len = n;
    return FERRY_OK;
}

void mapfile_name_error(const char *path, const char *msg, char err[256])
{
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    snprintf(err, 256, "%.60s: %.190s", base, msg);
}
