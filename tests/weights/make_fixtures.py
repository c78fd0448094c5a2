#!/usr/bin/env python3
"""Writes the small model-file fixtures that tests/weights reads, and expected.json describing them.

The files are written by independent implementations (the `gguf` and `safetensors` Python packages), and
expected.json records what those packages (and GGUFReader, for ../shared's stories260K.gguf) say the files
contain: hyperparameters, tensor names/types/shapes in GGUF order, byte sizes, an FNV-1a-64 hash of each
tensor's bytes and its first values. The C tests compare ferry's readers against that.

    pip install gguf safetensors numpy
    python3 tests/weights/make_fixtures.py          # rewrites tests/weights/fixtures/

Deterministic (seeded); the outputs are committed (< 200 KB) so CI needs none of these packages.
"""
import json
import os
import shutil
import struct
import sys

import numpy as np
import gguf
from gguf import GGMLQuantizationType as QT
from safetensors.numpy import save_file

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "fixtures")
rng = np.random.default_rng(20261130)


def fnv64(b: bytes) -> str:
    h = 1469598103934665603
    for x in b:
        h = ((h ^ x) * 1099511628211) & 0xFFFFFFFFFFFFFFFF
    return "%016x" % h


def first_vals(arr: np.ndarray, n=4):
    return [float(v) for v in np.asarray(arr, dtype=np.float32).reshape(-1)[:n]]


def tensor_entry(name, qtype, ne, raw: bytes, values=None):
    e = {"name": name, "type": int(qtype), "ne": [int(x) for x in ne], "nbytes": len(raw), "fnv": fnv64(raw)}
    if values is not None:
        e["first"] = first_vals(values)
    return e


# ----------------------------------------------------------------------------------------------- GGUF

def gguf_model(path, arch, hp, tensors, extra_kv=None, version=3):
    """tensors: list of (name, np array (float) or (raw uint8 array, qtype, ne)); returns tensor entries."""
    w = gguf.GGUFWriter(path, arch)
    w.add_context_length(hp["ctx"])
    w.add_embedding_length(hp["dim"])
    w.add_feed_forward_length(hp["ffn"])
    w.add_block_count(hp["layers"])
    w.add_head_count(hp["heads"])
    w.add_head_count_kv(hp["kv_heads"])
    w.add_layer_norm_rms_eps(hp["eps"])
    if "theta" in hp:
        w.add_rope_freq_base(hp["theta"])
    w.add_rope_dimension_count(hp["rope_dim"])
    if "chat_template" in hp:
        w.add_chat_template(hp["chat_template"])
    for k, (fn, v) in (extra_kv or {}).items():
        getattr(w, fn)(k, v)
    entries = []
    for name, spec in tensors:
        if isinstance(spec, tuple):
            arr, qt = spec
            if qt in (QT.F32,):
                data = arr.astype(np.float32)
                w.add_tensor(name, data)
                raw, vals, ne = data.tobytes(), data, list(data.shape[::-1])
            elif qt == QT.F16:
                data = arr.astype(np.float16)
                w.add_tensor(name, data)
                raw, vals, ne = data.tobytes(), data, list(data.shape[::-1])
            else:
                q = gguf.quants.quantize(arr.astype(np.float32), qt)
                w.add_tensor(name, q, raw_dtype=qt)
                raw = q.tobytes()
                vals = gguf.quants.dequantize(q, qt)
                ne = list(arr.shape[::-1])
        else:
            raise ValueError(spec)
        entries.append(tensor_entry(name, qt, ne, raw, vals))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    if version != 3:
        with open(path, "r+b") as f:
            f.seek(4)
            f.write(struct.pack("<I", version))
    return entries


def llama_tensors(dim, heads, kv_heads, head_dim, ffn, layers, vocab, mat_qt, tied, bias=False, rope_freqs=None):
    r = lambda *s: rng.standard_normal(s).astype(np.float32) * 0.5
    t = [("token_embd.weight", (r(vocab, dim), mat_qt))]
    if rope_freqs is not None:
        t.append(("rope_freqs.weight", (rope_freqs, QT.F32)))
    for l in range(layers):
        p = f"blk.{l}."
        t += [(p + "attn_norm.weight", (1 + r(dim), QT.F32)),
              (p + "attn_q.weight", (r(heads * head_dim, dim), mat_qt)),
              (p + "attn_k.weight", (r(kv_heads * head_dim, dim), mat_qt)),
              (p + "attn_v.weight", (r(kv_heads * head_dim, dim), mat_qt)),
              (p + "attn_output.weight", (r(dim, heads * head_dim), mat_qt)),
              (p + "ffn_norm.weight", (1 + r(dim), QT.F32)),
              (p + "ffn_gate.weight", (r(ffn, dim), mat_qt)),
              (p + "ffn_up.weight", (r(ffn, dim), mat_qt)),
              (p + "ffn_down.weight", (r(dim, ffn), mat_qt))]
        if bias:
            t += [(p + "attn_q.bias", (r(heads * head_dim), QT.F32)),
                  (p + "attn_k.bias", (r(kv_heads * head_dim), QT.F32)),
                  (p + "attn_v.bias", (r(kv_heads * head_dim), QT.F32))]
    t.append(("output_norm.weight", (1 + r(dim), QT.F32)))
    if not tied:
        t.append(("output.weight", (r(vocab, dim), mat_qt)))
    return t


