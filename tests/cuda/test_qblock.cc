/* qblock on the CPU (no GPU needed; runs in CI): the block decoders of kernels/cuda/qblock.cuh, compiled for
 * the host, against quant/dequant.c's dequant_row (bitwise equal to ggml and gguf-py,
 * tests/kernels/test_quant.c).
 *
 * For every type: random blocks (random quant bytes, sane non-zero f16 scales), W placed at every start
 * alignment the type allows (so the 2-byte-aligned types take both funnel-shift paths), every piece of every
 * block loaded and every unit decoded:
 *   - each unit's values w = fma(d, q + QOFF, m) equal dequant_row's bitwise (memcmp of the f32 bits, so the
 *     sign of zero counts), and the pieces cover every element of a block exactly once;
 *   - qb_decode_h2 (what the tensor-core GEMM stores) equals the f16 rounding of dequant_row's value bitwise;
 *   - qb_dot (what the int8 GEMV computes per unit, here with dp4a emulated) summed over a row equals the
 *     double-precision sum of the same integer products within 2e-6 of the sum of their magnitudes (f32
 *     rounding of a handful of operations per unit), and the exact product within the bound that x's int8
 *     rounding implies (each xq off by at most dx/2).
 * And the kernels' index math, with their own step functions (kernels/cuda/matmul_q_steps.cuh) on staged
 * copies built here as the kernels build them (each chunk's enclosing 16-byte-aligned range, garbage outside
 * W):
 *   - the GEMV: every lane of every chunk of every row group, for 1, 2 and 4 rows per warp and m = 1 and 3,
 *     summed per row, against the exact-sum emulation of the int8 path (same tolerance as above);
 *   - the stream GEMV (gemv_stream.cuh): the same, its 32 lanes over the same k range of 1, 2 or 4 rows, m =
 *     1..8 (the x rows past m clamped repeats, as the kernel runs m = 3, 5..7), k up to 11008;
 *   - the GEMM decode: every unit of every 64-column tile of every row, against the f16 rounding of
 *     dequant_row's values (bitwise; zeros past k), at every W alignment the type allows.
 */
#include <criterion/criterion.h>
#include <vector>

#include "kernels/cuda/gemv_stream.cuh"
#include "kernels/cuda/matmul_q_steps.cuh"
#include "kernels/cuda/moe_dot.cuh"
#include "tests/cuda/qref.h"

static uint32_t f32_bits(float f)
{
    uint32_t b;
    memcpy(&b, &f, 4);
    return b;
}

/* Decodes nb blocks at w (start alignment as placed) and compares with dequant_row. */
template <class Q> static void check_decode(const uint8_t *w, int nb, enum dtype t, int off)
{
    std::vector<float> ref((size_t)nb * Q::QK);
    cr_assert_eq(dequant_row(t, w, ref.data(), (int64_t)nb * Q::QK), FERRY_OK);
    std::vector<int> seen(Q::QK);
    for (int b = 0; b < nb; b++) {
        const uint8_t *blk = w + (size_t)b * Q::BYTES;
        std::fill(seen.begin(), seen.end(), 0);
        for (int p = 0; p < Q::PPB; p++) {
            typename Q::raw r;
            Q::load(r, blk, p);
            for (int v = 0; v < Q::UPP; v++) {
                qb_unit u;
                Q::unit(r, p, v, u);
                uint32_t h[16];
                qb_decode_h2<Q>(u, h);
                const int e0 = Q::unit_elem(p, v);
                cr_assert(e0 >= 0 && e0 + 32 <= Q::QK && e0 % 32 == 0, "%s: unit_elem(%d, %d) = %d",
                          dtype_name(t), p, v, e0);
                for (int i = 0; i < 32; i++) {
                    seen[e0 + i]++;
                    const float got = qb_value<Q>(u, i), want = ref[(size_t)b * Q::QK + e0 + i];
                    cr_assert_eq(f32_bits(got), f32_bits(want),
                                 "%s (W at 16k+%d) block %d piece %d unit %d element %d: %.9g (0x%08x), "
                                 "dequant_row %.9g (0x%08x)",
                                 dtype_name(t), off, b, p, v, i, got, f32_bits(got), want, f32_bits(want));
                    const uint16_t hg = (uint16_t)(h[i / 2] >> (16 * (i & 1))), hw = f32_to_f16(want);
                    cr_assert_eq(hg, hw,
                                 "%s block %d piece %d unit %d element %d: f16 0x%04x, want 0x%04x (%.9g)",
                                 dtype_name(t), b, p, v, i, hg, hw, want);
                }
            }
        }
        for (int e = 0; e < Q::QK; e++)
            cr_assert_eq(seen[e], 1, "%s: element %d of a block is covered %d times", dtype_name(t), e,
                         seen[e]);
    }
}

template <class Q> static void decode_all_alignments(enum dtype t)
{
    const int nb = 64;
    std::vector<uint8_t> buf((size_t)nb * Q::BYTES + 64);
    for (int off = 0; off < 16; off += Q::ALIGN) {
        uint8_t *base = buf.data() + (16 - (uintptr_t)buf.data() % 16) % 16 + 16 + off;
        qref_random_blocks(t, base, nb);
        check_decode<Q>(base, nb, t, off);
    }
}

