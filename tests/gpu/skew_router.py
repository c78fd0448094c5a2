#!/usr/bin/env python3
"""skew_router.py IN OUT [--cold-gain G] — a copy of an expert model's GGUF whose routers favour a quarter of
the experts, for timing the device expert cache on skewed routing (ferry bench --model OUT --gpu-memory ...,
with and without --expert-cache 0).

The hot quarter is experts 1, 5, 9, ... (every fourth, not the first ones, which the cache holds at start-up).
Each layer's router (blk.N.ffn_gate_inp.weight, one row of dim per expert, F32 or F16) keeps the hot rows
and multiplies the others by G (default 0.25): the cold experts' logits shrink towards zero, so the top-k of
a token is mostly hot experts whose logits are positive. The share of picks the hot quarter gets is printed
per layer from random inputs of the row's scale (a trained model's activations differ; `ferry bench` prints
the hit rate it reached). Nothing else changes: the file is copied and its routers rewritten in place.
Usage with make_moe_gguf.py's Qwen3-30B-A3B-shaped file:
  python3 tests/gpu/make_moe_gguf.py /tmp/q3moe.gguf && python3 tests/gpu/skew_router.py /tmp/q3moe.gguf /tmp/q3moe_skew.gguf
"""
import argparse
import re
import shutil

import numpy as np
from gguf import GGUFReader


def hot_share(w, k, rng, n=2000):
    """Share of the top-k picks of n random inputs that land on the hot quarter."""
    x = rng.standard_normal((n, w.shape[1])).astype(np.float32)
    logits = x @ w.T.astype(np.float32)
    top = np.argsort(-logits, axis=1)[:, :k]
    return float(np.mean(top % 4 == 1))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("src")
    ap.add_argument("dst")
    ap.add_argument("--cold-gain", type=float, default=0.25)
    a = ap.parse_args()
    shutil.copyfile(a.src, a.dst)
    r = GGUFReader(a.dst, "r+")
    k = 1
    for f in r.fields.values():
        if f.name.endswith(".expert_used_count"):
            k = int(f.parts[f.data[0]][0])
    rng = np.random.default_rng(0)
    n = 0
    for t in r.tensors:
        if not re.fullmatch(r"blk\.\d+\.ffn_gate_inp\.weight", t.name):
            continue
        if t.tensor_type.name not in ("F32", "F16"):
            raise SystemExit(f"{t.name}: {t.tensor_type.name} router, expected F32 or F16")
        w = t.data  # (experts, dim), a writable view of the file
        before = hot_share(w, k, rng)
        cold = np.arange(w.shape[0]) % 4 != 1
        w[cold] = (w[cold].astype(np.float32) * a.cold_gain).astype(w.dtype)
        print(f"{t.name}: {w.shape[0]} experts, top-{k}: hot quarter {before:.0%} -> {hot_share(w, k, rng):.0%} of picks")
        n += 1
    if not n:
        raise SystemExit(f"{a.src}: no blk.N.ffn_gate_inp.weight router")
    r.data.flush()


if __name__ == "__main__":
    main()
