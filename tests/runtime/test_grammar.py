#!/usr/bin/env python3
"""Constrained decoding's recogniser (runtime/grammar.c, json_schema.c, regex.c) against independent references.

- Random walks through the grammars of 300 random schemas (and fixed ones): every output must validate with
  the jsonschema package, and no walk may reach a prefix that cannot be completed (a "dead end").
- Acceptance of the json_object grammar equals Python's json module on the labelled cases of
  tests/runtime/data/json_cases.txt.
- Patterns: generated strings satisfy Python's re.search.
- Refusals: unsupported keywords and malformed schemas give an error naming the keyword.
Run by meson (suite runtime); GRAMMAR_TOOL is the built tests/runtime/grammar_tool. Exits 77 (skip) with a
message when the jsonschema package is missing.
"""
import json
import os
import re
import subprocess
import sys
import tempfile

try:
    import jsonschema  # noqa: F401
except ImportError:
    print("SKIP missing python package: jsonschema (pip install jsonschema)")
    sys.exit(77)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import schema_gen  # noqa: E402

TOOL = os.environ.get("GRAMMAR_TOOL") or os.path.join(os.environ.get("FERRY_BUILD", "build"), "tests", "runtime", "grammar_tool")
HERE = os.path.dirname(os.path.abspath(__file__))
failures = []


def check(cond, msg):
    if not cond:
        failures.append(msg)
        print("FAIL:", msg[:500])


def tool(*args, stdin=None):
    r = subprocess.run([TOOL, *args], input=stdin, capture_output=True, text=True, timeout=300)
    if r.returncode:
        raise RuntimeError(f"grammar_tool {args}: {r.stderr}")
    return r.stdout


def with_schema(schema):
    f = tempfile.NamedTemporaryFile("w", suffix=".json", delete=False)
    json.dump(schema, f)
    f.close()
    return f.name


def walks(schema, seed, n=12, soft=120):
    path = with_schema(schema)
    try:
        out = tool("gen", path, str(seed), str(n), str(soft))
    finally:
        os.unlink(path)
    return out.splitlines()


def test_random_schemas():
    schemas = schema_gen.random_schemas(1234, 300)
    n_out = 0
    for i, s in enumerate(schemas):
        for line in walks(s, i):
            if line.startswith("DEADEND"):
                check(False, f"schema {i} {json.dumps(s)}: dead end after {bytes.fromhex(line.split()[1])!r}")
                continue
            text = bytes.fromhex(line).decode("utf-8")
            try:
                schema_gen.validate(s, text)
            except Exception as e:  # noqa: BLE001
                check(False, f"schema {i} {json.dumps(s)}: output {text!r} invalid: {e}")
            n_out += 1
    check(n_out >= 3000, f"only {n_out} outputs")
    print(f"random schemas: {len(schemas)} schemas, {n_out} outputs validated")


def test_fixed_schemas():
    cases = [
        {"type": "integer", "minimum": 5, "maximum": 5},
        {"type": "integer", "exclusiveMinimum": -3, "exclusiveMaximum": 3},
        {"type": "number", "minimum": 0.25, "maximum": 0.5},
        {"type": "number", "exclusiveMinimum": 0.3, "maximum": 0.30001},
        {"type": "number", "minimum": 1000000, "maximum": 1000001.5},
        {"type": "string", "minLength": 3, "maxLength": 3},
        {"type": "string", "pattern": "^[a-z]+$", "minLength": 2, "maxLength": 4},
        {"type": "string", "format": "uuid"},
        {"type": "array", "prefixItems": [{"type": "integer"}, {"type": "string"}], "items": False, "minItems": 2},
        {"$schema": "http://json-schema.org/draft-07/schema#", "type": "array", "items": [{"const": 1}],
         "additionalItems": {"type": "boolean"}, "maxItems": 3},
        {"type": ["string", "null"], "maxLength": 2},
        {"type": "object", "required": ["a"], "additionalProperties": {"type": "integer"}},
        {"type": "object", "additionalProperties": {"type": "boolean"}},
        {"type": "object"},
        {"enum": [1, 12, 123, "1", [1, 2], {"a": None}]},
        {"oneOf": [{"type": "integer", "maximum": -1}, {"type": "string", "maxLength": 1}]},
        {"allOf": [{"type": "boolean"}], "description": "x"},
        {"$defs": {"b": {"type": "boolean"}}, "type": "object", "properties": {"x": {"$ref": "#/$defs/b"}}, "required": ["x"]},
        {"definitions": {"l": {"type": "array", "items": {"$ref": "#/definitions/l"}, "maxItems": 2}}, "$ref": "#/definitions/l"},
        {"type": "object", "properties": {"q": {"type": "string", "pattern": "\"\\\\"}}, "required": ["q"]},
        True,
        {"const": "tab\tquote\"back\\slash/é"},
        # parts that accept nothing are dropped, the rest still generates: an optional property (never written),
        # an anyOf member, the items of an array that may be empty (only [] remains)
        {"type": "object", "properties": {"unit": {"type": "string", "maxLength": 1, "minLength": 3},
                                          "when": {"type": "number"}}, "additionalProperties": False},
        {"anyOf": [{"type": "string", "minLength": 3, "maxLength": 1}, {"type": "integer", "minimum": 7, "maximum": 7}]},
        {"type": "array", "items": {"type": "string", "minLength": 2, "maxLength": 1}},
    ]
    for i, s in enumerate(cases):
        for line in walks(s, 1000 + i, n=30):
            if line.startswith("DEADEND"):
                check(False, f"fixed {json.dumps(s)}: dead end after {bytes.fromhex(line.split()[1])!r}")
                continue
            text = bytes.fromhex(line).decode("utf-8")
            try:
                schema_gen.validate(s if isinstance(s, dict) else {}, text)
            except Exception as e:  # noqa: BLE001
                check(False, f"fixed {json.dumps(s)}: output {text!r} invalid: {e}")


