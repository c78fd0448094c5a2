"""test_multiturn — tests/server/multiturn_ttft.py against `ferry serve` with a model of gated DeltaNet layers
(the tiny Qwen3.5 of tests/golden), ChatML template: a conversation sent whole at every turn over streaming
/v1/chat/completions continues each turn from the state the slot saved at the end of the turn before (a
checkpoint at the prompt's end, or 4 positions before it), and gives the same replies, token counts and
conversation as a server without the prompt cache. Also what the script records: one JSON line a turn, with
TTFT within the request's time."""
import json
import os
import subprocess
import sys

from conftest import Server

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.environ.get("FERRY_SRC", os.path.join(HERE, "..", ".."))
MODEL = os.path.join(SRC, "tests", "golden", "models", "qwen35_deltanet_f16.gguf")
SCRIPT = os.path.join(HERE, "multiturn_ttft.py")


def conversation(server, tmp_path, name, variant, *args):
    out = tmp_path / f"{name}-{variant}.jsonl"
    cmd = [sys.executable, SCRIPT, "--url", server.url, "--variant", variant, "--turns", "4", "--max-tokens", "6",
           "--label", name, "--jsonl", str(out)] + list(args)
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert [r["turn"] for r in rows] == [1, 2, 3, 4]
    for r in rows:
        assert 0 < r["ttft_s"] <= r["request_s"]
        assert r["completion_tokens"] == 6 and r["label"] == name and r["variant"] == variant
        assert f"| {r['turn']} | {r['prompt_tokens']} | {r['cached_tokens']} |" in p.stdout
    return rows


def check(tmp_path, variant, *args):
    cached = Server("--parallel", "1", "--chat-template", "chatml", model=MODEL)
    plain = Server("--parallel", "1", "--chat-template", "chatml", "--prompt-cache=false", model=MODEL)
    try:
        a = conversation(cached, tmp_path, "cached", variant, *args)
        b = conversation(plain, tmp_path, "plain", variant, *args)
    finally:
        assert cached.stop() == 0 and plain.stop() == 0
    # the same conversation, turn by turn
    assert [(r["prompt_tokens"], r["reply"]) for r in a] == [(r["prompt_tokens"], r["reply"]) for r in b]
    assert all(r["cached_tokens"] == 0 for r in b)
    assert a[0]["cached_tokens"] == 0
    for prev, r in zip(a, a[1:]):
        # each turn's prompt starts with the one before (ChatML renders the reply after the generation prompt)
        assert r["prompt_tokens"] > prev["prompt_tokens"] + 6
        assert prev["prompt_tokens"] - 4 <= r["cached_tokens"] < r["prompt_tokens"], (prev, r)
    return a


def test_chat_turns_continue_from_the_last_turns_state(tmp_path):
    check(tmp_path, "chat", "--turn-tokens", "40")


def test_agent_turns_after_a_long_first_prompt(tmp_path):
    a = check(tmp_path, "agent", "--system-tokens", "500", "--tools", "1", "--turn-tokens", "40",
              "--short-tokens", "8")
    assert a[0]["prompt_tokens"] >= 540
    # each later turn computes its reply (as the client sent it back), its 8-token message and the template's
    # tokens, not the long start again
    assert all(r["prompt_tokens"] - r["cached_tokens"] < 100 for r in a[1:])
