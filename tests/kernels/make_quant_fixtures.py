#!/usr/bin/env python3
"""Writes the committed reference data of tests/kernels (run from anywhere; needs numpy, gguf, torch,
transformers). Everything is raw little-endian with no header; the shapes are fixed here and in the tests.

Quantized blocks (gguf-py is the independent reference for ggml's layouts):
  <T>.blocks   NB random blocks of type T with sane f16 scales (NB*32 or NB*256 = 3072 elements)
  <T>.deq      gguf.quants.dequantize of those blocks, 3072 f32
  for F16 and BF16: 4096 random 16-bit patterns (no NaN) and their f32 values.
  Q5_0, Q5_1, Q5_K: the same (q5_fixtures, its own seed, added later: `make_quant_fixtures.py q5` writes
  only these and leaves the other files as they are).
Quantizers (gguf.quants.quantize, bit-exact ports of ggml's quantize_row_*_ref):
  quant_in.f32   3072 f32 inputs (random blocks, plus an all-zero, a constant, a one-hot block and blocks of
                 exact rounding ties for each quantizer)
  <T>.quant      gguf-py's quantization of quant_in for Q8_0, Q4_0, Q4_1, Q5_0, Q5_1 (gguf-py has no K-quant
                 quantizer: those are checked against llama-quantize, tests/weights/make_quantize_fixtures.py)
  fp16_in.f32    4096 f32 over the whole f16 range (subnormals, overflow, exact ties)
  fp16_out.u16   numpy's float16 conversion (round to nearest even); bf16_out.u16 gguf-py's BF16 quantize
Hugging Face transformers (LlamaRotaryEmbedding, LlamaRMSNorm, apply_rotary_pos_emb):
  rope_freqs.f32 inv_freq of the configurations in ROPE_CONFIGS, concatenated
  rope_pos.i32 / rope_in.f32 / rope_out.f32   rotate-half rope of (ROPE_M, ROPE_H, 64) q at ROPE_POS, config 1
  rms_in.f32 / rms_w.f32 / rms_out.f32        RMSNorm of (3, 333) rows, eps 1e-5
"""
import os
import sys

import numpy as np
import gguf
from gguf import GGMLQuantizationType as QT

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data")
rng = np.random.default_rng(20261130)


def write(name, arr):
    arr = np.ascontiguousarray(arr)
    with open(os.path.join(OUT, name), "wb") as f:
        f.write(arr.tobytes())


def sane_f16(n, lo=-3.0, hi=-1.0, signed=True):
    v = 10.0 ** rng.uniform(lo, hi, n)
    if signed:
        v *= rng.choice([-1.0, 1.0], n)
    return v.astype(np.float16).view(np.uint8).reshape(n, 2)


def random_blocks(qt, nb):
    bsz, tsz = gguf.GGML_QUANT_SIZES[qt]
    b = rng.integers(0, 256, size=(nb, tsz), dtype=np.uint8)
    if qt in (QT.Q8_0, QT.Q4_0):
        b[:, 0:2] = sane_f16(nb)
    elif qt == QT.Q4_1:
        b[:, 0:2] = sane_f16(nb, signed=False)
        b[:, 2:4] = sane_f16(nb, -2.0, 0.0)
    elif qt == QT.Q4_K:
        b[:, 0:2] = sane_f16(nb, signed=False)
        b[:, 2:4] = sane_f16(nb, -4.0, -2.0, signed=False)
    elif qt == QT.Q6_K:
        b[:, 208:210] = sane_f16(nb, -4.0, -2.0)
    elif qt == QT.Q5_0:
        b[:, 0:2] = sane_f16(nb)
    elif qt == QT.Q5_1:
        b[:, 0:2] = sane_f16(nb, signed=False)
        b[:, 2:4] = sane_f16(nb, -2.0, 0.0)
    elif qt == QT.Q5_K:
        b[:, 0:2] = sane_f16(nb, signed=False)
        b[:, 2:4] = sane_f16(nb, -4.0, -2.0, signed=False)
    return b


