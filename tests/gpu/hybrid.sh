#!/bin/bash
# hybrid.sh — on the GPU machine: hybrid placement (host layers streamed or computed by the host's cores, per step size).
# Builds ferry, runs the runtime suite and the GPU end-to-end tests (hybrid plans against the CPU engine), the
# host-memory and CPU-matmul measurements, then `ferry bench --synthetic llama-2-7b --gpu-memory 4GiB` with
# --placement stream|cpu|auto (f16) and the Q8_0 cases, and prints a compact table last: measured tokens/s,
# the plan's predicted step time against the measured one, and the targets. Full logs go to $OUT.
# Expected to take 6-8 minutes on the H200 machine (16 cores); not run yet. (Q8_0 streaming alone was measured in
# run 6e: 12.2 tok/s at b=1, 195.3 at b=16.)
#
#   tests/gpu/hybrid.sh [--no-tests] [--quick]      (--quick: f16 auto and stream only)
set -u
src=$(pwd)
out=${OUT:-$src/out}
mkdir -p "$out"
tests=1 quick=0
for a in "$@"; do
  case $a in
  --no-tests) tests=0 ;;
  --quick) quick=1 ;;
  esac
done
t_start=$(date +%s)
log() { echo "== [$(($(date +%s) - t_start)) s] $*" | tee -a "$out/summary.txt"; }

. tests/gpu/deps.sh
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > "$out/machine.txt" 2>&1
lscpu | grep -E "Model name|^CPU\(s\)|Thread|NUMA node|L3" >> "$out/machine.txt"
log "machine: $(head -1 "$out/machine.txt"); $(grep 'Model name' "$out/machine.txt" | tr -s ' ')"

work=/tmp/ferry-hybrid
rm -rf "$work" && mkdir -p "$work"
# The working tree as sent (the device's copy may carry a .git of an older commit, so never `git archive`).
tar -C "$src" --exclude='./build*' --exclude=./.debs --exclude=./out --exclude=./.git --exclude='./.dev-*' \
  --exclude=./.whl --exclude=./.gpu-data -cf - . | tar -C "$work" -xf -
cd "$work" || exit 1
[ -d "$src/.gpu-data" ] && mkdir -p ../shared && rm -rf ../shared/testdata && cp -r "$src/.gpu-data" ../shared/testdata

if ! meson setup build -Dcuda=enabled -Dnative=true -Dbuildtype=release > "$out/build.log" 2>&1; then
  log "meson setup FAILED"; tail -30 "$out/build.log"; exit 1
fi
targets="server/ferry tests/runtime/test_gpu_e2e tests/runtime/bench_host_memory tests/runtime/bench_host_layer tests/bench/bench_cpu_matmul"
for t in golden engine device_map step_plan ring host_layers; do targets="$targets tests/runtime/test_$t"; done
if ! ninja -C build $targets >> "$out/build.log" 2>&1; then
  log "build FAILED"; grep -E "error" "$out/build.log" | head -30; exit 1
fi
log "build ok"

rc=0
if [ $tests = 1 ]; then
  meson test -C build --no-rebuild --print-errorlogs --num-processes 4 runtime_golden runtime_engine \
    runtime_device_map runtime_step_plan runtime_ring runtime_host_layers > "$out/tests.log" 2>&1
  rc=$?
  log "runtime tests rc=$rc: $(grep -E '^(Ok|Fail|Skipped|Timeout):' "$out/tests.log" | tr -s ' ' | tr '\n' ' ')"
  # The GPU end-to-end tests, with their diagnostics (each hybrid configuration's worst error and plan).
  FERRY_SRC=$work FERRY_TESTDATA=$work/../shared/testdata timeout 400 ./build/tests/runtime/test_gpu_e2e --verbose \
    > "$out/gpu_e2e.log" 2>&1
  r=$?
  [ $r != 0 ] && rc=$r
  log "gpu_e2e rc=$r"
  grep -E "FAIL|note:|Assertion|differs|Synthesis" "$out/gpu_e2e.log" | head -60 | tee -a "$out/summary.txt"
fi

