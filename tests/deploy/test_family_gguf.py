"""The benchmark files of tests/gpu/make_family_gguf.py (the families table's Qwen3-8B, Gemma-3-12B and
Qwen3.5-27B shapes, here scaled down by 16): read back by llama.cpp's own GGUF reader (gguf-py), every key and
tensor name one that gguf-py knows for the architecture, the tensors shaped as llama.cpp's loaders create them
(src/models/qwen3.cpp, gemma3.cpp, qwen35.cpp of the peer), the Q4_K_M mix's Q6_K where llama-quantize puts it,
and the file accepted by `ferry inspect` with the shape it was written with."""
import re
import subprocess
import sys

import pytest
from conftest import SRC, ferry_binary

gguf = pytest.importorskip("gguf", reason="missing PyPI package gguf (llama.cpp's gguf-py)")
sys.path.insert(0, str(SRC / "tests" / "gpu"))
import make_family_gguf as mf  # noqa: E402

SCALE = 16
ARCH = {"qwen3": gguf.MODEL_ARCH.QWEN3, "gemma3": gguf.MODEL_ARCH.GEMMA3, "qwen35": gguf.MODEL_ARCH.QWEN35}
# lcp0336's LLM_KV_ATTENTION_RECURRENT_LAYERS, newer than the gguf-py release CI installs
NEWER_KEYS = {"{arch}.attention.recurrent_layers"}


def known_keys():
    keys = set(NEWER_KEYS)
    for cls in vars(gguf.Keys).values():
        if isinstance(cls, type):
            keys |= {v for k, v in vars(cls).items() if isinstance(v, str) and not k.startswith("_")}
    return keys


def more_bits(i, n):  # llama-quantize's use_more_bits
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


@pytest.fixture(scope="module", params=sorted(mf.SHAPES))
def written(request, tmp_path_factory):
    path = tmp_path_factory.mktemp("fam") / f"{request.param}.gguf"
    r = subprocess.run([sys.executable, str(SRC / "tests" / "gpu" / "make_family_gguf.py"), str(path), request.param,
                        "--scale", str(SCALE)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return request.param, path, mf.shape_of(request.param, SCALE)


def test_keys_and_tensor_names_are_llama_cpps(written):
    name, path, s = written
    rd = gguf.GGUFReader(str(path))
    a = s["arch"]
    assert bytes(rd.fields["general.architecture"].parts[-1]).decode() == a
    known = known_keys()
    for key in rd.fields:
        if key.startswith(("GGUF.", "tokenizer.", "general.")):
            continue
        assert key.replace(a + ".", "{arch}.", 1) in known, key
    allowed = {gguf.TENSOR_NAMES[t] for t in gguf.MODEL_TENSORS[ARCH[a]]}
    for t in rd.tensors:
        base = re.sub(r"\.(weight|bias)$", "", t.name)
        base = re.sub(r"^blk\.\d+\.", "blk.{bid}.", base)
        assert base in allowed, t.name


def test_shapes_are_what_the_loaders_create(written):
    name, path, s = written
    t = {x.name: (list(x.shape), x.tensor_type.name) for x in gguf.GGUFReader(str(path)).tensors}
    d, hd, L = s["dim"], s["hd"], s["layers"]
    assert t["token_embd.weight"][0] == [d, s["vocab"]]
    assert ("output.weight" in t) == (not s["tied"])
    for i in range(L):
        p = f"blk.{i}."
        assert t[p + "ffn_down.weight"][0] == [s["ffn"], d]
        if s["arch"] == "qwen35" and (i + 1) % 4:  # gated DeltaNet (llama_model_qwen35::load_arch_tensors)
            kd, vd = s["ssm_groups"] * s["ssm_state"], s["ssm_v_heads"] * s["ssm_state"]
            assert t[p + "attn_qkv.weight"][0] == [d, 2 * kd + vd]
            assert t[p + "attn_gate.weight"][0] == [d, vd]
            assert t[p + "ssm_conv1d.weight"] == ([4, 2 * kd + vd], "F32")
            assert t[p + "ssm_a"] == ([s["ssm_v_heads"]], "F32") and p + "attn_q.weight" not in t
            assert t[p + "ssm_out.weight"][0] == [vd, d]
        else:
            gate = 2 if s["arch"] == "qwen35" else 1
            assert t[p + "attn_q.weight"][0] == [d, s["heads"] * hd * gate]
            assert t[p + "attn_k.weight"][0] == [d, s["kvh"] * hd]
            assert t[p + "attn_output.weight"][0] == [s["heads"] * hd, d]
            assert t[p + "attn_q_norm.weight"][0] == [hd]
        if s["arch"] == "gemma3":
            assert p + "post_attention_norm.weight" in t and p + "post_ffw_norm.weight" in t


def test_the_q4_k_m_mix_is_llama_quantizes(written):
    name, path, s = written
    t = {x.name: x.tensor_type.name for x in gguf.GGUFReader(str(path)).tensors}
    L = s["layers"]
    assert t["output.weight" if not s["tied"] else "token_embd.weight"] == "Q6_K"
    if not s["tied"]:
        assert t["token_embd.weight"] == "Q4_K"
    for i in range(L):
        p = f"blk.{i}."
        v = p + ("attn_v.weight" if p + "attn_v.weight" in t else "attn_qkv.weight")  # both count as attn_v
        assert t[v] == ("Q6_K" if more_bits(i, L) else "Q4_K"), v
        assert t[p + "ffn_down.weight"] == ("Q6_K" if more_bits(i, L) else "Q4_K")
        assert t[p + "ffn_up.weight"] == t[p + "ffn_gate.weight"] == "Q4_K"


def test_ferry_reads_the_shape(written):
    name, path, s = written
    ferry = ferry_binary()
    if ferry is None:
        pytest.skip("missing ferry binary (FERRY_BIN or build/server/ferry)")
    r = subprocess.run([str(ferry), "inspect", "--model", str(path)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert f"arch {s['arch']})" in r.stdout
    assert f"{s['layers']} layers, dim {s['dim']}, ffn {s['ffn']}, heads {s['heads']} (kv {s['kvh']}, " \
           f"head_dim {s['hd']}), vocab {s['vocab']}" in r.stdout
    if s["arch"] == "qwen35":
        n_rec = sum(mf.recurrent(s, i) for i in range(s["layers"]))
        assert f"{n_rec} of {s['layers']} layers gated DeltaNet" in r.stdout
    if s["arch"] == "gemma3":
        assert "window of 1024 positions on 5 of every 6 layers" in r.stdout
