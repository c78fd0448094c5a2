#!/bin/bash
# session 18 call 2 (run as `setsid nohup bash chain.sh &`, then poll.sh): AMX bf16 tiles (test, kernel bench,
# F16 4 GiB prefill A/B), then the offload A/B (FERRY_PLAN_ADAPT=0 against the default) and c=1
set -u
src=$(pwd); O=/tmp/o; mkdir -p $O
. tests/gpu/deps.sh
st() { echo "[$(date +%T)] $*" >> $O/chain.txt; }
st start
(lscpu | head -20; nvidia-smi --query-gpu=name,memory.total --format=csv) > $O/host.txt 2>&1
(OUT=/tmp/ob ALL_TARGETS="server/ferry tests/bench/bench_cpu_matmul tests/kernels/test_matmul" bash tests/gpu/all.sh build > $O/build.log 2>&1; st "ferry build rc=$?") &
mkdir -p /tmp/cmp
for t in F16 Q8_0; do (python3 tests/gpu/make_quant_gguf.py /tmp/cmp/$t.gguf $t llama-2-7b > /tmp/mk-$t.log 2>&1; st "$t rc=$?") & done
wait
cp /tmp/ob/build.log $O/fw-build.log 2>/dev/null
F=/tmp/fw/build/server/ferry
st "amx test"
(cd /tmp/fw && FERRY_SRC=/tmp/fw timeout 120 ./build/tests/kernels/test_matmul --filter 'matmul/amx*' --verbose > $O/amx-test.txt 2>&1; echo "rc=$?" >> $O/amx-test.txt)
st "amx bench"
timeout 150 /tmp/fw/build/tests/bench/bench_cpu_matmul -t 16 -m 1,8,16,32,64,128,512 -T F16 -n 11008 -k 4096 --plain both > $O/amx-bench.txt 2>&1
st "prefill A/B"
for r in 1 2; do
  for v in amx noamx; do
    if [ $v = noamx ]; then export FERRY_NO_AMX=1; else unset FERRY_NO_AMX; fi
    timeout 200 $F bench --model /tmp/cmp/F16.gguf --gpu-memory 4GiB --batches 1,16 --prefill 512 --decode-steps 16 > $O/f16-4g-$v-r$r.txt 2>&1
    st "f16 $v r$r rc=$?"
  done
done
unset FERRY_NO_AMX
st "offload adapt default"
OUT=$O/off1 OFFLOAD_TYPES="Q8_0 F16" OFFLOAD_ARGS="--kv-type q8_0" OFFLOAD_TIME=60 bash tests/gpu/offload_kv.sh > $O/off1.out 2>&1
cd "$src"
st "offload adapt 0"
FERRY_PLAN_ADAPT=0 OUT=$O/off0 OFFLOAD_BENCH=0 OFFLOAD_TYPES="Q8_0 F16" OFFLOAD_ARGS="--kv-type q8_0" OFFLOAD_TIME=60 bash tests/gpu/offload_kv.sh > $O/off0.out 2>&1
cd "$src"
st "c=1"
mkdir -p /tmp/cmp/ferry/build/server && ln -sf /tmp/fw/build/server/ferry /tmp/cmp/ferry/build/server/ferry
OUT=$O/c1 SERVE_PEER=0 SERVE_LEVELS=1 SERVE_REQS=24 bash tests/gpu/serve_compare.sh run > $O/c1.out 2>&1
st done
