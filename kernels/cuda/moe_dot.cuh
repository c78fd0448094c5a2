/* moe_dot — how the expert GEMV (kernels/cuda/moe.cu) walks one row of a block-type weight: work item i of a
 * row of cols elements is piece i % PPB of block i / PPB; an item adds the exact f32 values of its units
 * (qblock.cuh, bitwise dequant_row's) times x, in element order, to the running sum. A warp's lane takes
 * items lane, lane + 32, ... Host-compilable: tests/cuda/test_qblock.cc checks that a row's items, summed,
 * give the dot product of dequant_row's values with x for every type.
 */
#ifndef FERRY_KERN_CUDA_MOE_DOT_CUH
#define FERRY_KERN_CUDA_MOE_DOT_CUH

#include "kernels/cuda/qblock.cuh"

QB_FN float moe_ldx(const float *p)
{
#ifdef __CUDA_ARCH__
    return __ldg(p);
#else
    return *p;
#endif
}

template <class Q> QB_FN int moe_q_items(int cols)
{
    return cols / Q::QK * Q::PPB;
}

template <class Q> QB_FN float moe_q_item(const uint8_t *row, const float *x, int it, float a)
{
    const int b = it / Q::PPB, p = it - b * Q::PPB;
    typename Q::raw r;
    Q::load(r, row + (size_t)b * Q::BYTES, p);
    QB_UNROLL
    for (int v = 0; v < Q::UPP; v++) {
        qb_unit u;
        Q::unit(r, p, v, u);
        const float *xe = x + (size_t)b * Q::QK + Q::unit_elem(p, v);
        QB_UNROLL
        for (int e = 0; e < 32; e++) a = qb_fma(qb_value<Q>(u, e), moe_ldx(xe + e), a);
    }
    return a;
}

#endif
