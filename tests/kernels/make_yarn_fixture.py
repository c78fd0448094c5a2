#!/usr/bin/env python3
"""make_yarn_fixture.py — transformers' YaRN rotary parameters, the reference of kern_cpu_rope_freqs' yarn.

Writes tests/kernels/data/rope_yarn.f32: for each configuration of YARN_CONFIGS in order, the rope_dim/2
inverse frequencies of transformers' _compute_yarn_parameters (through the rotary embedding of a model that
uses it, LlamaRotaryEmbedding) followed by its attention factor (`attention_scaling`), all float32.
tests/kernels/test_ops.c lists the same configurations. Run: python3 tests/kernels/make_yarn_fixture.py
(needs torch and transformers; CI reads the committed file).
"""
import os

import numpy as np
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "rope_yarn.f32")

# (rope_theta, rope_dim, factor, original_max_position_embeddings, beta_fast, beta_slow, truncate,
#  attention_factor or None)
YARN_CONFIGS = [
    (150000.0, 64, 32.0, 4096, 32.0, 1.0, False, None),   # gpt-oss-20b/120b
    (150000.0, 64, 32.0, 4096, 32.0, 1.0, True, None),    # the same, truncated (transformers' default)
    (1000000.0, 128, 4.0, 32768, 32.0, 1.0, True, None),  # Qwen3 / Mistral-style long context
    (10000.0, 80, 2.5, 1000, 16.0, 2.0, True, 1.25),      # odd sizes, explicit attention factor
    (150000.0, 16, 4.0, 256, 32.0, 1.0, False, None),     # the gpt-oss golden model's
    (500000.0, 48, 8.0, 64, 32.0, 1.0, True, None),       # a correction range clipped at 0
]


def main():
    out = []
    for theta, dim, factor, orig, bf, bs, trunc, af in YARN_CONFIGS:
        rp = {"rope_type": "yarn", "rope_theta": theta, "factor": factor,
              "original_max_position_embeddings": orig, "beta_fast": bf, "beta_slow": bs, "truncate": trunc}
        if af is not None:
            rp["attention_factor"] = af
        cfg = LlamaConfig(hidden_size=dim * 4, num_attention_heads=4, head_dim=dim, rope_parameters=rp,
                          max_position_embeddings=int(orig * factor))
        emb = LlamaRotaryEmbedding(cfg)
        out.append(emb.inv_freq.float().numpy())
        out.append(np.array([emb.attention_scaling], np.float32))
    np.concatenate(out).astype(np.float32).tofile(OUT)


if __name__ == "__main__":
    main()
