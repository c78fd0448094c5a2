#!/bin/bash
# attn_sample.sh — on a GPU machine: build only the attention and sampler tests and bench_attn, run them, then
# run the small cases under compute-sanitizer memcheck and racecheck while time is left, printing a compact
# summary after each stage (so a run cut short by the device's 10-minute limit still reports what it did).
# Full logs go to $OUT (./out when unset): setup.log, build.log, test_*.log, bench.log, sanitize.log.
#
# Run from the repository root: tests/gpu/attn_sample.sh [--no-sanitize] [--no-bench] [--quick]
# (--quick: bench_attn --quick.) The build directory build-attn is kept between runs on the same machine.
# Budget: the sanitizer stage starts only if less than SANITIZE_AFTER_S (default 380) seconds have passed.
set -u
src=$(pwd)
out=${OUT:-$src/out}
mkdir -p "$out"
sanitize=1 bench=1 quick=
for a in "$@"; do
    case $a in
    --no-sanitize) sanitize=0 ;;
    --no-bench) bench=0 ;;
    --quick) quick=--quick ;;
    *) echo "attn_sample.sh: unknown option $a" >&2; exit 2 ;;
    esac
done
start=$(date +%s)
elapsed() { echo $(( $(date +%s) - start )); }

. tests/gpu/deps.sh
{ date -u; nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv 2>&1;
  nvcc --version 2>&1 | tail -2; } > "$out/machine.txt"

b=build-attn
if [ ! -f $b/build.ninja ] && ! meson setup $b -Dcuda=enabled -Dtests=enabled -Dserver=disabled > "$out/setup.log" 2>&1; then
    echo "meson setup FAILED (setup.log)"; tail -30 "$out/setup.log"; exit 1
fi
if ! ninja -C $b tests/cuda/test_cuda_attention tests/cuda/test_cuda_sample tests/runtime/test_sampler \
    tests/bench_cuda/bench_attn > "$out/build.log" 2>&1; then
    echo "build FAILED (build.log)"; grep -E "error" "$out/build.log" | head -30; exit 1
fi
echo "== $(sed -n 2p "$out/machine.txt") | built in $(elapsed)s"

rc=0
for t in sampler_cpu:runtime/test_sampler cuda_sample:cuda/test_cuda_sample cuda_attention:cuda/test_cuda_attention; do
    name=${t%%:*}
    timeout 240 "$b/tests/${t#*:}" --verbose > "$out/test_$name.log" 2>&1 || rc=1
    echo "-- $name ($(elapsed)s): $(grep -E 'Synthesis' "$out/test_$name.log" | tail -1)"
    grep -E '^\[FAIL\]|Assertion|^FAIL ' "$out/test_$name.log" | head -12
    grep -E '^prefill D ' "$out/test_$name.log"
done

if [ $bench = 1 ]; then
    timeout 200 $b/tests/bench_cuda/bench_attn $quick > "$out/bench.log" 2>&1
    echo "bench rc=$?" >> "$out/bench.log"
    echo "-- bench ($(elapsed)s; full table in bench.log):"
    grep -E '^prefill |ratio|rc=' "$out/bench.log"
    sed -n '/== summary/,$p' "$out/bench.log"
fi

if [ $sanitize = 1 ]; then
    : > "$out/sanitize.log"
    if ! command -v compute-sanitizer > /dev/null; then
        echo "compute-sanitizer not found" >> "$out/sanitize.log"
    else
        for tool in memcheck racecheck; do
            for t in "cuda_attention:cuda_attention/mixed_small" "cuda_sample:cuda_sample/small_batch"; do
                if [ "$(elapsed)" -gt "${SANITIZE_AFTER_S:-380}" ]; then
                    echo "### $tool ${t#*:} skipped: out of time" >> "$out/sanitize.log"
                    continue
                fi
                echo "### $tool ${t#*:}" >> "$out/sanitize.log"
                timeout 100 compute-sanitizer --tool $tool "$b/tests/cuda/test_${t%%:*}" --filter "${t#*:}" -j1 \
                    >> "$out/sanitize.log" 2>&1
                echo "### rc=$?" >> "$out/sanitize.log"
            done
        done
    fi
    echo "-- sanitizer ($(elapsed)s):"
    grep -E '^### |ERROR SUMMARY|RACECHECK SUMMARY|not found' "$out/sanitize.log" | paste -sd' ' | sed 's/### /\n  /g'
    echo
fi
exit $rc
