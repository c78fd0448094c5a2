/* iq_lattice — the lattices of the i-quant quantizers (internal to quant/): which level patterns are grid
 * points and, for a pattern that is not, its nearest grid points (ggml's iq2xs_init_impl / iq3xs_init_impl).
 *
 * A group of `width` elements (8 for the IQ2 types, 4 for IQ3_XXS and IQ3_S) is quantized to levels l
 * (coordinate 2 l + 1 times the scale), `bits` bits each; the pattern u = sum l_k << (bits k). Grid points
 * come from quant/iq_tables.h (their dequantization grids, read back as levels). The neighbours of an
 * off-grid pattern are the grid points at its `nwant` smallest squared distances, in order of distance and
 * then index, as ggml orders them. Built once per process on first use (pthread_once); iq_lattice_get returns
 * NULL when memory ran out.
 */
#ifndef FERRY_QUANT_IQ_LATTICE_H
#define FERRY_QUANT_IQ_LATTICE_H

#include <stdint.h>

enum iq_lattice_kind {
    IQ_LATTICE_2XXS,
    IQ_LATTICE_2XS,
    IQ_LATTICE_2S,
    IQ_LATTICE_3XXS,
    IQ_LATTICE_3S,
    IQ_LATTICE_1S, /* IQ1_S and IQ1_M: levels 0..2 stand for -1, 0, 1 */
    IQ_LATTICE_COUNT
};

struct iq_lattice {
    int n_points, width, bits;
    uint8_t (*level)[8]; /* (n_points, width) levels of each grid point */
    int16_t *map;        /* (1 << bits * width) grid point of a pattern, or -1 */
    int32_t *first;      /* off-grid pattern u: its neighbours are nb[first[u] .. first[u] + count[u]) */
    uint16_t *count;
    uint16_t *nb;
};

const struct iq_lattice *iq_lattice_get(enum iq_lattice_kind kind);

/* The neighbour of off-grid pattern u nearest xval (width) at scale, distances weighted by w: its levels
 * into L, its index returned (the first of equals). */
int iq_lattice_nearest(const struct iq_lattice *lat, int u, const float *xval, const float *w, float scale,
                       int8_t *L);

/* The levels of xval (width) at inverse scale id, clamped to [0, lmax], into L; returns the pattern. */
int iq_lattice_levels(const struct iq_lattice *lat, const float *xval, float id, int lmax, int8_t *L);

#endif
