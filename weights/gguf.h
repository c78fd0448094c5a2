/* gguf — a bounds-checked reader of GGUF v2/v3 files (ggml's single-file model format).
 *
 * Format (little-endian): "GGUF" u32 version, u64 n_tensors, u64 n_kv; then n_kv of
 * { string key, u32 value_type, value }; then n_tensors of { string name, u32 n_dims, u64 ne[n_dims],
 * u32 ggml_type, u64 offset }; padding to `general.alignment` (default 32); then tensor data, each tensor at
 * data_start + offset. string = u64 len + bytes (no NUL). array = u32 elem_type, u64 n, elems (arrays may
 * nest). v1 (u32 counts) is rejected.
 * The file is mmapped read-only; every view returned (strings, arrays, tensor data) borrows from the mapping
 * and stays valid until gguf_close(). Nothing is trusted before it is checked against the file size.
 */
#ifndef FERRY_GGUF_H
#define FERRY_GGUF_H

#include <stddef.h>
#include <stdint.h>

#include "quant/dtype.h"

enum gguf_vtype {
    GGUF_TYPE_UINT8 = 0,
    GGUF_TYPE_INT8 = 1,
    GGUF_TYPE_UINT16 = 2,
    GGUF_TYPE_INT16 = 3,
    GGUF_TYPE_UINT32 = 4,
    GGUF_TYPE_INT32 = 5,
    GGUF_TYPE_FLOAT32 = 6,
    GGUF_TYPE_BOOL = 7,
    GGUF_TYPE_STRING = 8,
    GGUF_TYPE_ARRAY = 9,
    GGUF_TYPE_UINT64 = 10,
    GGUF_TYPE_INT64 = 11,
    GGUF_TYPE_FLOAT64 = 12,
};

struct gguf;

struct gguf_str {
    const char *ptr; /* not NUL-terminated */
    size_t len;
};

struct gguf_tensor_info {
    struct gguf_str name;
    enum dtype type;
    int n_dims;
    int64_t ne[4]; /* unused dims are 1 */
    const void *data;
    size_t nbytes;
};

int gguf_open(const char *path, struct gguf **out, char err[256]);
/* Same, over a caller-owned buffer (fuzzing, tests); the buffer must outlive the gguf. */
int gguf_open_mem(const void *buf, size_t size, struct gguf **out, char err[256]);
void gguf_close(struct gguf *g);

uint32_t gguf_version(const struct gguf *g);
size_t gguf_file_size(const struct gguf *g);

/* Metadata. Keys are looked up by exact name; index or -1. */
int gguf_n_kv(const struct gguf *g);
int gguf_find_key(const struct gguf *g, const char *key);
struct gguf_str gguf_kv_key(const struct gguf *g, int i);
enum gguf_vtype gguf_kv_type(const struct gguf *g, int i);
/* Bytes of one value of a scalar type, 0 for string and array, -1 for a type GGUF does not define. */
int gguf_vtype_size(uint32_t t);
/* Entry i exactly as the file stores it (key, type and value; GGUF v2 and v3 serialize entries alike), for
 * copying it into another file (weights/gguf_write.h). */
struct gguf_str gguf_kv_raw(const struct gguf *g, int i);
/* The data alignment: general.alignment, default 32. */
size_t gguf_alignment(const struct gguf *g);

/* Typed getters by key: FERRY_OK, FERRY_ERR_NOT_FOUND, or FERRY_ERR_FORMAT for a type that cannot convert.
 * Integer getters accept any integer type whose value fits; gguf_get_f32 accepts f32/f64 and integers. */
int gguf_get_u32(const struct gguf *g, const char *key, uint32_t *out);
int gguf_get_i64(const struct gguf *g, const char *key, int64_t *out);
int gguf_get_f32(const struct gguf *g, const char *key, float *out);
int gguf_get_bool(const struct gguf *g, const char *key, int *out);
int gguf_get_str(const struct gguf *g, const char *key, struct gguf_str *out);

/* Arrays: element type and count; numeric elements are read with gguf_arr_*; strings by index (O(1): the
 * reader indexes string arrays on open). Nested arrays are validated on open; their elements are not
 * exposed beyond their type and count. */
int gguf_get_arr(const struct gguf *g, const char *key, enum gguf_vtype *elem_type, uint64_t *n);
int gguf_arr_str(const struct gguf *g, const char *key, uint64_t i, struct gguf_str *out);
/* Converting copies of numeric arrays into caller buffers of n elements (n from gguf_get_arr). */
int gguf_arr_f32(const struct gguf *g, const char *key, float *out, uint64_t n);
int gguf_arr_i32(const struct gguf *g, const char *key, int32_t *out, uint64_t n);
/* A bool array's n elements as 0/1 (any nonzero byte is 1); FERRY_ERR_FORMAT for another type. */
int gguf_arr_bool(const struct gguf *g, const char *key, uint8_t *out, uint64_t n);

/* Tensors. */
int gguf_n_tensors(const struct gguf *g);
const struct gguf_tensor_info *gguf_tensor(const struct gguf *g, int i);

#endif
