#!/usr/bin/env python3
"""make_quant_gguf.py OUT TYPE [SHAPE] — a Llama GGUF of a real shape with random weights stored in TYPE, for
measuring ferry beside llama.cpp on the same file on a machine where no real model can be fetched.

TYPE: F16, Q8_0, Q4_0, Q4_K_M, Q5_K_M, Q6_K. The K mixes follow llama.cpp's llama_tensor_get_type for a
llama model (src/llama-quant.cpp of the peer): Q4_K_M stores attn_v and ffn_down in Q6_K on the layers where
use_more_bits(i, n) holds (i < n/8, i >= 7n/8, or (i - n/8) % 3 == 2), Q5_K_M does the same over Q5_K, the
output matrix is Q6_K and the token embedding is the mix's base type.
SHAPE: llama-2-7b (default), llama-3-8b, or DIM,FFN,LAYERS,HEADS,KV_HEADS,VOCAB.

The blocks are random bytes with sane f16 scales (the values of a quantized random matrix, not a quantization
of one): what a decode step reads and computes is the same as for a real file of that type. The vocabulary is
synthetic (<unk>, <s>, </s>, the 256 byte tokens, then "▁w<i>"), SentencePiece-style. Written streaming, with
no dependency beyond numpy: a 7B Q4_K_M file (3.9 GB) takes seconds.
"""
import os
import struct
import sys

import numpy as np

GGUF_ALIGN = 32
# ggml type ids and (elements per block, bytes per block)
TYPES = {"F32": (0, 1, 4), "F16": (1, 1, 2), "Q4_0": (2, 32, 18), "Q8_0": (8, 32, 34), "Q4_K": (12, 256, 144),
         "Q5_K": (13, 256, 176), "Q6_K": (14, 256, 210)}
SHAPES = {"llama-2-7b": (4096, 11008, 32, 32, 32, 32000, 10000.0),
          "llama-3-8b": (4096, 14336, 32, 32, 8, 128256, 500000.0)}
FTYPE = {"F16": 1, "Q8_0": 7, "Q4_0": 2, "Q4_K_M": 15, "Q5_K_M": 17, "Q6_K": 18}

rng = np.random.default_rng(7)


def f16_bytes(n, lo, hi):
    return (10.0 ** rng.uniform(lo, hi, n)).astype(np.float16).view(np.uint8).reshape(n, 2)


def block_pool(name, nblocks=1 << 18):
    """(nblocks, block bytes) random blocks of a type, with their scale fields set to sane f16 values."""
    _, bs, tsz = TYPES[name]
    if name == "F16":  # random halves of magnitude 2^-8 .. 2^-3, random sign
        h = rng.integers(0, 1 << 16, size=nblocks * 16, dtype=np.uint16)
        h = (h & 0x83FF) | ((rng.integers(7, 12, size=h.size, dtype=np.uint16)) << 10)
        return h.view(np.uint8).reshape(-1, 2)
    b = rng.integers(0, 256, size=(nblocks, tsz), dtype=np.uint8)
    if name in ("Q8_0", "Q4_0"):
        b[:, 0:2] = f16_bytes(nblocks, -3.5, -2.5)
    elif name in ("Q4_K", "Q5_K"):
        b[:, 0:2] = f16_bytes(nblocks, -4.5, -3.5)
        b[:, 2:4] = f16_bytes(nblocks, -5.0, -4.0)
    elif name == "Q6_K":
        b[:, 208:210] = f16_bytes(nblocks, -5.0, -4.0)
    return b


def mix_types(mix, n_layers):
    def more_bits(i):
        return i < n_layers // 8 or i >= 7 * n_layers // 8 or (i - n_layers // 8) % 3 == 2

    if mix in ("F16", "Q8_0", "Q4_0", "Q6_K"):
        base = mix
        return lambda kind, i: "Q6_K" if kind == "output" and mix not in ("F16", "Q8_0") else base
    base = {"Q4_K_M": "Q4_K", "Q5_K_M": "Q5_K"}[mix]

    def pick(kind, i):
        if kind == "output":
            return "Q6_K"
        if kind in ("attn_v", "ffn_down") and more_bits(i):
            return "Q6_K"
        return base

    return pick


