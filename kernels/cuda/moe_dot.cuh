/* moe_dot — how the expert GEMV (kernels/cuda/moe.cu) walks one row of a block-type weight: work item i of a
 * row of cols elements is piece i % PPB of block i / PPB; an item adds the f32 sum of its units' products
 * with x's int8 form (qb_dot: the dense int8 GEMV's arithmetic; xq and xd of one row in x8.cuh's natural
 * layout) to the running sum. A warp's lane takes items lane, lane + 32, ... Host-compilable:
 * tests/cuda/test_qblock.cc checks that a row's items, taken by 32 lanes and summed, give the row's dot
 * product with the int8 x.
 */
#ifndef FERRY_KERN_CUDA_MOE_DOT_CUH
#define FERRY_KERN_CUDA_MOE_DOT_CUH

#include "kernels/cuda/matmul_q_steps.cuh"
#include "kernels/cuda/qblock.cuh"

template <class Q> QB_FN int moe_q_items(int cols)
{
    return cols / Q::QK * Q::PPB;
}

/* Item `it` of a row: its units decoded and dotted with one row of x's int8 form, added to a. */
template <class Q>
QB_FN float moe_q_item(const uint8_t *row, const uint8_t *xq, const float *xd, int it, float a)
{
    const int b = it / Q::PPB, p = it - b * Q::PPB;
    typename Q::raw r;
    Q::load(r, row + (size_t)b * Q::BYTES, p);
    QB_UNROLL
    for (int v = 0; v < Q::UPP; v++) {
        qb_unit u;
        Q::unit(r, p, v, u);
        const size_t at = (size_t)((b * Q::QK + Q::unit_elem(p, v)) / 32);
        const qb_v4 lo = qb_ldg128(xq + at * 32), hi = qb_ldg128(xq + at * 32 + 16);
        const uint32_t xw[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
        const qb_v4 d = qb_ldg128(xd + 4 * at);
        float dx, sx;
        memcpy(&dx, &d.x, 4);
        memcpy(&sx, &d.y, 4);
        a = qb_dot<Q>(u, xw, dx, sx, (int)d.z, (int)d.w, a);
    }
    return a;
}

#endif
