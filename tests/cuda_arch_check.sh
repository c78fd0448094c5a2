#!/usr/bin/env bash
# cuda_arch_check.sh — compile the device code of every CUDA kernel (kernels/cuda/*.cu) for every architecture of
# the default build set (kernels/cuda/gpu_arch.sh --default), so that what only some architectures compile (the
# __CUDA_ARCH__ >= 900 branches of pdl.h; inline PTX such as cp.async, ldmatrix, mma.sync or griddepcontrol,
# which ptxas accepts only from some sm_ on) is checked on a machine with no GPU, or with GPUs of one kind.
#
#   bash tests/cuda_arch_check.sh [BUILD_DIR]
#
# Each (source, architecture) pair is compiled to a cubin, device code only: the front end with that
# __CUDA_ARCH__, cicc, and ptxas for that sm_, with --Ofast-compile=max (nvcc 12.8 or newer; an older one
# compiles at -O3): optimizations off, which the errors that differ between architectures (an identifier, an
# intrinsic, an instruction) do not depend on. ptxas is needed: PTX alone (-arch=compute_80 -ptx) keeps inline
# PTX that sm_80 lacks, such as griddepcontrol, without a word. The architectures BUILD_DIR's build already compiles
# (its -gencode code=sm_XX) are left out: the build compiled those at -O3. One job per core. Exit status 1 on any
# compile error, with nvcc's first messages; 0 when all compiled, and 0 with a SKIP line when there is no nvcc
# (NVCC, PATH, /usr/local/cuda/bin) or BUILD_DIR is not a build with CUDA.
#
# CPU time of the 12 sources for sm_80, measured 2026-12-07 on a 2-core Debian 12 VM, nvcc 13.0.88, commit
# f5db5fd: -O3 cubin 191 s, -O3 PTX only 130 s, --Ofast-compile=max cubin 31 s, --Ofast-compile=max PTX only
# 14 s. The whole check beside an sm_90 build (sm_80, 86, 89, 100, 120): 157 CPU-s, 239 s of wall time on that
# VM while other jobs kept its load at 3.5 to 6, about 80 s on two idle cores.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
build=${1:-}
say() { echo "cuda_arch_check: $*"; }

nvcc=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
if [[ ! -x $nvcc ]]; then
  say "SKIP: no nvcc (NVCC, PATH, /usr/local/cuda/bin): the CUDA kernels are not compiled for any architecture"
  exit 0
fi
built=""
if [[ -n $build ]]; then
  if ! grep -q 'FERRY_CUDA=1' "$build/build.ninja" 2>/dev/null; then
    say "SKIP: $build is not a build with CUDA (its meson-logs say which of nvcc, cudart, cuBLAS is missing)"
    exit 0
  fi
  built=$(grep -o 'code=sm_[0-9]*' "$build/build.ninja" | sed 's/code=sm_//' | sort -u)
fi
archs=()
for a in $(sh kernels/cuda/gpu_arch.sh --default "$nvcc" | tr ',' ' '); do
  grep -qx "$a" <<<"$built" || archs+=("$a")
done
if ((${#archs[@]} == 0)); then
  say "every architecture of the default set is compiled by $build: nothing to check"
  exit 0
fi
fast=()
[[ $("$nvcc" --help) == *--Ofast-compile* ]] && fast=(--Ofast-compile=max)

# Largest sources first, so that the last jobs to start are short.
mapfile -t srcs < <(ls -S kernels/cuda/*.cu)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
compile_one() { # ARCH SOURCE
  local out
  out="$tmp/sm_$1_$(basename "$2" .cu)"
  if "$nvcc" "${fast[@]}" -arch="sm_$1" -cubin --std=c++17 -DNDEBUG -DFERRY_CUDA=1 -I. -o "$out.cubin" "$2" \
    >"$out.log" 2>&1; then
    rm -f "$out.cubin"
    return 0
  fi
  echo "FAIL: sm_$1 $2"
  head -n 12 "$out.log"
  (($(wc -l <"$out.log") > 12)) && echo "... ($(wc -l <"$out.log") lines of nvcc messages in all)"
  return 1
}
jobs=$(nproc)
names=$(printf 'sm_%s ' "${archs[@]}")
say "compiling ${#srcs[@]} sources for ${names% } (${fast[*]:-no --Ofast-compile in this nvcc}), $jobs at a time"
start=$SECONDS
failed=0
running=0
for a in "${archs[@]}"; do
  for f in "${srcs[@]}"; do
    compile_one "$a" "$f" &
    running=$((running + 1))
    if ((running >= jobs)); then
      wait -n || failed=$((failed + 1))
      running=$((running - 1))
    fi
  done
done
while ((running > 0)); do
  wait -n || failed=$((failed + 1))
  running=$((running - 1))
done
if ((failed)); then
  say "FAIL: $failed of $((${#srcs[@]} * ${#archs[@]})) compilations failed ($((SECONDS - start)) s)"
  exit 1
fi
say "OK: ${#srcs[@]} sources for ${names% } in $((SECONDS - start)) s"