Test(qblock, decode_bitwise_every_type_and_alignment)
{
    qref_seed(1);
    for (int ti = 0; ti < QREF_NTYPES; ti++)
        cr_assert(QREF_DISPATCH(qref_types[ti], decode_all_alignments, qref_types[ti]));
}

/* The int8 MMA's per-thread view (Q::frag) against the full unit, bitwise, at every alignment. */
template <class Q> static void frag_all_alignments(enum dtype t)
{
    const int nb = 16;
    std::vector<uint8_t> buf((size_t)nb * Q::BYTES + 64);
    for (int off = 0; off < 16; off += Q::ALIGN) {
        uint8_t *base = buf.data() + (16 - (uintptr_t)buf.data() % 16) % 16 + 16 + off;
        qref_random_blocks(t, base, nb);
        for (int b = 0; b < nb; b++)
            for (int U = 0; U < Q::QK / 32; U++) {
                qb_unit u;
                qref_unit<Q>(base + (size_t)b * Q::BYTES, U, u);
                for (int th = 0; th < 4; th++) {
                    qb_frag f;
                    Q::frag(base + (size_t)b * Q::BYTES, U, th, f);
                    cr_assert(f.w0 == u.q[th] && f.w1 == u.q[th + 4],
                              "%s (W at 16k+%d) block %d unit %d t %d: words %08x %08x, unit %08x %08x",
                              dtype_name(t), off, b, U, th, f.w0, f.w1, u.q[th], u.q[th + 4]);
                    cr_assert(f32_bits(f.d0) == f32_bits(u.d0) && f32_bits(f.d1) == f32_bits(u.d1) &&
                                  f32_bits(f.m) == f32_bits(u.m) &&
                                  (!Q::TWO_M || f32_bits(f.m1) == f32_bits(u.m1)),
                              "%s block %d unit %d t %d: scales %g %g %g, unit %g %g %g", dtype_name(t), b, U,
                              th, f.d0, f.d1, f.m, u.d0, u.d1, u.m);
                }
            }
    }
}

Test(qblock, mma_frag_bitwise_every_type_and_alignment)
{
    qref_seed(6);
    for (int ti = 0; ti < QREF_NTYPES; ti++)
        cr_assert(QREF_DISPATCH(qref_types[ti], frag_all_alignments, qref_types[ti]));
}

/* Extreme but legal fields: scales of either sign at the f16 extremes that stay finite in products, all-ones
 * and all-zeros quant bytes, maximal 6-bit scales and minima. */
template <class Q> static void decode_extremes(enum dtype t)
{
    const int nb = 8;
    std::vector<uint8_t> buf((size_t)nb * Q::BYTES + 64);
    uint8_t *base = buf.data() + (16 - (uintptr_t)buf.data() % 16) % 16 + 16;
    const uint16_t scales[4] = {f32_to_f16(6e-8f), f32_to_f16(-6e-8f), f32_to_f16(1000.0f),
                                f32_to_f16(-0.5f)};
    for (int b = 0; b < nb; b++) {
        uint8_t *p = base + (size_t)b * Q::BYTES;
        memset(p, b % 2 ? 0xFF : 0x00, Q::BYTES);
        const uint16_t s = scales[b % 4], s2 = scales[(b + 1) % 4];
        if (t == DTYPE_Q6_K)
            qref_put16(p + 208, s);
        else if (t == DTYPE_Q3_K)
            qref_put16(p + 108, s);
        else if (t == DTYPE_Q2_K)
            qref_put16(p + 80, s), qref_put16(p + 82, s2);
        else if (t == DTYPE_MXFP4)
            p[0] = b % 2 ? 252 : 1; /* a large exponent (12·d finite) and a subnormal scale */
        else if (t == DTYPE_NVFP4)
            memset(p, b % 2 ? 0x7E : 0x01, 4); /* the largest UE4M3 scale, and the smallest subnormal */
        else if (t == DTYPE_IQ1_M)
            for (int w = 0; w < 4; w++)
                p[49 + 2 * w] = (uint8_t)((p[49 + 2 * w] & 0x0F) | ((s >> (4 * w)) & 15) << 4);
        else {
            qref_put16(p, s);
            if (Q::HAS_M) qref_put16(p + 2, s2);
        }
    }
    check_decode<Q>(base, nb, t, 0);
}

Test(qblock, decode_extreme_fields)
{
    for (int ti = 0; ti < QREF_NTYPES; ti++)
        cr_assert(QREF_DISPATCH(qref_types[ti], decode_extremes, qref_types[ti]));
}

