/* dtype — the table of element types (see dtype.h). Block layouts are in quant/blocks.h. */
#include "kernels/core/dtype.h"

static const struct {
    const char *name;
    int block;
    size_t size;
} dtype_table[DTYPE_COUNT] = {
    [DTYPE_F32] = {"F32", 1, 4},       [DTYPE_F16] = {"F16", 1, 2},       [DTYPE_BF16] = {"BF16", 1, 2},
    [DTYPE_Q4_0] = {"Q4_0", 32, 18},   [DTYPE_Q4_1] = {"Q4_1", 32, 20},   [DTYPE_Q8_0] = {"Q8_0", 32, 34},
    [DTYPE_Q5_0] = {"Q5_0", 32, 22},   [DTYPE_Q5_1] = {"Q5_1", 32, 24},   [DTYPE_Q5_K] = {"Q5_K", 256, 176},
    [DTYPE_Q4_K] = {"Q4_K", 256, 144}, [DTYPE_Q6_K] = {"Q6_K", 256, 210},
};

int dtype_valid(uint32_t t)
{
    return t < DTYPE_COUNT && dtype_table[t].name != NULL;
}
const char *dtype_name(enum dtype t)
{
    return dtype_valid(t) ? dtype_table[t].name : "?";
}
int dtype_block_size(enum dtype t)
{
    return dtype_valid(t) ? dtype_table[t].block : 0;
}
size_t dtype_type_size(enum dtype t)
{
    return dtype_valid(t) ? dtype_table[t].size : 0;
}

size_t dtype_row_size(enum dtype t, int64_t n)
{
    if (!dtype_valid(t) || n < 0 || n % dtype_table[t].block) return 0;
    return (size_t)(n / dtype_table[t].block) * dtype_table[t].size;
}
