#!/usr/bin/env python3
"""make_golden.py — tiny random Hugging Face models and their reference outputs from transformers.

Writes, under tests/golden/models/NAME/: config.json + model.safetensors (the model), and
tests/golden/NAME.json: for several prompts (token ids, lengths 1..200) the last-position logits and 24 greedy
tokens computed by transformers in float32 (weights stored in f32/f16/bf16 are upcast exactly, so ferry's fp32
CPU path computes the same function). The smallest top-2 logit margin along each greedy path is recorded;
the seeds below were picked so that every margin is far above fp32 rounding noise.

Models (odd sizes on purpose):
  llama_mha_f32     Llama, multi-head attention, f32, untied, 3 layers
  llama3_gqa_f16    Llama-3 style: GQA 8/2, rope_scaling llama3, tied embeddings, theta 5e5, f16
  qwen2_bias_bf16   Qwen2: q/k/v biases, GQA 7/1, theta 1e6, bf16 (config in transformers 5's rope_parameters form)
  qwen3_qknorm_f32  Qwen3: QK-norm, GQA 6/2, head_dim 24 != hidden/heads, tied embeddings, theta 1e6, f32
  gemma3_swa_f32    Gemma 3 text: 5 layers local/global with period 3 and a 16-position window (the 33- and
                    200-token prompts exceed it), local base 1e4 / global 1e6 with linear scaling 2, QK-norm,
                    sandwich norms, GeGLU, embeddings x sqrt(dim), query_pre_attn_scalar 40 != head_dim 32,
                    GQA 4/2, untied, f32
  phi3_fused_bf16   Phi-3/Phi-4: fused q|k|v and gate|up, partial rotary 0.75 (12 of 16 dims), a 24-position
                    window on every layer (the 33- and 200-token prompts exceed it), GQA 4/2, bf16
  qwen3moe_top2_f32 Qwen3-MoE: 8 experts of FFN 30, top-2 with norm_topk_prob, QK-norm, GQA 4/2, head_dim 16,
                    3 layers, untied, f32
  qwen3moe_top3_bf16 Qwen3-MoE: 7 experts of FFN 26, top-3 without norm_topk_prob, 2 layers, tied, bf16
  mixtral_top2_f16  Mixtral: 5 experts of FFN 34, top-2 normalised, GQA 6/2, 2 layers, untied, f16 (its GGUF is
                    "llama" with experts and permuted q/k rows)
For the MoE models the smallest gap between the k-th and (k+1)-th router probability over every token of
every reference pass is recorded too (min_router_gap): far above fp32 noise, so both sides pick the same
experts.
Run: python3 tests/golden/make_golden.py [NAME...]  (needs torch, transformers, safetensors; CI uses the
committed output; with names, only those models are written)
"""
import json
import os
import sys

import torch
from transformers import (Gemma3ForCausalLM, Gemma3TextConfig, LlamaConfig, LlamaForCausalLM, Phi3Config,
                          Phi3ForCausalLM, Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM,
                          Qwen3MoeConfig, Qwen3MoeForCausalLM, MixtralConfig, MixtralForCausalLM)

HERE = os.path.dirname(os.path.abspath(__file__))
N_GREEDY = 24
PROMPT_LENGTHS = [1, 7, 33, 200]


def init_weights(model, seed):
    """Weights large enough that logits spread out (random tiny models are otherwise near-ties everywhere)."""
    g = torch.Generator().manual_seed(seed)
    for name, p in model.named_parameters():
        with torch.no_grad():
            if p.dim() == 1:
                if "norm" in name:
                    p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=g))
                else:  # biases
                    p.copy_(0.3 * torch.randn(p.shape, generator=g))
            else:
                fan_in = p.shape[-1]  # (out, in), or (experts, out, in) for stacked experts
                scale = 1.0 if "embed" in name else 1.5 / fan_in**0.5
                p.copy_(scale * torch.randn(p.shape, generator=g))


def greedy(model, ids, n):
    out, margins = [], []
    ids = list(ids)
    with torch.no_grad():
        for _ in range(n):
            logits = model(torch.tensor([ids])).logits[0, -1].double()
            top2 = torch.topk(logits, 2).values
            margins.append(float(top2[0] - top2[1]))
            t = int(torch.argmax(logits))
            out.append(t)
            ids.append(t)
    return out, min(margins)


