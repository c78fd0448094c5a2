#!/usr/bin/env python3
"""Writes tests/weights/fixtures/quantize_llama.json: what llama.cpp's llama-quantize makes of three small random
GGUF models, for tests/weights/test_quantize_llama.c to compare ferry's quantizer with, byte for byte.

Made with llama.cpp lcp0336 (October 2026), a CPU build of its llama-quantize (cmake -DGGML_NATIVE=OFF, so
ggml-base has no FMA, as ferry's quant/ is built; the ten legacy and Q4/Q5/Q6 K types were first recorded with
b4748, and lcp0336 writes the same bytes for them):

    python3 tests/weights/make_quantize_fixtures.py [BUILD/bin/llama-quantize [PEER_LABEL]]

Needs numpy and gguf (gguf-py). The models (the C test rebuilds them with the same generator and ferry's GGUF
writer, and checks that its file hashes to the input_sha256 recorded here, so both sides start from the same
bytes):
  a_f32  llama, 10 layers, dim 256, 4 heads / 1 KV head of 64, ffn 352, vocab 103, output.weight; a small SPM
         tokenizer in the metadata. ffn_down has 352 columns: a multiple of 32 but not of 256, so the K mixes
         fall back there (Q4_K -> Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0). Ten layers make use_more_bits pick layers
         0, 3, 6, 8, 9 for Q6_K in Q4_K_M/Q5_K_M.
  a_f16  the same model with its matrices in F16 (norms F32, as convert_hf_to_gguf.py writes them).
  b_f32  llama, 80 layers with grouped-query attention (llama.cpp's "70B" class: attn_v bumped), dim 32,
         2 heads / 1 KV head of 16, ffn 256, vocab 67, tied embeddings (token_embd is the head).
  c_moe  llama with 8 experts of ffn 256 (Mixtral's layout: ffn_gate_inp and stacked ffn_*_exps), 4 layers,
         dim 256, 4 heads / 1 KV head of 64, vocab 103: the 8-expert rules and MXFP4_MOE's experts.
Values: element e of tensor t (file order) is g = u0+u1+u2+u3-2 with u_k = (splitmix64(t*2^40 + 4e + k) >> 40)
* 2^-24, and a row kind by row index r % 11 (scales 1, 0.02, 30; all zero; constant 0.25; scale 1e-7;
multiples of 1/8; one outlier x64; |g|; every other 32-block zero; scale 1e-30), rounded once to f32 from
double. Norms are 1 + 0.1 g.
For each model and each type the fixture holds the output file's SHA-256, and for every tensor (in the output's
order, names listed once per model) its type (space-separated) and the first 8 hex digits of its data's SHA-256
(concatenated): enough to name the first tensor that differs when the file hash does not match; and for two
tensors per output, the bytes of their first row.
"""
import hashlib
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
import gguf

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "fixtures", "quantize_llama.json")
TYPES = ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K_S", "Q4_K_M", "Q5_K_S", "Q5_K_M", "Q6_K",
         "Q2_K", "Q3_K_S", "Q3_K_M", "Q3_K_L", "IQ4_NL", "IQ4_XS", "MXFP4_MOE"]

M64 = np.uint64(0xFFFFFFFFFFFFFFFF)


def splitmix64(x):
    with np.errstate(over="ignore"):
        z = x + np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


def base_values(t, n):
    e = np.arange(n, dtype=np.uint64)
    key = np.uint64(t) * np.uint64(1 << 40) + np.uint64(4) * e
    g = np.zeros(n, np.float64)
    for k in range(4):
        g += (splitmix64(key + np.uint64(k)) >> np.uint64(40)).astype(np.float64) * 2.0 ** -24
    return g - 2.0


