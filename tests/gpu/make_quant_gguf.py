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


# byte offsets of each block type's f16 scale fields (F16: the values themselves)
F16_FIELDS = {"F16": (0,), "Q8_0": (0,), "Q4_0": (0,), "Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,)}


def block_pool(name, nblocks=1 << 18, centred=False, gain=1.0):
    """(nblocks, block bytes) random blocks of a type, with their scale fields set to sane f16 values
    (multiplied by gain).
    centred: Q4_K and Q5_K blocks whose values average zero (each sub-block's min equal to its scale times
    the mean quant, as Q6_K and Q8_0 are by construction): the uncentred blocks' values share a positive mean,
    which makes every matrix's outputs nearly the same direction, so that a router built on them picks the
    same experts for every token."""
    _, bs, tsz = TYPES[name]
    if name == "F16":  # random halves of magnitude 2^-8 .. 2^-3, random sign
        h = rng.integers(0, 1 << 16, size=nblocks * 16, dtype=np.uint16)
        h = (h & 0x83FF) | ((rng.integers(7, 12, size=h.size, dtype=np.uint16)) << 10)
        b = h.view(np.uint8).reshape(-1, 2)
    else:
        b = random_blocks(name, nblocks, centred)
    for o in F16_FIELDS[name] if gain != 1.0 else ():
        v = np.ascontiguousarray(b[:, o:o + 2]).view(np.float16).astype(np.float32) * gain
        b[:, o:o + 2] = v.astype(np.float16).view(np.uint8)
    return b


def random_blocks(name, nblocks, centred):
    _, bs, tsz = TYPES[name]
    b = rng.integers(0, 256, size=(nblocks, tsz), dtype=np.uint8)
    if name in ("Q8_0", "Q4_0"):
        b[:, 0:2] = f16_bytes(nblocks, -3.5, -2.5)
    elif name in ("Q4_K", "Q5_K") and centred:
        # w = d·sc·q − dmin·m: with m = sc (the 6-bit minima packed as the scales are) and dmin = d·mean(q)
        d = 10.0 ** rng.uniform(-4.5, -3.5, nblocks)
        b[:, 0:2] = d.astype(np.float16).view(np.uint8).reshape(nblocks, 2)
        b[:, 2:4] = (d * (7.5 if name == "Q4_K" else 15.5)).astype(np.float16).view(np.uint8).reshape(nblocks, 2)
        sc = b[:, 4:16]  # the 12 bytes of packed 6-bit scales and minima (a view)
        sc[:, 8:12] = (sc[:, 8:12] & 0x0F) * 0x11  # sub-blocks 4..7: low 4 bits of m = those of sc
        sc[:, 4:8] = sc[:, 0:4]  # sub-blocks 0..3: m = sc; 4..7: high 2 bits of m = those of sc
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
        self.tensors = []  # (name, ne, type name, std: F32 tensors only, None = ones)

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

    def tensor(self, name, ne, tname, scale=None):
        """scale: F32 — None for ones, a callable for the values it returns given their count, else the
        deviation of normal values; block types — a factor on the blocks' scales (None: 1)."""
        self.tensors.append((name, ne, tname, scale))

    @staticmethod
    def nbytes(ne, tname):
        _, bs, tsz = TYPES[tname]
        return ne[0] // bs * tsz * int(np.prod(ne[1:], dtype=np.int64))

    def write(self, centred=False):
        """The file; the tensors' data are drawn from one pool of random blocks per type and scale."""
        keys = sorted({(t, g or 1.0) for _, _, t, g in self.tensors if t != "F32"})
        pools = {k: block_pool(k[0], centred=centred, gain=k[1]) for k in keys}
        f = self.f
        f.write(b"GGUF" + struct.pack("<IQQ", 3, len(self.tensors), len(self.kv)))
        for kv in self.kv:
            f.write(kv)
        off = 0
        for name, ne, tname, _ in self.tensors:
            f.write(self.s(name) + struct.pack("<I", len(ne)) + struct.pack(f"<{len(ne)}Q", *ne) +
                    struct.pack("<IQ", TYPES[tname][0], off))
            off = (off + self.nbytes(ne, tname) + GGUF_ALIGN - 1) // GGUF_ALIGN * GGUF_ALIGN
        f.write(b"\0" * (-f.tell() % GGUF_ALIGN))
        for name, ne, tname, scale in self.tensors:
            n = self.nbytes(ne, tname)
            if tname == "F32":  # norms: ones; others (a router): normal, or the values a callable gives
                v = (np.ones(n // 4, np.float32) if scale is None else
                     np.asarray(scale(n // 4), np.float32) if callable(scale) else
                     rng.standard_normal(n // 4, np.float32) * scale)
                f.write(v.tobytes())
            else:
                pool = pools[(tname, scale or 1.0)].reshape(-1)
                at = int(rng.integers(0, pool.size // 2)) // TYPES[tname][2] * TYPES[tname][2]
                while n > 0:
                    take = min(n, pool.size - at)
                    f.write(memoryview(pool[at:at + take]))  # a view: no copy of the bytes
                    n -= take
                    at = 0
            f.write(b"\0" * (-f.tell() % GGUF_ALIGN))
        f.close()
        os.replace(self.path + ".part", self.path)


def spm_vocab(w, vocab):
    """The synthetic SentencePiece vocabulary of VOCAB (>= 260) tokens: <unk>, <s>, </s>, the byte tokens, "▁w<i>"."""
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{i:02X}>" for i in range(256)]
    tokens += [f"\u2581w{i}" for i in range(vocab - len(tokens))]
    w.string("tokenizer.ggml.model", "llama")
    w.array("tokenizer.ggml.tokens", 8, tokens)
    w.array("tokenizer.ggml.scores", 6, [0.0] * 3 + [0.0] * 256 + [-float(i) for i in range(vocab - 259)])
    w.array("tokenizer.ggml.token_type", 5, [2, 3, 3] + [6] * 256 + [1] * (vocab - 259))
    w.u32("tokenizer.ggml.bos_token_id", 1)
    w.u32("tokenizer.ggml.eos_token_id", 2)


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
    spm_vocab(w, vocab)
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
    w.write()


if __name__ == "__main__":
    main()
