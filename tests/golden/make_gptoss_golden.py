#!/usr/bin/env python3
"""make_gptoss_golden.py — a tiny random gpt-oss model, its GGUF files, and transformers' reference outputs.

ferry reads gpt-oss from GGUF only (transformers stores its experts transposed with gate and up columns
interleaved), so this script converts the checkpoint itself, the way llama.cpp's convert_hf_to_gguf.py
(conversion/gpt_oss.py) does: the same keys and tensor names (gguf-py's tensor map), sinks as
attn_sinks.weight, gate_up_proj split into ffn_gate_exps / ffn_up_exps (even / odd columns) and transposed,
down_proj transposed, the experts' biases as (n_expert, rows) tables, 1-D tensors in F32.

Writes under tests/golden/models/: gptoss_yarn_f16/ (config.json and model.safetensors in F16, as
transformers writes them), gptoss_yarn_f16.gguf (matrices F16) and gptoss_yarn_mxfp4.gguf (experts in MXFP4,
the rest as in the F16 file); and tests/golden/gptoss_yarn.json: for prompts of 1, 7, 33 and 200 tokens the
last-position logits and 24 greedy tokens of transformers in float32. The random weights are rounded first
to what the files hold (every tensor to F16 values, the experts to MXFP4 values, which F16 holds exactly), so
the three are the same function as the reference.

The model: 2 layers (sliding window of 16, then full attention: the 33- and 200-token prompts run past the
window), hidden 64, 4 heads of 16 with 2 KV heads, q/k/v/o biases, sinks, YaRN (factor 4, original context
256, beta 32/1, truncate false, as the released config), 5 experts of FFN 32 with biases, top-2, the clamped
SwiGLU (alpha 1.702, limit 7), vocab 211, untied. The smallest top-2 logit margin of each greedy path and the
smallest gap between the 2nd and 3rd router logit of any token are recorded: far above fp32 noise.
Run: python3 tests/golden/make_gptoss_golden.py  (needs torch, transformers, gguf; CI uses the committed output)
"""
import json
import os

import numpy as np
import torch
import gguf
from gguf.quants import quantize, dequantize
from transformers import GptOssConfig, GptOssForCausalLM

from make_golden import N_GREEDY, PROMPT_LENGTHS, greedy  # the other families' prompts and greedy walk

HERE = os.path.dirname(os.path.abspath(__file__))
NAME = "gptoss_yarn"
SEED = 133
ARCH = "gpt-oss"

CFG = dict(vocab_size=211, hidden_size=64, intermediate_size=32, num_hidden_layers=2, num_attention_heads=4,
           num_key_value_heads=2, head_dim=16, num_local_experts=5, num_experts_per_tok=2, sliding_window=16,
           max_position_embeddings=1024, rms_norm_eps=1e-5, attention_bias=True, tie_word_embeddings=False,
           swiglu_alpha=1.702, swiglu_limit=7.0,
           rope_parameters={"rope_type": "yarn", "rope_theta": 150000.0, "factor": 4.0, "beta_fast": 32.0,
                            "beta_slow": 1.0, "truncate": False, "original_max_position_embeddings": 256},
           bos_token_id=1, eos_token_id=2, pad_token_id=0)


def init_weights(model, seed):
    """Weights large enough that logits spread out; sinks around the scores' scale."""
    g = torch.Generator().manual_seed(seed)
    for name, p in model.named_parameters():
        with torch.no_grad():
            if "norm" in name:
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=g))
            elif "sinks" in name:
                p.copy_(1.0 * torch.randn(p.shape, generator=g))
            elif p.dim() == 1 or name.endswith("_bias"):
                p.copy_(0.3 * torch.randn(p.shape, generator=g))
            elif "experts" in name:  # (experts, in, out): transformers' experts are stored transposed
                p.copy_(1.5 / p.shape[-2] ** 0.5 * torch.randn(p.shape, generator=g))
            else:
                scale = 1.0 if "embed" in name else 1.5 / p.shape[-1] ** 0.5
                p.copy_(scale * torch.randn(p.shape, generator=g))


def mxfp4_round(a):
    """a (..., n) with n a multiple of 32 rounded to MXFP4 values (blocks along the last axis)."""
    q = quantize(np.ascontiguousarray(a, dtype=np.float32), gguf.GGMLQuantizationType.MXFP4)
    d = dequantize(q, gguf.GGMLQuantizationType.MXFP4).reshape(a.shape)
    q2 = quantize(d.astype(np.float32), gguf.GGMLQuantizationType.MXFP4)
    assert np.array_equal(q, q2), "MXFP4 rounding is not idempotent"
    return d


