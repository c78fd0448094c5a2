/* status — the one status enum of ferry and its message table.
 *
 * Every fallible function returns `int`: 0 (FERRY_OK) or a negative `enum ferry_status`.
 * Messages come from one table (status.c); server/ maps codes to HTTP statuses in one function.
 * It lives at the bottom layer (kernels/core) so that every module can use it.
 */
#ifndef FERRY_STATUS_H
#define FERRY_STATUS_H

enum ferry_status {
    FERRY_OK = 0,
    FERRY_ERR_INVALID = -1,     /* bad argument or value given by the caller/user */
    FERRY_ERR_NOMEM = -2,       /* host allocation failed */
    FERRY_ERR_IO = -3,          /* open/read/mmap failed */
    FERRY_ERR_FORMAT = -4,      /* a file is malformed, truncated or hostile */
    FERRY_ERR_UNSUPPORTED = -5, /* valid but not implemented (architecture, dtype, template feature) */
    FERRY_ERR_RANGE = -6,       /* a size or index is out of bounds (context full, too many tokens) */
    FERRY_ERR_NOT_FOUND = -7,   /* a named key, tensor or file is absent */
    FERRY_ERR_CUDA = -8,        /* a CUDA or cuBLAS call failed */
    FERRY_ERR_DEVICE_MEM = -9,  /* device memory exhausted or budget too small */
    FERRY_ERR_BUSY = -10,       /* queue full, try again later */
    FERRY_ERR_CANCELLED = -11,  /* the request was cancelled */
    FERRY_ERR_TIMEOUT = -12,
    FERRY_ERR_INTERNAL = -13,   /* a bug */
};

/* A static string for a status code; never NULL. */
const char *ferry_status_str(int status);

/* Fills err (256 bytes, the size every `char err[256]` parameter has) with a formatted one-line message and
 * returns status: `return ferry_fail(err, FERRY_ERR_FORMAT, "tensor %s: ...", name);` */
int ferry_fail(char *err, int status, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

#endif
