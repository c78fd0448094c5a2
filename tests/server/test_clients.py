"""What clients written for other servers send, over real HTTP against `ferry serve` on stories260K: text parts
joined as llama.cpp and vLLM join them, the /responses alias, /tokenize with_pieces, the OpenAI error code for a
context overflow, one call for a named tool_choice, embedding steps in the batch metrics, and the output
constraints llama-server and vLLM accept (json_schema, response_format.schema, ignore_eos,
continue_final_message), each honoured or refused by name, never ignored.

References: the OpenAI error shape and codes, llama-server's /tokenize and /apply-template answers, HF's
apply_chat_template(continue_final_message=True), and jsonschema-free checks of the constrained output.
"""
import json

import pytest
from conftest import MODEL_NAME, Server, assert_error, get, post

openai = pytest.importorskip("openai")


def chat(url, **body):
    body.setdefault("model", MODEL_NAME)
    return post(url + "/v1/chat/completions", body)


# ---- messages and the template ----------------------------------------------------------------------------


def test_text_parts_joined_with_newline(server):
    parts = [{"type": "text", "text": "What is"}, {"type": "text", "text": "the best book"}]
    st, _, body = post(server.url + "/apply-template", {"messages": [{"role": "user", "content": parts}]})
    assert st == 200, body
    assert "What is\nthe best book" in body["prompt"] and "What isthe best book" not in body["prompt"]
    # the chat's prompt is that same text: as many tokens as the joined string
    joined = [{"role": "user", "content": "What is\nthe best book"}]
    a = chat(server.url, messages=[{"role": "user", "content": parts}], max_tokens=1)[2]
    b = chat(server.url, messages=joined, max_tokens=1)[2]
    assert a["usage"]["prompt_tokens"] == b["usage"]["prompt_tokens"]


def test_apply_template_matches_chatml(server):
    """stories260K has no template of its own: the built-in chatml, as HF renders it."""
    msgs = [{"role": "system", "content": "S"}, {"role": "user", "content": "Hi"}]
    st, _, body = post(server.url + "/apply-template", {"messages": msgs})
    assert st == 200 and body == {
        "prompt": "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"}
    st, _, body = post(server.url + "/apply-template", {"messages": msgs, "add_generation_prompt": False})
    assert st == 200 and body["prompt"].endswith("Hi<|im_end|>\n")


def test_continue_final_message(server):
    msgs = [{"role": "user", "content": "Tell me"}, {"role": "assistant", "content": "The answer is"}]
    st, _, body = post(server.url + "/apply-template", {"messages": msgs, "continue_final_message": True})
    assert st == 200 and body["prompt"].endswith("<|im_start|>assistant\nThe answer is"), body
    st, _, body = post(server.url + "/apply-template",
                       {"messages": msgs, "continue_final_message": True, "add_generation_prompt": True})
    assert_error(st, body, 400, "continue_final_message")
    st, _, body = chat(server.url, messages=msgs[:1], continue_final_message=True, max_tokens=2)
    assert_error(st, body, 400, "continue_final_message")
    # the continued message is the prompt: its tokens are counted, and no end-of-turn follows it
    st, _, cont = chat(server.url, messages=msgs, continue_final_message=True, max_tokens=1)
    st2, _, whole = chat(server.url, messages=msgs, max_tokens=1)
    assert st == st2 == 200
    assert cont["usage"]["prompt_tokens"] < whole["usage"]["prompt_tokens"]


# ---- endpoints -----------------------------------------------------------------------------------------------


def test_responses_alias(server):
    body = {"model": MODEL_NAME, "input": "Once upon a time", "max_output_tokens": 8, "temperature": 0}
    st, _, a = post(server.url + "/responses", body)
    st2, _, b = post(server.url + "/v1/responses", body)
    assert st == st2 == 200, a
    text = lambda r: [c["text"] for o in r["output"] for c in o["content"]]
    assert a["object"] == "response" and text(a) == text(b) and text(a)[0]


