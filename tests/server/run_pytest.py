#!/usr/bin/env python3
"""Runs the server's pytest files for meson; exits 77 (meson's SKIP) with a message when a prerequisite is
missing (the model, the binary, pytest or the openai package), so nothing passes silently."""
import os
import subprocess
import sys

here = os.path.dirname(os.path.abspath(__file__))
build = os.environ.get("FERRY_BUILD", "")
testdata = os.environ.get("FERRY_TESTDATA", "")
model = os.path.join(testdata, "models", "stories260K.gguf")
ferry = os.path.join(build, "server", "ferry")
if not os.path.exists(model):
    print("SKIP missing FILE: " + model)
    sys.exit(77)
if not os.access(ferry, os.X_OK):
    print("SKIP missing FILE: " + ferry + " (built without the server?)")
    sys.exit(77)
for mod in ("pytest", "openai"):
    try:
        __import__(mod)
    except ImportError:
        print(f"SKIP missing python package: {mod} (pip install pytest openai)")
        sys.exit(77)
files = [os.path.join(here, a) if a.endswith(".py") else a for a in sys.argv[1:]] or [here]
cmd = [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", "--rootdir", here] + files
sys.exit(subprocess.call(cmd, cwd=here))