template <class Q> static void check_dot(enum dtype t)
{
    const int k = 2 * (Q::QK > 128 ? Q::QK : 128), rows = 3;
    const size_t rb = dtype_row_size(t, k);
    std::vector<uint8_t> buf(rb * rows + 64);
    uint8_t *w = buf.data() + (16 - (uintptr_t)buf.data() % 16) % 16 + 16;
    qref_random_blocks(t, w, (int64_t)rows * k / Q::QK);
    std::vector<float> x(k), wv(k);
    for (int i = 0; i < k; i++) x[i] = qref_frand() * (i % 7 == 0 ? 3.0f : 0.5f);
    struct qref_xq xq;
    qref_quantize_x(x.data(), 1, k, &xq);
    for (int i = 0; i < k; i++)
        cr_assert(fabs(x[i] - (double)xq.dx[i / 32] * xq.q[i]) <= 0.5000001 * xq.dx[i / 32],
                  "x quantization");
    for (int r = 0; r < rows; r++) {
        const uint8_t *row = w + rb * r;
        float acc = 0.0f;
        for (int U = 0; U < k / 32; U++) {
            qb_unit u;
            qref_unit<Q>(row, U, u);
            uint32_t xw[8];
            memcpy(xw, xq.q + 32 * U, 32);
            acc = qb_dot<Q>(u, xw, xq.dx[U], xq.sx[U], xq.sq_lo[U], xq.sq_hi[U], acc);
        }
        double ref, absum;
        qref_q8_row<Q>(row, &xq, 0, k, &ref, &absum);
        cr_assert(fabs(acc - ref) <= 2e-6 * absum, "%s row %d: qb_dot sum %.9g, double %.9g (|terms| %g)",
                  dtype_name(t), r, acc, ref, absum);
        cr_assert_eq(dequant_row(t, row, wv.data(), k), FERRY_OK);
        double exact = 0;
        for (int i = 0; i < k; i++) exact += (double)wv[i] * x[i];
        const double bound = qref_q8_bound_row<Q>(row, &xq, 0, k) + 2e-6 * absum;
        cr_assert(fabs(acc - exact) <= bound, "%s row %d: %.9g vs exact %.9g, bound %g", dtype_name(t), r,
                  acc, exact, bound);
    }
    qref_free_xq(&xq);
}

Test(qblock, dot_with_int8_x)
{
    qref_seed(2);
    for (int ti = 0; ti < QREF_NTYPES; ti++)
        cr_assert(QREF_DISPATCH(qref_types[ti], check_dot, qref_types[ti]));
}

/* The expert GEMV's walk of a row (kernels/cuda/moe_dot.cuh) at every W alignment the type allows: the items
 * of each row, taken by 32 lanes as the kernel takes them (x's int8 form in x8.cuh's natural layout) and the
 * lanes' sums added, give the row's dot product with the int8 x (qref_q8_row) within f32 rounding. */
template <class Q> static void check_moe_dot(enum dtype t)
{
    const int k = 3 * (Q::QK > 128 ? Q::QK : 128), rows = 4, nu = k / 32;
    const size_t rb = dtype_row_size(t, k);
    std::vector<uint8_t> buf(rb * rows + 64);
    std::vector<float> x(k), xd(4 * nu);
    for (int i = 0; i < k; i++) x[i] = qref_frand() * (i % 5 == 0 ? 2.0f : 0.5f);
    struct qref_xq xq;
    qref_quantize_x(x.data(), 1, k, &xq);
    for (int u = 0; u < nu; u++) {
        xd[4 * u] = xq.dx[u], xd[4 * u + 1] = xq.sx[u];
        memcpy(&xd[4 * u + 2], &xq.sq_lo[u], 4);
        memcpy(&xd[4 * u + 3], &xq.sq_hi[u], 4);
    }
    for (int off = 0; off < 16; off += Q::ALIGN) {
        uint8_t *w = buf.data() + (16 - (uintptr_t)buf.data() % 16) % 16 + 16 + off;
        qref_random_blocks(t, w, (int64_t)rows * k / Q::QK);
        for (int r = 0; r < rows; r++) {
            const uint8_t *row = w + rb * r;
            float lanes[32] = {0};
            for (int it = 0; it < moe_q_items<Q>(k); it++)
                lanes[it % 32] = moe_q_item<Q>(row, (const uint8_t *)xq.q, xd.data(), it, lanes[it % 32]);
            float got = 0;
            for (int l = 0; l < 32; l++) got += lanes[l];
            double ref, absum;
            qref_q8_row<Q>(row, &xq, 0, k, &ref, &absum);
            cr_assert(fabs(got - ref) <= 4e-6 * absum + 1e-30, "%s (W at 16k+%d) row %d: %.9g, int8 x %.9g",
                      dtype_name(t), off, r, got, ref);
        }
    }
    qref_free_xq(&xq);
}

Test(qblock, moe_row_walk_every_type)
{
    qref_seed(9);
    for (int ti = 0; ti < QREF_NTYPES; ti++)
        cr_assert(QREF_DISPATCH(qref_types[ti], check_moe_dot, qref_types[ti]));
}

