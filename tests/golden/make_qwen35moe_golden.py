#!/usr/bin/env python3
"""make_qwen35moe_golden.py — a tiny random Qwen3.5-MoE (transformers' qwen3_5_moe) model as a GGUF file, and
its reference outputs from transformers.

Writes tests/golden/models/qwen35moe_shexp_f16.gguf, its checkpoint as a Hugging Face directory
tests/golden/models/qwen35moe_shexp_f16/ (the experts fused per layer, mlp.experts.gate_up_proj and down_proj,
as the released Qwen3.5-MoE checkpoints store them) and tests/golden/qwen35moe_shexp_f16.json: for prompts of
1, 7, 45 and 150 tokens the last-position logits (f32) and 24 greedy tokens computed by transformers in
float32, as make_qwen35_golden.py does for the dense family (its layers, weights, rounding and file writer
are reused here).

Model: the dense golden's mixers (4 layers: 3 gated DeltaNet, 1 gated full attention; hidden 64, vocab 263)
with every FFN a Qwen3_5MoeSparseMoeBlock: 6 experts of moe_intermediate_size 24, top-2 with the top-k
probabilities normalised (transformers always does), and a shared expert of 40 gated by
sigmoid(shared_expert_gate(x)).

The GGUF is written as llama.cpp's convert_hf_to_gguf.py (Qwen3_5MoeTextModel, through Qwen2MoeModel) writes
the "qwen35moe" architecture: the qwen35 keys and mixer tensors, no feed_forward_length (the config has no
intermediate_size), qwen35moe.expert_count / expert_used_count / expert_feed_forward_length /
expert_shared_feed_forward_length; per layer ffn_gate_inp (the router, f32), ffn_gate_exps / ffn_up_exps (the
fused gate_up_proj split on its rows: ne {dim, ffn, n_expert}), ffn_down_exps (ne {ffn, dim, n_expert}),
ffn_gate_shexp / ffn_up_shexp / ffn_down_shexp, and ffn_gate_inp_shexp (shape (1, dim) as the checkpoint has
it, f32). Like the converter's default export, the file ends with one multi-token-prediction block (blk.4,
qwen35moe.nextn_predict_layers 1; see make_qwen35_golden.write_gguf), which the trunk's outputs do not use.

Run: python3 tests/golden/make_qwen35moe_golden.py  (needs torch, transformers >= 5.23, gguf, numpy; CI uses
the committed output)
"""
import numpy as np
import torch
from transformers import Qwen3_5MoeForCausalLM, Qwen3_5MoeTextConfig

import make_qwen35_golden as q35

NAME = "qwen35moe_shexp_f16"
SEED = 137

CFG = {k: v for k, v in q35.CFG.items() if k != "intermediate_size"}
CFG.update(num_experts=6, num_experts_per_tok=2, moe_intermediate_size=24, shared_expert_intermediate_size=40)


def moe_ffn(put, sd, p, b):
    """The experts and the shared expert of layer prefix p as the converter names them."""
    m = p + "mlp."
    put(b + "ffn_gate_inp.weight", sd[m + "gate.weight"], True)
    gate_up = sd[m + "experts.gate_up_proj"]  # (n_expert, 2 ffn, dim): gate rows, then up rows
    ffn = gate_up.shape[1] // 2
    put(b + "ffn_gate_exps.weight", gate_up[:, :ffn])
    put(b + "ffn_up_exps.weight", gate_up[:, ffn:])
    put(b + "ffn_down_exps.weight", sd[m + "experts.down_proj"])
    put(b + "ffn_gate_shexp.weight", sd[m + "shared_expert.gate_proj.weight"])
    put(b + "ffn_up_shexp.weight", sd[m + "shared_expert.up_proj.weight"])
    put(b + "ffn_down_shexp.weight", sd[m + "shared_expert.down_proj.weight"])
    put(b + "ffn_gate_inp_shexp.weight", sd[m + "shared_expert_gate.weight"], True)


def moe_keys(c):
    def add(w):
        w.add_expert_count(c.num_experts)
        w.add_expert_used_count(c.num_experts_per_tok)
        w.add_expert_feed_forward_length(c.moe_intermediate_size)
        w.add_expert_shared_feed_forward_length(c.shared_expert_intermediate_size)
    return add


def write(model, cfg, path):
    q35.write_gguf(model, cfg, path, arch="qwen35moe", ffn=moe_ffn, extra_keys=moe_keys(cfg), mtp=True)


def main():
    torch.manual_seed(SEED)
    cfg = Qwen3_5MoeTextConfig(**CFG)
    model = Qwen3_5MoeForCausalLM(cfg).eval()
    q35.make(NAME, model, cfg, SEED, write, hf_fused=True)


if __name__ == "__main__":
    main()
