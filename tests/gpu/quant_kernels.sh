#!/bin/bash
# quant_kernels.sh — on a GPU machine: build only what the quantized CUDA products need (kernels, their tests,
# bench_cuda), run the tests (test_qblock on the CPU, test_cuda_matmul_q with every variant forced,
# test_cuda_matmul, test_cuda_gemv_q8), optionally under compute-sanitizer, then `bench_cuda --quant`; full logs
# go to $OUT, and a compact report is printed last (the tests' verdicts and FAIL lines, the best variant per
# type and m, the table lines for kernels/cuda/matmul.cu, the layer table of the automatic choice).
#
#   tests/gpu/quant_kernels.sh [--sanitize] [--no-bench] [--no-tests]
# Run from the repository root (a copy of the tree is built in /tmp). Expects .debs (../shared/tools/
# offline-debs.sh) beside the tree on a machine with no package access, as tests/gpu/run.sh does.
set -u
src=$(pwd)
out=${OUT:-$src/out}
mkdir -p "$out"
sanitize=0 bench=1 tests=1
for a in "$@"; do
  case $a in
  --sanitize) sanitize=1 ;;
  --no-bench) bench=0 ;;
  --no-tests) tests=0 ;;
  *) echo "quant_kernels.sh: unknown option $a" >&2; exit 2 ;;
  esac
done
report=/tmp/quant_report.txt
: > "$report"
say() { echo "$*" | tee -a "$out/summary.txt" >> "$report"; }
t0=$(date +%s)
el() { echo "$(( $(date +%s) - t0 ))s"; }

. tests/gpu/deps.sh
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv,noheader > "$out/machine.txt" 2>&1
say "machine: $(head -1 "$out/machine.txt"); $(nvcc --version 2>&1 | tail -1)"

work=/tmp/ferry-quant
rm -rf "$work" && mkdir -p "$work"
tar -C "$src" --exclude='./build*' --exclude=./.debs --exclude=./out --exclude=./.git --exclude='./.dev-*' \
  --exclude=./.whl --exclude=./.gpu-data -cf - . | tar -C "$work" -xf -
cd "$work" || exit 1
if ! meson setup build -Dcuda=enabled -Dtests=enabled -Dserver=disabled > "$out/setup.log" 2>&1; then
  say "meson setup FAILED"; tail -30 "$out/setup.log"; cat "$report"; exit 1
fi
targets="tests/cuda/test_qblock tests/cuda/test_cuda_matmul_q tests/cuda/test_cuda_matmul tests/cuda/test_cuda_gemv_q8 tests/bench_cuda/bench_cuda"
if ! ninja -C build $targets > "$out/build.log" 2>&1; then
  say "build FAILED (build.log)"; grep -E "error" "$out/build.log" | head -30 | tee -a "$report"; cat "$report"; exit 1
fi
say "build ok ($(el))"

rc=0
if [ $tests = 1 ]; then
  # Time limits per test (s): a hang costs at most that, and the bench still runs.
  for tl in test_qblock:60 test_cuda_matmul_q:180 test_cuda_matmul:60 test_cuda_gemv_q8:90; do
    t=${tl%%:*}
    timeout ${tl##*:} ./build/tests/cuda/$t --verbose > "$out/$t.log" 2>&1
    r=$?
    [ $r = 0 ] || rc=1
    say "$t rc=$r: $(grep -E 'Synthesis' "$out/$t.log" | tail -1 | sed 's/.*Synthesis: //') ($(el))"
    grep -E "^FAIL |\[FAIL\]|Assertion|CRASH|Timeout" "$out/$t.log" | head -25 | cut -c1-300 >> "$report"
  done
fi
if [ $sanitize = 1 ] && command -v compute-sanitizer > /dev/null; then
  # m = 1, 5, 17, 100 only (QMM_TEST_MS): every kernel and configuration, in reasonable time.
  for tool in memcheck racecheck; do
    QMM_TEST_MS=1,5,17,100 timeout 400 compute-sanitizer --tool $tool ./build/tests/cuda/test_cuda_matmul_q \
      --filter 'cuda_matmul_q/every_type_every_m_small_n_all_variants' > "$out/sanitize_$tool.log" 2>&1
    say "$tool rc=$?: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$out/sanitize_$tool.log" | tail -1) ($(el))"
  done
fi
if [ $bench = 1 ]; then
  timeout 260 ./build/tests/bench_cuda/bench_cuda --quant > "$out/bench_quant.log" 2>&1
  say "bench rc=$? ($(el))"
fi

# The compact report: tests, then the bench's best variants, table lines and summary (the end of the output is
# what survives).
cat "$report"
[ -f "$out/bench_quant.log" ] && sed -n '/^d2d copy/p;/^== best variant/,$p' "$out/bench_quant.log"
exit $rc
