"""llama-server's native endpoints on `ferry serve` (stories260K): POST /completion (text, token ids, mixed and
several prompts, n_predict, stream, n_probs, stop, return_tokens, response_fields, logit_bias, json_schema), GET
/props, GET /slots, POST /infill (a copy of stories260K whose vocabulary gets fill-in-the-middle tokens), and
the fields ferry refuses by name.

References: llama.cpp's own greedy tokens and logits for stories260K (FERRY_TESTDATA/goldens, made by llama.cpp
b4748), llama-server's response shapes (tools/server/server-task.cpp of lcp0336), and llama-server's
format_prompt_infill layout rebuilt here from /tokenize.
"""
import json
import math
import os
import struct
import urllib.request

import pytest
from conftest import GOLDENS, MODEL, Server, assert_error, get, gguf_copy_fields, post

FINAL_KEYS = {"index", "content", "tokens", "id_slot", "stop", "model", "tokens_predicted", "tokens_evaluated",
              "generation_settings", "prompt", "has_new_line", "truncated", "stop_type", "stopping_word",
              "tokens_cached", "timings"}


def goldens():
    path = os.path.join(GOLDENS, "stories260K_greedy.json")
    if not os.path.exists(path):
        pytest.skip("missing FILE: " + path)
    return json.load(open(path))


def stream(url, body):
    """The `data:` chunks of a /completion stream (which ends without [DONE], as llama-server's does)."""
    req = urllib.request.Request(url + "/completion", data=json.dumps(dict(body, stream=True)).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        raw = r.read().decode()
    chunks = [c for c in raw.split("\n\n") if c and not c.startswith(":")]
    assert all(c.startswith("data: ") for c in chunks) and "[DONE]" not in raw
    return [json.loads(c[6:]) for c in chunks]


def test_completion_matches_llama_cpp(server):
    """Greedy /completion gives llama.cpp's tokens and text, from the prompt as text or as ids."""
    for case in goldens()[:3]:
        st, _, out = post(server.url + "/completion", {"prompt": case["prompt"], "n_predict": case["n_predict"],
                                                      "temperature": 0, "return_tokens": True})
        assert st == 200, out
        assert set(out) == FINAL_KEYS, set(out) ^ FINAL_KEYS
        assert out["tokens"] == case["generated_tokens"] and out["content"] == case["generated_text"]
        assert out["tokens_evaluated"] == len(case["prompt_tokens"]) == out["timings"]["prompt_n"] + \
            out["timings"]["cache_n"]
        assert out["tokens_predicted"] == out["timings"]["predicted_n"] == case["n_predict"]
        assert out["stop"] is True and out["stop_type"] == "limit" and out["truncated"] is False
        assert out["has_new_line"] == ("\n" in out["content"])
        assert out["generation_settings"]["n_predict"] == case["n_predict"]
        st, _, ids = post(server.url + "/completion", {"prompt": case["prompt_tokens"], "temperature": 0,
                                                      "n_predict": case["n_predict"]})
        assert ids["content"] == case["generated_text"] and ids["tokens"] == []


def test_n_probs_match_llama_cpp_logits(server):
    path = os.path.join(GOLDENS, "stories260K_logits_once.f32")
    meta = os.path.join(GOLDENS, "stories260K_logits_once.json")
    if not os.path.exists(path):
        pytest.skip("missing FILE: " + path)
    logits = struct.unpack("<512f", open(path, "rb").read())
    m = max(logits)
    lse = m + math.log(sum(math.exp(x - m) for x in logits))
    ref = sorted(((x - lse, i) for i, x in enumerate(logits)), reverse=True)
    prompt = json.load(open(meta))["prompt_tokens"]
    st, _, out = post(server.url + "/completion", {"prompt": prompt, "n_predict": 3, "n_probs": 5, "temperature": 0})
    probs = out["completion_probabilities"]
    assert len(probs) == 3
    first = probs[0]
    assert first["id"] == ref[0][1] and abs(first["logprob"] - ref[0][0]) < 5e-3
    assert [p["id"] for p in first["top_logprobs"]] == [i for _, i in ref[:5]]
    for p, (want, _) in zip(first["top_logprobs"], ref[:5]):
        assert abs(p["logprob"] - want) < 5e-3 and bytes(p["bytes"]).decode() == p["token"]
    assert "".join(p["token"] for p in probs) == out["content"]


def test_stream_equals_whole(server):
    body = {"prompt": "Once upon a time", "n_predict": 24, "temperature": 0, "n_probs": 2}
    st, _, whole = post(server.url + "/completion", dict(body, return_tokens=True))
    chunks = stream(server.url, body)
    assert all(c["stop"] is False for c in chunks[:-1]) and chunks[-1]["stop"] is True
    assert "".join(c["content"] for c in chunks) == whole["content"]
    assert [t for c in chunks[:-1] for t in c["tokens"]] == whole["tokens"]
    assert all(len(c["tokens"]) >= 1 and len(c["completion_probabilities"]) == len(c["tokens"])
               for c in chunks[:-1])
    last = chunks[-1]
    assert set(last) == FINAL_KEYS and last["stop_type"] == "limit" and last["tokens_predicted"] == 24
    assert last["generation_settings"]["stream"] is True


def test_several_prompts_and_mixed_sequences(server):
    st, _, tok = post(server.url + "/tokenize", {"content": "Once upon a time", "add_special": True})
    ids = tok["tokens"]
    st, _, out = post(server.url + "/completion", {"prompt": [ids, "Once upon a time"], "n_predict": 8,
                                                  "temperature": 0})
    assert st == 200 and isinstance(out, list) and len(out) == 2
    assert out[0]["content"] == out[1]["content"] and [o["index"] for o in out] == [0, 1]
    st, _, one = post(server.url + "/completion", {"prompt": {"prompt_string": "Once upon a time"}, "n_predict": 8,
                                                  "temperature": 0})
    assert one["content"] == out[0]["content"]
    st, _, mixed = post(server.url + "/completion", {"prompt": ids[:2] + [" a time"], "n_predict": 4,
                                                    "temperature": 0})
    assert st == 200 and mixed["tokens_evaluated"] > 2


def test_stop_word_eos_and_response_fields(server):
    st, _, base = post(server.url + "/completion", {"prompt": "Once upon a time", "n_predict": 24, "temperature": 0})
    word = base["content"].split()[3]
    st, _, out = post(server.url + "/completion", {"prompt": "Once upon a time", "n_predict": 24, "temperature": 0,
                                                  "stop": [word]})
    assert out["stop_type"] == "word" and out["stopping_word"] == word and word not in out["content"]
    st, _, eos = post(server.url + "/completion", {"prompt": "Once upon a time", "n_predict": 24, "temperature": 0,
                                                  "logit_bias": [[2, 100]]})
    assert eos["stop_type"] == "eos" and eos["tokens_predicted"] <= 1
    st, _, ban = post(server.url + "/completion", {"prompt": "Once upon a time", "n_predict": 24, "temperature": 0,
                                                  "logit_bias": {str(base_first_token(server)): False}})
    assert ban["content"] != base["content"]
    st, _, picked = post(server.url + "/completion", {"prompt": "Once upon a time", "n_predict": 4,
                                                     "response_fields": ["content", "generation_settings/n_predict"]})
    assert set(picked) == {"content", "generation_settings/n_predict"}
    assert picked["generation_settings/n_predict"] == 4


def base_first_token(server):
    st, _, out = post(server.url + "/completion", {"prompt": "Once upon a time", "n_predict": 1, "temperature": 0,
                                                  "return_tokens": True})
    return out["tokens"][0]


def test_json_schema_and_defaults(server):
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"],
              "additionalProperties": False}
    st, _, out = post(server.url + "/completion", {"prompt": "x", "n_predict": 64, "json_schema": schema,
                                                  "seed": 3})
    assert st == 200 and set(json.loads(out["content"])) == {"n"}
    gs = out["generation_settings"]
    assert (gs["temperature"], gs["top_k"]) == (pytest.approx(0.8), 40)  # llama-server's defaults
    assert gs["top_p"] == pytest.approx(0.95) and gs["min_p"] == pytest.approx(0.05) and gs["seed"] == 3


