#!/usr/bin/env python3
"""Writes the committed reference data for the types gguf-py cannot quantize (Q2_K, Q3_K, IQ4_NL, IQ4_XS,
MXFP4, NVFP4 and the i-quants IQ3_XXS, IQ3_S, IQ2_XXS, IQ2_XS, IQ2_S, IQ1_S, IQ1_M) into
tests/kernels/data (raw little-endian, no header; test_quant.c reads them):

  <T>.blocks / <T>.deq        random bytes with sane f16 (or E8M0 / UE4M3) scales, and their f32 values
  <T>.pq.blocks / <T>.pq.deq  llama.cpp's own quantizer (quantize_<t>, with an importance matrix of ones
                              for the types that require one) applied to 3072 Gaussian values, and theirs
  <T>.quant                   Q2_K, Q3_K, IQ4_NL, IQ4_XS, MXFP4: llama.cpp's quantize_<t> without an importance matrix
                              (what llama-quantize runs) of quant_in.f32 (make_quant_fixtures.py's inputs)

The f32 values come from llama.cpp's C dequantize_row_<t> (ggml-quants.c of the peer tree, compiled here into
a throwaway shared library) and must equal gguf-py's numpy dequantize (gguf.quants) bit for bit (NaN-aware):
the script stops if the two references disagree. Needs numpy, gguf, a C compiler and the llama.cpp tree
(LLAMA_CPP_DIR, default /work/peer/lcp0336).
"""
import ctypes
import os
import subprocess
import sys
import tempfile

import numpy as np
import gguf
from gguf import GGMLQuantizationType as QT

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data")
PEER = os.environ.get("LLAMA_CPP_DIR", "/work/peer/lcp0336")
N = 3072  # elements per fixture

TYPES = {  # type: (ggml name, quantizer needs an importance matrix)
    QT.Q2_K: ("q2_K", False), QT.Q3_K: ("q3_K", False), QT.IQ4_NL: ("iq4_nl", False),
    QT.IQ4_XS: ("iq4_xs", False), QT.MXFP4: ("mxfp4", False), QT.NVFP4: ("nvfp4", False),
    QT.IQ3_XXS: ("iq3_xxs", False), QT.IQ3_S: ("iq3_s", False), QT.IQ2_XXS: ("iq2_xxs", True),
    QT.IQ2_XS: ("iq2_xs", True), QT.IQ2_S: ("iq2_s", False), QT.IQ1_S: ("iq1_s", True),
    QT.IQ1_M: ("iq1_m", True),
}

# Types ferry also quantizes (from_f32): as llama-quantize does without an importance matrix.
QUANTIZED = (QT.Q2_K, QT.Q3_K, QT.IQ4_NL, QT.IQ4_XS, QT.MXFP4)

STUB = r"""
#include <stdio.h>
#include <stdlib.h>
#include <stddef.h>
#include <stdint.h>
void ggml_abort(const char *f, int l, const char *fmt, ...) { fprintf(stderr, "abort %s:%d\n", f, l); abort(); }
static const int64_t bs[64] = {%BS%};
static const size_t ts[64] = {%TS%};
size_t ggml_type_size(int t) { return ts[t]; }
size_t ggml_row_size(int t, int64_t ne) { return ts[t] * (size_t)(ne / bs[t]); }
const char *ggml_type_name(int t) { (void)t; return "?"; }
"""


def peer_lib():
    d = tempfile.mkdtemp()
    bsl, tsl = ["1"] * 64, ["0"] * 64
    for t, (b, s) in gguf.GGML_QUANT_SIZES.items():
        bsl[int(t)], tsl[int(t)] = str(b), str(s)
    with open(os.path.join(d, "stub.c"), "w") as f:
        f.write(STUB.replace("%BS%", ",".join(bsl)).replace("%TS%", ",".join(tsl)))
    so = os.path.join(d, "libpq.so")
    src = os.path.join(PEER, "ggml", "src")
    subprocess.check_call(["cc", "-O1", "-ffp-contract=off", "-fPIC", "-shared", "-o", so,
                           os.path.join(src, "ggml-quants.c"), os.path.join(d, "stub.c"),
                           "-I" + os.path.join(PEER, "ggml", "include"), "-I" + src, "-lm"])
    return ctypes.CDLL(so)


rng = np.random.default_rng(20261207)


def sane_f16(n, lo=-3.0, hi=-1.0, signed=False):
    v = 10.0 ** rng.uniform(lo, hi, n)
    if signed:
        v *= rng.choice([-1.0, 1.0], n)
    return v.astype(np.float16)


