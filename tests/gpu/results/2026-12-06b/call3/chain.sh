#!/bin/bash
# session 18 call 3: AMX kernel v2 (test, bench), F16 4 GiB A/B (AMX on/off), then the three placements beside llama.cpp
set -u
src=$(pwd); O=/tmp/o; rm -rf $O; mkdir -p $O
. tests/gpu/deps.sh
st() { echo "[$(date +%T)] $*" >> $O/chain.txt; }
st start
(lscpu | grep -E "Model|MHz"; nvidia-smi --query-gpu=name,memory.total --format=csv) > $O/host.txt 2>&1
(OUT=/tmp/ob ALL_TARGETS="server/ferry tests/bench/bench_cpu_matmul tests/kernels/test_matmul" bash tests/gpu/all.sh build > $O/build.log 2>&1; st "ferry build rc=$?") &
([ -x /tmp/llb/bin/llama-bench ] || bash .peers/build-llama-cpp.sh /tmp/llb > /tmp/llb.log 2>&1; st "llama build rc=$?") &
mkdir -p /tmp/cmp
[ -s /tmp/cmp/F16.gguf ] || python3 tests/gpu/make_quant_gguf.py /tmp/cmp/F16.gguf F16 llama-2-7b > /tmp/mk-F16.log 2>&1
wait
F=/tmp/fw/build/server/ferry
st "amx test"
(cd /tmp/fw && FERRY_SRC=/tmp/fw timeout 120 ./build/tests/kernels/test_matmul --filter 'matmul/amx*' --verbose 2>&1 | grep -v "Test is disabled" > $O/amx-test.txt; echo "rc=$?" >> $O/amx-test.txt)
st "amx bench"
timeout 150 /tmp/fw/build/tests/bench/bench_cpu_matmul -t 16 -m 1,16,32,64,128,512 -T F16 -n 11008 -k 4096 --plain both > $O/amx-bench.txt 2>&1
timeout 100 /tmp/fw/build/tests/bench/bench_cpu_matmul -t 16 -m 16,64,512 -T F16 -n 4096 -k 4096 --plain bf16 --no-ceiling >> $O/amx-bench.txt 2>&1
st "prefill A/B"
for r in 1 2; do
  for v in amx noamx; do
    if [ $v = noamx ]; then export FERRY_NO_AMX=1; else unset FERRY_NO_AMX; fi
    timeout 200 $F bench --model /tmp/cmp/F16.gguf --gpu-memory 4GiB --batches 1,16 --prefill 512 --decode-steps 16 > $O/f16-4g-$v-r$r.txt 2>&1
    st "f16 $v r$r rc=$?"
  done
done
unset FERRY_NO_AMX
st "three placements + llama.cpp"
: > /tmp/cmp/results.jsonl
export CMP_FERRY=$F
OUT=$O/f16 CMP_HYBRID_FILES=F16 CMP_MAIN=0 CMP_Q4_4G=0 CMP_CPU=0 CMP_INT4=0 bash tests/gpu/compare_llamacpp.sh bench > $O/f16.out 2>&1
st done
