#!/usr/bin/env python3
"""make_qwen3next_golden.py — a tiny random Qwen3-Next (transformers' qwen3_next) model as GGUF files, and its
reference outputs from transformers.

Writes tests/golden/models/qwen3next_f16.gguf, tests/golden/models/qwen3next_ssm_in_f16.gguf, the checkpoint
as a Hugging Face directory tests/golden/models/qwen3next_f16/ (experts one tensor each, as save_pretrained
writes them) and tests/golden/qwen3next_f16.json: for prompts of 1, 7, 45 and 150 tokens the last-position logits (f32) and 24
greedy tokens computed by transformers in float32, as make_qwen35_golden.py does for Qwen3.5 (its weights,
rounding and file writer are reused here).

Model: 4 layers, full_attention_interval 4 (3 gated DeltaNet layers, then one gated full-attention layer),
hidden 64, vocab 263; linear attention with 2 key heads and 4 value heads of 16 (two value heads per key
head, so grouped and tiled orders differ), conv width 4; full attention with 4 query heads (each with its
output gate) over 2 KV heads of head_dim 24, QK-norm, partial rotary 0.25; every FFN a
Qwen3NextSparseMoeBlock: 6 experts of 24, top-2, norm_topk_prob, and a shared expert of 40 gated by
sigmoid(shared_expert_gate(x)). intermediate_size 80 (which no layer uses) is written as
feed_forward_length, as the converter does.

The files are written as llama.cpp's convert_hf_to_gguf.py (Qwen3NextModel, through Qwen2MoeModel) writes the
"qwen3next" architecture: keys qwen3next.ssm.{conv_kernel, state_size, group_count, time_step_rank,
inner_size}, full_attention_interval, attention.recurrent_layers (the checkpoint has layer_types),
rope.dimension_count = head_dim * 0.25 (no rope sections), expert_count / expert_used_count /
expert_feed_forward_length / expert_shared_feed_forward_length; norms as 1 + w (the gated norm's not), A_log
as -exp(A_log), dt_bias as ssm_dt.bias, the conv weight squeezed; the value heads kept grouped by key head.
in_proj_qkvz is split as Qwen3NextModel.modify_tensors does into attn_qkv (all q, all k, all v) and
attn_gate (z); in_proj_ba is written as it is, ssm_ba. The second file is the older layout llama.cpp still
reads (its "legacy" ssm_in path): in_proj_qkvz as it is, ssm_in, and no attn_qkv / attn_gate. Both end with
one multi-token-prediction block (nextn_predict_layers 1), as the converter's default export.

Run: python3 tests/golden/make_qwen3next_golden.py [--converter LLAMA_CPP_DIR]  (needs torch, transformers >=
5.23, gguf, numpy; CI uses the committed output). With --converter, the checkpoint is also saved and converted
by that llama.cpp tree's convert_hf_to_gguf.py (--no-nextn: transformers has no MTP weights; no tokenizer), and
every tensor of its file must equal the one written here in name, shape and value, and every key but the MTP
block's (block_count, nextn_predict_layers, recurrent_layers' last entry) match.
"""
import os
import subprocess
import sys
import tempfile

import torch
from transformers import Qwen3NextConfig, Qwen3NextForCausalLM

import make_qwen35_golden as q35
import make_qwen35moe_golden as q35moe

NAME = "qwen3next_f16"
LEGACY = "qwen3next_ssm_in_f16"
SEED = 149

CFG = {k: v for k, v in q35.CFG.items() if k != "rope_parameters"}
CFG.update(rope_parameters={"rope_type": "default", "rope_theta": 1000000.0, "partial_rotary_factor": 0.25},
           num_experts=6, num_experts_per_tok=2, moe_intermediate_size=24, shared_expert_intermediate_size=40,
           norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[])


