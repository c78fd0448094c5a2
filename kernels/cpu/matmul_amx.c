/* matmul_amx — bf16 products on AMX tiles (see matmul_amx.h for the contract and the error bound).
 *
 * Tiles (palette 1, 16 rows of 64 bytes each): C0..C3 the f32 sums of two weight groups (16 rows each) by two
 * x groups, A4/A5 the two weight groups' next 32 columns (bf16, from the task's converted block), B6/B7 the
 * two x groups' same 32 columns as bf16 pairs (amx_pack_x). One step of 32 columns is 4 TDPBF16PS (16 x 16 x
 * 32 each) from 4 tile loads. k goes in chunks of AMX_KC: a block's converted chunk (L1) multiplies every
 * pair of x groups of a panel (L2), and the task's sums wait in an L2 buffer between chunks.
 */
#include "kernels/cpu/matmul_amx.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/core/status.h"
#include "kernels/cpu/thread_buf.h"
#include "quant/fp16.h"

#if defined(__x86_64__) && defined(__linux__)
#include <cpuid.h>
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
#define AMX_BUILD 1
#endif

size_t amx_x_bytes(int m, int k)
{
    const size_t mp = ((size_t)m + 31) / 32 * 32, kp = ((size_t)k + 31) / 32 * 32;
    return mp * kp * 2;
}

#ifdef AMX_BUILD

#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA  18
#define T_AMX               "amx-tile,amx-bf16,avx512f,avx512bw,avx512vl,avx512bf16,avx2,fma,f16c"

static int amx_ok;
static pthread_once_t amx_once = PTHREAD_ONCE_INIT;

static void amx_probe(void)
{
    if (getenv("FERRY_NO_AMX")) return; /* comparisons: the f32 path on the same host */
    unsigned a, b, c, d;
    if (__get_cpuid_max(0, NULL) < 7) return;
    __cpuid_count(7, 0, a, b, c, d);
    const int avx512 = (b >> 16 & 1) && (b >> 30 & 1) && (b >> 31 & 1); /* F, BW, VL */
    const int tile = d >> 24 & 1, bf16 = d >> 22 & 1;
    __cpuid_count(7, 1, a, b, c, d);
    const int avx512bf16 = a >> 5 & 1;
    __cpuid(1, a, b, c, d);
    if (!(avx512 && tile && bf16 && avx512bf16 && (c >> 27 & 1))) return; /* OSXSAVE */
    unsigned lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    if ((lo & 0xe6) != 0xe6) return; /* the OS saves the SSE, AVX and AVX-512 state */
    /* Linux gives the tile data state (8 KiB a thread) only to a process that asks. */
    amx_ok = syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
}

int amx_available(void)
{
    pthread_once(&amx_once, amx_probe);
    return amx_ok;
}

/* ---- per-thread buffers: the converted weights and sums (worker threads) and x packed (the calling thread,
 * which may also run tasks: two buffers) ---------------------------------------------------------------- */

static struct thread_buf w_buf = THREAD_BUF_INIT, x_buf = THREAD_BUF_INIT;

uint16_t *amx_x_buffer(int m, int k)
{
    return thread_buf_get(&x_buf, amx_x_bytes(m, k));
}

/* ---- conversions -----------------------------------------------------------------------------------------
 */

/* 32 f32 (n of them valid, the rest zero) to bf16, rounded to nearest even. */
static inline __attribute__((always_inline, target(T_AMX))) __m512i bf16_32(const float *x, int n)
{
    const __mmask16 m0 = n >= 16 ? 0xffff : (__mmask16)((1u << n) - 1);
    const __mmask16 m1 = n >= 32 ? 0xffff : n <= 16 ? 0 : (__mmask16)((1u << (n - 16)) - 1);
    const __m512 lo = _mm512_maskz_loadu_ps(m0, x), hi = _mm512_maskz_loadu_ps(m1, x + 16);
    return (__m512i)_mm512_cvtne2ps_pbh(hi, lo);
}

