#!/usr/bin/env python3
"""Writes tests/weights/fixtures/quantize_imatrix.json: what llama.cpp's llama-quantize --imatrix makes of two
small random GGUF models with a synthetic importance matrix, for tests/weights/test_quantize_imatrix.c.

Made with llama.cpp lcp0336 (October 2026), the CPU build of llama-quantize of make_quantize_fixtures.py
(cmake -DGGML_NATIVE=OFF):

    python3 tests/weights/make_quantize_imatrix_fixtures.py BUILD/bin/llama-quantize [PEER_LABEL]

Models: a_f32 and c_moe of make_quantize_fixtures.py (the same generator; the C test rebuilds them and checks
their SHA-256). The importance matrix, written by this script (and rebuilt by the C test, value for value):
for every matrix of the model but token_embd and blk.0.attn_k (left out: quantized without weights), n_mat =
its experts (1 for a dense matrix) and ne0 = its columns; count of matrix j = 7 + 3 j, but 0 for expert 5
(llama-quantize then weighs that expert by 1); sums[j * ne0 + i] = count_j * (0.05 + u) * (21 if i % 17 == 0
else 1) rounded once to f32 from double, u = (splitmix64((t + 500) * 2^40 + j * ne0 + i) >> 40) * 2^-24 with t
the tensor's index in the model. token_embd gets an entry of ne0 + 5 values (a wrong size llama-quantize
ignores for the token embedding). Metadata: imatrix.datasets ["fixture.txt"], imatrix.chunk_count 11,
imatrix.chunk_size 512. The legacy .dat holds the same entries with ncall 3 and the sums as values (so the
weights are sums / 3), then chunk count 11 and the dataset name. imatrix-full.gguf also has blk.0.attn_k, for
the mixes llama-quantize refuses to write without weights (IQ2_XS, IQ2_XXS, IQ2_S, IQ2_M, IQ3_XS, IQ3_XXS, IQ1_S,
IQ1_M, Q2_K_S). IQ3_S and IQ3_M are also recorded without an importance matrix (plain_outputs).

llama-quantize runs in the temporary directory with the imatrix named "imatrix.gguf" (or "imatrix.dat"): that
name is what it records in quantize.imatrix.file, and the C test passes the same name from its directory.
For each model, imatrix format and type the fixture holds the output file's SHA-256, and per tensor its type
and the first 8 hex digits of its data's SHA-256.
"""
import hashlib
import json
import os
import struct
import subprocess
import sys
import tempfile

import numpy as np
import gguf

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_quantize_fixtures as mq  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "fixtures", "quantize_imatrix.json")
TYPES = ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K_S", "Q3_K_M", "Q4_K_S", "Q4_K_M", "Q5_K_M",
         "Q6_K", "IQ4_NL", "IQ4_XS", "IQ3_S", "IQ3_M"]
LEGACY_TYPES = ["Q4_K_M", "IQ4_XS"]
# These need an entry for every quantized matrix: imatrix-full.gguf.
FULL_TYPES = ["IQ2_XS", "IQ2_XXS", "IQ2_S", "IQ2_M", "IQ3_XS", "IQ3_XXS", "IQ1_S", "IQ1_M", "Q2_K_S"]
PLAIN_TYPES = ["IQ3_S", "IQ3_M"]  # i-quant mixes llama-quantize also writes without an importance matrix
MODELS = ["a_f32", "c_moe"]


def imatrix_entries(spec, full=False):
    """[(name, sums (n_mat * ne0) f32, counts (n_mat) f32)] in tensor order."""
    out = []
    for t, (name, arr) in enumerate(mq.tensors_of(spec)):
        if arr.ndim < 2 or (name == "blk.0.attn_k.weight" and not full):
            continue
        ne0 = arr.shape[-1]
        n_mat = arr.shape[0] if arr.ndim == 3 else 1
        if name == "token_embd.weight":
            ne0 += 5
        counts = np.array([0.0 if (n_mat > 1 and j == 5) else 7.0 + 3.0 * j for j in range(n_mat)])
        e = np.arange(n_mat * ne0, dtype=np.uint64)
        u = (mq.splitmix64(np.uint64(t + 500) * np.uint64(1 << 40) + e) >> np.uint64(40)).astype(np.float64)
        u *= 2.0 ** -24
        col = (np.arange(n_mat * ne0) % ne0)
        heavy = np.where(col % 17 == 0, 21.0, 1.0)
        sums = (np.repeat(counts, ne0) * (0.05 + u) * heavy).astype(np.float32)
        out.append((name, sums, counts.astype(np.float32)))
    return out