def make_types_gguf(path):
    """Every metadata value type (nested arrays too) and every tensor type ferry reads; not a model."""
    w = gguf.GGUFWriter(path, "llama")
    w.add_uint8("t.u8", 200)
    w.add_int8("t.i8", -100)
    w.add_uint16("t.u16", 60000)
    w.add_int16("t.i16", -30000)
    w.add_uint32("t.u32", 4000000000)
    w.add_int32("t.i32", -2000000000)
    w.add_float32("t.f32", 1.5)
    w.add_bool("t.bool", True)
    w.add_string("t.str", "héllo")
    w.add_uint64("t.u64", 2**63 + 5)
    w.add_int64("t.i64", -(2**40))
    w.add_float64("t.f64", 2.25)
    w.add_array("t.arr_i32", [1, -2, 3])
    w.add_array("t.arr_f32", [0.5, 1.5, -2.0])
    w.add_array("t.arr_str", ["a", "", "ccc"])
    w.add_array("t.arr_bool", [True, False])
    w.add_array("t.nested", [[1, 2], [3], [4, 5, 6]])
    w.add_array("t.nested_str", [["x", "y"], ["z"]])
    w.add_array("t.nested3", [[[1.0]], [[2.0, 3.0]]])
    ents = []
    def add(name, arr, qt):
        if qt == QT.F32:
            d = arr.astype(np.float32); w.add_tensor(name, d); raw = d.tobytes(); vals = d
        elif qt == QT.F16:
            d = arr.astype(np.float16); w.add_tensor(name, d); raw = d.tobytes(); vals = d
        else:
            d = gguf.quants.quantize(arr.astype(np.float32), qt)
            w.add_tensor(name, d, raw_dtype=qt); raw = d.tobytes(); vals = gguf.quants.dequantize(d, qt)
        ents.append(tensor_entry(name, qt, list(arr.shape[::-1]), raw, vals))
    r = lambda *s: rng.standard_normal(s).astype(np.float32)
    add("f32", r(3, 8), QT.F32)
    add("f16", r(3, 8), QT.F16)
    add("bf16", r(3, 8), QT.BF16)
    add("q8_0", r(2, 32), QT.Q8_0)
    add("q4_0", r(2, 32), QT.Q4_0)
    add("q4_1", r(2, 32), QT.Q4_1)
    # gguf-py has no K-quant quantizer: write valid blocks with small f16 scales and random nibbles.
    for name, qt, rows, bsz in (("q4_k", QT.Q4_K, 1, 144), ("q6_k", QT.Q6_K, 2, 210)):
        raw = rng.integers(0, 256, size=(rows, bsz), dtype=np.uint8)
        if qt == QT.Q4_K:
            raw[:, 0:4] = np.frombuffer(np.array([0.01, 0.002], dtype=np.float16).tobytes(), np.uint8)
        else:
            raw[:, 208:210] = np.frombuffer(np.array([0.01], dtype=np.float16).tobytes(), np.uint8)
        w.add_tensor(name, raw, raw_dtype=qt)
        vals = gguf.quants.dequantize(raw, qt)
        ents.append(tensor_entry(name, qt, [256, rows], raw.tobytes(), vals))
    w.add_tensor("nd4", r(2, 1, 3, 4))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    # nd4's bytes are read back from the file (write order is the add order).
    rd = gguf.GGUFReader(path)
    for t in rd.tensors:
        if t.name == "nd4":
            ents.append(tensor_entry("nd4", QT.F32, [int(x) for x in t.shape], t.data.tobytes(), t.data))
    return ents


# ----------------------------------------------------------------------------------------------- HF

HF_MAP = {"attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
          "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
          "ffn_down": "mlp.down_proj", "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm"}