__attribute__((target(T_AMX))) void amx_pack_x(const float *x, int m, int k, uint16_t *xp, int g_lo, int g_hi)
{
    const int nks = (k + 31) / 32;
    uint32_t t[16][16] __attribute__((aligned(64)));
    for (int g = g_lo; g < g_hi; g++)
        for (int s = 0; s < nks; s++) {
            const int c0 = 32 * s, nc = k - c0 < 32 ? k - c0 : 32;
            for (int i = 0; i < 16; i++) {
                const int r = 16 * g + i;
                _mm512_store_si512(t[i],
                                   r < m ? bf16_32(x + (size_t)r * k + c0, nc) : _mm512_setzero_si512());
            }
            /* tile row p: the pair of columns (2p, 2p + 1) of each x row */
            uint32_t *dst = (uint32_t *)(xp + ((size_t)g * nks + s) * 512);
            for (int p = 0; p < 16; p++)
                for (int i = 0; i < 16; i++) dst[p * 16 + i] = t[i][p];
        }
}

/* Columns [c0, c0 + kc) of a row of W (k elements) into dst (kc bf16, zero past k); c0 and kc multiples of
 * 32. */
static __attribute__((target(T_AMX))) void weight_cols(const uint8_t *w, enum dtype wt, int k, int c0, int kc,
                                                       uint16_t *dst)
{
    const int end = k < c0 + kc ? k : c0 + kc;
    int c = c0;
    if (wt == DTYPE_F16) {
        const uint16_t *h = (const uint16_t *)w;
        for (; c + 32 <= end; c += 32) {
            const __m512 lo = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(h + c)));
            const __m512 hi = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(h + c + 16)));
            _mm512_store_si512(dst + (c - c0), (__m512i)_mm512_cvtne2ps_pbh(hi, lo));
        }
        for (; c < end; c++) dst[c - c0] = f32_to_bf16(f16_to_f32(h[c]));
    } else if (end > c) { /* DTYPE_BF16: already bf16 */
        memcpy(dst, (const uint16_t *)w + c0, (size_t)(end - c0) * 2);
        c = end;
    }
    for (; c < c0 + kc; c++) dst[c - c0] = 0;
}

/* ---- the product ------------------------------------------------------------------------------------------
 */

struct tilecfg {
    uint8_t palette, start;
    uint8_t rsv[14];
    uint16_t colsb[16];
    uint8_t rows[16];
};

