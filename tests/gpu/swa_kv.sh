#!/bin/bash
# swa_kv.sh — the KV bytes of a Gemma-3-12B-shaped model (tests/gpu/make_family_gguf.py gemma3-12b: Q4_K_M,
# random weights; 40 of its 48 layers have a 1024-position window) at 32768 positions and 16 sequences, with
# the sliding-window layers' own pool (the default) and with --swa-full, printed side by side:
#   1. ferry inspect, no device needed: the pools' bytes at that size (what either backend allocates when the
#      pool is not cut to a budget), then the offline plan for --gpu-memory $SWA_BUDGET (the KV pool sized to
#      the budget, the window pool, resident layers);
#   2. on a GPU (skipped without nvidia-smi, or with SWA_SERVE=0): ferry serve --ctx-size 32768 --parallel 16
#      [--swa-full] on the card's memory, stopped once /health answers; its start-up log's device_map, KV pool
#      and device memory lines: what the device holds.
# Env: SWA_WORK (the GGUF and the logs, default /tmp/swa), SWA_FERRY (default build/server/ferry), SWA_BUDGET
# (default 70GiB), SWA_SERVE (default 1). Output: $OUT/swa_kv.txt (default ./out). Writing the GGUF (6.8 GiB)
# takes about a minute once; it is kept in SWA_WORK.
set -u
src=$(pwd)
out=${OUT:-$src/out}
mkdir -p "$out"
W=${SWA_WORK:-/tmp/swa}
F=${SWA_FERRY:-$src/build/server/ferry}
budget=${SWA_BUDGET:-70GiB}
mkdir -p "$W"
log() { echo "$*" | tee -a "$out/swa_kv.txt"; }
[ -x "$F" ] || { echo "swa_kv.sh: no ferry at $F (build it: ninja -C build server/ferry)" >&2; exit 1; }
M=$W/gemma3-12b.gguf
[ -s "$M" ] || python3 tests/gpu/make_family_gguf.py "$M" gemma3-12b > /dev/null || exit 1
log "== $(date -u +%Y-%m-%dT%H:%MZ) commit $(git -C "$src" rev-parse --short HEAD 2>/dev/null || echo unknown)," \
  "$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 | grep . || echo 'no GPU')"
for full in "" --swa-full; do
  log "== ferry inspect -m gemma3-12b.gguf --ctx-size 32768 --parallel 16 $full"
  "$F" inspect -m "$M" --ctx-size 32768 --parallel 16 $full 2>&1 | grep -E "^kv cache" | tee -a "$out/swa_kv.txt"
  log "== ferry inspect -m gemma3-12b.gguf --ctx-size 32768 --parallel 16 --gpu-memory $budget $full"
  "$F" inspect -m "$M" --ctx-size 32768 --parallel 16 --gpu-memory "$budget" $full 2>&1 |
    grep -E "device_map:|KV pool|layers +[0-9]" | tee -a "$out/swa_kv.txt"
done
[ "${SWA_SERVE:-1}" = 1 ] && command -v nvidia-smi > /dev/null || exit 0
for full in "" --swa-full; do
  log "== ferry serve -m gemma3-12b.gguf --ctx-size 32768 --parallel 16 $full (start-up only)"
  "$F" serve -m "$M" --port 18090 --public-health --ctx-size 32768 --parallel 16 $full > "$W/serve$full.log" 2>&1 &
  fp=$!
  for _ in $(seq 1 600); do
    kill -0 $fp 2>/dev/null || break
    [ "$(curl -s -o /dev/null -w '%{http_code}' http://127.0.0.1:18090/health)" = 200 ] && break
    sleep 0.5
  done
  kill $fp 2>/dev/null
  wait $fp 2>/dev/null
  grep -E "device_map:|KV pool|own KV pool|engine: |budget" "$W/serve$full.log" | tee -a "$out/swa_kv.txt"
done
