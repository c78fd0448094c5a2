#!/usr/bin/env python3
"""make_rope_golden.py — tiny random models of the rotary variants LongRoPE (Phi-3.5-mini, Phi-4-mini) and
Mistral 3 (YaRN with the Llama 4 attention temperature), and transformers' reference outputs.

Writes, under tests/golden/models/NAME/: config.json + model.safetensors, and tests/golden/NAME.json: per
prompt the last-position logits and the greedy tokens of transformers in float32 (as make_golden.py), and
the context size ferry must run the case with ("ctx_size"):

  LongRoPE: transformers rotates with the short factors while the sequence (max position + 1) is within
  original_max_position_embeddings and with the long ones beyond (its generate() recomputes the whole cache
  when a sequence crosses); ferry, like llama.cpp, picks one set for its context size. The cases stay on
  one side: prompts of 1 and 7 tokens plus 24 greedy tokens end within the original 32 positions (ferry
  runs them with a context of 32: short factors), prompts of 33 and 200 start beyond it (a context of 512:
  long factors).
  phi35_longrope_f32   Phi-3.5-mini's shape: every dim rotates (the attention factor sqrt(1 + ln 8 / ln 32)
                       folds into the attention scale), GQA 4/2, head 16, 2 layers, untied, f32
  phi4mini_longrope_bf16  Phi-4-mini's shape: partial rotary 0.75 (12 of 16 dims; the attention factor
                       scales the rotated dims only), GQA 6/2, tied embeddings, 2 layers, bf16
  ministral3_temp_f32  Ministral 3: YaRN (factor 4 over an original 16 positions, mscale and mscale_all_dim
                       1: attention factor 1), llama_4_scaling_beta 0.3 (the queries of positions 16.. are
                       scaled by 1 + 0.3 ln(1 + floor(p / 16))), GQA 4/2, head 16, 2 layers, untied, f32;
                       prompts of 1, 7, 33 and 200 with a context of 512, and the 7-token prompt's logits
                       alone with a context of 16 (no greedy tokens), where the temperature is 1 throughout
Run: python3 tests/golden/make_rope_golden.py [NAME...]  (needs torch, transformers, safetensors; CI uses the
committed output)
"""
import json
import os
import sys

import torch
from transformers import Ministral3Config, Ministral3ForCausalLM, Phi3Config, Phi3ForCausalLM

from make_golden import N_GREEDY, greedy, init_weights

HERE = os.path.dirname(os.path.abspath(__file__))


def factors(g, n, lo, hi):
    """n increasing LongRoPE factors between lo and hi (as the released lists: near 1 for the fast dims)."""
    f = torch.sort(lo + (hi - lo) * torch.rand(n, generator=g, dtype=torch.float64)).values
    return [round(float(x), 4) for x in f]


def make(name, cfg_cls, model_cls, cfg_kwargs, dtype, seed, cases):
    """cases: (prompt length, ferry's context size, greedy tokens)."""
    torch.manual_seed(seed)
    model = model_cls(cfg_cls(**cfg_kwargs)).eval()
    init_weights(model, seed)
    model = model.to(dtype)
    out_dir = os.path.join(HERE, "models", name)
    os.makedirs(out_dir, exist_ok=True)
    model.save_pretrained(out_dir, safe_serialization=True)
    p = os.path.join(out_dir, "generation_config.json")
    if os.path.exists(p):
        os.remove(p)
    ref = model_cls.from_pretrained(out_dir, dtype=torch.float32).eval()
    g = torch.Generator().manual_seed(seed + 1)
    out_cases = []
    for n, ctx, n_greedy in cases:
        ids = torch.randint(0, ref.config.vocab_size, (n,), generator=g).tolist()
        assert n + n_greedy <= ctx
        with torch.no_grad():
            logits = ref(torch.tensor([ids])).logits[0, -1]
        toks, margin = greedy(ref, ids, n_greedy) if n_greedy else ([], float("inf"))
        out_cases.append({"prompt_tokens": ids, "ctx_size": ctx, "logits": [float(x) for x in logits],
                          "greedy_tokens": toks, "min_top2_margin": margin if n_greedy else None})
        print(f"{name}: prompt {n:3d} ctx {ctx:3d} min top-2 margin {margin:.4f} "
              f"logit absmax {float(logits.abs().max()):.2f}")
    with open(os.path.join(HERE, name + ".json"), "w") as f:
        json.dump({"model": f"models/{name}", "dtype": str(dtype).replace("torch.", ""), "cases": out_cases}, f)


LONGROPE_CASES = [(1, 32, N_GREEDY), (7, 32, N_GREEDY), (33, 512, N_GREEDY), (200, 512, N_GREEDY)]


def phi35():
    g = torch.Generator().manual_seed(201)
    make("phi35_longrope_f32", Phi3Config, Phi3ForCausalLM, dict(
        vocab_size=199, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=256, original_max_position_embeddings=32,
        rms_norm_eps=1e-5, rope_parameters={"rope_type": "longrope", "rope_theta": 10000.0,
                                            "short_factor": factors(g, 8, 1.0, 1.6),
                                            "long_factor": factors(g, 8, 1.0, 12.0)},
        sliding_window=None, tie_word_embeddings=False, bos_token_id=1, eos_token_id=2, pad_token_id=0),
        torch.float32, 202, LONGROPE_CASES)


def phi4mini():
    g = torch.Generator().manual_seed(211)
    make("phi4mini_longrope_bf16", Phi3Config, Phi3ForCausalLM, dict(
        vocab_size=223, hidden_size=96, intermediate_size=80, num_hidden_layers=2, num_attention_heads=6,
        num_key_value_heads=2, max_position_embeddings=512, original_max_position_embeddings=32,
        rms_norm_eps=1e-5, rope_parameters={"rope_type": "longrope", "rope_theta": 10000.0,
                                            "partial_rotary_factor": 0.75,
                                            "short_factor": factors(g, 6, 1.0, 1.4),
                                            "long_factor": factors(g, 6, 1.0, 20.0)},
        sliding_window=None, tie_word_embeddings=True, bos_token_id=1, eos_token_id=2, pad_token_id=0),
        torch.bfloat16, 212, LONGROPE_CASES)


def ministral3():
    make("ministral3_temp_f32", Ministral3Config, Ministral3ForCausalLM, dict(
        vocab_size=211, hidden_size=64, intermediate_size=100, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, max_position_embeddings=1024, rms_norm_eps=1e-5,
        rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                         "original_max_position_embeddings": 16, "max_position_embeddings": 1024,
                         "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0,
                         "llama_4_scaling_beta": 0.3},
        sliding_window=None, tie_word_embeddings=False, bos_token_id=1, eos_token_id=2, pad_token_id=0),
        torch.float32, 221,
        [(1, 512, N_GREEDY), (7, 512, N_GREEDY), (33, 512, N_GREEDY), (200, 512, N_GREEDY), (7, 16, 0)])


MODELS = {"phi35_longrope_f32": phi35, "phi4mini_longrope_bf16": phi4mini, "ministral3_temp_f32": ministral3}

if __name__ == "__main__":
    for name in sys.argv[1:] or MODELS:
        MODELS[name]()
