#!/bin/bash
# gpu_check.sh — on a GPU machine: build the CUDA kernels, their tests and benches, run the 'cuda' test suite
# and the benches, and save every log to $OUT (./out when OUT is unset).
#
# Run from the repository root: tests/cuda/gpu_check.sh [--build-only] [--no-bench] [--sanitize]
# (BENCH_REPEAT=1 runs the bench a second time with 7 samples and prints both side by side.)
# If ./.debs holds the packages of ../shared/tools/offline-debs.sh (a host with no package access), they are
# unpacked into /opt/deps as that script's header says. The build runs on a copy of the tree in /tmp, where
# tests/bench_cuda is wired into tests/meson.build if the checkout does not do it yet; the checkout is not
# touched. Only this module's targets are built, so unfinished modules elsewhere do not stop it.
set -u
src=$(pwd)
out=${OUT:-$src/out}
mkdir -p "$out"
build_only=0 bench=1 sanitize=0
for a in "$@"; do
    case $a in
    --build-only) build_only=1 ;;
    --no-bench) bench=0 ;;
    --sanitize) sanitize=1 ;;
    *) echo "gpu_check.sh: unknown option $a" >&2; exit 2 ;;
    esac
done
log() { echo "== $*" | tee -a "$out/summary.txt"; }

. tests/gpu/deps.sh

{ date -u; uname -a; nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem,clocks.max.sm,power.limit --format=csv 2>&1; nvcc --version 2>&1 | tail -2; } > "$out/machine.txt"
log "machine: $(sed -n 3p "$out/machine.txt")"

work=/tmp/ferry-gpu-src
rm -rf "$work" && mkdir -p "$work"
tar -C "$src" --exclude='./build*' --exclude=./.debs --exclude=./out --exclude=./.git --exclude='./.dev-*' \
    --exclude=./.whl --exclude=./.gpu-data -cf - . | tar -C "$work" -xf -
grep -q "bench_cuda" "$work/tests/meson.build" || echo "subdir('bench_cuda')" >> "$work/tests/meson.build"
cd "$work" || exit 1

if ! meson setup build -Dcuda=enabled -Dtests=enabled -Dserver=disabled > "$out/setup.log" 2>&1; then
    log "meson setup FAILED (see setup.log)"; tail -30 "$out/setup.log"; exit 1
fi
targets="tests/cuda/test_cuda_ops tests/cuda/test_cuda_matmul tests/cuda/test_cuda_attention tests/cuda/test_cuda_gemv_q8 tests/cuda/test_cuda_matmul_q tests/cuda/test_qblock tests/cuda/test_cuda_moe tests/bench_cuda/bench_cuda tests/bench_cuda/bench_moe"
if ! ninja -C build $targets > "$out/build.log" 2>&1; then
    log "build FAILED (see build.log)"; grep -E "error" "$out/build.log" | head -30; exit 1
fi
log "build ok"
[ $build_only = 1 ] && exit 0

# By name: the 'cuda' suite also holds other modules' GPU tests (tests/runtime), which this script does not build.
meson test -C build --no-rebuild --print-errorlogs cuda_ops cuda_matmul cuda_attention cuda_gemv_q8 cuda_matmul_q qblock cuda_moe > "$out/tests.log" 2>&1
rc=$?
log "tests rc=$rc: $(grep -E '^(Ok|Fail|Skipped|Timeout):' "$out/tests.log" | tr -s ' ' | tr '\n' ' ')"
for t in ops matmul attention gemv_q8 matmul_q moe; do
    ./build/tests/cuda/test_cuda_$t --verbose 2>&1 | grep -E "FAIL|SKIP|Synthesis|Assertion" | head -5 >> "$out/summary.txt"
done

if [ $sanitize = 1 ] && command -v compute-sanitizer >/dev/null; then
    timeout 60 compute-sanitizer --tool memcheck ./build/tests/cuda/test_cuda_ops > "$out/sanitize.log" 2>&1
    echo "memcheck ops rc=$?" >> "$out/sanitize.log"
    timeout 60 compute-sanitizer --tool memcheck ./build/tests/cuda/test_cuda_attention --filter 'cuda_attention/small_and_wide_heads' >> "$out/sanitize.log" 2>&1
    echo "memcheck attention rc=$?" >> "$out/sanitize.log"
    timeout 90 compute-sanitizer --tool racecheck ./build/tests/cuda/test_cuda_attention --filter 'cuda_attention/small_and_wide_heads' >> "$out/sanitize.log" 2>&1
    echo "racecheck attention rc=$?" >> "$out/sanitize.log"
    timeout 90 compute-sanitizer --tool memcheck ./build/tests/cuda/test_cuda_matmul --filter 'cuda_matmul/gemv_*' >> "$out/sanitize.log" 2>&1
    echo "memcheck matmul rc=$?" >> "$out/sanitize.log"
    timeout 90 compute-sanitizer --tool racecheck ./build/tests/cuda/test_cuda_matmul --filter 'cuda_matmul/gemv_tensor_core_splits' >> "$out/sanitize.log" 2>&1
    echo "racecheck matmul rc=$?" >> "$out/sanitize.log"
    timeout 120 compute-sanitizer --tool memcheck ./build/tests/cuda/test_cuda_moe --filter 'cuda_moe/layer_resident*' >> "$out/sanitize.log" 2>&1
    echo "memcheck moe rc=$?" >> "$out/sanitize.log"
    log "sanitizer: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY| rc=' "$out/sanitize.log" | tr '\n' ' ')"
fi

if [ $bench = 1 ]; then
    timeout 150 ./build/tests/bench_cuda/bench_cuda > "$out/bench.log" 2>&1
    log "bench rc=$?"
    { timeout 120 ./build/tests/bench_cuda/bench_moe; timeout 120 ./build/tests/bench_cuda/bench_moe --host; } > "$out/bench_moe.log" 2>&1
    log "bench_moe rc=$?"
    cat "$out/bench_moe.log"
    if [ "${BENCH_REPEAT:-0}" = 1 ]; then
        timeout 100 ./build/tests/bench_cuda/bench_cuda --quick > "$out/bench2.log" 2>&1
        log "bench (repeat, 7 samples) rc=$?"
        paste -d'|' <(cut -c1-80 "$out/bench.log") <(cut -c35-80 "$out/bench2.log")
    else
        cat "$out/bench.log"
    fi
fi
cat "$out/summary.txt"
exit $rc
