"""`ferry run --prompt` chats when the model has a chat template (the prompt becomes the user's message, as
llama.cpp's CLI does); --raw keeps the plain completion. Reference: the same conversation rendered through
`ferry run --message user:...` (the explicit chat path) and the plain prompt through --prompt-tokens."""
import json
import os
import subprocess

import pytest
from conftest import FERRY, MODEL

SMOLLM2 = os.environ.get("FERRY_SMOLLM2_GGUF", "")


def run(*args):
    r = subprocess.run([FERRY, "run", "--threads", "2", "--temperature", "0", "--json", *args], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_prompt_chats_with_a_template():
    if not os.path.exists(SMOLLM2):
        pytest.skip("missing FILE: SmolLM2-135M-Instruct GGUF (FERRY_SMOLLM2_GGUF)")
    q = "What is the capital of France?"
    chat = run("--model", SMOLLM2, "--prompt", q, "--max-tokens", "12")
    explicit = run("--model", SMOLLM2, "--message", "user:" + q, "--max-tokens", "12")
    assert chat["prompt_tokens"] == explicit["prompt_tokens"] and chat["tokens"] == explicit["tokens"]
    assert "Paris" in chat["text"], chat  # the question answered, not an empty line
    raw = run("--model", SMOLLM2, "--prompt", q, "--raw", "--max-tokens", "4")
    assert len(raw["prompt_tokens"]) < len(chat["prompt_tokens"])
    ids = ",".join(str(t) for t in raw["prompt_tokens"])
    assert run("--model", SMOLLM2, "--prompt-tokens", ids, "--max-tokens", "4")["tokens"] == raw["tokens"]
    sysmsg = run("--model", SMOLLM2, "--prompt", q, "--system", "Answer in one word.", "--max-tokens", "4")
    assert sysmsg["prompt_tokens"] != chat["prompt_tokens"]  # the template's default system message replaced


def test_prompt_without_template_completes():
    """stories260K has no chat template: --prompt is a plain completion, as before."""
    if not os.path.exists(MODEL):
        pytest.skip("missing FILE: " + MODEL)
    a = run("--model", MODEL, "--prompt", "Once upon a time", "--max-tokens", "8")
    b = run("--model", MODEL, "--prompt", "Once upon a time", "--max-tokens", "8", "--raw")
    assert a == {**b, "seed": a["seed"]} and a["text"]