def test_tokenize_with_pieces(server):
    content = "This is a test string with unicode 媽 and emoji 🤗"
    st, _, plain = post(server.url + "/tokenize", {"content": content})
    st2, _, pieces = post(server.url + "/tokenize", {"content": content, "with_pieces": True})
    assert st == st2 == 200
    assert [t["id"] for t in pieces["tokens"]] == plain["tokens"]
    raw = b""
    for t in pieces["tokens"]:
        assert set(t) == {"id", "piece"}
        p = t["piece"]
        if isinstance(p, str):
            assert p
            raw += p.encode()
        else:  # a byte token: llama-server's array of byte values
            assert p and all(isinstance(x, int) and 0 <= x < 256 for x in p)
            raw += bytes(p)
    assert raw.decode().strip() == content
    assert any(isinstance(t["piece"], list) for t in pieces["tokens"])  # stories260K spells 媽 in bytes
    st, _, body = post(server.url + "/tokenize", {"content": "a", "with_pieces": "yes"})
    assert_error(st, body, 400, "with_pieces")


def test_context_length_exceeded_code(server):
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0)
    long_prompt = "one two three four " * 1200
    with pytest.raises(openai.BadRequestError) as ei:
        client.completions.create(model=MODEL_NAME, prompt=long_prompt, max_tokens=1)
    assert ei.value.code == "context_length_exceeded" and ei.value.param == "prompt"
    with pytest.raises(openai.BadRequestError) as ei:
        client.chat.completions.create(model=MODEL_NAME, messages=[{"role": "user", "content": "hi"}],
                                       max_tokens=100000)
    assert ei.value.code == "context_length_exceeded" and ei.value.param == "max_tokens"
    st, _, body = post(server.url + "/v1/chat/completions",
                       {"messages": [{"role": "user", "content": long_prompt}], "max_tokens": 1})
    assert_error(st, body, 400, "messages")
    assert body["error"]["code"] == "context_length_exceeded"


# ---- tools ---------------------------------------------------------------------------------------------------

TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string", "maxLength": 8}}, "required": ["city"]}}}


def test_named_tool_choice_is_one_call(server):
    """OpenAI and vLLM answer a named tool_choice with one call unless parallel_tool_calls is true; a random
    model left free would often write a second call (the grammar allows several only when asked)."""
    base = {"messages": [{"role": "user", "content": "Weather in Paris and Rome?"}], "tools": [TOOL],
            "tool_choice": {"type": "function", "function": {"name": "get_weather"}}, "max_tokens": 120,
            "temperature": 1.5, "n": 6, "seed": 7}
    st, _, body = chat(server.url, **base)
    assert st == 200, body
    for ch in body["choices"]:
        calls = ch["message"]["tool_calls"]
        assert len(calls) == 1 and calls[0]["function"]["name"] == "get_weather", ch
        assert isinstance(json.loads(calls[0]["function"]["arguments"])["city"], str)
    st, _, body = chat(server.url, **dict(base, parallel_tool_calls=True))
    assert st == 200 and all(len(ch["message"]["tool_calls"]) >= 1 for ch in body["choices"])


# ---- output constraints -------------------------------------------------------------------------------------

SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"enum": ["x", "y"]}},
          "required": ["a", "b"], "additionalProperties": False}


def check_schema_output(text):
    v = json.loads(text)
    assert set(v) == {"a", "b"} and isinstance(v["a"], int) and v["b"] in ("x", "y"), text


@pytest.mark.parametrize("path,extra", [
    ("/v1/completions", {"prompt": "Once", "json_schema": SCHEMA}),
    ("/completions", {"prompt": "Once", "response_format": {"type": "json_object", "schema": SCHEMA}}),
    ("/v1/completions", {"prompt": "Once", "response_format": {"type": "json_schema", "schema": SCHEMA}}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}], "json_schema": SCHEMA}),
])
def test_json_schema_forms(server, path, extra):
    """llama-server's top-level json_schema and response_format.schema constrain the output like OpenAI's
    response_format.json_schema (before, they were accepted and ignored)."""
    for seed in (1, 2, 3):
        st, _, body = post(server.url + path, dict(extra, max_tokens=200, temperature=1.0, seed=seed))
        assert st == 200, body
        ch = body["choices"][0]
        check_schema_output(ch["text"] if "text" in ch else ch["message"]["content"])


