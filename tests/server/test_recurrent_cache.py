"""test_recurrent_cache — `ferry serve` with a model of gated DeltaNet layers (the tiny Qwen3.5 of
tests/golden): greedy replies equal transformers' tokens, and the prompt cache reuses a slot only where its
recurrent state stands, or where the slot saved it. A finished request's slot holds its prompt and all but the
last generated token, and checkpoints of its state where its prefill steps ended (this one's and earlier
turns'). A prompt that extends all the slot holds continues from it (cached_tokens = all of it); one that
shares a checkpoint's positions continues from the latest such checkpoint; any other (the same prompt again
included, whose last token the step must compute) starts again from position 0 (cached_tokens 0). With
--ctx-checkpoints 1 only the latest is kept. The replies equal those of a server without the prompt cache."""
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


def test_prompt_cache_continues_only_a_whole_slot():
    with open(GOLDEN) as f:
        case = json.load(f)["cases"][1]  # a 7-token prompt and transformers' 24 greedy tokens after it
    prompt, greedy = case["prompt_tokens"], case["greedy_tokens"]
    cached = Server("--parallel", "1", model=MODEL)
    plain = Server("--parallel", "1", "--prompt-cache=false", model=MODEL)
    try:
        def both(p, n):
            a, b = complete(cached, p, n), complete(plain, p, n)
            assert a["choices"][0]["text"] == b["choices"][0]["text"], p
            assert a["choices"][0]["logprobs"]["tokens"] == b["choices"][0]["logprobs"]["tokens"], p
            assert b["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
            return a, a["usage"]["prompt_tokens_details"]["cached_tokens"]

        first, c0 = both(prompt, 8)
        assert c0 == 0
        # The same prompt again: its last token must be computed, which a recurrent state cannot rewind to.
        _, c1 = both(prompt, 8)
        assert c1 == 0
        # The conversation goes on: the slot holds the prompt and 7 of the 8 greedy tokens.
        follow = prompt + greedy[:8] + [9, 11]
        _, c2 = both(follow, 6)
        assert c2 == len(prompt) + 7
        _, c3 = both(prompt + greedy[:12], 12)
        assert c3 == len(prompt)  # `follow` diverged after the checkpoint at 17: back to the first turn's
        # It generated transformers' next 12 greedy tokens, so this prompt extends all the slot holds.
        _, c4 = both(prompt + greedy[:24], 4)  # its one new prompt token saves no checkpoint
        assert c4 == len(prompt) + 12 + 11
        # Another turn after the same 19 tokens: back to the checkpoint saved after they were prefilled.
        _, c5 = both(prompt + greedy[:12] + [9, 9, 9], 6)
        assert c5 == len(prompt) + 12
        m = cached.metrics()
        assert m["ferry_prompt_tokens_cached_total"] == c2 + c3 + c4 + c5
    finally:
        assert cached.stop() == 0 and plain.stop() == 0
