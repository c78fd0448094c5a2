#!/bin/bash
# run.sh — on a GPU machine (the lent H200): build all of ferry with CUDA, run the CUDA and runtime suites
# (kernels vs CPU references, the CUDA engine vs the CPU engine, placements), then `ferry bench` on a
# Llama-2-7B-shaped synthetic model fully resident and with 4 and 8 GiB budgets. Logs go to $OUT.
#
#   tests/gpu/run.sh [--no-bench] [--bench-only] [--build-only]
# Expects .debs (../shared/tools/offline-debs.sh) and optionally .gpu-data (a copy of ../shared/testdata's
# models and goldens) carried beside the tree.
set -u
src=$(pwd)
out=${OUT:-$src/out}
mkdir -p "$out"
bench=1 tests=1
for a in "$@"; do
  case $a in
  --no-bench) bench=0 ;;
  --bench-only) tests=0 ;;
  --build-only) tests=0 bench=0 ;;
  esac
done
log() { echo "== $*" | tee -a "$out/summary.txt"; }

. tests/gpu/deps.sh
nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used,clocks.sm,clocks.mem --format=csv > "$out/machine.txt" 2>&1
log "machine: $(tail -1 "$out/machine.txt")"

work=/tmp/ferry-e2e
rm -rf "$work" && mkdir -p "$work"
# The working tree as sent (the device's copy may carry a .git of an older commit, so never `git archive`).
tar -C "$src" --exclude='./build*' --exclude=./.debs --exclude=./out --exclude=./.git --exclude='./.dev-*' \
  --exclude=./.whl --exclude=./.gpu-data -cf - . | tar -C "$work" -xf -
cd "$work" || exit 1
# The suite reads ../shared/testdata; on this machine a carried copy stands in for it.
[ -d "$src/.gpu-data" ] && mkdir -p ../shared && rm -rf ../shared/testdata && cp -r "$src/.gpu-data" ../shared/testdata

# At most 8 files come back: logs stay in /tmp unless a step fails.
if ! meson setup build -Dcuda=enabled -Dnative=true > /tmp/setup.log 2>&1; then
  cp /tmp/setup.log "$out/"; log "meson setup FAILED"; tail -30 /tmp/setup.log; exit 1
fi
if ! ninja -C build > /tmp/build.log 2>&1; then
  cp /tmp/build.log "$out/"; log "build FAILED"; grep -E "error" /tmp/build.log | head -30; exit 1
fi
log "build ok"

rc=0
if [ $tests = 1 ]; then
  meson test -C build --suite cuda --suite runtime --no-rebuild --print-errorlogs --num-processes 1 > "$out/tests.log" 2>&1
  rc=$?
  log "tests rc=$rc: $(grep -E '^(Ok|Fail|Skipped|Timeout):' "$out/tests.log" | tr -s ' ' | tr '\n' ' ')"
  FERRY_SRC=$work FERRY_TESTDATA=$work/../shared/testdata ./build/tests/runtime/test_gpu_e2e --verbose 2>&1 |
    grep -E "PASS|FAIL|SKIP|WARN|note:|Assertion|differs|Synthesis" | head -40 | tee -a "$out/summary.txt"
  ./build/server/ferry run --model ../shared/testdata/models/stories260K.gguf --prompt-tokens 1,403,407,261,378 \
    --max-tokens 32 --temperature 0 --json --log-level info > /tmp/run_gpu.json 2> /tmp/run_gpu.err
  log "ferry run on GPU: $(head -c 400 /tmp/run_gpu.json) $(tail -1 /tmp/run_gpu.err)"
fi
if [ $bench = 1 ]; then
  B=./build/server/ferry
  bench() { # name, args...
    local name=$1; shift
    echo "### ferry bench $*" >> "$out/bench.txt"
    timeout 280 $B bench "$@" >> "$out/bench.txt" 2>&1; log "bench $name rc=$?"
  }
  if [ "${FERRY_GPU_QUICK:-0}" = 1 ]; then # the short set, for a nearly spent device budget
    bench full --synthetic llama-2-7b --batches 1,16,64 --prefill 512 --decode-steps 16 --long-context 8192
    bench 4GiB-int8 --synthetic llama-2-7b --gpu-memory 4GiB --quant int8 --batches 1,16 --prefill 512 --decode-steps 6
  else
    bench full --synthetic llama-2-7b --batches 1,4,16,64 --prefill 512 --decode-steps 16 --long-context 8192
    bench 4GiB --synthetic llama-2-7b --gpu-memory 4GiB --batches 1,4,16 --prefill 512 --decode-steps 6
    bench 8GiB --synthetic llama-2-7b --gpu-memory 8GiB --batches 1,16 --prefill 512 --decode-steps 6
    bench 4GiB-int8 --synthetic llama-2-7b --gpu-memory 4GiB --quant int8 --batches 1,16 --prefill 512 --decode-steps 6
  fi
  grep -v "^[0-9:.]* info\|  layers" "$out/bench.txt"
fi
exit $rc
