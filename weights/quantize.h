/* quantize — writes an opened model (GGUF or Hugging Face directory) as a quantized GGUF: llama-quantize's
 * job, in process.
 *
 * The tensor types follow llama.cpp's mixes (quant/mix.h), the values its reference quantizers (quant/), and
 * the file its layout: metadata first (a GGUF input's entries verbatim, in order, then general.
 * quantization_version = 2 and general.file_type; split.* entries dropped), tensors sorted as llama.cpp sorts
 * them (quant_mix_order), data aligned to 32 bytes. For a GGUF input with F32/F16/BF16 tensors the output is
 * byte for byte llama-quantize's (tests/weights/test_quantize_llama.c). A Hugging Face input is converted as
 * llama.cpp's convert_hf_to_gguf.py would (llama-family metadata, the tokenizer, Q/K rows of llama-arch
 * models permuted to llama.cpp's rotary layout, 1-D tensors in F32) and quantized from its exact values in
 * one step. Tensors already quantized in the input are refused unless the chosen type is theirs (requantizing
 * compounds errors; llama-quantize refuses it too). The output appears at out_path only when complete
 * (gguf_write.h).
 */
#ifndef FERRY_WEIGHTS_QUANTIZE_H
#define FERRY_WEIGHTS_QUANTIZE_H

#include <stdint.h>

#include "quant/matrix.h"
#include "quant/mix.h"
#include "weights/imatrix.h"
#include "weights/model_file.h"

/* Called before each tensor and as its data is written: tensor i of n, named name, from -> to; bytes of
 * output written so far of total (all tensors). */
typedef void (*quantize_progress_fn)(int i, int n, const char *name, enum dtype from, enum dtype to,
                                     uint64_t done, uint64_t total, void *user);

struct quantize_params {
    int ftype;                     /* enum quant_ftype */
    struct quant_runner runner;    /* threads for the conversion (quant/matrix.h); zero: the calling thread */
    quantize_progress_fn progress; /* or NULL */
    void *user;
    /* An importance matrix (weights/imatrix.h), or NULL. As llama-quantize applies it: the entry named as the
     * tensor weighs its rows (per expert for stacked experts) in the types whose quantizers take weights,
     * the mixes switch to their importance-matrix rules, and quantize.imatrix.* metadata is written. */
    const struct imatrix *imatrix;
};

/* A matrix whose rows fit no block of its type falls back as llama-quantize does (quant/mix.h; F16 when no
 * block fits, e.g. 48 columns). FERRY_ERR_INVALID (unknown ftype), FERRY_ERR_UNSUPPORTED (requantization),
 * FERRY_ERR_FORMAT (NaN or infinity in a weight; an expert tensor without a layer; an importance-matrix
 * entry whose length is not the tensor's columns times experts), FERRY_ERR_IO,
 * FERRY_ERR_NOMEM; err names the tensor. */
int quantize_model_file(const struct model_file *mf, const char *out_path, const struct quantize_params *p,
                        char err[256]);

#endif
