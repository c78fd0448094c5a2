#!/usr/bin/env python3
"""make_qwen35_golden.py — a tiny random Qwen3.5 (transformers' qwen3_5) model as a GGUF file, and its reference
outputs from transformers.

Writes tests/golden/models/qwen35_deltanet_f16.gguf, the checkpoint it comes from as a Hugging Face directory
tests/golden/models/qwen35_deltanet_f16/ (config.json, model.safetensors: matrices F16, vectors and the conv
weight F32), the same language model as a Qwen3_5ForConditionalGeneration with a one-block vision tower
(tests/golden/models/qwen35_deltanet_f16_vl/), and tests/golden/qwen35_deltanet_f16.json: for prompts of
1, 7, 45 and 150 tokens (shorter and longer than the 64-token chunks of the gated delta rule, and than a
16-token prefill step) the last-position logits and 24 greedy tokens computed by transformers in float32
with the model's own torch paths (torch_chunk_gated_delta_rule, causal_conv1d_fn: flash-linear-attention and
causal-conv1d are not used), from weights rounded to f16 first, so the file holds exactly the function the
reference computes. The smallest top-2 logit margin along each greedy path is recorded.

Model: 4 layers, full_attention_interval 4 (3 gated DeltaNet layers, then one full-attention layer), hidden
64, FFN 80, vocab 263, untied; linear attention with 2 key heads and 4 value heads of 16 (two value heads per
key head, so the GGUF's value-head order differs from the checkpoint's), conv width 4; full attention with 4
query heads (each with its output gate) over 2 KV heads of head_dim 24, QK-norm, partial rotary 0.25 (6 of
24 dims), theta 1e6.

The GGUF is written as llama.cpp's convert_hf_to_gguf.py (Qwen3_5TextModel) writes the "qwen35"
architecture: keys qwen35.ssm.{conv_kernel, state_size, group_count, time_step_rank, inner_size},
qwen35.full_attention_interval, qwen35.attention.recurrent_layers, qwen35.rope.dimension_sections,
rope.dimension_count = head_dim * partial_rotary_factor; tensors attn_qkv / attn_gate / ssm_beta / ssm_alpha /
ssm_conv1d / ssm_dt.bias / ssm_a / ssm_norm / ssm_out in the linear layers, attn_q (queries and gates
interleaved per head, as q_proj has them) / attn_k / attn_v / attn_output / attn_q_norm / attn_k_norm in
the full ones, post_attention_norm before the FFN. Its transforms: every Qwen3_5RMSNorm weight w is written
as 1 + w (the gated norm's weight is not), A_log as -exp(A_log), the conv weight squeezed to (channels,
width), and with fewer key than value heads the value heads reordered from grouped by key head to tiled
over the key heads (rows of in_proj_qkv's v part, in_proj_z, in_proj_b, in_proj_a, the conv's v channels,
A_log, dt_bias; columns of out_proj). Matrices are f16, vectors f32 (as llama.cpp keeps them). The file carries a byte-fallback SentencePiece
vocabulary of 263 tokens (no merges to speak of) so that `ferry serve` can load it.

With --mtp it writes only the multi-token-prediction golden (make_mtp): tests/golden/models/qwen35_mtp_f32.gguf
and tests/golden/qwen35_mtp_f32.json.

Run: python3 tests/golden/make_qwen35_golden.py [--mtp]  (needs torch, transformers >= 5.23, gguf, numpy; CI uses the
committed output)
"""
import json
import os

import gguf
import numpy as np
import torch
from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

from make_golden import greedy  # the same greedy loop and top-2 margins as the other goldens

HERE = os.path.dirname(os.path.abspath(__file__))
NAME = "qwen35_deltanet_f16"
N_GREEDY = 24
PROMPT_LENGTHS = [1, 7, 45, 150]
SEED = 131

