"""/v1/responses through the `openai` client (responses.create, responses.stream), and reasoning_content.

References: a response equals the chat completion of the same conversation (same seed, greedy); streamed
events add up to the whole response; function calls and json_schema outputs validate with jsonschema.
Reasoning: with DeepSeek-R1-Distill's template (tests/chat/templates, --chat-template-file), whose
generation prompt opens <think>, the answer goes to reasoning_content (whole and streamed); with
--reasoning-format none it stays in content.
"""
import json
import os

import pytest
from conftest import MODEL_NAME, Server, post

openai = pytest.importorskip("openai")
jsonschema = pytest.importorskip("jsonschema")

R1_TEMPLATE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "chat", "templates",
                           "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja")


def client(srv):
    return openai.OpenAI(base_url=srv.url + "/v1", api_key="none", max_retries=0, timeout=120)


def chat_text(srv, messages, **kw):
    st, _, out = post(srv.url + "/v1/chat/completions", dict(messages=messages, temperature=0, **kw))
    assert st == 200, out
    return out["choices"][0]


def test_text_and_messages_equal_chat(server):
    c = client(server)
    r = c.responses.create(model=MODEL_NAME, input="Once upon a time", max_output_tokens=12, temperature=0)
    assert r.object == "response" and r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    ch = chat_text(server, [{"role": "user", "content": "Once upon a time"}], max_tokens=12)
    assert r.output_text == ch["message"]["content"] and r.usage.output_tokens == 12
    assert r.usage.input_tokens > 0 and r.usage.total_tokens == r.usage.input_tokens + 12
    msgs = [{"role": "user", "content": "Tom had a dog."}, {"role": "assistant", "content": "The dog was big."},
            {"role": "user", "content": [{"type": "input_text", "text": "What did Tom do?"}]}]
    r = c.responses.create(model=MODEL_NAME, instructions="Tell a story.", input=msgs, max_output_tokens=10, temperature=0)
    want = chat_text(server, [{"role": "system", "content": "Tell a story."}, msgs[0], msgs[1],
                              {"role": "user", "content": "What did Tom do?"}], max_tokens=10)
    assert r.output_text == want["message"]["content"]
    assert r.instructions == "Tell a story." and r.max_output_tokens == 10
    item = r.output[0]
    assert item.type == "message" and item.role == "assistant" and item.content[0].type == "output_text"


def test_stream_events_add_up(server):
    c = client(server)
    body = dict(model=MODEL_NAME, input="Once upon a time", max_output_tokens=20, temperature=0)
    whole = c.responses.create(**body)
    types, deltas, seqs = [], [], []
    for ev in c.responses.create(stream=True, **body):
        types.append(ev.type)
        seqs.append(ev.sequence_number)
        if ev.type == "response.output_text.delta":
            deltas.append(ev.delta)
        if ev.type in ("response.completed", "response.incomplete"):
            final = ev.response
    assert types[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    assert types[-1] == "response.incomplete" and "response.output_text.done" in types
    assert seqs == list(range(len(seqs)))
    assert "".join(deltas) == whole.output_text == final.output_text
    # the client's own accumulator (it waits for response.completed: an answer that ends, here a JSON object)
    fmt = {"format": {"type": "json_schema", "name": "o", "schema": {"type": "object", "properties": {
        "a": {"type": "string", "maxLength": 5}}, "required": ["a"], "additionalProperties": False}}}
    body = dict(body, text=fmt, max_output_tokens=40)
    with c.responses.stream(**body) as s:
        assert s.get_final_response().output_text == c.responses.create(**body).output_text


def test_tools_and_round_trip(server):
    c = client(server)
    params = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20},
                                               "days": {"type": "integer", "minimum": 1, "maximum": 7}},
              "required": ["city", "days"], "additionalProperties": False}
    tools = [{"type": "function", "name": "forecast", "description": "weather", "parameters": params}]
    for choice in ("required", {"type": "function", "name": "forecast"}):
        r = c.responses.create(model=MODEL_NAME, input="Weather?", tools=tools, tool_choice=choice, max_output_tokens=80)
        calls = [o for o in r.output if o.type == "function_call"]
        assert r.status == "completed" and calls, r.output
        for fc in calls:
            assert fc.name == "forecast" and fc.call_id
            jsonschema.validate(json.loads(fc.arguments), params)
    # the call and its output go back as input items
    fc = calls[0]
    r2 = c.responses.create(model=MODEL_NAME, tools=tools, max_output_tokens=8, input=[
        {"role": "user", "content": "Weather?"},
        {"type": "function_call", "call_id": fc.call_id, "name": fc.name, "arguments": fc.arguments},
        {"type": "function_call_output", "call_id": fc.call_id, "output": "sunny"}])
    assert r2.status in ("completed", "incomplete")
    # streamed calls: output_item.added, arguments delta/done, output_item.done
    events = list(c.responses.create(model=MODEL_NAME, input="Weather?", tools=tools, tool_choice="required",
                                     max_output_tokens=80, stream=True, temperature=0))
    done = [e for e in events if e.type == "response.function_call_arguments.done"]
    assert done and all(jsonschema.validate(json.loads(e.arguments), params) is None for e in done)
    assert events[-1].type == "response.completed"