def test_patterns_match_python():
    pats = schema_gen.PATTERNS + [r"^(a|b)*c{2,3}$", r"x\.y", r"^[^a-z]{2}$", r"^\D\W\S$", r"^é+ü?$", r"[\u4e00-\u9fff]{2}",
                                  r"^(?P<y>\d{4})-(?:0[1-9]|1[0-2])$", r"^a{0,3}?b+?$", r"^[\]\-a]+$", r"^.$"]
    for i, p in enumerate(pats):
        s = {"type": "string", "pattern": p}
        for line in walks(s, 2000 + i, n=25, soft=40):
            if line.startswith("DEADEND"):
                check(False, f"pattern {p!r}: dead end")
                continue
            v = json.loads(bytes.fromhex(line).decode("utf-8"))
            check(re.search(p, v) is not None, f"pattern {p!r}: {v!r} does not match")


def test_json_object_matches_python_json():
    lines = open(os.path.join(HERE, "data", "json_cases.txt")).read().splitlines()
    docs = [ln[2:] for ln in lines]
    labels = [int(ln[0]) for ln in lines]
    got = tool("check", "-object-", stdin="\n".join(docs) + "\n").split()
    check(len(got) == len(docs), "one answer per case")
    bad = [(bytes.fromhex(d), lab) for d, lab, g in zip(docs, labels, got) if int(g) != lab]
    # whitespace runs are bounded (16 bytes) and numbers at most 64 digits per part: no labelled case exceeds them
    check(not bad, f"{len(bad)} of {len(docs)} cases differ from Python's json: {bad[:5]}")
    print(f"json_object: {len(docs)} labelled cases agree with Python's json")


def test_refusals():
    cases = [
        ({"type": "string", "contentEncoding": "base64"}, "contentEncoding"),
        ({"type": "object", "patternProperties": {"^x": {}}}, "patternProperties"),
        ({"type": "array", "uniqueItems": True}, "uniqueItems"),
        ({"type": "number", "multipleOf": 3}, "multipleOf"),
        ({"type": "object", "minProperties": 1}, "minProperties"),
        ({"not": {"type": "string"}}, "not"),
        ({"type": "string", "format": "ipv6"}, "ipv6"),
        ({"type": "string", "pattern": "(?=a)b"}, "lookaround"),
        ({"type": "string", "pattern": "(a)\\1"}, "backreference"),
        ({"type": "string", "pattern": "a(b"}, "missing )"),
        ({"$ref": "https://example.com/s.json"}, "$ref"),
        ({"$ref": "#/$defs/missing"}, "points to nothing"),
        ({"type": "frobnicate"}, "frobnicate"),
        ({"type": "integer", "minimum": 3, "maximum": 2}, "accepts no value"),
        # tool case 163 of test_structured.py's generator beyond its seeds: a required string with minLength 3
        # and maxLength 1 (no value exists; the jsonschema package agrees for every length)
        ({"type": "object", "properties": {"unit": {"type": "string", "maxLength": 1, "minLength": 3},
                                           "when": {"type": "number"}},
          "required": ["unit"], "additionalProperties": False}, "accepts no value"),
        ({"type": "array", "items": {"type": "string", "minLength": 2, "maxLength": 1}, "minItems": 1},
         "accepts no value"),
        ({"type": "object", "properties": {"a": {"type": "string"}}, "required": ["b"], "additionalProperties": False}, "'b'"),
        ({"allOf": [{"type": "string"}, {"maxLength": 3}]}, "allOf"),
        ({"anyOf": [{"type": "string"}], "maxLength": 3}, "anyOf"),
        ({"type": "string", "pattern": "a{1000}"}, "256"),
    ]
    nested = {"type": "object", "properties": {"x": {}}}
    cur = nested["properties"]
    for _ in range(40):
        cur["x"] = {"type": "object", "properties": {"x": {}}}
        cur = cur["x"]["properties"]
    cases.append((nested, "deeper"))
    for schema, needle in cases:
        path = with_schema(schema)
        try:
            out = tool("compile", path).strip()
        finally:
            os.unlink(path)
        check(out.startswith("error") and needle in out, f"{json.dumps(schema)[:120]}: expected an error naming {needle!r}, got {out!r}")


def main():
    for name, fn in list(globals().items()):
        if name.startswith("test_"):
            fn()
    if failures:
        print(f"{len(failures)} failure(s)")
        sys.exit(1)
    print("all grammar checks passed")


if __name__ == "__main__":
    main()
