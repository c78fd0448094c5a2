#!/usr/bin/env python3
"""Unpacks models/templates from llama.cpp's tarball into the build directory and runs test_template_sweep on
it; exits 77 (meson's SKIP) with a message when the tarball is missing."""
import os
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "peer"))
import unpack  # noqa: E402

exe = sys.argv[1]
dest = os.path.join(os.environ.get("FERRY_BUILD", os.path.dirname(exe)), "peer_templates")
try:
    unpack.unpack("models/templates", dest, ".jinja")
except FileNotFoundError as e:
    print(f"SKIP missing FILE: ../shared/peers/{e}")
    sys.exit(77)
sys.exit(subprocess.call([exe] + sys.argv[2:], env=dict(os.environ, FERRY_SWEEP_TEMPLATES=dest)))