def hf_name(g):
    if g == "token_embd.weight": return "model.embed_tokens.weight"
    if g == "output_norm.weight": return "model.norm.weight"
    if g == "output.weight": return "lm_head.weight"
    _, l, part, kind = g.split(".")
    return f"model.layers.{l}.{HF_MAP[part]}.{kind}"


def to_np(arr, dt):
    if dt == "F32": return arr.astype(np.float32)
    if dt == "F16": return arr.astype(np.float16)
    # bf16 as uint16 bit patterns (round to nearest even), saved with a patched header below.
    u = arr.astype(np.float32).view(np.uint32).astype(np.uint64)
    u = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    return u


def save_st(path, tensors, meta=None):
    """tensors: dict name -> (np array, dtype str). bf16 goes through safetensors as F16 then is relabelled."""
    arrs = {k: v[0] for k, v in tensors.items()}
    save_file(arrs, path, metadata=meta)
    bf = [k for k, v in tensors.items() if v[1] == "BF16"]
    if bf:
        with open(path, "rb") as f:
            b = f.read()
        n = struct.unpack("<Q", b[:8])[0]
        h = json.loads(b[8:8 + n])
        for k in bf:
            h[k]["dtype"] = "BF16"
        hs = json.dumps(h, separators=(",", ":")).encode()
        hs += b" " * (-len(hs) % 8)  # offsets are relative to the data section, so only the length changes
        with open(path, "wb") as f:
            f.write(struct.pack("<Q", len(hs)) + hs + b[8 + n:])


def make_hf(dirname, cfg, dt, tied, bias, shards, tok_cfg, extra=None):
    d = os.path.join(OUT, dirname)
    os.makedirs(d, exist_ok=True)
    dim, heads, kv, ffn, layers, vocab = (cfg["hidden_size"], cfg["num_attention_heads"],
                                          cfg.get("num_key_value_heads", cfg["num_attention_heads"]),
                                          cfg["intermediate_size"], cfg["num_hidden_layers"], cfg["vocab_size"])
    hd = cfg.get("head_dim", dim // heads)
    gt = llama_tensors(dim, heads, kv, hd, ffn, layers, vocab, QT.F32, tied, bias)
    st = {}
    ents = []
    for g, (arr, _) in gt:
        a = to_np(arr, dt)
        st[hf_name(g)] = (a, dt)
        vals = arr.astype(np.float16) if dt == "F16" else (
            (a.astype(np.uint32) << 16).view(np.float32) if dt == "BF16" else a)
        qt = {"F32": QT.F32, "F16": QT.F16, "BF16": QT.BF16}[dt]
        ents.append(tensor_entry(g, qt, list(arr.shape[::-1]), a.tobytes(), vals))
    for k, v in (extra or {}).items():
        st[k] = (v, "F32")
    names = list(st.keys())
    if shards == 1:
        save_st(os.path.join(d, "model.safetensors"), st, {"format": "pt"})
    else:
        wm = {}
        per = (len(names) + shards - 1) // shards
        for s in range(shards):
            fn = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
            part = {k: st[k] for k in names[s * per:(s + 1) * per]}
            save_st(os.path.join(d, fn), part, {"format": "pt"})
            wm.update({k: fn for k in part})
        with open(os.path.join(d, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {"total_size": 0}, "weight_map": wm}, f, indent=1)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg, f, indent=1)
    with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
        json.dump(tok_cfg, f, indent=1)
    return ents


def stories_facts():
    p = os.path.join(HERE, "..", "..", "..", "shared", "testdata", "models", "stories260K.gguf")
    if not os.path.exists(p):
        print("note: no ../shared stories260K.gguf; its facts are left out", file=sys.stderr)
        return None
    rd = gguf.GGUFReader(p)
    ents = []
    for t in rd.tensors:
        ents.append(tensor_entry(t.name, t.tensor_type, [int(x) for x in t.shape], t.data.tobytes(), t.data))
    return {"n_kv": len(rd.fields) - 3, "n_tensors": len(rd.tensors), "data_offset": int(rd.data_offset),
            "tensors": ents}