def write_imatrix_gguf(entries, path):
    w = gguf.GGUFWriter(path, "llama")
    w.add_string("general.type", "imatrix")
    w.add_array("imatrix.datasets", ["fixture.txt"])
    w.add_uint32("imatrix.chunk_count", 11)
    w.add_uint32("imatrix.chunk_size", 512)
    for name, sums, counts in entries:
        n_mat = len(counts)
        w.add_tensor(name + ".in_sum2", sums.reshape(n_mat, len(sums) // n_mat))
        w.add_tensor(name + ".counts", counts.reshape(n_mat, 1))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def write_imatrix_dat(entries, path):
    with open(path, "wb") as f:
        f.write(struct.pack("<i", len(entries)))
        for name, sums, _ in entries:
            nb = name.encode()
            f.write(struct.pack("<i", len(nb)) + nb + struct.pack("<ii", 3, len(sums)))
            f.write(sums.astype("<f4").tobytes())
        ds = b"fixture.txt"
        f.write(struct.pack("<ii", 11, len(ds)) + ds)


def main():
    quantize = sys.argv[1]
    peer = sys.argv[2] if len(sys.argv) > 2 else "lcp0336"
    fixture = {"llama_cpp": peer + ", llama-quantize CPU build, --imatrix", "types": TYPES,
               "legacy_types": LEGACY_TYPES, "full_types": FULL_TYPES, "plain_types": PLAIN_TYPES,
               "models": {}}
    specs = {s[0]: s for s in mq.MODELS}
    with tempfile.TemporaryDirectory() as tmp:
        for name in MODELS:
            spec = specs[name]
            src = os.path.join(tmp, name + ".gguf")
            mq.write_model(spec, src)
            entries = imatrix_entries(spec)
            write_imatrix_gguf(entries, os.path.join(tmp, "imatrix.gguf"))
            write_imatrix_dat(entries, os.path.join(tmp, "imatrix.dat"))
            write_imatrix_gguf(imatrix_entries(spec, True), os.path.join(tmp, "imatrix-full.gguf"))
            entry = {"input_sha256": mq.sha(open(src, "rb").read()), "outputs": {}, "legacy_outputs": {},
                     "full_outputs": {}, "plain_outputs": {}}
            for fmt, types, key in (("gguf", TYPES, "outputs"), ("dat", LEGACY_TYPES, "legacy_outputs"),
                                    ("gguf", FULL_TYPES, "full_outputs"), (None, PLAIN_TYPES, "plain_outputs")):
                im = "imatrix-full.gguf" if key == "full_outputs" else "imatrix.%s" % fmt
                for ty in types:
                    dst = os.path.join(tmp, f"{name}-{ty}.gguf")
                    args = ["--imatrix", im] if fmt else []
                    subprocess.run([quantize] + args + [src, dst, ty, "2"], check=True,
                                   cwd=tmp, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                    _, tensors = mq.describe(dst)
                    names = [t["name"] for t in tensors]
                    entry.setdefault("names", names)
                    assert entry["names"] == names
                    entry[key][ty] = {"sha256": mq.sha(open(dst, "rb").read()),
                                      "types": " ".join(t["type"] for t in tensors),
                                      "tensor_sha": "".join(t["sha"] for t in tensors)}
                    os.remove(dst)
            fixture["models"][name] = entry
            print(f"{name}: done", file=sys.stderr)
    with open(OUT, "w") as f:
        json.dump(fixture, f, indent=1, separators=(",", ": "))
        f.write("\n")
    print(f"wrote {OUT} ({os.path.getsize(OUT)} bytes)", file=sys.stderr)


if __name__ == "__main__":
    main()
