#!/usr/bin/env python3
"""Unpacks models/templates from llama.cpp's tarball (../shared/peers/llama.cpp-lcp0336.tar.gz, found beside
FERRY_TESTDATA) into the build directory and runs test_template_sweep on it; exits 77 (meson's SKIP) with a
message when the tarball is missing."""
import os
import subprocess
import sys
import tarfile

exe = sys.argv[1]
testdata = os.environ.get("FERRY_TESTDATA", "")
tarball = os.path.join(os.path.dirname(os.path.abspath(testdata)), "peers", "llama.cpp-lcp0336.tar.gz")
if not os.path.exists(tarball):
    print("SKIP missing FILE: " + tarball)
    sys.exit(77)
dest = os.path.join(os.environ.get("FERRY_BUILD", os.path.dirname(exe)), "peer_templates")
os.makedirs(dest, exist_ok=True)
with tarfile.open(tarball) as tf:
    for m in tf.getmembers():
        parts = m.name.split("/")
        if m.isfile() and parts[-3:-1] == ["models", "templates"] and m.name.endswith(".jinja"):
            with open(os.path.join(dest, parts[-1]), "wb") as f:
                f.write(tf.extractfile(m).read())
env = dict(os.environ, FERRY_SWEEP_TEMPLATES=dest)
sys.exit(subprocess.call([exe] + sys.argv[2:], env=env))