def linear(packed_qkvz):
    """A gated DeltaNet layer as Qwen3NextModel.modify_tensors writes it (value heads grouped by key head)."""
    def put_layer(put, sd, a, b, c):
        nk, nv, hk, hv = (c.linear_num_key_heads, c.linear_num_value_heads, c.linear_key_head_dim,
                          c.linear_value_head_dim)
        qkvz = sd[a + "in_proj_qkvz.weight"]  # per key head: q, k, v of its value heads, their z
        if packed_qkvz:
            put(b + "ssm_in.weight", qkvz)
        else:
            r = nv // nk
            per = qkvz.reshape(nk, 2 * hk + 2 * r * hv, c.hidden_size)
            q, k, v, z = torch.split(per, [hk, hk, r * hv, r * hv], dim=1)
            put(b + "attn_qkv.weight", torch.cat([x.reshape(-1, c.hidden_size) for x in (q, k, v)], 0))
            put(b + "attn_gate.weight", z.reshape(-1, c.hidden_size))
        put(b + "ssm_ba.weight", sd[a + "in_proj_ba.weight"])
        put(b + "ssm_conv1d.weight", sd[a + "conv1d.weight"].squeeze(1), True)
        put(b + "ssm_dt.bias", sd[a + "dt_bias"], True)
        put(b + "ssm_a", -torch.exp(sd[a + "A_log"].float()), True)
        put(b + "ssm_norm.weight", sd[a + "norm.weight"], True)
        put(b + "ssm_out.weight", sd[a + "out_proj.weight"])
    return put_layer


def writer(packed_qkvz):
    def write(model, cfg, path):
        q35.write_gguf(model, cfg, path, arch="qwen3next", ffn=q35moe.moe_ffn, extra_keys=q35moe.moe_keys(cfg),
                       mtp=True, linear=linear(packed_qkvz), sections=False)
    return write


CONVERT = """
import sys
sys.path[:0] = [LCP, LCP + "/gguf-py"]
import conversion.qwen as cq
cq.Qwen3NextModel.set_vocab = lambda self: None
sys.argv = ["convert_hf_to_gguf.py", SRC, "--outtype", "f16", "--outfile", OUT, "--no-nextn"]
runpy.run_path(LCP + "/convert_hf_to_gguf.py", run_name="__main__")
"""

COMPARE = """
import sys
import numpy as np
sys.path.insert(0, LCP + "/gguf-py")
import gguf
a, b = gguf.GGUFReader(OUT), gguf.GGUFReader(OURS)
ta, tb = {t.name: t for t in a.tensors}, {t.name: t for t in b.tensors}
extra = sorted(n for n in set(tb) - set(ta) if not n.startswith("blk.%d." % LAYERS))
assert set(ta) <= set(tb) and not extra, (sorted(set(ta) - set(tb)), extra)
for n, t in ta.items():
    x, y = (np.asarray(u.data, dtype=np.float32).reshape(-1) for u in (t, tb[n]))
    assert list(t.shape) == list(tb[n].shape) and np.array_equal(x, y), n
skip = {"GGUF.kv_count", "GGUF.tensor_count", "qwen3next.block_count", "qwen3next.nextn_predict_layers"}
fa, fb = ({f.name: f.contents() for f in r.fields.values() if not f.name.startswith(("general.", "tokenizer."))
           and f.name not in skip} for r in (a, b))
fb["qwen3next.attention.recurrent_layers"] = fb["qwen3next.attention.recurrent_layers"][:LAYERS]
assert fa == fb, {k: (fa.get(k), fb.get(k)) for k in set(fa) | set(fb) if fa.get(k) != fb.get(k)}
print("converter check: %d tensors and %d keys equal" % (len(ta), len(fa)))
"""


def check_converter(model, lcp):
    """The converter of llama.cpp tree lcp on the checkpoint writes what writer(False) wrote."""
    with tempfile.TemporaryDirectory() as d:
        model.save_pretrained(os.path.join(d, "hf"))
        env = dict(LCP=lcp, SRC=os.path.join(d, "hf"), OUT=os.path.join(d, "conv.gguf"), LAYERS=CFG["num_hidden_layers"],
                   OURS=os.path.join(q35.HERE, "models", NAME + ".gguf"))
        for code in (CONVERT, COMPARE):  # separate processes: the tree's gguf-py, not the installed one
            pre = "".join(f"{k} = {v!r}\n" for k, v in env.items()) + "import runpy\n"
            subprocess.run([sys.executable, "-c", pre + code], check=True, cwd=lcp)


def main():
    torch.manual_seed(SEED)
    cfg = Qwen3NextConfig(**CFG)
    model = Qwen3NextForCausalLM(cfg).eval()
    q35.make(NAME, model, cfg, SEED, writer(False))
    # The same weights (make rounded them already) in the older layout; the reference outputs are the same.
    writer(True)(model, cfg, os.path.join(q35.HERE, "models", LEGACY + ".gguf"))
    if "--converter" in sys.argv:
        check_converter(model, os.path.abspath(sys.argv[sys.argv.index("--converter") + 1]))


if __name__ == "__main__":
    main()
