/* imatrix — llama.cpp's importance-matrix files, read as llama-quantize reads them (common/imatrix-loader.cpp
 * and tools/quantize of lcp0336), for `ferry quantize --imatrix`.
 *
 * Two formats. GGUF (what llama-imatrix writes today): per weight matrix X two F32 tensors, X.in_sum2 (ne0
 * x n_expert sums of squared activations) and X.counts (one count per expert, stored as f32 and rounded to an
 * integer); keys imatrix.datasets (string array), imatrix.chunk_count and imatrix.chunk_size (u32), all three
 * required. Each value is sum / count, or 1 for an expert never seen (count 0). Legacy .dat (any file that is
 * not GGUF): i32 n_entries (>= 1), then per entry i32 name length, the name, i32 ncall, i32 nval (>= 1), nval
 * f32 values (already means times ncall: each is divided by ncall when ncall > 0); optionally i32 chunk
 * count, i32 dataset length and the dataset name. A non-finite value is refused, as llama-quantize refuses
 * it. Usage: imatrix_load → imatrix_find per tensor name (exact match) → imatrix_free.
 */
#ifndef FERRY_WEIGHTS_IMATRIX_H
#define FERRY_WEIGHTS_IMATRIX_H

#include <stdbool.h>
#include <stdint.h>

struct imatrix_entry {
    char *name;
    float *w; /* (n) f32: n = ne0 * n_expert of the matrix it weighs; expert e's weights at w + e * ne0 */
    int64_t n;
};

struct imatrix {
    char *path;          /* as given to imatrix_load */
    char *dataset;       /* the first dataset named in the file, or NULL */
    int32_t chunk_count; /* chunks the statistics were collected over; 0 when not recorded */
    bool legacy;         /* read from the .dat format */
    int n_entries;
    struct imatrix_entry *entries; /* sorted by name */
};

/* FERRY_ERR_IO (cannot open), FERRY_ERR_FORMAT (malformed, no entries, missing metadata, a non-finite value),
 * FERRY_ERR_NOMEM; err says which entry or field. */
int imatrix_load(const char *path, struct imatrix **out, char err[256]);
void imatrix_free(struct imatrix *m);

/* The entry named name, or NULL. */
const struct imatrix_entry *imatrix_find(const struct imatrix *m, const char *name);

#endif
