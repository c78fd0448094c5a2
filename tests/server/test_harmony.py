"""gpt-oss (harmony) answers over real HTTP (chat completions, /v1/responses, /v1/messages), read by the openai
and anthropic packages.

No trained gpt-oss model fits the tests, so the model is built here: stories260K's vocabulary with unused byte
tokens renamed to harmony's markers (control tokens where gpt-oss has them, plain text where a piece joins
several) and a one-layer Llama whose only path is embedding → output: token i's logits peak at a chosen
successor, so a greedy answer is a fixed harmony output (an analysis message, then a call of get_weather that
ends at <|call|>, the end-of-generation token). Its chat template holds <|channel|>, so ferry reads the answer as
harmony: the control tokens must stay in the text for the parser (keep_special) and never reach a client.
"""
import json

import numpy as np
import pytest

from conftest import MODEL, Server, gguf_copy_fields

gguf = pytest.importorskip("gguf")

# (byte-token id to rename, its new text, token type: 1 normal, 3 control), in the order the model writes them
CHAIN = [
    (4, "<|start|>assistant", 3),  # the prompt's last token
    (5, "<|channel|>", 3),
    (6, "analysis", 1),
    (7, "<|message|>", 3),
    (8, "Need▁the▁weather.", 1),
    (17, "<|end|><|start|>assistant<|channel|>commentary▁to=functions.get_weather▁", 1),
    (18, "<|constrain|>", 3),
    (19, "json", 1),
    (20, '<|message|>{"city":▁"Paris"}', 1),
    (21, "<|call|>", 3),  # end of generation (the eos)
]
# An analysis message, then the final answer: <|end|> between them is a control token of gpt-oss's vocabulary
# that must not end the generation (llama.cpp drops it from the end-of-generation tokens when <|return|> and
# <|call|> exist); <|return|> ends it.
CHAIN_FINAL = [
    (4, "<|start|>assistant", 3),
    (5, "<|channel|>", 3),
    (6, "analysis", 1),
    (7, "<|message|>", 3),
    (8, "Two▁plus▁two.", 1),
    (17, "<|end|>", 3),
    (18, "<|start|>assistant<|channel|>final", 1),
    (19, "<|message|>4.", 1),
    (20, "<|call|>", 3),  # unused by this chain; there, as in gpt-oss's vocabulary
    (21, "<|return|>", 3),  # end of generation (the eos)
]
TEMPLATE = ("{% for m in messages %}<|start|>{{ m['role'] }}<|message|>{{ m['content'] }}<|end|>{% endfor %}"
            "{% if add_generation_prompt %}<|start|>assistant{% endif %}"
            "{% if false %}<|channel|>final<|message|>{% endif %}")
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather of a city.",
                                           "parameters": {"type": "object",
                                                          "properties": {"city": {"type": "string"}}}}}]
MESSAGES = [{"role": "user", "content": "Weather in Paris?"}]


