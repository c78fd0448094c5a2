#!/usr/bin/env python3
"""GBNF grammars (runtime/grammar_gbnf.c) on the grammars llama.cpp ships (grammars/*.gbnf of the peer tarball).

- Every grammar compiles.
- Random walks through each grammar never reach a prefix that cannot be completed, and every output is in the
  grammar's language by an independent check: Python's json module for json.gbnf and json_arr.gbnf, Python
  regular expressions for list, chess, english and japanese, a recursive-descent parser written here for
  arithmetic.
- Labelled strings are accepted or refused as the grammar says.
- Malformed grammars are refused with the line named.
Run by meson (suite runtime); GRAMMAR_TOOL is the built tests/runtime/grammar_tool. Exits 77 (skip) with a
message when the tarball is missing.
"""
import json
import os
import re
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "peer"))
import unpack  # noqa: E402

TOOL = os.environ.get("GRAMMAR_TOOL") or os.path.join(os.environ.get("FERRY_BUILD", "build"), "tests", "runtime",
                                                      "grammar_tool")
failures = []


def check(cond, msg):
    if not cond:
        failures.append(msg)
        print("FAIL:", msg[:400])


def tool(*args, stdin=None):
    r = subprocess.run([TOOL, *args], input=stdin, capture_output=True, text=True, timeout=120)
    return r.stdout


MOVE = r"(?:(?:[a-h]x)?[a-h][1-8](?:=[NBKQR])?|[NBKQR][a-h]?[1-8]?x?[a-h][1-8]|O-O(?:-O)?)[+#]?"
EN = r"[a-zA-Z0-9!\"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~]"
JP = "[ぁ-ゟァ-ヿ、-〾一-鿿]"
LANG = {
    "json.gbnf": lambda s: isinstance(json.loads(s), dict),
    "json_arr.gbnf": lambda s: isinstance(json.loads(s), list) and s.startswith("[\n"),
    "list.gbnf": lambda s: re.fullmatch("(- [^\r\n\x0b\x0c\x85\u2028\u2029]+\n)+", s) is not None,
    "chess.gbnf": lambda s: re.fullmatch(rf"1\. {MOVE} {MOVE}\n([1-9][0-9]?\. {MOVE} {MOVE}\n)+", s) is not None,
    "english.gbnf": lambda s: re.fullmatch(rf"{EN}+([ \t\n]{EN}+)*", s) is not None,
    "japanese.gbnf": lambda s: re.fullmatch(rf"{JP}+([ \t\n]{JP}+)*", s) is not None,
}


def arithmetic(s):
    """root ::= (expr "=" ws term "\\n")+ with term ::= ident | num | "(" ws expr ")" ws."""
    pos = 0

    def ws():
        nonlocal pos
        while pos < len(s) and s[pos] in " \t\n":
            pos += 1

    def term():
        nonlocal pos
        if pos < len(s) and "a" <= s[pos] <= "z":
            pos += 1
            while pos < len(s) and (s[pos].isdigit() or "a" <= s[pos] <= "z" or s[pos] == "_"):
                pos += 1
            ws()
        elif pos < len(s) and s[pos].isdigit():
            while pos < len(s) and s[pos].isdigit():
                pos += 1
            ws()
        elif pos < len(s) and s[pos] == "(":
            pos += 1
            ws()
            expr()
            assert s[pos] == ")"
            pos += 1
            ws()
        else:
            raise AssertionError(pos)

    def expr():
        nonlocal pos
        term()
        while pos < len(s) and s[pos] in "-+*/":
            pos += 1
            term()

    # ws after a term is greedy here; the grammar lets a term's ws end before the "\n" that closes a line, so
    # lines are checked one by one from their "=" (a line's last term ends at its own newline)
    try:
        lines = 0
        while pos < len(s):
            expr()
            assert s[pos] == "="
            pos += 1
            ws()
            start = pos
            term()
            # the greedy ws() ate the line's "\n" and maybe more: the grammar needs one "\n" there
            assert "\n" in s[start:pos]
            lines += 1
        return lines > 0
    except (AssertionError, IndexError):
        return False


LANG["arithmetic.gbnf"] = arithmetic

