#!/usr/bin/env python3
"""Writes tests/quant/fixtures/mix_snapshots.txt: llama.cpp's own record of the type each tensor gets in each
quantization mix, for tests/quant/test_mix.c to hold ferry's quant/mix.c to.

llama.cpp lcp0336 keeps these records as tests/snapshots/*.schema (written by its test-quant-type-selection from
llama_tensor_get_type on the tensor lists of published GGUF files): per model a header with its dimensions, then
per file type a section "[FTYPE] default_type" listing every tensor whose type differs from the default. This
script copies, unchanged, the sections of the file types whose rules ferry has (quant/mix.c) for the models of families ferry reads
(Qwen3 dense, Gemma 3, Llama 3.1 70B) and gpt-oss (for the MoE expert rules and row-length fallbacks: its rows of
2880 fit no 256-block).

    python3 tests/quant/make_mix_fixtures.py [LLAMA_CPP_DIR]   # default /work/peer/lcp0336
"""
import os
import sys

PEER = sys.argv[1] if len(sys.argv) > 1 else os.environ.get("LLAMA_CPP_DIR", "/work/peer/lcp0336")
OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "mix_snapshots.txt")
MODELS = ["qwen3-0.6b", "qwen3-14b", "gemma-3-4b-it", "meta-llama-3.1-70b-instruct", "gpt-oss-120b"]
FTYPES = {"Q2_K", "Q3_K_S", "Q3_K_M", "Q3_K_L", "Q4_K_S", "Q4_K_M", "Q5_K_S", "Q5_K_M", "Q6_K", "IQ4_NL",
          "IQ4_XS", "MXFP4_MOE", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "F16", "BF16", "F32", "IQ2_XS", "IQ3_S",
          "IQ3_M", "IQ3_XS", "IQ3_XXS", "IQ2_XXS", "Q2_K_S", "IQ2_S", "IQ2_M", "IQ1_S", "IQ1_M"}


def main():
    out = ["# llama.cpp lcp0336 tests/snapshots/*.schema, sections of the file types ferry writes "
           "(make_mix_fixtures.py)"]
    for m in MODELS:
        keep = True
        with open(os.path.join(PEER, "tests", "snapshots", m + ".schema")) as f:
            for line in f.read().splitlines():
                if line.startswith("["):
                    keep = line[1:line.index("]")] in FTYPES
                if line.startswith("# Model:"):
                    keep = True
                if keep and line.strip():
                    out.append(line)
    with open(OUT, "w") as f:
        f.write("\n".join(out) + "\n")
    print("wrote", OUT, len(out), "lines")


if __name__ == "__main__":
    main()