__attribute__((target(T_AMX))) int amx_matmul_rows(const uint16_t *xp, int m, int k, const uint8_t *w,
                                                   enum dtype wt, size_t row_bytes, int j_lo, int j_hi,
                                                   float *y, int ldy)
{
    const int kp = (k + 31) / 32 * 32, nks = kp / 32, mp = (m + 31) / 32 * 32;
    const int nrp = (j_hi - j_lo + AMX_WB - 1) / AMX_WB * AMX_WB; /* the range's rows, whole blocks */
    const int xpan = mp < AMX_XP ? mp : AMX_XP;
    /* The block's converted chunk (AMX_WB, AMX_KC) bf16, then the range's sums (nrp, xpan) f32. */
    uint8_t *buf = thread_buf_get(&w_buf, (size_t)AMX_WB * AMX_KC * 2 + (size_t)nrp * xpan * 4);
    if (!buf) return FERRY_ERR_NOMEM;
    uint16_t *wb = (uint16_t *)buf;
    float *acc = (float *)(buf + (size_t)AMX_WB * AMX_KC * 2);
    const size_t lacc = (size_t)xpan * 4; /* bytes between acc's rows */
    struct tilecfg cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (int i = 0; i < 8; i++) cfg.colsb[i] = 64, cfg.rows[i] = 16;
    _tile_loadconfig(&cfg);
    for (int i0 = 0; i0 < mp; i0 += xpan) { /* panels of x: sums in acc, then out to y */
        const int np = mp - i0 < xpan ? mp - i0 : xpan;
        for (int k0 = 0; k0 < kp; k0 += AMX_KC) {
            const int kc = kp - k0 < AMX_KC ? kp - k0 : AMX_KC, ns = kc / 32;
            const size_t lda = (size_t)kc * 2;
            for (int jb = j_lo; jb < j_hi; jb += AMX_WB) {
                for (int r = 0; r < AMX_WB; r++) {
                    if (jb + r < j_hi)
                        weight_cols(w + (size_t)(jb + r) * row_bytes, wt, k, k0, kc, wb + (size_t)r * kc);
                    else
                        memset(wb + (size_t)r * kc, 0, lda);
                }
                const uint16_t *a0 = wb, *a1 = wb + (size_t)16 * kc;
                float *c0 = acc + (size_t)(jb - j_lo) * xpan, *c1 = c0 + (size_t)16 * xpan;
                for (int g = i0 / 16; g < (i0 + np) / 16; g += 2) {
                    const int ci = 16 * g - i0;
                    const uint16_t *b0 = xp + ((size_t)g * nks + k0 / 32) * 512, *b1 = b0 + (size_t)nks * 512;
                    if (k0 == 0) {
                        _tile_zero(0);
                        _tile_zero(1);
                        _tile_zero(2);
                        _tile_zero(3);
                    } else {
                        _tile_loadd(0, c0 + ci, lacc);
                        _tile_loadd(1, c0 + ci + 16, lacc);
                        _tile_loadd(2, c1 + ci, lacc);
                        _tile_loadd(3, c1 + ci + 16, lacc);
                    }
                    for (int s = 0; s < ns; s++) {
                        _tile_loadd(4, a0 + 32 * s, lda);
                        _tile_loadd(5, a1 + 32 * s, lda);
                        _tile_loadd(6, b0 + (size_t)512 * s, 64);
                        _tile_loadd(7, b1 + (size_t)512 * s, 64);
                        _tile_dpbf16ps(0, 4, 6);
                        _tile_dpbf16ps(1, 4, 7);
                        _tile_dpbf16ps(2, 5, 6);
                        _tile_dpbf16ps(3, 5, 7);
                    }
                    _tile_stored(0, c0 + ci, lacc);
                    _tile_stored(1, c0 + ci + 16, lacc);
                    _tile_stored(2, c1 + ci, lacc);
                    _tile_stored(3, c1 + ci + 16, lacc);
                }
            }
        }
        /* acc is (weight row, x row): y is (x row, weight row) */
        const int i_end = m < i0 + np ? m : i0 + np;
        for (int i = i0; i < i_end; i++) {
            float *yr = y + (size_t)i * ldy;
            for (int j = j_lo; j < j_hi; j++) yr[j] = acc[(size_t)(j - j_lo) * xpan + (i - i0)];
        }
    }
    _tile_release();
    return FERRY_OK;
}

#else /* no AMX in this build */

uint16_t *amx_x_buffer(int m, int k)
{
    (void)m, (void)k;
    return NULL;
}

int amx_available(void)
{
    return 0;
}
void amx_pack_x(const float *x, int m, int k, uint16_t *xp, int g_lo, int g_hi)
{
    (void)x, (void)m, (void)k, (void)xp, (void)g_lo, (void)g_hi;
}
int amx_matmul_rows(const uint16_t *xp, int m, int k, const uint8_t *w, enum dtype wt, size_t row_bytes,
                    int j_lo, int j_hi, float *y, int ldy)
{
    (void)xp, (void)m, (void)k, (void)w, (void)wt, (void)row_bytes, (void)j_lo, (void)j_hi, (void)y,
        (void)ldy;
    return FERRY_ERR_UNSUPPORTED;
}

#endif
