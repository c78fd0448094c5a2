/* iq_lattice — grid maps and neighbour lists of the i-quant lattices (see iq_lattice.h). */
#include "quant/iq_lattice.h"

#include <float.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "quant/iq_tables.h"
#include "quant/rounding.h"

static struct iq_lattice lattices[IQ_LATTICE_COUNT];
static bool built_ok[IQ_LATTICE_COUNT];
static pthread_once_t once[IQ_LATTICE_COUNT] = {PTHREAD_ONCE_INIT, PTHREAD_ONCE_INIT, PTHREAD_ONCE_INIT,
                                                PTHREAD_ONCE_INIT, PTHREAD_ONCE_INIT, PTHREAD_ONCE_INIT};

/* Per lattice: points, elements per group, bits per level, the highest level the quantizer forms, and how
 * many distinct nearest distances make the neighbour list. */
static const struct {
    int n_points, width, bits, lmax, nwant;
} shape[IQ_LATTICE_COUNT] = {
    [IQ_LATTICE_2XXS] = {256, 8, 2, 2, 2}, [IQ_LATTICE_2XS] = {512, 8, 2, 2, 2},
    [IQ_LATTICE_2S] = {1024, 8, 2, 2, 1},  [IQ_LATTICE_3XXS] = {256, 4, 3, 7, 2},
    [IQ_LATTICE_3S] = {512, 4, 3, 7, 3},   [IQ_LATTICE_1S] = {2048, 8, 2, 2, 3},
};

/* Element k of grid point p as a level. The dequantization grids hold IQ2 levels as 8, 25, 43, IQ3_XXS's as
 * 4, 12, ..., 52, 62 and IQ3_S's as 2 l + 1. */
static uint8_t grid_level(enum iq_lattice_kind kind, int p, int k)
{
    uint8_t b;
    switch (kind) {
    case IQ_LATTICE_2XXS:
        b = iq_grid8(iq2xxs_grid[p], k);
        return b < 16 ? 0 : b < 34 ? 1 : 2;
    case IQ_LATTICE_2XS:
        b = iq_grid8(iq2xs_grid[p], k);
        return b < 16 ? 0 : b < 34 ? 1 : 2;
    case IQ_LATTICE_2S:
        b = iq_grid8(iq2s_grid[p], k);
        return b < 16 ? 0 : b < 34 ? 1 : 2;
    case IQ_LATTICE_1S:
        return (uint8_t)((int8_t)iq_grid8(iq1s_grid[p], k) + 1);
    case IQ_LATTICE_3XXS:
        b = (uint8_t)(iq3xxs_grid[p] >> (8 * k));
        return (uint8_t)((b + 4) / 8 - 1);
    default:
        b = (uint8_t)(iq3s_grid[p] >> (8 * k));
        return (uint8_t)((b - 1) / 2);
    }
}