CFG = dict(vocab_size=263, hidden_size=64, intermediate_size=80, num_hidden_layers=4, num_attention_heads=4,
           num_key_value_heads=2, head_dim=24, linear_conv_kernel_dim=4, linear_key_head_dim=16,
           linear_value_head_dim=16, linear_num_key_heads=2, linear_num_value_heads=4,
           layer_types=["linear_attention"] * 3 + ["full_attention"], max_position_embeddings=1024,
           rms_norm_eps=1e-6, tie_word_embeddings=False, attention_bias=False,
           rope_parameters={"rope_type": "default", "rope_theta": 1000000.0, "partial_rotary_factor": 0.25,
                            "mrope_section": [1, 1, 1], "mrope_interleaved": True},
           bos_token_id=1, eos_token_id=2, pad_token_id=0)


def init_weights(model, seed):
    """Weights large enough that logits spread out; Qwen3_5RMSNorm weights near 0 (it multiplies by 1 + w)."""
    g = torch.Generator().manual_seed(seed)
    for name, p in model.named_parameters():
        with torch.no_grad():
            if name.endswith("linear_attn.norm.weight"):
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=g))
            elif "norm" in name:
                p.copy_(0.2 * torch.randn(p.shape, generator=g))
            elif name.endswith("A_log"):
                p.copy_(torch.log(torch.empty(p.shape).uniform_(0.2, 4.0, generator=g)))
            elif name.endswith("dt_bias"):
                p.copy_(0.5 * torch.randn(p.shape, generator=g))
            else:
                fan_in = p.shape[-1]
                scale = 1.0 if "embed" in name else (5.0 if "lm_head" in name else 1.5) / fan_in**0.5
                p.copy_(scale * torch.randn(p.shape, generator=g))


