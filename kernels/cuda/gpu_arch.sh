#!/bin/sh
# gpu_arch.sh — the CUDA architectures to build ferry's kernels for, as meson's -Dgpu_arch=auto chooses them.
#
#   sh kernels/cuda/gpu_arch.sh [--default] [NVCC]      prints e.g. "86" or "80,86,89,90,100,120" on stdout
#
# The compute capabilities of the GPUs present (nvidia-smi --query-gpu=compute_cap), 8.0 or newer; without
# such a GPU, or with --default (what tests/cuda_arch_check.sh compiles), a set covering sm_80 through sm_120
# (A100, RTX 30xx/A10, RTX 40xx/L4, H100/H200, B200, RTX 50xx), less what NVCC cannot build
# (nvcc --list-gpu-arch). A GPU older than 8.0 is named on stderr: the kernels need sm_80 (bf16 mma.sync,
# cp.async).
look=1
if [ "${1:-}" = --default ]; then
  look=0
  shift
fi
nvcc=${1:-nvcc}
found=""
if [ $look = 1 ] && command -v nvidia-smi >/dev/null 2>&1; then
  for cc in $(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | tr -d ' .\r' | sort -un); do
    case $cc in
    *[!0-9]* | "") continue ;;
    esac
    if [ "$cc" -lt 80 ]; then
      echo "gpu_arch.sh: a GPU of compute capability $cc is too old for ferry's CUDA kernels (8.0 or newer)" >&2
      continue
    fi
    found="$found${found:+,}$cc"
  done
fi
if [ -n "$found" ]; then
  echo "$found"
  exit 0
fi
supported=$("$nvcc" --list-gpu-arch 2>/dev/null | sed -n 's/^compute_\([0-9]*\)$/\1/p')
set=""
for a in 80 86 89 90 100 120; do
  if [ -z "$supported" ] || echo "$supported" | grep -qx "$a"; then
    set="$set${set:+,}$a"
  fi
done
echo "$set"