def random_blocks(qt, nb):
    tsz = gguf.GGML_QUANT_SIZES[qt][1]
    b = rng.integers(0, 256, size=(nb, tsz), dtype=np.uint8)
    f16 = lambda **kw: sane_f16(nb, **kw).view(np.uint8).reshape(nb, 2)
    if qt == QT.Q2_K:
        b[:, 80:82] = f16()
        b[:, 82:84] = f16(lo=-4.0, hi=-2.0)
    elif qt == QT.Q3_K:
        b[:, 108:110] = f16(signed=True)
    elif qt == QT.IQ1_M:
        d = sane_f16(nb).view(np.uint16)
        sc = b[:, 48:56].copy().view(np.uint16) & np.uint16(0x0FFF)
        for k in range(4):
            sc[:, k] |= ((d >> np.uint16(4 * k)) & np.uint16(15)) << np.uint16(12)
        b[:, 48:56] = sc.view(np.uint8)
    elif qt not in (QT.MXFP4, QT.NVFP4):  # every other type: f16 d first
        b[:, 0:2] = f16(signed=True)
    return b


def c_dequant(lib, name, blocks, n):
    out = np.empty(n, dtype=np.float32)
    getattr(lib, "dequantize_row_" + name)(blocks.ctypes.data_as(ctypes.c_void_p),
                                           out.ctypes.data_as(ctypes.c_void_p), ctypes.c_int64(n))
    return out


def c_quantize(lib, qt, name, imat, x, row):
    nrow = x.size // row
    tsz = gguf.GGML_QUANT_SIZES[qt]
    out = np.zeros(x.size // tsz[0] * tsz[1], dtype=np.uint8)
    w = np.ones(row, dtype=np.float32) if imat else None
    fn = getattr(lib, "quantize_" + name)
    fn.restype = ctypes.c_size_t
    fn(x.ctypes.data_as(ctypes.c_void_p), out.ctypes.data_as(ctypes.c_void_p), ctypes.c_int64(nrow),
       ctypes.c_int64(row), w.ctypes.data_as(ctypes.c_void_p) if imat else None)
    return out.reshape(-1, tsz[1])


def same(a, b):
    return np.array_equal(a.view(np.uint32), b.view(np.uint32)) or bool(
        np.all((a.view(np.uint32) == b.view(np.uint32)) | (np.isnan(a) & np.isnan(b))))


def main():
    lib = peer_lib()
    lib.iq2xs_init_impl.argtypes = [ctypes.c_int]
    for t in (QT.IQ2_XXS, QT.IQ2_XS, QT.IQ2_S, QT.IQ1_S, QT.IQ1_M):
        lib.iq2xs_init_impl(int(t))
    lib.iq3xs_init_impl(256)
    lib.iq3xs_init_impl(512)
    for qt, (name, imat) in TYPES.items():
        bsz = gguf.GGML_QUANT_SIZES[qt][0]
        sets = [("", random_blocks(qt, N // bsz))]
        row = 256 if N % 256 == 0 else bsz
        x = rng.standard_normal(N).astype(np.float32) * np.float32(0.02)
        sets.append((".pq", c_quantize(lib, qt, name, imat, x, row)))
        for suffix, blocks in sets:
            blocks = np.ascontiguousarray(blocks)
            ref = c_dequant(lib, name, blocks, N)
            py = gguf.quants.dequantize(blocks.reshape(-1), qt).reshape(-1).astype(np.float32)
            if not same(ref, py):
                bad = np.nonzero(ref.view(np.uint32) != py.view(np.uint32))[0]
                sys.exit("%s%s: llama.cpp and gguf-py disagree at %d elements, first %d: %r vs %r" %
                         (qt.name, suffix, bad.size, bad[0], ref[bad[0]], py[bad[0]]))
            blocks.tofile(os.path.join(OUT, qt.name + suffix + ".blocks"))
            ref.tofile(os.path.join(OUT, qt.name + suffix + ".deq"))
            print("%-8s%-4s %5d bytes, |x| max %.4g" % (qt.name, suffix, blocks.size, np.nanmax(np.abs(ref))))
    # The quantizers ferry has for these types: llama.cpp's output for test_quant's quant_in.f32.
    x = np.fromfile(os.path.join(OUT, "quant_in.f32"), dtype=np.float32)
    for qt in QUANTIZED:
        name, _ = TYPES[qt]
        q = c_quantize(lib, qt, name, False, x, 256)
        q.tofile(os.path.join(OUT, qt.name + ".quant"))
        print("%-8s quant %5d bytes" % (qt.name, q.size))


if __name__ == "__main__":
    main()
