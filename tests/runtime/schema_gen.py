"""Random JSON Schemas within what ferry supports, and the checks that its outputs must pass.

Shared by tests/runtime/test_grammar.py (random walks through the compiled grammar) and the server tests
(the tiny models under constrained decoding). `validate` is the independent reference: the jsonschema package
(Draft 2020-12) plus explicit checks for the formats jsonschema skips without optional packages.
"""
import datetime
import ipaddress
import json
import random
import re
import uuid

import jsonschema

PATTERNS = [
    r"^[a-z]{2,5}$",
    r"^\d{3}-\d{4}$",
    r"^(yes|no|maybe)$",
    r"^[A-Z][a-z]+( [A-Z][a-z]+)?$",
    r"^#[0-9a-fA-F]{6}$",
    r"^v\d+\.\d+\.\d+$",
    r"ab+c",
    r"^[^\s@]+@[^\s@]+$",
    r"^\w{1,8}$",
    r"^(?:\+\d{1,3} )?\(\d{3}\) \d{3}-\d{4}$",
]
FORMATS = ["date-time", "date", "time", "uuid", "email", "ipv4"]
WORDS = ["alpha", "beta", "gamma", "red", "green", "blue", "x", "é", "naïve", "a b"]


def rand_scalar(r):
    k = r.randrange(7)
    if k == 0:
        return {"type": "string"} | ({"maxLength": r.randrange(1, 20)} if r.random() < 0.5 else {}) | (
            {"minLength": r.randrange(0, 4)} if r.random() < 0.3 else {})
    if k == 1:
        s = {"type": "integer"}
        if r.random() < 0.6:
            lo = r.randrange(-1000, 1000)
            s["minimum"] = lo
            if r.random() < 0.7:
                s["maximum"] = lo + r.randrange(0, 500)
        if r.random() < 0.2 and "maximum" in s:
            s["exclusiveMaximum"] = s["maximum"] + 1
        return s
    if k == 2:
        s = {"type": "number"}
        if r.random() < 0.6:
            lo = round(r.uniform(-100, 100), r.randrange(0, 3))
            s["exclusiveMinimum" if r.random() < 0.3 else "minimum"] = lo
            if r.random() < 0.7:
                s["maximum"] = round(lo + r.uniform(0.01, 50), 2)
        return s
    if k == 3:
        return {"type": "boolean"}
    if k == 4:
        return {"type": "string", "pattern": r.choice(PATTERNS)}
    if k == 5:
        return {"type": "string", "format": r.choice(FORMATS)}
    vals = r.sample(WORDS, r.randrange(1, 5)) + ([r.randrange(100)] if r.random() < 0.3 else [])
    return {"enum": vals} if len(vals) > 1 or r.random() < 0.5 else {"const": vals[0]}


def rand_schema(r, depth=0):
    k = r.randrange(10) if depth < 3 else 0
    if k <= 3:
        return rand_scalar(r)
    if k <= 6:
        n = r.randrange(1, 5)
        names = r.sample(["id", "name", "value", "items", "when", "kind", "note", "score", "ok", "tag"], n)
        props = {nm: rand_schema(r, depth + 1) for nm in names}
        req = [nm for nm in names if r.random() < 0.7]
        s = {"type": "object", "properties": props, "required": req}
        if r.random() < 0.7:
            s["additionalProperties"] = False
        return s
    if k <= 8:
        s = {"type": "array", "items": rand_schema(r, depth + 1)}
        lo = r.randrange(0, 3)
        if lo:
            s["minItems"] = lo
        if r.random() < 0.8:
            s["maxItems"] = lo + r.randrange(0, 4)
        return s
    alts = [rand_schema(r, depth + 1) for _ in range(r.randrange(2, 4))]
    if r.random() < 0.5:
        alts.append({"type": "null"})
    return {"anyOf": alts}


def recursive_schema():
    return {
        "$defs": {"node": {"type": "object", "properties": {
            "label": {"type": "string", "maxLength": 8},
            "children": {"type": "array", "items": {"$ref": "#/$defs/node"}, "maxItems": 2}},
            "required": ["label"], "additionalProperties": False}},
        "$ref": "#/$defs/node"}


def random_schemas(seed, n):
    """n schemas; the top level is an object (what structured output asks for) except now and then."""
    r = random.Random(seed)
    out = []
    for i in range(n):
        if i % 10 == 9:
            out.append(recursive_schema())
            continue
        s = rand_schema(r)
        if s.get("type") != "object" and r.random() < 0.8:
            s = {"type": "object", "properties": {"answer": s}, "required": ["answer"], "additionalProperties": False}
        out.append(s)
    return out


def _format_ok(f, value):
    try:
        if f == "date-time":
            datetime.datetime.fromisoformat(value.replace("Z", "+00:00"))
            return "T" in value
        if f == "date":
            datetime.date.fromisoformat(value)
        elif f == "time":
            datetime.time.fromisoformat(value.replace("Z", "+00:00"))
        elif f == "uuid":
            return str(uuid.UUID(value)) == value.lower()
        elif f == "ipv4":
            ipaddress.IPv4Address(value)
        elif f == "email":
            return re.fullmatch(r"[^@\s]+@[^@\s]+\.[a-z]+", value) is not None
        return True
    except ValueError:
        return False


def _formats_ok(schema, value, defs):
    """The formats jsonschema does not check without extra packages; anyOf passes when one member does."""
    if not isinstance(schema, dict):
        return True
    if "$ref" in schema:
        return _formats_ok(defs[schema["$ref"].split("/")[-1]], value, defs)
    if "anyOf" in schema:
        for alt in schema["anyOf"]:
            try:
                jsonschema.Draft202012Validator(alt | ({"$defs": defs} if defs else {})).validate(value)
            except jsonschema.ValidationError:
                continue
            if _formats_ok(alt, value, defs):
                return True
        return False
    f = schema.get("format")
    if f and isinstance(value, str) and not _format_ok(f, value):
        return False
    if isinstance(value, dict):
        for k, v in value.items():
            if k in schema.get("properties", {}) and not _formats_ok(schema["properties"][k], v, defs):
                return False
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        return all(_formats_ok(schema["items"], v, defs) for v in value)
    return True


def validate(schema, text):
    """Raises unless text is one JSON value valid under schema (formats included)."""
    value = json.loads(text)
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    cls(schema, format_checker=cls.FORMAT_CHECKER).validate(value)
    if not _formats_ok(schema, value, schema.get("$defs") or schema.get("definitions") or {}):
        raise ValueError(f"a format does not hold in {value!r}")
    return value
