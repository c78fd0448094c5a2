#!/usr/bin/env python3
"""make_family_gguf.py OUT SHAPE [--scale S] [--mix MIX] — a GGUF of a real model family's shape with random
weights in a llama.cpp type mix, for timing ferry beside llama.cpp where no real model can be fetched.

SHAPE (the hyperparameters of the published checkpoints' config.json):
  qwen3-8b     `qwen3`: 36 layers, dim 4096, 32 query / 8 KV heads of 128, QK-norm, FFN 12288, vocabulary
               151936, rope base 1e6 (Q4_K_M: 4.7 GiB)
  gemma3-12b   `gemma3`: 48 layers, dim 3840, 16 query / 8 KV heads of 256, QK-norm, sandwich norms, GeGLU
               FFN 15360, vocabulary 262144 tied to the output, sliding window 1024 on 5 of every 6 layers
               (llama.cpp's default pattern), rope base 1e6 with linear scaling 8 on the global layers
               (Q4_K_M: 6.8 GiB)
  qwen35-27b   `qwen35`: 64 layers, dim 5120, FFN 17408, vocabulary 248320; every 4th layer full attention
               (24 query / 4 KV heads of 256 with an output gate, QK-norm, rotary on 64 dims with the sections
               [11, 11, 10, 0], base 1e7), the others gated DeltaNet (16 key heads and 48 value heads of
               128, convolution width 4) (Q4_K_M: 15.4 GiB). The multi-token-prediction block of the real
               checkpoint is left out (llama.cpp and ferry skip it when decoding).
--scale S: a small file of the same structure for a load test on a machine without a GPU: widths, head counts,
layer count and vocabulary divided by S (kept multiples of the quantization block, of the layer pattern, at
least one head of each kind). --mix: Q4_K_M (default), Q5_K_M, Q8_0, F16.
make_family_gguf.py --fit-ngl OVERHEAD_MIB BUDGET_MIB SHAPE [--scale S] [--mix MIX] prints the largest N for
llama.cpp's -ngl N (the output matrix and the last N-1 layers on the device) whose weights plus OVERHEAD_MIB
(its KV cache and compute buffers) fit BUDGET_MIB.
make_family_gguf.py --fit-ngl-weights N SHAPE [...] prints the MiB of those weights under -ngl N.
make_family_gguf.py --layer-mib SHAPE [--scale S] [--mix MIX] prints the output matrix's MiB and each layer's.

The keys and tensors are those llama.cpp's converter writes for each family (conversion/qwen.py and gemma.py of
the peer) and its loaders read (src/models/qwen3.cpp, gemma3.cpp, qwen35.cpp); ferry reads the same
(weights/arch/). The type mix is llama-quantize's (src/llama-quant.cpp) for the mix: the output matrix, or the
token embedding when tied to it, in Q6_K; under Q4_K_M / Q5_K_M attn_v (and the DeltaNet in-projection
attn_qkv, which llama-quantize counts with it) and ffn_down in Q6_K on the layers where use_more_bits(i, n)
holds; norms, the convolution, ssm_a and ssm_dt in F32; everything else in the mix's base type. The blocks are
random with sane scales and values centred on zero (make_quant_gguf.py, whose writer and vocabulary this
uses); ssm_a is -A with A uniform in (1, 16) as the checkpoints' A_log initialisation gives, so that the
recurrent state decays. Written streaming, disk-bound: 4.7 GiB in 43 s, 15.4 GiB in 79 s on a 2-core VM.
"""
import math
import os
import struct
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_quant_gguf import FTYPE, Writer, mix_types, rng, spm_vocab  # noqa: E402

# (arch, dim, layers, heads, kv heads, head dim, ffn, vocab, rope base, context, pattern) and per family extras
SHAPES = {
    "qwen3-8b": dict(arch="qwen3", dim=4096, layers=36, heads=32, kvh=8, hd=128, ffn=12288, vocab=151936,
                     theta=1e6, ctx=40960, period=1, tied=False),
    "gemma3-12b": dict(arch="gemma3", dim=3840, layers=48, heads=16, kvh=8, hd=256, ffn=15360, vocab=262144,
                       theta=1e6, ctx=131072, period=6, tied=True, window=1024, rope_linear=8.0),
    "qwen35-27b": dict(arch="qwen35", dim=5120, layers=64, heads=24, kvh=4, hd=256, ffn=17408, vocab=248320,
                       theta=1e7, ctx=262144, period=4, tied=False, conv=4, ssm_state=128, ssm_groups=16,
                       ssm_v_heads=48, rope_dim=64, sections=[11, 11, 10, 0]),
}
QK = 256  # the K-quant block: every quantized matrix's rows are a multiple of it