def tiled(t, dim, nk, nv, head):
    """Value heads grouped by key head -> tiled over key heads (llama.cpp's _reorder_v_heads)."""
    if nk == nv:
        return t
    shape = list(t.shape)
    t = t.reshape(*shape[:dim], nk, nv // nk, head, *shape[dim + 1:])
    return t.transpose(dim, dim + 1).contiguous().reshape(shape)


def dense_ffn(put, sd, p, b):
    """The SwiGLU FFN of layer prefix p (checkpoint) as GGUF prefix b."""
    put(b + "ffn_gate.weight", sd[p + "mlp.gate_proj.weight"])
    put(b + "ffn_up.weight", sd[p + "mlp.up_proj.weight"])
    put(b + "ffn_down.weight", sd[p + "mlp.down_proj.weight"])


def tiled_linear(put, sd, a, b, c):
    """A gated DeltaNet layer (checkpoint prefix a, GGUF prefix b) as the converter writes qwen35: the value
    heads tiled over the key heads."""
    nk, nv, hk, hv = (c.linear_num_key_heads, c.linear_num_value_heads, c.linear_key_head_dim,
                      c.linear_value_head_dim)
    qkv = sd[a + "in_proj_qkv.weight"]
    kd = nk * hk
    qkv = torch.cat([qkv[:2 * kd], tiled(qkv[2 * kd:], 0, nk, nv, hv)], 0)
    put(b + "attn_qkv.weight", qkv)
    put(b + "attn_gate.weight", tiled(sd[a + "in_proj_z.weight"], 0, nk, nv, hv))
    put(b + "ssm_beta.weight", tiled(sd[a + "in_proj_b.weight"], 0, nk, nv, 1))
    put(b + "ssm_alpha.weight", tiled(sd[a + "in_proj_a.weight"], 0, nk, nv, 1))
    conv = sd[a + "conv1d.weight"].squeeze(1)  # (channels, width)
    conv = torch.cat([conv[:2 * kd], tiled(conv[2 * kd:], 0, nk, nv, hv)], 0)
    put(b + "ssm_conv1d.weight", conv, True)
    put(b + "ssm_dt.bias", tiled(sd[a + "dt_bias"].unsqueeze(-1), 0, nk, nv, 1).squeeze(-1), True)
    put(b + "ssm_a", tiled((-torch.exp(sd[a + "A_log"].float())).unsqueeze(-1), 0, nk, nv, 1).squeeze(-1),
        True)
    put(b + "ssm_norm.weight", sd[a + "norm.weight"], True)
    put(b + "ssm_out.weight", tiled(sd[a + "out_proj.weight"], 1, nk, nv, hv))


def write_gguf(model, cfg, path, arch="qwen35", ffn=dense_ffn, extra_keys=None, mtp=False, linear=tiled_linear,
               sections=True, mat_type=np.float16):
    """The file as the converter writes `arch`; ffn(put, sd, p, b) writes each layer's FFN tensors,
    linear(put, sd, a, b, cfg) each gated DeltaNet layer's, and extra_keys(w), when given, the FFN's keys;
    sections: rope.dimension_sections (the multimodal rotary of Qwen3.5) is written. mtp: one multi-token-prediction block after the layers, as the
    converter exports a checkpoint's mtp.* weights (block_count one more, nextn_predict_layers 1, the block
    not recurrent): a full-attention layer's tensors (here a copy of the last layer's, since transformers has
    no MTP weights) and its nextn.* tensors (random), which a reader of the trunk leaves alone; or, mtp a
    MtpBlock, that block's own tensors. mat_type: the matrices' type (f16, or f32 for the MTP golden)."""
    c = cfg
    has_mtp = mtp is not False and mtp is not None
    nk, nv, hk, hv = (c.linear_num_key_heads, c.linear_num_value_heads, c.linear_key_head_dim,
                      c.linear_value_head_dim)
    w = gguf.GGUFWriter(path, arch)
    w.add_name("ferry tiny qwen3.5 golden")
    w.add_context_length(c.max_position_embeddings)
    w.add_embedding_length(c.hidden_size)
    if getattr(c, "intermediate_size", None):  # the MoE config has none, and its files no such key
        w.add_feed_forward_length(c.intermediate_size)
    if extra_keys:
        extra_keys(w)
    w.add_block_count(c.num_hidden_layers + has_mtp)
    if has_mtp:
        w.add_nextn_predict_layers(1)
    w.add_head_count(c.num_attention_heads)
    w.add_head_count_kv(c.num_key_value_heads)
    w.add_key_length(c.head_dim)
    w.add_value_length(c.head_dim)
    w.add_rope_freq_base(c.rope_parameters["rope_theta"])
    w.add_layer_norm_rms_eps(c.rms_norm_eps)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    w.add_ssm_conv_kernel(c.linear_conv_kernel_dim)
    w.add_ssm_state_size(hk)
    w.add_ssm_group_count(nk)
    w.add_ssm_time_step_rank(nv)
    w.add_ssm_inner_size(hv * nv)
    w.add_array(f"{arch}.attention.recurrent_layers",
                [t == "linear_attention" for t in c.layer_types] + [False] * has_mtp)
    w.add_full_attention_interval(4)
    w.add_rope_dimension_count(int(c.head_dim * c.rope_parameters["partial_rotary_factor"]))
    if sections:
        w.add_rope_dimension_sections(list(c.rope_parameters["mrope_section"]) + [0])

    # A byte-fallback SentencePiece vocabulary of the model's size, so that `ferry serve` can run the file
    # (requests send token ids; replies are detokenized): <unk>, <s>, </s>, the 256 bytes, and four pieces.
    pieces = ["\u2581a", "\u2581the", "\u2581and", "\u2581of"]
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + pieces
    assert len(tokens) == c.vocab_size
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores([0.0] * 259 + [-1.0 - i for i in range(len(pieces))])
    w.add_token_types([2, 3, 3] + [6] * 256 + [1] * len(pieces))
    w.add_unk_token_id(0)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)

    def put(name, t, vector=False):
        a = t.detach().float().numpy()
        w.add_tensor(name, a.astype(np.float32 if vector or a.ndim == 1 else mat_type))

    sd = model.state_dict()
    put("token_embd.weight", sd["model.embed_tokens.weight"])
    put("output_norm.weight", sd["model.norm.weight"] + 1, True)
    put("output.weight", sd["lm_head.weight"])
    def layer(l, b, sd=sd):
        p = f"model.layers.{l}."
        put(b + "attn_norm.weight", sd[p + "input_layernorm.weight"] + 1, True)
        put(b + "post_attention_norm.weight", sd[p + "post_attention_layernorm.weight"] + 1, True)
        ffn(put, sd, p, b)
        if c.layer_types[l] == "full_attention":
            a = p + "self_attn."
            put(b + "attn_q.weight", sd[a + "q_proj.weight"])
            put(b + "attn_k.weight", sd[a + "k_proj.weight"])
            put(b + "attn_v.weight", sd[a + "v_proj.weight"])
            put(b + "attn_output.weight", sd[a + "o_proj.weight"])
            put(b + "attn_q_norm.weight", sd[a + "q_norm.weight"] + 1, True)
            put(b + "attn_k_norm.weight", sd[a + "k_norm.weight"] + 1, True)
            return
        linear(put, sd, p + "linear_attn.", b, c)

    for l in range(c.num_hidden_layers):
        layer(l, f"blk.{l}.")
    if isinstance(mtp, MtpBlock):
        L, msd = c.num_hidden_layers, mtp.state_dict()
        layer(L - 1, f"blk.{L}.", {k.replace(f"block.model.layers.0.", f"model.layers.{L - 1}."): v
                                   for k, v in msd.items()})
        put(f"blk.{L}.nextn.eh_proj.weight", msd["eh_proj.weight"])
        put(f"blk.{L}.nextn.enorm.weight", msd["enorm"] + 1, True)
        put(f"blk.{L}.nextn.hnorm.weight", msd["hnorm"] + 1, True)
        put(f"blk.{L}.nextn.shared_head_norm.weight", msd["block.model.norm.weight"] + 1, True)
    elif mtp:
        L, d = c.num_hidden_layers, c.hidden_size
        assert c.layer_types[L - 1] == "full_attention"
        layer(L - 1, f"blk.{L}.")
        g = torch.Generator().manual_seed(7)
        put(f"blk.{L}.nextn.eh_proj.weight", 0.1 * torch.randn(d, 2 * d, generator=g))
        for n in ("enorm", "hnorm", "shared_head_norm"):
            put(f"blk.{L}.nextn.{n}.weight", 1 + 0.1 * torch.randn(d, generator=g), True)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


