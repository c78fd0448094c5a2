#!/usr/bin/env bash
# Builds every tests/fuzz/fuzz_*.c as a libFuzzer target (ASan + UBSan) and runs each for SECONDS seconds.
#
#   tests/fuzz/run.sh SECONDS [NAME...]     e.g. tests/fuzz/run.sh 60, tests/fuzz/run.sh 10 fuzz_gguf
#
# Each target declares what it links in comment lines near its top (paths relative to the repo root):
#   // SOURCES: weights/gguf.c kernels/core/status.c ...
#   // LIBS: -ljansson -lm
#   // CFLAGS: -march=native    (optional, extra compiler flags)
# (a key may repeat on several lines, to stay within the 110-column format; the values are joined)
#   // MAXLEN: 65536            (optional, default 65536)
# Seeds come from tests/fuzz/corpus/NAME/ (copied, so new inputs stay in build-fuzz/); a dictionary from
# tests/fuzz/NAME.dict if present. Crash inputs land in build-fuzz/artifacts/.
# A target whose test data is missing (a model, a vocab) says so on stderr in a line holding "nothing is
# exercised"; it is then reported SKIPPED with that line, never "ok" (its runs checked nothing).
# Exit status: 0 when every target built and ran clean (skipped ones included, each named in the summary),
# 1 when one crashed or failed to build, 77 (skip) when clang's libFuzzer is absent or every target skipped.
# Needs: clang and its compiler-rt (Debian/Ubuntu: apt-get install clang libclang-rt-14-dev, or the
# libclang-rt-dev of the installed clang), libjansson-dev.
set -u
SECS=${1:?usage: run.sh SECONDS [NAME...]}
shift
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
OUT=${FUZZ_BUILD:-$ROOT/build-fuzz}
CC=${FUZZ_CC:-clang}
cd "$ROOT" || exit 1
mkdir -p "$OUT/artifacts" "$OUT/corpus"

if ! command -v "$CC" >/dev/null 2>&1; then
    echo "run.sh: $CC not found; skipping fuzzing" >&2
    exit 77
fi
probe=$(mktemp -d)
printf 'int LLVMFuzzerTestOneInput(const unsigned char *d, unsigned long n) { return 0; }\n' >"$probe/p.c"
if ! "$CC" -fsanitize=fuzzer,address,undefined "$probe/p.c" -o "$probe/p" 2>"$probe/log"; then
    echo "run.sh: $CC cannot build libFuzzer targets (install its compiler-rt); skipping:" >&2
    cat "$probe/log" >&2
    rm -rf "$probe"
    exit 77
fi
rm -rf "$probe"

field() { # field FILE NAME: the values of every "// NAME: ..." line in the first 10 lines, joined
    head -n 10 "$1" | sed -n "s|^// $2:[[:space:]]*||p" | tr '\n' ' '
}

status=0
summary=()
ran=0
skipped=0
for src in tests/fuzz/fuzz_*.c; do
    name=$(basename "$src" .c)
    if [ $# -gt 0 ] && ! printf '%s\n' "$@" | grep -qx "$name"; then continue; fi
    sources=$(field "$src" SOURCES)
    libs=$(field "$src" LIBS)
    cflags=$(field "$src" CFLAGS)
    maxlen=$(field "$src" MAXLEN | tr -d ' ')
    maxlen=${maxlen:-65536}
    echo "== $name: building"
    # shellcheck disable=SC2086
    if ! "$CC" -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined -D_GNU_SOURCE \
        -std=gnu17 -I. $cflags $sources "$src" -o "$OUT/$name" $libs; then
        summary+=("$name: BUILD FAILED")
        status=1
        continue
    fi
    corpus="$OUT/corpus/$name"
    mkdir -p "$corpus"
    seeds=()
    [ -d "tests/fuzz/corpus/$name" ] && seeds+=("tests/fuzz/corpus/$name")
    dict=()
    [ -f "tests/fuzz/$name.dict" ] && dict+=("-dict=tests/fuzz/$name.dict")
    echo "== $name: fuzzing for ${SECS}s"
    UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 ASAN_OPTIONS=detect_leaks=1 \
        "$OUT/$name" -max_total_time="$SECS" -rss_limit_mb=1024 -max_len="$maxlen" -timeout=10 \
        -print_final_stats=1 -artifact_prefix="$OUT/artifacts/$name-" "${dict[@]}" "$corpus" "${seeds[@]}" \
        >"$OUT/$name.log" 2>&1
    rc=$?
    execs=$(sed -n 's/^stat::number_of_executed_units:[[:space:]]*//p' "$OUT/$name.log" | tail -n 1)
    if [ $rc -ne 0 ]; then
        summary+=("$name: FAILED (exit $rc), see $OUT/$name.log and $OUT/artifacts/")
        tail -n 40 "$OUT/$name.log"
        status=1
    elif why=$(grep -m 1 'nothing is exercised' "$OUT/$name.log"); then
        summary+=("$name: SKIPPED, its ${execs:-?} runs checked nothing: $why")
        skipped=$((skipped + 1))
    else
        summary+=("$name: ok, ${execs:-?} runs in ${SECS}s")
    fi
    ran=$((ran + 1))
done
echo "== fuzz summary"
printf '  %s\n' "${summary[@]}"
if [ $status -eq 0 ] && [ $ran -gt 0 ] && [ $skipped -eq $ran ]; then exit 77; fi
exit $status
