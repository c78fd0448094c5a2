#!/bin/bash
# serve_compare.sh [prepare|run|all] — on the GPU machine: `ferry serve` beside llama-server (built from the
# carried .peers/ copy of ../shared/peers) on the same random Llama-2-7B-shaped F16 GGUF, driven by the same load
# generator (tests/server/loadgen.py: streamed completions of 60-word prompts, 128 tokens out, temperature 0.8,
# closed loop), in one run. The serving table: generated tokens/s, TTFT and ITL percentiles, ratios.
#
#   prepare  build ferry and llama.cpp, write /tmp/cmp/F16.gguf (13.5 GB)             (about 5 minutes)
#   run      each server in turn at concurrency 1, 8, 32, 64 (llama-server: 1, 8, 32) (about 5 minutes)
# Env: SERVE_LEVELS (default 1,8,32,64), SERVE_REQS (requests per level, default 64), FERRY_SERVE_ARGS (extra
# `ferry serve` options, e.g. "--gpu-memory 4GiB"), SERVE_MODEL (a path; default the F16 file), SERVE_PEER=0
# (ferry alone, no llama-server), SERVE_BENCH_ARGS (options of the b=1 reference bench, e.g. "--gpu-memory
# 4GiB"), LLAMA_SERVER_ARGS (default "-ngl 99 -fa -np 32 -c 32768 -cb"; the hybrid
# comparison: FERRY_SERVE_ARGS="--gpu-memory 4GiB --parallel 16 --ctx-size 640" LLAMA_SERVER_ARGS="-ngl 8 -fa
# -np 16 -c 10240 -cb" SERVE_LEVELS=1,16).
set -u
src=$(pwd)
out=${OUT:-$src/out}
mkdir -p "$out"
phase=${1:-all}
W=/tmp/cmp
mkdir -p $W
. tests/gpu/deps.sh
log() { echo "== $*" | tee -a "$out/serve_summary.txt"; }

if [ "$phase" = prepare ] || [ "$phase" = all ]; then
  if [ ! -x $W/ferry/build/server/ferry ] || [ ! -x /tmp/llb/bin/llama-server ]; then
    bash tests/gpu/compare_llamacpp.sh prepare
  fi
  [ -s $W/F16.gguf ] || python3 tests/gpu/make_quant_gguf.py $W/F16.gguf F16 llama-2-7b
  ls -la $W/F16.gguf
fi
[ "$phase" = prepare ] && exit 0

M=${SERVE_MODEL:-$W/F16.gguf}
levels=${SERVE_LEVELS:-1,8,32,64}
reqs=${SERVE_REQS:-64}
wait_up() { # port pid
  for _ in $(seq 1 600); do
    kill -0 "$2" 2>/dev/null || return 1
    [ "$(curl -s -o /dev/null -w '%{http_code}' http://127.0.0.1:$1/health)" = 200 ] && return 0
    sleep 0.5
  done
  return 1
}
load() { # name port levels
  PYTHONUNBUFFERED=1 timeout 280 python3 tests/server/loadgen.py --url http://127.0.0.1:$2 --concurrency "$3" \
    --requests "$reqs" --max-tokens 128 --temperature 0.8 --time-limit 60 --json > $W/load-$1.json 2> $W/load-$1.err
  log "$1 load rc=$?"
}

rm -f $W/load-ferry.json
$W/ferry/build/server/ferry serve --model "$M" --port 18080 --parallel 64 --ctx-size 1024 --public-health \
  ${FERRY_SERVE_ARGS:-} > $W/ferry-serve.log 2>&1 &
fp=$!
if wait_up 18080 $fp; then
  load ferry 18080 "$levels"
  curl -s http://127.0.0.1:18080/metrics > "$out/ferry_metrics.txt"
else
  log "ferry serve did not start: $(tail -3 $W/ferry-serve.log)"
fi
kill -TERM $fp 2>/dev/null
wait $fp
cp $W/ferry-serve.log "$out/" 2>/dev/null

# The engine alone on the same file and options, for the one-client comparison: b=1 at the bench's context (32)
# and at one near the load's (prompt ~390 + up to 128 generated).
$W/ferry/build/server/ferry bench --model "$M" ${SERVE_BENCH_ARGS:-} --batches 1 --prefill 0 --decode-steps 32 \
  --long-context 450 --json > $W/bench-b1.json 2> $W/bench-b1.err &&
  python3 -c "import json,sys; [print(f\"== bench b=1 at context {r['context']}: {r['step_ms']:.3f} ms, {r['tok_s']:.1f} tok/s\") for r in json.load(open(sys.argv[1]))['decode']]" \
    $W/bench-b1.json | tee -a "$out/serve_summary.txt" || log "bench b=1 failed: $(tail -2 $W/bench-b1.err)"

rm -f $W/load-llama.json
if [ "${SERVE_PEER:-1}" = 1 ]; then
  /tmp/llb/bin/llama-server -m "$M" ${LLAMA_SERVER_ARGS:--ngl 99 -fa -np 32 -c 32768 -cb} --port 18082 \
    > $W/llama-server.log 2>&1 &
  lp=$!
  if wait_up 18082 $lp; then
    load llama 18082 "${levels%,64}"
  else
    log "llama-server did not start: $(tail -3 $W/llama-server.log)"
  fi
  kill -TERM $lp 2>/dev/null
  wait $lp
fi

python3 - $W/load-ferry.json $W/load-llama.json <<'PY' | tee -a "$out/serve_summary.txt"
import json, sys
def rd(p):
    try:
        return {r["concurrency"]: r for r in json.load(open(p))}
    except Exception:
        return {}
f, l = rd(sys.argv[1]), rd(sys.argv[2])
print("| concurrency | ferry gen tok/s | llama-server | ratio | ferry TTFT p50 / p99 | ferry ITL p50 / p99 | errors |")
print("|---|---|---|---|---|---|---|")
for c in sorted(set(f) | set(l)):
    a, b = f.get(c), l.get(c)
    ta = a["tokens_per_s"] if a else None
    tb = b["tokens_per_s"] if b else None
    ratio = f"{ta / tb:.2f}x" if ta and tb else "-"
    lat = (f"{a['ttft_p50_s'] * 1e3:.0f} / {a['ttft_p99_s'] * 1e3:.0f} ms | {a['itl_p50_s'] * 1e3:.1f} / "
           f"{a['itl_p99_s'] * 1e3:.1f} ms") if a else "- | -"
    err = f"{a['errors'] if a else '-'} / {b['errors'] if b else '-'}"
    print(f"| {c} | {ta or 0:,.0f} | {tb or 0:,.0f} | {ratio} | {lat} | {err} |")
PY
cp $W/load-ferry.json "$out/serve-ferry.json" 2>/dev/null; cp $W/load-llama.json "$out/serve-llama-server.json" 2>/dev/null; true