def round_to_files(model):
    """Rounds the matrices to F16 values and the experts to MXFP4 values (in the GGUF layout's blocks)."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "gate_up_proj" in name and not name.endswith("_bias"):
                w = p.detach().numpy().transpose(0, 2, 1)  # (E, 2 ffn, dim): rows as GGUF stores them
                p.copy_(torch.from_numpy(mxfp4_round(w).transpose(0, 2, 1).copy()))
            elif "down_proj" in name and not name.endswith("_bias"):
                w = p.detach().numpy().transpose(0, 2, 1)  # (E, dim, ffn)
                p.copy_(torch.from_numpy(mxfp4_round(w).transpose(0, 2, 1).copy()))
            else:  # F16 in the checkpoint and the F16 file (the GGUF files keep 1-D tensors in F32)
                p.copy_(p.half().float())
        for name, p in model.named_parameters():
            assert torch.equal(p, p.half().float()), f"{name}: the checkpoint's F16 must hold it exactly"


def gguf_tensors(model, cfg):
    """(name, f32 array in GGUF's numpy order) as llama.cpp's converter names and lays them out."""
    tmap = gguf.get_tensor_name_map(gguf.MODEL_ARCH.GPT_OSS, cfg.num_hidden_layers)
    out = []
    for hf, p in model.state_dict().items():
        a = p.detach().float().numpy()
        if "sinks" in hf:
            hf += ".weight"
        if "gate_up_proj" in hf:
            if hf.endswith("_bias"):  # (E, 2 ffn) -> gate (even columns), up (odd)
                parts = [(hf.replace("gate_up_proj_bias", "gate_proj.bias"), a[..., ::2]),
                         (hf.replace("gate_up_proj_bias", "up_proj.bias"), a[..., 1::2])]
            else:  # (E, dim, 2 ffn) -> (E, ffn, dim) each
                t = a.transpose(0, 2, 1)
                parts = [(hf.replace("gate_up_proj", "gate_proj.weight"), t[:, ::2, :]),
                         (hf.replace("gate_up_proj", "up_proj.weight"), t[:, 1::2, :])]
        elif "down_proj" in hf:
            if hf.endswith("_bias"):
                parts = [(hf.replace("down_proj_bias", "down_proj.bias"), a)]
            else:  # (E, ffn, dim) -> (E, dim, ffn)
                parts = [(hf.replace("down_proj", "down_proj.weight"), a.transpose(0, 2, 1))]
        else:
            parts = [(hf, a)]
        for n, arr in parts:
            name = tmap.get_name(n, try_suffixes=(".weight", ".bias"))
            assert name is not None, f"no GGUF name for {n}"
            out.append((name, np.ascontiguousarray(arr, dtype=np.float32)))
    return out


def write_gguf(path, model, cfg, mxfp4):
    w = gguf.GGUFWriter(path, ARCH)
    rp = cfg.rope_parameters
    w.add_name("gptoss-tiny")
    w.add_block_count(cfg.num_hidden_layers)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
    w.add_rope_scaling_factor(rp["factor"])
    w.add_rope_scaling_orig_ctx_len(rp["original_max_position_embeddings"])
    w.add_rope_scaling_yarn_beta_fast(rp["beta_fast"])
    w.add_rope_scaling_yarn_beta_slow(rp["beta_slow"])
    w.add_rope_freq_base(rp["rope_theta"])
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_expert_count(cfg.num_local_experts)
    w.add_expert_used_count(cfg.num_experts_per_tok)
    w.add_key_length(cfg.head_dim)
    w.add_value_length(cfg.head_dim)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    w.add_sliding_window(cfg.sliding_window)
    w.add_expert_feed_forward_length(cfg.intermediate_size)
    for name, a in gguf_tensors(model, cfg):
        is_expert = "_exps.weight" in name
        if a.ndim == 1 or name.endswith(".bias") or "ffn_gate_inp" in name:
            w.add_tensor(name, a)  # F32 as the converter keeps 1-D tensors and the router
        elif mxfp4 and is_expert:
            q = quantize(a, gguf.GGMLQuantizationType.MXFP4)
            w.add_tensor(name, q, raw_shape=q.shape, raw_dtype=gguf.GGMLQuantizationType.MXFP4)
        else:
            w.add_tensor(name, a.astype(np.float16))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def main():
    torch.manual_seed(SEED)
    cfg = GptOssConfig(**CFG)
    model = GptOssForCausalLM(cfg).eval()
    init_weights(model, SEED)
    round_to_files(model)
    model_dir = os.path.join(HERE, "models")
    for mx in (False, True):
        write_gguf(os.path.join(model_dir, f"{NAME}_{'mxfp4' if mx else 'f16'}.gguf"), model, cfg, mx)
    # The checkpoint itself, F16 safetensors as transformers writes them (experts stacked and transposed).
    hf_dir = os.path.join(model_dir, f"{NAME}_f16")
    model.half().save_pretrained(hf_dir, safe_serialization=True)
    for extra in ("generation_config.json",):
        if os.path.exists(os.path.join(hf_dir, extra)):
            os.remove(os.path.join(hf_dir, extra))
    # The reference: transformers reading the checkpoint back in fp32, with its eager attention (the one with
    # sinks) and its eager per-expert loop.
    model = GptOssForCausalLM.from_pretrained(hf_dir, dtype=torch.float32, attn_implementation="eager",
                                              experts_implementation="eager").eval()
    k = cfg.num_experts_per_tok
    gaps = []
    for name, mod in model.named_modules():
        if name.endswith("mlp.router"):
            def hook(_m, _inp, out):
                top = torch.topk(out[0].double(), k + 1, dim=-1).values
                gaps.append(float((top[:, k - 1] - top[:, k]).min()))
            mod.register_forward_hook(hook)
    g = torch.Generator().manual_seed(SEED + 1)
    cases = []
    for n in PROMPT_LENGTHS:
        ids = torch.randint(0, cfg.vocab_size, (n,), generator=g).tolist()
        with torch.no_grad():
            logits = model(torch.tensor([ids])).logits[0, -1]
        toks, margin = greedy(model, ids, N_GREEDY)
        cases.append({"prompt_tokens": ids, "logits": [float(x) for x in logits], "greedy_tokens": toks,
                      "min_top2_margin": margin})
        print(f"{NAME}: prompt {n:3d} min top-2 margin {margin:.4f} logit absmax {float(logits.abs().max()):.2f}")
    print(f"{NAME}: min router gap {min(gaps):.2e}")
    out = {"models": [f"models/{NAME}_f16.gguf", f"models/{NAME}_mxfp4.gguf"], "cases": cases,
           "min_router_gap": min(gaps)}
    with open(os.path.join(HERE, NAME + ".json"), "w") as f:
        json.dump(out, f)


if __name__ == "__main__":
    main()
