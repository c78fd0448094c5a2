/* gguf_write — writes a GGUF v3 file (the format weights/gguf.h reads), atomically.
 *
 * Layout written: "GGUF", u32 3, u64 n_tensors, u64 n_kv; the metadata entries in the order they were added;
 * the tensor infos { string name, u32 n_dims, u64 ne[n_dims], u32 type, u64 offset } in the order they were
 * declared, offsets counted from the data section with each tensor padded to the alignment; zero padding to
 * the alignment; then each tensor's bytes followed by zero padding to the alignment (the last one too). This
 * is byte for byte what ggml's gguf writer (and so llama-quantize) produces for the same entries and tensors.
 * Usage: gguf_writer_init → kv_* / gguf_writer_tensor (all metadata and tensor infos first) →
 * gguf_writer_open(path) → gguf_writer_data for each tensor in order → gguf_writer_finish. The file is
 * written as PATH.tmp-PID and renamed to PATH only by a successful finish; gguf_writer_free of an unfinished
 * writer removes the temporary file, so PATH is never left half-written.
 * Errors are FERRY_ERR_* with a one-line message in err (256 bytes) naming the file, key or tensor.
 */
#ifndef FERRY_GGUF_WRITE_H
#define FERRY_GGUF_WRITE_H

#include <stddef.h>
#include <stdint.h>

#include "quant/dtype.h"
#include "weights/gguf.h"

struct gguf_writer;

int gguf_writer_init(struct gguf_writer **out, char err[256]);
/* Accepts NULL; removes the temporary file of an unfinished write. */
void gguf_writer_free(struct gguf_writer *w);

/* Metadata. A key may be added once (FERRY_ERR_INVALID otherwise). general.alignment (u32, a power of two)
 * also sets the alignment the writer uses. */
int gguf_writer_kv_raw(struct gguf_writer *w, const void *entry, size_t len, char err[256]); /* gguf_kv_raw */
int gguf_writer_kv_u32(struct gguf_writer *w, const char *key, uint32_t v, char err[256]);
int gguf_writer_kv_i32(struct gguf_writer *w, const char *key, int32_t v, char err[256]);
int gguf_writer_kv_f32(struct gguf_writer *w, const char *key, float v, char err[256]);
int gguf_writer_kv_bool(struct gguf_writer *w, const char *key, int v, char err[256]);
int gguf_writer_kv_str(struct gguf_writer *w, const char *key, const char *s, size_t len, char err[256]);
/* An array of n numbers of elem_type (UINT8..FLOAT64 but not STRING/ARRAY), elements packed little-endian. */
int gguf_writer_kv_arr(struct gguf_writer *w, const char *key, enum gguf_vtype elem_type, const void *data,
                       uint64_t n, char err[256]);
/* An array of n strings: strs[i] of lens[i] bytes. */
int gguf_writer_kv_arr_str(struct gguf_writer *w, const char *key, const char *const *strs,
                           const size_t *lens, uint64_t n, char err[256]);
/* 1 if the key was added. */
int gguf_writer_has_key(const struct gguf_writer *w, const char *key);

/* Declares the next tensor: ne[0] (row length) first, n_dims 1..4, ne[0] a multiple of the type's block.
 * Trailing dimensions of 1 are dropped from what is written (as ggml does), keeping at least one. */
int gguf_writer_tensor(struct gguf_writer *w, const char *name, enum dtype type, int n_dims,
                       const int64_t *ne, char err[256]);
/* Bytes of the declared tensor i. */
size_t gguf_writer_tensor_bytes(const struct gguf_writer *w, int i);

/* Creates the temporary file and writes the header, metadata and tensor infos. */
int gguf_writer_open(struct gguf_writer *w, const char *path, char err[256]);
/* Appends n bytes of tensor data: the tensors in declared order, each exactly its size in total (it may come
 * in several pieces); the padding is added when a tensor is complete. */
int gguf_writer_data(struct gguf_writer *w, const void *data, size_t n, char err[256]);
/* Checks that every tensor was written, flushes, syncs and renames the file into place. */
int gguf_writer_finish(struct gguf_writer *w, char err[256]);

#endif