def test_grammar(server):
    """GBNF constrains /completion, /v1/completions and chat alike (the language checked with a regex here)."""
    import re
    g = 'root ::= ("yes" | "no") ", " [a-z]{2,5} ("!" | ".")\n'
    for path, extra in [("/completion", {"prompt": "Once", "n_predict": 20}),
                        ("/v1/completions", {"prompt": "Once", "max_tokens": 20}),
                        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 20})]:
        for seed in (1, 2, 3):
            st, _, out = post(server.url + path, dict(extra, grammar=g, seed=seed, temperature=1.0))
            assert st == 200, out
            text = out["content"] if "content" in out else (
                out["choices"][0]["text"] if "text" in out["choices"][0] else out["choices"][0]["message"]["content"])
            assert re.fullmatch(r"(yes|no), [a-z]{2,5}[!.]", text), text
    st, _, out = post(server.url + "/completion", {"prompt": "x", "grammar": 'root ::= "a"\nb ::= [c\n'})
    assert_error(st, out, 400, "grammar")
    assert "line 2" in out["error"]["message"]


@pytest.mark.parametrize("field,value", [("mirostat", 2), ("typical_p", 0.5), ("dry_multiplier", 0.8),
                                         ("xtc_probability", 0.5), ("samplers", ["top_k"]), ("id_slot", 1),
                                         ("post_sampling_probs", True), ("n_probs", 500), ("n_predict", "8"),
                                         ("grammar", "root ::= undefined-rule"), ("grammar", 5)])
