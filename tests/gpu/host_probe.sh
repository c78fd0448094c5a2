#!/bin/bash
# host_probe.sh — on the GPU machine after `all.sh build`: where the host's layer time goes. The CPU backend
# and a GPU engine's host layers on the random 7B Q4_K_M / Q8_0 files, with and without pinned threads; prints
# the b=1 rate of each and the most anonymous huge-page memory seen while it ran.
set -u
out=${OUT:-$(pwd)/out}
F=/tmp/fw/build/server/ferry
echo "THP: $(cat /sys/kernel/mm/transparent_hugepage/enabled) defrag: $(cat /sys/kernel/mm/transparent_hugepage/defrag)"
mkdir -p /tmp/cmp
for t in Q4_K_M Q8_0; do
  [ -s /tmp/cmp/$t.gguf ] || python3 tests/gpu/make_quant_gguf.py /tmp/cmp/$t.gguf $t llama-2-7b
done
one() { # label, env, args...
  local label=$1 e=$2; shift 2
  env $e timeout 200 $F bench "$@" --prefill 0 --decode-steps 16 > /tmp/p.out 2> /tmp/p.err &
  local pid=$! hp=0
  while kill -0 $pid 2>/dev/null; do
    h=$(awk '/AnonHugePages/ {print $2}' /proc/meminfo); [ "$h" -gt "$hp" ] && hp=$h; sleep 1
  done
  wait $pid
  echo "$label | $(grep -E 'cost model: host' /tmp/p.err | sed 's/.*host layer/host layer/' | cut -c1-60) | anon huge pages ${hp} kB"
  grep -E "^(1|16) " /tmp/p.out | cut -c1-60
  cat /tmp/p.err >> "$out/probe.log"
}
for t in Q8_0 Q4_K_M; do
  one "$t cpu int8" A=1 --model /tmp/cmp/$t.gguf --cpu --cpu-arith int8 --batches 1
done
for a in "A=1" "FERRY_NO_PIN=1"; do
  for th in 16 15; do
    one "Q4_K_M 4GiB cpu $a threads $th" $a --model /tmp/cmp/Q4_K_M.gguf --gpu-memory 4GiB --placement cpu \
      --cpu-arith int8 --cpu-threads $th --batches 1,16
  done
done
one "Q8_0 4GiB cpu threads 16" A=1 --model /tmp/cmp/Q8_0.gguf --gpu-memory 4GiB --placement cpu --cpu-arith int8 --batches 1
