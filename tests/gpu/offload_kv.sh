#!/bin/bash
# offload_kv.sh — on the GPU machine, in one run: offloaded serving. ferry (CUDA) is built by
# all.sh (only server/ferry unless a build is there), random Llama-2-7B-shaped GGUFs are written
# (tests/gpu/make_quant_gguf.py, kept in /tmp/cmp), then per file:
#   ferry bench --gpu-memory 4GiB, b=1 and 16 at context 32, b=1 at 520 (the load's prompt + output), b=16 at
#   450 (--context: the KV pool sized as serve sizes it, with its extension in host memory);
#   16 clients of the serving load (tests/server/loadgen.py: ~390-token prompts, 128 out, temperature 0.8,
#   32 requests) against `ferry serve --gpu-memory 4GiB --parallel 16 --ctx-size 640`.
# Env: OFFLOAD_TYPES (default "F16 Q8_0"), OFFLOAD_ARGS (extra options for both bench and serve),
# OFFLOAD_MODES (default "host": FERRY_KV_EXT_ATTN for each run in turn; "device" reads the pool's extension
# over the link as before 2026-12-02d), OFFLOAD_BENCH (default 1; 0 skips ferry bench), OFFLOAD_TAG (a suffix for
# the output files: runs with other OFFLOAD_ARGS in one call, e.g. OFFLOAD_ARGS="--kv-type q8_0" OFFLOAD_TAG=-kvq8),
# OFFLOAD_TIME (the load's time limit in seconds, default 90), OFFLOAD_ROUNDS (default 1) and OFFLOAD_VARIANTS
# (default "-": the server as is; else a list of environment assignments, "-" for none, e.g. "- FERRY_PLAN_ADAPT=0"):
# each round serves the load once per variant, in turn, so that an A/B alternates on one machine (a host's
# run-to-run spread was ~20% on 2026-12-06b, more than the effects measured).
# Output: $OUT/offload.txt (summary), $OUT/serve-offload-<type>-<mode><tag>.json and .log.
set -u
src=$(pwd)
out=${OUT:-$src/out}
mkdir -p "$out"
log() { echo "$*" | tee -a "$out/offload.txt"; }
[ -x /tmp/fw/build/server/ferry ] || ALL_TARGETS=server/ferry bash tests/gpu/all.sh build || exit 1
F=/tmp/fw/build/server/ferry
W=/tmp/cmp
mkdir -p $W
cd /tmp/fw || exit 1
for M in ${OFFLOAD_TYPES:-F16 Q8_0}; do
  [ -s $W/$M.gguf ] || python3 tests/gpu/make_quant_gguf.py $W/$M.gguf $M llama-2-7b > /dev/null || exit 1
  for mode in ${OFFLOAD_MODES:-host}; do
  export FERRY_KV_EXT_ATTN=$mode
  if [ "${OFFLOAD_BENCH:-1}" = 1 ]; then
  log "== $M, FERRY_KV_EXT_ATTN=$mode: ferry bench --gpu-memory 4GiB --batches 1,16 --prefill 0 --decode-steps 8 --long-context 520 ${OFFLOAD_ARGS:-}"
  timeout 180 $F bench --model $W/$M.gguf --gpu-memory 4GiB --batches 1,16 --prefill 0 --decode-steps 8 \
    --long-context 520 ${OFFLOAD_ARGS:-} > $W/bench-$M.log 2>&1
  log "rc=$?"
  grep -E "device_map:|KV pool|^batch|^(1|16) |tokens: .*predicted" $W/bench-$M.log | tee -a "$out/offload.txt"
  # The same 16 sequences at the load's context (~450: 390-token prompts, 128 out), the KV pool sized as
  # serve sizes it (its extension in host memory): what the server's steps cost without the server.
  log "== $M: ferry bench --gpu-memory 4GiB --batches 16 --context 450 --prefill 0 --decode-steps 8 ${OFFLOAD_ARGS:-}"
  timeout 240 $F bench --model $W/$M.gguf --gpu-memory 4GiB --batches 16 --context 450 --prefill 0 \
    --decode-steps 8 ${OFFLOAD_ARGS:-} > $W/bench-ctx-$M.log 2>&1
  log "rc=$?"
  grep -E "device_map:|KV pool|^batch|^16 |16 tokens: .*predicted" $W/bench-ctx-$M.log | tee -a "$out/offload.txt"
  fi
  for round in $(seq 1 ${OFFLOAD_ROUNDS:-1}); do
  for var in ${OFFLOAD_VARIANTS:--}; do
  envs=(); [ "$var" != - ] && envs=("$var")
  vtag=${OFFLOAD_TAG:-}; [ "$var" != - ] && vtag="$vtag-${var//[^A-Za-z0-9_]/_}"
  [ "${OFFLOAD_ROUNDS:-1}" != 1 ] && vtag="$vtag-r$round"
  log "== $M, FERRY_KV_EXT_ATTN=$mode ${envs[*]:-}: 16 clients ${OFFLOAD_ARGS:-} (round $round)"
  env ${envs[@]+"${envs[@]}"} $F serve --model $W/$M.gguf --port 18080 --public-health --gpu-memory 4GiB --parallel 16 \
    --ctx-size 640 ${OFFLOAD_ARGS:-} > $W/serve-$M.log 2>&1 &
  fp=$!
  up=0
  for _ in $(seq 1 400); do
    kill -0 $fp 2>/dev/null || break
    [ "$(curl -s -o /dev/null -w '%{http_code}' http://127.0.0.1:18080/health)" = 200 ] && up=1 && break
    sleep 0.5
  done
  if [ $up = 1 ]; then
    PYTHONUNBUFFERED=1 timeout 200 python3 tests/server/loadgen.py --url http://127.0.0.1:18080 --concurrency 16 \
      --requests 32 --max-tokens 128 --temperature 0.8 --time-limit ${OFFLOAD_TIME:-90} --json > $W/load-$M.json 2> $W/load-$M.err
    log "load rc=$?"
    python3 -c "
import json,sys
for r in json.load(open(sys.argv[1])):
    print(f\"served {sys.argv[2]} ($mode {sys.argv[3]}) c={r['concurrency']}: {r['tokens_per_s']:.1f} gen tok/s, TTFT p50/p99 {r['ttft_p50_s']*1e3:.0f}/{r['ttft_p99_s']*1e3:.0f} ms, ITL p50/p99 {r['itl_p50_s']*1e3:.1f}/{r['itl_p99_s']*1e3:.1f} ms, errors {r['errors']}\")
" $W/load-$M.json $M "$var" | tee -a "$out/offload.txt"
    curl -s http://127.0.0.1:18080/metrics | grep -E "^ferry_(kv_host_bytes|kv_ext_host|ext_streamed|kv_blocks|vram_|layers_|host_pace|step_plan|engine_(steps|busy)|stream_stall)" | tee -a "$out/offload.txt"
    cp $W/load-$M.json "$out/serve-offload-$M-$mode$vtag.json"
  else
    log "ferry serve did not start: $(tail -3 $W/serve-$M.log)"
  fi
  kill -TERM $fp 2>/dev/null
  wait $fp
  grep -E "device_map|KV pool|pinning|engine:|placement auto|extension" $W/serve-$M.log | tee -a "$out/offload.txt"
  cp $W/serve-$M.log "$out/serve-offload-$M-$mode$vtag.log"
  done
  done
  done
done
