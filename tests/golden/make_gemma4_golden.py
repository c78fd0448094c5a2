#!/usr/bin/env python3
"""make_gemma4_golden.py — tiny random Gemma 4 text models as GGUF files named as llama.cpp's converter names
them, and their reference outputs from transformers.

Writes tests/golden/models/NAME.gguf and tests/golden/NAME.json (the format of make_golden.py: for prompts of
1, 7, 33 and 200 tokens the last-position logits and 24 greedy tokens computed by transformers'
Gemma4ForCausalLM in float32, and the smallest top-2 logit margin along each greedy path).

gemma4_kv_f32 has what the dense 31B model has, at odd small sizes: 6 layers, local (sliding window of 16, so the
33- and 200-token prompts exceed it) except layers 2 and 5 (global); local layers with head size 16, 2 KV
heads, full rotary at base 1e4; global layers with their own head size 32, one KV head, no v_proj (values are
the keys, before the norms), proportional rotary at base 1e6 over a quarter of the head; q/k norms and the
weightless value norm; sandwich norms; GeGLU; embeddings x sqrt(dim); attention scale 1; a per-layer output
scalar; final logit soft-capping at 30; tied embeddings; f32.
gemma4_ple_f32 has what E2B/E4B add (see SMALL below): per-layer input embeddings, KV shared by the last
three layers (which then have no k_proj/v_proj/k_norm), their FFN double-wide; window 12.

The GGUF is written the way llama.cpp's convert_hf_to_gguf.py (Gemma4Model) writes one: general.architecture
"gemma4"; attention.key_length/value_length the global head size and *_swa the local one; head_count_kv one
value per layer; rope.dimension_count the global head size and rope.dimension_count_swa the local rotary dims;
rope.freq_base / rope.freq_base_swa; sliding_window and sliding_window_pattern (one bool per layer, true =
local); final_logit_softcapping; attention.shared_kv_layers 0; embedding_length_per_layer_input 0; norms as
stored (Gemma 4's RMSNorm multiplies by w, not 1 + w: no shift); rope_freqs.weight with 1 for the rotated
frequency pairs of a global head and 1e30 for the others (the proportional rotary as frequency divisors);
blk.N.layer_output_scale.weight for layer_scalar; feed_forward_length per layer when the KV-sharing layers'
FFN is double-wide; per_layer_token_embd / per_layer_model_proj / per_layer_proj_norm and blk.N.inp_gate /
proj / post_norm for the per-layer inputs. No tokenizer (the test feeds token ids).
Run: python3 tests/golden/make_gemma4_golden.py [NAME...]  (needs torch, transformers >= 5.5, gguf; CI uses
the committed output)
"""
import json
import os
import sys

import numpy as np
import torch
import gguf
from transformers import Gemma4ForCausalLM, Gemma4TextConfig

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from make_golden import N_GREEDY, PROMPT_LENGTHS, greedy  # noqa: E402  (the same prompts and greedy path)

DENSE = dict(
    vocab_size=293, hidden_size=48, intermediate_size=76, num_hidden_layers=6, num_attention_heads=4,
    num_key_value_heads=2, head_dim=16, global_head_dim=32, num_global_key_value_heads=1, attention_k_eq_v=True,
    max_position_embeddings=1024, rms_norm_eps=1e-6, sliding_window=16,
    layer_types=["sliding_attention", "sliding_attention", "full_attention"] * 2,
    rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                     "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25,
                                        "rope_theta": 1000000.0}},
    final_logit_softcapping=30.0, hidden_size_per_layer_input=0, num_kv_shared_layers=0, enable_moe_block=False,
    use_double_wide_mlp=False, tie_word_embeddings=True, bos_token_id=2, eos_token_id=1, pad_token_id=0)

# What E2B/E4B add: per-layer input embeddings (8 per layer), the last 3 layers reading the KV of layers 1
# (local) and 2 (global), their FFN double-wide; global layers of their own head size (24) with the local
# layers' KV-head count and their own v_proj.
SMALL = dict(
    vocab_size=263, hidden_size=40, intermediate_size=56, num_hidden_layers=6, num_attention_heads=4,
    num_key_value_heads=1, head_dim=16, global_head_dim=24, attention_k_eq_v=False, max_position_embeddings=1024,
    rms_norm_eps=1e-6, sliding_window=12, layer_types=["sliding_attention", "sliding_attention", "full_attention"] * 2,
    rope_parameters=DENSE["rope_parameters"], final_logit_softcapping=30.0, hidden_size_per_layer_input=8,
    vocab_size_per_layer_input=263, num_kv_shared_layers=3, enable_moe_block=False, use_double_wide_mlp=True,
    tie_word_embeddings=True, bos_token_id=2, eos_token_id=1, pad_token_id=0)

MODELS = {"gemma4_kv_f32": (DENSE, 131), "gemma4_ple_f32": (SMALL, 149)}