def matrix(t, rows, cols):
    g = base_values(t, rows * cols).reshape(rows, cols)
    out = np.empty((rows, cols), np.float32)
    col = np.arange(cols)
    for r in range(rows):
        k = r % 11
        row = g[r]
        if k == 0:
            v = row * 1.0
        elif k == 1:
            v = row * 0.02
        elif k == 2:
            v = row * 30.0
        elif k == 3:
            v = row * 0.0
        elif k == 4:
            v = np.full(cols, 0.25)
        elif k == 5:
            v = row * 1e-7
        elif k == 6:
            v = np.floor(row * 16.0) / 8.0
        elif k == 7:
            v = row.copy()
            v[(r * 37) % cols] *= 64.0
        elif k == 8:
            v = np.abs(row)
        elif k == 9:
            v = np.where((col // 32) % 2 == 1, 0.0, row)
        else:
            v = row * 1e-30
        out[r] = v.astype(np.float32)
    return out


def norm(t, n):
    return (1.0 + 0.1 * base_values(t, n)).astype(np.float32)


# (name, n_layers, dim, heads, kv_heads, head_dim, ffn, vocab, tied, f16, tokenizer, n_expert, n_expert_used)
MODELS = [
    ("a_f32", 10, 256, 4, 1, 64, 352, 103, False, False, True, 0, 0),
    ("a_f16", 10, 256, 4, 1, 64, 352, 103, False, True, True, 0, 0),
    ("b_f32", 80, 32, 2, 1, 16, 256, 67, True, False, False, 0, 0),
    ("c_moe", 4, 256, 4, 1, 64, 256, 103, False, False, True, 8, 2),
]


def tensors_of(spec):
    """(name, array) in file order; matrices as (rows, cols) = (ne1, ne0)."""
    _, L, dim, nh, nkv, hd, ffn, vocab, tied, f16, _, ne, _ = spec
    shapes = [("token_embd.weight", (vocab, dim))]
    for l in range(L):
        p = f"blk.{l}."
        shapes += [(p + "attn_norm.weight", (dim,)), (p + "attn_q.weight", (nh * hd, dim)),
                   (p + "attn_k.weight", (nkv * hd, dim)), (p + "attn_v.weight", (nkv * hd, dim)),
                   (p + "attn_output.weight", (dim, nh * hd)), (p + "ffn_norm.weight", (dim,))]
        if ne:
            shapes += [(p + "ffn_gate_inp.weight", (ne, dim)), (p + "ffn_gate_exps.weight", (ne, ffn, dim)),
                       (p + "ffn_up_exps.weight", (ne, ffn, dim)), (p + "ffn_down_exps.weight", (ne, dim, ffn))]
        else:
            shapes += [(p + "ffn_gate.weight", (ffn, dim)), (p + "ffn_up.weight", (ffn, dim)),
                       (p + "ffn_down.weight", (dim, ffn))]
    shapes.append(("output_norm.weight", (dim,)))
    if not tied:
        shapes.append(("output.weight", (vocab, dim)))
    out = []
    for t, (name, shape) in enumerate(shapes):
        if len(shape) == 1:
            out.append((name, norm(t, shape[0])))
        else:  # stacked experts are valued as one (experts * rows, cols) matrix
            m = matrix(t, int(np.prod(shape[:-1])), shape[-1]).reshape(shape)
            out.append((name, m.astype(np.float16) if f16 else m))
    return out


def write_model(spec, path):
    name, L, dim, nh, nkv, hd, ffn, vocab, tied, f16, tok, n_expert, n_used = spec
    w = gguf.GGUFWriter(path, "llama")
    w.add_name("quantfixture-" + name)
    w.add_context_length(512)
    w.add_embedding_length(dim)
    w.add_feed_forward_length(ffn)
    w.add_block_count(L)
    w.add_head_count(nh)
    w.add_head_count_kv(nkv)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_file_type(1 if f16 else 0)  # dropped and re-added at the end by llama-quantize
    w.add_rope_dimension_count(hd)
    w.add_quantization_version(2)  # likewise
    if n_expert:
        w.add_expert_count(n_expert)
        w.add_expert_used_count(n_used)
    if tok:
        w.add_tokenizer_model("llama")
        toks = ["<unk>", "<s>", "</s>"] + ["\u2581t%d" % i for i in range(vocab - 3)]
        w.add_token_list(toks)
        w.add_token_scores([-float(i) for i in range(vocab)])
        w.add_token_types([2, 3, 3] + [1] * (vocab - 3))
        w.add_bos_token_id(1)
        w.add_eos_token_id(2)
        w.add_add_bos_token(True)
    for tname, arr in tensors_of(spec):
        w.add_tensor(tname, arr)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def sha(b):
    return hashlib.sha256(b).hexdigest()


def describe(path):
    r = gguf.GGUFReader(path)
    tensors = []
    for t in r.tensors:
        data = bytes(t.data.tobytes())
        tensors.append({"name": t.name, "type": t.tensor_type.name, "sha": sha(data)[:8]})
    return r, tensors


def main():
    quantize = sys.argv[1] if len(sys.argv) > 1 else "/tmp/llcpu/bin/llama-quantize"
    peer = sys.argv[2] if len(sys.argv) > 2 else "lcp0336"
    out = os.environ.get("QFIX_OUT", OUT)
    fixture = {"llama_cpp": peer + ", llama-quantize CPU build, default options, no imatrix",
               "types": TYPES, "models": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for spec in MODELS:
            name = spec[0]
            src = os.path.join(tmp, name + ".gguf")
            write_model(spec, src)
            entry = {"input_sha256": sha(open(src, "rb").read()), "outputs": {}}
            for ty in TYPES:
                dst = os.path.join(tmp, f"{name}-{ty}.gguf")
                subprocess.run([quantize, src, dst, ty, "2"], check=True, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
                r, tensors = describe(dst)
                if "names" not in entry:
                    entry["names"] = [t["name"] for t in tensors]
                assert entry["names"] == [t["name"] for t in tensors]
                # The first row of the first attn_v and ffn_down: bytes to compare when a hash differs.
                rows = {}
                for t in r.tensors:
                    if t.name in ("blk.0.attn_v.weight", "blk.0.ffn_down.weight"):
                        raw = t.data.tobytes()
                        rows[t.name] = raw[: len(raw) // int(t.shape[1])].hex()
                entry["outputs"][ty] = {"sha256": sha(open(dst, "rb").read()),
                                        "types": " ".join(t["type"] for t in tensors),
                                        "tensor_sha": "".join(t["sha"] for t in tensors),
                                        "first_rows": rows}
                os.remove(dst)
            fixture["models"][name] = entry
            print(f"{name}: done", file=sys.stderr)
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out, "w") as f:
        json.dump(fixture, f, indent=1, separators=(",", ": "))
        f.write("\n")
    print(f"wrote {out} ({os.path.getsize(out)} bytes)", file=sys.stderr)


if __name__ == "__main__":
    main()
