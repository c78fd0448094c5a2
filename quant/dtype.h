/* dtype — the one table of tensor element types: for each type its name, block shape, row conversions to and
 * from f32, and hints for backends (ggml's type traits are the model).
 *
 * Types are numbered as GGUF numbers them (ggml_type). A row of n elements (ne0) is stored as n / block_size
 * blocks of type_size bytes; n must be a multiple of the block size. Plain types (F32, F16, BF16) have block
 * size 1. Only the types listed here are accepted; anything else in a file is refused by its reader.
 * Everything that depends on the type alone is a field here; code that needs a per-type choice reads the
 * table instead of switching on the type. Backends keep their own per-type tables of kernels beside the
 * kernels (kernels/cpu/matmul.c), indexed by enum dtype.
 *
 * quant/ sits below every other module and depends on nothing else in ferry: its functions report failure
 * as false (bool), never as a ferry status, and callers turn that into the status their context calls for.
 */
#ifndef FERRY_QUANT_DTYPE_H
#define FERRY_QUANT_DTYPE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum dtype {
    DTYPE_F32 = 0,
    DTYPE_F16 = 1,
    DTYPE_Q4_0 = 2,
    DTYPE_Q4_1 = 3,
    DTYPE_Q5_0 = 6,
    DTYPE_Q5_1 = 7,
    DTYPE_Q8_0 = 8,
    DTYPE_Q2_K = 10,
    DTYPE_Q3_K = 11,
    DTYPE_Q4_K = 12,
    DTYPE_Q5_K = 13,
    DTYPE_Q6_K = 14,
    DTYPE_IQ2_XXS = 16,
    DTYPE_IQ2_XS = 17,
    DTYPE_IQ3_XXS = 18,
    DTYPE_IQ1_S = 19,
    DTYPE_IQ4_NL = 20,
    DTYPE_IQ3_S = 21,
    DTYPE_IQ2_S = 22,
    DTYPE_IQ4_XS = 23,
    DTYPE_IQ1_M = 29,
    DTYPE_BF16 = 30,
    DTYPE_MXFP4 = 39,
    DTYPE_NVFP4 = 40,
    DTYPE_COUNT = 41, /* one past the largest id; not a type */
};

/* src holds n elements of the type (n a multiple of its block size); dst (n) f32. */
typedef void (*dtype_to_f32_fn)(const void *src, float *dst, int64_t n);
/* src (n) f32; dst receives n elements of the type (n a multiple of its block size). */
typedef void (*dtype_from_f32_fn)(const float *src, void *dst, int64_t n);
/* The same for one whole row of n elements, weighing column j by qw[j] (an importance matrix). */
typedef void (*dtype_from_f32_w_fn)(const float *src, void *dst, int64_t n, const float *qw);

struct dtype_traits {
    const char *name;  /* ggml's name: "F16", "Q4_K" */
    int block_size;    /* elements per block: 1, 32, 64 or 256 */
    size_t type_size;  /* bytes per block */
    bool is_quantized; /* a block format (integer codes and scales), not a plain float type */
    /* Exact conversion to f32, bitwise ggml's dequantize_row_* (and gguf-py's); never NULL. */
    dtype_to_f32_fn to_f32;
    /* Round to nearest (F16, BF16: to nearest even) or ggml's reference quantizer quantize_row_*_ref without
     * an importance matrix, byte for byte; IQ4_NL and IQ4_XS with llama-quantize's 7-step scale search
     * (quantize_iq4_nl / quantize_iq4_xs without an importance matrix); NULL for the types ferry reads but
     * does not write (NVFP4) or writes only with an importance matrix (IQ1_S, IQ1_M, IQ2_XXS, IQ2_XS, IQ2_S,
     * IQ3_XXS: llama-quantize requires one for them); IQ3_S without weights is ggml's quantize_iq3_s. */
    dtype_from_f32_fn from_f32;
    /* With an importance matrix: byte for byte ggml's quantize_<type> given quant_weights (the K-quants,
     * Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL, IQ4_XS and every IQ3/IQ2/IQ1 type); NULL for the types whose quantizer
     * ignores them (plain types, Q8_0, MXFP4, NVFP4). Takes whole rows: some weigh by the row's mean square.
     */
    dtype_from_f32_w_fn from_f32_w;
    /* Device form: what a backend that has no kernel of its own for this type converts it to at load. The
     * type itself for the plain types and Q8_0; Q8_0 for the other block types (8.5 bits per weight, read
     * by every backend; one more rounding, at most 1/254 of a block's largest value, well below the 4-6 bit
     * type's own error), so the weights stay half the bytes of F16 on the device and across PCIe. */
    enum dtype device_form;
};

/* The traits of t, or NULL when t is not one of the types above. */
const struct dtype_traits *dtype_get_traits(uint32_t t);

/* 1 if t is one of the types above. */
int dtype_valid(uint32_t t);
/* "Q4_K"; "?" for an unknown type. */
const char *dtype_name(enum dtype t);
/* The type called `name` (ggml's spelling, case-insensitive), or -1. */
int dtype_from_name(const char *name);
/* Elements per block (1, 32, 64 or 256); 0 for an unknown type. */
int dtype_block_size(enum dtype t);
/* Bytes per block; 0 for an unknown type. */
size_t dtype_type_size(enum dtype t);
/* Bytes of a row of n elements, or 0 when n is negative or not a multiple of the block size. */
size_t dtype_row_size(enum dtype t, int64_t n);

/* Checked row conversions: dst (n) f32 from src holding n elements of type t, and the reverse (dst must hold
 * dtype_row_size(t, n) bytes). False, and nothing written, for an unknown type, a NULL pointer, or n negative
 * or not a multiple of the block size; dtype_from_f32 also for a type without a quantizer. */
bool dtype_to_f32(enum dtype t, const void *src, float *dst, int64_t n);
bool dtype_from_f32(enum dtype t, const float *src, void *dst, int64_t n);
/* One whole row of n elements with importance weights qw (n): from_f32_w, or from_f32 when the type has no
 * weighted quantizer or qw is NULL (what llama-quantize does). */
bool dtype_from_f32_w(enum dtype t, const float *src, void *dst, int64_t n, const float *qw);

#endif