class MtpBlock(torch.nn.Module):
    """The multi-token-prediction head of the family as llama.cpp's qwen35 graph_mtp computes it (transformers
    has no MTP: the checkpoints' mtp.* weights are ignored there): for the token x at position p and the
    trunk's final normed hidden state h of position p - 1 (zeros at p = 0),
      y = eh_proj · [rmsnorm(embed(x)) * enorm ; rmsnorm(h) * hnorm],
    then one full-attention decoder layer of the family over y with its own K/V (here transformers' own
    Qwen3_5 decoder layer, run as a one-layer model fed inputs_embeds), its final norm as shared_head_norm,
    which gives the head's hidden state o (the next draft's h), and the trunk's lm_head: logits = lm_head(o).
    Norm weights are Qwen3_5RMSNorm's zero-centred ones (the file holds 1 + w)."""

    def __init__(self, cfg, target):
        super().__init__()
        d = cfg.hidden_size
        self.eh_proj = torch.nn.Linear(2 * d, d, bias=False)
        self.enorm = torch.nn.Parameter(torch.zeros(d))
        self.hnorm = torch.nn.Parameter(torch.zeros(d))
        one = dict(CFG, num_hidden_layers=1, layer_types=["full_attention"])
        self.block = Qwen3_5ForCausalLM(Qwen3_5TextConfig(**one))
        self.eps = cfg.rms_norm_eps
        self.target = (target,)  # not a submodule: its weights are the trunk's

    def rms(self, x, w):
        x = x.float()
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * (1.0 + w.float())

    def forward(self, tokens, h):
        """tokens (T,) at positions 0..T-1, h (T, dim): each row's hidden input -> o (T, dim), logits."""
        t = self.target[0]
        e = t.model.embed_tokens(torch.tensor(tokens))
        y = self.eh_proj(torch.cat([self.rms(e, self.enorm), self.rms(h, self.hnorm)], -1))
        o = self.block.model(inputs_embeds=y[None]).last_hidden_state[0]
        return o, t.lm_head(o)


