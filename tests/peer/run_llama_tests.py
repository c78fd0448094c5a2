#!/usr/bin/env python3
"""Runs llama.cpp's own server tests (tools/server/tests of the peer tarball) against `ferry serve`.

The tests start llama-server through LLAMA_SERVER_BIN_PATH: here that is llama_server_shim.py, which maps the
flags onto ferry's; ferry_peer_plugin.py keeps the tests from downloading models. Every test must pass except
those in EXPECTED below, each a feature ferry deliberately lacks (one line of reason each); a test listed there
that passes is reported too, so the list stays true.

Usage: run_llama_tests.py [unit/test_x.py ...]   (default: the four files below). Needs pytest, requests,
openai, filelock; exits 77 (meson's SKIP) with a message when they or the tarball are missing.
"""
import os
import re
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import unpack  # noqa: E402

FILES = ["unit/test_tokenize.py", "unit/test_completion.py", "unit/test_chat_completion.py",
         "unit/test_compat_anthropic.py"]

# test id (or a prefix of it) -> why ferry fails it on purpose
EXPECTED = {}


def main():
    for mod in ("pytest", "requests", "openai", "filelock"):
        try:
            __import__(mod)
        except ImportError:
            print(f"SKIP missing python package: {mod}")
            return 77
    build = os.path.abspath(os.environ.get("FERRY_BUILD", os.path.join(HERE, "..", "..", "build")))
    ferry = os.path.join(build, "server", "ferry")
    if not os.access(ferry, os.X_OK):
        print("SKIP missing FILE: " + ferry)
        return 77
    root = os.path.join(build, "peer_llama")
    try:
        unpack.unpack("tools/server/tests", os.path.join(root, "tools", "server", "tests"))
        unpack.unpack("tools/server/tests/unit", os.path.join(root, "tools", "server", "tests", "unit"))
        unpack.unpack("models/templates", os.path.join(root, "models", "templates"))
    except FileNotFoundError as e:
        print(f"SKIP missing FILE: ../shared/peers/{e}")
        return 77
    tests = os.path.join(root, "tools", "server", "tests")
    env = dict(os.environ, LLAMA_SERVER_BIN_PATH=os.path.join(HERE, "llama_server_shim.py"), FERRY=ferry,
               PYTHONPATH=HERE + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env["FERRY_TESTDATA"] = os.path.abspath(
        os.environ.get("FERRY_TESTDATA", os.path.join(HERE, "..", "..", "..", "shared", "testdata")))
    files = sys.argv[1:] or FILES
    cmd = [sys.executable, "-m", "pytest", "-p", "ferry_peer_plugin", "-p", "no:cacheprovider", "-q", "-rA",
           "--tb=line", "-o", "addopts=", *files]
    r = subprocess.run(cmd, cwd=tests, env=env, capture_output=True, text=True)
    results = {}
    for line in r.stdout.splitlines():
        m = re.match(r"^(PASSED|FAILED|ERROR) (.+?)(?: - .*)?$", line)
        if m:
            results[m.group(2)] = m.group(1)
        elif line.startswith("SKIPPED"):
            results[line] = "SKIPPED"
    if not results:
        print(r.stdout[-4000:], r.stderr[-4000:])
        return 1

    def expected(tid):
        return next((why for k, why in EXPECTED.items() if tid.startswith(k)), None)

    bad = [t for t, s in results.items() if s in ("FAILED", "ERROR") and not expected(t)]
    fixed = [t for t, s in results.items() if s == "PASSED" and expected(t)]
    counts = {s: sum(1 for v in results.values() if v == s) for s in ("PASSED", "FAILED", "ERROR", "SKIPPED")}
    print(f"llama.cpp server tests against ferry: {counts}")
    for t in bad:
        print("UNEXPECTED FAILURE:", t)
    for t in fixed:
        print("PASSES BUT LISTED AS EXPECTED:", t)
    if bad:
        print(r.stdout[-6000:])
    return 1 if bad or fixed else 0


if __name__ == "__main__":
    sys.exit(main())
