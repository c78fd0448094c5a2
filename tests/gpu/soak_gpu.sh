#!/bin/bash
# soak_gpu.sh start|wait|run — on the GPU machine: the GPU soak. `start` (after tests/gpu/all.sh built /tmp/fw)
# writes a random Llama-2-7B-shaped Q4_K_M GGUF (3.8 GiB, tests/gpu/make_quant_gguf.py) and starts
# tests/soak/soak.py for SOAK_MIN minutes (default 10) in its own session (it outlives the call) against
# `ferry serve --gpu-memory 2GiB`: about half the layers live in host memory, streamed or run on the CPU; every
# sample checks the process's device memory against the budget. `wait` (a later call, while the machine is warm)
# waits for it and copies the report to $OUT/soak.txt. `run` does both in one call.
set -u
src=$(pwd)
out=${OUT:-$src/out}
mkdir -p "$out"
W=/tmp/fw
case ${1:-} in
start|run)
  mkdir -p /tmp/cmp
  [ -s /tmp/cmp/Q4_K_M.gguf ] || python3 tests/gpu/make_quant_gguf.py /tmp/cmp/Q4_K_M.gguf Q4_K_M llama-2-7b || exit 1
  rm -f /tmp/soak.txt /tmp/soak.rc
  soak="cd $W && PYTHONUNBUFFERED=1 python3 tests/soak/soak.py --minutes ${SOAK_MIN:-10} \
    --binary build/server/ferry --model /tmp/cmp/Q4_K_M.gguf --vram-budget 2048 --sample 20 --flood 500 \
    --serve-args '--gpu-memory 2GiB --ctx-size 512 --kv-tokens 1024 --parallel 8 --max-queue 64 --max-connections 450 --max-connections-per-ip 0'"
  if [ "$1" = run ]; then # in the foreground: one call holds the whole soak (the machine may go back between calls)
    bash -c "$soak" 2>&1 | tee "$out/soak.txt" | grep -vE "^ +[0-9]+s RSS" | tail -40
    rc=${PIPESTATUS[0]}
    grep -E "device_map|resident|budget|plan|error" /tmp/ferry-soak.log | head -30 > "$out/soak_server.txt"
    echo "soak rc=$rc"; exit $rc
  fi
  setsid bash -c "$soak > /tmp/soak.txt 2>&1; echo \$? > /tmp/soak.rc" < /dev/null > /dev/null 2>&1 &
  sleep 45
  echo "soak started: $(head -5 /tmp/soak.txt)"
  ;;
wait)
  # A fresh machine (the warm one went back) has no soak: say so instead of waiting out the call.
  while [ ! -f /tmp/soak.rc ]; do
    pgrep -f tests/soak/soak.py > /dev/null || { echo "no soak running on this machine (it went back?)"; exit 1; }
    sleep 5
  done
  cp /tmp/soak.txt "$out/soak.txt"
  grep -E "device_map|resident|budget|plan|error" /tmp/ferry-soak.log | head -30 > "$out/soak_server.txt"
  tail -40 /tmp/soak.txt
  echo "soak rc=$(cat /tmp/soak.rc)"
  ;;
*) echo "usage: soak_gpu.sh start|wait|run" >&2; exit 2 ;;
esac