def make(name, cfg_cls, model_cls, cfg_kwargs, dtype, seed, classic_config=False):
    torch.manual_seed(seed)
    cfg = cfg_cls(**cfg_kwargs)
    model = model_cls(cfg).eval()
    init_weights(model, seed)
    model = model.to(dtype)  # round the weights to the storage type ...
    out_dir = os.path.join(HERE, "models", name)
    os.makedirs(out_dir, exist_ok=True)
    model.save_pretrained(out_dir, safe_serialization=True)
    for extra in ("generation_config.json",):
        p = os.path.join(out_dir, extra)
        if os.path.exists(p):
            os.remove(p)
    if classic_config:
        # Checkpoints in the wild (Llama 3.1, Qwen2...) carry rope_theta/rope_scaling at the top level;
        # transformers 5 writes rope_parameters. Keep one model in each form so both are read.
        cfg_path = os.path.join(out_dir, "config.json")
        with open(cfg_path) as f:
            c = json.load(f)
        rp = c.pop("rope_parameters")
        c["rope_theta"] = rp.pop("rope_theta")
        if rp.get("rope_type", "default") != "default":
            c["rope_scaling"] = rp
        with open(cfg_path, "w") as f:
            json.dump(c, f, indent=2)
        assert model_cls.from_pretrained(out_dir).config.rope_parameters["rope_type"] == rp.get("rope_type", "default")
    # The reference is transformers reading back exactly the files ferry reads, computing in fp32.
    # MoE: the reference is the eager per-expert loop (the grouped kernel needs 16-byte strides).
    k = getattr(cfg, "num_experts_per_tok", 0)
    extra = {"experts_implementation": "eager"} if k else {}
    ref = model_cls.from_pretrained(out_dir, dtype=torch.float32, **extra).eval()
    # MoE: the smallest gap between the k-th and (k+1)-th router probability of any token of any pass.
    gaps = []
    for name_, mod in ref.named_modules():
        if name_.endswith((".mlp.gate", "block_sparse_moe.gate")) and k:
            def hook(_m, _inp, out):
                probs = torch.softmax(out[0].double(), dim=-1)
                top = torch.topk(probs, k + 1, dim=-1).values
                gaps.append(float((top[:, k - 1] - top[:, k]).min()))
            mod.register_forward_hook(hook)
    g = torch.Generator().manual_seed(seed + 1)
    cases = []
    for n in PROMPT_LENGTHS:
        ids = torch.randint(0, cfg.vocab_size, (n,), generator=g).tolist()
        with torch.no_grad():
            logits = ref(torch.tensor([ids])).logits[0, -1]
        toks, margin = greedy(ref, ids, N_GREEDY)
        cases.append({"prompt_tokens": ids, "logits": [float(x) for x in logits], "greedy_tokens": toks,
                      "min_top2_margin": margin})
        print(f"{name}: prompt {n:3d} min top-2 margin {margin:.4f} logit absmax {float(logits.abs().max()):.2f}")
    out = {"model": f"models/{name}", "dtype": str(dtype).replace("torch.", ""), "cases": cases}
    if gaps:
        out["min_router_gap"] = min(gaps)
        print(f"{name}: min router gap {min(gaps):.2e}")
    with open(os.path.join(HERE, name + ".json"), "w") as f:
        json.dump(out, f)


