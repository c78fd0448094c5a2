/* safetensors — a bounds-checked reader of Hugging Face safetensors files, single or sharded.
 *
 * Format: u64 little-endian N, then N bytes of a JSON object (may be padded with spaces), then the data
 * section. Each JSON entry other than "__metadata__" (an object of string -> string) is
 * name -> {"dtype": "F32"|"F16"|"BF16"|..., "shape": [d0, d1, ...], "data_offsets": [begin, end]} with
 * offsets relative to the data section, end - begin == prod(shape) * sizeof(dtype), ranges not overlapping.
 * A sharded checkpoint has model.safetensors.index.json: {"weight_map": {tensor name: shard file name}}.
 * The file is mmapped read-only; tensor data borrows the mapping and stays valid until safetensors_close().
 * Names and metadata are owned copies, valid for the same time. Nothing is trusted before it is checked.
 */
#ifndef FERRY_SAFETENSORS_H
#define FERRY_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#define ST_MAX_DIMS   8
#define ST_MAX_HEADER (100u * 1024 * 1024) /* bytes; larger JSON headers are rejected */

struct safetensors;

struct st_tensor {
    const char *name;           /* NUL-terminated, owned by the safetensors */
    char dtype_str[12];         /* as written in the file: "F32", "BF16", "I64", ... */
    int dtype;                  /* enum dtype for F32/F16/BF16; -1 for the other safetensors dtypes */
    int n_dims;                 /* 0..ST_MAX_DIMS (0 is a scalar) */
    int64_t shape[ST_MAX_DIMS]; /* file order: shape[0] is the outermost dimension; >= 0 */
    const void *data;           /* (nbytes) borrowed from the mapping */
    uint64_t offset;            /* byte offset of data in the file */
    size_t nbytes;
};

int safetensors_open(const char *path, struct safetensors **out, char err[256]);
/* Same over a caller-owned buffer that must outlive the object (fuzzing, tests). */
int safetensors_open_mem(const void *buf, size_t size, struct safetensors **out, char err[256]);
void safetensors_close(struct safetensors *st); /* accepts NULL */

int safetensors_n_tensors(const struct safetensors *st);
const struct st_tensor *safetensors_tensor(const struct safetensors *st, int i);
const struct st_tensor *safetensors_find(const struct safetensors *st, const char *name);
/* A "__metadata__" value, or NULL. */
const char *safetensors_metadata(const struct safetensors *st, const char *key);
size_t safetensors_file_size(const struct safetensors *st);

/* model.safetensors.index.json, parsed: the distinct shard files and which one holds each tensor. */
struct st_index {
    int n_files;
    char **files; /* (n_files) plain file names (no '/', never "." or ".."), owned */
    int n_entries;
    char **names; /* (n_entries) tensor names, owned */
    int *file_of; /* (n_entries) index into files */
};
int st_index_parse(const char *json, size_t len, struct st_index *out, char err[256]);
void st_index_free(struct st_index *ix); /* accepts a zeroed or half-built struct */

#endif
