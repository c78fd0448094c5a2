#!/bin/bash
# serve_offload.sh — on the GPU machine: `ferry serve` a model about twice the --gpu-memory budget and use it.
# Builds ferry (CUDA), writes a ~0.8 GB random-f16 Llama GGUF with stories260K's tokenizer
# (tests/gpu/make_big_gguf.py), serves it with --gpu-memory 400MiB, sends completions (one, then 4 at once),
# reads /metrics, and stops it with SIGTERM. Needs .debs, .gpu-data (stories260K.gguf) and .whl (the gguf
# wheel) carried. Output in $OUT/serve.txt.
set -u
src=$(pwd)
out=${OUT:-$src/out}
mkdir -p "$out"
log() { echo "$*" | tee -a "$out/serve.txt"; }
. tests/gpu/deps.sh
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
work=/tmp/ferry-serve
rm -rf "$work" && mkdir -p "$work"
# The working tree as sent (the device's copy may carry a .git of an older commit, so never `git archive`).
tar -C "$src" --exclude='./build*' --exclude=./.debs --exclude=./.git --exclude='./.dev-*' --exclude=./.gpu-data \
  -cf - . | tar -C "$work" -xf -
cd "$work" || exit 1
meson setup build -Dcuda=enabled -Dtests=disabled > /tmp/setup.log 2>&1 && ninja -C build server/ferry > /tmp/build.log 2>&1 ||
  { tail -n 30 /tmp/setup.log /tmp/build.log; exit 1; }
python3 tests/gpu/make_big_gguf.py "$src/.gpu-data/models/stories260K.gguf" /tmp/big.gguf || exit 1
log "model file: $(stat -c %s /tmp/big.gguf) bytes; budget 400 MiB = $((400 * 1048576)) bytes"
build/server/ferry serve --model /tmp/big.gguf --gpu-memory 400MiB --parallel 4 --kv-tokens 256 --port 18080 \
  --public-health --served-model-name big > /tmp/serve.log 2>&1 &
pid=$!
for i in $(seq 1 240); do
  kill -0 $pid 2>/dev/null || break # the server gave up (its log says why)
  [ "$(curl -s -o /dev/null -w '%{http_code}' http://127.0.0.1:18080/health)" = 200 ] && break
  sleep 0.5
done
log "health: $(curl -s http://127.0.0.1:18080/health)"
req='{"model":"big","prompt":"Once upon a time","max_tokens":16,"temperature":0}'
log "one: $(curl -s http://127.0.0.1:18080/v1/completions -H 'Content-Type: application/json' -d "$req" | head -c 600)"
for i in 1 2 3 4; do
  curl -s http://127.0.0.1:18080/v1/completions -H 'Content-Type: application/json' -d "$req" > /tmp/c$i.json &
done
wait $(jobs -p | grep -v "^$pid$") 2>/dev/null
for i in 1 2 3 4; do log "concurrent $i: $(head -c 300 /tmp/c$i.json)"; done
log "$(curl -s http://127.0.0.1:18080/metrics | grep -E '^ferry_(layers|weight_bytes|stream_|vram|generated_tokens|requests_total)')"
kill -TERM $pid
wait $pid
log "exit status after SIGTERM: $?"
grep -E "device_map|layers|budget|engine|error" /tmp/serve.log | head -20 | tee -a "$out/serve.txt"