# Host memory: read and copy rates per kind of pinned memory, and both at once; one 7B layer on the host's
# pinned threads (F16, BF16, Q8_0 at 1..64 tokens) against its streaming read; the CPU matmul kernels per type.
timeout 60 ./build/tests/runtime/bench_host_memory 0 1024 > "$out/host.txt" 2>&1
timeout 90 ./build/tests/runtime/bench_host_layer 0 >> "$out/host.txt" 2>&1
cat "$out/host.txt" | tee -a "$out/summary.txt"
timeout 90 ./build/tests/bench/bench_cpu_matmul "$(nproc)" > "$out/cpu_matmul.txt" 2>&1
grep -iE "ceiling|f16|bf16|q8_0|q4_k|q6_k|q4_0" "$out/cpu_matmul.txt" | head -20 | tee -a "$out/summary.txt"

B=./build/server/ferry
: > "$out/bench.jsonl"
bench() { # name, args...
  local name=$1; shift
  echo "### $name: ferry bench $*" >> "$out/bench.txt"
  timeout 200 $B bench "$@" --json > /tmp/bench.json 2>> "$out/bench.txt"
  local r=$?
  cat /tmp/bench.json >> "$out/bench.txt"
  python3 -c "import json,sys; d=json.load(open('/tmp/bench.json')); d['name']=sys.argv[1]; print(json.dumps(d))" \
    "$name" >> "$out/bench.jsonl" 2>/dev/null
  log "bench $name rc=$r"
}
M="--synthetic llama-2-7b --gpu-memory 4GiB --batches 1,16 --decode-steps 8"
bench f16-auto $M --placement auto --prefill 512
bench f16-stream $M --placement stream --prefill 512
if [ $quick = 0 ]; then
  bench f16-cpu $M --placement cpu --prefill 512
  bench q8-auto $M --quant int8 --placement auto --prefill 512
  bench q8-cpu $M --quant int8 --placement cpu --prefill 0
fi
# The plans the runs chose (from the engine's log lines).
grep -E "step plan|tokens: |layers at|cost model|device_map:|host layers" "$out/bench.txt" | head -80 >> "$out/plans.txt"

python3 - "$out/bench.jsonl" <<'PY' | tee -a "$out/summary.txt"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
target = {("f16", 1): 12.0, ("f16", 16): 81.0, ("q8", 1): 30.0}
print()
print("%-11s %6s %9s %9s %9s %9s %7s %9s %s" % ("run", "batch", "tok/s", "step ms", "pred ms", "pred err", "cpu/st",
                                               "host ms", "target"))
for r in rows:
    kind = r["name"].split("-")[0]
    for d in r.get("decode", []):
        b = d["batch"]
        pred, ms = d.get("predicted_step_ms", 0), d["step_ms"]
        err = "%+.0f%%" % (100 * (pred - ms) / ms) if pred and ms else "-"
        t = target.get((kind, b))
        tgt = ("%.0f %s" % (t, "ok" if d["tok_s"] >= t else "MISSED")) if t and r["name"].endswith("auto") else ""
        print("%-11s %6d %9.1f %9.2f %9.2f %9s %7s %9.2f %s" % (r["name"], b, d["tok_s"], ms, pred, err,
              "%d/%d" % (d.get("cpu_layers", 0), d.get("streamed_layers", 0)), d.get("host_ms_per_step", 0), tgt))
    if r.get("prefill_tokens"):
        p = r["prefill_tok_s"]
        tgt = ("2700 %s" % ("ok" if p >= 2700 else "MISSED")) if r["name"] == "f16-auto" else ""
        pred = r.get("prefill_predicted_ms", 0)
        print("%-11s %6s %9.0f %9s %9.2f %9s %7s %9s %s" % (r["name"], "pf512", p, "-", pred, "-",
              "%d/-" % r.get("prefill_cpu_layers", 0), "-", tgt))
print("(link ceiling %.1f GB/s, HBM %.0f GB/s; targets: f16 b=1 >= 12, b=16 >= 81, prefill 512 >= 2,700,"
      " q8 b=1 >= 30 tok/s; prediction within 15%% at b=1 and b=16)" % (
      rows[0].get("ceiling_h2d_gbs", 0) if rows else 0, rows[0].get("ceiling_hbm_gbs", 0) if rows else 0))
PY
log "done"
exit $rc