MODELS = {
    "llama_mha_f32": lambda: make("llama_mha_f32", LlamaConfig, LlamaForCausalLM, dict(
        vocab_size=257, hidden_size=48, intermediate_size=100, num_hidden_layers=3, num_attention_heads=6,
        num_key_value_heads=6, max_position_embeddings=512, rms_norm_eps=1e-5, rope_theta=10000.0,
        tie_word_embeddings=False, bos_token_id=1, eos_token_id=2), torch.float32, seed=11, classic_config=True),
    "llama3_gqa_f16": lambda: make("llama3_gqa_f16", LlamaConfig, LlamaForCausalLM, dict(
        vocab_size=311, hidden_size=64, intermediate_size=136, num_hidden_layers=2, num_attention_heads=8,
        num_key_value_heads=2, max_position_embeddings=1024, rms_norm_eps=1e-5, rope_theta=500000.0,
        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                      "original_max_position_embeddings": 64},
        tie_word_embeddings=True, bos_token_id=1, eos_token_id=2), torch.float16, seed=23, classic_config=True),
    "qwen2_bias_bf16": lambda: make("qwen2_bias_bf16", Qwen2Config, Qwen2ForCausalLM, dict(
        vocab_size=263, hidden_size=56, intermediate_size=90, num_hidden_layers=2, num_attention_heads=7,
        num_key_value_heads=1, max_position_embeddings=1024, rms_norm_eps=1e-6, rope_theta=1000000.0,
        tie_word_embeddings=False, use_sliding_window=False), torch.bfloat16, seed=37),
    "qwen3_qknorm_f32": lambda: make("qwen3_qknorm_f32", Qwen3Config, Qwen3ForCausalLM, dict(
        vocab_size=269, hidden_size=52, intermediate_size=94, num_hidden_layers=3, num_attention_heads=6,
        num_key_value_heads=2, head_dim=24, max_position_embeddings=1024, rms_norm_eps=1e-6,
        rope_theta=1000000.0, tie_word_embeddings=True, use_sliding_window=False, bos_token_id=1,
        eos_token_id=2), torch.float32, seed=41),
    "gemma3_swa_f32": lambda: make("gemma3_swa_f32", Gemma3TextConfig, Gemma3ForCausalLM, dict(
        vocab_size=283, hidden_size=72, intermediate_size=106, num_hidden_layers=5, num_attention_heads=4,
        num_key_value_heads=2, head_dim=32, max_position_embeddings=1024, rms_norm_eps=1e-6,
        query_pre_attn_scalar=40, sliding_window=16,
        layer_types=["sliding_attention", "sliding_attention", "full_attention", "sliding_attention",
                     "sliding_attention"],
        rope_parameters={"full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1000000.0},
                         "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}},
        tie_word_embeddings=False, bos_token_id=2, eos_token_id=1, pad_token_id=0), torch.float32, seed=53),
    "phi3_fused_bf16": lambda: make("phi3_fused_bf16", Phi3Config, Phi3ForCausalLM, dict(
        vocab_size=277, hidden_size=64, intermediate_size=88, num_hidden_layers=3, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=1024, original_max_position_embeddings=1024,
        rms_norm_eps=1e-5, rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                            "partial_rotary_factor": 0.75},
        sliding_window=24, tie_word_embeddings=False, bos_token_id=1, eos_token_id=2, pad_token_id=0),
        torch.bfloat16, seed=66),
    "qwen3moe_top2_f32": lambda: make("qwen3moe_top2_f32", Qwen3MoeConfig, Qwen3MoeForCausalLM, dict(
        vocab_size=251, hidden_size=44, intermediate_size=70, moe_intermediate_size=30, num_hidden_layers=3,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_experts=8, num_experts_per_tok=2,
        norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[], max_position_embeddings=1024,
        rms_norm_eps=1e-6, rope_theta=1000000.0, tie_word_embeddings=False, use_sliding_window=False,
        bos_token_id=1, eos_token_id=2), torch.float32, seed=71),
    "qwen3moe_top3_bf16": lambda: make("qwen3moe_top3_bf16", Qwen3MoeConfig, Qwen3MoeForCausalLM, dict(
        vocab_size=241, hidden_size=40, intermediate_size=50, moe_intermediate_size=26, num_hidden_layers=2,
        num_attention_heads=5, num_key_value_heads=1, head_dim=8, num_experts=7, num_experts_per_tok=3,
        norm_topk_prob=False, decoder_sparse_step=1, mlp_only_layers=[], max_position_embeddings=1024,
        rms_norm_eps=1e-6, rope_theta=10000.0, tie_word_embeddings=True, use_sliding_window=False,
        bos_token_id=1, eos_token_id=2), torch.bfloat16, seed=83),
    "mixtral_top2_f16": lambda: make("mixtral_top2_f16", MixtralConfig, MixtralForCausalLM, dict(
        vocab_size=233, hidden_size=48, intermediate_size=34, num_hidden_layers=2, num_attention_heads=6,
        num_key_value_heads=2, num_local_experts=5, num_experts_per_tok=2, max_position_embeddings=1024,
        rms_norm_eps=1e-5, rope_theta=1000000.0, sliding_window=None, tie_word_embeddings=False,
        bos_token_id=1, eos_token_id=2), torch.float16, seed=107),
}


def main():
    for name in sys.argv[1:] or MODELS:
        MODELS[name]()


if __name__ == "__main__":
    main()
