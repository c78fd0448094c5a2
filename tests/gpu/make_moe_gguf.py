#!/usr/bin/env python3
"""make_moe_gguf.py OUT [SHAPE] [MIX] — a Qwen3-MoE GGUF (llama.cpp's `qwen3moe`) of a real shape with random
weights stored in a llama.cpp type mix, for timing Mixture-of-Experts models beside llama.cpp on a machine where
no real model can be fetched.

SHAPE: qwen3-30b-a3b (default: 48 layers, dim 2048, 128 experts of which 8 per token, expert FFN 768, 32 query
and 4 KV heads of 128, vocabulary 151936) or DIM,LAYERS,EXPERTS,USED,EXPERT_FFN,HEADS,KV_HEADS,HEAD_DIM,VOCAB
(a small file of the same layout for a quick load test). MIX: Q4_K_M (default), Q5_K_M, Q8_0, F16.
make_moe_gguf.py --fit-ncmoe BASE_MIB BUDGET_MIB [SHAPE] [MIX] prints the smallest N for llama.cpp's
--n-cpu-moe N whose device memory fits BUDGET_MIB, given BASE_MIB with every layer's experts in host memory.

The tensors and keys are those llama.cpp's qwen3moe loader reads (src/models/qwen3moe.cpp of the peer): per
layer attn_{norm,q,k,v,output}, attn_{q,k}_norm, ffn_norm, the router ffn_gate_inp (F32, as llama-quantize
keeps it) and the experts stacked as ffn_{gate,up}_exps {dim, expert_ffn, experts} and ffn_down_exps
{expert_ffn, dim, experts}. The type mix is llama.cpp's for a model of more than 8 experts: Q4_K_M stores attn_v
and ffn_down_exps in Q6_K on the layers where use_more_bits(i, n) holds, output in Q6_K, the rest in Q4_K.
The blocks are random bytes with sane f16 scales, as in make_quant_gguf.py (whose writer and vocabulary this
shares), with K-quant values centred on zero; the router is random normal. Both, and the gains below, keep the
routing near uniform, as a trained model's load balancing makes it: each step reads as many distinct experts as
a real one would (a router of ones would tie every score, and uncentred blocks or unscaled embeddings send
every token to the same few experts). Written streaming: the 30B-A3B Q4_K_M file (18.6 GB) in under a minute
where the disk keeps up.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_quant_gguf import FTYPE, Writer, mix_types, spm_vocab  # noqa: E402

# dim, layers, experts, used, expert ffn, heads, kv heads, head dim, vocab, dense ffn (the config's
# intermediate_size, unused by the experts), rope theta, trained context
SHAPES = {"qwen3-30b-a3b": (2048, 48, 128, 8, 768, 32, 4, 128, 151936, 6144, 1000000.0, 40960)}


# Random blocks give each matrix's outputs about the deviation of its inputs. Left so, a token's embedding is
# small beside what the layers add, and attention (which averages the values of many positions) soon makes
# every position's hidden state nearly the same: the routers then send every token to the same few experts.
# Embeddings scaled up to about the layers' outputs and the values scaled down keep each position's own state,
# and routing near uniform (simulated in f32 over 12 layers: any two tokens share top-k experts about as
# often as random choices do).
EMBED_GAIN, VALUE_GAIN = 40.0, 0.05


def dims(shape):
    if shape in SHAPES:
        return SHAPES[shape]
    dim, layers, n_exp, n_used, eff, heads, kvh, hd, vocab = (int(x) for x in shape.split(","))
    return dim, layers, n_exp, n_used, eff, heads, kvh, hd, vocab, eff * n_used, 1000000.0, 4096


def tensors(shape, mix):
    """(name, ne, type, std) of every tensor of the file, in file order (std: F32 only, None = ones)."""
    dim, layers, n_exp, n_used, eff, heads, kvh, hd, vocab = dims(shape)[:9]
    pick = mix_types(mix, layers)
    yield "token_embd.weight", [dim, vocab], pick("token_embd", 0), EMBED_GAIN
    yield "output_norm.weight", [dim], "F32", None
    yield "output.weight", [dim, vocab], pick("output", 0), None
    for i in range(layers):
        p = f"blk.{i}."
        yield p + "attn_norm.weight", [dim], "F32", None
        yield p + "attn_q.weight", [dim, heads * hd], pick("attn_q", i), None
        yield p + "attn_k.weight", [dim, kvh * hd], pick("attn_k", i), None
        yield p + "attn_v.weight", [dim, kvh * hd], pick("attn_v", i), VALUE_GAIN
        yield p + "attn_output.weight", [heads * hd, dim], pick("attn_output", i), None
        yield p + "attn_q_norm.weight", [hd], "F32", None
        yield p + "attn_k_norm.weight", [hd], "F32", None
        yield p + "ffn_norm.weight", [dim], "F32", None
        yield p + "ffn_gate_inp.weight", [dim, n_exp], "F32", 1.5 / dim**0.5  # scores of deviation ~1.5
        yield p + "ffn_gate_exps.weight", [dim, eff, n_exp], pick("ffn_gate", i), None
        yield p + "ffn_up_exps.weight", [dim, eff, n_exp], pick("ffn_up", i), None
        yield p + "ffn_down_exps.weight", [eff, dim, n_exp], pick("ffn_down", i), None


def fit_ncmoe(base_mib, budget_mib, shape, mix):
    """The smallest N for llama.cpp's --n-cpu-moe N (the experts of layers 0..N-1 in host memory) whose device
    memory fits budget_mib, given base_mib on the device with every layer's experts in host memory."""
    layers = dims(shape)[1]
    per = [0.0] * layers
    for name, ne, tname, _ in tensors(shape, mix):
        if name.endswith("_exps.weight"):
            per[int(name.split(".")[1])] += Writer.nbytes(ne, tname) / 2**20
    for n in range(layers + 1):
        if base_mib + sum(per[n:]) <= budget_mib:
            return n
    return layers


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--fit-ncmoe":  # --fit-ncmoe BASE_MIB BUDGET_MIB [SHAPE [MIX]]
        base, budget = float(sys.argv[2]), float(sys.argv[3])
        shape = sys.argv[4] if len(sys.argv) > 4 else "qwen3-30b-a3b"
        print(fit_ncmoe(base, budget, shape, (sys.argv[5] if len(sys.argv) > 5 else "Q4_K_M").upper()))
        return 0
    if len(sys.argv) < 2 or sys.argv[1] in ("-h", "--help"):
        print(__doc__, file=sys.stderr)
        return 2
    out = sys.argv[1]
    shape = sys.argv[2] if len(sys.argv) > 2 else "qwen3-30b-a3b"
    mix = (sys.argv[3] if len(sys.argv) > 3 else "Q4_K_M").upper()
    dim, layers, n_exp, n_used, eff, heads, kvh, hd, vocab, ffn, theta, ctx = dims(shape)
    if vocab < 260 or n_used > n_exp:
        print("make_moe_gguf.py: the vocabulary needs 260 tokens or more and USED <= EXPERTS", file=sys.stderr)
        return 2
    a = "qwen3moe"
    w = Writer(out)
    w.string("general.architecture", a)
    w.string("general.name", f"random {shape} {mix}")
    w.u32("general.file_type", FTYPE[mix])
    for key, v in (("context_length", ctx), ("embedding_length", dim), ("block_count", layers),
                   ("feed_forward_length", ffn), ("expert_feed_forward_length", eff), ("expert_count", n_exp),
                   ("expert_used_count", n_used), ("attention.head_count", heads), ("attention.head_count_kv", kvh),
                   ("attention.key_length", hd), ("attention.value_length", hd), ("rope.dimension_count", hd)):
        w.u32(f"{a}.{key}", v)
    w.f32(f"{a}.rope.freq_base", theta)
    w.f32(f"{a}.attention.layer_norm_rms_epsilon", 1e-6)
    spm_vocab(w, vocab)
    for t in tensors(shape, mix):
        w.tensor(*t)
    w.write(centred=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
