#!/usr/bin/env python3
"""Writes tests/runtime/data/embeddings.json: the reference for ferry's embeddings (the engine's hidden-state
rows, runtime/engine.h `batch.hidden`, pooled by server/scheduler.c).

For the tiny Hugging Face models of tests/golden/models and for stories260K (its GGUF read by transformers),
and a few token-id inputs: transformers' final hidden states (last_hidden_state: after the final RMSNorm) in
float32, pooled by mean over the positions and by the last position. Not normalized (the test normalizes).
CI uses the committed file. Run: python3 tests/runtime/make_embd_golden.py  (needs torch, transformers, gguf)
"""
import json
import os

import torch
from transformers import AutoConfig, AutoModelForCausalLM

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
TESTDATA = os.environ.get("FERRY_TESTDATA", os.path.join(ROOT, "..", "shared", "testdata"))


def pooled(model, ids):
    with torch.no_grad():
        h = model.model(torch.tensor([ids])).last_hidden_state[0].double()
    return {"ids": ids, "mean": h.mean(0).tolist(), "last": h[-1].tolist()}


def inputs(vocab, seed):
    g = torch.Generator().manual_seed(seed)
    return [[int(t) for t in torch.randint(1, vocab, (n,), generator=g)] for n in (1, 5, 37, 120)]


def main():
    out = {"generator": "tests/runtime/make_embd_golden.py", "torch": torch.__version__, "models": {}}
    for name in sorted(os.listdir(os.path.join(ROOT, "tests", "golden", "models"))):
        path = os.path.join(ROOT, "tests", "golden", "models", name)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
        vocab = model.config.vocab_size
        out["models"][name] = {"path": f"tests/golden/models/{name}",
                               "cases": [pooled(model, ids) for ids in inputs(vocab, 7)]}
    gguf = os.path.join(TESTDATA, "models", "stories260K.gguf")
    cfg = AutoConfig.from_pretrained(os.path.dirname(gguf), gguf_file=os.path.basename(gguf))
    cfg.pad_token_id = None  # the converted config names a pad id outside the 512-token vocabulary
    model = AutoModelForCausalLM.from_pretrained(os.path.dirname(gguf), gguf_file=os.path.basename(gguf), config=cfg,
                                                 dtype=torch.float32).eval()
    # "Once upon a time" as llama.cpp tokenizes it (BOS first), then random ids
    out["models"]["stories260K"] = {"path": "testdata:models/stories260K.gguf",
                                    "cases": [pooled(model, [1, 403, 407, 261, 378])] +
                                             [pooled(model, ids) for ids in inputs(512, 9)]}
    path = os.path.join(HERE, "data", "embeddings.json")
    with open(path, "w") as f:
        json.dump(out, f)
        f.write("\n")
    print("wrote", path, os.path.getsize(path), "bytes")


if __name__ == "__main__":
    main()
