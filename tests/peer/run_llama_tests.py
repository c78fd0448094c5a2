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
import socket
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import unpack  # noqa: E402

FILES = ["unit/test_tokenize.py", "unit/test_completion.py", "unit/test_chat_completion.py",
         "unit/test_compat_anthropic.py"]

SAMPLED = "compares text sampled at temperature 0.8, seed 42: ferry's sampler draws its own random numbers"
FINGERPRINT = "system_fingerprint is OpenAI's fp_<build id>, not llama.cpp's b<build number>"
VERBOSE = "reads __verbose, llama-server's debug echo of the prompt (ferry: POST /apply-template)"
FIRST_CHUNK = "the first stream chunk's delta has content \"\" as OpenAI sends it, not null"
DOWNLOAD = "needs a model the tests download (not available offline)"
IMAGE = "an image is refused with 400 (ferry serves text models) where llama-server answers 500"
# test id, or the start of parametrized ids (up to and after "[") -> why ferry fails it on purpose (one line each)
EXPECTED = {
    "unit/test_completion.py::test_completion[I believe": SAMPLED,
    "unit/test_completion.py::test_completion_stream[I believe": SAMPLED,
    "unit/test_completion.py::test_completion_stream_with_openai_library": SAMPLED,
    "unit/test_completion.py::test_completion_stream_with_openai_library_stops": DOWNLOAD + " (Phi-3.5-mini)",
    "unit/test_completion.py::test_completion_with_openai_library": FINGERPRINT,
    "unit/test_completion.py::test_completion_with_tokens_input": "needs --temp 0, a server-wide default ferry has no option for",
    "unit/test_completion.py::test_n_probs_post_sampling": "post_sampling_probs: ferry reports log-probabilities before sampling only",
    "unit/test_completion.py::test_n_probs_post_backend_sampling": "--backend_sampling is llama.cpp's own sampler",
    "unit/test_chat_completion.py::test_chat_completion[": FINGERPRINT,
    "unit/test_chat_completion.py::test_chat_completion_stream[": FIRST_CHUNK,
    "unit/test_chat_completion.py::test_chat_completion_with_openai_library": FINGERPRINT,
    "unit/test_chat_completion.py::test_logprobs_stream": FIRST_CHUNK,
    "unit/test_chat_completion.py::test_chat_template": VERBOSE,
    "unit/test_chat_completion.py::test_chat_template_assistant_prefill[": VERBOSE,
    "unit/test_chat_completion.py::test_chat_template_continue_final_message_vllm_compat": VERBOSE,
    "unit/test_chat_completion.py::test_verbose_debug": VERBOSE,
    "unit/test_chat_completion.py::test_apply_chat_template": "command-r is not one of ferry's built-in template names",
    "unit/test_chat_completion.py::test_invalid_chat_completion_req[messages7]": "two assistant messages in a row are rendered, not refused",
    "unit/test_chat_completion.py::test_chat_completion_with_timings_per_token": "timings_per_token is refused by name",
    "unit/test_chat_completion.py::test_context_size_exceeded": "OpenAI's 400 context_length_exceeded, not llama.cpp's exceed_context_size_error",
    "unit/test_chat_completion.py::test_context_size_exceeded_stream": "OpenAI's 400 context_length_exceeded, not llama.cpp's exceed_context_size_error",
    "unit/test_chat_completion.py::test_return_progress[": "return_progress (prompt progress chunks) is refused by name",
    "unit/test_compat_anthropic.py::test_anthropic_tool_result_with_image": IMAGE,
    "unit/test_compat_anthropic.py::test_anthropic_vision_format_accepted": IMAGE,
    "unit/test_compat_anthropic.py::test_anthropic_vision_base64_with_multimodal_model": DOWNLOAD + " (a vision model)",
    "unit/test_compat_anthropic.py::test_anthropic_empty_messages": "an empty messages array is a 400, as in Anthropic's API",
    "unit/test_compat_anthropic.py::test_anthropic_thinking_with_reasoning_model[": DOWNLOAD + " (DeepSeek-R1-Distill-Qwen-7B)",
}


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
    with socket.socket() as sk:  # the tests' servers listen on one port, free now
        sk.bind(("127.0.0.1", 0))
        port = sk.getsockname()[1]
    env = dict(os.environ, PORT=str(port), LLAMA_SERVER_BIN_PATH=os.path.join(HERE, "llama_server_shim.py"), FERRY=ferry,
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
        return next((why for k, why in EXPECTED.items() if tid == k or ("[" in k and tid.startswith(k))), None)

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
