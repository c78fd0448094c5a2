#!/bin/bash
# attn_sample.sh — on a GPU machine: build only the attention and sampler tests and bench_attn, run them (the
# small cases also under compute-sanitizer memcheck and racecheck), and print a compact table last. Full logs
# go to $OUT (./out when unset): setup.log, build.log, test_*.log, sanitize.log, bench.log.
#
# Run from the repository root: tests/gpu/attn_sample.sh [--no-sanitize] [--no-bench] [--quick]
# (--quick: bench_attn --quick.) The build directory build-attn is kept between runs on the same machine.
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

. tests/gpu/deps.sh
{ date -u; nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv 2>&1;
  nvcc --version 2>&1 | tail -2; } > "$out/machine.txt"

b=build-attn
if [ ! -f $b/build.ninja ] && ! meson setup $b -Dcuda=enabled -Dtests=enabled -Dserver=disabled > "$out/setup.log" 2>&1; then
    echo "meson setup FAILED (setup.log)"; tail -30 "$out/setup.log"; exit 1
fi
t0=$(date +%s)
if ! ninja -C $b tests/cuda/test_cuda_attention tests/cuda/test_cuda_sample tests/runtime/test_sampler \
    tests/bench_cuda/bench_attn > "$out/build.log" 2>&1; then
    echo "build FAILED (build.log)"; grep -E "error" "$out/build.log" | head -30; exit 1
fi
build_s=$(( $(date +%s) - t0 ))

rc=0
run_test() { # name, executable: full verbose log to $out, rc accumulated
    timeout 900 "$2" --verbose > "$out/test_$1.log" 2>&1 || rc=1
}
run_test sampler_cpu $b/tests/runtime/test_sampler
run_test cuda_sample $b/tests/cuda/test_cuda_sample
run_test cuda_attention $b/tests/cuda/test_cuda_attention

if [ $sanitize = 1 ] && command -v compute-sanitizer > /dev/null; then
    : > "$out/sanitize.log"
    for tool in memcheck racecheck; do
        for t in "cuda_attention:cuda_attention/mixed_small" "cuda_sample:cuda_sample/small_batch"; do
            exe=$b/tests/cuda/test_${t%%:*}
            echo "### $tool ${t#*:}" >> "$out/sanitize.log"
            timeout 300 compute-sanitizer --tool $tool "$exe" --filter "${t#*:}" -j1 >> "$out/sanitize.log" 2>&1
            echo "### rc=$?" >> "$out/sanitize.log"
        done
    done
elif [ $sanitize = 1 ]; then
    echo "compute-sanitizer not found" > "$out/sanitize.log"
fi

if [ $bench = 1 ]; then
    timeout 600 $b/tests/bench_cuda/bench_attn $quick > "$out/bench.log" 2>&1
    echo "bench rc=$?" >> "$out/bench.log"
fi

# The compact table (the part of the output that survives truncation).
echo "== $(sed -n 2p "$out/machine.txt") | build ${build_s}s"
for t in sampler_cpu cuda_sample cuda_attention; do
    echo "-- $t: $(grep -E 'Synthesis' "$out/test_$t.log" | tail -1)"
    grep -E '^\[FAIL\]|Assertion|^FAIL ' "$out/test_$t.log" | head -12
    grep -E '^prefill D ' "$out/test_$t.log"
done
if [ $sanitize = 1 ]; then
    echo "-- sanitizer:"
    grep -E '^### |ERROR SUMMARY|RACECHECK SUMMARY|not found' "$out/sanitize.log" | paste -sd' ' | sed 's/### /\n  /g'
    echo
fi
if [ $bench = 1 ]; then
    echo "-- bench (full table in bench.log):"
    grep -E '^prefill |ratio' "$out/bench.log"
    sed -n '/== summary/,$p' "$out/bench.log"
fi
exit $rc
