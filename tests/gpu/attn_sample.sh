#!/bin/bash
# attn_sample.sh — on a GPU machine: build the attention and sampler tests and bench_attn, then, in this order
# (the most diagnostic first, so a run cut short still says what matters):
#   1. compute-sanitizer memcheck on cuda_attention::mma_first_failure (the case the tensor-core kernel's first
#      run failed; every kernel path of a small mixed batch): a fault is reported with its source line;
#   2. the tests: runtime/test_sampler, cuda/test_cuda_sample, cuda/test_cuda_attention (the whole prefill
#      matrix, and the host audit of the kernel's index arithmetic);
#   3. bench_attn (prefill and mixed attention, the sampler);
#   4. racecheck and memcheck on cuda_attention::mixed_small, while the time budget allows.
# A compact summary is printed after each stage; full logs go to $OUT (./out when unset): machine.txt,
# setup.log, build.log, memcheck_first.log, test_*.log, bench.log, sanitize.log.
#
# Run from the repository root: tests/gpu/attn_sample.sh [--no-sanitize] [--no-bench] [--quick]
# (--quick: bench_attn --quick.) The build directory build-attn is kept between runs on the same machine; the
# project's CUDA flags include -lineinfo (meson.build), which the sanitizer needs to name source lines.
# Budget (the device's 10-minute limit; aim: under 6 minutes): stage 4 starts only before SANITIZE_AFTER_S
# (default 270) seconds.
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
lineinfo=$(ninja -C $b -t commands tests/cuda/test_cuda_attention | grep -c -- '-lineinfo.*attention\.cu')
echo "== $(sed -n 2p "$out/machine.txt") | built in $(elapsed)s (attention.cu with -lineinfo: $lineinfo)"

# Prints the sanitizer's summary lines and the first error report (what, where: kernel+offset and
# file:line, which thread and block) from log $1.
sanitizer_report() {
    grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|^### ' "$1" | paste -sd' ' | sed 's/### /\n  /g'; echo
    grep -m1 -A7 -E '^========= (Invalid|Error|Race|Malformed|Out-of-range|Misaligned|Warning)' "$1" |
        grep -vE 'Saved host backtrace|Host Frame' | cut -c1-200
}

rc=0
if [ $sanitize = 1 ]; then
    if ! command -v compute-sanitizer > /dev/null; then
        echo "-- memcheck: compute-sanitizer not found"
    else
        log=$out/memcheck_first.log
        echo "### memcheck cuda_attention/mma_first_failure" > "$log"
        timeout 120 compute-sanitizer --tool memcheck --show-backtrace device --print-limit 8 \
            "$b/tests/cuda/test_cuda_attention" --filter 'cuda_attention/mma_first_failure' -j1 --verbose \
            >> "$log" 2>&1
        echo "### rc=$?" >> "$log"
        echo "-- memcheck mma_first_failure ($(elapsed)s):"
        sanitizer_report "$log"
        grep -E '^FAIL |Synthesis' "$log" | head -6
    fi
fi

for t in cuda_attention:cuda/test_cuda_attention sampler_cpu:runtime/test_sampler cuda_sample:cuda/test_cuda_sample; do
    name=${t%%:*}
    timeout 180 "$b/tests/${t#*:}" --verbose > "$out/test_$name.log" 2>&1 || rc=1
    echo "-- $name ($(elapsed)s): $(grep -E 'Synthesis' "$out/test_$name.log" | tail -1)"
    grep -E '^\[FAIL\]|Assertion|^FAIL ' "$out/test_$name.log" | head -12
    grep -E '^prefill D |^mma audit' "$out/test_$name.log"
done

if [ $bench = 1 ]; then
    timeout 120 stdbuf -oL $b/tests/bench_cuda/bench_attn $quick > "$out/bench.log" 2>&1
    echo "bench rc=$?" >> "$out/bench.log"
    echo "-- bench ($(elapsed)s; full table in bench.log):"
    if grep -q '== summary' "$out/bench.log"; then
        sed -n '/== summary/,$p' "$out/bench.log"
    else
        grep -E '^prefill |ratio|rc=|illegal|error' "$out/bench.log" | head -16
    fi
fi

if [ $sanitize = 1 ] && command -v compute-sanitizer > /dev/null; then
    : > "$out/sanitize.log"
    for tool in racecheck memcheck; do
        if [ "$(elapsed)" -gt "${SANITIZE_AFTER_S:-270}" ]; then
            echo "### $tool mixed_small skipped: out of time" >> "$out/sanitize.log"
            continue
        fi
        echo "### $tool cuda_attention/mixed_small" >> "$out/sanitize.log"
        timeout 90 compute-sanitizer --tool $tool --show-backtrace device --print-limit 8 \
            "$b/tests/cuda/test_cuda_attention" --filter 'cuda_attention/mixed_small' -j1 >> "$out/sanitize.log" 2>&1
        echo "### rc=$?" >> "$out/sanitize.log"
    done
    echo "-- sanitizers on mixed_small ($(elapsed)s):"
    sanitizer_report "$out/sanitize.log"
fi
echo "== done in $(elapsed)s"
exit $rc