def test_unsupported_fields_refused_by_name(server, field, value):
    st, _, out = post(server.url + "/completion", {"prompt": "x", "n_predict": 2, field: value})
    assert_error(st, out, 400, field)


def test_defaults_accepted(server):
    """The fields a web UI sends at llama-server's defaults are accepted."""
    body = {"prompt": "x", "n_predict": 2, "mirostat": 0, "typical_p": 1, "dry_multiplier": 0,
            "xtc_probability": 0, "top_n_sigma": -1, "dynatemp_range": 0, "n_keep": 0, "id_slot": -1,
            "repeat_last_n": 64, "cache_prompt": True, "post_sampling_probs": False, "samplers": []}
    st, _, out = post(server.url + "/completion", body)
    assert st == 200, out


def test_props_and_slots(server):
    st, _, p = get(server.url + "/props")
    assert st == 200 and p["total_slots"] == 4 and p["default_generation_settings"]["n_ctx"] == 2048
    assert p["model_path"] == MODEL and p["modalities"] == {"vision": False, "video": False, "audio": False}
    assert p["chat_template"].startswith("{%") and p["bos_token"] == "<s>"
    st, _, s = get(server.url + "/slots")
    assert st == 200 and [x["id"] for x in s] == [0, 1, 2, 3]
    assert all(x["n_ctx"] == 2048 and isinstance(x["is_processing"], bool) for x in s)


# ---- /infill ---------------------------------------------------------------------------------------------------


def fim_model(tmp_path):
    """stories260K with three unused byte tokens renamed to <fim_prefix>, <fim_suffix>, <fim_middle> (control)."""
    gguf = pytest.importorskip("gguf")
    r = gguf.GGUFReader(MODEL)
    w = gguf.GGUFWriter(str(tmp_path / "fim.gguf"), arch=bytes(r.fields["general.architecture"].parts[-1]).decode())
    names = {0x10 + 3: "<fim_prefix>", 0x11 + 3: "<fim_suffix>", 0x12 + 3: "<fim_middle>"}
    gguf_copy_fields(r, w, {"tokenizer.ggml.tokens": lambda v: [names.get(i, x) for i, x in enumerate(v)],
                            "tokenizer.ggml.token_type": lambda v: [3 if i in names else x for i, x in enumerate(v)]})
    for t in r.tensors:
        w.add_tensor(t.name, t.data, raw_shape=list(reversed(t.shape.tolist())), raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return str(tmp_path / "fim.gguf")


def test_infill_layout(tmp_path):
    s = Server(model=fim_model(tmp_path))
    try:
        def toks(text, special=False):
            return post(s.url + "/tokenize", {"content": text, "parse_special": special})[2]["tokens"]
        pre, suf, mid = toks("<fim_prefix><fim_suffix><fim_middle>", True)
        body = {"input_prefix": "Once upon", "input_suffix": " the end.", "prompt": " a", "n_predict": 6,
                "temperature": 0, "input_extra": [{"filename": "a.txt", "text": "Lily"}]}
        st, _, out = post(s.url + "/infill", dict(body, return_tokens=True))
        assert st == 200, out
        # llama-server's layout without repo/file-separator tokens: snippet marker + extra text, BOS, FIM_PRE
        # prefix prompt, FIM_SUF suffix, FIM_MID
        want = toks("\n\n--- snippet ---\n\n") + toks("Lily") + [1, pre] + toks("Once upon") + toks(" a") + \
            [suf] + toks(" the end.") + [mid]
        assert out["tokens_evaluated"] == len(want)
        st, _, ref = post(s.url + "/completion", {"prompt": want, "n_predict": 6, "temperature": 0,
                                                 "return_tokens": True})
        assert out["tokens"] == ref["tokens"] and out["content"] == ref["content"]
        st, _, bad = post(s.url + "/infill", {"input_prefix": 3})
        assert_error(st, bad, 400, "input_prefix")
    finally:
        assert s.stop() == 0


def test_infill_refused_without_fim_tokens(server):
    st, _, out = post(server.url + "/infill", {"input_prefix": "a", "input_suffix": "b"})
    assert_error(st, out, 400)
    assert "fill-in-the-middle" in out["error"]["message"]


def test_chat_input_tokens(server):
    msgs = [{"role": "system", "content": "Book"}, {"role": "user", "content": "What is the best book"}]
    st, _, n = post(server.url + "/chat/completions/input_tokens", {"messages": msgs})
    st2, _, full = post(server.url + "/v1/chat/completions", {"messages": msgs, "max_tokens": 1})
    assert st == st2 == 200 and n == {"input_tokens": full["usage"]["prompt_tokens"]}
