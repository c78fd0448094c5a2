#!/usr/bin/env python3
"""make_family_chat.py — a family's chat conventions rendered by the reference, for test_family_chat.c.

For each family with its own template in llama.cpp's models/templates (the model's tokenizer_config.json
template), renders conversations through transformers' render_jinja_template (what apply_chat_template calls):
plain turns, tools offered, a tool-call round trip, parallel calls, a previous answer with reasoning, and
enable_thinking false. Writes tests/runtime/data/family_chat.json with the template source, so CI needs
neither transformers nor the peer tree. The C test renders every case through chat_template_render_json and
compares byte for byte, and checks the tool-call and reasoning conventions the template implies.

Usage: python3 tests/runtime/make_family_chat.py [PEER_TEMPLATES_DIR]
  (default /work/peer/lcp0336/models/templates; needs jinja2 and transformers)
"""
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "chat"))
from make_chat_cases import CONVERSATIONS, TOOL_CONVERSATIONS, TOOLS, render  # noqa: E402

# family -> (template file, bos, eos)
FAMILIES = {
    "qwen3": ("Qwen-Qwen3-0.6B.jinja", "", "<|im_end|>"),
}

REASONING = [
    {"role": "user", "content": "What is 2+2?"},
    {"role": "assistant", "content": "4", "reasoning_content": "Two plus two is four."},
    {"role": "user", "content": "And 3+3?"},
]
THINK_IN_CONTENT = [
    {"role": "user", "content": "What is 2+2?"},
    {"role": "assistant", "content": "<think>\nTwo plus two.\n</think>\n\n4"},
    {"role": "user", "content": "And 3+3?"},
]


def no_null_content(msgs):
    """Qwen3's template tests `'</think>' in content`, which fails on None: clients send "" there."""
    return [dict(m, content="" if m.get("content") is None else m["content"]) for m in msgs]


def main():
    tdir = sys.argv[1] if len(sys.argv) > 1 else "/work/peer/lcp0336/models/templates"
    out = {}
    for fam, (fname, bos, eos) in FAMILIES.items():
        src = open(os.path.join(tdir, fname), encoding="utf-8").read()
        cases = []
        convs = [(k, v, None, None) for k, v in CONVERSATIONS.items()]
        convs += [("tools_" + k, no_null_content(v), TOOLS, None) for k, v in TOOL_CONVERSATIONS.items()]
        convs += [("reasoning_history", REASONING, None, None), ("think_in_content", THINK_IN_CONTENT, None, None),
                  ("thinking_off", CONVERSATIONS["no_system"], None, {"enable_thinking": False}),
                  ("tools_thinking_off", no_null_content(TOOL_CONVERSATIONS["round_trip"]), TOOLS, {"enable_thinking": False})]
        for name, msgs, tools, extra in convs:
            r = render(src, msgs, True, bos, eos, tools=tools, extra=extra)
            assert "expected" in r, (fam, name, r)
            cases.append({"name": name, "messages": msgs, "tools": tools, "extra": extra or {}, "bos": bos,
                          "eos": eos, "expected": r["expected"]})
        out[fam] = {"template_file": fname, "template": src, "cases": cases}
        print(f"{fam}: {len(cases)} cases")
    with open(os.path.join(HERE, "data", "family_chat.json"), "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False, indent=1)


if __name__ == "__main__":
    main()