/* The traits agree with the type table (kernels/core/dtype.c) and quant/blocks.h. */
Test(qblock, traits_match_dtype_table)
{
#define CHECK_TRAIT(T, name, Q)                                                                              \
    cr_assert_eq(Q::QK, dtype_block_size(DTYPE_##T), #T " QK");                                              \
    cr_assert_eq((size_t)Q::BYTES, dtype_type_size(DTYPE_##T), #T " BYTES");                                 \
    cr_assert_eq(Q::UPP *Q::PPB * 32, Q::QK, #T " pieces");                                                  \
    cr_assert_eq(Q::BYTES % Q::ALIGN, 0, #T " ALIGN");
    QB_TYPES(CHECK_TRAIT)
#undef CHECK_TRAIT
}

/* k rounded up to a whole number of Q's blocks (32 * odd shapes for the 64-element NVFP4). */
template <class Q> static int qk_up(int k)
{
    return (k + Q::QK - 1) / Q::QK * Q::QK;
}

/* Copies W's bytes [ga, ga + nbytes) with their enclosing 16-byte-aligned range into buf (as the kernels'
 * staging does: bytes of the range outside W stay garbage), and returns the offset of ga in buf. */
static unsigned stage_range(uint8_t *buf, size_t cap, const uint8_t *wlo, const uint8_t *whi,
                            const uint8_t *ga, size_t nbytes)
{
    memset(buf, 0xA5, cap);
    const uint8_t *a0 = (const uint8_t *)((uintptr_t)ga & ~(uintptr_t)15);
    const uint8_t *a1 = (const uint8_t *)(((uintptr_t)(ga + nbytes) + 15) & ~(uintptr_t)15);
    cr_assert((size_t)(a1 - a0) <= cap, "staged range %zu > %zu", (size_t)(a1 - a0), cap);
    for (const uint8_t *p = a0; p < a1; p++)
        if (p >= wlo && p < whi) buf[p - a0] = *p;
    return (unsigned)((uintptr_t)ga & 15);
}

/* One chunk staged as the streaming kernels stage it: every lane's qs_issue into a stage filled with garbage;
 * sh[r] gets row r's offset in its staged row (the chunk start's address mod 16). */
template <class Q, int RW, int CB>
static void stage_chunk(uint8_t *stage, const uint8_t *w, int n, int row0, int b0, int nbc, size_t rb,
                        unsigned *sh)
{
    using G = qs_geom<Q, RW, CB>;
    memset(stage, 0xA5, (size_t)G::BYTES);
    const uintptr_t a16 = (uintptr_t)w & ~(uintptr_t)15;
    const uint32_t w0 = (uint32_t)((uintptr_t)w & 15), wbytes = (uint32_t)(rb * n);
    for (int lane = 0; lane < 32; lane++)
        qs_issue<Q, RW, CB>(stage, a16, w0, wbytes, row0, n, (uint32_t)rb, b0, nbc, lane);
    for (int r = 0; r < RW; r++) {
        const int row = row0 + r < n ? row0 + r : n - 1;
        sh[r] = (unsigned)(((uintptr_t)w + rb * row + (size_t)b0 * Q::BYTES) & 15);
        cr_assert(memcmp(stage + r * G::STRIDE + sh[r], w + rb * row + (size_t)b0 * Q::BYTES,
                         (size_t)nbc * Q::BYTES) == 0,
                  "staging: row %d blocks %d..%d differ", row, b0, b0 + nbc);
    }
}

/* The inputs of the GEMV emulations: W (n rows of k, random blocks, starting woff bytes past a 16-byte
 * boundary, garbage around it) and m rows of x quantized as the kernels' pre-pass does, xd in its natural
 * layout ({dx, Σx, Σxq lo, Σxq hi} per block of 32). */
struct emu_case {
    std::vector<uint8_t> wbuf;
    uint8_t *w;
    size_t rb; /* bytes per row of W */
    int m, k;
    qref_xq xq;
    std::vector<float> xd;
    emu_case(enum dtype t, int n, int k_, int woff, int m_) : rb(dtype_row_size(t, k_)), m(m_), k(k_)
    {
        wbuf.assign(rb * n + 64, 0xA5);
        w = wbuf.data() + (16 - (uintptr_t)wbuf.data() % 16) % 16 + 16 + woff;
        qref_random_blocks(t, w, (int64_t)n * (k / dtype_block_size(t)));
        std::vector<float> x((size_t)m * k);
        for (size_t i = 0; i < x.size(); i++) x[i] = qref_frand() * (i % 11 == 0 ? 3.0f : 1.0f);
        qref_quantize_x(x.data(), m, k, &xq);
        xd.resize((size_t)m * (k / 32) * 4);
        for (size_t u = 0; u < (size_t)m * (k / 32); u++) {
            xd[4 * u] = xq.dx[u], xd[4 * u + 1] = xq.sx[u];
            memcpy(&xd[4 * u + 2], &xq.sq_lo[u], 4);
            memcpy(&xd[4 * u + 3], &xq.sq_hi[u], 4);
        }
    }
    ~emu_case() { qref_free_xq(&xq); }
    emu_case(const emu_case &) = delete;
    emu_case &operator=(const emu_case &) = delete;
    /* Offsets of x row c (rows past m: row m - 1, as the kernels clamp them) into xq and xd's float4s. */
    template <int M> void offsets(int (&xoff)[M], int (&doff)[M]) const
    {
        for (int c = 0; c < M; c++)
            xoff[c] = (c < m ? c : m - 1) * k, doff[c] = (c < m ? c : m - 1) * (k / 32);
    }
};

template <class Q, int M, int R> static void emulate_gemv(enum dtype t, int n, int k, int woff)
{
    using SH = gq_shape<Q, R>;
    const int nb = k / Q::QK, m = M == 1 ? 1 : M - 1; /* M > 1: the last x row is a clamped repeat */
    emu_case E(t, n, k, woff, m);
    const size_t rb = E.rb;
    const uint8_t *w = E.w;
    const qref_xq &xq = E.xq;
    const std::vector<float> &xd = E.xd;
    int xoff[M], doff[M];
    E.offsets(xoff, doff);
    std::vector<uint8_t> stage((size_t)SH::G::BYTES + 32);
    uint8_t *sbase = stage.data() + (16 - (uintptr_t)stage.data() % 16) % 16;
    for (int row0 = 0; row0 < n; row0 += R) {
        float acc[32][M];
        memset(acc, 0, sizeof acc);
        for (int b0 = 0; b0 < nb; b0 += SH::CB) {
            const int nbc = nb - b0 < SH::CB ? nb - b0 : SH::CB;
            unsigned sh[R];
            stage_chunk<Q, R, SH::CB>(sbase, w, n, row0, b0, nbc, rb, sh);
            for (int lane = 0; lane < 32; lane++) {
                const int r = lane / SH::LPR, sl = lane % SH::LPR;
                gq_lane_chunk<Q, M, SH::LPR, SH::PPL>(acc[lane], sbase + r * SH::STRIDE + sh[r], b0, nbc, sl,
                                                      xq.q, xd.data(), xoff, doff);
            }
        }
        for (int r = 0; r < R && row0 + r < n; r++)
            for (int c = 0; c < m; c++) {
                float sum = 0;
                for (int sl = 0; sl < SH::LPR; sl++) sum += acc[r * SH::LPR + sl][c];
                double ref, absum;
                qref_q8_row<Q>(w + rb * (row0 + r), &xq, c, k, &ref, &absum);
                cr_assert(fabs(sum - ref) <= (k / 32 + 16) * 0x1.0p-23 * absum,
                          "%s GEMV emulation R=%d M=%d woff=%d row %d x row %d: %.9g vs %.9g (|terms| %g)",
                          dtype_name(t), R, M, woff, row0 + r, c, sum, ref, absum);
            }
    }
}

template <class Q> static void emulate_gemv_all(enum dtype t)
{
    const int k = Q::QK == 256 ? 1024 : qk_up<Q>(32 * 37); /* several chunks, the last one partial */
    for (int woff = 0; woff < 16; woff += Q::ALIGN < 4 ? 6 : Q::ALIGN) {
        emulate_gemv<Q, 1, 4>(t, 9, k, woff);
        emulate_gemv<Q, 4, 4>(t, 6, k, woff);
        emulate_gemv<Q, 1, 2>(t, 5, k, woff);
        emulate_gemv<Q, 2, 1>(t, 3, k, woff);
    }
}

template <class Q> static void emulate_gemv_small_k(enum dtype t)
{
    const int ks32[] = {32, 64, 96, 128, 160, 224, 256, 288}, ks256[] = {256, 512, 768};
    const int *ks = Q::QK == 256 ? ks256 : ks32, nk = Q::QK == 256 ? 3 : 8;
    for (int i = 0; i < nk; i++) {
        if (ks[i] % Q::QK) continue;
        emulate_gemv<Q, 1, 4>(t, 311, ks[i], 0);
        emulate_gemv<Q, 1, 4>(t, 37, ks[i], Q::ALIGN < 16 ? Q::ALIGN : 0);
        emulate_gemv<Q, 4, 4>(t, 9, ks[i], 0);
    }
}

Test(qblock, gemv_lane_math_emulated_small_k)
{
    qref_seed(5);
    for (int ti = 0; ti < QREF_NTYPES; ti++)
        cr_assert(QREF_DISPATCH(qref_types[ti], emulate_gemv_small_k, qref_types[ti]));
}

Test(qblock, gemv_lane_math_emulated)
{
    qref_seed(3);
    for (int ti = 0; ti < QREF_NTYPES; ti++)
        cr_assert(QREF_DISPATCH(qref_types[ti], emulate_gemv_all, qref_types[ti]));
}

/* The stream GEMV's lane math (gemv_stream.cuh) for R rows per task and M rows of x (m of them real, the rest
 * clamped repeats of row m - 1): every chunk of every task staged as the kernel stages it, every lane's
 * gs_lane_chunk, the 32 lane sums of each (x row, W row) added, against the exact-sum int8 reference. */
template <class Q, int M, int R> static void emulate_stream(enum dtype t, int n, int k, int woff, int m)
{
    using SH = gs_shape<Q, R>;
    using G = typename SH::G;
    const int nb = k / Q::QK;
    emu_case E(t, n, k, woff, m);
    const size_t rb = E.rb;
    const uint8_t *w = E.w;
    const qref_xq &xq = E.xq;
    const std::vector<float> &xd = E.xd;
    int xoff[M], doff[M];
    E.offsets(xoff, doff);
    std::vector<uint8_t> stage((size_t)G::BYTES + 32);
    uint8_t *sbase = stage.data() + (16 - (uintptr_t)stage.data() % 16) % 16;
    static float acc[32][M][R];
    for (int row0 = 0; row0 < n; row0 += R) {
        memset(acc, 0, sizeof acc);
        for (int b0 = 0; b0 < nb; b0 += SH::CB) {
            const int nbc = nb - b0 < SH::CB ? nb - b0 : SH::CB;
            unsigned sh[R];
            stage_chunk<Q, R, SH::CB>(sbase, w, n, row0, b0, nbc, rb, sh);
            for (int lane = 0; lane < 32; lane++)
                gs_lane_chunk<Q, M, R, SH::PPL>(acc[lane], sbase, G::STRIDE, sh, b0, nbc, lane, xq.q,
                                                xd.data(), xoff, doff);
        }
        for (int r = 0; r < R && row0 + r < n; r++)
            for (int c = 0; c < M; c++) {
                float sum = 0;
                for (int lane = 0; lane < 32; lane++) sum += acc[lane][c][r];
                const int cx = c < m ? c : m - 1;
                double ref, absum;
                qref_q8_row<Q>(w + rb * (row0 + r), &xq, cx, k, &ref, &absum);
                cr_assert(fabs(sum - ref) <= (k / 32 + 16) * 0x1.0p-23 * absum,
                          "%s stream emulation R=%d M=%d m=%d k=%d woff=%d row %d x row %d: %.9g vs %.9g "
                          "(|terms| %g)",
                          dtype_name(t), R, M, m, k, woff, row0 + r, c, sum, ref, absum);
            }
    }
}

/* Every W alignment the type allows; n odd (the last task partial for 2 and 4 rows); k from one block (fewer
 * blocks than lanes) to a chunk and a part and, once per type, the Llama-2-7B down projection's 11008. */
template <class Q> static void emulate_stream_all(enum dtype t)
{
    const int k1 = Q::QK == 256 ? 256 : qk_up<Q>(64), k2 = Q::QK == 256 ? 2304 : qk_up<Q>(32 * 101);
    for (int woff = 0; woff < 16; woff += Q::ALIGN < 4 ? 6 : Q::ALIGN) {
        emulate_stream<Q, 1, 1>(t, 7, k1, woff, 1);
        emulate_stream<Q, 1, 4>(t, 9, k2, woff, 1);
        emulate_stream<Q, 2, 2>(t, 5, k2, woff, 2);
        emulate_stream<Q, 4, 4>(t, 7, k1, woff, 3);
        emulate_stream<Q, 8, 2>(t, 3, k2, woff, 8);
        emulate_stream<Q, 8, 4>(t, 5, k1, woff, 5);
    }
    emulate_stream<Q, 2, 4>(t, 3, qk_up<Q>(11008), 0, 2);
}

Test(qblock, stream_gemv_lane_math_emulated)
{
    qref_seed(9);
    for (int ti = 0; ti < QREF_NTYPES; ti++)
        cr_assert(QREF_DISPATCH(qref_types[ti], emulate_stream_all, qref_types[ti]));
}

/* The int8-MMA kernel (mmv_q.cu) on the CPU: x in the fragment layout as the pre-pass writes it (through
 * gqm_xq_off / gqm_xd_off), W staged per chunk as the kernel stages it, per unit every lane's Q::frag and
 * gqm_load_x, mma.sync m16n8k32 (m16n8k16 for TWO_D) emulated from the PTX fragment tables (A: a0 = row g, k
 * 4t..4t+3, a1 = row g+8, a2/a3 the same rows at k 16+4t..; B: b0 = k 4t.., col g, b1 = k 16+4t..; C: c0, c1
 * = row g, cols 2t, 2t+1, c2, c3 = row g+8), then gqm_epilogue; every output against the exact-sum int8
 * reference. */
static uint32_t emu_byte(uint32_t w, int i)
{
    return (w >> (8 * i)) & 0xFF;
}
static int emu_dot4(uint32_t a, uint32_t b)
{
    int s = 0;
    for (int i = 0; i < 4; i++) s += (int)(int8_t)emu_byte(a, i) * (int)(int8_t)emu_byte(b, i);
    return s;
}

template <class Q, int AT, int NT> static void emulate_mma(enum dtype t, int n, int k, int woff, int m)
{
    using SHP = gqm_shape<Q>;
    constexpr int RW = 16 * AT, CB = SHP::CB, UPB = SHP::UPB;
    using G = qs_geom<Q, RW, CB>;
    const size_t rb = dtype_row_size(t, k);
    const int nb = k / Q::QK, nu = k / 32, mp = 8 * NT;
    std::vector<uint8_t> wbuf(rb * n + 64);
    uint8_t *w = wbuf.data() + (16 - (uintptr_t)wbuf.data() % 16) % 16 + 16 + woff;
    qref_random_blocks(t, w, (int64_t)n * nb);
    std::vector<float> x((size_t)m * k);
    for (size_t i = 0; i < x.size(); i++) x[i] = qref_frand() * (i % 13 == 0 ? 3.0f : 1.0f);
    struct qref_xq xq;
    qref_quantize_x(x.data(), m, k, &xq);
    std::vector<uint8_t> xqf((size_t)mp * k + 16, 0x5A);
    std::vector<float> xdf((size_t)mp * nu * 4 + 4, NAN);
    for (int row = 0; row < mp; row++)
        for (int u = 0; u < nu; u++) {
            for (int sub = 0; sub < 8; sub++)
                for (int i = 0; i < 4; i++)
                    xqf[gqm_xq_off(row, u, sub, nu) + i] =
                        row < m ? (uint8_t)xq.q[(size_t)row * k + 32 * u + 4 * sub + i] : 0;
            const size_t o = gqm_xd_off(row, u, nu), xu = (size_t)row * nu + u;
            const int lo = row < m ? xq.sq_lo[xu] : 0, hi = row < m ? xq.sq_hi[xu] : 0;
            xdf[o] = row < m ? xq.dx[xu] : 0.0f;
            xdf[o + 1] = row < m ? xq.sx[xu] : 0.0f;
            memcpy(&xdf[o + 4], &lo, 4);
            memcpy(&xdf[o + 5], &hi, 4);
        }
    std::vector<uint8_t> stage((size_t)G::BYTES + 32);
    uint8_t *sbase = stage.data() + (16 - (uintptr_t)stage.data() % 16) % 16;
    for (int row0 = 0; row0 < n; row0 += RW) {
        static float acc[32][AT][NT][4];
        memset(acc, 0, sizeof acc);
        for (int b0 = 0; b0 < nb; b0 += CB) {
            const int nbc = nb - b0 < CB ? nb - b0 : CB;
            unsigned sh[RW];
            stage_chunk<Q, RW, CB>(sbase, w, n, row0, b0, nbc, rb, sh);
            for (int uu = 0; uu < SHP::UPC; uu++) {
                const int bl = uu / UPB, U = uu % UPB;
                if (bl >= nbc) break;
                const int gu = (b0 + bl) * UPB + U;
                static qb_frag f[32][AT][2];
                static gqm_x xv[32][NT];
                for (int lane = 0; lane < 32; lane++) {
                    const int g = lane >> 2, th = lane & 3;
                    for (int at = 0; at < AT; at++)
                        for (int h = 0; h < 2; h++) {
                            const int r = 16 * at + 8 * h + g;
                            Q::frag(sbase + r * G::STRIDE + sh[r] + bl * Q::BYTES, U, th, f[lane][at][h]);
                        }
                    for (int jn = 0; jn < NT; jn++)
                        gqm_load_x<Q>(xv[lane][jn], xqf.data(), xdf.data(), nu, jn, gu, lane);
                }
                if (UPB ==
                    8) { /* the kernel's K-quant scales: lane (g, t) decodes units 2t, 2t+1; shuffles */
                    static qb_frag ks[32][AT][2][2];
                    for (int lane = 0; lane < 32; lane++)
                        for (int at = 0; at < AT; at++)
                            for (int h = 0; h < 2; h++)
                                for (int v = 0; v < 2; v++) {
                                    const int r = 16 * at + 8 * h + (lane >> 2), th = lane & 3;
                                    Q::frag(sbase + r * G::STRIDE + sh[r], 2 * th + v, th,
                                            ks[lane][at][h][v]);
                                }
                    for (int lane = 0; lane < 32; lane++) {
                        const int src = (lane & ~3) | (U >> 1), v = U & 1;
                        for (int at = 0; at < AT; at++)
                            for (int h = 0; h < 2; h++) {
                                f[lane][at][h].d0 = ks[src][at][h][v].d0;
                                f[lane][at][h].d1 = Q::TWO_D ? ks[src][at][h][v].d1 : f[lane][at][h].d0;
                                f[lane][at][h].m = Q::HAS_M ? ks[src][at][h][v].m : -0.0f;
                                f[lane][at][h].m1 = Q::TWO_M ? ks[src][at][h][v].m1 : -0.0f;
                            }
                    }
                }
                for (int at = 0; at < AT; at++)
                    for (int jn = 0; jn < NT; jn++)
                        for (int lane = 0; lane < 32; lane++) {
                            const int g = lane >> 2, th = lane & 3;
                            int c[4], ch[4];
                            for (int e = 0; e < 4; e++) {
                                const int row = g + 8 * (e >> 1), col = 2 * th + (e & 1);
                                int s0 = 0, s1 = 0;
                                for (int tq = 0; tq < 4; tq++) {
                                    const int al = (row % 8) * 4 + tq, bl2 = col * 4 + tq;
                                    const qb_frag &fa = f[al][at][row / 8];
                                    s0 += emu_dot4(fa.w0, xv[bl2][jn].b0); /* a0 / a1 with b0 */
                                    s1 += emu_dot4(fa.w1, xv[bl2][jn].b1); /* a2 / a3 with b1 */
                                }
                                if (Q::TWO_D)
                                    c[e] = s0, ch[e] = s1;
                                else
                                    c[e] = s0 + s1, ch[e] = 0;
                            }
                            gqm_epilogue<Q>(acc[lane][at][jn], c, ch, f[lane][at], xv[lane][jn]);
                        }
            }
        }
        for (int lane = 0; lane < 32; lane++)
            for (int at = 0; at < AT; at++)
                for (int jn = 0; jn < NT; jn++)
                    for (int e = 0; e < 4; e++) {
                        const int row = row0 + 16 * at + (lane >> 2) + 8 * (e >> 1);
                        const int col = 8 * jn + 2 * (lane & 3) + (e & 1);
                        if (row >= n || col >= m) continue;
                        double ref, absum;
                        qref_q8_row<Q>(w + rb * row, &xq, col, k, &ref, &absum);
                        const float got = acc[lane][at][jn][e];
                        cr_assert(fabs(got - ref) <= (k / 32 + 16) * 0x1.0p-23 * absum,
                                  "%s MMA emulation AT=%d NT=%d k=%d woff=%d row %d x row %d: %.9g vs %.9g "
                                  "(|terms| %g)",
                                  dtype_name(t), AT, NT, k, woff, row, col, got, ref, absum);
                    }
    }
    qref_free_xq(&xq);
}

template <class Q> static void emulate_mma_all(enum dtype t)
{
    const int k = Q::QK == 256 ? 768 : qk_up<Q>(32 * 21), al = Q::ALIGN < 16 ? Q::ALIGN : 0;
    emulate_mma<Q, 1, 1>(t, 21, k, 0, 3);
    emulate_mma<Q, 1, 2>(t, 19, k, al, 13);
    emulate_mma<Q, 2, 1>(t, 37, k, al, 8);
    emulate_mma<Q, 2, 2>(t, 33, Q::QK == 256 ? 256 : 64, 0, 16);
    emulate_mma<Q, 1, 8>(t, 16, Q::QK == 256 ? 256 : qk_up<Q>(96), al, 61);
}

Test(qblock, mma_fragment_math_emulated)
{
    qref_seed(7);
    for (int ti = 0; ti < QREF_NTYPES; ti++)
        cr_assert(QREF_DISPATCH(qref_types[ti], emulate_mma_all, qref_types[ti]));
}

template <class Q> static void emulate_gemm_decode(enum dtype t)
{
    using RW = gm_raw<Q>;
    const int n = 3, k = Q::QK == 256 ? 768 : qk_up<Q>(32 * 21); /* a partial last raw stage and tile */
    const size_t rb = dtype_row_size(t, k);
    std::vector<uint8_t> wbuf(rb * n + 64), stage(RW::RSTRIDE + 16);
    std::vector<float> deq((size_t)k);
    uint8_t *sbase = stage.data() + (16 - (uintptr_t)stage.data() % 16) % 16;
    for (int woff = 0; woff < 16; woff += Q::ALIGN) {
        uint8_t *w = wbuf.data() + (16 - (uintptr_t)wbuf.data() % 16) % 16 + 16 + woff;
        qref_random_blocks(t, w, (int64_t)n * (k / Q::QK));
        const int nb = k / Q::QK, ntiles = (k + 63) / 64;
        for (int row = 0; row < n; row++) {
            cr_assert_eq(dequant_row(t, w + rb * row, deq.data(), k), FERRY_OK);
            for (int tile = 0; tile < ntiles; tile++) {
                const int r = tile / (GM_RKS / 64), b0 = r * RW::RBLK;
                const int nbytes = (nb - b0 < RW::RBLK ? nb - b0 : RW::RBLK) * Q::BYTES;
                const uint8_t *ga = w + rb * row + (size_t)b0 * Q::BYTES;
                stage_range(sbase, RW::RSTRIDE, w, w + rb * n, ga, (size_t)nbytes);
                for (int ul = 0; ul < 2; ul++) {
                    uint8_t dst[64];
                    gm_decode_task<Q>(dst, sbase, (uintptr_t)ga, tile, ul, k);
                    for (int i = 0; i < 32; i++) {
                        const int e = tile * 64 + 32 * ul + i;
                        uint16_t got;
                        memcpy(&got, dst + 2 * i, 2);
                        const uint16_t want = e < k ? f32_to_f16(deq[e]) : 0;
                        cr_assert_eq(got, want,
                                     "%s GEMM decode woff=%d row %d tile %d element %d: 0x%04x, want 0x%04x",
                                     dtype_name(t), woff, row, tile, e, got, want);
                    }
                }
            }
        }
    }
}

Test(qblock, gemm_decode_math_emulated)
{
    qref_seed(4);
    for (int ti = 0; ti < QREF_NTYPES; ti++)
        cr_assert(QREF_DISPATCH(qref_types[ti], emulate_gemm_decode, qref_types[ti]));
}
