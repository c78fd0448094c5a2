#!/usr/bin/env python3
"""Writes tests/chat/template_sweep.json: every chat template of llama.cpp's models/templates, rendered by the
reference implementation over the same conversations, tools and flags.

The reference is transformers' render_jinja_template (what apply_chat_template calls: jinja2's
ImmutableSandboxedEnvironment, trim_blocks/lstrip_blocks, loopcontrols, raise_exception, HF's tojson,
strftime_now). strftime_now is pinned to 2024-07-26 here; the C test (test_template_sweep.c) renders each
template with ferry and puts the same date back wherever a template printed today's. The templates themselves are
not committed: the test reads them from the peer's tarball (../shared/peers/llama.cpp-lcp0336.tar.gz) and checks
each one's sha256 against the one recorded here.

Usage: python3 tests/chat/make_template_sweep.py [TARBALL]   (needs jinja2 and transformers)
"""
import datetime
import hashlib
import json
import os
import sys
import tarfile

import jinja2
import transformers.utils.chat_template_utils as ctu

import make_chat_cases  # the same reference render, errors classified the same way

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
TARBALL = os.path.join(ROOT, "..", "shared", "peers", "llama.cpp-lcp0336.tar.gz")
FIXED_NOW = datetime.datetime(2024, 7, 26, 9, 30, 0)


class PinnedDatetime(datetime.datetime):
    @classmethod
    def now(cls, tz=None):
        return FIXED_NOW


ctu.datetime = PinnedDatetime  # strftime_now reads datetime.now() from the module

TOOLS = make_chat_cases.TOOLS


def call(cid, name, args, as_string):
    return {"id": cid, "type": "function",
            "function": {"name": name, "arguments": json.dumps(args) if as_string else args}}


def round_trip(as_string, content=None):
    return [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "Weather and time in Paris?"},
        {"role": "assistant", "content": content, "tool_calls": [
            call("call12345", "get_weather", {"city": "Paris", "unit": "celsius"}, as_string),
            call("call67890", "get_time", {"tz": "Europe/Paris"}, as_string)]},
        {"role": "tool", "tool_call_id": "call12345", "name": "get_weather", "content": "{\"temp\": 21}"},
        {"role": "tool", "tool_call_id": "call67890", "name": "get_time", "content": "14:05"},
        {"role": "assistant", "content": "It is 21 C and 14:05 in Paris."},
        {"role": "user", "content": "Thanks!"},
    ]


# name -> (messages, tools, add_generation_prompt, extra variables)
SCENARIOS = {
    "chat": ([
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "What is the capital of France?"},
        {"role": "assistant", "content": "Paris."},
        {"role": "user", "content": "And of Germany? Héllo 你好 🤖"},
    ], None, True, {}),
    "no_system_nogen": ([
        {"role": "user", "content": "Hello"},
        {"role": "assistant", "content": "Hi there"},
    ], None, False, {}),
    "tools_first_turn": ([
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "What is the weather in Paris?"},
    ], TOOLS, True, {"functions": json.dumps([t["function"] for t in TOOLS], indent=2), "datetime": "2024-07-26"}),
    "tool_round_trip": (round_trip(False), TOOLS, True, {}),
    "tool_round_trip_str": (round_trip(True), TOOLS, True, {}),
    "tool_round_trip_empty": (round_trip(False, ""), TOOLS, True, {}),
    "thinking": ([
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "4", "reasoning_content": "Add them."},
        {"role": "user", "content": "3+3?"},
    ], None, True, {"enable_thinking": True}),
    "no_thinking": ([
        {"role": "user", "content": "2+2?"},
    ], None, True, {"enable_thinking": False}),
}
BOS, EOS = "<s>", "</s>"


def render(template, messages, tools, add_gen, extra):
    return make_chat_cases.render(template, messages, add_gen, BOS, EOS, tools, extra)


def main():
    tarball = sys.argv[1] if len(sys.argv) > 1 else TARBALL
    templates = {}
    with tarfile.open(tarball) as tf:
        for m in tf.getmembers():
            parts = m.name.split("/")
            if m.isfile() and len(parts) >= 3 and parts[-3:-1] == ["models", "templates"] and m.name.endswith(".jinja"):
                templates[parts[-1]] = tf.extractfile(m).read().decode("utf-8")
    assert templates, f"no models/templates/*.jinja in {tarball}"
    out = {"generator": "tests/chat/make_template_sweep.py", "jinja2": jinja2.__version__,
           "tarball": os.path.basename(tarball), "now": FIXED_NOW.isoformat(), "bos_token": BOS, "eos_token": EOS,
           "scenarios": {k: {"messages": v[0], "tools": v[1], "add_generation_prompt": v[2], "extra": v[3]}
                         for k, v in SCENARIOS.items()},
           "templates": {}}
    n_err = 0
    for name in sorted(templates):
        src = templates[name]
        cases = {}
        for sname, (msgs, tools, add_gen, extra) in SCENARIOS.items():
            cases[sname] = render(src, msgs, tools, add_gen, extra)
            n_err += "error" in cases[sname]
        out["templates"][name] = {"sha256": hashlib.sha256(src.encode("utf-8")).hexdigest(), "cases": cases}
    path = os.path.join(HERE, "template_sweep.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print(f"wrote {path}: {len(templates)} templates x {len(SCENARIOS)} scenarios ({n_err} reference errors), "
          f"{os.path.getsize(path)} bytes")


if __name__ == "__main__":
    main()