def main():
    if os.path.isdir(OUT):
        shutil.rmtree(OUT)
    os.makedirs(OUT)
    exp = {}

    # A GGUF v2 llama: Q8_0 matrices, tied, rope_freqs (llama3-style baked scaling), chat template.
    hp = dict(ctx=256, dim=32, ffn=64, layers=1, heads=4, kv_heads=2, eps=1e-5, theta=500000.0, rope_dim=8,
              chat_template="{% for m in messages %}{{ m.content }}{% endfor %}")
    rf = np.linspace(1.0, 8.0, 4).astype(np.float32)
    t = llama_tensors(32, 4, 2, 8, 64, 1, 40, QT.Q8_0, tied=True, rope_freqs=rf)
    exp["v2_llama.gguf"] = {"version": 2, "hp": hp | {"vocab": 40, "head_dim": 8, "tied": 1, "qkv_bias": 0},
                            "tensors": gguf_model(os.path.join(OUT, "v2_llama.gguf"), "llama", hp, t, version=2)}

    # A GGUF v3 qwen2: f32, q/k/v biases, explicit head_dim (key_length) != dim/heads, not tied.
    hp = dict(ctx=128, dim=8, ffn=12, layers=1, heads=2, kv_heads=1, eps=1e-6, rope_dim=6)
    t = llama_tensors(8, 2, 1, 6, 12, 1, 10, QT.F32, tied=False, bias=True)
    exp["qwen2.gguf"] = {"version": 3, "hp": hp | {"theta": 10000.0, "vocab": 10, "head_dim": 6, "tied": 0,
                                                   "qkv_bias": 1},
                         "tensors": gguf_model(os.path.join(OUT, "qwen2.gguf"), "qwen2", hp, t,
                                               extra_kv={"qwen2.attention.key_length": ("add_uint32", 6)})}

    exp["types.gguf"] = {"version": 3, "tensors": make_types_gguf(os.path.join(OUT, "types.gguf"))}

    # HF Llama-3 style: sharded f16, GQA, llama3 rope scaling, tied (no lm_head), a chat_template list and an
    # ignored rotary_emb.inv_freq buffer.
    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 16,
           "intermediate_size": 24, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
           "rms_norm_eps": 1e-05, "rope_theta": 500000.0, "max_position_embeddings": 512, "vocab_size": 40,
           "tie_word_embeddings": True, "hidden_act": "silu", "torch_dtype": "float16",
           "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                            "original_max_position_embeddings": 64}}
    tok = {"bos_token": "<s>", "chat_template": [
        {"name": "tool_use", "template": "TOOLS"},
        {"name": "default", "template": "{{ bos_token }}{% for m in messages %}[{{ m.role }}]{% endfor %}"}]}
    ents = make_hf("hf_llama", cfg, "F16", True, False, 3, tok,
                   extra={"model.layers.0.self_attn.rotary_emb.inv_freq": np.arange(2, dtype=np.float32)})
    exp["hf_llama"] = {"hp": {"arch": "llama", "dim": 16, "ffn": 24, "layers": 2, "heads": 4, "kv_heads": 2,
                              "head_dim": 4, "rope_dim": 4, "eps": 1e-5, "theta": 500000.0, "ctx": 512, "vocab": 40,
                              "tied": 1, "qkv_bias": 0, "scaling": [2, 8.0, 1.0, 4.0, 64]},
                       "chat_template": tok["chat_template"][1]["template"], "tensors": ents}

    # HF Qwen2: one bf16 file, biases, lm_head present, a string chat_template.
    cfg = {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 12,
           "intermediate_size": 20, "num_hidden_layers": 1, "num_attention_heads": 3, "num_key_value_heads": 1,
           "rms_norm_eps": 1e-06, "rope_theta": 1000000.0, "max_position_embeddings": 1024, "vocab_size": 30,
           "tie_word_embeddings": False, "hidden_act": "silu", "use_sliding_window": False,
           "rope_scaling": None}
    tok = {"chat_template": "{% for m in messages %}<|im_start|>{{ m.content }}{% endfor %}"}
    ents = make_hf("hf_qwen2", cfg, "BF16", False, True, 1, tok)
    exp["hf_qwen2"] = {"hp": {"arch": "qwen2", "dim": 12, "ffn": 20, "layers": 1, "heads": 3, "kv_heads": 1,
                              "head_dim": 4, "rope_dim": 4, "eps": 1e-6, "theta": 1000000.0, "ctx": 1024, "vocab": 30,
                              "tied": 0, "qkv_bias": 1, "scaling": [0, 0, 0, 0, 0]},
                       "chat_template": tok["chat_template"], "tensors": ents}

    s = stories_facts()
    if s:
        exp["stories260K.gguf"] = s
    with open(os.path.join(OUT, "expected.json"), "w") as f:
        json.dump(exp, f, indent=0)
    total = sum(os.path.getsize(os.path.join(dp, fn)) for dp, _, fns in os.walk(OUT) for fn in fns)
    print(f"wrote {OUT}: {total} bytes")


if __name__ == "__main__":
    main()
