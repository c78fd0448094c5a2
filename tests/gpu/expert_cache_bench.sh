#!/bin/bash
# expert_cache_bench.sh — on the GPU machine: the device expert cache on skewed routing. A random-weight
# Qwen3-30B-A3B-shaped Q4_K_M GGUF (tests/gpu/make_moe_gguf.py; compare_moe.sh's prepare leaves one in
# /tmp/moe) gets routers that send most picks to a quarter of the experts (tests/gpu/skew_router.py), then
# `ferry bench` decodes at batch 1 and 16 under one budget (EC_BUDGET, default 8GiB) without a cache
# (--expert-cache 0), with one of EC_CACHE (default 2GiB, taken before more layers' experts are made
# resident) and with the default (auto). Each run's table, with the cache's hit rate, fetched MiB and host
# experts per step, goes to $OUT/expert-cache/*.txt (the command in *.cmd), and b=1 tokens/s of each to
# $OUT/summary.txt. About 2 minutes a run after the file exists (writing it: about a minute).
# Env: EC_FERRY (default build/server/ferry), EC_MODEL (the unskewed file, default
# /tmp/moe/qwen3-30b-a3b-Q4_K_M.gguf), EC_COLD_GAIN (skew_router.py --cold-gain, default 0.25), EC_STEPS
# (decode steps, default 24).
set -u
src=$(pwd)
out=${OUT:-$src/out}
R=$out/expert-cache
mkdir -p "$R"
. tests/gpu/deps.sh
FERRY=${EC_FERRY:-$src/build/server/ferry}
M=${EC_MODEL:-/tmp/moe/qwen3-30b-a3b-Q4_K_M.gguf}
S=${M%.gguf}-skew.gguf
log() { echo "== $*" | tee -a "$out/summary.txt"; }
if [ ! -s "$M" ]; then
  mkdir -p "$(dirname "$M")"
  python3 tests/gpu/make_moe_gguf.py "$M" qwen3-30b-a3b Q4_K_M > "$R/gguf.log" 2>&1 || {
    log "make_moe_gguf.py FAILED"
    tail -5 "$R/gguf.log"
    exit 1
  }
fi
python3 tests/gpu/skew_router.py "$M" "$S" --cold-gain "${EC_COLD_GAIN:-0.25}" > "$R/skew.txt" 2>&1 || {
  log "skew_router.py FAILED"
  tail -5 "$R/skew.txt"
  exit 1
}
tail -1 "$R/skew.txt" | tee -a "$out/summary.txt"
budget=${EC_BUDGET:-8GiB}
for cache in 0 "${EC_CACHE:-2GiB}" auto; do
  tag=cache-$cache
  args=(bench --model "$S" --gpu-memory "$budget" --expert-cache "$cache" --batches 1,16 --prefill 0
    --decode-steps "${EC_STEPS:-24}")
  echo "$FERRY ${args[*]}" > "$R/$tag.cmd"
  "$FERRY" "${args[@]}" > "$R/$tag.txt" 2> "$R/$tag.log" || { log "$tag: ferry bench FAILED"; tail -3 "$R/$tag.log"; continue; }
  b1=$(awk '$1 == "1" && NF > 5 { print $4; exit }' "$R/$tag.txt")
  hit=$(grep -m1 "batch 1 " "$R/$tag.txt" | sed 's/^ *//')
  log "budget $budget, --expert-cache $cache: b=1 ${b1:-?} tokens/s ${hit:+($hit)}"
done