class Writer:
    def __init__(self, path):
        self.path = path  # written as path.part and renamed when whole: a reader never sees half a file
        self.f = open(path + ".part", "wb")
        self.kv = []
        self.tensors = []  # (name, ne, type name)

    def s(self, text):
        b = text.encode()
        return struct.pack("<Q", len(b)) + b

    def add(self, key, vtype, payload):
        self.kv.append(self.s(key) + struct.pack("<I", vtype) + payload)

    def u32(self, key, v):
        self.add(key, 4, struct.pack("<I", v))

    def f32(self, key, v):
        self.add(key, 6, struct.pack("<f", v))

    def string(self, key, v):
        self.add(key, 8, self.s(v))

    def array(self, key, etype, items):
        body = b"".join(self.s(x) for x in items) if etype == 8 else np.asarray(
            items, dtype={4: "<u4", 5: "<i4", 6: "<f4"}[etype]).tobytes()
        self.add(key, 9, struct.pack("<IQ", etype, len(items)) + body)

    def tensor(self, name, ne, tname):
        self.tensors.append((name, ne, tname))

    def nbytes(self, ne, tname):
        _, bs, tsz = TYPES[tname]
        return ne[0] // bs * tsz * int(np.prod(ne[1:], dtype=np.int64))

    def write(self, pools):
        f = self.f
        f.write(b"GGUF" + struct.pack("<IQQ", 3, len(self.tensors), len(self.kv)))
        for kv in self.kv:
            f.write(kv)
        off = 0
        for name, ne, tname in self.tensors:
            f.write(self.s(name) + struct.pack("<I", len(ne)) + struct.pack(f"<{len(ne)}Q", *ne) +
                    struct.pack("<IQ", TYPES[tname][0], off))
            off = (off + self.nbytes(ne, tname) + GGUF_ALIGN - 1) // GGUF_ALIGN * GGUF_ALIGN
        f.write(b"\0" * (-f.tell() % GGUF_ALIGN))
        for name, ne, tname in self.tensors:
            n = self.nbytes(ne, tname)
            if tname == "F32":  # norms: ones
                f.write(np.ones(n // 4, dtype=np.float32).tobytes())
            else:
                pool = pools[tname].reshape(-1)
                at = int(rng.integers(0, pool.size // 2)) // TYPES[tname][2] * TYPES[tname][2]
                while n > 0:
                    take = min(n, pool.size - at)
                    f.write(pool[at:at + take].tobytes())
                    n -= take
                    at = 0
            f.write(b"\0" * (-f.tell() % GGUF_ALIGN))
        f.close()
        os.replace(self.path + ".part", self.path)


def main():
    out, mix = sys.argv[1], sys.argv[2].upper()
    shape = sys.argv[3] if len(sys.argv) > 3 else "llama-2-7b"
    if shape in SHAPES:
        dim, ffn, layers, heads, kvh, vocab, theta = SHAPES[shape]
    else:
        dim, ffn, layers, heads, kvh, vocab = (int(x) for x in shape.split(","))
        theta = 10000.0
    pick = mix_types(mix, layers)
    hd = dim // heads
    w = Writer(out)
    w.string("general.architecture", "llama")
    w.string("general.name", f"random {shape} {mix}")
    w.u32("general.file_type", FTYPE[mix])
    w.u32("llama.context_length", 8192)
    w.u32("llama.embedding_length", dim)
    w.u32("llama.block_count", layers)
    w.u32("llama.feed_forward_length", ffn)
    w.u32("llama.attention.head_count", heads)
    w.u32("llama.attention.head_count_kv", kvh)
    w.u32("llama.rope.dimension_count", hd)
    w.f32("llama.rope.freq_base", theta)
    w.f32("llama.attention.layer_norm_rms_epsilon", 1e-5)
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{i:02X}>" for i in range(256)]
    tokens += [f"\u2581w{i}" for i in range(vocab - len(tokens))]
    w.string("tokenizer.ggml.model", "llama")
    w.array("tokenizer.ggml.tokens", 8, tokens)
    w.array("tokenizer.ggml.scores", 6, [0.0] * 3 + [0.0] * 256 + [-float(i) for i in range(vocab - 259)])
    w.array("tokenizer.ggml.token_type", 5, [2, 3, 3] + [6] * 256 + [1] * (vocab - 259))
    w.u32("tokenizer.ggml.bos_token_id", 1)
    w.u32("tokenizer.ggml.eos_token_id", 2)
    w.tensor("token_embd.weight", [dim, vocab], pick("token_embd", 0))
    w.tensor("output_norm.weight", [dim], "F32")
    w.tensor("output.weight", [dim, vocab], pick("output", 0))
    for i in range(layers):
        p = f"blk.{i}."
        w.tensor(p + "attn_norm.weight", [dim], "F32")
        w.tensor(p + "attn_q.weight", [dim, heads * hd], pick("attn_q", i))
        w.tensor(p + "attn_k.weight", [dim, kvh * hd], pick("attn_k", i))
        w.tensor(p + "attn_v.weight", [dim, kvh * hd], pick("attn_v", i))
        w.tensor(p + "attn_output.weight", [heads * hd, dim], pick("attn_output", i))
        w.tensor(p + "ffn_norm.weight", [dim], "F32")
        w.tensor(p + "ffn_gate.weight", [dim, ffn], pick("ffn_gate", i))
        w.tensor(p + "ffn_up.weight", [dim, ffn], pick("ffn_up", i))
        w.tensor(p + "ffn_down.weight", [ffn, dim], pick("ffn_down", i))
    pools = {t: block_pool(t) for t in {tn for _, _, tn in w.tensors} if t != "F32"}
    w.write(pools)


if __name__ == "__main__":
    main()
