#!/usr/bin/env python3
"""convert_llamacpp.py — a tiny golden checkpoint converted to GGUF by llama.cpp's own converter.

Runs convert_hf_to_gguf.py's model class for the checkpoint's architecture (from the llama.cpp source tree
given by LLAMA_CPP, default /work/peer/lcp0336) with its vocabulary step replaced by tokenizer model "none"
(the golden checkpoints have no tokenizer; the tests feed token ids): the keys, tensor names, q/k
permutation and extra tensors are the converter's own.
Run: python3 tests/golden/convert_llamacpp.py MODEL_DIR OUT.gguf [f32|f16|bf16]  (needs torch and the llama.cpp
source tree; the GGUFs it wrote are committed beside the checkpoints)
"""
import os
import sys
from pathlib import Path

ROOT = Path(os.environ.get("LLAMA_CPP", "/work/peer/lcp0336"))
sys.path.insert(0, str(ROOT / "gguf-py"))
sys.path.insert(0, str(ROOT))

import gguf  # noqa: E402
from conversion import get_model_class  # noqa: E402
from conversion.base import ModelBase  # noqa: E402


def main():
    src, out = Path(sys.argv[1]), Path(sys.argv[2])
    ftype = {"f32": gguf.LlamaFileType.ALL_F32, "f16": gguf.LlamaFileType.MOSTLY_F16,
             "bf16": gguf.LlamaFileType.MOSTLY_BF16}[sys.argv[3] if len(sys.argv) > 3 else "f32"]
    hparams = ModelBase.load_hparams(src, False)
    cls = get_model_class(hparams["architectures"][0])

    model = cls(src, ftype, out, eager=True)
    # Mistral3Model converts through an inner model (impl) that writes the file.
    inner = getattr(model, "impl", model)
    inner.set_vocab = lambda: inner.gguf_writer.add_tokenizer_model("none")
    model.write()


if __name__ == "__main__":
    main()