MTP_NAME = "qwen35_mtp_f32"
MTP_DRAFT = 4


def make_mtp():
    """tests/golden/models/qwen35_mtp_f32.gguf (the dense golden's shape in f32, with one MTP block of its own
    random weights) and tests/golden/qwen35_mtp_f32.json: per case the prompt, the trunk's 24 greedy tokens,
    and, after the prompt and the first `offset` greedy tokens (every position's h the trunk's), the
    MTP_DRAFT tokens the head drafts by chaining from the next greedy token, with each draft's logits."""
    torch.manual_seed(SEED + 10)
    cfg = Qwen3_5TextConfig(**CFG)
    model = Qwen3_5ForCausalLM(cfg).eval()
    init_weights(model, SEED + 10)
    mtp = MtpBlock(cfg, model).eval()
    init_weights(mtp, SEED + 11)
    gguf_dir = os.path.join(HERE, "models")
    write_gguf(model, cfg, os.path.join(gguf_dir, MTP_NAME + ".gguf"), mtp=mtp, mat_type=np.float32)
    g = torch.Generator().manual_seed(SEED + 12)
    cases = []
    for n, offsets in ((7, (0, 6)), (20, (0, 11))):
        ids = torch.randint(3, cfg.vocab_size, (n,), generator=g).tolist()
        toks, margin = greedy(model, ids, N_GREEDY)
        for off in offsets:
            seq = ids + toks[:off]
            with torch.no_grad():
                h = model.model(torch.tensor([seq])).last_hidden_state[0]
                hin = torch.cat([torch.zeros(1, cfg.hidden_size), h], 0)
                chain, drafts, rows, dmargin = seq + [toks[off]], [], [], 1e9
                for _ in range(MTP_DRAFT):
                    o, logits = mtp(chain, hin)
                    last = logits[-1].double()
                    top2 = torch.topk(last, 2).values
                    dmargin = min(dmargin, float(top2[0] - top2[1]))
                    d = int(torch.argmax(last))
                    drafts.append(d)
                    rows.append([float(x) for x in logits[-1]])
                    chain.append(d)
                    hin = torch.cat([hin, o[-1:]], 0)
            cases.append({"prompt_tokens": ids, "greedy_tokens": toks, "min_top2_margin": margin, "offset": off,
                          "draft_tokens": drafts, "draft_logits": rows, "draft_min_top2_margin": dmargin})
            print(f"{MTP_NAME}: prompt {n:3d} offset {off:2d} drafts {drafts} (greedy {toks[off + 1:off + 5]}) "
                  f"margins {margin:.4f} {dmargin:.4f}")
    with open(os.path.join(HERE, MTP_NAME + ".json"), "w") as f:
        json.dump({"model": f"models/{MTP_NAME}.gguf", "dtype": "float32", "n_draft": MTP_DRAFT,
                   "cases": cases}, f)


def main():
    import sys
    if sys.argv[1:] == ["--mtp"]:
        make_mtp()
        return
    torch.manual_seed(SEED)
    cfg = Qwen3_5TextConfig(**CFG)
    model = Qwen3_5ForCausalLM(cfg).eval()
    make(NAME, model, cfg, SEED, write_gguf)
    save_multimodal(model, cfg, os.path.join(HERE, "models", NAME + "_vl"))
    make_mtp()