def test_constraints_refused_by_name(server):
    st, _, body = post(server.url + "/v1/completions", {"prompt": "a", "json_schema": {"type": "nope"}})
    assert_error(st, body, 400, "json_schema")
    st, _, body = post(server.url + "/v1/completions", {"prompt": "a", "json_schema": "x"})
    assert_error(st, body, 400, "json_schema")
    st, _, body = post(server.url + "/v1/chat/completions",
                       {"messages": [{"role": "user", "content": "a"}], "tools": [TOOL], "json_schema": SCHEMA})
    assert_error(st, body, 400, "json_schema")
    st, _, body = post(server.url + "/v1/completions", {"prompt": "a", "ignore_eos": "yes"})
    assert_error(st, body, 400, "ignore_eos")


def test_ignore_eos(server):
    """An end-of-generation token pushed to the top by logit_bias ends the answer at once; with ignore_eos the
    answer runs to max_tokens."""
    st, _, tok = post(server.url + "/tokenize", {"content": "", "add_special": True})
    bos = tok["tokens"][0]
    eos = 2 if bos == 1 else None  # stories260K: llama's <s>=1, </s>=2
    assert eos is not None
    body = {"prompt": "Once upon a time", "max_tokens": 12, "temperature": 0, "logit_bias": {str(eos): 100}}
    st, _, a = post(server.url + "/v1/completions", body)
    assert st == 200 and a["choices"][0]["finish_reason"] == "stop" and a["usage"]["completion_tokens"] <= 1
    st, _, b = post(server.url + "/v1/completions", dict(body, ignore_eos=True))
    assert st == 200 and b["choices"][0]["finish_reason"] == "length"
    assert b["usage"]["completion_tokens"] == 12


# ---- metrics ---------------------------------------------------------------------------------------------------


def test_embedding_steps_in_batch_metrics():
    s = Server("--parallel", "2")
    try:
        before = s.metrics()
        st, _, body = post(s.url + "/v1/embeddings", {"model": MODEL_NAME, "input": "Once upon a time there"})
        assert st == 200, body
        n = body["usage"]["prompt_tokens"]
        after = s.metrics()
        key = "ferry_batch_size_tokens_sum"
        assert after[key] - before.get(key, 0) == n
        assert after["ferry_batch_tokens"] == n
    finally:
        assert s.stop() == 0


# ---- the chat template at start-up -------------------------------------------------------------------------


@pytest.mark.parametrize("src,what", [("{% if messages %}x", "unclosed 'if'"), ("{% include 'x' %}", "include")])
def test_template_that_does_not_compile_is_refused_at_start(tmp_path, src, what):
    """A template outside the subset would answer every chat with 400 while /health said ok: the server refuses
    it at start-up, naming the construct."""
    path = tmp_path / "t.jinja"
    path.write_text(src)
    with pytest.raises(RuntimeError) as ei:
        Server("--chat-template-file", str(path))
    msg = str(ei.value)
    assert "exited" in msg and "chat template does not compile" in msg and what in msg, msg


def test_template_with_filter_block_dictsort_and_format_serves(tmp_path):
    """Constructs the firefunction-v2, Seed-OSS, Hy3 and functionary templates use render over HTTP."""
    src = ("{%- filter trim %}  {{ '<{}>'.format(bos_token) }} {% endfilter -%}"
           "{%- for k, v in {'b': 2, 'a': 1} | dictsort %}{{ k }}{{ v }}{% endfor -%}"
           "{{ tools | selectattr('type', 'equalto', 'x') | list | length }}"
           "{%- for m in messages %}|{{ m.role }}:{{ m.content }}{% endfor %}|")
    path = tmp_path / "t.jinja"
    path.write_text(src)
    s = Server("--chat-template-file", str(path))
    try:
        st, _, body = post(s.url + "/apply-template", {"messages": [{"role": "user", "content": "hi"}]})
        assert st == 200 and body["prompt"] == "<<s>>a1b20|user:hi|", body
    finally:
        assert s.stop() == 0
