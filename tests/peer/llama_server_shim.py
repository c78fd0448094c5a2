#!/usr/bin/env python3
"""Stands in for llama-server in llama.cpp's server tests: maps llama-server's command line onto `ferry serve`
and execs it. FERRY (the binary) and FERRY_TESTDATA (the models) come from the environment.

Mapped: --port, --host, --seed, --ctx-size, --parallel, --threads, --api-key, --alias (the served model name),
--batch-size (the step's token budget), --chat-template, --chat-template-file, --reasoning-format, and the
tests' stories260K model (--hf-repo ggml-org/test-model-stories260K, or the llama.cpp models of the same
name). Ignored because ferry always behaves so: --jinja, --cont-batching, --metrics, --slots, --offline,
--no-ui, --verbose, --ubatch-size, --n-gpu-layers (no GPU in these runs). --temp and --n-predict, server-wide
request defaults that ferry has no option for, are ignored too: the tests that depend on them are listed as
expected failures by run_llama_tests.py. Anything else ends the shim with status 2, naming the flag.
"""
import os
import sys

MAPPED = {"--port": "--port", "--host": "--host", "--seed": "--seed", "--ctx-size": "--ctx-size",
          "-c": "--ctx-size", "--parallel": "--parallel", "-np": "--parallel", "--threads": "--threads",
          "-t": "--threads", "--api-key": "--api-key", "--alias": "--served-model-name",
          "--batch-size": "--max-batch-tokens", "-b": "--max-batch-tokens", "--chat-template": "--chat-template",
          "--chat-template-file": "--chat-template-file"}
IGNORED_FLAGS = {"--jinja", "--no-jinja", "--cont-batching", "--metrics", "--slots", "--no-slots", "--offline",
                 "--no-ui", "--verbose", "--kv-unified"}
IGNORED_VALUES = {"--temp", "--n-predict", "--ubatch-size", "--n-gpu-layers", "-ngl", "--hf-file"}
MODELS = {"ggml-org/test-model-stories260K": "stories260K.gguf"}


def main(argv):
    testdata = os.environ["FERRY_TESTDATA"]
    out = [os.environ["FERRY"], "serve", "--any-model", "--threads", "1"]
    model = None
    i = 0
    while i < len(argv):
        a = argv[i]
        val = argv[i + 1] if i + 1 < len(argv) else None
        if a in MAPPED:
            if a == "--batch-size" and val is not None and int(val) < 64:
                val = "64"  # a step must hold a whole decode batch plus some prefill
            out += [MAPPED[a], val]
            i += 2
        elif a in IGNORED_FLAGS:
            i += 1
        elif a in IGNORED_VALUES:
            i += 2
        elif a == "--hf-repo":
            if val not in MODELS:
                print(f"llama_server_shim: model {val} is not available offline", file=sys.stderr)
                return 2
            model = os.path.join(testdata, "models", MODELS[val])
            i += 2
        elif a in ("--model", "-m"):
            model = val
            i += 2
        elif a == "--reasoning-format":
            out += ["--reasoning-format", "none" if val == "none" else "auto"]
            i += 2
        else:
            print(f"llama_server_shim: llama-server flag {a} has no ferry equivalent", file=sys.stderr)
            return 2
    if not model:
        print("llama_server_shim: no model", file=sys.stderr)
        return 2
    out += ["--model", model]
    print("llama_server_shim: " + " ".join(out), file=sys.stderr, flush=True)
    os.execv(out[0], out)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
