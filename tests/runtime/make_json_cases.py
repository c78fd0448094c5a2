#!/usr/bin/env python3
"""Writes tests/runtime/data/json_cases.txt: documents labelled by Python's json module, the reference for
the JSON acceptance of runtime/grammar.c (tests/runtime/test_grammar.py). A line is "<label> <hex bytes>"; label 1 = json.loads accepts it (strict: no NaN or
Infinity, no control characters in strings) and its value is an object, 0 otherwise. Half the cases are
valid objects dumped with random separators and whitespace, half are mutations of them (a byte deleted,
inserted, replaced, swapped, or the document cut short). Deterministic (seeded)."""
import json
import os
import random

rnd = random.Random(7)
ALPHABET = ' \t\n\r{}[]:,"\\/-+.0123456789eEabfnrtuxyzAFul\x01\x1f\u00e9\u4e2d'


def value(depth):
    k = rnd.randrange(9 if depth < 4 else 6)
    if k == 0:
        return rnd.choice([True, False, None])
    if k == 1:
        return rnd.randint(-10**12, 10**12)
    if k == 2:
        return rnd.choice([0.5, -1e-7, 3.25e10, 1e300, -0.0, 123.456])
    if k in (3, 4, 5):
        n = rnd.randrange(6)
        return "".join(rnd.choice('ab"\\/\b\f\n\r\t\u00e9\u4e2d\u0001 x') for _ in range(n))
    if k in (6, 7):
        return {rnd.choice(["k%d" % i, "\u00e9\"%d\\" % i, ""]): value(depth + 1) for i in range(rnd.randrange(4))}
    return [value(depth + 1) for _ in range(rnd.randrange(4))]


def dump(v):
    ind = rnd.choice([None, None, 0, 1, 2])
    seps = rnd.choice([(",", ":"), (", ", ": "), (" , ", " : ")])
    s = json.dumps(v, indent=ind, separators=seps, ensure_ascii=rnd.random() < 0.5)
    return rnd.choice(["", " ", "\n"]) + s + rnd.choice(["", " ", "\n\t"])


def mutate(s):
    b = list(s)
    k = rnd.randrange(5)
    i = rnd.randrange(len(b)) if b else 0
    if k == 0 and b:
        del b[i]
    elif k == 1:
        b.insert(i, rnd.choice(ALPHABET))
    elif k == 2 and b:
        b[i] = rnd.choice(ALPHABET)
    elif k == 3 and len(b) > 1:
        j = min(i + 1, len(b) - 1)
        b[i], b[j] = b[j], b[i]
    else:
        b = b[: rnd.randrange(len(b) + 1)]
    return "".join(b)


def label(s):
    def bad(_):
        raise ValueError("constant")
    try:
        return int(isinstance(json.loads(s, parse_constant=bad), dict))
    except (ValueError, RecursionError):
        return 0


cases = []
for _ in range(700):
    s = dump({"k%d" % i: value(1) for i in range(rnd.randrange(5))})
    cases.append(s)
    cases.append(mutate(s))
# top-level values that are not objects, and edge numbers
cases += ['[]', '"x"', '1', 'true', '{"a":01}', '{"a":-}', '{"a":1.}', '{"a":.5}', '{"a":1e}', '{"a":1e+}',
          '{"a":-0.0e-0}', '{"a":tru}', '{"a":nulll}', '{"a":"\\u12G4"}', '{"a":"\\x"}', '{}', '{} {}', '{,}',
          '{"a":1,}', '{"a" 1}', '{"a":[1,]}', '{"a":[,1]}', '{"a":NaN}', '{"a":Infinity}', '{"a":"\t"}', '{"\\"":1}']
out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "json_cases.txt")
with open(out, "w") as f:
    for s in cases:
        f.write("%d %s\n" % (label(s), s.encode("utf-8").hex()))
print(out, len(cases), "cases,", sum(label(s) for s in cases), "valid")