def harmony_model(path, chain=CHAIN):
    """The model whose greedy answer to any prompt ending in chain[0] is the rest of chain (its last entry is
    the eos; an entry whose successor is itself is only renamed)."""
    r = gguf.GGUFReader(MODEL)
    w = gguf.GGUFWriter(str(path), arch="llama")
    rename = {i: (text, kind) for i, text, kind in chain}
    gguf_copy_fields(r, w, {"tokenizer.ggml.tokens": lambda v: [rename.get(i, (x,))[0] for i, x in enumerate(v)],
                            "tokenizer.ggml.token_type": lambda v: [rename[i][1] if i in rename else x
                                                                    for i, x in enumerate(v)],
                            "tokenizer.ggml.eos_token_id": lambda v: chain[-1][0]},
                     skip=("llama.", "tokenizer.chat_template"))
    w.add_chat_template(TEMPLATE)
    n_vocab, dim, ff = 512, 64, 64
    w.add_context_length(256)
    w.add_embedding_length(dim)
    w.add_feed_forward_length(ff)
    w.add_head_count(8)
    w.add_head_count_kv(8)
    w.add_block_count(1)
    w.add_rope_dimension_count(8)
    w.add_layer_norm_rms_eps(1e-5)
    # token i of the chain → unit vector slot k; the output row of its successor reads that slot
    embd = np.zeros((n_vocab, dim), np.float32)
    out = np.zeros((n_vocab, dim), np.float32)
    path_ = [i for i, text, _ in chain if text != "<|call|>" or chain is CHAIN]
    for k, i in enumerate(path_[:-1]):
        embd[i, k] = 1.0
        out[path_[k + 1], k] = 50.0  # a logit of 400 against 0: the successor at any temperature
    w.add_tensor("token_embd.weight", embd)
    w.add_tensor("output_norm.weight", np.ones(dim, np.float32))
    w.add_tensor("output.weight", out)
    zeros = {"attn_q": (dim, dim), "attn_k": (dim, dim), "attn_v": (dim, dim), "attn_output": (dim, dim),
             "ffn_gate": (ff, dim), "ffn_up": (ff, dim), "ffn_down": (dim, ff)}
    for name, shape in zeros.items():
        w.add_tensor(f"blk.0.{name}.weight", np.zeros(shape, np.float32))
    w.add_tensor("blk.0.attn_norm.weight", np.ones(dim, np.float32))
    w.add_tensor("blk.0.ffn_norm.weight", np.ones(dim, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return str(path)


@pytest.fixture(scope="module")
def harmony(tmp_path_factory):
    s = Server(model=harmony_model(tmp_path_factory.mktemp("harmony") / "harmony.gguf"))
    yield s
    assert s.stop() == 0


def test_prompt_ends_with_the_generation_prompt(harmony):
    """The chain starts from the prompt's last token: the model is built as intended."""
    import urllib.request
    req = urllib.request.Request(harmony.url + "/tokenize", json.dumps(
        {"content": "<|start|>user<|message|>x<|end|><|start|>assistant", "parse_special": True}).encode(),
        {"Content-Type": "application/json"})
    with urllib.request.urlopen(req) as r:
        assert json.load(r)["tokens"][-1] == CHAIN[0][0]


def test_openai_chat_whole_and_streamed(harmony):
    openai = pytest.importorskip("openai")
    c = openai.OpenAI(base_url=harmony.url + "/v1", api_key="x")
    r = c.chat.completions.create(model="harmony.gguf", messages=MESSAGES, tools=TOOLS, temperature=0,
                                  max_tokens=30)
    ch = r.choices[0]
    assert ch.finish_reason == "tool_calls"
    assert ch.message.model_extra["reasoning_content"] == "Need the weather."
    assert not ch.message.content
    (call,) = ch.message.tool_calls
    assert call.type == "function" and call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris"}

    reasoning, content, names, args, finish = "", "", "", "", None
    for chunk in c.chat.completions.create(model="harmony.gguf", messages=MESSAGES, tools=TOOLS, temperature=0,
                                           max_tokens=30, stream=True):
        if not chunk.choices:
            continue
        d = chunk.choices[0].delta
        reasoning += (d.model_extra or {}).get("reasoning_content") or ""
        content += d.content or ""
        for t in d.tool_calls or []:
            names += t.function.name or ""
            args += t.function.arguments or ""
        finish = chunk.choices[0].finish_reason or finish
    assert reasoning == "Need the weather." and content == "" and names == "get_weather"
    assert json.loads(args) == {"city": "Paris"} and finish == "tool_calls"

    # without tools the call is not the client's: dropped, as llama.cpp drops it
    r = c.chat.completions.create(model="harmony.gguf", messages=MESSAGES, temperature=0, max_tokens=30)
    assert r.choices[0].message.model_extra["reasoning_content"] == "Need the weather."
    assert not r.choices[0].message.tool_calls and "<|" not in (r.choices[0].message.content or "")


def test_required_call_in_the_hermes_form(harmony):
    """A required call is generated by a grammar of text tokens, which cannot write harmony's control tokens:
    the call comes in the Hermes form and is still a tool call."""
    openai = pytest.importorskip("openai")
    c = openai.OpenAI(base_url=harmony.url + "/v1", api_key="x")
    r = c.chat.completions.create(model="harmony.gguf", messages=MESSAGES, tools=TOOLS, tool_choice="required",
                                  temperature=0, max_tokens=80)
    ch = r.choices[0]
    assert ch.finish_reason == "tool_calls" and ch.message.tool_calls[0].function.name == "get_weather"
    assert isinstance(json.loads(ch.message.tool_calls[0].function.arguments), dict)


def test_anthropic_messages(harmony):
    anthropic = pytest.importorskip("anthropic")
    c = anthropic.Anthropic(base_url=harmony.url, api_key="x")
    tools = [{"name": "get_weather", "description": "Weather of a city.",
              "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}]
    m = c.messages.create(model="harmony.gguf", max_tokens=30, messages=MESSAGES, tools=tools)
    assert [b.type for b in m.content] == ["thinking", "tool_use"]
    assert m.content[0].thinking == "Need the weather."
    assert m.content[1].name == "get_weather" and m.content[1].input == {"city": "Paris"}
    assert m.stop_reason == "tool_use"
    with c.messages.stream(model="harmony.gguf", max_tokens=30, messages=MESSAGES, tools=tools) as s:
        final = s.get_final_message()
    assert [b.type for b in final.content] == ["thinking", "tool_use"]
    assert final.content[0].thinking == "Need the weather." and final.content[1].input == {"city": "Paris"}


def test_responses(harmony):
    openai = pytest.importorskip("openai")
    c = openai.OpenAI(base_url=harmony.url + "/v1", api_key="x")
    tools = [dict(type="function", **TOOLS[0]["function"])]
    r = c.responses.create(model="harmony.gguf", input="Weather in Paris?", tools=tools, temperature=0,
                           max_output_tokens=30)
    assert [o.type for o in r.output] == ["reasoning", "function_call"]
    assert r.output[0].content[0].text == "Need the weather."
    assert r.output[1].name == "get_weather" and json.loads(r.output[1].arguments) == {"city": "Paris"}


def test_analysis_then_final(tmp_path):
    """<|end|> closes the analysis message, not the answer: the final message follows (<|return|> ends it)."""
    openai = pytest.importorskip("openai")
    s = Server(model=harmony_model(tmp_path / "final.gguf", CHAIN_FINAL))
    try:
        c = openai.OpenAI(base_url=s.url + "/v1", api_key="x")
        r = c.chat.completions.create(model="final.gguf", messages=MESSAGES, temperature=0, max_tokens=30)
        ch = r.choices[0]
        assert ch.message.model_extra["reasoning_content"] == "Two plus two."
        assert ch.message.content == "4." and ch.finish_reason == "stop"
    finally:
        assert s.stop() == 0