def save_multimodal(model, cfg, path):
    """The same language model inside a Qwen3_5ForConditionalGeneration (its fields under text_config, its
    tensors under model.language_model.*) with a one-block vision tower of random weights that a text-only
    reader leaves alone."""
    from transformers import Qwen3_5Config, Qwen3_5ForConditionalGeneration
    vision = dict(depth=1, hidden_size=32, intermediate_size=32, num_heads=2, out_hidden_size=cfg.hidden_size,
                  patch_size=4, spatial_merge_size=2, temporal_patch_size=2, num_position_embeddings=16)
    vl = Qwen3_5ForConditionalGeneration(Qwen3_5Config(text_config=CFG, vision_config=vision,
                                                       tie_word_embeddings=False)).eval()
    vl.model.language_model.load_state_dict(model.model.state_dict())
    vl.lm_head.load_state_dict(model.lm_head.state_dict())
    save_hf(vl, path)


def save_hf(model, path, fused=False):
    """The checkpoint as transformers writes it (config.json, model.safetensors with its tensor names), the
    f16-exact matrices stored as F16 and the vectors and conv weights as F32, so that it holds the same
    function as the GGUF file and stays small. fused: the experts as the released Qwen3.5-MoE checkpoints
    store them, one mlp.experts.gate_up_proj (n_expert, 2 ffn, dim) and down_proj (n_expert, dim, ffn) per
    layer (the model's own parameters), where save_pretrained writes one tensor per expert."""
    import shutil
    import tempfile
    from safetensors.torch import load_file, save_file
    with tempfile.TemporaryDirectory() as d:
        model.save_pretrained(d)
        sd = load_file(os.path.join(d, "model.safetensors"))
        os.makedirs(path, exist_ok=True)
        shutil.copy(os.path.join(d, "config.json"), os.path.join(path, "config.json"))
    if fused:
        sd = {k: v.detach().clone() for k, v in model.state_dict().items()}
    out = {k: (v.half() if v.dim() >= 2 and "conv1d" not in k else v).contiguous() for k, v in sd.items()}
    save_file(out, os.path.join(path, "model.safetensors"), metadata={"format": "pt"})


def make(name, model, cfg, seed, write, hf_fused=False):
    """Random weights (seed), rounded to f16; the file (write(model, cfg, path)) and the reference outputs
    for PROMPT_LENGTHS into tests/golden/{name}.json."""
    init_weights(model, seed)
    # Round every matrix to f16 (what the file stores); vectors stay f32 as in the file.
    with torch.no_grad():
        for pname, p in model.named_parameters():
            if p.dim() >= 2 and "conv1d" not in pname:
                p.copy_(p.half().float())
    gguf_dir = os.path.join(HERE, "models")
    os.makedirs(gguf_dir, exist_ok=True)
    write(model, cfg, os.path.join(gguf_dir, name + ".gguf"))
    save_hf(model, os.path.join(gguf_dir, name), hf_fused)
    g = torch.Generator().manual_seed(seed + 1)
    cases = []
    for n in PROMPT_LENGTHS:
        ids = torch.randint(3, cfg.vocab_size, (n,), generator=g).tolist()
        with torch.no_grad():
            logits = model(torch.tensor([ids])).logits[0, -1]
        toks, margin = greedy(model, ids, N_GREEDY)
        cases.append({"prompt_tokens": ids, "logits": [float(x) for x in logits], "greedy_tokens": toks,
                      "min_top2_margin": margin})
        print(f"{name}: prompt {n:3d} min top-2 margin {margin:.4f} logit absmax {float(logits.abs().max()):.2f}")
    with open(os.path.join(HERE, name + ".json"), "w") as f:
        json.dump({"model": f"models/{name}.gguf", "dtype": "float16", "cases": cases}, f)


if __name__ == "__main__":
    main()
