#!/bin/bash
# fault_cuda.sh — on the GPU machine: fault injection of the CUDA calls (tests/fault). Builds ferry_fault with CUDA
# and runs tests/fault/run_faults.py --class cuda: every cudaMalloc / cudaHostAlloc / cudaMemcpy / cudaMemcpyAsync
# of a server's life (load, a completion with n=2 and logprobs, a streamed chat, /tokenize, the completion again,
# SIGTERM) is made to fail once, one run per call. Each run must end in a refused start (exit 1 and an error line),
# or answers equal to the clean run's or 500/503 JSON errors followed by a correct answer, and exit 0 within 20 s
# of SIGTERM: never a crash, never a hang.
#   pass 1: stories260K fully resident (every call number N, --every)
#   pass 2: a ~0.8 GB random-f16 model with --gpu-memory 400MiB, so layers stream over PCIe during serving
#           (every call site; the streamed copies repeat each step)
#
#   tests/gpu/fault_cuda.sh            (from the tree's root; output in $OUT/fault_cuda.txt)
# Needs .debs and .gpu-data (stories260K.gguf) carried like tests/gpu/run.sh, and .whl (the gguf wheel) for pass 2.
# FERRY_FAULT_PASSES=1 runs pass 1 only.
set -u
src=$(pwd)
out=${OUT:-$src/out}
mkdir -p "$out"
log() { echo "$*" | tee -a "$out/fault_cuda.txt"; }
. tests/gpu/deps.sh
work=/tmp/ferry-fault
rm -rf "$work" && mkdir -p "$work"
# The working tree as sent (the device's copy may carry a .git of an older commit, so never `git archive`).
tar -C "$src" --exclude='./build*' --exclude=./.debs --exclude=./.git --exclude='./.dev-*' --exclude=./.gpu-data \
  --exclude=./.whl --exclude=./out -cf - . | tar -C "$work" -xf -
cd "$work" || exit 1
model=$src/.gpu-data/models/stories260K.gguf
[ -f "$model" ] || model=$src/../shared/testdata/models/stories260K.gguf
meson setup build -Dcuda=enabled -Dtests=disabled > /tmp/setup.log 2>&1 &&
  ninja -C build tests/fault/ferry_fault > /tmp/build.log 2>&1 ||
  { tail -n 30 /tmp/setup.log /tmp/build.log | tee -a "$out/fault_cuda.txt"; exit 1; }
log "== pass 1: $model resident, every CUDA call"
python3 tests/fault/run_faults.py --class cuda --every --jobs 1 --binary build/tests/fault/ferry_fault \
  --model "$model" --serve-args "--backend cuda --deterministic" >> "$out/fault_cuda.txt" 2>&1
rc=$?
log "pass 1 rc=$rc"
if [ "${FERRY_FAULT_PASSES:-2}" -ge 2 ]; then
  python3 -m pip install -q --no-index --no-deps --target /tmp/site "$src"/.whl/*.whl 2>/dev/null &&
    export PYTHONPATH=/tmp/site
  if python3 tests/gpu/make_big_gguf.py "$model" /tmp/big.gguf > /tmp/big.log 2>&1; then
    log "== pass 2: /tmp/big.gguf streamed (--gpu-memory 400MiB), every CUDA call site"
    python3 tests/fault/run_faults.py --class cuda --jobs 1 --binary build/tests/fault/ferry_fault \
      --model /tmp/big.gguf --serve-args "--backend cuda --deterministic --gpu-memory 400MiB --kv-tokens 512" \
      >> "$out/fault_cuda.txt" 2>&1
    rc2=$?
    log "pass 2 rc=$rc2"
    [ $rc2 -ne 0 ] && rc=$rc2
  else
    log "pass 2 skipped: cannot write the big model ($(tail -1 /tmp/big.log))"
  fi
fi
grep -E "^(==|   ([0-9]+ runs|coverage|FAIL))" "$out/fault_cuda.txt"
exit $rc
