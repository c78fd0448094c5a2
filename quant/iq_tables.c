/* iq_tables — the tables of quant/iq_tables.h, from the generated initializers. */
#include "quant/iq_tables.h"

#include "quant/iq_grids.h"

const uint64_t iq2xxs_grid[256] = IQ2XXS_GRID_INIT;
const uint64_t iq2xs_grid[512] = IQ2XS_GRID_INIT;
const uint64_t iq2s_grid[1024] = IQ2S_GRID_INIT;
const uint32_t iq3xxs_grid[256] = IQ3XXS_GRID_INIT;
const uint32_t iq3s_grid[512] = IQ3S_GRID_INIT;
const uint64_t iq1s_grid[2048] = IQ1S_GRID_INIT;
const int8_t iq4nl_values[16] = IQ4NL_VALUES_INIT;
const int8_t fp4_values[16] = FP4_VALUES_INIT;
