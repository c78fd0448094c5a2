"""test_recurrent_cache — `ferry serve` with a model of gated DeltaNet layers (the tiny Qwen3.5 of
tests/golden): greedy replies equal transformers' tokens, and the prompt cache reuses a slot only where its
recurrent state stands, or where the slot saved it. A finished request's slot holds its prompt and all but the
last generated token, and checkpoints of its state where its prefill steps ended (this one's and earlier
turns'; a prompt's prefill also stops 4 positions before its end for one). A prompt that extends all the slot
holds continues from it (cached_tokens = all of it); one that shares a checkpoint's positions continues from
the latest such checkpoint; any other starts again from position 0 (cached_tokens 0). With --ctx-checkpoints 1
only the latest is kept. The replies equal those of a server without the prompt cache."""
import json
import os

from conftest import Server, post

SRC = os.environ.get("FERRY_SRC", os.path.join(os.path.dirname(__file__), "..", ".."))
MODEL = os.path.join(SRC, "tests", "golden", "models", "qwen35_deltanet_f16.gguf")
GOLDEN = os.path.join(SRC, "tests", "golden", "qwen35_deltanet_f16.json")


def complete(server, prompt, max_tokens):
    status, _, out = post(server.url + "/v1/completions",
                          {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "logprobs": 0})
    assert status == 200, out
    return out


def run_turns(args, want):
    """Six requests on one slot, each reply held to a server without the prompt cache; want: the
    cached_tokens of each."""
    with open(GOLDEN) as f:
        case = json.load(f)["cases"][1]  # a 7-token prompt and transformers' 24 greedy tokens after it
    prompt, greedy = case["prompt_tokens"], case["greedy_tokens"]
    assert greedy[8] != 9 and greedy[12] != 9  # where the turns below diverge
    cached = Server("--parallel", "1", *args, model=MODEL)
    plain = Server("--parallel", "1", "--prompt-cache=false", model=MODEL)
    try:
        def both(p, n):
            a, b = complete(cached, p, n), complete(plain, p, n)
            assert a["choices"][0]["text"] == b["choices"][0]["text"], p
            assert a["choices"][0]["logprobs"]["tokens"] == b["choices"][0]["logprobs"]["tokens"], p
            assert b["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
            return a["usage"]["prompt_tokens_details"]["cached_tokens"]

        got = [both(prompt, 8),
               # The same prompt again: its last token must be computed, which a recurrent state cannot
               # rewind to; the checkpoint 4 before its end can be gone back to.
               both(prompt, 8),
               # The conversation goes on: the slot holds the prompt and 7 of the 8 greedy tokens.
               both(prompt + greedy[:8] + [9, 11], 6),
               # Diverges at 15, past the first turn's checkpoint at 7 and before the last one's at 17.
               both(prompt + greedy[:12], 12),
               # It generated transformers' next 12 greedy tokens, so this prompt extends all the slot holds
               # (its one new prompt token saves no checkpoint).
               both(prompt + greedy[:24], 4),
               # Another turn after the same 19 tokens: back to the checkpoint where they were prefilled.
               both(prompt + greedy[:12] + [9, 9, 9], 6)]
        assert got == want
        assert cached.metrics()["ferry_prompt_tokens_cached_total"] == sum(want)
    finally:
        assert cached.stop() == 0 and plain.stop() == 0


def test_prompt_cache_goes_back_to_the_latest_checkpoint_within_the_shared_start():
    n = 7
    run_turns([], [0, n - 4, n + 7, n, n + 12 + 11, n + 12])


def test_one_checkpoint_a_slot_keeps_only_the_latest():
    n = 7
    run_turns(["--ctx-checkpoints", "1"], [0, 0, n + 7, 0, n + 12 + 11, n + 12])
