/* status — message table for enum ferry_status (see status.h). */
#include "kernels/core/status.h"

#include <stdarg.h>
#include <stdio.h>

static const struct {
    int code;
    const char *msg;
} status_table[] = {
    {FERRY_OK, "ok"},
    {FERRY_ERR_INVALID, "invalid argument"},
    {FERRY_ERR_NOMEM, "out of host memory"},
    {FERRY_ERR_IO, "i/o error"},
    {FERRY_ERR_FORMAT, "malformed file"},
    {FERRY_ERR_UNSUPPORTED, "unsupported"},
    {FERRY_ERR_RANGE, "out of range"},
    {FERRY_ERR_NOT_FOUND, "not found"},
    {FERRY_ERR_CUDA, "CUDA error"},
    {FERRY_ERR_DEVICE_MEM, "out of device memory"},
    {FERRY_ERR_BUSY, "busy"},
    {FERRY_ERR_CANCELLED, "cancelled"},
    {FERRY_ERR_TIMEOUT, "timed out"},
    {FERRY_ERR_INTERNAL, "internal error"},
};

const char *ferry_status_str(int status)
{
    for (unsigned i = 0; i < sizeof status_table / sizeof status_table[0]; i++)
        if (status_table[i].code == status) return status_table[i].msg;
    return "unknown status";
}

int ferry_fail(char *err, int status, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, 256, fmt, ap);
    va_end(ap);
    return status;
}
