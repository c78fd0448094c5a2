/* gguf_split — a GGUF model written in shards, as llama.cpp's gguf-split and convert_hf_to_gguf.py
 * --split-max-* write one larger than a file limit: NAME-00001-of-0000N.gguf ... NAME-0000N-of-0000N.gguf.
 *
 * Every shard is a whole GGUF file (header, metadata, tensor infos, its own tensors' data), mapped on its
 * own. Each carries split.no (u16, 0-based) and split.count (u16, N); the first also holds the model's
 * metadata and split.tensors.count (i32, the tensors of all shards together). A model is opened by its first
 * shard, and the others are found by name beside it. Invariant of an opened set: N files whose split.no are
 * 0..N-1 in order, every one saying split.count N, no tensor name in two places, split.tensors.count tensors
 * in all. Usage: gguf_open(first) → gguf_split_open(path, first, &s) → gguf_split_n(s), gguf_split_shard(s,
 * i) → gguf_split_close(s) before gguf_close(first).
 */
#ifndef FERRY_GGUF_SPLIT_H
#define FERRY_GGUF_SPLIT_H

struct gguf;
struct gguf_split;

/* `first` was opened from `path`. When it carries no split.count, or split.count 1, *out is NULL (one file).
 * Else opens shards 2..N and checks the set; FERRY_ERR_FORMAT (or the open's error) with err naming the file
 * when a shard is missing or unreadable, is not the one its name says (split.no), counts the shards otherwise
 * (split.count), holds a tensor another holds too, or when `path` is not the first shard or not named as one,
 * or split.tensors.count differs from the tensors found. */
int gguf_split_open(const char *path, const struct gguf *first, struct gguf_split **out, char err[256]);
/* Shards in the set (N >= 2). */
int gguf_split_n(const struct gguf_split *s);
/* Shard i (1 <= i < N; the first is the caller's). */
const struct gguf *gguf_split_shard(const struct gguf_split *s, int i);
void gguf_split_close(struct gguf_split *s); /* accepts NULL */

#endif
