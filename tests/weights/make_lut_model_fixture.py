#!/usr/bin/env python3
"""Writes tests/weights/fixtures/lut_mixed.gguf: a small random Llama whose matrices use every type ferry reads
but does not write, mixed per tensor (as llama.cpp's dynamic quants mix them), quantized by llama.cpp's own
quantizers (ggml-quants.c of the peer tree, compiled by tests/kernels/make_iquant_fixtures.py's helper;
IQ2_XXS, IQ2_XS, IQ1_S and IQ1_M with an importance matrix of ones, which they require).

Model: llama, 2 layers, dim 256, 4 heads / 1 KV head of 64, ffn 256, vocab 48, no tokenizer (token ids only),
norms F32 near 1, matrices Gaussian with standard deviation 1/16 before quantization:
  token_embd IQ4_XS, output Q2_K
  blk.0: attn_q IQ4_XS  attn_k IQ4_NL  attn_v Q3_K   attn_output Q2_K  ffn_gate MXFP4  ffn_up NVFP4  ffn_down IQ3_S
  blk.1: attn_q IQ3_XXS attn_k IQ2_XXS attn_v IQ2_XS attn_output IQ2_S ffn_gate IQ1_S  ffn_up IQ1_M  ffn_down Q4_K
test_lut_model.c dequantizes every tensor to F32 with ferry's table (held bitwise to llama.cpp's by
test_quant) and checks that both files give the same logits. Needs numpy, gguf, a C compiler and the llama.cpp
tree (LLAMA_CPP_DIR, default /work/peer/lcp0336).
"""
import ctypes
import os
import sys

import numpy as np
import gguf
from gguf import GGMLQuantizationType as QT

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "kernels"))
import make_iquant_fixtures as mk  # noqa: E402

OUT = os.path.join(HERE, "fixtures", "lut_mixed.gguf")
DIM, HEADS, KV, HD, FFN, VOCAB = 256, 4, 1, 64, 256, 48
LAYERS = [
    {"attn_q": QT.IQ4_XS, "attn_k": QT.IQ4_NL, "attn_v": QT.Q3_K, "attn_output": QT.Q2_K,
     "ffn_gate": QT.MXFP4, "ffn_up": QT.NVFP4, "ffn_down": QT.IQ3_S},
    {"attn_q": QT.IQ3_XXS, "attn_k": QT.IQ2_XXS, "attn_v": QT.IQ2_XS, "attn_output": QT.IQ2_S,
     "ffn_gate": QT.IQ1_S, "ffn_up": QT.IQ1_M, "ffn_down": QT.Q4_K},
]
SHAPES = {"attn_q": (HEADS * HD, DIM), "attn_k": (KV * HD, DIM), "attn_v": (KV * HD, DIM),
          "attn_output": (DIM, HEADS * HD), "ffn_gate": (FFN, DIM), "ffn_up": (FFN, DIM),
          "ffn_down": (DIM, FFN)}
NAMES = dict(mk.TYPES)
NAMES[QT.Q4_K] = ("q4_K", False)


def main():
    lib = mk.peer_lib()
    for t in (QT.IQ2_XXS, QT.IQ2_XS, QT.IQ2_S, QT.IQ1_S, QT.IQ1_M):
        lib.iq2xs_init_impl(int(t))
    lib.iq3xs_init_impl(256)
    lib.iq3xs_init_impl(512)
    rng = np.random.default_rng(20261207)

    def quant(qt, rows, cols):
        x = (rng.standard_normal(rows * cols) / 16.0).astype(np.float32)
        name, imat = NAMES[qt]
        return mk.c_quantize(lib, qt, name, imat, x, cols).reshape(rows, -1)

    w = gguf.GGUFWriter(OUT, "llama")
    w.add_name("lut-mixed")
    w.add_context_length(256)
    w.add_embedding_length(DIM)
    w.add_feed_forward_length(FFN)
    w.add_block_count(len(LAYERS))
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_dimension_count(HD)
    w.add_vocab_size(VOCAB)

    def add(name, qt, rows, cols):
        w.add_tensor(name, quant(qt, rows, cols), raw_dtype=qt)

    def norm(name):
        w.add_tensor(name, (1.0 + 0.1 * rng.standard_normal(DIM)).astype(np.float32))

    add("token_embd.weight", QT.IQ4_XS, VOCAB, DIM)
    for l, types in enumerate(LAYERS):
        p = "blk.%d." % l
        norm(p + "attn_norm.weight")
        for part in ("attn_q", "attn_k", "attn_v", "attn_output"):
            add(p + part + ".weight", types[part], *SHAPES[part])
        norm(p + "ffn_norm.weight")
        for part in ("ffn_gate", "ffn_up", "ffn_down"):
            add(p + part + ".weight", types[part], *SHAPES[part])
    norm("output_norm.weight")
    add("output.weight", QT.Q2_K, VOCAB, DIM)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(OUT, os.path.getsize(OUT), "bytes")


if __name__ == "__main__":
    main()