def quant_fixtures():
    n = 3072
    for qt, name in [(QT.Q8_0, "Q8_0"), (QT.Q4_0, "Q4_0"), (QT.Q4_1, "Q4_1"), (QT.Q4_K, "Q4_K"), (QT.Q6_K, "Q6_K")]:
        bsz, _ = gguf.GGML_QUANT_SIZES[qt]
        b = random_blocks(qt, n // bsz)
        deq = gguf.quants.dequantize(b, qt).astype(np.float32).reshape(-1)
        assert deq.size == n and np.all(np.isfinite(deq))
        write(name + ".blocks", b)
        write(name + ".deq", deq)

    bits = rng.integers(0, 65536, size=4096, dtype=np.uint32).astype(np.uint16)
    bits = bits[(bits & 0x7C00) != 0x7C00][:4000]  # F16: no inf/NaN in what dequant is asked to reproduce
    bits = np.concatenate([bits, np.array([0x7C00, 0xFC00, 0x0001, 0x8001, 0x03FF, 0x0400], np.uint16)])
    write("F16.blocks", bits)
    write("F16.deq", gguf.quants.dequantize(bits.view(np.uint8), QT.F16).astype(np.float32).reshape(-1))
    bb = rng.integers(0, 65536, size=4096, dtype=np.uint32).astype(np.uint16)
    bb = bb[(bb & 0x7F80) != 0x7F80][:4000]
    write("BF16.blocks", bb)
    write("BF16.deq", gguf.quants.dequantize(bb.view(np.uint8), QT.BF16).astype(np.float32).reshape(-1))

    x = (rng.standard_normal(n) * rng.choice([0.01, 1.0, 30.0], n)).astype(np.float32)
    x[0:32] = 0.0            # d = 0
    x[32:64] = 0.75          # Q4_1: max == min
    x[64:96] = 0.0
    x[70] = -2.5             # one-hot, negative extreme
    # Exact ties of each quantizer's rounding (ggml and gguf-py both round them away from zero / up):
    x[96:128] = np.array([127.0] + [k + 0.5 for k in range(-15, 16)], np.float32)       # Q8_0: d = 1
    x[128:160] = np.array([-8.0] + [k - 0.5 for k in range(-7, 8)] * 2 + [0.5], np.float32)  # Q4_0: d = 1
    x[160:192] = np.array([0.0, 15.0] + [k + 0.5 for k in range(0, 15)] * 2, np.float32)  # Q4_1: d = 1, m = 0
    write("quant_in.f32", x)
    for qt, name in [(QT.Q8_0, "Q8_0"), (QT.Q4_0, "Q4_0"), (QT.Q4_1, "Q4_1")]:
        write(name + ".quant", gguf.quants.quantize(x.reshape(1, -1), qt).reshape(-1))

    f = np.concatenate([
        rng.standard_normal(1024) * 10.0 ** rng.uniform(-9, 5, 1024),  # subnormal f16 .. overflow
        rng.uniform(-65520.0, 65520.0, 1024),
        np.float16(rng.uniform(-100, 100, 1024)).astype(np.float64) * (1 + 2.0 ** -11),  # ties (rounded to f32)
        rng.standard_normal(1024),
    ]).astype(np.float32)
    f[:4] = [np.inf, -np.inf, 65519.996, 2.0 ** -25]
    write("fp16_in.f32", f)
    write("fp16_out.u16", f.astype(np.float16).view(np.uint16))
    write("bf16_out.u16", gguf.quants.quantize(f, QT.BF16).view(np.uint16))


def q5_fixtures():
    """Q5_0, Q5_1, Q5_K blocks and their dequantization; gguf-py's Q5_0/Q5_1 quantization of quant_in.f32."""
    global rng
    rng = np.random.default_rng(20261201)
    n = 3072
    for qt, name in [(QT.Q5_0, "Q5_0"), (QT.Q5_1, "Q5_1"), (QT.Q5_K, "Q5_K")]:
        bsz, _ = gguf.GGML_QUANT_SIZES[qt]
        b = random_blocks(qt, n // bsz)
        deq = gguf.quants.dequantize(b, qt).astype(np.float32).reshape(-1)
        assert deq.size == n and np.all(np.isfinite(deq))
        write(name + ".blocks", b)
        write(name + ".deq", deq)
    x = np.fromfile(os.path.join(OUT, "quant_in.f32"), dtype=np.float32)
    for qt, name in [(QT.Q5_0, "Q5_0"), (QT.Q5_1, "Q5_1")]:
        write(name + ".quant", gguf.quants.quantize(x.reshape(1, -1), qt).reshape(-1))


# (theta, dim, scaling) — kept in the same order in test_ops.c.
ROPE_CONFIGS = [
    (10000.0, 64, None),
    (500000.0, 128, {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 8192}),
    (500000.0, 64, {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                    "original_max_position_embeddings": 8192}),
    (10000.0, 48, {"rope_type": "linear", "factor": 4.0}),
    (1000000.0, 128, None),
]
ROPE_M, ROPE_H = 7, 3
ROPE_POS = [0, 1, 2, 17, 255, 4095, 131071]


def hf_fixtures():
    import torch
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRMSNorm, LlamaRotaryEmbedding, apply_rotary_pos_emb

    torch.manual_seed(0)
    freqs, embs = [], []
    for theta, dim, sc in ROPE_CONFIGS:
        rp = {"rope_type": "default", "rope_theta": theta}
        if sc:
            rp = dict(sc, rope_theta=theta)
        cfg = LlamaConfig(hidden_size=dim * 4, num_attention_heads=4, head_dim=dim, rope_parameters=rp,
                          max_position_embeddings=131072)
        emb = LlamaRotaryEmbedding(cfg)
        freqs.append(emb.inv_freq.float().numpy())
        embs.append(emb)
    write("rope_freqs.f32", np.concatenate(freqs).astype(np.float32))

    emb = embs[1]
    q = torch.from_numpy(rng.standard_normal((1, ROPE_H, ROPE_M, 128)).astype(np.float32))
    pos = torch.tensor([ROPE_POS], dtype=torch.int64)
    cos, sin = emb(q, pos)
    qo, _ = apply_rotary_pos_emb(q, q, cos, sin)
    write("rope_pos.i32", np.array(ROPE_POS, np.int32))
    write("rope_in.f32", q[0].transpose(0, 1).contiguous().numpy())   # (m, heads, dim)
    write("rope_out.f32", qo[0].transpose(0, 1).contiguous().numpy())

    x = torch.from_numpy((rng.standard_normal((3, 333)) * np.array([[0.01], [1.0], [50.0]])).astype(np.float32))
    norm = LlamaRMSNorm(333, eps=1e-5)
    with torch.no_grad():
        norm.weight.copy_(torch.from_numpy(rng.uniform(0.5, 2.0, 333).astype(np.float32)))
        y = norm(x)
    write("rms_in.f32", x.numpy())
    write("rms_w.f32", norm.weight.detach().numpy())
    write("rms_out.f32", y.numpy())


if __name__ == "__main__":
    os.makedirs(OUT, exist_ok=True)
    if sys.argv[1:] != ["q5"]:
        quant_fixtures()
        hf_fixtures()
    q5_fixtures()
    total = sum(os.path.getsize(os.path.join(OUT, f)) for f in os.listdir(OUT))
    print(f"wrote {len(os.listdir(OUT))} files, {total} bytes to {OUT}", file=sys.stderr)