def shape_of(name, scale=1):
    """The shape's hyperparameters, divided by scale (see the module's help)."""
    if name not in SHAPES:
        raise SystemExit(f"make_family_gguf.py: unknown shape {name!r} (known: {', '.join(SHAPES)})")
    s = dict(SHAPES[name])
    if scale > 1:
        def width(v):
            return max(QK, int(math.ceil(v / scale / QK)) * QK)

        s["dim"], s["ffn"] = width(s["dim"]), width(s["ffn"])
        s["kvh"] = max(1, s["kvh"] // scale)
        s["heads"] = max(s["kvh"], s["heads"] // scale)
        while s["heads"] % s["kvh"] or s["heads"] * s["hd"] % QK:
            s["heads"] += 1
        s["layers"] = max(2 * s["period"], s["layers"] // scale // s["period"] * s["period"])
        s["vocab"] = max(1024, s["vocab"] // scale)
        if "ssm_groups" in s:
            s["ssm_groups"] = max(1, s["ssm_groups"] // scale)
            s["ssm_v_heads"] = max(s["ssm_groups"], s["ssm_v_heads"] // scale // s["ssm_groups"] * s["ssm_groups"])
            while s["ssm_v_heads"] * s["ssm_state"] % QK:
                s["ssm_v_heads"] += s["ssm_groups"]
    return s


def recurrent(s, i):
    return s["arch"] == "qwen35" and (i + 1) % s["period"] != 0


def neg_decay(n):  # ssm_a = -exp(A_log), A uniform in (1, 16)
    return -rng.uniform(1.0, 16.0, n)


def tensors(s, mix):
    """(name, ne, type, scale) of every tensor, in file order (scale: F32 — None = ones, else the Writer's)."""
    dim, L, hd, ffn = s["dim"], s["layers"], s["hd"], s["ffn"]
    pick = mix_types(mix, L)
    yield "token_embd.weight", [dim, s["vocab"]], pick("output" if s["tied"] else "token_embd", 0), None
    yield "output_norm.weight", [dim], "F32", None
    if not s["tied"]:
        yield "output.weight", [dim, s["vocab"]], pick("output", 0), None
    for i in range(L):
        p = f"blk.{i}."
        yield p + "attn_norm.weight", [dim], "F32", None
        if recurrent(s, i):  # gated DeltaNet: q, k (groups x state), v (value heads x state), then its gate
            kd, vd = s["ssm_groups"] * s["ssm_state"], s["ssm_v_heads"] * s["ssm_state"]
            yield p + "attn_qkv.weight", [dim, 2 * kd + vd], pick("attn_v", i), None
            yield p + "attn_gate.weight", [dim, vd], pick("other", i), None
            yield p + "ssm_conv1d.weight", [s["conv"], 2 * kd + vd], "F32", 0.3
            yield p + "ssm_dt.bias", [s["ssm_v_heads"]], "F32", None
            yield p + "ssm_a", [s["ssm_v_heads"]], "F32", neg_decay
            yield p + "ssm_beta.weight", [dim, s["ssm_v_heads"]], pick("other", i), None
            yield p + "ssm_alpha.weight", [dim, s["ssm_v_heads"]], pick("other", i), None
            yield p + "ssm_norm.weight", [s["ssm_state"]], "F32", None
            yield p + "ssm_out.weight", [vd, dim], pick("other", i), None
        else:  # qwen35's queries carry their output gate: twice the rows
            q_rows = s["heads"] * hd * (2 if s["arch"] == "qwen35" else 1)
            yield p + "attn_q.weight", [dim, q_rows], pick("attn_q", i), None
            yield p + "attn_k.weight", [dim, s["kvh"] * hd], pick("attn_k", i), None
            yield p + "attn_v.weight", [dim, s["kvh"] * hd], pick("attn_v", i), None
            yield p + "attn_output.weight", [s["heads"] * hd, dim], pick("attn_output", i), None
            yield p + "attn_q_norm.weight", [hd], "F32", None
            yield p + "attn_k_norm.weight", [hd], "F32", None
        if s["arch"] == "gemma3":
            yield p + "post_attention_norm.weight", [dim], "F32", None
            yield p + "ffn_norm.weight", [dim], "F32", None
        elif s["arch"] == "qwen35":
            yield p + "post_attention_norm.weight", [dim], "F32", None
        else:
            yield p + "ffn_norm.weight", [dim], "F32", None
        yield p + "ffn_gate.weight", [dim, ffn], pick("ffn_gate", i), None
        yield p + "ffn_up.weight", [dim, ffn], pick("ffn_up", i), None
        yield p + "ffn_down.weight", [ffn, dim], pick("ffn_down", i), None
        if s["arch"] == "gemma3":
            yield p + "post_ffw_norm.weight", [dim], "F32", None


def layer_mib(s, mix):
    """(the output matrix's MiB, [each layer's MiB])."""
    per, out = [0.0] * s["layers"], 0.0
    for name, ne, tname, _ in tensors(s, mix):
        mib = Writer.nbytes(ne, tname) / 2**20
        if name.startswith("blk."):
            per[int(name.split(".")[1])] += mib
        elif name == "output.weight" or (s["tied"] and name == "token_embd.weight"):
            out += mib
    return out, per


def ngl_mib(n, s, mix):
    """The weights' MiB on the device under llama.cpp's -ngl n: the output matrix and the last n-1 layers."""
    out, per = layer_mib(s, mix)
    n = min(n, s["layers"] + 1)
    return 0.0 if n < 1 else out + sum(per[len(per) - (n - 1):]) if n > 1 else out


def fit_ngl(overhead_mib, budget_mib, s, mix):
    """The largest N for llama.cpp's -ngl N whose weights plus overhead_mib fit budget_mib (0: not even the
    output matrix fits)."""
    return max((n for n in range(1, s["layers"] + 2) if overhead_mib + ngl_mib(n, s, mix) <= budget_mib),
               default=0)


def write(path, s, mix, shape):
    a = s["arch"]
    w = Writer(path)
    w.string("general.architecture", a)
    w.string("general.name", f"random {shape} {mix}")
    w.u32("general.file_type", FTYPE[mix])
    for key, v in (("context_length", s["ctx"]), ("embedding_length", s["dim"]), ("block_count", s["layers"]),
                   ("feed_forward_length", s["ffn"]), ("attention.head_count", s["heads"]),
                   ("attention.head_count_kv", s["kvh"]), ("attention.key_length", s["hd"]),
                   ("attention.value_length", s["hd"])):
        w.u32(f"{a}.{key}", v)
    w.f32(f"{a}.rope.freq_base", s["theta"])
    w.f32(f"{a}.attention.layer_norm_rms_epsilon", 1e-6)
    if a == "gemma3":
        w.u32(f"{a}.attention.sliding_window", s["window"])
        w.string(f"{a}.rope.scaling.type", "linear")
        w.f32(f"{a}.rope.scaling.factor", s["rope_linear"])
    if a == "qwen35":
        w.u32(f"{a}.rope.dimension_count", s["rope_dim"])
        w.array(f"{a}.rope.dimension_sections", 5, s["sections"])
        for key, v in (("ssm.conv_kernel", s["conv"]), ("ssm.state_size", s["ssm_state"]),
                       ("ssm.group_count", s["ssm_groups"]), ("ssm.time_step_rank", s["ssm_v_heads"]),
                       ("ssm.inner_size", s["ssm_v_heads"] * s["ssm_state"]),
                       ("full_attention_interval", s["period"])):
            w.u32(f"{a}.{key}", v)
        w.add(f"{a}.attention.recurrent_layers", 9,  # an array of bools (type 7), one a layer
              struct.pack("<IQ", 7, s["layers"]) + bytes(int(recurrent(s, i)) for i in range(s["layers"])))
    else:
        w.u32(f"{a}.rope.dimension_count", s["hd"])
    spm_vocab(w, s["vocab"])
    for t in tensors(s, mix):
        w.tensor(*t)
    w.write(centred=True)


def options(argv):
    """(positional arguments, scale, mix)."""
    pos, scale, mix = [], 1, "Q4_K_M"
    it = iter(argv)
    for a in it:
        if a == "--scale":
            scale = int(next(it))
        elif a == "--mix":
            mix = next(it).upper()
        else:
            pos.append(a)
    if scale < 1 or mix not in FTYPE or mix in ("Q4_0", "Q6_K"):
        raise SystemExit("make_family_gguf.py: --scale is a positive integer; --mix Q4_K_M, Q5_K_M, Q8_0 or F16")
    return pos, scale, mix


def main():
    if len(sys.argv) < 2 or sys.argv[1] in ("-h", "--help"):
        print(__doc__, file=sys.stderr)
        return 2
    if sys.argv[1] == "--fit-ngl":  # OVERHEAD_MIB BUDGET_MIB SHAPE
        pos, scale, mix = options(sys.argv[2:])
        print(fit_ngl(float(pos[0]), float(pos[1]), shape_of(pos[2], scale), mix))
        return 0
    if sys.argv[1] == "--fit-ngl-weights":  # N SHAPE
        pos, scale, mix = options(sys.argv[2:])
        print(int(ngl_mib(int(pos[0]), shape_of(pos[1], scale), mix)))
        return 0
    if sys.argv[1] == "--layer-mib":  # SHAPE
        pos, scale, mix = options(sys.argv[2:])
        out, per = layer_mib(shape_of(pos[0], scale), mix)
        print(f"output {out:.1f}\n" + "\n".join(f"{i} {m:.1f}" for i, m in enumerate(per)))
        return 0
    pos, scale, mix = options(sys.argv[1:])
    if len(pos) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    s = shape_of(pos[1], scale)
    t0 = time.time()
    write(pos[0], s, mix, pos[1] + (f"/{scale}" if scale > 1 else ""))
    print(f"wrote {pos[0]}: {pos[1]} {mix}" + (f" scaled 1/{scale}" if scale > 1 else "") +
          f", {s['layers']} layers, dim {s['dim']}, {os.path.getsize(pos[0]) / 2**30:.2f} GiB "
          f"in {time.time() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
