#!/bin/bash
# chunk_sweep.sh — on the GPU machine after `compare_llamacpp.sh prepare`: the host's products with each
# product cut into slices of FERRY_MM_CHUNK rows handed out one at a time (0: one slice per thread), beside
# llama-bench -ngl 0, alternating within each round. SWEEP_CHUNKS (default "0 64 256"), SWEEP_ROUNDS (2),
# SWEEP_CPU=0 / SWEEP_HYBRID=1 choose the parts. Prints one line per run: label, chunk, tok/s.
set -u
out=${OUT:-$(pwd)/out}
mkdir -p "$out"
. tests/gpu/deps.sh
W=/tmp/cmp
F=$W/ferry/build/server/ferry
L=/tmp/llb/bin
nt=$(nproc)
chunks=${SWEEP_CHUNKS:-0 64 256}
fb() { # label, chunk, args...: one ferry bench, prints its decode rates
  local label=$1 ch=$2; shift 2
  FERRY_MM_CHUNK=$ch timeout 200 $F bench "$@" --prefill 0 --json > /tmp/s.json 2> /tmp/s.err
  python3 - "$label" "$ch" /tmp/s.json <<'PY' || { echo "$label chunk $2 FAILED"; tail -3 /tmp/s.err; }
import json, sys
d = json.load(open(sys.argv[3]))
print(sys.argv[1], "chunk", sys.argv[2], " ".join("b=%d %.2f tok/s" % (x["batch"], x["tok_s"]) for x in d["decode"]))
PY
  grep -h "1 tokens:\|cost model: host" /tmp/s.err | cut -c1-120
  cat /tmp/s.err >> "$out/sweep.log"
}
lb() { # label, model
  timeout 200 $L/llama-bench -m $2 -ngl 0 -t $nt -p 0 -n 32 -r 2 -o json > /tmp/l.json 2> /tmp/l.err
  python3 -c 'import json,sys; r=json.load(open("/tmp/l.json")); print(sys.argv[1], "llama.cpp -ngl 0", "%.2f tok/s" % r[0]["avg_ts"])' "$1" ||
    tail -3 /tmp/l.err
}
for r in $(seq ${SWEEP_ROUNDS:-2}); do
  echo "-- round $r $(date +%T) load $(cut -d' ' -f1 /proc/loadavg)"
  if [ "${SWEEP_CPU:-1}" = 1 ]; then
    for t in Q8_0 Q4_K_M; do
      for ch in $chunks; do
        fb "$t cpu int8" $ch --model $W/$t.gguf --cpu --threads $nt --cpu-arith int8 --batches 1 --decode-steps 32
        [ $t = Q8_0 ] && fb "$t cpu f32" $ch --model $W/$t.gguf --cpu --threads $nt --cpu-arith f32 --batches 1 \
          --decode-steps 32
      done
      lb "$t" $W/$t.gguf
    done
  fi
  if [ "${SWEEP_HYBRID:-0}" = 1 ]; then
    for ch in $chunks; do
      fb "Q8_0 4GiB auto" $ch --model $W/Q8_0.gguf --gpu-memory 4GiB --batches 1,1 --decode-steps 16
      FERRY_NO_PIN=1 fb "Q8_0 4GiB auto unpinned" $ch --model $W/Q8_0.gguf --gpu-memory 4GiB --batches 1,1 \
        --decode-steps 16
    done
  fi
done