LABELLED = {
    "json.gbnf": [('{"a": [1, 2.5, "x\\n", true, null], "b": {}}', 1), ('{"é": "ü"}', 1), ('{"a" 1}', 0),
                  ("[1]", 0), ('{"a": 01}', 0), ('{"a": tru}', 0)],
    "list.gbnf": [("- apple\n- pear\n", 1), ("- \n", 0), ("* x\n", 0), ("- a", 0)],
    "arithmetic.gbnf": [("1+2=3\n", 1), ("(a_1 * 2)=x\n", 0), ("(a_1*2)=x\n", 1), ("1+=3\n", 0)],
    "chess.gbnf": [("1. e4 e5\n2. Nf3 Nc6\n", 1), ("1. e4 e5\n", 0), ("1. e9 e5\n2. a1 a2\n", 0)],
    "japanese.gbnf": [("こんにちは 世界", 1), ("hello", 0)],
}

BAD = [
    ("root ::= foo\n", "line 1: undefined rule 'foo'"),
    ('root ::= "a"\nx ::= [b\n', "line 2: unterminated character class"),
    ('root ::= root "a" | "b"\n', "left-recursive"),
    ('a ::= "x"\n', "no 'root' rule"),
    ('root ::= "a"\nroot ::= "b"\n', "line 2: rule 'root' is defined twice"),
    ('root ::= "a" <[1]>\n', "token references"),
    ('root ::= ("a"\n', "expected ')'"),
    ('root ::= "a"{3,1}\n', "max below min"),
    ('root ::= "\\q"\n', "unknown escape"),
    ('root ::= x\nx ::= "a" x\n', "accepts nothing"),
    ('root ::= "a"' + "?" * 100000 + "\n", "more than 4 repetition operators"),
    ("root ::= " + "(" * 100 + '"a"' + ")" * 100 + "\n", "groups nest deeper than 64"),
]


def main():
    if not os.access(TOOL, os.X_OK):
        print("SKIP missing FILE: " + TOOL)
        sys.exit(77)
    with tempfile.TemporaryDirectory() as d:
        try:
            names = unpack.unpack("grammars", d, ".gbnf")
        except FileNotFoundError as e:
            print(f"SKIP missing FILE: ../shared/peers/{e}")
            sys.exit(77)
        check(len(names) >= 8, f"only {len(names)} grammars in the tarball")
        for name in names:
            path = os.path.join(d, name)
            out = tool("compile", path).strip()
            check(out == "ok", f"{name}: {out}")
            if out != "ok":
                continue
            lines = tool("gen", path, "7", "150", "400").splitlines()
            check(len(lines) == 150, f"{name}: {len(lines)} walks")
            for ln in lines:
                if ln.startswith("DEADEND"):
                    check(False, f"{name}: dead end after {bytes.fromhex(ln.split()[1])!r}")
                    continue
                s = bytes.fromhex(ln).decode("utf-8")
                if name in LANG:
                    try:
                        ok = LANG[name](s)
                    except ValueError:
                        ok = False
                    check(ok, f"{name}: generated {s!r} is not in the language")
            # the walks are accepted in full by the recogniser itself
            got = tool("check", path, stdin="\n".join(x for x in lines if not x.startswith("DEAD")) + "\n").splitlines()
            check(set(got) <= {"1"}, f"{name}: a generated output is refused by check")
            for text, want in LABELLED.get(name, []):
                got = tool("check", path, stdin=text.encode("utf-8").hex() + "\n").strip()
                check(got == str(want), f"{name}: {text!r} -> {got}, want {want}")
        # nesting deeper than a recogniser state holds (a grammar the fuzzer found): the walks must close in time
        # instead of reaching a prefix they cannot finish
        path = os.path.join(d, "nest.gbnf")
        with open(path, "w") as f:
            f.write('root ::= obj\nobj ::= "{" ws (pair ("ob," ws pair)*)? "}"\npair ::= "st r:" ws obj\n'
                    'ws ::= [ \\t\\n]{0,3}\n')
        lines = tool("gen", path, "5", "100", "3000").splitlines()
        check(len(lines) == 100, f"nest.gbnf: {len(lines)} walks")
        for ln in lines:
            check(not ln.startswith("DEAD"), f"nest.gbnf: dead end {ln[:80]}")
            if not ln.startswith("DEAD"):
                s = bytes.fromhex(ln).decode()
                check(s.count("{") == s.count("}"), f"nest.gbnf: {s[:80]!r} is not balanced")
        for i, (src, want) in enumerate(BAD):
            path = os.path.join(d, f"bad{i}.gbnf")
            with open(path, "w") as f:
                f.write(src)
            out = tool("compile", path).strip()
            check(out.startswith("error") and want in out, f"{src!r}: {out!r}, want {want!r}")
    if failures:
        print(f"{len(failures)} failures")
        sys.exit(1)
    print("ok")


if __name__ == "__main__":
    main()