static bool build(enum iq_lattice_kind kind, struct iq_lattice *L)
{
    const int nwant = shape[kind].nwant, lmax = shape[kind].lmax;
    *L = (struct iq_lattice){
        .n_points = shape[kind].n_points, .width = shape[kind].width, .bits = shape[kind].bits};
    const int n_pat = 1 << L->bits * L->width;
    L->level = malloc(sizeof *L->level * (size_t)L->n_points);
    L->map = malloc(sizeof *L->map * (size_t)n_pat);
    L->first = calloc((size_t)n_pat, sizeof *L->first);
    L->count = calloc((size_t)n_pat, sizeof *L->count);
    int *d2 = malloc(sizeof *d2 * (size_t)L->n_points);
    size_t cap = 1 << 16, used = 0;
    L->nb = malloc(sizeof *L->nb * cap);
    if (!L->level || !L->map || !L->first || !L->count || !d2 || !L->nb) goto fail;
    memset(L->map, 0xff, sizeof *L->map * (size_t)n_pat);
    for (int p = 0; p < L->n_points; p++) {
        int u = 0;
        for (int k = 0; k < L->width; k++) {
            L->level[p][k] = grid_level(kind, p, k);
            u |= L->level[p][k] << L->bits * k;
        }
        L->map[u] = (int16_t)p;
    }
    const int mask = (1 << L->bits) - 1;
    for (int u = 0; u < n_pat; u++) {
        bool reachable = true; /* the quantizers form levels 0..lmax only */
        for (int k = 0; k < L->width; k++) reachable &= ((u >> L->bits * k) & mask) <= lmax;
        if (!reachable || L->map[u] >= 0) continue;
        int dmin[3] = {INT32_MAX, INT32_MAX, INT32_MAX}; /* the nwant smallest distinct distances */
        for (int p = 0; p < L->n_points; p++) {
            int d = 0;
            for (int k = 0; k < L->width; k++) {
                const int diff = 2 * (L->level[p][k] - ((u >> L->bits * k) & mask));
                d += diff * diff;
            }
            d2[p] = d;
            for (int j = 0; j < nwant; j++) {
                if (d == dmin[j]) break;
                if (d < dmin[j]) {
                    for (int m = nwant - 1; m > j; m--) dmin[m] = dmin[m - 1];
                    dmin[j] = d;
                    break;
                }
            }
        }
        L->first[u] = (int32_t)used;
        for (int j = 0; j < nwant && dmin[j] != INT32_MAX; j++)
            for (int p = 0; p < L->n_points; p++) {
                if (d2[p] != dmin[j]) continue;
                if (used == cap) {
                    uint16_t *g = realloc(L->nb, sizeof *g * cap * 2);
                    if (!g) goto fail;
                    L->nb = g, cap *= 2;
                }
                L->nb[used++] = (uint16_t)p;
            }
        L->count[u] = (uint16_t)(used - (size_t)L->first[u]);
    }
    free(d2);
    return true;
fail:
    free(d2);
    return false;
}

#define BUILDER(k)                                                                                           \
    static void build_##k(void)                                                                              \
    {                                                                                                        \
        built_ok[k] = build(k, &lattices[k]);                                                                \
    }
BUILDER(IQ_LATTICE_2XXS)
BUILDER(IQ_LATTICE_2XS)
BUILDER(IQ_LATTICE_2S)
BUILDER(IQ_LATTICE_3XXS)
BUILDER(IQ_LATTICE_3S)
BUILDER(IQ_LATTICE_1S)

const struct iq_lattice *iq_lattice_get(enum iq_lattice_kind kind)
{
    static void (*const builders[IQ_LATTICE_COUNT])(void) = {build_IQ_LATTICE_2XXS, build_IQ_LATTICE_2XS,
                                                             build_IQ_LATTICE_2S,   build_IQ_LATTICE_3XXS,
                                                             build_IQ_LATTICE_3S,   build_IQ_LATTICE_1S};
    if ((unsigned)kind >= IQ_LATTICE_COUNT) return NULL;
    pthread_once(&once[kind], builders[kind]);
    return built_ok[kind] ? &lattices[kind] : NULL;
}

int iq_lattice_nearest(const struct iq_lattice *lat, int u, const float *xval, const float *w, float scale,
                       int8_t *L)
{
    float best = FLT_MAX;
    int bi = lat->count[u] ? lat->nb[lat->first[u]] : 0;
    for (int j = 0; j < lat->count[u]; j++) {
        const int p = lat->nb[lat->first[u] + j];
        float d2 = 0;
        for (int i = 0; i < lat->width; i++) {
            const float diff = scale * (float)(2 * lat->level[p][i] + 1) - xval[i];
            d2 += w[i] * diff * diff;
        }
        if (d2 < best) best = d2, bi = p;
    }
    for (int i = 0; i < lat->width; i++) L[i] = (int8_t)lat->level[bi][i];
    return bi;
}

int iq_lattice_levels(const struct iq_lattice *lat, const float *xval, float id, int lmax, int8_t *L)
{
    int u = 0;
    for (int i = 0; i < lat->width; i++) {
        L[i] = (int8_t)clamp_int(nearest_int(0.5f * (id * xval[i] - 1)), 0, lmax);
        u |= L[i] << lat->bits * i;
    }
    return u;
}