def test_text_format_json_schema(server):
    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 16},
                                                "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 3}},
              "required": ["name", "tags"], "additionalProperties": False}
    c = client(server)
    for seed in range(5):
        r = c.responses.create(model=MODEL_NAME, input="Data", max_output_tokens=120, temperature=1, extra_body={"seed": seed},
                               text={"format": {"type": "json_schema", "name": "d", "schema": schema, "strict": True}})
        assert r.status == "completed"
        jsonschema.validate(json.loads(r.output_text), schema)
        assert r.text.format.type == "json_schema"


def test_refusals(server):
    url = server.url + "/v1/responses"
    for body, param in (({"input": "x", "previous_response_id": "resp_1"}, "previous_response_id"),
                        ({"input": "x", "conversation": "conv_1"}, "conversation"),
                        ({"input": "x", "background": True}, "background"),
                        ({"input": "x", "tools": [{"type": "web_search"}]}, "tools"),
                        ({"input": [{"type": "image_generation_call"}]}, "input"),
                        ({"input": []}, "input"),
                        ({}, "input"),
                        ({"input": "x", "max_output_tokens": -1}, "max_output_tokens"),
                        ({"input": "x", "text": {"format": {"type": "json_schema", "name": "x",
                                                            "schema": {"type": "string", "format": "ipv6"}}}},
                         "text.format")):
        st, _, err = post(url, body)
        assert st == 400 and err["error"]["param"] == param, (body, err)
    st, _, err = post(url, {"input": "x", "previous_response_id": "resp_1"})
    assert "no state" in err["error"]["message"]


@pytest.mark.parametrize("fmt", ["auto", "none"])
def test_reasoning_content(fmt):
    """R1's template opens <think> in the generation prompt: the model's whole answer (stories260K never closes
    the block) is reasoning; streamed deltas carry it in reasoning_content; --reasoning-format none keeps it in
    content."""
    if not os.path.exists(R1_TEMPLATE):
        pytest.skip("missing FILE: " + R1_TEMPLATE)
    s = Server("--parallel", "2", "--chat-template-file", R1_TEMPLATE, "--reasoning-format", fmt)
    try:
        c = client(s)
        body = dict(model=MODEL_NAME, messages=[{"role": "user", "content": "Once upon a time"}], max_tokens=16,
                    temperature=0)
        r = c.chat.completions.create(**body)
        msg = r.choices[0].message
        raw = post(s.url + "/v1/chat/completions", dict(body, max_tokens=16))[2]["choices"][0]["message"]
        if fmt == "none":
            assert msg.content and "reasoning_content" not in raw
            return
        assert raw["reasoning_content"] and raw["content"] == "", raw
        parts = {"reasoning_content": "", "content": ""}
        for chunk in c.chat.completions.create(stream=True, **body):
            d = chunk.choices[0].delta if chunk.choices else None
            if d is not None:
                parts["reasoning_content"] += getattr(d, "reasoning_content", None) or ""
                parts["content"] += d.content or ""
        assert parts == {"reasoning_content": raw["reasoning_content"], "content": ""}
        resp = c.responses.create(model=MODEL_NAME, input="Once upon a time", max_output_tokens=16, temperature=0)
        rs = [o for o in resp.output if o.type == "reasoning"]
        assert rs and rs[0].content[0].text == raw["reasoning_content"]
    finally:
        assert s.stop() == 0