def init_weights(model, seed):
    """Weights large enough that logits spread out; norms near 1, output scalars in [0.6, 1.4]."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1:
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=g))
            else:
                scale = 1.0 if "embed" in name else 1.5 / p.shape[-1] ** 0.5
                p.copy_(scale * torch.randn(p.shape, generator=g))
        for layer in model.model.layers:
            layer.layer_scalar.copy_(0.6 + 0.8 * torch.rand(1, generator=g))


def write_gguf(model, cfg, c, path):
    sd = {k: v.detach().float().numpy() for k, v in model.state_dict().items()}
    # c: the per-layer attributes as given (the config object resolves them per layer)
    hd_g, hd, kv = c["global_head_dim"], c["head_dim"], c["num_key_value_heads"]
    kv_g = c.get("num_global_key_value_heads")
    n_l, n_shared, ple = c["num_hidden_layers"], c["num_kv_shared_layers"], c["hidden_size_per_layer_input"]
    swa = [t == "sliding_attention" for t in cfg.layer_types]
    rp_full = cfg.rope_parameters["full_attention"]
    w = gguf.GGUFWriter(path, "gemma4")
    w.add_name("gemma4 tiny random")
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_block_count(cfg.num_hidden_layers)
    if c["use_double_wide_mlp"]:
        ffn = c["intermediate_size"]
        w.add_feed_forward_length([ffn if l < n_l - n_shared else 2 * ffn for l in range(n_l)])
    else:
        w.add_feed_forward_length(c["intermediate_size"])
    w.add_head_count(cfg.num_attention_heads)
    if kv_g is not None:
        w.add_head_count_kv([kv if s else kv_g for s in swa])
    else:
        w.add_head_count_kv(kv)
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_key_length(hd_g)
    w.add_value_length(hd_g)
    w.add_key_length_swa(hd)
    w.add_value_length_swa(hd)
    w.add_rope_freq_base(rp_full["rope_theta"])
    w.add_rope_freq_base_swa(cfg.rope_parameters["sliding_attention"]["rope_theta"])
    w.add_rope_dimension_count(hd_g)
    w.add_rope_dimension_count_swa(hd)
    w.add_sliding_window(cfg.sliding_window)
    w.add_sliding_window_pattern(swa)
    w.add_final_logit_softcapping(cfg.final_logit_softcapping)
    w.add_shared_kv_layers(n_shared)
    w.add_embedding_length_per_layer_input(ple)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)

    n_rot = int(hd_g * rp_full["partial_rotary_factor"] / 2)
    freqs = np.array([1.0] * n_rot + [1e30] * (hd_g // 2 - n_rot), dtype=np.float32)
    w.add_tensor("rope_freqs.weight", freqs)
    w.add_tensor("token_embd.weight", sd["model.embed_tokens.weight"])
    w.add_tensor("output_norm.weight", sd["model.norm.weight"])
    globals_ = {"model.embed_tokens_per_layer.weight": "per_layer_token_embd.weight",
                "model.per_layer_model_projection.weight": "per_layer_model_proj.weight",
                "model.per_layer_projection_norm.weight": "per_layer_proj_norm.weight"}
    for hf, gg in globals_.items():
        if hf in sd:
            w.add_tensor(gg, sd[hf])
    names = {"input_layernorm.weight": "attn_norm.weight", "self_attn.q_proj.weight": "attn_q.weight",
             "self_attn.k_proj.weight": "attn_k.weight", "self_attn.v_proj.weight": "attn_v.weight",
             "self_attn.o_proj.weight": "attn_output.weight", "self_attn.q_norm.weight": "attn_q_norm.weight",
             "self_attn.k_norm.weight": "attn_k_norm.weight",
             "post_attention_layernorm.weight": "post_attention_norm.weight",
             "pre_feedforward_layernorm.weight": "ffn_norm.weight", "mlp.gate_proj.weight": "ffn_gate.weight",
             "mlp.up_proj.weight": "ffn_up.weight", "mlp.down_proj.weight": "ffn_down.weight",
             "post_feedforward_layernorm.weight": "post_ffw_norm.weight",
             "layer_scalar": "layer_output_scale.weight", "per_layer_input_gate.weight": "inp_gate.weight",
             "per_layer_projection.weight": "proj.weight", "post_per_layer_input_norm.weight": "post_norm.weight"}
    for l in range(cfg.num_hidden_layers):
        for hf, gg in names.items():
            key = f"model.layers.{l}.{hf}"
            if key in sd:
                w.add_tensor(f"blk.{l}.{gg}", np.ascontiguousarray(sd[key]))
    used = {"model.embed_tokens.weight", "model.norm.weight", "lm_head.weight", *globals_}
    used |= {f"model.layers.{l}.{hf}" for l in range(cfg.num_hidden_layers) for hf in names}
    left = [k for k in sd if k not in used]
    assert not left, f"tensors not written: {left}"
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def make(name, c, seed):
    torch.manual_seed(seed)
    cfg = Gemma4TextConfig(**c)
    model = Gemma4ForCausalLM(cfg).eval()
    init_weights(model, seed)
    assert model.model.layers[2].self_attn.head_dim == c["global_head_dim"]
    os.makedirs(os.path.join(HERE, "models"), exist_ok=True)
    gpath = os.path.join(HERE, "models", name + ".gguf")
    write_gguf(model, cfg, c, gpath)
    g = torch.Generator().manual_seed(seed + 1)
    cases = []
    for n in PROMPT_LENGTHS:
        ids = torch.randint(0, cfg.vocab_size, (n,), generator=g).tolist()
        with torch.no_grad():
            logits = model(torch.tensor([ids])).logits[0, -1]
        toks, margin = greedy(model, ids, N_GREEDY)
        cases.append({"prompt_tokens": ids, "logits": [float(x) for x in logits], "greedy_tokens": toks,
                      "min_top2_margin": margin})
        print(f"{name}: prompt {n:3d} min top-2 margin {margin:.4f} logit absmax {float(logits.abs().max()):.2f}")
    with open(os.path.join(HERE, name + ".json"), "w") as f:
        json.dump({"model": f"models/{name}.gguf", "dtype": "float32", "cases": cases}, f)
    print(f"{gpath}: {os.path.getsize(gpath)} bytes")


def main():
    for name in sys.argv[1:] or MODELS:
        make(name, *MODELS[name])


if __name__ == "__main__":
    main()
