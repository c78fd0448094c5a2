#!/bin/bash
# host_probe.sh — on the GPU machine after `all.sh build`: where the host's layer time goes. The CPU backend
# and a GPU engine's host layers on the random 7B Q4_K_M / Q8_0 files, with FERRY_CPU_PROFILE=1; prints the
# b=1 rate of each, where the host's time went (runtime/forward_cpu.c's profile) and the most anonymous
# huge-page memory seen while it ran; then bench_cpu_matmul's rates for the same product shapes.
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
  env FERRY_CPU_PROFILE=1 $e timeout 200 $F bench "$@" --prefill 0 --decode-steps 16 > /tmp/p.out 2> /tmp/p.err &
  local pid=$! hp=0
  while kill -0 $pid 2>/dev/null; do
    h=$(awk '/AnonHugePages/ {print $2}' /proc/meminfo); [ "$h" -gt "$hp" ] && hp=$h; sleep 1
  done
  wait $pid
  echo "$label | $(grep -E 'cost model: host' /tmp/p.err | sed 's/.*host layer/host layer/' | cut -c1-60) | anon huge pages ${hp} kB"
  grep -E "^(1|16) " /tmp/p.out | cut -c1-60
  grep -A12 "cpu profile" /tmp/p.err | grep -E "profile|^  "
  cat /tmp/p.err >> "$out/probe.log"
}
for t in Q8_0 Q4_K_M; do
  for a in int8 f32; do
    one "$t cpu $a" A=1 --model /tmp/cmp/$t.gguf --cpu --cpu-arith $a --batches 1
  done
done
one "Q4_K_M 4GiB --placement cpu" A=1 --model /tmp/cmp/Q4_K_M.gguf --gpu-memory 4GiB --placement cpu \
  --cpu-arith int8 --batches 1,16
for n in 4096 11008; do
  timeout 100 /tmp/fw/build/tests/bench/bench_cpu_matmul -t $(nproc) -m 1 -T Q8_0,Q4_K,Q6_K -n $n -k 4096 --act both \
    --no-ceiling
done
